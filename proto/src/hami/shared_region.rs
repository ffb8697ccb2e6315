//! HAMi-core's per-container shared region: the file `libvgpu.so` maps in
//! every process of a container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, on the
//! host `<hook>/vgpu/containers/<pod UID>_<container>/<id>.cache`) to share
//! the container's limits and each process's device memory and SM use.
//!
//! [`decode`] reads one such file's bytes into a [`SharedRegion`]; it trusts
//! nothing: a wrong length, an unknown version, a count beyond its array, a
//! UUID without its terminating NUL, a utilisation above 100 % or sums that
//! overflow are typed [`Error`]s, never a panic or an out-of-bounds read.
//! [`encode`] writes the same layout; gpuslice never writes these files in
//! production (HAMi-core does), the encoder is there for tests, the fuzz
//! seeds and simulations.
//!
//! # Layouts
//!
//! The file is the C struct `shared_region_t` of HAMi-core
//! (`src/multiprocess/multiprocess_memory_limit.h`), little-endian,
//! x86-64/arm64 alignment, followed by one byte: HAMi-core sizes the file by
//! writing `"\0"` at offset `sizeof(shared_region_t)`. Two layouts exist, as
//! HAMi's monitor mirrors them (`pkg/monitor/nvidia/v0/spec.go`,
//! `pkg/monitor/nvidia/v1/spec.go`):
//!
//! | | v0 (no version fields) | v1 (`major_version` 1) |
//! |---|---|---|
//! | recognised by | file length 1,197,897 | `major_version == 1` at offset 4 |
//! | header | flag, sm_init_flag, owner_pid (u32), sem_t | flag, major, minor, sm_init_flag, owner_pid (u64), sem_t |
//! | `device_num` at | 48 | 56 |
//! | `uuids[16][96]`, `limit[16]`, `sm_limit[16]` at | 56, 1592, 1720 | 64, 1600, 1728 |
//! | `procs[1024]` at, slot size | 1848, 1168 | 1856, 1960 |
//! | slot: `used[16]` (context, module, data, offset, total) | 5 × u64 | 5 × u64 + 3 unused |
//! | slot: `device_util[16]` (dec, enc, sm) | 3 × u64 | 3 × u64 + 3 unused |
//! | tail: proc_num, utilization_switch, recent_kernel, priority at | 1197880 | 2008896 |
//! | tail: last_kernel_time | — | 2008912 |
//! | struct size / file length | 1,197,896 / 1,197,897 | 2,008,952 / 2,008,953 |
//!
//! v1 minor 1 and minor ≥ 2 share offsets: minor 2 turned the slot's first
//! unused word into a seqlock and the tail's unused words into a second
//! semaphore (`sem_postinit`). Processes are `procs[0..proc_num]` in v1
//! (HAMi-core compacts the table); v0 had no such bound in HAMi's reader,
//! which sums every slot, so here a v0 process is every slot with a
//! non-zero pid.

use std::fmt;

/// `initialized_flag` once HAMi-core has set the region up.
pub const MAGIC: i32 = 19_920_718;
/// `CUDA_DEVICE_MAX_COUNT`: devices one region describes at most.
pub const MAX_DEVICES: usize = 16;
/// `SHARED_REGION_MAX_PROCESS_NUM`: process slots of a region.
pub const MAX_PROCESSES: usize = 1024;
/// Bytes of one UUID field (`typedef char uuid[96]`).
const UUID_BYTES: usize = 96;

/// Which struct layout a file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// The layout before version fields (HAMi's `v0`).
    V0,
    /// `major_version` 1 with its `minor_version` (HAMi's `v1` for minor ≤ 1,
    /// `v1-sem` for minor ≥ 2; same offsets).
    V1 {
        /// `minor_version` as the file states it.
        minor: u32,
    },
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V0 => f.write_str("v0"),
            Self::V1 { minor } => write!(f, "v1.{minor}"),
        }
    }
}

/// Byte offsets of one layout.
struct Geometry {
    device_num: usize,
    uuids: usize,
    limit: usize,
    sm_limit: usize,
    procs: usize,
    slot: usize,
    /// Stride of `used[i]` inside a slot.
    memory_stride: usize,
    /// Offset of `monitorused[0]` inside a slot.
    monitor_used: usize,
    /// Offset of `device_util[0]` inside a slot.
    util: usize,
    util_stride: usize,
    /// Offset of `status` inside a slot.
    status: usize,
    /// Offset of `proc_num`; `utilization_switch`, `recent_kernel` and
    /// `priority` follow it, 4 bytes each.
    tail: usize,
    /// Offset of `last_kernel_time`, v1 only.
    last_kernel_time: Option<usize>,
    /// `sizeof(shared_region_t)`.
    size: usize,
}

impl Geometry {
    /// Each slot is `pid, hostpid, used[16], monitorused[16],
    /// device_util[16], status` (v1: plus three trailing u64), 8-aligned.
    const fn of(layout: Layout) -> Self {
        let (device_num, memory_stride, util_stride, slot_tail) = match layout {
            Layout::V0 => (48, 5 * 8, 3 * 8, 0),
            Layout::V1 { .. } => (56, 8 * 8, 6 * 8, 3 * 8),
        };
        let uuids = device_num + 8;
        let limit = uuids + MAX_DEVICES * UUID_BYTES;
        let sm_limit = limit + MAX_DEVICES * 8;
        let procs = sm_limit + MAX_DEVICES * 8;
        let monitor_used = 8 + MAX_DEVICES * memory_stride;
        let util = monitor_used + MAX_DEVICES * 8;
        let status = util + MAX_DEVICES * util_stride;
        // status (4 bytes) padded to 8, then the v1 trailing words.
        let slot = status + 8 + slot_tail;
        let tail = procs + MAX_PROCESSES * slot;
        let (last_kernel_time, size) = match layout {
            Layout::V0 => (None, tail + 16),
            Layout::V1 { .. } => (Some(tail + 16), tail + 16 + 8 + 32),
        };
        Self {
            device_num,
            uuids,
            limit,
            sm_limit,
            procs,
            slot,
            memory_stride,
            monitor_used,
            util,
            util_stride,
            status,
            tail,
            last_kernel_time,
            size,
        }
    }
}

impl Layout {
    /// `sizeof(shared_region_t)` of this layout.
    #[must_use]
    pub const fn struct_size(self) -> usize {
        Geometry::of(self).size
    }

    /// The length of the file HAMi-core creates: the struct and one byte.
    #[must_use]
    pub const fn file_len(self) -> usize {
        self.struct_size() + 1
    }
}

/// Device memory one process holds on one device, bytes (`device_memory_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// CUDA contexts.
    pub context: u64,
    /// Loaded modules.
    pub module: u64,
    /// Allocations (`data_size`; HAMi's monitor calls it buffer).
    pub data: u64,
    /// `offset`.
    pub offset: u64,
    /// Everything the process holds: what HAMi reports as used.
    pub total: u64,
}

/// One process's use of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessDeviceUse {
    /// Memory counted by HAMi-core's allocation hooks.
    pub memory: MemoryUse,
    /// Memory NVML reports for the process (`monitorused`), bytes.
    pub monitor_used: u64,
    /// SM utilisation of the process on the device, percent.
    pub sm_util: u64,
}

/// One process slot (`shrreg_proc_slot_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// PID inside the container.
    pub pid: i32,
    /// PID on the host, 0 until HAMi-core has found it.
    pub host_pid: i32,
    /// `status` (1 running; 2 swapped out by a priority signal).
    pub status: i32,
    /// Use per device, `devices.len()` entries (the region's device count).
    pub devices: Vec<ProcessDeviceUse>,
}

/// One device the container sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// GPU UUID; `None` while HAMi-core has not written it yet.
    pub uuid: Option<String>,
    /// Memory limit, bytes (0: none).
    pub memory_limit: u64,
    /// SM limit, percent.
    pub sm_limit: u64,
}

/// A decoded shared region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRegion {
    /// The file's layout.
    pub layout: Layout,
    /// The devices, `device_num` of them, in the container's order (the
    /// index is HAMi's `vdevice_index`).
    pub devices: Vec<Device>,
    /// The live process slots.
    pub processes: Vec<Process>,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority` (`CUDA_TASK_PRIORITY`).
    pub priority: i32,
    /// Unix seconds of the last kernel launch; v1 only.
    pub last_kernel_time: Option<u64>,
}

/// What every process of the container uses on one device, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Memory, summed field by field.
    pub memory: MemoryUse,
    /// `monitorused`, summed.
    pub monitor_used: u64,
    /// SM utilisation, summed (percent).
    pub sm_util: u64,
}

impl SharedRegion {
    /// The sums over every process for device `index` (HAMi's
    /// `DeviceMemoryTotal`, `DeviceSmUtil`, …); zero for an index beyond
    /// the devices. A region [`decode`] returned never overflows here (it
    /// refuses files whose sums would); other regions saturate.
    #[must_use]
    pub fn totals(&self, index: usize) -> DeviceTotals {
        let mut t = DeviceTotals::default();
        for p in &self.processes {
            let Some(d) = p.devices.get(index) else {
                continue;
            };
            t.memory.context = t.memory.context.saturating_add(d.memory.context);
            t.memory.module = t.memory.module.saturating_add(d.memory.module);
            t.memory.data = t.memory.data.saturating_add(d.memory.data);
            t.memory.offset = t.memory.offset.saturating_add(d.memory.offset);
            t.memory.total = t.memory.total.saturating_add(d.memory.total);
            t.monitor_used = t.monitor_used.saturating_add(d.monitor_used);
            t.sm_util = t.sm_util.saturating_add(d.sm_util);
        }
        t
    }
}

/// Why a file is not a shared region gpuslice can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shorter than the fields that identify a layout.
    #[error("{len} bytes: too short for a HAMi-core shared region")]
    TooShort {
        /// The file's length.
        len: usize,
    },
    /// `initialized_flag` is not [`MAGIC`]: HAMi-core has not finished
    /// setting the file up, or it is not HAMi-core's.
    #[error("initialized flag is {flag}, not {MAGIC}: not (yet) a HAMi-core shared region")]
    NotInitialized {
        /// The flag found.
        flag: i32,
    },
    /// Neither the v0 length nor `major_version` 1.
    #[error("unknown shared region version {major}.{minor} ({len} bytes)")]
    UnknownVersion {
        /// `major_version` (offset 4).
        major: u32,
        /// `minor_version` (offset 8).
        minor: u32,
        /// The file's length.
        len: usize,
    },
    /// The version is known but the length is not its struct's (or that
    /// and HAMi-core's one extra byte).
    #[error("{layout} shared region must be {expected} bytes, file has {found}")]
    Length {
        /// The layout the header states.
        layout: Layout,
        /// The struct size and HAMi-core's extra byte.
        expected: usize,
        /// The file's length.
        found: usize,
    },
    /// `device_num` beyond [`MAX_DEVICES`].
    #[error("device count {count} exceeds {MAX_DEVICES}")]
    DeviceCount {
        /// The count found.
        count: u64,
    },
    /// `proc_num` negative or beyond [`MAX_PROCESSES`].
    #[error("process count {count} is outside 0..={MAX_PROCESSES}")]
    ProcessCount {
        /// The count found.
        count: i64,
    },
    /// A device's UUID is not NUL-terminated printable ASCII.
    #[error("device {device} UUID {reason}")]
    Uuid {
        /// The device index.
        device: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A process's SM utilisation on a device is above 100 %.
    #[error("process slot {process} device {device}: SM utilisation {value} % is above 100")]
    SmUtil {
        /// The slot.
        process: usize,
        /// The device index.
        device: usize,
        /// The value found.
        value: u64,
    },
    /// Summing a device's field over the processes overflows 64 bits.
    #[error("device {device}: {field} summed over the processes overflows")]
    Overflow {
        /// The device index.
        device: usize,
        /// The field.
        field: &'static str,
    },
}

impl Error {
    /// A short stable name of the kind of error, for a metric label.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::TooShort { .. } | Self::Length { .. } => "length",
            Self::NotInitialized { .. } => "magic",
            Self::UnknownVersion { .. } => "version",
            Self::DeviceCount { .. } | Self::ProcessCount { .. } => "count",
            Self::Uuid { .. } => "uuid",
            Self::SmUtil { .. } | Self::Overflow { .. } => "value",
        }
    }
}

/// Little-endian reads that cannot go out of bounds.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn array<const N: usize>(&self, at: usize) -> Result<[u8; N], Error> {
        at.checked_add(N)
            .and_then(|end| self.0.get(at..end))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(Error::TooShort { len: self.0.len() })
    }

    fn u64(&self, at: usize) -> Result<u64, Error> {
        self.array(at).map(u64::from_le_bytes)
    }

    fn u32(&self, at: usize) -> Result<u32, Error> {
        self.array(at).map(u32::from_le_bytes)
    }

    fn i32(&self, at: usize) -> Result<i32, Error> {
        self.array(at).map(i32::from_le_bytes)
    }

    fn slice(&self, at: usize, len: usize) -> Result<&[u8], Error> {
        at.checked_add(len)
            .and_then(|end| self.0.get(at..end))
            .ok_or(Error::TooShort { len: self.0.len() })
    }
}

/// The layout of `bytes`, as HAMi's monitor picks it: the v0 file length
/// first (v0 has no version field), then `major_version`.
///
/// # Errors
/// [`Error::TooShort`], [`Error::NotInitialized`], [`Error::UnknownVersion`]
/// or [`Error::Length`].
pub fn layout_of(bytes: &[u8]) -> Result<Layout, Error> {
    let b = Bytes(bytes);
    let len = bytes.len();
    if len < 12 {
        return Err(Error::TooShort { len });
    }
    let flag = b.i32(0)?;
    if flag != MAGIC {
        return Err(Error::NotInitialized { flag });
    }
    if len == Layout::V0.file_len() || len == Layout::V0.struct_size() {
        return Ok(Layout::V0);
    }
    let (major, minor) = (b.u32(4)?, b.u32(8)?);
    if major != 1 {
        return Err(Error::UnknownVersion { major, minor, len });
    }
    let layout = Layout::V1 { minor };
    if len == layout.file_len() || len == layout.struct_size() {
        Ok(layout)
    } else {
        Err(Error::Length {
            layout,
            expected: layout.file_len(),
            found: len,
        })
    }
}

/// The longest file [`decode`] accepts: a reader may refuse a bigger file
/// without reading it.
pub const MAX_FILE_LEN: usize = Layout::V1 { minor: 0 }.file_len();

fn uuid(bytes: &[u8], device: usize) -> Result<Option<String>, Error> {
    let err = |reason| Error::Uuid { device, reason };
    let Some(end) = bytes.iter().position(|&c| c == 0) else {
        return Err(err("has no terminating NUL"));
    };
    if end == 0 {
        return Ok(None);
    }
    let text = bytes.get(..end).ok_or(err("has no terminating NUL"))?;
    if !text.iter().all(u8::is_ascii_graphic) {
        return Err(err("is not printable ASCII"));
    }
    Ok(Some(String::from_utf8_lossy(text).into_owned()))
}

fn checked_sum(region: &SharedRegion) -> Result<(), Error> {
    for device in 0..region.devices.len() {
        let mut sums = [0u64; 7];
        for p in &region.processes {
            let Some(d) = p.devices.get(device) else {
                continue;
            };
            let values = [
                d.memory.context,
                d.memory.module,
                d.memory.data,
                d.memory.offset,
                d.memory.total,
                d.monitor_used,
                d.sm_util,
            ];
            for (field, (sum, value)) in sums.iter_mut().zip(values).enumerate() {
                *sum = sum.checked_add(value).ok_or(Error::Overflow {
                    device,
                    field: FIELDS.get(field).copied().unwrap_or("a field"),
                })?;
            }
        }
    }
    Ok(())
}

const FIELDS: [&str; 7] = [
    "context_size",
    "module_size",
    "data_size",
    "offset",
    "total",
    "monitorused",
    "sm_util",
];

/// Decodes one shared-region file.
///
/// # Errors
/// An [`Error`] naming the first thing that is wrong; nothing in `bytes` can
/// make this panic.
pub fn decode(bytes: &[u8]) -> Result<SharedRegion, Error> {
    let layout = layout_of(bytes)?;
    let g = Geometry::of(layout);
    let b = Bytes(bytes);
    let device_num = b.u64(g.device_num)?;
    let devices_len = usize::try_from(device_num)
        .ok()
        .filter(|&n| n <= MAX_DEVICES)
        .ok_or(Error::DeviceCount { count: device_num })?;
    let mut devices = Vec::with_capacity(devices_len);
    for i in 0..devices_len {
        devices.push(Device {
            uuid: uuid(b.slice(g.uuids + i * UUID_BYTES, UUID_BYTES)?, i)?,
            memory_limit: b.u64(g.limit + i * 8)?,
            sm_limit: b.u64(g.sm_limit + i * 8)?,
        });
    }
    let proc_num = b.i32(g.tail)?;
    let slots: Vec<usize> = match layout {
        Layout::V0 => (0..MAX_PROCESSES)
            .filter(|s| b.i32(g.procs + s * g.slot).is_ok_and(|pid| pid != 0))
            .collect(),
        Layout::V1 { .. } => {
            let n = usize::try_from(proc_num)
                .ok()
                .filter(|&n| n <= MAX_PROCESSES)
                .ok_or(Error::ProcessCount {
                    count: i64::from(proc_num),
                })?;
            (0..n).collect()
        }
    };
    let mut processes = Vec::with_capacity(slots.len());
    for s in slots {
        let at = g.procs + s * g.slot;
        let mut per_device = Vec::with_capacity(devices_len);
        for d in 0..devices_len {
            let m = at + 8 + d * g.memory_stride;
            let u = at + g.util + d * g.util_stride;
            let sm_util = b.u64(u + 16)?;
            if sm_util > 100 {
                return Err(Error::SmUtil {
                    process: s,
                    device: d,
                    value: sm_util,
                });
            }
            per_device.push(ProcessDeviceUse {
                memory: MemoryUse {
                    context: b.u64(m)?,
                    module: b.u64(m + 8)?,
                    data: b.u64(m + 16)?,
                    offset: b.u64(m + 24)?,
                    total: b.u64(m + 32)?,
                },
                monitor_used: b.u64(at + g.monitor_used + d * 8)?,
                sm_util,
            });
        }
        processes.push(Process {
            pid: b.i32(at)?,
            host_pid: b.i32(at + 4)?,
            status: b.i32(at + g.status)?,
            devices: per_device,
        });
    }
    let region = SharedRegion {
        layout,
        devices,
        processes,
        utilization_switch: b.i32(g.tail + 4)?,
        recent_kernel: b.i32(g.tail + 8)?,
        priority: b.i32(g.tail + 12)?,
        last_kernel_time: g.last_kernel_time.map(|at| b.u64(at)).transpose()?,
    };
    checked_sum(&region)?;
    Ok(region)
}

/// Writes `region` in its layout, as HAMi-core would (struct plus one
/// byte, [`MAGIC`] set, the version fields for v1). Processes go to slots
/// `0..`; v0 gets the same `proc_num`.
///
/// # Errors
/// [`Error::DeviceCount`], [`Error::ProcessCount`] or [`Error::Uuid`]
/// (longer than 95 bytes or not printable ASCII) for a region the layout
/// cannot hold.
pub fn encode(region: &SharedRegion) -> Result<Vec<u8>, Error> {
    let layout = region.layout;
    let g = Geometry::of(layout);
    if region.devices.len() > MAX_DEVICES {
        return Err(Error::DeviceCount {
            count: region.devices.len() as u64,
        });
    }
    let proc_num = i32::try_from(region.processes.len())
        .ok()
        .filter(|&n| usize::try_from(n).is_ok_and(|n| n <= MAX_PROCESSES))
        .ok_or(Error::ProcessCount {
            count: i64::try_from(region.processes.len()).unwrap_or(i64::MAX),
        })?;
    let mut out = vec![0u8; layout.file_len()];
    let mut put = |at: usize, bytes: &[u8]| {
        if let Some(dst) = out.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    };
    put(0, &MAGIC.to_le_bytes());
    if let Layout::V1 { minor } = layout {
        put(4, &1u32.to_le_bytes());
        put(8, &minor.to_le_bytes());
    }
    put(g.device_num, &(region.devices.len() as u64).to_le_bytes());
    for (i, d) in region.devices.iter().enumerate() {
        if let Some(uuid) = &d.uuid {
            if uuid.len() >= UUID_BYTES || !uuid.bytes().all(|c| c.is_ascii_graphic()) {
                return Err(Error::Uuid {
                    device: i,
                    reason: "is longer than 95 bytes or not printable ASCII",
                });
            }
            put(g.uuids + i * UUID_BYTES, uuid.as_bytes());
        }
        put(g.limit + i * 8, &d.memory_limit.to_le_bytes());
        put(g.sm_limit + i * 8, &d.sm_limit.to_le_bytes());
    }
    for (s, p) in region.processes.iter().enumerate() {
        let at = g.procs + s * g.slot;
        put(at, &p.pid.to_le_bytes());
        put(at + 4, &p.host_pid.to_le_bytes());
        put(at + g.status, &p.status.to_le_bytes());
        for (d, u) in p.devices.iter().take(MAX_DEVICES).enumerate() {
            let m = at + 8 + d * g.memory_stride;
            for (k, v) in [
                u.memory.context,
                u.memory.module,
                u.memory.data,
                u.memory.offset,
                u.memory.total,
            ]
            .into_iter()
            .enumerate()
            {
                put(m + k * 8, &v.to_le_bytes());
            }
            put(at + g.monitor_used + d * 8, &u.monitor_used.to_le_bytes());
            put(
                at + g.util + d * g.util_stride + 16,
                &u.sm_util.to_le_bytes(),
            );
        }
    }
    put(g.tail, &proc_num.to_le_bytes());
    put(g.tail + 4, &region.utilization_switch.to_le_bytes());
    put(g.tail + 8, &region.recent_kernel.to_le_bytes());
    put(g.tail + 12, &region.priority.to_le_bytes());
    if let (Some(at), Some(t)) = (g.last_kernel_time, region.last_kernel_time) {
        put(at, &t.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use proptest::prelude::*;

    const UUID_A: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";

    fn region(layout: Layout) -> SharedRegion {
        SharedRegion {
            layout,
            devices: vec![Device {
                uuid: Some(UUID_A.into()),
                memory_limit: 3000 << 20,
                sm_limit: 30,
            }],
            processes: vec![Process {
                pid: 7,
                host_pid: 4242,
                status: 1,
                devices: vec![ProcessDeviceUse {
                    memory: MemoryUse {
                        context: 300 << 20,
                        module: 10 << 20,
                        data: 690 << 20,
                        offset: 0,
                        total: 1000 << 20,
                    },
                    monitor_used: 1024 << 20,
                    sm_util: 25,
                }],
            }],
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
            last_kernel_time: match layout {
                Layout::V0 => None,
                Layout::V1 { .. } => Some(1_760_000_000),
            },
        }
    }

    #[test]
    fn sizes_are_hamis() {
        // HAMi's monitor routes a 1,197,897-byte file to v0
        // (pkg/monitor/nvidia/factory_test.go).
        assert_eq!(Layout::V0.file_len(), 1_197_897);
        assert_eq!(Layout::V1 { minor: 2 }.struct_size(), 2_008_952);
        let g = Geometry::of(Layout::V1 { minor: 1 });
        assert_eq!((g.procs, g.slot, g.tail), (1856, 1960, 2_008_896));
        let g = Geometry::of(Layout::V0);
        // The offsets HAMi's first monitor read v0 files at.
        assert_eq!(
            (g.device_num, g.uuids, g.limit, g.sm_limit),
            (0x30, 0x38, 0x638, 0x6b8)
        );
        assert_eq!((g.procs, g.slot), (0x738, 1168));
    }

    #[test]
    fn every_layout_round_trips_and_sums_like_hami() {
        for layout in [Layout::V0, Layout::V1 { minor: 1 }, Layout::V1 { minor: 2 }] {
            let mut r = region(layout);
            let mut second = r.processes[0].clone();
            second.pid = 8;
            second.devices[0].memory.total = 24 << 20;
            second.devices[0].sm_util = 5;
            r.processes.push(second);
            let bytes = encode(&r).unwrap();
            assert_eq!(bytes.len(), layout.file_len());
            let back = decode(&bytes).unwrap();
            assert_eq!(back, r, "{layout}");
            let t = back.totals(0);
            assert_eq!(t.memory.total, 1024 << 20);
            assert_eq!(t.sm_util, 30);
            assert_eq!(back.totals(5), DeviceTotals::default());
            // Without HAMi-core's extra byte the struct still reads.
            assert_eq!(decode(&bytes[..bytes.len() - 1]).unwrap(), r);
        }
    }

    #[test]
    fn an_unwritten_uuid_reads_as_none() {
        let mut r = region(Layout::V1 { minor: 2 });
        r.devices[0].uuid = None;
        assert_eq!(decode(&encode(&r).unwrap()).unwrap().devices[0].uuid, None);
    }

    #[test]
    fn malformed_files_are_typed_errors() {
        let good = encode(&region(Layout::V1 { minor: 2 })).unwrap();
        let g = Geometry::of(Layout::V1 { minor: 2 });
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            decode(&b)
        };
        assert_eq!(decode(&[]), Err(Error::TooShort { len: 0 }));
        assert_eq!(
            with(0, &0i32.to_le_bytes()),
            Err(Error::NotInitialized { flag: 0 })
        );
        assert!(matches!(
            with(4, &2u32.to_le_bytes()),
            Err(Error::UnknownVersion {
                major: 2,
                minor: 2,
                ..
            })
        ));
        assert!(matches!(
            decode(&good[..good.len() - 2]),
            Err(Error::Length { found, .. }) if found == good.len() - 2
        ));
        assert_eq!(
            with(g.device_num, &17u64.to_le_bytes()),
            Err(Error::DeviceCount { count: 17 })
        );
        assert_eq!(
            with(g.tail, &(-1i32).to_le_bytes()),
            Err(Error::ProcessCount { count: -1 })
        );
        assert_eq!(
            with(g.tail, &1025i32.to_le_bytes()),
            Err(Error::ProcessCount { count: 1025 })
        );
        assert_eq!(
            with(g.uuids, &[b'G'; UUID_BYTES]),
            Err(Error::Uuid {
                device: 0,
                reason: "has no terminating NUL"
            })
        );
        assert_eq!(
            with(g.uuids, b"GPU\x01"),
            Err(Error::Uuid {
                device: 0,
                reason: "is not printable ASCII"
            })
        );
        assert_eq!(
            with(g.procs + g.util + 16, &101u64.to_le_bytes()),
            Err(Error::SmUtil {
                process: 0,
                device: 0,
                value: 101
            })
        );
        // Two processes whose totals overflow u64.
        let mut r = region(Layout::V1 { minor: 2 });
        r.processes[0].devices[0].memory.total = u64::MAX;
        r.processes.push(r.processes[0].clone());
        assert_eq!(
            decode(&encode(&r).unwrap()),
            Err(Error::Overflow {
                device: 0,
                field: "total"
            })
        );
    }

    #[test]
    fn a_v0_process_is_a_slot_with_a_pid() {
        let mut r = region(Layout::V0);
        let bytes = {
            let mut b = encode(&r).unwrap();
            // A live process in slot 5 and garbage in proc_num: v0 ignores it.
            let g = Geometry::of(Layout::V0);
            let at = g.procs + 5 * g.slot;
            b[at..at + 4].copy_from_slice(&9i32.to_le_bytes());
            b[g.tail..g.tail + 4].copy_from_slice(&(-3i32).to_le_bytes());
            b
        };
        r.processes.push(Process {
            pid: 9,
            host_pid: 0,
            status: 0,
            devices: vec![ProcessDeviceUse::default()],
        });
        assert_eq!(decode(&bytes).unwrap(), r);
    }

    fn arb_region() -> impl Strategy<Value = SharedRegion> {
        let layout = prop_oneof![
            Just(Layout::V0),
            (0u32..4).prop_map(|minor| Layout::V1 { minor })
        ];
        (layout, 0usize..=MAX_DEVICES, 0usize..6).prop_flat_map(|(layout, nd, np)| {
            let device = (
                proptest::option::of("GPU-[0-9a-f-]{1,60}"),
                any::<u64>(),
                0u64..=100,
            )
                .prop_map(|(uuid, memory_limit, sm_limit)| Device {
                    uuid,
                    memory_limit,
                    sm_limit,
                });
            let use_ = (
                proptest::array::uniform5(0u64..1 << 50),
                0u64..1 << 50,
                0u64..=100,
            )
                .prop_map(
                    |([context, module, data, offset, total], monitor_used, sm_util)| {
                        ProcessDeviceUse {
                            memory: MemoryUse {
                                context,
                                module,
                                data,
                                offset,
                                total,
                            },
                            monitor_used,
                            sm_util,
                        }
                    },
                );
            let process = (
                1i32..,
                any::<i32>(),
                any::<i32>(),
                proptest::collection::vec(use_, nd),
            )
                .prop_map(|(pid, host_pid, status, devices)| Process {
                    pid,
                    host_pid,
                    status,
                    devices,
                });
            (
                proptest::collection::vec(device, nd),
                proptest::collection::vec(process, np),
                any::<[i32; 3]>(),
                any::<u64>(),
            )
                .prop_map(move |(devices, processes, [u, k, p], t)| SharedRegion {
                    layout,
                    devices,
                    processes,
                    utilization_switch: u,
                    recent_kernel: k,
                    priority: p,
                    last_kernel_time: match layout {
                        Layout::V0 => None,
                        Layout::V1 { .. } => Some(t),
                    },
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_inverts_encode(r in arb_region()) {
            prop_assert_eq!(decode(&encode(&r).unwrap()).unwrap(), r);
        }

        #[test]
        fn any_patch_of_a_good_file_decodes_or_errs(
            r in arb_region(),
            patches in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..64),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let mut bytes = encode(&r).unwrap();
            for (at, value) in patches {
                let i = at.index(bytes.len());
                bytes[i] = value;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            let _ = decode(&bytes);
        }
    }
}

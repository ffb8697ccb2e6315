//! The seed corpus of the `hami_shared_region` fuzz target
//! (`fuzz/corpus/hami_shared_region/`), written from regions encoded here
//! in the target's compact form: byte 0 the layout (0 v0, 1 v1), bytes 1–2
//! the head length, the head (the file from offset 0 through the first
//! process slots), then the struct's last bytes (proc_num onwards).
//!
//! The test fails when a committed seed differs from what it would write;
//! `GPUSLICE_WRITE_FUZZ_SEEDS=1 cargo test -p proto --test shared_region_seeds`
//! rewrites them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a panic is a test failure"
)]

use std::path::PathBuf;

use proto::hami::shared_region::{
    Device, Layout, MemoryUse, Process, ProcessDeviceUse, SharedRegion, decode, encode,
};

/// Bytes of the file kept at its start: the v1 header and limits (1,856
/// bytes) and two v1 process slots (1,960 each).
const HEAD: usize = 1856 + 2 * 1960;
/// Bytes kept at the struct's end: the v1 tail from proc_num (56 bytes).
const TAIL: usize = 56;

fn process(pid: i32, devices: &[(u64, u64)]) -> Process {
    Process {
        pid,
        host_pid: pid + 1000,
        status: 1,
        devices: devices
            .iter()
            .map(|&(mib, sm)| ProcessDeviceUse {
                memory: MemoryUse {
                    context: 300 << 20,
                    module: 2 << 20,
                    data: (mib << 20) - (302 << 20),
                    offset: 0,
                    total: mib << 20,
                },
                monitor_used: mib << 20,
                sm_util: sm,
            })
            .collect(),
    }
}

fn device(uuid: Option<&str>, limit_mib: u64, sm: u64) -> Device {
    Device {
        uuid: uuid.map(str::to_owned),
        memory_limit: limit_mib << 20,
        sm_limit: sm,
    }
}

fn seeds() -> Vec<(&'static str, SharedRegion)> {
    let a = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";
    let b = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec";
    let v1 = |minor, devices, processes| SharedRegion {
        layout: Layout::V1 { minor },
        devices,
        processes,
        utilization_switch: 1,
        recent_kernel: 2,
        priority: 1,
        last_kernel_time: Some(1_760_929_622),
    };
    vec![
        (
            "v0_one_process",
            SharedRegion {
                layout: Layout::V0,
                devices: vec![device(Some(a), 3000, 30)],
                processes: vec![process(7, &[(1000, 25)])],
                utilization_switch: 1,
                recent_kernel: 2,
                priority: 1,
                last_kernel_time: None,
            },
        ),
        (
            "v1_1_two_processes",
            v1(
                1,
                vec![device(Some(a), 3000, 30)],
                vec![process(7, &[(1000, 20)]), process(9, &[(500, 5)])],
            ),
        ),
        (
            "v1_2_two_devices",
            v1(
                2,
                vec![device(Some(a), 8000, 50), device(Some(b), 8000, 50)],
                vec![process(12, &[(4000, 40), (2000, 10)])],
            ),
        ),
        (
            "v1_2_uuid_unwritten",
            v1(2, vec![device(None, 1000, 100)], Vec::new()),
        ),
    ]
}

fn compact(region: &SharedRegion) -> Vec<u8> {
    let file = encode(region).unwrap();
    let end = region.layout.struct_size();
    let pick = u8::from(region.layout != Layout::V0);
    let head = &file[..HEAD];
    let mut out = vec![pick];
    out.extend_from_slice(&u16::try_from(HEAD).unwrap().to_le_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(&file[end - TAIL..end]);
    out
}

/// The fuzz target's expansion, written again (the target is its own crate).
fn expand(data: &[u8]) -> Vec<u8> {
    let layout = if data[0].is_multiple_of(2) {
        Layout::V0
    } else {
        Layout::V1 { minor: 0 }
    };
    let split = usize::from(u16::from_le_bytes([data[1], data[2]]));
    let (head, tail) = data[3..].split_at(split);
    let mut file = vec![0u8; layout.file_len()];
    file[..head.len()].copy_from_slice(head);
    let end = layout.struct_size();
    file[end - tail.len()..end].copy_from_slice(tail);
    file
}

#[test]
fn fuzz_seeds_are_current_and_decode() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/hami_shared_region");
    let write = std::env::var_os("GPUSLICE_WRITE_FUZZ_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, region) in seeds() {
        let seed = compact(&region);
        // Every slot and tail field of these regions fits in the seed.
        assert_eq!(decode(&expand(&seed)).unwrap(), region, "{name}");
        let path = dir.join(name);
        if write {
            std::fs::write(&path, &seed).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (GPUSLICE_WRITE_FUZZ_SEEDS=1 writes it)",
                    path.display()
                )
            });
            assert!(
                committed == seed,
                "{name} is stale: GPUSLICE_WRITE_FUZZ_SEEDS=1 rewrites it"
            );
        }
    }
}

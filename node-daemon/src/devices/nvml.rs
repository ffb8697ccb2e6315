//! GPUs from the NVIDIA driver through NVML (`libnvidia-ml.so.1`, loaded
//! at run time by nvml-wrapper, so the binary runs on GPU-less machines):
//! UUID, index, model, memory and the NUMA node from sysfs; health from
//! critical XID events, ignoring the XIDs the spec lists as application
//! errors (13, 31, 43, 45, 68, 109).
//!
//! A critical XID marks its GPU unhealthy; an unknown XID marks every GPU
//! unhealthy (as NVIDIA's plugin does). NVML has no "recovered" event, so
//! recovery of a real GPU is reported only when the daemon restarts.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::enum_wrappers::nv_link::IntDeviceType;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::topology::{Link, NvLinkPeer, PairLinks, nvlink_between};
use super::{DeviceError, DeviceSource, HealthEvent, HostUsage, ReportedGpu};

/// XIDs caused by applications, not by the GPU (the spec's
/// `DP_DISABLE_HEALTHCHECKS` default list).
const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// NVML's `NVML_NVLINK_MAX_LINKS`: link indices run below it.
const NVLINK_MAX_LINKS: u32 = 18;

/// How long one event wait blocks before the watcher checks whether anyone
/// still listens.
const EVENT_WAIT_MS: u32 = 5_000;

/// The node's GPUs as NVML reports them.
pub struct NvmlDevices {
    nvml: Arc<Nvml>,
}

impl std::fmt::Debug for NvmlDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlDevices").finish_non_exhaustive()
    }
}

fn nvml_error(action: impl Into<String>) -> impl FnOnce(NvmlError) -> DeviceError {
    let action = action.into();
    move |source| DeviceError::Nvml { action, source }
}

impl NvmlDevices {
    /// Loads `libnvidia-ml.so.1` from the library path and initialises NVML.
    ///
    /// # Errors
    /// [`DeviceError::LibraryMissing`] when the library is absent,
    /// [`DeviceError::DriverNotLoaded`] when the kernel driver is not loaded.
    pub fn open() -> Result<Self, DeviceError> {
        Self::init(Nvml::init())
    }

    /// Like [`NvmlDevices::open`] with the library at `path`.
    ///
    /// # Errors
    /// As [`NvmlDevices::open`].
    pub fn open_library(path: &Path) -> Result<Self, DeviceError> {
        Self::init(Nvml::builder().lib_path(OsStr::new(path)).init())
    }

    fn init(result: Result<Nvml, NvmlError>) -> Result<Self, DeviceError> {
        match result {
            Ok(nvml) => Ok(Self {
                nvml: Arc::new(nvml),
            }),
            Err(NvmlError::LibloadingError(_)) => Err(DeviceError::LibraryMissing),
            Err(NvmlError::DriverNotLoaded) => Err(DeviceError::DriverNotLoaded),
            Err(source) => Err(DeviceError::Nvml {
                action: "init".into(),
                source,
            }),
        }
    }
}

/// The NUMA node of a PCI device from sysfs; NVML's bus id
/// `00000000:3B:00.0` is `0000:3b:00.0` there. Unknown reads as -1.
fn numa_node(bus_id: &str) -> i64 {
    let short = bus_id
        .get(bus_id.len().saturating_sub(12)..)
        .unwrap_or(bus_id);
    let path = format!(
        "/sys/bus/pci/devices/{}/numa_node",
        short.to_ascii_lowercase()
    );
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-1)
}

impl NvmlDevices {
    /// Every device NVML lists, with its position and UUID.
    fn devices(&self) -> Result<Vec<(u32, nvml_wrapper::Device<'_>, String)>, DeviceError> {
        let count = self
            .nvml
            .device_count()
            .map_err(nvml_error("device count"))?;
        (0..count)
            .map(|i| {
                let dev = self
                    .nvml
                    .device_by_index(i)
                    .map_err(nvml_error(format!("device {i}")))?;
                let uuid = dev.uuid().map_err(nvml_error(format!("device {i} uuid")))?;
                Ok((i, dev, uuid))
            })
            .collect()
    }
}

impl DeviceSource for NvmlDevices {
    fn discover(&self) -> Result<Vec<ReportedGpu>, DeviceError> {
        let mut gpus = Vec::new();
        for (i, dev, uuid) in self.devices()? {
            let model = dev.name().map_err(nvml_error(format!("device {i} name")))?;
            let memory_mib = match dev.memory_info() {
                Ok(m) => Some(m.total / (1024 * 1024)),
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(nvml_error(format!("device {i} memory"))(e)),
            };
            let numa = dev.pci_info().map_or(-1, |p| numa_node(&p.bus_id));
            gpus.push(ReportedGpu {
                uuid,
                index: dev.index().unwrap_or(i),
                model,
                memory_mib,
                numa,
            });
        }
        Ok(gpus)
    }

    /// Untested without a GPU: the calls are NVML's `nvmlDeviceGetMemoryInfo`,
    /// `GetUtilizationRates`, `GetTemperature(GPU)` and `GetPowerUsage`, as
    /// HAMi's monitor makes them.
    fn usage(&self) -> Result<Vec<HostUsage>, DeviceError> {
        Ok(self
            .devices()?
            .into_iter()
            .map(|(_, dev, uuid)| usage_of(&dev, uuid))
            .collect())
    }

    /// Untested without a GPU: NVML's `GetTopologyCommonAncestor` for the
    /// PCIe path and, per link, `GetNvLinkState`, `GetNvLinkRemotePciInfo`
    /// and `GetNvLinkRemoteDeviceType`, as HAMi's plugin reads them.
    fn links(&self) -> Result<PairLinks, DeviceError> {
        let mut gpus = Vec::new();
        for (i, dev, uuid) in self.devices()? {
            let bus_id = dev
                .pci_info()
                .map_err(nvml_error(format!("device {i} pci info")))?
                .bus_id;
            let nvlinks = nvlink_peers(&dev).map_err(nvml_error(format!("device {i} nvlinks")))?;
            gpus.push((i, uuid, bus_id, nvlinks));
        }
        let mut links = PairLinks::new();
        for (i, a, _, a_links) in &gpus {
            for (j, b, b_bus, b_links) in &gpus {
                if i == j {
                    continue;
                }
                let (da, db) = (
                    self.nvml
                        .device_by_index(*i)
                        .map_err(nvml_error(format!("device {i}")))?,
                    self.nvml
                        .device_by_index(*j)
                        .map_err(nvml_error(format!("device {j}")))?,
                );
                let mut pair = Vec::new();
                match da.topology_common_ancestor(db) {
                    Ok(level) => pair.push(match level {
                        TopologyLevel::Internal => Link::SameBoard,
                        TopologyLevel::Single => Link::SingleSwitch,
                        TopologyLevel::Multiple => Link::MultiSwitch,
                        TopologyLevel::HostBridge => Link::HostBridge,
                        TopologyLevel::Node => Link::SameCpu,
                        TopologyLevel::System => Link::CrossCpu,
                    }),
                    Err(NvmlError::NotSupported) => {}
                    Err(e) => return Err(nvml_error(format!("devices {i}, {j} topology"))(e)),
                }
                pair.extend(nvlink_between(a_links, b_links, b_bus));
                links.insert((a.clone(), b.clone()), pair);
            }
        }
        Ok(links)
    }

    fn health_events(&self) -> Result<BoxStream<'static, HealthEvent>, DeviceError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let nvml = Arc::clone(&self.nvml);
        std::thread::Builder::new()
            .name("nvml-health".into())
            .spawn(move || watch_xids(&nvml, &tx))
            .map_err(|e| DeviceError::Nvml {
                action: format!("start health thread: {e}"),
                source: NvmlError::Unknown,
            })?;
        Ok(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
                .boxed(),
        )
    }
}

/// What each active NVLink of `dev` ends at; links the GPU does not have
/// (NVML: not supported, or an invalid link index) are skipped.
fn nvlink_peers(dev: &nvml_wrapper::Device<'_>) -> Result<Vec<NvLinkPeer>, NvmlError> {
    let mut peers = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let nvlink = dev.link_wrapper_for(link);
        match nvlink.is_active() {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(e),
        }
        match nvlink.remote_device_type(link) {
            Ok(IntDeviceType::Switch) => peers.push(NvLinkPeer::Switch),
            Ok(_) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {
                match nvlink.remote_pci_info() {
                    Ok(pci) => peers.push(NvLinkPeer::Gpu(pci.bus_id)),
                    Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(peers)
}

/// One GPU's readings; each failing call is logged and left `None` (HAMi's
/// monitor skips a reading the same way, e.g. memory on unified-memory GPUs).
fn usage_of(dev: &nvml_wrapper::Device<'_>, uuid: String) -> HostUsage {
    fn reading<T>(what: &str, uuid: &str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(NvmlError::NotSupported) => None,
            Err(error) => {
                debug!(gpu = %uuid, %error, "NVML {what} unavailable");
                None
            }
        }
    }
    let utilization = reading("utilization", &uuid, dev.utilization_rates());
    HostUsage {
        memory_used_bytes: reading("memory", &uuid, dev.memory_info()).map(|m| m.used),
        gpu_utilization: utilization.as_ref().map(|u| u.gpu),
        memory_utilization: utilization.map(|u| u.memory),
        temperature_celsius: reading(
            "temperature",
            &uuid,
            dev.temperature(TemperatureSensor::Gpu),
        ),
        power_watts: reading("power", &uuid, dev.power_usage()).map(|mw| f64::from(mw) / 1000.0),
        uuid,
    }
}

/// Blocks on NVML XID events until `tx` is closed.
fn watch_xids(nvml: &Nvml, tx: &mpsc::UnboundedSender<HealthEvent>) {
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(error) => {
            warn!(%error, "NVML events unavailable; GPU health is not watched");
            return;
        }
    };
    let mut uuids = Vec::new();
    for i in 0..nvml.device_count().unwrap_or(0) {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let Ok(uuid) = dev.uuid() else { continue };
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => set = s,
            Err(error) => {
                warn!(gpu = %uuid, error = %error.error, "XID events unsupported; health not watched");
                return;
            }
        }
        uuids.push(uuid);
    }
    info!(gpus = uuids.len(), "watching NVML XID events");
    while !tx.is_closed() {
        match set.wait(EVENT_WAIT_MS) {
            Ok(event) => match (event.event_data, event.device.uuid().ok()) {
                (Some(XidError::Value(xid)), gpu) if APPLICATION_XIDS.contains(&xid) => {
                    debug!(xid, ?gpu, "application XID ignored");
                }
                (Some(XidError::Value(xid)), Some(uuid)) => {
                    warn!(xid, gpu = %uuid, "critical XID: GPU unhealthy");
                    let _ = tx.send(HealthEvent {
                        uuid,
                        healthy: false,
                    });
                }
                (_, gpu) => {
                    warn!(?gpu, "unknown XID: every GPU unhealthy");
                    for uuid in &uuids {
                        let _ = tx.send(HealthEvent {
                            uuid: uuid.clone(),
                            healthy: false,
                        });
                    }
                }
            },
            Err(NvmlError::Timeout) => {}
            Err(error) => {
                warn!(%error, "NVML event wait failed");
                std::thread::sleep(std::time::Duration::from_millis(u64::from(EVENT_WAIT_MS)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_gives_the_driver_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = NvmlDevices::open_library(&dir.path().join("libnvidia-ml.so.1")).unwrap_err();
        assert!(matches!(err, DeviceError::LibraryMissing), "{err:?}");
        assert_eq!(
            err.to_string(),
            "libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this node?"
        );
    }

    #[test]
    fn numa_of_an_absent_device_is_unknown() {
        assert_eq!(numa_node("00000000:FF:1F.7"), -1);
    }
}

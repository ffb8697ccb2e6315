//! Where the node's GPUs come from: the [`DeviceSource`] trait, the GPU
//! description every other module uses ([`Gpu`]), and the pure rules that
//! turn what a source reports into what is advertised (HAMi's type naming,
//! `deviceMemoryScaling`, `deviceCoreScaling`, `preConfiguredDeviceMemory`,
//! `filterDevices`).
//!
//! Two sources implement the trait: [`nvml`] (the NVIDIA driver, loaded at
//! run time) and [`simulated`] (GPUs described in the config). This module
//! does not own health over time (see `health`) nor allocations (`ledger`).

pub mod nvml;
pub mod simulated;
pub mod topology;

use futures::stream::BoxStream;

use crate::settings::{FilterDevices, Settings};

/// One physical GPU as the daemon advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// GPU UUID, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Index of the GPU on the node.
    pub index: u32,
    /// HAMi device type: the model name with the `NVIDIA-` prefix rule applied.
    pub device_type: String,
    /// Device memory in MiB after `deviceMemoryScaling`.
    pub memory_mib: u32,
    /// Compute in percent after `deviceCoreScaling` (100 = one card).
    pub cores: u32,
    /// How many containers may share the GPU (`deviceSplitCount`).
    pub split_count: u32,
    /// NUMA node (0 when unknown or negative).
    pub numa: u32,
    /// Whether the GPU is usable.
    pub healthy: bool,
    /// In MIG mode, the GPU instance profiles it offers (empty: HAMi-core
    /// slices).
    pub mig_profiles: Vec<proto::hami::mig::MigProfile>,
}

impl Gpu {
    /// The node register entry HAMi's scheduler reads for this GPU.
    #[must_use]
    pub fn node_device(&self) -> proto::hami::register::NodeDevice {
        proto::hami::register::NodeDevice {
            id: self.uuid.clone(),
            index: self.index,
            count: self.split_count,
            devmem: self.memory_mib,
            devcore: self.cores,
            device_type: self.device_type.clone(),
            numa: self.numa,
            mode: if self.mig_profiles.is_empty() {
                proto::hami::register::MODE_HAMI_CORE
            } else {
                proto::hami::register::MODE_MIG
            }
            .to_owned(),
            health: self.healthy,
            mig_profiles: self.mig_profiles.clone(),
        }
    }
}

/// A GPU as a source reports it, before the advertising rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedGpu {
    /// GPU UUID.
    pub uuid: String,
    /// Index on the node.
    pub index: u32,
    /// Model name as NVML reports it, e.g. `Tesla T4` or `NVIDIA A100-SXM4-40GB`.
    pub model: String,
    /// Device memory in MiB; `None` when the driver cannot report it.
    pub memory_mib: Option<u64>,
    /// NUMA node from sysfs; negative means unknown.
    pub numa: i64,
}

/// What one GPU is doing right now, as the host sees it (HAMi's
/// `hami_host_gpu_*` metrics). A reading the source cannot take is `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostUsage {
    /// GPU UUID.
    pub uuid: String,
    /// Device memory in use by every process, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Percent of time a kernel ran over the driver's last sample period.
    pub gpu_utilization: Option<u32>,
    /// Percent of time device memory was read or written, same period.
    pub memory_utilization: Option<u32>,
    /// GPU temperature, °C.
    pub temperature_celsius: Option<u32>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
}

/// A health change of one GPU, from the source's health watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// The GPU.
    pub uuid: String,
    /// Its new health.
    pub healthy: bool,
}

/// Why GPUs could not be discovered or watched.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The NVIDIA management library is not installed.
    #[error("libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this node?")]
    LibraryMissing,
    /// The library is present but the kernel driver is not loaded.
    #[error("the NVIDIA kernel driver is not loaded on this node")]
    DriverNotLoaded,
    /// Any other NVML failure, with what was being done.
    #[error("NVML {action}: {source}")]
    Nvml {
        /// What failed, e.g. `device 3 uuid`.
        action: String,
        /// The NVML error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// After filtering, no GPU is left to advertise.
    #[error("no GPU to advertise ({reported} reported, all filtered out or without known memory)")]
    NoGpus {
        /// How many the source reported.
        reported: usize,
    },
}

/// A source of GPUs and of their health changes.
pub trait DeviceSource: Send + Sync {
    /// The GPUs the source reports right now, before the advertising rules.
    ///
    /// # Errors
    /// A [`DeviceError`] when the source cannot be read.
    fn discover(&self) -> Result<Vec<ReportedGpu>, DeviceError>;

    /// Health changes from now on; the stream ends when the source stops.
    ///
    /// # Errors
    /// A [`DeviceError`] when health cannot be watched.
    fn health_events(&self) -> Result<BoxStream<'static, HealthEvent>, DeviceError>;

    /// What every GPU is doing right now. Blocking (NVML calls); call it off
    /// the async threads.
    ///
    /// # Errors
    /// A [`DeviceError`] when the source cannot be read at all; a single
    /// reading that fails is `None` in its [`HostUsage`].
    fn usage(&self) -> Result<Vec<HostUsage>, DeviceError>;

    /// How each ordered pair of the reported GPUs is linked (for the pair
    /// scores of `hami.io/node-nvidia-score`). Blocking (NVML calls).
    ///
    /// # Errors
    /// A [`DeviceError`] when the topology cannot be read.
    fn links(&self) -> Result<topology::PairLinks, DeviceError>;
}

/// The advertising rules of HAMi's device plugin (spec §1), from settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Shaping {
    /// `deviceSplitCount`.
    pub split_count: u32,
    /// `deviceMemoryScaling`.
    pub memory_scaling: f64,
    /// `deviceCoreScaling`.
    pub core_scaling: f64,
    /// `preConfiguredDeviceMemory`: memory when the source cannot report it.
    pub pre_configured_memory_mib: Option<u32>,
    /// `filterDevices`.
    pub filter: FilterDevices,
    /// MIG mode: MIG-capable models get their profiles.
    pub mig: bool,
}

impl From<&Settings> for Shaping {
    fn from(s: &Settings) -> Self {
        Self {
            split_count: s.device_split_count,
            memory_scaling: s.device_memory_scaling,
            core_scaling: s.device_core_scaling,
            pre_configured_memory_mib: s.pre_configured_device_memory,
            filter: s.filter_devices.clone(),
            mig: s.operating_mode == crate::settings::OperatingMode::Mig,
        }
    }
}

/// HAMi's type name: the model with an `NVIDIA-` prefix unless it already
/// starts with `NVIDIA` (`NVIDIA A100-SXM4-40GB`, `NVIDIA-Tesla T4`).
#[must_use]
pub fn device_type(model: &str) -> String {
    if model.starts_with("NVIDIA") {
        model.to_owned()
    } else {
        format!("NVIDIA-{model}")
    }
}

/// `value × factor`, truncated like Go's `uint(float64(v) * f)`, saturating
/// at `u32::MAX`.
fn scaled(value: u64, factor: f64) -> u32 {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let out = (value as f64 * factor)
        .trunc()
        .clamp(0.0, f64::from(u32::MAX)) as u32;
    out
}

impl Shaping {
    /// Applies the rules to one reported GPU: `None` when `filterDevices`
    /// names it or its memory is unknown and no `preConfiguredDeviceMemory`
    /// is set (HAMi skips such a device).
    #[must_use]
    pub fn apply(&self, gpu: &ReportedGpu) -> Option<Gpu> {
        if self.filter.uuid.iter().any(|u| u == &gpu.uuid) || self.filter.index.contains(&gpu.index)
        {
            return None;
        }
        let memory = gpu
            .memory_mib
            .or(self.pre_configured_memory_mib.map(u64::from))?;
        let mig_profiles = if self.mig {
            proto::hami::mig::known_profiles(&gpu.model).unwrap_or_default()
        } else {
            Vec::new()
        };
        if !mig_profiles.is_empty() {
            // HAMi in MIG mode: no scaling; one slot per instance of the
            // profile with the most instances.
            let slots = mig_profiles
                .iter()
                .map(proto::hami::mig::MigProfile::instance_count)
                .max()
                .unwrap_or(1);
            return Some(Gpu {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
                device_type: device_type(&gpu.model),
                memory_mib: u32::try_from(memory).unwrap_or(u32::MAX),
                cores: 100,
                split_count: slots,
                numa: u32::try_from(gpu.numa).unwrap_or(0),
                healthy: true,
                mig_profiles,
            });
        }
        Some(Gpu {
            uuid: gpu.uuid.clone(),
            index: gpu.index,
            device_type: device_type(&gpu.model),
            memory_mib: scaled(memory, self.memory_scaling),
            cores: scaled(100, self.core_scaling),
            split_count: self.split_count,
            numa: u32::try_from(gpu.numa).unwrap_or(0),
            healthy: true,
            mig_profiles: Vec::new(),
        })
    }

    /// Applies the rules to every reported GPU, sorted by index.
    ///
    /// # Errors
    /// [`DeviceError::NoGpus`] when none is left.
    pub fn advertise(&self, reported: &[ReportedGpu]) -> Result<Vec<Gpu>, DeviceError> {
        let mut gpus: Vec<Gpu> = reported.iter().filter_map(|g| self.apply(g)).collect();
        gpus.sort_by_key(|g| g.index);
        if gpus.is_empty() {
            return Err(DeviceError::NoGpus {
                reported: reported.len(),
            });
        }
        Ok(gpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaping() -> Shaping {
        Shaping {
            split_count: 10,
            memory_scaling: 1.0,
            core_scaling: 1.0,
            pre_configured_memory_mib: None,
            filter: FilterDevices::default(),
            mig: false,
        }
    }

    fn reported(index: u32, model: &str, memory: Option<u64>) -> ReportedGpu {
        ReportedGpu {
            uuid: format!("GPU-{index}"),
            index,
            model: model.into(),
            memory_mib: memory,
            numa: -1,
        }
    }

    #[test]
    fn mig_mode_advertises_mig_capable_models_with_their_profiles() {
        let s = Shaping {
            mig: true,
            memory_scaling: 2.0,
            ..shaping()
        };
        let a100 = s
            .apply(&reported(0, "NVIDIA A100-SXM4-40GB", Some(40_960)))
            .unwrap();
        assert_eq!(a100.split_count, 7, "the most instances of one profile");
        assert_eq!(a100.memory_mib, 40_960, "no scaling in MIG mode");
        let dev = a100.node_device();
        assert_eq!(dev.mode, "mig");
        assert_eq!(dev.mig_profiles[0].name, "1g.5gb");
        let t4 = s.apply(&reported(1, "Tesla T4", Some(15_360))).unwrap();
        assert_eq!(t4.node_device().mode, "hami-core");
        assert!(t4.mig_profiles.is_empty());
    }

    #[test]
    fn type_gets_nvidia_prefix_unless_it_starts_with_nvidia() {
        assert_eq!(device_type("Tesla T4"), "NVIDIA-Tesla T4");
        assert_eq!(
            device_type("NVIDIA A100-SXM4-40GB"),
            "NVIDIA A100-SXM4-40GB"
        );
        assert_eq!(device_type("NVIDIA-Tesla V100"), "NVIDIA-Tesla V100");
    }

    #[test]
    fn scaling_truncates_memory_and_scales_cores() {
        let s = Shaping {
            memory_scaling: 1.5,
            core_scaling: 2.0,
            ..shaping()
        };
        let gpu = s.apply(&reported(0, "Tesla T4", Some(15_109))).unwrap();
        assert_eq!(gpu.memory_mib, 22_663); // 22663.5 truncated
        assert_eq!(gpu.cores, 200);
        assert_eq!(gpu.numa, 0, "negative NUMA reads as 0");
        assert_eq!(gpu.split_count, 10);
    }

    #[test]
    fn unknown_memory_uses_pre_configured_or_skips_the_gpu() {
        let gpu = reported(0, "GH200", None);
        assert_eq!(shaping().apply(&gpu), None);
        let s = Shaping {
            pre_configured_memory_mib: Some(96_000),
            ..shaping()
        };
        assert_eq!(s.apply(&gpu).unwrap().memory_mib, 96_000);
    }

    #[test]
    fn filter_devices_skips_by_uuid_and_index_and_empty_result_is_an_error() {
        let s = Shaping {
            filter: FilterDevices {
                uuid: vec!["GPU-0".into()],
                index: vec![2],
            },
            ..shaping()
        };
        let all = [
            reported(2, "A", Some(1)),
            reported(1, "A", Some(1)),
            reported(0, "A", Some(1)),
        ];
        let gpus = s.advertise(&all).unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].uuid, "GPU-1");
        assert!(matches!(
            s.advertise(&all[..1]),
            Err(DeviceError::NoGpus { reported: 1 })
        ));
    }

    #[test]
    fn gpus_are_sorted_by_index() {
        let all = [reported(1, "A", Some(1)), reported(0, "A", Some(1))];
        let idx: Vec<u32> = shaping()
            .advertise(&all)
            .unwrap()
            .iter()
            .map(|g| g.index)
            .collect();
        assert_eq!(idx, vec![0, 1]);
    }

    #[test]
    fn node_device_is_the_register_entry() {
        let gpu = shaping()
            .apply(&reported(3, "Tesla T4", Some(15_360)))
            .unwrap();
        let d = gpu.node_device();
        assert_eq!(
            (
                d.id.as_str(),
                d.index,
                d.count,
                d.devmem,
                d.devcore,
                d.device_type.as_str(),
                d.mode.as_str(),
                d.health
            ),
            (
                "GPU-3",
                3,
                10,
                15_360,
                100,
                "NVIDIA-Tesla T4",
                "hami-core",
                true
            )
        );
    }
}

//! The typed configuration of `node-daemon`: keys (HAMi's device-plugin
//! names where one exists), defaults, command-line flags and validation.
//!
//! Layering (defaults < file < `GPUSLICE_…` env < flags) is
//! [`gpuslice_config::layered`]; this module owns what the keys are and what
//! makes a value valid.

use std::net::SocketAddr;
use std::path::PathBuf;

use gpuslice_config::parse_listen;
use serde::{Deserialize, Serialize};
use telemetry::{LogFlags, LogFormat};

/// Where the GPUs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceSourceKind {
    /// NVML (`libnvidia-ml.so.1`, loaded at run time).
    Nvml,
    /// GPUs described in the config, for machines without a GPU.
    Simulated,
}

/// How the node shares its GPUs (HAMi's per-node `operatingmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum OperatingMode {
    /// HAMi-core slices (memory and compute limits in the container).
    #[default]
    #[serde(rename = "hami-core")]
    #[value(name = "hami-core")]
    HamiCore,
    /// MIG instances on MIG-capable GPUs (A100, H100, A30); other GPUs stay
    /// in `hami-core` mode. Simulated source only for now (see docs/mig.md).
    #[serde(rename = "mig")]
    #[value(name = "mig")]
    Mig,
}

/// How the node's GPUs reach pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
pub enum Mode {
    /// The kubelet device-plugin API (`nvidia.com/gpu`) and the HAMi
    /// register annotation; the scheduler extender places slices.
    #[default]
    #[serde(rename = "device-plugin")]
    #[value(name = "device-plugin")]
    DevicePlugin,
    /// Dynamic Resource Allocation: a `ResourceSlice` per node and the
    /// kubelet DRA plugin (driver `gpu.gpuslice.dev`); kube-scheduler
    /// allocates slices (see docs/dra.md).
    #[serde(rename = "dra")]
    #[value(name = "dra")]
    Dra,
}

/// One simulated GPU, for heterogeneous simulated nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimulatedGpu {
    /// Model name as NVML would report it, e.g. `NVIDIA A100-SXM4-40GB`.
    pub model: String,
    /// Device memory in MiB.
    pub memory_mib: u32,
    /// NUMA node.
    #[serde(default)]
    pub numa: u32,
    /// GPUs of the same group are joined by NVLink (none when unset).
    #[serde(default)]
    pub nvlink_group: Option<u32>,
    /// NVLinks between two GPUs of a group [default: 12, as on an A100
    /// through NVSwitches].
    #[serde(default = "default_simulated_nvlinks")]
    pub nvlinks: u32,
}

/// NVLinks per simulated pair when `nvlinks` is not given.
pub const DEFAULT_SIMULATED_NVLINKS: u32 = 12;

fn default_simulated_nvlinks() -> u32 {
    DEFAULT_SIMULATED_NVLINKS
}

/// GPUs to leave out, by UUID or index (HAMi's `filterdevices`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterDevices {
    /// UUIDs to skip.
    pub uuid: Vec<String>,
    /// Indices to skip.
    pub index: Vec<u32>,
}

/// Every setting of `node-daemon`, after layering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// Kubeconfig file; in-cluster configuration when unset.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (also read from `$NODE_NAME`).
    pub node_name: Option<String>,
    /// `device-plugin` or `dra`.
    pub mode: Mode,
    /// kubelet's device-plugin folder.
    pub device_plugin_dir: PathBuf,
    /// DRA mode: the folder of the DRA plugin socket `dra.sock`.
    pub dra_plugin_dir: PathBuf,
    /// DRA mode: kubelet's plugin-registration folder, where
    /// `gpu.gpuslice.dev-reg.sock` is served.
    pub plugin_registry_dir: PathBuf,
    /// DRA mode: where CDI spec files of prepared claims are written.
    pub cdi_dir: PathBuf,
    /// Where the GPUs come from.
    pub device_source: DeviceSourceKind,
    /// Number of identical simulated GPUs (with `simulatedGpuModel`, `simulatedGpuMemoryMib`).
    pub simulated_gpus: u32,
    /// Model of the identical simulated GPUs.
    pub simulated_gpu_model: String,
    /// Memory of the identical simulated GPUs, MiB.
    pub simulated_gpu_memory_mib: u32,
    /// Heterogeneous simulated GPUs; used instead of `simulatedGpus` when non-empty.
    pub simulated_gpu_list: Vec<SimulatedGpu>,
    /// How many pods may share one GPU.
    pub device_split_count: u32,
    /// `hami-core` or `mig` (HAMi's `operatingmode`).
    pub operating_mode: OperatingMode,
    /// Factor applied to each GPU's memory (above 1 oversubscribes).
    pub device_memory_scaling: f64,
    /// Factor applied to each GPU's cores.
    pub device_core_scaling: f64,
    /// Memory in MiB to use when NVML cannot report it.
    pub pre_configured_device_memory: Option<u32>,
    /// GPUs to leave out.
    pub filter_devices: FilterDevices,
    /// Whether to publish the GPUs' pair scores as
    /// `hami.io/node-nvidia-score` (HAMi's `ENABLE_TOPOLOGY_SCORE`), which
    /// the `topology-aware` GPU policy reads.
    pub enable_topology_score: bool,
    /// The resource name registered with kubelet.
    pub resource_name: String,
    /// Host folder holding HAMi-core (`vgpu/libvgpu.so`, `vgpu/ld.so.preload`).
    pub hook_path: PathBuf,
    /// Where `/metrics` and `/healthz` are served (`:9396` means all
    /// interfaces); unset disables them.
    #[serde(with = "gpuslice_config::listen::option")]
    pub metrics_bind_address: Option<SocketAddr>,
    /// Log output: `human` or `json` (`--log-json` is the same as `json`).
    pub log_format: LogFormat,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            node_name: None,
            mode: Mode::DevicePlugin,
            device_plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            dra_plugin_dir: PathBuf::from("/var/lib/kubelet/plugins/gpu.gpuslice.dev"),
            plugin_registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            cdi_dir: PathBuf::from("/var/run/cdi"),
            device_source: DeviceSourceKind::Nvml,
            simulated_gpus: 0,
            simulated_gpu_model: "NVIDIA A100-SXM4-40GB".to_owned(),
            simulated_gpu_memory_mib: 40960,
            simulated_gpu_list: Vec::new(),
            device_split_count: 10,
            operating_mode: OperatingMode::HamiCore,
            device_memory_scaling: 1.0,
            device_core_scaling: 1.0,
            pre_configured_device_memory: None,
            filter_devices: FilterDevices::default(),
            enable_topology_score: false,
            resource_name: "nvidia.com/gpu".to_owned(),
            hook_path: PathBuf::from("/usr/local"),
            metrics_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], 9396))),
            log_format: LogFormat::Human,
        }
    }
}

/// A setting that is well-formed but not acceptable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvalidSetting {
    /// No node name from flags, config or `$NODE_NAME`.
    #[error("nodeName is required: pass --node-name or set NODE_NAME")]
    NodeName,
    /// MIG mode with the NVML source: creating GPU instances through NVML
    /// is not implemented (it cannot be tested without a MIG-capable GPU).
    #[error(
        "operatingMode mig needs deviceSource simulated: MIG through NVML is not implemented yet (see docs/mig.md)"
    )]
    MigNeedsSimulated,
    /// DRA mode with MIG: MIG instances are not published as DRA devices.
    #[error("mode dra needs operatingMode hami-core: MIG instances are not published through DRA")]
    DraWithMig,
    /// A zero split count.
    #[error("deviceSplitCount must be at least 1")]
    SplitCount,
    /// A scaling factor that is not positive.
    #[error("{key} must be a positive number, got {value}")]
    Scaling {
        /// The key.
        key: &'static str,
        /// The value given.
        value: f64,
    },
    /// Simulated source with no GPUs described.
    #[error(
        "deviceSource simulated needs GPUs: set simulatedGpus (--simulated-gpus) or simulatedGpuList"
    )]
    NoSimulatedGpus,
    /// A simulated GPU with no memory.
    #[error("simulated GPU memory must be at least 1 MiB")]
    SimulatedMemory,
    /// A resource name that is not `domain/name`.
    #[error("resourceName must look like vendor.com/gpu, got `{0}`")]
    ResourceName(String),
}

impl Settings {
    /// Fills `nodeName` from `$NODE_NAME` (given as `node_name_env`) when
    /// unset, then checks every value.
    ///
    /// # Errors
    /// The first [`InvalidSetting`] found.
    pub fn finish(mut self, node_name_env: Option<String>) -> Result<Self, InvalidSetting> {
        if self.node_name.as_deref().is_none_or(str::is_empty) {
            self.node_name = node_name_env.filter(|n| !n.is_empty());
        }
        if self.node_name.is_none() {
            return Err(InvalidSetting::NodeName);
        }
        if self.device_split_count == 0 {
            return Err(InvalidSetting::SplitCount);
        }
        for (key, value) in [
            ("deviceMemoryScaling", self.device_memory_scaling),
            ("deviceCoreScaling", self.device_core_scaling),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(InvalidSetting::Scaling { key, value });
            }
        }
        if self.operating_mode == OperatingMode::Mig && self.device_source == DeviceSourceKind::Nvml
        {
            return Err(InvalidSetting::MigNeedsSimulated);
        }
        if self.mode == Mode::Dra && self.operating_mode == OperatingMode::Mig {
            return Err(InvalidSetting::DraWithMig);
        }
        if self.device_source == DeviceSourceKind::Simulated {
            if self.simulated_gpus == 0 && self.simulated_gpu_list.is_empty() {
                return Err(InvalidSetting::NoSimulatedGpus);
            }
            if self.simulated_gpu_memory_mib == 0
                || self.simulated_gpu_list.iter().any(|g| g.memory_mib == 0)
            {
                return Err(InvalidSetting::SimulatedMemory);
            }
        }
        match self.resource_name.split_once('/') {
            Some((domain, name)) if !domain.is_empty() && !name.is_empty() => {}
            _ => return Err(InvalidSetting::ResourceName(self.resource_name.clone())),
        }
        Ok(self)
    }
}

/// Command-line flags; each overrides the config key of the same name
/// (camelCase) when given.
#[derive(Debug, Default, clap::Args, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// Kubeconfig file [default: in-cluster configuration].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name [default: $NODE_NAME].
    #[arg(long)]
    pub node_name: Option<String>,
    /// `device-plugin` (kubelet device plugin, HAMi annotations) or `dra`
    /// (ResourceSlice and kubelet DRA plugin) [default: device-plugin].
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// kubelet's device-plugin folder [default: /var/lib/kubelet/device-plugins].
    #[arg(long)]
    pub device_plugin_dir: Option<PathBuf>,
    /// DRA mode: folder of the DRA plugin socket dra.sock
    /// [default: /var/lib/kubelet/plugins/gpu.gpuslice.dev].
    #[arg(long)]
    pub dra_plugin_dir: Option<PathBuf>,
    /// DRA mode: kubelet's plugin-registration folder
    /// [default: /var/lib/kubelet/plugins_registry].
    #[arg(long)]
    pub plugin_registry_dir: Option<PathBuf>,
    /// DRA mode: folder of the CDI spec files [default: /var/run/cdi].
    #[arg(long)]
    pub cdi_dir: Option<PathBuf>,
    /// Where GPUs come from [default: nvml].
    #[arg(long, value_enum)]
    pub device_source: Option<DeviceSourceKind>,
    /// Number of identical simulated GPUs.
    #[arg(long)]
    pub simulated_gpus: Option<u32>,
    /// Model of the simulated GPUs [default: NVIDIA A100-SXM4-40GB].
    #[arg(long)]
    pub simulated_gpu_model: Option<String>,
    /// Memory of each simulated GPU in MiB [default: 40960].
    #[arg(long)]
    pub simulated_gpu_memory_mib: Option<u32>,
    /// How many pods may share one GPU [default: 10].
    #[arg(long)]
    pub device_split_count: Option<u32>,
    /// `hami-core` or `mig` [default: hami-core].
    #[arg(long, value_enum)]
    pub operating_mode: Option<OperatingMode>,
    /// Factor applied to each GPU's memory [default: 1].
    #[arg(long)]
    pub device_memory_scaling: Option<f64>,
    /// Factor applied to each GPU's cores [default: 1].
    #[arg(long)]
    pub device_core_scaling: Option<f64>,
    /// Publish the GPUs' pair scores (`hami.io/node-nvidia-score`) for the
    /// topology-aware GPU policy [default: false].
    #[arg(long)]
    pub enable_topology_score: Option<bool>,
    /// Resource name registered with kubelet [default: nvidia.com/gpu].
    #[arg(long)]
    pub resource_name: Option<String>,
    /// Host folder holding HAMi-core [default: /usr/local].
    #[arg(long)]
    pub hook_path: Option<PathBuf>,
    /// Address of /metrics and /healthz, host:port or :port [default: 0.0.0.0:9396].
    #[arg(long, value_parser = parse_listen)]
    pub metrics_bind_address: Option<SocketAddr>,
    /// `--log-format`, `--log-json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub log: LogFlags,
}

/// Why the daemon cannot start with the given configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The layers do not merge into settings.
    #[error(transparent)]
    Layers(#[from] gpuslice_config::SettingsError),
    /// A value is not acceptable.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// Loads the layered settings (see [`gpuslice_config::load`]), takes the node
/// name from `$NODE_NAME` when unset, and validates.
///
/// # Errors
/// A [`ConfigError`] with a one-line reason.
pub fn load(file: Option<&std::path::Path>, flags: &Flags) -> Result<Settings, ConfigError> {
    let settings: Settings = gpuslice_config::load(file, flags)?;
    Ok(settings.finish(std::env::var("NODE_NAME").ok())?)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use gpuslice_config::{FileFormat, FileLayer, layered};

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// The daemon's flags as the command line gives them.
    fn flags(args: &[&str]) -> Result<Flags, clap::Error> {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: Flags,
        }
        Cli::try_parse_from(std::iter::once("node-daemon").chain(args.iter().copied()))
            .map(|c| c.flags)
    }

    fn from_yaml(text: &str) -> Result<Settings, gpuslice_config::SettingsError> {
        let file = FileLayer {
            origin: "c.yaml",
            text,
            format: FileFormat::Yaml,
        };
        layered(Some(file), &no_env, &Flags::default())
    }

    #[test]
    fn hami_keys_and_heterogeneous_simulated_gpus_parse() {
        let s = from_yaml(
            "nodeName: n1\ndeviceSource: simulated\ndeviceSplitCount: 4\n\
             deviceMemoryScaling: 1.5\nfilterDevices:\n  uuid: [GPU-x]\n  index: [3]\n\
             simulatedGpuList:\n  - {model: Tesla T4, memoryMib: 15360}\n  - {model: NVIDIA A10, memoryMib: 23028, numa: 1}\n",
        )
        .unwrap()
        .finish(None)
        .unwrap();
        assert_eq!(s.device_source, DeviceSourceKind::Simulated);
        assert_eq!(s.device_split_count, 4);
        assert!((s.device_memory_scaling - 1.5).abs() < f64::EPSILON);
        assert_eq!(s.filter_devices.index, vec![3]);
        assert_eq!(s.simulated_gpu_list[1].numa, 1);
    }

    #[test]
    fn mig_mode_parses_and_needs_the_simulated_source() {
        let s = from_yaml("operatingMode: mig\ndeviceSource: simulated\nsimulatedGpus: 2\n")
            .unwrap()
            .finish(Some("n".into()))
            .unwrap();
        assert_eq!(s.operating_mode, OperatingMode::Mig);
        let nvml = from_yaml("operatingMode: mig\n")
            .unwrap()
            .finish(Some("n".into()));
        assert_eq!(nvml, Err(InvalidSetting::MigNeedsSimulated));
        assert_eq!(
            flags(&["--operating-mode", "hami-core"])
                .unwrap()
                .operating_mode,
            Some(OperatingMode::HamiCore)
        );
    }

    #[test]
    fn dra_mode_and_its_folders_parse_from_the_file_and_the_flags() {
        let s = from_yaml("mode: dra\ncdiDir: /run/cdi\n").unwrap();
        assert_eq!(s.mode, Mode::Dra);
        assert_eq!(s.cdi_dir, PathBuf::from("/run/cdi"));
        assert_eq!(
            s.plugin_registry_dir,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        let f = flags(&[
            "--mode",
            "dra",
            "--dra-plugin-dir",
            "/p",
            "--plugin-registry-dir",
            "/r",
        ])
        .unwrap();
        assert_eq!(f.mode, Some(Mode::Dra));
        let s: Settings = layered(None, &no_env, &f).unwrap();
        assert_eq!(
            (s.dra_plugin_dir, s.plugin_registry_dir),
            (PathBuf::from("/p"), PathBuf::from("/r"))
        );
        assert!(flags(&["--mode", "both"]).is_err());
        let mig =
            from_yaml("mode: dra\noperatingMode: mig\ndeviceSource: simulated\nsimulatedGpus: 1\n")
                .unwrap()
                .finish(Some("n".into()));
        assert_eq!(mig, Err(InvalidSetting::DraWithMig));
    }

    #[test]
    fn node_name_falls_back_to_the_node_name_variable() {
        let s = Settings::default().finish(Some("gpu-7".into())).unwrap();
        assert_eq!(s.node_name.as_deref(), Some("gpu-7"));
        assert_eq!(
            Settings::default().finish(None),
            Err(InvalidSetting::NodeName)
        );
    }

    #[test]
    fn flags_override_file() {
        let file = FileLayer {
            origin: "c.yaml",
            text: "deviceSplitCount: 4\n",
            format: FileFormat::Yaml,
        };
        let flags = Flags {
            device_split_count: Some(7),
            device_source: Some(DeviceSourceKind::Simulated),
            log: LogFlags {
                log_format: Some(LogFormat::Json),
                log_json: false,
            },
            ..Flags::default()
        };
        let s: Settings = layered(Some(file), &no_env, &flags).unwrap();
        assert_eq!(s.device_split_count, 7);
        assert_eq!(s.device_source, DeviceSourceKind::Simulated);
        assert_eq!(s.log_format, LogFormat::Json);
    }

    #[test]
    fn log_json_is_accepted_as_log_format_json() {
        let s = layered::<Settings, _>(
            Some(FileLayer {
                origin: "c.yaml",
                text: "logFormat: human\n",
                format: FileFormat::Yaml,
            }),
            &no_env,
            &flags(&["--log-json"]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
    }

    #[test]
    fn a_bad_address_is_refused_in_the_file_the_environment_and_the_flags() {
        let err = from_yaml("metricsBindAddress: nowhere\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "metricsBindAddress from config file c.yaml: \
             `nowhere` is not an address like 0.0.0.0:443 or :443"
        );
        let env = |k: &str| (k == "GPUSLICE_METRICS_BIND_ADDRESS").then(|| "9396".to_owned());
        let err = layered::<Settings, _>(None, &env, &Flags::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "metricsBindAddress from environment variable GPUSLICE_METRICS_BIND_ADDRESS: `9396`"
            ),
            "{err}"
        );
        let err = flags(&["--metrics-bind-address", "x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`x` is not an address"), "{err}");
        // Port only means every interface; null turns the server off.
        let s = from_yaml("metricsBindAddress: \":9500\"\n").unwrap();
        assert_eq!(
            s.metrics_bind_address,
            Some("0.0.0.0:9500".parse().unwrap())
        );
        let s = from_yaml("metricsBindAddress: null\n").unwrap();
        assert_eq!(s.metrics_bind_address, None);
    }

    #[test]
    fn a_bad_device_source_is_named_with_its_layer() {
        let env = |k: &str| (k == "GPUSLICE_DEVICE_SOURCE").then(|| "fake".to_owned());
        let err = layered::<Settings, _>(None, &env, &Flags::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("deviceSource from environment variable GPUSLICE_DEVICE_SOURCE: "),
            "{err}"
        );
        assert!(err.contains("fake"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let base = Settings {
            node_name: Some("n".into()),
            ..Settings::default()
        };
        let cases: Vec<(Settings, InvalidSetting)> = vec![
            (
                Settings {
                    device_split_count: 0,
                    ..base.clone()
                },
                InvalidSetting::SplitCount,
            ),
            (
                Settings {
                    device_core_scaling: -1.0,
                    ..base.clone()
                },
                InvalidSetting::Scaling {
                    key: "deviceCoreScaling",
                    value: -1.0,
                },
            ),
            (
                Settings {
                    device_source: DeviceSourceKind::Simulated,
                    ..base.clone()
                },
                InvalidSetting::NoSimulatedGpus,
            ),
            (
                Settings {
                    resource_name: "gpu".into(),
                    ..base.clone()
                },
                InvalidSetting::ResourceName("gpu".into()),
            ),
        ];
        for (settings, expected) in cases {
            assert_eq!(settings.finish(None), Err(expected));
        }
    }

    #[test]
    fn unknown_nested_keys_are_rejected() {
        let err = from_yaml("filterDevices:\n  uuids: [x]\n").unwrap_err();
        assert!(err.to_string().contains("uuids"), "{err}");
    }
}

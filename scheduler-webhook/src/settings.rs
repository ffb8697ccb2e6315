//! The typed configuration of `scheduler-webhook serve`: keys, defaults,
//! command-line flags and validation.
//!
//! Layering (defaults < file < `GPUSLICE_…` env < flags) is
//! [`gpuslice_config::layered`]; this module owns what the keys are and what
//! makes a value valid. Policies and addresses are read into their types
//! once, as the layers merge: a bad name or address is refused there, named
//! with its key and the layer that gave it.

use std::net::SocketAddr;
use std::path::PathBuf;

use gpuslice_config::{Named, by_name, named_parser, parse_listen};
use proto::hami::resources::ResourceNames;
use serde::{Deserialize, Serialize};
use telemetry::{LogFlags, LogFormat};

use crate::core::kinds::{GpuPolicy, Policy};

// === impl Named: how a setting spells a policy (exactly its name) ===

impl Named for Policy {
    const WHAT: &'static str = "policy";
    const ALL: &'static [Self] = &Policy::ALL;
    fn name(self) -> &'static str {
        self.as_str()
    }
}

// === The allocation mode ===

/// How GPU slices are allocated in the cluster (`mode`, `--mode`): one
/// value for the whole cluster, the chart's `mode` (see `docs/dra.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// HAMi's protocol: GPU pods go to kube-scheduler's extender profile,
    /// the extender picks node and GPUs and writes annotations, the device
    /// plugin hands the slice over in `Allocate`.
    #[default]
    DevicePlugin,
    /// Dynamic Resource Allocation: the webhook turns a pod's GPU limits
    /// into ResourceClaimTemplate references and kube-scheduler's own
    /// DynamicResources plugin allocates; GPU pods are not routed to the
    /// extender profile.
    Dra,
}

impl Mode {
    /// Both modes, in the order `--help` lists them.
    pub const ALL: [Self; 2] = [Self::DevicePlugin, Self::Dra];

    /// The name in settings and the chart.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DevicePlugin => "device-plugin",
            Self::Dra => "dra",
        }
    }
}

impl Named for Mode {
    const WHAT: &'static str = "mode";
    const ALL: &'static [Self] = &Mode::ALL;
    fn name(self) -> &'static str {
        self.as_str()
    }
}

// === How a setting spells a GPU policy: HAMi's names, exactly, or a comma
// list of them (`mutex,binpack,numa`), so not one of a fixed list ===

/// Reads `--gpu-scheduler-policy` / `gpuSchedulerPolicy`.
fn parse_gpu_policy(value: &str) -> Result<GpuPolicy, String> {
    GpuPolicy::parse_exact(value).map_err(|e| e.to_string())
}

/// Serde for the GPU policy setting: written as its name or list, read
/// with [`GpuPolicy::parse_exact`].
mod gpu_policy_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::core::kinds::GpuPolicy;

    pub(super) fn serialize<S: Serializer>(value: &GpuPolicy, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GpuPolicy, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_gpu_policy(&text).map_err(serde::de::Error::custom)
    }

    /// The same for the flag, which may be absent (flags are only written).
    pub(super) mod option {
        use serde::Serializer;

        use crate::core::kinds::GpuPolicy;

        pub(crate) fn serialize<S: Serializer>(
            value: &Option<GpuPolicy>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(v) => s.collect_str(v),
                None => s.serialize_none(),
            }
        }
    }
}

/// Every setting of `scheduler-webhook serve`, after layering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// `device-plugin` (HAMi's extender and annotations) or `dra` (pods get
    /// ResourceClaimTemplates, kube-scheduler allocates).
    #[serde(with = "by_name")]
    pub mode: Mode,
    /// Kubeconfig file; in-cluster configuration when unset.
    pub kubeconfig: Option<PathBuf>,
    /// Address of the webhook and extender server (`:443` means all interfaces).
    #[serde(with = "gpuslice_config::listen")]
    pub listen: SocketAddr,
    /// PEM certificate chain for TLS (re-read when it changes).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (re-read when it changes).
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP; only allowed on a loopback address.
    pub insecure_http: bool,
    /// Address of the Prometheus `/metrics` server (`:9395` means all interfaces).
    #[serde(with = "gpuslice_config::listen")]
    pub metrics_listen: SocketAddr,
    /// The scheduler name GPU pods are routed to.
    pub scheduler_name: String,
    /// Extended resource names.
    #[serde(flatten)]
    pub resources: ResourceNames,
    /// Default node policy, by its exact name (`fgd` places for the live
    /// workload, see [`crate::cache::fragmentation`]).
    #[serde(with = "by_name")]
    pub node_scheduler_policy: Policy,
    /// Default GPU policy: `binpack`, `spread`, `numa`, `mutex`,
    /// `topology-aware`, or an ordered comma list of them (HAMi's names,
    /// exactly).
    #[serde(with = "gpu_policy_text")]
    pub gpu_scheduler_policy: GpuPolicy,
    /// MiB per GPU when a container asks for neither gpumem nor a percentage (0 = whole card).
    pub default_memory: u32,
    /// Cores (percent) when a container does not ask for gpucores.
    pub default_cores: u32,
    /// GPUs added to a container that asks only for gpumem/gpucores (0 = add none).
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: u32,
    /// Multiplier applied to `gpumem` requests.
    pub memory_factor: u32,
    /// Log output: `human` or `json`.
    pub log_format: LogFormat,
    /// Namespace of kube-scheduler's leader-election Lease (named after
    /// `schedulerName`); the replica whose kube-scheduler holds it writes
    /// the node handshake.
    pub lease_namespace: String,
    /// This replica's identity, matched as a prefix of the Lease holder
    /// (kube-scheduler uses `<hostname>_<uuid>`) [default: $HOSTNAME].
    pub identity: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mode: Mode::DevicePlugin,
            kubeconfig: None,
            listen: SocketAddr::from(([0, 0, 0, 0], 443)),
            tls_cert: None,
            tls_key: None,
            insecure_http: false,
            metrics_listen: SocketAddr::from(([0, 0, 0, 0], 9395)),
            scheduler_name: "gpuslice-scheduler".to_owned(),
            resources: ResourceNames::default(),
            node_scheduler_policy: Policy::Binpack,
            gpu_scheduler_policy: GpuPolicy::SPREAD,
            default_memory: 0,
            default_cores: 0,
            default_gpu_num: 1,
            memory_factor: 1,
            log_format: LogFormat::Human,
            lease_namespace: "kube-system".to_owned(),
            identity: None,
        }
    }
}

/// A setting that is well-formed but not acceptable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidSetting {
    /// Plain HTTP on a non-loopback address.
    #[error("insecureHttp is for loopback testing only, but listen is {0}")]
    InsecureNotLoopback(SocketAddr),
    /// TLS asked for without both files.
    #[error("tlsCert and tlsKey are both required unless insecureHttp is set")]
    MissingTls,
    /// Cores above 100 %.
    #[error("defaultCores must be 0–100, got {0}")]
    Cores(u32),
    /// A zero memory factor.
    #[error("memoryFactor must be at least 1")]
    MemoryFactor,
    /// An empty name.
    #[error("{0} must not be empty")]
    Empty(&'static str),
}

impl Settings {
    /// Checks every value; the first problem is returned.
    ///
    /// # Errors
    /// The first [`InvalidSetting`] found.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.insecure_http {
            if !self.listen.ip().is_loopback() {
                return Err(InvalidSetting::InsecureNotLoopback(self.listen));
            }
        } else if self.tls_cert.is_none() || self.tls_key.is_none() {
            return Err(InvalidSetting::MissingTls);
        }
        if self.default_cores > 100 {
            return Err(InvalidSetting::Cores(self.default_cores));
        }
        if self.memory_factor == 0 {
            return Err(InvalidSetting::MemoryFactor);
        }
        if self.scheduler_name.is_empty() {
            return Err(InvalidSetting::Empty("schedulerName"));
        }
        if self.resources.all().iter().any(|n| n.is_empty()) {
            return Err(InvalidSetting::Empty("resource names"));
        }
        Ok(())
    }
}

/// Command-line flags of `serve`; each overrides the config key of the same
/// name (camelCase) when given.
#[derive(Debug, Default, clap::Args, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeFlags {
    /// How slices are allocated: device-plugin (the extender and HAMi's
    /// annotations) or dra (ResourceClaimTemplates, kube-scheduler's
    /// DynamicResources plugin allocates) [default: device-plugin].
    #[arg(long, value_parser = named_parser::<Mode>())]
    #[serde(with = "by_name::option")]
    pub mode: Option<Mode>,
    /// Kubeconfig file [default: in-cluster configuration].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the webhook and extender server, host:port or :port [default: 0.0.0.0:443].
    #[arg(long, value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain for TLS; re-read when it changes.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS; re-read when it changes.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP (loopback addresses only, for testing).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure_http: bool,
    /// Address of the /metrics server, host:port or :port [default: :9395].
    #[arg(long, value_parser = parse_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// Scheduler name GPU pods are routed to [default: gpuslice-scheduler].
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// Default node policy [default: binpack].
    #[arg(long, value_parser = named_parser::<Policy>())]
    #[serde(with = "by_name::option")]
    pub node_scheduler_policy: Option<Policy>,
    /// Default GPU policy for the GPUs of the chosen node: binpack, spread,
    /// numa, mutex, topology-aware, or a comma list such as
    /// mutex,binpack,numa [default: spread].
    #[arg(long, value_parser = parse_gpu_policy)]
    #[serde(with = "gpu_policy_text::option")]
    pub gpu_scheduler_policy: Option<GpuPolicy>,
    /// MiB per GPU when a container asks for no memory; 0 = whole card [default: 0].
    #[arg(long)]
    pub default_memory: Option<u32>,
    /// Cores (percent) when a container asks for none [default: 0].
    #[arg(long)]
    pub default_cores: Option<u32>,
    /// GPUs added when a container asks only for gpumem/gpucores [default: 1].
    #[arg(long = "default-gpu-num")]
    #[serde(rename = "defaultGPUNum")]
    pub default_gpu_num: Option<u32>,
    /// Multiplier applied to gpumem requests [default: 1].
    #[arg(long)]
    pub memory_factor: Option<u32>,
    /// Resource name for the GPU count [default: nvidia.com/gpu].
    #[arg(long)]
    pub resource_name: Option<String>,
    /// Resource name for MiB per GPU [default: nvidia.com/gpumem].
    #[arg(long)]
    pub resource_mem: Option<String>,
    /// Resource name for the memory percentage [default: nvidia.com/gpumem-percentage].
    #[arg(long)]
    pub resource_mem_percentage: Option<String>,
    /// Resource name for cores [default: nvidia.com/gpucores].
    #[arg(long)]
    pub resource_cores: Option<String>,
    /// Resource name for task priority [default: nvidia.com/priority].
    #[arg(long)]
    pub resource_priority: Option<String>,
    /// `--log-format`, `--log-json`.
    #[command(flatten)]
    #[serde(flatten)]
    pub log: LogFlags,
    /// Namespace of kube-scheduler's Lease [default: kube-system].
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// Identity matched against the Lease holder [default: $HOSTNAME].
    #[arg(long)]
    pub identity: Option<String>,
}

/// Why `serve` cannot start with the given configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The layers do not merge into settings.
    #[error(transparent)]
    Layers(#[from] gpuslice_config::SettingsError),
    /// A value is not acceptable.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// Loads the layered settings (see [`gpuslice_config::load`]) and validates them.
///
/// # Errors
/// A [`ConfigError`] with a one-line reason.
pub fn load(file: Option<&std::path::Path>, flags: &ServeFlags) -> Result<Settings, ConfigError> {
    let settings: Settings = gpuslice_config::load(file, flags)?;
    settings.validate()?;
    Ok(settings)
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use gpuslice_config::{FileFormat, FileLayer, layered};

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn secure() -> Settings {
        Settings {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("k.pem".into()),
            ..Settings::default()
        }
    }

    fn yaml(text: &str) -> FileLayer<'_> {
        FileLayer {
            origin: "c.yaml",
            text,
            format: FileFormat::Yaml,
        }
    }

    /// `serve`'s flags as the command line gives them.
    fn flags(args: &[&str]) -> Result<ServeFlags, clap::Error> {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: ServeFlags,
        }
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map(|c| c.flags)
    }

    #[test]
    fn every_flag_names_an_existing_key() {
        let flags = ServeFlags {
            mode: Some(Mode::Dra),
            kubeconfig: Some("k".into()),
            listen: Some("127.0.0.1:8443".parse().unwrap()),
            tls_cert: Some("c".into()),
            tls_key: Some("k".into()),
            insecure_http: true,
            metrics_listen: Some("0.0.0.0:1".parse().unwrap()),
            scheduler_name: Some("s".into()),
            node_scheduler_policy: Some(Policy::Spread),
            gpu_scheduler_policy: Some(GpuPolicy::BINPACK),
            default_memory: Some(1),
            default_cores: Some(2),
            default_gpu_num: Some(3),
            memory_factor: Some(4),
            resource_name: Some("a/gpu".into()),
            resource_mem: Some("a/mem".into()),
            resource_mem_percentage: Some("a/pct".into()),
            resource_cores: Some("a/cores".into()),
            resource_priority: Some("a/prio".into()),
            log: LogFlags {
                log_format: Some(LogFormat::Human),
                log_json: true,
            },
            lease_namespace: Some("gpuslice".into()),
            identity: Some("sched-0".into()),
        };
        let s: Settings = layered(None, &no_env, &flags).unwrap();
        let keys = gpuslice_config::keys::<Settings>().unwrap();
        let flag_json = serde_json::to_value(&flags).unwrap();
        for key in flag_json.as_object().unwrap().keys() {
            assert!(keys.contains(key), "flag {key} has no config key");
        }
        assert_eq!(s.default_gpu_num, 3);
        assert_eq!(s.mode, Mode::Dra);
        assert_eq!(s.resources.resource_cores, "a/cores");
        assert!(s.insecure_http);
        assert_eq!(s.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(s.node_scheduler_policy, Policy::Spread);
        assert_eq!(s.gpu_scheduler_policy, GpuPolicy::BINPACK);
        assert_eq!(s.log_format, LogFormat::Json, "--log-json wins");
    }

    #[test]
    fn hami_value_names_are_accepted_in_the_file() {
        let file = yaml("defaultGPUNum: 2\nresourceMem: x/mem\ndefaultCores: 30\n");
        let s: Settings = layered(Some(file), &no_env, &ServeFlags::default()).unwrap();
        assert_eq!(s.default_gpu_num, 2);
        assert_eq!(s.resources.resource_mem, "x/mem");
        assert_eq!(s.default_cores, 30);
    }

    #[test]
    fn printed_settings_read_back_as_the_same_settings() {
        let s = Settings {
            node_scheduler_policy: Policy::Fgd,
            gpu_scheduler_policy: GpuPolicy::parse_exact("mutex,binpack,numa").unwrap(),
            listen: "[::1]:8443".parse().unwrap(),
            log_format: LogFormat::Json,
            ..secure()
        };
        let printed = serde_json::to_string_pretty(&s).unwrap();
        assert!(
            printed.contains(r#""nodeSchedulerPolicy": "fgd""#),
            "{printed}"
        );
        assert!(
            printed.contains(r#""gpuSchedulerPolicy": "mutex,binpack,numa""#),
            "{printed}"
        );
        let back: Settings =
            layered(Some(yaml(&printed)), &no_env, &ServeFlags::default()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn defaults_need_tls_files() {
        assert_eq!(
            Settings::default().validate(),
            Err(InvalidSetting::MissingTls)
        );
        assert_eq!(secure().validate(), Ok(()));
    }

    #[test]
    fn insecure_http_only_on_loopback() {
        let s = Settings {
            insecure_http: true,
            listen: "127.0.0.1:8080".parse().unwrap(),
            ..Settings::default()
        };
        assert_eq!(s.validate(), Ok(()));
        let s = Settings {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..s
        };
        assert!(matches!(
            s.validate(),
            Err(InvalidSetting::InsecureNotLoopback(_))
        ));
    }

    #[test]
    fn bad_values_are_named() {
        let cases: Vec<(Settings, &str)> = vec![
            (
                Settings {
                    default_cores: 140,
                    ..secure()
                },
                "defaultCores must be 0–100, got 140",
            ),
            (
                Settings {
                    memory_factor: 0,
                    ..secure()
                },
                "memoryFactor",
            ),
            (
                Settings {
                    scheduler_name: String::new(),
                    ..secure()
                },
                "schedulerName must not be empty",
            ),
        ];
        for (settings, expected) in cases {
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should contain {expected}");
        }
    }

    #[test]
    fn a_bad_policy_name_is_refused_in_the_file_the_environment_and_the_flags() {
        let err = layered::<Settings, _>(
            Some(yaml("nodeSchedulerPolicy: packed\n")),
            &no_env,
            &ServeFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "nodeSchedulerPolicy from config file c.yaml: unknown policy `packed` \
             (one of: binpack, spread, fgd, bestfit, random, fgdpack)"
        );

        let env =
            |k: &str| (k == "GPUSLICE_GPU_SCHEDULER_POLICY").then(|| "binpack,nmua".to_owned());
        let err = layered::<Settings, _>(None, &env, &ServeFlags::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "gpuSchedulerPolicy from environment variable GPUSLICE_GPU_SCHEDULER_POLICY: \
             unknown GPU scheduling policy \"nmua\" \
             (binpack, spread, numa, mutex, topology-aware, or a comma list of them)"
        );

        let err = flags(&["--node-scheduler-policy", "packed"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid value 'packed'"), "{err}");
        assert!(
            err.contains("possible values: binpack, spread, fgd, bestfit, random, fgdpack"),
            "{err}"
        );
        let err = flags(&["--gpu-scheduler-policy", "fgd"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("binpack, spread, numa, mutex, topology-aware"),
            "{err}"
        );
    }

    #[test]
    fn the_gpu_policy_takes_every_hami_name_and_chain() {
        // HAMi's `--gpu-scheduler-policy` validation table
        // (cmd/scheduler/main_test.go `TestValidateSchedulerPolicyFlags`).
        for value in [
            "spread",
            "binpack",
            "binpack,numa",
            "mutex",
            "topology-aware",
            "numa",
        ] {
            let want = GpuPolicy::parse_exact(value).unwrap();
            let text = format!("gpuSchedulerPolicy: \"{value}\"\n");
            let s: Settings = layered(Some(yaml(&text)), &no_env, &ServeFlags::default()).unwrap();
            assert_eq!(s.gpu_scheduler_policy, want, "{value}");
            let f = flags(&["--gpu-scheduler-policy", value]).unwrap();
            assert_eq!(f.gpu_scheduler_policy, Some(want), "{value}");
        }
        for value in ["Binpack", "binpak", "binpack,nmua", ""] {
            assert!(
                flags(&["--gpu-scheduler-policy", value]).is_err(),
                "{value:?}"
            );
        }
    }

    #[test]
    fn settings_take_exact_policy_names_only() {
        // Annotations read other spellings and comma chains; settings do not.
        for (key, value) in [
            ("nodeSchedulerPolicy", "BinPack"),
            ("nodeSchedulerPolicy", "best-fit"),
            ("gpuSchedulerPolicy", "Spread"),
        ] {
            let text = format!("{key}: {value}\n");
            let err = layered::<Settings, _>(Some(yaml(&text)), &no_env, &ServeFlags::default())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("unknown policy `{value}`"))
                    || err.contains(&format!("unknown GPU scheduling policy {value:?}")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_bad_address_is_refused_in_the_file_the_environment_and_the_flags() {
        let err = layered::<Settings, _>(
            Some(yaml("listen: nowhere\n")),
            &no_env,
            &ServeFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "listen from config file c.yaml: `nowhere` is not an address like 0.0.0.0:443 or :443"
        );

        let env = |k: &str| (k == "GPUSLICE_METRICS_LISTEN").then(|| "9395".to_owned());
        let err = layered::<Settings, _>(None, &env, &ServeFlags::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "metricsListen from environment variable GPUSLICE_METRICS_LISTEN: \
             `9395` is not an address like 0.0.0.0:443 or :443"
        );

        let err = flags(&["--listen", "localhost"]).unwrap_err().to_string();
        assert!(
            err.contains("`localhost` is not an address like 0.0.0.0:443 or :443"),
            "{err}"
        );
    }

    #[test]
    fn every_node_policy_of_the_core_is_accepted_including_fgd() {
        for policy in Policy::ALL {
            let text = format!("nodeSchedulerPolicy: {policy}\n");
            let s: Settings = layered(Some(yaml(&text)), &no_env, &ServeFlags::default()).unwrap();
            assert_eq!(s.node_scheduler_policy, policy);
            let flags = flags(&["--node-scheduler-policy", policy.as_str()]).unwrap();
            assert_eq!(flags.node_scheduler_policy, Some(policy));
        }
        // From the file, the environment and the flag alike.
        let s: Settings = layered(
            Some(yaml("nodeSchedulerPolicy: fgd\n")),
            &no_env,
            &ServeFlags::default(),
        )
        .unwrap();
        assert_eq!(s.node_scheduler_policy, Policy::Fgd);
        let env = |k: &str| (k == "GPUSLICE_NODE_SCHEDULER_POLICY").then(|| "fgd".to_owned());
        let s: Settings = layered(None, &env, &ServeFlags::default()).unwrap();
        assert_eq!(s.node_scheduler_policy, Policy::Fgd);
        let s: Settings = layered(
            None,
            &no_env,
            &flags(&["--node-scheduler-policy", "fgd"]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.node_scheduler_policy, Policy::Fgd);
        assert_eq!(
            crate::serve::model_config(&s).scheduler.node_policy,
            Policy::Fgd
        );
    }

    #[test]
    fn the_mode_is_read_from_the_file_the_environment_and_the_flag() {
        assert_eq!(Settings::default().mode, Mode::DevicePlugin);
        let s: Settings =
            layered(Some(yaml("mode: dra\n")), &no_env, &ServeFlags::default()).unwrap();
        assert_eq!(s.mode, Mode::Dra);
        let env = |k: &str| (k == "GPUSLICE_MODE").then(|| "dra".to_owned());
        let s: Settings = layered(None, &env, &ServeFlags::default()).unwrap();
        assert_eq!(s.mode, Mode::Dra);
        let s: Settings = layered(
            Some(yaml("mode: dra\n")),
            &no_env,
            &flags(&["--mode", "device-plugin"]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.mode, Mode::DevicePlugin, "the flag wins");
        let err =
            layered::<Settings, _>(Some(yaml("mode: DRA\n")), &no_env, &ServeFlags::default())
                .unwrap_err()
                .to_string();
        assert_eq!(
            err,
            "mode from config file c.yaml: unknown mode `DRA` (one of: device-plugin, dra)"
        );
        let err = flags(&["--mode", "hybrid"]).unwrap_err().to_string();
        assert!(err.contains("possible values: device-plugin, dra"), "{err}");
    }

    #[test]
    fn port_only_listen_means_all_interfaces() {
        let s: Settings = layered(
            Some(yaml("metricsListen: \":9395\"\n")),
            &no_env,
            &flags(&["--listen", ":8443"]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.metrics_listen, "0.0.0.0:9395".parse().unwrap());
        assert_eq!(s.listen, "0.0.0.0:8443".parse().unwrap());
    }

    #[test]
    fn log_json_is_accepted_as_log_format_json() {
        let s: Settings = layered(
            Some(yaml("logFormat: human\n")),
            &no_env,
            &flags(&["--log-json"]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
        let s: Settings =
            layered(None, &no_env, &flags(&["--log-format", "json"]).unwrap()).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
    }
}

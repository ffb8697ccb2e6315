//! The typed configuration of `scheduler-webhook serve`: keys, defaults,
//! command-line flags and validation.
//!
//! Layering (defaults < file < `GPUSLICE_…` env < flags) is
//! [`proto::settings::layered`]; this module owns what the keys are and what
//! makes a value valid.

use std::net::SocketAddr;
use std::path::PathBuf;

use proto::hami::resources::ResourceNames;
use serde::{Deserialize, Serialize};
use telemetry::LogFormat;

use crate::core::kinds::{GpuPolicy, Policy};

/// Every setting of `scheduler-webhook serve`, after layering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// Kubeconfig file; in-cluster configuration when unset.
    pub kubeconfig: Option<PathBuf>,
    /// Address of the webhook and extender server.
    pub listen: String,
    /// PEM certificate chain for TLS (re-read when it changes).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (re-read when it changes).
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP; only allowed on a loopback address.
    pub insecure_http: bool,
    /// Address of the Prometheus `/metrics` server (`:9395` means all interfaces).
    pub metrics_listen: String,
    /// The scheduler name GPU pods are routed to.
    pub scheduler_name: String,
    /// Extended resource names.
    #[serde(flatten)]
    pub resources: ResourceNames,
    /// Default node policy: one of [`Policy::ALL`] by name (`fgd` places
    /// for the live workload, see [`crate::cache::fragmentation`]).
    pub node_scheduler_policy: String,
    /// Default GPU policy: one of [`GpuPolicy::ALL`] by name.
    pub gpu_scheduler_policy: String,
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
            kubeconfig: None,
            listen: "0.0.0.0:443".to_owned(),
            tls_cert: None,
            tls_key: None,
            insecure_http: false,
            metrics_listen: ":9395".to_owned(),
            scheduler_name: "gpuslice-scheduler".to_owned(),
            resources: ResourceNames::default(),
            node_scheduler_policy: "binpack".to_owned(),
            gpu_scheduler_policy: "spread".to_owned(),
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
    /// An address does not parse.
    #[error("{key}: `{value}` is not an address like 0.0.0.0:443 or :443")]
    Address {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
    },
    /// Plain HTTP on a non-loopback address.
    #[error("insecureHttp is for loopback testing only, but listen is {0}")]
    InsecureNotLoopback(SocketAddr),
    /// TLS asked for without both files.
    #[error("tlsCert and tlsKey are both required unless insecureHttp is set")]
    MissingTls,
    /// A policy name we do not have.
    #[error("{key}: unknown policy `{value}` (one of: {choices})")]
    Policy {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
        /// Accepted values.
        choices: String,
    },
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

/// Parses `host:port` or `:port` (all interfaces).
///
/// # Errors
/// [`InvalidSetting::Address`] naming `key`.
pub fn parse_listen(key: &'static str, value: &str) -> Result<SocketAddr, InvalidSetting> {
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse().map_err(|_| InvalidSetting::Address {
        key,
        value: value.to_owned(),
    })
}

impl Settings {
    /// Checks every value; the first problem is returned.
    ///
    /// # Errors
    /// The first [`InvalidSetting`] found.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let listen = parse_listen("listen", &self.listen)?;
        parse_listen("metricsListen", &self.metrics_listen)?;
        if self.insecure_http {
            if !listen.ip().is_loopback() {
                return Err(InvalidSetting::InsecureNotLoopback(listen));
            }
        } else if self.tls_cert.is_none() || self.tls_key.is_none() {
            return Err(InvalidSetting::MissingTls);
        }
        // Exact names only (the annotations also take other spellings).
        let policy_error = |key, value: &String, choices| InvalidSetting::Policy {
            key,
            value: value.clone(),
            choices,
        };
        if !Policy::ALL
            .iter()
            .any(|p| p.as_str() == self.node_scheduler_policy)
        {
            return Err(policy_error(
                "nodeSchedulerPolicy",
                &self.node_scheduler_policy,
                Policy::choices(),
            ));
        }
        if !GpuPolicy::ALL
            .iter()
            .any(|p| p.as_str() == self.gpu_scheduler_policy)
        {
            return Err(policy_error(
                "gpuSchedulerPolicy",
                &self.gpu_scheduler_policy,
                GpuPolicy::choices(),
            ));
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
    /// Kubeconfig file [default: in-cluster configuration].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the webhook and extender server [default: 0.0.0.0:443].
    #[arg(long)]
    pub listen: Option<String>,
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
    /// Address of the /metrics server [default: :9395].
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Scheduler name GPU pods are routed to [default: gpuslice-scheduler].
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// Default node policy: binpack, spread, fgd, bestfit, random [default: binpack].
    #[arg(long)]
    pub node_scheduler_policy: Option<String>,
    /// Default GPU policy: binpack, spread [default: spread].
    #[arg(long)]
    pub gpu_scheduler_policy: Option<String>,
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
    /// Log output: human or json [default: human].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Same as --log-format=json (the node-daemon's older flag, accepted by both).
    #[arg(long)]
    #[serde(skip)]
    pub log_json: bool,
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
    Layers(#[from] proto::settings::SettingsError),
    /// A value is not acceptable.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// Loads the layered settings (see [`proto::settings::load`]) and validates them.
///
/// # Errors
/// A [`ConfigError`] with a one-line reason.
pub fn load(file: Option<&std::path::Path>, flags: &ServeFlags) -> Result<Settings, ConfigError> {
    let mut settings: Settings = proto::settings::load(file, flags)?;
    if flags.log_json {
        settings.log_format = LogFormat::Json;
    }
    settings.validate()?;
    Ok(settings)
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use proto::settings::{FileFormat, FileLayer, layered};

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

    #[test]
    fn every_flag_names_an_existing_key() {
        let flags = ServeFlags {
            kubeconfig: Some("k".into()),
            listen: Some("127.0.0.1:8443".into()),
            tls_cert: Some("c".into()),
            tls_key: Some("k".into()),
            insecure_http: true,
            metrics_listen: Some(":1".into()),
            scheduler_name: Some("s".into()),
            node_scheduler_policy: Some("spread".into()),
            gpu_scheduler_policy: Some("binpack".into()),
            default_memory: Some(1),
            default_cores: Some(2),
            default_gpu_num: Some(3),
            memory_factor: Some(4),
            resource_name: Some("a/gpu".into()),
            resource_mem: Some("a/mem".into()),
            resource_mem_percentage: Some("a/pct".into()),
            resource_cores: Some("a/cores".into()),
            resource_priority: Some("a/prio".into()),
            log_format: Some(LogFormat::Json),
            log_json: true,
            lease_namespace: Some("gpuslice".into()),
            identity: Some("sched-0".into()),
        };
        let s: Settings = layered(None, &no_env, &flags).unwrap();
        let keys = proto::settings::keys::<Settings>().unwrap();
        let flag_json = serde_json::to_value(&flags).unwrap();
        for key in flag_json.as_object().unwrap().keys() {
            assert!(keys.contains(key), "flag {key} has no config key");
        }
        assert_eq!(s.default_gpu_num, 3);
        assert_eq!(s.resources.resource_cores, "a/cores");
        assert!(s.insecure_http);
    }

    #[test]
    fn hami_value_names_are_accepted_in_the_file() {
        let file = FileLayer {
            origin: "c.yaml",
            text: "defaultGPUNum: 2\nresourceMem: x/mem\ndefaultCores: 30\n",
            format: FileFormat::Yaml,
        };
        let s: Settings = layered(Some(file), &no_env, &ServeFlags::default()).unwrap();
        assert_eq!(s.default_gpu_num, 2);
        assert_eq!(s.resources.resource_mem, "x/mem");
        assert_eq!(s.default_cores, 30);
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
            listen: "127.0.0.1:8080".into(),
            ..Settings::default()
        };
        assert_eq!(s.validate(), Ok(()));
        let s = Settings {
            listen: "0.0.0.0:8080".into(),
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
                    listen: "nowhere".into(),
                    ..secure()
                },
                "listen: `nowhere`",
            ),
            (
                Settings {
                    node_scheduler_policy: "packed".into(),
                    ..secure()
                },
                "nodeSchedulerPolicy: unknown policy `packed`",
            ),
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
        ];
        for (settings, expected) in cases {
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should contain {expected}");
        }
    }

    #[test]
    fn every_node_policy_of_the_core_is_accepted_including_fgd() {
        for policy in crate::core::policy::Policy::ALL {
            let s = Settings {
                node_scheduler_policy: policy.as_str().to_owned(),
                ..secure()
            };
            assert_eq!(s.validate(), Ok(()), "{policy}");
        }
        // From the file, the environment and the flag alike.
        let file = FileLayer {
            origin: "c.yaml",
            text: "nodeSchedulerPolicy: fgd\n",
            format: FileFormat::Yaml,
        };
        let s: Settings = layered(Some(file), &no_env, &ServeFlags::default()).unwrap();
        assert_eq!(s.node_scheduler_policy, "fgd");
        let env = |k: &str| (k == "GPUSLICE_NODE_SCHEDULER_POLICY").then(|| "fgd".to_owned());
        let s: Settings = layered(None, &env, &ServeFlags::default()).unwrap();
        assert_eq!(s.node_scheduler_policy, "fgd");
        let flags = ServeFlags {
            node_scheduler_policy: Some("fgd".into()),
            ..ServeFlags::default()
        };
        let s: Settings = layered(None, &no_env, &flags).unwrap();
        assert_eq!(s.node_scheduler_policy, "fgd");
        assert_eq!(
            crate::serve::model_config(&s)
                .unwrap()
                .scheduler
                .node_policy,
            crate::core::policy::Policy::Fgd
        );
    }

    #[test]
    fn port_only_listen_means_all_interfaces() {
        assert_eq!(
            parse_listen("metricsListen", ":9395").unwrap(),
            "0.0.0.0:9395".parse().unwrap()
        );
    }
}

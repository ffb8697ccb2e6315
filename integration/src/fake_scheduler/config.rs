//! Configuration of the fake kube-scheduler: the extender entry with the
//! JSON keys of `KubeSchedulerConfiguration` (`kubescheduler.config.k8s.io/v1`),
//! the leader-election settings and the queue's backoff.
//!
//! Owns parsing (YAML or JSON; a whole `KubeSchedulerConfiguration` or a
//! bare extender entry), defaulting and validation. Pure: no I/O except
//! [`SchedulerFile::load`].

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// kube-scheduler's `DefaultExtenderTimeout` when `httpTimeout` is unset.
pub const DEFAULT_EXTENDER_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of reading or validating a scheduler configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is neither YAML nor JSON.
    #[error("cannot parse scheduler configuration: {0}")]
    Parse(String),
    /// A field has the wrong shape.
    #[error("invalid scheduler configuration: {0}")]
    Invalid(String),
    /// A duration string such as `httpTimeout` is malformed.
    #[error("invalid duration {0:?} (expected Go syntax such as \"30s\", \"1m30s\", \"500ms\")")]
    Duration(String),
    /// More than one extender is configured.
    #[error("the fake scheduler supports exactly one extender, found {0}")]
    ExtenderCount(usize),
}

/// `tlsConfig` of an extender entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Accept any server certificate.
    #[serde(default)]
    pub insecure: bool,
    /// Server name to verify instead of the URL host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Client certificate file (not supported by the fake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Client key file (not supported by the fake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// CA bundle file (PEM) to verify the extender with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate, base64 PEM (not supported by the fake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_data: Option<String>,
    /// Client key, base64 PEM (not supported by the fake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_data: Option<String>,
    /// CA bundle as PEM text (Go's `[]byte` is base64 in JSON; both the
    /// base64 and the raw PEM form are accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_data: Option<String>,
}

/// One `managedResources` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedResource {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    pub name: String,
    /// NodeResourcesFit skips this resource.
    #[serde(default)]
    pub ignored_by_scheduler: bool,
}

/// One entry of `KubeSchedulerConfiguration.extenders`, same JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtenderConfig {
    /// `http(s)://host:port[/prefix]`.
    pub url_prefix: String,
    /// Filter verb (path segment); empty disables filtering.
    #[serde(default)]
    pub filter_verb: String,
    /// Preempt verb (not called by the fake).
    #[serde(default)]
    pub preempt_verb: String,
    /// Prioritize verb (not called by the fake).
    #[serde(default)]
    pub prioritize_verb: String,
    /// Prioritize weight (unused by the fake).
    #[serde(default)]
    pub weight: i64,
    /// Bind verb; when set the extender owns binding of the pods it is
    /// interested in.
    #[serde(default)]
    pub bind_verb: String,
    /// Use TLS; without a CA this implies `insecure`, as in kube-scheduler.
    #[serde(default, rename = "enableHTTPS")]
    pub enable_https: bool,
    /// TLS client settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<TlsConfig>,
    /// Go duration string (`"30s"`); default 5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_timeout: Option<String>,
    /// Send `NodeNames` only instead of whole `Nodes`.
    #[serde(default)]
    pub node_cache_capable: bool,
    /// Only pods requesting one of these reach the extender (all pods
    /// when empty, as in kube-scheduler).
    #[serde(default)]
    pub managed_resources: Vec<ManagedResource>,
    /// Failures of an ignorable extender are skipped.
    #[serde(default)]
    pub ignorable: bool,
}

impl ExtenderConfig {
    /// An extender at `url_prefix` with HAMi's verbs (`filter`, `bind`),
    /// `nodeCacheCapable`, 30 s timeout and the given ignored resources.
    pub fn hami(url_prefix: &str, managed: &[&str]) -> Self {
        Self {
            url_prefix: url_prefix.to_string(),
            filter_verb: "filter".into(),
            preempt_verb: String::new(),
            prioritize_verb: String::new(),
            weight: 1,
            bind_verb: "bind".into(),
            enable_https: url_prefix.starts_with("https://"),
            tls_config: Some(TlsConfig {
                insecure: true,
                ..TlsConfig::default()
            }),
            http_timeout: Some("30s".into()),
            node_cache_capable: true,
            managed_resources: managed
                .iter()
                .map(|name| ManagedResource {
                    name: (*name).to_string(),
                    ignored_by_scheduler: true,
                })
                .collect(),
            ignorable: false,
        }
    }

    /// The effective HTTP timeout.
    pub fn timeout(&self) -> Result<Duration, ConfigError> {
        match self.http_timeout.as_deref() {
            None | Some("") => Ok(DEFAULT_EXTENDER_TIMEOUT),
            Some(text) => match parse_go_duration(text)? {
                d if d.is_zero() => Ok(DEFAULT_EXTENDER_TIMEOUT),
                d => Ok(d),
            },
        }
    }

    /// Names of all managed resources.
    pub fn managed_names(&self) -> BTreeSet<String> {
        self.managed_resources
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// Names NodeResourcesFit must skip.
    pub fn ignored_names(&self) -> BTreeSet<String> {
        self.managed_resources
            .iter()
            .filter(|r| r.ignored_by_scheduler)
            .map(|r| r.name.clone())
            .collect()
    }

    /// Checks the fields the fake relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url_prefix.as_str();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "urlPrefix {url:?} must start with http:// or https://"
            )));
        }
        if url.parse::<http::Uri>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "urlPrefix {url:?} is not a URL"
            )));
        }
        if self.weight < 0 {
            return Err(ConfigError::Invalid("weight must not be negative".into()));
        }
        self.timeout()?;
        if let Some(tls) = &self.tls_config {
            let client_cert = [&tls.cert_file, &tls.key_file, &tls.cert_data, &tls.key_data];
            if client_cert.iter().any(|f| f.is_some()) {
                return Err(ConfigError::Invalid(
                    "tlsConfig client certificates are not supported by the fake scheduler".into(),
                ));
            }
        }
        Ok(())
    }

    /// Whether TLS verification is skipped (`tlsConfig.insecure`, or
    /// `enableHTTPS` without a CA, as kube-scheduler's `makeTransport`).
    pub fn insecure(&self) -> bool {
        let tls = self.tls_config.clone().unwrap_or_default();
        let has_ca = tls.ca_file.is_some() || tls.ca_data.is_some();
        tls.insecure || (self.enable_https && !has_ca)
    }
}

/// `leaderElection` settings (kube-scheduler defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Lease name (`resourceName`, default the scheduler name).
    pub lease_name: String,
    /// Lease namespace (`resourceNamespace`, default `kube-system`).
    pub namespace: String,
    /// `<hostname>_<uuid>`.
    pub identity: String,
    /// `leaseDuration`, 15 s.
    pub lease_duration: Duration,
    /// `renewDeadline`, 10 s.
    pub renew_deadline: Duration,
    /// `retryPeriod`, 2 s.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// kube-scheduler's defaults for a Lease named `lease_name` in
    /// `kube-system`, with a fresh `<hostname>_<uuid>` identity.
    pub fn for_lease(lease_name: &str) -> Self {
        Self {
            lease_name: lease_name.to_string(),
            namespace: "kube-system".into(),
            identity: identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// `<hostname>_<uuid>`, as kube-scheduler's leader election identity.
pub fn identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// Backoff of failed pods: `initial` doubling per attempt up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// `podInitialBackoffSeconds`, 1 s.
    pub initial: Duration,
    /// `podMaxBackoffSeconds`, 10 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The wait after the `attempts`-th failure (1-based).
    pub fn after(&self, attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Everything a [`super::FakeScheduler`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Pods with this `spec.schedulerName` are scheduled.
    pub scheduler_name: String,
    /// The extender, if any.
    pub extender: Option<ExtenderConfig>,
    /// Leader election; `None` schedules without a Lease.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Pod backoff.
    pub backoff: Backoff,
    /// Unschedulable pods are retried at the latest after this long
    /// without a cluster event (`podMaxInUnschedulablePodsDuration`, 5 min).
    pub unschedulable_flush: Duration,
}

impl SchedulerConfig {
    /// Scheduler `name` with `extender`, leader election on a Lease named
    /// after the scheduler in `kube-system`, and kube-scheduler's queue
    /// defaults.
    pub fn new(name: &str, extender: Option<ExtenderConfig>) -> Self {
        Self {
            scheduler_name: name.to_string(),
            extender,
            leader_election: Some(LeaderElectionConfig::for_lease(name)),
            backoff: Backoff::default(),
            unschedulable_flush: Duration::from_secs(300),
        }
    }

    /// Checks the extender and names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.scheduler_name.is_empty() {
            return Err(ConfigError::Invalid("scheduler name is empty".into()));
        }
        if let Some(extender) = &self.extender {
            extender.validate()?;
        }
        if let Some(le) = &self.leader_election {
            if le.lease_name.is_empty() || le.namespace.is_empty() || le.identity.is_empty() {
                return Err(ConfigError::Invalid(
                    "leader election needs a lease name, namespace and identity".into(),
                ));
            }
            if le.retry_period.is_zero() || le.lease_duration <= le.renew_deadline {
                return Err(ConfigError::Invalid(
                    "leaseDuration must exceed renewDeadline, retryPeriod must be positive".into(),
                ));
            }
        }
        Ok(())
    }
}

/// What a configuration file says: the extender, and from a whole
/// `KubeSchedulerConfiguration` also the profile's scheduler name and the
/// leader-election Lease.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchedulerFile {
    /// `extenders[0]` (or the bare entry).
    pub extender: Option<ExtenderConfig>,
    /// `profiles[0].schedulerName`.
    pub scheduler_name: Option<String>,
    /// `leaderElection.resourceName`.
    pub lease_name: Option<String>,
    /// `leaderElection.resourceNamespace`.
    pub lease_namespace: Option<String>,
    /// `leaderElection.leaderElect` (`false` disables the Lease).
    pub leader_elect: Option<bool>,
}

impl SchedulerFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses YAML or JSON: a `KubeSchedulerConfiguration` (recognised by
    /// `kind` or an `extenders` key) or one extender entry.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(_) => {
                serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
            }
        };
        if !value.is_object() {
            return Err(ConfigError::Parse("the document is not a mapping".into()));
        }
        let whole = value.get("kind").and_then(Value::as_str) == Some("KubeSchedulerConfiguration")
            || value.get("extenders").is_some();
        if !whole {
            let extender: ExtenderConfig =
                serde_json::from_value(value).map_err(|e| ConfigError::Invalid(e.to_string()))?;
            extender.validate()?;
            return Ok(Self {
                extender: Some(extender),
                ..Self::default()
            });
        }
        let extenders: Vec<ExtenderConfig> = match value.get("extenders") {
            None | Some(Value::Null) => Vec::new(),
            Some(list) => serde_json::from_value(list.clone())
                .map_err(|e| ConfigError::Invalid(format!("extenders: {e}")))?,
        };
        if extenders.len() > 1 {
            return Err(ConfigError::ExtenderCount(extenders.len()));
        }
        let extender = extenders.into_iter().next();
        if let Some(e) = &extender {
            e.validate()?;
        }
        let text_at = |path: &[&str]| -> Option<String> {
            let mut v = &value;
            for key in path {
                v = v.get(*key)?;
            }
            v.as_str().map(str::to_string)
        };
        let scheduler_name = value
            .get("profiles")
            .and_then(Value::as_array)
            .and_then(|p| p.first())
            .and_then(|p| p.get("schedulerName"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Self {
            extender,
            scheduler_name,
            lease_name: text_at(&["leaderElection", "resourceName"]),
            lease_namespace: text_at(&["leaderElection", "resourceNamespace"]),
            leader_elect: value
                .get("leaderElection")
                .and_then(|l| l.get("leaderElect"))
                .and_then(Value::as_bool),
        })
    }
}

/// Parses a Go `time.Duration` string (`"30s"`, `"1m30s"`, `"1.5s"`,
/// `"500ms"`, `"0"`).
pub fn parse_go_duration(text: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Duration(text.to_string());
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(bad());
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total_nanos: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_len == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total_nanos += number * scale;
    }
    if !total_nanos.is_finite() || total_nanos > 1e18 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_go_duration("1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "30", "s", "-1s", "3x", "1..2s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff::default();
        let waits: Vec<u64> = (1..=6).map(|n| b.after(n).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(b.after(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn whole_kube_scheduler_configuration_in_yaml() {
        let text = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: hami-scheduler
  resourceNamespace: kube-system
profiles:
- schedulerName: hami-scheduler
extenders:
- urlPrefix: "https://127.0.0.1:443"
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  weight: 1
  httpTimeout: 30s
  enableHTTPS: true
  tlsConfig:
    insecure: true
  managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: true
  - name: nvidia.com/gpumem
    ignoredByScheduler: true
"#;
        let file = SchedulerFile::parse(text).unwrap();
        let e = file.extender.unwrap();
        assert_eq!(e.url_prefix, "https://127.0.0.1:443");
        assert_eq!(e.timeout().unwrap(), Duration::from_secs(30));
        assert!(e.insecure());
        assert!(e.node_cache_capable);
        assert_eq!(e.ignored_names().len(), 2);
        assert_eq!(file.scheduler_name.as_deref(), Some("hami-scheduler"));
        assert_eq!(file.lease_name.as_deref(), Some("hami-scheduler"));
        assert_eq!(file.leader_elect, Some(true));
    }

    #[test]
    fn bare_extender_entry_in_json_with_defaults() {
        let file = SchedulerFile::parse(
            r#"{"urlPrefix":"http://127.0.0.1:80","filterVerb":"filter","managedResources":[{"name":"x/y"}]}"#,
        )
        .unwrap();
        let e = file.extender.unwrap();
        assert_eq!(e.timeout().unwrap(), DEFAULT_EXTENDER_TIMEOUT);
        assert!(!e.insecure());
        assert!(e.ignored_names().is_empty());
        assert_eq!(e.managed_names().len(), 1);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(SchedulerFile::parse("urlPrefix: ftp://x").is_err());
        assert!(SchedulerFile::parse("urlPrefix: http://x\nhttpTimeout: soon").is_err());
        assert!(SchedulerFile::parse("- a\n- b").is_err());
        let two = r#"{"extenders":[{"urlPrefix":"http://a"},{"urlPrefix":"http://b"}]}"#;
        assert!(matches!(
            SchedulerFile::parse(two),
            Err(ConfigError::ExtenderCount(2))
        ));
        let cert = r#"{"urlPrefix":"https://a","tlsConfig":{"certFile":"/c"}}"#;
        assert!(SchedulerFile::parse(cert).is_err());
    }

    #[test]
    fn enable_https_with_ca_verifies() {
        let mut e = ExtenderConfig::hami("https://a:443", &[]);
        e.tls_config = Some(TlsConfig {
            ca_data: Some("pem".into()),
            ..TlsConfig::default()
        });
        assert!(!e.insecure());
    }
}

//! `bench --only kube-scheduler`: how many pods per second the **real**
//! kube-scheduler binds on N nodes, on its own and with gpuslice's extender
//! in the loop, side by side in one process.
//!
//! Three runs, each on a fresh real control plane ([`crate::real`]; etcd,
//! kube-apiserver and kube-controller-manager with its node lifecycle
//! controller off, see [`Options::node_lifecycle`]):
//!
//! - [`Run::Baseline`]: whole-GPU pods (`nvidia.com/gpu: 1`), kube-scheduler's
//!   default profile, no extender: the in-tree NodeResourcesFit decides;
//! - [`Run::Binpack`] and [`Run::Fgd`]: slice pods (gpu + gpumem + gpucores)
//!   through the chart's profile: our webhook mutates them at creation,
//!   kube-scheduler calls our extender's `/filter` and `/bind` over HTTPS,
//!   with the `binpack` or `fgd` node policy.
//!
//! N Node objects are created through the API (no kubelet) with HAMi's
//! register annotation and `status.allocatable` (`nvidia.com/gpu`, cpu,
//! memory, pods), the `not-ready` taint the apiserver's admission puts on a
//! new Node lifted, before kube-scheduler starts, so its cache holds every node
//! once it takes its Lease. Then M pods are created as fast as the API
//! server accepts them (64 requests in flight), and a pod watch records when
//! each is bound: pods/s is M over the time from the first create to the
//! last bind seen. In the slice runs the same watch plays the device plugin
//! after each bind, as node-daemon's Allocate ends: the pod's
//! `vgpu-devices-to-allocate` entries are erased and `bind-phase=success`
//! written, then the node lock (`hami.io/mutex.lock`) is released through
//! node-daemon's own [`KubeCluster`] (only while it names that pod), so a
//! node is never left locked and the next bind on it proceeds.
//!
//! After the pods are bound, kube-scheduler's `/metrics` gives the p50/p99 of
//! its `scheduler_scheduling_attempt_duration_seconds` (all results and
//! profiles summed; its buckets start at 1 ms, so a sub-millisecond figure is
//! interpolated inside the first bucket) and the service's `/metrics` its
//! own `gpuslice_filter_duration_seconds`. Figures, not assertions: the
//! small test in `tests/real_control_plane.rs` checks only behaviour.
//!
//! Not here: the kubelet, node-daemon's Allocate itself (played as above),
//! and the in-tree scheduler's client rate limit, which is raised to
//! [`Config::scheduler_qps`] in every run (kube-scheduler's default of 50
//! requests/s would cap the baseline's own bindings, not the extender's).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use node_daemon::cluster::kube::KubeCluster;
use node_daemon::cluster::{AnnotationPatch, Cluster as _};
use proto::hami::bind::BindPhase;
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use proto::hami::pod_devices::PodDevices;
use serde_json::{Value, json};
use tracing::info;

use crate::cluster::{ClusterSpec, SCHEDULER_NAME, host_identity, start_scheduler_webhook};
use crate::harness::{HarnessError, wait_for_object};
use crate::prometheus::histogram;
use crate::real::binaries::Binaries;
use crate::real::control_plane::{ControlPlane, Options, SCHEDULER_ALWAYS_ALLOW, free_port};
use crate::real::install;

/// The namespace the measured pods are created in.
pub const NAMESPACE: &str = "default";
/// Creations in flight at once.
const CREATES_IN_FLIGHT: usize = 64;
/// Slices per GPU (HAMi's `deviceSplitCount`): the slice runs' nodes
/// advertise `gpus × SPLIT` of `nvidia.com/gpu`, as HAMi's device plugin does.
const SPLIT: u32 = 10;
/// Memory per GPU, MiB.
const GPU_MEMORY_MIB: u32 = 40960;
/// kube-scheduler's own histogram of one scheduling attempt.
pub const ATTEMPT_HISTOGRAM: &str = "scheduler_scheduling_attempt_duration_seconds";
/// The service's histogram of one `/filter` answer.
pub const FILTER_HISTOGRAM: &str = "gpuslice_filter_duration_seconds";

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Nodes (N).
    pub nodes: usize,
    /// Pods per run (M).
    pub pods: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// kube-scheduler's `clientConnection.qps` and `burst`, in every run.
    pub scheduler_qps: u32,
    /// How long a run may take to bind its pods before it fails.
    pub deadline: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nodes: 1000,
            pods: 1000,
            gpus_per_node: 8,
            scheduler_qps: 5000,
            deadline: Duration::from_secs(1800),
        }
    }
}

/// One of the three runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// (a) whole-GPU pods, default profile, no extender.
    Baseline,
    /// (b) slice pods through gpuslice's extender, `binpack`.
    Binpack,
    /// (c) slice pods through gpuslice's extender, `fgd`.
    Fgd,
}

impl Run {
    /// All three, in the order they run.
    pub const ALL: [Self; 3] = [Self::Baseline, Self::Binpack, Self::Fgd];

    /// The short name used in tables and JSON keys.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Binpack => "binpack",
            Self::Fgd => "fgd",
        }
    }

    /// What the run schedules, for the table.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Baseline => "(a) whole-GPU pods, default profile, no extender",
            Self::Binpack => "(b) slice pods, gpuslice extender, binpack",
            Self::Fgd => "(c) slice pods, gpuslice extender, fgd",
        }
    }

    /// The gpuslice node policy, `None` for the baseline.
    fn node_policy(self) -> Option<&'static str> {
        match self {
            Self::Baseline => None,
            Self::Binpack => Some("binpack"),
            Self::Fgd => Some("fgd"),
        }
    }
}

/// Why a run could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A component did not start or a step failed.
    #[error("{0}")]
    Setup(String),
    /// A Kubernetes call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A wait failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// The service could not be started.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// A file could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn setup(what: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(what.to_string())
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Which run.
    pub run: Run,
    /// Pods created.
    pub pods: usize,
    /// Pods seen bound.
    pub bound: usize,
    /// Seconds from the first create to the last bind seen.
    pub seconds: f64,
    /// Seconds until every create was answered.
    pub create_seconds: f64,
    /// p50 of kube-scheduler's scheduling attempt, ms.
    pub attempt_p50_ms: f64,
    /// p99 of kube-scheduler's scheduling attempt, ms.
    pub attempt_p99_ms: f64,
    /// Scheduling attempts kube-scheduler counted.
    pub attempts: f64,
    /// kube-scheduler's largest finite bucket bound, ms (16,384): a quantile
    /// that falls beyond it reads as this value and means "at least".
    pub attempt_ceiling_ms: f64,
    /// p50 and p99 of the service's own filter histogram, ms (slice runs).
    pub filter_ms: Option<(f64, f64)>,
    /// Nodes still carrying `hami.io/mutex.lock` at the end.
    pub locked_nodes: usize,
    /// Bound pods whose `bind-phase` is not `success` at the end (slice runs).
    pub not_allocated: usize,
    /// Seconds to start the control plane, create the nodes and get
    /// kube-scheduler (and the service) ready; not measured.
    pub setup_seconds: f64,
}

impl RunReport {
    /// Pods bound per second, create → bound.
    #[must_use]
    pub fn pods_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            count_f64(self.bound) / self.seconds
        } else {
            0.0
        }
    }
}

#[allow(clippy::cast_precision_loss)] // counts far below 2^52
fn count_f64(n: usize) -> f64 {
    n as f64
}

/// The figures of every run at one size.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Nodes (N).
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Pods per run (M).
    pub pods: usize,
    /// kube-scheduler's client QPS and burst.
    pub scheduler_qps: u32,
    /// The runs, in order.
    pub runs: Vec<RunReport>,
}

impl Report {
    /// The run `run`, if it ran.
    #[must_use]
    pub fn run(&self, run: Run) -> Option<&RunReport> {
        self.runs.iter().find(|r| r.run == run)
    }

    fn ratio(&self, run: Run) -> Option<f64> {
        let base = self.run(Run::Baseline)?.pods_per_s();
        let other = self.run(run)?.pods_per_s();
        (base > 0.0).then(|| other / base)
    }

    /// `{"nodes", "baseline_pods_per_s", "binpack_pods_per_s",
    /// "fgd_pods_per_s", "filter_p99_ms"}` (the filter p99 of the binpack
    /// run), with the ratios and the other figures beside them.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let rate = |run| self.run(run).map(RunReport::pods_per_s);
        let filter = |run, p99: bool| {
            self.run(run)
                .and_then(|r| r.filter_ms)
                .map(|(p50, p99_ms)| if p99 { p99_ms } else { p50 })
        };
        let mut out = json!({
            "nodes": self.nodes,
            "pods": self.pods,
            "gpus_per_node": self.gpus_per_node,
            "scheduler_qps": self.scheduler_qps,
            "baseline_pods_per_s": rate(Run::Baseline),
            "binpack_pods_per_s": rate(Run::Binpack),
            "fgd_pods_per_s": rate(Run::Fgd),
            "filter_p99_ms": filter(Run::Binpack, true),
            "filter_p50_ms": filter(Run::Binpack, false),
            "fgd_filter_p99_ms": filter(Run::Fgd, true),
            "binpack_over_baseline": self.ratio(Run::Binpack),
            "fgd_over_baseline": self.ratio(Run::Fgd),
        });
        for r in &self.runs {
            let name = r.run.as_str();
            out[format!("{name}_attempt_p50_ms")] = json!(r.attempt_p50_ms);
            out[format!("{name}_attempt_p99_ms")] = json!(r.attempt_p99_ms);
            out[format!("{name}_attempt_ceiling_ms")] = json!(r.attempt_ceiling_ms);
            out[format!("{name}_bound")] = json!(r.bound);
            out[format!("{name}_locked_nodes")] = json!(r.locked_nodes);
            out[format!("{name}_not_allocated")] = json!(r.not_allocated);
        }
        out
    }

    /// The side-by-side Markdown table and the ratios.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "kube-scheduler on the real control plane: {} nodes × {} GPUs, {} pods per run, \
             kube-scheduler client QPS/burst {}\n\n\
             | run | pods bound | pods/s (create → bound) | creates answered in | \
             scheduling attempt p50 / p99 (kube-scheduler) | filter p50 / p99 (service) | \
             nodes left locked | bound, not allocated | set-up (not measured) |\n\
             |---|---|---|---|---|---|---|---|---|\n",
            self.nodes, self.gpus_per_node, self.pods, self.scheduler_qps
        );
        for r in &self.runs {
            let filter = r.filter_ms.map_or_else(
                || "—".to_owned(),
                |(p50, p99)| format!("{p50:.2} / {p99:.2} ms"),
            );
            let attempt = |ms: f64| {
                if ms >= r.attempt_ceiling_ms {
                    format!("≥ {ms:.0}")
                } else {
                    format!("{ms:.2}")
                }
            };
            out.push_str(&format!(
                "| {} | {}/{} | {:.1} | {:.1} s | {} / {} ms | {filter} | {} | {} | {:.0} s |\n",
                r.run.describe(),
                r.bound,
                r.pods,
                r.pods_per_s(),
                r.create_seconds,
                attempt(r.attempt_p50_ms),
                attempt(r.attempt_p99_ms),
                r.locked_nodes,
                r.not_allocated,
                r.setup_seconds,
            ));
        }
        for run in [Run::Binpack, Run::Fgd] {
            if let Some(ratio) = self.ratio(run) {
                out.push_str(&format!(
                    "\n({}) / (a): {ratio:.2}",
                    if run == Run::Binpack { 'b' } else { 'c' }
                ));
            }
        }
        out.push('\n');
        out
    }
}

/// Runs `runs` at `config`'s size, each on a fresh real control plane in a
/// folder under `dir`.
///
/// # Errors
/// The control plane is not built, a component did not start, or the pods
/// were not all bound within [`Config::deadline`].
pub async fn run(config: &Config, runs: &[Run], dir: &Path) -> Result<Report, BenchError> {
    let binaries = Binaries::find().map_err(|missing| {
        setup(format!(
            "the real control plane is not built ({} missing); run integration/k8s/build.sh",
            missing.join(", ")
        ))
    })?;
    let mut report = Report {
        nodes: config.nodes,
        gpus_per_node: config.gpus_per_node,
        pods: config.pods,
        scheduler_qps: config.scheduler_qps,
        runs: Vec::new(),
    };
    for &run in runs {
        info!(
            run = run.as_str(),
            nodes = config.nodes,
            pods = config.pods,
            "kube-scheduler bench: starting run"
        );
        let folder = dir.join(format!("{}-{}", run.as_str(), config.nodes));
        let measured = one_run(config, run, binaries.clone(), &folder).await?;
        info!(
            run = run.as_str(),
            pods_per_s = measured.pods_per_s(),
            "run done"
        );
        report.runs.push(measured);
    }
    Ok(report)
}

/// The Node objects of a run: HAMi's register annotation, allocatable
/// `nvidia.com/gpu` (whole GPUs for the baseline, GPUs × split for slices),
/// cpu, memory, pods, and a Ready condition.
fn node(name: &str, gpus: u32, allocatable_gpus: u32) -> Result<Node, BenchError> {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"id": format!("GPU-{name}-{i}"), "index": i, "count": SPLIT,
                   "devmem": GPU_MEMORY_MIB, "devcore": 100, "type": "NVIDIA A100-SXM4-40GB",
                   "mode": "hami-core", "health": true})
        })
        .collect();
    let register = serde_json::to_string(&devices).map_err(setup)?;
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110",
        "nvidia.com/gpu": allocatable_gpus.to_string()});
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": {keys::NODE_NVIDIA_REGISTER: register}},
        "status": {"capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now, "lastTransitionTime": now}]},
    }))
    .map_err(setup)
}

/// Pod `i` of a run: one container with cpu/memory requests and either one
/// whole GPU or a slice of one.
fn pod(run: Run, i: usize) -> Result<Pod, BenchError> {
    let limits = match run {
        Run::Baseline => json!({"nvidia.com/gpu": "1"}),
        Run::Binpack | Run::Fgd => {
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "10"})
        }
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("bench-{i:06}"), "namespace": NAMESPACE},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": limits}}]},
    }))
    .map_err(setup)
}

async fn create_nodes(
    client: &kube::Client,
    config: &Config,
    allocatable_gpus: u32,
) -> Result<(), BenchError> {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..config.nodes)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("node-{i:05}");
                let created = api
                    .create(
                        &PostParams::default(),
                        &node(&name, config.gpus_per_node, allocatable_gpus)?,
                    )
                    .await?;
                // The apiserver keeps a new Node's status (kubelet registers
                // that way); say so plainly if a version ever drops it.
                let kept = created
                    .status
                    .and_then(|s| s.allocatable)
                    .is_some_and(|a| a.contains_key("nvidia.com/gpu"));
                if !kept {
                    return Err(setup(format!(
                        "node {name}: the apiserver dropped status.allocatable at create"
                    )));
                }
                // The TaintNodesByCondition admission plugin taints a new
                // Node `node.kubernetes.io/not-ready:NoSchedule`; the node
                // lifecycle controller (off here) would lift it once Ready.
                let untaint = json!({"spec": {"taints": null}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&untaint))
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// kube-scheduler's configuration for the baseline: the default profile,
/// leader election on (its Lease is taken after its caches synced).
fn baseline_scheduler_config(qps: u32) -> String {
    json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": qps, "burst": qps},
        "leaderElection": {"leaderElect": true, "resourceNamespace": "kube-system",
            "resourceName": "kube-scheduler"},
        "profiles": [{"schedulerName": "default-scheduler"}],
    })
    .to_string()
}

/// The chart's configuration with the client rate raised as in the baseline.
fn chart_scheduler_config(chart: &str, qps: u32) -> Result<String, BenchError> {
    let mut parsed: Value = serde_saphyr::from_str(chart).map_err(setup)?;
    parsed["clientConnection"]["qps"] = json!(qps);
    parsed["clientConnection"]["burst"] = json!(qps);
    Ok(parsed.to_string())
}

async fn wait_for_leader(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    plane: &ControlPlane,
) -> Result<(), BenchError> {
    wait_for_object(
        Api::<Lease>::namespaced(client.clone(), namespace),
        name,
        Duration::from_secs(180),
        |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some_and(|h| !h.is_empty())
        },
    )
    .await
    .map(drop)
    .map_err(|e| {
        setup(format!(
            "kube-scheduler's Lease {namespace}/{name}: {e}; {}",
            plane.logs()
        ))
    })
}

async fn one_run(
    config: &Config,
    run: Run,
    binaries: Binaries,
    dir: &Path,
) -> Result<RunReport, BenchError> {
    let started = Instant::now();
    std::fs::create_dir_all(dir)?;
    let options = Options {
        node_lifecycle: false,
        ..Options::default()
    };
    let mut plane = ControlPlane::start_with(binaries, &dir.join("control-plane"), &options)
        .await
        .map_err(setup)?;
    let client = plane.admin_client().await.map_err(setup)?;
    let always_allow = [SCHEDULER_ALWAYS_ALLOW.to_owned()];

    // The service (slice runs): the chart installed, the webhook and
    // extender serving before kube-scheduler starts.
    let mut service = None;
    let allocatable_gpus = match run.node_policy() {
        None => config.gpus_per_node,
        Some(_) => config.gpus_per_node * SPLIT,
    };
    let scheduler = match run.node_policy() {
        None => {
            create_nodes(&client, config, allocatable_gpus).await?;
            let kubeconfig = plane
                .certificate_kubeconfig("kube-scheduler", "system:kube-scheduler", &[])
                .map_err(setup)?;
            let config_text = baseline_scheduler_config(config.scheduler_qps);
            let i = plane
                .start_scheduler_with(&config_text, &kubeconfig, None, &always_allow)
                .map_err(setup)?;
            wait_for_leader(&client, "kube-system", "kube-scheduler", &plane).await?;
            i
        }
        Some(policy) => {
            let port = free_port()?;
            let sets = [
                format!("schedulerName={SCHEDULER_NAME}"),
                format!("scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy={policy}"),
                format!("devicePlugin.deviceSplitCount={SPLIT}"),
            ];
            let installed = install::install(&plane, port, &sets, dir)
                .await
                .map_err(setup)?;
            create_nodes(&client, config, allocatable_gpus).await?;
            let spec = ClusterSpec {
                node_policy: policy.to_owned(),
                ..ClusterSpec::default()
            };
            let (webhook, _, metrics) = start_scheduler_webhook(
                &spec,
                &host_identity(),
                &installed.scheduler_kubeconfig,
                &installed.tls,
                Some(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
                // As the chart passes `--lease-namespace`: the Lease of the
                // chart's kube-scheduler, so the service leads and writes
                // the handshake.
                Some(install::NAMESPACE),
            )?;
            service = Some((webhook, format!("http://{metrics}/metrics")));
            let chart_config = installed
                .scheduler_config
                .as_deref()
                .ok_or_else(|| setup("the chart rendered no kube-scheduler configuration"))?;
            let config_text = chart_scheduler_config(chart_config, config.scheduler_qps)?;
            let i = plane
                .start_scheduler_with(
                    &config_text,
                    &installed.scheduler_kubeconfig,
                    None,
                    &always_allow,
                )
                .map_err(setup)?;
            wait_for_leader(&client, install::NAMESPACE, SCHEDULER_NAME, &plane).await?;
            // The service's leader writes every node's handshake once it
            // has read the node: then it places pods there.
            wait_for_handshakes(&client, config.nodes, Duration::from_secs(600)).await?;
            i
        }
    };
    let setup_seconds = started.elapsed().as_secs_f64();

    let play = run.node_policy().map(|_| KubeCluster::new(client.clone()));
    let pods: Vec<Pod> = (0..config.pods)
        .map(|i| pod(run, i))
        .collect::<Result<_, _>>()?;
    let tracker = tokio::spawn(track_binds(client.clone(), config.pods, play));
    let t0 = Instant::now();
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(&pods)
        .map(|p| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), p).await }
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    let create_seconds = t0.elapsed().as_secs_f64();
    let (last_bind, bound) = match tokio::time::timeout(config.deadline, tracker).await {
        Ok(Ok(result)) => result?,
        Ok(Err(join)) => return Err(setup(format!("the bind tracker failed: {join}"))),
        Err(_) => {
            return Err(setup(format!(
                "{}: not every pod bound within {:?}; {}",
                run.as_str(),
                config.deadline,
                plane.logs()
            )));
        }
    };
    let seconds = last_bind.duration_since(t0).as_secs_f64();

    let scheduler_metrics = plane.scheduler_metrics(scheduler).await.map_err(setup)?;
    // Kept beside the logs (GPUSLICE_KEEP_CLUSTER_DIR=1 keeps the folder).
    std::fs::write(dir.join("kube-scheduler.metrics"), &scheduler_metrics)?;
    let attempts = histogram(&scheduler_metrics, ATTEMPT_HISTOGRAM);
    if attempts.count() <= 0.0 {
        let excerpt: String = scheduler_metrics.chars().take(400).collect();
        return Err(setup(format!(
            "{}: kube-scheduler's /metrics has no {ATTEMPT_HISTOGRAM} observations; it said: {excerpt}",
            run.as_str()
        )));
    }
    let filter_ms = match &service {
        Some((_, url)) => {
            let text = crate::cluster::Cluster::scrape(url).await?;
            let h = histogram(&text, FILTER_HISTOGRAM);
            Some((h.quantile(0.5) * 1000.0, h.quantile(0.99) * 1000.0))
        }
        None => None,
    };
    let locked_nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| n.annotations().contains_key(keys::NODE_LOCK))
        .count();
    let not_allocated = if run.node_policy().is_some() {
        api.list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                p.annotations().get(keys::BIND_PHASE).map(String::as_str)
                    != Some(BindPhase::Success.as_str())
            })
            .count()
    } else {
        0
    };
    drop(service);
    plane.schedulers.iter_mut().for_each(|p| p.kill());
    Ok(RunReport {
        run,
        pods: config.pods,
        bound,
        seconds,
        create_seconds,
        attempt_p50_ms: attempts.quantile(0.5) * 1000.0,
        attempt_p99_ms: attempts.quantile(0.99) * 1000.0,
        attempts: attempts.count(),
        attempt_ceiling_ms: attempts.last_finite_bound() * 1000.0,
        filter_ms,
        locked_nodes,
        not_allocated,
        setup_seconds,
    })
}

/// Waits until `want` nodes carry the handshake annotation. (Counted by
/// name: [`crate::harness::wait_for_list`] hands its condition a copy of every object on
/// every event, which at 5,000 nodes takes minutes.)
async fn wait_for_handshakes(
    client: &kube::Client,
    want: usize,
    deadline: Duration,
) -> Result<(), BenchError> {
    let mut stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut stamped: HashSet<String> = HashSet::new();
    let waiting = async {
        while stamped.len() < want {
            let Some(node) = stream.try_next().await.map_err(setup)? else {
                return Err(setup("the node watch ended"));
            };
            if node.annotations().contains_key(keys::NODE_HANDSHAKE) {
                stamped.insert(node.name_any());
            } else {
                stamped.remove(&node.name_any());
            }
        }
        Ok(())
    };
    tokio::time::timeout(deadline, waiting).await.map_err(|_| {
        setup(format!(
            "the service's handshake on every node: {}/{want} within {deadline:?}",
            stamped.len()
        ))
    })?
}

/// Watches the namespace's pods until `want` are bound; returns when the
/// last bind was seen and how many were. With `play`, plays the device
/// plugin for each pod bound by the extender ([`play_device_plugin`]) and
/// returns only after every such play is done.
async fn track_binds(
    client: kube::Client,
    want: usize,
    play: Option<KubeCluster>,
) -> Result<(Instant, usize), BenchError> {
    let play = play.map(std::sync::Arc::new);
    let mut stream = watcher(
        Api::<Pod>::namespaced(client, NAMESPACE),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let mut bound: HashSet<String> = HashSet::new();
    let mut played: HashSet<String> = HashSet::new();
    let mut plays = tokio::task::JoinSet::new();
    let mut last = Instant::now();
    while bound.len() < want {
        let Some(pod) = stream.try_next().await.map_err(setup)? else {
            return Err(setup("the pod watch ended"));
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let uid = pod.uid().unwrap_or_default();
        if bound.insert(uid.clone()) {
            last = Instant::now();
        }
        let allocating = pod.annotations().get(keys::BIND_PHASE).map(String::as_str)
            == Some(BindPhase::Allocating.as_str());
        if let Some(cluster) = &play
            && allocating
            && played.insert(uid)
        {
            let cluster = cluster.clone();
            plays.spawn(async move { play_device_plugin(&cluster, &pod, &node).await });
        }
    }
    while let Some(done) = plays.join_next().await {
        done.map_err(setup)??;
    }
    Ok((last, bound.len()))
}

/// What node-daemon writes when Allocate has served every container of a
/// pod: `vgpu-devices-to-allocate` with every entry erased and
/// `bind-phase=success` in one patch, then the node lock released if it
/// names this pod.
async fn play_device_plugin(
    cluster: &KubeCluster,
    pod: &Pod,
    node: &str,
) -> Result<(), BenchError> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let pending = pod
        .annotations()
        .get(keys::VGPU_DEVICES_TO_ALLOCATE)
        .ok_or_else(|| {
            setup(format!(
                "pod {name}: bound without {}",
                keys::VGPU_DEVICES_TO_ALLOCATE
            ))
        })?;
    let mut left: PodDevices = pending
        .parse()
        .map_err(|e| setup(format!("pod {name}: {e}")))?;
    while let Some(i) = left.first_pending_index() {
        left = left
            .erase_container(i)
            .map_err(|e| setup(format!("pod {name}: {e}")))?;
    }
    let patch: AnnotationPatch = [
        (
            keys::VGPU_DEVICES_TO_ALLOCATE.to_owned(),
            Some(left.to_string()),
        ),
        (
            keys::BIND_PHASE.to_owned(),
            Some(BindPhase::Success.to_string()),
        ),
    ]
    .into_iter()
    .collect();
    cluster
        .patch_pod_annotations(&namespace, &name, patch)
        .await
        .map_err(setup)?;
    let owner = LockOwner {
        namespace,
        pod: name,
    };
    cluster
        .release_node_lock(node, &owner)
        .await
        .map_err(setup)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_issue_keys_and_the_ratios() {
        let r = |run, seconds| RunReport {
            run,
            pods: 10,
            bound: 10,
            seconds,
            create_seconds: 1.0,
            attempt_p50_ms: 1.0,
            attempt_p99_ms: 2.0,
            attempts: 10.0,
            attempt_ceiling_ms: 2.0,
            filter_ms: (run != Run::Baseline).then_some((0.5, 1.5)),
            locked_nodes: 0,
            not_allocated: 0,
            setup_seconds: 3.0,
        };
        let report = Report {
            nodes: 20,
            gpus_per_node: 8,
            pods: 10,
            scheduler_qps: 5000,
            runs: vec![
                r(Run::Baseline, 1.0),
                r(Run::Binpack, 2.0),
                r(Run::Fgd, 4.0),
            ],
        };
        let j = report.to_json();
        assert_eq!(j["nodes"], 20);
        assert_eq!(j["baseline_pods_per_s"], 10.0);
        assert_eq!(j["binpack_pods_per_s"], 5.0);
        assert_eq!(j["fgd_pods_per_s"], 2.5);
        assert_eq!(j["filter_p99_ms"], 1.5);
        assert_eq!(j["binpack_over_baseline"], 0.5);
        assert_eq!(j["fgd_over_baseline"], 0.25);
        let table = report.to_markdown();
        assert!(
            table.contains("1.00 / ≥ 2 ms"),
            "a p99 at the ceiling reads 'at least': {table}"
        );
        assert!(table.contains("(b) / (a): 0.50"), "{table}");
        assert!(table.contains("(c) / (a): 0.25"), "{table}");
    }

    #[test]
    fn baseline_pods_ask_whole_gpus_and_slice_pods_a_slice() {
        let limits = |run| {
            pod(run, 0).unwrap().spec.unwrap().containers[0]
                .resources
                .clone()
                .unwrap()
                .limits
                .unwrap()
        };
        assert_eq!(limits(Run::Baseline).len(), 1);
        assert!(limits(Run::Fgd).contains_key("nvidia.com/gpumem"));
        let n = node("n1", 8, 80).unwrap();
        assert!(n.annotations().contains_key(keys::NODE_NVIDIA_REGISTER));
    }
}

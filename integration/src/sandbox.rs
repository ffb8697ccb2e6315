//! The sandbox: a whole GPU-sharing cluster on one machine, a workload
//! submitted through the admission webhook, a wait until nothing is in
//! flight, then a report per node and GPU checked by the independent
//! checker, and a verdict: is this the result the workload should give?
//!
//! ```text
//!  start cluster ─▶ every node's GPUs in the API (register annotation)
//!                ─▶ every node's GPUs in the scheduler-webhook's model (its /metrics)
//!                ─▶ submit ─▶ settled: every pod Running/finished, or found
//!                             unschedulable after the cluster's last change
//!                             (see [`settle`])
//!                ─▶ summary + checker ─▶ expected? (exit code of `sandbox`)
//! ```

mod settle;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use node_daemon::devices::simulated::simulated_uuid;
use node_daemon::settings::OperatingMode;
use proto::hami::mig::known_profiles;
use serde::Serialize;
use tokio::sync::watch;

pub use self::settle::{PodState, Settling, scheduled_false};
use crate::checker::{self, Report};
use crate::cluster::{Cluster, ClusterError, ClusterSpec, ControlPlaneKind, Mode};
use crate::harness::HarnessError;
use crate::workload;

/// Flags of `sandbox`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "sandbox",
    version,
    about = "A whole gpuslice cluster on one machine: a kube-apiserver, kube-scheduler and kubelets (in-process stand-ins, or with --control-plane real the real control plane) around the real scheduler-webhook and node-daemons with simulated GPUs",
    after_help = "Before submitting, the sandbox waits until the scheduler-webhook's model has every node's GPUs. \
A pod counts as settled when it runs or has finished, or when kube-scheduler found it unschedulable after the cluster's last change.\n\n\
Exit status: 0 when the result is the expected one: the checker is clean, no pod failed or was rejected, \
with the demo workload every pod runs except too-big, which stays Pending, \
and with the mig workload every pod runs (each container on a MIG instance) except mig-no-room, which stays Pending. \
1 otherwise (the reasons are printed on stderr), or when the cluster did not start or settle in time."
)]
pub struct Args {
    /// Number of GPU nodes.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 4)]
    pub gpus_per_node: u32,
    /// GPU model, as NVML would name it.
    #[arg(long, default_value = "NVIDIA A100-SXM4-40GB")]
    pub gpu_model: String,
    /// Memory per GPU, MiB.
    #[arg(long, default_value_t = 40960)]
    pub gpu_memory: u32,
    /// Slices per GPU (deviceSplitCount); a GPU in MIG mode offers as many as the most
    /// instances of one of its profiles instead (7 on an A100).
    #[arg(long, default_value_t = 10)]
    pub split_count: u32,
    /// `demo`, `mig`, `burst`, `openb` (openb's default pod list, shipped in
    /// `traces/openb/`; run from the repository root) or `openb:<pods.csv>`. `mig` runs the node-daemons in
    /// `operatingMode: mig` (the GPU model must be MIG-capable: A100, H100, A30, with
    /// --gpu-memory its memory, e.g. 81920 for the 80 GB models) and submits pods sized to
    /// each MIG profile, plus `mig-no-room`, which stays Pending
    /// (CardMigTopologyInfeasible); it is sized for the default 2 nodes x 4 GPUs (with
    /// fewer GPUs some pods may find no room, and the result is reported as unexpected).
    #[arg(long, default_value = "demo")]
    pub workload: String,
    /// Pods for `burst` and `openb` workloads.
    #[arg(long, default_value_t = 40)]
    pub pods: usize,
    /// Node policy: binpack, spread, fgd, fgdpack, bestfit, random (the chart's
    /// `nodeSchedulerPolicy`).
    #[arg(long, default_value = "binpack")]
    pub policy: String,
    /// Output: `table` or `json`.
    #[arg(long, default_value = "table")]
    pub format: String,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Leave the cluster up after the report, printing the kubeconfig path and the live
    /// dashboard's URL (in the JSON summary too: "kubeconfig", "dashboard_url"); stop with Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// `fake`: the in-process stand-ins (no set-up). `real`: kube-apiserver, etcd,
    /// kube-controller-manager and kube-scheduler built from k8s.io/kubernetes by
    /// integration/k8s/build.sh (needs Go 1.26; the first run builds them, which takes minutes).
    #[arg(long, default_value = "fake")]
    pub control_plane: ControlPlaneKind,
    /// `device-plugin` (HAMi's protocol) or `dra` (the chart's `mode: dra`: claims from
    /// shape templates, kube-scheduler allocates, node-daemon as DRA driver; needs
    /// `--control-plane real`). The JSON summary has the same keys; in DRA mode a GPU's
    /// `slots_used` counts the claims on it and `slots_total` is 0 (DRA sets no slot limit).
    #[arg(long, default_value = "device-plugin", value_parser = parse_mode)]
    pub mode: Mode,
}

/// Reads `--mode`.
fn parse_mode(value: &str) -> Result<Mode, String> {
    Mode::ALL
        .into_iter()
        .find(|m| m.as_str() == value)
        .ok_or_else(|| format!("unknown mode {value:?} (device-plugin, dra)"))
}

/// What ran the cluster: the versions the real components report, or
/// "stand-in".
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ControlPlaneSummary {
    /// kube-apiserver's `/version`.
    pub kube_apiserver: String,
    /// kube-scheduler's `--version`.
    pub kube_scheduler: String,
    /// `real <version>` or "stand-in".
    pub kubelet: String,
}

impl Default for ControlPlaneSummary {
    fn default() -> Self {
        Self {
            kube_apiserver: "stand-in".into(),
            kube_scheduler: "stand-in".into(),
            kubelet: "stand-in".into(),
        }
    }
}

/// One GPU in the summary.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GpuSummary {
    /// GPU UUID.
    pub uuid: String,
    /// Slices in use.
    pub slots_used: u64,
    /// Slices in all.
    pub slots_total: u64,
    /// Memory in use.
    pub memory_used_mib: u64,
    /// Memory in all.
    pub memory_total_mib: u64,
    /// Cores in use, percent.
    pub cores_used: u64,
    /// `pod` names holding a slice.
    pub holders: Vec<String>,
}

/// One node in the summary.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeSummary {
    /// Node name.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<GpuSummary>,
}

/// A pod that did not run, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unplaced {
    /// Pod name.
    pub pod: String,
    /// Phase.
    pub phase: String,
    /// Why (scheduling condition or failure message).
    pub reason: String,
}

/// The sandbox's result.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Pods created.
    pub pods_submitted: usize,
    /// Pods Running.
    pub pods_running: usize,
    /// Pods still Pending (unschedulable, with reasons).
    pub pods_pending: usize,
    /// Pods Failed.
    pub pods_failed: usize,
    /// Pods the API server refused at admission.
    pub pods_rejected: usize,
    /// GPUs over capacity (checker).
    pub overcommitted_gpus: usize,
    /// Containers whose env differs from their annotation (checker).
    pub mismatched_containers: usize,
    /// Bound pods that neither finished allocation nor failed with a reason (checker).
    pub unfinished_pods: usize,
    /// From the first create until nothing was in flight.
    pub seconds_to_settle: f64,
    /// Nodes and GPUs.
    pub nodes: Vec<NodeSummary>,
    /// Pods not running, with reasons.
    pub not_running: Vec<Unplaced>,
    /// Why the result is not the expected one (empty: it is).
    pub problems: Vec<String>,
    /// What ran the cluster.
    pub control_plane: ControlPlaneSummary,
    /// With `--keep-running`: the kubeconfig of the cluster left up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// With `--keep-running`: the live dashboard's URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
    /// The checker's findings.
    #[serde(skip)]
    pub report: Report,
}

impl Summary {
    /// Whether the result is the one the workload should give.
    #[must_use]
    pub fn as_expected(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What a workload should end as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// Pods that must stay Pending (unschedulable); every other pod must
    /// run. `None`: pods may stay Pending when the cluster is full, but
    /// none may fail.
    pub pending: Option<BTreeSet<String>>,
}

impl Expectation {
    /// The expectation for `--workload`.
    #[must_use]
    pub fn of(args: &Args) -> Self {
        let mix = match args.workload.as_str() {
            "demo" => Some(workload::demo(args.gpu_memory)),
            "mig" => known_profiles(&args.gpu_model).map(|p| workload::mig(&p, "")),
            _ => None,
        };
        let pending = mix.map(|mix| {
            mix.into_iter()
                .filter(|d| d.expect_unschedulable)
                .filter_map(|d| d.pod.metadata.name)
                .collect()
        });
        Self { pending }
    }

    /// Why `summary` is not what was expected (empty: it is).
    #[must_use]
    pub fn problems(&self, summary: &Summary) -> Vec<String> {
        let mut problems = Vec::new();
        if summary.overcommitted_gpus > 0 {
            problems.push(format!(
                "the checker found {} over-committed GPU(s)",
                summary.overcommitted_gpus
            ));
        }
        if summary.mismatched_containers > 0 {
            problems.push(format!(
                "the checker found {} container(s) whose limits differ from their annotation",
                summary.mismatched_containers
            ));
        }
        if summary.unfinished_pods > 0 {
            problems.push(format!(
                "the checker found {} bound pod(s) with an unfinished allocation",
                summary.unfinished_pods
            ));
        }
        for p in &summary.not_running {
            let expected_pending = self
                .pending
                .as_ref()
                .is_none_or(|names| names.contains(&p.pod));
            let fine = p.phase == "Pending" && expected_pending;
            if !fine {
                problems.push(format!("{} is {}: {}", p.pod, p.phase, p.reason));
            }
        }
        if let Some(names) = &self.pending {
            for name in names {
                if !summary
                    .not_running
                    .iter()
                    .any(|p| &p.pod == name && p.phase == "Pending")
                {
                    problems.push(format!(
                        "{name} should stay Pending (it fits no GPU) but did not"
                    ));
                }
            }
        }
        problems
    }
}

/// Why the sandbox could not finish.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A bad flag value.
    #[error("{0}")]
    Usage(String),
    /// The cluster could not start.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The workload could not be read.
    #[error(transparent)]
    Workload(#[from] workload::TraceError),
    /// Pods did not settle.
    #[error(transparent)]
    Wait(#[from] HarnessError),
    /// An API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Whether a pod looks no longer in flight: running, finished, or pending
/// with the scheduler's reason. A quick look at one pod: it cannot tell
/// whether that reason is still true (the sandbox asks [`Settling`]).
#[must_use]
pub fn settled(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Running" | "Succeeded" | "Failed") => true,
        _ => {
            let bound = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some();
            let unschedulable = status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                });
            !bound && unschedulable
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn pods_of(args: &Args) -> Result<Vec<Pod>, SandboxError> {
    match args.workload.as_str() {
        "demo" => Ok(workload::demo(args.gpu_memory)
            .into_iter()
            .map(|d| d.pod)
            .collect()),
        "mig" => {
            let profiles = known_profiles(&args.gpu_model).ok_or_else(|| {
                SandboxError::Usage(format!(
                    "--workload mig needs a MIG-capable --gpu-model (A100, H100 or A30), got {:?}",
                    args.gpu_model
                ))
            })?;
            // The last GPU of the last node: binpack fills it last, and
            // the other pods avoid it anyway.
            let last = u32::try_from(args.nodes.saturating_sub(1)).unwrap_or(u32::MAX);
            let pinned = simulated_uuid(&format!("gpu-node-{last}"), args.gpus_per_node - 1);
            Ok(workload::mig(&profiles, &pinned)
                .into_iter()
                .map(|d| d.pod)
                .collect())
        }
        "burst" => Ok(workload::burst(args.pods, args.gpu_memory)),
        "openb" => Ok(workload::openb(
            &PathBuf::from("traces/openb/openb_pod_list_default.csv"),
            args.pods,
            args.gpu_memory,
        )?),
        other => match other.strip_prefix("openb:") {
            Some(path) => Ok(workload::openb(
                &PathBuf::from(path),
                args.pods,
                args.gpu_memory,
            )?),
            None => Err(SandboxError::Usage(format!(
                "--workload must be demo, mig, burst, openb or openb:<pods.csv>, got {other:?}"
            ))),
        },
    }
}

/// Runs the sandbox: starts the cluster, waits until the scheduler knows
/// every node's GPUs, submits, waits until every pod has settled, reports
/// and judges the result ([`Summary::problems`]). The cluster is returned
/// for the caller to keep alive or shut down.
///
/// # Errors
/// A [`SandboxError`] saying what failed.
pub async fn run(args: &Args) -> Result<(Summary, Cluster), SandboxError> {
    if !["table", "json"].contains(&args.format.as_str()) {
        return Err(SandboxError::Usage(format!(
            "--format must be table or json, got {:?}",
            args.format
        )));
    }
    if args.nodes == 0 || args.gpus_per_node == 0 {
        return Err(SandboxError::Usage(
            "--nodes and --gpus-per-node must be at least 1".to_owned(),
        ));
    }
    let pods = pods_of(args)?;
    if args.mode == Mode::Dra
        && (args.control_plane != ControlPlaneKind::Real || args.workload == "mig")
    {
        return Err(SandboxError::Usage(
            "--mode dra needs --control-plane real (kube-scheduler allocates the claims) and a workload other than mig".to_owned(),
        ));
    }
    if args.control_plane == ControlPlaneKind::Real
        && crate::real::binaries::Binaries::find().is_err()
    {
        eprintln!(
            "the real control plane is not built yet: building it now with integration/k8s/build.sh \
             (Go module proxy; several minutes the first time, seconds afterwards)"
        );
        crate::real::binaries::Binaries::build().map_err(SandboxError::Usage)?;
    }
    let cluster = Cluster::start(ClusterSpec {
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        gpu_model: args.gpu_model.clone(),
        gpu_memory_mib: args.gpu_memory,
        split_count: args.split_count,
        node_policy: args.policy.clone(),
        control_plane: args.control_plane,
        mode: args.mode,
        operating_mode: if args.workload == "mig" {
            OperatingMode::Mig
        } else {
            OperatingMode::HamiCore
        },
        ..ClusterSpec::default()
    })
    .await?;
    match submit_and_settle(args, &cluster, &pods).await {
        Ok(mut summary) => {
            let (kube_apiserver, kube_scheduler, kubelet) = cluster.control_plane_versions().await;
            summary.control_plane = ControlPlaneSummary {
                kube_apiserver,
                kube_scheduler,
                kubelet,
            };
            Ok((summary, cluster))
        }
        Err(e) => {
            cluster.shutdown().await;
            Err(e)
        }
    }
}

async fn submit_and_settle(
    args: &Args,
    cluster: &Cluster,
    pods: &[Pod],
) -> Result<Summary, SandboxError> {
    let client = cluster.client().await?;
    cluster.wait_until_ready().await?;
    let deadline = Duration::from_secs(args.timeout);
    // Watching starts before the first create: every change after it is seen.
    let watching = Watching::start(&client);
    watching
        .wait("the sandbox's watches to list", deadline, Settling::synced)
        .await?;
    // In DRA mode kube-scheduler allocates from the ResourceSlices
    // (`wait_until_ready` waited for them); the webhook's model is not used.
    if args.mode == Mode::DevicePlugin {
        wait_for_model_gpus(cluster, &watching, deadline).await?;
    }

    let started = Instant::now();
    let mut rejected = Vec::new();
    for pod in pods {
        if let Err(e) = cluster.create_pod(pod).await {
            rejected.push(Unplaced {
                pod: pod.metadata.name.clone().unwrap_or_default(),
                phase: "Rejected".to_owned(),
                reason: e.to_string(),
            });
        }
    }
    let submitted = pods.len() - rejected.len();
    let progress = args.format == "table";
    let settled_pods = watching
        .wait("pods to settle", deadline, |s| {
            if progress {
                let (_, done, running) = s.progress();
                eprint!("\r  settling: {done}/{submitted} pods settled, {running} running   ");
                let _ = std::io::stderr().flush();
            }
            s.settled(submitted)
        })
        .await?
        .pods();
    let seconds_to_settle = started.elapsed().as_secs_f64();
    if progress {
        eprintln!();
    }
    drop(watching);
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut summary = match args.mode {
        Mode::DevicePlugin => summarize(&settled_pods, &nodes, seconds_to_settle),
        Mode::Dra => {
            use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
            let claims = Api::<ResourceClaim>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let slices = Api::<ResourceSlice>::all(client)
                .list(&ListParams::default())
                .await?
                .items;
            summarize_dra(&settled_pods, &nodes, &claims, &slices, seconds_to_settle)
        }
    };
    summary.pods_rejected = rejected.len();
    summary.not_running.extend(rejected);
    summary.problems = Expectation::of(args).problems(&summary);
    Ok(summary)
}

/// The three watches the sandbox settles on (the workload's pods and
/// events, all nodes), fed into one [`Settling`] by a background task.
struct Watching {
    state: watch::Receiver<Settling>,
    task: tokio::task::JoinHandle<()>,
}

enum Change {
    Pod(Box<watcher::Event<Pod>>),
    Node(Box<watcher::Event<Node>>),
    Event(Box<watcher::Event<Event>>),
}

impl Watching {
    fn start(client: &kube::Client) -> Self {
        let config = watcher::Config::default;
        let pods = watcher(
            Api::<Pod>::namespaced(client.clone(), workload::NAMESPACE),
            config(),
        )
        .default_backoff()
        .filter_map(|e| async move { e.ok().map(|e| Change::Pod(Box::new(e))) })
        .boxed();
        let nodes = watcher(Api::<Node>::all(client.clone()), config())
            .default_backoff()
            .filter_map(|e| async move { e.ok().map(|e| Change::Node(Box::new(e))) })
            .boxed();
        let events = watcher(
            Api::<Event>::namespaced(client.clone(), workload::NAMESPACE),
            config(),
        )
        .default_backoff()
        .filter_map(|e| async move { e.ok().map(|e| Change::Event(Box::new(e))) })
        .boxed();
        let (tx, state) = watch::channel(Settling::new());
        let task = tokio::spawn(async move {
            let mut changes = futures::stream::select_all([pods, nodes, events]);
            while let Some(change) = changes.next().await {
                tx.send_modify(|s| match change {
                    Change::Pod(e) => s.on_pod(*e),
                    Change::Node(e) => s.on_node(*e),
                    Change::Event(e) => s.on_event(*e),
                });
            }
        });
        Self { state, task }
    }

    /// Waits until `condition` holds, re-checked on every change.
    async fn wait(
        &self,
        what: &str,
        deadline: Duration,
        condition: impl Fn(&Settling) -> bool,
    ) -> Result<watch::Ref<'_, Settling>, HarnessError> {
        let mut state = self.state.clone();
        match tokio::time::timeout(deadline, state.wait_for(|s| condition(s))).await {
            Ok(Ok(_)) => Ok(self.state.borrow()),
            Ok(Err(_)) => Err(HarnessError::WatchEnded(what.to_owned())),
            Err(_) => {
                let s = self.state.borrow();
                let last = s
                    .unsettled()
                    .iter()
                    .map(|(pod, why)| format!("{pod}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; ");
                Err(HarnessError::Timeout {
                    what: what.to_owned(),
                    deadline,
                    last: if last.is_empty() {
                        format!("{} pod(s), none in flight", s.pods().len())
                    } else {
                        last
                    },
                })
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each node's GPU UUIDs as the scheduler-webhook's model has them, read
/// from its `/metrics` (`hami_gpu_memory_limit_bytes{node, device_uuid}`,
/// one sample per GPU the model holds).
#[must_use]
pub fn model_gpus(metrics: &str) -> BTreeMap<String, BTreeSet<String>> {
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let len = line[start..].find('"')?;
        Some(line[start..start + len].to_owned())
    };
    let mut gpus: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("hami_gpu_memory_limit_bytes{"))
    {
        if let (Some(node), Some(uuid)) = (label(line, "node"), label(line, "device_uuid")) {
            gpus.entry(node).or_default().insert(uuid);
        }
    }
    gpus
}

/// Waits until the scheduler-webhook's model holds every GPU each node
/// registered: a pod filtered earlier would be refused for lack of GPUs
/// that exist. The model is read through `/metrics`, the one window the
/// sandbox has on it; it is read again after each node change and,
/// between those, at a short growing interval, since the model catching
/// up raises no event the sandbox can watch.
async fn wait_for_model_gpus(
    cluster: &Cluster,
    watching: &Watching,
    deadline: Duration,
) -> Result<(), SandboxError> {
    let mut nodes = watching.state.clone();
    let mut interval = Duration::from_millis(5);
    let waiting = async {
        loop {
            let want = nodes.borrow_and_update().registered_gpus();
            let have = model_gpus(&cluster.metrics().await?);
            let missing: Vec<String> = want
                .iter()
                .filter(|(node, uuids)| {
                    let known = have.get(*node);
                    uuids.iter().any(|u| known.is_none_or(|k| !k.contains(u)))
                })
                .map(|(node, _)| node.clone())
                .collect();
            if want.len() >= cluster.spec.nodes && missing.is_empty() {
                return Ok::<(), ClusterError>(());
            }
            let _ = tokio::time::timeout(interval, nodes.changed()).await;
            interval = (interval * 2).min(Duration::from_millis(200));
        }
    };
    match tokio::time::timeout(deadline, waiting).await {
        Ok(result) => Ok(result?),
        Err(_) => {
            let have = model_gpus(&cluster.metrics().await.unwrap_or_default());
            let want = watching.state.borrow().registered_gpus();
            Err(SandboxError::Wait(HarnessError::Timeout {
                what: "the scheduler-webhook's model to hold every node's GPUs".to_owned(),
                deadline,
                last: format!("the API lists {want:?}; the model has {have:?}"),
            }))
        }
    }
}

/// Builds the summary from what the API server shows.
#[must_use]
pub fn summarize(pods: &[Pod], nodes: &[Node], seconds_to_settle: f64) -> Summary {
    let report = checker::check(pods, nodes);
    let mut node_summaries = Vec::new();
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut used: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for pod in pods
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Pending"))
    {
        let annotations = pod.metadata.annotations.as_ref();
        let Some(value) = annotations.and_then(|a| a.get("hami.io/vgpu-devices-allocated")) else {
            continue;
        };
        let init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .map_or(0, Vec::len);
        let running = phase(pod) == "Running";
        for (i, container) in value.split(';').enumerate() {
            if i < init && running {
                continue;
            }
            for device in container.split(':').filter(|d| d.contains(',')) {
                let f: Vec<&str> = device.split(',').collect();
                let (Some(uuid), Some(mem), Some(cores)) = (f.first(), f.get(2), f.get(3)) else {
                    continue;
                };
                let entry = used.entry((*uuid).to_owned()).or_default();
                entry.0 += 1;
                entry.1 += mem.parse::<u64>().unwrap_or(0);
                entry.2 += cores.parse::<u64>().unwrap_or(0);
                let names = holders.entry((*uuid).to_owned()).or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    for node in nodes {
        let register = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("hami.io/node-nvidia-register"))
            .and_then(|v| serde_json::from_str::<Vec<serde_json::Value>>(v).ok())
            .unwrap_or_default();
        let gpus = register
            .iter()
            .map(|d| {
                let uuid = d["id"].as_str().unwrap_or_default().to_owned();
                let (slots, mem, cores) = used.get(&uuid).copied().unwrap_or_default();
                GpuSummary {
                    slots_used: slots,
                    slots_total: d["count"].as_u64().unwrap_or(0),
                    memory_used_mib: mem,
                    memory_total_mib: d["devmem"].as_u64().unwrap_or(0),
                    cores_used: cores,
                    holders: holders.get(&uuid).cloned().unwrap_or_default(),
                    uuid,
                }
            })
            .collect();
        node_summaries.push(NodeSummary {
            name: node.metadata.name.clone().unwrap_or_default(),
            gpus,
        });
    }
    let not_running = pods
        .iter()
        .filter(|p| phase(p) != "Running")
        .map(|p| {
            let status = p.status.as_ref();
            let reason = status
                .and_then(|s| s.message.clone())
                .or_else(|| {
                    status
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .find(|c| c.type_ == "PodScheduled")
                        .and_then(|c| c.message.clone())
                })
                .unwrap_or_default();
            Unplaced {
                pod: p.metadata.name.clone().unwrap_or_default(),
                phase: phase(p).to_owned(),
                reason,
            }
        })
        .collect();
    Summary {
        pods_submitted: pods.len(),
        pods_running: pods.iter().filter(|p| phase(p) == "Running").count(),
        pods_pending: pods.iter().filter(|p| phase(p) == "Pending").count(),
        pods_failed: pods.iter().filter(|p| phase(p) == "Failed").count(),
        pods_rejected: 0,
        overcommitted_gpus: report
            .overcommitted
            .iter()
            .map(|o| &o.uuid)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        mismatched_containers: report.mismatched.len(),
        unfinished_pods: report.unfinished.len(),
        seconds_to_settle,
        nodes: node_summaries,
        not_running,
        problems: Vec::new(),
        control_plane: ControlPlaneSummary::default(),
        kubeconfig: None,
        dashboard_url: None,
        report,
    }
}

/// [`summarize`] in DRA mode: the checker's DRA reading, and per node the
/// GPUs of its ResourceSlice with what allocated claims consume on each.
#[must_use]
pub fn summarize_dra(
    pods: &[Pod],
    nodes: &[Node],
    claims: &[k8s_openapi::api::resource::v1::ResourceClaim],
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    seconds_to_settle: f64,
) -> Summary {
    use crate::checker::dra::{DRIVER, quantity, quantity_mib};

    let mut summary = summarize(pods, nodes, seconds_to_settle);
    let report = checker::check_with_dra(pods, nodes, claims, slices);
    summary.overcommitted_gpus = report
        .overcommitted
        .iter()
        .map(|o| &o.uuid)
        .collect::<BTreeSet<_>>()
        .len();
    summary.mismatched_containers = report.mismatched.len();
    summary.unfinished_pods = report.unfinished.len();
    summary.report = report;
    // (pool, device) -> (claims, MiB, claims of the whole memory, cores, holders)
    type Use = (u64, u64, u64, u64, Vec<String>);
    let mut used: BTreeMap<(String, String), Use> = BTreeMap::new();
    for claim in claims {
        let holders: Vec<String> = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .collect();
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten().filter(|r| r.driver == DRIVER) {
            let consumed = |name: &str| {
                r.consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .map(|q| q.0.clone())
            };
            let entry = used.entry((r.pool.clone(), r.device.clone())).or_default();
            entry.0 += 1;
            match consumed("memory").and_then(|q| quantity_mib(&q)) {
                Some(mib) => entry.1 += mib,
                // No consumed memory: the whole card (counted below).
                None => entry.2 += 1,
            }
            entry.3 += consumed("cores")
                .and_then(|q| quantity(&q))
                .and_then(|c| u64::try_from(c).ok())
                .unwrap_or(0);
            for h in &holders {
                if !entry.4.contains(h) {
                    entry.4.push(h.clone());
                }
            }
        }
    }
    let mut by_node: BTreeMap<String, Vec<GpuSummary>> = nodes
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), Vec::new()))
        .collect();
    for slice in slices.iter().filter(|s| s.spec.driver == DRIVER) {
        let node = slice.spec.node_name.clone().unwrap_or_default();
        for d in slice.spec.devices.iter().flatten() {
            let capacity = |name: &str| {
                d.capacity
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .map(|c| c.value.0.clone())
            };
            let total = capacity("memory")
                .and_then(|q| quantity_mib(&q))
                .unwrap_or(0);
            let (count, mem, whole, cores, holders) = used
                .remove(&(slice.spec.pool.name.clone(), d.name.clone()))
                .unwrap_or_default();
            by_node.entry(node.clone()).or_default().push(GpuSummary {
                uuid: d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get("uuid"))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_else(|| d.name.clone()),
                slots_used: count,
                slots_total: 0,
                memory_used_mib: mem + whole * total,
                memory_total_mib: total,
                cores_used: cores,
                holders,
            });
        }
    }
    summary.nodes = by_node
        .into_iter()
        .map(|(name, gpus)| NodeSummary { name, gpus })
        .collect();
    summary
}

/// The human report.
#[must_use]
pub fn table(summary: &Summary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for node in &summary.nodes {
        let _ = writeln!(out, "\nnode {}", node.name);
        let _ = writeln!(
            out,
            "  {:<44} {:>7} {:>17} {:>6}  holders",
            "GPU", "slices", "memory MiB", "cores"
        );
        for g in &node.gpus {
            let _ = writeln!(
                out,
                "  {:<44} {:>3}/{:<3} {:>7}/{:<9} {:>5}%  {}",
                g.uuid,
                g.slots_used,
                g.slots_total,
                g.memory_used_mib,
                g.memory_total_mib,
                g.cores_used,
                if g.holders.is_empty() {
                    "-".to_owned()
                } else {
                    g.holders.join(", ")
                }
            );
        }
    }
    if !summary.not_running.is_empty() {
        let _ = writeln!(out, "\nnot running:");
        for p in &summary.not_running {
            let _ = writeln!(out, "  {:<20} {:<9} {}", p.pod, p.phase, p.reason);
        }
    }
    let _ = writeln!(
        out,
        "\nsummary: {} submitted, {} running, {} pending, {} failed, {} rejected; settled in {:.2} s",
        summary.pods_submitted + summary.pods_rejected,
        summary.pods_running,
        summary.pods_pending,
        summary.pods_failed,
        summary.pods_rejected,
        summary.seconds_to_settle
    );
    let _ = writeln!(
        out,
        "checker: {} over-committed GPUs, {} mismatched containers, {} unfinished allocations",
        summary.overcommitted_gpus, summary.mismatched_containers, summary.unfinished_pods
    );
    for o in &summary.report.overcommitted {
        let _ = writeln!(
            out,
            "  OVER-COMMIT {} {} {}: {} > {}",
            o.node, o.uuid, o.what, o.used, o.capacity
        );
    }
    for m in summary
        .report
        .mismatched
        .iter()
        .chain(&summary.report.unfinished)
    {
        let _ = writeln!(out, "  PROBLEM {} {}: {}", m.pod, m.container, m.why);
    }
    let cp = &summary.control_plane;
    let _ = writeln!(
        out,
        "control plane: kube-apiserver {}, kube-scheduler {}, kubelet {}",
        cp.kube_apiserver, cp.kube_scheduler, cp.kubelet
    );
    if summary.as_expected() {
        let _ = writeln!(out, "result: as expected");
    } else {
        let _ = writeln!(out, "result: NOT as expected");
        for p in &summary.problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

//! The chaos soak: a [`Cluster`] of several nodes runs for a while as slice
//! pods are submitted and deleted continuously and faults land at random
//! (seeded): API 409/500 answers, cut watches, a node-daemon, the
//! scheduler-webhook or a kubelet killed and started again, GPUs turning
//! unhealthy and back. Every few seconds, and at the end, the independent
//! checker runs; the [`Report`] says what was submitted, ran, failed and
//! was injected, and the figures that must be 0 (over-commits, mismatched
//! containers, stuck pods — defined in [`tracker`] —, lost pods).
//!
//! Owns the schedule and the figures; the cluster's parts, their fault
//! hooks and the checker belong to the harness. The seed fixes the
//! schedule (which action, which pod size, which node, how long a fault
//! lasts), not the run: the components' timing still varies.
//!
//! ```text
//!  every 250 ms:  repairs due ─ fault due ─ observe (1 s) ─ churn ─ submit
//!                                  │            │
//!                        Cluster::kill_*,   list pods+nodes ─► Tracker (stuck, ran, failed)
//!                        fake apiserver        └─ every 5 s ─► checker ─► Report
//!  then: repair everything, stop churning, observe until settled, last check
//! ```

mod fault;
pub mod report;
mod rng;
pub mod tracker;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tracing::{info, warn};

pub use fault::FaultKind;
pub use report::Report;
use rng::Rng;
use tracker::{Request, Seen, Tracker};

use crate::cluster::{Cluster, ClusterError, ClusterSpec, ControlPlaneKind};
use crate::fake_apiserver::control::FaultSpec;
use crate::workload::NAMESPACE;

/// Label on every soak pod.
const LABEL: (&str, &str) = ("app", "gpuslice-chaos");
/// The loop's period.
const TICK: Duration = Duration::from_millis(250);
/// How often pods are listed and followed.
const OBSERVE_EVERY: Duration = Duration::from_secs(1);
/// Pod memory per GPU, MiB, and cores per GPU, %, drawn from.
const MEM_MIB: [u64; 5] = [2048, 4096, 6144, 10240, 16384];
const CORES: [u64; 5] = [5, 10, 20, 30, 50];

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Length of the churn-and-fault phase.
    pub duration: Duration,
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Seed of the schedule.
    pub seed: u64,
    /// Control plane; on `real` the faults only the fake apiserver injects
    /// are left out.
    pub control_plane: ControlPlaneKind,
    /// Gap between two faults, drawn between these.
    pub fault_gap: (Duration, Duration),
    /// How often the checker runs.
    pub check_every: Duration,
    /// A pod without progress this long is stuck (see [`tracker`]).
    pub stuck_after: Duration,
    /// Pods deleted per second, on average.
    pub deletions_per_second: f64,
    /// Live pods aimed at per GPU (about 3.4 fit on average, so some wait).
    pub pods_per_gpu: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(120),
            nodes: 4,
            gpus_per_node: 4,
            seed: 1,
            control_plane: ControlPlaneKind::Fake,
            fault_gap: (Duration::from_secs(2), Duration::from_secs(5)),
            check_every: Duration::from_secs(5),
            stuck_after: Duration::from_secs(60),
            deletions_per_second: 1.0,
            pods_per_gpu: 4.0,
        }
    }
}

/// Runs the soak on a new cluster and returns its report (whose
/// [`Report::failures`] say whether it passed).
///
/// # Errors
/// The cluster did not start, or a fault could not be repaired.
pub async fn run(config: Config) -> Result<Report, ClusterError> {
    let spec = ClusterSpec {
        nodes: config.nodes,
        gpus_per_node: config.gpus_per_node,
        control_plane: config.control_plane,
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(spec).await?;
    let result = match cluster.wait_until_ready().await {
        Ok(()) => Soak::new(&config, &cluster).run(&mut cluster).await,
        Err(e) => Err(e),
    };
    cluster.shutdown().await;
    result
}

/// A fault's undoing, due at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Repair {
    NodeDaemon(usize),
    SchedulerWebhook,
    Kubelet(usize),
    GpuHealthy(usize, String),
}

struct Soak {
    config: Config,
    rng: Rng,
    tracker: Tracker,
    report: Report,
    repairs: Vec<(Instant, Repair)>,
    /// The current round of fault kinds, drawn from the end: every kind
    /// once per round, in a seeded order.
    deck: Vec<FaultKind>,
    next_fault: Instant,
    next_observe: Instant,
    next_check: Instant,
    serial: u64,
    target: usize,
}

impl Soak {
    fn new(config: &Config, cluster: &Cluster) -> Self {
        let (kinds, disabled): (Vec<FaultKind>, Vec<FaultKind>) = FaultKind::ALL
            .into_iter()
            .partition(|k| !k.needs_fake_apiserver() || cluster.fake_api().is_some());
        let gpus = config.nodes * cluster.spec.gpus_per_node as usize;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let target = (gpus as f64 * config.pods_per_gpu).round() as usize;
        let now = Instant::now();
        Self {
            rng: Rng::new(config.seed),
            tracker: Tracker::new(config.stuck_after),
            report: Report {
                header: report::Header {
                    control_plane: config.control_plane.as_str().to_owned(),
                    nodes: config.nodes,
                    gpus_per_node: cluster.spec.gpus_per_node,
                    gpu_memory_mib: cluster.spec.gpu_memory_mib,
                    split_count: cluster.spec.split_count,
                    seed: config.seed,
                    seconds: config.duration.as_secs_f64(),
                    kinds,
                    disabled: disabled
                        .into_iter()
                        .map(|k| (k, "only the fake apiserver injects it".to_owned()))
                        .collect(),
                },
                ..Report::default()
            },
            repairs: Vec::new(),
            deck: Vec::new(),
            next_fault: now + config.fault_gap.0,
            next_observe: now,
            next_check: now + config.check_every,
            serial: 0,
            target,
            config: config.clone(),
        }
    }

    async fn run(mut self, cluster: &mut Cluster) -> Result<Report, ClusterError> {
        let client = cluster.client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let nodes: Api<Node> = Api::all(client);
        let end = Instant::now() + self.config.duration;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(
            seed = self.config.seed,
            target = self.target,
            "chaos soak started"
        );
        while Instant::now() < end {
            tick.tick().await;
            let now = Instant::now();
            self.repair_due(cluster, now).await?;
            if now >= self.next_fault {
                self.inject(cluster).await?;
                self.next_fault = now
                    + self
                        .rng
                        .between(self.config.fault_gap.0, self.config.fault_gap.1);
            }
            if now >= self.next_observe {
                self.next_observe = now + OBSERVE_EVERY;
                let check = now >= self.next_check;
                if check {
                    self.next_check = now + self.config.check_every;
                }
                self.observe(&pods, &nodes, check).await;
            }
            self.churn(&pods).await;
            self.submit(&pods).await;
        }

        // Faults stop: everything comes back, nothing more is submitted or
        // deleted, and the cluster is given the stuck threshold and a
        // margin to settle.
        info!("chaos soak: faults stop; waiting for the cluster to settle");
        if let Some(api) = cluster.fake_api() {
            api.clear_faults();
        }
        let repairs: Vec<Repair> = self.repairs.drain(..).map(|(_, r)| r).collect();
        for repair in repairs {
            self.undo(cluster, &repair).await?;
        }
        let quiet = Instant::now();
        let deadline = quiet + self.config.stuck_after + Duration::from_secs(15);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            tokio::time::sleep(OBSERVE_EVERY).await;
            if let Some((listed, gpus)) = self.observe(&pods, &nodes, false).await {
                last = self.tracker.unsettled(&gpus);
                if last.is_empty() {
                    self.report.at_end = self.tracker.counts();
                    let _ = listed;
                    break;
                }
            }
        }
        self.report.settle_seconds = quiet.elapsed().as_secs_f64();
        self.report.unsettled_at_end = last;
        match lists(&pods, &nodes).await {
            Ok((listed, node_list)) => {
                self.report
                    .finish(&crate::checker::check(&listed, &node_list));
            }
            Err(e) => return Err(e.into()),
        }
        Ok(self.report)
    }

    /// Lists pods and nodes, follows the pods, and runs the checker when
    /// `check`; returns the lists' reading, or `None` when a list failed.
    async fn observe(
        &mut self,
        pods: &Api<Pod>,
        nodes: &Api<Node>,
        check: bool,
    ) -> Option<(Vec<Pod>, Vec<crate::checker::GpuUse>)> {
        let (listed, node_list) = match lists(pods, nodes).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "chaos: listing failed; next time");
                if check {
                    self.report.checks_skipped += 1;
                }
                return None;
            }
        };
        let gpus = crate::checker::gpu_use(&listed, &node_list);
        let now = Instant::now();
        for seen in self.tracker.observe(now, &listed, &gpus) {
            match seen {
                Seen::Ran(_) => self.report.ran += 1,
                Seen::Failed(name, reason, message) => {
                    info!(pod = %name, %reason, %message, "chaos: pod failed");
                    self.report.failed(&reason, &message);
                    // Out of the way: a failed pod holds nothing but a name.
                    if pods.delete(&name, &DeleteParams::default()).await.is_ok() {
                        self.report.deleted += 1;
                    }
                }
                Seen::Stuck(name, why) => {
                    warn!(pod = %name, %why, "chaos: pod stuck");
                    self.report.stuck.push(format!("{name}: {why}"));
                }
                Seen::Lost(name) => {
                    warn!(pod = %name, "chaos: pod vanished");
                    self.report.lost.push(name);
                }
            }
        }
        if check {
            let found = crate::checker::check(&listed, &node_list);
            if !(found.overcommitted.is_empty() && found.mismatched.is_empty()) {
                warn!(?found, "chaos: the checker found a problem");
            }
            self.report.record_check(&found);
        }
        Some((listed, gpus))
    }

    /// Deletes a random followed pod, `deletions_per_second` on average.
    async fn churn(&mut self, pods: &Api<Pod>) {
        if self.tracker.is_empty()
            || !self
                .rng
                .chance(self.config.deletions_per_second * TICK.as_secs_f64())
        {
            return;
        }
        let i = self.rng.below(self.tracker.len());
        let Some(name) = self.tracker.names().nth(i).map(str::to_owned) else {
            return;
        };
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                self.tracker.deleted(&name);
                self.report.deleted += 1;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                // Gone already (the tracker will call it lost if the soak
                // did not delete it before).
            }
            Err(_) => self.report.delete_refused += 1,
        }
    }

    /// Tops the followed pods up to the target, two per tick at most.
    async fn submit(&mut self, pods: &Api<Pod>) {
        for _ in 0..2 {
            if self.tracker.len() >= self.target {
                return;
            }
            self.serial += 1;
            let name = format!("chaos-{}", self.serial);
            let request = Request {
                gpus: if self.rng.chance(0.25) { 2 } else { 1 },
                mem_mib: *self.rng.pick(&MEM_MIB),
                cores: *self.rng.pick(&CORES),
            };
            match pods
                .create(&PostParams::default(), &slice_pod(&name, request))
                .await
            {
                Ok(_) => {
                    self.tracker.submitted(&name, request, Instant::now());
                    self.report.submitted += 1;
                }
                Err(kube::Error::Api(s)) => {
                    self.report
                        .create_refused(format!("{} {}", s.code, s.reason), &s.message);
                }
                Err(e) => self
                    .report
                    .create_refused("no answer".to_owned(), &e.to_string()),
            }
        }
    }

    /// Injects the next fault of the round.
    async fn inject(&mut self, cluster: &mut Cluster) -> Result<(), ClusterError> {
        if self.deck.is_empty() {
            self.deck.clone_from(&self.report.header.kinds);
            self.rng.shuffle(&mut self.deck);
        }
        let Some(kind) = self.deck.pop() else {
            return Ok(());
        };
        let now = Instant::now();
        let down = self
            .rng
            .between(Duration::from_secs(1), Duration::from_secs(6));
        let mut target = String::new();
        let injected = match kind {
            FaultKind::Api409 | FaultKind::Api500 => {
                // Writes only for 409; lists and watches can also get a 500.
                const WRITES: [(&str, &str); 3] = [
                    ("PATCH", "/api/v1/nodes/"),
                    ("PATCH", "/api/v1/namespaces/default/pods/"),
                    ("POST", "/api/v1/namespaces/default/pods/"),
                ];
                const READS: [(&str, &str); 2] =
                    [("GET", "/api/v1/pods"), ("GET", "/api/v1/nodes")];
                let (status, targets): (u16, Vec<(&str, &str)>) = if kind == FaultKind::Api409 {
                    (409, WRITES.to_vec())
                } else {
                    (500, WRITES.iter().chain(&READS).copied().collect())
                };
                let (method, path) = *self.rng.pick(&targets);
                let count = u32::try_from(1 + self.rng.below(3)).unwrap_or(1);
                target = format!("{count} × {method} {path}");
                cluster.fake_api().is_some_and(|api| {
                    api.inject(FaultSpec::fail(method, path, count, status));
                    true
                })
            }
            FaultKind::WatchCut => cluster.fake_api().is_some_and(|api| {
                api.cut_watches();
                true
            }),
            FaultKind::KillNodeDaemon => {
                match self.free_node(|r| matches!(r, Repair::NodeDaemon(_))) {
                    Some(i) => {
                        target = format!("{} for {down:?}", cluster.nodes[i].name);
                        cluster.kill_node_daemon(i)?;
                        self.repairs.push((now + down, Repair::NodeDaemon(i)));
                        true
                    }
                    None => false,
                }
            }
            FaultKind::KillKubelet => match self.free_node(|r| matches!(r, Repair::Kubelet(_))) {
                Some(i) => {
                    target = format!("{} for {down:?}", cluster.nodes[i].name);
                    cluster.kill_kubelet(i).await?;
                    self.repairs.push((now + down, Repair::Kubelet(i)));
                    true
                }
                None => false,
            },
            FaultKind::KillSchedulerWebhook => {
                if self
                    .repairs
                    .iter()
                    .any(|(_, r)| *r == Repair::SchedulerWebhook)
                {
                    false
                } else {
                    target = format!("for {down:?}");
                    cluster.kill_scheduler_webhook()?;
                    self.repairs.push((now + down, Repair::SchedulerWebhook));
                    true
                }
            }
            FaultKind::GpuUnhealthy => {
                let i = self.rng.below(self.config.nodes);
                let index =
                    u32::try_from(self.rng.below(cluster.spec.gpus_per_node as usize)).unwrap_or(0);
                let uuid = cluster.nodes[i].gpu_uuid(index);
                let repair = Repair::GpuHealthy(i, uuid.clone());
                if self.repairs.iter().any(|(_, r)| *r == repair) {
                    false
                } else {
                    // A daemon that is down misses the event; it starts
                    // with every GPU healthy anyway.
                    cluster.nodes[i].set_gpu_health(&uuid, false);
                    let sick = self
                        .rng
                        .between(Duration::from_secs(3), Duration::from_secs(15));
                    target = format!("{} GPU {index} for {sick:?}", cluster.nodes[i].name);
                    self.repairs.push((now + sick, repair));
                    true
                }
            }
        };
        if injected {
            info!(fault = %kind, %target, "chaos: injected");
            *self.report.faults.entry(kind).or_default() += 1;
        }
        Ok(())
    }

    /// A random node with no pending repair of the kind `busy` matches.
    fn free_node(&mut self, busy: impl Fn(&Repair) -> bool) -> Option<usize> {
        let taken: BTreeSet<usize> = self
            .repairs
            .iter()
            .filter(|(_, r)| busy(r))
            .filter_map(|(_, r)| match r {
                Repair::NodeDaemon(i) | Repair::Kubelet(i) | Repair::GpuHealthy(i, _) => Some(*i),
                Repair::SchedulerWebhook => None,
            })
            .collect();
        let free: Vec<usize> = (0..self.config.nodes)
            .filter(|i| !taken.contains(i))
            .collect();
        (!free.is_empty()).then(|| *self.rng.pick(&free))
    }

    async fn repair_due(
        &mut self,
        cluster: &mut Cluster,
        now: Instant,
    ) -> Result<(), ClusterError> {
        let (due, later): (Vec<_>, Vec<_>) = self.repairs.drain(..).partition(|(at, _)| *at <= now);
        self.repairs = later;
        for (_, repair) in due {
            if let Err(e) = self.undo(cluster, &repair).await {
                // A start can meet the port or socket of the killed one
                // not yet released: try again shortly.
                warn!(error = %e, ?repair, "chaos: restart failed; retrying");
                self.report.revive_retries += 1;
                if self.report.revive_retries > 100 {
                    return Err(e);
                }
                self.repairs.push((now + Duration::from_secs(1), repair));
            }
        }
        Ok(())
    }

    async fn undo(&mut self, cluster: &mut Cluster, repair: &Repair) -> Result<(), ClusterError> {
        match repair {
            Repair::NodeDaemon(i) => cluster.revive_node_daemon(*i),
            Repair::SchedulerWebhook => cluster.revive_scheduler_webhook(),
            Repair::Kubelet(i) => cluster.revive_kubelet(*i).await,
            Repair::GpuHealthy(i, uuid) => {
                cluster.nodes[*i].set_gpu_health(uuid, true);
                Ok(())
            }
        }
    }
}

async fn lists(pods: &Api<Pod>, nodes: &Api<Node>) -> Result<(Vec<Pod>, Vec<Node>), kube::Error> {
    let params = ListParams::default();
    let listed = pods
        .list(&ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1)))
        .await?
        .items;
    Ok((listed, nodes.list(&params).await?.items))
}

/// A one-container slice pod asking for `request`.
fn slice_pod(name: &str, r: Request) -> Pod {
    let mut pod = crate::workload::gpu_pod(
        name,
        &json!({
            "nvidia.com/gpu": r.gpus.to_string(),
            "nvidia.com/gpumem": r.mem_mib.to_string(),
            "nvidia.com/gpucores": r.cores.to_string(),
        }),
    );
    pod.metadata.labels = Some([(LABEL.0.to_owned(), LABEL.1.to_owned())].into());
    pod
}

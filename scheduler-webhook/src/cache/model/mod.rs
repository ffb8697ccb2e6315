//! The scheduler's view of the cluster, fed from Kubernetes objects and
//! asked to place pods: the bridge between `k8s-openapi` types and the pure
//! [`crate::core`]. Reading the objects is [`crate::convert`]'s.
//!
//! Pure and single-owner: one task applies watch events and answers filter
//! and bind steps in order, so two filters can never book the same slice.
//! Nothing here performs I/O or reads the clock.
//!
//! Every pod it knows has one record in the [`PodBook`]
//! ([`super::pods`]), which moves the core ledger, the quota use and the
//! `fgd` workload together; this module reads Kubernetes objects, keeps
//! the nodes' registrations and asks [`schedule`]. Which GPU nodes the
//! handshake lets it offer, as time passes, is the `health` submodule's.
//! The CPU and memory of every pod on a node, GPU or not, are summed in
//! the [`HostBook`] ([`super::hosts`]) and copied into the core node, whose
//! capacity is the Node's allocatable CPU and memory: the `fgd` and
//! `fgdpack` scores weigh them as in the simulator, and the fit checks
//! them as kube-scheduler already did before it asked.
//!
//! [`ClusterModel::dry_run`] answers a simulation (Cluster Autoscaler's
//! `/filter` with `Nodes`) from the Node objects it is given, reading the
//! model without changing it.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod, ResourceQuota};
use proto::hami::pod_devices::PodDevices;
use proto::hami::{pair_score, register};

use self::health::Health;
pub use self::overview::{FragmentationSnapshot, PendingPod};
use super::hosts::HostBook;
use super::pods::PodBook;
pub use super::pods::{Decided, SliceSnapshot};
use crate::convert::{
    BadQuota, GpuOffer, NodeAnnotations, NodeHandshake, allocation_of, host_capacity,
    host_requests, is_finished, node_annotations, pod_lite, quota_limits,
};
use crate::core::fgd::{Shape, ShapeDistribution};
use crate::core::model::{Cluster, GpuUse, Node, NodeId};
use crate::core::policy::{Policy, ScheduleError, SchedulerConfig, schedule};
use crate::core::quota::QuotaStatus;
use crate::core::request::{PodRequest, RequestConfig};
use crate::core::reservation::HostResources;
use crate::core::rng::SplitMix64;

/// What a filter concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum FilterOutcome {
    /// The pod asks for no GPU: every candidate passes (HAMi does the same).
    NoGpuRequested,
    /// Placed and reserved on `node`.
    Placed {
        /// The chosen node.
        node: String,
        /// What each container gets (init containers first).
        devices: PodDevices,
        /// Candidates that did not fit, with HAMi-format reasons.
        failed: BTreeMap<String, String>,
    },
    /// No candidate fits.
    NoFit {
        /// Every candidate, with why.
        failed: BTreeMap<String, String>,
    },
    /// The pod's requests cannot be read.
    Invalid(String),
}

/// What a dry-run filter ([`ClusterModel::dry_run`]) concluded. Nothing
/// was reserved or counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DryRun {
    /// The pod asks for no GPU: every node passes.
    NoGpuRequested,
    /// Each node checked on its own.
    Checked {
        /// Positions (in the request's list) of the nodes the pod fits on.
        fits: Vec<usize>,
        /// The nodes it does not fit on, with HAMi-format reasons.
        failed: BTreeMap<String, String>,
    },
    /// The pod's requests cannot be read.
    Invalid(String),
}

/// The reason given for a node that offers no GPUs (HAMi's words).
pub const UNREGISTERED: &str = "node unregistered";

/// A node annotation that does not decode; the node keeps what it had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// `hami.io/node-nvidia-register`.
    #[error("hami.io/node-nvidia-register: {0}")]
    Register(#[from] register::RegisterError),
    /// `hami.io/node-nvidia-score`.
    #[error("hami.io/node-nvidia-score: {0}")]
    PairScores(#[from] pair_score::PairScoreError),
}

/// Scheduling configuration of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Node and GPU policies.
    pub scheduler: SchedulerConfig,
    /// Resource names and defaults.
    pub requests: RequestConfig,
    /// Seed for deterministic tie breaks.
    pub seed: u64,
}

/// A digest of an annotation value: its length and a 64-bit SipHash.
/// Kept instead of the value (a register annotation of 8 GPUs is about
/// 1.3 KB, 13 MB at 10,000 nodes) to tell whether it changed; two values
/// of the same length sharing a hash by chance (about 1 in 2^64 per
/// change) would leave the node's previous GPUs until its next change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest {
    len: usize,
    hash: u64,
}

impl Digest {
    fn of(value: &str) -> Self {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        value.hash(&mut h);
        Self {
            len: value.len(),
            hash: h.finish(),
        }
    }

    fn is_empty(self) -> bool {
        self.len == 0
    }
}

/// What the model last saw of a node's annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    register: Digest,
    pair_scores: Digest,
}

/// The cluster model behind `/filter` and `/bind`.
#[derive(Debug)]
pub struct ClusterModel {
    cluster: Cluster,
    config: ModelConfig,
    rng: SplitMix64,
    /// Per node seen by the watch, a digest of its last register and pair
    /// score annotations, so they are decoded only on change.
    annotations: HashMap<String, Seen>,
    /// What the handshake reads, per GPU node (those with a register
    /// annotation), so the handshake pass reads the watch cache instead of
    /// listing every node.
    handshakes: BTreeMap<String, NodeHandshake>,
    /// Which GPU nodes the handshake lets the filter offer, and the clock.
    health: Health,
    /// Nodes whose `hami.io/mutex.lock` the watch shows held.
    locked: HashSet<String>,
    /// Every pod known, with the quota use and the `fgd` workload.
    pods: PodBook,
    /// The CPU and memory of every pod on a node, summed per node.
    hosts: HostBook,
    /// The pod book's filter count when the current pod relist started.
    pod_relist_mark: u64,
    /// The previous filter's candidate names and their node ids.
    resolved: Resolved,
}

/// Candidate names resolved to node ids, kept from one filter to the next:
/// kube-scheduler sends the same list pod after pod, and comparing it in
/// order costs far less than thousands of hash lookups whose keys are
/// scattered over the heap. Names never leave the cluster (a deleted node
/// keeps its id), so the ids stay right until a new node registers.
#[derive(Debug, Default)]
struct Resolved {
    names: Vec<String>,
    ids: Vec<Option<NodeId>>,
    /// Nodes in the cluster when resolved.
    nodes: usize,
}

impl Resolved {
    /// The node id of each candidate name (`None`: not in the cluster),
    /// from the previous resolution when the list is the same.
    fn resolve(&mut self, cluster: &Cluster, candidates: &[String]) -> &[Option<NodeId>] {
        let nodes = cluster.nodes().len();
        if self.nodes != nodes || self.names.as_slice() != candidates {
            self.ids = candidates.iter().map(|n| cluster.node_id(n)).collect();
            self.names = candidates.to_vec();
            self.nodes = nodes;
        }
        &self.ids
    }
}

/// One GPU's capacity and use, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSnapshot {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
    /// GPU index on the node.
    pub index: u32,
    /// GPU type.
    pub device_type: String,
    /// Device memory, MiB.
    pub memory_mib: u64,
    /// Device cores, percent.
    pub cores: u32,
    /// Split count.
    pub slots: u32,
    /// Slots in use.
    pub used_slots: u32,
    /// Memory in use, MiB.
    pub used_memory_mib: u64,
    /// Cores in use, percent.
    pub used_cores: u32,
}

impl ClusterModel {
    /// An empty model.
    #[must_use]
    pub fn new(config: ModelConfig) -> Self {
        Self {
            cluster: Cluster::new(Vec::new()),
            rng: SplitMix64::new(config.seed),
            pods: PodBook::new(config.requests.memory_factor),
            hosts: HostBook::new(),
            config,
            annotations: HashMap::new(),
            handshakes: BTreeMap::new(),
            health: Health::default(),
            locked: HashSet::new(),
            pod_relist_mark: 0,
            resolved: Resolved::default(),
        }
    }

    /// The core cluster (read-only).
    #[must_use]
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Applies a node from the watch. The register and pair score
    /// annotations are decoded only when one changed; a node without a
    /// register has no GPUs, one without pair scores scores every pair 0.
    /// Its handshake decides, at the model's clock ([`Self::advance_clock`]),
    /// whether its GPUs are offered ([`NodeHandshake::offer`]).
    ///
    /// # Errors
    /// The register or pair score annotation does not decode; the node
    /// keeps its previous GPUs and scores.
    pub fn apply_node(&mut self, node: &KubeNode) -> Result<(), NodeError> {
        let Some(name) = node.metadata.name.as_deref() else {
            return Ok(());
        };
        let NodeAnnotations {
            register: value,
            cordoned,
            pair_scores,
            handshake,
        } = node_annotations(node, &self.config.requests.names.resource_name);
        let capacity = host_capacity(node);
        let locked = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(proto::hami::keys::NODE_LOCK))
            .is_some_and(|v| !v.is_empty());
        if locked {
            if !self.locked.contains(name) {
                self.locked.insert(name.to_owned());
            }
        } else {
            self.locked.remove(name);
        }
        self.health.apply(name, handshake.as_ref());
        match handshake {
            Some(h) => self.handshakes.insert(name.to_owned(), h),
            None => self.handshakes.remove(name),
        };
        let seen = Seen {
            register: Digest::of(&value),
            pair_scores: Digest::of(&pair_scores),
        };
        if self.annotations.get(name) != Some(&seen) || self.cluster.node_id(name).is_none() {
            let devices = if value.is_empty() {
                Vec::new()
            } else {
                register::decode(&value)?
            };
            let scores = if pair_scores.is_empty() {
                Vec::new()
            } else {
                pair_score::decode(&pair_scores)?
            };
            let mut fresh = Node::from_register(name, &devices);
            fresh.set_cordoned(&cordoned);
            fresh.set_pair_scores(&scores);
            fresh.capacity = capacity;
            let id = self.cluster.upsert_node(fresh);
            self.pods.node_changed(id);
            self.annotations.insert(name.to_owned(), seen);
            self.sync_host(name);
            self.pods.node_registered(&mut self.cluster, name);
        } else if let Some(id) = self.cluster.node_id(name)
            && let Some(existing) = self.cluster.node(id)
        {
            let mut updated = existing.clone();
            updated.set_cordoned(&cordoned);
            updated.capacity = capacity;
            if updated != *existing {
                self.cluster.upsert_node(updated);
                self.pods.node_changed(id);
            }
        }
        Ok(())
    }

    /// A node was deleted: it keeps its name but offers no GPUs.
    pub fn delete_node(&mut self, name: &str) {
        if self.cluster.node_id(name).is_some() {
            let id = self.cluster.upsert_node(Node::from_register(name, &[]));
            self.pods.node_changed(id);
        }
        self.annotations.remove(name);
        self.locked.remove(name);
        self.handshakes.remove(name);
        self.health.remove(name);
    }

    /// Tells the model the time (unix seconds; it reads no clock). GPU nodes
    /// whose `Requesting_` window ended by then while they advertise no GPUs
    /// stop being offered; their names are returned.
    pub fn advance_clock(&mut self, now_unix: i64) -> Vec<String> {
        self.health.advance(now_unix)
    }

    /// What the handshake reads from one GPU node.
    #[must_use]
    pub fn handshake_of(&self, name: &str) -> Option<&NodeHandshake> {
        self.handshakes.get(name)
    }

    /// What the handshake reads from each GPU node, by name.
    pub fn handshakes(&self) -> impl Iterator<Item = (&str, &NodeHandshake)> {
        self.handshakes.iter().map(|(n, h)| (n.as_str(), h))
    }

    /// Applies a pod from the watch: a live pod carrying an allocation
    /// (`hami.io/vgpu-node` + `vgpu-devices-allocated`) holds it; a finished
    /// pod releases whatever it held at once. A live pod on a node
    /// (`spec.nodeName`), GPU or not, takes its CPU and memory requests of
    /// it (none, if they do not read: kube-scheduler would not have placed
    /// it, and the API server refuses such quantities).
    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        if is_finished(pod) {
            self.delete_pod(uid);
            return;
        }
        if let Some(spec) = pod.spec.as_ref()
            && let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        {
            let moved = self
                .hosts
                .assign(uid, node, host_requests(spec).unwrap_or_default());
            for name in moved {
                self.sync_host(&name);
            }
        }
        if let Some(allocation) = allocation_of(pod) {
            let requests = &self.config.requests;
            self.pods.allocated(
                &mut self.cluster,
                uid,
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default(),
                allocation,
                // Its requests do not change: read its shape once.
                || shape_of(pod, requests),
            );
        }
    }

    /// A pod is gone: release what it held or reserved, and stop counting
    /// its shape.
    pub fn delete_pod(&mut self, uid: &str) {
        self.pods.remove(&mut self.cluster, uid);
        for name in self.hosts.remove(uid) {
            self.sync_host(&name);
        }
    }

    /// Copies what the host book sums for `name` into the core node; a
    /// change invalidates the node's fragmentation.
    fn sync_host(&mut self, name: &str) {
        if let Some(id) = self.cluster.node_id(name) {
            let used = self.hosts.used(name);
            if self
                .cluster
                .set_host_used(id, used.cpu_milli, used.memory_mib)
            {
                self.pods.node_changed(id);
            }
        }
    }

    /// Every pod known, with the quota use and the `fgd` workload.
    #[must_use]
    pub fn pods(&self) -> &PodBook {
        &self.pods
    }

    /// Checks the pod book's sums and the ledger against its records (see
    /// [`PodBook::check`]).
    ///
    /// # Errors
    /// The first disagreement found.
    pub fn check(&self) -> Result<(), String> {
        self.pods.check(&self.cluster)?;
        self.hosts.check()?;
        for node in self.cluster.nodes() {
            let used = self.hosts.used(&node.name);
            if (node.used_cpu_milli, node.used_memory_mib) != (used.cpu_milli, used.memory_mib) {
                return Err(format!(
                    "node {} uses {} milli-CPU and {} MiB, its pods {used:?}",
                    node.name, node.used_cpu_milli, node.used_memory_mib
                ));
            }
        }
        Ok(())
    }

    /// The workload `fgd` places for: the shapes of the GPU pods in the
    /// cluster and of those being scheduled.
    #[must_use]
    pub fn workload(&self) -> &ShapeDistribution {
        self.pods.workload()
    }

    /// Whole rebuilds of the fragmentation index so far.
    #[must_use]
    pub fn fgd_rebuilds(&self) -> u64 {
        self.pods.fgd_rebuilds()
    }

    /// Applies a ResourceQuota from the watch: its `limits.<gpumem>` and
    /// `limits.<gpucores>` (other keys are not ours). A value that does not
    /// parse is ignored and reported; the rest of the quota still applies.
    ///
    /// # Errors
    /// One [`BadQuota`] per value ignored.
    pub fn apply_quota(&mut self, quota: &ResourceQuota) -> Result<(), Vec<BadQuota>> {
        let Some((limits, bad)) = quota_limits(quota, &self.config.requests.names) else {
            return Ok(());
        };
        let (Some(namespace), Some(name)) = (
            quota.metadata.namespace.as_deref(),
            quota.metadata.name.as_deref(),
        ) else {
            return Ok(());
        };
        self.pods.set_quota(namespace, name, limits);
        if bad.is_empty() { Ok(()) } else { Err(bad) }
    }

    /// A ResourceQuota was deleted.
    pub fn delete_quota(&mut self, namespace: &str, name: &str) {
        self.pods.remove_quota(namespace, name);
    }

    /// One namespace's quota limits and use; `None` when it has no quota.
    #[must_use]
    pub fn quota_status(&self, namespace: &str) -> Option<QuotaStatus> {
        self.pods.quota_status(namespace)
    }

    /// Every namespace with a quota or GPU use (for metrics).
    #[must_use]
    pub fn quota_snapshot(&self) -> Vec<QuotaStatus> {
        self.pods.quota_statuses()
    }

    // === Relist reconciliation ===
    //
    // After a watch breaks, its relist is the whole truth for its kind: the
    // owner collects what the relist delivered and hands it here.

    /// A node relist ended: nodes it did not deliver were deleted meanwhile.
    pub fn reconcile_nodes(&mut self, seen: &HashSet<String>) {
        let gone: Vec<String> = self
            .node_names()
            .filter(|n| !seen.contains(*n))
            .map(str::to_owned)
            .collect();
        for name in gone {
            self.delete_node(&name);
        }
    }

    /// A pod relist starts (before its LIST is sent): pods filtered until
    /// now existed before the list.
    pub fn pod_relist_started(&mut self) {
        self.pod_relist_mark = self.pods.filters();
    }

    /// A pod relist ended. Deleted meanwhile, so released and forgotten:
    /// pods known from their annotations that it did not deliver, and pods
    /// filtered before it started that it did not deliver (they existed
    /// before its LIST; kube-scheduler never binds a deleted pod, so
    /// nothing else would ever free what they reserved or were bound to).
    /// A pod filtered after the relist started may be newer than the list:
    /// it keeps what it reserved and loses only its shape in the fgd
    /// workload, as does any other pod counted there that the relist did
    /// not deliver (it is counted again at its next filter or when its
    /// allocation is seen). Every pod on a node that it did not deliver
    /// gives back its CPU and memory, but for those filtered after it
    /// started, which keep the CPU and memory of the node they reserved.
    pub fn reconcile_pods(&mut self, seen: &HashSet<String>) {
        let gone: Vec<String> = self
            .pods
            .allocated_pods()
            .chain(self.pods.filtered_by(self.pod_relist_mark))
            .filter(|u| !seen.contains(*u))
            .map(str::to_owned)
            .collect();
        for uid in gone {
            self.delete_pod(&uid);
        }
        let keep = seen
            .iter()
            .map(String::as_str)
            .chain(self.pods.filtered_after(self.pod_relist_mark));
        for name in self.hosts.retain(keep) {
            self.sync_host(&name);
        }
        let gone: Vec<String> = self
            .pods
            .counted_pods()
            .filter(|u| !seen.contains(*u))
            .map(str::to_owned)
            .collect();
        for uid in gone {
            self.pods.forget_shape(&uid);
        }
    }

    /// A ResourceQuota relist ended: quotas it did not deliver were deleted.
    pub fn reconcile_quotas(&mut self, seen: &HashSet<(String, String)>) {
        let gone: Vec<(String, String)> = self
            .pods
            .quota_keys()
            .filter(|(ns, name)| !seen.contains(&((*ns).to_owned(), (*name).to_owned())))
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
            .collect();
        for (ns, name) in gone {
            self.delete_quota(&ns, &name);
        }
    }

    /// Every GPU offered, with its use (a node the handshake withdrew is
    /// left out, as HAMi drops its devices).
    #[must_use]
    pub fn gpu_snapshot(&self) -> Vec<GpuSnapshot> {
        self.cluster
            .nodes()
            .iter()
            .filter(|node| !self.health.is_withdrawn(&node.name))
            .flat_map(|node| {
                node.gpus
                    .iter()
                    .zip(&node.usage)
                    .map(|(gpu, usage)| GpuSnapshot {
                        node: node.name.clone(),
                        uuid: gpu.uuid.clone(),
                        index: gpu.index,
                        device_type: gpu.device_type.to_string(),
                        memory_mib: gpu.devmem,
                        cores: gpu.devcore,
                        slots: gpu.count,
                        used_slots: usage.used,
                        used_memory_mib: usage.usedmem,
                        used_cores: usage.usedcores,
                    })
            })
            .collect()
    }

    /// Every container slice of every pod known from its annotations.
    #[must_use]
    pub fn slice_snapshot(&self) -> Vec<SliceSnapshot> {
        self.pods.slices()
    }

    /// The candidates the model has no GPUs for: never seen by the watch,
    /// seen without a `hami.io/node-nvidia-register`, or withdrawn by the
    /// handshake (unhealthy).
    pub fn unregistered<'a>(&self, candidates: &'a [String]) -> impl Iterator<Item = &'a String> {
        candidates.iter().filter(|n| {
            self.annotations
                .get(n.as_str())
                .is_none_or(|seen| seen.register.is_empty())
                || self.health.is_withdrawn(n)
        })
    }

    /// Nodes known (for reconciling after a relist).
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.annotations.keys().map(String::as_str)
    }

    /// Places a pod among `candidates` and reserves the slices for its UID
    /// (replacing any earlier reservation of the same pod).
    pub fn filter(&mut self, pod: &Pod, candidates: &[String]) -> FilterOutcome {
        let lite = match pod_lite(pod) {
            Ok(l) => l,
            Err(e) => return FilterOutcome::Invalid(e),
        };
        let mut request = match PodRequest::from_pod(&lite, &self.config.requests) {
            Ok(r) => r,
            Err(e) => return FilterOutcome::Invalid(e.to_string()),
        };
        if !request.wants_gpu() {
            return FilterOutcome::NoGpuRequested;
        }
        // The pod is part of the workload from now on (placed or not: it
        // is demand), until it is deleted or finishes; HAMi drops its
        // earlier reservation before fitting it again.
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        self.pods.filtering(
            &mut self.cluster,
            &lite.uid,
            namespace,
            pod.metadata.name.as_deref().unwrap_or_default(),
            Shape::of_request(&request),
        );
        // So do the CPU and memory an earlier reservation held (a pod
        // being filtered is not bound yet).
        for name in self.hosts.remove(&lite.uid) {
            self.sync_host(&name);
        }
        request.constraints.quota = self.pods.quota_room(namespace);

        let mut failed = BTreeMap::new();
        let mut ids = Vec::with_capacity(candidates.len());
        let health = &self.health;
        let withdrawn = health.any_withdrawn();
        let resolved = self.resolved.resolve(&self.cluster, candidates);
        for (name, id) in candidates.iter().zip(resolved) {
            match id {
                Some(id) if !(withdrawn && health.is_withdrawn(name)) => ids.push(*id),
                _ => {
                    failed.insert(name.clone(), UNREGISTERED.to_owned());
                }
            }
        }
        let name_of =
            |cluster: &Cluster, id| cluster.node(id).map(|n| n.name.clone()).unwrap_or_default();
        // Only an fgd or fgdpack pod touches the index; binpack and spread
        // do no per-node work for it.
        let fgd = request
            .node_policy
            .unwrap_or(self.config.scheduler.node_policy)
            .uses_fgd_index();
        // A node admits one bind at a time (the node lock, held from bind
        // to Allocate), so the binds sent to one node queue behind each
        // other. While others fit, a node with binds queued is not chosen,
        // and when every fitting node has some, one of those with the
        // fewest is: a burst spreads over the nodes' locks instead of
        // queueing on the one node the policy likes best (whose queue
        // would outlast the binds' lock wait). Looked up from the few busy
        // nodes, not per candidate: the filter scans thousands of
        // candidates.
        let mut queued: HashMap<NodeId, u32> = HashMap::new();
        let busy = self
            .locked
            .iter()
            .map(|name| (name.as_str(), 1))
            .chain(self.pods.binds_in_flight());
        for (name, binds) in busy {
            if let Some(id) = self.cluster.node_id(name) {
                *queued.entry(id).or_default() += binds;
            }
        }
        let mut idle_decision = None;
        if !queued.is_empty() {
            let least_queued = |most: u32| -> Vec<NodeId> {
                ids.iter()
                    .copied()
                    .filter(|id| queued.get(id).is_none_or(|&q| q <= most))
                    .collect()
            };
            // The idle nodes, then also those with the fewest binds queued.
            let fewest = ids.iter().filter_map(|id| queued.get(id)).min().copied();
            let mut tried = 0;
            for most in [Some(0), fewest].into_iter().flatten() {
                let level = least_queued(most);
                if level.len() <= tried || level.len() == ids.len() {
                    continue;
                }
                tried = level.len();
                let index = fgd.then(|| self.pods.fgd_index(&self.cluster));
                idle_decision = schedule(
                    &self.cluster,
                    &request,
                    level,
                    &self.config.scheduler,
                    index,
                    &mut self.rng,
                )
                .ok();
                if idle_decision.is_some() {
                    break;
                }
            }
        }
        let result = match idle_decision {
            Some(decision) => Ok(decision),
            None => {
                let index = fgd.then(|| self.pods.fgd_index(&self.cluster));
                schedule(
                    &self.cluster,
                    &request,
                    ids,
                    &self.config.scheduler,
                    index,
                    &mut self.rng,
                )
            }
        };
        match result {
            Ok(decision) => {
                for (id, why) in &decision.failed {
                    failed.insert(name_of(&self.cluster, *id), why.to_string());
                }
                let Some(node) = self.cluster.node(decision.node) else {
                    return FilterOutcome::NoFit { failed };
                };
                let devices = decision.pod_devices(node);
                let node_name = node.name.clone();
                let decided = Decided {
                    node: node_name.clone(),
                    devices: devices.clone(),
                    mig: Vec::new(),
                };
                match self.pods.reserve(
                    &mut self.cluster,
                    &lite.uid,
                    decision.node,
                    decided,
                    decision.init_count(),
                ) {
                    Ok(()) => {
                        // Its CPU and memory count on the node from now,
                        // as kube-scheduler's assumed pod does.
                        let host = HostResources {
                            cpu_milli: lite.cpu_milli,
                            memory_mib: lite.memory_mib,
                        };
                        for name in self.hosts.assign(&lite.uid, &node_name, host) {
                            self.sync_host(&name);
                        }
                        FilterOutcome::Placed {
                            node: node_name,
                            devices,
                            failed,
                        }
                    }
                    Err(e) => {
                        failed.insert(node_name, e.to_string());
                        FilterOutcome::NoFit { failed }
                    }
                }
            }
            Err(crate::core::policy::ScheduleError::NoNodeFits { failed: refused }) => {
                for (id, why) in refused {
                    failed.insert(name_of(&self.cluster, id), why.to_string());
                }
                FilterOutcome::NoFit { failed }
            }
            Err(e) => FilterOutcome::Invalid(e.to_string()),
        }
    }

    /// Checks a pod against Node objects that need not be in the model
    /// (Cluster Autoscaler's template nodes): a simulation, which reserves
    /// nothing, counts nothing and changes nothing.
    ///
    /// Each node's GPUs come from its own register annotation, cordon and
    /// handshake (read at the model's clock), as the live filter reads a
    /// node from the watch. A node the model knows by that name (a real
    /// node) starts from the model's usage of the GPUs it still lists, less
    /// what this pod itself holds there; any other node (a template) starts
    /// empty. The namespace's quota room applies as in the live filter.
    /// Each node is checked on its own, so every node the pod fits on
    /// passes.
    #[must_use]
    pub fn dry_run(&self, pod: &Pod, nodes: &[KubeNode]) -> DryRun {
        let lite = match pod_lite(pod) {
            Ok(l) => l,
            Err(e) => return DryRun::Invalid(e),
        };
        let mut request = match PodRequest::from_pod(&lite, &self.config.requests) {
            Ok(r) => r,
            Err(e) => return DryRun::Invalid(e.to_string()),
        };
        if !request.wants_gpu() {
            return DryRun::NoGpuRequested;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        request.constraints.quota = self.pods.quota_room(namespace);
        // Whether a pod fits a node does not depend on how nodes are ranked
        // (and fgd's ranking needs an index of the live cluster).
        request.node_policy = Some(Policy::Binpack);
        let mut rng = SplitMix64::new(self.config.seed);
        let mut fits = Vec::new();
        let mut failed = BTreeMap::new();
        for (position, object) in nodes.iter().enumerate() {
            let name = object.metadata.name.clone().unwrap_or_default();
            let node = match self.simulated_node(&name, object, &lite.uid) {
                Ok(node) => node,
                Err(why) => {
                    failed.insert(name, why);
                    continue;
                }
            };
            let alone = Cluster::new(vec![node]);
            match schedule(
                &alone,
                &request,
                [0],
                &self.config.scheduler,
                None,
                &mut rng,
            ) {
                Ok(_) => fits.push(position),
                Err(ScheduleError::NoNodeFits { failed: refused }) => {
                    let why = refused
                        .first()
                        .map_or_else(String::new, |(_, r)| r.to_string());
                    failed.insert(name, why);
                }
                Err(e) => return DryRun::Invalid(e.to_string()),
            }
        }
        DryRun::Checked { fits, failed }
    }

    /// One Node object of a dry run as a core node: its own GPUs, with the
    /// model's usage when the model knows it (less what pod `uid` holds).
    fn simulated_node(&self, name: &str, object: &KubeNode, uid: &str) -> Result<Node, String> {
        let NodeAnnotations {
            register: value,
            cordoned,
            pair_scores,
            handshake,
        } = node_annotations(object, &self.config.requests.names.resource_name);
        let offered =
            handshake
                .as_ref()
                .is_none_or(|h| match h.offer(self.health.is_dropped(name)) {
                    GpuOffer::Yes => true,
                    GpuOffer::Until(end) => end > self.health.now(),
                    GpuOffer::No => false,
                });
        if value.is_empty() || !offered {
            return Err(UNREGISTERED.to_owned());
        }
        let devices = register::decode(&value)
            .map_err(|e| format!("node register annotation does not decode: {e}"))?;
        let mut node = Node::from_register(name, &devices);
        if node.gpus.is_empty() {
            return Err(UNREGISTERED.to_owned());
        }
        node.set_cordoned(&cordoned);
        if !pair_scores.is_empty() {
            let scores = pair_score::decode(&pair_scores)
                .map_err(|e| format!("node pair score annotation does not decode: {e}"))?;
            node.set_pair_scores(&scores);
        }
        let Some(id) = self.cluster.node_id(name) else {
            return Ok(node);
        };
        let Some(known) = self.cluster.node(id) else {
            return Ok(node);
        };
        for (pos, gpu) in node.gpus.iter().enumerate() {
            if let Some(at) = known.gpu_position(&gpu.uuid) {
                node.usage[pos] = known.usage[at];
            }
        }
        // HAMi fits a pod again without its own earlier reservation.
        if let Some(own) = self.cluster.pod_usage(uid).filter(|u| u.node == id) {
            for (at, held) in &own.gpus {
                let Some(uuid) = known.gpus.get(*at).map(|g| g.uuid.as_str()) else {
                    continue;
                };
                if let Some(pos) = node.gpu_position(uuid) {
                    node.usage[pos] = less(node.usage[pos], *held);
                }
            }
        }
        Ok(node)
    }

    /// The filter decision waiting for this pod's bind.
    #[must_use]
    pub fn decision(&self, uid: &str) -> Option<&Decided> {
        self.pods.decision(uid)
    }

    /// Marks a pod's reservation bound.
    ///
    /// # Errors
    /// The pod has no reservation (it was never filtered here, or was released).
    pub fn commit(&mut self, uid: &str) -> Result<(), crate::core::reservation::ReservationError> {
        self.pods.bound(&mut self.cluster, uid)
    }

    /// Drops a pod's reservation and the CPU and memory it held (bind
    /// failed); harmless when there is none. The pod's shape still counts:
    /// kube-scheduler will filter it again.
    pub fn release(&mut self, uid: &str) -> bool {
        let released = self.pods.bind_failed(&mut self.cluster, uid);
        for name in self.hosts.remove(uid) {
            self.sync_host(&name);
        }
        released
    }

    /// Remembers why a pod's filter found no node (see [`PodBook::refuse`]).
    pub fn refused(&mut self, uid: &str, failed: &BTreeMap<String, String>) {
        self.pods.refuse(uid, failed);
    }

    /// Pods that hold nothing and whose last filter found no node, the most
    /// recently refused first (for the dashboard).
    #[must_use]
    pub fn pending(&self) -> Vec<PendingPod> {
        overview::pending(&self.pods)
    }

    /// The cluster's fragmentation for the workload `fgd` places for,
    /// computed afresh without touching the `fgd` policy's index.
    #[must_use]
    pub fn fragmentation(&self) -> FragmentationSnapshot {
        overview::fragmentation(&self.cluster, &self.pods)
    }

    /// The node a pod holds or reserved slices on.
    #[must_use]
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        let usage = self.cluster.pod_usage(uid)?;
        self.cluster.node(usage.node).map(|n| n.name.as_str())
    }
}

/// `a` less `b`, field by field, never below 0.
fn less(a: GpuUse, b: GpuUse) -> GpuUse {
    GpuUse {
        used: a.used.saturating_sub(b.used),
        usedmem: a.usedmem.saturating_sub(b.usedmem),
        usedcores: a.usedcores.saturating_sub(b.usedcores),
    }
}

/// The shape of a pod's requests, when they read and ask for a GPU.
fn shape_of(pod: &Pod, requests: &RequestConfig) -> Option<Shape> {
    let lite = pod_lite(pod).ok()?;
    let request = PodRequest::from_pod(&lite, requests).ok()?;
    request.wants_gpu().then(|| Shape::of_request(&request))
}

mod health;
mod overview;
#[cfg(test)]
mod tests;

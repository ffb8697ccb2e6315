//! The scheduler's view of the cluster, fed from Kubernetes objects and
//! asked to place pods: the bridge between `k8s-openapi` types and the pure
//! [`crate::core`]. Reading the objects is [`crate::convert`]'s.
//!
//! Pure and single-owner: one task applies watch events and answers filter
//! and bind steps in order, so two filters can never book the same slice.
//! Nothing here performs I/O or reads the clock.
//!
//! For the `fgd` policy the model also keeps the workload's shapes and a
//! fragmentation index ([`super::fragmentation`]): every change of a node's
//! usage or GPUs below marks that node, and an `fgd` filter brings the
//! index up to date before it asks [`schedule`].

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod, ResourceQuota};
use proto::hami::pod_devices::PodDevices;
use proto::hami::register;

use super::fragmentation::Fragmentation;
use crate::convert::{
    Allocation, BadQuota, NodeAnnotations, allocation_of, is_finished, node_annotations, pod_lite,
    quota_limits,
};
use crate::core::fgd::{Shape, ShapeDistribution};
use crate::core::model::{Cluster, Node, NodeId};
use crate::core::policy::{Policy, SchedulerConfig, schedule};
use crate::core::quota::{QuotaBook, QuotaStatus, QuotaUse};
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

/// The cluster model behind `/filter` and `/bind`.
#[derive(Debug)]
pub struct ClusterModel {
    cluster: Cluster,
    config: ModelConfig,
    rng: SplitMix64,
    /// Last register annotation seen per node, so it is decoded only on change.
    registers: HashMap<String, String>,
    /// Allocations waiting for their node to be known.
    waiting: HashMap<String, Allocation>,
    /// Pods whose allocation came from their annotations, by UID.
    observed: HashMap<String, Observed>,
    /// Filter decisions not yet bound: pod UID → node and devices.
    decisions: HashMap<String, Decided>,
    /// ResourceQuota limits per namespace and what each pod is charged.
    quotas: QuotaBook,
    /// The workload's shapes and the fragmentation index, for `fgd`.
    fragmentation: Fragmentation,
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

/// A pod known to hold an allocation.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    namespace: String,
    name: String,
    allocation: Allocation,
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

/// One container's slice of one GPU, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceSnapshot {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Node name.
    pub node: String,
    /// Container index (init containers first).
    pub container_index: usize,
    /// GPU UUID.
    pub uuid: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Cores, percent.
    pub cores: u32,
}

/// A filter decision waiting for its bind.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The node chosen.
    pub node: String,
    /// What each container gets.
    pub devices: PodDevices,
}

impl ClusterModel {
    /// An empty model.
    #[must_use]
    pub fn new(config: ModelConfig) -> Self {
        Self {
            cluster: Cluster::new(Vec::new()),
            rng: SplitMix64::new(config.seed),
            quotas: QuotaBook::new(config.requests.memory_factor),
            config,
            registers: HashMap::new(),
            waiting: HashMap::new(),
            observed: HashMap::new(),
            decisions: HashMap::new(),
            fragmentation: Fragmentation::default(),
            resolved: Resolved::default(),
        }
    }

    /// The core cluster (read-only).
    #[must_use]
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Applies a node from the watch. The register annotation is decoded
    /// only when it changed; a node without one has no GPUs.
    ///
    /// # Errors
    /// The register annotation does not decode; the node keeps its previous GPUs.
    pub fn apply_node(&mut self, node: &KubeNode) -> Result<(), register::RegisterError> {
        let Some(name) = node.metadata.name.as_deref() else {
            return Ok(());
        };
        let NodeAnnotations {
            register: value,
            cordoned,
        } = node_annotations(node);
        if self.registers.get(name) != Some(&value) || self.cluster.node_id(name).is_none() {
            let devices = if value.is_empty() {
                Vec::new()
            } else {
                register::decode(&value)?
            };
            let mut fresh = Node::from_register(name, &devices);
            fresh.set_cordoned(&cordoned);
            let id = self.cluster.upsert_node(fresh);
            self.fragmentation.node_changed(id);
            self.registers.insert(name.to_owned(), value);
            self.replay_waiting(name);
        } else if let Some(id) = self.cluster.node_id(name)
            && let Some(existing) = self.cluster.node(id)
        {
            let mut updated = existing.clone();
            updated.set_cordoned(&cordoned);
            if updated != *existing {
                self.cluster.upsert_node(updated);
                self.fragmentation.node_changed(id);
            }
        }
        Ok(())
    }

    /// A node was deleted: it keeps its name but offers no GPUs.
    pub fn delete_node(&mut self, name: &str) {
        if self.cluster.node_id(name).is_some() {
            let id = self.cluster.upsert_node(Node::from_register(name, &[]));
            self.fragmentation.node_changed(id);
        }
        self.registers.remove(name);
    }

    /// Applies a pod from the watch: a live pod carrying an allocation
    /// (`hami.io/vgpu-node` + `vgpu-devices-allocated`) holds it; a finished
    /// pod releases whatever it held at once.
    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        if is_finished(pod) {
            self.delete_pod(uid);
            return;
        }
        if let Some(allocation) = allocation_of(pod) {
            let who = Observed {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                allocation: allocation.clone(),
            };
            self.quotas.charge(
                uid,
                &who.namespace,
                QuotaUse::of_devices(&allocation.devices, allocation.init_count),
            );
            self.observed.insert(uid.to_owned(), who);
            // Its requests do not change: read its shape once.
            if !self.fragmentation.is_tracked(uid)
                && let Some(shape) = self.shape_of(pod)
            {
                self.fragmentation.track(uid, shape);
            }
            self.observe(uid, allocation);
        }
    }

    /// A pod is gone: release what it held or reserved, and stop counting
    /// its shape.
    pub fn delete_pod(&mut self, uid: &str) {
        self.release_usage(uid);
        self.waiting.remove(uid);
        self.observed.remove(uid);
        self.decisions.remove(uid);
        self.quotas.refund(uid);
        self.fragmentation.untrack(uid);
    }

    /// Pods whose shape the workload counts (for reconciling after a relist).
    pub fn workload_pods(&self) -> impl Iterator<Item = &str> {
        self.fragmentation.tracked()
    }

    /// Stops counting a pod's shape without touching what it holds (a pod
    /// missing from a relist that holds nothing known from annotations).
    pub fn forget_shape(&mut self, uid: &str) {
        self.fragmentation.untrack(uid);
    }

    /// The workload `fgd` places for: the shapes of the GPU pods in the
    /// cluster and of those being scheduled.
    #[must_use]
    pub fn workload(&self) -> &ShapeDistribution {
        self.fragmentation.workload()
    }

    /// Whole rebuilds of the fragmentation index so far.
    #[must_use]
    pub fn fgd_rebuilds(&self) -> u64 {
        self.fragmentation.rebuilds()
    }

    /// The shape of a pod's requests, when they read.
    fn shape_of(&self, pod: &Pod) -> Option<Shape> {
        let lite = pod_lite(pod).ok()?;
        let request = PodRequest::from_pod(&lite, &self.config.requests).ok()?;
        request.wants_gpu().then(|| Shape::of_request(&request))
    }

    /// The node a pod holds or reserved slices on.
    fn pod_node(&self, uid: &str) -> Option<NodeId> {
        self.cluster.pod_usage(uid).map(|u| u.node)
    }

    /// Frees what the pod holds in the ledger and marks its node changed.
    fn release_usage(&mut self, uid: &str) -> bool {
        if let Some(id) = self.pod_node(uid) {
            self.fragmentation.node_changed(id);
        }
        self.cluster.release(uid)
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
        self.quotas.set_quota(namespace, name, limits);
        if bad.is_empty() { Ok(()) } else { Err(bad) }
    }

    /// A ResourceQuota was deleted.
    pub fn delete_quota(&mut self, namespace: &str, name: &str) {
        self.quotas.remove_quota(namespace, name);
    }

    /// Quotas known, as (namespace, name) (for reconciling after a relist).
    pub fn quota_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.quotas.quota_keys()
    }

    /// One namespace's quota limits and use; `None` when it has no quota.
    #[must_use]
    pub fn quota_status(&self, namespace: &str) -> Option<QuotaStatus> {
        self.quotas
            .room(namespace)
            .map(|_| self.quotas.status(namespace))
    }

    /// Every namespace with a quota or GPU use (for metrics).
    #[must_use]
    pub fn quota_snapshot(&self) -> Vec<QuotaStatus> {
        self.quotas.statuses()
    }

    /// Pods known from their annotations (for reconciling after a relist).
    pub fn observed_pods(&self) -> impl Iterator<Item = &str> {
        self.observed.keys().map(String::as_str)
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

    /// A pod relist ended: pods known from their annotations that it did
    /// not deliver are deleted. Pods counted in the fgd workload that it
    /// did not deliver lose only their shape (a pod created after the list
    /// and filtered meanwhile is counted again at its next filter or when
    /// its allocation is seen).
    pub fn reconcile_pods(&mut self, seen: &HashSet<String>) {
        let gone: Vec<String> = self
            .observed_pods()
            .filter(|u| !seen.contains(*u))
            .map(str::to_owned)
            .collect();
        for uid in gone {
            self.delete_pod(&uid);
        }
        let gone: Vec<String> = self
            .workload_pods()
            .filter(|u| !seen.contains(*u))
            .map(str::to_owned)
            .collect();
        for uid in gone {
            self.forget_shape(&uid);
        }
    }

    /// A ResourceQuota relist ended: quotas it did not deliver were deleted.
    pub fn reconcile_quotas(&mut self, seen: &HashSet<(String, String)>) {
        let gone: Vec<(String, String)> = self
            .quota_keys()
            .filter(|(ns, name)| !seen.contains(&((*ns).to_owned(), (*name).to_owned())))
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
            .collect();
        for (ns, name) in gone {
            self.delete_quota(&ns, &name);
        }
    }

    /// Every GPU with its use.
    #[must_use]
    pub fn gpu_snapshot(&self) -> Vec<GpuSnapshot> {
        self.cluster
            .nodes()
            .iter()
            .flat_map(|node| {
                node.gpus
                    .iter()
                    .zip(&node.usage)
                    .map(|(gpu, usage)| GpuSnapshot {
                        node: node.name.clone(),
                        uuid: gpu.uuid.clone(),
                        index: gpu.index,
                        device_type: gpu.device_type.clone(),
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
        let mut out = Vec::new();
        for pod in self.observed.values() {
            for (i, container) in pod.allocation.devices.0.iter().enumerate() {
                for device in container {
                    out.push(SliceSnapshot {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        node: pod.allocation.node.clone(),
                        container_index: i,
                        uuid: device.uuid.clone(),
                        memory_mib: u64::try_from(device.usedmem).unwrap_or(0),
                        cores: u32::try_from(device.usedcores).unwrap_or(0),
                    });
                }
            }
        }
        out
    }

    /// The candidates the model has no GPUs for: never seen by the watch,
    /// or seen without a usable `hami.io/node-nvidia-register` (none yet,
    /// or the handshake marked the node unhealthy).
    pub fn unregistered<'a>(&self, candidates: &'a [String]) -> impl Iterator<Item = &'a String> {
        candidates
            .iter()
            .filter(|n| self.registers.get(n.as_str()).is_none_or(String::is_empty))
    }

    /// Nodes known (for reconciling after a relist).
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.registers.keys().map(String::as_str)
    }

    fn observe(&mut self, uid: &str, allocation: Allocation) {
        self.decisions.remove(uid);
        let Some(id) = self.cluster.node_id(&allocation.node) else {
            self.waiting.insert(uid.to_owned(), allocation);
            return;
        };
        // The allocation replaces whatever the pod held before, maybe elsewhere.
        if let Some(before) = self.pod_node(uid) {
            self.fragmentation.node_changed(before);
        }
        self.fragmentation.node_changed(id);
        // An allocation naming GPUs the node does not (yet) have is a fact we
        // cannot place; keep it until the node registers them.
        if self
            .cluster
            .observe_allocated(
                uid,
                id,
                &allocation.devices,
                allocation.init_count,
                HostResources::default(),
            )
            .is_err()
        {
            self.waiting.insert(uid.to_owned(), allocation);
        } else {
            self.waiting.remove(uid);
        }
    }

    fn replay_waiting(&mut self, node: &str) {
        let ready: Vec<(String, Allocation)> = self
            .waiting
            .iter()
            .filter(|(_, a)| a.node == node)
            .map(|(u, a)| (u.clone(), a.clone()))
            .collect();
        for (uid, allocation) in ready {
            self.waiting.remove(&uid);
            self.observe(&uid, allocation);
        }
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
        // is demand), until it is deleted or finishes.
        self.fragmentation
            .track(&lite.uid, Shape::of_request(&request));
        // HAMi drops the pod's earlier reservation before fitting again.
        self.release_usage(&lite.uid);
        self.decisions.remove(&lite.uid);
        self.quotas.refund(&lite.uid);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        request.constraints.quota = self.quotas.room(namespace);

        let mut failed = BTreeMap::new();
        let mut ids = Vec::with_capacity(candidates.len());
        for (name, id) in candidates.iter().zip(self.resolve(candidates)) {
            match id {
                Some(id) => ids.push(*id),
                None => {
                    failed.insert(name.clone(), "node unregistered".to_owned());
                }
            }
        }
        let name_of =
            |cluster: &Cluster, id| cluster.node(id).map(|n| n.name.clone()).unwrap_or_default();
        // Only an fgd pod touches the index; binpack and spread do no
        // per-node work for it.
        let fgd = request
            .node_policy
            .unwrap_or(self.config.scheduler.node_policy)
            == Policy::Fgd;
        let index = if fgd {
            Some(self.fragmentation.index(&self.cluster))
        } else {
            None
        };
        match schedule(
            &self.cluster,
            &request,
            ids,
            &self.config.scheduler,
            index,
            &mut self.rng,
        ) {
            Ok(decision) => {
                for (id, why) in &decision.failed {
                    failed.insert(name_of(&self.cluster, *id), why.to_string());
                }
                let Some(node) = self.cluster.node(decision.node) else {
                    return FilterOutcome::NoFit { failed };
                };
                let devices = decision.pod_devices(node);
                let node_name = node.name.clone();
                match self.cluster.reserve(
                    &lite.uid,
                    decision.node,
                    &devices,
                    decision.init_count(),
                    HostResources::default(),
                ) {
                    Ok(()) => {
                        self.fragmentation.node_changed(decision.node);
                        self.quotas.charge(
                            &lite.uid,
                            namespace,
                            QuotaUse::of_devices(&devices, decision.init_count()),
                        );
                        self.decisions.insert(
                            lite.uid.clone(),
                            Decided {
                                node: node_name.clone(),
                                devices: devices.clone(),
                            },
                        );
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

    /// The node id of each candidate name (`None`: not registered), from
    /// the previous filter's resolution when the list is the same.
    fn resolve(&mut self, candidates: &[String]) -> &[Option<NodeId>] {
        let nodes = self.cluster.nodes().len();
        let r = &mut self.resolved;
        if r.nodes != nodes || r.names.as_slice() != candidates {
            r.ids = candidates.iter().map(|n| self.cluster.node_id(n)).collect();
            r.names = candidates.to_vec();
            r.nodes = nodes;
        }
        &r.ids
    }

    /// The filter decision waiting for this pod's bind.
    #[must_use]
    pub fn decision(&self, uid: &str) -> Option<&Decided> {
        self.decisions.get(uid)
    }

    /// Marks a pod's reservation bound.
    ///
    /// # Errors
    /// The pod has no reservation (it was never filtered here, or was released).
    pub fn commit(&mut self, uid: &str) -> Result<(), crate::core::reservation::ReservationError> {
        // Usage is unchanged (the reservation already counts), so the
        // fragmentation index has nothing to refresh.
        self.cluster.commit(uid)?;
        self.decisions.remove(uid);
        Ok(())
    }

    /// Drops a pod's reservation (bind failed); harmless when there is none.
    /// The pod's shape still counts: kube-scheduler will filter it again.
    pub fn release(&mut self, uid: &str) -> bool {
        self.decisions.remove(uid);
        self.quotas.refund(uid);
        self.release_usage(uid)
    }

    /// The node a pod holds or reserved slices on.
    #[must_use]
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        let usage = self.cluster.pod_usage(uid)?;
        self.cluster.node(usage.node).map(|n| n.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use proto::hami::keys;
    use proto::hami::register::NodeDevice;
    use serde_json::json;

    use super::*;

    fn config() -> ModelConfig {
        ModelConfig {
            scheduler: SchedulerConfig::default(),
            requests: RequestConfig::default(),
            seed: 7,
        }
    }

    fn kube_node(name: &str, gpus: u32, mem: u32) -> KubeNode {
        let devices: Vec<NodeDevice> = (0..gpus)
            .map(|i| NodeDevice {
                id: format!("GPU-{name}-{i}"),
                index: i,
                count: 10,
                devmem: mem,
                devcore: 100,
                device_type: "NVIDIA-Tesla T4".into(),
                numa: 0,
                mode: "hami-core".into(),
                health: true,
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
            keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()
        }}}))
        .unwrap()
    }

    fn slice_pod(uid: &str, mem: u32, cores: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()}}}]}
        }))
        .unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_slice_is_placed_and_reserved_so_the_next_filter_sees_it() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
        let FilterOutcome::Placed { node, devices, .. } =
            model.filter(&slice_pod("a", 600, 10), &names(&["n1"]))
        else {
            panic!("expected a placement");
        };
        assert_eq!(node, "n1");
        assert_eq!(devices.to_string(), "GPU-n1-0,NVIDIA,600,10:;");
        assert_eq!(model.decision("a").map(|d| d.node.as_str()), Some("n1"));
        // 400 MiB left: a second 600 MiB pod does not fit.
        let FilterOutcome::NoFit { failed } =
            model.filter(&slice_pod("b", 600, 10), &names(&["n1"]))
        else {
            panic!("expected no fit");
        };
        assert_eq!(failed["n1"], "1/1 CardInsufficientMemory");
        // Filtering the first pod again replaces, not doubles, its reservation.
        assert!(matches!(
            model.filter(&slice_pod("a", 600, 10), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
        // Releasing makes room and forgets the decision.
        assert!(model.release("a"));
        assert!(model.decision("a").is_none());
        assert!(matches!(
            model.filter(&slice_pod("b", 600, 10), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
    }

    #[test]
    fn unknown_candidates_are_reported_unregistered() {
        let mut model = ClusterModel::new(config());
        let FilterOutcome::NoFit { failed } =
            model.filter(&slice_pod("a", 100, 10), &names(&["ghost"]))
        else {
            panic!("expected no fit");
        };
        assert_eq!(failed["ghost"], "node unregistered");
        // The same list again, once the node has registered: it is found,
        // not answered from the previous resolution.
        model.apply_node(&kube_node("ghost", 1, 1000)).unwrap();
        assert!(matches!(
            model.filter(&slice_pod("a", 100, 10), &names(&["ghost"])),
            FilterOutcome::Placed { .. }
        ));
        // A different list is resolved afresh.
        let FilterOutcome::Placed { failed, .. } =
            model.filter(&slice_pod("b", 100, 10), &names(&["nobody", "ghost"]))
        else {
            panic!("ghost fits");
        };
        assert_eq!(failed["nobody"], "node unregistered");
    }

    #[test]
    fn pods_without_gpu_pass_and_bad_quantities_are_invalid() {
        let mut model = ClusterModel::new(config());
        let cpu_pod: Pod = serde_json::from_value(
            json!({"metadata": {"uid": "x"}, "spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(
            model.filter(&cpu_pod, &names(&["n1"])),
            FilterOutcome::NoGpuRequested
        );
        let mut bad = slice_pod("y", 1, 1);
        bad.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap()
            .insert(
                "nvidia.com/gpumem".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
            );
        let FilterOutcome::Invalid(why) = model.filter(&bad, &names(&["n1"])) else {
            panic!("expected invalid");
        };
        assert!(why.contains("nvidia.com/gpumem"), "{why}");
    }

    #[test]
    fn allocations_from_annotations_count_and_finished_pods_release_them() {
        let mut model = ClusterModel::new(config());
        // The pod arrives before its node: its allocation waits for the node.
        let mut held = slice_pod("held", 900, 10);
        held.metadata.annotations = Some(BTreeMap::from([
            (keys::VGPU_NODE.to_owned(), "n1".to_owned()),
            (
                keys::VGPU_DEVICES_ALLOCATED.to_owned(),
                "GPU-n1-0,NVIDIA,900,10:;".to_owned(),
            ),
        ]));
        model.apply_pod(&held);
        model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
        assert_eq!(model.node_of("held"), Some("n1"));
        let gpus = model.gpu_snapshot();
        assert_eq!(
            (
                gpus[0].used_slots,
                gpus[0].used_memory_mib,
                gpus[0].used_cores
            ),
            (1, 900, 10)
        );
        let slices = model.slice_snapshot();
        assert_eq!(slices.len(), 1);
        assert_eq!(
            (slices[0].pod.as_str(), slices[0].memory_mib),
            ("held", 900)
        );
        assert!(matches!(
            model.filter(&slice_pod("b", 200, 10), &names(&["n1"])),
            FilterOutcome::NoFit { .. }
        ));
        held.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        model.apply_pod(&held);
        assert_eq!(model.node_of("held"), None);
        assert!(model.slice_snapshot().is_empty());
        assert_eq!(model.gpu_snapshot()[0].used_slots, 0);
        assert!(matches!(
            model.filter(&slice_pod("b", 200, 10), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
    }

    #[test]
    fn a_bad_register_annotation_is_an_error_and_keeps_the_gpus() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
        let broken: KubeNode =
            serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
            keys::NODE_NVIDIA_REGISTER: "[{\"id\":"}}}))
            .unwrap();
        assert!(model.apply_node(&broken).is_err());
        let id = model.cluster().node_id("n1").unwrap();
        assert_eq!(model.cluster().node(id).unwrap().gpus.len(), 2);
    }

    #[test]
    fn a_node_marked_unhealthy_offers_no_gpus_until_requested_again() {
        let mut model = ClusterModel::new(config());
        let mut node = kube_node("n1", 1, 1000);
        let annotations = node.metadata.annotations.as_mut().unwrap();
        annotations.insert(
            keys::NODE_HANDSHAKE.into(),
            "Deleted_2025-07-12 01:12:20".into(),
        );
        model.apply_node(&node).unwrap();
        assert!(matches!(
            model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
            FilterOutcome::NoFit { .. }
        ));
        let annotations = node.metadata.annotations.as_mut().unwrap();
        annotations.insert(
            keys::NODE_HANDSHAKE.into(),
            "Requesting_2025-07-12 01:13:20".into(),
        );
        model.apply_node(&node).unwrap();
        assert!(matches!(
            model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
    }

    fn quota(ns: &str, name: &str, hard: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"hard": hard}
        }))
        .unwrap()
    }

    fn used(model: &ClusterModel, ns: &str) -> (u64, u64) {
        model
            .quota_snapshot()
            .iter()
            .find(|q| q.namespace == ns)
            .map_or((0, 0), |q| (q.used.memory_mib, q.used.cores))
    }

    fn allocated(mut pod: Pod, node: &str, devices: &str) -> Pod {
        pod.metadata.annotations = Some(BTreeMap::from([
            (keys::VGPU_NODE.to_owned(), node.to_owned()),
            (keys::VGPU_DEVICES_ALLOCATED.to_owned(), devices.to_owned()),
        ]));
        pod
    }

    #[test]
    fn quota_use_follows_reservations_allocations_and_finished_pods() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 2, 10_000)).unwrap();
        model
            .apply_quota(&quota(
                "ns",
                "gpu",
                json!({"limits.nvidia.com/gpumem": "5000", "limits.nvidia.com/gpucores": "100"}),
            ))
            .unwrap();
        // A reservation counts at once.
        assert!(matches!(
            model.filter(&slice_pod("a", 3000, 30), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
        assert_eq!(used(&model, "ns"), (3000, 30));
        // The next pod sees only the room left: 2000 MiB.
        let FilterOutcome::NoFit { failed } =
            model.filter(&slice_pod("b", 2500, 10), &names(&["n1"]))
        else {
            panic!("expected no fit");
        };
        assert_eq!(failed["n1"], "2/2 ResourceQuotaNotFit");
        assert_eq!(
            used(&model, "ns"),
            (3000, 30),
            "a failed filter charges nothing"
        );
        // Filtering the same pod again replaces its charge.
        assert!(matches!(
            model.filter(&slice_pod("a", 3000, 30), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
        assert_eq!(used(&model, "ns"), (3000, 30));
        // Released (bind failed): refunded.
        model.release("a");
        assert_eq!(used(&model, "ns"), (0, 0));
        // An allocation from annotations counts; a finished pod refunds it.
        let mut held = allocated(slice_pod("held", 0, 0), "n1", "GPU-n1-0,NVIDIA,4000,20:;");
        model.apply_pod(&held);
        assert_eq!(used(&model, "ns"), (4000, 20));
        held.status = Some(serde_json::from_value(json!({"phase": "Failed"})).unwrap());
        model.apply_pod(&held);
        assert_eq!(used(&model, "ns"), (0, 0));
        // A deleted pod refunds too, and other namespaces are not charged here.
        model.apply_pod(&allocated(
            slice_pod("gone", 0, 0),
            "n1",
            "GPU-n1-1,NVIDIA,1000,10:;",
        ));
        assert_eq!(used(&model, "ns"), (1000, 10));
        model.delete_pod("gone");
        assert_eq!(used(&model, "ns"), (0, 0));
    }

    #[test]
    fn the_tightest_quota_wins_and_deleting_it_loosens_the_limit() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 1, 10_000)).unwrap();
        model
            .apply_quota(&quota(
                "ns",
                "wide",
                json!({"limits.nvidia.com/gpumem": "8000", "pods": "10"}),
            ))
            .unwrap();
        model
            .apply_quota(&quota(
                "ns",
                "tight",
                json!({"limits.nvidia.com/gpumem": "2Ki"}),
            ))
            .unwrap();
        let status = model.quota_status("ns").unwrap();
        assert_eq!(status.limits.memory_mib, Some(2048));
        assert_eq!(status.limits.cores, None);
        assert!(matches!(
            model.filter(&slice_pod("a", 3000, 10), &names(&["n1"])),
            FilterOutcome::NoFit { .. }
        ));
        model.delete_quota("ns", "tight");
        assert_eq!(
            model.quota_status("ns").unwrap().limits.memory_mib,
            Some(8000)
        );
        assert!(matches!(
            model.filter(&slice_pod("a", 3000, 10), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
        model.delete_quota("ns", "wide");
        assert_eq!(model.quota_status("ns"), None);
        assert_eq!(model.quota_keys().count(), 0);
    }

    #[test]
    fn a_quota_without_our_keys_or_with_a_bad_value_limits_nothing() {
        let mut model = ClusterModel::new(config());
        model
            .apply_quota(&quota(
                "ns",
                "cpu",
                json!({"limits.cpu": "4", "requests.nvidia.com/gpumem": "10"}),
            ))
            .unwrap();
        assert_eq!(model.quota_status("ns"), None);
        let bad = model
            .apply_quota(&quota(
                "ns",
                "typo",
                json!({"limits.nvidia.com/gpumem": "lots", "limits.nvidia.com/gpucores": "50"}),
            ))
            .unwrap_err();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].key, "limits.nvidia.com/gpumem");
        assert!(bad[0].to_string().contains("ns/typo"), "{}", bad[0]);
        let status = model.quota_status("ns").unwrap();
        assert_eq!(
            (status.limits.memory_mib, status.limits.cores),
            (None, Some(50))
        );
    }

    #[test]
    fn quota_keys_follow_the_configured_resource_names() {
        let mut cfg = config();
        cfg.requests.names.resource_mem = "example.com/vmem".into();
        let mut model = ClusterModel::new(cfg);
        model
            .apply_quota(&quota(
                "ns",
                "q",
                json!({"limits.nvidia.com/gpumem": "10", "limits.example.com/vmem": "20"}),
            ))
            .unwrap();
        assert_eq!(
            model.quota_status("ns").unwrap().limits.memory_mib,
            Some(20)
        );
    }

    fn fgd_config() -> ModelConfig {
        let mut cfg = config();
        cfg.scheduler.node_policy = Policy::Fgd;
        cfg
    }

    fn annotated(mut pod: Pod, key: &str, value: &str) -> Pod {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        pod
    }

    fn placed_on(outcome: &FilterOutcome) -> &str {
        match outcome {
            FilterOutcome::Placed { node, .. } => node,
            other => panic!("expected a placement, got {other:?}"),
        }
    }

    /// Nodes a and b of one 1000 MiB GPU: a holds a 500 slice, b a 300 one.
    fn half_and_third_used(cfg: ModelConfig) -> ClusterModel {
        let mut model = ClusterModel::new(cfg);
        model.apply_node(&kube_node("a", 1, 1000)).unwrap();
        model.apply_node(&kube_node("b", 1, 1000)).unwrap();
        model.apply_pod(&allocated(
            slice_pod("on-a", 500, 50),
            "a",
            "GPU-a-0,NVIDIA,500,50:;",
        ));
        model.apply_pod(&allocated(
            slice_pod("on-b", 300, 30),
            "b",
            "GPU-b-0,NVIDIA,300,30:;",
        ));
        model
    }

    #[test]
    fn a_pod_annotated_fgd_goes_where_fragmentation_grows_least_not_to_the_fullest_node() {
        // Workload {500, 300, 200 milli}, a third each (the pod counts
        // itself). A 200 pod on a leaves 300 idle, a fragment for the 500
        // shape: +300/3. On b it leaves 500, usable by every shape: +0.
        // Binpack takes the fuller node, a.
        let mut model = half_and_third_used(config());
        let binpack = model.filter(&slice_pod("p", 200, 20), &names(&["a", "b"]));
        assert_eq!(placed_on(&binpack), "a");

        let mut model = half_and_third_used(config());
        let pod = annotated(
            slice_pod("p", 200, 20),
            crate::core::request::NODE_POLICY,
            "fgd",
        );
        let fgd = model.filter(&pod, &names(&["a", "b"]));
        assert_eq!(placed_on(&fgd), "b");
        assert_eq!(model.workload().total(), 3);
        assert_eq!(model.fgd_rebuilds(), 1);
    }

    #[test]
    fn the_cluster_default_fgd_places_the_first_pod_on_an_empty_cluster() {
        let mut model = ClusterModel::new(fgd_config());
        model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
        assert!(model.workload().is_empty());
        let outcome = model.filter(&slice_pod("first", 300, 30), &names(&["n1"]));
        assert_eq!(placed_on(&outcome), "n1");
        assert_eq!(model.workload().total(), 1, "placed for its own shape");
    }

    #[test]
    fn the_workload_grows_with_filtered_and_allocated_pods_and_shrinks_as_they_leave() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
        let total = |m: &ClusterModel| m.workload().total();
        // Filtered: counted once however often it is filtered or released.
        model.filter(&slice_pod("a", 300, 30), &names(&["n1"]));
        model.filter(&slice_pod("a", 300, 30), &names(&["n1"]));
        model.release("a");
        assert_eq!(total(&model), 1);
        // Filtered without a fit: still demand, still counted.
        let big = model.filter(&slice_pod("big", 2000, 30), &names(&["n1"]));
        assert!(matches!(big, FilterOutcome::NoFit { .. }));
        assert_eq!(total(&model), 2);
        // Known from its annotations (as after a restart), seen twice.
        let mut held = allocated(slice_pod("held", 400, 40), "n1", "GPU-n1-0,NVIDIA,400,40:;");
        model.apply_pod(&held);
        model.apply_pod(&held);
        assert_eq!(total(&model), 3);
        assert_eq!(model.workload().len(), 2, "300 and 400 milli pods");
        // A CPU-only pod is not part of the GPU workload.
        let cpu_pod: Pod = serde_json::from_value(
            json!({"metadata": {"uid": "cpu"}, "spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        model.filter(&cpu_pod, &names(&["n1"]));
        assert_eq!(total(&model), 3);
        // Finished, deleted: forgotten.
        held.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        model.apply_pod(&held);
        assert_eq!(total(&model), 2);
        model.delete_pod("a");
        model.delete_pod("a");
        model.forget_shape("big");
        assert_eq!(total(&model), 0);
        assert_eq!(model.workload_pods().count(), 0);
    }

    #[test]
    fn consecutive_fgd_filters_see_each_others_reservations() {
        // 30 pods of 600 milli and 10 of 400 on a big node keep the
        // workload large enough that the filters below refresh the index
        // instead of rebuilding it.
        let mut model = ClusterModel::new(fgd_config());
        model.apply_node(&kube_node("big", 40, 1000)).unwrap();
        for i in 0..40 {
            let (mem, cores) = if i < 30 { (600, 60) } else { (400, 40) };
            model.apply_pod(&allocated(
                slice_pod(&format!("w{i}"), mem, cores),
                "big",
                &format!("GPU-big-{i},NVIDIA,{mem},{cores}:;"),
            ));
        }
        model.apply_node(&kube_node("x", 1, 1000)).unwrap();
        model.apply_node(&kube_node("y", 1, 1000)).unwrap();
        model.apply_pod(&allocated(
            slice_pod("on-y", 500, 50),
            "y",
            "GPU-y-0,NVIDIA,500,50:;",
        ));
        let xy = names(&["x", "y"]);
        // p1 (600) fits only x.
        assert_eq!(
            placed_on(&model.filter(&slice_pod("p1", 600, 60), &xy)),
            "x"
        );
        assert_eq!(model.fgd_rebuilds(), 1);
        // p2 (400) fills x exactly and removes its 400 fragment; on y it
        // would leave 100 idle. Only an index that saw p1's reservation
        // knows x has a fragment to remove (a stale one shows x empty and
        // sends p2 to y).
        assert_eq!(
            placed_on(&model.filter(&slice_pod("p2", 400, 40), &xy)),
            "x"
        );
        assert_eq!(model.fgd_rebuilds(), 1, "refreshed, not rebuilt");
        // x is now full: nothing more lands there, nothing is double-booked.
        let FilterOutcome::NoFit { failed } = model.filter(&slice_pod("p3", 600, 60), &xy) else {
            panic!("expected no fit");
        };
        assert_eq!(failed["x"], "1/1 CardInsufficientMemory");
        let x = model
            .gpu_snapshot()
            .into_iter()
            .find(|g| g.node == "x")
            .unwrap();
        assert_eq!((x.used_memory_mib, x.used_cores), (1000, 100));
        // Releasing p2 is seen by the next fgd filter: x takes a 400 again.
        model.release("p2");
        assert_eq!(
            placed_on(&model.filter(&slice_pod("p4", 400, 40), &xy)),
            "x"
        );
    }

    #[test]
    fn fgd_filters_never_over_commit_a_gpu() {
        let mut model = ClusterModel::new(fgd_config());
        model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
        model.apply_node(&kube_node("n2", 1, 1000)).unwrap();
        let all = names(&["n1", "n2"]);
        let mut placed = 0;
        for i in 0..12 {
            let cores = [30, 50, 20, 70][i % 4];
            let outcome = model.filter(&slice_pod(&format!("p{i}"), cores * 10, cores), &all);
            if matches!(outcome, FilterOutcome::Placed { .. }) {
                placed += 1;
            }
            for g in model.gpu_snapshot() {
                assert!(
                    g.used_memory_mib <= g.memory_mib && g.used_cores <= g.cores,
                    "{g:?}"
                );
            }
        }
        assert!(placed >= 5, "{placed}");
    }

    #[test]
    fn cordoned_gpus_are_skipped() {
        let mut model = ClusterModel::new(config());
        let mut node = kube_node("n1", 1, 1000);
        node.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::DEVICE_CORDON.into(), "GPU-n1-0".into());
        model.apply_node(&node).unwrap();
        let FilterOutcome::NoFit { failed } =
            model.filter(&slice_pod("a", 100, 10), &names(&["n1"]))
        else {
            panic!("expected no fit");
        };
        assert_eq!(failed["n1"], "1/1 CardCordoned");
    }

    fn seen(list: &[&str]) -> HashSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_node_relist_deletes_the_nodes_it_did_not_deliver() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
        model.apply_node(&kube_node("n2", 1, 1000)).unwrap();
        model.reconcile_nodes(&seen(&["n1"]));
        assert_eq!(model.node_names().collect::<Vec<_>>(), ["n1"]);
        assert_eq!(
            model
                .unregistered(&names(&["n1", "n2"]))
                .collect::<Vec<_>>(),
            ["n2"]
        );
        assert!(matches!(
            model.filter(&slice_pod("a", 100, 10), &names(&["n2"])),
            FilterOutcome::NoFit { .. }
        ));
        model.reconcile_nodes(&seen(&["n1"]));
        assert_eq!(
            model.node_names().count(),
            1,
            "a second relist changes nothing"
        );
    }

    #[test]
    fn a_pod_relist_releases_vanished_allocations_and_forgets_vanished_shapes_only() {
        let mut model = ClusterModel::new(config());
        model.apply_node(&kube_node("n1", 2, 10_000)).unwrap();
        model.apply_pod(&allocated(
            slice_pod("held", 0, 0),
            "n1",
            "GPU-n1-0,NVIDIA,4000,20:;",
        ));
        model.apply_pod(&allocated(
            slice_pod("kept", 0, 0),
            "n1",
            "GPU-n1-1,NVIDIA,1000,10:;",
        ));
        assert!(matches!(
            model.filter(&slice_pod("filtered", 500, 5), &names(&["n1"])),
            FilterOutcome::Placed { .. }
        ));
        assert_eq!(used(&model, "ns"), (5500, 35));
        model.reconcile_pods(&seen(&["kept"]));
        // "held" vanished: released and refunded.
        assert_eq!(model.node_of("held"), None);
        assert_eq!(model.observed_pods().collect::<Vec<_>>(), ["kept"]);
        // "filtered" (created after the list) keeps its reservation and
        // charge; only its shape is dropped from the workload.
        assert_eq!(model.node_of("filtered"), Some("n1"));
        assert!(model.decision("filtered").is_some());
        assert_eq!(used(&model, "ns"), (1500, 15));
        assert_eq!(model.workload_pods().collect::<Vec<_>>(), ["kept"]);
    }

    #[test]
    fn a_quota_relist_drops_the_quotas_it_did_not_deliver() {
        let mut model = ClusterModel::new(config());
        for name in ["tight", "wide"] {
            model
                .apply_quota(&quota(
                    "ns",
                    name,
                    json!({"limits.nvidia.com/gpumem": "1000"}),
                ))
                .unwrap();
        }
        model.reconcile_quotas(&HashSet::from([("ns".to_owned(), "wide".to_owned())]));
        assert_eq!(model.quota_keys().collect::<Vec<_>>(), [("ns", "wide")]);
        model.reconcile_quotas(&HashSet::new());
        assert_eq!(model.quota_status("ns"), None);
    }
}

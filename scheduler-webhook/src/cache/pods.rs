//! Every pod the scheduler knows, one [`PodRecord`] per UID, and the sums
//! taken over them.
//!
//! Owns: each pod's record (who it is, the shape it counts in the
//! workload, what its namespace's quota is charged for it, and its
//! [`Stage`]); each namespace's quota use ([`QuotaBook`]) and the workload
//! with its fragmentation index ([`Fragmentation`]), which are sums over
//! the records. The pod's slices live in the core [`Cluster`]'s ledger; a
//! record's stage says whether the ledger holds them.
//!
//! A record changes only through the transitions below, and each one moves
//! the ledger, the quota sum and the workload in the same step, so none can
//! drift from the others:
//!
//! ```text
//!           filtering ──► Demand ◄──────────── bind_failed
//!                           │                       ▲
//!                        reserve ──► Reserved ──────┤
//!                                       │ bound     │
//!                                       ▼           │
//!   allocated (annotations seen) ──► Allocated ◄── Bound
//!   remove (deleted or finished): from any stage, the record is gone
//! ```
//!
//! `filtering` from any stage drops what the pod held first (HAMi drops a
//! pod's reservation before it fits it again); `allocated` from any stage
//! replaces what it held with what its annotations say.
//! [`PodBook::check`] states the invariants; the tests run it after every
//! step.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use proto::hami::mig::MigAllocation;
use proto::hami::pod_devices::PodDevices;

use super::fragmentation::Fragmentation;
use crate::convert::Allocation;
use crate::core::fgd::{FgdIndex, Shape, ShapeDistribution};
use crate::core::model::{Cluster, NodeId};
use crate::core::quota::{QuotaBook, QuotaLimits, QuotaRoom, QuotaStatus, QuotaUse};
use crate::core::reservation::{HostResources, ReservationError};

/// A filter decision waiting for its bind.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The node chosen.
    pub node: String,
    /// What each container gets.
    pub devices: PodDevices,
    /// The MIG instance of each entry on a MIG GPU, filled in by
    /// [`PodBook::reserve`] from the ledger (written at bind as
    /// `hami.io/vgpu-mig-allocations`); empty without MIG entries.
    pub mig: Vec<MigAllocation>,
}

/// Where a pod is, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Holds nothing: counted as demand only (filtered without a fit, or
    /// its bind failed; kube-scheduler will filter it again).
    Demand,
    /// A filter reserved these slices; the bind has not run yet.
    Reserved(Decided),
    /// Bound here; its annotations are not seen yet.
    Bound(Decided),
    /// Its annotations name this allocation. `placed` once the ledger
    /// holds it; an allocation on a node or GPUs not registered yet waits
    /// (it is a fact, placed as soon as they register).
    Allocated {
        /// The allocation, as annotated.
        allocation: Allocation,
        /// Whether the ledger holds it.
        placed: bool,
    },
}

impl Stage {
    /// The node a bind is in flight to: filtered there (`Reserved`) or
    /// bound there with its annotations not seen yet (`Bound`).
    #[must_use]
    pub fn in_flight_to(&self) -> Option<&str> {
        match self {
            Self::Reserved(d) | Self::Bound(d) => Some(&d.node),
            Self::Demand | Self::Allocated { .. } => None,
        }
    }

    /// Whether the ledger holds slices for a pod at this stage.
    #[must_use]
    pub fn holds(&self) -> bool {
        match self {
            Self::Demand => false,
            Self::Reserved(_) | Self::Bound(_) => true,
            Self::Allocated { placed, .. } => *placed,
        }
    }
}

/// One pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    /// Namespace (its quota is charged).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The shape counted for it in the workload; `None`: not counted.
    /// Shared with every record of the same shape (see [`PodBook`]).
    shape: Option<Arc<Shape>>,
    /// What its namespace's quota use counts for it.
    charge: QuotaUse,
    stage: Stage,
    /// The book's filter count at its last filter (0: never filtered here).
    filtered: u64,
    /// Why its last filter found no node, while it holds nothing (boxed:
    /// rare, and the record is stored inline in a map of every pod).
    refusal: Option<Box<Refusal>>,
}

impl PodRecord {
    /// Where the pod is.
    #[must_use]
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// The shape counted for it in the workload.
    #[must_use]
    pub fn shape(&self) -> Option<&Shape> {
        self.shape.as_deref()
    }

    /// What its namespace's quota is charged for it.
    #[must_use]
    pub fn charge(&self) -> QuotaUse {
        self.charge
    }

    /// Why its last filter found no node (`None` once it holds slices).
    #[must_use]
    pub fn refusal(&self) -> Option<&Refusal> {
        self.refusal.as_deref()
    }

    /// Counts nothing, holds nothing, is charged nothing: not worth keeping.
    fn is_empty(&self) -> bool {
        self.shape.is_none() && self.charge == QuotaUse::default() && self.stage == Stage::Demand
    }
}

/// Why a pod's last filter found no node, summarized by reason as HAMi's
/// event words it ("3 nodes: CardInsufficientMemory"): one entry per
/// reason, with the number of candidates that gave it, most first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Candidates refused.
    pub nodes: usize,
    /// Reason and how many candidates gave it, most first.
    pub reasons: Vec<(String, usize)>,
    /// The book's filter count at the refusal (orders refusals in time).
    pub at_filter: u64,
}

impl Refusal {
    /// Summarizes a filter's per-node reasons (`"2/8 CardInsufficientMemory,
    /// 6/8 CardTypeMismatch"`): each node counts once per reason it names.
    #[must_use]
    pub fn of(failed: &BTreeMap<String, String>, at_filter: u64) -> Self {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for why in failed.values() {
            let mut named: Vec<&str> = why
                .split(", ")
                .map(|part| match part.split_once(' ') {
                    // "2/8 CardInsufficientMemory": the card count goes.
                    Some((n, reason))
                        if n.contains('/')
                            && n.bytes().all(|b| b == b'/' || b.is_ascii_digit()) =>
                    {
                        reason
                    }
                    _ => part,
                })
                .collect();
            named.sort_unstable();
            named.dedup();
            for reason in named {
                *counts.entry(reason).or_default() += 1;
            }
        }
        let mut reasons: Vec<(String, usize)> =
            counts.into_iter().map(|(r, n)| (r.to_owned(), n)).collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Self {
            nodes: failed.len(),
            reasons,
            at_filter,
        }
    }
}

impl std::fmt::Display for Refusal {
    /// `"3 nodes: CardInsufficientMemory; 1 node: node unregistered"`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (reason, n)) in self.reasons.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let nodes = if *n == 1 { "node" } else { "nodes" };
            write!(f, "{n} {nodes}: {reason}")?;
        }
        Ok(())
    }
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
    /// Container position (init containers first).
    pub container_index: usize,
    /// GPU UUID.
    pub uuid: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Cores, percent.
    pub cores: u32,
    /// The MIG instance the slice is, once the device plugin created it
    /// (its `hami.io/vgpu-mig-allocations` entry with the runtime identity).
    pub mig: Option<MigAllocation>,
}

/// The records and the sums over them.
#[derive(Debug)]
pub struct PodBook {
    records: HashMap<String, PodRecord>,
    /// UIDs whose stage is `Allocated { placed: false }`: looked at when a
    /// node registers, so a registration does not scan every record.
    unplaced: HashSet<String>,
    quotas: QuotaBook,
    fragmentation: Fragmentation,
    /// One copy of each shape a record holds: 80,000 pods share a few
    /// shapes, and a pointer keeps each record (stored inline in
    /// `records`) 40 bytes smaller.
    shapes: HashSet<Arc<Shape>>,
    /// Filters so far: each record remembers the count at its last filter.
    filters: u64,
    /// Per node, the records whose bind is in flight to it
    /// ([`Stage::in_flight_to`]).
    in_flight: HashMap<String, u32>,
}

impl PodBook {
    /// No pods; quota memory limits are scaled by `memory_factor`.
    #[must_use]
    pub fn new(memory_factor: u32) -> Self {
        Self {
            records: HashMap::new(),
            unplaced: HashSet::new(),
            quotas: QuotaBook::new(memory_factor),
            fragmentation: Fragmentation::default(),
            shapes: HashSet::new(),
            filters: 0,
            in_flight: HashMap::new(),
        }
    }

    /// The pod's record.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<&PodRecord> {
        self.records.get(uid)
    }

    /// Number of records.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no pod is known.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    // === Transitions ===

    /// A filter of the pod starts: its shape counts in the workload from
    /// now on (placed or not, it is demand) and whatever it held or
    /// reserved is dropped.
    pub fn filtering(
        &mut self,
        cluster: &mut Cluster,
        uid: &str,
        namespace: &str,
        name: &str,
        shape: Shape,
    ) {
        self.filters += 1;
        self.entry(uid, namespace, name).filtered = self.filters;
        self.count_shape(uid, shape);
        self.drop_hold(cluster, uid);
    }

    /// The filter chose `node`: reserve the slices and charge the quota.
    ///
    /// # Errors
    /// The ledger refuses the reservation (unknown GPU, or it would
    /// over-commit); the record is unchanged.
    pub fn reserve(
        &mut self,
        cluster: &mut Cluster,
        uid: &str,
        node: NodeId,
        decided: Decided,
        init_count: usize,
    ) -> Result<(), ReservationError> {
        if !self.records.contains_key(uid) {
            return Err(ReservationError::UnknownPod(uid.to_owned()));
        }
        self.mark_pod_node(cluster, uid);
        cluster.reserve(
            uid,
            node,
            &decided.devices,
            init_count,
            HostResources::default(),
        )?;
        let mut decided = decided;
        decided.mig = cluster.mig_instances(uid).to_vec();
        self.fragmentation.node_changed(node);
        self.set_charge(uid, QuotaUse::of_devices(&decided.devices, init_count));
        self.set_stage(uid, Stage::Reserved(decided));
        Ok(())
    }

    /// The bind succeeded: the reservation is committed.
    ///
    /// # Errors
    /// The pod has no reservation (never filtered here, or released since).
    pub fn bound(&mut self, cluster: &mut Cluster, uid: &str) -> Result<(), ReservationError> {
        let Some(Stage::Reserved(decided)) = self.records.get(uid).map(|r| r.stage.clone()) else {
            return Err(ReservationError::UnknownPod(uid.to_owned()));
        };
        // Usage is unchanged (the reservation already counts), so the
        // fragmentation index has nothing to refresh.
        cluster.commit(uid)?;
        self.set_stage(uid, Stage::Bound(decided));
        Ok(())
    }

    /// The bind failed: the reservation is freed and the quota refunded;
    /// the shape still counts (kube-scheduler will filter the pod again).
    /// `false` when the pod held nothing.
    pub fn bind_failed(&mut self, cluster: &mut Cluster, uid: &str) -> bool {
        let freed = self.drop_hold(cluster, uid);
        self.tidy(uid);
        freed
    }

    /// The pod's annotations name `allocation`: it replaces whatever the
    /// pod held or reserved, its quota is charged for it, and its shape
    /// (read once, by `shape`) counts if it did not already.
    pub fn allocated(
        &mut self,
        cluster: &mut Cluster,
        uid: &str,
        namespace: &str,
        name: &str,
        allocation: Allocation,
        shape: impl FnOnce() -> Option<Shape>,
    ) {
        let record = self.entry(uid, namespace, name);
        if record.shape.is_none()
            && let Some(shape) = shape()
        {
            self.count_shape(uid, shape);
        }
        self.set_charge(
            uid,
            QuotaUse::of_devices(&allocation.devices, allocation.init_count),
        );
        self.place(cluster, uid, allocation);
    }

    /// A node registered or changed its GPUs: allocations that waited for
    /// it are placed.
    pub fn node_registered(&mut self, cluster: &mut Cluster, node: &str) {
        let ready: Vec<(String, Allocation)> = self
            .unplaced
            .iter()
            .filter_map(|uid| match self.records.get(uid).map(|r| &r.stage) {
                Some(Stage::Allocated { allocation, .. }) if allocation.node == node => {
                    Some((uid.clone(), allocation.clone()))
                }
                _ => None,
            })
            .collect();
        for (uid, allocation) in ready {
            self.place(cluster, &uid, allocation);
        }
    }

    /// The pod was deleted or finished: what it held is freed, its quota
    /// refunded, its shape no longer counts, and the record is gone.
    pub fn remove(&mut self, cluster: &mut Cluster, uid: &str) {
        self.drop_hold(cluster, uid);
        if let Some(record) = self.records.remove(uid)
            && let Some(shape) = record.shape
        {
            self.uncount_shape(shape);
        }
        self.unplaced.remove(uid);
    }

    /// A relist did not deliver the pod, which holds nothing known from
    /// its annotations: its shape stops counting (what it reserved stays;
    /// a pod created after the list is counted again at its next filter).
    pub fn forget_shape(&mut self, uid: &str) {
        if let Some(shape) = self.records.get_mut(uid).and_then(|r| r.shape.take()) {
            self.uncount_shape(shape);
        }
        self.tidy(uid);
    }

    // === Queries ===

    /// The filter decision waiting for this pod's bind.
    #[must_use]
    pub fn decision(&self, uid: &str) -> Option<&Decided> {
        match &self.records.get(uid)?.stage {
            Stage::Reserved(decided) => Some(decided),
            _ => None,
        }
    }

    /// Pods whose allocation is known from their annotations.
    pub fn allocated_pods(&self) -> impl Iterator<Item = &str> {
        self.records
            .iter()
            .filter(|(_, r)| matches!(r.stage, Stage::Allocated { .. }))
            .map(|(uid, _)| uid.as_str())
    }

    /// Filters so far; a mark to compare records' last filters with.
    #[must_use]
    pub fn filters(&self) -> u64 {
        self.filters
    }

    /// Pods filtered here whose last filter came no later than `mark` (a
    /// [`Self::filters`] value).
    pub fn filtered_by(&self, mark: u64) -> impl Iterator<Item = &str> {
        self.records
            .iter()
            .filter(move |(_, r)| r.filtered != 0 && r.filtered <= mark)
            .map(|(uid, _)| uid.as_str())
    }

    /// Pods whose last filter came after `mark` (a [`Self::filters`]
    /// value): maybe newer than a list started at the mark.
    pub fn filtered_after(&self, mark: u64) -> impl Iterator<Item = &str> {
        self.records
            .iter()
            .filter(move |(_, r)| r.filtered > mark)
            .map(|(uid, _)| uid.as_str())
    }

    /// Pods that hold nothing and whose last filter found no node, with why.
    pub fn refused(&self) -> impl Iterator<Item = (&str, &PodRecord, &Refusal)> {
        self.records.iter().filter_map(|(uid, r)| {
            let refusal = r.refusal.as_deref()?;
            (r.stage == Stage::Demand).then_some((uid.as_str(), r, refusal))
        })
    }

    /// Remembers why the pod's last filter found no node (replacing the
    /// previous refusal); forgotten once the pod holds slices or is gone.
    pub fn refuse(&mut self, uid: &str, failed: &BTreeMap<String, String>) {
        let at = self.filters;
        if let Some(record) = self.records.get_mut(uid) {
            record.refusal = Some(Box::new(Refusal::of(failed, at)));
        }
    }

    /// Pods whose shape the workload counts.
    pub fn counted_pods(&self) -> impl Iterator<Item = &str> {
        self.records
            .iter()
            .filter(|(_, r)| r.shape.is_some())
            .map(|(uid, _)| uid.as_str())
    }

    /// Every container slice of every pod known from its annotations.
    #[must_use]
    pub fn slices(&self) -> Vec<SliceSnapshot> {
        let mut out = Vec::new();
        for record in self.records.values() {
            let Stage::Allocated { allocation, .. } = &record.stage else {
                continue;
            };
            for (i, container) in allocation.devices.0.iter().enumerate() {
                for (d, device) in container.iter().enumerate() {
                    let mig = allocation
                        .mig
                        .iter()
                        .find(|m| {
                            m.runtime.is_some()
                                && usize::try_from(m.container_index).is_ok_and(|c| c == i)
                                && usize::try_from(m.device_index).is_ok_and(|x| x == d)
                        })
                        .cloned();
                    out.push(SliceSnapshot {
                        namespace: record.namespace.clone(),
                        pod: record.name.clone(),
                        node: allocation.node.clone(),
                        container_index: i,
                        uuid: device.uuid.clone(),
                        memory_mib: u64::try_from(device.usedmem).unwrap_or(0),
                        cores: u32::try_from(device.usedcores).unwrap_or(0),
                        mig,
                    });
                }
            }
        }
        out
    }

    // === Quotas ===

    /// Records (or replaces) one ResourceQuota's limits.
    pub fn set_quota(&mut self, namespace: &str, name: &str, limits: QuotaLimits) {
        self.quotas.set_quota(namespace, name, limits);
    }

    /// Forgets one ResourceQuota.
    pub fn remove_quota(&mut self, namespace: &str, name: &str) {
        self.quotas.remove_quota(namespace, name);
    }

    /// Every quota known, as (namespace, name).
    pub fn quota_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.quotas.quota_keys()
    }

    /// What is left for one pod in `namespace` (`None`: no quota there).
    #[must_use]
    pub fn quota_room(&self, namespace: &str) -> Option<QuotaRoom> {
        self.quotas.room(namespace)
    }

    /// One namespace's limits and use; `None` when it has no quota.
    #[must_use]
    pub fn quota_status(&self, namespace: &str) -> Option<QuotaStatus> {
        self.quotas
            .room(namespace)
            .map(|_| self.quotas.status(namespace))
    }

    /// Every namespace with a quota or GPU use.
    #[must_use]
    pub fn quota_statuses(&self) -> Vec<QuotaStatus> {
        self.quotas.statuses()
    }

    // === Workload and fragmentation ===

    /// The node's GPUs or usage changed outside a pod transition (a node
    /// registered or was deleted).
    pub fn node_changed(&mut self, id: NodeId) {
        self.fragmentation.node_changed(id);
    }

    /// The fragmentation index, up to date with `cluster`.
    pub fn fgd_index(&mut self, cluster: &Cluster) -> &mut FgdIndex {
        self.fragmentation.index(cluster)
    }

    /// The shapes of the pods counted.
    #[must_use]
    pub fn workload(&self) -> &ShapeDistribution {
        self.fragmentation.workload()
    }

    /// Whole rebuilds of the fragmentation index so far.
    #[must_use]
    pub fn fgd_rebuilds(&self) -> u64 {
        self.fragmentation.rebuilds()
    }

    /// Checks that the sums and the ledger agree with the records: each
    /// namespace's quota use is the sum of its records' charges, the
    /// workload is the sum of the shapes counted, the ledger holds exactly
    /// the pods whose stage holds, and `unplaced` lists exactly the
    /// unplaced allocations.
    ///
    /// # Errors
    /// The first disagreement found.
    pub fn check(&self, cluster: &Cluster) -> Result<(), String> {
        let mut used: BTreeMap<&str, QuotaUse> = BTreeMap::new();
        let mut workload = ShapeDistribution::default();
        let mut held = 0;
        for (uid, record) in &self.records {
            if record.is_empty() {
                return Err(format!("{uid}: an empty record was kept"));
            }
            let entry = used.entry(&record.namespace).or_default();
            entry.memory_mib += record.charge.memory_mib;
            entry.cores += record.charge.cores;
            if let Some(shape) = &record.shape {
                workload.observe(Shape::clone(shape));
            }
            if record.stage.holds() != cluster.pod_usage(uid).is_some() {
                return Err(format!(
                    "{uid}: stage {:?} but the ledger {} it",
                    record.stage,
                    if record.stage.holds() {
                        "does not hold"
                    } else {
                        "holds"
                    }
                ));
            }
            held += usize::from(record.stage.holds());
            let unplaced = matches!(record.stage, Stage::Allocated { placed: false, .. });
            if unplaced != self.unplaced.contains(uid) {
                return Err(format!("{uid}: unplaced index out of step"));
            }
        }
        if held != cluster.pod_count() {
            return Err(format!(
                "the ledger holds {} pods, the records {held}",
                cluster.pod_count()
            ));
        }
        for (namespace, sum) in &used {
            if self.quotas.used(namespace) != *sum {
                return Err(format!(
                    "{namespace}: quota use {:?}, records {sum:?}",
                    self.quotas.used(namespace)
                ));
            }
        }
        if self
            .quotas
            .statuses()
            .iter()
            .any(|s| s.used != QuotaUse::default() && !used.contains_key(s.namespace.as_str()))
        {
            return Err("a namespace is charged with no record".to_owned());
        }
        let mut in_flight: HashMap<String, u32> = HashMap::new();
        for record in self.records.values() {
            if let Some(node) = record.stage.in_flight_to() {
                *in_flight.entry(node.to_owned()).or_default() += 1;
            }
        }
        if in_flight != self.in_flight {
            return Err(format!(
                "binds in flight per node {:?}, records {in_flight:?}",
                self.in_flight
            ));
        }
        if workload != *self.fragmentation.workload() {
            return Err("the workload differs from the records' shapes".to_owned());
        }
        if self.shapes.len() != workload.len() {
            return Err(format!(
                "{} shapes kept for {} distinct shapes counted",
                self.shapes.len(),
                workload.len()
            ));
        }
        Ok(())
    }

    // === Helpers: each keeps one sum in step with one field ===

    fn entry(&mut self, uid: &str, namespace: &str, name: &str) -> &mut PodRecord {
        self.records
            .entry(uid.to_owned())
            .or_insert_with(|| PodRecord {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                shape: None,
                charge: QuotaUse::default(),
                stage: Stage::Demand,
                filtered: 0,
                refusal: None,
            })
    }

    fn count_shape(&mut self, uid: &str, shape: Shape) {
        let Some(record) = self.records.get_mut(uid) else {
            return;
        };
        if record.shape.as_deref() == Some(&shape) {
            return;
        }
        let shared = match self.shapes.get(&shape) {
            Some(s) => Arc::clone(s),
            None => {
                let s = Arc::new(shape.clone());
                self.shapes.insert(Arc::clone(&s));
                s
            }
        };
        let old = record.shape.replace(shared);
        if let Some(old) = old {
            self.uncount_shape(old);
        }
        self.fragmentation.count(shape);
    }

    /// Stops counting a shape a record held, and forgets it once no record
    /// holds it.
    fn uncount_shape(&mut self, shape: Arc<Shape>) {
        self.fragmentation.uncount(&shape);
        // Held by the pool and by `shape` alone: no record left.
        if Arc::strong_count(&shape) <= 2 {
            self.shapes.remove(&*shape);
        }
    }

    fn set_charge(&mut self, uid: &str, charge: QuotaUse) {
        let Some(record) = self.records.get_mut(uid) else {
            return;
        };
        self.quotas.remove_use(&record.namespace, record.charge);
        self.quotas.add_use(&record.namespace, charge);
        record.charge = charge;
    }

    fn set_stage(&mut self, uid: &str, stage: Stage) {
        let Some(record) = self.records.get_mut(uid) else {
            return;
        };
        if matches!(stage, Stage::Allocated { placed: false, .. }) {
            self.unplaced.insert(uid.to_owned());
        } else {
            self.unplaced.remove(uid);
        }
        if stage != Stage::Demand {
            record.refusal = None;
        }
        if let Some(node) = record.stage.in_flight_to()
            && let Some(count) = self.in_flight.get_mut(node)
        {
            *count -= 1;
            if *count == 0 {
                self.in_flight.remove(node);
            }
        }
        if let Some(node) = stage.in_flight_to() {
            *self.in_flight.entry(node.to_owned()).or_default() += 1;
        }
        record.stage = stage;
    }

    /// The nodes a bind is in flight to (a pod filtered or bound there
    /// whose annotations the watch has not shown yet), with how many.
    pub fn binds_in_flight(&self) -> impl Iterator<Item = (&str, u32)> {
        self.in_flight.iter().map(|(node, &n)| (node.as_str(), n))
    }

    /// Marks the node the pod holds slices on (its usage is about to change).
    fn mark_pod_node(&mut self, cluster: &Cluster, uid: &str) {
        if let Some(usage) = cluster.pod_usage(uid) {
            self.fragmentation.node_changed(usage.node);
        }
    }

    /// Frees what the pod holds, refunds its quota; the stage is `Demand`.
    fn drop_hold(&mut self, cluster: &mut Cluster, uid: &str) -> bool {
        self.mark_pod_node(cluster, uid);
        let freed = cluster.release(uid);
        if self.records.contains_key(uid) {
            self.set_charge(uid, QuotaUse::default());
            self.set_stage(uid, Stage::Demand);
        }
        freed
    }

    /// Puts an annotated allocation in the ledger, replacing what the pod
    /// held; when its node or GPUs are unknown it waits, holding nothing.
    fn place(&mut self, cluster: &mut Cluster, uid: &str, allocation: Allocation) {
        self.mark_pod_node(cluster, uid);
        let placed = cluster.node_id(&allocation.node).is_some_and(|id| {
            self.fragmentation.node_changed(id);
            // Facts are never refused, even when they over-commit; only a
            // GPU the node does not (yet) have keeps it waiting.
            cluster
                .observe_allocated(
                    uid,
                    id,
                    &allocation.devices,
                    allocation.init_count,
                    HostResources::default(),
                    &allocation.mig,
                )
                .is_ok()
        });
        if !placed {
            cluster.release(uid);
        }
        self.set_stage(
            uid,
            Stage::Allocated {
                allocation: compact(allocation),
                placed,
            },
        );
    }

    /// Drops a record that counts nothing, holds nothing and is charged
    /// nothing.
    fn tidy(&mut self, uid: &str) {
        if self.records.get(uid).is_some_and(PodRecord::is_empty) {
            self.records.remove(uid);
        }
    }
}

/// `allocation` with no spare capacity, as every pod's record keeps it for
/// as long as the pod runs. The decoder grows each container's list one
/// device at a time, so a one-slice container's list has room for four
/// (224 bytes where 56 are used): 13 MiB over 80,000 pods.
fn compact(mut allocation: Allocation) -> Allocation {
    for container in &mut allocation.devices.0 {
        container.shrink_to_fit();
    }
    allocation.devices.0.shrink_to_fit();
    allocation.mig.shrink_to_fit();
    allocation.node.shrink_to_fit();
    allocation
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::testutil::mk_node;

    fn shape(milli: u32) -> Shape {
        Shape {
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 1,
            milli,
            types: vec![],
        }
    }

    fn devices(node: &str, mem: u32, cores: u32) -> PodDevices {
        format!("GPU-{node}-0,NVIDIA,{mem},{cores}:;")
            .parse()
            .unwrap()
    }

    fn decided(node: &str, mem: u32, cores: u32) -> Decided {
        Decided {
            node: node.to_owned(),
            devices: devices(node, mem, cores),
            mig: Vec::new(),
        }
    }

    fn allocation(node: &str, mem: u32, cores: u32) -> Allocation {
        Allocation {
            node: node.to_owned(),
            devices: devices(node, mem, cores),
            init_count: 0,
            mig: Vec::new(),
        }
    }

    fn use_(memory_mib: u64, cores: u64) -> QuotaUse {
        QuotaUse { memory_mib, cores }
    }

    /// Two nodes of one 1000 MiB GPU each, and an empty book.
    fn setup() -> (Cluster, PodBook) {
        let cluster = Cluster::new(vec![mk_node("a", 1, 10, 1000), mk_node("b", 1, 10, 1000)]);
        (cluster, PodBook::new(1))
    }

    fn used_mem(cluster: &Cluster, node: NodeId) -> u64 {
        cluster.node(node).unwrap().usage[0].usedmem
    }

    #[test]
    fn an_allocated_pod_keeps_its_allocation_without_spare_capacity() {
        let (mut c, mut book) = setup();
        // As the decoder leaves it: each list with room to spare.
        let mut spare = allocation("a", 400, 40);
        spare.devices.0.reserve(8);
        spare.devices.0[0].reserve(8);
        spare.node.reserve(64);
        book.allocated(&mut c, "p", "ns", "pod", spare, || Some(shape(400)));
        let Stage::Allocated { allocation, placed } = book.get("p").unwrap().stage() else {
            panic!("not allocated: {:?}", book.get("p").unwrap().stage());
        };
        assert!(placed);
        assert_eq!(allocation, &self::allocation("a", 400, 40));
        assert_eq!(allocation.devices.0.capacity(), allocation.devices.0.len());
        assert_eq!(allocation.devices.0[0].capacity(), 1);
        assert_eq!(allocation.node.capacity(), allocation.node.len());
        assert_eq!(used_mem(&c, 0), 400);
        book.check(&c).unwrap();
    }

    #[test]
    fn a_pod_goes_filtered_reserved_bound_allocated_removed_with_every_sum_in_step() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        assert_eq!(book.get("p").unwrap().stage(), &Stage::Demand);
        assert_eq!(book.workload().total(), 1);
        book.check(&c).unwrap();

        book.reserve(&mut c, "p", 0, decided("a", 400, 40), 0)
            .unwrap();
        assert_eq!(book.decision("p"), Some(&decided("a", 400, 40)));
        assert_eq!(book.get("p").unwrap().charge(), use_(400, 40));
        assert_eq!(used_mem(&c, 0), 400);
        book.check(&c).unwrap();

        book.bound(&mut c, "p").unwrap();
        assert_eq!(book.decision("p"), None, "a bound pod waits for no bind");
        assert_eq!(
            book.get("p").unwrap().stage(),
            &Stage::Bound(decided("a", 400, 40))
        );
        assert!(c.pod_usage("p").unwrap().committed);
        book.check(&c).unwrap();

        book.allocated(&mut c, "p", "ns", "pod", allocation("a", 400, 40), || {
            panic!("the shape is counted already")
        });
        assert_eq!(book.allocated_pods().collect::<Vec<_>>(), ["p"]);
        assert_eq!(used_mem(&c, 0), 400, "the allocation replaces, not adds");
        assert_eq!(book.slices().len(), 1);
        book.check(&c).unwrap();

        book.remove(&mut c, "p");
        assert!(book.is_empty());
        assert_eq!((used_mem(&c, 0), book.workload().total()), (0, 0));
        assert_eq!(book.quota_statuses(), []);
        book.check(&c).unwrap();
    }

    #[test]
    fn a_failed_bind_frees_and_refunds_but_the_demand_stays() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        book.reserve(&mut c, "p", 1, decided("b", 400, 40), 0)
            .unwrap();
        assert!(book.bind_failed(&mut c, "p"));
        assert!(!book.bind_failed(&mut c, "p"), "twice is harmless");
        let record = book.get("p").unwrap();
        assert_eq!(
            (record.stage(), record.charge()),
            (&Stage::Demand, use_(0, 0))
        );
        assert_eq!((used_mem(&c, 1), book.workload().total()), (0, 1));
        assert!(book.bound(&mut c, "p").is_err(), "nothing to bind");
        book.check(&c).unwrap();
    }

    #[test]
    fn filtering_again_drops_the_earlier_reservation_and_hold() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        book.reserve(&mut c, "p", 0, decided("a", 400, 40), 0)
            .unwrap();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        assert_eq!(used_mem(&c, 0), 0);
        assert_eq!(book.workload().total(), 1, "counted once");
        book.check(&c).unwrap();
        // A refused reservation changes nothing.
        assert!(
            book.reserve(&mut c, "p", 0, decided("a", 4000, 40), 0)
                .is_err()
        );
        assert_eq!(book.get("p").unwrap().stage(), &Stage::Demand);
        book.check(&c).unwrap();
        // A reservation for a pod never filtered is refused.
        assert!(
            book.reserve(&mut c, "q", 0, decided("a", 100, 10), 0)
                .is_err()
        );
        assert!(book.get("q").is_none());
    }

    #[test]
    fn an_allocation_on_an_unknown_node_waits_holding_nothing_until_it_registers() {
        let (mut c, mut book) = setup();
        book.allocated(&mut c, "p", "ns", "pod", allocation("z", 300, 30), || {
            Some(shape(300))
        });
        let record = book.get("p").unwrap();
        assert!(!record.stage().holds());
        assert_eq!(record.charge(), use_(300, 30), "the quota counts a fact");
        assert!(c.pod_usage("p").is_none());
        book.check(&c).unwrap();
        // Another node registering places nothing.
        book.node_registered(&mut c, "a");
        assert!(c.pod_usage("p").is_none());
        let z = c.upsert_node(mk_node("z", 1, 10, 1000));
        book.node_registered(&mut c, "z");
        assert!(book.get("p").unwrap().stage().holds());
        assert_eq!(used_mem(&c, z), 300);
        book.check(&c).unwrap();
    }

    #[test]
    fn an_allocation_replaces_a_reservation_on_another_node() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        book.reserve(&mut c, "p", 0, decided("a", 400, 40), 0)
            .unwrap();
        book.allocated(&mut c, "p", "ns", "pod", allocation("b", 500, 50), || None);
        assert_eq!((used_mem(&c, 0), used_mem(&c, 1)), (0, 500));
        assert_eq!(book.get("p").unwrap().charge(), use_(500, 50));
        assert_eq!(book.get("p").unwrap().shape(), Some(&shape(400)));
        book.check(&c).unwrap();
    }

    #[test]
    fn forgetting_a_shape_keeps_what_the_pod_holds_and_drops_an_empty_record() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "idle", "ns", "idle", shape(100));
        book.filtering(&mut c, "held", "ns", "held", shape(200));
        book.reserve(&mut c, "held", 0, decided("a", 200, 20), 0)
            .unwrap();
        book.forget_shape("idle");
        book.forget_shape("held");
        assert!(book.get("idle").is_none());
        assert!(book.get("held").unwrap().stage().holds());
        assert_eq!(book.counted_pods().count(), 0);
        book.check(&c).unwrap();
        book.bind_failed(&mut c, "held");
        assert!(book.is_empty(), "nothing left to keep");
        book.check(&c).unwrap();
    }

    #[test]
    fn the_check_finds_a_ledger_changed_behind_the_books_back() {
        let (mut c, mut book) = setup();
        book.filtering(&mut c, "p", "ns", "pod", shape(400));
        book.reserve(&mut c, "p", 0, decided("a", 400, 40), 0)
            .unwrap();
        c.release("p");
        assert!(book.check(&c).unwrap_err().contains("does not hold"));
        c.reserve(
            "stray",
            1,
            &devices("b", 100, 10),
            0,
            HostResources::default(),
        )
        .unwrap();
        book.remove(&mut c, "p");
        assert!(book.check(&c).unwrap_err().contains("ledger holds 1"));
    }
}

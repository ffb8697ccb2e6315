//! The live workload and fragmentation index behind the `fgd` policy in
//! `serve`.
//!
//! Owns: the [`ShapeDistribution`] of the GPU pods the model counts and the
//! [`FgdIndex`] built from it. Does not own which pod counts which shape
//! (each pod's record in [`super::pods`] does) nor usage (the [`Cluster`]
//! does; the pod book tells this module which node it touched).
//!
//! **The workload** is the pods currently in the cluster plus those being
//! scheduled: a pod's shape counts from its first filter, or from the first
//! sight of its allocation in its annotations (after a restart), until it
//! is deleted or finishes. A pod whose filter found no node still counts:
//! it is demand the cluster should keep room for. Each change is one
//! [`ShapeDistribution::observe`] or [`ShapeDistribution::forget`]; nothing
//! is recounted.
//!
//! **The index** is built lazily, on the first `fgd` filter, and then kept
//! in step:
//! - a usage or node change marks that node (O(1), and nothing at all while
//!   no `fgd` filter ever ran, so binpack/spread pay nothing);
//! - the next `fgd` filter refreshes the marked nodes only;
//! - it rebuilds the whole index, O(nodes), instead when a shape appeared
//!   that the index has no group for, or when the pods added and removed
//!   since the last build reach 1/[`REBUILD_CHURN_DIVISOR`] of the pods
//!   counted then. Each change moves one pod's worth of frequency, so the
//!   weights the index uses are off by at most about that share; a busy
//!   cluster of `P` pods rebuilds at most once per `P / 20` changes plus
//!   once per shape never seen before.
//!
//! **An empty workload** cannot reach the index: the filter counts the pod
//! being placed before it asks for the index, so the first pod is placed
//! for its own shape. Were it empty, every placement would grow
//! fragmentation by 0 and FGD's tie break (the fuller node, HAMi's binpack
//! score) would decide.

use std::collections::BTreeSet;

use crate::core::fgd::{FgdIndex, Shape, ShapeDistribution};
use crate::core::model::{Cluster, NodeId};

/// The index is rebuilt once the pods added or removed since the last
/// build reach `1 / REBUILD_CHURN_DIVISOR` (5 %) of the pods counted then.
pub const REBUILD_CHURN_DIVISOR: u64 = 20;

/// The workload's shapes and the fragmentation index over them.
#[derive(Debug, Default)]
pub struct Fragmentation {
    /// The shapes counted, one per pod.
    workload: ShapeDistribution,
    /// Built on the first `fgd` filter.
    index: Option<FgdIndex>,
    /// Distinct shapes the index has a group for.
    built_shapes: BTreeSet<Shape>,
    /// Pods counted when the index was built.
    built_total: u64,
    /// Observes and forgets since the last build.
    churn: u64,
    /// A shape appeared that `built_shapes` lacks.
    unknown_shape: bool,
    /// Nodes whose usage or GPUs changed since the index last saw them.
    dirty: Vec<NodeId>,
    /// `dirty` as a bitmap, so a node is listed once.
    is_dirty: Vec<bool>,
    /// Whole rebuilds so far.
    rebuilds: u64,
}

impl Fragmentation {
    /// Counts one pod of `shape` in the workload. The caller's record of
    /// the pod says which shape it counted, and takes back exactly that.
    pub fn count(&mut self, shape: Shape) {
        if self.index.is_some() && !self.built_shapes.contains(&shape) {
            self.unknown_shape = true;
        }
        self.workload.observe(shape);
        self.churn += 1;
    }

    /// Stops counting one pod of `shape`.
    pub fn uncount(&mut self, shape: &Shape) {
        self.workload.forget(shape);
        self.churn += 1;
    }

    /// The workload's shape distribution.
    #[must_use]
    pub fn workload(&self) -> &ShapeDistribution {
        &self.workload
    }

    /// Whole index rebuilds so far.
    #[must_use]
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds
    }

    /// The node's usage or GPUs changed. O(1); nothing to do while the
    /// index was never built (the build will see the node as it is).
    pub fn node_changed(&mut self, id: NodeId) {
        if self.index.is_none() {
            return;
        }
        if self.is_dirty.len() <= id {
            self.is_dirty.resize(id + 1, false);
        }
        if !self.is_dirty[id] {
            self.is_dirty[id] = true;
            self.dirty.push(id);
        }
    }

    /// The index, brought up to date with `cluster` and the workload (see
    /// the module doc for when that is a rebuild).
    pub fn index(&mut self, cluster: &Cluster) -> &mut FgdIndex {
        let stale = self.unknown_shape
            || self.churn.saturating_mul(REBUILD_CHURN_DIVISOR) >= self.built_total.max(1);
        match &mut self.index {
            Some(index) if !stale => {
                for id in self.dirty.drain(..) {
                    index.refresh_node(cluster, id);
                    if let Some(d) = self.is_dirty.get_mut(id) {
                        *d = false;
                    }
                }
            }
            _ => {
                self.dirty.clear();
                self.is_dirty.clear();
                self.built_shapes = self
                    .workload
                    .frequencies()
                    .map(|(s, _)| s.clone())
                    .collect();
                self.built_total = self.workload.total();
                self.churn = 0;
                self.unknown_shape = false;
                self.rebuilds += 1;
                self.index = Some(FgdIndex::new(&self.workload, cluster));
            }
        }
        // Either arm leaves `Some`; the fallback only satisfies the types.
        self.index
            .get_or_insert_with(|| FgdIndex::new(&self.workload, cluster))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::testutil::mk_node;
    use crate::core::policy::{Policy, SchedulerConfig, schedule};
    use crate::core::request::{DeviceRequest, MemoryRequest, PodRequest};
    use crate::core::reservation::HostResources;
    use crate::core::rng::SplitMix64;
    use proto::hami::pod_devices::PodDevices;

    fn share(milli: u32) -> Shape {
        Shape {
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 1,
            milli,
            types: vec![],
        }
    }

    fn same_as_fresh(f: &mut Fragmentation, c: &Cluster) {
        let fresh = FgdIndex::new(f.workload(), c);
        let live = f.index(c);
        for id in 0..c.nodes().len() {
            assert!(
                (live.node_fragmentation(id) - fresh.node_fragmentation(id)).abs() < 1e-9,
                "node {id}: live {} fresh {}",
                live.node_fragmentation(id),
                fresh.node_fragmentation(id)
            );
        }
    }

    #[test]
    fn the_workload_counts_and_uncounts_shapes() {
        let mut f = Fragmentation::default();
        f.count(share(500));
        f.count(share(500));
        f.count(share(300));
        assert_eq!((f.workload().total(), f.workload().len()), (3, 2));
        f.uncount(&share(300));
        assert_eq!((f.workload().total(), f.workload().len()), (2, 1));
        f.uncount(&share(500));
        f.uncount(&share(500));
        assert!(f.workload().is_empty());
    }

    #[test]
    fn a_marked_node_is_refreshed_and_an_unmarked_change_is_not_seen() {
        let mut c = Cluster::new(vec![mk_node("a", 1, 10, 1000), mk_node("b", 1, 10, 1000)]);
        let mut f = Fragmentation::default();
        for _ in 0..40 {
            f.count(share(600));
        }
        assert!(f.index(&c).node_fragmentation(0).abs() < 1e-9);
        assert_eq!(f.rebuilds(), 1);
        let devices: PodDevices = "GPU-a-0,NVIDIA,600,60:;".parse().unwrap();
        c.reserve("x", 0, &devices, 0, HostResources::default())
            .unwrap();
        // Not marked: the index still shows the node empty.
        assert!(f.index(&c).node_fragmentation(0).abs() < 1e-9);
        f.node_changed(0);
        f.node_changed(0);
        // 400 idle that a 600 pod cannot use.
        assert!((f.index(&c).node_fragmentation(0) - 400.0).abs() < 1e-9);
        assert_eq!(f.rebuilds(), 1, "a refresh, not a rebuild");
        same_as_fresh(&mut f, &c);
        // A node added later is refreshed when marked.
        c.upsert_node(mk_node("c", 2, 10, 1000));
        f.node_changed(2);
        same_as_fresh(&mut f, &c);
        assert_eq!(f.rebuilds(), 1);
    }

    #[test]
    fn a_new_shape_or_enough_churn_rebuilds_the_index() {
        let c = Cluster::new(vec![mk_node("a", 1, 10, 1000)]);
        let mut f = Fragmentation::default();
        for _ in 0..40 {
            f.count(share(600));
        }
        f.index(&c);
        assert_eq!(f.rebuilds(), 1);
        // One more pod of a known shape: 1 change < 40 / 20.
        f.count(share(600));
        f.index(&c);
        assert_eq!(f.rebuilds(), 1);
        // The second change reaches 5 % of the 40 pods built on.
        f.uncount(&share(600));
        f.index(&c);
        assert_eq!(f.rebuilds(), 2);
        // A shape the index has no group for rebuilds at once.
        f.count(share(250));
        f.index(&c);
        assert_eq!(f.rebuilds(), 3);
        same_as_fresh(&mut f, &c);
        // Nothing changed: no rebuild.
        f.index(&c);
        assert_eq!(f.rebuilds(), 3);
    }

    #[test]
    fn nothing_is_marked_before_the_first_build() {
        let mut f = Fragmentation::default();
        f.node_changed(5);
        assert!(f.dirty.is_empty() && f.is_dirty.is_empty());
    }

    proptest::proptest! {
        /// Through any sequence of shapes counted and uncounted and nodes
        /// reserved and released (each change marked as the pod book marks
        /// it), the live index scores every node as an index built afresh
        /// from the workload it was last built on, and FGD decides with it
        /// exactly as with that fresh index.
        #[test]
        fn the_live_index_equals_a_fresh_one_on_the_workload_it_was_built_on(
            steps in proptest::collection::vec(
                (0u8..5, 0usize..3, 1u32..10, 1u64..600, 1u32..60, 0usize..40), 1..60),
            seed in 0u64..1000,
        ) {
            let mut c = Cluster::new(vec![
                mk_node("a", 2, 4, 1000),
                mk_node("b", 3, 10, 800),
                mk_node("c", 1, 10, 1000),
            ]);
            let mut f = Fragmentation::default();
            let mut counted: Vec<Shape> = Vec::new();
            let mut held: Vec<(String, NodeId)> = Vec::new();
            let mut built = ShapeDistribution::default();
            let cfg = SchedulerConfig { node_policy: Policy::Fgd, ..SchedulerConfig::default() };
            let mut rng = SplitMix64::new(seed);
            f.count(share(500));
            counted.push(share(500));
            for (k, (op, node, tenths, mem, cores, pick)) in steps.into_iter().enumerate() {
                match op {
                    0 => {
                        let s = share(tenths * 100);
                        f.count(s.clone());
                        counted.push(s);
                    }
                    1 if counted.len() > 1 => {
                        let s = counted.remove(pick % counted.len());
                        f.uncount(&s);
                    }
                    2 | 3 => {
                        let devices: PodDevices =
                            format!("GPU-{}-0,NVIDIA,{mem},{cores}:;", ["a", "b", "c"][node]).parse().unwrap();
                        let uid = format!("p{k}");
                        if c.reserve(&uid, node, &devices, 0, HostResources::default()).is_ok() {
                            held.push((uid, node));
                            f.node_changed(node);
                        }
                    }
                    _ if !held.is_empty() => {
                        let (uid, node) = held.remove(pick % held.len());
                        c.release(&uid);
                        f.node_changed(node);
                    }
                    _ => {}
                }
                let rebuilds = f.rebuilds();
                f.index(&c);
                if f.rebuilds() != rebuilds {
                    built = f.workload().clone();
                }
                let mut fresh = FgdIndex::new(&built, &c);
                let live = f.index(&c);
                for id in 0..c.nodes().len() {
                    proptest::prop_assert_eq!(
                        live.node_fragmentation(id).to_bits(),
                        fresh.node_fragmentation(id).to_bits()
                    );
                }
                let req = PodRequest {
                    app: vec![Some(DeviceRequest { nums: 1, memory: MemoryRequest::Mib(mem / 2), cores: cores / 2 })],
                    ..PodRequest::default()
                };
                let mut r2 = rng.clone();
                let warm = schedule(&c, &req, 0..3, &cfg, Some(live), &mut rng);
                let cold = schedule(&c, &req, 0..3, &cfg, Some(&mut fresh), &mut r2);
                proptest::prop_assert_eq!(warm, cold);
            }
        }
    }
}

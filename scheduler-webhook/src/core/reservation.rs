//! The ledger of pods holding GPU slices, keyed by pod UID: reserve (a
//! filter decision, checked so no GPU is ever over-committed), commit (the
//! pod is bound), release (the pod is gone; releasing twice is harmless),
//! and observe (an allocation the cluster already made, taken as a fact).
//!
//! A pod's usage per GPU: its app containers summed (one slot each), its
//! init containers at their peak (one slot); a pod holds the larger of the
//! two per dimension, since init containers finish before app containers
//! start — the rule of [`proto::accounting`], which the node's ledger counts
//! by too, and the view [`crate::core::fit::fit_pod`] takes.

use proto::accounting::{PodAmount, Role};
use proto::hami::mig::MigAllocation;
use proto::hami::pod_devices::PodDevices;

use crate::core::mig;
pub use crate::core::model::PodUsage;
use crate::core::model::{Cluster, GpuUse, Node, NodeId, PodMig};

/// Errors changing the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    /// No node with this id.
    #[error("node {0} is unknown")]
    UnknownNode(NodeId),
    /// A device UUID is not on the node.
    #[error("GPU {uuid} is not on node {node}")]
    UnknownGpu {
        /// Node name.
        node: String,
        /// Device UUID.
        uuid: String,
    },
    /// The reservation would exceed a GPU's slots, memory or cores, or the
    /// node's CPU or memory.
    #[error("reserving on node {node} would over-commit {what}")]
    OverCommit {
        /// Node name.
        node: String,
        /// What would be exceeded.
        what: String,
    },
    /// A negative memory or core amount in the device list.
    #[error("negative amount for GPU {0}")]
    Negative(String),
    /// No reservation for this pod UID.
    #[error("no reservation for pod {0}")]
    UnknownPod(String),
}

/// A pod's usage per GPU position from its device annotation, where the
/// first `init_count` containers are init containers: on each GPU, the
/// containers' slices (one slot each) counted by [`proto::accounting`].
/// Positions are listed as app containers first use them, then those only
/// init containers use.
///
/// # Errors
/// A UUID not on the node, or a negative amount.
pub fn pod_gpu_usage(
    node: &Node,
    devices: &PodDevices,
    init_count: usize,
) -> Result<Vec<(usize, GpuUse)>, ReservationError> {
    let mut per_gpu: Vec<(usize, PodAmount<GpuUse>)> = Vec::new();
    let (mut app_order, mut init_order) = (Vec::new(), Vec::new());
    for (i, container) in devices.0.iter().enumerate() {
        let role = Role::of_index(i, init_count);
        for d in container {
            // A ≤v2.9 MIG entry is `GPU-…[<geometry>-<instance>]`.
            let (uuid, _) = proto::hami::mig::split_legacy_uuid(&d.uuid);
            let pos = node
                .gpu_position(uuid)
                .ok_or_else(|| ReservationError::UnknownGpu {
                    node: node.name.clone(),
                    uuid: d.uuid.clone(),
                })?;
            let (Ok(usedmem), Ok(usedcores)) =
                (u64::try_from(d.usedmem), u32::try_from(d.usedcores))
            else {
                return Err(ReservationError::Negative(d.uuid.clone()));
            };
            let slice = GpuUse {
                used: 1,
                usedmem,
                usedcores,
            };
            match per_gpu.iter_mut().find(|(p, _)| *p == pos) {
                Some((_, pod)) => pod.add(role, slice),
                None => per_gpu.push((pos, [(role, slice)].into_iter().collect())),
            }
            let order = match role {
                Role::Init => &mut init_order,
                Role::App => &mut app_order,
            };
            if !order.contains(&pos) {
                order.push(pos);
            }
        }
    }
    let only_init: Vec<usize> = init_order
        .into_iter()
        .filter(|p| !app_order.contains(p))
        .collect();
    Ok(app_order
        .into_iter()
        .chain(only_init)
        .filter_map(|pos| {
            per_gpu
                .iter()
                .find(|(p, _)| *p == pos)
                .map(|(_, pod)| (pos, pod.total()))
        })
        .collect())
}

fn add_usage(node: &mut Node, p: &PodUsage) {
    for (pos, u) in &p.gpus {
        if let Some(g) = node.usage.get_mut(*pos) {
            g.used = g.used.saturating_add(u.used);
            g.usedmem = g.usedmem.saturating_add(u.usedmem);
            g.usedcores = g.usedcores.saturating_add(u.usedcores);
        }
    }
    for (pos, mask) in p.mig_masks() {
        if let Some(s) = node.mig_slices.get_mut(*pos) {
            *s |= mask;
        }
    }
    node.used_cpu_milli = node.used_cpu_milli.saturating_add(p.cpu_milli);
    node.used_memory_mib = node.used_memory_mib.saturating_add(p.memory_mib);
}

fn remove_usage(node: &mut Node, p: &PodUsage) {
    for (pos, u) in &p.gpus {
        if let Some(g) = node.usage.get_mut(*pos) {
            g.used = g.used.saturating_sub(u.used);
            g.usedmem = g.usedmem.saturating_sub(u.usedmem);
            g.usedcores = g.usedcores.saturating_sub(u.usedcores);
        }
    }
    for (pos, mask) in p.mig_masks() {
        if let Some(s) = node.mig_slices.get_mut(*pos) {
            *s &= !mask;
        }
    }
    node.used_cpu_milli = node.used_cpu_milli.saturating_sub(p.cpu_milli);
    node.used_memory_mib = node.used_memory_mib.saturating_sub(p.memory_mib);
}

/// Checks that `node` with `old` removed and `new` added stays within
/// every GPU's slots, memory and cores and the node's CPU and memory.
fn check_fits(node: &Node, old: Option<&PodUsage>, new: &PodUsage) -> Result<(), ReservationError> {
    let over = |what: String| ReservationError::OverCommit {
        node: node.name.clone(),
        what,
    };
    let same_node = old.filter(|o| o.node == new.node);
    for (pos, u) in &new.gpus {
        let (Some(g), Some(cur)) = (node.gpus.get(*pos), node.usage.get(*pos)) else {
            continue;
        };
        let mut base = *cur;
        if let Some(o) = same_node {
            for (p, ou) in &o.gpus {
                if p == pos {
                    base.used = base.used.saturating_sub(ou.used);
                    base.usedmem = base.usedmem.saturating_sub(ou.usedmem);
                    base.usedcores = base.usedcores.saturating_sub(ou.usedcores);
                }
            }
        }
        if u64::from(base.used) + u64::from(u.used) > u64::from(g.count) {
            return Err(over(format!("slots of {}", g.uuid)));
        }
        if base.usedmem.saturating_add(u.usedmem) > g.devmem {
            return Err(over(format!("memory of {}", g.uuid)));
        }
        if u64::from(base.usedcores) + u64::from(u.usedcores) > u64::from(g.devcore) {
            return Err(over(format!("cores of {}", g.uuid)));
        }
    }
    if let Some(cap) = node.capacity {
        let (old_cpu, old_mem) = same_node.map_or((0, 0), |o| (o.cpu_milli, o.memory_mib));
        let cpu = node
            .used_cpu_milli
            .saturating_sub(old_cpu)
            .saturating_add(new.cpu_milli);
        let mem = node
            .used_memory_mib
            .saturating_sub(old_mem)
            .saturating_add(new.memory_mib);
        // As kube-scheduler's NodeResourcesFit: a pod that asks none of a
        // resource fits whatever the node's use of it (which may exceed
        // the allocatable, when that shrank).
        if new.cpu_milli > 0 && cpu > cap.cpu_milli {
            return Err(over("cpu".to_owned()));
        }
        if new.memory_mib > 0 && mem > cap.memory_mib {
            return Err(over("memory".to_owned()));
        }
    }
    Ok(())
}

/// Resources one pod asks of a node besides its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostResources {
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

// === impl Cluster ===

impl Cluster {
    /// What `devices` on `node` amount to for one pod. On MIG GPUs each
    /// entry gets an instance: the one `given` names (a pod's
    /// `hami.io/vgpu-mig-allocations`, when it names a valid one for every
    /// MIG entry, [`mig::place_given`]), else one chosen by
    /// [`mig::place_entries`] around the slices other pods take (the pod's
    /// own earlier holding excluded); with `strict`, an entry with no free
    /// placement is an over-commit, else (a fact observed) it holds no
    /// slices.
    #[allow(
        clippy::too_many_arguments,
        reason = "one private helper behind reserve and observe_allocated"
    )]
    fn usage_of(
        &self,
        uid: &str,
        node: NodeId,
        devices: &PodDevices,
        init_count: usize,
        host: HostResources,
        committed: bool,
        given: &[MigAllocation],
    ) -> Result<(&Node, PodUsage), ReservationError> {
        let n = self.node(node).ok_or(ReservationError::UnknownNode(node))?;
        let gpus = pod_gpu_usage(n, devices, init_count)?;
        let mut base = n.mig_slices.clone();
        if let Some(old) = self.ledger.pods.get(uid).filter(|o| o.node == node) {
            for (pos, mask) in old.mig_masks() {
                if let Some(s) = base.get_mut(*pos) {
                    *s &= !mask;
                }
            }
        }
        let entries = || {
            devices.0.iter().enumerate().flat_map(move |(i, c)| {
                c.iter().enumerate().filter_map(move |(j, d)| {
                    let (uuid, _) = proto::hami::mig::split_legacy_uuid(&d.uuid);
                    Some((i, j, n.gpu_position(uuid)?, u64::try_from(d.usedmem).ok()?))
                })
            })
        };
        let from_annotation = if given.is_empty() {
            None
        } else {
            mig::place_given(n, given, entries())
        };
        let placed = match from_annotation {
            Some(placed) => placed,
            None => match mig::place_entries(n, &base, entries()) {
                Ok(placed) => placed,
                Err(uuid) if !committed => {
                    return Err(ReservationError::OverCommit {
                        node: n.name.clone(),
                        what: format!("MIG placements of {uuid}"),
                    });
                }
                Err(_) => mig::Placed::default(),
            },
        };
        let usage = PodUsage {
            node,
            gpus,
            mig: (!placed.masks.is_empty() || !placed.instances.is_empty()).then(|| {
                Box::new(PodMig {
                    masks: placed.masks,
                    instances: placed.instances,
                })
            }),
            cpu_milli: host.cpu_milli,
            memory_mib: host.memory_mib,
            committed,
        };
        Ok((n, usage))
    }

    /// Reserves `devices` on `node` for the pod `uid`, replacing its earlier
    /// reservation (HAMi drops it at each Filter).
    ///
    /// # Errors
    /// Unknown node or GPU, or a reservation that would over-commit a GPU
    /// or the node; the earlier reservation is then kept.
    pub fn reserve(
        &mut self,
        uid: &str,
        node: NodeId,
        devices: &PodDevices,
        init_count: usize,
        host: HostResources,
    ) -> Result<(), ReservationError> {
        let (n, new) = self.usage_of(uid, node, devices, init_count, host, false, &[])?;
        check_fits(n, self.ledger.pods.get(uid), &new)?;
        self.release(uid);
        self.insert(uid, new);
        Ok(())
    }

    /// Records an allocation the cluster already made (a pod's
    /// `hami.io/vgpu-devices-allocated`), committed and unchecked: facts
    /// are never refused, even when they over-commit. `mig` is the pod's
    /// `hami.io/vgpu-mig-allocations` (empty when it has none): its
    /// placements are taken when they name every MIG entry, so the
    /// picture after a restart is exact whatever order pods were bound in.
    ///
    /// # Errors
    /// Unknown node or GPU.
    pub fn observe_allocated(
        &mut self,
        uid: &str,
        node: NodeId,
        devices: &PodDevices,
        init_count: usize,
        host: HostResources,
        mig: &[MigAllocation],
    ) -> Result<(), ReservationError> {
        let (_, usage) = self.usage_of(uid, node, devices, init_count, host, true, mig)?;
        self.release(uid);
        self.insert(uid, usage);
        Ok(())
    }

    /// Marks the pod's reservation committed (bound).
    ///
    /// # Errors
    /// No reservation for this UID.
    pub fn commit(&mut self, uid: &str) -> Result<(), ReservationError> {
        self.ledger
            .pods
            .get_mut(uid)
            .map(|p| p.committed = true)
            .ok_or_else(|| ReservationError::UnknownPod(uid.to_owned()))
    }

    /// Frees what the pod holds; true when it held something. Releasing
    /// again, or an unknown pod, changes nothing.
    pub fn release(&mut self, uid: &str) -> bool {
        let Some(old) = self.ledger.pods.remove(uid) else {
            return false;
        };
        if let Some(n) = self.node_mut(old.node) {
            remove_usage(n, &old);
        }
        true
    }

    /// The MIG instances the pod holds (empty when none).
    #[must_use]
    pub fn mig_instances(&self, uid: &str) -> &[MigAllocation] {
        self.ledger
            .pods
            .get(uid)
            .map_or(&[], PodUsage::mig_instances)
    }

    /// What the pod holds, if anything.
    #[must_use]
    pub fn pod_usage(&self, uid: &str) -> Option<&PodUsage> {
        self.ledger.pods.get(uid)
    }

    /// Number of pods in the ledger.
    #[must_use]
    pub fn pod_count(&self) -> usize {
        self.ledger.pods.len()
    }

    fn insert(&mut self, uid: &str, usage: PodUsage) {
        if let Some(n) = self.node_mut(usage.node) {
            add_usage(n, &usage);
        }
        self.ledger.pods.insert(uid.to_owned(), usage);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proto::hami::pod_devices::ContainerDevice;

    use super::*;
    use crate::core::model::NodeCapacity;
    use crate::core::model::testutil::mk_node;

    fn dev(uuid: &str, mem: i32, cores: i32) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            vendor: "NVIDIA".into(),
            usedmem: mem,
            usedcores: cores,
        }
    }

    fn cluster() -> Cluster {
        Cluster::new(vec![mk_node("a", 2, 2, 1000), mk_node("b", 1, 2, 1000)])
    }

    const H: HostResources = HostResources {
        cpu_milli: 0,
        memory_mib: 0,
    };

    #[test]
    fn usage_sums_app_containers_and_takes_init_peak() {
        let c = cluster();
        let n = c.node(0).unwrap();
        let devices = PodDevices(vec![
            vec![dev("GPU-a-0", 700, 50)],                       // init
            vec![dev("GPU-a-0", 200, 10)],                       // init
            vec![dev("GPU-a-0", 100, 20)],                       // app
            vec![],                                              // app, no GPU
            vec![dev("GPU-a-0", 300, 20), dev("GPU-a-1", 1, 1)], // app
        ]);
        let u = pod_gpu_usage(n, &devices, 2).unwrap();
        assert_eq!(
            u,
            vec![
                (
                    0,
                    GpuUse {
                        used: 2,
                        usedmem: 700,
                        usedcores: 50
                    }
                ),
                (
                    1,
                    GpuUse {
                        used: 1,
                        usedmem: 1,
                        usedcores: 1
                    }
                ),
            ]
        );
        let bad = PodDevices(vec![vec![dev("GPU-zzz", 1, 1)]]);
        assert!(matches!(
            pod_gpu_usage(n, &bad, 0),
            Err(ReservationError::UnknownGpu { .. })
        ));
        let neg = PodDevices(vec![vec![dev("GPU-a-0", -1, 1)]]);
        assert!(matches!(
            pod_gpu_usage(n, &neg, 0),
            Err(ReservationError::Negative(_))
        ));
    }

    #[test]
    fn interleaved_reserve_commit_release() {
        let mut c = cluster();
        let p1 = PodDevices(vec![vec![dev("GPU-a-0", 400, 30)]]);
        let p2 = PodDevices(vec![vec![dev("GPU-a-0", 500, 30)]]);
        let p3 = PodDevices(vec![vec![dev("GPU-a-0", 200, 30)]]);
        c.reserve("p1", 0, &p1, 0, H).unwrap();
        c.reserve("p2", 0, &p2, 0, H).unwrap();
        // Two slots taken: a third pod is refused and nothing changes.
        let err = c.reserve("p3", 0, &p3, 0, H).unwrap_err();
        assert!(matches!(err, ReservationError::OverCommit { .. }), "{err}");
        assert_eq!(
            c.node(0).unwrap().usage[0],
            GpuUse {
                used: 2,
                usedmem: 900,
                usedcores: 60
            }
        );
        c.commit("p1").unwrap();
        assert!(c.pod_usage("p1").unwrap().committed);
        assert!(c.release("p2"));
        assert!(!c.release("p2"), "second release is harmless");
        assert!(matches!(
            c.commit("p2"),
            Err(ReservationError::UnknownPod(_))
        ));
        c.reserve("p3", 0, &p3, 0, H).unwrap();
        assert_eq!(
            c.node(0).unwrap().usage[0],
            GpuUse {
                used: 2,
                usedmem: 600,
                usedcores: 60
            }
        );
        // Re-reserving p3 elsewhere moves it.
        let p3b = PodDevices(vec![vec![dev("GPU-b-0", 200, 30)]]);
        c.reserve("p3", 1, &p3b, 0, H).unwrap();
        assert_eq!(
            c.node(0).unwrap().usage[0],
            GpuUse {
                used: 1,
                usedmem: 400,
                usedcores: 30
            }
        );
        assert_eq!(c.node(1).unwrap().usage[0].used, 1);
        assert!(c.release("p1"));
        assert!(c.release("p3"));
        for n in c.nodes() {
            assert!(n.usage.iter().all(|u| *u == GpuUse::default()));
        }
        assert_eq!(c.pod_count(), 0);
    }

    #[test]
    fn re_reserving_the_same_pod_replaces_it_not_adds() {
        let mut c = cluster();
        let big = PodDevices(vec![vec![dev("GPU-a-0", 900, 90)]]);
        c.reserve("p", 0, &big, 0, H).unwrap();
        c.reserve("p", 0, &big, 0, H).unwrap();
        assert_eq!(c.node(0).unwrap().usage[0].usedmem, 900);
    }

    #[test]
    fn cpu_memory_over_commit_is_refused_and_observe_is_not_checked() {
        let mut c = Cluster::new(vec![mk_node("a", 1, 2, 1000).with_capacity(NodeCapacity {
            cpu_milli: 1000,
            memory_mib: 10,
        })]);
        let none = PodDevices(vec![vec![]]);
        let h = HostResources {
            cpu_milli: 800,
            memory_mib: 5,
        };
        c.reserve("p1", 0, &none, 0, h).unwrap();
        assert!(c.reserve("p2", 0, &none, 0, h).is_err());
        c.observe_allocated("p2", 0, &none, 0, h, &[]).unwrap();
        assert_eq!(c.node(0).unwrap().used_cpu_milli, 1600);
        assert!(c.reserve("p9", 7, &none, 0, h).is_err());
        // The node is over its CPU now: a pod asking none still fits, as
        // in kube-scheduler; one asking 1 milli-CPU does not.
        c.reserve("zero", 0, &none, 0, HostResources::default())
            .unwrap();
        let cpu_only = HostResources {
            cpu_milli: 1,
            memory_mib: 0,
        };
        assert!(c.reserve("cpu", 0, &none, 0, cpu_only).is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Reserve {
            pod: u8,
            node: u8,
            gpu: u8,
            mem: i32,
            cores: i32,
            twice: bool,
        },
        Commit(u8),
        Release(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6, 0u8..2, 0u8..2, 0i32..1200, 0i32..120, any::<bool>()).prop_map(
                |(pod, node, gpu, mem, cores, twice)| Op::Reserve {
                    pod,
                    node,
                    gpu,
                    mem,
                    cores,
                    twice
                }
            ),
            (0u8..6).prop_map(Op::Commit),
            (0u8..6).prop_map(Op::Release),
        ]
    }

    proptest! {
        /// No sequence of reserve/commit/release over-commits a GPU, and
        /// usage always equals the sum of what the ledger holds.
        #[test]
        fn no_sequence_over_commits_a_gpu(ops in proptest::collection::vec(op(), 1..60)) {
            let mut c = cluster();
            for o in ops {
                match o {
                    Op::Reserve { pod, node, gpu, mem, cores, twice } => {
                        let node_name = if node == 0 { "a" } else { "b" };
                        let gpu = if node == 1 { 0 } else { gpu };
                        let d = dev(&format!("GPU-{node_name}-{gpu}"), mem, cores);
                        let devs = if twice { vec![vec![d.clone()], vec![d]] } else { vec![vec![d]] };
                        let _ = c.reserve(&format!("p{pod}"), usize::from(node), &PodDevices(devs), 0, H);
                    }
                    Op::Commit(p) => { let _ = c.commit(&format!("p{p}")); }
                    Op::Release(p) => { c.release(&format!("p{p}")); }
                }
                for (id, n) in c.nodes().iter().enumerate() {
                    for (pos, (g, u)) in n.gpus.iter().zip(&n.usage).enumerate() {
                        prop_assert!(u.used <= g.count);
                        prop_assert!(u.usedmem <= g.devmem);
                        prop_assert!(u.usedcores <= g.devcore);
                        let mut sum = GpuUse::default();
                        for p in c.ledger.pods.values().filter(|p| p.node == id) {
                            for (gp, gu) in p.gpus.iter().filter(|(gp, _)| *gp == pos) {
                                let _ = gp;
                                sum.used += gu.used;
                                sum.usedmem += gu.usedmem;
                                sum.usedcores += gu.usedcores;
                            }
                        }
                        prop_assert_eq!(sum, *u);
                    }
                }
            }
        }
    }
}

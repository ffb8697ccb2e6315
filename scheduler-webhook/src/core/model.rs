//! The cluster as the scheduler sees it: nodes, their GPUs (static facts
//! from the node register annotation) and the usage of every GPU (slots,
//! memory, cores), plus the optional CPU/memory capacity and use.
//!
//! GPU usage changes only through [`crate::core::reservation`]; so does
//! CPU/memory use in the simulator, while the extender sets it per node
//! from every pod it sees there ([`Cluster::set_host_used`]). This module
//! owns the data and the read-only views over it.

use std::collections::HashMap;
use std::sync::Arc;

use proto::hami::mig::{MigAllocation, MigProfile, known_profiles};
use proto::hami::pair_score::DevicePairScore;
use proto::hami::register::{MODE_MIG, NodeDevice};

/// Index of a node in [`Cluster::nodes`].
pub type NodeId = usize;

/// One physical GPU, as registered by the device plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// GPU UUID.
    pub uuid: String,
    /// Index on its node.
    pub index: u32,
    /// Type, e.g. `NVIDIA-Tesla T4` (one copy per node and type, shared by
    /// the node's GPUs of that type).
    pub device_type: Arc<str>,
    /// NUMA node.
    pub numa: u32,
    /// Whether the plugin reports it healthy.
    pub health: bool,
    /// Whether an admin cordoned it (`hami.io/device-cordon`).
    pub cordoned: bool,
    /// Sharing mode (`hami-core`, `mig`, `mps`), shared as the type is.
    pub mode: Arc<str>,
    /// Split count: how many containers may share it.
    pub count: u32,
    /// Device memory in MiB.
    pub devmem: u64,
    /// Device cores in percent (100 = one card).
    pub devcore: u32,
    /// In `mig` mode, the GPU instance profiles it offers (its register
    /// `migProfiles`, or the known profiles of its model when a ≤v2.9
    /// plugin sent none); empty otherwise. See [`crate::core::mig`].
    pub mig: Vec<MigProfile>,
}

/// What is used of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuUse {
    /// Slots taken (containers sharing it).
    pub used: u32,
    /// Memory taken, MiB.
    pub usedmem: u64,
    /// Cores taken, percent.
    pub usedcores: u32,
}

impl proto::accounting::Amount for GpuUse {
    fn plus(self, other: Self) -> Self {
        Self {
            used: self.used.saturating_add(other.used),
            usedmem: self.usedmem.saturating_add(other.usedmem),
            usedcores: self.usedcores.saturating_add(other.usedcores),
        }
    }

    fn peak(self, other: Self) -> Self {
        Self {
            used: self.used.max(other.used),
            usedmem: self.usedmem.max(other.usedmem),
            usedcores: self.usedcores.max(other.usedcores),
        }
    }
}

/// CPU and memory a node offers to pods (the simulator's node list; in the
/// extender, the Node's allocatable `cpu` and `memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
}

/// One node: its GPUs, their usage, and optional CPU/memory accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node name.
    pub name: String,
    /// GPUs sorted by index.
    pub gpus: Vec<Gpu>,
    /// Usage, parallel to `gpus`.
    pub usage: Vec<GpuUse>,
    /// MIG memory slices taken, a bit mask per GPU parallel to `gpus` (0
    /// for GPUs not in `mig` mode); the OR of the pods' [`PodUsage::mig`].
    pub mig_slices: Vec<u32>,
    /// CPU and memory capacity, when tracked.
    pub capacity: Option<NodeCapacity>,
    /// CPU taken by placed pods, milli-cores.
    pub used_cpu_milli: u64,
    /// Memory taken by placed pods, MiB.
    pub used_memory_mib: u64,
    /// How well each pair of GPUs is linked (`hami.io/node-nvidia-score`),
    /// by position: row `a`, column `b` at `a * gpus.len() + b`. Empty when
    /// the node publishes none: every pair scores 0.
    pub pair_scores: Vec<i64>,
}

impl Node {
    /// A node from its decoded `hami.io/node-nvidia-register` devices.
    ///
    /// Keeps devices whose type contains `nvidia` (case-insensitive), as
    /// HAMi does, and sorts them by index (the plugin's order is unstable).
    #[must_use]
    pub fn from_register(name: &str, devices: &[NodeDevice]) -> Self {
        let mut shared: Vec<Arc<str>> = Vec::new();
        let mut share = |text: &str| -> Arc<str> {
            if let Some(s) = shared.iter().find(|s| &***s == text) {
                return Arc::clone(s);
            }
            let s: Arc<str> = Arc::from(text);
            shared.push(Arc::clone(&s));
            s
        };
        let mut gpus: Vec<Gpu> = devices
            .iter()
            .filter(|d| d.device_type.to_ascii_lowercase().contains("nvidia"))
            .map(|d| Gpu {
                uuid: d.id.clone(),
                index: d.index,
                device_type: share(&d.device_type),
                numa: d.numa,
                health: d.health,
                cordoned: false,
                mode: share(&d.mode),
                count: d.count,
                devmem: u64::from(d.devmem),
                devcore: d.devcore,
                mig: if d.mode == MODE_MIG {
                    if d.mig_profiles.is_empty() {
                        known_profiles(&d.device_type).unwrap_or_default()
                    } else {
                        d.mig_profiles.clone()
                    }
                } else {
                    Vec::new()
                },
            })
            .collect();
        gpus.sort_by_key(|g| g.index);
        let usage = vec![GpuUse::default(); gpus.len()];
        let mig_slices = vec![0; gpus.len()];
        Self {
            name: name.to_owned(),
            gpus,
            usage,
            mig_slices,
            capacity: None,
            used_cpu_milli: 0,
            used_memory_mib: 0,
            pair_scores: Vec::new(),
        }
    }

    /// Takes the node's pair scores (`hami.io/node-nvidia-score`). As HAMi's
    /// `GetNodeDevices` does, a GPU takes the first entry with its UUID, and
    /// a pair missing from it scores 0; entries for other UUIDs are ignored.
    pub fn set_pair_scores(&mut self, scores: &[DevicePairScore]) {
        let n = self.gpus.len();
        let mut matrix = vec![0; n * n];
        for (a, ga) in self.gpus.iter().enumerate() {
            let Some(entry) = scores.iter().find(|s| s.uuid == ga.uuid) else {
                continue;
            };
            for (b, gb) in self.gpus.iter().enumerate() {
                if a != b
                    && let Some(cell) = matrix.get_mut(a * n + b)
                {
                    *cell = entry.score.get(&gb.uuid).copied().unwrap_or(0);
                }
            }
        }
        self.pair_scores = if matrix.iter().all(|s| *s == 0) {
            Vec::new()
        } else {
            matrix
        };
    }

    /// How well the GPU at position `a` is linked to the one at `b`, as the
    /// score `a` publishes for `b` (0 when none is published).
    #[must_use]
    pub fn pair_score(&self, a: usize, b: usize) -> i64 {
        let n = self.gpus.len();
        if a >= n || b >= n {
            return 0;
        }
        self.pair_scores.get(a * n + b).copied().unwrap_or(0)
    }

    /// Sets the CPU/memory capacity to check pods against.
    #[must_use]
    pub fn with_capacity(mut self, capacity: NodeCapacity) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// Marks the listed UUIDs cordoned (`hami.io/device-cordon`) and every
    /// other GPU not cordoned.
    pub fn set_cordoned<S: AsRef<str>>(&mut self, uuids: &[S]) {
        for g in &mut self.gpus {
            g.cordoned = uuids.iter().any(|u| u.as_ref().trim() == g.uuid);
        }
    }

    /// Position in `gpus` of the GPU with this UUID.
    #[must_use]
    pub fn gpu_position(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    /// Free CPU (milli-cores) and memory (MiB), when tracked.
    #[must_use]
    pub fn free_cpu_memory(&self) -> Option<(u64, u64)> {
        self.capacity.map(|c| {
            (
                c.cpu_milli.saturating_sub(self.used_cpu_milli),
                c.memory_mib.saturating_sub(self.used_memory_mib),
            )
        })
    }

    /// Whether a pod asking for this CPU and memory fits (always, when the
    /// node does not track them).
    #[must_use]
    pub fn fits_cpu_memory(&self, cpu_milli: u64, memory_mib: u64) -> bool {
        self.free_cpu_memory()
            .is_none_or(|(cpu, mem)| cpu_milli <= cpu && memory_mib <= mem)
    }
}

/// What one pod holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    /// The node.
    pub node: NodeId,
    /// Per GPU position on the node, what the pod holds there.
    pub gpus: Vec<(usize, GpuUse)>,
    /// Its MIG placement; `None` for a pod on no MIG GPU (nearly every
    /// pod), so an ordinary pod's ledger entry carries one pointer instead
    /// of two empty lists (about 5 MiB at 80,000 pods).
    pub mig: Option<Box<PodMig>>,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Whether the pod is bound (committed) rather than only reserved.
    pub committed: bool,
}

/// What a pod holds on MIG GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMig {
    /// Per MIG GPU position, the memory slices its instances take.
    pub masks: Vec<(usize, u32)>,
    /// Its MIG instances, one per device entry on a MIG GPU (what the bind
    /// writes as `hami.io/vgpu-mig-allocations`; for an observed
    /// allocation, that annotation's instances when it names them all).
    pub instances: Vec<MigAllocation>,
}

impl PodUsage {
    /// Per MIG GPU position, the memory slices the pod's instances take.
    #[must_use]
    pub fn mig_masks(&self) -> &[(usize, u32)] {
        self.mig.as_ref().map_or(&[], |m| m.masks.as_slice())
    }

    /// The pod's MIG instances (empty when none).
    #[must_use]
    pub fn mig_instances(&self) -> &[MigAllocation] {
        self.mig.as_ref().map_or(&[], |m| m.instances.as_slice())
    }
}

/// Pods by UID: the usage recorded in each [`Node`] is the sum of these.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    /// What each pod holds; changed only by [`crate::core::reservation`].
    pub(crate) pods: HashMap<String, PodUsage>,
}

/// Every node the scheduler knows, with the pod ledger that produced their
/// usage.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    nodes: Vec<Node>,
    by_name: HashMap<String, NodeId>,
    pub(crate) ledger: Ledger,
    /// Per node, the value of `next_generation` at its last change.
    generations: Vec<u64>,
    /// Stamps changes; never repeats, so a stamp names one node state.
    next_generation: u64,
}

impl Cluster {
    /// A cluster of these nodes, with no usage recorded through the ledger.
    /// A later node with a name already seen replaces the earlier one.
    #[must_use]
    pub fn new(nodes: Vec<Node>) -> Self {
        let mut cluster = Self::default();
        for n in nodes {
            cluster.upsert_node(n);
        }
        cluster
    }

    /// Adds a node, or replaces the static facts (GPUs, capacity) of the node
    /// with the same name while keeping the usage of GPUs that still exist.
    pub fn upsert_node(&mut self, mut node: Node) -> NodeId {
        if let Some(&id) = self.by_name.get(&node.name) {
            let old = &self.nodes[id];
            for (pos, g) in node.gpus.iter().enumerate() {
                if let Some(old_pos) = old.gpu_position(&g.uuid) {
                    node.usage[pos] = old.usage[old_pos];
                    node.mig_slices[pos] = old.mig_slices[old_pos];
                }
            }
            node.used_cpu_milli = old.used_cpu_milli;
            node.used_memory_mib = old.used_memory_mib;
            self.nodes[id] = node;
            self.touch(id);
            id
        } else {
            let id = self.nodes.len();
            self.by_name.insert(node.name.clone(), id);
            self.nodes.push(node);
            self.generations.push(0);
            self.touch(id);
            id
        }
    }

    /// Gives the node a new generation.
    fn touch(&mut self, id: NodeId) {
        if let Some(g) = self.generations.get_mut(id) {
            // From 1: 0 is left to mean "never seen" in caches.
            self.next_generation += 1;
            *g = self.next_generation;
        }
    }

    /// The node's generation: it changes whenever the node or its usage may
    /// have changed (every mutable access), and a value is never given to
    /// two states of the cluster. Caches of per-node results key on it.
    #[must_use]
    pub fn generation(&self, id: NodeId) -> u64 {
        self.generations.get(id).copied().unwrap_or(u64::MAX)
    }

    /// All nodes, indexed by [`NodeId`].
    #[must_use]
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// One node.
    #[must_use]
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// The id of the node with this name.
    #[must_use]
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    /// One node, to change it; bumps its [`Cluster::generation`].
    pub(crate) fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.touch(id);
        self.nodes.get_mut(id)
    }

    /// Sets the CPU (milli-cores) and memory (MiB) the pods on node `id`
    /// take, where something other than the ledger counts them (the
    /// extender: every pod on the node, GPU or not, see
    /// `cache::hosts`). A node whose use does not change keeps its
    /// generation. Returns whether it changed.
    pub fn set_host_used(&mut self, id: NodeId, cpu_milli: u64, memory_mib: u64) -> bool {
        match self.nodes.get(id) {
            Some(n) if (n.used_cpu_milli, n.used_memory_mib) != (cpu_milli, memory_mib) => {}
            _ => return false,
        }
        if let Some(n) = self.node_mut(id) {
            n.used_cpu_milli = cpu_milli;
            n.used_memory_mib = memory_mib;
        }
        true
    }

    /// Total number of GPUs.
    #[must_use]
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Builders for small hand-checked clusters.
    use super::*;

    /// A register device: `count` slots, `mem` MiB, 100 cores, healthy.
    pub fn mk_device(node: &str, index: u32, ty: &str, count: u32, mem: u32) -> NodeDevice {
        NodeDevice {
            id: format!("GPU-{node}-{index}"),
            index,
            count,
            devmem: mem,
            devcore: 100,
            device_type: ty.to_owned(),
            numa: 0,
            mode: "hami-core".to_owned(),
            health: true,
            mig_profiles: Vec::new(),
        }
    }

    /// A node with `gpus` A100-40GB GPUs in `mig` mode (7 slots, the
    /// known profiles).
    pub fn mk_mig_node(name: &str, gpus: u32) -> Node {
        let devs: Vec<_> = (0..gpus)
            .map(|i| {
                let mut d = mk_device(name, i, "NVIDIA A100-SXM4-40GB", 7, 40960);
                d.mode = MODE_MIG.to_owned();
                d
            })
            .collect();
        Node::from_register(name, &devs)
    }

    /// A node with `gpus` identical GPUs.
    pub fn mk_node(name: &str, gpus: u32, count: u32, mem: u32) -> Node {
        let devs: Vec<_> = (0..gpus)
            .map(|i| mk_device(name, i, "NVIDIA-Tesla T4", count, mem))
            .collect();
        Node::from_register(name, &devs)
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn from_register_keeps_nvidia_devices_sorted_by_index() {
        let mut devs = vec![
            mk_device("n", 1, "NVIDIA-Tesla T4", 10, 16000),
            mk_device("n", 0, "nvidia A100", 10, 40000),
            mk_device("n", 2, "Ascend910", 10, 32000),
        ];
        devs[1].numa = 1;
        let node = Node::from_register("n", &devs);
        let idx: Vec<u32> = node.gpus.iter().map(|g| g.index).collect();
        assert_eq!(idx, vec![0, 1]);
        assert_eq!(node.gpus[0].numa, 1);
        assert_eq!(node.usage.len(), 2);
    }

    #[test]
    fn upsert_keeps_usage_of_surviving_gpus() {
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        c.node_mut(0).unwrap().usage[1].used = 3;
        let id = c.upsert_node(mk_node("a", 3, 10, 1000));
        assert_eq!(id, 0);
        let n = c.node(0).unwrap();
        assert_eq!(n.usage[1].used, 3);
        assert_eq!(n.usage[2].used, 0);
        assert_eq!(c.gpu_count(), 3);
        assert_eq!(c.node_id("a"), Some(0));
    }

    #[test]
    fn cpu_memory_fit_only_when_tracked() {
        let n = mk_node("a", 1, 10, 1000);
        assert!(n.fits_cpu_memory(u64::MAX, u64::MAX));
        let n = n.with_capacity(NodeCapacity {
            cpu_milli: 1000,
            memory_mib: 100,
        });
        assert!(n.fits_cpu_memory(1000, 100));
        assert!(!n.fits_cpu_memory(1001, 100));
        assert!(!n.fits_cpu_memory(1000, 101));
    }

    #[test]
    fn pair_scores_are_read_by_uuid_and_missing_pairs_score_zero() {
        let mut n = mk_node("a", 3, 10, 1000);
        let entry = |uuid: &str, peers: &[(&str, i64)]| DevicePairScore {
            uuid: uuid.to_owned(),
            score: peers.iter().map(|(p, s)| ((*p).to_owned(), *s)).collect(),
        };
        n.set_pair_scores(&[
            entry("GPU-other", &[("GPU-a-1", 999)]),
            entry("GPU-a-0", &[("GPU-a-1", 200), ("GPU-a-2", 10)]),
            entry("GPU-a-0", &[("GPU-a-1", 7)]),
            entry("GPU-a-1", &[("GPU-a-0", 200)]),
        ]);
        assert_eq!(n.pair_score(0, 1), 200, "the first entry of a UUID wins");
        assert_eq!(n.pair_score(0, 2), 10);
        assert_eq!(n.pair_score(1, 0), 200);
        assert_eq!(n.pair_score(1, 2), 0, "missing pair");
        assert_eq!(n.pair_score(2, 0), 0, "GPU without an entry");
        assert_eq!(n.pair_score(0, 9), 0);
        n.set_pair_scores(&[]);
        assert!(n.pair_scores.is_empty());
    }

    #[test]
    fn cordon_marks_listed_uuids_only() {
        let mut n = mk_node("a", 2, 10, 1000);
        n.set_cordoned(&[" GPU-a-1 "]);
        assert!(!n.gpus[0].cordoned);
        assert!(n.gpus[1].cordoned);
    }
}

//! Fragmentation and the FGD policy (fragmentation gradient descent, Weng
//! et al., USENIX ATC '23; definition in `traces/openb/README.md`).
//!
//! The fragmentation of a node, for a typical pod, is the idle GPU capacity
//! that pod cannot use: all of it when the pod cannot fit the node at all
//! (short of CPU, memory, GPU count or the GPU model), else only the GPUs
//! whose free share is below the pod's per-GPU request. A node's
//! fragmentation is the frequency-weighted sum over the workload's typical
//! pods ([`ShapeDistribution`]). FGD places a pod where the cluster's
//! fragmentation grows the least.
//!
//! Where [`FgdParams`] follows the paper's simulator (Alibaba's
//! `kubernetes-scheduler-simulator`, its FGD score plugin): a CPU-only
//! typical pod finds all idle GPU capacity a fragment; a node's score is
//! `⌊100 · sigmoid(−growth / 1000)⌋`, so near-equal growths tie; inside a
//! node a fractional pod takes the GPU with the best score. Where it does
//! not, because it measured better on openb: every shape of the trace is
//! typical (the simulator keeps the most frequent 95 %), memory is part of
//! a shape, and equal scores break by node fullness instead of by the
//! simulator's fixed seeded node order ([`FgdTies`]).
//!
//! This module owns the shape distribution (updated one pod at a time) and
//! the [`FgdIndex`]: per-node fragmentation, kept current by refreshing only
//! the node a placement touched. Shapes are grouped by their GPU part. Per
//! node the index keeps each GPU's free share and, per group, how many GPUs
//! can host it and the idle share of the others, so scoring a placement on
//! one GPU is one pass over the groups (not one per GPU per group); the
//! CPU/memory weights are recomputed only when the pod leaves less than a
//! fitting shape needs. The index also remembers each node's outcome for
//! the last few requests (`FgdIndex::memo`), valid while the node keeps
//! its [`Cluster::generation`], so a decision evaluates only the nodes that
//! changed since the same request last ran.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::core::fit::{
    FitFailure, Pick, PodPicks, Reason, apply_picks, check_gpu, fit_container, fit_pod,
};
use crate::core::kinds::GpuPolicy;
use crate::core::model::{Cluster, Gpu, GpuUse, Node, NodeId};
use crate::core::rare_hosts::{GuardedShape, admits, guarded_shapes};
use crate::core::request::{MemoryRequest, PodRequest};
use crate::core::rng::{SplitMix64, TieBreak};
use crate::core::score::{ScoringWeights, gpu_order_into};

/// GPU capacity of one card in milli-GPU.
pub const MILLI_PER_GPU: u32 = 1000;

/// A typical pod: what it asks of a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0: CPU only).
    pub gpus: u32,
    /// Share of each GPU, milli (1000: a whole card).
    pub milli: u32,
    /// Allowed GPU type substrings, lower-case (empty: any).
    pub types: Vec<String>,
}

impl Shape {
    /// The shape of a pod request: the largest GPU count of its containers,
    /// the per-GPU share from cores (else the memory percentage, else a
    /// whole card), the type allow-list, CPU and memory.
    #[must_use]
    pub fn of_request(req: &PodRequest) -> Self {
        let gpu_req = req
            .init
            .iter()
            .chain(&req.app)
            .flatten()
            .max_by_key(|r| r.nums);
        let (gpus, milli) = gpu_req.map_or((0, 0), |r| {
            let milli = if r.cores > 0 {
                r.cores.min(100) * 10
            } else if let MemoryRequest::Percent(p) = r.memory {
                p.min(100) * 10
            } else {
                MILLI_PER_GPU
            };
            (r.nums, milli)
        });
        Self {
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            gpus,
            milli,
            types: req.constraints.use_types.clone(),
        }
    }
}

/// How often each shape occurs in the workload; updated one pod at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapeDistribution {
    counts: BTreeMap<Shape, u64>,
    total: u64,
}

impl ShapeDistribution {
    /// Counts one more pod of this shape.
    pub fn observe(&mut self, shape: Shape) {
        *self.counts.entry(shape).or_insert(0) += 1;
        self.total += 1;
    }

    /// Forgets one pod of this shape (a sliding window); no-op when absent.
    pub fn forget(&mut self, shape: &Shape) {
        if let Some(c) = self.counts.get_mut(shape) {
            *c -= 1;
            self.total -= 1;
            if *c == 0 {
                self.counts.remove(shape);
            }
        }
    }

    /// Number of pods counted.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of distinct shapes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Shapes with their frequency (0–1), in a stable order.
    pub fn frequencies(&self) -> impl Iterator<Item = (&Shape, f64)> {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let total = self.total.max(1) as f64;
        #[allow(clippy::cast_precision_loss)]
        self.counts.iter().map(move |(s, c)| (s, *c as f64 / total))
    }
}

/// How CPU-only typical pods count in a node's fragmentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuOnlyFrag {
    /// As the paper's simulator: a CPU-only pod uses no GPU, so all idle
    /// GPU capacity is a fragment to it whether its CPU fits or not. The
    /// term moves with idle capacity only, so it never ranks one node over
    /// another.
    AllIdle,
    /// All idle capacity is a fragment only when the node is short of the
    /// pod's CPU or memory; else none.
    WhenShort,
}

/// How FGD breaks equal node scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FgdTies {
    /// A GPU pod goes to the fuller node (HAMi's binpack node score), which
    /// keeps empty nodes whole; a CPU-only pod goes where CPU is least
    /// needed by idle GPUs. Equal again: the seeded coin.
    Fullness,
    /// A seeded coin among the tied nodes, drawn anew at every decision, as
    /// upstream kube-scheduler's `selectHost` does.
    Coin,
    /// One fixed node order, drawn once from this seed: every tie goes to
    /// the node that comes first in it. This is what the paper's simulator
    /// does: its kube-scheduler fork takes the lexicographically smallest
    /// node name among equal scores, and the simulator renames every node
    /// with a prefix from a seeded random permutation. A fixed order acts
    /// as first fit among equal scores, so it packs.
    NodeOrder(u64),
}

impl FgdTies {
    /// The key of node `id` under [`FgdTies::NodeOrder`]: higher comes
    /// first. A seeded hash of the node id, so the order is a uniformly
    /// random one, fixed for the seed, and a node added later gets its
    /// place without reshuffling the others. 53 bits, exact in an `f64`.
    #[must_use]
    pub fn node_order_key(seed: u64, id: NodeId) -> f64 {
        let id = u64::try_from(id).unwrap_or(u64::MAX);
        let mut rng = SplitMix64::new(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        #[allow(clippy::cast_precision_loss)] // 53 bits: exact
        let key = (rng.next_u64() >> 11) as f64;
        key
    }
}

/// How the typical pods are chosen and fragmentation is scored.
///
/// The paper's simulator, as its published experiments ran it
/// (`docs/benchmarks.md`): coverage 0.95, no memory,
/// [`CpuOnlyFrag::AllIdle`], integer score, [`FgdTies::NodeOrder`], GPU by
/// score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FgdParams {
    /// The most frequent shapes that together cover at least this share of
    /// the pods are the typical pods (the paper's simulator: 0.95).
    pub coverage: f64,
    /// Whether memory is part of a typical pod's shape.
    pub memory: bool,
    /// How CPU-only typical pods count.
    pub cpu_only: CpuOnlyFrag,
    /// Score a node as the paper's simulator does:
    /// `⌊100 · sigmoid(−growth / 1000)⌋`, so growths that round to the same
    /// integer tie; else the growth itself is the score.
    pub quantize: bool,
    /// How equal node scores break.
    pub ties: FgdTies,
    /// Choose the GPU inside a node by the (possibly quantized) score, the
    /// lowest index on ties, as the paper's simulator; else by the exact
    /// growth, the least free share on ties.
    pub gpu_by_score: bool,
    /// A typical pod asking `n` whole GPUs counts as `1 + n x gpu_weight`
    /// pods, so multi-GPU shapes weigh more in fragmentation (the paper's
    /// simulator's `gpuResWeight`, 0 in its experiments). 0: by pods.
    pub gpu_weight: f64,
    /// With [`FgdTies::Fullness`], a GPU pod that may run on any model
    /// breaks equal scores by `fullness − scarce_models × pressure`, where a
    /// model's pressure is the typical pods' demand pinned to it per unit of
    /// its capacity (0–1, the most pressed model 1): such pods keep off the
    /// models pinned pods need. 0: off.
    pub scarce_models: f64,
}

/// The defaults, measured on openb (`docs/benchmarks.md`): every shape of
/// the trace with its memory, CPU-only pods counted as the paper's
/// simulator does, the paper's integer score, equal scores broken by node
/// fullness, the GPU chosen by that score.
impl Default for FgdParams {
    fn default() -> Self {
        Self {
            coverage: 1.0,
            memory: true,
            cpu_only: CpuOnlyFrag::AllIdle,
            quantize: true,
            ties: FgdTies::Fullness,
            gpu_by_score: true,
            gpu_weight: 0.0,
            scarce_models: 0.0,
        }
    }
}

/// The GPU part of a shape: GPU count, milli per GPU, type allow-list.
type GroupKey = (u32, u32, Vec<String>);

/// Shapes sharing a GPU part, with their CPU/memory and weights.
#[derive(Debug, Clone)]
struct Group {
    gpus: u32,
    milli: u32,
    types: Vec<String>,
    /// (cpu, memory, frequency)
    shapes: Vec<(u64, u64, f64)>,
    weight: f64,
}

/// The typical pods of a distribution: shapes merged as `params` says (no
/// memory, when memory is left out), the most frequent first until they
/// cover `params.coverage` of the pods, frequencies renormalized to sum 1.
fn typical_groups(dist: &ShapeDistribution, params: &FgdParams) -> Vec<Group> {
    let mut merged: BTreeMap<(GroupKey, u64, u64), f64> = BTreeMap::new();
    for (s, f) in dist.frequencies() {
        let mem = if params.memory { s.memory_mib } else { 0 };
        *merged
            .entry(((s.gpus, s.milli, s.types.clone()), s.cpu_milli, mem))
            .or_insert(0.0) += f;
    }
    if params.gpu_weight != 0.0 {
        // Whole-GPU shapes weigh 1 + GPUs x gpu_weight pods, then the
        // weights are renormalized (the simulator's `gpuResWeight`).
        for (((gpus, milli, _), _, _), f) in &mut merged {
            if *gpus > 0 && *milli >= MILLI_PER_GPU {
                *f *= 1.0 + f64::from(*gpus) * params.gpu_weight;
            }
        }
        let total: f64 = merged.values().sum();
        if total > 0.0 {
            merged.values_mut().for_each(|f| *f /= total);
        }
    }
    let mut ranked: Vec<((GroupKey, u64, u64), f64)> = merged.into_iter().collect();
    // Most frequent first; equal frequencies keep the key order (stable).
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut cum = 0.0;
    let mut keep = 0;
    for (_, f) in &ranked {
        if cum >= params.coverage - 1e-12 {
            break;
        }
        cum += f;
        keep += 1;
    }
    ranked.truncate(keep);
    let mut by_gpu: BTreeMap<GroupKey, Vec<(u64, u64, f64)>> = BTreeMap::new();
    for ((key, cpu, mem), f) in ranked {
        let f = if cum > 0.0 { f / cum } else { f };
        by_gpu.entry(key).or_default().push((cpu, mem, f));
    }
    by_gpu
        .into_iter()
        .map(|((gpus, milli, types), shapes)| Group {
            gpus,
            milli,
            types,
            weight: shapes.iter().map(|s| s.2).sum(),
            shapes,
        })
        .collect()
}

/// Whether the whole workload would ask more CPU or memory than the nodes
/// have to fill all their GPUs: its CPU (memory) per milli-GPU, every shape
/// of `dist` counted (CPU-only ones too, where it has them), times the
/// milli-GPU of the nodes whose CPU and memory are tracked, at least their
/// CPU (memory). Then CPU or memory, not GPUs, bound the cluster, and some
/// GPUs end stranded whatever the placement.
fn hosts_bind(dist: &ShapeDistribution, cluster: &Cluster) -> bool {
    let (mut cpu, mut mem, mut milli) = (0.0, 0.0, 0.0);
    for (s, f) in dist.frequencies() {
        #[allow(clippy::cast_precision_loss)]
        {
            cpu += f * s.cpu_milli as f64;
            mem += f * s.memory_mib as f64;
        }
        milli += f * f64::from(s.gpus) * f64::from(s.milli.min(MILLI_PER_GPU));
    }
    let (mut have_cpu, mut have_mem, mut have_milli) = (0u64, 0u64, 0u64);
    for node in cluster.nodes() {
        if let Some(cap) = node.capacity {
            have_cpu += cap.cpu_milli;
            have_mem += cap.memory_mib;
            have_milli += node.gpus.len() as u64 * u64::from(MILLI_PER_GPU);
        }
    }
    if milli <= 0.0 || have_milli == 0 {
        return false;
    }
    #[allow(clippy::cast_precision_loss)]
    let (have_cpu, have_mem, have_milli) = (have_cpu as f64, have_mem as f64, have_milli as f64);
    cpu / milli * have_milli >= have_cpu || mem / milli * have_milli >= have_mem
}

/// The typical GPU pods' (milli-CPU, MiB) per milli-GPU, frequency-weighted.
fn host_per_gpu(groups: &[Group]) -> (f64, f64) {
    let (mut cpu, mut mem, mut gpu) = (0.0, 0.0, 0.0);
    for grp in groups.iter().filter(|g| g.gpus > 0) {
        let milli = f64::from(grp.gpus) * f64::from(grp.milli.min(MILLI_PER_GPU));
        for &(c, m, f) in &grp.shapes {
            #[allow(clippy::cast_precision_loss)]
            {
                cpu += f * c as f64;
                mem += f * m as f64;
            }
            gpu += f * milli;
        }
    }
    if gpu > 0.0 {
        (cpu / gpu, mem / gpu)
    } else {
        (0.0, 0.0)
    }
}

/// Per GPU model of the cluster (lower case), the typical pods' demand
/// pinned to it per unit of its capacity: each pinned group's weight ×
/// GPU-milli spread over the capacity of the models it allows; scaled so
/// the most pressed model is 1 (empty without pinned pods).
fn pinned_pressure(groups: &[Group], cluster: &Cluster) -> BTreeMap<String, f64> {
    let mut capacity: BTreeMap<String, f64> = BTreeMap::new();
    for node in cluster.nodes() {
        for g in &node.gpus {
            *capacity
                .entry(g.device_type.to_ascii_lowercase())
                .or_default() += 1.0;
        }
    }
    let mut pressure: BTreeMap<String, f64> = BTreeMap::new();
    for grp in groups.iter().filter(|g| !g.types.is_empty() && g.gpus > 0) {
        let allowed: f64 = capacity
            .iter()
            .filter(|(m, _)| admits(&grp.types, m))
            .map(|(_, c)| c)
            .sum();
        if allowed == 0.0 {
            continue;
        }
        let demand = grp.weight * f64::from(grp.gpus) * f64::from(grp.milli);
        for (model, _) in capacity.iter().filter(|(m, _)| admits(&grp.types, m)) {
            *pressure.entry(model.clone()).or_default() += demand / allowed;
        }
    }
    let top = pressure.values().copied().fold(0.0, f64::max);
    if top > 0.0 {
        for v in pressure.values_mut() {
            *v /= top;
        }
    }
    pressure
}

/// The free share of one GPU as fragmentation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GpuFree {
    /// Unallocated share, milli.
    idle: u32,
    /// Share a new pod could still take (0 when out of slots), milli.
    usable: u32,
    /// Not used at all (a whole-card pod can take it).
    empty: bool,
}

fn gpu_free(g: &Gpu, u: &GpuUse) -> GpuFree {
    let by_cores = (u64::from(u.usedcores) * 1000)
        .checked_div(u64::from(g.devcore))
        .unwrap_or(0);
    let by_mem = u
        .usedmem
        .saturating_mul(1000)
        .checked_div(g.devmem)
        .unwrap_or(0);
    let alloc = u32::try_from(by_cores.max(by_mem).min(1000)).unwrap_or(1000);
    let idle = MILLI_PER_GPU - alloc;
    let out_of_slots = u.used >= g.count;
    GpuFree {
        idle,
        usable: if out_of_slots { 0 } else { idle },
        empty: u.used == 0 && idle == MILLI_PER_GPU,
    }
}

/// The free share of each of the node's GPUs.
fn gpus_free(node: &Node) -> Vec<GpuFree> {
    node.gpus
        .iter()
        .zip(&node.usage)
        .map(|(g, u)| gpu_free(g, u))
        .collect()
}

/// Idle share of one GPU, milli (by cores or memory, whichever is more in
/// use).
#[must_use]
pub fn gpu_idle_milli(g: &Gpu, u: &GpuUse) -> u32 {
    gpu_free(g, u).idle
}

/// Idle GPU capacity of a node, milli-GPU.
#[must_use]
pub fn node_idle_milli(node: &Node) -> u64 {
    node.gpus
        .iter()
        .zip(&node.usage)
        .map(|(g, u)| u64::from(gpu_free(g, u).idle))
        .sum()
}

/// Why a node's idle GPU capacity is still idle, judged against a
/// workload's GPU shapes: the share of the workload's GPU pods (by
/// frequency) in each case. The three add up to 1 (or are all 0 for a
/// workload without GPU pods).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IdleShares {
    /// Shapes that would still fit the node whole.
    pub usable: f64,
    /// Shapes that would fit the node's GPUs but not its free CPU or
    /// memory: for them, the host ran out first.
    pub host_bound: f64,
    /// Shapes that do not fit the node's GPUs (slices too small, the wrong
    /// type, out of slots).
    pub slivers: f64,
}

/// Classifies a node's idle GPU capacity (see [`IdleShares`]); CPU-only
/// shapes are not looked at.
#[must_use]
pub fn idle_shares(node: &Node, dist: &ShapeDistribution) -> IdleShares {
    let free = gpus_free(node);
    let (free_cpu, free_mem) = node.free_cpu_memory().unwrap_or((u64::MAX, u64::MAX));
    let mut out = IdleShares::default();
    for (shape, p) in dist.frequencies().filter(|(s, _)| s.gpus > 0) {
        let hosting = node
            .gpus
            .iter()
            .zip(&free)
            .filter(|(g, f)| {
                let ty = g.device_type.to_lowercase();
                admits(&shape.types, &ty)
                    && g.health
                    && !g.cordoned
                    && if shape.milli >= MILLI_PER_GPU {
                        f.empty
                    } else {
                        f.usable >= shape.milli
                    }
            })
            .count();
        if hosting < shape.gpus as usize {
            out.slivers += p;
        } else if shape.cpu_milli <= free_cpu && shape.memory_mib <= free_mem {
            out.usable += p;
        } else {
            out.host_bound += p;
        }
    }
    let sum = out.usable + out.host_bound + out.slivers;
    if sum > 0.0 {
        out.usable /= sum;
        out.host_bound /= sum;
        out.slivers /= sum;
    }
    out
}

/// One group's view of one node: how many GPUs could host one GPU of its
/// pods, and the idle share of the GPUs that could not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct GroupFit {
    usable: u32,
    unusable_idle: u64,
}

/// Whether GPU `i`, in this state, can host one GPU of the group's pods.
fn hosts(grp: &Group, mask: u64, i: usize, g: GpuFree) -> bool {
    let eligible = i < 64 && mask & (1 << i) != 0;
    eligible
        && if grp.milli >= MILLI_PER_GPU {
            g.empty
        } else {
            g.usable >= grp.milli
        }
}

/// What the index keeps per node, so that scoring a placement on one GPU
/// costs one pass over the groups for that GPU instead of a pass over
/// every GPU for every group.
#[derive(Debug, Clone, Default, PartialEq)]
struct NodeState {
    /// The node's [`Cluster::generation`] when this was computed.
    generation: u64,
    /// The node's fragmentation, milli-GPU (frequency-weighted).
    frag: f64,
    /// Per group: bit i set when GPU i's type suits the group.
    masks: Vec<u64>,
    /// Each GPU's free share.
    free: Vec<GpuFree>,
    /// The sum of the GPUs' idle shares, milli.
    idle: u64,
    /// Per group, at this usage.
    fits: Vec<GroupFit>,
    /// Per group, the weight of the shapes that fit the node's free CPU
    /// and memory, and of those that do not.
    weights: Vec<(f64, f64)>,
    /// The largest CPU and the largest memory among the shapes that fit
    /// the free CPU and memory: a pod that leaves at least this much free
    /// leaves `weights` as they are.
    fit_max: (u64, u64),
}

/// Where FGD puts a pod on one node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Placement {
    /// One GPU for the pod's only GPU container (an app container).
    Single {
        /// Position of the container in [`PodRequest::app`].
        app: usize,
        /// The GPU and what it takes.
        pick: Pick,
    },
    /// Every container's GPUs, fitted in the fallback order.
    Picks(PodPicks),
}

impl Placement {
    /// The positions of the GPUs it takes, in [`Node::gpus`].
    pub(crate) fn gpus(&self) -> Vec<usize> {
        match self {
            Self::Single { pick, .. } => vec![pick.gpu],
            Self::Picks(p) => p
                .init
                .iter()
                .chain(&p.app)
                .flatten()
                .map(|k| k.gpu)
                .collect(),
        }
    }

    /// The picks of every container.
    pub(crate) fn into_picks(self, req: &PodRequest) -> PodPicks {
        match self {
            Self::Picks(p) => p,
            Self::Single { app, pick } => {
                let mut picks = PodPicks {
                    init: vec![Vec::new(); req.init.len()],
                    app: vec![Vec::new(); req.app.len()],
                };
                if let Some(a) = picks.app.get_mut(app) {
                    a.push(pick);
                }
                picks
            }
        }
    }
}

/// One node's outcome for one request: the policy's key (higher is
/// better) and the placement, or why the pod does not fit.
pub(crate) type Outcome = Result<((f64, f64), Placement), FitFailure>;

/// Buffers one evaluation reuses from the previous one.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    weights: Vec<(f64, f64)>,
    tried: Vec<usize>,
    order: Vec<usize>,
}

/// How many distinct requests the index remembers outcomes for.
const MEMO_REQUESTS: usize = 4;

/// The per-node outcomes of one request, each valid while the node keeps
/// the [`Cluster::generation`] it was computed at.
#[derive(Debug, Clone)]
pub(crate) struct MemoEntry {
    req: PodRequest,
    weights: ScoringWeights,
    /// By node id: (generation, outcome).
    slots: Vec<Option<(u64, Outcome)>>,
}

impl MemoEntry {
    /// The node's remembered outcome, if it was computed at `generation`.
    pub(crate) fn get(&self, id: NodeId, generation: u64) -> Option<&Outcome> {
        match self.slots.get(id) {
            Some(Some((g, o))) if *g == generation => Some(o),
            _ => None,
        }
    }

    /// Remembers the node's outcome at `generation`.
    pub(crate) fn store(&mut self, id: NodeId, generation: u64, outcome: Outcome) {
        if self.slots.len() <= id {
            self.slots.resize(id + 1, None);
        }
        self.slots[id] = Some((generation, outcome));
    }

    /// Forgets the node's outcome.
    fn forget(&mut self, id: NodeId) {
        if let Some(slot) = self.slots.get_mut(id) {
            *slot = None;
        }
    }
}

/// Per-node fragmentation for a shape distribution, refreshed node by node,
/// with the per-node outcomes of the last few requests (see
/// `FgdIndex::memo`).
#[derive(Debug, Clone)]
pub struct FgdIndex {
    params: FgdParams,
    groups: Vec<Group>,
    nodes: Vec<NodeState>,
    /// Per GPU model (lower case), the pinned demand on it per unit of its
    /// capacity, the most pressed 1; from the nodes at build time, and only
    /// when [`FgdParams::scarce_models`] is on (else empty).
    pressure: BTreeMap<String, f64>,
    /// Most recently used first; at most [`MEMO_REQUESTS`].
    memo: Vec<MemoEntry>,
    /// The typical GPU pods' CPU (milli-CPU) and memory (MiB) per
    /// milli-GPU they ask, frequency-weighted ([`FgdIndex::host_per_gpu`]).
    host_per_gpu: (f64, f64),
    /// The workload's multi-GPU shapes few nodes can host, from the nodes
    /// at build time ([`FgdIndex::guarded_shapes`]).
    guarded: Vec<GuardedShape>,
    /// Whether CPU or memory, not GPUs, bound the cluster for this
    /// workload, from the nodes at build time ([`FgdIndex::hosts_bind`]).
    hosts_bind: bool,
}

impl FgdIndex {
    /// Builds the index for this distribution with the default parameters
    /// and computes every node.
    #[must_use]
    pub fn new(dist: &ShapeDistribution, cluster: &Cluster) -> Self {
        Self::with_params(dist, cluster, FgdParams::default())
    }

    /// Builds the index for this distribution and computes every node.
    #[must_use]
    pub fn with_params(dist: &ShapeDistribution, cluster: &Cluster, params: FgdParams) -> Self {
        let groups = typical_groups(dist, &params);
        let pressure = if params.scarce_models > 0.0 {
            pinned_pressure(&groups, cluster)
        } else {
            BTreeMap::new()
        };
        let host_per_gpu = host_per_gpu(&groups);
        let multi_gpu = dist
            .frequencies()
            .filter(|(s, _)| s.gpus >= 2 && s.milli >= MILLI_PER_GPU)
            .map(|(s, _)| GuardedShape {
                gpus: s.gpus,
                cpu_milli: s.cpu_milli,
                memory_mib: s.memory_mib,
                types: s.types.clone(),
            });
        let guarded = guarded_shapes(multi_gpu, cluster);
        let hosts_bind = hosts_bind(dist, cluster);
        let mut index = Self {
            params,
            groups,
            nodes: Vec::new(),
            pressure,
            memo: Vec::new(),
            host_per_gpu,
            guarded,
            hosts_bind,
        };
        for id in 0..cluster.nodes().len() {
            index.refresh_node(cluster, id);
        }
        index
    }

    /// The pinned-demand pressure on the model of `node`'s GPUs (0–1).
    #[must_use]
    pub fn model_pressure(&self, node: &Node) -> f64 {
        node.gpus
            .first()
            .and_then(|g| self.pressure.get(&g.device_type.to_ascii_lowercase()))
            .copied()
            .unwrap_or(0.0)
    }

    /// What the typical GPU pods ask of the host per milli-GPU they ask:
    /// (milli-CPU, memory MiB), frequency-weighted; (0, 0) without GPU pods.
    #[must_use]
    pub fn host_per_gpu(&self) -> (f64, f64) {
        self.host_per_gpu
    }

    /// The workload's shapes of two or more whole GPUs that fewer than half
    /// of the nodes with enough GPUs could host even when empty
    /// ([`crate::core::rare_hosts`]), from all shapes, not only the typical
    /// ones, and the nodes when the index was built.
    #[must_use]
    pub fn guarded_shapes(&self) -> &[GuardedShape] {
        &self.guarded
    }

    /// Whether the whole workload would ask more CPU or memory than the
    /// nodes have to fill all their GPUs, so that CPU or memory, not GPUs,
    /// bound the cluster; from the workload and the nodes whose CPU and
    /// memory are tracked, when the index was built. `simulate`'s workload
    /// holds the CPU-only pods too; `serve`'s holds GPU pods only, so there
    /// only GPU pods' CPU and memory count.
    #[must_use]
    pub fn hosts_bind(&self) -> bool {
        self.hosts_bind
    }

    /// The parameters the index was built with.
    #[must_use]
    pub fn params(&self) -> &FgdParams {
        &self.params
    }

    /// Number of typical shapes (CPU/memory/GPU combinations) in use.
    #[must_use]
    pub fn typical_shapes(&self) -> usize {
        self.groups.iter().map(|g| g.shapes.len()).sum()
    }

    /// The node score of a fragmentation growth (milli-GPU): higher is
    /// better. The growth negated, or the paper's integer score.
    #[must_use]
    pub fn score_of_growth(&self, growth: f64) -> f64 {
        if self.params.quantize {
            let s = 1.0 / (1.0 + (growth / 1000.0).exp());
            (s * 100.0).floor()
        } else {
            -growth
        }
    }

    fn masks_for(&self, node: &Node) -> Vec<u64> {
        self.groups
            .iter()
            .map(|grp| {
                let mut m = 0u64;
                for (i, g) in node.gpus.iter().enumerate().take(64) {
                    let ty = g.device_type.to_ascii_lowercase();
                    if admits(&grp.types, &ty) {
                        m |= 1 << i;
                    }
                }
                m
            })
            .collect()
    }

    /// Recomputes one node (after a placement or release touched it, or
    /// after it was added), and forgets the outcomes remembered for it.
    pub fn refresh_node(&mut self, cluster: &Cluster, id: NodeId) {
        let Some(node) = cluster.node(id) else {
            return;
        };
        if self.nodes.len() <= id {
            self.nodes.resize_with(id + 1, NodeState::default);
        }
        // GPU types may have changed with an upsert: cheap to redo.
        let masks = self.masks_for(node);
        let mut state = self.state_of(cluster.generation(id), node, masks, 0.0);
        state.frag = self.combine(&state.weights, state.idle, |j| state.fits[j]);
        self.nodes[id] = state;
        for entry in &mut self.memo {
            entry.forget(id);
        }
    }

    /// The node's state at its current usage, with these masks and this
    /// fragmentation.
    fn state_of(&self, generation: u64, node: &Node, masks: Vec<u64>, frag: f64) -> NodeState {
        let free = gpus_free(node);
        let idle = free.iter().map(|g| u64::from(g.idle)).sum();
        let mut fits = Vec::with_capacity(self.groups.len());
        self.fits_into(&masks, &free, &mut fits);
        let mut weights = Vec::with_capacity(self.groups.len());
        let fit_max = self.weights(node.free_cpu_memory(), &mut weights);
        NodeState {
            generation,
            frag,
            masks,
            free,
            idle,
            fits,
            weights,
            fit_max,
        }
    }

    /// The fragmentation of a node, milli-GPU (frequency-weighted).
    #[must_use]
    pub fn node_fragmentation(&self, id: NodeId) -> f64 {
        self.nodes.get(id).map_or(0.0, |n| n.frag)
    }

    /// The cluster's fragmentation, milli-GPU.
    #[must_use]
    pub fn cluster_fragmentation(&self) -> f64 {
        self.nodes.iter().map(|n| n.frag).sum()
    }

    /// Per group, the weight of shapes that fit this free CPU/memory and of
    /// those that do not; returns the largest CPU and the largest memory of
    /// a shape that fits.
    fn weights(&self, free: Option<(u64, u64)>, out: &mut Vec<(f64, f64)>) -> (u64, u64) {
        out.clear();
        let mut max = (0, 0);
        for grp in &self.groups {
            match free {
                None => out.push((grp.weight, 0.0)),
                Some((cpu, mem)) => {
                    let fit: f64 = grp
                        .shapes
                        .iter()
                        .filter(|s| s.0 <= cpu && s.1 <= mem)
                        .map(|s| s.2)
                        .sum();
                    out.push((fit, grp.weight - fit));
                    for s in grp.shapes.iter().filter(|s| s.0 <= cpu && s.1 <= mem) {
                        max = (max.0.max(s.0), max.1.max(s.1));
                    }
                }
            }
        }
        max
    }

    /// Per group, which GPUs in these states can host it.
    fn fits_into(&self, masks: &[u64], free: &[GpuFree], out: &mut Vec<GroupFit>) {
        out.clear();
        for (j, grp) in self.groups.iter().enumerate() {
            let mask = masks.get(j).copied().unwrap_or(0);
            let mut fit = GroupFit::default();
            for (i, g) in free.iter().enumerate() {
                if hosts(grp, mask, i, *g) {
                    fit.usable += 1;
                } else {
                    fit.unusable_idle += u64::from(g.idle);
                }
            }
            out.push(fit);
        }
    }

    /// A node's fragmentation from its idle total and each group's fit.
    /// The one place the float sum is taken, in group order, so the
    /// whole-node and the one-GPU-changed paths give the same bits.
    fn combine(
        &self,
        weights: &[(f64, f64)],
        idle_total: u64,
        fit: impl Fn(usize) -> GroupFit,
    ) -> f64 {
        if idle_total == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        #[allow(clippy::cast_precision_loss)]
        let idle_f = idle_total as f64;
        for (j, grp) in self.groups.iter().enumerate() {
            let (w_fit, w_nofit) = weights.get(j).copied().unwrap_or((0.0, 0.0));
            if grp.gpus == 0 && self.params.cpu_only == CpuOnlyFrag::AllIdle {
                frag += (w_fit + w_nofit) * idle_f;
                continue;
            }
            frag += w_nofit * idle_f;
            if w_fit == 0.0 || grp.gpus == 0 {
                continue;
            }
            let f = fit(j);
            #[allow(clippy::cast_precision_loss)]
            let g_frag = if f.usable >= grp.gpus {
                f.unusable_idle as f64
            } else {
                idle_f
            };
            frag += w_fit * g_frag;
        }
        frag
    }

    /// The node's fragmentation with GPU `pos` changed from `old` to `new`
    /// (the rest as `state` has them), under these weights.
    fn frag_with_one_changed(
        &self,
        state: &NodeState,
        weights: &[(f64, f64)],
        pos: usize,
        old: GpuFree,
        new: GpuFree,
    ) -> f64 {
        let idle = state.idle - u64::from(old.idle) + u64::from(new.idle);
        self.combine(weights, idle, |j| {
            let mut fit = state.fits.get(j).copied().unwrap_or_default();
            let (grp, mask) = (&self.groups[j], state.masks.get(j).copied().unwrap_or(0));
            if hosts(grp, mask, pos, old) {
                fit.usable -= 1;
            } else {
                fit.unusable_idle -= u64::from(old.idle);
            }
            if hosts(grp, mask, pos, new) {
                fit.usable += 1;
            } else {
                fit.unusable_idle += u64::from(new.idle);
            }
            fit
        })
    }

    /// FGD on one node: the placement whose fragmentation increase is the
    /// smallest, with that increase. A single-GPU, single-container pod
    /// tries every GPU that fits; other pods are fitted with the given
    /// order.
    ///
    /// # Errors
    /// Why the pod does not fit the node.
    pub fn best_on_node(
        &self,
        cluster: &Cluster,
        id: NodeId,
        req: &PodRequest,
        fallback_order: &[usize],
    ) -> Result<(f64, PodPicks), FitFailure> {
        let fill = |o: &mut Vec<usize>| {
            o.clear();
            o.extend_from_slice(fallback_order);
        };
        self.evaluate(cluster, id, req, fill, &mut Scratch::default())
            .map(|(d, p)| (d, p.into_picks(req)))
    }

    /// [`FgdIndex::best_on_node`], with the fallback order computed only
    /// when it is needed (`fallback` fills it) and buffers reused.
    pub(crate) fn evaluate(
        &self,
        cluster: &Cluster,
        id: NodeId,
        req: &PodRequest,
        fallback: impl FnOnce(&mut Vec<usize>),
        scratch: &mut Scratch,
    ) -> Result<(f64, Placement), FitFailure> {
        let Some(node) = cluster.node(id) else {
            return Err(FitFailure::single(Reason::NodeInsufficientDevice, 0));
        };
        // The kept state, or, should the node have changed without a
        // refresh, its current usage with the masks and fragmentation the
        // index last saw.
        let generation = cluster.generation(id);
        let current;
        let state = match self.nodes.get(id) {
            Some(s) if s.generation == generation => s,
            kept => {
                let masks = kept.map(|s| s.masks.clone()).unwrap_or_default();
                let frag = kept.map_or(0.0, |s| s.frag);
                current = self.state_of(generation, node, masks, frag);
                &current
            }
        };
        let before = state.frag;
        let after_free = node.free_cpu_memory().map(|(c, m)| {
            (
                c.saturating_sub(req.cpu_milli),
                m.saturating_sub(req.memory_mib),
            )
        });
        let Scratch {
            weights: weights_buf,
            tried,
            order,
        } = scratch;

        let mut gpu_apps = req
            .app
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)));
        let first = gpu_apps.next();
        let single = match first {
            Some((_, r)) => {
                r.nums == 1 && gpu_apps.next().is_none() && req.init.iter().all(Option::is_none)
            }
            None => false,
        };
        let Some((app_idx, r)) = first.filter(|_| single) else {
            fallback(order);
            let picks = fit_pod(node, req, order)?;
            let mut usage = node.usage.clone();
            for p in &picks.app {
                apply_picks(&mut usage, p);
            }
            for p in picks.init.iter().flatten() {
                if let Some(u) = usage.get_mut(p.gpu) {
                    u.used = u.used.max(1);
                    u.usedmem = u.usedmem.max(p.usedmem);
                    u.usedcores = u.usedcores.max(p.usedcores);
                }
            }
            let free: Vec<GpuFree> = node
                .gpus
                .iter()
                .zip(&usage)
                .map(|(g, u)| gpu_free(g, u))
                .collect();
            let idle = free.iter().map(|g| u64::from(g.idle)).sum();
            let mut fits = Vec::with_capacity(self.groups.len());
            self.fits_into(&state.masks, &free, &mut fits);
            self.weights(after_free, weights_buf);
            let after = self.combine(weights_buf, idle, |j| fits[j]);
            return Ok((after - before, Placement::Picks(picks)));
        };

        if !node.fits_cpu_memory(req.cpu_milli, req.memory_mib) {
            fallback(order);
            return fit_pod(node, req, order).map(|p| (0.0, Placement::Picks(p)));
        }
        // The pod's CPU and memory change the weights only when they leave
        // less than some fitting shape needs.
        let weights: &[(f64, f64)] = match after_free {
            Some((c, m)) if c < state.fit_max.0 || m < state.fit_max.1 => {
                self.weights(after_free, weights_buf);
                weights_buf
            }
            _ => &state.weights,
        };
        // (fragmentation after, GPU, memory, cores, free share left, score).
        let mut best: Option<(f64, usize, u64, u32, u32, f64)> = None;
        tried.clear();
        for (pos, (g, u)) in node.gpus.iter().zip(&node.usage).enumerate() {
            let Ok(p) = check_gpu(g, u, &r, &req.constraints) else {
                continue;
            };
            if req
                .constraints
                .quota
                .is_some_and(|q| !q.admits(p.usedmem, p.usedcores))
            {
                continue;
            }
            // The type string last: the one comparison that reads memory
            // away from the GPU.
            let same = tried.iter().any(|&t| {
                node.usage[t] == *u
                    && node.gpus[t].devmem == g.devmem
                    && node.gpus[t].devcore == g.devcore
                    && node.gpus[t].count == g.count
                    && node.gpus[t].device_type == g.device_type
            });
            if same {
                continue;
            }
            tried.push(pos);
            let after = GpuUse {
                used: u.used + 1,
                usedmem: u.usedmem + p.usedmem,
                usedcores: u.usedcores + p.usedcores,
            };
            let after_gpu = gpu_free(g, &after);
            let f = self.frag_with_one_changed(state, weights, pos, state.free[pos], after_gpu);
            // Equal growth: the GPU left with the least free share wins.
            let left = after_gpu.idle;
            // The best's score is kept, not computed again per GPU.
            let score = if self.params.gpu_by_score {
                self.score_of_growth(f - before)
            } else {
                0.0
            };
            let better = if self.params.gpu_by_score {
                best.is_none_or(|b| score > b.5)
            } else {
                best.is_none_or(|b| f < b.0 - 1e-9 || (f <= b.0 + 1e-9 && left < b.4))
            };
            if better {
                best = Some((f, pos, p.usedmem, p.usedcores, left, score));
            }
        }
        let Some((f, pos, usedmem, usedcores, _, _)) = best else {
            // Nothing fits: let fit explain why.
            fallback(order);
            let err = fit_container(node, &node.usage, order, &r, &req.constraints)
                .err()
                .unwrap_or_else(|| {
                    FitFailure::single(Reason::AllocatedCardsInsufficientRequest, node.gpus.len())
                });
            return Err(err);
        };
        let pick = Pick {
            gpu: pos,
            usedmem,
            usedcores,
        };
        Ok((f - before, Placement::Single { app: app_idx, pick }))
    }

    /// The outcomes remembered for this request (scored with these GPU
    /// weights), taken out of the index; empty when there are none. Give
    /// them back with [`FgdIndex::remember`].
    ///
    /// An outcome is a pure function of the node (its generation), the
    /// request, the weights and the index (groups, parameters, and the
    /// node's kept fragmentation, which [`FgdIndex::refresh_node`] changes
    /// and therefore forgets the node's outcomes). A new index (a rebuild
    /// for a changed workload) starts with none.
    pub(crate) fn memo(&mut self, req: &PodRequest, weights: ScoringWeights) -> MemoEntry {
        match self
            .memo
            .iter()
            .position(|e| e.weights == weights && e.req == *req)
        {
            Some(i) => self.memo.remove(i),
            None => MemoEntry {
                req: req.clone(),
                weights,
                slots: Vec::new(),
            },
        }
    }

    /// Keeps these outcomes as the most recently used.
    pub(crate) fn remember(&mut self, entry: MemoEntry) {
        self.memo.insert(0, entry);
        self.memo.truncate(MEMO_REQUESTS);
    }

    /// Forgets every remembered outcome.
    pub fn forget_outcomes(&mut self) {
        self.memo.clear();
    }

    /// One decision of an FGD-based policy (`fgd`, `fgdpack`) over the
    /// candidates. Each node's outcome comes from the memo kept under
    /// `memo_req` when the node has not changed since, else it is evaluated
    /// (the placement inside the node and the growth, which `key` turns
    /// into a (key, secondary key) pair) and remembered. The highest key
    /// wins; keys equal within 1e-9 break by `rng`, every tied node equally
    /// likely. Nodes are offered in candidate order either way, so the
    /// seeded tie break draws the same. Returns the winner (its key's first
    /// part, the node, its GPUs) and the refused nodes in candidate order.
    #[allow(clippy::too_many_arguments)] // one call per policy
    pub(crate) fn scan(
        &mut self,
        cluster: &Cluster,
        memo_req: &PodRequest,
        req: &PodRequest,
        candidates: impl IntoIterator<Item = NodeId>,
        weights: ScoringWeights,
        key: impl Fn(&Self, NodeId, &Node, f64, &Placement) -> (f64, f64),
        rng: &mut SplitMix64,
    ) -> ScanOutcome {
        let mut memo = self.memo(memo_req, weights);
        let view = &*self;
        let mut scratch = Scratch::default();
        let mut scores = Vec::new();
        let mut failed = Vec::new();
        let mut best: Option<((f64, f64), NodeId)> = None;
        let mut ties = TieBreak::default();
        for id in candidates {
            let Some(node) = cluster.node(id) else {
                continue;
            };
            let generation = cluster.generation(id);
            if memo.get(id, generation).is_none() {
                let fallback = |order: &mut Vec<usize>| {
                    gpu_order_into(node, req, GpuPolicy::BINPACK, &weights, order, &mut scores);
                };
                let outcome = view.evaluate(cluster, id, req, fallback, &mut scratch).map(
                    |(growth, placement)| (key(view, id, node, growth, &placement), placement),
                );
                memo.store(id, generation, outcome);
            }
            let Some(outcome) = memo.get(id, generation) else {
                continue; // stored just above
            };
            match outcome {
                Err(f) => failed.push((id, *f)),
                Ok((k, _)) => {
                    let replace = match &best {
                        Some((top, _)) => match compare_keys(*k, *top) {
                            Ordering::Greater => {
                                ties.reset();
                                ties.offer(rng)
                            }
                            Ordering::Equal => ties.offer(rng),
                            Ordering::Less => false,
                        },
                        None => {
                            ties.reset();
                            ties.offer(rng)
                        }
                    };
                    if replace {
                        best = Some((*k, id));
                    }
                }
            }
        }
        let chosen = best.and_then(|((score, _), node)| {
            match memo.get(node, cluster.generation(node)) {
                Some(Ok((_, placement))) => Some((score, node, placement.clone().into_picks(req))),
                // The winner was offered because its outcome is a placement.
                _ => None,
            }
        });
        self.remember(memo);
        (chosen, failed)
    }
}

/// What [`FgdIndex::scan`] found: the winner (its key's first part, the
/// node, its GPUs), if any node fits, and the refused nodes.
pub(crate) type ScanOutcome = (Option<(f64, NodeId, PodPicks)>, Vec<(NodeId, FitFailure)>);

/// Compares two (key, secondary key) pairs, equal within 1e-9 (as every
/// policy does).
fn compare_keys(a: (f64, f64), b: (f64, f64)) -> Ordering {
    let cmp = |x: f64, y: f64| {
        if x > y + 1e-9 {
            Ordering::Greater
        } else if x < y - 1e-9 {
            Ordering::Less
        } else {
            Ordering::Equal
        }
    };
    cmp(a.0, b.0).then_with(|| cmp(a.1, b.1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::NodeCapacity;
    use crate::core::model::testutil::{mk_device, mk_node};
    use crate::core::request::DeviceRequest;
    use crate::core::reservation::HostResources;
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

    fn pod(cores: u32) -> PodRequest {
        PodRequest {
            app: vec![Some(DeviceRequest {
                nums: 1,
                memory: MemoryRequest::Percent(cores),
                cores,
            })],
            ..PodRequest::default()
        }
    }

    #[test]
    fn idle_shares_split_the_workload_by_what_stops_it() {
        // Shapes: a 100-milli pod with 4 cores, a 500-milli pod with 1 core,
        // a whole-GPU pod with 1 core, and a CPU-only pod (not looked at).
        let mut d = ShapeDistribution::default();
        d.observe(Shape {
            cpu_milli: 4000,
            ..share(100)
        });
        d.observe(Shape {
            cpu_milli: 1000,
            ..share(500)
        });
        d.observe(Shape {
            cpu_milli: 1000,
            ..share(1000)
        });
        d.observe(Shape {
            cpu_milli: 1000,
            gpus: 0,
            milli: 0,
            ..share(0)
        });
        let node = |free_cpu: u64| {
            let mut n = mk_node("a", 1, 10, 1000).with_capacity(NodeCapacity {
                cpu_milli: 8000,
                memory_mib: 1 << 20,
            });
            n.used_cpu_milli = 8000 - free_cpu;
            // 810 of the GPU in use: 190 left.
            n.usage[0] = GpuUse {
                used: 1,
                usedmem: 810,
                usedcores: 81,
            };
            n
        };
        let third = 1.0 / 3.0;
        let close = |a: IdleShares, b: [f64; 3]| {
            (a.usable - b[0]).abs() < 1e-9
                && (a.host_bound - b[1]).abs() < 1e-9
                && (a.slivers - b[2]).abs() < 1e-9
        };
        // Enough CPU: the 100-milli pod fits; the other two do not fit the GPU.
        let plenty = idle_shares(&node(8000), &d);
        assert!(close(plenty, [third, 0.0, 2.0 * third]), "{plenty:?}");
        // 2 cores left: the 100-milli pod fits the GPU, not the host.
        let tight = idle_shares(&node(2000), &d);
        assert!(close(tight, [0.0, third, 2.0 * third]), "{tight:?}");
        // An empty GPU and no CPU: every shape is host-bound.
        let mut empty = node(0);
        empty.usage[0] = GpuUse::default();
        let host = idle_shares(&empty, &d);
        assert!(close(host, [0.0, 1.0, 0.0]), "{host:?}");
        // A workload without GPU pods has no shares.
        let mut cpu_only = ShapeDistribution::default();
        cpu_only.observe(Shape {
            gpus: 0,
            milli: 0,
            ..share(0)
        });
        assert_eq!(idle_shares(&empty, &cpu_only), IdleShares::default());
    }

    #[test]
    fn distribution_is_incremental() {
        let mut d = ShapeDistribution::default();
        d.observe(share(500));
        d.observe(share(500));
        d.observe(share(200));
        assert_eq!((d.total(), d.len()), (3, 2));
        d.forget(&share(500));
        d.forget(&share(999));
        let f: Vec<f64> = d.frequencies().map(|(_, f)| f).collect();
        assert_eq!(f, vec![0.5, 0.5]);
    }

    #[test]
    fn node_fragmentation_matches_hand_computation() {
        // Node with 2 GPUs: GPU0 has 300 milli free, GPU1 is free.
        // Workload: 50 % pods of 500 milli, 50 % whole-card pods x2.
        let mut d = ShapeDistribution::default();
        d.observe(share(500));
        d.observe(Shape {
            gpus: 2,
            milli: 1000,
            ..share(0)
        });
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 700,
            usedcores: 70,
        };
        let idx = FgdIndex::new(&d, &c);
        // 500-milli pod: GPU0 (300 free) is a fragment = 300.
        // 2-GPU pod: needs two empty GPUs, only one: all idle = 1300.
        let want = 0.5 * 300.0 + 0.5 * 1300.0;
        assert!(
            (idx.node_fragmentation(0) - want).abs() < 1e-9,
            "{}",
            idx.node_fragmentation(0)
        );
    }

    #[test]
    fn cpu_shortage_makes_all_idle_capacity_a_fragment() {
        let mut d = ShapeDistribution::default();
        d.observe(Shape {
            cpu_milli: 4000,
            ..share(100)
        });
        let c = Cluster::new(vec![mk_node("a", 1, 10, 1000).with_capacity(
            NodeCapacity {
                cpu_milli: 2000,
                memory_mib: 1 << 20,
            },
        )]);
        let idx = FgdIndex::new(&d, &c);
        assert!((idx.node_fragmentation(0) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn type_allow_list_counts_other_models_as_fragment() {
        let mut d = ShapeDistribution::default();
        d.observe(Shape {
            types: vec!["a100".into()],
            ..share(100)
        });
        let c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        let idx = FgdIndex::new(&d, &c);
        assert!((idx.cluster_fragmentation() - 2000.0).abs() < 1e-9);
    }

    #[test]
    fn fgd_fills_the_gpu_that_leaves_no_fragment() {
        // Workload: only 500-milli pods. GPU0 has 500 free, GPU1 has 800.
        // Putting a 300 pod on GPU1 leaves 500 (usable); on GPU0 leaves 200
        // (a fragment). FGD picks GPU1.
        let mut d = ShapeDistribution::default();
        d.observe(share(500));
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 500,
            usedcores: 50,
        };
        c.node_mut(0).unwrap().usage[1] = GpuUse {
            used: 1,
            usedmem: 200,
            usedcores: 20,
        };
        let idx = FgdIndex::new(&d, &c);
        let (delta, picks) = idx.best_on_node(&c, 0, &pod(30), &[0, 1]).unwrap();
        assert_eq!(picks.app[0][0].gpu, 1);
        // Before and after: no GPU below 500 free, no fragment.
        assert!(delta.abs() < 1e-9, "{delta}");
        // With a 200 pod on GPU0 the node gets a 300 fragment instead.
        let (delta, picks) = idx.best_on_node(&c, 0, &pod(20), &[0, 1]).unwrap();
        assert_eq!(
            picks.app[0][0].gpu, 1,
            "GPU1 keeps 600 usable, GPU0 would drop to 300"
        );
        assert!(delta.abs() < 1e-9, "{delta}");
    }

    #[test]
    fn typical_pods_cover_the_most_frequent_shapes_renormalized() {
        // Shapes: 500 x4 (two memories), 200 x3, 1000 x2, 100 x1.
        let mut d = ShapeDistribution::default();
        for (milli, mem, n) in [
            (500, 1, 2),
            (500, 2, 2),
            (200, 0, 3),
            (1000, 0, 2),
            (100, 0, 1),
        ] {
            for _ in 0..n {
                d.observe(Shape {
                    memory_mib: mem,
                    ..share(milli)
                });
            }
        }
        let weights = |p: FgdParams| -> Vec<(u32, usize, f64)> {
            typical_groups(&d, &p)
                .iter()
                .map(|g| (g.milli, g.shapes.len(), g.weight))
                .collect()
        };
        // Without memory, 80 % is covered by 500 (0.4), 200 (0.3) and
        // 1000 (0.2), renormalized over 0.9; the 100 shape is dropped.
        let p = FgdParams {
            coverage: 0.8,
            memory: false,
            ..FgdParams::default()
        };
        let w = weights(p);
        assert_eq!(w.len(), 3, "{w:?}");
        let want = [
            (200, 1, 3.0 / 9.0),
            (500, 1, 4.0 / 9.0),
            (1000, 1, 2.0 / 9.0),
        ];
        for (got, want) in w.iter().zip(want) {
            assert_eq!((got.0, got.1), (want.0, want.1));
            assert!((got.2 - want.2).abs() < 1e-12, "{w:?}");
        }
        // With memory the two 500 shapes stay apart (0.2 each): 200 (0.3),
        // then a 500 (0.2) and the 1000 (0.2) or the other 500 reach 0.7,
        // one more reaches 0.9 >= 0.8.
        let p = FgdParams {
            coverage: 0.8,
            ..FgdParams::default()
        };
        let kept: usize = weights(p).iter().map(|g| g.1).sum();
        assert_eq!(kept, 4);
        // Full coverage keeps all five shapes, summing to 1.
        let all = weights(FgdParams::default());
        assert_eq!(all.iter().map(|g| g.1).sum::<usize>(), 5);
        assert!((all.iter().map(|g| g.2).sum::<f64>() - 1.0).abs() < 1e-12);
        // Weighted by whole GPUs (w = 1): the two 1-GPU pods count as
        // 2 x (1 + 1) = 4 of 12, as much as the four 500 pods.
        let w = weights(FgdParams {
            memory: false,
            gpu_weight: 1.0,
            ..FgdParams::default()
        });
        let of = |milli: u32| w.iter().find(|g| g.0 == milli).map_or(0.0, |g| g.2);
        assert!((of(1000) - 4.0 / 12.0).abs() < 1e-12, "{w:?}");
        assert!((of(500) - 4.0 / 12.0).abs() < 1e-12, "{w:?}");
        assert!((of(100) - 1.0 / 12.0).abs() < 1e-12, "{w:?}");
    }

    #[test]
    fn cpu_only_typical_pods_see_all_idle_capacity_or_only_when_short() {
        // One 2-GPU node with 4 CPUs, one GPU half used. Workload: half
        // CPU-only pods of 2 CPUs, half 500-milli pods.
        let mut d = ShapeDistribution::default();
        d.observe(Shape {
            cpu_milli: 2000,
            gpus: 0,
            milli: 0,
            ..share(0)
        });
        d.observe(share(500));
        let cap = NodeCapacity {
            cpu_milli: 4000,
            memory_mib: 1 << 20,
        };
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000).with_capacity(cap)]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 500,
            usedcores: 50,
        };
        // Paper: CPU-only pods find all 1500 idle a fragment; the 500 pod
        // fits both GPUs: 0.5 * 1500 + 0.5 * 0.
        let idx = FgdIndex::new(&d, &c);
        assert!((idx.node_fragmentation(0) - 750.0).abs() < 1e-9);
        // When short only: the CPU fits, no fragment at all.
        let p = FgdParams {
            cpu_only: CpuOnlyFrag::WhenShort,
            ..FgdParams::default()
        };
        let idx = FgdIndex::with_params(&d, &c, p);
        assert!(idx.node_fragmentation(0).abs() < 1e-9);
    }

    #[test]
    fn quantized_score_is_the_papers_integer_sigmoid() {
        let d = ShapeDistribution::default();
        let c = Cluster::new(vec![]);
        let idx = FgdIndex::new(&d, &c);
        // 100 / (1 + e^(g/1000)), rounded down.
        assert!((idx.score_of_growth(0.0) - 50.0).abs() < 1e-12);
        assert!((idx.score_of_growth(30.0) - 49.0).abs() < 1e-12); // 49.25
        assert!((idx.score_of_growth(-30.0) - 50.0).abs() < 1e-12); // 50.75
        assert!((idx.score_of_growth(300.0) - 42.0).abs() < 1e-12); // 42.56
        let exact = FgdParams {
            quantize: false,
            ..FgdParams::default()
        };
        let idx = FgdIndex::with_params(&d, &c, exact);
        assert!((idx.score_of_growth(30.0) + 30.0).abs() < 1e-12);
    }

    #[test]
    fn gpu_choice_by_score_takes_the_lowest_index_on_ties() {
        // Workload: 600-milli pods. GPU0 has 700 free, GPU1 650. A 50 pod on
        // GPU0 leaves 650 (no fragment); on GPU1 600 (none either). Exact
        // growth ties too; by score the lowest index wins, by growth the
        // least free share left (GPU1).
        let mut d = ShapeDistribution::default();
        d.observe(share(600));
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 300,
            usedcores: 30,
        };
        c.node_mut(0).unwrap().usage[1] = GpuUse {
            used: 1,
            usedmem: 350,
            usedcores: 35,
        };
        let idx = FgdIndex::new(&d, &c);
        let (_, picks) = idx.best_on_node(&c, 0, &pod(5), &[0, 1]).unwrap();
        assert_eq!(picks.app[0][0].gpu, 0);
        let p = FgdParams {
            gpu_by_score: false,
            ..FgdParams::default()
        };
        let idx = FgdIndex::with_params(&d, &c, p);
        let (_, picks) = idx.best_on_node(&c, 0, &pod(5), &[0, 1]).unwrap();
        assert_eq!(picks.app[0][0].gpu, 1);
        // A growth the score can tell apart still decides: a 100 pod on
        // GPU1 leaves 550 < 600, a 550 fragment (score 36); on GPU0 600.
        let idx = FgdIndex::new(&d, &c);
        let (delta, picks) = idx.best_on_node(&c, 0, &pod(10), &[0, 1]).unwrap();
        assert_eq!(picks.app[0][0].gpu, 0);
        assert!(delta.abs() < 1e-9, "{delta}");
    }

    #[test]
    fn fgd_reports_why_nothing_fits() {
        let d = ShapeDistribution::default();
        let mut c = Cluster::new(vec![mk_node("a", 1, 10, 1000)]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 900,
            usedcores: 90,
        };
        let idx = FgdIndex::new(&d, &c);
        let err = idx.best_on_node(&c, 0, &pod(30), &[0]).unwrap_err();
        assert_eq!(err.to_string(), "1/1 CardInsufficientMemory");
    }

    /// The whole-node fragmentation as this module computed it before it
    /// kept per-node state (every GPU against every group), written out
    /// again as the reference the kept state must reproduce bit for bit.
    fn reference_frag(
        idx: &FgdIndex,
        masks: &[u64],
        weights: &[(f64, f64)],
        gpus: &[GpuFree],
    ) -> f64 {
        let idle_total: u64 = gpus.iter().map(|g| u64::from(g.idle)).sum();
        if idle_total == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        #[allow(clippy::cast_precision_loss)]
        let idle_f = idle_total as f64;
        for (j, grp) in idx.groups.iter().enumerate() {
            let (w_fit, w_nofit) = weights[j];
            if grp.gpus == 0 && idx.params.cpu_only == CpuOnlyFrag::AllIdle {
                frag += (w_fit + w_nofit) * idle_f;
                continue;
            }
            frag += w_nofit * idle_f;
            if w_fit == 0.0 || grp.gpus == 0 {
                continue;
            }
            let mask = masks.get(j).copied().unwrap_or(0);
            let (mut usable, mut unusable) = (0u32, 0u64);
            for (i, g) in gpus.iter().enumerate() {
                let eligible = i < 64 && mask & (1 << i) != 0;
                let ok = eligible
                    && if grp.milli >= MILLI_PER_GPU {
                        g.empty
                    } else {
                        g.usable >= grp.milli
                    };
                if ok {
                    usable += 1;
                } else {
                    unusable += u64::from(g.idle);
                }
            }
            #[allow(clippy::cast_precision_loss)]
            let g_frag = if usable >= grp.gpus {
                unusable as f64
            } else {
                idle_f
            };
            frag += w_fit * g_frag;
        }
        frag
    }

    fn reference_node_frag(idx: &FgdIndex, node: &Node) -> f64 {
        let free = gpus_free(node);
        let mut w = Vec::new();
        idx.weights(node.free_cpu_memory(), &mut w);
        reference_frag(idx, &idx.masks_for(node), &w, &free)
    }

    /// The single-GPU choice as it was made before: every fitting GPU tried
    /// with the whole node evaluated again, the weights always recomputed.
    fn reference_single(
        idx: &FgdIndex,
        c: &Cluster,
        id: NodeId,
        req: &PodRequest,
    ) -> Option<(f64, usize)> {
        let node = c.node(id)?;
        let r = req.app[0]?;
        if !node.fits_cpu_memory(req.cpu_milli, req.memory_mib) {
            return None;
        }
        let before = reference_node_frag(idx, node);
        let after_free = node.free_cpu_memory().map(|(c, m)| {
            (
                c.saturating_sub(req.cpu_milli),
                m.saturating_sub(req.memory_mib),
            )
        });
        let mut weights = Vec::new();
        idx.weights(after_free, &mut weights);
        let masks = idx.masks_for(node);
        let mut free = gpus_free(node);
        let mut best: Option<(f64, usize)> = None;
        let mut tried: Vec<usize> = Vec::new();
        for (pos, (g, u)) in node.gpus.iter().zip(&node.usage).enumerate() {
            let Ok(p) = check_gpu(g, u, &r, &req.constraints) else {
                continue;
            };
            let same = tried.iter().any(|&t| {
                node.usage[t] == *u
                    && node.gpus[t].device_type == g.device_type
                    && node.gpus[t].devmem == g.devmem
                    && node.gpus[t].devcore == g.devcore
                    && node.gpus[t].count == g.count
            });
            if same {
                continue;
            }
            tried.push(pos);
            let after = GpuUse {
                used: u.used + 1,
                usedmem: u.usedmem + p.usedmem,
                usedcores: u.usedcores + p.usedcores,
            };
            let old = free[pos];
            free[pos] = gpu_free(g, &after);
            let f = reference_frag(idx, &masks, &weights, &free);
            free[pos] = old;
            if best
                .is_none_or(|b| idx.score_of_growth(f - before) > idx.score_of_growth(b.0 - before))
            {
                best = Some((f, pos));
            }
        }
        best.map(|(f, pos)| (f - before, pos))
    }

    /// Three nodes unlike each other: T4s with CPU and memory, a mix of
    /// A100s and a smaller T4, and T4s with no CPU/memory figures.
    fn mixed_cluster() -> Cluster {
        let cap = NodeCapacity {
            cpu_milli: 4000,
            memory_mib: 4000,
        };
        let b = Node::from_register(
            "b",
            &[
                mk_device("b", 0, "NVIDIA-A100", 3, 1000),
                mk_device("b", 1, "NVIDIA-Tesla T4", 3, 800),
                mk_device("b", 2, "NVIDIA-A100", 3, 1000),
            ],
        )
        .with_capacity(cap);
        Cluster::new(vec![
            mk_node("a", 2, 4, 1000).with_capacity(cap),
            b,
            mk_node("c", 3, 10, 1000),
        ])
    }

    proptest::proptest! {
        /// After any sequence of reserves and releases, each refreshed
        /// node's kept state equals a freshly built index's, its
        /// fragmentation equals the whole-node reference to the bit, and
        /// the GPU chosen for a slice pod (growth included, to the bit)
        /// equals the reference that re-evaluates the whole node per GPU.
        #[test]
        fn kept_node_state_equals_a_fresh_index_and_the_whole_node_reference(
            shapes in proptest::collection::vec(
                (0u64..3000, 0u64..3000, 0u32..3, 1u32..=10, proptest::bool::ANY), 1..8),
            ops in proptest::collection::vec(
                (proptest::bool::weighted(0.7), 0usize..3, 0usize..3, 1u64..600, 1u32..60, 0u64..1500, 0usize..40),
                1..30),
            probes in proptest::collection::vec((1u32..=10, 0u64..1200, 0u64..3000, 0u64..3000), 1..4),
        ) {
            let mut dist = ShapeDistribution::default();
            for (cpu, mem, gpus, tenths, a100) in shapes {
                dist.observe(Shape {
                    cpu_milli: cpu,
                    memory_mib: mem,
                    gpus,
                    milli: if gpus == 0 { 0 } else { tenths * 100 },
                    types: if a100 { vec!["a100".into()] } else { vec![] },
                });
            }
            let mut c = mixed_cluster();
            let mut live = FgdIndex::new(&dist, &c);
            let mut held: Vec<(String, NodeId)> = Vec::new();
            for (k, (reserve, node, gpu, mem, cores, cpu, pick)) in ops.into_iter().enumerate() {
                if reserve {
                    let n = c.node(node).unwrap();
                    let uuid = n.gpus[gpu % n.gpus.len()].uuid.clone();
                    let devices: PodDevices = format!("{uuid},NVIDIA,{mem},{cores}:;").parse().unwrap();
                    let uid = format!("p{k}");
                    let host = HostResources { cpu_milli: cpu, memory_mib: cpu };
                    if c.reserve(&uid, node, &devices, 0, host).is_ok() {
                        held.push((uid, node));
                    }
                    live.refresh_node(&c, node);
                } else if !held.is_empty() {
                    let (uid, node) = held.remove(pick % held.len());
                    c.release(&uid);
                    live.refresh_node(&c, node);
                }
                let fresh = FgdIndex::new(&dist, &c);
                for id in 0..c.nodes().len() {
                    proptest::prop_assert_eq!(&live.nodes[id], &fresh.nodes[id]);
                    let want = reference_node_frag(&live, c.node(id).unwrap());
                    proptest::prop_assert_eq!(live.node_fragmentation(id).to_bits(), want.to_bits());
                    for &(tenths, mem, cpu, memory) in &probes {
                        let req = PodRequest {
                            app: vec![Some(DeviceRequest {
                                nums: 1,
                                memory: MemoryRequest::Mib(mem),
                                cores: tenths * 10,
                            })],
                            cpu_milli: cpu,
                            memory_mib: memory,
                            ..PodRequest::default()
                        };
                        let order: Vec<usize> = (0..c.node(id).unwrap().gpus.len()).collect();
                        let got = live
                            .best_on_node(&c, id, &req, &order)
                            .ok()
                            .map(|(d, p)| (d.to_bits(), p.app[0][0].gpu));
                        let want = reference_single(&live, &c, id, &req).map(|(d, pos)| (d.to_bits(), pos));
                        proptest::prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }

    #[test]
    fn a_node_changed_without_a_refresh_is_evaluated_at_its_current_usage() {
        let mut d = ShapeDistribution::default();
        d.observe(share(500));
        let mut c = Cluster::new(vec![mk_node("a", 1, 10, 1000)]);
        let idx = FgdIndex::new(&d, &c);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 900,
            usedcores: 90,
        };
        // The kept state says the GPU is empty; fit reads the node.
        let err = idx.best_on_node(&c, 0, &pod(30), &[0]).unwrap_err();
        assert_eq!(err.to_string(), "1/1 CardInsufficientMemory");
        // The kept fragmentation stays what the index last saw.
        assert!(idx.node_fragmentation(0).abs() < 1e-9);
    }
}

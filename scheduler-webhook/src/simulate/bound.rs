//! `simulate --policy bound`: a lower bound on the GPUs any placement could
//! leave unallocated, for the same arrival sequence as the policies (the
//! seed's shuffle, inflated by sampling, cut at the demand target). It is
//! the larger of two bounds, each valid alone.
//!
//! **Offline ([`bound`]).** The exact question (which of the arrived pods
//! to place, on which node and GPUs, so that the most GPU is allocated) is
//! a large integer program. This solves a linear relaxation of it, so its
//! optimum is at least the best any placement reaches, and
//! `total GPUs − optimum` is at most what any policy, online or offline,
//! leaves unallocated:
//!
//! - **Pods are chosen freely.** Any subset of the arrived pods may be
//!   placed, in any order. An online policy must place a pod that fits
//!   somewhere when it arrives; this part may skip it.
//! - **Nodes are pooled per node type** (same CPU, memory, GPU count and
//!   model): variable `x[s][t]` is how many pods of shape `s` go on nodes of
//!   type `t`, a real number, and the type's `N_t` nodes count as one pool of
//!   `N_t ×` their CPU, memory and GPU capacity.
//!
//! Kept per node type, so a pod never counts on a node it could not use:
//! - a shape goes only on a type whose single node fits it (CPU, memory,
//!   GPU count, allowed models);
//! - CPU, memory and GPU-milli of the pool;
//! - fractional pods hold one of the split count's slots of a GPU: at most
//!   `N_t × GPUs × split count` of them;
//! - whole-GPU pods of `k` GPUs: at most `⌊GPUs ÷ k⌋` per node, so
//!   `N_t × ⌊GPUs ÷ k⌋` per pool, and pods of `k` or more GPUs together
//!   at most `N_t × ⌊GPUs ÷ k⌋`.
//!
//! On the openb traces this part finds pods enough to fill every GPU (0
//! unallocated): the idle GPUs there are the price of placing online.
//!
//! **Online ([`forced`], [`forced_gap_milli`]).** Every policy places a pod
//! that fits somewhere when it arrives, and pods never leave. A fractional
//! pod above half a GPU that no placement of the pods before it could have
//! shut out is placed by every policy, and its GPU keeps `1000 − milli`
//! idle unless smaller pods fill it. Proving "could not have been shut out"
//! takes one small LP per pod shape and arrival prefix (binary search).
//!
//! Pure: no I/O.

use std::collections::BTreeMap;

use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOutcome};

use crate::core::fgd::MILLI_PER_GPU;
use crate::simulate::replay::{ReplayError, ReplayResult, arrivals};
use crate::simulate::trace::{NodeRow, PodRow};

/// What the bound relaxes, printed beside it.
pub const RELAXED: &str = "bound = the larger of two lower bounds. Offline: an LP relaxation in \
     which any subset of the arrived pods may be placed (no arrival order), nodes of one type \
     (CPU, memory, GPUs, model) pooling their CPU, memory, GPU-milli and slots, with fractional \
     pod counts; kept: a pod only on a node type it fits whole, GPU models, split-count slots, \
     whole-GPU pods per node. Online: a pod above half a GPU that no placement of the pods \
     before it could shut out (an LP over node types says so) is placed by every policy, and \
     the idle share of its GPU counts, less every smaller pod that arrived and could fill it";

/// Errors of the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    /// The LP solver failed (not expected: the problem is always feasible,
    /// all zeros, and bounded by the pod counts).
    #[error("LP solver: {0}")]
    Solver(String),
}

/// A pod shape as the bound sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PodShape {
    cpu_milli: u64,
    memory_mib: u64,
    num_gpu: u32,
    /// GPU-milli per GPU (1000 for whole cards, 0 for CPU-only).
    milli: u32,
    types: Vec<String>,
}

impl PodShape {
    fn of(p: &PodRow) -> Self {
        Self {
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
            num_gpu: p.num_gpu,
            milli: if p.num_gpu == 0 {
                0
            } else if p.is_fractional() {
                p.gpu_milli
            } else {
                MILLI_PER_GPU
            },
            types: p.gpu_spec.iter().map(|m| m.to_ascii_lowercase()).collect(),
        }
    }

    fn fractional(&self) -> bool {
        self.num_gpu == 1 && self.milli > 0 && self.milli < MILLI_PER_GPU
    }

    fn gpu_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.milli)
    }

    /// Whether one node of this type can hold the pod alone.
    fn fits(&self, t: &NodeType) -> bool {
        if self.cpu_milli > t.cpu_milli || self.memory_mib > t.memory_mib {
            return false;
        }
        if self.num_gpu == 0 {
            return true;
        }
        if self.num_gpu > t.gpus {
            return false;
        }
        // As HAMi's use-gputype: the device type contains an allowed name.
        let ty = format!("nvidia-{}", t.model.to_ascii_lowercase());
        self.types.is_empty() || self.types.iter().any(|m| ty.contains(m.as_str()))
    }
}

/// Nodes with the same capacity and model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct NodeType {
    cpu_milli: u64,
    memory_mib: u64,
    gpus: u32,
    model: String,
}

/// The bound for one arrival sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// GPUs in the cluster.
    pub total_gpus: usize,
    /// The relaxation's most allocated GPU-milli ÷ (GPUs × 1000): at least
    /// what any placement reaches.
    pub allocation_ratio: f64,
    /// GPUs × (1 − ratio): at most what any placement leaves unallocated.
    pub unallocated_gpus: f64,
}

/// The bound for the pods `arrived` (indices into `pods`, repeats allowed)
/// on `nodes`, every GPU split `split_count` ways.
///
/// # Errors
/// The LP solver fails.
pub fn bound(
    nodes: &[NodeRow],
    pods: &[PodRow],
    arrived: &[usize],
    split_count: u32,
) -> Result<Bound, BoundError> {
    let types = node_types(nodes);
    let total_gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    let mut shapes: BTreeMap<PodShape, u64> = BTreeMap::new();
    for &i in arrived {
        if let Some(p) = pods.get(i) {
            *shapes.entry(PodShape::of(p)).or_insert(0) += 1;
        }
    }
    let shapes: Vec<(PodShape, u64)> = shapes.into_iter().collect();

    let mut lp = Problem::new(OptimizationDirection::Maximize);
    // Per type, its variables with their shape.
    let mut per_type: Vec<Vec<(usize, microlp::Variable)>> = vec![Vec::new(); types.len()];
    #[allow(clippy::cast_precision_loss)]
    for (si, (s, count)) in shapes.iter().enumerate() {
        let mut row = Vec::new();
        for (ti, (t, _)) in types.iter().enumerate() {
            if !s.fits(t) {
                continue;
            }
            let v = lp.add_var(s.gpu_milli() as f64, (0.0, *count as f64));
            per_type[ti].push((si, v));
            row.push((v, 1.0));
        }
        if row.len() > 1 {
            lp.add_constraint(row, ComparisonOp::Le, *count as f64);
        }
    }
    #[allow(clippy::cast_precision_loss)]
    for (ti, (t, n)) in types.iter().enumerate() {
        let vars = &per_type[ti];
        if vars.is_empty() {
            continue;
        }
        let n = *n as f64;
        let sum = |coef: &dyn Fn(&PodShape) -> f64| -> Vec<(microlp::Variable, f64)> {
            vars.iter()
                .map(|&(si, v)| (v, coef(&shapes[si].0)))
                .filter(|(_, c)| *c != 0.0)
                .collect()
        };
        let mut add = |row: Vec<(microlp::Variable, f64)>, rhs: f64| {
            if !row.is_empty() {
                lp.add_constraint(row, ComparisonOp::Le, rhs);
            }
        };
        add(sum(&|s| s.cpu_milli as f64), n * t.cpu_milli as f64);
        add(sum(&|s| s.memory_mib as f64), n * t.memory_mib as f64);
        add(
            sum(&|s| s.gpu_milli() as f64),
            n * f64::from(t.gpus) * f64::from(MILLI_PER_GPU),
        );
        add(
            sum(&|s| if s.fractional() { 1.0 } else { 0.0 }),
            n * f64::from(t.gpus) * f64::from(split_count),
        );
        // Whole-GPU pods of k or more GPUs: at most ⌊GPUs ÷ k⌋ per node.
        for k in 2..=t.gpus {
            let row = sum(&|s| {
                if !s.fractional() && s.num_gpu >= k {
                    1.0
                } else {
                    0.0
                }
            });
            add(row, n * f64::from(t.gpus / k));
        }
    }
    let allocated = match lp.solve() {
        Ok(SolveOutcome::Solution(sol)) => sol.objective(),
        Ok(SolveOutcome::Interrupted(_)) => {
            return Err(BoundError::Solver("interrupted".to_owned()));
        }
        Err(e) => return Err(BoundError::Solver(e.to_string())),
    };
    #[allow(clippy::cast_precision_loss)]
    let capacity = (total_gpus * u64::from(MILLI_PER_GPU)) as f64;
    let ratio = if capacity > 0.0 {
        (allocated / capacity).clamp(0.0, 1.0)
    } else {
        0.0
    };
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    Ok(Bound {
        total_gpus: total_gpus as usize,
        allocation_ratio: ratio,
        unallocated_gpus: total_gpus as f64 * (1.0 - ratio),
    })
}

/// Pods every policy must place, as far as [`forced`] can prove it.
///
/// A pod that fits on some node when it arrives is placed (the rule every
/// policy here follows: one pod at a time, never moved, placed if it fits).
/// Pods never leave, so free capacity only shrinks: a pod can be left out
/// only if, when it arrives, every node is already *blocked* for it. A node
/// is blocked for a fractional pod asking `pct` % of a GPU, `c` CPU and `m`
/// memory if its model is not allowed or the node is too small for the pod
/// alone (free), or
/// - each of its GPUs holds pods asking at least `100 − pct` % together, or
///   holds a whole-GPU pod, or has its split-count slots full; or
/// - its pods ask more than `CPU − c`; or more than `memory − m`.
///
/// Each pod sits on one node, so it helps block one node in one of these
/// ways. [`forced`] asks an LP whether the pods arrived so far could block
/// every node, each pod given to one way (a fraction of it allowed), node
/// types pooled. If not, the pod is placed by every policy. The LP ignores
/// where the pods could go (their own fit), so it says "could block" more
/// often than a real placement could: it proves fewer pods forced than are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct BlockKey {
    pct: u32,
    cpu_milli: u64,
    memory_mib: u64,
    types: Vec<String>,
}

/// Per arrival of `sequence`, whether every policy must place it, for the
/// fractional pods above half a GPU (the only ones [`forced_gap_milli`] uses;
/// `false` for the rest).
///
/// # Errors
/// The LP solver fails.
pub fn forced(
    nodes: &[NodeRow],
    pods: &[PodRow],
    sequence: &[usize],
    split_count: u32,
) -> Result<Vec<bool>, BoundError> {
    let types = node_types(nodes);
    let mut first_blockable: BTreeMap<BlockKey, usize> = BTreeMap::new();
    let mut out = vec![false; sequence.len()];
    for (j, &i) in sequence.iter().enumerate() {
        let p = &pods[i];
        if !p.is_fractional() || p.gpu_milli * 2 <= MILLI_PER_GPU {
            continue;
        }
        let key = BlockKey {
            pct: p.gpu_milli.div_ceil(10),
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
            types: PodShape::of(p).types,
        };
        let first = match first_blockable.get(&key) {
            Some(&f) => f,
            None => {
                // Blockable at j is monotone in j: find the first j.
                let (mut lo, mut hi) = (0, sequence.len() + 1);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if blockable(
                        &types,
                        pods,
                        &sequence[..mid.min(sequence.len())],
                        &key,
                        split_count,
                    )? {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                first_blockable.insert(key, lo);
                lo
            }
        };
        out[j] = j < first;
    }
    Ok(out)
}

/// Whether the pods `before` could block every node for a pod of `key`
/// (see [`BlockKey`]).
fn blockable(
    types: &[(NodeType, u64)],
    pods: &[PodRow],
    before: &[usize],
    key: &BlockKey,
    split_count: u32,
) -> Result<bool, BoundError> {
    let probe = PodShape {
        cpu_milli: key.cpu_milli,
        memory_mib: key.memory_mib,
        num_gpu: 1,
        milli: key.pct * 10,
        types: key.types.clone(),
    };
    // Node types the pod could use at all; the rest are blocked for free.
    let open: Vec<&(NodeType, u64)> = types.iter().filter(|(t, _)| probe.fits(t)).collect();
    if open.is_empty() {
        return Ok(true);
    }
    // A GPU's share of blocking: pods asking 100 − pct % together block it.
    let room = 100u32.saturating_sub(key.pct);
    let slot = 1.0 / f64::from(split_count.max(1));
    let cover = |s: &PodShape| -> f64 {
        if s.num_gpu == 0 {
            0.0
        } else if !s.fractional() {
            f64::from(s.num_gpu)
        } else if room == 0 {
            1.0
        } else {
            (f64::from(s.milli.div_ceil(10)) / f64::from(room))
                .min(1.0)
                .max(slot)
        }
    };
    let mut shapes: BTreeMap<PodShape, u64> = BTreeMap::new();
    for &i in before {
        let mut s = PodShape::of(&pods[i]);
        s.types.clear();
        *shapes.entry(s).or_insert(0) += 1;
    }
    // Units: GPUs, cores, GiB, so the LP's numbers stay near 1..1e5.
    const CORE: f64 = 1000.0;
    const GIB: f64 = 1024.0;
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    // Per way of blocking (GPUs, CPU, memory): `need[w]` is what the pods
    // given to it must reach, `room[w][r]` holds them, resource `r` (GPU,
    // CPU, memory) of the nodes blocked that way, which is where they sit.
    let mut need: [Vec<(microlp::Variable, f64)>; 3] = Default::default();
    let mut room: [[Vec<(microlp::Variable, f64)>; 3]; 3] = Default::default();
    #[allow(clippy::cast_precision_loss)]
    for (s, count) in &shapes {
        let uses = [
            s.gpu_milli() as f64 / f64::from(MILLI_PER_GPU),
            s.cpu_milli as f64 / CORE,
            s.memory_mib as f64 / GIB,
        ];
        let gives = [cover(s), uses[1], uses[2]];
        let mut own = Vec::new();
        for w in 0..3 {
            if gives[w] > 0.0 {
                let v = lp.add_var(0.0, (0.0, *count as f64));
                need[w].push((v, -gives[w]));
                for r in 0..3 {
                    if uses[r] > 0.0 {
                        room[w][r].push((v, uses[r]));
                    }
                }
                own.push((v, 1.0));
            }
        }
        if own.len() > 1 {
            lp.add_constraint(own, ComparisonOp::Le, *count as f64);
        }
    }
    let mut nodes_open = 0.0;
    #[allow(clippy::cast_precision_loss)]
    for (t, n) in open {
        let n = *n as f64;
        nodes_open += n;
        let has = [
            f64::from(t.gpus),
            t.cpu_milli as f64 / CORE,
            t.memory_mib as f64 / GIB,
        ];
        let cost = [
            f64::from(t.gpus),
            (t.cpu_milli - key.cpu_milli + 1) as f64 / CORE,
            (t.memory_mib - key.memory_mib + 1) as f64 / GIB,
        ];
        let mut own = Vec::new();
        for w in 0..3 {
            let v = lp.add_var(1.0, (0.0, n));
            need[w].push((v, cost[w]));
            for r in 0..3 {
                room[w][r].push((v, -has[r]));
            }
            own.push((v, 1.0));
        }
        lp.add_constraint(own, ComparisonOp::Le, n);
    }
    for row in need.into_iter().chain(room.into_iter().flatten()) {
        if !row.is_empty() {
            lp.add_constraint(row, ComparisonOp::Le, 0.0);
        }
    }
    match lp.solve() {
        Ok(SolveOutcome::Solution(sol)) => Ok(sol.objective() >= nodes_open - 1e-6),
        Ok(SolveOutcome::Interrupted(_)) => Err(BoundError::Solver("interrupted".to_owned())),
        Err(e) => Err(BoundError::Solver(e.to_string())),
    }
}

/// GPU-milli that stays idle whatever the policy, on the GPUs of the
/// fractional pods above half a GPU that every policy must place
/// (`forced`, per arrival of `sequence`).
///
/// Such a pod of `s` milli has its GPU to itself but for pods of at most
/// `1000 − s` milli (two pods above half a GPU never share one). For any
/// threshold `θ` above 500, the forced pods of at least `θ` leave
/// `Σ (1000 − s)` on their GPUs, which only pods of at most `1000 − θ` can
/// fill; counting every such pod that arrived as filling gives a bound. The
/// best threshold is returned (0 if none bounds anything).
#[must_use]
pub fn forced_gap_milli(pods: &[PodRow], sequence: &[usize], forced: &[bool]) -> u64 {
    let mut big: Vec<u32> = sequence
        .iter()
        .zip(forced)
        .filter(|&(_, &f)| f)
        .map(|(&i, _)| pods[i].gpu_milli)
        .collect();
    big.sort_unstable_by(|a, b| b.cmp(a));
    let mut small: Vec<u32> = sequence
        .iter()
        .map(|&i| &pods[i])
        .filter(|p| p.is_fractional() && p.gpu_milli * 2 < MILLI_PER_GPU)
        .map(|p| p.gpu_milli)
        .collect();
    small.sort_unstable();
    // Thresholds from the largest pod down: the gap grows, and so do the
    // pods that may fill it.
    let mut best = 0u64;
    let mut gap = 0u64;
    let mut filler = 0u64;
    let mut next_small = 0;
    let mut k = 0;
    while k < big.len() {
        let theta = big[k];
        while k < big.len() && big[k] == theta {
            gap += u64::from(MILLI_PER_GPU - big[k]);
            k += 1;
        }
        while next_small < small.len() && small[next_small] <= MILLI_PER_GPU - theta {
            filler += u64::from(small[next_small]);
            next_small += 1;
        }
        best = best.max(gap.saturating_sub(filler));
    }
    best
}

/// Node types with their node counts.
fn node_types(nodes: &[NodeRow]) -> Vec<(NodeType, u64)> {
    let mut types: BTreeMap<NodeType, u64> = BTreeMap::new();
    for n in nodes {
        let t = NodeType {
            cpu_milli: n.cpu_milli,
            memory_mib: n.memory_mib,
            gpus: n.gpus,
            model: n.model.clone(),
        };
        *types.entry(t).or_insert(0) += 1;
    }
    types.into_iter().collect()
}

/// The bound as a row of the report, for the arrival sequence of this seed
/// and demand ([`arrivals`]): the ratio at the end, and a curve point at
/// every 10 % of arrived demand (one LP each).
///
/// # Errors
/// A trace without GPUs, pods or GPU demand; the LP solver fails.
pub fn bound_result(
    nodes: &[NodeRow],
    pods: &[PodRow],
    seed: u64,
    demand: f64,
    split_count: u32,
) -> Result<ReplayResult, BoundRunError> {
    if pods.is_empty() {
        return Err(ReplayError::NoPods.into());
    }
    if pods.iter().all(|p| p.gpu_demand_milli() == 0) {
        return Err(ReplayError::NoGpuDemand.into());
    }
    let total_gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    if total_gpus == 0 {
        return Err(ReplayError::NoGpu.into());
    }
    let capacity_milli = total_gpus * u64::from(MILLI_PER_GPU);
    let sequence = arrivals(pods, seed, demand, capacity_milli);
    let forced = forced(nodes, pods, &sequence, split_count)?;
    #[allow(clippy::cast_precision_loss)]
    let capacity = capacity_milli as f64;
    // The larger of the two bounds for the first `k` arrivals.
    let at = |k: usize| -> Result<Bound, BoundError> {
        let mut b = bound(nodes, pods, &sequence[..k], split_count)?;
        #[allow(clippy::cast_precision_loss)]
        let gap = forced_gap_milli(pods, &sequence[..k], &forced[..k]) as f64;
        if gap > capacity * (1.0 - b.allocation_ratio) {
            b.allocation_ratio = 1.0 - gap / capacity;
            b.unallocated_gpus = gap / f64::from(MILLI_PER_GPU);
        }
        Ok(b)
    };
    let mut curve = Vec::new();
    let mut arrived = 0u64;
    let mut next_mark = 10u64;
    for (k, &i) in sequence.iter().enumerate() {
        arrived += pods[i].gpu_demand_milli();
        if arrived * 100 >= next_mark * capacity_milli && k + 1 < sequence.len() {
            let b = at(k + 1)?;
            #[allow(clippy::cast_precision_loss)]
            curve.push([arrived as f64 / capacity, b.allocation_ratio]);
            while arrived * 100 >= next_mark * capacity_milli {
                next_mark += 10;
            }
        }
    }
    let b = at(sequence.len())?;
    #[allow(clippy::cast_precision_loss)]
    curve.push([arrived as f64 / capacity, b.allocation_ratio]);
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    Ok(ReplayResult {
        policy: BOUND.to_owned(),
        seed,
        split_count,
        demand: arrived as f64 / capacity,
        total_gpus: total_gpus as usize,
        allocation_ratio: b.allocation_ratio,
        unallocated_gpus: b.unallocated_gpus,
        fragmentation_ratio: None,
        pods_scheduled: 0,
        pods_failed: 0,
        gpu_pods_failed: 0,
        curve,
        idle: None,
        slices: None,
    })
}

/// The name of the bound in `--policy` and in the report.
pub const BOUND: &str = "bound";

/// Errors of [`bound_result`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundRunError {
    /// The trace cannot be replayed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The LP failed.
    #[error(transparent)]
    Bound(#[from] BoundError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::policy::Policy;
    use crate::simulate::replay::{ReplaySpec, replay, trace_distribution};

    fn node(gpus: u32, cpu_milli: u64, model: &str) -> NodeRow {
        NodeRow {
            name: format!("n{gpus}{model}"),
            cpu_milli,
            memory_mib: 1 << 16,
            gpus,
            model: model.into(),
        }
    }

    fn pod(num_gpu: u32, gpu_milli: u32, cpu_milli: u64, spec: &[&str]) -> PodRow {
        PodRow {
            name: "p".into(),
            cpu_milli,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            gpu_spec: spec.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The bound of `count` copies of each pod.
    fn unallocated(nodes: &[NodeRow], pods: &[PodRow], count: usize) -> f64 {
        let arrived: Vec<usize> = (0..pods.len())
            .flat_map(|i| std::iter::repeat_n(i, count))
            .collect();
        bound(nodes, pods, &arrived, 10).unwrap().unallocated_gpus
    }

    #[test]
    fn exact_where_the_relaxation_is_exact() {
        // Three whole-GPU pods on two GPUs: both GPUs are used.
        let two = [node(2, 64_000, "T4")];
        assert!(unallocated(&two, &[pod(1, 1000, 1000, &[])], 3).abs() < 1e-6);
        // Only V100 pods on a T4 node: nothing can be placed.
        let v100 = [pod(1, 1000, 1000, &["V100M16"])];
        assert!((unallocated(&two, &v100, 3) - 2.0).abs() < 1e-6);
        // CPU for exactly two of them.
        let cpu = [pod(1, 1000, 32_000, &[])];
        assert!(unallocated(&two, &cpu, 3).abs() < 1e-6);
        // Two-GPU pods on a three-GPU node: one per node, one GPU idle (the
        // per-node count; GPU-milli alone would allow 1.5 pods).
        let three = [node(3, 64_000, "G2")];
        assert!((unallocated(&three, &[pod(2, 1000, 1000, &[])], 4) - 1.0).abs() < 1e-6);
        // Slices: 12 pods of 50 milli on one GPU split 10 ways fill 500 milli.
        let one = [node(1, 64_000, "T4")];
        assert!((unallocated(&one, &[pod(1, 50, 100, &[])], 12) - 0.5).abs() < 1e-6);
    }

    #[test]
    fn below_the_optimum_where_it_relaxes() {
        // Two 600-milli pods on one GPU: one fits (0.4 idle); the pooled LP
        // places 1000/600 of them.
        let one = [node(1, 64_000, "T4")];
        let b = unallocated(&one, &[pod(1, 600, 100, &[])], 2);
        assert!(b.abs() < 1e-6, "{b}");
        assert!(b <= 0.4);
    }

    #[test]
    fn never_above_any_policy_on_the_same_arrivals() {
        let nodes = vec![
            node(2, 16_000, "T4"),
            node(4, 32_000, "G2"),
            node(8, 96_000, "V100M32"),
            node(1, 8_000, "P100"),
        ];
        let pods = vec![
            pod(1, 300, 2_000, &[]),
            pod(1, 700, 6_000, &["T4"]),
            pod(1, 1000, 12_000, &[]),
            pod(2, 1000, 8_000, &[]),
            pod(4, 1000, 30_000, &["G2", "V100M32"]),
            pod(0, 0, 4_000, &[]),
            pod(1, 450, 1_000, &[]),
            pod(8, 1000, 64_000, &[]),
            pod(1, 810, 3_000, &[]),
            pod(1, 650, 2_000, &["G2", "T4"]),
        ];
        let dist = trace_distribution(&pods);
        let mut online_counted = false;
        for seed in 1..=4 {
            for split_count in [10, 100] {
                let b = bound_result(&nodes, &pods, seed, 1.3, split_count).unwrap();
                assert_eq!(b.policy, "bound");
                assert!(b.fragmentation_ratio.is_none());
                assert!(!b.curve.is_empty());
                let total: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
                let sequence = arrivals(&pods, seed, 1.3, total * 1000);
                let lp = bound(&nodes, &pods, &sequence, split_count).unwrap();
                online_counted |= b.unallocated_gpus > lp.unallocated_gpus + 1e-6;
                for policy in Policy::ALL {
                    let spec = ReplaySpec {
                        policy,
                        seed,
                        demand: 1.3,
                        split_count,
                        fgdpack: crate::core::fgdpack::FgdPackParams::default(),
                        fgd: crate::core::fgd::FgdParams::default(),
                    };
                    let r = replay(&nodes, &pods, &dist, &spec, |_| {}).unwrap();
                    assert!((r.demand - b.demand).abs() < 1e-12, "same arrivals");
                    assert!(
                        b.unallocated_gpus <= r.unallocated_gpus + 1e-6,
                        "seed {seed} split {split_count} {policy}: bound {} > {}",
                        b.unallocated_gpus,
                        r.unallocated_gpus
                    );
                }
            }
        }
        assert!(online_counted, "the online part raised the bound somewhere");
    }

    #[test]
    fn pods_that_fit_when_they_arrive_leave_their_gaps() {
        // Two GPUs; two 810-milli pods arrive first. Each fits when it
        // arrives (nothing, then one pod, cannot block two GPUs), so every
        // policy places both, each alone on a GPU: 2 × 190 milli stay idle.
        // The offline LP would place the two whole-GPU pods instead.
        let two = [node(2, 64_000, "T4")];
        let pods = [pod(1, 810, 1000, &[]), pod(1, 1000, 1000, &[])];
        let sequence = [0, 0, 1, 1];
        let f = forced(&two, &pods, &sequence, 10).unwrap();
        assert_eq!(f, [true, true, false, false]);
        assert_eq!(forced_gap_milli(&pods, &sequence, &f), 380);
        assert!(bound(&two, &pods, &sequence, 10).unwrap().unallocated_gpus < 1e-6);
        // A whole-GPU pod first may take one GPU: then one more pod blocks
        // the other, so only the first 810 is certain.
        let sequence = [1, 0, 0, 1];
        let f = forced(&two, &pods, &sequence, 10).unwrap();
        assert_eq!(f, [false, true, false, false]);
        assert_eq!(forced_gap_milli(&pods, &sequence, &f), 190);
        // CPU can block a node too: a CPU-only pod of 63.5 cores leaves no
        // room for the 810's core, so none is certain.
        let hog = [pod(1, 810, 1000, &[]), pod(0, 0, 63_500, &[])];
        let f = forced(&two, &hog, &[1, 0, 0], 10).unwrap();
        assert_eq!(f, [false, false, false]);
    }

    #[test]
    fn small_pods_that_arrived_fill_the_gaps() {
        let pods = [
            pod(1, 810, 100, &[]),
            pod(1, 600, 100, &[]),
            pod(1, 150, 100, &[]),
            pod(1, 350, 100, &[]),
        ];
        let forced_all = |seq: &[usize]| -> u64 {
            let f: Vec<bool> = seq.iter().map(|&i| pods[i].gpu_milli > 500).collect();
            forced_gap_milli(&pods, seq, &f)
        };
        // 3 × 190 − 150 = 420 at θ = 810; at θ = 600, 570 + 400 − 150 −
        // 350 = 470.
        assert_eq!(forced_all(&[0, 0, 0, 1, 2, 3]), 470);
        // Enough 150s fill every 190 gap: nothing is certain.
        assert_eq!(forced_all(&[0, 2, 2]), 0);
        // No pod above half a GPU: no gap.
        assert_eq!(forced_all(&[2, 3, 3]), 0);
    }

    #[test]
    fn gpu_less_traces_are_errors() {
        let pods = [pod(1, 500, 100, &[])];
        assert!(bound_result(&[node(0, 8_000, "")], &pods, 1, 1.3, 10).is_err());
        assert!(bound_result(&[node(1, 8_000, "T4")], &[], 1, 1.3, 10).is_err());
    }
}

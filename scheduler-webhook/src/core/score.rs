//! HAMi's scoring formulas (spec §5): the node score that binpack and spread
//! rank nodes by, the GPU score, and the GPU order that fit walks.
//!
//! Fit walks the order from the end, so the order puts the preferred GPU
//! last: binpack sorts by score ascending (fullest last), spread descending
//! (emptiest last). How each `gpu-scheduler-policy` value orders the GPUs is
//! HAMi v2.10's `DeviceUsageList.Less` (`pkg/scheduler/policy/gpu_policy.go`),
//! see [`gpu_order`].

use std::cmp::Ordering;

use crate::core::kinds::{GpuPolicy, GpuPolicyName};
use crate::core::model::Node;
use crate::core::request::PodRequest;

/// Weights of the GPU score (`hami.io/device-scoring-weights`), 1 each by
/// default; the codec is [`proto::hami::scoring_weights`].
pub use proto::hami::scoring_weights::DeviceScoringWeights as ScoringWeights;

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

/// HAMi's node score, from usage before the pod:
/// `10*(ΣUsed/ΣCount + ΣUsedcores/ΣTotalcore + ΣUsedmem/ΣTotalmem)`.
#[must_use]
pub fn node_score(node: &Node) -> f64 {
    let (mut used, mut count, mut ucores, mut tcores, mut umem, mut tmem) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    for (g, u) in node.gpus.iter().zip(&node.usage) {
        used += u64::from(u.used);
        count += u64::from(g.count);
        ucores += u64::from(u.usedcores);
        tcores += u64::from(g.devcore);
        umem += u.usedmem;
        tmem += g.devmem;
    }
    #[allow(clippy::cast_precision_loss)] // MiB and counts stay far below 2^52
    let s = ratio(used as f64, count as f64)
        + ratio(ucores as f64, tcores as f64)
        + ratio(umem as f64, tmem as f64);
    10.0 * s
}

/// HAMi's GPU score of the GPU at `pos` for a pod:
/// `10*(ws*(reqEntries+Used)/Count + wc*(cores+Usedcores)/Totalcore + wm*(mem+Usedmem)/Totalmem)`,
/// where `reqEntries` counts the pod's containers asking for a GPU and
/// cores/mem are summed over them; 0 for a GPU with no slots, cores or
/// memory (HAMi v2.10 `ComputeScore`). The weights are the pod's
/// `hami.io/device-scoring-weights`.
#[must_use]
pub fn gpu_score(node: &Node, pos: usize, req: &PodRequest, w: &ScoringWeights) -> f64 {
    let (Some(g), Some(u)) = (node.gpus.get(pos), node.usage.get(pos)) else {
        return 0.0;
    };
    if g.count == 0 || g.devcore == 0 || g.devmem == 0 {
        return 0.0;
    }
    let (mut entries, mut cores, mut mem) = (0u64, 0u64, 0u64);
    for r in req.init.iter().chain(&req.app).flatten() {
        entries += 1;
        cores += u64::from(r.cores);
        mem += r.memory_on(g.devmem);
    }
    #[allow(clippy::cast_precision_loss)] // weights, MiB and counts stay far below 2^52
    let s = w.slot as f64 * ratio((entries + u64::from(u.used)) as f64, f64::from(g.count))
        + w.core as f64
            * ratio(
                (cores + u64::from(u.usedcores)) as f64,
                f64::from(g.devcore),
            )
        + w.memory as f64 * ratio((mem + u.usedmem) as f64, g.devmem as f64);
    10.0 * s
}

/// One comparison of a GPU order (HAMi's `Less` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// GPU score ascending (binpack: the fullest walked first).
    ScoreAsc,
    /// GPU score descending (spread: the emptiest walked first).
    ScoreDesc,
    /// NUMA node ascending.
    NumaAsc,
    /// NUMA node descending.
    NumaDesc,
    /// Slots used descending (mutex: idle GPUs last, walked first).
    UsedDesc,
}

/// The keys of a policy's order, most significant first (at most three;
/// the GPU index always breaks what they leave equal).
fn order_keys(policy: GpuPolicy, numa_bind: bool) -> ([Key; 3], usize) {
    if policy.is_chain() {
        // HAMi `lessByChain`: the sort keys in the order written (spread when
        // the chain names none); numa-bind puts NUMA first, so a container's
        // GPUs can come from one NUMA node; then the index.
        let mut sort: Vec<GpuPolicyName> = policy
            .names()
            .iter()
            .copied()
            .filter(|n| {
                matches!(
                    n,
                    GpuPolicyName::Binpack | GpuPolicyName::Spread | GpuPolicyName::Numa
                )
            })
            .collect();
        if sort.is_empty() {
            sort.push(GpuPolicyName::Spread);
        }
        if numa_bind && sort.first() != Some(&GpuPolicyName::Numa) {
            sort.retain(|n| *n != GpuPolicyName::Numa);
            sort.insert(0, GpuPolicyName::Numa);
        }
        let mut keys = [Key::NumaAsc; 3];
        for (slot, name) in keys.iter_mut().zip(&sort) {
            *slot = match name {
                GpuPolicyName::Binpack => Key::ScoreAsc,
                GpuPolicyName::Spread => Key::ScoreDesc,
                _ => Key::NumaAsc,
            };
        }
        return (keys, sort.len().min(3));
    }
    // One name (HAMi's order before chains, kept for single values).
    let name = policy
        .names()
        .first()
        .copied()
        .unwrap_or(GpuPolicyName::Spread);
    let binpack = name == GpuPolicyName::Binpack;
    match name {
        // Busy GPUs first, idle last; numa-bind does not group them.
        GpuPolicyName::Mutex => ([Key::UsedDesc, Key::NumaAsc, Key::NumaAsc], 2),
        // numa-bind keeps each NUMA node's GPUs together: binpack walks the
        // lowest NUMA node first, spread the highest.
        _ if numa_bind && binpack => ([Key::NumaDesc, Key::ScoreAsc, Key::NumaAsc], 2),
        _ if numa_bind => ([Key::NumaAsc, Key::ScoreDesc, Key::NumaAsc], 2),
        // The score first, NUMA breaking ties (HAMi #1806).
        _ if binpack => ([Key::ScoreAsc, Key::NumaAsc, Key::NumaAsc], 2),
        // spread, and topology-aware (which HAMi orders as spread).
        _ => ([Key::ScoreDesc, Key::NumaAsc, Key::NumaAsc], 2),
    }
}

/// The order fit walks (from the end) under a GPU policy, as HAMi v2.10's
/// `DeviceUsageList.Less` sorts (`pkg/scheduler/policy/gpu_policy.go`):
///
/// - `binpack` / `spread` alone: by GPU score (ascending / descending), ties
///   by NUMA ascending; with numa-bind, NUMA nodes first (binpack
///   descending, spread ascending), then the score;
/// - `topology-aware` alone: as `spread`;
/// - `mutex` alone: slots used descending, then NUMA ascending (numa-bind
///   does not change it);
/// - a chain (a comma list, or `numa` alone): its sort keys in the order
///   written, `binpack` and `spread` by score, `numa` by NUMA ascending;
///   `spread` when it names none; with numa-bind, NUMA ascending first.
///
/// Whatever the keys leave equal, the lower GPU index sorts first (HAMi's
/// chains do the same; its single values keep the device list's order,
/// which is by index), so the walk from the end meets the higher index first.
#[must_use]
pub fn gpu_order(
    node: &Node,
    req: &PodRequest,
    policy: GpuPolicy,
    w: &ScoringWeights,
) -> Vec<usize> {
    let mut order = Vec::new();
    gpu_order_into(node, req, policy, w, &mut order, &mut Vec::new());
    order
}

/// [`gpu_order`] into caller-owned buffers, so scanning thousands of nodes
/// allocates nothing per node.
pub fn gpu_order_into(
    node: &Node,
    req: &PodRequest,
    policy: GpuPolicy,
    w: &ScoringWeights,
    order: &mut Vec<usize>,
    scores: &mut Vec<f64>,
) {
    scores.clear();
    scores.extend((0..node.gpus.len()).map(|p| gpu_score(node, p, req, w)));
    order.clear();
    order.extend(0..node.gpus.len());
    let (keys, n) = order_keys(policy, req.constraints.numa_bind);
    let keys = keys.get(..n).unwrap_or_default();
    let scores = &*scores;
    order.sort_by(|&a, &b| {
        let (ga, gb) = (&node.gpus[a], &node.gpus[b]);
        keys.iter()
            .fold(Ordering::Equal, |acc, key| {
                acc.then_with(|| match key {
                    Key::ScoreAsc => scores[a].total_cmp(&scores[b]),
                    Key::ScoreDesc => scores[b].total_cmp(&scores[a]),
                    Key::NumaAsc => ga.numa.cmp(&gb.numa),
                    Key::NumaDesc => gb.numa.cmp(&ga.numa),
                    Key::UsedDesc => {
                        let used = |p: usize| node.usage.get(p).map_or(0, |u| u.used);
                        used(b).cmp(&used(a))
                    }
                })
            })
            .then(ga.index.cmp(&gb.index))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::testutil::mk_node;
    use crate::core::request::{DeviceRequest, MemoryRequest};

    fn one_gpu(mem: u64, cores: u32) -> PodRequest {
        PodRequest {
            app: vec![Some(DeviceRequest {
                nums: 1,
                memory: MemoryRequest::Mib(mem),
                cores,
            })],
            ..PodRequest::default()
        }
    }

    #[test]
    fn node_score_matches_hand_computation() {
        // 2 GPUs, 10 slots and 1000 MiB each; 3 slots, 50 cores, 500 MiB used.
        let mut n = mk_node("a", 2, 10, 1000);
        n.usage[0].used = 2;
        n.usage[0].usedcores = 50;
        n.usage[1].used = 1;
        n.usage[1].usedmem = 500;
        // 10 * (3/20 + 50/200 + 500/2000) = 10 * 0.65
        assert!((node_score(&n) - 6.5).abs() < 1e-9);
        let empty = mk_node("b", 0, 10, 1000);
        assert!(node_score(&empty).abs() < 1e-12);
    }

    #[test]
    fn gpu_score_matches_hand_computation() {
        let mut n = mk_node("a", 1, 10, 1000);
        n.usage[0].used = 1;
        n.usage[0].usedcores = 20;
        n.usage[0].usedmem = 100;
        // 10 * ((1+1)/10 + (30+20)/100 + (400+100)/1000) = 10 * 1.2
        let s = gpu_score(&n, 0, &one_gpu(400, 30), &ScoringWeights::default());
        assert!((s - 12.0).abs() < 1e-9, "{s}");
        let w = ScoringWeights {
            slot: 0,
            core: 2,
            memory: 0,
        };
        assert!((gpu_score(&n, 0, &one_gpu(400, 30), &w) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn binpack_puts_fullest_last_spread_emptiest_last() {
        let mut n = mk_node("a", 3, 10, 1000);
        n.usage[0].usedmem = 200;
        n.usage[1].usedmem = 600;
        n.usage[2].usedmem = 400;
        let req = one_gpu(100, 0);
        let w = ScoringWeights::default();
        assert_eq!(gpu_order(&n, &req, GpuPolicy::BINPACK, &w), vec![0, 2, 1]);
        assert_eq!(gpu_order(&n, &req, GpuPolicy::SPREAD, &w), vec![1, 2, 0]);
    }

    #[test]
    fn ties_break_on_numa_then_index_and_numa_bind_groups() {
        let mut n = mk_node("a", 4, 10, 1000);
        n.gpus[0].numa = 1;
        n.gpus[1].numa = 0;
        n.gpus[2].numa = 1;
        n.gpus[3].numa = 0;
        n.usage[2].usedmem = 500; // fullest, on NUMA 1
        let mut req = one_gpu(100, 0);
        let w = ScoringWeights::default();
        assert_eq!(
            gpu_order(&n, &req, GpuPolicy::BINPACK, &w),
            vec![1, 3, 0, 2]
        );
        req.constraints.numa_bind = true;
        assert_eq!(gpu_order(&n, &req, GpuPolicy::SPREAD, &w), vec![1, 3, 2, 0]);
    }

    /// GPUs 0 and 1 half full, 2 and 3 empty; 0 and 2 on NUMA 1, 1 and 3 on
    /// NUMA 0; GPU 0 holds two containers, GPU 1 one.
    fn four_gpus() -> Node {
        let mut n = mk_node("a", 4, 10, 1000);
        for (pos, numa) in [1, 0, 1, 0].into_iter().enumerate() {
            n.gpus[pos].numa = numa;
        }
        n.usage[0].usedmem = 500;
        n.usage[0].used = 2;
        n.usage[1].usedmem = 500;
        n.usage[1].used = 1;
        n
    }

    /// HAMi v2.10 `DeviceUsageList.Less` (pkg/scheduler/policy/gpu_policy.go):
    /// single values keep the pre-chain order (score, NUMA tie-break;
    /// numa-bind groups NUMA nodes, binpack descending, spread ascending;
    /// mutex by slots used); a chain compares its sort keys in the order
    /// written, falls back to spread, puts NUMA first under numa-bind, and
    /// breaks ties by index. Fit walks from the end, so the last wins.
    #[test]
    fn each_policy_orders_as_hamis_less() {
        let n = four_gpus();
        let mut req = one_gpu(100, 0);
        let w = ScoringWeights::default();
        let order = |req: &PodRequest, policy: &str| {
            gpu_order(&n, req, policy.parse::<GpuPolicy>().unwrap(), &w)
        };
        // Slots differ (2 vs 1), so GPU 0 scores above GPU 1.
        assert_eq!(order(&req, "binpack"), vec![3, 2, 1, 0]);
        assert_eq!(order(&req, "spread"), vec![0, 1, 3, 2]);
        assert_eq!(order(&req, "topology-aware"), vec![0, 1, 3, 2]);
        assert_eq!(order(&req, "mutex"), vec![0, 1, 3, 2]);
        assert_eq!(order(&req, "binpack,numa"), vec![3, 2, 1, 0]);
        assert_eq!(order(&req, "numa,binpack"), vec![3, 1, 2, 0]);
        assert_eq!(order(&req, "numa"), vec![1, 3, 0, 2]);
        // A chain without a numa key leaves equal scores to the index.
        assert_eq!(order(&req, "binpack,mutex"), vec![2, 3, 1, 0]);
        assert_eq!(order(&req, "mutex,topology-aware"), vec![0, 1, 2, 3]);
        req.constraints.numa_bind = true;
        assert_eq!(order(&req, "binpack"), vec![2, 0, 3, 1]);
        assert_eq!(order(&req, "spread"), vec![1, 3, 0, 2]);
        assert_eq!(
            order(&req, "mutex"),
            vec![0, 1, 3, 2],
            "mutex ignores numa-bind"
        );
        assert_eq!(order(&req, "binpack,numa"), vec![3, 1, 2, 0]);
        assert_eq!(order(&req, "spread,mutex"), vec![1, 3, 0, 2]);
    }

    /// HAMi's scheduler-policy design (docs/develop/scheduler-policy.md,
    /// "Per-Pod device scoring weights"): `slot=1,core=1,memory=3` makes
    /// memory use count three times; spread still takes the lowest score.
    #[test]
    fn scoring_weights_move_the_choice() {
        let mut n = mk_node("a", 2, 10, 1000);
        n.usage[0].usedcores = 60;
        n.usage[1].usedmem = 400;
        let req = one_gpu(100, 10);
        // Default: GPU0 10*(0.1+0.7+0.1) = 9, GPU1 10*(0.1+0.1+0.5) = 7.
        let w = ScoringWeights::default();
        assert!((gpu_score(&n, 0, &req, &w) - 9.0).abs() < 1e-9);
        assert_eq!(gpu_order(&n, &req, GpuPolicy::SPREAD, &w).last(), Some(&1));
        // memory=3: GPU0 10*(0.1+0.7+0.3) = 11, GPU1 10*(0.1+0.1+1.5) = 17.
        let w: ScoringWeights = "slot=1,core=1,memory=3".parse().unwrap();
        assert!((gpu_score(&n, 1, &req, &w) - 17.0).abs() < 1e-9);
        assert_eq!(gpu_order(&n, &req, GpuPolicy::SPREAD, &w).last(), Some(&0));
        // A GPU without memory scores 0 (HAMi `ComputeScore`).
        n.gpus[1].devmem = 0;
        assert!(gpu_score(&n, 1, &req, &w).abs() < 1e-12);
    }
}

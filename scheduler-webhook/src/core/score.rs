//! HAMi's scoring formulas (spec §5): the node score that binpack and spread
//! rank nodes by, the GPU score, and the GPU order that fit walks.
//!
//! Fit walks the order from the end, so the order puts the preferred GPU
//! last: binpack sorts by score ascending (fullest last), spread descending
//! (emptiest last).

use std::cmp::Ordering;

use crate::core::kinds::GpuPolicy;
use crate::core::model::Node;
use crate::core::request::PodRequest;

/// Weights of the GPU score (`hami.io/device-scoring-weights`), 1 each by
/// default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoringWeights {
    /// Weight of slots.
    pub slot: f64,
    /// Weight of cores.
    pub core: f64,
    /// Weight of memory.
    pub memory: f64,
}

impl Default for ScoringWeights {
    fn default() -> Self {
        Self {
            slot: 1.0,
            core: 1.0,
            memory: 1.0,
        }
    }
}

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
/// cores/mem are summed over them.
#[must_use]
pub fn gpu_score(node: &Node, pos: usize, req: &PodRequest, w: &ScoringWeights) -> f64 {
    let (Some(g), Some(u)) = (node.gpus.get(pos), node.usage.get(pos)) else {
        return 0.0;
    };
    let (mut entries, mut cores, mut mem) = (0u64, 0u64, 0u64);
    for r in req.init.iter().chain(&req.app).flatten() {
        entries += 1;
        cores += u64::from(r.cores);
        mem += r.memory_on(g.devmem);
    }
    #[allow(clippy::cast_precision_loss)]
    let s = w.slot * ratio((entries + u64::from(u.used)) as f64, f64::from(g.count))
        + w.core
            * ratio(
                (cores + u64::from(u.usedcores)) as f64,
                f64::from(g.devcore),
            )
        + w.memory * ratio((mem + u.usedmem) as f64, g.devmem as f64);
    10.0 * s
}

/// The order fit walks (from the end) under a GPU policy: by score
/// (binpack ascending, spread descending), ties by NUMA ascending then
/// index; with numa-bind, NUMA groups are kept together first.
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
    let numa_bind = req.constraints.numa_bind;
    let scores = &*scores;
    order.sort_by(|&a, &b| {
        let (ga, gb) = (&node.gpus[a], &node.gpus[b]);
        let group = if numa_bind {
            ga.numa.cmp(&gb.numa)
        } else {
            Ordering::Equal
        };
        let by_score = match policy {
            GpuPolicy::Binpack => scores[a].total_cmp(&scores[b]),
            GpuPolicy::Spread => scores[b].total_cmp(&scores[a]),
        };
        group
            .then(by_score)
            .then(ga.numa.cmp(&gb.numa))
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
            slot: 0.0,
            core: 2.0,
            memory: 0.0,
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
        assert_eq!(gpu_order(&n, &req, GpuPolicy::Binpack, &w), vec![0, 2, 1]);
        assert_eq!(gpu_order(&n, &req, GpuPolicy::Spread, &w), vec![1, 2, 0]);
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
            gpu_order(&n, &req, GpuPolicy::Binpack, &w),
            vec![1, 3, 0, 2]
        );
        req.constraints.numa_bind = true;
        assert_eq!(gpu_order(&n, &req, GpuPolicy::Spread, &w), vec![1, 3, 2, 0]);
    }
}

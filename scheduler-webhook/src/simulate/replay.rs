//! One replay of a trace under one policy, split count and seed, with the
//! paper's method: the pod list is shuffled with the seed, pods arrive one
//! by one and never leave, and once the list runs out it is inflated by
//! sampling with replacement until the arrived GPU demand reaches the target
//! (130 % of capacity by default). A pod that fits nowhere stays
//! unscheduled and the replay goes on.
//!
//! Pure apart from the progress callback: no I/O, no clock.

use serde::Serialize;

use std::collections::BTreeMap;

use crate::core::fgd::{
    FgdIndex, FgdParams, FgdTies, MILLI_PER_GPU, ShapeDistribution, gpu_idle_milli, idle_shares,
    node_idle_milli,
};
use crate::core::fgdpack::FgdPackParams;
use crate::core::model::Cluster;
use crate::core::policy::{GpuPolicy, Policy, SchedulerConfig, schedule};
use crate::core::request::PodRequest;
use crate::core::reservation::HostResources;
use crate::core::rng::SplitMix64;
use crate::simulate::trace::{NodeRow, PodRow, node_from_row};

/// What one replay is asked to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplaySpec {
    /// Placement policy.
    pub policy: Policy,
    /// Seed of the shuffle, the sampling and every tie break.
    pub seed: u64,
    /// Arrived GPU demand to stop at, as a fraction of capacity.
    pub demand: f64,
    /// HAMi split count of every GPU.
    pub split_count: u32,
    /// The knobs of `fgdpack` (other policies ignore them).
    pub fgdpack: FgdPackParams,
    /// The knobs of the FGD index, for `fgd` and `fgdpack` (other policies
    /// ignore them). A [`FgdTies::NodeOrder`] seed is replaced by one drawn
    /// from [`ReplaySpec::seed`], so each replay has its own node order.
    pub fgd: FgdParams,
}

/// The outcome of one replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    /// Placement policy.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Split count.
    pub split_count: u32,
    /// Arrived demand the replay stopped at (fraction of capacity).
    pub demand: f64,
    /// GPUs in the cluster.
    pub total_gpus: usize,
    /// Allocated GPU-milli ÷ (total GPUs × 1000) at the end.
    pub allocation_ratio: f64,
    /// Total GPUs × (1 − allocation ratio).
    pub unallocated_gpus: f64,
    /// Cluster fragmentation ÷ idle GPU capacity at the end, for the
    /// trace's pod-shape distribution (none for the bound, which places
    /// nothing).
    pub fragmentation_ratio: Option<f64>,
    /// Pods placed.
    pub pods_scheduled: u64,
    /// Pods that fit nowhere.
    pub pods_failed: u64,
    /// Pods that asked for a GPU and fit nowhere.
    pub gpu_pods_failed: u64,
    /// `[arrived_demand, allocation_ratio]` at every 1 % of arrived demand
    /// (the bound: every 10 %, and at the end).
    pub curve: Vec<[f64; 2]>,
    /// Where the unallocated GPUs are at the end, by GPU model (none for
    /// the bound, which places nothing).
    pub idle: Option<BTreeMap<String, IdleGpus>>,
    /// GPUs in use but not full at the end, counted by their idle share
    /// (milli): which slices are left over (none for the bound).
    pub slices: Option<BTreeMap<u32, u64>>,
}

/// Unallocated GPUs on one GPU model's nodes at the end of a replay, by why
/// they are idle: each node's idle GPUs split in proportion to the trace's
/// GPU pods (by frequency) that would fit whole, would fit the GPUs but not
/// the free CPU or memory, or would not fit the GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IdleGpus {
    /// The share a typical GPU pod would still fit whole.
    pub usable: f64,
    /// The share a typical GPU pod would fit on the GPUs but not in the
    /// free CPU or memory: the host ran out first.
    pub host_bound: f64,
    /// The share a typical GPU pod would not fit on the GPUs: slices too
    /// small, the wrong type, or out of slots.
    pub slivers: f64,
}

/// The end state's partly used GPUs, counted by idle share (milli).
fn partly_used_by_idle(cluster: &Cluster) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for n in cluster.nodes() {
        for (g, u) in n.gpus.iter().zip(&n.usage) {
            let idle = gpu_idle_milli(g, u);
            if idle > 0 && idle < MILLI_PER_GPU {
                *out.entry(idle).or_insert(0) += 1;
            }
        }
    }
    out
}

/// The end state's unallocated GPUs per GPU model and [`IdleKind`].
fn idle_by_model(cluster: &Cluster, dist: &ShapeDistribution) -> BTreeMap<String, IdleGpus> {
    let mut out: BTreeMap<String, IdleGpus> = BTreeMap::new();
    for node in cluster.nodes() {
        let Some(model) = node.gpus.first().map(|g| g.device_type.to_string()) else {
            continue;
        };
        let idle = node_idle_milli(node);
        if idle == 0 {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let gpus = idle as f64 / f64::from(MILLI_PER_GPU);
        let shares = idle_shares(node, dist);
        let e = out.entry(model).or_default();
        e.usable += gpus * shares.usable;
        e.host_bound += gpus * shares.host_bound;
        e.slivers += gpus * shares.slivers;
    }
    out
}

/// The arrival sequence of a replay: indices into `pods`, the list shuffled
/// with the seed, then sampled with replacement from the same generator,
/// until the arrived GPU demand reaches `demand × capacity_milli`. The same
/// for every policy (ties draw from another generator).
#[must_use]
pub fn arrivals(pods: &[PodRow], seed: u64, demand: f64, capacity_milli: u64) -> Vec<usize> {
    let mut order_rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order_rng.shuffle(&mut order);
    if pods.iter().all(|p| p.gpu_demand_milli() == 0) {
        return Vec::new();
    }
    #[allow(clippy::cast_precision_loss)]
    let target = demand * capacity_milli as f64;
    let mut arrived = 0u64;
    let mut out = Vec::new();
    #[allow(clippy::cast_precision_loss)]
    while (arrived as f64) < target {
        let i = if out.len() < order.len() {
            order[out.len()]
        } else {
            order_rng.below(pods.len())
        };
        arrived += pods[i].gpu_demand_milli();
        out.push(i);
    }
    out
}

/// Errors of a replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The trace has no GPU.
    #[error("the node list has no GPU")]
    NoGpu,
    /// The pod list is empty.
    #[error("the pod list is empty")]
    NoPods,
    /// The pods ask for no GPU at all, so the demand can never be reached.
    #[error("the pod list asks for no GPU")]
    NoGpuDemand,
}

/// The trace's pod-shape distribution (the workload FGD and the
/// fragmentation metric are measured against).
#[must_use]
pub fn trace_distribution(pods: &[PodRow]) -> ShapeDistribution {
    let mut d = ShapeDistribution::default();
    for p in pods {
        d.observe(p.shape());
    }
    d
}

/// Replays the trace. `progress` is called with the arrived demand
/// (fraction of the target, 0–1) after each pod.
///
/// # Errors
/// A trace without GPUs, pods or GPU demand.
pub fn replay(
    nodes: &[NodeRow],
    pods: &[PodRow],
    dist: &ShapeDistribution,
    spec: &ReplaySpec,
    mut progress: impl FnMut(f64),
) -> Result<ReplayResult, ReplayError> {
    if pods.is_empty() {
        return Err(ReplayError::NoPods);
    }
    if pods.iter().all(|p| p.gpu_demand_milli() == 0) {
        return Err(ReplayError::NoGpuDemand);
    }
    let mut cluster = Cluster::new(
        nodes
            .iter()
            .map(|r| node_from_row(r, spec.split_count))
            .collect(),
    );
    let total_gpus = cluster.gpu_count();
    if total_gpus == 0 {
        return Err(ReplayError::NoGpu);
    }
    let gpu_policy = match spec.policy {
        Policy::Spread => GpuPolicy::SPREAD,
        _ => GpuPolicy::BINPACK,
    };
    let cfg = SchedulerConfig {
        node_policy: spec.policy,
        gpu_policy,
        fgdpack: spec.fgdpack,
        ..SchedulerConfig::default()
    };
    let requests: Vec<PodRequest> = pods.iter().map(PodRow::request).collect();
    let mut fgd = spec.fgd;
    if let FgdTies::NodeOrder(_) = fgd.ties {
        fgd.ties = FgdTies::NodeOrder(spec.seed ^ 0x0DE0_0DE5_5EED);
    }
    let mut index = spec
        .policy
        .uses_fgd_index()
        .then(|| FgdIndex::with_params(dist, &cluster, fgd));

    let mut tie_rng = SplitMix64::new(spec.seed ^ 0x5E_ED0F_71E5);

    #[allow(clippy::cast_precision_loss)]
    let capacity = (total_gpus as u64 * u64::from(MILLI_PER_GPU)) as f64;
    let target = spec.demand * capacity;
    let node_count = cluster.nodes().len();
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut scheduled, mut failed, mut gpu_failed) = (0u64, 0u64, 0u64);
    let mut curve = Vec::new();
    let capacity_milli = total_gpus as u64 * u64::from(MILLI_PER_GPU);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let last_mark = (spec.demand * 100.0).round().max(0.0) as u64;
    let mut next_mark = 1u64;
    let sequence = arrivals(pods, spec.seed, spec.demand, capacity_milli);
    for (k, &i) in sequence.iter().enumerate() {
        let seq = k + 1;
        let pod = &pods[i];
        let req = &requests[i];
        arrived += pod.gpu_demand_milli();
        match schedule(
            &cluster,
            req,
            0..node_count,
            &cfg,
            index.as_mut(),
            &mut tie_rng,
        ) {
            Ok(d) => {
                let devices = cluster
                    .node(d.node)
                    .map(|n| d.pod_devices(n))
                    .unwrap_or_default();
                let host = HostResources {
                    cpu_milli: req.cpu_milli,
                    memory_mib: req.memory_mib,
                };
                // Fit never over-commits, so the ledger accepts every
                // decision; a refusal would be a bug, counted as a failure.
                if cluster
                    .reserve(&seq.to_string(), d.node, &devices, d.init_count(), host)
                    .is_ok()
                {
                    scheduled += 1;
                    allocated += pod.gpu_demand_milli();
                    if let Some(ix) = index.as_mut() {
                        ix.refresh_node(&cluster, d.node);
                    }
                } else {
                    failed += 1;
                }
            }
            Err(_) => {
                failed += 1;
                if pod.num_gpu > 0 {
                    gpu_failed += 1;
                }
            }
        }
        while next_mark <= last_mark && arrived * 100 >= next_mark * capacity_milli {
            curve.push([arrived as f64 / capacity, allocated as f64 / capacity]);
            next_mark += 1;
        }
        progress((arrived as f64 / target).min(1.0));
    }
    #[allow(clippy::cast_precision_loss)]
    let allocation_ratio = allocated as f64 / capacity;
    // The metric is always the default shapes' fragmentation; an index
    // built with other shapes cannot measure it (ties do not matter).
    let default_shapes = |p: &FgdParams| {
        FgdParams {
            ties: FgdParams::default().ties,
            ..*p
        } == FgdParams::default()
    };
    let frag_index = match index {
        Some(ix) if default_shapes(ix.params()) => ix,
        _ => FgdIndex::new(dist, &cluster),
    };
    let idle: f64 = cluster
        .nodes()
        .iter()
        .flat_map(|n| n.gpus.iter().zip(&n.usage))
        .map(|(g, u)| {
            let used = if g.devcore > 0 {
                f64::from(u.usedcores) / f64::from(g.devcore)
            } else {
                0.0
            };
            (1.0 - used.min(1.0)) * f64::from(MILLI_PER_GPU)
        })
        .sum();
    let fragmentation_ratio = Some(if idle > 0.0 {
        frag_index.cluster_fragmentation() / idle
    } else {
        0.0
    });
    #[allow(clippy::cast_precision_loss)]
    Ok(ReplayResult {
        policy: spec.policy.to_string(),
        seed: spec.seed,
        split_count: spec.split_count,
        demand: arrived as f64 / capacity,
        total_gpus,
        allocation_ratio,
        unallocated_gpus: total_gpus as f64 * (1.0 - allocation_ratio),
        fragmentation_ratio,
        pods_scheduled: scheduled,
        pods_failed: failed,
        gpu_pods_failed: gpu_failed,
        curve,
        idle: Some(idle_by_model(&cluster, dist)),
        slices: Some(partly_used_by_idle(&cluster)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, gpus: u32) -> NodeRow {
        NodeRow {
            name: name.into(),
            cpu_milli: 64_000,
            memory_mib: 1 << 16,
            gpus,
            model: "T4".into(),
        }
    }

    fn pod(num_gpu: u32, gpu_milli: u32) -> PodRow {
        PodRow {
            name: "p".into(),
            cpu_milli: 1000,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            gpu_spec: vec![],
        }
    }

    fn spec(policy: Policy) -> ReplaySpec {
        ReplaySpec {
            policy,
            seed: 1,
            demand: 1.3,
            split_count: 10,
            fgdpack: FgdPackParams::default(),
            fgd: FgdParams::default(),
        }
    }

    #[test]
    fn replay_is_reproducible_and_stops_at_the_demand() {
        let nodes = vec![node("a", 2), node("b", 2)];
        let pods = vec![pod(1, 500), pod(1, 300), pod(0, 0), pod(2, 1000)];
        let dist = trace_distribution(&pods);
        for policy in Policy::ALL {
            let a = replay(&nodes, &pods, &dist, &spec(policy), |_| {}).unwrap();
            let b = replay(&nodes, &pods, &dist, &spec(policy), |_| {}).unwrap();
            assert_eq!(a, b, "{policy}");
            assert!(a.demand >= 1.3, "{policy}: {}", a.demand);
            assert!(
                a.allocation_ratio <= 1.0 && a.allocation_ratio > 0.3,
                "{policy}: {}",
                a.allocation_ratio
            );
            assert_eq!(a.total_gpus, 4);
            assert!((a.unallocated_gpus - 4.0 * (1.0 - a.allocation_ratio)).abs() < 1e-9);
            assert!(a.pods_failed > 0, "{policy}: 130 % cannot all fit");
            assert_eq!(a.curve.len(), 130, "{policy}");
            assert!(
                a.curve
                    .windows(2)
                    .all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1])
            );
            assert!((0.0..=1.0).contains(&a.fragmentation_ratio.unwrap()));
            // The breakdown accounts for every unallocated GPU, by model.
            let idle = a.idle.as_ref().unwrap();
            assert_eq!(idle.keys().collect::<Vec<_>>(), ["NVIDIA-T4"], "{policy}");
            let sum: f64 = idle
                .values()
                .map(|i| i.usable + i.host_bound + i.slivers)
                .sum();
            assert!(
                (sum - a.unallocated_gpus).abs() < 1e-9,
                "{policy}: {sum} vs {}",
                a.unallocated_gpus
            );
            // Partly used GPUs account for part of it, each slice in (0, 1000).
            let slices = a.slices.as_ref().unwrap();
            assert!(slices.keys().all(|&m| m > 0 && m < MILLI_PER_GPU));
            let partly: u64 = slices.iter().map(|(m, n)| u64::from(*m) * n).sum();
            #[allow(clippy::cast_precision_loss)]
            let partly = partly as f64 / 1000.0;
            assert!(partly <= a.unallocated_gpus + 1e-9, "{policy}");
        }
    }

    #[test]
    fn idle_breakdown_names_the_host_when_cpu_runs_out_first() {
        // Two GPUs, CPU for one pod: the second GPU stays idle, host-bound.
        let nodes = vec![NodeRow {
            cpu_milli: 1000,
            ..node("a", 2)
        }];
        let pods = vec![pod(1, 1000)];
        let r = replay(
            &nodes,
            &pods,
            &trace_distribution(&pods),
            &spec(Policy::Fgd),
            |_| {},
        )
        .unwrap();
        assert_eq!(r.pods_scheduled, 1);
        let t4 = r.idle.as_ref().unwrap()["NVIDIA-T4"];
        assert_eq!(
            t4,
            IdleGpus {
                usable: 0.0,
                host_bound: 1.0,
                slivers: 0.0
            }
        );
    }

    #[test]
    fn cpu_must_fit_too() {
        // One GPU, but pods need more CPU than the node has: nothing lands.
        let nodes = vec![NodeRow {
            cpu_milli: 500,
            ..node("a", 1)
        }];
        let pods = vec![pod(1, 500)];
        let r = replay(
            &nodes,
            &pods,
            &trace_distribution(&pods),
            &spec(Policy::Binpack),
            |_| {},
        )
        .unwrap();
        assert_eq!(r.pods_scheduled, 0);
        assert!(r.allocation_ratio.abs() < 1e-12);
    }

    #[test]
    fn split_count_binds_small_slices() {
        // 10 pods of 50 milli fill the 10 slots of one GPU at 50 %.
        let nodes = vec![node("a", 1)];
        let pods = vec![pod(1, 50)];
        let d = trace_distribution(&pods);
        let r10 = replay(&nodes, &pods, &d, &spec(Policy::Binpack), |_| {}).unwrap();
        let r100 = replay(
            &nodes,
            &pods,
            &d,
            &ReplaySpec {
                split_count: 100,
                ..spec(Policy::Binpack)
            },
            |_| {},
        )
        .unwrap();
        assert!(
            (r10.allocation_ratio - 0.5).abs() < 1e-9,
            "{}",
            r10.allocation_ratio
        );
        assert!(
            (r100.allocation_ratio - 1.0).abs() < 1e-9,
            "{}",
            r100.allocation_ratio
        );
    }

    #[test]
    fn empty_or_gpu_less_traces_are_errors() {
        let d = ShapeDistribution::default();
        assert_eq!(
            replay(&[node("a", 1)], &[], &d, &spec(Policy::Fgd), |_| {}),
            Err(ReplayError::NoPods)
        );
        assert_eq!(
            replay(
                &[node("a", 1)],
                &[pod(0, 0)],
                &d,
                &spec(Policy::Fgd),
                |_| {}
            ),
            Err(ReplayError::NoGpuDemand)
        );
        assert_eq!(
            replay(
                &[node("a", 0)],
                &[pod(1, 10)],
                &d,
                &spec(Policy::Fgd),
                |_| {}
            ),
            Err(ReplayError::NoGpu)
        );
    }
}

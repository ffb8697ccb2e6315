//! The `fgdpack` policy: fragmentation gradient descent ([`crate::core::fgd`])
//! that also counts the GPU capacity a node's CPU and memory can no longer
//! feed, with ties broken by a packing key that also counts what the node
//! has left once the pod is placed.
//!
//! Same rules as every policy: pods arrive one at a time, never move, and
//! must fit CPU, memory and GPUs. For each node that fits, FGD's own
//! evaluation gives the placement inside the node and the fragmentation
//! growth `g` (milli-GPU, for the workload's shape distribution). To it is
//! added [`FgdPackParams::strand`] × `s`, the growth of the node's stranded
//! capacity: the idle milli-GPU that its free CPU or memory cannot feed at
//! the CPU and memory the workload's GPU pods ask per milli-GPU (on openb,
//! about 11 cores per GPU). FGD sees a shortage only when the next typical
//! pod no longer fits; `s` sees it while the node still has GPUs to fill,
//! so a CPU-only pod (whose FGD growth is the same on every node) or a
//! CPU-heavy GPU pod goes where CPU is plentiful, and a CPU-light one
//! (openb's 810-milli pods ask under 4 cores per GPU) where it is scarce.
//! Two more terms join the growth: [`FgdPackParams::strand_left`] × `a`,
//! the stranded capacity the node is left with after the pod (of two
//! placements that strand as much more, the one on the node left less
//! stranded wins; not counted when CPU or memory, not GPUs, bind the whole
//! cluster for the workload, [`FgdIndex::hosts_bind`], for then some nodes
//! end stranded whatever the placement and the term only keeps CPU-light
//! pods off the nodes whose GPUs they alone can use), and
//! `k` = [`FgdPackParams::keep_hosts`] when the pod
//! would leave the node unable to host a rare multi-GPU shape that few
//! nodes can host ([`crate::core::rare_hosts`]), else 0.
//! The node's key is then, higher winning:
//! 1. `⌊steps · sigmoid(−(g + strand · s + strand_left · a + k) /
//!    temperature)⌋`: FGD's score,
//!    with [`FgdPackParams::steps`] = 100 and
//!    [`FgdPackParams::temperature`] = 1000 as FGD (a larger temperature
//!    makes each step wider in growth, so more nodes tie);
//! 2. for a GPU pod: the node's fullness before the pod (HAMi's node score,
//!    0–30, as FGD breaks its ties), minus [`FgdPackParams::cpu_balance`] ×
//!    how far the node's CPU share in use after the pod runs ahead of its
//!    GPU share in use (×10), minus [`FgdPackParams::leftover`] × the node's
//!    leftover after the pod as `bestfit` scores it (×10); for a CPU-only
//!    pod, spare CPU per idle GPU, as FGD.
//!
//! With [`FgdPackParams::fgd`] the decisions are FGD's. The defaults (FGD's
//! score, leftover weight 0.3, chosen on the openb traces `default` and
//! `multigpu50`, seeds 42 and 43, split count 100; strand weight 1, chosen
//! on `default`, seeds 42–51; `strand_left` 0.4 and `keep_hosts` 1000,
//! chosen on `default`, seeds 42–61) are measured in `docs/benchmarks.md`; wider
//! score steps and the CPU-balance term measured worse or no better there
//! and are off.
//!
//! Each node's outcome is remembered in the FGD index's memo under the
//! request tagged with this policy, so FGD and `fgdpack` decisions never
//! read each other's keys.

use crate::core::fgd::{FgdIndex, Placement, node_idle_milli};
use crate::core::fit::{FitFailure, PodPicks};
use crate::core::kinds::Policy;
use crate::core::model::{Cluster, Node, NodeId};
use crate::core::rare_hosts::breaks_a_host;
use crate::core::request::PodRequest;
use crate::core::rng::SplitMix64;
use crate::core::score::{ScoringWeights, node_score};

/// The knobs of `fgdpack`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FgdPackParams {
    /// Growth scale of the score's sigmoid, milli-GPU (FGD: 1000).
    pub temperature: f64,
    /// Number of score steps (FGD: 100).
    pub steps: f64,
    /// Weight of CPU running ahead of GPU in the packing key (FGD: 0).
    pub cpu_balance: f64,
    /// Weight of the node's leftover after the pod, as `bestfit` scores it
    /// (`0.5 × free CPU ÷ 128 cores + 0.5 × free GPU ÷ 8 GPUs`), in the
    /// packing key (FGD: 0).
    pub leftover: f64,
    /// Weight of the growth in stranded GPU capacity, added to FGD's
    /// growth before it is scored (FGD: 0). A node's stranded capacity is
    /// the idle milli-GPU its free CPU or memory cannot feed at the typical
    /// GPU pods' CPU and memory per milli-GPU.
    pub strand: f64,
    /// Weight of the stranded capacity the node is left with after the
    /// pod, added to the growth as well (FGD: 0): of two placements that
    /// strand as much more, the one on the node left less stranded wins.
    /// Not counted where the workload's CPU or memory binds the cluster
    /// ([`FgdIndex::hosts_bind`]).
    pub strand_left: f64,
    /// Growth (milli-GPU) counted for a placement that leaves a node
    /// unable to host a guarded shape it could host before
    /// ([`crate::core::rare_hosts`]; FGD: 0).
    pub keep_hosts: f64,
}

/// The defaults (`docs/benchmarks.md`): FGD's score of its growth plus the
/// stranded capacity's growth (weight 1, chosen on openb `default`), plus
/// 0.4 × the stranded capacity left and 1,000 for breaking a rare shape's
/// host (chosen on `default`, seeds 42–61), ties by
/// fullness less 0.3 × the bestfit leftover (chosen on `default` and
/// `multigpu50`).
impl Default for FgdPackParams {
    fn default() -> Self {
        Self {
            temperature: 1000.0,
            steps: 100.0,
            cpu_balance: 0.0,
            leftover: 0.3,
            strand: 1.0,
            strand_left: 0.4,
            keep_hosts: 1000.0,
        }
    }
}

impl FgdPackParams {
    /// The parameters under which `fgdpack` decides as `fgd`.
    #[must_use]
    pub fn fgd() -> Self {
        Self {
            temperature: 1000.0,
            steps: 100.0,
            cpu_balance: 0.0,
            leftover: 0.0,
            strand: 0.0,
            strand_left: 0.0,
            keep_hosts: 0.0,
        }
    }

    /// The score of a fragmentation growth (milli-GPU): higher is better.
    #[must_use]
    pub fn score_of_growth(&self, growth: f64) -> f64 {
        let s = 1.0 / (1.0 + (growth / self.temperature).exp());
        (s * self.steps).floor()
    }
}

/// The share of the node's CPU in use once `extra` more milli-CPU is, 0–1
/// (0 for a node without CPU capacity).
fn cpu_share(node: &Node, extra: u64) -> f64 {
    match (node.capacity, node.free_cpu_memory()) {
        (Some(cap), Some((free, _))) if cap.cpu_milli > 0 => {
            let used = cap.cpu_milli.saturating_sub(free) + extra;
            #[allow(clippy::cast_precision_loss)]
            let share = used as f64 / cap.cpu_milli as f64;
            share.min(1.0)
        }
        _ => 0.0,
    }
}

/// The share of the node's GPU capacity in use once `extra` more milli-GPU
/// is, 0–1.
fn gpu_share(node: &Node, extra: u64) -> f64 {
    let total = node.gpus.len() as u64 * 1000;
    if total == 0 {
        return 0.0;
    }
    let used = total.saturating_sub(node_idle_milli(node)) + extra;
    #[allow(clippy::cast_precision_loss)]
    let share = used as f64 / total as f64;
    share.min(1.0)
}

/// GPU-milli the pod takes (cores share of each GPU it asks, summed).
fn pod_gpu_milli(req: &PodRequest) -> u64 {
    req.app
        .iter()
        .flatten()
        .map(|r| u64::from(r.nums) * u64::from(r.cores.min(100)) * 10)
        .sum()
}

/// The idle milli-GPU of a node with `free` (milli-CPU, MiB) and `idle`
/// milli-GPU that its CPU or memory cannot feed at `per_gpu` (milli-CPU,
/// MiB per milli-GPU).
fn stranded(free: (u64, u64), idle: u64, per_gpu: (f64, f64)) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let (cpu, mem, idle) = (free.0 as f64, free.1 as f64, idle as f64);
    let fed = |have: f64, per: f64| if per > 0.0 { have / per } else { f64::INFINITY };
    (idle - fed(cpu, per_gpu.0).min(fed(mem, per_gpu.1))).max(0.0)
}

/// The node's stranded capacity before and after placing `req` on it
/// ((0, 0) for a node whose CPU and memory are not tracked).
fn stranded_before_after(index: &FgdIndex, node: &Node, req: &PodRequest) -> (f64, f64) {
    let Some((cpu, mem)) = node.free_cpu_memory() else {
        return (0.0, 0.0);
    };
    let idle = node_idle_milli(node);
    let per_gpu = index.host_per_gpu();
    let after = (
        cpu.saturating_sub(req.cpu_milli),
        mem.saturating_sub(req.memory_mib),
    );
    (
        stranded((cpu, mem), idle, per_gpu),
        stranded(after, idle.saturating_sub(pod_gpu_milli(req)), per_gpu),
    )
}

/// What `fgdpack` adds to FGD's growth for placing `req` on `node` at
/// `placement`: the stranded capacity's growth and what is left of it,
/// and the keep of a guarded shape's host.
fn added_growth(
    params: &FgdPackParams,
    index: &FgdIndex,
    node: &Node,
    req: &PodRequest,
    placement: &Placement,
) -> f64 {
    let (before, after) = stranded_before_after(index, node, req);
    let guarded = index.guarded_shapes();
    let keep = if params.keep_hosts != 0.0
        && !guarded.is_empty()
        && breaks_a_host(
            guarded,
            node,
            &placement.gpus(),
            (req.cpu_milli, req.memory_mib),
        ) {
        params.keep_hosts
    } else {
        0.0
    };
    // Where CPU or memory bind the whole cluster, some nodes end stranded
    // whatever the placement, and counting what is left stranded only keeps
    // the CPU-light pods off the nodes whose GPUs they alone can use.
    let left = if index.hosts_bind() {
        0.0
    } else {
        params.strand_left
    };
    params.strand * (after - before) + left * after + keep
}

/// The packing key (see the module doc).
fn secondary(params: &FgdPackParams, node: &Node, req: &PodRequest) -> f64 {
    if req.wants_gpu() {
        let ahead = cpu_share(node, req.cpu_milli) - gpu_share(node, pod_gpu_milli(req));
        let free_cpu = node
            .free_cpu_memory()
            .map_or(0, |(c, _)| c.saturating_sub(req.cpu_milli));
        let free_gpu = node_idle_milli(node).saturating_sub(pod_gpu_milli(req));
        #[allow(clippy::cast_precision_loss)]
        let leftover = 0.5 * free_cpu as f64 / 128_000.0 + 0.5 * free_gpu as f64 / 8_000.0;
        node_score(node)
            - params.cpu_balance * 10.0 * ahead.max(0.0)
            - params.leftover * 10.0 * leftover
    } else {
        let free_cpu = node
            .free_cpu_memory()
            .map_or(0, |(c, _)| c.saturating_sub(req.cpu_milli));
        #[allow(clippy::cast_precision_loss)]
        let per_idle = free_cpu as f64 / (node_idle_milli(node) as f64 + 1.0);
        per_idle
    }
}

/// What `fgdpack` chose: the node, the GPUs, the node's score.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    /// The node.
    pub node: NodeId,
    /// GPUs per container.
    pub picks: PodPicks,
    /// The node's score (the key's first part).
    pub score: f64,
}

/// `fgdpack` over the candidates (see the module doc): the chosen node, if
/// any fits, and the nodes that did not fit with why, in candidate order.
/// Equal keys break by `rng`, every tied node equally likely.
pub fn schedule_fgdpack(
    cluster: &Cluster,
    req: &PodRequest,
    candidates: impl IntoIterator<Item = NodeId>,
    weights: ScoringWeights,
    index: &mut FgdIndex,
    params: &FgdPackParams,
    rng: &mut SplitMix64,
) -> (Option<Chosen>, Vec<(NodeId, FitFailure)>) {
    // Remembered under the tagged request, apart from FGD's keys.
    let mut tagged = req.clone();
    tagged.node_policy = Some(Policy::FgdPack);
    let key = |index: &FgdIndex, _, node: &Node, growth: f64, placement: &Placement| {
        let growth = growth + added_growth(params, index, node, req, placement);
        (params.score_of_growth(growth), secondary(params, node, req))
    };
    let (chosen, failed) = index.scan(cluster, &tagged, req, candidates, weights, key, rng);
    let chosen = chosen.map(|(score, node, picks)| Chosen { node, picks, score });
    (chosen, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fgd::{FgdParams, Shape, ShapeDistribution};
    use crate::core::model::NodeCapacity;
    use crate::core::model::testutil::mk_node;
    use crate::core::policy::{ScheduleError, SchedulerConfig, schedule};
    use crate::core::request::{DeviceRequest, MemoryRequest};
    use crate::core::reservation::HostResources;

    fn pod(nums: u32, cores: u32, cpu_milli: u64) -> PodRequest {
        PodRequest {
            app: vec![Some(DeviceRequest {
                nums,
                memory: MemoryRequest::Percent(cores),
                cores,
            })],
            cpu_milli,
            ..PodRequest::default()
        }
    }

    /// With FGD's parameters, `fgdpack` makes FGD's decisions, and the two
    /// can share one index (and its remembered outcomes) without reading
    /// each other's keys.
    #[test]
    fn with_fgd_parameters_it_decides_as_fgd_on_a_shared_index() {
        let cap = NodeCapacity {
            cpu_milli: 8000,
            memory_mib: 1 << 20,
        };
        let mut c = Cluster::new(vec![
            mk_node("a", 2, 10, 1000).with_capacity(cap),
            mk_node("b", 4, 10, 1000).with_capacity(cap),
            mk_node("c", 1, 10, 1000).with_capacity(cap),
            mk_node("d", 8, 10, 1000).with_capacity(cap),
        ]);
        let mut dist = ShapeDistribution::default();
        for (gpus, milli) in [(1, 300), (1, 500), (1, 1000), (2, 1000), (0, 0)] {
            dist.observe(Shape {
                cpu_milli: 1000,
                memory_mib: 0,
                gpus,
                milli,
                types: vec![],
            });
        }
        let fgd_cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let pack_cfg = SchedulerConfig {
            node_policy: Policy::FgdPack,
            fgdpack: FgdPackParams::fgd(),
            ..SchedulerConfig::default()
        };
        let mut shared = FgdIndex::new(&dist, &c);
        let mut rng = SplitMix64::new(7);
        let mut draw = SplitMix64::new(11);
        let mut placed = 0;
        for k in 0..60 {
            let req = match draw.below(5) {
                0 => pod(1, 30, 1000),
                1 => pod(1, 50, 500),
                2 => pod(1, 100, 2000),
                3 => pod(2, 100, 1000),
                _ => PodRequest {
                    cpu_milli: 1500,
                    ..PodRequest::default()
                },
            };
            let mut fresh = FgdIndex::new(&dist, &c);
            let mut r1 = rng.clone();
            let fgd = schedule(&c, &req, 0..4, &fgd_cfg, Some(&mut fresh), &mut r1);
            // The shared index answers fgd first, then fgdpack, alike.
            let mut r2 = rng.clone();
            let fgd_shared = schedule(&c, &req, 0..4, &fgd_cfg, Some(&mut shared), &mut r2);
            let pack = schedule(&c, &req, 0..4, &pack_cfg, Some(&mut shared), &mut rng);
            assert_eq!(fgd, fgd_shared, "step {k}");
            assert_eq!(fgd, pack, "step {k}");
            if let Ok(d) = pack {
                let devices = d.pod_devices(c.node(d.node).unwrap());
                let host = HostResources {
                    cpu_milli: req.cpu_milli,
                    memory_mib: 0,
                };
                if c.reserve(&format!("p{k}"), d.node, &devices, 0, host)
                    .is_ok()
                {
                    placed += 1;
                    shared.refresh_node(&c, d.node);
                }
            }
        }
        assert!(placed > 10, "{placed}");
        // Without an index it is an error, as for fgd.
        assert_eq!(
            schedule(&c, &pod(1, 30, 0), 0..4, &pack_cfg, None, &mut rng),
            Err(ScheduleError::MissingFgdIndex)
        );
    }

    #[test]
    fn stranded_capacity_is_what_free_cpu_or_memory_cannot_feed() {
        // 8 cores and 10 GiB per GPU: milli-CPU and MiB per milli-GPU.
        let per_gpu = (8.0, 10.24);
        // 4 idle GPUs, 24 cores: 3 GPUs fed, 1000 milli-GPU stranded.
        assert!((stranded((24_000, 1 << 20), 4000, per_gpu) - 1000.0).abs() < 1e-9);
        // Memory the shorter: 20 GiB feeds 2 GPUs.
        assert!((stranded((64_000, 20_480), 4000, per_gpu) - 2000.0).abs() < 1e-9);
        // Enough of both, or no GPU pods in the workload: nothing.
        assert!(stranded((64_000, 1 << 20), 4000, per_gpu).abs() < 1e-9);
        assert!(stranded((0, 0), 4000, (0.0, 0.0)).abs() < 1e-9);
    }

    /// Where `fgdpack` with `params` puts a whole-GPU pod asking `cpu_milli`
    /// between two empty 4-GPU nodes, "poor" (`poor_cores` cores) and
    /// "rich" (64), in a workload of whole-GPU pods of 8 cores and, as
    /// often, CPU-only pods of `cpu_only_milli` (none when 0).
    fn poor_or_rich(
        poor_cores: u64,
        cpu_milli: u64,
        params: FgdPackParams,
        cpu_only_milli: u64,
    ) -> String {
        let poor = NodeCapacity {
            cpu_milli: poor_cores * 1000,
            memory_mib: 1 << 20,
        };
        let rich = NodeCapacity {
            cpu_milli: 64_000,
            ..poor
        };
        let c = Cluster::new(vec![
            mk_node("poor", 4, 10, 1000).with_capacity(poor),
            mk_node("rich", 4, 10, 1000).with_capacity(rich),
        ]);
        let mut dist = ShapeDistribution::default();
        dist.observe(Shape {
            cpu_milli: 8000,
            memory_mib: 0,
            gpus: 1,
            milli: 1000,
            types: vec![],
        });
        if cpu_only_milli > 0 {
            dist.observe(Shape {
                cpu_milli: cpu_only_milli,
                memory_mib: 0,
                gpus: 0,
                milli: 0,
                types: vec![],
            });
        }
        let cfg = SchedulerConfig {
            node_policy: Policy::FgdPack,
            fgdpack: params,
            ..SchedulerConfig::default()
        };
        let mut index = FgdIndex::new(&dist, &c);
        let mut rng = SplitMix64::new(1);
        let req = pod(1, 100, cpu_milli);
        let d = schedule(&c, &req, 0..2, &cfg, Some(&mut index), &mut rng).unwrap();
        c.node(d.node).unwrap().name.clone()
    }

    /// A CPU-heavy GPU pod ties under FGD on two empty nodes (its growth is
    /// nil on both), and the packing key alone would take the node with
    /// less CPU; counting stranded capacity takes the one whose GPUs its
    /// CPU leaves fed. 24 cores: on "poor" (32) it leaves 8 cores for 3
    /// idle GPUs.
    #[test]
    fn a_cpu_heavy_pod_goes_where_it_strands_no_gpu() {
        let without = FgdPackParams {
            strand: 0.0,
            strand_left: 0.0,
            ..FgdPackParams::default()
        };
        assert_eq!(poor_or_rich(32, 24_000, without, 0), "poor");
        assert_eq!(
            poor_or_rich(32, 24_000, FgdPackParams::default(), 0),
            "rich"
        );
    }

    /// A whole-GPU pod of 8 cores: FGD's growth and the growth of stranded
    /// capacity are nil on both nodes, and the packing key takes the node
    /// with less CPU. The node that stays stranded ("poor", 16 cores for 4
    /// GPUs: 2 GPUs unfed, before and after) loses once what is left
    /// stranded counts.
    #[test]
    fn the_node_left_less_stranded_wins_when_the_growths_tie() {
        let without = FgdPackParams {
            strand_left: 0.0,
            ..FgdPackParams::default()
        };
        assert_eq!(poor_or_rich(16, 8000, without, 0), "poor");
        assert_eq!(poor_or_rich(16, 8000, FgdPackParams::default(), 0), "rich");
    }

    /// Where the whole workload asks more CPU than the nodes have for their
    /// GPUs, some GPUs end stranded whatever the placement, and what a node
    /// is left stranded with no longer counts: the one-GPU pod of the test
    /// above packs onto "poor" again. Half the workload is CPU-only pods of
    /// 4 cores: 12 cores per GPU pod, 96 for the 8 GPUs, against 80 cores.
    /// At 1 core (72 cores) the nodes suffice and "rich" still wins.
    #[test]
    fn where_cpu_binds_the_cluster_the_stranded_capacity_left_does_not_count() {
        let params = FgdPackParams::default();
        assert_eq!(poor_or_rich(16, 8000, params, 4000), "poor");
        assert_eq!(poor_or_rich(16, 8000, params, 1000), "rich");
    }

    /// Of three 8-GPU nodes only "big" (128 cores) can host the workload's
    /// rare 8-GPU pod of 120 cores. "big" has a ninth GPU, in use, so the
    /// packing key (fullness first) takes it for a one-GPU pod. FGD's growth
    /// is nil everywhere: its typical pods cover 95 % of the workload, which
    /// leaves the rare shape out (on openb it is in, but weighs 5 in 8,152,
    /// a few milli-GPU of growth, within one score step). Keeping the rare
    /// shape's host sends the pod to another node, and the rare pod still
    /// fits after it.
    #[test]
    fn a_pod_keeps_off_the_only_host_of_a_rare_multi_gpu_shape() {
        let std_cap = NodeCapacity {
            cpu_milli: 96_000,
            memory_mib: 1 << 20,
        };
        let big_cap = NodeCapacity {
            cpu_milli: 128_000,
            ..std_cap
        };
        let mut c = Cluster::new(vec![
            mk_node("big", 9, 10, 1000).with_capacity(big_cap),
            mk_node("std", 8, 10, 1000).with_capacity(std_cap),
            mk_node("std2", 8, 10, 1000).with_capacity(std_cap),
        ]);
        let nothing = HostResources {
            cpu_milli: 0,
            memory_mib: 0,
        };
        let mut rng = SplitMix64::new(0);
        let first = schedule(
            &c,
            &pod(1, 100, 0),
            0..1,
            &SchedulerConfig::default(),
            None,
            &mut rng,
        )
        .unwrap();
        let devices = first.pod_devices(c.node(0).unwrap());
        c.reserve("first", 0, &devices, 0, nothing).unwrap();

        let mut dist = ShapeDistribution::default();
        for (gpus, cpu, n) in [(1, 4000, 200), (8, 120_000, 1)] {
            for _ in 0..n {
                dist.observe(Shape {
                    cpu_milli: cpu,
                    memory_mib: 0,
                    gpus,
                    milli: 1000,
                    types: vec![],
                });
            }
        }
        let typical = FgdParams {
            coverage: 0.95,
            ..FgdParams::default()
        };
        let index = |c: &Cluster| FgdIndex::with_params(&dist, c, typical);
        assert_eq!(index(&c).guarded_shapes().len(), 1);
        let decide = |c: &Cluster, req: &PodRequest, fgdpack: FgdPackParams| {
            let cfg = SchedulerConfig {
                node_policy: Policy::FgdPack,
                fgdpack,
                ..SchedulerConfig::default()
            };
            let mut index = index(c);
            let mut rng = SplitMix64::new(1);
            let d = schedule(c, req, 0..3, &cfg, Some(&mut index), &mut rng).unwrap();
            (c.node(d.node).unwrap().name.clone(), d)
        };
        let small = pod(1, 100, 4000);
        let without = FgdPackParams {
            keep_hosts: 0.0,
            ..FgdPackParams::default()
        };
        assert_eq!(decide(&c, &small, without).0, "big");
        let (name, d) = decide(&c, &small, FgdPackParams::default());
        assert_ne!(name, "big");
        let devices = d.pod_devices(c.node(d.node).unwrap());
        let host = HostResources {
            cpu_milli: small.cpu_milli,
            memory_mib: 0,
        };
        c.reserve("small", d.node, &devices, 0, host).unwrap();
        let rare = pod(8, 100, 120_000);
        assert_eq!(decide(&c, &rare, FgdPackParams::default()).0, "big");
    }

    #[test]
    fn a_wider_score_step_ties_more_growths() {
        let fgd = FgdPackParams::fgd();
        let wide = FgdPackParams {
            temperature: 2000.0,
            ..fgd
        };
        assert_eq!(
            FgdPackParams::default().score_of_growth(45.0),
            fgd.score_of_growth(45.0)
        );
        // 30 and 60 milli-GPU of growth: one step apart under fgd, tied
        // with twice the temperature.
        assert!(fgd.score_of_growth(30.0) > fgd.score_of_growth(60.0));
        assert_eq!(wide.score_of_growth(30.0), wide.score_of_growth(60.0));
        assert_eq!(fgd.score_of_growth(0.0), 50.0);
    }
}

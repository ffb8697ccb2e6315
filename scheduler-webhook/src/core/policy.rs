//! Placement policies and the decision they make: which node, which GPUs.
//!
//! - `binpack` / `spread`: HAMi's node score (usage before the pod; the
//!   highest wins for binpack, the lowest for spread) and HAMi's GPU order
//!   inside the node, by the GPU policy (`gpu-scheduler-policy`: `binpack`,
//!   `spread`, `numa`, and the filters `mutex` and `topology-aware`, alone
//!   or chained) and the pod's GPU score weights;
//! - `fgd`: the node and GPU whose placement increases fragmentation the
//!   least ([`crate::core::fgd`]);
//! - `bestfit`: the node whose leftover after placement is smallest,
//!   `0.5 × free CPU-milli ÷ 128,000 + 0.5 × free GPU-milli ÷ 8,000`, and
//!   inside it the GPU with the least free share that fits;
//! - `random`: a uniformly random feasible node and GPU.
//!
//! Ties between nodes break with the caller's seeded generator, so a run is
//! reproducible.

use std::borrow::Cow;

use proto::hami::pod_devices::{ContainerDevice, PodDevices};

use crate::core::fgd::{FgdIndex, FgdTies};
use crate::core::fgdpack::{FgdPackParams, schedule_fgdpack};
pub use crate::core::kinds::{GpuPolicy, GpuPolicyName, Policy, PolicyError};

use crate::core::fit::{FitFailure, PodPicks, check_pod, fit_pod, order_independent};
use crate::core::model::{Cluster, Node, NodeId};
use crate::core::request::PodRequest;
use crate::core::rng::{SplitMix64, TieBreak};
use crate::core::score::{ScoringWeights, gpu_order_into, node_score};

/// Cluster-wide policy choice (a pod's annotations override it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Node policy (HAMi default `binpack`).
    pub node_policy: Policy,
    /// GPU policy (HAMi default `spread`).
    pub gpu_policy: GpuPolicy,
    /// GPU score weights of a pod without `hami.io/device-scoring-weights`
    /// (HAMi: 1 each).
    pub weights: ScoringWeights,
    /// The knobs of the `fgdpack` policy.
    pub fgdpack: FgdPackParams,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            node_policy: Policy::Binpack,
            gpu_policy: GpuPolicy::SPREAD,
            weights: ScoringWeights::default(),
            fgdpack: FgdPackParams::default(),
        }
    }
}

/// The chosen node and GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The node.
    pub node: NodeId,
    /// GPUs per container.
    pub picks: PodPicks,
    /// The policy's key for this node (higher is better).
    pub score: f64,
    /// Nodes that did not fit, with why.
    pub failed: Vec<(NodeId, FitFailure)>,
}

impl Decision {
    /// The device annotation value for the pod (init containers first).
    #[must_use]
    pub fn pod_devices(&self, node: &Node) -> PodDevices {
        let container = |picks: &Vec<crate::core::fit::Pick>| -> Vec<ContainerDevice> {
            picks
                .iter()
                .filter_map(|p| {
                    node.gpus.get(p.gpu).map(|g| ContainerDevice {
                        uuid: g.uuid.clone(),
                        vendor: "NVIDIA".to_owned(),
                        usedmem: i32::try_from(p.usedmem).unwrap_or(i32::MAX),
                        usedcores: i32::try_from(p.usedcores).unwrap_or(i32::MAX),
                    })
                })
                .collect()
        };
        PodDevices(
            self.picks
                .init
                .iter()
                .chain(&self.picks.app)
                .map(container)
                .collect(),
        )
    }

    /// Number of init containers in [`Self::pod_devices`].
    #[must_use]
    pub fn init_count(&self) -> usize {
        self.picks.init.len()
    }
}

/// Why no placement was made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// No candidate node fits.
    #[error("0/{} nodes are available", failed.len())]
    NoNodeFits {
        /// Every candidate, with why it did not fit.
        failed: Vec<(NodeId, FitFailure)>,
    },
    /// The FGD or fgdpack policy was asked for without a fragmentation index.
    #[error("fgd and fgdpack policies need a fragmentation index")]
    MissingFgdIndex,
}

/// Free share of a GPU in milli, for best fit.
fn free_milli(node: &Node, pos: usize) -> u64 {
    let (Some(g), Some(u)) = (node.gpus.get(pos), node.usage.get(pos)) else {
        return 0;
    };
    if u.used >= g.count || g.devcore == 0 || g.devmem == 0 {
        return 0;
    }
    let cores = u64::from(g.devcore.saturating_sub(u.usedcores)) * 1000 / u64::from(g.devcore);
    let mem = g.devmem.saturating_sub(u.usedmem) * 1000 / g.devmem;
    cores.min(mem)
}

fn bestfit_key(node: &Node, picks: &PodPicks, req: &PodRequest) -> f64 {
    let free_gpu: u64 = (0..node.gpus.len()).map(|p| free_milli(node, p)).sum();
    let taken: u64 = picks
        .app
        .iter()
        .flatten()
        .filter_map(|p| {
            let g = node.gpus.get(p.gpu)?;
            (g.devcore > 0).then(|| u64::from(p.usedcores) * 1000 / u64::from(g.devcore))
        })
        .sum();
    let free_cpu = node
        .free_cpu_memory()
        .map_or(0, |(c, _)| c.saturating_sub(req.cpu_milli));
    #[allow(clippy::cast_precision_loss)]
    let leftover =
        0.5 * free_cpu as f64 / 128_000.0 + 0.5 * free_gpu.saturating_sub(taken) as f64 / 8_000.0;
    -leftover
}

/// Compares two (key, secondary key) pairs, equal within 1e-9.
fn compare_keys(a: (f64, f64), b: (f64, f64)) -> std::cmp::Ordering {
    let cmp = |x: f64, y: f64| {
        if x > y + 1e-9 {
            std::cmp::Ordering::Greater
        } else if x < y - 1e-9 {
            std::cmp::Ordering::Less
        } else {
            std::cmp::Ordering::Equal
        }
    };
    cmp(a.0, b.0).then_with(|| cmp(a.1, b.1))
}

/// HAMi's node key: the node score before the pod, highest wins under
/// binpack, lowest under spread.
fn hami_key(policy: Policy, node: &Node) -> f64 {
    let s = node_score(node);
    if policy == Policy::Binpack { s } else { -s }
}

/// Candidate lists at least this long are scanned on two threads.
const PARALLEL_SCAN_MIN: usize = 2048;

/// The best candidate seen so far by (key, secondary key), the higher
/// winning ([`compare_keys`]); equal keys break by `rng` (reservoir
/// sampling), so every tied candidate is equally likely and a seed gives
/// one answer. The one tie-break scan of both [`schedule`] and [`Scan`].
#[derive(Debug)]
struct Best<T> {
    top: Option<((f64, f64), T)>,
    ties: TieBreak,
}

impl<T> Default for Best<T> {
    fn default() -> Self {
        Self {
            top: None,
            ties: TieBreak::default(),
        }
    }
}

impl<T> Best<T> {
    /// Offers a candidate: it becomes the best when its key is higher, or
    /// equal and the tie break picks it.
    fn offer(&mut self, key: (f64, f64), item: T, rng: &mut SplitMix64) {
        let replace = match &self.top {
            Some((best, _)) => match compare_keys(key, *best) {
                std::cmp::Ordering::Greater => {
                    self.ties.reset();
                    self.ties.offer(rng)
                }
                std::cmp::Ordering::Equal => self.ties.offer(rng),
                std::cmp::Ordering::Less => false,
            },
            None => {
                self.ties.reset();
                self.ties.offer(rng)
            }
        };
        if replace {
            self.top = Some((key, item));
        }
    }

    /// The best of this scan followed by `second`: the higher key, and
    /// between equal keys a pick weighted by how many candidates each side
    /// tied, so every tied candidate stays equally likely.
    fn merge(mut self, second: Self, rng: &mut SplitMix64) -> Self {
        match (&self.top, &second.top) {
            (_, None) => {}
            (None, Some(_)) => self = second,
            (Some((a, _)), Some((b, _))) => match compare_keys(*b, *a) {
                std::cmp::Ordering::Greater => self = second,
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    let (mine, theirs) = (self.ties.count(), second.ties.count());
                    let total = usize::try_from(mine + theirs).unwrap_or(usize::MAX);
                    if u64::try_from(rng.below(total)).unwrap_or(u64::MAX) >= mine {
                        self.top = second.top;
                    }
                    self.ties.absorb(second.ties);
                }
            },
        }
        self
    }
}

/// The best node of a scan under binpack/spread (HAMi's node key, no
/// secondary key) and the refused nodes in scan order.
#[derive(Debug, Default)]
struct Scan {
    best: Best<NodeId>,
    failed: Vec<(NodeId, FitFailure)>,
}

impl Scan {
    /// Checks every node of `ids` ([`check_pod`]) and keeps the best key.
    fn of(
        cluster: &Cluster,
        req: &PodRequest,
        policy: Policy,
        ids: &[NodeId],
        rng: &mut SplitMix64,
    ) -> Self {
        let mut scan = Self::default();
        for &id in ids {
            let Some(node) = cluster.node(id) else {
                continue;
            };
            match check_pod(node, req) {
                Err(why) => scan.failed.push((id, why)),
                Ok(()) => scan.best.offer((hami_key(policy, node), 0.0), id, rng),
            }
        }
        scan
    }

    /// The scan of `first` followed by `second`: failures in order, the best
    /// by [`Best::merge`].
    fn then(mut self, second: Self, rng: &mut SplitMix64) -> Self {
        self.failed.extend(second.failed);
        self.best = self.best.merge(second.best, rng);
        self
    }
}

/// Binpack/spread for a pod whose fit verdict does not depend on the GPU
/// order ([`order_independent`]): HAMi's node key does not depend on the
/// picks either, so every node is only checked, and the GPUs are ordered and
/// picked on the winner alone. A long candidate list is split in two halves
/// scanned on two threads (each with its own generator seeded from `rng`, so
/// a run stays reproducible).
fn by_verdict(
    cluster: &Cluster,
    req: &PodRequest,
    ids: &[NodeId],
    cfg: &SchedulerConfig,
    rng: &mut SplitMix64,
    parallel_min: usize,
) -> Result<Decision, ScheduleError> {
    let policy = req.node_policy.unwrap_or(cfg.node_policy);
    let (gpu_policy, weights) = gpu_choice(req, cfg);
    let scan = if ids.len() >= parallel_min.max(2) {
        let (first, second) = ids.split_at(ids.len() / 2);
        let (mut rng_first, mut rng_second) = (
            SplitMix64::new(rng.next_u64()),
            SplitMix64::new(rng.next_u64()),
        );
        let (a, b) = std::thread::scope(|s| {
            let other = std::thread::Builder::new()
                .spawn_scoped(s, || Scan::of(cluster, req, policy, first, &mut rng_first));
            let b = Scan::of(cluster, req, policy, second, &mut rng_second);
            // No thread to be had: scan the first half here too.
            let a = other.ok().and_then(|h| h.join().ok());
            (a, b)
        });
        let a = a.unwrap_or_else(|| Scan::of(cluster, req, policy, first, &mut rng_first));
        a.then(b, rng)
    } else {
        Scan::of(cluster, req, policy, ids, rng)
    };
    let mut failed = scan.failed;
    let Some(((score, _), id)) = scan.best.top else {
        return Err(ScheduleError::NoNodeFits { failed });
    };
    let Some(node) = cluster.node(id) else {
        return Err(ScheduleError::NoNodeFits { failed });
    };
    let (mut order, mut scores) = (Vec::new(), Vec::new());
    gpu_order_into(node, req, gpu_policy, &weights, &mut order, &mut scores);
    match fit_pod(node, req, &order) {
        Ok(picks) => Ok(Decision {
            node: id,
            picks,
            score,
            failed,
        }),
        // Unreachable: `check_pod` passed, and it equals fit on any order.
        Err(why) => {
            failed.push((id, why));
            Err(ScheduleError::NoNodeFits { failed })
        }
    }
}

/// The pod's GPU policy and score weights: its annotations, else the
/// cluster's.
fn gpu_choice(req: &PodRequest, cfg: &SchedulerConfig) -> (GpuPolicy, ScoringWeights) {
    (
        req.gpu_policy.unwrap_or(cfg.gpu_policy),
        req.weights.unwrap_or(cfg.weights),
    )
}

/// The request with the GPU policy's filters (`mutex`, `topology-aware`) in
/// its constraints, so every fit of every node policy applies them;
/// borrowed as it is when they are already right (the common case).
fn with_filters<'a>(req: &'a PodRequest, gpu_policy: GpuPolicy) -> Cow<'a, PodRequest> {
    let (mutex, topology) = (gpu_policy.mutex(), gpu_policy.topology_aware());
    if req.constraints.mutex == mutex && req.constraints.topology == topology {
        return Cow::Borrowed(req);
    }
    let mut owned = req.clone();
    owned.constraints.mutex = mutex;
    owned.constraints.topology = topology;
    Cow::Owned(owned)
}

/// Chooses a node and GPUs for the pod among `candidates`.
///
/// FGD takes the index mutably: it remembers each node's outcome for the
/// last few requests and evaluates again only the nodes whose
/// [`Cluster::generation`] changed since (see [`FgdIndex::refresh_node`]).
/// The decision is the same as evaluating every node afresh.
///
/// # Errors
/// No candidate fits, or FGD without an index.
pub fn schedule(
    cluster: &Cluster,
    req: &PodRequest,
    candidates: impl IntoIterator<Item = NodeId>,
    cfg: &SchedulerConfig,
    fgd: Option<&mut FgdIndex>,
    rng: &mut SplitMix64,
) -> Result<Decision, ScheduleError> {
    let policy = req.node_policy.unwrap_or(cfg.node_policy);
    let (gpu_policy, weights) = gpu_choice(req, cfg);
    let req = &*with_filters(req, gpu_policy);
    if policy == Policy::Fgd {
        let Some(index) = fgd else {
            return Err(ScheduleError::MissingFgdIndex);
        };
        return schedule_fgd(cluster, req, candidates, weights, index, rng);
    }
    if policy == Policy::FgdPack {
        let Some(index) = fgd else {
            return Err(ScheduleError::MissingFgdIndex);
        };
        let params = &cfg.fgdpack;
        return match schedule_fgdpack(cluster, req, candidates, weights, index, params, rng) {
            (Some(c), failed) => Ok(Decision {
                node: c.node,
                picks: c.picks,
                score: c.score,
                failed,
            }),
            (None, failed) => Err(ScheduleError::NoNodeFits { failed }),
        };
    }
    if matches!(policy, Policy::Binpack | Policy::Spread) && order_independent(req) {
        let ids: Vec<NodeId> = candidates.into_iter().collect();
        return by_verdict(cluster, req, &ids, cfg, rng, PARALLEL_SCAN_MIN);
    }
    let mut failed = Vec::new();
    let mut best: Best<(NodeId, PodPicks)> = Best::default();
    let (mut order, mut scores) = (Vec::new(), Vec::new());
    for id in candidates {
        let Some(node) = cluster.node(id) else {
            continue;
        };
        // (key, secondary key): higher wins; equal keys break by seed.
        let placed = match policy {
            Policy::Binpack | Policy::Spread => {
                gpu_order_into(node, req, gpu_policy, &weights, &mut order, &mut scores);
                fit_pod(node, req, &order).map(|p| ((hami_key(policy, node), 0.0), p))
            }
            Policy::BestFit => {
                let mut order: Vec<usize> = (0..node.gpus.len()).collect();
                order.sort_by_key(|&p| std::cmp::Reverse(free_milli(node, p)));
                fit_pod(node, req, &order).map(|p| ((bestfit_key(node, &p, req), 0.0), p))
            }
            Policy::Random => {
                let mut order: Vec<usize> = (0..node.gpus.len()).collect();
                rng.shuffle(&mut order);
                fit_pod(node, req, &order).map(|p| ((0.0, 0.0), p))
            }
            // Answered by `schedule_fgd` and `schedule_fgdpack` above.
            Policy::Fgd | Policy::FgdPack => continue,
        };
        match placed {
            Err(f) => failed.push((id, f)),
            Ok((key, picks)) => best.offer(key, (id, picks), rng),
        }
    }
    match best.top {
        Some(((score, _), (node, picks))) => Ok(Decision {
            node,
            picks,
            score,
            failed,
        }),
        None => Err(ScheduleError::NoNodeFits { failed }),
    }
}

/// FGD over the candidates ([`FgdIndex::scan`]): each node's outcome comes
/// from the index's memo when the node has not changed since it was
/// computed for this request, else it is evaluated and remembered.
fn schedule_fgd(
    cluster: &Cluster,
    req: &PodRequest,
    candidates: impl IntoIterator<Item = NodeId>,
    weights: ScoringWeights,
    index: &mut FgdIndex,
    rng: &mut SplitMix64,
) -> Result<Decision, ScheduleError> {
    let key = |view: &FgdIndex, id, node: &Node, growth, _: &_| {
        (
            view.score_of_growth(growth),
            fgd_secondary(view, id, node, req),
        )
    };
    match index.scan(cluster, req, req, candidates, weights, key, rng) {
        (Some((score, node, picks)), failed) => Ok(Decision {
            node,
            picks,
            score,
            failed,
        }),
        (None, failed) => Err(ScheduleError::NoNodeFits { failed }),
    }
}

/// FGD's tie break between equal node scores ([`FgdTies`]). Fullness: a
/// GPU pod goes to the fuller node (HAMi binpack score), keeping empty
/// nodes whole; a CPU-only pod goes where CPU is least needed by idle GPUs.
/// Node order: the node's place in the seeded order. Coin: none, so the
/// seeded coin decides.
fn fgd_secondary(index: &FgdIndex, id: NodeId, node: &Node, req: &PodRequest) -> f64 {
    match index.params().ties {
        FgdTies::Coin => 0.0,
        FgdTies::NodeOrder(seed) => FgdTies::node_order_key(seed, id),
        FgdTies::Fullness if req.wants_gpu() => {
            let weight = index.params().scarce_models;
            if weight > 0.0 && req.constraints.use_types.is_empty() {
                node_score(node) - weight * index.model_pressure(node)
            } else {
                node_score(node)
            }
        }
        FgdTies::Fullness => {
            let free_cpu = node
                .free_cpu_memory()
                .map_or(0, |(c, _)| c.saturating_sub(req.cpu_milli));
            #[allow(clippy::cast_precision_loss)]
            let per_idle = free_cpu as f64 / (crate::core::fgd::node_idle_milli(node) as f64 + 1.0);
            per_idle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fgd::{FgdParams, Shape, ShapeDistribution};
    use crate::core::model::testutil::mk_node;
    use crate::core::model::{GpuUse, NodeCapacity};
    use crate::core::request::{DeviceRequest, MemoryRequest};
    use crate::core::reservation::HostResources;

    fn pod(nums: u32, mem: u64, cores: u32) -> PodRequest {
        PodRequest {
            app: vec![Some(DeviceRequest {
                nums,
                memory: MemoryRequest::Mib(mem),
                cores,
            })],
            ..PodRequest::default()
        }
    }

    /// Node a: GPU0 half used, GPU1 free; node b: both free; node c: GPU0 a
    /// quarter used.
    fn cluster() -> Cluster {
        let mut c = Cluster::new(vec![
            mk_node("a", 2, 10, 1000),
            mk_node("b", 2, 10, 1000),
            mk_node("c", 2, 10, 1000),
        ]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 500,
            usedcores: 50,
        };
        c.node_mut(2).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 250,
            usedcores: 25,
        };
        c
    }

    fn run(c: &Cluster, cfg: SchedulerConfig, req: &PodRequest) -> Decision {
        schedule(
            c,
            req,
            0..c.nodes().len(),
            &cfg,
            None,
            &mut SplitMix64::new(1),
        )
        .unwrap()
    }

    #[test]
    fn hami_policies_on_hand_checked_cases() {
        let c = cluster();
        let req = pod(1, 100, 10);
        let cases = [
            // node policy, gpu policy, node, gpu
            (Policy::Binpack, GpuPolicy::BINPACK, 0, 0),
            (Policy::Binpack, GpuPolicy::SPREAD, 0, 1),
            // b's GPUs tie: the walk from the end takes the last one.
            (Policy::Spread, GpuPolicy::SPREAD, 1, 1),
            (Policy::Spread, GpuPolicy::BINPACK, 1, 1),
        ];
        for (np, gp, node, gpu) in cases {
            let cfg = SchedulerConfig {
                node_policy: np,
                gpu_policy: gp,
                ..SchedulerConfig::default()
            };
            let d = run(&c, cfg, &req);
            assert_eq!((d.node, d.picks.app[0][0].gpu), (node, gpu), "{np}/{gp}");
        }
        // node score of a: 10*(1/20 + 50/200 + 500/2000)
        let d = run(&c, SchedulerConfig::default(), &req);
        assert!((d.score - 5.5).abs() < 1e-9, "{}", d.score);
    }

    #[test]
    fn pod_annotations_override_cluster_policy() {
        let c = cluster();
        let mut req = pod(1, 100, 10);
        req.node_policy = Some(Policy::Spread);
        assert_eq!(run(&c, SchedulerConfig::default(), &req).node, 1);
    }

    /// HAMi's composable-policy post (v2.10, "A Worked Example: One Pod,
    /// Four Cards"): four T4s, GPU 0 with two tenants, GPU 1 with one,
    /// GPUs 2 and 3 idle; a `mutex,binpack` pod asking 1000 MiB. `mutex`
    /// removes GPUs 0 and 1 although plain `binpack` takes GPU 0; the idle
    /// two tie under `binpack` and the index decides. The post says GPU 2;
    /// HAMi's code sorts the lower index first and its `Fit` walks from the
    /// end, which gives GPU 3, and we follow the code (see docs/protocol.md).
    #[test]
    fn mutex_binpack_takes_an_idle_gpu_as_hamis_worked_example() {
        let mut c = Cluster::new(vec![mk_node("a", 4, 10, 15_360)]);
        let node = c.node_mut(0).unwrap();
        node.usage[0] = GpuUse {
            used: 2,
            usedmem: 2000,
            usedcores: 0,
        };
        node.usage[1] = GpuUse {
            used: 1,
            usedmem: 1000,
            usedcores: 0,
        };
        let mut req = pod(1, 1000, 0);
        req.gpu_policy = Some(GpuPolicy::BINPACK);
        assert_eq!(
            run(&c, SchedulerConfig::default(), &req).picks.app[0][0].gpu,
            0
        );
        req.gpu_policy = Some("mutex,binpack".parse().unwrap());
        assert_eq!(
            run(&c, SchedulerConfig::default(), &req).picks.app[0][0].gpu,
            3
        );
    }

    /// The cluster's `gpuSchedulerPolicy` applies the same filters as the
    /// annotation, and a pod's annotation replaces it.
    #[test]
    fn a_mutex_cluster_default_refuses_shared_gpus_and_a_pod_can_opt_out() {
        let c = Cluster::new(vec![mk_node("a", 1, 10, 1000)]);
        let mut c = c;
        c.node_mut(0).unwrap().usage[0].used = 1;
        let cfg = SchedulerConfig {
            gpu_policy: GpuPolicy::parse_exact("mutex").unwrap(),
            ..SchedulerConfig::default()
        };
        let err = schedule(
            &c,
            &pod(1, 10, 0),
            0..1,
            &cfg,
            None,
            &mut SplitMix64::new(1),
        )
        .unwrap_err();
        let ScheduleError::NoNodeFits { failed } = err else {
            panic!("{err}")
        };
        assert_eq!(
            failed[0].1.to_string(),
            "1/1 ExclusiveDeviceAllocateConflict"
        );
        let mut req = pod(1, 10, 0);
        req.gpu_policy = Some(GpuPolicy::SPREAD);
        assert!(schedule(&c, &req, 0..1, &cfg, None, &mut SplitMix64::new(1)).is_ok());
    }

    /// `hami.io/device-scoring-weights` (HAMi docs/develop/scheduler-policy.md):
    /// the pod's weights replace the cluster's for its GPU order.
    #[test]
    fn a_pods_scoring_weights_replace_the_default() {
        let mut c = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        let node = c.node_mut(0).unwrap();
        node.usage[0].usedcores = 60;
        node.usage[1].usedmem = 400;
        let mut req = pod(1, 100, 10);
        assert_eq!(
            run(&c, SchedulerConfig::default(), &req).picks.app[0][0].gpu,
            1
        );
        req.weights = Some("slot=1,core=1,memory=3".parse().unwrap());
        assert_eq!(
            run(&c, SchedulerConfig::default(), &req).picks.app[0][0].gpu,
            0
        );
    }

    #[test]
    fn failing_nodes_are_reported_and_none_fitting_is_an_error() {
        let c = cluster();
        // Only a's free GPU1 is left on a, and a is still the fullest node.
        let d = run(&c, SchedulerConfig::default(), &pod(1, 600, 60));
        assert_eq!((d.node, d.picks.app[0][0].gpu), (0, 1));
        let d = run(&c, SchedulerConfig::default(), &pod(2, 800, 60));
        assert_eq!(d.node, 1, "only b has two GPUs with 800 MiB free");
        assert_eq!(d.failed.len(), 2);
        let err = schedule(
            &c,
            &pod(3, 1, 1),
            0..3,
            &SchedulerConfig::default(),
            None,
            &mut SplitMix64::new(1),
        )
        .unwrap_err();
        let ScheduleError::NoNodeFits { failed } = err else {
            panic!("{err}")
        };
        assert_eq!(failed.len(), 3);
        assert_eq!(failed[0].1.to_string(), "1/2 NodeInsufficientDevice");
    }

    #[test]
    fn bestfit_takes_the_tightest_gpu() {
        let c = cluster();
        let cfg = SchedulerConfig {
            node_policy: Policy::BestFit,
            ..SchedulerConfig::default()
        };
        let d = run(&c, cfg, &pod(1, 100, 40));
        assert_eq!((d.node, d.picks.app[0][0].gpu), (0, 0));
        // 60 cores: a keeps 1500-600 = 900 milli free on GPU1, c keeps
        // 1750-600 on GPU0, b 2000-600: a is the tightest node.
        let d = run(&c, cfg, &pod(1, 100, 60));
        assert_eq!((d.node, d.picks.app[0][0].gpu), (0, 1));
        // 80 cores fit only a free GPU: a (GPU1) still leaves the least.
        let d = run(&c, cfg, &pod(1, 100, 80));
        assert_eq!((d.node, d.picks.app[0][0].gpu), (0, 1));
    }

    #[test]
    fn ties_break_by_seed_reproducibly_and_cover_all_nodes() {
        let c = Cluster::new(
            (0..4)
                .map(|i| mk_node(&format!("n{i}"), 1, 10, 1000))
                .collect(),
        );
        let cfg = SchedulerConfig {
            node_policy: Policy::Random,
            ..SchedulerConfig::default()
        };
        let mut seen = [0u32; 4];
        let mut r1 = SplitMix64::new(9);
        let mut r2 = SplitMix64::new(9);
        for _ in 0..200 {
            let a = schedule(&c, &pod(1, 1, 1), 0..4, &cfg, None, &mut r1)
                .unwrap()
                .node;
            let b = schedule(&c, &pod(1, 1, 1), 0..4, &cfg, None, &mut r2)
                .unwrap()
                .node;
            assert_eq!(a, b);
            seen[a] += 1;
        }
        assert!(seen.iter().all(|s| *s > 20), "{seen:?}");
    }

    #[test]
    fn fgd_needs_an_index_and_prefers_least_fragmenting_node() {
        let c = cluster();
        let cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let err =
            schedule(&c, &pod(1, 1, 1), 0..3, &cfg, None, &mut SplitMix64::new(1)).unwrap_err();
        assert_eq!(err, ScheduleError::MissingFgdIndex);
        // Workload of 500-milli pods: a 500 pod exactly fills a's GPU0.
        let mut dist = ShapeDistribution::default();
        dist.observe(Shape {
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 1,
            milli: 500,
            types: vec![],
        });
        let mut idx = FgdIndex::new(&dist, &c);
        let d = schedule(
            &c,
            &pod(1, 500, 50),
            0..3,
            &cfg,
            Some(&mut idx),
            &mut SplitMix64::new(1),
        )
        .unwrap();
        assert_eq!((d.node, d.picks.app[0][0].gpu), (0, 0));
    }

    #[test]
    fn fgd_breaks_equal_growth_by_fullness_or_spare_cpu() {
        // a: 2 GPUs, one fully used; b: 2 empty GPUs. Whole-card workload.
        let cap = NodeCapacity {
            cpu_milli: 10_000,
            memory_mib: 1 << 20,
        };
        let mut c = Cluster::new(vec![
            mk_node("a", 2, 10, 1000).with_capacity(cap),
            mk_node("b", 2, 10, 1000).with_capacity(cap),
        ]);
        c.node_mut(0).unwrap().usage[0] = GpuUse {
            used: 1,
            usedmem: 1000,
            usedcores: 100,
        };
        let mut dist = ShapeDistribution::default();
        dist.observe(Shape {
            cpu_milli: 1000,
            memory_mib: 0,
            gpus: 1,
            milli: 1000,
            types: vec![],
        });
        let mut idx = FgdIndex::new(&dist, &c);
        let cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let cpu_only = PodRequest {
            app: vec![None],
            cpu_milli: 2000,
            ..PodRequest::default()
        };
        for seed in 0..20 {
            let mut rng = SplitMix64::new(seed);
            // Both placements leave fragmentation unchanged (growth 0).
            let d = schedule(&c, &pod(1, 1000, 100), 0..2, &cfg, Some(&mut idx), &mut rng).unwrap();
            assert_eq!(d.node, 0, "GPU pod: the fuller node");
            // CPU-only: a has 1 idle GPU for its CPU, b has 2.
            let d = schedule(&c, &cpu_only, 0..2, &cfg, Some(&mut idx), &mut rng).unwrap();
            assert_eq!(d.node, 0, "CPU-only pod: most CPU per idle GPU");
        }
    }

    #[test]
    fn fgd_scarce_models_keeps_free_pods_off_the_model_pinned_pods_need() {
        use crate::core::model::testutil::mk_device;
        let model_node = |name: &str, ty: &str| {
            let devs: Vec<_> = (0..2).map(|i| mk_device(name, i, ty, 10, 1000)).collect();
            Node::from_register(name, &devs)
        };
        let c = Cluster::new(vec![
            model_node("t4", "NVIDIA-Tesla T4"),
            model_node("a100", "NVIDIA-A100"),
        ]);
        // A few pods pinned to T4: the a100 node's growth differs from the
        // t4 node's by less than the integer score sees, so the scores tie.
        let mut dist = ShapeDistribution::default();
        let whole = |types: Vec<String>| Shape {
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 1,
            milli: 1000,
            types,
        };
        for _ in 0..99 {
            dist.observe(whole(vec![]));
        }
        dist.observe(whole(vec!["t4".into()]));
        let cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let chosen = |scarce_models: f64| -> Vec<NodeId> {
            let params = FgdParams {
                scarce_models,
                ..FgdParams::default()
            };
            let mut idx = FgdIndex::with_params(&dist, &c, params);
            let t4_pressure = if scarce_models > 0.0 { 1.0 } else { 0.0 };
            assert_eq!(idx.model_pressure(c.node(0).unwrap()), t4_pressure);
            assert_eq!(idx.model_pressure(c.node(1).unwrap()), 0.0);
            (0..20)
                .map(|seed| {
                    let mut rng = SplitMix64::new(seed);
                    schedule(&c, &pod(1, 1000, 100), 0..2, &cfg, Some(&mut idx), &mut rng)
                        .unwrap()
                        .node
                })
                .collect()
        };
        assert!(
            chosen(0.0).contains(&0),
            "off: the coin also picks the t4 node"
        );
        assert!(chosen(0.0).contains(&1));
        assert!(
            chosen(1.0).iter().all(|&n| n == 1),
            "on: never the pressed model"
        );
        // A pod pinned to T4 still goes there.
        let mut pinned = pod(1, 1000, 100);
        pinned.constraints.use_types = vec!["t4".into()];
        let params = FgdParams {
            scarce_models: 1.0,
            ..FgdParams::default()
        };
        let mut idx = FgdIndex::with_params(&dist, &c, params);
        let mut rng = SplitMix64::new(1);
        let d = schedule(&c, &pinned, 0..2, &cfg, Some(&mut idx), &mut rng).unwrap();
        assert_eq!(d.node, 0);
    }

    #[test]
    fn fgd_node_order_ties_go_to_one_seeded_node_and_coin_ties_do_not() {
        // Eight empty, equal nodes: every placement of a whole GPU ties.
        let nodes: Vec<Node> = (0..8)
            .map(|i| mk_node(&format!("n{i}"), 2, 10, 1000))
            .collect();
        let c = Cluster::new(nodes);
        let mut dist = ShapeDistribution::default();
        dist.observe(Shape {
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 1,
            milli: 1000,
            types: vec![],
        });
        let cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let winners = |ties: FgdTies| -> Vec<NodeId> {
            let params = FgdParams {
                ties,
                ..FgdParams::default()
            };
            let mut idx = FgdIndex::with_params(&dist, &c, params);
            let mut rng = SplitMix64::new(3);
            (0..40)
                .map(|_| {
                    let d = schedule(&c, &pod(1, 1000, 100), 0..8, &cfg, Some(&mut idx), &mut rng);
                    d.unwrap().node
                })
                .collect()
        };
        let mut firsts = std::collections::BTreeSet::new();
        for seed in 0..16 {
            let w = winners(FgdTies::NodeOrder(seed));
            let first = (0..8)
                .max_by(|&a, &b| {
                    FgdTies::node_order_key(seed, a).total_cmp(&FgdTies::node_order_key(seed, b))
                })
                .unwrap();
            assert!(w.iter().all(|&n| n == first), "seed {seed}: {w:?}");
            firsts.insert(first);
        }
        assert!(firsts.len() > 1, "the order depends on the seed");
        let coin: std::collections::BTreeSet<NodeId> = winners(FgdTies::Coin).into_iter().collect();
        assert!(coin.len() > 1, "a coin spreads ties: {coin:?}");
    }

    #[test]
    fn pod_devices_lists_init_then_app_containers() {
        let c = cluster();
        let mut req = pod(1, 100, 10);
        req.init = vec![None];
        req.app.push(None);
        let d = run(&c, SchedulerConfig::default(), &req);
        let devs = d.pod_devices(c.node(d.node).unwrap());
        assert_eq!(devs.0.len(), 3);
        assert!(devs.0[0].is_empty());
        assert_eq!(devs.0[1][0].uuid, "GPU-a-1");
        assert_eq!(devs.0[1][0].usedmem, 100);
        assert_eq!(d.init_count(), 1);
    }

    /// `n` nodes of 2 GPUs; node `i` has `i % 7` tenths of GPU 0 used (so
    /// keys repeat every 7 nodes), and every 5th node is full.
    fn many_nodes(n: usize) -> Cluster {
        let mut c = Cluster::new(
            (0..n)
                .map(|i| mk_node(&format!("n{i}"), 2, 10, 1000))
                .collect(),
        );
        for i in 0..n {
            let node = c.node_mut(i).unwrap();
            let tenths = u32::try_from(i % 7).unwrap();
            node.usage[0] = GpuUse {
                used: tenths,
                usedmem: u64::from(tenths) * 100,
                usedcores: tenths * 10,
            };
            if i % 5 == 0 {
                for u in &mut node.usage {
                    *u = GpuUse {
                        used: 10,
                        usedmem: 1000,
                        usedcores: 100,
                    };
                }
            }
        }
        c
    }

    #[test]
    fn the_two_thread_scan_refuses_the_same_nodes_and_picks_a_best_node() {
        let c = many_nodes(40);
        let ids: Vec<NodeId> = (0..40).collect();
        let req = pod(1, 100, 10);
        for policy in [Policy::Binpack, Policy::Spread] {
            let cfg = SchedulerConfig {
                node_policy: policy,
                ..SchedulerConfig::default()
            };
            let one =
                by_verdict(&c, &req, &ids, &cfg, &mut SplitMix64::new(3), usize::MAX).unwrap();
            let two = by_verdict(&c, &req, &ids, &cfg, &mut SplitMix64::new(3), 2).unwrap();
            assert_eq!(one.failed, two.failed, "{policy}");
            assert_eq!(two.failed.len(), 8, "every 5th node is full");
            // Same best key; the node may differ only among equal keys.
            assert!((one.score - two.score).abs() < 1e-9, "{policy}");
            // The picks are the ordered fit of the winner, as on one thread.
            let winner = c.node(two.node).unwrap();
            let order = crate::core::score::gpu_order(winner, &req, cfg.gpu_policy, &cfg.weights);
            assert_eq!(two.picks, fit_pod(winner, &req, &order).unwrap());
            // Reproducible for a seed.
            let again = by_verdict(&c, &req, &ids, &cfg, &mut SplitMix64::new(3), 2).unwrap();
            assert_eq!(again.node, two.node);
        }
        // Nothing fits anywhere: every node refused, in scan order.
        let huge = pod(1, 5000, 10);
        let cfg = SchedulerConfig::default();
        let Err(ScheduleError::NoNodeFits { failed }) =
            by_verdict(&c, &huge, &ids, &cfg, &mut SplitMix64::new(1), 2)
        else {
            panic!("nothing can fit 5000 MiB");
        };
        assert_eq!(failed.iter().map(|(id, _)| *id).collect::<Vec<_>>(), ids);
    }

    #[test]
    fn the_two_thread_scan_breaks_ties_uniformly() {
        // Six empty nodes: all tie under spread and binpack.
        let c = Cluster::new(
            (0..6)
                .map(|i| mk_node(&format!("n{i}"), 1, 10, 1000))
                .collect(),
        );
        let ids: Vec<NodeId> = (0..6).collect();
        let req = pod(1, 100, 10);
        let mut seen = [0u32; 6];
        let mut rng = SplitMix64::new(11);
        for _ in 0..6000 {
            let d = by_verdict(&c, &req, &ids, &SchedulerConfig::default(), &mut rng, 2).unwrap();
            seen[d.node] += 1;
        }
        for n in seen {
            assert!((800..1200).contains(&n), "{seen:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the policy and pod, a decision can always be reserved:
        /// fit never picks more than a GPU has, so the ledger never refuses
        /// it and no GPU is over-committed.
        #[test]
        fn decisions_never_over_commit(
            pods in proptest::collection::vec((0usize..5, 1u32..3, 0u64..1200, 0u32..110, 0u64..3000), 1..40),
            seed in 0u64..1000,
        ) {
            let mut c = Cluster::new(vec![
                mk_node("a", 2, 3, 1000).with_capacity(NodeCapacity { cpu_milli: 4000, memory_mib: 1 << 20 }),
                mk_node("b", 3, 2, 800).with_capacity(NodeCapacity { cpu_milli: 4000, memory_mib: 1 << 20 }),
            ]);
            let mut dist = ShapeDistribution::default();
            dist.observe(Shape { cpu_milli: 1000, memory_mib: 0, gpus: 1, milli: 300, types: vec![] });
            let mut rng = SplitMix64::new(seed);
            for (i, (p, nums, mem, cores, cpu)) in pods.into_iter().enumerate() {
                let policy = Policy::ALL[p];
                let cfg = SchedulerConfig { node_policy: policy, ..SchedulerConfig::default() };
                let mut idx = FgdIndex::new(&dist, &c);
                let mut req = pod(nums, mem, cores.min(100));
                req.cpu_milli = cpu;
                if let Ok(d) = schedule(&c, &req, 0..2, &cfg, Some(&mut idx), &mut rng) {
                    let node = c.node(d.node).unwrap();
                    let devs = d.pod_devices(node);
                    let host = HostResources { cpu_milli: cpu, memory_mib: 0 };
                    let uid = format!("p{i}");
                    proptest::prop_assert!(c.reserve(&uid, d.node, &devs, d.init_count(), host).is_ok());
                }
                for n in c.nodes() {
                    for (g, u) in n.gpus.iter().zip(&n.usage) {
                        proptest::prop_assert!(u.used <= g.count && u.usedmem <= g.devmem && u.usedcores <= g.devcore);
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// FGD with each node's outcome remembered across decisions decides
        /// exactly as FGD evaluating every node afresh: the same node, GPUs,
        /// score, refusals and tie-break draws, through reserves, releases,
        /// repeated and new requests, a node changed without a refresh
        /// (compared with the same index holding no outcomes) and workload
        /// changes (a rebuilt index).
        #[test]
        fn fgd_with_remembered_outcomes_decides_as_a_fresh_index(
            steps in proptest::collection::vec(
                (0u8..8, 0usize..4, 1u32..3, 0u64..1200, 0u32..110, 0u64..3000, 0usize..50), 1..50),
            seed in 0u64..1000,
        ) {
            let cap = NodeCapacity { cpu_milli: 4000, memory_mib: 1 << 20 };
            let mut c = Cluster::new(vec![
                mk_node("a", 2, 3, 1000).with_capacity(cap),
                mk_node("b", 3, 2, 800).with_capacity(cap),
                mk_node("c", 1, 4, 1000),
                mk_node("d", 4, 2, 600).with_capacity(cap),
            ]);
            let mut dist = ShapeDistribution::default();
            dist.observe(Shape { cpu_milli: 1000, memory_mib: 0, gpus: 1, milli: 300, types: vec![] });
            let cfg = SchedulerConfig { node_policy: Policy::Fgd, ..SchedulerConfig::default() };
            let mut live = FgdIndex::new(&dist, &c);
            let mut stale = false;
            let mut rng = SplitMix64::new(seed);
            let mut held: Vec<(String, NodeId)> = Vec::new();
            // A few requests, so the same one comes back and finds its outcomes.
            let requests: Vec<PodRequest> = steps
                .iter()
                .take(4)
                .map(|&(_, _, nums, mem, cores, cpu, _)| {
                    let mut req = pod(nums, mem, cores.min(100));
                    req.cpu_milli = cpu;
                    req
                })
                .collect();
            for (k, (op, which, nums, mem, cores, cpu, pick)) in steps.into_iter().enumerate() {
                match op {
                    // Release a held pod.
                    0 if !held.is_empty() => {
                        let (uid, node) = held.remove(pick % held.len());
                        c.release(&uid);
                        live.refresh_node(&c, node);
                    }
                    // A new shape in the workload: the index is rebuilt.
                    1 => {
                        dist.observe(Shape {
                            cpu_milli: cpu, memory_mib: 0, gpus: nums,
                            milli: (cores.clamp(1, 100)) * 10, types: vec![],
                        });
                        live = FgdIndex::new(&dist, &c);
                        stale = false;
                    }
                    // A node changes behind the index's back.
                    2 => {
                        let node = which % c.nodes().len();
                        let uuid = c.node(node).unwrap().gpus[0].uuid.clone();
                        let devices: PodDevices = format!("{uuid},NVIDIA,{},10:;", mem % 300 + 1).parse().unwrap();
                        let uid = format!("s{k}");
                        if c.reserve(&uid, node, &devices, 0, HostResources::default()).is_ok() {
                            held.push((uid, node));
                            stale = true;
                        }
                    }
                    // Schedule a known or a new request.
                    _ => {
                        let req = if op % 2 == 0 {
                            requests[which % requests.len()].clone()
                        } else {
                            let mut r = pod(nums, mem, cores.min(100));
                            r.cpu_milli = cpu;
                            r
                        };
                        let mut cold = live.clone();
                        cold.forget_outcomes();
                        let (mut r1, mut r2) = (rng.clone(), rng.clone());
                        let warm = schedule(&c, &req, 0..4, &cfg, Some(&mut live), &mut rng);
                        let from_cold = schedule(&c, &req, 0..4, &cfg, Some(&mut cold), &mut r1);
                        proptest::prop_assert_eq!(&warm, &from_cold);
                        if !stale {
                            let mut fresh = FgdIndex::new(&dist, &c);
                            let from_fresh = schedule(&c, &req, 0..4, &cfg, Some(&mut fresh), &mut r2);
                            proptest::prop_assert_eq!(&warm, &from_fresh);
                        }
                        if let Ok(d) = warm {
                            let devices = d.pod_devices(c.node(d.node).unwrap());
                            let host = HostResources { cpu_milli: req.cpu_milli, memory_mib: 0 };
                            let uid = format!("p{k}");
                            proptest::prop_assert!(c.reserve(&uid, d.node, &devices, d.init_count(), host).is_ok());
                            held.push((uid, d.node));
                            live.refresh_node(&c, d.node);
                        }
                    }
                }
            }
        }
    }
}

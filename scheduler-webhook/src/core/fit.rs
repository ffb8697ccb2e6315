//! Whether a pod fits a node and on which GPUs, following HAMi's Fit
//! (spec §5) rule by rule, with HAMi's per-node failure reasons
//! (`"2/8 CardInsufficientMemory, 6/8 CardTypeMismatch"`).
//!
//! Fit walks a GPU order (see [`crate::core::score::gpu_order`]) from the
//! end and skips a GPU that is unhealthy or cordoned, of a refused type,
//! mode or UUID, out of slots, already used under the `mutex` GPU policy,
//! short of memory or cores, already used when the request is exclusive
//! (100 cores), or fully used in cores when the request asks for 0 cores; a
//! GPU that passes all that is still skipped when its pick would take the
//! pod past its namespace's quota room (`Constraints::quota`). With
//! numa-bind, picks restart whenever the NUMA node changes. Under the
//! `topology-aware` GPU policy every GPU that passes is gathered and the
//! pick is made by the node's pair scores ([`fit_topology`]). Init containers are each fitted against the node as it was
//! before the pod (they run one at a time: the pod needs their peak); app
//! containers are fitted one after the other, each seeing the picks of the
//! ones before (they run together: summed).

use std::fmt;

use crate::core::mig;
use crate::core::model::{Gpu, GpuUse, Node};
use crate::core::request::{Constraints, DeviceRequest, PodRequest};

/// Why a GPU, or a node, was refused. Names are HAMi's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Some GPUs fitted but fewer than the container asks for.
    AllocatedCardsInsufficientRequest,
    /// All cores used and the request asks for 0 cores.
    CardComputeUnitsExhausted,
    /// Cordoned by an admin.
    CardCordoned,
    /// Not enough free cores.
    CardInsufficientCore,
    /// Not enough free memory.
    CardInsufficientMemory,
    /// Unhealthy.
    CardNotHealth,
    /// No free slot (split count reached).
    CardTimeSlicingExhausted,
    /// Type or sharing mode refused by the pod.
    CardTypeMismatch,
    /// UUID refused by the pod.
    CardUuidMismatch,
    /// An exclusive request (100 cores) on a GPU already in use.
    ExclusiveDeviceAllocateConflict,
    /// Fewer GPUs on the node than one container asks for.
    NodeInsufficientDevice,
    /// Picks were dropped because the NUMA node changed (numa-bind).
    NumaNotFit,
    /// The pick would take the pod past its namespace's ResourceQuota.
    ResourceQuotaNotFit,
    /// Not enough free CPU on the node (simulation only).
    InsufficientCpu,
    /// Not enough free memory on the node (simulation only).
    InsufficientMemory,
    /// A GPU in `mig` mode with no profile holding the request at a free
    /// placement.
    CardMigTopologyInfeasible,
}

impl Reason {
    /// Every reason, in the order they are reported (alphabetical, so
    /// messages are stable; HAMi's order is Go map order).
    pub const ALL: [Self; 16] = [
        Self::AllocatedCardsInsufficientRequest,
        Self::CardComputeUnitsExhausted,
        Self::CardCordoned,
        Self::CardInsufficientCore,
        Self::CardInsufficientMemory,
        Self::CardNotHealth,
        Self::CardTimeSlicingExhausted,
        Self::CardTypeMismatch,
        Self::CardUuidMismatch,
        Self::ExclusiveDeviceAllocateConflict,
        Self::NodeInsufficientDevice,
        Self::NumaNotFit,
        Self::ResourceQuotaNotFit,
        Self::InsufficientCpu,
        Self::InsufficientMemory,
        Self::CardMigTopologyInfeasible,
    ];

    /// HAMi's name for it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllocatedCardsInsufficientRequest => "AllocatedCardsInsufficientRequest",
            Self::CardComputeUnitsExhausted => "CardComputeUnitsExhausted",
            Self::CardCordoned => "CardCordoned",
            Self::CardInsufficientCore => "CardInsufficientCore",
            Self::CardInsufficientMemory => "CardInsufficientMemory",
            Self::CardNotHealth => "CardNotHealth",
            Self::CardTimeSlicingExhausted => "CardTimeSlicingExhausted",
            Self::CardTypeMismatch => "CardTypeMismatch",
            Self::CardUuidMismatch => "CardUuidMismatch",
            Self::ExclusiveDeviceAllocateConflict => "ExclusiveDeviceAllocateConflict",
            Self::NodeInsufficientDevice => "NodeInsufficientDevice",
            Self::NumaNotFit => "NumaNotFit",
            Self::ResourceQuotaNotFit => "ResourceQuotaNotFit",
            Self::InsufficientCpu => "Insufficient cpu",
            Self::InsufficientMemory => "Insufficient memory",
            Self::CardMigTopologyInfeasible => "CardMigTopologyInfeasible",
        }
    }

    fn slot(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Why a node was refused: how many GPUs each reason hit, out of `cards`.
/// No allocation, so refusing thousands of nodes stays cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitFailure {
    counts: [u32; Reason::ALL.len()],
    cards: usize,
}

impl FitFailure {
    fn new(cards: usize) -> Self {
        Self {
            counts: [0; Reason::ALL.len()],
            cards,
        }
    }

    /// A failure with a single reason counted once.
    #[must_use]
    pub fn single(reason: Reason, cards: usize) -> Self {
        let mut f = Self::new(cards);
        f.add(reason, 1);
        f
    }

    fn add(&mut self, reason: Reason, n: usize) {
        let slot = &mut self.counts[reason.slot()];
        *slot = slot.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// How many GPUs this reason refused.
    #[must_use]
    pub fn count(&self, reason: Reason) -> u32 {
        self.counts[reason.slot()]
    }
}

impl fmt::Display for FitFailure {
    /// `"<n>/<cards> <Reason>"` joined by `", "`; CPU/memory shortage as
    /// kube-scheduler words it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for r in Reason::ALL {
            let n = self.count(r);
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            match r {
                Reason::InsufficientCpu | Reason::InsufficientMemory => f.write_str(r.as_str())?,
                _ => write!(f, "{n}/{} {}", self.cards, r.as_str())?,
            }
        }
        Ok(())
    }
}

/// One GPU picked for one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Position of the GPU in [`Node::gpus`].
    pub gpu: usize,
    /// Memory taken, MiB.
    pub usedmem: u64,
    /// Cores taken, percent.
    pub usedcores: u32,
}

/// The GPUs picked for every container of a pod (empty for a container
/// without a GPU request).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodPicks {
    /// Per init container.
    pub init: Vec<Vec<Pick>>,
    /// Per app container.
    pub app: Vec<Vec<Pick>>,
}

/// Checks one GPU for one container request; the memory and cores it would
/// take, or the reason it is skipped (HAMi's order of checks).
///
/// # Errors
/// The [`Reason`] the GPU is skipped for.
pub fn check_gpu(
    gpu: &Gpu,
    used: &GpuUse,
    req: &DeviceRequest,
    c: &Constraints,
) -> Result<Pick, Reason> {
    if !gpu.health {
        return Err(Reason::CardNotHealth);
    }
    if gpu.cordoned {
        return Err(Reason::CardCordoned);
    }
    if !c.type_allows(&gpu.device_type, &gpu.mode) {
        return Err(Reason::CardTypeMismatch);
    }
    if !c.uuid_allows(&gpu.uuid) {
        return Err(Reason::CardUuidMismatch);
    }
    if gpu.count <= used.used {
        return Err(Reason::CardTimeSlicingExhausted);
    }
    // HAMi v2.10 `Fit` (pkg/device/nvidia/device.go): `isMutex && dev.Used > 0`.
    if c.mutex && used.used > 0 {
        return Err(Reason::ExclusiveDeviceAllocateConflict);
    }
    let cores = req.cores.min(100);
    let mem = req.memory_on(gpu.devmem);
    if gpu.devmem.saturating_sub(used.usedmem) < mem {
        return Err(Reason::CardInsufficientMemory);
    }
    if gpu.devcore.saturating_sub(used.usedcores) < cores {
        return Err(Reason::CardInsufficientCore);
    }
    if gpu.devcore == 100 && cores == 100 && used.used > 0 {
        return Err(Reason::ExclusiveDeviceAllocateConflict);
    }
    if used.usedcores == gpu.devcore && cores == 0 {
        return Err(Reason::CardComputeUnitsExhausted);
    }
    Ok(Pick {
        gpu: 0,
        usedmem: mem,
        usedcores: cores,
    })
}

/// [`check_gpu`], then on a GPU in `mig` mode the instance: the pick is
/// charged the chosen profile's memory and cores (HAMi's
/// `AddResourceUsage`), or the GPU is refused with
/// [`Reason::CardMigTopologyInfeasible`]. `taken` is the GPU's occupied
/// MIG slice mask.
///
/// # Errors
/// The [`Reason`] the GPU is skipped for.
pub fn check_gpu_mig(
    gpu: &Gpu,
    used: &GpuUse,
    taken: u32,
    req: &DeviceRequest,
    c: &Constraints,
) -> Result<Pick, Reason> {
    let p = check_gpu(gpu, used, req, c)?;
    if !mig::is_mig(gpu) {
        return Ok(p);
    }
    let choice =
        mig::choose(&gpu.mig, taken, p.usedmem).ok_or(Reason::CardMigTopologyInfeasible)?;
    let profile = &gpu.mig[choice.profile];
    Ok(Pick {
        usedmem: u64::from(profile.memory_mb),
        usedcores: profile.core,
        ..p
    })
}

/// Fits one container: walks `order` from the end and picks `req.nums`
/// GPUs.
///
/// # Errors
/// The reasons GPUs were skipped, when too few fit.
pub fn fit_container(
    node: &Node,
    usage: &[GpuUse],
    order: &[usize],
    req: &DeviceRequest,
    c: &Constraints,
) -> Result<Vec<Pick>, FitFailure> {
    fit_container_on(node, usage, &node.mig_slices, order, req, c)
}

/// [`fit_container`] with `mig_slices`, the MIG slices taken per GPU
/// position (the node's, plus earlier containers' of this pod).
fn fit_container_on(
    node: &Node,
    usage: &[GpuUse],
    mig_slices: &[u32],
    order: &[usize],
    req: &DeviceRequest,
    c: &Constraints,
) -> Result<Vec<Pick>, FitFailure> {
    if c.topology {
        return fit_topology(node, usage, mig_slices, order, req, c);
    }
    walk(node, usage, mig_slices, order, req, c, Walk::FirstFit)
}

/// What a walk over the GPUs keeps of those that pass the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Stops at the `nums`-th (the default policies). With numa-bind, a
    /// change of NUMA node drops the picks so far, counted `NumaNotFit`.
    FirstFit,
    /// Gathers every one (`topology-aware`). With numa-bind, only those of
    /// the last NUMA node walked: the gathered GPUs restart at each change,
    /// and as the count never drops no `NumaNotFit` is counted.
    GatherAll,
}

/// Walks `order` from the end and checks each GPU for `req` (health, then
/// [`check_gpu_mig`] against `mig_slices`, then the quota room left);
/// returns what `walk` keeps once it holds at least `nums` GPUs.
///
/// # Errors
/// The reasons GPUs were skipped, when fewer than `nums` pass.
fn walk(
    node: &Node,
    usage: &[GpuUse],
    mig_slices: &[u32],
    order: &[usize],
    req: &DeviceRequest,
    c: &Constraints,
    walk: Walk,
) -> Result<Vec<Pick>, FitFailure> {
    let cards = node.gpus.len();
    let nums = usize::try_from(req.nums).unwrap_or(usize::MAX);
    if nums > cards {
        return Err(FitFailure::single(Reason::NodeInsufficientDevice, cards));
    }
    let mut fail = FitFailure::new(cards);
    let mut picks: Vec<Pick> = Vec::with_capacity(nums);
    let mut prev_numa: Option<u32> = None;
    // Quota room left for the picks (`None`: no quota).
    let mut room = c.quota;
    for &pos in order.iter().rev() {
        let (Some(gpu), Some(used)) = (node.gpus.get(pos), usage.get(pos)) else {
            continue;
        };
        if !gpu.health {
            fail.add(Reason::CardNotHealth, 1);
            continue;
        }
        if c.numa_bind && prev_numa != Some(gpu.numa) {
            if walk == Walk::FirstFit && !picks.is_empty() {
                fail.add(Reason::NumaNotFit, picks.len());
            }
            picks.clear();
            room = c.quota;
            prev_numa = Some(gpu.numa);
        }
        let taken = mig_slices.get(pos).copied().unwrap_or(0);
        match check_gpu_mig(gpu, used, taken, req, c) {
            Err(r) => fail.add(r, 1),
            Ok(p) => {
                if let Some(left) = room.as_mut()
                    && !left.take(p.usedmem, p.usedcores)
                {
                    fail.add(Reason::ResourceQuotaNotFit, 1);
                    continue;
                }
                picks.push(Pick { gpu: pos, ..p });
                if walk == Walk::FirstFit && picks.len() == nums {
                    return Ok(picks);
                }
            }
        }
    }
    if walk == Walk::GatherAll && picks.len() >= nums {
        return Ok(picks);
    }
    if !picks.is_empty() {
        fail.add(Reason::AllocatedCardsInsufficientRequest, picks.len());
    }
    Err(fail)
}

/// [`fit_container`] under the `topology-aware` GPU policy, as HAMi v2.10's
/// NVIDIA `Fit` does it (`pkg/device/nvidia/device.go`): the walk does not
/// stop at `nums` but gathers every GPU that passes the checks
/// (`Walk::GatherAll`; a GPU in MIG mode passes when an instance fits
/// around `mig_slices`, as in the default walk). Exactly `nums` gathered
/// are the picks; more are narrowed by the node's pair scores
/// ([`Node::pair_score`]):
///
/// - one GPU (`computeWorstSingleCard`): the one whose scores to the other
///   gathered GPUs sum lowest, leaving the best-linked GPUs to multi-GPU
///   pods; the first in walk order on a tie;
/// - several (`generateCombinations` + `computeBestCombination`): of every
///   `nums`-subset, in lexicographic order of the walk, the first whose pair
///   scores (each pair once, the earlier GPU's score for the later) sum
///   highest.
///
/// A node without scores (every pair 0) gets the first GPU, or the first
/// `nums`, in walk order.
///
/// # Errors
/// As [`fit_container`]: the reasons GPUs were skipped, when fewer than
/// `nums` pass.
pub fn fit_topology(
    node: &Node,
    usage: &[GpuUse],
    mig_slices: &[u32],
    order: &[usize],
    req: &DeviceRequest,
    c: &Constraints,
) -> Result<Vec<Pick>, FitFailure> {
    let gathered = walk(node, usage, mig_slices, order, req, c, Walk::GatherAll)?;
    let nums = usize::try_from(req.nums).unwrap_or(usize::MAX);
    Ok(match gathered.len() {
        n if n == nums => gathered,
        _ if nums == 1 => worst_linked(node, &gathered),
        _ => best_linked(node, &gathered, nums),
    })
}

/// The gathered GPU whose scores to the others sum lowest; the first on a
/// tie.
fn worst_linked(node: &Node, gathered: &[Pick]) -> Vec<Pick> {
    let mut best: Option<(i64, Pick)> = None;
    for (i, a) in gathered.iter().enumerate() {
        let total: i64 = gathered
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, b)| node.pair_score(a.gpu, b.gpu))
            .fold(0i64, i64::saturating_add);
        if best.is_none_or(|(s, _)| total < s) {
            best = Some((total, *a));
        }
    }
    best.map(|(_, p)| vec![p]).unwrap_or_default()
}

/// Of every `nums`-subset of the gathered GPUs, in lexicographic order, the
/// first whose pair scores sum highest.
fn best_linked(node: &Node, gathered: &[Pick], nums: usize) -> Vec<Pick> {
    let n = gathered.len();
    // Positions into `gathered` of the current subset, lexicographic.
    let mut idx: Vec<usize> = (0..nums).collect();
    let mut best: Option<(i64, Vec<usize>)> = None;
    loop {
        let mut total = 0i64;
        for (k, &a) in idx.iter().enumerate() {
            for &b in idx.iter().skip(k + 1) {
                let (Some(pa), Some(pb)) = (gathered.get(a), gathered.get(b)) else {
                    continue;
                };
                total = total.saturating_add(node.pair_score(pa.gpu, pb.gpu));
            }
        }
        if best.as_ref().is_none_or(|(s, _)| total > *s) {
            best = Some((total, idx.clone()));
        }
        // Next subset: the rightmost position that can still move right.
        let Some(k) = (0..nums).rev().find(|&k| idx[k] < n - nums + k) else {
            break;
        };
        idx[k] += 1;
        for j in k + 1..nums {
            idx[j] = idx[j - 1] + 1;
        }
    }
    best.map(|(_, idx)| {
        idx.iter()
            .filter_map(|&i| gathered.get(i).copied())
            .collect()
    })
    .unwrap_or_default()
}

/// The node's CPU and memory, when it tracks them (the simulator).
fn check_cpu_memory(node: &Node, req: &PodRequest) -> Result<(), FitFailure> {
    let cards = node.gpus.len();
    if let Some((cpu, mem)) = node.free_cpu_memory() {
        if req.cpu_milli > cpu {
            return Err(FitFailure::single(Reason::InsufficientCpu, cards));
        }
        if req.memory_mib > mem {
            return Err(FitFailure::single(Reason::InsufficientMemory, cards));
        }
    }
    Ok(())
}

/// Whether fitting `req` can be decided without a GPU order: no numa-bind,
/// no namespace quota (its room shrinks with each pick) and at most one app
/// container asking for GPUs. Then every GPU is checked against the node as
/// it is (init containers each see the node before the pod, and the single
/// GPU app container sees no earlier picks), so whether the pod fits, and
/// the reasons when it does not, are the same on every order. [`check_pod`]
/// answers it without building picks.
#[must_use]
pub fn order_independent(req: &PodRequest) -> bool {
    let c = &req.constraints;
    !c.numa_bind && c.quota.is_none() && req.app.iter().filter(|r| r.is_some()).count() <= 1
}

/// [`fit_container`]'s verdict without the picks, for requests whose verdict
/// does not depend on the order (see [`order_independent`]).
fn check_container(node: &Node, req: &DeviceRequest, c: &Constraints) -> Result<(), FitFailure> {
    let cards = node.gpus.len();
    let nums = usize::try_from(req.nums).unwrap_or(usize::MAX);
    if nums > cards {
        return Err(FitFailure::single(Reason::NodeInsufficientDevice, cards));
    }
    let mut fail = FitFailure::new(cards);
    let mut fits = 0;
    for ((gpu, used), taken) in node.gpus.iter().zip(&node.usage).zip(&node.mig_slices) {
        match check_gpu_mig(gpu, used, *taken, req, c) {
            Err(r) => fail.add(r, 1),
            Ok(_) => {
                fits += 1;
                if fits == nums {
                    return Ok(());
                }
            }
        }
    }
    if fits > 0 {
        fail.add(Reason::AllocatedCardsInsufficientRequest, fits);
    }
    Err(fail)
}

/// Whether the pod fits the node, with [`fit_pod`]'s reasons when it does
/// not, but without ordering GPUs or building picks: the scan a filter runs
/// over thousands of nodes before it builds the picks of the one it chose.
/// Equal to `fit_pod(node, req, order).map(|_| ())` for every order when
/// [`order_independent`] holds; callers check that first.
///
/// # Errors
/// The first failing container's reasons, or the node's CPU/memory
/// shortage.
pub fn check_pod(node: &Node, req: &PodRequest) -> Result<(), FitFailure> {
    check_cpu_memory(node, req)?;
    for r in req.init.iter().chain(&req.app).flatten() {
        check_container(node, r, &req.constraints)?;
    }
    Ok(())
}

/// Adds picks to a usage vector.
pub fn apply_picks(usage: &mut [GpuUse], picks: &[Pick]) {
    for p in picks {
        if let Some(u) = usage.get_mut(p.gpu) {
            u.used += 1;
            u.usedmem += p.usedmem;
            u.usedcores += p.usedcores;
        }
    }
}

/// Fits a whole pod on a node with the given GPU order: CPU and memory
/// (when the node tracks them), init containers each against the node as it
/// is, app containers cumulatively.
///
/// # Errors
/// The first failing container's reasons, or the node's CPU/memory
/// shortage.
pub fn fit_pod(node: &Node, req: &PodRequest, order: &[usize]) -> Result<PodPicks, FitFailure> {
    check_cpu_memory(node, req)?;
    let c = &req.constraints;
    let mut picks = PodPicks {
        init: Vec::with_capacity(req.init.len()),
        app: Vec::with_capacity(req.app.len()),
    };
    for r in &req.init {
        picks.init.push(match r {
            Some(r) => fit_container(node, &node.usage, order, r, c)?,
            None => Vec::new(),
        });
    }
    let mut working: Option<Vec<GpuUse>> = None;
    // MIG slices the pod's earlier app containers take (like `working`).
    let mut working_mig: Option<Vec<u32>> = None;
    // With a quota, app containers share one room (they run together);
    // each init container has the whole room (they run one at a time).
    let mut quota_scope: Option<Constraints> = None;
    let last_gpu_app = req.app.iter().rposition(Option::is_some);
    for (i, r) in req.app.iter().enumerate() {
        let Some(r) = r else {
            picks.app.push(Vec::new());
            continue;
        };
        let usage = working.as_deref().unwrap_or(&node.usage);
        let slices = working_mig.as_deref().unwrap_or(&node.mig_slices);
        let p = fit_container_on(
            node,
            usage,
            slices,
            order,
            r,
            quota_scope.as_ref().unwrap_or(c),
        )?;
        if let Some(room) = c.quota
            && Some(i) != last_gpu_app
        {
            let scope = quota_scope.get_or_insert_with(|| c.clone());
            let mut left = scope.quota.unwrap_or(room);
            for pick in &p {
                // Always fits: fit_container took these picks from this room.
                left.take(pick.usedmem, pick.usedcores);
            }
            scope.quota = Some(left);
        }
        if Some(i) != last_gpu_app {
            let w = working.get_or_insert_with(|| node.usage.clone());
            apply_picks(w, &p);
            if p.iter()
                .any(|pick| node.gpus.get(pick.gpu).is_some_and(mig::is_mig))
            {
                let m = working_mig.get_or_insert_with(|| node.mig_slices.clone());
                let entries = p.iter().enumerate().map(|(j, x)| (i, j, x.gpu, x.usedmem));
                if let Ok(placed) = mig::place_entries(node, m, entries) {
                    for (pos, mask) in placed.masks {
                        if let Some(s) = m.get_mut(pos) {
                            *s |= mask;
                        }
                    }
                }
            }
        }
        picks.app.push(p);
    }
    Ok(picks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::NodeCapacity;
    use crate::core::model::testutil::{mk_device, mk_node};
    use crate::core::request::MemoryRequest;

    fn req(nums: u32, mem: u64, cores: u32) -> DeviceRequest {
        DeviceRequest {
            nums,
            memory: MemoryRequest::Mib(mem),
            cores,
        }
    }

    fn order(n: &Node) -> Vec<usize> {
        (0..n.gpus.len()).collect()
    }

    /// One table row: prepares GPU 0 of a 1-GPU node (10 slots, 1000 MiB,
    /// 100 cores), asks `req`, expects a reason or a fit.
    struct Row {
        name: &'static str,
        setup: fn(&mut Node, &mut Constraints),
        req: DeviceRequest,
        want: Result<(), Reason>,
    }

    #[test]
    fn every_skip_rule_and_reason() {
        let rows = [
            Row {
                name: "fits",
                setup: |_, _| {},
                req: req(1, 100, 10),
                want: Ok(()),
            },
            Row {
                name: "unhealthy",
                setup: |n, _| n.gpus[0].health = false,
                req: req(1, 100, 10),
                want: Err(Reason::CardNotHealth),
            },
            Row {
                name: "cordoned",
                setup: |n, _| n.gpus[0].cordoned = true,
                req: req(1, 100, 10),
                want: Err(Reason::CardCordoned),
            },
            Row {
                name: "type not allowed",
                setup: |_, c| c.use_types = vec!["a100".into()],
                req: req(1, 100, 10),
                want: Err(Reason::CardTypeMismatch),
            },
            Row {
                name: "type denied",
                setup: |_, c| c.nouse_types = vec!["t4".into()],
                req: req(1, 100, 10),
                want: Err(Reason::CardTypeMismatch),
            },
            Row {
                name: "mode mismatch",
                setup: |_, c| c.vgpu_mode = Some("mig".into()),
                req: req(1, 100, 10),
                want: Err(Reason::CardTypeMismatch),
            },
            Row {
                name: "uuid not allowed",
                setup: |_, c| c.use_uuids = vec!["GPU-x".into()],
                req: req(1, 100, 10),
                want: Err(Reason::CardUuidMismatch),
            },
            Row {
                name: "uuid denied",
                setup: |_, c| c.nouse_uuids = vec!["GPU-a-0".into()],
                req: req(1, 100, 10),
                want: Err(Reason::CardUuidMismatch),
            },
            Row {
                name: "no slot",
                setup: |n, _| n.usage[0].used = 10,
                req: req(1, 100, 10),
                want: Err(Reason::CardTimeSlicingExhausted),
            },
            Row {
                name: "memory short",
                setup: |n, _| n.usage[0].usedmem = 950,
                req: req(1, 100, 10),
                want: Err(Reason::CardInsufficientMemory),
            },
            Row {
                name: "memory exact",
                setup: |n, _| n.usage[0].usedmem = 900,
                req: req(1, 100, 10),
                want: Ok(()),
            },
            Row {
                name: "cores short",
                setup: |n, _| n.usage[0].usedcores = 95,
                req: req(1, 100, 10),
                want: Err(Reason::CardInsufficientCore),
            },
            Row {
                name: "exclusive on used card",
                setup: |n, _| n.usage[0].used = 1,
                req: req(1, 100, 100),
                want: Err(Reason::ExclusiveDeviceAllocateConflict),
            },
            Row {
                name: "exclusive on free card",
                setup: |_, _| {},
                req: req(1, 100, 100),
                want: Ok(()),
            },
            Row {
                name: "zero cores on full card",
                setup: |n, _| {
                    n.usage[0].used = 1;
                    n.usage[0].usedcores = 100
                },
                req: req(1, 100, 0),
                want: Err(Reason::CardComputeUnitsExhausted),
            },
            Row {
                name: "zero cores on partly used card",
                setup: |n, _| {
                    n.usage[0].used = 1;
                    n.usage[0].usedcores = 60
                },
                req: req(1, 100, 0),
                want: Ok(()),
            },
            Row {
                name: "too many gpus",
                setup: |_, _| {},
                req: req(2, 100, 10),
                want: Err(Reason::NodeInsufficientDevice),
            },
        ];
        for row in rows {
            let mut n = mk_node("a", 1, 10, 1000);
            let mut c = Constraints::default();
            (row.setup)(&mut n, &mut c);
            let got = fit_container(&n, &n.usage, &order(&n), &row.req, &c);
            match row.want {
                Ok(()) => assert!(got.is_ok(), "{}: {got:?}", row.name),
                Err(r) => {
                    let f = got.expect_err(row.name);
                    assert_eq!(f.count(r), 1, "{}: {f}", row.name);
                    assert_eq!(f.to_string(), format!("1/1 {}", r.as_str()), "{}", row.name);
                }
            }
        }
    }

    #[test]
    fn reasons_are_counted_per_card_in_hami_format() {
        let mut devs: Vec<_> = (0..8)
            .map(|i| mk_device("a", i, "NVIDIA-Tesla T4", 10, 1000))
            .collect();
        for d in &mut devs[..6] {
            d.device_type = "NVIDIA-Tesla V100".into();
        }
        let mut n = Node::from_register("a", &devs);
        n.usage[6].usedmem = 990;
        n.usage[7].usedmem = 999;
        let c = Constraints {
            use_types: vec!["t4".into()],
            ..Constraints::default()
        };
        let f = fit_container(&n, &n.usage, &order(&n), &req(1, 100, 0), &c).unwrap_err();
        assert_eq!(
            f.to_string(),
            "2/8 CardInsufficientMemory, 6/8 CardTypeMismatch"
        );
    }

    #[test]
    fn partial_picks_report_allocated_cards_insufficient() {
        let mut n = mk_node("a", 3, 10, 1000);
        n.usage[0].usedmem = 1000;
        let f = fit_container(
            &n,
            &n.usage,
            &order(&n),
            &req(3, 100, 0),
            &Constraints::default(),
        )
        .unwrap_err();
        assert_eq!(
            f.to_string(),
            "2/3 AllocatedCardsInsufficientRequest, 1/3 CardInsufficientMemory"
        );
    }

    #[test]
    fn fit_walks_the_order_from_the_end() {
        let n = mk_node("a", 4, 10, 1000);
        let picks = fit_container(
            &n,
            &n.usage,
            &[2, 0, 3, 1],
            &req(2, 100, 0),
            &Constraints::default(),
        )
        .unwrap();
        let gpus: Vec<usize> = picks.iter().map(|p| p.gpu).collect();
        assert_eq!(gpus, vec![1, 3]);
    }

    #[test]
    fn numa_bind_restarts_picks_when_numa_changes() {
        // Order (walked from the end): GPU3 numa1, GPU2 numa0, GPU1 numa0.
        let mut n = mk_node("a", 4, 10, 1000);
        n.gpus[3].numa = 1;
        n.usage[0].usedmem = 1000;
        let c = Constraints {
            numa_bind: true,
            ..Constraints::default()
        };
        let picks = fit_container(&n, &n.usage, &order(&n), &req(2, 100, 0), &c).unwrap();
        let gpus: Vec<usize> = picks.iter().map(|p| p.gpu).collect();
        assert_eq!(gpus, vec![2, 1]);
        // Without numa-bind the first two walked win.
        let picks = fit_container(
            &n,
            &n.usage,
            &order(&n),
            &req(2, 100, 0),
            &Constraints::default(),
        )
        .unwrap();
        assert_eq!(picks.iter().map(|p| p.gpu).collect::<Vec<_>>(), vec![3, 2]);
        // When no NUMA node has enough, the dropped picks are reported.
        n.usage[1].usedmem = 1000;
        let f = fit_container(&n, &n.usage, &order(&n), &req(2, 100, 0), &c).unwrap_err();
        assert_eq!(f.count(Reason::NumaNotFit), 1, "{f}");
    }

    #[test]
    fn percentage_memory_is_taken_from_each_card() {
        let n = mk_node("a", 1, 10, 16000);
        let r = DeviceRequest {
            nums: 1,
            memory: MemoryRequest::Percent(25),
            cores: 0,
        };
        let p = fit_container(&n, &n.usage, &order(&n), &r, &Constraints::default()).unwrap();
        assert_eq!(p[0].usedmem, 4000);
    }

    #[test]
    fn app_containers_are_summed_init_containers_take_the_peak() {
        // One GPU with 1000 MiB. Two app containers of 600 MiB cannot share
        // it; an init and an app container of 600 MiB each can.
        let n = mk_node("a", 1, 10, 1000);
        let two_apps = PodRequest {
            app: vec![Some(req(1, 600, 0)), None, Some(req(1, 600, 0))],
            ..PodRequest::default()
        };
        let f = fit_pod(&n, &two_apps, &order(&n)).unwrap_err();
        assert_eq!(f.to_string(), "1/1 CardInsufficientMemory");
        let init_and_app = PodRequest {
            init: vec![Some(req(1, 600, 0)), Some(req(1, 700, 0))],
            app: vec![Some(req(1, 600, 0)), None],
            ..PodRequest::default()
        };
        let p = fit_pod(&n, &init_and_app, &order(&n)).unwrap();
        assert_eq!(p.init.len(), 2);
        assert_eq!(p.app.len(), 2);
        assert!(p.app[1].is_empty());
        assert_eq!(p.init[1][0].usedmem, 700);
    }

    #[test]
    fn cpu_and_memory_must_fit_when_tracked() {
        let n = mk_node("a", 1, 10, 1000).with_capacity(NodeCapacity {
            cpu_milli: 1000,
            memory_mib: 1000,
        });
        let mut r = PodRequest {
            app: vec![Some(req(1, 1, 0))],
            cpu_milli: 2000,
            ..PodRequest::default()
        };
        assert_eq!(
            fit_pod(&n, &r, &order(&n)).unwrap_err().to_string(),
            "Insufficient cpu"
        );
        r.cpu_milli = 1000;
        r.memory_mib = 1001;
        assert_eq!(
            fit_pod(&n, &r, &order(&n)).unwrap_err().to_string(),
            "Insufficient memory"
        );
        r.memory_mib = 1000;
        assert!(fit_pod(&n, &r, &order(&n)).is_ok());
    }

    #[test]
    fn order_independent_only_without_numa_bind_and_with_one_gpu_app_container() {
        let mut r = PodRequest {
            init: vec![Some(req(1, 1, 0)), Some(req(2, 1, 0))],
            app: vec![None, Some(req(1, 1, 0)), None],
            ..PodRequest::default()
        };
        assert!(order_independent(&r));
        r.app.push(Some(req(1, 1, 0)));
        assert!(!order_independent(&r));
        r.app.pop();
        r.constraints.numa_bind = true;
        assert!(!order_independent(&r));
        r.constraints.numa_bind = false;
        r.constraints.quota = Some(crate::core::request::QuotaRoom::default());
        assert!(!order_independent(&r));
    }

    /// HAMi v2.10 NVIDIA `Fit` (pkg/device/nvidia/device.go): under `mutex`
    /// a GPU with any container (`Used > 0`) is skipped as
    /// `ExclusiveDeviceAllocateConflict`, however much room it has left;
    /// the check comes right after the slot check.
    #[test]
    fn mutex_refuses_every_gpu_already_in_use() {
        let mut n = mk_node("a", 3, 10, 1000);
        n.usage[0].used = 1;
        n.usage[0].usedmem = 10;
        n.usage[1].used = 10;
        let c = Constraints {
            mutex: true,
            ..Constraints::default()
        };
        let p = fit_container(&n, &n.usage, &order(&n), &req(1, 100, 10), &c).unwrap();
        assert_eq!(p[0].gpu, 2);
        n.usage[2].used = 1;
        let f = fit_container(&n, &n.usage, &order(&n), &req(1, 100, 10), &c).unwrap_err();
        assert_eq!(
            f.to_string(),
            "1/3 CardTimeSlicingExhausted, 2/3 ExclusiveDeviceAllocateConflict"
        );
    }

    /// Six GPUs `a`..`f` with HAMi's pair scores from its own test
    /// (pkg/scheduler/score_test.go `Test_Nvidia_GPU_Topology`), in list
    /// order, each with one container, 2048 of 8192 MiB and 1 core used.
    fn hami_topology_node(scores: [[i64; 6]; 6]) -> Node {
        use proto::hami::pair_score::DevicePairScore;
        let mut n = mk_node("a", 6, 4, 8192);
        for (pos, u) in n.usage.iter_mut().enumerate() {
            *u = GpuUse {
                used: 1,
                usedmem: 2048,
                usedcores: 1,
            };
            n.gpus[pos].numa = u32::from(pos >= 2);
        }
        let list: Vec<DevicePairScore> = (0..6)
            .map(|a| DevicePairScore {
                uuid: format!("GPU-a-{a}"),
                score: (0..6)
                    .filter(|b| *b != a)
                    .map(|b| (format!("GPU-a-{b}"), scores[a][b]))
                    .collect(),
            })
            .collect();
        n.set_pair_scores(&list);
        n
    }

    fn topology() -> Constraints {
        Constraints {
            topology: true,
            ..Constraints::default()
        }
    }

    #[test]
    fn topology_aware_takes_the_best_linked_gpus_as_hamis_test_does() {
        // a and c link to f at 100, every other pair at 1: HAMi picks
        // [f, c, a], in walk order (from the end of the list).
        let mut s = [[1; 6]; 6];
        for (x, y) in [(0, 5), (2, 5)] {
            s[x][y] = 100;
            s[y][x] = 100;
        }
        let n = hami_topology_node(s);
        let p = fit_container(&n, &n.usage, &order(&n), &req(3, 1024, 20), &topology()).unwrap();
        assert_eq!(p.iter().map(|p| p.gpu).collect::<Vec<_>>(), vec![5, 2, 0]);
        assert!(p.iter().all(|p| p.usedmem == 1024 && p.usedcores == 20));
    }

    #[test]
    fn topology_aware_gives_one_gpu_the_worst_linked_as_hamis_test_does() {
        // Every pair at 100 but f's at 1: one GPU goes to f, keeping the
        // well-linked GPUs for multi-GPU pods.
        let mut s = [[100; 6]; 6];
        for row in &mut s {
            row[5] = 1;
        }
        s[5] = [1; 6];
        let n = hami_topology_node(s);
        let p = fit_container(&n, &n.usage, &order(&n), &req(1, 1024, 20), &topology()).unwrap();
        assert_eq!(p.iter().map(|p| p.gpu).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn topology_aware_without_scores_takes_the_first_walked_and_needs_enough() {
        let mut n = mk_node("a", 4, 10, 1000);
        let p = fit_container(&n, &n.usage, &[0, 1, 2, 3], &req(2, 100, 0), &topology()).unwrap();
        assert_eq!(p.iter().map(|p| p.gpu).collect::<Vec<_>>(), vec![3, 2]);
        n.usage[0].usedmem = 1000;
        n.usage[1].usedmem = 1000;
        n.usage[2].usedmem = 1000;
        let f =
            fit_container(&n, &n.usage, &[0, 1, 2, 3], &req(2, 100, 0), &topology()).unwrap_err();
        assert_eq!(
            f.to_string(),
            "1/4 AllocatedCardsInsufficientRequest, 3/4 CardInsufficientMemory"
        );
    }

    /// A GPU state and a request drawn so that every skip rule is reachable.
    fn gpu_state() -> impl proptest::strategy::Strategy<Value = (bool, bool, u32, u64, u32, bool)> {
        use proptest::prelude::*;
        // health, cordoned, slots used (of 3), memory used (of 1000),
        // cores used (of 100), T4 (else A100)
        (
            proptest::bool::weighted(0.9),
            proptest::bool::weighted(0.1),
            0u32..4,
            0u64..1001,
            prop_oneof![Just(0u32), Just(100u32), 0u32..101],
            any::<bool>(),
        )
    }

    fn device_request() -> impl proptest::strategy::Strategy<Value = DeviceRequest> {
        use proptest::prelude::*;
        (
            1u32..5,
            0u64..1100,
            prop_oneof![Just(0u32), Just(100u32), 0u32..101],
        )
            .prop_map(|(nums, mem, cores)| req(nums, mem, cores))
    }

    proptest::proptest! {
        /// `check_pod` is `fit_pod`'s verdict, reasons included, on every
        /// GPU order, for every request it is used for.
        #[test]
        fn check_pod_is_fit_pods_verdict_on_any_order(
            gpus in proptest::collection::vec(gpu_state(), 1..7),
            init in proptest::collection::vec(proptest::option::of(device_request()), 0..3),
            app in proptest::option::of(device_request()),
            plain in 0usize..3,
            types in proptest::collection::vec(proptest::sample::select(vec!["t4", "a100", "v100"]), 0..2),
            nouse in proptest::collection::vec(proptest::sample::select(vec!["t4", "a100"]), 0..2),
            cpu in 0u64..3000,
            seed in 0u64..1000,
            mutex in proptest::bool::ANY,
            topology in proptest::bool::ANY,
        ) {
            let mut n = mk_node("a", u32::try_from(gpus.len()).unwrap(), 3, 1000)
                .with_capacity(NodeCapacity { cpu_milli: 2000, memory_mib: 1 << 20 });
            for (pos, &(health, cordoned, used, usedmem, usedcores, t4)) in gpus.iter().enumerate() {
                n.gpus[pos].health = health;
                n.gpus[pos].cordoned = cordoned;
                if !t4 {
                    n.gpus[pos].device_type = "NVIDIA A100-SXM4-40GB".into();
                }
                n.usage[pos] = GpuUse { used, usedmem, usedcores };
            }
            let mut apps = vec![None; plain];
            apps.insert(plain / 2, app);
            let r = PodRequest {
                init,
                app: apps,
                cpu_milli: cpu,
                constraints: Constraints {
                    use_types: types.into_iter().map(str::to_owned).collect(),
                    nouse_types: nouse.into_iter().map(str::to_owned).collect(),
                    mutex,
                    topology,
                    ..Constraints::default()
                },
                ..PodRequest::default()
            };
            proptest::prop_assert!(order_independent(&r));
            let mut order = order(&n);
            crate::core::rng::SplitMix64::new(seed).shuffle(&mut order);
            proptest::prop_assert_eq!(check_pod(&n, &r), fit_pod(&n, &r, &order).map(|_| ()));
        }
    }
}

//! ResourceQuota accounting for GPU slices, per namespace (spec §3 "Quota").
//!
//! A `ResourceQuota` may cap `limits.<gpumem>` (MiB, in the units users
//! write, so scaled by `memoryFactor` before comparing) and
//! `limits.<gpucores>` (percent of a card, summed). Several quotas in one
//! namespace all apply, so the tightest limit of each key wins, as
//! Kubernetes enforces them. A limit of 0 is a limit: nothing may be used.
//!
//! A pod uses, per key, the larger of its app containers summed and its
//! largest init container (init containers run one at a time before the app
//! containers; the rule is [`proto::accounting`]), each container counting
//! its amount per GPU times its GPU count; this is the effective pod request
//! Kubernetes charges to a quota.
//!
//! [`QuotaBook`] holds the limits and each namespace's use, the sum of what
//! its pods (reserved or allocated) are charged; which pod is charged what
//! is kept in the scheduler's one record per pod, which replaces a charge
//! rather than doubling it and takes it back at once when the pod goes. [`QuotaRoom`] is what is left for one
//! pod: the filter skips a GPU whose pick would exceed it
//! ([`crate::core::fit::Reason::ResourceQuotaNotFit`]), and the admission
//! webhook refuses a pod whose own request already does.
//!
//! Pure: no kube types, no I/O.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use proto::accounting::{Amount, Role, pod_total};
use proto::hami::pod_devices::PodDevices;
use proto::hami::resources::ResourceNames;

pub use crate::core::request::QuotaRoom;
use crate::core::request::{DeviceRequest, MemoryRequest, PodRequest};

/// The limits one `ResourceQuota` (or the tightest of several) sets on our
/// two keys, as written (memory not yet scaled by `memoryFactor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaLimits {
    /// `limits.<gpumem>`, MiB as users write it.
    pub memory_mib: Option<u64>,
    /// `limits.<gpucores>`, percent.
    pub cores: Option<u64>,
}

impl QuotaLimits {
    /// Whether neither key is limited.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.memory_mib.is_none() && self.cores.is_none()
    }

    /// The tighter of two limits, key by key.
    #[must_use]
    pub fn tightest(self, other: Self) -> Self {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        Self {
            memory_mib: min(self.memory_mib, other.memory_mib),
            cores: min(self.cores, other.cores),
        }
    }
}

/// What a pod, or a namespace, uses of the two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaUse {
    /// Device memory, MiB (after `memoryFactor`).
    pub memory_mib: u64,
    /// Cores, percent.
    pub cores: u64,
}

impl Amount for QuotaUse {
    fn plus(self, other: Self) -> Self {
        Self {
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            cores: self.cores.saturating_add(other.cores),
        }
    }

    fn peak(self, other: Self) -> Self {
        Self {
            memory_mib: self.memory_mib.max(other.memory_mib),
            cores: self.cores.max(other.cores),
        }
    }
}

impl QuotaUse {
    fn minus(self, other: Self) -> Self {
        Self {
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
            cores: self.cores.saturating_sub(other.cores),
        }
    }

    /// The effective use of containers given as per-container uses, the
    /// first `init_count` being init containers ([`proto::accounting`]).
    fn effective(per_container: impl Iterator<Item = Self>, init_count: usize) -> Self {
        pod_total(
            per_container
                .enumerate()
                .map(|(i, u)| (Role::of_index(i, init_count), u)),
        )
    }

    /// What an allocation uses: every slice of every container (init
    /// containers first, `init_count` of them).
    #[must_use]
    pub fn of_devices(devices: &PodDevices, init_count: usize) -> Self {
        Self::effective(
            devices.0.iter().map(|container| {
                container.iter().fold(Self::default(), |acc, d| {
                    acc.plus(Self {
                        memory_mib: u64::try_from(d.usedmem).unwrap_or(0),
                        cores: u64::try_from(d.usedcores).unwrap_or(0),
                    })
                })
            }),
            init_count,
        )
    }

    /// What a pod asks before any card is chosen: memory × GPU count per
    /// container. A percentage of a card (or the whole card) depends on the
    /// card, so it counts as 0 here and is checked when a GPU is picked.
    #[must_use]
    pub fn of_request(req: &PodRequest) -> Self {
        let one = |r: &Option<DeviceRequest>| {
            r.map_or_else(Self::default, |r| {
                let nums = u64::from(r.nums);
                Self {
                    memory_mib: match r.memory {
                        MemoryRequest::Mib(m) => m.saturating_mul(nums),
                        MemoryRequest::Percent(_) => 0,
                    },
                    cores: u64::from(r.cores.min(100)).saturating_mul(nums),
                }
            })
        };
        Self::effective(req.init.iter().chain(&req.app).map(one), req.init.len())
    }
}

/// One namespace's limits and use, for the webhook and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaStatus {
    /// The namespace.
    pub namespace: String,
    /// The tightest limits, as written.
    pub limits: QuotaLimits,
    /// What pods in the namespace hold or reserved.
    pub used: QuotaUse,
    /// `memoryFactor` the memory limit is scaled by.
    pub memory_factor: u64,
}

impl QuotaStatus {
    /// The memory limit in device MiB (scaled by `memoryFactor`).
    #[must_use]
    pub fn memory_limit_mib(&self) -> Option<u64> {
        self.limits
            .memory_mib
            .map(|m| m.saturating_mul(self.memory_factor))
    }

    /// What is left for one more pod.
    #[must_use]
    pub fn room(&self) -> QuotaRoom {
        QuotaRoom {
            memory_mib: self
                .memory_limit_mib()
                .map(|l| l.saturating_sub(self.used.memory_mib)),
            cores: self.limits.cores.map(|l| l.saturating_sub(self.used.cores)),
        }
    }

    /// Why a pod asking `ask` cannot fit, when it cannot.
    #[must_use]
    pub fn refuse(&self, ask: QuotaUse) -> Option<QuotaExceeded> {
        let room = self.room();
        if let (Some(left), Some(limit)) = (room.memory_mib, self.memory_limit_mib())
            && ask.memory_mib > left
        {
            return Some(QuotaExceeded {
                namespace: self.namespace.clone(),
                key: QuotaKey::Memory,
                asked: ask.memory_mib,
                left,
                limit,
            });
        }
        if let (Some(left), Some(limit)) = (room.cores, self.limits.cores)
            && ask.cores > left
        {
            return Some(QuotaExceeded {
                namespace: self.namespace.clone(),
                key: QuotaKey::Cores,
                asked: ask.cores,
                left,
                limit,
            });
        }
        None
    }
}

/// Which quota key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKey {
    /// `limits.<gpumem>`.
    Memory,
    /// `limits.<gpucores>`.
    Cores,
}

/// A pod asks more than its namespace has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// The namespace.
    pub namespace: String,
    /// The key exceeded.
    pub key: QuotaKey,
    /// What the pod asks (device MiB or percent).
    pub asked: u64,
    /// What is left.
    pub left: u64,
    /// The limit (device MiB or percent).
    pub limit: u64,
}

impl QuotaExceeded {
    /// The message a user reads, e.g. `namespace "team-a" quota
    /// limits.nvidia.com/gpumem: pod asks 8000 MiB, 2000 of 6000 MiB left`.
    #[must_use]
    pub fn message(&self, names: &ResourceNames) -> String {
        let (resource, unit) = match self.key {
            QuotaKey::Memory => (&names.resource_mem, " MiB"),
            QuotaKey::Cores => (&names.resource_cores, "%"),
        };
        format!(
            "namespace {:?} quota limits.{resource}: pod asks {}{unit}, {} of {}{unit} left",
            self.namespace, self.asked, self.left, self.limit
        )
    }
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message(&ResourceNames::default()))
    }
}

/// Every namespace's quota limits and use.
#[derive(Debug, Clone, Default)]
pub struct QuotaBook {
    memory_factor: u64,
    /// Namespace → quota object name → its limits.
    quotas: HashMap<String, BTreeMap<String, QuotaLimits>>,
    /// Namespace → the sum of its pods' charges.
    used: HashMap<String, QuotaUse>,
}

impl QuotaBook {
    /// An empty book; memory limits are scaled by `memory_factor`.
    #[must_use]
    pub fn new(memory_factor: u32) -> Self {
        Self {
            memory_factor: u64::from(memory_factor.max(1)),
            ..Self::default()
        }
    }

    /// Records (or replaces) one quota object's limits; an object limiting
    /// neither key is forgotten.
    pub fn set_quota(&mut self, namespace: &str, name: &str, limits: QuotaLimits) {
        if limits.is_empty() {
            self.remove_quota(namespace, name);
            return;
        }
        self.quotas
            .entry(namespace.to_owned())
            .or_default()
            .insert(name.to_owned(), limits);
    }

    /// Forgets one quota object; harmless when unknown.
    pub fn remove_quota(&mut self, namespace: &str, name: &str) {
        if let Some(objects) = self.quotas.get_mut(namespace) {
            objects.remove(name);
            if objects.is_empty() {
                self.quotas.remove(namespace);
            }
        }
    }

    /// Every quota object known, as (namespace, name).
    pub fn quota_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.quotas
            .iter()
            .flat_map(|(ns, objects)| objects.keys().map(move |n| (ns.as_str(), n.as_str())))
    }

    /// The tightest limits in a namespace, as written.
    #[must_use]
    pub fn limits(&self, namespace: &str) -> QuotaLimits {
        self.quotas
            .get(namespace)
            .into_iter()
            .flat_map(BTreeMap::values)
            .fold(QuotaLimits::default(), |acc, l| acc.tightest(*l))
    }

    /// What a namespace's pods hold or reserved.
    #[must_use]
    pub fn used(&self, namespace: &str) -> QuotaUse {
        self.used.get(namespace).copied().unwrap_or_default()
    }

    /// A namespace's limits and use.
    #[must_use]
    pub fn status(&self, namespace: &str) -> QuotaStatus {
        QuotaStatus {
            namespace: namespace.to_owned(),
            limits: self.limits(namespace),
            used: self.used(namespace),
            memory_factor: self.memory_factor,
        }
    }

    /// Every namespace with a limit or a use, sorted by name.
    #[must_use]
    pub fn statuses(&self) -> Vec<QuotaStatus> {
        let mut names: Vec<&String> = self.quotas.keys().chain(self.used.keys()).collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|ns| self.status(ns)).collect()
    }

    /// What is left for one pod in `namespace`; `None` when the namespace
    /// limits neither key (the filter then pays nothing for quotas).
    #[must_use]
    pub fn room(&self, namespace: &str) -> Option<QuotaRoom> {
        if !self.quotas.contains_key(namespace) {
            return None;
        }
        Some(self.status(namespace).room())
    }

    /// Adds one pod's charge to its namespace's use. The book keeps sums
    /// only: who is charged what is the caller's record (the scheduler's
    /// `PodBook`), which takes back exactly what it added.
    pub fn add_use(&mut self, namespace: &str, usage: QuotaUse) {
        if usage == QuotaUse::default() {
            return;
        }
        let total = self.used.entry(namespace.to_owned()).or_default();
        *total = total.plus(usage);
    }

    /// Takes one pod's charge back from its namespace's use.
    pub fn remove_use(&mut self, namespace: &str, usage: QuotaUse) {
        if usage == QuotaUse::default() {
            return;
        }
        if let Some(total) = self.used.get_mut(namespace) {
            *total = total.minus(usage);
            if *total == QuotaUse::default() {
                self.used.remove(namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proto::hami::pod_devices::ContainerDevice;

    use super::*;

    fn limits(mem: Option<u64>, cores: Option<u64>) -> QuotaLimits {
        QuotaLimits {
            memory_mib: mem,
            cores,
        }
    }

    fn req(nums: u32, mem: u64, cores: u32) -> Option<DeviceRequest> {
        Some(DeviceRequest {
            nums,
            memory: MemoryRequest::Mib(mem),
            cores,
        })
    }

    #[test]
    fn the_tightest_of_several_quotas_wins_key_by_key() {
        let mut book = QuotaBook::new(1);
        book.set_quota("a", "big", limits(Some(10_000), Some(50)));
        book.set_quota("a", "small", limits(Some(4000), None));
        assert_eq!(book.limits("a"), limits(Some(4000), Some(50)));
        book.remove_quota("a", "small");
        assert_eq!(book.limits("a"), limits(Some(10_000), Some(50)));
        book.remove_quota("a", "big");
        assert_eq!(book.room("a"), None, "no quota left: unlimited");
    }

    #[test]
    fn uses_add_up_per_namespace_and_room_follows() {
        let mut book = QuotaBook::new(1);
        book.set_quota("a", "q", limits(Some(6000), Some(100)));
        let use_ = |m, c| QuotaUse {
            memory_mib: m,
            cores: c,
        };
        book.add_use("a", use_(3000, 30));
        book.add_use("a", use_(1000, 10));
        book.add_use("b", use_(9999, 99));
        assert_eq!(book.used("a"), use_(4000, 40));
        assert_eq!(
            book.room("a"),
            Some(QuotaRoom {
                memory_mib: Some(2000),
                cores: Some(60)
            })
        );
        book.remove_use("a", use_(3000, 30));
        assert_eq!(book.used("a"), use_(1000, 10));
        book.remove_use("a", use_(1000, 10));
        assert_eq!(book.statuses().len(), 2, "a (quota) and b (use)");
        assert_eq!(book.used("a"), QuotaUse::default());
    }

    #[test]
    fn memory_limit_is_scaled_by_the_memory_factor() {
        let mut book = QuotaBook::new(4);
        book.set_quota("a", "q", limits(Some(10), None));
        book.add_use(
            "a",
            QuotaUse {
                memory_mib: 12,
                cores: 0,
            },
        );
        assert_eq!(book.room("a").unwrap().memory_mib, Some(28));
        assert_eq!(book.room("a").unwrap().cores, None);
    }

    #[test]
    fn a_zero_limit_admits_nothing_and_overuse_leaves_no_room() {
        let mut book = QuotaBook::new(1);
        book.set_quota("a", "q", limits(Some(0), None));
        let room = book.room("a").unwrap();
        assert!(!room.admits(1, 0));
        assert!(room.admits(0, 100));
        book.set_quota("a", "q", limits(Some(100), None));
        book.add_use(
            "a",
            QuotaUse {
                memory_mib: 500,
                cores: 0,
            },
        );
        assert_eq!(book.room("a").unwrap().memory_mib, Some(0));
    }

    #[test]
    fn a_request_counts_mem_times_nums_and_init_containers_at_their_peak() {
        let pod = PodRequest {
            init: vec![req(1, 5000, 10)],
            app: vec![req(2, 1000, 20), None, req(1, 500, 5)],
            ..PodRequest::default()
        };
        // app: 2×1000 + 500 = 2500 MiB, 2×20 + 5 = 45 %; init peak 5000 MiB, 10 %.
        assert_eq!(
            QuotaUse::of_request(&pod),
            QuotaUse {
                memory_mib: 5000,
                cores: 45
            }
        );
        let pct = PodRequest {
            app: vec![Some(DeviceRequest {
                nums: 1,
                memory: MemoryRequest::Percent(50),
                cores: 30,
            })],
            ..PodRequest::default()
        };
        assert_eq!(
            QuotaUse::of_request(&pct),
            QuotaUse {
                memory_mib: 0,
                cores: 30
            }
        );
    }

    #[test]
    fn an_allocation_counts_every_slice() {
        let dev = |mem, cores| ContainerDevice {
            uuid: "GPU-a".into(),
            vendor: "NVIDIA".into(),
            usedmem: mem,
            usedcores: cores,
        };
        let devices = PodDevices(vec![
            vec![dev(4000, 10)],
            vec![dev(1000, 20), dev(1000, 20)],
            vec![],
        ]);
        assert_eq!(
            QuotaUse::of_devices(&devices, 1),
            QuotaUse {
                memory_mib: 4000,
                cores: 40
            }
        );
        assert_eq!(
            QuotaUse::of_devices(&devices, 0),
            QuotaUse {
                memory_mib: 6000,
                cores: 50
            }
        );
    }

    // === fit with a quota (the filter's view) ===

    use crate::core::fit::{Reason, fit_container, fit_pod};
    use crate::core::model::testutil::mk_node;
    use crate::core::request::Constraints;

    fn with_room(mem: Option<u64>, cores: Option<u64>) -> Constraints {
        Constraints {
            quota: Some(QuotaRoom {
                memory_mib: mem,
                cores,
            }),
            ..Constraints::default()
        }
    }

    fn order(n: usize) -> Vec<usize> {
        (0..n).collect()
    }

    #[test]
    fn quota_blocks_every_gpu_with_resource_quota_not_fit() {
        let n = mk_node("a", 4, 10, 1000);
        let r = req(1, 200, 10).unwrap();
        let f =
            fit_container(&n, &n.usage, &order(4), &r, &with_room(Some(150), None)).unwrap_err();
        assert_eq!(f.count(Reason::ResourceQuotaNotFit), 4);
        assert_eq!(f.to_string(), "4/4 ResourceQuotaNotFit");
        let f = fit_container(&n, &n.usage, &order(4), &r, &with_room(None, Some(5))).unwrap_err();
        assert_eq!(f.to_string(), "4/4 ResourceQuotaNotFit", "cores room");
        // Exactly the room fits.
        assert!(
            fit_container(&n, &n.usage, &order(4), &r, &with_room(Some(200), Some(10))).is_ok()
        );
    }

    #[test]
    fn quota_counts_mem_times_nums_within_a_container() {
        let n = mk_node("a", 4, 10, 1000);
        let r = req(2, 200, 0).unwrap();
        let f =
            fit_container(&n, &n.usage, &order(4), &r, &with_room(Some(250), None)).unwrap_err();
        assert_eq!(
            f.to_string(),
            "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"
        );
        let p = fit_container(&n, &n.usage, &order(4), &r, &with_room(Some(400), None)).unwrap();
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn quota_is_shared_by_app_containers_and_not_summed_with_init_containers() {
        let n = mk_node("a", 2, 10, 1000);
        let apps = PodRequest {
            app: vec![req(1, 200, 0), None, req(1, 200, 0)],
            constraints: with_room(Some(300), None),
            ..PodRequest::default()
        };
        let f = fit_pod(&n, &apps, &order(2)).unwrap_err();
        assert_eq!(
            f.to_string(),
            "2/2 ResourceQuotaNotFit",
            "second container over"
        );
        let init_and_app = PodRequest {
            init: vec![req(1, 300, 0)],
            app: vec![req(1, 300, 0)],
            constraints: with_room(Some(300), None),
            ..PodRequest::default()
        };
        assert!(fit_pod(&n, &init_and_app, &order(2)).is_ok());
    }

    #[test]
    fn memory_factor_scales_the_request_and_the_limit_alike() {
        use crate::core::request::{ContainerLite, PodSpecLite, RequestConfig};

        let cfg = RequestConfig {
            memory_factor: 4,
            ..RequestConfig::default()
        };
        let spec = PodSpecLite {
            containers: vec![ContainerLite {
                name: "c".into(),
                limits: [("nvidia.com/gpu", 1), ("nvidia.com/gpumem", 100)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                requests: BTreeMap::new(),
            }],
            ..PodSpecLite::default()
        };
        let n = mk_node("a", 1, 10, 1000);
        for (limit, fits) in [(100, true), (99, false)] {
            let mut book = QuotaBook::new(4);
            book.set_quota("ns", "q", limits(Some(limit), None));
            let mut pod = PodRequest::from_pod(&spec, &cfg).unwrap();
            pod.constraints.quota = book.room("ns");
            assert_eq!(fit_pod(&n, &pod, &[0]).is_ok(), fits, "limit {limit}");
            assert_eq!(QuotaUse::of_request(&pod).memory_mib, 400);
        }
    }

    #[test]
    fn without_a_quota_fit_is_unchanged() {
        let mut n = mk_node("a", 4, 10, 1000);
        n.usage[1].usedmem = 900;
        let pod = PodRequest {
            app: vec![req(2, 200, 10), req(1, 100, 10)],
            ..PodRequest::default()
        };
        let unlimited = PodRequest {
            constraints: with_room(None, None),
            ..pod.clone()
        };
        let plenty = PodRequest {
            constraints: with_room(Some(1 << 40), Some(1 << 40)),
            ..pod.clone()
        };
        let want = fit_pod(&n, &pod, &order(4)).unwrap();
        assert_eq!(fit_pod(&n, &unlimited, &order(4)).unwrap(), want);
        assert_eq!(fit_pod(&n, &plenty, &order(4)).unwrap(), want);
    }

    #[test]
    fn fgd_skips_gpus_over_quota_too() {
        use crate::core::fgd::{FgdIndex, ShapeDistribution};
        use crate::core::model::Cluster;
        use crate::core::policy::{Policy, ScheduleError, SchedulerConfig, schedule};
        use crate::core::rng::SplitMix64;

        let cluster = Cluster::new(vec![mk_node("a", 2, 10, 1000)]);
        let dist = ShapeDistribution::default();
        let mut index = FgdIndex::new(&dist, &cluster);
        let cfg = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let pod = PodRequest {
            app: vec![req(1, 200, 10)],
            constraints: with_room(Some(100), None),
            ..PodRequest::default()
        };
        let got = schedule(
            &cluster,
            &pod,
            [0],
            &cfg,
            Some(&mut index),
            &mut SplitMix64::new(1),
        );
        let Err(ScheduleError::NoNodeFits { failed }) = got else {
            panic!("expected no fit, got {got:?}");
        };
        assert_eq!(failed[0].1.to_string(), "2/2 ResourceQuotaNotFit");
    }

    #[test]
    fn the_refusal_message_names_namespace_key_and_numbers() {
        let mut book = QuotaBook::new(1);
        book.set_quota("team-a", "q", limits(Some(6000), Some(100)));
        book.add_use(
            "team-a",
            QuotaUse {
                memory_mib: 4000,
                cores: 10,
            },
        );
        let status = book.status("team-a");
        let exceeded = status
            .refuse(QuotaUse {
                memory_mib: 8000,
                cores: 10,
            })
            .unwrap();
        assert_eq!(
            exceeded.message(&ResourceNames::default()),
            "namespace \"team-a\" quota limits.nvidia.com/gpumem: pod asks 8000 MiB, 2000 of 6000 MiB left"
        );
        let exceeded = status
            .refuse(QuotaUse {
                memory_mib: 100,
                cores: 95,
            })
            .unwrap();
        assert_eq!(exceeded.key, QuotaKey::Cores);
        assert!(
            status
                .refuse(QuotaUse {
                    memory_mib: 2000,
                    cores: 90
                })
                .is_none()
        );
    }
}

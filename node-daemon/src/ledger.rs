//! The slice ledger of one physical GPU: which container holds how much of
//! it (one slot, MiB of memory, percent of compute), keyed by pod UID and
//! container index. Pure: no actix, no I/O; `GpuActor` is its only owner.
//!
//! A pod's use of the GPU is counted as the scheduler counts it (spec §5,
//! `scheduler-webhook::core::reservation`), by the one rule both share,
//! [`proto::accounting`]: its app containers summed (one slot each), its
//! init containers at their peak (one slot), and the pod holds the larger of
//! the two per dimension, since init containers finish before app containers
//! start.
//!
//! Invariant, kept by construction: the GPU's usage (the sum of every pod's
//! use) never exceeds its capacity (slots = `deviceSplitCount`, memory,
//! cores). A commit that would break it is refused with a typed
//! [`LedgerError`] and leaves the ledger unchanged. The scheduler's exclusivity rules (spec §5: a 100 %
//! core slice needs an otherwise empty card; a 0 % slice cannot join a card
//! whose cores are all taken) are enforced too, so the node never accepts
//! what HAMi's filter would refuse.
//!
//! DRA claims ([`SliceLedger::commit_claim`]) are a second kind of holder,
//! kept apart from the device-plugin containers (keyed by claim UID, never
//! freed by a pod snapshot) but counted in the same usage: a claim's memory
//! and cores add to the GPU's, so a GPU is never over-committed across both
//! paths. A claim takes no slot (slots are the device-plugin's
//! `deviceSplitCount`, which kube-scheduler's allocator does not know) and
//! is checked against memory and cores only, the two capacities the
//! `ResourceSlice` publishes; a device-plugin slice sharing the card with
//! claims sees each claim as a holder for the exclusivity rules.
//!
//! Freeing by exclusion ([`SliceLedger::release_pods_except`]) takes a
//! [`LiveSnapshot`]: the pods alive on the node as of a list, stamped with
//! the [`Epoch`] read before that list was requested. Every holding carries
//! the epoch it was committed at, and a snapshot never frees a holding
//! committed after it: that pod may have been bound after the list, and its
//! absence from the list says nothing about it.

use std::collections::{BTreeMap, BTreeSet};

use proto::accounting::{Amount, Role, pod_total};

pub use crate::epoch::Epoch;

/// Who holds a slice: a pod UID and the container's index in HAMi's order
/// (init containers first, then app containers).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceKey {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container index (init containers first).
    pub container: usize,
}

/// What one container holds of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slice {
    /// Device memory in MiB.
    pub memory_mib: u32,
    /// Compute in percent.
    pub cores: u32,
    /// Held by an init container (counted at the pod's init peak).
    pub init: bool,
}

/// What a GPU offers: slots, memory and cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// How many containers may share the GPU.
    pub slots: u32,
    /// Device memory in MiB.
    pub memory_mib: u32,
    /// Compute in percent (100 = one card).
    pub cores: u32,
}

/// What is held of a GPU: sums over every holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Holdings (one slot each).
    pub slots: u32,
    /// Memory held, MiB.
    pub memory_mib: u64,
    /// Cores held, percent.
    pub cores: u64,
}

impl Amount for Usage {
    fn plus(self, other: Self) -> Self {
        Self {
            slots: self.slots.saturating_add(other.slots),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
            cores: self.cores.saturating_add(other.cores),
        }
    }

    fn peak(self, other: Self) -> Self {
        Self {
            slots: self.slots.max(other.slots),
            memory_mib: self.memory_mib.max(other.memory_mib),
            cores: self.cores.max(other.cores),
        }
    }
}

/// The outcome of a successful commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The slice is now held.
    New,
    /// The key already held exactly this slice (a replay, e.g. after a
    /// restart rebuilt the ledger); nothing changed.
    AlreadyHeld,
}

/// Why a commit was refused. The ledger is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Every slot is taken.
    #[error("all {slots} slots are taken")]
    NoSlot {
        /// The split count.
        slots: u32,
    },
    /// Not enough free memory.
    #[error("{requested} MiB requested, {free} MiB free")]
    Memory {
        /// Requested MiB.
        requested: u32,
        /// Free MiB.
        free: u64,
    },
    /// Not enough free cores.
    #[error("{requested}% cores requested, {free}% free")]
    Cores {
        /// Requested percent.
        requested: u32,
        /// Free percent.
        free: u64,
    },
    /// A whole-card (100 %) slice on a card someone else uses.
    #[error("100% cores needs the card to itself; {holders} slice(s) already on it")]
    Exclusive {
        /// Holdings already on the card.
        holders: u32,
    },
    /// A 0 % slice on a card whose cores are all taken.
    #[error("every core of the card is taken; a 0% slice cannot share it")]
    CoresExhausted,
    /// The key already holds a different slice.
    #[error("pod {} container {} already holds {held:?}, not {requested:?}", key.pod_uid, key.container)]
    Conflict {
        /// The key.
        key: SliceKey,
        /// What it holds.
        held: Slice,
        /// What was asked.
        requested: Slice,
    },
}

/// What one DRA claim holds of one GPU (the sum of its allocation results
/// on that GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimSlice {
    /// Device memory in MiB.
    pub memory_mib: u32,
    /// Compute in percent.
    pub cores: u32,
}

/// Why a claim's commit was refused. The ledger is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Not enough free memory.
    #[error("{requested} MiB requested, {free} MiB free")]
    Memory {
        /// Requested MiB.
        requested: u32,
        /// Free MiB.
        free: u64,
    },
    /// Not enough free cores.
    #[error("{requested}% cores requested, {free}% free")]
    Cores {
        /// Requested percent.
        requested: u32,
        /// Free percent.
        free: u64,
    },
    /// The claim already holds a different slice of this GPU.
    #[error("claim {claim_uid} already holds {held:?}, not {requested:?}")]
    Conflict {
        /// The claim's UID.
        claim_uid: String,
        /// What it holds.
        held: ClaimSlice,
        /// What was asked.
        requested: ClaimSlice,
    },
}

/// The pods alive on the node as of one list, and when that list was
/// requested.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveSnapshot {
    /// UIDs of the pods alive (not deleted, not finished) in the list.
    pub live: BTreeSet<String>,
    /// The commit clock's reading before the list was requested.
    pub taken_at: Epoch,
}

/// One holding: the slice and the epoch it was committed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    slice: Slice,
    since: Epoch,
}

/// The ledger of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceLedger {
    capacity: Capacity,
    held: BTreeMap<SliceKey, Held>,
    /// DRA claims by UID.
    claims: BTreeMap<String, ClaimSlice>,
    /// Device-plugin holdings and claims together (claims take no slot).
    usage: Usage,
}

impl SliceLedger {
    /// An empty ledger for a GPU of `capacity`.
    #[must_use]
    pub fn new(capacity: Capacity) -> Self {
        Self {
            capacity,
            held: BTreeMap::new(),
            claims: BTreeMap::new(),
            usage: Usage::default(),
        }
    }

    /// The GPU's capacity.
    #[must_use]
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// The sums over every holding.
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Every DRA claim held, by claim UID.
    pub fn claims(&self) -> impl Iterator<Item = (&String, &ClaimSlice)> {
        self.claims.iter()
    }

    /// Holds `slice` for DRA claim `claim_uid`, or refuses and changes
    /// nothing: the memory and cores of every holder (claims and
    /// device-plugin containers) must stay within the capacity.
    ///
    /// # Errors
    /// [`ClaimError`]: which capacity would be exceeded, or a different
    /// slice already held by the claim.
    pub fn commit_claim(
        &mut self,
        claim_uid: &str,
        slice: ClaimSlice,
    ) -> Result<Committed, ClaimError> {
        if let Some(held) = self.claims.get(claim_uid) {
            return if *held == slice {
                Ok(Committed::AlreadyHeld)
            } else {
                Err(ClaimError::Conflict {
                    claim_uid: claim_uid.to_owned(),
                    held: *held,
                    requested: slice,
                })
            };
        }
        let memory = self.usage.memory_mib + u64::from(slice.memory_mib);
        let cores = self.usage.cores + u64::from(slice.cores);
        if memory > u64::from(self.capacity.memory_mib) {
            return Err(ClaimError::Memory {
                requested: slice.memory_mib,
                free: u64::from(self.capacity.memory_mib).saturating_sub(self.usage.memory_mib),
            });
        }
        if cores > u64::from(self.capacity.cores) {
            return Err(ClaimError::Cores {
                requested: slice.cores,
                free: u64::from(self.capacity.cores).saturating_sub(self.usage.cores),
            });
        }
        self.usage.memory_mib = memory;
        self.usage.cores = cores;
        self.claims.insert(claim_uid.to_owned(), slice);
        Ok(Committed::New)
    }

    /// Frees what DRA claim `claim_uid` holds; `None` if it held nothing.
    pub fn release_claim(&mut self, claim_uid: &str) -> Option<ClaimSlice> {
        let slice = self.claims.remove(claim_uid)?;
        self.usage.memory_mib -= u64::from(slice.memory_mib);
        self.usage.cores -= u64::from(slice.cores);
        Some(slice)
    }

    /// Every holding, in key order.
    pub fn holdings(&self) -> impl Iterator<Item = (&SliceKey, &Slice)> {
        self.held.iter().map(|(k, h)| (k, &h.slice))
    }

    /// One pod's use: app slices summed, init slices at their peak, the
    /// larger of the two per dimension ([`proto::accounting`], the rule the
    /// scheduler counts by).
    #[must_use]
    pub fn pod_use<'a>(slices: impl IntoIterator<Item = &'a Slice>) -> Usage {
        pod_total(slices.into_iter().map(|s| {
            let role = if s.init { Role::Init } else { Role::App };
            let usage = Usage {
                slots: 1,
                memory_mib: u64::from(s.memory_mib),
                cores: u64::from(s.cores),
            };
            (role, usage)
        }))
    }

    fn slices_of<'a>(&'a self, pod_uid: &'a str) -> impl Iterator<Item = &'a Slice> + 'a {
        self.held
            .iter()
            .filter(move |(k, _)| k.pod_uid == pod_uid)
            .map(|(_, h)| &h.slice)
    }

    /// The usage without pod `pod_uid`.
    fn others(&self, pod_uid: &str) -> Usage {
        let own = Self::pod_use(self.slices_of(pod_uid));
        Usage {
            slots: self.usage.slots - own.slots,
            memory_mib: self.usage.memory_mib - own.memory_mib,
            cores: self.usage.cores - own.cores,
        }
    }

    /// Whether `key` (holding nothing yet) could hold `slice` now; returns
    /// the usage it would leave.
    ///
    /// # Errors
    /// The [`LedgerError`] a commit would return.
    pub fn check(&self, key: &SliceKey, slice: Slice) -> Result<Usage, LedgerError> {
        let Capacity {
            slots,
            memory_mib,
            cores,
        } = self.capacity;
        let others = self.others(&key.pod_uid);
        let own = Self::pod_use(self.slices_of(&key.pod_uid).chain([&slice]));
        let after = Usage {
            slots: others.slots + own.slots,
            memory_mib: others.memory_mib + own.memory_mib,
            cores: others.cores + own.cores,
        };
        if after.slots > slots {
            return Err(LedgerError::NoSlot { slots });
        }
        if after.memory_mib > u64::from(memory_mib) {
            return Err(LedgerError::Memory {
                requested: slice.memory_mib,
                free: u64::from(memory_mib).saturating_sub(self.usage.memory_mib),
            });
        }
        if after.cores > u64::from(cores) {
            return Err(LedgerError::Cores {
                requested: slice.cores,
                free: u64::from(cores).saturating_sub(self.usage.cores),
            });
        }
        // The filter's sharing rules look at what the slice would share the
        // card with: other pods, and for an app slice this pod's app slices.
        let sharing = if slice.init {
            others
        } else {
            let own_app = Self::pod_use(self.slices_of(&key.pod_uid).filter(|s| !s.init));
            Usage {
                slots: others.slots + own_app.slots,
                memory_mib: others.memory_mib + own_app.memory_mib,
                cores: others.cores + own_app.cores,
            }
        };
        let holders = sharing.slots + u32::try_from(self.claims.len()).unwrap_or(u32::MAX);
        if cores == 100 && slice.cores == 100 && holders > 0 {
            return Err(LedgerError::Exclusive { holders });
        }
        if slice.cores == 0 && cores > 0 && sharing.cores >= u64::from(cores) {
            return Err(LedgerError::CoresExhausted);
        }
        Ok(after)
    }

    /// Holds `slice` for `key` from epoch `at`, or refuses and changes
    /// nothing. A replay keeps the epoch of the first commit.
    ///
    /// # Errors
    /// A [`LedgerError`] saying which limit the slice would break, or
    /// [`LedgerError::Conflict`] when `key` holds a different slice.
    pub fn commit(
        &mut self,
        key: SliceKey,
        slice: Slice,
        at: Epoch,
    ) -> Result<Committed, LedgerError> {
        if let Some(Held { slice: held, .. }) = self.held.get(&key) {
            return if *held == slice {
                Ok(Committed::AlreadyHeld)
            } else {
                Err(LedgerError::Conflict {
                    key,
                    held: *held,
                    requested: slice,
                })
            };
        }
        self.usage = self.check(&key, slice)?;
        self.held.insert(key, Held { slice, since: at });
        Ok(Committed::New)
    }

    /// Frees what `key` holds; `None` if it held nothing.
    pub fn release(&mut self, key: &SliceKey) -> Option<Slice> {
        let others = self.others(&key.pod_uid);
        let Held { slice, .. } = self.held.remove(key)?;
        let own = Self::pod_use(self.slices_of(&key.pod_uid));
        self.usage = Usage {
            slots: others.slots + own.slots,
            memory_mib: others.memory_mib + own.memory_mib,
            cores: others.cores + own.cores,
        };
        Some(slice)
    }

    /// Frees every slice of pod `pod_uid`; returns how many were held.
    pub fn release_pod(&mut self, pod_uid: &str) -> usize {
        let keys: Vec<SliceKey> = self
            .held
            .keys()
            .filter(|k| k.pod_uid == pod_uid)
            .cloned()
            .collect();
        keys.iter().filter(|k| self.release(k).is_some()).count()
    }

    /// Frees every slice of pods not alive in `snapshot` (deleted or
    /// finished pods) that was committed at or before the snapshot's epoch;
    /// returns how many were freed. A slice committed after the snapshot
    /// was taken is kept whatever the snapshot says: its pod may have been
    /// bound after the list was read.
    pub fn release_pods_except(&mut self, snapshot: &LiveSnapshot) -> usize {
        let keys: Vec<SliceKey> = self
            .held
            .iter()
            .filter(|(k, h)| h.since <= snapshot.taken_at && !snapshot.live.contains(&k.pod_uid))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter(|k| self.release(k).is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The epoch of the commits of tests that do not look at epochs.
    const AT: Epoch = Epoch(1);

    fn key(pod: &str, container: usize) -> SliceKey {
        SliceKey {
            pod_uid: pod.into(),
            container,
        }
    }

    fn slice(memory_mib: u32, cores: u32) -> Slice {
        Slice {
            memory_mib,
            cores,
            init: false,
        }
    }

    fn init_slice(memory_mib: u32, cores: u32) -> Slice {
        Slice {
            init: true,
            ..slice(memory_mib, cores)
        }
    }

    fn gpu(slots: u32, memory_mib: u32, cores: u32) -> SliceLedger {
        SliceLedger::new(Capacity {
            slots,
            memory_mib,
            cores,
        })
    }

    #[test]
    fn each_limit_is_named_when_exceeded() {
        let mut l = gpu(2, 1000, 100);
        assert_eq!(
            l.commit(key("a", 0), slice(600, 30), AT),
            Ok(Committed::New)
        );
        assert_eq!(
            l.commit(key("b", 0), slice(500, 10), AT),
            Err(LedgerError::Memory {
                requested: 500,
                free: 400
            })
        );
        assert_eq!(
            l.commit(key("b", 0), slice(100, 80), AT),
            Err(LedgerError::Cores {
                requested: 80,
                free: 70
            })
        );
        assert_eq!(
            l.commit(key("b", 0), slice(100, 10), AT),
            Ok(Committed::New)
        );
        assert_eq!(
            l.commit(key("c", 0), slice(1, 1), AT),
            Err(LedgerError::NoSlot { slots: 2 })
        );
        assert_eq!(
            l.usage(),
            Usage {
                slots: 2,
                memory_mib: 700,
                cores: 40
            }
        );
    }

    #[test]
    fn replaying_the_same_commit_is_idempotent_and_a_different_one_conflicts() {
        let mut l = gpu(4, 1000, 100);
        l.commit(key("a", 1), slice(100, 10), AT).unwrap();
        assert_eq!(
            l.commit(key("a", 1), slice(100, 10), AT),
            Ok(Committed::AlreadyHeld)
        );
        assert_eq!(l.usage().slots, 1);
        assert!(matches!(
            l.commit(key("a", 1), slice(200, 10), AT),
            Err(LedgerError::Conflict { .. })
        ));
    }

    fn claim(memory_mib: u32, cores: u32) -> ClaimSlice {
        ClaimSlice { memory_mib, cores }
    }

    #[test]
    fn claims_and_containers_are_kept_apart_and_counted_together() {
        let mut l = gpu(2, 1000, 100);
        assert_eq!(l.commit_claim("c1", claim(600, 30)), Ok(Committed::New));
        assert_eq!(
            l.commit_claim("c1", claim(600, 30)),
            Ok(Committed::AlreadyHeld)
        );
        assert!(matches!(
            l.commit_claim("c1", claim(100, 30)),
            Err(ClaimError::Conflict { .. })
        ));
        // A container sees the claim's memory and cores; a claim takes no slot.
        assert_eq!(
            l.commit(key("a", 0), slice(500, 10), AT),
            Err(LedgerError::Memory {
                requested: 500,
                free: 400
            })
        );
        l.commit(key("a", 0), slice(300, 10), AT).unwrap();
        l.commit(key("b", 0), slice(10, 10), AT).unwrap();
        // A claim sees the containers' memory and cores, not the slots.
        let before = l.clone();
        assert_eq!(
            l.commit_claim("c2", claim(100, 10)),
            Err(ClaimError::Memory {
                requested: 100,
                free: 90
            })
        );
        assert_eq!(
            l.commit_claim("c2", claim(90, 51)),
            Err(ClaimError::Cores {
                requested: 51,
                free: 50
            })
        );
        assert_eq!(l, before, "a refused claim changes nothing");
        l.commit_claim("c2", claim(90, 50)).unwrap();
        assert_eq!(
            l.usage(),
            Usage {
                slots: 2,
                memory_mib: 1000,
                cores: 100
            }
        );
        // A pod snapshot never frees a claim; releasing the pods keeps them.
        let nobody = LiveSnapshot {
            live: BTreeSet::new(),
            taken_at: AT,
        };
        assert_eq!(l.release_pods_except(&nobody), 2);
        assert_eq!(l.claims().count(), 2);
        assert_eq!(l.release_claim("c1"), Some(claim(600, 30)));
        assert_eq!(l.release_claim("c1"), None);
        assert_eq!(
            l.usage(),
            Usage {
                slots: 0,
                memory_mib: 90,
                cores: 50
            }
        );
        // A claim on the card is a holder for the whole-card rule.
        assert_eq!(
            l.commit(key("d", 0), slice(10, 100), AT),
            Err(LedgerError::Cores {
                requested: 100,
                free: 50
            })
        );
        l.release_claim("c2");
        l.commit_claim("c3", claim(10, 0)).unwrap();
        assert_eq!(
            l.commit(key("d", 0), slice(10, 100), AT),
            Err(LedgerError::Exclusive { holders: 1 })
        );
    }

    #[test]
    fn whole_card_slices_are_exclusive() {
        let mut l = gpu(10, 1000, 100);
        l.commit(key("a", 0), slice(100, 0), AT).unwrap();
        assert_eq!(
            l.commit(key("b", 0), slice(100, 100), AT),
            Err(LedgerError::Exclusive { holders: 1 })
        );
        l.release(&key("a", 0));
        l.commit(key("b", 0), slice(100, 100), AT).unwrap();
        assert_eq!(
            l.commit(key("c", 0), slice(100, 0), AT),
            Err(LedgerError::CoresExhausted)
        );
    }

    #[test]
    fn release_pod_frees_every_container_of_that_pod_only() {
        let mut l = gpu(10, 1000, 100);
        l.commit(key("a", 0), slice(100, 10), AT).unwrap();
        l.commit(key("a", 2), slice(100, 10), AT).unwrap();
        l.commit(key("b", 0), slice(100, 10), AT).unwrap();
        assert_eq!(l.release_pod("a"), 2);
        assert_eq!(
            l.usage(),
            Usage {
                slots: 1,
                memory_mib: 100,
                cores: 10
            }
        );
        assert_eq!(l.release(&key("a", 0)), None);
        l.commit(key("c", 0), slice(100, 10), AT).unwrap();
        let live = LiveSnapshot {
            live: ["c".to_owned()].into_iter().collect(),
            taken_at: AT,
        };
        assert_eq!(l.release_pods_except(&live), 1);
        assert_eq!(l.holdings().count(), 1);
    }

    #[test]
    fn init_containers_count_at_their_peak_and_app_containers_are_summed() {
        let mut l = gpu(2, 1000, 100);
        l.commit(key("a", 0), init_slice(800, 50), AT).unwrap();
        l.commit(key("a", 1), init_slice(600, 80), AT).unwrap();
        assert_eq!(
            l.usage(),
            Usage {
                slots: 1,
                memory_mib: 800,
                cores: 80
            }
        );
        // The app container of the same pod fits under the init peak.
        l.commit(key("a", 2), slice(900, 60), AT).unwrap();
        assert_eq!(
            l.usage(),
            Usage {
                slots: 1,
                memory_mib: 900,
                cores: 80
            }
        );
        // Another pod sees one slot and the pod's peak taken.
        assert_eq!(
            l.commit(key("b", 0), slice(200, 10), AT),
            Err(LedgerError::Memory {
                requested: 200,
                free: 100
            })
        );
        l.commit(key("b", 0), slice(100, 10), AT).unwrap();
        assert_eq!(
            l.commit(key("c", 0), slice(1, 1), AT),
            Err(LedgerError::NoSlot { slots: 2 })
        );
        l.release_pod("a");
        assert_eq!(
            l.usage(),
            Usage {
                slots: 1,
                memory_mib: 100,
                cores: 10
            }
        );
    }

    #[test]
    fn a_whole_card_app_slice_may_follow_its_own_init_container() {
        let mut l = gpu(10, 1000, 100);
        l.commit(key("a", 0), init_slice(100, 100), AT).unwrap();
        l.commit(key("a", 1), slice(100, 100), AT).unwrap();
        assert_eq!(
            l.commit(key("b", 0), slice(100, 0), AT),
            Err(LedgerError::CoresExhausted)
        );
    }

    /// The race of #13: the pod watcher's relist reads the pods of the node
    /// (pod `b` not bound yet), an Allocate then commits `b`'s slice, and
    /// only then the relist's snapshot reaches the ledger. It must not free
    /// `b`; it still frees `a`, which was committed before and is gone.
    #[test]
    fn a_stale_snapshot_never_frees_a_slice_committed_after_it() {
        let clock = crate::epoch::CommitClock::new();
        let mut l = gpu(4, 1000, 100);
        l.commit(key("a", 0), slice(100, 10), clock.tick()).unwrap();
        let relist = LiveSnapshot {
            live: BTreeSet::new(),
            taken_at: clock.now(),
        };
        l.commit(key("b", 0), slice(300, 30), clock.tick()).unwrap();
        assert_eq!(l.release_pods_except(&relist), 1, "only a is freed");
        let held: Vec<&str> = l.holdings().map(|(k, _)| k.pod_uid.as_str()).collect();
        assert_eq!(held, ["b"]);
        assert_eq!(
            l.usage(),
            Usage {
                slots: 1,
                memory_mib: 300,
                cores: 30
            }
        );
        // A snapshot taken after b's commit that still lacks b frees it.
        let later = LiveSnapshot {
            live: BTreeSet::new(),
            taken_at: clock.now(),
        };
        assert_eq!(l.release_pods_except(&later), 1);
        assert_eq!(l.usage(), Usage::default());
    }

    #[test]
    fn a_replayed_commit_keeps_its_first_epoch() {
        let mut l = gpu(4, 1000, 100);
        l.commit(key("a", 0), slice(100, 10), Epoch(1)).unwrap();
        // The same slice again (a restart replay), stamped later.
        l.commit(key("a", 0), slice(100, 10), Epoch(5)).unwrap();
        let snapshot = LiveSnapshot {
            live: BTreeSet::new(),
            taken_at: Epoch(2),
        };
        assert_eq!(l.release_pods_except(&snapshot), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Commit(u8, u8, Slice),
        Release(u8, u8),
        ReleasePod(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let slice = (
            0u32..700,
            prop_oneof![Just(0u32), 0u32..=100],
            any::<bool>(),
        )
            .prop_map(|(m, c, init)| Slice {
                memory_mib: m,
                cores: c,
                init,
            });
        prop_oneof![
            4 => (0u8..6, 0u8..3, slice).prop_map(|(p, c, s)| Op::Commit(p, c, s)),
            2 => (0u8..6, 0u8..3).prop_map(|(p, c)| Op::Release(p, c)),
            1 => (0u8..6).prop_map(Op::ReleasePod),
        ]
    }

    /// Reference model, written independently of the ledger: per pod, app
    /// slices summed, init slices at their peak, max of the two; summed over
    /// pods.
    fn reference_usage(holdings: &[(SliceKey, Slice)]) -> Usage {
        let mut pods: BTreeMap<&str, (Usage, Usage)> = BTreeMap::new();
        for (k, s) in holdings {
            let (app, init) = pods.entry(k.pod_uid.as_str()).or_default();
            if s.init {
                init.slots = 1;
                init.memory_mib = init.memory_mib.max(u64::from(s.memory_mib));
                init.cores = init.cores.max(u64::from(s.cores));
            } else {
                app.slots += 1;
                app.memory_mib += u64::from(s.memory_mib);
                app.cores += u64::from(s.cores);
            }
        }
        pods.values().fold(Usage::default(), |acc, (a, i)| Usage {
            slots: acc.slots + a.slots.max(i.slots),
            memory_mib: acc.memory_mib + a.memory_mib.max(i.memory_mib),
            cores: acc.cores + a.cores.max(i.cores),
        })
    }

    proptest! {
        /// A snapshot frees exactly the holdings of pods absent from it that
        /// were committed at or before its epoch, whatever the order of
        /// commits, releases and snapshots.
        #[test]
        fn a_snapshot_frees_exactly_the_absent_pods_committed_before_it(
            commits in proptest::collection::vec((0u8..6, 0u8..2, 1u64..20), 0..20),
            live in proptest::collection::btree_set(0u8..6, 0..6),
            taken_at in 0u64..20,
        ) {
            let mut l = gpu(100, 100_000, 10_000);
            for (p, c, at) in &commits {
                let _ = l.commit(key(&p.to_string(), (*c).into()), slice(1, 1), Epoch(*at));
            }
            let before: Vec<(SliceKey, Held)> = l.held.iter().map(|(k, h)| (k.clone(), *h)).collect();
            let snapshot = LiveSnapshot {
                live: live.iter().map(u8::to_string).collect(),
                taken_at: Epoch(taken_at),
            };
            let freed = l.release_pods_except(&snapshot);
            let kept: Vec<(SliceKey, Held)> = before
                .iter()
                .filter(|(k, h)| snapshot.live.contains(&k.pod_uid) || h.since.0 > taken_at)
                .cloned()
                .collect();
            prop_assert_eq!(freed, before.len() - kept.len());
            let after: Vec<(SliceKey, Held)> = l.held.iter().map(|(k, h)| (k.clone(), *h)).collect();
            prop_assert_eq!(after, kept);
        }

        /// No interleaving of commits and releases over-commits the GPU, the
        /// usage always equals the reference model's, a refused commit
        /// changes nothing, and a commit is refused only when the reference
        /// says it would not fit or a sharing rule forbids it.
        #[test]
        fn no_interleaving_over_commits(
            slots in 1u32..6, memory in 1u32..3000, cores in prop_oneof![Just(100u32), 1u32..300],
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let mut l = gpu(slots, memory, cores);
            for op in ops {
                let before = l.clone();
                match op {
                    Op::Commit(p, c, s) => {
                        let k = key(&p.to_string(), c.into());
                        match l.commit(k.clone(), s, AT) {
                            Ok(Committed::New) => {}
                            Ok(Committed::AlreadyHeld) | Err(LedgerError::Conflict { .. }) => {
                                prop_assert_eq!(&l, &before);
                            }
                            Err(e) => {
                                prop_assert_eq!(&l, &before);
                                let mut with: Vec<(SliceKey, Slice)> =
                                    before.holdings().map(|(k, s)| (k.clone(), *s)).collect();
                                with.push((k, s));
                                let u = reference_usage(&with);
                                let fits = u.slots <= slots
                                    && u.memory_mib <= u64::from(memory)
                                    && u.cores <= u64::from(cores);
                                let rule = matches!(e, LedgerError::Exclusive { .. } | LedgerError::CoresExhausted);
                                prop_assert!(!fits || rule, "refused a fitting slice: {e}");
                            }
                        }
                    }
                    Op::Release(p, c) => { l.release(&key(&p.to_string(), c.into())); }
                    Op::ReleasePod(p) => { l.release_pod(&p.to_string()); }
                }
                let u = l.usage();
                prop_assert!(u.slots <= slots);
                prop_assert!(u.memory_mib <= u64::from(memory));
                prop_assert!(u.cores <= u64::from(cores));
                let holdings: Vec<(SliceKey, Slice)> = l.holdings().map(|(k, s)| (k.clone(), *s)).collect();
                prop_assert_eq!(u, reference_usage(&holdings));
            }
        }
    }
}

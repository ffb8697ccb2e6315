//! `GpuPool`: the handle to the node's GPU actors. It owns their addresses
//! by UUID and the commit clock their commits are stamped from, and offers
//! the few operations the other actors need: look a GPU up, commit or
//! release one slice, and free the slices of pods gone from the node (one
//! pod, or every pod absent from a [`LiveSnapshot`], broadcast to every GPU).
//! It holds no GPU state: each ledger stays with its [`GpuActor`].

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::{Addr, Supervisor};

use super::gpu::{
    CommitClaim, CommitSlice, GetLedger, GpuActor, ReleaseClaim, ReleasePod, ReleasePodsExcept,
    ReleaseSlice,
};
use crate::epoch::CommitClock;
use crate::ledger::{
    ClaimError, ClaimSlice, Committed, LedgerError, LiveSnapshot, Slice, SliceKey, SliceLedger,
};

/// Why a commit did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitFailure {
    /// The GPU refused the slice.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// No GPU of that UUID serves (not on this node, or stopping).
    #[error("the GPU is not serving")]
    Unavailable,
}

/// Why a claim's commit did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimFailure {
    /// The GPU refused the claim's slice.
    #[error(transparent)]
    Ledger(#[from] ClaimError),
    /// No GPU of that UUID serves (not on this node, or stopping).
    #[error("the GPU is not serving")]
    Unavailable,
}

/// The node's GPU actors; cheap to clone.
#[derive(Clone)]
pub struct GpuPool {
    gpus: Arc<BTreeMap<String, Addr<GpuActor>>>,
    clock: CommitClock,
}

impl std::fmt::Debug for GpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPool")
            .field("gpus", &self.gpus.keys().collect::<Vec<_>>())
            .field("clock", &self.clock.now())
            .finish()
    }
}

impl GpuPool {
    /// Starts one supervised [`GpuActor`] per ledger (keyed by GPU UUID);
    /// commits are stamped from `clock`.
    #[must_use]
    pub fn start(ledgers: BTreeMap<String, SliceLedger>, clock: CommitClock) -> Self {
        let gpus = ledgers
            .into_iter()
            .map(|(uuid, ledger)| {
                let name = uuid.clone();
                let addr = Supervisor::start(move |_| GpuActor::new(name, ledger));
                (uuid, addr)
            })
            .collect();
        Self {
            gpus: Arc::new(gpus),
            clock,
        }
    }

    /// The commit clock, for whoever takes liveness snapshots.
    #[must_use]
    pub fn clock(&self) -> &CommitClock {
        &self.clock
    }

    /// Whether a GPU of `uuid` is in the pool.
    #[must_use]
    pub fn contains(&self, uuid: &str) -> bool {
        self.gpus.contains_key(uuid)
    }

    /// Holds `slice` for `key` on GPU `uuid`, stamped with a fresh epoch.
    /// Call it only after reading the pod the slice is for.
    ///
    /// # Errors
    /// [`CommitFailure`]: the ledger's refusal, or no such GPU serving.
    pub async fn commit(
        &self,
        uuid: &str,
        key: SliceKey,
        slice: Slice,
    ) -> Result<Committed, CommitFailure> {
        let gpu = self.gpus.get(uuid).ok_or(CommitFailure::Unavailable)?;
        let at = self.clock.tick();
        match gpu.send(CommitSlice { key, slice, at }).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(CommitFailure::Unavailable),
        }
    }

    /// Frees `key`'s slice on GPU `uuid`; what it held, if anything.
    pub async fn release(&self, uuid: &str, key: SliceKey) -> Option<Slice> {
        let gpu = self.gpus.get(uuid)?;
        gpu.send(ReleaseSlice { key }).await.ok().flatten()
    }

    /// Holds `slice` for DRA claim `claim_uid` on GPU `uuid`.
    ///
    /// # Errors
    /// [`ClaimFailure`]: the ledger's refusal, or no such GPU serving.
    pub async fn commit_claim(
        &self,
        uuid: &str,
        claim_uid: &str,
        slice: ClaimSlice,
    ) -> Result<Committed, ClaimFailure> {
        let gpu = self.gpus.get(uuid).ok_or(ClaimFailure::Unavailable)?;
        let msg = CommitClaim {
            claim_uid: claim_uid.to_owned(),
            slice,
        };
        match gpu.send(msg).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ClaimFailure::Unavailable),
        }
    }

    /// Frees DRA claim `claim_uid` on every GPU; how many GPUs it held.
    pub async fn release_claim(&self, claim_uid: &str) -> usize {
        let sends = self.gpus.values().map(|gpu| {
            gpu.send(ReleaseClaim {
                claim_uid: claim_uid.to_owned(),
            })
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Some(_))))
            .count()
    }

    /// Frees every slice of pod `pod_uid` on every GPU; how many were freed.
    pub async fn release_pod(&self, pod_uid: String) -> usize {
        let sends = self.gpus.values().map(|gpu| {
            gpu.send(ReleasePod {
                pod_uid: pod_uid.clone(),
            })
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .sum()
    }

    /// Frees on every GPU the slices of pods absent from `snapshot` that
    /// were committed before it was taken; how many were freed.
    pub async fn release_except(&self, snapshot: LiveSnapshot) -> usize {
        let snapshot = Arc::new(snapshot);
        let sends = self.gpus.values().map(|gpu| {
            gpu.send(ReleasePodsExcept {
                snapshot: Arc::clone(&snapshot),
            })
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .sum()
    }

    /// A copy of every GPU's ledger that answers, by UUID.
    pub async fn ledgers(&self) -> BTreeMap<String, SliceLedger> {
        let mut ledgers = BTreeMap::new();
        for (uuid, gpu) in self.gpus.iter() {
            if let Ok(ledger) = gpu.send(GetLedger).await {
                ledgers.insert(uuid.clone(), ledger);
            }
        }
        ledgers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Capacity;

    fn pool(uuids: &[&str]) -> GpuPool {
        let ledgers = uuids
            .iter()
            .map(|u| {
                let capacity = Capacity {
                    slots: 4,
                    memory_mib: 1000,
                    cores: 100,
                };
                ((*u).to_owned(), SliceLedger::new(capacity))
            })
            .collect();
        GpuPool::start(ledgers, CommitClock::new())
    }

    fn key(pod: &str) -> SliceKey {
        SliceKey {
            pod_uid: pod.into(),
            container: 0,
        }
    }

    const SLICE: Slice = Slice {
        memory_mib: 100,
        cores: 10,
        init: false,
    };

    fn holders(ledgers: &BTreeMap<String, SliceLedger>) -> Vec<(String, String)> {
        ledgers
            .iter()
            .flat_map(|(u, l)| l.holdings().map(|(k, _)| (u.clone(), k.pod_uid.clone())))
            .collect()
    }

    /// Through the actors, in the order the race of #13 happens: a snapshot
    /// is taken, a commit lands, the snapshot arrives. The commit survives;
    /// the slice of the pod that was gone before the snapshot does not.
    #[actix::test]
    async fn a_snapshot_delivered_late_frees_only_what_it_could_have_seen() {
        let pool = pool(&["GPU-a", "GPU-b"]);
        pool.commit("GPU-a", key("gone"), SLICE).await.unwrap();
        let snapshot = LiveSnapshot {
            live: std::collections::BTreeSet::new(),
            taken_at: pool.clock().now(),
        };
        pool.commit("GPU-b", key("new"), SLICE).await.unwrap();
        assert_eq!(pool.release_except(snapshot).await, 1);
        assert_eq!(
            holders(&pool.ledgers().await),
            [("GPU-b".to_owned(), "new".to_owned())]
        );
    }

    #[actix::test]
    async fn lookups_commits_and_releases_reach_the_named_gpu_only() {
        let pool = pool(&["GPU-a", "GPU-b"]);
        assert!(pool.contains("GPU-a") && !pool.contains("GPU-z"));
        assert_eq!(
            pool.commit("GPU-z", key("p"), SLICE).await,
            Err(CommitFailure::Unavailable)
        );
        pool.commit("GPU-a", key("p"), SLICE).await.unwrap();
        pool.commit("GPU-b", key("p"), SLICE).await.unwrap();
        pool.commit("GPU-b", key("q"), SLICE).await.unwrap();
        assert_eq!(pool.release("GPU-a", key("p")).await, Some(SLICE));
        assert_eq!(pool.release("GPU-a", key("p")).await, None);
        assert_eq!(pool.release_pod("p".into()).await, 1);
        assert_eq!(
            holders(&pool.ledgers().await),
            [("GPU-b".to_owned(), "q".to_owned())]
        );
    }
}

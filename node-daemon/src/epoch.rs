//! The node's commit clock: the order in which slices were committed and
//! liveness snapshots were taken, so a snapshot never frees a slice it could
//! not have seen.
//!
//! Owns [`Epoch`] (a point in that order) and [`CommitClock`] (the one
//! counter every GPU ledger's commits are stamped from). The clock holds no
//! other state and has one rule: [`CommitClock::tick`] returns a value larger
//! than every earlier [`CommitClock::now`] and `tick`. A liveness snapshot
//! reads `now` *before* its pod list is requested; a commit is stamped with
//! `tick` *after* its pod was read. So a slice stamped after the snapshot's
//! epoch belongs to a pod the snapshot may have missed, and the ledger keeps
//! it (`SliceLedger::release_pods_except`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A point in the node's commit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u64);

/// The node's commit clock; clones share it.
#[derive(Debug, Clone, Default)]
pub struct CommitClock(Arc<AtomicU64>);

impl CommitClock {
    /// A clock at epoch 0 (the ledgers rebuilt at start are stamped 0).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The epoch of a snapshot whose list is about to be requested: every
    /// commit stamped so far is at or before it, every later one after it.
    #[must_use]
    pub fn now(&self) -> Epoch {
        Epoch(self.0.load(Ordering::SeqCst))
    }

    /// A fresh stamp for a commit, after every `now` read so far.
    pub fn tick(&self) -> Epoch {
        Epoch(self.0.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_after_every_earlier_reading_and_clones_share_the_clock() {
        let clock = CommitClock::new();
        let other = clock.clone();
        let before = clock.now();
        let stamp = other.tick();
        assert!(stamp > before);
        assert_eq!(clock.now(), stamp);
        assert!(clock.tick() > stamp);
    }
}

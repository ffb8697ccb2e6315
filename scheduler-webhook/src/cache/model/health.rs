//! Which GPU nodes the handshake lets the model offer, as time passes.
//!
//! Owns, per GPU node, the state HAMi's health rule needs beyond the node
//! object itself ([`NodeHandshake::offer`]): whether the allocatable count
//! fell to 0, and when a `Requesting_` window ends. The model is pure, so it
//! reads no clock: the owner tells it the time ([`Health::advance`]) and the
//! nodes whose window ended by then are withdrawn at once, without waiting
//! for the leader to write `Deleted_` or for another node event.
//!
//! A withdrawn node keeps its GPUs and their usage in the core cluster (the
//! pods on it still hold their slices, and count again the moment it comes
//! back); the filter only stops offering it.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::convert::{GpuOffer, NodeHandshake};

/// The handshake state of every GPU node, and the model's clock.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// The latest time the owner gave, in unix seconds (0 until then: every
    /// window is then still open).
    now: i64,
    /// Nodes whose GPUs are not offered.
    withdrawn: HashSet<String>,
    /// Last allocatable count seen per GPU node.
    allocatable: HashMap<String, i64>,
    /// Nodes whose allocatable count fell from > 0 to 0 and has not come back.
    dropped: HashSet<String>,
    /// Open `Requesting_` windows, by end time.
    deadlines: BTreeSet<(i64, String)>,
    /// The end of each node's open window (to drop its entry in `deadlines`).
    deadline_of: HashMap<String, i64>,
}

impl Health {
    /// The model's clock.
    pub(super) fn now(&self) -> i64 {
        self.now
    }

    /// A node event: applies HAMi's rule to the node's handshake (`None`:
    /// not a GPU node). Returns whether its GPUs are offered.
    pub(super) fn apply(&mut self, name: &str, handshake: Option<&NodeHandshake>) -> bool {
        self.clear_deadline(name);
        let Some(h) = handshake else {
            self.remove(name);
            return true;
        };
        let now_allocatable = h.allocatable();
        let before = self.allocatable.insert(name.to_owned(), now_allocatable);
        if now_allocatable > 0 {
            self.dropped.remove(name);
        } else if before.is_some_and(|b| b > 0) {
            self.dropped.insert(name.to_owned());
        }
        let offered = match h.offer(self.dropped.contains(name)) {
            GpuOffer::Yes => true,
            GpuOffer::No => false,
            GpuOffer::Until(end) if end <= self.now => false,
            GpuOffer::Until(end) => {
                self.deadlines.insert((end, name.to_owned()));
                self.deadline_of.insert(name.to_owned(), end);
                true
            }
        };
        if offered {
            self.withdrawn.remove(name);
        } else {
            self.withdrawn.insert(name.to_owned());
        }
        offered
    }

    /// The node is gone: forget it.
    pub(super) fn remove(&mut self, name: &str) {
        self.clear_deadline(name);
        self.withdrawn.remove(name);
        self.allocatable.remove(name);
        self.dropped.remove(name);
    }

    /// Moves the clock to `now` (never backwards). Returns the nodes whose
    /// `Requesting_` window ended: they are withdrawn now.
    pub(super) fn advance(&mut self, now: i64) -> Vec<String> {
        self.now = self.now.max(now);
        let mut ended = Vec::new();
        while let Some((end, _)) = self.deadlines.first()
            && *end <= self.now
        {
            if let Some((_, name)) = self.deadlines.pop_first() {
                self.deadline_of.remove(&name);
                self.withdrawn.insert(name.clone());
                ended.push(name);
            }
        }
        ended
    }

    /// Whether the node's GPUs are not offered.
    pub(super) fn is_withdrawn(&self, name: &str) -> bool {
        !self.withdrawn.is_empty() && self.withdrawn.contains(name)
    }

    /// Whether the node's allocatable count fell to 0 and has not come back.
    pub(super) fn is_dropped(&self, name: &str) -> bool {
        self.dropped.contains(name)
    }

    /// Whether any node is withdrawn (the filter's fast path).
    pub(super) fn any_withdrawn(&self) -> bool {
        !self.withdrawn.is_empty()
    }

    fn clear_deadline(&mut self, name: &str) {
        if let Some(end) = self.deadline_of.remove(name) {
            self.deadlines.remove(&(end, name.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_752_282_740; // 2025-07-12 01:12:20 UTC

    fn hs(current: Option<&str>, allocatable: Option<i64>) -> NodeHandshake {
        NodeHandshake {
            current: current.map(str::to_owned),
            allocatable_gpus: allocatable,
        }
    }

    fn at(now: i64) -> Health {
        let mut h = Health::default();
        h.advance(now);
        h
    }

    #[test]
    fn a_requesting_stamp_on_a_node_without_allocatable_gpus_offers_them_for_60_seconds() {
        let mut health = at(NOW);
        // Stamped 20 s ago, allocatable 0: the window ends in 40 s.
        let stamp = "Requesting_2025-07-12 01:12:00";
        assert!(health.apply("n", Some(&hs(Some(stamp), Some(0)))));
        assert!(health.advance(NOW + 39).is_empty());
        assert!(!health.is_withdrawn("n"));
        assert_eq!(health.advance(NOW + 40), ["n".to_owned()]);
        assert!(health.is_withdrawn("n"));
        // The device plugin comes up: offered again at once.
        assert!(health.apply("n", Some(&hs(Some(stamp), Some(4)))));
        assert!(!health.is_withdrawn("n"));
    }

    #[test]
    fn an_expired_stamp_withdraws_at_once_unless_gpus_are_allocatable() {
        let old = "Requesting_2025-07-12 01:00:00";
        let mut health = at(NOW);
        assert!(!health.apply("n", Some(&hs(Some(old), Some(0)))));
        assert!(!health.apply("n", Some(&hs(Some(old), None))));
        assert!(health.apply("n", Some(&hs(Some(old), Some(2)))));
    }

    #[test]
    fn allocatable_falling_to_zero_withdraws_at_once_and_stays_until_it_returns() {
        let fresh = "Requesting_2025-07-12 01:12:15";
        let mut health = at(NOW);
        assert!(health.apply("n", Some(&hs(Some(fresh), Some(8)))));
        assert!(!health.apply("n", Some(&hs(Some(fresh), Some(0)))));
        // Another event with the stamp still fresh does not bring it back.
        assert!(!health.apply("n", Some(&hs(Some(fresh), Some(0)))));
        assert!(health.apply("n", Some(&hs(Some(fresh), Some(8)))));
    }

    #[test]
    fn deleted_withdraws_and_a_missing_or_legacy_stamp_offers() {
        let mut health = at(NOW);
        let deleted = "Deleted_2025-07-12 01:12:20";
        assert!(!health.apply("n", Some(&hs(Some(deleted), Some(4)))));
        assert!(health.apply("m", Some(&hs(None, Some(0)))));
        assert!(health.apply("m", Some(&hs(Some("Reported 2025"), Some(0)))));
        // Not a GPU node any more: forgotten.
        assert!(health.apply("n", None));
        assert!(!health.any_withdrawn());
    }

    #[test]
    fn a_later_event_replaces_the_open_window() {
        let mut health = at(NOW);
        let first = "Requesting_2025-07-12 01:12:00";
        let second = "Requesting_2025-07-12 01:12:20";
        health.apply("n", Some(&hs(Some(first), Some(0))));
        health.apply("n", Some(&hs(Some(second), Some(0))));
        assert!(
            health.advance(NOW + 40).is_empty(),
            "the first window is gone"
        );
        assert_eq!(health.advance(NOW + 60), ["n".to_owned()]);
        health.remove("n");
        assert!(!health.is_withdrawn("n"));
        assert!(health.deadlines.is_empty() && health.deadline_of.is_empty());
    }
}

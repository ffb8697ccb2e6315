//! `KeptRead`: the read of the node's pods and lock that a
//! GetPreferredAllocation made, kept for the Allocate kubelet sends right
//! after it for the same container, so that Allocate does not list the
//! node's pods and read its lock again.
//!
//! kubelet admits pods one at a time, and for each container asks
//! GetPreferredAllocation, then Allocate with the IDs it picked. The kept
//! read serves that Allocate only when nothing can have changed what it
//! shows for the pod being allocated:
//! - it is taken once: the next Allocate takes it, whatever it is for, and
//!   the next preference replaces it (or drops it, if it found no pod);
//! - no Allocate was under way while it was read, and none ended since (an
//!   Allocate writes its pod's annotations, which the read would still show
//!   pending: the swap of HAMi issue #781);
//! - the Allocate asks for exactly the IDs the preference answered for its
//!   first container (kubelet followed the hint, so it is that pod's
//!   Allocate), and
//! - it is younger than [`KEPT_READ_TTL`] (the scheduler's node lock fences
//!   other binds, but not forever).
//!
//! In every other case Allocate reads the node afresh, as before. The state
//! is plain: the caller passes the time, so the rules are tested without a
//! clock.

use std::time::{Duration, Instant};

use crate::cluster::PodView;
use crate::epoch::Epoch;

/// How long a preference's read may serve the Allocate after it.
pub const KEPT_READ_TTL: Duration = Duration::from_secs(2);

/// One read of the node: its pods, its lock annotation, and the liveness
/// epoch taken before the pods were listed.
#[derive(Debug, Clone)]
pub struct NodeRead {
    /// The node's pods.
    pub pods: Vec<PodView>,
    /// The raw node-lock value, if any (`None` also when it could not be read).
    pub lock: Option<String>,
    /// [`crate::epoch::CommitClock::now`] before the pods were listed.
    pub taken_at: Epoch,
}

/// A ticket for a preference's read: which Allocates had ended when it
/// began, or nothing when one was under way (its read is then never kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTicket(Option<u64>);

#[derive(Debug)]
struct Kept {
    read: NodeRead,
    /// The IDs preferred for the first container, sorted.
    ids: Vec<String>,
    /// Allocates ended when the read began.
    after: u64,
    at: Instant,
}

/// The kept read and the count of Allocates begun and ended.
#[derive(Debug, Default)]
pub struct KeptRead {
    kept: Option<Kept>,
    begun: u64,
    ended: u64,
}

impl KeptRead {
    /// Called before a preference reads the node.
    #[must_use]
    pub fn ticket(&self) -> ReadTicket {
        ReadTicket((self.begun == self.ended).then_some(self.ended))
    }

    /// Keeps `read`, the preference's read under `ticket`, which preferred
    /// `ids` for its first container (`None`: it found no pod to prefer
    /// for). Keeps nothing, and drops what was kept, when it found no pod or
    /// the ticket was taken while an Allocate ran.
    pub fn keep(
        &mut self,
        ticket: ReadTicket,
        read: NodeRead,
        ids: Option<&[String]>,
        now: Instant,
    ) {
        self.kept = ticket.0.zip(ids).map(|(after, ids)| Kept {
            read,
            ids: sorted(ids),
            after,
            at: now,
        });
    }

    /// Begins an Allocate of `ids` for its first container: the kept read
    /// when it may serve it (see the module docs), else `None`. Either way
    /// the kept read is gone. Pair with [`KeptRead::end`].
    pub fn begin(&mut self, ids: &[String], now: Instant) -> Option<NodeRead> {
        let idle = self.begun == self.ended;
        let ended = self.ended;
        self.begun += 1;
        let kept = self.kept.take()?;
        let fresh = now.saturating_duration_since(kept.at) < KEPT_READ_TTL;
        (idle && kept.after == ended && fresh && kept.ids == sorted(ids)).then_some(kept.read)
    }

    /// Ends an Allocate begun with [`KeptRead::begin`], whatever its outcome.
    pub fn end(&mut self) {
        self.ended += 1;
    }
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(tag: &str) -> NodeRead {
        NodeRead {
            pods: Vec::new(),
            lock: Some(tag.to_owned()),
            taken_at: Epoch(0),
        }
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn lock_of(read: Option<NodeRead>) -> Option<String> {
        read.and_then(|r| r.lock)
    }

    #[test]
    fn the_next_allocate_of_the_preferred_ids_takes_the_read_once() {
        let now = Instant::now();
        let mut state = KeptRead::default();
        let ticket = state.ticket();
        state.keep(ticket, read("p"), Some(&ids(&["b", "a"])), now);
        assert_eq!(
            lock_of(state.begin(&ids(&["a", "b"]), now)).as_deref(),
            Some("p")
        );
        state.end();
        assert!(state.begin(&ids(&["a", "b"]), now).is_none(), "taken once");
        state.end();
    }

    #[test]
    fn other_ids_an_old_read_or_an_allocate_since_read_afresh() {
        let now = Instant::now();
        let mut state = KeptRead::default();

        let ticket = state.ticket();
        state.keep(ticket, read("p"), Some(&ids(&["a"])), now);
        assert!(state.begin(&ids(&["b"]), now).is_none(), "other IDs");
        state.end();
        assert!(
            state.begin(&ids(&["a"]), now).is_none(),
            "the mismatch dropped it"
        );
        state.end();

        let ticket = state.ticket();
        state.keep(ticket, read("p"), Some(&ids(&["a"])), now);
        assert!(state.begin(&ids(&["a"]), now + KEPT_READ_TTL).is_none());
        state.end();

        // An Allocate ran after the read began (its pod shows pending there).
        let ticket = state.ticket();
        state.begin(&ids(&["x"]), now);
        state.end();
        state.keep(ticket, read("p"), Some(&ids(&["a"])), now);
        assert!(state.begin(&ids(&["a"]), now).is_none());
        state.end();
    }

    #[test]
    fn a_read_begun_while_an_allocate_runs_is_never_kept() {
        let now = Instant::now();
        let mut state = KeptRead::default();
        state.begin(&ids(&["x"]), now);
        let ticket = state.ticket();
        state.end();
        state.keep(ticket, read("p"), Some(&ids(&["a"])), now);
        assert!(state.begin(&ids(&["a"]), now).is_none());
        state.end();
        // And the counts stay paired: the next preference's read is kept.
        let ticket = state.ticket();
        state.keep(ticket, read("q"), Some(&ids(&["a"])), now);
        assert_eq!(
            lock_of(state.begin(&ids(&["a"]), now)).as_deref(),
            Some("q")
        );
        state.end();
    }

    #[test]
    fn a_preference_that_found_no_pod_drops_the_kept_read() {
        let now = Instant::now();
        let mut state = KeptRead::default();
        let ticket = state.ticket();
        state.keep(ticket, read("p"), Some(&ids(&["a"])), now);
        let ticket = state.ticket();
        state.keep(ticket, read("none"), None, now);
        assert!(state.begin(&ids(&["a"]), now).is_none());
        state.end();
    }
}

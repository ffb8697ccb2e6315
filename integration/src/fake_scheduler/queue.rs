//! kube-scheduler's scheduling queue, reduced to what the fake needs: an
//! active FIFO, a backoff queue (1 s doubling to 10 s per failed attempt),
//! and the unschedulable set that cluster events (node changes, pods going
//! away) move back, with a flush after a maximum stay.
//!
//! Pure: time is passed in; keys are `namespace/name`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::config::Backoff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Active,
    Backoff,
    Unschedulable,
    InFlight,
}

#[derive(Debug, Clone)]
struct Entry {
    uid: String,
    attempts: u32,
    backoff_until: Option<Instant>,
    place: Place,
    /// When the pod entered the unschedulable set.
    since: Instant,
    /// A cluster event arrived while the pod was being scheduled.
    moved_in_flight: bool,
}

/// The queue of pending pods.
#[derive(Debug)]
pub struct SchedulingQueue {
    backoff: Backoff,
    flush_after: Duration,
    entries: HashMap<String, Entry>,
    active: VecDeque<String>,
    backing_off: BTreeSet<(Instant, String)>,
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new(backoff: Backoff, flush_after: Duration) -> Self {
        Self {
            backoff,
            flush_after,
            entries: HashMap::new(),
            active: VecDeque::new(),
            backing_off: BTreeSet::new(),
        }
    }

    /// A pending pod was seen (add or update). New pods, and pods recreated
    /// under the same name, join the tail of the active queue; an updated
    /// unschedulable pod is moved as on a cluster event.
    pub fn observe(&mut self, key: &str, uid: &str, now: Instant) {
        match self.entries.get(key) {
            Some(e) if e.uid == uid => {
                if e.place == Place::Unschedulable {
                    self.move_one(key, now);
                }
            }
            _ => {
                self.forget(key);
                self.entries.insert(
                    key.to_string(),
                    Entry {
                        uid: uid.to_string(),
                        attempts: 0,
                        backoff_until: None,
                        place: Place::Active,
                        since: now,
                        moved_in_flight: false,
                    },
                );
                self.active.push_back(key.to_string());
            }
        }
    }

    /// The pod is gone, bound or terminal: drop it everywhere.
    pub fn forget(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            match e.place {
                Place::Active => self.active.retain(|k| k != key),
                Place::Backoff => {
                    if let Some(until) = e.backoff_until {
                        self.backing_off.remove(&(until, key.to_string()));
                    }
                }
                Place::Unschedulable | Place::InFlight => {}
            }
        }
    }

    fn promote_expired(&mut self, now: Instant) {
        while let Some((until, key)) = self.backing_off.first().cloned() {
            if until > now {
                break;
            }
            self.backing_off.pop_first();
            if let Some(e) = self.entries.get_mut(&key) {
                e.place = Place::Active;
                self.active.push_back(key);
            }
        }
        let stale: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.place == Place::Unschedulable && now >= e.since + self.flush_after)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            self.move_one(&key, now);
        }
    }

    /// The next pod to schedule, FIFO, after moving expired backoffs.
    pub fn pop(&mut self, now: Instant) -> Option<String> {
        self.promote_expired(now);
        let key = self.active.pop_front()?;
        if let Some(e) = self.entries.get_mut(&key) {
            e.place = Place::InFlight;
            e.moved_in_flight = false;
        }
        Some(key)
    }

    /// When [`Self::pop`] can next return something: now when a pod is
    /// active, else the earliest backoff expiry or unschedulable flush.
    pub fn next_ready(&self, now: Instant) -> Option<Instant> {
        if !self.active.is_empty() {
            return Some(now);
        }
        let backoff = self.backing_off.first().map(|(t, _)| *t);
        let flush = self
            .entries
            .values()
            .filter(|e| e.place == Place::Unschedulable)
            .map(|e| e.since + self.flush_after)
            .min();
        match (backoff, flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn backoff_after_failure(&mut self, key: &str, now: Instant) -> Option<Instant> {
        let e = self.entries.get_mut(key)?;
        e.attempts = e.attempts.saturating_add(1);
        let until = now + self.backoff.after(e.attempts);
        e.backoff_until = Some(until);
        Some(until)
    }

    fn enter_backoff(&mut self, key: &str, now: Instant) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        match e.backoff_until {
            Some(until) if until > now => {
                e.place = Place::Backoff;
                self.backing_off.insert((until, key.to_string()));
            }
            _ => {
                e.place = Place::Active;
                self.active.push_back(key.to_string());
            }
        }
    }

    /// A scheduling error (extender error, timeout, API failure): retry
    /// after the backoff.
    pub fn failed_with_error(&mut self, key: &str, now: Instant) -> Option<Duration> {
        let until = self.backoff_after_failure(key, now)?;
        self.enter_backoff(key, now);
        Some(until - now)
    }

    /// No node fits: wait for a cluster event (or the flush), then respect
    /// the backoff. A cluster event during the attempt sends the pod
    /// straight to backoff, as kube-scheduler's move request cycle does.
    pub fn failed_unschedulable(&mut self, key: &str, now: Instant) -> Option<Duration> {
        let until = self.backoff_after_failure(key, now)?;
        let moved = self.entries.get(key).is_some_and(|e| e.moved_in_flight);
        if moved {
            self.enter_backoff(key, now);
        } else if let Some(e) = self.entries.get_mut(key) {
            e.place = Place::Unschedulable;
            e.since = now;
        }
        Some(until - now)
    }

    fn move_one(&mut self, key: &str, now: Instant) {
        if self.entries.get(key).map(|e| e.place) == Some(Place::Unschedulable) {
            self.enter_backoff(key, now);
        }
    }

    /// A cluster event that may make unschedulable pods fit.
    pub fn move_all_unschedulable(&mut self, now: Instant) {
        let keys: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.place, Place::Unschedulable | Place::InFlight))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(e) = self.entries.get_mut(&key)
                && e.place == Place::InFlight
            {
                e.moved_in_flight = true;
                continue;
            }
            self.move_one(&key, now);
        }
    }

    /// The attempt succeeded (the pod is assumed on a node): stop tracking.
    pub fn done(&mut self, key: &str) {
        self.forget(key);
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Failed attempts of `key` so far.
    pub fn attempts(&self, key: &str) -> u32 {
        self.entries.get(key).map_or(0, |e| e.attempts)
    }

    /// Pods per place, for stats: (active, backoff, unschedulable).
    pub fn sizes(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::from([("active", 0), ("backoff", 0), ("unschedulable", 0)]);
        for e in self.entries.values() {
            let name = match e.place {
                Place::Active => "active",
                Place::Backoff => "backoff",
                Place::Unschedulable => "unschedulable",
                Place::InFlight => continue,
            };
            *out.entry(name).or_insert(0) += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> SchedulingQueue {
        SchedulingQueue::new(Backoff::default(), Duration::from_secs(300))
    }

    #[test]
    fn fifo_and_idempotent_observe() {
        let t = Instant::now();
        let mut q = queue();
        q.observe("ns/a", "1", t);
        q.observe("ns/b", "2", t);
        q.observe("ns/a", "1", t);
        assert_eq!(q.pop(t).as_deref(), Some("ns/a"));
        assert_eq!(q.pop(t).as_deref(), Some("ns/b"));
        assert_eq!(q.pop(t), None);
        assert_eq!(q.next_ready(t), None);
    }

    #[test]
    fn errors_back_off_doubling_to_ten_seconds() {
        let mut t = Instant::now();
        let mut q = queue();
        q.observe("ns/a", "1", t);
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert_eq!(q.pop(t).as_deref(), Some("ns/a"));
            let wait = q.failed_with_error("ns/a", t).unwrap();
            waits.push(wait.as_secs());
            assert_eq!(q.pop(t), None, "still backing off");
            assert_eq!(q.next_ready(t), Some(t + wait));
            t += wait;
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(q.attempts("ns/a"), 6);
    }

    #[test]
    fn unschedulable_waits_for_a_cluster_event_then_backoff() {
        let t = Instant::now();
        let mut q = queue();
        q.observe("ns/a", "1", t);
        q.pop(t);
        q.failed_unschedulable("ns/a", t);
        let later = t + Duration::from_secs(5);
        assert_eq!(q.pop(later), None, "no event, no retry");
        assert_eq!(q.next_ready(t), Some(t + Duration::from_secs(300)), "flush");
        q.move_all_unschedulable(later);
        assert_eq!(
            q.pop(later).as_deref(),
            Some("ns/a"),
            "backoff (1 s) expired"
        );
        q.failed_unschedulable("ns/a", later);
        q.move_all_unschedulable(later);
        assert_eq!(q.pop(later), None, "moved into backoff of 2 s");
        assert_eq!(
            q.pop(later + Duration::from_secs(2)).as_deref(),
            Some("ns/a")
        );
    }

    #[test]
    fn event_during_attempt_skips_the_unschedulable_wait() {
        let t = Instant::now();
        let mut q = queue();
        q.observe("ns/a", "1", t);
        q.pop(t);
        q.move_all_unschedulable(t);
        q.failed_unschedulable("ns/a", t);
        assert_eq!(q.pop(t + Duration::from_secs(1)).as_deref(), Some("ns/a"));
    }

    #[test]
    fn forget_and_recreate() {
        let t = Instant::now();
        let mut q = queue();
        q.observe("ns/a", "1", t);
        q.pop(t);
        q.failed_with_error("ns/a", t);
        q.observe("ns/a", "2", t);
        assert_eq!(q.attempts("ns/a"), 0, "a new pod under the same name");
        assert_eq!(q.pop(t).as_deref(), Some("ns/a"));
        q.done("ns/a");
        assert!(!q.contains("ns/a"));
        assert_eq!(q.next_ready(t), None);
    }
}

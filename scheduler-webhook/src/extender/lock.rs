//! The node lock decision (`hami.io/mutex.lock`), as pure functions.
//!
//! HAMi keeps a lock from bind until the device plugin's Allocate and
//! otherwise waits five minutes for an abandoned one. We keep the format but
//! release early: a lock whose pod is gone, finished, already allocated
//! (`bind-phase` success or failed) or bound to another node is taken over at
//! once, and a live holder is waited for (bounded) instead of failing the
//! bind.
//!
//! A holder that may still be admitted on the node is taken over only after
//! it is marked abandoned ([`Holder::Abandon`]): `bind-phase=failed` and
//! `gpuslice.io/bind-abandoned=<node>`, written with the holder's
//! `resourceVersion` as a precondition. kubelet's Allocate names no pod, so
//! the node-daemon refuses every Allocate such a pod could have sent while it
//! is still `Pending` on the node, and the new holder's Allocate is never
//! answered with the old holder's devices nor the other way round. That is
//! done when HAMi's lock expires, and sooner ([`UNBOUND_GRACE_SECS`]) for a
//! holder that was never bound: its binder stopped between the annotations
//! and `pods/binding`. A holder bound here keeps the node for HAMi's five
//! minutes: a sooner takeover would only make the new pod's Allocate refused
//! while the old one may still be admitted. `docs/protocol.md` has the
//! reasoning.

use k8s_openapi::api::core::v1::Pod;
use proto::hami::bind::{BindPhase, BindTime};
use proto::hami::keys;
use proto::hami::node_lock::{DEFAULT_EXPIRY_SECS, LockOwner, NodeLock};

/// How long after its bind a holder that is still not bound to any node is
/// taken over (after marking it abandoned). Longer than one bind takes
/// (kube-scheduler's extender timeout is 30 s); safety does not depend on
/// it, only how rarely a slow binder's pod is failed for being slow.
pub const UNBOUND_GRACE_SECS: i64 = 60;

/// What the current lock value means for a pod that wants the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// No lock: take it.
    Free,
    /// Already held by this pod.
    Ours,
    /// Unreadable, or legacy (no owner) and expired: take it over.
    Stale(String),
    /// Held by another pod: look at that pod to decide ([`judge_holder`]).
    HeldBy {
        /// The holder.
        owner: LockOwner,
        /// Seconds since the lock was taken.
        age_secs: i64,
    },
    /// Held in the legacy format (no owner) and not expired: wait.
    HeldAnonymously,
}

/// Reads the current lock value for `namespace/pod` at `now_unix`.
#[must_use]
pub fn classify(current: Option<&str>, namespace: &str, pod: &str, now_unix: i64) -> LockState {
    let Some(value) = current.filter(|v| !v.is_empty()) else {
        return LockState::Free;
    };
    let lock: NodeLock = match value.parse() {
        Ok(l) => l,
        Err(e) => return LockState::Stale(format!("unreadable lock {value:?}: {e}")),
    };
    if lock.is_owned_by(namespace, pod) {
        return LockState::Ours;
    }
    let age_secs = lock.age_seconds(now_unix);
    match lock.owner {
        Some(owner) => LockState::HeldBy { owner, age_secs },
        None if lock.is_expired(now_unix, DEFAULT_EXPIRY_SECS) => {
            LockState::Stale(format!("lock {value} expired"))
        }
        None => LockState::HeldAnonymously,
    }
}

/// What to do about the pod named by a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// It is done with the node (gone, finished, allocated, failed, bound
    /// elsewhere): take the lock. The reason is for the log.
    Done(String),
    /// It may still be admitted on the node, but has waited too long: mark
    /// it abandoned (guarded by its `resourceVersion`), then take the lock.
    Abandon(String),
    /// It may still be allocated on the node: wait.
    Waiting,
}

/// Judges the holder of `node`'s lock, given what the API server says about
/// it (`None`: the pod does not exist), how old the lock is, and now.
#[must_use]
pub fn judge_holder(holder: Option<&Pod>, node: &str, lock_age_secs: i64, now_unix: i64) -> Holder {
    let Some(pod) = holder else {
        return Holder::Done("its pod is gone".to_owned());
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Holder::Done("its pod is being deleted".to_owned());
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed" | "Running")) {
        return Holder::Done(format!("its pod is {}", phase.unwrap_or_default()));
    }
    let annotation = |key| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    match annotation(keys::BIND_PHASE).and_then(|v| v.parse::<BindPhase>().ok()) {
        Some(BindPhase::Success) => return Holder::Done("its pod is already allocated".to_owned()),
        Some(BindPhase::Failed) => return Holder::Done("its pod failed allocation".to_owned()),
        Some(BindPhase::Allocating) | None => {}
    }
    let bound_to = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty());
    match bound_to {
        Some(other) if other != node => {
            return Holder::Done(format!("its pod is bound to node {other}"));
        }
        _ => {}
    }
    if lock_age_secs >= DEFAULT_EXPIRY_SECS {
        return Holder::Abandon(format!(
            "the lock is {lock_age_secs} s old (HAMi's expiry is {DEFAULT_EXPIRY_SECS} s)"
        ));
    }
    if bound_to.is_none() {
        let since_bind = annotation(keys::BIND_TIME)
            .and_then(|v| v.parse::<BindTime>().ok())
            .map_or(lock_age_secs, |t| t.age_seconds(now_unix));
        if since_bind >= UNBOUND_GRACE_SECS {
            return Holder::Abandon(format!(
                "its pod is still not bound {since_bind} s after its bind"
            ));
        }
    }
    Holder::Waiting
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_760_929_622; // 2025-10-20T03:07:02Z

    #[test]
    fn classify_covers_every_lock_value() {
        assert_eq!(classify(None, "ns", "p", NOW), LockState::Free);
        assert_eq!(classify(Some(""), "ns", "p", NOW), LockState::Free);
        assert_eq!(
            classify(Some("2025-10-20T03:07:02Z,ns,p"), "ns", "p", NOW),
            LockState::Ours
        );
        let q = LockOwner {
            namespace: "ns".into(),
            pod: "q".into(),
        };
        assert_eq!(
            classify(Some("2025-10-20T03:07:00Z,ns,q"), "ns", "p", NOW),
            LockState::HeldBy {
                owner: q.clone(),
                age_secs: 2
            }
        );
        // An expired named lock is judged by its holder, not taken blindly.
        assert_eq!(
            classify(Some("2025-10-20T03:00:00Z,ns,q"), "ns", "p", NOW),
            LockState::HeldBy {
                owner: q,
                age_secs: 422
            }
        );
        assert!(matches!(
            classify(Some("2025-10-20T03:00:00Z"), "ns", "p", NOW),
            LockState::Stale(_)
        ));
        assert_eq!(
            classify(Some("2025-10-20T03:07:00Z"), "ns", "p", NOW),
            LockState::HeldAnonymously
        );
        assert!(matches!(
            classify(Some("garbage"), "ns", "p", NOW),
            LockState::Stale(_)
        ));
    }

    /// A holder pod: `phase`, `bind-phase`, bound to `node_name` (or not),
    /// bound at `bind_time` (unix seconds).
    fn holder(
        phase: &str,
        bind_phase: Option<&str>,
        node_name: Option<&str>,
        bind_time: Option<i64>,
    ) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(b) = bind_phase {
            annotations.insert(keys::BIND_PHASE.into(), json!(b));
        }
        if let Some(t) = bind_time {
            annotations.insert(keys::BIND_TIME.into(), json!(t.to_string()));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "q", "annotations": annotations},
            "spec": {"containers": [], "nodeName": node_name},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn pod(phase: &str, bind_phase: Option<&str>) -> Pod {
        holder(phase, bind_phase, Some("n1"), Some(NOW))
    }

    #[test]
    fn only_a_pending_unallocated_holder_keeps_the_lock() {
        let waits = |p: &Pod| judge_holder(Some(p), "n1", 0, NOW) == Holder::Waiting;
        assert!(waits(&pod("Pending", Some("allocating"))));
        assert!(waits(&pod("Pending", None)));
        for (phase, bind) in [
            ("Pending", Some("success")),
            ("Pending", Some("failed")),
            ("Running", Some("allocating")),
            ("Failed", None),
            ("Succeeded", None),
        ] {
            assert!(
                matches!(
                    judge_holder(Some(&pod(phase, bind)), "n1", 0, NOW),
                    Holder::Done(_)
                ),
                "{phase} {bind:?}"
            );
        }
        assert_eq!(
            judge_holder(None, "n1", 0, NOW),
            Holder::Done("its pod is gone".to_owned())
        );
        let elsewhere = holder("Pending", Some("allocating"), Some("n2"), Some(NOW));
        assert!(matches!(
            judge_holder(Some(&elsewhere), "n1", 0, NOW),
            Holder::Done(_)
        ));
    }

    /// The table of the takeover rule: which stuck holders are marked
    /// abandoned and when; a holder bound here keeps HAMi's five minutes.
    #[test]
    fn a_stuck_holder_is_abandoned_only_when_its_allocate_can_be_refused() {
        let grace = UNBOUND_GRACE_SECS;
        /// (case, bound to, bind time, lock age, abandoned?)
        type Case<'a> = (&'a str, Option<&'a str>, Option<i64>, i64, bool);
        let cases: [Case<'_>; 7] = [
            ("bound here, young", Some("n1"), Some(NOW - 10), 10, false),
            (
                "bound here, past the grace",
                Some("n1"),
                Some(NOW - 4 * grace),
                4 * grace,
                false,
            ),
            (
                "bound here, lock expired",
                Some("n1"),
                Some(NOW - 301),
                DEFAULT_EXPIRY_SECS,
                true,
            ),
            (
                "unbound, young",
                None,
                Some(NOW - grace + 1),
                grace - 1,
                false,
            ),
            (
                "unbound, past the grace",
                None,
                Some(NOW - grace),
                grace,
                true,
            ),
            (
                "unbound, no bind time, young lock",
                None,
                None,
                grace - 1,
                false,
            ),
            ("unbound, no bind time, old lock", None, None, grace, true),
        ];
        for (case, node_name, bind_time, age, abandoned) in cases {
            let h = holder("Pending", Some("allocating"), node_name, bind_time);
            let verdict = judge_holder(Some(&h), "n1", age, NOW);
            assert_eq!(
                matches!(verdict, Holder::Abandon(_)),
                abandoned,
                "{case}: {verdict:?}"
            );
            if !abandoned {
                assert_eq!(verdict, Holder::Waiting, "{case}");
            }
        }
    }
}

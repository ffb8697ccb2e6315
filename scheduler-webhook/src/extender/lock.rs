//! The node lock decision (`hami.io/mutex.lock`), as pure functions.
//!
//! HAMi keeps a lock from bind until the device plugin's Allocate and
//! otherwise waits five minutes for an abandoned one. We keep the format but
//! release early: a lock whose pod is gone, finished, or already allocated
//! (`bind-phase` success or failed) is taken over at once, and a live holder
//! is waited for (bounded) instead of failing the bind.

use k8s_openapi::api::core::v1::Pod;
use proto::hami::bind::BindPhase;
use proto::hami::keys;
use proto::hami::node_lock::{DEFAULT_EXPIRY_SECS, LockOwner, NodeLock};

/// What the current lock value means for a pod that wants the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// No lock: take it.
    Free,
    /// Already held by this pod.
    Ours,
    /// Held past the expiry, or unreadable: take it over.
    Stale(String),
    /// Held by another pod: look at that pod to decide.
    HeldBy(LockOwner),
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
    if lock.is_expired(now_unix, DEFAULT_EXPIRY_SECS) {
        return LockState::Stale(format!("lock {value} expired"));
    }
    match lock.owner {
        Some(owner) => LockState::HeldBy(owner),
        None => LockState::HeldAnonymously,
    }
}

/// Whether the holder of a lock still needs it, given what the API server
/// says about it (`None`: the pod does not exist).
///
/// `Err` carries why the lock may be taken over.
///
/// # Errors
/// The reason the holder no longer needs the lock.
pub fn holder_needs_lock(holder: Option<&Pod>) -> Result<(), String> {
    let Some(pod) = holder else {
        return Err("its pod is gone".to_owned());
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("its pod is being deleted".to_owned());
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed" | "Running")) {
        return Err(format!("its pod is {}", phase.unwrap_or_default()));
    }
    let bind_phase = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::BIND_PHASE))
        .and_then(|v| v.parse::<BindPhase>().ok());
    match bind_phase {
        Some(BindPhase::Success) => Err("its pod is already allocated".to_owned()),
        Some(BindPhase::Failed) => Err("its pod failed allocation".to_owned()),
        Some(BindPhase::Allocating) | None => Ok(()),
    }
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
        assert_eq!(
            classify(Some("2025-10-20T03:07:00Z,ns,q"), "ns", "p", NOW),
            LockState::HeldBy(LockOwner {
                namespace: "ns".into(),
                pod: "q".into()
            })
        );
        assert!(matches!(
            classify(Some("2025-10-20T03:00:00Z,ns,q"), "ns", "p", NOW),
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

    fn pod(phase: &str, bind_phase: Option<&str>) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(b) = bind_phase {
            annotations.insert(keys::BIND_PHASE.into(), json!(b));
        }
        serde_json::from_value(json!({"metadata": {"name": "q", "annotations": annotations}, "status": {"phase": phase}}))
            .unwrap()
    }

    #[test]
    fn only_a_pending_unallocated_holder_keeps_the_lock() {
        assert!(holder_needs_lock(Some(&pod("Pending", Some("allocating")))).is_ok());
        assert!(holder_needs_lock(Some(&pod("Pending", None))).is_ok());
        for (phase, bind) in [
            ("Pending", Some("success")),
            ("Pending", Some("failed")),
            ("Running", Some("allocating")),
            ("Failed", None),
            ("Succeeded", None),
        ] {
            assert!(
                holder_needs_lock(Some(&pod(phase, bind))).is_err(),
                "{phase} {bind:?}"
            );
        }
        assert_eq!(holder_needs_lock(None), Err("its pod is gone".to_owned()));
    }
}

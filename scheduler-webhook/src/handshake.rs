//! The node handshake (`hami.io/node-handshake`), kept with HAMi's
//! semantics so HAMi's own device plugin can run under this scheduler.
//!
//! [`action`] is the pure rule for one node and [`plan`] for every node;
//! [`run`] is the leader's pass, every 15 s and at once when the model sees
//! a GPU node whose handshake must be requested (HAMi passes on node add
//! too), so a new node is stamped within a round trip. A pass reads the nodes from the
//! model's watch cache (no LIST: at 10,000 nodes a LIST every 15 s would
//! move 10,000 objects 240 times an hour) and patches only the nodes whose
//! value must change. Only the replica whose kube-scheduler holds the Lease
//! writes (it follows the Lease, it never campaigns), and it writes only
//! when the value must change: once per node after it registers, and when
//! a node turns unhealthy. An unhealthy node is marked `Deleted_<time>`
//! (HAMi ≤ v2.9's marker, which HEAD still reads) rather than having the key
//! removed, so a dead node is not re-requested every pass. The model does
//! not wait for that write: it applies the same rule to what the watch
//! shows, at its own clock (`cache::model`'s `health`), and stops offering
//! the node's GPUs the moment its window ends.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use proto::hami::civil_time::CivilDateTime;
use proto::hami::handshake::Handshake;
use proto::hami::keys;
use serde_json::json;
use tracing::{info, warn};

use crate::cache::owner::ModelHandle;
use crate::clock::unix_seconds;
use crate::convert::NodeHandshake;

/// How long a `Requesting_` stamp counts as a fresh answer (HAMi: 60 s).
pub const FRESH_SECS: i64 = 60;
/// Time between passes (HAMi: 15 s).
pub const PERIOD: Duration = Duration::from_secs(15);

/// What to do with one node's handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Leave it as it is.
    Keep,
    /// Write `Requesting_<now>` (missing, unreadable, or a legacy value).
    Request(String),
    /// The node stopped advertising GPUs: write `Deleted_<now>`.
    Unhealthy(String),
}

/// HAMi's rule for a node's handshake at `now_unix`, given the node's
/// `allocatable` count of the GPU resource (`None` when absent).
#[must_use]
pub fn action(current: Option<&str>, allocatable_gpus: Option<i64>, now_unix: i64) -> Action {
    let request = || {
        Handshake::requesting_at(now_unix).map_or(Action::Keep, |h| Action::Request(h.to_string()))
    };
    let unhealthy = || {
        CivilDateTime::from_unix_seconds(now_unix).map_or(Action::Keep, |t| {
            Action::Unhealthy(Handshake::Deleted(t).to_string())
        })
    };
    match current.map(str::parse::<Handshake>) {
        Some(Ok(h @ Handshake::Requesting(_))) => {
            if h.is_fresh_request(now_unix) || allocatable_gpus.unwrap_or(0) > 0 {
                Action::Keep
            } else {
                unhealthy()
            }
        }
        // A node we marked unhealthy comes back when it advertises GPUs again.
        Some(Ok(Handshake::Deleted(_))) if allocatable_gpus.unwrap_or(0) == 0 => Action::Keep,
        _ => request(),
    }
}

/// Whether this replica is the leader: the kube-scheduler Lease is held by
/// an identity starting with our hostname and has not expired.
#[must_use]
pub fn is_leader(lease: &Lease, hostname: &str, now: SystemTime) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    let held_by_us = spec
        .holder_identity
        .as_deref()
        .is_some_and(|id| !hostname.is_empty() && id.starts_with(hostname));
    let Some(renewed) = spec.renew_time.as_ref() else {
        return false;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    held_by_us && renewed.0.as_second() + duration >= unix_seconds(now)
}

/// What the leader writes in one pass: for each GPU node whose handshake
/// must change, the new value. Pure; nodes whose value is right are left
/// out, so a pass over a healthy cluster writes nothing.
#[must_use]
pub fn plan(nodes: &[(String, NodeHandshake)], now_unix: i64) -> Vec<(String, Action)> {
    nodes
        .iter()
        .filter_map(|(name, node)| {
            match action(node.current.as_deref(), node.allocatable_gpus, now_unix) {
                Action::Keep => None,
                change => Some((name.clone(), change)),
            }
        })
        .collect()
}

/// One pass: when this replica leads, reads every GPU node's handshake
/// from the model (the watch cache, never a LIST) and patches the nodes
/// whose value must change. Returns the nodes written.
pub async fn pass(
    leases: &Api<Lease>,
    nodes: &Api<Node>,
    model: &ModelHandle,
    lease_name: &str,
    hostname: &str,
) -> Vec<String> {
    let leader = match leases.get_opt(lease_name).await {
        Ok(Some(lease)) => is_leader(&lease, hostname, SystemTime::now()),
        Ok(None) => false,
        Err(error) => {
            warn!(%error, "cannot read the scheduler lease");
            false
        }
    };
    // A model that has not listed the nodes yet would see them all missing.
    if !leader || !model.is_ready() {
        return Vec::new();
    }
    let Ok(known) = model.handshakes().await else {
        return Vec::new();
    };
    let mut written = Vec::new();
    for (name, change) in plan(&known, unix_seconds(SystemTime::now())) {
        let value = match change {
            Action::Keep => continue,
            Action::Request(v) => v,
            Action::Unhealthy(v) => {
                info!(node = %name, "node advertises no GPUs past the handshake window: unhealthy");
                v
            }
        };
        let patch = json!({"metadata": {"annotations": {keys::NODE_HANDSHAKE: value}}});
        match nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => written.push(name),
            Err(error) => warn!(node = %name, %error, "cannot write the handshake"),
        }
    }
    written
}

/// The leader's pass, every [`PERIOD`] and whenever the model signals a
/// node to request ([`ModelHandle::handshake_due`]), forever.
pub async fn run(
    client: Client,
    model: ModelHandle,
    lease_namespace: String,
    lease_name: String,
    hostname: String,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let nodes: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(PERIOD);
    let mut due = model.handshake_due();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = due.changed() => {
                if changed.is_err() {
                    // The model is gone; the ticks still pass (and find it gone).
                    tick.tick().await;
                }
            }
        }
        pass(&leases, &nodes, &model, &lease_name, &hostname).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    const NOW: i64 = 1_752_282_740; // 2025-07-12 01:12:20 UTC

    #[test]
    fn missing_or_legacy_handshakes_are_requested() {
        assert_eq!(
            action(None, Some(10), NOW),
            Action::Request("Requesting_2025-07-12 01:12:20".to_owned())
        );
        assert!(matches!(
            action(Some("garbage"), Some(10), NOW),
            Action::Request(_)
        ));
        assert!(matches!(
            action(
                Some("Reported 2025-07-12 01:12:00.1 +0000 UTC"),
                Some(10),
                NOW
            ),
            Action::Request(_)
        ));
    }

    #[test]
    fn a_request_is_kept_while_fresh_or_while_gpus_are_allocatable() {
        let fresh = "Requesting_2025-07-12 01:12:00";
        let old = "Requesting_2025-07-12 01:00:00";
        assert_eq!(action(Some(fresh), Some(0), NOW), Action::Keep);
        assert_eq!(action(Some(old), Some(4), NOW), Action::Keep);
        let dead = Action::Unhealthy("Deleted_2025-07-12 01:12:20".to_owned());
        assert_eq!(action(Some(old), Some(0), NOW), dead);
        assert_eq!(action(Some(old), None, NOW), dead);
    }

    #[test]
    fn a_plan_names_only_the_nodes_whose_value_must_change() {
        let node = |current: Option<String>, gpus| NodeHandshake {
            current,
            allocatable_gpus: gpus,
        };
        let fresh = Handshake::requesting_at(NOW).unwrap().to_string();
        let old = Handshake::requesting_at(NOW - 600).unwrap().to_string();
        let nodes = [
            ("a".to_owned(), node(None, Some(1))),
            ("b".to_owned(), node(Some(fresh), Some(0))),
            ("c".to_owned(), node(Some(old.clone()), Some(0))),
            ("d".to_owned(), node(Some(old), Some(2))),
        ];
        let names: Vec<(String, bool)> = plan(&nodes, NOW)
            .into_iter()
            .map(|(n, a)| (n, matches!(a, Action::Unhealthy(_))))
            .collect();
        assert_eq!(names, [("a".to_owned(), false), ("c".to_owned(), true)]);
    }

    #[test]
    fn a_deleted_node_is_requested_again_when_it_advertises_gpus() {
        let deleted = "Deleted_2025-07-12 01:00:00";
        assert_eq!(action(Some(deleted), Some(0), NOW), Action::Keep);
        assert!(matches!(
            action(Some(deleted), Some(2), NOW),
            Action::Request(_)
        ));
    }

    #[test]
    fn the_model_wakes_the_pass_exactly_for_the_values_it_requests_whatever_the_time() {
        let values = [
            None,
            Some("garbage"),
            Some("Reported 2025-07-12 01:12:00.1 +0000 UTC"),
            Some("Requesting_2025-07-12 01:12:00"),
            Some("Deleted_2025-07-12 01:00:00"),
        ];
        for current in values {
            for allocatable in [None, Some(0), Some(4)] {
                let node = NodeHandshake {
                    current: current.map(str::to_owned),
                    allocatable_gpus: allocatable,
                };
                // A fresh stamp: only the time-independent requests remain.
                let requested =
                    matches!(action(current, allocatable, NOW - 20), Action::Request(_));
                assert_eq!(
                    requested,
                    node.needs_request(),
                    "{current:?} {allocatable:?}"
                );
            }
        }
    }

    #[test]
    fn leadership_follows_the_lease_holder_and_expiry() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpuslice-scheduler"},
            "spec": {"holderIdentity": "sched-0_1234", "leaseDurationSeconds": 15,
                     "renewTime": "2025-07-12T01:12:10.000000Z"}
        }))
        .unwrap();
        let at = |secs: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap());
        assert!(is_leader(&lease, "sched-0", at(NOW)));
        assert!(!is_leader(&lease, "sched-1", at(NOW)));
        assert!(!is_leader(&lease, "sched-0", at(NOW + 10)));
        assert!(!is_leader(&lease, "", at(NOW)));
    }
}

//! Why a GPU pod is where it is (pure: the pod and its events in, a report
//! out).
//!
//! For a Pending pod, the GPU scheduler's latest `FilteringFailed` event
//! lists every candidate node with its reasons, HAMi's way
//! (`"n1: 2/2 CardInsufficientMemory, 1/2 CardTypeMismatch; n2: …"`); they
//! are summarized by reason, most common first ("812 nodes:
//! CardInsufficientMemory"). kube-scheduler's own `FailedScheduling`
//! message is shown beside it (it counts nodes its other plugins refused).
//! For a bound pod: the node, each GPU's slice, the scheduler's
//! `FilteringSucceed` message and the policies the pod asked for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod};
use proto::hami::keys;
use proto::hami::pod_devices::PodDevices;
use serde::Serialize;

/// Nodes refused for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    /// The reason, e.g. `CardInsufficientMemory`.
    pub reason: String,
    /// How many candidate nodes gave it.
    pub nodes: usize,
}

/// One container's slice of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Slice {
    /// Container position (init containers first).
    pub container: usize,
    /// GPU UUID.
    pub uuid: String,
    /// Memory, MiB.
    pub memory_mib: i64,
    /// Cores, percent.
    pub cores: i64,
}

/// The answer for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Why {
    /// Bound by the GPU scheduler.
    Bound {
        /// The node.
        node: String,
        /// `hami.io/bind-phase`.
        bind_phase: Option<String>,
        /// What each container holds.
        slices: Vec<Slice>,
        /// The scheduler's `FilteringSucceed` message, if recorded.
        scheduler_said: Option<String>,
        /// The scheduling policies the pod asked for (annotation → value).
        policies: BTreeMap<String, String>,
    },
    /// Not placed yet.
    Pending {
        /// The GPU scheduler's reasons, summarized, most common first.
        reasons: Vec<ReasonCount>,
        /// Candidate nodes in the latest GPU filter.
        candidates: usize,
        /// kube-scheduler's latest `FailedScheduling` message.
        kube_scheduler_said: Option<String>,
        /// Nothing recorded yet: no event names the pod.
        no_events: bool,
    },
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The latest event of `reason` (by last timestamp, then event time, then
/// order given).
fn latest<'e>(events: &'e [Event], reason: &str) -> Option<&'e Event> {
    events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        })
}

/// Splits one `FilteringFailed` message into each node's reasons.
#[must_use]
pub fn parse_refusals(message: &str) -> BTreeMap<String, Vec<String>> {
    let body = message
        .split_once(": ")
        .filter(|(head, _)| !head.contains(';') && head.contains(' '))
        .map_or(message, |(_, rest)| rest);
    let mut out = BTreeMap::new();
    for part in body.split("; ") {
        let Some((node, reasons)) = part.split_once(": ") else {
            continue;
        };
        let reasons = reasons
            .split(", ")
            .map(|r| {
                // "2/2 CardInsufficientMemory" → "CardInsufficientMemory".
                r.trim()
                    .split_once(' ')
                    .filter(|(count, _)| count.contains('/'))
                    .map_or(r.trim(), |(_, name)| name)
                    .to_owned()
            })
            .filter(|r| !r.is_empty())
            .collect();
        out.insert(node.trim().to_owned(), reasons);
    }
    out
}

/// Counts nodes per reason, most common first, then by name.
#[must_use]
pub fn summarize(refusals: &BTreeMap<String, Vec<String>>) -> Vec<ReasonCount> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for reasons in refusals.values() {
        let mut seen: Vec<&str> = reasons.iter().map(String::as_str).collect();
        seen.sort_unstable();
        seen.dedup();
        for r in seen {
            *counts.entry(r).or_default() += 1;
        }
    }
    let mut out: Vec<ReasonCount> = counts
        .into_iter()
        .map(|(reason, nodes)| ReasonCount {
            reason: reason.to_owned(),
            nodes,
        })
        .collect();
    out.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
    out
}

/// Explains `pod` from its events.
#[must_use]
pub fn explain(pod: &Pod, events: &[Event]) -> Why {
    if let Some(node) = annotation(pod, keys::VGPU_NODE) {
        let devices: PodDevices = annotation(pod, keys::VGPU_DEVICES_ALLOCATED)
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        let slices = devices
            .0
            .iter()
            .enumerate()
            .flat_map(|(container, devices)| {
                devices.iter().map(move |d| Slice {
                    container,
                    uuid: d.uuid.clone(),
                    memory_mib: i64::from(d.usedmem),
                    cores: i64::from(d.usedcores),
                })
            })
            .collect();
        let policies = [
            keys::NODE_SCHEDULER_POLICY,
            keys::GPU_SCHEDULER_POLICY,
            keys::USE_GPUTYPE,
            keys::NOUSE_GPUTYPE,
            keys::USE_GPUUUID,
            keys::NOUSE_GPUUUID,
            keys::NUMA_BIND,
        ]
        .into_iter()
        .filter_map(|k| annotation(pod, k).map(|v| (k.to_owned(), v.to_owned())))
        .collect();
        return Why::Bound {
            node: node.to_owned(),
            bind_phase: annotation(pod, keys::BIND_PHASE).map(str::to_owned),
            slices,
            scheduler_said: latest(events, "FilteringSucceed").and_then(|e| e.message.clone()),
            policies,
        };
    }
    let refusals = latest(events, "FilteringFailed")
        .and_then(|e| e.message.as_deref())
        .map(parse_refusals)
        .unwrap_or_default();
    let kube_scheduler_said = latest(events, "FailedScheduling").and_then(|e| e.message.clone());
    Why::Pending {
        reasons: summarize(&refusals),
        candidates: refusals.len(),
        no_events: events.is_empty(),
        kube_scheduler_said,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(reason: &str, message: &str, at: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("e-{at}"), "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"},
            "reason": reason, "message": message, "lastTimestamp": at
        }))
        .unwrap()
    }

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns",
            "annotations": annotations}}))
        .unwrap()
    }

    #[test]
    fn refusals_are_summarized_by_reason_most_common_first() {
        let message = "no node fits: n1: 1/1 CardInsufficientMemory; n2: 2/2 CardInsufficientMemory, 1/2 CardTypeMismatch; n3: node unregistered; n4: Insufficient cpu";
        let refusals = parse_refusals(message);
        assert_eq!(refusals.len(), 4);
        assert_eq!(
            refusals["n2"],
            ["CardInsufficientMemory", "CardTypeMismatch"]
        );
        let summary = summarize(&refusals);
        assert_eq!(
            summary[0],
            ReasonCount {
                reason: "CardInsufficientMemory".into(),
                nodes: 2
            }
        );
        assert_eq!(summary.len(), 4);
    }

    #[test]
    fn a_pending_pod_is_explained_by_its_latest_filter() {
        let events = [
            event(
                "FilteringFailed",
                "no node fits: n1: 1/1 CardInsufficientMemory",
                "2025-10-20T03:00:00Z",
            ),
            event(
                "FilteringFailed",
                "no node fits: n1: 1/1 CardInsufficientCore; n2: 1/1 CardInsufficientCore",
                "2025-10-20T03:05:00Z",
            ),
            event(
                "FailedScheduling",
                "0/2 nodes are available: 2 1/1 CardInsufficientCore.",
                "2025-10-20T03:05:01Z",
            ),
        ];
        let Why::Pending {
            reasons,
            candidates,
            kube_scheduler_said,
            no_events,
        } = explain(&pod(json!({})), &events)
        else {
            panic!("pending expected")
        };
        assert_eq!((candidates, no_events), (2, false));
        assert_eq!(reasons[0].reason, "CardInsufficientCore");
        assert!(kube_scheduler_said.unwrap().starts_with("0/2"));
    }

    #[test]
    fn a_bound_pod_shows_its_node_slices_and_policies() {
        let why = explain(
            &pod(json!({keys::VGPU_NODE: "n1",
                        keys::VGPU_DEVICES_ALLOCATED: "GPU-1,NVIDIA,3000,30:;",
                        keys::BIND_PHASE: "success",
                        keys::GPU_SCHEDULER_POLICY: "spread"})),
            &[event(
                "FilteringSucceed",
                "find fit node(n1), 1 nodes not fit",
                "2025-10-20T03:00:00Z",
            )],
        );
        let Why::Bound {
            node,
            slices,
            scheduler_said,
            policies,
            ..
        } = why
        else {
            panic!("bound expected")
        };
        assert_eq!(node, "n1");
        assert_eq!((slices[0].memory_mib, slices[0].cores), (3000, 30));
        assert!(scheduler_said.unwrap().contains("find fit node(n1)"));
        assert_eq!(policies[keys::GPU_SCHEDULER_POLICY], "spread");
    }
}

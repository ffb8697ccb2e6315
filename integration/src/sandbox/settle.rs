//! When a workload has settled: every pod runs or has finished, or is
//! Pending because kube-scheduler found it unschedulable **after the
//! cluster's last change**. A verdict given before a node registered its
//! GPUs or before a pod gave its slices back says nothing about now:
//! kube-scheduler moves such a pod back to its queue and tries again, and
//! the sandbox waits for that attempt.
//!
//! "After" is measured in resourceVersions, which the API server (etcd's
//! revision, and the fake's global counter) hands out in commit order:
//! a `FailedScheduling` Event committed after the change has a larger one.
//! Fed from three watches (the workload's pods and events, all nodes);
//! pure, so it is tested without a cluster.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::runtime::watcher;

/// One watched list, with the relist bracket of kube-rs watchers applied.
#[derive(Debug)]
struct Listing<K> {
    objects: BTreeMap<String, K>,
    buffer: Option<BTreeMap<String, K>>,
    synced: bool,
}

impl<K> Default for Listing<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: None,
            synced: false,
        }
    }
}

/// An object's identity within its list.
fn key<K: ResourceExt>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// A resourceVersion as the number it is on etcd and on the fake API server.
fn rv<K: ResourceExt>(o: &K) -> u64 {
    o.resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl<K: ResourceExt + Clone> Listing<K> {
    /// Applies a watch event; returns each change as (before, after).
    fn apply(&mut self, event: watcher::Event<K>) -> Vec<(Option<K>, Option<K>)> {
        match event {
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(o) => {
                if let Some(b) = self.buffer.as_mut() {
                    b.insert(key(&o), o);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                self.synced = true;
                let Some(fresh) = self.buffer.take() else {
                    return Vec::new();
                };
                let old = std::mem::replace(&mut self.objects, fresh);
                let mut changes: Vec<(Option<K>, Option<K>)> = self
                    .objects
                    .iter()
                    .map(|(k, o)| (old.get(k).cloned(), Some(o.clone())))
                    .collect();
                changes.extend(
                    old.into_iter()
                        .filter(|(k, _)| !self.objects.contains_key(k))
                        .map(|(_, o)| (Some(o), None)),
                );
                changes
            }
            watcher::Event::Apply(o) => {
                let before = self.objects.insert(key(&o), o.clone());
                vec![(before, Some(o))]
            }
            watcher::Event::Delete(o) => {
                // The deleted object carries the deletion's resourceVersion.
                self.objects.remove(&key(&o));
                vec![(Some(o), None)]
            }
        }
    }
}

/// What of a node can make a pending pod fit: its GPUs (the register and
/// cordon annotations, whether the handshake marked it down), labels,
/// taints and allocatable. Not the node lock (binds wait for it, filters
/// ignore it) nor the handshake's timestamp, which change all the time.
fn node_view(node: &Node) -> String {
    use proto::hami::keys;
    let annotations: BTreeMap<&String, &String> = node
        .annotations()
        .iter()
        .filter(|(k, _)| [keys::NODE_NVIDIA_REGISTER, keys::DEVICE_CORDON].contains(&k.as_str()))
        .collect();
    let handshake_down = node
        .annotations()
        .get(keys::NODE_HANDSHAKE)
        .is_some_and(|h| h.starts_with("Deleted"));
    serde_json::json!({
        "annotations": annotations,
        "handshake_down": handshake_down,
        "labels": node.labels(),
        "spec": node.spec,
        "allocatable": node.status.as_ref().and_then(|s| s.allocatable.as_ref()),
    })
    .to_string()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// A bound, live pod holds resources on its node.
fn holds(pod: &Pod) -> bool {
    bound(pod) && !matches!(phase(pod), "Succeeded" | "Failed")
}

/// The `PodScheduled=False` condition, as (reason, message).
pub fn scheduled_false(pod: &Pod) -> Option<(&str, &str)> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            (
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default(),
            )
        })
}

/// Where a pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Running or finished.
    Done,
    /// Unschedulable, as found after the cluster's last change.
    Unschedulable,
    /// Still in flight, and why it does not count as settled yet.
    InFlight(String),
}

/// The sandbox's view of the workload and of what can change its fate.
#[derive(Debug, Default)]
pub struct Settling {
    pods: Listing<Pod>,
    nodes: Listing<Node>,
    events: Listing<Event>,
    /// resourceVersion of the last change that can make a pending pod fit.
    last_change: u64,
    /// Latest `FailedScheduling` per pod UID: (resourceVersion, message).
    verdicts: HashMap<String, (u64, String)>,
}

impl Settling {
    /// An empty view.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A change from the workload's pod watch.
    pub fn on_pod(&mut self, event: watcher::Event<Pod>) {
        for (before, after) in self.pods.apply(event) {
            // A pod that held resources and let them go can make another fit.
            let freed =
                before.as_ref().is_some_and(holds) && after.as_ref().is_none_or(|a| !holds(a));
            if freed {
                let at = after.as_ref().or(before.as_ref()).map_or(0, rv);
                self.last_change = self.last_change.max(at);
            }
        }
    }

    /// A change from the node watch.
    pub fn on_node(&mut self, event: watcher::Event<Node>) {
        for (before, after) in self.nodes.apply(event) {
            let at = after.as_ref().or(before.as_ref()).map_or(0, rv);
            if before.as_ref().map(node_view) != after.as_ref().map(node_view) {
                self.last_change = self.last_change.max(at);
            }
        }
    }

    /// A change from the workload's event watch.
    pub fn on_event(&mut self, event: watcher::Event<Event>) {
        for (_, after) in self.events.apply(event) {
            let Some(e) = after else { continue };
            if e.reason.as_deref() != Some("FailedScheduling") {
                continue;
            }
            let Some(uid) = e.involved_object.uid.clone() else {
                continue;
            };
            let at = rv(&e);
            let message = e.message.clone().unwrap_or_default();
            let entry = self.verdicts.entry(uid).or_insert((0, String::new()));
            if at > entry.0 {
                *entry = (at, message);
            }
        }
    }

    /// Whether all three lists have been listed once.
    #[must_use]
    pub fn synced(&self) -> bool {
        self.pods.synced && self.nodes.synced && self.events.synced
    }

    /// Each node's GPU UUIDs, as its register annotation lists them (nodes
    /// without one are left out).
    #[must_use]
    pub fn registered_gpus(&self) -> BTreeMap<String, Vec<String>> {
        self.nodes
            .objects
            .values()
            .filter_map(|n| {
                let value = n
                    .annotations()
                    .get(proto::hami::keys::NODE_NVIDIA_REGISTER)?;
                let devices = proto::hami::register::decode(value).ok()?;
                Some((n.name_any(), devices.into_iter().map(|d| d.id).collect()))
            })
            .collect()
    }

    /// The workload's pods, by namespace/name.
    #[must_use]
    pub fn pods(&self) -> Vec<Pod> {
        self.pods.objects.values().cloned().collect()
    }

    /// Where `pod` stands.
    #[must_use]
    pub fn state(&self, pod: &Pod) -> PodState {
        if matches!(phase(pod), "Running" | "Succeeded" | "Failed") {
            return PodState::Done;
        }
        if bound(pod) {
            return PodState::InFlight("bound, not running yet".to_owned());
        }
        let Some((reason, message)) = scheduled_false(pod) else {
            return PodState::InFlight("not tried by kube-scheduler yet".to_owned());
        };
        if reason != "Unschedulable" {
            return PodState::InFlight(format!("{reason}: {message}; kube-scheduler retries it"));
        }
        let uid = pod.uid().unwrap_or_default();
        match self.verdicts.get(&uid) {
            // The condition shows that very verdict (a later attempt that
            // ended otherwise has another message).
            Some((at, said)) if *at > self.last_change && said == message => {
                PodState::Unschedulable
            }
            Some((at, _)) if *at > self.last_change => {
                PodState::InFlight("its latest attempt is not reported yet".to_owned())
            }
            _ => PodState::InFlight(format!(
                "found unschedulable before the cluster last changed (resourceVersion {}); kube-scheduler tries it again",
                self.last_change
            )),
        }
    }

    /// The pods not settled, with why.
    #[must_use]
    pub fn unsettled(&self) -> Vec<(String, String)> {
        self.pods
            .objects
            .values()
            .filter_map(|p| match self.state(p) {
                PodState::InFlight(why) => Some((p.name_any(), why)),
                _ => None,
            })
            .collect()
    }

    /// Pods seen, settled, and running.
    #[must_use]
    pub fn progress(&self) -> (usize, usize, usize) {
        let pods = self.pods.objects.values();
        let settled = pods
            .clone()
            .filter(|p| !matches!(self.state(p), PodState::InFlight(_)))
            .count();
        let running = pods.clone().filter(|p| phase(p) == "Running").count();
        (pods.len(), settled, running)
    }

    /// Whether at least `want` pods are seen and every one is settled.
    #[must_use]
    pub fn settled(&self, want: usize) -> bool {
        self.synced() && self.pods.objects.len() >= want && self.unsettled().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(rv: u64, registered: bool) -> Node {
        let annotations = if registered {
            json!({"hami.io/node-nvidia-register": "[{\"id\":\"GPU-0\"}]"})
        } else {
            json!({})
        };
        serde_json::from_value(
            json!({"metadata": {"name": "n1", "resourceVersion": rv.to_string(),
            "annotations": annotations}}),
        )
        .unwrap()
    }

    fn pending(rv: u64, message: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u-p", "resourceVersion": rv.to_string()},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": message}]}
        }))
        .unwrap()
    }

    fn failed_scheduling(rv: u64, message: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p.{rv}"), "namespace": "default", "resourceVersion": rv.to_string()},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u-p"},
            "reason": "FailedScheduling", "message": message
        }))
        .unwrap()
    }

    fn listed(s: &mut Settling) {
        s.on_pod(watcher::Event::Init);
        s.on_pod(watcher::Event::InitDone);
        s.on_node(watcher::Event::Init);
        s.on_node(watcher::Event::InitDone);
        s.on_event(watcher::Event::Init);
        s.on_event(watcher::Event::InitDone);
    }

    const NO_GPU: &str = "0/1 nodes are available: 1 1/0 NodeInsufficientDevice";

    #[test]
    fn a_verdict_from_before_the_nodes_gpus_arrived_does_not_settle_the_pod() {
        let mut s = Settling::new();
        listed(&mut s);
        s.on_node(watcher::Event::Apply(node(10, false)));
        s.on_event(watcher::Event::Apply(failed_scheduling(12, NO_GPU)));
        let pod = pending(13, NO_GPU);
        s.on_pod(watcher::Event::Apply(pod.clone()));
        assert_eq!(s.state(&pod), PodState::Unschedulable);
        assert!(s.settled(1));

        // The node registers its GPUs: the verdict is stale.
        s.on_node(watcher::Event::Apply(node(14, true)));
        assert!(matches!(s.state(&pod), PodState::InFlight(_)));
        // The per-pod look the sandbox settled on before cannot tell.
        assert!(crate::sandbox::settled(&pod));
        assert!(!s.settled(1));

        // kube-scheduler tries again and still finds no room: settled.
        s.on_event(watcher::Event::Apply(failed_scheduling(20, "too big")));
        assert!(
            matches!(s.state(&pod), PodState::InFlight(_)),
            "condition not updated yet"
        );
        let pod = pending(21, "too big");
        s.on_pod(watcher::Event::Apply(pod.clone()));
        assert_eq!(s.state(&pod), PodState::Unschedulable);
    }

    #[test]
    fn a_node_change_that_cannot_make_a_pod_fit_is_not_a_change() {
        let mut s = Settling::new();
        listed(&mut s);
        s.on_node(watcher::Event::Apply(node(10, true)));
        s.on_event(watcher::Event::Apply(failed_scheduling(12, NO_GPU)));
        let pod = pending(13, NO_GPU);
        s.on_pod(watcher::Event::Apply(pod.clone()));
        let mut handshake = node(15, true);
        handshake.metadata.annotations.as_mut().unwrap().insert(
            proto::hami::keys::NODE_HANDSHAKE.to_owned(),
            "Requesting_2025-01-01 00:00:00".to_owned(),
        );
        s.on_node(watcher::Event::Apply(handshake));
        assert_eq!(s.state(&pod), PodState::Unschedulable);
    }

    #[test]
    fn a_pod_that_frees_its_slices_makes_earlier_verdicts_stale() {
        let mut s = Settling::new();
        listed(&mut s);
        let holder: Pod = serde_json::from_value(json!({
            "metadata": {"name": "holder", "namespace": "default", "uid": "u-h", "resourceVersion": "5"},
            "spec": {"containers": [], "nodeName": "n1"}, "status": {"phase": "Running"}
        }))
        .unwrap();
        s.on_pod(watcher::Event::Apply(holder.clone()));
        s.on_event(watcher::Event::Apply(failed_scheduling(12, NO_GPU)));
        let pod = pending(13, NO_GPU);
        s.on_pod(watcher::Event::Apply(pod.clone()));
        assert_eq!(s.state(&pod), PodState::Unschedulable);
        let mut gone = holder;
        gone.metadata.resource_version = Some("30".into());
        s.on_pod(watcher::Event::Delete(gone));
        assert!(matches!(s.state(&pod), PodState::InFlight(_)));
    }

    #[test]
    fn scheduler_errors_and_untried_pods_are_in_flight() {
        let s = Settling::new();
        let mut pod = pending(3, "extender error");
        assert!(matches!(s.state(&pod), PodState::InFlight(_)), "no verdict");
        pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some("SchedulerError".into());
        assert!(matches!(s.state(&pod), PodState::InFlight(_)));
        pod.status.as_mut().unwrap().conditions = None;
        assert!(matches!(s.state(&pod), PodState::InFlight(_)));
    }
}

//! The scheduling loop: one task owning the node and pod caches (kube-rs
//! watchers; pods with kube-scheduler's `status.phase!=Succeeded,
//! status.phase!=Failed` selector), the queue and the assumed pods. It
//! schedules one pod at a time while leader; binding runs in the
//! background (the pod stays assumed on its node meanwhile) and reports
//! back on a channel, as kube-scheduler's binding cycle does.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::Stats;
use super::config::SchedulerConfig;
use super::extender::Extender;
use super::fit::{self, NodeUsage, Resources};
use super::queue::SchedulingQueue;
use super::usage::UsageBook;
use super::wire::ExtenderBindingArgs;

const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Assumed on a node; binding started.
    Assumed,
    /// No node fits (`Unschedulable`).
    Unschedulable(String),
    /// Something failed (`SchedulerError`).
    Error(String),
    /// The pod is gone or no longer pending.
    Skipped,
}

/// The result of a background bind.
#[derive(Debug)]
struct Bound {
    key: String,
    uid: String,
    node: String,
    result: Result<(), String>,
}

/// A pod placed on a node before the watch shows it bound.
#[derive(Debug, Clone)]
struct Assumed {
    uid: String,
    node: String,
    requests: Resources,
}

/// The loop's state.
pub struct Scheduler {
    client: Client,
    config: SchedulerConfig,
    extender: Option<Arc<Extender>>,
    stats: watch::Sender<Stats>,
    nodes: BTreeMap<String, Node>,
    pods: BTreeMap<String, Pod>,
    /// What the bound pods in `pods` hold per node (assumed pods are added
    /// per attempt from `assumed`).
    usage: UsageBook,
    node_buffer: Option<BTreeMap<String, Node>>,
    pod_buffer: Option<BTreeMap<String, Pod>>,
    nodes_synced: bool,
    pods_synced: bool,
    assumed: HashMap<String, Assumed>,
    queue: SchedulingQueue,
    bind_tx: mpsc::UnboundedSender<Bound>,
    bind_rx: Option<mpsc::UnboundedReceiver<Bound>>,
}

fn key_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The pod with the fields kube-scheduler's `isPodUpdated` ignores removed.
fn scheduling_view(pod: &Pod) -> Value {
    let mut v = serde_json::to_value(pod).unwrap_or(Value::Null);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "resourceVersion",
            "generation",
            "managedFields",
            "finalizers",
        ] {
            meta.remove(k);
        }
    }
    if let Some(obj) = v.as_object_mut() {
        obj.remove("status");
    }
    v
}

impl Scheduler {
    /// A loop for `config` (started by [`super::FakeScheduler::start`]).
    pub fn new(
        client: Client,
        config: SchedulerConfig,
        extender: Option<Extender>,
        stats: watch::Sender<Stats>,
    ) -> Self {
        let (bind_tx, bind_rx) = mpsc::unbounded_channel();
        Self {
            client,
            queue: SchedulingQueue::new(config.backoff, config.unschedulable_flush),
            config,
            extender: extender.map(Arc::new),
            stats,
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            usage: UsageBook::default(),
            node_buffer: None,
            pod_buffer: None,
            nodes_synced: false,
            pods_synced: false,
            assumed: HashMap::new(),
            bind_tx,
            bind_rx: Some(bind_rx),
        }
    }

    fn ours_and_pending(&self, pod: &Pod) -> bool {
        let name = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or(DEFAULT_SCHEDULER);
        name == self.config.scheduler_name
            && node_name(pod).is_none()
            && pod.metadata.deletion_timestamp.is_none()
    }

    /// Runs until `shutdown` turns true. `leader_tx` only keeps the
    /// leadership channel open when no elector runs.
    pub async fn run(
        mut self,
        mut leader: watch::Receiver<bool>,
        leader_tx: watch::Sender<bool>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let _keep_open = leader_tx;
        let Some(mut bind_rx) = self.bind_rx.take() else {
            return;
        };
        let node_api: Api<Node> = Api::all(self.client.clone());
        let pod_api: Api<Pod> = Api::all(self.client.clone());
        let mut nodes = watcher(node_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut pods = watcher(
            pod_api,
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
        )
        .default_backoff()
        .boxed();
        info!(scheduler = %self.config.scheduler_name, "fake scheduler started");
        loop {
            let is_leader = *leader.borrow();
            self.stats.send_if_modified(|s| {
                let changed = s.leader != is_leader;
                s.leader = is_leader;
                changed
            });
            let ready = if is_leader && self.nodes_synced && self.pods_synced {
                self.queue.next_ready(Instant::now())
            } else {
                None
            };
            let wake = async move {
                match ready {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending::<()>().await,
                }
            };
            let mut stop = shutdown.clone();
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break,
                event = nodes.next() => match event {
                    Some(Ok(event)) => self.on_node_event(event),
                    Some(Err(e)) => warn!(error = %e, "node watch"),
                    None => break,
                },
                event = pods.next() => match event {
                    Some(Ok(event)) => self.on_pod_event(event),
                    Some(Err(e)) => warn!(error = %e, "pod watch"),
                    None => break,
                },
                Some(bound) = bind_rx.recv() => self.on_bound(bound).await,
                changed = leader.changed() => if changed.is_err() { break },
                _ = wake => {
                    let Some(key) = self.queue.pop(Instant::now()) else { continue };
                    tokio::select! {
                        _ = stopped(&mut stop) => break,
                        _ = self.attempt(&key) => {}
                    }
                }
            }
        }
        info!(scheduler = %self.config.scheduler_name, "fake scheduler stopped");
    }

    fn publish_synced(&self) {
        let synced = self.nodes_synced && self.pods_synced;
        self.stats.send_if_modified(|s| {
            let changed = s.synced != synced;
            s.synced = synced;
            changed
        });
    }

    fn on_node_event(&mut self, event: watcher::Event<Node>) {
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => self.node_buffer = Some(BTreeMap::new()),
            watcher::Event::InitApply(node) => {
                if let Some(buffer) = self.node_buffer.as_mut() {
                    buffer.insert(name(&node), node);
                }
            }
            watcher::Event::InitDone => {
                if let Some(buffer) = self.node_buffer.take() {
                    self.nodes = buffer;
                }
                self.nodes_synced = true;
                self.publish_synced();
                self.publish_nodes(None);
                self.queue.move_all_unschedulable(Instant::now());
            }
            watcher::Event::Apply(node) => {
                let key = name(&node);
                let changed = self.nodes.get(&key) != Some(&node);
                self.nodes.insert(key.clone(), node);
                if changed {
                    self.queue.move_all_unschedulable(Instant::now());
                    self.publish_nodes(Some(&key));
                }
            }
            watcher::Event::Delete(node) => {
                let key = name(&node);
                self.nodes.remove(&key);
                self.publish_nodes(Some(&key));
            }
        }
    }

    /// Publishes the allocatable of node `name` as the cache holds it now
    /// (none: the node left it), or of every node when `name` is `None`
    /// ([`Stats::node_allocatable`]).
    fn publish_nodes(&self, name: Option<&str>) {
        self.stats.send_if_modified(|s| match name {
            None => {
                let all: BTreeMap<String, fit::Resources> = self
                    .nodes
                    .iter()
                    .map(|(name, node)| (name.clone(), fit::allocatable(node)))
                    .collect();
                let changed = s.node_allocatable != all;
                s.node_allocatable = all;
                changed
            }
            Some(name) => {
                let now = self.nodes.get(name).map(fit::allocatable);
                if s.node_allocatable.get(name) == now.as_ref() {
                    return false;
                }
                match now {
                    Some(a) => s.node_allocatable.insert(name.to_owned(), a),
                    None => s.node_allocatable.remove(name),
                };
                true
            }
        });
    }

    fn on_pod_event(&mut self, event: watcher::Event<Pod>) {
        let now = Instant::now();
        match event {
            watcher::Event::Init => self.pod_buffer = Some(BTreeMap::new()),
            watcher::Event::InitApply(pod) => {
                if let Some(buffer) = self.pod_buffer.as_mut() {
                    buffer.insert(key_of(&pod), pod);
                }
            }
            watcher::Event::InitDone => {
                if let Some(buffer) = self.pod_buffer.take() {
                    self.pods = buffer;
                }
                self.usage.reset(&self.pods);
                self.pods_synced = true;
                self.publish_synced();
                let pending: Vec<(String, String)> = self
                    .pods
                    .values()
                    .filter(|p| self.ours_and_pending(p))
                    .map(|p| (key_of(p), uid_of(p)))
                    .collect();
                for (key, uid) in &pending {
                    if !self.assumed.contains_key(key) {
                        self.queue.observe(key, uid, now);
                    }
                }
                let gone: Vec<String> = self
                    .assumed
                    .keys()
                    .filter(|k| !self.pods.contains_key(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.assumed.remove(&key);
                }
                let bound: Vec<String> = self
                    .pods
                    .iter()
                    .filter(|(_, p)| node_name(p).is_some())
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in bound {
                    self.assumed.remove(&key);
                    self.queue.forget(&key);
                }
                self.queue.move_all_unschedulable(now);
            }
            watcher::Event::Apply(pod) => {
                let key = key_of(&pod);
                self.usage.apply(&key, &pod);
                if node_name(&pod).is_some() {
                    self.assumed.remove(&key);
                    self.queue.forget(&key);
                } else if self.ours_and_pending(&pod) {
                    let updated = self
                        .pods
                        .get(&key)
                        .is_none_or(|o| scheduling_view(o) != scheduling_view(&pod));
                    if updated && !self.assumed.contains_key(&key) {
                        self.queue.observe(&key, &uid_of(&pod), now);
                    }
                } else {
                    self.queue.forget(&key);
                }
                self.pods.insert(key, pod);
            }
            watcher::Event::Delete(pod) => {
                let key = key_of(&pod);
                self.pods.remove(&key);
                self.usage.remove(&key);
                self.assumed.remove(&key);
                self.queue.forget(&key);
                if node_name(&pod).is_some() {
                    self.queue.move_all_unschedulable(now);
                }
            }
        }
    }

    async fn attempt(&mut self, key: &str) {
        self.stats.send_modify(|s| s.attempts += 1);
        let Some(pod) = self.pods.get(key).cloned() else {
            self.queue.forget(key);
            return;
        };
        let outcome = self.decide(&pod).await;
        let now = Instant::now();
        match outcome {
            Outcome::Assumed | Outcome::Skipped => {
                if outcome == Outcome::Skipped {
                    self.queue.forget(key);
                }
            }
            Outcome::Unschedulable(message) => {
                self.stats.send_modify(|s| {
                    s.unschedulable += 1;
                    s.last_failure = Some(message.clone());
                });
                let wait = self.queue.failed_unschedulable(key, now);
                debug!(pod = key, ?wait, %message, "unschedulable");
                self.report_failure(&pod, "Unschedulable", &message).await;
            }
            Outcome::Error(message) => {
                self.stats.send_modify(|s| {
                    s.errors += 1;
                    s.last_failure = Some(message.clone());
                });
                let wait = self.queue.failed_with_error(key, now);
                debug!(pod = key, ?wait, %message, "scheduling error");
                self.report_failure(&pod, "SchedulerError", &message).await;
            }
        }
    }

    /// One scheduling cycle for `pod`: filters, extender, pick, assume and
    /// start binding.
    async fn decide(&mut self, pod: &Pod) -> Outcome {
        if !self.ours_and_pending(pod) {
            return Outcome::Skipped;
        }
        let requests = match fit::pod_requests(pod) {
            Ok(r) => r,
            Err(e) => return Outcome::Error(e.to_string()),
        };
        let extender = self.extender.clone().filter(|e| e.is_interested(pod));
        let ignored = self
            .extender
            .as_ref()
            .map(|e| e.ignored().clone())
            .unwrap_or_default();
        // The watch's bound pods, plus the pods assumed while they bind.
        let mut with_assumed: HashMap<&str, NodeUsage> = HashMap::new();
        for a in self.assumed.values() {
            with_assumed
                .entry(a.node.as_str())
                .or_insert_with(|| self.usage.node(&a.node).cloned().unwrap_or_default())
                .add(&a.requests);
        }
        let empty = NodeUsage::default();
        let usage_of = |name: &str| {
            with_assumed
                .get(name)
                .or_else(|| self.usage.node(name))
                .unwrap_or(&empty)
        };
        let mut statuses: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut feasible: Vec<&Node> = Vec::new();
        for (name, node) in &self.nodes {
            let reasons = fit::filter_node(pod, &requests, node, usage_of(name), &ignored);
            if reasons.is_empty() {
                feasible.push(node);
            } else {
                statuses.insert(name.clone(), reasons);
            }
        }
        let total = self.nodes.len();
        let mut chosen: Option<String> = None;
        if let Some(ext) = extender.as_ref().filter(|e| e.filters())
            && !feasible.is_empty()
        {
            self.stats.send_modify(|s| s.filter_calls += 1);
            match ext.filter(pod, &feasible).await {
                Ok(result) => {
                    for (node, reason) in result
                        .failed_nodes
                        .iter()
                        .chain(result.failed_and_unresolvable.iter())
                    {
                        statuses.insert(node.clone(), vec![reason.clone()]);
                    }
                    let passed = result.node_names.unwrap_or_default();
                    feasible.retain(|n| {
                        passed
                            .iter()
                            .any(|p| Some(p.as_str()) == n.metadata.name.as_deref())
                    });
                    // The extender's order decides (our HAMi returns one).
                    chosen = passed.first().cloned();
                }
                Err(e) => {
                    self.stats.send_modify(|s| s.filter_errors += 1);
                    if !ext.ignorable() {
                        return Outcome::Error(e.to_string());
                    }
                    warn!(error = %e, "ignorable extender failed; skipping it");
                }
            }
        }
        if feasible.is_empty() {
            return Outcome::Unschedulable(fit::no_fit_message(total, &statuses));
        }
        let node = match chosen {
            Some(n) => n,
            None => {
                let mut best: Option<(i128, &Node)> = None;
                for n in &feasible {
                    let name = n.metadata.name.as_deref().unwrap_or("");
                    let score = fit::least_allocated_score(&requests, n, usage_of(name));
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, n));
                    }
                }
                match best.and_then(|(_, n)| n.metadata.name.clone()) {
                    Some(n) => n,
                    None => return Outcome::Unschedulable(fit::no_fit_message(total, &statuses)),
                }
            }
        };
        let key = key_of(pod);
        let uid = uid_of(pod);
        self.assumed.insert(
            key.clone(),
            Assumed {
                uid: uid.clone(),
                node: node.clone(),
                requests,
            },
        );
        let binder = extender.filter(|e| e.binds());
        let client = self.client.clone();
        let stats = self.stats.clone();
        let tx = self.bind_tx.clone();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        tokio::spawn(async move {
            let result = match binder {
                Some(ext) => {
                    stats.send_modify(|s| s.bind_calls += 1);
                    let args = ExtenderBindingArgs {
                        pod_name: name.clone(),
                        pod_namespace: namespace.clone(),
                        pod_uid: uid.clone(),
                        node: node.clone(),
                    };
                    let r = ext.bind(&args).await.map_err(|e| e.to_string());
                    if r.is_err() {
                        stats.send_modify(|s| s.bind_errors += 1);
                    }
                    r
                }
                None => {
                    let r = bind_directly(&client, &namespace, &name, &uid, &node).await;
                    if r.is_ok() {
                        stats.send_modify(|s| s.self_binds += 1);
                    }
                    r
                }
            };
            let _ = tx.send(Bound {
                key,
                uid,
                node,
                result,
            });
        });
        Outcome::Assumed
    }

    async fn on_bound(&mut self, bound: Bound) {
        let pod = self.pods.get(&bound.key).cloned();
        let same_pod = pod.as_ref().is_some_and(|p| uid_of(p) == bound.uid);
        match bound.result {
            Ok(()) => {
                self.stats.send_modify(|s| s.scheduled += 1);
                self.queue.done(&bound.key);
                info!(pod = %bound.key, node = %bound.node, "bound");
                if let Some(pod) = pod.filter(|_| same_pod) {
                    let message = format!("Successfully assigned {} to {}", bound.key, bound.node);
                    self.emit_event(&pod, "Normal", "Scheduled", &message).await;
                }
            }
            Err(e) => {
                if self
                    .assumed
                    .get(&bound.key)
                    .is_some_and(|a| a.uid == bound.uid)
                {
                    self.assumed.remove(&bound.key);
                }
                let message = format!("binding rejected: {e}");
                self.stats.send_modify(|s| {
                    s.errors += 1;
                    s.last_failure = Some(message.clone());
                });
                match pod.filter(|p| same_pod && node_name(p).is_none()) {
                    Some(pod) => {
                        self.queue.failed_with_error(&bound.key, Instant::now());
                        self.report_failure(&pod, "SchedulerError", &message).await;
                    }
                    None => self.queue.forget(&bound.key),
                }
            }
        }
    }

    /// `FailedScheduling` event plus `PodScheduled=False` with `reason`.
    async fn report_failure(&self, pod: &Pod, reason: &str, message: &str) {
        warn!(pod = %key_of(pod), %reason, %message, "FailedScheduling");
        self.emit_event(pod, "Warning", "FailedScheduling", message)
            .await;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        let current: Vec<Value> = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| {
                c.iter()
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect()
            })
            .unwrap_or_default();
        let previous = current
            .iter()
            .find(|c| c["type"] == "PodScheduled")
            .cloned();
        let transition = match &previous {
            Some(p) if p["status"] == "False" && !p["lastTransitionTime"].is_null() => {
                p["lastTransitionTime"].clone()
            }
            _ => json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        };
        let mut conditions: Vec<Value> = current
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conditions.push(json!({
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": transition,
        }));
        let patch = json!({"status": {"conditions": conditions}});
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(pod = %name, error = %e, "cannot set PodScheduled=False");
        }
    }

    async fn emit_event(&self, pod: &Pod, kind: &str, reason: &str, message: &str) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        let instance = self
            .config
            .leader_election
            .as_ref()
            .map(|l| l.identity.clone())
            .unwrap_or_else(|| self.config.scheduler_name.clone());
        let event = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": format!("{name}.{:x}", now.as_nanosecond()),
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": pod.metadata.uid,
                "resourceVersion": pod.metadata.resource_version,
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "action": "Scheduling",
            "source": {"component": self.config.scheduler_name},
            "reportingComponent": self.config.scheduler_name,
            "reportingInstance": instance,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "count": 1,
        });
        let event: Event = match serde_json::from_value(event) {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "cannot build event");
                return;
            }
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            warn!(pod = %name, error = %e, "cannot create event");
        }
    }
}

/// `POST pods/<name>/binding` (the DefaultBinder).
async fn bind_directly(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<(), String> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
        .await
        .map(|_| ())
        .map_err(|e| format!("running Bind plugin \"DefaultBinder\": {e}"))
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

//! The one task that owns the [`ClusterModel`]: watch events and extender
//! requests arrive as messages and are applied in order, so the model has a
//! single writer and needs no lock.
//!
//! [`ModelHandle`] is the cheap, cloneable address of that task.
//!
//! A filter that names nodes the model has no GPUs for yet (the watch has
//! not delivered them, or not their register annotation) waits, bounded by
//! [`UNREGISTERED_WAIT`], for the next node change and filters again, as
//! HAMi's filter polls its cache for up to 100 ms. The wait is awaited on a
//! node-change signal the owner publishes, and runs in the caller's task:
//! the owner never blocks. A node waited for in vain is not waited for
//! again until it registers, so a node without GPUs costs one wait, not one
//! per filter.
//!
//! A filter where no candidate fits waits too, bounded by [`CATCH_UP_WAIT`],
//! for the model's next change (a pod or node event) and decides again.
//! kube-scheduler retries a pod an extender rejected on the next cluster
//! event it sees, such as a pod finishing; its watch and ours see that event
//! milliseconds apart, and a retry answered before our watch delivered it
//! would be refused again with no later event to retry on, leaving the pod
//! to kube-scheduler's 5-minute flush (seen on the real control plane).
//!
//! The model reads no clock: the owner tells it the time before every node
//! event and every filter, so a GPU node whose handshake window ended stops
//! being offered from the next filter on. A GPU node whose handshake must be
//! requested (new, never stamped, or back after `Deleted_`) bumps
//! [`ModelHandle::handshake_due`], so the leader stamps it at once, as HAMi's
//! registration pass runs on node add, instead of at its next 15 s tick.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::model::{
    ClusterModel, Decided, DryRun, FilterOutcome, FragmentationSnapshot, GpuSnapshot, PendingPod,
    SliceSnapshot,
};
use crate::convert::NodeHandshake;
use crate::core::quota::QuotaStatus;
use proto::hami::keys;

/// How long a filter waits for nodes it names to be registered in the
/// model (HAMi's filter polls its node cache for up to 100 ms).
pub const UNREGISTERED_WAIT: Duration = Duration::from_millis(100);

/// How long a filter where nothing fits waits for the model to catch up with
/// an event kube-scheduler may already have seen (see the module doc). It is
/// also the extra time a truly unschedulable pod's filter takes when the
/// cluster is quiet.
pub const CATCH_UP_WAIT: Duration = Duration::from_millis(50);

/// The kinds the model is fed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Nodes.
    Nodes,
    /// Pods.
    Pods,
    /// ResourceQuotas.
    Quotas,
}

/// A message to the model's owner.
#[derive(Debug)]
pub enum Command {
    /// A node was added or changed.
    ApplyNode(Box<Node>),
    /// A node was deleted.
    DeleteNode(String),
    /// A pod was added or changed.
    ApplyPod(Box<Pod>),
    /// A pod was deleted (by UID).
    DeletePod(String),
    /// A ResourceQuota was added or changed.
    ApplyQuota(Box<ResourceQuota>),
    /// A ResourceQuota was deleted.
    DeleteQuota {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A full relist of `Kind` starts: objects not seen before it ends are gone.
    RelistStarted(Kind),
    /// The relist of `Kind` ended.
    RelistDone(Kind),
    /// Place a pod and reserve its slices.
    Filter {
        /// The pod.
        pod: Box<Pod>,
        /// Candidate nodes.
        candidates: Arc<[String]>,
        /// On a refusal, name in [`Filtered::Refused`] the candidates that
        /// have no GPUs in the model yet (and were not waited for in vain
        /// before).
        patient: bool,
        /// Where the answer goes.
        reply: oneshot::Sender<Filtered>,
    },
    /// Check a pod against Node objects, reserving nothing (see
    /// [`ClusterModel::dry_run`]).
    DryRun {
        /// The pod.
        pod: Box<Pod>,
        /// The Node objects, as the request carried them.
        nodes: Arc<[Node]>,
        /// Where the answer goes.
        reply: oneshot::Sender<DryRun>,
    },
    /// These nodes were waited for in vain: later filters do not wait for
    /// them until they register.
    GiveUp(Vec<String>),
    /// Read the decision waiting for a pod's bind.
    Decision {
        /// Pod UID.
        uid: String,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<Decided>>,
    },
    /// Read what the handshake needs from every GPU node.
    Handshakes {
        /// Where the answer goes.
        reply: oneshot::Sender<Vec<(String, NodeHandshake)>>,
    },
    /// Read every GPU's and every slice's use (for metrics).
    Snapshot {
        /// Where the answer goes.
        reply: oneshot::Sender<(Vec<GpuSnapshot>, Vec<SliceSnapshot>)>,
    },
    /// Read the pods whose last filter found no node (for the dashboard).
    GetPending {
        /// Where the answer goes.
        reply: oneshot::Sender<Vec<PendingPod>>,
    },
    /// Read the cluster's fragmentation (for the dashboard).
    GetFragmentation {
        /// Where the answer goes.
        reply: oneshot::Sender<FragmentationSnapshot>,
    },
    /// Read one namespace's quota limits and use (`None`: no quota there).
    GetQuota {
        /// The namespace.
        namespace: String,
        /// Where the answer goes.
        reply: oneshot::Sender<Option<QuotaStatus>>,
    },
    /// Read every namespace's quota limits and use (for metrics).
    GetQuotas {
        /// Where the answer goes.
        reply: oneshot::Sender<Vec<QuotaStatus>>,
    },
    /// Follow a node's lock annotation (`hami.io/mutex.lock`) as the node
    /// watch sees it: the receiver changes when the value does, and closes
    /// when the node is deleted.
    WatchNodeLock {
        /// The node.
        node: String,
        /// Where the receiver goes.
        reply: oneshot::Sender<watch::Receiver<Option<String>>>,
    },
    /// The pod is bound: its reservation is now a commitment.
    Commit(String),
    /// The bind failed: drop the reservation.
    Release(String),
}

/// The owner's answer to a [`Command::Filter`].
#[derive(Debug)]
pub enum Filtered {
    /// The decision.
    Decided(FilterOutcome),
    /// No candidate fits: the pod is handed back with the verdict, to be
    /// filtered again after the model's next change (bounded), with the
    /// candidates that have no GPUs in the model yet.
    Refused {
        /// The pod, to filter again.
        pod: Box<Pod>,
        /// The verdict, answered if nothing changes in time.
        outcome: FilterOutcome,
        /// The candidates without GPUs in the model (empty when the filter
        /// is no longer patient with them).
        unregistered: Vec<String>,
    },
}

/// Why the model could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the scheduling model is shutting down")]
pub struct ModelGone;

/// The address of the model's owner task.
#[derive(Debug, Clone)]
pub struct ModelHandle {
    tx: mpsc::Sender<Command>,
    ready: watch::Receiver<bool>,
    /// Bumped by the owner after every node or pod change it applied.
    changes: watch::Receiver<u64>,
    /// Bumped by the owner when a GPU node's handshake must be requested.
    handshake_due: watch::Receiver<u64>,
    /// How long a filter waits for unregistered candidates.
    patience: Duration,
    /// The binds of this process that wait for a node's lock take turns,
    /// one at a time per node, so only one of them reads and writes the
    /// Node for the lock (see [`ModelHandle::bind_turn`]).
    bind_turns: Arc<std::sync::Mutex<BindTurns>>,
}

/// Each node's bind turn, kept while a bind holds or awaits it: turns no
/// bind holds are dropped once the map has doubled since it was last
/// pruned, so a cluster whose nodes come and go does not grow it forever.
#[derive(Debug, Default)]
struct BindTurns {
    by_node: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    prune_at: usize,
}

impl BindTurns {
    /// The least size at which the map is pruned.
    const PRUNE_FLOOR: usize = 64;

    fn turn(&mut self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        if self.by_node.len() >= self.prune_at.max(Self::PRUNE_FLOOR) {
            // Every clone is made under the map's lock, so a turn only the
            // map holds has no bind holding or awaiting it.
            self.by_node.retain(|_, turn| Arc::strong_count(turn) > 1);
            self.prune_at = 2 * self.by_node.len();
        }
        Arc::clone(self.by_node.entry(node.to_owned()).or_default())
    }
}

impl ModelHandle {
    /// Sends a command without waiting for an answer.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn send(&self, command: Command) -> Result<(), ModelGone> {
        self.tx.send(command).await.map_err(|_| ModelGone)
    }

    /// Follows `node`'s lock annotation as the node watch sees it
    /// ([`Command::WatchNodeLock`]).
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn watch_node_lock(
        &self,
        node: &str,
    ) -> Result<watch::Receiver<Option<String>>, ModelGone> {
        self.ask(|reply| Command::WatchNodeLock {
            node: node.to_owned(),
            reply,
        })
        .await
    }

    /// The turn of binds to `node` in this process: a bind holds it while it
    /// takes the node's lock, so binds queued for one node (kube-scheduler
    /// binds many pods at once) wait in order here, not by each polling the
    /// API server. A node's turn lives while some bind holds or awaits it:
    /// turns no bind holds are dropped once the map has doubled since it
    /// was last pruned.
    #[must_use]
    pub fn bind_turn(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.bind_turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .turn(node)
    }

    /// Sends the command `make` builds around a reply channel and waits for
    /// the owner's answer.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ModelGone> {
        let (reply, answer) = oneshot::channel();
        self.send(make(reply)).await?;
        answer.await.map_err(|_| ModelGone)
    }

    /// The same handle with filters waiting up to `patience` (instead of
    /// [`UNREGISTERED_WAIT`]) for unregistered candidates.
    #[must_use]
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Filters a pod (see [`ClusterModel::filter`]). When no node fits, waits
    /// for the model's next node or pod change and filters again: up to the
    /// handle's patience ([`UNREGISTERED_WAIT`]) while some candidates have no
    /// GPUs in the model yet, otherwise up to [`CATCH_UP_WAIT`].
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn filter(
        &self,
        pod: Pod,
        candidates: Arc<[String]>,
    ) -> Result<FilterOutcome, ModelGone> {
        // Subscribed before the first filter: a change the owner applies
        // after that filter is never missed.
        let mut changes = self.changes.clone();
        changes.borrow_and_update();
        let start = Instant::now();
        let catch_up = start + CATCH_UP_WAIT;
        let patience = start + self.patience;
        let mut pod = Box::new(pod);
        let mut patient = true;
        loop {
            let answer = self
                .ask(|reply| Command::Filter {
                    pod,
                    candidates: Arc::clone(&candidates),
                    patient,
                    reply,
                })
                .await?;
            let (back, outcome, missing) = match answer {
                Filtered::Decided(outcome) => return Ok(outcome),
                Filtered::Refused {
                    pod,
                    outcome,
                    unregistered,
                } => (pod, outcome, unregistered),
            };
            pod = back;
            // Candidates still registering get the handle's patience; a plain
            // refusal only the catch-up wait.
            let until = if missing.is_empty() {
                catch_up
            } else {
                patience
            };
            match tokio::time::timeout_at(until, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ModelGone),
                Err(_) if missing.is_empty() => return Ok(outcome),
                Err(_) => {
                    debug!(nodes = ?missing, "nodes still unregistered after the wait; not waiting for them again");
                    self.send(Command::GiveUp(missing)).await?;
                    patient = false;
                }
            }
        }
    }

    /// Checks a pod against Node objects without reserving anything (see
    /// [`ClusterModel::dry_run`]). Never waits: the nodes are in the request.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn dry_run(&self, pod: Pod, nodes: Arc<[Node]>) -> Result<DryRun, ModelGone> {
        self.ask(|reply| Command::DryRun {
            pod: Box::new(pod),
            nodes,
            reply,
        })
        .await
    }

    /// A receiver bumped whenever a GPU node's handshake must be requested
    /// (the handshake task passes at once instead of at its next tick).
    #[must_use]
    pub fn handshake_due(&self) -> watch::Receiver<u64> {
        self.handshake_due.clone()
    }

    /// The decision waiting for a pod's bind.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn decision(&self, uid: &str) -> Result<Option<Decided>, ModelGone> {
        self.ask(|reply| Command::Decision {
            uid: uid.to_owned(),
            reply,
        })
        .await
    }

    /// Every GPU's and every slice's use.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn snapshot(&self) -> Result<(Vec<GpuSnapshot>, Vec<SliceSnapshot>), ModelGone> {
        self.ask(|reply| Command::Snapshot { reply }).await
    }

    /// The pods whose last filter found no node, with why.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn pending(&self) -> Result<Vec<PendingPod>, ModelGone> {
        self.ask(|reply| Command::GetPending { reply }).await
    }

    /// The cluster's fragmentation for the current workload.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn fragmentation(&self) -> Result<FragmentationSnapshot, ModelGone> {
        self.ask(|reply| Command::GetFragmentation { reply }).await
    }

    /// What the handshake reads from every GPU node, as the watch last
    /// delivered it.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn handshakes(&self) -> Result<Vec<(String, NodeHandshake)>, ModelGone> {
        self.ask(|reply| Command::Handshakes { reply }).await
    }

    /// One namespace's quota limits and use; `None` when it has no quota.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn quota(&self, namespace: &str) -> Result<Option<QuotaStatus>, ModelGone> {
        self.ask(|reply| Command::GetQuota {
            namespace: namespace.to_owned(),
            reply,
        })
        .await
    }

    /// Every namespace's quota limits and use.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner has stopped.
    pub async fn quotas(&self) -> Result<Vec<QuotaStatus>, ModelGone> {
        self.ask(|reply| Command::GetQuotas { reply }).await
    }

    /// Whether nodes, pods and quotas have been listed once.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the model is ready.
    ///
    /// # Errors
    /// [`ModelGone`] when the owner stopped first.
    pub async fn wait_ready(&self) -> Result<(), ModelGone> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| ModelGone)
    }
}

/// Starts the owner task on the current tokio runtime, telling the model
/// the wall-clock time.
#[must_use]
pub fn spawn(model: ClusterModel) -> ModelHandle {
    spawn_with_clock(model, crate::clock::now_unix)
}

/// Starts the owner task with `clock` (unix seconds) as the model's time.
#[must_use]
pub fn spawn_with_clock(model: ClusterModel, clock: fn() -> i64) -> ModelHandle {
    let (tx, rx) = mpsc::channel(1024);
    let (ready_tx, ready) = watch::channel(false);
    let (changes_tx, changes) = watch::channel(0);
    let (due_tx, handshake_due) = watch::channel(0);
    let signals = Signals {
        ready: ready_tx,
        changed: changes_tx,
        handshake_due: due_tx,
    };
    tokio::spawn(run(model, rx, signals, clock));
    ModelHandle {
        tx,
        ready,
        changes,
        handshake_due,
        patience: UNREGISTERED_WAIT,
        bind_turns: Arc::default(),
    }
}

/// Sets `node`'s lock value, waking its followers only when it changed.
fn publish_lock(
    locks: &mut HashMap<String, watch::Sender<Option<String>>>,
    node: &str,
    lock: Option<String>,
) {
    match locks.get(node) {
        Some(sender) => {
            sender.send_if_modified(|seen| {
                let changed = *seen != lock;
                if changed {
                    *seen = lock;
                }
                changed
            });
        }
        None => {
            locks.insert(node.to_owned(), watch::channel(lock).0);
        }
    }
}

/// What the owner publishes.
struct Signals {
    ready: watch::Sender<bool>,
    changed: watch::Sender<u64>,
    handshake_due: watch::Sender<u64>,
}

#[derive(Default)]
struct Relist {
    nodes: Option<HashSet<String>>,
    pods: Option<HashSet<String>>,
    quotas: Option<HashSet<(String, String)>>,
    nodes_listed: bool,
    pods_listed: bool,
    quotas_listed: bool,
}

async fn run(
    mut model: ClusterModel,
    mut rx: mpsc::Receiver<Command>,
    signals: Signals,
    clock: fn() -> i64,
) {
    let Signals {
        ready,
        changed,
        handshake_due,
    } = signals;
    let mut relist = Relist::default();
    // Nodes a filter waited for in vain (see the module doc).
    let mut given_up: HashSet<String> = HashSet::new();
    // Every node's lock annotation, for binds waiting on one.
    let mut locks: HashMap<String, watch::Sender<Option<String>>> = HashMap::new();
    while let Some(command) = rx.recv().await {
        // Filters waiting for unregistered nodes, or for the model to catch
        // up after a verdict of no fit, wake on every node or pod change.
        let change = matches!(
            command,
            Command::ApplyNode(_)
                | Command::DeleteNode(_)
                | Command::ApplyPod(_)
                | Command::DeletePod(_)
                | Command::RelistDone(Kind::Nodes | Kind::Pods)
        );
        if matches!(
            command,
            Command::ApplyNode(_) | Command::Filter { .. } | Command::DryRun { .. }
        ) {
            for name in model.advance_clock(clock()) {
                info!(node = %name, "GPU node advertises no GPUs past its handshake window: not offered");
            }
        }
        match command {
            Command::ApplyNode(node) => {
                if let (Some(seen), Some(name)) =
                    (relist.nodes.as_mut(), node.metadata.name.as_ref())
                {
                    seen.insert(name.clone());
                }
                let offered_before = node
                    .metadata
                    .name
                    .as_ref()
                    .map(|n| model.unregistered(std::slice::from_ref(n)).next().is_none());
                if let Some(name) = node.metadata.name.as_ref() {
                    let lock = node
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(keys::NODE_LOCK))
                        .cloned();
                    publish_lock(&mut locks, name, lock);
                }
                if let Err(error) = model.apply_node(&node) {
                    warn!(node = ?node.metadata.name, %error, "node annotation does not decode; keeping its previous GPUs");
                }
                if let Some(name) = node.metadata.name.as_ref() {
                    let offered = model
                        .unregistered(std::slice::from_ref(name))
                        .next()
                        .is_none();
                    if offered_before != Some(offered) {
                        let handshake = model.handshake_of(name);
                        info!(
                            node = %name,
                            offered,
                            handshake = ?handshake.and_then(|h| h.current.as_deref()),
                            allocatable = ?handshake.and_then(|h| h.allocatable_gpus),
                            "GPU node offer changed"
                        );
                    }
                }
                if let Some(name) = node.metadata.name.as_ref()
                    && model
                        .unregistered(std::slice::from_ref(name))
                        .next()
                        .is_none()
                {
                    given_up.remove(name);
                }
                if let Some(name) = node.metadata.name.as_ref()
                    && model
                        .handshake_of(name)
                        .is_some_and(NodeHandshake::needs_request)
                {
                    handshake_due.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
            Command::DeleteNode(name) => {
                given_up.remove(&name);
                // Closes the receivers: their binds read the Node again.
                locks.remove(&name);
                model.delete_node(&name);
            }
            Command::ApplyPod(pod) => {
                if let (Some(seen), Some(uid)) = (relist.pods.as_mut(), pod.metadata.uid.as_ref()) {
                    seen.insert(uid.clone());
                }
                model.apply_pod(&pod);
            }
            Command::DeletePod(uid) => model.delete_pod(&uid),
            Command::ApplyQuota(quota) => {
                if let (Some(seen), Some(ns), Some(name)) = (
                    relist.quotas.as_mut(),
                    quota.metadata.namespace.as_ref(),
                    quota.metadata.name.as_ref(),
                ) {
                    seen.insert((ns.clone(), name.clone()));
                }
                if let Err(bad) = model.apply_quota(&quota) {
                    for error in bad {
                        warn!(%error, "resourcequota value is not a whole number; that limit is ignored");
                    }
                }
            }
            Command::DeleteQuota { namespace, name } => model.delete_quota(&namespace, &name),
            Command::RelistStarted(Kind::Nodes) => relist.nodes = Some(HashSet::new()),
            Command::RelistStarted(Kind::Pods) => {
                model.pod_relist_started();
                relist.pods = Some(HashSet::new());
            }
            Command::RelistStarted(Kind::Quotas) => relist.quotas = Some(HashSet::new()),
            Command::RelistDone(Kind::Nodes) => {
                let seen = relist.nodes.take().unwrap_or_default();
                // Nodes deleted while the watch was down: as on a delete
                // event, their lock followers close and their give-ups go.
                locks.retain(|name, _| seen.contains(name));
                given_up.retain(|name| seen.contains(name));
                model.reconcile_nodes(&seen);
                relist.nodes_listed = true;
            }
            Command::RelistDone(Kind::Pods) => {
                model.reconcile_pods(&relist.pods.take().unwrap_or_default());
                relist.pods_listed = true;
            }
            Command::RelistDone(Kind::Quotas) => {
                model.reconcile_quotas(&relist.quotas.take().unwrap_or_default());
                relist.quotas_listed = true;
            }
            Command::Filter {
                pod,
                candidates,
                patient,
                reply,
            } => {
                let outcome = model.filter(&pod, &candidates);
                // The dashboard shows why a pod is pending.
                if let (FilterOutcome::NoFit { failed }, Some(uid)) =
                    (&outcome, pod.metadata.uid.as_deref())
                {
                    model.refused(uid, failed);
                }
                // Only a refusal waits: the names are looked up only then,
                // and a pod that fits among the registered nodes is placed.
                let missing: Vec<String> =
                    if patient && matches!(outcome, FilterOutcome::NoFit { .. }) {
                        model
                            .unregistered(&candidates)
                            .filter(|n| !given_up.contains(n.as_str()))
                            .cloned()
                            .collect()
                    } else {
                        Vec::new()
                    };
                let _ = reply.send(if matches!(outcome, FilterOutcome::NoFit { .. }) {
                    Filtered::Refused {
                        pod,
                        outcome,
                        unregistered: missing,
                    }
                } else {
                    Filtered::Decided(outcome)
                });
            }
            Command::DryRun { pod, nodes, reply } => {
                let _ = reply.send(model.dry_run(&pod, &nodes));
            }
            Command::GiveUp(nodes) => given_up.extend(nodes),
            Command::Decision { uid, reply } => {
                let _ = reply.send(model.decision(&uid).cloned());
            }
            Command::Handshakes { reply } => {
                let _ = reply.send(
                    model
                        .handshakes()
                        .map(|(n, h)| (n.to_owned(), h.clone()))
                        .collect(),
                );
            }
            Command::Snapshot { reply } => {
                let _ = reply.send((model.gpu_snapshot(), model.slice_snapshot()));
            }
            Command::GetPending { reply } => {
                let _ = reply.send(model.pending());
            }
            Command::GetFragmentation { reply } => {
                let _ = reply.send(model.fragmentation());
            }
            Command::GetQuota { namespace, reply } => {
                let _ = reply.send(model.quota_status(&namespace));
            }
            Command::GetQuotas { reply } => {
                let _ = reply.send(model.quota_snapshot());
            }
            Command::WatchNodeLock { node, reply } => {
                let follower = locks
                    .entry(node)
                    .or_insert_with(|| watch::channel(None).0)
                    .subscribe();
                let _ = reply.send(follower);
            }
            Command::Commit(uid) => {
                if let Err(error) = model.commit(&uid) {
                    debug!(%uid, %error, "commit without reservation (already observed from annotations)");
                }
            }
            Command::Release(uid) => {
                model.release(&uid);
            }
        }
        if change {
            changed.send_modify(|v| *v = v.wrapping_add(1));
        }
        if relist.nodes_listed && relist.pods_listed && relist.quotas_listed && !*ready.borrow() {
            let _ = ready.send(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cache::model::ModelConfig;
    use crate::core::policy::SchedulerConfig;
    use crate::core::request::RequestConfig;

    fn model() -> ClusterModel {
        ClusterModel::new(ModelConfig {
            scheduler: SchedulerConfig::default(),
            requests: RequestConfig::default(),
            seed: 1,
        })
    }

    fn quota(name: &str, mem: &str) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": mem}}
        }))
        .unwrap()
    }

    async fn listed(handle: &ModelHandle, kind: Kind, quotas: Vec<ResourceQuota>) {
        handle.send(Command::RelistStarted(kind)).await.unwrap();
        for q in quotas {
            handle.send(Command::ApplyQuota(Box::new(q))).await.unwrap();
        }
        handle.send(Command::RelistDone(kind)).await.unwrap();
    }

    const NOW: i64 = 1_752_282_740; // 2025-07-12 01:12:20 UTC

    fn gpu_node(name: &str, handshake: Option<&str>, allocatable: &str) -> Node {
        let device = proto::hami::register::NodeDevice {
            id: format!("GPU-{name}"),
            index: 0,
            count: 10,
            devmem: 1000,
            devcore: 100,
            device_type: "NVIDIA-Tesla T4".into(),
            numa: 0,
            mode: "hami-core".into(),
            health: true,
            mig_profiles: Vec::new(),
        };
        let mut annotations = serde_json::Map::new();
        annotations.insert(
            proto::hami::keys::NODE_NVIDIA_REGISTER.into(),
            proto::hami::register::encode_json(&[device])
                .unwrap()
                .into(),
        );
        if let Some(h) = handshake {
            annotations.insert(proto::hami::keys::NODE_HANDSHAKE.into(), h.into());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": {"nvidia.com/gpu": allocatable}}
        }))
        .unwrap()
    }

    fn slice_pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "100"}}}]}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_gpu_node_whose_handshake_must_be_requested_wakes_the_handshake_task() {
        let handle = spawn_with_clock(model(), || NOW);
        let mut due = handle.handshake_due();
        let apply = |node: Node| handle.send(Command::ApplyNode(Box::new(node)));
        let settled = || handle.quotas();

        apply(gpu_node(
            "stamped",
            Some("Requesting_2025-07-12 01:12:00"),
            "10",
        ))
        .await
        .unwrap();
        apply(serde_json::from_value(json!({"metadata": {"name": "cpu"}})).unwrap())
            .await
            .unwrap();
        settled().await.unwrap();
        assert!(!due.has_changed().unwrap(), "nothing to request");

        apply(gpu_node("new", None, "0")).await.unwrap();
        settled().await.unwrap();
        assert!(
            due.has_changed().unwrap(),
            "a new GPU node is requested at once"
        );
        due.borrow_and_update();

        // Back after Deleted_: requested at once too.
        apply(gpu_node("back", Some("Deleted_2025-07-12 01:00:00"), "10"))
            .await
            .unwrap();
        settled().await.unwrap();
        assert!(due.has_changed().unwrap());
    }

    #[tokio::test]
    async fn the_owner_tells_the_model_the_time_before_each_filter() {
        // The stamp is 20 s before NOW; the clock reads 59 s after it: the
        // window (60 s) is still open.
        let handle = spawn_with_clock(model(), || NOW + 39);
        let stamped = gpu_node("n1", Some("Requesting_2025-07-12 01:12:00"), "0");
        handle
            .send(Command::ApplyNode(Box::new(stamped.clone())))
            .await
            .unwrap();
        let n1: Arc<[String]> = Arc::from(vec!["n1".to_owned()]);
        let placed = handle
            .filter(slice_pod("a"), Arc::clone(&n1))
            .await
            .unwrap();
        assert!(matches!(placed, FilterOutcome::Placed { .. }), "{placed:?}");

        // A clock 60 s after the stamp: withdrawn before the filter runs.
        let late = spawn_with_clock(model(), || NOW + 40);
        late.send(Command::ApplyNode(Box::new(stamped)))
            .await
            .unwrap();
        let refused = late.filter(slice_pod("a"), n1).await.unwrap();
        let FilterOutcome::NoFit { failed } = refused else {
            panic!("expected no fit: {refused:?}");
        };
        assert_eq!(failed["n1"], "node unregistered");
    }

    #[tokio::test]
    async fn readiness_waits_for_quotas_and_a_relist_drops_quotas_deleted_meanwhile() {
        let handle = spawn(model());
        listed(&handle, Kind::Nodes, vec![]).await;
        listed(&handle, Kind::Pods, vec![]).await;
        // A round trip through the owner: every command before it is applied.
        assert_eq!(handle.quota("team-a").await.unwrap(), None);
        assert!(!handle.is_ready(), "quotas not listed yet");

        listed(
            &handle,
            Kind::Quotas,
            vec![quota("tight", "1000"), quota("wide", "5000")],
        )
        .await;
        handle.wait_ready().await.unwrap();
        let status = handle.quota("team-a").await.unwrap().unwrap();
        assert_eq!(status.limits.memory_mib, Some(1000));

        // The watch broke; "tight" was deleted before the relist.
        listed(&handle, Kind::Quotas, vec![quota("wide", "5000")]).await;
        let status = handle.quota("team-a").await.unwrap().unwrap();
        assert_eq!(status.limits.memory_mib, Some(5000));
        assert_eq!(handle.quotas().await.unwrap().len(), 1);

        handle
            .send(Command::DeleteQuota {
                namespace: "team-a".into(),
                name: "wide".into(),
            })
            .await
            .unwrap();
        assert_eq!(handle.quota("team-a").await.unwrap(), None);
    }

    fn locked_node(lock: Option<&str>, label: &str) -> Node {
        let annotations = lock.map_or_else(|| json!({}), |l| json!({ keys::NODE_LOCK: l }));
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"l": label}, "annotations": annotations}
        }))
        .unwrap()
    }

    /// `f`'s output, or a failure (not a hang) when the owner never answers.
    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("the owner published nothing within 10 s")
    }

    #[tokio::test]
    async fn a_bind_following_a_node_lock_wakes_when_the_lock_changes_and_only_then() {
        let handle = spawn(model());
        let held = "2025-07-12T01:12:20Z,default,holder";
        let apply = |n: Node| handle.send(Command::ApplyNode(Box::new(n)));
        apply(locked_node(Some(held), "a")).await.unwrap();
        let mut follower = handle.watch_node_lock("n1").await.unwrap();
        assert_eq!(follower.borrow().as_deref(), Some(held));

        // Another change of the node (a label) is not a change of the lock.
        apply(locked_node(Some(held), "b")).await.unwrap();
        let _ = handle.watch_node_lock("n1").await.unwrap(); // the owner has applied it
        assert!(!follower.has_changed().unwrap());

        apply(locked_node(None, "b")).await.unwrap();
        within(follower.changed()).await.unwrap();
        assert_eq!(*follower.borrow_and_update(), None);

        // A node not seen yet is followed from no lock; deleting closes it.
        let mut unseen = handle.watch_node_lock("n2").await.unwrap();
        assert_eq!(*unseen.borrow(), None);
        handle.send(Command::DeleteNode("n1".into())).await.unwrap();
        assert!(within(follower.changed()).await.is_err());
        handle.send(Command::DeleteNode("n2".into())).await.unwrap();
        assert!(within(unseen.changed()).await.is_err());
    }

    #[tokio::test]
    async fn binds_to_one_node_take_turns_and_other_nodes_do_not_wait() {
        let handle = spawn(model());
        let first = handle.bind_turn("n1");
        let held = first.lock().await;
        assert!(handle.bind_turn("n1").try_lock().is_err());
        assert!(handle.clone().bind_turn("n2").try_lock().is_ok());
        drop(held);
        assert!(handle.bind_turn("n1").try_lock().is_ok());
    }

    fn turns_kept(handle: &ModelHandle) -> Vec<String> {
        let turns = handle.bind_turns.lock().unwrap();
        let mut names: Vec<String> = turns.by_node.keys().cloned().collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn turns_no_bind_holds_are_dropped_as_nodes_come_and_go() {
        let handle = spawn(model());
        let first = handle.bind_turn("held");
        let held = first.lock().await;
        let _awaiting = handle.bind_turn("awaited");
        for i in 2..BindTurns::PRUNE_FLOOR {
            let _ = handle.bind_turn(&format!("gone-{i}"));
        }
        assert_eq!(turns_kept(&handle).len(), BindTurns::PRUNE_FLOOR);
        // The map reached its floor: the next turn prunes it first.
        let _ = handle.bind_turn("new");
        assert_eq!(turns_kept(&handle), ["awaited", "held", "new"]);
        // The held turn is the same one: a bind to its node still waits.
        assert!(handle.bind_turn("held").try_lock().is_err());
        drop(held);
    }

    #[tokio::test]
    async fn a_relist_closes_the_lock_followers_of_nodes_deleted_meanwhile() {
        let handle = spawn(model());
        handle
            .send(Command::ApplyNode(Box::new(locked_node(None, "a"))))
            .await
            .unwrap();
        let mut gone = handle.watch_node_lock("n1").await.unwrap();
        let mut unseen = handle.watch_node_lock("never-listed").await.unwrap();
        // The watch broke; n1 was deleted before the relist, n2 is new.
        handle
            .send(Command::RelistStarted(Kind::Nodes))
            .await
            .unwrap();
        let n2: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
        handle.send(Command::ApplyNode(Box::new(n2))).await.unwrap();
        handle.send(Command::RelistDone(Kind::Nodes)).await.unwrap();
        assert!(within(gone.changed()).await.is_err());
        assert!(within(unseen.changed()).await.is_err());
        let kept = handle.watch_node_lock("n2").await.unwrap();
        assert!(kept.has_changed().is_ok(), "n2's lock is still followed");
    }
}

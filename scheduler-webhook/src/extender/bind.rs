//! The bind step: node lock, one annotation patch, `pods/binding`, and a
//! full rollback on any failure. The only extender code that talks to the
//! API server.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use proto::hami::bind::BindPhase;
use proto::hami::keys;
use proto::hami::mig::encode_allocations;
use proto::hami::node_lock::NodeLock;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use super::lock::{Holder, LockState, classify, judge_holder};
use super::wire::ExtenderBindingArgs;
use crate::cache::owner::{Command, ModelHandle};
use crate::clock::now_unix;

/// How long a bind waits for another pod's node lock; well inside
/// kube-scheduler's 30 s extender timeout. [`bind_within`] takes another.
pub const LOCK_WAIT: Duration = Duration::from_secs(20);

/// The longest a bind waiting for a node's lock goes without reading the
/// Node again when the node watch reports no change of the lock.
pub const LOCK_POLL_CAP: Duration = Duration::from_secs(2);

/// A lock younger than this (by its own second-resolution timestamp, and
/// not dated ahead of this clock) is waited on without reading its
/// holder's pod: its Allocate is most likely
/// under way, and the node watch wakes the wait when the node-daemon
/// releases it. From this age on, a round reads the holder to find one
/// that is gone, finished or stuck; a holder found waiting is read again
/// only after [`LOCK_POLL_CAP`] (its judgement changes with its pod, which
/// the node watch does not show, or at ages of a minute and more). Reading
/// it on every round of a 50 ms back-off was most of the API requests at
/// 100 nodes (docs/benchmarks.md, "API requests by client"); the cost is
/// that a holder deleted while it held the lock is found up to about
/// `HOLDER_READ_AGE_SECS` + [`LOCK_POLL_CAP`] later.
pub const HOLDER_READ_AGE_SECS: i64 = 2;

/// What a bind may spend beyond its lock wait before it creates
/// `pods/binding`; past that it rolls back instead, so the binding never
/// lands after kube-scheduler gave up on the bind (its extender timeout,
/// 30 s by default, is above `LOCK_WAIT` plus this) and placed the pod
/// elsewhere.
pub const BIND_MARGIN: Duration = Duration::from_secs(5);

/// Why a bind failed (reported to kube-scheduler in `Error`).
#[derive(Debug, thiserror::Error)]
pub enum BindFailure {
    /// The model has not listed nodes, pods and resourcequotas since the
    /// start; kube-scheduler retries the pod.
    #[error("{}", super::wire::NOT_SYNCED)]
    NotSynced,
    /// No filter decision for this pod (never filtered here, or already released).
    #[error("pod {0} has no filter decision from this scheduler; it will be filtered again")]
    NoDecision(String),
    /// kube-scheduler asked for another node than the filter chose.
    #[error("bind to {asked} but filter chose {chosen}")]
    WrongNode {
        /// Node in the bind request.
        asked: String,
        /// Node the filter chose.
        chosen: String,
    },
    /// The node lock stayed held by a live pod.
    #[error(
        "node {node} is locked by {holder} (allocation in progress) for longer than {waited:?}"
    )]
    LockTimeout {
        /// The node.
        node: String,
        /// `namespace/pod` holding it, or what kept the bind out when no
        /// pod was named (a lock naming no pod, a lost race to take it).
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The pod is already bound (a bind kube-scheduler gave up on landed
    /// late, or another binder): nothing is written.
    #[error("pod is already bound to {0}")]
    AlreadyBound(String),
    /// The pod changed between our read and our annotation patch (a
    /// binding landed, or another bind wrote): nothing is written.
    #[error("pod changed while binding; it will be filtered again")]
    PodChanged,
    /// The bind ran past its budget before `pods/binding`: rolled back, so
    /// no binding lands after kube-scheduler's timeout.
    #[error("bind took {0:?}, past its budget; rolled back before pods/binding")]
    Late(Duration),
    /// An API call failed.
    #[error("{step}: {source}")]
    Api {
        /// What we were doing.
        step: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The model's owner stopped.
    #[error(transparent)]
    Model(#[from] crate::cache::owner::ModelGone),
    /// A value could not be encoded.
    #[error("{0}")]
    Encode(String),
}

/// Binds a pod: takes the node lock, writes the allocation annotations in
/// one merge patch, creates `pods/binding`, and commits the reservation.
/// On any failure everything is rolled back and the reservation dropped.
///
/// # Errors
/// A [`BindFailure`] saying what failed.
pub async fn bind(
    client: &Client,
    model: &ModelHandle,
    args: &ExtenderBindingArgs,
) -> Result<(), BindFailure> {
    bind_within(client, model, args, LOCK_WAIT).await
}

/// [`bind`], waiting at most `lock_wait` for another pod's node lock.
///
/// # Errors
/// A [`BindFailure`] saying what failed.
pub async fn bind_within(
    client: &Client,
    model: &ModelHandle,
    args: &ExtenderBindingArgs,
    lock_wait: Duration,
) -> Result<(), BindFailure> {
    // Before the first list the model may know a node but not the pods on
    // it; nothing here may act on that picture.
    if !model.is_ready() {
        return Err(BindFailure::NotSynced);
    }
    let decided = model.decision(&args.pod_uid).await?.ok_or_else(|| {
        BindFailure::NoDecision(format!("{}/{}", args.pod_namespace, args.pod_name))
    })?;
    if decided.node != args.node {
        model.send(Command::Release(args.pod_uid.clone())).await?;
        return Err(BindFailure::WrongNode {
            asked: args.node.clone(),
            chosen: decided.node,
        });
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.pod_namespace);
    let started = Instant::now();
    // The bind-time this bind writes, once it holds the lock; a rollback
    // clears only annotations carrying it.
    let mut stamp: Option<String> = None;

    let result = async {
        // A pod already bound is never written to: its annotations belong
        // to the bind that bound it.
        let pod = pods
            .get(&args.pod_name)
            .await
            .map_err(|source| BindFailure::Api {
                step: "read pod",
                source,
            })?;
        if let Some(bound) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return Err(BindFailure::AlreadyBound(bound));
        }
        acquire_lock(&nodes, client, model, args, lock_wait).await?;
        let now = stamp.insert(now_unix().to_string()).clone();
        let devices = decided
            .devices
            .try_encode()
            .map_err(|e| BindFailure::Encode(e.to_string()))?;
        // Only pods with MIG instances carry it (HAMi's format); null
        // clears a value from an earlier decision.
        let mig = (!decided.mig.is_empty()).then(|| encode_allocations(&decided.mig));
        // Guarded by the resourceVersion read above: a binding (or another
        // bind) landing meanwhile makes it fail with 409.
        let patch = json!({"metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "labels": {keys::VGPU_NODE: args.node},
            "annotations": {
                keys::VGPU_NODE: args.node,
                keys::VGPU_TIME: now,
                keys::VGPU_DEVICES_TO_ALLOCATE: devices,
                keys::VGPU_DEVICES_ALLOCATED: devices,
                keys::VGPU_MIG_ALLOCATIONS: mig,
                keys::BIND_PHASE: BindPhase::Allocating.as_str(),
                keys::BIND_TIME: now,
                // A new decision: an earlier binder's abandonment of this
                // pod is history (its binding, if it ever lands, makes ours fail).
                keys::BIND_ABANDONED: null,
            }
        }});
        match pods
            .patch(
                &args.pod_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Err(BindFailure::PodChanged);
            }
            Err(source) => {
                return Err(BindFailure::Api {
                    step: "annotate pod",
                    source,
                });
            }
        }
        let spent = started.elapsed();
        if spent > lock_wait + BIND_MARGIN {
            return Err(BindFailure::Late(spent));
        }
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        });
        pods.create_subresource::<_, Value>(
            "binding",
            &args.pod_name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map_err(|source| BindFailure::Api {
            step: "create pods/binding",
            source,
        })?;
        Ok::<_, BindFailure>(devices)
    }
    .await;

    match result {
        Ok(devices) => {
            model.send(Command::Commit(args.pod_uid.clone())).await?;
            info!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, %devices, "bound");
            Ok(())
        }
        Err(error) => {
            warn!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, %error, "bind failed; rolling back");
            if rollback(&nodes, &pods, args, stamp.as_deref()).await == Rollback::BoundHere {
                // The binding landed though its answer was lost.
                model.send(Command::Commit(args.pod_uid.clone())).await?;
                info!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node, "bound (the binding landed despite the error)");
                return Ok(());
            }
            model.send(Command::Release(args.pod_uid.clone())).await?;
            Err(error)
        }
    }
}

/// What a rollback found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rollback {
    /// The pod is bound to our node with our annotations: the bind
    /// succeeded after all, nothing was undone.
    BoundHere,
    /// Undone as far as it was ours (best effort).
    Undone,
}

/// Undoes a partial bind: our annotations removed, our lock released. Best
/// effort. Only what this bind wrote is undone: the annotations are cleared
/// only while they carry this bind's node and `bind-time` (`stamp`; `None`
/// when it never took the lock, so never wrote them), and
/// under the resourceVersion they were read at, so a later bind's
/// annotations (kube-scheduler gave up on this one and placed the pod
/// again) are never cleared.
async fn rollback(
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    stamp: Option<&str>,
) -> Rollback {
    let pod = match pods.get_opt(&args.pod_name).await {
        Ok(pod) => pod,
        Err(error) => {
            warn!(pod = %args.pod_name, %error, "rollback: could not read the pod; leaving its annotations");
            None
        }
    };
    if let Some(pod) = pod {
        let annotations = pod.metadata.annotations.as_ref();
        let ours = annotations.is_some_and(|a| {
            a.get(keys::VGPU_NODE).map(String::as_str) == Some(args.node.as_str())
                && stamp.is_some()
                && a.get(keys::BIND_TIME).map(String::as_str) == stamp
        });
        let bound_to = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if ours && bound_to == Some(args.node.as_str()) {
            return Rollback::BoundHere;
        }
        if ours {
            clear_annotations(pods, args, pod.metadata.resource_version).await;
        }
    }
    release_lock(nodes, &args.node, &args.pod_namespace, &args.pod_name).await;
    Rollback::Undone
}

/// Removes the allocation annotations, under `resource_version`.
async fn clear_annotations(
    pods: &Api<Pod>,
    args: &ExtenderBindingArgs,
    resource_version: Option<String>,
) {
    let clear = json!({"metadata": {
        "resourceVersion": resource_version,
        "labels": {keys::VGPU_NODE: null},
        "annotations": {
            keys::VGPU_NODE: null, keys::VGPU_TIME: null,
            keys::VGPU_DEVICES_TO_ALLOCATE: null, keys::VGPU_DEVICES_ALLOCATED: null,
            keys::VGPU_MIG_ALLOCATIONS: null,
            keys::BIND_PHASE: null, keys::BIND_TIME: null,
        }
    }});
    if let Err(error) = pods
        .patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&clear),
        )
        .await
    {
        warn!(pod = %args.pod_name, %error, "rollback: could not clear annotations");
    }
}

/// Releases the node lock if `namespace/pod` holds it. Best effort.
pub async fn release_lock(nodes: &Api<Node>, node: &str, namespace: &str, pod: &str) {
    let Ok(current) = nodes.get(node).await else {
        return;
    };
    let value = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::NODE_LOCK));
    let ours = value
        .and_then(|v| v.parse::<NodeLock>().ok())
        .is_some_and(|l| l.is_owned_by(namespace, pod));
    if ours {
        let patch = json!({"metadata": {
            "resourceVersion": current.metadata.resource_version,
            "annotations": {keys::NODE_LOCK: null}
        }});
        if let Err(error) = nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(%node, %error, "could not release node lock");
        }
    }
}

/// Takes the node lock for the pod, waiting at most `lock_wait` while a
/// live pod holds it. A stuck holder is marked abandoned before its lock is
/// taken ([`Holder::Abandon`], [`abandon`]).
///
/// Binds of this process to one node take turns ([`ModelHandle::bind_turn`]),
/// and the one whose turn it is waits for the lock to change as the node
/// watch sees it, reading the Node again only then (or after a capped
/// back-off, for holders judged by their pod and for a watch that lags).
/// Polling by every waiting bind was most of the API server's load at 100
/// nodes (docs/benchmarks.md).
async fn acquire_lock(
    nodes: &Api<Node>,
    client: &Client,
    model: &ModelHandle,
    args: &ExtenderBindingArgs,
    lock_wait: Duration,
) -> Result<(), BindFailure> {
    let started = Instant::now();
    let turn = model.bind_turn(&args.node);
    let Ok(_turn) = tokio::time::timeout(lock_wait, turn.lock()).await else {
        return Err(BindFailure::LockTimeout {
            node: args.node.clone(),
            holder: "binds queued before it for this node".into(),
            waited: started.elapsed(),
        });
    };
    // Followed from before the first read, so a release between that read
    // and the wait still wakes it.
    let mut lock_seen = model.watch_node_lock(&args.node).await?;
    let mut pause = Duration::from_millis(50);
    // Who kept us out on the last round, for the refusal's message.
    let mut holder = String::new();
    loop {
        // Whether the lock's holder is to be waited on until it releases
        // the lock (the node watch says when) or the poll cap passes: a
        // young lock, or a holder judged waiting.
        let mut held = false;
        let node = nodes
            .get(&args.node)
            .await
            .map_err(|source| BindFailure::Api {
                step: "read node",
                source,
            })?;
        let current = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::NODE_LOCK))
            .map(String::as_str);
        let now = now_unix();
        let take = match classify(current, &args.pod_namespace, &args.pod_name, now) {
            LockState::Ours => return Ok(()),
            LockState::Free => true,
            LockState::Stale(why) => {
                info!(node = %args.node, %why, "taking over node lock");
                true
            }
            LockState::HeldAnonymously => {
                "a lock that names no pod".clone_into(&mut holder);
                false
            }
            // A lock dated ahead of our clock (another scheduler's skew)
            // is judged by its pod at once, as before: its age says nothing.
            LockState::HeldBy { owner, age_secs }
                if (0..HOLDER_READ_AGE_SECS).contains(&age_secs) =>
            {
                holder = format!("{}/{}", owner.namespace, owner.pod);
                held = true;
                false
            }
            LockState::HeldBy { owner, age_secs } => {
                let owner_pods: Api<Pod> = Api::namespaced(client.clone(), &owner.namespace);
                let pod =
                    owner_pods
                        .get_opt(&owner.pod)
                        .await
                        .map_err(|source| BindFailure::Api {
                            step: "read lock holder",
                            source,
                        })?;
                let who = format!("{}/{}", owner.namespace, owner.pod);
                match (judge_holder(pod.as_ref(), &args.node, age_secs, now), pod) {
                    (Holder::Waiting, _) => {
                        holder = who;
                        held = true;
                        false
                    }
                    (Holder::Done(why), _) => {
                        info!(node = %args.node, holder = %who, %why, "taking over node lock");
                        true
                    }
                    (Holder::Abandon(why), Some(pod)) => {
                        holder.clone_from(&who);
                        let marked = abandon(&owner_pods, &pod, &args.node).await?;
                        if marked {
                            info!(node = %args.node, holder = %who, %why, "holder marked abandoned; taking over node lock");
                        }
                        marked
                    }
                    // Judged abandoned, so the pod exists.
                    (Holder::Abandon(_), None) => true,
                }
            }
        };
        if take {
            let lock = NodeLock::acquired_at(now, &args.pod_namespace, &args.pod_name)
                .map_err(|e| BindFailure::Encode(e.to_string()))?;
            let patch = json!({"metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {keys::NODE_LOCK: lock.to_string()}
            }});
            match nodes
                .patch(&args.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                // Someone changed the node meanwhile (most often another
                // bind took the lock first): read it again.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    "another bind that took it first".clone_into(&mut holder);
                }
                Err(source) => {
                    return Err(BindFailure::Api {
                        step: "lock node",
                        source,
                    });
                }
            }
        }
        let waited = started.elapsed();
        if waited >= lock_wait {
            return Err(BindFailure::LockTimeout {
                node: args.node.clone(),
                holder,
                waited,
            });
        }
        // Waiting on another pod's Allocate: its node-daemon releases the
        // lock, which the node watch reports; the holder is looked at
        // again after the poll cap. Other refusals (a lock naming no pod,
        // another bind first) are read again after the back-off.
        let nap = if held { LOCK_POLL_CAP } else { pause };
        let nap = nap.min(lock_wait.saturating_sub(waited));
        if let Ok(Err(_closed)) = tokio::time::timeout(nap, lock_seen.changed()).await {
            // The node was deleted from the model: the next read says so.
            sleep(nap).await;
        }
        if !held {
            pause = (pause * 2).min(LOCK_POLL_CAP);
        }
    }
}

/// Marks a stuck lock holder abandoned on `node`: `bind-phase=failed` and
/// `gpuslice.io/bind-abandoned=<node>`, guarded by the `resourceVersion` it
/// was judged at, so a pod that changed meanwhile (bound, allocated) is
/// judged again instead. Returns whether the mark was written.
async fn abandon(pods: &Api<Pod>, pod: &Pod, node: &str) -> Result<bool, BindFailure> {
    let Some(name) = pod.metadata.name.as_deref() else {
        return Ok(false);
    };
    let patch = json!({"metadata": {
        "resourceVersion": pod.metadata.resource_version,
        "annotations": {
            keys::BIND_PHASE: BindPhase::Failed.as_str(),
            keys::BIND_ABANDONED: node,
        }
    }});
    match pods
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
        Err(source) => Err(BindFailure::Api {
            step: "mark lock holder abandoned",
            source,
        }),
    }
}

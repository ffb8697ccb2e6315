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
        /// `namespace/pod` holding it.
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
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

    let result = async {
        acquire_lock(&nodes, client, args, lock_wait).await?;
        let devices = decided
            .devices
            .try_encode()
            .map_err(|e| BindFailure::Encode(e.to_string()))?;
        let now = now_unix().to_string();
        // Only pods with MIG instances carry it (HAMi's format); null
        // clears a value from an earlier decision.
        let mig = (!decided.mig.is_empty()).then(|| encode_allocations(&decided.mig));
        let patch = json!({"metadata": {
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
        pods.patch(
            &args.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| BindFailure::Api {
            step: "annotate pod",
            source,
        })?;
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
            rollback(&nodes, &pods, args).await;
            model.send(Command::Release(args.pod_uid.clone())).await?;
            Err(error)
        }
    }
}

/// Undoes a partial bind: annotations removed, our lock released. Best effort.
async fn rollback(nodes: &Api<Node>, pods: &Api<Pod>, args: &ExtenderBindingArgs) {
    let clear = json!({"metadata": {
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
    release_lock(nodes, &args.node, &args.pod_namespace, &args.pod_name).await;
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
async fn acquire_lock(
    nodes: &Api<Node>,
    client: &Client,
    args: &ExtenderBindingArgs,
    lock_wait: Duration,
) -> Result<(), BindFailure> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
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
        let mut holder = None;
        let take = match classify(current, &args.pod_namespace, &args.pod_name, now) {
            LockState::Ours => return Ok(()),
            LockState::Free => true,
            LockState::Stale(why) => {
                info!(node = %args.node, %why, "taking over node lock");
                true
            }
            LockState::HeldAnonymously => false,
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
                        holder = Some(who);
                        false
                    }
                    (Holder::Done(why), _) => {
                        info!(node = %args.node, holder = %who, %why, "taking over node lock");
                        true
                    }
                    (Holder::Abandon(why), Some(pod)) => {
                        holder = Some(who.clone());
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
                // Someone changed the node meanwhile: read it again.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
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
                holder: holder.unwrap_or_else(|| "an unnamed holder".to_owned()),
                waited,
            });
        }
        // Waiting on another pod's Allocate, which happens outside our view:
        // poll with a capped backoff.
        sleep(pause.min(lock_wait.saturating_sub(waited))).await;
        pause = (pause * 2).min(Duration::from_millis(500));
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

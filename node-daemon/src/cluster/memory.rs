//! [`Cluster`] in memory: pods and node annotations held in a `watch`
//! channel, so tests can seed state, read what the daemon wrote, and await a
//! change (e.g. `bind-phase=success`) instead of sleeping. Not a mock: it
//! applies the same semantics the real API has for these calls (merge patch
//! with `null` removing a key, lock release only by its owner).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt as _};
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use tokio::sync::watch;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::{
    AnnotationPatch, ClaimView, Cluster, ClusterError, PodChange, PodView, lock_releasable_by,
};
use crate::epoch::CommitClock;
use crate::ledger::LiveSnapshot;

/// Everything a [`MemoryCluster`] holds.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Pods with the node they are bound to.
    pub pods: Vec<(String, PodView)>,
    /// Annotations per node name.
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// How many writes (patches) were applied.
    pub writes: u64,
    /// How many times a node's pods were listed.
    pub pod_lists: u64,
    /// `ResourceClaim`s.
    pub claims: Vec<ClaimView>,
    /// UIDs of the `ResourceClaim`s deleted, in order.
    pub deleted_claims: Vec<String>,
    /// `ResourceSlice`s by name, each with a `resourceVersion`.
    pub slices: BTreeMap<String, ResourceSlice>,
    /// How many `ResourceSlice` writes (creates, replaces) were applied.
    pub slice_writes: u64,
    /// The last `resourceVersion` handed out.
    pub resource_version: u64,
}

/// An in-memory API; clones share state.
#[derive(Debug, Clone)]
pub struct MemoryCluster {
    state: watch::Sender<ClusterState>,
}

impl Default for MemoryCluster {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryCluster {
    /// An empty cluster.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: watch::Sender::new(ClusterState::default()),
        }
    }

    /// Adds (or replaces, by UID) a pod bound to `node`.
    pub fn put_pod(&self, node: &str, pod: PodView) {
        self.state.send_modify(|s| {
            s.pods.retain(|(_, p)| p.uid != pod.uid);
            s.pods.push((node.to_owned(), pod));
        });
    }

    /// Removes the pod with `uid`.
    pub fn delete_pod(&self, uid: &str) {
        self.state
            .send_modify(|s| s.pods.retain(|(_, p)| p.uid != uid));
    }

    /// Adds (or replaces, by UID) a `ResourceClaim`.
    pub fn put_claim(&self, claim: ClaimView) {
        self.state.send_modify(|s| {
            s.claims.retain(|c| c.uid != claim.uid);
            s.claims.push(claim);
        });
    }

    /// Deletes the `ResourceClaim` with `uid`.
    pub fn delete_claim(&self, uid: &str) {
        self.state.send_modify(|s| {
            s.claims.retain(|c| c.uid != uid);
            s.deleted_claims.push(uid.to_owned());
        });
    }

    /// A copy of the `ResourceSlice` `name`.
    #[must_use]
    pub fn slice(&self, name: &str) -> Option<ResourceSlice> {
        self.state.borrow().slices.get(name).cloned()
    }

    /// Deletes the `ResourceSlice` `name` (as the kubelet does at its start).
    pub fn delete_slice(&self, name: &str) {
        self.state.send_modify(|s| {
            s.slices.remove(name);
        });
    }

    /// Sets (or with `None` removes) a node annotation.
    pub fn set_node_annotation_now(&self, node: &str, key: &str, value: Option<&str>) {
        self.state.send_modify(|s| {
            let ann = s.nodes.entry(node.to_owned()).or_default();
            match value {
                Some(v) => ann.insert(key.to_owned(), v.to_owned()),
                None => ann.remove(key),
            };
        });
    }

    /// A copy of the pod `namespace/name`.
    #[must_use]
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        self.state
            .borrow()
            .pods
            .iter()
            .find(|(_, p)| p.namespace == namespace && p.name == name)
            .map(|(_, p)| p.clone())
    }

    /// A copy of one node annotation.
    #[must_use]
    pub fn node_annotation(&self, node: &str, key: &str) -> Option<String> {
        self.state.borrow().nodes.get(node)?.get(key).cloned()
    }

    /// How many writes were applied so far.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.state.borrow().writes
    }

    /// Watches every change of the state.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<ClusterState> {
        self.state.subscribe()
    }
}

impl Cluster for MemoryCluster {
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodView>, ClusterError>> {
        let mut pods = Vec::new();
        // Counted, but no waiter is woken: a list changes nothing.
        self.state.send_if_modified(|s| {
            s.pod_lists += 1;
            pods = s
                .pods
                .iter()
                .filter(|(n, _)| n == node)
                .map(|(_, p)| p.clone())
                .collect();
            false
        });
        futures::future::ready(Ok(pods)).boxed()
    }

    fn node_lock<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ClusterError>> {
        futures::future::ready(Ok(self.node_annotation(node, keys::NODE_LOCK))).boxed()
    }

    fn patch_pod_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: AnnotationPatch,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        let mut found = false;
        self.state.send_if_modified(|s| {
            let Some((_, pod)) = s
                .pods
                .iter_mut()
                .find(|(_, p)| p.namespace == namespace && p.name == name)
            else {
                return false;
            };
            for (k, v) in patch {
                match v {
                    Some(v) => pod.annotations.insert(k, v),
                    None => pod.annotations.remove(&k),
                };
            }
            s.writes += 1;
            found = true;
            true
        });
        let result = if found {
            Ok(())
        } else {
            Err(ClusterError::NotFound(format!("pod {namespace}/{name}")))
        };
        futures::future::ready(result).boxed()
    }

    fn release_node_lock<'a>(
        &'a self,
        node: &'a str,
        owner: &'a LockOwner,
    ) -> BoxFuture<'a, Result<bool, ClusterError>> {
        let mut released = false;
        self.state.send_if_modified(|s| {
            let Some(ann) = s.nodes.get_mut(node) else {
                return false;
            };
            if ann
                .get(keys::NODE_LOCK)
                .is_some_and(|raw| lock_releasable_by(raw, owner))
            {
                ann.remove(keys::NODE_LOCK);
                s.writes += 1;
                released = true;
            }
            released
        });
        futures::future::ready(Ok(released)).boxed()
    }

    /// Every change of the state yields the live pods of `node` as a
    /// complete list, stamped with `clock` just before the state is read.
    fn pod_changes(&self, node: &str, clock: CommitClock) -> BoxStream<'static, PodChange> {
        let node = node.to_owned();
        futures::stream::unfold(self.state.subscribe(), move |mut rx| {
            let node = node.clone();
            let clock = clock.clone();
            async move {
                rx.changed().await.ok()?;
                let taken_at = clock.now();
                let live = rx
                    .borrow_and_update()
                    .pods
                    .iter()
                    .filter(|(n, p)| *n == node && !p.is_terminal())
                    .map(|(_, p)| p.uid.clone())
                    .collect();
                Some((PodChange::Live(LiveSnapshot { live, taken_at }), rx))
            }
        })
        .boxed()
    }

    fn resource_claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ClaimView>, ClusterError>> {
        let found = self
            .state
            .borrow()
            .claims
            .iter()
            .find(|c| c.namespace == namespace && c.name == name)
            .cloned();
        futures::future::ready(Ok(found)).boxed()
    }

    fn resource_claims(&self) -> BoxFuture<'_, Result<Vec<ClaimView>, ClusterError>> {
        futures::future::ready(Ok(self.state.borrow().claims.clone())).boxed()
    }

    fn resource_slice<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSlice>, ClusterError>> {
        futures::future::ready(Ok(self.slice(name))).boxed()
    }

    /// Creates or replaces like the API: a create of an existing name or a
    /// replace with a stale `resourceVersion` is a conflict.
    fn write_resource_slice(
        &self,
        mut slice: ResourceSlice,
    ) -> BoxFuture<'_, Result<ResourceSlice, ClusterError>> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut result = Err(ClusterError::Conflict(format!(
            "write resourceslice {name}"
        )));
        self.state.send_if_modified(|s| {
            let stored = s
                .slices
                .get(&name)
                .and_then(|o| o.metadata.resource_version.clone());
            if stored != slice.metadata.resource_version {
                return false;
            }
            s.resource_version += 1;
            slice.metadata.resource_version = Some(s.resource_version.to_string());
            s.slices.insert(name.clone(), slice.clone());
            s.slice_writes += 1;
            result = Ok(slice.clone());
            true
        });
        futures::future::ready(result).boxed()
    }

    /// The claims deleted after the call, in order.
    fn claim_deletions(&self) -> BoxStream<'static, String> {
        let rx = self.state.subscribe();
        let seen = rx.borrow().deleted_claims.len();
        futures::stream::unfold((rx, seen), |(mut rx, seen)| async move {
            loop {
                let next = rx.borrow_and_update().deleted_claims.get(seen).cloned();
                if let Some(uid) = next {
                    return Some((uid, (rx, seen + 1)));
                }
                rx.changed().await.ok()?;
            }
        })
        .boxed()
    }

    /// The slice now, then after every change of it (by `resourceVersion`).
    fn resource_slice_changes(&self, name: &str) -> BoxStream<'static, Option<ResourceSlice>> {
        let name = name.to_owned();
        let rx = self.state.subscribe();
        let version =
            |s: &Option<ResourceSlice>| s.as_ref().map(|s| s.metadata.resource_version.clone());
        futures::stream::unfold((rx, None, true), move |(mut rx, seen, first)| {
            let name = name.clone();
            async move {
                loop {
                    if !first {
                        rx.changed().await.ok()?;
                    }
                    let now = rx.borrow_and_update().slices.get(&name).cloned();
                    if first || version(&now) != seen {
                        let seen = version(&now);
                        return Some((now, (rx, seen, false)));
                    }
                }
            }
        })
        .boxed()
    }

    fn set_node_annotation<'a>(
        &'a self,
        node: &'a str,
        key: &'a str,
        value: String,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.state.send_modify(|s| {
            s.nodes
                .entry(node.to_owned())
                .or_default()
                .insert(key.to_owned(), value);
            s.writes += 1;
        });
        futures::future::ready(Ok(())).boxed()
    }
}

//! The daemon's narrow view of the Kubernetes API: the pods bound to this
//! node, the node lock, and the few annotation writes the protocol needs;
//! in DRA mode, the node's `ResourceSlice` and the `ResourceClaim`s
//! allocated to it.
//!
//! [`Cluster`] is the boundary; [`kube::KubeCluster`] implements it with a
//! real kube-rs client (any apiserver, real or fake), `memory::MemoryCluster`
//! in memory for tests of the layers above (compiled for this crate's tests
//! and with the `testkit` feature only, never into the release binary). Pods cross the boundary as
//! [`PodView`], owned domain data with only what Allocate needs.

pub mod kube;
#[cfg(any(test, feature = "testkit"))]
pub mod memory;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use k8s_openapi::api::resource::v1::ResourceSlice;
use proto::hami::node_lock::LockOwner;

use crate::epoch::CommitClock;
use crate::ledger::LiveSnapshot;

/// What the daemon needs to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `status.phase` (`Pending`, `Running`, …; empty when unset).
    pub phase: String,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// Init containers, then app containers, in spec order (HAMi's
    /// container index).
    pub containers: Vec<ContainerView>,
}

/// Pod UID → (namespace, name), as the allocator last listed them (labels
/// for metrics and for the per-container usage read from HAMi-core).
pub type PodNames = std::sync::Arc<BTreeMap<String, (String, String)>>;

/// What the daemon needs to know about one container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerView {
    /// Name.
    pub name: String,
    /// Its env asks HAMi-core control off (`CUDA_DISABLE_CONTROL=true`).
    pub cuda_disable_control: bool,
    /// An init container.
    pub init: bool,
}

impl PodView {
    /// `namespace/name`, for messages.
    #[must_use]
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod has finished (`Succeeded` or `Failed`) and holds nothing.
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }

    /// One annotation.
    #[must_use]
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// One device allocated to a DRA claim (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocatedDevice {
    /// The claim's request this device serves.
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The pool (for gpuslice, the node name).
    pub pool: String,
    /// The device name (`gpu-<index>`).
    pub device: String,
    /// The share of a device that allows multiple allocations.
    pub share_id: Option<String>,
    /// `consumedCapacity`: capacity name → quantity, as written.
    pub consumed: BTreeMap<String, String>,
}

/// What the daemon needs to know about one `ResourceClaim`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClaimView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `status.allocation` is set.
    pub allocated: bool,
    /// The allocated devices (every driver's).
    pub results: Vec<AllocatedDevice>,
}

/// A change of the set of pods that may hold slices on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChange {
    /// The pod was deleted or finished: its slices are free.
    Gone(String),
    /// A complete list (after a (re)list): every pod UID not in it is gone,
    /// as of the snapshot's epoch (read from the commit clock before the
    /// list was requested).
    Live(LiveSnapshot),
}

/// Annotation changes of one merge patch: `Some` sets, `None` removes.
pub type AnnotationPatch = BTreeMap<String, Option<String>>;

/// Why the API could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A kube-rs request failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, e.g. `list pods on node n1`.
        action: String,
        /// The client error.
        #[source]
        source: ::kube::Error,
    },
    /// The object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The write kept conflicting with other writers.
    #[error("{0}: conflicting writes, gave up")]
    Conflict(String),
}

/// The Kubernetes API as the node daemon uses it.
pub trait Cluster: Send + Sync + 'static {
    /// Every pod whose `spec.nodeName` is `node`.
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodView>, ClusterError>>;

    /// The raw `hami.io/mutex.lock` value of `node`, if any.
    fn node_lock<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ClusterError>>;

    /// One merge patch of a pod's annotations.
    fn patch_pod_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: AnnotationPatch,
    ) -> BoxFuture<'a, Result<(), ClusterError>>;

    /// Removes the node lock if HAMi's rule lets `owner` release it (its
    /// value names `owner`, or is legacy); returns whether it was removed.
    /// The write carries the node's `resourceVersion`, so a lock taken
    /// meanwhile by another pod is never removed.
    fn release_node_lock<'a>(
        &'a self,
        node: &'a str,
        owner: &'a LockOwner,
    ) -> BoxFuture<'a, Result<bool, ClusterError>>;

    /// Sets one annotation of `node`.
    fn set_node_annotation<'a>(
        &'a self,
        node: &'a str,
        key: &'a str,
        value: String,
    ) -> BoxFuture<'a, Result<(), ClusterError>>;

    /// The `ResourceClaim` `namespace/name`, if it exists.
    fn resource_claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ClaimView>, ClusterError>>;

    /// Every `ResourceClaim` of the cluster (a consistent read).
    fn resource_claims(&self) -> BoxFuture<'_, Result<Vec<ClaimView>, ClusterError>>;

    /// The cluster-scoped `ResourceSlice` `name`, if it exists.
    fn resource_slice<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSlice>, ClusterError>>;

    /// Creates `slice` (no `resourceVersion`) or replaces it (guarded by
    /// its `resourceVersion`: [`ClusterError::Conflict`] when another
    /// writer came first); returns the object as stored.
    fn write_resource_slice(
        &self,
        slice: ResourceSlice,
    ) -> BoxFuture<'_, Result<ResourceSlice, ClusterError>>;

    /// The `ResourceSlice` `name` as it is now and after each change, from
    /// now on (a watch; `None` while it does not exist; errors are retried
    /// inside the stream). The kubelet deletes a node's slices when it
    /// starts and when a driver stays unregistered, so the publisher must
    /// see that.
    fn resource_slice_changes(&self, name: &str) -> BoxStream<'static, Option<ResourceSlice>>;

    /// The UIDs of `ResourceClaim`s deleted from now on (a watch; errors
    /// are retried inside the stream). A deleted claim's UID never comes
    /// back, so its slices may be freed whenever the deletion is seen.
    fn claim_deletions(&self) -> BoxStream<'static, String>;

    /// Pods of `node` going away, from now on (a watch; errors are retried
    /// inside the stream). Each [`PodChange::Live`] is stamped with
    /// `clock`'s reading taken before its list was requested, and the list
    /// must be a consistent read (not served from a stale cache).
    fn pod_changes(&self, node: &str, clock: CommitClock) -> BoxStream<'static, PodChange>;
}

/// Whether the lock value `raw` may be released by `owner`: it parses and
/// HAMi's rule allows it. An unparsable value is left alone.
#[must_use]
pub fn lock_releasable_by(raw: &str, owner: &LockOwner) -> bool {
    raw.parse::<proto::hami::node_lock::NodeLock>()
        .is_ok_and(|l| l.may_be_released_by(&owner.namespace, &owner.pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_or_a_legacy_lock_is_releasable() {
        let owner = LockOwner {
            namespace: "ns".into(),
            pod: "p".into(),
        };
        assert!(lock_releasable_by("2025-10-20T03:07:02Z,ns,p", &owner));
        assert!(lock_releasable_by("2025-10-20T03:07:02Z", &owner));
        assert!(!lock_releasable_by("2025-10-20T03:07:02Z,ns,q", &owner));
        assert!(!lock_releasable_by("garbage", &owner));
    }
}

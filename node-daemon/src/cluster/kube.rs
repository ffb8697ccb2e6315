//! [`Cluster`] over a real kube-rs client: pods by `spec.nodeName` field
//! selector, merge patches for annotations, and a node-lock release guarded
//! by the node's `resourceVersion` (retried on 409 Conflict).

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use serde_json::{Map, Value, json};

use crate::epoch::CommitClock;
use crate::ledger::LiveSnapshot;

use super::{
    AllocatedDevice, AnnotationPatch, ClaimView, Cluster, ClusterError, ContainerView, PodChange,
    PodView, lock_releasable_by,
};

/// How many times a conflicting lock release is retried.
const CONFLICT_RETRIES: usize = 5;
/// Attempts of one request that fails transiently (5xx, 429, connection).
const TRANSIENT_ATTEMPTS: u32 = 5;
/// First pause after a transient failure; doubles each time (50 ms … 400 ms).
const TRANSIENT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// The Kubernetes API through kube-rs.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Uses `client` for every request.
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let action = action.into();
    move |source| ClusterError::Kube { action, source }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

/// A failure worth retrying: the server was briefly unavailable or
/// overloaded, or the connection broke. With `conflicts`, a 409 too (for
/// merge patches without a precondition, which are idempotent here).
fn is_transient(e: &kube::Error, conflicts: bool) -> bool {
    match e {
        kube::Error::Api(status) => {
            status.code >= 500 || status.code == 429 || (conflicts && status.code == 409)
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs `request` until it succeeds, fails for good, or has failed
/// transiently [`TRANSIENT_ATTEMPTS`] times.
async fn retrying<T, F, Fut>(what: &str, conflicts: bool, mut request: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut pause = TRANSIENT_BACKOFF;
    let mut attempt = 1;
    loop {
        match request().await {
            Err(error) if attempt < TRANSIENT_ATTEMPTS && is_transient(&error, conflicts) => {
                tracing::warn!(%error, attempt, "{what}: transient API error; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// The daemon's view of a pod object.
#[must_use]
pub fn pod_view(pod: &Pod) -> PodView {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let containers = spec
        .into_iter()
        .flat_map(|s| {
            let init = s.init_containers.iter().flatten().map(|c| (c, true));
            init.chain(s.containers.iter().map(|c| (c, false)))
        })
        .map(|(c, init)| ContainerView {
            init,
            name: c.name.clone(),
            cuda_disable_control: proto::hami::container_contract::cuda_disable_control_requested(
                c.env
                    .iter()
                    .flatten()
                    .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())),
            ),
        })
        .collect();
    PodView {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        phase: pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        terminating: meta.deletion_timestamp.is_some(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        containers,
    }
}

/// The daemon's view of a `ResourceClaim` object.
#[must_use]
pub fn claim_view(claim: &ResourceClaim) -> ClaimView {
    let meta = &claim.metadata;
    let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref());
    let results = allocation
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
            consumed: r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, q)| (k.clone(), q.0.clone()))
                .collect(),
        })
        .collect();
    ClaimView {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        allocated: allocation.is_some(),
        results,
    }
}

fn annotations_patch(patch: &AnnotationPatch) -> Value {
    let map: Map<String, Value> = patch
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    json!({ "metadata": { "annotations": map } })
}

impl Cluster for KubeCluster {
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodView>, ClusterError>> {
        async move {
            let api: Api<Pod> = Api::all(self.client.clone());
            let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
            let what = format!("list pods on node {node}");
            let list = retrying(&what, false, || api.list(&params))
                .await
                .map_err(kube_error(what))?;
            Ok(list.items.iter().map(pod_view).collect())
        }
        .boxed()
    }

    fn node_lock<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ClusterError>> {
        async move {
            let api: Api<Node> = Api::all(self.client.clone());
            let what = format!("get node {node}");
            let found = retrying(&what, false, || api.get_opt(node))
                .await
                .map_err(kube_error(what))?
                .ok_or_else(|| ClusterError::NotFound(format!("node {node}")))?;
            Ok(found
                .metadata
                .annotations
                .and_then(|mut a| a.remove(keys::NODE_LOCK)))
        }
        .boxed()
    }

    fn patch_pod_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: AnnotationPatch,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        async move {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let body = Patch::Merge(annotations_patch(&patch));
            let params = PatchParams::default();
            let what = format!("patch pod {namespace}/{name}");
            retrying(&what, true, || api.patch(name, &params, &body))
                .await
                .map_err(kube_error(what))?;
            Ok(())
        }
        .boxed()
    }

    fn release_node_lock<'a>(
        &'a self,
        node: &'a str,
        owner: &'a LockOwner,
    ) -> BoxFuture<'a, Result<bool, ClusterError>> {
        async move {
            let api: Api<Node> = Api::all(self.client.clone());
            for _ in 0..CONFLICT_RETRIES {
                let what = format!("get node {node}");
                let Some(found) = retrying(&what, false, || api.get_opt(node))
                    .await
                    .map_err(kube_error(what))?
                else {
                    return Err(ClusterError::NotFound(format!("node {node}")));
                };
                let raw = found
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(keys::NODE_LOCK));
                if !raw.is_some_and(|raw| lock_releasable_by(raw, owner)) {
                    return Ok(false);
                }
                let patch = json!({ "metadata": {
                    "resourceVersion": found.metadata.resource_version,
                    "annotations": { keys::NODE_LOCK: null },
                }});
                let body = Patch::Merge(patch);
                let params = PatchParams::default();
                let what = format!("release lock of node {node}");
                match retrying(&what, false, || api.patch(node, &params, &body)).await {
                    Ok(_) => return Ok(true),
                    Err(e) if is_conflict(&e) => {}
                    Err(e) => return Err(kube_error(format!("release lock of node {node}"))(e)),
                }
            }
            Err(ClusterError::Conflict(format!(
                "release lock of node {node}"
            )))
        }
        .boxed()
    }

    fn set_node_annotation<'a>(
        &'a self,
        node: &'a str,
        key: &'a str,
        value: String,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        async move {
            let api: Api<Node> = Api::all(self.client.clone());
            let body = Patch::Merge(json!({ "metadata": { "annotations": { key: value } } }));
            let params = PatchParams::default();
            let what = format!("annotate node {node}");
            retrying(&what, true, || api.patch(node, &params, &body))
                .await
                .map_err(kube_error(what))?;
            Ok(())
        }
        .boxed()
    }

    fn resource_claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ClaimView>, ClusterError>> {
        async move {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            let what = format!("get resourceclaim {namespace}/{name}");
            let found = retrying(&what, false, || api.get_opt(name))
                .await
                .map_err(kube_error(what))?;
            Ok(found.as_ref().map(claim_view))
        }
        .boxed()
    }

    fn resource_claims(&self) -> BoxFuture<'_, Result<Vec<ClaimView>, ClusterError>> {
        async move {
            let api: Api<ResourceClaim> = Api::all(self.client.clone());
            let params = ListParams::default();
            let what = "list resourceclaims".to_owned();
            let list = retrying(&what, false, || api.list(&params))
                .await
                .map_err(kube_error(what))?;
            Ok(list.items.iter().map(claim_view).collect())
        }
        .boxed()
    }

    fn resource_slice<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSlice>, ClusterError>> {
        async move {
            let api: Api<ResourceSlice> = Api::all(self.client.clone());
            let what = format!("get resourceslice {name}");
            retrying(&what, false, || api.get_opt(name))
                .await
                .map_err(kube_error(what))
        }
        .boxed()
    }

    fn write_resource_slice(
        &self,
        slice: ResourceSlice,
    ) -> BoxFuture<'_, Result<ResourceSlice, ClusterError>> {
        async move {
            let api: Api<ResourceSlice> = Api::all(self.client.clone());
            let name = slice.metadata.name.clone().unwrap_or_default();
            let params = PostParams::default();
            let (what, result) = if slice.metadata.resource_version.is_some() {
                let what = format!("replace resourceslice {name}");
                let result = retrying(&what, false, || api.replace(&name, &params, &slice)).await;
                (what, result)
            } else {
                let what = format!("create resourceslice {name}");
                let result = retrying(&what, false, || api.create(&params, &slice)).await;
                (what, result)
            };
            match result {
                Ok(stored) => Ok(stored),
                Err(e) if is_conflict(&e) => Err(ClusterError::Conflict(what)),
                Err(e) => Err(kube_error(what)(e)),
            }
        }
        .boxed()
    }

    /// Only `Delete` events count: a claim missing from a relist may be
    /// one created after it, and is left to the kubelet's Unprepare.
    fn claim_deletions(&self) -> BoxStream<'static, String> {
        use kube::runtime::WatchStreamExt as _;
        use kube::runtime::watcher::{self, Event};
        let api: Api<ResourceClaim> = Api::all(self.client.clone());
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .filter_map(|event| {
                let uid = match event {
                    Ok(Event::Delete(claim)) => claim.metadata.uid,
                    Ok(_) => None,
                    Err(error) => {
                        tracing::warn!(%error, "resourceclaim watch error; retrying");
                        None
                    }
                };
                futures::future::ready(uid)
            })
            .boxed()
    }

    /// A watch on the one object (field selector `metadata.name`): each
    /// event yields the object, a deletion `None`, a (re)list the object
    /// found or `None`.
    fn resource_slice_changes(&self, name: &str) -> BoxStream<'static, Option<ResourceSlice>> {
        use kube::runtime::WatchStreamExt as _;
        use kube::runtime::watcher::{self, Event};
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut listed: Option<ResourceSlice> = None;
        watcher::watcher(api, config)
            .default_backoff()
            .filter_map(move |event| {
                let change = match event {
                    Ok(Event::Apply(slice)) => Some(Some(slice)),
                    Ok(Event::Delete(_)) => Some(None),
                    Ok(Event::Init) => {
                        listed = None;
                        None
                    }
                    Ok(Event::InitApply(slice)) => {
                        listed = Some(slice);
                        None
                    }
                    Ok(Event::InitDone) => Some(listed.take()),
                    Err(error) => {
                        tracing::warn!(%error, "resourceslice watch error; retrying");
                        None
                    }
                };
                futures::future::ready(change)
            })
            .boxed()
    }

    /// The relist's snapshot is stamped when the watcher announces it
    /// (`Event::Init`, yielded before the LIST is requested), and the LIST
    /// is a quorum read (`ListSemantic::MostRecent`): a list served from
    /// the apiserver's cache could miss a pod an Allocate already read.
    fn pod_changes(&self, node: &str, clock: CommitClock) -> BoxStream<'static, PodChange> {
        use kube::runtime::WatchStreamExt as _;
        use kube::runtime::watcher::{self, Event};
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .list_semantic(watcher::ListSemantic::MostRecent);
        let mut listing = LiveSnapshot::default();
        watcher::watcher(api, config)
            .default_backoff()
            .filter_map(move |event| {
                let change = match event {
                    Ok(Event::Delete(pod)) => pod.metadata.uid.map(PodChange::Gone),
                    Ok(Event::Apply(pod)) => {
                        let view = pod_view(&pod);
                        view.is_terminal().then_some(PodChange::Gone(view.uid))
                    }
                    Ok(Event::Init) => {
                        listing = LiveSnapshot {
                            live: std::collections::BTreeSet::new(),
                            taken_at: clock.now(),
                        };
                        None
                    }
                    Ok(Event::InitApply(pod)) => {
                        let view = pod_view(&pod);
                        if !view.is_terminal() {
                            listing.live.insert(view.uid);
                        }
                        None
                    }
                    Ok(Event::InitDone) => Some(PodChange::Live(std::mem::take(&mut listing))),
                    Err(error) => {
                        tracing::warn!(%error, "pod watch error; retrying");
                        None
                    }
                };
                futures::future::ready(change)
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_view_orders_init_containers_first_and_reads_disable_control() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "annotations": {"a": "b"}, "deletionTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": [
                    {"name": "app", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]},
                    {"name": "side"}
                ]
            },
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let view = pod_view(&pod);
        let names: Vec<&str> = view.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["init", "app", "side"]);
        assert!(view.containers[1].cuda_disable_control);
        assert!(!view.containers[2].cuda_disable_control);
        let init: Vec<bool> = view.containers.iter().map(|c| c.init).collect();
        assert_eq!(init, [true, false, false]);
        assert!(view.terminating);
        assert_eq!((view.uid.as_str(), view.phase.as_str()), ("u1", "Pending"));
        assert_eq!(view.annotation("a"), Some("b"));
    }

    #[test]
    fn claim_view_reads_the_allocation_results_and_consumed_capacity() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "n1", "device": "gpu-0",
                 "shareID": "s-1", "consumedCapacity": {"memory": "3000Mi", "cores": "30"}},
                {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "n1", "device": "gpu-1"}
            ]}}}
        }))
        .unwrap();
        let view = claim_view(&claim);
        assert!(view.allocated);
        assert_eq!((view.namespace.as_str(), view.uid.as_str()), ("ns", "u1"));
        assert_eq!(view.results.len(), 2);
        assert_eq!(view.results[0].share_id.as_deref(), Some("s-1"));
        assert_eq!(view.results[0].consumed["memory"], "3000Mi");
        assert!(view.results[1].consumed.is_empty());
        let pending: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {}})).unwrap();
        assert!(!claim_view(&pending).allocated);
    }

    #[test]
    fn annotation_patch_removes_with_null() {
        let patch: AnnotationPatch = [
            ("x".to_owned(), None),
            ("y".to_owned(), Some("1".to_owned())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            annotations_patch(&patch),
            json!({"metadata": {"annotations": {"x": null, "y": "1"}}})
        );
    }
}

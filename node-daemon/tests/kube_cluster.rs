//! `KubeCluster` against an in-process HTTP stand-in for kube-apiserver
//! (a `tower::service_fn` under a real `kube::Client`): the requests it
//! makes (paths, field selector, merge patches, resourceVersion guard) and
//! how it handles a 409 Conflict.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use node_daemon::cluster::kube::KubeCluster;
use node_daemon::cluster::{AnnotationPatch, Cluster as _};
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// What the stand-in holds and saw.
#[derive(Debug, Default)]
struct ApiState {
    node: Value,
    pods: Vec<Value>,
    /// `METHOD path?query` of every request.
    log: Vec<String>,
    /// Merge-patch bodies received.
    patches: Vec<Value>,
    /// Bump the node's resourceVersion once right before the next PATCH,
    /// as a concurrent writer would.
    race_next_patch: bool,
    /// The one `ResourceSlice` (`n1-gpu.gpuslice.dev`), if created.
    slice: Option<Value>,
    /// `ResourceClaim`s (all in namespace `ns`).
    claims: Vec<Value>,
    /// `(method, path, status)`: fail the next matching request once.
    fail_once: Vec<(&'static str, &'static str, u16)>,
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn bump(rv: &mut Value) {
    let n: u64 = rv.as_str().unwrap().parse().unwrap();
    *rv = Value::String((n + 1).to_string());
}

async fn handle(
    state: Arc<Mutex<ApiState>>,
    req: Request<kube::client::Body>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let mut s = state.lock().await;
    let target = parts.uri.path_and_query().unwrap().as_str().to_owned();
    s.log.push(format!("{} {target}", parts.method));
    let path = parts.uri.path().to_owned();
    let path = path.as_str();
    if let Some(i) = s
        .fail_once
        .iter()
        .position(|(m, p, _)| *m == parts.method.as_str() && *p == path)
    {
        let (_, _, code) = s.fail_once.remove(i);
        return reply(
            StatusCode::from_u16(code).unwrap(),
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": "injected"}),
        );
    }
    match (parts.method.as_str(), path) {
        ("GET", "/api/v1/pods") => {
            let items = s.pods.clone();
            reply(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": items}),
            )
        }
        ("GET", "/api/v1/nodes/n1") => reply(StatusCode::OK, &s.node),
        ("PATCH", "/api/v1/nodes/n1") => {
            assert_eq!(
                parts.headers["content-type"],
                "application/merge-patch+json"
            );
            let patch: Value = serde_json::from_slice(&body).unwrap();
            s.patches.push(patch.clone());
            if std::mem::take(&mut s.race_next_patch) {
                bump(&mut s.node["metadata"]["resourceVersion"]);
            }
            let guard = &patch["metadata"]["resourceVersion"];
            if !guard.is_null() && *guard != s.node["metadata"]["resourceVersion"] {
                return reply(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
                );
            }
            let mut patch = patch;
            if let Some(meta) = patch["metadata"].as_object_mut() {
                meta.remove("resourceVersion");
            }
            merge(&mut s.node, &patch);
            bump(&mut s.node["metadata"]["resourceVersion"]);
            reply(StatusCode::OK, &s.node)
        }
        ("PATCH", "/api/v1/namespaces/ns/pods/p") => {
            assert_eq!(
                parts.headers["content-type"],
                "application/merge-patch+json"
            );
            let patch: Value = serde_json::from_slice(&body).unwrap();
            s.patches.push(patch.clone());
            merge(&mut s.pods[0], &patch);
            reply(StatusCode::OK, &s.pods[0])
        }
        ("GET", "/apis/resource.k8s.io/v1/resourceclaims") => reply(
            StatusCode::OK,
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                    "metadata": {"resourceVersion": "9"}, "items": s.claims}),
        ),
        ("GET", p) if p.starts_with("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") => {
            let name = p.rsplit('/').next().unwrap();
            match s.claims.iter().find(|c| c["metadata"]["name"] == name) {
                Some(c) => reply(StatusCode::OK, c),
                None => not_found(),
            }
        }
        ("GET", SLICE_PATH) => match &s.slice {
            Some(slice) => reply(StatusCode::OK, slice),
            None => not_found(),
        },
        ("POST", "/apis/resource.k8s.io/v1/resourceslices") => {
            if s.slice.is_some() {
                return reply(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409}),
                );
            }
            let mut slice: Value = serde_json::from_slice(&body).unwrap();
            slice["metadata"]["resourceVersion"] = json!("1");
            s.slice = Some(slice.clone());
            reply(StatusCode::CREATED, &slice)
        }
        ("PUT", SLICE_PATH) => {
            let mut slice: Value = serde_json::from_slice(&body).unwrap();
            let stored = s
                .slice
                .as_ref()
                .map(|o| o["metadata"]["resourceVersion"].clone());
            if stored.as_ref() != Some(&slice["metadata"]["resourceVersion"]) {
                return reply(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
                );
            }
            bump(&mut slice["metadata"]["resourceVersion"]);
            s.slice = Some(slice.clone());
            reply(StatusCode::OK, &slice)
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        ),
    }
}

const SLICE_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices/n1-gpu.gpuslice.dev";

fn not_found() -> Response<Full<Bytes>> {
    reply(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
    )
}

fn stand_in(lock: &str) -> (KubeCluster, Arc<Mutex<ApiState>>) {
    let state = Arc::new(Mutex::new(ApiState {
        node: json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "5", "annotations": {keys::NODE_LOCK: lock, "other": "kept"}}}),
        pods: vec![json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "3",
                         "annotations": {keys::BIND_PHASE: "allocating"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app"}]},
            "status": {"phase": "Pending"}})],
        ..ApiState::default()
    }));
    let shared = Arc::clone(&state);
    let service = tower::service_fn(move |req| {
        let state = Arc::clone(&shared);
        async move { Ok::<_, std::convert::Infallible>(handle(state, req).await) }
    });
    (
        KubeCluster::new(kube::Client::new(service, "default")),
        state,
    )
}

fn owner(pod: &str) -> LockOwner {
    LockOwner {
        namespace: "ns".into(),
        pod: pod.into(),
    }
}

#[tokio::test]
async fn pods_are_listed_by_node_field_selector() {
    let (cluster, state) = stand_in("2025-10-20T03:07:02Z,ns,p");
    let pods = cluster.pods_on_node("n1").await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(
        (
            pods[0].full_name().as_str(),
            pods[0].uid.as_str(),
            pods[0].phase.as_str()
        ),
        ("ns/p", "u1", "Pending")
    );
    let log = &state.lock().await.log;
    assert!(
        log[0].starts_with("GET /api/v1/pods?")
            && log[0].contains("fieldSelector=spec.nodeName%3Dn1"),
        "{log:?}"
    );
}

#[tokio::test]
async fn the_owner_releases_the_lock_guarded_by_resource_version() {
    let (cluster, state) = stand_in("2025-10-20T03:07:02Z,ns,p");
    assert_eq!(
        cluster.node_lock("n1").await.unwrap().as_deref(),
        Some("2025-10-20T03:07:02Z,ns,p")
    );
    assert!(cluster.release_node_lock("n1", &owner("p")).await.unwrap());
    let s = state.lock().await;
    assert_eq!(
        s.patches,
        [json!({"metadata": {"resourceVersion": "5", "annotations": {keys::NODE_LOCK: null}}})]
    );
    assert!(
        s.node["metadata"]["annotations"]
            .get(keys::NODE_LOCK)
            .is_none()
    );
    assert_eq!(s.node["metadata"]["annotations"]["other"], "kept");
}

#[tokio::test]
async fn another_pods_lock_is_left_alone() {
    let (cluster, state) = stand_in("2025-10-20T03:07:02Z,ns,someone-else");
    assert!(!cluster.release_node_lock("n1", &owner("p")).await.unwrap());
    let s = state.lock().await;
    assert!(s.patches.is_empty());
    assert!(s.log.iter().all(|l| l.starts_with("GET")), "{:?}", s.log);
}

#[tokio::test]
async fn a_conflicting_release_is_retried_with_the_new_version() {
    let (cluster, state) = stand_in("2025-10-20T03:07:02Z,ns,p");
    state.lock().await.race_next_patch = true;
    assert!(cluster.release_node_lock("n1", &owner("p")).await.unwrap());
    let s = state.lock().await;
    let versions: Vec<&Value> = s
        .patches
        .iter()
        .map(|p| &p["metadata"]["resourceVersion"])
        .collect();
    assert_eq!(versions, [&json!("5"), &json!("6")]);
    assert!(
        s.node["metadata"]["annotations"]
            .get(keys::NODE_LOCK)
            .is_none()
    );
}

#[tokio::test]
async fn pod_annotations_are_one_merge_patch_with_null_removal() {
    let (cluster, state) = stand_in("x");
    let patch: AnnotationPatch = [
        (keys::BIND_PHASE.to_owned(), Some("success".to_owned())),
        (keys::VGPU_DEVICES_TO_ALLOCATE.to_owned(), None),
    ]
    .into_iter()
    .collect();
    cluster
        .patch_pod_annotations("ns", "p", patch)
        .await
        .unwrap();
    cluster
        .set_node_annotation("n1", keys::NODE_NVIDIA_REGISTER, "[]".into())
        .await
        .unwrap();
    let s = state.lock().await;
    assert_eq!(
        s.pods[0]["metadata"]["annotations"][keys::BIND_PHASE],
        "success"
    );
    assert_eq!(
        s.patches[0],
        json!({"metadata": {"annotations": {keys::BIND_PHASE: "success", keys::VGPU_DEVICES_TO_ALLOCATE: null}}})
    );
    assert_eq!(
        s.node["metadata"]["annotations"][keys::NODE_NVIDIA_REGISTER],
        "[]"
    );
}

#[tokio::test]
async fn a_missing_node_is_not_found() {
    let (cluster, _) = stand_in("x");
    let err = cluster.node_lock("nope").await.unwrap_err();
    assert!(err.to_string().contains("node nope not found"), "{err}");
}

#[tokio::test]
async fn transient_server_errors_are_retried() {
    let (cluster, state) = stand_in("2025-10-20T03:07:02Z,ns,p");
    state.lock().await.fail_once = vec![
        ("PATCH", "/api/v1/namespaces/ns/pods/p", 500),
        ("PATCH", "/api/v1/nodes/n1", 503),
        ("GET", "/api/v1/pods", 500),
    ];
    let patch: AnnotationPatch = [(keys::BIND_PHASE.to_owned(), Some("success".to_owned()))]
        .into_iter()
        .collect();
    cluster
        .patch_pod_annotations("ns", "p", patch)
        .await
        .unwrap();
    assert!(cluster.release_node_lock("n1", &owner("p")).await.unwrap());
    assert_eq!(cluster.pods_on_node("n1").await.unwrap().len(), 1);
    let s = state.lock().await;
    assert!(s.fail_once.is_empty());
    assert_eq!(
        s.pods[0]["metadata"]["annotations"][keys::BIND_PHASE],
        "success"
    );
    assert!(
        s.node["metadata"]["annotations"]
            .get(keys::NODE_LOCK)
            .is_none()
    );
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let (cluster, state) = stand_in("x");
    state.lock().await.fail_once = vec![("PATCH", "/api/v1/namespaces/ns/pods/p", 422)];
    let patch: AnnotationPatch = [(keys::BIND_PHASE.to_owned(), Some("success".to_owned()))]
        .into_iter()
        .collect();
    let err = cluster
        .patch_pod_annotations("ns", "p", patch)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("patch pod ns/p"), "{err}");
    let s = state.lock().await;
    assert_eq!(s.log.iter().filter(|l| l.starts_with("PATCH")).count(), 1);
}

fn gpu(index: u32, healthy: bool) -> node_daemon::devices::Gpu {
    node_daemon::devices::Gpu {
        uuid: format!("GPU-{index}"),
        index,
        device_type: "NVIDIA-Tesla T4".into(),
        memory_mib: 15_360,
        cores: 100,
        split_count: 10,
        numa: 0,
        healthy,
        mig_profiles: Vec::new(),
    }
}

#[tokio::test]
async fn the_slice_is_created_then_replaced_under_its_resource_version() {
    use node_daemon::cluster::ClusterError;
    use node_daemon::dra::slice::slice_update;
    let (cluster, state) = stand_in("");
    assert!(
        cluster
            .resource_slice("n1-gpu.gpuslice.dev")
            .await
            .unwrap()
            .is_none()
    );
    let gpus = [gpu(0, true), gpu(1, true)];
    let created = cluster
        .write_resource_slice(slice_update("n1", &gpus, None).unwrap())
        .await
        .unwrap();
    assert_eq!(created.metadata.resource_version.as_deref(), Some("1"));
    // A second create is a conflict, as a replace from a stale read is.
    let again = cluster
        .write_resource_slice(slice_update("n1", &gpus, None).unwrap())
        .await;
    assert!(matches!(again, Err(ClusterError::Conflict(_))), "{again:?}");
    let sick = [gpu(0, true), gpu(1, false)];
    let replaced = cluster
        .write_resource_slice(slice_update("n1", &sick, Some(&created)).unwrap())
        .await
        .unwrap();
    assert_eq!(replaced.spec.pool.generation, 2);
    assert_eq!(replaced.metadata.resource_version.as_deref(), Some("2"));
    let stale = cluster
        .write_resource_slice(
            slice_update("n1", &[gpu(0, false), gpu(1, true)], Some(&created)).unwrap(),
        )
        .await;
    assert!(matches!(stale, Err(ClusterError::Conflict(_))), "{stale:?}");
    let log = state.lock().await.log.clone();
    let methods: Vec<&str> = log.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(methods, ["GET", "POST", "POST", "PUT", "PUT"], "{log:?}");
}

#[tokio::test]
async fn claims_are_read_by_name_and_listed() {
    let (cluster, state) = stand_in("");
    state.lock().await.claims.push(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": "n1", "device": "gpu-0",
             "consumedCapacity": {"memory": "3000Mi"}}]}}}
    }));
    let claim = cluster.resource_claim("ns", "c").await.unwrap().unwrap();
    assert_eq!(
        (claim.uid.as_str(), claim.results[0].device.as_str()),
        ("u1", "gpu-0")
    );
    assert!(
        cluster
            .resource_claim("ns", "nobody")
            .await
            .unwrap()
            .is_none()
    );
    let all = cluster.resource_claims().await.unwrap();
    assert_eq!(all.len(), 1);
    let log = state.lock().await.log.clone();
    assert_eq!(
        log,
        [
            "GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c",
            "GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/nobody",
            "GET /apis/resource.k8s.io/v1/resourceclaims?",
        ]
    );
}

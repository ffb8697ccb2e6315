//! The extender never answers from a model that has not caught up: before
//! the first list of nodes, pods and resourcequotas `/filter` and `/bind`
//! answer `Error` (kube-scheduler retries), and a filter naming nodes the
//! model has no GPUs for yet waits, bounded, for the watch to deliver them.
//!
//! Time here is tokio's paused clock where a wait is involved: nothing
//! depends on how fast the machine is.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use actix_web::{App, test};
use k8s_openapi::api::core::v1::{Node, Pod};
use proto::hami::keys;
use proto::hami::register::{self, NodeDevice};
use scheduler_webhook::cache::model::{ClusterModel, FilterOutcome, ModelConfig};
use scheduler_webhook::cache::owner::{self, Command, Kind, ModelHandle, UNREGISTERED_WAIT};
use scheduler_webhook::core::policy::SchedulerConfig;
use scheduler_webhook::core::request::RequestConfig;
use scheduler_webhook::events::EventSink;
use scheduler_webhook::extender::handler::{ExtenderState, NOT_SYNCED, configure};
use scheduler_webhook::metrics::Metrics;
use serde_json::{Value, json};
use tokio::time::Instant;

fn model() -> ModelHandle {
    owner::spawn(ClusterModel::new(ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 1,
    }))
}

/// A node as the node-daemon publishes it: `gpus` GPUs of 16 GiB, or no
/// register annotation at all when `gpus` is 0 (the daemon has not
/// registered yet).
fn node(name: &str, gpus: u32) -> Node {
    let devices: Vec<NodeDevice> = (0..gpus)
        .map(|i| NodeDevice {
            id: format!("GPU-{name}-{i}"),
            index: i,
            count: 10,
            devmem: 16384,
            devcore: 100,
            device_type: "NVIDIA-Tesla T4".into(),
            numa: 0,
            mode: "hami-core".into(),
            health: true,
            mig_profiles: Vec::new(),
        })
        .collect();
    let annotations = if gpus == 0 {
        json!({})
    } else {
        json!({keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()})
    };
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}})).unwrap()
}

fn slice_pod(uid: &str) -> Pod {
    serde_json::from_value(slice_pod_json(uid)).unwrap()
}

fn slice_pod_json(uid: &str) -> Value {
    json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "10"}}}]}
    })
}

fn candidates(names: &[&str]) -> Arc<[String]> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

async fn apply(handle: &ModelHandle, node: Node) {
    handle
        .send(Command::ApplyNode(Box::new(node)))
        .await
        .unwrap();
}

/// Every command sent before this one has been applied by the owner.
async fn round_trip(handle: &ModelHandle) {
    handle.quotas().await.unwrap();
}

fn placed_on(outcome: &FilterOutcome) -> Option<&str> {
    match outcome {
        FilterOutcome::Placed { node, .. } => Some(node),
        _ => None,
    }
}

// === the sync gate ===

/// An API client for a server that does not exist: the sync gate must
/// answer before any API call.
fn offline_client() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn state(model: ModelHandle) -> ExtenderState {
    ExtenderState {
        model,
        client: offline_client(),
        metrics: Arc::new(Metrics::new()),
        events: EventSink::disabled(),
    }
}

async fn mark_listed(handle: &ModelHandle, kinds: &[Kind]) {
    for kind in kinds {
        handle.send(Command::RelistStarted(*kind)).await.unwrap();
        handle.send(Command::RelistDone(*kind)).await.unwrap();
    }
    round_trip(handle).await;
}

#[actix_web::test]
async fn filter_answers_error_until_nodes_pods_and_quotas_are_listed() {
    let handle = model();
    // The node is known with free GPUs, but the pods holding them are not
    // listed yet: placing a slice now would be a guess.
    handle
        .send(Command::RelistStarted(Kind::Nodes))
        .await
        .unwrap();
    apply(&handle, node("n1", 1)).await;
    handle.send(Command::RelistDone(Kind::Nodes)).await.unwrap();
    mark_listed(&handle, &[Kind::Quotas]).await;
    let app =
        test::init_service(App::new().configure(|c| configure(c, state(handle.clone())))).await;
    let args = json!({"Pod": slice_pod_json("a"), "NodeNames": ["n1"]});
    let request = || {
        test::TestRequest::post()
            .uri("/filter")
            .set_json(&args)
            .to_request()
    };
    let before: Value = test::call_and_read_body_json(&app, request()).await;
    assert_eq!(before["Error"], NOT_SYNCED, "{before}");
    assert!(
        before["NodeNames"].is_null() || before["NodeNames"] == json!([]),
        "no node may be offered: {before}"
    );

    mark_listed(&handle, &[Kind::Pods]).await;
    assert!(handle.is_ready());
    let after: Value = test::call_and_read_body_json(&app, request()).await;
    assert_eq!(after["NodeNames"], json!(["n1"]), "{after}");
    assert!(after["Error"].is_null() || after["Error"] == "", "{after}");
}

#[actix_web::test]
async fn bind_answers_error_until_nodes_pods_and_quotas_are_listed() {
    let handle = model();
    mark_listed(&handle, &[Kind::Nodes, Kind::Pods]).await;
    let app = test::init_service(App::new().configure(|c| configure(c, state(handle)))).await;
    let args = json!({"PodName": "a", "PodNamespace": "ns", "PodUID": "a", "Node": "n1"});
    let request = test::TestRequest::post()
        .uri("/bind")
        .set_json(&args)
        .to_request();
    let answer: Value = test::call_and_read_body_json(&app, request).await;
    assert_eq!(answer["Error"], NOT_SYNCED, "{answer}");
}

// === the bounded wait for unregistered nodes ===

#[tokio::test(start_paused = true)]
async fn a_filter_waits_for_the_register_annotation_of_a_known_node() {
    let handle = model();
    // The watch delivered the node before the node-daemon registered its GPUs.
    apply(&handle, node("n1", 0)).await;
    let filter = tokio::spawn({
        let handle = handle.clone();
        async move { handle.filter(slice_pod("a"), candidates(&["n1"])).await }
    });
    round_trip(&handle).await;
    round_trip(&handle).await;
    assert!(
        !filter.is_finished(),
        "the filter answered before the node's GPUs arrived: {:?}",
        filter.await
    );
    apply(&handle, node("n1", 1)).await;
    let outcome = filter.await.unwrap().unwrap();
    assert_eq!(placed_on(&outcome), Some("n1"), "{outcome:?}");
}

#[tokio::test(start_paused = true)]
async fn a_filter_waits_for_a_node_the_watch_has_not_delivered() {
    let handle = model();
    let filter = tokio::spawn({
        let handle = handle.clone();
        async move { handle.filter(slice_pod("a"), candidates(&["n1"])).await }
    });
    round_trip(&handle).await;
    round_trip(&handle).await;
    assert!(
        !filter.is_finished(),
        "the filter answered \"node unregistered\" for a node kube-scheduler knows: {:?}",
        filter.await
    );
    apply(&handle, node("n1", 1)).await;
    let outcome = filter.await.unwrap().unwrap();
    assert_eq!(placed_on(&outcome), Some("n1"), "{outcome:?}");
}

#[tokio::test(start_paused = true)]
async fn a_node_that_never_registers_is_waited_for_once_and_for_a_bounded_time() {
    let handle = model();
    // A node without GPUs (no device plugin), next to a full GPU node.
    apply(&handle, node("cpu-only", 0)).await;
    apply(&handle, node("n1", 1)).await;
    let both = candidates(&["cpu-only", "n1"]);
    let mut big = slice_pod("big");
    big.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpumem".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("99999".into()),
        );

    // Paused clock: `elapsed` is virtual time the runtime advanced to fire
    // the wait's deadline, not wall-clock time.
    let start = Instant::now();
    let first = handle.filter(big.clone(), Arc::clone(&both)).await.unwrap();
    assert!(matches!(first, FilterOutcome::NoFit { .. }), "{first:?}");
    assert_eq!(start.elapsed(), UNREGISTERED_WAIT, "waited once, bounded");

    let again = Instant::now();
    let second = handle.filter(big, both).await.unwrap();
    assert!(matches!(second, FilterOutcome::NoFit { .. }), "{second:?}");
    assert_eq!(
        again.elapsed(),
        owner::CATCH_UP_WAIT,
        "not twice: only the catch-up wait of a verdict of no fit"
    );

    // It registers later: it is a candidate like any other again.
    apply(&handle, node("cpu-only", 1)).await;
    let outcome = handle
        .filter(slice_pod("small"), candidates(&["cpu-only"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&outcome), Some("cpu-only"), "{outcome:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_fits_a_registered_node_is_placed_without_waiting() {
    let handle = model();
    apply(&handle, node("n1", 1)).await;
    let start = Instant::now();
    let outcome = handle
        .filter(slice_pod("a"), candidates(&["not-yet", "n1"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&outcome), Some("n1"), "{outcome:?}");
    assert_eq!(start.elapsed(), std::time::Duration::ZERO);
}

fn pod_asking(uid: &str, mem: u32) -> Pod {
    let mut pod = slice_pod_json(uid);
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] =
        json!(mem.to_string());
    serde_json::from_value(pod).unwrap()
}

/// kube-scheduler retries a rejected pod on the event that freed room (a pod
/// finishing) a few milliseconds before our watch delivers it; the filter
/// where nothing fits waits for the model's next change and decides again,
/// instead of refusing the pod with no later event to retry on.
#[tokio::test(start_paused = true)]
async fn a_filter_where_nothing_fits_decides_again_when_a_pod_leaves_meanwhile() {
    let handle = model();
    apply(&handle, node("n1", 1)).await;
    let big = handle
        .filter(pod_asking("big", 16000), candidates(&["n1"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&big), Some("n1"), "{big:?}");
    let filter = tokio::spawn({
        let handle = handle.clone();
        async move { handle.filter(slice_pod("b"), candidates(&["n1"])).await }
    });
    round_trip(&handle).await;
    round_trip(&handle).await;
    assert!(
        !filter.is_finished(),
        "the filter refused at once, before the model caught up: {:?}",
        filter.await
    );
    handle
        .send(Command::DeletePod("big".to_owned()))
        .await
        .unwrap();
    let outcome = filter.await.unwrap().unwrap();
    assert_eq!(placed_on(&outcome), Some("n1"), "{outcome:?}");
}

/// With no change to wait for, a filter where nothing fits answers so after
/// the bounded catch-up wait.
#[tokio::test(start_paused = true)]
async fn a_filter_where_nothing_fits_answers_after_the_bounded_wait() {
    let handle = model();
    apply(&handle, node("n1", 1)).await;
    let started = Instant::now();
    let outcome = handle
        .filter(pod_asking("huge", 20000), candidates(&["n1"]))
        .await
        .unwrap();
    assert!(
        matches!(outcome, FilterOutcome::NoFit { .. }),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() >= owner::CATCH_UP_WAIT,
        "it waited for the model to catch up"
    );
}

fn binding(uid: &str, node: &str) -> scheduler_webhook::extender::wire::ExtenderBindingArgs {
    scheduler_webhook::extender::wire::ExtenderBindingArgs {
        pod_name: uid.to_owned(),
        pod_namespace: "ns".to_owned(),
        pod_uid: uid.to_owned(),
        node: node.to_owned(),
    }
}

/// A bind for a pod this replica never filtered (or whose decision was
/// released) is refused before any API call, naming the pod; kube-scheduler
/// filters it again.
#[tokio::test]
async fn a_bind_without_a_filter_decision_is_refused_as_no_decision() {
    use scheduler_webhook::extender::bind::{BindFailure, bind};
    let handle = model();
    mark_listed(&handle, &[Kind::Nodes, Kind::Pods, Kind::Quotas]).await;
    apply(&handle, node("n1", 1)).await;
    let err = bind(&offline_client(), &handle, &binding("a", "n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BindFailure::NoDecision(p) if p == "ns/a"),
        "{err}"
    );
}

/// A bind to another node than the one the filter chose is refused, names
/// both nodes, and drops the reservation (nothing stays booked on the
/// chosen node for a pod that will be filtered again).
#[tokio::test]
async fn a_bind_to_another_node_is_refused_and_releases_the_reservation() {
    use scheduler_webhook::extender::bind::{BindFailure, bind};
    let handle = model();
    // Listed empty first (a relist drops what it did not deliver), then the
    // nodes arrive as watch events.
    mark_listed(&handle, &[Kind::Nodes, Kind::Pods, Kind::Quotas]).await;
    apply(&handle, node("n1", 1)).await;
    apply(&handle, node("n2", 1)).await;
    let placed = handle
        .filter(slice_pod("a"), candidates(&["n1"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&placed), Some("n1"), "{placed:?}");
    assert!(handle.decision("a").await.unwrap().is_some());
    let err = bind(&offline_client(), &handle, &binding("a", "n2"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BindFailure::WrongNode { asked, chosen } if asked == "n2" && chosen == "n1"),
        "{err}"
    );
    assert!(
        handle.decision("a").await.unwrap().is_none(),
        "the reservation was released"
    );
}

// === the node lock, against an in-process API stand-in ===

/// A kube-apiserver stand-in for the bind: one node `n1`, pods by
/// `namespace/name`, merge patches (with the `resourceVersion`
/// precondition), `pods/binding`; it records every request.
mod api {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt as _, Full};
    use serde_json::{Value, json};
    use tokio::sync::Mutex;

    #[derive(Debug, Default)]
    pub struct State {
        pub node: Value,
        pub pods: BTreeMap<String, Value>,
        /// `METHOD path` of every request.
        pub log: Vec<String>,
    }

    /// RFC 7386 merge patch: `null` removes, objects merge, anything else
    /// replaces.
    fn merge(target: &mut Value, patch: &Value) {
        if patch.is_object() && !target.is_object() {
            *target = json!({});
        }
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

    fn status(code: u16, reason: &str) -> Response<Full<Bytes>> {
        reply(
            StatusCode::from_u16(code).unwrap(),
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason}),
        )
    }

    /// Applies a merge patch honouring its `resourceVersion` precondition;
    /// bumps the object's `resourceVersion`.
    fn patch(object: &mut Value, mut patch: Value) -> Response<Full<Bytes>> {
        let guard = patch["metadata"]["resourceVersion"].take();
        if !guard.is_null() && guard != object["metadata"]["resourceVersion"] {
            return status(409, "Conflict");
        }
        if let Some(meta) = patch["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        merge(object, &patch);
        let rv: u64 = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        object["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
        reply(StatusCode::OK, object)
    }

    async fn handle(
        state: Arc<Mutex<State>>,
        req: Request<kube::client::Body>,
    ) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body: Value = serde_json::from_slice(&body.collect().await.unwrap().to_bytes())
            .unwrap_or(Value::Null);
        let mut s = state.lock().await;
        let path = parts.uri.path().to_owned();
        s.log.push(format!("{} {path}", parts.method));
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (parts.method.as_str(), segments.as_slice()) {
            ("GET", ["api", "v1", "nodes", "n1"]) => reply(StatusCode::OK, &s.node),
            ("PATCH", ["api", "v1", "nodes", "n1"]) => patch(&mut s.node, body),
            ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
                match s.pods.get(&format!("{ns}/{name}")) {
                    Some(pod) => reply(StatusCode::OK, pod),
                    None => status(404, "NotFound"),
                }
            }
            ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
                match s.pods.get_mut(&format!("{ns}/{name}")) {
                    Some(pod) => patch(pod, body),
                    None => status(404, "NotFound"),
                }
            }
            ("POST", ["api", "v1", "namespaces", ns, "pods", name, "binding"]) => {
                let node = body["target"]["name"].clone();
                match s.pods.get_mut(&format!("{ns}/{name}")) {
                    // As kube-apiserver: a bound pod cannot be bound again.
                    Some(pod) if !pod["spec"]["nodeName"].is_null() => status(409, "Conflict"),
                    Some(pod) => {
                        pod["spec"]["nodeName"] = node;
                        let rv: u64 = pod["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        pod["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
                        reply(
                            StatusCode::CREATED,
                            &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                        )
                    }
                    None => status(404, "NotFound"),
                }
            }
            _ => status(404, "NotFound"),
        }
    }

    /// A client whose every request `state` answers.
    pub fn client(state: &Arc<Mutex<State>>) -> kube::Client {
        let shared = Arc::clone(state);
        let service = tower::service_fn(move |req| {
            let state = Arc::clone(&shared);
            async move { Ok::<_, std::convert::Infallible>(handle(state, req).await) }
        });
        kube::Client::new(service, "default")
    }
}

/// Pod `ns/<uid>` as the API stand-in serves it (kind, version and a
/// resourceVersion), with no annotations.
fn api_pod(uid: &str) -> Value {
    let mut pod = slice_pod_json(uid);
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod["metadata"]["resourceVersion"] = json!("20");
    pod
}

/// The API stand-in with node `n1` unlocked and `pod` (named `ns/<uid>`).
fn api_with_free_node(uid: &str, pod: Value) -> std::sync::Arc<tokio::sync::Mutex<api::State>> {
    std::sync::Arc::new(tokio::sync::Mutex::new(api::State {
        node: json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "5", "annotations": {}}}),
        pods: [(format!("ns/{uid}"), pod)].into_iter().collect(),
        log: Vec::new(),
    }))
}

/// The API as a bind finds it: node `n1` locked by `ns/holder` (taken
/// `lock_age` seconds ago), the holder `Pending` with `bind-phase:
/// allocating` since `bind_age` seconds and bound to `holder_node`, and the
/// pod `ns/a` to bind, with no annotations.
fn api_with_holder(
    lock_age: i64,
    bind_age: i64,
    holder_node: Option<&str>,
) -> std::sync::Arc<tokio::sync::Mutex<api::State>> {
    let now = scheduler_webhook::clock::now_unix();
    let lock = proto::hami::node_lock::NodeLock::acquired_at(now - lock_age, "ns", "holder")
        .unwrap()
        .to_string();
    let holder = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "namespace": "ns", "uid": "holder", "resourceVersion": "10",
            "annotations": {keys::BIND_PHASE: "allocating", keys::BIND_TIME: (now - bind_age).to_string()}},
        "spec": {"containers": [{"name": "c"}], "nodeName": holder_node},
        "status": {"phase": "Pending"}});
    let a = api_pod("a");
    std::sync::Arc::new(tokio::sync::Mutex::new(api::State {
        node: json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "5", "annotations": {keys::NODE_LOCK: lock}}}),
        pods: [("ns/holder".to_owned(), holder), ("ns/a".to_owned(), a)]
            .into_iter()
            .collect(),
        log: Vec::new(),
    }))
}

async fn filtered_to_n1(uid: &str) -> ModelHandle {
    let handle = model();
    mark_listed(&handle, &[Kind::Nodes, Kind::Pods, Kind::Quotas]).await;
    apply(&handle, node("n1", 1)).await;
    let placed = handle
        .filter(slice_pod(uid), candidates(&["n1"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&placed), Some("n1"), "{placed:?}");
    handle
}

/// A node locked by a live holder (bound here, allocating, just now) that
/// never lets go: the bind gives up after its wait with an error naming the
/// node and the holder, and leaves nothing half-done: the pod is not bound
/// and carries no allocation annotation, the holder and its lock are
/// untouched, and the reservation is released.
#[tokio::test(start_paused = true)]
async fn a_bind_behind_a_live_holder_times_out_naming_node_and_holder_and_writes_nothing() {
    use scheduler_webhook::extender::bind::{BindFailure, bind_within};
    let handle = filtered_to_n1("a").await;
    let state = api_with_holder(0, 0, Some("n1"));
    let lock_before = state.lock().await.node["metadata"]["annotations"][keys::NODE_LOCK].clone();
    let wait = std::time::Duration::from_secs(3);
    let started = Instant::now();
    let err = bind_within(&api::client(&state), &handle, &binding("a", "n1"), wait)
        .await
        .unwrap_err();
    // Paused clock: the virtual time the wait's sleeps advanced.
    assert!(started.elapsed() >= wait, "it waited its bound");
    assert!(
        matches!(&err, BindFailure::LockTimeout { node, holder, .. } if node == "n1" && holder == "ns/holder"),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("n1") && message.contains("ns/holder"),
        "{message}"
    );

    let s = state.lock().await;
    let a = &s.pods["ns/a"];
    assert!(a["spec"]["nodeName"].is_null(), "not bound: {a}");
    let annotations = a["metadata"]["annotations"].as_object();
    assert!(
        annotations.is_none_or(|m| !m
            .keys()
            .any(|k| k.starts_with("hami.io/") || k.starts_with("gpuslice.io/"))),
        "no allocation annotation: {a}"
    );
    assert!(
        !s.log.iter().any(|r| r.ends_with("/binding")
            || r == "PATCH /api/v1/nodes/n1"
            || r == "PATCH /api/v1/namespaces/ns/pods/holder"),
        "no binding, no lock write, the holder untouched: {:?}",
        s.log
    );
    assert_eq!(
        s.node["metadata"]["annotations"][keys::NODE_LOCK],
        lock_before
    );
    // A lock this young is waited on, its holder's pod never read.
    assert!(
        !s.log.iter().any(|r| r == HOLDER_READ),
        "the young lock's holder was not read: {:?}",
        s.log
    );
    drop(s);
    assert!(
        handle.decision("a").await.unwrap().is_none(),
        "the reservation was released"
    );
}

/// What reading the holder's pod looks like in the API's log.
const HOLDER_READ: &str = "GET /api/v1/namespaces/ns/pods/holder";

/// A holder whose pod was deleted while it held a young lock never
/// releases it: once the lock is old enough to read its holder
/// (`HOLDER_READ_AGE_SECS`, by the wall clock the lock's timestamp is in),
/// the bind finds the pod gone and takes the lock.
#[tokio::test]
async fn a_young_lock_of_a_deleted_holder_is_taken_once_old_enough_to_read_its_holder() {
    use scheduler_webhook::extender::bind::bind_within;
    let handle = filtered_to_n1("a").await;
    let state = api_with_holder(0, 0, Some("n1"));
    state.lock().await.pods.remove("ns/holder");
    bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::from_secs(20),
    )
    .await
    .unwrap();
    let s = state.lock().await;
    let read = s
        .log
        .iter()
        .position(|r| r == HOLDER_READ)
        .expect("the holder was read");
    let lock = s
        .log
        .iter()
        .position(|r| r == "PATCH /api/v1/nodes/n1")
        .expect("the lock was taken");
    assert!(read < lock, "read before the lock was taken: {:?}", s.log);
    assert_eq!(s.pods["ns/a"]["spec"]["nodeName"], "n1");
}

/// A lock dated ahead of this clock (another scheduler's clock skew) is not
/// "young": its holder is read at once, and a gone holder's lock is taken
/// without waiting.
#[tokio::test]
async fn a_future_dated_lock_of_a_deleted_holder_is_taken_at_once() {
    use scheduler_webhook::extender::bind::bind_within;
    let handle = filtered_to_n1("a").await;
    let state = api_with_holder(-60, -60, Some("n1"));
    state.lock().await.pods.remove("ns/holder");
    bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    let s = state.lock().await;
    assert!(s.log.iter().any(|r| r == HOLDER_READ), "{:?}", s.log);
    assert_eq!(s.pods["ns/a"]["spec"]["nodeName"], "n1");
}

/// A holder that was never bound (its binder stopped between the
/// annotations and `pods/binding`) is marked abandoned once the grace since
/// its bind has passed — `bind-phase=failed` and the node named, guarded by
/// its resourceVersion — and only then is its lock taken; the bind goes on.
#[tokio::test]
async fn an_unbound_stuck_holder_is_marked_abandoned_before_its_lock_is_taken() {
    use scheduler_webhook::extender::bind::bind_within;
    use scheduler_webhook::extender::lock::UNBOUND_GRACE_SECS;
    let handle = filtered_to_n1("a").await;
    let state = api_with_holder(UNBOUND_GRACE_SECS, UNBOUND_GRACE_SECS, None);
    bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    let s = state.lock().await;
    let holder = &s.pods["ns/holder"]["metadata"]["annotations"];
    assert_eq!(holder[keys::BIND_PHASE], "failed");
    assert_eq!(holder[keys::BIND_ABANDONED], "n1");
    let mark = s
        .log
        .iter()
        .position(|r| r == "PATCH /api/v1/namespaces/ns/pods/holder")
        .expect("the holder was marked");
    let lock = s
        .log
        .iter()
        .position(|r| r == "PATCH /api/v1/nodes/n1")
        .expect("the lock was taken");
    assert!(mark < lock, "marked before the lock was taken: {:?}", s.log);
    assert_eq!(s.pods["ns/a"]["spec"]["nodeName"], "n1");
}

/// A holder bound to the node and allocating keeps it until HAMi's expiry,
/// however long ago it was bound: no sooner takeover (its Allocate may still
/// come, and would be refused with the new holder's).
#[tokio::test(start_paused = true)]
async fn a_bound_holder_keeps_the_node_until_the_lock_expires() {
    use scheduler_webhook::extender::bind::{BindFailure, bind_within};
    use scheduler_webhook::extender::lock::UNBOUND_GRACE_SECS;
    let handle = filtered_to_n1("a").await;
    let state = api_with_holder(4 * UNBOUND_GRACE_SECS, 4 * UNBOUND_GRACE_SECS, Some("n1"));
    let err = bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, BindFailure::LockTimeout { .. }), "{err}");
    let s = state.lock().await;
    assert_eq!(
        s.pods["ns/holder"]["metadata"]["annotations"][keys::BIND_PHASE],
        "allocating"
    );
    assert!(
        s.log.iter().any(|r| r == HOLDER_READ),
        "an old lock's holder is read: {:?}",
        s.log
    );
}

/// A pod placed on a GPU in `mig` mode is bound with the instance its
/// filter chose, in HAMi's `hami.io/vgpu-mig-allocations` format, in the
/// same patch as the other allocation annotations; a pod on a `hami-core`
/// kube-scheduler gave up on a bind (its extender timeout) and placed the
/// pod again, but the first bind landed meanwhile: the second bind finds
/// the pod bound and writes nothing, so the annotations stay those of the
/// node the pod is on (clearing or replacing them left a bound pod its
/// node-daemon could not allocate, and the node locked, in the
/// kube-scheduler bench).
#[tokio::test]
async fn a_bind_of_a_pod_already_bound_elsewhere_writes_nothing() {
    use scheduler_webhook::extender::bind::{BindFailure, bind_within};
    let handle = filtered_to_n1("a");
    let handle = handle.await;
    let mut a = api_pod("a");
    a["metadata"]["annotations"] = json!({
        keys::VGPU_NODE: "n2",
        keys::BIND_TIME: "1760929622",
        keys::VGPU_DEVICES_ALLOCATED: "GPU-n2-0,NVIDIA,2000,0:;",
    });
    a["spec"]["nodeName"] = json!("n2");
    let before = a.clone();
    let state = api_with_free_node("a", a);
    let err = bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::ZERO,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, BindFailure::AlreadyBound(n) if n == "n2"),
        "{err}"
    );
    let s = state.lock().await;
    assert_eq!(s.pods["ns/a"], before, "the pod is untouched");
    assert!(
        s.node["metadata"]["annotations"]
            .get(keys::NODE_LOCK)
            .is_none(),
        "no lock taken: {}",
        s.node
    );
    assert!(
        !s.log
            .iter()
            .any(|r| r.starts_with("PATCH") || r.starts_with("POST")),
        "nothing written: {:?}",
        s.log
    );
    drop(s);
    assert!(
        handle.decision("a").await.unwrap().is_none(),
        "the reservation was released"
    );
}

/// GPU carries none.
#[tokio::test]
async fn a_bind_on_a_mig_gpu_writes_the_chosen_instance_with_the_other_annotations() {
    use scheduler_webhook::extender::bind::bind_within;
    let mut mig_node = node("n1", 1);
    let device = NodeDevice {
        id: "GPU-n1-0".into(),
        index: 0,
        count: 7,
        devmem: 40960,
        devcore: 100,
        device_type: "NVIDIA A100-SXM4-40GB".into(),
        numa: 0,
        mode: "mig".into(),
        health: true,
        mig_profiles: proto::hami::mig::known_profiles("NVIDIA A100-SXM4-40GB").unwrap(),
    };
    mig_node.metadata.annotations = Some(
        [(
            keys::NODE_NVIDIA_REGISTER.to_owned(),
            register::encode_json(&[device]).unwrap(),
        )]
        .into(),
    );
    let handle = model();
    mark_listed(&handle, &[Kind::Nodes, Kind::Pods, Kind::Quotas]).await;
    apply(&handle, mig_node).await;
    // slice_pod asks 2000 MiB: the smallest profile, 1g.5gb, from the top.
    let placed = handle
        .filter(slice_pod("a"), candidates(&["n1"]))
        .await
        .unwrap();
    assert_eq!(placed_on(&placed), Some("n1"), "{placed:?}");
    let state = api_with_free_node("a", api_pod("a"));
    bind_within(
        &api::client(&state),
        &handle,
        &binding("a", "n1"),
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    let s = state.lock().await;
    let annotations = &s.pods["ns/a"]["metadata"]["annotations"];
    assert_eq!(
        annotations[keys::VGPU_MIG_ALLOCATIONS],
        r#"[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"1g.5gb","placement":{"start":6,"size":1}}]"#
    );
    assert_eq!(
        annotations[keys::VGPU_DEVICES_ALLOCATED],
        "GPU-n1-0,NVIDIA,5120,14:;"
    );
    let annotating = s
        .log
        .iter()
        .filter(|r| *r == "PATCH /api/v1/namespaces/ns/pods/a")
        .count();
    assert_eq!(annotating, 1, "one patch: {:?}", s.log);
    drop(s);

    // On a hami-core GPU: no MIG annotation.
    let handle = filtered_to_n1("b").await;
    let state = api_with_free_node("b", api_pod("b"));
    bind_within(
        &api::client(&state),
        &handle,
        &binding("b", "n1"),
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    let s = state.lock().await;
    let annotations = &s.pods["ns/b"]["metadata"]["annotations"];
    assert!(
        annotations.get(keys::VGPU_MIG_ALLOCATIONS).is_none(),
        "{annotations}"
    );
    assert_eq!(annotations[keys::BIND_PHASE], "allocating");
}

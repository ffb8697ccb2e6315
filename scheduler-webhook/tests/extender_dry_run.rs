//! `/filter` with `Nodes` (Cluster Autoscaler's simulation, possibly of a
//! template node that does not exist yet) is a dry run: the pod is checked
//! against those Node objects, nothing is reserved, written or emitted, and
//! the nodes that pass come back in `Nodes`, as HAMi answers it.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use actix_web::{App, test};
use k8s_openapi::api::core::v1::Node;
use proto::hami::keys;
use proto::hami::register::{self, NodeDevice};
use scheduler_webhook::cache::model::{ClusterModel, ModelConfig};
use scheduler_webhook::cache::owner::{self, Command, Kind, ModelHandle};
use scheduler_webhook::core::policy::SchedulerConfig;
use scheduler_webhook::core::request::RequestConfig;
use scheduler_webhook::events::EventSink;
use scheduler_webhook::extender::handler::{ExtenderState, configure};
use scheduler_webhook::metrics::Metrics;
use serde_json::{Value, json};

/// A listed model with one real node `n1` (one 16 GiB GPU).
async fn listed_model() -> ModelHandle {
    let handle = owner::spawn(ClusterModel::new(ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 1,
    }));
    for kind in [Kind::Nodes, Kind::Pods, Kind::Quotas] {
        handle.send(Command::RelistStarted(kind)).await.unwrap();
        if kind == Kind::Nodes {
            let n1: Node = serde_json::from_value(node_json("n1", 1, 16384)).unwrap();
            handle.send(Command::ApplyNode(Box::new(n1))).await.unwrap();
        }
        handle.send(Command::RelistDone(kind)).await.unwrap();
    }
    handle.wait_ready().await.unwrap();
    handle
}

/// A Node object as the node-daemon publishes it, or as Cluster Autoscaler
/// copies it into a template: `gpus` GPUs of `mem` MiB, allocatable set.
fn node_json(name: &str, gpus: u32, mem: u32) -> Value {
    let devices: Vec<NodeDevice> = (0..gpus)
        .map(|i| NodeDevice {
            id: format!("GPU-{name}-{i}"),
            index: i,
            count: 10,
            devmem: mem,
            devcore: 100,
            device_type: "NVIDIA-Tesla T4".into(),
            numa: 0,
            mode: "hami-core".into(),
            health: true,
            mig_profiles: Vec::new(),
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": "on"},
                     "annotations": {keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()}},
        "status": {"allocatable": {"nvidia.com/gpu": (gpus * 10).to_string(), "cpu": "8"}}
    })
}

fn pod_json(uid: &str, mem: u32) -> Value {
    json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": "10"}}}]}
    })
}

fn state(model: ModelHandle) -> ExtenderState {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    ExtenderState {
        model,
        // Never reached: a dry run makes no API call, and a bind without
        // a decision fails before any.
        client: kube::Client::try_from(config).unwrap(),
        metrics: Arc::new(Metrics::new()),
        events: EventSink::disabled(),
    }
}

/// POSTs `body` as JSON to `uri`; the status and the JSON reply.
macro_rules! post {
    ($app:expr, $uri:expr, $body:expr $(,)?) => {{
        let request = test::TestRequest::post()
            .uri($uri)
            .set_json($body)
            .to_request();
        let response = test::call_service($app, request).await;
        let status = response.status().as_u16();
        let body: Value = test::read_body_json(response).await;
        (status, body)
    }};
}

fn item_names(answer: &Value) -> Vec<&str> {
    answer["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect()
}

#[actix_web::test]
async fn a_template_node_passes_without_a_reservation_a_write_or_usage() {
    let handle = listed_model().await;
    let app =
        test::init_service(App::new().configure(|c| configure(c, state(handle.clone())))).await;
    let before = handle.snapshot().await.unwrap();
    let template = node_json("template-node-for-pool-a-1234", 1, 16384);
    let args = json!({"Pod": pod_json("p", 16000), "Nodes": {"items": [template.clone()]}, "NodeNames": null});
    let (status, answer) = post!(&app, "/filter", &args);
    assert_eq!(status, 200);
    assert_eq!(answer["Error"], "", "{answer}");
    assert_eq!(item_names(&answer), ["template-node-for-pool-a-1234"]);
    assert_eq!(answer["Nodes"]["items"][0], template, "echoed as sent");
    assert!(answer["NodeNames"].is_null(), "{answer}");
    assert_eq!(answer["FailedNodes"], json!({}));

    // Nothing for a bind to find, and nothing held.
    assert!(handle.decision("p").await.unwrap().is_none());
    let bind = json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "p",
                      "Node": "template-node-for-pool-a-1234"});
    let (status, answer) = post!(&app, "/bind", &bind);
    assert_eq!(status, 200);
    assert!(
        answer["Error"]
            .as_str()
            .unwrap()
            .contains("has no filter decision"),
        "{answer}"
    );
    assert_eq!(handle.snapshot().await.unwrap(), before);
    // The real node is still whole for the live path.
    let (_, live) = post!(
        &app,
        "/filter",
        &json!({"Pod": pod_json("p", 16000), "NodeNames": ["n1"]}),
    );
    assert_eq!(live["NodeNames"], json!(["n1"]), "{live}");
}

#[actix_web::test]
async fn a_template_too_small_fails_with_hamis_reason_and_no_gpu_pods_pass_every_node() {
    let handle = listed_model().await;
    let app = test::init_service(App::new().configure(|c| configure(c, state(handle)))).await;
    let args = json!({"Pod": pod_json("p", 2000), "Nodes": {"items": [
        node_json("tmpl-small", 2, 1000), node_json("tmpl-big", 1, 16384)]}});
    let (status, answer) = post!(&app, "/filter", &args);
    assert_eq!(status, 200);
    assert_eq!(item_names(&answer), ["tmpl-big"]);
    assert_eq!(
        answer["FailedNodes"],
        json!({"tmpl-small": "2/2 CardInsufficientMemory"})
    );

    let plain = json!({"metadata": {"name": "plain", "namespace": "ns", "uid": "plain"},
                       "spec": {"containers": [{"name": "c"}]}});
    let args =
        json!({"Pod": plain, "Nodes": {"items": [node_json("a", 0, 0), node_json("b", 1, 1)]}});
    let (_, answer) = post!(&app, "/filter", &args);
    assert_eq!(item_names(&answer), ["a", "b"], "{answer}");
}

#[actix_web::test]
async fn a_malformed_node_object_is_a_clear_error() {
    let handle = listed_model().await;
    let app = test::init_service(App::new().configure(|c| configure(c, state(handle)))).await;
    // A Node whose annotations are not a map: a request, with a bad node.
    let bad = json!({"metadata": {"name": "tmpl", "annotations": "oops"}});
    let args =
        json!({"Pod": pod_json("p", 2000), "Nodes": {"items": [node_json("ok", 1, 16384), bad]}});
    let (status, answer) = post!(&app, "/filter", &args);
    assert_eq!(status, 200);
    let error = answer["Error"].as_str().unwrap();
    assert!(
        error.starts_with(r#"Nodes: node "tmpl" is not a valid Node object: "#),
        "{error}"
    );
    assert!(answer["Nodes"].is_null(), "no node offered: {answer}");
    // An item without a name is not a request at all.
    let args = json!({"Pod": pod_json("p", 2000), "Nodes": {"items": [{"metadata": {}}]}});
    let (status, answer) = post!(&app, "/filter", &args);
    assert_eq!(status, 400);
    assert_eq!(
        answer["Error"], "field Nodes: item 0 has no metadata.name",
        "{answer}"
    );
}

//! The leader's handshake pass against the fake kube-apiserver: it reads
//! the GPU nodes from the model's watch cache, never LISTs nodes, and
//! patches only the nodes whose `hami.io/node-handshake` must change. A
//! replica that does not lead writes nothing.

// Test helpers outside #[test] fns: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::SystemTime;

use integration::fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use proto::hami::handshake::Handshake;
use proto::hami::keys;
use proto::hami::register::{self, NodeDevice};
use scheduler_webhook::cache::model::{ClusterModel, ModelConfig};
use scheduler_webhook::cache::owner::{self, Command, Kind, ModelHandle};
use scheduler_webhook::clock::unix_seconds;
use scheduler_webhook::core::policy::SchedulerConfig;
use scheduler_webhook::core::request::RequestConfig;
use scheduler_webhook::handshake::pass;
use serde_json::{Value, json};

const LEASE: &str = "gpuslice-scheduler";

fn now() -> i64 {
    unix_seconds(SystemTime::now())
}

fn register() -> String {
    let device = NodeDevice {
        id: "GPU-0".into(),
        index: 0,
        count: 10,
        devmem: 16384,
        devcore: 100,
        device_type: "NVIDIA-Tesla T4".into(),
        numa: 0,
        mode: "hami-core".into(),
        health: true,
        mig_profiles: Vec::new(),
    };
    register::encode_json(&[device]).unwrap()
}

/// A node with the given annotations and allocatable `nvidia.com/gpu`.
fn node(name: &str, annotations: Value, gpus: Option<&str>) -> Node {
    let allocatable = gpus.map_or(json!({}), |g| json!({"nvidia.com/gpu": g}));
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": allocatable}
    }))
    .unwrap()
}

fn lease(holder: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "kube-system"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 60,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now()),
        }
    }))
    .unwrap()
}

/// A model that has listed nodes, pods and quotas, with these nodes.
async fn model_with(nodes: &[Node]) -> ModelHandle {
    let model = owner::spawn(ClusterModel::new(ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 1,
    }));
    for kind in [Kind::Nodes, Kind::Pods, Kind::Quotas] {
        model.send(Command::RelistStarted(kind)).await.unwrap();
        if kind == Kind::Nodes {
            for n in nodes {
                model
                    .send(Command::ApplyNode(Box::new(n.clone())))
                    .await
                    .unwrap();
            }
        }
        model.send(Command::RelistDone(kind)).await.unwrap();
    }
    model.wait_ready().await.unwrap();
    model
}

fn handshake_of(node: &Node) -> Option<Handshake> {
    node.metadata
        .annotations
        .as_ref()?
        .get(keys::NODE_HANDSHAKE)?
        .parse()
        .ok()
}

#[tokio::test]
async fn the_leader_writes_only_stale_handshakes_and_never_lists_nodes() {
    let server = FakeApiServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    leases
        .create(&PostParams::default(), &lease("me_1234"))
        .await
        .unwrap();
    let fresh = Handshake::requesting_at(now()).unwrap().to_string();
    let expired = Handshake::requesting_at(now() - 600).unwrap().to_string();
    let all = [
        // Registered, never stamped: requested.
        node(
            "new",
            json!({keys::NODE_NVIDIA_REGISTER: register()}),
            Some("1"),
        ),
        // Stamped a moment ago: left alone.
        node(
            "fresh",
            json!({keys::NODE_NVIDIA_REGISTER: register(), keys::NODE_HANDSHAKE: fresh}),
            Some("1"),
        ),
        // Stamped long ago and its device plugin advertises nothing: unhealthy.
        node(
            "dead",
            json!({keys::NODE_NVIDIA_REGISTER: register(), keys::NODE_HANDSHAKE: expired}),
            Some("0"),
        ),
        // Not a GPU node: never touched.
        node("cpu", json!({}), None),
    ];
    for n in &all {
        nodes.create(&PostParams::default(), n).await.unwrap();
    }
    let model = model_with(&all).await;
    let before = server.requests().len();

    // Another replica's kube-scheduler leads: nothing is written.
    assert!(
        pass(&leases, &nodes, &model, LEASE, "other")
            .await
            .is_empty()
    );

    let mut written = pass(&leases, &nodes, &model, LEASE, "me").await;
    written.sort();
    assert_eq!(written, ["dead", "new"]);
    let requests = server.requests()[before..].to_vec();
    assert!(
        !requests
            .iter()
            .any(|r| r.method == "GET" && r.path == "/api/v1/nodes"),
        "the pass read the watch cache, not a LIST: {requests:?}"
    );
    let patches: Vec<&str> = requests
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert!(matches!(
        handshake_of(&nodes.get("new").await.unwrap()),
        Some(h @ Handshake::Requesting(_)) if h.is_fresh_request(now())
    ));
    assert!(matches!(
        handshake_of(&nodes.get("dead").await.unwrap()),
        Some(Handshake::Deleted(_))
    ));
    assert!(handshake_of(&nodes.get("cpu").await.unwrap()).is_none());

    // Once the watch delivers what was written, the next pass has nothing to do.
    let mut updated = Vec::new();
    for name in ["new", "fresh", "dead", "cpu"] {
        updated.push(nodes.get(name).await.unwrap());
    }
    let model = model_with(&updated).await;
    assert!(pass(&leases, &nodes, &model, LEASE, "me").await.is_empty());
}

//! `kubectl-gpuslice` run as a user runs it, against a running cluster
//! (the integration harness: gpuslice's scheduler and node daemons, on the
//! control plane `GPUSLICE_CONTROL_PLANE` names) and against a cluster
//! whose annotations HAMi wrote (the fake API server with HAMi-format
//! objects and no gpuslice at all).

// Test helpers outside #[test] fns: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind};
use integration::fake_apiserver::FakeApiServer;
use integration::harness::{wait_for_pod, wait_for_pod_events};
use integration::workload::gpu_pod;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);

/// Runs the plugin; `(exit success, stdout, stderr)`. It blocks its
/// thread, so the tests run on a multi-threaded runtime: the fake API
/// server keeps answering on the other worker.
fn plugin(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuslice"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(kubeconfig: &Path, args: &[&str]) -> Value {
    let (ok, stdout, stderr) = plugin(kubeconfig, args);
    assert!(ok, "{args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_why_against_a_running_gpuslice_cluster() {
    let cluster = Cluster::start(ClusterSpec {
        nodes: 1,
        gpus_per_node: 2,
        control_plane: ControlPlaneKind::from_env(),
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    let client = cluster.client().await.unwrap();
    cluster
        .create_pod(&gpu_pod(
            "fits",
            &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
        ))
        .await
        .unwrap();
    cluster
        .create_pod(&gpu_pod(
            "too-big",
            &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000000"}),
        ))
        .await
        .unwrap();
    wait_for_pod(&client, "default", "fits", DEADLINE, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await
    .unwrap();
    wait_for_pod_events(&client, "default", "too-big", DEADLINE, |events| {
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("FilteringFailed"))
    })
    .await
    .unwrap();
    let kubeconfig = cluster.kubeconfig.clone();

    let gpus = json_of(&kubeconfig, &["top", "gpus", "-o", "json"]);
    let gpus = gpus.as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    let held: Vec<&Value> = gpus
        .iter()
        .filter(|g| !g["holders"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["holders"][0]["name"], "fits");
    assert_eq!(held[0]["used_memory_mib"], 3000);
    assert_eq!(held[0]["used_cores"], 30);

    let (ok, table, _) = plugin(&kubeconfig, &["top", "gpus"]);
    assert!(ok);
    assert!(table.starts_with("NODE"), "{table}");
    assert!(table.contains("default/fits (3000 MiB, 30%)"), "{table}");

    let (ok, nodes, _) = plugin(&kubeconfig, &["top", "nodes"]);
    assert!(ok);
    assert!(nodes.contains("3000/"), "{nodes}");

    let pods = json_of(&kubeconfig, &["top", "pods", "-A", "-o", "json"]);
    let names: Vec<&str> = pods
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"fits") && names.contains(&"too-big"),
        "{names:?}"
    );

    let (ok, why, stderr) = plugin(&kubeconfig, &["why", "too-big"]);
    assert!(ok, "{stderr}");
    assert!(why.contains("is not placed"), "{why}");
    assert!(why.contains("1 node(s): CardInsufficientMemory"), "{why}");

    let (ok, why, _) = plugin(&kubeconfig, &["why", "fits", "-o", "yaml"]);
    assert!(ok);
    let why: Value = serde_saphyr::from_str(&why).unwrap();
    assert_eq!(why["state"], "bound");
    assert_eq!(why["slices"][0]["memory_mib"], 3000);

    let (ok, _, stderr) = plugin(&kubeconfig, &["why", "no-such-pod"]);
    assert!(!ok);
    assert!(
        stderr.contains("pod default/no-such-pod not found"),
        "{stderr}"
    );

    cluster.shutdown().await;
}

/// Objects as HAMi v2 writes them: the JSON register on one node, the
/// legacy colon-separated register on another, allocations and bind
/// phases on pods, and HAMi's filter events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_why_read_a_cluster_scheduled_by_hami() {
    let server = FakeApiServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig_yaml()).unwrap();

    // Before any GPU node exists: a clear error.
    let (ok, _, stderr) = plugin(&kubeconfig, &["top", "gpus"]);
    assert!(!ok);
    assert!(
        stderr.contains("no node in this cluster carries hami.io/node-nvidia-register"),
        "{stderr}"
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let node = |name: &str, register: &str| -> Node {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {
                "hami.io/node-nvidia-register": register,
                "hami.io/node-handshake": "Requesting_2025-10-20 03:06:50"}}}))
        .unwrap()
    };
    nodes
        .create(
            &PostParams::default(),
            &node(
                "gpu-a",
                r#"[{"id":"GPU-aaaa","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":0,"mode":"hami-core","health":true}]"#,
            ),
        )
        .await
        .unwrap();
    nodes
        .create(
            &PostParams::default(),
            &node("gpu-b", "GPU-bbbb,10,16384,100,NVIDIA-Tesla T4,0,false:"),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, annotations: Value| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}]}}))
        .unwrap()
    };
    pods.create(
        &PostParams::default(),
        &pod(
            "trainer",
            json!({"hami.io/vgpu-node": "gpu-a",
                   "hami.io/vgpu-devices-allocated": "GPU-aaaa,NVIDIA,4000,25:;",
                   "hami.io/vgpu-devices-to-allocate": ";",
                   "hami.io/bind-phase": "success",
                   "hami.io/bind-time": "1760929600"}),
        ),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("waiting", json!({})))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client, "default");
    let event: Event = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "waiting.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "waiting", "namespace": "default"},
        "reason": "FilteringFailed", "type": "Warning",
        "message": "no node fits: gpu-a: 1/1 CardInsufficientMemory; gpu-b: 1/1 CardUuidMismatch",
        "lastTimestamp": "2025-10-20T03:07:00Z"}))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();

    let gpus = json_of(&kubeconfig, &["top", "gpus", "-o", "json"]);
    let gpus = gpus.as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["uuid"], "GPU-aaaa");
    assert_eq!(gpus[0]["used_memory_mib"], 4000);
    assert_eq!(gpus[0]["holders"][0]["name"], "trainer");
    assert_eq!(
        gpus[1]["healthy"], false,
        "the legacy register's health field"
    );

    let only_b = json_of(
        &kubeconfig,
        &["top", "gpus", "--node", "gpu-b", "-o", "json"],
    );
    assert_eq!(only_b.as_array().unwrap().len(), 1);

    let (ok, nodes, _) = plugin(&kubeconfig, &["top", "nodes", "-o", "wide"]);
    assert!(ok);
    let b = nodes.lines().find(|l| l.starts_with("gpu-b")).unwrap();
    assert!(
        b.split_whitespace().any(|c| c == "1"),
        "one unhealthy GPU: {b}"
    );

    let (ok, why, _) = plugin(&kubeconfig, &["why", "waiting"]);
    assert!(ok);
    assert!(why.contains("refused 2 node(s)"), "{why}");
    assert!(why.contains("1 node(s): CardInsufficientMemory"), "{why}");
    assert!(why.contains("1 node(s): CardUuidMismatch"), "{why}");

    let (ok, why, _) = plugin(&kubeconfig, &["why", "trainer"]);
    assert!(ok);
    assert!(
        why.contains("is on node gpu-a (bind-phase success)"),
        "{why}"
    );
    assert!(why.contains("4000 MiB, 25% of GPU-aaaa"), "{why}");
}

//! End-to-end: real scheduler-webhook (TLS) and node-daemons with simulated
//! GPUs, against the fake apiserver, fake kube-scheduler and fake kubelets.
//! Every scenario ends with the independent checker.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::time::Duration;

use integration::cluster::{Cluster, ClusterSpec, SCHEDULER_NAME};
use integration::harness::wait_for_pod;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn slice_pod(name: &str, mem: u32, cores: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "cuda", "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()}}}]
        }
    }))
    .unwrap()
}

async fn check_clean(cluster: &Cluster) {
    let (report, _) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "checker: {report:#?}");
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_pod_is_filtered_bound_and_allocated() {
    let cluster = Cluster::start(ClusterSpec {
        nodes: 1,
        gpus_per_node: 2,
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster
        .create_pod(&slice_pod("train-0", 3000, 30))
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    let pod = wait_for_pod(&client, "default", "train-0", DEADLINE, |p| {
        matches!(phase(p), Some("Running" | "Failed"))
    })
    .await
    .unwrap();
    assert_eq!(phase(&pod), Some("Running"), "{:#?}", pod.status);
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations["hami.io/bind-phase"], "success");
    assert_eq!(annotations["hami.io/vgpu-node"], "gpu-node-0");
    assert!(annotations["hami.io/vgpu-devices-allocated"].ends_with(",NVIDIA,3000,30:;"));
    assert_eq!(annotations["hami.io/vgpu-devices-to-allocate"], ";");
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

//! End-to-end: real scheduler-webhook (TLS) and node-daemons with simulated
//! GPUs, against the fake apiserver, fake kube-scheduler and fake kubelets.
//! Every scenario ends with the independent checker.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::time::Duration;

use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind, SCHEDULER_NAME};
use integration::harness::{wait_for_pod, wait_for_pod_events};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
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
        control_plane: ControlPlaneKind::from_env(),
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

/// Waits until the scheduler's `/metrics` shows `line` (polling: what the
/// scheduler's caches hold has no event to await).
async fn wait_for_metric(cluster: &Cluster, line: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let text = cluster.metrics().await.unwrap();
        if text.contains(line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{line} not in /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_quota_admits_pods_until_full_then_denies_or_holds_the_rest() {
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
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "100"}}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    wait_for_metric(
        &cluster,
        r#"hami_resource_quota_limit{namespace="default",quota_name="nvidia.com/gpumem"} 8000"#,
    )
    .await;

    // Two 3000 MiB slices fit the 8000 MiB quota.
    for name in ["train-0", "train-1"] {
        cluster
            .create_pod(&slice_pod(name, 3000, 30))
            .await
            .unwrap();
    }
    for name in ["train-0", "train-1"] {
        let pod = wait_for_pod(&client, "default", name, DEADLINE, |p| {
            matches!(phase(p), Some("Running" | "Failed"))
        })
        .await
        .unwrap();
        assert_eq!(phase(&pod), Some("Running"), "{name}: {:#?}", pod.status);
    }
    wait_for_metric(
        &cluster,
        r#"hami_resource_quota_used{namespace="default",quota_name="nvidia.com/gpumem",limit="8000"} 6000"#,
    )
    .await;

    // A third one asks more than the 2000 MiB left: denied at admission.
    let denied = cluster
        .create_pod(&slice_pod("train-2", 3000, 30))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        denied.contains(
            r#"namespace "default" quota limits.nvidia.com/gpumem: pod asks 3000 MiB, 2000 of 8000 MiB left"#
        ),
        "{denied}"
    );

    // 10 % of a 40960 MiB card is only known once a card is picked: admitted,
    // then held Pending by the filter.
    let mut by_share = slice_pod("by-share", 0, 10);
    let limits = by_share.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap();
    limits.remove("nvidia.com/gpumem");
    limits.insert(
        "nvidia.com/gpumem-percentage".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("10".into()),
    );
    cluster.create_pod(&by_share).await.unwrap();
    wait_for_pod_events(&client, "default", "by-share", DEADLINE, |events| {
        events.iter().any(|e| {
            e.reason.as_deref() == Some("FailedScheduling")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("ResourceQuotaNotFit"))
        })
    })
    .await
    .unwrap();

    // Deleting a pod gives its share back at once: the held pod schedules.
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("train-0", &DeleteParams::default())
        .await
        .unwrap();
    let pod = wait_for_pod(&client, "default", "by-share", DEADLINE, |p| {
        matches!(phase(p), Some("Running" | "Failed"))
    })
    .await
    .unwrap();
    assert_eq!(phase(&pod), Some("Running"), "{:#?}", pod.status);
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fgd_default_places_pods_where_fragmentation_grows_least_without_over_commit() {
    // Two nodes of one card each; slices sized by cores (memory stays below
    // the cores' share, so fragmentation follows the cores).
    let cluster = Cluster::start(ClusterSpec {
        nodes: 2,
        gpus_per_node: 1,
        node_policy: "fgd".to_owned(),
        control_plane: ControlPlaneKind::from_env(),
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    let client = cluster.client().await.unwrap();
    let mut node_of = Vec::new();
    // One at a time, so each placement sees the previous ones.
    for (name, cores) in [("p0", 50), ("p1", 30), ("p2", 20), ("p3", 50)] {
        cluster
            .create_pod(&slice_pod(name, cores * 400, cores))
            .await
            .unwrap();
        let pod = wait_for_pod(&client, "default", name, DEADLINE, |p| {
            matches!(phase(p), Some("Running" | "Failed"))
        })
        .await
        .unwrap();
        assert_eq!(phase(&pod), Some("Running"), "{name}: {:#?}", pod.status);
        let annotations = pod.metadata.annotations.unwrap_or_default();
        node_of.push(annotations["hami.io/vgpu-node"].clone());
    }
    // p1 (30 %) next to p0 (50 %) would leave 20 % idle, a fragment for
    // the 50 % and 30 % pods; on the empty node it leaves 70 %, usable by
    // all. Likewise p2 (20 %) goes where 50 % stays free. Binpack would
    // have stacked both on p0's node.
    assert_ne!(node_of[1], node_of[0], "{node_of:?}");
    assert_eq!(node_of[2], node_of[1], "{node_of:?}");
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

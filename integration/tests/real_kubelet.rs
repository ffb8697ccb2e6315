//! gpuslice on a real Kubernetes node: the real kube-apiserver (which calls
//! our webhook), the real kube-scheduler (which calls our extender's filter
//! and bind), and the real kubelet (`k8s.io/kubernetes` cmd/kubelet, on the
//! Kubernetes project's fake CRI runtime) whose device manager calls
//! `GetPreferredAllocation` and `Allocate` on our node-daemon.
//!
//! The kubelet needs its own mount namespace (see
//! `integration/k8s/try-kubelet/FINDINGS.md`): the test skips, saying why,
//! when `unshare --mount` is not permitted, and when the binaries are not
//! built (a failure instead with `GPUSLICE_REQUIRE_REAL_CONTROL_PLANE` set).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::time::Duration;

use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind, KubeletKind, SCHEDULER_NAME};
use integration::fake_kubelet::ALLOCATIONS_ANNOTATION;
use integration::harness::wait_for_pod;
use integration::real::binaries::{Binaries, kubernetes_version};
use integration::real::kubelet::{mount_namespace_permitted, node_schedulable};
use integration::workload;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use prost::Message as _;
use proto::deviceplugin::v1beta1 as api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Two real kubelets (one mount namespace each). Two GPU slice pods, created through the real apiserver (our webhook
/// routes them to our scheduler), scheduled by the real kube-scheduler
/// through our extender (filter and bind), are admitted by the real kubelet,
/// which calls Allocate on our node-daemon: both end Running, the kubelet's
/// checkpoint holds node-daemon's HAMi-core limits, and the checker is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_slice_pods_run_on_the_real_kubelet() {
    if Binaries::for_test("real_kubelet").is_none() {
        return;
    }
    if let Err(why) = mount_namespace_permitted() {
        eprintln!(
            "SKIPPED real_kubelet: the real kubelet needs a private mount namespace \
             (its device-plugin folder is hard-coded, and its sysctls must not touch the host's), \
             and it is not permitted here: {why}"
        );
        return;
    }
    let (gpus, split) = (2, 4);
    let cluster = Cluster::start(ClusterSpec {
        nodes: 2,
        gpus_per_node: gpus,
        split_count: split,
        control_plane: ControlPlaneKind::Real,
        kubelet: KubeletKind::Real,
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    let (apiserver, scheduler, kubelet) = cluster.control_plane_versions().await;
    assert_eq!(
        (apiserver.as_str(), scheduler.as_str(), kubelet.as_str()),
        (
            kubernetes_version().as_str(),
            kubernetes_version().as_str(),
            kubernetes_version().as_str()
        )
    );

    // The Node is the real kubelet's: it registered it, reports the fake
    // runtime, took the device plugin's count as allocatable, and carries
    // node-daemon's register annotation; kube-controller-manager lifted
    // the not-ready taint.
    let client = cluster.client().await.unwrap();
    for real in &cluster.real_nodes {
        let node = Api::<Node>::all(client.clone())
            .get(&real.name)
            .await
            .unwrap();
        let status = node.status.clone().unwrap();
        let info = status.node_info.unwrap();
        assert_eq!(info.kubelet_version, kubernetes_version());
        assert!(
            info.container_runtime_version.starts_with("fakeRuntime://"),
            "{info:?}"
        );
        assert_eq!(
            status.allocatable.unwrap()["nvidia.com/gpu"].0,
            (gpus * split).to_string()
        );
        assert!(
            status.addresses.unwrap_or_default().is_empty(),
            "nothing may dial the node"
        );
        let register =
            &node.metadata.annotations.clone().unwrap_or_default()["hami.io/node-nvidia-register"];
        let devices: Vec<serde_json::Value> = serde_json::from_str(register).unwrap();
        assert_eq!(devices.len(), gpus as usize, "{register}");
        assert!(node_schedulable(&node), "{:?}", node.spec);
    }

    let limits = [("3000", "30"), ("5000", "50")];
    for (i, (mem, cores)) in limits.iter().enumerate() {
        let pod = workload::gpu_pod(
            &format!("slice-{i}"),
            &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}),
        );
        let created = cluster.create_pod(&pod).await.unwrap();
        assert_eq!(
            created.spec.unwrap().scheduler_name.as_deref(),
            Some(SCHEDULER_NAME),
            "the webhook routed it"
        );
    }
    let mut running = Vec::new();
    for (i, (mem, cores)) in limits.iter().enumerate() {
        let name = format!("slice-{i}");
        let pod = wait_for_pod(&client, "default", &name, DEADLINE, |p| {
            matches!(phase(p), "Running" | "Failed")
        })
        .await
        .unwrap_or_else(|e| {
            let logs: Vec<String> = cluster
                .real_nodes
                .iter()
                .map(|n| n.kubelet.log_tails())
                .collect();
            panic!("{name}: {e}\n{}", logs.join("\n"))
        });
        assert_eq!(phase(&pod), "Running", "{name}: {:#?}", pod.status);
        let a = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            Some(a["hami.io/vgpu-node"].as_str()),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            "bound where our extender placed it"
        );
        assert_eq!(
            a["hami.io/bind-phase"], "success",
            "node-daemon's Allocate finished it"
        );
        assert!(
            a["hami.io/vgpu-devices-allocated"].contains(&format!(",NVIDIA,{mem},{cores}:")),
            "{a:?}"
        );
        running.push((pod, *mem, *cores));
    }

    // Our extender filtered and bound both (kube-scheduler called it).
    let metrics = cluster.metrics().await.unwrap();
    assert!(
        metrics.contains("gpuslice_bind_results_total{result=\"bound\"} 2"),
        "{metrics}"
    );

    // What the kubelet would hand the container: node-daemon's Allocate
    // reply, from the kubelet's own checkpoint.
    for (pod, mem, cores) in &running {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let real = cluster
            .real_nodes
            .iter()
            .find(|n| Some(n.name.as_str()) == node)
            .unwrap();
        let checkpoint = real.kubelet.checkpoint().unwrap().expect("a checkpoint");
        let uid = pod.metadata.uid.as_deref().unwrap();
        let entry = checkpoint
            .data
            .pod_device_entries
            .iter()
            .find(|e| e.pod_uid == uid && e.resource_name == "nvidia.com/gpu")
            .unwrap_or_else(|| panic!("no checkpoint entry for {uid}: {checkpoint:?}"));
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&entry.alloc_resp)
            .unwrap();
        let reply = api::ContainerAllocateResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            reply
                .envs
                .get("CUDA_DEVICE_MEMORY_LIMIT_0")
                .map(String::as_str),
            Some(format!("{mem}m").as_str()),
            "{reply:?}"
        );
        assert_eq!(
            reply.envs.get("CUDA_DEVICE_SM_LIMIT").map(String::as_str),
            Some(*cores),
            "{reply:?}"
        );
    }

    // The checker, with the checkpointed replies as its allocation records.
    let (report, pods) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    let checked = pods
        .iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ALLOCATIONS_ANNOTATION))
        })
        .count();
    assert_eq!(checked, 2, "the checker compared both pods' env");
    cluster.shutdown().await;
}

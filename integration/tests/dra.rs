//! DRA mode end to end on the real control plane (kube-apiserver, etcd,
//! kube-controller-manager with its resource-claim controller, and the
//! cluster's own kube-scheduler, v1.37.2): the chart installed with
//! `mode: dra` (DeviceClass, RBAC), scheduler-webhook `--mode dra` turning GPU
//! limits into claims from shape templates, node-daemon `--mode dra`
//! publishing ResourceSlices and serving the kubelet DRA plugin, and the fake
//! kubelet registering it, preparing each pod's claims and resolving CDI.
//! Each test ends with the checker's DRA reading clean: no GPU's consumed
//! memory or cores over capacity, every container's env equal to its claim's
//! allocation.
//!
//! They run with `GPUSLICE_CONTROL_PLANE=real` (the step of `.ci/run` that
//! runs the end-to-end tests on the real control plane) and skip, saying
//! why, otherwise or when the binaries are not built. No sleeps: every wait is a watch with a generous
//! deadline; nothing asserts on time (the burst prints its figure).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind, Mode};
use integration::harness::{bound_node, wait_for_list};
use integration::real::binaries::Binaries;
use integration::workload;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;

const DEADLINE: Duration = Duration::from_secs(180);
const NS: &str = "default";

fn init_logs() {
    if let Ok(filter) = std::env::var("GPUSLICE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

async fn start(test: &str, nodes: usize, gpus_per_node: u32) -> Option<Cluster> {
    if ControlPlaneKind::from_env() != ControlPlaneKind::Real {
        eprintln!(
            "SKIPPED {test}: DRA mode runs on the real control plane; set {}=real",
            ControlPlaneKind::ENV
        );
        return None;
    }
    Binaries::for_test(test)?;
    init_logs();
    let cluster = Cluster::start(ClusterSpec {
        nodes,
        gpus_per_node,
        control_plane: ControlPlaneKind::Real,
        mode: Mode::Dra,
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    Some(cluster)
}

fn name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

async fn create_all(cluster: &Cluster, pods: &[Pod]) -> Vec<String> {
    let created = join_all(pods.iter().map(|p| cluster.create_pod(p))).await;
    created
        .into_iter()
        .map(|r| r.unwrap().metadata.name.unwrap())
        .collect()
}

async fn wait_running(cluster: &Cluster, names: &[String]) -> Vec<Pod> {
    let client = cluster.client().await.unwrap();
    let result = wait_for_list(
        Api::<Pod>::namespaced(client.clone(), NS),
        watcher::Config::default(),
        "pods running",
        DEADLINE,
        |pods: &[Pod]| {
            names
                .iter()
                .all(|n| pods.iter().any(|p| name(p) == n && phase(p) == "Running"))
        },
    )
    .await;
    match result {
        Ok(pods) => pods
            .into_iter()
            .filter(|p| names.iter().any(|n| n == name(p)))
            .collect(),
        Err(e) => {
            let pods = Api::<Pod>::namespaced(client, NS)
                .list(&ListParams::default())
                .await
                .unwrap();
            let states: Vec<String> = pods
                .items
                .iter()
                .map(|p| format!("{}={}", name(p), phase(p)))
                .collect();
            let logs = cluster
                .real_control_plane()
                .map(|p| p.logs())
                .unwrap_or_default();
            panic!("{e}; pods: {states:?}\n{logs}");
        }
    }
}

async fn check_clean(cluster: &Cluster) {
    let (report, _) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "checker: {report:#?}");
}

fn env(pod: &Pod, container: &str) -> std::collections::BTreeMap<String, String> {
    let records = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(integration::fake_kubelet::ALLOCATIONS_ANNOTATION))
        .expect("the fake kubelet records what each container got");
    let records: Vec<integration::fake_kubelet::ContainerAllocation> =
        serde_json::from_str(records).unwrap();
    records
        .into_iter()
        .find(|r| r.container == container)
        .map(|r| r.reply.envs)
        .unwrap_or_default()
}

/// The demo mix in DRA mode: every pod that fits runs with its claim's
/// HAMi-core env (from the CDI spec node-daemon wrote), the one that
/// cannot fit stays Pending, a deleted pod's claim is unprepared and its
/// capacity comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_mix_runs_in_dra_mode_with_the_cdi_env() {
    let Some(cluster) = start("the_demo_mix_runs_in_dra_mode_with_the_cdi_env", 2, 4).await else {
        return;
    };
    let demo = workload::demo(cluster.spec.gpu_memory_mib);
    let pods: Vec<Pod> = demo.iter().map(|d| d.pod.clone()).collect();
    let names = create_all(&cluster, &pods).await;
    let runnable: Vec<String> = demo
        .iter()
        .zip(&names)
        .filter(|(d, _)| !d.expect_unschedulable)
        .map(|(_, n)| n.clone())
        .collect();
    let running = wait_running(&cluster, &runnable).await;
    assert_eq!(running.len(), runnable.len());

    let client = cluster.client().await.unwrap();
    let templates: Vec<String> = Api::<ResourceClaimTemplate>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|t| t.metadata.name)
        .collect();
    assert!(
        templates.contains(&"gpuslice-1gpu-2000mi-10c".to_owned()),
        "{templates:?}"
    );
    assert!(
        templates.contains(&"gpuslice-2gpu-10000mi-40c".to_owned()),
        "{templates:?}"
    );

    let by_name = |n: &str| running.iter().find(|p| name(p) == n).unwrap();
    let small = env(by_name("notebook-small"), "cuda");
    assert_eq!(small["CUDA_DEVICE_MEMORY_LIMIT_0"], "2000m", "{small:?}");
    assert_eq!(small["CUDA_DEVICE_SM_LIMIT"], "10", "{small:?}");
    let two = env(by_name("train-2gpu"), "cuda");
    let uuids: Vec<&str> = two["NVIDIA_VISIBLE_DEVICES"].split(',').collect();
    assert_eq!(uuids.len(), 2, "{two:?}");
    assert_ne!(uuids[0], uuids[1], "two different GPUs: {two:?}");
    let exclusive = env(by_name("exclusive"), "cuda");
    assert_eq!(exclusive["CUDA_DEVICE_MEMORY_LIMIT_0"], "40960m");
    assert_eq!(exclusive["CUDA_DEVICE_SM_LIMIT"], "100");
    let warm = env(by_name("prepare-and-train"), "warmup");
    assert_eq!(warm["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m", "{warm:?}");

    // The one that cannot fit anywhere stays Pending, unscheduled.
    let too_big = Api::<Pod>::namespaced(client.clone(), NS)
        .get("too-big")
        .await
        .unwrap();
    assert_eq!(phase(&too_big), "Pending");
    assert_eq!(bound_node(&too_big), None);
    check_clean(&cluster).await;

    // Deleting a pod unprepares its claim; the resource-claim controller
    // then deletes the pod's claim.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let uid = by_name("inference-large").metadata.uid.clone().unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("inference-large", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_list(
        claims,
        watcher::Config::default(),
        "inference-large's claim deleted",
        DEADLINE,
        |cs: &[ResourceClaim]| {
            !cs.iter().any(|c| {
                c.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
        },
    )
    .await
    .unwrap();
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// A burst of 40 one-slice pods onto one 8-GPU node in DRA mode: all run,
/// kube-scheduler allocating in-tree, the checker clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_40_slices_onto_one_node_all_run_in_dra_mode() {
    let Some(cluster) = start("burst_of_40_slices_onto_one_node_all_run_in_dra_mode", 1, 8).await
    else {
        return;
    };
    let started = Instant::now();
    let names = create_all(&cluster, &workload::burst(40, cluster.spec.gpu_memory_mib)).await;
    let pods = wait_running(&cluster, &names).await;
    // A figure for the log, not an assertion.
    eprintln!(
        "DRA mode: 40-pod burst running in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(pods.len(), 40);
    assert!(pods.iter().all(|p| bound_node(p) == Some("gpu-node-0")));
    // Each pod's claim was allocated by kube-scheduler with the consumed
    // capacity the template asked (a tenth of the card, 10 % of its cores).
    let client = cluster.client().await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(claims.len(), 40);
    for claim in &claims {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .unwrap();
        assert_eq!(results.len(), 1);
        let consumed = results[0].consumed_capacity.as_ref().unwrap();
        // The API server writes quantities canonically ("4Gi").
        let mib = integration::checker::dra::quantity_mib(&consumed["memory"].0);
        assert_eq!(mib, Some(4096), "{consumed:?}");
        assert_eq!(consumed["cores"].0, "10", "{consumed:?}");
    }
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

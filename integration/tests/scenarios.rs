//! End-to-end scenarios through the real services: the admission webhook and
//! extender (scheduler-webhook over TLS), node-daemons with simulated GPUs,
//! the fake apiserver, kube-scheduler and kubelets. Each scenario ends with
//! the independent checker: no GPU over capacity, every container's limits
//! equal to its annotation, every bound pod allocated (or failed with a
//! reason).
//!
//! No sleeps: every wait is on a condition (watch events) with a generous
//! deadline, since CI runs on two busy cores; nothing asserts on time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use integration::checker;
use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind};
use integration::fake_apiserver::FaultSpec;
use integration::harness::{bound_node, pod_condition, pod_events, wait_for_list};
use integration::workload;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;

/// Deadline of every wait: generous (busy CI), far below HAMi's 5-minute
/// node-lock expiry.
const DEADLINE: Duration = Duration::from_secs(120);
const NS: &str = "default";
const GPU: &str = "nvidia.com/gpu";
const ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
const BIND_PHASE: &str = "hami.io/bind-phase";
const NODE_LOCK: &str = "hami.io/mutex.lock";
const REGISTER: &str = "hami.io/node-nvidia-register";

// ---------------------------------------------------------------- helpers

/// Logs of every service to the test output when `GPUSLICE_TEST_LOG` is
/// set (an `EnvFilter`, e.g. `info` or `node_daemon=debug`).
fn init_logs() {
    if let Ok(filter) = std::env::var("GPUSLICE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// True (after saying so) when the run is on the real control plane and the
/// test injects faults through the fake apiserver, which only it can do.
fn fake_only(test: &str) -> bool {
    let real = ControlPlaneKind::from_env() == ControlPlaneKind::Real;
    if real {
        eprintln!(
            "SKIPPED {test}: injects API faults through the fake apiserver (fake control plane only)"
        );
    }
    real
}

async fn start(nodes: usize, gpus_per_node: u32) -> Cluster {
    init_logs();
    let cluster = Cluster::start(ClusterSpec {
        nodes,
        gpus_per_node,
        control_plane: ControlPlaneKind::from_env(),
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    cluster
}

/// A one-container slice pod (routed to our scheduler by the webhook).
fn slice(name: &str, mem: u32, cores: u32) -> Pod {
    workload::gpu_pod(
        name,
        &json!({GPU: "1", "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()}),
    )
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// GPU UUIDs in the pod's `vgpu-devices-allocated`.
fn pod_gpus(pod: &Pod) -> BTreeSet<String> {
    annotation(pod, ALLOCATED)
        .unwrap_or_default()
        .split([';', ':'])
        .filter_map(|d| d.split(',').next())
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether the scheduler reported the pod unschedulable.
fn unschedulable(pod: &Pod) -> bool {
    bound_node(pod).is_none()
        && pod_condition(pod, "PodScheduled")
            .is_some_and(|(status, reason, _)| status == "False" && reason == "Unschedulable")
}

/// One line per pod, for assertion messages.
fn summary(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            format!(
                "{} {} node={:?} bind-phase={:?} scheduled={:?}",
                name(p),
                phase(p),
                bound_node(p),
                annotation(p, BIND_PHASE),
                pod_condition(p, "PodScheduled"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn list_pods(cluster: &Cluster) -> Vec<Pod> {
    let client = cluster.client().await.unwrap();
    Api::<Pod>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Waits until the pods of the namespace satisfy `condition`.
async fn wait_pods(cluster: &Cluster, what: &str, condition: impl Fn(&[Pod]) -> bool) -> Vec<Pod> {
    let client = cluster.client().await.unwrap();
    match wait_for_list(
        Api::<Pod>::namespaced(client, NS),
        watcher::Config::default(),
        what,
        DEADLINE,
        condition,
    )
    .await
    {
        Ok(pods) => pods,
        Err(e) => panic!("{e}\n{}", summary(&list_pods(cluster).await)),
    }
}

/// Waits until every pod named in `names` is Running, failing at once when
/// one of them failed.
async fn wait_running(cluster: &Cluster, names: &[String]) -> Vec<Pod> {
    let pods = wait_pods(cluster, "pods to run", |pods| {
        let ours: Vec<&Pod> = pods
            .iter()
            .filter(|p| names.iter().any(|n| n == name(p)))
            .collect();
        ours.iter().any(|p| phase(p) == "Failed")
            || (ours.len() == names.len() && ours.iter().all(|p| phase(p) == "Running"))
    })
    .await;
    let failed: Vec<Pod> = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .cloned()
        .collect();
    assert!(
        failed.is_empty(),
        "pods failed: {:#?}",
        failed.iter().map(|p| &p.status).collect::<Vec<_>>()
    );
    pods
}

async fn create_all(cluster: &Cluster, pods: &[Pod]) -> Vec<String> {
    for pod in pods {
        cluster.create_pod(pod).await.unwrap();
    }
    pods.iter().map(|p| name(p).to_owned()).collect()
}

/// Runs the checker over what the API server shows; every finding fails.
async fn check_clean(cluster: &Cluster) -> checker::Report {
    let (report, pods) = cluster.check().await.unwrap();
    assert!(
        report.is_clean(),
        "checker: {report:#?}\n{}",
        summary(&pods)
    );
    report
}

async fn delete_pod(cluster: &Cluster, pod: &str) {
    let client = cluster.client().await.unwrap();
    Api::<Pod>::namespaced(client, NS)
        .delete(pod, &DeleteParams::default())
        .await
        .unwrap();
}

/// Marks a pod finished, as kubelet does when its containers exit 0.
async fn finish_pod(cluster: &Cluster, pod: &str) {
    let client = cluster.client().await.unwrap();
    Api::<Pod>::namespaced(client, NS)
        .patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded", "reason": "Completed"}})),
        )
        .await
        .unwrap();
}

fn event_text(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits for an event about `pod` with `reason` whose message contains `text`.
async fn wait_event(cluster: &Cluster, pod: &str, reason: &str, text: &str) -> Event {
    let client = cluster.client().await.unwrap();
    let found = integration::harness::wait_for_pod_events(&client, NS, pod, DEADLINE, |events| {
        events.iter().any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.message.as_deref().is_some_and(|m| m.contains(text))
        })
    })
    .await;
    match found {
        Ok(events) => events
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(text))
            })
            .unwrap(),
        Err(e) => panic!(
            "{e}\nevents of {pod}:\n{}",
            event_text(&pod_events(&client, NS, pod).await.unwrap_or_default())
        ),
    }
}

/// Waits until node `node`'s register annotation reports GPU `uuid` with
/// `healthy`.
async fn wait_gpu_health(cluster: &Cluster, node: &str, uuid: &str, healthy: bool) {
    let client = cluster.client().await.unwrap();
    let reported = |n: &Node| {
        let Some(value) = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REGISTER))
        else {
            return false;
        };
        let Ok(serde_json::Value::Array(gpus)) = serde_json::from_str(value) else {
            return false;
        };
        gpus.iter().any(|g| {
            g.get("id").and_then(serde_json::Value::as_str) == Some(uuid)
                // HAMi's encoding omits `health` when false (omitempty).
                && g.get("health")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false)
                    == healthy
        })
    };
    let api = Api::<Node>::all(client);
    if let Err(e) =
        integration::harness::wait_for_object(api.clone(), node, DEADLINE, reported).await
    {
        let current = api.get(node).await.unwrap();
        panic!(
            "{e}\nGPU {uuid} never reported healthy={healthy}; register: {:?}",
            current
                .metadata
                .annotations
                .unwrap_or_default()
                .get(REGISTER)
        );
    }
}

// -------------------------------------------------------------- scenarios

/// The demo mix: every pod runs except `too-big`, which stays Pending with
/// the extender's reasons in its event and its PodScheduled condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_mix_runs_and_the_pod_that_fits_nowhere_is_explained() {
    let cluster = start(2, 4).await;
    let demo = workload::demo(cluster.spec.gpu_memory_mib);
    for d in &demo {
        cluster.create_pod(&d.pod).await.unwrap();
    }
    let runnable: Vec<String> = demo
        .iter()
        .filter(|d| !d.expect_unschedulable)
        .map(|d| name(&d.pod).to_owned())
        .collect();
    assert_eq!(runnable.len(), 7);
    let pods = wait_running(&cluster, &runnable).await;

    // The multi-GPU pod holds two different GPUs; the init container pod
    // holds a slice for each container.
    let two = pods.iter().find(|p| name(p) == "train-2gpu").unwrap();
    assert_eq!(pod_gpus(two).len(), 2, "{:?}", annotation(two, ALLOCATED));
    let exclusive = pods.iter().find(|p| name(p) == "exclusive").unwrap();
    assert!(
        annotation(exclusive, ALLOCATED)
            .unwrap()
            .ends_with(",NVIDIA,40960,100:;"),
        "{:?}",
        annotation(exclusive, ALLOCATED)
    );

    let event = wait_event(
        &cluster,
        "too-big",
        "FailedScheduling",
        "CardInsufficientMemory",
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let pods = wait_pods(&cluster, "too-big unschedulable", |pods| {
        pods.iter()
            .any(|p| name(p) == "too-big" && unschedulable(p))
    })
    .await;
    let too_big = pods.iter().find(|p| name(p) == "too-big").unwrap();
    assert_eq!(phase(too_big), "Pending");
    let (_, _, message) = pod_condition(too_big, "PodScheduled").unwrap();
    assert!(
        message.contains("CardInsufficientMemory"),
        "PodScheduled message: {message}"
    );
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// A burst of 40 one-slice pods onto one 8-GPU node: all run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_40_slices_onto_one_node_all_run() {
    let cluster = start(1, 8).await;
    let names = create_all(&cluster, &workload::burst(40, cluster.spec.gpu_memory_mib)).await;
    let pods = wait_running(&cluster, &names).await;
    assert_eq!(pods.len(), 40);
    assert!(pods.iter().all(|p| bound_node(p) == Some("gpu-node-0")));
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// The scheduler-webhook restarts mid-burst: its model is rebuilt from the
/// API server; everything runs, nothing is double-booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_restart_mid_burst_rebuilds_and_never_double_books() {
    let mut cluster = start(1, 8).await;
    let names = create_all(&cluster, &workload::burst(40, cluster.spec.gpu_memory_mib)).await;
    wait_pods(&cluster, "some pods bound", |pods| {
        pods.iter().filter(|p| bound_node(p).is_some()).count() >= 8
    })
    .await;
    cluster.restart_scheduler_webhook().unwrap();
    wait_running(&cluster, &names).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// The node-daemon restarts between bind and Allocate: pods are bound (the
/// kubelet has not admitted them yet), the daemon restarts and rebuilds its
/// ledgers from the pods on the node, then the kubelet admits them against
/// the new daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_daemon_restart_between_bind_and_allocate() {
    let mut cluster = start(1, 2).await;
    let before: Vec<Pod> = (0..3)
        .map(|i| slice(&format!("before-{i}"), 8000, 20))
        .collect();
    let mut names = create_all(&cluster, &before).await;
    wait_running(&cluster, &names).await;

    cluster.pause_node_agent(0).await.unwrap();
    let during: Vec<Pod> = (0..3)
        .map(|i| slice(&format!("during-{i}"), 8000, 20))
        .collect();
    names.extend(create_all(&cluster, &during).await);
    let bound = wait_pods(&cluster, "a pod bound and waiting for Allocate", |pods| {
        pods.iter().any(|p| {
            name(p).starts_with("during-")
                && bound_node(p).is_some()
                && annotation(p, BIND_PHASE) == Some("allocating")
        })
    })
    .await;
    assert!(
        bound
            .iter()
            .filter(|p| name(p).starts_with("during-"))
            .all(|p| phase(p) != "Running"),
        "the kubelet is paused: nothing new may run yet\n{}",
        summary(&bound)
    );

    let registrations = cluster.nodes[0].kubelet.devices().registrations;
    cluster.restart_node_daemon(0).unwrap();
    cluster.nodes[0]
        .kubelet
        .wait_devices(DEADLINE, "the restarted daemon to register", |d| {
            d.registrations > registrations
                && d.connected.contains(GPU)
                && d.devices
                    .get(GPU)
                    .is_some_and(|ids| !ids.is_empty() && ids.iter().all(|(_, healthy)| *healthy))
        })
        .await
        .unwrap();
    cluster.resume_node_agent(0).await.unwrap();

    wait_running(&cluster, &names).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// The kubelet restarts: the plugin registers again, running pods keep
/// their devices, new pods are still allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_plugin_reregisters_and_running_pods_keep_devices() {
    let mut cluster = start(1, 2).await;
    let first: Vec<Pod> = (0..3)
        .map(|i| slice(&format!("first-{i}"), 6000, 20))
        .collect();
    let mut names = create_all(&cluster, &first).await;
    let running = wait_running(&cluster, &names).await;
    let devices_before = cluster.nodes[0].kubelet.devices();
    let uids: Vec<String> = running
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    for uid in &uids {
        assert!(devices_before.allocations.contains_key(uid), "{uid}");
    }
    let allocated_before: BTreeMap<String, Option<String>> = running
        .iter()
        .map(|p| {
            (
                name(p).to_owned(),
                annotation(p, ALLOCATED).map(str::to_owned),
            )
        })
        .collect();

    cluster.nodes[0].kubelet.restart().await.unwrap();
    let after = cluster.nodes[0]
        .kubelet
        .wait_devices(DEADLINE, "the plugin to register again", |d| {
            d.registrations > devices_before.registrations
                && d.connected.contains(GPU)
                && d.devices
                    .get(GPU)
                    .is_some_and(|ids| !ids.is_empty() && ids.iter().all(|(_, healthy)| *healthy))
        })
        .await
        .unwrap();
    for uid in &uids {
        assert_eq!(
            after.allocations.get(uid),
            devices_before.allocations.get(uid),
            "pod {uid} kept its devices"
        );
    }

    let second: Vec<Pod> = (0..3)
        .map(|i| slice(&format!("second-{i}"), 6000, 20))
        .collect();
    names.extend(create_all(&cluster, &second).await);
    let pods = wait_running(&cluster, &names).await;
    for p in pods.iter().filter(|p| name(p).starts_with("first-")) {
        assert_eq!(
            annotation(p, ALLOCATED).map(str::to_owned),
            allocated_before[name(p)],
            "{} kept its allocation",
            name(p)
        );
    }
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// API faults during a burst on the scheduler's write path: 500s on
/// `pods/binding`, 409s and 500s on node (lock) patches, and every watch
/// cut twice; everything still runs and the checker is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_on_bindings_locks_and_watches_during_a_burst_settle_clean() {
    if fake_only("api_faults_on_bindings_locks_and_watches_during_a_burst_settle_clean") {
        return;
    }
    let cluster = start(1, 4).await;
    let api = cluster.fake_api().expect("runs on the fake control plane");
    let pods_path = format!("/api/v1/namespaces/{NS}/pods/");
    // Rules matching the same request are consumed together, so 409s and
    // 500s on the same path come in two rounds.
    api.inject(FaultSpec::fail("POST", &pods_path, 3, 500));
    api.inject(FaultSpec::fail("PATCH", "/api/v1/nodes/", 2, 409));
    let burst = workload::burst(20, cluster.spec.gpu_memory_mib);
    let mut names = create_all(&cluster, &burst[..10]).await;
    api.wait_for(DEADLINE, |s| s.faults_fired >= 5)
        .await
        .unwrap();
    api.cut_watches();
    api.inject(FaultSpec::fail("PATCH", "/api/v1/nodes/", 2, 500));
    names.extend(create_all(&cluster, &burst[10..]).await);
    api.wait_for(DEADLINE, |s| s.faults_fired >= 7)
        .await
        .unwrap();
    api.cut_watches();
    wait_running(&cluster, &names).await;
    assert!(api.stats().watch_cuts >= 2);
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// API faults during a burst on every pod writer: 409s and 500s on pod
/// patches (scheduler, node-daemon and kubelet all patch pods), 500s on
/// `pods/binding`, 409s and 500s on node patches, watches cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_on_pod_patches_during_a_burst_settle_clean() {
    if fake_only("api_faults_on_pod_patches_during_a_burst_settle_clean") {
        return;
    }
    let cluster = start(1, 4).await;
    let api = cluster.fake_api().expect("runs on the fake control plane");
    let pods_path = format!("/api/v1/namespaces/{NS}/pods/");
    // Round 1: pods/binding 500s, pod patch 409s, node (lock) patch 409s,
    // and one 500 on the status write of burst-3 (only the kubelet writes
    // a bound pod's status, so this one deterministically hits it).
    api.inject(FaultSpec::fail("POST", &pods_path, 3, 500));
    api.inject(FaultSpec::fail("PATCH", &pods_path, 3, 409));
    api.inject(FaultSpec::fail("PATCH", "/api/v1/nodes/", 2, 409));
    let status_of_3 = format!("{pods_path}burst-3/status");
    api.inject(FaultSpec::fail("PATCH", &status_of_3, 1, 500));
    let burst = workload::burst(20, cluster.spec.gpu_memory_mib);
    let mut names = create_all(&cluster, &burst[..10]).await;
    api.wait_for(DEADLINE, |s| s.faults_fired >= 9)
        .await
        .unwrap();
    api.cut_watches();
    // Round 2: pod patch and node patch 500s, while more pods arrive.
    api.inject(FaultSpec::fail("PATCH", &pods_path, 3, 500));
    api.inject(FaultSpec::fail("PATCH", "/api/v1/nodes/", 1, 500));
    names.extend(create_all(&cluster, &burst[10..]).await);
    api.wait_for(DEADLINE, |s| s.faults_fired >= 13)
        .await
        .unwrap();
    api.cut_watches();
    wait_running(&cluster, &names).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// Binds pod `pod` while the kubelet is paused, injects `fault` (applied
/// to the next matching request), then lets the kubelet admit it.
async fn admit_with_fault(cluster: &mut Cluster, pod: &str, fault: FaultSpec) {
    cluster.pause_node_agent(0).await.unwrap();
    cluster.create_pod(&slice(pod, 4000, 10)).await.unwrap();
    wait_pods(cluster, "bound, waiting for Allocate", |pods| {
        pods.iter().any(|p| {
            name(p) == pod
                && bound_node(p).is_some()
                && annotation(p, BIND_PHASE) == Some("allocating")
        })
    })
    .await;
    cluster
        .fake_api()
        .expect("runs on the fake control plane")
        .inject(fault);
    cluster.resume_node_agent(0).await.unwrap();
}

/// One 500 on node-daemon's pod patch after Allocate (erasing
/// `vgpu-devices-to-allocate`, `bind-phase=success`) is transient: the pod
/// still runs, and the node is not left locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_api_error_after_allocate_does_not_fail_the_pod() {
    if fake_only("a_transient_api_error_after_allocate_does_not_fail_the_pod") {
        return;
    }
    let mut cluster = start(1, 2).await;
    // Only node-daemon patches the pod itself between bind and the
    // kubelet's outcome (the kubelet's status write goes to .../status,
    // after Allocate).
    let fault = FaultSpec::fail(
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/pods/solo"),
        1,
        500,
    );
    admit_with_fault(&mut cluster, "solo", fault).await;
    wait_running(&cluster, &["solo".to_owned()]).await;
    let names = create_all(&cluster, &[slice("next", 4000, 10)]).await;
    wait_running(&cluster, &names).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// One 500 on the kubelet's pod status write: kubelet retries its status
/// sync, so the pod ends Running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_api_error_on_the_kubelet_status_write_is_retried() {
    if fake_only("a_transient_api_error_on_the_kubelet_status_write_is_retried") {
        return;
    }
    let mut cluster = start(1, 2).await;
    let fault = FaultSpec::fail(
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/pods/solo/status"),
        1,
        500,
    );
    admit_with_fault(&mut cluster, "solo", fault).await;
    wait_running(&cluster, &["solo".to_owned()]).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// A pod deleted between bind and Allocate: the node lock it held does not
/// block the node; later pods are allocated without waiting for the
/// lock's 5-minute expiry (or for any lock wait at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_between_bind_and_allocate_does_not_block_the_node() {
    let mut cluster = start(1, 2).await;
    cluster.pause_node_agent(0).await.unwrap();
    cluster
        .create_pod(&slice("doomed", 8000, 20))
        .await
        .unwrap();
    wait_pods(&cluster, "doomed bound, waiting for Allocate", |pods| {
        pods.iter().any(|p| {
            name(p) == "doomed"
                && bound_node(p) == Some("gpu-node-0")
                && annotation(p, BIND_PHASE) == Some("allocating")
        })
    })
    .await;
    let client = cluster.client().await.unwrap();
    let node = Api::<Node>::all(client.clone())
        .get("gpu-node-0")
        .await
        .unwrap();
    let lock = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_LOCK))
        .cloned()
        .unwrap_or_default();
    assert!(lock.contains("doomed"), "lock held by doomed: {lock:?}");

    delete_pod(&cluster, "doomed").await;
    cluster.resume_node_agent(0).await.unwrap();
    let later: Vec<Pod> = (0..6)
        .map(|i| slice(&format!("later-{i}"), 4000, 10))
        .collect();
    let names = create_all(&cluster, &later).await;
    wait_running(&cluster, &names).await;

    // Nobody ever waited on (or failed because of) doomed's lock.
    let events = Api::<Event>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let blocked: Vec<&Event> = events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() != Some("doomed"))
        .filter(|e| e.message.as_deref().is_some_and(|m| m.contains("doomed")))
        .collect();
    assert!(
        blocked.is_empty(),
        "later pods were blocked by doomed's lock: {blocked:#?}"
    );
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// A GPU turns unhealthy while pods are pending: they land on the healthy
/// GPU only, the one left waits with `CardNotHealth` among its reasons,
/// and schedules onto the GPU once it is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_turning_unhealthy_with_pods_pending_only_healthy_gpus_are_used() {
    let cluster = start(1, 2).await;
    let node = &cluster.nodes[0];
    let (sick, healthy) = (node.gpu_uuid(0), node.gpu_uuid(1));
    // Each pod needs most of a card: one per GPU.
    let holders: Vec<Pod> = (0..2)
        .map(|i| slice(&format!("holder-{i}"), 30000, 10))
        .collect();
    let holder_names = create_all(&cluster, &holders).await;
    wait_running(&cluster, &holder_names).await;
    let waiting: Vec<Pod> = (0..2)
        .map(|i| slice(&format!("waiting-{i}"), 30000, 10))
        .collect();
    let waiting_names = create_all(&cluster, &waiting).await;
    wait_pods(&cluster, "both waiting pods unschedulable", |pods| {
        pods.iter()
            .filter(|p| name(p).starts_with("waiting-") && unschedulable(p))
            .count()
            == 2
    })
    .await;

    assert!(node.set_gpu_health(&sick, false), "the daemon listens");
    wait_gpu_health(&cluster, &node.name, &sick, false).await;
    for holder in &holder_names {
        delete_pod(&cluster, holder).await;
    }
    let pods = wait_pods(&cluster, "one waiting pod runs", |pods| {
        pods.iter()
            .any(|p| name(p).starts_with("waiting-") && phase(p) == "Running")
    })
    .await;
    let ran: Vec<&Pod> = pods
        .iter()
        .filter(|p| name(p).starts_with("waiting-") && bound_node(p).is_some())
        .collect();
    assert_eq!(ran.len(), 1, "{}", summary(&pods));
    assert_eq!(pod_gpus(ran[0]), BTreeSet::from([healthy.clone()]));
    let other = waiting_names
        .iter()
        .find(|n| n.as_str() != name(ran[0]))
        .unwrap();
    wait_event(&cluster, other, "FailedScheduling", "CardNotHealth").await;
    let pods = list_pods(&cluster).await;
    let still = pods.iter().find(|p| name(p) == other).unwrap();
    assert!(bound_node(still).is_none(), "{}", summary(&pods));
    check_clean(&cluster).await;

    assert!(node.set_gpu_health(&sick, true));
    let pods = wait_running(&cluster, &waiting_names).await;
    let back = pods.iter().find(|p| name(p) == other).unwrap();
    assert_eq!(pod_gpus(back), BTreeSet::from([sick]));
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// A full cluster: extra pods wait (Pending, Unschedulable), then schedule
/// as others are deleted or finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cluster_pods_wait_then_schedule_as_others_leave() {
    let cluster = start(1, 2).await;
    // Two per GPU fit (2 × 20000 of 40960 MiB): four in all.
    let pods: Vec<Pod> = (0..6)
        .map(|i| slice(&format!("full-{i}"), 20000, 10))
        .collect();
    create_all(&cluster, &pods).await;
    let seen = wait_pods(&cluster, "4 running, 2 unschedulable", |pods| {
        pods.iter().filter(|p| phase(p) == "Running").count() == 4
            && pods.iter().filter(|p| unschedulable(p)).count() == 2
    })
    .await;
    let running: Vec<String> = seen
        .iter()
        .filter(|p| phase(p) == "Running")
        .map(|p| name(p).to_owned())
        .collect();
    let waiting: Vec<String> = seen
        .iter()
        .filter(|p| unschedulable(p))
        .map(|p| name(p).to_owned())
        .collect();
    for w in &waiting {
        wait_event(&cluster, w, "FailedScheduling", "CardInsufficientMemory").await;
    }
    check_clean(&cluster).await;

    delete_pod(&cluster, &running[0]).await;
    let pods = wait_pods(&cluster, "one waiting pod runs", |pods| {
        pods.iter()
            .any(|p| waiting.iter().any(|w| w == name(p)) && phase(p) == "Running")
    })
    .await;
    let bound = pods
        .iter()
        .filter(|p| waiting.iter().any(|w| w == name(p)) && bound_node(p).is_some())
        .count();
    assert_eq!(bound, 1, "one slot freed: {}", summary(&pods));
    check_clean(&cluster).await;
    finish_pod(&cluster, &running[1]).await;
    let mut live: Vec<String> = running[2..].to_vec();
    live.extend(waiting.iter().cloned());
    wait_running(&cluster, &live).await;
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

/// 20 pods created concurrently on a nearly full node: exactly the ones
/// that fit run, the rest wait with reasons, nothing is over-committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_pods_on_a_nearly_full_node_never_overcommit() {
    let cluster = start(1, 2).await;
    // 30000 of 40960 MiB taken on each GPU: 10960 left, two 4000 MiB slices each.
    let fillers: Vec<Pod> = (0..2)
        .map(|i| slice(&format!("filler-{i}"), 30000, 10))
        .collect();
    let fillers = create_all(&cluster, &fillers).await;
    wait_running(&cluster, &fillers).await;
    let rush: Vec<Pod> = (0..20)
        .map(|i| slice(&format!("rush-{i}"), 4000, 10))
        .collect();
    let created = join_all(rush.iter().map(|p| cluster.create_pod(p))).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let pods = wait_pods(&cluster, "4 rush pods running, 16 unschedulable", |pods| {
        let rush = pods.iter().filter(|p| name(p).starts_with("rush-"));
        rush.clone().filter(|p| phase(p) == "Running").count() == 4
            && rush.filter(|p| unschedulable(p)).count() == 16
    })
    .await;
    let report = check_clean(&cluster).await;
    assert!(report.overcommitted.is_empty());
    let waiting = pods
        .iter()
        .find(|p| name(p).starts_with("rush-") && unschedulable(p))
        .unwrap();
    let (_, _, message) = pod_condition(waiting, "PodScheduled").unwrap();
    assert!(message.contains("CardInsufficientMemory"), "{message}");
    cluster.shutdown().await;
}

/// The extender counts the CPU of every pod on a node, GPU pods or not:
/// with `fgdpack`, a GPU pod asking CPU keeps off the node whose CPU a
/// batch pod took, though that node holds more GPU slices (where it went
/// while the extender saw only GPUs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fgdpack_keeps_a_cpu_asking_gpu_pod_off_the_node_whose_cpu_is_taken() {
    let cluster = start(2, 4).await;
    // Node 0 holds a slice; then a CPU-only pod takes 60 of its 64 cores.
    let mut anchor = slice("anchor", 3000, 30);
    anchor.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "kubernetes.io/hostname".to_owned(),
        "gpu-node-0".to_owned(),
    )]));
    let batch: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "batch", "namespace": NS},
        "spec": {"nodeName": "gpu-node-0", "containers": [{"name": "work", "image": "busybox",
            "resources": {"requests": {"cpu": "60", "memory": "1Gi"}}}]}
    }))
    .unwrap();
    let first = create_all(&cluster, &[anchor, batch]).await;
    wait_running(&cluster, &first).await;

    let mut heavy = slice("heavy", 3000, 30);
    heavy.metadata.annotations = Some(BTreeMap::from([(
        "hami.io/node-scheduler-policy".to_owned(),
        "fgdpack".to_owned(),
    )]));
    let container = &mut heavy.spec.as_mut().unwrap().containers[0];
    container.resources.as_mut().unwrap().requests = Some(BTreeMap::from([(
        "cpu".to_owned(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("4".to_owned()),
    )]));
    let names = create_all(&cluster, &[heavy]).await;
    let pods = wait_running(&cluster, &names).await;
    let heavy = pods.iter().find(|p| name(p) == "heavy").unwrap();
    assert_eq!(
        annotation(heavy, "hami.io/vgpu-node"),
        Some("gpu-node-1"),
        "{}",
        summary(&pods)
    );
    check_clean(&cluster).await;
    cluster.shutdown().await;
}

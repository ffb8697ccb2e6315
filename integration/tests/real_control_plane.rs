//! gpuslice on the real Kubernetes control plane: kube-apiserver, etcd,
//! kube-controller-manager and kube-scheduler built from `k8s.io/kubernetes`
//! by `integration/k8s/build.sh`. The real apiserver calls our webhook at the
//! URL the chart registers, the real kube-scheduler calls our extender with
//! the chart's configuration, and our services run with the chart's
//! ServiceAccount tokens and RBAC.
//!
//! Each test skips, saying why, when the binaries are not built; `.ci/run`
//! builds them first, so in CI none skips. (The scenario and e2e tests run
//! on this control plane too, with `GPUSLICE_CONTROL_PLANE=real`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::time::Duration;

use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind, SCHEDULER_NAME};
use integration::harness::wait_for_pod;
use integration::real::binaries::{Binaries, kubernetes_version};
use integration::real::chart::{self, Release};
use integration::real::control_plane::ControlPlane;
use integration::workload;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);

async fn start(test: &str, nodes: usize, gpus_per_node: u32) -> Option<Cluster> {
    Binaries::for_test(test)?;
    let cluster = Cluster::start(ClusterSpec {
        nodes,
        gpus_per_node,
        control_plane: ControlPlaneKind::Real,
        ..ClusterSpec::default()
    })
    .await
    .unwrap();
    cluster.wait_until_ready().await.unwrap();
    Some(cluster)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// A GPU pod created without a scheduler name is mutated by our webhook (the
/// real apiserver called it), scheduled by the real kube-scheduler through
/// our extender, allocated by our node-daemon, and the checker is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_apiserver_calls_our_webhook_and_kube_scheduler_our_extender() {
    let Some(cluster) = start("webhook_and_extender", 1, 2).await else {
        return;
    };
    let (apiserver, scheduler, kubelet) = cluster.control_plane_versions().await;
    assert_eq!(apiserver, kubernetes_version());
    assert_eq!(scheduler, kubernetes_version());
    assert_eq!(kubelet, "stand-in");

    let pod = workload::gpu_pod(
        "slice-0",
        &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
    );
    let created = cluster.create_pod(&pod).await.unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(
        spec.scheduler_name.as_deref(),
        Some(SCHEDULER_NAME),
        "the webhook routed it"
    );

    let client = cluster.client().await.unwrap();
    let pod = wait_for_pod(&client, "default", "slice-0", DEADLINE, |p| {
        matches!(phase(p), "Running" | "Failed")
    })
    .await
    .unwrap();
    assert_eq!(phase(&pod), "Running", "{:#?}", pod.status);
    let annotations = pod.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("hami.io/vgpu-node").map(String::as_str),
        Some("gpu-node-0")
    );
    assert!(
        annotations["hami.io/vgpu-devices-allocated"].contains(",NVIDIA,3000,30:"),
        "{annotations:?}"
    );
    let (report, _) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    cluster.shutdown().await;
}

/// The pods of the demo run on the real control plane, except the one that
/// fits nowhere; the checker is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_mix_runs_on_the_real_control_plane() {
    let Some(cluster) = start("demo_mix", 2, 4).await else {
        return;
    };
    let demo = workload::demo(cluster.spec.gpu_memory_mib);
    for d in &demo {
        cluster.create_pod(&d.pod).await.unwrap();
    }
    let client = cluster.client().await.unwrap();
    for d in demo.iter().filter(|d| !d.expect_unschedulable) {
        let name = d.pod.metadata.name.as_deref().unwrap();
        let pod = wait_for_pod(&client, "default", name, DEADLINE, |p| {
            matches!(phase(p), "Running" | "Failed")
        })
        .await
        .unwrap();
        assert_eq!(phase(&pod), "Running", "{name}: {:#?}", pod.status);
    }
    let too_big = demo.iter().find(|d| d.expect_unschedulable).unwrap();
    let name = too_big.pod.metadata.name.as_deref().unwrap();
    let pod = wait_for_pod(&client, "default", name, DEADLINE, |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    })
    .await
    .unwrap();
    assert_eq!(phase(&pod), "Pending");
    let (report, _) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    cluster.shutdown().await;
}

/// The chart registers the webhook by Service by default: the harness
/// refuses to apply that to an apiserver (it would dial a ClusterIP).
#[test]
fn the_harness_refuses_the_default_service_registration() {
    let objects = match (Release {
        name: "gpuslice".into(),
        namespace: "gpuslice-system".into(),
        sets: Vec::new(),
        values_files: Vec::new(),
    })
    .render()
    {
        Ok(o) => o,
        Err(e) => panic!("helm template: {e}"),
    };
    let err = chart::check_loopback(&objects).unwrap_err();
    assert!(err.contains("registered by Service"), "{err}");
}

/// `helm install` into the real apiserver, with default values and with
/// every feature on (the webhook registered by URL on 127.0.0.1): the real
/// validation accepts every object, and `helm test`'s pod spec is accepted
/// (server-side dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_into_the_real_apiserver_accepts_every_object() {
    let Some(binaries) = Binaries::for_test("helm_install") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plane = ControlPlane::start(binaries, dir.path()).await.unwrap();
    let helm = chart::helm().unwrap();
    let chart_dir = integration::real::binaries::workspace_root().join("helm/gpuslice");
    let all_features = chart_dir.join("ci/all-features-values.yaml");
    for (release, values) in [("plain", None), ("full", Some(&all_features))] {
        let namespace = format!("{release}-ns");
        // Nothing serves the webhook in this test, and each release's webhook
        // sees the other release's namespace: Ignore keeps pod creation open.
        let mut sets = vec![
            "scheduler.admissionWebhook.url=https://127.0.0.1:9/webhook".to_owned(),
            "scheduler.admissionWebhook.failurePolicy=Ignore".to_owned(),
        ];
        if values.is_some() {
            // cert-manager and the Prometheus operator are not installed here, so
            // their CRDs (Certificate, Issuer, ServiceMonitor) are unknown.
            sets.push("scheduler.certManager.enabled=false".to_owned());
            sets.push("metrics.serviceMonitor.enabled=false".to_owned());
            // The Grafana dashboards go to Grafana's namespace, which a
            // cluster running Grafana has; create it as such a cluster would.
            let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                kube::Api::all(plane.admin_client().await.unwrap());
            let monitoring = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}}))
            .unwrap();
            namespaces
                .create(&kube::api::PostParams::default(), &monitoring)
                .await
                .unwrap();
        }
        let rendered = Release {
            name: release.into(),
            namespace: namespace.clone(),
            sets: sets.clone(),
            values_files: values.into_iter().cloned().collect(),
        }
        .render()
        .unwrap();
        chart::check_loopback(&rendered).unwrap();
        let mut cmd = std::process::Command::new(&helm);
        cmd.args(["install", release])
            .arg(&chart_dir)
            .args([
                "--namespace",
                &namespace,
                "--create-namespace",
                "--wait=false",
            ])
            .arg("--kubeconfig")
            .arg(&plane.admin_kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST");
        if let Some(v) = values {
            cmd.arg("-f").arg(v);
        }
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "helm install {release}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // helm test's pod: accepted by the real validation and admission.
        let tests = std::process::Command::new(&helm)
            .args(["template", release])
            .arg(&chart_dir)
            .args([
                "--namespace",
                &namespace,
                "--show-only",
                "templates/tests/test-gpu-slice-pod.yaml",
            ])
            .args(sets.iter().flat_map(|s| ["--set", s.as_str()]))
            .output()
            .unwrap();
        let docs = chart::parse_documents(&String::from_utf8_lossy(&tests.stdout)).unwrap();
        let client = plane.admin_client().await.unwrap();
        plane
            .wait_for_default_service_account(&namespace)
            .await
            .unwrap();
        for doc in docs.iter().filter(|d| d["kind"] == "Pod") {
            let pod: Pod = serde_json::from_value(doc.clone()).unwrap();
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            Api::<Pod>::namespaced(client.clone(), &namespace)
                .create(&dry, &pod)
                .await
                .unwrap_or_else(|e| panic!("helm test pod of {release}: {e}"));
        }
        let _ = Api::<Pod>::namespaced(client, &namespace)
            .delete_collection(&DeleteParams::default(), &Default::default())
            .await;
    }
}

/// `gpuslice_bind_results_total{result="bound"}` of a `/metrics` page.
fn bound_by_extender(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("gpuslice_bind_results_total{result=\"bound\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// HA as the chart runs it with two scheduler pods: two kube-schedulers
/// (each beside its own scheduler-webhook, under its own hostname) compete
/// for the one Lease; the leader schedules through its extender. When the
/// leader's kube-scheduler is killed, the other takes the Lease and pods are
/// scheduled through the other extender; the checker stays clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_the_second_scheduler_takes_over_when_the_leader_dies() {
    use integration::harness::wait_for_object;
    use k8s_openapi::api::coordination::v1::Lease;

    let Some(mut cluster) = start("ha_takeover", 1, 4).await else {
        return;
    };
    if let Err(e) = integration::real::kubelet::mount_namespace_permitted() {
        eprintln!("SKIPPED ha_takeover: a second kube-scheduler needs its own UTS namespace: {e}");
        cluster.shutdown().await;
        return;
    }
    let replica = cluster.add_scheduler_replica().unwrap();
    let replica_identity = cluster.scheduler_replicas()[replica].identity.clone();
    let replica_scheduler = cluster.scheduler_replicas()[replica].kube_scheduler;
    let client = cluster.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), integration::real::install::NAMESPACE);
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    let lease = wait_for_object(leases.clone(), SCHEDULER_NAME, DEADLINE, |l: &Lease| {
        !holder(l).is_empty()
    })
    .await
    .unwrap();
    assert!(
        !holder(&lease).starts_with(&replica_identity),
        "the first kube-scheduler leads: {}",
        holder(&lease)
    );

    let slice = |name: &str| {
        workload::gpu_pod(
            name,
            &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "10"}),
        )
    };
    cluster.create_pod(&slice("before")).await.unwrap();
    let running = |p: &Pod| phase(p) == "Running";
    wait_for_pod(&client, "default", "before", DEADLINE, running)
        .await
        .unwrap();
    let follower = cluster.replica_metrics(replica).await.unwrap();
    assert_eq!(bound_by_extender(&follower), 0, "the follower did not bind");

    cluster.kill_kube_scheduler(0).unwrap();
    wait_for_object(leases, SCHEDULER_NAME, DEADLINE, |l: &Lease| {
        holder(l).starts_with(&replica_identity)
    })
    .await
    .unwrap();
    cluster.create_pod(&slice("after")).await.unwrap();
    wait_for_pod(&client, "default", "after", DEADLINE, running)
        .await
        .unwrap();
    let leader = cluster.replica_metrics(replica).await.unwrap();
    assert_eq!(
        bound_by_extender(&leader),
        1,
        "the new leader's extender bound the pod (kube-scheduler {replica_scheduler})"
    );
    let (report, _) = cluster.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    cluster.shutdown().await;
}

/// `bench --only kube-scheduler`'s code path at a small size: 20 Node
/// objects, 40 pods per run, the three runs on fresh real control planes.
/// Behaviour only: every pod bound (the slice pods by our extender and
/// `bind-phase=success` after the device plugin's part), no node left
/// locked, the JSON has the keys, and every figure is above 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_scheduler_bench_binds_every_pod_and_leaves_no_node_locked() {
    use integration::scheduler_bench::{Config, Run, run};
    if Binaries::for_test("kube_scheduler_bench").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        nodes: 20,
        pods: 40,
        deadline: Duration::from_secs(300),
        ..Config::default()
    };
    let report = run(&config, &Run::ALL, dir.path()).await.unwrap();
    assert_eq!(report.runs.len(), 3);
    for r in &report.runs {
        let name = r.run.as_str();
        assert_eq!(r.bound, 40, "{name}: every pod bound");
        assert_eq!(r.locked_nodes, 0, "{name}: no node left locked");
        assert_eq!(r.not_allocated, 0, "{name}: every slice pod allocated");
        assert!(r.pods_per_s() > 0.0, "{name}: {r:?}");
        assert!(
            r.attempts >= 40.0,
            "{name}: kube-scheduler counted its attempts: {r:?}"
        );
        assert!(r.attempt_p99_ms > 0.0, "{name}: {r:?}");
        assert_eq!(r.filter_ms.is_some(), r.run != Run::Baseline, "{name}");
    }
    let json = report.to_json();
    assert_eq!(json["nodes"], 20);
    for key in [
        "baseline_pods_per_s",
        "binpack_pods_per_s",
        "fgd_pods_per_s",
        "filter_p99_ms",
    ] {
        assert!(
            json[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {json}"
        );
    }
    let table = report.to_markdown();
    assert!(
        table.contains("(b) / (a)") && table.contains("(c) / (a)"),
        "{table}"
    );
}

//! The README's first command gives the right picture every time: the
//! demo, run in process through the sandbox's library function, 20 times
//! in a row, ends with 7 of 8 pods Running, only `too-big` Pending, and a
//! clean checker.

use clap::Parser as _;
use integration::sandbox::{Args, Expectation, Summary, run};

fn demo_args() -> Args {
    Args::parse_from(["sandbox", "--format", "json", "--timeout", "180"])
}

/// What is wrong with a demo summary, judged with the old public fields
/// only (so this test also runs against a sandbox without a verdict).
fn wrong_picture(summary: &Summary) -> Option<String> {
    let pending: Vec<(&str, &str)> = summary
        .not_running
        .iter()
        .map(|p| (p.pod.as_str(), p.phase.as_str()))
        .collect();
    let right = summary.pods_running == 7
        && pending == [("too-big", "Pending")]
        && summary.report.is_clean();
    (!right).then(|| {
        format!(
            "{} running; not running: {:?}; checker clean: {}",
            summary.pods_running,
            summary.not_running,
            summary.report.is_clean()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_gives_the_right_picture_20_times_in_a_row() {
    let args = demo_args();
    for round in 1..=20 {
        let (summary, cluster) = run(&args).await.expect("the sandbox runs");
        cluster.shutdown().await;
        if let Some(wrong) = wrong_picture(&summary) {
            panic!("round {round}: wrong picture: {wrong}");
        }
        assert!(
            summary.as_expected(),
            "round {round}: {:?}",
            summary.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_picture_is_reported_with_its_reasons() {
    let args = demo_args();
    let (mut summary, cluster) = run(&args).await.expect("the sandbox runs");
    cluster.shutdown().await;
    assert!(summary.as_expected(), "{:?}", summary.problems);

    // The same summary judged against a demo where too-big should have run
    // and no pod may stay pending.
    let strict = Expectation {
        pending: Some(Default::default()),
    };
    let problems = strict.problems(&summary);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("too-big is Pending"),
        "{problems:?}"
    );

    // A pod that stayed Pending against the demo's expectation.
    let inference = summary
        .not_running
        .first()
        .cloned()
        .map(|mut p| {
            p.pod = "inference-large".to_owned();
            p.reason = "0/2 nodes are available: 2 1/0 NodeInsufficientDevice".to_owned();
            p
        })
        .expect("too-big is listed");
    summary.not_running.push(inference);
    summary.pods_running -= 1;
    let problems = Expectation::of(&args).problems(&summary);
    assert_eq!(
        problems,
        vec!["inference-large is Pending: 0/2 nodes are available: 2 1/0 NodeInsufficientDevice"]
    );
}

/// `sandbox --workload mig`: node-daemons in `operatingMode: mig` with
/// simulated A100-40GB. Every pod runs except `mig-no-room`, which stays
/// Pending with HAMi's `CardMigTopologyInfeasible`; every container runs on
/// a MIG instance of its own (`NVIDIA_VISIBLE_DEVICES=MIG-…`, the instance
/// the pod's `vgpu-mig-allocations` names) with no HAMi-core limits; the
/// checker, which knows MIG placements, is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mig_workload_runs_every_container_on_its_own_mig_instance() {
    use integration::fake_kubelet::{ALLOCATIONS_ANNOTATION, ContainerAllocation};
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use kube::api::ListParams;

    let mut args = Args::parse_from([
        "sandbox",
        "--workload",
        "mig",
        "--format",
        "json",
        "--timeout",
        "180",
    ]);
    // `GPUSLICE_CONTROL_PLANE=real`: the real kube-apiserver and kube-scheduler.
    args.control_plane = integration::cluster::ControlPlaneKind::from_env();
    let (summary, cluster) = run(&args).await.expect("the sandbox runs");
    let client = cluster.client().await.expect("a client");
    let pods = Api::<Pod>::namespaced(client, integration::workload::NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("pods list");
    // The scheduler exports every instance the node-daemons created, once
    // its watch has seen their runtime identity (HAMi v2.10's metric).
    let series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("hami_node_gpu_mig_instance_info{"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut exported = series(&cluster.metrics().await.expect("scheduler /metrics"));
    while exported.len() < 8 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        exported = series(&cluster.metrics().await.expect("scheduler /metrics"));
    }
    cluster.shutdown().await;

    assert!(summary.as_expected(), "{:?}", summary.problems);
    assert!(summary.report.is_clean(), "{:?}", summary.report);
    assert_eq!(summary.pods_running, 6, "{:?}", summary.not_running);
    assert_eq!(summary.not_running.len(), 1, "{:?}", summary.not_running);
    let pending = &summary.not_running[0];
    assert_eq!(
        (pending.pod.as_str(), pending.phase.as_str()),
        ("mig-no-room", "Pending")
    );
    assert!(
        pending.reason.contains("CardMigTopologyInfeasible"),
        "{}",
        pending.reason
    );
    // The same report as the demo's: the summary's JSON keys.
    let json = serde_json::to_value(&summary).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "control_plane",
            "mismatched_containers",
            "nodes",
            "not_running",
            "overcommitted_gpus",
            "pods_failed",
            "pods_pending",
            "pods_rejected",
            "pods_running",
            "pods_submitted",
            "problems",
            "seconds_to_settle",
            "unfinished_pods",
        ]
    );

    let mut seen: Vec<String> = Vec::new();
    let mut containers = 0;
    for pod in pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let instances = proto::hami::mig::decode_allocations(
            annotations
                .get("hami.io/vgpu-mig-allocations")
                .unwrap_or_else(|| panic!("{name}: no vgpu-mig-allocations")),
        )
        .unwrap();
        let records: Vec<ContainerAllocation> =
            serde_json::from_str(&annotations[ALLOCATIONS_ANNOTATION]).unwrap();
        for record in records {
            containers += 1;
            let env = &record.reply.envs;
            let visible = &env["NVIDIA_VISIBLE_DEVICES"];
            for id in visible.split(',') {
                assert!(
                    id.starts_with("MIG-"),
                    "{name}/{}: {visible}",
                    record.container
                );
                assert!(
                    instances
                        .iter()
                        .any(|i| i.runtime.as_ref().is_some_and(|r| r.mig_uuid == id)),
                    "{name}/{}: {id} is not an instance the pod records",
                    record.container
                );
                assert!(!seen.contains(&id.to_owned()), "{id} handed out twice");
                seen.push(id.to_owned());
            }
            assert!(
                !env.keys()
                    .any(|k| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT")
                        || k == "CUDA_DEVICE_SM_LIMIT"),
                "{name}/{}: HAMi-core limits on a MIG instance: {env:?}",
                record.container
            );
        }
    }
    // mig-1g, -2g, -3g, -7g, two instances of mig-2gpu, mig-init's init
    // and app container.
    assert_eq!(containers, 7);
    assert_eq!(seen.len(), 8);
    assert_eq!(exported.len(), 8, "{exported:#?}");
    for id in &seen {
        let label = format!("mig_uuid=\"{id}\"");
        assert!(
            exported.iter().any(|l| l.contains(&label)),
            "{id} not in hami_node_gpu_mig_instance_info: {exported:#?}"
        );
    }
}

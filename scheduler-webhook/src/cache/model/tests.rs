//! The model's behaviour, driven through its public methods.
use proto::hami::keys;
use proto::hami::register::NodeDevice;
use serde_json::json;

use super::*;

fn config() -> ModelConfig {
    ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 7,
    }
}

fn kube_node(name: &str, gpus: u32, mem: u32) -> KubeNode {
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
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()
    }}}))
    .unwrap()
}

fn slice_pod(uid: &str, mem: u32, cores: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()}}}]}
    }))
    .unwrap()
}

/// `pod` with its first container's limit `key` set to `value`.
fn with_limit(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert(
            key.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.into()),
        );
    pod
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_slice_is_placed_and_reserved_so_the_next_filter_sees_it() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    let FilterOutcome::Placed { node, devices, .. } =
        model.filter(&slice_pod("a", 600, 10), &names(&["n1"]))
    else {
        panic!("expected a placement");
    };
    assert_eq!(node, "n1");
    assert_eq!(devices.to_string(), "GPU-n1-0,NVIDIA,600,10:;");
    assert_eq!(model.decision("a").map(|d| d.node.as_str()), Some("n1"));
    // 400 MiB left: a second 600 MiB pod does not fit.
    let FilterOutcome::NoFit { failed } = model.filter(&slice_pod("b", 600, 10), &names(&["n1"]))
    else {
        panic!("expected no fit");
    };
    assert_eq!(failed["n1"], "1/1 CardInsufficientMemory");
    // Filtering the first pod again replaces, not doubles, its reservation.
    assert!(matches!(
        model.filter(&slice_pod("a", 600, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    // Releasing makes room and forgets the decision.
    assert!(model.release("a"));
    assert!(model.decision("a").is_none());
    assert!(matches!(
        model.filter(&slice_pod("b", 600, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    model.check().unwrap();
}

#[test]
fn unknown_candidates_are_reported_unregistered() {
    let mut model = ClusterModel::new(config());
    let FilterOutcome::NoFit { failed } =
        model.filter(&slice_pod("a", 100, 10), &names(&["ghost"]))
    else {
        panic!("expected no fit");
    };
    assert_eq!(failed["ghost"], "node unregistered");
    // The same list again, once the node has registered: it is found,
    // not answered from the previous resolution.
    model.apply_node(&kube_node("ghost", 1, 1000)).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["ghost"])),
        FilterOutcome::Placed { .. }
    ));
    // A different list is resolved afresh.
    let FilterOutcome::Placed { failed, .. } =
        model.filter(&slice_pod("b", 100, 10), &names(&["nobody", "ghost"]))
    else {
        panic!("ghost fits");
    };
    assert_eq!(failed["nobody"], "node unregistered");
}

#[test]
fn pods_without_gpu_pass_and_bad_quantities_are_invalid() {
    let mut model = ClusterModel::new(config());
    let cpu_pod: Pod = serde_json::from_value(
        json!({"metadata": {"uid": "x"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    assert_eq!(
        model.filter(&cpu_pod, &names(&["n1"])),
        FilterOutcome::NoGpuRequested
    );
    let bad = with_limit(slice_pod("y", 1, 1), "nvidia.com/gpumem", "lots");
    let FilterOutcome::Invalid(why) = model.filter(&bad, &names(&["n1"])) else {
        panic!("expected invalid");
    };
    assert!(why.contains("nvidia.com/gpumem"), "{why}");
}

#[test]
fn allocations_from_annotations_count_and_finished_pods_release_them() {
    let mut model = ClusterModel::new(config());
    // The pod arrives before its node: its allocation waits for the node.
    let mut held = slice_pod("held", 900, 10);
    held.metadata.annotations = Some(BTreeMap::from([
        (keys::VGPU_NODE.to_owned(), "n1".to_owned()),
        (
            keys::VGPU_DEVICES_ALLOCATED.to_owned(),
            "GPU-n1-0,NVIDIA,900,10:;".to_owned(),
        ),
    ]));
    model.apply_pod(&held);
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    assert_eq!(model.node_of("held"), Some("n1"));
    let gpus = model.gpu_snapshot();
    assert_eq!(
        (
            gpus[0].used_slots,
            gpus[0].used_memory_mib,
            gpus[0].used_cores
        ),
        (1, 900, 10)
    );
    let slices = model.slice_snapshot();
    assert_eq!(slices.len(), 1);
    assert_eq!(
        (slices[0].pod.as_str(), slices[0].memory_mib),
        ("held", 900)
    );
    assert!(matches!(
        model.filter(&slice_pod("b", 200, 10), &names(&["n1"])),
        FilterOutcome::NoFit { .. }
    ));
    // Being deleted: its containers still run until kubelet stops them,
    // so its slice stays taken.
    held.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2025-10-20T03:07:02Z")).unwrap());
    model.apply_pod(&held);
    assert_eq!(model.node_of("held"), Some("n1"));
    assert!(matches!(
        model.filter(&slice_pod("b", 200, 10), &names(&["n1"])),
        FilterOutcome::NoFit { .. }
    ));
    held.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
    model.apply_pod(&held);
    assert_eq!(model.node_of("held"), None);
    assert!(model.slice_snapshot().is_empty());
    assert_eq!(model.gpu_snapshot()[0].used_slots, 0);
    assert!(matches!(
        model.filter(&slice_pod("b", 200, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    model.check().unwrap();
}

#[test]
fn a_bad_register_annotation_is_an_error_and_keeps_the_gpus() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
    let broken: KubeNode =
        serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
        keys::NODE_NVIDIA_REGISTER: "[{\"id\":"}}}))
        .unwrap();
    assert!(model.apply_node(&broken).is_err());
    let id = model.cluster().node_id("n1").unwrap();
    assert_eq!(model.cluster().node(id).unwrap().gpus.len(), 2);
}

#[test]
fn a_node_marked_unhealthy_offers_no_gpus_until_requested_again() {
    let mut model = ClusterModel::new(config());
    let mut node = kube_node("n1", 1, 1000);
    let annotations = node.metadata.annotations.as_mut().unwrap();
    annotations.insert(
        keys::NODE_HANDSHAKE.into(),
        "Deleted_2025-07-12 01:12:20".into(),
    );
    model.apply_node(&node).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
        FilterOutcome::NoFit { .. }
    ));
    let annotations = node.metadata.annotations.as_mut().unwrap();
    annotations.insert(
        keys::NODE_HANDSHAKE.into(),
        "Requesting_2025-07-12 01:13:20".into(),
    );
    model.apply_node(&node).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
}

fn quota(ns: &str, name: &str, hard: serde_json::Value) -> ResourceQuota {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": hard}
    }))
    .unwrap()
}

fn used(model: &ClusterModel, ns: &str) -> (u64, u64) {
    model
        .quota_snapshot()
        .iter()
        .find(|q| q.namespace == ns)
        .map_or((0, 0), |q| (q.used.memory_mib, q.used.cores))
}

fn allocated(mut pod: Pod, node: &str, devices: &str) -> Pod {
    pod.metadata.annotations = Some(BTreeMap::from([
        (keys::VGPU_NODE.to_owned(), node.to_owned()),
        (keys::VGPU_DEVICES_ALLOCATED.to_owned(), devices.to_owned()),
    ]));
    pod
}

#[test]
fn quota_use_follows_reservations_allocations_and_finished_pods() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 2, 10_000)).unwrap();
    model
        .apply_quota(&quota(
            "ns",
            "gpu",
            json!({"limits.nvidia.com/gpumem": "5000", "limits.nvidia.com/gpucores": "100"}),
        ))
        .unwrap();
    // A reservation counts at once.
    assert!(matches!(
        model.filter(&slice_pod("a", 3000, 30), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert_eq!(used(&model, "ns"), (3000, 30));
    // The next pod sees only the room left: 2000 MiB.
    let FilterOutcome::NoFit { failed } = model.filter(&slice_pod("b", 2500, 10), &names(&["n1"]))
    else {
        panic!("expected no fit");
    };
    assert_eq!(failed["n1"], "2/2 ResourceQuotaNotFit");
    assert_eq!(
        used(&model, "ns"),
        (3000, 30),
        "a failed filter charges nothing"
    );
    // Filtering the same pod again replaces its charge.
    assert!(matches!(
        model.filter(&slice_pod("a", 3000, 30), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert_eq!(used(&model, "ns"), (3000, 30));
    // Released (bind failed): refunded.
    model.release("a");
    assert_eq!(used(&model, "ns"), (0, 0));
    // An allocation from annotations counts; a finished pod refunds it.
    let mut held = allocated(slice_pod("held", 0, 0), "n1", "GPU-n1-0,NVIDIA,4000,20:;");
    model.apply_pod(&held);
    assert_eq!(used(&model, "ns"), (4000, 20));
    held.status = Some(serde_json::from_value(json!({"phase": "Failed"})).unwrap());
    model.apply_pod(&held);
    assert_eq!(used(&model, "ns"), (0, 0));
    // A deleted pod refunds too, and other namespaces are not charged here.
    model.apply_pod(&allocated(
        slice_pod("gone", 0, 0),
        "n1",
        "GPU-n1-1,NVIDIA,1000,10:;",
    ));
    assert_eq!(used(&model, "ns"), (1000, 10));
    model.delete_pod("gone");
    assert_eq!(used(&model, "ns"), (0, 0));
    model.check().unwrap();
}

#[test]
fn the_tightest_quota_wins_and_deleting_it_loosens_the_limit() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 10_000)).unwrap();
    model
        .apply_quota(&quota(
            "ns",
            "wide",
            json!({"limits.nvidia.com/gpumem": "8000", "pods": "10"}),
        ))
        .unwrap();
    model
        .apply_quota(&quota(
            "ns",
            "tight",
            json!({"limits.nvidia.com/gpumem": "2Ki"}),
        ))
        .unwrap();
    let status = model.quota_status("ns").unwrap();
    assert_eq!(status.limits.memory_mib, Some(2048));
    assert_eq!(status.limits.cores, None);
    assert!(matches!(
        model.filter(&slice_pod("a", 3000, 10), &names(&["n1"])),
        FilterOutcome::NoFit { .. }
    ));
    model.delete_quota("ns", "tight");
    assert_eq!(
        model.quota_status("ns").unwrap().limits.memory_mib,
        Some(8000)
    );
    assert!(matches!(
        model.filter(&slice_pod("a", 3000, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    model.delete_quota("ns", "wide");
    assert_eq!(model.quota_status("ns"), None);
    assert_eq!(model.pods().quota_keys().count(), 0);
}

#[test]
fn a_quota_without_our_keys_or_with_a_bad_value_limits_nothing() {
    let mut model = ClusterModel::new(config());
    model
        .apply_quota(&quota(
            "ns",
            "cpu",
            json!({"limits.cpu": "4", "requests.nvidia.com/gpumem": "10"}),
        ))
        .unwrap();
    assert_eq!(model.quota_status("ns"), None);
    let bad = model
        .apply_quota(&quota(
            "ns",
            "typo",
            json!({"limits.nvidia.com/gpumem": "lots", "limits.nvidia.com/gpucores": "50"}),
        ))
        .unwrap_err();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].key, "limits.nvidia.com/gpumem");
    assert!(bad[0].to_string().contains("ns/typo"), "{}", bad[0]);
    let status = model.quota_status("ns").unwrap();
    assert_eq!(
        (status.limits.memory_mib, status.limits.cores),
        (None, Some(50))
    );
}

#[test]
fn quota_keys_follow_the_configured_resource_names() {
    let mut cfg = config();
    cfg.requests.names.resource_mem = "example.com/vmem".into();
    let mut model = ClusterModel::new(cfg);
    model
        .apply_quota(&quota(
            "ns",
            "q",
            json!({"limits.nvidia.com/gpumem": "10", "limits.example.com/vmem": "20"}),
        ))
        .unwrap();
    assert_eq!(
        model.quota_status("ns").unwrap().limits.memory_mib,
        Some(20)
    );
}

fn fgd_config() -> ModelConfig {
    let mut cfg = config();
    cfg.scheduler.node_policy = Policy::Fgd;
    cfg
}

fn annotated(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
    pod
}

fn placed_on(outcome: &FilterOutcome) -> &str {
    match outcome {
        FilterOutcome::Placed { node, .. } => node,
        other => panic!("expected a placement, got {other:?}"),
    }
}

/// Nodes a and b of one 1000 MiB GPU: a holds a 500 slice, b a 300 one.
fn half_and_third_used(cfg: ModelConfig) -> ClusterModel {
    let mut model = ClusterModel::new(cfg);
    model.apply_node(&kube_node("a", 1, 1000)).unwrap();
    model.apply_node(&kube_node("b", 1, 1000)).unwrap();
    model.apply_pod(&allocated(
        slice_pod("on-a", 500, 50),
        "a",
        "GPU-a-0,NVIDIA,500,50:;",
    ));
    model.apply_pod(&allocated(
        slice_pod("on-b", 300, 30),
        "b",
        "GPU-b-0,NVIDIA,300,30:;",
    ));
    model
}

#[test]
fn a_pod_annotated_fgd_goes_where_fragmentation_grows_least_not_to_the_fullest_node() {
    // Workload {500, 300, 200 milli}, a third each (the pod counts
    // itself). A 200 pod on a leaves 300 idle, a fragment for the 500
    // shape: +300/3. On b it leaves 500, usable by every shape: +0.
    // Binpack takes the fuller node, a.
    let mut model = half_and_third_used(config());
    let binpack = model.filter(&slice_pod("p", 200, 20), &names(&["a", "b"]));
    assert_eq!(placed_on(&binpack), "a");

    let mut model = half_and_third_used(config());
    let pod = annotated(
        slice_pod("p", 200, 20),
        crate::core::request::NODE_POLICY,
        "fgd",
    );
    let fgd = model.filter(&pod, &names(&["a", "b"]));
    assert_eq!(placed_on(&fgd), "b");
    assert_eq!(model.workload().total(), 3);
    assert_eq!(model.fgd_rebuilds(), 1);
}

/// `fgdpack` is selectable as fgd is: by a pod's annotation, and as the
/// cluster's default; it uses the same index, and on this case (growth
/// 100 against 0) decides as fgd.
#[test]
fn fgdpack_is_selectable_per_pod_and_per_cluster() {
    let mut model = half_and_third_used(config());
    let pod = annotated(
        slice_pod("p", 200, 20),
        crate::core::request::NODE_POLICY,
        "fgdpack",
    );
    assert_eq!(placed_on(&model.filter(&pod, &names(&["a", "b"]))), "b");
    assert_eq!(model.fgd_rebuilds(), 1);

    let mut cfg = config();
    cfg.scheduler.node_policy = Policy::FgdPack;
    let mut model = half_and_third_used(cfg);
    let outcome = model.filter(&slice_pod("p", 200, 20), &names(&["a", "b"]));
    assert_eq!(placed_on(&outcome), "b");
    assert_eq!(model.fgd_rebuilds(), 1);
}

#[test]
fn the_cluster_default_fgd_places_the_first_pod_on_an_empty_cluster() {
    let mut model = ClusterModel::new(fgd_config());
    model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
    assert!(model.workload().is_empty());
    let outcome = model.filter(&slice_pod("first", 300, 30), &names(&["n1"]));
    assert_eq!(placed_on(&outcome), "n1");
    assert_eq!(model.workload().total(), 1, "placed for its own shape");
}

#[test]
fn the_workload_grows_with_filtered_and_allocated_pods_and_shrinks_as_they_leave() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    let total = |m: &ClusterModel| m.workload().total();
    // Filtered: counted once however often it is filtered or released.
    model.filter(&slice_pod("a", 300, 30), &names(&["n1"]));
    model.filter(&slice_pod("a", 300, 30), &names(&["n1"]));
    model.release("a");
    assert_eq!(total(&model), 1);
    // Filtered without a fit: still demand, still counted.
    let big = model.filter(&slice_pod("big", 2000, 30), &names(&["n1"]));
    assert!(matches!(big, FilterOutcome::NoFit { .. }));
    assert_eq!(total(&model), 2);
    // Known from its annotations (as after a restart), seen twice.
    let mut held = allocated(slice_pod("held", 400, 40), "n1", "GPU-n1-0,NVIDIA,400,40:;");
    model.apply_pod(&held);
    model.apply_pod(&held);
    assert_eq!(total(&model), 3);
    assert_eq!(model.workload().len(), 2, "300 and 400 milli pods");
    // A CPU-only pod is not part of the GPU workload.
    let cpu_pod: Pod = serde_json::from_value(
        json!({"metadata": {"uid": "cpu"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    model.filter(&cpu_pod, &names(&["n1"]));
    assert_eq!(total(&model), 3);
    // Finished, deleted: forgotten.
    held.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
    model.apply_pod(&held);
    assert_eq!(total(&model), 2);
    model.delete_pod("a");
    model.delete_pod("a");
    // A relist that did not deliver it.
    model.reconcile_pods(&HashSet::new());
    assert_eq!(total(&model), 0);
    assert_eq!(model.pods().counted_pods().count(), 0);
    model.check().unwrap();
}

#[test]
fn consecutive_fgd_filters_see_each_others_reservations() {
    // 30 pods of 600 milli and 10 of 400 on a big node keep the
    // workload large enough that the filters below refresh the index
    // instead of rebuilding it.
    let mut model = ClusterModel::new(fgd_config());
    model.apply_node(&kube_node("big", 40, 1000)).unwrap();
    for i in 0..40 {
        let (mem, cores) = if i < 30 { (600, 60) } else { (400, 40) };
        model.apply_pod(&allocated(
            slice_pod(&format!("w{i}"), mem, cores),
            "big",
            &format!("GPU-big-{i},NVIDIA,{mem},{cores}:;"),
        ));
    }
    model.apply_node(&kube_node("x", 1, 1000)).unwrap();
    // y's node lock is held (a bind in flight there), so once p1 is
    // reserved on x both candidates have one and neither is avoided: the
    // choice below is fgd's alone.
    let mut y = kube_node("y", 1, 1000);
    y.metadata.annotations.as_mut().unwrap().insert(
        keys::NODE_LOCK.to_owned(),
        "2025-10-20T03:07:02Z,ns,on-y".to_owned(),
    );
    model.apply_node(&y).unwrap();
    model.apply_pod(&allocated(
        slice_pod("on-y", 500, 50),
        "y",
        "GPU-y-0,NVIDIA,500,50:;",
    ));
    let xy = names(&["x", "y"]);
    // p1 (600) fits only x.
    assert_eq!(
        placed_on(&model.filter(&slice_pod("p1", 600, 60), &xy)),
        "x"
    );
    assert_eq!(model.fgd_rebuilds(), 1);
    // p2 (400) fills x exactly and removes its 400 fragment; on y it
    // would leave 100 idle. Only an index that saw p1's reservation
    // knows x has a fragment to remove (a stale one shows x empty and
    // sends p2 to y).
    assert_eq!(
        placed_on(&model.filter(&slice_pod("p2", 400, 40), &xy)),
        "x"
    );
    assert_eq!(model.fgd_rebuilds(), 1, "refreshed, not rebuilt");
    // x is now full: nothing more lands there, nothing is double-booked.
    let FilterOutcome::NoFit { failed } = model.filter(&slice_pod("p3", 600, 60), &xy) else {
        panic!("expected no fit");
    };
    assert_eq!(failed["x"], "1/1 CardInsufficientMemory");
    let x = model
        .gpu_snapshot()
        .into_iter()
        .find(|g| g.node == "x")
        .unwrap();
    assert_eq!((x.used_memory_mib, x.used_cores), (1000, 100));
    // Releasing p2 is seen by the next fgd filter: x takes a 400 again.
    model.release("p2");
    assert_eq!(
        placed_on(&model.filter(&slice_pod("p4", 400, 40), &xy)),
        "x"
    );
    model.check().unwrap();
}

#[test]
fn fgd_filters_never_over_commit_a_gpu() {
    let mut model = ClusterModel::new(fgd_config());
    model.apply_node(&kube_node("n1", 2, 1000)).unwrap();
    model.apply_node(&kube_node("n2", 1, 1000)).unwrap();
    let all = names(&["n1", "n2"]);
    let mut placed = 0;
    for i in 0..12 {
        let cores = [30, 50, 20, 70][i % 4];
        let outcome = model.filter(&slice_pod(&format!("p{i}"), cores * 10, cores), &all);
        if matches!(outcome, FilterOutcome::Placed { .. }) {
            placed += 1;
        }
        for g in model.gpu_snapshot() {
            assert!(
                g.used_memory_mib <= g.memory_mib && g.used_cores <= g.cores,
                "{g:?}"
            );
        }
    }
    assert!(placed >= 5, "{placed}");
    model.check().unwrap();
}

#[test]
fn cordoned_gpus_are_skipped() {
    let mut model = ClusterModel::new(config());
    let mut node = kube_node("n1", 1, 1000);
    node.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(keys::DEVICE_CORDON.into(), "GPU-n1-0".into());
    model.apply_node(&node).unwrap();
    let FilterOutcome::NoFit { failed } = model.filter(&slice_pod("a", 100, 10), &names(&["n1"]))
    else {
        panic!("expected no fit");
    };
    assert_eq!(failed["n1"], "1/1 CardCordoned");
}

fn seen(list: &[&str]) -> HashSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_node_relist_deletes_the_nodes_it_did_not_deliver() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    model.apply_node(&kube_node("n2", 1, 1000)).unwrap();
    model.reconcile_nodes(&seen(&["n1"]));
    assert_eq!(model.node_names().collect::<Vec<_>>(), ["n1"]);
    assert_eq!(
        model
            .unregistered(&names(&["n1", "n2"]))
            .collect::<Vec<_>>(),
        ["n2"]
    );
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["n2"])),
        FilterOutcome::NoFit { .. }
    ));
    model.reconcile_nodes(&seen(&["n1"]));
    assert_eq!(
        model.node_names().count(),
        1,
        "a second relist changes nothing"
    );
}

#[test]
fn a_pod_relist_releases_vanished_allocations_and_forgets_vanished_shapes_only() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 2, 10_000)).unwrap();
    model.apply_pod(&allocated(
        slice_pod("held", 0, 0),
        "n1",
        "GPU-n1-0,NVIDIA,4000,20:;",
    ));
    model.apply_pod(&allocated(
        slice_pod("kept", 0, 0),
        "n1",
        "GPU-n1-1,NVIDIA,1000,10:;",
    ));
    assert!(matches!(
        model.filter(&slice_pod("filtered", 500, 5), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert_eq!(used(&model, "ns"), (5500, 35));
    model.reconcile_pods(&seen(&["kept"]));
    // "held" vanished: released and refunded.
    assert_eq!(model.node_of("held"), None);
    assert_eq!(model.pods().allocated_pods().collect::<Vec<_>>(), ["kept"]);
    // "filtered" (created after the list) keeps its reservation and
    // charge; only its shape is dropped from the workload.
    assert_eq!(model.node_of("filtered"), Some("n1"));
    assert!(model.decision("filtered").is_some());
    assert_eq!(used(&model, "ns"), (1500, 15));
    assert_eq!(model.pods().counted_pods().collect::<Vec<_>>(), ["kept"]);
    model.check().unwrap();
}

#[test]
fn a_quota_relist_drops_the_quotas_it_did_not_deliver() {
    let mut model = ClusterModel::new(config());
    for name in ["tight", "wide"] {
        model
            .apply_quota(&quota(
                "ns",
                name,
                json!({"limits.nvidia.com/gpumem": "1000"}),
            ))
            .unwrap();
    }
    model.reconcile_quotas(&HashSet::from([("ns".to_owned(), "wide".to_owned())]));
    assert_eq!(
        model.pods().quota_keys().collect::<Vec<_>>(),
        [("ns", "wide")]
    );
    model.reconcile_quotas(&HashSet::new());
    assert_eq!(model.quota_status("ns"), None);
}

#[test]
fn a_pod_relist_releases_what_pods_filtered_before_it_and_missing_from_it_reserved_or_were_bound_to()
 {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 16384)).unwrap();
    let all = names(&["n1"]);
    for uid in ["reserved", "bound", "kept"] {
        model.filter(&slice_pod(uid, 3000, 10), &all);
    }
    model.commit("bound").unwrap();
    model.pod_relist_started();
    // Filtered after the relist started: maybe newer than its list.
    model.filter(&slice_pod("late", 3000, 10), &all);
    model.reconcile_pods(&seen(&["kept"]));
    assert!(model.decision("reserved").is_none() && model.node_of("bound").is_none());
    assert_eq!(model.node_of("kept"), Some("n1"));
    assert_eq!(model.node_of("late"), Some("n1"));
    assert_eq!(
        model.pods().counted_pods().count(),
        1,
        "only kept's shape counts"
    );
    model.check().unwrap();
}

// === the handshake: which GPU nodes are offered, as time passes ===

const NOW: i64 = 1_752_282_740; // 2025-07-12 01:12:20 UTC

/// `node` with this handshake value and allocatable `nvidia.com/gpu`.
fn handshaken(mut node: KubeNode, handshake: Option<&str>, allocatable: Option<&str>) -> KubeNode {
    if let Some(h) = handshake {
        node.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(keys::NODE_HANDSHAKE.into(), h.into());
    }
    node.status = Some(
        serde_json::from_value(json!({"allocatable":
            allocatable.map_or(json!({}), |a| json!({"nvidia.com/gpu": a}))}))
        .unwrap(),
    );
    node
}

fn refusal(outcome: &FilterOutcome, node: &str) -> String {
    match outcome {
        FilterOutcome::NoFit { failed } => failed[node].clone(),
        other => panic!("expected no fit, got {other:?}"),
    }
}

#[test]
fn a_node_whose_request_expired_without_allocatable_gpus_is_withdrawn_at_the_models_clock() {
    let mut model = ClusterModel::new(config());
    model.advance_clock(NOW);
    // Stamped 20 s ago; its device plugin advertises nothing yet.
    let stamped = handshaken(
        kube_node("n1", 1, 1000),
        Some("Requesting_2025-07-12 01:12:00"),
        Some("0"),
    );
    model.apply_node(&stamped).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert!(model.release("a"));
    // No node event: the window simply ends.
    assert_eq!(model.advance_clock(NOW + 40), ["n1".to_owned()]);
    let outcome = model.filter(&slice_pod("a", 100, 10), &names(&["n1"]));
    assert_eq!(refusal(&outcome, "n1"), "node unregistered");
    assert_eq!(model.unregistered(&names(&["n1"])).count(), 1);
    // Its device plugin comes up: offered at once, before any new stamp.
    model
        .apply_node(&handshaken(
            kube_node("n1", 1, 1000),
            Some("Requesting_2025-07-12 01:12:00"),
            Some("10"),
        ))
        .unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 100, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    model.check().unwrap();
}

#[test]
fn an_expired_request_seen_by_the_watch_withdraws_at_once_unless_gpus_are_allocatable() {
    let mut model = ClusterModel::new(config());
    model.advance_clock(NOW);
    let old = Some("Requesting_2025-07-12 01:00:00");
    model
        .apply_node(&handshaken(kube_node("dead", 1, 1000), old, Some("0")))
        .unwrap();
    model
        .apply_node(&handshaken(kube_node("absent", 1, 1000), old, None))
        .unwrap();
    model
        .apply_node(&handshaken(kube_node("alive", 1, 1000), old, Some("10")))
        .unwrap();
    // Never stamped yet: HAMi counts it healthy (and stamps it).
    model
        .apply_node(&handshaken(kube_node("new", 1, 1000), None, Some("0")))
        .unwrap();
    let all = names(&["dead", "absent", "alive", "new"]);
    let FilterOutcome::Placed { failed, .. } = model.filter(&slice_pod("a", 100, 10), &all) else {
        panic!("expected a placement");
    };
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(failed["dead"], "node unregistered");
    assert_eq!(failed["absent"], "node unregistered");
    assert!(model.handshake_of("new").unwrap().needs_request());
    assert!(!model.handshake_of("alive").unwrap().needs_request());
}

#[test]
fn a_node_whose_allocatable_falls_to_zero_is_withdrawn_and_keeps_its_pods_for_its_return() {
    let mut model = ClusterModel::new(config());
    model.advance_clock(NOW);
    let fresh = Some("Requesting_2025-07-12 01:12:10");
    model
        .apply_node(&handshaken(kube_node("n1", 1, 1000), fresh, Some("10")))
        .unwrap();
    model.apply_pod(&allocated(
        slice_pod("held", 600, 10),
        "n1",
        "GPU-n1-0,NVIDIA,600,10:;",
    ));
    // The device plugin stops: withdrawn at once, though the stamp is fresh.
    model
        .apply_node(&handshaken(kube_node("n1", 1, 1000), fresh, Some("0")))
        .unwrap();
    let outcome = model.filter(&slice_pod("a", 100, 10), &names(&["n1"]));
    assert_eq!(refusal(&outcome, "n1"), "node unregistered");
    assert!(
        model.gpu_snapshot().is_empty(),
        "its GPUs leave the metrics"
    );
    // It comes back: the pod on it still holds its 600 MiB.
    model
        .apply_node(&handshaken(kube_node("n1", 1, 1000), fresh, Some("10")))
        .unwrap();
    let outcome = model.filter(&slice_pod("b", 600, 10), &names(&["n1"]));
    assert_eq!(refusal(&outcome, "n1"), "1/1 CardInsufficientMemory");
    assert_eq!(model.gpu_snapshot()[0].used_memory_mib, 600);
    assert!(matches!(
        model.filter(&slice_pod("c", 400, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    model.check().unwrap();
}

// === dry runs: Cluster Autoscaler's Node objects ===

/// `node` renamed, as Cluster Autoscaler names a template copied from it.
fn renamed(mut node: KubeNode, name: &str) -> KubeNode {
    node.metadata.name = Some(name.to_owned());
    node
}

#[test]
fn a_dry_run_passes_a_template_node_and_reserves_writes_and_counts_nothing() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    let gpus = model.gpu_snapshot();
    let workload = model.workload().clone();
    let template = kube_node("template-node-for-pool-a-1234", 1, 16384);
    let outcome = model.dry_run(&slice_pod("p", 8000, 50), &[template]);
    assert_eq!(
        outcome,
        DryRun::Checked {
            fits: vec![0],
            failed: BTreeMap::new()
        }
    );
    assert!(model.decision("p").is_none(), "nothing for a bind to find");
    assert_eq!(model.gpu_snapshot(), gpus, "usage unchanged");
    assert_eq!(*model.workload(), workload, "not counted as demand");
    assert!(
        model
            .cluster()
            .node_id("template-node-for-pool-a-1234")
            .is_none()
    );
    model.check().unwrap();
}

#[test]
fn a_dry_run_gives_hami_reasons_for_nodes_the_pod_does_not_fit() {
    let model = ClusterModel::new(config());
    let small = kube_node("small", 2, 1000);
    let bare: KubeNode = serde_json::from_value(json!({"metadata": {"name": "bare"}})).unwrap();
    let broken: KubeNode = serde_json::from_value(json!({"metadata": {"name": "broken",
        "annotations": {keys::NODE_NVIDIA_REGISTER: "[{\"id\":"}}}))
    .unwrap();
    let deleted = handshaken(
        kube_node("deleted", 1, 16384),
        Some("Deleted_2025-07-12 01:12:20"),
        Some("1"),
    );
    let big = kube_node("big", 1, 16384);
    let DryRun::Checked { fits, failed } = model.dry_run(
        &slice_pod("p", 2000, 10),
        &[small, bare, broken, deleted, big],
    ) else {
        panic!("expected a check");
    };
    assert_eq!(fits, [4]);
    assert_eq!(failed["small"], "2/2 CardInsufficientMemory");
    assert_eq!(failed["bare"], "node unregistered");
    assert!(
        failed["broken"].starts_with("node register annotation does not decode"),
        "{}",
        failed["broken"]
    );
    assert_eq!(failed["deleted"], "node unregistered");
    assert_eq!(
        model.dry_run(&pod_without_gpu(), &[kube_node("x", 1, 1)]),
        DryRun::NoGpuRequested
    );
}

fn pod_without_gpu() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "plain", "namespace": "ns", "uid": "plain"},
        "spec": {"containers": [{"name": "c"}]}
    }))
    .unwrap()
}

#[test]
fn a_dry_run_on_a_real_node_counts_its_usage_but_not_the_pods_own_reservation() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("a", 600, 10), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    let real = kube_node("n1", 1, 1000);
    // Another pod: the 600 MiB reserved on n1 count.
    let DryRun::Checked { fits, failed } = model.dry_run(
        &slice_pod("b", 600, 10),
        &[real.clone(), renamed(real.clone(), "template-n1")],
    ) else {
        panic!("expected a check");
    };
    assert_eq!(fits, [1], "only the empty template fits");
    assert_eq!(failed["n1"], "1/1 CardInsufficientMemory");
    // The pod itself: its own reservation is not in its way.
    assert_eq!(
        model.dry_run(&slice_pod("a", 600, 10), std::slice::from_ref(&real)),
        DryRun::Checked {
            fits: vec![0],
            failed: BTreeMap::new()
        }
    );
    assert_eq!(model.decision("a").map(|d| d.node.as_str()), Some("n1"));
    model.check().unwrap();
}

/// Item 14.2: an invalid `hami.io/device-scoring-weights` makes the filter
/// answer an error naming the annotation and the bad part (HAMi v2.10
/// `calcScoreWithOptions` returns `GetDeviceScoringWeightsByPod`'s error).
#[test]
fn invalid_scoring_weights_are_an_error_naming_the_annotation_and_the_part() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    let pod = annotated(
        slice_pod("w", 100, 10),
        keys::DEVICE_SCORING_WEIGHTS,
        "slot=1,core=1,mem=3",
    );
    let FilterOutcome::Invalid(why) = model.filter(&pod, &names(&["n1"])) else {
        panic!("expected invalid");
    };
    assert_eq!(
        why,
        "invalid hami.io/device-scoring-weights annotation \"slot=1,core=1,mem=3\": unknown weight \"mem\""
    );
    let ok = annotated(
        slice_pod("w", 100, 10),
        keys::DEVICE_SCORING_WEIGHTS,
        "slot=1,core=1,memory=3",
    );
    assert_eq!(placed_on(&model.filter(&ok, &names(&["n1"]))), "n1");
}

/// Item 14.1: the pair scores of `hami.io/node-nvidia-score` reach the
/// core's `topology-aware` pick; a node without them still registers, and
/// one whose scores do not decode keeps what it had.
#[test]
fn pair_scores_from_the_node_steer_topology_aware_pods() {
    let mut model = ClusterModel::new(config());
    let mut node = kube_node("n1", 3, 1000);
    model.apply_node(&node).unwrap();
    let pod = |uid: &str| {
        annotated(
            with_limit(slice_pod(uid, 100, 10), "nvidia.com/gpu", "2"),
            keys::GPU_SCHEDULER_POLICY,
            "topology-aware",
        )
    };
    // No scores: the first two walked (spread order, ties by index: 2, 1).
    let FilterOutcome::Placed { devices, .. } = model.filter(&pod("t1"), &names(&["n1"])) else {
        panic!("expected a placement");
    };
    assert_eq!(
        devices.to_string(),
        "GPU-n1-2,NVIDIA,100,10:GPU-n1-1,NVIDIA,100,10:;"
    );
    model.release("t1");
    // GPUs 0 and 2 are NVLinked.
    node.metadata.annotations.as_mut().unwrap().insert(
        keys::NODE_NVIDIA_SCORE.into(),
        r#"[{"uuid":"GPU-n1-0","score":{"GPU-n1-1":10,"GPU-n1-2":200}},{"uuid":"GPU-n1-1","score":{"GPU-n1-0":10,"GPU-n1-2":10}},{"uuid":"GPU-n1-2","score":{"GPU-n1-0":200,"GPU-n1-1":10}}]"#.into(),
    );
    model.apply_node(&node).unwrap();
    let FilterOutcome::Placed { devices, .. } = model.filter(&pod("t2"), &names(&["n1"])) else {
        panic!("expected a placement");
    };
    assert_eq!(
        devices.to_string(),
        "GPU-n1-2,NVIDIA,100,10:GPU-n1-0,NVIDIA,100,10:;"
    );
    node.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(keys::NODE_NVIDIA_SCORE.into(), "[{".into());
    let err = model.apply_node(&node).unwrap_err();
    assert!(
        err.to_string().starts_with("hami.io/node-nvidia-score: "),
        "{err}"
    );
    assert_eq!(model.cluster().node(0).unwrap().pair_score(0, 2), 200);
}

// === MIG ===

/// A node with one A100-40GB in `mig` mode.
fn mig_kube_node(name: &str) -> KubeNode {
    let device = NodeDevice {
        id: format!("GPU-{name}-0"),
        index: 0,
        count: 7,
        devmem: 40960,
        devcore: 100,
        device_type: "NVIDIA A100-SXM4-40GB".into(),
        numa: 0,
        mode: "mig".into(),
        health: true,
        mig_profiles: proto::hami::mig::known_profiles("NVIDIA A100-SXM4-40GB").unwrap(),
    };
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        keys::NODE_NVIDIA_REGISTER: register::encode_json(&[device]).unwrap()
    }}}))
    .unwrap()
}

fn mig_pod(uid: &str, mem: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string()}}}]}
    }))
    .unwrap()
}

fn instances(model: &ClusterModel, uid: &str) -> Vec<(String, u32, u32)> {
    model
        .decision(uid)
        .map(|d| {
            d.mig
                .iter()
                .map(|a| (a.profile.clone(), a.placement.start, a.placement.size))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_filter_on_a_mig_gpu_decides_the_instance_the_bind_writes() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&mig_kube_node("n1")).unwrap();
    assert!(matches!(
        model.filter(&mig_pod("a", 8000), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert_eq!(instances(&model, "a"), [("2g.10gb".to_owned(), 0, 2)]);
    let decided = model.decision("a").unwrap();
    assert_eq!(
        proto::hami::mig::encode_allocations(&decided.mig),
        r#"[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"2g.10gb","placement":{"start":0,"size":2}}]"#
    );
    // A pod on a GPU in hami-core mode decides no instance.
    model.apply_node(&kube_node("t", 1, 16000)).unwrap();
    assert!(matches!(
        model.filter(&slice_pod("b", 1000, 10), &names(&["t"])),
        FilterOutcome::Placed { .. }
    ));
    assert!(model.decision("b").unwrap().mig.is_empty());
    model.check().unwrap();
}

#[test]
fn an_allocated_pod_holds_the_placement_its_mig_annotation_names() {
    // After a restart the model learns an allocation whose 2g.10gb sits at
    // slices 4-5 (the node's choice, or an earlier bind order): derived
    // from vgpu-devices-allocated alone it would be put at 0-1.
    let old = |mig: &str| {
        let mut pod = allocated(mig_pod("old", 8000), "n1", "GPU-n1-0,NVIDIA,10240,28:;");
        pod.metadata.annotations.as_mut().unwrap().insert(
            keys::VGPU_MIG_ALLOCATIONS.to_owned(),
            format!(
                r#"[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-n1-0","profile":"2g.10gb","placement":{mig}}}]"#
            ),
        );
        pod
    };
    let mut model = ClusterModel::new(config());
    model.apply_node(&mig_kube_node("n1")).unwrap();
    model.apply_pod(&old(r#"{"start":4,"size":2}"#));
    assert_eq!(model.cluster().node(0).unwrap().mig_slices[0], 0b0011_0000);
    assert!(matches!(
        model.filter(&mig_pod("b", 8000), &names(&["n1"])),
        FilterOutcome::Placed { .. }
    ));
    assert_eq!(instances(&model, "b"), [("2g.10gb".to_owned(), 0, 2)]);
    // A 3g.20gb no longer fits: slices 0-3 and 4-7 are both cut into.
    let FilterOutcome::NoFit { failed } = model.filter(&mig_pod("c", 20000), &names(&["n1"]))
    else {
        panic!("expected no fit");
    };
    assert_eq!(failed["n1"], "1/1 CardMigTopologyInfeasible");

    // A placement the profile does not offer is not believed: the
    // instance is derived as without the annotation.
    let mut model = ClusterModel::new(config());
    model.apply_node(&mig_kube_node("n1")).unwrap();
    model.apply_pod(&old(r#"{"start":1,"size":2}"#));
    assert_eq!(model.cluster().node(0).unwrap().mig_slices[0], 0b0000_0011);
    model.check().unwrap();
}

/// When every fitting node has binds queued, binpack's fullest node is not
/// piled onto: the pod goes to one of the nodes with the fewest, so a
/// burst larger than the cluster's node count takes turns over all the
/// nodes' locks (at 100 nodes on the real API server, piling onto one node
/// made its binds outlast their lock wait).
#[test]
fn when_every_node_has_binds_queued_the_least_queued_is_chosen() {
    let mut model = ClusterModel::new(config());
    for n in ["n1", "n2", "n3"] {
        model.apply_node(&kube_node(n, 1, 10_000)).unwrap();
    }
    let all = names(&["n1", "n2", "n3"]);
    // One pod reserved on each node: every node has one bind queued.
    let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..3 {
        let placed = model.filter(&slice_pod(&format!("a{i}"), 100, 1), &all);
        *per_node.entry(placed_on(&placed).to_owned()).or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![1, 1, 1]
    );
    // Six more: binpack alone would put all six on the fullest node; with
    // the queues counted they take turns, two per node.
    for i in 0..6 {
        let placed = model.filter(&slice_pod(&format!("b{i}"), 100, 1), &all);
        *per_node.entry(placed_on(&placed).to_owned()).or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
    model.check().unwrap();
}

#[test]
fn a_node_with_a_bind_in_flight_is_chosen_only_when_no_other_fits() {
    // binpack (the default): the fullest node wins, so a burst would queue
    // on one node's lock.
    let mut model = ClusterModel::new(config());
    for n in ["n1", "n2"] {
        model.apply_node(&kube_node(n, 1, 1000)).unwrap();
    }
    let both = names(&["n1", "n2"]);
    let first = model.filter(&slice_pod("a", 300, 10), &both);
    let a_node = placed_on(&first).to_owned();
    let other = if a_node == "n1" { "n2" } else { "n1" };
    // a is reserved, then bound: its bind is in flight; b goes elsewhere.
    assert_eq!(
        placed_on(&model.filter(&slice_pod("b", 300, 10), &both)),
        other
    );
    model.commit("a").unwrap();
    assert_eq!(
        placed_on(&model.filter(&slice_pod("b", 300, 10), &both)),
        other
    );
    model.check().unwrap();
    // Once a's annotations are seen (bound, allocating) its node is free
    // of binds in flight, and binpack picks the fuller node again.
    let devices = format!("GPU-{a_node}-0,NVIDIA,300,10:;");
    model.apply_pod(&allocated(slice_pod("a", 300, 10), &a_node, &devices));
    model.apply_pod(&allocated(
        slice_pod("b", 300, 10),
        other,
        &format!("GPU-{other}-0,NVIDIA,300,10:;"),
    ));
    let c = model.filter(&slice_pod("c", 300, 10), &both);
    let c_node = placed_on(&c).to_owned();
    // Both hold 300 MiB now; with c reserved on one, d goes to the other.
    let d = model.filter(&slice_pod("d", 300, 10), &both);
    assert_ne!(placed_on(&d), c_node);
    model.check().unwrap();
    // The node lock the watch shows counts as a bind in flight too.
    let mut model = ClusterModel::new(config());
    model.apply_node(&kube_node("n1", 1, 1000)).unwrap();
    let mut locked = kube_node("n2", 1, 1000);
    locked.metadata.annotations.as_mut().unwrap().insert(
        keys::NODE_LOCK.to_owned(),
        "2025-10-20T03:07:02Z,ns,x".to_owned(),
    );
    model.apply_node(&locked).unwrap();
    // n2 locked: n1, though both are empty.
    for i in 0..3 {
        let uid = format!("e{i}");
        assert_eq!(
            placed_on(&model.filter(&slice_pod(&uid, 300, 10), &both)),
            "n1"
        );
        model.apply_pod(&allocated(
            slice_pod(&uid, 300, 10),
            "n1",
            "GPU-n1-0,NVIDIA,300,10:;",
        ));
    }
    // n1 is full: the locked node is chosen rather than none.
    assert_eq!(
        placed_on(&model.filter(&slice_pod("f", 300, 10), &both)),
        "n2"
    );
    // The lock released: no longer avoided.
    model.apply_node(&kube_node("n2", 1, 1000)).unwrap();
    assert!(model.locked.is_empty());
}

/// A GPU node with 16 cores and 64 GiB allocatable.
fn host_node(name: &str, gpus: u32) -> KubeNode {
    let mut node = kube_node(name, gpus, 1000);
    node.status = Some(
        serde_json::from_value(
            json!({"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}),
        )
        .unwrap(),
    );
    node
}

/// `pod` on `node` (`spec.nodeName`), asking `cpu` of it.
fn on_node_asking(mut pod: Pod, node: &str, cpu: &str) -> Pod {
    let spec = pod.spec.as_mut().unwrap();
    if !node.is_empty() {
        spec.node_name = Some(node.to_owned());
    }
    spec.containers[0]
        .resources
        .get_or_insert_with(Default::default)
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.into()),
        );
    pod
}

fn cpu_only_pod(uid: &str) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"uid": uid, "namespace": "ns", "name": uid}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap()
}

fn free_cpu(model: &ClusterModel, node: &str) -> Option<u64> {
    let id = model.cluster().node_id(node)?;
    model
        .cluster()
        .node(id)?
        .free_cpu_memory()
        .map(|(cpu, _)| cpu)
}

/// The extender counts the CPU of every pod on a node, GPU or not, against
/// the node's allocatable: `fgdpack` then keeps a CPU-heavy GPU pod off the
/// node whose CPU is nearly gone, though that node is fuller in GPUs (which
/// is where it went while the extender saw no CPU).
#[test]
fn fgdpack_in_serve_weighs_the_cpu_every_pod_takes_of_its_node() {
    let mut cfg = config();
    cfg.scheduler.node_policy = Policy::FgdPack;
    let mut model = ClusterModel::new(cfg);
    // A pod seen before its node: counted once the node arrives.
    model.apply_pod(&on_node_asking(cpu_only_pod("batch"), "a", "11"));
    model.apply_node(&host_node("a", 4)).unwrap();
    model.apply_node(&host_node("b", 4)).unwrap();
    model.apply_pod(&on_node_asking(
        allocated(
            slice_pod("on-a", 1000, 100),
            "a",
            "GPU-a-0,NVIDIA,1000,100:;",
        ),
        "a",
        "1",
    ));
    assert_eq!(free_cpu(&model, "a"), Some(4000));
    assert_eq!(free_cpu(&model, "b"), Some(16_000));
    model.check().unwrap();

    let heavy = on_node_asking(slice_pod("heavy", 1000, 100), "", "4");
    assert_eq!(placed_on(&model.filter(&heavy, &names(&["a", "b"]))), "b");

    // Once the batch pod finishes, a has the CPU again and, fuller in GPUs,
    // wins the next such pod.
    let mut done = on_node_asking(cpu_only_pod("batch"), "a", "11");
    done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
    model.apply_pod(&done);
    assert_eq!(free_cpu(&model, "a"), Some(15_000));
    let next = on_node_asking(slice_pod("next", 1000, 100), "", "4");
    assert_eq!(placed_on(&model.filter(&next, &names(&["a", "b"]))), "a");
    model.check().unwrap();
}

/// A GPU pod asking more CPU than a node has free does not fit there, and
/// says why; a deleted pod gives its CPU back, and a node's allocatable
/// change is seen.
#[test]
fn a_gpu_pod_needs_the_nodes_free_cpu_and_a_deleted_pod_frees_it() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&host_node("a", 1)).unwrap();
    model.apply_pod(&on_node_asking(cpu_only_pod("web"), "a", "15"));
    let big = on_node_asking(slice_pod("big", 500, 50), "", "2");
    let FilterOutcome::NoFit { failed } = model.filter(&big, &names(&["a"])) else {
        panic!("expected no fit");
    };
    assert_eq!(failed["a"], "Insufficient cpu", "kube-scheduler's words");
    model.delete_pod("web");
    assert_eq!(free_cpu(&model, "a"), Some(16_000));
    assert_eq!(placed_on(&model.filter(&big, &names(&["a"]))), "a");
    // Allocatable CPU shrinks to 1 core: the next 2-core pod does not fit.
    let mut small = host_node("a", 1);
    small.status = Some(
        serde_json::from_value(json!({"allocatable": {"cpu": "1", "memory": "64Gi"}})).unwrap(),
    );
    model.apply_node(&small).unwrap();
    let other = on_node_asking(slice_pod("other", 100, 10), "", "2");
    assert!(matches!(
        model.filter(&other, &names(&["a"])),
        FilterOutcome::NoFit { .. }
    ));
    // A pod on the node that a relist no longer delivers frees its CPU.
    model.apply_pod(&on_node_asking(cpu_only_pod("gone"), "a", "500m"));
    model.pod_relist_started();
    model.reconcile_pods(&HashSet::new());
    assert_eq!(free_cpu(&model, "a"), Some(1000));
    model.check().unwrap();
}

/// A relist that does not deliver a pod filtered after it started (its
/// LIST may predate the pod) leaves the CPU that pod reserved counted;
/// a pod filtered before it started and missing from it gives its CPU back.
#[test]
fn a_pod_filtered_during_a_relist_keeps_its_cpu_when_the_relist_misses_it() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&host_node("a", 2)).unwrap();
    let early = on_node_asking(slice_pod("early", 100, 10), "", "4");
    let late = on_node_asking(slice_pod("late", 100, 10), "", "6");
    assert_eq!(placed_on(&model.filter(&early, &names(&["a"]))), "a");
    model.pod_relist_started();
    assert_eq!(placed_on(&model.filter(&late, &names(&["a"]))), "a");
    assert_eq!(free_cpu(&model, "a"), Some(6000));
    model.reconcile_pods(&HashSet::new());
    assert_eq!(
        free_cpu(&model, "a"),
        Some(10_000),
        "early's 4 cores are back, late's 6 still taken"
    );
    assert!(model.decision("late").is_some());
    model.check().unwrap();
}

/// A reserved pod holds its CPU from its filter, as kube-scheduler's
/// assumed pod does: the next filter in a burst sees it. Filtered again,
/// it is counted once; a failed bind gives it back; its bound event
/// changes nothing.
#[test]
fn a_reserved_pod_holds_its_cpu_until_its_bind_fails() {
    let mut model = ClusterModel::new(config());
    model.apply_node(&host_node("a", 2)).unwrap();
    let first = on_node_asking(slice_pod("first", 100, 10), "", "10");
    let second = on_node_asking(slice_pod("second", 100, 10), "", "10");
    assert_eq!(placed_on(&model.filter(&first, &names(&["a"]))), "a");
    assert_eq!(free_cpu(&model, "a"), Some(6000));
    let FilterOutcome::NoFit { failed } = model.filter(&second, &names(&["a"])) else {
        panic!("the first pod's 10 cores are taken");
    };
    assert_eq!(failed["a"], "Insufficient cpu");
    assert_eq!(placed_on(&model.filter(&first, &names(&["a"]))), "a");
    assert_eq!(free_cpu(&model, "a"), Some(6000), "counted once");
    assert!(model.release("first"));
    assert_eq!(free_cpu(&model, "a"), Some(16_000));
    assert_eq!(placed_on(&model.filter(&second, &names(&["a"]))), "a");
    model.commit("second").unwrap();
    model.apply_pod(&on_node_asking(second.clone(), "a", "10"));
    assert_eq!(free_cpu(&model, "a"), Some(6000));
    model.check().unwrap();
}

/// `fgdpack` in `serve` finds the rare multi-GPU shapes from the live
/// workload and nodes: once a pod asking 4 whole GPUs and 24 cores is
/// placed, which only "big" (32 cores; the other 4-GPU nodes have 16) could
/// host, the index guards that shape. A node with more CPU joining does not
/// change the guard until the index is rebuilt; a shape new to the
/// workload rebuilds it: with two hosts of five nodes the shape is still
/// guarded, with three of six it is not.
#[test]
fn fgdpack_in_serve_guards_a_multi_gpu_shape_few_nodes_can_host() {
    let mut cfg = config();
    cfg.scheduler.node_policy = Policy::FgdPack;
    let mut model = ClusterModel::new(cfg);
    let mut big = host_node("big", 4);
    big.status = Some(
        serde_json::from_value(json!({"allocatable": {"cpu": "32", "memory": "64Gi"}})).unwrap(),
    );
    model.apply_node(&big).unwrap();
    for name in ["s1", "s2", "s3"] {
        model.apply_node(&host_node(name, 4)).unwrap();
    }
    let whole4 = with_limit(
        on_node_asking(slice_pod("whole4", 1000, 100), "", "24"),
        "nvidia.com/gpu",
        "4",
    );
    let all = names(&["big", "s1", "s2", "s3"]);
    assert_eq!(placed_on(&model.filter(&whole4, &all)), "big");
    let guarded = |model: &mut ClusterModel| {
        let cluster = model.cluster.clone();
        model
            .pods
            .fgd_index(&cluster)
            .guarded_shapes()
            .iter()
            .map(|s| (s.gpus, s.cpu_milli))
            .collect::<Vec<_>>()
    };
    assert_eq!(guarded(&mut model), vec![(4, 24_000)]);
    // A second 32-core node: two hosts of five, still fewer than half.
    let mut big2 = big.clone();
    big2.metadata.name = Some("big2".into());
    model.apply_node(&big2).unwrap();
    let half = on_node_asking(slice_pod("half", 500, 50), "", "2");
    assert_eq!(placed_on(&model.filter(&half, &names(&["s1"]))), "s1");
    assert_eq!(guarded(&mut model), vec![(4, 24_000)]);
    // A third: three of six, not fewer than half, once a new shape
    // rebuilds the index.
    let mut big3 = big.clone();
    big3.metadata.name = Some("big3".into());
    model.apply_node(&big3).unwrap();
    assert_eq!(guarded(&mut model), vec![(4, 24_000)], "not rebuilt yet");
    let third = on_node_asking(slice_pod("third", 300, 30), "", "3");
    assert_eq!(placed_on(&model.filter(&third, &names(&["s2"]))), "s2");
    assert_eq!(guarded(&mut model), Vec::<(u32, u64)>::new());
    model.check().unwrap();
}

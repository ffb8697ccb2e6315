//! Resident memory of the scheduler's model at scale: N nodes × 8 GPUs
//! (HAMi register annotations) and M pods holding slices, loaded through
//! the same [`ClusterModel`] API the service's watchers feed, then one
//! `fgd` filter over every node (which builds the fragmentation index).
//! Prints the process's RSS (`VmRSS`) and peak (`VmHWM`) after each step.
//!
//! Run: `cargo bench -p scheduler-webhook --bench memory`
//! (`-- --nodes 10000 --pods 80000` are the defaults).
//!
//! Objects are built, applied and dropped one at a time, as the watch
//! delivers them, so the figures are the model's, not the input's.

use std::fs;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use proto::hami::keys;
use proto::hami::register::{self, NodeDevice};
use scheduler_webhook::cache::model::{ClusterModel, FilterOutcome, ModelConfig};
use scheduler_webhook::core::policy::SchedulerConfig;
use scheduler_webhook::core::request::RequestConfig;
use serde_json::json;

const GPUS_PER_NODE: u32 = 8;
const DEVMEM: u32 = 40_960;

/// `VmRSS` and `VmHWM` of this process, MiB.
fn rss_mib() -> (f64, f64) {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(step: &str) {
    let (rss, hwm) = rss_mib();
    println!("{step:<44} VmRSS {rss:>7.1} MiB   VmHWM {hwm:>7.1} MiB");
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

fn kube_node(name: &str) -> KubeNode {
    let devices: Vec<NodeDevice> = (0..GPUS_PER_NODE)
        .map(|i| NodeDevice {
            id: format!("GPU-{name}-{i}"),
            index: i,
            count: 10,
            devmem: DEVMEM,
            devcore: 100,
            device_type: "NVIDIA-NVIDIA A100-SXM4-40GB".to_owned(),
            numa: i / 4,
            mode: "hami-core".to_owned(),
            health: true,
            mig_profiles: Vec::new(),
        })
        .collect();
    let value = json!({"metadata": {"name": name, "uid": format!("uid-{name}"),
        "annotations": {keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap_or_default()}},
        "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "80"},
                   "capacity": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "80"}}});
    serde_json::from_value(value).unwrap_or_default()
}

/// Pod `i`: one container holding a slice of GPU `i % 8` of node `i / per_node`,
/// sizes varying over a few shapes as a real workload's would.
fn slice_pod(i: usize, per_node: usize) -> Pod {
    let node = node_name(i / per_node);
    let gpu = i % per_node % GPUS_PER_NODE as usize;
    let (mem, cores) = [(4096, 10), (8192, 20), (10240, 25), (2048, 5)][i % 4];
    let value = json!({
        "metadata": {"name": format!("job-{i:06}"), "namespace": format!("team-{}", i % 50),
            "uid": format!("0000{i:06}-aaaa-bbbb-cccc-{i:012}"),
            "annotations": {
                keys::VGPU_NODE: node,
                keys::VGPU_DEVICES_ALLOCATED: format!("GPU-{node}-{gpu},NVIDIA,{mem},{cores}:;"),
                keys::BIND_PHASE: "success"}},
        "spec": {"nodeName": node, "schedulerName": "gpuslice-scheduler",
            "containers": [{"name": "main", "image": "registry.example/ml/train:1.0",
                "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()},
                    "requests": {"cpu": "1", "memory": "2Gi"}}}]},
        "status": {"phase": "Running"}});
    serde_json::from_value(value).unwrap_or_default()
}

fn fgd_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid",
            "annotations": {keys::NODE_SCHEDULER_POLICY: "fgd"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}}}]}
    }))
    .unwrap_or_default()
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nodes = arg(&args, "--nodes", 10_000).max(1);
    let pods = arg(&args, "--pods", 80_000);
    report("start");
    let mut model = ClusterModel::new(ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 1,
    });
    for i in 0..nodes {
        if let Err(e) = model.apply_node(&kube_node(&node_name(i))) {
            eprintln!("node {i}: {e}");
        }
    }
    report(&format!("{nodes} nodes × {GPUS_PER_NODE} GPUs applied"));
    let per_node = pods.div_ceil(nodes).max(1);
    for i in 0..pods {
        model.apply_pod(&slice_pod(i, per_node));
    }
    report(&format!("{pods} pods applied"));
    let names: Vec<String> = (0..nodes).map(node_name).collect();
    let placed = matches!(
        model.filter(&fgd_pod(), &names),
        FilterOutcome::Placed { .. }
    );
    report(&format!(
        "one fgd filter over {nodes} nodes (placed: {placed})"
    ));
    let used: u64 = model
        .gpu_snapshot()
        .iter()
        .map(|g| u64::from(g.used_slots))
        .sum();
    println!(
        "model: {} nodes, {} GPUs, {used} slots in use, {} pods counted in the fgd workload",
        model.cluster().nodes().len(),
        model.cluster().gpu_count(),
        model.workload().total()
    );
    if let Err(e) = model.check() {
        eprintln!("model check failed: {e}");
    }
}

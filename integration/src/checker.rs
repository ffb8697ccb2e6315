//! The independent checker: verifies a cluster's GPU sharing from what a
//! real cluster would show — pod annotations, node annotations, and the
//! Allocate replies the (fake) kubelet recorded — never from gpuslice's own
//! state.
//!
//! It checks that
//! - no GPU holds more memory, cores or slots than its node registered;
//! - every allocated container's HAMi-core limits (env) equal its
//!   `vgpu-devices-allocated` entry;
//! - every bound GPU pod finished allocation (`bind-phase=success`, no
//!   device entries left in `vgpu-devices-to-allocate`) or failed with a reason.
//!
//! It decodes with its own reading of the protocol (the spec's text), not
//! with the codecs under test, so a codec bug cannot hide itself.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

use crate::fake_kubelet::{ALLOCATIONS_ANNOTATION, ContainerAllocation};

const REGISTER: &str = "hami.io/node-nvidia-register";
const ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
const TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";
const BIND_PHASE: &str = "hami.io/bind-phase";

/// One device entry: uuid, memory MiB, cores %.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    uuid: String,
    mem: u64,
    cores: u64,
}

/// What a GPU registered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Capacity {
    node: String,
    slots: u64,
    mem: u64,
    cores: u64,
    healthy: bool,
}

/// A GPU holding more than it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverCommit {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
    /// What is over: `memory`, `cores` or `slots`.
    pub what: &'static str,
    /// Sum held by live pods.
    pub used: u64,
    /// Registered capacity.
    pub capacity: u64,
}

/// A container whose limits differ from its annotation, or a pod that did
/// not finish allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// `namespace/name`.
    pub pod: String,
    /// Container name (empty for a pod-level problem).
    pub container: String,
    /// What differs.
    pub why: String,
}

/// The checker's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// GPUs over capacity.
    pub overcommitted: Vec<OverCommit>,
    /// Containers whose env differs from their annotation.
    pub mismatched: Vec<Mismatch>,
    /// Bound GPU pods that neither finished allocation nor failed with a reason.
    pub unfinished: Vec<Mismatch>,
}

impl Report {
    /// Whether nothing is wrong.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.overcommitted.is_empty() && self.mismatched.is_empty() && self.unfinished.is_empty()
    }
}

/// Parses `UUID,NVIDIA,mem,cores:` entries per `;`-terminated container.
fn parse_pod_devices(value: &str) -> Option<Vec<Vec<Entry>>> {
    let mut containers: Vec<&str> = value.split(';').collect();
    // n containers are n `;`-terminated pieces: drop the piece after the last `;`.
    if containers.last() == Some(&"") {
        containers.pop();
    }
    containers
        .into_iter()
        .map(|c| {
            c.split(':')
                .filter(|d| d.contains(','))
                .map(|d| {
                    let f: Vec<&str> = d.split(',').collect();
                    Some(Entry {
                        uuid: (*f.first()?).to_owned(),
                        mem: f.get(2)?.parse().ok()?,
                        cores: f.get(3)?.parse().ok()?,
                    })
                })
                .collect()
        })
        .collect()
}

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn capacities(nodes: &[Node]) -> HashMap<String, Capacity> {
    let mut out = HashMap::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(value) = annotation(&node.metadata, REGISTER) else {
            continue;
        };
        let Ok(serde_json::Value::Array(devices)) = serde_json::from_str(value) else {
            continue;
        };
        for d in devices {
            let num = |k: &str| d.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            if let Some(id) = d.get("id").and_then(serde_json::Value::as_str) {
                out.insert(
                    id.to_owned(),
                    Capacity {
                        node: name.clone(),
                        slots: num("count"),
                        mem: num("devmem"),
                        cores: num("devcore"),
                        // HAMi leaves `health` out when false (omitempty).
                        healthy: d.get("health").and_then(serde_json::Value::as_bool) == Some(true),
                    },
                );
            }
        }
    }
    out
}

/// A pod holds its slices until it finishes or leaves the API server; a
/// terminating pod's containers still run.
fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// One registered GPU and what live pods hold on it, as the annotations
/// say (the same reading [`check`] uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuUse {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
    /// Whether its register entry says healthy.
    pub healthy: bool,
    /// Registered `(slots, memory MiB, cores %)`.
    pub capacity: (u64, u64, u64),
    /// `(slots, memory MiB, cores %)` held by live pods.
    pub used: (u64, u64, u64),
}

/// Every registered GPU with what live pods hold on it, by node then UUID.
/// Pods whose `vgpu-devices-allocated` does not parse are left out (the
/// [`check`] report names them).
#[must_use]
pub fn gpu_use(pods: &[Pod], nodes: &[Node]) -> Vec<GpuUse> {
    let held = held(pods);
    let mut out: Vec<GpuUse> = capacities(nodes)
        .into_iter()
        .map(|(uuid, cap)| GpuUse {
            used: held.get(&uuid).copied().unwrap_or_default(),
            node: cap.node,
            uuid,
            healthy: cap.healthy,
            capacity: (cap.slots, cap.mem, cap.cores),
        })
        .collect();
    out.sort_by(|a, b| (&a.node, &a.uuid).cmp(&(&b.node, &b.uuid)));
    out
}

/// `uuid -> (slots, mem, cores)` held by live pods. Per pod and GPU: init
/// containers run one at a time (peak), app containers together (sum); a
/// running pod's init containers are done.
fn held(pods: &[Pod]) -> BTreeMap<String, (u64, u64, u64)> {
    let mut held: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for pod in pods.iter().filter(|p| is_live(p)) {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let init_count = spec.init_containers.as_ref().map_or(0, Vec::len);
        let Some(Some(devices)) = annotation(&pod.metadata, ALLOCATED).map(parse_pod_devices)
        else {
            continue;
        };
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let mut per_gpu: BTreeMap<&str, [(u64, u64, u64); 2]> = BTreeMap::new();
        for (i, container) in devices.iter().enumerate() {
            let is_init = i < init_count;
            if is_init && running {
                continue;
            }
            for e in container {
                let slot = &mut per_gpu.entry(e.uuid.as_str()).or_default()[usize::from(!is_init)];
                if is_init {
                    *slot = (1, slot.1.max(e.mem), slot.2.max(e.cores));
                } else {
                    *slot = (slot.0 + 1, slot.1 + e.mem, slot.2 + e.cores);
                }
            }
        }
        for (uuid, [init, app]) in per_gpu {
            let h = held.entry(uuid.to_owned()).or_default();
            h.0 += init.0.max(app.0);
            h.1 += init.1.max(app.1);
            h.2 += init.2.max(app.2);
        }
    }
    held
}

/// Checks the cluster.
#[must_use]
pub fn check(pods: &[Pod], nodes: &[Node]) -> Report {
    let capacity = capacities(nodes);
    let mut report = Report::default();

    for pod in pods {
        let key = pod_key(pod);
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let init_count = spec.init_containers.as_ref().map_or(0, Vec::len);
        let allocated = annotation(&pod.metadata, ALLOCATED).map(parse_pod_devices);
        let devices = match allocated {
            Some(Some(d)) => d,
            Some(None) => {
                report.mismatched.push(Mismatch {
                    pod: key,
                    container: String::new(),
                    why: format!("{ALLOCATED} does not parse"),
                });
                continue;
            }
            None => continue,
        };
        check_pod_finished(pod, &key, &mut report);
        check_env(pod, &key, &devices, init_count, &mut report);
    }

    for (uuid, (slots, mem, cores)) in held(pods) {
        let Some(cap) = capacity.get(&uuid) else {
            report.overcommitted.push(OverCommit {
                node: String::new(),
                uuid,
                what: "unregistered GPU",
                used: slots,
                capacity: 0,
            });
            continue;
        };
        for (what, used, limit) in [
            ("slots", slots, cap.slots),
            ("memory", mem, cap.mem),
            ("cores", cores, cap.cores),
        ] {
            if used > limit {
                report.overcommitted.push(OverCommit {
                    node: cap.node.clone(),
                    uuid: uuid.clone(),
                    what,
                    used,
                    capacity: limit,
                });
            }
        }
    }
    report
}

fn check_pod_finished(pod: &Pod, key: &str, report: &mut Report) {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    if !bound {
        return;
    }
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Failed") {
        if status
            .and_then(|s| s.reason.as_deref())
            .is_none_or(str::is_empty)
        {
            report.unfinished.push(Mismatch {
                pod: key.to_owned(),
                container: String::new(),
                why: "failed without a reason".to_owned(),
            });
        }
        return;
    }
    let pending_entries = annotation(&pod.metadata, TO_ALLOCATE)
        .map(|v| parse_pod_devices(v).is_none_or(|c| c.iter().any(|d| !d.is_empty())))
        .unwrap_or(false);
    let phase = annotation(&pod.metadata, BIND_PHASE);
    if pending_entries || phase != Some("success") {
        report.unfinished.push(Mismatch {
            pod: key.to_owned(),
            container: String::new(),
            why: format!(
                "bound but not allocated: bind-phase {phase:?}, device entries left: {pending_entries}"
            ),
        });
    }
}

fn check_env(pod: &Pod, key: &str, devices: &[Vec<Entry>], init_count: usize, report: &mut Report) {
    let Some(records) = annotation(&pod.metadata, ALLOCATIONS_ANNOTATION) else {
        return;
    };
    let Ok(records) = serde_json::from_str::<Vec<ContainerAllocation>>(records) else {
        report.mismatched.push(Mismatch {
            pod: key.to_owned(),
            container: String::new(),
            why: "kubelet allocation record does not parse".to_owned(),
        });
        return;
    };
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    for record in records {
        let position = if record.init {
            spec.init_containers
                .iter()
                .flatten()
                .position(|c| c.name == record.container)
        } else {
            spec.containers
                .iter()
                .position(|c| c.name == record.container)
                .map(|p| p + init_count)
        };
        let expected = position.and_then(|p| devices.get(p));
        let mut problems = Vec::new();
        match expected {
            None => problems.push("no annotation entry for this container".to_owned()),
            Some(entries) => {
                let env = &record.reply.envs;
                let mut uuids: Vec<&str> = Vec::new();
                for e in entries {
                    if !uuids.contains(&e.uuid.as_str()) {
                        uuids.push(&e.uuid);
                    }
                }
                let want_visible = uuids.join(",");
                if env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str)
                    != Some(want_visible.as_str())
                {
                    problems.push(format!(
                        "NVIDIA_VISIBLE_DEVICES {:?}, annotation says {want_visible:?}",
                        env.get("NVIDIA_VISIBLE_DEVICES")
                    ));
                }
                for (j, e) in entries.iter().enumerate() {
                    let name = format!("CUDA_DEVICE_MEMORY_LIMIT_{j}");
                    let want = format!("{}m", e.mem);
                    if env.get(&name) != Some(&want) {
                        problems.push(format!(
                            "{name} {:?}, annotation says {want:?}",
                            env.get(&name)
                        ));
                    }
                }
                if let Some(first) = entries.first() {
                    let want = first.cores.to_string();
                    if env.get("CUDA_DEVICE_SM_LIMIT") != Some(&want) {
                        problems.push(format!(
                            "CUDA_DEVICE_SM_LIMIT {:?}, annotation says {want:?}",
                            env.get("CUDA_DEVICE_SM_LIMIT")
                        ));
                    }
                }
            }
        }
        for why in problems {
            report.mismatched.push(Mismatch {
                pod: key.to_owned(),
                container: record.container.clone(),
                why,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node() -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {REGISTER:
            r#"[{"id":"GPU-a","count":2,"devmem":1000,"devcore":100,"type":"NVIDIA-T4","health":true}]"#}}}))
        .unwrap()
    }

    fn env(mem: &str, cores: &str) -> serde_json::Value {
        json!({"NVIDIA_VISIBLE_DEVICES": "GPU-a", "CUDA_DEVICE_MEMORY_LIMIT_0": mem, "CUDA_DEVICE_SM_LIMIT": cores})
    }

    fn pod(name: &str, devices: &str, envs: serde_json::Value) -> Pod {
        let record = json!([{"container": "c", "init": false, "resource": "nvidia.com/gpu",
            "deviceIds": ["GPU-a-0"], "reply": {"envs": envs, "mounts": [], "devices": [], "annotations": {}, "cdiDevices": []}}]);
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": {
                ALLOCATED: devices, TO_ALLOCATE: ";", BIND_PHASE: "success",
                ALLOCATIONS_ANNOTATION: record.to_string()}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    #[test]
    fn a_consistent_cluster_is_clean() {
        let pods = [
            pod("a", "GPU-a,NVIDIA,600,30:;", env("600m", "30")),
            pod("b", "GPU-a,NVIDIA,400,70:;", env("400m", "70")),
        ];
        let report = check(&pods, &[node()]);
        assert!(report.is_clean(), "{report:?}");
    }

    #[test]
    fn a_planted_overcommit_is_caught() {
        let pods = [
            pod("a", "GPU-a,NVIDIA,600,30:;", env("600m", "30")),
            pod("b", "GPU-a,NVIDIA,500,30:;", env("500m", "30")),
            pod("c", "GPU-a,NVIDIA,1,1:;", env("1m", "1")),
        ];
        let report = check(&pods, &[node()]);
        let what: Vec<&str> = report.overcommitted.iter().map(|o| o.what).collect();
        assert_eq!(what, ["slots", "memory"], "{report:?}");
        // A finished pod no longer holds anything.
        let mut done = pods;
        done[2].status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        done[1].status =
            Some(serde_json::from_value(json!({"phase": "Failed", "reason": "Evicted"})).unwrap());
        assert!(check(&done, &[node()]).overcommitted.is_empty());
    }

    #[test]
    fn gpu_use_sums_live_pods_and_reads_health() {
        let mut pods = vec![
            pod("a", "GPU-a,NVIDIA,600,30:;", env("600m", "30")),
            pod("b", "GPU-a,NVIDIA,300,20:;", env("300m", "20")),
        ];
        pods[1].status =
            Some(serde_json::from_value(json!({"phase": "Failed", "reason": "x"})).unwrap());
        let used = gpu_use(&pods, &[node()]);
        assert_eq!(used.len(), 1);
        assert_eq!(
            (used[0].healthy, used[0].capacity, used[0].used),
            (true, (2, 1000, 100), (1, 600, 30))
        );
        let sick: Node =
            serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {REGISTER:
            r#"[{"id":"GPU-a","count":2,"devmem":1000,"devcore":100,"type":"NVIDIA-T4"}]"#}}}))
            .unwrap();
        assert!(!gpu_use(&pods, &[sick])[0].healthy);
    }

    #[test]
    fn a_planted_env_mismatch_is_caught() {
        let pods = [pod("a", "GPU-a,NVIDIA,600,30:;", env("700m", "30"))];
        let report = check(&pods, &[node()]);
        assert_eq!(report.mismatched.len(), 1, "{report:?}");
        assert!(
            report.mismatched[0]
                .why
                .starts_with("CUDA_DEVICE_MEMORY_LIMIT_0")
        );
    }

    #[test]
    fn a_bound_pod_stuck_allocating_is_unfinished() {
        let mut p = pod("a", "GPU-a,NVIDIA,600,30:;", env("600m", "30"));
        let a = p.metadata.annotations.as_mut().unwrap();
        a.insert(TO_ALLOCATE.into(), "GPU-a,NVIDIA,600,30:;".into());
        a.insert(BIND_PHASE.into(), "allocating".into());
        let report = check(&[p], &[node()]);
        assert_eq!(report.unfinished.len(), 1, "{report:?}");
    }

    #[test]
    fn pod_devices_parse_like_the_spec() {
        assert_eq!(
            parse_pod_devices(
                ";GPU-aaa,NVIDIA,3000,30:;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;"
            )
            .unwrap()
            .iter()
            .map(Vec::len)
            .collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(parse_pod_devices(";;;").unwrap().len(), 3);
        assert!(parse_pod_devices("GPU-a,NVIDIA,x,1:;").is_none());
    }
}

//! Who holds which slice of which GPU, read from the annotations gpuslice
//! and HAMi both write (pure: objects in, views out).
//!
//! A node's GPUs come from `hami.io/node-nvidia-register`; a pod holds the
//! slices in `hami.io/vgpu-devices-allocated` on `hami.io/vgpu-node` from
//! its bind until it finishes or is deleted. A pod's slices of one GPU add
//! up by the rule both schedulers use ([`proto::accounting`]): app
//! containers add up, init containers count at their peak.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use proto::accounting::{Amount, PodAmount, Role};
use proto::hami::bind::{BindPhase, BindTime};
use proto::hami::keys;
use proto::hami::pod_devices::PodDevices;
use proto::hami::register;
use serde::Serialize;

/// One pod's part of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Cores, percent.
    pub cores: u64,
    /// Slots (containers sharing the GPU at once).
    pub slots: u64,
}

/// One GPU and what is allocated on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Node name.
    pub node: String,
    /// Index on the node.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Model, as registered.
    pub model: String,
    /// Healthy as registered.
    pub healthy: bool,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Cores, percent.
    pub cores: u64,
    /// How many containers may share it.
    pub slots: u64,
    /// Memory allocated, MiB.
    pub used_memory_mib: u64,
    /// Cores allocated, percent.
    pub used_cores: u64,
    /// Slots allocated.
    pub used_slots: u64,
    /// The pods holding it.
    pub holders: Vec<Holder>,
}

/// One node's GPUs, summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    /// Node name.
    pub name: String,
    /// GPUs registered.
    pub gpus: usize,
    /// GPUs registered unhealthy.
    pub unhealthy: usize,
    /// Memory allocated / total, MiB.
    pub used_memory_mib: u64,
    /// Memory total, MiB.
    pub memory_mib: u64,
    /// Cores allocated, percent of one card.
    pub used_cores: u64,
    /// Cores total.
    pub cores: u64,
    /// Slots allocated.
    pub used_slots: u64,
    /// Slots total.
    pub slots: u64,
    /// The register annotation could not be read (why); the node counts no GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One GPU pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodSummary {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `status.phase`.
    pub phase: String,
    /// The node it is bound to by the GPU scheduler, if any.
    pub node: Option<String>,
    /// The GPUs it holds (UUIDs, in container order, each once).
    pub gpus: Vec<String>,
    /// Memory it holds, MiB (all GPUs).
    pub memory_mib: u64,
    /// Cores it holds (all GPUs).
    pub cores: u64,
    /// `hami.io/bind-phase`.
    pub bind_phase: Option<String>,
    /// Seconds since `hami.io/bind-time` while the phase is `allocating`.
    pub allocating_seconds: Option<i64>,
}

/// The cluster's GPUs and GPU pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Inventory {
    /// Per node, sorted by name.
    pub nodes: Vec<NodeSummary>,
    /// Every GPU, by node then index.
    pub gpus: Vec<Gpu>,
    /// Every pod that asks for or holds GPU slices.
    pub pods: Vec<PodSummary>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Use {
    memory_mib: u64,
    cores: u64,
    slots: u64,
}

impl Amount for Use {
    fn plus(self, o: Self) -> Self {
        Self {
            memory_mib: self.memory_mib.saturating_add(o.memory_mib),
            cores: self.cores.saturating_add(o.cores),
            slots: self.slots.saturating_add(o.slots),
        }
    }

    fn peak(self, o: Self) -> Self {
        Self {
            memory_mib: self.memory_mib.max(o.memory_mib),
            cores: self.cores.max(o.cores),
            slots: self.slots.max(o.slots),
        }
    }
}

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether the pod still holds what it was given: not finished (a
/// terminating pod's containers still run).
fn is_live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether any container asks for `resource` (the GPU count resource).
fn asks_for_gpu(pod: &Pod, resource: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .any(|r| {
            [&r.limits, &r.requests]
                .into_iter()
                .flatten()
                .any(|m| m.contains_key(resource))
        })
}

impl Inventory {
    /// Reads the GPUs from `nodes` and the allocations from `pods` at
    /// `now_unix`. Pods asking for `gpu_resource` or holding slices are
    /// listed; only live pods count against their GPUs.
    #[must_use]
    pub fn build(nodes: &[Node], pods: &[Pod], gpu_resource: &str, now_unix: i64) -> Self {
        let mut gpus: Vec<Gpu> = Vec::new();
        let mut summaries = Vec::new();
        let mut sorted: Vec<&Node> = nodes.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for node in sorted {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let Some(value) = annotation(&node.metadata, keys::NODE_NVIDIA_REGISTER) else {
                continue;
            };
            let mut summary = NodeSummary {
                name: name.clone(),
                gpus: 0,
                unhealthy: 0,
                used_memory_mib: 0,
                memory_mib: 0,
                used_cores: 0,
                cores: 0,
                used_slots: 0,
                slots: 0,
                error: None,
            };
            match register::decode(value) {
                Ok(devices) => {
                    for d in devices {
                        gpus.push(Gpu {
                            node: name.clone(),
                            index: d.index,
                            uuid: d.id,
                            model: d.device_type,
                            healthy: d.health,
                            memory_mib: u64::from(d.devmem),
                            cores: u64::from(d.devcore),
                            slots: u64::from(d.count),
                            used_memory_mib: 0,
                            used_cores: 0,
                            used_slots: 0,
                            holders: Vec::new(),
                        });
                    }
                }
                Err(e) => summary.error = Some(format!("{}: {e}", keys::NODE_NVIDIA_REGISTER)),
            }
            summaries.push(summary);
        }
        gpus.sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
        let by_uuid: BTreeMap<(String, String), usize> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| ((g.node.clone(), g.uuid.clone()), i))
            .collect();

        let mut pod_rows = Vec::new();
        for pod in pods {
            let node = annotation(&pod.metadata, keys::VGPU_NODE).map(str::to_owned);
            let devices: Option<PodDevices> =
                annotation(&pod.metadata, keys::VGPU_DEVICES_ALLOCATED)
                    .and_then(|v| v.parse().ok());
            if devices.is_none() && !asks_for_gpu(pod, gpu_resource) {
                continue;
            }
            let init_count = pod
                .spec
                .as_ref()
                .and_then(|s| s.init_containers.as_ref())
                .map_or(0, Vec::len);
            // Per GPU: the pod's containers' slices by the accounting rule.
            let mut per_gpu: BTreeMap<String, PodAmount<Use>> = BTreeMap::new();
            for (i, container) in devices.iter().flat_map(|d| d.0.iter()).enumerate() {
                for d in container {
                    per_gpu.entry(d.uuid.clone()).or_default().add(
                        Role::of_index(i, init_count),
                        Use {
                            memory_mib: u64::try_from(d.usedmem).unwrap_or(0),
                            cores: u64::try_from(d.usedcores).unwrap_or(0),
                            slots: 1,
                        },
                    );
                }
            }
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut total = Use::default();
            for (uuid, amount) in &per_gpu {
                let held = amount.total();
                total = total.plus(held);
                if !is_live(pod) {
                    continue;
                }
                let Some(&i) = node
                    .as_ref()
                    .and_then(|n| by_uuid.get(&(n.clone(), uuid.clone())))
                else {
                    continue;
                };
                let gpu = &mut gpus[i];
                gpu.used_memory_mib += held.memory_mib;
                gpu.used_cores += held.cores;
                gpu.used_slots += held.slots;
                gpu.holders.push(Holder {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    memory_mib: held.memory_mib,
                    cores: held.cores,
                    slots: held.slots,
                });
            }
            let bind_phase = annotation(&pod.metadata, keys::BIND_PHASE).map(str::to_owned);
            let allocating_seconds = (bind_phase.as_deref().and_then(|p| p.parse().ok())
                == Some(BindPhase::Allocating))
            .then(|| annotation(&pod.metadata, keys::BIND_TIME))
            .flatten()
            .and_then(|t| t.parse::<BindTime>().ok())
            .map(|t| t.age_seconds(now_unix));
            pod_rows.push(PodSummary {
                namespace,
                name,
                phase: pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default(),
                node,
                gpus: per_gpu.keys().cloned().collect(),
                memory_mib: total.memory_mib,
                cores: total.cores,
                bind_phase,
                allocating_seconds,
            });
        }
        pod_rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for gpu in &mut gpus {
            gpu.holders
                .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        }
        for summary in &mut summaries {
            for gpu in gpus.iter().filter(|g| g.node == summary.name) {
                summary.gpus += 1;
                summary.unhealthy += usize::from(!gpu.healthy);
                summary.memory_mib += gpu.memory_mib;
                summary.used_memory_mib += gpu.used_memory_mib;
                summary.cores += gpu.cores;
                summary.used_cores += gpu.used_cores;
                summary.slots += gpu.slots;
                summary.used_slots += gpu.used_slots;
            }
        }
        Self {
            nodes: summaries,
            gpus,
            pods: pod_rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use proto::hami::register::NodeDevice;
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_760_929_622; // 2025-10-20T03:07:02Z

    fn node(name: &str, gpus: u32) -> Node {
        let devices: Vec<NodeDevice> = (0..gpus)
            .map(|i| NodeDevice {
                id: format!("GPU-{name}-{i}"),
                index: i,
                count: 4,
                devmem: 16384,
                devcore: 100,
                device_type: "NVIDIA-Tesla T4".into(),
                numa: 0,
                mode: "hami-core".into(),
                health: i != 1,
                mig_profiles: Vec::new(),
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
            keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()}}}))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, annotations: serde_json::Value, init: bool) -> Pod {
        let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
        let init = if init {
            json!([{"name": "i", "resources": gpu}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"initContainers": init, "containers": [{"name": "c", "resources": gpu}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn slices_add_up_per_gpu_with_init_containers_at_their_peak() {
        let nodes = [node("b", 1), node("a", 2)];
        let pods = [
            // init 6000/50 then app 1000/10 on the same GPU: the pod holds 6000/50, 1 slot.
            pod(
                "with-init",
                "Running",
                json!({keys::VGPU_NODE: "a",
                       keys::VGPU_DEVICES_ALLOCATED: "GPU-a-0,NVIDIA,6000,50:;GPU-a-0,NVIDIA,1000,10:;",
                       keys::BIND_PHASE: "success"}),
                true,
            ),
            pod(
                "plain",
                "Running",
                json!({keys::VGPU_NODE: "a", keys::VGPU_DEVICES_ALLOCATED: "GPU-a-0,NVIDIA,3000,30:;"}),
                false,
            ),
            // Finished: listed, but holds nothing.
            pod(
                "done",
                "Succeeded",
                json!({keys::VGPU_NODE: "a", keys::VGPU_DEVICES_ALLOCATED: "GPU-a-1,NVIDIA,3000,30:;"}),
                false,
            ),
            pod("pending", "Pending", json!({}), false),
        ];
        let inv = Inventory::build(&nodes, &pods, "nvidia.com/gpu", NOW);
        assert_eq!(
            inv.nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        let gpu = &inv.gpus[0];
        assert_eq!(
            (
                gpu.uuid.as_str(),
                gpu.used_memory_mib,
                gpu.used_cores,
                gpu.used_slots
            ),
            ("GPU-a-0", 9000, 80, 2)
        );
        assert_eq!(gpu.holders.len(), 2);
        assert_eq!(
            inv.gpus[1].used_memory_mib, 0,
            "a finished pod frees its slice"
        );
        let a = &inv.nodes[0];
        assert_eq!(
            (a.gpus, a.unhealthy, a.used_memory_mib, a.memory_mib),
            (2, 1, 9000, 32768)
        );
        assert_eq!(inv.pods.len(), 4);
        let pending = inv.pods.iter().find(|p| p.name == "pending").unwrap();
        assert_eq!((pending.node.as_deref(), pending.gpus.len()), (None, 0));
    }

    #[test]
    fn allocating_time_counts_from_the_bind_time() {
        let pods = [pod(
            "p",
            "Pending",
            json!({keys::VGPU_NODE: "a", keys::VGPU_DEVICES_ALLOCATED: "GPU-a-0,NVIDIA,1000,10:;",
                   keys::BIND_PHASE: "allocating", keys::BIND_TIME: (NOW - 42).to_string()}),
            false,
        )];
        let inv = Inventory::build(&[node("a", 1)], &pods, "nvidia.com/gpu", NOW);
        assert_eq!(inv.pods[0].allocating_seconds, Some(42));
    }

    #[test]
    fn an_unreadable_register_is_reported_not_fatal() {
        let mut bad = node("a", 1);
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::NODE_NVIDIA_REGISTER.into(), "not a register".into());
        let inv = Inventory::build(&[bad, node("b", 1)], &[], "nvidia.com/gpu", NOW);
        assert!(
            inv.nodes[0]
                .error
                .as_deref()
                .unwrap()
                .contains(keys::NODE_NVIDIA_REGISTER)
        );
        assert_eq!(inv.gpus.len(), 1);
    }
}

//! Kubernetes objects → the core's inputs: the pure conversions the cache
//! model and the admission webhook share.
//!
//! Owns the reading of pods (their requests, the allocation their
//! annotations record), nodes (register, handshake and cordon
//! annotations) and ResourceQuotas (`limits.<gpumem>`/`limits.<gpucores>`).
//! Does not own any state: the [`crate::cache`] model keeps what these
//! return, the [`crate::webhook`] reads a pod's requests once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node as KubeNode, Pod, PodSpec, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proto::hami::handshake::Handshake;
use proto::hami::keys;
use proto::hami::mig::{MigAllocation, decode_allocations};
use proto::hami::pod_devices::PodDevices;
use proto::hami::resources::ResourceNames;

use crate::core::model::NodeCapacity;
use crate::core::quota::QuotaLimits;
use crate::core::request::{ContainerLite, PodSpecLite};
use crate::core::reservation::HostResources;
use crate::quantity::{QuantityError, parse_mib, parse_milli, parse_whole};

/// The allocation a pod's annotations record (`hami.io/vgpu-node` and
/// `hami.io/vgpu-devices-allocated`).
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// The node the slices are on.
    pub node: String,
    /// What each container holds (init containers first).
    pub devices: PodDevices,
    /// How many of `devices` belong to init containers.
    pub init_count: usize,
    /// Its `hami.io/vgpu-mig-allocations` (empty when absent or when it
    /// does not decode: the placements are then derived, as for a pod
    /// bound by a scheduler that does not write them).
    pub mig: Vec<MigAllocation>,
}

/// The allocation a pod's annotations record, if any (and if it decodes).
#[must_use]
pub fn allocation_of(pod: &Pod) -> Option<Allocation> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let node = annotations.get(keys::VGPU_NODE)?.clone();
    let devices: PodDevices = annotations
        .get(keys::VGPU_DEVICES_ALLOCATED)?
        .parse()
        .ok()?;
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.as_ref().map_or(0, Vec::len);
    // ≤ v2.8 encoded only app containers.
    let init_count = if devices.0.len() == spec.containers.len() && init > 0 {
        0
    } else {
        init
    };
    let mig = annotations
        .get(keys::VGPU_MIG_ALLOCATIONS)
        .and_then(|v| decode_allocations(v).ok())
        .unwrap_or_default();
    Some(Allocation {
        node,
        devices,
        init_count,
        mig,
    })
}

/// Whether a pod has finished (`Succeeded` or `Failed`): what it held is
/// free. A pod being deleted is not finished: its containers run until
/// kubelet stops them (its grace period, or for ever on a node that is
/// down), so its slices stay taken until it leaves the API server, as
/// kube-scheduler counts a terminating pod's CPU and memory and as the
/// node daemon's ledger holds them. (Freeing them at the deletion
/// timestamp let the scheduler place a pod the node then refused.)
#[must_use]
pub fn is_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The parts of a pod the core reads.
///
/// # Errors
/// A resource quantity that is not a whole number, naming container and resource.
pub fn pod_lite(pod: &Pod) -> Result<PodSpecLite, String> {
    let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
    let containers = |list: &[Container]| -> Result<Vec<ContainerLite>, String> {
        list.iter().map(container_lite).collect()
    };
    let host = host_requests(spec)?;
    Ok(PodSpecLite {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        init_containers: containers(spec.init_containers.as_deref().unwrap_or(&[]))?,
        containers: containers(&spec.containers)?,
        cpu_milli: host.cpu_milli,
        memory_mib: host.memory_mib,
    })
}

/// The CPU and memory a pod asks of its node, as kube-scheduler's
/// `NodeResourcesFit` counts them (`resourcehelper.PodRequests`): the app
/// containers' requests summed, sidecars (init containers with
/// `restartPolicy: Always`) added to them, against the largest init
/// container (plus the sidecars started before it), whichever is larger;
/// pod-level `spec.resources.requests` instead, for a resource it names;
/// then `spec.overhead`. A container's request absent counts 0 (the API
/// server defaults it from the limit at creation).
///
/// # Errors
/// A CPU or memory quantity that does not parse, naming where it is.
pub fn host_requests(spec: &PodSpec) -> Result<HostResources, String> {
    let read = |map: Option<&BTreeMap<String, Quantity>>, whose: &str, who: &str| {
        let get = |name: &str, parse: fn(&str) -> Result<i64, QuantityError>| {
            map.and_then(|m| m.get(name)).map_or(Ok(0), |q| {
                parse(&q.0)
                    .map(i64::unsigned_abs)
                    .map_err(|e| format!("{whose}{who} resource {name}: {e}"))
            })
        };
        Ok::<_, String>(HostResources {
            cpu_milli: get("cpu", parse_milli)?,
            memory_mib: get("memory", parse_mib)?,
        })
    };
    let requests = |c: &Container| {
        read(
            c.resources.as_ref().and_then(|r| r.requests.as_ref()),
            "container ",
            &c.name,
        )
    };
    let plus = |a: HostResources, b: HostResources| HostResources {
        cpu_milli: a.cpu_milli.saturating_add(b.cpu_milli),
        memory_mib: a.memory_mib.saturating_add(b.memory_mib),
    };
    let max = |a: HostResources, b: HostResources| HostResources {
        cpu_milli: a.cpu_milli.max(b.cpu_milli),
        memory_mib: a.memory_mib.max(b.memory_mib),
    };
    let mut total = HostResources::default();
    for c in &spec.containers {
        total = plus(total, requests(c)?);
    }
    let (mut sidecars, mut init_peak) = (HostResources::default(), HostResources::default());
    for c in spec.init_containers.iter().flatten() {
        let own = requests(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            total = plus(total, own);
            sidecars = plus(sidecars, own);
            init_peak = max(init_peak, sidecars);
        } else {
            init_peak = max(init_peak, plus(own, sidecars));
        }
    }
    let mut pod = max(total, init_peak);
    if let Some(level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        let named = read(Some(level), "pod", "")?;
        if level.contains_key("cpu") {
            pod.cpu_milli = named.cpu_milli;
        }
        if level.contains_key("memory") {
            pod.memory_mib = named.memory_mib;
        }
    }
    Ok(plus(pod, read(spec.overhead.as_ref(), "pod overhead", "")?))
}

/// A node's allocatable CPU and memory, when both are given and parse
/// (else the scheduler does not track the node's CPU and memory).
#[must_use]
pub fn host_capacity(node: &KubeNode) -> Option<NodeCapacity> {
    let allocatable = node.status.as_ref()?.allocatable.as_ref()?;
    let cpu = parse_milli(&allocatable.get("cpu")?.0).ok()?;
    let memory = parse_mib(&allocatable.get("memory")?.0).ok()?;
    Some(NodeCapacity {
        cpu_milli: cpu.unsigned_abs(),
        memory_mib: memory.unsigned_abs(),
    })
}

fn container_lite(c: &Container) -> Result<ContainerLite, String> {
    let read = |map: Option<&BTreeMap<String, Quantity>>| {
        map.into_iter()
            .flatten()
            .filter(|(name, _)| name.contains('/'))
            .map(|(name, q)| {
                parse_whole(&q.0)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| format!("container {} resource {name}: {e}", c.name))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
    };
    let resources = c.resources.as_ref();
    Ok(ContainerLite {
        name: c.name.clone(),
        limits: read(resources.and_then(|r| r.limits.as_ref()))?,
        requests: read(resources.and_then(|r| r.requests.as_ref()))?,
    })
}

/// What the model reads from a node's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAnnotations {
    /// The `hami.io/node-nvidia-register` value, empty when there is none.
    /// Whether the GPUs it lists are offered is the handshake's call
    /// ([`NodeHandshake::offer`]).
    pub register: String,
    /// GPU UUIDs an admin excluded from new allocations (`hami.io/device-cordon`).
    pub cordoned: Vec<String>,
    /// The `hami.io/node-nvidia-score` value (GPU pair scores for
    /// `topology-aware`), empty when there is none.
    pub pair_scores: String,
    /// What the handshake reads: `None` when the node has no register
    /// annotation at all (not a GPU node, or its daemon never registered).
    pub handshake: Option<NodeHandshake>,
}

/// What the handshake rule reads from one GPU node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHandshake {
    /// The `hami.io/node-handshake` value, as written.
    pub current: Option<String>,
    /// `status.allocatable` of the GPU resource (`None`: absent or not a
    /// whole number).
    pub allocatable_gpus: Option<i64>,
}

/// How long a `Requesting_` stamp answers for a node that advertises no
/// GPUs (HAMi: 60 s).
pub const REQUEST_WINDOW_SECS: i64 = 60;

/// Whether a GPU node's handshake lets the scheduler offer its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuOffer {
    /// Offered.
    Yes,
    /// Offered until this unix second, then not (a `Requesting_` stamp on a
    /// node that advertises no GPUs: HAMi waits 60 s for its device plugin).
    Until(i64),
    /// Not offered: the node is unhealthy.
    No,
}

impl NodeHandshake {
    /// The allocatable count of the GPU resource, absent read as 0 (as
    /// HAMi's `Quantity.Value()` of a missing key).
    #[must_use]
    pub fn allocatable(&self) -> i64 {
        self.allocatable_gpus.unwrap_or(0)
    }

    /// Whether the leader should write `Requesting_<now>` whatever the time:
    /// the value is missing, unreadable or a legacy one, or it is `Deleted_`
    /// while the node advertises GPUs again. (An expired `Requesting_` is
    /// the other, time-dependent, case: see `handshake::action`.)
    #[must_use]
    pub fn needs_request(&self) -> bool {
        match self.current.as_deref().map(str::parse::<Handshake>) {
            Some(Ok(Handshake::Requesting(_))) => false,
            Some(Ok(Handshake::Deleted(_))) => self.allocatable() > 0,
            _ => true,
        }
    }

    /// HAMi's health rule for the node's GPUs (`CheckHealth` of the NVIDIA
    /// device and `device.CheckHealth`). `dropped` says the node's
    /// allocatable count fell from > 0 to 0 and has not come back since.
    ///
    /// - `Deleted_…`: no (the leader marked it unhealthy; gpuslice's marker);
    /// - allocatable > 0: yes;
    /// - allocatable 0 (or absent) after it was > 0: no, at once (the device
    ///   plugin stopped);
    /// - allocatable 0 with `Requesting_<t>`: yes until `t + 60 s`, then no
    ///   (the device plugin never came up);
    /// - allocatable 0 with no stamp, a legacy one or an unreadable one: yes
    ///   (HAMi stamps such a node and counts it healthy; the 60 s start
    ///   once the stamp is written).
    #[must_use]
    pub fn offer(&self, dropped: bool) -> GpuOffer {
        match self.current.as_deref().map(str::parse::<Handshake>) {
            Some(Ok(Handshake::Deleted(_))) => GpuOffer::No,
            _ if self.allocatable() > 0 => GpuOffer::Yes,
            _ if dropped => GpuOffer::No,
            Some(Ok(h @ Handshake::Requesting(_))) => {
                GpuOffer::Until(h.stamped_at_unix().saturating_add(REQUEST_WINDOW_SECS))
            }
            _ => GpuOffer::Yes,
        }
    }
}

/// Reads a node's register, cordon, pair score and handshake annotations, and its
/// allocatable count of `gpu_resource`.
#[must_use]
pub fn node_annotations(node: &KubeNode, gpu_resource: &str) -> NodeAnnotations {
    let annotations = node.metadata.annotations.as_ref();
    let register = annotations
        .and_then(|a| a.get(keys::NODE_NVIDIA_REGISTER))
        .cloned()
        .unwrap_or_default();
    let pair_scores = annotations
        .and_then(|a| a.get(keys::NODE_NVIDIA_SCORE))
        .cloned()
        .unwrap_or_default();
    let cordoned = annotations
        .and_then(|a| a.get(keys::DEVICE_CORDON))
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
        .unwrap_or_default();
    let handshake = annotations
        .is_some_and(|a| a.contains_key(keys::NODE_NVIDIA_REGISTER))
        .then(|| NodeHandshake {
            current: annotations
                .and_then(|a| a.get(keys::NODE_HANDSHAKE))
                .cloned(),
            allocatable_gpus: node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(gpu_resource))
                .and_then(|q| crate::quantity::parse_whole(&q.0).ok()),
        });
    NodeAnnotations {
        register,
        cordoned,
        pair_scores,
        handshake,
    }
}

/// A `spec.hard` value of a ResourceQuota that is not a whole number; the
/// key is ignored (no limit from this object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resourcequota {namespace}/{name} {key}: {error}")]
pub struct BadQuota {
    /// Namespace.
    pub namespace: String,
    /// Quota name.
    pub name: String,
    /// The `spec.hard` key.
    pub key: String,
    /// Why the value does not parse.
    #[source]
    pub error: QuantityError,
}

/// A ResourceQuota's GPU limits, read from `limits.<gpumem>` and
/// `limits.<gpucores>` (other keys are not ours), with the values that did
/// not parse (those keys limit nothing). `None` for a quota without a
/// namespace or name.
#[must_use]
pub fn quota_limits(
    quota: &ResourceQuota,
    names: &ResourceNames,
) -> Option<(QuotaLimits, Vec<BadQuota>)> {
    let (Some(namespace), Some(name)) = (
        quota.metadata.namespace.as_deref(),
        quota.metadata.name.as_deref(),
    ) else {
        return None;
    };
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    let mut bad = Vec::new();
    let mut read = |resource: &str| -> Option<u64> {
        let key = format!("limits.{resource}");
        let q = hard?.get(&key)?;
        match parse_whole(&q.0) {
            Ok(v) => Some(v.unsigned_abs()),
            Err(error) => {
                bad.push(BadQuota {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    key,
                    error,
                });
                None
            }
        }
    };
    let limits = QuotaLimits {
        memory_mib: read(&names.resource_mem),
        cores: read(&names.resource_cores),
    };
    Some((limits, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn host_requests_count_sidecars_init_peaks_pod_level_and_overhead() {
        // Apps 500m + 250m, a sidecar 100m running beside them: 850m; the
        // init container started after the sidecar peaks at 2 + 0.1 cores.
        let s = spec(json!({
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "overhead": {"cpu": "10m", "memory": "1Mi"}}));
        assert_eq!(
            host_requests(&s),
            Ok(HostResources {
                cpu_milli: 2110,
                memory_mib: 1025
            })
        );
        let level = spec(json!({
            "resources": {"requests": {"cpu": "3"}},
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}]}));
        assert_eq!(
            host_requests(&level),
            Ok(HostResources {
                cpu_milli: 3000,
                memory_mib: 64
            })
        );
    }

    #[test]
    fn an_unreadable_cpu_request_names_its_container() {
        let s = spec(
            json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}),
        );
        let err = host_requests(&s).unwrap_err();
        assert!(err.starts_with("container a resource cpu: `lots`"), "{err}");
    }

    #[test]
    fn host_capacity_needs_both_cpu_and_memory() {
        let node = |alloc: serde_json::Value| -> KubeNode {
            serde_json::from_value(
                json!({"metadata": {"name": "n"}, "status": {"allocatable": alloc}}),
            )
            .unwrap()
        };
        assert_eq!(
            host_capacity(&node(json!({"cpu": "7910m", "memory": "32Gi"}))),
            Some(NodeCapacity {
                cpu_milli: 7910,
                memory_mib: 32 << 10
            })
        );
        assert_eq!(host_capacity(&node(json!({"cpu": "8"}))), None);
        assert_eq!(
            host_capacity(&node(json!({"cpu": "x", "memory": "1Gi"}))),
            None
        );
    }
}

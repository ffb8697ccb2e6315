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
//!   device entries left in `vgpu-devices-to-allocate`) or failed with a reason;
//! - on GPUs registered in `mig` mode: every device entry has its instance in
//!   `hami.io/vgpu-mig-allocations` (a profile the GPU offers, at one of that
//!   profile's placements, holding the memory the container asked), no two
//!   live instances on a GPU share a memory slice, their slices sum to no
//!   more than the GPU has, and the container sees its own MIG device
//!   (`NVIDIA_VISIBLE_DEVICES=MIG-…`, no other container's) without
//!   HAMi-core limits.
//!
//! In DRA mode ([`dra`]) it reads the driver's ResourceSlices and the
//! allocated ResourceClaims instead of annotations.
//!
//! It decodes with its own reading of the protocol (the spec's text), not
//! with the codecs under test, so a codec bug cannot hide itself.

pub mod dra;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

use crate::fake_kubelet::{ALLOCATIONS_ANNOTATION, ContainerAllocation};

const REGISTER: &str = "hami.io/node-nvidia-register";
const ALLOCATED: &str = "hami.io/vgpu-devices-allocated";
const TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";
const BIND_PHASE: &str = "hami.io/bind-phase";
const MIG_ALLOCATIONS: &str = "hami.io/vgpu-mig-allocations";
const GPUMEM: &str = "nvidia.com/gpumem";

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
    /// In `mig` mode: the profiles it offers.
    mig: Option<Vec<Profile>>,
}

/// One MIG profile a GPU offers: name, memory MiB, placements `(start, size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Profile {
    name: String,
    mem: u64,
    placements: Vec<(u64, u64)>,
}

/// The memory slices of a MIG GPU: the end of its furthest placement.
fn slice_count(profiles: &[Profile]) -> u64 {
    profiles
        .iter()
        .flat_map(|p| &p.placements)
        .map(|(start, size)| start + size)
        .max()
        .unwrap_or(0)
}

/// One entry of `hami.io/vgpu-mig-allocations`, read as the spec states it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Instance {
    container: u64,
    device: u64,
    gpu: String,
    profile: String,
    start: u64,
    size: u64,
    mig_uuid: Option<String>,
}

/// Reads `[{"containerIndex","deviceIndex","gpuUUID","profile",
/// "placement":{"start","size"}, "migUUID"?}]`; `None` when it does not.
fn parse_instances(value: &str) -> Option<Vec<Instance>> {
    let serde_json::Value::Array(items) = serde_json::from_str(value).ok()? else {
        return None;
    };
    items
        .iter()
        .map(|i| {
            let num = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_u64);
            let placement = i.get("placement")?;
            Some(Instance {
                container: num(i.get("containerIndex"))?,
                device: num(i.get("deviceIndex"))?,
                gpu: i.get("gpuUUID")?.as_str()?.to_owned(),
                profile: i.get("profile")?.as_str()?.to_owned(),
                start: num(placement.get("start"))?,
                size: num(placement.get("size"))?,
                mig_uuid: i.get("migUUID").and_then(|v| v.as_str()).map(str::to_owned),
            })
        })
        .collect()
}

fn parse_profiles(device: &serde_json::Value) -> Option<Vec<Profile>> {
    if device.get("mode").and_then(serde_json::Value::as_str) != Some("mig") {
        return None;
    }
    let profiles = device
        .get("migProfiles")
        .and_then(serde_json::Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| Profile {
                    name: p
                        .get("name")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    mem: p
                        .get("memoryMB")
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0),
                    placements: p
                        .get("placements")
                        .and_then(serde_json::Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|pl| {
                            Some((pl.get("start")?.as_u64()?, pl.get("size")?.as_u64()?))
                        })
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(profiles)
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
                        mig: parse_profiles(&d),
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
        check_env(pod, &key, &devices, init_count, &capacity, &mut report);
        if is_live(pod) {
            check_mig_pod(pod, &key, &devices, init_count, &capacity, &mut report);
        }
    }
    check_mig_gpus(pods, &capacity, &mut report);

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

/// [`check`] plus DRA mode's findings ([`dra`]) over the driver's
/// ResourceSlices and the ResourceClaims.
#[must_use]
pub fn check_with_dra(
    pods: &[Pod],
    nodes: &[Node],
    claims: &[k8s_openapi::api::resource::v1::ResourceClaim],
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
) -> Report {
    let mut report = check(pods, nodes);
    dra::check(pods, claims, slices, &mut report);
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

fn check_env(
    pod: &Pod,
    key: &str,
    devices: &[Vec<Entry>],
    init_count: usize,
    capacity: &HashMap<String, Capacity>,
    report: &mut Report,
) {
    let on_mig = |e: &Entry| capacity.get(&e.uuid).is_some_and(|c| c.mig.is_some());
    let instances = annotation(&pod.metadata, MIG_ALLOCATIONS).and_then(parse_instances);
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
            Some(entries) if entries.iter().any(on_mig) => {
                let env = &record.reply.envs;
                let index = position.unwrap_or_default() as u64;
                problems.extend(mig_env_problems(
                    env,
                    entries,
                    index,
                    instances.as_deref(),
                    &on_mig,
                ));
            }
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

/// What is wrong with the env of a container with devices on MIG GPUs:
/// each such device must appear as a MIG device (the `migUUID` of its
/// instance when the annotation names one), other devices as their GPU,
/// and, when every device is an instance, no HAMi-core limits.
fn mig_env_problems(
    env: &BTreeMap<String, String>,
    entries: &[Entry],
    container: u64,
    instances: Option<&[Instance]>,
    on_mig: &dyn Fn(&Entry) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let visible: Vec<&str> = env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').collect())
        .unwrap_or_default();
    let mut want_gpus: Vec<&str> = Vec::new();
    let mut want_mig = 0_usize;
    for (j, e) in entries.iter().enumerate() {
        if !on_mig(e) {
            if !want_gpus.contains(&e.uuid.as_str()) {
                want_gpus.push(&e.uuid);
            }
            continue;
        }
        want_mig += 1;
        let named = instances
            .into_iter()
            .flatten()
            .find(|i| i.container == container && i.device == j as u64)
            .and_then(|i| i.mig_uuid.as_deref());
        if let Some(mig_uuid) = named
            && !visible.contains(&mig_uuid)
        {
            problems.push(format!(
                "NVIDIA_VISIBLE_DEVICES {visible:?} lacks its MIG device {mig_uuid} (device {j})"
            ));
        }
    }
    let mig_seen = visible.iter().filter(|v| v.starts_with("MIG-")).count();
    let gpus_seen: Vec<&str> = visible
        .iter()
        .copied()
        .filter(|v| !v.starts_with("MIG-"))
        .collect();
    if mig_seen != want_mig || gpus_seen != want_gpus {
        problems.push(format!(
            "NVIDIA_VISIBLE_DEVICES {visible:?}: want {want_mig} MIG device(s) and GPUs {want_gpus:?}"
        ));
    }
    if entries.iter().all(on_mig) {
        for name in env.keys().filter(|k| {
            k.starts_with("CUDA_DEVICE_MEMORY_LIMIT") || k.as_str() == "CUDA_DEVICE_SM_LIMIT"
        }) {
            problems.push(format!("{name} is set on a MIG instance"));
        }
    }
    problems
}

/// The memory container `index` of `pod` asked per GPU (`nvidia.com/gpumem`),
/// if it asked an absolute amount.
fn asked_memory(pod: &Pod, index: usize, init_count: usize) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let container = if index < init_count {
        spec.init_containers.as_ref()?.get(index)?
    } else {
        spec.containers.get(index - init_count)?
    };
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    limits.get(GPUMEM)?.0.parse().ok()
}

/// Per pod on MIG GPUs: each device entry on a MIG GPU has its instance in
/// `vgpu-mig-allocations`, on the same GPU, of a profile the GPU offers,
/// at one of that profile's placements, holding the memory asked (the
/// container's `nvidia.com/gpumem`, else its entry's memory).
fn check_mig_pod(
    pod: &Pod,
    key: &str,
    devices: &[Vec<Entry>],
    init_count: usize,
    capacity: &HashMap<String, Capacity>,
    report: &mut Report,
) {
    let mut problem = |container: String, why: String| {
        report.mismatched.push(Mismatch {
            pod: key.to_owned(),
            container,
            why,
        });
    };
    let on_mig = devices
        .iter()
        .flatten()
        .any(|e| capacity.get(&e.uuid).is_some_and(|c| c.mig.is_some()));
    if !on_mig {
        return;
    }
    let Some(value) = annotation(&pod.metadata, MIG_ALLOCATIONS) else {
        problem(
            String::new(),
            format!("on a MIG GPU without {MIG_ALLOCATIONS}"),
        );
        return;
    };
    let Some(instances) = parse_instances(value) else {
        problem(String::new(), format!("{MIG_ALLOCATIONS} does not parse"));
        return;
    };
    for (i, container) in devices.iter().enumerate() {
        for (j, e) in container.iter().enumerate() {
            let Some(profiles) = capacity.get(&e.uuid).and_then(|c| c.mig.as_ref()) else {
                continue;
            };
            let at = format!("container {i} device {j}");
            let Some(inst) = instances
                .iter()
                .find(|x| x.container == i as u64 && x.device == j as u64)
            else {
                problem(at, format!("no {MIG_ALLOCATIONS} entry"));
                continue;
            };
            if inst.gpu != e.uuid {
                problem(
                    at.clone(),
                    format!("instance on {}, device entry on {}", inst.gpu, e.uuid),
                );
            }
            let Some(profile) = profiles.iter().find(|p| p.name == inst.profile) else {
                problem(
                    at,
                    format!("profile {} is not offered by {}", inst.profile, e.uuid),
                );
                continue;
            };
            if !profile.placements.contains(&(inst.start, inst.size)) {
                problem(
                    at.clone(),
                    format!(
                        "placement {}+{} is not one of {}'s",
                        inst.start, inst.size, profile.name
                    ),
                );
            }
            let asked = asked_memory(pod, i, init_count).unwrap_or(e.mem);
            if profile.mem < asked {
                problem(
                    at,
                    format!(
                        "profile {} holds {} MiB, the container asked {asked} MiB",
                        profile.name, profile.mem
                    ),
                );
            }
        }
    }
}

/// Per MIG GPU: the live instances (a running pod's init containers are
/// done) share no memory slice, and their slices sum to no more than the
/// GPU has; each over-commit is reported once per GPU. Instances are read
/// from `vgpu-mig-allocations`; a live container's MIG device id is its
/// alone.
fn check_mig_gpus(pods: &[Pod], capacity: &HashMap<String, Capacity>, report: &mut Report) {
    let mut per_gpu: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let mut mig_ids: BTreeMap<String, String> = BTreeMap::new();
    for pod in pods.iter().filter(|p| is_live(p)) {
        let init_count = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .map_or(0, Vec::len);
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let key = pod_key(pod);
        if let Some(instances) =
            annotation(&pod.metadata, MIG_ALLOCATIONS).and_then(parse_instances)
        {
            for inst in instances {
                if running && inst.container < init_count as u64 {
                    continue;
                }
                if let Some((uuid, _)) = capacity.get_key_value(&inst.gpu)
                    && capacity[uuid].mig.is_some()
                {
                    per_gpu
                        .entry(uuid.as_str())
                        .or_default()
                        .push((inst.start, inst.size));
                }
            }
        }
        let records = annotation(&pod.metadata, ALLOCATIONS_ANNOTATION)
            .and_then(|r| serde_json::from_str::<Vec<ContainerAllocation>>(r).ok())
            .unwrap_or_default();
        for record in records.iter().filter(|r| !(running && r.init)) {
            let holder = format!("{key}/{}", record.container);
            for id in record
                .reply
                .envs
                .get("NVIDIA_VISIBLE_DEVICES")
                .into_iter()
                .flat_map(|v| v.split(','))
                .filter(|v| v.starts_with("MIG-"))
            {
                if let Some(other) = mig_ids.insert(id.to_owned(), holder.clone())
                    && other != holder
                {
                    report.mismatched.push(Mismatch {
                        pod: key.clone(),
                        container: record.container.clone(),
                        why: format!("MIG device {id} is also {other}'s"),
                    });
                }
            }
        }
    }
    for (uuid, placements) in per_gpu {
        let cap = &capacity[uuid];
        let slices = slice_count(cap.mig.as_deref().unwrap_or_default());
        let sum: u64 = placements.iter().map(|(_, size)| size).sum();
        if sum > slices {
            report.overcommitted.push(OverCommit {
                node: cap.node.clone(),
                uuid: uuid.to_owned(),
                what: "MIG memory slices",
                used: sum,
                capacity: slices,
            });
        }
        // The most instances on one slice.
        let deepest = (0..slices.max(1))
            .map(|slice| {
                placements
                    .iter()
                    .filter(|(start, size)| *start <= slice && slice < start + size)
                    .count() as u64
            })
            .max()
            .unwrap_or(0);
        if deepest > 1 {
            report.overcommitted.push(OverCommit {
                node: cap.node.clone(),
                uuid: uuid.to_owned(),
                what: "MIG instances on one memory slice",
                used: deepest,
                capacity: 1,
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

    // === MIG ===

    /// One A100-40GB in `mig` mode with HAMi's default profiles.
    fn mig_node() -> Node {
        let profiles = r#"[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":1,"size":1},{"start":2,"size":1},{"start":3,"size":1},{"start":4,"size":1},{"start":5,"size":1},{"start":6,"size":1}]},{"name":"2g.10gb","memoryMB":10240,"core":28,"sliceCount":2,"placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]},{"name":"3g.20gb","memoryMB":20480,"core":42,"sliceCount":3,"placements":[{"start":0,"size":4},{"start":4,"size":4}]},{"name":"7g.40gb","memoryMB":40960,"core":100,"sliceCount":7,"placements":[{"start":0,"size":8}]}]"#;
        let register = format!(
            r#"[{{"id":"GPU-m","count":7,"devmem":81920,"devcore":200,"type":"NVIDIA A100-SXM4-40GB","mode":"mig","migProfiles":{profiles},"health":true}}]"#
        );
        serde_json::from_value(
            json!({"metadata": {"name": "n1", "annotations": {REGISTER: register}}}),
        )
        .unwrap()
    }

    /// A running pod with one container asking `asked` MiB, allocated the
    /// instance `profile` at `start+size` on GPU-m, seeing `visible`.
    fn mig_pod(
        name: &str,
        asked: u64,
        (profile, mem, start, size): (&str, u64, u64, u64),
        visible: &str,
    ) -> Pod {
        let mut p = pod(
            name,
            &format!("GPU-m,NVIDIA,{mem},0:;"),
            json!({"NVIDIA_VISIBLE_DEVICES": visible}),
        );
        let instances = json!([{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m",
            "profile": profile, "placement": {"start": start, "size": size}}]);
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(MIG_ALLOCATIONS.into(), instances.to_string());
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"limits": {GPUMEM: asked.to_string()}})).unwrap());
        p
    }

    #[test]
    fn disjoint_mig_instances_that_hold_their_request_are_clean() {
        let pods = [
            mig_pod("a", 8000, ("2g.10gb", 10240, 0, 2), "MIG-a"),
            mig_pod("b", 3000, ("1g.5gb", 5120, 6, 1), "MIG-b"),
            mig_pod("c", 16000, ("3g.20gb", 20480, 4, 4), "MIG-c").tap_phase("Succeeded"),
        ];
        let report = check(&pods, &[mig_node()]);
        assert!(report.is_clean(), "{report:?}");
    }

    #[test]
    fn overlapping_or_overcommitted_mig_instances_are_caught() {
        // A 3g at slices 4..8 and a 1g at slice 6: every limit of the old
        // checks holds (memory, cores, slots), the layout does not.
        let pods = [
            mig_pod("a", 16000, ("3g.20gb", 20480, 4, 4), "MIG-a"),
            mig_pod("b", 3000, ("1g.5gb", 5120, 6, 1), "MIG-b"),
        ];
        let report = check(&pods, &[mig_node()]);
        let what: Vec<(&str, u64, u64)> = report
            .overcommitted
            .iter()
            .map(|o| (o.what, o.used, o.capacity))
            .collect();
        assert_eq!(
            what,
            [("MIG instances on one memory slice", 2, 1)],
            "{report:?}"
        );
        // A 7g beside two 3g: 16 slices on a GPU of 8.
        let pods = [
            mig_pod("a", 16000, ("3g.20gb", 20480, 0, 4), "MIG-a"),
            mig_pod("b", 16000, ("3g.20gb", 20480, 4, 4), "MIG-b"),
            mig_pod("c", 30000, ("7g.40gb", 40960, 0, 8), "MIG-c"),
        ];
        let report = check(&pods, &[mig_node()]);
        let what: Vec<(&str, u64, u64)> = report
            .overcommitted
            .iter()
            .map(|o| (o.what, o.used, o.capacity))
            .collect();
        assert_eq!(
            what,
            [
                ("MIG memory slices", 16, 8),
                ("MIG instances on one memory slice", 2, 1)
            ],
            "{report:?}"
        );
        assert_eq!(report.mismatched, [], "{report:?}");
    }

    #[test]
    fn a_mig_instance_too_small_or_misplaced_or_unrecorded_is_caught() {
        let small = mig_pod("a", 8000, ("1g.5gb", 5120, 6, 1), "MIG-a");
        let misplaced = mig_pod("b", 8000, ("2g.10gb", 10240, 1, 2), "MIG-b");
        let mut unrecorded = mig_pod("c", 3000, ("1g.5gb", 5120, 5, 1), "MIG-c");
        unrecorded
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(MIG_ALLOCATIONS);
        let report = check(&[small, misplaced, unrecorded], &[mig_node()]);
        let why: Vec<(&str, &str)> = report
            .mismatched
            .iter()
            .map(|m| (m.pod.as_str(), m.why.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                (
                    "ns/a",
                    "profile 1g.5gb holds 5120 MiB, the container asked 8000 MiB"
                ),
                ("ns/b", "placement 1+2 is not one of 2g.10gb's"),
                ("ns/c", "on a MIG GPU without hami.io/vgpu-mig-allocations"),
            ],
            "{report:?}"
        );
    }

    #[test]
    fn a_mig_container_with_limits_or_a_shared_instance_is_caught() {
        let mut limited = mig_pod("a", 3000, ("1g.5gb", 5120, 6, 1), "MIG-a");
        let record = json!([{"container": "c", "init": false, "resource": "nvidia.com/gpu",
            "deviceIds": ["GPU-m-0"], "reply": {"envs": {"NVIDIA_VISIBLE_DEVICES": "MIG-a",
            "CUDA_DEVICE_SM_LIMIT": "14"}, "mounts": [], "devices": [], "annotations": {}, "cdiDevices": []}}]);
        limited
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ALLOCATIONS_ANNOTATION.into(), record.to_string());
        let whole_gpu = mig_pod("b", 3000, ("1g.5gb", 5120, 5, 1), "GPU-m");
        let shared = mig_pod("c", 3000, ("1g.5gb", 5120, 4, 1), "MIG-a");
        let report = check(&[limited, whole_gpu, shared], &[mig_node()]);
        let why: Vec<(&str, &str)> = report
            .mismatched
            .iter()
            .map(|m| (m.pod.as_str(), m.why.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                ("ns/a", "CUDA_DEVICE_SM_LIMIT is set on a MIG instance"),
                (
                    "ns/b",
                    r#"NVIDIA_VISIBLE_DEVICES ["GPU-m"]: want 1 MIG device(s) and GPUs []"#
                ),
                ("ns/c", "MIG device MIG-a is also ns/a/c's"),
            ],
            "{report:?}"
        );
    }

    trait TapPhase {
        fn tap_phase(self, phase: &str) -> Self;
    }

    impl TapPhase for Pod {
        fn tap_phase(mut self, phase: &str) -> Self {
            self.status = Some(serde_json::from_value(json!({"phase": phase})).unwrap());
            self
        }
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

//! The admission decision for one new pod, as a pure function.
//!
//! Order of checks (HAMi's, `docs/protocol.md`): no containers → deny; a pod
//! for another scheduler → untouched; per container (init first) validate
//! and fill defaults; an invalid `hami.io/device-scoring-weights` on a GPU
//! pod → deny (HAMi v2.10 `pkg/scheduler/webhook.go`; the extender refuses
//! it too, for pods that bypass the webhook); privileged + GPU → deny;
//! route to our scheduler (a
//! pre-set `spec.nodeName` → deny); strip allocation annotations a user
//! forged. Quota is checked by the caller, which owns the quota view.
//!
//! In DRA mode the same checks run, but a GPU container is rewritten to use
//! a claim instead ([`super::dra`]): its slice resources leave its limits,
//! the pod names one claim per GPU container from a shape template, and the
//! pod is not routed to the extender profile (kube-scheduler allocates).

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proto::hami::keys;
use proto::hami::scoring_weights::DeviceScoringWeights;

use super::WebhookConfig;
use super::dra::{self, Shape};
use crate::quantity::parse_whole;
use crate::settings::Mode;

/// The scheduler name kube-scheduler uses when a pod names none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Env var HAMi-core reads the task priority from.
const PRIORITY_ENV: &str = "CUDA_TASK_PRIORITY";

/// Annotations only the scheduler and the device plugin may write: a user
/// who sets them on a new pod could pick their own GPU (HAMi #3041).
pub const ALLOCATION_ANNOTATIONS: &[&str] = &[
    keys::VGPU_NODE,
    keys::VGPU_TIME,
    keys::VGPU_DEVICES_TO_ALLOCATE,
    keys::VGPU_DEVICES_ALLOCATED,
    keys::VGPU_MIG_ALLOCATIONS,
    keys::BIND_PHASE,
    keys::BIND_TIME,
    keys::BIND_ABANDONED,
];

/// What the webhook answers for a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admit as it is.
    Unchanged,
    /// Admit with these changes (the whole mutated pod).
    Mutated(Box<Pod>),
    /// DRA mode: admit with these changes, once the templates the pod's
    /// claims name exist in its namespace.
    Claimed {
        /// The whole mutated pod.
        pod: Box<Pod>,
        /// One per distinct shape, sorted by name.
        templates: Vec<ResourceClaimTemplate>,
    },
    /// Refuse, with a message for the user.
    Denied(String),
}

/// What one container asks for, read from limits (falling back to requests).
#[derive(Debug, Default)]
struct Asked {
    gpus: Option<i64>,
    mem: Option<i64>,
    pct: Option<i64>,
    cores: Option<i64>,
    priority: Option<i64>,
}

impl Asked {
    fn asks_share(&self) -> bool {
        self.mem.is_some() || self.cores.is_some() || self.pct.is_some_and(|p| p > 0)
    }
}

/// Decides what to do with a pod being created.
#[must_use]
pub fn mutate(pod: &Pod, config: &WebhookConfig) -> Verdict {
    let Some(spec) = pod.spec.as_ref().filter(|s| !s.containers.is_empty()) else {
        return Verdict::Denied("pod has no containers".to_owned());
    };
    if let Some(name) = spec.scheduler_name.as_deref()
        && !name.is_empty()
        && name != config.scheduler_name
        && name != DEFAULT_SCHEDULER
    {
        return Verdict::Unchanged;
    }
    if config.mode == Mode::Dra {
        return claim(pod, config);
    }

    let mut out = pod.clone();
    let mut uses_gpu = false;
    let mut privileged = None;
    if let Some(out_spec) = out.spec.as_mut() {
        let init = out_spec.init_containers.iter_mut().flatten();
        for container in init.chain(out_spec.containers.iter_mut()) {
            match mutate_container(container, config) {
                Ok(true) => {
                    uses_gpu = true;
                    if is_privileged(container) {
                        privileged.get_or_insert_with(|| container.name.clone());
                    }
                }
                Ok(false) => {}
                Err(message) => return Verdict::Denied(message),
            }
        }
    }
    if !uses_gpu {
        return Verdict::Unchanged;
    }
    if let Some(weights) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::DEVICE_SCORING_WEIGHTS))
        && let Err(e) = weights.parse::<DeviceScoringWeights>()
    {
        return Verdict::Denied(e.to_string());
    }
    if let Some(name) = privileged {
        return Verdict::Denied(format!(
            "container {name} is privileged and asks for {}: a privileged container sees every GPU, so it cannot use a slice",
            config.resources.resource_name
        ));
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Verdict::Denied(format!(
            "spec.nodeName is set to {node}: pods asking for {} must be placed by {}, remove spec.nodeName",
            config.resources.resource_name, config.scheduler_name
        ));
    }
    if let Some(out_spec) = out.spec.as_mut() {
        out_spec.scheduler_name = Some(config.scheduler_name.clone());
    }
    if let Some(annotations) = out.metadata.annotations.as_mut() {
        annotations.retain(|k, _| !ALLOCATION_ANNOTATIONS.contains(&k.as_str()));
    }
    if out == *pod {
        Verdict::Unchanged
    } else {
        Verdict::Mutated(Box::new(out))
    }
}

/// DRA mode: the pod with a claim per GPU container and the templates
/// those claims name.
fn claim(pod: &Pod, config: &WebhookConfig) -> Verdict {
    let mut out = pod.clone();
    let Some(out_spec) = out.spec.as_mut() else {
        return Verdict::Denied("pod has no containers".to_owned());
    };
    let mut claims: Vec<(String, Shape)> = Vec::new();
    let mut privileged = None;
    let init = out_spec.init_containers.iter_mut().flatten();
    for container in init.chain(out_spec.containers.iter_mut()) {
        let shape = match claim_shape(container, config) {
            Ok(Some(shape)) => shape,
            Ok(None) => continue,
            Err(message) => return Verdict::Denied(message),
        };
        let name = match dra::claim_name(&container.name) {
            Ok(name) => name,
            Err(message) => return Verdict::Denied(message),
        };
        if is_privileged(container) {
            privileged.get_or_insert_with(|| container.name.clone());
        }
        dra::claim_container(container, &config.resources, &name);
        claims.push((name, shape));
    }
    if claims.is_empty() {
        return Verdict::Unchanged;
    }
    if let Some(name) = privileged {
        return Verdict::Denied(format!(
            "container {name} is privileged and asks for {}: a privileged container sees every GPU, so it cannot use a slice",
            config.resources.resource_name
        ));
    }
    if let Some(node) = out_spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Verdict::Denied(format!(
            "spec.nodeName is set to {node}: pods asking for {} must be placed by kube-scheduler, which allocates their GPU claims, remove spec.nodeName",
            config.resources.resource_name
        ));
    }
    if let Err(message) = dra::claim_pod(out_spec, &claims) {
        return Verdict::Denied(message);
    }
    // kube-scheduler's DynamicResources plugin allocates: a pod that names
    // the extender profile goes to the default scheduler instead.
    if out_spec.scheduler_name.as_deref() == Some(config.scheduler_name.as_str()) {
        out_spec.scheduler_name = None;
    }
    if let Some(annotations) = out.metadata.annotations.as_mut() {
        annotations.retain(|k, _| !ALLOCATION_ANNOTATIONS.contains(&k.as_str()));
    }
    let shapes: BTreeSet<Shape> = claims.iter().map(|(_, s)| *s).collect();
    let mut templates: Vec<ResourceClaimTemplate> = shapes.iter().map(Shape::template).collect();
    templates.sort_by_key(|t| t.metadata.name.clone());
    Verdict::Claimed {
        pod: Box::new(out),
        templates,
    }
}

/// DRA mode: validates one container and works out the shape of its claim
/// (`None` when it asks for no GPU); sets the priority env as in
/// device-plugin mode. The same defaults apply: `defaultGPUNum` when only
/// memory or cores are asked, `defaultMemory`, `memoryFactor`, and a whole
/// card without cores is exclusive (`cores: 100`).
fn claim_shape(container: &mut Container, config: &WebhookConfig) -> Result<Option<Shape>, String> {
    let names = &config.resources;
    let asked = asked(container, config)?;
    let who = &container.name;
    if asked.pct.is_some() {
        return Err(format!(
            "{} is not supported in DRA mode (container {who}): ask {} in MiB, or neither for the whole memory",
            names.resource_mem_percentage, names.resource_mem
        ));
    }
    let gpus = match asked.gpus {
        Some(n) => n,
        None if asked.asks_share() => i64::from(config.default_gpu_num),
        None => 0,
    };
    if gpus == 0 {
        return Ok(None);
    }
    let gpus = u32::try_from(gpus)
        .ok()
        .filter(|n| *n <= dra::MAX_GPUS)
        .and_then(NonZeroU32::new)
        .ok_or_else(|| {
            format!(
                "{} must be 1–{} in DRA mode, got {gpus} (container {who})",
                names.resource_name,
                dra::MAX_GPUS
            )
        })?;
    let memory_mib = match asked.mem {
        Some(0) => {
            return Err(format!(
                "{} must be at least 1 MiB, got 0 (container {who})",
                names.resource_mem
            ));
        }
        // In range: `asked` checked that the product fits an i32.
        Some(mem) => u32::try_from(mem.saturating_mul(i64::from(config.memory_factor)))
            .ok()
            .and_then(NonZeroU32::new),
        None => NonZeroU32::new(config.default_memory),
    };
    let cores = match asked.cores {
        // In range: `asked` checked 0–100.
        Some(c) => u32::try_from(c).unwrap_or(100),
        None if memory_mib.is_none() => 100,
        None => config.default_cores,
    };
    if let Some(priority) = asked.priority {
        set_env(container, PRIORITY_ENV, &priority.to_string());
    }
    Ok(Some(Shape {
        gpus,
        memory_mib,
        cores,
    }))
}

/// Reads what a container asks for and checks the ranges both modes share.
fn asked(container: &Container, config: &WebhookConfig) -> Result<Asked, String> {
    let names = &config.resources;
    let asked = Asked {
        gpus: quantity(container, &names.resource_name)?,
        mem: quantity(container, &names.resource_mem)?,
        pct: quantity(container, &names.resource_mem_percentage)?,
        cores: quantity(container, &names.resource_cores)?,
        priority: quantity(container, &names.resource_priority)?,
    };
    let who = &container.name;
    if let Some(pct) = asked.pct
        && pct > 100
    {
        return Err(format!(
            "{} must be 1–100, got {pct} (container {who})",
            names.resource_mem_percentage
        ));
    }
    if let Some(cores) = asked.cores
        && cores > 100
    {
        return Err(format!(
            "{} must be 0–100, got {cores} (container {who})",
            names.resource_cores
        ));
    }
    if let Some(mem) = asked.mem
        && i32::try_from(mem.saturating_mul(i64::from(config.memory_factor))).is_err()
    {
        return Err(format!(
            "{} of {mem} MiB is too large (container {who})",
            names.resource_mem
        ));
    }
    Ok(asked)
}

/// Validates one container and fills its defaults; `Ok(true)` when it uses
/// a GPU afterwards.
fn mutate_container(container: &mut Container, config: &WebhookConfig) -> Result<bool, String> {
    let names = &config.resources;
    let asked = asked(container, config)?;
    let gpus = match asked.gpus {
        Some(n) => n,
        None if asked.asks_share() && config.default_gpu_num > 0 => {
            let n = i64::from(config.default_gpu_num);
            set_limit(container, &names.resource_name, n);
            n
        }
        None => 0,
    };
    if gpus == 0 {
        return Ok(false);
    }
    let whole_card_memory = asked.mem.is_none()
        && match asked.pct {
            Some(100) => true,
            None | Some(0) => config.default_memory == 0,
            Some(_) => false,
        };
    if asked.cores.is_none() && whole_card_memory {
        set_limit(container, &names.resource_cores, 100);
    }
    if let Some(priority) = asked.priority {
        set_env(container, PRIORITY_ENV, &priority.to_string());
    }
    Ok(true)
}

/// A resource of the container, from limits, else requests.
fn quantity(container: &Container, name: &str) -> Result<Option<i64>, String> {
    let resources = container.resources.as_ref();
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(name));
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|l| l.get(name));
    limit
        .or(request)
        .map(|q| {
            parse_whole(&q.0).map_err(|e| format!("{name} in container {}: {e}", container.name))
        })
        .transpose()
}

fn set_limit(container: &mut Container, name: &str, value: i64) {
    container
        .resources
        .get_or_insert_with(Default::default)
        .limits
        .get_or_insert_with(BTreeMap::new)
        .insert(name.to_owned(), Quantity(value.to_string()));
}

fn set_env(container: &mut Container, name: &str, value: &str) {
    let env = container.env.get_or_insert_with(Vec::new);
    match env.iter_mut().find(|e| e.name == name) {
        Some(var) => {
            var.value = Some(value.to_owned());
            var.value_from = None;
        }
        None => env.push(EnvVar {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            value_from: None,
        }),
    }
}

fn is_privileged(container: &Container) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config() -> WebhookConfig {
        WebhookConfig::default()
    }

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn gpu_pod(limits: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}]}
        }))
    }

    fn mutated(verdict: Verdict) -> Pod {
        match verdict {
            Verdict::Mutated(p) => *p,
            other => panic!("expected a mutation, got {other:?}"),
        }
    }

    fn denied(verdict: Verdict) -> String {
        match verdict {
            Verdict::Denied(m) => m,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    fn limits(pod: &Pod, i: usize) -> BTreeMap<String, Quantity> {
        pod.spec.as_ref().unwrap().containers[i]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap()
    }

    #[test]
    fn pod_without_gpu_request_is_not_mutated() {
        let p = gpu_pod(json!({"cpu": "1"}));
        assert_eq!(mutate(&p, &config()), Verdict::Unchanged);
    }

    #[test]
    fn invalid_scoring_weights_deny_a_gpu_pod_only() {
        // HAMi v2.10 pkg/scheduler/webhook.go: `GetDeviceScoringWeightsByPod`
        // is checked when the pod has HAMi resources.
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.metadata.annotations = Some(BTreeMap::from([(
            keys::DEVICE_SCORING_WEIGHTS.to_owned(),
            "slot=1,core=2".to_owned(),
        )]));
        assert_eq!(
            denied(mutate(&p, &config())),
            "invalid hami.io/device-scoring-weights annotation \"slot=1,core=2\": expected slot, core, and memory weights"
        );
        let mut cpu_only = gpu_pod(json!({"cpu": "1"}));
        cpu_only.metadata.annotations = p.metadata.annotations.clone();
        assert_eq!(mutate(&cpu_only, &config()), Verdict::Unchanged);
        p.metadata.annotations = Some(BTreeMap::from([(
            keys::DEVICE_SCORING_WEIGHTS.to_owned(),
            "slot=0,core=0,memory=1".to_owned(),
        )]));
        assert!(matches!(mutate(&p, &config()), Verdict::Mutated(_)));
    }

    #[test]
    fn pod_without_containers_is_denied() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert_eq!(denied(mutate(&p, &config())), "pod has no containers");
    }

    #[test]
    fn pod_for_another_scheduler_passes_untouched() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().scheduler_name = Some("volcano".into());
        assert_eq!(mutate(&p, &config()), Verdict::Unchanged);
    }

    #[test]
    fn gpu_pod_is_routed_to_our_scheduler() {
        let p = gpu_pod(
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
        );
        let out = mutated(mutate(&p, &config()));
        assert_eq!(
            out.spec.unwrap().scheduler_name.as_deref(),
            Some("gpuslice-scheduler")
        );
    }

    #[test]
    fn default_scheduler_is_overwritten() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}));
        p.spec.as_mut().unwrap().scheduler_name = Some(DEFAULT_SCHEDULER.into());
        let out = mutated(mutate(&p, &config()));
        assert_eq!(
            out.spec.unwrap().scheduler_name.as_deref(),
            Some("gpuslice-scheduler")
        );
    }

    #[test]
    fn gpu_count_is_added_when_only_memory_or_cores_is_asked() {
        for asked in [
            json!({"nvidia.com/gpumem": "3000"}),
            json!({"nvidia.com/gpucores": "20"}),
            json!({"nvidia.com/gpumem-percentage": "50"}),
        ] {
            let out = mutated(mutate(&gpu_pod(asked.clone()), &config()));
            assert_eq!(
                limits(&out, 0)["nvidia.com/gpu"],
                Quantity("1".into()),
                "{asked}"
            );
        }
    }

    #[test]
    fn no_gpu_count_is_added_when_default_gpu_num_is_zero() {
        let cfg = WebhookConfig {
            default_gpu_num: 0,
            ..config()
        };
        let p = gpu_pod(json!({"nvidia.com/gpumem": "3000"}));
        assert_eq!(mutate(&p, &cfg), Verdict::Unchanged);
    }

    #[test]
    fn whole_card_without_cores_becomes_exclusive() {
        for asked in [
            json!({"nvidia.com/gpu": "1"}),
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"}),
        ] {
            let out = mutated(mutate(&gpu_pod(asked.clone()), &config()));
            assert_eq!(
                limits(&out, 0)["nvidia.com/gpucores"],
                Quantity("100".into()),
                "{asked}"
            );
        }
    }

    #[test]
    fn a_slice_without_cores_is_not_made_exclusive() {
        for asked in [
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
        ] {
            let out = mutated(mutate(&gpu_pod(asked.clone()), &config()));
            assert!(
                !limits(&out, 0).contains_key("nvidia.com/gpucores"),
                "{asked}"
            );
        }
        let cfg = WebhookConfig {
            default_memory: 2000,
            ..config()
        };
        let out = mutated(mutate(&gpu_pod(json!({"nvidia.com/gpu": "1"})), &cfg));
        assert!(!limits(&out, 0).contains_key("nvidia.com/gpucores"));
    }

    #[test]
    fn out_of_range_percentages_and_cores_are_denied_with_the_value() {
        let m = denied(mutate(
            &gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "140"})),
            &config(),
        ));
        assert!(
            m.starts_with("nvidia.com/gpumem-percentage must be 1–100, got 140"),
            "{m}"
        );
        let m = denied(mutate(
            &gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"})),
            &config(),
        ));
        assert!(
            m.starts_with("nvidia.com/gpucores must be 0–100, got 101"),
            "{m}"
        );
    }

    #[test]
    fn malformed_quantities_are_denied_with_the_resource_name() {
        let m = denied(mutate(
            &gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"})),
            &config(),
        ));
        assert!(m.contains("nvidia.com/gpumem in container c"), "{m}");
    }

    #[test]
    fn privileged_gpu_container_is_denied() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().containers[0].security_context =
            Some(serde_json::from_value(json!({"privileged": true})).unwrap());
        assert!(denied(mutate(&p, &config())).contains("privileged"));
    }

    #[test]
    fn preset_node_name_is_denied() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().node_name = Some("gpu-1".into());
        assert!(denied(mutate(&p, &config())).contains("spec.nodeName is set to gpu-1"));
    }

    #[test]
    fn forged_allocation_annotations_are_removed_and_policies_kept() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}));
        p.metadata.annotations = Some(BTreeMap::from([
            (
                keys::VGPU_DEVICES_TO_ALLOCATE.to_owned(),
                "GPU-x,NVIDIA,1000,0:;".to_owned(),
            ),
            (keys::VGPU_NODE.to_owned(), "gpu-1".to_owned()),
            (keys::BIND_PHASE.to_owned(), "success".to_owned()),
            (keys::GPU_SCHEDULER_POLICY.to_owned(), "binpack".to_owned()),
        ]));
        let out = mutated(mutate(&p, &config()));
        let annotations = out.metadata.annotations.unwrap();
        assert_eq!(annotations.len(), 1, "{annotations:?}");
        assert!(annotations.contains_key(keys::GPU_SCHEDULER_POLICY));
    }

    #[test]
    fn init_containers_are_mutated_too() {
        let p = pod(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpumem": "500"}}}],
                "containers": [{"name": "c"}]
            }
        }));
        let out = mutated(mutate(&p, &config()));
        let init = &out.spec.unwrap().init_containers.unwrap()[0];
        let l = init.resources.clone().unwrap().limits.unwrap();
        assert_eq!(l["nvidia.com/gpu"], Quantity("1".into()));
    }

    #[test]
    fn priority_becomes_env() {
        let p = gpu_pod(
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10", "nvidia.com/priority": "1"}),
        );
        let out = mutated(mutate(&p, &config()));
        let env = out.spec.unwrap().containers[0].env.clone().unwrap();
        assert!(
            env.iter()
                .any(|e| e.name == PRIORITY_ENV && e.value.as_deref() == Some("1"))
        );
    }

    #[test]
    fn requests_are_read_when_limits_are_absent() {
        let p = pod(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpumem-percentage": "300"}}}]}
        }));
        assert!(denied(mutate(&p, &config())).contains("got 300"));
    }

    #[test]
    fn custom_resource_names_are_honoured() {
        let mut cfg = config();
        cfg.resources.resource_name = "example.com/vgpu".into();
        cfg.resources.resource_mem = "example.com/vgpumem".into();
        let out = mutated(mutate(
            &gpu_pod(json!({"example.com/vgpumem": "100"})),
            &cfg,
        ));
        assert!(limits(&out, 0).contains_key("example.com/vgpu"));
    }

    // === DRA mode ===

    fn dra() -> WebhookConfig {
        WebhookConfig {
            mode: Mode::Dra,
            ..config()
        }
    }

    fn claimed(verdict: Verdict) -> (Pod, Vec<String>) {
        match verdict {
            Verdict::Claimed { pod, templates } => (
                *pod,
                templates
                    .into_iter()
                    .map(|t| t.metadata.name.unwrap())
                    .collect(),
            ),
            other => panic!("expected claims, got {other:?}"),
        }
    }

    #[test]
    fn dra_mode_turns_slice_limits_into_a_claim_from_a_shape_template() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
            "nvidia.com/gpucores": "30", "cpu": "1"}));
        p.spec.as_mut().unwrap().scheduler_name = Some("gpuslice-scheduler".into());
        let (out, templates) = claimed(mutate(&p, &dra()));
        assert_eq!(templates, ["gpuslice-1gpu-3000mi-30c"]);
        let spec = serde_json::to_value(out.spec.unwrap()).unwrap();
        assert_eq!(
            spec["resourceClaims"],
            json!([{"name": "gpuslice-c", "resourceClaimTemplateName": "gpuslice-1gpu-3000mi-30c"}])
        );
        assert_eq!(
            spec["containers"][0]["resources"],
            json!({"limits": {"cpu": "1"}, "claims": [{"name": "gpuslice-c"}]})
        );
        assert!(
            spec.get("schedulerName").is_none(),
            "not routed to the extender profile: {spec}"
        );
    }

    #[test]
    fn dra_mode_applies_the_same_defaults() {
        let cases = [
            (json!({"nvidia.com/gpu": "1"}), "gpuslice-1gpu-100c"),
            (
                json!({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "20"}),
                "gpuslice-2gpu-20c",
            ),
            (
                json!({"nvidia.com/gpumem": "1000"}),
                "gpuslice-1gpu-1000mi-0c",
            ),
            (json!({"nvidia.com/gpucores": "50"}), "gpuslice-1gpu-50c"),
        ];
        for (limits, want) in cases {
            let (_, templates) = claimed(mutate(&gpu_pod(limits.clone()), &dra()));
            assert_eq!(templates, [want], "{limits}");
        }
        let cfg = WebhookConfig {
            default_memory: 2000,
            default_cores: 10,
            memory_factor: 2,
            ..dra()
        };
        let (_, templates) = claimed(mutate(&gpu_pod(json!({"nvidia.com/gpu": "1"})), &cfg));
        assert_eq!(templates, ["gpuslice-1gpu-2000mi-10c"]);
        let (_, templates) = claimed(mutate(
            &gpu_pod(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1500"})),
            &cfg,
        ));
        assert_eq!(templates, ["gpuslice-1gpu-3000mi-10c"], "memoryFactor 2");
    }

    #[test]
    fn dra_mode_gives_each_gpu_container_its_claim_and_shares_templates() {
        let p = pod(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpumem": "500"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpumem": "500"}}},
                    {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                    {"name": "web"}
                ]
            }
        }));
        let (out, templates) = claimed(mutate(&p, &dra()));
        assert_eq!(templates, ["gpuslice-1gpu-500mi-0c", "gpuslice-2gpu-100c"]);
        let spec = out.spec.unwrap();
        let claims: Vec<_> = spec
            .resource_claims
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.resource_claim_template_name.unwrap()))
            .collect();
        assert_eq!(
            claims,
            [
                ("gpuslice-warm".into(), "gpuslice-1gpu-500mi-0c".into()),
                ("gpuslice-a".into(), "gpuslice-1gpu-500mi-0c".into()),
                ("gpuslice-b".into(), "gpuslice-2gpu-100c".into()),
            ]
        );
        assert!(spec.containers[2].resources.is_none(), "web is untouched");
    }

    #[test]
    fn dra_mode_keeps_the_priority_as_env_and_leaves_cpu_pods_alone() {
        let p = gpu_pod(
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10", "nvidia.com/priority": "1"}),
        );
        let (out, _) = claimed(mutate(&p, &dra()));
        let c = &out.spec.unwrap().containers[0];
        assert!(c.env.iter().flatten().any(|e| e.name == PRIORITY_ENV));
        assert!(c.resources.as_ref().unwrap().limits.is_none(), "{c:?}");
        assert_eq!(
            mutate(&gpu_pod(json!({"cpu": "1"})), &dra()),
            Verdict::Unchanged
        );
    }

    #[test]
    fn dra_mode_denies_bad_input_precisely() {
        let cases = [
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
                "nvidia.com/gpumem-percentage is not supported in DRA mode (container c): ask nvidia.com/gpumem in MiB, or neither for the whole memory",
            ),
            (
                json!({"nvidia.com/gpu": "33"}),
                "nvidia.com/gpu must be 1–32 in DRA mode, got 33 (container c)",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}),
                "nvidia.com/gpumem must be at least 1 MiB, got 0 (container c)",
            ),
            (
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}),
                "nvidia.com/gpucores must be 0–100, got 101 (container c)",
            ),
        ];
        for (limits, want) in cases {
            assert_eq!(denied(mutate(&gpu_pod(limits), &dra())), want);
        }
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().node_name = Some("gpu-1".into());
        assert!(denied(mutate(&p, &dra())).starts_with("spec.nodeName is set to gpu-1"));
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().containers[0].name = "x".repeat(60);
        assert!(denied(mutate(&p, &dra())).contains("too long for DRA mode"));
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().containers[0].security_context =
            Some(serde_json::from_value(json!({"privileged": true})).unwrap());
        assert!(denied(mutate(&p, &dra())).contains("privileged"));
    }

    #[test]
    fn dra_mode_leaves_pods_of_other_schedulers_alone() {
        let mut p = gpu_pod(json!({"nvidia.com/gpu": "1"}));
        p.spec.as_mut().unwrap().scheduler_name = Some("volcano".into());
        assert_eq!(mutate(&p, &dra()), Verdict::Unchanged);
    }
}

//! The checker's reading of DRA mode, from what the API server shows: the
//! `ResourceSlice`s of driver `gpu.gpuslice.dev` (each GPU's `memory` and
//! `cores` capacity and its `uuid`), the allocated `ResourceClaim`s (which
//! GPU each request got and what it consumes) and the container
//! environment the (fake) kubelet recorded from the CDI specs.
//!
//! It checks that
//! - per GPU, the memory and cores consumed by allocated claims sum to no
//!   more than its capacity (a claim without `consumedCapacity` for a name
//!   consumes that capacity's request-policy default: the whole memory, 0
//!   cores);
//! - every container that uses a claim of the driver sees exactly the GPUs
//!   its claim got (`NVIDIA_VISIBLE_DEVICES`), with each GPU's consumed
//!   memory as its HAMi-core limit (`CUDA_DEVICE_MEMORY_LIMIT_<i>`, `i` its
//!   position in `NVIDIA_VISIBLE_DEVICES`) and the consumed cores as
//!   `CUDA_DEVICE_SM_LIMIT`;
//! - every bound, live pod's claims of the driver are allocated and
//!   reserved for it.
//!
//! Quantities are read here with their own small parser, not with the
//! driver's codec.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use super::{Mismatch, OverCommit, Report, is_live, pod_key};
use crate::fake_kubelet::{ALLOCATIONS_ANNOTATION, ContainerAllocation};

/// The driver whose devices are checked.
pub const DRIVER: &str = "gpu.gpuslice.dev";

/// One published GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Gpu {
    node: String,
    uuid: String,
    mem: u64,
    cores: u64,
}

/// What one allocated request result holds on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    pool: String,
    device: String,
    request: String,
    mem: Option<u64>,
    cores: Option<u64>,
}

/// MiB in a Kubernetes quantity (`3000Mi`, `40Gi`, `3145728000`, `3k`):
/// `None` when it does not read or is not a whole number of MiB.
#[must_use]
pub fn quantity_mib(q: &str) -> Option<u64> {
    let bytes = quantity(q)?;
    (bytes % (1 << 20) == 0).then(|| u64::try_from(bytes >> 20).ok())?
}

/// A Kubernetes quantity as a whole number (`100`, `1k`, `2Mi`); `None`
/// for fractions, negatives and anything else.
#[must_use]
pub fn quantity(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    digits.parse::<u128>().ok()?.checked_mul(multiplier)
}

/// `(pool, device) -> Gpu` for every device of the driver.
fn gpus(slices: &[ResourceSlice]) -> BTreeMap<(String, String), Gpu> {
    let mut out = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.spec.driver == DRIVER) {
        let node = slice.spec.node_name.clone().unwrap_or_default();
        for d in slice.spec.devices.iter().flatten() {
            let capacity = |name: &str| d.capacity.as_ref()?.get(name).map(|c| c.value.0.clone());
            let uuid = d
                .attributes
                .as_ref()
                .and_then(|a| a.get("uuid"))
                .and_then(|a| a.string.clone())
                .unwrap_or_default();
            out.insert(
                (slice.spec.pool.name.clone(), d.name.clone()),
                Gpu {
                    node: node.clone(),
                    uuid,
                    mem: capacity("memory")
                        .and_then(|q| quantity_mib(&q))
                        .unwrap_or(0),
                    cores: capacity("cores")
                        .and_then(|q| quantity(&q))
                        .and_then(|c| u64::try_from(c).ok())
                        .unwrap_or(0),
                },
            );
        }
    }
    out
}

/// The driver's results of an allocated claim (empty when unallocated).
fn results(claim: &ResourceClaim) -> Vec<Held> {
    let Some(results) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
    else {
        return Vec::new();
    };
    results
        .iter()
        .filter(|r| r.driver == DRIVER)
        .map(|r| {
            let consumed = |name: &str| {
                r.consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .map(|q| q.0.clone())
            };
            Held {
                pool: r.pool.clone(),
                device: r.device.clone(),
                request: r.request.clone(),
                mem: consumed("memory").and_then(|q| quantity_mib(&q)),
                cores: consumed("cores")
                    .and_then(|q| quantity(&q))
                    .and_then(|c| u64::try_from(c).ok()),
            }
        })
        .collect()
}

fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

fn is_reserved_for(claim: &ResourceClaim, pod: &Pod) -> bool {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| r.iter().any(|c| c.resource == "pods" && c.uid == uid))
}

/// The ResourceClaim names of a pod's claims, by the pod's claim name
/// (`spec.resourceClaims[].resourceClaimName`, or for a template claim its
/// `status.resourceClaimStatuses` entry).
#[must_use]
pub fn claim_names(pod: &Pod) -> BTreeMap<String, Option<String>> {
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            let name = c.resource_claim_name.clone().or_else(|| {
                statuses
                    .get(c.name.as_str())
                    .copied()
                    .flatten()
                    .map(str::to_owned)
            });
            (c.name.clone(), name)
        })
        .collect()
}

/// Adds the DRA findings to `report`.
pub fn check(
    pods: &[Pod],
    claims: &[ResourceClaim],
    slices: &[ResourceSlice],
    report: &mut Report,
) {
    let gpus = gpus(slices);
    let by_name: BTreeMap<(String, String), &ResourceClaim> = claims
        .iter()
        .map(|c| {
            (
                (
                    c.metadata.namespace.clone().unwrap_or_default(),
                    c.metadata.name.clone().unwrap_or_default(),
                ),
                c,
            )
        })
        .collect();

    // Per GPU: what every allocated claim consumes.
    let mut used: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for claim in claims {
        for held in results(claim) {
            let key = (held.pool.clone(), held.device.clone());
            let Some(gpu) = gpus.get(&key) else {
                report.overcommitted.push(OverCommit {
                    node: held.pool.clone(),
                    uuid: format!("{}/{}", held.pool, held.device),
                    what: "unpublished device",
                    used: 1,
                    capacity: 0,
                });
                continue;
            };
            let u = used.entry(key).or_default();
            u.0 += held.mem.unwrap_or(gpu.mem);
            u.1 += held.cores.unwrap_or(0);
        }
    }
    for (key, (mem, cores)) in used {
        let gpu = &gpus[&key];
        for (what, used, capacity) in [("memory", mem, gpu.mem), ("cores", cores, gpu.cores)] {
            if used > capacity {
                report.overcommitted.push(OverCommit {
                    node: gpu.node.clone(),
                    uuid: gpu.uuid.clone(),
                    what,
                    used,
                    capacity,
                });
            }
        }
    }

    for pod in pods {
        check_pod(pod, &by_name, &gpus, report);
    }
}

/// One pod: its claims are allocated and reserved for it, and each
/// container's recorded environment matches its claims' results.
fn check_pod(
    pod: &Pod,
    claims: &BTreeMap<(String, String), &ResourceClaim>,
    gpus: &BTreeMap<(String, String), Gpu>,
    report: &mut Report,
) {
    let key = pod_key(pod);
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let names = claim_names(pod);
    // The pod's claims of the driver, by the pod's claim name.
    let mut ours: BTreeMap<&str, Vec<Held>> = BTreeMap::new();
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    for (pod_claim, name) in &names {
        let claim = name
            .as_ref()
            .and_then(|n| claims.get(&(namespace.clone(), n.clone())));
        let Some(claim) = claim else {
            if bound && is_live(pod) && pod_claim.starts_with("gpuslice-") {
                report.unfinished.push(Mismatch {
                    pod: key.clone(),
                    container: String::new(),
                    why: format!("bound, but its claim {pod_claim} has no ResourceClaim"),
                });
            }
            continue;
        };
        let held = results(claim);
        let of_driver = !held.is_empty() || pod_claim.starts_with("gpuslice-");
        if !of_driver {
            continue;
        }
        if bound && is_live(pod) && !(is_allocated(claim) && is_reserved_for(claim, pod)) {
            report.unfinished.push(Mismatch {
                pod: key.clone(),
                container: String::new(),
                why: format!(
                    "bound, but claim {} is not allocated and reserved for it",
                    claim.metadata.name.as_deref().unwrap_or_default()
                ),
            });
        }
        ours.insert(pod_claim.as_str(), held);
    }
    if ours.is_empty() {
        return;
    }
    let records: Vec<ContainerAllocation> = match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOCATIONS_ANNOTATION))
    {
        None => Vec::new(),
        Some(text) => match serde_json::from_str(text) {
            Ok(r) => r,
            Err(_) => {
                report.mismatched.push(Mismatch {
                    pod: key,
                    container: String::new(),
                    why: "kubelet allocation record does not parse".to_owned(),
                });
                return;
            }
        },
    };
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    for (container, is_init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
        let held: Vec<&Held> = container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let results = ours.get(c.name.as_str())?;
                Some(
                    results
                        .iter()
                        .filter(move |h| c.request.as_deref().is_none_or(|r| r == h.request)),
                )
            })
            .flatten()
            .collect();
        if held.is_empty() {
            continue;
        }
        let record = records
            .iter()
            .find(|r| r.container == container.name && r.init == is_init);
        let Some(record) = record else {
            if running {
                report.mismatched.push(Mismatch {
                    pod: key.clone(),
                    container: container.name.clone(),
                    why: "running without a kubelet record of its claims' devices".to_owned(),
                });
            }
            continue;
        };
        for why in env_problems(&record.reply.envs, &held, gpus) {
            report.mismatched.push(Mismatch {
                pod: key.clone(),
                container: container.name.clone(),
                why,
            });
        }
    }
}

/// What is wrong with a container's env against the results it holds.
fn env_problems(
    env: &BTreeMap<String, String>,
    held: &[&Held],
    gpus: &BTreeMap<(String, String), Gpu>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let visible: Vec<&str> = env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').collect())
        .unwrap_or_default();
    let mut want: Vec<(&str, u64, u64)> = Vec::new();
    for h in held {
        let Some(gpu) = gpus.get(&(h.pool.clone(), h.device.clone())) else {
            problems.push(format!("device {}/{} is not published", h.pool, h.device));
            continue;
        };
        want.push((&gpu.uuid, h.mem.unwrap_or(gpu.mem), h.cores.unwrap_or(0)));
    }
    let mut want_uuids: Vec<&str> = want.iter().map(|w| w.0).collect();
    let mut seen = visible.clone();
    want_uuids.sort_unstable();
    seen.sort_unstable();
    if want_uuids != seen {
        problems.push(format!(
            "NVIDIA_VISIBLE_DEVICES {:?}, the claims got {want_uuids:?}",
            env.get("NVIDIA_VISIBLE_DEVICES")
        ));
        return problems;
    }
    for (i, uuid) in visible.iter().enumerate() {
        let Some((_, mem, _)) = want.iter().find(|w| w.0 == *uuid) else {
            continue;
        };
        let name = format!("CUDA_DEVICE_MEMORY_LIMIT_{i}");
        let expected = format!("{mem}m");
        if env.get(&name) != Some(&expected) {
            problems.push(format!(
                "{name} {:?}, the claim consumes {expected:?} of {uuid}",
                env.get(&name)
            ));
        }
    }
    if let Some((_, _, cores)) = want.first() {
        let expected = cores.to_string();
        if env.get("CUDA_DEVICE_SM_LIMIT") != Some(&expected) {
            problems.push(format!(
                "CUDA_DEVICE_SM_LIMIT {:?}, the claim consumes {expected:?} cores",
                env.get("CUDA_DEVICE_SM_LIMIT")
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice() -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "n1-gpu.gpuslice.dev"},
            "spec": {"driver": DRIVER, "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "allowMultipleAllocations": true,
                     "attributes": {"uuid": {"string": "GPU-a"}},
                     "capacity": {"memory": {"value": "40960Mi"}, "cores": {"value": "100"}}},
                    {"name": "gpu-1", "allowMultipleAllocations": true,
                     "attributes": {"uuid": {"string": "GPU-b"}},
                     "capacity": {"memory": {"value": "40Gi"}, "cores": {"value": "100"}}}
                ]}
        }))
        .unwrap()
    }

    fn claim(name: &str, pod_uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {},
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}]
            }
        }))
        .unwrap()
    }

    fn result(device: &str, mem: &str, cores: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device,
               "consumedCapacity": {"memory": mem, "cores": cores}})
    }

    fn pod(name: &str, uid: &str, claim: &str, env: serde_json::Value) -> Pod {
        let record = json!([{"container": "c", "init": false, "resource": "resource.k8s.io/claims",
            "deviceIds": [], "reply": {"envs": env, "mounts": [], "devices": [], "annotations": {}, "cdiDevices": []}}]);
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                "annotations": {ALLOCATIONS_ANNOTATION: record.to_string()}},
            "spec": {"nodeName": "n1", "resourceClaims": [{"name": "gpuslice-c", "resourceClaimTemplateName": "t"}],
                "containers": [{"name": "c", "resources": {"claims": [{"name": "gpuslice-c"}]}}]},
            "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "gpuslice-c", "resourceClaimName": claim}]}
        }))
        .unwrap()
    }

    fn env(uuids: &str, mems: &[&str], cores: &str) -> serde_json::Value {
        let mut e = json!({"NVIDIA_VISIBLE_DEVICES": uuids, "CUDA_DEVICE_SM_LIMIT": cores});
        for (i, m) in mems.iter().enumerate() {
            e[format!("CUDA_DEVICE_MEMORY_LIMIT_{i}")] = json!(m);
        }
        e
    }

    fn run(pods: &[Pod], claims: &[ResourceClaim]) -> Report {
        let mut report = Report::default();
        check(pods, claims, &[slice()], &mut report);
        report
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity_mib("3000Mi"), Some(3000));
        assert_eq!(quantity_mib("40Gi"), Some(40960));
        assert_eq!(quantity_mib("1048576"), Some(1));
        assert_eq!(quantity_mib("1000"), None, "not a whole MiB");
        assert_eq!(quantity("100"), Some(100));
        assert_eq!(quantity("0.5"), None);
        assert_eq!(quantity("-1"), None);
    }

    #[test]
    fn matching_claims_and_env_are_clean() {
        let claims = [claim("c1", "u1", json!([result("gpu-0", "3000Mi", "30")]))];
        let pods = [pod("p", "u1", "c1", env("GPU-a", &["3000m"], "30"))];
        assert_eq!(run(&pods, &claims), Report::default());
    }

    #[test]
    fn an_over_committed_gpu_is_reported_with_its_sums() {
        let claims = [
            claim("c1", "u1", json!([result("gpu-0", "30000Mi", "60")])),
            claim("c2", "u2", json!([result("gpu-0", "20000Mi", "50")])),
        ];
        let report = run(&[], &claims);
        assert_eq!(
            report.overcommitted,
            [
                OverCommit {
                    node: "n1".into(),
                    uuid: "GPU-a".into(),
                    what: "memory",
                    used: 50000,
                    capacity: 40960
                },
                OverCommit {
                    node: "n1".into(),
                    uuid: "GPU-a".into(),
                    what: "cores",
                    used: 110,
                    capacity: 100
                },
            ]
        );
    }

    #[test]
    fn a_result_without_consumed_capacity_takes_the_whole_memory() {
        let whole = json!([{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}]);
        let claims = [
            claim("c1", "u1", whole),
            claim("c2", "u2", json!([result("gpu-1", "1Mi", "0")])),
        ];
        let report = run(&[], &claims);
        assert_eq!(report.overcommitted.len(), 1, "{report:?}");
        assert_eq!(report.overcommitted[0].used, 40961);
    }

    #[test]
    fn env_that_differs_from_the_allocation_is_named() {
        let claims = [claim(
            "c1",
            "u1",
            json!([
                result("gpu-0", "3000Mi", "30"),
                result("gpu-1", "2000Mi", "30")
            ]),
        )];
        // Order in NVIDIA_VISIBLE_DEVICES decides the index of each limit.
        let good = [pod(
            "p",
            "u1",
            "c1",
            env("GPU-b,GPU-a", &["2000m", "3000m"], "30"),
        )];
        assert!(run(&good, &claims).is_clean());
        let swapped = [pod(
            "p",
            "u1",
            "c1",
            env("GPU-a,GPU-b", &["2000m", "3000m"], "30"),
        )];
        let report = run(&swapped, &claims);
        assert_eq!(report.mismatched.len(), 2, "{report:?}");
        assert_eq!(
            report.mismatched[0].why,
            "CUDA_DEVICE_MEMORY_LIMIT_0 Some(\"2000m\"), the claim consumes \"3000m\" of GPU-a"
        );
        let wrong_gpu = [pod("p", "u1", "c1", env("GPU-a", &["3000m"], "30"))];
        assert!(
            run(&wrong_gpu, &claims).mismatched[0]
                .why
                .starts_with("NVIDIA_VISIBLE_DEVICES")
        );
    }

    #[test]
    fn a_bound_pod_whose_claim_is_not_reserved_for_it_is_unfinished() {
        let claims = [claim(
            "c1",
            "someone-else",
            json!([result("gpu-0", "3000Mi", "30")]),
        )];
        let pods = [pod("p", "u1", "c1", env("GPU-a", &["3000m"], "30"))];
        let report = run(&pods, &claims);
        assert_eq!(report.unfinished.len(), 1, "{report:?}");
        assert!(
            report.unfinished[0]
                .why
                .contains("not allocated and reserved")
        );
    }
}

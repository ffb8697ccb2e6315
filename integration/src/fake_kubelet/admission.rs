//! Pure admission rules: which pods kubelet admits, in which order, and what
//! each of their containers asks of the device manager.
//!
//! Owns the reading of a `Pod` (identity, phase, per-container device
//! requests) and the ordering of a batch. It does not choose devices (see
//! [`super::devices`]) nor call plugins (see `super::manager`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use thiserror::Error;

/// A pod spec kubelet could not read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// A device quantity is not a non-negative whole number.
    #[error(
        "container {container:?} requests {resource}={quantity:?}, which is not a whole number of devices"
    )]
    Quantity {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The quantity as written.
        quantity: String,
    },
}

/// Who a pod is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodIdentity {
    /// Namespace (`default` when unset, as the apiserver defaults it).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, or `namespace/name` when the pod has none (pods fed to the
    /// typed API without an apiserver).
    pub uid: String,
}

impl PodIdentity {
    /// Identity of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| format!("{namespace}/{name}"));
        Self {
            namespace,
            name,
            uid,
        }
    }
}

/// What one container asks of the device manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// Container name.
    pub name: String,
    /// Init container (devices may be reused by later containers)?
    pub init: bool,
    /// A restartable ("sidecar") init container keeps its devices.
    pub restartable_init: bool,
    /// Resource → number of devices, for every extended resource with a
    /// positive whole quantity (limits, falling back to requests).
    pub requests: BTreeMap<String, u64>,
}

/// Containers of a pod in kubelet's admission order: init containers, then
/// app containers, each in spec order.
pub fn container_plans(pod: &Pod) -> Result<Vec<ContainerPlan>, SpecError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    let app = spec.containers.iter().map(|c| (c, false));
    init.chain(app)
        .map(|(c, is_init)| {
            Ok(ContainerPlan {
                name: c.name.clone(),
                init: is_init,
                restartable_init: is_init && c.restart_policy.as_deref() == Some("Always"),
                requests: device_requests(c)?,
            })
        })
        .collect()
}

/// Extended-resource requests of a container: limits, and requests for a
/// resource that has no limit. CPU, memory and other native resources are
/// skipped (names without a `/` or in `kubernetes.io/`).
fn device_requests(c: &Container) -> Result<BTreeMap<String, u64>, SpecError> {
    let empty = ResourceRequirements::default();
    let res = c.resources.as_ref().unwrap_or(&empty);
    let mut out = BTreeMap::new();
    let limits = res.limits.iter().flatten();
    let requests = res
        .requests
        .iter()
        .flatten()
        .filter(|(k, _)| !res.limits.as_ref().is_some_and(|l| l.contains_key(*k)));
    for (resource, quantity) in limits.chain(requests) {
        if !is_extended_resource_name(resource) {
            continue;
        }
        let count = parse_count(&quantity.0).ok_or_else(|| SpecError::Quantity {
            container: c.name.clone(),
            resource: resource.clone(),
            quantity: quantity.0.clone(),
        })?;
        if count > 0 {
            out.insert(resource.clone(), count);
        }
    }
    Ok(out)
}

/// A whole, non-negative device count from a quantity: `2`, `+2`, `2.0`,
/// `1k`, `1Ki`. Fractions are refused (extended resources are integers).
pub fn parse_count(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let multiplier: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !fraction.chars().all(|c| c == '0') {
        return None;
    }
    whole.parse::<u64>().ok()?.checked_mul(multiplier)
}

/// Kubernetes' `IsExtendedResourceName`, in the form kubelet needs here: a
/// domain-prefixed name outside `kubernetes.io/`, not a quota `requests.` name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, rest)) = name.split_once('/') else {
        return false;
    };
    let valid_prefix = !prefix.is_empty()
        && prefix.len() <= 253
        && prefix.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    let valid_name = !rest.is_empty()
        && rest.len() <= 63
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && rest.starts_with(|c: char| c.is_ascii_alphanumeric())
        && rest.ends_with(|c: char| c.is_ascii_alphanumeric());
    let native = prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io");
    valid_prefix && valid_name && !native && !name.starts_with("requests.")
}

/// Phase of a pod (`Pending` when unset).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether the pod is finished (kubelet frees its devices and never admits it).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// Sorts a batch the way kubelet's `HandlePodAdditions` does: by creation
/// time, oldest first. Ties (and pods without a timestamp, first) are broken by
/// namespace and name so the order is deterministic.
pub fn sort_batch(pods: &mut [Pod]) {
    pods.sort_by(|a, b| {
        let key = |p: &Pod| (p.metadata.creation_timestamp.clone(), PodIdentity::of(p));
        key(a).cmp(&key(b))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn counts_parse_whole_quantities_only() {
        assert_eq!(parse_count("2"), Some(2));
        assert_eq!(parse_count("+3"), Some(3));
        assert_eq!(parse_count("2.0"), Some(2));
        assert_eq!(parse_count("1k"), Some(1000));
        assert_eq!(parse_count("1Ki"), Some(1024));
        assert_eq!(parse_count("0.5"), None);
        assert_eq!(parse_count("500m"), None);
        assert_eq!(parse_count("-1"), None);
        assert_eq!(parse_count(""), None);
    }

    #[test]
    fn extended_resource_names_follow_kubernetes() {
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(is_extended_resource_name("example.com/foo_bar"));
        assert!(!is_extended_resource_name("cpu"));
        assert!(!is_extended_resource_name("kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("x.kubernetes.io/gpu"));
        assert!(!is_extended_resource_name("Nvidia.com/gpu"));
        assert!(!is_extended_resource_name("nvidia.com/"));
        assert!(!is_extended_resource_name("requests.nvidia.com/gpu"));
    }

    #[test]
    fn plans_list_init_containers_first_with_limits_over_requests() {
        let p = pod(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"limits": {"example.com/gpu": "2", "cpu": "1"}, "requests": {"example.com/gpu": "1"}}},
                    {"name": "plain"}
                ],
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"example.com/gpu": "1"}}},
                    {"name": "init", "resources": {"limits": {"example.com/gpu": "0"}}}
                ]
            }
        }));
        let plans = container_plans(&p).unwrap();
        let names: Vec<_> = plans
            .iter()
            .map(|c| (c.name.as_str(), c.init, c.restartable_init))
            .collect();
        assert_eq!(
            names,
            [
                ("side", true, true),
                ("init", true, false),
                ("app", false, false),
                ("plain", false, false)
            ]
        );
        assert_eq!(
            plans[0].requests,
            BTreeMap::from([("example.com/gpu".to_owned(), 1)])
        );
        assert!(plans[1].requests.is_empty(), "zero is no request");
        assert_eq!(
            plans[2].requests,
            BTreeMap::from([("example.com/gpu".to_owned(), 2)])
        );
    }

    #[test]
    fn fractional_device_request_is_a_spec_error() {
        let mut p =
            pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}));
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "example.com/gpu".to_owned(),
                Quantity("500m".into()),
            )])),
            ..Default::default()
        });
        assert!(matches!(
            container_plans(&p),
            Err(SpecError::Quantity { .. })
        ));
    }

    #[test]
    fn batches_sort_by_creation_time_then_name() {
        let mk = |name: &str, ts: &str| {
            pod(json!({"metadata": {"name": name, "namespace": "ns", "creationTimestamp": ts}}))
        };
        let mut batch = vec![
            mk("c", "2026-01-01T00:00:03Z"),
            mk("b", "2026-01-01T00:00:01Z"),
            mk("a", "2026-01-01T00:00:03Z"),
        ];
        sort_batch(&mut batch);
        let names: Vec<_> = batch
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["b", "a", "c"]);
    }

    #[test]
    fn identity_defaults_namespace_and_uid() {
        let id = PodIdentity::of(&pod(json!({"metadata": {"name": "p"}})));
        assert_eq!(
            id,
            PodIdentity {
                namespace: "default".into(),
                name: "p".into(),
                uid: "default/p".into()
            }
        );
    }
}

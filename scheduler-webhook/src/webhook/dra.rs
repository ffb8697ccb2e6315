//! DRA mode's half of the admission decision, pure: the claim shape a GPU
//! container asks for ([`Shape`]), the `ResourceClaimTemplate` of a shape,
//! and the container and pod edits that reference it (the contract in
//! `docs/dra.md`).
//!
//! It neither reads nor validates limits ([`super::mutate`] does, the same
//! way in both modes) and creates nothing ([`super::handler`] does).

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;

use k8s_openapi::api::core::v1::{
    Container, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim,
};
use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClaim, DeviceConstraint, DeviceRequest, ExactDeviceRequest,
    ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proto::hami::resources::ResourceNames;

/// The DRA driver node-daemon runs (`ResourceSlice.spec.driver`).
pub const DRIVER: &str = "gpu.gpuslice.dev";
/// The DeviceClass the chart installs, selecting the driver's devices.
pub const DEVICE_CLASS: &str = "gpu.gpuslice.dev";
/// The one request of every shape template.
pub const REQUEST: &str = "gpu";
/// Prefix of a container's claim name in the pod (`gpuslice-<container>`)
/// and of every shape template's name.
pub const PREFIX: &str = "gpuslice-";
/// Most devices one request may be given: the API's limit on the results
/// of one allocation (`AllocationResultsMaxSize`).
pub const MAX_GPUS: u32 = 32;
/// Label on the templates the webhook creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpuslice-webhook");
/// The longest name a pod's claim may have (a DNS label).
const NAME_MAX: usize = 63;

/// What one GPU container asks for, after defaults: `gpus` whole devices,
/// each with `memory_mib` of its memory (`None`: the whole memory, the
/// capacity's default) and `cores` percent of its compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    /// Devices (distinct GPUs).
    pub gpus: NonZeroU32,
    /// MiB on each; `None` for the whole memory.
    pub memory_mib: Option<NonZeroU32>,
    /// Percent of each GPU's cores, 0–100.
    pub cores: u32,
}

impl Shape {
    /// The template's name: `gpuslice-<n>gpu-<m>mi-<c>c`, or
    /// `gpuslice-<n>gpu-<c>c` for the whole memory.
    #[must_use]
    pub fn template_name(&self) -> String {
        self.to_string()
    }

    /// The `ResourceClaimTemplate` of this shape (no namespace: it is
    /// created in the pod's): one request `gpu` for exactly `gpus` devices
    /// of the class, each consuming `memory` and `cores`, and for more than
    /// one GPU a constraint that their UUIDs differ.
    #[must_use]
    pub fn template(&self) -> ResourceClaimTemplate {
        let mut requests = BTreeMap::new();
        if let Some(mib) = self.memory_mib {
            requests.insert("memory".to_owned(), Quantity(format!("{mib}Mi")));
        }
        requests.insert("cores".to_owned(), Quantity(self.cores.to_string()));
        let constraints = (self.gpus.get() > 1).then(|| {
            vec![DeviceConstraint {
                distinct_attribute: Some(format!("{DRIVER}/uuid")),
                ..DeviceConstraint::default()
            }]
        });
        ResourceClaimTemplate {
            metadata: ObjectMeta {
                name: Some(self.template_name()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(ResourceClaimTemplateSpec {
                metadata: None,
                spec: Some(ResourceClaimSpec {
                    devices: Some(DeviceClaim {
                        requests: Some(vec![DeviceRequest {
                            name: REQUEST.to_owned(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: DEVICE_CLASS.to_owned(),
                                allocation_mode: Some("ExactCount".to_owned()),
                                count: Some(i64::from(self.gpus.get())),
                                capacity: Some(CapacityRequirements {
                                    requests: Some(requests),
                                }),
                                ..ExactDeviceRequest::default()
                            }),
                            first_available: None,
                        }]),
                        constraints,
                        config: None,
                    }),
                }),
            }),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}gpu-", self.gpus)?;
        if let Some(mib) = self.memory_mib {
            write!(f, "{mib}mi-")?;
        }
        write!(f, "{}c", self.cores)
    }
}

/// The name of `container`'s claim in the pod: `gpuslice-<container>`.
///
/// # Errors
/// The name would be longer than a DNS label (63 characters).
pub fn claim_name(container: &str) -> Result<String, String> {
    let name = format!("{PREFIX}{container}");
    if name.len() > NAME_MAX {
        return Err(format!(
            "container name {container:?} is too long for DRA mode: its claim {name:?} would have {} characters, at most {NAME_MAX} are allowed",
            name.len()
        ));
    }
    Ok(name)
}

/// Takes the slice resources out of `container`'s limits and requests (the
/// claim carries them now) and makes it use the pod's claim `claim`.
pub fn claim_container(container: &mut Container, names: &ResourceNames, claim: &str) {
    let resources = container.resources.get_or_insert_with(Default::default);
    for map in [&mut resources.limits, &mut resources.requests] {
        if let Some(m) = map.as_mut() {
            for name in names.all() {
                m.remove(name);
            }
            if m.is_empty() {
                *map = None;
            }
        }
    }
    let claims = resources.claims.get_or_insert_with(Vec::new);
    if !claims.iter().any(|c| c.name == claim) {
        claims.push(ContainerClaim {
            name: claim.to_owned(),
            request: None,
        });
    }
}

/// Adds `(claim, shape)` to the pod's `resourceClaims`, each from its
/// shape's template.
///
/// # Errors
/// The pod already has a claim of that name.
pub fn claim_pod(spec: &mut PodSpec, claims: &[(String, Shape)]) -> Result<(), String> {
    let existing = spec.resource_claims.get_or_insert_with(Vec::new);
    for (claim, shape) in claims {
        if existing.iter().any(|c| &c.name == claim) {
            return Err(format!(
                "spec.resourceClaims already has a claim named {claim}: DRA mode names the GPU claim of each container gpuslice-<container>; rename that claim"
            ));
        }
        existing.push(PodResourceClaim {
            name: claim.clone(),
            resource_claim_name: None,
            resource_claim_template_name: Some(shape.template_name()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shape(gpus: u32, memory_mib: u32, cores: u32) -> Shape {
        Shape {
            gpus: NonZeroU32::new(gpus).unwrap(),
            memory_mib: NonZeroU32::new(memory_mib),
            cores,
        }
    }

    #[test]
    fn template_names_say_the_shape() {
        assert_eq!(
            shape(1, 3000, 30).template_name(),
            "gpuslice-1gpu-3000mi-30c"
        );
        assert_eq!(shape(2, 0, 100).template_name(), "gpuslice-2gpu-100c");
        assert_eq!(shape(1, 1024, 0).template_name(), "gpuslice-1gpu-1024mi-0c");
    }

    #[test]
    fn a_slice_template_is_the_contracts() {
        let t = serde_json::to_value(shape(1, 3000, 30).template()).unwrap();
        assert_eq!(
            t,
            json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpuslice-1gpu-3000mi-30c",
                    "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"}},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpu.gpuslice.dev",
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}}
                }}]}}}
            })
        );
    }

    #[test]
    fn several_whole_gpus_ask_no_memory_and_distinct_uuids() {
        let t = serde_json::to_value(shape(2, 0, 100).template()).unwrap();
        let devices = &t["spec"]["spec"]["devices"];
        assert_eq!(
            devices["requests"][0]["exactly"]["capacity"],
            json!({"requests": {"cores": "100"}})
        );
        assert_eq!(devices["requests"][0]["exactly"]["count"], 2);
        assert_eq!(
            devices["constraints"],
            json!([{"distinctAttribute": "gpu.gpuslice.dev/uuid"}])
        );
    }

    #[test]
    fn claim_names_must_fit_a_dns_label() {
        assert_eq!(claim_name("cuda").unwrap(), "gpuslice-cuda");
        let long = "c".repeat(55);
        let err = claim_name(&long).unwrap_err();
        assert!(err.contains("64 characters, at most 63"), "{err}");
    }

    #[test]
    fn a_claimed_container_keeps_other_resources_only() {
        let mut c: Container = serde_json::from_value(json!({"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "cpu": "1"},
            "requests": {"nvidia.com/gpucores": "30"}}}))
        .unwrap();
        claim_container(&mut c, &ResourceNames::default(), "gpuslice-c");
        assert_eq!(
            serde_json::to_value(&c.resources).unwrap(),
            json!({"limits": {"cpu": "1"}, "claims": [{"name": "gpuslice-c"}]})
        );
    }

    #[test]
    fn a_pod_claim_of_the_same_name_is_refused() {
        let mut spec: PodSpec = serde_json::from_value(json!({"containers": [],
            "resourceClaims": [{"name": "gpuslice-c", "resourceClaimName": "mine"}]}))
        .unwrap();
        let err = claim_pod(&mut spec, &[("gpuslice-c".into(), shape(1, 0, 100))]).unwrap_err();
        assert!(
            err.contains("already has a claim named gpuslice-c"),
            "{err}"
        );
    }
}

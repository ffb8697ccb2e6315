//! What a DRA claim asks of this node, as a pure function of the claim and
//! the node's GPUs: the slice each GPU must hold for it, the devices the
//! kubelet is answered with, and the devices of its HAMi-core contract.

use std::collections::BTreeMap;

use proto::dra::{CAPACITY_CORES, CAPACITY_MEMORY, DRIVER_NAME, MIB, Quantity};
use proto::hami::pod_devices::ContainerDevice;

use crate::cluster::ClaimView;
use crate::devices::Gpu;
use crate::ledger::ClaimSlice;

/// One device of the kubelet's answer for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's requests this device serves.
    pub request_names: Vec<String>,
    /// The pool (the node name).
    pub pool_name: String,
    /// The device (`gpu-<index>`).
    pub device_name: String,
    /// The allocation's share ID, if any.
    pub share_id: Option<String>,
}

/// Everything preparing a claim on this node takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    /// The claim's UID.
    pub uid: String,
    /// What each GPU (by UUID) holds for the claim.
    pub slices: BTreeMap<String, ClaimSlice>,
    /// The devices, in allocation order, for the kubelet.
    pub devices: Vec<PreparedDevice>,
    /// One entry per GPU in first-allocated order, for the contract.
    pub contract: Vec<ContainerDevice>,
}

/// Why a claim cannot be prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimPlanError {
    /// The claim has no allocation.
    #[error("claim {0} is not allocated")]
    NotAllocated(String),
    /// The claim has no device of this driver in this node's pool.
    #[error("claim {claim} has no {DRIVER_NAME} device in pool {pool}")]
    NoDevice {
        /// `namespace/name`.
        claim: String,
        /// This node's pool.
        pool: String,
    },
    /// A device name this node does not publish.
    #[error("claim {claim}: device {device} is not a GPU of this node")]
    UnknownDevice {
        /// `namespace/name`.
        claim: String,
        /// The device name.
        device: String,
    },
    /// A consumed capacity that does not parse or fit.
    #[error("claim {claim}: device {device}, consumed {capacity} {value:?}: {reason}")]
    Capacity {
        /// `namespace/name`.
        claim: String,
        /// The device name.
        device: String,
        /// `memory` or `cores`.
        capacity: &'static str,
        /// The quantity as written.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Whether `claim` holds a device of this driver in `pool`.
#[must_use]
pub fn allocated_to(claim: &ClaimView, pool: &str) -> bool {
    claim.allocated
        && claim
            .results
            .iter()
            .any(|r| r.driver == DRIVER_NAME && r.pool == pool)
}

/// One consumed capacity, or `default` when the result has none (the
/// request policy's default applied by the allocator).
fn consumed(
    claim: &ClaimView,
    device: &str,
    raw: Option<&String>,
    capacity: &'static str,
    unit: u128,
    default: u32,
) -> Result<u32, ClaimPlanError> {
    let Some(raw) = raw else {
        return Ok(default);
    };
    let error = |reason: String| ClaimPlanError::Capacity {
        claim: format!("{}/{}", claim.namespace, claim.name),
        device: device.to_owned(),
        capacity,
        value: raw.clone(),
        reason,
    };
    let quantity: Quantity = raw
        .parse()
        .map_err(|e: proto::dra::QuantityError| error(e.to_string()))?;
    u32::try_from(quantity.ceil_in(unit)).map_err(|_| error("too large".to_owned()))
}

/// The plan of `claim` on the node whose pool is `pool` and whose GPUs are
/// `gpus` (healthy or not: a claim allocated before a GPU turned unhealthy
/// is still served). Results of other drivers or pools are left out;
/// several results on one GPU add up.
///
/// # Errors
/// A [`ClaimPlanError`] naming the claim and what is wrong.
pub fn plan_claim(
    claim: &ClaimView,
    pool: &str,
    gpus: &[Gpu],
) -> Result<ClaimPlan, ClaimPlanError> {
    let full = || format!("{}/{}", claim.namespace, claim.name);
    if !claim.allocated {
        return Err(ClaimPlanError::NotAllocated(full()));
    }
    let mut slices: BTreeMap<String, ClaimSlice> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut devices = Vec::new();
    for result in claim
        .results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME && r.pool == pool)
    {
        let gpu = gpus
            .iter()
            .find(|g| proto::dra::device_name(g.index) == result.device)
            .ok_or_else(|| ClaimPlanError::UnknownDevice {
                claim: full(),
                device: result.device.clone(),
            })?;
        let memory_mib = consumed(
            claim,
            &result.device,
            result.consumed.get(CAPACITY_MEMORY),
            CAPACITY_MEMORY,
            MIB,
            gpu.memory_mib,
        )?;
        let cores = consumed(
            claim,
            &result.device,
            result.consumed.get(CAPACITY_CORES),
            CAPACITY_CORES,
            1,
            0,
        )?;
        let slice = slices.entry(gpu.uuid.clone()).or_default();
        slice.memory_mib = slice.memory_mib.saturating_add(memory_mib);
        slice.cores = slice.cores.saturating_add(cores);
        if !order.contains(&gpu.uuid) {
            order.push(gpu.uuid.clone());
        }
        devices.push(PreparedDevice {
            request_names: vec![result.request.clone()],
            pool_name: result.pool.clone(),
            device_name: result.device.clone(),
            share_id: result.share_id.clone(),
        });
    }
    if devices.is_empty() {
        return Err(ClaimPlanError::NoDevice {
            claim: full(),
            pool: pool.to_owned(),
        });
    }
    let contract = order
        .iter()
        .map(|uuid| {
            let s = slices[uuid];
            ContainerDevice::nvidia(
                uuid.clone(),
                i32::try_from(s.memory_mib).unwrap_or(i32::MAX),
                i32::try_from(s.cores).unwrap_or(i32::MAX),
            )
        })
        .collect();
    Ok(ClaimPlan {
        uid: claim.uid.clone(),
        slices,
        devices,
        contract,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::AllocatedDevice;

    fn gpu(index: u32) -> Gpu {
        Gpu {
            uuid: format!("GPU-{index}"),
            index,
            device_type: "NVIDIA-Tesla T4".into(),
            memory_mib: 15360,
            cores: 100,
            split_count: 10,
            numa: 0,
            healthy: index != 1,
            mig_profiles: Vec::new(),
        }
    }

    fn result(device: &str, pool: &str, consumed: &[(&str, &str)]) -> AllocatedDevice {
        AllocatedDevice {
            request: "gpu".into(),
            driver: DRIVER_NAME.into(),
            pool: pool.into(),
            device: device.into(),
            share_id: Some(format!("share-{device}")),
            consumed: consumed
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn claim(results: Vec<AllocatedDevice>) -> ClaimView {
        ClaimView {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "uid-1".into(),
            allocated: true,
            results,
        }
    }

    #[test]
    fn consumed_capacity_and_defaults_become_slices() {
        let gpus = [gpu(0), gpu(1), gpu(2)];
        let mut other = result("gpu-0", "n1", &[]);
        other.driver = "other.dev".into();
        let c = claim(vec![
            result("gpu-2", "n1", &[("memory", "3000Mi"), ("cores", "30")]),
            result("gpu-1", "n1", &[]),
            result("gpu-0", "n2", &[]),
            other,
        ]);
        assert!(allocated_to(&c, "n1") && !allocated_to(&c, "n3"));
        let plan = plan_claim(&c, "n1", &gpus).unwrap();
        assert_eq!(
            plan.slices,
            BTreeMap::from([
                (
                    "GPU-1".to_owned(),
                    ClaimSlice {
                        memory_mib: 15360,
                        cores: 0
                    }
                ),
                (
                    "GPU-2".to_owned(),
                    ClaimSlice {
                        memory_mib: 3000,
                        cores: 30
                    }
                ),
            ])
        );
        assert_eq!(
            plan.contract,
            [
                ContainerDevice::nvidia("GPU-2", 3000, 30),
                ContainerDevice::nvidia("GPU-1", 15360, 0)
            ]
        );
        let names: Vec<&str> = plan
            .devices
            .iter()
            .map(|d| d.device_name.as_str())
            .collect();
        assert_eq!(names, ["gpu-2", "gpu-1"]);
        assert_eq!(plan.devices[0].share_id.as_deref(), Some("share-gpu-2"));
    }

    #[test]
    fn bad_claims_are_named() {
        let gpus = [gpu(0)];
        let mut c = claim(vec![result("gpu-0", "n1", &[])]);
        c.allocated = false;
        assert_eq!(
            plan_claim(&c, "n1", &gpus),
            Err(ClaimPlanError::NotAllocated("ns/c".into()))
        );
        assert!(matches!(
            plan_claim(&claim(vec![result("gpu-0", "n2", &[])]), "n1", &gpus),
            Err(ClaimPlanError::NoDevice { .. })
        ));
        assert!(matches!(
            plan_claim(&claim(vec![result("gpu-9", "n1", &[])]), "n1", &gpus),
            Err(ClaimPlanError::UnknownDevice { .. })
        ));
        let err = plan_claim(
            &claim(vec![result("gpu-0", "n1", &[("memory", "lots")])]),
            "n1",
            &gpus,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "claim ns/c: device gpu-0, consumed memory \"lots\": \"lots\" is not a Kubernetes quantity"
        );
    }
}

//! The node's `ResourceSlice` as a pure function of its GPUs: one device
//! per healthy GPU (`gpu-<index>`), with its attributes and the consumable
//! capacities `memory` and `cores` (see `docs/dra.md`, "On the node").

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proto::dra::{CAPACITY_CORES, CAPACITY_MEMORY, DRIVER_NAME, device_name, slice_name};

use crate::devices::Gpu;

/// `mib` MiB as the apiserver writes the quantity back (its canonical
/// form: the largest binary suffix that keeps an integer, `40960` →
/// `40Gi`, `23028` → `23028Mi`), so what is written reads back equal.
#[must_use]
pub fn mib_quantity(mib: u32) -> Quantity {
    const SUFFIXES: [&str; 5] = ["Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = u64::from(mib);
    let mut suffix = 0;
    while value != 0 && value % 1024 == 0 && suffix + 1 < SUFFIXES.len() {
        value /= 1024;
        suffix += 1;
    }
    Quantity(format!("{value}{}", SUFFIXES[suffix]))
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int(value: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(value)),
        ..DeviceAttribute::default()
    }
}

/// The DRA device of one GPU.
#[must_use]
pub fn device(gpu: &Gpu) -> Device {
    let attributes = BTreeMap::from([
        ("model".to_owned(), string(&gpu.device_type)),
        ("uuid".to_owned(), string(&gpu.uuid)),
        ("index".to_owned(), int(gpu.index)),
        ("numaNode".to_owned(), int(gpu.numa)),
    ]);
    let memory = DeviceCapacity {
        value: mib_quantity(gpu.memory_mib),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(mib_quantity(gpu.memory_mib)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: mib_quantity(1),
                max: None,
                step: Some(mib_quantity(1)),
            }),
            valid_values: None,
        }),
    };
    let cores = DeviceCapacity {
        value: Quantity(gpu.cores.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".to_owned())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".to_owned()),
                max: Some(Quantity(gpu.cores.to_string())),
                step: Some(Quantity("1".to_owned())),
            }),
            valid_values: None,
        }),
    };
    Device {
        name: device_name(gpu.index),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([
            (CAPACITY_MEMORY.to_owned(), memory),
            (CAPACITY_CORES.to_owned(), cores),
        ])),
        ..Device::default()
    }
}

/// The spec of `node`'s slice at `generation`: its healthy GPUs in index
/// order.
#[must_use]
pub fn slice_spec(node: &str, gpus: &[Gpu], generation: i64) -> ResourceSliceSpec {
    let mut healthy: Vec<&Gpu> = gpus.iter().filter(|g| g.healthy).collect();
    healthy.sort_by_key(|g| g.index);
    ResourceSliceSpec {
        driver: DRIVER_NAME.to_owned(),
        node_name: Some(node.to_owned()),
        pool: ResourcePool {
            name: node.to_owned(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(healthy.into_iter().map(device).collect()),
        ..ResourceSliceSpec::default()
    }
}

/// What to write so that the API holds `node`'s slice for `gpus`, given
/// what it holds now (`current`, as read or last written): `None` when
/// `current` already says the same; else the slice with the next
/// generation, carrying `current`'s `resourceVersion` (a guarded replace)
/// or none (a create).
#[must_use]
pub fn slice_update(
    node: &str,
    gpus: &[Gpu],
    current: Option<&ResourceSlice>,
) -> Option<ResourceSlice> {
    let generation = current.map_or(0, |c| c.spec.pool.generation);
    if let Some(current) = current
        && current.spec == slice_spec(node, gpus, generation)
    {
        return None;
    }
    Some(ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            resource_version: current.and_then(|c| c.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        spec: slice_spec(node, gpus, generation + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, memory_mib: u32, healthy: bool) -> Gpu {
        Gpu {
            uuid: format!("GPU-{index}"),
            index,
            device_type: "NVIDIA-Tesla T4".into(),
            memory_mib,
            cores: 100,
            split_count: 10,
            numa: 1,
            healthy,
            mig_profiles: Vec::new(),
        }
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(mib_quantity(40960).0, "40Gi");
        assert_eq!(mib_quantity(23028).0, "23028Mi");
        assert_eq!(mib_quantity(1).0, "1Mi");
        assert_eq!(mib_quantity(1024 * 1024).0, "1Ti");
    }

    #[test]
    fn the_slice_follows_the_contract() {
        let spec = slice_spec("n1", &[gpu(1, 15360, true), gpu(0, 40960, true)], 3);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "driver": "gpu.gpuslice.dev",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "gpu-0",
                        "allowMultipleAllocations": true,
                        "attributes": {
                            "index": {"int": 0},
                            "model": {"string": "NVIDIA-Tesla T4"},
                            "numaNode": {"int": 1},
                            "uuid": {"string": "GPU-0"}
                        },
                        "capacity": {
                            "cores": {"value": "100", "requestPolicy": {"default": "0",
                                "validRange": {"min": "0", "max": "100", "step": "1"}}},
                            "memory": {"value": "40Gi", "requestPolicy": {"default": "40Gi",
                                "validRange": {"min": "1Mi", "step": "1Mi"}}}
                        }
                    },
                    {
                        "name": "gpu-1",
                        "allowMultipleAllocations": true,
                        "attributes": {
                            "index": {"int": 1},
                            "model": {"string": "NVIDIA-Tesla T4"},
                            "numaNode": {"int": 1},
                            "uuid": {"string": "GPU-1"}
                        },
                        "capacity": {
                            "cores": {"value": "100", "requestPolicy": {"default": "0",
                                "validRange": {"min": "0", "max": "100", "step": "1"}}},
                            "memory": {"value": "15Gi", "requestPolicy": {"default": "15Gi",
                                "validRange": {"min": "1Mi", "step": "1Mi"}}}
                        }
                    }
                ]
            })
        );
    }

    #[test]
    fn an_update_happens_only_on_change_and_bumps_the_generation() {
        let gpus = vec![gpu(0, 1024, true), gpu(1, 1024, true)];
        let first = slice_update("n1", &gpus, None).unwrap();
        assert_eq!(first.metadata.name.as_deref(), Some("n1-gpu.gpuslice.dev"));
        assert_eq!(first.metadata.resource_version, None);
        assert_eq!(first.spec.pool.generation, 1);
        let mut stored = first;
        stored.metadata.resource_version = Some("7".into());
        assert_eq!(slice_update("n1", &gpus, Some(&stored)), None);
        // GPU 1 turns unhealthy: withdrawn, generation 2, guarded by rv 7.
        let sick = vec![gpu(0, 1024, true), gpu(1, 1024, false)];
        let second = slice_update("n1", &sick, Some(&stored)).unwrap();
        assert_eq!(second.spec.pool.generation, 2);
        assert_eq!(second.metadata.resource_version.as_deref(), Some("7"));
        let names: Vec<&str> = second
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["gpu-0"]);
    }
}

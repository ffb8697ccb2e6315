//! MIG instances in a container's contract: what changes when the devices
//! of a container are MIG instances rather than HAMi-core slices.
//!
//! HAMi's device plugin, in MIG mode, hands the container the MIG device
//! (`NVIDIA_VISIBLE_DEVICES=<MIG UUID>`) and sets no HAMi-core limits: the
//! instance itself bounds memory and compute (`CUDA_DEVICE_MEMORY_LIMIT_*`
//! and `CUDA_DEVICE_SM_LIMIT` are set outside MIG mode only).
//!
//! Which instance: the one the scheduler chose, from the pod's
//! `hami.io/vgpu-mig-allocations`, when it names one for the device on
//! that GPU with a profile and placement the GPU offers; otherwise (a
//! scheduler that writes no placement, or one that does not hold) the
//! daemon's own choice by the same rule the scheduler uses
//! ([`proto::hami::mig::choose`]) around the instances the node's other
//! live pods and this pod's other containers hold, as their annotations
//! record them ([`place_container`]). After Allocate the daemon writes the
//! instances back with their runtime identity (`migUUID`,
//! `gpuInstanceID`, `computeInstanceID`), as HAMi's device plugin does.
//!
//! Creating the instance is the device source's job. Only the simulated
//! source models MIG today; its instance identity is
//! [`simulated_mig_uuid`], stable per (pod, container, device) so a retried
//! Allocate gets the same answer, with the placement's start as its GPU
//! instance id. The NVML path (GPU and compute instance creation through
//! nvml-wrapper) is not implemented: settings refuse `operatingMode: mig`
//! with the NVML source (see `docs/mig.md`).

use std::collections::BTreeMap;

use proto::hami::container_contract::ContainerSlice;
use proto::hami::keys;
use proto::hami::mig::{MigAllocation, MigProfile, MigRuntime, choose, decode_allocations};
use proto::hami::pod_devices::ContainerDevice;

use crate::cluster::PodView;

/// The profiles of each GPU in MIG mode, by UUID.
pub type MigGpus = BTreeMap<String, Vec<MigProfile>>;

/// A device with no instance to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "container {container} device {device}: no MIG profile holding {memory_mib} MiB has a free placement on GPU {uuid}"
)]
pub struct NoPlacement {
    /// Container index.
    pub container: usize,
    /// Device index within the container.
    pub device: usize,
    /// The GPU.
    pub uuid: String,
    /// The memory asked.
    pub memory_mib: u64,
}

/// One instance for one device, and whether the scheduler chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The instance (with the runtime identity of an earlier Allocate, if
    /// the annotation carried one).
    pub allocation: MigAllocation,
    /// From the pod's `vgpu-mig-allocations` (else the daemon chose).
    pub from_scheduler: bool,
}

/// A pod's `hami.io/vgpu-mig-allocations`; a value that does not decode
/// counts as none (the daemon then chooses) and is returned as the error
/// text for the caller to log.
#[must_use]
pub fn recorded(pod: &PodView) -> (Vec<MigAllocation>, Option<String>) {
    match pod
        .annotation(keys::VGPU_MIG_ALLOCATIONS)
        .map(decode_allocations)
    {
        None => (Vec::new(), None),
        Some(Ok(all)) => (all, None),
        Some(Err(e)) => (Vec::new(), Some(e.to_string())),
    }
}

/// The memory slices taken per MIG GPU by the instances the live pods
/// other than `uid` record.
#[must_use]
pub fn taken_by_others(pods: &[PodView], uid: &str) -> BTreeMap<String, u32> {
    let mut taken: BTreeMap<String, u32> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.uid != uid && !p.is_terminal()) {
        for a in recorded(pod).0 {
            if let Some(mask) = a.placement.mask() {
                *taken.entry(a.gpu_uuid).or_default() |= mask;
            }
        }
    }
    taken
}

/// The instance of each device of container `container` on a GPU in
/// `mig_gpus`, in device order: the scheduler's from `given` (this pod's
/// recorded instances) when it names one on that GPU with an offered
/// profile and placement, else the daemon's choice around `taken` (other
/// pods' slices), the pod's recorded instances for its other containers,
/// and the devices placed before in this container.
///
/// # Errors
/// [`NoPlacement`] for the first device no instance fits.
pub fn place_container(
    container: usize,
    devices: &[ContainerDevice],
    mig_gpus: &MigGpus,
    given: &[MigAllocation],
    taken: &BTreeMap<String, u32>,
) -> Result<Vec<Placed>, NoPlacement> {
    let mut out: Vec<Placed> = Vec::new();
    let mine = |a: &MigAllocation, j: usize| {
        usize::try_from(a.container_index).ok() == Some(container)
            && usize::try_from(a.device_index).ok() == Some(j)
    };
    for (j, d) in devices.iter().enumerate() {
        let Some(profiles) = mig_gpus.get(&d.uuid) else {
            continue;
        };
        let scheduler = given.iter().find(|a| {
            mine(a, j)
                && a.gpu_uuid == d.uuid
                && profiles
                    .iter()
                    .any(|p| p.name == a.profile && p.placements.contains(&a.placement))
        });
        if let Some(a) = scheduler {
            out.push(Placed {
                allocation: a.clone(),
                from_scheduler: true,
            });
            continue;
        }
        let mut occupied = taken.get(&d.uuid).copied().unwrap_or(0);
        for a in given
            .iter()
            .filter(|a| usize::try_from(a.container_index).ok() != Some(container))
            .chain(out.iter().map(|p| &p.allocation))
            .filter(|a| a.gpu_uuid == d.uuid)
        {
            occupied |= a.placement.mask().unwrap_or(0);
        }
        let memory_mib = u64::try_from(d.usedmem).unwrap_or(0);
        let Some(c) = choose(profiles, occupied, memory_mib) else {
            return Err(NoPlacement {
                container,
                device: j,
                uuid: d.uuid.clone(),
                memory_mib,
            });
        };
        out.push(Placed {
            allocation: MigAllocation {
                container_index: u32::try_from(container).unwrap_or(u32::MAX),
                device_index: u32::try_from(j).unwrap_or(u32::MAX),
                gpu_uuid: d.uuid.clone(),
                profile: profiles[c.profile].name.clone(),
                placement: c.placement,
                runtime: None,
            },
            from_scheduler: false,
        });
    }
    Ok(out)
}

/// The simulated source's runtime identity of an instance of pod
/// `pod_uid`: [`simulated_mig_uuid`], GPU instance id = the placement's
/// start, compute instance 0. An identity already recorded is kept.
pub fn simulate_runtime(a: &mut MigAllocation, pod_uid: &str) {
    if a.runtime.is_some() {
        return;
    }
    a.runtime = Some(MigRuntime {
        mig_uuid: simulated_mig_uuid(
            &a.gpu_uuid,
            pod_uid,
            a.container_index as usize,
            a.device_index as usize,
        ),
        gpu_instance_id: a.placement.start,
        compute_instance_id: 0,
    });
}

/// `record` with `placed` in place of any entry for the same (container,
/// device), in (container, device) order.
pub fn merge(record: &mut Vec<MigAllocation>, placed: impl IntoIterator<Item = MigAllocation>) {
    for a in placed {
        record
            .retain(|r| (r.container_index, r.device_index) != (a.container_index, a.device_index));
        record.push(a);
    }
    record.sort_by_key(|r| (r.container_index, r.device_index));
}

/// The identity the simulated source gives the instance of device
/// `device` of container `container` of pod `pod_uid` on GPU `gpu_uuid`.
#[must_use]
pub fn simulated_mig_uuid(
    gpu_uuid: &str,
    pod_uid: &str,
    container: usize,
    device: usize,
) -> String {
    let gpu = gpu_uuid.strip_prefix("GPU-").unwrap_or(gpu_uuid);
    let pod: String = pod_uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("MIG-{gpu}-{pod}-{container}-{device}")
}

/// Rewrites `slice` for a container whose devices include MIG instances:
/// `NVIDIA_VISIBLE_DEVICES` lists the instance for each device on a GPU in
/// `mig_gpus` (the GPU itself otherwise), and the HAMi-core limits are
/// dropped when every device is an instance. No change without MIG devices.
pub fn apply(
    slice: &mut ContainerSlice,
    devices: &[ContainerDevice],
    mig_gpus: &MigGpus,
    instance: impl Fn(usize, &str) -> String,
) {
    let is_mig = |d: &ContainerDevice| mig_gpus.contains_key(&d.uuid);
    if !devices.iter().any(is_mig) {
        return;
    }
    let mut visible: Vec<String> = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        let id = if is_mig(d) {
            instance(i, &d.uuid)
        } else {
            d.uuid.clone()
        };
        if !visible.contains(&id) {
            visible.push(id);
        }
    }
    slice
        .envs
        .insert("NVIDIA_VISIBLE_DEVICES".to_owned(), visible.join(","));
    if devices.iter().all(is_mig) {
        slice.envs.retain(|k, _| {
            !k.starts_with("CUDA_DEVICE_MEMORY_LIMIT") && k != "CUDA_DEVICE_SM_LIMIT"
        });
    }
}

#[cfg(test)]
mod tests {
    use proto::hami::container_contract::{ContractContext, container_env_and_mounts};

    use super::*;

    fn a100(uuid: &str) -> MigGpus {
        [(
            uuid.to_owned(),
            proto::hami::mig::known_profiles("NVIDIA A100-SXM4-40GB").unwrap(),
        )]
        .into()
    }

    fn dev(uuid: &str, mem: i32) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            vendor: "NVIDIA".into(),
            usedmem: mem,
            usedcores: 28,
        }
    }

    #[test]
    fn a_mig_container_sees_its_instance_and_no_hami_core_limits() {
        let devices = vec![dev("GPU-a", 10240)];
        let ctx = ContractContext::new("uid-1", "main", "cache");
        let mut slice = container_env_and_mounts(&devices, &ctx).unwrap();
        apply(&mut slice, &devices, &a100("GPU-a"), |i, g| {
            simulated_mig_uuid(g, "uid-1", 0, i)
        });
        assert_eq!(slice.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-a-uid1-0-0");
        assert!(!slice.envs.contains_key("CUDA_DEVICE_MEMORY_LIMIT_0"));
        assert!(!slice.envs.contains_key("CUDA_DEVICE_SM_LIMIT"));
    }

    #[test]
    fn a_hami_core_container_is_untouched() {
        let devices = vec![dev("GPU-b", 1000)];
        let ctx = ContractContext::new("uid-1", "main", "cache");
        let mut slice = container_env_and_mounts(&devices, &ctx).unwrap();
        let before = slice.clone();
        apply(&mut slice, &devices, &a100("GPU-a"), |_, g| g.to_owned());
        assert_eq!(slice, before);
    }

    fn at(placed: &[Placed]) -> Vec<(&str, u32, bool)> {
        placed
            .iter()
            .map(|p| {
                (
                    p.allocation.profile.as_str(),
                    p.allocation.placement.start,
                    p.from_scheduler,
                )
            })
            .collect()
    }

    fn given(c: u32, d: u32, gpu: &str, profile: &str, start: u32, size: u32) -> MigAllocation {
        MigAllocation {
            container_index: c,
            device_index: d,
            gpu_uuid: gpu.into(),
            profile: profile.into(),
            placement: proto::hami::mig::MigPlacement { start, size },
            runtime: None,
        }
    }

    #[test]
    fn the_schedulers_instance_is_used_when_it_names_a_valid_one() {
        let gpus = a100("GPU-a");
        let devices = [dev("GPU-a", 10240)];
        let record = [given(1, 0, "GPU-a", "2g.10gb", 4, 2)];
        let placed = place_container(1, &devices, &gpus, &record, &BTreeMap::new()).unwrap();
        assert_eq!(at(&placed), [("2g.10gb", 4, true)]);
        // Its own choice would have been the lowest 2g placement.
        let placed = place_container(1, &devices, &gpus, &[], &BTreeMap::new()).unwrap();
        assert_eq!(at(&placed), [("2g.10gb", 0, false)]);
    }

    #[test]
    fn without_a_valid_scheduler_instance_the_daemon_chooses_around_the_others() {
        let gpus = a100("GPU-a");
        let devices = [dev("GPU-a", 10240), dev("GPU-a", 10240)];
        // Slices 0-1 taken by another pod, 2-3 by this pod's container 0;
        // the scheduler's entry for container 1 names a placement 2g.10gb
        // does not have: not believed.
        let taken: BTreeMap<String, u32> = [("GPU-a".to_owned(), 0b0000_0011)].into();
        let record = [
            given(0, 0, "GPU-a", "2g.10gb", 2, 2),
            given(1, 0, "GPU-a", "2g.10gb", 3, 2),
        ];
        let placed = place_container(1, &devices, &gpus, &record, &taken);
        // Device 0 takes 4-5; device 1 finds no 2g room left.
        assert_eq!(
            placed,
            Err(NoPlacement {
                container: 1,
                device: 1,
                uuid: "GPU-a".into(),
                memory_mib: 10240
            })
        );
        let placed = place_container(1, &devices[..1], &gpus, &record, &taken).unwrap();
        assert_eq!(at(&placed), [("2g.10gb", 4, false)]);
        // A device on a GPU not in MIG mode gets no instance.
        let placed =
            place_container(0, &[dev("GPU-b", 1000)], &gpus, &[], &BTreeMap::new()).unwrap();
        assert!(placed.is_empty());
    }

    #[test]
    fn the_runtime_identity_is_stable_and_merged_by_entry() {
        let mut a = given(0, 0, "GPU-a", "1g.5gb", 6, 1);
        simulate_runtime(&mut a, "uid-1");
        let first = a.runtime.clone().unwrap();
        assert_eq!(
            (first.mig_uuid.as_str(), first.gpu_instance_id),
            ("MIG-a-uid1-0-0", 6)
        );
        simulate_runtime(&mut a, "uid-2");
        assert_eq!(a.runtime.as_ref(), Some(&first));
        let mut record = vec![
            given(1, 0, "GPU-a", "2g.10gb", 0, 2),
            given(0, 0, "GPU-a", "1g.5gb", 6, 1),
        ];
        merge(&mut record, [a.clone()]);
        assert_eq!(record.len(), 2);
        assert_eq!(record[0], a);
    }
}

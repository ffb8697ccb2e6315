//! MIG instances in a container's contract: what changes when the devices
//! of a container are MIG instances rather than HAMi-core slices.
//!
//! HAMi's device plugin, in MIG mode, hands the container the MIG device
//! (`NVIDIA_VISIBLE_DEVICES=<MIG UUID>`) and sets no HAMi-core limits: the
//! instance itself bounds memory and compute (`CUDA_DEVICE_MEMORY_LIMIT_*`
//! and `CUDA_DEVICE_SM_LIMIT` are set outside MIG mode only).
//!
//! Creating the instance is the device source's job. Only the simulated
//! source models MIG today; its instance identity is
//! [`simulated_mig_uuid`], stable per (pod, container, device) so a retried
//! Allocate gets the same answer. The NVML path (GPU and compute instance
//! creation through nvml-wrapper) is not implemented: settings refuse
//! `operatingMode: mig` with the NVML source (see `docs/mig.md`).

use proto::hami::container_contract::ContainerSlice;
use proto::hami::pod_devices::ContainerDevice;

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
    mig_gpus: &[String],
    instance: impl Fn(usize, &str) -> String,
) {
    let is_mig = |d: &ContainerDevice| mig_gpus.contains(&d.uuid);
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
        apply(&mut slice, &devices, &["GPU-a".to_owned()], |i, g| {
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
        apply(&mut slice, &devices, &["GPU-a".to_owned()], |_, g| {
            g.to_owned()
        });
        assert_eq!(slice, before);
    }
}

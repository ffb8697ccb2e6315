//! The HAMi-core container contract: the environment and mounts a container
//! needs so that `libvgpu.so` (HAMi-core) enforces its GPU slice.
//!
//! Owns one pure function, [`container_env_and_mounts`], which turns the
//! devices allocated to one container plus a [`ContractContext`] into a
//! [`ContainerSlice`] — the same env and mounts HAMi's device plugin returns
//! from Allocate outside MIG mode (`NVIDIA_VISIBLE_DEVICES` env strategy):
//!
//! | env | value |
//! |---|---|
//! | `NVIDIA_VISIBLE_DEVICES` | distinct UUIDs, comma-separated, first-seen order |
//! | `CUDA_DEVICE_MEMORY_LIMIT_<i>` | `<mem>m` for the device at position *i* |
//! | `CUDA_DEVICE_SM_LIMIT` | cores % of device 0 |
//! | `CUDA_DEVICE_MEMORY_SHARED_CACHE` | `<hook>/vgpu/<cache id>.cache` |
//! | `CUDA_OVERSUBSCRIBE` | `true`, only if memory scaling > 1 |
//! | `LIBCUDA_LOG_LEVEL` | the level, only if set |
//! | `GPU_CORE_UTILIZATION_POLICY` | `disable`, only with `disable_core_limit` |
//!
//! | container path | host path | access |
//! |---|---|---|
//! | `<hook>/vgpu/libvgpu.so` | `<hook>/vgpu/libvgpu.so[.<version>]` | ro |
//! | `<hook>/vgpu` | `<hook>/vgpu/containers/<podUID>_<container>` | rw |
//! | `/tmp/vgpulock` | `/tmp/vgpulock` | rw |
//! | `/etc/ld.so.preload` | `<hook>/vgpu/ld.so.preload` | ro, omitted with `CUDA_DISABLE_CONTROL=true` |
//!
//! `<hook>` is the `HOOK_PATH`, `/usr/local` by default; HAMi uses it for both
//! the host and the container side. Creating the per-container directory
//! (mode 0777) and `/tmp/vgpulock` on the host is the caller's I/O, as is
//! finding whether a versioned `libvgpu.so.<version>` exists. HAMi's optional
//! license mounts and MIG mode are not covered.

use std::collections::BTreeMap;

use super::pod_devices::ContainerDevice;
use super::register::parse_go_bool;
use super::snippet;

/// HAMi's default `HOOK_PATH`.
pub const DEFAULT_HOOK_PATH: &str = "/usr/local";
/// Env: the GPUs the NVIDIA container runtime exposes.
pub const ENV_NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Env prefix: memory limit of device *i* (`CUDA_DEVICE_MEMORY_LIMIT_0`, …).
pub const ENV_MEMORY_LIMIT_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";
/// Env: compute limit in percent (0 or unset means 100).
pub const ENV_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// Env: the shared-memory cache file HAMi-core and the monitor use.
pub const ENV_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// Env: memory oversubscription on (ignored by open-source HAMi-core).
pub const ENV_OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// Env: HAMi-core log level, 0–4.
pub const ENV_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Env: `force` or `disable` the compute limit.
pub const ENV_CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// Container env that, when true, skips the `ld.so.preload` mount.
pub const ENV_CUDA_DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// The lock directory shared by every HAMi-core process on the node.
pub const VGPU_LOCK_DIR: &str = "/tmp/vgpulock";
/// Where the preload file goes in the container.
pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";

/// Everything besides the devices that the contract depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractContext {
    /// `HOOK_PATH`: absolute, where HAMi-core lives on the host (and is
    /// mounted in the container); default `/usr/local`. A trailing `/` is
    /// ignored.
    pub hook_path: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The container's name.
    pub container_name: String,
    /// The node's `deviceMemoryScaling`; above 1 sets `CUDA_OVERSUBSCRIBE`.
    pub device_memory_scaling: f64,
    /// `LIBCUDA_LOG_LEVEL` (0–4); `None` leaves it unset (HAMi-core then
    /// uses 1).
    pub lib_cuda_log_level: Option<u8>,
    /// Set `GPU_CORE_UTILIZATION_POLICY=disable`.
    pub disable_core_limit: bool,
    /// The container's env has `CUDA_DISABLE_CONTROL=true` (see
    /// [`cuda_disable_control_requested`]): no `ld.so.preload` mount.
    pub cuda_disable_control: bool,
    /// Names the shared cache file `<hook>/vgpu/<cache_id>.cache`. HAMi uses
    /// a fresh random UUID v4 per Allocate; a pure function cannot make one,
    /// so the caller supplies it (a UUID v4 keeps HAMi's shape; anything
    /// unique per container allocation works). Non-empty, no `/`.
    pub cache_id: String,
    /// Version suffix when the host has `libvgpu.so.<version>` (HAMi mounts
    /// that file if it exists); `None` mounts `libvgpu.so`.
    pub libvgpu_version: Option<String>,
}

impl ContractContext {
    /// A context with HAMi's defaults: hook path `/usr/local`, memory scaling
    /// 1, log level unset, core limit on, control on, unversioned library.
    #[must_use]
    pub fn new(
        pod_uid: impl Into<String>,
        container_name: impl Into<String>,
        cache_id: impl Into<String>,
    ) -> Self {
        Self {
            hook_path: DEFAULT_HOOK_PATH.to_owned(),
            pod_uid: pod_uid.into(),
            container_name: container_name.into(),
            device_memory_scaling: 1.0,
            lib_cuda_log_level: None,
            disable_core_limit: false,
            cuda_disable_control: false,
            cache_id: cache_id.into(),
            libvgpu_version: None,
        }
    }
}

/// One bind mount for the container runtime (a domain type; the gRPC layer
/// converts it to the kubelet `Mount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The env and mounts of one container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerSlice {
    /// Environment variables, by name.
    pub envs: BTreeMap<String, String>,
    /// Mounts, in HAMi's order.
    pub mounts: Vec<MountSpec>,
}

/// Why the contract could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    /// The container has no devices.
    #[error("no devices to allocate for the container")]
    NoDevices,
    /// A device has an unusable field.
    #[error("device {device}, field {field}: {reason}")]
    Device {
        /// Position of the device in the container.
        device: usize,
        /// `uuid`, `mem` or `cores`.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A context field is unusable.
    #[error("{field}: {reason}")]
    Context {
        /// The context field's name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Builds the env and mounts for one container from its allocated devices.
///
/// ```
/// use proto::hami::container_contract::{container_env_and_mounts, ContractContext};
/// use proto::hami::pod_devices::ContainerDevice;
/// let ctx = ContractContext::new("uid-1", "app", "cache-1");
/// let slice = container_env_and_mounts(&[ContainerDevice::nvidia("GPU-a", 3000, 30)], &ctx).unwrap();
/// assert_eq!(slice.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "3000m");
/// assert_eq!(slice.mounts[1].host_path, "/usr/local/vgpu/containers/uid-1_app");
/// ```
///
/// # Errors
/// [`ContractError::NoDevices`] for an empty list; [`ContractError::Device`]
/// for an empty UUID or one with `,`, or negative mem/cores;
/// [`ContractError::Context`] for a relative hook path, an empty pod UID,
/// container name or cache id or one with `/`, a scaling that is not a
/// positive finite number, or a log level above 4.
pub fn container_env_and_mounts(
    devices: &[ContainerDevice],
    ctx: &ContractContext,
) -> Result<ContainerSlice, ContractError> {
    let first = devices.first().ok_or(ContractError::NoDevices)?;
    let hook = check_context(ctx)?;

    let mut envs = BTreeMap::new();
    let mut visible: Vec<&str> = Vec::with_capacity(devices.len());
    for (device, dev) in devices.iter().enumerate() {
        let error = |field, reason: String| ContractError::Device {
            device,
            field,
            reason,
        };
        if dev.uuid.is_empty() || dev.uuid.contains(',') {
            return Err(error(
                "uuid",
                format!(
                    "{:?} must be non-empty and contain no ','",
                    snippet(&dev.uuid)
                ),
            ));
        }
        if dev.usedmem < 0 {
            return Err(error(
                "mem",
                format!("negative value {} is not allowed", dev.usedmem),
            ));
        }
        if dev.usedcores < 0 {
            return Err(error(
                "cores",
                format!("negative value {} is not allowed", dev.usedcores),
            ));
        }
        if !visible.contains(&dev.uuid.as_str()) {
            visible.push(&dev.uuid);
        }
        envs.insert(
            format!("{ENV_MEMORY_LIMIT_PREFIX}{device}"),
            format!("{}m", dev.usedmem),
        );
    }
    envs.insert(ENV_NVIDIA_VISIBLE_DEVICES.to_owned(), visible.join(","));
    envs.insert(ENV_SM_LIMIT.to_owned(), first.usedcores.to_string());
    envs.insert(
        ENV_SHARED_CACHE.to_owned(),
        format!("{hook}/vgpu/{}.cache", ctx.cache_id),
    );
    if ctx.device_memory_scaling > 1.0 {
        envs.insert(ENV_OVERSUBSCRIBE.to_owned(), "true".to_owned());
    }
    if let Some(level) = ctx.lib_cuda_log_level {
        envs.insert(ENV_LOG_LEVEL.to_owned(), level.to_string());
    }
    if ctx.disable_core_limit {
        envs.insert(ENV_CORE_POLICY.to_owned(), "disable".to_owned());
    }

    let library = match &ctx.libvgpu_version {
        Some(version) => format!("{hook}/vgpu/libvgpu.so.{version}"),
        None => format!("{hook}/vgpu/libvgpu.so"),
    };
    let mut mounts = vec![
        MountSpec {
            container_path: format!("{hook}/vgpu/libvgpu.so"),
            host_path: library,
            read_only: true,
        },
        MountSpec {
            container_path: format!("{hook}/vgpu"),
            host_path: format!(
                "{hook}/vgpu/containers/{}_{}",
                ctx.pod_uid, ctx.container_name
            ),
            read_only: false,
        },
        MountSpec {
            container_path: VGPU_LOCK_DIR.to_owned(),
            host_path: VGPU_LOCK_DIR.to_owned(),
            read_only: false,
        },
    ];
    if !ctx.cuda_disable_control {
        mounts.push(MountSpec {
            container_path: LD_SO_PRELOAD.to_owned(),
            host_path: format!("{hook}/vgpu/ld.so.preload"),
            read_only: true,
        });
    }
    Ok(ContainerSlice { envs, mounts })
}

/// Whether a container's env asks to skip HAMi-core control, as HAMi reads
/// it: any `CUDA_DISABLE_CONTROL` entry whose value Go's `ParseBool` reads as
/// true (`1`, `t`, `T`, `TRUE`, `true`, `True`); false or unparsable entries
/// are ignored.
pub fn cuda_disable_control_requested<'a>(
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> bool {
    env.into_iter()
        .any(|(name, value)| name == ENV_CUDA_DISABLE_CONTROL && parse_go_bool(value) == Some(true))
}

/// Validates the context; returns the hook path without a trailing `/`.
fn check_context(ctx: &ContractContext) -> Result<&str, ContractError> {
    let error = |field, reason: String| ContractError::Context { field, reason };
    if !ctx.hook_path.starts_with('/') || ctx.hook_path.contains('\0') {
        return Err(error(
            "hook_path",
            format!("{:?} must be an absolute path", snippet(&ctx.hook_path)),
        ));
    }
    for (field, value) in [
        ("pod_uid", &ctx.pod_uid),
        ("container_name", &ctx.container_name),
        ("cache_id", &ctx.cache_id),
    ] {
        if value.is_empty() || value.contains('/') || value.contains('\0') {
            return Err(error(
                field,
                format!("{:?} must be non-empty and contain no '/'", snippet(value)),
            ));
        }
    }
    if let Some(version) = &ctx.libvgpu_version
        && (version.is_empty() || version.contains('/') || version.contains('\0'))
    {
        return Err(error(
            "libvgpu_version",
            format!(
                "{:?} must be non-empty and contain no '/'",
                snippet(version)
            ),
        ));
    }
    if !(ctx.device_memory_scaling.is_finite() && ctx.device_memory_scaling > 0.0) {
        return Err(error(
            "device_memory_scaling",
            format!("{} must be a positive number", ctx.device_memory_scaling),
        ));
    }
    if let Some(level) = ctx.lib_cuda_log_level
        && level > 4
    {
        return Err(error(
            "lib_cuda_log_level",
            format!("{level} is out of range 0..=4"),
        ));
    }
    Ok(ctx.hook_path.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ContractContext {
        ContractContext::new("8f1c-uid", "app2", "11111111-2222-4333-8444-555555555555")
    }

    #[test]
    fn two_devices_give_hamis_env_and_mounts() {
        let devices = [
            ContainerDevice::nvidia("GPU-bbb", 1000, 25),
            ContainerDevice::nvidia("GPU-ccc", 2000, 0),
        ];
        let mut c = ctx();
        c.lib_cuda_log_level = Some(1);
        let slice = container_env_and_mounts(&devices, &c).unwrap();
        let expected: BTreeMap<String, String> = [
            ("NVIDIA_VISIBLE_DEVICES", "GPU-bbb,GPU-ccc"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1000m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2000m"),
            ("CUDA_DEVICE_SM_LIMIT", "25"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                "/usr/local/vgpu/11111111-2222-4333-8444-555555555555.cache",
            ),
            ("LIBCUDA_LOG_LEVEL", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(slice.envs, expected);
        let mounts: Vec<(&str, &str, bool)> = slice
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    "/usr/local/vgpu/libvgpu.so",
                    "/usr/local/vgpu/libvgpu.so",
                    true
                ),
                (
                    "/usr/local/vgpu",
                    "/usr/local/vgpu/containers/8f1c-uid_app2",
                    false
                ),
                ("/tmp/vgpulock", "/tmp/vgpulock", false),
                ("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", true),
            ]
        );
    }

    #[test]
    fn options_switch_their_env_and_mounts() {
        let mut c = ctx();
        c.hook_path = "/opt/hami/".to_owned();
        c.device_memory_scaling = 1.5;
        c.disable_core_limit = true;
        c.cuda_disable_control = true;
        c.libvgpu_version = Some("v2.6.0".to_owned());
        // The same GPU twice (two slices) is listed once.
        let devices = [
            ContainerDevice::nvidia("GPU-a", 10, 5),
            ContainerDevice::nvidia("GPU-a", 20, 5),
        ];
        let slice = container_env_and_mounts(&devices, &c).unwrap();
        assert_eq!(slice.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
        assert_eq!(slice.envs["CUDA_OVERSUBSCRIBE"], "true");
        assert_eq!(slice.envs["GPU_CORE_UTILIZATION_POLICY"], "disable");
        assert!(!slice.envs.contains_key("LIBCUDA_LOG_LEVEL"));
        assert_eq!(slice.mounts.len(), 3);
        assert_eq!(
            slice.mounts[0].host_path,
            "/opt/hami/vgpu/libvgpu.so.v2.6.0"
        );
        assert_eq!(slice.mounts[0].container_path, "/opt/hami/vgpu/libvgpu.so");
        assert!(
            slice
                .mounts
                .iter()
                .all(|m| m.container_path != LD_SO_PRELOAD)
        );
        // Scaling of exactly 1 does not oversubscribe.
        let slice = container_env_and_mounts(&devices, &ctx()).unwrap();
        assert!(!slice.envs.contains_key("CUDA_OVERSUBSCRIBE"));
    }

    #[test]
    fn bad_input_is_an_error_naming_the_field() {
        type Spoil = fn(&mut ContractContext);
        assert_eq!(
            container_env_and_mounts(&[], &ctx()),
            Err(ContractError::NoDevices)
        );
        let devices = [
            ContainerDevice::nvidia("GPU-a", 1, 1),
            ContainerDevice::nvidia("", 1, 1),
        ];
        let err = container_env_and_mounts(&devices, &ctx()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 1, field uuid: \"\" must be non-empty and contain no ','"
        );
        let devices = [ContainerDevice::nvidia("GPU-a", -1, 1)];
        assert!(container_env_and_mounts(&devices, &ctx()).is_err());
        let ok = [ContainerDevice::nvidia("GPU-a", 1, 1)];
        let cases: [(&str, Spoil); 6] = [
            ("hook_path", |c| c.hook_path = "usr/local".to_owned()),
            ("pod_uid", |c| c.pod_uid = String::new()),
            ("container_name", |c| c.container_name = "../x".to_owned()),
            ("cache_id", |c| c.cache_id = "a/b".to_owned()),
            ("device_memory_scaling", |c| {
                c.device_memory_scaling = f64::NAN;
            }),
            ("lib_cuda_log_level", |c| c.lib_cuda_log_level = Some(5)),
        ];
        for (field, spoil) in cases {
            let mut c = ctx();
            spoil(&mut c);
            match container_env_and_mounts(&ok, &c) {
                Err(ContractError::Context { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn disable_control_follows_go_parse_bool() {
        assert!(cuda_disable_control_requested([(
            "CUDA_DISABLE_CONTROL",
            "true"
        )]));
        assert!(cuda_disable_control_requested([
            ("CUDA_DISABLE_CONTROL", "nope"),
            ("CUDA_DISABLE_CONTROL", "1"),
        ]));
        assert!(!cuda_disable_control_requested([(
            "CUDA_DISABLE_CONTROL",
            "false"
        )]));
        assert!(!cuda_disable_control_requested([(
            "CUDA_DISABLE_CONTROL",
            "yes"
        )]));
        assert!(!cuda_disable_control_requested([("OTHER", "true")]));
    }
}

//! The CDI (Container Device Interface) spec file of one prepared DRA
//! claim, as a pure builder and its JSON form.
//!
//! A claim's file `<cdi-dir>/gpuslice.dev-<claimUID>.json` holds one CDI
//! device named `<claimUID>` of kind [`crate::dra::CDI_KIND`], whose
//! `containerEdits` are the HAMi-core environment and mounts the
//! device-plugin path returns from Allocate
//! ([`crate::hami::container_contract`]). The container runtime (or the
//! fake kubelet) applies them to every container that references the
//! claim through the CDI ID `gpuslice.dev/gpu=<claimUID>`.

use serde::{Deserialize, Serialize};

use crate::hami::container_contract::ContainerSlice;

/// The CDI spec version written (the oldest that has everything used here
/// and that current runtimes read).
pub const CDI_VERSION: &str = "0.6.0";

/// One CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `0.6.0`.
    pub cdi_version: String,
    /// `vendor/class`, here `gpuslice.dev/gpu`.
    pub kind: String,
    /// The devices of the file.
    pub devices: Vec<Device>,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name (the claim UID).
    pub name: String,
    /// What a container that uses the device gets.
    pub container_edits: ContainerEdits,
}

/// Edits to a container.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// One mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Path on the host.
    pub host_path: String,
    /// Path in the container.
    pub container_path: String,
    /// Mount options: `ro` or `rw`, then `nosuid`, `nodev`, `bind`.
    pub options: Vec<String>,
}

impl Mount {
    /// Whether the options make it read-only.
    #[must_use]
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// The spec of claim `claim_uid` whose containers get `slice` (env sorted
/// by name, mounts in the contract's order).
///
/// ```
/// use proto::cdi::claim_spec;
/// use proto::hami::container_contract::{container_env_and_mounts, ContractContext};
/// use proto::hami::pod_devices::ContainerDevice;
/// let ctx = ContractContext::new("claim-1", "gpu", "claim-1");
/// let slice = container_env_and_mounts(&[ContainerDevice::nvidia("GPU-a", 3000, 30)], &ctx).unwrap();
/// let spec = claim_spec("claim-1", &slice);
/// assert_eq!(spec.kind, "gpuslice.dev/gpu");
/// assert!(spec.devices[0].container_edits.env.contains(&"CUDA_DEVICE_MEMORY_LIMIT_0=3000m".to_owned()));
/// ```
#[must_use]
pub fn claim_spec(claim_uid: &str, slice: &ContainerSlice) -> Spec {
    let env = slice.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mounts = slice
        .mounts
        .iter()
        .map(|m| Mount {
            host_path: m.host_path.clone(),
            container_path: m.container_path.clone(),
            options: [
                if m.read_only { "ro" } else { "rw" },
                "nosuid",
                "nodev",
                "bind",
            ]
            .map(str::to_owned)
            .to_vec(),
        })
        .collect();
    Spec {
        cdi_version: CDI_VERSION.to_owned(),
        kind: crate::dra::CDI_KIND.to_owned(),
        devices: vec![Device {
            name: claim_uid.to_owned(),
            container_edits: ContainerEdits { env, mounts },
        }],
    }
}

/// The file's bytes: pretty JSON with a trailing newline.
///
/// # Errors
/// Never in practice (the spec is plain strings); the serializer's error.
pub fn to_json(spec: &Spec) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(spec)?;
    text.push('\n');
    Ok(text)
}

//! What the fake kubelet tells people and tests about an admission: the
//! plugin's `Allocate` reply per container, the pod's outcome, and the JSON
//! record written to `<record-dir>/<namespace>_<pod>.json` and to the pod
//! annotation [`ALLOCATIONS_ANNOTATION`].
//!
//! Owns the serde shapes and the file write; it does not decide anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proto::deviceplugin::v1beta1 as api;
use serde::{Deserialize, Serialize};

/// Pod annotation holding the JSON list of [`ContainerAllocation`]s.
pub const ALLOCATIONS_ANNOTATION: &str = "gpuslice.io/fake-kubelet-allocations";

/// Pod status reason kubelet sets when admission fails in a device plugin
/// (`pkg/kubelet/cm/admission`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// A bind mount from the `Allocate` reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountRecord {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node from the `Allocate` reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpecRecord {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// cgroup permissions (`rwm`).
    pub permissions: String,
}

/// One `ContainerAllocateResponse`, as owned data.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocateReply {
    /// Environment variables for the container.
    pub envs: BTreeMap<String, String>,
    /// Mounts for the container.
    pub mounts: Vec<MountRecord>,
    /// Device nodes for the container.
    pub devices: Vec<DeviceSpecRecord>,
    /// Annotations passed to the runtime.
    pub annotations: BTreeMap<String, String>,
    /// CDI device names.
    pub cdi_devices: Vec<String>,
}

impl From<api::ContainerAllocateResponse> for AllocateReply {
    fn from(r: api::ContainerAllocateResponse) -> Self {
        Self {
            envs: r.envs.into_iter().collect(),
            mounts: r
                .mounts
                .into_iter()
                .map(|m| MountRecord {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            devices: r
                .devices
                .into_iter()
                .map(|d| DeviceSpecRecord {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
            annotations: r.annotations.into_iter().collect(),
            cdi_devices: r.cdi_devices.into_iter().map(|c| c.name).collect(),
        }
    }
}

impl From<&AllocateReply> for api::ContainerAllocateResponse {
    fn from(r: &AllocateReply) -> Self {
        Self {
            envs: r.envs.clone().into_iter().collect(),
            mounts: r
                .mounts
                .iter()
                .map(|m| api::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: r
                .devices
                .iter()
                .map(|d| api::DeviceSpec {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            annotations: r.annotations.clone().into_iter().collect(),
            cdi_devices: r
                .cdi_devices
                .iter()
                .map(|name| api::CdiDevice { name: name.clone() })
                .collect(),
        }
    }
}

/// The devices one container got for one resource, and the plugin's reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAllocation {
    /// Container name.
    pub container: String,
    /// Whether it is an init container.
    pub init: bool,
    /// Extended resource name.
    pub resource: String,
    /// Device IDs sent in `Allocate` (or held from before a restart).
    pub device_ids: Vec<String>,
    /// The plugin's reply.
    pub reply: AllocateReply,
}

/// How admission of a pod ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase")]
pub enum Outcome {
    /// Admitted: the pod goes `Running`.
    Running,
    /// Rejected: the pod goes `Failed`.
    Failed {
        /// `status.reason` (`UnexpectedAdmissionError`).
        reason: String,
        /// `status.message`, kubelet's text.
        message: String,
    },
}

/// The admission record of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAdmission {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID (or `namespace/name` for a pod without one).
    pub uid: String,
    /// Outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Allocations, in admission order (empty on failure).
    pub containers: Vec<ContainerAllocation>,
}

impl PodAdmission {
    /// Whether the pod was admitted.
    pub fn is_running(&self) -> bool {
        self.outcome == Outcome::Running
    }

    /// The record file of this pod inside `dir`.
    pub fn file_in(&self, dir: &Path) -> PathBuf {
        record_file(dir, &self.namespace, &self.name)
    }

    /// Writes the record as pretty JSON (atomically: temp file, then rename).
    pub fn write_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = self.file_in(dir);
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}

/// `<dir>/<namespace>_<name>.json`.
pub fn record_file(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(format!("{namespace}_{name}.json"))
}

/// Reads a pod's record written by [`PodAdmission::write_to`].
pub fn read_record(dir: &Path, namespace: &str, name: &str) -> std::io::Result<PodAdmission> {
    let bytes = std::fs::read(record_file(dir, namespace, name))?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_reply_round_trips_through_protobuf() {
        let reply = AllocateReply {
            envs: BTreeMap::from([("A".into(), "1".into())]),
            mounts: vec![MountRecord {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            devices: vec![DeviceSpecRecord {
                container_path: "/dev/x".into(),
                host_path: "/dev/y".into(),
                permissions: "rw".into(),
            }],
            annotations: BTreeMap::from([("k".into(), "v".into())]),
            cdi_devices: vec!["vendor/class=dev".into()],
        };
        let wire = api::ContainerAllocateResponse::from(&reply);
        assert_eq!(AllocateReply::from(wire), reply);
    }

    #[test]
    fn record_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let rec = PodAdmission {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            outcome: Outcome::Failed {
                reason: UNEXPECTED_ADMISSION_ERROR.into(),
                message: "m".into(),
            },
            containers: vec![],
        };
        let path = rec.write_to(dir.path()).unwrap();
        assert_eq!(path, dir.path().join("ns_p.json"));
        assert_eq!(read_record(dir.path(), "ns", "p").unwrap(), rec);
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(json["phase"], "Failed");
        assert_eq!(json["reason"], UNEXPECTED_ADMISSION_ERROR);
    }
}

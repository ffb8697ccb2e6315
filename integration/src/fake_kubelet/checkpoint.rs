//! The device-manager checkpoint, `kubelet_internal_checkpoint`, in kubelet's
//! JSON layout (`checkpoint.Data` v2): which pod container holds which device
//! IDs with the plugin's `Allocate` reply, and which resources had devices.
//!
//! Owns the file format and its read/write; the table decides what goes in.
//! Differences from kubelet: `Checksum` is written as 0 and not verified
//! (kubelet hashes a Go-specific dump of the struct), and all device IDs are
//! filed under NUMA node `-1`.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;
use proto::deviceplugin::v1beta1 as api;
use serde::{Deserialize, Serialize};

use super::devices::{DeviceTable, HeldDevices, PodDevices};
use super::record::AllocateReply;

/// The checkpoint file name inside the device-plugins folder.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// NUMA node kubelet files devices without topology under.
const NO_TOPOLOGY: &str = "-1";

/// The file contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Checkpoint {
    /// Allocations and registered devices.
    pub data: Data,
    /// Kubelet's checksum (written as 0 here).
    #[serde(default)]
    pub checksum: u64,
}

/// `checkpoint.Data`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Data {
    /// One entry per pod, container and resource.
    #[serde(default)]
    pub pod_device_entries: Vec<PodDevicesEntry>,
    /// Resource → device IDs known (kubelet writes the healthy ones).
    #[serde(default)]
    pub registered_devices: BTreeMap<String, Vec<String>>,
}

/// `checkpoint.PodDevicesEntry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Container name.
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    /// Resource name.
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// NUMA node → device IDs.
    #[serde(rename = "DeviceIDs")]
    pub device_ids: BTreeMap<String, Vec<String>>,
    /// Base64 of the protobuf `ContainerAllocateResponse`.
    #[serde(rename = "AllocResp")]
    pub alloc_resp: String,
}

// === impl Checkpoint ===

impl Checkpoint {
    /// The checkpoint of `table`.
    pub fn of(table: &DeviceTable) -> Self {
        let mut entries = Vec::new();
        for (uid, containers) in table.pods() {
            for (container, resources) in containers {
                for (resource, held) in resources {
                    let wire = api::ContainerAllocateResponse::from(&held.reply).encode_to_vec();
                    entries.push(PodDevicesEntry {
                        pod_uid: uid.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: BTreeMap::from([(
                            NO_TOPOLOGY.to_owned(),
                            held.ids.iter().cloned().collect(),
                        )]),
                        alloc_resp: base64_encode(&wire),
                    });
                }
            }
        }
        let registered_devices = table
            .registered()
            .map(|r| {
                (
                    r.clone(),
                    table
                        .devices(r)
                        .into_iter()
                        .filter(|(_, h)| *h)
                        .map(|(id, _)| id)
                        .collect(),
                )
            })
            .collect();
        Self {
            data: Data {
                pod_device_entries: entries,
                registered_devices,
            },
            checksum: 0,
        }
    }

    /// The table kubelet rebuilds from this checkpoint at start-up.
    /// Entries whose reply does not decode keep an empty reply.
    pub fn restore(&self) -> DeviceTable {
        let mut pods = PodDevices::new();
        for e in &self.data.pod_device_entries {
            let reply = base64_decode(&e.alloc_resp)
                .and_then(|bytes| api::ContainerAllocateResponse::decode(bytes.as_slice()).ok())
                .map(AllocateReply::from)
                .unwrap_or_default();
            let ids = e.device_ids.values().flatten().cloned().collect();
            pods.entry(e.pod_uid.clone())
                .or_default()
                .entry(e.container_name.clone())
                .or_default()
                .insert(e.resource_name.clone(), HeldDevices { ids, reply });
        }
        DeviceTable::restored(pods, self.data.registered_devices.keys().cloned())
    }

    /// Writes the file atomically (temp file, then rename).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json)?;
        std::fs::rename(tmp, path)
    }

    /// Reads the file; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (Go's `encoding/json` form of `[]byte`).
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Inverse of [`base64_encode`]; `None` on malformed input.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)?;
        acc = (acc << 6) | u32::try_from(v).ok()?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_kubelet::devices::{Choice, DeviceRequest};
    use std::collections::BTreeSet;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), coded);
            assert_eq!(base64_decode(coded).unwrap(), plain.as_bytes());
        }
        assert_eq!(base64_decode("Zm9v!"), None);
    }

    #[test]
    fn checkpoint_round_trips_allocations_and_forgets_devices() {
        let mut t = DeviceTable::default();
        t.replace_devices("example.com/gpu", [("a".into(), true), ("b".into(), true)]);
        let req = DeviceRequest {
            pod_uid: "u1".into(),
            container: "c".into(),
            resource: "example.com/gpu".into(),
            required: 1,
            reusable: BTreeSet::new(),
            already_running: false,
        };
        assert_eq!(t.choose(&req, &[]), Ok(Choice::Allocate(vec!["a".into()])));
        let reply = AllocateReply {
            envs: BTreeMap::from([("X".into(), "1".into())]),
            ..Default::default()
        };
        t.commit("u1", "c", "example.com/gpu", reply.clone());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        Checkpoint::of(&t).write(&path).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            json["Data"]["PodDeviceEntries"][0]["DeviceIDs"]["-1"][0],
            "a"
        );
        assert_eq!(
            json["Data"]["RegisteredDevices"]["example.com/gpu"],
            serde_json::json!(["a", "b"])
        );

        let restored = Checkpoint::read(&path).unwrap().unwrap().restore();
        assert_eq!(
            restored.held("u1", "c", "example.com/gpu").unwrap().reply,
            reply
        );
        assert_eq!(restored.counts()["example.com/gpu"].capacity, 0);
        assert!(
            Checkpoint::read(&dir.path().join("none"))
                .unwrap()
                .is_none()
        );
    }
}

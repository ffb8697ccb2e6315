//! CDI resolution as a container runtime does it, generically: the CDI
//! device IDs a container gets (`vendor/class=name`) are looked up in the
//! JSON spec files of the CDI folder, and the container gets the env,
//! mounts and device nodes of the spec-level `containerEdits` of each spec
//! it uses and of each device's own `containerEdits`.
//!
//! Owns the reading of spec files; it knows nothing of gpuslice's driver
//! (any CDI spec of any vendor resolves the same way). YAML spec files are
//! not read (the runtimes read both; the driver here writes JSON).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::record::{AllocateReply, DeviceSpecRecord, MountRecord};

/// Why CDI devices could not be resolved (the container would not start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    /// The folder could not be read.
    #[error("reading CDI folder {dir}: {reason}")]
    Folder {
        /// The folder.
        dir: String,
        /// Why.
        reason: String,
    },
    /// A device ID is not `vendor/class=name`.
    #[error("invalid CDI device name {0:?}")]
    BadId(String),
    /// No spec file has the device (containerd's wording).
    #[error("unresolvable CDI devices {}", .0.join(", "))]
    Unresolvable(Vec<String>),
}

/// Resolves `ids` against the spec files in `dir`; the reply carries the
/// merged edits, with `ids` as its CDI devices.
///
/// # Errors
/// The folder cannot be read, an ID is malformed, or a device is in no spec.
pub fn resolve(dir: &Path, ids: &[String]) -> Result<AllocateReply, CdiError> {
    let specs = read_specs(dir)?;
    let mut reply = AllocateReply {
        cdi_devices: ids.to_vec(),
        ..AllocateReply::default()
    };
    let mut missing = Vec::new();
    let mut used_specs: Vec<usize> = Vec::new();
    let mut device_edits: Vec<&Value> = Vec::new();
    for id in ids {
        let (kind, name) = id
            .split_once('=')
            .filter(|(k, n)| k.contains('/') && !n.is_empty())
            .ok_or_else(|| CdiError::BadId(id.clone()))?;
        let found = specs.iter().enumerate().find_map(|(i, spec)| {
            (spec.get("kind").and_then(Value::as_str) == Some(kind))
                .then(|| {
                    spec.get("devices")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .find(|d| d.get("name").and_then(Value::as_str) == Some(name))
                        .map(|d| (i, d))
                })
                .flatten()
        });
        match found {
            Some((i, device)) => {
                if !used_specs.contains(&i) {
                    used_specs.push(i);
                }
                if let Some(edits) = device.get("containerEdits") {
                    device_edits.push(edits);
                }
            }
            None => missing.push(id.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(CdiError::Unresolvable(missing));
    }
    let spec_edits = used_specs
        .iter()
        .filter_map(|i| specs[*i].get("containerEdits"));
    for edits in spec_edits.chain(device_edits) {
        apply(edits, &mut reply);
    }
    Ok(reply)
}

/// Every `*.json` spec in `dir`, in file-name order (a missing folder has none).
fn read_specs(dir: &Path) -> Result<Vec<Value>, CdiError> {
    let folder = |e: std::io::Error| CdiError::Folder {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(folder(e)),
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    // A file being written or not JSON is skipped, as the runtimes' cache
    // skips a spec it cannot parse.
    Ok(paths
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .collect())
}

/// Applies one `containerEdits` object.
fn apply(edits: &Value, reply: &mut AllocateReply) {
    let list = |key: &str| {
        edits
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for entry in list("env") {
        if let Some((k, v)) = entry.as_str().and_then(|e| e.split_once('=')) {
            reply.envs.insert(k.to_owned(), v.to_owned());
        }
    }
    let text = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    for m in list("mounts") {
        let options: Vec<&str> = m
            .get("options")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        reply.mounts.push(MountRecord {
            container_path: text(&m, "containerPath"),
            host_path: text(&m, "hostPath"),
            read_only: options.contains(&"ro"),
        });
    }
    for d in list("deviceNodes") {
        let path = text(&d, "path");
        let host = d
            .get("hostPath")
            .and_then(Value::as_str)
            .map_or_else(|| path.clone(), str::to_owned);
        reply.devices.push(DeviceSpecRecord {
            container_path: path,
            host_path: host,
            permissions: text(&d, "permissions"),
        });
    }
    let annotations: BTreeMap<String, String> = edits
        .get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    reply.annotations.extend(annotations);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn write(dir: &Path, file: &str, spec: &Value) {
        std::fs::write(dir.join(file), serde_json::to_vec(spec).unwrap()).unwrap();
    }

    #[test]
    fn spec_and_device_edits_are_merged_for_the_ids_asked() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "vendor-a.json",
            &json!({"cdiVersion": "0.6.0", "kind": "example.com/gpu",
            "containerEdits": {"env": ["SHARED=1"]},
            "devices": [
                {"name": "u1", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a", "LIMIT=3000m"],
                    "mounts": [{"hostPath": "/h/lib.so", "containerPath": "/c/lib.so", "options": ["ro", "bind"]}]}},
                {"name": "u2", "containerEdits": {"env": ["OTHER=1"]}}
            ]}),
        );
        write(dir.path(), "notes.txt", &json!("ignored"));
        let reply = resolve(dir.path(), &["example.com/gpu=u1".to_owned()]).unwrap();
        assert_eq!(
            reply.envs,
            BTreeMap::from([
                ("LIMIT".to_owned(), "3000m".to_owned()),
                ("NVIDIA_VISIBLE_DEVICES".to_owned(), "GPU-a".to_owned()),
                ("SHARED".to_owned(), "1".to_owned()),
            ])
        );
        assert_eq!(
            reply.mounts,
            [MountRecord {
                container_path: "/c/lib.so".into(),
                host_path: "/h/lib.so".into(),
                read_only: true
            }]
        );
        assert_eq!(reply.cdi_devices, ["example.com/gpu=u1"]);
    }

    #[test]
    fn unknown_or_malformed_ids_fail_as_the_runtime_does() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            resolve(dir.path(), &["example.com/gpu=gone".to_owned()]),
            Err(CdiError::Unresolvable(vec![
                "example.com/gpu=gone".to_owned()
            ]))
        );
        assert_eq!(
            resolve(dir.path(), &["no-kind".to_owned()]),
            Err(CdiError::BadId("no-kind".to_owned()))
        );
        assert_eq!(
            resolve(&dir.path().join("absent"), &[]).map(|r| r.envs.len()),
            Ok(0)
        );
    }
}

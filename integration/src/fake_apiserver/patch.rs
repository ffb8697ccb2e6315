//! The three patch formats the fake apiserver accepts, applied to an object
//! held as JSON:
//! - `application/merge-patch+json`: RFC 7386 (`null` deletes a key, maps
//!   merge, anything else replaces).
//! - `application/strategic-merge-patch+json`: maps merge and `null`
//!   deletes like RFC 7386; lists whose field name has a patch merge key in
//!   the Kubernetes API (`containers`/`env`/`volumes`/`containerStatuses` by
//!   `name`, `conditions`/`addresses` by `type`, `volumeMounts` by
//!   `mountPath`, `ports` by `containerPort`, `ownerReferences` by `uid`,
//!   `taints` by `key`) are merged element by element, `{"$patch":"delete"}`
//!   in an element removes it and a `{"$patch":"replace"}` element replaces
//!   the list; `finalizers` merge as a set. Every other list is replaced.
//!   The merge key is chosen by the field name alone, not the full schema
//!   path; that is exact for pods, nodes, events, quotas, namespaces and
//!   leases. `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList`
//!   are ignored.
//! - `application/json-patch+json`: RFC 6902 including `test`; a failing
//!   operation applies nothing and is answered 422 as the real server does.
//!
//! Pure functions; no store access.

use serde_json::{Map, Value};

use super::status::ApiError;

/// A patch body's format, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchFormat {
    /// RFC 7386.
    Merge,
    /// Kubernetes strategic merge patch.
    Strategic,
    /// RFC 6902.
    Json,
}

/// Media types accepted for PATCH, as listed in the real server's 415 text.
pub const ACCEPTED_PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json";

impl PatchFormat {
    /// Reads the `Content-Type` (parameters such as `charset` are ignored).
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/json-patch+json" => Ok(Self::Json),
            _ => Err(ApiError::UnsupportedMediaType(
                ACCEPTED_PATCH_TYPES.to_string(),
            )),
        }
    }
}

/// Applies `body` in `format` to a copy of `current` and returns the result;
/// `current` is never changed, so a failed patch applies nothing.
pub fn apply(current: &Value, format: PatchFormat, body: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("error decoding patch: {e}")))?;
    let mut target = current.clone();
    match format {
        PatchFormat::Merge => {
            if !patch.is_object() {
                return Err(ApiError::BadRequest("Invalid JSON Patch".to_string()));
            }
            json_patch::merge(&mut target, &patch);
        }
        PatchFormat::Strategic => {
            let Value::Object(patch) = patch else {
                return Err(ApiError::BadRequest(
                    "unable to decode strategic merge patch: not a JSON object".to_string(),
                ));
            };
            merge_map(&mut target, &patch);
        }
        PatchFormat::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| ApiError::BadRequest(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut target, &ops).map_err(|e| ApiError::Invalid {
                // The real server drops the underlying text from the message
                // (errors.NewGenericServerResponse with 422); it is kept as a
                // cause here so that tests and people can see what failed.
                message: "the server rejected our request due to an error in our request"
                    .to_string(),
                kind: String::new(),
                name: String::new(),
                causes: vec![("patch".to_string(), e.to_string())],
            })?;
        }
    }
    Ok(target)
}

/// Patch merge key of a list field, by field name.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "conditions" | "addresses" => Some("type"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" => Some("containerPort"),
        "ownerReferences" => Some("uid"),
        "taints" => Some("key"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

/// Lists of scalars merged as a set.
fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

fn directive(value: &Value) -> Option<&str> {
    value.get("$patch").and_then(Value::as_str)
}

fn without_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn merge_map(target: &mut Value, patch: &Map<String, Value>) {
    if directive(&Value::Object(patch.clone())) == Some("replace") {
        *target = Value::Object(without_directives(patch));
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return;
    };
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                map.remove(key);
            }
            Value::Object(inner) => {
                if directive(value) == Some("delete") {
                    map.remove(key);
                    continue;
                }
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                merge_map(slot, inner);
            }
            Value::Array(items) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                merge_list(slot, items, key);
            }
            other => {
                map.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_list(target: &mut Value, items: &[Value], field: &str) {
    if items.iter().any(|i| directive(i) == Some("replace")) {
        let kept: Vec<Value> = items
            .iter()
            .filter(|i| directive(i) != Some("replace"))
            .cloned()
            .collect();
        *target = Value::Array(kept);
        return;
    }
    if is_set_list(field) {
        let mut merged = target.as_array().cloned().unwrap_or_default();
        for item in items {
            if !merged.contains(item) {
                merged.push(item.clone());
            }
        }
        *target = Value::Array(merged);
        return;
    }
    let Some(key) = merge_key(field) else {
        *target = Value::Array(items.to_vec());
        return;
    };
    let mut merged = target.as_array().cloned().unwrap_or_default();
    for item in items {
        let Value::Object(patch_item) = item else {
            // A scalar in a keyed list: nothing to merge by, replace.
            *target = Value::Array(items.to_vec());
            return;
        };
        let id = patch_item.get(key);
        let position = merged
            .iter()
            .position(|existing| id.is_some() && existing.get(key) == id);
        match (directive(item), position) {
            (Some("delete"), Some(at)) => {
                merged.remove(at);
            }
            (Some("delete"), None) => {}
            (_, Some(at)) => merge_map(&mut merged[at], patch_item),
            (_, None) => merged.push(Value::Object(without_directives(patch_item))),
        }
    }
    *target = Value::Array(merged);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn annotated() -> Value {
        json!({"metadata": {"name": "p", "annotations": {"a": "1", "b": "2"}}})
    }

    fn run(format: PatchFormat, current: &Value, patch: Value) -> Result<Value, ApiError> {
        apply(current, format, patch.to_string().as_bytes())
    }

    #[test]
    fn merge_patch_null_deletes_and_keys_merge() {
        let out = run(
            PatchFormat::Merge,
            &annotated(),
            json!({"metadata": {"annotations": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["annotations"], json!({"b": "2", "c": "3"}));
    }

    #[test]
    fn merge_patch_replaces_lists() {
        let current = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let out = run(
            PatchFormat::Merge,
            &current,
            json!({"spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "c"}]));
    }

    #[test]
    fn strategic_patch_merges_maps_and_keyed_lists() {
        let current = json!({
            "metadata": {"annotations": {"a": "1"}, "finalizers": ["x"]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": "True"}
            ]},
            "spec": {"tolerations": [{"key": "t1"}]}
        });
        let out = run(
            PatchFormat::Strategic,
            &current,
            json!({
                "metadata": {"annotations": {"a": null, "b": "2"}, "finalizers": ["y"]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                "spec": {"tolerations": [{"key": "t2"}]}
            }),
        )
        .unwrap();
        assert_eq!(out["metadata"]["annotations"], json!({"b": "2"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "t2"}]));
    }

    #[test]
    fn strategic_patch_directives_delete_and_replace() {
        let current = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let deleted = run(
            PatchFormat::Strategic,
            &current,
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(deleted["spec"]["containers"], json!([{"name": "b"}]));
        let replaced = run(
            PatchFormat::Strategic,
            &current,
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(replaced["spec"]["containers"], json!([{"name": "c"}]));
    }

    #[test]
    fn json_patch_applies_all_or_nothing() {
        let out = run(
            PatchFormat::Json,
            &annotated(),
            json!([
                {"op": "test", "path": "/metadata/annotations/a", "value": "1"},
                {"op": "remove", "path": "/metadata/annotations/a"},
                {"op": "add", "path": "/metadata/annotations/x~1y", "value": "z"}
            ]),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["annotations"],
            json!({"b": "2", "x/y": "z"})
        );

        let failed = run(
            PatchFormat::Json,
            &annotated(),
            json!([
                {"op": "remove", "path": "/metadata/annotations/a"},
                {"op": "test", "path": "/metadata/annotations/b", "value": "wrong"}
            ]),
        )
        .unwrap_err();
        assert_eq!(failed.code(), 422);
        assert_eq!(failed.reason(), "Invalid");
    }

    #[test]
    fn malformed_patches_are_bad_requests() {
        let err = apply(&annotated(), PatchFormat::Merge, b"{not json").unwrap_err();
        assert_eq!(err.code(), 400);
        let err = run(PatchFormat::Json, &annotated(), json!({"op": "add"})).unwrap_err();
        assert_eq!(err.code(), 400);
        let err = PatchFormat::from_content_type("application/apply-patch+yaml").unwrap_err();
        assert_eq!(err.code(), 415);
        assert_eq!(
            PatchFormat::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchFormat::Merge
        );
    }
}

//! The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`)
//! as kube-scheduler speaks it, written independently of the product's
//! codec: PascalCase keys out (the Go structs have no json tags), keys in
//! matched case-insensitively as Go's `encoding/json` does, nil pointers as
//! `null`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::{Map, Value};

/// A reply the fake cannot decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not a JSON object.
    #[error("extender reply is not a JSON object: {0}")]
    NotObject(String),
    /// A field has the wrong JSON type.
    #[error("extender reply field {field}: {reason}")]
    Field {
        /// Field name.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// `v1.NodeList` as Go marshals it inside `ExtenderArgs.Nodes`.
#[derive(Debug, Serialize)]
pub struct NodeListOut<'a> {
    /// Empty list metadata.
    pub metadata: Map<String, Value>,
    /// The nodes.
    pub items: Vec<&'a Node>,
}

/// `ExtenderArgs`: the filter request.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs<'a> {
    /// The pod being scheduled.
    pub pod: &'a Pod,
    /// Whole nodes (when the extender is not `nodeCacheCapable`), else null.
    pub nodes: Option<NodeListOut<'a>>,
    /// Node names (when `nodeCacheCapable`), else null.
    pub node_names: Option<Vec<String>>,
}

/// `ExtenderBindingArgs`: the bind request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Target node.
    pub node: String,
}

/// `ExtenderFilterResult` as decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtenderFilterResult {
    /// `Nodes.items[].metadata.name`, when `Nodes` was set.
    pub nodes: Option<Vec<String>>,
    /// `NodeNames`.
    pub node_names: Option<Vec<String>>,
    /// `FailedNodes`: node → reason.
    pub failed_nodes: BTreeMap<String, String>,
    /// `FailedAndUnresolvableNodes`: node → reason.
    pub failed_and_unresolvable: BTreeMap<String, String>,
    /// `Error` (empty means none).
    pub error: String,
}

/// `ExtenderBindingResult` as decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtenderBindingResult {
    /// `Error` (empty means none).
    pub error: String,
}

/// Finds `name` in `map` as Go does: the exact key first, then any key
/// equal ignoring case.
fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn object(body: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(WireError::NotObject(other.to_string())),
        Err(e) => Err(WireError::NotObject(e.to_string())),
    }
}

fn string_field(map: &Map<String, Value>, name: &'static str) -> Result<String, WireError> {
    match field(map, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(WireError::Field {
            field: name,
            reason: format!("expected a string, got {other}"),
        }),
    }
}

fn string_list(
    map: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<Vec<String>>, WireError> {
    match field(map, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| WireError::Field {
                        field: name,
                        reason: format!("expected strings, got {v}"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(WireError::Field {
            field: name,
            reason: format!("expected a list, got {other}"),
        }),
    }
}

fn string_map(
    map: &Map<String, Value>,
    name: &'static str,
) -> Result<BTreeMap<String, String>, WireError> {
    match field(map, name) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(WireError::Field {
                    field: name,
                    reason: format!("expected string values, got {other}"),
                }),
            })
            .collect(),
        Some(other) => Err(WireError::Field {
            field: name,
            reason: format!("expected an object, got {other}"),
        }),
    }
}

impl ExtenderFilterResult {
    /// Decodes a filter reply body.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let map = object(body)?;
        let nodes = match field(&map, "Nodes") {
            None | Some(Value::Null) => None,
            Some(Value::Object(list)) => {
                let items = match field(list, "items") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items.clone(),
                    Some(other) => {
                        return Err(WireError::Field {
                            field: "Nodes",
                            reason: format!("items is not a list: {other}"),
                        });
                    }
                };
                Some(
                    items
                        .iter()
                        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                        .collect(),
                )
            }
            Some(other) => {
                return Err(WireError::Field {
                    field: "Nodes",
                    reason: format!("expected a NodeList, got {other}"),
                });
            }
        };
        Ok(Self {
            nodes,
            node_names: string_list(&map, "NodeNames")?,
            failed_nodes: string_map(&map, "FailedNodes")?,
            failed_and_unresolvable: string_map(&map, "FailedAndUnresolvableNodes")?,
            error: string_field(&map, "Error")?,
        })
    }
}

impl ExtenderBindingResult {
    /// Decodes a bind reply body.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let map = object(body)?;
        Ok(Self {
            error: string_field(&map, "Error")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_are_pascal_case_with_nulls() {
        let pod = Pod::default();
        let args = ExtenderArgs {
            pod: &pod,
            nodes: None,
            node_names: Some(vec!["n1".into()]),
        };
        let v = serde_json::to_value(&args).unwrap();
        assert_eq!(v["Nodes"], Value::Null);
        assert_eq!(v["NodeNames"], json!(["n1"]));
        assert!(v.get("Pod").is_some());
        let bind = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            node: "n".into(),
        };
        assert_eq!(
            serde_json::to_value(&bind).unwrap(),
            json!({"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"})
        );
    }

    #[test]
    fn replies_decode_in_any_case() {
        let r = ExtenderFilterResult::decode(
            br#"{"nodenames":["n2"],"failedNodes":{"n1":"2/2 CardInsufficientMemory"},"FailedAndUnresolvableNodes":null,"error":""}"#,
        )
        .unwrap();
        assert_eq!(r.node_names, Some(vec!["n2".to_string()]));
        assert_eq!(r.failed_nodes["n1"], "2/2 CardInsufficientMemory");
        assert!(r.error.is_empty());
        let r = ExtenderFilterResult::decode(br#"{"Nodes":{"items":[{"metadata":{"name":"a"}}]}}"#)
            .unwrap();
        assert_eq!(r.nodes, Some(vec!["a".to_string()]));
        assert_eq!(
            ExtenderBindingResult::decode(br#"{"Error":"no"}"#)
                .unwrap()
                .error,
            "no"
        );
        assert!(ExtenderFilterResult::decode(b"[]").is_err());
        assert!(ExtenderFilterResult::decode(br#"{"NodeNames":"x"}"#).is_err());
        assert!(ExtenderBindingResult::decode(br#"{"Error":3}"#).is_err());
    }
}

//! The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs carry no json tags, so kube-scheduler sends PascalCase keys
//! and Go decodes any case. We accept any case on input and always emit
//! PascalCase, with `null` for absent lists and maps as Go does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::{Map, Value};

/// The `Error` of a filter or bind that arrives before the model has
/// listed nodes, pods and resourcequotas once (kube-scheduler calls the
/// extender on 127.0.0.1, where `/readyz` protects nothing; it retries a
/// pod whose extender answered `Error` after its backoff).
pub const NOT_SYNCED: &str =
    "scheduler-webhook has not synced nodes, pods and resourcequotas yet; retry later";

/// A body that is not a usable extender request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// Not JSON, or not an object.
    #[error("body is not a JSON object: {0}")]
    NotJson(String),
    /// A field is missing or has the wrong type.
    #[error("field {field}: {why}")]
    Field {
        /// The field (PascalCase).
        field: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// `ExtenderArgs`: the filter request.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    pub pod: Pod,
    /// Candidate node names (`nodeCacheCapable: true`: kube-scheduler's
    /// live path).
    pub node_names: Option<Vec<String>>,
    /// Candidate Node objects (`nodeCacheCapable: false`: Cluster
    /// Autoscaler's simulation, possibly of nodes that do not exist yet).
    /// When set, the filter is a dry run and `node_names` is ignored, as
    /// HAMi does.
    pub nodes: Option<Vec<NodeObject>>,
}

/// One Node object of `ExtenderArgs.Nodes`: its name, the object as sent
/// (echoed back in the reply's `Nodes`), and whether it reads as a Node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeObject {
    /// `metadata.name`.
    pub name: String,
    /// The object exactly as sent.
    pub raw: Value,
}

impl NodeObject {
    /// The object as a Node.
    ///
    /// # Errors
    /// A field has the wrong type, named in the message.
    pub fn node(&self) -> Result<Node, BadNode> {
        serde_json::from_value(self.raw.clone()).map_err(|e| BadNode {
            name: self.name.clone(),
            why: e.to_string(),
        })
    }
}

/// A Node object in `ExtenderArgs.Nodes` that does not read as a Node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Nodes: node {name:?} is not a valid Node object: {why}")]
pub struct BadNode {
    /// Its `metadata.name`.
    pub name: String,
    /// What is wrong.
    pub why: String,
}

impl ExtenderArgs {
    /// The candidate node names, whichever form they came in.
    #[must_use]
    pub fn candidates(&self) -> Vec<&str> {
        match (&self.nodes, &self.node_names) {
            (Some(nodes), _) => nodes.iter().map(|n| n.name.as_str()).collect(),
            (None, Some(names)) => names.iter().map(String::as_str).collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The reply's `Nodes`: a `NodeList` of these objects, as sent.
#[must_use]
pub fn node_list<'a>(objects: impl IntoIterator<Item = &'a NodeObject>) -> Value {
    let items: Vec<Value> = objects.into_iter().map(|n| n.raw.clone()).collect();
    serde_json::json!({"metadata": {}, "items": items})
}

/// `ExtenderFilterResult`: the filter reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    /// Node objects that passed (a `NodeList`): set when the request
    /// carried `Nodes`, `null` otherwise.
    pub nodes: Option<Value>,
    /// Names of the nodes that passed.
    pub node_names: Option<Vec<String>>,
    /// Nodes that failed, with the reason; preemption may retry them.
    pub failed_nodes: Option<BTreeMap<String, String>>,
    /// Nodes that failed for a reason preemption cannot fix.
    pub failed_and_unresolvable_nodes: Option<BTreeMap<String, String>>,
    /// An error for the whole request; empty when none.
    pub error: String,
}

/// `ExtenderBindingArgs`: the bind request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod UID.
    pub pod_uid: String,
    /// The node to bind to.
    pub node: String,
}

/// `ExtenderBindingResult`: the bind reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    /// An error; empty when the binding was made.
    pub error: String,
}

fn object(body: &[u8]) -> Result<Map<String, Value>, BadRequest> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(BadRequest::NotJson(format!("a JSON {}", kind_of(&other)))),
        Err(e) => Err(BadRequest::NotJson(e.to_string())),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The value of `field` in any letter case (as Go's decoder matches).
fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn string_field(map: &Map<String, Value>, name: &'static str) -> Result<String, BadRequest> {
    match field(map, name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(BadRequest::Field {
            field: name,
            why: "missing or empty".to_owned(),
        }),
        Some(other) => Err(BadRequest::Field {
            field: name,
            why: format!("expected a string, got a {}", kind_of(other)),
        }),
    }
}

/// The fields of `ExtenderArgs`, matched in any letter case.
#[derive(Clone, Copy)]
enum ArgsField {
    Pod,
    NodeNames,
    Nodes,
}

impl ArgsField {
    fn of(key: &str) -> Option<Self> {
        [Self::Pod, Self::NodeNames, Self::Nodes]
            .into_iter()
            .find(|f| key.eq_ignore_ascii_case(f.name()))
    }

    fn name(self) -> &'static str {
        match self {
            Self::Pod => "Pod",
            Self::NodeNames => "NodeNames",
            Self::Nodes => "Nodes",
        }
    }
}

/// `Nodes` as sent without a node cache: a `NodeList`, whose items are
/// kept as sent (read as Nodes only when used).
#[derive(serde::Deserialize)]
struct RawNodeList {
    items: Vec<Value>,
}

/// Reads `ExtenderArgs` straight from the body, without an intermediate
/// `Value` (a filter body carries thousands of node names), remembering
/// which field it was reading so an error can name it.
struct ArgsVisitor<'a> {
    reading: &'a std::cell::Cell<Option<ArgsField>>,
}

type RawArgs = (Option<Pod>, Option<Vec<String>>, Option<RawNodeList>);

impl<'de> serde::de::DeserializeSeed<'de> for ArgsVisitor<'_> {
    type Value = RawArgs;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<RawArgs, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ArgsVisitor<'_> {
    type Value = RawArgs;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an ExtenderArgs object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RawArgs, A::Error> {
        let (mut pod, mut node_names, mut nodes) = (None, None, None);
        // Go's decoder: any letter case, a later key overrides an earlier one.
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let Some(f) = ArgsField::of(&key) else {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            };
            self.reading.set(Some(f));
            match f {
                ArgsField::Pod => pod = map.next_value()?,
                ArgsField::NodeNames => node_names = map.next_value()?,
                ArgsField::Nodes => nodes = map.next_value()?,
            }
            self.reading.set(None);
        }
        Ok((pod, node_names, nodes))
    }
}

/// Decodes a filter request.
///
/// # Errors
/// [`BadRequest`] naming the field that is wrong.
pub fn decode_filter(body: &[u8]) -> Result<ExtenderArgs, BadRequest> {
    use serde::de::DeserializeSeed as _;
    let reading = std::cell::Cell::new(None);
    let mut de = serde_json::Deserializer::from_slice(body);
    let decoded = ArgsVisitor { reading: &reading }
        .deserialize(&mut de)
        .and_then(|args| de.end().map(|()| args));
    let (pod, node_names, nodes) = decoded.map_err(|e| match reading.get() {
        Some(f) => BadRequest::Field {
            field: f.name(),
            why: e.to_string(),
        },
        None => BadRequest::NotJson(e.to_string()),
    })?;
    let pod = pod.ok_or(BadRequest::Field {
        field: "Pod",
        why: "missing".to_owned(),
    })?;
    let nodes = nodes
        .map(|list| {
            list.items
                .into_iter()
                .enumerate()
                .map(|(i, raw)| {
                    let name = raw
                        .get("metadata")
                        .and_then(|m| m.get("name"))
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .ok_or_else(|| BadRequest::Field {
                            field: "Nodes",
                            why: format!("item {i} has no metadata.name"),
                        })?;
                    Ok(NodeObject { name, raw })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(ExtenderArgs {
        pod,
        node_names,
        nodes,
    })
}

/// Decodes a bind request.
///
/// # Errors
/// [`BadRequest`] naming the field that is wrong.
pub fn decode_bind(body: &[u8]) -> Result<ExtenderBindingArgs, BadRequest> {
    let map = object(body)?;
    Ok(ExtenderBindingArgs {
        pod_name: string_field(&map, "PodName")?,
        pod_namespace: string_field(&map, "PodNamespace")?,
        pod_uid: string_field(&map, "PodUID")?,
        node: string_field(&map, "Node")?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": [{"name": "c"}]}})
    }

    #[test]
    fn filter_request_decodes_in_pascal_and_camel_case() {
        for body in [
            json!({"Pod": pod(), "Nodes": null, "NodeNames": ["n1", "n2"]}),
            json!({"pod": pod(), "nodes": null, "nodenames": ["n1", "n2"]}),
            json!({"pod": pod(), "nodeNames": ["n1", "n2"]}),
        ] {
            let args = decode_filter(&serde_json::to_vec(&body).unwrap()).unwrap();
            assert_eq!(args.candidates(), ["n1", "n2"]);
            assert_eq!(args.pod.metadata.name.as_deref(), Some("p"));
        }
    }

    #[test]
    fn node_objects_give_their_names() {
        let body = json!({"Pod": pod(), "Nodes": {"items": [{"metadata": {"name": "a"}}]}, "NodeNames": null});
        let args = decode_filter(&serde_json::to_vec(&body).unwrap()).unwrap();
        assert_eq!(args.candidates(), ["a"]);
        assert!(args.node_names.is_none());
    }

    #[test]
    fn filter_result_is_pascal_case_with_nulls() {
        let result = ExtenderFilterResult {
            node_names: Some(vec!["n2".into()]),
            failed_nodes: Some(BTreeMap::from([(
                "n1".into(),
                "2/2 CardInsufficientMemory".into(),
            )])),
            ..ExtenderFilterResult::default()
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"Nodes": null, "NodeNames": ["n2"], "FailedNodes": {"n1": "2/2 CardInsufficientMemory"},
                   "FailedAndUnresolvableNodes": null, "Error": ""})
        );
        assert_eq!(
            serde_json::to_value(ExtenderBindingResult::default()).unwrap(),
            json!({"Error": ""})
        );
    }

    #[test]
    fn bind_request_decodes_in_any_case() {
        for body in [
            json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"}),
            json!({"podName": "p", "podNamespace": "ns", "podUID": "u1", "node": "n1"}),
        ] {
            let args = decode_bind(&serde_json::to_vec(&body).unwrap()).unwrap();
            assert_eq!(
                args,
                ExtenderBindingArgs {
                    pod_name: "p".into(),
                    pod_namespace: "ns".into(),
                    pod_uid: "u1".into(),
                    node: "n1".into()
                }
            );
        }
    }

    #[test]
    fn malformed_requests_name_the_field() {
        assert!(matches!(decode_filter(b"[1]"), Err(BadRequest::NotJson(_))));
        assert!(matches!(decode_filter(b"{"), Err(BadRequest::NotJson(_))));
        assert_eq!(
            decode_filter(br#"{"NodeNames":["a"]}"#),
            Err(BadRequest::Field {
                field: "Pod",
                why: "missing".into()
            })
        );
        let err =
            decode_filter(br#"{"Pod":{"spec":{"containers":3}},"NodeNames":["a"]}"#).unwrap_err();
        assert!(matches!(err, BadRequest::Field { field: "Pod", .. }));
        let err =
            decode_filter(&serde_json::to_vec(&json!({"Pod": pod(), "NodeNames": "a"})).unwrap())
                .unwrap_err();
        assert!(matches!(
            err,
            BadRequest::Field {
                field: "NodeNames",
                ..
            }
        ));
        for nodes in [json!({}), json!({"items": [{"metadata": {}}]}), json!([1])] {
            let body = json!({"Pod": pod(), "Nodes": nodes});
            let err = decode_filter(&serde_json::to_vec(&body).unwrap()).unwrap_err();
            assert!(
                matches!(err, BadRequest::Field { field: "Nodes", .. }),
                "{err}"
            );
        }
        // Unknown keys are skipped; a later key in another case wins, as in Go.
        let body = br#"{"Extra":{"a":[1]},"NodeNames":["x"],"Pod":{"metadata":{"name":"p"}},"nodenames":["y"]}"#;
        assert_eq!(decode_filter(body).unwrap().candidates(), ["y"]);
        let err = decode_bind(br#"{"PodName":"p","PodNamespace":"ns","PodUID":7,"Node":"n"}"#)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "field PodUID: expected a string, got a number"
        );
        assert!(decode_bind(br#"{"PodName":"p"}"#).is_err());
    }
}

//! Server-side printing: the `meta.k8s.io/v1` `Table` the real server sends
//! when a client (kubectl) asks with `Accept: application/json;as=Table`.
//! Columns follow kubectl's printers for pods, nodes and namespaces
//! (including the `-o wide` columns, priority 1); other resources get the
//! default `Name`/`Created At` table.
//!
//! Pure functions over stored objects.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// What each row carries in `object` (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    /// Nothing.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

/// Reads `includeObject` from the query.
pub fn include(query: &HashMap<String, String>) -> Include {
    match query.get("includeObject").map(String::as_str) {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    }
}

fn column(name: &str, kind: &str, priority: u8, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": priority})
}

fn columns(def: &ResourceDef) -> Vec<Value> {
    let name = column(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    let age = column(
        "Age",
        "string",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match def.plural {
        "pods" => vec![
            name,
            column(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            column(
                "Status",
                "string",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            column(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age,
            column("IP", "string", 1, "IP address allocated to the pod."),
            column(
                "Node",
                "string",
                1,
                "Name of the Node this pod is assigned to.",
            ),
            column(
                "Nominated Node",
                "string",
                1,
                "Name of the node nominated by the scheduler.",
            ),
            column("Readiness Gates", "string", 1, "Pod readiness gates."),
        ],
        "nodes" => vec![
            name,
            column("Status", "string", 0, "The status of the node"),
            column("Roles", "string", 0, "The roles of the node"),
            age,
            column(
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            column("Internal-IP", "string", 1, "List of internal IPs."),
            column("External-IP", "string", 1, "List of external IPs."),
            column("OS-Image", "string", 1, "OS Image reported by the node."),
            column(
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node.",
            ),
            column(
                "Container-Runtime",
                "string",
                1,
                "Container Runtime Version reported by the node.",
            ),
        ],
        "namespaces" => vec![
            name,
            column("Status", "string", 0, "The status of the namespace"),
            age,
        ],
        "leases" => vec![
            name,
            column("Holder", "string", 0, "The holder of the lease"),
            age,
        ],
        "events" => vec![
            column(
                "Last Seen",
                "string",
                0,
                "Time since the most recent occurrence of this event.",
            ),
            column("Type", "string", 0, "Type of this event (Normal, Warning)."),
            column("Reason", "string", 0, "Why the action was taken."),
            column(
                "Object",
                "string",
                0,
                "The object that this event is about.",
            ),
            column(
                "Subobject",
                "string",
                1,
                "The subobject that this event is about.",
            ),
            column("Source", "string", 1, "The component reporting this event."),
            column(
                "Message",
                "string",
                0,
                "A human-readable description of the status of this operation.",
            ),
            column(
                "First Seen",
                "string",
                1,
                "Time since the first occurrence of this event.",
            ),
            column(
                "Count",
                "string",
                1,
                "The number of times this event has occurred.",
            ),
            name,
        ],
        _ => vec![
            name,
            column("Created At", "date", 0, "The time the object was created."),
        ],
    }
}

/// kubectl's `HumanDuration`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(object: &Value) -> String {
    since(&object["metadata"]["creationTimestamp"])
}

/// Human duration from an RFC 3339 timestamp to now.
fn since(timestamp: &Value) -> String {
    let created = timestamp
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
    match created {
        Some(t) => {
            let now = k8s_openapi::jiff::Timestamp::now();
            human_duration(now.as_second() - t.as_second())
        }
        None => "<unknown>".to_string(),
    }
}

fn text(value: &Value, fallback: &str) -> String {
    match value.as_str() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => fallback.to_string(),
    }
}

fn pod_cells(pod: &Value) -> Vec<Value> {
    let containers = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = statuses.iter().filter(|s| s["ready"] == true).count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    let waiting = statuses
        .iter()
        .find_map(|s| s["state"]["waiting"]["reason"].as_str())
        .or_else(|| {
            statuses
                .iter()
                .find_map(|s| s["state"]["terminated"]["reason"].as_str())
        });
    let status = if pod["metadata"]["deletionTimestamp"].is_string() {
        "Terminating".to_string()
    } else if let Some(reason) = pod["status"]["reason"].as_str() {
        reason.to_string()
    } else if let Some(reason) = waiting {
        reason.to_string()
    } else {
        text(&pod["status"]["phase"], "Unknown")
    };
    let gates = pod["spec"]["readinessGates"].as_array().map_or(0, Vec::len);
    vec![
        pod["metadata"]["name"].clone(),
        json!(format!("{ready}/{containers}")),
        json!(status),
        json!(restarts.to_string()),
        json!(age(pod)),
        json!(text(&pod["status"]["podIP"], "<none>")),
        json!(text(&pod["spec"]["nodeName"], "<none>")),
        json!(text(&pod["status"]["nominatedNodeName"], "<none>")),
        json!(if gates == 0 {
            "<none>".to_string()
        } else {
            format!("0/{gates}")
        }),
    ]
}

fn node_address(node: &Value, kind: &str) -> String {
    node["status"]["addresses"]
        .as_array()
        .and_then(|list| list.iter().find(|a| a["type"] == kind))
        .map_or_else(|| "<none>".to_string(), |a| text(&a["address"], "<none>"))
}

fn node_cells(node: &Value) -> Vec<Value> {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].as_str().unwrap_or_default().to_string());
    let mut status = match ready.as_deref() {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if node["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = node["metadata"]["labels"]
        .as_object()
        .map(|labels| {
            labels
                .keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    let info = &node["status"]["nodeInfo"];
    vec![
        node["metadata"]["name"].clone(),
        json!(status),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        json!(age(node)),
        json!(text(&info["kubeletVersion"], "")),
        json!(node_address(node, "InternalIP")),
        json!(node_address(node, "ExternalIP")),
        json!(text(&info["osImage"], "<unknown>")),
        json!(text(&info["kernelVersion"], "<unknown>")),
        json!(text(&info["containerRuntimeVersion"], "<unknown>")),
    ]
}

fn cells(def: &ResourceDef, object: &Value) -> Vec<Value> {
    match def.plural {
        "pods" => pod_cells(object),
        "nodes" => node_cells(object),
        "namespaces" => vec![
            object["metadata"]["name"].clone(),
            json!(text(&object["status"]["phase"], "Active")),
            json!(age(object)),
        ],
        "leases" => vec![
            object["metadata"]["name"].clone(),
            json!(text(&object["spec"]["holderIdentity"], "<none>")),
            json!(age(object)),
        ],
        "events" => event_cells(object),
        _ => vec![
            object["metadata"]["name"].clone(),
            object["metadata"]["creationTimestamp"].clone(),
        ],
    }
}

fn event_cells(event: &Value) -> Vec<Value> {
    let involved = &event["involvedObject"];
    let last = [
        &event["lastTimestamp"],
        &event["eventTime"],
        &event["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .find(|t| t.is_string())
    .map_or_else(|| "<unknown>".to_string(), since);
    let first = [
        &event["firstTimestamp"],
        &event["eventTime"],
        &event["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .find(|t| t.is_string())
    .map_or_else(|| "<unknown>".to_string(), since);
    let source = [&event["source"]["component"], &event["reportingComponent"]]
        .into_iter()
        .find_map(|s| s.as_str().filter(|s| !s.is_empty()))
        .unwrap_or_default();
    vec![
        json!(last),
        json!(text(&event["type"], "")),
        json!(text(&event["reason"], "")),
        json!(format!(
            "{}/{}",
            involved["kind"]
                .as_str()
                .unwrap_or_default()
                .to_ascii_lowercase(),
            involved["name"].as_str().unwrap_or_default()
        )),
        json!(text(&involved["fieldPath"], "")),
        json!(source),
        json!(text(&event["message"], "")),
        json!(first),
        json!(event["count"].as_i64().unwrap_or(1).to_string()),
        event["metadata"]["name"].clone(),
    ]
}

/// A `Table` with one row per object.
pub fn table(
    def: &ResourceDef,
    objects: &[Value],
    resource_version: Option<u64>,
    include: Include,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut row = json!({"cells": cells(def, object)});
            match include {
                Include::None => {}
                Include::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": object["metadata"],
                    });
                }
                Include::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv.to_string());
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns(def),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_kubectl() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (-5, "<invalid>"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn pod_rows_have_wide_columns() {
        let pods = ResourceDef::find("", "v1", "pods").unwrap();
        let pod = json!({
            "metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "containerStatuses": [{"ready": true, "restartCount": 2}]}
        });
        let t = table(pods, &[pod], Some(7), Include::Metadata);
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 9);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "p");
        assert_eq!(cells[1], "1/1");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], "2");
        assert_eq!(cells[6], "n1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn node_rows_show_readiness_and_roles() {
        let nodes = ResourceDef::find("", "v1", "nodes").unwrap();
        let node = json!({
            "metadata": {"name": "n", "labels": {"node-role.kubernetes.io/worker": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        let t = table(nodes, &[node], None, Include::None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "worker");
        assert!(t["rows"][0].get("object").is_none());
    }
}

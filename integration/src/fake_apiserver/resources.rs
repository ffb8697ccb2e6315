//! The resource table of the fake kube-apiserver and the discovery documents
//! built from it (`/api`, `/api/v1`, `/apis`, `/apis/{group}`,
//! `/apis/{group}/{version}`, `/version`).
//!
//! Owns which resources exist, their kinds, scopes, verbs, short names,
//! subresources and the field labels a field selector may use. It does not
//! own any object (see `store`).

use serde_json::{Value, json};

/// One served resource (`pods`, `leases`, ...).
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Plural, lower-case resource name used in paths.
    pub plural: &'static str,
    /// Singular name as discovery reports it.
    pub singular: &'static str,
    /// Object kind.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names kubectl accepts (`po`, `no`).
    pub short_names: &'static [&'static str],
    /// Subresources beyond the object itself (`status`, `binding`).
    pub subresources: &'static [&'static str],
    /// Field labels accepted by a field selector besides `metadata.name`
    /// and `metadata.namespace` (as registered by the real server).
    pub field_labels: &'static [&'static str],
}

/// Verbs on every resource. `deletecollection` is not implemented, so it is
/// not advertised.
const OBJECT_VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// Every resource the fake serves.
pub const RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        subresources: &["binding", "status"],
        field_labels: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        subresources: &["status"],
        field_labels: &["spec.unschedulable"],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        field_labels: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "resourcequotas",
        singular: "resourcequota",
        kind: "ResourceQuota",
        namespaced: true,
        short_names: &["quota"],
        subresources: &["status"],
        field_labels: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        subresources: &["status"],
        field_labels: &["status.phase"],
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        field_labels: &[],
    },
];

/// Namespaces that exist when the server starts, as in a fresh cluster.
pub const INITIAL_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The version the fake claims to be (`/version`).
pub const SERVER_GIT_VERSION: &str = "v1.33.0-gpuslice-fake";

impl ResourceDef {
    /// Looks a resource up by group, version and plural name.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// `apiVersion` of objects of this resource (`v1`, `coordination.k8s.io/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kind of the list type (`PodList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `plural.group` as used in error messages (`leases.coordination.k8s.io`).
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether `label` may be used in a field selector on this resource.
    pub fn supports_field_label(&self, label: &str) -> bool {
        label == "metadata.name"
            || (label == "metadata.namespace" && self.namespaced)
            || self.field_labels.contains(&label)
    }

    /// Whether the resource has the named subresource.
    pub fn has_subresource(&self, name: &str) -> bool {
        self.subresources.contains(&name)
    }
}

/// `APIResourceList` for one group version.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for def in &defs {
        let mut entry = json!({
            "name": def.plural,
            "singularName": def.singular,
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": OBJECT_VERBS,
        });
        if !def.short_names.is_empty() {
            entry["shortNames"] = json!(def.short_names);
        }
        resources.push(entry);
        for sub in def.subresources {
            let (kind, verbs): (&str, Vec<&str>) = match *sub {
                "binding" => ("Binding", vec!["create"]),
                _ => (def.kind, vec!["get", "patch", "update"]),
            };
            resources.push(json!({
                "name": format!("{}/{}", def.plural, sub),
                "singularName": "",
                "namespaced": def.namespaced,
                "kind": kind,
                "verbs": verbs,
            }));
        }
    }
    let group_version = defs[0].api_version();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// `APIVersions` served at `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    })
}

fn named_groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&(r.group, r.version)) {
            groups.push((r.group, r.version));
        }
    }
    groups
}

fn group_entry(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `APIGroupList` served at `/apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = named_groups()
        .into_iter()
        .map(|(g, v)| group_entry(g, v))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `APIGroup` served at `/apis/{group}`.
pub fn group(name: &str) -> Option<Value> {
    named_groups()
        .into_iter()
        .find(|(g, _)| *g == name)
        .map(|(g, v)| {
            let mut entry = group_entry(g, v);
            entry["kind"] = json!("APIGroup");
            entry["apiVersion"] = json!("v1");
            entry
        })
}

/// `version.Info` served at `/version`.
pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": SERVER_GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resource_list_has_short_names_and_subresources() {
        let list = resource_list("", "v1").unwrap();
        let resources = list["resources"].as_array().unwrap();
        let pods = resources.iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["namespaced"], json!(true));
        assert!(resources.iter().any(|r| r["name"] == "pods/binding"));
        let nodes = resources.iter().find(|r| r["name"] == "nodes").unwrap();
        assert_eq!(nodes["namespaced"], json!(false));
        assert_eq!(nodes["shortNames"], json!(["no"]));
    }

    #[test]
    fn coordination_group_is_discoverable() {
        let groups = group_list();
        assert_eq!(groups["groups"][0]["name"], "coordination.k8s.io");
        assert!(group("coordination.k8s.io").is_some());
        assert!(group("apps").is_none());
        let leases = resource_list("coordination.k8s.io", "v1").unwrap();
        assert_eq!(leases["groupVersion"], "coordination.k8s.io/v1");
    }

    #[test]
    fn field_labels_are_per_resource() {
        let pods = ResourceDef::find("", "v1", "pods").unwrap();
        assert!(pods.supports_field_label("spec.nodeName"));
        assert!(pods.supports_field_label("metadata.namespace"));
        assert!(!pods.supports_field_label("spec.containers"));
        let nodes = ResourceDef::find("", "v1", "nodes").unwrap();
        assert!(!nodes.supports_field_label("metadata.namespace"));
    }
}

//! The store's objects, with the index the real API server's watch cache
//! keeps for pods: by `spec.nodeName`, so that a kubelet's or a device
//! plugin's `fieldSelector=spec.nodeName=<node>` list reads that node's pods
//! instead of every object of the cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::resources::ResourceDef;

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// API group of the resource.
    pub group: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Namespace, `""` for cluster-scoped objects.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

/// Every stored object by key, and the pods by node.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    all: BTreeMap<ObjectKey, Value>,
    /// Bound pods (non-empty `spec.nodeName`) by node, in key order.
    pods_by_node: HashMap<String, BTreeSet<ObjectKey>>,
}

/// The node a stored object is bound to, when it is a bound pod.
fn bound_node<'a>(key: &ObjectKey, object: &'a Value) -> Option<&'a str> {
    let is_pod = key.group.is_empty() && key.plural == "pods";
    let node = object.pointer("/spec/nodeName").and_then(Value::as_str);
    node.filter(|n| is_pod && !n.is_empty())
}

impl Objects {
    /// The object under `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.all.get(key)
    }

    /// Whether `key` holds an object.
    pub fn contains_key(&self, key: &ObjectKey) -> bool {
        self.all.contains_key(key)
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.all.keys()
    }

    /// Stores `object` under `key`; returns what was there.
    pub fn insert(&mut self, key: ObjectKey, object: Value) -> Option<Value> {
        if let Some(node) = bound_node(&key, &object) {
            self.pods_by_node
                .entry(node.to_owned())
                .or_default()
                .insert(key.clone());
        }
        let before = self.all.insert(key.clone(), object);
        self.unindex_moved(&key, before.as_ref());
        before
    }

    /// Removes the object under `key`.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Value> {
        let before = self.all.remove(key);
        self.unindex_moved(key, before.as_ref());
        before
    }

    /// Drops `key` from the node `before` was bound to, unless the object
    /// now stored under `key` is bound to that same node.
    fn unindex_moved(&mut self, key: &ObjectKey, before: Option<&Value>) {
        let Some(old) = before.and_then(|b| bound_node(key, b)) else {
            return;
        };
        let now = self.all.get(key).and_then(|v| bound_node(key, v));
        if now == Some(old) {
            return;
        }
        if let Some(set) = self.pods_by_node.get_mut(old) {
            set.remove(key);
            if set.is_empty() {
                self.pods_by_node.remove(old);
            }
        }
    }

    /// The objects of one resource (and namespace, when given), in key
    /// order.
    pub fn of_kind<'a, 'n>(
        &'a self,
        def: &ResourceDef,
        namespace: Option<&'n str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + use<'a, 'n> {
        let start = ObjectKey {
            group: def.group,
            plural: def.plural,
            namespace: namespace.unwrap_or_default().to_owned(),
            name: String::new(),
        };
        let (group, plural) = (def.group, def.plural);
        self.all.range(start..).take_while(move |(k, _)| {
            k.group == group && k.plural == plural && namespace.is_none_or(|ns| k.namespace == ns)
        })
    }

    /// The pods bound to `node` (and in `namespace`, when given), in key
    /// order.
    pub fn pods_on_node<'a, 'n>(
        &'a self,
        node: &str,
        namespace: Option<&'n str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + use<'a, 'n> {
        self.pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter(move |k| namespace.is_none_or(|ns| k.namespace == ns))
            .filter_map(|k| self.all.get_key_value(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> &'static ResourceDef {
        ResourceDef::find("", "v1", "pods").unwrap()
    }

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: "",
            plural: "pods",
            namespace: ns.to_owned(),
            name: name.to_owned(),
        }
    }

    fn pod(node: &str) -> Value {
        json!({"spec": {"nodeName": node}})
    }

    fn on(objects: &Objects, node: &str) -> Vec<String> {
        objects
            .pods_on_node(node, None)
            .map(|(k, _)| k.name.clone())
            .collect()
    }

    #[test]
    fn the_node_index_follows_binds_moves_and_deletes() {
        let mut o = Objects::default();
        o.insert(key("a", "p1"), pod(""));
        assert!(on(&o, "n1").is_empty(), "an unbound pod is on no node");
        o.insert(key("a", "p1"), pod("n1"));
        o.insert(key("b", "p2"), pod("n1"));
        assert_eq!(on(&o, "n1"), ["p1", "p2"]);
        o.insert(key("a", "p1"), pod("n1"));
        assert_eq!(
            on(&o, "n1"),
            ["p1", "p2"],
            "a rewrite on the same node keeps it"
        );
        o.insert(key("a", "p1"), pod("n2"));
        assert_eq!(on(&o, "n1"), ["p2"]);
        assert_eq!(on(&o, "n2"), ["p1"]);
        o.remove(&key("b", "p2"));
        assert!(on(&o, "n1").is_empty());
        assert_eq!(
            o.pods_on_node("n2", Some("b")).count(),
            0,
            "the namespace filter applies"
        );
    }

    #[test]
    fn of_kind_reads_one_resource_and_namespace_only() {
        let mut o = Objects::default();
        o.insert(key("a", "p1"), pod(""));
        o.insert(key("b", "p2"), pod(""));
        let node = ObjectKey {
            group: "",
            plural: "nodes",
            namespace: String::new(),
            name: "n1".into(),
        };
        o.insert(node, json!({}));
        let all: Vec<_> = o
            .of_kind(pods(), None)
            .map(|(k, _)| k.name.clone())
            .collect();
        assert_eq!(all, ["p1", "p2"]);
        let in_b: Vec<_> = o
            .of_kind(pods(), Some("b"))
            .map(|(k, _)| k.name.clone())
            .collect();
        assert_eq!(in_b, ["p2"]);
    }

    #[test]
    fn a_non_pod_with_a_node_name_is_not_indexed() {
        let mut o = Objects::default();
        let other = ObjectKey {
            group: "example.com",
            plural: "things",
            namespace: "a".into(),
            name: "t".into(),
        };
        o.insert(other, pod("n1"));
        assert!(on(&o, "n1").is_empty());
    }
}

//! Typed waiting helpers for tests and the sandbox: wait until an object,
//! or a list of objects, satisfies a condition, or fail after a deadline.
//! Event-driven: each helper runs a kube-rs watcher and re-checks on every
//! change; nothing sleeps for a fixed time.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Errors of the waiting helpers.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The condition did not hold before the deadline.
    #[error("{what}: condition not met within {deadline:?}; last seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        deadline: Duration,
        /// A summary of the last state seen.
        last: String,
    },
    /// The watch ended (the server went away).
    #[error("{0}: the watch ended")]
    WatchEnded(String),
    /// A request failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Waits until the list of objects selected by `params` (label and field
/// selectors) satisfies `condition` (which sees the objects in no
/// particular order, without a copy); returns that list, sorted by
/// namespace/name.
pub async fn wait_for_list<K>(
    api: Api<K>,
    params: watcher::Config,
    what: &str,
    deadline: Duration,
    condition: impl Fn(&[K]) -> bool,
) -> Result<Vec<K>, HarnessError>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let mut stream = watcher(api, params).default_backoff().boxed();
    let mut objects: Listed<K> = Listed::default();
    let mut buffer: Option<Listed<K>> = None;
    let mut synced = false;
    let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
    let waiting = async {
        loop {
            let Some(first) = stream.next().await else {
                return Err(HarnessError::WatchEnded(what.to_string()));
            };
            // Every event already waiting is applied before the condition
            // is evaluated, on the list in place: copying it per event
            // would copy N lists of N pods for a burst of N pod updates.
            let mut next = Some(first);
            let mut ended = false;
            while let Some(event) = next.take() {
                match event {
                    Ok(watcher::Event::Init) => buffer = Some(Listed::default()),
                    Ok(watcher::Event::InitApply(o)) => {
                        if let Some(b) = buffer.as_mut() {
                            b.insert(key(&o), o);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(b) = buffer.take() {
                            objects = b;
                        }
                        synced = true;
                    }
                    Ok(watcher::Event::Apply(o)) => {
                        objects.insert(key(&o), o);
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        objects.remove(&key(&o));
                    }
                    Err(_) => {}
                }
                match stream.next().now_or_never() {
                    Some(Some(event)) => next = Some(event),
                    Some(None) => ended = true,
                    None => {}
                }
            }
            if synced && condition(&objects.items) {
                return Ok(objects.sorted());
            }
            if ended {
                return Err(HarnessError::WatchEnded(what.to_string()));
            }
        }
    };
    match tokio::time::timeout(deadline, waiting).await {
        Ok(result) => result,
        Err(_) => Err(HarnessError::Timeout {
            what: what.to_string(),
            deadline,
            last: format!(
                "{} object(s): {:?}",
                objects.items.len(),
                objects.at.keys().collect::<BTreeSet<_>>()
            ),
        }),
    }
}

/// The objects a watch shows, kept contiguous so a condition reads them
/// in place.
struct Listed<K> {
    items: Vec<K>,
    /// Where each `(namespace, name)` sits in `items`.
    at: HashMap<(String, String), usize>,
}

impl<K> Default for Listed<K> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            at: HashMap::new(),
        }
    }
}

impl<K: Resource> Listed<K> {
    fn insert(&mut self, key: (String, String), object: K) {
        match self.at.get(&key) {
            Some(&i) => self.items[i] = object,
            None => {
                self.at.insert(key, self.items.len());
                self.items.push(object);
            }
        }
    }

    fn remove(&mut self, key: &(String, String)) {
        let Some(i) = self.at.remove(key) else {
            return;
        };
        self.items.swap_remove(i);
        if let Some(moved) = self.items.get(i) {
            let moved_key = (moved.namespace().unwrap_or_default(), moved.name_any());
            self.at.insert(moved_key, i);
        }
    }

    fn sorted(&self) -> Vec<K>
    where
        K: Clone,
    {
        let mut keys: Vec<(&(String, String), usize)> =
            self.at.iter().map(|(k, &i)| (k, i)).collect();
        keys.sort_unstable();
        keys.into_iter()
            .map(|(_, i)| self.items[i].clone())
            .collect()
    }
}

/// Waits until object `name` exists and satisfies `condition`.
pub async fn wait_for_object<K>(
    api: Api<K>,
    name: &str,
    deadline: Duration,
    condition: impl Fn(&K) -> bool,
) -> Result<K, HarnessError>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let params = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let list = wait_for_list(api, params, name, deadline, |objects| {
        objects.iter().any(|o| o.name_any() == name && condition(o))
    })
    .await?;
    list.into_iter()
        .find(|o| o.name_any() == name)
        .ok_or_else(|| HarnessError::WatchEnded(name.to_string()))
}

/// Waits until pod `namespace/name` satisfies `condition`.
pub async fn wait_for_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    deadline: Duration,
    condition: impl Fn(&Pod) -> bool,
) -> Result<Pod, HarnessError> {
    wait_for_object(
        Api::namespaced(client.clone(), namespace),
        name,
        deadline,
        condition,
    )
    .await
}

/// The node a pod is bound to, if any.
pub fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The pod's condition `type_` as `(status, reason, message)`.
pub fn pod_condition(pod: &Pod, type_: &str) -> Option<(String, String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// Waits until the events about pod `name` in `namespace` satisfy
/// `condition`; returns them sorted by event name.
pub async fn wait_for_pod_events(
    client: &Client,
    namespace: &str,
    name: &str,
    deadline: Duration,
    condition: impl Fn(&[Event]) -> bool,
) -> Result<Vec<Event>, HarnessError> {
    let params = watcher::Config::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    wait_for_list(
        Api::namespaced(client.clone(), namespace),
        params,
        &format!("events of pod {namespace}/{name}"),
        deadline,
        condition,
    )
    .await
}

/// Lists the events about pod `name` (no waiting).
pub async fn pod_events(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<Event>, HarnessError> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    Ok(api.list(&params).await?.items)
}

/// A Node named `name` whose `status.capacity` and `status.allocatable`
/// are `resources` (e.g. `{"cpu": "8", "memory": "16Gi", "pods": "110"}`),
/// labelled `kubernetes.io/hostname=<name>` as kubelet does.
pub fn node_with(name: &str, resources: serde_json::Value) -> k8s_openapi::api::core::v1::Node {
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": resources.clone(), "allocatable": resources},
    });
    serde_json::from_value(node).unwrap_or_default()
}

/// Creates `count` nodes `<prefix>-0` … with `resources` each; returns
/// their names.
pub async fn create_nodes(
    client: &Client,
    prefix: &str,
    count: usize,
    resources: serde_json::Value,
) -> Result<Vec<String>, HarnessError> {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let mut names = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        api.create(
            &kube::api::PostParams::default(),
            &node_with(&name, resources.clone()),
        )
        .await?;
        names.push(name);
    }
    Ok(names)
}

/// Waits until pod `namespace/name` is bound and returns its node.
pub async fn wait_for_scheduled(
    client: &Client,
    namespace: &str,
    name: &str,
    deadline: Duration,
) -> Result<String, HarnessError> {
    let pod = wait_for_pod(client, namespace, name, deadline, |p| {
        bound_node(p).is_some()
    })
    .await?;
    Ok(bound_node(&pod).unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn object(namespace: &str, name: &str, version: u32) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_listed_objects_follow_inserts_and_removes_as_a_sorted_map_does() {
        let mut listed: Listed<ConfigMap> = Listed::default();
        let mut reference: BTreeMap<(String, String), ConfigMap> = BTreeMap::new();
        let mut rng = scheduler_webhook::core::rng::SplitMix64::new(11);
        for version in 0..500u32 {
            let r = rng.next_u64() >> 33;
            let key = (format!("ns{}", r % 3), format!("o{}", (r >> 4) % 9));
            if (r >> 12).is_multiple_of(3) {
                listed.remove(&key);
                reference.remove(&key);
            } else {
                let o = object(&key.0, &key.1, version);
                listed.insert(key.clone(), o.clone());
                reference.insert(key, o);
            }
            assert_eq!(listed.items.len(), reference.len());
            assert_eq!(
                listed.sorted(),
                reference.values().cloned().collect::<Vec<_>>(),
                "after step {version}"
            );
        }
    }
}

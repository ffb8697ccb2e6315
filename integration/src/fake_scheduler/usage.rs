//! What each node already holds, kept as the pod watch changes it.
//!
//! kube-scheduler's cache keeps a `NodeInfo` per node and adds or removes
//! one pod's requests on each pod event; it never re-sums a node. The fake
//! did re-sum every node from every pod on each scheduling attempt, which
//! made a burst of N pods cost N² quantity parses (issue 16, item 2). The
//! book keeps each counted pod's node and requests, so an update or a
//! delete takes back exactly what was counted.
//!
//! Pure state; the loop in [`super::scheduler`] feeds it from the watch.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::fit::{self, NodeUsage, Resources};

/// The summed requests of the bound pods the watch shows, per node.
#[derive(Debug, Default)]
pub struct UsageBook {
    /// Each counted pod (by `namespace/name`): its node and requests.
    counted: HashMap<String, (String, Resources)>,
    by_node: HashMap<String, NodeUsage>,
}

impl UsageBook {
    /// Counts `pod` under `key` if it is bound to a node, and takes back
    /// what was counted for `key` before (an update, or the pod unbound).
    /// Requests that do not parse count as none, as before the book.
    pub fn apply(&mut self, key: &str, pod: &Pod) {
        self.remove(key);
        let Some(node) = bound_node(pod) else {
            return;
        };
        let requests = fit::pod_requests(pod).unwrap_or_default();
        self.by_node
            .entry(node.to_string())
            .or_default()
            .add(&requests);
        self.counted
            .insert(key.to_string(), (node.to_string(), requests));
    }

    /// Takes back what was counted for `key` (the pod was deleted or left
    /// the watch's selector).
    pub fn remove(&mut self, key: &str) {
        let Some((node, requests)) = self.counted.remove(key) else {
            return;
        };
        if let Some(usage) = self.by_node.get_mut(&node) {
            usage.take(&requests);
            if usage.pods == 0 {
                self.by_node.remove(&node);
            }
        }
    }

    /// Forgets everything and counts `pods` (after a relist).
    pub fn reset<'a>(&mut self, pods: impl IntoIterator<Item = (&'a String, &'a Pod)>) {
        self.counted.clear();
        self.by_node.clear();
        for (key, pod) in pods {
            self.apply(key, pod);
        }
    }

    /// What `node` holds (`None`: nothing counted there).
    pub fn node(&self, node: &str) -> Option<&NodeUsage> {
        self.by_node.get(node)
    }
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, cpu: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": {
                    "cpu": cpu, "nvidia.com/gpu": gpus.to_string()
                }}}]
            }
        }))
        .expect("test pod")
    }

    /// The usage summed from scratch, as the fake did on every attempt.
    fn recount(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, NodeUsage> {
        let mut usage: BTreeMap<String, NodeUsage> = BTreeMap::new();
        for pod in pods.values() {
            if let Some(node) = bound_node(pod) {
                let requests = fit::pod_requests(pod).unwrap_or_default();
                usage.entry(node.to_string()).or_default().add(&requests);
            }
        }
        usage
    }

    fn book_view(book: &UsageBook, nodes: &[&str]) -> BTreeMap<String, NodeUsage> {
        nodes
            .iter()
            .filter_map(|n| book.node(n).map(|u| (n.to_string(), u.clone())))
            .collect()
    }

    /// Zero-valued entries left by subtraction are not a difference.
    fn normalised(mut usage: BTreeMap<String, NodeUsage>) -> BTreeMap<String, NodeUsage> {
        for u in usage.values_mut() {
            u.requested.retain(|_, v| *v != 0);
        }
        usage
    }

    #[test]
    fn the_book_equals_a_recount_through_binds_updates_moves_and_deletes() {
        let nodes = ["n0", "n1", "n2"];
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut book = UsageBook::default();
        // A seeded walk of the events a pod watch delivers.
        let mut rng = scheduler_webhook::core::rng::SplitMix64::new(7);
        for step in 0..400u64 {
            let r = rng.next_u64() >> 33;
            let name = format!("p{}", r % 12);
            let key = format!("default/{name}");
            match r % 5 {
                0 => {
                    pods.remove(&key);
                    book.remove(&key);
                }
                _ => {
                    let node = match (r >> 8) % 4 {
                        3 => None,
                        i => Some(nodes[usize::try_from(i).expect("small")]),
                    };
                    let cpu = format!("{}m", 100 * ((r >> 12) % 5 + 1));
                    let p = pod(
                        &name,
                        node,
                        &cpu,
                        u32::try_from((r >> 16) % 3).expect("small"),
                    );
                    book.apply(&key, &p);
                    pods.insert(key, p);
                }
            }
            assert_eq!(
                normalised(book_view(&book, &nodes)),
                normalised(recount(&pods)),
                "after step {step}"
            );
        }
        let mut fresh = UsageBook::default();
        fresh.reset(&pods);
        assert_eq!(
            normalised(book_view(&fresh, &nodes)),
            normalised(recount(&pods))
        );
    }

    #[test]
    fn an_unbound_pod_counts_nowhere_and_a_reapplied_pod_counts_once() {
        let mut book = UsageBook::default();
        book.apply("default/a", &pod("a", None, "1", 1));
        assert!(book.node("n0").is_none());
        book.apply("default/a", &pod("a", Some("n0"), "1", 1));
        book.apply("default/a", &pod("a", Some("n0"), "1", 1));
        let usage = book.node("n0").expect("counted");
        assert_eq!(usage.pods, 1);
        assert_eq!(usage.requested.get("cpu"), Some(&1000));
        book.remove("default/a");
        assert!(book.node("n0").is_none());
    }
}

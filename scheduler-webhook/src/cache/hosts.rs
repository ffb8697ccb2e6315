//! The CPU and memory every assigned pod takes of its node, and the sums
//! per node.
//!
//! Owns: for each pod the watch shows on a node (`spec.nodeName` set, not
//! finished), the node and what it asks of it ([`HostResources`]), GPU pods
//! and others alike; and per node their sum. The extender's
//! [`crate::cache::model::ClusterModel`] copies a node's sum into the core
//! node whenever it changes, so `fgd` and `fgdpack` see how much CPU and
//! memory each node has left, as the simulator's nodes do.
//!
//! A pod counts here only once the API server shows it bound: a pod a
//! filter reserved and whose bind is in flight holds its GPU slices in the
//! ledger but not yet its CPU and memory here (kube-scheduler counts it
//! meanwhile as "assumed", so nothing is over-committed; the scores see
//! that node's CPU a bind later).

use std::collections::HashMap;

use crate::core::reservation::HostResources;

/// Pods on nodes and the CPU and memory they take.
#[derive(Debug, Default)]
pub struct HostBook {
    /// Per pod UID: its node and what it asks.
    pods: HashMap<String, (String, HostResources)>,
    /// Per node: the sum over its pods.
    nodes: HashMap<String, HostResources>,
}

/// The nodes whose sum a change moved (at most the old and the new node).
pub type Moved = Vec<String>;

impl HostBook {
    /// An empty book.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The pod `uid` is on `node` asking `host` (it replaces what the pod
    /// held before, on whatever node). Returns the nodes whose sum changed.
    pub fn assign(&mut self, uid: &str, node: &str, host: HostResources) -> Moved {
        if let Some((old_node, old)) = self.pods.get(uid)
            && old_node == node
            && *old == host
        {
            return Vec::new();
        }
        let mut moved = self.remove(uid);
        self.pods.insert(uid.to_owned(), (node.to_owned(), host));
        let sum = self.nodes.entry(node.to_owned()).or_default();
        sum.cpu_milli = sum.cpu_milli.saturating_add(host.cpu_milli);
        sum.memory_mib = sum.memory_mib.saturating_add(host.memory_mib);
        if !moved.iter().any(|n| n == node) {
            moved.push(node.to_owned());
        }
        moved
    }

    /// The pod `uid` left its node (deleted, finished, or never was on one).
    /// Returns the node whose sum changed, if any.
    pub fn remove(&mut self, uid: &str) -> Moved {
        let Some((node, host)) = self.pods.remove(uid) else {
            return Vec::new();
        };
        if let Some(sum) = self.nodes.get_mut(&node) {
            sum.cpu_milli = sum.cpu_milli.saturating_sub(host.cpu_milli);
            sum.memory_mib = sum.memory_mib.saturating_sub(host.memory_mib);
            if *sum == HostResources::default() {
                // A node whose pods ask nothing has no entry, as one without pods.
                self.nodes.remove(&node);
            }
        }
        vec![node]
    }

    /// What the pods on `node` take.
    #[must_use]
    pub fn used(&self, node: &str) -> HostResources {
        self.nodes.get(node).copied().unwrap_or_default()
    }

    /// The UIDs of the pods counted.
    pub fn uids(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    /// Checks every node's sum against its pods.
    ///
    /// # Errors
    /// The first node whose sum differs, with both values.
    pub fn check(&self) -> Result<(), String> {
        let mut sums: HashMap<&str, HostResources> = HashMap::new();
        for (node, host) in self.pods.values() {
            let sum = sums.entry(node.as_str()).or_default();
            sum.cpu_milli += host.cpu_milli;
            sum.memory_mib += host.memory_mib;
        }
        for (node, kept) in &self.nodes {
            let want = sums.get(node.as_str()).copied().unwrap_or_default();
            if *kept != want {
                return Err(format!(
                    "host use of {node}: kept {kept:?}, pods sum to {want:?}"
                ));
            }
        }
        for (node, want) in sums {
            if want != HostResources::default() && self.used(node) != want {
                return Err(format!(
                    "host use of {node}: not kept, pods sum to {want:?}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: HostResources = HostResources {
        cpu_milli: 1500,
        memory_mib: 2048,
    };
    const B: HostResources = HostResources {
        cpu_milli: 250,
        memory_mib: 64,
    };

    #[test]
    fn sums_follow_assign_move_resize_and_remove() {
        let mut book = HostBook::new();
        assert_eq!(book.assign("p", "n1", A), vec!["n1"]);
        assert_eq!(book.assign("q", "n1", B), vec!["n1"]);
        assert_eq!(
            book.used("n1"),
            HostResources {
                cpu_milli: 1750,
                memory_mib: 2112
            }
        );
        assert_eq!(
            book.assign("p", "n1", A),
            Vec::<String>::new(),
            "no change, no move"
        );
        assert_eq!(book.assign("p", "n2", A), vec!["n1", "n2"]);
        assert_eq!(book.used("n1"), B);
        assert_eq!(book.used("n2"), A);
        assert_eq!(book.assign("q", "n1", A), vec!["n1"], "a resize");
        assert_eq!(book.used("n1"), A);
        book.check().unwrap();
        assert_eq!(book.remove("p"), vec!["n2"]);
        assert_eq!(book.remove("p"), Vec::<String>::new());
        assert_eq!(book.used("n2"), HostResources::default());
        assert_eq!(book.uids().collect::<Vec<_>>(), vec!["q"]);
        book.check().unwrap();
    }
}

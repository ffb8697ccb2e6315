//! The CPU and memory every assigned pod takes of its node, and the sums
//! per node.
//!
//! Owns: for each pod on a node, the node and what it asks of it
//! ([`HostResources`]), GPU pods and others alike; and per node their sum.
//! A pod is on a node when the watch shows it there (`spec.nodeName` set,
//! not finished) or, for a GPU pod, from the filter that reserved that
//! node for it until its bind fails or it is filtered again (as
//! kube-scheduler counts an "assumed" pod). The extender's
//! [`crate::cache::model::ClusterModel`] copies a node's sum into the core
//! node whenever it changes, so `fgd` and `fgdpack` see how much CPU and
//! memory each node has left, as the simulator's nodes do.
//!
//! Small on purpose, since it holds every pod of the cluster: a pod is kept
//! as a 64-bit SipHash of its UID (two UIDs sharing a hash by chance, about
//! 1 in 2^64 per pair, would count as one pod), its node as an index into
//! the names seen, and its requests in 32 bits each (milli-cores and MiB,
//! saturating at about 4 million cores and 4 PiB): 24 bytes per pod.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::core::reservation::HostResources;

/// One pod's node and requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    node: u32,
    cpu_milli: u32,
    memory_mib: u32,
}

/// Pods on nodes and the CPU and memory they take.
#[derive(Debug, Default)]
pub struct HostBook {
    /// Per pod (its UID's hash): its node and what it asks.
    pods: HashMap<u64, Held>,
    /// Node names by index, as first seen.
    names: Vec<String>,
    /// Index of each node name.
    ids: HashMap<String, u32>,
    /// Per node index: the sum over its pods.
    sums: Vec<HostResources>,
}

/// The nodes whose sum a change moved.
pub type Moved = Vec<String>;

/// The key of a pod UID.
fn key(uid: &str) -> u64 {
    let mut h = DefaultHasher::new();
    uid.hash(&mut h);
    h.finish()
}

fn narrow(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl HostBook {
    /// An empty book.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn node_index(&mut self, node: &str) -> u32 {
        if let Some(&i) = self.ids.get(node) {
            return i;
        }
        let i = narrow(self.names.len() as u64);
        self.names.push(node.to_owned());
        self.ids.insert(node.to_owned(), i);
        self.sums.push(HostResources::default());
        i
    }

    /// Adds `held` to its node's sum.
    fn add(&mut self, held: Held) {
        if let Some(sum) = self.sums.get_mut(held.node as usize) {
            sum.cpu_milli = sum.cpu_milli.saturating_add(u64::from(held.cpu_milli));
            sum.memory_mib = sum.memory_mib.saturating_add(u64::from(held.memory_mib));
        }
    }

    /// Takes `held` off its node's sum.
    fn sub(&mut self, held: Held) {
        if let Some(sum) = self.sums.get_mut(held.node as usize) {
            sum.cpu_milli = sum.cpu_milli.saturating_sub(u64::from(held.cpu_milli));
            sum.memory_mib = sum.memory_mib.saturating_sub(u64::from(held.memory_mib));
        }
    }

    fn name(&self, node: u32) -> String {
        self.names.get(node as usize).cloned().unwrap_or_default()
    }

    /// The pod `uid` is on `node` asking `host` (it replaces what the pod
    /// held before, on whatever node). Returns the nodes whose sum changed.
    pub fn assign(&mut self, uid: &str, node: &str, host: HostResources) -> Moved {
        let held = Held {
            node: self.node_index(node),
            cpu_milli: narrow(host.cpu_milli),
            memory_mib: narrow(host.memory_mib),
        };
        let old = self.pods.insert(key(uid), held);
        if old == Some(held) {
            return Vec::new();
        }
        let mut moved = Vec::with_capacity(2);
        if let Some(old) = old {
            self.sub(old);
            if old.node != held.node {
                moved.push(self.name(old.node));
            }
        }
        self.add(held);
        moved.push(self.name(held.node));
        moved
    }

    /// The pod `uid` left its node (deleted, finished, or never was on one).
    /// Returns the node whose sum changed, if any.
    pub fn remove(&mut self, uid: &str) -> Moved {
        match self.pods.remove(&key(uid)) {
            Some(held) => {
                self.sub(held);
                vec![self.name(held.node)]
            }
            None => Vec::new(),
        }
    }

    /// Forgets every pod whose UID is not in `keep` (a relist ended);
    /// returns the nodes whose sum changed.
    pub fn retain<'a>(&mut self, keep: impl IntoIterator<Item = &'a str>) -> Moved {
        let keep: HashSet<u64> = keep.into_iter().map(key).collect();
        let gone: Vec<u64> = self
            .pods
            .keys()
            .filter(|k| !keep.contains(k))
            .copied()
            .collect();
        let mut moved: Vec<u32> = Vec::new();
        for k in gone {
            if let Some(held) = self.pods.remove(&k) {
                self.sub(held);
                if !moved.contains(&held.node) {
                    moved.push(held.node);
                }
            }
        }
        moved.into_iter().map(|n| self.name(n)).collect()
    }

    /// What the pods on `node` take.
    #[must_use]
    pub fn used(&self, node: &str) -> HostResources {
        self.ids
            .get(node)
            .and_then(|&i| self.sums.get(i as usize))
            .copied()
            .unwrap_or_default()
    }

    /// Checks every node's sum against its pods.
    ///
    /// # Errors
    /// The first node whose sum differs, with both values.
    pub fn check(&self) -> Result<(), String> {
        let mut sums = vec![HostResources::default(); self.sums.len()];
        for held in self.pods.values() {
            let sum = sums
                .get_mut(held.node as usize)
                .ok_or_else(|| format!("a pod on unknown node index {}", held.node))?;
            sum.cpu_milli += u64::from(held.cpu_milli);
            sum.memory_mib += u64::from(held.memory_mib);
        }
        for (i, (kept, want)) in self.sums.iter().zip(&sums).enumerate() {
            if kept != want {
                return Err(format!(
                    "host use of {}: kept {kept:?}, pods sum to {want:?}",
                    self.names[i]
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
    fn sums_follow_assign_move_resize_remove_and_relist() {
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
        book.check().unwrap();
        // A relist that delivers only r: q is gone.
        book.assign("r", "n2", B);
        assert_eq!(book.retain(["r"]), vec!["n1"]);
        assert_eq!(book.used("n1"), HostResources::default());
        assert_eq!(book.used("n2"), B);
        assert_eq!(book.used("never"), HostResources::default());
        book.check().unwrap();
    }

    #[test]
    fn absurd_requests_saturate_instead_of_wrapping() {
        let mut book = HostBook::new();
        let huge = HostResources {
            cpu_milli: u64::MAX,
            memory_mib: 1 << 40,
        };
        book.assign("p", "n", huge);
        assert_eq!(
            book.used("n"),
            HostResources {
                cpu_milli: u64::from(u32::MAX),
                memory_mib: u64::from(u32::MAX)
            }
        );
        book.check().unwrap();
    }
}

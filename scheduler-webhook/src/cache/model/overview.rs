//! What the dashboard (`crate::ui`) reads from the model besides the GPU
//! and slice snapshots: the pods whose last filter found no node, with
//! why, and the cluster's fragmentation.
//!
//! Pure functions over the model's parts; `ClusterModel::{pending,
//! fragmentation, refused}` call them. Owns nothing: each refusal lives in its pod's record ([`PodBook`]), and
//! the fragmentation is computed afresh from the workload and the ledger,
//! never through the lazily built index the `fgd` policy keeps, so reading
//! it changes nothing (binpack and spread still pay nothing for `fgd`).
//!
//! [`PodBook`]: crate::cache::pods::PodBook

use crate::cache::pods::{PodBook, Refusal};
use crate::core::fgd::{FgdIndex, node_idle_milli};
use crate::core::model::Cluster;

/// A pod that holds nothing and whose last filter found no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Why, summarized by reason.
    pub refusal: Refusal,
}

/// The cluster's fragmentation for the current workload (the FGD measure:
/// the idle GPU capacity the workload's typical shapes cannot use).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FragmentationSnapshot {
    /// Fragmented idle capacity, milli-GPU, summed over the nodes.
    pub milli: f64,
    /// Idle capacity, milli-GPU, summed over the nodes.
    pub idle_milli: u64,
    /// Per node with GPUs: its name and fragmented capacity, milli-GPU.
    pub nodes: Vec<(String, f64)>,
}

impl FragmentationSnapshot {
    /// The fragmented share of the idle capacity, 0 to 1 (0 when nothing is
    /// idle).
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // milli-GPU sums are far below 2^52
    pub fn ratio(&self) -> f64 {
        if self.idle_milli == 0 {
            0.0
        } else {
            (self.milli / self.idle_milli as f64).clamp(0.0, 1.0)
        }
    }
}

/// Pods that hold nothing and whose last filter found no node, the most
/// recently refused first.
#[must_use]
pub fn pending(pods: &PodBook) -> Vec<PendingPod> {
    let mut out: Vec<PendingPod> = pods
        .refused()
        .map(|(uid, record, refusal)| PendingPod {
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            uid: uid.to_owned(),
            refusal: refusal.clone(),
        })
        .collect();
    out.sort_by(|a, b| {
        b.refusal
            .at_filter
            .cmp(&a.refusal.at_filter)
            .then_with(|| a.uid.cmp(&b.uid))
    });
    out
}

/// The cluster's fragmentation for the workload `fgd` places for,
/// computed afresh (O(nodes × typical shapes)).
#[must_use]
pub fn fragmentation(cluster: &Cluster, pods: &PodBook) -> FragmentationSnapshot {
    let nodes = cluster.nodes();
    let idle_milli = nodes.iter().map(node_idle_milli).sum();
    let with_gpus = || nodes.iter().enumerate().filter(|(_, n)| !n.gpus.is_empty());
    if pods.workload().is_empty() {
        return FragmentationSnapshot {
            milli: 0.0,
            idle_milli,
            nodes: with_gpus().map(|(_, n)| (n.name.clone(), 0.0)).collect(),
        };
    }
    let index = FgdIndex::new(pods.workload(), cluster);
    FragmentationSnapshot {
        milli: index.cluster_fragmentation(),
        idle_milli,
        nodes: with_gpus()
            .map(|(id, n)| (n.name.clone(), index.node_fragmentation(id)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::cache::pods::Refusal;

    #[test]
    fn a_refusal_counts_each_node_once_per_reason_most_first() {
        let failed: BTreeMap<String, String> = [
            ("a", "1/4 CardInsufficientMemory, 3/4 CardTypeMismatch"),
            ("b", "4/4 CardInsufficientMemory"),
            ("c", "4/4 CardInsufficientMemory"),
            ("d", "node unregistered"),
        ]
        .into_iter()
        .map(|(n, w)| (n.to_owned(), w.to_owned()))
        .collect();
        let refusal = Refusal::of(&failed, 9);
        assert_eq!(refusal.nodes, 4);
        assert_eq!(
            refusal.to_string(),
            "3 nodes: CardInsufficientMemory; 1 node: CardTypeMismatch; 1 node: node unregistered"
        );
    }
}

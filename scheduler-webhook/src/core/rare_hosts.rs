//! The few nodes that alone can host a rare multi-GPU shape.
//!
//! FGD weighs each typical pod by its frequency and leaves the rarest
//! shapes out, so nothing keeps the few nodes that alone can take a rare
//! large pod. On openb's default trace, 5 of 8,152 pods ask 8 whole GPUs
//! with 120 cores; of the 617 nodes with 8 GPUs only the 39 of model G3
//! (128 cores) can host them. Other pods used those nodes up first, and on
//! seven of the ten published seeds one to four such pods failed before the
//! cluster was full, each leaving 8 GPUs of demand to pods that pack worse.
//!
//! A shape is *guarded* when it asks two or more whole GPUs and fewer than
//! half of the nodes with enough GPUs of a model it accepts could host it
//! even when empty, for want of CPU or memory. `fgdpack` then counts a
//! placement that takes away a node's ability to host a guarded shape as a
//! growth of [`crate::core::fgdpack::FgdPackParams::keep_hosts`]: other
//! pods go elsewhere while they can, and to those nodes last.
//!
//! The guarded shapes come from the workload and the nodes when the FGD
//! index is built ([`crate::core::fgd::FgdIndex::guarded_shapes`]), as the
//! pinned-model pressure does.

use crate::core::model::{Cluster, Node};

/// A multi-GPU shape few nodes can host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedShape {
    /// Whole GPUs it asks.
    pub gpus: u32,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Allowed GPU type substrings, lower case (empty: any).
    pub types: Vec<String>,
}

/// Whether a shape's GPU type allow-list (lower case; empty: any) admits
/// the GPU model `model` (lower case): the model names one of its entries.
pub(crate) fn admits(types: &[String], model: &str) -> bool {
    types.is_empty() || types.iter().any(|t| model.contains(t.as_str()))
}

/// The node's GPUs of a model the shape accepts.
fn admitted_gpus(node: &Node, shape: &GuardedShape) -> usize {
    node.gpus
        .iter()
        .filter(|g| admits(&shape.types, &g.device_type.to_ascii_lowercase()))
        .count()
}

/// Whether the node's capacity (untracked: unbounded) holds the shape's
/// CPU and memory.
fn capacity_holds(node: &Node, shape: &GuardedShape) -> bool {
    node.capacity
        .is_none_or(|c| c.cpu_milli >= shape.cpu_milli && c.memory_mib >= shape.memory_mib)
}

/// Of `candidates` (shapes of two or more whole GPUs), the ones that fewer
/// than half of the nodes with enough GPUs of an accepted model could host
/// even when empty, and at least one could; each once.
pub fn guarded_shapes(
    candidates: impl IntoIterator<Item = GuardedShape>,
    cluster: &Cluster,
) -> Vec<GuardedShape> {
    let mut guarded: Vec<GuardedShape> = Vec::new();
    for shape in candidates {
        if shape.gpus < 2 || guarded.contains(&shape) {
            continue;
        }
        let wanted = usize::try_from(shape.gpus).unwrap_or(usize::MAX);
        let (mut enough_gpus, mut hosts) = (0usize, 0usize);
        for node in cluster.nodes() {
            if admitted_gpus(node, &shape) >= wanted {
                enough_gpus += 1;
                if capacity_holds(node, &shape) {
                    hosts += 1;
                }
            }
        }
        if hosts > 0 && 2 * hosts < enough_gpus {
            guarded.push(shape);
        }
    }
    guarded
}

/// Whether `node`, with the GPUs at positions `taken` and `cpu_milli`,
/// `memory_mib` more in use, could still take a pod of `shape`: enough
/// empty healthy GPUs of an accepted model, and the CPU and memory.
fn hosts(node: &Node, shape: &GuardedShape, taken: &[usize], host: (u64, u64)) -> bool {
    if let Some((cpu, mem)) = node.free_cpu_memory()
        && (cpu < shape.cpu_milli.saturating_add(host.0)
            || mem < shape.memory_mib.saturating_add(host.1))
    {
        return false;
    }
    let empty = node
        .gpus
        .iter()
        .zip(&node.usage)
        .enumerate()
        .filter(|(i, (g, u))| {
            !taken.contains(i)
                && g.health
                && !g.cordoned
                && u.used == 0
                && u.usedcores == 0
                && u.usedmem == 0
                && admits(&shape.types, &g.device_type.to_ascii_lowercase())
        })
        .count();
    empty >= usize::try_from(shape.gpus).unwrap_or(usize::MAX)
}

/// Whether a pod that takes the GPUs at `taken` and `host` (milli-CPU, MiB)
/// on `node` leaves it unable to host a guarded shape it could host before.
#[must_use]
pub fn breaks_a_host(
    guarded: &[GuardedShape],
    node: &Node,
    taken: &[usize],
    host: (u64, u64),
) -> bool {
    guarded
        .iter()
        .any(|s| hosts(node, s, &[], (0, 0)) && !hosts(node, s, taken, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::NodeCapacity;
    use crate::core::model::testutil::mk_node;

    fn shape(gpus: u32, cores: u64) -> GuardedShape {
        GuardedShape {
            gpus,
            cpu_milli: cores * 1000,
            memory_mib: 0,
            types: vec![],
        }
    }

    fn cap(cores: u64) -> NodeCapacity {
        NodeCapacity {
            cpu_milli: cores * 1000,
            memory_mib: 1 << 20,
        }
    }

    /// One 128-core node among four 8-GPU nodes: an 8-GPU shape of 120
    /// cores is guarded, one of 88 cores (all can host it) is not, nor a
    /// shape no node can host or a one-GPU shape.
    fn cluster() -> Cluster {
        Cluster::new(vec![
            mk_node("rich", 8, 10, 1000).with_capacity(cap(128)),
            mk_node("a", 8, 10, 1000).with_capacity(cap(96)),
            mk_node("b", 8, 10, 1000).with_capacity(cap(96)),
            mk_node("c", 8, 10, 1000).with_capacity(cap(96)),
            mk_node("small", 2, 10, 1000).with_capacity(cap(256)),
        ])
    }

    #[test]
    fn a_shape_only_a_minority_of_nodes_can_host_is_guarded() {
        let c = cluster();
        let got = guarded_shapes(
            [
                shape(8, 120),
                shape(8, 88),
                shape(8, 200),
                shape(1, 120),
                shape(8, 120),
            ],
            &c,
        );
        assert_eq!(got, vec![shape(8, 120)]);
    }

    #[test]
    fn a_pod_breaks_a_host_by_a_gpu_or_by_cpu() {
        let c = cluster();
        let rich = c.node(0).unwrap();
        let guarded = [shape(8, 120)];
        // A GPU taken: 7 empty GPUs left.
        assert!(breaks_a_host(&guarded, rich, &[3], (1000, 0)));
        // No GPU, but 9 cores: 119 left.
        assert!(breaks_a_host(&guarded, rich, &[], (9000, 0)));
        // No GPU, 8 cores: 120 left, still a host.
        assert!(!breaks_a_host(&guarded, rich, &[], (8000, 0)));
        // A node that never was a host is not broken.
        assert!(!breaks_a_host(&guarded, c.node(1).unwrap(), &[0], (0, 0)));
    }
}

//! The dashboard's JSON, built from model snapshots by pure functions.
//!
//! - `GET /ui/api/cluster` ([`ClusterView`]): every GPU grouped by node
//!   (the heat map), the cluster's totals, the pending GPU pods with why,
//!   the fragmentation and its trend. Kept compact, so it stays under
//!   100 bytes a GPU at 1,000 nodes × 8 GPUs (tested below): a GPU is one
//!   array of the [`GPU_FIELDS`] the answer names, its type an index into
//!   the answer's `types`; slices are not listed.
//! - `GET /ui/api/nodes/{name}` ([`NodeView`]): one node's GPUs and the
//!   pods on it with their slices (what a click shows).

use std::collections::BTreeMap;

use serde::Serialize;

use super::trend::{Latest, Sample};
use crate::cache::model::{GpuSnapshot, PendingPod, SliceSnapshot};

/// `used` of `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Use<T> {
    /// In use (allocated or reserved).
    pub used: T,
    /// Capacity.
    pub total: T,
}

/// One GPU on the heat map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuView {
    /// GPU UUID.
    pub uuid: String,
    /// Index on the node.
    pub index: u32,
    /// GPU type.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Memory, MiB.
    pub mem: Use<u64>,
    /// Cores, percent of the card.
    pub cores: Use<u32>,
    /// Slices (split count).
    pub slots: Use<u32>,
}

/// What each element of a [`GpuRow`] is, in order (sent as `gpu_fields`).
pub const GPU_FIELDS: [&str; 9] = [
    "uuid",
    "index",
    "type",
    "mem_used",
    "mem_total",
    "cores_used",
    "cores_total",
    "slots_used",
    "slots_total",
];

/// One GPU on the heat map, as a JSON array of the [`GPU_FIELDS`]; `type`
/// is an index into [`ClusterView::types`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuRow(
    pub String,
    pub u32,
    pub usize,
    pub u64,
    pub u64,
    pub u32,
    pub u32,
    pub u32,
    pub u32,
);

/// One node, with its GPUs as `G` (rows on the heat map, objects in a
/// node's view).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeSummary<G> {
    /// Node name.
    pub name: String,
    /// Its fragmented idle capacity, milli-GPU (last sample; 0 before it).
    pub fragmentation_milli: f64,
    /// Its GPUs, by index.
    pub gpus: Vec<G>,
}

/// The cluster's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Totals {
    /// Nodes with GPUs.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// Memory, MiB.
    pub mem: Use<u64>,
    /// Cores, percent (100 per card).
    pub cores: Use<u64>,
    /// Slices.
    pub slots: Use<u64>,
    /// Pods holding slices (known from their annotations).
    pub pods: usize,
    /// Pending GPU pods (their last filter found no node).
    pub pending: usize,
}

impl<T: Default> Default for Use<T> {
    fn default() -> Self {
        Self {
            used: T::default(),
            total: T::default(),
        }
    }
}

/// One reason and how many candidate nodes gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    /// HAMi's reason (`CardInsufficientMemory`).
    pub reason: String,
    /// Nodes that gave it.
    pub nodes: usize,
}

/// A pending GPU pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Candidate nodes refused at its last filter.
    pub nodes: usize,
    /// Per reason, most first.
    pub reasons: Vec<ReasonCount>,
    /// `"3 nodes: CardInsufficientMemory; 1 node: …"`.
    pub summary: String,
}

/// The cluster's fragmentation (last sample).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct FragmentationView {
    /// Fragmented idle capacity, milli-GPU.
    pub milli: f64,
    /// Idle capacity, milli-GPU.
    pub idle_milli: u64,
    /// `milli / idle_milli`, 0 to 1.
    pub ratio: f64,
    /// When it was sampled, seconds since start (`None`: not yet).
    pub sampled_at: Option<f64>,
}

/// `GET /ui/api/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterView {
    /// Whether nodes, pods and quotas have been listed once.
    pub ready: bool,
    /// Totals.
    pub totals: Totals,
    /// What the elements of each GPU row are ([`GPU_FIELDS`]).
    pub gpu_fields: [&'static str; 9],
    /// GPU types, indexed by a row's `type`.
    pub types: Vec<String>,
    /// Nodes with GPUs, by name.
    pub nodes: Vec<NodeSummary<GpuRow>>,
    /// Pending GPU pods, the most recently refused first.
    pub pending: Vec<PendingView>,
    /// The fragmentation, last sample.
    pub fragmentation: FragmentationView,
    /// The fragmentation since start, oldest first.
    pub trend: Vec<Sample>,
}

/// One container's slice of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SliceView {
    /// GPU UUID.
    pub uuid: String,
    /// Container position (init containers first).
    pub container: usize,
    /// Memory, MiB.
    pub mem: u64,
    /// Cores, percent.
    pub cores: u32,
}

/// A pod on a node, with its slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its slices on this node.
    pub slices: Vec<SliceView>,
}

/// `GET /ui/api/nodes/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// The node and its GPUs.
    #[serde(flatten)]
    pub node: NodeSummary<GpuView>,
    /// Pods holding slices there, by namespace and name.
    pub pods: Vec<PodView>,
}

fn gpu_view(g: &GpuSnapshot) -> GpuView {
    GpuView {
        uuid: g.uuid.clone(),
        index: g.index,
        device_type: g.device_type.clone(),
        mem: Use {
            used: g.used_memory_mib,
            total: g.memory_mib,
        },
        cores: Use {
            used: g.used_cores,
            total: g.cores,
        },
        slots: Use {
            used: g.used_slots,
            total: g.slots,
        },
    }
}

/// Groups GPUs by node (nodes by name, GPUs by index), with each node's
/// fragmentation from the last sample; `view` turns a GPU into `G`.
fn nodes_of<'a, G>(
    gpus: &'a [GpuSnapshot],
    latest: &Latest,
    mut view: impl FnMut(&'a GpuSnapshot) -> G,
) -> Vec<NodeSummary<G>> {
    let frag: BTreeMap<&str, f64> = latest
        .snapshot
        .iter()
        .flat_map(|(_, s)| s.nodes.iter().map(|(n, f)| (n.as_str(), *f)))
        .collect();
    let mut by_node: BTreeMap<&str, Vec<&GpuSnapshot>> = BTreeMap::new();
    for g in gpus {
        by_node.entry(g.node.as_str()).or_default().push(g);
    }
    by_node
        .into_iter()
        .map(|(name, mut gpus)| {
            gpus.sort_by_key(|g| g.index);
            let gpus = gpus.into_iter().map(&mut view).collect();
            NodeSummary {
                name: name.to_owned(),
                fragmentation_milli: frag.get(name).copied().unwrap_or(0.0),
                gpus,
            }
        })
        .collect()
}

/// The `/ui/api/cluster` answer.
#[must_use]
pub fn cluster_view(
    ready: bool,
    gpus: &[GpuSnapshot],
    slices: &[SliceSnapshot],
    pending: &[PendingPod],
    latest: &Latest,
) -> ClusterView {
    let mut totals = Totals {
        gpus: gpus.len(),
        ..Totals::default()
    };
    for g in gpus {
        totals.mem.used += g.used_memory_mib;
        totals.mem.total += g.memory_mib;
        totals.cores.used += u64::from(g.used_cores);
        totals.cores.total += u64::from(g.cores);
        totals.slots.used += u64::from(g.used_slots);
        totals.slots.total += u64::from(g.slots);
    }
    let mut pods: Vec<(&str, &str)> = slices
        .iter()
        .map(|s| (s.namespace.as_str(), s.pod.as_str()))
        .collect();
    pods.sort_unstable();
    pods.dedup();
    totals.pods = pods.len();
    totals.pending = pending.len();
    let mut types: Vec<String> = Vec::new();
    let nodes = nodes_of(gpus, latest, |g| {
        let ty = match types.iter().position(|t| *t == g.device_type) {
            Some(i) => i,
            None => {
                types.push(g.device_type.clone());
                types.len() - 1
            }
        };
        GpuRow(
            g.uuid.clone(),
            g.index,
            ty,
            g.used_memory_mib,
            g.memory_mib,
            g.used_cores,
            g.cores,
            g.used_slots,
            g.slots,
        )
    });
    totals.nodes = nodes.len();
    ClusterView {
        ready,
        totals,
        gpu_fields: GPU_FIELDS,
        types,
        nodes,
        pending: pending
            .iter()
            .map(|p| PendingView {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                nodes: p.refusal.nodes,
                reasons: p
                    .refusal
                    .reasons
                    .iter()
                    .map(|(reason, nodes)| ReasonCount {
                        reason: reason.clone(),
                        nodes: *nodes,
                    })
                    .collect(),
                summary: p.refusal.to_string(),
            })
            .collect(),
        fragmentation: latest
            .snapshot
            .as_ref()
            .map(|(t, s)| FragmentationView {
                milli: s.milli,
                idle_milli: s.idle_milli,
                ratio: s.ratio(),
                sampled_at: Some(*t),
            })
            .unwrap_or_default(),
        trend: latest.trend.to_vec(),
    }
}

/// The `/ui/api/nodes/{name}` answer; `None` when no GPU is on `name`.
#[must_use]
pub fn node_view(
    name: &str,
    gpus: &[GpuSnapshot],
    slices: &[SliceSnapshot],
    latest: &Latest,
) -> Option<NodeView> {
    let mine: Vec<GpuSnapshot> = gpus.iter().filter(|g| g.node == name).cloned().collect();
    let node = nodes_of(&mine, latest, gpu_view).into_iter().next()?;
    let mut pods: BTreeMap<(&str, &str), Vec<SliceView>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.node == name) {
        pods.entry((s.namespace.as_str(), s.pod.as_str()))
            .or_default()
            .push(SliceView {
                uuid: s.uuid.clone(),
                container: s.container_index,
                mem: s.memory_mib,
                cores: s.cores,
            });
    }
    Some(NodeView {
        node,
        pods: pods
            .into_iter()
            .map(|((namespace, name), mut slices)| {
                slices.sort_by_key(|s| s.container);
                PodView {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    slices,
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::model::FragmentationSnapshot;
    use crate::cache::pods::Refusal;

    fn gpu(node: usize, index: u32, used: u64) -> GpuSnapshot {
        GpuSnapshot {
            node: format!("gpu-node-{node:04}"),
            uuid: format!("GPU-{node:08x}-0000-4000-8000-{index:012x}"),
            index,
            device_type: "NVIDIA A100-SXM4-40GB".to_owned(),
            memory_mib: 40960,
            cores: 100,
            slots: 10,
            used_slots: 3,
            used_memory_mib: used,
            used_cores: 30,
        }
    }

    fn slice(node: usize, index: u32, pod: &str) -> SliceSnapshot {
        SliceSnapshot {
            namespace: "team-a".to_owned(),
            pod: pod.to_owned(),
            node: format!("gpu-node-{node:04}"),
            container_index: 0,
            uuid: gpu(node, index, 0).uuid,
            memory_mib: 4000,
            cores: 10,
            mig: None,
        }
    }

    /// 1,000 nodes × 8 GPUs, three slices on every GPU, a pending pod and
    /// a trend of the largest size the sampler keeps.
    fn big() -> (
        Vec<GpuSnapshot>,
        Vec<SliceSnapshot>,
        Vec<PendingPod>,
        Latest,
    ) {
        let gpus: Vec<GpuSnapshot> = (0..1000)
            .flat_map(|n| (0..8).map(move |i| gpu(n, i, 12000)))
            .collect();
        let slices: Vec<SliceSnapshot> = (0..1000)
            .flat_map(|n| {
                (0..8)
                    .flat_map(move |i| (0..3).map(move |k| slice(n, i, &format!("p-{n}-{i}-{k}"))))
            })
            .collect();
        let failed = (0..1000)
            .map(|n| {
                (
                    format!("gpu-node-{n:04}"),
                    "8/8 CardInsufficientMemory".to_owned(),
                )
            })
            .collect();
        let pending = vec![PendingPod {
            namespace: "team-a".into(),
            name: "too-big".into(),
            uid: "u1".into(),
            refusal: Refusal::of(&failed, 1),
        }];
        let latest = Latest {
            snapshot: Some((
                5.0,
                Arc::new(FragmentationSnapshot {
                    milli: 1234.0,
                    idle_milli: 5_600_000,
                    nodes: (0..1000)
                        .map(|n| (format!("gpu-node-{n:04}"), 1.5))
                        .collect(),
                }),
            )),
            trend: (0..super::super::trend::CAPACITY)
                .map(|t| Sample {
                    t: t as f64 * 5.0,
                    ratio: 0.123_456,
                    milli: 1234.5,
                })
                .collect(),
        };
        (gpus, slices, pending, latest)
    }

    #[test]
    fn the_cluster_view_of_8000_gpus_groups_them_by_node_in_under_100_bytes_a_gpu() {
        let (gpus, slices, pending, latest) = big();
        let view = cluster_view(true, &gpus, &slices, &pending, &latest);
        let json = serde_json::to_string(&view).unwrap();
        assert!(
            json.len() < 800_000,
            "{} bytes for 8,000 GPUs ({} per GPU)",
            json.len(),
            json.len() / 8000
        );
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let nodes = value["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 1000);
        assert!(
            nodes
                .iter()
                .all(|n| n["gpus"].as_array().unwrap().len() == 8)
        );
        assert_eq!(nodes[0]["name"], "gpu-node-0000");
        let field = |name: &str| GPU_FIELDS.iter().position(|f| *f == name).unwrap();
        assert_eq!(value["gpu_fields"].as_array().unwrap().len(), 9);
        assert_eq!(nodes[0]["gpus"][7][field("index")], 7);
        assert_eq!(nodes[0]["gpus"][0][field("mem_used")], 12000);
        assert_eq!(nodes[0]["gpus"][0][field("mem_total")], 40960);
        assert_eq!(nodes[0]["gpus"][0][field("uuid")], gpus[0].uuid);
        assert_eq!(value["types"], serde_json::json!(["NVIDIA A100-SXM4-40GB"]));
        assert_eq!(nodes[0]["gpus"][0][field("type")], 0);
        assert_eq!(nodes[0]["fragmentation_milli"], 1.5);
        assert_eq!(value["totals"]["gpus"], 8000);
        assert_eq!(value["totals"]["nodes"], 1000);
        assert_eq!(value["totals"]["pods"], 24000);
        assert_eq!(value["totals"]["mem"]["used"], 8000 * 12000);
        assert_eq!(
            value["pending"][0]["summary"],
            "1000 nodes: CardInsufficientMemory"
        );
        assert_eq!(value["fragmentation"]["milli"], 1234.0);
        assert_eq!(value["trend"].as_array().unwrap().len(), 720);
    }

    #[test]
    fn a_node_view_lists_the_pods_on_that_node_only_with_their_slices() {
        let (gpus, slices, _, latest) = big();
        let view = node_view("gpu-node-0007", &gpus, &slices, &latest).unwrap();
        assert_eq!(view.node.gpus.len(), 8);
        assert_eq!(view.pods.len(), 24);
        assert!(view.pods.iter().all(|p| p.name.starts_with("p-7-")));
        assert_eq!(view.pods[0].slices.len(), 1);
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(
            json["name"], "gpu-node-0007",
            "the node's fields are flattened"
        );
        assert!(node_view("no-such-node", &gpus, &slices, &latest).is_none());
    }
}

//! The openb trace format (Alibaba `cluster-trace-gpu-v2023`) and how its
//! rows become scheduler inputs.
//!
//! Node rows (`sn, cpu_milli, memory_mib, gpu, model`) become nodes whose
//! GPUs are registered like a HAMi device plugin would: type
//! `NVIDIA-<model>`, `count` = the split count, 100 cores, and a memory size
//! per model ([`model_memory_mib`]). Pod rows (`name, cpu_milli, memory_mib,
//! num_gpu, gpu_milli, gpu_spec, …`) become HAMi requests: a fractional pod
//! (`num_gpu` 1, `gpu_milli` m < 1000) asks `gpucores` m/10 and
//! `gpumem-percentage` m/10 (rounded up), whole-GPU pods ask `num_gpu`
//! cards at 100 % memory and 100 cores (exclusive, as HAMi's webhook makes
//! them), and `gpu_spec` becomes a `use-gputype` allow-list. Columns are
//! found by header name, so shorter variants (multigpu50) parse too.

use proto::hami::register::NodeDevice;

use crate::core::fgd::{MILLI_PER_GPU, Shape};
use crate::core::model::{Node, NodeCapacity};
use crate::core::request::{Constraints, DeviceRequest, MemoryRequest, PodRequest};

/// Errors reading a trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The file has no header line.
    #[error("empty trace file")]
    Empty,
    /// A required column is missing from the header.
    #[error("missing column {0:?}")]
    MissingColumn(&'static str),
    /// A row has a value that is not a non-negative integer.
    #[error("line {line}: column {column:?}: {value:?} is not a non-negative integer")]
    BadNumber {
        /// 1-based line number.
        line: usize,
        /// Column name.
        column: &'static str,
        /// The text found.
        value: String,
    },
}

/// One node row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Node name.
    pub name: String,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub gpus: u32,
    /// GPU model (empty for CPU-only nodes).
    pub model: String,
}

/// One pod row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    /// Pod name.
    pub name: String,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub num_gpu: u32,
    /// Share of each GPU, milli (1000 for whole cards).
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    pub gpu_spec: Vec<String>,
}

impl PodRow {
    /// Whether the pod takes a fraction of one GPU.
    #[must_use]
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli > 0 && self.gpu_milli < MILLI_PER_GPU
    }

    /// GPU demand in milli-GPU: what the paper counts as arrived and, once
    /// placed, as allocated.
    #[must_use]
    pub fn gpu_demand_milli(&self) -> u64 {
        if self.is_fractional() {
            u64::from(self.gpu_milli)
        } else {
            u64::from(self.num_gpu) * u64::from(MILLI_PER_GPU)
        }
    }

    /// The HAMi request this pod makes (one app container).
    #[must_use]
    pub fn request(&self) -> PodRequest {
        let gpu = match self.num_gpu {
            0 => None,
            _ if self.is_fractional() => {
                let pct = self.gpu_milli.div_ceil(10);
                Some(DeviceRequest {
                    nums: 1,
                    memory: MemoryRequest::Percent(pct),
                    cores: pct,
                })
            }
            n => Some(DeviceRequest {
                nums: n,
                memory: MemoryRequest::Percent(100),
                cores: 100,
            }),
        };
        PodRequest {
            app: vec![gpu],
            constraints: Constraints {
                use_types: self
                    .gpu_spec
                    .iter()
                    .map(|m| m.to_ascii_lowercase())
                    .collect(),
                ..Constraints::default()
            },
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            ..PodRequest::default()
        }
    }

    /// The pod's shape for the fragmentation workload.
    #[must_use]
    pub fn shape(&self) -> Shape {
        Shape {
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            gpus: self.num_gpu,
            milli: if self.num_gpu == 0 {
                0
            } else if self.is_fractional() {
                self.gpu_milli
            } else {
                MILLI_PER_GPU
            },
            types: self
                .gpu_spec
                .iter()
                .map(|m| m.to_ascii_lowercase())
                .collect(),
        }
    }
}

/// Device memory given to each model, MiB. Public models get their real
/// size; the undisclosed G1–G3 get 32 GiB. Pods ask a percentage of the
/// card, so the size never changes a placement; it only fills HAMi's memory
/// bookkeeping.
#[must_use]
pub fn model_memory_mib(model: &str) -> u32 {
    match model {
        "T4" | "P100" | "V100M16" => 16_384,
        "A10" => 24_576,
        _ => 32_768,
    }
}

/// The node a row describes, registered with this split count.
#[must_use]
pub fn node_from_row(row: &NodeRow, split_count: u32) -> Node {
    let devices: Vec<NodeDevice> = (0..row.gpus)
        .map(|i| NodeDevice {
            id: format!("GPU-{}-{i}", row.name),
            index: i,
            count: split_count,
            devmem: model_memory_mib(&row.model),
            devcore: 100,
            device_type: format!("NVIDIA-{}", row.model),
            numa: 0,
            mode: "hami-core".to_owned(),
            health: true,
            mig_profiles: Vec::new(),
        })
        .collect();
    Node::from_register(&row.name, &devices).with_capacity(NodeCapacity {
        cpu_milli: row.cpu_milli,
        memory_mib: row.memory_mib,
    })
}

struct Table<'a> {
    header: Vec<&'a str>,
    rows: Vec<(usize, Vec<&'a str>)>,
}

fn split_csv(text: &str) -> Result<Table<'_>, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().ok_or(TraceError::Empty)?;
    let header = header.split(',').map(str::trim).collect();
    let rows = lines
        .map(|(n, l)| (n, l.split(',').map(str::trim).collect()))
        .collect();
    Ok(Table { header, rows })
}

impl Table<'_> {
    fn column(&self, name: &'static str) -> Result<usize, TraceError> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or(TraceError::MissingColumn(name))
    }
}

fn field<'a>(row: &[&'a str], col: Option<usize>) -> &'a str {
    col.and_then(|c| row.get(c)).copied().unwrap_or("")
}

fn number<T: std::str::FromStr>(
    line: usize,
    column: &'static str,
    value: &str,
) -> Result<T, TraceError> {
    value.parse::<T>().map_err(|_| TraceError::BadNumber {
        line,
        column,
        value: value.to_owned(),
    })
}

/// Parses a node list.
///
/// # Errors
/// Missing columns or bad numbers.
pub fn parse_nodes(text: &str) -> Result<Vec<NodeRow>, TraceError> {
    let t = split_csv(text)?;
    let (sn, cpu, mem, gpu, model) = (
        t.column("sn")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("gpu")?,
        t.column("model").ok(),
    );
    t.rows
        .iter()
        .map(|(line, r)| {
            Ok(NodeRow {
                name: field(r, Some(sn)).to_owned(),
                cpu_milli: number(*line, "cpu_milli", field(r, Some(cpu)))?,
                memory_mib: number(*line, "memory_mib", field(r, Some(mem)))?,
                gpus: number(*line, "gpu", field(r, Some(gpu)))?,
                model: field(r, model).to_owned(),
            })
        })
        .collect()
}

/// Parses a pod list.
///
/// # Errors
/// Missing columns or bad numbers.
pub fn parse_pods(text: &str) -> Result<Vec<PodRow>, TraceError> {
    let t = split_csv(text)?;
    let (name, cpu, mem, num, milli, spec) = (
        t.column("name")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("num_gpu")?,
        t.column("gpu_milli")?,
        t.column("gpu_spec").ok(),
    );
    t.rows
        .iter()
        .map(|(line, r)| {
            Ok(PodRow {
                name: field(r, Some(name)).to_owned(),
                cpu_milli: number(*line, "cpu_milli", field(r, Some(cpu)))?,
                memory_mib: number(*line, "memory_mib", field(r, Some(mem)))?,
                num_gpu: number(*line, "num_gpu", field(r, Some(num)))?,
                gpu_milli: number(*line, "gpu_milli", field(r, Some(milli)))?,
                gpu_spec: field(r, spec)
                    .split('|')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_and_pods_by_header() {
        let nodes = parse_nodes(
            "sn,cpu_milli,memory_mib,gpu,model\r\nn0,64000,262144,2,P100\n\nn1,32000,1024,0,\n",
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].model, "P100");
        assert_eq!(nodes[1].gpus, 0);
        let pods = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,10,1,460,T4|P100\np1,1000,10,2,1000,\n").unwrap();
        assert_eq!(pods[0].gpu_spec, vec!["T4", "P100"]);
        assert!(pods[0].is_fractional());
        assert_eq!(pods[1].gpu_demand_milli(), 2000);
        // multigpu50 has no gpu_spec column.
        let short =
            parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\n").unwrap();
        assert!(short[0].gpu_spec.is_empty());
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(parse_nodes(""), Err(TraceError::Empty));
        assert_eq!(
            parse_nodes("sn,cpu_milli\n"),
            Err(TraceError::MissingColumn("memory_mib"))
        );
        let err =
            parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,-1,0\n").unwrap_err();
        assert!(
            matches!(
                err,
                TraceError::BadNumber {
                    line: 2,
                    column: "num_gpu",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rows_map_to_hami_requests() {
        let p = |num_gpu, gpu_milli| PodRow {
            name: "p".into(),
            cpu_milli: 1,
            memory_mib: 2,
            num_gpu,
            gpu_milli,
            gpu_spec: vec!["T4".into()],
        };
        let frac = p(1, 465).request();
        assert_eq!(
            frac.app[0],
            Some(DeviceRequest {
                nums: 1,
                memory: MemoryRequest::Percent(47),
                cores: 47
            })
        );
        assert_eq!(frac.constraints.use_types, vec!["t4"]);
        let whole = p(4, 1000).request();
        assert_eq!(
            whole.app[0],
            Some(DeviceRequest {
                nums: 4,
                memory: MemoryRequest::Percent(100),
                cores: 100
            })
        );
        assert_eq!(p(0, 0).request().app[0], None);
        assert_eq!(p(1, 1000).shape().milli, 1000);
        assert_eq!(p(0, 0).shape().milli, 0);
    }

    #[test]
    fn node_rows_register_like_a_device_plugin() {
        let row = NodeRow {
            name: "n".into(),
            cpu_milli: 1,
            memory_mib: 2,
            gpus: 2,
            model: "T4".into(),
        };
        let n = node_from_row(&row, 100);
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(&*n.gpus[1].device_type, "NVIDIA-T4");
        assert_eq!(n.gpus[1].count, 100);
        assert_eq!(n.gpus[1].devmem, 16_384);
        assert_eq!(
            n.capacity,
            Some(NodeCapacity {
                cpu_milli: 1,
                memory_mib: 2
            })
        );
    }
}

//! One filter decision for a 1-GPU slice pod (3000 MiB, 30 % cores) over
//! 1,500 / 5,000 / 10,000 nodes × 8 GPUs at about 60 % usage, with HAMi's
//! default policies (node binpack, GPU spread) and with FGD.
//!
//! Run: `cargo bench -p scheduler-webhook --bench filter`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use proto::hami::register::NodeDevice;
use scheduler_webhook::core::fgd::{FgdIndex, Shape, ShapeDistribution};
use scheduler_webhook::core::model::{Cluster, GpuUse, Node};
use scheduler_webhook::core::policy::{Policy, SchedulerConfig, schedule};
use scheduler_webhook::core::request::{DeviceRequest, MemoryRequest, PodRequest};
use scheduler_webhook::core::rng::SplitMix64;

const GPUS_PER_NODE: u32 = 8;
const SPLIT: u32 = 10;
const DEVMEM: u32 = 32_768;

/// `nodes` nodes of 8 GPUs; each GPU's cores and memory are used to a
/// random tenth between 0 and 100 % (mean ~60 %: 0–12 tenths clamped), with
/// one slot per 10 % used.
fn cluster(nodes: usize, seed: u64) -> Cluster {
    let mut rng = SplitMix64::new(seed);
    let mut all = Vec::with_capacity(nodes);
    for n in 0..nodes {
        let name = format!("node-{n}");
        let devices: Vec<NodeDevice> = (0..GPUS_PER_NODE)
            .map(|i| NodeDevice {
                id: format!("GPU-{n}-{i}"),
                index: i,
                count: SPLIT,
                devmem: DEVMEM,
                devcore: 100,
                device_type: "NVIDIA A100-SXM4-40GB".to_owned(),
                numa: i / 4,
                mode: "hami-core".to_owned(),
                health: true,
                mig_profiles: Vec::new(),
            })
            .collect();
        let mut node = Node::from_register(&name, &devices);
        for u in &mut node.usage {
            let tenths = u32::try_from(rng.below(13)).unwrap_or(0).min(10);
            *u = GpuUse {
                used: tenths.min(SPLIT),
                usedmem: u64::from(DEVMEM) * u64::from(tenths) / 10,
                usedcores: tenths * 10,
            };
        }
        all.push(node);
    }
    Cluster::new(all)
}

fn pod() -> PodRequest {
    PodRequest {
        app: vec![Some(DeviceRequest {
            nums: 1,
            memory: MemoryRequest::Mib(3000),
            cores: 30,
        })],
        ..PodRequest::default()
    }
}

fn filter(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter_1gpu_slice");
    group.sample_size(30);
    let req = pod();
    let mut dist = ShapeDistribution::default();
    for (milli, n) in [(300, 5), (500, 3), (1000, 2)] {
        for _ in 0..n {
            dist.observe(Shape {
                cpu_milli: 0,
                memory_mib: 0,
                gpus: 1,
                milli,
                types: vec![],
            });
        }
    }
    for nodes in [1_500usize, 5_000, 10_000] {
        let cl = cluster(nodes, 7);
        let binpack = SchedulerConfig::default();
        group.bench_with_input(BenchmarkId::new("hami_default", nodes), &nodes, |b, &n| {
            let mut rng = SplitMix64::new(1);
            b.iter(|| black_box(schedule(&cl, &req, 0..n, &binpack, None, &mut rng).is_ok()));
        });
        let index = FgdIndex::new(&dist, &cl);
        let fgd = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        group.bench_with_input(BenchmarkId::new("fgd", nodes), &nodes, |b, &n| {
            let mut rng = SplitMix64::new(1);
            b.iter(|| black_box(schedule(&cl, &req, 0..n, &fgd, Some(&index), &mut rng).is_ok()));
        });
    }
    group.finish();
}

criterion_group!(benches, filter);
criterion_main!(benches);

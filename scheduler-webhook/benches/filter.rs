//! One filter decision for a 1-GPU slice pod (3000 MiB, 30 % cores) over
//! 1,500 / 5,000 / 10,000 nodes × 8 GPUs at about 60 % usage, with HAMi's
//! default policies (node binpack, GPU spread) and with FGD.
//!
//! FGD is measured twice:
//! - `fgd`: the decision cycle the service runs for consecutive pods of one
//!   request. Each iteration decides, reserves the pod on the chosen node
//!   and releases it again (so the cluster stays as generated), refreshing
//!   that node in the index: the next decision finds every other node's
//!   outcome remembered and evaluates the changed node only.
//! - `fgd_cold`: every node evaluated (the index's remembered outcomes are
//!   dropped first), as for the first pod of a request not seen among the
//!   last few.
//!
//! `fgdpack` (FGD with a packing tie break, `core::fgdpack`) is measured at
//! 5,000 nodes only, with the `fgd` decision cycle; `fgdpack_host` the same
//! with the nodes' CPU and memory tracked, as the service tracks them
//! (128 cores, 1 TiB, a random 0–100 % of the CPU and memory in use) and
//! shapes and pod asking CPU (4, 8 and 16 cores for 300, 500 and 1000
//! milli-GPU; the pod 4), so the stranded-capacity term is at work;
//! `fgdpack_guarded` the same with every eighth node at 192 cores and a
//! rare 8-GPU shape of 160 cores in the workload that only they can host,
//! so each evaluation also checks whether the pod breaks such a host.
//!
//! Run: `cargo bench -p scheduler-webhook --bench filter`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use proto::hami::register::NodeDevice;
use scheduler_webhook::core::fgd::{FgdIndex, Shape, ShapeDistribution};
use scheduler_webhook::core::model::{Cluster, GpuUse, Node, NodeCapacity};
use scheduler_webhook::core::policy::{Policy, SchedulerConfig, schedule};
use scheduler_webhook::core::request::{DeviceRequest, MemoryRequest, PodRequest};
use scheduler_webhook::core::reservation::HostResources;
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

/// `cl` with each node's CPU and memory tracked: 128 cores and 1 TiB, a
/// random 0–100 % of it in use.
fn with_host(cl: &Cluster, seed: u64) -> Cluster {
    let mut rng = SplitMix64::new(seed);
    let nodes = cl
        .nodes()
        .iter()
        .map(|n| {
            let mut n = n.clone().with_capacity(NodeCapacity {
                cpu_milli: 128_000,
                memory_mib: 1 << 20,
            });
            let share = u64::try_from(rng.below(101)).unwrap_or(0);
            n.used_cpu_milli = 128_000 * share / 100;
            n.used_memory_mib = (1 << 20) * share / 100;
            n
        })
        .collect();
    Cluster::new(nodes)
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
        let fgd = SchedulerConfig {
            node_policy: Policy::Fgd,
            ..SchedulerConfig::default()
        };
        let mut live = cl.clone();
        let mut index = FgdIndex::new(&dist, &live);
        group.bench_with_input(BenchmarkId::new("fgd", nodes), &nodes, |b, &n| {
            let mut rng = SplitMix64::new(1);
            b.iter(|| decide_and_undo(&mut live, &req, n, &fgd, &mut index, &mut rng));
        });
        group.bench_with_input(BenchmarkId::new("fgd_cold", nodes), &nodes, |b, &n| {
            let mut rng = SplitMix64::new(1);
            b.iter(|| {
                index.forget_outcomes();
                black_box(schedule(&live, &req, 0..n, &fgd, Some(&mut index), &mut rng).is_ok())
            });
        });
        if nodes == 5_000 {
            let pack = SchedulerConfig {
                node_policy: Policy::FgdPack,
                ..SchedulerConfig::default()
            };
            group.bench_with_input(BenchmarkId::new("fgdpack", nodes), &nodes, |b, &n| {
                let mut rng = SplitMix64::new(1);
                b.iter(|| decide_and_undo(&mut live, &req, n, &pack, &mut index, &mut rng));
            });
            let mut host_dist = ShapeDistribution::default();
            for (milli, cores, n) in [(300, 4, 5), (500, 8, 3), (1000, 16, 2)] {
                for _ in 0..n {
                    host_dist.observe(Shape {
                        cpu_milli: cores * 1000,
                        memory_mib: cores * 8192,
                        gpus: 1,
                        milli,
                        types: vec![],
                    });
                }
            }
            let host_req = PodRequest {
                cpu_milli: 4000,
                memory_mib: 32_768,
                ..pod()
            };
            let mut hosted = with_host(&cl, 11);
            let mut host_index = FgdIndex::new(&host_dist, &hosted);
            group.bench_with_input(BenchmarkId::new("fgdpack_host", nodes), &nodes, |b, &n| {
                let mut rng = SplitMix64::new(1);
                b.iter(|| {
                    decide_and_undo(&mut hosted, &host_req, n, &pack, &mut host_index, &mut rng)
                });
            });
            // Every eighth node 192 cores, and a rare 8-GPU shape of 160
            // cores only they can host: guarded, so each evaluation also
            // asks whether the pod breaks such a host.
            let mut guarded = Cluster::new(
                with_host(&cl, 11)
                    .nodes()
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let mut n = n.clone();
                        if i % 8 == 0 {
                            n = n.with_capacity(NodeCapacity {
                                cpu_milli: 192_000,
                                memory_mib: 1 << 20,
                            });
                        }
                        n
                    })
                    .collect(),
            );
            let mut guarded_dist = host_dist.clone();
            guarded_dist.observe(Shape {
                cpu_milli: 160_000,
                memory_mib: 0,
                gpus: GPUS_PER_NODE,
                milli: 1000,
                types: vec![],
            });
            let mut guarded_index = FgdIndex::new(&guarded_dist, &guarded);
            assert_eq!(guarded_index.guarded_shapes().len(), 1);
            group.bench_with_input(
                BenchmarkId::new("fgdpack_guarded", nodes),
                &nodes,
                |b, &n| {
                    let mut rng = SplitMix64::new(1);
                    b.iter(|| {
                        decide_and_undo(
                            &mut guarded,
                            &host_req,
                            n,
                            &pack,
                            &mut guarded_index,
                            &mut rng,
                        )
                    });
                },
            );
        }
    }
    group.finish();
}

/// One `fgdpack` decision over the first `n` nodes, the pod reserved on
/// the chosen node and released again (the index refreshed both times), as
/// the `fgd` cycle does; whether a node fit.
fn decide_and_undo(
    cluster: &mut Cluster,
    req: &PodRequest,
    n: usize,
    cfg: &SchedulerConfig,
    index: &mut FgdIndex,
    rng: &mut SplitMix64,
) -> bool {
    let placed = schedule(cluster, req, 0..n, cfg, Some(index), rng);
    if let Ok(d) = &placed
        && let Some(node) = cluster.node(d.node)
    {
        let devices = d.pod_devices(node);
        let host = HostResources {
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
        };
        if cluster.reserve("bench", d.node, &devices, 0, host).is_ok() {
            index.refresh_node(cluster, d.node);
            cluster.release("bench");
            index.refresh_node(cluster, d.node);
        }
    }
    black_box(placed.is_ok())
}

criterion_group!(benches, filter);
criterion_main!(benches);

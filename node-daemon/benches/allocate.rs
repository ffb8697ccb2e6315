//! Allocate latency and resident memory of the daemon with 8 GPUs × 10
//! slices: the real `run` (actors, tonic on a unix socket, registration with
//! a stand-in kubelet) against the in-memory cluster, driven like kubelet
//! drives it — one Allocate at a time, one pod each, about 70 live pods on
//! the node (older pods are deleted so the ledgers stay below capacity).
//!
//! Run: `cargo bench -p node-daemon --bench allocate` (prints p50/p99; the
//! RSS is the whole bench process — daemon plus client — so an upper bound).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_daemon::cluster::memory::MemoryCluster;
use node_daemon::daemon::{Daemon, run};
use node_daemon::devices::DeviceSource as _;
use node_daemon::devices::simulated::SimulatedDevices;
use node_daemon::settings::{DeviceSourceKind, Settings};
use node_daemon::testkit::{bound_pod, plugin_client, start_kubelet};
use proto::deviceplugin::v1beta1 as api;

const NODE: &str = "bench-node";
const GPUS: u32 = 8;
const SPLIT: u32 = 10;
const WARMUP: usize = 200;
const MEASURED: usize = 5_000;
const LIVE_PODS: usize = 70;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut registrations = start_kubelet(dir.path())?;
    let settings = Settings {
        node_name: Some(NODE.into()),
        device_plugin_dir: dir.path().to_owned(),
        device_source: DeviceSourceKind::Simulated,
        simulated_gpus: GPUS,
        device_split_count: SPLIT,
        hook_path: dir.path().join("hook"),
        metrics_bind_address: None,
        ..Settings::default()
    };
    let devices = SimulatedDevices::from_settings(&settings, NODE);
    let uuids: Vec<String> = devices.discover()?.into_iter().map(|g| g.uuid).collect();
    let cluster = MemoryCluster::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = Daemon {
        settings,
        devices: Arc::new(devices),
        cluster: Arc::new(cluster.clone()),
    };
    let done = actix::spawn(run(daemon, async {
        let _ = stopped.await;
    }));
    registrations.recv().await.ok_or("no registration")?;
    let rss_idle = status_kib("VmRSS:");
    let mut client = plugin_client(&dir.path().join("nvidia-gpu.sock")).await?;

    let mut live = VecDeque::new();
    let mut latencies = Vec::with_capacity(MEASURED);
    for i in 0..WARMUP + MEASURED {
        let gpu = &uuids[i % uuids.len()];
        let pod = bound_pod(
            NODE,
            "bench",
            &format!("p{i}"),
            &["app"],
            &format!("{gpu},NVIDIA,400,5:;"),
        );
        live.push_back(pod.uid.clone());
        cluster.put_pod(NODE, pod);
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![format!("{gpu}-{}", i % SPLIT as usize)],
            }],
        };
        let start = Instant::now();
        client.allocate(request).await?;
        if i >= WARMUP {
            latencies.push(start.elapsed());
        }
        while live.len() > LIVE_PODS {
            if let Some(uid) = live.pop_front() {
                cluster.delete_pod(&uid);
            }
        }
    }
    let rss_after = status_kib("VmRSS:");
    let hwm = status_kib("VmHWM:");
    let _ = stop.send(());
    done.await??;

    latencies.sort_unstable();
    let total: Duration = latencies.iter().sum();
    println!(
        "node-daemon Allocate benchmark: {GPUS} GPUs x {SPLIT} slices, {MEASURED} Allocates (after {WARMUP} warm-up), ~{LIVE_PODS} live pods"
    );
    println!(
        "latency: p50 {:?}  p99 {:?}  max {:?}  mean {:?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        total / u32::try_from(latencies.len())?,
    );
    println!(
        "process RSS (daemon + bench client): idle {:.1} MiB, after {:.1} MiB, peak {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(()); // `cargo test --benches` asks for the list of benchmarks
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    actix::System::with_tokio_rt(move || runtime).block_on(bench())
}

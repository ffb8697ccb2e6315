//! `/metrics` (Prometheus text) and `/healthz`, served by actix-web.
//!
//! Metrics are rendered at scrape time from read models, never kept in a
//! second copy: the inventory (capacity, health), each GPU actor's ledger
//! (asked with `GetLedger`), the pod names the allocator last saw, and what
//! [`crate::usage`] reads at that moment (HAMi-core's per-container files,
//! the device source's host readings) on a blocking thread.
//! Names are HAMi's where one exists (its scheduler's `hami_gpu_*` and
//! per-container `hami_vgpu_*_allocated_*`; its node monitor's
//! `hami_vgpu_memory_used_bytes`, `hami_container_*`, `hami_host_gpu_*`), so
//! HAMi dashboards read them; the rest are `gpuslice_*`. The only state kept
//! across scrapes is the counter of files that could not be read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use actix_web::{App, HttpResponse, HttpServer, web};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::warn;

use crate::actors::health::Inventory;
use crate::actors::pool::GpuPool;
use crate::devices::DeviceSource;
use crate::ledger::SliceLedger;
use crate::usage::Observed;

pub use crate::cluster::PodNames;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    device_uuid: String,
    device_index: String,
    device_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    namespace: String,
    node: String,
    pod: String,
    container_index: String,
    device_uuid: String,
}

/// HAMi's node-monitor labels of a container's device.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VdeviceLabels {
    namespace: String,
    pod: String,
    container: String,
    vdevice_index: String,
    device_uuid: String,
}

/// HAMi's node-monitor labels of
/// `hami_host_gpu_memory_controller_utilization_ratio` (no `node`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostGpuLabels {
    device_index: String,
    device_uuid: String,
    device_type: String,
}

/// Labels of the unreadable-file counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    reason: String,
}

/// HAMi-core files skipped, by reason; kept across scrapes.
pub type CacheErrors = Family<ReasonLabels, Counter>;

/// Counts and logs every file `observed` skipped.
pub fn count_unreadable(observed: &Observed, errors: &CacheErrors) {
    for (path, reason) in &observed.scan.unreadable {
        warn!(file = %path.display(), %reason, "HAMi-core shared region skipped");
        errors
            .get_or_create(&ReasonLabels {
                reason: reason.kind().to_owned(),
            })
            .inc();
    }
}

type F64Gauge = Gauge<f64, AtomicU64>;

fn family<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, F64Gauge>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, F64Gauge>::default();
    registry.register(name, help, f.clone());
    f
}

/// The Prometheus text for one node's GPUs, their ledgers, and what
/// containers and GPUs were `observed` using.
///
/// # Errors
/// Only a formatting error of the encoder.
#[allow(
    clippy::cast_precision_loss,
    reason = "MiB and counts are far below 2^52"
)]
pub fn render(
    node: &str,
    gpus: &Inventory,
    ledgers: &BTreeMap<String, SliceLedger>,
    names: &PodNames,
    observed: &Observed,
    errors: &CacheErrors,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let mem_limit = family(
        &mut registry,
        "hami_gpu_memory_limit_bytes",
        "Device memory of the GPU",
    );
    let core_limit = family(
        &mut registry,
        "hami_gpu_core_limit_ratio",
        "Compute of the GPU (1 = one card)",
    );
    let mem_alloc = family(
        &mut registry,
        "hami_gpu_memory_allocated_bytes",
        "Device memory handed out",
    );
    let core_alloc = family(
        &mut registry,
        "hami_gpu_core_allocated_ratio",
        "Compute handed out (1 = one card)",
    );
    let shared = family(
        &mut registry,
        "hami_gpu_shared_count",
        "Containers sharing the GPU",
    );
    let slots = family(
        &mut registry,
        "gpuslice_gpu_slots",
        "Split count: containers the GPU may be shared by",
    );
    let healthy = family(
        &mut registry,
        "gpuslice_gpu_healthy",
        "1 when the GPU is advertised healthy",
    );
    let vmem = family(
        &mut registry,
        "hami_vgpu_memory_allocated_bytes",
        "Device memory held by a container",
    );
    let vcore = family(
        &mut registry,
        "hami_vgpu_core_allocated_ratio",
        "Compute held by a container (1 = one card)",
    );
    for g in gpus.iter() {
        let labels = GpuLabels {
            node: node.to_owned(),
            device_uuid: g.uuid.clone(),
            device_index: g.index.to_string(),
            device_type: g.device_type.clone(),
        };
        mem_limit
            .get_or_create(&labels)
            .set(f64::from(g.memory_mib) * MIB);
        core_limit
            .get_or_create(&labels)
            .set(f64::from(g.cores) / 100.0);
        slots.get_or_create(&labels).set(f64::from(g.split_count));
        healthy
            .get_or_create(&labels)
            .set(if g.healthy { 1.0 } else { 0.0 });
        let Some(ledger) = ledgers.get(&g.uuid) else {
            continue;
        };
        let usage = ledger.usage();
        mem_alloc
            .get_or_create(&labels)
            .set(usage.memory_mib as f64 * MIB);
        core_alloc
            .get_or_create(&labels)
            .set(usage.cores as f64 / 100.0);
        shared.get_or_create(&labels).set(f64::from(usage.slots));
        for (key, slice) in ledger.holdings() {
            let (namespace, pod) = names
                .get(&key.pod_uid)
                .cloned()
                .unwrap_or_else(|| (String::new(), key.pod_uid.clone()));
            let labels = ContainerLabels {
                namespace,
                node: node.to_owned(),
                pod,
                container_index: key.container.to_string(),
                device_uuid: g.uuid.clone(),
            };
            vmem.get_or_create(&labels)
                .set(f64::from(slice.memory_mib) * MIB);
            vcore
                .get_or_create(&labels)
                .set(f64::from(slice.cores) / 100.0);
        }
    }
    render_observed(&mut registry, node, gpus, observed);
    registry.register(
        "gpuslice_hami_core_cache_errors",
        "HAMi-core shared-region files skipped at a scrape, by reason",
        errors.clone(),
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// HAMi's node-monitor series: per container device from the shared
/// regions, per GPU from the host readings (GPUs this node advertises).
#[allow(
    clippy::cast_precision_loss,
    reason = "bytes and percents are reported as HAMi does, as float64"
)]
fn render_observed(registry: &mut Registry, node: &str, gpus: &Inventory, observed: &Observed) {
    let used = family(
        registry,
        "hami_vgpu_memory_used_bytes",
        "vGPU device memory usage in bytes",
    );
    let limit = family(
        registry,
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit in bytes",
    );
    let ctr_memory = family(
        registry,
        "hami_container_device_memory_bytes",
        "Container device memory usage in bytes",
    );
    let ctr_util = family(
        registry,
        "hami_container_device_utilization_ratio",
        "Container device SM utilization ratio",
    );
    let last_kernel = family(
        registry,
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since last kernel execution in container",
    );
    let context = family(
        registry,
        "hami_vgpu_memory_context_bytes",
        "Container device memory context size in bytes",
    );
    let module = family(
        registry,
        "hami_vgpu_memory_module_bytes",
        "Container device memory module size in bytes",
    );
    let buffer = family(
        registry,
        "hami_vgpu_memory_buffer_bytes",
        "Container device memory buffer size in bytes",
    );
    for c in &observed.scan.containers {
        for (i, device) in c.region.devices.iter().enumerate() {
            // HAMi skips a device whose UUID HAMi-core has not written yet.
            let Some(uuid) = &device.uuid else { continue };
            let labels = VdeviceLabels {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                vdevice_index: i.to_string(),
                device_uuid: uuid.clone(),
            };
            let t = c.region.totals(i);
            used.get_or_create(&labels).set(t.memory.total as f64);
            limit.get_or_create(&labels).set(device.memory_limit as f64);
            ctr_memory.get_or_create(&labels).set(t.memory.total as f64);
            ctr_util.get_or_create(&labels).set(t.sm_util as f64);
            context.get_or_create(&labels).set(t.memory.context as f64);
            module.get_or_create(&labels).set(t.memory.module as f64);
            buffer.get_or_create(&labels).set(t.memory.data as f64);
            if let Some(at) = c.region.last_kernel_time.filter(|&t| t > 0) {
                last_kernel
                    .get_or_create(&labels)
                    .set(observed.now_unix.saturating_sub(at) as f64);
            }
        }
    }
    let host_memory = family(
        registry,
        "hami_host_gpu_memory_used_bytes",
        "GPU device memory usage in bytes",
    );
    let host_util = family(
        registry,
        "hami_host_gpu_utilization_ratio",
        "GPU core utilization ratio (0-100)",
    );
    let host_memory_util = family(
        registry,
        "hami_host_gpu_memory_controller_utilization_ratio",
        "GPU memory controller utilization ratio (0-100)",
    );
    let temperature = family(
        registry,
        "hami_host_gpu_temperature_celsius",
        "GPU temperature in degrees Celsius",
    );
    let power = family(
        registry,
        "hami_host_gpu_power_usage_watts",
        "GPU power draw in watts",
    );
    for h in &observed.host {
        let Some(g) = gpus.iter().find(|g| g.uuid == h.uuid) else {
            continue;
        };
        let labels = GpuLabels {
            node: node.to_owned(),
            device_uuid: g.uuid.clone(),
            device_index: g.index.to_string(),
            device_type: g.device_type.clone(),
        };
        if let Some(v) = h.memory_used_bytes {
            host_memory.get_or_create(&labels).set(v as f64);
        }
        if let Some(v) = h.gpu_utilization {
            host_util.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = h.memory_utilization {
            host_memory_util
                .get_or_create(&HostGpuLabels {
                    device_index: labels.device_index.clone(),
                    device_uuid: labels.device_uuid.clone(),
                    device_type: labels.device_type.clone(),
                })
                .set(f64::from(v));
        }
        if let Some(v) = h.temperature_celsius {
            temperature.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = h.power_watts {
            power.get_or_create(&labels).set(v);
        }
    }
}

/// What a scrape reads.
#[derive(Clone)]
pub struct Sources {
    /// This node.
    pub node: String,
    /// The inventory.
    pub inventory: watch::Receiver<Inventory>,
    /// The GPUs.
    pub gpus: GpuPool,
    /// Pod names.
    pub names: watch::Receiver<PodNames>,
    /// `<hook>/vgpu/containers`, where HAMi-core's files are.
    pub containers: PathBuf,
    /// Where host readings come from.
    pub devices: Arc<dyn DeviceSource>,
    /// Files skipped so far.
    pub cache_errors: CacheErrors,
}

async fn metrics(sources: web::Data<Sources>) -> HttpResponse {
    let ledgers = sources.gpus.ledgers().await;
    let gpus = sources.inventory.borrow().clone();
    let names = sources.names.borrow().clone();
    let (dir, devices, scanned) = (
        sources.containers.clone(),
        Arc::clone(&sources.devices),
        Arc::clone(&names),
    );
    // File and NVML reads block: off the async worker.
    let observed = web::block(move || crate::usage::observe(&dir, &scanned, devices.as_ref()))
        .await
        .unwrap_or_else(|error| {
            warn!(%error, "usage scan failed");
            Observed::default()
        });
    count_unreadable(&observed, &sources.cache_errors);
    match render(
        &sources.node,
        &gpus,
        &ledgers,
        &names,
        &observed,
        &sources.cache_errors,
    ) {
        Ok(text) => HttpResponse::Ok()
            .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
            .body(text),
        Err(_) => HttpResponse::InternalServerError().finish(),
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok")
}

/// The routes, for the server and for tests.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(metrics))
        .route("/healthz", web::get().to(healthz));
}

/// Serves `/metrics` and `/healthz` on `address` until stopped.
///
/// # Errors
/// The bind error.
pub fn serve(address: SocketAddr, sources: Sources) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::new(sources);
    Ok(
        HttpServer::new(move || App::new().app_data(data.clone()).configure(routes))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(5)
            .bind(address)?
            .run(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::Gpu;
    use crate::ledger::{Capacity, Slice, SliceKey};

    #[test]
    fn gpu_and_container_allocations_use_hami_names_and_labels() {
        let gpu = Gpu {
            uuid: "GPU-a".into(),
            index: 0,
            device_type: "NVIDIA-Tesla T4".into(),
            memory_mib: 15_360,
            cores: 100,
            split_count: 10,
            numa: 0,
            healthy: true,
            mig_profiles: Vec::new(),
        };
        let mut ledger = SliceLedger::new(Capacity {
            slots: 10,
            memory_mib: 15_360,
            cores: 100,
        });
        let key = SliceKey {
            pod_uid: "u1".into(),
            container: 1,
        };
        ledger
            .commit(
                key,
                Slice {
                    memory_mib: 3000,
                    cores: 30,
                    init: false,
                },
                crate::epoch::Epoch(1),
            )
            .unwrap();
        let ledgers = [("GPU-a".to_owned(), ledger)].into_iter().collect();
        let names: PodNames = Arc::new(
            [("u1".to_owned(), ("ns".to_owned(), "train".to_owned()))]
                .into_iter()
                .collect(),
        );
        let text = render(
            "n1",
            &Arc::new(vec![gpu]),
            &ledgers,
            &names,
            &Observed::default(),
            &CacheErrors::default(),
        )
        .unwrap();
        assert!(text.contains(
            r#"hami_vgpu_memory_allocated_bytes{namespace="ns",node="n1",pod="train",container_index="1",device_uuid="GPU-a"} 3145728000.0"#
        ), "{text}");
        assert!(text.contains(
            r#"hami_gpu_shared_count{node="n1",device_uuid="GPU-a",device_index="0",device_type="NVIDIA-Tesla T4"} 1.0"#
        ), "{text}");
        assert!(text.contains(r#"hami_vgpu_core_allocated_ratio{namespace="ns",node="n1",pod="train",container_index="1",device_uuid="GPU-a"} 0.3"#), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn observed_usage_uses_hamis_monitor_names_and_labels() {
        use crate::devices::HostUsage;
        use crate::usage::{ContainerUsage, Scan};
        use proto::hami::shared_region::{
            Device, Layout, MemoryUse, Process, ProcessDeviceUse, SharedRegion,
        };

        let gpu = Gpu {
            uuid: "GPU-a".into(),
            index: 0,
            device_type: "NVIDIA-Tesla T4".into(),
            memory_mib: 15_360,
            cores: 100,
            split_count: 10,
            numa: 0,
            healthy: true,
            mig_profiles: Vec::new(),
        };
        let process = |total: u64, sm| Process {
            pid: 1,
            host_pid: 2,
            status: 1,
            devices: vec![ProcessDeviceUse {
                memory: MemoryUse {
                    context: 100,
                    module: 10,
                    data: total - 110,
                    offset: 0,
                    total,
                },
                monitor_used: total,
                sm_util: sm,
            }],
        };
        let region = SharedRegion {
            layout: Layout::V1 { minor: 2 },
            devices: vec![
                Device {
                    uuid: Some("GPU-a".into()),
                    memory_limit: 3_145_728_000,
                    sm_limit: 30,
                },
                Device {
                    uuid: None,
                    memory_limit: 1,
                    sm_limit: 1,
                },
            ],
            processes: vec![process(1000, 20), process(500, 5)],
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
            last_kernel_time: Some(1_000),
        };
        let observed = Observed {
            scan: Scan {
                containers: vec![ContainerUsage {
                    namespace: "ns".into(),
                    pod: "train".into(),
                    container: "app".into(),
                    region,
                }],
                unreadable: vec![("/x.cache".into(), crate::usage::Unreadable::Ambiguous(2))],
            },
            host: vec![HostUsage {
                uuid: "GPU-a".into(),
                memory_used_bytes: Some(4096),
                gpu_utilization: Some(70),
                memory_utilization: Some(40),
                temperature_celsius: None,
                power_watts: Some(61.5),
            }],
            now_unix: 1_042,
        };
        let errors = CacheErrors::default();
        count_unreadable(&observed, &errors);
        let text = render(
            "n1",
            &Arc::new(vec![gpu]),
            &BTreeMap::new(),
            &PodNames::default(),
            &observed,
            &errors,
        )
        .unwrap();
        let ctr =
            r#"{namespace="ns",pod="train",container="app",vdevice_index="0",device_uuid="GPU-a"}"#;
        let gpu =
            r#"{node="n1",device_uuid="GPU-a",device_index="0",device_type="NVIDIA-Tesla T4"}"#;
        for line in [
            format!("hami_vgpu_memory_used_bytes{ctr} 1500.0"),
            format!("hami_vgpu_memory_limit_bytes{ctr} 3145728000.0"),
            format!("hami_container_device_memory_bytes{ctr} 1500.0"),
            format!("hami_container_device_utilization_ratio{ctr} 25.0"),
            format!("hami_container_last_kernel_elapsed_seconds{ctr} 42.0"),
            format!("hami_vgpu_memory_context_bytes{ctr} 200.0"),
            format!("hami_vgpu_memory_module_bytes{ctr} 20.0"),
            format!("hami_vgpu_memory_buffer_bytes{ctr} 1280.0"),
            format!("hami_host_gpu_memory_used_bytes{gpu} 4096.0"),
            format!("hami_host_gpu_utilization_ratio{gpu} 70.0"),
            r#"hami_host_gpu_memory_controller_utilization_ratio{device_index="0",device_uuid="GPU-a",device_type="NVIDIA-Tesla T4"} 40.0"#.to_owned(),
            format!("hami_host_gpu_power_usage_watts{gpu} 61.5"),
            r#"gpuslice_hami_core_cache_errors_total{reason="ambiguous"} 1"#.to_owned(),
        ] {
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        assert!(
            !text.contains(r#"vdevice_index="1""#),
            "a device without UUID is skipped"
        );
        assert!(
            !text.contains("hami_host_gpu_temperature_celsius{"),
            "no reading, no series"
        );
    }
}

//! `/metrics` (Prometheus text) and `/healthz`, served by actix-web.
//!
//! Metrics are rendered at scrape time from read models, never kept in a
//! second copy: the inventory (capacity, health), each GPU actor's ledger
//! (asked with `GetLedger`), and the pod names the allocator last saw.
//! Names are HAMi's where one exists (its scheduler's `hami_gpu_*` and
//! per-container `hami_vgpu_*`, so HAMi dashboards read them); the rest are
//! `gpuslice_*`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use actix_web::{App, HttpResponse, HttpServer, web};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::actors::health::Inventory;
use crate::actors::pool::GpuPool;
use crate::ledger::SliceLedger;

/// Pod UID → (namespace, name), as the allocator last listed them.
pub type PodNames = Arc<BTreeMap<String, (String, String)>>;

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

type F64Gauge = Gauge<f64, AtomicU64>;

fn family<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, F64Gauge>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, F64Gauge>::default();
    registry.register(name, help, f.clone());
    f
}

/// The Prometheus text for one node's GPUs and their ledgers.
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
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
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
}

async fn metrics(sources: web::Data<Sources>) -> HttpResponse {
    let ledgers = sources.gpus.ledgers().await;
    let gpus = sources.inventory.borrow().clone();
    let names = sources.names.borrow().clone();
    match render(&sources.node, &gpus, &ledgers, &names) {
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
        let text = render("n1", &Arc::new(vec![gpu]), &ledgers, &names).unwrap();
        assert!(text.contains(
            r#"hami_vgpu_memory_allocated_bytes{namespace="ns",node="n1",pod="train",container_index="1",device_uuid="GPU-a"} 3145728000.0"#
        ), "{text}");
        assert!(text.contains(
            r#"hami_gpu_shared_count{node="n1",device_uuid="GPU-a",device_index="0",device_type="NVIDIA-Tesla T4"} 1.0"#
        ), "{text}");
        assert!(text.contains(r#"hami_vgpu_core_allocated_ratio{namespace="ns",node="n1",pod="train",container_index="1",device_uuid="GPU-a"} 0.3"#), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}

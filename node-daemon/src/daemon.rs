//! Wiring of the running daemon: discover GPUs, rebuild the ledgers from
//! the pods bound to this node, start the actors, and only then serve and
//! register the plugin socket; on shutdown, drain and remove the socket.
//!
//! In DRA mode ([`Mode::Dra`]) the ledgers are rebuilt from the
//! `ResourceClaim`s allocated to this node's pool, the `ResourceSlice`
//! publisher replaces the register annotation, and the kubelet DRA plugin
//! (with its registration socket) replaces the device plugin.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use actix::Supervisor;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::actors::health::{HealthActor, Inventory};
use crate::actors::kubelet::{Allocator, ContractSettings, KubeletActor, pod_names};
use crate::actors::pod_watch::PodWatch;
use crate::actors::pool::GpuPool;
use crate::allocation::rebuild_holdings;
use crate::cluster::{Cluster, ClusterError};
use crate::devices::simulated::SimulatedDevices;
use crate::devices::{DeviceError, DeviceSource, Gpu, Shaping};
use crate::dra::driver::{DraDriver, DriverSettings};
use crate::epoch::{CommitClock, Epoch};
use crate::grpc::dra::DraSockets;
use crate::grpc::plugin::DevicePluginService;
use crate::grpc::registration::{PluginError, PluginSocket, serve_and_register};
use crate::ledger::{Capacity, SliceLedger};
use crate::metrics::Sources;
use crate::settings::{DeviceSourceKind, Mode, Settings};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The settings have no node name.
    #[error("nodeName is required")]
    NoNodeName,
    /// GPUs could not be discovered.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// The Kubernetes API could not be used.
    #[error("kubernetes API: {0}")]
    Cluster(#[from] ClusterError),
    /// The kube client could not be configured.
    #[error("kubernetes client configuration: {0}")]
    KubeConfig(String),
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {address}: {source}")]
    Metrics {
        /// The address.
        address: std::net::SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The plugin socket could not be served.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// What the daemon runs with; tests inject the device source and cluster.
#[derive(Clone)]
pub struct Daemon {
    /// The settings.
    pub settings: Settings,
    /// Where GPUs come from.
    pub devices: Arc<dyn DeviceSource>,
    /// The Kubernetes API.
    pub cluster: Arc<dyn Cluster>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The device source the settings ask for.
///
/// # Errors
/// [`DeviceError`] when NVML cannot be loaded.
pub fn device_source(
    settings: &Settings,
    node: &str,
) -> Result<Arc<dyn DeviceSource>, DeviceError> {
    Ok(match settings.device_source {
        DeviceSourceKind::Simulated => Arc::new(SimulatedDevices::from_settings(settings, node)),
        DeviceSourceKind::Nvml => Arc::new(crate::devices::nvml::NvmlDevices::open()?),
    })
}

/// A kube client from `kubeconfig` or, without one, the in-cluster config.
///
/// # Errors
/// [`RunError::KubeConfig`] with the reason.
pub async fn kube_client(settings: &Settings) -> Result<kube::Client, RunError> {
    let error = |e: &dyn std::fmt::Display| RunError::KubeConfig(e.to_string());
    let config = match &settings.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| error(&e))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| error(&e))?
        }
        None => kube::Config::incluster().map_err(|e| error(&e))?,
    };
    kube::Client::try_from(config).map_err(|e| error(&e))
}

/// The settings' device source and a kube client, then [`run`].
///
/// # Errors
/// As [`run`], plus device and client configuration errors.
pub async fn run_from_settings(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let node = settings.node_name.clone().ok_or(RunError::NoNodeName)?;
    let devices = device_source(&settings, &node)?;
    let client = kube_client(&settings).await?;
    let cluster = Arc::new(crate::cluster::kube::KubeCluster::new(client));
    run(
        Daemon {
            settings,
            devices,
            cluster,
        },
        shutdown,
    )
    .await
}

/// Runs the daemon in this process until SIGTERM or SIGINT: a multi-thread
/// tokio runtime hosting an actix `System` (actors and tonic together).
///
/// # Errors
/// As [`run_from_settings`], or [`RunError::Runtime`].
pub fn run_process(settings: Settings) -> Result<(), RunError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RunError::Runtime)?;
    actix::System::with_tokio_rt(move || runtime)
        .block_on(run_from_settings(settings, crate::telemetry::terminated()))
}

/// One ledger per GPU, rebuilt from `pods` (the slices they were
/// annotated with), every holding stamped `at`.
fn rebuilt_ledgers(
    node: &str,
    gpus: &[Gpu],
    pods: &[crate::cluster::PodView],
    at: Epoch,
) -> BTreeMap<String, SliceLedger> {
    let (holdings, errors) = rebuild_holdings(node, pods);
    for error in errors {
        warn!(%error, "pod ignored while rebuilding the ledgers");
    }
    let mut ledgers: BTreeMap<String, SliceLedger> = gpus
        .iter()
        .map(|g| {
            let capacity = Capacity {
                slots: g.split_count,
                memory_mib: g.memory_mib,
                cores: g.cores,
            };
            (g.uuid.clone(), SliceLedger::new(capacity))
        })
        .collect();
    for h in holdings {
        match ledgers.get_mut(&h.uuid) {
            Some(ledger) => {
                if let Err(error) = ledger.commit(h.key.clone(), h.slice, at) {
                    warn!(gpu = %h.uuid, pod_uid = %h.key.pod_uid, %error, "annotated slice does not fit; not counted");
                }
            }
            None => {
                warn!(gpu = %h.uuid, pod_uid = %h.key.pod_uid, "annotated slice on a GPU this node does not advertise")
            }
        }
    }
    ledgers
}

/// Runs the daemon until `shutdown` completes. Must run inside an actix
/// `System` (see `main`).
///
/// # Errors
/// A [`RunError`] when GPUs, the API or the socket are unusable at start.
pub async fn run(daemon: Daemon, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let Daemon {
        settings,
        devices,
        cluster,
    } = daemon;
    let node = settings.node_name.clone().ok_or(RunError::NoNodeName)?;
    let gpus = Shaping::from(&settings).advertise(&devices.discover()?)?;
    info!(node = %node, gpus = gpus.len(), split = settings.device_split_count, mode = ?settings.mode, "GPUs discovered");
    if settings.mode == Mode::Dra {
        return run_dra(settings, devices, cluster, node, gpus, shutdown).await;
    }

    let mig_gpus: crate::mig::MigGpus = gpus
        .iter()
        .filter(|g| !g.mig_profiles.is_empty())
        .map(|g| (g.uuid.clone(), g.mig_profiles.clone()))
        .collect();
    let clock = CommitClock::new();
    let pods = cluster.pods_on_node(&node).await?;
    let gpu_pool = GpuPool::start(
        rebuilt_ledgers(&node, &gpus, &pods, clock.now()),
        clock.clone(),
    );
    let pair_scores = if settings.enable_topology_score {
        match devices.links() {
            Ok(links) => Some(proto::hami::pair_score::encode(
                &crate::devices::topology::pair_scores(&gpus, &links),
            )),
            Err(error) => {
                warn!(%error, "cannot read the GPU topology; no pair scores are published");
                None
            }
        }
    } else {
        None
    };
    let (inventory_tx, inventory) = watch::channel::<Inventory>(Arc::new(gpus));
    let _health = HealthActor::start_on(inventory_tx, devices.health_events()?);
    let _pod_watch = PodWatch::start_on(gpu_pool.clone(), cluster.pod_changes(&node, clock));
    let (names_tx, names) = watch::channel(pod_names(&pods));
    let metrics = start_metrics(
        &settings,
        Sources {
            node: node.clone(),
            inventory: inventory.clone(),
            gpus: gpu_pool.clone(),
            names,
            containers: settings.hook_path.join("vgpu/containers"),
            devices: Arc::clone(&devices),
            cache_errors: crate::metrics::CacheErrors::default(),
        },
    )?;
    let allocator = Allocator::new(
        node.clone(),
        Arc::clone(&cluster),
        gpu_pool,
        ContractSettings {
            hook_path: settings.hook_path.clone(),
            device_memory_scaling: settings.device_memory_scaling,
            mig_gpus,
        },
        Arc::new(names_tx),
    );
    let kubelet = Supervisor::start(move |_| KubeletActor::new(allocator));

    let (stop_tx, stop) = watch::channel(false);
    let registrar = tokio::spawn(crate::registrar::publish(
        Arc::clone(&cluster),
        node.clone(),
        pair_scores,
        inventory.clone(),
        stop.clone(),
    ));
    let socket = PluginSocket {
        dir: settings.device_plugin_dir.clone(),
        endpoint: socket_name(&settings.resource_name),
        resource_name: settings.resource_name.clone(),
    };
    let plugin = serve_and_register(
        socket,
        move |drain| DevicePluginService::new(kubelet.clone(), inventory.clone(), drain),
        stop.clone(),
    );
    tokio::pin!(plugin);
    let result = tokio::select! {
        result = &mut plugin => result,
        () = shutdown => {
            info!("shutting down: draining the device plugin");
            let _ = stop_tx.send(true);
            plugin.await
        }
    };
    let _ = stop_tx.send(true);
    let _ = registrar.await;
    if let Some(metrics) = metrics {
        metrics.stop(true).await;
    }
    result.map_err(RunError::from)
}

/// Serves `/metrics` and `/healthz` when the settings ask for it.
fn start_metrics(
    settings: &Settings,
    sources: Sources,
) -> Result<Option<actix_web::dev::ServerHandle>, RunError> {
    let Some(address) = settings.metrics_bind_address else {
        return Ok(None);
    };
    let server = crate::metrics::serve(address, sources)
        .map_err(|source| RunError::Metrics { address, source })?;
    info!(%address, "serving /metrics and /healthz");
    let handle = server.handle();
    actix::spawn(server);
    Ok(Some(handle))
}

/// DRA mode: ledgers rebuilt from the claims allocated to this node's pool,
/// the `ResourceSlice` publisher, and the kubelet DRA plugin, until
/// `shutdown`. No device plugin, no register annotation, no pod reads.
async fn run_dra(
    settings: Settings,
    devices: Arc<dyn DeviceSource>,
    cluster: Arc<dyn Cluster>,
    node: String,
    gpus: Vec<Gpu>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let clock = CommitClock::new();
    // Deletions from before the list on are seen (as far as the API's
    // watch allows).
    let cluster_deletions = cluster.claim_deletions();
    let claims = cluster.resource_claims().await?;
    let mut ledgers = rebuilt_ledgers(&node, &gpus, &[], clock.now());
    let held = crate::dra::driver::rebuild(&node, &gpus, &claims);
    for (uuid, claims) in held {
        let Some(ledger) = ledgers.get_mut(&uuid) else {
            continue;
        };
        for (claim_uid, slice) in claims {
            if let Err(error) = ledger.commit_claim(&claim_uid, slice) {
                warn!(gpu = %uuid, claim = %claim_uid, %error, "allocated claim does not fit; not counted");
            }
        }
    }
    let rebuilt: usize = ledgers.values().map(|l| l.claims().count()).sum();
    info!(
        claims = rebuilt,
        "ledgers rebuilt from the allocated ResourceClaims"
    );
    let allocated: std::collections::BTreeSet<String> = claims
        .iter()
        .filter(|c| crate::dra::claims::allocated_to(c, &node))
        .map(|c| c.uid.clone())
        .collect();
    match crate::dra::cdi::remove_stale_specs(&settings.cdi_dir, &allocated).await {
        Ok(0) => {}
        Ok(removed) => info!(
            removed,
            "CDI specs of claims no longer allocated here removed"
        ),
        Err(error) => {
            warn!(%error, dir = %settings.cdi_dir.display(), "cannot clean the CDI folder")
        }
    }
    let gpu_pool = GpuPool::start(ledgers, clock);
    let (inventory_tx, inventory) = watch::channel::<Inventory>(Arc::new(gpus));
    let _health = HealthActor::start_on(inventory_tx, devices.health_events()?);
    let (_names_tx, names) = watch::channel(crate::cluster::PodNames::default());
    let metrics = start_metrics(
        &settings,
        Sources {
            node: node.clone(),
            inventory: inventory.clone(),
            gpus: gpu_pool.clone(),
            names,
            containers: settings.hook_path.join("vgpu/containers"),
            devices: Arc::clone(&devices),
            cache_errors: crate::metrics::CacheErrors::default(),
        },
    )?;
    let (stop_tx, stop) = watch::channel(false);
    let publisher = tokio::spawn(crate::dra::publisher::publish(
        Arc::clone(&cluster),
        node.clone(),
        inventory.clone(),
        stop.clone(),
    ));
    let driver = DraDriver::new(
        DriverSettings {
            node,
            cdi_dir: settings.cdi_dir.clone(),
            hook_path: settings.hook_path.clone(),
            device_memory_scaling: settings.device_memory_scaling,
        },
        cluster,
        gpu_pool,
        inventory,
    );
    let releaser = tokio::spawn(crate::dra::driver::release_deleted(
        driver.clone(),
        cluster_deletions,
        stop.clone(),
    ));
    let sockets = DraSockets {
        plugin_dir: settings.dra_plugin_dir.clone(),
        registry_dir: settings.plugin_registry_dir.clone(),
    };
    let plugin = crate::grpc::dra::serve(sockets, driver, stop);
    tokio::pin!(plugin);
    let result = tokio::select! {
        result = &mut plugin => result,
        () = shutdown => {
            info!("shutting down: draining the DRA plugin");
            let _ = stop_tx.send(true);
            plugin.await
        }
    };
    let _ = stop_tx.send(true);
    let _ = publisher.await;
    let _ = releaser.await;
    if let Some(metrics) = metrics {
        metrics.stop(true).await;
    }
    result.map_err(RunError::from)
}

/// The socket file name for a resource: `nvidia.com/gpu` → `nvidia-gpu.sock`
/// (HAMi's name for the default resource).
#[must_use]
pub fn socket_name(resource_name: &str) -> String {
    let vendor = resource_name
        .split_once('/')
        .map_or(resource_name, |(domain, _)| {
            domain.split('.').next().unwrap_or(domain)
        });
    let name = resource_name.rsplit('/').next().unwrap_or(resource_name);
    format!("{vendor}-{name}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_name_follows_hami() {
        assert_eq!(socket_name("nvidia.com/gpu"), "nvidia-gpu.sock");
        assert_eq!(socket_name("example.org/vgpu"), "example-vgpu.sock");
    }
}

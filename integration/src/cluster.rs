//! A whole GPU-sharing cluster: the control plane, the real scheduler-webhook
//! (webhook + extender over TLS), and per node a real node-daemon with
//! simulated GPUs next to a fake kubelet. Used by the end-to-end tests and
//! the sandbox.
//!
//! The control plane is either the stand-ins, in process
//! ([`ControlPlaneKind::Fake`]: fake apiserver and fake kube-scheduler, fast,
//! with fault injection), or the real kube-apiserver, etcd,
//! kube-controller-manager and kube-scheduler built from `k8s.io/kubernetes`
//! ([`ControlPlaneKind::Real`], see [`crate::real`]): then the chart's objects
//! are installed, the apiserver calls our webhook at the URL the chart
//! registers, kube-scheduler runs with the chart's configuration, and our
//! services run with the chart's ServiceAccount tokens.
//!
//! Every component speaks its real protocol to the others: HTTPS between
//! kube-scheduler and the extender, the Kubernetes API over HTTP, the device
//! plugin API over unix sockets. Each service runs on its own thread and
//! runtime, as it would in its own process, and can be stopped and started
//! again (a restart) without touching the others.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::oneshot;

use crate::fake_apiserver::FakeApiServer;
use crate::fake_apiserver::admission::{FailurePolicy, MutatingWebhook};
use crate::fake_kubelet::node::{NodeAgent, NodeConfig};
use crate::fake_kubelet::{Config as KubeletConfig, FakeKubelet};
use crate::fake_scheduler::FakeScheduler;
use crate::fake_scheduler::config::{ExtenderConfig, SchedulerConfig};
use node_daemon::devices::simulated::{HealthSwitch, SimulatedDevices, simulated_uuid};
use node_daemon::settings::OperatingMode;
pub use scheduler_webhook::settings::Mode;

/// The extended resource every node advertises its GPUs as (HAMi's
/// default name, which the clusters here keep).
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Scheduler name every GPU pod is routed to.
pub const SCHEDULER_NAME: &str = "gpuslice-scheduler";

/// The cluster's own kube-scheduler in DRA mode: the default profile
/// (`default-scheduler`, DynamicResources among its plugins) and its Lease
/// `kube-system/kube-scheduler`.
pub const DEFAULT_SCHEDULER_CONFIG: &str = "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
";

/// What to start.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Number of GPU nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// GPU model as NVML reports it.
    pub gpu_model: String,
    /// Memory per GPU, MiB.
    pub gpu_memory_mib: u32,
    /// Slices per GPU.
    pub split_count: u32,
    /// Node policy of the scheduler.
    pub node_policy: String,
    /// GPU policy of the scheduler.
    pub gpu_policy: String,
    /// CPU capacity of each node.
    pub node_cpu: String,
    /// Memory capacity of each node.
    pub node_memory: String,
    /// Which control plane runs the cluster.
    pub control_plane: ControlPlaneKind,
    /// Which kubelet runs each node.
    pub kubelet: KubeletKind,
    /// How the node-daemons share their GPUs: `Mig` puts MIG-capable
    /// models (A100, H100, A30) in `mig` mode (see `docs/mig.md`).
    pub operating_mode: OperatingMode,
    /// Device-plugin mode, or DRA mode (the chart's `mode: dra`: the
    /// webhook writes claims, the cluster's kube-scheduler allocates,
    /// node-daemon is a DRA driver, the fake kubelet prepares claims);
    /// DRA mode needs the real control plane.
    pub mode: Mode,
    /// Keep the real kube-apiserver's audit log, to count requests by
    /// client ([`Cluster::api_audit`]); ignored on the fake control plane,
    /// whose request log is always kept.
    pub api_audit: bool,
}

/// Which kubelet runs a [`Cluster`]'s nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KubeletKind {
    /// The in-process stand-in ([`FakeKubelet`] and its node agent).
    #[default]
    Fake,
    /// The real kubelet on the Kubernetes project's fake CRI runtime, one
    /// mount namespace per node ([`crate::real::kubelet`]); needs the real
    /// control plane.
    Real,
}

/// Which control plane a [`Cluster`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlPlaneKind {
    /// The in-process stand-ins (fake apiserver and kube-scheduler).
    #[default]
    Fake,
    /// The real kube-apiserver, etcd, kube-controller-manager and
    /// kube-scheduler, built by `integration/k8s/build.sh`.
    Real,
}

impl ControlPlaneKind {
    /// The name used on command lines and in summaries.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fake => "fake",
            Self::Real => "real",
        }
    }
}

impl ControlPlaneKind {
    /// The variable the end-to-end tests read to pick their control plane.
    pub const ENV: &'static str = "GPUSLICE_CONTROL_PLANE";

    /// The control plane `$GPUSLICE_CONTROL_PLANE` names (`fake` when unset),
    /// so the same end-to-end tests run on either; `.ci/run` runs them on
    /// both.
    ///
    /// # Panics
    /// The variable names no control plane (a test set-up error).
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var(Self::ENV) {
            Err(_) => Self::Fake,
            Ok(v) => v.parse().unwrap_or_else(|e| panic!("{}: {e}", Self::ENV)),
        }
    }
}

impl std::str::FromStr for ControlPlaneKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fake" => Ok(Self::Fake),
            "real" => Ok(Self::Real),
            other => Err(format!("unknown control plane {other:?} (fake, real)")),
        }
    }
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            nodes: 2,
            gpus_per_node: 4,
            gpu_model: "NVIDIA A100-SXM4-40GB".to_owned(),
            gpu_memory_mib: 40960,
            split_count: 10,
            node_policy: "binpack".to_owned(),
            gpu_policy: "spread".to_owned(),
            node_cpu: "64".to_owned(),
            node_memory: "512Gi".to_owned(),
            control_plane: ControlPlaneKind::Fake,
            kubelet: KubeletKind::Fake,
            operating_mode: OperatingMode::HamiCore,
            mode: Mode::DevicePlugin,
            api_audit: false,
        }
    }
}

/// Why the cluster could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A component failed to start.
    #[error("{component}: {reason}")]
    Start {
        /// Which component.
        component: String,
        /// Why.
        reason: String,
    },
    /// A Kubernetes call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A file could not be written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn start_err(component: impl Into<String>, reason: impl std::fmt::Display) -> ClusterError {
    ClusterError::Start {
        component: component.into(),
        reason: reason.to_string(),
    }
}

/// A service running on its own thread, stopped through a oneshot: `stop`
/// lets it drain, `kill` drops it where it stands.
pub(crate) struct Service {
    stop: Option<oneshot::Sender<()>>,
    kill: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Service {
    /// Asks the service to drain and waits for its thread.
    fn stop(&mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join()
    }

    /// Stops the service without a drain, as `kill -9` would: its future
    /// is dropped at whatever await it was in (a request half done stays
    /// half done) and its runtime with every task on it. Unlike a killed
    /// process, destructors still run (sockets may be removed).
    fn kill(&mut self) -> Result<(), String> {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        self.join()
    }

    fn join(&mut self) -> Result<(), String> {
        self.stop = None;
        self.kill = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("service thread panicked".to_owned()),
            None => Ok(()),
        }
    }

    /// Whether its thread runs (it was neither stopped nor killed).
    fn is_running(&self) -> bool {
        self.thread.is_some()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Resolves when `kill` is sent; never when its sender is only dropped.
async fn killed(kill: oneshot::Receiver<()>) {
    if kill.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One simulated GPU node.
pub struct NodeHandle {
    /// Node name.
    pub name: String,
    /// Its device-plugins folder.
    pub dir: PathBuf,
    /// Its kubelet.
    pub kubelet: FakeKubelet,
    /// Its node-daemon's `/metrics` URL (on 127.0.0.1).
    pub metrics_url: String,
    metrics: SocketAddr,
    agent: Option<NodeAgent>,
    daemon: Service,
    health: HealthSwitch,
    /// DRA mode: the fake kubelet's DRA manager.
    pub dra: Option<std::sync::Arc<crate::fake_kubelet::dra::DraManager>>,
}

impl NodeHandle {
    /// The UUID of the node's simulated GPU `index` (stable across daemon
    /// restarts).
    #[must_use]
    pub fn gpu_uuid(&self, index: u32) -> String {
        simulated_uuid(&self.name, index)
    }

    /// Reports the simulated GPU `uuid` healthy or not to the running
    /// node-daemon (as NVML's health events would); returns whether the
    /// daemon was listening.
    pub fn set_gpu_health(&self, uuid: &str, healthy: bool) -> bool {
        self.health.set(uuid, healthy)
    }
}

/// The kubelet's node settings for node `name` of `spec`.
fn node_config(spec: &ClusterSpec, name: &str) -> NodeConfig {
    let names = proto::hami::resources::ResourceNames::default();
    NodeConfig {
        resources: vec![names.resource_name],
        cpu: spec.node_cpu.clone(),
        memory: spec.node_memory.clone(),
        ..NodeConfig::new(name)
    }
}

/// The control plane of a running [`Cluster`].
enum Plane {
    Fake {
        api: FakeApiServer,
        scheduler: Option<FakeScheduler>,
    },
    Real(Box<crate::real::control_plane::ControlPlane>),
}

/// A running cluster; [`Cluster::shutdown`] stops everything and removes
/// every socket and file.
pub struct Cluster {
    /// The spec it was started with.
    pub spec: ClusterSpec,
    /// Kubeconfig for clients (kube-rs, kubectl); cluster-admin on the real
    /// control plane.
    pub kubeconfig: PathBuf,
    /// The kubeconfig scheduler-webhook runs with (on the real control plane,
    /// the chart's scheduler ServiceAccount).
    pub webhook_kubeconfig: PathBuf,
    /// The kubeconfig node-daemons run with (on the real control plane, the
    /// chart's node-daemon ServiceAccount).
    pub node_daemon_kubeconfig: PathBuf,
    /// The scheduler-webhook's HTTPS base URL.
    pub webhook_url: String,
    /// Its metrics URL.
    pub metrics_url: String,
    /// The simulated nodes run by the fake kubelet.
    pub nodes: Vec<NodeHandle>,
    /// The simulated nodes run by the real kubelet ([`KubeletKind::Real`]).
    pub real_nodes: Vec<RealNode>,
    scheduler: Service,
    /// Further scheduler pods (HA), real control plane only.
    replicas: Vec<SchedulerReplica>,
    /// kube-scheduler's configuration from the chart (real control plane).
    scheduler_config: Option<String>,
    plane: Plane,
    /// The admin client, built once: building one reads the kubeconfig and
    /// the system's root certificates.
    client: tokio::sync::OnceCell<kube::Client>,
    tls: (PathBuf, PathBuf),
    dir: tempfile::TempDir,
}

/// A further scheduler pod: a scheduler-webhook and a kube-scheduler under
/// a hostname of their own (as pods of a Deployment have), both candidates
/// for the one Lease.
pub struct SchedulerReplica {
    /// Its hostname, the prefix of its kube-scheduler's Lease identity.
    pub identity: String,
    /// Its scheduler-webhook's metrics URL.
    pub metrics_url: String,
    /// Index of its kube-scheduler in the control plane's schedulers.
    pub kube_scheduler: usize,
    webhook: Service,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("spec", &self.spec)
            .field("webhook_url", &self.webhook_url)
            .finish_non_exhaustive()
    }
}

/// Writes a self-signed certificate for `127.0.0.1`/`localhost`.
fn write_certificate(dir: &Path) -> Result<(PathBuf, PathBuf), ClusterError> {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(|e| start_err("certificate", e))?;
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.signing_key.serialize_pem())?;
    Ok((crt, key))
}

/// This machine's identity as kube-scheduler forms it (its hostname, before
/// the `_<uuid>` it appends to the Lease holder).
pub(crate) fn host_identity() -> String {
    crate::fake_scheduler::config::identity()
        .split('_')
        .next()
        .unwrap_or_default()
        .to_owned()
}

pub(crate) fn start_scheduler_webhook(
    spec: &ClusterSpec,
    identity: &str,
    kubeconfig: &Path,
    tls: &(PathBuf, PathBuf),
    listen: Option<SocketAddr>,
    lease_namespace: Option<&str>,
) -> Result<(Service, SocketAddr, SocketAddr), ClusterError> {
    use scheduler_webhook::serve::{Listeners, run_on};
    use scheduler_webhook::settings::Settings;

    let settings = Settings {
        mode: spec.mode,
        kubeconfig: Some(kubeconfig.to_owned()),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        tls_cert: Some(tls.0.clone()),
        tls_key: Some(tls.1.clone()),
        metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        scheduler_name: SCHEDULER_NAME.to_owned(),
        node_scheduler_policy: (spec.node_policy.parse())
            .map_err(|e| start_err("scheduler-webhook", e))?,
        gpu_scheduler_policy: (spec.gpu_policy.parse())
            .map_err(|e| start_err("scheduler-webhook", e))?,
        identity: Some(identity.to_owned()),
        lease_namespace: lease_namespace
            .map_or_else(|| Settings::default().lease_namespace, ToOwned::to_owned),
        ..Settings::default()
    };
    settings
        .validate()
        .map_err(|e| start_err("scheduler-webhook", e))?;
    let api = std::net::TcpListener::bind(
        listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
    )?;
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?;
    let (api_addr, metrics_addr) = (api.local_addr()?, metrics.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let (kill, kill_rx) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("scheduler-webhook".to_owned())
        .spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let serve = run_on(settings, Listeners { api, metrics }, async {
                    let _ = stopped.await;
                });
                tokio::select! {
                    served = serve => served.map_err(|e| e.to_string()),
                    () = killed(kill_rx) => {
                        // Also stops the HTTP workers' arbiters (their own
                        // threads), dropping the requests they serve.
                        actix_web::rt::System::current().stop();
                        Ok(())
                    }
                }
            })
        })?;
    Ok((
        Service {
            stop: Some(stop),
            kill: Some(kill),
            thread: Some(thread),
        },
        api_addr,
        metrics_addr,
    ))
}

fn start_node_daemon(
    spec: &ClusterSpec,
    kubeconfig: &Path,
    name: &str,
    dir: &Path,
    metrics: Option<SocketAddr>,
) -> Result<(Service, HealthSwitch), ClusterError> {
    use node_daemon::daemon::{Daemon, kube_client, run};
    use node_daemon::settings::{DeviceSourceKind, Settings};

    let node_dir = dir.parent().unwrap_or(dir);
    let settings = Settings {
        kubeconfig: Some(kubeconfig.to_owned()),
        node_name: Some(name.to_owned()),
        mode: match spec.mode {
            Mode::DevicePlugin => node_daemon::settings::Mode::DevicePlugin,
            Mode::Dra => node_daemon::settings::Mode::Dra,
        },
        dra_plugin_dir: node_dir.join("plugins").join(proto::dra::DRIVER_NAME),
        plugin_registry_dir: node_dir.join("plugins_registry"),
        cdi_dir: node_dir.join("cdi"),
        device_plugin_dir: dir.to_owned(),
        device_source: DeviceSourceKind::Simulated,
        simulated_gpus: spec.gpus_per_node,
        simulated_gpu_model: spec.gpu_model.clone(),
        simulated_gpu_memory_mib: spec.gpu_memory_mib,
        device_split_count: spec.split_count,
        operating_mode: spec.operating_mode,
        metrics_bind_address: metrics,
        hook_path: dir.join("hook"),
        ..Settings::default()
    }
    .finish(None)
    .map_err(|e| start_err(format!("node-daemon {name}"), e))?;
    // The simulated source is built here, not inside the daemon, so tests
    // keep its health switch.
    let devices = SimulatedDevices::from_settings(&settings, name);
    let health = devices.health_switch();
    let (stop, stopped) = oneshot::channel::<()>();
    let (kill, kill_rx) = oneshot::channel::<()>();
    let (started_tx, started_rx) = std_mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name(format!("node-daemon-{name}"))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = started_tx.send(Err(e.to_string()));
                    return Err(e.to_string());
                }
            };
            let system = actix::System::with_tokio_rt(move || runtime);
            let _ = started_tx.send(Ok(()));
            system.block_on(async move {
                let serve = async {
                    let client = kube_client(&settings).await?;
                    let daemon = Daemon {
                        settings,
                        devices: std::sync::Arc::new(devices),
                        cluster: std::sync::Arc::new(node_daemon::cluster::kube::KubeCluster::new(
                            client,
                        )),
                    };
                    run(daemon, async {
                        let _ = stopped.await;
                    })
                    .await
                };
                tokio::select! {
                    served = serve => served.map_err(|e| e.to_string()),
                    () = killed(kill_rx) => Ok(()),
                }
            })
        })?;
    started_rx
        .recv()
        .map_err(|_| start_err(format!("node-daemon {name}"), "thread exited early"))?
        .map_err(|e| start_err(format!("node-daemon {name}"), e))?;
    Ok((
        Service {
            stop: Some(stop),
            kill: Some(kill),
            thread: Some(thread),
        },
        health,
    ))
}

/// A `/metrics` page over plain HTTP on loopback.
async fn scrape(url: &str) -> Result<String, ClusterError> {
    use http_body_util::BodyExt as _;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let failed = |e: &dyn std::fmt::Display| start_err(format!("scrape {url}"), e);
    let uri: http::Uri = url.parse().map_err(|e| failed(&e))?;
    let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let response = client.get(uri).await.map_err(|e| failed(&e))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(&e))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Starts each node's fake kubelet (its Kubernetes side with `client`) and
/// node-daemon (with `daemon_kubeconfig`).
async fn start_nodes(
    spec: &ClusterSpec,
    client: &kube::Client,
    daemon_kubeconfig: &Path,
    dir: &Path,
) -> Result<Vec<NodeHandle>, ClusterError> {
    let mut nodes = Vec::with_capacity(spec.nodes);
    for i in 0..spec.nodes {
        let name = format!("gpu-node-{i}");
        let node_dir = dir.join(&name);
        let kubelet = FakeKubelet::start(KubeletConfig {
            dir: node_dir.join("device-plugins"),
            record_dir: Some(node_dir.join("records")),
        })
        .await
        .map_err(|e| start_err(format!("fake-kubelet {name}"), e))?;
        let dra = match spec.mode {
            Mode::DevicePlugin => None,
            Mode::Dra => Some(
                crate::fake_kubelet::dra::DraManager::start(crate::fake_kubelet::dra::DraConfig {
                    registry_dir: node_dir.join("plugins_registry"),
                    cdi_dir: node_dir.join("cdi"),
                })
                .map_err(|e| start_err(format!("fake-kubelet {name}"), e))?,
            ),
        };
        let agent = NodeAgent::start_with_dra(
            &kubelet,
            client.clone(),
            node_config(spec, &name),
            dra.clone(),
        )
        .await
        .map_err(|e| start_err(format!("fake-kubelet {name}"), e))?;
        let metrics = SocketAddr::from(([127, 0, 0, 1], crate::real::control_plane::free_port()?));
        let (daemon, health) = start_node_daemon(
            spec,
            daemon_kubeconfig,
            &name,
            &node_dir.join("device-plugins"),
            Some(metrics),
        )?;
        nodes.push(NodeHandle {
            name,
            dir: node_dir,
            kubelet,
            metrics_url: format!("http://{metrics}/metrics"),
            metrics,
            agent: Some(agent),
            daemon,
            health,
            dra,
        });
    }
    Ok(nodes)
}

/// A node run by the real kubelet ([`KubeletKind::Real`]), with its
/// node-daemon as the kubelet's device plugin.
pub struct RealNode {
    /// Node name.
    pub name: String,
    /// The kubelet and its fake CRI runtime.
    pub kubelet: crate::real::kubelet::RealKubelet,
    /// node-daemon's `/metrics` URL (on 127.0.0.1).
    pub daemon_metrics_url: String,
    daemon: Service,
    health: HealthSwitch,
}

impl RealNode {
    /// Reports the simulated GPU `uuid` healthy or not to the node-daemon.
    pub fn set_gpu_health(&self, uuid: &str, healthy: bool) -> bool {
        self.health.set(uuid, healthy)
    }
}

/// Starts a real kubelet per node (each waits for its Node to be Ready and
/// untainted), then its node-daemon (with `daemon_kubeconfig`, metrics on
/// 127.0.0.1) in the folder the kubelet sees as
/// `/var/lib/kubelet/device-plugins`.
async fn start_real_nodes(
    spec: &ClusterSpec,
    plane: &crate::real::control_plane::ControlPlane,
    daemon_kubeconfig: &Path,
    dir: &Path,
) -> Result<Vec<RealNode>, ClusterError> {
    use crate::real::kubelet::RealKubelet;

    let mut nodes = Vec::with_capacity(spec.nodes);
    for i in 0..spec.nodes {
        let name = format!("gpu-node-{i}");
        let kubelet = RealKubelet::start(plane, &name, &dir.join(&name))
            .await
            .map_err(|e| start_err(format!("kubelet {name}"), e))?;
        let metrics = SocketAddr::from(([127, 0, 0, 1], crate::real::control_plane::free_port()?));
        let (daemon, health) = start_node_daemon(
            spec,
            daemon_kubeconfig,
            &name,
            &kubelet.device_plugin_dir,
            Some(metrics),
        )?;
        nodes.push(RealNode {
            name,
            kubelet,
            daemon_metrics_url: format!("http://{metrics}/metrics"),
            daemon,
            health,
        });
    }
    Ok(nodes)
}

/// The `Allocate` replies the real kubelets checkpointed, per pod UID, in the
/// fake kubelet's record shape (for the checker).
fn checkpointed_allocations(
    nodes: &[RealNode],
    pods: &[Pod],
) -> Result<
    std::collections::HashMap<String, Vec<crate::fake_kubelet::ContainerAllocation>>,
    ClusterError,
> {
    use base64::Engine as _;
    use prost::Message as _;
    use proto::deviceplugin::v1beta1 as api;

    let mut out: std::collections::HashMap<String, Vec<_>> = std::collections::HashMap::new();
    for node in nodes {
        let Some(checkpoint) = node.kubelet.checkpoint()? else {
            continue;
        };
        for e in checkpoint.data.pod_device_entries {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&e.alloc_resp)
                .map_err(std::io::Error::other)?;
            let reply = api::ContainerAllocateResponse::decode(bytes.as_slice())
                .map_err(std::io::Error::other)?;
            let init = pods
                .iter()
                .filter(|p| p.metadata.uid.as_deref() == Some(e.pod_uid.as_str()))
                .filter_map(|p| p.spec.as_ref()?.init_containers.as_ref())
                .flatten()
                .any(|c| c.name == e.container_name);
            out.entry(e.pod_uid.clone()).or_default().push(
                crate::fake_kubelet::ContainerAllocation {
                    container: e.container_name,
                    init,
                    resource: e.resource_name,
                    device_ids: e.device_ids.into_values().flatten().collect(),
                    reply: reply.into(),
                },
            );
        }
    }
    Ok(out)
}

impl Cluster {
    /// Starts every component on the control plane `spec.control_plane`
    /// names.
    ///
    /// # Errors
    /// A [`ClusterError`] naming the component that failed.
    pub async fn start(spec: ClusterSpec) -> Result<Self, ClusterError> {
        // GPUSLICE_KEEP_CLUSTER_DIR=1 keeps the folder (every process's log)
        // after the cluster stops, for a failing test's post-mortem.
        let keep = std::env::var_os("GPUSLICE_KEEP_CLUSTER_DIR").is_some();
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-")
            .disable_cleanup(keep)
            .tempdir()?;
        if keep {
            eprintln!("cluster folder (kept): {}", dir.path().display());
        }
        if spec.mode == Mode::Dra
            && (spec.control_plane != ControlPlaneKind::Real || spec.kubelet != KubeletKind::Fake)
        {
            return Err(start_err(
                "DRA mode",
                "needs the real control plane (kube-scheduler allocates the claims) and the fake kubelet",
            ));
        }
        if spec.kubelet == KubeletKind::Real && spec.control_plane != ControlPlaneKind::Real {
            return Err(start_err(
                "kubelet",
                "the real kubelet needs the real control plane",
            ));
        }
        match spec.control_plane {
            ControlPlaneKind::Fake => Self::start_fake(spec, dir).await,
            ControlPlaneKind::Real => Self::start_real(spec, dir).await,
        }
    }

    async fn start_fake(spec: ClusterSpec, dir: tempfile::TempDir) -> Result<Self, ClusterError> {
        let api = FakeApiServer::start(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(|e| start_err("fake-apiserver", e))?;
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)
            .map_err(|e| start_err("fake-apiserver", e))?;
        let client = api
            .client()
            .await
            .map_err(|e| start_err("fake-apiserver", e))?;
        let tls = write_certificate(dir.path())?;

        let (scheduler, api_addr, metrics_addr) =
            start_scheduler_webhook(&spec, &host_identity(), &kubeconfig, &tls, None, None)?;
        let webhook_url = format!("https://{api_addr}");
        // kube-apiserver calls our webhook on every pod CREATE, trusting our CA,
        // as the chart's MutatingWebhookConfiguration (failurePolicy Fail) says.
        api.add_mutating_webhook(MutatingWebhook {
            name: "vgpu.hami.io".to_owned(),
            url: format!("{webhook_url}/webhook"),
            ca_bundle: std::fs::read_to_string(&tls.0)?,
            failure_policy: FailurePolicy::Fail,
            timeout: Duration::from_secs(10),
        })
        .map_err(|e| start_err("admission webhook", e))?;

        let names = proto::hami::resources::ResourceNames::default();
        let extender = ExtenderConfig::hami(&webhook_url, &names.all());
        let fake_scheduler = FakeScheduler::start(
            client.clone(),
            SchedulerConfig::new(SCHEDULER_NAME, Some(extender)),
        )
        .await
        .map_err(|e| start_err("fake-scheduler", e))?;
        let nodes = start_nodes(&spec, &client, &kubeconfig, dir.path()).await?;
        Ok(Self {
            spec,
            webhook_kubeconfig: kubeconfig.clone(),
            node_daemon_kubeconfig: kubeconfig.clone(),
            kubeconfig,
            webhook_url,
            metrics_url: format!("http://{metrics_addr}/metrics"),
            nodes,
            real_nodes: Vec::new(),
            replicas: Vec::new(),
            scheduler_config: None,
            scheduler,
            plane: Plane::Fake {
                api,
                scheduler: Some(fake_scheduler),
            },
            client: tokio::sync::OnceCell::new(),
            tls,
            dir,
        })
    }

    async fn start_real(spec: ClusterSpec, dir: tempfile::TempDir) -> Result<Self, ClusterError> {
        use crate::real::control_plane::{ControlPlane, SCHEDULER_ALWAYS_ALLOW};
        use crate::real::{binaries::Binaries, install};

        let binaries = Binaries::find().map_err(|missing| {
            start_err(
                "real control plane",
                format!(
                    "not built ({} missing); run integration/k8s/build.sh",
                    missing.join(", ")
                ),
            )
        })?;
        let options = crate::real::control_plane::Options {
            api_audit: spec.api_audit,
            ..Default::default()
        };
        let mut plane =
            ControlPlane::start_with(binaries, &dir.path().join("control-plane"), &options)
                .await
                .map_err(|e| start_err("real control plane", e))?;
        let webhook_addr =
            SocketAddr::from(([127, 0, 0, 1], crate::real::control_plane::free_port()?));
        let mut sets = vec![
            format!("schedulerName={SCHEDULER_NAME}"),
            format!(
                "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy={}",
                spec.node_policy
            ),
            format!(
                "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy={}",
                spec.gpu_policy
            ),
        ];
        sets.push(format!(
            "devicePlugin.deviceSplitCount={}",
            spec.split_count
        ));
        sets.push(format!("mode={}", spec.mode.as_str()));
        let installed = install::install(&plane, webhook_addr.port(), &sets, dir.path())
            .await
            .map_err(|e| start_err("chart", e))?;
        let kubeconfig = plane.admin_kubeconfig.clone();
        let client = plane
            .admin_client()
            .await
            .map_err(|e| start_err("kube-apiserver", e))?;
        let (scheduler, api_addr, metrics_addr) = start_scheduler_webhook(
            &spec,
            &host_identity(),
            &installed.scheduler_kubeconfig,
            &installed.tls,
            Some(webhook_addr),
            // As the chart passes `--lease-namespace`: the service's
            // ServiceAccount may take Leases only in the release namespace.
            Some(install::NAMESPACE),
        )?;
        match &installed.scheduler_config {
            // kube-scheduler runs in the scheduler pod beside
            // scheduler-webhook, as the same ServiceAccount, with the
            // chart's configuration.
            Some(config) => {
                plane
                    .start_scheduler_with(
                        config,
                        &installed.scheduler_kubeconfig,
                        None,
                        &[SCHEDULER_ALWAYS_ALLOW.to_owned()],
                    )
                    .map_err(|e| start_err("kube-scheduler", e))?;
            }
            // DRA mode: the cluster's own kube-scheduler (default profile,
            // its own identity) allocates the claims.
            None => {
                let kubeconfig = plane
                    .certificate_kubeconfig("kube-scheduler", "system:kube-scheduler", &[])
                    .map_err(|e| start_err("kube-scheduler", e))?;
                plane
                    .start_scheduler_with(
                        DEFAULT_SCHEDULER_CONFIG,
                        &kubeconfig,
                        None,
                        &[SCHEDULER_ALWAYS_ALLOW.to_owned()],
                    )
                    .map_err(|e| start_err("kube-scheduler", e))?;
            }
        }
        let (nodes, real_nodes) = match spec.kubelet {
            KubeletKind::Fake => (
                start_nodes(
                    &spec,
                    &client,
                    &installed.node_daemon_kubeconfig,
                    dir.path(),
                )
                .await?,
                Vec::new(),
            ),
            KubeletKind::Real => (
                Vec::new(),
                start_real_nodes(&spec, &plane, &installed.node_daemon_kubeconfig, dir.path())
                    .await?,
            ),
        };
        Ok(Self {
            spec,
            kubeconfig,
            webhook_kubeconfig: installed.scheduler_kubeconfig,
            node_daemon_kubeconfig: installed.node_daemon_kubeconfig,
            webhook_url: format!("https://{api_addr}"),
            metrics_url: format!("http://{metrics_addr}/metrics"),
            nodes,
            real_nodes,
            scheduler,
            replicas: Vec::new(),
            scheduler_config: installed.scheduler_config,
            plane: Plane::Real(Box::new(plane)),
            client: tokio::sync::OnceCell::new(),
            tls: installed.tls,
            dir,
        })
    }

    /// The fake apiserver, when the cluster runs on the stand-ins (for fault
    /// injection and request counts).
    #[must_use]
    pub fn fake_api(&self) -> Option<&FakeApiServer> {
        match &self.plane {
            Plane::Fake { api, .. } => Some(api),
            Plane::Real(_) => None,
        }
    }

    /// The real control plane, when the cluster runs on it.
    #[must_use]
    pub fn real_control_plane(&self) -> Option<&crate::real::control_plane::ControlPlane> {
        match &self.plane {
            Plane::Fake { .. } => None,
            Plane::Real(plane) => Some(plane),
        }
    }

    /// What runs the cluster: `(kube-apiserver, kube-scheduler, kubelet)`
    /// versions, or "stand-in".
    pub async fn control_plane_versions(&self) -> (String, String, String) {
        const STAND_IN: &str = "stand-in";
        match &self.plane {
            Plane::Fake { .. } => (STAND_IN.into(), STAND_IN.into(), STAND_IN.into()),
            Plane::Real(plane) => (
                plane
                    .apiserver_version()
                    .await
                    .unwrap_or_else(|e| format!("unknown: {e}")),
                plane.binary_version("kube-scheduler"),
                if self.real_nodes.is_empty() {
                    STAND_IN.into()
                } else {
                    plane.binary_version("kubelet")
                },
            ),
        }
    }

    /// A kube client for the cluster (cluster-admin on the real control
    /// plane).
    ///
    /// # Errors
    /// The client cannot be built.
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        self.client
            .get_or_try_init(|| self.new_client())
            .await
            .cloned()
    }

    async fn new_client(&self) -> Result<kube::Client, ClusterError> {
        match &self.plane {
            Plane::Fake { api, .. } => api
                .client()
                .await
                .map_err(|e| start_err("fake-apiserver", e)),
            Plane::Real(plane) => plane
                .admin_client()
                .await
                .map_err(|e| start_err("kube-apiserver", e)),
        }
    }

    /// Waits until every node advertises its GPUs (register annotation and
    /// allocatable) and the scheduler holds its Lease with synced caches.
    ///
    /// # Errors
    /// Not ready within a minute.
    pub async fn wait_until_ready(&self) -> Result<(), ClusterError> {
        if self.spec.mode == Mode::Dra {
            return self.wait_until_dra_ready().await;
        }
        let client = self.client().await?;
        let want = self.spec.nodes;
        let nodes_client = client.clone();
        crate::harness::wait_for_list(
            Api::<k8s_openapi::api::core::v1::Node>::all(nodes_client),
            kube::runtime::watcher::Config::default(),
            "nodes to register their GPUs",
            Duration::from_secs(60),
            |nodes| {
                nodes
                    .iter()
                    .filter(|n| {
                        let registered = n.metadata.annotations.as_ref().is_some_and(|a| {
                            a.contains_key(proto::hami::keys::NODE_NVIDIA_REGISTER)
                        });
                        let allocatable = n
                            .status
                            .as_ref()
                            .and_then(|s| s.allocatable.as_ref())
                            .and_then(|a| a.get(GPU_RESOURCE))
                            .is_some_and(|q| q.0 != "0");
                        registered && allocatable
                    })
                    .count()
                    >= want
            },
        )
        .await
        .map_err(|e| start_err("nodes", e))?;
        match &self.plane {
            Plane::Fake {
                scheduler: Some(s), ..
            } => s
                .wait_for(Duration::from_secs(60), |st| {
                    let gpu_nodes = st
                        .node_allocatable
                        .values()
                        .filter(|a| a.get(GPU_RESOURCE).is_some_and(|&m| m > 0))
                        .count();
                    st.leader && st.synced && gpu_nodes >= want
                })
                .await
                .map(drop)
                .map_err(|e| start_err("fake-scheduler", e))?,
            Plane::Fake {
                scheduler: None, ..
            } => {}
            Plane::Real(_) => {
                // kube-scheduler leads once it holds its Lease (named after
                // the scheduler, in the release namespace).
                use k8s_openapi::api::coordination::v1::Lease;
                let leases: Api<Lease> = Api::namespaced(client, crate::real::install::NAMESPACE);
                crate::harness::wait_for_object(
                    leases,
                    SCHEDULER_NAME,
                    Duration::from_secs(90),
                    |l: &Lease| {
                        l.spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.as_ref())
                            .is_some_and(|h| !h.is_empty())
                    },
                )
                .await
                .map_err(|e| {
                    start_err(
                        "kube-scheduler",
                        format!(
                            "{e}; {}",
                            self.real_control_plane()
                                .map(|p| p.logs())
                                .unwrap_or_default()
                        ),
                    )
                })?;
                self.wait_for_kube_scheduler_nodes(want).await?;
            }
        }
        Ok(())
    }

    /// Waits until kube-scheduler 0's node cache holds `want` nodes
    /// (`scheduler_cache_size{type="nodes"}`, refreshed every
    /// second), so pods created next are not refused for want of a node
    /// its watch has not delivered yet. The count does not say which
    /// version of a node the cache holds; a pod refused on a version
    /// without GPUs is retried on the node's update, as kube-scheduler
    /// requeues it. A metrics page cannot be watched, so it is polled.
    async fn wait_for_kube_scheduler_nodes(&self, want: usize) -> Result<(), ClusterError> {
        const SERIES: &str = "scheduler_cache_size{type=\"nodes\"}";
        let Some(plane) = self.real_control_plane() else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let last = match plane.scheduler_metrics(0).await {
                Ok(page) => match crate::prometheus::gauge(&page, SERIES) {
                    #[allow(clippy::cast_precision_loss)]
                    Some(nodes) if nodes >= want as f64 => return Ok(()),
                    Some(nodes) => format!("{SERIES} is {nodes}"),
                    None => format!("no {SERIES} on its /metrics yet"),
                },
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(start_err(
                    "kube-scheduler",
                    format!(
                        "its cache did not hold {want} nodes within 60 s: {last}; {}",
                        plane.logs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// DRA mode: every node's fake kubelet has the driver registered and
    /// its ResourceSlice lists every GPU, and kube-scheduler holds its Lease.
    async fn wait_until_dra_ready(&self) -> Result<(), ClusterError> {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::resource::v1::ResourceSlice;

        let client = self.client().await?;
        for node in &self.nodes {
            if let Some(dra) = &node.dra {
                dra.wait_registered(proto::dra::DRIVER_NAME, Duration::from_secs(60))
                    .await
                    .map_err(|e| start_err(format!("fake-kubelet {}", node.name), e))?;
            }
        }
        let (want_nodes, want_gpus) = (self.spec.nodes, self.spec.gpus_per_node as usize);
        crate::harness::wait_for_list(
            Api::<ResourceSlice>::all(client.clone()),
            kube::runtime::watcher::Config::default(),
            "ResourceSlices of every node",
            Duration::from_secs(60),
            |slices| {
                slices
                    .iter()
                    .filter(|s| s.spec.driver == proto::dra::DRIVER_NAME)
                    .filter(|s| s.spec.devices.as_ref().map_or(0, Vec::len) >= want_gpus)
                    .count()
                    >= want_nodes
            },
        )
        .await
        .map_err(|e| start_err("node-daemon", e))?;
        crate::harness::wait_for_object(
            Api::<Lease>::namespaced(client, "kube-system"),
            "kube-scheduler",
            Duration::from_secs(90),
            |l: &Lease| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_ref())
                    .is_some_and(|h| !h.is_empty())
            },
        )
        .await
        .map_err(|e| start_err("kube-scheduler", e))?;
        self.wait_for_kube_scheduler_nodes(want_nodes).await
    }

    /// Runs the independent checker over what the API server shows now;
    /// returns the report with the pods it looked at.
    ///
    /// # Errors
    /// The list calls failed.
    pub async fn check(&self) -> Result<(crate::checker::Report, Vec<Pod>), ClusterError> {
        let client = self.client().await?;
        let params = kube::api::ListParams::default();
        let mut pods = Api::<Pod>::all(client.clone()).list(&params).await?.items;
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .list(&params)
            .await?
            .items;
        // The real kubelet keeps the Allocate replies in its checkpoint, not
        // on the pod: hand them to the checker as the fake kubelet records
        // them.
        let mut replies = checkpointed_allocations(&self.real_nodes, &pods)?;
        for pod in &mut pods {
            if let Some(records) = pod.metadata.uid.as_ref().and_then(|u| replies.remove(u)) {
                let json = serde_json::to_string(&records).map_err(std::io::Error::other)?;
                pod.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(crate::fake_kubelet::ALLOCATIONS_ANNOTATION.to_owned(), json);
            }
        }
        if self.spec.mode == Mode::Dra {
            use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
            let claims = Api::<ResourceClaim>::all(client.clone())
                .list(&params)
                .await?
                .items;
            let slices = Api::<ResourceSlice>::all(client).list(&params).await?.items;
            let report = crate::checker::check_with_dra(&pods, &nodes, &claims, &slices);
            return Ok((report, pods));
        }
        Ok((crate::checker::check(&pods, &nodes), pods))
    }

    /// The scheduler-webhook's `/metrics` text, scraped now.
    ///
    /// # Errors
    /// The scrape failed.
    pub async fn metrics(&self) -> Result<String, ClusterError> {
        scrape(&self.metrics_url).await
    }

    /// The live dashboard: the scheduler-webhook's metrics port, `/ui/`.
    #[must_use]
    pub fn dashboard_url(&self) -> String {
        format!("{}/ui/", self.metrics_url.trim_end_matches("/metrics"))
    }

    /// A `/metrics` page (any component's, on loopback), scraped now.
    ///
    /// # Errors
    /// The page could not be read.
    pub async fn scrape(url: &str) -> Result<String, ClusterError> {
        scrape(url).await
    }

    /// A scheduler replica's `/metrics` text, scraped now (see
    /// [`Cluster::add_scheduler_replica`]).
    ///
    /// # Errors
    /// There is no replica `i`, or the scrape failed.
    pub async fn replica_metrics(&self, i: usize) -> Result<String, ClusterError> {
        let replica = self
            .replicas
            .get(i)
            .ok_or_else(|| start_err("scheduler replica", format!("no replica {i}")))?;
        scrape(&replica.metrics_url).await
    }

    /// The fake scheduler's counters.
    #[must_use]
    pub fn scheduler_stats(&self) -> crate::fake_scheduler::Stats {
        match &self.plane {
            Plane::Fake {
                scheduler: Some(s), ..
            } => s.stats(),
            _ => crate::fake_scheduler::Stats::default(),
        }
    }

    /// Creates a pod the way `kubectl apply` would. The API server runs the
    /// mutating webhook on it when admission is configured.
    ///
    /// # Errors
    /// The API server refused it.
    pub async fn create_pod(&self, pod: &Pod) -> Result<Pod, ClusterError> {
        let client = self.client().await?;
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let api: Api<Pod> = Api::namespaced(client, &namespace);
        Ok(api.create(&PostParams::default(), pod).await?)
    }

    /// Starts a further scheduler pod on the real control plane (HA, as the
    /// chart's `scheduler.replicas` > 1): a scheduler-webhook with identity
    /// `gpuslice-replica-<n>` and a kube-scheduler with the chart's
    /// configuration pointed at that webhook, in its own UTS namespace with
    /// that hostname (so its Lease identity differs, as a pod's would). Only
    /// the Lease holder schedules; returns the replica's index.
    ///
    /// # Errors
    /// Not on the real control plane, or a process did not start.
    pub fn add_scheduler_replica(&mut self) -> Result<usize, ClusterError> {
        let n = self.replicas.len() + 1;
        let identity = format!("gpuslice-replica-{n}");
        let (Plane::Real(plane), Some(config)) = (&mut self.plane, &self.scheduler_config) else {
            return Err(start_err(
                "scheduler replica",
                "only on the real control plane",
            ));
        };
        let (webhook, api_addr, metrics_addr) = start_scheduler_webhook(
            &self.spec,
            &identity,
            &self.webhook_kubeconfig,
            &self.tls,
            None,
            Some(crate::real::install::NAMESPACE),
        )?;
        let first = self.webhook_url.trim_start_matches("https://");
        let config = config.replace(&format!("https://{first}"), &format!("https://{api_addr}"));
        let kube_scheduler = plane
            .start_scheduler(&config, &self.webhook_kubeconfig, Some(&identity))
            .map_err(|e| start_err("kube-scheduler", e))?;
        self.replicas.push(SchedulerReplica {
            identity,
            metrics_url: format!("http://{metrics_addr}/metrics"),
            kube_scheduler,
            webhook,
        });
        Ok(n - 1)
    }

    /// The further scheduler pods started so far.
    #[must_use]
    pub fn scheduler_replicas(&self) -> &[SchedulerReplica] {
        &self.replicas
    }

    /// Kills (SIGKILL) kube-scheduler `i` of the real control plane (0 is the
    /// first pod's); its Lease expires and another replica takes over.
    ///
    /// # Errors
    /// Not on the real control plane, or no such kube-scheduler.
    pub fn kill_kube_scheduler(&mut self, i: usize) -> Result<(), ClusterError> {
        match &mut self.plane {
            Plane::Real(plane) => plane
                .schedulers
                .get_mut(i)
                .map(crate::real::control_plane::Process::kill)
                .ok_or_else(|| start_err("kube-scheduler", format!("no kube-scheduler {i}"))),
            Plane::Fake { .. } => Err(start_err(
                "kube-scheduler",
                "only on the real control plane",
            )),
        }
    }

    /// The real kube-apiserver's requests so far by client, verb and
    /// resource; `None` unless [`ClusterSpec::api_audit`] on the real
    /// control plane.
    ///
    /// # Errors
    /// The audit log could not be read.
    pub fn api_audit(&self) -> Option<Result<crate::real::audit::Tally, ClusterError>> {
        self.real_control_plane()?
            .audit_log()
            .map(|r| r.map_err(|e| start_err("kube-apiserver audit log", e)))
    }

    /// How often the kubelet would have restarted the real control plane's
    /// kube-schedulers so far (each exits when it loses its Lease); 0 on
    /// the fake control plane.
    #[must_use]
    pub fn kube_scheduler_restarts(&self) -> u32 {
        match &self.plane {
            Plane::Real(plane) => plane
                .schedulers
                .iter()
                .map(crate::real::control_plane::Process::restarts)
                .sum(),
            Plane::Fake { .. } => 0,
        }
    }

    /// Stops the scheduler-webhook and starts it again on the same port (its
    /// model is rebuilt from the API server).
    ///
    /// # Errors
    /// It could not stop cleanly or start again.
    pub fn restart_scheduler_webhook(&mut self) -> Result<(), ClusterError> {
        self.scheduler
            .stop()
            .map_err(|e| start_err("scheduler-webhook", e))?;
        self.revive_scheduler_webhook()
    }

    /// Kills the scheduler-webhook without a drain (see [`Cluster::kill_node_daemon`]
    /// for what "kill" means in process): in-flight admissions, filters and
    /// binds are cut where they stand. [`Cluster::revive_scheduler_webhook`]
    /// starts it again.
    ///
    /// # Errors
    /// Its thread ended with an error before the kill.
    pub fn kill_scheduler_webhook(&mut self) -> Result<(), ClusterError> {
        self.scheduler
            .kill()
            .map_err(|e| start_err("scheduler-webhook", e))
    }

    /// The namespace of the service's Lease: the chart's release namespace on
    /// the real control plane (its RBAC allows Leases only there), the
    /// service's default on the stand-ins.
    fn lease_namespace(&self) -> Option<&'static str> {
        match self.plane {
            Plane::Real(_) => Some(crate::real::install::NAMESPACE),
            Plane::Fake { .. } => None,
        }
    }

    /// Starts the scheduler-webhook again on its port if it was stopped or
    /// killed (a no-op if it runs).
    ///
    /// # Errors
    /// It could not start.
    pub fn revive_scheduler_webhook(&mut self) -> Result<(), ClusterError> {
        if self.scheduler.is_running() {
            return Ok(());
        }
        let addr: SocketAddr = self
            .webhook_url
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| start_err("scheduler-webhook", e))?;
        let kubeconfig = self.webhook_kubeconfig.clone();
        let (service, _, metrics) = start_scheduler_webhook(
            &self.spec,
            &host_identity(),
            &kubeconfig,
            &self.tls,
            Some(addr),
            self.lease_namespace(),
        )?;
        self.scheduler = service;
        self.metrics_url = format!("http://{metrics}/metrics");
        Ok(())
    }

    /// Stops node `i`'s daemon and starts it again (it rebuilds its ledgers
    /// from the pods on the node before serving).
    ///
    /// # Errors
    /// It could not stop cleanly or start again.
    pub fn restart_node_daemon(&mut self, i: usize) -> Result<(), ClusterError> {
        let node = self.node(i)?;
        node.daemon
            .stop()
            .map_err(|e| start_err(format!("node-daemon {}", node.name), e))?;
        self.revive_node_daemon(i)
    }

    /// Kills node `i`'s daemon without a drain, the in-process stand-in for
    /// `kill -9`: the daemon's future is dropped at whatever await it was in
    /// (an Allocate half done stays half done: annotations written or not,
    /// the reply never sent), then its runtime with every task on it. What
    /// differs from a killed process: destructors run, so files a guard
    /// removes on drop are removed. [`Cluster::revive_node_daemon`] starts
    /// it again.
    ///
    /// # Errors
    /// There is no node `i`, or its thread had ended with an error.
    pub fn kill_node_daemon(&mut self, i: usize) -> Result<(), ClusterError> {
        let node = self.node(i)?;
        node.daemon
            .kill()
            .map_err(|e| start_err(format!("node-daemon {}", node.name), e))
    }

    /// Starts node `i`'s daemon again if it was stopped or killed (a no-op
    /// if it runs). Its simulated GPUs start healthy, as a restarted
    /// daemon's NVML would report GPUs that recovered.
    ///
    /// # Errors
    /// There is no node `i`, or it could not start.
    pub fn revive_node_daemon(&mut self, i: usize) -> Result<(), ClusterError> {
        let spec = self.spec.clone();
        let kubeconfig = self.node_daemon_kubeconfig.clone();
        let node = self.node(i)?;
        if node.daemon.is_running() {
            return Ok(());
        }
        (node.daemon, node.health) = start_node_daemon(
            &spec,
            &kubeconfig,
            &node.name,
            &node.dir.join("device-plugins"),
            Some(node.metrics),
        )?;
        Ok(())
    }

    /// Kills node `i`'s fake kubelet, both halves, without a drain: its pod
    /// sync stops (bound pods are neither admitted nor given a status), its
    /// registration server and plugin connections drop, and its device
    /// table is gone from memory; the checkpoint file stays, and so does
    /// `kubelet.sock` on disk (nobody listens). [`Cluster::revive_kubelet`]
    /// starts a new one from the checkpoint, as a restarted kubelet does.
    ///
    /// # Errors
    /// There is no node `i`.
    pub async fn kill_kubelet(&mut self, i: usize) -> Result<(), ClusterError> {
        self.pause_node_agent(i).await?;
        self.node(i)?.kubelet.kill().await;
        Ok(())
    }

    /// Starts node `i`'s kubelet again after [`Cluster::kill_kubelet`]: a
    /// new fake kubelet reads the checkpoint, wipes the sockets (node-daemon
    /// takes that as the signal to register again) and serves
    /// `kubelet.sock`; its pod sync lists the node's pods and admits those
    /// not admitted yet. A no-op for a kubelet that runs.
    ///
    /// # Errors
    /// There is no node `i`, or the kubelet could not start.
    pub async fn revive_kubelet(&mut self, i: usize) -> Result<(), ClusterError> {
        let node = self.node(i)?;
        if node.kubelet.is_killed() {
            let config = node.kubelet.config().clone();
            node.kubelet = FakeKubelet::start(config)
                .await
                .map_err(|e| start_err(format!("fake-kubelet {}", node.name), e))?;
        }
        self.resume_node_agent(i).await
    }

    fn node(&mut self, i: usize) -> Result<&mut NodeHandle, ClusterError> {
        self.nodes
            .get_mut(i)
            .ok_or_else(|| start_err("node", format!("no node {i}")))
    }

    /// Stops node `i`'s kubelet from seeing its pods: pods bound to the node
    /// are neither admitted (no Allocate) nor given a status until
    /// [`Cluster::resume_node_agent`], like a kubelet that is slow or cut
    /// off from the API server. Its device-plugin side keeps running.
    ///
    /// # Errors
    /// There is no node `i`.
    pub async fn pause_node_agent(&mut self, i: usize) -> Result<(), ClusterError> {
        let node = self
            .nodes
            .get_mut(i)
            .ok_or_else(|| start_err("fake-kubelet", format!("no node {i}")))?;
        if let Some(agent) = node.agent.take() {
            agent.shutdown().await;
        }
        Ok(())
    }

    /// Starts node `i`'s kubelet pod sync again (a no-op if it runs): it
    /// lists the node's pods and admits those not admitted yet.
    ///
    /// # Errors
    /// There is no node `i`, or the node cannot be registered.
    pub async fn resume_node_agent(&mut self, i: usize) -> Result<(), ClusterError> {
        let client = self.client().await?;
        let spec = self.spec.clone();
        let node = self
            .nodes
            .get_mut(i)
            .ok_or_else(|| start_err("fake-kubelet", format!("no node {i}")))?;
        if node.agent.is_none() {
            let agent = NodeAgent::start_with_dra(
                &node.kubelet,
                client,
                node_config(&spec, &node.name),
                node.dra.clone(),
            )
            .await
            .map_err(|e| start_err(format!("fake-kubelet {}", node.name), e))?;
            node.agent = Some(agent);
        }
        Ok(())
    }

    /// Where the cluster keeps its files (sockets, records, kubeconfig).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops everything, removes every socket and file.
    pub async fn shutdown(mut self) {
        if let Plane::Fake { scheduler, .. } = &mut self.plane
            && let Some(s) = scheduler.take()
        {
            s.shutdown().await;
        }
        for node in &mut self.nodes {
            let _ = node.daemon.stop();
            if let Some(agent) = node.agent.take() {
                agent.shutdown().await;
            }
        }
        for node in self.nodes.drain(..) {
            node.kubelet.shutdown().await;
        }
        // node-daemon first, then the kubelet (dropping it kills it).
        for mut node in self.real_nodes.drain(..) {
            let _ = node.daemon.stop();
        }
        let _ = self.scheduler.stop();
        for mut replica in self.replicas.drain(..) {
            let _ = replica.webhook.stop();
        }
        match self.plane {
            Plane::Fake { api, .. } => api.shutdown().await,
            // Dropping the processes kills them.
            Plane::Real(plane) => drop(plane),
        }
    }
}

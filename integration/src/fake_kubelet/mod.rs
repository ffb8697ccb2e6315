//! fake-kubelet: a stand-in for one node's kubelet as a device plugin sees it.
//!
//! It serves `Registration` on `<dir>/kubelet.sock`, dials each registering
//! plugin, follows its `ListAndWatch` stream, and admits pods **one at a
//! time** the way kubelet's device manager does (init containers first, one
//! `GetPreferredAllocation` when advertised and one `Allocate` per container
//! and resource). Results are kubelet's: `Running`, or `Failed` with reason
//! `UnexpectedAdmissionError` and kubelet's message. A restart wipes the
//! sockets in the folder and keeps allocations (the checkpoint), so plugins
//! must register again.
//!
//! Layout:
//! - [`devices`] — the device table (pure): health, free/used IDs, choosing.
//! - [`admission`] — reading pods (pure): container order, requests, batches.
//! - [`record`] — the allocation record (JSON file per pod, pod annotation).
//! - [`checkpoint`] — `kubelet_internal_checkpoint`.
//! - `manager` — the state owner task and the serial admission worker.
//! - [`registration`] — the gRPC server and plugin connections.
//! - `podresources` — the pod-resources API (`List`, `Get`,
//!   `GetAllocatableResources`) from the same state, when
//!   [`Options::pod_resources_socket`] is set.
//! - [`dra`] — the DRA manager: plugin watcher on `plugins_registry`,
//!   `NodePrepareResources` before a pod's containers start,
//!   `NodeUnprepareResources` after it ends; [`cdi`] resolves the CDI
//!   devices a container gets into its env and mounts.
//! - [`node`] — the Kubernetes side (node status, pod watch, pod status) over
//!   any apiserver through `kube::Client`.
//!
//! Pods reach admission through [`FakeKubelet::admit`] /
//! [`FakeKubelet::admit_batch`] — the pod watcher in [`node`] uses the same
//! entry point.

pub mod admission;
pub mod cdi;
pub mod checkpoint;
pub mod devices;
pub mod dra;
mod error;
mod manager;
pub mod node;
mod podresources;
pub mod record;
pub mod registration;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::{Error, Result};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use devices::ResourceCount;
pub use manager::NodeDevices;
pub use record::{
    ALLOCATIONS_ANNOTATION, ContainerAllocation, Outcome, PodAdmission, UNEXPECTED_ADMISSION_ERROR,
};

use manager::{Batch, StateHandle};
use registration::RegistrationHandle;

/// Where the fake kubelet keeps its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The device-plugins folder: `kubelet.sock`, plugin sockets and the
    /// checkpoint live here.
    pub dir: PathBuf,
    /// Folder for `<namespace>_<pod>.json` admission records, if any.
    pub record_dir: Option<PathBuf>,
}

/// Tunables with kubelet's values as defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// How long `Register` keeps dialling the plugin's socket (10 s).
    pub dial_timeout: Duration,
    /// Where to serve the pod-resources API (kubelet:
    /// `/var/lib/kubelet/pod-resources/kubelet.sock`); not served if `None`.
    pub pod_resources_socket: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dial_timeout: registration::DIAL_TIMEOUT,
            pod_resources_socket: None,
        }
    }
}

/// A running fake kubelet (device manager part). Dropping it stops it.
pub struct FakeKubelet {
    config: Config,
    options: Options,
    state: StateHandle,
    batches: mpsc::UnboundedSender<Batch>,
    devices: watch::Receiver<NodeDevices>,
    server: Option<RegistrationHandle>,
    pod_resources: Option<podresources::PodResourcesHandle>,
    tasks: Vec<JoinHandle<()>>,
}

// === impl FakeKubelet ===

impl FakeKubelet {
    /// Starts like kubelet: reads the checkpoint in `config.dir` (if any),
    /// wipes the sockets there, and serves `Registration` on `kubelet.sock`.
    pub async fn start(config: Config) -> Result<Self> {
        Self::start_with(config, Options::default()).await
    }

    /// [`FakeKubelet::start`] with non-default [`Options`].
    pub async fn start_with(config: Config, options: Options) -> Result<Self> {
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { what, path, source }
        };
        std::fs::create_dir_all(&config.dir).map_err(io("creating", &config.dir))?;
        let checkpoint_path = config.dir.join(checkpoint::CHECKPOINT_FILE);
        let table = checkpoint::Checkpoint::read(&checkpoint_path)
            .map_err(io("reading", &checkpoint_path))?
            .map(|c| c.restore())
            .unwrap_or_default();
        registration::wipe_sockets(&config.dir).map_err(io("wiping sockets in", &config.dir))?;

        let (state, devices, state_task) = manager::spawn_state(table, checkpoint_path);
        let (batches, batch_rx) = mpsc::unbounded_channel();
        let worker = tokio::spawn(manager::run_admissions(
            batch_rx,
            state.clone(),
            config.record_dir.clone(),
        ));
        let server = RegistrationHandle::start(&config.dir, state.clone(), options.dial_timeout)
            .map_err(io("binding", &config.dir))?;
        let pod_resources = match &options.pod_resources_socket {
            Some(socket) => Some(
                podresources::PodResourcesHandle::start(socket, state.clone())
                    .map_err(io("serving pod-resources on", socket))?,
            ),
            None => None,
        };
        Ok(Self {
            config,
            options,
            state,
            batches,
            devices,
            server: Some(server),
            pod_resources,
            tasks: vec![state_task, worker],
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Path of `kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.config
            .dir
            .join(proto::deviceplugin::v1beta1::KUBELET_SOCKET)
    }

    /// Admits one pod through the serial queue and returns its outcome.
    pub async fn admit(&self, pod: Pod) -> Result<PodAdmission> {
        self.admit_batch(vec![pod])
            .await?
            .pop()
            .ok_or(Error::Stopped)
    }

    /// Admits a batch (sorted by creation time, one pod at a time) and
    /// returns the outcomes in admission order.
    pub async fn admit_batch(&self, pods: Vec<Pod>) -> Result<Vec<PodAdmission>> {
        let rx = self.submit(pods)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Queues a batch without waiting; the receiver yields the outcomes.
    pub fn submit(&self, pods: Vec<Pod>) -> Result<oneshot::Receiver<Vec<PodAdmission>>> {
        let (reply, rx) = oneshot::channel();
        self.batches
            .send(Batch { pods, reply })
            .map_err(|_| Error::Stopped)?;
        Ok(rx)
    }

    /// A handle that can queue batches and free pods from other tasks.
    pub fn admitter(&self) -> Admitter {
        Admitter {
            batches: self.batches.clone(),
            state: self.state.clone(),
        }
    }

    /// Frees every device the pod with `uid` holds (the pod was deleted or
    /// finished). Returns whether it held any.
    pub async fn remove_pod(&self, uid: &str) -> Result<bool> {
        self.admitter().remove_pod(uid).await
    }

    /// The current device view.
    pub fn devices(&self) -> NodeDevices {
        self.devices.borrow().clone()
    }

    /// A receiver of device-view snapshots (changes only).
    pub fn watch_devices(&self) -> watch::Receiver<NodeDevices> {
        self.devices.clone()
    }

    /// Waits until `condition` holds for the device view, or `deadline` passes.
    pub async fn wait_devices(
        &self,
        deadline: Duration,
        what: &'static str,
        condition: impl FnMut(&NodeDevices) -> bool,
    ) -> Result<NodeDevices> {
        let mut rx = self.devices.clone();
        match tokio::time::timeout(deadline, rx.wait_for(condition)).await {
            Ok(Ok(view)) => Ok(view.clone()),
            Ok(Err(_)) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout(deadline, what)),
        }
    }

    /// Restarts like kubelet: drops plugin connections and the registration
    /// server, forgets devices (capacity reads 0), wipes the sockets in the
    /// folder and serves `kubelet.sock` again. Allocations stay.
    pub async fn restart(&mut self) -> Result<()> {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        self.state.with(manager::State::restart).await?;
        let dir = self.config.dir.clone();
        registration::wipe_sockets(&dir).map_err(|source| Error::Io {
            what: "wiping sockets in",
            path: dir.clone(),
            source,
        })?;
        let server = RegistrationHandle::start(&dir, self.state.clone(), self.options.dial_timeout)
            .map_err(|source| Error::Io {
                what: "binding",
                path: dir.clone(),
                source,
            })?;
        self.server = Some(server);
        Ok(())
    }

    /// Dies as a killed kubelet process would: the registration and
    /// pod-resources servers, the admission worker and the device table
    /// (with every plugin connection) stop where they stand. Files stay:
    /// the checkpoint as last written, and `kubelet.sock` with nobody
    /// listening. Start a new [`FakeKubelet`] on the same folder to
    /// restart it; this one only answers [`Error::Stopped`] from now on.
    pub async fn kill(&mut self) {
        // Dropping the handles aborts their servers without a graceful stop.
        drop(self.server.take());
        drop(self.pod_resources.take());
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Whether [`FakeKubelet::kill`] killed it.
    pub fn is_killed(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stops serving and admitting.
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        if let Some(server) = self.pod_resources.take() {
            server.stop().await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// A clonable handle onto the admission queue and the device table.
#[derive(Clone)]
pub struct Admitter {
    batches: mpsc::UnboundedSender<Batch>,
    state: StateHandle,
}

impl Admitter {
    /// Queues a batch; the receiver yields the outcomes in admission order.
    pub fn submit(&self, pods: Vec<Pod>) -> Result<oneshot::Receiver<Vec<PodAdmission>>> {
        let (reply, rx) = oneshot::channel();
        self.batches
            .send(Batch { pods, reply })
            .map_err(|_| Error::Stopped)?;
        Ok(rx)
    }

    /// Frees every device the pod with `uid` holds.
    pub async fn remove_pod(&self, uid: &str) -> Result<bool> {
        let uid = uid.to_owned();
        self.state.with(move |s| s.remove_pod(&uid)).await
    }

    /// Frees the devices of every pod whose UID is not in `active`.
    pub async fn retain_pods(
        &self,
        active: std::collections::BTreeSet<String>,
    ) -> Result<Vec<String>> {
        self.state.with(move |s| s.retain_pods(&active)).await
    }
}

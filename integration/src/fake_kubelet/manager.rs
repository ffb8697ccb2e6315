//! The device manager's moving parts: one task that owns the state (device
//! table and plugin endpoints) and one admission worker that admits pods
//! strictly one at a time.
//!
//! ```text
//!  Register ──> registration ──connect──┐
//!  ListAndWatch task ──devices──────────┤
//!  FakeKubelet / pod watcher ─┐         v
//!        Batch ──> admission worker ──jobs──> state owner ──> watch<NodeDevices>
//!                     │  GetPreferredAllocation / Allocate          └─> checkpoint file
//!                     └──────────────────────> plugin
//! ```
//!
//! The state owner runs jobs (closures over [`State`]) in arrival order and
//! never awaits inside one, so plugin RPCs never block `ListAndWatch` updates
//! (kubelet releases its mutex around RPCs too). After each job it publishes a
//! [`NodeDevices`] snapshot and rewrites the checkpoint when allocations
//! changed. The admission worker holds no state between pods other than the
//! batch it is working on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use proto::deviceplugin::v1beta1 as api;
use proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tonic::transport::Channel;
use tracing::{info, instrument, warn};

use super::admission::{self, PodIdentity};
use super::checkpoint;
use super::devices::{Choice, DeviceRequest, DeviceTable, ResourceCount};
use super::error::Error;
use super::record::{
    AllocateReply, ContainerAllocation, Outcome, PodAdmission, UNEXPECTED_ADMISSION_ERROR,
};

/// A snapshot of the node's device-plugin view, published after every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDevices {
    /// Capacity and allocatable per registered resource.
    pub counts: BTreeMap<String, ResourceCount>,
    /// Device list per resource, `(id, healthy)`.
    pub devices: BTreeMap<String, Vec<(String, bool)>>,
    /// Resources with a live plugin connection.
    pub connected: BTreeSet<String>,
    /// Successful `Register` calls since start (across restarts).
    pub registrations: u64,
    /// Pod UID → container → resource → device IDs held.
    pub allocations: BTreeMap<String, BTreeMap<String, BTreeMap<String, Vec<String>>>>,
}

/// A connected plugin.
pub(crate) struct Endpoint {
    pub(crate) client: DevicePluginClient<Channel>,
    pub(crate) options: api::DevicePluginOptions,
    pub(crate) generation: u64,
    pub(crate) stream: Option<AbortHandle>,
}

impl Drop for Endpoint {
    /// A dropped connection (replaced, restarted, shut down) stops following
    /// the plugin's stream, as when kubelet's process goes away.
    fn drop(&mut self) {
        if let Some(stream) = &self.stream {
            stream.abort();
        }
    }
}

/// An admitted pod, as the pod-resources API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ActivePod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// App containers and restartable init containers, in spec order.
    pub(crate) containers: Vec<String>,
}

/// Everything the state owner owns.
pub(crate) struct State {
    pub(crate) table: DeviceTable,
    /// Admitted pods by UID (kubelet's active pods).
    pub(crate) active: BTreeMap<String, ActivePod>,
    pub(crate) endpoints: BTreeMap<String, Endpoint>,
    pub(crate) registrations: u64,
    next_generation: u64,
    /// Bumped when endpoints change (the table keeps its own revision).
    endpoint_changes: u64,
}

// === impl State ===

impl State {
    fn new(table: DeviceTable) -> Self {
        Self {
            table,
            active: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            registrations: 0,
            next_generation: 0,
            endpoint_changes: 0,
        }
    }

    /// A fresh generation number for a new plugin connection.
    pub(crate) fn next_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// A plugin connected for `resource`: replaces (and stops) any previous one.
    pub(crate) fn connect(&mut self, resource: &str, endpoint: Endpoint) {
        // Dropping the old endpoint stops its stream.
        self.endpoints.insert(resource.to_owned(), endpoint);
        self.registrations += 1;
        self.endpoint_changes += 1;
    }

    /// A `ListAndWatch` message from connection `generation`.
    pub(crate) fn list_and_watch(
        &mut self,
        resource: &str,
        generation: u64,
        devices: Vec<api::Device>,
    ) {
        if self
            .endpoints
            .get(resource)
            .is_none_or(|e| e.generation != generation)
        {
            return;
        }
        let devices = devices
            .into_iter()
            .map(|d| (d.id, d.health == api::HEALTHY));
        self.table.replace_devices(resource, devices);
    }

    /// The stream of connection `generation` ended: all its devices become
    /// unhealthy (kubelet's `markResourceUnhealthy`).
    pub(crate) fn disconnected(&mut self, resource: &str, generation: u64) {
        if self
            .endpoints
            .get(resource)
            .is_some_and(|e| e.generation == generation)
        {
            self.endpoints.remove(resource);
            self.endpoint_changes += 1;
            self.table.mark_unhealthy(resource);
        }
    }

    /// The pod is gone (deleted, finished or rejected): frees its devices.
    /// Returns whether it held any.
    pub(crate) fn remove_pod(&mut self, uid: &str) -> bool {
        self.active.remove(uid);
        self.table.abort_pod(uid)
    }

    /// Keeps only the pods in `active`; returns the UIDs whose devices were freed.
    pub(crate) fn retain_pods(&mut self, active: &BTreeSet<String>) -> Vec<String> {
        self.active.retain(|uid, _| active.contains(uid));
        self.table.retain_pods(active)
    }

    /// Kubelet restarted: every connection is gone and devices are forgotten.
    pub(crate) fn restart(&mut self) {
        self.endpoints.clear();
        self.endpoint_changes += 1;
        self.table.forget_devices();
    }

    fn snapshot(&self) -> NodeDevices {
        let allocations = self
            .table
            .pods()
            .iter()
            .map(|(uid, containers)| {
                let containers = containers
                    .iter()
                    .map(|(c, res)| {
                        (
                            c.clone(),
                            res.iter()
                                .map(|(r, h)| (r.clone(), h.ids.iter().cloned().collect()))
                                .collect(),
                        )
                    })
                    .collect();
                (uid.clone(), containers)
            })
            .collect();
        NodeDevices {
            counts: self.table.counts(),
            devices: self
                .table
                .registered()
                .map(|r| (r.clone(), self.table.devices(r)))
                .collect(),
            connected: self.endpoints.keys().cloned().collect(),
            registrations: self.registrations,
            allocations,
        }
    }
}

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// A handle to the state owner.
#[derive(Clone)]
pub(crate) struct StateHandle {
    jobs: mpsc::UnboundedSender<Job>,
}

impl StateHandle {
    /// Runs `f` on the state, in order with every other job.
    pub(crate) async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> R + Send + 'static,
    ) -> Result<R, Error> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |state| {
            let _ = tx.send(f(state));
        });
        self.jobs.send(job).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }
}

/// Starts the state owner over `table`. Returns its handle, the snapshot
/// receiver and the task.
pub(crate) fn spawn_state(
    table: DeviceTable,
    checkpoint_path: PathBuf,
) -> (
    StateHandle,
    watch::Receiver<NodeDevices>,
    tokio::task::JoinHandle<()>,
) {
    let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
    let mut state = State::new(table);
    let (snapshots, snapshot_rx) = watch::channel(state.snapshot());
    let task = tokio::spawn(async move {
        let mut written = checkpoint::Checkpoint::of(&state.table);
        let mut seen = (state.table.revision(), state.endpoint_changes);
        while let Some(job) = rx.recv().await {
            job(&mut state);
            let now = (state.table.revision(), state.endpoint_changes);
            if now == seen {
                continue;
            }
            let table_changed = now.0 != seen.0;
            seen = now;
            let snapshot = state.snapshot();
            snapshots.send_if_modified(|current| {
                let changed = *current != snapshot;
                *current = snapshot;
                changed
            });
            if !table_changed {
                continue;
            }
            let checkpoint = checkpoint::Checkpoint::of(&state.table);
            if checkpoint != written {
                if let Err(error) = checkpoint.write(&checkpoint_path) {
                    warn!(%error, path = %checkpoint_path.display(), "writing the device checkpoint failed");
                }
                written = checkpoint;
            }
        }
    });
    (StateHandle { jobs }, snapshot_rx, task)
}

/// Pods to admit together (one kubelet `HandlePodAdditions` call).
pub(crate) struct Batch {
    pub(crate) pods: Vec<Pod>,
    pub(crate) reply: oneshot::Sender<Vec<PodAdmission>>,
}

/// The admission worker: batches in arrival order, each sorted by creation
/// time, pods strictly one at a time.
pub(crate) async fn run_admissions(
    mut batches: mpsc::UnboundedReceiver<Batch>,
    state: StateHandle,
    record_dir: Option<PathBuf>,
) {
    while let Some(Batch { mut pods, reply }) = batches.recv().await {
        admission::sort_batch(&mut pods);
        let mut results = Vec::with_capacity(pods.len());
        for pod in &pods {
            let Ok(result) = admit(&state, pod).await else {
                return;
            };
            if let Some(dir) = &record_dir
                && let Err(error) = result.write_to(dir)
            {
                warn!(%error, pod = %result.name, "writing the admission record failed");
            }
            results.push(result);
        }
        let _ = reply.send(results);
    }
}

/// Why one pod's admission failed, before kubelet's wording is applied.
#[derive(Debug, thiserror::Error)]
enum AdmitError {
    #[error(transparent)]
    Spec(#[from] admission::SpecError),
    #[error(transparent)]
    Devices(#[from] super::devices::DeviceError),
    #[error("device plugin GetPreferredAllocation rpc failed with err: {}", grpc_error(.0))]
    Preferred(tonic::Status),
    #[error("{}", grpc_error(.0))]
    Allocate(tonic::Status),
    #[error("unknown Device Plugin {0}")]
    UnknownPlugin(String),
    #[error("no containers return in allocation response {0:?}")]
    EmptyResponse(api::AllocateResponse),
    #[error("the device reservation for {0} was lost (kubelet restarted during Allocate)")]
    ReservationLost(String),
    #[error("fake kubelet stopped")]
    Stopped(#[from] Error),
}

/// A gRPC error as Go's grpc-go prints it.
fn grpc_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

/// Admits one pod. `Err` only when the state owner is gone.
#[instrument(skip_all, fields(pod = %PodIdentity::of(pod).name))]
async fn admit(state: &StateHandle, pod: &Pod) -> Result<PodAdmission, Error> {
    let id = PodIdentity::of(pod);
    let result = allocate_pod(state, pod, &id).await;
    let outcome_containers = match result {
        Ok(containers) => {
            info!(containers = containers.len(), "pod admitted");
            let listed = admission::container_plans(pod)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| !c.init || c.restartable_init)
                .map(|c| c.name)
                .collect();
            let active = ActivePod {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                containers: listed,
            };
            let uid = id.uid.clone();
            state.with(move |s| s.active.insert(uid, active)).await?;
            (Outcome::Running, containers)
        }
        Err(AdmitError::Stopped(e)) => return Err(e),
        Err(error) => {
            let uid = id.uid.clone();
            state.with(move |s| s.remove_pod(&uid)).await?;
            let message =
                format!("Pod was rejected: Allocate failed due to {error}, which is unexpected");
            info!(%message, "pod rejected");
            (
                Outcome::Failed {
                    reason: UNEXPECTED_ADMISSION_ERROR.to_owned(),
                    message,
                },
                Vec::new(),
            )
        }
    };
    let (outcome, containers) = outcome_containers;
    Ok(PodAdmission {
        namespace: id.namespace,
        name: id.name,
        uid: id.uid,
        outcome,
        containers,
    })
}

/// Kubelet's per-pod device allocation: init containers then app containers,
/// per resource `devicesToAllocate` then one `Allocate` call.
async fn allocate_pod(
    state: &StateHandle,
    pod: &Pod,
    id: &PodIdentity,
) -> Result<Vec<ContainerAllocation>, AdmitError> {
    let plans = admission::container_plans(pod)?;
    let already_running = admission::phase(pod) == "Running";
    let mut reusable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for plan in &plans {
        for (resource, required) in &plan.requests {
            let req = DeviceRequest {
                pod_uid: id.uid.clone(),
                container: plan.name.clone(),
                resource: resource.clone(),
                required: *required,
                reusable: reusable.get(resource).cloned().unwrap_or_default(),
                already_running,
            };
            if let Some(allocation) = allocate_container(state, req, plan.init).await? {
                out.push(allocation);
            }
        }
        let (uid, name) = (id.uid.clone(), plan.name.clone());
        let held = state
            .with(move |s| s.table.container_devices(&uid, &name))
            .await?;
        for (resource, ids) in held {
            let entry = reusable.entry(resource).or_default();
            if plan.init && !plan.restartable_init {
                entry.extend(ids);
            } else {
                entry.retain(|id| !ids.contains(id));
            }
        }
    }
    Ok(out)
}

/// One container, one resource.
async fn allocate_container(
    state: &StateHandle,
    req: DeviceRequest,
    init: bool,
) -> Result<Option<ContainerAllocation>, AdmitError> {
    let query_req = req.clone();
    let step = state
        .with(move |s| {
            if !s.table.is_device_plugin_resource(&query_req.resource) {
                return Ok(None);
            }
            let endpoint = s.endpoints.get(&query_req.resource);
            let preferred = endpoint
                .filter(|e| e.options.get_preferred_allocation_available)
                .map(|e| e.client.clone());
            Ok(Some((s.table.preferred_query(&query_req)?, preferred)))
        })
        .await?
        .map_err(AdmitError::Devices)?;
    let Some((query, preferred_client)) = step else {
        return Ok(None);
    };

    let mut hint = Vec::new();
    if let (Some(query), Some(mut client)) = (query, preferred_client) {
        let size = i32::try_from(query.size).unwrap_or(i32::MAX);
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: query.available,
                must_include_device_i_ds: query.must_include,
                allocation_size: size,
            }],
        };
        let reply = client
            .get_preferred_allocation(request)
            .await
            .map_err(AdmitError::Preferred)?;
        hint = reply
            .into_inner()
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default();
    }

    let choose_req = req.clone();
    let choice = state
        .with(move |s| {
            let choice = s.table.choose(&choose_req, &hint)?;
            let client = s
                .endpoints
                .get(&choose_req.resource)
                .map(|e| e.client.clone());
            let held = s
                .table
                .held(
                    &choose_req.pod_uid,
                    &choose_req.container,
                    &choose_req.resource,
                )
                .cloned();
            Ok::<_, AdmitError>((choice, client, held))
        })
        .await??;
    let (ids, mut client) = match choice {
        (Choice::Nothing, _, held) => {
            return Ok(held.map(|held| ContainerAllocation {
                container: req.container,
                init,
                resource: req.resource,
                device_ids: held.ids.into_iter().collect(),
                reply: held.reply,
            }));
        }
        (Choice::Allocate(_), None, _) => return Err(AdmitError::UnknownPlugin(req.resource)),
        (Choice::Allocate(ids), Some(client), _) => (ids, client),
    };
    let request = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.clone(),
        }],
    };
    let response = client
        .allocate(request)
        .await
        .map_err(AdmitError::Allocate)?
        .into_inner();
    let Some(first) = response.container_responses.first().cloned() else {
        return Err(AdmitError::EmptyResponse(response));
    };
    let reply = AllocateReply::from(first);
    let (uid, container, resource, stored) = (
        req.pod_uid.clone(),
        req.container.clone(),
        req.resource.clone(),
        reply.clone(),
    );
    let committed = state
        .with(move |s| s.table.commit(&uid, &container, &resource, stored))
        .await?;
    if !committed {
        return Err(AdmitError::ReservationLost(req.resource));
    }
    Ok(Some(ContainerAllocation {
        container: req.container,
        init,
        resource: req.resource,
        device_ids: ids,
        reply,
    }))
}

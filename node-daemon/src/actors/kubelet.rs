//! `KubeletActor`: answers the device-plugin service. It holds no GPU
//! state: it reads the pods of the node, lets the pure `allocation`
//! functions decide, asks the GPU actors to commit, and writes the pod's
//! annotations. Allocates run one at a time (an atomic response), as
//! kubelet admits pods one at a time anyway.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::{Actor, AtomicResponse, Context, Handler, Message, ResponseFuture, WrapFuture as _};
use proto::hami::bind::BindPhase;
use proto::hami::container_contract::{ContainerSlice, ContractContext, container_env_and_mounts};
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use tracing::{info, warn};

use super::kept_read::{KeptRead, NodeRead};
use super::pool::{CommitFailure, GpuPool};
use crate::allocation::{
    AllocateError, ContainerPlan, PodFailure, identify_pod, plan_container, prefer_devices,
};
use crate::cluster::{AnnotationPatch, Cluster, PodView};
use crate::ledger::{Committed, LiveSnapshot, SliceKey};

/// Serves Allocate: one entry per container request, each the device IDs
/// kubelet picked.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<ContainerSlice>, AllocateError>")]
pub struct AllocateContainers {
    /// Device IDs per container request.
    pub requests: Vec<Vec<String>>,
}

/// One container of a GetPreferredAllocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferenceRequest {
    /// IDs kubelet may choose from.
    pub available: Vec<String>,
    /// IDs kubelet must include.
    pub must_include: Vec<String>,
    /// How many to choose.
    pub size: usize,
}

/// Picks preferred device IDs per container request (a hint to kubelet).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<Vec<String>>, AllocateError>")]
pub struct PreferDevices {
    /// One per container request.
    pub requests: Vec<PreferenceRequest>,
}

/// What the contract needs from the settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractSettings {
    /// Host folder of HAMi-core (`HOOK_PATH`).
    pub hook_path: PathBuf,
    /// `deviceMemoryScaling`.
    pub device_memory_scaling: f64,
    /// The GPUs in MIG mode (their devices are MIG instances), with their
    /// profiles.
    pub mig_gpus: crate::mig::MigGpus,
}

/// Everything an Allocate needs; cheap to clone into the response future.
#[derive(Clone)]
pub struct Allocator {
    /// This node.
    pub node: String,
    /// The API.
    pub cluster: Arc<dyn Cluster>,
    /// The node's GPUs.
    pub gpus: GpuPool,
    /// Contract settings.
    pub contract: ContractSettings,
    /// Where the names of the pods last listed are published (for metrics).
    pub names: Arc<tokio::sync::watch::Sender<crate::cluster::PodNames>>,
    /// The last GetPreferredAllocation's read, for the Allocate after it.
    kept: Arc<Mutex<KeptRead>>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node", &self.node)
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    /// An allocator for `node`, keeping no read yet.
    #[must_use]
    pub fn new(
        node: String,
        cluster: Arc<dyn Cluster>,
        gpus: GpuPool,
        contract: ContractSettings,
        names: Arc<tokio::sync::watch::Sender<crate::cluster::PodNames>>,
    ) -> Self {
        Self {
            node,
            cluster,
            gpus,
            contract,
            names,
            kept: Arc::default(),
        }
    }

    /// Lists the node's pods and reads its lock, stamped with the liveness
    /// epoch taken before the list.
    async fn read(&self) -> Result<NodeRead, AllocateError> {
        let taken_at = self.gpus.clock().now();
        let pods = self
            .cluster
            .pods_on_node(&self.node)
            .await
            .map_err(AllocateError::Cluster)?;
        let lock = self.node_lock().await;
        Ok(NodeRead {
            pods,
            lock,
            taken_at,
        })
    }

    /// Publishes the read's pod names and releases the slices of pods gone
    /// or finished in it.
    async fn release_gone(&self, read: &NodeRead) {
        self.names.send_replace(pod_names(&read.pods));
        let live = read
            .pods
            .iter()
            .filter(|p| !p.is_terminal())
            .map(|p| p.uid.clone())
            .collect();
        self.gpus
            .release_except(LiveSnapshot {
                live,
                taken_at: read.taken_at,
            })
            .await;
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, KeptRead> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn node_lock(&self) -> Option<String> {
        match self.cluster.node_lock(&self.node).await {
            Ok(lock) => lock,
            Err(error) => {
                warn!(%error, "cannot read the node lock; identifying the pod without it");
                None
            }
        }
    }

    /// Serves one Allocate; see the Allocate steps.
    ///
    /// # Errors
    /// An [`AllocateError`] saying which pod and why; the ledgers are rolled
    /// back and the pod marked `bind-phase=failed`.
    pub async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<ContainerSlice>, AllocateError> {
        let first = requests.first().ok_or(AllocateError::EmptyRequest)?;
        let kept = self.kept().begin(first, Instant::now());
        let _end = AllocateEnds(self);
        let read = match kept {
            Some(read) => read,
            None => self.read().await?,
        };
        self.release_gone(&read).await;
        let pods = &read.pods;
        let (pod, todo) = identify_pod(&self.node, read.lock.as_deref(), pods, first.len())?;
        let mut committed = Vec::new();
        match self.serve(pod, pods, todo, requests, &mut committed).await {
            Ok(slices) => Ok(slices),
            Err(reason) => {
                for (uuid, key) in committed {
                    self.gpus.release(&uuid, key).await;
                }
                let failed: AnnotationPatch = [(
                    keys::BIND_PHASE.to_owned(),
                    Some(BindPhase::Failed.to_string()),
                )]
                .into_iter()
                .collect();
                if let Err(error) = self
                    .cluster
                    .patch_pod_annotations(&pod.namespace, &pod.name, failed)
                    .await
                {
                    warn!(pod = %pod.full_name(), %error, "cannot mark the pod bind-phase=failed");
                }
                self.release_lock(pod).await;
                let error = reason.of(pod);
                warn!(pod = %pod.full_name(), %error, "Allocate failed");
                Err(error)
            }
        }
    }

    async fn release_lock(&self, pod: &PodView) {
        let owner = LockOwner {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
        };
        if let Err(error) = self.cluster.release_node_lock(&self.node, &owner).await {
            warn!(pod = %pod.full_name(), %error, "cannot release the node lock");
        }
    }

    async fn commit(
        &self,
        pod: &PodView,
        plan: &ContainerPlan,
        committed: &mut Vec<(String, SliceKey)>,
    ) -> Result<(), PodFailure> {
        for (uuid, key, slice) in plan.slices(&pod.uid) {
            match self.gpus.commit(&uuid, key.clone(), slice).await {
                Ok(Committed::New) => committed.push((uuid, key)),
                Ok(Committed::AlreadyHeld) => {}
                Err(CommitFailure::Ledger(error)) => {
                    return Err(PodFailure::Ledger { uuid, error });
                }
                Err(CommitFailure::Unavailable) => return Err(PodFailure::GpuUnavailable(uuid)),
            }
        }
        Ok(())
    }

    async fn serve(
        &self,
        pod: &PodView,
        pods: &[PodView],
        mut todo: proto::hami::pod_devices::PodDevices,
        requests: &[Vec<String>],
        committed: &mut Vec<(String, SliceKey)>,
    ) -> Result<Vec<ContainerSlice>, PodFailure> {
        let mut slices = Vec::with_capacity(requests.len());
        let mut last = false;
        // The pod's MIG instances as recorded, updated container by
        // container and written back with the other annotations.
        let (mut mig_record, unreadable) = crate::mig::recorded(pod);
        if let Some(error) = unreadable {
            warn!(pod = %pod.full_name(), %error, "vgpu-mig-allocations does not decode; choosing the instances here");
        }
        let mut mig_placed = false;
        for ids in requests {
            let plan = plan_container(pod, &todo, ids.len(), |u| self.gpus.contains(u))?;
            let instances = self.place_mig(pod, pods, &plan, &mig_record)?;
            self.commit(pod, &plan, committed).await?;
            if !instances.is_empty() {
                mig_placed = true;
                crate::mig::merge(&mut mig_record, instances.iter().cloned());
            }
            let slice = self.contract(pod, &plan, &instances).await?;
            info!(
                pod = %pod.full_name(),
                container = %plan.container_name,
                index = plan.container,
                gpus = ?plan.devices.iter().map(|d| d.uuid.as_str()).collect::<Vec<_>>(),
                memory_mib = ?plan.devices.iter().map(|d| d.usedmem).collect::<Vec<_>>(),
                cores = ?plan.devices.iter().map(|d| d.usedcores).collect::<Vec<_>>(),
                device_ids = ?ids,
                "allocated"
            );
            last = plan.is_last();
            todo = plan.remaining;
            slices.push(slice);
        }
        let mut patch: AnnotationPatch = [(
            keys::VGPU_DEVICES_TO_ALLOCATE.to_owned(),
            Some(todo.to_string()),
        )]
        .into_iter()
        .collect();
        if mig_placed {
            patch.insert(
                keys::VGPU_MIG_ALLOCATIONS.to_owned(),
                Some(proto::hami::mig::encode_allocations(&mig_record)),
            );
        }
        if last {
            patch.insert(
                keys::BIND_PHASE.to_owned(),
                Some(BindPhase::Success.to_string()),
            );
        }
        self.cluster
            .patch_pod_annotations(&pod.namespace, &pod.name, patch)
            .await
            .map_err(PodFailure::Cluster)?;
        if last {
            self.release_lock(pod).await;
            info!(pod = %pod.full_name(), "every container allocated: bind-phase=success");
        }
        Ok(slices)
    }

    /// The MIG instance of each of the container's devices on a MIG GPU,
    /// with its runtime identity: the scheduler's placement when the pod
    /// records a valid one, else this daemon's choice (see [`crate::mig`]).
    fn place_mig(
        &self,
        pod: &PodView,
        pods: &[PodView],
        plan: &ContainerPlan,
        record: &[proto::hami::mig::MigAllocation],
    ) -> Result<Vec<proto::hami::mig::MigAllocation>, PodFailure> {
        if !plan
            .devices
            .iter()
            .any(|d| self.contract.mig_gpus.contains_key(&d.uuid))
        {
            return Ok(Vec::new());
        }
        let taken = crate::mig::taken_by_others(pods, &pod.uid);
        let placed = crate::mig::place_container(
            plan.container,
            &plan.devices,
            &self.contract.mig_gpus,
            record,
            &taken,
        )
        .map_err(PodFailure::Mig)?;
        Ok(placed
            .into_iter()
            .map(|p| {
                let mut a = p.allocation;
                crate::mig::simulate_runtime(&mut a, &pod.uid);
                info!(
                    pod = %pod.full_name(),
                    container = plan.container,
                    gpu = %a.gpu_uuid,
                    profile = %a.profile,
                    start = a.placement.start,
                    size = a.placement.size,
                    chosen_by = if p.from_scheduler { "scheduler" } else { "node-daemon" },
                    "MIG instance"
                );
                a
            })
            .collect())
    }

    /// The env and mounts, and the per-container host folder HAMi-core
    /// writes its cache into (created 0777 like HAMi; a failure is logged,
    /// not fatal: the container runtime creates a missing bind source).
    async fn contract(
        &self,
        pod: &PodView,
        plan: &ContainerPlan,
        instances: &[proto::hami::mig::MigAllocation],
    ) -> Result<ContainerSlice, PodFailure> {
        let ctx = ContractContext {
            hook_path: self.contract.hook_path.to_string_lossy().into_owned(),
            device_memory_scaling: self.contract.device_memory_scaling,
            cuda_disable_control: plan.cuda_disable_control,
            ..ContractContext::new(
                pod.uid.clone(),
                plan.container_name.clone(),
                format!("{}_{}", pod.uid, plan.container),
            )
        };
        let mut slice =
            container_env_and_mounts(&plan.devices, &ctx).map_err(PodFailure::Contract)?;
        crate::mig::apply(
            &mut slice,
            &plan.devices,
            &self.contract.mig_gpus,
            |device, gpu| {
                instances
                    .iter()
                    .find(|a| a.device_index as usize == device)
                    .and_then(|a| a.runtime.as_ref())
                    .map_or_else(
                        || crate::mig::simulated_mig_uuid(gpu, &pod.uid, plan.container, device),
                        |r| r.mig_uuid.clone(),
                    )
            },
        );
        let dir = self
            .contract
            .hook_path
            .join("vgpu/containers")
            .join(format!("{}_{}", pod.uid, plan.container_name));
        if let Err(error) = create_shared_dir(&dir).await {
            warn!(dir = %dir.display(), %error, "cannot create the HAMi-core container folder");
        }
        Ok(slice)
    }

    /// Device IDs on the GPUs the scheduler chose, per container request;
    /// without an identifiable pod, a plain pick from the available IDs.
    ///
    /// # Errors
    /// [`AllocateError::Cluster`] when the pods cannot be read.
    pub async fn prefer(
        &self,
        requests: &[PreferenceRequest],
    ) -> Result<Vec<Vec<String>>, AllocateError> {
        let ticket = self.kept().ticket();
        let read = self.read().await?;
        let mut todo = requests
            .first()
            .and_then(|r| identify_pod(&self.node, read.lock.as_deref(), &read.pods, r.size).ok())
            .map(|(_, todo)| todo);
        let identified = todo.is_some();
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let chosen: Vec<String> = match &todo {
                Some(t) => t
                    .first_pending()
                    .map(|(_, e)| e.iter().map(|d| d.uuid.clone()).collect())
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            out.push(prefer_devices(
                &chosen,
                &r.available,
                &r.must_include,
                r.size,
            ));
            todo = todo.and_then(|t| {
                t.first_pending_index()
                    .and_then(|i| t.erase_container(i).ok())
            });
        }
        let preferred = out.first().filter(|_| identified).map(Vec::as_slice);
        self.kept().keep(ticket, read, preferred, Instant::now());
        Ok(out)
    }
}

/// Ends an Allocate in the kept-read count when dropped, so every way out
/// of an Allocate (an error, a cancelled future) ends it.
struct AllocateEnds<'a>(&'a Allocator);

impl Drop for AllocateEnds<'_> {
    fn drop(&mut self) {
        self.0.kept().end();
    }
}

/// UID → (namespace, name) of `pods`.
#[must_use]
pub fn pod_names(pods: &[PodView]) -> crate::cluster::PodNames {
    Arc::new(
        pods.iter()
            .map(|p| (p.uid.clone(), (p.namespace.clone(), p.name.clone())))
            .collect(),
    )
}

async fn create_shared_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).await
}

/// The kubelet-facing actor.
#[derive(Debug)]
pub struct KubeletActor {
    allocator: Allocator,
}

impl KubeletActor {
    /// An actor serving with `allocator`.
    #[must_use]
    pub fn new(allocator: Allocator) -> Self {
        Self { allocator }
    }
}

impl Actor for KubeletActor {
    type Context = Context<Self>;
}

impl actix::Supervised for KubeletActor {}

impl Handler<AllocateContainers> for KubeletActor {
    type Result = AtomicResponse<Self, Result<Vec<ContainerSlice>, AllocateError>>;

    fn handle(&mut self, msg: AllocateContainers, _: &mut Self::Context) -> Self::Result {
        let allocator = self.allocator.clone();
        AtomicResponse::new(Box::pin(
            async move { allocator.allocate(&msg.requests).await }.into_actor(self),
        ))
    }
}

impl Handler<PreferDevices> for KubeletActor {
    type Result = ResponseFuture<Result<Vec<Vec<String>>, AllocateError>>;

    fn handle(&mut self, msg: PreferDevices, _: &mut Self::Context) -> Self::Result {
        let allocator = self.allocator.clone();
        Box::pin(async move { allocator.prefer(&msg.requests).await })
    }
}

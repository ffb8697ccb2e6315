//! The DRA driver's node work: prepare a claim (read it, commit its slices
//! in the per-GPU actors, write its CDI spec), unprepare it (release, remove
//! the spec), and rebuild the claims' holdings at start.
//!
//! Each claim succeeds or fails alone (the kubelet gets a per-claim error);
//! a failed prepare leaves nothing committed by it and no spec file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use proto::hami::container_contract::{ContractContext, container_env_and_mounts};
use tokio::sync::watch;
use tracing::{info, warn};

use super::claims::{ClaimPlan, PreparedDevice, allocated_to, plan_claim};
use crate::actors::health::Inventory;
use crate::actors::pool::{ClaimFailure, GpuPool};
use crate::cluster::{ClaimView, Cluster};
use crate::devices::Gpu;
use crate::ledger::{ClaimSlice, Committed};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

/// The settings the driver's node work needs.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverSettings {
    /// This node (and its pool).
    pub node: String,
    /// Where CDI specs go.
    pub cdi_dir: PathBuf,
    /// Host folder of HAMi-core (`HOOK_PATH`).
    pub hook_path: PathBuf,
    /// `deviceMemoryScaling`.
    pub device_memory_scaling: f64,
}

/// Prepares and unprepares claims; cheap to clone.
#[derive(Clone)]
pub struct DraDriver {
    settings: Arc<DriverSettings>,
    cluster: Arc<dyn Cluster>,
    gpus: GpuPool,
    inventory: watch::Receiver<Inventory>,
}

impl std::fmt::Debug for DraDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraDriver")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl DraDriver {
    /// A driver reading claims from `cluster`, committing in `gpus`,
    /// finding devices in `inventory`.
    #[must_use]
    pub fn new(
        settings: DriverSettings,
        cluster: Arc<dyn Cluster>,
        gpus: GpuPool,
        inventory: watch::Receiver<Inventory>,
    ) -> Self {
        Self {
            settings: Arc::new(settings),
            cluster,
            gpus,
            inventory,
        }
    }

    /// Prepares `claim`: its devices with the one CDI ID of its spec.
    ///
    /// # Errors
    /// Why, as one line for the kubelet; nothing stays committed.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<(PreparedDevice, String)>, String> {
        let full = format!("{}/{}", claim.namespace, claim.name);
        let found = self
            .cluster
            .resource_claim(&claim.namespace, &claim.name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("resourceclaim {full} not found"))?;
        if found.uid != claim.uid {
            return Err(format!(
                "resourceclaim {full} has UID {}, not {}",
                found.uid, claim.uid
            ));
        }
        let gpus = self.inventory.borrow().clone();
        let plan = plan_claim(&found, &self.settings.node, &gpus).map_err(|e| e.to_string())?;
        let mut fresh = Vec::new();
        // In allocation order (the contract's device order).
        for uuid in plan.contract.iter().map(|d| &d.uuid) {
            let slice = plan.slices.get(uuid).copied().unwrap_or_default();
            match self.gpus.commit_claim(uuid, &plan.uid, slice).await {
                Ok(Committed::New) => fresh.push(uuid.clone()),
                Ok(Committed::AlreadyHeld) => {}
                Err(failure) => {
                    self.roll_back(&plan.uid, &fresh).await;
                    let reason = match failure {
                        ClaimFailure::Ledger(e) => e.to_string(),
                        ClaimFailure::Unavailable => "the GPU is not serving".to_owned(),
                    };
                    warn!(claim = %full, gpu = %uuid, %reason, "prepare refused");
                    return Err(format!("claim {full} on GPU {uuid}: {reason}"));
                }
            }
        }
        if let Err(reason) = self.write_spec(&found, &plan).await {
            self.roll_back(&plan.uid, &fresh).await;
            warn!(claim = %full, %reason, "prepare failed");
            return Err(format!("claim {full}: {reason}"));
        }
        info!(
            claim = %full,
            uid = %plan.uid,
            gpus = ?plan.slices.keys().collect::<Vec<_>>(),
            memory_mib = ?plan.slices.values().map(|s| s.memory_mib).collect::<Vec<_>>(),
            cores = ?plan.slices.values().map(|s| s.cores).collect::<Vec<_>>(),
            replay = fresh.is_empty(),
            "claim prepared"
        );
        let id = proto::dra::cdi_device_id(&plan.uid);
        Ok(plan.devices.into_iter().map(|d| (d, id.clone())).collect())
    }

    async fn roll_back(&self, claim_uid: &str, fresh: &[String]) {
        if !fresh.is_empty() {
            self.gpus.release_claim(claim_uid).await;
        }
    }

    /// The contract for the claim's GPUs as its CDI spec, and the HAMi-core
    /// folder it mounts (created 0777 like the device-plugin path does).
    async fn write_spec(&self, claim: &ClaimView, plan: &ClaimPlan) -> Result<(), String> {
        let hook = &self.settings.hook_path;
        let ctx = ContractContext {
            hook_path: hook.to_string_lossy().into_owned(),
            device_memory_scaling: self.settings.device_memory_scaling,
            ..ContractContext::new(claim.uid.clone(), claim.name.clone(), claim.uid.clone())
        };
        let slice = container_env_and_mounts(&plan.contract, &ctx).map_err(|e| e.to_string())?;
        let dir = hook
            .join("vgpu/containers")
            .join(format!("{}_{}", claim.uid, claim.name));
        if let Err(error) = create_shared_dir(&dir).await {
            warn!(dir = %dir.display(), %error, "cannot create the HAMi-core claim folder");
        }
        let spec = proto::cdi::claim_spec(&claim.uid, &slice);
        super::cdi::write_spec(&self.settings.cdi_dir, &claim.uid, &spec)
            .await
            .map_err(|e| format!("write CDI spec in {}: {e}", self.settings.cdi_dir.display()))?;
        Ok(())
    }

    /// Unprepares `claim`: releases its slices and removes its spec.
    ///
    /// # Errors
    /// The spec could not be removed (the slices are released anyway).
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        let freed = self.gpus.release_claim(&claim.uid).await;
        info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, gpus = freed, "claim unprepared");
        super::cdi::remove_spec(&self.settings.cdi_dir, &claim.uid)
            .await
            .map_err(|e| format!("remove CDI spec of claim {}: {e}", claim.uid))
    }
}

/// Frees the slices and removes the spec of every claim deleted from the
/// API, until `shutdown` turns true or the deletions end: a claim the
/// rebuild counted but the kubelet never prepared gets no Unprepare.
pub async fn release_deleted(
    driver: DraDriver,
    mut deletions: futures::stream::BoxStream<'static, String>,
    mut shutdown: watch::Receiver<bool>,
) {
    use futures::StreamExt as _;
    loop {
        let uid = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            uid = deletions.next() => match uid {
                Some(uid) => uid,
                None => return,
            },
        };
        let freed = driver.gpus.release_claim(&uid).await;
        if freed > 0 {
            info!(uid = %uid, gpus = freed, "claim deleted: its slices are free");
        }
        if let Err(error) = super::cdi::remove_spec(&driver.settings.cdi_dir, &uid).await {
            warn!(uid = %uid, %error, "cannot remove the CDI spec of a deleted claim");
        }
    }
}

async fn create_shared_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).await
}

/// The holdings of the claims allocated to `pool` (GPU UUID → claim UID →
/// slice), from `claims` as listed at start; claims that do not plan are
/// logged and left out.
#[must_use]
pub fn rebuild(
    pool: &str,
    gpus: &[Gpu],
    claims: &[ClaimView],
) -> BTreeMap<String, BTreeMap<String, ClaimSlice>> {
    let mut out: BTreeMap<String, BTreeMap<String, ClaimSlice>> = BTreeMap::new();
    for claim in claims.iter().filter(|c| allocated_to(c, pool)) {
        match plan_claim(claim, pool, gpus) {
            Ok(plan) => {
                for (uuid, slice) in plan.slices {
                    out.entry(uuid).or_default().insert(plan.uid.clone(), slice);
                }
            }
            Err(error) => warn!(%error, "claim ignored while rebuilding the ledgers"),
        }
    }
    out
}

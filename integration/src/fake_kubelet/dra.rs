//! The fake kubelet's DRA manager, after kubelet's `pkg/kubelet/cm/dra`
//! (v1.37): a plugin watcher on the `plugins_registry` folder, the
//! registered DRA drivers, and per pod `NodePrepareResources` before its
//! containers start and `NodeUnprepareResources` once it has ended.
//!
//! - **Registration** (kubelet's plugin watcher): every socket file in the
//!   folder (dotfiles skipped) is dialled, `GetInfo` must say type
//!   `DRAPlugin` and list `v1.DRAPlugin` among its versions, the endpoint it
//!   names is dialled, and `NotifyRegistrationStatus` reports the outcome.
//!   A socket that disappears deregisters its driver; one re-created (a
//!   restarted driver) registers again.
//! - **Prepare** ([`DraManager::prepare`]): the pod's claims are read
//!   (template claims by their `status.resourceClaimStatuses` name), each
//!   must be allocated, reserved for the pod and, for a template claim,
//!   owned by it; claims not prepared yet go to their driver in one
//!   `NodePrepareResources` per driver, and every claim must come back
//!   without error. Each container then gets the CDI devices of the claims
//!   (and requests) it names, resolved by [`super::cdi`] into the env and
//!   mounts recorded like a device plugin's `Allocate` reply.
//! - **Unprepare** ([`DraManager::unprepare`]): a claim no pod on the node
//!   uses any more goes back to its driver.
//!
//! Owns the driver table and the prepared-claims cache; it does not decide
//! when a pod starts or ends (`super::node` does).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use proto::dra::v1 as drapb;
use proto::dra::v1::dra_plugin_client::DraPluginClient;
use proto::pluginregistration::v1 as regpb;
use proto::pluginregistration::v1::registration_client::RegistrationClient;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tracing::{info, warn};

use super::admission::PodIdentity;
use super::record::ContainerAllocation;
use super::registration::dial_within;

/// The gRPC service of the DRA API the fake kubelet speaks.
pub const DRA_SERVICE: &str = "v1.DRAPlugin";
/// The `resource` of a DRA record in the allocation annotation.
pub const CLAIMS_RESOURCE: &str = "resource.k8s.io/claims";
/// How often the registry folder is scanned (kubelet uses inotify; the
/// fake polls, see docs/testing.md).
const SCAN: Duration = Duration::from_millis(100);
/// How long a claim may take to be allocated and reserved for its pod once
/// the pod is bound (kube-scheduler reserves before it binds, so normally
/// no time at all).
const CLAIM_WAIT: Duration = Duration::from_secs(30);
/// kubelet's timeout of one DRA call (`defaultClientCallTimeout`).
const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// Where the DRA manager works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// kubelet's `plugins_registry` folder.
    pub registry_dir: PathBuf,
    /// The CDI spec folder the runtime reads (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
}

/// A registered driver.
#[derive(Clone, Debug)]
struct Driver {
    /// The registration socket it came from.
    socket: PathBuf,
    /// Its DRA endpoint.
    endpoint: String,
    client: DraPluginClient<Channel>,
}

/// One device a prepared claim got, as the driver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PreparedDevice {
    requests: Vec<String>,
    cdi_ids: Vec<String>,
}

/// A claim prepared on the node.
#[derive(Debug, Clone)]
struct Prepared {
    namespace: String,
    name: String,
    uid: String,
    /// Driver → its devices.
    drivers: BTreeMap<String, Vec<PreparedDevice>>,
    /// UIDs of the pods on the node that use it.
    pods: BTreeSet<String>,
}

/// The DRA manager of one fake kubelet; dropping it stops the watcher.
pub struct DraManager {
    config: DraConfig,
    drivers: watch::Receiver<BTreeMap<String, Driver>>,
    /// Claim UID → prepared claim.
    prepared: Mutex<BTreeMap<String, Prepared>>,
    watcher: JoinHandle<()>,
}

impl Drop for DraManager {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl std::fmt::Debug for DraManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === pure reading of pods and claims ===

/// One claim of a pod: its name in the pod, the ResourceClaim's name, and
/// whether it was made from a template (then the pod must own it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    /// `spec.resourceClaims[].name`.
    pub pod_claim: String,
    /// The ResourceClaim's name.
    pub claim: String,
    /// Made from a template for this pod.
    pub from_template: bool,
}

/// The ResourceClaims of a pod (kubelet's `resourceclaim.Name`): a claim by
/// name as written; a template claim by its `status.resourceClaimStatuses`
/// entry (an entry without a name: no claim was needed, skipped).
///
/// # Errors
/// A template claim has no status entry yet.
pub fn pod_claims(pod: &Pod) -> Result<Vec<PodClaim>, String> {
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let mut out = Vec::new();
    for c in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(name) = &c.resource_claim_name {
            out.push(PodClaim {
                pod_claim: c.name.clone(),
                claim: name.clone(),
                from_template: false,
            });
        } else if c.resource_claim_template_name.is_some() {
            match statuses.get(c.name.as_str()) {
                None => return Err(format!("{}: ResourceClaim not created yet", c.name)),
                Some(None) => {}
                Some(Some(name)) => out.push(PodClaim {
                    pod_claim: c.name.clone(),
                    claim: (*name).to_owned(),
                    from_template: true,
                }),
            }
        }
    }
    Ok(out)
}

/// Whether kubelet may prepare `claim` for `pod` (its checks, its texts).
///
/// # Errors
/// The claim is not the pod's, not allocated, or not reserved for it.
pub fn usable(pod: &Pod, claim: &ResourceClaim, from_template: bool) -> Result<(), String> {
    let id = PodIdentity::of(pod);
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let claim_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if from_template {
        let owned = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == id.uid && o.controller == Some(true));
        if !owned {
            return Err(format!(
                "ResourceClaim {name} was not created for pod {}/{} (pod is not owner)",
                id.namespace, id.name
            ));
        }
    }
    let status = claim.status.as_ref();
    let reserved = status
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| r.iter().any(|c| c.resource == "pods" && c.uid == id.uid));
    if !reserved {
        return Err(format!(
            "pod {} ({}) is not allowed to use ResourceClaim {name} ({claim_uid})",
            id.name, id.uid
        ));
    }
    if status.and_then(|s| s.allocation.as_ref()).is_none() {
        return Err(format!("ResourceClaim {name} is not allocated"));
    }
    Ok(())
}

/// The drivers of a claim's allocation, in order.
fn drivers_of(claim: &ResourceClaim) -> BTreeSet<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.driver.clone())
        .collect()
}

// === impl DraManager ===

impl DraManager {
    /// Starts watching `config.registry_dir` (created if missing).
    ///
    /// # Errors
    /// The folder cannot be created.
    pub fn start(config: DraConfig) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.registry_dir)?;
        let (tx, drivers) = watch::channel(BTreeMap::new());
        let watcher = tokio::spawn(watch_registry(config.registry_dir.clone(), tx));
        Ok(Arc::new(Self {
            config,
            drivers,
            prepared: Mutex::new(BTreeMap::new()),
            watcher,
        }))
    }

    /// Driver name → DRA endpoint of every registered driver.
    #[must_use]
    pub fn registered(&self) -> BTreeMap<String, String> {
        self.drivers
            .borrow()
            .iter()
            .map(|(n, d)| (n.clone(), d.endpoint.clone()))
            .collect()
    }

    /// Waits until `driver` is registered.
    ///
    /// # Errors
    /// Not within `deadline`.
    pub async fn wait_registered(&self, driver: &str, deadline: Duration) -> Result<(), String> {
        let mut rx = self.drivers.clone();
        match tokio::time::timeout(deadline, rx.wait_for(|d| d.contains_key(driver))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("the plugin watcher stopped".to_owned()),
            Err(_) => Err(format!(
                "DRA driver {driver} did not register within {deadline:?}"
            )),
        }
    }

    /// The claim UIDs prepared on the node now.
    pub async fn prepared_claims(&self) -> BTreeSet<String> {
        self.prepared.lock().await.keys().cloned().collect()
    }

    /// Prepares the pod's claims and returns, per container that uses a
    /// claim, what it gets (the CDI edits as an `Allocate`-shaped record).
    ///
    /// # Errors
    /// A claim is not usable (yet), its driver is not registered, the
    /// driver refused, or a CDI device does not resolve; the message is
    /// kubelet's where it has one.
    pub async fn prepare(
        &self,
        client: &kube::Client,
        pod: &Pod,
    ) -> Result<Vec<ContainerAllocation>, String> {
        let id = PodIdentity::of(pod);
        let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &id.namespace);
        let mut claims: Vec<(PodClaim, ResourceClaim)> = Vec::new();
        for pc in pod_claims(pod)? {
            let claim = wait_usable(&claims_api, pod, &pc).await?;
            claims.push((pc, claim));
        }
        // Batches per driver of the claims not prepared yet.
        let mut batches: BTreeMap<String, Vec<drapb::Claim>> = BTreeMap::new();
        {
            let mut prepared = self.prepared.lock().await;
            for (_, claim) in &claims {
                let uid = claim.metadata.uid.clone().unwrap_or_default();
                if let Some(p) = prepared.get_mut(&uid) {
                    p.pods.insert(id.uid.clone());
                    continue;
                }
                let wire = drapb::Claim {
                    namespace: id.namespace.clone(),
                    uid: uid.clone(),
                    name: claim.metadata.name.clone().unwrap_or_default(),
                };
                for driver in drivers_of(claim) {
                    batches.entry(driver).or_default().push(wire.clone());
                }
            }
        }
        let mut answered: BTreeMap<String, BTreeMap<String, Vec<PreparedDevice>>> = BTreeMap::new();
        for (driver, batch) in batches {
            let mut client = self
                .drivers
                .borrow()
                .get(&driver)
                .map(|d| d.client.clone())
                .ok_or_else(|| format!("DRA driver {driver} is not registered"))?;
            let mut request = tonic::Request::new(drapb::NodePrepareResourcesRequest {
                claims: batch.clone(),
            });
            request.set_timeout(CALL_TIMEOUT);
            let response = client
                .node_prepare_resources(request)
                .await
                .map_err(|s| format!("NodePrepareResources: {}", s.message()))?
                .into_inner();
            for (claim_uid, result) in response.claims {
                let asked = batch.iter().find(|c| c.uid == claim_uid).ok_or_else(|| {
                    format!(
                        "NodePrepareResources returned result for unknown claim UID {claim_uid}"
                    )
                })?;
                if !result.error.is_empty() {
                    return Err(format!(
                        "NodePrepareResources failed for ResourceClaim {}: {}",
                        asked.name, result.error
                    ));
                }
                let devices = result
                    .devices
                    .into_iter()
                    .map(|d| PreparedDevice {
                        requests: d.request_names,
                        cdi_ids: d.cdi_device_ids,
                    })
                    .collect();
                answered
                    .entry(claim_uid)
                    .or_default()
                    .insert(driver.clone(), devices);
            }
            let unfinished = batch
                .iter()
                .filter(|c| {
                    !answered
                        .get(&c.uid)
                        .is_some_and(|a| a.contains_key(&driver))
                })
                .count();
            if unfinished != 0 {
                return Err(format!(
                    "NodePrepareResources skipped {unfinished} ResourceClaims"
                ));
            }
        }
        let mut prepared = self.prepared.lock().await;
        for (_, claim) in &claims {
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            if let Some(drivers) = answered.remove(&uid) {
                prepared.insert(
                    uid.clone(),
                    Prepared {
                        namespace: id.namespace.clone(),
                        name: claim.metadata.name.clone().unwrap_or_default(),
                        uid: uid.clone(),
                        drivers,
                        pods: BTreeSet::from([id.uid.clone()]),
                    },
                );
            }
        }
        let by_pod_claim: BTreeMap<&str, &Prepared> = claims
            .iter()
            .filter_map(|(pc, claim)| {
                let uid = claim.metadata.uid.as_deref()?;
                Some((pc.pod_claim.as_str(), prepared.get(uid)?))
            })
            .collect();
        container_records(pod, &by_pod_claim, &self.config.cdi_dir)
    }

    /// Drops the pod's use of its claims; a claim no pod uses any more is
    /// unprepared by its drivers (kubelet: after the pod's containers
    /// stopped, before the pod may be deleted).
    ///
    /// # Errors
    /// A driver is not registered or refused (the claim stays prepared).
    pub async fn unprepare(&self, pod_uid: &str) -> Result<(), String> {
        let done: Vec<Prepared> = {
            let mut prepared = self.prepared.lock().await;
            for p in prepared.values_mut() {
                p.pods.remove(pod_uid);
            }
            let unused: Vec<String> = prepared
                .iter()
                .filter(|(_, p)| p.pods.is_empty())
                .map(|(uid, _)| uid.clone())
                .collect();
            unused
                .iter()
                .filter_map(|uid| prepared.remove(uid))
                .collect()
        };
        let mut first_error = None;
        for claim in done {
            if let Err(e) = self.unprepare_claim(&claim).await {
                warn!(claim = %claim.name, error = %e, "unpreparing a claim failed");
                first_error.get_or_insert(e);
                // Kept, so a later unprepare tries again.
                self.prepared.lock().await.insert(claim.uid.clone(), claim);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Unprepares the claims of every pod not in `active` (after a relist).
    pub async fn retain(&self, active: &BTreeSet<String>) {
        let gone: BTreeSet<String> = self
            .prepared
            .lock()
            .await
            .values()
            .flat_map(|p| p.pods.iter().cloned())
            .filter(|uid| !active.contains(uid))
            .collect();
        for uid in gone {
            let _ = self.unprepare(&uid).await;
        }
    }

    async fn unprepare_claim(&self, claim: &Prepared) -> Result<(), String> {
        for driver in claim.drivers.keys() {
            let mut client = self
                .drivers
                .borrow()
                .get(driver)
                .map(|d| d.client.clone())
                .ok_or_else(|| format!("DRA driver {driver} is not registered"))?;
            let wire = drapb::Claim {
                namespace: claim.namespace.clone(),
                uid: claim.uid.clone(),
                name: claim.name.clone(),
            };
            let mut request =
                tonic::Request::new(drapb::NodeUnprepareResourcesRequest { claims: vec![wire] });
            request.set_timeout(CALL_TIMEOUT);
            let response = client
                .node_unprepare_resources(request)
                .await
                .map_err(|s| format!("NodeUnprepareResources: {}", s.message()))?
                .into_inner();
            match response.claims.get(&claim.uid) {
                None => {
                    return Err(format!(
                        "NodeUnprepareResources skipped ResourceClaim {}",
                        claim.name
                    ));
                }
                Some(r) if !r.error.is_empty() => {
                    return Err(format!(
                        "NodeUnprepareResources failed for ResourceClaim {}: {}",
                        claim.name, r.error
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// Reads the claim, waiting (on a watch) until it is usable by the pod.
async fn wait_usable(
    api: &Api<ResourceClaim>,
    pod: &Pod,
    pc: &PodClaim,
) -> Result<ResourceClaim, String> {
    let fetch = |e: kube::Error| format!("fetch ResourceClaim {}: {e}", pc.claim);
    if let Some(claim) = api.get_opt(&pc.claim).await.map_err(fetch)?
        && usable(pod, &claim, pc.from_template).is_ok()
    {
        return Ok(claim);
    }
    let waited = crate::harness::wait_for_object(api.clone(), &pc.claim, CLAIM_WAIT, |c| {
        usable(pod, c, pc.from_template).is_ok()
    })
    .await;
    match waited {
        Ok(claim) => Ok(claim),
        Err(_) => {
            let claim = api
                .get_opt(&pc.claim)
                .await
                .map_err(fetch)?
                .ok_or_else(|| format!("fetch ResourceClaim {}: not found", pc.claim))?;
            usable(pod, &claim, pc.from_template).map(|()| claim)
        }
    }
}

/// Per container that names a prepared claim: its CDI devices (in claim
/// order, each once; a claim named without a request gives all its
/// devices) resolved against the CDI folder.
fn container_records(
    pod: &Pod,
    prepared: &BTreeMap<&str, &Prepared>,
    cdi_dir: &Path,
) -> Result<Vec<ContainerAllocation>, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    let mut out = Vec::new();
    for (container, is_init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
        let mut ids: Vec<String> = Vec::new();
        for c in container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(claim) = prepared.get(c.name.as_str()) else {
                continue;
            };
            let request = c.request.as_deref().filter(|r| !r.is_empty());
            for device in claim.drivers.values().flatten() {
                if request.is_some_and(|r| !device.requests.iter().any(|q| q == r)) {
                    continue;
                }
                for cdi in &device.cdi_ids {
                    if !ids.contains(cdi) {
                        ids.push(cdi.clone());
                    }
                }
            }
        }
        if ids.is_empty() {
            continue;
        }
        let reply = super::cdi::resolve(cdi_dir, &ids).map_err(|e| {
            format!(
                "failed to create containerd container {}: CDI device injection failed: {e}",
                container.name
            )
        })?;
        out.push(ContainerAllocation {
            container: container.name.clone(),
            init: is_init,
            resource: CLAIMS_RESOURCE.to_owned(),
            device_ids: ids,
            reply,
        });
    }
    Ok(out)
}

// === the plugin watcher ===

/// What identifies one socket file: a re-created socket is a new plugin.
type Stamp = (u64, Option<SystemTime>);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type()
        .is_socket()
        .then(|| (meta.ino(), meta.modified().ok()))
}

/// Scans the registry folder, registering new sockets and deregistering
/// vanished ones.
async fn watch_registry(dir: PathBuf, drivers: watch::Sender<BTreeMap<String, Driver>>) {
    let mut known: BTreeMap<PathBuf, Stamp> = BTreeMap::new();
    loop {
        let mut seen: BTreeMap<PathBuf, Stamp> = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                let hidden = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'));
                if hidden {
                    continue;
                }
                if let Some(s) = stamp(&path) {
                    seen.insert(path, s);
                }
            }
        }
        for (path, _) in known.iter().filter(|(p, _)| !seen.contains_key(*p)) {
            drivers.send_modify(|d| d.retain(|_, drv| &drv.socket != path));
            info!(socket = %path.display(), "DRA plugin socket removed: deregistered");
        }
        for (path, s) in &seen {
            if known.get(path) == Some(s) {
                continue;
            }
            match register(path).await {
                Ok((name, driver)) => {
                    info!(driver = %name, endpoint = %driver.endpoint, "DRA driver registered");
                    drivers.send_modify(|d| {
                        d.insert(name, driver);
                    });
                }
                Err(error) => warn!(socket = %path.display(), %error, "plugin registration failed"),
            }
        }
        known = seen;
        tokio::time::sleep(SCAN).await;
    }
}

/// One registration: `GetInfo`, validation, dialling the endpoint, and
/// `NotifyRegistrationStatus` with the outcome.
async fn register(socket: &Path) -> Result<(String, Driver), String> {
    let channel = dial_within(socket.to_owned(), super::registration::DIAL_TIMEOUT)
        .await
        .map_err(|e| format!("dial failed at socket {}: {e}", socket.display()))?;
    let mut reg = RegistrationClient::new(channel);
    let info = reg
        .get_info(regpb::InfoRequest {})
        .await
        .map_err(|s| {
            format!(
                "GetInfo failed at socket {}: {}",
                socket.display(),
                s.message()
            )
        })?
        .into_inner();
    let checked = validate(&info);
    let outcome = match checked {
        Ok(()) => dial_within(
            PathBuf::from(&info.endpoint),
            super::registration::DIAL_TIMEOUT,
        )
        .await
        .map(DraPluginClient::new)
        .map_err(|e| {
            format!(
                "failed to dial DRA plugin {} at {}: {e}",
                info.name, info.endpoint
            )
        }),
        Err(e) => Err(e),
    };
    let status = regpb::RegistrationStatus {
        plugin_registered: outcome.is_ok(),
        error: outcome.as_ref().err().cloned().unwrap_or_default(),
    };
    if let Err(s) = reg.notify_registration_status(status).await {
        warn!(socket = %socket.display(), error = %s.message(), "NotifyRegistrationStatus failed");
    }
    let client = outcome?;
    Ok((
        info.name.clone(),
        Driver {
            socket: socket.to_owned(),
            endpoint: info.endpoint,
            client,
        },
    ))
}

/// kubelet's checks of a `PluginInfo` from a DRA plugin.
///
/// # Errors
/// Another plugin type, or no DRA service version kubelet speaks.
pub fn validate(info: &regpb::PluginInfo) -> Result<(), String> {
    if info.r#type != regpb::DRA_PLUGIN {
        return Err(format!(
            "no handler registered for plugin type: {} at socket",
            info.r#type
        ));
    }
    if info.supported_versions.is_empty() {
        return Err(format!(
            "invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: empty list of supported gRPC services (aka supported versions)",
            info.name, info.endpoint
        ));
    }
    if !info.supported_versions.iter().any(|v| v == DRA_SERVICE) {
        return Err(format!(
            "invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: none of services supported by the plugin ({:?}) are supported by the kubelet ([{DRA_SERVICE:?}])",
            info.name, info.endpoint, info.supported_versions
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn claim(v: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn template_claims_are_named_by_the_pod_status() {
        let mut p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "gpuslice-c", "resourceClaimTemplateName": "gpuslice-1gpu-100c"},
                {"name": "shared", "resourceClaimName": "big"}
            ]}
        }));
        assert_eq!(
            pod_claims(&p),
            Err("gpuslice-c: ResourceClaim not created yet".to_owned())
        );
        p.status = Some(
            serde_json::from_value(json!({"resourceClaimStatuses": [
                {"name": "gpuslice-c", "resourceClaimName": "p-gpuslice-c-x7k2"}]}))
            .unwrap(),
        );
        assert_eq!(
            pod_claims(&p).unwrap(),
            [
                PodClaim {
                    pod_claim: "gpuslice-c".into(),
                    claim: "p-gpuslice-c-x7k2".into(),
                    from_template: true
                },
                PodClaim {
                    pod_claim: "shared".into(),
                    claim: "big".into(),
                    from_template: false
                },
            ]
        );
    }

    #[test]
    fn a_claim_must_be_owned_reserved_and_allocated() {
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}));
        let mut c = claim(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
            "spec": {},
            "status": {}
        }));
        assert_eq!(
            usable(&p, &c, true),
            Err("ResourceClaim c was not created for pod ns/p (pod is not owner)".to_owned())
        );
        c.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u1", "controller": true}))
                .unwrap(),
        ]);
        assert_eq!(
            usable(&p, &c, true),
            Err("pod p (u1) is not allowed to use ResourceClaim c (cu)".to_owned())
        );
        c.status = Some(
            serde_json::from_value(json!({
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
                "allocation": {"devices": {"results": []}}}))
            .unwrap(),
        );
        assert_eq!(usable(&p, &c, true), Ok(()));
    }

    #[test]
    fn plugin_info_is_checked_like_kubelet() {
        let info = |t: &str, versions: &[&str]| regpb::PluginInfo {
            r#type: t.into(),
            name: "gpu.gpuslice.dev".into(),
            endpoint: "/p/dra.sock".into(),
            supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        };
        assert_eq!(validate(&info("DRAPlugin", &["v1.DRAPlugin"])), Ok(()));
        assert!(
            validate(&info("DevicePlugin", &["v1.DRAPlugin"]))
                .unwrap_err()
                .contains("no handler registered for plugin type: DevicePlugin")
        );
        assert!(
            validate(&info("DRAPlugin", &["v1alpha4.DRAPlugin"]))
                .unwrap_err()
                .contains("none of services supported by the plugin")
        );
        assert!(
            validate(&info("DRAPlugin", &[]))
                .unwrap_err()
                .contains("empty list")
        );
    }
}

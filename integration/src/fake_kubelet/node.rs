//! The fake kubelet's Kubernetes side, over any apiserver via `kube::Client`:
//! registers the Node, keeps `status.capacity`/`allocatable` of the device
//! resources equal to what the plugins report, watches pods bound to the node,
//! feeds them to the admission queue and writes the outcome back (pod status,
//! an allocation annotation, a Warning event on rejection).
//!
//! With a [`DraManager`], an admitted pod that has resource claims has them
//! prepared before it is reported running (retried with backoff, a Warning
//! event `FailedPrepareDynamicResources` on the first failure, as kubelet's
//! pod worker does), and unprepared once it is deleted or finished, before
//! the deletion is confirmed.
//!
//! Owns only the translation between API objects and the fake kubelet's
//! typed API ([`super::Admitter`]); admission itself happens there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::admission::{self, PodIdentity};
use super::dra::DraManager;
use super::record::{ALLOCATIONS_ANNOTATION, Outcome, PodAdmission};
use super::{Admitter, FakeKubelet, NodeDevices};

/// How many times an admission outcome write is tried (about two minutes
/// with the capped backoff) before it is dropped with a warning.
const OUTCOME_ATTEMPTS: u32 = 60;

/// How long to wait before retrying a failed node status write.
const RETRY: Duration = Duration::from_millis(500);

/// The node this kubelet stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Node name (`spec.nodeName` of its pods).
    pub node_name: String,
    /// Device-plugin resources reported even before a plugin registers (as 0).
    pub resources: Vec<String>,
    /// `cpu` capacity written when the node is created.
    pub cpu: String,
    /// `memory` capacity written when the node is created.
    pub memory: String,
    /// `pods` capacity written when the node is created.
    pub pods: String,
}

impl NodeConfig {
    /// A node with 8 CPUs, 32 GiB and 110 pods.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            resources: Vec::new(),
            cpu: "8".into(),
            memory: "32Gi".into(),
            pods: "110".into(),
        }
    }
}

/// Errors of the Kubernetes side.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// Which call.
        what: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// The running Kubernetes side; dropping it stops its tasks.
pub struct NodeAgent {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl NodeAgent {
    /// Registers the node (creates it if missing) and starts syncing its
    /// device capacity and admitting its pods.
    pub async fn start(
        kubelet: &FakeKubelet,
        client: kube::Client,
        config: NodeConfig,
    ) -> Result<Self, NodeError> {
        Self::start_with_dra(kubelet, client, config, None).await
    }

    /// [`NodeAgent::start`] with a DRA manager: pods' resource claims are
    /// prepared before they run and unprepared after they end.
    pub async fn start_with_dra(
        kubelet: &FakeKubelet,
        client: kube::Client,
        config: NodeConfig,
        dra: Option<Arc<DraManager>>,
    ) -> Result<Self, NodeError> {
        ensure_node(&client, &config).await?;
        let capacity = tokio::spawn(sync_capacity(
            client.clone(),
            config.clone(),
            kubelet.watch_devices(),
        ));
        let (results, result_rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_outcomes(
            client.clone(),
            config.node_name.clone(),
            kubelet.admitter(),
            dra.clone(),
            result_rx,
        ));
        let heartbeat = tokio::spawn(renew_node_lease(client.clone(), config.node_name.clone()));
        let pods = tokio::spawn(watch_pods(
            client,
            config.node_name.clone(),
            kubelet.admitter(),
            dra,
            results,
        ));
        Ok(Self {
            tasks: vec![capacity, writer, heartbeat, pods],
        })
    }

    /// Stops the tasks.
    pub async fn shutdown(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }
}

fn api_err(what: &'static str) -> impl FnOnce(kube::Error) -> NodeError {
    move |source| NodeError::Api { what, source }
}

/// Namespace of the nodes' heartbeat Leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// kubelet's `nodeLeaseDurationSeconds` default.
const NODE_LEASE_SECONDS: i32 = 40;
/// kubelet renews its Lease at a quarter of its duration.
const NODE_LEASE_RENEW: Duration = Duration::from_secs(10);

/// kubelet's heartbeat: the node's Lease in `kube-node-lease`, renewed every
/// 10 s. Without it the real kube-controller-manager's node lifecycle
/// controller marks the node NotReady after its grace period (50 s) and
/// taints it, and kube-scheduler stops placing pods there.
async fn renew_node_lease(client: kube::Client, node: String) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    let mut tick = tokio::time::interval(NODE_LEASE_RENEW);
    loop {
        tick.tick().await;
        let renew = json!({"spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": NODE_LEASE_SECONDS,
            "renewTime": MicroTime(Timestamp::now()),
        }});
        let renewed = match leases
            .patch(&node, &PatchParams::default(), &Patch::Merge(&renew))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let mut lease = renew.clone();
                lease["metadata"] = json!({"name": node, "namespace": NODE_LEASE_NAMESPACE});
                match serde_json::from_value::<Lease>(lease) {
                    Ok(lease) => leases
                        .create(&PostParams::default(), &lease)
                        .await
                        .map(drop),
                    Err(e) => Err(kube::Error::SerdeError(e)),
                }
            }
            other => other.map(drop),
        };
        if let Err(e) = renewed {
            warn!(%node, error = %e, "renewing the node lease failed; retrying at the next beat");
        }
    }
}

/// Creates the Node if it does not exist, then marks it Ready with its
/// CPU, memory and pod capacity (kubelet's node registration).
async fn ensure_node(client: &kube::Client, config: &NodeConfig) -> Result<(), NodeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes
        .get_opt(&config.node_name)
        .await
        .map_err(api_err("reading the node"))?
        .is_none()
    {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": config.node_name,
                "labels": {
                    "kubernetes.io/hostname": config.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        }))
        .map_err(|e| NodeError::Api {
            what: "building the node",
            source: kube::Error::SerdeError(e),
        })?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => info!(node = %config.node_name, "node registered"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api_err("creating the node")(e)),
        }
    }
    let basics = json!({"cpu": config.cpu, "memory": config.memory, "pods": config.pods});
    let now = Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": basics,
        "allocatable": basics,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "nodeInfo": {"kubeletVersion": "v1.33.0-fake", "operatingSystem": "linux", "architecture": "amd64",
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
            "containerRuntimeVersion": "", "kubeProxyVersion": ""},
    }});
    nodes
        .patch_status(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .map_err(api_err("patching the node status"))?;
    Ok(())
}

/// The device part of the node status: every resource the plugins reported,
/// plus configured ones at 0.
pub fn device_status(
    config: &NodeConfig,
    view: &NodeDevices,
) -> BTreeMap<String, super::ResourceCount> {
    let mut counts: BTreeMap<_, _> = config
        .resources
        .iter()
        .map(|r| (r.clone(), super::ResourceCount::default()))
        .collect();
    counts.extend(view.counts.clone());
    counts
}

/// Keeps the node's device capacity/allocatable in step with the plugins.
async fn sync_capacity(
    client: kube::Client,
    config: NodeConfig,
    mut view: watch::Receiver<NodeDevices>,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut published: Option<BTreeMap<String, super::ResourceCount>> = None;
    loop {
        let wanted = device_status(&config, &view.borrow_and_update());
        if published.as_ref() != Some(&wanted) {
            let capacity: BTreeMap<_, _> = wanted
                .iter()
                .map(|(r, c)| (r.clone(), c.capacity.to_string()))
                .collect();
            let allocatable: BTreeMap<_, _> = wanted
                .iter()
                .map(|(r, c)| (r.clone(), c.allocatable.to_string()))
                .collect();
            let patch = json!({"status": {"capacity": capacity, "allocatable": allocatable}});
            match nodes
                .patch_status(
                    &config.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    debug!(?wanted, "node device capacity published");
                    published = Some(wanted);
                }
                Err(error) => {
                    warn!(%error, "publishing node device capacity failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// Watches the node's pods and feeds the admission queue: a (re)list is one
/// batch, each new pod afterwards is a batch of one. Deleted and finished
/// pods free their devices.
async fn watch_pods(
    client: kube::Client,
    node: String,
    admitter: Admitter,
    dra: Option<Arc<DraManager>>,
    results: mpsc::UnboundedSender<oneshot::Receiver<Vec<PodAdmission>>>,
) {
    let dra = dra.as_deref();
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(pods, config).default_backoff().boxed();
    let mut submitted: BTreeSet<String> = BTreeSet::new();
    let mut listing: Vec<Pod> = Vec::new();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                warn!(%error, "pod watch error");
                continue;
            }
        };
        let mut batch = Vec::new();
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(pod) => listing.push(pod),
            watcher::Event::InitDone => {
                let listed = std::mem::take(&mut listing);
                let active: BTreeSet<String> = listed
                    .iter()
                    .filter(|p| !admission::is_terminal(p))
                    .map(|p| PodIdentity::of(p).uid)
                    .collect();
                if admitter.retain_pods(active.clone()).await.is_err() {
                    return;
                }
                if let Some(dra) = dra {
                    dra.retain(&active).await;
                }
                submitted.retain(|uid| active.contains(uid));
                for pod in listed {
                    batch.extend(on_pod(&client, &admitter, dra, &mut submitted, pod).await);
                }
            }
            watcher::Event::Apply(pod) => {
                batch.extend(on_pod(&client, &admitter, dra, &mut submitted, pod).await)
            }
            watcher::Event::Delete(pod) => {
                let uid = PodIdentity::of(&pod).uid;
                submitted.remove(&uid);
                let _ = admitter.remove_pod(&uid).await;
                if let Some(dra) = dra {
                    let _ = dra.unprepare(&uid).await;
                }
            }
        }
        if !batch.is_empty() {
            let Ok(rx) = admitter.submit(batch) else {
                return;
            };
            if results.send(rx).is_err() {
                return;
            }
        }
    }
}

/// Handles one pod seen on the watch; returns it if it must be admitted.
async fn on_pod(
    client: &kube::Client,
    admitter: &Admitter,
    dra: Option<&DraManager>,
    submitted: &mut BTreeSet<String>,
    pod: Pod,
) -> Option<Pod> {
    let id = PodIdentity::of(&pod);
    if pod.metadata.deletion_timestamp.is_some() {
        // Graceful deletion: "stop" the containers, free the devices,
        // unprepare the claims, and confirm the deletion as kubelet does
        // (grace period 0).
        let _ = admitter.remove_pod(&id.uid).await;
        if let Some(dra) = dra
            && let Err(error) = dra.unprepare(&id.uid).await
        {
            warn!(%error, pod = %id.name, "unpreparing the pod's claims failed");
        }
        let scoped: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
        if let Err(error) = scoped
            .delete(&id.name, &DeleteParams::default().grace_period(0))
            .await
        {
            debug!(%error, pod = %id.name, "confirming pod deletion failed");
        }
        return None;
    }
    if admission::is_terminal(&pod) {
        let _ = admitter.remove_pod(&id.uid).await;
        if let Some(dra) = dra {
            let _ = dra.unprepare(&id.uid).await;
        }
        return None;
    }
    submitted.insert(id.uid).then_some(pod)
}

/// Writes each admission outcome back to its pod, in admission order; a
/// running pod with resource claims first has them prepared, on a task of
/// its own (as kubelet's pod workers run side by side).
async fn write_outcomes(
    client: kube::Client,
    node: String,
    admitter: Admitter,
    dra: Option<Arc<DraManager>>,
    mut results: mpsc::UnboundedReceiver<oneshot::Receiver<Vec<PodAdmission>>>,
) {
    // Dropped (and so aborted) with this task.
    let mut workers = tokio::task::JoinSet::new();
    while let Some(rx) = results.recv().await {
        let Ok(admissions) = rx.await else { return };
        while workers.try_join_next().is_some() {}
        for admission in admissions {
            if let (Some(dra), Outcome::Running) = (&dra, &admission.outcome) {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &admission.namespace);
                match pods.get_opt(&admission.name).await {
                    Ok(Some(pod)) if has_claims(&pod) => {
                        workers.spawn(prepare_then_write(
                            client.clone(),
                            node.clone(),
                            admitter.clone(),
                            dra.clone(),
                            admission,
                            pod,
                        ));
                        continue;
                    }
                    Ok(None) => {
                        let _ = admitter.remove_pod(&admission.uid).await;
                        continue;
                    }
                    _ => {}
                }
            }
            write_until_landed(&client, &node, &admitter, &admission).await;
        }
    }
}

fn has_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// Like kubelet's status manager, keeps trying until the write lands or the
/// pod is gone; a dropped outcome would leave it Pending forever.
async fn write_until_landed(
    client: &kube::Client,
    node: &str,
    admitter: &Admitter,
    admission: &PodAdmission,
) {
    let mut pause = Duration::from_millis(100);
    for attempt in 1.. {
        match write_outcome(client, node, admission).await {
            Ok(()) => break,
            Err(error) if matches!(&error, NodeError::Api { source: kube::Error::Api(s), .. } if s.code == 404) =>
            {
                // Deleted while being admitted: nothing may keep its devices.
                let _ = admitter.remove_pod(&admission.uid).await;
                break;
            }
            Err(error) if attempt >= OUTCOME_ATTEMPTS => {
                warn!(%error, pod = %admission.name, attempt, "writing the admission outcome failed; giving up");
                break;
            }
            Err(error) => {
                warn!(%error, pod = %admission.name, attempt, "writing the admission outcome failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// kubelet's event reason when preparing a pod's claims fails.
pub const FAILED_PREPARE: &str = "FailedPrepareDynamicResources";

/// Prepares the pod's claims (kubelet's pod worker: on failure an event,
/// then a retry with backoff, until it works or the pod is gone), then
/// reports it running with what each container got.
async fn prepare_then_write(
    client: kube::Client,
    node: String,
    admitter: Admitter,
    dra: Arc<DraManager>,
    mut admission: PodAdmission,
    mut pod: Pod,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &admission.namespace);
    let mut pause = Duration::from_millis(200);
    let mut warned = false;
    loop {
        match dra.prepare(&client, &pod).await {
            Ok(records) => {
                admission.containers.extend(records);
                break;
            }
            Err(error) => {
                warn!(%error, pod = %admission.name, "preparing dynamic resources failed; retrying");
                if !warned {
                    warned = true;
                    let message = format!(
                        "Failed to prepare dynamic resources: prepare dynamic resources: {error}"
                    );
                    record_event(&client, &node, &admission, FAILED_PREPARE, &message).await;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                match pods.get_opt(&admission.name).await {
                    Ok(Some(p))
                        if p.metadata.uid.as_deref() == Some(admission.uid.as_str())
                            && p.metadata.deletion_timestamp.is_none() =>
                    {
                        pod = p;
                    }
                    Ok(_) => {
                        let _ = admitter.remove_pod(&admission.uid).await;
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
    }
    write_until_landed(&client, &node, &admitter, &admission).await;
}

/// Records a Warning event about the admitted pod, as kubelet does.
async fn record_event(
    client: &kube::Client,
    node: &str,
    admission: &PodAdmission,
    reason: &str,
    message: &str,
) {
    let now = Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", admission.name)),
            namespace: Some(admission.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(admission.name.clone()),
            namespace: Some(admission.namespace.clone()),
            uid: Some(admission.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.to_owned()),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("kubelet".into()),
            host: Some(node.to_owned()),
        }),
        ..Event::default()
    };
    let events: Api<Event> = Api::namespaced(client.clone(), &admission.namespace);
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        debug!(%error, "recording the event failed");
    }
}

/// The `status` kubelet writes for an admitted pod.
pub fn running_status(pod: &Pod, now: &str) -> Value {
    let plans = admission::container_plans(pod).unwrap_or_default();
    let container = |c: &admission::ContainerPlan| {
        let image = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .find(|x| x.name == c.name)
            .and_then(|x| x.image.clone())
            .unwrap_or_default();
        let done = c.init && !c.restartable_init;
        let state = if done {
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
        } else {
            json!({"running": {"startedAt": now}})
        };
        json!({"name": c.name, "image": image, "imageID": "", "ready": !done, "started": !done,
               "restartCount": 0, "state": state})
    };
    let init: Vec<Value> = plans.iter().filter(|c| c.init).map(container).collect();
    let app: Vec<Value> = plans.iter().filter(|c| !c.init).map(container).collect();
    let condition = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    json!({
        "phase": "Running",
        "startTime": now,
        "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
        "initContainerStatuses": init,
        "containerStatuses": app,
    })
}

/// Writes one outcome: status (and annotation, or a Warning event).
async fn write_outcome(
    client: &kube::Client,
    node: &str,
    admission: &PodAdmission,
) -> Result<(), NodeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &admission.namespace);
    let now = Timestamp::now();
    match &admission.outcome {
        Outcome::Running => {
            let pod = pods
                .get(&admission.name)
                .await
                .map_err(api_err("reading the pod"))?;
            let already_running = admission::phase(&pod) == "Running";
            if already_running && admission.containers.is_empty() {
                // Re-admitted after a restart with nothing on record: keep
                // whatever the pod already says.
                return Ok(());
            }
            let allocations = serde_json::to_string(&admission.containers).unwrap_or_default();
            let meta = json!({"metadata": {"annotations": {ALLOCATIONS_ANNOTATION: allocations}}});
            pods.patch(
                &admission.name,
                &PatchParams::default(),
                &Patch::Merge(&meta),
            )
            .await
            .map_err(api_err("annotating the pod"))?;
            if !already_running {
                let status = json!({"status": running_status(&pod, &now.to_string())});
                pods.patch_status(
                    &admission.name,
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .map_err(api_err("writing the pod status"))?;
            }
        }
        Outcome::Failed { reason, message } => {
            // The event first, then the status, as kubelet's rejectPod does.
            let event_message = message
                .strip_prefix("Pod was rejected: ")
                .unwrap_or(message);
            record_event(client, node, admission, reason, event_message).await;
            let status =
                json!({"status": {"phase": "Failed", "reason": reason, "message": message}});
            pods.patch_status(
                &admission.name,
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .map_err(api_err("writing the pod status"))?;
        }
    }
    Ok(())
}

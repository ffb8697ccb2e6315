//! The daemon end to end over real unix sockets in a temp dir: a test
//! kubelet registration server, the daemon's `run` (simulated GPUs, the
//! in-memory cluster), and a tonic client speaking the device-plugin API.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceSlice;
use node_daemon::cluster::memory::{ClusterState, MemoryCluster};
use node_daemon::cluster::{
    AnnotationPatch, ClaimView, Cluster, ClusterError, ContainerView, PodChange, PodView,
};
use node_daemon::daemon::{Daemon, run};
use node_daemon::devices::DeviceSource as _;
use node_daemon::devices::simulated::{HealthSwitch, SimulatedDevices};
use node_daemon::settings::{DeviceSourceKind, OperatingMode, Settings, SimulatedGpu};
use proto::deviceplugin::v1beta1 as api;
use proto::hami::keys;
use proto::hami::node_lock::LockOwner;
use tokio::net::UnixListener;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};

const NODE: &str = "node-a";
/// Patience for anything the test awaits.
const PATIENCE: Duration = Duration::from_secs(20);

// === test kubelet registration server ===

struct Recorder(mpsc::UnboundedSender<api::RegisterRequest>);

#[tonic::async_trait]
impl api::registration_server::Registration for Recorder {
    async fn register(
        &self,
        request: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(api::Empty {}))
    }
}

/// Serves kubelet's `Registration` on `<dir>/kubelet.sock` (replacing any
/// file there) and returns the registrations it receives.
fn start_kubelet(dir: &Path) -> mpsc::UnboundedReceiver<api::RegisterRequest> {
    let path = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        Server::builder()
            .add_service(api::registration_server::RegistrationServer::new(Recorder(
                tx,
            )))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    rx
}

/// A kubelet that dials back what registers, as the real one does
/// (`connectClient`: dial the endpoint, `GetDevicePluginOptions`), and
/// restarts once while the first plugin registers: that first `Register`
/// finds the plugin's socket wiped by the restart and fails. Returns the
/// registrations that succeeded.
struct DialingKubelet {
    dir: PathBuf,
    restarted: std::sync::atomic::AtomicBool,
    registered: mpsc::UnboundedSender<api::RegisterRequest>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for DialingKubelet {
    async fn register(
        &self,
        request: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let request = request.into_inner();
        let endpoint = self.dir.join(&request.endpoint);
        if !self
            .restarted
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            // kubelet's start wipes every plugin socket in the folder.
            std::fs::remove_file(&endpoint).unwrap();
        }
        let unreachable =
            |e: String| tonic::Status::unknown(format!("dial {}: {e}", endpoint.display()));
        let channel = Endpoint::from_shared(format!("unix://{}", endpoint.display()))
            .unwrap()
            .connect()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        api::device_plugin_client::DevicePluginClient::new(channel)
            .get_device_plugin_options(api::Empty {})
            .await?;
        let _ = self.registered.send(request);
        Ok(tonic::Response::new(api::Empty {}))
    }
}

fn start_dialing_kubelet(dir: &Path) -> mpsc::UnboundedReceiver<api::RegisterRequest> {
    let path = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let kubelet = DialingKubelet {
        dir: dir.to_owned(),
        restarted: std::sync::atomic::AtomicBool::new(false),
        registered: tx,
    };
    tokio::spawn(
        Server::builder()
            .add_service(api::registration_server::RegistrationServer::new(kubelet))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    rx
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

// === harness ===

struct Node {
    dir: tempfile::TempDir,
    cluster: MemoryCluster,
    switch: HealthSwitch,
    uuids: Vec<String>,
    registrations: mpsc::UnboundedReceiver<api::RegisterRequest>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), node_daemon::daemon::RunError>>>,
}

fn settings(dir: &Path, split: u32) -> Settings {
    Settings {
        node_name: Some(NODE.into()),
        device_plugin_dir: dir.to_owned(),
        device_source: DeviceSourceKind::Simulated,
        simulated_gpu_list: vec![
            SimulatedGpu {
                model: "Tesla T4".into(),
                memory_mib: 15_360,
                numa: 0,
                nvlink_group: None,
                nvlinks: 12,
            },
            SimulatedGpu {
                model: "Tesla T4".into(),
                memory_mib: 15_360,
                numa: 1,
                nvlink_group: None,
                nvlinks: 12,
            },
        ],
        device_split_count: split,
        hook_path: dir.join("hook"),
        metrics_bind_address: None,
        ..Settings::default()
    }
}

impl Node {
    /// Starts a daemon with two simulated T4s (split `split`) and waits for
    /// its registration.
    async fn start(split: u32, cluster: MemoryCluster, dir: Option<tempfile::TempDir>) -> Self {
        let api = Arc::new(cluster.clone());
        Self::start_with(split, cluster, api, dir, None).await
    }

    /// Like [`Node::start`], with the daemon speaking to `api` (a wrapper of
    /// `cluster`).
    async fn start_with(
        split: u32,
        cluster: MemoryCluster,
        api: Arc<dyn Cluster>,
        dir: Option<tempfile::TempDir>,
        metrics: Option<std::net::SocketAddr>,
    ) -> Self {
        let dir = dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let settings = Settings {
            metrics_bind_address: metrics,
            ..settings(dir.path(), split)
        };
        Self::start_configured(settings, cluster, api, dir).await
    }

    /// Starts a daemon with `settings` (whose plugin dir is `dir`).
    async fn start_configured(
        settings: Settings,
        cluster: MemoryCluster,
        api: Arc<dyn Cluster>,
        dir: tempfile::TempDir,
    ) -> Self {
        let mut registrations = start_kubelet(dir.path());
        let devices = SimulatedDevices::from_settings(&settings, NODE);
        let uuids = devices
            .discover()
            .unwrap()
            .into_iter()
            .map(|g| g.uuid)
            .collect();
        let switch = devices.health_switch();
        let (stop, stopped) = oneshot::channel();
        let daemon = Daemon {
            settings,
            devices: Arc::new(devices),
            cluster: api,
        };
        let done = actix::spawn(run(daemon, async {
            let _ = stopped.await;
        }));
        let first = within("registration", registrations.recv()).await.unwrap();
        assert_eq!(first.version, "v1beta1");
        Self {
            dir,
            cluster,
            switch,
            uuids,
            registrations,
            stop: Some(stop),
            done: Some(done),
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("nvidia-gpu.sock")
    }

    async fn client(&self) -> api::device_plugin_client::DevicePluginClient<Channel> {
        let channel = Endpoint::from_shared(format!("unix://{}", self.socket().display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        api::device_plugin_client::DevicePluginClient::new(channel)
    }

    /// Stops the daemon and returns its temp dir.
    async fn stop(mut self) -> tempfile::TempDir {
        let _ = self.stop.take().unwrap().send(());
        let result = within("shutdown", self.done.take().unwrap()).await.unwrap();
        result.unwrap();
        self.dir
    }

    async fn wait_cluster(&self, what: &str, cond: impl FnMut(&ClusterState) -> bool) {
        let mut rx = self.cluster.subscribe();
        within(what, rx.wait_for(cond)).await.unwrap();
    }
}

fn bound_pod(name: &str, containers: &[&str], devices: &str) -> PodView {
    let annotations: BTreeMap<String, String> = [
        (keys::VGPU_NODE, NODE),
        (keys::BIND_PHASE, "allocating"),
        (keys::BIND_TIME, "1760929622"),
        (keys::VGPU_DEVICES_TO_ALLOCATE, devices),
        (keys::VGPU_DEVICES_ALLOCATED, devices),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    PodView {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        phase: "Pending".into(),
        terminating: false,
        annotations,
        containers: containers
            .iter()
            .map(|c| ContainerView {
                name: (*c).into(),
                cuda_disable_control: false,
                init: *c == "init",
            })
            .collect(),
    }
}

/// A local address for the daemon's metrics listener, free a moment ago
/// and outside the range outgoing connections take their ports from.
fn free_port() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], node_daemon::testkit::free_port().unwrap()))
}

/// The body of `GET path` (HTTP/1.0, no client library needed).
async fn http_get(address: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

fn allocate_request(ids: &[String]) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    }
}

fn lock_for(pod: &str) -> String {
    format!("2025-10-20T03:07:02Z,ns,{pod}")
}

// === tests ===

#[actix::test]
async fn registers_and_advertises_split_ids_with_health_and_numa() {
    let node = Node::start(3, MemoryCluster::new(), None).await;
    let mut client = node.client().await;
    let options = client
        .get_device_plugin_options(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    let mut stream = client
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let list = within("device list", stream.message())
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    let expected: Vec<String> = node
        .uuids
        .iter()
        .flat_map(|u| (0..3).map(move |i| format!("{u}-{i}")))
        .collect();
    assert_eq!(ids, expected);
    assert!(list.devices.iter().all(|d| d.health == "Healthy"));
    assert_eq!(list.devices[3].topology.as_ref().unwrap().nodes[0].id, 1);

    let pre = client
        .pre_start_container(api::PreStartContainerRequest::default())
        .await
        .unwrap();
    assert_eq!(pre.into_inner(), api::PreStartContainerResponse {});

    node.wait_cluster("register annotation", |s| {
        s.nodes
            .get(NODE)
            .and_then(|a| a.get(keys::NODE_NVIDIA_REGISTER))
            .is_some_and(|v| {
                v.contains("\"type\":\"NVIDIA-Tesla T4\"") && v.contains("\"count\":3")
            })
    })
    .await;
    let dir = node.stop().await;
    assert!(
        !dir.path().join("nvidia-gpu.sock").exists(),
        "socket removed on shutdown"
    );
}

#[actix::test]
async fn an_unhealthy_gpu_is_withdrawn_and_comes_back() {
    let node = Node::start(2, MemoryCluster::new(), None).await;
    let mut client = node.client().await;
    let mut stream = client
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    within("first list", stream.message())
        .await
        .unwrap()
        .unwrap();
    let health = |list: &api::ListAndWatchResponse| -> Vec<String> {
        list.devices.iter().map(|d| d.health.clone()).collect()
    };

    assert!(node.switch.set(&node.uuids[1], false));
    let list = within("unhealthy list", stream.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        health(&list),
        ["Healthy", "Healthy", "Unhealthy", "Unhealthy"]
    );
    let writes_before = node.cluster.writes();
    node.wait_cluster("register shows unhealthy", |s| {
        s.nodes[NODE][keys::NODE_NVIDIA_REGISTER]
            .matches("\"health\":true")
            .count()
            == 1
    })
    .await;

    assert!(node.switch.set(&node.uuids[1], true));
    let list = within("recovered list", stream.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(health(&list), ["Healthy"; 4]);
    node.wait_cluster("register shows recovery", |s| {
        s.nodes[NODE][keys::NODE_NVIDIA_REGISTER]
            .matches("\"health\":true")
            .count()
            == 2
    })
    .await;
    assert!(node.cluster.writes() > writes_before);
    node.stop().await;
}

#[actix::test]
async fn pair_scores_are_published_with_enable_topology_score_only() {
    let gpu = |numa, nvlink_group| SimulatedGpu {
        model: "NVIDIA A100-SXM4-40GB".into(),
        memory_mib: 40_960,
        numa,
        nvlink_group,
        nvlinks: 12,
    };
    let topology = |dir: &Path, enabled| Settings {
        simulated_gpu_list: vec![gpu(0, Some(0)), gpu(0, Some(0)), gpu(1, None)],
        enable_topology_score: enabled,
        ..settings(dir, 2)
    };
    // With the setting, and without it (HAMi's default): the register only.
    for enabled in [true, false] {
        let cluster = MemoryCluster::new();
        let dir = tempfile::tempdir().unwrap();
        let settings = topology(dir.path(), enabled);
        let api = Arc::new(cluster.clone());
        let node = Node::start_configured(settings, cluster.clone(), api, dir).await;
        node.wait_cluster("register annotation", |s| {
            s.nodes
                .get(NODE)
                .is_some_and(|a| a.contains_key(keys::NODE_NVIDIA_REGISTER))
        })
        .await;
        let written = cluster.node_annotation(NODE, keys::NODE_NVIDIA_SCORE);
        if enabled {
            let scores = proto::hami::pair_score::decode(&written.unwrap()).unwrap();
            let [a, b, c] = [0, 1, 2].map(|i| node.uuids[i].clone());
            let order: Vec<_> = scores.iter().map(|s| s.uuid.clone()).collect();
            assert_eq!(order, [a.clone(), b.clone(), c.clone()]);
            // Same NUMA node (20) and 12 NVLinks (1,200); across NUMA nodes 10.
            let first = BTreeMap::from([(b.clone(), 1_220), (c.clone(), 10)]);
            assert_eq!(scores[0].score, first);
            assert_eq!(scores[2].score, BTreeMap::from([(a, 10), (b, 10)]));
        } else {
            assert_eq!(written, None);
        }
        node.stop().await;
    }
}

#[actix::test]
async fn two_identical_pending_pods_are_never_guessed_between() {
    let cluster = MemoryCluster::new();
    let node = Node::start(10, cluster.clone(), None).await;
    let a = &node.uuids[0];
    let devices = format!("{a},NVIDIA,2000,20:;");
    cluster.put_pod(NODE, bound_pod("one", &["app"], &devices));
    cluster.put_pod(NODE, bound_pod("two", &["app"], &devices));
    let mut client = node.client().await;

    let err = client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("ns/one") && err.message().contains("ns/two"),
        "{}",
        err.message()
    );
    for name in ["one", "two"] {
        let pod = cluster.pod("ns", name).unwrap();
        assert_eq!(
            pod.annotation(keys::BIND_PHASE),
            Some("allocating"),
            "nobody touched {name}"
        );
    }

    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("two")));
    client
        .allocate(allocate_request(&[format!("{a}-1")]))
        .await
        .unwrap();
    assert_eq!(
        cluster
            .pod("ns", "two")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("success")
    );
    assert_eq!(
        cluster
            .pod("ns", "one")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("allocating")
    );
    // Now only "one" waits: no lock needed.
    client
        .allocate(allocate_request(&[format!("{a}-2")]))
        .await
        .unwrap();
    assert_eq!(
        cluster
            .pod("ns", "one")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("success")
    );
    node.stop().await;
}

#[actix::test]
async fn a_slice_that_does_not_fit_fails_the_pod_and_releases_the_lock() {
    let cluster = MemoryCluster::new();
    let node = Node::start(10, cluster.clone(), None).await;
    let a = &node.uuids[0];
    cluster.put_pod(
        NODE,
        bound_pod("big", &["app"], &format!("{a},NVIDIA,20000,10:;")),
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("big")));
    let mut client = node.client().await;
    let err = client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().starts_with("pod ns/big: GPU"),
        "{}",
        err.message()
    );
    let pod = cluster.pod("ns", "big").unwrap();
    assert_eq!(pod.annotation(keys::BIND_PHASE), Some("failed"));
    assert_eq!(cluster.node_annotation(NODE, keys::NODE_LOCK), None);
    node.stop().await;
}

#[actix::test]
async fn unknown_device_ids_and_empty_requests_are_invalid() {
    let node = Node::start(2, MemoryCluster::new(), None).await;
    let mut client = node.client().await;
    let err = client
        .allocate(allocate_request(&["GPU-nope-0".to_owned()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = client
        .allocate(api::AllocateRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    node.stop().await;
}

#[actix::test]
async fn preferred_allocation_picks_the_gpus_the_scheduler_chose() {
    let cluster = MemoryCluster::new();
    let node = Node::start(2, cluster.clone(), None).await;
    let (a, b) = (&node.uuids[0], &node.uuids[1]);
    cluster.put_pod(
        NODE,
        bound_pod("p", &["app"], &format!("{b},NVIDIA,100,0:;")),
    );
    let mut client = node.client().await;
    assert_eq!(prefer(&mut client, &[a, b], 1).await, [format!("{b}-0")]);
    node.stop().await;
}

fn pod_lists(cluster: &MemoryCluster) -> u64 {
    cluster.subscribe().borrow().pod_lists
}

/// kubelet's GetPreferredAllocation for one container of `size` IDs out of
/// every ID of `gpus` (split 2).
async fn prefer(
    client: &mut api::device_plugin_client::DevicePluginClient<Channel>,
    gpus: &[&String],
    size: i32,
) -> Vec<String> {
    let available = gpus
        .iter()
        .flat_map(|u| (0..2).map(move |i| format!("{u}-{i}")))
        .collect();
    let response = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    response.container_responses[0].device_i_ds.clone()
}

#[actix::test]
async fn an_allocate_of_the_preferred_ids_reuses_the_preferences_read_of_the_pods() {
    let cluster = MemoryCluster::new();
    let node = Node::start(2, cluster.clone(), None).await;
    let (a, b) = (&node.uuids[0], &node.uuids[1]);
    let mut client = node.client().await;

    cluster.put_pod(
        NODE,
        bound_pod("p", &["app"], &format!("{b},NVIDIA,100,0:;")),
    );
    let before = pod_lists(&cluster);
    let preferred = prefer(&mut client, &[a, b], 1).await;
    assert_eq!(preferred, [format!("{b}-0")]);
    client.allocate(allocate_request(&preferred)).await.unwrap();
    let p = cluster.pod("ns", "p").unwrap();
    assert_eq!(p.annotation(keys::BIND_PHASE), Some("success"));
    assert_eq!(
        pod_lists(&cluster) - before,
        1,
        "the Allocate used the preference's list"
    );

    // kubelet picked other IDs than preferred: the Allocate reads afresh.
    cluster.put_pod(
        NODE,
        bound_pod("q", &["app"], &format!("{a},NVIDIA,100,0:;")),
    );
    let before = pod_lists(&cluster);
    let preferred = prefer(&mut client, &[a, b], 1).await;
    assert_eq!(preferred, [format!("{a}-0")]);
    client
        .allocate(allocate_request(&[format!("{a}-1")]))
        .await
        .unwrap();
    let q = cluster.pod("ns", "q").unwrap();
    assert_eq!(q.annotation(keys::BIND_PHASE), Some("success"));
    assert_eq!(pod_lists(&cluster) - before, 2);
    node.stop().await;
}

/// HAMi issue #781's swap, through the kept read: a preference whose read
/// of the node was answered before pod `first`'s Allocate ended, but kept
/// after it, shows `first` still pending. The next Allocate (for `second`,
/// whose turn it now is) must not be served from that read, or it would
/// allocate `first` again and leave `second` waiting. (kubelet's Allocates
/// are serial; a preference is not held back by one.)
#[actix::test]
async fn a_preference_read_across_an_allocate_never_serves_the_next_allocate() {
    let cluster = MemoryCluster::new();
    let armed = std::sync::atomic::AtomicBool::new(false);
    let (api, entered, open) = GatedCluster::new(&cluster, Gate::NextLockRead(armed));
    let node = Node::start_with(2, cluster.clone(), api.clone(), None, None).await;
    let (a, b) = (node.uuids[0].clone(), node.uuids[1].clone());
    cluster.put_pod(
        NODE,
        bound_pod("first", &["app"], &format!("{a},NVIDIA,100,0:;")),
    );
    cluster.put_pod(
        NODE,
        bound_pod("second", &["app"], &format!("{b},NVIDIA,100,0:;")),
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("first")));
    let mut client = node.client().await;

    if let Gate::NextLockRead(armed) = &api.gate {
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let mut other = node.client().await;
    let (x, y) = (a.clone(), b.clone());
    let preference = tokio::spawn(async move { prefer(&mut other, &[&x, &y], 1).await });
    within("the preference's read", entered.notified()).await;
    client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap();
    assert_eq!(
        cluster
            .pod("ns", "first")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("success")
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("second")));
    open.notify_one();
    let preferred = within("the preference", preference).await.unwrap();
    assert_eq!(
        preferred,
        [format!("{a}-0")],
        "its read shows first pending"
    );

    client.allocate(allocate_request(&preferred)).await.unwrap();
    assert_eq!(
        cluster
            .pod("ns", "second")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("success"),
        "the Allocate read afresh and served second"
    );
    node.stop().await;
}

#[actix::test]
async fn kubelet_restart_leads_to_a_new_registration() {
    let mut node = Node::start(2, MemoryCluster::new(), None).await;
    // kubelet restarts: it wipes the plugin sockets and re-creates its own.
    std::fs::remove_file(node.socket()).unwrap();
    node.registrations = start_kubelet(node.dir.path());
    let again = within("re-registration", node.registrations.recv())
        .await
        .unwrap();
    assert_eq!(again.endpoint, "nvidia-gpu.sock");
    assert_eq!(again.resource_name, "nvidia.com/gpu");
    assert!(again.options.unwrap().get_preferred_allocation_available);
    // The re-created socket serves.
    let mut client = node.client().await;
    let mut stream = client
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    let list = within("device list", stream.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(list.devices.len(), 4);
    node.stop().await;
}

#[actix::test]
async fn a_socket_wiped_while_registering_is_served_again_before_registering() {
    let mut node = Node::start(2, MemoryCluster::new(), None).await;
    // kubelet restarts (new kubelet.sock), and restarts again while the
    // plugin registers, wiping the socket the plugin names: registering
    // that endpoint again could never succeed (the chaos soak saw a node
    // stay unregistered for minutes).
    node.registrations = start_dialing_kubelet(node.dir.path());
    let again = within(
        "a registration kubelet could dial",
        node.registrations.recv(),
    )
    .await
    .unwrap();
    assert_eq!(again.endpoint, "nvidia-gpu.sock");
    let mut client = node.client().await;
    let list = within("device list", async {
        client
            .list_and_watch(api::Empty {})
            .await
            .unwrap()
            .into_inner()
            .message()
            .await
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(list.devices.len(), 4);
    node.stop().await;
}

#[actix::test]
async fn a_restarted_daemon_rebuilds_the_ledger_and_never_double_books() {
    let cluster = MemoryCluster::new();
    let node = Node::start(2, cluster.clone(), None).await;
    let a = node.uuids[0].clone();
    let devices = format!("{a},NVIDIA,1000,10:;{a},NVIDIA,1000,10:;");
    cluster.put_pod(NODE, bound_pod("train", &["first", "second"], &devices));
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("train")));
    let mut client = node.client().await;
    client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap();
    drop(client);
    // Killed between the two containers' Allocates.
    let dir = node.stop().await;

    let node = Node::start(2, cluster.clone(), Some(dir)).await;
    // A second pod wants the same GPU (split 2): if the restarted daemon had
    // forgotten container 0 of "train", both would fit.
    cluster.put_pod(
        NODE,
        bound_pod("intruder", &["app"], &format!("{a},NVIDIA,100,1:;")),
    );
    let mut client = node.client().await;
    client
        .allocate(allocate_request(&[format!("{a}-1")]))
        .await
        .unwrap();
    let train = cluster.pod("ns", "train").unwrap();
    assert_eq!(train.annotation(keys::BIND_PHASE), Some("success"));
    let err = client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::ResourceExhausted,
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("ns/intruder") && err.message().contains("slots"),
        "{}",
        err.message()
    );
    node.stop().await;
}

/// The in-memory cluster, but the calls `gate` names wait until `open` is
/// notified (after notifying `entered`): an Allocate caught in flight.
struct GatedCluster {
    inner: MemoryCluster,
    entered: Arc<Notify>,
    open: Arc<Notify>,
    gate: Gate,
}

/// What a [`GatedCluster`] holds up.
enum Gate {
    /// Every pod patch.
    PodPatches,
    /// The next node-lock read while armed, answered with the value read
    /// before the wait (a reply delivered late).
    NextLockRead(std::sync::atomic::AtomicBool),
}

impl GatedCluster {
    fn new(inner: &MemoryCluster, gate: Gate) -> (Arc<Self>, Arc<Notify>, Arc<Notify>) {
        let (entered, open) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let api = Arc::new(Self {
            inner: inner.clone(),
            entered: Arc::clone(&entered),
            open: Arc::clone(&open),
            gate,
        });
        (api, entered, open)
    }

    async fn wait(&self) {
        self.entered.notify_one();
        self.open.notified().await;
    }
}

impl Cluster for GatedCluster {
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodView>, ClusterError>> {
        self.inner.pods_on_node(node)
    }

    fn node_lock<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ClusterError>> {
        Box::pin(async move {
            let lock = self.inner.node_lock(node).await;
            if let Gate::NextLockRead(armed) = &self.gate
                && armed.swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                self.wait().await;
            }
            lock
        })
    }

    fn patch_pod_annotations<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: AnnotationPatch,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            if matches!(self.gate, Gate::PodPatches) {
                self.wait().await;
            }
            self.inner
                .patch_pod_annotations(namespace, name, patch)
                .await
        })
    }

    fn release_node_lock<'a>(
        &'a self,
        node: &'a str,
        owner: &'a LockOwner,
    ) -> BoxFuture<'a, Result<bool, ClusterError>> {
        self.inner.release_node_lock(node, owner)
    }

    fn set_node_annotation<'a>(
        &'a self,
        node: &'a str,
        key: &'a str,
        value: String,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.inner.set_node_annotation(node, key, value)
    }

    fn pod_changes(
        &self,
        node: &str,
        clock: node_daemon::epoch::CommitClock,
    ) -> futures::stream::BoxStream<'static, PodChange> {
        self.inner.pod_changes(node, clock)
    }

    fn resource_claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ClaimView>, ClusterError>> {
        self.inner.resource_claim(namespace, name)
    }

    fn resource_claims(&self) -> BoxFuture<'_, Result<Vec<ClaimView>, ClusterError>> {
        self.inner.resource_claims()
    }

    fn resource_slice<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSlice>, ClusterError>> {
        self.inner.resource_slice(name)
    }

    fn write_resource_slice(
        &self,
        slice: ResourceSlice,
    ) -> BoxFuture<'_, Result<ResourceSlice, ClusterError>> {
        self.inner.write_resource_slice(slice)
    }

    fn resource_slice_changes(
        &self,
        name: &str,
    ) -> futures::stream::BoxStream<'static, Option<ResourceSlice>> {
        self.inner.resource_slice_changes(name)
    }

    fn claim_deletions(&self) -> futures::stream::BoxStream<'static, String> {
        self.inner.claim_deletions()
    }
}

#[actix::test]
async fn shutdown_finishes_the_allocate_in_flight_then_removes_the_socket() {
    let cluster = MemoryCluster::new();
    let (api, entered, open) = GatedCluster::new(&cluster, Gate::PodPatches);
    let mut node = Node::start_with(2, cluster.clone(), api, None, None).await;
    let a = node.uuids[0].clone();
    cluster.put_pod(
        NODE,
        bound_pod("late", &["app"], &format!("{a},NVIDIA,100,1:;")),
    );
    let mut client = node.client().await;
    let request = allocate_request(&[format!("{a}-0")]);
    let in_flight = tokio::spawn(async move { client.allocate(request).await });
    within("Allocate reaching the API", entered.notified()).await;

    let _ = node.stop.take().unwrap().send(());
    // Draining: the socket stops accepting while the Allocate is held.
    let socket = node.socket();
    within("the socket to stop accepting", async {
        while tokio::net::UnixStream::connect(&socket).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(!in_flight.is_finished());
    open.notify_one();
    let response = within("in-flight Allocate", in_flight).await.unwrap();
    let response = response.expect("the Allocate in flight at shutdown completes");
    assert_eq!(response.into_inner().container_responses.len(), 1);
    assert_eq!(
        cluster
            .pod("ns", "late")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("success")
    );
    within("shutdown", node.done.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(!node.socket().exists(), "socket removed after the drain");
}

#[actix::test]
async fn an_init_and_an_app_container_take_one_slot_as_the_scheduler_counts() {
    let cluster = MemoryCluster::new();
    let node = Node::start(2, cluster.clone(), None).await;
    let a = node.uuids[0].clone();
    let mut client = node.client().await;
    cluster.put_pod(
        NODE,
        bound_pod("other", &["app"], &format!("{a},NVIDIA,1000,10:;")),
    );
    client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap();
    // One slot left: the init container's and the app container's slices
    // count as one (the init container finishes before the app starts).
    let devices = format!("{a},NVIDIA,2000,20:;{a},NVIDIA,1000,10:;");
    cluster.put_pod(NODE, bound_pod("train", &["init", "app"], &devices));
    for id in ["1", "1"] {
        client
            .allocate(allocate_request(&[format!("{a}-{id}")]))
            .await
            .unwrap();
    }
    let train = cluster.pod("ns", "train").unwrap();
    assert_eq!(train.annotation(keys::BIND_PHASE), Some("success"));
    // The GPU is now full: a third pod is refused.
    cluster.put_pod(
        NODE,
        bound_pod("third", &["app"], &format!("{a},NVIDIA,10,1:;")),
    );
    let err = client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::ResourceExhausted,
        "{}",
        err.message()
    );
    node.stop().await;
}

#[actix::test]
async fn a_deleted_pod_frees_its_slices_without_waiting_for_an_allocate() {
    let cluster = MemoryCluster::new();
    let metrics = free_port();
    let api = Arc::new(cluster.clone());
    let node = Node::start_with(2, cluster.clone(), api, None, Some(metrics)).await;
    let a = node.uuids[0].clone();
    let pod = bound_pod("short", &["app"], &format!("{a},NVIDIA,1000,10:;"));
    let uid = pod.uid.clone();
    cluster.put_pod(NODE, pod);
    let mut client = node.client().await;
    client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap();
    let shared = format!("hami_gpu_shared_count{{node=\"{NODE}\",device_uuid=\"{a}\"");
    let count = |text: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(&shared))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        count(&http_get(metrics, "/metrics").await).as_deref(),
        Some("1.0")
    );

    cluster.delete_pod(&uid);
    within("the slice to be freed", async {
        while count(&http_get(metrics, "/metrics").await).as_deref() != Some("0.0") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    node.stop().await;
}

#[actix::test]
async fn metrics_show_what_hami_core_reports_per_container() {
    use proto::hami::shared_region::{
        Device, Layout, MemoryUse, Process, ProcessDeviceUse, SharedRegion, encode,
    };

    let cluster = MemoryCluster::new();
    let metrics = free_port();
    let api = Arc::new(cluster.clone());
    let node = Node::start_with(10, cluster.clone(), api, None, Some(metrics)).await;
    let a = node.uuids[0].clone();
    cluster.put_pod(
        NODE,
        bound_pod("train", &["app"], &format!("{a},NVIDIA,3000,30:;")),
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("train")));
    let mut client = node.client().await;
    client
        .allocate(allocate_request(&[format!("{a}-1")]))
        .await
        .unwrap();

    // HAMi-core in the container: one process holding 1000 MiB at 25 % SM.
    let containers = node.dir.path().join("hook/vgpu/containers");
    let region = SharedRegion {
        layout: Layout::V1 { minor: 2 },
        devices: vec![Device {
            uuid: Some(a.clone()),
            memory_limit: 3000 << 20,
            sm_limit: 30,
        }],
        processes: vec![Process {
            pid: 7,
            host_pid: 4242,
            status: 1,
            devices: vec![ProcessDeviceUse {
                memory: MemoryUse {
                    context: 300 << 20,
                    module: 0,
                    data: 700 << 20,
                    offset: 0,
                    total: 1000 << 20,
                },
                monitor_used: 1000 << 20,
                sm_util: 25,
            }],
        }],
        utilization_switch: 1,
        recent_kernel: 2,
        priority: 1,
        last_kernel_time: Some(0),
    };
    std::fs::write(
        containers.join("uid-train_app/0123.cache"),
        encode(&region).unwrap(),
    )
    .unwrap();
    // A container whose file is torn: skipped and counted, the rest still shown.
    std::fs::create_dir_all(containers.join("uid-train_other")).unwrap();
    std::fs::write(
        containers.join("uid-train_other/0456.cache"),
        &encode(&region).unwrap()[..4096],
    )
    .unwrap();

    let text = http_get(metrics, "/metrics").await;
    let labels = format!(
        "{{namespace=\"ns\",pod=\"train\",container=\"app\",vdevice_index=\"0\",device_uuid=\"{a}\"}}"
    );
    for line in [
        format!("hami_vgpu_memory_used_bytes{labels} 1048576000.0"),
        format!("hami_vgpu_memory_limit_bytes{labels} 3145728000.0"),
        format!("hami_container_device_utilization_ratio{labels} 25.0"),
        format!(
            "hami_host_gpu_memory_used_bytes{{node=\"{NODE}\",device_uuid=\"{a}\",device_index=\"0\",device_type=\"NVIDIA-Tesla T4\"}} 0.0"
        ),
        "gpuslice_hami_core_cache_errors_total{reason=\"length\"} 1".to_owned(),
    ] {
        assert!(text.contains(&line), "{line} not in {text}");
    }
    assert!(!text.contains("container=\"other\""), "{text}");
    node.stop().await;
}

// === MIG ===

/// A daemon in `operatingMode: mig` with two simulated A100-40GB.
async fn start_mig(cluster: &MemoryCluster) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let a100 = SimulatedGpu {
        model: "NVIDIA A100-SXM4-40GB".into(),
        memory_mib: 40_960,
        numa: 0,
        nvlink_group: None,
        nvlinks: 12,
    };
    let settings = Settings {
        simulated_gpu_list: vec![a100.clone(), a100],
        operating_mode: OperatingMode::Mig,
        ..settings(dir.path(), 10)
    };
    Node::start_configured(settings, cluster.clone(), Arc::new(cluster.clone()), dir).await
}

fn with_annotation(mut pod: PodView, key: &str, value: &str) -> PodView {
    pod.annotations.insert(key.to_owned(), value.to_owned());
    pod
}

/// A pod whose scheduler recorded its instance gets that instance; one
/// without gets the daemon's own choice around the instances recorded on
/// the node. Each container sees its MIG device and no HAMi-core limits,
/// and the instances are written back with their runtime identity.
#[actix::test]
async fn a_mig_pod_gets_the_schedulers_placement_or_else_the_daemons_own() {
    let cluster = MemoryCluster::new();
    let node = start_mig(&cluster).await;
    let a = node.uuids[0].clone();
    let mut client = node.client().await;

    // The scheduler put a 2g.10gb at slices 4-5 (its own rule would pick 0-1).
    let scheduled = with_annotation(
        bound_pod("scheduled", &["app"], &format!("{a},NVIDIA,10240,28:;")),
        keys::VGPU_MIG_ALLOCATIONS,
        &format!(
            r#"[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{a}","profile":"2g.10gb","placement":{{"start":4,"size":2}}}}]"#
        ),
    );
    cluster.put_pod(NODE, scheduled);
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("scheduled")));
    let reply = client
        .allocate(allocate_request(&[format!("{a}-0")]))
        .await
        .unwrap()
        .into_inner();
    let env = &reply.container_responses[0].envs;
    assert!(env["NVIDIA_VISIBLE_DEVICES"].starts_with("MIG-"), "{env:?}");
    assert!(
        !env.keys()
            .any(|k| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT") || k == "CUDA_DEVICE_SM_LIMIT"),
        "{env:?}"
    );
    let pod = cluster.pod("ns", "scheduled").unwrap();
    let written =
        proto::hami::mig::decode_allocations(pod.annotation(keys::VGPU_MIG_ALLOCATIONS).unwrap())
            .unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(
        (written[0].profile.as_str(), written[0].placement.start),
        ("2g.10gb", 4)
    );
    let runtime = written[0]
        .runtime
        .as_ref()
        .expect("runtime identity written");
    assert_eq!(runtime.mig_uuid, env["NVIDIA_VISIBLE_DEVICES"]);
    assert_eq!(runtime.gpu_instance_id, 4);
    assert_eq!(pod.annotation(keys::BIND_PHASE), Some("success"));

    // No placement recorded (a scheduler that writes none): the daemon's
    // choice, by the scheduler's rule, around the other pod's slices 4-5.
    // A 3g.20gb is tried from the top (4-7) first; 4-5 being taken, it
    // gets 0-3.
    cluster.put_pod(
        NODE,
        bound_pod("unplaced", &["app"], &format!("{a},NVIDIA,20480,42:;")),
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("unplaced")));
    let reply = client
        .allocate(allocate_request(&[format!("{a}-1")]))
        .await
        .unwrap()
        .into_inner();
    let mig_uuid = reply.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].clone();
    let pod = cluster.pod("ns", "unplaced").unwrap();
    let written =
        proto::hami::mig::decode_allocations(pod.annotation(keys::VGPU_MIG_ALLOCATIONS).unwrap())
            .unwrap();
    assert_eq!(
        (
            written[0].profile.as_str(),
            written[0].placement.start,
            written[0].placement.size
        ),
        ("3g.20gb", 0, 4)
    );
    assert_eq!(written[0].runtime.as_ref().unwrap().mig_uuid, mig_uuid);

    // Now 0-5 are taken: a third pod asking a 3g.20gb has no placement
    // and is refused with the reason (memory and slots would still fit).
    cluster.put_pod(
        NODE,
        bound_pod("no-room", &["app"], &format!("{a},NVIDIA,20480,42:;")),
    );
    cluster.set_node_annotation_now(NODE, keys::NODE_LOCK, Some(&lock_for("no-room")));
    let refused = client
        .allocate(allocate_request(&[format!("{a}-2")]))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused
            .message()
            .contains("no MIG profile holding 20480 MiB"),
        "{refused:?}"
    );
    assert_eq!(
        cluster
            .pod("ns", "no-room")
            .unwrap()
            .annotation(keys::BIND_PHASE),
        Some("failed")
    );
    node.stop().await;
}

//! fake-kubelet against a device plugin written here (not node-daemon): a
//! tonic `DevicePlugin` on a tempdir socket that registers, advertises devices
//! through `ListAndWatch`, answers `GetPreferredAllocation` and logs every
//! `Allocate` call. No Kubernetes: pods go through `FakeKubelet::admit*`, the
//! entry point the pod watcher uses too.

// Test helpers outside #[test] functions may unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use integration::fake_kubelet::{
    Config, FakeKubelet, NodeDevices, Outcome, PodAdmission, ResourceCount,
    UNEXPECTED_ADMISSION_ERROR, record,
};
use k8s_openapi::api::core::v1::Pod;
use proto::deviceplugin::v1beta1 as api;
use proto::deviceplugin::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use serde_json::json;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "example.com/gpu";
const DEADLINE: Duration = Duration::from_secs(10);

// === the test device plugin ===

/// What the plugin saw.
#[derive(Default)]
struct Log {
    /// Device IDs of each `Allocate` call, in arrival order.
    allocations: Mutex<Vec<Vec<String>>>,
    /// `GetPreferredAllocation` requests, in arrival order.
    preferred: Mutex<Vec<api::ContainerPreferredAllocationRequest>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// `Allocate` calls still to fail.
    failures_left: AtomicUsize,
    /// Times the plugin noticed its socket was wiped.
    wipes: AtomicUsize,
    /// `Allocate` lingers this long (ms) so that overlapping calls would show.
    allocate_delay_ms: AtomicU64,
}

#[derive(Clone)]
struct TestPlugin {
    devices: watch::Receiver<Vec<api::Device>>,
    log: Arc<Log>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for TestPlugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(api::ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    /// Prefers the highest-numbered available IDs, so a test can tell the
    /// hint was used.
    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut responses = Vec::new();
        for r in request.into_inner().container_requests {
            self.log.preferred.lock().unwrap().push(r.clone());
            let mut ids = r.must_include_device_i_ds.clone();
            for id in r.available_device_i_ds.iter().rev() {
                if ids.len() >= r.allocation_size as usize {
                    break;
                }
                if !ids.contains(id) {
                    ids.push(id.clone());
                }
            }
            responses.push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let now = self.log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.log.max_in_flight.fetch_max(now, Ordering::SeqCst);
        // Stay in flight a moment so that any concurrent call would overlap.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let delay = self.log.allocate_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let request = request.into_inner();
        let result = if self.log.failures_left.load(Ordering::SeqCst) > 0 {
            self.log.failures_left.fetch_sub(1, Ordering::SeqCst);
            Err(Status::internal("boom"))
        } else {
            let responses = request
                .container_requests
                .iter()
                .map(|c| {
                    self.log
                        .allocations
                        .lock()
                        .unwrap()
                        .push(c.devices_ids.clone());
                    api::ContainerAllocateResponse {
                        envs: [("TEST_DEVICES".to_owned(), c.devices_ids.join(","))]
                            .into_iter()
                            .collect(),
                        mounts: vec![api::Mount {
                            container_path: "/usr/lib/test".into(),
                            host_path: "/opt/test".into(),
                            read_only: true,
                        }],
                        ..Default::default()
                    }
                })
                .collect();
            Ok(Response::new(api::AllocateResponse {
                container_responses: responses,
            }))
        };
        self.log.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A running test plugin: serves its socket, registers, and (like real
/// plugins) serves and registers again whenever its socket is wiped.
struct PluginHandle {
    devices: watch::Sender<Vec<api::Device>>,
    log: Arc<Log>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PluginHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn device(id: &str, healthy: bool) -> api::Device {
    api::Device {
        id: id.into(),
        health: if healthy {
            api::HEALTHY
        } else {
            api::UNHEALTHY
        }
        .into(),
        topology: None,
    }
}

fn devices(n: usize) -> Vec<api::Device> {
    (0..n).map(|i| device(&format!("dev-{i}"), true)).collect()
}

async fn register(dir: &Path, endpoint: &str) -> Result<(), Status> {
    let channel = integration::fake_kubelet::registration::dial(dir.join(api::KUBELET_SOCKET))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let request = api::RegisterRequest {
        version: api::VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: RESOURCE.into(),
        options: Some(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    RegistrationClient::new(channel)
        .register(request)
        .await
        .map(|_| ())
}

/// Waits (polling the filesystem, which has no event to await here) until
/// `condition` holds.
async fn until_path(path: &Path, condition: impl Fn(bool) -> bool) {
    while !condition(path.exists()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn start_plugin(dir: PathBuf, initial: Vec<api::Device>) -> PluginHandle {
    let (devices, rx) = watch::channel(initial);
    let log = Arc::new(Log {
        allocate_delay_ms: AtomicU64::new(5),
        ..Log::default()
    });
    let plugin = TestPlugin {
        devices: rx,
        log: log.clone(),
    };
    let endpoint = "test-plugin.sock";
    let task = tokio::spawn(async move {
        let socket = dir.join(endpoint);
        loop {
            until_path(&dir.join(api::KUBELET_SOCKET), |exists| exists).await;
            let _ = std::fs::remove_file(&socket);
            let listener = UnixListener::bind(&socket).unwrap();
            let (stop, stopped) = oneshot::channel::<()>();
            let server = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(DevicePluginServer::new(plugin.clone()))
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                        let _ = stopped.await;
                    }),
            );
            while register(&dir, endpoint).await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            until_path(&socket, |exists| !exists).await;
            plugin.log.wipes.fetch_add(1, Ordering::SeqCst);
            let _ = stop.send(());
            let _ = server.await;
        }
    });
    PluginHandle { devices, log, task }
}

// === helpers ===

struct Node {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    records: PathBuf,
    kubelet: FakeKubelet,
}

async fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let records = tmp.path().join("records");
    let kubelet = FakeKubelet::start(Config {
        dir: dir.clone(),
        record_dir: Some(records.clone()),
    })
    .await
    .unwrap();
    Node {
        _dir: tmp,
        dir,
        records,
        kubelet,
    }
}

/// A pod created `created` seconds after a fixed instant, with app containers
/// `(name, devices)` and init containers likewise.
fn pod(name: &str, created: u32, containers: &[(&str, u32)], init: &[(&str, u32)]) -> Pod {
    let c = |(n, g): &(&str, u32)| json!({"name": n, "image": "busybox", "resources": {"limits": {RESOURCE: g.to_string(), "cpu": "100m"}}});
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": format!("2026-01-01T00:{:02}:{:02}Z", created / 60, created % 60),
        },
        "spec": {
            "nodeName": "node-a",
            "containers": containers.iter().map(c).collect::<Vec<_>>(),
            "initContainers": init.iter().map(c).collect::<Vec<_>>(),
        },
    }))
    .unwrap()
}

fn count(view: &NodeDevices) -> ResourceCount {
    view.counts.get(RESOURCE).copied().unwrap_or_default()
}

async fn registered_with(node: &Node, n: u64) -> NodeDevices {
    node.kubelet
        .wait_devices(DEADLINE, "registration and devices", |v| {
            v.connected.contains(RESOURCE)
                && count(v)
                    == ResourceCount {
                        capacity: n,
                        allocatable: n,
                    }
        })
        .await
        .unwrap()
}

fn ids(a: &PodAdmission) -> Vec<String> {
    a.containers
        .iter()
        .flat_map(|c| c.device_ids.clone())
        .collect()
}

// === tests ===

#[tokio::test]
async fn capacity_follows_list_and_watch_health() {
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(4));
    registered_with(&node, 4).await;

    plugin
        .devices
        .send_modify(|d| d[2].health = api::UNHEALTHY.into());
    let view = node
        .kubelet
        .wait_devices(DEADLINE, "one unhealthy device", |v| {
            count(v)
                == ResourceCount {
                    capacity: 4,
                    allocatable: 3,
                }
        })
        .await
        .unwrap();
    assert!(view.devices[RESOURCE].contains(&("dev-2".to_owned(), false)));

    plugin.devices.send_modify(|d| {
        d.pop();
    });
    node.kubelet
        .wait_devices(DEADLINE, "three devices", |v| {
            count(v)
                == ResourceCount {
                    capacity: 3,
                    allocatable: 2,
                }
        })
        .await
        .unwrap();

    // A plugin that goes away leaves its devices unhealthy: allocatable 0.
    drop(plugin);
    node.kubelet
        .wait_devices(DEADLINE, "plugin gone", |v| {
            !v.connected.contains(RESOURCE)
                && count(v)
                    == ResourceCount {
                        capacity: 3,
                        allocatable: 0,
                    }
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn allocate_calls_are_serial_and_in_creation_order() {
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(20));
    registered_with(&node, 20).await;

    // Sizes tell the pods apart at the plugin, which never learns pod names.
    let batch = vec![
        pod("c", 3, &[("main", 4)], &[]),
        pod("a", 1, &[("main", 3)], &[]),
        pod("d", 4, &[("main", 2)], &[]),
        pod("b", 2, &[("main", 1)], &[]),
    ];
    let second = vec![
        pod("f", 6, &[("main", 2)], &[]),
        pod("e", 5, &[("main", 1), ("side", 1)], &[]),
    ];
    let first_rx = node.kubelet.submit(batch).unwrap();
    let second_rx = node.kubelet.submit(second).unwrap();
    let (first, second) = (first_rx.await.unwrap(), second_rx.await.unwrap());

    let order: Vec<&str> = first
        .iter()
        .chain(&second)
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(order, ["a", "b", "c", "d", "e", "f"]);
    assert!(first.iter().chain(&second).all(PodAdmission::is_running));

    let calls = plugin.log.allocations.lock().unwrap().clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        [3, 1, 4, 2, 1, 1, 2],
        "one Allocate per container, pods in creation order"
    );
    assert_eq!(
        plugin.log.max_in_flight.load(Ordering::SeqCst),
        1,
        "Allocate calls overlapped"
    );

    // Every call was preceded by a GetPreferredAllocation of the same size,
    // and the hint (highest free IDs) was used.
    let preferred = plugin.log.preferred.lock().unwrap().clone();
    assert_eq!(
        preferred
            .iter()
            .map(|p| p.allocation_size as usize)
            .collect::<Vec<_>>(),
        sizes
    );
    assert_eq!(calls[0], ["dev-9", "dev-8", "dev-7"]);
    let all: std::collections::BTreeSet<String> = calls.iter().flatten().cloned().collect();
    assert_eq!(all.len(), 14, "no device handed out twice");
    let recorded: Vec<Vec<String>> = first
        .iter()
        .chain(&second)
        .flat_map(|a| a.containers.iter().map(|c| c.device_ids.clone()))
        .collect();
    assert_eq!(recorded, calls);
}

#[tokio::test]
async fn a_large_shuffled_batch_is_admitted_serially_in_creation_order() {
    const PODS: u32 = 100;
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(PODS as usize));
    plugin.log.allocate_delay_ms.store(0, Ordering::SeqCst);
    registered_with(&node, u64::from(PODS)).await;

    // A fixed permutation of creation times (7 is coprime with 300).
    let batch: Vec<Pod> = (0..PODS)
        .map(|i| (i * 7) % PODS)
        .map(|t| pod(&format!("p{t:03}"), t, &[("main", 1)], &[]))
        .collect();
    let started = std::time::Instant::now();
    let admitted = node.kubelet.admit_batch(batch).await.unwrap();
    let elapsed = started.elapsed();
    eprintln!(
        "admitted {PODS} pods in {elapsed:?} ({:?} per pod, plugin answering at once)",
        elapsed / PODS
    );

    let names: Vec<String> = admitted.iter().map(|a| a.name.clone()).collect();
    let expected: Vec<String> = (0..PODS).map(|t| format!("p{t:03}")).collect();
    assert_eq!(names, expected);
    assert!(admitted.iter().all(PodAdmission::is_running));
    assert_eq!(plugin.log.max_in_flight.load(Ordering::SeqCst), 1);
    let calls = plugin.log.allocations.lock().unwrap().clone();
    let recorded: Vec<Vec<String>> = admitted.iter().map(ids).collect();
    assert_eq!(
        calls, recorded,
        "plugin saw Allocate calls in admission order"
    );
    node.kubelet
        .wait_devices(DEADLINE, "all allocatable used", |v| {
            v.allocations.len() == PODS as usize
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn insufficient_devices_fail_the_pod_like_kubelet() {
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(2));
    registered_with(&node, 2).await;

    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 2)], &[]))
        .await
        .unwrap();
    assert!(a.is_running());
    let b = node
        .kubelet
        .admit(pod("b", 2, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert_eq!(
        b.outcome,
        Outcome::Failed {
            reason: UNEXPECTED_ADMISSION_ERROR.into(),
            message: "Pod was rejected: Allocate failed due to requested number of devices unavailable for example.com/gpu. \
                      Requested: 1, Available: 0, which is unexpected"
                .into(),
        }
    );
    assert!(b.containers.is_empty());
    assert_eq!(
        plugin.log.allocations.lock().unwrap().len(),
        1,
        "no Allocate for the rejected pod"
    );

    let rec = record::read_record(&node.records, "ns", "b").unwrap();
    assert_eq!(rec, b);
}

#[tokio::test]
async fn deleting_a_pod_frees_its_device_ids() {
    let node = node().await;
    let _plugin = start_plugin(node.dir.clone(), devices(1));
    registered_with(&node, 1).await;

    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert_eq!(ids(&a), ["dev-0"]);
    assert!(
        !node
            .kubelet
            .admit(pod("b", 2, &[("main", 1)], &[]))
            .await
            .unwrap()
            .is_running()
    );
    assert!(node.kubelet.remove_pod("uid-a").await.unwrap());
    assert!(!node.kubelet.devices().allocations.contains_key("uid-a"));
    let c = node
        .kubelet
        .admit(pod("c", 3, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert_eq!(ids(&c), ["dev-0"]);
}

#[tokio::test]
async fn restart_wipes_sockets_plugin_registers_again_and_running_pods_keep_devices() {
    let mut node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(2));
    registered_with(&node, 2).await;
    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 1)], &[]))
        .await
        .unwrap();
    let before = node.kubelet.devices().registrations;

    node.kubelet.restart().await.unwrap();
    node.kubelet
        .wait_devices(DEADLINE, "re-registration", |v| {
            v.registrations > before
                && count(v)
                    == ResourceCount {
                        capacity: 2,
                        allocatable: 2,
                    }
        })
        .await
        .unwrap();
    assert_eq!(
        plugin.log.wipes.load(Ordering::SeqCst),
        1,
        "the plugin saw its socket wiped once"
    );
    assert!(
        node.dir
            .join(integration::fake_kubelet::checkpoint::CHECKPOINT_FILE)
            .exists(),
        "checkpoint survives"
    );

    // The running pod is admitted again after the restart without Allocate.
    let mut running = pod("a", 1, &[("main", 1)], &[]);
    running.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let again = node.kubelet.admit(running).await.unwrap();
    assert!(again.is_running());
    assert_eq!(ids(&again), ids(&a));
    assert_eq!(
        again.containers[0].reply, a.containers[0].reply,
        "reply kept from the checkpoint"
    );
    assert_eq!(plugin.log.allocations.lock().unwrap().len(), 1);

    let b = node
        .kubelet
        .admit(pod("b", 2, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert!(b.is_running());
    assert_ne!(ids(&b), ids(&a));
    assert_eq!(plugin.log.allocations.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn restarted_process_restores_allocations_from_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let first = FakeKubelet::start(Config {
        dir: dir.clone(),
        record_dir: None,
    })
    .await
    .unwrap();
    let plugin = start_plugin(dir.clone(), devices(2));
    first
        .wait_devices(DEADLINE, "registration", |v| count(v).allocatable == 2)
        .await
        .unwrap();
    let a = first.admit(pod("a", 1, &[("main", 1)], &[])).await.unwrap();
    first.shutdown().await;

    let second = FakeKubelet::start(Config {
        dir: dir.clone(),
        record_dir: None,
    })
    .await
    .unwrap();
    assert_eq!(
        second.devices().allocations["uid-a"]["main"][RESOURCE],
        ids(&a)
    );
    second
        .wait_devices(DEADLINE, "re-registration", |v| count(v).allocatable == 2)
        .await
        .unwrap();
    let b = second
        .admit(pod("b", 2, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert_ne!(ids(&b), ids(&a));
    drop(plugin);
}

#[tokio::test]
async fn allocate_failure_fails_the_pod_and_releases_its_devices() {
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(1));
    registered_with(&node, 1).await;
    plugin.log.failures_left.store(1, Ordering::SeqCst);

    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 1)], &[]))
        .await
        .unwrap();
    let Outcome::Failed { reason, message } = &a.outcome else {
        panic!("admitted: {a:?}")
    };
    assert_eq!(reason, UNEXPECTED_ADMISSION_ERROR);
    assert_eq!(
        message,
        "Pod was rejected: Allocate failed due to rpc error: code = Internal desc = boom, which is unexpected"
    );
    let b = node
        .kubelet
        .admit(pod("b", 2, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert_eq!(ids(&b), ["dev-0"]);
}

#[tokio::test]
async fn init_container_devices_are_reused_by_app_containers() {
    let node = node().await;
    let plugin = start_plugin(node.dir.clone(), devices(2));
    registered_with(&node, 2).await;

    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 1)], &[("init", 1)]))
        .await
        .unwrap();
    let per_container: Vec<(&str, bool, &[String])> = a
        .containers
        .iter()
        .map(|c| (c.container.as_str(), c.init, c.device_ids.as_slice()))
        .collect();
    assert_eq!(per_container.len(), 2);
    assert_eq!((per_container[0].0, per_container[0].1), ("init", true));
    assert_eq!(
        per_container[0].2, per_container[1].2,
        "app container reuses the init container's device"
    );
    let preferred = plugin.log.preferred.lock().unwrap().clone();
    assert_eq!(
        preferred.len(),
        1,
        "reuse alone satisfies the app container: no hint asked"
    );

    let b = node
        .kubelet
        .admit(pod("b", 2, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert!(b.is_running(), "the second device is still free: {b:?}");
}

#[tokio::test]
async fn records_carry_the_allocate_reply() {
    let node = node().await;
    let _plugin = start_plugin(node.dir.clone(), devices(2));
    registered_with(&node, 2).await;
    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 2)], &[]))
        .await
        .unwrap();
    let rec = record::read_record(&node.records, "ns", "a").unwrap();
    assert_eq!(rec, a);
    let reply = &rec.containers[0].reply;
    assert_eq!(
        reply.envs["TEST_DEVICES"],
        rec.containers[0].device_ids.join(",")
    );
    assert_eq!(reply.mounts[0].host_path, "/opt/test");
}

#[tokio::test]
async fn register_keeps_dialling_until_the_plugin_socket_answers() {
    let node = node().await;
    let (_devices, rx) = watch::channel(devices(2));
    let plugin = TestPlugin {
        devices: rx,
        log: Arc::new(Log::default()),
    };
    // Register first; the plugin's socket only appears afterwards.
    let dir = node.dir.clone();
    let registering = tokio::spawn(async move { register(&dir, "late.sock").await });
    tokio::task::yield_now().await;
    let listener = UnixListener::bind(node.dir.join("late.sock")).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    registering.await.unwrap().unwrap();
    registered_with(&node, 2).await;
    server.abort();
}

#[tokio::test]
async fn pod_resources_api_lists_active_pods_and_their_devices() {
    use proto::podresources::v1 as pr;
    use proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let socket = tmp.path().join("pod-resources").join("kubelet.sock");
    let options = integration::fake_kubelet::Options {
        pod_resources_socket: Some(socket.clone()),
        ..Default::default()
    };
    let config = Config {
        dir: dir.clone(),
        record_dir: None,
    };
    let kubelet = FakeKubelet::start_with(config, options).await.unwrap();
    let plugin = start_plugin(dir, devices(3));
    kubelet
        .wait_devices(DEADLINE, "registration", |v| count(v).allocatable == 3)
        .await
        .unwrap();
    plugin
        .devices
        .send_modify(|d| d[0].health = api::UNHEALTHY.into());
    kubelet
        .wait_devices(DEADLINE, "dev-0 unhealthy", |v| count(v).allocatable == 2)
        .await
        .unwrap();

    let a = kubelet
        .admit(pod("a", 1, &[("main", 1), ("side", 1)], &[("init", 1)]))
        .await
        .unwrap();
    assert!(a.is_running());
    assert!(
        !kubelet
            .admit(pod("b", 2, &[("main", 2)], &[]))
            .await
            .unwrap()
            .is_running()
    );

    let channel = integration::fake_kubelet::registration::dial(socket)
        .await
        .unwrap();
    let mut client = PodResourcesListerClient::new(channel);
    let listed = client
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    assert_eq!(listed.len(), 1, "only the admitted pod: {listed:?}");
    let a_res = &listed[0];
    assert_eq!((a_res.name.as_str(), a_res.namespace.as_str()), ("a", "ns"));
    let per_container: Vec<(String, Vec<String>)> = a_res
        .containers
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.devices
                    .iter()
                    .flat_map(|d| d.device_ids.clone())
                    .collect(),
            )
        })
        .collect();
    let expected: Vec<(String, Vec<String>)> = a
        .containers
        .iter()
        .filter(|c| !c.init)
        .map(|c| (c.container.clone(), c.device_ids.clone()))
        .collect();
    assert_eq!(per_container, expected, "init containers are not listed");

    let got = client
        .get(pr::GetPodResourcesRequest {
            pod_name: "a".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.as_ref(), Some(a_res));
    let missing = client
        .get(pr::GetPodResourcesRequest {
            pod_name: "b".into(),
            pod_namespace: "ns".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.message(), "pod b in namespace ns not found");

    let allocatable = client
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocatable.devices.len(), 1);
    assert_eq!(allocatable.devices[0].resource_name, RESOURCE);
    assert_eq!(allocatable.devices[0].device_ids, ["dev-1", "dev-2"]);

    assert!(kubelet.remove_pod("uid-a").await.unwrap());
    let listed = client
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    assert!(listed.is_empty());
}

#[tokio::test]
async fn registration_is_validated_like_kubelet() {
    let tmp = tempfile::tempdir().unwrap();
    let options = integration::fake_kubelet::Options {
        dial_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let config = Config {
        dir: tmp.path().to_owned(),
        record_dir: None,
    };
    let kubelet = FakeKubelet::start_with(config, options).await.unwrap();
    let channel = integration::fake_kubelet::registration::dial(kubelet.socket())
        .await
        .unwrap();
    let mut client = RegistrationClient::new(channel);
    let bad_version = api::RegisterRequest {
        version: "v1alpha".into(),
        endpoint: "x.sock".into(),
        resource_name: RESOURCE.into(),
        options: None,
    };
    let err = client.register(bad_version).await.unwrap_err();
    assert!(
        err.message()
            .contains("requested API version \"v1alpha\" is not supported"),
        "{err:?}"
    );
    let no_socket = api::RegisterRequest {
        version: api::VERSION.into(),
        endpoint: "missing.sock".into(),
        resource_name: RESOURCE.into(),
        options: None,
    };
    let err = client.register(no_socket).await.unwrap_err();
    assert!(
        err.message().starts_with("failed to dial device plugin"),
        "{err:?}"
    );
    assert_eq!(kubelet.devices().registrations, 0);
}

#[tokio::test]
async fn pod_for_a_never_registered_resource_is_admitted_without_devices() {
    let node = node().await;
    let plain: Pod = serde_json::from_value(json!({"metadata": {"name": "plain", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}})).unwrap();
    assert!(node.kubelet.admit(plain).await.unwrap().is_running());
    // Never registered: kubelet does not treat the resource as a device-plugin
    // resource and admits the pod without allocating (its scheduler-side
    // predicates would have caught it).
    let a = node
        .kubelet
        .admit(pod("a", 1, &[("main", 1)], &[]))
        .await
        .unwrap();
    assert!(a.is_running());
    assert!(a.containers.is_empty());
}

// === end to end, against the fake apiserver ===

mod against_apiserver {
    use super::*;
    use integration::fake_apiserver::FakeApiServer;
    use integration::fake_kubelet::ALLOCATIONS_ANNOTATION;
    use integration::fake_kubelet::node::{NodeAgent, NodeConfig};
    use k8s_openapi::api::core::v1::{Event, Namespace, Node as KubeNode};
    use kube::api::{Api, DeleteParams, ListParams, PostParams};
    use kube::runtime::wait::await_condition;

    /// Waits, through a watch, until `condition` holds for object `name`.
    async fn until<K>(
        api: &Api<K>,
        name: &str,
        what: &str,
        condition: impl Fn(&K) -> bool + Send + 'static,
    ) -> K
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let waited = tokio::time::timeout(
            DEADLINE,
            await_condition(api.clone(), name, move |o: Option<&K>| {
                o.is_some_and(&condition)
            }),
        );
        match waited.await {
            Ok(Ok(Some(object))) => object,
            other => panic!("{what}: {other:?}"),
        }
    }

    fn quantity(node: &KubeNode, field: &str) -> Option<String> {
        let status = node.status.as_ref()?;
        let list = if field == "capacity" {
            status.capacity.as_ref()?
        } else {
            status.allocatable.as_ref()?
        };
        list.get(RESOURCE).map(|q| q.0.clone())
    }

    fn phase_reason(pod: &Pod) -> (Option<String>, Option<String>) {
        let status = pod.status.clone().unwrap_or_default();
        (status.phase, status.reason)
    }

    #[tokio::test]
    async fn pods_on_the_node_are_admitted_and_written_back() {
        let api = FakeApiServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let client = api.client().await.unwrap();
        let node = node().await;
        let mut config = NodeConfig::new("node-a");
        config.resources = vec![RESOURCE.into()];
        let agent = NodeAgent::start(&node.kubelet, client.clone(), config)
            .await
            .unwrap();
        let nodes: Api<KubeNode> = Api::all(client.clone());
        until(&nodes, "node-a", "node registered with 0 devices", |n| {
            quantity(n, "capacity").as_deref() == Some("0")
        })
        .await;

        let plugin = start_plugin(node.dir.clone(), devices(2));
        until(&nodes, "node-a", "capacity 2", |n| {
            quantity(n, "capacity").as_deref() == Some("2")
                && quantity(n, "allocatable").as_deref() == Some("2")
        })
        .await;

        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
        let mut a = pod("a", 1, &[("main", 2)], &[]);
        let mut b = pod("b", 2, &[("main", 1)], &[]);
        for p in [&mut a, &mut b] {
            p.metadata.uid = None;
            p.metadata.creation_timestamp = None;
        }
        pods.create(&PostParams::default(), &a).await.unwrap();
        let a = until(&pods, "a", "a Running", |p| {
            phase_reason(p).0.as_deref() == Some("Running")
        })
        .await;
        pods.create(&PostParams::default(), &b).await.unwrap();
        let b = until(&pods, "b", "b Failed", |p| {
            phase_reason(p).0.as_deref() == Some("Failed")
        })
        .await;

        assert_eq!(
            phase_reason(&b).1.as_deref(),
            Some(UNEXPECTED_ADMISSION_ERROR)
        );
        let message = b
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default();
        assert!(
            message.ends_with("Requested: 1, Available: 0, which is unexpected"),
            "{message}"
        );
        let events: Api<Event> = Api::namespaced(client.clone(), "ns");
        let events = events.list(&ListParams::default()).await.unwrap();
        assert!(
            events
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some(UNEXPECTED_ADMISSION_ERROR)
                    && e.involved_object.name.as_deref() == Some("b"))
        );

        // The allocation is on the pod and in the record file, identically.
        let annotation = a
            .metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(ALLOCATIONS_ANNOTATION))
            .cloned()
            .unwrap();
        let from_pod: Vec<integration::fake_kubelet::ContainerAllocation> =
            serde_json::from_str(&annotation).unwrap();
        let rec = record::read_record(&node.records, "ns", "a").unwrap();
        assert_eq!(from_pod, rec.containers);
        assert_eq!(rec.uid, a.metadata.uid.clone().unwrap());
        assert_eq!(from_pod[0].device_ids.len(), 2);
        assert_eq!(
            plugin.log.allocations.lock().unwrap().clone(),
            [from_pod[0].device_ids.clone()]
        );

        // Deleting a frees its devices for c.
        pods.delete("a", &DeleteParams::default()).await.unwrap();
        node.kubelet
            .wait_devices(DEADLINE, "a freed", |v| v.allocations.is_empty())
            .await
            .unwrap();
        let mut c = pod("c", 3, &[("main", 1)], &[]);
        c.metadata.uid = None;
        pods.create(&PostParams::default(), &c).await.unwrap();
        until(&pods, "c", "c Running", |p| {
            phase_reason(p).0.as_deref() == Some("Running")
        })
        .await;

        // Health changes reach the node: allocatable drops, capacity stays.
        plugin
            .devices
            .send_modify(|d| d[0].health = api::UNHEALTHY.into());
        until(&nodes, "node-a", "one unhealthy", |n| {
            quantity(n, "capacity").as_deref() == Some("2")
                && quantity(n, "allocatable").as_deref() == Some("1")
        })
        .await;

        agent.shutdown().await;
        api.shutdown().await;
    }

    fn running(p: &Pod) -> bool {
        phase_reason(p).0.as_deref() == Some("Running")
    }

    fn bare(name: &str, created: u32, gpus: u32) -> Pod {
        let mut p = pod(name, created, &[("main", gpus)], &[]);
        p.metadata.uid = None;
        p.metadata.creation_timestamp = None;
        p
    }

    #[tokio::test]
    async fn running_pods_survive_a_process_restart_and_a_cut_watch_without_new_allocate() {
        let api = FakeApiServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let client = api.client().await.unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("device-plugins");
        let config = || Config {
            dir: dir.clone(),
            record_dir: None,
        };
        let nodes: Api<KubeNode> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");

        let kubelet = FakeKubelet::start(config()).await.unwrap();
        let agent = NodeAgent::start(&kubelet, client.clone(), NodeConfig::new("node-a"))
            .await
            .unwrap();
        let plugin = start_plugin(dir.clone(), devices(3));
        until(&nodes, "node-a", "capacity 3", |n| {
            quantity(n, "allocatable").as_deref() == Some("3")
        })
        .await;
        pods.create(&PostParams::default(), &bare("a", 1, 1))
            .await
            .unwrap();
        let a = until(&pods, "a", "a Running", running).await;
        let a_devices = a.metadata.annotations.clone().unwrap()[ALLOCATIONS_ANNOTATION].clone();

        // A new kubelet process on the same folder: sockets wiped, the
        // plugin registers again, the running pod keeps its devices.
        agent.shutdown().await;
        kubelet.shutdown().await;
        let kubelet = FakeKubelet::start(config()).await.unwrap();
        let agent = NodeAgent::start(&kubelet, client.clone(), NodeConfig::new("node-a"))
            .await
            .unwrap();
        kubelet
            .wait_devices(DEADLINE, "re-registration", |v| count(v).allocatable == 3)
            .await
            .unwrap();
        until(&nodes, "node-a", "capacity 3 again", |n| {
            quantity(n, "allocatable").as_deref() == Some("3")
        })
        .await;
        assert_eq!(plugin.log.wipes.load(Ordering::SeqCst), 1);

        // Cut every watch: the pod watcher relists; nothing is admitted twice.
        api.cut_watches();
        pods.create(&PostParams::default(), &bare("b", 2, 1))
            .await
            .unwrap();
        let b = until(&pods, "b", "b Running", running).await;
        pods.create(&PostParams::default(), &bare("c", 3, 2))
            .await
            .unwrap();
        let c = until(&pods, "c", "c Failed", |p| {
            phase_reason(p).0.as_deref() == Some("Failed")
        })
        .await;
        assert!(
            c.status
                .unwrap()
                .message
                .unwrap()
                .contains("Requested: 2, Available: 1")
        );

        let a_now = pods.get("a").await.unwrap();
        assert!(running(&a_now));
        assert_eq!(
            a_now.metadata.annotations.unwrap()[ALLOCATIONS_ANNOTATION],
            a_devices
        );
        let calls = plugin.log.allocations.lock().unwrap().clone();
        assert_eq!(
            calls.len(),
            2,
            "one Allocate for a before the restart, one for b after: {calls:?}"
        );
        let b_devices = b.metadata.annotations.unwrap()[ALLOCATIONS_ANNOTATION].clone();
        assert_ne!(b_devices, a_devices);
        let held = kubelet.devices().allocations;
        assert_eq!(
            held.len(),
            2,
            "a (from the checkpoint) and b hold devices: {held:?}"
        );

        agent.shutdown().await;
        kubelet.shutdown().await;
        api.shutdown().await;
    }

    #[tokio::test]
    async fn graceful_deletion_is_confirmed_and_frees_devices() {
        let options = integration::fake_apiserver::Options {
            graceful_pod_deletion: true,
            ..Default::default()
        };
        let api = FakeApiServer::start_with("127.0.0.1:0".parse().unwrap(), options)
            .await
            .unwrap();
        let client = api.client().await.unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let node = node().await;
        let agent = NodeAgent::start(&node.kubelet, client.clone(), NodeConfig::new("node-a"))
            .await
            .unwrap();
        let _plugin = start_plugin(node.dir.clone(), devices(1));
        registered_with(&node, 1).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");

        pods.create(&PostParams::default(), &bare("a", 1, 1))
            .await
            .unwrap();
        let a = until(&pods, "a", "a Running", running).await;
        pods.delete("a", &DeleteParams::default()).await.unwrap();
        let uid = a.metadata.uid.clone().unwrap();
        let gone = tokio::time::timeout(
            DEADLINE,
            await_condition(
                pods.clone(),
                "a",
                kube::runtime::wait::conditions::is_deleted(&uid),
            ),
        );
        gone.await.expect("kubelet confirms the deletion").unwrap();
        // The watch can show the pod gone before the kubelet's DELETE is in
        // the server's log (it is logged once served), so wait for the log.
        let deletes = |log: &[integration::fake_apiserver::RequestRecord]| {
            log.iter()
                .filter(|r| r.method == "DELETE" && r.path == "/api/v1/namespaces/ns/pods/a")
                .count()
        };
        let log = api
            .wait_for_requests(DEADLINE, |log| deletes(log) >= 2)
            .await
            .expect("the kubelet's delete is logged");
        assert_eq!(
            deletes(&log),
            2,
            "the user's graceful delete, then the kubelet's grace-0 one"
        );
        node.kubelet
            .wait_devices(DEADLINE, "a freed", |v| v.allocations.is_empty())
            .await
            .unwrap();
        pods.create(&PostParams::default(), &bare("b", 2, 1))
            .await
            .unwrap();
        until(&pods, "b", "b Running", running).await;

        agent.shutdown().await;
        api.shutdown().await;
    }

    /// Kills the child on drop so a failing test leaves no process behind.
    struct ChildGuard(std::process::Child);

    impl Drop for ChildGuard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn the_binary_admits_pods_against_an_apiserver_and_stops_on_sigterm() {
        let api = FakeApiServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let client = api.client().await.unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (dir, records, kubeconfig) = (
            tmp.path().join("dp"),
            tmp.path().join("records"),
            tmp.path().join("kc"),
        );
        api.write_kubeconfig(&kubeconfig).unwrap();

        let child = std::process::Command::new(env!("CARGO_BIN_EXE_fake-kubelet"))
            .args(["--node-name", "node-b", "--resource", RESOURCE])
            .arg("--dir")
            .arg(&dir)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--record-dir")
            .arg(&records)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut child = ChildGuard(child);
        let nodes: Api<KubeNode> = Api::all(client.clone());
        until(&nodes, "node-b", "node registered", |n| {
            quantity(n, "capacity").as_deref() == Some("0")
        })
        .await;
        let _plugin = start_plugin(dir.clone(), devices(1));
        until(&nodes, "node-b", "capacity 1", |n| {
            quantity(n, "allocatable").as_deref() == Some("1")
        })
        .await;

        let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
        let mut p = bare("a", 1, 1);
        p.spec.as_mut().unwrap().node_name = Some("node-b".into());
        pods.create(&PostParams::default(), &p).await.unwrap();
        until(&pods, "a", "a Running", running).await;
        let rec = record::read_record(&records, "ns", "a").unwrap();
        assert_eq!(rec.containers[0].device_ids, ["dev-0"]);

        let pid = child.0.id().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = tokio::task::spawn_blocking(move || child.0.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "exit status after SIGTERM: {status:?}");
        api.shutdown().await;
    }
}

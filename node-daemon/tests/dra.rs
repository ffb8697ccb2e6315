//! DRA mode end to end over real unix sockets in a temp dir: the daemon's
//! `run` with `mode: dra` (simulated GPUs, the in-memory cluster holding the
//! `ResourceClaim`s and receiving the `ResourceSlice`), a tonic client that
//! does what the kubelet does (dial the registration socket, `GetInfo`, dial
//! the endpoint it names, `NodePrepareResources` / `NodeUnprepareResources`),
//! and the CDI files the daemon writes.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use node_daemon::cluster::memory::{ClusterState, MemoryCluster};
use node_daemon::cluster::{AllocatedDevice, ClaimView};
use node_daemon::daemon::{Daemon, run};
use node_daemon::devices::DeviceSource as _;
use node_daemon::devices::simulated::{HealthSwitch, SimulatedDevices};
use node_daemon::settings::{DeviceSourceKind, Mode, Settings, SimulatedGpu};
use proto::dra::v1 as dra;
use proto::pluginregistration::v1 as reg;
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "node-a";
const SLICE: &str = "node-a-gpu.gpuslice.dev";
/// Patience for anything the test awaits.
const PATIENCE: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A channel to the unix socket at `path`, once it accepts (the kubelet's
/// plugin watcher likewise dials a socket when it appears).
async fn dial(path: &Path) -> Channel {
    within("the socket to accept", async {
        loop {
            if path.exists() {
                let endpoint = Endpoint::from_shared(format!("unix://{}", path.display())).unwrap();
                if let Ok(channel) = endpoint.connect().await {
                    return channel;
                }
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

struct Node {
    dir: tempfile::TempDir,
    cluster: MemoryCluster,
    switch: HealthSwitch,
    uuids: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), node_daemon::daemon::RunError>>>,
}

fn t4(numa: u32) -> SimulatedGpu {
    SimulatedGpu {
        model: "Tesla T4".into(),
        memory_mib: 15_360,
        numa,
        nvlink_group: None,
        nvlinks: 12,
    }
}

impl Node {
    /// Starts a DRA-mode daemon with two simulated T4s in `dir` (a new
    /// temp dir when `None`).
    async fn start(cluster: MemoryCluster, dir: Option<tempfile::TempDir>) -> Self {
        let dir = dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let d = dir.path();
        let settings = Settings {
            node_name: Some(NODE.into()),
            mode: Mode::Dra,
            device_plugin_dir: d.join("device-plugins"),
            dra_plugin_dir: d.join("plugins/gpu.gpuslice.dev"),
            plugin_registry_dir: d.join("plugins_registry"),
            cdi_dir: d.join("cdi"),
            hook_path: d.join("hook"),
            device_source: DeviceSourceKind::Simulated,
            simulated_gpu_list: vec![t4(0), t4(1)],
            metrics_bind_address: None,
            ..Settings::default()
        };
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
            cluster: Arc::new(cluster.clone()),
        };
        let done = actix::spawn(run(daemon, async {
            let _ = stopped.await;
        }));
        Self {
            dir,
            cluster,
            switch,
            uuids,
            stop: Some(stop),
            done: Some(done),
        }
    }

    fn registration_socket(&self) -> PathBuf {
        self.dir
            .path()
            .join("plugins_registry/gpu.gpuslice.dev-reg.sock")
    }

    fn cdi_file(&self, claim_uid: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("cdi/gpuslice.dev-{claim_uid}.json"))
    }

    /// What the kubelet does: `GetInfo` on the registration socket, dial
    /// the endpoint, report the registration.
    async fn kubelet(
        &self,
    ) -> (
        reg::PluginInfo,
        dra::dra_plugin_client::DraPluginClient<Channel>,
    ) {
        let mut registration = reg::registration_client::RegistrationClient::new(
            dial(&self.registration_socket()).await,
        );
        let info = registration
            .get_info(reg::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let plugin =
            dra::dra_plugin_client::DraPluginClient::new(dial(Path::new(&info.endpoint)).await);
        registration
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        (info, plugin)
    }

    async fn wait_cluster(&self, what: &str, cond: impl FnMut(&ClusterState) -> bool) {
        let mut rx = self.cluster.subscribe();
        within(what, rx.wait_for(cond)).await.unwrap();
    }

    /// Stops the daemon and returns its temp dir.
    async fn stop(mut self) -> tempfile::TempDir {
        let _ = self.stop.take().unwrap().send(());
        let result = within("shutdown", self.done.take().unwrap()).await.unwrap();
        result.unwrap();
        self.dir
    }
}

/// A claim allocated by the scheduler: one result per `(device, memory,
/// cores)` in pool `pool` (`None` leaves the capacity to its default).
fn claim(name: &str, pool: &str, results: &[(&str, Option<&str>, Option<&str>)]) -> ClaimView {
    ClaimView {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        allocated: true,
        results: results
            .iter()
            .map(|(device, memory, cores)| AllocatedDevice {
                request: "gpu".into(),
                driver: "gpu.gpuslice.dev".into(),
                pool: pool.into(),
                device: (*device).into(),
                share_id: Some(format!("share-{name}-{device}")),
                consumed: memory
                    .map(|m| ("memory".to_owned(), m.to_owned()))
                    .into_iter()
                    .chain(cores.map(|c| ("cores".to_owned(), c.to_owned())))
                    .collect::<BTreeMap<_, _>>(),
            })
            .collect(),
    }
}

fn claim_ref(name: &str) -> dra::Claim {
    dra::Claim {
        namespace: "ns".into(),
        uid: format!("uid-{name}"),
        name: name.into(),
    }
}

async fn prepare(
    plugin: &mut dra::dra_plugin_client::DraPluginClient<Channel>,
    name: &str,
) -> dra::NodePrepareResourceResponse {
    let mut answer = plugin
        .node_prepare_resources(dra::NodePrepareResourcesRequest {
            claims: vec![claim_ref(name)],
        })
        .await
        .unwrap()
        .into_inner();
    answer.claims.remove(&format!("uid-{name}")).unwrap()
}

async fn unprepare(
    plugin: &mut dra::dra_plugin_client::DraPluginClient<Channel>,
    name: &str,
) -> String {
    let mut answer = plugin
        .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref(name)],
        })
        .await
        .unwrap()
        .into_inner();
    answer.claims.remove(&format!("uid-{name}")).unwrap().error
}

fn device_names(slice: Option<&k8s_openapi::api::resource::v1::ResourceSlice>) -> Vec<String> {
    slice
        .and_then(|s| s.spec.devices.as_ref())
        .into_iter()
        .flatten()
        .map(|d| d.name.clone())
        .collect()
}

#[actix::test]
async fn registers_prepares_idempotently_refuses_over_commit_and_unprepares() {
    let cluster = MemoryCluster::new();
    cluster.put_claim(claim("c1", NODE, &[("gpu-0", Some("3000Mi"), Some("30"))]));
    let node = Node::start(cluster.clone(), None).await;
    let (info, mut plugin) = node.kubelet().await;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.gpuslice.dev");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    assert_eq!(
        PathBuf::from(&info.endpoint),
        node.dir.path().join("plugins/gpu.gpuslice.dev/dra.sock")
    );

    let first = prepare(&mut plugin, "c1").await;
    assert_eq!(first.error, "");
    assert_eq!(
        first.devices,
        [dra::Device {
            request_names: vec!["gpu".into()],
            pool_name: NODE.into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["gpuslice.dev/gpu=uid-c1".into()],
            share_id: Some("share-c1-gpu-0".into()),
        }]
    );
    // The CDI golden file, with the temp hook path written as /usr/local.
    let written = std::fs::read_to_string(node.cdi_file("uid-c1")).unwrap();
    let hook = node.dir.path().join("hook");
    let written = written
        .replace(hook.to_str().unwrap(), "/usr/local")
        .replace(&node.uuids[0], "GPU-0");
    let golden = include_str!("golden/cdi_claim.json");
    assert_eq!(
        written, golden,
        "CDI spec differs from tests/golden/cdi_claim.json"
    );
    assert!(hook.join("vgpu/containers/uid-c1_c1").is_dir());

    // Idempotent: the same answer, and the slice is held once (the rest of
    // the GPU still fits another claim).
    assert_eq!(prepare(&mut plugin, "c1").await, first);
    node.cluster.put_claim(claim(
        "rest",
        NODE,
        &[("gpu-0", Some("12360Mi"), Some("70"))],
    ));
    assert_eq!(prepare(&mut plugin, "rest").await.error, "");

    // One MiB over: a per-claim error, nothing committed, no spec file.
    node.cluster.put_claim(claim(
        "over",
        NODE,
        &[("gpu-1", Some("1Mi"), None), ("gpu-0", Some("1Mi"), None)],
    ));
    let over = prepare(&mut plugin, "over").await;
    assert!(over.devices.is_empty());
    assert!(
        over.error.contains("ns/over") && over.error.contains("1 MiB requested, 0 MiB free"),
        "{}",
        over.error
    );
    assert!(!node.cdi_file("uid-over").exists());
    // gpu-1's part of the refused claim (committed first, in allocation
    // order) was rolled back: all of gpu-1 is free for a whole-GPU claim.
    node.cluster
        .put_claim(claim("whole", NODE, &[("gpu-1", None, Some("100"))]));
    assert_eq!(prepare(&mut plugin, "whole").await.error, "");

    // Unprepare releases and removes the spec; then the refused claim fits.
    assert_eq!(unprepare(&mut plugin, "c1").await, "");
    assert!(!node.cdi_file("uid-c1").exists());
    assert_eq!(
        unprepare(&mut plugin, "c1").await,
        "",
        "unprepare is idempotent"
    );
    assert_eq!(unprepare(&mut plugin, "whole").await, "");
    assert_eq!(prepare(&mut plugin, "over").await.error, "");

    // A claim the API does not have, or with another UID, is an error.
    let missing = prepare(&mut plugin, "nobody").await;
    assert!(missing.error.contains("not found"), "{}", missing.error);

    let dir = node.stop().await;
    assert!(
        !dir.path()
            .join("plugins_registry/gpu.gpuslice.dev-reg.sock")
            .exists()
    );
    assert!(
        !dir.path()
            .join("plugins/gpu.gpuslice.dev/dra.sock")
            .exists()
    );
}

#[actix::test]
async fn a_restart_rebuilds_the_ledgers_from_the_allocated_claims() {
    let cluster = MemoryCluster::new();
    // Allocated to this node but never prepared here (or prepared before
    // the restart): counted. Another node's claim: not counted.
    cluster.put_claim(claim(
        "held",
        NODE,
        &[("gpu-0", Some("10000Mi"), Some("10"))],
    ));
    cluster.put_claim(claim(
        "elsewhere",
        "node-b",
        &[("gpu-1", Some("15360Mi"), None)],
    ));
    let node = Node::start(cluster.clone(), None).await;
    let (_, mut plugin) = node.kubelet().await;
    cluster.put_claim(claim("big", NODE, &[("gpu-0", Some("6000Mi"), None)]));
    let big = prepare(&mut plugin, "big").await;
    assert!(big.error.contains("5360 MiB free"), "{}", big.error);
    // The counted claim is deleted without ever being prepared (no
    // Unprepare will come): its slice is freed, and `big` fits.
    cluster.delete_claim("uid-held");
    within("the deleted claim's slice freed", async {
        loop {
            if prepare(&mut plugin, "big").await.error.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    cluster.put_claim(claim("fits", NODE, &[("gpu-1", Some("15360Mi"), None)]));
    assert_eq!(prepare(&mut plugin, "fits").await.error, "");
    // The prepared claim survives a restart of the daemon; the spec of a
    // claim no longer allocated here is removed, others' files are kept.
    let dir = node.stop().await;
    let cdi = dir.path().join("cdi");
    std::fs::write(cdi.join("gpuslice.dev-uid-gone.json"), "{}").unwrap();
    std::fs::write(cdi.join("other-vendor.json"), "{}").unwrap();
    let node = Node::start(cluster.clone(), Some(dir)).await;
    let (_, mut plugin) = node.kubelet().await;
    cluster.put_claim(claim("small", NODE, &[("gpu-1", Some("1Mi"), None)]));
    let small = prepare(&mut plugin, "small").await;
    assert!(small.error.contains("0 MiB free"), "{}", small.error);
    assert_eq!(
        prepare(&mut plugin, "fits").await.error,
        "",
        "a replay after restart"
    );
    assert!(node.cdi_file("uid-fits").exists());
    assert!(!node.cdi_file("uid-gone").exists());
    assert!(node.dir.path().join("cdi/other-vendor.json").exists());
    node.stop().await;
}

#[actix::test]
async fn the_slice_is_written_on_change_only_and_leaves_out_unhealthy_gpus() {
    let cluster = MemoryCluster::new();
    let node = Node::start(cluster.clone(), None).await;
    node.wait_cluster("the first slice", |s| s.slices.contains_key(SLICE))
        .await;
    let slice = cluster.slice(SLICE).unwrap();
    assert_eq!(device_names(Some(&slice)), ["gpu-0", "gpu-1"]);
    assert_eq!(slice.spec.pool.generation, 1);
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));

    node.switch.set(&node.uuids[1], false);
    node.wait_cluster("gpu-1 withdrawn", |s| {
        device_names(s.slices.get(SLICE)) == ["gpu-0"]
    })
    .await;
    assert_eq!(cluster.slice(SLICE).unwrap().spec.pool.generation, 2);
    node.switch.set(&node.uuids[1], true);
    node.wait_cluster("gpu-1 back", |s| {
        device_names(s.slices.get(SLICE)) == ["gpu-0", "gpu-1"]
    })
    .await;
    assert_eq!(cluster.slice(SLICE).unwrap().spec.pool.generation, 3);
    assert_eq!(cluster.subscribe().borrow().slice_writes, 3);

    // The kubelet wipes the node's slices (as at its start): written again,
    // the generation still growing.
    cluster.delete_slice(SLICE);
    node.wait_cluster("the slice back after a wipe", |s| {
        s.slices
            .get(SLICE)
            .is_some_and(|s| s.spec.pool.generation == 4)
    })
    .await;
    assert_eq!(
        device_names(cluster.slice(SLICE).as_ref()),
        ["gpu-0", "gpu-1"]
    );
    assert_eq!(cluster.subscribe().borrow().slice_writes, 4);

    // A restart finds the slice as it should be and writes nothing.
    let dir = node.stop().await;
    let node = Node::start(cluster.clone(), Some(dir)).await;
    let _ = node.kubelet().await;
    node.stop().await;
    assert_eq!(cluster.subscribe().borrow().slice_writes, 4);
    assert_eq!(cluster.slice(SLICE).unwrap().spec.pool.generation, 4);
}

/// A figure, not a check (run with `--ignored --nocapture`): prepares and
/// unprepares per second over the socket, one claim per call, in sequence,
/// against the in-memory cluster (so the daemon's own cost: gRPC, ledger
/// actors, CDI file write and remove).
#[actix::test]
#[ignore = "a measurement; prints prepares/s"]
async fn prepare_unprepare_rate() {
    let cluster = MemoryCluster::new();
    let n = 500;
    for i in 0..n {
        cluster.put_claim(claim(
            &format!("r{i}"),
            NODE,
            &[("gpu-0", Some("10Mi"), Some("0"))],
        ));
    }
    let node = Node::start(cluster.clone(), None).await;
    let (_, mut plugin) = node.kubelet().await;
    let start = std::time::Instant::now();
    for i in 0..n {
        assert_eq!(prepare(&mut plugin, &format!("r{i}")).await.error, "");
    }
    let prepared = start.elapsed();
    let start = std::time::Instant::now();
    for i in 0..n {
        assert_eq!(unprepare(&mut plugin, &format!("r{i}")).await, "");
    }
    let unprepared = start.elapsed();
    let rate = |d: Duration| f64::from(n) / d.as_secs_f64();
    println!(
        "{n} prepares in {prepared:?} ({:.0}/s), {n} unprepares in {unprepared:?} ({:.0}/s)",
        rate(prepared),
        rate(unprepared)
    );
    node.stop().await;
}

//! The wire format checked by a second gRPC implementation: the Python
//! client in `tests/python/device_plugin_client.py` (grpcio, stubs generated
//! from our `.proto`) talks to the daemon over its unix socket.
//!
//! Ignored by default because it needs `python3` with `grpcio` and
//! `grpcio-tools` (`pip install grpcio grpcio-tools`); CI runs it with
//! `cargo test -p node-daemon --test python_client -- --ignored`.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed setup step must panic"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use node_daemon::cluster::memory::MemoryCluster;
use node_daemon::daemon::{Daemon, run};
use node_daemon::devices::DeviceSource as _;
use node_daemon::devices::simulated::SimulatedDevices;
use node_daemon::settings::{DeviceSourceKind, Settings};
use node_daemon::testkit::{bound_pod, start_kubelet};
use proto::hami::keys;
use serde_json::Value;

const NODE: &str = "py-node";

async fn python_client(socket: &Path, ids: &[String]) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(root.join("tests/python/device_plugin_client.py"))
        .arg("--proto")
        .arg(root.join("../proto/proto/deviceplugin_v1beta1.proto"))
        .arg("--socket")
        .arg(socket)
        .arg("--allocate")
        .args(ids);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .expect("python client finished in time")
    .unwrap()
    .expect("python3 runs");
    assert!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[actix::test]
#[ignore = "needs python3 with grpcio and grpcio-tools"]
async fn a_grpcio_client_reads_options_devices_and_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let mut registrations = start_kubelet(dir.path()).unwrap();
    let settings = Settings {
        node_name: Some(NODE.into()),
        device_plugin_dir: dir.path().to_owned(),
        device_source: DeviceSourceKind::Simulated,
        simulated_gpus: 2,
        device_split_count: 4,
        hook_path: dir.path().join("hook"),
        metrics_bind_address: None,
        ..Settings::default()
    };
    let devices = SimulatedDevices::from_settings(&settings, NODE);
    let uuids: Vec<String> = devices
        .discover()
        .unwrap()
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let cluster = MemoryCluster::new();
    let gpu = &uuids[1];
    cluster.put_pod(
        NODE,
        bound_pod(
            NODE,
            "ns",
            "py",
            &["app"],
            &format!("{gpu},NVIDIA,2048,25:;"),
        ),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = Daemon {
        settings,
        devices: Arc::new(devices),
        cluster: Arc::new(cluster.clone()),
    };
    let done = actix::spawn(run(daemon, async {
        let _ = stopped.await;
    }));
    registrations.recv().await.unwrap();

    let socket = dir.path().join("nvidia-gpu.sock");
    let result = python_client(&socket, &[format!("{gpu}-3")]).await;

    assert_eq!(
        result["options"]["get_preferred_allocation_available"],
        true
    );
    assert_eq!(result["options"]["pre_start_required"], false);
    let devices = result["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    assert_eq!(devices[4]["id"], format!("{gpu}-0"));
    assert!(devices.iter().all(|d| d["health"] == "Healthy"));
    assert_eq!(devices[0]["numa"], serde_json::json!([0]));
    let container = &result["allocate"][0];
    assert_eq!(container["envs"]["NVIDIA_VISIBLE_DEVICES"], gpu.as_str());
    assert_eq!(container["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"], "2048m");
    assert_eq!(container["envs"]["CUDA_DEVICE_SM_LIMIT"], "25");
    assert!(
        container["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["container_path"] == "/tmp/vgpulock")
    );
    let pod = cluster.pod("ns", "py").unwrap();
    assert_eq!(pod.annotation(keys::BIND_PHASE), Some("success"));

    // An Allocate nobody waits for fails with the reason, also over grpcio.
    let result = python_client(&socket, &[format!("{gpu}-2")]).await;
    assert_eq!(result["allocate_error"]["code"], "FAILED_PRECONDITION");
    assert!(
        result["allocate_error"]["details"]
            .as_str()
            .unwrap()
            .contains("no pod on node py-node")
    );

    let _ = stop.send(());
    done.await.unwrap().unwrap();
}

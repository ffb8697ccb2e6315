//! Golden tests: every worked example of `shared/spec/hami-protocol.md`
//! decoded and re-encoded byte for byte.

use proto::hami::bind::{BindPhase, BindTime};
use proto::hami::civil_time::CivilDateTime;
use proto::hami::container_contract::{ContractContext, container_env_and_mounts};
use proto::hami::handshake::Handshake;
use proto::hami::keys;
use proto::hami::node_lock::{LockOwner, NodeLock};
use proto::hami::pod_devices::{ContainerDevice, PodDevices};
use proto::hami::register::{self, NodeDevice};

/// Spec §1, "Example (two V100s, the second on NUMA 1)".
const REGISTER_JSON: &str = r#"[{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","index":1,"count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]"#;

/// The same two GPUs in the legacy (≤v2.7) format, spec §1.
const REGISTER_LEGACY: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,1,true,1,hami-core:";

fn v100(id: &str, index: u32, numa: u32) -> NodeDevice {
    NodeDevice {
        id: id.to_owned(),
        index,
        count: 10,
        devmem: 32768,
        devcore: 100,
        device_type: "NVIDIA-Tesla V100-PCIE-32GB".to_owned(),
        numa,
        mode: "hami-core".to_owned(),
        health: true,
        mig_profiles: Vec::new(),
    }
}

fn spec_gpus() -> Vec<NodeDevice> {
    vec![
        v100("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 0, 0),
        v100("GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec", 1, 1),
    ]
}

#[test]
fn register_json_example_decodes_and_encodes_byte_for_byte() {
    let devices = register::decode(REGISTER_JSON).unwrap();
    assert_eq!(devices, spec_gpus());
    assert_eq!(register::encode_json(&devices).unwrap(), REGISTER_JSON);
}

#[test]
fn register_legacy_example_reads_as_the_same_devices() {
    assert_eq!(register::decode(REGISTER_LEGACY).unwrap(), spec_gpus());
    // Re-publishing a legacy node's devices yields the v2.8+ JSON.
    let devices = register::decode(REGISTER_LEGACY).unwrap();
    assert_eq!(register::encode_json(&devices).unwrap(), REGISTER_JSON);
}

#[test]
fn register_legacy_seven_field_entry_means_index_0_and_hami_core() {
    let devices = register::decode(
        "GPU-a,10,15360,100,NVIDIA-Tesla T4,0,true:GPU-b,4,1,50,NVIDIA-Tesla T4,1,false:",
    )
    .unwrap();
    assert_eq!(devices.len(), 2);
    assert!(
        devices
            .iter()
            .all(|d| d.index == 0 && d.mode == "hami-core")
    );
    assert_eq!(
        (devices[1].count, devices[1].devcore, devices[1].numa),
        (4, 50, 1)
    );
    assert!(!devices[1].health);
    assert!(register::decode("GPU-a,10,15360,100,NVIDIA-Tesla T4,0,true").is_err());
}

#[test]
fn pod_devices_example_round_trips_and_erases_to_separators() {
    const EXAMPLE: &str = ";GPU-aaa,NVIDIA,3000,30:;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;";
    let pd: PodDevices = EXAMPLE.parse().unwrap();
    assert_eq!(
        pd,
        PodDevices(vec![
            vec![],
            vec![ContainerDevice::nvidia("GPU-aaa", 3000, 30)],
            vec![
                ContainerDevice::nvidia("GPU-bbb", 1000, 0),
                ContainerDevice::nvidia("GPU-ccc", 1000, 0),
            ],
        ])
    );
    assert_eq!(pd.to_string(), EXAMPLE);

    // What Allocate does, container by container.
    assert_eq!(pd.first_pending_index(), Some(1));
    let after_app1 = pd.erase_container(1).unwrap();
    assert_eq!(
        after_app1.to_string(),
        ";;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;"
    );
    assert!(after_app1.has_pending_devices());
    assert_eq!(after_app1.first_pending_index(), Some(2));
    let done = after_app1.erase_container(2).unwrap();
    assert_eq!(done.to_string(), ";;;");
    assert!(!done.has_pending_devices());
    assert_eq!(done.first_pending_index(), None);
    assert_eq!(";;;".parse::<PodDevices>().unwrap(), done);
}

#[test]
fn single_container_after_allocate_reads_semicolon() {
    let pd: PodDevices = ";".parse().unwrap();
    assert_eq!(pd, PodDevices(vec![vec![]]));
    assert!(!pd.has_pending_devices());
    assert_eq!(pd.to_string(), ";");
}

#[test]
fn node_lock_example_round_trips() {
    const EXAMPLE: &str = "2025-10-20T03:07:02Z,jingyu-test,gputest-6c77bb77f8-gvtzc";
    let lock: NodeLock = EXAMPLE.parse().unwrap();
    assert_eq!(
        lock,
        NodeLock {
            time: CivilDateTime::new(2025, 10, 20, 3, 7, 2).unwrap(),
            owner: Some(LockOwner {
                namespace: "jingyu-test".to_owned(),
                pod: "gputest-6c77bb77f8-gvtzc".to_owned(),
            }),
        }
    );
    assert_eq!(lock.to_string(), EXAMPLE);
    assert!(lock.is_owned_by("jingyu-test", "gputest-6c77bb77f8-gvtzc"));
    // Legacy bare time.
    let legacy: NodeLock = "2025-10-20T03:07:02Z".parse().unwrap();
    assert_eq!(legacy.owner, None);
    assert_eq!(legacy.to_string(), "2025-10-20T03:07:02Z");
}

#[test]
fn handshake_example_round_trips() {
    const EXAMPLE: &str = "Requesting_2025-07-12 01:12:20";
    let h: Handshake = EXAMPLE.parse().unwrap();
    assert_eq!(
        h,
        Handshake::Requesting(CivilDateTime::new(2025, 7, 12, 1, 12, 20).unwrap())
    );
    assert_eq!(h.to_string(), EXAMPLE);
}

#[test]
fn bind_values_round_trip() {
    assert_eq!(
        "allocating".parse::<BindPhase>().unwrap(),
        BindPhase::Allocating
    );
    assert_eq!(BindPhase::Success.to_string(), "success");
    assert_eq!(BindPhase::Failed.to_string(), "failed");
    let t: BindTime = "1760929622".parse().unwrap();
    assert_eq!(t.to_string(), "1760929622");
}

#[test]
fn spec_keys_are_hamis() {
    assert_eq!(keys::NODE_NVIDIA_REGISTER, "hami.io/node-nvidia-register");
    assert_eq!(keys::NODE_HANDSHAKE, "hami.io/node-handshake");
    assert_eq!(keys::NODE_LOCK, "hami.io/mutex.lock");
    assert_eq!(
        keys::VGPU_DEVICES_TO_ALLOCATE,
        "hami.io/vgpu-devices-to-allocate"
    );
    assert_eq!(
        keys::VGPU_DEVICES_ALLOCATED,
        "hami.io/vgpu-devices-allocated"
    );
    assert_eq!(keys::BIND_PHASE, "hami.io/bind-phase");
    assert_eq!(keys::BIND_TIME, "hami.io/bind-time");
    assert_eq!(keys::USE_GPUUUID, "nvidia.com/use-gpuuuid");
}

#[test]
fn app2_of_the_pod_example_gets_hamis_env_and_mounts() {
    let pd: PodDevices = ";GPU-aaa,NVIDIA,3000,30:;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;"
        .parse()
        .unwrap();
    let mut ctx = ContractContext::new("5f0c0a8e-uid", "app2", "cache-id");
    ctx.lib_cuda_log_level = Some(1);
    let slice = container_env_and_mounts(&pd.0[2], &ctx).unwrap();
    let env: Vec<String> = slice.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(
        env,
        [
            "CUDA_DEVICE_MEMORY_LIMIT_0=1000m",
            "CUDA_DEVICE_MEMORY_LIMIT_1=1000m",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache-id.cache",
            "CUDA_DEVICE_SM_LIMIT=0",
            "LIBCUDA_LOG_LEVEL=1",
            "NVIDIA_VISIBLE_DEVICES=GPU-bbb,GPU-ccc",
        ]
    );
    assert_eq!(
        slice.mounts[1].host_path,
        "/usr/local/vgpu/containers/5f0c0a8e-uid_app2"
    );
    assert_eq!(slice.mounts.len(), 4);
}

/// The worked example of `docs/protocol.md`, checked against the codecs, and
/// the document checked to contain exactly these values.
#[test]
fn docs_protocol_worked_example_is_what_the_codecs_produce() {
    const DOC: &str = include_str!("../../docs/protocol.md");
    const A: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448";
    const B: &str = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec";
    const UID: &str = "5f0c0a8e-3b1d-4c1e-9a53-2f4d1c0b7e61";
    const CACHE: &str = "0b6f7c1e-52a4-4f0e-9d3b-6f1c2a7e9d10";

    // Bind: lock, times, the device annotations.
    let lock = NodeLock::acquired_at(1_760_929_622, "default", "train-0").unwrap();
    assert!(DOC.contains(&format!("hami.io/mutex.lock: {lock}")));
    let vgpu_time = BindTime::from_unix_seconds(1_760_929_621).unwrap();
    assert!(DOC.contains(&format!("hami.io/vgpu-time: \"{vgpu_time}\"")));
    let bind_time = BindTime::from_unix_seconds(lock.time.to_unix_seconds()).unwrap();
    assert!(DOC.contains(&format!("hami.io/bind-time: \"{bind_time}\"")));
    assert!(DOC.contains(&format!("hami.io/bind-phase: {}", BindPhase::Allocating)));
    assert!(DOC.contains(&format!("hami.io/bind-phase: {}", BindPhase::Success)));
    assert!(DOC.contains(&format!("hami.io/bind-phase: {}", BindPhase::Failed)));

    let pd = PodDevices(vec![
        vec![],
        vec![ContainerDevice::nvidia(A, 3000, 30)],
        vec![
            ContainerDevice::nvidia(B, 1000, 0),
            ContainerDevice::nvidia(A, 1000, 0),
        ],
    ]);
    let at_bind = pd.try_encode().unwrap();
    assert!(DOC.contains(&format!("hami.io/vgpu-devices-to-allocate: {at_bind}\n")));
    assert!(DOC.contains(&format!("hami.io/vgpu-devices-allocated: {at_bind}\n")));

    // Allocate app1: first pending entry is container 1.
    let (index, app1) = pd.first_pending().unwrap();
    assert_eq!(index, 1);
    let mut ctx = ContractContext::new(UID, "app1", CACHE);
    ctx.lib_cuda_log_level = Some(1);
    let slice = container_env_and_mounts(app1, &ctx).unwrap();
    for (k, v) in &slice.envs {
        assert!(
            DOC.contains(&format!("\n{k}={v}\n")),
            "{k}={v} missing from the doc"
        );
    }
    for m in &slice.mounts {
        let mode = if m.read_only { "ro" } else { "rw" };
        let line = DOC
            .lines()
            .find(|l| l.starts_with(&format!("mount {} ", m.container_path)))
            .unwrap_or_else(|| panic!("no mount line for {}", m.container_path));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words,
            ["mount", &m.container_path, "<-", &m.host_path, mode]
        );
    }
    let after_app1 = pd.erase_container(index).unwrap();
    assert!(DOC.contains(&format!("hami.io/vgpu-devices-to-allocate: {after_app1}\n")));

    // Allocate app2: only separators remain.
    let (index, app2) = after_app1.first_pending().unwrap();
    let slice = container_env_and_mounts(app2, &ContractContext::new(UID, "app2", CACHE)).unwrap();
    assert_eq!(slice.envs["NVIDIA_VISIBLE_DEVICES"], format!("{B},{A}"));
    assert_eq!(slice.envs["CUDA_DEVICE_SM_LIMIT"], "0");
    let done = after_app1.erase_container(index).unwrap();
    assert!(!done.has_pending_devices());
    assert!(DOC.contains(&format!("hami.io/vgpu-devices-to-allocate: {done}\n")));

    // Part 1 values.
    assert!(DOC.contains(&format!("\n{REGISTER_JSON}\n")));
    assert!(DOC.contains(&format!("\n{REGISTER_LEGACY}\n")));
    for value in [
        "Requesting_2025-10-20 03:06:50",
        "Requesting_2025.10.20 03:06:50",
        "Deleted_2025-10-20 03:06:50",
        "Reported 2025-10-20 03:06:50.123456789 +0000 UTC m=+12.5",
    ] {
        assert!(DOC.contains(&format!("`{value}`")), "{value}");
        value.parse::<Handshake>().unwrap();
    }
}

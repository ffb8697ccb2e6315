//! Property tests: for every codec, encode → decode is the identity on every
//! valid value.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is a test failure"
)]

use proptest::prelude::*;

use proto::hami::bind::{BindPhase, BindTime};
use proto::hami::civil_time::CivilDateTime;
use proto::hami::container_contract::{ContractContext, container_env_and_mounts};
use proto::hami::handshake::{Handshake, ReportedTime};
use proto::hami::node_lock::{LockOwner, NodeLock};
use proto::hami::pod_devices::{ContainerDevice, PodDevices};
use proto::hami::register::{self, NodeDevice};

const INT32_MAX: u32 = 0x7fff_ffff;

/// Values at the edges as well as anywhere in the range.
fn number(max: u32) -> impl Strategy<Value = u32> {
    prop_oneof![Just(0), Just(1), Just(max), 0..=max]
}

fn node_device(text: &'static str) -> impl Strategy<Value = NodeDevice> {
    (
        (text, number(u32::MAX), number(INT32_MAX), number(INT32_MAX)),
        (
            number(INT32_MAX),
            text,
            number(u32::MAX),
            text,
            any::<bool>(),
        ),
    )
        .prop_map(
            |((id, index, count, devmem), (devcore, device_type, numa, mode, health))| NodeDevice {
                id,
                index,
                count,
                devmem,
                devcore,
                device_type,
                numa,
                mode,
                health,
                mig_profiles: Vec::new(),
            },
        )
}

/// HAMi's legacy writer (`EncodeNodeDevices`), 9 fields per device.
fn encode_legacy(devices: &[NodeDevice]) -> String {
    devices
        .iter()
        .map(|d| {
            format!(
                "{},{},{},{},{},{},{},{},{}:",
                d.id,
                d.count,
                d.devmem,
                d.devcore,
                d.device_type,
                d.numa,
                d.health,
                d.index,
                d.mode
            )
        })
        .collect()
}

fn civil() -> impl Strategy<Value = CivilDateTime> {
    (CivilDateTime::MIN_UNIX..=CivilDateTime::MAX_UNIX)
        .prop_map(|secs| CivilDateTime::from_unix_seconds(secs).unwrap())
}

fn container_device() -> impl Strategy<Value = ContainerDevice> {
    (
        "[^,:;]{1,40}",
        prop_oneof![Just("NVIDIA".to_owned()), "[A-Za-z0-9-]{1,8}"],
        0..=i32::MAX,
        0..=i32::MAX,
    )
        .prop_map(|(uuid, vendor, usedmem, usedcores)| ContainerDevice {
            uuid,
            vendor,
            usedmem,
            usedcores,
        })
}

fn pod_devices() -> impl Strategy<Value = PodDevices> {
    prop::collection::vec(prop::collection::vec(container_device(), 0..4), 0..6)
        .prop_map(PodDevices)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn register_json_round_trips(devices in prop::collection::vec(node_device("\\PC{0,24}|[\\x00-\\x1f<>&\"\\\\\u{2028}\u{2029}]{0,6}"), 0..5)) {
        let text = register::encode_json(&devices).unwrap();
        prop_assert!(text.starts_with('[') && text.ends_with(']'));
        prop_assert_eq!(register::decode(&text).unwrap(), devices.clone());
        // Our bytes are valid JSON for any other reader too.
        let generic: serde_json::Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(generic.as_array().map(Vec::len), Some(devices.len()));
    }

    #[test]
    fn register_legacy_round_trips(devices in prop::collection::vec(node_device("[A-Za-z0-9 ._-]{0,24}"), 1..5)) {
        prop_assert_eq!(register::decode(&encode_legacy(&devices)).unwrap(), devices);
    }

    #[test]
    fn pod_devices_round_trip(pd in pod_devices()) {
        prop_assert!(pd.validate().is_ok());
        let text = pd.to_string();
        prop_assert_eq!(text.matches(';').count(), pd.0.len());
        prop_assert_eq!(text.parse::<PodDevices>().unwrap(), pd);
    }

    #[test]
    fn erasing_every_container_leaves_only_separators(pd in pod_devices()) {
        let mut current = pd.clone();
        while let Some(index) = current.first_pending_index() {
            let next = current.erase_container(index).unwrap();
            prop_assert_eq!(next.0.len(), pd.0.len());
            prop_assert!(next.0[index].is_empty());
            current = next.to_string().parse().unwrap();
        }
        prop_assert!(!current.has_pending_devices());
        prop_assert_eq!(current.to_string(), ";".repeat(pd.0.len()));
        prop_assert!(pd.erase_container(pd.0.len()).is_err());
    }

    #[test]
    fn civil_time_round_trips_through_every_layout(t in civil()) {
        prop_assert_eq!(CivilDateTime::from_unix_seconds(t.to_unix_seconds()).unwrap(), t);
        prop_assert_eq!(t.to_string().parse::<CivilDateTime>().unwrap(), t);
        prop_assert_eq!(CivilDateTime::parse_rfc3339(&t.to_rfc3339_utc()).unwrap(), t);
        let dotted = t.to_string().replacen('-', ".", 2);
        prop_assert_eq!(CivilDateTime::parse_dotted(&dotted).unwrap(), t);
    }

    #[test]
    fn handshake_round_trips(
        t in civil(),
        kind in 0..3_u8,
        nanos in prop_oneof![Just(0_u32), 0..1_000_000_000_u32],
        offset_minutes in -1439..=1439_i16,
        zone in "[A-Za-z0-9+-]{1,6}",
    ) {
        let h = match kind {
            0 => Handshake::Requesting(t),
            1 => Handshake::Deleted(t),
            _ => Handshake::Reported(ReportedTime { local: t, nanos, offset_minutes, zone }),
        };
        prop_assert_eq!(h.to_string().parse::<Handshake>().unwrap(), h);
    }

    #[test]
    fn handshake_age_is_now_minus_stamp(secs in 0..4_000_000_000_i64, age in -100..100_000_i64) {
        let h = Handshake::requesting_at(secs).unwrap();
        prop_assert_eq!(h.age_seconds(secs + age), age);
        prop_assert_eq!(h.is_fresh_request(secs + age), age < 60);
    }

    #[test]
    fn node_lock_round_trips(
        t in civil(),
        owner in prop::option::of(("[a-z0-9][a-z0-9-]{0,20}", "[a-z0-9][a-z0-9.-]{0,40}")),
    ) {
        let lock = NodeLock {
            time: t,
            owner: owner.map(|(namespace, pod)| LockOwner { namespace, pod }),
        };
        prop_assert_eq!(lock.to_string().parse::<NodeLock>().unwrap(), lock);
    }

    #[test]
    fn bind_values_round_trip(secs in prop_oneof![Just(0_i64), Just(i64::MAX), 0..=i64::MAX], phase in 0..3_u8) {
        let t = BindTime::from_unix_seconds(secs).unwrap();
        prop_assert_eq!(t.to_string().parse::<BindTime>().unwrap(), t);
        let phase = [BindPhase::Allocating, BindPhase::Success, BindPhase::Failed][usize::from(phase)];
        prop_assert_eq!(phase.to_string().parse::<BindPhase>().unwrap(), phase);
    }

    #[test]
    fn contract_env_mirrors_the_devices(
        devices in prop::collection::vec(
            ("GPU-[a-c]", 0..=i32::MAX, 0..=100_i32)
                .prop_map(|(u, m, c)| ContainerDevice::nvidia(u, m, c)),
            1..6,
        ),
        scaling in 0.1..4.0_f64,
    ) {
        let mut ctx = ContractContext::new("uid", "ctr", "cache");
        ctx.device_memory_scaling = scaling;
        let slice = container_env_and_mounts(&devices, &ctx).unwrap();
        for (i, dev) in devices.iter().enumerate() {
            prop_assert_eq!(&slice.envs[&format!("CUDA_DEVICE_MEMORY_LIMIT_{i}")], &format!("{}m", dev.usedmem));
        }
        let past_end = format!("CUDA_DEVICE_MEMORY_LIMIT_{}", devices.len());
        prop_assert!(!slice.envs.contains_key(&past_end));
        let visible: Vec<&str> = slice.envs["NVIDIA_VISIBLE_DEVICES"].split(',').collect();
        let mut distinct: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        prop_assert_eq!(visible.len(), distinct.len());
        prop_assert_eq!(&slice.envs["CUDA_DEVICE_SM_LIMIT"], &devices[0].usedcores.to_string());
        prop_assert_eq!(slice.envs.contains_key("CUDA_OVERSUBSCRIBE"), scaling > 1.0);
    }
}

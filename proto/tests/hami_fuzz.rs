//! Fuzz-style test: thousands of random, mutated and truncated strings fed to
//! every decoder. A decoder may answer `Ok` or `Err` but must never panic, and
//! whatever it accepts must re-encode to text that decodes to the same value.
//!
//! The generator is a fixed-seed SplitMix64, so a failure reproduces exactly;
//! the failing input is printed by the assertion.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is a test failure"
)]

use proto::hami::bind::{BindPhase, BindTime};
use proto::hami::civil_time::CivilDateTime;
use proto::hami::container_contract::{ContractContext, container_env_and_mounts};
use proto::hami::handshake::{Handshake, ReportedTime};
use proto::hami::node_lock::NodeLock;
use proto::hami::pod_devices::{ContainerDevice, PodDevices};
use proto::hami::register;

/// Random inputs per generator kind (random, mutated); truncations come on top.
const ROUNDS: usize = 6_000;

/// Valid values of every format, the starting points for mutation.
const SEEDS: &[&str] = &[
    r#"[{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},{"id":"GPU-00552014","index":1,"count":10,"numa":1,"health":true}]"#,
    "GPU-0fc3,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:GPU-0055,10,32768,100,NVIDIA-Tesla V100,1,true,1,hami-core:",
    "GPU-a,10,15360,100,NVIDIA-Tesla T4,0,true:",
    ";GPU-aaa,NVIDIA,3000,30:;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;",
    ";;;",
    "Requesting_2025-07-12 01:12:20",
    "Requesting_2025.07.12 01:12:20",
    "Deleted_2025-07-12 01:12:20",
    "Reported 2024-01-02 03:04:05.123456789 +0800 CST m=+12.000000001",
    "2025-10-20T03:07:02Z,jingyu-test,gputest-6c77bb77f8-gvtzc",
    "2025-10-20T11:07:02.5+08:00",
    "allocating",
    "1760929622",
];

/// Characters that matter to some format, plus a few awkward ones.
const ALPHABET: &[char] = &[
    '0', '1', '2', '9', '-', '+', '.', ',', ':', ';', ' ', '_', '[', ']', '{', '}', '"', '\\', 'T',
    'Z', 'e', 'E', 'a', 'n', 'u', 'l', 't', 'r', 'f', 'm', '=', 'G', 'P', 'U', 'N', 'V', 'é',
    '\u{2028}', '\0', '\n', '\u{fffd}', '𝕏',
];

/// SplitMix64: tiny, fast, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % (n.max(1) as u64)) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn random_string(rng: &mut Rng) -> String {
    let len = rng.below(80);
    (0..len).map(|_| *rng.pick(ALPHABET)).collect()
}

/// One to four random edits of a seed: replace, insert, delete, duplicate a
/// span, or splice in a span of another seed.
fn mutate(rng: &mut Rng, seed: &str) -> String {
    let mut chars: Vec<char> = seed.chars().collect();
    for _ in 0..=rng.below(4) {
        let at = rng.below(chars.len() + 1);
        match rng.below(5) {
            0 if at < chars.len() => chars[at] = *rng.pick(ALPHABET),
            1 => chars.insert(at, *rng.pick(ALPHABET)),
            2 if at < chars.len() => {
                chars.remove(at);
            }
            3 if at < chars.len() => {
                let end = (at + 1 + rng.below(12)).min(chars.len());
                let span: Vec<char> = chars[at..end].to_vec();
                chars.splice(at..at, span);
            }
            _ => {
                let other: Vec<char> = rng.pick(SEEDS).chars().collect();
                let from = rng.below(other.len());
                let to = (from + rng.below(16)).min(other.len());
                chars.splice(at..at, other[from..to].iter().copied());
            }
        }
    }
    chars.into_iter().collect()
}

/// Feeds `input` to every decoder and checks what each one accepts; returns
/// how many of the round-tripping decoders accepted it.
fn check_all_decoders(input: &str) -> usize {
    let mut accepted = 0;
    if let Ok(devices) = register::decode(input) {
        accepted += 1;
        let text = register::encode_json(&devices)
            .unwrap_or_else(|e| panic!("accepted {input:?} but cannot encode: {e}"));
        assert_eq!(register::decode(&text).unwrap(), devices, "input {input:?}");
    }
    let _ = register::decode_json(input);
    let _ = register::decode_legacy(input);

    if let Ok(pd) = input.parse::<PodDevices>() {
        accepted += 1;
        assert_eq!(pd.validate(), Ok(()), "input {input:?}");
        assert_eq!(
            pd.to_string().parse::<PodDevices>().unwrap(),
            pd,
            "input {input:?}"
        );
        if let Some(index) = pd.first_pending_index() {
            assert!(pd.erase_container(index).is_ok());
        }
        for devices in &pd.0 {
            let ctx = ContractContext::new("uid", "ctr", "cache");
            let _ = container_env_and_mounts(devices, &ctx);
        }
    }

    if let Ok(h) = input.parse::<Handshake>() {
        accepted += 1;
        assert_eq!(
            h.to_string().parse::<Handshake>().unwrap(),
            h,
            "input {input:?}"
        );
        let _ = h.age_seconds(i64::MAX);
        let _ = h.age_seconds(i64::MIN);
    }
    let _ = input.parse::<ReportedTime>();

    if let Ok(lock) = input.parse::<NodeLock>() {
        accepted += 1;
        assert_eq!(
            lock.to_string().parse::<NodeLock>().unwrap(),
            lock,
            "input {input:?}"
        );
        let _ = lock.is_expired(i64::MIN, i64::MAX);
    }

    if let Ok(phase) = input.parse::<BindPhase>() {
        assert_eq!(phase.to_string(), input);
    }
    if let Ok(t) = input.parse::<BindTime>() {
        accepted += 1;
        assert_eq!(
            t.to_string().parse::<BindTime>().unwrap(),
            t,
            "input {input:?}"
        );
        let _ = t.age_seconds(i64::MIN);
    }

    for parsed in [
        CivilDateTime::parse_date_time(input),
        CivilDateTime::parse_dotted(input),
        CivilDateTime::parse_rfc3339(input),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(
            CivilDateTime::from_unix_seconds(parsed.to_unix_seconds()).unwrap(),
            parsed
        );
    }
    accepted
}

#[test]
fn random_strings_never_panic_any_decoder() {
    let mut rng = Rng(0x5eed_0001);
    for _ in 0..ROUNDS {
        let _ = check_all_decoders(&random_string(&mut rng));
    }
}

#[test]
fn mutated_seeds_never_panic_any_decoder() {
    let mut rng = Rng(0x5eed_0002);
    let mut accepted = 0;
    for _ in 0..ROUNDS {
        let seed = rng.pick(SEEDS);
        accepted += check_all_decoders(&mutate(&mut rng, seed));
    }
    // Enough mutants stay valid that the re-encode checks really run.
    eprintln!("{accepted} of {ROUNDS} mutated inputs accepted");
    assert!(accepted > ROUNDS / 10, "only {accepted} accepted");
}

#[test]
fn every_truncation_of_every_seed_never_panics() {
    let mut count = 0;
    for seed in SEEDS {
        for (cut, _) in seed.char_indices().chain([(seed.len(), ' ')]) {
            let _ = check_all_decoders(&seed[..cut]);
            let _ = check_all_decoders(&seed[cut..]);
            count += 2;
        }
    }
    assert!(count > 500, "only {count} truncations");
}

#[test]
fn seeds_are_accepted_by_their_decoder() {
    // Guards the fuzz corpus: mutations start from valid values.
    assert!(register::decode(SEEDS[0]).is_ok());
    assert!(register::decode(SEEDS[1]).is_ok());
    assert!(register::decode(SEEDS[2]).is_ok());
    assert!(SEEDS[3].parse::<PodDevices>().is_ok());
    assert!(SEEDS[4].parse::<PodDevices>().is_ok());
    for h in &SEEDS[5..9] {
        assert!(h.parse::<Handshake>().is_ok(), "{h}");
    }
    assert!(SEEDS[9].parse::<NodeLock>().is_ok());
    assert!(SEEDS[10].parse::<NodeLock>().is_ok());
    assert!(SEEDS[11].parse::<BindPhase>().is_ok());
    assert!(SEEDS[12].parse::<BindTime>().is_ok());
}

#[test]
fn hostile_numbers_and_deep_json_are_errors() {
    let deep = "[".repeat(10_000);
    assert!(register::decode(&deep).is_err());
    for input in [
        r#"[{"count":1e400}]"#,
        r#"[{"count":-0}]"#,
        r#"[{"index":18446744073709551616}]"#,
        r#"[{"devmem":99999999999999999999999}]"#,
    ] {
        let _ = register::decode(input);
    }
    assert!(register::decode(r#"[{"index":18446744073709551616}]"#).is_err());
    assert!(
        ";GPU-a,NVIDIA,99999999999999999999,1:;"
            .parse::<PodDevices>()
            .is_err()
    );
    assert!("99999999999999999999".parse::<BindTime>().is_err());
    let huge = format!("GPU-a,NVIDIA,1,1:{}", ";".repeat(100_000));
    assert_eq!(huge.parse::<PodDevices>().unwrap().0.len(), 100_000);
    let devices = [ContainerDevice::nvidia("GPU-a", i32::MAX, i32::MAX)];
    assert!(container_env_and_mounts(&devices, &ContractContext::new("u", "c", "k")).is_ok());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3_000))]

    /// Arbitrary Unicode (any code point, any length) through every decoder.
    #[test]
    fn arbitrary_unicode_never_panics_any_decoder(input in proptest::prelude::any::<String>()) {
        let _ = check_all_decoders(&input);
    }

    /// Arbitrary text behind each format's prefix, so the deeper parsers run.
    #[test]
    fn arbitrary_tails_after_valid_prefixes_never_panic(
        seed in 0..SEEDS.len(),
        cut in 0_usize..200,
        tail in "\\PC{0,40}",
    ) {
        let seed = SEEDS[seed];
        let cut = seed.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(seed.len());
        let _ = check_all_decoders(&format!("{}{tail}", &seed[..cut]));
    }
}

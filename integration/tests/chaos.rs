//! The chaos soak at a small size (3 nodes × 4 GPUs, 75 s of churn and
//! faults, a fixed seed): every fault kind is injected at least once, and
//! the figures that must be 0 are 0. `bench --only chaos` runs it longer;
//! `chaos::report`'s tests show an over-committed cluster fails it.

use std::time::Duration;

use integration::chaos::{self, Config, FaultKind};
use integration::cluster::ControlPlaneKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_soak_never_overcommits_mismatches_or_sticks() {
    if let Ok(filter) = std::env::var("GPUSLICE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    let control_plane = ControlPlaneKind::from_env();
    let report = chaos::run(Config {
        duration: Duration::from_secs(75),
        nodes: 3,
        seed: 13,
        control_plane,
        ..Config::default()
    })
    .await
    .unwrap();
    let text = report.to_markdown();
    eprintln!("{text}");
    assert!(report.failures().is_empty(), "{text}");
    assert!(report.kinds_not_injected().is_empty(), "{text}");
    if control_plane == ControlPlaneKind::Fake {
        assert_eq!(report.header.kinds.len(), FaultKind::ALL.len(), "{text}");
    }
    assert!(
        report.ran > 20 && report.deleted > 20,
        "too little churn: {text}"
    );
    assert!(report.checks >= 10, "{text}");
}

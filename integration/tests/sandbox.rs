//! The README's first command gives the right picture every time: the
//! demo, run in process through the sandbox's library function, 20 times
//! in a row, ends with 7 of 8 pods Running, only `too-big` Pending, and a
//! clean checker.

use clap::Parser as _;
use integration::sandbox::{Args, Expectation, Summary, run};

fn demo_args() -> Args {
    Args::parse_from(["sandbox", "--format", "json", "--timeout", "180"])
}

/// What is wrong with a demo summary, judged with the old public fields
/// only (so this test also runs against a sandbox without a verdict).
fn wrong_picture(summary: &Summary) -> Option<String> {
    let pending: Vec<(&str, &str)> = summary
        .not_running
        .iter()
        .map(|p| (p.pod.as_str(), p.phase.as_str()))
        .collect();
    let right = summary.pods_running == 7
        && pending == [("too-big", "Pending")]
        && summary.report.is_clean();
    (!right).then(|| {
        format!(
            "{} running; not running: {:?}; checker clean: {}",
            summary.pods_running,
            summary.not_running,
            summary.report.is_clean()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_gives_the_right_picture_20_times_in_a_row() {
    let args = demo_args();
    for round in 1..=20 {
        let (summary, cluster) = run(&args).await.expect("the sandbox runs");
        cluster.shutdown().await;
        if let Some(wrong) = wrong_picture(&summary) {
            panic!("round {round}: wrong picture: {wrong}");
        }
        assert!(
            summary.as_expected(),
            "round {round}: {:?}",
            summary.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_picture_is_reported_with_its_reasons() {
    let args = demo_args();
    let (mut summary, cluster) = run(&args).await.expect("the sandbox runs");
    cluster.shutdown().await;
    assert!(summary.as_expected(), "{:?}", summary.problems);

    // The same summary judged against a demo where too-big should have run
    // and no pod may stay pending.
    let strict = Expectation {
        pending: Some(Default::default()),
    };
    let problems = strict.problems(&summary);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("too-big is Pending"),
        "{problems:?}"
    );

    // A pod that stayed Pending against the demo's expectation.
    let inference = summary
        .not_running
        .first()
        .cloned()
        .map(|mut p| {
            p.pod = "inference-large".to_owned();
            p.reason = "0/2 nodes are available: 2 1/0 NodeInsufficientDevice".to_owned();
            p
        })
        .expect("too-big is listed");
    summary.not_running.push(inference);
    summary.pods_running -= 1;
    let problems = Expectation::of(&args).problems(&summary);
    assert_eq!(
        problems,
        vec!["inference-large is Pending: 0/2 nodes are available: 2 1/0 NodeInsufficientDevice"]
    );
}

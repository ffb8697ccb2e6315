//! The live dashboard in a real browser: headless Chromium (Debian's
//! `chromium` + `chromium-driver`) against the sandbox's demo cluster.
//! The page loads and shows every GPU, a click on a GPU lists exactly the
//! pods holding slices of it, a click on a node name the pods on that node,
//! the pending pod is listed with its reasons; a screenshot is saved as
//! `target/ci-artifacts/dashboard.png`.
//!
//! Skips, saying so, without Chromium; fails instead when
//! `GPUSLICE_REQUIRE_BROWSER=1` (as `.ci/run` sets).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;
use integration::browser::{Browser, Session};
use integration::cluster::ControlPlaneKind;
use integration::sandbox::{Args, run};
use serde_json::{Value, json};

/// Evaluates `script` until `done` accepts its value, for up to 30 s.
async fn eventually(
    session: &Session,
    what: &str,
    script: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let value = session.execute(script, vec![]).await.expect("script runs");
        if done(&value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {value} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The pod names (without namespace) the detail panel lists.
const LISTED_PODS: &str = "return document.getElementById('detail').hidden ? null : \
    [...document.querySelectorAll('#pods tbody td.pod-name')].map(td => td.textContent.split('/')[1]).sort();";

fn names(set: &BTreeSet<String>) -> Value {
    json!(set.iter().collect::<Vec<_>>())
}

fn artifacts() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
            PathBuf::from,
        )
        .join("ci-artifacts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_every_gpu_and_the_pods_a_click_selects_in_chromium() {
    let Some(browser) = Browser::for_test("dashboard") else {
        return;
    };
    let mut args = Args::parse_from(["sandbox", "--format", "json", "--timeout", "180"]);
    // `GPUSLICE_CONTROL_PLANE=real`: the real kube-apiserver and kube-scheduler.
    args.control_plane = ControlPlaneKind::from_env();
    let (summary, cluster) = run(&args).await.expect("the sandbox runs");
    assert!(summary.as_expected(), "{:?}", summary.problems);
    let gpus: usize = summary.nodes.iter().map(|n| n.gpus.len()).sum();
    assert_eq!(gpus, args.nodes * args.gpus_per_node as usize);

    let session = browser.start(1280, 720).await.expect("chromium starts");
    session
        .goto(&cluster.dashboard_url())
        .await
        .expect("the page loads");

    // Every GPU is drawn, and the totals agree.
    let shown = eventually(
        &session,
        "GPU cells and count",
        "return [document.querySelectorAll('#heatmap .gpu').length, \
                 document.getElementById('gpu-count').textContent];",
        |v| v[0] == gpus && v[1] == json!(gpus.to_string()),
    )
    .await;
    assert_eq!(shown, json!([gpus, gpus.to_string()]));
    let nodes = eventually(
        &session,
        "node tiles",
        "return document.querySelectorAll('#heatmap .node').length;",
        |v| v == summary.nodes.len(),
    )
    .await;
    assert_eq!(nodes, summary.nodes.len());

    // The pending pod, with the reasons its last filter gave.
    let pending = eventually(
        &session,
        "pending pods",
        "return [...document.querySelectorAll('#pending tbody tr')].map(r => r.textContent);",
        |v| v.as_array().is_some_and(|rows| !rows.is_empty()),
    )
    .await;
    let pending = pending.to_string();
    assert!(
        pending.contains("too-big") && pending.contains("node"),
        "{pending}"
    );

    // A click on the GPU with the most holders lists exactly them.
    let (node, gpu) = summary
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
        .max_by_key(|(_, g)| g.holders.len())
        .expect("the demo has GPUs");
    let holders: BTreeSet<String> = gpu.holders.iter().cloned().collect();
    assert!(!holders.is_empty(), "the demo holds slices");
    session
        .click(&format!(".gpu[data-uuid=\"{}\"]", gpu.uuid))
        .await
        .expect("click on a GPU");
    let want = names(&holders);
    let listed = eventually(&session, "pods on the GPU clicked", LISTED_PODS, |v| {
        *v == want
    })
    .await;
    assert_eq!(listed, want, "GPU {}", gpu.uuid);

    // A click on the node's name lists every pod on the node.
    let on_node: BTreeSet<String> = node.gpus.iter().flat_map(|g| g.holders.clone()).collect();
    session
        .click(&format!(".node-name[data-node=\"{}\"]", node.name))
        .await
        .expect("click on a node name");
    let want = names(&on_node);
    let listed = eventually(&session, "pods on the node clicked", LISTED_PODS, |v| {
        *v == want
    })
    .await;
    assert_eq!(listed, want, "node {}", node.name);

    // The cores mode repaints; the trend has samples; then the picture.
    session
        .click("input[name=mode][value=cores]")
        .await
        .expect("the colour toggle");
    eventually(
        &session,
        "fragmentation trend",
        "return state.view.trend.length;",
        |v| v.as_u64().is_some_and(|n| n >= 2),
    )
    .await;
    session
        .click(&format!(".gpu[data-uuid=\"{}\"]", gpu.uuid))
        .await
        .expect("click on a GPU again");
    let want = names(&holders);
    eventually(&session, "pods on the GPU, again", LISTED_PODS, |v| {
        *v == want
    })
    .await;
    let png = session.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let dir = artifacts();
    std::fs::create_dir_all(&dir).expect("artifacts folder");
    let path = dir.join("dashboard.png");
    std::fs::write(&path, &png).expect("screenshot written");
    eprintln!("screenshot: {}", path.display());

    session.quit().await;
    cluster.shutdown().await;
}

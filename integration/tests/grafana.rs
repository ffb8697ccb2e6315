//! Every metric the chart's Grafana dashboards query exists: the panel and
//! variable queries of `helm/gpuslice/dashboards/*.json` are parsed, their
//! metric names extracted, and each is looked up in a live scrape of the
//! scheduler-webhook's and every node-daemon's `/metrics` on the sandbox's
//! demo cluster (plus a ResourceQuota, so the quota series exist).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;
use integration::cluster::{Cluster, ControlPlaneKind};
use integration::sandbox::{Args, run};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn dashboards() -> Vec<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../helm/gpuslice/dashboards");
    let mut out: Vec<(PathBuf, Value)> = std::fs::read_dir(&dir)
        .expect("the chart's dashboards folder")
        .map(|e| e.expect("a dashboards folder entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let json =
                serde_json::from_str(&std::fs::read_to_string(&p).expect("a dashboard file"))
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, json)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every PromQL query of a dashboard: panels' `expr`, variables' `definition`.
fn queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// PromQL words that are not metric names.
const NOT_METRICS: &[&str] = &[
    "sum",
    "count",
    "max",
    "min",
    "avg",
    "rate",
    "increase",
    "irate",
    "histogram_quantile",
    "vector",
    "or",
    "and",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "topk",
    "bottomk",
    "label_values",
    "abs",
    "clamp_min",
    "clamp_max",
];

/// The metric names a query reads.
fn metric_names(query: &str) -> BTreeSet<String> {
    // Drop what is not an expression word: strings, label matchers,
    // ranges, grouping label lists, template variables.
    let mut text = String::with_capacity(query.len());
    let mut depth: Vec<char> = Vec::new();
    let mut chars = query.chars().peekable();
    while let Some(c) = chars.next() {
        match (depth.last(), c) {
            (Some('"'), '"') => {
                depth.pop();
            }
            (Some('"'), _) => {}
            (_, '"') => depth.push('"'),
            (_, '{') => depth.push('{'),
            (Some('{'), '}') => {
                depth.pop();
                text.push(' ');
            }
            (_, '[') => depth.push('['),
            (Some('['), ']') => {
                depth.pop();
                text.push(' ');
            }
            (Some('{' | '['), _) => {}
            (_, '$') => {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                {
                    chars.next();
                }
            }
            _ => text.push(c),
        }
    }
    let mut names = BTreeSet::new();
    // Grouping lists: remove "by (...)" etc. textually, then read words.
    let mut cleaned = text;
    for kw in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        while let Some(at) = find_word_paren(&cleaned, kw) {
            let close = cleaned[at..]
                .find(')')
                .map_or(cleaned.len(), |c| at + c + 1);
            cleaned.replace_range(at..close, " ");
        }
    }
    // label_values(metric, label): only the metric.
    while let Some(at) = cleaned.find("label_values(") {
        let start = at + "label_values(".len();
        let end = cleaned[start..]
            .find(')')
            .map_or(cleaned.len(), |c| start + c);
        let metric = cleaned[start..end]
            .split(',')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        cleaned.replace_range(at..=end.min(cleaned.len() - 1), &format!(" {metric} "));
    }
    for w in cleaned.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if w.is_empty() || w.starts_with(|c: char| c.is_ascii_digit()) || NOT_METRICS.contains(&w) {
            continue;
        }
        names.insert(w.to_owned());
    }
    names
}

/// Where `kw` starts as a word followed (after spaces) by `(`.
fn find_word_paren(text: &str, kw: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(kw).map(|i| i + from) {
        let before = text[..i].chars().next_back();
        let after = text[i + kw.len()..].trim_start();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && after.starts_with('(')
        {
            return Some(i);
        }
        from = i + kw.len();
    }
    None
}

/// Names of the samples in a scrape.
fn scraped(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_extractor_reads_names_and_skips_labels_functions_and_variables() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, node) (rate(a_bucket{node=~"$node", x="sum"}[$__rate_interval]))) / on (node) group_left count(b) or vector(0)"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["a_bucket".to_owned(), "b".to_owned()])
    );
    assert_eq!(
        metric_names("label_values(hami_gpu_memory_limit_bytes, node)"),
        BTreeSet::from(["hami_gpu_memory_limit_bytes".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_grafana_dashboards_query_is_exported() {
    let mut wanted: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, dashboard) in dashboards() {
        let mut qs = Vec::new();
        queries(&dashboard, &mut qs);
        assert!(!qs.is_empty(), "{}: no query", path.display());
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for q in qs {
            for name in metric_names(&q) {
                wanted.insert((name, file.clone()));
            }
        }
    }
    assert!(
        wanted.len() >= 15,
        "the extractor found too few names: {wanted:?}"
    );

    let mut args = Args::parse_from(["sandbox", "--format", "json", "--timeout", "180"]);
    // `GPUSLICE_CONTROL_PLANE=real`: the real kube-apiserver and kube-scheduler.
    args.control_plane = ControlPlaneKind::from_env();
    let (summary, cluster) = run(&args).await.expect("the sandbox runs");
    assert!(summary.as_expected(), "{:?}", summary.problems);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "1000000", "limits.nvidia.com/gpucores": "10000"}}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(cluster.client().await.unwrap(), "default")
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let missing = loop {
        let mut have = scraped(&cluster.metrics().await.expect("scheduler /metrics"));
        for node in &cluster.nodes {
            have.extend(scraped(
                &Cluster::scrape(&node.metrics_url)
                    .await
                    .expect("node-daemon /metrics"),
            ));
        }
        let missing: Vec<&(String, String)> = wanted
            .iter()
            .filter(|(name, _)| !have.contains(name))
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() > deadline {
            break format!("{missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    cluster.shutdown().await;
    assert_eq!(
        missing, "[]",
        "queried by a dashboard (name, file) but not exported"
    );
}

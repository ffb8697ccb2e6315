//! `bench`: the end-to-end benchmarks, printed as a Markdown table.
//!
//! - `burst`: 40 one-slice pods onto one 8-GPU node (the whole cluster in
//!   process, as the sandbox runs it): seconds until all run, and pods/s.
//! - `throughput`: one-slice pods over N nodes × 8 GPUs, create → Running.
//! - `steady`: after a burst settles, writes by gpuslice (node and pod
//!   annotations, bindings; not kube-scheduler's Lease or kubelet's status)
//!   counted at the API server over a quiet window, per node per hour.
//! - `extender`: the real `scheduler-webhook` binary (child process, TLS)
//!   over N nodes × 8 GPUs at ~60 % memory use: filter and bind latency
//!   p50/p99 and decisions/s over HTTPS (one decision at a time, and with
//!   binds overlapped as kube-scheduler runs them), next to the cost of only parsing
//!   the same filter bodies, and the service's resident memory.
//! - `chaos`: the chaos soak ([`integration::chaos`]): slice pods submitted
//!   and deleted for `--chaos-minutes` on `--chaos-nodes` nodes while seeded
//!   faults land; prints its report and fails when a must-be-0 figure
//!   (over-commits, mismatched containers, stuck or lost pods) is not 0.
//! - `kube-scheduler`: the real kube-scheduler on the real control plane
//!   ([`integration::scheduler_bench`]): `--nodes` N Node objects, `--pods`
//!   M pods per run, pods/s create → bound and kube-scheduler's own
//!   scheduling-attempt p50/p99, side by side for (a) whole-GPU pods without
//!   the extender, (b) slice pods through gpuslice (binpack), (c) the same
//!   with fgd; prints the ratios (b)/(a) and (c)/(a). `--format json` prints
//!   one JSON object per node count instead of the table.
//!
//! Figures, not assertions: run with `--release`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use integration::cluster::{Cluster, ClusterSpec, ControlPlaneKind, Mode};
use integration::fake_apiserver::FakeApiServer;
use integration::fake_scheduler::config::ExtenderConfig;
use integration::fake_scheduler::extender::Extender;
use integration::fake_scheduler::wire::ExtenderBindingArgs;
use integration::harness::wait_for_list;
use integration::sandbox::{scheduled_false, settled};
use integration::workload;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use serde_json::json;

/// End-to-end benchmarks of gpuslice; prints a Markdown table.
#[derive(Debug, Parser)]
#[command(name = "bench", version)]
struct Args {
    /// Run every benchmark at full size (throughput on 100 nodes, extender at 1,500 and 5,000 nodes).
    #[arg(long)]
    all: bool,
    /// Benchmarks to run: burst, throughput, steady, extender, chaos, kube-scheduler.
    #[arg(long, value_delimiter = ',', default_value = "burst,steady")]
    only: Vec<String>,
    /// Node counts for `kube-scheduler` (each size runs (a), (b) and (c) on fresh real control planes).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    nodes: Vec<usize>,
    /// Pods per run of `kube-scheduler`, created as fast as the API server accepts them.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// GPUs per node of `kube-scheduler` (allocatable nvidia.com/gpu: this for (a), × 10 slices for (b) and (c)).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// kube-scheduler's clientConnection qps and burst in every `kube-scheduler` run (its default, 50,
    /// would cap (a)'s own bindings; (b) and (c) bind through the extender's client).
    #[arg(long, default_value_t = 5000)]
    scheduler_qps: u32,
    /// Output of `kube-scheduler`: `table` (Markdown) or `json` (one object per node count:
    /// {"nodes", "baseline_pods_per_s", "binpack_pods_per_s", "fgd_pods_per_s", "filter_p99_ms", …};
    /// filter_p99_ms is the service's own filter histogram in (b)). `json` runs only `kube-scheduler`.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    format: String,
    /// Nodes for `throughput`.
    #[arg(long, default_value_t = 20)]
    throughput_nodes: usize,
    /// Node counts for `extender`.
    #[arg(long, value_delimiter = ',', default_value = "1500")]
    extender_nodes: Vec<usize>,
    /// Filter+bind decisions measured per extender size, once one at a time and once with binds overlapped.
    #[arg(long, default_value_t = 1000)]
    decisions: usize,
    /// Quiet window of `steady`, seconds.
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Repetitions of `burst` (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Control plane of `burst`, `throughput` and `chaos`: `fake` (in-process stand-ins) or `real`
    /// (kube-apiserver, etcd, kube-controller-manager, kube-scheduler built by
    /// integration/k8s/build.sh). `steady` and `extender` need the fake apiserver's request log;
    /// `chaos` on `real` leaves out the API faults and cut watches (only the fake injects them).
    #[arg(long, default_value = "fake")]
    control_plane: ControlPlaneKind,
    /// Allocation mode of `burst` and `throughput`: `device-plugin` or `dra` (the chart's
    /// `mode: dra`; needs `--control-plane real`).
    #[arg(long, default_value = "device-plugin", value_parser = parse_mode)]
    mode: Mode,
    /// Minutes of pod churn and faults for `chaos` (then it waits, up to about 75 s, for the cluster to settle).
    #[arg(long, default_value_t = 2.0)]
    chaos_minutes: f64,
    /// Nodes for `chaos` (4 GPUs each).
    #[arg(long, default_value_t = 4)]
    chaos_nodes: usize,
    /// With `--control-plane real`, keep kube-apiserver's audit log and print the requests
    /// `throughput` made per pod, by client, verb and resource (the busiest kinds). The log costs
    /// the API server a write per request, so its speed figures are not comparable with a run
    /// without it.
    #[arg(long)]
    api_audit: bool,
    /// Seed of `chaos`'s schedule (pod sizes, deletions, which fault where and for how long).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

type Row = (String, String, String);

/// Reads `--mode`.
fn parse_mode(value: &str) -> Result<Mode, String> {
    Mode::ALL
        .into_iter()
        .find(|m| m.as_str() == value)
        .ok_or_else(|| format!("unknown mode {value:?} (device-plugin, dra)"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    if args.all {
        args.only = ["burst", "throughput", "steady", "extender"]
            .map(String::from)
            .to_vec();
        args.throughput_nodes = 100;
        args.extender_nodes = vec![1500, 5000];
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut sections: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let json = args.format == "json";
    if json && args.only.iter().any(|o| o != "kube-scheduler") {
        anyhow::bail!("--format json applies to --only kube-scheduler alone");
    }
    for which in args.only.clone() {
        eprintln!("running {which} …");
        match which.as_str() {
            "burst" => rows.extend(burst(&args).await?),
            "throughput" => rows.extend(throughput(&args).await?),
            "steady" => rows.extend(steady(args.steady_seconds).await?),
            "extender" => {
                for &n in &args.extender_nodes {
                    rows.extend(extender(n, args.decisions).await?);
                }
            }
            "chaos" => {
                let report = chaos(&args).await?;
                failed.extend(report.failures().into_iter().map(|f| format!("chaos: {f}")));
                sections.push(report.to_markdown());
            }
            "kube-scheduler" => {
                for report in kube_scheduler(&args).await? {
                    failed.extend(kube_scheduler_failures(&report));
                    if json {
                        println!("{}", report.to_json());
                    } else {
                        sections.push(report.to_markdown());
                    }
                }
            }
            other => {
                anyhow::bail!(
                    "unknown benchmark {other:?} (burst, throughput, steady, extender, chaos, kube-scheduler)"
                )
            }
        }
    }
    if !rows.is_empty() {
        println!("| benchmark | figure | value |\n|---|---|---|");
        for (bench, figure, value) in rows {
            println!("| {bench} | {figure} | {value} |");
        }
    }
    for section in sections {
        println!("\n{section}");
    }
    if !json {
        println!("\nmachine: {} cores, {}", cores(), os());
    }
    if !failed.is_empty() {
        anyhow::bail!("must-be-0 figures are not 0: {}", failed.join(", "));
    }
    Ok(())
}

/// `kube-scheduler` at every `--nodes` size, each size's three runs in a
/// folder kept with `GPUSLICE_KEEP_CLUSTER_DIR=1` (every process's log).
async fn kube_scheduler(args: &Args) -> anyhow::Result<Vec<integration::scheduler_bench::Report>> {
    use integration::scheduler_bench::{Config, Run, run};
    let keep = std::env::var_os("GPUSLICE_KEEP_CLUSTER_DIR").is_some();
    let dir = tempfile::Builder::new()
        .prefix("gpuslice-ksbench-")
        .disable_cleanup(keep)
        .tempdir()?;
    if keep {
        eprintln!("  folder (kept): {}", dir.path().display());
    }
    let mut reports = Vec::new();
    for &nodes in &args.nodes {
        let config = Config {
            nodes,
            pods: args.pods,
            gpus_per_node: args.gpus_per_node,
            scheduler_qps: args.scheduler_qps,
            ..Config::default()
        };
        let started = Instant::now();
        let report = run(&config, &Run::ALL, dir.path()).await?;
        eprintln!(
            "  kube-scheduler at {nodes} nodes: {:.0} s in all",
            started.elapsed().as_secs_f64()
        );
        reports.push(report);
    }
    Ok(reports)
}

/// What must hold after a `kube-scheduler` run: every pod bound, no node
/// left locked, every slice pod allocated.
fn kube_scheduler_failures(report: &integration::scheduler_bench::Report) -> Vec<String> {
    report
        .runs
        .iter()
        .flat_map(|r| {
            let name = format!(
                "kube-scheduler {} at {} nodes",
                r.run.as_str(),
                report.nodes
            );
            let mut out = Vec::new();
            if r.bound != r.pods {
                out.push(format!("{name}: {}/{} pods bound", r.bound, r.pods));
            }
            if r.locked_nodes != 0 {
                out.push(format!("{name}: {} nodes left locked", r.locked_nodes));
            }
            if r.not_allocated != 0 {
                out.push(format!("{name}: {} pods not allocated", r.not_allocated));
            }
            out
        })
        .collect()
}

/// The chaos soak on the fake (or real) control plane.
async fn chaos(args: &Args) -> anyhow::Result<integration::chaos::Report> {
    if !(args.chaos_minutes.is_finite() && args.chaos_minutes > 0.0) {
        anyhow::bail!("--chaos-minutes must be a positive number");
    }
    let config = integration::chaos::Config {
        duration: Duration::from_secs_f64(args.chaos_minutes * 60.0),
        nodes: args.chaos_nodes.max(1),
        seed: args.seed,
        control_plane: args.control_plane,
        ..integration::chaos::Config::default()
    };
    Ok(integration::chaos::run(config).await?)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn os() -> String {
    std::fs::read_to_string("/proc/version")
        .map(|v| v.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Creates `pods` and waits until every one has settled; returns the seconds it took.
async fn submit_and_settle(
    cluster: &Cluster,
    pods: &[Pod],
    deadline: Duration,
) -> anyhow::Result<(f64, usize)> {
    let client = cluster.client().await?;
    let started = Instant::now();
    futures::stream::iter(pods)
        .map(|p| cluster.create_pod(p))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let want = pods.len();
    let list = wait_for_list(
        Api::<Pod>::namespaced(client, workload::NAMESPACE),
        watcher::Config::default(),
        "pods to settle",
        deadline,
        |ps| ps.len() >= want && ps.iter().all(settled),
    )
    .await?;
    let elapsed = started.elapsed().as_secs_f64();
    let (running, rest): (Vec<&Pod>, Vec<&Pod>) = list
        .iter()
        .partition(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
    for pod in rest {
        eprintln!(
            "  not running after {elapsed:.2} s: {}",
            not_running_why(pod)
        );
    }
    Ok((elapsed, running.len()))
}

/// `name: phase` and, for a pod kube-scheduler refused, its message.
fn not_running_why(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let refused = scheduled_false(pod).map_or("", |(_, message)| message);
    format!("{name}: {phase} {refused}")
}

async fn burst(args: &Args) -> anyhow::Result<Vec<Row>> {
    let mut times = Vec::new();
    // The fewest pods running at the settle of any run.
    let mut running = usize::MAX;
    for _ in 0..args.runs.max(1) {
        let cluster = Cluster::start(ClusterSpec {
            nodes: 1,
            gpus_per_node: 8,
            control_plane: args.control_plane,
            mode: args.mode,
            ..ClusterSpec::default()
        })
        .await?;
        cluster.wait_until_ready().await?;
        let (secs, ran) = submit_and_settle(
            &cluster,
            &workload::burst(40, 40960),
            Duration::from_secs(300),
        )
        .await?;
        times.push(secs);
        running = running.min(ran);
        cluster.shutdown().await;
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(vec![
        (
            format!(
                "burst: 40 slice pods, 1 node × 8 GPUs ({} control plane, {} mode)",
                args.control_plane.as_str(),
                args.mode.as_str()
            ),
            format!("seconds to settle (median of {})", times.len()),
            format!("{median:.2} s"),
        ),
        (
            "burst".into(),
            "pods/s (create → Running)".into(),
            format!("{:.1}", 40.0 / median),
        ),
        (
            "burst".into(),
            format!("pods running (fewest of {} runs)", times.len()),
            format!("{running}/40"),
        ),
    ])
}

async fn throughput(args: &Args) -> anyhow::Result<Vec<Row>> {
    let (nodes, control_plane, mode) = (args.throughput_nodes, args.control_plane, args.mode);
    if args.api_audit && control_plane != ControlPlaneKind::Real {
        anyhow::bail!("--api-audit needs --control-plane real");
    }
    let cluster = Cluster::start(ClusterSpec {
        nodes,
        gpus_per_node: 8,
        control_plane,
        mode,
        api_audit: args.api_audit,
        ..ClusterSpec::default()
    })
    .await?;
    cluster.wait_until_ready().await?;
    let count = nodes * 8 * 2; // two slices per GPU on average
    let pods = workload::burst(count, 40960);
    let audit_before = cluster.api_audit().transpose()?;
    let (secs, running) = submit_and_settle(&cluster, &pods, Duration::from_secs(900)).await?;
    let audit = match (cluster.api_audit().transpose()?, audit_before) {
        (Some(after), Some(before)) => Some(after.since(&before)),
        _ => None,
    };
    let rss = rss_kib(std::process::id())
        .map_or_else(|| "n/a".to_owned(), |k| format!("{} MiB", k / 1024));
    let (report, _) = cluster.check().await?;
    let restarts = cluster.kube_scheduler_restarts();
    cluster.shutdown().await;
    #[allow(clippy::cast_precision_loss)]
    let rate = running as f64 / secs;
    let mut rows = vec![
        (
            format!(
                "throughput: {count} slice pods, {nodes} nodes × 8 GPUs ({} control plane, {} mode)",
                control_plane.as_str(),
                mode.as_str()
            ),
            "pods/s (create → Running)".into(),
            format!("{rate:.1}"),
        ),
        (
            "throughput".into(),
            "pods running".into(),
            format!("{running}/{count}"),
        ),
        (
            "throughput".into(),
            "checker: over-committed GPUs / mismatched containers / unfinished pods".into(),
            format!(
                "{} / {} / {}",
                report.overcommitted.len(),
                report.mismatched.len(),
                report.unfinished.len()
            ),
        ),
        (
            "throughput".into(),
            match control_plane {
                ControlPlaneKind::Fake => {
                    "RSS of the whole in-process cluster (all fakes and services)"
                }
                ControlPlaneKind::Real => {
                    "RSS of the bench process (services, fake kubelets; not the Go control plane)"
                }
            }
            .into(),
            rss,
        ),
    ];
    if control_plane == ControlPlaneKind::Real {
        rows.push((
            "throughput".into(),
            "kube-scheduler restarts (it exits when it loses its Lease; restarted as its pod would be)"
                .into(),
            restarts.to_string(),
        ));
    }
    if let Some(audit) = audit {
        rows.extend(audit_rows(&audit, count));
    }
    Ok(rows)
}

/// The API requests per pod from create to settle: in all, then the
/// busiest kinds by client, verb and resource.
fn audit_rows(audit: &integration::real::audit::Tally, pods: usize) -> Vec<Row> {
    #[allow(clippy::cast_precision_loss)]
    let per_pod = |n: u64| format!("{:.2}", n as f64 / pods.max(1) as f64);
    let mut rows = vec![(
        "throughput: API requests (audit log, create → settle)".into(),
        format!(
            "per pod, all clients ({} requests; {} answered 409, {} answered 429)",
            audit.total(),
            audit.conflicts,
            audit.throttled
        ),
        per_pod(audit.total()),
    )];
    for (kind, n) in audit.busiest().into_iter().take(AUDIT_ROWS) {
        rows.push((
            "throughput: API requests".into(),
            format!("per pod: {} {} {}", kind.client, kind.verb, kind.resource),
            per_pod(n),
        ));
    }
    rows
}

/// Request kinds listed by `--api-audit`.
const AUDIT_ROWS: usize = 15;

/// Whether a request is a write made by gpuslice's services.
fn gpuslice_write(method: &str, path: &str) -> bool {
    let write = matches!(method, "POST" | "PUT" | "PATCH" | "DELETE");
    let not_ours =
        path.contains("/leases") || path.ends_with("/status") || path.contains("/events");
    write && !not_ours
}

async fn steady(window_secs: u64) -> anyhow::Result<Vec<Row>> {
    let nodes = 2;
    let cluster = Cluster::start(ClusterSpec {
        nodes,
        gpus_per_node: 8,
        ..ClusterSpec::default()
    })
    .await?;
    cluster.wait_until_ready().await?;
    submit_and_settle(
        &cluster,
        &workload::burst(40, 40960),
        Duration::from_secs(300),
    )
    .await?;
    // The one-time writes after registration (the handshake's first
    // `Requesting_` per node) must land before the quiet window starts.
    wait_for_list(
        Api::<Node>::all(cluster.client().await?),
        watcher::Config::default(),
        "handshakes",
        Duration::from_secs(120),
        |ns| {
            ns.len() >= nodes
                && ns.iter().all(|n| {
                    n.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("hami.io/node-handshake"))
                })
        },
    )
    .await?;
    let api = cluster.fake_api().ok_or_else(|| {
        anyhow::anyhow!("the quiet-period count needs the fake apiserver's request log")
    })?;
    let before = api.stats().requests;
    let window = Duration::from_secs(window_secs);
    tokio::time::sleep(window).await; // measuring a quiet period is the point here
    let after = api.stats().requests;
    let served = usize::try_from(after - before).unwrap_or(usize::MAX);
    let log = api.requests();
    let recent = &log[log.len().saturating_sub(served)..];
    let mut writes: BTreeMap<String, u64> = BTreeMap::new();
    for r in recent.iter().filter(|r| gpuslice_write(&r.method, &r.path)) {
        *writes
            .entry(format!("{} {}", r.method, r.path))
            .or_default() += 1;
    }
    let total: u64 = writes.values().sum();
    #[allow(clippy::cast_precision_loss)]
    let per_node_hour = total as f64 * 3600.0 / window.as_secs_f64() / nodes as f64;
    cluster.shutdown().await;
    let mut rows = vec![(
        format!("steady state: {nodes} nodes, 40 pods running, {window_secs} s quiet window"),
        "API writes by gpuslice per node per hour".to_owned(),
        format!("{per_node_hour:.0}"),
    )];
    for (what, n) in writes {
        rows.push((
            "steady state".into(),
            format!("write: {what}"),
            n.to_string(),
        ));
    }
    Ok(rows)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn sibling_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.join(name);
    path.exists().then_some(path)
}

fn register(node: &str, gpus: u32) -> String {
    let devices: Vec<serde_json::Value> = (0..gpus)
        .map(|i| {
            json!({"id": format!("GPU-{node}-{i}"), "index": i, "count": 10, "devmem": 40960, "devcore": 100,
                   "type": "NVIDIA-NVIDIA A100-SXM4-40GB", "mode": "hami-core", "health": true})
        })
        .collect();
    serde_json::to_string(&devices).unwrap_or_default()
}

async fn extender(nodes: usize, decisions: usize) -> anyhow::Result<Vec<Row>> {
    let Some(binary) = sibling_binary("scheduler-webhook") else {
        anyhow::bail!(
            "extender: build the service first (cargo build --release -p scheduler-webhook); looked next to this binary"
        );
    };
    let api = FakeApiServer::start(([127, 0, 0, 1], 0).into()).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let client = api.client().await?;

    eprintln!(
        "  creating {nodes} nodes × 8 GPUs and {} pods at ~60 % memory …",
        nodes * 8
    );
    let node_api: Api<Node> = Api::all(client.clone());
    let node_objects: Vec<Node> = futures::stream::iter(0..nodes)
        .map(|i| {
            let api = node_api.clone();
            async move {
                let name = format!("node-{i:05}");
                let node: Node = serde_json::from_value(json!({"metadata": {"name": name,
                    "annotations": {"hami.io/node-nvidia-register": register(&name, 8)}}}))?;
                Ok::<_, anyhow::Error>(api.create(&PostParams::default(), &node).await?)
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..nodes * 8)
        .map(|i| {
            let api = pod_api.clone();
            async move {
                let (node, gpu) = (i / 8, i % 8);
                let node = format!("node-{node:05}");
                let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("busy-{i}"),
                    "annotations": {"hami.io/vgpu-node": node,
                        "hami.io/vgpu-devices-allocated": format!("GPU-{node}-{gpu},NVIDIA,24576,60:;")}},
                    "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                    "status": {"phase": "Running"}}))?;
                Ok::<_, anyhow::Error>(api.create(&PostParams::default(), &pod).await?)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    // One set measured one decision at a time, one with binds overlapped.
    let candidates: Vec<Pod> = futures::stream::iter(0..2 * decisions)
        .map(|i| {
            let api = pod_api.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("slice-{i}")},
                    "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "resources": {"limits":
                        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "10"}}}]}}))?;
                Ok::<_, anyhow::Error>(api.create(&PostParams::default(), &pod).await?)
            }
        })
        .buffered(32)
        .try_collect()
        .await?;

    // The real binary, over TLS.
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    std::fs::write(dir.path().join("tls.crt"), cert.cert.pem())?;
    std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem())?;
    let port = integration::real::control_plane::free_port()?;
    let mut child = std::process::Command::new(&binary)
        .arg("serve")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let result = measure_extender(&client, port, &node_objects, &candidates, child.id()).await;
    let _ = child.kill();
    let _ = child.wait();
    api.shutdown().await;
    let (filters, binds, overlapped, parse, rss, sync) = result?;
    let label = format!("extender: {nodes} nodes × 8 GPUs, ~60 % used, real binary over TLS");
    #[allow(clippy::cast_precision_loss)]
    let rate = decisions as f64
        / (filters.iter().sum::<Duration>() + binds.iter().sum::<Duration>()).as_secs_f64();
    Ok(vec![
        (
            label.clone(),
            "cache synced after start".into(),
            format!("{:.2} s", sync.as_secs_f64()),
        ),
        (
            label.clone(),
            "filter p50 / p99".into(),
            format!(
                "{} / {}",
                ms(percentile(&filters, 0.5)),
                ms(percentile(&filters, 0.99))
            ),
        ),
        (
            label.clone(),
            "bind p50 / p99".into(),
            format!(
                "{} / {}",
                ms(percentile(&binds, 0.5)),
                ms(percentile(&binds, 0.99))
            ),
        ),
        (
            label.clone(),
            "filter+bind decisions/s (sequential)".into(),
            format!("{rate:.0}"),
        ),
        (
            label.clone(),
            "filter+bind decisions/s, binds overlapped (as kube-scheduler runs its binding cycles)"
                .into(),
            format!("{overlapped:.0}"),
        ),
        (
            label.clone(),
            "parsing one filter body alone (p50)".into(),
            ms(parse),
        ),
        (
            label,
            format!("RSS with {} pods cached", nodes * 8),
            rss.map_or_else(|| "n/a".to_owned(), |k| format!("{} MiB", k / 1024)),
        ),
    ])
}

type Measured = (
    Vec<Duration>,
    Vec<Duration>,
    f64,
    Duration,
    Option<u64>,
    Duration,
);

/// What the node's device plugin does after Allocate: mark the pod allocated
/// and release the node lock (not timed: the extender is what is measured).
async fn play_device_plugin(client: &kube::Client, pod: &str, node: &str) -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let done = json!({"metadata": {"annotations": {"hami.io/bind-phase": "success", "hami.io/vgpu-devices-to-allocate": ";"}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&done))
        .await?;
    let unlock = json!({"metadata": {"annotations": {"hami.io/mutex.lock": null}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&unlock))
        .await?;
    Ok(())
}

async fn measure_extender(
    client: &kube::Client,
    port: u16,
    nodes: &[Node],
    pods: &[Pod],
    pid: u32,
) -> anyhow::Result<Measured> {
    let url = format!("https://127.0.0.1:{port}");
    let names = proto::hami::resources::ResourceNames::default();
    let extender = Extender::new(ExtenderConfig::hami(&url, &names.all()))?;
    let refs: Vec<&Node> = nodes.iter().collect();
    // Wait until the service has listed everything: the first filter places the pod.
    let started = Instant::now();
    let first = pods.first().ok_or_else(|| anyhow::anyhow!("no pods"))?;
    loop {
        if let Ok(result) = extender.filter(first, &refs).await
            && result.node_names.as_ref().is_some_and(|n| !n.is_empty())
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "scheduler-webhook never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // polling another process's readiness
    }
    let sync = started.elapsed();
    let (sequential, overlapped) = pods.split_at(pods.len() / 2);
    let (mut filters, mut binds) = (Vec::new(), Vec::new());
    for pod in sequential {
        let t = Instant::now();
        let result = extender.filter(pod, &refs).await?;
        filters.push(t.elapsed());
        let node = result
            .node_names
            .and_then(|n| n.into_iter().next())
            .ok_or_else(|| anyhow::anyhow!("filter placed nothing"))?;
        let t = Instant::now();
        let name = pod.metadata.name.clone().unwrap_or_default();
        extender
            .bind(&ExtenderBindingArgs {
                pod_name: name.clone(),
                pod_namespace: "default".to_owned(),
                pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                node: node.clone(),
            })
            .await?;
        binds.push(t.elapsed());
        play_device_plugin(client, &name, &node).await?;
    }
    filters.sort();
    binds.sort();
    let overlapped = decide_with_overlapped_binds(client, &extender, &refs, overlapped).await?;
    let rss = rss_kib(pid);
    // Parsing alone: the same body the service decodes.
    let body = serde_json::to_vec(&json!({"Pod": first, "Nodes": null,
        "NodeNames": nodes.iter().map(|n| n.metadata.name.clone()).collect::<Vec<_>>()}))?;
    let mut parses = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let _ = scheduler_webhook::extender::wire::decode_filter(&body)?;
        parses.push(t.elapsed());
    }
    parses.sort();
    Ok((
        filters,
        binds,
        overlapped,
        percentile(&parses, 0.5),
        rss,
        sync,
    ))
}

/// Decisions per second the way kube-scheduler makes them: filters one
/// after another (its scheduling cycle), each bind, and the device plugin's
/// lock release after it, in a task of its own (its binding cycle).
async fn decide_with_overlapped_binds(
    client: &kube::Client,
    extender: &Extender,
    refs: &[&Node],
    pods: &[Pod],
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut binding = tokio::task::JoinSet::new();
    for pod in pods {
        let result = extender.filter(pod, refs).await?;
        let node = result
            .node_names
            .and_then(|n| n.into_iter().next())
            .ok_or_else(|| anyhow::anyhow!("filter placed nothing"))?;
        let (extender, client) = (extender.clone(), client.clone());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        binding.spawn(async move {
            extender
                .bind(&ExtenderBindingArgs {
                    pod_name: name.clone(),
                    pod_namespace: "default".to_owned(),
                    pod_uid: uid,
                    node: node.clone(),
                })
                .await?;
            play_device_plugin(&client, &name, &node).await
        });
    }
    while let Some(done) = binding.join_next().await {
        done??;
    }
    #[allow(clippy::cast_precision_loss)]
    Ok(pods.len() as f64 / started.elapsed().as_secs_f64())
}

//! `scheduler-webhook simulate`: replays a production trace (openb format)
//! over the scheduling core, for every requested policy, split count and
//! seed, and reports allocation ratio, unallocated GPUs, fragmentation and
//! the allocation curve.
//!
//! This module owns the command line, file reading and output; the replay
//! itself ([`mod@replay`]) is pure.

pub mod bound;
pub mod replay;
pub mod report;
pub mod trace;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::core::fgd::{CpuOnlyFrag, FgdParams, FgdTies};
use crate::core::fgdpack::FgdPackParams;
use crate::core::policy::Policy;
use crate::simulate::bound::{BOUND, bound_result};
use crate::simulate::replay::{ReplayResult, ReplaySpec, replay, trace_distribution};

/// The node list `simulate` reads by default: openb's 1,213 GPU nodes, shipped in the
/// repository (`traces/openb/README.md`), relative to the repository root.
pub const DEFAULT_NODES: &str = "traces/openb/openb_node_list_gpu_node.csv";

/// The pod list `simulate` reads by default: openb's default trace, shipped beside
/// [`DEFAULT_NODES`].
pub const DEFAULT_PODS: &str = "traces/openb/openb_pod_list_default.csv";

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// A readable table.
    Table,
    /// One JSON object per run and line.
    Json,
}

/// `--fgd-cpu-only`: how CPU-only typical pods count ([`CpuOnlyFrag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuOnlyArg {
    /// All idle GPU capacity is a fragment to them (the paper's simulator).
    AllIdle,
    /// Only where the node is short of their CPU or memory.
    WhenShort,
}

/// `--fgd-ties`: how equal FGD node scores break ([`FgdTies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TiesArg {
    /// The fuller node for a GPU pod, the most spare CPU per idle GPU for a
    /// CPU-only pod.
    Fullness,
    /// A seeded coin at every decision (upstream kube-scheduler).
    Coin,
    /// One seeded node order per replay, the first node wins (the paper's
    /// simulator and its kube-scheduler fork).
    NodeOrder,
}

/// Flags of the `simulate` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Node list (openb CSV: sn, cpu_milli, memory_mib, gpu, model); by default the
    /// openb GPU nodes shipped in `traces/openb/` (relative to the working directory).
    #[arg(long, default_value = DEFAULT_NODES)]
    pub nodes: PathBuf,
    /// Pod list (openb CSV: name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, …);
    /// by default openb's default pod list shipped in `traces/openb/`.
    #[arg(long, default_value = DEFAULT_PODS)]
    pub pods: PathBuf,
    /// A policy (binpack, spread, fgd, bestfit, random, …), `bound` (a lower bound on
    /// unallocated GPUs for the same arrivals, from an LP and from the pods every policy
    /// must place) or `all` (every policy and the bound);
    /// repeatable or comma-separated.
    #[arg(
        long = "policy",
        value_name = "POLICY",
        default_value = "all",
        value_delimiter = ','
    )]
    pub policies: Vec<String>,
    /// Seed: N, or an inclusive range A-B; repeatable or comma-separated.
    #[arg(
        long = "seed",
        value_name = "SEED",
        default_value = "42",
        value_delimiter = ','
    )]
    pub seeds: Vec<String>,
    /// Arrived GPU demand to stop at, as a fraction of capacity.
    #[arg(long, default_value_t = 1.3)]
    pub demand: f64,
    /// HAMi split count of every GPU; repeatable or comma-separated.
    #[arg(
        long = "split-count",
        value_name = "N",
        default_value = "10",
        value_delimiter = ','
    )]
    pub split_counts: Vec<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Draw the allocation curves into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Runs in parallel.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// fgdpack: growth scale of the score's sigmoid, milli-GPU (fgd: 1000).
    #[arg(long, default_value_t = FgdPackParams::default().temperature)]
    pub fgdpack_temperature: f64,
    /// fgdpack: number of score steps (fgd: 100).
    #[arg(long, default_value_t = FgdPackParams::default().steps)]
    pub fgdpack_steps: f64,
    /// fgdpack: weight of CPU running ahead of GPU in the packing key (fgd: 0).
    #[arg(long, default_value_t = FgdPackParams::default().cpu_balance)]
    pub fgdpack_cpu_balance: f64,
    /// fgdpack: weight of the node's bestfit leftover in the packing key (fgd: 0).
    #[arg(long, default_value_t = FgdPackParams::default().leftover)]
    pub fgdpack_leftover: f64,
    /// fgdpack: weight of the growth in GPU capacity the node's free CPU or memory
    /// cannot feed, added to FGD's growth (fgd: 0).
    #[arg(long, default_value_t = FgdPackParams::default().strand)]
    pub fgdpack_strand: f64,
    /// fgdpack: weight of the GPU capacity the node's free CPU or memory cannot feed
    /// once the pod is placed, added to the growth too; not counted where the whole
    /// workload asks more CPU or memory than the nodes have for their GPUs (fgd: 0).
    #[arg(long, default_value_t = FgdPackParams::default().strand_left)]
    pub fgdpack_strand_left: f64,
    /// fgdpack: growth (milli-GPU) counted for leaving a node unable to host a
    /// multi-GPU shape that fewer than half of the nodes with enough GPUs can host
    /// (fgd: 0).
    #[arg(long, default_value_t = FgdPackParams::default().keep_hosts)]
    pub fgdpack_keep_hosts: f64,
    /// fgd and fgdpack: the most frequent shapes covering this share of the pods are
    /// the typical pods (the paper's simulator: 0.95).
    #[arg(long, default_value_t = FgdParams::default().coverage)]
    pub fgd_coverage: f64,
    /// fgd and fgdpack: memory is part of a typical pod's shape (the paper's
    /// simulator: false).
    #[arg(long, default_value_t = FgdParams::default().memory, action = clap::ArgAction::Set)]
    pub fgd_memory: bool,
    /// fgd and fgdpack: how CPU-only typical pods count.
    #[arg(long, value_enum, default_value_t = CpuOnlyArg::AllIdle)]
    pub fgd_cpu_only: CpuOnlyArg,
    /// fgd and fgdpack: the paper's integer node score (true), or the exact growth.
    #[arg(long, default_value_t = FgdParams::default().quantize, action = clap::ArgAction::Set)]
    pub fgd_integer_score: bool,
    /// fgd: how equal node scores break (the paper's simulator: node-order); fgdpack
    /// has its own packing key.
    #[arg(long, value_enum, default_value_t = TiesArg::Fullness)]
    pub fgd_ties: TiesArg,
    /// fgd and fgdpack: a fractional pod takes the GPU with the best (integer) score,
    /// lowest index on ties (true), or the least exact growth.
    #[arg(long, default_value_t = FgdParams::default().gpu_by_score, action = clap::ArgAction::Set)]
    pub fgd_gpu_by_score: bool,
    /// fgd and fgdpack: a typical pod asking n whole GPUs counts as 1 + n x this many
    /// pods (the paper's simulator's gpuResWeight; 0: by pods).
    #[arg(long, default_value_t = FgdParams::default().gpu_weight)]
    pub fgd_gpu_weight: f64,
    /// fgd (fullness ties): a GPU pod free to run on any model breaks equal scores by
    /// fullness minus this × the model's pinned-demand pressure (0-1), keeping off the
    /// models pinned pods need (0: off).
    #[arg(long, default_value_t = FgdParams::default().scarce_models)]
    pub fgd_scarce_models: f64,
    /// A relaxation for analysis: every node gets unbounded CPU and memory, so only the
    /// GPUs constrain placement. The difference to a normal run is what CPU and memory
    /// cost a policy in unallocated GPUs.
    #[arg(long)]
    pub relax_host: bool,
}

/// CPU and memory of a node under `--relax-host`: more than any trace asks.
const RELAXED_HOST: u64 = 1 << 40;

impl SimulateArgs {
    /// The FGD index's parameters the flags ask for. A node order's seed is
    /// set per replay ([`ReplaySpec::fgd`]).
    #[must_use]
    pub fn fgd_params(&self) -> FgdParams {
        FgdParams {
            coverage: self.fgd_coverage,
            memory: self.fgd_memory,
            cpu_only: match self.fgd_cpu_only {
                CpuOnlyArg::AllIdle => CpuOnlyFrag::AllIdle,
                CpuOnlyArg::WhenShort => CpuOnlyFrag::WhenShort,
            },
            quantize: self.fgd_integer_score,
            ties: match self.fgd_ties {
                TiesArg::Fullness => FgdTies::Fullness,
                TiesArg::Coin => FgdTies::Coin,
                TiesArg::NodeOrder => FgdTies::NodeOrder(0),
            },
            gpu_by_score: self.fgd_gpu_by_score,
            gpu_weight: self.fgd_gpu_weight,
            scarce_models: self.fgd_scarce_models,
        }
    }
}

/// Errors in the simulate flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A seed is neither N nor A-B.
    #[error("bad seed {0:?}: expected N or A-B")]
    Seed(String),
    /// A policy name is unknown.
    #[error("unknown policy {0:?}: {choices}, bound or all", choices = Policy::choices())]
    Policy(String),
    /// Demand not positive, or split count 0.
    #[error("{0}")]
    Range(&'static str),
}

/// One row group of the report: a policy replayed, or the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// Replay the arrivals under this policy.
    Policy(Policy),
    /// The lower bound on unallocated GPUs ([`mod@bound`]).
    Bound,
}

/// Expands the policy flags (`all` means every policy and the bound).
///
/// # Errors
/// An unknown name.
pub fn parse_policies(values: &[String]) -> Result<Vec<Run>, ArgsError> {
    let mut out = Vec::new();
    for v in values {
        let t = v.trim();
        if t.eq_ignore_ascii_case("all") {
            out.extend(Policy::ALL.map(Run::Policy));
            out.push(Run::Bound);
        } else if t.eq_ignore_ascii_case(BOUND) {
            out.push(Run::Bound);
        } else {
            out.push(Run::Policy(
                Policy::from_str(v).map_err(|_| ArgsError::Policy(v.clone()))?,
            ));
        }
    }
    let mut seen = Vec::new();
    out.retain(|p| {
        let fresh = !seen.contains(p);
        seen.push(*p);
        fresh
    });
    Ok(out)
}

/// Expands the seed flags.
///
/// # Errors
/// A value that is neither N nor A-B with A ≤ B.
pub fn parse_seeds(values: &[String]) -> Result<Vec<u64>, ArgsError> {
    let mut out = Vec::new();
    for v in values {
        let bad = || ArgsError::Seed(v.clone());
        let t = v.trim();
        if let Some((a, b)) = t.split_once('-') {
            let a: u64 = a.trim().parse().map_err(|_| bad())?;
            let b: u64 = b.trim().parse().map_err(|_| bad())?;
            if a > b || b - a > 10_000 {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            out.push(t.parse().map_err(|_| bad())?);
        }
    }
    Ok(out)
}

/// Runs the simulation and prints the report on stdout.
///
/// # Errors
/// Bad flags, unreadable or malformed trace files, an unwritable plot.
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    run_to(args, &mut std::io::stdout().lock())
}

/// Runs the simulation and writes the report to `out`.
///
/// # Errors
/// As [`run`].
pub fn run_to(args: &SimulateArgs, out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let policies = parse_policies(&args.policies)?;
    let seeds = parse_seeds(&args.seeds)?;
    if !(args.demand > 0.0 && args.demand.is_finite()) {
        return Err(ArgsError::Range("--demand must be a positive number").into());
    }
    if args.split_counts.contains(&0) {
        return Err(ArgsError::Range("--split-count must be at least 1").into());
    }
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let mut nodes = trace::parse_nodes(&read(&args.nodes)?)
        .with_context(|| format!("parsing {}", args.nodes.display()))?;
    if args.relax_host {
        for n in &mut nodes {
            n.cpu_milli = RELAXED_HOST;
            n.memory_mib = RELAXED_HOST;
        }
    }
    let pods = trace::parse_pods(&read(&args.pods)?)
        .with_context(|| format!("parsing {}", args.pods.display()))?;
    let dist = trace_distribution(&pods);

    let fgdpack = FgdPackParams {
        temperature: args.fgdpack_temperature,
        steps: args.fgdpack_steps,
        cpu_balance: args.fgdpack_cpu_balance,
        leftover: args.fgdpack_leftover,
        strand: args.fgdpack_strand,
        strand_left: args.fgdpack_strand_left,
        keep_hosts: args.fgdpack_keep_hosts,
    };
    if !(fgdpack.temperature > 0.0
        && fgdpack.steps > 0.0
        && fgdpack.cpu_balance.is_finite()
        && fgdpack.leftover.is_finite()
        && fgdpack.strand.is_finite()
        && fgdpack.strand_left.is_finite()
        && fgdpack.keep_hosts.is_finite())
    {
        return Err(ArgsError::Range(
            "--fgdpack-temperature and --fgdpack-steps must be positive, --fgdpack-cpu-balance, --fgdpack-leftover, --fgdpack-strand, --fgdpack-strand-left and --fgdpack-keep-hosts finite",
        )
        .into());
    }
    let fgd = args.fgd_params();
    if !(fgd.coverage > 0.0 && fgd.coverage <= 1.0) {
        return Err(ArgsError::Range("--fgd-coverage must be in (0, 1]").into());
    }
    if !(fgd.gpu_weight >= 0.0 && fgd.gpu_weight.is_finite()) {
        return Err(ArgsError::Range("--fgd-gpu-weight must be 0 or more").into());
    }
    if !(fgd.scarce_models >= 0.0 && fgd.scarce_models.is_finite()) {
        return Err(ArgsError::Range("--fgd-scarce-models must be 0 or more").into());
    }
    let mut specs = Vec::new();
    for &split_count in &args.split_counts {
        for &run in &policies {
            for &seed in &seeds {
                specs.push((
                    run,
                    ReplaySpec {
                        policy: match run {
                            Run::Policy(p) => p,
                            Run::Bound => Policy::Fgd,
                        },
                        seed,
                        demand: args.demand,
                        split_count,
                        fgdpack,
                        fgd,
                    },
                ));
            }
        }
    }
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(specs.len() as u64 * 100), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent}% {msg}")
    {
        bar.set_style(style);
    }
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    let jobs = args.jobs.clamp(1, specs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, specs, nodes, pods, dist, bar) = (&next, &specs, &nodes, &pods, &dist, &bar);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((run, spec)) = specs.get(i) else {
                        break;
                    };
                    let name = match run {
                        Run::Policy(p) => p.as_str(),
                        Run::Bound => BOUND,
                    };
                    bar.set_message(format!(
                        "{name} split {} seed {}",
                        spec.split_count, spec.seed
                    ));
                    let mut done = 0u64;
                    let r = match run {
                        Run::Policy(_) => replay(nodes, pods, dist, spec, |f| {
                            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                            let pct = (f * 100.0) as u64;
                            if pct > done {
                                bar.inc(pct - done);
                                done = pct;
                            }
                        })
                        .map_err(anyhow::Error::from),
                        Run::Bound => {
                            let r =
                                bound_result(nodes, pods, spec.seed, spec.demand, spec.split_count)
                                    .map_err(anyhow::Error::from);
                            bar.inc(100);
                            r
                        }
                    };
                    if tx.send((i, r)).is_err() {
                        break;
                    }
                }
            });
        }
    });
    drop(tx);
    bar.finish_and_clear();
    let mut results: Vec<(usize, ReplayResult)> = Vec::with_capacity(specs.len());
    for (i, r) in rx {
        results.push((i, r?));
    }
    results.sort_by_key(|(i, _)| *i);
    let results: Vec<ReplayResult> = results.into_iter().map(|(_, r)| r).collect();

    let text = match args.format {
        OutputFormat::Table => {
            let mut t = report::table(&results);
            if policies.contains(&Run::Bound) {
                t.push('\n');
                t.push_str(bound::RELAXED);
                t.push('\n');
            }
            t
        }
        OutputFormat::Json => report::json_lines(&results)?,
    };
    out.write_all(text.as_bytes())?;
    if let Some(path) = &args.plot {
        report::plot(&results, path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn parse(flags: &[&str]) -> SimulateArgs {
        use clap::Parser as _;
        Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn fgd_flags_default_to_the_default_params_and_set_each_knob() {
        assert_eq!(parse(&[]).fgd_params(), FgdParams::default());
        let paper = parse(&[
            "--fgd-coverage",
            "0.95",
            "--fgd-memory",
            "false",
            "--fgd-cpu-only",
            "when-short",
            "--fgd-integer-score",
            "false",
            "--fgd-ties",
            "node-order",
            "--fgd-gpu-by-score",
            "false",
        ])
        .fgd_params();
        assert_eq!(
            paper,
            FgdParams {
                coverage: 0.95,
                memory: false,
                cpu_only: CpuOnlyFrag::WhenShort,
                quantize: false,
                ties: FgdTies::NodeOrder(0),
                gpu_by_score: false,
                gpu_weight: 0.0,
                scarce_models: 0.0,
            }
        );
        assert_eq!(
            parse(&["--fgd-ties", "coin"]).fgd_params().ties,
            FgdTies::Coin
        );
    }

    #[test]
    fn flags_expand() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_seeds(&s(&["42-44", "7"])).unwrap(),
            vec![42, 43, 44, 7]
        );
        assert!(parse_seeds(&s(&["44-42"])).is_err());
        assert!(parse_seeds(&s(&["x"])).is_err());
        assert_eq!(
            parse_policies(&s(&["all"])).unwrap().len(),
            Policy::ALL.len() + 1
        );
        assert_eq!(
            parse_policies(&s(&["fgd", "FGD", "bestfit", "bound"])).unwrap(),
            vec![
                Run::Policy(Policy::Fgd),
                Run::Policy(Policy::BestFit),
                Run::Bound
            ]
        );
        assert!(parse_policies(&s(&["dotprod"])).is_err());
    }

    #[test]
    fn relax_host_lifts_cpu_and_memory_only() {
        // One node with two GPUs and CPU for one of the two whole-GPU pods.
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes.csv");
        let pods = dir.path().join("pods.csv");
        std::fs::write(
            &nodes,
            "sn,cpu_milli,memory_mib,gpu,model\nn0,4000,8192,2,T4\n",
        )
        .unwrap();
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,4000,8192,1,1000,,LS\n",
        )
        .unwrap();
        let unallocated = |relax_host: bool| {
            let args = SimulateArgs {
                nodes: nodes.clone(),
                pods: pods.clone(),
                policies: vec!["fgd".into()],
                format: OutputFormat::Json,
                relax_host,
                ..parse(&[])
            };
            let mut out = Vec::new();
            run_to(&args, &mut out).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            v["unallocated_gpus"].as_f64().unwrap()
        };
        assert!((unallocated(false) - 1.0).abs() < 1e-9);
        assert!(unallocated(true).abs() < 1e-9);
    }

    #[test]
    fn simulate_runs_end_to_end_on_a_tiny_trace() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes.csv");
        let pods = dir.path().join("pods.csv");
        let svg = dir.path().join("out.svg");
        std::fs::write(&nodes, "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,4,G2\nn2,8000,16384,0,\n").unwrap();
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,4000,8192,1,500,,LS\np1,2000,4096,1,250,T4,BE\np2,8000,8192,2,1000,,LS\np3,1000,1024,0,0,,BE\n",
        )
        .unwrap();
        let args = SimulateArgs {
            nodes,
            pods,
            policies: vec!["all".into()],
            seeds: vec!["1-2".into()],
            split_counts: vec![10, 100],
            format: OutputFormat::Json,
            plot: Some(svg.clone()),
            jobs: 2,
            // Every policy knob at its default, as the command line gives it.
            ..parse(&[])
        };
        let mut out = Vec::new();
        run_to(&args, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out.lines().count(),
            (Policy::ALL.len() + 1) * 2 * 2,
            "every policy and the bound x 2 split counts x 2 seeds"
        );
        let chart = std::fs::read_to_string(&svg).unwrap();
        assert!(
            chart.starts_with("<svg"),
            "{}",
            &chart[..chart.len().min(80)]
        );
        assert!(chart.contains("fgd split 100"));

        // The report functions, on the same runs.
        let text = std::fs::read_to_string(&args.nodes).unwrap();
        let n = trace::parse_nodes(&text).unwrap();
        let p = trace::parse_pods(&std::fs::read_to_string(&args.pods).unwrap()).unwrap();
        let d = trace_distribution(&p);
        let r = replay(
            &n,
            &p,
            &d,
            &ReplaySpec {
                policy: Policy::Fgd,
                seed: 1,
                demand: 1.3,
                split_count: 10,
                fgdpack: FgdPackParams::default(),
                fgd: FgdParams::default(),
            },
            |_| {},
        )
        .unwrap();
        let json = report::json_lines(std::slice::from_ref(&r)).unwrap();
        let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        for key in [
            "policy",
            "seed",
            "total_gpus",
            "allocation_ratio",
            "unallocated_gpus",
            "fragmentation_ratio",
            "pods_scheduled",
            "pods_failed",
            "curve",
            "split_count",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["total_gpus"], 6);
        let table = report::table(&[r]);
        assert!(table.contains("fgd"));
        assert!(table.contains("mean over seeds"));
    }

    #[test]
    fn missing_files_and_bad_flags_are_errors() {
        let args = SimulateArgs {
            nodes: "/nonexistent/nodes.csv".into(),
            pods: "/nonexistent/pods.csv".into(),
            policies: vec!["all".into()],
            seeds: vec!["1".into()],
            split_counts: vec![10],
            format: OutputFormat::Table,
            plot: None,
            jobs: 1,
            // Every policy knob at its default, as the command line gives it.
            ..parse(&[])
        };
        assert!(run(&args).unwrap_err().to_string().contains("reading"));
        assert!(
            run(&SimulateArgs {
                demand: -1.0,
                ..args.clone()
            })
            .is_err()
        );
        assert!(
            run(&SimulateArgs {
                split_counts: vec![0],
                ..args
            })
            .is_err()
        );
    }
}

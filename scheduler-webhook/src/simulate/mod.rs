//! `scheduler-webhook simulate`: replays a production trace (openb format)
//! over the scheduling core, for every requested policy, split count and
//! seed, and reports allocation ratio, unallocated GPUs, fragmentation and
//! the allocation curve.
//!
//! This module owns the command line, file reading and output; the replay
//! itself ([`mod@replay`]) is pure.

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

use crate::core::policy::Policy;
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
    /// binpack, spread, fgd, bestfit, random or all; repeatable or comma-separated.
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
}

/// Errors in the simulate flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A seed is neither N nor A-B.
    #[error("bad seed {0:?}: expected N or A-B")]
    Seed(String),
    /// A policy name is unknown.
    #[error("unknown policy {0:?}: {choices} or all", choices = Policy::choices())]
    Policy(String),
    /// Demand not positive, or split count 0.
    #[error("{0}")]
    Range(&'static str),
}

/// Expands the policy flags (`all` means every policy).
///
/// # Errors
/// An unknown name.
pub fn parse_policies(values: &[String]) -> Result<Vec<Policy>, ArgsError> {
    let mut out = Vec::new();
    for v in values {
        if v.trim().eq_ignore_ascii_case("all") {
            out.extend(Policy::ALL);
        } else {
            out.push(Policy::from_str(v).map_err(|_| ArgsError::Policy(v.clone()))?);
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
    let nodes = trace::parse_nodes(&read(&args.nodes)?)
        .with_context(|| format!("parsing {}", args.nodes.display()))?;
    let pods = trace::parse_pods(&read(&args.pods)?)
        .with_context(|| format!("parsing {}", args.pods.display()))?;
    let dist = trace_distribution(&pods);

    let mut specs = Vec::new();
    for &split_count in &args.split_counts {
        for &policy in &policies {
            for &seed in &seeds {
                specs.push(ReplaySpec {
                    policy,
                    seed,
                    demand: args.demand,
                    split_count,
                });
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
                    let Some(spec) = specs.get(i) else { break };
                    bar.set_message(format!(
                        "{} split {} seed {}",
                        spec.policy, spec.split_count, spec.seed
                    ));
                    let mut done = 0u64;
                    let r = replay(nodes, pods, dist, spec, |f| {
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let pct = (f * 100.0) as u64;
                        if pct > done {
                            bar.inc(pct - done);
                            done = pct;
                        }
                    });
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
        OutputFormat::Table => report::table(&results),
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

    #[test]
    fn flags_expand() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_seeds(&s(&["42-44", "7"])).unwrap(),
            vec![42, 43, 44, 7]
        );
        assert!(parse_seeds(&s(&["44-42"])).is_err());
        assert!(parse_seeds(&s(&["x"])).is_err());
        assert_eq!(parse_policies(&s(&["all"])).unwrap().len(), 5);
        assert_eq!(
            parse_policies(&s(&["fgd", "FGD", "bestfit"])).unwrap(),
            vec![Policy::Fgd, Policy::BestFit]
        );
        assert!(parse_policies(&s(&["dotprod"])).is_err());
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
            demand: 1.3,
            split_counts: vec![10, 100],
            format: OutputFormat::Json,
            plot: Some(svg.clone()),
            jobs: 2,
        };
        let mut out = Vec::new();
        run_to(&args, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out.lines().count(),
            20,
            "5 policies x 2 split counts x 2 seeds"
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
            demand: 1.3,
            split_counts: vec![10],
            format: OutputFormat::Table,
            plot: None,
            jobs: 1,
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

//! `sandbox`: a whole gpuslice cluster on one machine (see `integration::sandbox`).

use std::process::ExitCode;

use clap::Parser;
use integration::sandbox::{Args, run, table};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .try_init();
    }
    if args.format == "table" {
        let sharing = if args.workload == "mig" {
            "MIG mode".to_owned()
        } else {
            format!("{} slices each", args.split_count)
        };
        eprintln!(
            "starting a cluster: {} node(s) x {} {} ({} MiB, {sharing}), workload {}",
            args.nodes, args.gpus_per_node, args.gpu_model, args.gpu_memory, args.workload
        );
    }
    let (mut summary, cluster) = match run(&args).await {
        Ok(done) => done,
        Err(e) => {
            eprintln!("sandbox: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.keep_running {
        summary.kubeconfig = Some(cluster.kubeconfig.display().to_string());
        summary.dashboard_url = Some(cluster.dashboard_url());
    }
    if args.format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
    } else {
        print!("{}", table(&summary));
    }
    if args.keep_running {
        eprintln!(
            "\ncluster is up; try:\n  kubectl --kubeconfig {} get pods -o wide\n\
             live dashboard: {}\nCtrl-C stops it.",
            cluster.kubeconfig.display(),
            cluster.dashboard_url()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    cluster.shutdown().await;
    if summary.as_expected() {
        ExitCode::SUCCESS
    } else {
        eprintln!("sandbox: the result is not the expected one:");
        for problem in &summary.problems {
            eprintln!("  {problem}");
        }
        ExitCode::FAILURE
    }
}

//! `fake-scheduler`: the kube-scheduler stand-in with one HTTP extender as
//! a standalone process. Runs until SIGTERM or Ctrl-C, then releases its
//! Lease. See the "fake-scheduler" section of integration/README.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use integration::fake_scheduler::{
    FakeScheduler, LeaderElectionConfig, SchedulerConfig, SchedulerFile,
};
use tracing::{error, info};

/// Schedules pending pods of one schedulerName like kube-scheduler with one
/// extender: CPU/memory fit, POST `<urlPrefix>/<filterVerb>` with NodeNames,
/// POST `<urlPrefix>/<bindVerb>`, FailedScheduling events, backoff 1 s → 10 s,
/// leader election on a Lease in kube-system.
#[derive(Debug, Parser)]
#[command(name = "fake-scheduler", version)]
struct Args {
    /// kubeconfig of the cluster (e.g. the one fake-apiserver writes).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: PathBuf,
    /// Pods with this spec.schedulerName are scheduled (default: the
    /// profile's schedulerName in the config file, else default-scheduler).
    #[arg(long, value_name = "NAME")]
    scheduler_name: Option<String>,
    /// Extender configuration, YAML or JSON: a whole
    /// KubeSchedulerConfiguration (`extenders[0]` is used) or one extender
    /// entry (urlPrefix, filterVerb, bindVerb, nodeCacheCapable,
    /// httpTimeout, enableHTTPS, tlsConfig, managedResources, ignorable).
    /// Without it every pod is scheduled by the fake itself.
    #[arg(long, value_name = "FILE")]
    extender_config: Option<PathBuf>,
    /// Schedule without holding the Lease.
    #[arg(long)]
    no_leader_elect: bool,
    /// Namespace of the Lease (default kube-system).
    #[arg(long, value_name = "NS")]
    lease_namespace: Option<String>,
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

async fn client(path: &PathBuf) -> Result<kube::Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| format!("{}: {e}", path.display()))?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

fn config(args: &Args) -> Result<SchedulerConfig, String> {
    let file = match &args.extender_config {
        Some(path) => SchedulerFile::load(path).map_err(|e| e.to_string())?,
        None => SchedulerFile::default(),
    };
    let name = args
        .scheduler_name
        .clone()
        .or(file.scheduler_name.clone())
        .unwrap_or_else(|| "default-scheduler".into());
    let mut config = SchedulerConfig::new(&name, file.extender.clone());
    if args.no_leader_elect || file.leader_elect == Some(false) {
        config.leader_election = None;
    } else {
        let mut le = LeaderElectionConfig::for_lease(file.lease_name.as_deref().unwrap_or(&name));
        if let Some(ns) = args
            .lease_namespace
            .clone()
            .or(file.lease_namespace.clone())
        {
            le.namespace = ns;
        }
        config.leader_election = Some(le);
    }
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fake-scheduler: {e}");
            return ExitCode::from(64);
        }
    };
    let client = match client(&args.kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fake-scheduler: kubeconfig {e}");
            return ExitCode::from(64);
        }
    };
    let scheduler = match FakeScheduler::start(client, config.clone()).await {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot start");
            return ExitCode::from(1);
        }
    };
    info!(
        scheduler = %config.scheduler_name,
        identity = scheduler.identity().unwrap_or("-"),
        extender = config.extender.as_ref().map_or("-", |e| e.url_prefix.as_str()),
        "running; Ctrl-C or SIGTERM stops"
    );
    shutdown_signal().await;
    let stats = scheduler.stats();
    scheduler.shutdown().await;
    info!(?stats, "stopped");
    ExitCode::SUCCESS
}

//! `fake-kubelet`: one node's kubelet, as a device plugin and the API server
//! see it. Serves `Registration` on `<dir>/kubelet.sock`, keeps the node's
//! device capacity, admits the node's pods one at a time and writes their
//! status. Runs until SIGTERM or Ctrl-C. See the "fake-kubelet" section of
//! integration/README.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use integration::fake_kubelet::node::{NodeAgent, NodeConfig};
use integration::fake_kubelet::{Config, FakeKubelet, Options};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::{error, info};

/// Exit code for a bad command line or configuration (sysexits `EX_USAGE`).
const EX_USAGE: u8 = 64;

/// Stand-in for kubelet's device manager: device-plugin registration,
/// ListAndWatch, serial pod admission with GetPreferredAllocation/Allocate.
#[derive(Debug, Parser)]
#[command(name = "fake-kubelet", version)]
struct Args {
    /// Node name: the Node object to keep and the pods (`spec.nodeName`) to admit.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Device-plugins folder (kubelet.sock, plugin sockets, checkpoint).
    #[arg(long, env = "FAKE_KUBELET_DIR", value_name = "DIR")]
    dir: PathBuf,
    /// Kubeconfig of the API server to use.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    kubeconfig: PathBuf,
    /// Device-plugin resource to report (as 0) before its plugin registers. Repeatable.
    #[arg(long = "resource", value_name = "NAME")]
    resources: Vec<String>,
    /// Folder for one `<namespace>_<pod>.json` admission record per pod.
    #[arg(long, env = "FAKE_KUBELET_RECORD_DIR", value_name = "DIR")]
    record_dir: Option<PathBuf>,
    /// Also serve kubelet's pod-resources API on this socket
    /// (kubelet: /var/lib/kubelet/pod-resources/kubelet.sock).
    #[arg(long, value_name = "SOCKET")]
    pod_resources_socket: Option<PathBuf>,
    /// CPU capacity of the node.
    #[arg(long, default_value = "8")]
    cpu: String,
    /// Memory capacity of the node.
    #[arg(long, default_value = "32Gi")]
    memory: String,
    /// Pod capacity of the node.
    #[arg(long, default_value = "110")]
    pods: String,
}

async fn client(path: &PathBuf) -> Result<kube::Client, String> {
    let kubeconfig =
        Kubeconfig::read_from(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    kube::Client::try_from(config).map_err(|e| format!("client: {e}"))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let bad = args
        .resources
        .iter()
        .find(|r| !integration::fake_kubelet::admission::is_extended_resource_name(r));
    if let Some(bad) = bad {
        eprintln!("fake-kubelet: --resource {bad:?} is not an extended resource name");
        return ExitCode::from(EX_USAGE);
    }
    let client = match client(&args.kubeconfig).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("fake-kubelet: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let options = Options {
        pod_resources_socket: args.pod_resources_socket,
        ..Options::default()
    };
    let config = Config {
        dir: args.dir,
        record_dir: args.record_dir,
    };
    let kubelet = match FakeKubelet::start_with(config, options).await {
        Ok(kubelet) => kubelet,
        Err(e) => {
            error!(error = %e, "cannot start");
            return ExitCode::from(1);
        }
    };
    let node = NodeConfig {
        node_name: args.node_name,
        resources: args.resources,
        cpu: args.cpu,
        memory: args.memory,
        pods: args.pods,
    };
    let agent = match NodeAgent::start(&kubelet, client, node).await {
        Ok(agent) => agent,
        Err(e) => {
            error!(error = %e, "cannot register the node");
            return ExitCode::from(1);
        }
    };
    info!(socket = %kubelet.socket().display(), "fake-kubelet running");
    shutdown_signal().await;
    agent.shutdown().await;
    kubelet.shutdown().await;
    ExitCode::SUCCESS
}

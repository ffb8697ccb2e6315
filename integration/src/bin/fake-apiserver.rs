//! `fake-apiserver`: the in-memory kube-apiserver stand-in as a standalone
//! process, for kubectl, curl and our binaries. Runs until SIGTERM or
//! Ctrl-C. See the "fake-apiserver" section of integration/README.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use integration::fake_apiserver::{FakeApiServer, Options};
use tracing::{error, info};

/// In-memory Kubernetes API subset (pods, nodes, events, resourcequotas,
/// namespaces, leases) over HTTP, with watch, patch, binding and fault
/// injection under /fake/.
#[derive(Debug, Parser)]
#[command(name = "fake-apiserver", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; see the kubeconfig
    /// or the first stdout line for the one chosen).
    #[arg(long, env = "FAKE_APISERVER_LISTEN", default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server to FILE.
    #[arg(long, env = "FAKE_APISERVER_KUBECONFIG_OUT", value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, default_value_t = 5)]
    bookmark_interval_secs: u64,
    /// Change events kept for watch replay; older resourceVersions get 410.
    #[arg(long, default_value_t = 1000)]
    history_limit: usize,
    /// Delete pods bound to an existing node gracefully: set
    /// deletionTimestamp and wait for the kubelet's grace-0 delete.
    #[arg(long)]
    graceful_pod_deletion: bool,
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
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
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            // --help / --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(64);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = Options {
        history_limit: args.history_limit,
        graceful_pod_deletion: args.graceful_pod_deletion,
        bookmark_interval: Duration::from_secs(args.bookmark_interval_secs.max(1)),
        ..Options::default()
    };
    let server = match FakeApiServer::start_with(args.listen, options).await {
        Ok(server) => server,
        Err(e) => {
            error!(error = %e, "cannot start");
            return ExitCode::from(1);
        }
    };
    if let Some(path) = &args.kubeconfig_out {
        if let Err(e) = server.write_kubeconfig(path) {
            error!(error = %e, "cannot write kubeconfig");
            server.shutdown().await;
            return ExitCode::from(1);
        }
        info!(path = %path.display(), "kubeconfig written");
    }
    println!("fake-apiserver listening on {}", server.url());
    shutdown_signal().await;
    info!("shutting down");
    server.shutdown().await;
    ExitCode::SUCCESS
}

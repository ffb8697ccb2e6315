//! Process-level plumbing for the binary: the tracing subscriber (human or
//! JSON lines, filtered by `RUST_LOG`, default `info`) and the termination
//! signal future (SIGTERM or SIGINT).

use tracing::info;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; a second call does nothing.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Completes on SIGTERM or SIGINT. If the handlers cannot be installed it
/// never completes (the process is then stopped by SIGKILL, as before).
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
}

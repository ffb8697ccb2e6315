//! Process-level plumbing for the binary: the termination signal future
//! (SIGTERM or SIGINT). The tracing subscriber is the shared
//! [`telemetry::init`].

use tracing::info;

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

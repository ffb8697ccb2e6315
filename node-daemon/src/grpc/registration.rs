//! The plugin socket's lifecycle, as kubelet expects it (spec
//! kubernetes-interfaces §1):
//!
//! 1. bind `<dir>/<name>.sock` (a stale file is removed first) and serve;
//! 2. `Register` with `<dir>/kubelet.sock` (version `v1beta1`, our endpoint
//!    and resource name, preferred allocation on), retrying until kubelet
//!    answers — unless our socket disappears meanwhile (a kubelet that
//!    restarts while we register wipes it, and could never dial the
//!    endpoint we name): then go to 1;
//! 3. watch the folder: when kubelet restarts it wipes the sockets and
//!    re-creates `kubelet.sock`, so our socket gone or `kubelet.sock`
//!    replaced (another inode) means: drain this server, go to 1;
//! 4. on shutdown: stop accepting, let in-flight calls (Allocate) finish,
//!    end ListAndWatch streams, remove our socket.
//!
//! The folder is polled (every [`WATCH_INTERVAL`]): no API write happens on
//! that timer, it only notices kubelet restarts.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::deviceplugin::v1beta1 as api;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server};
use tracing::{info, warn};

use super::plugin::DevicePluginService;

/// How often the folder is checked for a kubelet restart.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// Pause between failed registrations.
const REGISTER_RETRY: Duration = Duration::from_secs(1);
/// Bound on one registration attempt.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and as what the plugin registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSocket {
    /// kubelet's device-plugin folder.
    pub dir: PathBuf,
    /// Our socket's file name in it, e.g. `nvidia-gpu.sock`.
    pub endpoint: String,
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
}

impl PluginSocket {
    /// Our socket's path.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.endpoint)
    }

    /// kubelet's registration socket's path.
    #[must_use]
    pub fn kubelet_path(&self) -> PathBuf {
        self.dir.join(api::KUBELET_SOCKET)
    }
}

/// Why the plugin could not serve.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The socket could not be bound.
    #[error("cannot serve on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Registration failed.
    #[error("register with kubelet at {path}: {reason}")]
    Register {
        /// kubelet's socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Calls kubelet's `Register` once.
///
/// # Errors
/// [`PluginError::Register`] when kubelet cannot be reached or refuses.
pub async fn register(socket: &PluginSocket) -> Result<(), PluginError> {
    let path = socket.kubelet_path();
    let error = |reason: String| PluginError::Register {
        path: path.clone(),
        reason,
    };
    let channel = Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(|e| error(e.to_string()))?
        .connect_timeout(REGISTER_TIMEOUT)
        .timeout(REGISTER_TIMEOUT)
        .connect()
        .await
        .map_err(|e| error(e.to_string()))?;
    api::registration_client::RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: api::VERSION.to_owned(),
            endpoint: socket.endpoint.clone(),
            resource_name: socket.resource_name.clone(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|s| error(format!("{}: {}", s.code(), s.message())))?;
    Ok(())
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Binds `path`, removing a stale socket file first.
fn bind(path: &Path) -> Result<UnixListener, PluginError> {
    let error = |source| PluginError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    UnixListener::bind(path).map_err(error)
}

/// What ended one served incarnation of the socket.
enum End {
    Shutdown,
    KubeletRestarted,
}

/// Serves and registers until `shutdown` turns true (see module docs).
/// `service` makes the service of one incarnation from its drain signal.
///
/// # Errors
/// [`PluginError::Bind`] when the socket cannot be bound.
pub async fn serve_and_register(
    socket: PluginSocket,
    service: impl Fn(watch::Receiver<bool>) -> DevicePluginService,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    let path = socket.path();
    loop {
        let listener = bind(&path)?;
        let our_inode = inode(&path);
        let (drain_tx, drain_rx) = watch::channel(false);
        let mut server_drain = drain_rx.clone();
        let server = tokio::spawn(
            Server::builder()
                .add_service(api::device_plugin_server::DevicePluginServer::new(service(
                    drain_rx,
                )))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = server_drain.wait_for(|d| *d).await;
                }),
        );
        info!(socket = %path.display(), "device plugin serving");
        let end = watch_incarnation(&socket, our_inode, &mut shutdown).await;
        let _ = drain_tx.send(true);
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(%error, "device plugin server ended with an error"),
            Err(error) => warn!(%error, "device plugin server task failed"),
        }
        match end {
            End::Shutdown => {
                if inode(&path) == our_inode {
                    let _ = std::fs::remove_file(&path);
                }
                info!(socket = %path.display(), "device plugin stopped; socket removed");
                return Ok(());
            }
            End::KubeletRestarted => info!("kubelet restarted: serving and registering again"),
        }
    }
}

/// Registers, then waits for shutdown or a kubelet restart.
async fn watch_incarnation(
    socket: &PluginSocket,
    our_inode: Option<u64>,
    shutdown: &mut watch::Receiver<bool>,
) -> End {
    let mut ticker = tokio::time::interval(WATCH_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let kubelet_inode = loop {
        // A kubelet that restarts while we register wipes our socket: then
        // every Register names an endpoint kubelet cannot dial, so serve a
        // new one first.
        if inode(&socket.path()) != our_inode {
            return End::KubeletRestarted;
        }
        let kubelet_inode = inode(&socket.kubelet_path());
        if kubelet_inode.is_some() {
            match register(socket).await {
                Ok(()) => {
                    info!(resource = %socket.resource_name, endpoint = %socket.endpoint, "registered with kubelet");
                    break kubelet_inode;
                }
                Err(error) => warn!(%error, "registration failed; retrying"),
            }
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return End::Shutdown,
            () = tokio::time::sleep(if kubelet_inode.is_some() { REGISTER_RETRY } else { WATCH_INTERVAL }) => {}
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return End::Shutdown,
            _ = ticker.tick() => {}
        }
        let ours_gone = inode(&socket.path()) != our_inode;
        let kubelet_now = inode(&socket.kubelet_path());
        if ours_gone || (kubelet_now.is_some() && kubelet_now != kubelet_inode) {
            return End::KubeletRestarted;
        }
    }
}

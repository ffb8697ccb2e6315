//! The kubelet DRA plugin over gRPC: the `DRAPlugin` service
//! (`k8s.io/kubelet/pkg/apis/dra/v1`, a thin adapter over
//! [`DraDriver`]) on `<dra-plugin-dir>/dra.sock`, and the kubelet's plugin
//! registration (`pluginregistration/v1` `Registration`) on
//! `<plugin-registry-dir>/gpu.gpuslice.dev-reg.sock`. The kubelet's plugin
//! watcher finds the registration socket, calls `GetInfo`, dials the
//! endpoint it names, and reports with `NotifyRegistrationStatus`.
//!
//! The registration socket's connections go through
//! [`super::authority`]: the kubelet's plugin watcher sends the socket's
//! path as `:authority`, which our HTTP/2 server would refuse.
//!
//! Both sockets are served until shutdown (a stale file is removed first;
//! the folders are created), then drained (in-flight calls finish) and
//! removed. A kubelet restart needs nothing from us: its watcher finds the
//! registration socket again.

use std::path::{Path, PathBuf};

use futures::future::join_all;
use proto::dra::v1 as dra;
use proto::pluginregistration::v1 as reg;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::registration::PluginError;
use crate::dra::driver::{ClaimRef, DraDriver};

/// The DRA plugin socket's file name in `--dra-plugin-dir`.
pub const DRA_SOCKET: &str = "dra.sock";

/// The registration socket's file name in `--plugin-registry-dir`.
#[must_use]
pub fn registration_socket() -> String {
    format!("{}-reg.sock", proto::dra::DRIVER_NAME)
}

/// The `DRAPlugin` service.
#[derive(Debug, Clone)]
pub struct DraPluginService {
    driver: DraDriver,
}

impl DraPluginService {
    /// A service preparing with `driver`.
    #[must_use]
    pub fn new(driver: DraDriver) -> Self {
        Self { driver }
    }
}

fn claim_ref(claim: dra::Claim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace,
        uid: claim.uid,
        name: claim.name,
    }
}

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for DraPluginService {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let answers = join_all(claims.into_iter().map(|c| async move {
            let claim = claim_ref(c);
            let answer = match self.driver.prepare(&claim).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|(d, cdi)| dra::Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: vec![cdi],
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => dra::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                },
            };
            (claim.uid, answer)
        }))
        .await;
        Ok(Response::new(dra::NodePrepareResourcesResponse {
            claims: answers.into_iter().collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let answers = join_all(claims.into_iter().map(|c| async move {
            let claim = claim_ref(c);
            let error = self
                .driver
                .unprepare(&claim)
                .await
                .err()
                .unwrap_or_default();
            (claim.uid, dra::NodeUnprepareResourceResponse { error })
        }))
        .await;
        Ok(Response::new(dra::NodeUnprepareResourcesResponse {
            claims: answers.into_iter().collect(),
        }))
    }
}

/// The `Registration` service the kubelet's plugin watcher calls.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: reg::DRA_PLUGIN.to_owned(),
            name: proto::dra::DRIVER_NAME.to_owned(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![dra::SERVICE.to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!(driver = proto::dra::DRIVER_NAME, "registered with kubelet");
        } else {
            warn!(error = %status.error, "kubelet refused the DRA plugin registration");
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Where the two sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraSockets {
    /// `--dra-plugin-dir`.
    pub plugin_dir: PathBuf,
    /// `--plugin-registry-dir`.
    pub registry_dir: PathBuf,
}

impl DraSockets {
    /// The DRA plugin socket.
    #[must_use]
    pub fn plugin_path(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET)
    }

    /// The registration socket.
    #[must_use]
    pub fn registration_path(&self) -> PathBuf {
        self.registry_dir.join(registration_socket())
    }
}

/// Creates the folder and binds `path`, removing a stale socket first.
fn bind(path: &Path) -> Result<UnixListener, PluginError> {
    let error = |source| PluginError::Bind {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(error)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    UnixListener::bind(path).map_err(error)
}

/// The connections accepted on `listener`, each handed to the server
/// through a socket pair whose client-to-server direction goes through
/// [`super::authority::rewrite_client_to_server`]; ends at shutdown.
fn rewritten(
    listener: UnixListener,
    mut shutdown: watch::Receiver<bool>,
) -> tokio_stream::wrappers::UnboundedReceiverStream<std::io::Result<UnixStream>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let client = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => client,
                    Err(error) => {
                        warn!(%error, "registration socket: accept failed");
                        continue;
                    }
                },
            };
            let (ours, theirs) = match UnixStream::pair() {
                Ok(pair) => pair,
                Err(error) => {
                    warn!(%error, "registration socket: no socket pair");
                    continue;
                }
            };
            if tx.send(Ok(theirs)).is_err() {
                return;
            }
            let (client_read, mut client_write) = client.into_split();
            let (mut ours_read, ours_write) = ours.into_split();
            tokio::spawn(async move {
                if let Err(error) =
                    super::authority::rewrite_client_to_server(client_read, ours_write).await
                {
                    warn!(%error, "registration connection ended with an error");
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut ours_read, &mut client_write).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut client_write).await;
            });
        }
    });
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
}

/// Serves the DRA plugin, then the registration socket, until `shutdown`
/// turns true; drains both and removes their files.
///
/// # Errors
/// [`PluginError::Bind`] when a socket cannot be bound.
pub async fn serve(
    sockets: DraSockets,
    driver: DraDriver,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    let plugin_path = sockets.plugin_path();
    let registration_path = sockets.registration_path();
    // The endpoint first: the kubelet dials it as soon as it sees the
    // registration socket.
    let plugin_listener = bind(&plugin_path)?;
    let registration_listener = bind(&registration_path)?;
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let plugin = Server::builder()
        .add_service(dra::dra_plugin_server::DraPluginServer::new(
            DraPluginService::new(driver),
        ))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(plugin_listener),
            stop(shutdown.clone()),
        );
    let registration = Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            RegistrationService {
                endpoint: plugin_path.clone(),
            },
        ))
        .serve_with_incoming_shutdown(
            rewritten(registration_listener, shutdown.clone()),
            stop(shutdown.clone()),
        );
    info!(
        plugin = %plugin_path.display(),
        registration = %registration_path.display(),
        "DRA plugin serving"
    );
    let (plugin, registration) = tokio::join!(plugin, registration);
    for (what, result) in [("DRA plugin", plugin), ("registration", registration)] {
        if let Err(error) = result {
            warn!(%error, "{what} server ended with an error");
        }
    }
    let _ = shutdown.wait_for(|s| *s).await;
    for path in [&registration_path, &plugin_path] {
        let _ = std::fs::remove_file(path);
    }
    info!("DRA plugin stopped; sockets removed");
    Ok(())
}

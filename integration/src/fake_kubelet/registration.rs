//! Kubelet's side of device-plugin registration: the `Registration` gRPC
//! server on `<dir>/kubelet.sock`, dialling a registering plugin, fetching its
//! options and following its `ListAndWatch` stream.
//!
//! Owns the socket folder's lifecycle (wiping sockets like a starting kubelet)
//! and the plugin connections' tasks. Device state lives in the state owner
//! (`super::manager`); this module only feeds it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use proto::deviceplugin::v1beta1 as api;
use proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use proto::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use thiserror::Error;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint as GrpcEndpoint, Server, Uri};
use tonic::{Request, Response, Status};
use tracing::{info, instrument, warn};

use super::admission::is_extended_resource_name;
use super::manager::{Endpoint, StateHandle};

/// How long kubelet waits to dial a registering plugin (gRPC `WithBlock`
/// under a 10 s context: it keeps retrying until the socket answers).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a `Register` call is refused. Texts follow kubelet's
/// (`pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go`); they reach the
/// plugin as gRPC `Unknown`, as a Go error does.
#[derive(Debug, Error)]
pub enum RegisterError {
    /// Version other than `v1beta1`.
    #[error(
        "requested API version {0:?} is not supported by kubelet. Supported versions are [\"v1beta1\"]"
    )]
    UnsupportedVersion(String),
    /// Not an extended resource name.
    #[error("the ResourceName {0:?} is invalid")]
    InvalidResourceName(String),
    /// The endpoint is not a plain file name in the device-plugins folder.
    #[error("the endpoint {0:?} is not a socket file name in the device-plugins folder")]
    InvalidEndpoint(String),
    /// The plugin socket could not be dialled.
    #[error("failed to dial device plugin: {0}")]
    Dial(#[source] tonic::transport::Error),
    /// `GetDevicePluginOptions` failed.
    #[error("failed to get device plugin options: {0}")]
    Options(#[source] Status),
    /// The fake kubelet is shutting down.
    #[error("fake kubelet stopped")]
    Stopped,
}

/// Checks a `RegisterRequest` as kubelet does, before dialling.
pub fn validate(r: &api::RegisterRequest) -> Result<(), RegisterError> {
    if r.version != api::VERSION {
        return Err(RegisterError::UnsupportedVersion(r.version.clone()));
    }
    if !is_extended_resource_name(&r.resource_name) {
        return Err(RegisterError::InvalidResourceName(r.resource_name.clone()));
    }
    let plain = Path::new(&r.endpoint)
        .file_name()
        .is_some_and(|f| f == r.endpoint.as_str());
    if r.endpoint.is_empty() || !plain || r.endpoint == api::KUBELET_SOCKET {
        return Err(RegisterError::InvalidEndpoint(r.endpoint.clone()));
    }
    Ok(())
}

/// Dials `path`, retrying with backoff until it answers or `timeout` has
/// passed, as kubelet's blocking dial does.
pub async fn dial_within(
    path: PathBuf,
    timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(20);
    loop {
        match dial(path.clone()).await {
            Ok(channel) => return Ok(channel),
            Err(error) if tokio::time::Instant::now() + backoff >= deadline => return Err(error),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Dials a unix socket as a gRPC channel (one attempt).
pub async fn dial(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    GrpcEndpoint::from_static("http://[::]:50051")
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// The `Registration` service.
struct RegistrationService {
    dir: PathBuf,
    state: StateHandle,
    dial_timeout: Duration,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    #[instrument(skip_all, fields(resource = %request.get_ref().resource_name, endpoint = %request.get_ref().endpoint))]
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        match connect(&self.dir, &r, &self.state, self.dial_timeout).await {
            Ok(()) => {
                info!("device plugin registered");
                Ok(Response::new(api::Empty {}))
            }
            Err(error) => {
                warn!(%error, "registration refused");
                Err(Status::unknown(error.to_string()))
            }
        }
    }
}

/// Validates, dials the plugin, fetches its options, records the endpoint
/// and starts following `ListAndWatch` (kubelet's `connectClient` + `Run`).
async fn connect(
    dir: &Path,
    r: &api::RegisterRequest,
    state: &StateHandle,
    dial_timeout: Duration,
) -> Result<(), RegisterError> {
    validate(r)?;
    let channel = dial_within(dir.join(&r.endpoint), dial_timeout)
        .await
        .map_err(RegisterError::Dial)?;
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(api::Empty {})
        .await
        .map_err(RegisterError::Options)?
        .into_inner();

    let resource = r.resource_name.clone();
    let (go, ready) = oneshot::channel::<u64>();
    let stream = tokio::spawn(follow(
        client.clone(),
        resource.clone(),
        ready,
        state.clone(),
    ));
    let abort = stream.abort_handle();
    let generation = state
        .with(move |s| {
            let generation = s.next_generation();
            let endpoint = Endpoint {
                client,
                options,
                generation,
                stream: Some(abort),
            };
            s.connect(&resource, endpoint);
            generation
        })
        .await
        .map_err(|_| RegisterError::Stopped)?;
    let _ = go.send(generation);
    Ok(())
}

/// Follows a plugin's `ListAndWatch` stream once its endpoint is recorded.
async fn follow(
    mut client: DevicePluginClient<Channel>,
    resource: String,
    ready: oneshot::Receiver<u64>,
    state: StateHandle,
) {
    let Ok(generation) = ready.await else { return };
    match client.list_and_watch(api::Empty {}).await {
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(message)) => {
                        let r = resource.clone();
                        if state
                            .with(move |s| s.list_and_watch(&r, generation, message.devices))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        warn!(%error, %resource, "ListAndWatch ended unexpectedly for device plugin");
                        break;
                    }
                }
            }
        }
        Err(error) => warn!(%error, %resource, "ListAndWatch failed for device plugin"),
    }
    let _ = state
        .with(move |s| s.disconnected(&resource, generation))
        .await;
}

/// A running registration server.
pub(crate) struct RegistrationHandle {
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RegistrationHandle {
    /// Binds `<dir>/kubelet.sock` and serves `Registration` on it.
    pub(crate) fn start(
        dir: &Path,
        state: StateHandle,
        dial_timeout: Duration,
    ) -> std::io::Result<Self> {
        let socket = dir.join(api::KUBELET_SOCKET);
        let listener = UnixListener::bind(&socket)?;
        let (shutdown, stop) = oneshot::channel::<()>();
        let service = RegistrationService {
            dir: dir.to_owned(),
            state,
            dial_timeout,
        };
        let task = tokio::spawn(async move {
            let served = Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop.await;
                })
                .await;
            if let Err(error) = served {
                warn!(%error, "registration server failed");
            }
        });
        info!(socket = %socket.display(), "registration server listening");
        Ok(Self {
            shutdown: Some(shutdown),
            task,
        })
    }

    /// Stops serving and waits for the server to finish.
    pub(crate) async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RegistrationHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Removes every socket in `dir`, as kubelet does when it starts: plugins
/// watching the folder take this as the signal to register again. Regular
/// files (the checkpoint) stay. Returns the paths removed.
pub fn wipe_sockets(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::FileTypeExt;
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_socket() {
            std::fs::remove_file(entry.path())?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: &str, resource: &str, endpoint: &str) -> api::RegisterRequest {
        api::RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        }
    }

    #[test]
    fn validation_follows_kubelet() {
        assert!(validate(&req("v1beta1", "nvidia.com/gpu", "nvidia.sock")).is_ok());
        let e = validate(&req("v1alpha", "nvidia.com/gpu", "nvidia.sock")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
        );
        let e = validate(&req("v1beta1", "gpu", "nvidia.sock")).unwrap_err();
        assert_eq!(e.to_string(), "the ResourceName \"gpu\" is invalid");
        for bad in ["", "../x.sock", "a/b.sock", "kubelet.sock"] {
            assert!(
                matches!(
                    validate(&req("v1beta1", "nvidia.com/gpu", bad)),
                    Err(RegisterError::InvalidEndpoint(_))
                ),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn wipe_removes_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        let _listener = UnixListener::bind(dir.path().join("p.sock")).unwrap();
        std::fs::write(dir.path().join("kubelet_internal_checkpoint"), "{}").unwrap();
        let removed = wipe_sockets(dir.path()).unwrap();
        assert_eq!(removed, [dir.path().join("p.sock")]);
        assert!(dir.path().join("kubelet_internal_checkpoint").exists());
    }
}

//! Stand-ins for tests and benchmarks (not used by the daemon itself): a
//! kubelet `Registration` server on `<dir>/kubelet.sock` that records what
//! registers, a device-plugin client over a unix socket, and builders for
//! pods as the scheduler leaves them after bind.

use std::collections::BTreeMap;
use std::path::Path;

use proto::deviceplugin::v1beta1 as api;
use proto::hami::keys;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};

use crate::cluster::{ContainerView, PodView};

struct Recorder(mpsc::UnboundedSender<api::RegisterRequest>);

#[tonic::async_trait]
impl api::registration_server::Registration for Recorder {
    async fn register(
        &self,
        request: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(api::Empty {}))
    }
}

/// Serves kubelet's `Registration` on `<dir>/kubelet.sock` (replacing any
/// file there) on the current runtime and returns the registrations.
///
/// # Errors
/// The bind error.
pub fn start_kubelet(dir: &Path) -> std::io::Result<mpsc::UnboundedReceiver<api::RegisterRequest>> {
    let path = dir.join(api::KUBELET_SOCKET);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(&path)?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        Server::builder()
            .add_service(api::registration_server::RegistrationServer::new(Recorder(
                tx,
            )))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    Ok(rx)
}

/// A device-plugin client on the socket at `path`.
///
/// # Errors
/// The connection error.
pub async fn plugin_client(
    path: &Path,
) -> Result<api::device_plugin_client::DevicePluginClient<Channel>, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?;
    Ok(api::device_plugin_client::DevicePluginClient::new(channel))
}

/// A pod bound to `node` by the scheduler and waiting for Allocate: the
/// bind annotations and `devices` (HAMi pod-devices text) as both
/// to-allocate and allocated; one container per name, in HAMi order.
#[must_use]
pub fn bound_pod(
    node: &str,
    namespace: &str,
    name: &str,
    containers: &[&str],
    devices: &str,
) -> PodView {
    let annotations: BTreeMap<String, String> = [
        (keys::VGPU_NODE, node),
        (keys::BIND_PHASE, "allocating"),
        (keys::BIND_TIME, "1760929622"),
        (keys::VGPU_DEVICES_TO_ALLOCATE, devices),
        (keys::VGPU_DEVICES_ALLOCATED, devices),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    PodView {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{namespace}-{name}"),
        phase: "Pending".into(),
        terminating: false,
        annotations,
        containers: containers
            .iter()
            .map(|c| ContainerView {
                name: (*c).into(),
                cuda_disable_control: false,
                init: false,
            })
            .collect(),
    }
}

/// `pod` with its first `count` containers marked as init containers.
#[must_use]
pub fn with_init_containers(mut pod: PodView, count: usize) -> PodView {
    for c in pod.containers.iter_mut().take(count) {
        c.init = true;
    }
    pod
}

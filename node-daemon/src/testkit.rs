//! Stand-ins for tests and benchmarks (not used by the daemon itself): a
//! kubelet `Registration` server on `<dir>/kubelet.sock` that records what
//! registers, a device-plugin client over a unix socket, builders for pods
//! as the scheduler leaves them after bind, and free ports for listeners
//! that bind a moment later (this crate's tests and `integration`'s).

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

/// The lowest port [`free_port`] hands out.
const FREE_PORT_FLOOR: u16 = 10_000;

/// A free TCP port on 127.0.0.1 for a child process to bind a moment later.
///
/// It is taken below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), from a cursor that starts at a
/// random place per process and never repeats a port within a process. A port
/// from `bind(":0")` comes from the ephemeral range, which is also where every
/// outgoing connection takes its local port: with hundreds of connections
/// open in a test run, one of them took such a port between its release here
/// and a child's bind (kube-apiserver's, in CI) ("address already in use"). Below the range only
/// another listener can take it.
///
/// # Errors
/// No port in the range could be bound.
pub fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();

    let ceiling = ephemeral_floor();
    if ceiling <= FREE_PORT_FLOOR + 1_000 {
        // An unusual range leaves no room below it: take the kernel's pick.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port());
    }
    let span = u32::from(ceiling - FREE_PORT_FLOOR);
    let cursor = CURSOR.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        #[allow(clippy::cast_possible_truncation)] // reduced modulo a u16 span
        AtomicU32::new((random % u64::from(span)) as u32)
    });
    for _ in 0..span {
        let step = cursor.fetch_add(1, Ordering::Relaxed) % span;
        #[allow(clippy::cast_possible_truncation)] // step < span ≤ u16::MAX
        let port = FREE_PORT_FLOOR + step as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port on 127.0.0.1 in {FREE_PORT_FLOOR}..{ceiling}"),
    ))
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be
/// read, Linux's default).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_distinct_and_bindable() {
        let ceiling = ephemeral_floor();
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        for port in ports {
            assert!(
                (FREE_PORT_FLOOR..ceiling).contains(&port),
                "{port} outside {FREE_PORT_FLOOR}..{ceiling}"
            );
        }
        // A port handed out is one a child can bind.
        std::net::TcpListener::bind(("127.0.0.1", free_port().unwrap())).unwrap();
    }
}

//! Kubelet's pod-resources API (`v1`, `PodResourcesLister`) served from the
//! fake kubelet's own state: which admitted pod container holds which device
//! IDs (`List`, `Get`) and which devices are allocatable
//! (`GetAllocatableResources`).
//!
//! Owns only the translation of the state into the API's messages and the
//! server on its socket. It lists pods kubelet considers active (admitted and
//! not deleted); CPU, memory and dynamic resources are always empty.

use std::path::Path;

use proto::podresources::v1 as api;
use proto::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::manager::{State, StateHandle};

/// Every active pod with its containers' devices, in UID order.
pub(crate) fn list(state: &State) -> Vec<api::PodResources> {
    state
        .active
        .keys()
        .filter_map(|uid| pod(state, uid))
        .collect()
}

/// One active pod.
fn pod(state: &State, uid: &str) -> Option<api::PodResources> {
    let active = state.active.get(uid)?;
    let containers = active
        .containers
        .iter()
        .map(|name| api::ContainerResources {
            name: name.clone(),
            devices: state
                .table
                .container_devices(uid, name)
                .into_iter()
                .map(|(resource, ids)| api::ContainerDevices {
                    resource_name: resource,
                    device_ids: ids.into_iter().collect(),
                    topology: None,
                })
                .collect(),
            ..api::ContainerResources::default()
        })
        .collect();
    Some(api::PodResources {
        name: active.name.clone(),
        namespace: active.namespace.clone(),
        containers,
    })
}

/// Healthy devices per resource (kubelet's `GetAllocatableDevices`).
pub(crate) fn allocatable(state: &State) -> Vec<api::ContainerDevices> {
    state
        .table
        .registered()
        .map(|resource| api::ContainerDevices {
            resource_name: resource.clone(),
            device_ids: state
                .table
                .devices(resource)
                .into_iter()
                .filter(|(_, healthy)| *healthy)
                .map(|(id, _)| id)
                .collect(),
            topology: None,
        })
        .filter(|d| !d.device_ids.is_empty())
        .collect()
}

struct Lister {
    state: StateHandle,
}

fn stopped(_: super::error::Error) -> Status {
    Status::unavailable("fake kubelet stopped")
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<api::ListPodResourcesRequest>,
    ) -> Result<Response<api::ListPodResourcesResponse>, Status> {
        let pod_resources = self.state.with(|s| list(s)).await.map_err(stopped)?;
        Ok(Response::new(api::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<api::AllocatableResourcesRequest>,
    ) -> Result<Response<api::AllocatableResourcesResponse>, Status> {
        let devices = self.state.with(|s| allocatable(s)).await.map_err(stopped)?;
        Ok(Response::new(api::AllocatableResourcesResponse {
            devices,
            ..api::AllocatableResourcesResponse::default()
        }))
    }

    async fn get(
        &self,
        request: Request<api::GetPodResourcesRequest>,
    ) -> Result<Response<api::GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let (name, namespace) = (r.pod_name.clone(), r.pod_namespace.clone());
        let found = self
            .state
            .with(move |s| {
                let uid = s
                    .active
                    .iter()
                    .find(|(_, p)| p.name == name && p.namespace == namespace)
                    .map(|(uid, _)| uid.clone())?;
                pod(s, &uid)
            })
            .await
            .map_err(stopped)?;
        match found {
            Some(pod) => Ok(Response::new(api::GetPodResourcesResponse {
                pod_resources: Some(pod),
            })),
            // kubelet's text, as a Go error (gRPC Unknown).
            None => Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            ))),
        }
    }
}

/// A running pod-resources server.
pub(crate) struct PodResourcesHandle {
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodResourcesHandle {
    /// Serves the API on `socket` (its folder is created, a stale socket removed).
    pub(crate) fn start(socket: &Path, state: StateHandle) -> std::io::Result<Self> {
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = Server::builder()
                .add_service(PodResourcesListerServer::new(Lister { state }))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop.await;
                })
                .await;
            if let Err(error) = served {
                warn!(%error, "pod-resources server failed");
            }
        });
        info!(socket = %socket.display(), "pod-resources server listening");
        Ok(Self {
            shutdown: Some(shutdown),
            task,
        })
    }

    /// Stops serving.
    pub(crate) async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for PodResourcesHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

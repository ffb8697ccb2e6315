//! The `DevicePlugin` gRPC service (kubelet device-plugin API v1beta1).
//! Holds no state of its own: ListAndWatch streams the inventory `watch`
//! and ends when the server drains; the other calls are one message to
//! `KubeletActor` each.

use std::collections::HashMap;
use std::pin::Pin;

use actix::Addr;
use futures::Stream;
use proto::deviceplugin::v1beta1 as api;
use proto::hami::container_contract::ContainerSlice;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::actors::health::Inventory;
use crate::actors::kubelet::{AllocateContainers, KubeletActor, PreferDevices, PreferenceRequest};
use crate::allocation::{AllocateError, PodFailure, device_ids, physical_uuid};
use crate::devices::Gpu;

/// The service; one per served socket.
#[derive(Debug, Clone)]
pub struct DevicePluginService {
    kubelet: Addr<KubeletActor>,
    inventory: watch::Receiver<Inventory>,
    drain: watch::Receiver<bool>,
}

impl DevicePluginService {
    /// A service asking `kubelet`, streaming `inventory`; its streams end
    /// when `drain` turns true.
    #[must_use]
    pub fn new(
        kubelet: Addr<KubeletActor>,
        inventory: watch::Receiver<Inventory>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        Self {
            kubelet,
            inventory,
            drain,
        }
    }

    /// Rejects device IDs that are not ours.
    fn check_ids<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> Result<(), Status> {
        let gpus = self.inventory.borrow();
        for id in ids {
            let uuid = physical_uuid(id);
            if uuid == id.as_str() || !gpus.iter().any(|g| g.uuid == uuid) {
                return Err(Status::invalid_argument(format!(
                    "device ID {id:?} is not advertised by this plugin"
                )));
            }
        }
        Ok(())
    }
}

/// The device list kubelet sees: `split_count` IDs per GPU, with health
/// and NUMA node.
#[must_use]
pub fn advertised_devices(gpus: &[Gpu]) -> api::ListAndWatchResponse {
    let devices = gpus
        .iter()
        .flat_map(|g| {
            let health = if g.healthy {
                api::HEALTHY
            } else {
                api::UNHEALTHY
            };
            device_ids(&g.uuid, g.split_count).map(move |id| api::Device {
                id,
                health: health.to_owned(),
                topology: Some(api::TopologyInfo {
                    nodes: vec![api::NumaNode {
                        id: i64::from(g.numa),
                    }],
                }),
            })
        })
        .collect();
    api::ListAndWatchResponse { devices }
}

/// The gRPC status for an Allocate error (the message names pod and reason).
#[must_use]
pub fn status_of(error: &AllocateError) -> Status {
    let message = error.to_string();
    match error {
        AllocateError::EmptyRequest => Status::invalid_argument(message),
        AllocateError::Cluster(_)
        | AllocateError::Pod {
            reason: PodFailure::Cluster(_) | PodFailure::GpuUnavailable(_),
            ..
        } => Status::unavailable(message),
        AllocateError::Pod {
            reason: PodFailure::Ledger { .. } | PodFailure::Mig(_),
            ..
        } => Status::resource_exhausted(message),
        AllocateError::NoPod { .. }
        | AllocateError::Ambiguous { .. }
        | AllocateError::Abandoned { .. }
        | AllocateError::Pod { .. } => Status::failed_precondition(message),
    }
}

fn container_response(slice: ContainerSlice) -> api::ContainerAllocateResponse {
    api::ContainerAllocateResponse {
        envs: slice.envs.into_iter().collect::<HashMap<_, _>>(),
        mounts: slice
            .mounts
            .into_iter()
            .map(|m| api::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        ..Default::default()
    }
}

fn mailbox_closed<E>(_: E) -> Status {
    Status::unavailable("the device plugin is shutting down")
}

type ListAndWatchStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ListAndWatchStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let state = (self.inventory.clone(), self.drain.clone(), true);
        let stream =
            futures::stream::unfold(state, |(mut inventory, mut drain, first)| async move {
                if !first {
                    tokio::select! {
                        changed = inventory.changed() => changed.ok()?,
                        _ = drain.wait_for(|d| *d) => return None,
                    }
                }
                let response = advertised_devices(&inventory.borrow_and_update());
                Some((Ok(response), (inventory, drain, false)))
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let requests = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size).map_err(|_| {
                    Status::invalid_argument(format!(
                        "negative allocation_size {}",
                        r.allocation_size
                    ))
                })?;
                Ok(PreferenceRequest {
                    available: r.available_device_i_ds,
                    must_include: r.must_include_device_i_ds,
                    size,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let picks = self
            .kubelet
            .send(PreferDevices { requests })
            .await
            .map_err(mailbox_closed)?
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: picks
                .into_iter()
                .map(|device_i_ds| api::ContainerPreferredAllocationResponse { device_i_ds })
                .collect(),
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests: Vec<Vec<String>> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| r.devices_ids)
            .collect();
        if requests.is_empty() || requests.iter().any(Vec::is_empty) {
            return Err(Status::invalid_argument(
                "Allocate needs at least one container request with at least one device ID",
            ));
        }
        self.check_ids(requests.iter().flatten())?;
        let slices = self
            .kubelet
            .send(AllocateContainers { requests })
            .await
            .map_err(mailbox_closed)?
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(api::AllocateResponse {
            container_responses: slices.into_iter().map(container_response).collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_is_advertised_split_count_times_with_health_and_numa() {
        let gpu = |uuid: &str, healthy, numa| Gpu {
            uuid: uuid.into(),
            index: 0,
            device_type: "NVIDIA-T4".into(),
            memory_mib: 1,
            cores: 100,
            split_count: 3,
            numa,
            healthy,
            mig_profiles: Vec::new(),
        };
        let list = advertised_devices(&[gpu("GPU-a", true, 0), gpu("GPU-b", false, 1)]);
        let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "GPU-a-0", "GPU-a-1", "GPU-a-2", "GPU-b-0", "GPU-b-1", "GPU-b-2"
            ]
        );
        assert_eq!(list.devices[0].health, "Healthy");
        assert_eq!(list.devices[5].health, "Unhealthy");
        assert_eq!(list.devices[5].topology.as_ref().unwrap().nodes[0].id, 1);
    }

    #[test]
    fn errors_map_to_codes_with_the_reason() {
        let s = status_of(&AllocateError::Ambiguous {
            node: "n".into(),
            devices: 1,
            pods: vec!["ns/a".into(), "ns/b".into()],
        });
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        assert!(s.message().contains("ns/a"));
        let s = status_of(&AllocateError::Pod {
            pod: "ns/a".into(),
            reason: PodFailure::Ledger {
                uuid: "GPU-a".into(),
                error: crate::ledger::LedgerError::NoSlot { slots: 2 },
            },
        });
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message().starts_with("pod ns/a: GPU GPU-a: all 2 slots"),
            "{}",
            s.message()
        );
    }
}

//! Device-plugin requests from the kubelet, as the tonic server decodes
//! them (prost), then the node-daemon's pure handling of their device IDs.
//! The first byte picks the message; the rest is its protobuf encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use node_daemon::allocation::{physical_uuid, prefer_devices};
use prost::Message;
use proto::deviceplugin::v1beta1 as api;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(request) = api::AllocateRequest::decode(bytes) {
                for container in &request.container_requests {
                    for id in &container.devices_ids {
                        assert!(id.starts_with(physical_uuid(id)));
                    }
                }
            }
        }
        1 => {
            if let Ok(request) = api::PreferredAllocationRequest::decode(bytes) {
                for r in request.container_requests {
                    let Ok(size) = usize::try_from(r.allocation_size) else {
                        continue;
                    };
                    let chosen: Vec<String> = r
                        .available_device_i_ds
                        .iter()
                        .map(|id| physical_uuid(id).to_owned())
                        .collect();
                    let picked = prefer_devices(
                        &chosen,
                        &r.available_device_i_ds,
                        &r.must_include_device_i_ds,
                        size,
                    );
                    assert!(picked.len() <= size, "{picked:?} exceeds {size}");
                    for id in &picked {
                        assert!(
                            r.available_device_i_ds.contains(id)
                                || r.must_include_device_i_ds.contains(id),
                            "{id} was neither available nor must-include"
                        );
                    }
                    // The kubelet asks for at least its must-include IDs; a
                    // smaller size is cut, not an error.
                    if size >= r.must_include_device_i_ds.len() {
                        for id in &r.must_include_device_i_ds {
                            assert!(picked.contains(id), "must-include {id} not picked");
                        }
                    }
                }
            }
        }
        2 => {
            let _ = api::PreStartContainerRequest::decode(bytes);
        }
        _ => {
            let _ = api::Empty::decode(bytes);
            let _ = api::RegisterRequest::decode(bytes);
        }
    }
});

//! The slice publisher: keeps the node's `ResourceSlice` equal to
//! [`super::slice::slice_update`] of the inventory. It watches the object
//! and the inventory and writes only when they disagree: a GPU turns
//! unhealthy and is withdrawn, or healthy again and returns; the kubelet
//! deleted the node's slices (it does at its start, and when the driver
//! stays unregistered) or someone else changed it. Never on a timer. The
//! generation only grows while the daemon runs, even across a deletion.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::resource::v1::ResourceSlice;
use proto::dra::slice_name;
use tokio::sync::watch;
use tracing::{info, warn};

use super::slice::slice_update;
use crate::actors::health::Inventory;
use crate::cluster::{Cluster, ClusterError};

/// Pause before retrying a failed write.
const RETRY: Duration = Duration::from_secs(2);

/// Publishes until `shutdown` turns true.
pub async fn publish(
    cluster: Arc<dyn Cluster>,
    node: String,
    mut inventory: watch::Receiver<Inventory>,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = slice_name(&node);
    let mut changes = cluster.resource_slice_changes(&name);
    // What the API holds, as last seen or written; `None` until the watch
    // has said.
    let mut current: Option<Option<ResourceSlice>> = None;
    let mut last_generation = 0;
    let mut retry = false;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            change = changes.next() => match change {
                Some(slice) => current = Some(slice),
                None => {
                    warn!("the ResourceSlice watch ended; no longer publishing");
                    return;
                }
            },
            changed = inventory.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(RETRY), if retry => {}
        }
        retry = false;
        let Some(held) = &current else { continue };
        let gpus = inventory.borrow_and_update().clone();
        let Some(mut update) = slice_update(&node, &gpus, held.as_ref()) else {
            continue;
        };
        if update.spec.pool.generation <= last_generation {
            update.spec.pool.generation = last_generation + 1;
        }
        let generation = update.spec.pool.generation;
        let devices = update.spec.devices.as_ref().map_or(0, Vec::len);
        let replace = update.metadata.resource_version.is_some();
        match cluster.write_resource_slice(update).await {
            Ok(stored) => {
                info!(slice = %name, generation, devices, replace, "ResourceSlice written");
                last_generation = generation;
                current = Some(Some(stored));
            }
            Err(ClusterError::Conflict(what)) => {
                // The watch brings the newer object; try again then (or
                // after a pause, should it not come).
                warn!(%what, "ResourceSlice changed meanwhile; waiting for it");
                retry = true;
            }
            Err(error) => {
                warn!(%error, "cannot write the ResourceSlice; retrying");
                retry = true;
            }
        }
    }
}

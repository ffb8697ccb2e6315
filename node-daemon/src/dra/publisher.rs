//! The slice publisher: keeps the node's `ResourceSlice` equal to
//! [`super::slice::slice_update`] of the inventory, writing only when the
//! inventory changes what it says (a GPU turns unhealthy and is withdrawn,
//! or healthy again and returns) — never on a timer. A write that conflicts
//! (someone else changed the object) re-reads it and tries again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use proto::dra::slice_name;
use tokio::sync::watch;
use tracing::{info, warn};

use super::slice::slice_update;
use crate::actors::health::Inventory;
use crate::cluster::{Cluster, ClusterError};

/// Pause before retrying a failed read or write.
const RETRY: Duration = Duration::from_secs(2);

/// Publishes until `shutdown` turns true.
pub async fn publish(
    cluster: Arc<dyn Cluster>,
    node: String,
    mut inventory: watch::Receiver<Inventory>,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = slice_name(&node);
    // What the API holds, as last read or written; `None` until read.
    let mut current: Option<Option<ResourceSlice>> = None;
    loop {
        let mut settled = true;
        if current.is_none() {
            match cluster.resource_slice(&name).await {
                Ok(found) => current = Some(found),
                Err(error) => {
                    warn!(%error, "cannot read the ResourceSlice; retrying");
                    settled = false;
                }
            }
        }
        if let Some(held) = &current {
            let gpus = inventory.borrow_and_update().clone();
            if let Some(update) = slice_update(&node, &gpus, held.as_ref()) {
                let generation = update.spec.pool.generation;
                let devices = update.spec.devices.as_ref().map_or(0, Vec::len);
                match cluster.write_resource_slice(update).await {
                    Ok(stored) => {
                        info!(slice = %name, generation, devices, "ResourceSlice written");
                        current = Some(Some(stored));
                    }
                    Err(ClusterError::Conflict(what)) => {
                        warn!(%what, "ResourceSlice changed meanwhile; reading it again");
                        current = None;
                        continue;
                    }
                    Err(error) => {
                        warn!(%error, "cannot write the ResourceSlice; retrying");
                        current = None;
                        settled = false;
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            changed = inventory.changed(), if settled => if changed.is_err() { return },
            () = tokio::time::sleep(RETRY), if !settled => {}
        }
    }
}

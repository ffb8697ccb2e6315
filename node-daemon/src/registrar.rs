//! The registrar: publishes the node's GPUs as `hami.io/node-nvidia-register`
//! (HAMi's v2.8+ JSON) whenever the device list or a GPU's health changes —
//! never on a timer — and only when the encoded value differs from what it
//! last wrote; with `enableTopologyScore`, it first writes the GPUs' pair
//! scores (`hami.io/node-nvidia-score`) once. It never touches
//! `hami.io/node-handshake`, which is the scheduler's to write.

use std::sync::Arc;
use std::time::Duration;

use proto::hami::keys;
use proto::hami::register::encode_json;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::actors::health::Inventory;
use crate::cluster::Cluster;

/// Pause before retrying a failed write.
const RETRY: Duration = Duration::from_secs(5);

/// The register value for the inventory.
///
/// # Errors
/// The encoder's error when a value overflows HAMi's `int32` fields.
pub fn register_value(gpus: &Inventory) -> Result<String, proto::hami::register::RegisterError> {
    let devices: Vec<_> = gpus.iter().map(crate::devices::Gpu::node_device).collect();
    encode_json(&devices)
}

/// Publishes until `shutdown` turns true. `pair_scores`, when given, is
/// written once first (`hami.io/node-nvidia-score`: the links between GPUs
/// do not change while the daemon runs), so a scheduler that reads the
/// register already has the scores.
pub async fn publish(
    cluster: Arc<dyn Cluster>,
    node: String,
    pair_scores: Option<String>,
    mut inventory: watch::Receiver<Inventory>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Some(scores) = pair_scores {
        loop {
            match cluster
                .set_node_annotation(&node, keys::NODE_NVIDIA_SCORE, scores.clone())
                .await
            {
                Ok(()) => {
                    info!(node = %node, "node pair score annotation written");
                    break;
                }
                Err(error) => {
                    warn!(%error, "cannot write the node pair score annotation; retrying")
                }
            }
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }
    let mut written: Option<String> = None;
    loop {
        let value = register_value(&inventory.borrow_and_update());
        let mut wait_for_change = true;
        match value {
            Ok(value) if written.as_ref() != Some(&value) => {
                match cluster
                    .set_node_annotation(&node, keys::NODE_NVIDIA_REGISTER, value.clone())
                    .await
                {
                    Ok(()) => {
                        info!(node = %node, "node register annotation written");
                        written = Some(value);
                    }
                    Err(error) => {
                        warn!(%error, "cannot write the node register annotation; retrying");
                        wait_for_change = false;
                    }
                }
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "cannot encode the node register annotation"),
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            changed = inventory.changed(), if wait_for_change => if changed.is_err() { return },
            () = tokio::time::sleep(RETRY), if !wait_for_change => {}
        }
    }
}

//! `HealthActor`: folds the device source's health events into the
//! inventory, the `watch` snapshot that ListAndWatch streams from and the
//! registrar publishes. A GPU that turns healthy again is advertised
//! healthy again (HAMi never recovers a device; we do).

use std::sync::Arc;

use actix::{Actor, AsyncContext as _, Context, StreamHandler};
use futures::stream::BoxStream;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::devices::{Gpu, HealthEvent};

/// The node's GPUs with their current health, shared read-only.
pub type Inventory = Arc<Vec<Gpu>>;

/// Owns the inventory's sender.
#[derive(Debug)]
pub struct HealthActor {
    inventory: watch::Sender<Inventory>,
}

impl HealthActor {
    /// Starts the actor on `events`; it updates `inventory` until the
    /// events end.
    pub fn start_on(
        inventory: watch::Sender<Inventory>,
        events: BoxStream<'static, HealthEvent>,
    ) -> actix::Addr<Self> {
        Self::create(|ctx| {
            ctx.add_stream(events);
            Self { inventory }
        })
    }
}

impl Actor for HealthActor {
    type Context = Context<Self>;
}

/// Applies `event` to `gpus`; returns whether anything changed.
fn apply(gpus: &mut Inventory, event: &HealthEvent) -> bool {
    let Some(i) = gpus.iter().position(|g| g.uuid == event.uuid) else {
        return false;
    };
    if gpus[i].healthy == event.healthy {
        return false;
    }
    Arc::make_mut(gpus)[i].healthy = event.healthy;
    true
}

impl StreamHandler<HealthEvent> for HealthActor {
    fn handle(&mut self, event: HealthEvent, _: &mut Self::Context) {
        let changed = self.inventory.send_if_modified(|gpus| apply(gpus, &event));
        if changed {
            if event.healthy {
                info!(gpu = %event.uuid, "GPU healthy again");
            } else {
                warn!(gpu = %event.uuid, "GPU unhealthy");
            }
        }
    }

    fn finished(&mut self, _: &mut Self::Context) {
        warn!("health events ended; health is no longer watched");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str) -> Gpu {
        Gpu {
            uuid: uuid.into(),
            index: 0,
            device_type: "NVIDIA-T4".into(),
            memory_mib: 1,
            cores: 100,
            split_count: 2,
            numa: 0,
            healthy: true,
            mig_profiles: Vec::new(),
        }
    }

    #[test]
    fn only_real_changes_modify_the_inventory() {
        let mut inv: Inventory = Arc::new(vec![gpu("a"), gpu("b")]);
        let down = HealthEvent {
            uuid: "b".into(),
            healthy: false,
        };
        assert!(apply(&mut inv, &down));
        assert!(!inv[1].healthy && inv[0].healthy);
        assert!(!apply(&mut inv, &down), "same health again is no change");
        assert!(!apply(
            &mut inv,
            &HealthEvent {
                uuid: "zz".into(),
                healthy: false
            }
        ));
        assert!(apply(
            &mut inv,
            &HealthEvent {
                uuid: "b".into(),
                healthy: true
            }
        ));
        assert!(inv[1].healthy);
    }
}

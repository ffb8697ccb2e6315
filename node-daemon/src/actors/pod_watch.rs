//! `PodWatch`: frees the slices of pods that leave the node (deleted or
//! finished), from the cluster's pod watch, so the ledgers and `/metrics`
//! follow the node without waiting for the next Allocate (which also
//! reconciles against its own pod list).

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::{Actor, ActorContext as _, Addr, AsyncContext as _, Context, StreamHandler};
use futures::stream::BoxStream;
use tracing::warn;

use super::gpu::{GpuActor, ReleasePod, ReleasePodsExcept};
use crate::cluster::PodChange;

/// Forwards pod departures to every GPU actor.
#[derive(Debug)]
pub struct PodWatch {
    gpus: Arc<BTreeMap<String, Addr<GpuActor>>>,
}

impl PodWatch {
    /// Starts the actor on `changes`.
    pub fn start_on(
        gpus: Arc<BTreeMap<String, Addr<GpuActor>>>,
        changes: BoxStream<'static, PodChange>,
    ) -> Addr<Self> {
        Self::create(|ctx| {
            ctx.add_stream(changes);
            Self { gpus }
        })
    }
}

impl Actor for PodWatch {
    type Context = Context<Self>;
}

impl StreamHandler<PodChange> for PodWatch {
    fn handle(&mut self, change: PodChange, _: &mut Self::Context) {
        match change {
            PodChange::Gone(pod_uid) => {
                for gpu in self.gpus.values() {
                    gpu.do_send(ReleasePod {
                        pod_uid: pod_uid.clone(),
                    });
                }
            }
            PodChange::Live(live) => {
                let live = Arc::new(live);
                for gpu in self.gpus.values() {
                    gpu.do_send(ReleasePodsExcept {
                        live: Arc::clone(&live),
                    });
                }
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("pod watch ended; slices are freed at the next Allocate only");
        ctx.stop();
    }
}

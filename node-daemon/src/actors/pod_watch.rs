//! `PodWatch`: frees the slices of pods that leave the node (deleted or
//! finished), from the cluster's pod watch, so the ledgers and `/metrics`
//! follow the node without waiting for the next Allocate (which also
//! reconciles against its own pod list). A relist's snapshot carries the
//! epoch it was taken at, so one that arrives late never frees a slice
//! committed after it.

use actix::{Actor, ActorContext as _, Addr, AsyncContext as _, Context, StreamHandler};
use futures::stream::BoxStream;
use tracing::warn;

use super::pool::GpuPool;
use crate::cluster::PodChange;

/// Forwards pod departures to the GPU pool.
#[derive(Debug)]
pub struct PodWatch {
    pool: GpuPool,
}

impl PodWatch {
    /// Starts the actor on `changes`.
    pub fn start_on(pool: GpuPool, changes: BoxStream<'static, PodChange>) -> Addr<Self> {
        Self::create(|ctx| {
            ctx.add_stream(changes);
            Self { pool }
        })
    }
}

impl Actor for PodWatch {
    type Context = Context<Self>;
}

impl StreamHandler<PodChange> for PodWatch {
    fn handle(&mut self, change: PodChange, _: &mut Self::Context) {
        let pool = self.pool.clone();
        match change {
            PodChange::Gone(pod_uid) => {
                actix::spawn(async move { pool.release_pod(pod_uid).await });
            }
            PodChange::Live(snapshot) => {
                actix::spawn(async move { pool.release_except(snapshot).await });
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        warn!("pod watch ended; slices are freed at the next Allocate only");
        ctx.stop();
    }
}

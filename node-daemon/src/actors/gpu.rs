//! `GpuActor`: the only owner of one GPU's [`SliceLedger`]. Every handler
//! makes exactly one ledger call, so the ledger's invariants (no
//! over-commit) hold whatever the interleaving of messages.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, Supervised};
use tracing::{debug, info};

use crate::ledger::{
    ClaimError, ClaimSlice, Committed, Epoch, LedgerError, LiveSnapshot, Slice, SliceKey,
    SliceLedger,
};

/// Holds a slice for a container (a verb: the GPU commits or refuses).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Committed, LedgerError>")]
pub struct CommitSlice {
    /// Who holds it.
    pub key: SliceKey,
    /// What is held.
    pub slice: Slice,
    /// The commit's stamp from the node's commit clock.
    pub at: Epoch,
}

/// Frees a container's slice; answers what it held.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<Slice>")]
pub struct ReleaseSlice {
    /// Who held it.
    pub key: SliceKey,
}

/// Frees every slice of one pod (it was deleted or finished); answers how many.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct ReleasePod {
    /// The pod's UID.
    pub pod_uid: String,
}

/// Frees the slices of every pod absent from a liveness snapshot that were
/// committed before it was taken; answers how many.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct ReleasePodsExcept {
    /// The pods alive on the node as of one list, with its epoch.
    pub snapshot: Arc<LiveSnapshot>,
}

/// Holds a slice for a DRA claim (a verb: the GPU commits or refuses).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Committed, ClaimError>")]
pub struct CommitClaim {
    /// The claim's UID.
    pub claim_uid: String,
    /// What is held.
    pub slice: ClaimSlice,
}

/// Frees a DRA claim's slice; answers what it held.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Option<ClaimSlice>")]
pub struct ReleaseClaim {
    /// The claim's UID.
    pub claim_uid: String,
}

/// A copy of the ledger, for metrics and tests.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "SliceLedger")]
pub struct GetLedger;

/// One GPU's ledger as an actor.
#[derive(Debug)]
pub struct GpuActor {
    uuid: String,
    ledger: SliceLedger,
}

impl GpuActor {
    /// The actor of GPU `uuid` with `ledger` (already rebuilt).
    #[must_use]
    pub fn new(uuid: String, ledger: SliceLedger) -> Self {
        Self { uuid, ledger }
    }
}

impl Actor for GpuActor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        let usage = self.ledger.usage();
        info!(gpu = %self.uuid, slots = usage.slots, memory_mib = usage.memory_mib, cores = usage.cores, "GPU actor started");
    }
}

/// Restarted in place with its ledger: the ledger is the truth and was
/// never handed out, so nothing needs rebuilding.
impl Supervised for GpuActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        info!(gpu = %self.uuid, "GPU actor restarting");
    }
}

impl Handler<CommitSlice> for GpuActor {
    type Result = Result<Committed, LedgerError>;

    fn handle(&mut self, msg: CommitSlice, _: &mut Self::Context) -> Self::Result {
        let out = self.ledger.commit(msg.key, msg.slice, msg.at);
        debug!(gpu = %self.uuid, ?out, "commit");
        out
    }
}

impl Handler<ReleaseSlice> for GpuActor {
    type Result = Option<Slice>;

    fn handle(&mut self, msg: ReleaseSlice, _: &mut Self::Context) -> Self::Result {
        self.ledger.release(&msg.key)
    }
}

impl Handler<CommitClaim> for GpuActor {
    type Result = Result<Committed, ClaimError>;

    fn handle(&mut self, msg: CommitClaim, _: &mut Self::Context) -> Self::Result {
        let out = self.ledger.commit_claim(&msg.claim_uid, msg.slice);
        debug!(gpu = %self.uuid, claim = %msg.claim_uid, ?out, "commit claim");
        out
    }
}

impl Handler<ReleaseClaim> for GpuActor {
    type Result = Option<ClaimSlice>;

    fn handle(&mut self, msg: ReleaseClaim, _: &mut Self::Context) -> Self::Result {
        self.ledger.release_claim(&msg.claim_uid)
    }
}

impl Handler<ReleasePodsExcept> for GpuActor {
    type Result = usize;

    fn handle(&mut self, msg: ReleasePodsExcept, _: &mut Self::Context) -> Self::Result {
        let freed = self.ledger.release_pods_except(&msg.snapshot);
        if freed > 0 {
            info!(gpu = %self.uuid, freed, "released slices of pods gone from the node");
        }
        freed
    }
}

impl Handler<ReleasePod> for GpuActor {
    type Result = usize;

    fn handle(&mut self, msg: ReleasePod, _: &mut Self::Context) -> Self::Result {
        let freed = self.ledger.release_pod(&msg.pod_uid);
        if freed > 0 {
            info!(gpu = %self.uuid, pod_uid = %msg.pod_uid, freed, "released the slices of a pod gone from the node");
        }
        freed
    }
}

impl Handler<GetLedger> for GpuActor {
    type Result = actix::MessageResult<GetLedger>;

    fn handle(&mut self, _: GetLedger, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult(self.ledger.clone())
    }
}

#[cfg(test)]
mod tests {
    use actix::Supervisor;

    use super::*;
    use crate::ledger::Capacity;

    #[actix::test]
    async fn concurrent_commits_never_exceed_the_slots() {
        let ledger = SliceLedger::new(Capacity {
            slots: 4,
            memory_mib: 10_000,
            cores: 100,
        });
        let gpu = Supervisor::start(|_| GpuActor::new("GPU-a".into(), ledger));
        let sends: Vec<_> = (0..20)
            .map(|i| {
                gpu.send(CommitSlice {
                    key: SliceKey {
                        pod_uid: format!("p{i}"),
                        container: 0,
                    },
                    slice: Slice {
                        memory_mib: 100,
                        cores: 5,
                        init: false,
                    },
                    at: Epoch(1),
                })
            })
            .collect();
        let results = futures::future::join_all(sends).await;
        let granted = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
        assert_eq!(granted, 4);
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Ok(Ok(_)) | Ok(Err(LedgerError::NoSlot { slots: 4 }))))
        );
        let ledger = gpu.send(GetLedger).await.unwrap();
        assert_eq!(ledger.usage().slots, 4);
        let snapshot = Arc::new(LiveSnapshot {
            live: ["p0".to_owned()].into_iter().collect(),
            taken_at: Epoch(1),
        });
        let freed = gpu.send(ReleasePodsExcept { snapshot }).await.unwrap();
        assert_eq!(freed, 3);
    }
}

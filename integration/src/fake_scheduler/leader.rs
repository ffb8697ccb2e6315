//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` runs it for kube-scheduler: try to acquire every
//! `retryPeriod`; a foreign holder counts as expired `leaseDuration` after
//! the record was last seen to change (local clock, no skew); the leader
//! renews every `retryPeriod` and steps down when it could not renew for
//! `renewDeadline`; on shutdown the Lease is released (empty holder,
//! 1 s duration). Times are `MicroTime` (RFC 3339 with microseconds).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::config::LeaderElectionConfig;

/// What the elector last saw of the Lease record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    holder: String,
    renew_time: Option<String>,
    duration_secs: i32,
}

/// The elector's state between attempts.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Option<(Observed, Instant)>,
}

/// Outcome of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease (acquired or renewed).
    Held,
    /// Someone else holds an unexpired Lease, or we lost a race.
    NotHeld,
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn observed_of(lease: &Lease) -> Observed {
    let spec = lease.spec.clone().unwrap_or_default();
    Observed {
        holder: spec.holder_identity.unwrap_or_default(),
        renew_time: spec
            .renew_time
            .and_then(|t| serde_json::to_value(t).ok())
            .and_then(|v| v.as_str().map(str::to_string)),
        duration_secs: spec.lease_duration_seconds.unwrap_or(0),
    }
}

impl Elector {
    /// An elector for `config` using `client`.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    fn our_spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = now_micro();
        let ours = previous
            .and_then(|p| p.holder_identity.as_deref())
            .is_some_and(|h| h == self.config.identity);
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.duration_secs()),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(match (ours, previous) {
                (true, _) | (false, None) => transitions,
                (false, Some(_)) => transitions + 1,
            }),
            ..previous.cloned().unwrap_or_default()
        }
    }

    /// One `tryAcquireOrRenew`.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let existing = self.api.get_opt(&self.config.lease_name).await?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.our_spec(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((observed_of(&created), Instant::now()));
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::NotHeld),
                Err(e) => Err(e),
            };
        };
        let seen = observed_of(&lease);
        let now = Instant::now();
        let changed = self.observed.as_ref().is_none_or(|(o, _)| *o != seen);
        if changed {
            self.observed = Some((seen.clone(), now));
        }
        let observed_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
        let expires = observed_at
            + Duration::from_secs(u64::try_from(seen.duration_secs.max(0)).unwrap_or(0));
        let foreign = !seen.holder.is_empty() && seen.holder != self.config.identity;
        if foreign && expires > now {
            return Ok(Attempt::NotHeld);
        }
        lease.spec = Some(self.our_spec(lease.spec.as_ref()));
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observed = Some((observed_of(&updated), Instant::now()));
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::NotHeld),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if we hold it (client-go `release`).
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = now_micro();
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..spec
        });
        self.api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// Runs the election until `shutdown` turns true, publishing leadership on
/// `leader` and counting renewals through `on_renew`.
pub async fn run(
    mut elector: Elector,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
    on_renew: impl Fn(bool),
) {
    let retry = elector.config.retry_period;
    let renew_deadline = elector.config.renew_deadline;
    let mut last_renew: Option<Instant> = None;
    loop {
        let attempt = elector.try_acquire_or_renew().await;
        let held = *leader.borrow();
        match &attempt {
            Ok(Attempt::Held) => {
                last_renew = Some(Instant::now());
                if !held {
                    info!(identity = %elector.config.identity, lease = %elector.config.lease_name, "became leader");
                    leader.send_replace(true);
                }
                on_renew(true);
            }
            Ok(Attempt::NotHeld) => {
                debug!("lease held by another scheduler");
                on_renew(false);
            }
            Err(e) => {
                warn!(error = %e, "leader election attempt failed");
                on_renew(false);
            }
        }
        if held && !matches!(attempt, Ok(Attempt::Held)) {
            let stale = last_renew.is_none_or(|t| t.elapsed() >= renew_deadline);
            if stale || matches!(attempt, Ok(Attempt::NotHeld)) {
                warn!("lost leadership");
                leader.send_replace(false);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = stopped(&mut shutdown) => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        if let Err(e) = elector.release().await {
            warn!(error = %e, "cannot release the lease");
        }
    }
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

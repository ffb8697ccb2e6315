//! A kube-scheduler stand-in with one HTTP extender, for end-to-end tests
//! of the scheduler extender without a cluster.
//!
//! ```text
//!  pods/nodes watches ──► loop (queue: active FIFO, backoff 1 s → 10 s,
//!  (kube-rs watcher)        unschedulable moved on cluster events)
//!                             │ per pod, while holding the Lease
//!                             ▼
//!   fit (cpu, memory, pods, extended minus ignoredByScheduler, taints)
//!     │ pod requests a managed resource?
//!     ├─ yes ─► POST <urlPrefix>/<filterVerb> {Pod, Nodes:null, NodeNames}
//!     │         POST <urlPrefix>/<bindVerb>   {PodName, PodNamespace, PodUID, Node}
//!     └─ no ──► LeastAllocated pick, pods/binding by the scheduler
//!   failure ─► Event FailedScheduling + PodScheduled=False + requeue
//! ```
//!
//! Owns: the handle ([`FakeScheduler::start`], [`FakeScheduler::shutdown`]),
//! its counters ([`Stats`]) and error type. The loop is in [`scheduler`],
//! the plugins in [`fit`], what each node holds in [`usage`], the queue in [`queue`], the HTTP client in
//! [`extender`], the wire format in [`wire`], the Lease in [`leader`].

pub mod config;
pub mod extender;
pub mod fit;
pub mod leader;
pub mod queue;
pub mod scheduler;
pub mod usage;
pub mod wire;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{
    Backoff, ExtenderConfig, LeaderElectionConfig, ManagedResource, SchedulerConfig, SchedulerFile,
    TlsConfig,
};

/// Errors of starting or waiting on the fake scheduler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The extender client could not be built.
    #[error(transparent)]
    Client(#[from] extender::ClientError),
    /// A condition on the counters was not met in time.
    #[error("condition not met within {0:?}; last stats: {1:?}")]
    Timeout(Duration, Box<Stats>),
}

/// Counters of a running fake scheduler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Holding the Lease (always true without leader election).
    pub leader: bool,
    /// The node and pod caches finished their first list.
    pub synced: bool,
    /// Each node in the node cache and its `status.allocatable` in
    /// milli-units, as the scheduler sees them now (what it can place
    /// pods on; kube-scheduler's `scheduler_cache_size{type="nodes"}`
    /// counts the same cache).
    pub node_allocatable: BTreeMap<String, fit::Resources>,
    /// Lease acquire/renew attempts (successful or not).
    pub lease_attempts: u64,
    /// Successful Lease acquisitions and renewals.
    pub lease_renewals: u64,
    /// Scheduling attempts (pods popped from the queue).
    pub attempts: u64,
    /// Pods bound (by the extender or by the scheduler).
    pub scheduled: u64,
    /// Attempts ending with no fitting node (reason `Unschedulable`).
    pub unschedulable: u64,
    /// Attempts ending with an error (reason `SchedulerError`).
    pub errors: u64,
    /// `POST <filterVerb>` calls.
    pub filter_calls: u64,
    /// Filter calls that failed (transport, status, timeout, `Error`).
    pub filter_errors: u64,
    /// `POST <bindVerb>` calls.
    pub bind_calls: u64,
    /// Bind calls that failed.
    pub bind_errors: u64,
    /// Pods bound by the scheduler itself through `pods/binding`.
    pub self_binds: u64,
    /// The last `FailedScheduling` message.
    pub last_failure: Option<String>,
}

/// A running fake scheduler.
#[derive(Debug)]
pub struct FakeScheduler {
    identity: Option<String>,
    stats: watch::Receiver<Stats>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl FakeScheduler {
    /// Validates `config`, then starts the Lease elector (if configured) and
    /// the scheduling loop. Must be called inside a tokio runtime.
    pub async fn start(client: kube::Client, config: SchedulerConfig) -> Result<Self, Error> {
        config.validate()?;
        let extender = config
            .extender
            .clone()
            .map(extender::Extender::new)
            .transpose()?;
        let (stats_tx, stats_rx) = watch::channel(Stats::default());
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let (leader_tx, leader_rx) = watch::channel(config.leader_election.is_none());
        let identity = config.leader_election.as_ref().map(|l| l.identity.clone());
        if let Some(le) = config.leader_election.clone() {
            let elector = leader::Elector::new(client.clone(), le);
            let stats = stats_tx.clone();
            let shutdown = shutdown_rx.clone();
            let leader_tx_for_task = leader_tx.clone();
            tasks.push(tokio::spawn(async move {
                leader::run(elector, leader_tx_for_task, shutdown, move |held| {
                    stats.send_modify(|s| {
                        s.lease_attempts += 1;
                        if held {
                            s.lease_renewals += 1;
                        }
                    });
                })
                .await;
            }));
        } else {
            stats_tx.send_modify(|s| s.leader = true);
        }
        let state = scheduler::Scheduler::new(client, config, extender, stats_tx);
        tasks.push(tokio::spawn(state.run(leader_rx, leader_tx, shutdown_rx)));
        Ok(Self {
            identity,
            stats: stats_rx,
            shutdown: shutdown_tx,
            tasks,
        })
    }

    /// The Lease holder identity (`<hostname>_<uuid>`), if electing.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        self.stats.borrow().clone()
    }

    /// Waits until `condition` holds on the counters, or fails after
    /// `deadline`. Woken on every counter change.
    pub async fn wait_for(
        &self,
        deadline: Duration,
        condition: impl Fn(&Stats) -> bool,
    ) -> Result<Stats, Error> {
        let mut rx = self.stats.clone();
        match tokio::time::timeout(deadline, rx.wait_for(|s| condition(s))).await {
            Ok(Ok(stats)) => Ok(stats.clone()),
            _ => Err(Error::Timeout(deadline, Box::new(self.stats()))),
        }
    }

    /// Stops scheduling, releases the Lease and waits for the tasks.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

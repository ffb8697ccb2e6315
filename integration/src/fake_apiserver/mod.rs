//! A faithful in-memory subset of kube-apiserver over real HTTP on
//! loopback, for kube-rs clients and the real kubectl.
//!
//! ```text
//!  kube::Client / kubectl / curl
//!            │ HTTP/1.1 (JSON, chunked watch streams)
//!            ▼
//!   actix-web ── http::dispatch ── control (faults, counters, log)
//!                     │
//!                     ▼
//!                store::Store ── history + broadcast ──► open watches
//! ```
//!
//! Owns: the server lifecycle (start, kubeconfig, client, shutdown) and the
//! programmatic test handle (faults, watch cutting, compaction, counters).
//! Object semantics live in [`store`], wire details in [`http`].

pub mod admission;
pub mod control;
pub mod http;
pub mod objects;
pub mod patch;
pub mod resources;
pub mod selector;
pub mod status;
pub mod store;
pub mod table;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpServer};
use tokio::task::JoinHandle;
use tracing::info;

pub use control::{FaultSpec, RequestRecord, Stats};
pub use resources::ResourceDef;
pub use status::ApiError;
pub use store::Store;

use http::Shared;

/// Errors of starting or using the fake apiserver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The requested address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server bound no address.
    #[error("the server reported no bound address")]
    NoAddress,
    /// Writing the kubeconfig failed.
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Target path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Building a kube client failed.
    #[error("cannot build a kube client: {0}")]
    Client(#[from] kube::Error),
    /// kube-rs rejected the generated kubeconfig.
    #[error("kubeconfig rejected by kube-rs: {0}")]
    KubeconfigRejected(String),
    /// A condition was not met before the deadline.
    #[error("condition not met within {0:?}; last stats: {1:?}")]
    Timeout(Duration, Box<Stats>),
    /// The store lock is poisoned.
    #[error("store unavailable: {0}")]
    Store(#[from] ApiError),
}

/// Tunables of a fake apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many change events are kept for watch replay; a watch from an
    /// older resourceVersion gets 410 Expired.
    pub history_limit: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// actix worker threads.
    pub workers: usize,
    /// Delete bound pods gracefully (`deletionTimestamp` first, removed by
    /// the kubelet's grace-0 delete), see [`Store::set_graceful_pod_deletion`].
    pub graceful_pod_deletion: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(5),
            workers: 2,
            graceful_pod_deletion: false,
        }
    }
}

/// A running fake apiserver. Prefer [`FakeApiServer::shutdown`]; dropping
/// it stops the server without waiting.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    handle: actix_web::dev::ServerHandle,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl FakeApiServer {
    /// Starts a server with default [`Options`] on `listen` (port 0 picks a
    /// free port). Must be called inside a tokio runtime.
    pub async fn start(listen: SocketAddr) -> Result<Self, Error> {
        Self::start_with(listen, Options::default()).await
    }

    /// Starts a server with `options`.
    pub async fn start_with(listen: SocketAddr, options: Options) -> Result<Self, Error> {
        let mut store = Store::new(options.history_limit);
        store.set_graceful_pod_deletion(options.graceful_pod_deletion);
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            control: control::Control::new(),
            bookmark_interval: options.bookmark_interval,
            webhooks: std::sync::Mutex::new(Vec::new()),
        });
        let data = http::shared_data(Arc::clone(&shared));
        let server =
            HttpServer::new(move || App::new().app_data(data.clone()).configure(http::configure))
                .workers(options.workers.max(1))
                .shutdown_timeout(1)
                .disable_signals()
                .bind(listen)
                .map_err(|source| Error::Bind {
                    addr: listen,
                    source,
                })?;
        let addr = server.addrs().first().copied().ok_or(Error::NoAddress)?;
        let server = server.run();
        let handle = server.handle();
        let task = tokio::spawn(server);
        info!(%addr, "fake apiserver listening");
        Ok(Self {
            addr,
            shared,
            handle,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (context `fake`, namespace `default`) that kube-rs and
    /// kubectl both accept.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::Kubeconfig {
            path: path.display().to_string(),
            source,
        })
    }

    /// Registers a mutating admission webhook for pod CREATEs, as a
    /// `MutatingWebhookConfiguration` would; webhooks run in the order added.
    ///
    /// # Errors
    /// The CA bundle holds no usable certificate.
    pub fn add_mutating_webhook(&self, hook: admission::MutatingWebhook) -> Result<(), String> {
        let caller = admission::WebhookCaller::new(hook)?;
        self.shared
            .webhooks
            .lock()
            .map_err(|_| "webhook list lock poisoned".to_owned())?
            .push(caller);
        Ok(())
    }

    /// A kube client for this server, built from [`Self::kubeconfig_yaml`]
    /// the way a binary given `--kubeconfig` would (namespace `default`).
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .map_err(|e| Error::KubeconfigRejected(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| Error::KubeconfigRejected(e.to_string()))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Makes the next `spec.count` matching requests fail or wait.
    pub fn inject(&self, spec: FaultSpec) {
        self.shared.control.add_fault(spec);
    }

    /// Removes every pending fault.
    pub fn clear_faults(&self) {
        self.shared.control.clear_faults();
    }

    /// Ends every open watch stream.
    pub fn cut_watches(&self) {
        self.shared.control.cut_watches();
    }

    /// Drops the retained watch history: watches from any older
    /// resourceVersion are answered with a 410 ERROR event.
    pub fn compact(&self) -> Result<(), Error> {
        Ok(self.shared.with_store(Store::compact)?)
    }

    /// Direct access to the store, e.g. to seed objects or read one back.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> Result<R, Error> {
        Ok(self.shared.with_store(f)?)
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        self.shared.control.stats()
    }

    /// Served requests, oldest first (bounded).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.control.requests()
    }

    /// Waits until `condition` holds on the counters, or fails after
    /// `deadline`. Event-driven: woken on every counter change.
    pub async fn wait_for(
        &self,
        deadline: Duration,
        condition: impl Fn(&Stats) -> bool,
    ) -> Result<Stats, Error> {
        let mut signal = self.shared.control.stats_signal();
        let waited = tokio::time::timeout(deadline, signal.wait_for(|s| condition(s))).await;
        match waited {
            Ok(Ok(stats)) => Ok(stats.clone()),
            _ => Err(Error::Timeout(deadline, Box::new(self.stats()))),
        }
    }

    /// Waits until `condition` holds on the request log, or fails after
    /// `deadline`. A request is logged after it is served, so a client that
    /// saw a write through a watch may look before the writer's request is
    /// in the log; this waits for it. Event-driven: every logged request
    /// wakes it.
    pub async fn wait_for_requests(
        &self,
        deadline: Duration,
        condition: impl Fn(&[RequestRecord]) -> bool,
    ) -> Result<Vec<RequestRecord>, Error> {
        let mut signal = self.shared.control.stats_signal();
        let holds = |_: &Stats| condition(&self.requests());
        match tokio::time::timeout(deadline, signal.wait_for(holds)).await {
            Ok(Ok(_)) => Ok(self.requests()),
            _ => Err(Error::Timeout(deadline, Box::new(self.stats()))),
        }
    }

    /// Cuts open watches and stops the server.
    pub async fn shutdown(mut self) {
        self.shared.control.cut_watches();
        self.handle.stop(true).await;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeApiServer {
    /// A server dropped without [`FakeApiServer::shutdown`] still stops:
    /// watches are cut and the stop command is sent (not awaited).
    fn drop(&mut self) {
        if self.task.is_some() {
            self.shared.control.cut_watches();
            // The command is sent when `stop` is called; the returned
            // future only waits for completion.
            drop(self.handle.stop(false));
        }
    }
}

/// The kubeconfig text for a server at `url`.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: default
current-context: fake
users:
- name: fake
  user:
    token: fake-apiserver-accepts-any-token
"
    )
}

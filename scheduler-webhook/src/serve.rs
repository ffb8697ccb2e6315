//! `scheduler-webhook serve`: wires the watch cache, the model's owner and
//! the HTTP routes, and serves until the shutdown future completes.
//!
//! ```text
//!  kube watch (nodes, pods,  ──▶ owner task (ClusterModel) ◀── /filter, /bind
//!   resourcequotas)                                    ◀── /webhook (quota room)
//!  /webhook in DRA mode ──▶ ResourceClaimTemplates created in the pod's namespace
//!  /healthz: process up     /readyz: nodes, pods and quotas listed once
//!  /metrics (own port): HAMi's GPU, slice and quota gauges, our latency histograms
//!  /ui (the metrics port): the live dashboard (crate::ui)
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use kube::Client;
use tracing::info;

use crate::cache::model::{ClusterModel, ModelConfig};
use crate::cache::owner::{self, ModelHandle};
use crate::core::policy::SchedulerConfig;
use crate::extender::handler::ExtenderState;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::webhook::WebhookConfig;

/// How long the webhook and extender server keeps an idle connection open.
/// kube-apiserver (webhooks) and kube-scheduler (extender) reuse connections
/// that Go's HTTP client keeps idle for up to 90 s (`IdleConnTimeout` of
/// `http.DefaultTransport`). A server that closes them sooner (actix's
/// default is 5 s) races the client: a request written just as the server
/// closes fails with `write: broken pipe`, and kube-apiserver refuses the
/// pod creation (`failed calling webhook`). Outliving the client's timeout
/// leaves the closing to the client.
pub const KEEP_ALIVE: Duration = Duration::from_secs(100);

/// Go's `http.DefaultTransport` idle connection timeout, which
/// [`KEEP_ALIVE`] must exceed.
const GO_IDLE_CONN_TIMEOUT: Duration = Duration::from_secs(90);
const _: () = assert!(KEEP_ALIVE.as_secs() > GO_IDLE_CONN_TIMEOUT.as_secs());

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No usable Kubernetes client configuration.
    #[error("kubernetes client: {0}")]
    Kube(String),
    /// TLS files unusable.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A setting that validation should have caught.
    #[error("configuration: {0}")]
    Config(String),
    /// The listener could not be bound or the server failed.
    #[error("server on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Builds a client from the kubeconfig file, or the in-cluster configuration.
///
/// # Errors
/// [`ServeError::Kube`] when neither works.
pub async fn client(settings: &Settings) -> Result<Client, ServeError> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ServeError::Kube(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| ServeError::Kube(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::incluster().map_err(|e| {
            ServeError::Kube(format!("not in a cluster and no --kubeconfig given: {e}"))
        })?,
    };
    Client::try_from(config).map_err(|e| ServeError::Kube(e.to_string()))
}

/// The model configuration the settings describe.
#[must_use]
pub fn model_config(settings: &Settings) -> ModelConfig {
    ModelConfig {
        scheduler: SchedulerConfig {
            node_policy: settings.node_scheduler_policy,
            gpu_policy: settings.gpu_scheduler_policy,
            ..SchedulerConfig::default()
        },
        requests: WebhookConfig::from(settings).request_config(),
        seed: 0,
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok")
}

async fn metrics(
    model: web::Data<ModelHandle>,
    metrics: web::Data<Arc<Metrics>>,
    names: web::Data<proto::hami::resources::ResourceNames>,
) -> HttpResponse {
    let snapshot = async {
        let s = model.snapshot().await?;
        let q = model.quotas().await?;
        let pending = model.pending().await?.len();
        Ok::<_, crate::cache::owner::ModelGone>(((s, q), pending))
    };
    match snapshot.await {
        Ok((((gpus, slices), quotas), pending)) => {
            metrics.set_pending(pending);
            metrics.refresh(&gpus, &slices);
            metrics.refresh_quotas(&quotas, &names);
            HttpResponse::Ok()
                .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
                .body(metrics.encode())
        }
        Err(gone) => HttpResponse::ServiceUnavailable().body(gone.to_string()),
    }
}

async fn readyz(model: web::Data<ModelHandle>) -> HttpResponse {
    if model.is_ready() {
        HttpResponse::Ok().body("ok")
    } else {
        HttpResponse::ServiceUnavailable().body("caches not synced yet")
    }
}

/// The two listening sockets of `serve`, bound before serving so a caller
/// (a test, the sandbox) can pass port 0 and learn the real ports.
#[derive(Debug)]
pub struct Listeners {
    /// `/webhook`, `/filter`, `/bind`, `/healthz`, `/readyz`.
    pub api: std::net::TcpListener,
    /// `/metrics`.
    pub metrics: std::net::TcpListener,
}

impl Listeners {
    /// Binds the addresses in the settings.
    ///
    /// # Errors
    /// [`ServeError::Io`] for an address that cannot be bound (a port in use).
    pub fn bind(settings: &Settings) -> Result<Self, ServeError> {
        let bind = |addr: SocketAddr| {
            std::net::TcpListener::bind(addr).map_err(|source| ServeError::Io { addr, source })
        };
        Ok(Self {
            api: bind(settings.listen)?,
            metrics: bind(settings.metrics_listen)?,
        })
    }
}

/// Serves webhook and extender until `shutdown` completes, then drains.
///
/// Must run inside an actix system (`actix_web::rt::System`).
///
/// # Errors
/// A [`ServeError`] when the client, TLS or listener cannot be set up.
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let listeners = Listeners::bind(&settings)?;
    run_on(settings, listeners, shutdown).await
}

/// [`run`] on listeners the caller bound.
///
/// # Errors
/// A [`ServeError`] when the client, TLS or listener cannot be set up.
pub async fn run_on(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let local = |l: &std::net::TcpListener| {
        l.local_addr().map_err(|source| ServeError::Io {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })
    };
    let listen = local(&listeners.api)?;
    let metrics_listen = local(&listeners.metrics)?;
    let client = client(&settings).await?;
    let model = owner::spawn(ClusterModel::new(model_config(&settings)));
    let watcher = tokio::spawn(crate::cache::watch::run(client.clone(), model.clone()));
    let identity = settings
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let handshake = tokio::spawn(crate::handshake::run(
        client.clone(),
        model.clone(),
        settings.lease_namespace.clone(),
        settings.scheduler_name.clone(),
        identity,
    ));

    let webhook = WebhookConfig::from(&settings);
    // DRA mode creates the shape templates pods name; device-plugin mode
    // never needs them.
    let templates: Option<Arc<dyn crate::webhook::handler::Templates>> = (settings.mode
        == crate::settings::Mode::Dra)
        .then(|| Arc::new(crate::webhook::handler::KubeTemplates(client.clone())) as Arc<_>);
    let registry = Arc::new(Metrics::new());
    let extender = ExtenderState {
        model: model.clone(),
        events: crate::events::EventSink::spawn(client.clone(), 1024),
        client,
        metrics: registry.clone(),
    };
    let metrics_model = web::Data::new(model.clone());
    let metrics_registry = web::Data::new(registry);
    let metrics_names = web::Data::new(settings.resources.clone());
    let dashboard = crate::ui::UiState::start(model.clone());
    let metrics_server = HttpServer::new(move || {
        App::new()
            .app_data(metrics_model.clone())
            .app_data(metrics_registry.clone())
            .app_data(metrics_names.clone())
            .route("/metrics", web::get().to(metrics))
            .configure(|c| crate::ui::configure(c, dashboard.clone()))
    })
    .workers(1)
    .disable_signals()
    .listen(listeners.metrics)
    .map_err(|source| ServeError::Io {
        addr: metrics_listen,
        source,
    })?
    .run();
    let metrics_handle = metrics_server.handle();
    info!(addr = %metrics_listen, "serving /metrics and the dashboard at /ui/");
    let metrics_task = tokio::spawn(metrics_server);
    let ready = web::Data::new(model);
    let server = HttpServer::new(move || {
        App::new()
            .configure(|c| {
                crate::webhook::handler::configure_with(c, webhook.clone(), templates.clone());
            })
            .configure(|c| crate::extender::handler::configure(c, extender.clone()))
            .app_data(ready.clone())
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
    })
    .keep_alive(KEEP_ALIVE)
    .shutdown_timeout(30);
    let io = |source| ServeError::Io {
        addr: listen,
        source,
    };
    let server = if settings.insecure_http {
        server.listen(listeners.api).map_err(io)?
    } else {
        let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) else {
            return Err(ServeError::Config(
                "tlsCert and tlsKey are required".to_owned(),
            ));
        };
        server
            .listen_rustls_0_23(listeners.api, crate::tls::server_config(cert, key)?)
            .map_err(io)?
    };
    for addr in server.addrs() {
        info!(%addr, tls = !settings.insecure_http, "serving /webhook /filter /bind /healthz /readyz");
    }
    let server = server.disable_signals().run();
    let handle = server.handle();
    let mut server = std::pin::pin!(server);
    let served = tokio::select! {
        result = &mut server => result,
        () = shutdown => {
            info!("shutting down: draining in-flight requests");
            // The server future must be polled while it drains, or stop() never completes.
            let ((), result) = tokio::join!(handle.stop(true), server);
            result
        }
    };
    watcher.abort();
    handshake.abort();
    metrics_handle.stop(true).await;
    let _ = metrics_task.await;
    served.map_err(io)
}

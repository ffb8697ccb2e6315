//! The HTTP extender client, as kube-scheduler's `HTTPExtender`: `POST
//! <urlPrefix>/<verb>` with a JSON body, the whole exchange bounded by
//! `httpTimeout`, non-200 answers and `Error` replies turned into errors
//! with kube-scheduler's texts. HTTPS through rustls (ring) with either an
//! accept-any verifier (`insecure`) or the configured CA; plain HTTP too.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Node, Pod};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Serialize;

use super::config::{ConfigError, ExtenderConfig};
use super::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, NodeListOut,
};

/// A failed extender call; `Display` is the text kube-scheduler reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtenderError {
    /// Transport failure (connect, TLS, reset).
    #[error("Post \"{url}\": {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// No complete answer within `httpTimeout`.
    #[error(
        "Post \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )]
    Timeout {
        /// The URL.
        url: String,
    },
    /// A status other than 200.
    #[error("failed {verb} with extender at URL {url}, code {code}")]
    Status {
        /// The verb.
        verb: String,
        /// The URL.
        url: String,
        /// HTTP status.
        code: u16,
    },
    /// The body did not decode.
    #[error("{0}")]
    Decode(String),
    /// The extender answered with `Error`.
    #[error("{0}")]
    Reply(String),
    /// `NodeNames` named a node that was not sent.
    #[error(
        "extender {url:?} claims a filtered node {node:?} which is not found in the input node list"
    )]
    UnknownNode {
        /// The extender URL prefix.
        url: String,
        /// The node.
        node: String,
    },
}

/// Builds the HTTP(S) client of an extender.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad TLS settings.
    #[error("extender TLS: {0}")]
    Tls(String),
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Accepts any server certificate but still checks handshake signatures,
/// like Go's `InsecureSkipVerify`.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn ca_roots(config: &ExtenderConfig) -> Result<rustls::RootCertStore, ClientError> {
    use rustls::pki_types::pem::PemObject;
    let tls = config.tls_config.clone().unwrap_or_default();
    let mut pem = Vec::new();
    if let Some(path) = &tls.ca_file {
        pem.extend(
            std::fs::read(path).map_err(|e| ClientError::Tls(format!("caFile {path}: {e}")))?,
        );
        pem.push(b'\n');
    }
    if let Some(data) = &tls.ca_data {
        if data.contains("-----BEGIN") {
            pem.extend(data.as_bytes());
        } else {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| ClientError::Tls(format!("caData: {e}")))?;
            pem.extend(decoded);
        }
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| ClientError::Tls(format!("CA PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ClientError::Tls(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(ClientError::Tls(
            "https without tlsConfig.insecure needs caFile or caData (no system roots in the fake)"
                .into(),
        ));
    }
    Ok(roots)
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One configured extender.
#[derive(Debug, Clone)]
pub struct Extender {
    config: ExtenderConfig,
    base: String,
    timeout: Duration,
    managed: BTreeSet<String>,
    ignored: BTreeSet<String>,
    client: HttpClient,
}

impl Extender {
    /// Validates `config` and builds its client.
    pub fn new(config: ExtenderConfig) -> Result<Self, ClientError> {
        config.validate()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        let https = config.url_prefix.starts_with("https://");
        let tls = if !https || config.insecure() {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                .with_no_client_auth()
        } else {
            builder
                .with_root_certificates(ca_roots(&config)?)
                .with_no_client_auth()
        };
        let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let server_name = config
            .tls_config
            .as_ref()
            .and_then(|t| t.server_name.clone())
            .filter(|n| !n.is_empty());
        if let Some(name) = server_name {
            let name = ServerName::try_from(name.clone())
                .map_err(|e| ClientError::Tls(format!("serverName {name:?}: {e}")))?;
            builder =
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
        }
        let connector = builder.enable_http1().build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            base: config.url_prefix.trim_end_matches('/').to_string(),
            timeout: config.timeout()?,
            managed: config.managed_names(),
            ignored: config.ignored_names(),
            config,
            client,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ExtenderConfig {
        &self.config
    }

    /// Resources NodeResourcesFit skips.
    pub fn ignored(&self) -> &BTreeSet<String> {
        &self.ignored
    }

    /// `IsInterested`: the pod requests a managed resource (or none are
    /// configured).
    pub fn is_interested(&self, pod: &Pod) -> bool {
        super::fit::requests_any(pod, &self.managed)
    }

    /// Whether a filter verb is configured.
    pub fn filters(&self) -> bool {
        !self.config.filter_verb.is_empty()
    }

    /// Whether the extender binds (`bindVerb` set).
    pub fn binds(&self) -> bool {
        !self.config.bind_verb.is_empty()
    }

    /// Failures of an ignorable extender are skipped.
    pub fn ignorable(&self) -> bool {
        self.config.ignorable
    }

    async fn send(&self, verb: &str, body: &impl Serialize) -> Result<Bytes, ExtenderError> {
        let url = format!("{}/{verb}", self.base);
        let payload = serde_json::to_vec(body).map_err(|e| ExtenderError::Decode(e.to_string()))?;
        let request = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| ExtenderError::Transport {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|e| ExtenderError::Transport {
                        url: url.clone(),
                        reason: error_chain(&e),
                    })?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| ExtenderError::Transport {
                    url: url.clone(),
                    reason: e.to_string(),
                })?
                .to_bytes();
            if status != http::StatusCode::OK {
                return Err(ExtenderError::Status {
                    verb: verb.to_string(),
                    url: url.clone(),
                    code: status.as_u16(),
                });
            }
            Ok(body)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ExtenderError::Timeout { url }),
        }
    }

    /// `Filter`: sends `NodeNames` (nodeCacheCapable) or whole `Nodes`;
    /// returns the reply with names checked against what was sent.
    pub async fn filter(
        &self,
        pod: &Pod,
        nodes: &[&Node],
    ) -> Result<ExtenderFilterResult, ExtenderError> {
        let names: Vec<String> = nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect();
        let args = if self.config.node_cache_capable {
            ExtenderArgs {
                pod,
                nodes: None,
                node_names: Some(names.clone()),
            }
        } else {
            ExtenderArgs {
                pod,
                nodes: Some(NodeListOut {
                    metadata: serde_json::Map::new(),
                    items: nodes.to_vec(),
                }),
                node_names: None,
            }
        };
        let body = self.send(&self.config.filter_verb, &args).await?;
        let result = ExtenderFilterResult::decode(&body)
            .map_err(|e| ExtenderError::Decode(e.to_string()))?;
        if !result.error.is_empty() {
            return Err(ExtenderError::Reply(result.error));
        }
        let returned = if self.config.node_cache_capable && result.node_names.is_some() {
            result.node_names.clone()
        } else {
            result.nodes.clone()
        };
        for name in returned.iter().flatten() {
            if !names.contains(name) {
                return Err(ExtenderError::UnknownNode {
                    url: self.config.url_prefix.clone(),
                    node: name.clone(),
                });
            }
        }
        Ok(ExtenderFilterResult {
            node_names: returned,
            nodes: None,
            ..result
        })
    }

    /// `Bind`.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<(), ExtenderError> {
        let body = self.send(&self.config.bind_verb, args).await?;
        let result = ExtenderBindingResult::decode(&body)
            .map_err(|e| ExtenderError::Decode(e.to_string()))?;
        if result.error.is_empty() {
            Ok(())
        } else {
            Err(ExtenderError::Reply(result.error))
        }
    }
}

/// `e` and its sources joined by `": "`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

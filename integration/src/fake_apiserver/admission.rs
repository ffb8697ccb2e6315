//! Mutating admission webhooks, called on CREATE as kube-apiserver does:
//! an `AdmissionReview` (admission.k8s.io/v1) POSTed over HTTPS to the
//! webhook, trusting only its `caBundle`; the reply's base64 JSONPatch is
//! applied to the object, a denial refuses the create with the webhook's
//! message, and a failed call follows `failurePolicy`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

/// What kube-apiserver does when the webhook cannot be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Refuse the request.
    Fail,
    /// Admit the object unchanged.
    Ignore,
}

/// One mutating webhook, as a `MutatingWebhookConfiguration` entry would
/// describe it (only pods on CREATE are sent).
#[derive(Debug, Clone)]
pub struct MutatingWebhook {
    /// Webhook name, e.g. `vgpu.hami.io`.
    pub name: String,
    /// Full URL, e.g. `https://127.0.0.1:8443/webhook`.
    pub url: String,
    /// PEM CA bundle that signs the webhook's certificate.
    pub ca_bundle: String,
    /// On a failed call.
    pub failure_policy: FailurePolicy,
    /// Call timeout (`timeoutSeconds`).
    pub timeout: Duration,
}

/// How admission ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Admit this (possibly patched) object.
    Allowed(Value),
    /// Refuse with this HTTP code and message.
    Denied {
        /// HTTP status for the client.
        code: u16,
        /// The message, as kube-apiserver words it.
        message: String,
    },
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A webhook with its HTTPS client.
#[derive(Debug, Clone)]
pub struct WebhookCaller {
    hook: MutatingWebhook,
    client: HttpsClient,
}

impl WebhookCaller {
    /// Builds the client trusting only the hook's CA bundle.
    ///
    /// # Errors
    /// The CA bundle holds no usable certificate.
    pub fn new(hook: MutatingWebhook) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(hook.ca_bundle.as_bytes()) {
            let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
            roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        }
        if roots.is_empty() {
            return Err("caBundle holds no certificate".to_owned());
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self {
            hook,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Runs the webhook on a pod being created in `namespace`.
    pub async fn admit(&self, namespace: &str, object: Value, uid: &str) -> Admission {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": object.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "system:admin"},
                "object": object,
                "oldObject": null,
                "dryRun": false,
            }
        });
        match tokio::time::timeout(self.hook.timeout, self.call(&review)).await {
            Ok(Ok(reply)) => self.apply(object_of(&review), &reply, uid),
            Ok(Err(why)) => self.failed(object_of(&review), &why),
            Err(_) => self.failed(object_of(&review), "context deadline exceeded"),
        }
    }

    async fn call(&self, review: &Value) -> Result<Value, String> {
        let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
        let request = http::Request::post(&self.hook.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = self.client.request(request).await.map_err(|e| {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            text
        })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "received status {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("invalid AdmissionReview reply: {e}"))
    }

    fn failed(&self, object: Value, why: &str) -> Admission {
        match self.hook.failure_policy {
            FailurePolicy::Ignore => Admission::Allowed(object),
            FailurePolicy::Fail => Admission::Denied {
                code: 500,
                message: format!(
                    "Internal error occurred: failed calling webhook \"{}\": failed to call webhook: Post \"{}\": {why}",
                    self.hook.name, self.hook.url
                ),
            },
        }
    }

    fn apply(&self, object: Value, reply: &Value, uid: &str) -> Admission {
        let response = &reply["response"];
        if response["uid"].as_str() != Some(uid) {
            return self.failed(object, "the response uid does not match the request uid");
        }
        if response["allowed"] != Value::Bool(true) {
            let message = response
                .pointer("/status/message")
                .and_then(Value::as_str)
                .unwrap_or("denied");
            let code = response
                .pointer("/status/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(403);
            return Admission::Denied {
                code,
                message: format!(
                    "admission webhook \"{}\" denied the request: {message}",
                    self.hook.name
                ),
            };
        }
        let Some(patch) = response.get("patch").and_then(Value::as_str) else {
            return Admission::Allowed(object);
        };
        let patched = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                serde_json::from_slice::<json_patch::Patch>(&bytes).map_err(|e| e.to_string())
            })
            .and_then(|p| {
                let mut target = object.clone();
                json_patch::patch(&mut target, &p)
                    .map(|()| target)
                    .map_err(|e| e.to_string())
            });
        match patched {
            Ok(object) => Admission::Allowed(object),
            Err(why) => self.failed(object, &format!("invalid patch: {why}")),
        }
    }
}

fn object_of(review: &Value) -> Value {
    review["request"]["object"].clone()
}

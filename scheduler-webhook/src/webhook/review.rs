//! `AdmissionReview` in and out, as pure functions over bytes and JSON.
//!
//! The answer is built by hand rather than with kube's `AdmissionResponse`
//! because kube-core 5 serializes `patch` as an array of bytes, while the
//! API (and kube-apiserver) expects a base64 string.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{Value, json};

use super::WebhookConfig;
use super::mutate::{Verdict, mutate};
use crate::core::quota::QuotaUse;
use crate::core::request::PodRequest;

/// API versions of `AdmissionReview` we answer.
pub const VERSIONS: &[&str] = &["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// A request body that is not a usable `AdmissionReview` (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReview {
    /// Not JSON.
    #[error("body is not JSON: {0}")]
    NotJson(String),
    /// Wrong `apiVersion` or `kind`.
    #[error(
        "expected kind AdmissionReview with apiVersion admission.k8s.io/v1 or v1beta1, got {0}"
    )]
    NotAReview(String),
    /// No `request`, or no `request.uid`.
    #[error("AdmissionReview has no request.uid")]
    NoRequest,
    /// `request.object` is missing or not a pod.
    #[error("request.object is not a valid Pod: {0}")]
    BadPod(String),
}

/// Answers an `AdmissionReview` body: the response review as JSON, in the
/// request's API version. No quota check (see [`decide`]).
///
/// Only pod CREATEs are examined; any other review is allowed unchanged.
///
/// # Errors
/// [`BadReview`] when the body cannot be answered at all.
pub fn answer(body: &[u8], config: &WebhookConfig) -> Result<Value, BadReview> {
    decide(body, config)?.encode()
}

/// A decoded review and the verdict on its pod, before it is encoded: the
/// caller may still deny it (quota, §4 step 6) with [`Decision::deny`].
#[derive(Debug, Clone)]
pub struct Decision {
    api_version: String,
    uid: String,
    namespace: String,
    /// `request.dryRun`: nothing may be created for this review.
    dry_run: bool,
    /// `request.object` as sent (the patch is computed against it).
    object: Value,
    /// The pod as admitted when it is ours and asks for a GPU.
    gpu_pod: Option<Box<Pod>>,
    /// What to answer.
    pub verdict: Verdict,
}

impl Decision {
    /// The namespace the pod is created in.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether the review is a dry run (`kubectl apply --dry-run=server`):
    /// side effects such as creating templates must not happen.
    #[must_use]
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The ResourceClaimTemplates the admitted pod names (DRA mode), to be
    /// created in [`Decision::namespace`] before the pod is admitted.
    #[must_use]
    pub fn templates(&self) -> &[ResourceClaimTemplate] {
        match &self.verdict {
            Verdict::Claimed { templates, .. } => templates,
            _ => &[],
        }
    }

    /// What the admitted pod asks of its namespace quota, when it is routed
    /// to our scheduler and asks for a GPU (else `None`: nothing to check).
    #[must_use]
    pub fn quota_ask(&self, config: &WebhookConfig) -> Option<QuotaUse> {
        let pod = self.gpu_pod.as_deref()?;
        let lite = crate::convert::pod_lite(pod).ok()?;
        let request = PodRequest::from_pod(&lite, &config.request_config()).ok()?;
        request.wants_gpu().then(|| QuotaUse::of_request(&request))
    }

    /// Refuses the pod with a message for the user.
    pub fn deny(&mut self, message: String) {
        self.verdict = Verdict::Denied(message);
        self.gpu_pod = None;
    }

    /// The response review as JSON, in the request's API version.
    ///
    /// # Errors
    /// [`BadReview::BadPod`] when the patch cannot be computed.
    pub fn encode(self) -> Result<Value, BadReview> {
        let uid = self.uid;
        let response = match self.verdict {
            Verdict::Unchanged => json!({"uid": uid, "allowed": true}),
            Verdict::Denied(message) => json!({
                "uid": uid,
                "allowed": false,
                "status": {"code": 403, "reason": "Forbidden", "message": message},
            }),
            Verdict::Mutated(pod) | Verdict::Claimed { pod, .. } => {
                let patch = pod_patch(&self.object, &pod)?;
                json!({
                    "uid": uid,
                    "allowed": true,
                    "patchType": "JSONPatch",
                    "patch": base64::engine::general_purpose::STANDARD.encode(patch),
                })
            }
        };
        Ok(json!({"apiVersion": self.api_version, "kind": "AdmissionReview", "response": response}))
    }
}

/// Decodes an `AdmissionReview` body and decides on its pod (everything
/// but the quota check, which needs the model).
///
/// # Errors
/// [`BadReview`] when the body cannot be answered at all.
pub fn decide(body: &[u8], config: &WebhookConfig) -> Result<Decision, BadReview> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| BadReview::NotJson(e.to_string()))?;
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "AdmissionReview" || !VERSIONS.contains(&api_version) {
        return Err(BadReview::NotAReview(format!(
            "kind {kind:?} apiVersion {api_version:?}"
        )));
    }
    let request = review.get("request").ok_or(BadReview::NoRequest)?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or(BadReview::NoRequest)?;

    let is_pod = request.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod")
        || request
            .pointer("/resource/resource")
            .and_then(Value::as_str)
            == Some("pods");
    let is_create = request.get("operation").and_then(Value::as_str) == Some("CREATE");
    let mut namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let (verdict, gpu_pod) =
        if is_pod && is_create && request.get("subResource").is_none_or(Value::is_null) {
            let object = request
                .get("object")
                .filter(|o| !o.is_null())
                .ok_or_else(|| BadReview::BadPod("missing".to_owned()))?;
            let pod: Pod = serde_json::from_value(object.clone())
                .map_err(|e| BadReview::BadPod(e.to_string()))?;
            if namespace.is_none() {
                namespace.clone_from(&pod.metadata.namespace);
            }
            let verdict = mutate(&pod, config);
            let admitted = match &verdict {
                Verdict::Unchanged => Some(Box::new(pod)),
                Verdict::Mutated(p) | Verdict::Claimed { pod: p, .. } => Some(p.clone()),
                Verdict::Denied(_) => None,
            };
            // Only pods our scheduler places are charged to the quota.
            let ours = admitted.filter(|p| {
                p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
                    == Some(config.scheduler_name.as_str())
            });
            (verdict, ours)
        } else {
            (Verdict::Unchanged, None)
        };
    Ok(Decision {
        api_version: api_version.to_owned(),
        uid: uid.to_owned(),
        namespace: namespace.unwrap_or_else(|| "default".to_owned()),
        dry_run: request
            .get("dryRun")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        object: request.get("object").cloned().unwrap_or(Value::Null),
        gpu_pod,
        verdict,
    })
}

/// The RFC 6902 patch from the object as sent to the object we want, as JSON bytes.
fn pod_patch(original: &Value, mutated: &Pod) -> Result<Vec<u8>, BadReview> {
    // Diff against the original *as re-serialized from the typed pod*, so
    // fields the typed model does not know are never removed by the patch.
    let original_pod: Pod =
        serde_json::from_value(original.clone()).map_err(|e| BadReview::BadPod(e.to_string()))?;
    let from = serde_json::to_value(&original_pod).map_err(|e| BadReview::BadPod(e.to_string()))?;
    let to = serde_json::to_value(mutated).map_err(|e| BadReview::BadPod(e.to_string()))?;
    let patch = json_patch::diff(&from, &to);
    serde_json::to_vec(&patch).map_err(|e| BadReview::BadPod(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(api_version: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "object": object,
            }
        }))
        .unwrap()
    }

    fn slice_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}}}]}
        })
    }

    fn decoded_patch(answer: &Value) -> Vec<Value> {
        let b64 = answer["response"]["patch"]
            .as_str()
            .expect("patch is a base64 string");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn answers_in_the_requests_version_with_a_base64_json_patch() {
        for version in VERSIONS {
            let out = answer(&review(version, slice_pod()), &WebhookConfig::default()).unwrap();
            assert_eq!(out["apiVersion"], *version);
            assert_eq!(out["kind"], "AdmissionReview");
            assert_eq!(
                out["response"]["uid"],
                "705ab4f5-6393-11e8-b7cc-42010a800002"
            );
            assert_eq!(out["response"]["allowed"], true);
            assert_eq!(out["response"]["patchType"], "JSONPatch");
            let ops = decoded_patch(&out);
            assert!(
                ops.iter()
                    .any(|op| op["path"] == "/spec/schedulerName"
                        && op["value"] == "gpuslice-scheduler"),
                "{ops:?}"
            );
            assert!(
                ops.iter().any(|op| op["path"]
                    == "/spec/containers/0/resources/limits/nvidia.com~1gpu"
                    && op["value"] == "1"),
                "{ops:?}"
            );
        }
    }

    #[test]
    fn applying_the_patch_to_the_sent_object_gives_the_mutated_pod() {
        let object = slice_pod();
        let out = answer(
            &review(VERSIONS[0], object.clone()),
            &WebhookConfig::default(),
        )
        .unwrap();
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(decoded_patch(&out))).unwrap();
        let mut patched = object;
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(patched["spec"]["schedulerName"], "gpuslice-scheduler");
        assert_eq!(patched["metadata"]["generateName"], "train-");
    }

    #[test]
    fn a_denial_carries_the_message_and_no_patch() {
        let mut object = slice_pod();
        object["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] =
            json!("140");
        let out = answer(&review(VERSIONS[1], object), &WebhookConfig::default()).unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert!(
            out["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("nvidia.com/gpumem-percentage must be 1–100, got 140")
        );
        assert!(out["response"].get("patch").is_none());
    }

    #[test]
    fn a_pod_without_gpu_is_allowed_without_patch() {
        let object =
            json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "nginx"}]}});
        let out = answer(&review(VERSIONS[0], object), &WebhookConfig::default()).unwrap();
        assert_eq!(
            out["response"],
            json!({"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true})
        );
    }

    #[test]
    fn non_create_operations_are_allowed_untouched() {
        let mut body: Value = serde_json::from_slice(&review(VERSIONS[0], slice_pod())).unwrap();
        body["request"]["operation"] = json!("UPDATE");
        let out = answer(
            &serde_json::to_vec(&body).unwrap(),
            &WebhookConfig::default(),
        )
        .unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("patch").is_none());
    }

    #[test]
    fn malformed_reviews_are_named() {
        let cfg = WebhookConfig::default();
        assert!(matches!(answer(b"{nope", &cfg), Err(BadReview::NotJson(_))));
        assert!(matches!(
            answer(br#"{"apiVersion":"v1","kind":"Pod"}"#, &cfg),
            Err(BadReview::NotAReview(_))
        ));
        assert_eq!(
            answer(
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                &cfg
            ),
            Err(BadReview::NoRequest)
        );
        assert!(matches!(
            answer(
                &review(VERSIONS[0], json!({"spec": {"containers": "nope"}})),
                &cfg
            ),
            Err(BadReview::BadPod(_))
        ));
        assert!(matches!(
            answer(&review(VERSIONS[0], Value::Null), &cfg),
            Err(BadReview::BadPod(_))
        ));
    }
}

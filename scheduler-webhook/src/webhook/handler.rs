//! The actix-web route for `POST /webhook`: bytes in, [`super::review::decide`],
//! the namespace's quota room from the model (when the app carries a
//! [`ModelHandle`]), in DRA mode the pod's ResourceClaimTemplates created
//! through [`Templates`] (never for a dry run), JSON out.

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use super::WebhookConfig;
use super::review::{BadReview, decide};
use crate::body::Body;
use crate::cache::owner::ModelHandle;

/// Largest request body accepted, as kube-apiserver and HAMi use (1 MiB).
pub const BODY_LIMIT: usize = 1 << 20;

/// Where DRA mode's shape templates are created: the API server in
/// `serve` ([`KubeTemplates`]), a recorder in tests.
pub trait Templates: Send + Sync {
    /// Creates `template` in `namespace`; one that exists already is success.
    fn create<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a ResourceClaimTemplate,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// [`Templates`] through the API server.
#[derive(Clone)]
pub struct KubeTemplates(pub kube::Client);

impl Templates for KubeTemplates {
    fn create<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a ResourceClaimTemplate,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let api: Api<ResourceClaimTemplate> = Api::namespaced(self.0.clone(), namespace);
            match api.create(&PostParams::default(), template).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// Registers `POST /webhook` with its body limit on an actix-web service config.
pub fn configure(cfg: &mut web::ServiceConfig, config: WebhookConfig) {
    configure_with(cfg, config, None);
}

/// [`configure`] with where DRA mode creates templates (without one, a pod
/// that needs templates is denied).
pub fn configure_with(
    cfg: &mut web::ServiceConfig,
    config: WebhookConfig,
    templates: Option<Arc<dyn Templates>>,
) {
    if let Some(t) = templates {
        cfg.app_data(web::Data::from(t));
    }
    cfg.app_data(web::Data::new(config)).service(
        web::resource("/webhook")
            .app_data(web::PayloadConfig::new(BODY_LIMIT))
            .route(web::post().to(webhook)),
    );
}

async fn webhook(
    body: Body,
    config: web::Data<WebhookConfig>,
    model: Option<web::Data<ModelHandle>>,
    templates: Option<web::Data<dyn Templates>>,
) -> HttpResponse {
    let templates = templates.as_ref().map(|t| t.get_ref());
    match answer(
        &body,
        &config,
        model.as_ref().map(|m| m.get_ref()),
        templates,
    )
    .await
    {
        Ok(review) => {
            let response = &review["response"];
            info!(
                uid = %response["uid"],
                allowed = %response["allowed"],
                patched = response.get("patch").is_some(),
                message = %response.pointer("/status/message").unwrap_or(&serde_json::Value::Null),
                "admission review answered"
            );
            HttpResponse::Ok().json(review)
        }
        Err(error) => {
            warn!(%error, "malformed admission review");
            HttpResponse::BadRequest().json(serde_json::json!({"error": error.to_string()}))
        }
    }
}

/// Decides, checks the quota (§4 step 6), creates the templates (DRA
/// mode), encodes.
async fn answer(
    body: &[u8],
    config: &WebhookConfig,
    model: Option<&ModelHandle>,
    templates: Option<&dyn Templates>,
) -> Result<serde_json::Value, BadReview> {
    let mut decision = decide(body, config)?;
    if let (Some(model), Some(ask)) = (model, decision.quota_ask(config)) {
        match model.quota(decision.namespace()).await {
            Ok(Some(status)) => {
                if let Some(exceeded) = status.refuse(ask) {
                    decision.deny(exceeded.message(&config.resources));
                }
            }
            Ok(None) => {}
            // Fail open like the chart's failurePolicy: Ignore; the filter
            // still enforces the quota.
            Err(gone) => warn!(%gone, "quota not checked at admission"),
        }
    }
    let wanted = decision.templates().to_vec();
    if !wanted.is_empty()
        && !decision.dry_run()
        && let Err(message) = create_templates(decision.namespace(), &wanted, templates).await
    {
        decision.deny(message);
    }
    decision.encode()
}

/// Creates each template in `namespace`; the first failure is the denial.
async fn create_templates(
    namespace: &str,
    wanted: &[ResourceClaimTemplate],
    templates: Option<&dyn Templates>,
) -> Result<(), String> {
    let Some(templates) = templates else {
        return Err(
            "the webhook runs in DRA mode without an API client to create ResourceClaimTemplates"
                .to_owned(),
        );
    };
    for template in wanted {
        let name = template.metadata.name.as_deref().unwrap_or_default();
        templates.create(namespace, template).await.map_err(|e| {
            format!(
                "creating ResourceClaimTemplate {namespace}/{name} for the pod's GPU claim: {e}"
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use actix_web::{App, http::StatusCode, test};
    use serde_json::json;

    use super::*;

    #[actix_web::test]
    async fn a_review_is_answered_with_200_and_json() {
        let app =
            test::init_service(App::new().configure(|c| configure(c, WebhookConfig::default())))
                .await;
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE",
                "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        });
        let req = test::TestRequest::post()
            .uri("/webhook")
            .set_json(&body)
            .to_request();
        let resp: serde_json::Value = test::call_and_read_body_json(&app, req).await;
        assert_eq!(resp["response"]["uid"], "u1");
        assert_eq!(resp["response"]["patchType"], "JSONPatch");
    }

    #[actix_web::test]
    async fn malformed_body_is_400_with_a_reason() {
        let app =
            test::init_service(App::new().configure(|c| configure(c, WebhookConfig::default())))
                .await;
        let req = test::TestRequest::post()
            .uri("/webhook")
            .set_payload("{\"apiVersion\":")
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: serde_json::Value = test::read_body_json(resp).await;
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("body is not JSON")
        );
    }

    // === quota (§4 step 6) ===

    use crate::cache::model::{ClusterModel, ModelConfig};
    use crate::cache::owner::{self, Command};

    /// A model owner with `team-a` limited to 6000 MiB and 100 % cores, of
    /// which a running pod holds 4000 MiB and 20 %.
    async fn model_with_quota() -> ModelHandle {
        let cfg = WebhookConfig::default();
        let handle = owner::spawn(ClusterModel::new(ModelConfig {
            scheduler: crate::core::policy::SchedulerConfig::default(),
            requests: cfg.request_config(),
            seed: 1,
        }));
        let quota = serde_json::from_value(json!({
            "metadata": {"name": "gpu", "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "6000", "limits.nvidia.com/gpucores": "100"}}
        }))
        .unwrap();
        handle
            .send(Command::ApplyQuota(Box::new(quota)))
            .await
            .unwrap();
        let running = serde_json::from_value(json!({
            "metadata": {"name": "running", "namespace": "team-a", "uid": "r1", "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,4000,20:;"}},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap();
        handle
            .send(Command::ApplyPod(Box::new(running)))
            .await
            .unwrap();
        handle
    }

    fn review(namespace: &str, containers: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE",
                "namespace": namespace,
                "object": {"metadata": {"generateName": "train-"}, "spec": {"containers": containers}}}
        })
    }

    fn gpu_container(mem: &str, cores: &str) -> serde_json::Value {
        json!([{"name": "cuda", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}}}])
    }

    async fn ask(model: &ModelHandle, body: &serde_json::Value) -> serde_json::Value {
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(model.clone()))
                .configure(|c| configure(c, WebhookConfig::default())),
        )
        .await;
        let req = test::TestRequest::post()
            .uri("/webhook")
            .set_json(body)
            .to_request();
        test::call_and_read_body_json(&app, req).await
    }

    #[actix_web::test]
    async fn a_pod_over_its_namespace_quota_is_denied_with_the_numbers() {
        let model = model_with_quota().await;
        let resp = ask(&model, &review("team-a", gpu_container("8000", "10"))).await;
        assert_eq!(resp["response"]["allowed"], false, "{resp}");
        assert_eq!(resp["response"]["status"]["code"], 403);
        assert_eq!(
            resp["response"]["status"]["message"],
            "namespace \"team-a\" quota limits.nvidia.com/gpumem: pod asks 8000 MiB, 2000 of 6000 MiB left"
        );
        assert!(resp["response"].get("patch").is_none());
        // Cores: 20 of 100 used, two GPUs × 50 % is 100.
        let two = json!([{"name": "cuda", "resources": {"limits": {
            "nvidia.com/gpu": "2", "nvidia.com/gpumem": "100", "nvidia.com/gpucores": "50"}}}]);
        let resp = ask(&model, &review("team-a", two)).await;
        assert_eq!(
            resp["response"]["status"]["message"],
            "namespace \"team-a\" quota limits.nvidia.com/gpucores: pod asks 100%, 80 of 100% left"
        );
    }

    #[actix_web::test]
    async fn a_pod_under_quota_or_in_another_namespace_is_allowed_and_mutated() {
        let model = model_with_quota().await;
        for ns in ["team-a", "team-b"] {
            let resp = ask(&model, &review(ns, gpu_container("2000", "10"))).await;
            assert_eq!(resp["response"]["allowed"], true, "{ns}: {resp}");
            assert_eq!(resp["response"]["patchType"], "JSONPatch", "{ns}");
        }
        let resp = ask(&model, &review("team-b", gpu_container("99999", "10"))).await;
        assert_eq!(resp["response"]["allowed"], true, "team-b has no quota");
    }

    #[actix_web::test]
    async fn pods_without_gpu_or_for_another_scheduler_are_untouched_by_quota() {
        let model = model_with_quota().await;
        let resp = ask(&model, &review("team-a", json!([{"name": "nginx"}]))).await;
        assert_eq!(
            resp["response"],
            json!({"uid": "u1", "allowed": true}),
            "no GPU, no quota check, no patch"
        );
        let mut other = review("team-a", gpu_container("8000", "10"));
        other["request"]["object"]["spec"]["schedulerName"] = json!("volcano");
        let resp = ask(&model, &other).await;
        assert_eq!(resp["response"], json!({"uid": "u1", "allowed": true}));
    }

    #[actix_web::test]
    async fn oversized_body_is_413() {
        let app =
            test::init_service(App::new().configure(|c| configure(c, WebhookConfig::default())))
                .await;
        let req = test::TestRequest::post()
            .uri("/webhook")
            .set_payload(vec![b' '; BODY_LIMIT + 1])
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    // === DRA mode: templates ===

    /// Records what it is asked to create; fails for names in `refuse`.
    #[derive(Default)]
    struct Recorder {
        created: tokio::sync::Mutex<Vec<(String, String)>>,
        refuse: Vec<String>,
    }

    impl Templates for Recorder {
        fn create<'a>(
            &'a self,
            namespace: &'a str,
            template: &'a ResourceClaimTemplate,
        ) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                let name = template.metadata.name.clone().unwrap_or_default();
                if self.refuse.contains(&name) {
                    return Err("forbidden: no create on resourceclaimtemplates".to_owned());
                }
                self.created.lock().await.push((namespace.to_owned(), name));
                Ok(())
            })
        }
    }

    fn dra_config() -> WebhookConfig {
        WebhookConfig {
            mode: crate::settings::Mode::Dra,
            ..WebhookConfig::default()
        }
    }

    async fn ask_dra(
        recorder: Option<Arc<Recorder>>,
        body: &serde_json::Value,
    ) -> serde_json::Value {
        let templates = recorder.map(|r| r as Arc<dyn Templates>);
        let app = test::init_service(
            App::new().configure(|c| configure_with(c, dra_config(), templates.clone())),
        )
        .await;
        let req = test::TestRequest::post()
            .uri("/webhook")
            .set_json(body)
            .to_request();
        test::call_and_read_body_json(&app, req).await
    }

    fn patched(resp: &serde_json::Value, object: &serde_json::Value) -> serde_json::Value {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(resp["response"]["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut out = object.clone();
        json_patch::patch(&mut out, &patch).unwrap();
        out
    }

    #[actix_web::test]
    async fn dra_mode_creates_the_shape_templates_in_the_pods_namespace() {
        let recorder = Arc::new(Recorder::default());
        let body = review("team-a", gpu_container("3000", "30"));
        let resp = ask_dra(Some(recorder.clone()), &body).await;
        assert_eq!(resp["response"]["allowed"], true, "{resp}");
        assert_eq!(
            *recorder.created.lock().await,
            [("team-a".to_owned(), "gpuslice-1gpu-3000mi-30c".to_owned())]
        );
        let pod = patched(&resp, &body["request"]["object"]);
        assert_eq!(
            pod["spec"]["resourceClaims"],
            json!([{"name": "gpuslice-cuda", "resourceClaimTemplateName": "gpuslice-1gpu-3000mi-30c"}])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"claims": [{"name": "gpuslice-cuda"}]})
        );
    }

    #[actix_web::test]
    async fn dra_mode_creates_nothing_for_a_dry_run() {
        let recorder = Arc::new(Recorder::default());
        let mut body = review("team-a", gpu_container("3000", "30"));
        body["request"]["dryRun"] = json!(true);
        let resp = ask_dra(Some(recorder.clone()), &body).await;
        assert_eq!(resp["response"]["allowed"], true, "{resp}");
        assert_eq!(resp["response"]["patchType"], "JSONPatch");
        assert!(recorder.created.lock().await.is_empty());
    }

    #[actix_web::test]
    async fn dra_mode_denies_bad_input_and_creates_nothing() {
        let recorder = Arc::new(Recorder::default());
        let body = review(
            "team-a",
            json!([{"name": "cuda", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}}}]),
        );
        let resp = ask_dra(Some(recorder.clone()), &body).await;
        assert_eq!(resp["response"]["allowed"], false);
        assert_eq!(resp["response"]["status"]["code"], 403);
        assert_eq!(
            resp["response"]["status"]["message"],
            "nvidia.com/gpumem-percentage is not supported in DRA mode (container cuda): ask nvidia.com/gpumem in MiB, or neither for the whole memory"
        );
        assert!(resp["response"].get("patch").is_none());
        assert!(recorder.created.lock().await.is_empty());
    }

    #[actix_web::test]
    async fn dra_mode_denies_a_pod_whose_template_cannot_be_created() {
        let recorder = Arc::new(Recorder {
            refuse: vec!["gpuslice-1gpu-3000mi-30c".to_owned()],
            ..Recorder::default()
        });
        let resp = ask_dra(
            Some(recorder),
            &review("team-a", gpu_container("3000", "30")),
        )
        .await;
        assert_eq!(resp["response"]["allowed"], false);
        assert_eq!(
            resp["response"]["status"]["message"],
            "creating ResourceClaimTemplate team-a/gpuslice-1gpu-3000mi-30c for the pod's GPU claim: forbidden: no create on resourceclaimtemplates"
        );
        let resp = ask_dra(None, &review("team-a", gpu_container("3000", "30"))).await;
        assert_eq!(resp["response"]["allowed"], false);
    }
}

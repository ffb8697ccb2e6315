//! The actix-web route for `POST /webhook`: bytes in, [`super::review::answer`], JSON out.

use actix_web::{HttpResponse, web};
use tracing::{info, warn};

use super::WebhookConfig;
use super::review::answer;

/// Largest request body accepted, as kube-apiserver and HAMi use (1 MiB).
pub const BODY_LIMIT: usize = 1 << 20;

/// Registers `POST /webhook` with its body limit on an actix-web service config.
pub fn configure(cfg: &mut web::ServiceConfig, config: WebhookConfig) {
    cfg.app_data(web::Data::new(config)).service(
        web::resource("/webhook")
            .app_data(web::PayloadConfig::new(BODY_LIMIT))
            .route(web::post().to(webhook)),
    );
}

async fn webhook(body: web::Bytes, config: web::Data<WebhookConfig>) -> HttpResponse {
    match answer(&body, &config) {
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
}

//! The live dashboard, served on the metrics port at `/ui`.
//!
//! ```text
//!  browser ──GET /ui/ (index.html, app.js, style.css: embedded, no CDN)
//!     └──every 2 s── GET /ui/api/cluster ──▶ model snapshot + pending pods
//!     └──on click─── GET /ui/api/nodes/{name}   (owner task round trips)
//!                                        ◀── trend sampler (every 5 s asks
//!                                            the owner for the fragmentation)
//! ```
//!
//! Owns the HTTP shell and the embedded assets; the JSON is built by pure
//! functions in [`api`], the fragmentation series by [`trend`]. Reads the
//! model only through [`ModelHandle`], like `/metrics`: nothing here
//! writes to it.

pub mod api;
pub mod trend;

use actix_web::{HttpResponse, web};
use tokio::sync::watch;

use crate::cache::owner::ModelHandle;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// What the dashboard's handlers read.
#[derive(Debug, Clone)]
pub struct UiState {
    /// The model's owner.
    pub model: ModelHandle,
    /// The sampler's latest fragmentation and trend.
    pub latest: watch::Receiver<trend::Latest>,
}

impl UiState {
    /// The state for `model`, with its trend sampler started on the current
    /// runtime (it stops when the model's owner does).
    #[must_use]
    pub fn start(model: ModelHandle) -> Self {
        let latest = trend::spawn(model.clone(), trend::SAMPLE_EVERY);
        Self { model, latest }
    }
}

/// Adds `/ui`, its assets and its API to an app.
pub fn configure(cfg: &mut web::ServiceConfig, state: UiState) {
    cfg.app_data(web::Data::new(state))
        .route("/ui", web::get().to(redirect))
        .route("/ui/", web::get().to(index))
        .route("/ui/app.js", web::get().to(app_js))
        .route("/ui/style.css", web::get().to(style_css))
        .route("/ui/api/cluster", web::get().to(cluster))
        .route("/ui/api/nodes/{name}", web::get().to(node));
}

/// `/ui` → `/ui/`, so the page's relative links resolve under `/ui/`.
async fn redirect() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header(("Location", "/ui/"))
        .finish()
}

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "no-cache"))
        .body(body)
}

async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> HttpResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn cluster(state: web::Data<UiState>) -> HttpResponse {
    let read = async {
        let (gpus, slices) = state.model.snapshot().await?;
        let pending = state.model.pending().await?;
        Ok::<_, crate::cache::owner::ModelGone>((gpus, slices, pending))
    };
    match read.await {
        Ok((gpus, slices, pending)) => {
            let latest = state.latest.borrow().clone();
            HttpResponse::Ok().json(api::cluster_view(
                state.model.is_ready(),
                &gpus,
                &slices,
                &pending,
                &latest,
            ))
        }
        Err(gone) => HttpResponse::ServiceUnavailable().body(gone.to_string()),
    }
}

async fn node(state: web::Data<UiState>, name: web::Path<String>) -> HttpResponse {
    match state.model.snapshot().await {
        Ok((gpus, slices)) => {
            let latest = state.latest.borrow().clone();
            match api::node_view(&name, &gpus, &slices, &latest) {
                Some(view) => HttpResponse::Ok().json(view),
                None => HttpResponse::NotFound().body(format!("no GPU node named {name}")),
            }
        }
        Err(gone) => HttpResponse::ServiceUnavailable().body(gone.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use actix_web::{App, test};

    use super::*;
    use crate::cache::model::{ClusterModel, ModelConfig};
    use crate::cache::owner;
    use crate::core::policy::SchedulerConfig;
    use crate::core::request::RequestConfig;

    fn state() -> UiState {
        let model = owner::spawn(ClusterModel::new(ModelConfig {
            scheduler: SchedulerConfig::default(),
            requests: RequestConfig::default(),
            seed: 1,
        }));
        UiState::start(model)
    }

    #[actix_web::test]
    async fn the_page_its_assets_and_the_api_are_served() {
        let app = test::init_service(App::new().configure(|c| configure(c, state()))).await;
        let get = |uri: &str| test::TestRequest::get().uri(uri).to_request();

        let page = test::call_service(&app, get("/ui")).await;
        assert_eq!(page.status(), 308);
        assert_eq!(page.headers().get("location").unwrap(), "/ui/");
        let page = test::call_and_read_body(&app, get("/ui/")).await;
        let page = std::str::from_utf8(&page).unwrap();
        assert!(page.contains("app.js") && page.contains("style.css"));
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no CDN"
        );
        for asset in ["/ui/app.js", "/ui/style.css"] {
            let response = test::call_service(&app, get(asset)).await;
            assert!(response.status().is_success(), "{asset}");
        }

        let view: serde_json::Value =
            test::call_and_read_body_json(&app, get("/ui/api/cluster")).await;
        assert_eq!(view["ready"], false);
        assert_eq!(view["totals"]["gpus"], 0);
        assert!(view["nodes"].as_array().unwrap().is_empty());
        let missing = test::call_service(&app, get("/ui/api/nodes/nope")).await;
        assert_eq!(missing.status(), 404);
    }
}

//! The actix-web routes `POST /filter` and `POST /bind`: decode, one call
//! to the model or the binder, encode. Replies are always HTTP 200 with the
//! error in `Error`, as kube-scheduler expects; only a body that is not a
//! request at all gets 400.
//!
//! A filter that carries `Nodes` (full Node objects, as Cluster Autoscaler
//! sends for its simulation, `nodeCacheCapable: false`) is a dry run, as in
//! HAMi: the pod is checked against those objects, nothing is reserved or
//! written, no event is emitted, and the nodes that pass come back in
//! `Nodes`.

use std::sync::Arc;
use std::time::Instant;

use actix_web::{HttpResponse, web};
use kube::Client;
use tracing::{info, warn};

use super::bind::bind;
use super::wire::{
    ExtenderArgs, ExtenderBindingResult, ExtenderFilterResult, NodeObject, decode_bind,
    decode_filter, node_list,
};
use crate::body::Body;
use crate::cache::model::{DryRun, FilterOutcome};
use crate::cache::owner::ModelHandle;
use crate::events::{EventSink, PodEvent};
use crate::metrics::Metrics;

pub use super::wire::NOT_SYNCED;

/// Largest request body accepted (1 MiB, as HAMi).
pub const BODY_LIMIT: usize = 1 << 20;

/// What the extender routes need.
#[derive(Clone)]
pub struct ExtenderState {
    /// The model's owner.
    pub model: ModelHandle,
    /// API client for bind.
    pub client: Client,
    /// Where decisions are counted.
    pub metrics: Arc<Metrics>,
    /// Where pod events go.
    pub events: EventSink,
}

/// Registers `POST /filter` and `POST /bind`.
pub fn configure(cfg: &mut web::ServiceConfig, state: ExtenderState) {
    cfg.app_data(web::Data::new(state))
        .service(
            web::resource("/filter")
                .app_data(web::PayloadConfig::new(BODY_LIMIT))
                .route(web::post().to(filter)),
        )
        .service(
            web::resource("/bind")
                .app_data(web::PayloadConfig::new(BODY_LIMIT))
                .route(web::post().to(bind_route)),
        );
}

fn bad_request(error: &dyn std::fmt::Display) -> HttpResponse {
    HttpResponse::BadRequest().json(serde_json::json!({"Error": error.to_string()}))
}

async fn filter(body: Body, state: web::Data<ExtenderState>) -> HttpResponse {
    let args = match decode_filter(&body) {
        Ok(a) => a,
        Err(error) => {
            warn!(%error, "malformed filter request");
            return bad_request(&error);
        }
    };
    let started = Instant::now();
    if !state.model.is_ready() {
        // Before the first list a node may look empty while pods hold its
        // GPUs: any placement would be a guess.
        Metrics::count(&state.metrics.filter_results, "not_synced");
        return HttpResponse::Ok().json(ExtenderFilterResult {
            error: NOT_SYNCED.to_owned(),
            ..ExtenderFilterResult::default()
        });
    }
    if args.nodes.is_some() {
        let result = dry_run(args, &state).await;
        state
            .metrics
            .filter_seconds
            .observe(started.elapsed().as_secs_f64());
        return HttpResponse::Ok().json(result);
    }
    let pod_name = args.pod.metadata.name.clone().unwrap_or_default();
    let namespace = args.pod.metadata.namespace.clone().unwrap_or_default();
    let uid = args.pod.metadata.uid.clone().unwrap_or_default();
    let event = |warning, reason, message| PodEvent {
        namespace: namespace.clone(),
        name: pod_name.clone(),
        uid: uid.clone(),
        warning,
        reason,
        message,
    };
    let candidates: Arc<[String]> = args.node_names.unwrap_or_default().into();
    let outcome = state.model.filter(args.pod, Arc::clone(&candidates)).await;
    let result_label = match &outcome {
        Err(_) => "error",
        Ok(FilterOutcome::NoGpuRequested) => "no_gpu",
        Ok(FilterOutcome::Placed { .. }) => "placed",
        Ok(FilterOutcome::NoFit { .. }) => "no_fit",
        Ok(FilterOutcome::Invalid(_)) => "invalid",
    };
    Metrics::count(&state.metrics.filter_results, result_label);
    let result = match outcome {
        Err(gone) => ExtenderFilterResult {
            error: gone.to_string(),
            ..ExtenderFilterResult::default()
        },
        Ok(FilterOutcome::NoGpuRequested) => ExtenderFilterResult {
            node_names: Some(candidates.to_vec()),
            ..ExtenderFilterResult::default()
        },
        Ok(FilterOutcome::Placed {
            node,
            devices,
            failed,
        }) => {
            info!(pod = %pod_name, %namespace, %node, %devices, refused = failed.len(), "filter placed pod");
            state.events.emit(event(
                false,
                "FilteringSucceed",
                format!("find fit node({node}), {} nodes not fit", failed.len()),
            ));
            ExtenderFilterResult {
                node_names: Some(vec![node]),
                failed_nodes: Some(failed),
                ..ExtenderFilterResult::default()
            }
        }
        Ok(FilterOutcome::NoFit { failed }) => {
            info!(pod = %pod_name, %namespace, reasons = ?failed, "filter found no node");
            let reasons: Vec<String> = failed.iter().map(|(n, r)| format!("{n}: {r}")).collect();
            state.events.emit(event(
                true,
                "FilteringFailed",
                format!("no node fits: {}", reasons.join("; ")),
            ));
            ExtenderFilterResult {
                node_names: Some(Vec::new()),
                failed_nodes: Some(failed),
                ..ExtenderFilterResult::default()
            }
        }
        Ok(FilterOutcome::Invalid(why)) => {
            warn!(pod = %pod_name, %namespace, %why, "pod requests cannot be read");
            ExtenderFilterResult {
                error: why,
                ..ExtenderFilterResult::default()
            }
        }
    };
    state
        .metrics
        .filter_seconds
        .observe(started.elapsed().as_secs_f64());
    HttpResponse::Ok().json(result)
}

/// The simulation path: the pod against the request's Node objects, with
/// nothing reserved, written or emitted. The nodes that pass come back as
/// sent, in `Nodes` (a caller with `nodeCacheCapable: false` reads only
/// that); `NodeNames` stays `null`, as in HAMi.
async fn dry_run(args: ExtenderArgs, state: &ExtenderState) -> ExtenderFilterResult {
    let objects: Vec<NodeObject> = args.nodes.unwrap_or_default();
    let pod_name = args.pod.metadata.name.clone().unwrap_or_default();
    let namespace = args.pod.metadata.namespace.clone().unwrap_or_default();
    let nodes = match objects
        .iter()
        .map(NodeObject::node)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(nodes) => nodes,
        Err(bad) => {
            warn!(pod = %pod_name, %namespace, error = %bad, "dry-run filter: a Node object does not read");
            Metrics::count(&state.metrics.filter_results, "invalid");
            return ExtenderFilterResult {
                error: bad.to_string(),
                ..ExtenderFilterResult::default()
            };
        }
    };
    let outcome = state.model.dry_run(args.pod, nodes.into()).await;
    let (label, result) = match outcome {
        Err(gone) => (
            "error",
            ExtenderFilterResult {
                error: gone.to_string(),
                ..ExtenderFilterResult::default()
            },
        ),
        Ok(DryRun::NoGpuRequested) => (
            "no_gpu",
            ExtenderFilterResult {
                nodes: Some(node_list(&objects)),
                ..ExtenderFilterResult::default()
            },
        ),
        Ok(DryRun::Checked { fits, failed }) => {
            info!(pod = %pod_name, %namespace, fits = fits.len(), reasons = ?failed, "dry-run filter");
            (
                if fits.is_empty() {
                    "dry_run_no_fit"
                } else {
                    "dry_run_fit"
                },
                ExtenderFilterResult {
                    nodes: Some(node_list(fits.iter().filter_map(|&i| objects.get(i)))),
                    failed_nodes: Some(failed),
                    ..ExtenderFilterResult::default()
                },
            )
        }
        Ok(DryRun::Invalid(why)) => {
            warn!(pod = %pod_name, %namespace, %why, "pod requests cannot be read");
            (
                "invalid",
                ExtenderFilterResult {
                    error: why,
                    ..ExtenderFilterResult::default()
                },
            )
        }
    };
    Metrics::count(&state.metrics.filter_results, label);
    result
}

async fn bind_route(body: Body, state: web::Data<ExtenderState>) -> HttpResponse {
    let args = match decode_bind(&body) {
        Ok(a) => a,
        Err(error) => {
            warn!(%error, "malformed bind request");
            return bad_request(&error);
        }
    };
    let started = Instant::now();
    let error = match bind(&state.client, &state.model, &args).await {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    };
    let label = if error.is_empty() { "bound" } else { "failed" };
    state.events.emit(PodEvent {
        namespace: args.pod_namespace.clone(),
        name: args.pod_name.clone(),
        uid: args.pod_uid.clone(),
        warning: !error.is_empty(),
        reason: if error.is_empty() {
            "BindingSucceed"
        } else {
            "BindingFailed"
        },
        message: if error.is_empty() {
            format!("bound to node {}", args.node)
        } else {
            error.clone()
        },
    });
    Metrics::count(&state.metrics.bind_results, label);
    state
        .metrics
        .bind_seconds
        .observe(started.elapsed().as_secs_f64());
    HttpResponse::Ok().json(ExtenderBindingResult { error })
}

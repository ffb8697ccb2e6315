//! The HTTP surface of the fake kube-apiserver: path routing, verb
//! dispatch, list/watch encoding (chunked JSON lines, bookmarks, 410 ERROR
//! events), Table output for kubectl, the `/fake/` admin routes and fault
//! injection on every API request.
//!
//! Thin: every decision about objects is made in `store`; this module only
//! translates HTTP to store calls and back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use super::control::{Control, FaultSpec, RequestRecord};
use super::patch::PatchFormat;
use super::resources::{self, ResourceDef};
use super::selector::{FieldSelector, LabelSelector, Selectors};
use super::status::ApiError;
use super::store::{Deleted, Part, Store, StoredEvent, WatchFeed, WatchStart};
use super::table;

/// Watch duration when the client gives no `timeoutSeconds` (the real
/// server picks 30 to 60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Interval of the blank keep-alive line on idle watches. actix notices a
/// client that went away only when it writes, so without it a closed watch
/// would count as open until the next event. JSON stream decoders (Go's
/// `json.Decoder`, kube-rs' line decoder) skip blank lines; the real server
/// does not send them.
const WATCH_HEARTBEAT: Duration = Duration::from_secs(1);

/// Everything the handlers share.
#[derive(Debug)]
pub struct Shared {
    /// The objects.
    pub store: Mutex<Store>,
    /// Faults, counters, watch cutting.
    pub control: Control,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Mutating admission webhooks run on pod CREATEs.
    pub webhooks: Mutex<Vec<super::admission::WebhookCaller>>,
}

impl Shared {
    /// Runs `f` on the locked store; a poisoned lock (a panic elsewhere)
    /// is answered as an internal error rather than propagated.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> Result<R, ApiError> {
        let mut store = self.store.lock().map_err(|_| ApiError::Injected {
            code: 500,
            message: "store lock poisoned".to_string(),
        })?;
        Ok(f(&mut store))
    }
}

/// A request path, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/{group}`.
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`.
    Resources(String, String),
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// A collection, in a namespace or across all (None).
    Collection {
        /// The resource.
        def: &'static ResourceDef,
        /// Namespace from the path.
        namespace: Option<String>,
    },
    /// One object, or one of its subresources.
    Object {
        /// The resource.
        def: &'static ResourceDef,
        /// Namespace from the path.
        namespace: Option<String>,
        /// Object name.
        name: String,
        /// Subresource (`status`, `binding`).
        sub: Option<String>,
    },
}

fn resource_route(group: &str, version: &str, segs: &[&str]) -> Option<Route> {
    if segs.len() >= 3
        && segs[0] == "namespaces"
        && let Some(def) = ResourceDef::find(group, version, segs[2])
        && def.namespaced
    {
        let namespace = Some(segs[1].to_string());
        return match &segs[3..] {
            [] => Some(Route::Collection { def, namespace }),
            [name] => Some(Route::Object {
                def,
                namespace,
                name: (*name).to_string(),
                sub: None,
            }),
            [name, sub] if def.has_subresource(sub) => Some(Route::Object {
                def,
                namespace,
                name: (*name).to_string(),
                sub: Some((*sub).to_string()),
            }),
            _ => None,
        };
    }
    let def = ResourceDef::find(group, version, segs.first()?)?;
    match &segs[1..] {
        [] => Some(Route::Collection {
            def,
            namespace: None,
        }),
        [name] if !def.namespaced => Some(Route::Object {
            def,
            namespace: None,
            name: (*name).to_string(),
            sub: None,
        }),
        [name, sub] if !def.namespaced && def.has_subresource(sub) => Some(Route::Object {
            def,
            namespace: None,
            name: (*name).to_string(),
            sub: Some((*sub).to_string()),
        }),
        _ => None,
    }
}

/// Resolves a request path; `None` is a 404.
pub fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api"] => Some(Route::CoreVersions),
        ["api", "v1"] => Some(Route::Resources(String::new(), "v1".to_string())),
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis"] => Some(Route::Groups),
        ["apis", group] => Some(Route::Group((*group).to_string())),
        ["apis", group, version] => Some(Route::Resources(
            (*group).to_string(),
            (*version).to_string(),
        )),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        ["version"] => Some(Route::Version),
        ["healthz" | "livez" | "readyz"] => Some(Route::Health),
        _ => None,
    }
}

/// Runs the mutating webhooks on a pod being created, in order.
async fn admit(shared: &Shared, namespace: &str, mut object: Value) -> Result<Value, ApiError> {
    let hooks = shared
        .webhooks
        .lock()
        .map_err(|_| ApiError::Injected {
            code: 500,
            message: "webhook list lock poisoned".to_owned(),
        })?
        .clone();
    for hook in &hooks {
        let uid = uuid::Uuid::new_v4().to_string();
        match hook.admit(namespace, object, &uid).await {
            super::admission::Admission::Allowed(patched) => object = patched,
            super::admission::Admission::Denied { code, message } => {
                return Err(ApiError::Injected { code, message });
            }
        }
    }
    Ok(object)
}

fn json_response(code: StatusCode, body: &Value) -> HttpResponse {
    HttpResponse::build(code)
        .content_type("application/json")
        .body(body.to_string())
}

fn error_response(error: &ApiError) -> HttpResponse {
    let code = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &error.to_status())
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("the object provided is unrecognized: {e}")))
}

/// Object bodies must be JSON. kubectl's typed clients send protobuf
/// (`kubectl create namespace`); the fake cannot decode it and answers 415
/// like a server that does not serve that encoding.
fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let media = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if media.is_empty() || media == "application/json" {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(
            "application/json".to_string(),
        ))
    }
}

fn selectors(def: &ResourceDef, query: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str), def)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(Selectors { labels, fields })
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    matches!(query.get(name).map(String::as_str), Some("true" | "1"))
}

/// Runs a write on the store, or on a discarded copy for `?dryRun=All`.
fn write<R>(
    shared: &Shared,
    query: &HashMap<String, String>,
    op: impl FnOnce(&mut Store) -> R,
) -> Result<R, ApiError> {
    match query.get("dryRun").map(String::as_str) {
        None | Some("") => shared.with_store(op),
        Some("All") => shared.with_store(|s| op(&mut s.dry_run_copy())),
        Some(other) => Err(ApiError::BadRequest(format!(
            "Invalid dry run value: {other}: supported values: \"All\""
        ))),
    }
}

/// How the client wants objects rendered.
fn wants_table(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(',')
                .next()
                .is_some_and(|first| first.contains("as=Table"))
        })
}

/// A list response.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ListBody<'a> {
    kind: String,
    api_version: String,
    metadata: Value,
    items: Vec<ListItem<'a>>,
}

/// A stored object as a list item: the real server leaves `kind` and
/// `apiVersion` out of a typed list's items.
struct ListItem<'a>(&'a Value);

impl serde::Serialize for ListItem<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Value::Object(map) = self.0 else {
            return self.0.serialize(serializer);
        };
        let fields = map
            .iter()
            .filter(|(k, _)| k.as_str() != "kind" && k.as_str() != "apiVersion");
        let mut out = serializer.serialize_map(None)?;
        for (k, v) in fields {
            out.serialize_entry(k, v)?;
        }
        out.end()
    }
}

/// The real server's request body limit (3 MiB).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`] with 413.
async fn read_body(mut payload: web::Payload) -> Result<web::BytesMut, ApiError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("reading the body: {e}")))?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ApiError::RequestEntityTooLarge(MAX_BODY_BYTES));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Entry point for every request outside `/fake/`.
pub async fn dispatch(
    req: HttpRequest,
    payload: web::Payload,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let path = req.path().to_string();
    let query: HashMap<String, String> =
        web::Query::<HashMap<String, String>>::from_query(req.query_string())
            .map(web::Query::into_inner)
            .unwrap_or_default();
    let is_watch = flag(&query, "watch");
    let method = req.method().as_str().to_string();
    let verdict = shared.control.verdict(&method, &path, is_watch);
    if !verdict.delay.is_zero() {
        actix_web::rt::time::sleep(verdict.delay).await;
    }
    let response = match verdict.fail {
        Some((code, message)) => {
            debug!(%method, %path, code, "injected failure");
            error_response(&ApiError::Injected { code, message })
        }
        None => match read_body(payload).await {
            Ok(body) => match serve(&req, &query, is_watch, &body, &shared).await {
                Ok(response) => response,
                Err(error) => error_response(&error),
            },
            Err(error) => error_response(&error),
        },
    };
    shared.control.record(RequestRecord {
        method,
        path,
        query: req.query_string().to_string(),
        status: response.status().as_u16(),
    });
    shared.control.update(|s| s.requests += 1);
    response
}

/// A list request's `limit` and `continue`, as the real server reads them:
/// no positive `limit` means one response with everything; a `continue`
/// token carries the resourceVersion of the first page and where the next
/// page starts.
#[derive(Debug, Default)]
struct Page {
    limit: Option<usize>,
    /// (resourceVersion of the first page, namespace, name) of the last
    /// object served.
    after: Option<(u64, String, String)>,
}

/// The real server's answer to a continue token older than its history.
const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

impl Page {
    fn from_query(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&l| l > 0);
        let after = match query.get("continue").map(String::as_str) {
            None | Some("") => None,
            Some(token) => Some(Self::decode(token).ok_or_else(|| {
                ApiError::BadRequest(format!("continue key is not valid: {token}"))
            })?),
        };
        Ok(Self { limit, after })
    }

    fn encode(rv: u64, namespace: &str, name: &str) -> String {
        use base64::Engine as _;
        let token =
            json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{namespace}/{name}")});
        base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
    }

    fn decode(token: &str) -> Option<(u64, String, String)> {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::URL_SAFE
            .decode(token)
            .ok()?;
        let v: Value = serde_json::from_slice(&raw).ok()?;
        let rv = v.get("rv")?.as_u64()?;
        let (namespace, name) = v.get("start")?.as_str()?.split_once('/')?;
        Some((rv, namespace.to_owned(), name.to_owned()))
    }

    /// The page's objects, the resourceVersion to report (the first page's),
    /// and the token for the next page when more remain.
    fn list<'s>(
        &self,
        store: &'s Store,
        def: &ResourceDef,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> Result<(Vec<&'s Value>, u64, Option<String>), ApiError> {
        let rv = match &self.after {
            Some((rv, ..)) if *rv < store.oldest_watchable() => {
                return Err(ApiError::Injected {
                    code: 410,
                    message: CONTINUE_TOO_OLD.to_owned(),
                });
            }
            Some((rv, ..)) => *rv,
            None => store.resource_version(),
        };
        let after = self
            .after
            .as_ref()
            .map(|(_, ns, n)| (ns.as_str(), n.as_str()));
        let limit = self.limit.unwrap_or(usize::MAX);
        let (items, last) = store.list_page(def, namespace, selectors, after, limit);
        let next = last.map(|(ns, name)| Self::encode(rv, &ns, &name));
        Ok((items, rv, next))
    }
}

async fn serve(
    req: &HttpRequest,
    query: &HashMap<String, String>,
    is_watch: bool,
    body: &[u8],
    shared: &web::Data<Shared>,
) -> Result<HttpResponse, ApiError> {
    let method = req.method().as_str();
    let route = route(req.path()).ok_or(ApiError::NoRoute)?;
    let ok = |v: &Value| json_response(StatusCode::OK, v);
    match (method, route) {
        ("GET", Route::CoreVersions) => {
            let host = req.connection_info().host().to_string();
            Ok(ok(&resources::core_versions(&host)))
        }
        ("GET", Route::Groups) => Ok(ok(&resources::group_list())),
        ("GET", Route::Group(g)) => resources::group(&g)
            .map(|v| ok(&v))
            .ok_or(ApiError::NoRoute),
        ("GET", Route::Resources(g, v)) => resources::resource_list(&g, &v)
            .map(|v| ok(&v))
            .ok_or(ApiError::NoRoute),
        ("GET", Route::Version) => Ok(ok(&resources::version_info())),
        ("GET", Route::Health) => Ok(HttpResponse::Ok().content_type("text/plain").body("ok")),
        ("GET", Route::Collection { def, namespace }) => {
            let selectors = selectors(def, query)?;
            if is_watch {
                watch(req, query, shared, def, namespace, selectors)
            } else {
                shared.control.update(|s| s.lists += 1);
                let page = Page::from_query(query)?;
                let table = wants_table(req).then(|| table::include(query));
                // Serialized under the store lock from the stored objects
                // themselves: a list copies nothing but its JSON.
                let body = shared.with_store(|s| {
                    let (items, rv, next) = page.list(s, def, namespace.as_deref(), &selectors)?;
                    let mut metadata = json!({"resourceVersion": rv.to_string()});
                    if let Some(token) = next {
                        metadata["continue"] = json!(token);
                    }
                    if let Some(include) = table {
                        let items: Vec<Value> = items.into_iter().cloned().collect();
                        let mut table = table::table(def, &items, Some(rv), include);
                        table["metadata"] = metadata;
                        return Ok(table.to_string());
                    }
                    let list = ListBody {
                        kind: def.list_kind(),
                        api_version: def.api_version(),
                        metadata,
                        items: items.into_iter().map(ListItem).collect(),
                    };
                    serde_json::to_string(&list).map_err(|e| ApiError::Injected {
                        code: 500,
                        message: format!("serializing a list: {e}"),
                    })
                })??;
                Ok(HttpResponse::Ok()
                    .content_type("application/json")
                    .body(body))
            }
        }
        ("POST", Route::Collection { def, namespace }) => {
            if def.namespaced && namespace.is_none() {
                return Err(ApiError::MethodNotAllowed);
            }
            require_json(req)?;
            let mut object = parse_body(body)?;
            if def.plural == "pods" {
                object = admit(shared, namespace.as_deref().unwrap_or_default(), object).await?;
            }
            let created = write(shared, query, |s| {
                s.create(def, namespace.as_deref(), object)
            })??;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (
            "GET",
            Route::Object {
                def,
                namespace,
                name,
                sub,
            },
        ) if sub.as_deref() != Some("binding") => {
            let object = shared.with_store(|s| s.get(def, namespace.as_deref(), &name))??;
            if wants_table(req) {
                return Ok(ok(&table::table(
                    def,
                    &[object],
                    None,
                    table::include(query),
                )));
            }
            Ok(ok(&object))
        }
        (
            "POST",
            Route::Object {
                namespace,
                name,
                sub,
                ..
            },
        ) if sub.as_deref() == Some("binding") => {
            require_json(req)?;
            let binding = parse_body(body)?;
            let ns = namespace.unwrap_or_default();
            let status = write(shared, query, |s| s.bind(&ns, &name, &binding))??;
            Ok(json_response(StatusCode::CREATED, &status))
        }
        (
            "PUT",
            Route::Object {
                def,
                namespace,
                name,
                sub,
            },
        ) if sub.as_deref() != Some("binding") => {
            let part = if sub.is_some() {
                Part::Status
            } else {
                Part::Main
            };
            require_json(req)?;
            let object = parse_body(body)?;
            let updated = write(shared, query, |s| {
                s.update(def, namespace.as_deref(), &name, object, part)
            })??;
            Ok(ok(&updated))
        }
        (
            "PATCH",
            Route::Object {
                def,
                namespace,
                name,
                sub,
            },
        ) if sub.as_deref() != Some("binding") => {
            let part = if sub.is_some() {
                Part::Status
            } else {
                Part::Main
            };
            let content_type = req
                .headers()
                .get(actix_web::http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let format = PatchFormat::from_content_type(content_type)?;
            let patched = write(shared, query, |s| {
                s.patch(def, namespace.as_deref(), &name, format, body, part)
            })??;
            Ok(ok(&patched))
        }
        (
            "DELETE",
            Route::Object {
                def,
                namespace,
                name,
                sub: None,
            },
        ) => {
            let mut options = if body.is_empty() {
                json!({})
            } else {
                parse_body(body)?
            };
            // `?gracePeriodSeconds=` stands for the DeleteOptions field.
            if options.get("gracePeriodSeconds").is_none()
                && let Some(grace) = query
                    .get("gracePeriodSeconds")
                    .and_then(|g| g.parse::<i64>().ok())
                && let Some(map) = options.as_object_mut()
            {
                map.insert("gracePeriodSeconds".to_string(), json!(grace));
            }
            // DeleteOptions may carry dryRun in the body instead of the query.
            let mut query = query.clone();
            if let Some(modes) = options["dryRun"].as_array()
                && let Some(mode) = modes.first().and_then(Value::as_str)
            {
                query.insert("dryRun".to_string(), mode.to_string());
            }
            match write(shared, &query, |s| {
                s.delete(def, namespace.as_deref(), &name, &options)
            })?? {
                Deleted::Object(object) => Ok(ok(&object)),
                Deleted::Status(status) => Ok(ok(&status)),
            }
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

fn event_line(event_type: &str, object: &Value) -> web::Bytes {
    let mut line = json!({"type": event_type, "object": object})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    web::Bytes::from(line)
}

/// How one watch renders its events.
#[derive(Debug, Clone)]
struct WatchParams {
    def: &'static ResourceDef,
    namespace: Option<String>,
    selectors: Selectors,
    timeout: Duration,
    bookmarks: bool,
    initial_events_end: bool,
    table: Option<table::Include>,
}

impl WatchParams {
    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Value {
        let mut object = json!({
            "kind": self.def.kind,
            "apiVersion": self.def.api_version(),
            "metadata": {"resourceVersion": rv.to_string()},
        });
        if initial_events_end {
            object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        object
    }

    fn line_for(&self, event: &StoredEvent) -> Option<web::Bytes> {
        let seen = event.as_seen_by(self.def, self.namespace.as_deref(), &self.selectors)?;
        if let Some(include) = self.table {
            let rows = table::table(self.def, std::slice::from_ref(&event.object), None, include);
            return Some(event_line(seen.as_str(), &rows));
        }
        // The object's JSON is shared by every watcher of the event.
        let object = event.object_json();
        let mut line = Vec::with_capacity(object.len() + 40);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(seen.as_str().as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        line.extend_from_slice(object);
        line.extend_from_slice(b"}\n");
        Some(web::Bytes::from(line))
    }
}

fn watch(
    req: &HttpRequest,
    query: &HashMap<String, String>,
    shared: &web::Data<Shared>,
    def: &'static ResourceDef,
    namespace: Option<String>,
    selectors: Selectors,
) -> Result<HttpResponse, ApiError> {
    let send_initial = flag(query, "sendInitialEvents");
    let start = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => WatchStart::Now,
        Some(_) if send_initial => WatchStart::Now,
        Some(rv) => WatchStart::After(
            rv.parse()
                .map_err(|_| ApiError::BadRequest(format!("invalid resource version: {rv}")))?,
        ),
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let params = WatchParams {
        def,
        namespace,
        selectors,
        timeout,
        bookmarks: flag(query, "allowWatchBookmarks"),
        initial_events_end: send_initial,
        table: wants_table(req).then(|| table::include(query)),
    };
    shared.control.update(|s| s.watches_started += 1);
    let feed = shared.with_store(|s| s.watch(def, params.namespace.as_deref(), start))?;
    let (tx, rx) = mpsc::channel::<web::Bytes>(256);
    match feed {
        Ok(feed) => {
            let cut = shared.control.cut_signal();
            actix_web::rt::spawn(run_watch(shared.clone(), feed, params, tx, cut));
        }
        Err(expired @ ApiError::Expired { .. }) => {
            // As the real server: a 200 stream carrying one ERROR event.
            shared.control.update(|s| s.expired_sent += 1);
            let _ = tx.try_send(event_line("ERROR", &expired.to_status()));
        }
        Err(other) => return Err(other),
    }
    let body = ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(body))
}

/// Decrements the open-watch counter however the watch ends.
struct OpenWatch(web::Data<Shared>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0
            .control
            .update(|s| s.open_watches = s.open_watches.saturating_sub(1));
    }
}

async fn run_watch(
    shared: web::Data<Shared>,
    mut feed: WatchFeed,
    params: WatchParams,
    tx: mpsc::Sender<web::Bytes>,
    mut cut: tokio::sync::watch::Receiver<u64>,
) {
    shared.control.update(|s| s.open_watches += 1);
    let _open = OpenWatch(shared.clone());
    // No `borrow_and_update` here: the receiver was subscribed before this
    // watch counted as open, so a cut that lands in between (a test cuts
    // as soon as it sees the watch open) still ends it.
    let mut current_rv = feed.resource_version;
    for event in &feed.replay {
        if let Some(line) = params.line_for(event)
            && tx.send(line).await.is_err()
        {
            return;
        }
    }
    if params.initial_events_end {
        let line = event_line("BOOKMARK", &params.bookmark(current_rv, true));
        if tx.send(line).await.is_err() {
            return;
        }
        shared.control.update(|s| s.bookmarks_sent += 1);
    }
    let deadline = tokio::time::sleep(params.timeout);
    tokio::pin!(deadline);
    let period = shared.bookmark_interval.max(Duration::from_millis(10));
    let mut bookmark_timer = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let mut heartbeat = tokio::time::interval_at(
        tokio::time::Instant::now() + WATCH_HEARTBEAT,
        WATCH_HEARTBEAT,
    );
    loop {
        let line = tokio::select! {
            () = tx.closed() => break,
            () = &mut deadline => break,
            changed = cut.changed() => {
                if changed.is_ok() {
                    debug!("watch cut");
                }
                break;
            }
            _ = heartbeat.tick() => web::Bytes::from_static(b"\n"),
            _ = bookmark_timer.tick(), if params.bookmarks => {
                shared.control.update(|s| s.bookmarks_sent += 1);
                event_line("BOOKMARK", &params.bookmark(current_rv, false))
            }
            received = feed.live.recv() => match received {
                Ok(event) => {
                    current_rv = current_rv.max(event.resource_version);
                    match params.line_for(&event) {
                        Some(line) => line,
                        None => continue,
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!(missed, "watch fell behind; ending it with 410");
                    let oldest = shared.with_store(|s| s.oldest_watchable()).unwrap_or(current_rv);
                    let expired = ApiError::Expired { requested: current_rv, oldest };
                    shared.control.update(|s| s.expired_sent += 1);
                    let _ = tx.send(event_line("ERROR", &expired.to_status())).await;
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        };
        if tx.send(line).await.is_err() {
            break;
        }
    }
}

/// Registers the admin routes under `/fake/` and the API on everything
/// else.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/fake/faults", web::post().to(add_fault))
        .route("/fake/faults", web::delete().to(clear_faults))
        .route("/fake/watches/cut", web::post().to(cut_watches))
        .route("/fake/compact", web::post().to(compact))
        .route("/fake/stats", web::get().to(stats))
        .default_service(web::to(dispatch));
}

async fn add_fault(spec: web::Json<FaultSpec>, shared: web::Data<Shared>) -> HttpResponse {
    shared.control.add_fault(spec.into_inner());
    HttpResponse::NoContent().finish()
}

async fn clear_faults(shared: web::Data<Shared>) -> HttpResponse {
    shared.control.clear_faults();
    HttpResponse::NoContent().finish()
}

async fn cut_watches(shared: web::Data<Shared>) -> HttpResponse {
    shared.control.cut_watches();
    HttpResponse::NoContent().finish()
}

async fn compact(shared: web::Data<Shared>) -> HttpResponse {
    match shared.with_store(Store::compact) {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => error_response(&e),
    }
}

async fn stats(shared: web::Data<Shared>) -> HttpResponse {
    let s = shared.control.stats();
    let rv = shared.with_store(|st| st.resource_version()).unwrap_or(0);
    json_response(
        StatusCode::OK,
        &json!({
            "resourceVersion": rv,
            "requests": s.requests,
            "lists": s.lists,
            "watchesStarted": s.watches_started,
            "openWatches": s.open_watches,
            "expiredSent": s.expired_sent,
            "bookmarksSent": s.bookmarks_sent,
            "faultsFired": s.faults_fired,
            "watchCuts": s.watch_cuts,
        }),
    )
}

/// Shared state wrapped for actix.
pub fn shared_data(shared: Arc<Shared>) -> web::Data<Shared> {
    web::Data::from(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object_route(path: &str) -> (String, Option<String>, String, Option<String>) {
        match route(path) {
            Some(Route::Object {
                def,
                namespace,
                name,
                sub,
            }) => (def.plural.to_string(), namespace, name, sub),
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn paths_resolve_like_the_real_server() {
        assert_eq!(route("/api"), Some(Route::CoreVersions));
        assert_eq!(route("/apis/"), Some(Route::Groups));
        assert!(matches!(
            route("/api/v1/pods"),
            Some(Route::Collection {
                namespace: None,
                ..
            })
        ));
        assert!(matches!(
            route("/api/v1/namespaces/ns/pods"),
            Some(Route::Collection { namespace: Some(ref n), .. }) if n == "ns"
        ));
        assert_eq!(
            object_route("/api/v1/namespaces/ns/pods/p/binding"),
            (
                "pods".into(),
                Some("ns".into()),
                "p".into(),
                Some("binding".into())
            )
        );
        assert_eq!(
            object_route("/api/v1/nodes/n/status"),
            ("nodes".into(), None, "n".into(), Some("status".into()))
        );
        assert_eq!(
            object_route("/api/v1/namespaces/ns"),
            ("namespaces".into(), None, "ns".into(), None)
        );
        assert_eq!(
            object_route("/api/v1/namespaces/ns/status"),
            (
                "namespaces".into(),
                None,
                "ns".into(),
                Some("status".into())
            )
        );
        assert_eq!(
            object_route("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"),
            (
                "leases".into(),
                Some("kube-system".into()),
                "l".into(),
                None
            )
        );
        assert!(matches!(
            route("/api/v1/namespaces"),
            Some(Route::Collection { .. })
        ));
        assert_eq!(route("/api/v1/pods/p"), None);
        assert_eq!(route("/api/v1/namespaces/ns/pods/p/log"), None);
        assert_eq!(route("/api/v1/widgets"), None);
        assert_eq!(route("/openapi/v2"), None);
    }
}

//! The fake kube-scheduler against the fake apiserver and a scripted test
//! extender (actix-web on 127.0.0.1:0, HTTP or HTTPS with a self-signed
//! certificate) that records every request: wire shape, fit before the
//! extender, self-binding, failures with events, conditions and backoff,
//! timeouts, the Lease, and the binary. Every wait has a deadline.

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use integration::fake_apiserver::FakeApiServer;
use integration::fake_scheduler::{
    ExtenderConfig, FakeScheduler, LeaderElectionConfig, SchedulerConfig, Stats, TlsConfig,
};
use integration::harness::{
    bound_node, create_nodes, pod_condition, wait_for_object, wait_for_pod, wait_for_pod_events,
    wait_for_scheduled,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const SCHEDULER: &str = "hami-scheduler";
const GPU: &str = "nvidia.com/gpu";

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// What the test extender answers to the next filter call.
#[derive(Debug, Clone)]
enum Script {
    /// `NodeNames` = the last node sent (or the named one if it was sent).
    Accept(Option<String>),
    /// `{"Error": text}`.
    Error(String),
    /// No node passes; every sent node fails with this reason.
    Reject(String),
    /// A non-200 status.
    Status(u16),
    /// Answer after this delay (accepting).
    Slow(Duration),
}

#[derive(Debug, Default)]
struct Recorded {
    /// (path, JSON body) of every request.
    requests: Vec<(String, Value)>,
}

struct ExtenderState {
    client: Client,
    script: Mutex<VecDeque<Script>>,
    fallback: Mutex<Script>,
    recorded: Mutex<Recorded>,
}

impl ExtenderState {
    fn next(&self) -> Script {
        let scripted = self.script.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| self.fallback.lock().unwrap().clone())
    }
}

async fn filter(state: web::Data<ExtenderState>, body: web::Bytes) -> HttpResponse {
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state
        .recorded
        .lock()
        .unwrap()
        .requests
        .push(("/filter".into(), args.clone()));
    // NodeNames with nodeCacheCapable, whole Nodes otherwise.
    let whole_nodes = !args["Nodes"].is_null();
    let names: Vec<String> = if whole_nodes {
        args["Nodes"]["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n["metadata"]["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        args["NodeNames"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let accept = |wanted: Option<String>| {
        let pick = wanted
            .filter(|w| names.contains(w))
            .or_else(|| names.last().cloned());
        if whole_nodes {
            let items: Vec<Value> = pick
                .into_iter()
                .map(|n| json!({"metadata": {"name": n}}))
                .collect();
            json!({"Nodes": {"metadata": {}, "items": items}, "NodeNames": null,
                   "FailedNodes": {}, "FailedAndUnresolvableNodes": null, "Error": ""})
        } else {
            json!({"Nodes": null, "NodeNames": pick.into_iter().collect::<Vec<_>>(),
                   "FailedNodes": {}, "FailedAndUnresolvableNodes": null, "Error": ""})
        }
    };
    match state.next() {
        Script::Accept(wanted) => HttpResponse::Ok().json(accept(wanted)),
        Script::Error(text) => HttpResponse::Ok().json(json!({"Nodes": null, "NodeNames": null,
            "FailedNodes": null, "FailedAndUnresolvableNodes": null, "Error": text})),
        Script::Reject(reason) => {
            let failed: serde_json::Map<String, Value> =
                names.iter().map(|n| (n.clone(), json!(reason))).collect();
            HttpResponse::Ok().json(json!({"Nodes": null, "NodeNames": [],
                "FailedNodes": failed, "FailedAndUnresolvableNodes": null, "Error": ""}))
        }
        Script::Status(code) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap()).body("nope")
        }
        Script::Slow(delay) => {
            tokio::time::sleep(delay).await;
            HttpResponse::Ok().json(accept(None))
        }
    }
}

/// The extender owns binding: it creates pods/binding itself.
async fn bind(state: web::Data<ExtenderState>, body: web::Bytes) -> HttpResponse {
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state
        .recorded
        .lock()
        .unwrap()
        .requests
        .push(("/bind".into(), args.clone()));
    let ns = args["PodNamespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = args["PodName"].as_str().unwrap_or_default().to_string();
    let node = args["Node"].as_str().unwrap_or_default().to_string();
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    let api: Api<Pod> = Api::namespaced(state.client.clone(), &ns);
    let result: Result<Value, kube::Error> = api
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await;
    match result {
        Ok(_) => HttpResponse::Ok().json(json!({"Error": ""})),
        Err(e) => HttpResponse::Ok().json(json!({"Error": e.to_string()})),
    }
}

struct TestExtender {
    url: String,
    /// The self-signed certificate (HTTPS only).
    ca_pem: Option<String>,
    state: web::Data<ExtenderState>,
    handle: actix_web::dev::ServerHandle,
}

impl TestExtender {
    async fn start(client: Client, fallback: Script, tls: bool) -> Self {
        let state = web::Data::new(ExtenderState {
            client,
            script: Mutex::new(VecDeque::new()),
            fallback: Mutex::new(fallback),
            recorded: Mutex::new(Recorded::default()),
        });
        let data = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/filter", web::post().to(filter))
                .route("/bind", web::post().to(bind))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1);
        let mut ca_pem = None;
        let server = if tls {
            let (config, pem) = self_signed_server_config();
            ca_pem = Some(pem);
            server.bind_rustls_0_23(loopback(), config).unwrap()
        } else {
            server.bind(loopback()).unwrap()
        };
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        let scheme = if tls { "https" } else { "http" };
        Self {
            url: format!("{scheme}://{addr}"),
            ca_pem,
            state,
            handle,
        }
    }

    fn push(&self, script: Script) {
        self.state.script.lock().unwrap().push_back(script);
    }

    fn set_fallback(&self, script: Script) {
        *self.state.fallback.lock().unwrap() = script;
    }

    fn requests(&self, path: &str) -> Vec<Value> {
        let recorded = self.state.recorded.lock().unwrap();
        recorded
            .requests
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, v)| v.clone())
            .collect()
    }

    async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// A server config with a fresh self-signed certificate for
/// `extender.invalid`, and that certificate as PEM.
fn self_signed_server_config() -> (rustls::ServerConfig, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["extender.invalid".into()]).unwrap();
    let pem = certified.cert.pem();
    let cert = certified.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    (config, pem)
}

fn node(name: &str, cpu: &str, memory: &str, extra: Value) -> Node {
    let mut allocatable = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    if let (Some(a), Some(e)) = (allocatable.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": allocatable, "allocatable": allocatable}}))
    .unwrap()
}

fn pod(name: &str, scheduler: &str, requests: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "busybox:1.36",
            "resources": {"requests": requests, "limits": limits}}]}}))
    .unwrap()
}

fn gpu_pod(name: &str, cpu: &str) -> Pod {
    pod(
        name,
        SCHEDULER,
        json!({"cpu": cpu, "memory": "1Gi"}),
        json!({GPU: "1"}),
    )
}

struct Cluster {
    server: FakeApiServer,
    client: Client,
}

async fn cluster(nodes: &[Node]) -> Cluster {
    let server = FakeApiServer::start(loopback()).await.unwrap();
    let client = server.client().await.unwrap();
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        api.create(&PostParams::default(), n).await.unwrap();
    }
    Cluster { server, client }
}

impl Cluster {
    async fn create(&self, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        api.create(&PostParams::default(), pod).await.unwrap();
    }

    async fn bound(&self, name: &str) -> Pod {
        wait_for_pod(&self.client, "default", name, DEADLINE, |p| {
            bound_node(p).is_some()
        })
        .await
        .unwrap()
    }
}

fn config(extender: Option<ExtenderConfig>) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(SCHEDULER, extender);
    c.leader_election = None;
    c
}

fn hami(url: &str) -> ExtenderConfig {
    ExtenderConfig::hami(url, &[GPU, "nvidia.com/gpumem", "nvidia.com/gpucores"])
}

#[tokio::test]
async fn extender_gets_pascal_case_node_names_of_fitting_nodes_only_and_binds() {
    let c = cluster(&[
        node("n-small", "500m", "8Gi", json!({})),
        node("n-a", "4", "8Gi", json!({})),
        node("n-busy", "4", "8Gi", json!({})),
        node("n-lowmem", "4", "512Mi", json!({})),
        node("n-c", "4", "8Gi", json!({})),
    ])
    .await;
    // n-busy already runs a pod requesting 3.5 cpu.
    let filler = pod("filler", "other", json!({"cpu": "3500m"}), json!({}));
    c.create(&filler).await;
    let api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "filler"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n-busy"}});
    let _: Value = api
        .create_subresource("binding", "filler", &PostParams::default(), &binding)
        .await
        .unwrap();
    let ext =
        TestExtender::start(c.client.clone(), Script::Accept(Some("n-c".into())), false).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();

    c.create(&gpu_pod("gpu-1", "1")).await;
    let bound = c.bound("gpu-1").await;
    assert_eq!(bound_node(&bound), Some("n-c"));

    let filters = ext.requests("/filter");
    assert_eq!(filters.len(), 1);
    let args = filters[0].as_object().unwrap();
    let mut keys: Vec<&str> = args.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec!["NodeNames", "Nodes", "Pod"],
        "PascalCase, nothing else"
    );
    assert_eq!(
        args["Nodes"],
        Value::Null,
        "nodeCacheCapable sends names only"
    );
    assert_eq!(
        args["NodeNames"],
        json!(["n-a", "n-c"]),
        "n-small (cpu), n-busy (cpu used) and n-lowmem (memory) never reach the extender; \
         nvidia.com/gpu is ignoredByScheduler"
    );
    assert_eq!(args["Pod"]["metadata"]["name"], "gpu-1");
    assert_eq!(args["Pod"]["spec"]["schedulerName"], SCHEDULER);

    let binds = ext.requests("/bind");
    assert_eq!(binds.len(), 1);
    assert_eq!(
        binds[0],
        json!({"PodName": "gpu-1", "PodNamespace": "default",
               "PodUID": bound.metadata.uid.clone().unwrap(), "Node": "n-c"})
    );
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.scheduled == 1)
        .await
        .unwrap();
    assert_eq!(
        (stats.filter_calls, stats.bind_calls, stats.self_binds),
        (1, 1, 0)
    );
    wait_for_pod_events(&c.client, "default", "gpu-1", DEADLINE, |events| {
        events.iter().any(|e| {
            e.reason.as_deref() == Some("Scheduled")
                && e.message.as_deref() == Some("Successfully assigned default/gpu-1 to n-c")
        })
    })
    .await
    .unwrap();
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn extender_without_node_cache_gets_whole_nodes() {
    let c = cluster(&[
        node("n-a", "4", "8Gi", json!({})),
        node("n-b", "4", "8Gi", json!({})),
        node("n-small", "100m", "8Gi", json!({})),
    ])
    .await;
    let ext =
        TestExtender::start(c.client.clone(), Script::Accept(Some("n-a".into())), false).await;
    let mut extender = hami(&ext.url);
    extender.node_cache_capable = false;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(extender)))
        .await
        .unwrap();
    c.create(&gpu_pod("whole", "1")).await;
    assert_eq!(bound_node(&c.bound("whole").await), Some("n-a"));
    let args = &ext.requests("/filter")[0];
    assert_eq!(args["NodeNames"], Value::Null);
    let sent: Vec<&str> = args["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(sent, vec!["n-a", "n-b"]);
    assert_eq!(
        args["Nodes"]["items"][0]["status"]["allocatable"]["cpu"],
        "4"
    );
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn ignorable_extender_failure_is_skipped() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Error("down".into()), false).await;
    let mut extender = hami(&ext.url);
    extender.ignorable = true;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(extender)))
        .await
        .unwrap();
    c.create(&gpu_pod("ignored", "1")).await;
    assert_eq!(bound_node(&c.bound("ignored").await), Some("n-1"));
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.scheduled == 1)
        .await
        .unwrap();
    assert_eq!(
        (stats.filter_errors, stats.errors, stats.bind_calls),
        (1, 0, 1)
    );
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn pods_are_attempted_in_arrival_order() {
    let c = cluster(&[]).await;
    let nodes = create_nodes(
        &c.client,
        "n",
        1,
        json!({"cpu": "8", "memory": "8Gi", "pods": "110"}),
    )
    .await
    .unwrap();
    assert_eq!(nodes, vec!["n-0"]);
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), false).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    scheduler.wait_for(DEADLINE, |s| s.synced).await.unwrap();
    let names = ["fifo-c", "fifo-a", "fifo-d", "fifo-b"];
    for name in names {
        c.create(&gpu_pod(name, "1")).await;
    }
    for name in names {
        let node = wait_for_scheduled(&c.client, "default", name, DEADLINE)
            .await
            .unwrap();
        assert_eq!(node, "n-0");
    }
    let order: Vec<String> = ext
        .requests("/filter")
        .iter()
        .map(|a| a["Pod"]["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(order, names);
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn pods_without_managed_resources_are_bound_by_the_scheduler_itself() {
    let c = cluster(&[
        node("n-1", "4", "8Gi", json!({})),
        node("n-foo", "4", "8Gi", json!({"example.com/foo": "1"})),
    ])
    .await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), false).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    // Another scheduler's pod is created first and must be left alone.
    c.create(&pod(
        "foreign",
        "default-scheduler",
        json!({"cpu": "1"}),
        json!({}),
    ))
    .await;
    c.create(&pod("plain", SCHEDULER, json!({"cpu": "1"}), json!({})))
        .await;
    // An unmanaged extended resource is checked against allocatable.
    c.create(&pod(
        "foo",
        SCHEDULER,
        json!({}),
        json!({"example.com/foo": "1"}),
    ))
    .await;
    let plain = c.bound("plain").await;
    assert!(bound_node(&plain).is_some());
    let foo = c.bound("foo").await;
    assert_eq!(bound_node(&foo), Some("n-foo"));
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.scheduled == 2)
        .await
        .unwrap();
    assert_eq!(stats.self_binds, 2);
    assert_eq!(stats.attempts, 2, "the foreign pod is never attempted");
    assert_eq!((stats.filter_calls, stats.bind_calls), (0, 0));
    assert!(ext.requests("/filter").is_empty() && ext.requests("/bind").is_empty());
    let api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    assert_eq!(bound_node(&api.get("foreign").await.unwrap()), None);

    // A second foo pod cannot fit anywhere: the only foo is used.
    c.create(&pod(
        "foo-2",
        SCHEDULER,
        json!({}),
        json!({"example.com/foo": "1"}),
    ))
    .await;
    let pending = wait_for_pod(&c.client, "default", "foo-2", DEADLINE, |p| {
        pod_condition(p, "PodScheduled").is_some_and(|(s, _, _)| s == "False")
    })
    .await
    .unwrap();
    let (_, reason, message) = pod_condition(&pending, "PodScheduled").unwrap();
    assert_eq!(reason, "Unschedulable");
    assert_eq!(
        message,
        "0/2 nodes are available: 2 Insufficient example.com/foo."
    );
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn extender_error_gives_failed_scheduling_and_a_backoff_retry_that_succeeds() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), false).await;
    ext.push(Script::Error("gpu registry unavailable".into()));
    ext.push(Script::Status(500));
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    c.create(&gpu_pod("retry", "1")).await;

    let events = wait_for_pod_events(&c.client, "default", "retry", DEADLINE, |events| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .count()
            >= 2
    })
    .await
    .unwrap();
    let messages: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    assert!(
        messages.contains(&"gpu registry unavailable".to_string()),
        "{messages:?}"
    );
    let status_message = format!(
        "failed filter with extender at URL {}/filter, code 500",
        ext.url
    );
    assert!(messages.contains(&status_message), "{messages:?}");
    for e in events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
    {
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.involved_object.name.as_deref(), Some("retry"));
    }

    let bound = c.bound("retry").await;
    assert_eq!(bound_node(&bound), Some("n-1"));
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.scheduled == 1)
        .await
        .unwrap();
    assert_eq!(stats.filter_calls, 3);
    assert_eq!(stats.filter_errors, 2);
    assert_eq!(stats.errors, 2);
    assert_eq!(
        stats.attempts, 3,
        "retried from the backoff queue, no event needed"
    );
    assert_eq!(ext.requests("/filter").len(), 3);
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn failed_scheduling_sets_pod_scheduled_false_with_the_error() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Error("always".into()), false).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    c.create(&gpu_pod("err", "1")).await;
    let pending = wait_for_pod(&c.client, "default", "err", DEADLINE, |p| {
        pod_condition(p, "PodScheduled").is_some()
    })
    .await
    .unwrap();
    assert_eq!(
        pod_condition(&pending, "PodScheduled").unwrap(),
        ("False".into(), "SchedulerError".into(), "always".into())
    );
    scheduler
        .wait_for(DEADLINE, |s| s.filter_calls >= 2)
        .await
        .unwrap();
    assert_eq!(bound_node(&pending), None);
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn extender_rejection_is_unschedulable_with_its_reasons_and_retried_on_node_change() {
    let c = cluster(&[
        node("n-gpu", "4", "8Gi", json!({})),
        node("n-tiny", "100m", "8Gi", json!({})),
    ])
    .await;
    let ext = TestExtender::start(
        c.client.clone(),
        Script::Reject("2/2 CardInsufficientMemory".into()),
        false,
    )
    .await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    c.create(&gpu_pod("rejected", "1")).await;
    let pending = wait_for_pod(&c.client, "default", "rejected", DEADLINE, |p| {
        pod_condition(p, "PodScheduled").is_some()
    })
    .await
    .unwrap();
    let expected =
        "0/2 nodes are available: 1 2/2 CardInsufficientMemory, 1 Insufficient cpu.".to_string();
    assert_eq!(
        pod_condition(&pending, "PodScheduled").unwrap(),
        ("False".into(), "Unschedulable".into(), expected.clone())
    );
    wait_for_pod_events(&c.client, "default", "rejected", DEADLINE, |events| {
        events.iter().any(|e| {
            e.reason.as_deref() == Some("FailedScheduling")
                && e.message.as_deref() == Some(expected.as_str())
        })
    })
    .await
    .unwrap();
    assert_eq!(ext.requests("/filter")[0]["NodeNames"], json!(["n-gpu"]));

    // A node change (as when the device plugin registers) moves the pod back.
    ext.set_fallback(Script::Accept(None));
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .patch(
            "n-gpu",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"hami.io/node-handshake": "Reported"}}}),
            ),
        )
        .await
        .unwrap();
    let bound = c.bound("rejected").await;
    assert_eq!(bound_node(&bound), Some("n-gpu"));
    let stats = scheduler.stats();
    assert!(stats.unschedulable >= 1, "{stats:?}");
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

/// What `Cluster::wait_until_ready` waits for: the nodes the scheduler
/// can place pods on now, with their allocatable as its cache holds it.
#[tokio::test]
async fn node_cache_stats_follow_adds_allocatable_changes_and_deletes() {
    let c = cluster(&[node("n-listed", "4", "8Gi", json!({}))]).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(None))
        .await
        .unwrap();
    let gpus = |s: &Stats, name: &str| {
        s.node_allocatable
            .get(name)
            .and_then(|a| a.get(GPU))
            .copied()
    };
    // The first list: the node without GPUs.
    let listed = scheduler
        .wait_for(DEADLINE, |s| {
            s.synced && s.node_allocatable.contains_key("n-listed")
        })
        .await
        .unwrap();
    assert_eq!(gpus(&listed, "n-listed"), None);
    assert_eq!(listed.node_allocatable["n-listed"]["cpu"], 4000);

    // A node registered after the list.
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .create(
            &PostParams::default(),
            &node("n-late", "4", "8Gi", json!({GPU: "8"})),
        )
        .await
        .unwrap();
    scheduler
        .wait_for(DEADLINE, |s| gpus(s, "n-late") == Some(8000))
        .await
        .unwrap();

    // Its device plugin registers: the listed node's allocatable grows.
    nodes
        .patch_status(
            "n-listed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": {GPU: "2"}}})),
        )
        .await
        .unwrap();
    scheduler
        .wait_for(DEADLINE, |s| gpus(s, "n-listed") == Some(2000))
        .await
        .unwrap();

    nodes
        .delete("n-late", &DeleteParams::default())
        .await
        .unwrap();
    let after = scheduler
        .wait_for(DEADLINE, |s| !s.node_allocatable.contains_key("n-late"))
        .await
        .unwrap();
    assert_eq!(
        after.node_allocatable.keys().collect::<Vec<_>>(),
        vec!["n-listed"]
    );
    scheduler.shutdown().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn extender_timeout_is_a_scheduling_error() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), false).await;
    ext.push(Script::Slow(Duration::from_secs(5)));
    let mut extender = hami(&ext.url);
    extender.http_timeout = Some("300ms".into());
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(extender)))
        .await
        .unwrap();
    c.create(&gpu_pod("slow", "1")).await;
    let events = wait_for_pod_events(&c.client, "default", "slow", DEADLINE, |events| {
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedScheduling"))
    })
    .await
    .unwrap();
    let message = events[0].message.clone().unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "Post \"{}/filter\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            ext.url
        )
    );
    c.bound("slow").await;
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn https_extender_with_a_self_signed_certificate_is_used_insecurely() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), true).await;
    assert!(ext.url.starts_with("https://127.0.0.1:"));

    // Without insecure and without a CA the client cannot be built.
    let mut strict = hami(&ext.url);
    strict.enable_https = false;
    strict.tls_config = Some(TlsConfig::default());
    assert!(
        FakeScheduler::start(c.client.clone(), config(Some(strict)))
            .await
            .is_err()
    );

    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    c.create(&gpu_pod("tls", "1")).await;
    assert_eq!(bound_node(&c.bound("tls").await), Some("n-1"));
    assert_eq!(ext.requests("/filter").len(), 1);
    assert_eq!(ext.requests("/bind").len(), 1);
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

fn renew_time(lease: &Lease) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    serde_json::to_value(spec.renew_time.as_ref()?)
        .ok()?
        .as_str()
        .map(String::from)
}

#[tokio::test]
async fn lease_is_held_renewed_and_released_and_gates_scheduling() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    // Another instance holds the Lease right now.
    let foreign: Lease = serde_json::from_value(json!({"metadata": {"name": SCHEDULER},
        "spec": {"holderIdentity": "other-host_1234", "leaseDurationSeconds": 15,
                 "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 3}}))
    .unwrap();
    leases
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();

    let mut config = SchedulerConfig::new(SCHEDULER, None);
    let mut le = LeaderElectionConfig::for_lease(SCHEDULER);
    le.retry_period = Duration::from_millis(200);
    config.leader_election = Some(le);
    let scheduler = FakeScheduler::start(c.client.clone(), config)
        .await
        .unwrap();
    let identity = scheduler.identity().unwrap().to_string();
    let host = hostname::get().unwrap().into_string().unwrap();
    assert!(identity.starts_with(&format!("{host}_")), "{identity}");
    assert_eq!(identity.len(), host.len() + 1 + 36, "uuid suffix");

    c.create(&pod("gated", SCHEDULER, json!({"cpu": "1"}), json!({})))
        .await;
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.lease_attempts >= 3)
        .await
        .unwrap();
    assert!(!stats.leader);
    assert_eq!((stats.lease_renewals, stats.attempts), (0, 0));

    // The holder releases the Lease as client-go does: the scheduler takes
    // over and only then schedules.
    leases
        .patch(
            SCHEDULER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}})),
        )
        .await
        .unwrap();
    c.bound("gated").await;
    let held = wait_for_object(leases.clone(), SCHEDULER, DEADLINE, |l| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(identity.as_str())
    })
    .await
    .unwrap();
    let spec = held.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(4));
    let first = renew_time(&held).unwrap();
    assert_eq!(
        first.len(),
        "2026-01-01T00:00:00.000000Z".len(),
        "MicroTime: {first}"
    );
    assert!(spec.acquire_time.is_some());

    let renewed = wait_for_object(leases.clone(), SCHEDULER, DEADLINE, |l| {
        renew_time(l).is_some_and(|t| t > first)
    })
    .await
    .unwrap();
    assert_eq!(
        renewed.spec.unwrap().holder_identity.as_deref(),
        Some(identity.as_str())
    );
    assert!(scheduler.stats().leader);

    scheduler.shutdown().await;
    let released = leases.get(SCHEDULER).await.unwrap().spec.unwrap();
    assert_eq!(released.holder_identity.as_deref(), Some(""));
    assert_eq!(released.lease_duration_seconds, Some(1));
    c.server.shutdown().await;
}

#[tokio::test]
async fn binary_schedules_from_a_kube_scheduler_configuration_file() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), true).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    c.server.write_kubeconfig(&kubeconfig).unwrap();
    let config = dir.path().join("scheduler.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: {SCHEDULER}
  resourceNamespace: kube-system
profiles:
- schedulerName: {SCHEDULER}
extenders:
- urlPrefix: \"{}\"
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  weight: 1
  httpTimeout: 30s
  enableHTTPS: true
  tlsConfig:
    insecure: true
  managedResources:
  - name: {GPU}
    ignoredByScheduler: true
",
            ext.url
        ),
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_fake-scheduler"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--extender-config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    c.create(&gpu_pod("from-binary", "1")).await;
    c.create(&pod(
        "plain-from-binary",
        SCHEDULER,
        json!({"cpu": "1"}),
        json!({}),
    ))
    .await;
    assert_eq!(bound_node(&c.bound("from-binary").await), Some("n-1"));
    c.bound("plain-from-binary").await;
    assert_eq!(ext.requests("/bind").len(), 1);
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    let lease = leases.get(SCHEDULER).await.unwrap();
    assert!(lease.spec.unwrap().holder_identity.unwrap().contains('_'));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    ext.stop().await;
    c.server.shutdown().await;
}

/// Kills the child process (started by this test) even when the test fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn binary_help_and_bad_config() {
    let bin = env!("CARGO_BIN_EXE_fake-scheduler");
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in ["--kubeconfig", "--scheduler-name", "--extender-config"] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "urlPrefix: ftp://nowhere\n").unwrap();
    let out = std::process::Command::new(bin)
        .args(["--kubeconfig", "/nonexistent", "--extender-config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("urlPrefix"));
}

#[tokio::test]
async fn two_instances_one_leader_and_takeover_on_release() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let start = |client: Client| async move {
        let mut config = SchedulerConfig::new(SCHEDULER, None);
        let mut le = LeaderElectionConfig::for_lease(SCHEDULER);
        le.retry_period = Duration::from_millis(200);
        config.leader_election = Some(le);
        FakeScheduler::start(client, config).await.unwrap()
    };
    let first = start(c.client.clone()).await;
    first.wait_for(DEADLINE, |s| s.leader).await.unwrap();
    let second = start(c.client.clone()).await;
    second
        .wait_for(DEADLINE, |s| s.lease_attempts >= 3)
        .await
        .unwrap();
    assert!(!second.stats().leader, "the Lease is held by the first");
    assert_ne!(first.identity(), second.identity());

    c.create(&pod("one", SCHEDULER, json!({"cpu": "1"}), json!({})))
        .await;
    c.bound("one").await;
    first
        .wait_for(DEADLINE, |s| s.scheduled == 1)
        .await
        .unwrap();
    assert_eq!(second.stats().attempts, 0);

    first.shutdown().await;
    second.wait_for(DEADLINE, |s| s.leader).await.unwrap();
    c.create(&pod("two", SCHEDULER, json!({"cpu": "1"}), json!({})))
        .await;
    c.bound("two").await;
    second
        .wait_for(DEADLINE, |s| s.scheduled == 1)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    let spec = leases.get(SCHEDULER).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), second.identity());
    assert_eq!(spec.lease_transitions, Some(1));
    second.shutdown().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn schedules_through_cut_watches_and_an_expired_resource_version() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), false).await;
    let scheduler = FakeScheduler::start(c.client.clone(), config(Some(hami(&ext.url))))
        .await
        .unwrap();
    scheduler.wait_for(DEADLINE, |s| s.synced).await.unwrap();
    c.create(&gpu_pod("before", "1")).await;
    c.bound("before").await;
    c.server.compact().unwrap();
    c.server.cut_watches();
    c.create(&gpu_pod("after", "1")).await;
    c.create(&pod(
        "after-plain",
        SCHEDULER,
        json!({"cpu": "1"}),
        json!({}),
    ))
    .await;
    c.bound("after").await;
    c.bound("after-plain").await;
    let stats = scheduler
        .wait_for(DEADLINE, |s| s.scheduled == 3)
        .await
        .unwrap();
    assert_eq!(stats.filter_calls, 2, "no pod is filtered twice: {stats:?}");
    scheduler.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

#[tokio::test]
async fn https_extender_verified_against_its_ca_and_server_name() {
    let c = cluster(&[node("n-1", "4", "8Gi", json!({}))]).await;
    let ext = TestExtender::start(c.client.clone(), Script::Accept(None), true).await;
    let verified = |server_name: Option<&str>| {
        let mut e = hami(&ext.url);
        e.enable_https = false;
        e.tls_config = Some(TlsConfig {
            insecure: false,
            ca_data: ext.ca_pem.clone(),
            server_name: server_name.map(String::from),
            ..TlsConfig::default()
        });
        e
    };
    // The certificate names extender.invalid, not 127.0.0.1: verification fails.
    let wrong = FakeScheduler::start(c.client.clone(), config(Some(verified(None))))
        .await
        .unwrap();
    c.create(&gpu_pod("verify", "1")).await;
    let pending = wait_for_pod(&c.client, "default", "verify", DEADLINE, |p| {
        pod_condition(p, "PodScheduled").is_some()
    })
    .await
    .unwrap();
    let (status, reason, message) = pod_condition(&pending, "PodScheduled").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SchedulerError")
    );
    assert!(
        message.starts_with(&format!("Post \"{}/filter\": ", ext.url)),
        "{message}"
    );
    assert!(ext.requests("/filter").is_empty(), "no request got through");
    wrong.shutdown().await;

    // With serverName set to the certificate's name it verifies.
    let right = FakeScheduler::start(
        c.client.clone(),
        config(Some(verified(Some("extender.invalid")))),
    )
    .await
    .unwrap();
    assert_eq!(bound_node(&c.bound("verify").await), Some("n-1"));
    assert_eq!(ext.requests("/filter").len(), 1);
    right.shutdown().await;
    ext.stop().await;
    c.server.shutdown().await;
}

//! Hostile clients against the real service (`serve::run_on` over TLS,
//! fed by a minimal in-test API server): malformed JSON, wrong kinds and
//! versions, 10 MB bodies, 100,000 node names, deeply nested JSON,
//! truncated TLS handshakes and slow-loris clients.
//!
//! Every hostile request gets a 4xx, or an `AdmissionReview` that denies
//! with a reason; the service stays up (good requests still work after
//! each group); and the process's resident memory grows by less than
//! [`memory_bound`]: at most [`MAX_OPEN`] connections are open at once, each
//! buffering at most one request body (`BODY_LIMIT`, 1 MiB), plus slack for
//! the allocator and the one 100,000-name answer.
//!
//! Traffic is bounded and stays on 127.0.0.1. No assertion depends on how
//! fast the machine is: waits are for the server's own timeouts (TLS
//! handshake 3 s and request head 5 s, actix-web's defaults; request body
//! 10 s, `body::BODY_TIMEOUT`), with a socket read timeout far above them
//! only as a guard against a hang.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use proto::hami::keys;
use proto::hami::register::{self, NodeDevice};
use rustls::pki_types::{CertificateDer, ServerName};
use scheduler_webhook::serve::{Listeners, run_on};
use scheduler_webhook::settings::Settings;
use serde_json::{Value, json};

/// The hang guard: far above every server timeout the test waits for.
const GUARD: Duration = Duration::from_secs(60);
/// Most connections the test holds open at once (the slow-loris group).
const MAX_OPEN: usize = 24;
/// The one node with GPUs the fake API server lists.
const GPU_NODE: &str = "gpu-node";

/// How much the process's resident memory may grow during the hostile
/// traffic: every open connection buffering a full body, plus 64 MiB for
/// the allocator's retention and the 100,000-name request and answer.
fn memory_bound() -> u64 {
    let body = scheduler_webhook::extender::handler::BODY_LIMIT
        .max(scheduler_webhook::webhook::handler::BODY_LIMIT);
    (MAX_OPEN * body) as u64 + (64 << 20)
}

// === the service ===

struct Service {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    _dir: tempfile::TempDir,
}

impl Service {
    /// Starts a fake API server listing one GPU node, and the real service
    /// on it, over TLS; returns once `/readyz` answers 200.
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certified = rcgen::generate_simple_self_signed(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&crt, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(certified.cert.der().to_vec()))
            .unwrap();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();

        let apiserver = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters: [{{name: fake, cluster: {{server: 'http://{}'}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\n\
                 users: [{{name: fake, user: {{}}}}]\n",
                apiserver.local_addr().unwrap()
            ),
        )
        .unwrap();
        let settings = Settings {
            kubeconfig: Some(kubeconfig),
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: "127.0.0.1:0".parse().unwrap(),
            tls_cert: Some(crt),
            tls_key: Some(key),
            identity: Some("hostile-test".to_owned()),
            ..Settings::default()
        };
        settings.validate().unwrap();
        let listeners = Listeners::bind(&settings).unwrap();
        let addr = listeners.api.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let fake = HttpServer::new(|| App::new().default_service(web::to(fake_api)))
                    .workers(1)
                    .disable_signals()
                    .listen(apiserver)
                    .map_err(|e| e.to_string())?
                    .run();
                actix_web::rt::spawn(fake);
                run_on(settings, listeners, async {
                    let _ = stopped.await;
                })
                .await
                .map_err(|e| e.to_string())
            })
        });
        let service = Self {
            addr,
            tls: Arc::new(tls),
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        };
        for _ in 0..600 {
            if let Some((200, _)) = service.try_request("GET", "/readyz", b"") {
                return service;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the service did not become ready");
    }

    fn tcp(&self) -> TcpStream {
        let tcp = TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(GUARD)).unwrap();
        tcp.set_write_timeout(Some(GUARD)).unwrap();
        tcp
    }

    fn tls(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        let name = ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).unwrap();
        rustls::StreamOwned::new(conn, self.tcp())
    }

    /// Sends one request on a fresh TLS connection (`Connection: close`)
    /// and reads the answer: status and body, or `None` when the server
    /// gave no HTTP answer.
    fn try_request(&self, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        let mut stream = self.tls();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        // A server that refuses a large body early may close before it is
        // all written: the answer is still read.
        let _ = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body));
        let _ = stream.flush();
        parse_response(&read_all(&mut stream))
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        self.try_request(method, path, body)
            .unwrap_or_else(|| panic!("no HTTP answer to {method} {path}"))
    }

    /// A good filter and a good review still get their normal answers.
    fn assert_still_serving(&self, after: &str) {
        let (status, body) = self.request("POST", "/filter", &good_filter(&[GPU_NODE]));
        assert_eq!(status, 200, "{after}: filter");
        let result: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(result["NodeNames"], json!([GPU_NODE]), "{after}: {result}");
        let (status, body) = self.request("POST", "/webhook", &good_review());
        assert_eq!(status, 200, "{after}: webhook");
        let review: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(review["response"]["allowed"], true, "{after}: {review}");
        assert_eq!(self.request("GET", "/healthz", b"").0, 200, "{after}");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && !std::thread::panicking()
        {
            thread.join().unwrap().unwrap();
        }
    }
}

/// The fake API server: lists one GPU node, no pods, no quotas; holds
/// watches open; 404 for anything else (leases, events, patches).
async fn fake_api(req: HttpRequest) -> HttpResponse {
    let watch = req
        .query_string()
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    if watch && req.method() == actix_web::http::Method::GET {
        return HttpResponse::Ok()
            .content_type("application/json")
            .streaming(futures::stream::pending::<
                Result<web::Bytes, actix_web::Error>,
            >());
    }
    let (kind, items) = match (req.method().as_str(), req.path()) {
        ("GET", "/api/v1/nodes") => ("NodeList", vec![gpu_node()]),
        ("GET", "/api/v1/pods") => ("PodList", vec![]),
        ("GET", "/api/v1/resourcequotas") => ("ResourceQuotaList", vec![]),
        _ => {
            return HttpResponse::NotFound().json(json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "NotFound", "code": 404, "message": "not in the fake"}));
        }
    };
    HttpResponse::Ok().json(json!({
        "apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}))
}

fn gpu_node() -> Value {
    let device = NodeDevice {
        id: "GPU-0".to_owned(),
        index: 0,
        count: 10,
        devmem: 16384,
        devcore: 100,
        device_type: "NVIDIA-Tesla T4".to_owned(),
        numa: 0,
        mode: "hami-core".to_owned(),
        health: true,
        mig_profiles: Vec::new(),
    };
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": GPU_NODE,
        "resourceVersion": "1",
        "annotations": {keys::NODE_NVIDIA_REGISTER: register::encode_json(&[device]).unwrap()}}})
}

// === requests ===

fn slice_pod() -> Value {
    json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "10"}}}]}})
}

fn good_filter(nodes: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({"Pod": slice_pod(), "NodeNames": nodes})).unwrap()
}

fn review_of(object: &Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "ns", "object": object}})
}

fn good_review() -> Vec<u8> {
    serde_json::to_vec(&review_of(&slice_pod())).unwrap()
}

fn read_all(stream: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // A close without close_notify, or a reset after an early
            // answer: what arrived is the answer.
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("read timed out after {GUARD:?}: {e}"),
        }
    }
    out
}

fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let text = std::str::from_utf8(raw.get(..12)?).ok()?;
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((status, raw[split + 4..].to_vec()))
}

/// Resident set size of this process (the service runs in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

// === the cases ===

/// Refused: a 4xx, or the endpoint's own refusal with a reason (an
/// `AdmissionReview` that denies; an extender answer with `Error`, which is
/// how kube-scheduler's extender protocol refuses a request it could read).
fn assert_refused(service: &Service, path: &str, body: &[u8], what: &str) {
    let (status, answer) = service.request("POST", path, body);
    let json: Value = serde_json::from_slice(&answer).unwrap_or_default();
    let refused = match status {
        400..500 => true,
        200 if path == "/webhook" => {
            json["response"]["allowed"] == false
                && json["response"]["status"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
        }
        200 => json["Error"].as_str().is_some_and(|e| !e.is_empty()),
        _ => false,
    };
    assert!(
        refused,
        "{what} on {path}: {status} {}",
        String::from_utf8_lossy(&answer)
    );
}

fn malformed_json(service: &Service) {
    let bodies: [&[u8]; 9] = [
        b"",
        b"{",
        b"{\"apiVersion\":",
        b"null",
        b"[]",
        b"\xff\xfe{}",
        b"{\"Pod\": NaN}",
        b"\xef\xbb\xbf{\"PodName\":\"p\"}",
        b"{} trailing",
    ];
    for path in ["/webhook", "/filter", "/bind"] {
        for body in bodies {
            assert_refused(
                service,
                path,
                body,
                &format!("{:?}", String::from_utf8_lossy(body)),
            );
        }
    }
}

fn wrong_kinds_and_versions(service: &Service) {
    let mut review = review_of(&slice_pod());
    for (field, value) in [
        ("apiVersion", "admission.k8s.io/v2"),
        ("apiVersion", "v1"),
        ("kind", "Pod"),
        ("kind", "AdmissionReviewList"),
    ] {
        let mut wrong = review.clone();
        wrong[field] = json!(value);
        assert_refused(
            service,
            "/webhook",
            &serde_json::to_vec(&wrong).unwrap(),
            value,
        );
    }
    for object in [
        json!("a pod"),
        json!([slice_pod()]),
        json!({"spec": {"containers": 7}}),
    ] {
        review["request"]["object"] = object.clone();
        assert_refused(
            service,
            "/webhook",
            &serde_json::to_vec(&review).unwrap(),
            &object.to_string(),
        );
    }
    // A pod whose request cannot be read is denied, with the reason.
    let bad_quantity = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"}}}]}});
    assert_refused(
        service,
        "/webhook",
        &serde_json::to_vec(&review_of(&bad_quantity)).unwrap(),
        "gpumem: lots",
    );
    // The other endpoints' bodies, each on the wrong endpoint.
    let bind = json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": GPU_NODE});
    assert_refused(
        service,
        "/filter",
        &serde_json::to_vec(&bind).unwrap(),
        "bind on filter",
    );
    assert_refused(
        service,
        "/bind",
        &good_filter(&[GPU_NODE]),
        "filter on bind",
    );
    assert_refused(service, "/filter", &good_review(), "review on filter");
    assert_refused(
        service,
        "/webhook",
        &good_filter(&[GPU_NODE]),
        "filter on webhook",
    );
    for wrong in [
        json!({"Pod": 1, "NodeNames": [GPU_NODE]}),
        json!({"Pod": slice_pod(), "NodeNames": GPU_NODE}),
        json!({"Pod": slice_pod(), "NodeNames": [1, 2]}),
        json!({"Pod": slice_pod(), "Nodes": {"items": [{"metadata": {}}]}}),
    ] {
        assert_refused(
            service,
            "/filter",
            &serde_json::to_vec(&wrong).unwrap(),
            &wrong.to_string(),
        );
    }
    for wrong in [
        json!({"PodName": "p"}),
        json!({"PodName": 1, "PodNamespace": "ns", "PodUID": "u", "Node": "n"}),
    ] {
        assert_refused(
            service,
            "/bind",
            &serde_json::to_vec(&wrong).unwrap(),
            &wrong.to_string(),
        );
    }
    for path in ["/webhook", "/filter", "/bind"] {
        let (status, _) = service.request("GET", path, b"");
        assert!((400..500).contains(&status), "GET {path}: {status}");
    }
}

fn ten_megabyte_bodies(service: &Service) {
    let mut big = b"{\"Pod\":\"".to_vec();
    big.resize(10 << 20, b'a');
    for path in ["/webhook", "/filter", "/bind"] {
        assert_eq!(service.request("POST", path, &big).0, 413, "{path}");
    }
    // The same without a Content-Length: chunked, cut off at the limit.
    for path in ["/webhook", "/filter", "/bind"] {
        let mut stream = service.tls();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n"
        );
        let _ = stream.write_all(head.as_bytes());
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..160 {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
            if stream.write_all(&framed).is_err() {
                break;
            }
        }
        let _ = stream.write_all(b"0\r\n\r\n");
        let answer = parse_response(&read_all(&mut stream));
        assert!(
            answer.as_ref().is_none_or(|(status, _)| *status == 413),
            "chunked 10 MB on {path}: {:?}",
            answer.map(|a| a.0)
        );
    }
}

fn a_hundred_thousand_node_names(service: &Service) {
    let names: Vec<String> = (0..100_000).map(|i| format!("n{i}")).collect();
    let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
    refs.push(GPU_NODE);
    let body = good_filter(&refs);
    assert!(body.len() < scheduler_webhook::extender::handler::BODY_LIMIT);
    // A valid request: it is answered, not refused; only the node with
    // GPUs fits, every other name is reported as failed.
    let (status, answer) = service.request("POST", "/filter", &body);
    assert_eq!(status, 200);
    let result: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        result["NodeNames"],
        json!([GPU_NODE]),
        "{}",
        result["Error"]
    );
    assert_eq!(
        result["FailedNodes"].as_object().map(serde_json::Map::len),
        Some(100_000)
    );
    // Past the body limit with longer names: refused.
    let long: Vec<String> = (0..100_000).map(|i| format!("node-{i:08}")).collect();
    let refs: Vec<&str> = long.iter().map(String::as_str).collect();
    assert_eq!(
        service.request("POST", "/filter", &good_filter(&refs)).0,
        413
    );
}

fn deeply_nested_json(service: &Service) {
    let depth = 100_000;
    let nested = |open: &str, close: &str| {
        let mut s = open.repeat(depth);
        s.push('0');
        s.push_str(&close.repeat(depth));
        s
    };
    for inner in [nested("[", "]"), nested("{\"a\":", "}")] {
        let webhook = format!(
            "{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\
             \"request\":{{\"uid\":\"u\",\"object\":{inner}}}}}"
        );
        assert_refused(service, "/webhook", webhook.as_bytes(), "nested review");
        let filter = format!("{{\"Pod\":{inner},\"NodeNames\":[]}}");
        assert_refused(service, "/filter", filter.as_bytes(), "nested pod");
        // An unknown field is skipped (serde_json's ignore is iterative
        // for arrays) or refused at its recursion limit (objects): either
        // way, no deep recursion, and an answer.
        let unknown = format!(
            "{{\"Extra\":{inner},\"Pod\":{},\"NodeNames\":[\"{GPU_NODE}\"]}}",
            slice_pod()
        );
        let (status, answer) = service.request("POST", "/filter", unknown.as_bytes());
        let answer = String::from_utf8_lossy(&answer);
        match status {
            200 => assert!(
                answer.contains(&format!("\"NodeNames\":[\"{GPU_NODE}\"]")),
                "{answer}"
            ),
            400 => assert!(answer.contains("recursion limit"), "{answer}"),
            other => panic!("nested unknown field: {other} {answer}"),
        }
        let bind = format!("{{\"PodName\":{inner}}}");
        assert_refused(service, "/bind", bind.as_bytes(), "nested bind");
    }
}

/// The first TLS bytes a real client sends (its ClientHello).
fn client_hello(service: &Service) -> Vec<u8> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(service.tls.clone(), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    hello
}

fn truncated_tls_handshakes(service: &Service) {
    let hello = client_hello(service);
    let plaintext: &[u8] =
        b"POST /filter HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}";
    let hostile: Vec<&[u8]> = vec![
        b"",
        &hello[..1],
        &hello[..5],
        &hello[..hello.len() / 2],
        &hello[..hello.len() - 1],
        plaintext,
        b"\x16\x03\x01\xff\xff",
        b"\x16\x03\x01\x00\x05hello",
    ];
    // Sent and closed at once, then sent and left hanging: the server
    // ends each (after its 3 s handshake timeout for the hanging ones).
    for bytes in &hostile {
        let mut tcp = service.tcp();
        let _ = tcp.write_all(bytes);
        let _ = tcp.shutdown(std::net::Shutdown::Write);
        read_all(&mut tcp);
    }
    let hanging: Vec<TcpStream> = hostile
        .iter()
        .map(|bytes| {
            let mut tcp = service.tcp();
            let _ = tcp.write_all(bytes);
            tcp
        })
        .collect();
    service.assert_still_serving("with stalled TLS handshakes open");
    for mut tcp in hanging {
        read_all(&mut tcp);
    }
}

fn slow_loris(service: &Service) {
    // Half a request head, then nothing: the server answers 408 or closes
    // after its 5 s request-head timeout.
    let heads: Vec<_> = (0..MAX_OPEN / 2)
        .map(|i| {
            let mut stream = service.tls();
            let path = ["/webhook", "/filter", "/bind"][i % 3];
            stream
                .write_all(format!("POST {path} HTTP/1.1\r\nHost: loc").as_bytes())
                .unwrap();
            stream.flush().unwrap();
            stream
        })
        .collect();
    // A full head and part of the body, then nothing: 408 after
    // `BODY_TIMEOUT` (before it, such a client held its connection and a
    // handler for ever).
    let bodies: Vec<_> = (0..MAX_OPEN / 2)
        .map(|i| {
            let mut stream = service.tls();
            let path = ["/webhook", "/filter", "/bind"][i % 3];
            stream
                .write_all(
                    format!(
                        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{{\"Pod\""
                    )
                    .as_bytes(),
                )
                .unwrap();
            stream.flush().unwrap();
            stream
        })
        .collect();
    service.assert_still_serving("with slow-loris clients open");
    for mut stream in heads.into_iter().chain(bodies) {
        let answer = parse_response(&read_all(&mut stream));
        assert!(
            answer
                .as_ref()
                .is_none_or(|(status, _)| (400..500).contains(status)),
            "slow-loris answered {:?}",
            answer.map(|a| a.0)
        );
    }
}

/// A named group of hostile requests.
type Case = (&'static str, fn(&Service));

#[test]
fn hostile_clients_get_4xx_and_the_service_stays_up_in_bounded_memory() {
    let service = Service::start();
    service.assert_still_serving("at start");
    let before = rss();
    let cases: [Case; 7] = [
        ("malformed JSON", malformed_json),
        ("wrong kinds and versions", wrong_kinds_and_versions),
        ("10 MB bodies", ten_megabyte_bodies),
        ("100,000 node names", a_hundred_thousand_node_names),
        ("deeply nested JSON", deeply_nested_json),
        ("truncated TLS handshakes", truncated_tls_handshakes),
        ("slow-loris clients", slow_loris),
    ];
    for (name, case) in cases {
        case(&service);
        service.assert_still_serving(&format!("after {name}"));
    }
    let grown = rss().saturating_sub(before);
    assert!(
        grown < memory_bound(),
        "resident memory grew by {} MiB, bound {} MiB",
        grown >> 20,
        memory_bound() >> 20
    );
}

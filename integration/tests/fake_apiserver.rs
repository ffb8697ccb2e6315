//! The fake kube-apiserver against kube-rs: watcher + reflector through
//! 410s and cut watches, optimistic concurrency, the three patch formats,
//! binding, selectors, watch protocol details, Status errors, discovery and
//! fault injection. Every wait is on an event with a deadline.

// Test helpers outside #[test] fns: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use integration::fake_apiserver::{FakeApiServer, FaultSpec, Options};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch as signal;

const DEADLINE: Duration = Duration::from_secs(30);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start() -> (FakeApiServer, kube::Client) {
    let server = FakeApiServer::start(loopback()).await.unwrap();
    let client = server.client().await.unwrap();
    (server, client)
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    }))
    .unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap()
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => {
            (status.code, status.reason.clone(), status.message.clone())
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// A reflector over a watcher, polled in the background; `changed` ticks
/// after every item the stream yields.
struct Mirror {
    reader: reflector::Store<Pod>,
    changed: signal::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Mirror {
    fn start(api: Api<Pod>) -> Self {
        let (reader, writer) = reflector::store();
        let (tx, changed) = signal::channel(0u64);
        let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
        let task = tokio::spawn(async move {
            let mut stream = pin!(stream);
            while stream.next().await.is_some() {
                tx.send_modify(|n| *n += 1);
            }
        });
        Self {
            reader,
            changed,
            task,
        }
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .reader
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        names.sort();
        names
    }

    /// Waits until the mirrored pods satisfy `condition`.
    async fn wait(&mut self, what: &str, condition: impl Fn(&[std::sync::Arc<Pod>]) -> bool) {
        let reader = self.reader.clone();
        let waited = tokio::time::timeout(
            DEADLINE,
            self.changed.wait_for(|_| condition(&reader.state())),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        assert!(
            waited,
            "mirror never reached: {what}; has {:?}",
            self.names()
        );
    }

    async fn wait_names(&mut self, want: &[&str]) {
        let want: Vec<String> = want.iter().map(ToString::to_string).collect();
        self.wait(&format!("{want:?}"), |pods| {
            let mut names: Vec<String> = pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            names.sort();
            names == want
        })
        .await;
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn watcher_and_reflector_resync_through_a_forced_410() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["p1", "p2"] {
        pods.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let mut mirror = Mirror::start(Api::all(client.clone()));
    mirror.wait_names(&["p1", "p2"]).await;
    server
        .wait_for(DEADLINE, |s| s.open_watches >= 1)
        .await
        .unwrap();

    // Hold the watcher off while the cluster changes, then drop history:
    // its next watch names a resourceVersion that is gone.
    server.inject(FaultSpec::fail("GET", "/api/v1/pods", 10_000, 503).only_watches(true));
    server.cut_watches();
    server
        .wait_for(DEADLINE, |s| s.faults_fired >= 1)
        .await
        .unwrap();
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    pods.create(&PostParams::default(), &pod("p3"))
        .await
        .unwrap();
    let labelled = json!({"metadata": {"labels": {"moved": "yes"}}});
    pods.patch("p2", &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .unwrap();
    server.compact().unwrap();
    let lists_before = server.stats().lists;
    server.clear_faults();

    mirror
        .wait("p2 labelled, p1 gone, p3 present", |pods| {
            let names: Vec<_> = pods
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            names.len() == 2
                && names.contains(&"p3".to_string())
                && pods.iter().any(|p| {
                    p.metadata.name.as_deref() == Some("p2")
                        && p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("moved"))
                            .map(String::as_str)
                            == Some("yes")
                })
        })
        .await;
    let stats = server.stats();
    assert!(
        stats.expired_sent >= 1,
        "the watcher was never told 410: {stats:?}"
    );
    assert!(
        stats.lists > lists_before,
        "the watcher did not relist: {stats:?}"
    );
    // And it keeps following live changes afterwards.
    pods.create(&PostParams::default(), &pod("p4"))
        .await
        .unwrap();
    mirror.wait_names(&["p2", "p3", "p4"]).await;
    server.shutdown().await;
}

#[tokio::test]
async fn watcher_and_reflector_resume_after_cut_watches_without_relisting() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut mirror = Mirror::start(pods.clone());
    mirror.wait_names(&[]).await;
    let mut want: Vec<String> = Vec::new();
    for i in 0..5 {
        let started = server.stats().watches_started;
        server
            .wait_for(DEADLINE, |s| s.open_watches >= 1)
            .await
            .unwrap();
        server.cut_watches();
        let name = format!("cut-{i}");
        pods.create(&PostParams::default(), &pod(&name))
            .await
            .unwrap();
        want.push(name);
        let refs: Vec<&str> = want.iter().map(String::as_str).collect();
        mirror.wait_names(&refs).await;
        server
            .wait_for(DEADLINE, |s| s.watches_started > started)
            .await
            .unwrap();
    }
    let deleted = want.remove(0);
    pods.delete(&deleted, &DeleteParams::default())
        .await
        .unwrap();
    let refs: Vec<&str> = want.iter().map(String::as_str).collect();
    mirror.wait_names(&refs).await;
    let stats = server.stats();
    assert_eq!(stats.watch_cuts, 5);
    assert_eq!(stats.expired_sent, 0, "{stats:?}");
    assert_eq!(stats.lists, 1, "re-watches resume from history: {stats:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_updates_with_a_stale_resource_version_get_409() {
    let (server, client) = start().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let snapshot = nodes.get("n1").await.unwrap();

    // Two writers from the same snapshot: exactly one wins.
    let mut a = snapshot.clone();
    a.metadata.labels = Some([("writer".to_string(), "a".to_string())].into());
    let mut b = snapshot.clone();
    b.metadata.labels = Some([("writer".to_string(), "b".to_string())].into());
    let pp = PostParams::default();
    let (ra, rb) = tokio::join!(nodes.replace("n1", &pp, &a), nodes.replace("n1", &pp, &b));
    let results = [ra, rb];
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    let loser = results.into_iter().find(Result::is_err).unwrap();
    let (code, reason, message) = api_error(loser);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.contains("the object has been modified"),
        "{message}"
    );

    // A merge patch that carries the stale resourceVersion is refused too.
    let stale_rv = snapshot.metadata.resource_version.clone().unwrap();
    let patch = json!({"metadata": {"resourceVersion": stale_rv, "annotations": {"x": "1"}}});
    let (code, _, _) = api_error(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 409);

    // Read-modify-write loops that retry on 409 lose no increment.
    let writers = (0..6).map(|_| {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            loop {
                let mut current = nodes.get("n1").await.unwrap();
                let count: u32 = annotations_of(&current)
                    .get("count")
                    .map_or(0, |c| c.parse().unwrap());
                current
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert("count".into(), (count + 1).to_string());
                match nodes.replace("n1", &PostParams::default(), &current).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        })
    });
    for w in writers.collect::<Vec<_>>() {
        w.await.unwrap();
    }
    let done = nodes.get("n1").await.unwrap();
    assert_eq!(
        annotations_of(&done).get("count").map(String::as_str),
        Some("6")
    );
    server.shutdown().await;
}

fn annotations_of(node: &Node) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

#[tokio::test]
async fn patches_on_annotations_behave_like_the_real_server() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut p = pod("p");
    p.metadata.annotations = Some([("a".into(), "1".into()), ("b".into(), "2".into())].into());
    pods.create(&PostParams::default(), &p).await.unwrap();
    let pp = PatchParams::default();

    let merge = json!({"metadata": {"annotations": {"a": null, "c": "3"}}});
    let out = pods.patch("p", &pp, &Patch::Merge(&merge)).await.unwrap();
    assert_eq!(
        annotations(&out),
        [("b".into(), "2".into()), ("c".into(), "3".into())].into()
    );

    let strategic = json!({"metadata": {"annotations": {"b": null, "d": "4"}}});
    let out = pods
        .patch("p", &pp, &Patch::Strategic(&strategic))
        .await
        .unwrap();
    assert_eq!(
        annotations(&out),
        [("c".into(), "3".into()), ("d".into(), "4".into())].into()
    );

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/annotations/c", "value": "3"},
        {"op": "remove", "path": "/metadata/annotations/c"},
        {"op": "add", "path": "/metadata/annotations/gpuslice.io~1node", "value": "n1"}
    ]))
    .unwrap();
    let out = pods
        .patch("p", &pp, &Patch::<Value>::Json(ops))
        .await
        .unwrap();
    assert_eq!(
        annotations(&out),
        [
            ("d".into(), "4".into()),
            ("gpuslice.io/node".into(), "n1".into())
        ]
        .into()
    );

    // A failing `test` applies nothing: 422, same object, same version.
    let before = pods.get("p").await.unwrap();
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "remove", "path": "/metadata/annotations/d"},
        {"op": "test", "path": "/metadata/annotations/gpuslice.io~1node", "value": "other"}
    ]))
    .unwrap();
    let (code, reason, _) = api_error(pods.patch("p", &pp, &Patch::<Value>::Json(failing)).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    let after = pods.get("p").await.unwrap();
    assert_eq!(after, before);

    // JSON patch `add` below a missing map fails as on the real server.
    pods.create(&PostParams::default(), &pod("bare"))
        .await
        .unwrap();
    let add: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations/x", "value": "1"}]),
    )
    .unwrap();
    let (code, _, _) = api_error(pods.patch("bare", &pp, &Patch::<Value>::Json(add)).await);
    assert_eq!(code, 422);

    // Status is a subresource: the main endpoint ignores it.
    let running = json!({"status": {"phase": "Running"}});
    let out = pods.patch("p", &pp, &Patch::Merge(&running)).await.unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Pending"));
    let out = pods
        .patch_status("p", &pp, &Patch::Merge(&running))
        .await
        .unwrap();
    assert_eq!(out.status.unwrap().phase.as_deref(), Some("Running"));
    server.shutdown().await;
}

#[tokio::test]
async fn binding_sets_the_node_and_binding_twice_is_409() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "namespace": "default"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
    });
    let status: Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(status["status"], "Success");
    let bound = pods.get("p").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-a"));
    let conditions = bound.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );

    let again = pods
        .create_subresource::<_, Value>("binding", "p", &PostParams::default(), &binding)
        .await;
    let (code, reason, message) = api_error(again);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.contains("is already assigned to node \"node-a\""),
        "{message}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists_and_watches() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, labels) in [
        ("web-1", json!({"app": "web", "tier": "front"})),
        ("web-2", json!({"app": "web"})),
        ("db-1", json!({"app": "db", "tier": "back"})),
    ] {
        let mut p = pod(name);
        p.metadata.labels = Some(serde_json::from_value(labels).unwrap());
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let names = |list: kube::core::ObjectList<Pod>| {
        let mut n: Vec<String> = list
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        n.sort();
        n
    };
    let cases = [
        ("app=web", vec!["web-1", "web-2"]),
        ("app==db", vec!["db-1"]),
        ("app!=web", vec!["db-1"]),
        ("tier in (front,back)", vec!["db-1", "web-1"]),
        ("tier notin (front)", vec!["db-1", "web-2"]),
        ("tier", vec!["db-1", "web-1"]),
        ("!tier", vec!["web-2"]),
        ("app=web,!tier", vec!["web-2"]),
    ];
    for (selector, want) in cases {
        let got = names(
            pods.list(&ListParams::default().labels(selector))
                .await
                .unwrap(),
        );
        assert_eq!(got, want, "labelSelector {selector}");
    }

    let binding = |node: &str| json!({"target": {"kind": "Node", "name": node}});
    pods.create_subresource::<_, Value>("binding", "db-1", &PostParams::default(), &binding("n1"))
        .await
        .unwrap();
    let all_pods: Api<Pod> = Api::all(client.clone());
    let field_cases = [
        ("spec.nodeName=n1", vec!["db-1"]),
        ("spec.nodeName=", vec!["web-1", "web-2"]),
        ("spec.nodeName!=n1,metadata.name!=web-2", vec!["web-1"]),
        (
            "spec.schedulerName=default-scheduler,status.phase=Pending",
            vec!["db-1", "web-1", "web-2"],
        ),
        ("status.phase!=Pending", vec![]),
        ("metadata.name=web-2", vec!["web-2"]),
        ("metadata.namespace=kube-system", vec![]),
    ];
    for (selector, want) in field_cases {
        let got = names(
            all_pods
                .list(&ListParams::default().fields(selector))
                .await
                .unwrap(),
        );
        assert_eq!(got, want, "fieldSelector {selector}");
    }
    let (code, _, message) = api_error(
        pods.list(&ListParams::default().fields("spec.containers=x"))
            .await,
    );
    assert_eq!(code, 400);
    assert!(message.contains("field label not supported"), "{message}");
    let (code, _, _) = api_error(pods.list(&ListParams::default().labels("app in web")).await);
    assert_eq!(code, 400);

    // A watch on `spec.nodeName=n2` sees a pod arrive when it is bound
    // there (ADDED), not the binding of another pod.
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = all_pods
        .watch(
            &WatchParams::default()
                .fields("spec.nodeName=n2")
                .labels("app=web"),
            &rv,
        )
        .await
        .unwrap();
    let mut stream = pin!(stream);
    pods.create_subresource::<_, Value>("binding", "web-2", &PostParams::default(), &binding("n3"))
        .await
        .unwrap();
    pods.create_subresource::<_, Value>("binding", "web-1", &PostParams::default(), &binding("n2"))
        .await
        .unwrap();
    let first = loop {
        let event = tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if !matches!(event, WatchEvent::Bookmark(_)) {
            break event;
        }
    };
    match first {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("web-1")),
        other => panic!("expected web-1 ADDED, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn watch_streams_bookmarks_honours_timeouts_and_expires_old_versions() {
    let options = Options {
        bookmark_interval: Duration::from_millis(50),
        ..Options::default()
    };
    let server = FakeApiServer::start_with(loopback(), options)
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let rv = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let stream = nodes.watch(&WatchParams::default(), &rv).await.unwrap();
    let mut stream = pin!(stream);
    nodes
        .create(&PostParams::default(), &node("n2"))
        .await
        .unwrap();
    let mut saw_added = false;
    let bookmark_rv = loop {
        match tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(n)) => {
                assert_eq!(n.metadata.name.as_deref(), Some("n2"));
                saw_added = true;
            }
            Some(WatchEvent::Bookmark(b)) if saw_added => break b.metadata.resource_version,
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    let latest = nodes
        .get("n2")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    assert_eq!(
        bookmark_rv, latest,
        "a bookmark names the newest version seen"
    );

    // timeoutSeconds ends the stream.
    let short = nodes
        .watch(
            &WatchParams::default().disable_bookmarks().timeout(1),
            &latest,
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(DEADLINE, short.collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(ended.is_empty(), "{ended:?}");

    // After a compaction an old resourceVersion is an ERROR event with a
    // 410 Status inside a 200 stream.
    server.compact().unwrap();
    let expired = nodes
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(DEADLINE, expired.collect::<Vec<_>>())
        .await
        .unwrap();
    match events.as_slice() {
        [Ok(WatchEvent::Error(status))] => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected one 410 ERROR event, got {other:?}"),
    }
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.query.contains("watch=true") && r.status == 200)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn errors_are_status_objects_with_real_codes_and_reasons() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (code, reason, message) = api_error(pods.get("nope").await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", "pods \"nope\" not found")
    );
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let (code, reason, message) = api_error(pods.create(&PostParams::default(), &pod("p")).await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (409, "AlreadyExists", "pods \"p\" already exists")
    );
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "missing");
    let (code, _, message) = api_error(elsewhere.create(&PostParams::default(), &pod("p")).await);
    assert_eq!(
        (code, message.as_str()),
        (404, "namespaces \"missing\" not found")
    );
    let mut renamed = pods.get("p").await.unwrap();
    renamed.metadata.name = Some("q".into());
    let (code, reason, _) = api_error(pods.replace("p", &PostParams::default(), &renamed).await);
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let (code, _, message) = api_error(leases.get("l").await);
    assert_eq!(
        (code, message.as_str()),
        (404, "leases.coordination.k8s.io \"l\" not found")
    );
    server.shutdown().await;
}

#[tokio::test]
async fn leases_events_and_generate_name_work_like_the_real_server() {
    let (server, client) = start().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "gpuslice-scheduler"},
        "spec": {"holderIdentity": "host_1", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().lease_transitions = Some(1);
    leases
        .replace("gpuslice-scheduler", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let (code, _, _) = api_error(
        leases
            .replace("gpuslice-scheduler", &PostParams::default(), &created)
            .await,
    );
    assert_eq!(code, 409, "a stale lease holder must lose");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"generateName": "p."},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "FilteringSucceed", "message": "ok", "type": "Normal",
        "source": {"component": "gpuslice"}
    }))
    .unwrap();
    let made = events.create(&PostParams::default(), &event).await.unwrap();
    let name = made.metadata.name.unwrap();
    assert!(name.starts_with("p.") && name.len() == 7, "{name}");
    let found = events
        .list(
            &ListParams::default()
                .fields("involvedObject.name=p,reason=FilteringSucceed,source=gpuslice"),
        )
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn discovery_finds_core_resources_and_coordination() {
    let (server, client) = start().await;
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    let core = discovery.get("").unwrap();
    let names: Vec<String> = core
        .recommended_resources()
        .into_iter()
        .map(|(r, _)| r.plural)
        .collect();
    for plural in ["pods", "nodes", "events", "resourcequotas", "namespaces"] {
        assert!(
            names.contains(&plural.to_string()),
            "{plural} missing from {names:?}"
        );
    }
    let coordination = discovery.get("coordination.k8s.io").unwrap();
    assert!(
        coordination
            .recommended_resources()
            .iter()
            .any(|(r, _)| r.plural == "leases")
    );
    server.shutdown().await;
}

/// One HTTP/1.1 request over a fresh connection; returns status and body.
async fn raw_http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    raw_http_typed(addr, method, path, "application/json", body).await
}

async fn raw_http_typed(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[tokio::test]
async fn injected_faults_fail_or_delay_matching_requests() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();

    server.inject(FaultSpec::fail(
        "GET",
        "/api/v1/namespaces/default/pods",
        2,
        500,
    ));
    for _ in 0..2 {
        let (code, reason, _) = api_error(pods.get("p").await);
        assert_eq!((code, reason.as_str()), (500, "InternalError"));
    }
    pods.get("p").await.unwrap();

    // Through the admin route: a 403 on PATCH only (kube-rs itself retries 429/503/504).
    let spec = json!({"method": "PATCH", "pathPrefix": "/api/v1/namespaces/default/pods/p", "count": 1, "status": 403});
    let (status, _) = raw_http(server.addr(), "POST", "/fake/faults", &spec.to_string()).await;
    assert_eq!(status, 204);
    pods.get("p").await.unwrap();
    let patch = json!({"metadata": {"labels": {"a": "b"}}});
    let (code, _, _) = api_error(
        pods.patch("p", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 403);
    pods.patch("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    // A delayed request is still pending after an undelayed one finished.
    server.inject(FaultSpec::delay(
        "GET",
        "/api/v1/namespaces/default/pods/p",
        1,
        Duration::from_secs(3),
    ));
    let slow = tokio::spawn({
        let pods = pods.clone();
        async move { pods.get("p").await }
    });
    server
        .wait_for(DEADLINE, |s| s.faults_fired >= 4)
        .await
        .unwrap();
    pods.list(&ListParams::default()).await.unwrap();
    assert!(
        !slow.is_finished(),
        "the delayed GET finished before an undelayed list"
    );
    slow.await.unwrap().unwrap();

    // Admin routes: cut watches, compact, stats.
    let (status, _) = raw_http(server.addr(), "POST", "/fake/watches/cut", "").await;
    assert_eq!(status, 204);
    let (status, _) = raw_http(server.addr(), "POST", "/fake/compact", "").await;
    assert_eq!(status, 204);
    let (status, body) = raw_http(server.addr(), "GET", "/fake/stats", "").await;
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stats["watchCuts"], 1);
    assert_eq!(stats["faultsFired"], 4);
    let (status, body) = raw_http(
        server.addr(),
        "GET",
        "/api/v1/namespaces/default/pods/zz",
        "",
    )
    .await;
    assert_eq!(status, 404);
    let not_found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(not_found["kind"], "Status");
    assert_eq!(not_found["status"], "Failure");
    assert_eq!(not_found["details"]["name"], "zz");
    let (status, body) = raw_http(server.addr(), "GET", "/openapi/v2", "").await;
    assert_eq!(status, 404);
    assert!(
        body.contains("the server could not find the requested resource"),
        "{body}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bodies_other_than_json_are_unsupported_media_types() {
    let (server, _client) = start().await;
    let (status, body) = raw_http_typed(
        server.addr(),
        "POST",
        "/api/v1/namespaces",
        "application/vnd.kubernetes.protobuf",
        "k8s\u{0}",
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let status_object: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status_object["reason"], "UnsupportedMediaType");
    let (status, _) = raw_http_typed(
        server.addr(),
        "PATCH",
        "/api/v1/namespaces/default",
        "application/apply-patch+yaml",
        "metadata: {}",
    )
    .await;
    assert_eq!(status, 415);
    server.shutdown().await;
}

#[tokio::test]
async fn a_streaming_list_watcher_syncs_from_initial_events() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["s1", "s2"] {
        pods.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let (tx, mut changed) = signal::channel(0u64);
    let config = watcher::Config::default().streaming_lists();
    let stream = reflector(writer, watcher(pods.clone(), config)).default_backoff();
    let task = tokio::spawn(async move {
        let mut stream = pin!(stream);
        while stream.next().await.is_some() {
            tx.send_modify(|n| *n += 1);
        }
    });
    let synced =
        tokio::time::timeout(DEADLINE, changed.wait_for(|_| reader.state().len() == 2)).await;
    assert!(
        synced.is_ok_and(|r| r.is_ok()),
        "initial events never completed the list"
    );
    pods.delete("s1", &DeleteParams::default()).await.unwrap();
    let followed =
        tokio::time::timeout(DEADLINE, changed.wait_for(|_| reader.state().len() == 1)).await;
    assert!(followed.is_ok_and(|r| r.is_ok()));
    assert_eq!(server.stats().lists, 0, "a streaming list never calls list");
    task.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn dry_run_writes_are_answered_but_not_stored() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let answered = pods.create(&dry, &pod("ghost")).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("ghost"));
    assert_eq!(api_error(pods.get("ghost").await).0, 404);
    pods.create(&PostParams::default(), &pod("real"))
        .await
        .unwrap();
    let patch = json!({"metadata": {"labels": {"a": "b"}}});
    let dry_patch = PatchParams::default().dry_run();
    let patched = pods
        .patch("real", &dry_patch, &Patch::Merge(&patch))
        .await
        .unwrap();
    assert!(patched.metadata.labels.is_some());
    assert!(pods.get("real").await.unwrap().metadata.labels.is_none());
    let dry_delete = DeleteParams::default().dry_run();
    pods.delete("real", &dry_delete).await.unwrap();
    pods.get("real").await.unwrap();
    assert_eq!(server.stats().watches_started, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn graceful_pod_deletion_waits_for_a_grace_zero_delete_when_enabled() {
    let options = Options {
        graceful_pod_deletion: true,
        ..Options::default()
    };
    let server = FakeApiServer::start_with(loopback(), options)
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    let binding = json!({"target": {"kind": "Node", "name": "n1"}});
    pods.create_subresource::<_, Value>("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    let rv = pods
        .get("p")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = pods
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap();
    let mut stream = pin!(stream);

    let first = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let marked = first
        .left()
        .expect("a graceful delete answers with the pod");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));

    let event = tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(event, Some(WatchEvent::Modified(_))), "{event:?}");
    pods.get("p").await.unwrap();

    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let event = tokio::time::timeout(DEADLINE, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(event, Some(WatchEvent::Deleted(_))), "{event:?}");
    assert_eq!(api_error(pods.get("p").await).0, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn bodies_up_to_three_mebibytes_are_accepted() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut big = pod("big");
    big.metadata.annotations = Some([("blob".into(), "x".repeat(1024 * 1024))].into());
    let created = pods.create(&PostParams::default(), &big).await.unwrap();
    assert_eq!(annotations(&created)["blob"].len(), 1024 * 1024);
    let mut huge = pod("huge");
    huge.metadata.annotations = Some([("blob".into(), "x".repeat(4 * 1024 * 1024))].into());
    let (code, reason, _) = api_error(pods.create(&PostParams::default(), &huge).await);
    assert_eq!((code, reason.as_str()), (413, "RequestEntityTooLarge"));
    server.shutdown().await;
}

/// Prints throughput figures; run with
/// `cargo test -p integration --test fake_apiserver -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, not a check"]
async fn measure_create_watch_and_list_throughput() {
    const PODS: usize = 2000;
    const WRITERS: usize = 8;
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut mirror = Mirror::start(Api::all(client.clone()));
    mirror.wait_names(&[]).await;
    let started = std::time::Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let pods = pods.clone();
            tokio::spawn(async move {
                for i in (w..PODS).step_by(WRITERS) {
                    pods.create(&PostParams::default(), &pod(&format!("load-{i}")))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let created = started.elapsed();
    mirror.wait("all pods mirrored", |p| p.len() == PODS).await;
    let mirrored = started.elapsed();
    let listing = std::time::Instant::now();
    let listed = pods.list(&ListParams::default()).await.unwrap();
    let list_time = listing.elapsed();
    assert_eq!(listed.items.len(), PODS);
    let raw = std::time::Instant::now();
    let (status, body) =
        raw_http(server.addr(), "GET", "/api/v1/namespaces/default/pods", "").await;
    let raw_time = raw.elapsed();
    assert_eq!(status, 200);
    println!(
        "{PODS} creates by {WRITERS} writers: {created:?} ({:.0}/s); reflector complete after {mirrored:?}; \
         list of {PODS} via kube-rs: {list_time:?}, raw HTTP ({} bytes): {raw_time:?}",
        PODS as f64 / created.as_secs_f64(),
        body.len()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn lists_page_with_limit_and_continue_like_the_real_server() {
    let options = Options {
        history_limit: 3,
        ..Options::default()
    };
    let server = FakeApiServer::start_with(loopback(), options)
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}")))
            .await
            .unwrap();
    }
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let names = |l: &kube::api::ObjectList<Pod>| -> Vec<String> {
        l.items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    assert_eq!(names(&first), ["p0", "p1"]);
    let rv = first.metadata.resource_version.clone().unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    let second = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["p2", "p3"]);
    assert_eq!(
        second.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    let last = pods
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(&last), ["p4"]);
    assert!(last.metadata.continue_.as_deref().unwrap_or("").is_empty());
    // Without a limit, one page holds everything.
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        5
    );
    // A token that is not one is a 400.
    let (code, _, message) = api_error(
        pods.list(&ListParams::default().limit(2).continue_token("bogus"))
            .await,
    );
    assert_eq!(code, 400, "{message}");
    // A token older than the retained history is 410 Expired, as the real
    // server answers once etcd compacted the first page's revision.
    for i in 5..9 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}")))
            .await
            .unwrap();
    }
    let (code, reason, message) = api_error(
        pods.list(&ListParams::default().limit(2).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"), "{message}");
    assert!(
        message.contains("continue parameter is too old"),
        "{message}"
    );

    // kube-rs's watcher lists 500 at a time and sees all of a larger list.
    let nodes: Api<Node> = Api::all(client);
    for i in 0..1_203 {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i:04}")))
            .await
            .unwrap();
    }
    let lists_before = server.stats().lists;
    let (reader, writer) = reflector::store::<Node>();
    let stream = reflector(writer, watcher(nodes, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let drive = tokio::spawn(async move {
        let mut stream = pin!(stream);
        while stream.try_next().await.unwrap().is_some() {}
    });
    tokio::time::timeout(DEADLINE, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 1_203);
    let lists = server.stats().lists - lists_before;
    assert_eq!(lists, 3, "1,203 nodes in pages of 500 take 3 lists");
    drive.abort();
    server.shutdown().await;
}

/// The list and watch bodies as bytes on the wire: list items without
/// `kind`/`apiVersion` (as the real server's typed lists), watch events as
/// `{"type", "object"}` lines carrying the whole object, the same bytes for
/// every watcher (the fake serializes an event's object once and splices it
/// into each watcher's line, which this checks from the outside).
#[tokio::test]
async fn list_and_watch_bodies_on_the_wire_match_the_real_server() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let get = |path: &str| {
        let client = client.clone();
        let request = http::Request::get(path).body(Vec::new()).unwrap();
        async move { client.request_text(request).await.unwrap() }
    };

    let list: Value = serde_json::from_str(&get("/api/v1/namespaces/default/pods").await).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!rv.is_empty());
    let items = list["items"].as_array().unwrap();
    let names: Vec<&str> = items
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    for item in items {
        let item = item.as_object().unwrap();
        assert!(
            !item.contains_key("kind") && !item.contains_key("apiVersion"),
            "{item:?}"
        );
        assert!(item.contains_key("spec"), "{item:?}");
    }

    // Two watches from the list's version; each ends at its timeout, after
    // the one change below.
    let watch =
        format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}&timeoutSeconds=5");
    let (first, second) = (get(&watch), get(&watch));
    let (first, second, ()) = tokio::join!(first, second, async {
        server
            .wait_for(DEADLINE, |s| s.open_watches >= 2)
            .await
            .unwrap();
        let patch = json!({"metadata": {"labels": {"app": "x"}}});
        pods.patch("a", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    });
    // Blank lines are the stream's heartbeats; each watch has its own timer.
    let events = |body: &str| -> Vec<String> {
        body.lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    };
    let lines = events(&first);
    assert_eq!(lines, events(&second), "two watchers got different events");
    assert_eq!(lines.len(), 1, "{first}");
    let event: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(event.as_object().unwrap().len(), 2, "{event}");
    assert_eq!(event["type"], "MODIFIED");
    assert_eq!(event["object"]["kind"], "Pod");
    assert_eq!(event["object"]["apiVersion"], "v1");
    assert_eq!(event["object"]["metadata"]["name"], "a");
    assert_eq!(event["object"]["metadata"]["labels"]["app"], "x");
    server.shutdown().await;
}

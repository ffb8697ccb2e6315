//! The real control plane as processes on 127.0.0.1: etcd, kube-apiserver
//! (Node,RBAC authorization; the admission plugins of a real cluster),
//! kube-controller-manager (quota status, service accounts, namespaces,
//! garbage collection) and any number of kube-schedulers started with a
//! configuration the caller gives (the chart's). Every process logs to a file
//! in the cluster's folder; a failure to start quotes the end of that log.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

use super::binaries::Binaries;
use super::pki::{CertFiles, Pki};

/// The admission plugins turned on, as a real cluster has them.
pub const ADMISSION_PLUGINS: &str = "NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,\
NodeRestriction,PodSecurity,Priority,ResourceQuota,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,\
ValidatingAdmissionPolicy,MutatingAdmissionPolicy";

/// The DRA feature gates DRA mode needs, set on kube-apiserver,
/// kube-scheduler and kube-controller-manager alike. In v1.37.2
/// (`pkg/features/kube_features.go`, and each binary's `--help`):
/// `DynamicResourceAllocation` and `DRAExtendedResource` are GA and locked on
/// (naming a locked gate only adds a warning), `DRAConsumableCapacity`
/// (KEP-5075: many claims consume one device's `memory` and `cores`) is beta
/// and on by default. It is named here so a change of default cannot turn DRA
/// mode off unnoticed. The resource-claim controller, which creates a pod's
/// claims from its templates, is among kube-controller-manager's `*`.
pub const DRA_FEATURE_GATES: &str = "DRAConsumableCapacity=true";

/// The range kube-apiserver allocates ClusterIPs from. It must be given, and
/// nothing here may ever dial an address in it.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";

pub use node_daemon::testkit::free_port;

/// One child process, killed when dropped.
#[derive(Debug)]
pub struct Process {
    /// What it is (for messages).
    pub name: String,
    /// Where its stdout/stderr go.
    pub log: PathBuf,
    run: Run,
}

/// How a [`Process`] runs: once, or restarted whenever it exits by itself.
#[derive(Debug)]
enum Run {
    Once(Child),
    Restarting(Restarter),
}

/// The kubelet's restart back-off for a container that exits
/// (`restartPolicy: Always`, as every Deployment's pods have): the first
/// restart after `initial`, each next one after twice the last, at most
/// `max`; back to `initial` once the process ran for `reset` (Kubernetes
/// documents 10 s, doubling, capped at 300 s, reset after 10 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartBackoff {
    /// Delay before the first restart.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// A run this long resets the delay to `initial`.
    pub reset: Duration,
}

impl RestartBackoff {
    /// The kubelet's documented back-off.
    pub const KUBELET: Self = Self {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
        reset: Duration::from_secs(600),
    };
}

/// What the restarting thread and [`Process`] share.
#[derive(Debug, Default)]
struct Supervised {
    /// The current child's pid, while it has not been reaped.
    pid: Option<u32>,
    /// Set by [`Process::kill`]: no more restarts.
    stopped: bool,
    /// Restarts so far.
    restarts: u32,
}

/// The thread that waits for the child and starts it again.
#[derive(Debug)]
struct Restarter {
    shared: Arc<(Mutex<Supervised>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

fn lock(shared: &Mutex<Supervised>) -> MutexGuard<'_, Supervised> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts `binary` with stdout and stderr to `log` (appended to with
/// `append`, as a restarted container's log continues).
fn start_child(
    name: &str,
    binary: &Path,
    args: &[String],
    log: &Path,
    append: bool,
) -> Result<Child, String> {
    let out = File::options()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .map_err(|e| format!("{name}: {e}"))?;
    let err = out.try_clone().map_err(|e| format!("{name}: {e}"))?;
    Command::new(binary)
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {name} ({}): {e}", binary.display()))
}

impl Process {
    /// Starts `binary` with `args`, stdout and stderr to `<dir>/<name>.log`,
    /// without the in-cluster environment.
    ///
    /// # Errors
    /// The binary could not be started.
    pub fn spawn(name: &str, binary: &Path, args: &[String], dir: &Path) -> Result<Self, String> {
        let log = dir.join(format!("{name}.log"));
        let child = start_child(name, binary, args, &log, false)?;
        Ok(Self {
            name: name.to_owned(),
            log,
            run: Run::Once(child),
        })
    }

    /// [`Process::spawn`], started again with `backoff` whenever it exits
    /// by itself, as the kubelet restarts a Deployment's container (for
    /// example kube-scheduler, which exits when it loses its Lease). Each
    /// restart appends a line to the log. [`Process::kill`] ends it for
    /// good.
    ///
    /// # Errors
    /// The binary could not be started the first time.
    pub fn spawn_restarting(
        name: &str,
        binary: &Path,
        args: &[String],
        dir: &Path,
        backoff: RestartBackoff,
    ) -> Result<Self, String> {
        let log = dir.join(format!("{name}.log"));
        let first = start_child(name, binary, args, &log, false)?;
        let shared = Arc::new((
            Mutex::new(Supervised {
                pid: Some(first.id()),
                ..Supervised::default()
            }),
            Condvar::new(),
        ));
        let thread = {
            let shared = Arc::clone(&shared);
            let (who, binary, args, log) = (
                name.to_owned(),
                binary.to_owned(),
                args.to_vec(),
                log.clone(),
            );
            std::thread::Builder::new()
                .name(format!("restart-{name}"))
                .spawn(move || {
                    restart_loop(&shared, first, backoff, |status, delay| {
                        let note = |line: String| {
                            if let Ok(mut f) = File::options().append(true).open(&log) {
                                let _ = writeln!(f, "[harness] {line}");
                            }
                        };
                        note(format!(
                            "{who} exited ({status}); restarting after {delay:?}"
                        ));
                        start_child(&who, &binary, &args, &log, true)
                            .inspect_err(|e| note(format!("cannot restart: {e}")))
                    });
                })
                .map_err(|e| format!("{name}: {e}"))?
        };
        Ok(Self {
            name: name.to_owned(),
            log,
            run: Run::Restarting(Restarter {
                shared,
                thread: Some(thread),
            }),
        })
    }

    /// How often it was restarted (0 for [`Process::spawn`]).
    #[must_use]
    pub fn restarts(&self) -> u32 {
        match &self.run {
            Run::Once(_) => 0,
            Run::Restarting(r) => lock(&r.shared.0).restarts,
        }
    }

    /// Waits until it was restarted at least `n` times; false when the
    /// deadline passed first or it does not restart.
    #[must_use]
    pub fn wait_for_restarts(&self, n: u32, deadline: Duration) -> bool {
        let Run::Restarting(r) = &self.run else {
            return n == 0;
        };
        let (state, changed) = &*r.shared;
        let (guard, _) = changed
            .wait_timeout_while(lock(state), deadline, |s| s.restarts < n && !s.stopped)
            .unwrap_or_else(PoisonError::into_inner);
        guard.restarts >= n
    }

    /// `Some(reason)` when the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        if let Run::Restarting(r) = &self.run {
            // Stopped: killed, or a restart failed (its log says why).
            let stopped = lock(&r.shared.0).stopped;
            return stopped.then(|| {
                format!(
                    "{} is not running (killed, or it could not be restarted); {}",
                    self.name,
                    self.log_tail()
                )
            });
        }
        let Run::Once(child) = &mut self.run else {
            return None;
        };
        match child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited ({status}); {}",
                self.name,
                self.log_tail()
            )),
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", self.name)),
        }
    }

    /// The last lines of its log.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
        format!("last lines of {}:\n  {tail}", self.log.display())
    }

    /// Waits until the process printed the line `ready` (etcd and fake-cri
    /// do once they serve), failing when it exits or the deadline passes.
    ///
    /// # Errors
    /// It exited, or did not print the line in time; the message quotes its log.
    pub async fn wait_ready_line(&mut self, deadline: Duration) -> Result<(), String> {
        let what = format!("{} printing \"ready\"", self.name);
        self.wait_until(&what, deadline, |p| {
            std::fs::read_to_string(&p.log)
                .is_ok_and(|t| t.lines().any(|l| l == "ready"))
                .then_some(())
        })
        .await
    }

    /// Polls `probe` (100 ms apart: a child's output and exit raise no event
    /// here) until it gives a value, failing when the process exits or the
    /// deadline passes.
    ///
    /// # Errors
    /// It exited, or the probe gave nothing in time; the message quotes its log.
    pub async fn wait_until<T>(
        &mut self,
        what: &str,
        deadline: Duration,
        probe: impl Fn(&Self) -> Option<T>,
    ) -> Result<T, String> {
        let start = Instant::now();
        loop {
            if let Some(v) = probe(self) {
                return Ok(v);
            }
            if let Some(reason) = self.exited() {
                return Err(reason);
            }
            if start.elapsed() > deadline {
                return Err(format!(
                    "{what}: not within {deadline:?}; {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills it (SIGKILL) and reaps it; a restarting process is not
    /// started again.
    pub fn kill(&mut self) {
        match &mut self.run {
            Run::Once(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Run::Restarting(r) => {
                {
                    let mut state = lock(&r.shared.0);
                    state.stopped = true;
                    // The restarting thread's unreaped child: the thread
                    // clears the pid, under this lock, right after reaping.
                    let pid = state.pid.and_then(|p| i32::try_from(p).ok());
                    if let Some(pid) = pid.and_then(rustix::process::Pid::from_raw) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                    r.shared.1.notify_all();
                }
                if let Some(thread) = r.thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }

    /// The process id (of the current run, for a restarting process; 0
    /// between a restarting process's runs).
    #[must_use]
    pub fn id(&self) -> u32 {
        match &self.run {
            Run::Once(child) => child.id(),
            Run::Restarting(r) => lock(&r.shared.0).pid.unwrap_or(0),
        }
    }
}

/// The restarting thread: waits for `child`; unless stopped, waits out the
/// back-off (woken early by [`Process::kill`]) and starts the next run with
/// `restart(exit status, delay)`. Ends when stopped or a restart fails.
fn restart_loop(
    shared: &(Mutex<Supervised>, Condvar),
    mut child: Child,
    backoff: RestartBackoff,
    mut restart: impl FnMut(&str, Duration) -> Result<Child, String>,
) {
    let (state, changed) = shared;
    let mut delay = backoff.initial;
    loop {
        let started = Instant::now();
        // Reaping here while kill() may signal the pid: the pid could be
        // reused only in the instant between this wait and the lock below,
        // by a process this machine started in that instant.
        let status = child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        let mut guard = lock(state);
        guard.pid = None;
        if guard.stopped {
            return;
        }
        if started.elapsed() >= backoff.reset {
            delay = backoff.initial;
        }
        let waited = changed
            .wait_timeout_while(guard, delay, |s| !s.stopped)
            .unwrap_or_else(PoisonError::into_inner);
        guard = waited.0;
        if guard.stopped {
            return;
        }
        match restart(&status, delay) {
            Ok(next) => {
                guard.pid = Some(next.id());
                guard.restarts += 1;
                child = next;
                changed.notify_all();
            }
            Err(_) => {
                guard.stopped = true;
                changed.notify_all();
                return;
            }
        }
        delay = (delay * 2).min(backoff.max);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Who a kubeconfig authenticates as.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A client certificate.
    Certificate(CertFiles),
    /// A bearer token (a ServiceAccount's).
    Token(String),
}

/// What [`ControlPlane::start_with`] runs besides etcd and kube-apiserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Run kube-controller-manager's node lifecycle controller. Without a
    /// kubelet posting heartbeats it marks every Node `Unknown` after its
    /// grace period and taints it `node.kubernetes.io/unreachable`, so
    /// Node objects created directly through the API (the scheduler
    /// benchmark's) need it off, as kube-scheduler's own scheduler_perf runs
    /// without it.
    pub node_lifecycle: bool,
    /// Write kube-apiserver's audit log ([`super::audit::POLICY`]: every
    /// request, who sent it, no bodies) to `audit.log` in the control
    /// plane's folder ([`ControlPlane::audit_log`]). Off by default: it
    /// costs the API server a write per request.
    pub api_audit: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            node_lifecycle: true,
            api_audit: false,
        }
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    /// The binaries it runs.
    pub binaries: Binaries,
    /// Its PKI.
    pub pki: Pki,
    /// `https://127.0.0.1:PORT` of kube-apiserver.
    pub server: String,
    /// A cluster-admin kubeconfig (client certificate in `system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The kube-schedulers started so far (index = start order).
    pub schedulers: Vec<Process>,
    /// Their secure ports on 127.0.0.1 (same index).
    scheduler_ports: Vec<u16>,
    dir: PathBuf,
    /// The audit log, when [`Options::api_audit`] asked for one.
    audit_log: Option<PathBuf>,
    controller_manager: Option<Process>,
    apiserver: Process,
    etcd: Process,
}

/// kube-scheduler's `--authorization-always-allow-paths` with `/metrics`
/// beside its default three, so [`ControlPlane::scheduler_metrics`] can
/// scrape it without credentials.
pub const SCHEDULER_ALWAYS_ALLOW: &str =
    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics";

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager in `dir` and
    /// waits until the apiserver is ready and the `default` ServiceAccount
    /// exists (pods can be created).
    ///
    /// # Errors
    /// A component did not start; the message quotes its log.
    pub async fn start(binaries: Binaries, dir: &Path) -> Result<Self, String> {
        Self::start_with(binaries, dir, &Options::default()).await
    }

    /// [`ControlPlane::start`] with `options`.
    ///
    /// # Errors
    /// A component did not start; the message quotes its log.
    pub async fn start_with(
        binaries: Binaries,
        dir: &Path,
        options: &Options,
    ) -> Result<Self, String> {
        // A port handed out by `free_port` can still be taken by another
        // listener before the component binds it; that start is thrown away
        // (its processes are killed when dropped) and redone on new ports.
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(binaries.clone(), dir, options).await {
                Err(e) if attempt < ATTEMPTS && e.contains("address already in use") => {
                    tracing::warn!(attempt, "control plane lost a port, starting again: {e}");
                    std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once(binaries: Binaries, dir: &Path, options: &Options) -> Result<Self, String> {
        let io = |e: std::io::Error| e.to_string();
        let pki = Pki::generate(&dir.join("pki")).map_err(io)?;
        let (client_port, peer_port, api_port) = (
            free_port().map_err(io)?,
            free_port().map_err(io)?,
            free_port().map_err(io)?,
        );
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let mut etcd = Process::spawn(
            "etcd",
            &binaries.path("etcd"),
            &[
                "--data-dir".into(),
                dir.join("etcd").display().to_string(),
                "--client-url".into(),
                etcd_url.clone(),
                "--peer-url".into(),
                format!("http://127.0.0.1:{peer_port}"),
            ],
            dir,
        )?;
        etcd.wait_ready_line(Duration::from_secs(60)).await?;

        let p = |x: &Path| x.display().to_string();
        let audit_log = options.api_audit.then(|| dir.join("audit.log"));
        let mut audit_args = Vec::new();
        if let Some(log) = &audit_log {
            let policy = dir.join("audit-policy.yaml");
            std::fs::write(&policy, super::audit::POLICY).map_err(io)?;
            audit_args.push(format!("--audit-policy-file={}", p(&policy)));
            audit_args.push(format!("--audit-log-path={}", p(log)));
        }
        let apiserver = Process::spawn(
            "kube-apiserver",
            &binaries.path("kube-apiserver"),
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", p(&pki.apiserver.cert)),
                format!("--tls-private-key-file={}", p(&pki.apiserver.key)),
                format!("--client-ca-file={}", p(&pki.ca)),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!(
                    "--service-account-key-file={}",
                    p(&pki.service_account.cert)
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    p(&pki.service_account.key)
                ),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                "--authorization-mode=Node,RBAC".into(),
                format!("--enable-admission-plugins={ADMISSION_PLUGINS}"),
                "--allow-privileged=true".into(),
                // One endpoint reconciler less: the "kubernetes" Service's
                // endpoints would name 127.0.0.1, which validation refuses.
                "--endpoint-reconciler-type=none".into(),
                format!("--feature-gates={DRA_FEATURE_GATES}"),
                "--profiling=false".into(),
                "--v=1".into(),
            ]
            .into_iter()
            .chain(audit_args)
            .collect::<Vec<String>>(),
            dir,
        )?;
        let admin = pki
            .client("admin", "kubernetes-admin", &["system:masters"])
            .map_err(io)?;
        let server = format!("https://127.0.0.1:{api_port}");
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &server,
            &pki.ca,
            &Credentials::Certificate(admin),
        )?;
        let mut plane = Self {
            binaries,
            pki,
            server,
            admin_kubeconfig,
            schedulers: Vec::new(),
            scheduler_ports: Vec::new(),
            dir: dir.to_owned(),
            audit_log,
            controller_manager: None,
            apiserver,
            etcd,
        };
        plane.wait_ready().await?;

        let kcm = plane
            .pki
            .client(
                "kube-controller-manager",
                "system:kube-controller-manager",
                &[],
            )
            .map_err(io)?;
        let kcm_kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        write_kubeconfig(
            &kcm_kubeconfig,
            &plane.server,
            &plane.pki.ca,
            &Credentials::Certificate(kcm),
        )?;
        let kcm_port = free_port().map_err(io)?;
        plane.controller_manager = Some(Process::spawn(
            "kube-controller-manager",
            &plane.binaries.path("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", p(&kcm_kubeconfig)),
                format!("--authentication-kubeconfig={}", p(&kcm_kubeconfig)),
                format!("--authorization-kubeconfig={}", p(&kcm_kubeconfig)),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                format!(
                    "--service-account-private-key-file={}",
                    p(&plane.pki.service_account.key)
                ),
                format!("--root-ca-file={}", p(&plane.pki.ca)),
                "--use-service-account-credentials=true".into(),
                if options.node_lifecycle {
                    "--controllers=*".into()
                } else {
                    "--controllers=*,-node-lifecycle-controller".into()
                },
                "--leader-elect=false".into(),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                format!("--feature-gates={DRA_FEATURE_GATES}"),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
            dir,
        )?);
        plane.wait_for_default_service_account("default").await?;
        Ok(plane)
    }

    /// A cluster-admin client.
    ///
    /// # Errors
    /// The kubeconfig cannot be read.
    pub async fn admin_client(&self) -> Result<kube::Client, String> {
        client_from(&self.admin_kubeconfig).await
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = self.admin_client().await?;
        let start = Instant::now();
        let mut last = String::new();
        // No event announces readiness: poll /readyz (bounded, 100 ms apart).
        while start.elapsed() < Duration::from_secs(120) {
            if let Some(reason) = self.apiserver.exited() {
                return Err(reason);
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(req).await {
                Ok(text) if text.trim() == "ok" => return Ok(()),
                Ok(text) => last = text,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "kube-apiserver not ready after 120 s (last: {last}); {}",
            self.apiserver.log_tail()
        ))
    }

    /// Waits until the service-account controller created `default` in
    /// `namespace` (until then the ServiceAccount admission plugin refuses
    /// pods there).
    ///
    /// # Errors
    /// Not within a minute.
    pub async fn wait_for_default_service_account(&self, namespace: &str) -> Result<(), String> {
        let client = self.admin_client().await?;
        crate::harness::wait_for_list(
            Api::<ServiceAccount>::namespaced(client, namespace),
            kube::runtime::watcher::Config::default().fields("metadata.name=default"),
            &format!("ServiceAccount {namespace}/default"),
            Duration::from_secs(60),
            |sas| !sas.is_empty(),
        )
        .await
        .map(drop)
        .map_err(|e| {
            let kcm = self
                .controller_manager
                .as_ref()
                .map(Process::log_tail)
                .unwrap_or_default();
            format!("{e}; {kcm}")
        })
    }

    /// The version kube-apiserver reports at `/version`.
    ///
    /// # Errors
    /// The request failed.
    pub async fn apiserver_version(&self) -> Result<String, String> {
        let info = self
            .admin_client()
            .await?
            .apiserver_version()
            .await
            .map_err(|e| e.to_string())?;
        Ok(info.git_version)
    }

    /// The version a binary prints with `--version` (e.g. "Kubernetes v1.37.2").
    #[must_use]
    pub fn binary_version(&self, name: &str) -> String {
        Command::new(self.binaries.path(name))
            .arg("--version")
            .output()
            .ok()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .trim_start_matches("Kubernetes ")
                    .to_owned()
            })
            .unwrap_or_default()
    }

    /// Writes a kubeconfig for a ServiceAccount, with a token from the
    /// TokenRequest API (what a pod's projected token is), valid for a day.
    ///
    /// # Errors
    /// The request failed (the ServiceAccount must exist).
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, String> {
        let client = self.admin_client().await?;
        let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let request = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86_400},
        });
        let response: serde_json::Value = api
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("token for ServiceAccount {namespace}/{name}: {e}"))?;
        let token = response["status"]["token"].as_str().ok_or_else(|| {
            format!("token for ServiceAccount {namespace}/{name}: no status.token")
        })?;
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server,
            &self.pki.ca,
            &Credentials::Token(token.to_owned()),
        )?;
        Ok(path)
    }

    /// A kubeconfig with a client certificate for `user` in `groups` (e.g. a
    /// kubelet: `system:node:NAME` in `system:nodes`).
    ///
    /// # Errors
    /// Signing or writing failed.
    pub fn certificate_kubeconfig(
        &self,
        file: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<PathBuf, String> {
        let cert = self
            .pki
            .client(file, user, groups)
            .map_err(|e| e.to_string())?;
        let path = self.dir.join(format!("{file}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server,
            &self.pki.ca,
            &Credentials::Certificate(cert),
        )?;
        Ok(path)
    }

    /// Starts a kube-scheduler with `config` (a KubeSchedulerConfiguration,
    /// e.g. from the chart's ConfigMap) as the user of `kubeconfig`; returns
    /// its index in [`ControlPlane::schedulers`]. It is restarted whenever it
    /// exits by itself, with the kubelet's back-off
    /// ([`RestartBackoff::KUBELET`]), as its pod's container would be. With `hostname`, it runs in
    /// a UTS namespace of its own under that hostname (`unshare --uts`, needs
    /// root), so its Lease identity (`<hostname>_<uuid>`) differs from this
    /// machine's, as a second scheduler pod's would.
    ///
    /// # Errors
    /// It could not be started.
    pub fn start_scheduler(
        &mut self,
        config: &str,
        kubeconfig: &Path,
        hostname: Option<&str>,
    ) -> Result<usize, String> {
        self.start_scheduler_with(config, kubeconfig, hostname, &[])
    }

    /// [`ControlPlane::start_scheduler`] with `extra_args` appended to its
    /// command line (e.g. [`SCHEDULER_ALWAYS_ALLOW`], so
    /// [`ControlPlane::scheduler_metrics`] can scrape it).
    ///
    /// # Errors
    /// It could not be started.
    pub fn start_scheduler_with(
        &mut self,
        config: &str,
        kubeconfig: &Path,
        hostname: Option<&str>,
        extra_args: &[String],
    ) -> Result<usize, String> {
        let i = self.schedulers.len();
        let config_path = self.dir.join(format!("kube-scheduler-{i}.yaml"));
        // With --config, kube-scheduler ignores --kubeconfig and reads
        // clientConnection.kubeconfig; in a pod it is empty (in-cluster
        // configuration, which must never be used here), so it is set to the
        // ServiceAccount's kubeconfig: the same token the pod would mount.
        let mut parsed: serde_json::Value = serde_saphyr::from_str(config)
            .map_err(|e| format!("kube-scheduler configuration: {e}"))?;
        parsed["clientConnection"]["kubeconfig"] = kubeconfig.display().to_string().into();
        let text = serde_json::to_string_pretty(&parsed).map_err(|e| e.to_string())?;
        std::fs::write(&config_path, text).map_err(|e| e.to_string())?;
        let port = free_port().map_err(|e| e.to_string())?;
        let k = kubeconfig.display().to_string();
        let binary = self.binaries.path("kube-scheduler");
        let mut args = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={k}"),
            format!("--authentication-kubeconfig={k}"),
            format!("--authorization-kubeconfig={k}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--feature-gates={DRA_FEATURE_GATES}"),
            std::env::var("GPUSLICE_KUBE_SCHEDULER_V")
                .map_or_else(|_| "--v=2".into(), |v| format!("--v={v}")),
        ];
        args.extend_from_slice(extra_args);
        let program = match hostname {
            None => binary,
            Some(name) => {
                // `hostname` then exec: the pid stays kube-scheduler's.
                let mut wrapped = vec![
                    "--uts".into(),
                    "--".into(),
                    "sh".into(),
                    "-c".into(),
                    "hostname \"$0\" && exec \"$@\"".into(),
                    name.to_owned(),
                    binary.display().to_string(),
                ];
                wrapped.append(&mut args);
                args = wrapped;
                PathBuf::from("unshare")
            }
        };
        // In its pod the kubelet restarts it whenever it exits, e.g. after
        // losing its Lease on a loaded machine (kube-scheduler exits then).
        let process = Process::spawn_restarting(
            &format!("kube-scheduler-{i}"),
            &program,
            &args,
            &self.dir,
            RestartBackoff::KUBELET,
        )?;
        self.schedulers.push(process);
        self.scheduler_ports.push(port);
        Ok(i)
    }

    /// kube-scheduler `i`'s `/metrics` page, scraped now without
    /// credentials: it must run with [`SCHEDULER_ALWAYS_ALLOW`]. Its
    /// serving certificate is self-signed, so it is not verified (loopback
    /// only).
    ///
    /// # Errors
    /// There is no scheduler `i`, or the scrape failed.
    pub async fn scheduler_metrics(&self, i: usize) -> Result<String, String> {
        let port = self
            .scheduler_ports
            .get(i)
            .ok_or_else(|| format!("no kube-scheduler {i}"))?;
        let url = format!("https://127.0.0.1:{port}");
        let mut config = kube::Config::new(url.parse().map_err(|e| format!("{url}: {e}"))?);
        config.accept_invalid_certs = true;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        client
            .request_text(request)
            .await
            .map_err(|e| format!("{url}/metrics: {e}"))
    }

    /// kube-apiserver's audit log so far, tallied by client, verb and
    /// resource; `None` without [`Options::api_audit`].
    ///
    /// # Errors
    /// The log could not be read.
    pub fn audit_log(&self) -> Option<Result<super::audit::Tally, String>> {
        self.audit_log.as_ref().map(|path| {
            std::fs::read_to_string(path)
                .map(|text| super::audit::tally(&text))
                .map_err(|e| format!("{}: {e}", path.display()))
        })
    }

    /// The end of every process's log, for a failing test's message.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut all = vec![self.etcd.log_tail(), self.apiserver.log_tail()];
        all.extend(self.controller_manager.iter().map(Process::log_tail));
        all.extend(self.schedulers.iter().map(Process::log_tail));
        all.join("\n")
    }
}

/// A kube client from a kubeconfig file.
///
/// # Errors
/// The file is unreadable or invalid.
pub async fn client_from(path: &Path) -> Result<kube::Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Writes a one-context kubeconfig.
///
/// # Errors
/// The file cannot be written.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    credentials: &Credentials,
) -> Result<(), String> {
    let user = match credentials {
        Credentials::Certificate(c) => format!(
            "    client-certificate: {}\n    client-key: {}\n",
            c.cert.display(),
            c.key.display()
        ),
        Credentials::Token(t) => format!("    token: {t}\n"),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
users:\n- name: user\n  user:\n{user}contexts:\n- name: real\n  context:\n    cluster: real\n    user: user\n    namespace: default\n\
current-context: real\n",
        ca.display()
    );
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: RestartBackoff = RestartBackoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(4),
        reset: Duration::from_secs(600),
    };

    fn sh(script: &str) -> Vec<String> {
        vec!["-c".into(), script.into()]
    }

    #[test]
    fn a_process_that_exits_by_itself_is_started_again_and_its_log_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut flaky = Process::spawn_restarting(
            "flaky",
            Path::new("sh"),
            &sh("echo run; exit 3"),
            dir.path(),
            QUICK,
        )
        .unwrap();
        assert!(flaky.wait_for_restarts(3, Duration::from_secs(60)));
        flaky.kill();
        let after = flaky.restarts();
        assert!(after >= 3, "{after}");
        assert!(flaky.exited().is_some(), "killed means stopped for good");
        let log = std::fs::read_to_string(&flaky.log).unwrap();
        let runs = log.lines().filter(|l| *l == "run").count();
        let notes = log.lines().filter(|l| l.starts_with("[harness]")).count();
        assert_eq!(notes, after as usize, "one note per restart:\n{log}");
        // The last run may be killed before it prints.
        assert!(
            runs == notes || runs == notes + 1,
            "every run appends to one log:\n{log}"
        );
        assert!(
            log.contains("[harness] flaky exited (exit status: 3); restarting after"),
            "{log}"
        );
    }

    #[test]
    fn killing_a_restarting_process_ends_it_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut long = Process::spawn_restarting(
            "long",
            Path::new("sleep"),
            &["1000".into()],
            dir.path(),
            QUICK,
        )
        .unwrap();
        let pid = long.id();
        assert!(pid > 0);
        assert!(long.exited().is_none());
        long.kill();
        assert_eq!(long.restarts(), 0);
        assert_eq!(long.id(), 0, "no run after kill");
        // Reaped, so no /proc entry is left behind (not even a zombie).
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn a_process_spawned_once_is_not_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let mut once = Process::spawn("once", Path::new("sh"), &sh("exit 0"), dir.path()).unwrap();
        once.kill();
        assert!(once.exited().is_some());
        assert!(!once.wait_for_restarts(1, Duration::from_secs(1)));
        assert_eq!(once.restarts(), 0);
    }
}

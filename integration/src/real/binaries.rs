//! The real control plane's binaries: where `integration/k8s/build.sh` puts
//! them, whether they are all there, and building the missing ones.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every binary the real-cluster harness runs.
pub const NAMES: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "fake-cri",
];

/// The workspace root (the folder holding `integration/`).
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn build_script() -> PathBuf {
    workspace_root().join("integration/k8s/build.sh")
}

/// The Kubernetes version pinned in `integration/k8s/versions.env`.
#[must_use]
pub fn kubernetes_version() -> String {
    let file = workspace_root().join("integration/k8s/versions.env");
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The folder of the built binaries: `$GPUSLICE_K8S_DIR`, or
/// `target/k8s/<version>/` as build.sh writes it.
#[must_use]
pub fn dir() -> PathBuf {
    std::env::var_os("GPUSLICE_K8S_DIR").map_or_else(
        || {
            workspace_root()
                .join("target/k8s")
                .join(kubernetes_version())
        },
        PathBuf::from,
    )
}

/// The built binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// Their folder.
    pub dir: PathBuf,
}

impl Binaries {
    /// The path of binary `name`.
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The binaries if every one of [`NAMES`] is built; otherwise the names
    /// that are missing.
    ///
    /// # Errors
    /// The names of the missing binaries.
    pub fn find() -> Result<Self, Vec<&'static str>> {
        let dir = dir();
        let missing: Vec<_> = NAMES
            .iter()
            .copied()
            .filter(|n| !dir.join(n).is_file())
            .collect();
        if missing.is_empty() {
            Ok(Self { dir })
        } else {
            Err(missing)
        }
    }

    /// Runs `integration/k8s/build.sh` (which builds only what is missing,
    /// printing its progress on this process's stdout/stderr), then finds the
    /// binaries.
    ///
    /// # Errors
    /// Go is missing or the build failed; the message says which.
    pub fn build() -> Result<Self, String> {
        // Progress goes to stderr, so a caller's stdout (JSON) stays clean.
        let status = Command::new("bash")
            .arg(build_script())
            .stdout(std::process::Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| format!("running {}: {e}", build_script().display()))?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}); see its output above",
                build_script().display()
            ));
        }
        Self::find().map_err(|missing| format!("build.sh did not produce {missing:?}"))
    }

    /// The binaries for a test: found, or `None` after printing why the test
    /// skips. CI builds them first and sets `GPUSLICE_REQUIRE_REAL_CONTROL_PLANE=1`,
    /// which turns a skip into a failure.
    ///
    /// # Panics
    /// They are missing and the variable is set.
    #[must_use]
    pub fn for_test(test: &str) -> Option<Self> {
        match Self::find() {
            Ok(b) => Some(b),
            Err(missing) if std::env::var_os("GPUSLICE_REQUIRE_REAL_CONTROL_PLANE").is_some() => {
                panic!(
                    "{test}: GPUSLICE_REQUIRE_REAL_CONTROL_PLANE is set but {} missing in {}",
                    missing.join(", "),
                    dir().display()
                )
            }
            Err(missing) => {
                eprintln!(
                    "SKIPPED {test}: the real control plane is not built ({} missing in {}); \
                     run integration/k8s/build.sh (needs Go 1.26) to run it",
                    missing.join(", "),
                    dir().display()
                );
                None
            }
        }
    }
}

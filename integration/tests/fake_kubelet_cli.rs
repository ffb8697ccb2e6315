//! The `fake-kubelet` binary's command line: help, and exit 64 on bad input.

use std::process::Command;

fn fake_kubelet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fake-kubelet"))
}

#[test]
fn help_lists_every_flag() {
    let out = fake_kubelet().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--node-name",
        "--dir",
        "--kubeconfig",
        "--resource",
        "--record-dir",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn bad_resource_name_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let out = fake_kubelet()
        .args([
            "--node-name",
            "n",
            "--kubeconfig",
            "/nonexistent",
            "--resource",
            "gpu",
        ])
        .arg("--dir")
        .arg(dir.path())
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an extended resource name"));
}

#[test]
fn unreadable_kubeconfig_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let out = fake_kubelet()
        .args([
            "--node-name",
            "n",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kubeconfig"));
}

#[test]
fn missing_node_name_is_a_usage_error() {
    let out = fake_kubelet()
        .args(["--dir", "/tmp", "--kubeconfig", "/x"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

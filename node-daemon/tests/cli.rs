//! The binary's command line: help, version, and exit 64 with a one-line
//! reason on a bad configuration.

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-daemon"));
    cmd.args(args)
        .env_remove("GPUSLICE_CONFIG")
        .env_remove("NODE_NAME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_and_version_exit_zero() {
    let out = run(&["--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--device-source"));
    for flag in [
        "--mode",
        "--dra-plugin-dir",
        "--plugin-registry-dir",
        "--cdi-dir",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let out = run(&["--version"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("node-daemon "));
}

#[test]
fn missing_node_name_exits_64_with_one_line() {
    let out = run(&[], &[]);
    assert_eq!(out.status.code(), Some(64));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("nodeName is required"), "{err}");
}

#[test]
fn malformed_config_file_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "deviceSplitCount: [1\n").unwrap();
    let out = run(
        &["--config", path.to_str().unwrap(), "--node-name", "n"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("c.yaml"), "{}", stderr(&out));
}

#[test]
fn bad_flag_value_exits_64() {
    let out = run(&["--node-name", "n", "--device-source", "cuda"], &[]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn node_name_env_and_simulated_gpus_give_effective_settings() {
    let out = run(
        &[
            "--device-source",
            "simulated",
            "--simulated-gpus",
            "2",
            "--print-config",
        ],
        &[("NODE_NAME", "gpu-1"), ("GPUSLICE_DEVICE_SPLIT_COUNT", "5")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let settings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(settings["nodeName"], "gpu-1");
    assert_eq!(settings["deviceSplitCount"], 5);
    assert_eq!(settings["simulatedGpus"], 2);
}

#[test]
fn nvml_without_the_driver_exits_69_with_a_clear_reason() {
    if std::path::Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists() {
        return; // a machine with the NVIDIA driver would really start
    }
    let out = run(&["--node-name", "n", "--device-source", "nvml"], &[]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "node-daemon: libnvidia-ml.so.1 not found: is the NVIDIA driver installed on this node?"
        ),
        "{}",
        stderr(&out)
    );
}

//! The binary's command line: help, version, and exit 64 with a one-line
//! reason on a bad configuration.

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scheduler-webhook"));
    cmd.args(args).env_remove("GPUSLICE_CONFIG");
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
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("serve") && text.contains("simulate"),
        "{text}"
    );
    let out = run(&["serve", "--help"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("--tls-cert"));
    let out = run(&["--version"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("scheduler-webhook "));
}

#[test]
fn unknown_config_key_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "defaultCorez: 30\n").unwrap();
    let out = run(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(64));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("unknown key `defaultCorez`"), "{err}");
}

#[test]
fn bad_env_value_exits_64() {
    let out = run(
        &["serve", "--insecure-http", "--listen", "127.0.0.1:8080"],
        &[("GPUSLICE_DEFAULT_CORES", "lots")],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("defaultCores"), "{}", stderr(&out));
}

#[test]
fn insecure_http_on_a_public_address_exits_64() {
    let out = run(
        &["serve", "--insecure-http", "--listen", "0.0.0.0:8080"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("loopback"), "{}", stderr(&out));
}

#[test]
fn missing_config_file_exits_64() {
    let out = run(&["serve", "--config", "/nonexistent/gpuslice.yaml"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("/nonexistent/gpuslice.yaml"));
}

#[test]
fn layers_resolve_flag_over_env_over_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "defaultCores = 10\ndefaultMemory = 100\nmemoryFactor = 2\n",
    )
    .unwrap();
    let out = run(
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--insecure-http",
            "--listen",
            "127.0.0.1:8080",
            "--default-cores",
            "30",
            "--print-config",
        ],
        &[
            ("GPUSLICE_DEFAULT_CORES", "20"),
            ("GPUSLICE_DEFAULT_MEMORY", "200"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let settings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(settings["defaultCores"], 30);
    assert_eq!(settings["defaultMemory"], 200);
    assert_eq!(settings["memoryFactor"], 2);
}

#[test]
fn bad_policy_or_address_exits_64_naming_key_and_layer() {
    let out = run(
        &["serve", "--insecure-http", "--listen", "127.0.0.1:8080"],
        &[("GPUSLICE_NODE_SCHEDULER_POLICY", "packed")],
    );
    assert_eq!(out.status.code(), Some(64));
    let err = stderr(&out);
    assert!(
        err.contains(
            "nodeSchedulerPolicy from environment variable GPUSLICE_NODE_SCHEDULER_POLICY: \
             unknown policy `packed`"
        ),
        "{err}"
    );
    let out = run(&["serve", "--gpu-scheduler-policy", "binpack,nmua"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains(
        "unknown GPU scheduling policy \"nmua\" (binpack, spread, numa, mutex, topology-aware"
    ));
    let out = run(&["serve", "--metrics-listen", "9395"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("`9395` is not an address"));
}

//! `node-daemon`: parses the command line and config, then runs the daemon
//! until SIGTERM or SIGINT (see `node_daemon::daemon::run`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use node_daemon::settings::{self, Flags};

/// GPU-slice device plugin for one Kubernetes node (HAMi-compatible), or
/// with `--mode dra` its Dynamic Resource Allocation driver (gpu.gpuslice.dev).
#[derive(Debug, Parser)]
#[command(name = "node-daemon", version)]
struct Cli {
    /// Config file (YAML or TOML); keys as in docs/configuration.md.
    #[arg(long, env = "GPUSLICE_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective settings as JSON and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    flags: Flags,
}

/// Exit code for a bad command line or config (sysexits EX_USAGE).
const EX_USAGE: u8 = 64;
/// Exit code when GPUs, the API or the socket are unusable (EX_UNAVAILABLE).
const EX_UNAVAILABLE: u8 = 69;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let settings = match settings::load(cli.config.as_deref(), &cli.flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("node-daemon: bad configuration: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if cli.print_config {
        println!(
            "{}",
            serde_json::to_string_pretty(&settings).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    telemetry::init(settings.log_format);
    match node_daemon::daemon::run_process(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-daemon: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

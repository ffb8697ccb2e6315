//! `scheduler-webhook`: parses the command line and config, then runs a subcommand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use scheduler_webhook::settings::{ServeFlags, Settings};
use scheduler_webhook::simulate::{self, SimulateArgs};

/// GPU-slice scheduling for Kubernetes: admission webhook and kube-scheduler
/// extender (`serve`), and a trace simulator over the same core (`simulate`).
#[derive(Debug, Parser)]
#[command(name = "scheduler-webhook", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at startup; boxing would only complicate clap's derive"
)]
enum Command {
    /// Serve the mutating webhook and the extender (/webhook, /filter, /bind).
    Serve {
        /// Config file (YAML or TOML); keys as in docs/configuration.md.
        #[arg(long, env = "GPUSLICE_CONFIG")]
        config: Option<PathBuf>,
        /// Print the effective settings as JSON and exit.
        #[arg(long)]
        print_config: bool,
        #[command(flatten)]
        flags: ServeFlags,
    },
    /// Replay a production trace (openb CSVs) over the scheduling core.
    Simulate(SimulateArgs),
}

/// Exit code for a bad command line or config (sysexits EX_USAGE).
const EX_USAGE: u8 = 64;
/// Exit code when the service cannot start or fails (sysexits EX_UNAVAILABLE).
const EX_UNAVAILABLE: u8 = 69;

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(EX_USAGE);
        }
    };
    match cli.command {
        Command::Serve {
            config,
            print_config,
            flags,
        } => {
            let settings: Settings =
                match scheduler_webhook::settings::load(config.as_deref(), &flags) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("scheduler-webhook: bad configuration: {e}");
                        return ExitCode::from(EX_USAGE);
                    }
                };
            if print_config {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&settings).unwrap_or_default()
                );
                return ExitCode::SUCCESS;
            }
            telemetry::init(settings.log_format);
            let served = actix_web::rt::System::new()
                .block_on(scheduler_webhook::serve::run(settings, shutdown_signal()));
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("scheduler-webhook: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Simulate(args) => match simulate::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("scheduler-webhook simulate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

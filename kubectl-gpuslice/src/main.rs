//! `kubectl-gpuslice`: on the PATH, `kubectl gpuslice …` runs it.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = kubectl_gpuslice::run::Cli::parse();
    match kubectl_gpuslice::run::run(cli).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

//! `scheduler-webhook simulate`: replays a production trace over the
//! scheduling core.

/// Flags of the `simulate` subcommand.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

/// Runs the simulation.
///
/// # Errors
/// Always, until the simulator is built.
pub fn run(_args: &SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("simulate is not built yet")
}

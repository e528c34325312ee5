//! `peregrine health`: configuration, providers, checkpoint store and local model, as a table.

use crate::app::Application;
use crate::config::Config;
use crate::output::Output;

/// `health` options.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Skip the 1-token completion per provider (configuration and files only).
    #[arg(long, short = 'b')]
    pub basic: bool,
}

/// Runs the checks; `Ok(false)` when one failed.
pub async fn run(args: &HealthArgs, config: &Config, app: &dyn Application, out: &Output) -> anyhow::Result<bool> {
    let _ = (args, config, app, out);
    anyhow::bail!("health is not available yet")
}

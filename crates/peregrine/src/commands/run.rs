//! `peregrine run`: one turn for scripts.

use std::process::ExitCode;

use crate::app::Application;
use crate::cli::Failure;
use crate::config::Config;
use crate::output::Output;

/// `run` options.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The message (an answer when the thread waits for an approval).
    #[arg(required_unless_present = "resume")]
    pub message: Option<String>,
    /// The conversation thread.
    #[arg(long, short = 't', default_value = "main")]
    pub thread: String,
    /// One JSON object per event on stdout, then a final `{"type":"result",…}`.
    #[arg(long)]
    pub json: bool,
    /// Continue the thread's run that was cut off (crash, kill, Ctrl-C) from its last checkpoint.
    #[arg(long, conflicts_with = "message")]
    pub resume: bool,
    /// The user id (memory is per user; default: $USER).
    #[arg(long)]
    pub user: Option<String>,
}

/// Runs the turn.
pub async fn run(args: &RunArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<ExitCode, Failure> {
    let _ = (args, config, app, out);
    Err(Failure::usage("run is not available yet"))
}

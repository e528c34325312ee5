//! `peregrine chat`: the interactive conversation.

use crate::app::Application;
use crate::config::Config;
use crate::output::Output;

/// `chat` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ChatArgs {
    /// The conversation thread to open or continue (default: a new one).
    #[arg(long)]
    pub thread: Option<String>,
    /// The user id (memory is per user; default: $USER).
    #[arg(long)]
    pub user: Option<String>,
}

/// Runs the conversation until `/exit` or Ctrl-D.
pub async fn run(args: &ChatArgs, config: &Config, app: &dyn Application, out: &Output) -> anyhow::Result<()> {
    let _ = (args, config, app, out);
    anyhow::bail!("chat is not available yet")
}

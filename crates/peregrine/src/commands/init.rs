//! `peregrine init NAME [--template minimal|hello-world-weather]`: a new application project.

use std::path::PathBuf;

use crate::output::Output;

/// `init` options.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The project's name (a directory of this name is created; the crate is named after it).
    pub name: String,
    /// The project template.
    #[arg(long, short = 't', value_enum, default_value_t = Template::Minimal)]
    pub template: Template,
    /// Where to create the project directory (default: the working directory).
    #[arg(long, short = 'o')]
    pub output_dir: Option<PathBuf>,
    /// Write into an existing non-empty directory.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// The Peregrine checkout the project depends on (default: the one this binary was built from).
    #[arg(long)]
    pub peregrine_path: Option<PathBuf>,
}

/// Project templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Template {
    /// One example capability and context type.
    Minimal,
    /// Osprey's hello_world_weather: `current_weather` on a mock weather service.
    #[value(alias = "hello_world_weather")]
    HelloWorldWeather,
}

/// Creates the project.
pub fn run(args: &InitArgs, out: &Output) -> anyhow::Result<()> {
    let _ = (args, out);
    anyhow::bail!("init is not available yet")
}

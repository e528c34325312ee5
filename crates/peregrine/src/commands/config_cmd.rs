//! `peregrine config show|validate`.

use std::process::ExitCode;

use crate::cli::Failure;
use crate::config::Config;
use crate::output::{Output, Style};

/// `config` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration with every secret redacted.
    Show {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Check the configuration and say what is wrong (exit 2 when it is unusable).
    Validate,
}

/// `config show` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

/// Runs the subcommand (loading already validated the file).
pub fn run(command: &ConfigCommand, config: &Config, out: &Output) -> Result<ExitCode, Failure> {
    match command {
        ConfigCommand::Show { format } => {
            let document = config.redacted();
            let text = match format {
                Format::Json => serde_json::to_string_pretty(&document).map_err(anyhow::Error::from)?,
                Format::Yaml => serde_norway::to_string(&document).map_err(anyhow::Error::from)?,
            };
            println!("{}", text.trim_end());
        }
        ConfigCommand::Validate => {
            let source = match &config.source {
                Some(path) => path.display().to_string(),
                None => "no config.yml: the embedded defaults".to_owned(),
            };
            println!("{} {source}", Style::Success.paint("valid:", out.color_stdout));
            if !config.ignored_keys.is_empty() {
                println!("ignored keys: {}", config.ignored_keys.join(", "));
            }
            for warning in &config.warnings {
                println!("warning: {warning}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

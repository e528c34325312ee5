//! `peregrine config show|validate`.

use std::collections::BTreeSet;
use std::process::ExitCode;

use crate::cli::Failure;
use crate::config::Config;
use crate::output::{Output, Style};
use crate::turn::println_out;

/// `config` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration with every secret redacted.
    Show {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Check the configuration and the LLM providers its models use, as `run` would, and say what
    /// is wrong (exit 2 when it is unusable). Nothing is sent to a provider (`health` does that).
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
            println_out(text.trim_end());
        }
        ConfigCommand::Validate => {
            check_llm(config).map_err(|error| Failure::usage(format!("{error:#}")))?;
            let source = match &config.source {
                Some(path) => path.display().to_string(),
                None => "no config.yml: the embedded defaults".to_owned(),
            };
            println_out(&format!("{} {source}", Style::Success.paint("valid:", out.color_stdout)));
            if !config.ignored_keys.is_empty() {
                println_out(&format!("ignored keys: {}", config.ignored_keys.join(", ")));
            }
            for warning in &config.warnings {
                println_out(&format!("warning: {warning}"));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds every provider the models use, as `run` does, except that a local model is not loaded
/// (that takes a while and the memory of the model): its file must exist.
fn check_llm(config: &Config) -> anyhow::Result<()> {
    let used: BTreeSet<&str> = config.llm.models.values().map(|model| model.provider.as_str()).collect();
    for name in used {
        let provider = config.llm.provider(name);
        let is_local = provider.protocol.as_deref().map_or(name == "local", |protocol| protocol == "local");
        if is_local {
            let path = provider.model_path.as_deref().filter(|path| !path.trim().is_empty());
            check_model_file(config, path)?;
            if cfg!(feature = "local") {
                anyhow::ensure!(path.is_some(), "api.providers.{name}.model_path is not set; point it at a GGUF model file");
                continue;
            }
        }
        peregrine_llm::build_provider(name, &provider).map_err(|error| anyhow::anyhow!(config.redact(&error.to_string())))?;
    }
    Ok(())
}

/// The local model file must exist (the message `run` gives when it does not).
fn check_model_file(config: &Config, path: Option<&str>) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    if std::path::Path::new(path).is_file() {
        return Ok(());
    }
    let origin = if config.source.is_none() { "the embedded defaults use the local model" } else { "config.yml uses the local model" };
    anyhow::bail!(
        "{origin}, but there is no model file at {path}; fetch it with `bash scripts/fetch-model.sh` (or set PEREGRINE_LOCAL_MODEL to a \
         GGUF file), or write a config.yml whose models name a provider"
    )
}

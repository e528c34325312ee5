//! `config.yml`: discovery (`--config`, `PEREGRINE_CONFIG`, `CONFIG_FILE`, `./config.yml`),
//! `.env`, `${VAR}` / `${VAR:-default}` / `$VAR` interpolation (`$$` is a literal `$`), the
//! Osprey 0.11 keys Peregrine uses, Peregrine's own keys (`checkpointer`, `logging.file`, …),
//! and the embedded defaults used when there is no file: SQLite in the agent data directory and
//! the local model.
//!
//! Loading is [`Config::load`] (process environment, working directory) over a testable core
//! that takes both as parameters: [`Config::load_with`], [`Config::from_file`],
//! [`Config::from_text`], [`Config::embedded_with`]. Two `.env` files are read, as python-dotenv
//! reads them: the working directory's (where upstream's `load_dotenv()` looks), then the one
//! beside the config file, which wins where both set a name; both win over the environment
//! (upstream's `override=True`). The parts: `discovery` (which file, which `.env`), `dotenv`
//! (the `.env` syntax), `de` (interpolation during deserialization, and why it is done there),
//! `merge` (`<<` merge keys), `raw` (the serde model of the file), `build` (validation, mapping
//! into `LlmConfig` / `AgentSettings`), `errors` (serde's errors in the words of a config file),
//! `checks` and `dsn` (values `run` would refuse), `lines` (the line of a dotted key),
//! `defaults`, `show` (the effective configuration for `config show`). Secrets (API keys, URL
//! and PostgreSQL passwords, values of variables named `*_KEY`, `*_TOKEN`, `*_SECRET`,
//! `*_PASSWORD`, and `*_URL` / `*_DSN` values holding a password) are collected while loading;
//! errors, `Debug`, [`Config::redacted`] and [`Config::redact`] hide them (in free text, those
//! of at least six characters: see `MIN_SCRUBBED_LEN`).

mod build;
mod checks;
mod de;
mod defaults;
mod discovery;
mod dotenv;
mod dsn;
mod errors;
mod interpolate;
mod lines;
mod merge;
mod raw;
mod show;

use std::fmt;
use std::path::{Path, PathBuf};

use peregrine_agent::AgentSettings;
use peregrine_core::AgentControl;
use peregrine_llm::{LlmConfig, ProviderConfig, Secret};
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
        /// Connection pool size (1 to 256; default 16).
        pool_size: Option<usize>,
    },
    /// In memory: lost when the process exits.
    Memory,
}

/// The framework's built-in capabilities an application gets unless excluded.
pub const BUILTIN_CAPABILITIES: [&str; 2] = ["memory", "time_range_parsing"];

/// `capabilities`: the framework's built-in capabilities left out of the agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapabilitiesConfig {
    /// Names from [`BUILTIN_CAPABILITIES`] not registered (`capabilities.exclude`).
    pub exclude: Vec<String>,
}

impl CapabilitiesConfig {
    /// Whether the built-in capability `name` is registered.
    pub fn includes(&self, name: &str) -> bool {
        !self.exclude.iter().any(|excluded| excluded == name)
    }
}

/// Which control system the agent talks to (`control_system.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlSystemKind {
    /// The simulated machine (the default: needs no setup).
    #[default]
    Mock,
    /// EPICS Channel Access.
    Epics,
}

/// `control_system.connector.epics`: how the Channel Access connector finds its servers.
#[derive(Debug, Clone, PartialEq)]
pub struct EpicsConfig {
    /// How long a connection or a read may take (default 5 s).
    pub timeout: std::time::Duration,
    /// The CA servers to search (`addr_list`; `EPICS_CA_ADDR_LIST` overrides it).
    pub addr_list: Vec<String>,
    /// Whether to search the broadcast addresses too (`auto_addr_list`).
    pub auto_addr_list: Option<bool>,
    /// The CA server port (`server_port`).
    pub server_port: Option<u16>,
    /// The gateway reads go through (`gateways.read_only`), as `host:port`.
    pub read_gateway: Option<String>,
    /// The gateway writes go through (`gateways.write_access`), as `host:port`.
    pub write_gateway: Option<String>,
}

impl Default for EpicsConfig {
    fn default() -> Self {
        Self {
            timeout: std::time::Duration::from_secs(5),
            addr_list: Vec::new(),
            auto_addr_list: None,
            server_port: None,
            read_gateway: None,
            write_gateway: None,
        }
    }
}

/// `control_system`: the connector and the write gates.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControlSystemConfig {
    /// Whether `config.yml` has a `control_system` section: only then are the capabilities
    /// `channel_read` and `channel_write` added to the agent.
    pub configured: bool,
    /// The connector.
    pub kind: ControlSystemKind,
    /// The write gates: the master switch (off unless `writes_enabled: true`), the limits
    /// database (loaded here; one that cannot be used refuses every write), verification.
    pub writes: peregrine_control::WriteSettings,
    /// How long a write's verification may take (`write_verification.timeout`, default 5 s).
    pub verification_timeout: std::time::Duration,
    /// `connector.mock`.
    pub mock: peregrine_control::MockSettings,
    /// `connector.epics`.
    pub epics: EpicsConfig,
}

/// `server`: how `peregrine serve` listens.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The address to bind (default 127.0.0.1; another address needs `api_keys`).
    pub host: String,
    /// The port (default 8000).
    pub port: u16,
    /// Bearer tokens clients must send; each one sees only its own conversations.
    pub api_keys: Vec<Secret>,
    /// The largest request body accepted (default 1 MiB).
    pub max_body_bytes: usize,
    /// The largest message text (default 256 KiB).
    pub max_message_bytes: usize,
    /// Turns running at once; more get 503 with `Retry-After` (default 256).
    pub max_turns_in_flight: usize,
    /// Connections open at once (default 4,096).
    pub max_connections: usize,
    /// Time to send a request head, from opening or from the previous answer (default 30 s).
    pub header_timeout: std::time::Duration,
    /// Time to send a request body (default 60 s).
    pub body_timeout: std::time::Duration,
    /// Origins whose web pages may use a server without keys (default none: its own page only).
    pub allowed_origins: Vec<String>,
    /// How streamed answers show the agent's progress: as reasoning (the default), as content
    /// lines before the answer, or not at all.
    pub status_lines: peregrine_server::StatusLines,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 8000,
            api_keys: Vec::new(),
            max_body_bytes: 1 << 20,
            max_message_bytes: peregrine_server::DEFAULT_MAX_MESSAGE_BYTES,
            max_turns_in_flight: peregrine_server::DEFAULT_MAX_TURNS_IN_FLIGHT,
            max_connections: peregrine_server::DEFAULT_MAX_CONNECTIONS,
            header_timeout: peregrine_server::DEFAULT_HEADER_TIMEOUT,
            body_timeout: peregrine_server::DEFAULT_BODY_TIMEOUT,
            allowed_origins: Vec::new(),
            status_lines: Default::default(),
        }
    }
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

/// A loaded configuration. `Debug` hides its secrets.
#[derive(Clone)]
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
    /// `capabilities`.
    pub capabilities: CapabilitiesConfig,
    /// `server`.
    pub server: ServerConfig,
    /// `logging`.
    pub logging: LoggingConfig,
    /// `development`.
    pub development: DevelopmentConfig,
    /// `control_system`.
    pub control_system: ControlSystemConfig,
    /// Dotted keys of the file that Peregrine does not use, reported once as ignored (sorted).
    pub ignored_keys: Vec<String>,
    /// Problems worth a warning that do not stop loading (an unset `${VAR}`, …).
    pub warnings: Vec<String>,
    /// Values that must never be printed (API keys, URL passwords, interpolated secrets).
    secrets: Secrets,
}

impl fmt::Debug for Config {
    /// The fields as a derived `Debug` would show them, with every secret replaced by `***`
    /// (a URL password or an interpolated secret may sit in any string field).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[derive(Debug)]
        #[allow(dead_code, reason = "read through Debug only")]
        struct Config<'a> {
            source: &'a Option<PathBuf>,
            project_dir: &'a PathBuf,
            llm: &'a LlmConfig,
            settings: &'a AgentSettings,
            checkpointer: &'a CheckpointerConfig,
            capabilities: &'a CapabilitiesConfig,
            server: &'a ServerConfig,
            logging: &'a LoggingConfig,
            development: &'a DevelopmentConfig,
            control_system: &'a ControlSystemConfig,
            ignored_keys: &'a Vec<String>,
            warnings: &'a Vec<String>,
            secrets: &'a Secrets,
        }
        let view = Config {
            source: &self.source,
            project_dir: &self.project_dir,
            llm: &self.llm,
            settings: &self.settings,
            checkpointer: &self.checkpointer,
            capabilities: &self.capabilities,
            server: &self.server,
            logging: &self.logging,
            development: &self.development,
            control_system: &self.control_system,
            ignored_keys: &self.ignored_keys,
            warnings: &self.warnings,
            secrets: &self.secrets,
        };
        let text = if f.alternate() { format!("{view:#?}") } else { format!("{view:?}") };
        f.write_str(&self.redact(&text))
    }
}

/// The secret values of a configuration; `Debug` shows only how many there are.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} hidden)", self.0.len())
    }
}

/// The shortest secret scrubbed from free text. A shorter one (a one-letter test password, an
/// `api_key: x`) would turn every occurrence of its letters into `***` (`local` into
/// `loc***l`), garbling paths and messages while hiding nothing worth hiding; the fields that
/// hold secrets (`api_key`, a URL's password) are masked by `config show` and `Debug` whatever
/// their length, and an error about a secret key never quotes its value.
const MIN_SCRUBBED_LEN: usize = 6;

impl Secrets {
    /// Registers `secret` (once).
    pub(crate) fn add(&mut self, secret: &str) {
        if !secret.is_empty() && !self.0.iter().any(|known| known == secret) {
            self.0.push(secret.to_owned());
        }
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn redact(&self, text: &str) -> String {
        Self::redact_with(&self.0, text)
    }

    /// `text` with every one of `secrets` of at least [`MIN_SCRUBBED_LEN`] characters replaced
    /// by `***` (longest first, so that a secret containing another is hidden whole).
    pub(crate) fn redact_with(secrets: &[String], text: &str) -> String {
        let mut ordered: Vec<&String> = secrets.iter().filter(|secret| secret.chars().count() >= MIN_SCRUBBED_LEN).collect();
        ordered.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        let mut out = text.to_owned();
        for secret in ordered {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }
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

/// How deep `[`/`{` may nest in a config file.
const MAX_FLOW_NESTING: usize = 64;

impl ConfigError {
    /// An error about no particular file.
    fn general(message: String) -> Self {
        Self { file: None, line: None, column: None, key: None, message }
    }

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
    /// Finds and loads the configuration (`--config`, `PEREGRINE_CONFIG`, `CONFIG_FILE`,
    /// `./config.yml`) with the process environment; with no file anywhere, the embedded
    /// defaults.
    pub fn load(options: &LoadOptions) -> Result<Self, ConfigError> {
        let working_dir =
            std::env::current_dir().map_err(|error| ConfigError::general(format!("cannot read the working directory: {error}")))?;
        Self::load_with(options, &working_dir, &process_env)
    }

    /// [`Config::load`] with the working directory and environment given (for tests and
    /// embedding): discovery, the working directory's `.env`, the `.env` beside the file (it
    /// wins over the working directory's; both win over `env`), parsing.
    pub fn load_with(options: &LoadOptions, working_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let found = discovery::find(options.explicit.as_deref(), working_dir, env)?;
        let working_dotenv = working_dir.join(".env");
        // One .env read twice would expand its own values twice (`HOME=${HOME}/x`).
        let beside_file = found.as_deref().map(|path| config_dir(path).join(".env"));
        let dotenv = match &beside_file {
            Some(beside) if discovery::same_file(beside, &working_dotenv) => Default::default(),
            _ => discovery::read_dotenv(&working_dotenv, env)?,
        };
        let lookup = |name: &str| dotenv.get(name).cloned().or_else(|| env(name));
        match found {
            Some(path) => Self::from_file(&path, &lookup),
            None => Ok(Self::embedded_with(working_dir, &lookup)),
        }
    }

    /// Loads `path` and the `.env` in its directory, resolving variables with the `.env` first,
    /// then `env`.
    pub fn from_file(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
            file: Some(path.to_owned()),
            line: None,
            column: None,
            key: None,
            message: format!("cannot read the configuration file: {error}"),
        })?;
        let dotenv = discovery::read_dotenv(&config_dir(path).join(".env"), env)?;
        let lookup = |name: &str| dotenv.get(name).cloned().or_else(|| env(name));
        Self::from_text(&text, path, &lookup)
    }

    /// Parses the text of a config file named `path` (used in errors and as the base of
    /// relative paths), resolving `${VAR}` with `env`. Reads no file and no environment (it
    /// only looks whether `logging.file`'s directory exists, whether the agent data directory is
    /// a file, and reads the link a `TZ` such as `:/etc/localtime` names).
    pub fn from_text(text: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        // The YAML parser's time grows with the square of the nesting: refuse what no config
        // needs before parsing.
        if let Err((line, column)) = checks::flow_nesting(text, MAX_FLOW_NESTING) {
            return Err(ConfigError {
                file: Some(path.to_owned()),
                line: Some(line),
                column: Some(column),
                key: None,
                message: format!(
                    "brackets are nested more than {MAX_FLOW_NESTING} deep here; no setting needs that, so the file is not read (look for a runaway `[` or `{{`)"
                ),
            });
        }
        build::parse(text, path, env)
    }

    /// The embedded defaults, with the process environment and the `.env` of `project_dir`
    /// (a `.env` that cannot be parsed is skipped with a warning).
    pub fn embedded(project_dir: &Path) -> Self {
        match discovery::read_dotenv(&project_dir.join(".env"), &process_env) {
            Ok(dotenv) => {
                let lookup = |name: &str| dotenv.get(name).cloned().or_else(|| process_env(name));
                Self::embedded_with(project_dir, &lookup)
            }
            Err(error) => {
                let mut config = Self::embedded_with(project_dir, &process_env);
                config.warnings.push(format!("{error} (the .env file was skipped)"));
                config
            }
        }
    }

    /// The embedded defaults for a run in `working_dir` without `config.yml`: the local model
    /// for every role, the agent data directory from `PEREGRINE_DATA_DIR` / `XDG_DATA_HOME` /
    /// `HOME`, SQLite checkpoints in it. Reads nothing but `env`.
    pub fn embedded_with(working_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let agent_data_dir = defaults::data_dir(working_dir, env);
        // A conversational agent the embedded 135M-parameter model can drive: it answers (one
        // streamed respond call), while the LLM-routed parts a model this small cannot do well
        // are off — task extraction is bypassed (the task is the conversation itself) and the
        // built-in capabilities, which the classifier would have to choose between, are left
        // out. A config.yml naming a capable model gets the whole pipeline.
        let agent_control = AgentControl { task_extraction_bypass_enabled: true, ..AgentControl::default() };
        let settings = AgentSettings { timezone: defaults::timezone(env), agent_control, ..AgentSettings::with_data_dir(agent_data_dir) };
        let capabilities = CapabilitiesConfig { exclude: BUILTIN_CAPABILITIES.iter().map(|name| (*name).to_owned()).collect() };
        let checkpointer = CheckpointerConfig::Sqlite { path: defaults::checkpoint_file(&settings.agent_data_dir) };
        let mut llm = LlmConfig::default();
        llm.models.insert("default".to_owned(), defaults::model());
        llm.providers.insert(
            defaults::LOCAL_PROVIDER.to_owned(),
            ProviderConfig { model_path: Some(defaults::local_model_path(env).display().to_string()), ..ProviderConfig::default() },
        );
        Self {
            source: None,
            project_dir: working_dir.to_owned(),
            llm,
            settings,
            checkpointer,
            capabilities,
            server: ServerConfig::default(),
            logging: LoggingConfig::default(),
            development: DevelopmentConfig::default(),
            control_system: ControlSystemConfig::default(),
            ignored_keys: Vec::new(),
            warnings: Vec::new(),
            secrets: Secrets::default(),
        }
    }

    /// The effective configuration as JSON (for `config show`): the source, resolved models,
    /// providers, approval, execution control, timezone, data directory, checkpointer, logging,
    /// development and ignored keys, with every secret replaced by `***`.
    pub fn redacted(&self) -> Value {
        show::effective(self)
    }

    /// `text` with every secret of this configuration replaced by `***` (for messages that may
    /// quote configuration values).
    pub fn redact(&self, text: &str) -> String {
        self.secrets.redact(text)
    }

    /// [`Config::redact`] as a function that outlives the configuration (for the server).
    pub fn redactor(&self) -> impl Fn(&str) -> String + Send + Sync + 'static {
        let secrets = self.secrets.clone();
        move |text: &str| secrets.redact(text)
    }

    /// Whether the models are the embedded defaults' (the small local model for every role): no
    /// config file, or one without `models`. Such a run gets the embedded profile (task
    /// extraction bypassed, built-in capabilities left out, unless the file says otherwise) and
    /// should answer with a prompt the small model can follow. Computed from [`Config::llm`], so
    /// it stays true to models set after loading.
    pub fn uses_embedded_model(&self) -> bool {
        self.llm.models.len() == 1 && self.llm.models.get("default") == Some(&defaults::model())
    }
}

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The directory of a config file (relative paths and its `.env` are there).
fn config_dir(path: &Path) -> &Path {
    path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_owned())
    }

    fn parse(text: &str, pairs: &'static [(&'static str, &'static str)]) -> Result<Config, ConfigError> {
        Config::from_text(text, Path::new("/p/config.yml"), &lookup(pairs))
    }

    #[test]
    fn anchors_merges_and_empty_sections_work_through_interpolation() {
        let text = "\
base: &base
  provider: openai
  model_id: ${MODEL:-gpt-4o}
models:
  orchestrator:
    <<: *base
    max_tokens: 100
  response: *base
approval:
api:
  providers:
    openai:
    ollama:
      api_key: 12345
";
        let config = parse(text, &[]).expect("loads");
        assert_eq!(config.llm.models["orchestrator"].model_id, "gpt-4o");
        assert_eq!(config.llm.models["orchestrator"].max_tokens, Some(100));
        assert_eq!(config.llm.models["response"].provider, "openai");
        assert_eq!(config.llm.provider("openai"), ProviderConfig::default());
        assert_eq!(config.llm.provider("ollama").api_key.as_ref().map(Secret::expose), Some("12345"), "an all-digit key stays text");
        assert_eq!(config.ignored_keys, ["base"]);
        assert_eq!(config.settings.approval, peregrine_core::ApprovalConfig::default());

        // Without merge keys the text is read directly; aliases still resolve.
        let config = parse("base: &b\n  provider: openai\n  model_id: m\nmodels:\n  response: *b\n", &[]).expect("loads");
        assert_eq!(config.llm.models["response"].model_id, "m");
        // With merge keys, errors take their line from the key path.
        let error = parse(&text.replace("max_tokens: 100", "max_tokens: lots"), &[]).expect_err("not a number");
        assert_eq!((error.line, error.key.as_deref()), (Some(7), Some("models.orchestrator.max_tokens")), "{error}");
        assert!(error.message.contains("positive integer"), "{error}");
    }

    #[test]
    fn a_document_that_is_not_a_mapping_says_so() {
        let error = parse("- models\n- api\n", &[]).expect_err("a list");
        assert!(error.message.contains("must be a mapping of sections"), "{error}");
        assert_eq!(error.line, Some(1));
    }

    #[test]
    fn secrets_stay_out_of_debug_show_and_warnings() {
        let text = "\
api:
  providers:
    openai:
      api_key: sk-literal-0123456789
    unused-gateway:
      protocol: openai
      base_url: https://user:url-pass-4242@gateway.example/v1
    other:
      protocol: openai
      api_key: ${OTHER_API_KEY}
models:
  orchestrator: {provider: openai, model_id: \"${SECRET_MODEL_TOKEN}\"}
  classifier: {provider: other, model_id: small}
";
        let config = parse(text, &[("SECRET_MODEL_TOKEN", "tok-0987654321")]).expect("loads");
        let shown = config.redacted().to_string();
        let debug = format!("{config:?}");
        for secret in ["sk-literal-0123456789", "url-pass-4242", "tok-0987654321"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
            assert!(!debug.contains(secret), "{secret} in {debug}");
            assert_eq!(config.redact(&format!("x {secret} y")), "x *** y");
        }
        assert!(shown.contains("https://user:***@gateway.example/v1"), "{shown}");
        assert!(shown.contains("${OTHER_API_KEY}"), "the unset variable is named in the warning: {shown}");
        // The three values, and the URL holding a password as a whole.
        assert!(debug.contains("Secrets(4 hidden)"), "{debug}");
    }

    #[test]
    fn only_providers_some_model_uses_warn_about_unset_variables() {
        let text = "\
api:
  providers:
    openai:
      api_key: ${OPENAI_API_KEY}
    anthropic:
      api_key: ${ANTHROPIC_API_KEY}
models:
  default: {provider: openai, model_id: gpt-4o}
";
        let config = parse(text, &[]).expect("loads");
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("${OPENAI_API_KEY}"), "{:?}", config.warnings);
    }

    #[test]
    fn placeholder_keys_are_not_scrubbed_from_messages() {
        let config = parse("api:\n  providers:\n    ollama:\n      api_key: ollama\n", &[]).expect("loads");
        assert_eq!(config.redact("ollama is down"), "ollama is down");
        assert_eq!(config.redacted()["api"]["providers"]["ollama"]["api_key"], "***");
    }

    #[test]
    fn timezones_accept_tz_forms() {
        let config = parse("system:\n  timezone: ${TZ:-UTC}\n", &[("TZ", ":Europe/Paris")]).expect("loads");
        assert_eq!(config.settings.timezone, chrono_tz::Europe::Paris);
        let config = parse("system:\n  timezone: ${TZ:-UTC}\n", &[]).expect("loads");
        assert_eq!(config.settings.timezone, chrono_tz::UTC);
    }

    #[test]
    fn upstreams_legacy_write_switch_is_accepted_and_enables_nothing() {
        let config = parse("execution_control:\n  epics:\n    writes_enabled: false\n", &[]).expect("loads");
        assert!(config.ignored_keys.is_empty() && config.warnings.is_empty(), "{:?} {:?}", config.ignored_keys, config.warnings);
        let config = parse("execution_control:\n  epics:\n    writes_enabled: true\n", &[]).expect("loads");
        assert!(!config.control_system.writes.writes_enabled);
        assert!(config.warnings.iter().any(|warning| warning.contains("enables nothing here")), "{:?}", config.warnings);
    }

    #[test]
    fn ignored_sections_are_not_interpolated() {
        let config = parse("services:\n  jupyter:\n    path: ${UNSET_SERVICE_PATH}\n", &[]).expect("loads");
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        assert_eq!(config.ignored_keys, ["services"]);
    }
}

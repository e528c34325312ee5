//! From the text of `config.yml` to a validated [`Config`]: deserialization through the
//! interpolating wrapper (through the merged tree for a file with `<<` merge keys), the checks
//! that need the whole file (unknown providers, limits, base URLs, logging, the checkpointer),
//! and the mapping into the per-crate settings. Errors are worded in `errors`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use peregrine_agent::AgentSettings;
use peregrine_core::{AgentControl, ExecutionLimits};
use peregrine_llm::{LlmConfig, ModelConfig, ProviderConfig, Secret, default_protocol, http::validate_base_url};

use super::de::{EnvLookup, Interpolating, Scope, Unresolved, Walk};
use super::errors::{deserialize_error, typo_hints, unset_message, yaml_error};
use super::lines::key_position;
use super::raw::{
    CheckpointerKind, ControlSystemKind as ControlSystemKindRaw, Count, OnViolation, OrchestrationMode, PositiveCount, RawCapabilities,
    RawCheckpointer, RawConfig, RawControlSystem, RawGateway, RawLogging, RawProvider, RawServer, Seconds,
};
use super::{
    BUILTIN_CAPABILITIES, CapabilitiesConfig, CheckpointerConfig, Config, ConfigError, ControlSystemConfig, ControlSystemKind,
    DevelopmentConfig, EpicsConfig, LoggingConfig, Secrets, ServerConfig, checks, defaults, dsn, merge,
};

/// The most connections a PostgreSQL checkpointer's pool may hold (`checkpointer.pool_size`):
/// the pool allocates its slots up front, and PostgreSQL's own default is 100 connections in all.
const MAX_POOL_SIZE: u32 = 256;

/// The smallest and largest request body `serve` may be told to accept (`server.max_body_bytes`):
/// a body is read whole into memory, once per request in flight.
const BODY_BYTES: std::ops::RangeInclusive<u32> = 1024..=64 << 20;

/// The largest `graph_recursion_limit`: more steps in one turn is a loop, and every step writes a
/// checkpoint.
const MAX_RECURSION_LIMIT: u32 = 10_000;

/// The longest `max_execution_time_seconds` (one day, as for every other timeout).
const MAX_EXECUTION_SECONDS: u64 = 86_400;

/// Provider names with a built-in protocol (see `peregrine_llm::default_protocol`).
const BUILT_IN_PROVIDERS: &[&str] =
    &["anthropic", "amsc", "cborg", "llama-server", "llama_server", "lmstudio", "local", "ollama", "openai", "stanford", "vllm"];

/// Parses and validates one file's text; `path` names it in errors and anchors relative paths.
pub(crate) fn parse(text: &str, path: &Path, env: EnvLookup<'_>) -> Result<Config, ConfigError> {
    // A byte-order mark is not part of the first key (and moves no line).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let walk = RefCell::new(Walk::default());
    let raw = if is_blank(text) {
        RawConfig::default()
    } else if let Some(node) = merged(text, path)? {
        // Errors of a merged file take their line from the key path (a merged key may be
        // written under the anchor, not where it is used).
        let result: Result<RawConfig, _> = serde_path_to_error::deserialize(Interpolating::new(node, Scope::new(env, &walk)));
        result.map_err(|error| deserialize_error(error, path, text, &walk.borrow()))?
    } else {
        let deserializer = serde_norway::Deserializer::from_str(text);
        let result: Result<RawConfig, _> = serde_path_to_error::deserialize(Interpolating::new(deserializer, Scope::new(env, &walk)));
        result.map_err(|error| deserialize_error(error, path, text, &walk.borrow()))?
    };
    let walk = walk.into_inner();
    let project_dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut build = Build {
        text,
        file: path,
        project_dir: &project_dir,
        env,
        secrets: Secrets(walk.secrets),
        warnings: walk.warnings,
        unresolved: walk.unresolved,
    };
    let config = build.config(raw)?;
    let mut ignored_keys: Vec<String> = walk.ignored.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    // An unset variable matters only where it is used: a provider no model uses (Osprey's
    // template lists every provider it knows) does not warn.
    let used: BTreeSet<&str> = config.llm.models.values().map(|model| model.provider.as_str()).collect();
    let mut warnings: Vec<String> = build
        .warnings
        .into_iter()
        .filter(|warning| {
            let provider = warning.strip_prefix("api.providers.").and_then(|rest| rest.split('.').next());
            provider.is_none_or(|provider| used.contains(provider))
        })
        .collect();
    warnings.extend(typo_hints(&ignored_keys));
    ignored_keys.dedup();
    Ok(Config { ignored_keys, warnings, ..config })
}

/// The merged tree of a file whose document has `<<` merge keys; `None` for a file without
/// (read directly from the text, which keeps exact lines and columns in errors).
fn merged(text: &str, path: &Path) -> Result<Option<merge::Node>, ConfigError> {
    if !text.contains("<<") {
        return Ok(None);
    }
    let document: serde_norway::Value =
        serde_norway::from_str(text).map_err(|error| duplicate_key(text, path).unwrap_or_else(|| yaml_error(&error, path)))?;
    if !merge::has_merge_keys(&document) {
        return Ok(None);
    }
    merge::read(text, &document).map(Some).map_err(|error| yaml_error(&error, path))
}

/// The first key of `text` written twice in one mapping, at its second occurrence (serde_norway
/// reports a duplicate in a `Value` at the start of its mapping): the text read again through
/// the wrapper that tracks keys, with no variable set.
fn duplicate_key(text: &str, path: &Path) -> Option<ConfigError> {
    let walk = RefCell::new(Walk::default());
    let no_variables = |_: &str| None;
    let deserializer = serde_norway::Deserializer::from_str(text);
    let result: Result<serde_norway::Value, _> =
        serde_path_to_error::deserialize(Interpolating::new(deserializer, Scope::new(&no_variables, &walk)));
    let error = result.err()?;
    let walk = walk.into_inner();
    walk.duplicate.is_some().then(|| deserialize_error(error, path, text, &walk))
}

/// Only comments and blank lines (serde_norway refuses an empty document).
fn is_blank(text: &str) -> bool {
    text.lines().map(str::trim).all(|line| line.is_empty() || line.starts_with('#') || line == "---" || line == "...")
}

struct Build<'a> {
    text: &'a str,
    file: &'a Path,
    project_dir: &'a Path,
    env: EnvLookup<'a>,
    secrets: Secrets,
    warnings: Vec<String>,
    unresolved: BTreeMap<String, Unresolved>,
}

impl Build<'_> {
    fn config(&mut self, raw: RawConfig) -> Result<Config, ConfigError> {
        // Without `models` the file runs on the embedded model, so it gets the embedded
        // defaults' profile for it (see `Config::embedded_with`) unless it says otherwise.
        let embedded_model = raw.models.as_ref().is_none_or(BTreeMap::is_empty);
        let llm = self.llm(&raw)?;
        let mut settings = self.settings(&raw, embedded_model)?;
        let checkpointer = self.checkpointer(raw.checkpointer, &settings.agent_data_dir)?;
        let capabilities = self.capabilities(raw.capabilities, embedded_model)?;
        let server = self.server(raw.server)?;
        let logging = self.logging(raw.logging.unwrap_or_default())?;
        let legacy_writes =
            raw.execution_control.as_ref().and_then(|control| control.epics.as_ref()).and_then(|epics| epics.writes_enabled);
        let control_system = self.control_system(raw.control_system)?;
        if control_system.writes.writes_enabled && !settings.approval.capabilities.channel_write.enabled {
            self.warnings.push(
                "approval.capabilities.channel_write is false: control-system writes run without asking whenever the approval mode \
                 and python_execution allow it"
                    .to_owned(),
            );
        }
        if legacy_writes == Some(true) && !control_system.writes.writes_enabled {
            self.warnings.push(
                "execution_control.epics.writes_enabled is Osprey's legacy write switch and enables nothing here: writes stay \
                 disabled until control_system.writes_enabled is true"
                    .to_owned(),
            );
        }
        // The turn's own master switch starts as the configured one (the capability needs both).
        settings.agent_control.control_system_writes_enabled = control_system.writes.writes_enabled;
        let development = raw.development.unwrap_or_default();
        let development = DevelopmentConfig {
            save_api_calls: development.api_calls.and_then(|calls| calls.save_all).unwrap_or(false),
            raise_raw_errors: development.raise_raw_errors.unwrap_or(false),
        };
        Ok(Config {
            source: Some(self.file.to_owned()),
            project_dir: self.project_dir.to_owned(),
            llm,
            settings,
            checkpointer,
            capabilities,
            server,
            logging,
            development,
            control_system,
            ignored_keys: Vec::new(),
            warnings: Vec::new(),
            secrets: std::mem::take(&mut self.secrets),
        })
    }

    /// `server`: the listening address, port and API keys (registered as secrets).
    fn server(&mut self, raw: Option<RawServer>) -> Result<ServerConfig, ConfigError> {
        let defaults = ServerConfig::default();
        let Some(raw) = raw else { return Ok(defaults) };
        let port = match raw.port {
            None => defaults.port,
            Some(port) => u16::try_from(port.0)
                .map_err(|_| self.error_at("server.port", format!("{} is not a port; use a number from 0 to 65535", port.0)))?,
        };
        let max_body_bytes = match raw.max_body_bytes {
            None => defaults.max_body_bytes,
            Some(bytes) if BODY_BYTES.contains(&bytes.0) => bytes.0 as usize,
            Some(bytes) => {
                return Err(self.error_at(
                    "server.max_body_bytes",
                    format!(
                        "{} bytes is out of range; use a number from {} to {} (64 MiB; the default is 1048576, 1 MiB)",
                        bytes.0,
                        BODY_BYTES.start(),
                        BODY_BYTES.end()
                    ),
                ));
            }
        };
        let mut api_keys = Vec::new();
        for key in raw.api_keys.unwrap_or_default() {
            if key.trim().is_empty() || key.contains("${") {
                return Err(self.error_at(
                    "server.api_keys",
                    "an API key is empty or names a variable that is not set; set it in the environment or .env".to_owned(),
                ));
            }
            self.secrets.add(&key);
            api_keys.push(Secret::new(key));
        }
        let mut allowed_origins = Vec::new();
        for origin in raw.allowed_origins.unwrap_or_default() {
            if !checks::web_origin(&origin) {
                return Err(self.error_at(
                    "server.allowed_origins",
                    format!("'{origin}' is not a web origin; write scheme, host and port only, such as https://ui.example.org or http://localhost:3000"),
                ));
            }
            allowed_origins.push(origin);
        }
        let bounded = |key: &str, given: Option<PositiveCount>, default: usize, max: u64, unit: &str| match given {
            None => Ok(default),
            Some(PositiveCount(value)) if u64::from(value) <= max => Ok(value as usize),
            Some(PositiveCount(value)) => {
                Err(self.error_at(&format!("server.{key}"), format!("{value} is too large; use at most {max} {unit}")))
            }
        };
        let seconds = |given: usize| std::time::Duration::from_secs(given as u64);
        Ok(ServerConfig {
            host: raw.host.filter(|host| !host.trim().is_empty()).unwrap_or(defaults.host),
            port,
            api_keys,
            max_body_bytes,
            max_message_bytes: bounded("max_message_bytes", raw.max_message_bytes, defaults.max_message_bytes, 64 << 20, "bytes")?,
            max_turns_in_flight: bounded("max_turns_in_flight", raw.max_turns_in_flight, defaults.max_turns_in_flight, 100_000, "turns")?,
            max_connections: bounded("max_connections", raw.max_connections, defaults.max_connections, 1_000_000, "connections")?,
            header_timeout: seconds(bounded("header_timeout_seconds", raw.header_timeout_seconds, 30, 3600, "seconds")?),
            body_timeout: seconds(bounded("body_timeout_seconds", raw.body_timeout_seconds, 60, 3600, "seconds")?),
            allowed_origins,
            status_lines: raw.status_lines.unwrap_or(defaults.status_lines),
        })
    }

    /// `control_system`: the connector and the write gates. Writes stay off unless
    /// `writes_enabled: true`; a limits database is loaded here, and one named but unusable is
    /// an error (limits checking enabled without a database refuses every write, with a warning).
    fn control_system(&mut self, raw: Option<RawControlSystem>) -> Result<ControlSystemConfig, ConfigError> {
        use peregrine_control::{LimitsCheck, LimitsDatabase, LimitsError, MockSettings, VerificationLevel, WriteSettings};
        let Some(raw) = raw else { return Ok(ControlSystemConfig::default()) };
        let kind = match raw.kind {
            None | Some(ControlSystemKindRaw::Mock) => ControlSystemKind::Mock,
            Some(ControlSystemKindRaw::Epics) => ControlSystemKind::Epics,
        };
        let checking = raw.limits_checking.unwrap_or_default();
        let allow_unlisted = checking.allow_unlisted_channels.unwrap_or(false);
        let writes_enabled = raw.writes_enabled.unwrap_or(false);
        // A named database is checked unless limits checking is switched off explicitly: a
        // forgotten `enabled: true` never leaves a facility's limits unchecked (and a path that
        // comes out empty, e.g. from an unset variable, refuses every write).
        let enabled = checking.enabled.unwrap_or(checking.database_path.is_some());
        let path = checking.database_path.filter(|path| !path.trim().is_empty());
        let limits = match (enabled, path) {
            (false, path) => {
                if path.is_some() {
                    self.warnings.push(
                        "control_system.limits_checking.database_path is set but limits_checking.enabled is false: the limits are not checked".to_owned(),
                    );
                } else if writes_enabled {
                    self.warnings.push(
                        "control_system.writes_enabled is true without limits_checking: writes are checked by no limits database"
                            .to_owned(),
                    );
                }
                LimitsCheck::Off
            }
            (true, None) => {
                self.warnings.push("control_system.limits_checking is enabled without a database_path: every write is refused".to_owned());
                let detail = "limits_checking is enabled but no database_path is set".to_owned();
                LimitsCheck::On { database: Err(LimitsError::Invalid { detail }), allow_unlisted }
            }
            (true, Some(path)) => {
                let database = LimitsDatabase::load(&self.path(&path))
                    .map_err(|error| self.error_at("control_system.limits_checking.database_path", error.to_string()))?;
                LimitsCheck::On { database: Ok(database), allow_unlisted }
            }
        };
        if checking.on_violation == Some(OnViolation::Skip) {
            self.warnings.push(
                "control_system.limits_checking.on_violation: skip is read as error: a write operation with one refused write is refused whole".to_owned(),
            );
        }
        let verification = raw.write_verification.unwrap_or_default();
        let tolerance_percent = verification.default_tolerance_percent.unwrap_or(0.1);
        if !tolerance_percent.is_finite() || !(0.0..=100.0).contains(&tolerance_percent) {
            return Err(self.error_at(
                "control_system.write_verification.default_tolerance_percent",
                format!("{tolerance_percent} is not a percentage; use a number from 0 to 100 (the default is 0.1)"),
            ));
        }
        let level = match verification.enabled {
            Some(false) => VerificationLevel::None,
            _ => verification.default_level.unwrap_or(VerificationLevel::Callback),
        };
        let connectors = raw.connector.unwrap_or_default();
        let mock = connectors.mock.unwrap_or_default();
        let noise_level = mock.noise_level.unwrap_or(0.0);
        if !noise_level.is_finite() || !(0.0..=1.0).contains(&noise_level) {
            return Err(self.error_at(
                "control_system.connector.mock.noise_level",
                format!("{noise_level} is not a noise level; use a fraction from 0 to 1 (0.01 is 1 %)"),
            ));
        }
        let epics = connectors.epics.unwrap_or_default();
        let port = |key: &str, port: Option<Count>| -> Result<Option<u16>, ConfigError> {
            port.map(|port| {
                u16::try_from(port.0).ok().filter(|port| *port > 0).ok_or_else(|| {
                    self.error_at(&format!("control_system.connector.epics.{key}"), format!("{} is not a port; use 1 to 65535", port.0))
                })
            })
            .transpose()
        };
        let server_port = port("server_port", epics.server_port)?;
        let gateways = epics.gateways.unwrap_or_default();
        let gateway = |key: &str, raw: Option<RawGateway>| -> Result<Option<String>, ConfigError> {
            let Some(raw) = raw else { return Ok(None) };
            let Some(address) = raw.address.filter(|address| !address.trim().is_empty()) else { return Ok(None) };
            let port = port(&format!("gateways.{key}.port"), raw.port)?.unwrap_or(5064);
            Ok(Some(format!("{}:{port}", address.trim())))
        };
        let read_gateway = gateway("read_only", gateways.read_only)?;
        let write_gateway = gateway("write_access", gateways.write_access)?;
        let seconds = |given: Option<Seconds>| std::time::Duration::from_secs_f64(given.map_or(5.0, |seconds| seconds.0));
        Ok(ControlSystemConfig {
            configured: true,
            kind,
            writes: WriteSettings { writes_enabled, limits, verification: level, tolerance_percent },
            verification_timeout: seconds(verification.timeout),
            mock: MockSettings { noise_level, seed: mock.seed.map_or(1, |seed| seed.0), ..MockSettings::default() },
            epics: EpicsConfig {
                timeout: seconds(epics.timeout),
                addr_list: epics.addr_list.unwrap_or_default(),
                auto_addr_list: epics.auto_addr_list,
                server_port,
                read_gateway,
                write_gateway,
            },
        })
    }

    /// `logging`: a level tracing can read, a file whose directory exists.
    fn logging(&self, raw: RawLogging) -> Result<LoggingConfig, ConfigError> {
        let level = raw.level.filter(|level| !level.trim().is_empty());
        if let Some(level) = &level {
            checks::log_level(level).map_err(|message| self.error_at("logging.level", message))?;
        }
        let file = raw.file.filter(|file| !file.trim().is_empty()).map(|file| self.path(&file));
        if let Some(file) = &file {
            checks::log_file(file).map_err(|message| self.error_at("logging.file", message))?;
        }
        Ok(LoggingConfig { level, file })
    }

    /// `capabilities.exclude`: names of built-in capabilities only. On the embedded model, a file
    /// without a `capabilities` section leaves every built-in out, as the embedded defaults do.
    fn capabilities(&self, raw: Option<RawCapabilities>, embedded_model: bool) -> Result<CapabilitiesConfig, ConfigError> {
        if embedded_model && raw.is_none() && key_position(self.text, &["capabilities"]).is_none() {
            return Ok(CapabilitiesConfig { exclude: BUILTIN_CAPABILITIES.iter().map(|name| (*name).to_owned()).collect() });
        }
        let exclude = raw.and_then(|raw| raw.exclude).unwrap_or_default();
        if let Some(unknown) = exclude.iter().find(|name| !BUILTIN_CAPABILITIES.contains(&name.as_str())) {
            let line = key_position(self.text, &["capabilities", "exclude"]).map(|(line, _)| line);
            return Err(ConfigError {
                file: Some(self.file.to_owned()),
                line,
                column: None,
                key: Some("capabilities.exclude".to_owned()),
                message: format!(
                    "'{unknown}' is not a built-in capability; the framework's built-ins are {} (an application leaves out its own capabilities by not registering them)",
                    BUILTIN_CAPABILITIES.join(", ")
                ),
            });
        }
        Ok(CapabilitiesConfig { exclude })
    }

    /// `models` and `api.providers`; the embedded model when the file has no `models`.
    fn llm(&mut self, raw: &RawConfig) -> Result<LlmConfig, ConfigError> {
        let mut llm = LlmConfig::default();
        let providers = raw.api.as_ref().and_then(|api| api.providers.as_ref());
        for (name, provider) in providers.into_iter().flatten() {
            let provider = provider.as_ref().map(|provider| self.provider(provider)).unwrap_or_default();
            llm.providers.insert(name.clone(), provider);
        }
        match raw.models.as_ref().filter(|models| !models.is_empty()) {
            None => {
                llm.models.insert("default".to_owned(), defaults::model());
            }
            Some(models) => {
                for (role, model) in models {
                    self.check_provider(role, &model.provider, &llm)?;
                    llm.models.insert(
                        role.clone(),
                        ModelConfig {
                            provider: model.provider.clone(),
                            model_id: model.model_id.clone(),
                            max_tokens: model.max_tokens.map(|count| count.0),
                            temperature: model.temperature.map(|temperature| temperature.0),
                        },
                    );
                }
            }
        }
        if llm.models.values().any(|model| model.provider == defaults::LOCAL_PROVIDER) {
            let local = llm.providers.entry(defaults::LOCAL_PROVIDER.to_owned()).or_default();
            if local.model_path.is_none() {
                local.model_path = Some(defaults::local_model_path(self.env).display().to_string());
            }
        }
        self.check_base_urls(&llm)?;
        Ok(llm)
    }

    /// The `base_url` of every provider a model uses, checked as the provider will check it when
    /// it is built (providers no model uses are never built, so not checked).
    fn check_base_urls(&self, llm: &LlmConfig) -> Result<(), ConfigError> {
        let used: BTreeSet<&str> = llm.models.values().map(|model| model.provider.as_str()).collect();
        for name in used {
            let Some(provider) = llm.providers.get(name) else { continue };
            let Some(base_url) = provider.base_url.as_deref() else { continue };
            if provider.protocol.as_deref().or_else(|| default_protocol(name)) == Some("local") {
                continue;
            }
            if let Err(error) = validate_base_url(name, base_url) {
                let key = format!("api.providers.{name}.base_url");
                let mut message = error.message.strip_prefix(&format!("{key} is invalid: ")).unwrap_or(&error.message).to_owned();
                if !base_url.contains("://") && !base_url.trim().is_empty() {
                    message.push_str(&format!("; write it with its scheme, such as http://{}", base_url.trim()));
                }
                return Err(self.error_at(&key, message));
            }
        }
        Ok(())
    }

    fn provider(&self, raw: &RawProvider) -> ProviderConfig {
        ProviderConfig {
            api_key: raw.api_key.clone().map(Secret::new),
            base_url: raw.base_url.clone(),
            timeout_seconds: raw.timeout_seconds.map(|seconds| seconds.0),
            max_retries: raw.max_retries.map(|count| u32::try_from(count.0).unwrap_or(u32::MAX)),
            model_path: raw.model_path.as_deref().map(|path| self.path(path).display().to_string()),
            protocol: raw.protocol.map(|protocol| protocol.name().to_owned()),
        }
    }

    /// A model's provider must be configured or built in.
    fn check_provider(&mut self, role: &str, provider: &str, llm: &LlmConfig) -> Result<(), ConfigError> {
        if let Some(configured) = llm.providers.get(provider) {
            if configured.protocol.is_none() && default_protocol(provider).is_none() {
                self.warnings.push(format!(
                    "models.{role} uses provider '{provider}', which has no built-in protocol; set api.providers.{provider}.protocol to openai, anthropic, ollama or local"
                ));
            }
            return Ok(());
        }
        if default_protocol(provider).is_some() {
            return Ok(());
        }
        let known: BTreeSet<&str> = llm.providers.keys().map(String::as_str).chain(BUILT_IN_PROVIDERS.iter().copied()).collect();
        let known = known.into_iter().collect::<Vec<_>>().join(", ");
        Err(self.error_at(
            &format!("models.{role}.provider"),
            format!(
                "unknown provider '{provider}'; use one of {known}, or add api.providers.{provider} with a protocol (openai, anthropic, ollama or local) and a base_url"
            ),
        ))
    }

    /// `approval`, `execution_control`, `system.timezone`, `file_paths.agent_data_dir`. On the
    /// embedded model task extraction is bypassed unless the file says otherwise.
    fn settings(&mut self, raw: &RawConfig, embedded_model: bool) -> Result<AgentSettings, ConfigError> {
        let approval = raw.approval.clone().unwrap_or_default();
        let control = raw.execution_control.as_ref();
        let agent_control = control.and_then(|control| control.agent_control.as_ref());
        if agent_control.and_then(|agent| agent.orchestration_mode) == Some(OrchestrationMode::React) {
            self.warnings.push(
                "execution_control.agent_control.orchestration_mode is react, which Peregrine does not support; plan_first is used"
                    .to_owned(),
            );
        }
        let limits = control.and_then(|control| control.limits).unwrap_or_default();
        if let Err(invalid) = limits.validate() {
            return Err(self.error_at(
                &format!("execution_control.limits.{}", invalid.field),
                format!("{} is invalid: {}", invalid.value, invalid.reason),
            ));
        }
        self.check_limit_ceilings(&limits)?;
        let defaults = AgentSettings::default();
        let written_dir = raw.file_paths.as_ref().and_then(|paths| paths.agent_data_dir.as_deref()).filter(|dir| !dir.trim().is_empty());
        let agent_data_dir = written_dir.map_or_else(|| self.project_dir.join("_agent_data"), |dir| self.path(dir));
        // `run` creates the directory; a file in its way would fail only then.
        checks::data_dir(&agent_data_dir).map_err(|mut message| {
            if written_dir.is_none() {
                message.push_str(" (the default agent data directory; set file_paths.agent_data_dir to another directory)");
            }
            self.error_at("file_paths.agent_data_dir", message)
        })?;
        let timezone = match raw.system.as_ref().and_then(|system| system.timezone.clone()) {
            Some(timezone) => {
                if let Some(file) = &timezone.unreadable_file {
                    self.warnings.push(format!(
                        "system.timezone is `{file}` (a zone file, as TZ=:/etc/localtime names one), which is not a link into a zoneinfo directory, so its timezone cannot be named; UTC is used (set TZ or system.timezone to a name such as Europe/Berlin)"
                    ));
                }
                timezone.zone
            }
            None => defaults::timezone(self.env),
        };
        Ok(AgentSettings {
            agent_control: AgentControl {
                planning_mode_enabled: agent_control.and_then(|agent| agent.planning_mode_enabled).unwrap_or(false),
                approval_mode: approval.global_mode,
                task_extraction_bypass_enabled: agent_control
                    .and_then(|agent| agent.task_extraction_bypass_enabled)
                    .unwrap_or(embedded_model),
                capability_selection_bypass_enabled: agent_control
                    .and_then(|agent| agent.capability_selection_bypass_enabled)
                    .unwrap_or(false),
                ..AgentControl::default()
            },
            approval,
            limits,
            timezone,
            agent_data_dir,
            classifier_mode: control.and_then(|control| control.classifier_mode).unwrap_or_default(),
            data_source_timeout: control
                .and_then(|control| control.data_source_timeout_seconds)
                .map_or(defaults.data_source_timeout, |seconds| Duration::from_secs_f64(seconds.0)),
            prompt_history_chars: control
                .and_then(|control| control.prompt_history_chars)
                .map_or(defaults.prompt_history_chars, |count| usize::try_from(count.0).unwrap_or(usize::MAX)),
        })
    }

    /// Limits beyond which a turn never ends in practice (`ExecutionLimits::validate` refuses the
    /// ones that would stop every turn).
    fn check_limit_ceilings(&self, limits: &ExecutionLimits) -> Result<(), ConfigError> {
        if limits.graph_recursion_limit > MAX_RECURSION_LIMIT {
            return Err(self.error_at(
                "execution_control.limits.graph_recursion_limit",
                format!(
                    "{} is too many steps for one turn (a turn of more than {MAX_RECURSION_LIMIT} is a loop, and every step writes a checkpoint); use at most {MAX_RECURSION_LIMIT} (the default is 100)",
                    limits.graph_recursion_limit
                ),
            ));
        }
        if limits.max_execution_time_seconds > MAX_EXECUTION_SECONDS {
            return Err(self.error_at(
                "execution_control.limits.max_execution_time_seconds",
                format!(
                    "{} seconds is longer than a turn can usefully run; use a number from 1 to {MAX_EXECUTION_SECONDS} (one day; the default is 300)",
                    limits.max_execution_time_seconds
                ),
            ));
        }
        Ok(())
    }

    fn checkpointer(&mut self, raw: Option<RawCheckpointer>, agent_data_dir: &Path) -> Result<CheckpointerConfig, ConfigError> {
        let raw = raw.unwrap_or_default();
        if let Some(size) = raw.pool_size.filter(|size| size.0 > MAX_POOL_SIZE) {
            return Err(self.error_at(
                "checkpointer.pool_size",
                format!("{} connections is more than a pool can hold; use a number from 1 to {MAX_POOL_SIZE} (the default is 16)", size.0),
            ));
        }
        let kind = raw.kind.unwrap_or(CheckpointerKind::Sqlite);
        let unused = |key: &str, kind: &str| format!("checkpointer.{key} is not used with type {kind} (ignored)");
        Ok(match kind {
            CheckpointerKind::Sqlite => {
                if raw.url.is_some() {
                    self.warnings.push(unused("url", "sqlite"));
                }
                let path = raw
                    .path
                    .filter(|path| !path.trim().is_empty())
                    .map_or_else(|| defaults::checkpoint_file(agent_data_dir), |path| self.path(&path));
                CheckpointerConfig::Sqlite { path }
            }
            CheckpointerKind::Postgres => {
                if raw.path.is_some() {
                    self.warnings.push(unused("path", "postgres"));
                }
                let Some(url) = raw.url.filter(|url| !url.trim().is_empty()) else {
                    let key =
                        if key_position(self.text, &["checkpointer", "type"]).is_some() { "checkpointer.type" } else { "checkpointer" };
                    return Err(self.error_at(
                        key,
                        "a postgres checkpointer needs checkpointer.url (postgres://user:password@host:5432/database; put the password in .env as ${PEREGRINE_POSTGRES_PASSWORD} or similar)".to_owned(),
                    ));
                };
                // Checked as the checkpointer will parse it, so that `config validate` refuses what
                // `threads` would; its password is a secret in every form it is written.
                let url = url.trim().to_owned();
                let parsed = dsn::parse(&url).map_err(|message| self.error_at("checkpointer.url", message))?;
                let secrets = parsed.secrets();
                if !secrets.is_empty() {
                    secrets.iter().for_each(|secret| self.secret(secret));
                    self.secret(&url);
                }
                CheckpointerConfig::Postgres { url: Secret::new(url), pool_size: raw.pool_size.map(|size| size.0 as usize) }
            }
            CheckpointerKind::Memory => {
                for key in ["path", "url"].into_iter().filter(|key| if *key == "path" { raw.path.is_some() } else { raw.url.is_some() }) {
                    self.warnings.push(unused(key, "memory"));
                }
                CheckpointerConfig::Memory
            }
        })
    }

    /// A path from the file: `~/` is the home directory, relative paths are against the
    /// config file's directory.
    fn path(&self, text: &str) -> PathBuf {
        defaults::expand_home(text.trim(), self.env).map_or_else(|| self.project_dir.join(text.trim()), |path| self.project_dir.join(path))
    }

    fn secret(&mut self, value: &str) {
        if !value.is_empty() && !self.secrets.0.iter().any(|known| known == value) {
            self.secrets.0.push(value.to_owned());
        }
    }

    /// An error at the line of `dotted` (or its nearest written ancestor); about a value that
    /// kept an unset reference, the error says so.
    fn error_at(&self, dotted: &str, message: String) -> ConfigError {
        let segments: Vec<&str> = dotted.split('.').collect();
        let position = key_position(self.text, &segments);
        let message = match self.unresolved.get(dotted) {
            Some(unresolved) => unset_message(dotted, unresolved, &message),
            None => message,
        };
        ConfigError {
            file: Some(self.file.to_owned()),
            line: position.map(|(line, _)| line),
            column: position.map(|(_, column)| column),
            key: Some(dotted.to_owned()),
            message: self.secrets.redact(&message),
        }
    }
}

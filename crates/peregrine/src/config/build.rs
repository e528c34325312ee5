//! From the text of `config.yml` to a validated [`Config`]: deserialization through the
//! interpolating wrapper, errors with file, line, column and dotted key (secrets redacted), the
//! checks that need the whole file (unknown providers, limits, the checkpointer), and the
//! mapping into the per-crate settings.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use peregrine_agent::AgentSettings;
use peregrine_core::AgentControl;
use peregrine_llm::{LlmConfig, ModelConfig, ProviderConfig, Secret, default_protocol};

use super::de::{EnvLookup, Interpolating, Scope, Walk};
use super::lines::key_position;
use super::raw::{CheckpointerKind, OrchestrationMode, RawCapabilities, RawCheckpointer, RawConfig, RawProvider, known_keys};
use super::{
    BUILTIN_CAPABILITIES, CapabilitiesConfig, CheckpointerConfig, Config, ConfigError, DevelopmentConfig, LoggingConfig, Secrets, defaults,
};

/// Top-level keys of Osprey 0.11's `config.yml` that Peregrine does not use (reported as
/// ignored, never hinted as typos).
const OSPREY_TOP_LEVEL: &[&str] = &[
    "project_name",
    "build_dir",
    "project_root",
    "registry_path",
    "container_runtime",
    "deployment",
    "services",
    "deployed_services",
    "execution",
    "control_system",
    "archiver",
    "channel_finder",
    "machine_state",
    "ariel",
    "python_executor",
    "pipeline",
    "cli",
    "applications",
];

/// Provider names with a built-in protocol (see `peregrine_llm::default_protocol`).
const BUILT_IN_PROVIDERS: &[&str] =
    &["anthropic", "amsc", "cborg", "llama-server", "llama_server", "lmstudio", "local", "ollama", "openai", "stanford", "vllm"];

/// Parses and validates one file's text; `path` names it in errors and anchors relative paths.
pub(crate) fn parse(text: &str, path: &Path, env: EnvLookup<'_>) -> Result<Config, ConfigError> {
    let walk = RefCell::new(Walk::default());
    let raw = if is_blank(text) {
        RawConfig::default()
    } else if uses_merge_keys(text) {
        // `<<: *anchor` (PyYAML, hence upstream, merges them) needs the parsed document; its
        // errors then take their line from the key path.
        let mut document: serde_norway::Value = serde_norway::from_str(text).map_err(|error| yaml_error(&error, path))?;
        document.apply_merge().map_err(|error| yaml_error(&error, path))?;
        let result: Result<RawConfig, _> = serde_path_to_error::deserialize(Interpolating::new(document, Scope::for_value(env, &walk)));
        result.map_err(|error| deserialize_error(error, path, text, &walk.borrow().secrets))?
    } else {
        let deserializer = serde_norway::Deserializer::from_str(text);
        let result: Result<RawConfig, _> = serde_path_to_error::deserialize(Interpolating::new(deserializer, Scope::new(env, &walk)));
        result.map_err(|error| deserialize_error(error, path, text, &walk.borrow().secrets))?
    };
    let walk = walk.into_inner();
    let project_dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut build = Build { text, file: path, project_dir: &project_dir, env, secrets: Secrets(walk.secrets), warnings: walk.warnings };
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

/// Whether some line starts with a `<<` merge key.
fn uses_merge_keys(text: &str) -> bool {
    text.lines().any(|line| line.trim_start().trim_start_matches("- ").trim_start().starts_with("<<"))
}

/// A YAML syntax error (no secret can be in it: nothing is interpolated yet).
fn yaml_error(error: &serde_norway::Error, file: &Path) -> ConfigError {
    let location = error.location();
    ConfigError {
        file: Some(file.to_owned()),
        line: location.as_ref().map(serde_norway::Location::line),
        column: location.as_ref().map(serde_norway::Location::column),
        key: None,
        message: bare_message(&error.to_string(), "."),
    }
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
}

impl Build<'_> {
    fn config(&mut self, raw: RawConfig) -> Result<Config, ConfigError> {
        let llm = self.llm(&raw)?;
        let settings = self.settings(&raw)?;
        let checkpointer = self.checkpointer(raw.checkpointer, &settings.agent_data_dir)?;
        let capabilities = self.capabilities(raw.capabilities)?;
        let logging = raw.logging.unwrap_or_default();
        let logging = LoggingConfig {
            level: logging.level.filter(|level| !level.trim().is_empty()),
            file: logging.file.map(|file| self.path(&file)),
        };
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
            logging,
            development,
            ignored_keys: Vec::new(),
            warnings: Vec::new(),
            secrets: std::mem::take(&mut self.secrets),
        })
    }

    /// `capabilities.exclude`: names of built-in capabilities only.
    fn capabilities(&self, raw: Option<RawCapabilities>) -> Result<CapabilitiesConfig, ConfigError> {
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
        Ok(llm)
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

    /// `approval`, `execution_control`, `system.timezone`, `file_paths.agent_data_dir`.
    fn settings(&mut self, raw: &RawConfig) -> Result<AgentSettings, ConfigError> {
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
        let defaults = AgentSettings::default();
        let agent_data_dir = raw
            .file_paths
            .as_ref()
            .and_then(|paths| paths.agent_data_dir.as_deref())
            .filter(|dir| !dir.trim().is_empty())
            .map_or_else(|| self.project_dir.join("_agent_data"), |dir| self.path(dir));
        let timezone = match raw.system.as_ref().and_then(|system| system.timezone) {
            Some(timezone) => timezone.0,
            None => defaults::timezone(self.env),
        };
        Ok(AgentSettings {
            agent_control: AgentControl {
                planning_mode_enabled: agent_control.and_then(|agent| agent.planning_mode_enabled).unwrap_or(false),
                approval_mode: approval.global_mode,
                task_extraction_bypass_enabled: agent_control.and_then(|agent| agent.task_extraction_bypass_enabled).unwrap_or(false),
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

    fn checkpointer(&mut self, raw: Option<RawCheckpointer>, agent_data_dir: &Path) -> Result<CheckpointerConfig, ConfigError> {
        let raw = raw.unwrap_or_default();
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

    /// An error at the line of `dotted` (or its nearest written ancestor).
    fn error_at(&self, dotted: &str, message: String) -> ConfigError {
        let segments: Vec<&str> = dotted.split('.').collect();
        let position = key_position(self.text, &segments);
        ConfigError {
            file: Some(self.file.to_owned()),
            line: position.map(|(line, _)| line),
            column: position.map(|(_, column)| column),
            key: Some(dotted.to_owned()),
            message: self.secrets.redact(&message),
        }
    }
}

/// A deserialization error as a [`ConfigError`]: serde_norway's line and column, the dotted key
/// from serde_path_to_error, a message that says what is expected, secrets redacted.
fn deserialize_error(error: serde_path_to_error::Error<serde_norway::Error>, file: &Path, text: &str, secrets: &[String]) -> ConfigError {
    let path = error.path().to_string();
    let inner = error.into_inner();
    let location = inner.location();
    let mut message = bare_message(&inner.to_string(), &path);
    let mut key = (path != "." && !path.is_empty()).then(|| path.trim_end_matches(".?").trim_end_matches('?').to_owned());
    if let Some((field, expected)) = unknown_field(&message) {
        let hint = closest(&field, &expected).map(|candidate| format!("did you mean `{candidate}`? ")).unwrap_or_default();
        let expected = expected.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
        message = format!("unknown key `{field}`; {hint}expected one of {expected}");
        key = Some(match key {
            Some(parent) if !parent.ends_with(&field) => format!("{parent}.{field}"),
            Some(parent) => parent,
            None => field,
        });
    } else if key.is_none() && message.contains("expected struct RawConfig") {
        message = "config.yml must be a mapping of sections (models:, api:, execution_control:, …)".to_owned();
    }
    let position = match (&location, &key) {
        (Some(location), _) => Some((location.line(), location.column())),
        (None, Some(key)) => key_position(text, &key.split('.').collect::<Vec<_>>()),
        (None, None) => None,
    };
    ConfigError {
        file: Some(file.to_owned()),
        line: position.map(|(line, _)| line),
        column: position.map(|(_, column)| column),
        key,
        message: Secrets::redact_with(secrets, &polish(&message)),
    }
}

/// serde_norway's message without its own key prefix and position suffix (they are fields of
/// the error).
fn bare_message(text: &str, path: &str) -> String {
    // serde_norway prefixes its own key path, which may stop short of serde_path_to_error's.
    let mut message = match text.split_once(": ") {
        Some((head, rest)) if !head.contains(char::is_whitespace) && (head == "." || path.starts_with(head)) => rest.to_owned(),
        _ => text.to_owned(),
    };
    for marker in [" at line ", " at position "] {
        while let Some(start) = message.find(marker) {
            let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let rest = &message[start + marker.len()..];
            let mut end = start + marker.len() + digits(rest);
            if let Some(column) = message[end..].strip_prefix(" column ") {
                end += " column ".len() + digits(column);
            }
            message.replace_range(start..end, "");
        }
    }
    message
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a`").
fn unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected = rest.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    Some((field.to_owned(), expected))
}

/// Serde's Rust type names in messages, said in the words of a config file.
fn polish(message: &str) -> String {
    let mut out = message.replace("missing field", "missing key");
    for (rust, words) in [
        ("expected u8", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected a string", "expected text"),
    ] {
        out = out.replace(rust, words);
    }
    if let Some(start) = out.find("expected struct ") {
        let end = out[start..].find([',', ';']).map_or(out.len(), |offset| start + offset);
        out.replace_range(start..end, "expected a mapping of keys");
    }
    out
}

/// Warnings for ignored keys that look like misspelt keys Peregrine reads.
fn typo_hints(ignored: &[String]) -> Vec<String> {
    ignored
        .iter()
        .filter_map(|key| {
            let (section, name) = key.rsplit_once('.').unwrap_or(("", key.as_str()));
            if section.is_empty() && OSPREY_TOP_LEVEL.contains(&name) {
                return None;
            }
            let known: Vec<String> = known_keys(section).iter().map(|known| (*known).to_owned()).collect();
            let candidate = closest(name, &known)?;
            let suggestion = if section.is_empty() { candidate } else { format!("{section}.{candidate}") };
            Some(format!("{key} is not a key Peregrine reads (ignored); did you mean {suggestion}?"))
        })
        .collect()
}

/// The known name closest to `name`: within one edit for names of up to four characters, two
/// for longer ones.
fn closest(name: &str, known: &[String]) -> Option<String> {
    let allowed = if name.chars().count() <= 4 { 1 } else { 2 };
    known
        .iter()
        .filter(|candidate| candidate.as_str() != name)
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate.clone())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            current[j + 1] = (previous[j] + usize::from(ca != *cb)).min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_lose_their_position_and_prefix() {
        assert_eq!(
            bare_message("models.x.max_tokens: invalid type: string \"lots\", expected u32 at line 4 column 17", "models.x.max_tokens"),
            "invalid type: string \"lots\", expected u32"
        );
        assert_eq!(
            bare_message("did not find expected key at line 3 column 1, while parsing a block mapping at line 1 column 1", "."),
            "did not find expected key, while parsing a block mapping"
        );
        assert_eq!(
            bare_message("models.x: unknown field `max_token`, expected `provider`", "models.x.max_token"),
            "unknown field `max_token`, expected `provider`"
        );
        assert_eq!(bare_message("invalid type: string \"x\", expected u32", "a.b"), "invalid type: string \"x\", expected u32");
        assert_eq!(polish("invalid type: string \"x\", expected u32"), "invalid type: string \"x\", expected a whole number (0 or more)");
        assert_eq!(polish("invalid type: sequence, expected struct RawModel"), "invalid type: sequence, expected a mapping of keys");
    }

    #[test]
    fn unknown_fields_get_a_suggestion() {
        let (field, expected) =
            unknown_field("unknown field `max_token`, expected one of `provider`, `model_id`, `max_tokens`, `temperature`")
                .expect("recognised");
        assert_eq!(field, "max_token");
        assert_eq!(expected, ["provider", "model_id", "max_tokens", "temperature"]);
        assert_eq!(closest("max_token", &expected), Some("max_tokens".to_owned()));
        assert_eq!(closest("pth", &["path".to_owned()]), Some("path".to_owned()));
        assert_eq!(closest("url", &["uri_x".to_owned(), "type".to_owned()]), None, "short names need a close match");
        assert_eq!(edit_distance("base_ur1", "base_url"), 1);
    }

    #[test]
    fn typo_hints_skip_osprey_keys() {
        let ignored = ["cli".to_owned(), "services".to_owned(), "api.providers.openai.base_ur1".to_owned(), "logging.levle".to_owned()];
        let hints = typo_hints(&ignored);
        assert_eq!(hints.len(), 2, "{hints:?}");
        assert!(hints[0].contains("did you mean api.providers.openai.base_url?"), "{hints:?}");
        assert!(hints[1].contains("did you mean logging.level?"), "{hints:?}");
    }
}

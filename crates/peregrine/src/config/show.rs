//! The effective configuration as JSON (`peregrine config show`): what the run will use, with
//! defaults filled in and every secret hidden.

use std::collections::BTreeMap;

use peregrine_llm::{ProviderConfig, default_protocol, roles};
use serde_json::{Map, Value, json};

use super::interpolate::hide_url_passwords;
use super::{CheckpointerConfig, Config, dsn};

/// The roles the framework asks models for, shown resolved.
const ROLES: &[&str] = &[
    roles::TASK_EXTRACTION,
    roles::CLASSIFIER,
    roles::ORCHESTRATOR,
    roles::REACTIVE_ORCHESTRATOR,
    roles::RESPONSE,
    roles::APPROVAL,
    roles::MEMORY,
    roles::TIME_PARSING,
    roles::PYTHON_CODE_GENERATOR,
    roles::STATE_MANAGER_REACT,
];

/// The effective configuration of `config`, secrets replaced by `***`.
pub(crate) fn effective(config: &Config) -> Value {
    let settings = &config.settings;
    let control = &settings.agent_control;
    let mut document = json!({
        "source": config.source.as_ref().map(|path| path.display().to_string()),
        "project_dir": config.project_dir.display().to_string(),
        "models": models(config),
        "api": {"providers": providers(config)},
        "approval": serde_json::to_value(&settings.approval).unwrap_or(Value::Null),
        "execution_control": {
            "agent_control": {
                "orchestration_mode": "plan_first",
                "planning_mode_enabled": control.planning_mode_enabled,
                "task_extraction_bypass_enabled": control.task_extraction_bypass_enabled,
                "capability_selection_bypass_enabled": control.capability_selection_bypass_enabled,
            },
            "limits": serde_json::to_value(settings.limits).unwrap_or(Value::Null),
            "classifier_mode": serde_json::to_value(settings.classifier_mode).unwrap_or(Value::Null),
            "prompt_history_chars": settings.prompt_history_chars,
            "data_source_timeout_seconds": settings.data_source_timeout.as_secs_f64(),
        },
        "system": {"timezone": settings.timezone.name()},
        "file_paths": {"agent_data_dir": settings.agent_data_dir.display().to_string()},
        "checkpointer": checkpointer(&config.checkpointer),
        "capabilities": {"exclude": config.capabilities.exclude},
        "server": {
            "host": config.server.host,
            "port": config.server.port,
            "api_keys": config.server.api_keys.iter().map(|_| "***").collect::<Vec<_>>(),
            "max_body_bytes": config.server.max_body_bytes,
            "max_message_bytes": config.server.max_message_bytes,
            "max_turns_in_flight": config.server.max_turns_in_flight,
            "max_connections": config.server.max_connections,
            "header_timeout_seconds": config.server.header_timeout.as_secs(),
            "body_timeout_seconds": config.server.body_timeout.as_secs(),
            "allowed_origins": config.server.allowed_origins,
            "status_lines": config.server.status_lines.as_str(),
        },
        "logging": {
            "level": config.logging.level,
            "file": config.logging.file.as_ref().map(|path| path.display().to_string()),
        },
        "development": {
            "raise_raw_errors": config.development.raise_raw_errors,
            "api_calls": {"save_all": config.development.save_api_calls},
        },
        "ignored_keys": config.ignored_keys,
        "warnings": config.warnings,
    });
    redact_strings(&mut document, config);
    document
}

/// Every framework role and every configured key, resolved with upstream's fallbacks.
fn models(config: &Config) -> Value {
    let mut names: Vec<&str> = ROLES.to_vec();
    names.extend(config.llm.models.keys().map(String::as_str).filter(|name| !ROLES.contains(name)));
    let mut out = Map::new();
    for role in names {
        let value = match config.llm.model_for(role) {
            Ok(resolved) => {
                let mut model = serde_json::to_value(resolved.model).unwrap_or(Value::Null);
                if resolved.config_key != role
                    && let Value::Object(fields) = &mut model
                {
                    fields.insert("from".to_owned(), Value::String(format!("models.{}", resolved.config_key)));
                }
                model
            }
            Err(_) => Value::String(format!("not configured (add models.{role} or models.default)")),
        };
        out.insert(role.to_owned(), value);
    }
    Value::Object(out)
}

/// Configured providers and the built-in ones a model uses, with their effective settings.
fn providers(config: &Config) -> Value {
    let mut all: BTreeMap<&str, ProviderConfig> =
        config.llm.providers.iter().map(|(name, provider)| (name.as_str(), provider.clone())).collect();
    for model in config.llm.models.values() {
        all.entry(model.provider.as_str()).or_default();
    }
    let out: Map<String, Value> = all
        .into_iter()
        .map(|(name, provider)| {
            let value = json!({
                "protocol": provider.protocol.as_deref().or_else(|| default_protocol(name)),
                "api_key": provider.api_key.as_ref().map(|_| "***"),
                "base_url": provider.base_url.as_deref().map(hide_url_passwords),
                "timeout_seconds": provider.timeout_seconds.unwrap_or(120.0),
                "max_retries": provider.retries(),
                "model_path": provider.model_path,
            });
            (name.to_owned(), value)
        })
        .collect();
    Value::Object(out)
}

fn checkpointer(checkpointer: &CheckpointerConfig) -> Value {
    match checkpointer {
        CheckpointerConfig::Sqlite { path } => json!({"type": "sqlite", "path": path.display().to_string()}),
        CheckpointerConfig::Postgres { url, pool_size } => {
            json!({"type": "postgres", "url": dsn::masked(url.expose()), "pool_size": pool_size.unwrap_or(16)})
        }
        CheckpointerConfig::Memory => json!({"type": "memory"}),
    }
}

/// Belt and braces: no string of the document may contain a secret (of the length that is
/// scrubbed from free text; the fields that hold secrets are masked above whatever their length).
fn redact_strings(value: &mut Value, config: &Config) {
    match value {
        Value::String(text) => {
            let redacted = config.redact(text);
            if redacted != *text {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact_strings(item, config)),
        Value::Object(fields) => fields.values_mut().for_each(|field| redact_strings(field, config)),
        _ => {}
    }
}

//! Per-role model configuration in Osprey's vocabulary: `models.<role>: {provider, model_id,
//! max_tokens, temperature}` and `api.providers.<name>: {api_key, base_url, timeout_seconds}`.
//! Secrets never print.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{LlmError, LlmErrorKind};

/// The roles the framework calls models for.
pub mod roles {
    /// Task extraction.
    pub const TASK_EXTRACTION: &str = "task_extraction";
    /// Per-capability classification.
    pub const CLASSIFIER: &str = "classifier";
    /// Planning.
    pub const ORCHESTRATOR: &str = "orchestrator";
    /// ReAct orchestration (falls back to `orchestrator`).
    pub const REACTIVE_ORCHESTRATOR: &str = "reactive_orchestrator";
    /// Respond, clarify, error analysis.
    pub const RESPONSE: &str = "response";
    /// Free-text approval detection.
    pub const APPROVAL: &str = "approval";
    /// Memory extraction.
    pub const MEMORY: &str = "memory";
    /// Time-range parsing.
    pub const TIME_PARSING: &str = "time_parsing";
    /// Python code generation.
    pub const PYTHON_CODE_GENERATOR: &str = "python_code_generator";
    /// The state-manager ReAct agent (falls back to `orchestrator`).
    pub const STATE_MANAGER_REACT: &str = "state_manager_react";
    /// The `channel_write` capability's reading of a task into write operations (falls back to
    /// `orchestrator`).
    pub const CHANNEL_WRITE: &str = "channel_write";
    /// The `channel_read` capability's reading of the channels a task names (falls back to
    /// `classifier`).
    pub const CHANNEL_FINDER: &str = "channel_finder";
}

/// A secret string (API key): usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// The model used for one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A key of `api.providers` (or a built-in provider name).
    pub provider: String,
    /// The provider's model id.
    pub model_id: String,
    /// Output token cap.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Sampling temperature (honoured, unlike upstream).
    #[serde(default)]
    pub temperature: Option<f32>,
}

/// Credentials and endpoint of one provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// API key (from `${ENV}` interpolation, never printed).
    #[serde(default)]
    pub api_key: Option<Secret>,
    /// Endpoint, e.g. `https://api.openai.com/v1` or `http://localhost:11434`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Per-request timeout in seconds (default 120).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Transport retries for transient faults (default 2, as upstream's LiteLLM).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// For the `local` provider: the GGUF model file.
    #[serde(default)]
    pub model_path: Option<String>,
    /// The wire protocol: `openai` (also vLLM, CBorg, LM Studio, llama-server, Ollama's `/v1`),
    /// `anthropic`, `ollama` (native `/api/chat`) or `local`. Defaults from the provider name;
    /// required for other names.
    #[serde(default)]
    pub protocol: Option<String>,
}

impl ProviderConfig {
    /// The request timeout (120 s when unset); a value that is not a positive number of seconds
    /// is refused rather than replaced.
    pub fn timeout(&self, provider: &str) -> Result<Duration, LlmError> {
        match self.timeout_seconds {
            None => Ok(Duration::from_secs(120)),
            Some(seconds) if seconds.is_finite() && seconds > 0.0 => {
                Duration::try_from_secs_f64(seconds).map_err(|_| invalid_timeout(provider, seconds))
            }
            Some(seconds) => Err(invalid_timeout(provider, seconds)),
        }
    }

    /// Transport retries for transient faults: 2 by default, at most 10.
    pub fn retries(&self) -> u32 {
        self.max_retries.unwrap_or(2).min(10)
    }
}

fn invalid_timeout(provider: &str, seconds: f64) -> LlmError {
    LlmError::new(
        LlmErrorKind::Config,
        provider,
        "-",
        format!("api.providers.{provider}.timeout_seconds is {seconds}; use a positive number of seconds"),
    )
}

/// `models` plus `api.providers`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmConfig {
    /// Model per role.
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
    /// Provider settings by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
}

/// A role's model after fallbacks.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedModel<'a> {
    /// The role asked for.
    pub role: &'a str,
    /// The config key that supplied the model (`models.<key>`).
    pub config_key: &'a str,
    /// The model.
    pub model: &'a ModelConfig,
}

impl LlmConfig {
    /// The model for `role`: its own entry, else upstream's fallbacks (`reactive_orchestrator`
    /// `state_manager_react` and `channel_write` use `orchestrator`, `channel_finder` uses
    /// `classifier`), else `models.default` when configured.
    pub fn model_for<'a>(&'a self, role: &'a str) -> Result<ResolvedModel<'a>, LlmError> {
        let fallback = match role {
            roles::REACTIVE_ORCHESTRATOR | roles::STATE_MANAGER_REACT | roles::CHANNEL_WRITE => Some(roles::ORCHESTRATOR),
            roles::CHANNEL_FINDER => Some(roles::CLASSIFIER),
            _ => None,
        };
        for key in [Some(role), fallback, Some("default")].into_iter().flatten() {
            if let Some((config_key, model)) = self.models.get_key_value(key) {
                return Ok(ResolvedModel { role, config_key: config_key.as_str(), model });
            }
        }
        let configured = self.models.keys().cloned().collect::<Vec<_>>().join(", ");
        Err(LlmError::new(
            LlmErrorKind::Config,
            "-",
            "-",
            format!(
                "no model is configured for role '{role}'; add models.{role}: {{provider, model_id}} (or models.default) to config.yml (configured roles: {})",
                if configured.is_empty() { "none".to_string() } else { configured }
            ),
        )
        .with_role(role))
    }

    /// The settings of a provider (empty when it has none).
    pub fn provider(&self, name: &str) -> ProviderConfig {
        self.providers.get(name).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LlmConfig {
        serde_json::from_value(serde_json::json!({
            "models": {
                "orchestrator": {"provider": "cborg", "model_id": "anthropic/claude-sonnet", "max_tokens": 4096, "temperature": 0.2},
                "classifier": {"provider": "ollama", "model_id": "mistral:7b"}
            },
            "providers": {"cborg": {"api_key": "sk-secret", "base_url": "https://api.cborg.lbl.gov"}}
        }))
        .expect("valid config")
    }

    #[test]
    fn roles_resolve_with_upstream_fallbacks() {
        let config = config();
        assert_eq!(config.model_for("classifier").expect("own entry").config_key, "classifier");
        let reactive = config.model_for(roles::REACTIVE_ORCHESTRATOR).expect("falls back");
        assert_eq!((reactive.config_key, reactive.model.temperature), ("orchestrator", Some(0.2)));
        let error = config.model_for("memory").expect_err("no model, no default");
        assert!(error.to_string().contains("add models.memory"), "{error}");
        let mut with_default = config;
        with_default.models.insert(
            "default".into(),
            ModelConfig { provider: "local".into(), model_id: "smollm2".into(), max_tokens: None, temperature: None },
        );
        assert_eq!(with_default.model_for("memory").expect("default").config_key, "default");
    }

    #[test]
    fn secrets_never_print() {
        let config = config();
        let provider = config.provider("cborg");
        assert_eq!(provider.api_key.as_ref().map(Secret::expose), Some("sk-secret"));
        assert!(!format!("{provider:?}").contains("sk-secret"));
        assert!(!serde_json::to_string(&provider).expect("serializes").contains("sk-secret"));
    }
}

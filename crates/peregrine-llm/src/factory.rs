//! Builds providers from `api.providers.<name>` by protocol, and a client with every provider
//! the configured roles use (providers nobody uses are not built, so a missing local model or
//! key of an unused provider never blocks start-up).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::anthropic::AnthropicProvider;
use crate::client::LlmClient;
use crate::config::{LlmConfig, ProviderConfig};
use crate::error::{LlmError, LlmErrorKind};
use crate::ollama::OllamaProvider;
use crate::openai::{OpenAiCompatible, default_base_url};
use crate::provider::DynLlmProvider;

/// The wire protocol of a provider name when its config does not say.
pub fn default_protocol(provider: &str) -> Option<&'static str> {
    Some(match provider {
        "openai" | "vllm" | "cborg" | "stanford" | "amsc" | "lmstudio" | "llama-server" | "llama_server" => "openai",
        "anthropic" => "anthropic",
        "ollama" => "ollama",
        "local" => "local",
        _ => return None,
    })
}

/// Builds the provider called `name` from its config.
pub fn build_provider(name: &str, config: &ProviderConfig) -> Result<Arc<dyn DynLlmProvider>, LlmError> {
    let protocol = config.protocol.as_deref().or_else(|| default_protocol(name)).ok_or_else(|| {
        LlmError::new(
            LlmErrorKind::Config,
            name,
            "-",
            format!("provider '{name}' has no known protocol; set api.providers.{name}.protocol to openai, anthropic, ollama or local"),
        )
    })?;
    Ok(match protocol {
        "openai" => Arc::new(OpenAiCompatible::new(name, config, default_base_url(name).unwrap_or_default())?),
        "anthropic" => Arc::new(AnthropicProvider::new(name, config)?),
        "ollama" => Arc::new(OllamaProvider::new(name, config)?),
        "local" => local(name, config)?,
        other => {
            return Err(LlmError::new(
                LlmErrorKind::Config,
                name,
                "-",
                format!("api.providers.{name}.protocol is '{other}'; use openai, anthropic, ollama or local"),
            ));
        }
    })
}

#[cfg(feature = "local")]
fn local(name: &str, config: &ProviderConfig) -> Result<Arc<dyn DynLlmProvider>, LlmError> {
    Ok(Arc::new(crate::local::LocalProvider::load(name, config)?))
}

#[cfg(not(feature = "local"))]
fn local(name: &str, _config: &ProviderConfig) -> Result<Arc<dyn DynLlmProvider>, LlmError> {
    Err(LlmError::new(
        LlmErrorKind::Config,
        name,
        "-",
        "this build has no embedded model; build peregrine with `--features local` or configure a remote provider",
    ))
}

impl LlmClient {
    /// A client with every provider that some `models.<role>` uses, built from `api.providers`.
    pub fn from_config(config: LlmConfig) -> Result<Self, LlmError> {
        let used: BTreeSet<String> = config.models.values().map(|model| model.provider.clone()).collect();
        let mut providers = Vec::with_capacity(used.len());
        for name in &used {
            providers.push((name.clone(), build_provider(name, &config.provider(name))?));
        }
        Ok(providers.into_iter().fold(LlmClient::new(config), |client, (name, provider)| client.with_shared_provider(name, provider)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    #[test]
    fn protocols_come_from_the_name_or_the_config() {
        assert_eq!(default_protocol("cborg"), Some("openai"));
        assert_eq!(default_protocol("my-gateway"), None);
        let error = build_provider("my-gateway", &ProviderConfig::default()).err().expect("unknown protocol");
        assert!(error.to_string().contains("api.providers.my-gateway.protocol"), "{error}");
        let gateway =
            ProviderConfig { protocol: Some("openai".into()), base_url: Some("http://127.0.0.1:9/v1".into()), ..ProviderConfig::default() };
        assert_eq!(build_provider("my-gateway", &gateway).expect("built").name(), "my-gateway");
    }

    #[test]
    fn only_used_providers_are_built() {
        let mut config = LlmConfig::default();
        config
            .models
            .insert("response".into(), ModelConfig { provider: "vllm".into(), model_id: "m".into(), max_tokens: None, temperature: None });
        config.providers.insert("broken".into(), ProviderConfig { protocol: Some("carrier-pigeon".into()), ..ProviderConfig::default() });
        assert!(LlmClient::from_config(config.clone()).is_ok(), "an unused broken provider does not block start-up");
        config.models.insert(
            "classifier".into(),
            ModelConfig { provider: "broken".into(), model_id: "m".into(), max_tokens: None, temperature: None },
        );
        let error = LlmClient::from_config(config).expect_err("a used broken provider is refused");
        assert!(error.to_string().contains("carrier-pigeon"), "{error}");
    }
}

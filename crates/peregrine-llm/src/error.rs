//! LLM failures classified by what the caller should do next: retry with backoff, fix the
//! configuration, shorten the prompt, or feed a validation error back to the model.

use std::time::Duration;

use peregrine_core::{ErrorClassification, ErrorSeverity};

/// What went wrong, from the caller's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LlmErrorKind {
    /// The server could not be reached.
    Connect,
    /// No answer within the timeout.
    Timeout,
    /// 429: too many requests; wait `retry_after` if given.
    RateLimited,
    /// 5xx from the provider.
    Server {
        /// HTTP status.
        status: u16,
    },
    /// 401/403: the credentials are wrong or lack permission.
    Auth {
        /// HTTP status.
        status: u16,
    },
    /// The model id is unknown to the provider.
    InvalidModel,
    /// The prompt does not fit the model's context window.
    ContextLength,
    /// A stream ended before it was complete.
    StreamCut,
    /// The answer could not be parsed or did not validate against the expected type.
    InvalidOutput,
    /// Any other 4xx: the request itself is wrong.
    BadRequest {
        /// HTTP status.
        status: u16,
    },
    /// The provider answered with something that is not its protocol (e.g. not JSON).
    Protocol,
    /// Configuration is missing or wrong (no model for a role, no API key, …).
    Config,
}

/// What happened, in words (error reports show it to people, who need no Rust type names).
impl std::fmt::Display for LlmErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect => f.write_str("the model provider could not be reached"),
            Self::Timeout => f.write_str("the model provider did not answer in time"),
            Self::RateLimited => f.write_str("the model provider refused the request: too many requests (HTTP 429)"),
            Self::Server { status } => write!(f, "the model provider failed with a server error (HTTP {status})"),
            Self::Auth { status } => write!(f, "the model provider refused the credentials (HTTP {status})"),
            Self::InvalidModel => f.write_str("the model provider does not know the model"),
            Self::ContextLength => f.write_str("the prompt is longer than the model's context window"),
            Self::StreamCut => f.write_str("the model's streamed answer broke off before it was complete"),
            Self::InvalidOutput => f.write_str("the model's answer was not in the expected format"),
            Self::BadRequest { status } => write!(f, "the model provider refused the request as invalid (HTTP {status})"),
            Self::Protocol => f.write_str("the model provider answered with something that is not its API's format"),
            Self::Config => f.write_str("the model configuration is missing or wrong"),
        }
    }
}

/// The recovery an [`LlmError`] calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// Transient: retry after a backoff.
    Retriable,
    /// The prompt is too long: shorten it (history, context) and try again.
    ContextOverflow,
    /// Nothing changes by retrying: fix configuration or code.
    Critical,
}

/// A failed LLM call, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmError {
    /// The kind of failure.
    pub kind: LlmErrorKind,
    /// The provider's config name.
    pub provider: String,
    /// The model id.
    pub model: String,
    /// The model role (`orchestrator`, `classifier`, …), when known.
    pub role: Option<String>,
    /// What happened and what to do.
    pub message: String,
    /// How long the provider asked us to wait (429 `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for LlmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(role) = &self.role {
            write!(f, "LLM role '{role}' via ")?;
        }
        match (self.provider.as_str(), self.model.as_str()) {
            ("-", _) => write!(f, "LLM: {}", self.message),
            (provider, "-") => write!(f, "provider '{provider}': {}", self.message),
            (provider, model) => write!(f, "{provider} model '{model}': {}", self.message),
        }
    }
}

impl std::error::Error for LlmError {}

/// A node or capability whose LLM call failed fails with the LLM layer's classification
/// (RETRIABLE transient faults and invalid output, CRITICAL configuration and authentication).
impl From<LlmError> for peregrine_core::CapabilityError {
    fn from(error: LlmError) -> Self {
        let classification = error.classification();
        Self::from_error(error).classified(classification)
    }
}

impl LlmError {
    /// An error of `kind` at `provider`/`model`.
    pub fn new(kind: LlmErrorKind, provider: impl Into<String>, model: impl Into<String>, message: impl Into<String>) -> Self {
        Self { kind, provider: provider.into(), model: model.into(), role: None, message: message.into(), retry_after: None }
    }

    /// Names the role the call was made for.
    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }

    /// Sets the provider's requested wait.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The recovery this error calls for.
    pub fn class(&self) -> FaultClass {
        match self.kind {
            LlmErrorKind::Connect
            | LlmErrorKind::Timeout
            | LlmErrorKind::RateLimited
            | LlmErrorKind::Server { .. }
            | LlmErrorKind::StreamCut
            | LlmErrorKind::InvalidOutput
            | LlmErrorKind::Protocol => FaultClass::Retriable,
            LlmErrorKind::ContextLength => FaultClass::ContextOverflow,
            LlmErrorKind::Auth { .. } | LlmErrorKind::InvalidModel | LlmErrorKind::BadRequest { .. } | LlmErrorKind::Config => {
                FaultClass::Critical
            }
        }
    }

    /// Whether the transport should retry it (output problems are retried by the structured
    /// layer with the validation error fed back instead).
    pub fn is_transient(&self) -> bool {
        self.class() == FaultClass::Retriable && self.kind != LlmErrorKind::InvalidOutput
    }

    /// The classification a node reports: RETRIABLE for transient faults and invalid output,
    /// CRITICAL for configuration faults; a context overflow is RETRIABLE (the next attempt
    /// may shorten the prompt) with its own `replanning_reason`.
    pub fn classification(&self) -> ErrorClassification {
        let severity = match self.class() {
            FaultClass::Retriable | FaultClass::ContextOverflow => ErrorSeverity::Retriable,
            FaultClass::Critical => ErrorSeverity::Critical,
        };
        let mut classification =
            ErrorClassification::new(severity, self.to_string()).with_metadata("technical_details", self.kind.to_string());
        if self.class() == FaultClass::ContextOverflow {
            classification = classification.with_metadata("replanning_reason", "the prompt exceeded the model's context window");
        }
        classification
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_callers_next_action() {
        let table = [
            (LlmErrorKind::Connect, FaultClass::Retriable),
            (LlmErrorKind::Timeout, FaultClass::Retriable),
            (LlmErrorKind::RateLimited, FaultClass::Retriable),
            (LlmErrorKind::Server { status: 503 }, FaultClass::Retriable),
            (LlmErrorKind::StreamCut, FaultClass::Retriable),
            (LlmErrorKind::InvalidOutput, FaultClass::Retriable),
            (LlmErrorKind::Auth { status: 401 }, FaultClass::Critical),
            (LlmErrorKind::InvalidModel, FaultClass::Critical),
            (LlmErrorKind::Config, FaultClass::Critical),
            (LlmErrorKind::ContextLength, FaultClass::ContextOverflow),
        ];
        for (kind, class) in table {
            assert_eq!(LlmError::new(kind.clone(), "openai", "gpt", "x").class(), class, "{kind:?}");
        }
    }

    #[test]
    fn messages_name_role_provider_and_model() {
        let error = LlmError::new(
            LlmErrorKind::Auth { status: 401 },
            "cborg",
            "gpt-4o",
            "the API key was refused; set api.providers.cborg.api_key",
        )
        .with_role("orchestrator");
        assert_eq!(
            error.to_string(),
            "LLM role 'orchestrator' via cborg model 'gpt-4o': the API key was refused; set api.providers.cborg.api_key"
        );
        assert_eq!(error.classification().severity, ErrorSeverity::Critical);
    }

    #[test]
    fn the_technical_details_say_what_happened_in_words() {
        let table = [
            (LlmErrorKind::Server { status: 500 }, "the model provider failed with a server error (HTTP 500)"),
            (LlmErrorKind::Auth { status: 401 }, "the model provider refused the credentials (HTTP 401)"),
            (LlmErrorKind::RateLimited, "the model provider refused the request: too many requests (HTTP 429)"),
            (LlmErrorKind::Timeout, "the model provider did not answer in time"),
        ];
        for (kind, words) in table {
            let classification = LlmError::new(kind.clone(), "vllm", "qwen", "x").classification();
            assert_eq!(classification.metadata.get("technical_details"), Some(&serde_json::json!(words)), "{kind:?}");
        }
    }
}

//! Peregrine's LLM layer. Nodes call [`LlmClient`] with a model *role*; the client resolves
//! the role's model and provider from `models.<role>` and `api.providers.<name>`, retries
//! transient transport faults, turns answers into typed values through the structured-output
//! protocol, streams tokens as events, and accounts usage.
//!
//! Model output is untrusted input: it is cleaned, parsed against the expected type and, on
//! failure, classified (RETRIABLE, with the validation error fed back once) — never unwrapped.

pub mod anthropic;
pub mod client;
pub mod config;
pub mod error;
pub mod factory;
pub mod fake;
pub mod http;
#[cfg(feature = "local")]
pub mod local;
pub mod ollama;
pub mod openai;
pub mod provider;
pub mod structured;
pub mod types;

pub use anthropic::AnthropicProvider;
pub use client::{CallOptions, LlmClient, UsageRecord};
pub use config::{LlmConfig, ModelConfig, ProviderConfig, Secret, roles};
pub use error::{FaultClass, LlmError, LlmErrorKind};
pub use factory::{build_provider, default_protocol};
pub use fake::FakeProvider;
#[cfg(feature = "local")]
pub use local::LocalProvider;
pub use ollama::OllamaProvider;
pub use openai::OpenAiCompatible;
pub use provider::{DynLlmProvider, EventStream, LlmProvider};
pub use structured::{clean_json, parse, schema_for, schema_prompt};
pub use types::{
    ChatMessage, ChatRequest, ChatResponse, ChatRole, ProviderFeatures, ResponseSchema, StreamEvent, ToolCall, ToolSpec, Usage,
};

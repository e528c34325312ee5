//! Provider-neutral request and response types: chat messages, structured-output schemas,
//! tool definitions and calls, usage, and streaming events.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    /// Instructions for the model.
    System,
    /// The person (or the framework speaking for the task).
    User,
    /// The model.
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Author.
    pub role: ChatRole,
    /// Text.
    pub content: String,
}

impl ChatMessage {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self { role: ChatRole::System, content: content.into() }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: ChatRole::User, content: content.into() }
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self { role: ChatRole::Assistant, content: content.into() }
    }
}

/// A JSON schema the answer must follow, named after the Rust type it is parsed into
/// (`ExtractedTask`, `CapabilityMatch`, `ExecutionPlan`, …) so logs, proxies and test servers
/// can tell calls apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseSchema {
    /// The type's name.
    pub name: String,
    /// The JSON schema.
    pub schema: Value,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Function name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// A function call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id (provider-assigned).
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as the model wrote them (JSON text; untrusted).
    pub arguments: String,
}

/// One completion request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    /// The provider's model id.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Structured output: the provider's native JSON-schema mode (the client puts the schema
    /// in the prompt instead for providers without one).
    pub response_schema: Option<ResponseSchema>,
    /// Functions the model may call.
    pub tools: Vec<ToolSpec>,
}

/// Token counts of one call, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Completion tokens.
    pub output_tokens: Option<u64>,
}

/// A finished completion.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The text (JSON text for structured calls).
    pub content: String,
    /// Function calls, if the model made any.
    pub tool_calls: Vec<ToolCall>,
    /// Token counts.
    pub usage: Usage,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, …).
    pub finish_reason: Option<String>,
    /// The model that answered.
    pub model: String,
}

/// One event of a streamed completion.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of text.
    Token(String),
    /// The stream ended; the whole response (content assembled from the tokens).
    Done(ChatResponse),
}

/// What a provider can do natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProviderFeatures {
    /// Honours `response_schema` itself (otherwise the client prompts with the schema).
    pub native_json_schema: bool,
    /// Streams tokens.
    pub streaming: bool,
    /// Supports tool calls.
    pub tools: bool,
}

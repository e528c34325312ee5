//! The Anthropic provider: the native Messages API (`POST {base_url}/v1/messages`), plain and
//! streamed (SSE), with system prompts in `system`, tools, usage, and structured output through
//! a forced tool named after the schema whose input becomes the answer's JSON text.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::config::{ProviderConfig, Secret};
use crate::error::{LlmError, LlmErrorKind};
use crate::http::{self, LineParser};
use crate::provider::{EventStream, LlmProvider};
use crate::types::{ChatMessage, ChatRequest, ChatResponse, ChatRole, ProviderFeatures, StreamEvent, ToolCall, Usage};

/// The endpoint when `api.providers.<name>.base_url` is not set.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent with every request.
pub const API_VERSION: &str = "2023-06-01";
/// The output cap sent when the request has none (the Messages API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A provider speaking Anthropic's Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    name: String,
    base_url: String,
    api_key: Secret,
    http: reqwest::Client,
}

impl AnthropicProvider {
    /// A provider called `name` (its `api.providers` key) using `config`; the API key is required.
    pub fn new(name: &str, config: &ProviderConfig) -> Result<Self, LlmError> {
        let base_url = http::validate_base_url(name, config.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL))?;
        let api_key = config.api_key.clone().ok_or_else(|| {
            LlmError::new(
                LlmErrorKind::Config,
                name,
                "-",
                format!("no API key: set api.providers.{name}.api_key (e.g. api_key: ${{ANTHROPIC_API_KEY}})"),
            )
        })?;
        let http = http::client(config.timeout(name)?).map_err(|error| LlmError { provider: name.into(), ..error })?;
        Ok(Self { name: name.into(), base_url, api_key, http })
    }

    fn url(&self) -> String {
        format!("{}/v1/messages", self.base_url)
    }

    async fn send(&self, request: &ChatRequest, stream: bool) -> Result<reqwest::Response, LlmError> {
        let url = self.url();
        let builder = self
            .http
            .post(&url)
            .header("x-api-key", self.api_key.expose())
            .header("anthropic-version", API_VERSION)
            .json(&body(request, stream));
        http::send(builder, &self.name, &request.model, &url).await
    }

    fn protocol_error(&self, model: &str, what: impl std::fmt::Display) -> LlmError {
        LlmError::new(
            LlmErrorKind::Protocol,
            &self.name,
            model,
            format!("the answer from {} is not an Anthropic message: {what}", self.url()),
        )
    }
}

/// The Messages API body for `request`.
fn body(request: &ChatRequest, stream: bool) -> Value {
    let (system, messages) = split_messages(&request.messages);
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
        "stream": stream,
    });
    if let Some(system) = system {
        body["system"] = json!(system);
    }
    if let Some(temperature) = request.temperature {
        body["temperature"] = json!(temperature);
    }
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        .map(|tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters}))
        .collect();
    if let Some(schema) = &request.response_schema {
        tools.push(json!({
            "name": schema.name,
            "description": format!("Reply with one {} object: call this tool with the answer as its input.", schema.name),
            "input_schema": schema.schema,
        }));
        body["tool_choice"] = json!({"type": "tool", "name": schema.name});
    }
    if !tools.is_empty() {
        body["tools"] = json!(tools);
    }
    body
}

/// System messages joined into one `system` text; the rest as alternating user/assistant
/// messages (consecutive messages of one role merged, as the API requires alternation).
fn split_messages(messages: &[ChatMessage]) -> (Option<String>, Vec<Value>) {
    let mut system: Vec<&str> = Vec::new();
    let mut turns: Vec<(&'static str, String)> = Vec::new();
    for message in messages {
        let role = match message.role {
            ChatRole::System => {
                system.push(&message.content);
                continue;
            }
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        };
        match turns.last_mut() {
            Some((last_role, content)) if *last_role == role => {
                content.push_str("\n\n");
                content.push_str(&message.content);
            }
            _ => turns.push((role, message.content.clone())),
        }
    }
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    (system, turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect())
}

fn usage_of(usage: Option<&Value>) -> Usage {
    let count = |field: &str| usage.and_then(|usage| usage.get(field)).and_then(Value::as_u64);
    Usage { input_tokens: count("input_tokens"), output_tokens: count("output_tokens") }
}

/// `stop_reason` in the provider-neutral vocabulary (`stop`, `length`, `tool_calls`); a forced
/// schema tool is the answer itself, so it stops as `stop`. Unknown reasons pass through.
fn finish_reason(stop_reason: &str, answered_by_schema_tool: bool) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" => "length",
        "tool_use" if answered_by_schema_tool => "stop",
        "tool_use" => "tool_calls",
        other => other,
    }
    .to_owned()
}

/// The kind of an error named by its Anthropic `error.type` (in a stream there is no status):
/// the HTTP status that type is documented with.
fn status_of_error_type(error_type: &str) -> u16 {
    match error_type {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    }
}

fn text_of(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

impl LlmProvider for AnthropicProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn features(&self) -> ProviderFeatures {
        // Schemas are honoured through a forced tool (there is no `response_format`).
        ProviderFeatures { native_json_schema: true, streaming: true, tools: true }
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let response = self.send(&request, false).await?;
        let text = response.text().await.map_err(|error| http::transport_error(&self.name, &request.model, &self.url(), &error))?;
        let value: Value = serde_json::from_str(&text).map_err(|error| self.protocol_error(&request.model, error))?;
        let blocks =
            value.get("content").and_then(Value::as_array).ok_or_else(|| self.protocol_error(&request.model, "no content array"))?;
        let schema_name = request.response_schema.as_ref().map(|schema| schema.name.as_str());
        let mut text = String::new();
        let mut schema_answer = None;
        let mut tool_calls = Vec::new();
        for block in blocks {
            match text_of(&block["type"]) {
                "text" => text.push_str(text_of(&block["text"])),
                "tool_use" if schema_name.is_some_and(|name| name == text_of(&block["name"])) => {
                    schema_answer = Some(block.get("input").cloned().unwrap_or_else(|| json!({})).to_string());
                }
                "tool_use" => tool_calls.push(ToolCall {
                    id: text_of(&block["id"]).to_owned(),
                    name: text_of(&block["name"]).to_owned(),
                    arguments: block.get("input").cloned().unwrap_or_else(|| json!({})).to_string(),
                }),
                _ => {}
            }
        }
        let answered_by_schema_tool = schema_answer.is_some();
        Ok(ChatResponse {
            // Without the forced tool's input the text goes to the structured parser, which
            // reports what is wrong and lets the client ask again.
            content: schema_answer.unwrap_or(text),
            tool_calls,
            usage: usage_of(value.get("usage")),
            finish_reason: value.get("stop_reason").and_then(Value::as_str).map(|reason| finish_reason(reason, answered_by_schema_tool)),
            model: value.get("model").and_then(Value::as_str).unwrap_or(&request.model).to_owned(),
        })
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        let response = self.send(&request, true).await?;
        let url = self.url();
        let parser = SseParser {
            provider: self.name.clone(),
            model: request.model.clone(),
            url: url.clone(),
            schema_name: request.response_schema.as_ref().map(|schema| schema.name.clone()),
            response: ChatResponse { model: request.model.clone(), ..ChatResponse::default() },
            blocks: HashMap::new(),
            answered_by_schema_tool: false,
            stop_reason: None,
        };
        Ok(http::line_events(response, parser, &self.name, &request.model, &url))
    }
}

/// What a streamed content block (by its `index`) contributes.
#[derive(Debug, Clone, Copy)]
enum Block {
    /// Text tokens.
    Text,
    /// A tool call: the position in `response.tool_calls`.
    Tool(usize),
    /// The forced schema tool: its input JSON is the content.
    SchemaAnswer,
    /// Anything else (thinking, …): ignored.
    Other,
}

/// Parser state of one Messages SSE stream.
struct SseParser {
    provider: String,
    model: String,
    url: String,
    schema_name: Option<String>,
    response: ChatResponse,
    blocks: HashMap<u64, Block>,
    answered_by_schema_tool: bool,
    stop_reason: Option<String>,
}

impl SseParser {
    fn block_start(&mut self, index: u64, block: &Value, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        let kind = match text_of(&block["type"]) {
            "text" => {
                self.token(text_of(&block["text"]), events);
                Block::Text
            }
            "tool_use" if self.schema_name.as_deref() == Some(text_of(&block["name"])) => {
                self.answered_by_schema_tool = true;
                Block::SchemaAnswer
            }
            "tool_use" => {
                self.response.tool_calls.push(ToolCall {
                    id: text_of(&block["id"]).to_owned(),
                    name: text_of(&block["name"]).to_owned(),
                    arguments: String::new(),
                });
                Block::Tool(self.response.tool_calls.len() - 1)
            }
            _ => Block::Other,
        };
        self.blocks.insert(index, kind);
    }

    fn block_delta(&mut self, index: u64, delta: &Value, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        let block = self.blocks.get(&index).copied().unwrap_or(Block::Other);
        match (text_of(&delta["type"]), block) {
            ("text_delta", _) => self.token(text_of(&delta["text"]), events),
            ("input_json_delta", Block::SchemaAnswer) => self.token(text_of(&delta["partial_json"]), events),
            ("input_json_delta", Block::Tool(position)) => {
                if let Some(call) = self.response.tool_calls.get_mut(position) {
                    call.arguments.push_str(text_of(&delta["partial_json"]));
                }
            }
            _ => {}
        }
    }

    /// A tool without arguments streams no input; it is `{}` as in a plain answer.
    fn block_stop(&mut self, index: u64) {
        match self.blocks.get(&index) {
            Some(Block::Tool(position)) => {
                if let Some(call) = self.response.tool_calls.get_mut(*position).filter(|call| call.arguments.is_empty()) {
                    call.arguments.push_str("{}");
                }
            }
            Some(Block::SchemaAnswer) if self.response.content.is_empty() => self.response.content.push_str("{}"),
            _ => {}
        }
    }

    fn token(&mut self, text: &str, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        if !text.is_empty() {
            self.response.content.push_str(text);
            events.push(Ok(StreamEvent::Token(text.to_owned())));
        }
    }

    fn done(&mut self) -> StreamEvent {
        let mut response = std::mem::take(&mut self.response);
        response.finish_reason = self.stop_reason.as_deref().map(|reason| finish_reason(reason, self.answered_by_schema_tool));
        StreamEvent::Done(response)
    }

    fn stream_error(&self, event: &Value) -> LlmError {
        let error_type = text_of(&event["error"]["type"]);
        let status = reqwest::StatusCode::from_u16(status_of_error_type(error_type)).unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
        let error = http::status_error(&self.provider, &self.model, status, &reqwest::header::HeaderMap::new(), &event.to_string());
        LlmError { message: format!("{} (in the stream from {})", error.message, self.url), ..error }
    }
}

impl LineParser for SseParser {
    fn line(&mut self, line: &str, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        // `event:` lines repeat the `type` inside `data:`; comments and blank lines carry nothing.
        let Some(data) = line.strip_prefix("data:") else { return };
        let event: Value = match serde_json::from_str(data.trim()) {
            Ok(event) => event,
            Err(error) => {
                let message = format!("a stream event from {} is not JSON: {error}", self.url);
                events.push(Err(LlmError::new(LlmErrorKind::Protocol, &self.provider, &self.model, message)));
                return;
            }
        };
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match text_of(&event["type"]) {
            "message_start" => {
                if let Some(model) = event.pointer("/message/model").and_then(Value::as_str) {
                    self.response.model = model.to_owned();
                }
                self.response.usage = usage_of(event.pointer("/message/usage"));
            }
            "content_block_start" => self.block_start(index, &event["content_block"], events),
            "content_block_delta" => self.block_delta(index, &event["delta"], events),
            "content_block_stop" => self.block_stop(index),
            "message_delta" => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                // `output_tokens` is cumulative; newer API versions repeat `input_tokens` here.
                let usage = usage_of(event.get("usage"));
                self.response.usage.output_tokens = usage.output_tokens.or(self.response.usage.output_tokens);
                self.response.usage.input_tokens = usage.input_tokens.or(self.response.usage.input_tokens);
            }
            "message_stop" => events.push(Ok(self.done())),
            "error" => events.push(Err(self.stream_error(&event))),
            _ => {}
        }
    }

    fn cut(&self) -> LlmError {
        LlmError::new(
            LlmErrorKind::StreamCut,
            &self.provider,
            &self.model,
            format!("the stream from {} ended before message_stop after {} characters", self.url, self.response.content.len()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ResponseSchema, ToolSpec};

    #[test]
    fn system_messages_join_and_same_role_turns_merge() {
        let messages = [
            ChatMessage::system("You are terse."),
            ChatMessage::user("a"),
            ChatMessage::system("Answer in English."),
            ChatMessage::user("b"),
            ChatMessage::assistant("c"),
            ChatMessage::assistant("d"),
            ChatMessage::user("e"),
        ];
        let (system, turns) = split_messages(&messages);
        assert_eq!(system.as_deref(), Some("You are terse.\n\nAnswer in English."));
        assert_eq!(
            turns,
            vec![
                json!({"role": "user", "content": "a\n\nb"}),
                json!({"role": "assistant", "content": "c\n\nd"}),
                json!({"role": "user", "content": "e"})
            ]
        );
    }

    #[test]
    fn schemas_become_a_forced_tool_beside_the_regular_ones() {
        let request = ChatRequest {
            model: "claude-x".into(),
            messages: vec![ChatMessage::user("hi")],
            response_schema: Some(ResponseSchema { name: "Plan".into(), schema: json!({"type": "object"}) }),
            tools: vec![ToolSpec { name: "lookup".into(), description: "Looks up".into(), parameters: json!({"type": "object"}) }],
            ..ChatRequest::default()
        };
        let body = body(&request, false);
        assert_eq!(body["max_tokens"], json!(DEFAULT_MAX_TOKENS));
        assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "Plan"}));
        let names: Vec<&str> = body["tools"].as_array().into_iter().flatten().map(|tool| text_of(&tool["name"])).collect();
        assert_eq!(names, ["lookup", "Plan"]);
        assert!(body.get("system").is_none() && body.get("temperature").is_none());
    }

    #[test]
    fn stop_reasons_and_error_types_translate() {
        let table = [
            ("end_turn", false, "stop"),
            ("max_tokens", false, "length"),
            ("tool_use", false, "tool_calls"),
            ("tool_use", true, "stop"),
            ("refusal", false, "refusal"),
        ];
        for (reason, schema, expected) in table {
            assert_eq!(finish_reason(reason, schema), expected, "{reason}");
        }
        assert_eq!(status_of_error_type("overloaded_error"), 529);
        assert_eq!(status_of_error_type("api_error"), 500);
    }
}

//! The OpenAI-compatible provider: `POST {base_url}/chat/completions`, plain and streamed (SSE),
//! with native `response_format: json_schema`, tools and usage. The same protocol serves
//! OpenAI, vLLM, CBorg, Ollama's `/v1`, LM Studio and llama-server; `base_url` decides.

use serde_json::{Value, json};

use crate::config::{ProviderConfig, Secret};
use crate::error::{LlmError, LlmErrorKind};
use crate::http;
use crate::provider::{EventStream, LlmProvider};
use crate::types::{ChatRequest, ChatResponse, ProviderFeatures, StreamEvent, ToolCall, Usage};

/// A provider speaking the OpenAI chat-completions protocol.
#[derive(Debug, Clone)]
pub struct OpenAiCompatible {
    name: String,
    base_url: String,
    api_key: Option<Secret>,
    native_schema: bool,
    http: reqwest::Client,
}

impl OpenAiCompatible {
    /// A provider called `name` (its `api.providers` key) using `config`, with
    /// `default_base_url` when the config has none.
    pub fn new(name: &str, config: &ProviderConfig, default_base_url: &str) -> Result<Self, LlmError> {
        let base_url = http::validate_base_url(name, config.base_url.as_deref().unwrap_or(default_base_url))?;
        let http = http::client(config.timeout(name)?).map_err(|error| LlmError { provider: name.into(), ..error })?;
        Ok(Self { name: name.into(), base_url, api_key: config.api_key.clone(), native_schema: true, http })
    }

    /// Puts schemas in the prompt instead of `response_format` (for servers without it).
    pub fn without_native_schema(mut self) -> Self {
        self.native_schema = false;
        self
    }

    fn url(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Value {
        let mut body = json!({
            "model": request.model,
            "messages": request.messages,
            "stream": stream,
        });
        if let Some(max_tokens) = request.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(temperature) = request.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(schema) = request.response_schema.as_ref().filter(|_| self.native_schema) {
            body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": schema.name, "schema": schema.schema}});
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| json!({"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}))
                .collect();
            body["tools"] = json!(tools);
        }
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    async fn send(&self, request: &ChatRequest, stream: bool) -> Result<reqwest::Response, LlmError> {
        let url = self.url();
        let mut builder = self.http.post(&url).json(&self.body(request, stream));
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key.expose());
        }
        http::send(builder, &self.name, &request.model, &url).await
    }

    fn protocol_error(&self, model: &str, what: impl std::fmt::Display) -> LlmError {
        LlmError::new(
            LlmErrorKind::Protocol,
            &self.name,
            model,
            format!("the answer from {} is not an OpenAI chat completion: {what}", self.url()),
        )
    }
}

fn usage_of(value: &Value) -> Usage {
    Usage {
        input_tokens: value.pointer("/usage/prompt_tokens").and_then(Value::as_u64),
        output_tokens: value.pointer("/usage/completion_tokens").and_then(Value::as_u64),
    }
}

fn tool_calls_of(message: &Value) -> Vec<ToolCall> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|call| ToolCall {
                    id: call.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    name: call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    arguments: call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

impl LlmProvider for OpenAiCompatible {
    fn name(&self) -> &str {
        &self.name
    }

    fn features(&self) -> ProviderFeatures {
        ProviderFeatures { native_json_schema: self.native_schema, streaming: true, tools: true }
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let response = self.send(&request, false).await?;
        let text = response.text().await.map_err(|error| http::transport_error(&self.name, &request.model, &self.url(), &error))?;
        let value: Value = serde_json::from_str(&text).map_err(|error| self.protocol_error(&request.model, error))?;
        let message = value.pointer("/choices/0/message").ok_or_else(|| self.protocol_error(&request.model, "no choices[0].message"))?;
        Ok(ChatResponse {
            content: message.get("content").and_then(Value::as_str).unwrap_or_default().to_owned(),
            tool_calls: tool_calls_of(message),
            usage: usage_of(&value),
            finish_reason: value.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_owned),
            model: value.get("model").and_then(Value::as_str).unwrap_or(&request.model).to_owned(),
        })
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        let response = self.send(&request, true).await?;
        let url = self.url();
        let parser = SseParser {
            provider: self.name.clone(),
            url: url.clone(),
            model: request.model.clone(),
            response: ChatResponse::default(),
            tools: Vec::new(),
        };
        Ok(http::line_events(response, parser, &self.name, &request.model, &url))
    }
}

/// Tool calls one streamed answer may make; an index beyond it is a protocol error, not an
/// allocation the server decides.
const MAX_STREAMED_TOOL_CALLS: usize = 128;

/// Parser of one OpenAI SSE stream (lines arrive whole, decoded after byte-level splitting).
struct SseParser {
    provider: String,
    url: String,
    model: String,
    response: ChatResponse,
    tools: Vec<ToolCall>,
}

impl SseParser {
    fn protocol(&self, message: String) -> LlmError {
        LlmError::new(LlmErrorKind::Protocol, &self.provider, &self.model, message)
    }

    fn merge_tool_deltas(&mut self, calls: &[Value]) -> Result<(), LlmError> {
        for call in calls {
            let index = call.get("index").and_then(Value::as_u64).and_then(|index| usize::try_from(index).ok()).unwrap_or(0);
            if index >= MAX_STREAMED_TOOL_CALLS {
                return Err(self.protocol(format!(
                    "a stream from {} names tool call {index}; at most {MAX_STREAMED_TOOL_CALLS} are accepted",
                    self.url
                )));
            }
            while self.tools.len() <= index {
                self.tools.push(ToolCall { id: String::new(), name: String::new(), arguments: String::new() });
            }
            let tool = &mut self.tools[index];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                tool.id = id.to_owned();
            }
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                tool.name.push_str(name);
            }
            if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str) {
                tool.arguments.push_str(arguments);
            }
        }
        Ok(())
    }
}

impl http::LineParser for SseParser {
    fn line(&mut self, line: &str, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        // SSE: `data:` lines carry the payload (with or without a space); comments, event names
        // and keep-alives are skipped.
        let Some(data) = line.strip_prefix("data:") else { return };
        let data = data.trim();
        if data.is_empty() {
            return;
        }
        if data == "[DONE]" {
            let mut response = std::mem::take(&mut self.response);
            response.tool_calls = std::mem::take(&mut self.tools);
            if response.model.is_empty() {
                response.model = self.model.clone();
            }
            events.push(Ok(StreamEvent::Done(response)));
            return;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(error) => {
                events.push(Err(self.protocol(format!("a stream chunk from {} is not JSON: {error}", self.url))));
                return;
            }
        };
        if chunk.get("error").is_some_and(|error| !error.is_null()) {
            // A failure after the 200 (vLLM, LiteLLM): classified from its body, so a context
            // overflow keeps its class; anything else counts as the server's fault.
            let no_headers = reqwest::header::HeaderMap::new();
            let as_request_error = http::status_error(&self.provider, &self.model, reqwest::StatusCode::BAD_REQUEST, &no_headers, data);
            let error = if as_request_error.kind == LlmErrorKind::ContextLength {
                as_request_error
            } else {
                http::status_error(&self.provider, &self.model, reqwest::StatusCode::INTERNAL_SERVER_ERROR, &no_headers, data)
            };
            let kind = error.kind.clone();
            events.push(Err(LlmError { kind, message: format!("{} (in the stream from {})", error.message, self.url), ..error }));
            return;
        }
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            self.response.model = model.to_owned();
        }
        if chunk.get("usage").is_some_and(|usage| !usage.is_null()) {
            self.response.usage = usage_of(&chunk);
        }
        if let Some(reason) = chunk.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
            self.response.finish_reason = Some(reason.to_owned());
        }
        if let Some(calls) = chunk.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array)
            && let Err(error) = self.merge_tool_deltas(calls)
        {
            events.push(Err(error));
            return;
        }
        if let Some(token) = chunk.pointer("/choices/0/delta/content").and_then(Value::as_str).filter(|token| !token.is_empty()) {
            self.response.content.push_str(token);
            events.push(Ok(StreamEvent::Token(token.to_owned())));
        }
    }

    fn cut(&self) -> LlmError {
        let message = format!("the stream from {} ended before [DONE] after {} characters", self.url, self.response.content.len());
        LlmError::new(LlmErrorKind::StreamCut, &self.provider, &self.model, message)
    }
}

/// The default endpoint of a built-in OpenAI-compatible provider name.
pub fn default_base_url(provider: &str) -> Option<&'static str> {
    Some(match provider {
        "openai" => "https://api.openai.com/v1",
        "vllm" => "http://localhost:8000/v1",
        "cborg" => "https://api.cborg.lbl.gov",
        "lmstudio" => "http://localhost:1234/v1",
        "llama-server" | "llama_server" => "http://127.0.0.1:8080/v1",
        _ => return None,
    })
}

//! The Ollama provider: the native chat API (`POST {base_url}/api/chat`), plain and streamed
//! (NDJSON), with the JSON schema in `format`, `options.temperature`/`num_predict`, tools and
//! usage from `prompt_eval_count`/`eval_count`.

use serde_json::{Value, json};

use crate::config::{ProviderConfig, Secret};
use crate::error::{LlmError, LlmErrorKind};
use crate::http::{self, LineParser};
use crate::provider::{EventStream, LlmProvider};
use crate::types::{ChatRequest, ChatResponse, ProviderFeatures, StreamEvent, ToolCall, Usage};

/// The endpoint when `api.providers.<name>.base_url` is not set.
pub const DEFAULT_BASE_URL: &str = "http://localhost:11434";

/// A provider speaking Ollama's native chat API.
#[derive(Debug, Clone)]
pub struct OllamaProvider {
    name: String,
    base_url: String,
    api_key: Option<Secret>,
    http: reqwest::Client,
}

impl OllamaProvider {
    /// A provider called `name` (its `api.providers` key) using `config`. An API key is optional
    /// (sent as a bearer token, for Ollama behind an authenticating proxy).
    pub fn new(name: &str, config: &ProviderConfig) -> Result<Self, LlmError> {
        let base_url = http::validate_base_url(name, config.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL))?;
        let http = http::client(config.timeout(name)?).map_err(|error| LlmError { provider: name.into(), ..error })?;
        Ok(Self { name: name.into(), base_url, api_key: config.api_key.clone(), http })
    }

    fn url(&self) -> String {
        format!("{}/api/chat", self.base_url)
    }

    async fn send(&self, request: &ChatRequest, stream: bool) -> Result<reqwest::Response, LlmError> {
        let url = self.url();
        let mut builder = self.http.post(&url).json(&body(request, stream));
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
            format!("the answer from {} is not an Ollama chat response: {what}", self.url()),
        )
    }
}

/// The `/api/chat` body for `request`.
fn body(request: &ChatRequest, stream: bool) -> Value {
    let mut body = json!({
        "model": request.model,
        "messages": request.messages,
        "stream": stream,
    });
    let mut options = serde_json::Map::new();
    if let Some(temperature) = request.temperature {
        options.insert("temperature".into(), json!(temperature));
    }
    if let Some(max_tokens) = request.max_tokens {
        options.insert("num_predict".into(), json!(max_tokens));
    }
    if !options.is_empty() {
        body["options"] = Value::Object(options);
    }
    if let Some(schema) = &request.response_schema {
        let mut format = schema.schema.clone();
        // The title names the schema for logs and test servers; Ollama itself ignores it.
        if let Some(fields) = format.as_object_mut() {
            fields.entry("title").or_insert_with(|| json!(schema.name));
        }
        body["format"] = format;
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| json!({"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}))
            .collect();
        body["tools"] = json!(tools);
    }
    body
}

fn usage_of(value: &Value) -> Usage {
    Usage {
        input_tokens: value.get("prompt_eval_count").and_then(Value::as_u64),
        output_tokens: value.get("eval_count").and_then(Value::as_u64),
    }
}

/// Ollama's tool calls: arguments are a JSON object (kept as JSON text) and ids, which older
/// servers omit, are made up from the position.
fn tool_calls_of(message: &Value, first_position: usize) -> Vec<ToolCall> {
    let calls = message.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    calls
        .iter()
        .enumerate()
        .map(|(offset, call)| {
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(value) => value.to_string(),
                None => "{}".to_owned(),
            };
            ToolCall {
                id: call.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{}", first_position + offset), str::to_owned),
                name: call.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                arguments,
            }
        })
        .collect()
}

/// `done_reason` as the provider-neutral reason: `tool_calls` when the model called tools
/// (Ollama says `stop`), else Ollama's own (`stop`, `length`, …).
fn finish_reason(done_reason: Option<&str>, called_tools: bool) -> Option<String> {
    if called_tools {
        return Some("tool_calls".to_owned());
    }
    done_reason.map(str::to_owned)
}

impl LlmProvider for OllamaProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn features(&self) -> ProviderFeatures {
        ProviderFeatures { native_json_schema: true, streaming: true, tools: true }
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let response = self.send(&request, false).await?;
        let text = response.text().await.map_err(|error| http::transport_error(&self.name, &request.model, &self.url(), &error))?;
        let value: Value = serde_json::from_str(&text).map_err(|error| self.protocol_error(&request.model, error))?;
        let message = value.get("message").ok_or_else(|| self.protocol_error(&request.model, "no message"))?;
        let tool_calls = tool_calls_of(message, 0);
        Ok(ChatResponse {
            content: message.get("content").and_then(Value::as_str).unwrap_or_default().to_owned(),
            finish_reason: finish_reason(value.get("done_reason").and_then(Value::as_str), !tool_calls.is_empty()),
            tool_calls,
            usage: usage_of(&value),
            model: value.get("model").and_then(Value::as_str).unwrap_or(&request.model).to_owned(),
        })
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        let response = self.send(&request, true).await?;
        let url = self.url();
        let parser = NdjsonParser {
            provider: self.name.clone(),
            model: request.model.clone(),
            url: url.clone(),
            response: ChatResponse { model: request.model.clone(), ..ChatResponse::default() },
        };
        Ok(http::line_events(response, parser, &self.name, &request.model, &url))
    }
}

/// Parser state of one NDJSON chat stream.
struct NdjsonParser {
    provider: String,
    model: String,
    url: String,
    response: ChatResponse,
}

impl LineParser for NdjsonParser {
    fn line(&mut self, line: &str, events: &mut Vec<Result<StreamEvent, LlmError>>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let chunk: Value = match serde_json::from_str(line) {
            Ok(chunk) => chunk,
            Err(error) => {
                let message = format!("a stream line from {} is not JSON: {error}", self.url);
                events.push(Err(LlmError::new(LlmErrorKind::Protocol, &self.provider, &self.model, message)));
                return;
            }
        };
        if chunk.get("error").is_some() {
            // A failure after the 200 (the runner died, …): classified as the server's fault.
            let error = http::status_error(
                &self.provider,
                &self.model,
                reqwest::StatusCode::INTERNAL_SERVER_ERROR,
                &reqwest::header::HeaderMap::new(),
                line,
            );
            events.push(Err(LlmError { message: format!("{} (in the stream from {})", error.message, self.url), ..error }));
            return;
        }
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            self.response.model = model.to_owned();
        }
        if let Some(message) = chunk.get("message") {
            let calls = tool_calls_of(message, self.response.tool_calls.len());
            self.response.tool_calls.extend(calls);
            if let Some(token) = message.get("content").and_then(Value::as_str).filter(|token| !token.is_empty()) {
                self.response.content.push_str(token);
                events.push(Ok(StreamEvent::Token(token.to_owned())));
            }
        }
        if chunk.get("done").and_then(Value::as_bool) == Some(true) {
            let mut response = std::mem::take(&mut self.response);
            response.usage = usage_of(&chunk);
            response.finish_reason = finish_reason(chunk.get("done_reason").and_then(Value::as_str), !response.tool_calls.is_empty());
            events.push(Ok(StreamEvent::Done(response)));
        }
    }

    fn cut(&self) -> LlmError {
        LlmError::new(
            LlmErrorKind::StreamCut,
            &self.provider,
            &self.model,
            format!("the stream from {} ended before its done line after {} characters", self.url, self.response.content.len()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ChatMessage, ResponseSchema};

    #[test]
    fn options_and_format_are_sent_only_when_set() {
        let plain =
            body(&ChatRequest { model: "llama3.2".into(), messages: vec![ChatMessage::user("hi")], ..ChatRequest::default() }, true);
        assert!(plain.get("options").is_none() && plain.get("format").is_none() && plain.get("tools").is_none());
        let request = ChatRequest {
            model: "llama3.2".into(),
            messages: vec![ChatMessage::user("hi")],
            max_tokens: Some(64),
            temperature: Some(0.5),
            response_schema: Some(ResponseSchema { name: "Plan".into(), schema: json!({"type": "object"}) }),
            tools: Vec::new(),
        };
        let body = body(&request, false);
        assert_eq!(body["options"], json!({"temperature": 0.5, "num_predict": 64}));
        assert_eq!(body["format"], json!({"type": "object", "title": "Plan"}));
    }

    #[test]
    fn tool_calls_keep_ids_or_number_them() {
        let message = json!({"tool_calls": [
            {"function": {"name": "a", "arguments": {"x": 1}}},
            {"id": "call_zz", "function": {"name": "b", "arguments": "{\"y\":2}"}}
        ]});
        let calls = tool_calls_of(&message, 3);
        assert_eq!((calls[0].id.as_str(), calls[0].arguments.as_str()), ("call_3", "{\"x\":1}"));
        assert_eq!((calls[1].id.as_str(), calls[1].arguments.as_str()), ("call_zz", "{\"y\":2}"));
    }
}

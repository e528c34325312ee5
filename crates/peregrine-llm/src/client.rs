//! `LlmClient`: what nodes call. It resolves a role to its model and provider, retries
//! transient transport faults (honouring `Retry-After`), runs the structured-output protocol
//! (native schema or schema in the prompt, clean-up, validation, one retry with the validation
//! error fed back), streams tokens as events, accounts usage per call and can record every call
//! to a directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use peregrine_core::events::{EventKind, preview};
use peregrine_core::{AgentEvent, EventSink};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::{LlmConfig, ResolvedModel};
use crate::error::{LlmError, LlmErrorKind};
use crate::provider::{DynLlmProvider, EventStream, LlmProvider};
use crate::structured::{append_to_last_user, parse, schema_for, schema_prompt};
use crate::types::{ChatMessage, ChatRequest, ChatResponse, ResponseSchema, StreamEvent, ToolSpec, Usage};

/// Per-call options.
#[derive(Default, Clone, Copy)]
pub struct CallOptions<'a> {
    /// Where LLM request/response/token events go.
    pub events: Option<&'a dyn EventSink>,
    /// The component named in events (defaults to the role).
    pub component: Option<&'a str>,
}

impl<'a> CallOptions<'a> {
    /// Options sending events to `events`.
    pub fn events(events: &'a dyn EventSink) -> Self {
        Self { events: Some(events), component: None }
    }
}

/// One call's accounting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageRecord {
    /// The role.
    pub role: String,
    /// The provider's config name.
    pub provider: String,
    /// The model id.
    pub model: String,
    /// The structured-output schema, if any.
    pub schema: Option<String>,
    /// Token counts.
    pub usage: Usage,
    /// Wall time of the call, retries included.
    pub latency: Duration,
    /// Transport attempts made.
    pub attempts: u32,
    /// Whether it succeeded.
    pub success: bool,
}

/// Records every call (request and response or error) as one JSON file in a directory
/// (upstream's `development.api_calls`).
#[derive(Debug)]
struct CallRecorder {
    dir: PathBuf,
    sequence: AtomicU64,
}

const USAGE_LOG_CAPACITY: usize = 10_000;

/// What a finished call reports to [`LlmClient::account`].
struct Finished<'a> {
    provider: &'a str,
    request: &'a ChatRequest,
    schema: Option<&'a ResponseSchema>,
    latency: Duration,
    attempts: u32,
}

/// The LLM entry point for nodes.
pub struct LlmClient {
    config: LlmConfig,
    providers: HashMap<String, Arc<dyn DynLlmProvider>>,
    recorder: Option<CallRecorder>,
    usage: Mutex<Vec<UsageRecord>>,
}

impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient").field("config", &self.config).field("providers", &self.providers.keys().collect::<Vec<_>>()).finish()
    }
}

impl LlmClient {
    /// A client for `config` with no providers yet; add them with [`LlmClient::with_provider`].
    pub fn new(config: LlmConfig) -> Self {
        Self { config, providers: HashMap::new(), recorder: None, usage: Mutex::new(Vec::new()) }
    }

    /// Registers `provider` under `name` (the `provider` value of `models.<role>`).
    pub fn with_provider(mut self, name: impl Into<String>, provider: impl LlmProvider) -> Self {
        self.providers.insert(name.into(), Arc::new(provider));
        self
    }

    /// Registers a shared provider under `name`.
    pub fn with_shared_provider(mut self, name: impl Into<String>, provider: Arc<dyn DynLlmProvider>) -> Self {
        self.providers.insert(name.into(), provider);
        self
    }

    /// Writes every call to `dir` (created if missing) as `<seq>-<role>[-<schema>].json`.
    pub fn record_calls_to(mut self, dir: impl AsRef<Path>) -> Result<Self, LlmError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|error| {
            LlmError::new(LlmErrorKind::Config, "-", "-", format!("cannot create the API-call log directory {}: {error}", dir.display()))
        })?;
        // Continue after the records already there: a resumed process must not overwrite them.
        let next = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.file_name().to_str()?.split('-').next()?.parse::<u64>().ok())
                    .max()
                    .map_or(0, |highest| highest + 1)
            })
            .unwrap_or(0);
        self.recorder = Some(CallRecorder { dir, sequence: AtomicU64::new(next) });
        Ok(self)
    }

    /// The configuration.
    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    /// Usage of the calls made so far (the most recent 10,000).
    pub fn usage(&self) -> Vec<UsageRecord> {
        self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn resolve<'a>(&'a self, role: &'a str) -> Result<(ResolvedModel<'a>, &'a Arc<dyn DynLlmProvider>), LlmError> {
        let resolved = self.config.model_for(role)?;
        let provider = self.providers.get(&resolved.model.provider).ok_or_else(|| {
            let name = &resolved.model.provider;
            LlmError::new(
                LlmErrorKind::Config,
                name,
                &resolved.model.model_id,
                format!(
                    "models.{}.provider names '{name}', which is not a configured provider; add api.providers.{name} or fix the name",
                    resolved.config_key
                ),
            )
            .with_role(role)
        })?;
        Ok((resolved, provider))
    }

    fn request(resolved: &ResolvedModel<'_>, messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            model: resolved.model.model_id.clone(),
            messages,
            max_tokens: resolved.model.max_tokens,
            temperature: resolved.model.temperature,
            response_schema: None,
            tools: Vec::new(),
        }
    }

    /// One plain completion for `role`.
    pub async fn complete(&self, role: &str, messages: Vec<ChatMessage>, options: CallOptions<'_>) -> Result<ChatResponse, LlmError> {
        let (resolved, provider) = self.resolve(role)?;
        let request = Self::request(&resolved, messages);
        self.call(role, provider, request, options).await
    }

    /// One completion that may call `tools`.
    pub async fn complete_with_tools(
        &self,
        role: &str,
        messages: Vec<ChatMessage>,
        tools: Vec<ToolSpec>,
        options: CallOptions<'_>,
    ) -> Result<ChatResponse, LlmError> {
        let (resolved, provider) = self.resolve(role)?;
        let mut request = Self::request(&resolved, messages);
        request.tools = tools;
        self.call(role, provider, request, options).await
    }

    /// A completion parsed into `T`: the schema named after `T` goes natively or into the prompt;
    /// an answer that does not parse is fed back to the model once with the reason, then the
    /// call fails with `InvalidOutput` (RETRIABLE).
    pub async fn structured<T: JsonSchema + DeserializeOwned>(
        &self,
        role: &str,
        messages: Vec<ChatMessage>,
        options: CallOptions<'_>,
    ) -> Result<T, LlmError> {
        self.structured_with_schema(role, messages, schema_for::<T>(), options).await
    }

    /// Like [`LlmClient::structured`] with a schema narrower than `T`'s own (for example a plan
    /// whose `capability` is an enum of the active capability names). The answer is still parsed
    /// into `T`, so the caller validates what the schema could not express.
    pub async fn structured_with_schema<T: DeserializeOwned>(
        &self,
        role: &str,
        messages: Vec<ChatMessage>,
        schema: ResponseSchema,
        options: CallOptions<'_>,
    ) -> Result<T, LlmError> {
        let (resolved, provider) = self.resolve(role)?;
        let native = provider.features().native_json_schema;
        let mut messages = messages;
        if !native {
            append_to_last_user(&mut messages, &schema_prompt(&schema));
        }
        let mut last_problem = String::new();
        for attempt in 1..=2 {
            let mut request = Self::request(&resolved, messages.clone());
            request.response_schema = Some(schema.clone());
            if !native {
                request.response_schema = None;
            }
            let response = self.call_named(role, provider, request, Some(&schema), options).await?;
            match parse::<T>(&response.content) {
                Ok(value) => return Ok(value),
                Err(problem) => {
                    last_problem = problem;
                    if attempt == 1 {
                        messages.push(ChatMessage::assistant(response.content));
                        messages.push(ChatMessage::user(format!(
                            "Schema name: {}\nYour answer could not be used: {last_problem}. Reply again with only one JSON object that matches the schema.",
                            schema.name
                        )));
                    }
                }
            }
        }
        Err(LlmError::new(
            LlmErrorKind::InvalidOutput,
            provider.name(),
            &resolved.model.model_id,
            format!("no valid {} after 2 answers: {last_problem}", schema.name),
        )
        .with_role(role))
    }

    /// A completion streamed as `LlmToken` events to `options.events`; returns the whole answer
    /// (accounted and recorded like any other call).
    pub async fn complete_streaming(
        &self,
        role: &str,
        messages: Vec<ChatMessage>,
        options: CallOptions<'_>,
    ) -> Result<ChatResponse, LlmError> {
        let started = Instant::now();
        let (mut stream, provider, request, attempts) = self.open_stream(role, messages, options).await?;
        let component = options.component.unwrap_or(role);
        let result = loop {
            match stream.next().await {
                Some(Ok(StreamEvent::Token(content))) => {
                    if let Some(events) = options.events {
                        events.emit(AgentEvent::new(component, EventKind::LlmToken { role: role.into(), content }));
                    }
                }
                Some(Ok(StreamEvent::Done(response))) => break Ok(response),
                Some(Err(error)) => break Err(error.with_role(role)),
                None => {
                    let message = "the stream ended without a final answer";
                    break Err(LlmError::new(LlmErrorKind::StreamCut, &provider, &request.model, message).with_role(role));
                }
            }
        };
        let finished = Finished { provider: &provider, request: &request, schema: None, latency: started.elapsed(), attempts };
        self.account(role, finished, &result, options);
        result
    }

    /// The raw token stream for `role` (transient faults before the stream opens are retried).
    /// Not accounted: the caller sees the usage in the final `Done` event.
    pub async fn stream(&self, role: &str, messages: Vec<ChatMessage>, options: CallOptions<'_>) -> Result<EventStream, LlmError> {
        Ok(self.open_stream(role, messages, options).await?.0)
    }

    async fn open_stream(
        &self,
        role: &str,
        messages: Vec<ChatMessage>,
        options: CallOptions<'_>,
    ) -> Result<(EventStream, String, ChatRequest, u32), LlmError> {
        let (resolved, provider) = self.resolve(role)?;
        let request = Self::request(&resolved, messages);
        self.emit_request(role, provider.name(), &request, None, options);
        let retries = self.config.provider(provider.name()).retries();
        let mut attempt = 1;
        loop {
            match provider.stream_boxed(request.clone()).await {
                Ok(stream) => return Ok((stream, provider.name().to_owned(), request, attempt)),
                Err(error) if error.is_transient() && attempt <= retries => {
                    tokio::time::sleep(transport_backoff(attempt, error.retry_after)).await;
                    attempt += 1;
                }
                Err(error) => return Err(error.with_role(role)),
            }
        }
    }

    async fn call(
        &self,
        role: &str,
        provider: &Arc<dyn DynLlmProvider>,
        request: ChatRequest,
        options: CallOptions<'_>,
    ) -> Result<ChatResponse, LlmError> {
        self.call_named(role, provider, request, None, options).await
    }

    /// One call with transport retries, events, accounting and recording.
    async fn call_named(
        &self,
        role: &str,
        provider: &Arc<dyn DynLlmProvider>,
        request: ChatRequest,
        schema: Option<&ResponseSchema>,
        options: CallOptions<'_>,
    ) -> Result<ChatResponse, LlmError> {
        self.emit_request(role, provider.name(), &request, schema, options);
        let retries = self.config.provider(provider.name()).retries();
        let started = Instant::now();
        let mut attempt = 1;
        let result = loop {
            match provider.complete_boxed(request.clone()).await {
                Err(error) if error.is_transient() && attempt <= retries => {
                    tokio::time::sleep(transport_backoff(attempt, error.retry_after)).await;
                    attempt += 1;
                }
                other => break other.map_err(|error| error.with_role(role)),
            }
        };
        let finished = Finished { provider: provider.name(), request: &request, schema, latency: started.elapsed(), attempts: attempt };
        self.account(role, finished, &result, options);
        result
    }

    /// Usage record, response event and call record of a finished call.
    fn account(&self, role: &str, finished: Finished<'_>, result: &Result<ChatResponse, LlmError>, options: CallOptions<'_>) {
        let record = UsageRecord {
            role: role.into(),
            provider: finished.provider.into(),
            model: finished.request.model.clone(),
            schema: finished.schema.map(|schema| schema.name.clone()),
            usage: result.as_ref().map(|response| response.usage).unwrap_or_default(),
            latency: finished.latency,
            attempts: finished.attempts,
            success: result.is_ok(),
        };
        self.emit_response(role, result, &record, options);
        self.record(finished.request, result, &record);
        let mut usage = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if usage.len() >= USAGE_LOG_CAPACITY {
            usage.remove(0);
        }
        usage.push(record);
    }

    fn emit_request(&self, role: &str, provider: &str, request: &ChatRequest, schema: Option<&ResponseSchema>, options: CallOptions<'_>) {
        let Some(events) = options.events else { return };
        let prompt: String = request.messages.iter().map(|message| message.content.as_str()).collect::<Vec<_>>().join("\n");
        events.emit(AgentEvent::new(
            options.component.unwrap_or(role),
            EventKind::LlmRequest {
                role: role.into(),
                schema: schema.map(|schema| schema.name.clone()),
                prompt_preview: preview(&prompt, 200),
                prompt_length: prompt.chars().count(),
                model: request.model.clone(),
                provider: provider.into(),
            },
        ));
    }

    fn emit_response(&self, role: &str, result: &Result<ChatResponse, LlmError>, record: &UsageRecord, options: CallOptions<'_>) {
        let Some(events) = options.events else { return };
        let text = match result {
            Ok(response) => response.content.clone(),
            Err(error) => error.to_string(),
        };
        events.emit(AgentEvent::new(
            options.component.unwrap_or(role),
            EventKind::LlmResponse {
                role: role.into(),
                success: record.success,
                response_preview: preview(&text, 200),
                response_length: text.chars().count(),
                input_tokens: record.usage.input_tokens,
                output_tokens: record.usage.output_tokens,
                duration_ms: u64::try_from(record.latency.as_millis()).unwrap_or(u64::MAX),
            },
        ));
    }

    fn record(&self, request: &ChatRequest, result: &Result<ChatResponse, LlmError>, record: &UsageRecord) {
        let Some(recorder) = &self.recorder else { return };
        let sequence = recorder.sequence.fetch_add(1, Ordering::Relaxed);
        let name = match &record.schema {
            Some(schema) => format!("{sequence:06}-{}-{schema}.json", record.role),
            None => format!("{sequence:06}-{}.json", record.role),
        };
        let entry = serde_json::json!({
            "timestamp": chrono::Utc::now(),
            "role": record.role,
            "provider": record.provider,
            "model": record.model,
            "schema": record.schema,
            "attempts": record.attempts,
            "latency_ms": record.latency.as_secs_f64() * 1000.0,
            "request": {"messages": request.messages, "max_tokens": request.max_tokens, "temperature": request.temperature, "response_schema": request.response_schema},
            "response": result.as_ref().ok(),
            "error": result.as_ref().err().map(ToString::to_string),
        });
        let path = recorder.dir.join(name);
        if let Err(error) = std::fs::write(&path, serde_json::to_vec_pretty(&entry).unwrap_or_default()) {
            tracing::warn!(path = %path.display(), %error, "could not record an LLM call");
        }
    }
}

/// How long to wait before transport retry number `attempt` (1-based): the provider's
/// `Retry-After` when given (capped at 30 s), else 0.5 s doubling up to 8 s.
pub fn transport_backoff(attempt: u32, retry_after: Option<Duration>) -> Duration {
    match retry_after {
        Some(wait) => wait.min(Duration::from_secs(30)),
        None => Duration::from_millis(500).saturating_mul(1 << attempt.saturating_sub(1).min(4)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_honours_retry_after() {
        assert_eq!(transport_backoff(1, None), Duration::from_millis(500));
        assert_eq!(transport_backoff(2, None), Duration::from_secs(1));
        assert_eq!(transport_backoff(9, None), Duration::from_secs(8));
        assert_eq!(transport_backoff(1, Some(Duration::from_secs(3))), Duration::from_secs(3));
        assert_eq!(transport_backoff(1, Some(Duration::from_secs(600))), Duration::from_secs(30));
    }
}

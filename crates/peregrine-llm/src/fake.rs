//! An in-process provider whose answers come from a function of the request, for unit tests of
//! nodes and capabilities (the scripted HTTP server in `peregrine-testkit` is for whole turns).
//! It records every request; streamed answers arrive one word at a time.

use std::sync::{Arc, Mutex, PoisonError};

use futures::stream;

use crate::error::{LlmError, LlmErrorKind};
use crate::provider::{EventStream, LlmProvider};
use crate::types::{ChatRequest, ChatResponse, ProviderFeatures, StreamEvent, Usage};
use crate::{LlmClient, LlmConfig, ModelConfig};

type Answer = dyn Fn(&ChatRequest) -> Result<String, LlmError> + Send + Sync;

/// A provider answering with a function of the request. Cloning shares the request log.
#[derive(Clone)]
pub struct FakeProvider {
    answer: Arc<Answer>,
    requests: Arc<Mutex<Vec<ChatRequest>>>,
    native_json_schema: bool,
}

impl std::fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProvider").field("requests", &self.requests().len()).finish_non_exhaustive()
    }
}

impl FakeProvider {
    /// Answers every request with `answer(request)`; the schema goes natively (no prompt text).
    pub fn new(answer: impl Fn(&ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static) -> Self {
        Self { answer: Arc::new(answer), requests: Arc::new(Mutex::new(Vec::new())), native_json_schema: true }
    }

    /// Answers by the name of the requested schema (`ExtractedTask`, …; `""` for plain calls).
    pub fn by_schema(answer: impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static) -> Self {
        Self::new(move |request| {
            let name = request.response_schema.as_ref().map(|schema| schema.name.as_str()).unwrap_or("");
            answer(name, request)
        })
    }

    /// A failure of `kind`, as a real provider would report it.
    pub fn error(kind: LlmErrorKind, message: &str) -> LlmError {
        LlmError::new(kind, "fake", "fake-model", message)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Requests whose schema is `name` (`""` for plain calls).
    pub fn requests_for(&self, name: &str) -> Vec<ChatRequest> {
        self.requests()
            .into_iter()
            .filter(|request| request.response_schema.as_ref().map(|schema| schema.name.as_str()).unwrap_or("") == name)
            .collect()
    }

    /// An `LlmClient` whose every role (`models.default`) uses this provider, with no transport
    /// retries.
    pub fn client(&self) -> LlmClient {
        let mut config = LlmConfig::default();
        config.models.insert(
            "default".into(),
            ModelConfig { provider: "fake".into(), model_id: "fake-model".into(), max_tokens: None, temperature: None },
        );
        config.providers.insert("fake".into(), crate::ProviderConfig { max_retries: Some(0), ..crate::ProviderConfig::default() });
        LlmClient::new(config).with_provider("fake", self.clone())
    }

    fn answer(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).push(request.clone());
        let content = (self.answer)(request)?;
        Ok(ChatResponse {
            content,
            tool_calls: Vec::new(),
            usage: Usage::default(),
            finish_reason: Some("stop".into()),
            model: request.model.clone(),
        })
    }
}

impl LlmProvider for FakeProvider {
    fn name(&self) -> &str {
        "fake"
    }

    fn features(&self) -> ProviderFeatures {
        ProviderFeatures { native_json_schema: self.native_json_schema, streaming: true, tools: true }
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        self.answer(&request)
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        let response = self.answer(&request)?;
        let mut events: Vec<Result<StreamEvent, LlmError>> =
            response.content.split_inclusive(' ').map(|word| Ok(StreamEvent::Token(word.to_owned()))).collect();
        events.push(Ok(StreamEvent::Done(response)));
        Ok(Box::pin(stream::iter(events)))
    }
}

//! The `LlmProvider` trait every provider implements (OpenAI-compatible, Anthropic, Ollama,
//! the embedded local model, test doubles), and its object-safe form.

use std::future::Future;
use std::pin::Pin;

use futures::Stream;

use crate::error::LlmError;
use crate::types::{ChatRequest, ChatResponse, ProviderFeatures, StreamEvent};

/// A boxed future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// A boxed stream of streaming events.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// A model endpoint.
pub trait LlmProvider: Send + Sync + 'static {
    /// The provider's config name (`openai`, `anthropic`, `ollama`, `local`, …).
    fn name(&self) -> &str;

    /// What it supports natively.
    fn features(&self) -> ProviderFeatures;

    /// One completion.
    fn complete(&self, request: ChatRequest) -> impl Future<Output = Result<ChatResponse, LlmError>> + Send;

    /// One streamed completion: tokens, then `Done` with the assembled response. The stream
    /// ends with an error (`StreamCut`) if the connection drops before the end.
    fn stream(&self, request: ChatRequest) -> impl Future<Output = Result<EventStream, LlmError>> + Send;
}

/// The object-safe form of [`LlmProvider`], implemented for every provider.
pub trait DynLlmProvider: Send + Sync + 'static {
    /// See [`LlmProvider::name`].
    fn name(&self) -> &str;
    /// See [`LlmProvider::features`].
    fn features(&self) -> ProviderFeatures;
    /// See [`LlmProvider::complete`].
    fn complete_boxed(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatResponse, LlmError>>;
    /// See [`LlmProvider::stream`].
    fn stream_boxed(&self, request: ChatRequest) -> BoxFuture<'_, Result<EventStream, LlmError>>;
}

impl<P: LlmProvider> DynLlmProvider for P {
    fn name(&self) -> &str {
        LlmProvider::name(self)
    }
    fn features(&self) -> ProviderFeatures {
        LlmProvider::features(self)
    }
    fn complete_boxed(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatResponse, LlmError>> {
        Box::pin(self.complete(request))
    }
    fn stream_boxed(&self, request: ChatRequest) -> BoxFuture<'_, Result<EventStream, LlmError>> {
        Box::pin(self.stream(request))
    }
}

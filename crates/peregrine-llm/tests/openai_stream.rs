//! The OpenAI-compatible SSE parser against byte-exact fixtures sent in 7-byte pieces: UTF-8
//! characters split across pieces, nothing after `[DONE]`, CRLF lines, comments and `data:`
//! without a space, a final `[DONE]` without a newline, an error object mid-stream (keeping its
//! context-overflow class), and a tool-call index the server cannot turn into an allocation.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

#[allow(dead_code, reason = "each test crate uses a part of the shared support module")]
mod support;

use peregrine_llm::{ChatMessage, ChatRequest, LlmErrorKind, LlmProvider, OpenAiCompatible, ProviderConfig};
use support::{FixtureServer, Reply, collect};

async fn stream_of(fixture: &str) -> (Vec<String>, Result<peregrine_llm::ChatResponse, peregrine_llm::LlmError>) {
    let server = FixtureServer::start([Reply::stream(fixture, "text/event-stream")]).await;
    let config = ProviderConfig { base_url: Some(format!("{}/v1", server.url)), ..ProviderConfig::default() };
    let provider = OpenAiCompatible::new("vllm", &config, "").unwrap();
    let request = ChatRequest { model: "gpt-test".into(), messages: vec![ChatMessage::user("hi")], ..ChatRequest::default() };
    collect(provider.stream(request).await.unwrap()).await
}

#[tokio::test]
async fn split_utf8_survives_and_nothing_follows_done() {
    let (tokens, response) = stream_of("openai/utf8_then_trailing_events.sse").await;
    assert_eq!(tokens, ["€uro ", "naïve 🚀"]);
    let response = response.unwrap();
    assert_eq!(response.content, "€uro naïve 🚀");
    assert_eq!((response.usage.input_tokens, response.usage.output_tokens), (Some(9), Some(4)));
}

#[tokio::test]
async fn crlf_comments_and_a_final_done_without_newline_are_a_complete_stream() {
    let (tokens, response) = stream_of("openai/crlf_no_final_newline.sse").await;
    assert_eq!(tokens, ["hello"]);
    assert_eq!(response.unwrap().content, "hello");
}

#[tokio::test]
async fn an_error_object_mid_stream_fails_the_stream_with_its_class() {
    let (tokens, response) = stream_of("openai/error_mid_stream.sse").await;
    assert_eq!(tokens, ["par"]);
    let error = response.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::ContextLength, "{error}");
}

#[tokio::test]
async fn a_huge_tool_call_index_is_a_protocol_error() {
    let (_, response) = stream_of("openai/huge_tool_index.sse").await;
    let error = response.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::Protocol);
    assert!(error.to_string().contains("at most 128"), "{error}");
}

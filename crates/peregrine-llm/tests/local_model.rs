//! The `local` provider against the real embedded model (SmolLM2-135M-Instruct): structured
//! answers constrained by the schema's grammar always parse, tokens stream and usage is counted.
//! The model path comes from `PEREGRINE_LOCAL_MODEL` (`scripts/fetch-model.sh` prints it);
//! without it the tests skip locally and fail in CI.
#![cfg(feature = "local")]
#![allow(clippy::expect_used, reason = "test fixtures report setup failures by panicking")]

use std::time::Instant;

use futures::StreamExt;
use peregrine_llm::{CallOptions, ChatMessage, ChatRequest, LlmClient, LlmConfig, LlmProvider, LocalProvider, StreamEvent, schema_for};
use schemars::JsonSchema;
use serde::Deserialize;

const HOW_TO_FETCH: &str =
    "PEREGRINE_LOCAL_MODEL=$(bash scripts/fetch-model.sh) cargo test -p peregrine-llm --features local --test local_model";

/// The model file, or `None` (test skipped) when it is not configured outside CI.
fn model_path() -> Option<String> {
    match std::env::var("PEREGRINE_LOCAL_MODEL") {
        Ok(path) if !path.trim().is_empty() => Some(path),
        _ if std::env::var_os("CI").is_some() => panic!("PEREGRINE_LOCAL_MODEL is not set; run: {HOW_TO_FETCH}"),
        _ => {
            println!("skipped: PEREGRINE_LOCAL_MODEL is not set (run: {HOW_TO_FETCH})");
            None
        }
    }
}

fn config(path: &str) -> LlmConfig {
    serde_json::from_value(serde_json::json!({
        "models": {"default": {"provider": "local", "model_id": "smollm2", "max_tokens": 48}},
        "providers": {"local": {"model_path": path}}
    }))
    .expect("valid config")
}

fn provider(config: &LlmConfig) -> LocalProvider {
    // One thread: a second one spin-waits and slows generation down on a busy 2-core machine.
    LocalProvider::load("local", &config.provider("local")).expect("the model loads").with_threads(1)
}

/// A small structured answer; the length cap keeps the JSON well inside 48 tokens.
#[derive(Debug, Deserialize, JsonSchema)]
struct QuickAnswer {
    #[schemars(length(max = 24))]
    answer: String,
    confident: bool,
}

#[tokio::test]
async fn structured_answers_follow_the_schema() {
    let Some(path) = model_path() else { return };
    let config = config(&path);
    let provider = provider(&config);
    assert!(provider.features().native_json_schema);

    // Straight from the provider: the grammar makes the raw content valid JSON of the type.
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("What is the capital of France? Answer in one word.")],
        max_tokens: Some(48),
        response_schema: Some(schema_for::<QuickAnswer>()),
        ..ChatRequest::default()
    };
    let response = provider.complete(request).await.expect("a completion");
    let parsed: QuickAnswer =
        serde_json::from_str(&response.content).unwrap_or_else(|error| panic!("not a QuickAnswer: {:?} ({error})", response.content));
    // The grammar also enforces the schema's `maxLength`.
    assert!(parsed.answer.chars().count() <= 24, "{parsed:?}");
    assert_eq!(response.finish_reason.as_deref(), Some("stop"), "{response:?}");

    // Through the client: one call, no validation retry.
    let client = LlmClient::new(config).with_provider("local", provider);
    let answer: QuickAnswer = client
        .structured(
            "classifier",
            vec![ChatMessage::system("You answer briefly."), ChatMessage::user("Is water wet? Answer yes or no.")],
            CallOptions::default(),
        )
        .await
        .expect("a structured answer");
    let usage = client.usage();
    assert_eq!(usage.len(), 1, "the first answer should have parsed: {answer:?} {usage:?}");
    println!("structured answer: {:?} (confident: {})", answer.answer, answer.confident);
    assert!(usage[0].usage.input_tokens.unwrap_or(0) > 10 && usage[0].usage.output_tokens.unwrap_or(0) > 3, "{usage:?}");
    assert_eq!(usage[0].schema.as_deref(), Some("QuickAnswer"));
}

#[tokio::test]
async fn tokens_stream_then_done_reports_usage() {
    let Some(path) = model_path() else { return };
    let provider = provider(&config(&path));
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("Write a short poem about the sea.")],
        max_tokens: Some(48),
        ..ChatRequest::default()
    };
    let mut stream = provider.stream(request).await.expect("a stream");
    let mut tokens = Vec::new();
    let mut first_token_at = None;
    let mut done = None;
    while let Some(event) = stream.next().await {
        match event.expect("no stream error") {
            StreamEvent::Token(token) => {
                first_token_at.get_or_insert_with(Instant::now);
                tokens.push(token);
            }
            StreamEvent::Done(response) => done = Some((response, Instant::now())),
        }
    }
    let (response, done_at) = done.expect("the stream ends with Done");
    let first_token_at = first_token_at.expect("at least one token");
    assert_eq!(tokens.concat(), response.content);
    let output_tokens = response.usage.output_tokens.expect("output tokens");
    assert!((1..=48).contains(&output_tokens), "{response:?}");
    assert!(response.usage.input_tokens.expect("prompt tokens") > 5, "{response:?}");
    assert_eq!(response.model, "smollm2");
    // Throughput for the record (never asserted): tokens after the first over the time they took.
    let seconds = (done_at - first_token_at).as_secs_f64();
    if output_tokens > 1 && seconds > 0.0 {
        println!("local generation: {output_tokens} tokens, {:.1} tok/s (1 thread)", (output_tokens - 1) as f64 / seconds);
    }
}

#[tokio::test]
async fn sampling_with_temperature_is_seeded() {
    let Some(path) = model_path() else { return };
    let provider = provider(&config(&path));
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("Name a colour.")],
        max_tokens: Some(8),
        temperature: Some(0.9),
        ..ChatRequest::default()
    };
    let first = provider.complete(request.clone()).await.expect("a completion");
    let second = provider.complete(request).await.expect("a completion");
    assert!(!first.content.is_empty(), "{first:?}");
    assert_eq!(first.content, second.content, "the same seed gives the same draw");
}

#[tokio::test]
async fn tools_are_refused_with_a_reason() {
    let Some(path) = model_path() else { return };
    let provider = provider(&config(&path));
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("hi")],
        tools: vec![peregrine_llm::ToolSpec {
            name: "f".into(),
            description: "d".into(),
            parameters: serde_json::json!({"type": "object"}),
        }],
        ..ChatRequest::default()
    };
    let error = provider.complete(request).await.expect_err("no tool support");
    assert!(error.message.contains("cannot call tools"), "{error}");
}

#[tokio::test]
async fn schemas_without_a_grammar_fall_back_to_the_prompt() {
    let Some(path) = model_path() else { return };
    let provider = provider(&config(&path));
    // llama.cpp cannot resolve this reference, so there is no grammar: the schema goes into the
    // prompt instead and the answer is left to the client's validation.
    let schema = serde_json::json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}, "required": ["x"]});
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("Give x.")],
        max_tokens: Some(16),
        response_schema: Some(peregrine_llm::ResponseSchema { name: "Unresolvable".into(), schema }),
        ..ChatRequest::default()
    };
    let response = provider.complete(request).await.expect("a completion without a grammar");
    assert!(response.usage.input_tokens.expect("prompt tokens") > 30, "the schema is in the prompt: {response:?}");
}

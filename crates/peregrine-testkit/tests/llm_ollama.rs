//! The native Ollama provider (`/api/chat`) through `LlmClient`, against the scripted server:
//! plain, streamed (NDJSON) and structured completions (`format` carries the schema named after
//! the type), usage numbers, and model-not-found as a configuration error.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use peregrine_llm::{CallOptions, ChatMessage, LlmClient, LlmConfig, LlmErrorKind, ModelConfig, ProviderConfig};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Deserialize, JsonSchema)]
struct CapabilityMatch {
    is_match: bool,
}

fn client(server: &ScriptedLlmServer) -> LlmClient {
    let mut config = LlmConfig::default();
    config.providers.insert(
        "ollama".into(),
        ProviderConfig { base_url: Some(server.ollama_url()), timeout_seconds: Some(5.0), ..ProviderConfig::default() },
    );
    config.models.insert(
        "classifier".into(),
        ModelConfig { provider: "ollama".into(), model_id: "mistral:7b".into(), max_tokens: Some(64), temperature: Some(0.0) },
    );
    LlmClient::from_config(config).expect("client")
}

#[tokio::test]
async fn plain_streamed_and_structured_calls_over_the_native_protocol() {
    let script = Script::new()
        .on_schema("CapabilityMatch", Reply::json(json!({"is_match": true})).with_usage(30, 6))
        .on_plain(Reply::text("alpha beta").with_chunks(vec!["alpha ".into(), "beta".into()]).with_usage(4, 2));
    let server = ScriptedLlmServer::start(script).await;
    let client = client(&server);

    let plain = client.complete("classifier", vec![ChatMessage::user("hi")], CallOptions::default()).await.unwrap();
    assert_eq!(plain.content, "alpha beta");
    assert_eq!((plain.usage.input_tokens, plain.usage.output_tokens), (Some(4), Some(2)));

    let streamed = client.complete_streaming("classifier", vec![ChatMessage::user("hi")], CallOptions::default()).await.unwrap();
    assert_eq!(streamed.content, "alpha beta");
    assert_eq!(streamed.usage.output_tokens, Some(2));

    let matched: CapabilityMatch =
        client.structured("classifier", vec![ChatMessage::user("read the beam current")], CallOptions::default()).await.unwrap();
    assert!(matched.is_match);

    let requests = server.chat_requests();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|request| request.path == "/api/chat"));
    assert_eq!(requests[0].body["options"]["num_predict"], 64, "max_tokens is honoured");
    assert_eq!(requests[0].body["stream"], false);
    assert_eq!(requests[1].body["stream"], true);
    assert_eq!(requests[2].schema_name.as_deref(), Some("CapabilityMatch"));
    assert_eq!(requests[2].body["format"]["properties"]["is_match"]["type"], "boolean");
    assert_eq!(client.usage()[2].usage.input_tokens, Some(30));
}

#[tokio::test]
async fn an_unknown_model_is_a_configuration_error() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(Fault::ModelNotFound))).await;
    let error = client(&server).complete("classifier", vec![ChatMessage::user("hi")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::InvalidModel);
    assert!(error.to_string().contains("model_id"), "{error}");
}

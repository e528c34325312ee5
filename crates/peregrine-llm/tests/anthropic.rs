//! The Anthropic provider against recorded Messages API fixtures: the request it sends (headers,
//! `system`, merged turns, `max_tokens`, tools, the forced schema tool) and how it reads plain,
//! structured, tool-calling and streamed answers, usage, and error bodies.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use std::time::Duration;

use peregrine_llm::{
    AnthropicProvider, CallOptions, ChatMessage, ChatRequest, FaultClass, LlmClient, LlmErrorKind, LlmProvider, ProviderConfig, Secret,
    ToolCall, ToolSpec, Usage, schema_for,
};
use serde_json::{Value, json};
use support::{BeamStatus, FixtureServer, Reply, collect, expected_beam_status, one_role_config};

const MODEL: &str = "claude-sonnet-4-5";
const ANSWERING_MODEL: &str = "claude-sonnet-4-5-20250929";
const SSE: &str = "text/event-stream; charset=utf-8";

fn provider(server: &FixtureServer) -> AnthropicProvider {
    // A trailing slash must not double the path's.
    let config = ProviderConfig {
        api_key: Some(Secret::new("sk-ant-test-key")),
        base_url: Some(format!("{}/", server.url)),
        ..ProviderConfig::default()
    };
    AnthropicProvider::new("anthropic", &config).expect("valid config")
}

fn request(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest { model: MODEL.into(), messages, ..ChatRequest::default() }
}

fn pv_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_pv_value".into(),
            description: "Reads one EPICS process variable.".into(),
            parameters: json!({"type": "object", "properties": {"pv_name": {"type": "string"}}, "required": ["pv_name"]}),
        },
        ToolSpec {
            name: "list_alarms".into(),
            description: "Lists active alarms.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        },
    ]
}

#[tokio::test]
async fn a_plain_completion_sends_a_messages_request_and_reads_text_and_usage() {
    let server = FixtureServer::start([Reply::json(200, "anthropic/message_text.json")]).await;
    let mut request = request(vec![
        ChatMessage::system("You are the control-room assistant."),
        ChatMessage::user("What is the beam current?"),
        ChatMessage::system("Answer in one sentence."),
        ChatMessage::user("Storage ring, please."),
        ChatMessage::assistant("Checking."),
        ChatMessage::user("Go on."),
    ]);
    request.temperature = Some(0.25);

    let response = provider(&server).complete(request).await.expect("completion");

    assert_eq!(response.content, "The storage-ring beam current is stable at 500.2 mA.");
    assert_eq!(response.usage, Usage { input_tokens: Some(42), output_tokens: Some(17) });
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, ANSWERING_MODEL);
    assert!(response.tool_calls.is_empty());

    let sent = server.only_request();
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), "sk-ant-test-key");
    assert_eq!(sent.header("anthropic-version"), "2023-06-01");
    assert_eq!(sent.header("content-type"), "application/json");
    assert_eq!(sent.header("authorization"), "", "Anthropic authenticates with x-api-key only");
    assert_eq!(
        sent.body,
        json!({
            "model": MODEL,
            "max_tokens": 4096,
            "stream": false,
            "temperature": 0.25,
            "system": "You are the control-room assistant.\n\nAnswer in one sentence.",
            "messages": [
                {"role": "user", "content": "What is the beam current?\n\nStorage ring, please."},
                {"role": "assistant", "content": "Checking."},
                {"role": "user", "content": "Go on."}
            ]
        })
    );
}

#[tokio::test]
async fn structured_output_forces_a_tool_named_after_the_schema_and_returns_its_input() {
    let server = FixtureServer::start([Reply::json(200, "anthropic/message_structured.json")]).await;
    let provider = provider(&server);
    assert!(provider.features().native_json_schema, "the client must send the schema, not prompt with it");
    let client = LlmClient::new(one_role_config("anthropic", MODEL, Some(1024))).with_provider("anthropic", provider);

    let status: BeamStatus = client
        .structured("classifier", vec![ChatMessage::user("Summarise the beam status.")], CallOptions::default())
        .await
        .expect("structured answer");

    assert_eq!(status, expected_beam_status());
    let usage = client.usage();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].usage, Usage { input_tokens: Some(512), output_tokens: Some(61) });
    assert_eq!(usage[0].schema.as_deref(), Some("BeamStatus"));

    let sent = server.only_request();
    let schema = schema_for::<BeamStatus>();
    assert_eq!(sent.body["max_tokens"], json!(1024), "the role's max_tokens wins over the default");
    assert_eq!(sent.body["tool_choice"], json!({"type": "tool", "name": "BeamStatus"}));
    let tools = sent.body["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], json!("BeamStatus"));
    assert_eq!(tools[0]["input_schema"], schema.schema);
    assert!(sent.body["messages"][0]["content"].as_str().is_some_and(|text| !text.contains("Schema name")), "no schema in the prompt");
    assert!(sent.body.get("response_format").is_none());
}

#[tokio::test]
async fn the_forced_tools_input_is_the_content_and_stops_as_stop() {
    let server = FixtureServer::start([Reply::json(200, "anthropic/message_structured.json")]).await;
    let mut request = request(vec![ChatMessage::user("Summarise the beam status.")]);
    request.response_schema = Some(schema_for::<BeamStatus>());

    let response = provider(&server).complete(request).await.expect("completion");

    let content: Value = serde_json::from_str(&response.content).expect("JSON content");
    assert_eq!(content, json!({"current_ma": 500.2, "stable": true, "summary": "Beam current is stable."}));
    assert!(response.tool_calls.is_empty(), "the schema tool is the answer, not a call");
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn tools_are_sent_as_input_schemas_and_tool_use_blocks_become_calls() {
    let server = FixtureServer::start([Reply::json(200, "anthropic/message_tool_use.json")]).await;
    let mut request = request(vec![ChatMessage::user("Is the vacuum OK?")]);
    request.tools = pv_tools();

    let response = provider(&server).complete(request).await.expect("completion");

    assert_eq!(response.content, "I'll read the vacuum gauges.");
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "get_pv_value".into(),
                arguments: "{\"pv_name\":\"SR:VAC:P1\"}".into()
            },
            ToolCall { id: "toolu_01Lw4nWm8kAQ3pT5dJzKcB2x".into(), name: "list_alarms".into(), arguments: "{}".into() },
        ]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.usage, Usage { input_tokens: Some(384), output_tokens: Some(96) });

    let sent = server.only_request();
    assert_eq!(
        sent.body["tools"],
        json!([
            {"name": "get_pv_value", "description": "Reads one EPICS process variable.", "input_schema": {"type": "object", "properties": {"pv_name": {"type": "string"}}, "required": ["pv_name"]}},
            {"name": "list_alarms", "description": "Lists active alarms.", "input_schema": {"type": "object", "properties": {}}}
        ])
    );
    assert!(sent.body.get("tool_choice").is_none(), "regular tools leave the choice to the model");
}

#[tokio::test]
async fn a_stream_yields_tokens_then_done_with_usage() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_text.sse", SSE)]).await;

    let stream = provider(&server).stream(request(vec![ChatMessage::user("Beam current?")])).await.expect("stream opens");
    let (tokens, done) = collect(stream).await;

    assert_eq!(tokens, ["Beam current", " is 500 mA", " — stable (±0.1 µA)."]);
    let response = done.expect("Done");
    assert_eq!(response.content, tokens.concat());
    assert_eq!(response.usage, Usage { input_tokens: Some(25), output_tokens: Some(15) });
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, ANSWERING_MODEL);
    let sent = server.only_request();
    assert_eq!((sent.body["stream"].clone(), sent.body["max_tokens"].clone()), (json!(true), json!(4096)));
}

#[tokio::test]
async fn streamed_tool_input_is_accumulated_into_calls() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_tool_use.sse", SSE)]).await;
    let mut request = request(vec![ChatMessage::user("Is the vacuum OK?")]);
    request.tools = pv_tools();

    let (tokens, done) = collect(provider(&server).stream(request).await.expect("stream opens")).await;

    assert_eq!(tokens, ["Checking the gauge."]);
    let response = done.expect("Done");
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "get_pv_value".into(),
                arguments: "{\"pv_name\": \"SR:VAC:P1\"}".into()
            },
            ToolCall { id: "toolu_01Lw4nWm8kAQ3pT5dJzKcB2x".into(), name: "list_alarms".into(), arguments: "{}".into() },
        ]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.usage, Usage { input_tokens: Some(472), output_tokens: Some(89) });
}

#[tokio::test]
async fn a_streamed_structured_answer_streams_the_forced_tools_input_as_text() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_structured.sse", SSE)]).await;
    let mut request = request(vec![ChatMessage::user("Summarise the beam status.")]);
    request.response_schema = Some(schema_for::<BeamStatus>());

    let (tokens, done) = collect(provider(&server).stream(request).await.expect("stream opens")).await;

    assert_eq!(tokens.len(), 2, "{tokens:?}");
    let response = done.expect("Done");
    assert_eq!(serde_json::from_str::<BeamStatus>(&response.content).expect("JSON"), expected_beam_status());
    assert!(response.tool_calls.is_empty());
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(server.only_request().body["tool_choice"], json!({"type": "tool", "name": "BeamStatus"}));
}

#[tokio::test]
async fn error_bodies_are_classified_by_the_callers_next_action() {
    let server = FixtureServer::start([
        Reply::json(401, "anthropic/error_authentication.json"),
        Reply::json(429, "anthropic/error_rate_limit.json").header("retry-after", "7"),
        Reply::json(529, "anthropic/error_overloaded.json"),
        Reply::json(400, "anthropic/error_prompt_too_long.json"),
        Reply::json(404, "anthropic/error_model_not_found.json"),
    ])
    .await;
    let provider = provider(&server);
    let table = [
        (LlmErrorKind::Auth { status: 401 }, FaultClass::Critical, None, "invalid x-api-key"),
        (LlmErrorKind::RateLimited, FaultClass::Retriable, Some(Duration::from_secs(7)), "rate_limit_error"),
        (LlmErrorKind::Server { status: 529 }, FaultClass::Retriable, None, "Overloaded [overloaded_error]"),
        (LlmErrorKind::ContextLength, FaultClass::ContextOverflow, None, "prompt is too long"),
        (LlmErrorKind::InvalidModel, FaultClass::Critical, None, "models.<role>.model_id"),
    ];
    for (kind, class, retry_after, phrase) in table {
        let error = provider.complete(request(vec![ChatMessage::user("hi")])).await.expect_err("an error status");
        assert_eq!(error.kind, kind, "{error}");
        assert_eq!(error.class(), class, "{error}");
        assert_eq!(error.retry_after, retry_after, "{error}");
        assert!(error.message.contains(phrase), "{phrase:?} not in {error}");
        assert_eq!((error.provider.as_str(), error.model.as_str()), ("anthropic", MODEL));
    }
}

#[tokio::test]
async fn an_error_status_fails_the_stream_before_it_opens() {
    let server = FixtureServer::start([Reply::json(529, "anthropic/error_overloaded.json")]).await;
    let error = provider(&server).stream(request(vec![ChatMessage::user("hi")])).await.err().expect("an error status");
    assert_eq!(error.kind, LlmErrorKind::Server { status: 529 });
    assert!(error.is_transient());
}

#[tokio::test]
async fn an_error_event_mid_stream_is_classified() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_overloaded.sse", SSE)]).await;
    let (tokens, done) = collect(provider(&server).stream(request(vec![ChatMessage::user("hi")])).await.expect("stream opens")).await;
    assert_eq!(tokens, ["Beam"]);
    let error = done.expect_err("the error event");
    assert_eq!(error.kind, LlmErrorKind::Server { status: 529 });
    assert!(error.message.contains("Overloaded"), "{error}");
}

#[tokio::test]
async fn a_stream_that_ends_before_message_stop_is_cut() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_truncated.sse", SSE)]).await;
    let (tokens, done) = collect(provider(&server).stream(request(vec![ChatMessage::user("hi")])).await.expect("stream opens")).await;
    assert_eq!(tokens, ["Beam current", " is"]);
    let error = done.expect_err("cut");
    assert_eq!(error.kind, LlmErrorKind::StreamCut);
    assert!(error.message.contains("message_stop"), "{error}");
}

#[tokio::test]
async fn a_connection_broken_off_mid_stream_is_cut() {
    let server = FixtureServer::start([Reply::stream("anthropic/stream_truncated.sse", SSE).aborted()]).await;
    let (_, done) = collect(provider(&server).stream(request(vec![ChatMessage::user("hi")])).await.expect("stream opens")).await;
    let error = done.expect_err("cut");
    assert_eq!(error.kind, LlmErrorKind::StreamCut, "{error}");
    assert!(error.is_transient());
}

#[test]
fn a_missing_api_key_is_a_configuration_error() {
    let error = AnthropicProvider::new("claude", &ProviderConfig::default()).expect_err("no key");
    assert_eq!(error.kind, LlmErrorKind::Config);
    assert!(error.message.contains("api.providers.claude.api_key"), "{error}");
}

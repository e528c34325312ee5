//! The Ollama provider against recorded `/api/chat` fixtures: the request it sends (`options`,
//! `format` schema, tools) and how it reads plain, structured, tool-calling and NDJSON-streamed
//! answers, usage counts and error bodies.
#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

mod support;

use peregrine_llm::{
    CallOptions, ChatMessage, ChatRequest, LlmClient, LlmErrorKind, LlmProvider, OllamaProvider, ProviderConfig, Secret, ToolCall,
    ToolSpec, Usage, schema_for,
};
use serde_json::json;
use support::{BeamStatus, FixtureServer, Reply, collect, expected_beam_status, one_role_config};

const MODEL: &str = "llama3.2";
const NDJSON: &str = "application/x-ndjson";

fn provider(server: &FixtureServer) -> OllamaProvider {
    let config = ProviderConfig { base_url: Some(format!("{}/", server.url)), ..ProviderConfig::default() };
    OllamaProvider::new("ollama", &config).expect("valid config")
}

fn request(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest { model: MODEL.into(), messages, ..ChatRequest::default() }
}

#[tokio::test]
async fn a_plain_chat_sends_options_and_reads_content_and_counts() {
    let server = FixtureServer::start([Reply::json(200, "ollama/chat.json")]).await;
    let mut request =
        request(vec![ChatMessage::system("You are the control-room assistant."), ChatMessage::user("What is the beam current?")]);
    request.temperature = Some(0.25);
    request.max_tokens = Some(256);

    let response = provider(&server).complete(request).await.expect("completion");

    assert_eq!(response.content, "The storage-ring beam current is stable at 500.2 mA.");
    assert_eq!(response.usage, Usage { input_tokens: Some(26), output_tokens: Some(17) });
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model, MODEL);
    let sent = server.only_request();
    assert_eq!(sent.path, "/api/chat");
    assert_eq!(sent.header("authorization"), "", "no key, no bearer");
    assert_eq!(
        sent.body,
        json!({
            "model": MODEL,
            "stream": false,
            "messages": [
                {"role": "system", "content": "You are the control-room assistant."},
                {"role": "user", "content": "What is the beam current?"}
            ],
            "options": {"temperature": 0.25, "num_predict": 256}
        })
    );
}

#[tokio::test]
async fn structured_output_sends_the_schema_as_format() {
    let server = FixtureServer::start([Reply::json(200, "ollama/chat_structured.json")]).await;
    let provider = provider(&server);
    assert!(provider.features().native_json_schema);
    let client = LlmClient::new(one_role_config("ollama", MODEL, None)).with_provider("ollama", provider);

    let status: BeamStatus = client
        .structured("classifier", vec![ChatMessage::user("Summarise the beam status.")], CallOptions::default())
        .await
        .expect("structured answer");

    assert_eq!(status, expected_beam_status());
    assert_eq!(client.usage()[0].usage, Usage { input_tokens: Some(148), output_tokens: Some(29) });
    let sent = server.only_request();
    let schema = schema_for::<BeamStatus>();
    assert_eq!(sent.body["format"]["title"], json!("BeamStatus"), "the title names the schema");
    assert_eq!(sent.body["format"]["properties"], schema.schema["properties"]);
    assert_eq!(sent.body["format"]["required"], schema.schema["required"]);
    assert_eq!(sent.body["messages"], json!([{"role": "user", "content": "Summarise the beam status."}]), "no schema in the prompt");
}

#[tokio::test]
async fn tools_are_sent_as_functions_and_calls_come_back_as_json_text() {
    let server = FixtureServer::start([Reply::json(200, "ollama/chat_tool_calls.json")]).await;
    let mut request = request(vec![ChatMessage::user("Is the vacuum OK?")]);
    let parameters = json!({"type": "object", "properties": {"pv_name": {"type": "string"}}, "required": ["pv_name"]});
    request.tools = vec![ToolSpec {
        name: "get_pv_value".into(),
        description: "Reads one EPICS process variable.".into(),
        parameters: parameters.clone(),
    }];

    let response = provider(&server).complete(request).await.expect("completion");

    assert_eq!(response.content, "");
    assert_eq!(
        response.tool_calls,
        vec![ToolCall { id: "call_0".into(), name: "get_pv_value".into(), arguments: "{\"pv_name\":\"SR:VAC:P1\"}".into() }]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        server.only_request().body["tools"],
        json!([{"type": "function", "function": {"name": "get_pv_value", "description": "Reads one EPICS process variable.", "parameters": parameters}}])
    );
}

#[tokio::test]
async fn an_ndjson_stream_yields_tokens_then_done_with_counts() {
    let server = FixtureServer::start([Reply::stream("ollama/chat_stream.ndjson", NDJSON)]).await;

    let (tokens, done) =
        collect(provider(&server).stream(request(vec![ChatMessage::user("Beam current?")])).await.expect("stream opens")).await;

    assert_eq!(tokens, ["Beam current", " is 500 mA", " — stable (±0.1 µA)."]);
    let response = done.expect("Done");
    assert_eq!(response.content, tokens.concat());
    assert_eq!(response.usage, Usage { input_tokens: Some(26), output_tokens: Some(12) });
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(server.only_request().body["stream"], json!(true));
}

#[tokio::test]
async fn streamed_tool_calls_arrive_in_done() {
    let server = FixtureServer::start([Reply::stream("ollama/chat_stream_tool_calls.ndjson", NDJSON)]).await;
    let (tokens, done) =
        collect(provider(&server).stream(request(vec![ChatMessage::user("Is the vacuum OK?")])).await.expect("stream opens")).await;
    assert!(tokens.is_empty());
    let response = done.expect("Done");
    assert_eq!(
        response.tool_calls,
        vec![ToolCall { id: "call_0".into(), name: "get_pv_value".into(), arguments: "{\"pv_name\":\"SR:VAC:P1\"}".into() }]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn a_stream_without_its_done_line_is_cut() {
    let server = FixtureServer::start([
        Reply::stream("ollama/chat_stream_truncated.ndjson", NDJSON),
        Reply::stream("ollama/chat_stream_truncated.ndjson", NDJSON).aborted(),
    ])
    .await;
    let provider = provider(&server);
    for what in ["clean end", "broken connection"] {
        let (tokens, done) = collect(provider.stream(request(vec![ChatMessage::user("hi")])).await.expect("stream opens")).await;
        // A broken connection may lose what the server had not flushed yet.
        assert!(["Beam current", " is"].starts_with(&tokens.iter().map(String::as_str).collect::<Vec<_>>()), "{what}: {tokens:?}");
        let error = done.expect_err("cut");
        assert_eq!(error.kind, LlmErrorKind::StreamCut, "{what}: {error}");
    }
}

#[tokio::test]
async fn an_error_line_mid_stream_is_a_server_fault() {
    let server = FixtureServer::start([Reply::stream("ollama/chat_stream_error.ndjson", NDJSON)]).await;
    let (tokens, done) = collect(provider(&server).stream(request(vec![ChatMessage::user("hi")])).await.expect("stream opens")).await;
    assert_eq!(tokens, ["Beam"]);
    let error = done.expect_err("error line");
    assert_eq!(error.kind, LlmErrorKind::Server { status: 500 });
    assert!(error.message.contains("llama runner process has terminated"), "{error}");
}

#[tokio::test]
async fn error_bodies_are_classified() {
    let server = FixtureServer::start([
        Reply::json(404, "ollama/error_model_not_found.json"),
        Reply::json(500, "ollama/error_runner_terminated.json"),
    ])
    .await;
    let provider = provider(&server);

    let missing = provider.complete(request(vec![ChatMessage::user("hi")])).await.expect_err("unknown model");
    assert_eq!(missing.kind, LlmErrorKind::InvalidModel, "{missing}");
    assert!(missing.message.contains("model \"llama9\" not found, try pulling it first"), "{missing}");

    let crashed = provider.stream(request(vec![ChatMessage::user("hi")])).await.err().expect("runner crashed");
    assert_eq!(crashed.kind, LlmErrorKind::Server { status: 500 });
    assert!(crashed.is_transient());
}

#[tokio::test]
async fn an_api_key_goes_as_a_bearer_token() {
    let server = FixtureServer::start([Reply::json(200, "ollama/chat.json")]).await;
    let config =
        ProviderConfig { base_url: Some(server.url.clone()), api_key: Some(Secret::new("ollama-proxy-key")), ..ProviderConfig::default() };
    OllamaProvider::new("ollama", &config)
        .expect("valid config")
        .complete(request(vec![ChatMessage::user("hi")]))
        .await
        .expect("completion");
    assert_eq!(server.only_request().header("authorization"), "Bearer ollama-proxy-key");
}

#[tokio::test]
async fn an_unreachable_server_is_a_connect_fault() {
    // A port that was just free: nothing listens there any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let provider =
        OllamaProvider::new("ollama", &ProviderConfig { base_url: Some(url), ..ProviderConfig::default() }).expect("valid config");
    let error = provider.complete(request(vec![ChatMessage::user("hi")])).await.expect_err("nobody listens");
    assert_eq!(error.kind, LlmErrorKind::Connect, "{error}");
    assert!(error.message.contains("api.providers.ollama.base_url"), "{error}");
}

//! The scripted LLM server over real HTTP: reply selection by schema name, streaming shapes (SSE and NDJSON),
//! every fault as a client sees it, the request log, the model lists and shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers: a failed HTTP call or parse is a test failure")]

use std::time::Duration;

use futures::StreamExt;
use peregrine_testkit::llm_server::{DEFAULT_MODEL, Endpoint, Fault, Reply, SchemaSource, Script, ScriptedLlmServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// A chat request body for the OpenAI endpoint with one user message.
fn chat(prompt: &str) -> Value {
    json!({"model": "gpt-test", "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}]})
}

/// The same with `response_format: json_schema` named `name`.
fn chat_with_schema(prompt: &str, name: &str) -> Value {
    let mut body = chat(prompt);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": name, "strict": true, "schema": {"type": "object"}}});
    body
}

async fn post(server: &ScriptedLlmServer, body: &Value) -> reqwest::Response {
    client().post(format!("{}/chat/completions", server.base_url())).bearer_auth("sk-test").json(body).send().await.unwrap()
}

async fn post_json(server: &ScriptedLlmServer, body: &Value) -> Value {
    let response = post(server, body).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

fn content(completion: &Value) -> &str {
    completion["choices"][0]["message"]["content"].as_str().unwrap()
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn sse_payloads(text: &str) -> Vec<String> {
    text.split("\n\n").filter(|event| !event.is_empty()).map(|event| event.strip_prefix("data: ").unwrap().to_owned()).collect()
}

async fn stream_text(server: &ScriptedLlmServer, body: &Value) -> String {
    let response = post(server, body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    response.text().await.unwrap()
}

fn streamed(prompt: &str, include_usage: bool) -> Value {
    let mut body = chat(prompt);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": include_usage});
    body
}

#[tokio::test]
async fn non_stream_answer_is_chosen_by_response_format_schema_name() {
    let script = Script::new()
        .on_schema("ExtractedTask", Reply::json(json!({"task": "open the valve", "priority": 2})))
        .on_schema("Other", Reply::text("wrong"))
        .on_plain(Reply::text("plain"));
    let server = ScriptedLlmServer::start(script).await;

    let completion = post_json(&server, &chat_with_schema("please extract the task", "ExtractedTask")).await;
    assert_eq!(serde_json::from_str::<Value>(content(&completion)).unwrap(), json!({"task": "open the valve", "priority": 2}));
    assert!(completion["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(completion["object"], "chat.completion");
    assert!(completion["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(completion["model"], "gpt-test");
    assert_eq!(completion["choices"][0]["index"], 0);
    assert_eq!(completion["choices"][0]["message"]["role"], "assistant");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    // Default usage: whitespace-separated words of all messages (3 + 4) and of the completion text (3).
    assert_eq!(completion["usage"], json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}));

    assert_eq!(content(&post_json(&server, &chat("hello there")).await), "plain");
}

#[tokio::test]
async fn schema_name_marker_in_the_last_message_selects_the_rule() {
    let script =
        Script::new().on_schema("CapabilityMatch", Reply::json(json!({"capability": "beam_status"}))).on_plain(Reply::text("plain"));
    let server = ScriptedLlmServer::start(script).await;

    let prompt = "Answer with JSON matching this schema.\nSchema name: CapabilityMatch\n{\"type\":\"object\"}";
    assert_eq!(content(&post_json(&server, &chat(prompt)).await), r#"{"capability":"beam_status"}"#);
    let recorded = server.requests().pop().unwrap();
    assert_eq!(recorded.schema_name.as_deref(), Some("CapabilityMatch"));
    assert_eq!(recorded.schema_source, Some(SchemaSource::PromptMarker));
    assert_eq!(recorded.schema, None);
}

#[tokio::test]
async fn sequences_advance_per_call_and_repeat_the_last_reply() {
    let script = Script::new().on_schema("Step", Reply::sequence(vec![Reply::text("first"), Reply::text("second")]));
    let server = ScriptedLlmServer::start(script).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(content(&post_json(&server, &chat_with_schema("go", "Step")).await).to_owned());
    }
    assert_eq!(answers, ["first", "second", "second", "second"]);
}

#[tokio::test]
async fn rules_match_in_order_then_the_fallback_and_closures_see_the_request() {
    let script = Script::new()
        .on_prompt_containing("beam", Reply::text("beam answer"))
        .on_request(|request| request.tool_names().contains(&"search".to_owned()), Reply::text("tool user"))
        .on_schema("Echo", Reply::from_fn(|request| Reply::text(format!("echo: {}", request.last_message().unwrap_or_default()))))
        .otherwise(Reply::text("fallback"));
    let server = ScriptedLlmServer::start(script).await;

    assert_eq!(content(&post_json(&server, &chat("what is the beam current?")).await), "beam answer");
    let mut with_tools = chat("hi");
    with_tools["tools"] = json!([{"type": "function", "function": {"name": "search", "parameters": {}}}]);
    assert_eq!(content(&post_json(&server, &with_tools).await), "tool user");
    assert_eq!(content(&post_json(&server, &chat_with_schema("say this", "Echo")).await), "echo: say this");
    assert_eq!(content(&post_json(&server, &chat("anything else")).await), "fallback");
}

#[tokio::test]
async fn unmatched_requests_get_a_501_that_says_what_is_missing() {
    let server = ScriptedLlmServer::start(Script::new().on_schema("Known", Reply::text("x"))).await;
    let response = post(&server, &chat_with_schema("hi", "Unknown")).await;
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_scripted_reply");
    assert!(body["error"]["message"].as_str().unwrap().contains("Unknown"), "{body}");
}

#[tokio::test]
async fn sse_stream_has_one_id_null_finish_reasons_until_the_end_and_a_usage_chunk_before_done() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::text("the beam is on and stable"))).await;
    let payloads = sse_payloads(&stream_text(&server, &streamed("status?", true)).await);

    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|payload| serde_json::from_str(payload).unwrap()).collect();
    let (usage_chunk, content_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], json!({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}));
    for chunk in &chunks {
        assert_eq!(chunk["id"], chunks[0]["id"]);
        assert_eq!(chunk["created"], chunks[0]["created"]);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
    }
    assert_eq!(content_chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (last, before) = content_chunks.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    for chunk in before {
        assert!(chunk["choices"][0]["finish_reason"].is_null());
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some(), "include_usage puts usage: null on every chunk");
    }
    let text: String = content_chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "the beam is on and stable");
    assert!(content_chunks.len() > 3, "content arrives in several pieces");
}

#[tokio::test]
async fn sse_stream_without_include_usage_has_no_usage_at_all() {
    let server =
        ScriptedLlmServer::start(Script::new().on_plain(Reply::text("hi there").with_chunks(vec!["hi".into(), " there".into()]))).await;
    let payloads = sse_payloads(&stream_text(&server, &streamed("x", false)).await);
    assert_eq!(payloads.len(), 4, "role, two content pieces, [DONE]: {payloads:?}");
    for payload in &payloads[..3] {
        let chunk: Value = serde_json::from_str(payload).unwrap();
        assert!(chunk.get("usage").is_none());
    }
    let pieces: Vec<Value> =
        payloads[1..3].iter().map(|p| serde_json::from_str::<Value>(p).unwrap()["choices"][0]["delta"]["content"].clone()).collect();
    assert_eq!(pieces, [json!("hi"), json!(" there")]);
}

#[tokio::test]
async fn tool_calls_non_stream_and_streamed_as_indexed_deltas() {
    let reply = Reply::tool_call("read_pv", json!({"name": "SR:CURRENT", "timeout": 2})).with_tool_call("log", json!({"text": "checked"}));
    let server = ScriptedLlmServer::start(Script::new().on_plain(reply)).await;

    let completion = post_json(&server, &chat("read it")).await;
    let message = &completion["choices"][0]["message"];
    assert!(message["content"].is_null());
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["tool_calls"][0]["type"], "function");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "read_pv");
    let arguments: Value = serde_json::from_str(message["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"name": "SR:CURRENT", "timeout": 2}));
    assert_eq!(message["tool_calls"][1]["function"]["name"], "log");

    let payloads = sse_payloads(&stream_text(&server, &streamed("read it", false)).await);
    let chunks: Vec<Value> = payloads.iter().filter(|p| *p != "[DONE]").map(|p| serde_json::from_str(p).unwrap()).collect();
    let mut names = vec![String::new(); 2];
    let mut arguments = vec![String::new(); 2];
    for chunk in &chunks {
        for call in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            names[index] += call["function"]["name"].as_str().unwrap_or_default();
            arguments[index] += call["function"]["arguments"].as_str().unwrap_or_default();
        }
    }
    assert_eq!(names, ["read_pv", "log"]);
    assert_eq!(serde_json::from_str::<Value>(&arguments[0]).unwrap(), json!({"name": "SR:CURRENT", "timeout": 2}));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn ollama_chat_non_stream_and_ndjson_stream_with_format_schema() {
    let script = Script::new().on_schema("Plan", Reply::json(json!({"steps": 3}))).on_plain(Reply::text("hello from ollama"));
    let server = ScriptedLlmServer::start(script).await;
    let url = format!("{}/api/chat", server.ollama_url());

    let body = json!({"model": "llama3", "stream": false, "messages": [{"role": "user", "content": "plan it"}],
                      "format": {"title": "Plan", "type": "object"}, "options": {"temperature": 0}});
    let answer: Value = client().post(&url).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["model"], "llama3");
    assert_eq!(answer["done"], true);
    assert_eq!(answer["message"], json!({"role": "assistant", "content": "{\"steps\":3}"}));
    assert_eq!((answer["prompt_eval_count"].as_u64(), answer["eval_count"].as_u64()), (Some(2), Some(1)));
    let recorded = server.requests().pop().unwrap();
    assert_eq!((recorded.endpoint, recorded.schema_source), (Endpoint::OllamaChat, Some(SchemaSource::OllamaFormat)));
    assert_eq!(recorded.schema, Some(json!({"title": "Plan", "type": "object"})));

    // No `stream` field: Ollama streams by default.
    let response =
        client().post(&url).json(&json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]})).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let (last, pieces) = lines.split_last().unwrap();
    assert!(pieces.iter().all(|line| line["done"] == false));
    let streamed: String = pieces.iter().map(|line| line["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(streamed, "hello from ollama");
    assert_eq!(last["done"], true);
    assert_eq!((last["prompt_eval_count"].as_u64(), last["eval_count"].as_u64()), (Some(1), Some(3)));
}

#[tokio::test]
async fn ollama_tool_calls_carry_arguments_as_objects() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::tool_call("read_pv", json!({"name": "SR:CURRENT"})))).await;
    let url = format!("{}/api/chat", server.ollama_url());
    let body = json!({"model": "llama3", "stream": false, "messages": [{"role": "user", "content": "read"}]});
    let answer: Value = client().post(&url).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["message"]["tool_calls"], json!([{"function": {"name": "read_pv", "arguments": {"name": "SR:CURRENT"}}}]));

    let text = client().post(&url).json(&json!({"model": "llama3", "messages": []})).send().await.unwrap().text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2, "tool-call line, done line: {text}");
    assert_eq!(lines[0]["message"]["tool_calls"][0]["function"]["name"], "read_pv");
    assert_eq!(lines[1]["done"], true);
}

#[tokio::test]
async fn model_lists_for_openai_and_ollama() {
    let server = ScriptedLlmServer::start(Script::new().with_model("gpt-test").with_model("small")).await;
    let models: Value =
        client().get(format!("{}/models", server.base_url())).bearer_auth("sk-x").send().await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["gpt-test", "small"]);
    assert_eq!(models["data"][0]["object"], "model");

    let tags: Value = client().get(format!("{}/api/tags", server.ollama_url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(tags["models"][1]["name"], "small");

    let default = ScriptedLlmServer::start(Script::new()).await;
    let models: Value = client().get(format!("{}/models", default.base_url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], DEFAULT_MODEL);
}

#[tokio::test]
async fn the_request_log_records_every_request_with_headers_body_and_schema() {
    let server = ScriptedLlmServer::start(Script::new().otherwise(Reply::text("ok"))).await;
    post_json(&server, &chat_with_schema("first", "Thing")).await;
    client().get(format!("{}/models", server.base_url())).send().await.unwrap();
    let missing = client().post(format!("{}/chat/completions", server.ollama_url())).json(&chat("x")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    let requests = server.requests();
    assert_eq!(server.request_count(), 3);
    assert_eq!(requests.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(requests.iter().map(|r| r.endpoint).collect::<Vec<_>>(), [Endpoint::ChatCompletions, Endpoint::Models, Endpoint::Unknown]);
    let first = &requests[0];
    assert_eq!((first.method.as_str(), first.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(first.authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(first.bearer_token(), Some("sk-test"));
    assert_eq!(first.header("Content-Type"), Some("application/json"));
    assert_eq!(first.model.as_deref(), Some("gpt-test"));
    assert!(!first.stream);
    assert_eq!(first.schema_name.as_deref(), Some("Thing"));
    assert_eq!(first.schema_source, Some(SchemaSource::ResponseFormat));
    assert_eq!(first.schema, Some(json!({"type": "object"})));
    assert_eq!(first.body["messages"][1]["content"], "first");
    assert_eq!(first.messages()[0], ("system".to_owned(), "You are terse.".to_owned()));
    assert_eq!(requests[2].path, "/chat/completions");
    assert!(requests[0].received_at <= requests[1].received_at && requests[1].received_at <= requests[2].received_at);
    assert_eq!(server.chat_requests().len(), 1);
}

/// The status, `Retry-After` header and error body a fault produces.
async fn fault_response(fault: Fault) -> (StatusCode, Option<String>, Value) {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(fault))).await;
    let response = post(&server, &chat("hi")).await;
    let retry_after = response.headers().get("retry-after").map(|value| value.to_str().unwrap().to_owned());
    (response.status(), retry_after, response.json().await.unwrap())
}

#[tokio::test]
async fn http_error_faults_send_openai_error_bodies() {
    let cases = [
        (Fault::Status500, 500, "server_error", Value::Null),
        (Fault::Status(503), 503, "server_error", Value::Null),
        (Fault::Status(422), 422, "invalid_request_error", Value::Null),
        (Fault::Unauthorized, 401, "invalid_request_error", json!("invalid_api_key")),
        (Fault::Forbidden, 403, "permission_error", json!("invalid_api_key")),
        (Fault::ModelNotFound, 404, "invalid_request_error", json!("model_not_found")),
        (Fault::ContextLengthExceeded, 400, "invalid_request_error", json!("context_length_exceeded")),
        (Fault::RateLimited { retry_after_secs: 7 }, 429, "requests", json!("rate_limit_exceeded")),
        (
            Fault::Http { status: 529, error_type: "overloaded_error".into(), code: Some("overloaded".into()), message: "busy".into() },
            529,
            "overloaded_error",
            json!("overloaded"),
        ),
    ];
    for (fault, status, error_type, code) in cases {
        let label = format!("{fault:?}");
        let (got_status, retry_after, body) = fault_response(fault).await;
        assert_eq!(got_status.as_u16(), status, "{label}");
        let error = &body["error"];
        assert_eq!(error["type"], error_type, "{label}");
        assert_eq!(error["code"], code, "{label}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{label}");
        assert!(error.get("param").is_some(), "{label}");
        assert_eq!(retry_after.as_deref(), (status == 429).then_some("7"), "{label}");
    }
    let (_, _, body) = fault_response(Fault::ModelNotFound).await;
    assert_eq!(body["error"]["param"], "model");
    assert!(body["error"]["message"].as_str().unwrap().contains("gpt-test"));
}

#[tokio::test]
async fn ollama_errors_use_the_ollama_body() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(Fault::ModelNotFound))).await;
    let url = format!("{}/api/chat", server.ollama_url());
    let response = client().post(url).json(&json!({"model": "nope", "messages": []})).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("nope"));
}

#[tokio::test]
async fn after_faults_fail_the_first_calls_then_answer() {
    let reply = Reply::text("ok").after_faults(vec![Fault::Status500, Fault::RateLimited { retry_after_secs: 1 }]);
    let server = ScriptedLlmServer::start(Script::new().on_plain(reply)).await;
    assert_eq!(post(&server, &chat("a")).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(post(&server, &chat("a")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(content(&post_json(&server, &chat("a")).await), "ok");
    assert_eq!(content(&post_json(&server, &chat("a")).await), "ok");
}

#[tokio::test]
async fn latency_delays_the_answer_and_token_latency_spaces_the_chunks() {
    let delay = Duration::from_millis(120);
    let script = Script::new()
        .on_schema("Slow", Reply::text("late").with_latency(delay))
        .on_plain(Reply::text("a b c").with_token_latency(Duration::from_millis(30)));
    let server = ScriptedLlmServer::start(script).await;
    // Lower bounds only: a sleep never ends early, so these cannot flake.
    let started = std::time::Instant::now();
    assert_eq!(content(&post_json(&server, &chat_with_schema("x", "Slow")).await), "late");
    assert!(started.elapsed() >= delay);

    let started = std::time::Instant::now();
    let payloads = sse_payloads(&stream_text(&server, &streamed("x", false)).await);
    assert_eq!(payloads.len(), 5, "role, a, b, c, [DONE]");
    assert!(started.elapsed() >= Duration::from_millis(30 * 4));
}

#[tokio::test]
async fn timeout_holds_the_request_until_the_client_gives_up_and_shutdown_releases_it() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(Fault::Timeout))).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(200)).build().unwrap();
    let error = impatient.post(format!("{}/chat/completions", server.base_url())).json(&chat("x")).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");

    // A second request is still held when the server shuts down; shutdown releases it instead of hanging.
    let url = format!("{}/chat/completions", server.base_url());
    let held = tokio::spawn(async move { client().post(url).json(&chat("x")).send().await.map(|r| r.status()) });
    while server.request_count() < 2 {
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(Duration::from_secs(10), server.shutdown()).await.expect("shutdown finishes while a request is held");
    let released = held.await.unwrap();
    assert!(released.is_err() || released.as_ref().is_ok_and(|status| *status == StatusCode::SERVICE_UNAVAILABLE), "{released:?}");
}

#[tokio::test]
async fn refuse_connection_closes_without_a_response_and_the_next_call_works() {
    let reply = Reply::text("ok").after_faults(vec![Fault::RefuseConnection]);
    let server = ScriptedLlmServer::start(Script::new().on_plain(reply)).await;
    let client = client();
    let url = format!("{}/chat/completions", server.base_url());
    let error = client.post(&url).json(&chat("x")).send().await.unwrap_err();
    assert!(!error.is_timeout() && error.status().is_none(), "{error:?}");
    let completion: Value = client.post(&url).json(&chat("x")).send().await.unwrap().json().await.unwrap();
    assert_eq!(content(&completion), "ok");
}

#[tokio::test]
async fn refusing_gives_a_base_url_where_connections_are_refused() {
    let url = ScriptedLlmServer::refusing();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/v1"));
    let error = client().post(format!("{url}/chat/completions")).json(&chat("x")).send().await.unwrap_err();
    assert!(error.is_connect(), "{error:?}");
}

#[tokio::test]
async fn malformed_json_is_a_200_whose_body_does_not_parse() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(Fault::MalformedJson))).await;
    let response = post(&server, &chat("x")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");

    let payloads = sse_payloads(&stream_text(&server, &streamed("x", true)).await);
    assert!(serde_json::from_str::<Value>(&payloads[0]).is_err());
}

/// Reads a streamed body until it ends or fails: the bytes received and whether it failed.
async fn read_until_end(response: reqwest::Response) -> (String, bool) {
    let mut bytes = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(item) = stream.next().await {
        match item {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(_) => return (String::from_utf8(bytes).unwrap(), true),
        }
    }
    (String::from_utf8(bytes).unwrap(), false)
}

#[tokio::test]
async fn truncated_stream_aborts_mid_body_and_stream_ends_early_ends_cleanly_both_without_done() {
    let script = Script::new()
        .on_schema("Abort", Reply::text("one two three four").with_fault(Fault::TruncatedStream { after_chunks: 2 }))
        .on_schema("Clean", Reply::text("one two three four").with_fault(Fault::StreamEndsEarly { after_chunks: 3 }));
    let server = ScriptedLlmServer::start(script).await;
    let streaming = |name: &str| {
        let mut body = chat_with_schema("x", name);
        body["stream"] = json!(true);
        body
    };

    let (text, failed) = read_until_end(post(&server, &streaming("Abort")).await).await;
    assert!(failed, "the body ends in a transport error");
    assert_eq!(sse_payloads(&text).len(), 2);
    assert!(!text.contains("[DONE]"));

    let (text, failed) = read_until_end(post(&server, &streaming("Clean")).await).await;
    assert!(!failed, "the body ends cleanly");
    assert_eq!(sse_payloads(&text).len(), 3);
    assert!(!text.contains("[DONE]"));

    // A non-stream answer cut short sends half of its JSON.
    let (text, failed) = read_until_end(post(&server, &chat_with_schema("x", "Abort")).await).await;
    assert!(failed);
    assert!(text.starts_with('{'), "{text}");
    assert!(serde_json::from_str::<Value>(&text).is_err());
}

#[tokio::test]
async fn stream_stall_sends_some_events_then_nothing_until_shutdown() {
    let server =
        ScriptedLlmServer::start(Script::new().on_plain(Reply::text("a b c d").with_fault(Fault::StreamStall { after_chunks: 2 }))).await;
    let response = post(&server, &streamed("x", false)).await;
    let mut stream = response.bytes_stream();
    let mut received = String::new();
    while sse_payloads(&received).len() < 2 {
        received += std::str::from_utf8(&stream.next().await.unwrap().unwrap()).unwrap();
    }
    let waited = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    assert!(waited.is_err(), "nothing more arrives while stalled");
    drop(server);
    let after_shutdown = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("shutdown ends the stalled stream");
    assert!(after_shutdown.is_none_or(|item| item.is_err()));
}

#[tokio::test]
async fn invalid_json_bodies_get_a_400_and_are_still_recorded() {
    let server = ScriptedLlmServer::start(Script::new().otherwise(Reply::text("ok"))).await;
    let response = client()
        .post(format!("{}/chat/completions", server.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_json");
    assert_eq!(server.requests()[0].body, Value::Null);
}

//! The OpenAI-compatible API over real HTTP: the weather agent on the scripted LLM server,
//! served by `router()` on 127.0.0.1, called with reqwest as Open WebUI or the `openai` clients
//! would call it.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;
use std::time::Duration;

use peregrine_llm::Secret;
use peregrine_server::{ServerOptions, router};
use peregrine_testkit::agent_fixture::{LlmCall, answer_reply, call_counts, weather_agent, weather_script, with_weather_replies};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use serde_json::{Value, json};

const MODEL: &str = "peregrine-weather";
const QUESTION: &str = "What's the weather in Prague?";
const PLANNING: &str = "/planning What's the weather in Prague?";

struct Served {
    url: String,
    llm: ScriptedLlmServer,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn serve(script: Script, options: ServerOptions) -> Served {
    let llm = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &dir.path().join("data")).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let app = router(Arc::new(agent), options);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { url, llm, client: reqwest::Client::new(), _dir: dir }
}

fn options() -> ServerOptions {
    ServerOptions::new(MODEL)
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

impl Served {
    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        self.client.post(format!("{}/chat/completions", self.url)).json(body)
    }

    async fn chat(&self, messages: Value) -> (u16, Value) {
        self.chat_as(None, messages).await
    }

    async fn chat_as(&self, key: Option<&str>, messages: Value) -> (u16, Value) {
        let mut request = self.post(&json!({"model": MODEL, "messages": messages}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    fn calls(&self, call: LlmCall) -> usize {
        call_counts(&self.llm.chat_requests()).get(&call).copied().unwrap_or(0)
    }
}

fn content(body: &Value) -> String {
    body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no content in {body}")).to_owned()
}

fn assert_error(body: &Value, code: Option<&str>) {
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|message| !message.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some(), "{body}");
    assert_eq!(error["code"].as_str(), code, "{body}");
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let served = serve(weather_script(), options()).await;
    let first: Value = served.client.get(format!("{}/models", served.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(first["object"], "list");
    let model = &first["data"][0];
    assert_eq!(
        (model["id"].as_str(), model["object"].as_str(), model["owned_by"].as_str()),
        (Some(MODEL), Some("model"), Some("peregrine"))
    );
    assert!(model["created"].as_i64().is_some_and(|created| created > 1_600_000_000), "{model}");
    let again: Value = served.client.get(format!("{}/models", served.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(again["data"][0]["created"], model["created"], "the creation time is fixed");
    let unknown = served.client.get(format!("{}/nothing", served.url)).send().await.unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
    assert_error(&unknown.json().await.unwrap(), Some("unknown_url"));
}

#[tokio::test]
async fn a_non_stream_answer_has_the_weather_and_usage() {
    let served = serve(weather_script(), options()).await;
    let (status, body) = served.chat(json!([{"role": "system", "content": "Be brief."}, user(QUESTION)])).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"), "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].is_i64());
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(content(&body).contains("Weather in Prague"), "{body}");
    let usage = &body["usage"];
    let (prompt, completion) = (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
    assert!(prompt > 0 && completion > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion));
}

/// The `data:` payloads of an SSE body.
fn sse_events(text: &str) -> Vec<String> {
    assert!(text.ends_with("data: [DONE]\n\n"), "the stream ends with [DONE]: {text:?}");
    text.split("\n\n").filter(|event| !event.is_empty()).map(|event| event.strip_prefix("data: ").unwrap().to_owned()).collect()
}

#[tokio::test]
async fn a_stream_has_role_status_lines_tokens_stop_and_usage() {
    let served = serve(weather_script(), options()).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true, "stream_options": {"include_usage": true}});
    let response = served.post(&body).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = sse_events(&response.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
    for chunk in &chunks {
        assert_eq!(chunk["id"], chunks[0]["id"]);
        assert_eq!(chunk["created"], chunks[0]["created"]);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], MODEL);
    }
    assert!(chunks[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant"}));
    let (usage, with_choices) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]), "the usage chunk comes last before [DONE]");
    let total = usage["usage"]["total_tokens"].as_u64().unwrap();
    assert!(
        total > 0 && total == usage["usage"]["prompt_tokens"].as_u64().unwrap() + usage["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let (last, before) = with_choices.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    for chunk in before {
        assert!(chunk["choices"][0]["finish_reason"].is_null(), "finish_reason is null until the end: {chunk}");
    }
    let text: String = with_choices.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    let (status, answer) = text.split_once("\n\n").unwrap_or_else(|| panic!("status lines, a blank line, the answer: {text:?}"));
    assert!(status.lines().all(|line| line.starts_with("> ") && line.ends_with('…')), "{status:?}");
    assert!(status.contains("> planning…") && status.contains("> step 1/2 current_weather…"), "{status:?}");
    assert!(answer.starts_with("Here is the current weather.") && answer.contains("Weather in Prague"), "{answer:?}");
    let respond_calls = served.llm.chat_requests().into_iter().filter(|request| LlmCall::of(request) == LlmCall::Respond).count();
    assert_eq!(respond_calls, 1, "the answer was streamed from one respond call");
}

#[tokio::test]
async fn a_stream_without_status_lines_or_usage_is_only_the_answer() {
    let served = serve(weather_script(), ServerOptions { status_lines: false, ..options() }).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let events = sse_events(&served.post(&body).send().await.unwrap().text().await.unwrap());
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
    assert!(chunks.iter().all(|chunk| chunk["choices"].as_array().is_some_and(|choices| choices.len() == 1)), "no usage chunk");
    let text: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(text.starts_with("Here is the current weather.") && text.contains("Weather in Prague"), "{text:?}");
}

#[tokio::test]
async fn an_approval_is_answered_by_the_next_request() {
    let served = serve(weather_script(), options()).await;
    let (status, asked) = served.chat(json!([user(PLANNING)])).await;
    assert_eq!(status, 200, "{asked}");
    let prompt = content(&asked);
    assert!(prompt.contains("HUMAN APPROVAL REQUIRED"), "{prompt}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0, "nothing runs before the approval");
    let (status, done) = served.chat(json!([user(PLANNING), assistant(&prompt), user("yes")])).await;
    assert_eq!(status, 200, "{done}");
    assert!(content(&done).contains("Weather in Prague"), "{done}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1, "the approved plan runs without planning again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1);
}

#[tokio::test]
async fn a_streamed_approval_prompt_is_sent_as_content() {
    let served = serve(weather_script(), options()).await;
    let body = json!({"model": MODEL, "messages": [user(PLANNING)], "stream": true});
    let events = sse_events(&served.post(&body).send().await.unwrap().text().await.unwrap());
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(text.contains("HUMAN APPROVAL REQUIRED"), "{text:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn keys_are_required_and_never_echoed() {
    let served =
        serve(weather_script(), ServerOptions { api_keys: vec![Secret::new("sk-alpha-123"), Secret::new("sk-beta-456")], ..options() })
            .await;
    let models = format!("{}/models", served.url);
    for key in [None, Some("sk-wrong-789")] {
        let mut request = served.client.get(&models);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let text = response.text().await.unwrap();
        assert!(!text.contains("sk-"), "{text}");
        assert_error(&serde_json::from_str(&text).unwrap(), Some("invalid_api_key"));
        let (status, body) = served.chat_as(key, json!([user(QUESTION)])).await;
        assert_eq!(status, 401);
        assert!(!body.to_string().contains("sk-"), "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    assert_eq!(served.llm.chat_requests().len(), 0, "no turn ran");
    let listed = served.client.get(&models).bearer_auth("sk-beta-456").send().await.unwrap();
    assert_eq!(listed.status().as_u16(), 200);
    let (status, body) = served.chat_as(Some("sk-alpha-123"), json!([user(QUESTION)])).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let served = serve(weather_script(), ServerOptions { max_body_bytes: 4096, ..options() }).await;
    let unknown_model = served.post(&json!({"model": "gpt-4o", "messages": [user(QUESTION)]})).send().await.unwrap();
    assert_eq!(unknown_model.status().as_u16(), 404);
    assert_error(&unknown_model.json().await.unwrap(), Some("model_not_found"));

    for messages in [json!([]), json!([user(QUESTION), assistant("It is sunny.")])] {
        let (status, body) = served.chat(messages).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    let huge = "x".repeat(8192);
    let too_large = served.post(&json!({"model": MODEL, "messages": [user(&huge)]})).send().await.unwrap();
    assert_eq!(too_large.status().as_u16(), 413);
    assert_error(&too_large.json().await.unwrap(), Some("request_too_large"));

    let not_json = served.client.post(format!("{}/chat/completions", served.url)).body("{not json").send().await.unwrap();
    assert_eq!(not_json.status().as_u16(), 400);
    assert_eq!(served.llm.chat_requests().len(), 0, "no turn ran");
}

#[tokio::test]
async fn two_keys_with_the_same_first_message_have_their_own_threads() {
    let served = serve(weather_script(), ServerOptions { api_keys: vec![Secret::new("sk-a"), Secret::new("sk-b")], ..options() }).await;
    let (_, asked_a) = served.chat_as(Some("sk-a"), json!([user(PLANNING)])).await;
    assert!(content(&asked_a).contains("HUMAN APPROVAL REQUIRED"), "{asked_a}");
    // On A's thread this message would answer A's approval; on B's own thread it plans anew.
    let (_, asked_b) = served.chat_as(Some("sk-b"), json!([user(PLANNING)])).await;
    assert!(content(&asked_b).contains("HUMAN APPROVAL REQUIRED"), "{asked_b}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 2);
    // B rejects its plan: A's approval is still pending afterwards.
    let (status, rejected) = served.chat_as(Some("sk-b"), json!([user(PLANNING), assistant(&content(&asked_b)), user("no")])).await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0);
    let (status, done) = served.chat_as(Some("sk-a"), json!([user(PLANNING), assistant(&content(&asked_a)), user("yes")])).await;
    assert_eq!(status, 200, "{done}");
    assert!(content(&done).contains("Weather in Prague"), "{done}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1, "only A's approved plan ran");
}

/// Waits (bounded) until `condition` holds.
async fn wait_until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_busy_thread_is_refused_and_a_dropped_client_cancels_the_turn() {
    let held_answer = Reply::sequence(vec![Reply::fault(Fault::Timeout), answer_reply()]);
    let served = serve(with_weather_replies(Script::new().on_plain(held_answer)), options()).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let first = served.post(&body).send().await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    wait_until("respond's LLM call is held", async || served.calls(LlmCall::Respond) == 1).await;

    let (status, busy) = served.chat(json!([user(QUESTION)])).await;
    assert_eq!(status, 409, "{busy}");
    assert_error(&busy, Some("thread_busy"));

    drop(first);
    // The held LLM call times out only after 30 s: a free thread well before that means the
    // dropped client cancelled the turn.
    let mut last = (0, Value::Null);
    wait_until("the cancelled turn frees its thread", async || {
        last = served.chat(json!([user(QUESTION)])).await;
        last.0 != 409
    })
    .await;
    assert_eq!(last.0, 200, "{}", last.1);
}

#[tokio::test]
async fn an_approval_recorded_by_a_cut_off_turn_is_finished_by_the_next_message() {
    let llm = ScriptedLlmServer::start(weather_script()).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &dir.path().join("data")).await.unwrap();
    // The conversation's thread, as the server derives it for an anonymous caller.
    let asked_over_http = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let agent = Arc::new(agent);
        let app = router(agent.clone(), options());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let asked: Value = client
            .post(format!("{url}/chat/completions"))
            .json(&json!({"model": MODEL, "messages": [user(PLANNING)]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(content(&asked).contains("HUMAN APPROVAL REQUIRED"), "{asked}");
        // The approval is recorded by a turn cancelled before its node ran (as when a client
        // drops right after "yes"): the thread now holds an answer nobody delivered.
        let threads = agent.graph().threads().await.unwrap();
        let thread = threads[0].thread_id.clone();
        let snapshot = agent.graph().get_state(&thread).await.unwrap().unwrap();
        let interrupt = snapshot.meta.interrupt.clone().unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        cancel.cancel();
        let options = peregrine_agent::TurnOptions { events: None, cancel };
        agent.answer_approval(&thread, &interrupt, true, None, options).await.unwrap();
        assert!(agent.graph().get_state(&thread).await.unwrap().unwrap().meta.resume.is_some(), "an undelivered answer");
        // The next message on the conversation finishes the approved plan.
        let messages = json!([user(PLANNING), assistant(&content(&asked)), user("yes"), user("so?")]);
        let finished: Value = client
            .post(format!("{url}/chat/completions"))
            .json(&json!({"model": MODEL, "messages": messages}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        finished
    };
    assert!(content(&asked_over_http).contains("Weather in Prague"), "the approved plan's answer: {asked_over_http}");
    let counts = call_counts(&llm.chat_requests());
    assert_eq!(counts.get(&LlmCall::Orchestrator), Some(&1), "the approved plan runs, no new plan: {counts:?}");
    assert_eq!(counts.get(&LlmCall::CurrentWeather), Some(&1), "{counts:?}");
}

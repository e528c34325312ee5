//! The OpenAI-compatible API over real HTTP: the weather agent on the scripted LLM server,
//! served by `router()` on 127.0.0.1, called with reqwest as Open WebUI or the `openai` clients
//! would call it.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;
use std::time::Duration;

use peregrine_agent::Agent;
use peregrine_llm::Secret;
use peregrine_server::{CHAT_ID_HEADER, ServerOptions, StatusLines, USER_ID_HEADER, router};
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
    agent: Arc<Agent>,
    _dir: tempfile::TempDir,
}

async fn serve(script: Script, options: ServerOptions) -> Served {
    let llm = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &dir.path().join("data")).await.unwrap();
    let agent = Arc::new(agent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let app = router(Arc::clone(&agent), options);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { url, llm, client: reqwest::Client::new(), agent, _dir: dir }
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

    /// The ids of the agent's threads.
    async fn threads(&self) -> Vec<String> {
        self.agent.threads().await.unwrap().into_iter().map(|thread| thread.thread_id).collect()
    }

    /// How many user messages the thread's state holds (the turns it ran).
    async fn user_messages(&self, thread_id: &str) -> usize {
        self.agent.thread(thread_id).await.unwrap().unwrap().turns()
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
    let served = serve(weather_script(), ServerOptions { status_lines: StatusLines::Content, ..options() }).await;
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
    let mark = mark_in(&text);
    let after_mark = text.strip_prefix(&format!("{mark}\n\n")).unwrap_or_else(|| panic!("the mark and a blank line first: {text:?}"));
    let (status, answer) = after_mark.split_once("\n\n").unwrap_or_else(|| panic!("status lines, a blank line, the answer: {text:?}"));
    assert!(status.starts_with("> understanding the request…\n"), "{status:?}");
    assert!(status.lines().all(|line| line.starts_with("> ") && line.ends_with('…')), "{status:?}");
    assert!(status.contains("> planning…") && status.contains("> step 1/2 current_weather…"), "{status:?}");
    assert!(answer.starts_with("Here is the current weather.") && answer.contains("Weather in Prague"), "{answer:?}");
    let respond_calls = served.llm.chat_requests().into_iter().filter(|request| LlmCall::of(request) == LlmCall::Respond).count();
    assert_eq!(respond_calls, 1, "the answer was streamed from one respond call");
}

#[tokio::test]
async fn a_stream_without_status_lines_or_usage_is_only_the_answer() {
    let served = serve(weather_script(), ServerOptions { status_lines: StatusLines::Off, ..options() }).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let events = sse_events(&served.post(&body).send().await.unwrap().text().await.unwrap());
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
    assert!(chunks.iter().all(|chunk| chunk["choices"].as_array().is_some_and(|choices| choices.len() == 1)), "no usage chunk");
    let text: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    let answer =
        text.strip_prefix(&format!("{}\n\n", mark_in(&text))).unwrap_or_else(|| panic!("a new conversation's mark comes first: {text:?}"));
    assert!(answer.starts_with("Here is the current weather.") && answer.contains("Weather in Prague"), "{text:?}");
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
async fn yes_answers_only_the_approval_its_conversation_showed() {
    let served = serve(weather_script(), options()).await;
    // One conversation (Open WebUI's session id), two windows: the first saw an answer, the
    // second then asked for a plan in planning mode.
    let session = async |messages: Value| -> Value {
        let request = served.post(&json!({"model": MODEL, "messages": messages})).header("X-Session-Id", "two-windows");
        request.send().await.unwrap().json().await.unwrap()
    };
    let answered: Value = session(json!([user(QUESTION)])).await;
    let first_answer = content(&answered);
    let asked: Value = session(json!([user(QUESTION), assistant(&first_answer), user(PLANNING)])).await;
    let prompt = content(&asked);
    assert!(prompt.contains("HUMAN APPROVAL REQUIRED"), "{prompt}");
    let weather_calls = served.calls(LlmCall::CurrentWeather);

    // The first window, which never showed the plan, says "yes": not an answer to it.
    let blind: Value = session(json!([user(QUESTION), assistant(&first_answer), user("yes")])).await;
    let note = content(&blind);
    assert!(note.contains("not shown here") && note.contains("HUMAN APPROVAL REQUIRED"), "the note shows the question: {note}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), weather_calls, "nothing ran");
    let thread = served.threads().await.into_iter().next().expect("the conversation's thread");
    let waiting = served.agent.thread(&thread).await.unwrap().unwrap();
    assert_eq!(waiting.status, peregrine_agent::ThreadStatus::Interrupted, "still waiting for its answer");

    // Once shown (in the note), "yes" answers it.
    let done: Value = session(json!([user(QUESTION), assistant(&first_answer), user("yes"), assistant(&note), user("yes")])).await;
    assert!(content(&done).contains("Weather in Prague"), "{done}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), weather_calls + 1);

    // The second window, which showed the plan, says "no" late: the plan has run meanwhile.
    // That is said, and the "no" is not a new turn.
    let turns = served.calls(LlmCall::TaskExtraction);
    let late: Value = session(json!([user(QUESTION), assistant(&first_answer), user(PLANNING), assistant(&prompt), user("no")])).await;
    assert!(content(&late).contains("no longer pending"), "{late}");
    assert_eq!(served.calls(LlmCall::TaskExtraction), turns, "no new turn");
    assert_eq!(served.agent.thread(&thread).await.unwrap().unwrap().status, peregrine_agent::ThreadStatus::Idle);
}

#[tokio::test]
async fn no_withdraws_the_approval_and_the_conversation_goes_on() {
    let served = serve(weather_script(), options()).await;
    let (_, asked) = served.chat(json!([user(PLANNING)])).await;
    let prompt = content(&asked);
    let (status, withdrawn) = served.chat(json!([user(PLANNING), assistant(&prompt), user("no")])).await;
    assert_eq!(status, 200, "{withdrawn}");
    let said = content(&withdrawn);
    assert!(said.contains("Cancelled: the execution plan was not run"), "{said}");
    assert!(said.starts_with(&format!("{}\n\n", mark_in(&prompt))), "the conversation's mark opens it: {said:?}");
    assert_eq!((served.calls(LlmCall::Orchestrator), served.calls(LlmCall::CurrentWeather)), (1, 0), "no new plan, nothing ran");
    let thread = served.threads().await.into_iter().next().expect("the conversation's thread");
    assert_eq!(served.agent.thread(&thread).await.unwrap().unwrap().status, peregrine_agent::ThreadStatus::Idle);
    let (status, next) = served.chat(json!([user(PLANNING), assistant(&prompt), user("no"), assistant(&said), user(QUESTION)])).await;
    assert_eq!(status, 200, "{next}");
    assert!(content(&next).contains("Weather in Prague"), "a new turn: {next}");
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

    // The approved turn's progress is reasoning too: the answer's text is the mark and the answer.
    let body = json!({"model": MODEL, "messages": [user(PLANNING), assistant(&text), user("yes")], "stream": true});
    let (answer, _) = content_and_reasoning(&served.post(&body).send().await.unwrap().text().await.unwrap());
    let mark = mark_in(&text);
    let rest = answer.strip_prefix(&format!("{mark}\n\n")).unwrap_or_else(|| panic!("{answer:?}"));
    assert!(rest.contains("Weather in Prague") && !rest.contains('…'), "{answer:?}");
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

    for messages in [json!([]), json!([user(QUESTION), {"role": "tool", "content": "It is sunny.", "tool_call_id": "c"}])] {
        let (status, body) = served.chat(messages).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    let huge = "x".repeat(8192);
    let too_large = served.post(&json!({"model": MODEL, "messages": [user(&huge)]})).send().await.unwrap();
    assert_eq!(too_large.status().as_u16(), 413);
    assert_error(&too_large.json().await.unwrap(), Some("request_too_large"));

    let request = served.client.post(format!("{}/chat/completions", served.url));
    let not_json = request.header("content-type", "application/json").body("{not json").send().await.unwrap();
    assert_eq!(not_json.status().as_u16(), 400);
    assert_error(&not_json.json().await.unwrap(), Some("invalid_json"));
    // A server without keys takes only bodies declared as JSON (a web page cannot send those
    // to another origin without asking first).
    let undeclared = served.client.post(format!("{}/chat/completions", served.url)).body("{not json").send().await.unwrap();
    assert_eq!(undeclared.status().as_u16(), 415);
    assert_error(&undeclared.json().await.unwrap(), Some("unsupported_media_type"));
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
    // A conversation past its first exchange: every request with this history is on one thread.
    let history = json!([user(QUESTION), assistant("Which city?"), user(QUESTION)]);
    let body = json!({"model": MODEL, "messages": history, "stream": true});
    let first = served.post(&body).send().await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    wait_until("respond's LLM call is held", async || served.calls(LlmCall::Respond) == 1).await;

    let busy = served.post(&json!({"model": MODEL, "messages": history})).send().await.unwrap();
    assert_eq!(busy.status().as_u16(), 409);
    assert_eq!(busy.headers()["x-should-retry"], "false", "the official clients must not send the turn again on their own");
    assert_error(&busy.json().await.unwrap(), Some("thread_busy"));

    drop(first);
    // The held LLM call times out only after 30 s: a free thread well before that means the
    // dropped client cancelled the turn.
    let mut last = (0, Value::Null);
    wait_until("the cancelled turn frees its thread", async || {
        last = served.chat(history.clone()).await;
        last.0 != 409
    })
    .await;
    assert_eq!(last.0, 200, "{}", last.1);
}

#[tokio::test]
async fn an_approval_recorded_by_a_cut_off_turn_refuses_the_next_message_and_continue_response_finishes_it() {
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
        let options = peregrine_graph::RunOptions { cancel, ..Default::default() };
        agent.graph().resume(&thread, peregrine_graph::Resume::to(&interrupt, json!({"approved": true})), options).await.unwrap();
        assert!(agent.graph().get_state(&thread).await.unwrap().unwrap().meta.resume.is_some(), "an undelivered answer");
        // The next message is refused, not answered with that turn's result as if taken.
        let messages = json!([user(PLANNING), assistant(&content(&asked)), user("yes"), user("so?")]);
        let refused =
            client.post(format!("{url}/chat/completions")).json(&json!({"model": MODEL, "messages": messages})).send().await.unwrap();
        assert_eq!(refused.status().as_u16(), 409);
        let refused: Value = refused.json().await.unwrap();
        assert_eq!(refused["error"]["code"], "unfinished_run", "{refused}");
        let stored = agent.graph().get_state(&thread).await.unwrap().unwrap();
        assert!(!stored.state.messages.iter().any(|message| message.content == "so?"), "the refused message is not stored");
        // Continue Response (the history ends with the cut-off answer) finishes the approved plan.
        let messages = json!([user(PLANNING), assistant(&content(&asked)), user("yes"), assistant("")]);
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

/// The content of a streamed answer read so far, from the complete `data:` events in `text`.
fn streamed_content(text: &str) -> String {
    text.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

/// Whether `c` is one of the characters of a new conversation's invisible mark.
fn is_mark(c: char) -> bool {
    matches!(c, '\u{2060}' | '\u{200B}' | '\u{200C}')
}

/// The mark in `text`: U+2060 and the 64 bits that follow it.
fn mark_in(text: &str) -> String {
    let at = text.find('\u{2060}').unwrap_or_else(|| panic!("no mark in {text:?}"));
    let mark: String = text[at..].chars().take(65).collect();
    assert!(mark.chars().skip(1).all(|c| matches!(c, '\u{200B}' | '\u{200C}')) && mark.chars().count() == 65, "{mark:?}");
    mark
}

#[tokio::test]
async fn two_chats_that_start_alike_are_two_conversations() {
    let served = serve(weather_script(), options()).await;
    let (_, asked_a) = served.chat(json!([user(PLANNING)])).await;
    let (_, asked_b) = served.chat(json!([user(PLANNING)])).await;
    let (prompt_a, prompt_b) = (content(&asked_a), content(&asked_b));
    assert!(prompt_a.contains("HUMAN APPROVAL REQUIRED") && prompt_b.contains("HUMAN APPROVAL REQUIRED"), "{prompt_a:?}");
    // Each answer begins with its conversation's mark, and the two marks differ.
    assert!(prompt_a.starts_with(&mark_in(&prompt_a)) && prompt_b.starts_with(&mark_in(&prompt_b)), "{prompt_a:?}");
    assert_ne!(mark_in(&prompt_a), mark_in(&prompt_b));
    let threads = served.threads().await;
    assert_eq!(threads.len(), 2, "each chat has its thread: {threads:?}");
    // A prompt that names its plan file (the terminal's do) names that of its conversation's
    // thread, and the file is there.
    for prompt in [&prompt_a, &prompt_b] {
        for path in prompt.split('`').filter(|part| part.ends_with("pending_execution_plan.json")) {
            let thread = path.split('/').rev().nth(1).unwrap();
            assert!(threads.iter().any(|id| id == thread), "{thread} in {threads:?}");
            assert!(std::path::Path::new(path).is_file(), "{path}");
        }
    }

    // On A's thread this would answer A's approval; B's own thread plans anew.
    let (status, rejected) = served.chat(json!([user(PLANNING), assistant(&prompt_b), user("no")])).await;
    assert_eq!(status, 200, "{rejected}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0);
    let (status, done) = served.chat(json!([user(PLANNING), assistant(&prompt_a), user("yes")])).await;
    assert_eq!(status, 200, "{done}");
    assert!(content(&done).contains("Weather in Prague"), "{done}");
    assert!(content(&done).starts_with(&format!("{}\n\n", mark_in(&prompt_a))), "every answer carries its conversation's mark: {done}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1, "only A's approved plan ran");
    assert_eq!(served.threads().await.len(), 2);
}

#[tokio::test]
async fn a_streamed_first_turn_is_continued_by_the_history_the_client_resends() {
    // Status lines in the content, which the client resends with the history.
    let served = serve(weather_script(), ServerOptions { status_lines: StatusLines::Content, ..options() }).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let streamed = streamed_content(&served.post(&body).send().await.unwrap().text().await.unwrap());
    let mark = mark_in(&streamed);
    assert!(
        streamed.starts_with(&format!("{mark}\n\n> ")) && streamed.contains("Weather in Prague"),
        "status lines and the answer: {streamed:?}"
    );
    let first = served.threads().await;
    assert_eq!(first.len(), 1, "{first:?}");

    let body = json!({"model": MODEL, "user": null, "messages": [user(QUESTION), assistant(&streamed), user("And now?")], "stream": true});
    let second = streamed_content(&served.post(&body).send().await.unwrap().text().await.unwrap());
    assert!(second.contains("Weather in Prague"), "{second:?}");
    assert_eq!(served.threads().await, first, "the second turn ran on the first turn's thread");
    assert_eq!(served.user_messages(&first[0]).await, 2);
    assert!(second.starts_with(&format!("{mark}\n\n")), "the second answer carries the mark too: {second:?}");

    // A client that sends only the last messages (here without the first answer) still finds it.
    let body = json!({"model": MODEL, "messages": [user("And now?"), assistant(&second), user("And tomorrow?")], "stream": true});
    let third = streamed_content(&served.post(&body).send().await.unwrap().text().await.unwrap());
    assert!(third.starts_with(&format!("{mark}\n\n")), "{third:?}");
    assert_eq!(served.threads().await, first, "the truncated history found the conversation's thread");
    assert_eq!(served.user_messages(&first[0]).await, 3);
}

#[tokio::test]
async fn the_mark_and_a_blank_line_are_the_first_content_chunk() {
    for status_lines in [StatusLines::Content, StatusLines::Reasoning, StatusLines::Off] {
        let served = serve(weather_script(), ServerOptions { status_lines, ..options() }).await;
        let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
        let events = sse_events(&served.post(&body).send().await.unwrap().text().await.unwrap());
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant"}));
        let first_content = chunks[1]["choices"][0]["delta"]["content"].as_str().unwrap_or_else(|| panic!("{chunks:?}"));
        assert_eq!(first_content, format!("{}\n\n", mark_in(first_content)), "right after the role chunk: {chunks:?}");
        let text: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text.matches('\u{2060}').count(), 1, "one mark: {text:?}");
        let rest = &text[first_content.len()..];
        let expected = if status_lines == StatusLines::Content { "> understanding the request…" } else { "Here is the current weather." };
        assert!(rest.starts_with(expected), "{text:?}");
    }
}

#[tokio::test]
async fn an_answer_that_begins_with_a_list_stays_a_list() {
    const LIST: &str = "1. Prague: 12 °C\n2. Brno: 14 °C";
    let served = serve(with_weather_replies(Script::new().on_plain(Reply::text(LIST))), options()).await;
    let (status, body) = served.chat(json!([user(QUESTION)])).await;
    assert_eq!(status, 200, "{body}");
    let answer = content(&body);
    let mark = mark_in(&answer);
    assert!(answer.starts_with(&format!("{mark}\n\n{LIST}")), "an invisible paragraph, then the list on a line of its own: {answer:?}");
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let quiet = serve(
        with_weather_replies(Script::new().on_plain(Reply::text(LIST))),
        ServerOptions { status_lines: StatusLines::Off, ..options() },
    )
    .await;
    let streamed = streamed_content(&quiet.post(&body).send().await.unwrap().text().await.unwrap());
    assert!(streamed.starts_with(&format!("{}\n\n{LIST}", mark_in(&streamed))), "{streamed:?}");
}

#[tokio::test]
async fn a_first_answer_stopped_early_continues_on_its_thread() {
    let held_answer = Reply::sequence(vec![Reply::fault(Fault::Timeout), answer_reply()]);
    let content_lines = ServerOptions { status_lines: StatusLines::Content, ..options() };
    let served = serve(with_weather_replies(Script::new().on_plain(held_answer)), content_lines).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let mut response = served.post(&body).send().await.unwrap();
    // Read until the status line of respond's held call: nothing more comes after it.
    // Bytes, not text: a chunk may end inside a character.
    let mut received = Vec::new();
    while !streamed_content(&String::from_utf8_lossy(&received)).contains("respond…\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), response.chunk()).await.expect("more of the stream").unwrap();
        received.extend_from_slice(&chunk.expect("the stream goes on"));
    }
    let streamed = streamed_content(&String::from_utf8_lossy(&received));
    let threads = served.threads().await;
    assert_eq!(threads.len(), 1, "{threads:?}");
    drop(response);

    // The client kept less than was sent (it stopped reading after the first line): the mark
    // came first, so the conversation goes on where the turn was cut off.
    let kept = streamed.split_inclusive('\n').next().unwrap();
    assert!(kept.contains('\u{2060}'), "{kept:?}");
    let history = json!([user(QUESTION), assistant(kept), user(QUESTION)]);
    let mut answered = (0, Value::Null);
    wait_until("the cancelled first turn frees its thread", async || {
        answered = served.chat(history.clone()).await;
        answered.0 != 409
    })
    .await;
    assert_eq!(answered.0, 200, "{}", answered.1);
    assert!(content(&answered.1).contains("Weather in Prague"), "{}", answered.1);
    assert_eq!(served.threads().await, threads, "the same thread");
    assert_eq!(served.user_messages(&threads[0]).await, 2);
}

#[tokio::test]
async fn an_answer_without_its_mark_continues_from_the_second_turn() {
    let served = serve(weather_script(), options()).await;
    let (_, first) = served.chat(json!([user(QUESTION)])).await;
    // A client that drops invisible characters resends the answer without its mark.
    let stripped = content(&first).replace(is_mark, "");
    let first_threads = served.threads().await;
    let (status, second) = served.chat(json!([user(QUESTION), assistant(&stripped), user("And in Prague?")])).await;
    assert_eq!(status, 200, "{second}");
    assert!(!content(&second).contains(is_mark));
    let threads = served.threads().await;
    assert_eq!(threads.len(), 2, "the first turn's thread is not found: {threads:?}");
    let fallback = threads.iter().find(|id| !first_threads.contains(id)).unwrap().clone();
    let history = json!([
        user(QUESTION),
        assistant(&format!("  {stripped}\n")),
        user("And in Prague?"),
        assistant(&content(&second)),
        user("Thanks. And now?")
    ]);
    let (status, third) = served.chat(history).await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(served.threads().await.len(), 2, "the third turn found the second's thread");
    assert_eq!(served.user_messages(&fallback).await, 2, "the second and the third turn");
}

#[tokio::test]
async fn an_answer_cut_off_and_retried_is_shown_once_after_a_note() {
    let cut = Reply::text("The weather in Prague is currently rather").with_fault(Fault::TruncatedStream { after_chunks: 3 });
    let served = serve(with_weather_replies(Script::new().on_plain(Reply::sequence(vec![cut, answer_reply()]))), options()).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let streamed = streamed_content(&served.post(&body).send().await.unwrap().text().await.unwrap());
    assert_eq!(served.calls(LlmCall::Respond), 2, "the cut answer was asked for again");
    let (before, after) = streamed.split_once("\n\n_(the answer was cut off)_\n\n").unwrap_or_else(|| panic!("the note: {streamed:?}"));
    assert!(before.ends_with("The weather ") || before.ends_with("The "), "what was sent before the cut stays: {before:?}");
    assert!(after.starts_with("Here is the current weather.") && after.contains("Weather in Prague"), "{after:?}");
    assert_eq!(streamed.matches("Here is the current weather.").count(), 1, "the answer once: {streamed:?}");
    assert!(!streamed.contains("rather"), "{streamed:?}");
}

#[tokio::test]
async fn open_webui_background_tasks_are_one_llm_call_on_no_thread() {
    const TITLE: &str = "{\"title\": \"🌦️ Prague Weather\"}";
    let script = Script::new()
        .on_prompt_containing("### Task:", Reply::text(TITLE).with_usage(120, 9))
        .on_prompt_containing("Summarize the chat", Reply::text("A summary.").with_usage(30, 3));
    let served = serve(with_weather_replies(script), options()).await;
    let prompt = "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n\
                  ### Output:\nJSON format: { \"title\": \"your concise title here\" }\n\
                  ### Chat History:\n<chat_history>\nUSER: What's the weather in Prague?\nASSISTANT: 12 °C, partly cloudy.\n</chat_history>";
    let title = json!({"model": MODEL, "messages": [user(prompt)], "stream": false});
    let response = served.post(&title).header(CHAT_ID_HEADER, "chat-1").header(USER_ID_HEADER, "u1").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(content(&body), TITLE, "{body}");
    assert_eq!((body["object"].as_str(), body["choices"][0]["finish_reason"].as_str()), (Some("chat.completion"), Some("stop")));
    assert_eq!(body["usage"], json!({"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}));

    let messages = json!([{"role": "system", "content": "Be brief."}, user("Summarize the chat so far.")]);
    let follow_up = json!({
        "model": MODEL, "messages": messages, "stream": true, "stream_options": {"include_usage": true},
        "metadata": {"task": "follow_up_generation", "chat_id": "chat-1"},
    });
    let events = sse_events(&served.post(&follow_up).send().await.unwrap().text().await.unwrap());
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|event| serde_json::from_str(event).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant"}));
    let text: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "A summary.");
    assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 33);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "stop");

    // A model with a system prompt set in Open WebUI gets it in its task requests too.
    let tags = json!({"model": MODEL, "messages": [{"role": "system", "content": "You are Peregrine."}, user(prompt)]});
    let response = served.post(&tags).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(content(&response.json().await.unwrap()), TITLE);

    let requests = served.llm.chat_requests();
    assert_eq!(requests.len(), 3, "one LLM call each, no agent turn: {requests:?}");
    let only = |text: &str| vec![("user".to_owned(), text.to_owned())];
    assert_eq!(requests[0].messages(), only(prompt), "the prompt as it is");
    assert_eq!(requests[1].messages(), only("Summarize the chat so far."), "the prompt alone, no caller's system message");
    assert_eq!(requests[2].messages(), only(prompt));
    assert!(served.threads().await.is_empty(), "no thread was read or written");
}

/// Open WebUI's emoji prompt (voice mode) and mixture-of-agents prompt carry no `### Task:` and
/// no metadata once they reach a connection: they are recognised by their templates' text.
#[tokio::test]
async fn open_webui_emoji_and_moa_prompts_are_one_llm_call_on_no_thread() {
    let script = Script::new()
        .on_prompt_containing("fitting emoji", Reply::text("🎉").with_usage(60, 1))
        .on_prompt_containing("Responses from models:", Reply::text("12 °C and partly cloudy.").with_usage(200, 8));
    let served = serve(with_weather_replies(script), options()).await;
    let emoji = "Your task is to reflect the speaker's likely facial expression through a fitting emoji. Interpret emotions from \
                 the message and reflect their facial expression using fitting, diverse emojis (e.g., 😊, 😢, 😡, 😱).\n\n\
                 Message: ```We won the match!```";
    let moa = format!(
        "You have been provided with a set of responses from various models to the latest user query: \"{QUESTION}\"\n\nYour \
         task is to synthesize these responses into a single, high-quality response. It is crucial to critically evaluate the \
         information provided in these responses, recognizing that some of it may be biased or incorrect. Your response should \
         not simply replicate the given answers but should offer a refined, accurate, and comprehensive reply to the \
         instruction. Ensure your response is well-structured, coherent, and adheres to the highest standards of accuracy and \
         reliability.\n\nResponses from models: \"\"\"It is 12 °C.\"\"\"\n\n\"\"\"Partly cloudy.\"\"\""
    );
    for (prompt, answer) in [(emoji, "🎉"), (moa.as_str(), "12 °C and partly cloudy.")] {
        let body = json!({"model": MODEL, "messages": [user(prompt)]});
        let response = served.post(&body).header(CHAT_ID_HEADER, "chat-1").header(USER_ID_HEADER, "u1").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(content(&response.json().await.unwrap()), answer);
    }
    let requests = served.llm.chat_requests();
    assert_eq!(requests.len(), 2, "one LLM call each, no agent turn: {requests:?}");
    assert_eq!(requests[0].messages(), vec![("user".to_owned(), emoji.to_owned())]);
    assert_eq!(requests[1].messages(), vec![("user".to_owned(), moa)]);
    assert!(served.threads().await.is_empty(), "no thread was read or written");
}

#[tokio::test]
async fn a_question_with_retrieved_context_is_a_turn_and_a_task_prompt_with_a_history_too() {
    let served = serve(weather_script(), options()).await;
    // Open WebUI's RAG template before the user's question (a file, knowledge or a web search).
    let rag = format!(
        "### Task:\nRespond to the user query using the provided context, incorporating inline citations in the format [id] \
         **only when the <source> tag includes an explicit id attribute** (e.g., <source id=\"1\">).\n\n### Guidelines:\n- If you \
         don't know the answer, clearly state that.\n\n<context>\n<source id=\"1\">Prague lies on the Vltava.</source>\n</context>\n\
         {QUESTION}"
    );
    let (status, answered) = served.chat(json!([user(&rag)])).await;
    assert_eq!(status, 200, "{answered}");
    assert!(content(&answered).contains("Weather in Prague"), "the agent answered: {answered}");
    assert_eq!(served.calls(LlmCall::TaskExtraction), 1);
    let threads = served.threads().await;
    assert_eq!(threads.len(), 1, "{threads:?}");

    // Its follow-up, RAG-wrapped again, continues the conversation.
    let (status, again) = served.chat(json!([user(QUESTION), assistant(&content(&answered)), user(&rag)])).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(served.threads().await, threads);
    assert_eq!(served.user_messages(&threads[0]).await, 2);

    // A message that begins with `### Task:` but holds no chat history is a turn too.
    let (status, own) = served.chat(json!([user("### Task:\nWhat's the weather in Prague?")])).await;
    assert_eq!(status, 200, "{own}");
    assert!(content(&own).contains("Weather in Prague"), "the agent answered: {own}");
    assert_eq!(served.threads().await.len(), 2, "a conversation of its own");

    // `### Task:` in a conversation's later message is that conversation's turn.
    let history = json!([user(QUESTION), assistant(&content(&answered)), user("### Task:\nWhat's the weather in Prague?")]);
    let (status, turn) = served.chat(history).await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(served.calls(LlmCall::TaskExtraction), 4, "four turns");
    assert_eq!(served.user_messages(&threads[0]).await, 3);
}

#[tokio::test]
async fn a_background_tasks_answer_is_cut_at_its_limit() {
    let endless: Vec<String> = (0..1500).map(|piece| format!("w{piece} ")).collect();
    let script = Script::new().on_prompt_containing("### Task:", Reply::text(endless.concat()).with_chunks(endless.clone()));
    let served = serve(with_weather_replies(script), options()).await;
    let prompt = "### Task:\nGenerate 1-3 broad tags categorizing the main themes.\n<chat_history>\nUSER: hi\n</chat_history>";
    let (status, body) = served.chat(json!([user(prompt)])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let text = content(&body);
    assert!(text.starts_with("w0 w1 ") && text.ends_with("w1023 "), "the first 1,024 pieces: {}", &text[text.len().saturating_sub(40)..]);
    assert!(body["usage"]["completion_tokens"].as_u64().is_some_and(|tokens| tokens >= 1024), "{}", body["usage"]);
}

#[tokio::test]
async fn error_texts_are_redacted() {
    const SECRET: &str = "pg-pa55word-7f3a";
    let fault = Fault::Http {
        status: 503,
        error_type: "server_error".into(),
        code: None,
        message: format!("the upstream store at postgres://peregrine:{SECRET}@db:5432 is down"),
    };
    let redact: peregrine_server::Redact = Arc::new(|text: &str| text.replace(SECRET, "[REDACTED]"));
    let served = serve(Script::new().otherwise(Reply::fault(fault)), ServerOptions { redact, ..options() }).await;

    let task = json!({"model": MODEL, "messages": [user("### Task:\nGenerate a title.\n<chat_history>\nUSER: hi\n</chat_history>")]});
    let response = served.post(&task).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 500);
    assert!(response.headers().get("x-should-retry").is_none(), "a failed task changed nothing: retrying is fine");
    let text = response.text().await.unwrap();
    assert!(text.contains("[REDACTED]") && !text.contains(SECRET), "{text}");
    assert_error(&serde_json::from_str(&text).unwrap(), None);

    // A turn whose every LLM call fails ends with the error node's report, redacted too.
    let (status, failed) = served.chat(json!([user(QUESTION)])).await;
    assert_eq!(status, 200, "{failed}");
    let report = content(&failed);
    assert!(report.contains("ERROR REPORT") && report.contains("[REDACTED]") && !report.contains(SECRET), "{report}");
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let streamed = served.post(&body).send().await.unwrap().text().await.unwrap();
    assert!(streamed_content(&streamed).contains("[REDACTED]") && !streamed.contains(SECRET), "{streamed}");
    assert!(served.llm.chat_requests().len() > 1, "the turns called the model");
}

#[tokio::test]
async fn lenient_fields_are_ignored_and_unanswerable_options_refused() {
    let served = serve(weather_script(), options()).await;
    for user_field in [json!({"id": "u1", "name": "Ada"}), json!(42)] {
        let body = json!({"model": MODEL, "user": user_field, "messages": [user(QUESTION)]});
        let response = served.post(&body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "user {user_field} is ignored");
    }
    // System and developer messages after the user's (Open WebUI adds context that way): the user's message is the input.
    let trailing = json!([user(QUESTION), {"role": "system", "content": "Context: none."}, {"role": "developer", "content": "Be brief."}]);
    let (status, body) = served.chat(trailing).await;
    assert_eq!(status, 200, "{body}");
    assert!(content(&body).contains("Weather in Prague"), "{body}");
    let before = served.llm.chat_requests().len();

    let refused = [
        (json!({"n": 2}), "n"),
        (json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}), "tool_choice"),
        (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}), "response_format"),
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
    ];
    for (fields, param) in refused {
        let mut body = json!({"model": MODEL, "messages": [user(QUESTION)]});
        body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let response = served.post(&body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 400, "{fields}");
        let error: Value = response.json().await.unwrap();
        assert_error(&error, Some("unsupported_value"));
        assert_eq!(error["error"]["param"], param, "{error}");
    }
    assert_eq!(served.llm.chat_requests().len(), before, "no refused request ran a turn");
}

#[tokio::test]
async fn a_model_is_retrieved_by_id_and_wrong_methods_get_405() {
    let served = serve(weather_script(), ServerOptions { api_keys: vec![Secret::new("sk-m")], ..options() }).await;
    let get = |path: &str| served.client.get(format!("{}{path}", served.url)).bearer_auth("sk-m");
    let model: Value = get(&format!("/models/{MODEL}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (model["id"].as_str(), model["object"].as_str(), model["owned_by"].as_str()),
        (Some(MODEL), Some("model"), Some("peregrine"))
    );
    let listed: Value = get("/models").send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["data"][0], model);

    let unknown = get("/models/gpt-4o").send().await.unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
    let unknown: Value = unknown.json().await.unwrap();
    assert_error(&unknown, Some("model_not_found"));
    assert_eq!(unknown["error"]["param"], "model");
    let no_key = served.client.get(format!("{}/models/{MODEL}", served.url)).send().await.unwrap();
    assert_eq!(no_key.status().as_u16(), 401);

    for (method, path) in
        [(reqwest::Method::GET, "/chat/completions"), (reqwest::Method::DELETE, "/models"), (reqwest::Method::POST, "/models")]
    {
        let response = served.client.request(method.clone(), format!("{}{path}", served.url)).bearer_auth("sk-m").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 405, "{method} {path}");
        let error: Value = response.json().await.unwrap();
        assert_error(&error, Some("method_not_allowed"));
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert!(error["error"]["message"].as_str().unwrap().contains(path), "{error}");
    }
    assert_eq!(served.llm.chat_requests().len(), 0);
}

/// A stream's content and its reasoning, each joined from the `data:` events in `text`; and
/// whether every content delta came before the first reasoning delta (`None` without reasoning).
fn content_and_reasoning(text: &str) -> (String, String) {
    let deltas: Vec<Value> = text
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .map(|chunk| chunk["choices"][0]["delta"].clone())
        .collect();
    let joined = |field: &str| deltas.iter().filter_map(|delta| delta[field].as_str()).collect::<String>();
    (joined("content"), joined("reasoning_content"))
}

#[tokio::test]
async fn progress_is_streamed_as_reasoning_and_the_answers_text_is_the_mark_and_the_answer() {
    let served = serve(weather_script(), options()).await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true});
    let streamed = served.post(&body).send().await.unwrap().text().await.unwrap();
    let (content, reasoning) = content_and_reasoning(&streamed);
    let mark = mark_in(&content);
    let answer = content.strip_prefix(&format!("{mark}\n\n")).unwrap_or_else(|| panic!("the mark and a blank line first: {content:?}"));
    assert!(answer.starts_with("Here is the current weather.") && answer.contains("Weather in Prague"), "only the answer: {content:?}");
    assert!(!content.contains('…'), "no progress in the answer's text: {content:?}");
    assert!(reasoning.starts_with("understanding the request…\n"), "{reasoning:?}");
    assert!(reasoning.contains("planning…\n") && reasoning.contains("step 1/2 current_weather…\n"), "{reasoning:?}");
    assert!(reasoning.lines().all(|line| line.ends_with('…')), "a line per step: {reasoning:?}");
    // The mark comes before any progress, so an answer stopped at any moment holds it.
    let first_reasoning = streamed.find("reasoning_content").unwrap();
    assert!(streamed.find('\u{2060}').is_some_and(|at| at < first_reasoning), "{streamed:?}");
    for chunk in sse_events(&streamed).iter().filter(|event| *event != "[DONE]") {
        let delta = &serde_json::from_str::<Value>(chunk).unwrap()["choices"][0]["delta"];
        assert!(delta.get("content").is_none() || delta.get("reasoning_content").is_none(), "one kind per chunk: {delta}");
    }

    // Open WebUI resends the answer's text without the reasoning: the conversation goes on.
    let threads = served.threads().await;
    let body = json!({"model": MODEL, "messages": [user(QUESTION), assistant(&content), user("And now?")], "stream": true});
    let (second, second_reasoning) = content_and_reasoning(&served.post(&body).send().await.unwrap().text().await.unwrap());
    assert_eq!(served.threads().await, threads, "the first turn's thread");
    assert_eq!(served.user_messages(&threads[0]).await, 2);
    assert!(second.starts_with(&format!("{mark}\n\n")) && !second.contains('…'), "{second:?}");
    assert!(!second_reasoning.is_empty());
}

/// Streams `body` and reads until the respond step's LLM call is held (its progress came and the
/// scripted server has the call), then drops the stream, as Open WebUI's Stop button does.
/// Returns the content received.
async fn stop_while_respond_is_held(served: &Served, body: &Value) -> String {
    let mut response = served.post(body).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    // Bytes, not text: a chunk may end inside a character.
    let mut received = Vec::new();
    while !content_and_reasoning(&String::from_utf8_lossy(&received)).1.contains("respond…\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), response.chunk()).await.expect("more of the stream").unwrap();
        received.extend_from_slice(&chunk.expect("the stream goes on"));
    }
    wait_until("respond's LLM call is held", async || served.calls(LlmCall::Respond) == 1).await;
    drop(response);
    content_and_reasoning(&String::from_utf8_lossy(&received)).0
}

/// Sends `body` until its thread is no longer busy (a stopped turn frees it a moment later).
async fn post_when_free(served: &Served, body: &Value) -> (u16, String) {
    let mut answered = (0, String::new());
    wait_until("the stopped turn frees its thread", async || {
        let response = served.post(body).send().await.unwrap();
        answered = (response.status().as_u16(), response.text().await.unwrap());
        !answered.1.contains("thread_busy")
    })
    .await;
    answered
}

#[tokio::test]
async fn continue_response_finishes_the_turn_the_client_stopped() {
    let held_answer = Reply::sequence(vec![Reply::fault(Fault::Timeout), answer_reply()]);
    let served = serve(with_weather_replies(Script::new().on_plain(held_answer)), options()).await;
    let kept = stop_while_respond_is_held(&served, &json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true})).await;
    let mark = mark_in(&kept);
    assert_eq!(kept, format!("{mark}\n\n"), "stopped before the answer: its text is the mark alone");
    let threads = served.threads().await;
    assert_eq!(threads.len(), 1, "{threads:?}");

    // "Continue Response": the history up to the stopped answer, as Open WebUI sends it.
    let body =
        json!({"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, user(QUESTION), assistant(&kept)], "stream": true});
    let (status, streamed) = post_when_free(&served, &body).await;
    assert_eq!(status, 200, "{streamed}");
    let (content, _) = content_and_reasoning(&streamed);
    assert!(content.starts_with("Here is the current weather.") && content.contains("Weather in Prague"), "{content:?}");
    assert!(!content.contains('\u{2060}'), "the continued answer already holds the mark: {content:?}");
    assert_eq!(served.threads().await, threads, "on the conversation's thread");
    assert_eq!(served.user_messages(&threads[0]).await, 1, "the stopped turn was finished, no new one started");
    assert_eq!(served.calls(LlmCall::Respond), 2, "the cut-off respond step ran again");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1, "the finished steps did not: no new plan");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1, "{:?}", call_counts(&served.llm.chat_requests()));

    // Finished: continuing again is refused, saying why.
    let answered = format!("{kept}{content}");
    let again = served.post(&json!({"model": MODEL, "messages": [user(QUESTION), assistant(&answered)]})).send().await.unwrap();
    assert_eq!(again.status().as_u16(), 409);
    assert_eq!(again.headers().get("x-should-retry").map(|value| value.to_str().unwrap()), Some("false"));
    let body: Value = again.json().await.unwrap();
    assert_error(&body, Some("nothing_to_continue"));
    assert!(body["error"]["message"].as_str().unwrap().contains("continue"), "{body}");
    assert_eq!(served.calls(LlmCall::Respond), 2);
}

#[tokio::test]
async fn continue_response_of_a_non_stream_answer_with_text_opens_with_the_cut_note() {
    let held_answer = Reply::sequence(vec![Reply::fault(Fault::Timeout), answer_reply()]);
    let served = serve(with_weather_replies(Script::new().on_plain(held_answer)), options()).await;
    let kept = stop_while_respond_is_held(&served, &json!({"model": MODEL, "messages": [user(QUESTION)], "stream": true})).await;
    // An answer cut off after some of its text (the scripted call sends none before it is held).
    let cut = format!("{kept}The weather in Pra");
    let (status, body) = post_when_free(&served, &json!({"model": MODEL, "messages": [user(QUESTION), assistant(&cut)]})).await;
    assert_eq!(status, 200, "{body}");
    let answer = content(&serde_json::from_str(&body).unwrap());
    let rest = answer.strip_prefix("\n\n_(the answer was cut off)_\n\n").unwrap_or_else(|| panic!("the note first: {answer:?}"));
    assert!(rest.starts_with("Here is the current weather.") && rest.contains("Weather in Prague"), "{answer:?}");
}

#[tokio::test]
async fn continue_response_without_a_cut_off_turn_says_there_is_nothing_to_continue() {
    let served = serve(weather_script(), options()).await;
    // A conversation this server has no thread for.
    let (status, body) = served.chat(json!([user("hello"), assistant("Hi! How can I help?")])).await;
    assert_eq!(status, 409, "{body}");
    assert_error(&body, Some("nothing_to_continue"));
    // A finished turn, and an approval prompt that waits for its answer.
    let (_, answered) = served.chat(json!([user(QUESTION)])).await;
    let (status, body) = served.chat(json!([user(QUESTION), assistant(&content(&answered))])).await;
    assert_eq!(status, 409, "{body}");
    assert_error(&body, Some("nothing_to_continue"));
    let (_, asked) = served.chat(json!([user(PLANNING)])).await;
    let (status, body) = served.chat(json!([user(PLANNING), assistant(&content(&asked))])).await;
    assert_eq!(status, 409, "{body}");
    assert_error(&body, Some("nothing_to_continue"));
    assert!(body["error"]["message"].as_str().unwrap().contains("approval"), "{body}");
    // A trailing tool message is still a bad request.
    let (status, body) = served.chat(json!([user(QUESTION), {"role": "tool", "content": "42", "tool_call_id": "c"}])).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(served.threads().await.len(), 2, "no thread was created for the refused requests");
}

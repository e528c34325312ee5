//! The OpenAI-compatible API through the official `openai` Python client: the weather agent on
//! the scripted LLM server, served by `router()` on 127.0.0.1 with an API key, and
//! `tests/python/client_checks.py` run against it once per check. Without `python3` and the
//! pinned client (`scripts/install-python-deps.sh`) the tests skip, except under CI, where
//! they fail.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use peregrine_agent::Agent;
use peregrine_core::state::Role;
use peregrine_llm::Secret;
use peregrine_server::{ServerOptions, router};
use peregrine_testkit::agent_fixture::{LlmCall, answer_reply, call_counts, weather_agent, weather_script, with_weather_replies};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use serde_json::{Value, json};

const MODEL: &str = "peregrine-weather";
const API_KEY: &str = "sk-python-client-test";
/// The `openai` version scripts/install-python-deps.sh installs.
const OPENAI_VERSION: &str = "3.51.0";
/// Bounds one run of the script; each of its requests has its own 60 s client timeout.
const SCRIPT_LIMIT: Duration = Duration::from_secs(180);
/// The `X-Session-Id` of the conversation the `busy` check finds running (client_checks.py's BUSY_SESSION).
const BUSY_SESSION: &str = "python-client-busy";

struct Served {
    url: String,
    llm: ScriptedLlmServer,
    agent: Arc<Agent>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn calls(&self, call: LlmCall) -> usize {
        call_counts(&self.llm.chat_requests()).get(&call).copied().unwrap_or(0)
    }

    /// The agent's threads with the number of user messages each holds.
    async fn threads(&self) -> Vec<(String, usize)> {
        let mut threads = Vec::new();
        for thread in self.agent.graph().threads().await.unwrap() {
            let snapshot = self.agent.graph().get_state(&thread.thread_id).await.unwrap().unwrap();
            let users = snapshot.state.messages.iter().filter(|message| message.role == Role::User).count();
            threads.push((thread.thread_id, users));
        }
        threads
    }
}

async fn serve() -> Served {
    serve_with(weather_script()).await
}

async fn serve_with(script: Script) -> Served {
    let llm = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &dir.path().join("data")).await.unwrap();
    let agent = Arc::new(agent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let app = router(Arc::clone(&agent), ServerOptions { api_keys: vec![Secret::new(API_KEY)], ..ServerOptions::new(MODEL) });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { url, llm, agent, _dir: dir }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/client_checks.py")
}

/// `python3` with an environment that cannot send the client elsewhere (proxies, OpenAI variables).
fn python3() -> Command {
    let mut command = Command::new("python3");
    for variable in
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "OPENAI_BASE_URL", "OPENAI_API_KEY"]
    {
        command.env_remove(variable);
    }
    command.env("NO_PROXY", "127.0.0.1,localhost").env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

/// Whether the `openai` client can be imported; without it the test skips, or fails under CI.
fn openai_client_available() -> bool {
    let probe = python3().args(["-c", "import openai; print(openai.__version__)"]).output();
    let version = match probe {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Ok(output) => {
            let why = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            return skip_or_fail(&format!("python3 cannot import openai ({why})"));
        }
        Err(error) => return skip_or_fail(&format!("python3 does not run ({error})")),
    };
    if version != OPENAI_VERSION {
        assert!(std::env::var_os("CI").is_none(), "python3 has openai {version}, not {OPENAI_VERSION}: run scripts/install-python-deps.sh");
        eprintln!("note: python3 has openai {version}, not the pinned {OPENAI_VERSION} (scripts/install-python-deps.sh)");
    }
    true
}

fn skip_or_fail(why: &str) -> bool {
    assert!(std::env::var_os("CI").is_none(), "{why}: run scripts/install-python-deps.sh");
    eprintln!("{why}: skipping the openai Python client checks (run scripts/install-python-deps.sh)");
    false
}

/// Runs `client_checks.py <url> <key> <check>`, asserts it succeeded, and returns its JSON line.
async fn run_check(served: &Served, check: &str) -> Value {
    let out = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out.path().join("stdout"), out.path().join("stderr"));
    // Output goes to files, so a chatty failure cannot block the child on a full pipe.
    let mut child = python3()
        .arg(script())
        .args([served.url.as_str(), API_KEY, check])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("python3 starts");
    let deadline = tokio::time::Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("client_checks.py {check} still ran after {SCRIPT_LIMIT:?}: {}", std::fs::read_to_string(&stderr_path).unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (stdout, stderr) = (std::fs::read_to_string(&stdout_path).unwrap(), std::fs::read_to_string(&stderr_path).unwrap());
    assert!(status.success(), "client_checks.py {check} failed ({status}):\n{stderr}\nstdout: {stdout}");
    let line = stdout.lines().last().unwrap_or_else(|| panic!("client_checks.py {check} printed nothing; stderr: {stderr}"));
    eprintln!("client_checks.py {check}: {line}");
    let observed: Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
    assert_eq!(observed["check"], check, "{observed}");
    observed
}

fn text<'a>(observed: &'a Value, pointer: &str) -> &'a str {
    observed.pointer(pointer).and_then(Value::as_str).unwrap_or_else(|| panic!("no string at {pointer} in {observed}"))
}

fn assert_usage(usage: &Value) {
    let tokens = |name: &str| usage[name].as_u64().unwrap_or_else(|| panic!("no {name} in {usage}"));
    let (prompt, completion) = (tokens("prompt_tokens"), tokens("completion_tokens"));
    assert!(prompt > 0 && completion > 0, "{usage}");
    assert_eq!(tokens("total_tokens"), prompt + completion, "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_lists_the_served_model() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "models").await;
    assert_eq!(observed["ids"], serde_json::json!([MODEL]), "{observed}");
    assert_eq!(observed["owned_by"], serde_json::json!([peregrine_server::OWNED_BY]), "{observed}");
    assert_eq!(observed["retrieved"], MODEL, "{observed}");
    assert_eq!(
        (observed["unknown"]["error"].as_str(), observed["unknown"]["status_code"].as_u64(), observed["unknown"]["code"].as_str()),
        (Some("NotFoundError"), Some(404), Some("model_not_found")),
        "{observed}"
    );
    assert_eq!(served.llm.chat_requests().len(), 0, "listing models runs no turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_a_non_stream_answer_with_usage() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "nonstream").await;
    assert!(text(&observed, "/content").contains("Weather in Prague"), "{observed}");
    assert_eq!(observed["finish_reason"], "stop", "{observed}");
    assert_eq!(observed["model"], MODEL, "{observed}");
    assert!(text(&observed, "/id").starts_with("chatcmpl-"), "{observed}");
    assert_usage(&observed["usage"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reads_a_stream_with_progress_as_reasoning_and_usage() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "stream").await;
    let content = text(&observed, "/content");
    let reasoning = text(&observed, "/reasoning");
    assert!(reasoning.contains("planning…\n") && !content.contains('…'), "progress as reasoning: {reasoning:?} {content:?}");
    let second = text(&observed, "/second_content");
    let mark: String = second.chars().take(65).collect();
    assert!(
        mark.starts_with('\u{2060}')
            && mark.chars().skip(1).all(|c| matches!(c, '\u{200B}' | '\u{200C}'))
            && second == format!("{mark}\n\n"),
        "the chunk after the role's is the mark and a blank line: {second:?}"
    );
    assert!(content.starts_with(&format!("{mark}\n\nHere is the current weather.")), "the mark, then the answer: {content:?}");
    assert!(content.contains("Weather in Prague"), "{content:?}");
    assert_eq!(observed["finish_reasons"], serde_json::json!(["stop"]), "{observed}");
    assert_eq!(observed["first_role"], "assistant", "{observed}");
    assert!(observed["chunks"].as_u64().is_some_and(|chunks| chunks >= 4), "role, content, stop and usage chunks: {observed}");
    assert_usage(&observed["usage"]);
    assert_eq!(served.calls(LlmCall::Respond), 1, "the answer was streamed from one respond call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_answers_an_approval_with_the_next_request() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "approval").await;
    assert!(text(&observed, "/prompt").contains("HUMAN APPROVAL REQUIRED"), "{observed}");
    assert!(text(&observed, "/answer").contains("Weather in Prague"), "{observed}");
    assert_eq!(observed["finish_reason"], "stop", "{observed}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1, "the approved ExecutionPlan runs without planning again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1, "the approved step ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_raises_typed_errors() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "errors").await;
    let error = |name: &str| (observed[name]["error"].clone(), observed[name]["status_code"].clone(), observed[name]["code"].clone());
    assert_eq!(error("wrong_key"), ("AuthenticationError".into(), 401.into(), "invalid_api_key".into()), "{observed}");
    assert_eq!(error("unknown_model"), ("NotFoundError".into(), 404.into(), "model_not_found".into()), "{observed}");
    assert_eq!(error("assistant_last"), ("ConflictError".into(), 409.into(), "nothing_to_continue".into()), "{observed}");
    for (name, param) in [("two_choices", "n"), ("json_output", "response_format"), ("forced_tool", "tool_choice")] {
        assert_eq!(error(name), ("BadRequestError".into(), 400.into(), "unsupported_value".into()), "{name}: {observed}");
        assert_eq!(observed[name]["param"], param, "{observed}");
    }
    assert!(!observed.to_string().contains(API_KEY), "no key is echoed: {observed}");
    assert_eq!(served.llm.chat_requests().len(), 0, "no refused request ran a turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_answers_a_streamed_approval_with_the_history_it_streamed() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "approval_stream").await;
    assert!(
        text(&observed, "/prompt").contains("HUMAN APPROVAL REQUIRED") && !text(&observed, "/prompt").contains("> planning…"),
        "{observed}"
    );
    assert!(text(&observed, "/answer").contains("Weather in Prague"), "{observed}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1, "the approved plan runs without planning again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1);
    let threads = served.threads().await;
    assert_eq!(threads.len(), 1, "the answer went to the first turn's thread: {threads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_two_chats_with_the_same_first_message_stay_apart() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "two_chats").await;
    for pointer in ["/follow_ups/0", "/follow_ups/1"] {
        assert!(text(&observed, pointer).contains("Weather in Prague"), "{observed}");
    }
    let threads = served.threads().await;
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert!(threads.iter().all(|(_, users)| *users == 2), "each chat's two messages are on its own thread: {threads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_a_background_task_answered_without_a_turn() {
    if !openai_client_available() {
        return;
    }
    let served = serve().await;
    let observed = run_check(&served, "task").await;
    // The weather script answers any plain call with its respond text.
    assert_eq!(observed["content"], "I have no weather data to report.", "{observed}");
    assert_eq!(observed["streamed"], observed["content"], "{observed}");
    assert_eq!(observed["finish_reason"], "stop", "{observed}");
    assert_usage(&observed["stream_usage"]);
    assert_eq!(served.llm.chat_requests().len(), 2, "one model call per request");
    assert!(served.threads().await.is_empty(), "no thread was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_does_not_send_a_message_for_a_busy_conversation_again() {
    if !openai_client_available() {
        return;
    }
    // Respond's first call is held (until the provider's 30 s timeout): the turn keeps running.
    let held_answer = Reply::sequence(vec![Reply::fault(Fault::Timeout), answer_reply()]);
    let served = serve_with(with_weather_replies(Script::new().on_plain(held_answer))).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "What's the weather in Prague?"}], "stream": true});
    let running = reqwest::Client::new()
        .post(format!("{}/chat/completions", served.url))
        .bearer_auth(API_KEY)
        .header("X-Session-Id", BUSY_SESSION)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(running.status().as_u16(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while served.calls(LlmCall::Respond) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "respond was never called: {:?}", call_counts(&served.llm.chat_requests()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let observed = run_check(&served, "busy").await;
    let busy = &observed["busy"];
    assert_eq!(
        (busy["error"].as_str(), busy["status_code"].as_u64(), busy["code"].as_str()),
        (Some("ConflictError"), Some(409), Some("thread_busy")),
        "{observed}"
    );
    assert_eq!((observed["max_retries"].as_u64(), observed["requests"].as_u64()), (Some(2), Some(1)), "sent once: {observed}");
    assert_eq!(served.calls(LlmCall::TaskExtraction), 1, "one turn ran: {:?}", call_counts(&served.llm.chat_requests()));
    drop(running);
}

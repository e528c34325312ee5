//! Scale-out acceptance: two `hello-world-weather serve` processes, each in a project directory of
//! its own (as two machines would have) but on one PostgreSQL checkpointer and with the same API
//! key, serve the same threads over the native threads/runs API and the OpenAI-compatible one:
//! the turns of one thread alternate between them, a thread never runs in both at once, an
//! approval asked for by one is answered on the other, and a process killed mid-turn leaves the
//! thread resumable on the other without repeating its finished steps.
//!
//! Each process talks to a scripted LLM server of its own, so that the calls each one made tell
//! which process ran which step. Needs `PEREGRINE_TEST_POSTGRES_URL` (`eval "$(bash
//! scripts/postgres.sh start)"` sets it); without it the tests skip, unless `CI` is set, where
//! they fail. The tables live in the database's default schema; every test uses an API key of
//! its own, so it sees only its own threads (their ids carry the key's owner tag) and the tests
//! run in parallel without meeting.

#![allow(clippy::expect_used, reason = "test helpers report failures by panicking")]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use peregrine_testkit::agent_fixture::{
    LOCATION_EXTRACTION, LlmCall, call_counts, location_reply, project_config, weather_script, with_weather_replies,
};
use peregrine_testkit::llm_server::{Fault, RecordedRequest, Reply, Script, ScriptedLlmServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const URL_VARIABLE: &str = "PEREGRINE_TEST_POSTGRES_URL";
/// The `checkpointer` section `project_config` writes, replaced by the PostgreSQL one.
const SQLITE_SECTION: &str = "checkpointer:\n  type: sqlite\n  path: ./state/peregrine.db\n";
/// How long a condition is waited for (a process start, a held call, a released lock).
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a gated LLM call waits at most, so that a failed test never leaves it blocked
/// (below the projects' 20 s provider timeout).
const HOLD_LIMIT: Duration = Duration::from_secs(15);
const QUESTION: &str = "What's the weather in Prague?";

/// The test server's URL; `None` (after saying so) when there is none outside CI.
fn postgres_url() -> Option<String> {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{URL_VARIABLE} is not set, and CI is: run `eval \"$(bash scripts/postgres.sh start)\"` before `cargo test`")
        }
        _ => {
            eprintln!("skipping the scale-out tests: {URL_VARIABLE} is not set (run `eval \"$(bash scripts/postgres.sh start)\"`)");
            None
        }
    }
}

/// An API key no other test (or earlier run against the same database) uses.
fn unique_key() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    format!("sk-scale-{}-{nanos}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------------
// One serve process
// ---------------------------------------------------------------------------------------------

/// A `serve` process in a project directory of its own; killed when dropped (its log is printed
/// when the test failed).
struct Node {
    name: &'static str,
    dir: tempfile::TempDir,
    child: Child,
    /// Kept open: the process may still write to stdout.
    _stdout: BufReader<ChildStdout>,
    address: String,
    key: String,
    client: reqwest::Client,
}

impl Node {
    /// Starts `serve --port 0` in a fresh project whose every role uses `llm`, whose checkpoints
    /// go to `postgres` and which accepts `key`; returns once it listens.
    async fn start(name: &'static str, llm: &ScriptedLlmServer, postgres: &str, key: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = project_config(&llm.base_url(), "sk-test");
        assert!(config.contains(SQLITE_SECTION), "project_config changed its checkpointer section: {config}");
        let config = config.replace(SQLITE_SECTION, "checkpointer:\n  type: postgres\n  url: ${SCALE_POSTGRES_URL}\n")
            + "server:\n  api_keys:\n    - ${SCALE_SERVE_KEY}\n";
        std::fs::write(dir.path().join("config.yml"), config).expect("config");
        std::fs::write(dir.path().join(".env"), format!("SCALE_SERVE_KEY={key}\nSCALE_POSTGRES_URL={postgres}\n")).expect(".env");
        let log = std::fs::File::create(dir.path().join("serve.log")).expect("log file");
        let mut child = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("PEREGRINE_DATA_DIR", dir.path().join("home-data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("serve starts");
        let stdout = child.stdout.take().expect("stdout");
        let (line, stdout) = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            (line, reader)
        })
        .await
        .expect("joined");
        let address = line.trim().strip_prefix("listening on ").map(str::to_owned);
        let client = reqwest::Client::builder().timeout(PATIENCE).build().expect("HTTP client");
        let node = Node { name, dir, child, _stdout: stdout, address: address.clone().unwrap_or_default(), key: key.to_owned(), client };
        assert!(address.is_some(), "{name} did not start: {line:?}\n{}", node.log());
        node
    }

    /// The process's stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crashed machine: nothing of the process runs after this.
    fn kill(&mut self) {
        self.child.kill().expect("killed");
        let _ = self.child.wait();
    }

    async fn request(&self, method: reqwest::Method, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut request = self.client.request(method.clone(), format!("{}{path}", self.address)).bearer_auth(&self.key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap_or_else(|error| panic!("{} {method} {path}: {error}\n{}", self.name, self.log()));
        let status = response.status();
        let text = response.text().await.unwrap_or_else(|error| panic!("{} {method} {path}: the body: {error}", self.name));
        let value = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        (status, value)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, None, &[]).await
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.request(reqwest::Method::POST, path, Some(body), &[]).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::DELETE, path, None, &[]).await
    }

    /// `POST /threads`: a new thread's id.
    async fn create_thread(&self) -> String {
        let (status, thread) = self.post("/threads", &json!({})).await;
        assert_eq!(status, StatusCode::CREATED, "{}: POST /threads: {thread}", self.name);
        let id = thread["thread_id"].as_str().expect("thread_id").to_owned();
        assert!(id.starts_with("t-"), "{id}");
        id
    }

    /// `POST /threads/{thread}/runs/wait`: the ended run (the status must be 200).
    async fn run_wait(&self, thread: &str, body: Value) -> Value {
        let (status, run) = self.post(&format!("/threads/{thread}/runs/wait"), &body).await;
        assert_eq!(status, StatusCode::OK, "{}: runs/wait {body}: {run}\n{}", self.name, self.log());
        run
    }

    /// `GET /threads/{thread}` (must be 200).
    async fn thread(&self, thread: &str) -> Value {
        let (status, value) = self.get(&format!("/threads/{thread}")).await;
        assert_eq!(status, StatusCode::OK, "{}: GET /threads/{thread}: {value}", self.name);
        value
    }

    /// `GET /threads/{thread}/state` (must be 200).
    async fn state(&self, thread: &str) -> Value {
        let (status, value) = self.get(&format!("/threads/{thread}/state")).await;
        assert_eq!(status, StatusCode::OK, "{}: GET /threads/{thread}/state: {value}", self.name);
        value
    }

    /// A chat completion with `X-Session-Id: session` (must be 200): the answer's content.
    async fn chat(&self, session: &str, messages: Value) -> String {
        let body = json!({"model": "hello-world-weather", "messages": messages});
        let (status, answer) = self.request(reqwest::Method::POST, "/v1/chat/completions", Some(&body), &[("X-Session-Id", session)]).await;
        assert_eq!(status, StatusCode::OK, "{}: chat completion: {answer}\n{}", self.name, self.log());
        answer["choices"][0]["message"]["content"].as_str().expect("content").to_owned()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- log of serve process {} ----\n{}", self.name, self.log());
        }
    }
}

/// Two serve processes on one PostgreSQL database with the same key, each with its own LLM
/// server; `None` when there is no PostgreSQL to test against.
struct Cluster {
    a: Node,
    b: Node,
    llm_a: ScriptedLlmServer,
    llm_b: ScriptedLlmServer,
}

impl Cluster {
    async fn start(script_a: Script, script_b: Script) -> Option<Self> {
        let postgres = postgres_url()?;
        let key = unique_key();
        let (llm_a, llm_b) = (ScriptedLlmServer::start(script_a).await, ScriptedLlmServer::start(script_b).await);
        let a = Node::start("A", &llm_a, &postgres, &key).await;
        let b = Node::start("B", &llm_b, &postgres, &key).await;
        assert_ne!(a.dir.path(), b.dir.path());
        Some(Self { a, b, llm_a, llm_b })
    }

    async fn shutdown(self) {
        let Self { a, b, llm_a, llm_b } = self;
        drop((a, b));
        llm_a.shutdown().await;
        llm_b.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Holding an LLM call
// ---------------------------------------------------------------------------------------------

/// Holds the LLM calls it answers until opened (at most [`HOLD_LIMIT`]), keeping a turn mid-way.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// `reply`, given once the gate is open.
    fn hold(&self, reply: Reply) -> Reply {
        let gate = self.clone();
        Reply::from_fn(move |_| {
            gate.wait();
            reply.clone()
        })
    }

    fn wait(&self) {
        let (open, changed) = &*self.0;
        // The scripted server's handler runs on the test's runtime: leave the worker to others.
        tokio::task::block_in_place(|| {
            let guard = open.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = changed.wait_timeout_while(guard, HOLD_LIMIT, |open| !*open);
        });
    }

    fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        changed.notify_all();
    }
}

/// Opens the gate when the test ends, however it ends.
struct OpenOnDrop(Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Polls the server's request log until `call` was requested `count` times.
async fn wait_for_call(server: &ScriptedLlmServer, call: LlmCall, count: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while server.chat_requests().iter().filter(|request| LlmCall::of(request) == call).count() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{call:?} was never called {count} times: {:?}",
            call_counts(&server.chat_requests())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Reading answers
// ---------------------------------------------------------------------------------------------

/// The run ended well and answered with the weather.
fn assert_answered(run: &Value, what: &str) {
    assert_eq!(run["status"], "success", "{what}: {run}");
    assert_eq!(run["result"]["status"], "completed", "{what}: {run}");
    let response = run["result"]["response"].as_str().unwrap_or_default();
    assert!(response.contains("Weather in Prague"), "{what}: the answer: {run}");
    assert!(run["error"].is_null(), "{what}: {run}");
}

/// The `(role, content)` of every message of a state.
fn messages(state: &Value) -> Vec<(String, String)> {
    state["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|message| {
            (message["role"].as_str().unwrap_or_default().to_owned(), message["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

fn user_texts(state: &Value) -> Vec<String> {
    messages(state).into_iter().filter(|(role, _)| role == "user").map(|(_, text)| text).collect()
}

fn calls(server: &ScriptedLlmServer, call: LlmCall) -> usize {
    call_counts(&server.chat_requests()).get(&call).copied().unwrap_or(0)
}

fn task_extraction_prompts(server: &ScriptedLlmServer) -> Vec<String> {
    server
        .chat_requests()
        .iter()
        .filter(|request| LlmCall::of(request) == LlmCall::TaskExtraction)
        .map(RecordedRequest::prompt_text)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The acceptance tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_turns_of_one_thread_alternate_between_the_processes() {
    let Some(cluster) = Cluster::start(weather_script(), weather_script()).await else { return };
    let Cluster { a, b, llm_a, llm_b } = &cluster;
    let thread = a.create_thread().await;
    let shown = b.thread(&thread).await;
    assert_eq!((&shown["status"], &shown["messages"]), (&json!("idle"), &json!(0)), "B sees the thread A created: {shown}");

    let questions = [format!("{QUESTION} (turn one)"), format!("{QUESTION} (turn two)"), format!("{QUESTION} (turn three)")];
    // A, then B right after A's run ended, then A right after B's.
    for (turn, (node, question)) in [a, b, a].into_iter().zip(&questions).enumerate() {
        let run = node.run_wait(&thread, json!({"input": question})).await;
        assert_answered(&run, &format!("turn {} on {}", turn + 1, node.name));
        assert_eq!(run["kind"], "message");
        assert_eq!(run["thread_id"], thread.as_str());
    }

    // Each process ran its own turns, and B's turn read A's.
    assert_eq!((calls(llm_a, LlmCall::TaskExtraction), calls(llm_b, LlmCall::TaskExtraction)), (2, 1));
    assert_eq!((calls(llm_a, LlmCall::Respond), calls(llm_b, LlmCall::Respond)), (2, 1));
    let b_prompt = task_extraction_prompts(llm_b).pop().expect("B's task extraction");
    assert!(b_prompt.contains(&questions[0]) && b_prompt.contains("Weather in Prague"), "turn 2 sees turn 1: {b_prompt}");
    let a_third = task_extraction_prompts(llm_a).pop().expect("A's second task extraction");
    assert!(a_third.contains(&questions[1]), "turn 3 on A sees turn 2 from B: {a_third}");

    for node in [a, b] {
        let state = node.state(&thread).await;
        assert_eq!(user_texts(&state), questions, "{}: {state}", node.name);
        let roles: Vec<String> = messages(&state).into_iter().map(|(role, _)| role).collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user", "assistant"], "{}: {state}", node.name);
        assert_eq!(state["status"], "idle", "{}: {state}", node.name);
        let shown = node.thread(&thread).await;
        assert_eq!((&shown["status"], &shown["messages"]), (&json!("idle"), &json!(6)), "{}: {shown}", node.name);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thread_never_runs_in_two_processes_at_once() {
    let gate = Gate::default();
    let _open = OpenOnDrop(gate.clone());
    // A's location extractions wait at the gate: its turns are mid-way, past the orchestrator.
    let script_a = with_weather_replies(Script::new().on_schema(LOCATION_EXTRACTION, gate.hold(location_reply())));
    let Some(cluster) = Cluster::start(script_a, weather_script()).await else { return };
    let Cluster { a, b, llm_a, llm_b } = &cluster;
    let thread = a.create_thread().await;
    let (status, started) = a.post(&format!("/threads/{thread}/runs"), &json!({"input": QUESTION})).await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["status"], "running", "{started}");
    let run_id = started["run_id"].as_str().expect("run_id").to_owned();
    // And a conversation of the OpenAI-compatible API, held on A too.
    let session = format!("scale-out-busy-{}", unique_key());
    let conversation = json!([{"role": "user", "content": QUESTION}]);
    let chat_on_a = a.chat(&session, conversation.clone());

    let while_held = async {
        wait_for_call(llm_a, LlmCall::CurrentWeather, 2).await;
        let shown = b.thread(&thread).await;
        assert_eq!(shown["status"], "busy", "B sees the run A holds: {shown}");
        for route in ["runs", "runs/wait", "runs/stream"] {
            let (status, refused) = b.post(&format!("/threads/{thread}/{route}"), &json!({"input": "And in Oslo?"})).await;
            assert_eq!(status, StatusCode::CONFLICT, "POST {route} on B while A runs the thread: {refused}");
            assert_eq!(refused["error"]["code"], "thread_busy", "{route}: {refused}");
        }
        let (status, refused) = b.delete(&format!("/threads/{thread}")).await;
        assert_eq!((status, &refused["error"]["code"]), (StatusCode::CONFLICT, &json!("thread_busy")), "DELETE on B: {refused}");
        let body = json!({"model": "hello-world-weather", "messages": conversation});
        let (status, refused) =
            b.request(reqwest::Method::POST, "/v1/chat/completions", Some(&body), &[("X-Session-Id", session.as_str())]).await;
        assert_eq!((status, &refused["error"]["code"]), (StatusCode::CONFLICT, &json!("thread_busy")), "chat on B: {refused}");
        assert_eq!(llm_b.chat_requests().len(), 0, "B started nothing");
        gate.open();
    };
    let (answer, ()) = tokio::join!(chat_on_a, while_held);
    assert!(answer.contains("Weather in Prague"), "A's held conversation: {answer}");
    let (status, finished) = a.get(&format!("/threads/{thread}/runs/{run_id}/wait")).await;
    assert_eq!(status, StatusCode::OK, "{finished}");
    assert_answered(&finished, "A's held run");

    // Both threads are free again, for B too, right after A's turns ended.
    let again = format!("{QUESTION} Again, please.");
    let run = b.run_wait(&thread, json!({"input": again})).await;
    assert_answered(&run, "B after A");
    assert_eq!(user_texts(&b.state(&thread).await), [QUESTION, again.as_str()]);
    let answer = b
        .chat(
            &session,
            json!([{"role": "user", "content": QUESTION}, {"role": "assistant", "content": answer}, {"role": "user", "content": again}]),
        )
        .await;
    assert!(answer.contains("Weather in Prague"), "B continued A's conversation: {answer}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_asked_for_on_one_process_is_answered_on_the_other() {
    let Some(cluster) = Cluster::start(weather_script(), weather_script()).await else { return };
    let Cluster { a, b, llm_a, llm_b } = &cluster;

    // Native API: the plan approval asked for on A, answered on B.
    let thread = a.create_thread().await;
    let asked = a.run_wait(&thread, json!({"input": format!("/planning {QUESTION}")})).await;
    assert_eq!((&asked["status"], &asked["result"]["status"]), (&json!("interrupted"), &json!("interrupted")), "{asked}");
    let interrupt = &asked["result"]["interrupt"];
    assert_eq!(interrupt["approval_type"], "orchestrator_plan", "{asked}");
    assert_eq!(interrupt["payload"]["execution_plan"]["steps"][0]["capability"], "current_weather", "{asked}");
    let interrupt_id = interrupt["id"].as_str().expect("interrupt id").to_owned();

    let shown = b.thread(&thread).await;
    assert_eq!(shown["status"], "interrupted", "B sees the pending approval: {shown}");
    assert_eq!(shown["interrupt"]["id"], interrupt_id.as_str(), "{shown}");
    let state = b.state(&thread).await;
    assert_eq!(state["interrupt"]["approval_type"], "orchestrator_plan", "{state}");

    let answered = b.run_wait(&thread, json!({"resume": {"approved": true, "interrupt_id": interrupt_id}})).await;
    assert_answered(&answered, "the approval answered on B");
    assert_eq!(answered["kind"], "resume");
    assert_eq!(calls(llm_a, LlmCall::Orchestrator), 1);
    assert_eq!((calls(llm_a, LlmCall::CurrentWeather), calls(llm_a, LlmCall::Respond)), (0, 0), "A stopped at the approval");
    assert_eq!(calls(llm_b, LlmCall::Orchestrator), 0, "B ran the approved plan without planning again");
    assert_eq!((calls(llm_b, LlmCall::CurrentWeather), calls(llm_b, LlmCall::Respond)), (1, 1));
    for node in [a, b] {
        let shown = node.thread(&thread).await;
        assert_eq!(shown["status"], "idle", "{}: {shown}", node.name);
        assert!(shown["interrupt"].is_null(), "{}: {shown}", node.name);
    }
    // Answering again finds nothing to answer.
    let (status, refused) =
        a.post(&format!("/threads/{thread}/runs/wait"), &json!({"resume": {"approved": true, "interrupt_id": interrupt_id}})).await;
    assert_eq!((status, &refused["error"]["code"]), (StatusCode::CONFLICT, &json!("no_pending_approval")), "{refused}");

    // OpenAI-compatible API: `/planning` sent to A, "yes" with the same session id to B.
    let session = format!("scale-out-session-{}", unique_key());
    let first = json!({"role": "user", "content": format!("/planning {QUESTION}")});
    let prompt = a.chat(&session, json!([first])).await;
    assert!(!prompt.contains("Weather in Prague"), "A only asks: {prompt}");
    let (status, listed) = b.get("/threads").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let conversations: Vec<&Value> = listed
        .as_array()
        .expect("threads")
        .iter()
        .filter(|thread| thread["thread_id"].as_str().is_some_and(|id| id.starts_with("oai-")))
        .collect();
    assert_eq!(conversations.len(), 1, "{listed}");
    assert_eq!(conversations[0]["status"], "interrupted", "B sees the conversation waiting: {listed}");
    let answer = b.chat(&session, json!([first, {"role": "assistant", "content": prompt}, {"role": "user", "content": "yes"}])).await;
    assert!(answer.contains("Weather in Prague"), "B finished the approved plan: {answer}");
    assert_eq!(calls(llm_a, LlmCall::Orchestrator), 2);
    assert_eq!((calls(llm_b, LlmCall::Orchestrator), calls(llm_b, LlmCall::Respond)), (0, 2));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_killed_mid_turn_leaves_the_thread_resumable_on_the_other() {
    // A's respond call never answers: A is killed while it waits for it, with the task, the
    // selection, the plan and the weather step checkpointed.
    let is_respond = |request: &RecordedRequest| LlmCall::of(request) == LlmCall::Respond;
    let script_a = with_weather_replies(Script::new().on_request(is_respond, Reply::fault(Fault::Timeout)));
    let Some(mut cluster) = Cluster::start(script_a, weather_script()).await else { return };
    let thread = cluster.a.create_thread().await;
    let (status, started) = cluster.a.post(&format!("/threads/{thread}/runs"), &json!({"input": QUESTION})).await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    wait_for_call(&cluster.llm_a, LlmCall::Respond, 1).await;
    let finished_on_a = call_counts(&cluster.llm_a.chat_requests());
    cluster.a.kill();

    let Cluster { b, llm_a, llm_b, .. } = &cluster;
    // The database ends the killed process's session, and its lock with it, once it sees the
    // connection closed; until then the thread may still show as busy.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut shown = b.thread(&thread).await;
    let mut polls = 1;
    while shown["status"] == "busy" {
        assert!(tokio::time::Instant::now() < deadline, "the killed process's run never ended: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        shown = b.thread(&thread).await;
        polls += 1;
    }
    eprintln!("B saw the thread free after {polls} look(s)");
    assert_eq!(shown["status"], "error", "a cut-off run: {shown}");
    assert_eq!(shown["resumable"], true, "{shown}");
    let state = b.state(&thread).await;
    assert_eq!(state["next"], "respond", "the turn stopped before respond: {state}");

    let resumed = b.run_wait(&thread, json!({"continue": true})).await;
    assert_answered(&resumed, "the cut-off turn continued on B");
    assert_eq!(resumed["kind"], "continue");
    let on_b = call_counts(&llm_b.chat_requests());
    assert_eq!(on_b.get(&LlmCall::Respond), Some(&1), "{on_b:?}");
    assert_eq!(on_b.len(), 1, "only respond ran again; the steps finished on A were not repeated: {on_b:?}");
    for call in [LlmCall::TaskExtraction, LlmCall::Classifier, LlmCall::Orchestrator, LlmCall::CurrentWeather] {
        assert_eq!(finished_on_a.get(&call), Some(&1), "{call:?} ran on A: {finished_on_a:?}");
    }
    assert_eq!(call_counts(&llm_a.chat_requests()), finished_on_a, "nothing more reached A's model");

    let state = b.state(&thread).await;
    let texts = messages(&state);
    assert_eq!(texts.len(), 2, "{state}");
    assert_eq!(texts[0], ("user".to_owned(), QUESTION.to_owned()));
    assert!(texts[1].0 == "assistant" && texts[1].1.contains("Weather in Prague"), "{state}");
    let shown = b.thread(&thread).await;
    assert_eq!((&shown["status"], &shown["resumable"]), (&json!("idle"), &json!(false)), "{shown}");
    cluster.shutdown().await;
}

/// A chat completion without conversation headers, as Open WebUI sends one by default (must be
/// 200): the answer's content.
async fn chat_without_headers(node: &Node, messages: Value) -> String {
    let body = json!({"model": "hello-world-weather", "messages": messages});
    let (status, answer) = node.request(reqwest::Method::POST, "/v1/chat/completions", Some(&body), &[]).await;
    assert_eq!(status, StatusCode::OK, "{}: chat completion: {answer}\n{}", node.name, node.log());
    answer["choices"][0]["message"]["content"].as_str().expect("content").to_owned()
}

/// The ids of the caller's OpenAI-compatible conversations, as `node` lists them.
async fn conversations(node: &Node) -> Vec<String> {
    let (status, listed) = node.get("/threads").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    listed
        .as_array()
        .expect("threads")
        .iter()
        .filter_map(|thread| thread["thread_id"].as_str().filter(|id| id.starts_with("oai-")).map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_without_headers_continues_on_the_other_process() {
    let Some(cluster) = Cluster::start(weather_script(), weather_script()).await else { return };
    let Cluster { a, b, llm_a, llm_b } = &cluster;
    let questions = [format!("{QUESTION} (first)"), format!("{QUESTION} (second)"), format!("{QUESTION} (third)")];
    let user = |text: &str| json!({"role": "user", "content": text});
    let assistant = |text: &str| json!({"role": "assistant", "content": text});

    // The first turn on A: its answer opens with the conversation's mark, and so does every
    // later answer; the rest of the conversation is found from the history alone, on whichever
    // process answers.
    let first = chat_without_headers(a, json!([user(&questions[0])])).await;
    assert!(first.starts_with('\u{2060}') && first.contains("Weather in Prague"), "{first:?}");
    let mark: String = first.chars().take(65).collect();
    let second = chat_without_headers(b, json!([user(&questions[0]), assistant(&first), user(&questions[1])])).await;
    assert!(second.starts_with(&format!("{mark}\n\n")) && second.contains("Weather in Prague"), "the same mark: {second:?}");
    // A client that sends only its last messages: the second answer's mark finds the thread.
    let history = json!([user(&questions[1]), assistant(&second), user(&questions[2])]);
    let third = chat_without_headers(a, history).await;
    assert!(third.contains("Weather in Prague"), "{third:?}");

    let threads = conversations(b).await;
    assert_eq!(threads.len(), 1, "one conversation, one thread: {threads:?}");
    assert_eq!(conversations(a).await, threads);
    assert_eq!(user_texts(&b.state(&threads[0]).await), questions, "every turn on the first turn's thread");
    assert_eq!((calls(llm_a, LlmCall::TaskExtraction), calls(llm_b, LlmCall::TaskExtraction)), (2, 1));
    let b_prompt = task_extraction_prompts(llm_b).pop().expect("B's task extraction");
    assert!(b_prompt.contains(&questions[0]), "B's turn sees A's first turn: {b_prompt}");
    let a_third = task_extraction_prompts(llm_a).pop().expect("A's second task extraction");
    assert!(a_third.contains(&questions[1]), "A's third turn sees B's: {a_third}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_whose_mark_was_dropped_is_found_by_both_processes_from_its_second_turn() {
    let Some(cluster) = Cluster::start(weather_script(), weather_script()).await else { return };
    let Cluster { a, b, llm_a, .. } = &cluster;
    let questions = [format!("{QUESTION} (one)"), format!("{QUESTION} (two)"), format!("{QUESTION} (three)")];
    let user = |text: &str| json!({"role": "user", "content": text});
    let assistant = |text: &str| json!({"role": "assistant", "content": text});
    let invisible = |c: char| matches!(c, '\u{2060}' | '\u{200B}' | '\u{200C}');

    // A client that drops invisible characters resends the first answer without its mark.
    let first = chat_without_headers(a, json!([user(&questions[0])])).await.replace(invisible, "");
    let second = chat_without_headers(b, json!([user(&questions[0]), assistant(&first), user(&questions[1])])).await;
    let history = json!([user(&questions[0]), assistant(&first), user(&questions[1]), assistant(&second), user(&questions[2])]);
    chat_without_headers(a, history).await;

    let threads = conversations(a).await;
    assert_eq!(threads.len(), 2, "the first turn's thread, and the one the history derives: {threads:?}");
    let mut turns: Vec<Vec<String>> = Vec::new();
    for thread in &threads {
        turns.push(user_texts(&b.state(thread).await));
    }
    turns.sort();
    assert_eq!(turns, [vec![questions[0].clone()], vec![questions[1].clone(), questions[2].clone()]], "{threads:?}");
    let a_third = task_extraction_prompts(llm_a).pop().expect("A's second task extraction");
    assert!(a_third.contains(&questions[1]), "A's turn found the thread B's turn derived: {a_third}");
    cluster.shutdown().await;
}

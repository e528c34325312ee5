//! The `hello-world-weather` binary end to end — the command line an application gets from
//! `peregrine::main` — in a temp project against the scripted LLM server: `run` in text and
//! `--json` modes, a planning-mode approval answered by a second `run`, a run killed mid-turn
//! and finished with `--resume`, `threads list|show|history|delete`, broken configuration files
//! and the secret that never shows.

#![allow(clippy::expect_used, reason = "test helpers report failures by panicking")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use peregrine_testkit::agent_fixture::{EXTRACTED_TASK, LlmCall, call_counts, weather_script, with_weather_replies};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const API_KEY: &str = "sk-cli-test-7d1e9f";

/// A project directory with a config.yml pointing every role at the scripted server.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(base_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = format!(
            "# a project of the weather application\n\
             models:\n  default:\n    provider: scripted\n    model_id: scripted-model\n\
             api:\n  providers:\n    scripted:\n      protocol: openai\n      base_url: {base_url}\n      api_key: ${{SCRIPTED_API_KEY}}\n      max_retries: 0\n      timeout_seconds: 20\n\
             checkpointer:\n  type: sqlite\n  path: ./state/peregrine.db\n\
             file_paths:\n  agent_data_dir: ./_agent_data\n"
        );
        std::fs::write(dir.path().join("config.yml"), config).expect("config written");
        std::fs::write(dir.path().join(".env"), format!("SCRIPTED_API_KEY={API_KEY}\n")).expect(".env written");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(self.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.path())
            .env("USER", "tester")
            .env("PEREGRINE_DATA_DIR", self.path().join("home-data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs the binary to completion off the async runtime (the scripted server lives on it).
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = self.command(args);
        tokio::task::spawn_blocking(move || command.output().expect("the binary runs")).await.expect("joined")
    }

    fn pending_plan(&self, thread: &str) -> PathBuf {
        self.path().join("_agent_data/execution_plans/pending_plans").join(thread).join("pending_execution_plan.json")
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_success(output: &Output) {
    assert!(output.status.success(), "exit {:?}\nstdout:\n{}\nstderr:\n{}", output.status, stdout(output), stderr(output));
}

/// Every stdout line as JSON (fails on a line that is not).
fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}\nstderr:\n{}", stderr(output)))
        })
        .collect()
}

fn result_of(events: &[Value]) -> &Value {
    let last = events.last().expect("at least the result");
    assert_eq!(last["type"], "result", "the last object is the result: {last}");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_the_streamed_answer_and_keeps_the_secret() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let text = stdout(&output);
    assert!(text.contains("Here is the current weather. Weather in Prague"), "{text}");
    assert_eq!(text.matches("Here is the current weather").count(), 1, "the streamed answer is not printed twice: {text}");
    let requests = server.chat_requests();
    assert!(requests.iter().all(|request| request.bearer_token() == Some(API_KEY)), "the key from .env is sent");
    let counts = call_counts(&requests);
    assert_eq!(counts.get(&LlmCall::TaskExtraction), Some(&1), "{counts:?}");
    assert_eq!(counts.get(&LlmCall::Orchestrator), Some(&1), "{counts:?}");
    // The key appears nowhere: not in the answer, not in verbose diagnostics, not in config show.
    let verbose = project.run(&["run", "-v", "--thread", "v", "What's the weather in Prague?"]).await;
    assert_success(&verbose);
    let shown = project.run(&["config", "show"]).await;
    assert_success(&shown);
    for output in [&output, &verbose, &shown] {
        assert!(!stdout(output).contains(API_KEY) && !stderr(output).contains(API_KEY), "{}{}", stdout(output), stderr(output));
    }
    assert!(stdout(&shown).contains("scripted-model"), "config show shows the models: {}", stdout(&shown));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_json_prints_one_object_per_event_and_a_final_result() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--json", "--thread", "j", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let events = json_lines(&output);
    let started: Vec<&str> =
        events.iter().filter(|event| event["type"] == "node_started").filter_map(|event| event["node"].as_str()).collect();
    assert_eq!(started, ["task_extraction", "classifier", "orchestrator", "current_weather", "respond"], "{events:?}");
    let tokens: String = events.iter().filter(|event| event["type"] == "token").filter_map(|event| event["content"].as_str()).collect();
    assert!(tokens.contains("Weather in Prague"), "answer tokens stream as events: {tokens}");
    let plan = events.iter().find(|event| event["event"] == "plan_created").expect("the plan event");
    assert_eq!(plan["steps"][0]["capability"], "current_weather");
    let result = result_of(&events);
    assert_eq!(result["status"], "completed");
    assert_eq!(result["thread_id"], "j");
    assert_eq!(result["response"].as_str(), Some(tokens.trim()), "the result carries the whole answer");
    assert!(result["interrupt"].is_null());
    assert!(!stdout(&output).contains("\x1b["), "no colours when piped");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_approval_is_answered_by_the_next_run() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    let asked = project.run(&["run", "--json", "--thread", "p", "/planning What's the weather in Prague?"]).await;
    assert_success(&asked);
    let events = json_lines(&asked);
    let result = result_of(&events);
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["interrupt"]["payload"]["approval_type"], "orchestrator_plan");
    assert!(result["response"].as_str().is_some_and(|prompt| prompt.contains("HUMAN APPROVAL REQUIRED")), "{result}");
    assert!(project.pending_plan("p").exists(), "the plan waits in its file");
    assert!(!server.chat_requests().iter().any(|request| LlmCall::of(request) == LlmCall::CurrentWeather), "nothing ran yet");

    // The text mode says how to answer.
    let shown = project.run(&["threads", "show", "p"]).await;
    assert_success(&shown);
    assert!(stdout(&shown).contains("waiting for an approval"), "{}", stdout(&shown));

    let answered = project.run(&["run", "--json", "--thread", "p", "yes"]).await;
    assert_success(&answered);
    let result = result_of(&json_lines(&answered)).clone();
    assert_eq!(result["status"], "completed", "{result}");
    assert!(result["response"].as_str().is_some_and(|answer| answer.contains("Weather in Prague")), "{result}");
    let counts = call_counts(&server.chat_requests());
    assert_eq!(counts.get(&LlmCall::Orchestrator), Some(&1), "the approved plan runs without re-planning: {counts:?}");
    assert!(!project.pending_plan("p").exists(), "the pending plan is consumed");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_mid_turn_is_finished_by_resume_without_repeating_steps() {
    // Respond's request is held unanswered: the process is killed while it waits.
    let script = with_weather_replies(Script::new().on_plain(Reply::fault(Fault::Timeout)));
    let server = ScriptedLlmServer::start(script).await;
    let project = Project::new(&server.base_url());
    let mut child = project.command(&["run", "--thread", "k", "What's the weather in Prague?"]).spawn().expect("spawned");
    // Polls the server's request log (not a sleep as synchronisation: the condition is checked).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !server.chat_requests().iter().any(|request| LlmCall::of(request) == LlmCall::Respond) {
        assert!(tokio::time::Instant::now() < deadline, "respond was never called: {:?}", call_counts(&server.chat_requests()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("killed");
    let _ = child.wait();
    let before = call_counts(&server.chat_requests());

    let status = project.run(&["threads", "list", "--json"]).await;
    assert_success(&status);
    let threads: Value = serde_json::from_str(&stdout(&status)).expect("JSON list");
    assert_eq!(threads[0]["thread_id"], "k");
    assert_eq!(threads[0]["status"], "unfinished", "{threads}");

    // A fresh server whose respond answers at once; the old one held respond's request.
    server.shutdown().await;
    let fast = ScriptedLlmServer::start(with_weather_replies(Script::new().on_plain(Reply::text("Resumed answer: Prague is mild.")))).await;
    let project_fast = project.rebased(&fast.base_url());
    let resumed = project_fast.run(&["run", "--json", "--thread", "k", "--resume"]).await;
    assert_success(&resumed);
    let result = result_of(&json_lines(&resumed)).clone();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["response"], "Resumed answer: Prague is mild.");
    let after = call_counts(&fast.chat_requests());
    assert_eq!(after.len(), 1, "only respond runs again, finished steps are not repeated: {after:?} (before the kill: {before:?})");
    assert_eq!(after.get(&LlmCall::Respond), Some(&1), "{after:?}");

    let again = project_fast.run(&["run", "--thread", "k", "--resume"]).await;
    assert_eq!(again.status.code(), Some(2), "nothing left to resume is a usage error: {}", stderr(&again));
    assert!(stderr(&again).contains("no unfinished run"), "{}", stderr(&again));
    fast.shutdown().await;
}

impl Project {
    /// The same project with its config pointing at another server.
    fn rebased(self, base_url: &str) -> Self {
        let path = self.path().join("config.yml");
        let text = std::fs::read_to_string(&path).expect("config read");
        let rewritten: String = text
            .lines()
            .map(|line| if line.trim_start().starts_with("base_url:") { format!("      base_url: {base_url}") } else { line.to_owned() })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, rewritten + "\n").expect("config rewritten");
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_list_show_history_and_delete() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    for question in ["What's the weather in Prague?", "And tomorrow?", "Thanks!"] {
        assert_success(&project.run(&["run", "--thread", "h", question]).await);
    }
    assert_success(&project.run(&["run", "--thread", "other", "What's the weather in Prague?"]).await);

    let list = project.run(&["threads", "list"]).await;
    assert_success(&list);
    let line = stdout(&list).lines().find(|line| line.starts_with("h ")).map(str::to_owned).expect("thread h listed");
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&columns[..3], ["h", "idle", "3"], "thread, status, turns: {line}");

    let history = project.run(&["threads", "history", "h", "--json"]).await;
    assert_success(&history);
    let checkpoints: Vec<Value> = serde_json::from_str(&stdout(&history)).expect("JSON history");
    let inputs = checkpoints.iter().filter(|meta| meta["source"] == "input").count();
    assert_eq!(inputs, 3, "one input checkpoint per turn");
    let nodes: Vec<&str> = checkpoints.iter().filter_map(|meta| meta["node"].as_str()).collect();
    assert_eq!(nodes.iter().filter(|node| **node == "respond").count(), 3, "{nodes:?}");
    assert!(checkpoints.windows(2).all(|pair| pair[0]["checkpoint_id"].as_u64() > pair[1]["checkpoint_id"].as_u64()), "newest first");
    let table = project.run(&["threads", "history", "h"]).await;
    assert_success(&table);
    assert_eq!(stdout(&table).lines().count(), checkpoints.len() + 1, "a header and one row per checkpoint");

    let shown = project.run(&["threads", "show", "h"]).await;
    assert_success(&shown);
    let text = stdout(&shown);
    for question in ["What's the weather in Prague?", "And tomorrow?", "Thanks!"] {
        assert!(text.contains(question), "{text}");
    }

    assert_success(&project.run(&["threads", "delete", "h"]).await);
    let gone = project.run(&["threads", "show", "h"]).await;
    assert_eq!(gone.status.code(), Some(1), "{}", stderr(&gone));
    assert!(stderr(&gone).contains("there is no thread 'h'"), "{}", stderr(&gone));
    let list = project.run(&["threads", "list", "--json"]).await;
    let threads: Value = serde_json::from_str(&stdout(&list)).expect("JSON list");
    assert_eq!(threads.as_array().map(Vec::len), Some(1), "only 'other' is left: {threads}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_model_is_an_error_result_not_an_exit_code() {
    let script = with_weather_replies(Script::new().on_schema(EXTRACTED_TASK, Reply::fault(Fault::Status(401))));
    let server = ScriptedLlmServer::start(script).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--json", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let result = result_of(&json_lines(&output)).clone();
    assert_eq!(result["status"], "error", "{result}");
    assert!(result["response"].as_str().is_some_and(|report| report.contains("ERROR REPORT")), "{result}");
    server.shutdown().await;
}

/// Writes `text` as config.yml and runs `config validate`.
async fn validate(text: &str) -> (Output, PathBuf) {
    let project = Project::new("http://127.0.0.1:9/v1");
    std::fs::write(project.path().join("config.yml"), text).expect("written");
    let output = project.run(&["config", "validate"]).await;
    let path = project.path().join("config.yml");
    std::mem::forget(project.dir);
    (output, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_configs_name_the_line_and_the_key() {
    let cases = [
        ("models:\n  default:\n    provider: openai\n    model_id: [unclosed\n", 4, None, "bad YAML"),
        (
            "models:\n  orchestrator:\n    provider: openai\n    model_id: gpt-4o\n    max_tokens: lots\n",
            5,
            Some("models.orchestrator.max_tokens"),
            "wrong type",
        ),
        ("models:\n  classifier:\n    provider: nowhere-ai\n    model_id: x\n", 3, Some("models.classifier.provider"), "unknown provider"),
    ];
    for (text, line, key, what) in cases {
        let (output, path) = validate(text).await;
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{what}: {message}");
        assert!(message.contains(&format!("{}:{line}", path.display())), "{what}: names the file and line {line}: {message}");
        if let Some(key) = key {
            assert!(message.contains(key), "{what}: names the key {key}: {message}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osprey_project_config_is_accepted() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/peregrine/tests/fixtures/osprey-0.11/config.yml");
    let project = Project::new("http://127.0.0.1:9/v1");
    std::fs::copy(&fixture, project.path().join("config.yml")).expect("fixture copied");
    std::fs::write(project.path().join(".env"), "CBORG_API_KEY=cborg-secret-5521\nOPENAI_API_KEY=sk-openai-secret-9918\n").expect(".env");
    let output = project.run(&["config", "validate"]).await;
    assert_success(&output);
    let text = stdout(&output);
    assert!(text.contains("valid:") && text.contains("ignored keys:") && text.contains("services"), "{text}");
    let shown = project.run(&["config", "show", "--format", "json"]).await;
    assert_success(&shown);
    let shown_text = stdout(&shown);
    assert!(!shown_text.contains("cborg-secret-5521") && !shown_text.contains("sk-openai-secret-9918"), "{shown_text}");
    let document: Value = serde_json::from_str(&shown_text).expect("JSON");
    assert!(document.to_string().contains("cborg"), "the providers are shown: {document}");
}

//! The `hello-world-weather` binary end to end — the command line an application gets from
//! `peregrine::main` — in a temp project against the scripted LLM server: `run` in text and
//! `--json` modes (pure JSON lines, a result object on every path), a planning-mode approval
//! answered by a second `run` (its hint pasted verbatim), a run killed or interrupted with
//! SIGINT mid-turn and finished with `--resume`, a streamed answer cut off and retried, a
//! closed stdout, messages that cannot be answers, `threads list|show|history|delete`, exit
//! codes, broken configuration files and the secret that never shows.

#![allow(clippy::expect_used, reason = "test helpers report failures by panicking")]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use peregrine_testkit::agent_fixture::{
    EXECUTION_PLAN, EXTRACTED_TASK, LlmCall, call_counts, project_config, weather_plan, weather_script, with_weather_replies,
};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const API_KEY: &str = "sk-cli-test-7d1e9f";

/// A project directory with a config.yml pointing every role at the scripted server.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(base_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = project_config(base_url, "${SCRIPTED_API_KEY}");
        std::fs::write(dir.path().join("config.yml"), config).expect("config written");
        std::fs::write(dir.path().join(".env"), format!("SCRIPTED_API_KEY={API_KEY}\n")).expect(".env written");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.args(args);
        self.environment(&mut command);
        command
    }

    /// `script` run by `sh` in the project, with the binary's directory first on `PATH`.
    fn shell(&self, script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        self.environment(&mut command);
        command.env("PATH", path_with_the_binary());
        command
    }

    /// The project's directory and a clean environment; stdin empty, stdout and stderr piped.
    fn environment(&self, command: &mut Command) {
        command
            .current_dir(self.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.path())
            .env("USER", "tester")
            .env("PEREGRINE_DATA_DIR", self.path().join("home-data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }

    /// Runs the binary to completion off the async runtime (the scripted server lives on it).
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = self.command(args);
        tokio::task::spawn_blocking(move || command.output().expect("the binary runs")).await.expect("joined")
    }

    fn pending_plan(&self, thread: &str) -> PathBuf {
        self.path().join("_agent_data/execution_plans/pending_plans").join(thread).join("pending_execution_plan.json")
    }

    /// The status `threads show --json` reports for `thread`.
    async fn thread_status(&self, thread: &str) -> String {
        let shown = self.run(&["threads", "show", "--json", thread]).await;
        assert_success(&shown);
        let value: Value = serde_json::from_str(&stdout(&shown)).expect("JSON thread");
        value["status"].as_str().unwrap_or_default().to_owned()
    }
}

/// Polls the server's request log until `call` was requested `count` times (not a sleep as
/// synchronisation: the condition is checked).
async fn wait_for_call(server: &ScriptedLlmServer, call: LlmCall, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while server.chat_requests().iter().filter(|request| LlmCall::of(request) == call).count() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{call:?} was never called {count} times: {:?}",
            call_counts(&server.chat_requests())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a spawned child off the async runtime.
async fn wait_child(child: std::process::Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().expect("the child ends")).await.expect("joined")
}

/// Respond's request only (the error node's analysis is plain too).
fn is_respond(request: &peregrine_testkit::llm_server::RecordedRequest) -> bool {
    LlmCall::of(request) == LlmCall::Respond
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
    let plan = events.iter().find(|event| event["type"] == "plan_created").expect("the plan event");
    assert_eq!(plan["steps"][0]["capability"], "current_weather");
    let result = result_of(&events);
    assert_eq!(result["status"], "completed");
    assert_eq!(result["thread_id"], "j");
    assert_eq!(result["response"].as_str(), Some(tokens.trim()), "the result carries the whole answer");
    assert!(result["interrupt"].is_null());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_has_no_colours_when_piped() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    // `-v` so that stderr carries progress lines too; `--color auto` decides by the pipes.
    let output = project.run(&["--color", "auto", "-v", "run", "--thread", "c", "/planning What's the weather in Prague?"]).await;
    assert_success(&output);
    assert!(stderr(&output).contains("approval needed:"), "styled parts are printed: {}", stderr(&output));
    assert!(
        !stdout(&output).contains('\x1b') && !stderr(&output).contains('\x1b'),
        "no escape codes: {}{}",
        stdout(&output),
        stderr(&output)
    );
    let always = project.run(&["--color", "always", "run", "--thread", "c", "yes"]).await;
    assert_success(&always);
    assert!(stderr(&always).contains("\x1b["), "the check can fail: --color always colours stderr: {}", stderr(&always));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_stdout_is_only_json_lines_even_verbose_and_on_errors() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--json", "-v", "--thread", "v", "What's the weather in Prague?"]).await;
    assert_success(&output);
    assert_eq!(result_of(&json_lines(&output))["status"], "completed");
    assert!(!stderr(&output).is_empty(), "verbose diagnostics go to stderr");

    // Usage errors of run itself, of the gateway, and configuration errors: exit 2 and still a result.
    assert_success(&project.run(&["run", "--json", "--thread", "w", "/planning What's the weather in Prague?"]).await);
    let cases: [(&[&str], &str); 5] = [
        (&["run", "--json", "-v", "   "], "empty"),
        (&["run", "--json", "-v", "--thread", "", "hello"], "thread id"),
        (&["run", "--json", "-v", "/resume"], "--resume"),
        (&["run", "--json", "-v", "--thread", "w", "/planning What about Oslo?"], "approval is pending"),
        (&["run", "--json", "-v", "--thread", "nothing-here", "--resume"], "no thread 'nothing-here'"),
    ];
    for (args, says) in cases {
        let output = project.run(args).await;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        let result = result_of(&json_lines(&output)).clone();
        assert_eq!(result["status"], "error", "{args:?}: {result}");
        assert!(result["error"].as_str().is_some_and(|error| error.contains(says)), "{args:?} says {says:?}: {result}");
        assert!(stderr(&output).contains(says), "{args:?}: the error is on stderr too: {}", stderr(&output));
    }
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
    // The provider quotes the refused key in its error body, as OpenAI does.
    let refuse = Reply::from_fn(|request| {
        Reply::fault(Fault::Http {
            status: 401,
            error_type: "invalid_request_error".into(),
            code: Some("invalid_api_key".into()),
            message: format!("Incorrect API key provided: {}", request.authorization.clone().unwrap_or_default()),
        })
    });
    let script = with_weather_replies(Script::new().on_schema(EXTRACTED_TASK, refuse));
    let server = ScriptedLlmServer::start(script).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--json", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let result = result_of(&json_lines(&output)).clone();
    assert_eq!(result["status"], "error", "{result}");
    assert!(result["response"].as_str().is_some_and(|report| report.contains("ERROR REPORT")), "{result}");
    let verbose = project.run(&["run", "-v", "--thread", "v", "What's the weather in Prague?"]).await;
    assert_success(&verbose);
    for output in [&output, &verbose] {
        let all = stdout(output) + &stderr(output);
        assert!(!all.contains(API_KEY), "the echoed key never shows: {all}");
        assert!(all.contains("Incorrect API key provided: ***"), "the scrubbed message shows: {all}");
    }
    server.shutdown().await;
}

/// Writes `text` as config.yml and runs `config validate`; the project lives as long as the
/// returned directory.
async fn validate(text: &str) -> (Output, PathBuf, tempfile::TempDir) {
    let project = Project::new("http://127.0.0.1:9/v1");
    std::fs::write(project.path().join("config.yml"), text).expect("written");
    let output = project.run(&["config", "validate"]).await;
    let path = project.path().join("config.yml");
    (output, path, project.dir)
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
        let (output, path, _dir) = validate(text).await;
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

/// The directory of the binary, first on `PATH`, so that a hint naming the program runs as is.
fn path_with_the_binary() -> std::ffi::OsString {
    let dir = Path::new(BIN).parent().expect("the binary's directory").to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).expect("PATH")
}

/// The first command quoted in backticks in `text`.
fn quoted_command(text: &str) -> String {
    let start = text.find('`').expect("a quoted command") + 1;
    let end = start + text[start..].find('`').expect("the closing backtick");
    text[start..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_hint_pasted_verbatim_answers_the_approval() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    // A thread id a shell would split or expand.
    let thread = "it's my $thread";
    let asked = project.run(&["run", "--thread", thread, "/planning What's the weather in Prague?"]).await;
    assert_success(&asked);
    let hint = stderr(&asked).lines().find(|line| line.contains("approval needed:")).map(str::to_owned).expect("the hint");
    let command = quoted_command(&hint);
    assert!(command.starts_with("hello-world-weather run --thread "), "the hint names the program: {command}");
    let mut shell = project.shell(&command);
    let answered = tokio::task::spawn_blocking(move || shell.output().expect("sh runs")).await.expect("joined");
    assert_success(&answered);
    assert!(stdout(&answered).contains("Weather in Prague"), "the pasted command answered the approval: {}", stdout(&answered));
    assert_eq!(project.thread_status(thread).await, "idle");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_cancels_a_run_with_130_and_a_cancelled_result_and_resume_finishes_it() {
    let script = with_weather_replies(Script::new().on_request(is_respond, Reply::fault(Fault::Timeout)));
    let server = ScriptedLlmServer::start(script).await;
    let project = Project::new(&server.base_url());
    let child = project.command(&["run", "--json", "--thread", "s", "What's the weather in Prague?"]).spawn().expect("spawned");
    wait_for_call(&server, LlmCall::Respond, 1).await;
    let killed = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(killed.success());
    let output = wait_child(child).await;
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    let result = result_of(&json_lines(&output)).clone();
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(project.thread_status("s").await, "unfinished");

    server.shutdown().await;
    let fast = ScriptedLlmServer::start(with_weather_replies(Script::new().on_plain(Reply::text("Resumed after Ctrl-C.")))).await;
    let project = project.rebased(&fast.base_url());
    let resumed = project.run(&["run", "--json", "--thread", "s", "--resume"]).await;
    assert_success(&resumed);
    let result = result_of(&json_lines(&resumed)).clone();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["response"], "Resumed after Ctrl-C.");
    assert_eq!(call_counts(&fast.chat_requests()).get(&LlmCall::Respond), Some(&1), "only respond runs again");
    fast.shutdown().await;
}

/// Respond streams two pieces and is cut off; `then` answers the calls after it.
fn cut_answer_script(then: Reply) -> Script {
    let cut = Reply::text("").with_chunks(vec!["PARTIAL-A ".into(), "PARTIAL-B ".into(), "never sent".into()]);
    // The role chunk and the two pieces, then the connection breaks.
    let cut = cut.with_fault(Fault::TruncatedStream { after_chunks: 3 });
    with_weather_replies(Script::new().on_request(is_respond, Reply::sequence(vec![cut, then])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_cut_off_and_retried_is_shown_once_whole() {
    let server = ScriptedLlmServer::start(cut_answer_script(Reply::text("").with_chunks(vec!["Full ".into(), "answer.".into()]))).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--thread", "t", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let text = stdout(&output);
    assert_eq!(text.lines().last(), Some("Full answer."), "the retried answer on a line of its own, once: {text:?}");
    assert_eq!(text.matches("Full answer.").count(), 1, "{text:?}");
    assert!(!text.contains("PARTIAL-B Full"), "the cut-off text is not glued to the answer: {text:?}");
    assert!(stderr(&output).contains("the answer was cut off; retrying"), "{}", stderr(&output));
    let shown = project.run(&["threads", "show", "--json", "t"]).await;
    let thread: Value = serde_json::from_str(&stdout(&shown)).expect("JSON");
    let messages = thread["messages"].as_array().expect("messages");
    assert_eq!(messages.last().map(|message| message["content"].clone()), Some(json!("Full answer.")), "the stored answer");

    // JSON: the tokens before `stream_reset` are void.
    let json_server =
        ScriptedLlmServer::start(cut_answer_script(Reply::text("").with_chunks(vec!["Full ".into(), "answer.".into()]))).await;
    let project = project.rebased(&json_server.base_url());
    let output = project.run(&["run", "--json", "--thread", "tj", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let events = json_lines(&output);
    let reset = events.iter().rposition(|event| event["type"] == "stream_reset").expect("a stream_reset event");
    let before: String =
        events[..reset].iter().filter(|event| event["type"] == "token").filter_map(|event| event["content"].as_str()).collect();
    let after: String =
        events[reset..].iter().filter(|event| event["type"] == "token").filter_map(|event| event["content"].as_str()).collect();
    assert_eq!((before.as_str(), after.as_str()), ("PARTIAL-A PARTIAL-B ", "Full answer."), "{events:?}");
    assert_eq!(result_of(&events)["response"], "Full answer.");
    server.shutdown().await;
    json_server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_cut_off_every_time_ends_in_the_error_report() {
    let cut = Reply::text("").with_chunks(vec!["PARTIAL-A ".into(), "PARTIAL-B ".into(), "never sent".into()]);
    let server = ScriptedLlmServer::start(cut_answer_script(cut.with_fault(Fault::TruncatedStream { after_chunks: 3 }))).await;
    let project = Project::new(&server.base_url());
    let output = project.run(&["run", "--thread", "t", "What's the weather in Prague?"]).await;
    assert_success(&output);
    let text = stdout(&output);
    assert!(text.contains("ERROR REPORT"), "the report is printed although tokens were streamed: {text}");
    assert!(stderr(&output).contains("cut off"), "{}", stderr(&output));
    assert!(call_counts(&server.chat_requests()).get(&LlmCall::Respond).is_some_and(|count| *count >= 2), "respond was retried");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_stops_the_output_not_the_turn() {
    // A long answer, streamed slowly enough that the reader is gone before it ends.
    let pieces: Vec<String> = (0..200).map(|index| format!("word{index} ")).collect();
    let slow = Reply::text("").with_chunks(pieces).with_token_latency(Duration::from_millis(3));
    let server = ScriptedLlmServer::start(with_weather_replies(Script::new().on_request(is_respond, slow))).await;
    let project = Project::new(&server.base_url());
    let mut child = project.command(&["run", "--thread", "pipe", "What's the weather in Prague?"]).spawn().expect("spawned");
    let mut reader = child.stdout.take().expect("stdout");
    let read = tokio::task::spawn_blocking(move || {
        let mut first = [0_u8; 20];
        reader.read_exact(&mut first).expect("the first bytes of the answer");
        // `reader` is dropped here: the pipe's read end closes, like `| head -c 20`.
        first
    })
    .await
    .expect("joined");
    assert!(String::from_utf8_lossy(&read).starts_with("word0 "), "{read:?}");
    let output = wait_child(child).await;
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    assert_eq!(output.status.code(), Some(0), "exits quietly: {}", stderr(&output));
    assert_eq!(project.thread_status("pipe").await, "idle", "the turn finished");

    // `threads list | head -0`: the reader is gone before anything is written.
    let mut child = project.command(&["threads", "list"]).spawn().expect("spawned");
    drop(child.stdout.take());
    let output = wait_child(child).await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_that_cannot_be_answers_are_refused_or_reported() {
    let script = Script::new().on_schema("ApprovalResponse", Reply::json(json!({"approved": false})));
    let server = ScriptedLlmServer::start(with_weather_replies(script)).await;
    let project = Project::new(&server.base_url());
    assert_success(&project.run(&["run", "--thread", "w", "/planning What's the weather in Prague?"]).await);
    let calls = server.chat_requests().len();
    for empty in ["", "  \n "] {
        let output = project.run(&["run", "--thread", "w", empty]).await;
        assert_eq!(output.status.code(), Some(2), "{empty:?}: {}", stderr(&output));
        assert!(stderr(&output).contains("the message is empty"), "{}", stderr(&output));
    }
    assert_eq!(server.chat_requests().len(), calls, "nothing was sent");
    assert_eq!(project.thread_status("w").await, "interrupted", "still waiting for its answer");

    // An unrelated question is taken as the answer: the person is told so.
    let output = project.run(&["run", "--thread", "w", "What is the capital of France?"]).await;
    assert_success(&output);
    assert!(stderr(&output).contains("your message was taken as the answer to the pending approval: rejected"), "{}", stderr(&output));
    assert_eq!(project.thread_status("w").await, "interrupted", "the plan was made again and is asked for");

    // JSON: an `approval_answer` object right before the result, for a rejection and an approval.
    for (thread, answer, approved, status) in [("wj", "no idea what you mean", false, "interrupted"), ("wy", "yes", true, "completed")] {
        assert_success(&project.run(&["run", "--thread", thread, "/planning What's the weather in Prague?"]).await);
        let output = project.run(&["run", "--json", "--thread", thread, answer]).await;
        assert_success(&output);
        let events = json_lines(&output);
        let position = events.iter().position(|event| event["type"] == "approval_answer").expect("an approval_answer event");
        assert_eq!(events[position]["approved"], approved, "{answer}");
        assert_eq!(position, events.len() - 2, "right before the result");
        assert_eq!(result_of(&events)["status"], status, "{answer}");
    }
    // Not on a thread that waited for nothing.
    let output = project.run(&["run", "--json", "--thread", "wy", "What's the weather in Prague?"]).await;
    assert!(!json_lines(&output).iter().any(|event| event["type"] == "approval_answer"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_step_was_cut_off_must_be_finished_first() {
    // The plan is asked for, rejected, and the re-planning call hangs: the process is killed with
    // the answer recorded but the orchestrator not yet run again.
    let plans = Reply::sequence(vec![Reply::json(weather_plan("Prague", "prague_weather")), Reply::fault(Fault::Timeout)]);
    let server = ScriptedLlmServer::start(with_weather_replies(Script::new().on_schema(EXECUTION_PLAN, plans))).await;
    let project = Project::new(&server.base_url());
    assert_success(&project.run(&["run", "--thread", "a b", "/planning What's the weather in Prague?"]).await);
    let mut child = project.command(&["run", "--thread", "a b", "no, plan it differently"]).spawn().expect("spawned");
    wait_for_call(&server, LlmCall::Orchestrator, 2).await;
    child.kill().expect("killed");
    let _ = child.wait();
    assert_eq!(project.thread_status("a b").await, "unfinished");

    let refused = project.run(&["run", "--thread", "a b", "What's the weather in Oslo?"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(message.contains("thread 'a b' has a turn to finish first: `hello-world-weather run --thread 'a b' --resume`"), "{message}");
    assert!(!message.contains("starts a new turn") && !message.contains("continue_run"), "{message}");

    server.shutdown().await;
    let fast = ScriptedLlmServer::start(weather_script()).await;
    let project = project.rebased(&fast.base_url());
    let resumed = project.run(&["run", "--json", "--thread", "a b", "--resume"]).await;
    assert_success(&resumed);
    assert_eq!(result_of(&json_lines(&resumed))["status"], "interrupted", "the re-made plan is asked for again");
    fast.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_thread_removes_its_pending_plan() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    assert_success(&project.run(&["run", "--thread", "p", "/planning What's the weather in Prague?"]).await);
    let plan = project.pending_plan("p");
    assert!(plan.exists());
    let deleted = project.run(&["threads", "delete", "p"]).await;
    assert_success(&deleted);
    assert!(!plan.parent().expect("the thread's plan folder").exists(), "the pending plan folder is gone");
    // A new thread of the same name starts clean and asks again.
    let again = project.run(&["run", "--json", "--thread", "p", "/planning What's the weather in Prague?"]).await;
    assert_eq!(result_of(&json_lines(&again))["status"], "interrupted");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_tell_usage_from_store_failures() {
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());
    // A file where the checkpoint directory should be.
    std::fs::write(project.path().join("state"), "not a directory").expect("written");
    for args in [&["run", "hello"][..], &["run", "--json", "hello"], &["threads", "list"], &["chat", "--thread", "x"]] {
        let output = project.run(args).await;
        assert_eq!(output.status.code(), Some(1), "{args:?}: a store failure is 1: {}", stderr(&output));
        assert!(stderr(&output).contains("checkpoint"), "{args:?}: {}", stderr(&output));
    }
    let output = project.run(&["run", "--json", "hello"]).await;
    assert_eq!(result_of(&json_lines(&output))["status"], "error");
    std::fs::remove_file(project.path().join("state")).expect("removed");

    let usage: [&[&str]; 6] = [
        &["run", "--thread", "", "hello"],
        &["run", "--thread", "a\u{1b}[31mb", "hello"],
        &["threads", "show", ""],
        &["threads", "history", "h", "--limit", "0"],
        &["chat", "--thread", ""],
        &["chat", "-t", "\n"],
    ];
    for args in usage {
        let output = project.run(args).await;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
    }
    server.shutdown().await;
}

/// `channels` through the binary: the mock machine, the gates in order, the confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_read_and_write_the_mock_machine_through_the_gates() {
    let project = Project::new("http://127.0.0.1:9/v1");
    let config = project.path().join("config.yml");
    let base = std::fs::read_to_string(&config).expect("config");
    let with_control = |section: &str| std::fs::write(&config, format!("{base}\ncontrol_system:\n{section}")).expect("written");

    let read = project.run(&["channels", "get", "SR:BEAM:CURRENT", "LINAC:RF:AMP:SP"]).await;
    assert_success(&read);
    let shown = stdout(&read);
    assert!(shown.contains("SR:BEAM:CURRENT = 500 mA") && shown.contains("LINAC:RF:AMP:SP = 50 %"), "{shown}");
    let json = project.run(&["channels", "get", "--json", "SR:BEAM:CURRENT"]).await;
    let reading: Value = serde_json::from_str(stdout(&json).trim()).expect("JSON");
    assert_eq!((reading["value"]["value"].as_f64(), reading["units"].as_str()), (Some(500.0), Some("mA")), "{reading}");
    let unknown = project.run(&["channels", "get", "NOT A CHANNEL"]).await;
    assert_eq!(unknown.status.code(), Some(1), "{}", stderr(&unknown));
    assert!(stderr(&unknown).contains("was not found"), "{}", stderr(&unknown));
    let info = project.run(&["channels", "info", "SR:BEAM:CURRENT"]).await;
    assert!(stdout(&info).contains("units:          mA"), "{}", stdout(&info));
    let monitor = project.run(&["channels", "monitor", "--count", "1", "SR:BEAM:CURRENT"]).await;
    assert_success(&monitor);
    assert!(stdout(&monitor).contains("SR:BEAM:CURRENT = 500 mA"), "{}", stdout(&monitor));

    // Gate 1: writes are off unless enabled.
    let refused = project.run(&["channels", "put", "--yes", "LINAC:RF:AMP:SP", "55"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("writes to the control system are disabled"), "{}", stderr(&refused));

    // Gate 2: the limits database.
    std::fs::write(project.path().join("limits.json"), r#"{"LINAC:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10}}"#)
        .expect("written");
    with_control(
        "  writes_enabled: true\n  limits_checking:\n    enabled: true\n    database_path: limits.json\n  write_verification:\n    default_level: readback\n",
    );
    for (value, says) in [("70", "above the channel's maximum of 60"), ("35", "largest step of 10"), ("fast", "takes a number")] {
        let refused = project.run(&["channels", "put", "--yes", "LINAC:RF:AMP:SP", value]).await;
        assert_eq!(refused.status.code(), Some(1), "{value}");
        assert!(stderr(&refused).contains(says), "{value}: {}", stderr(&refused));
    }
    let unlisted = project.run(&["channels", "put", "--yes", "SR:MAG:QF1:SP", "1"]).await;
    assert!(stderr(&unlisted).contains("not in the limits database"), "{}", stderr(&unlisted));

    // Gate 3: a confirmation, unless --yes; piped stdin cannot give one.
    let unconfirmed = project.run(&["channels", "put", "LINAC:RF:AMP:SP", "55"]).await;
    assert_eq!(unconfirmed.status.code(), Some(1));
    assert!(stderr(&unconfirmed).contains("50 % → 55 %") && stderr(&unconfirmed).contains("pass --yes"), "{}", stderr(&unconfirmed));
    let written = project.run(&["channels", "put", "--yes", "--json", "LINAC:RF:AMP:SP", "55"]).await;
    assert_success(&written);
    let outcome: Value = serde_json::from_str(stdout(&written).trim()).expect("JSON");
    assert_eq!(outcome["verification"]["verified"], true, "{outcome}");
    assert_eq!(outcome["verification"]["level"], "readback", "{outcome}");
    assert_eq!(outcome["previous"]["value"].as_f64(), Some(50.0), "{outcome}");

    // A database that cannot be used stops the configuration from loading.
    std::fs::write(project.path().join("limits.json"), "{oops").expect("written");
    let broken = project.run(&["channels", "get", "SR:BEAM:CURRENT"]).await;
    assert_eq!(broken.status.code(), Some(2));
    assert!(stderr(&broken).contains("control_system.limits_checking.database_path"), "{}", stderr(&broken));
}

/// The acceptance case of a crash after an approval, on the real IOC of `scripts/epics-ioc.sh`:
/// the process answering "yes" is killed with SIGKILL at a random moment (before the answer is
/// recorded, after it, during or after the write), then the thread is finished (`--resume`, or
/// the answer given again when it was never recorded). Whatever the moment, the IOC's own put
/// counter shows exactly one write per approved operation, and the channel holds its value.
#[tokio::test]
async fn a_write_killed_at_any_moment_after_its_approval_reaches_the_real_ioc_exactly_once() {
    use peregrine::control::ControlSystem as _;
    use peregrine::control::epics::{EpicsControlSystem, EpicsSettings};

    let Ok(server) = std::env::var("PEREGRINE_TEST_CA_SERVER") else {
        assert!(std::env::var_os("PEREGRINE_REQUIRE_IOC").is_none(), "PEREGRINE_REQUIRE_IOC is set but PEREGRINE_TEST_CA_SERVER is not");
        eprintln!("PEREGRINE_TEST_CA_SERVER is not set: no IOC to test against (scripts/test.sh starts one)");
        return;
    };
    let settings = EpicsSettings { timeout: Duration::from_secs(2), addresses: vec![server.clone()], server_port: 5064 };
    let ca = EpicsControlSystem::connect(settings).await.expect("CA client");
    let value = |reading: peregrine::control::Reading| reading.value.as_f64().expect("a number");
    let puts = || async { value(ca.read("CRASH:RF:AMP:SP:PUTS").await.expect("the put counter")) };
    let seed = std::env::var("PEREGRINE_CRASH_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or(0x0C4A_5EED_u64);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for iteration in 0..8 {
        let current = value(ca.read("CRASH:RF:AMP:SP").await.expect("read"));
        let target = if current <= 50.0 { current + 5.0 } else { current - 5.0 };
        let objective = format!("Set CRASH:RF:AMP:SP to {target}");
        let script = Script::new()
            .on_schema(
                EXTRACTED_TASK,
                Reply::json(json!({"task": objective, "depends_on_chat_history": false, "depends_on_user_memory": false})),
            )
            .on_schema("CapabilitySelection", Reply::json(json!({"reasoning": "scripted", "selected": ["channel_write"]})))
            .on_schema(
                EXECUTION_PLAN,
                Reply::json(json!({"steps": [
                    {"context_key": "set", "capability": "channel_write", "task_objective": objective, "success_criteria": "written",
                     "expected_output": "CHANNEL_WRITE_RESULTS", "inputs": []},
                    {"context_key": "answer", "capability": "respond", "task_objective": "Confirm", "success_criteria": "ok",
                     "expected_output": "user_response", "inputs": [{"CHANNEL_WRITE_RESULTS": "set"}]}]})),
            )
            .on_schema(
                "WriteOperationsOutput",
                Reply::json(json!({"write_operations": [{"channel_address": "CRASH:RF:AMP:SP", "value": target}]})),
            )
            .on_plain(Reply::text("Written."));
        let llm = ScriptedLlmServer::start(script).await;
        let project = Project::new(&llm.base_url());
        std::fs::write(project.path().join("limits.json"), r#"{"CRASH:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10}}"#)
            .expect("limits");
        let config = project.path().join("config.yml");
        let base = std::fs::read_to_string(&config).expect("config");
        std::fs::write(
            &config,
            format!(
                "{base}\ncontrol_system:\n  type: epics\n  writes_enabled: true\n  limits_checking:\n    enabled: true\n    database_path: limits.json\n  \
                 write_verification:\n    default_level: readback\n  connector:\n    epics:\n      timeout: 2\n      addr_list: ['{server}']\n"
            ),
        )
        .expect("config");
        let before = puts().await;
        let thread = format!("crash-{iteration}");
        let started = std::time::Instant::now();
        let asked = project.run(&["run", "--json", "--thread", &thread, "Set the RF amplitude"]).await;
        // A whole run's duration: the kills are spread over the life of the answering process.
        let lifetime = started.elapsed();
        assert_success(&asked);
        assert_eq!(result_of(&json_lines(&asked))["status"], "interrupted", "{}", stdout(&asked));

        let child = project.command(&["run", "--json", "--thread", &thread, "yes"]).spawn().expect("spawned");
        let pid = child.id();
        let jitter = lifetime.mul_f64(rng.f64() * 1.5);
        // Killed at a random moment of its life (the wait is the randomised kill point, not a
        // synchronisation: whatever it hits, the thread is then finished and checked).
        tokio::time::sleep(jitter).await;
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        let killed = wait_child(child).await;
        let moment = match (killed.status.success(), project.thread_status(&thread).await.as_str()) {
            (true, _) => "finished before the kill".to_owned(),
            (false, "interrupted") => {
                // Killed before the answer was recorded: the question is still pending.
                assert_success(&project.run(&["run", "--json", "--thread", &thread, "yes"]).await);
                "before the answer was recorded".to_owned()
            }
            (false, "unfinished") => {
                let resumed = project.run(&["run", "--json", "--thread", &thread, "--resume"]).await;
                assert_success(&resumed);
                assert_eq!(result_of(&json_lines(&resumed))["status"], "completed", "{}", stdout(&resumed));
                "after the answer was recorded".to_owned()
            }
            (false, status) => format!("killed with the thread {status}"),
        };
        *tally.entry(moment.clone()).or_default() += 1;
        assert_eq!(project.thread_status(&thread).await, "idle", "iteration {iteration} ({moment}), seed {seed}");
        assert_eq!(
            puts().await - before,
            1.0,
            "iteration {iteration} ({moment}, {jitter:?}), seed {seed}: exactly one write reached the IOC"
        );
        let now = value(ca.read("CRASH:RF:AMP:SP").await.expect("read"));
        assert!((now - target).abs() < 1e-9, "iteration {iteration}: the IOC holds {now}, not {target}");
        llm.shutdown().await;
    }
    eprintln!("kill moments (seed {seed}): {tally:?}");
}

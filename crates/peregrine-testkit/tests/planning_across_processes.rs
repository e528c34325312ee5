//! Planning mode across a process restart (reference §8.2 case 14) through the real
//! `agent_probe` binary: one process plans and exits with the plan waiting for approval (shown
//! to the person and saved per thread under the data directory); a new process answers. "yes"
//! runs the approved plan — or the edited one, sent with the approval or written to
//! `modified_execution_plan.json` — without a new planning call and removes the saved plan;
//! "no" plans again, telling the model what was rejected, and asks again.
//!
//! The scripted LLM server runs in the test process; every probe connects to it over loopback,
//! so the requests of each process are counted by schema name in one place.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use peregrine_testkit::agent_fixture::{EXECUTION_PLAN, LlmCall, call_counts, weather_plan, weather_script, with_weather_replies};
use peregrine_testkit::{RecordedRequest, Reply, Script, ScriptedLlmServer};
use serde::Deserialize;
use serde_json::{Value, json};

const PROBE: &str = env!("CARGO_BIN_EXE_agent_probe");
const QUESTION: &str = "What's the weather in Prague?";
const REJECTED_MARKER: &str = "PREVIOUS PLAN REJECTED";

use LlmCall::{Classifier, CurrentWeather, Orchestrator, Respond, TaskExtraction};

#[derive(Debug, Clone, Deserialize)]
struct Interrupt {
    id: String,
    node: String,
    payload: Value,
}

/// What `agent_probe` prints.
#[derive(Debug, Deserialize)]
struct Outcome {
    status: String,
    response: Option<String>,
    interrupt: Option<Interrupt>,
    plan: Option<Value>,
    weather: BTreeMap<String, String>,
    has_error: Option<bool>,
}

impl Outcome {
    fn response(&self) -> &str {
        self.response.as_deref().unwrap_or_default()
    }

    fn interrupt(&self) -> &Interrupt {
        self.interrupt.as_ref().expect("an interrupted turn reports its interrupt")
    }
}

/// One scripted server in this process, a SQLite file and a data directory shared by every
/// probe process of a test.
struct Setup {
    server: ScriptedLlmServer,
    _dir: tempfile::TempDir,
    db: PathBuf,
    data_dir: PathBuf,
}

/// What one probe process did: its outcome and the LLM requests it made.
struct Step {
    outcome: Outcome,
    requests: Vec<RecordedRequest>,
}

impl Step {
    fn counts(&self) -> BTreeMap<LlmCall, usize> {
        call_counts(&self.requests)
    }

    fn requests_of(&self, call: LlmCall) -> Vec<&RecordedRequest> {
        self.requests.iter().filter(|request| LlmCall::of(request) == call).collect()
    }
}

fn counts(pairs: &[(LlmCall, usize)]) -> BTreeMap<LlmCall, usize> {
    pairs.iter().copied().collect()
}

/// The Prague plan, and a different one once the model is told the first was rejected.
fn revising_script() -> Script {
    let plans = Reply::from_fn(|request| {
        if request.prompt_text().contains(REJECTED_MARKER) {
            Reply::json(weather_plan("Prague", "prague_weather_revised"))
        } else {
            Reply::json(weather_plan("Prague", "prague_weather"))
        }
    });
    with_weather_replies(
        Script::new().on_schema(EXECUTION_PLAN, plans).on_schema("ApprovalResponse", Reply::json(json!({"approved": false}))),
    )
}

impl Setup {
    async fn start(script: Script) -> Self {
        let server = ScriptedLlmServer::start(script).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("checkpoints.sqlite");
        let data_dir = dir.path().join("agent_data");
        Self { server, _dir: dir, db, data_dir }
    }

    fn pending_dir(&self, thread: &str) -> PathBuf {
        self.data_dir.join("execution_plans").join("pending_plans").join(thread)
    }

    fn pending_file(&self, thread: &str) -> PathBuf {
        self.pending_dir(thread).join("pending_execution_plan.json")
    }

    /// Runs one probe process to its end (off the runtime, so the server keeps answering it).
    async fn probe(&self, thread: &str, verb: &str, argument: &str) -> Step {
        let seen = self.server.chat_requests().len();
        let args: Vec<String> = [self.db.to_str(), self.data_dir.to_str()]
            .into_iter()
            .map(|path| path.expect("UTF-8 temp path").to_owned())
            .chain([self.server.base_url(), thread.to_owned(), verb.to_owned(), argument.to_owned()])
            .collect();
        let output = tokio::task::spawn_blocking(move || Command::new(PROBE).args(&args).output())
            .await
            .expect("the probe task")
            .expect("the probe starts");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "agent_probe {verb} {argument:?} failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
        let outcome: Outcome = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| panic!("unreadable outcome {stdout:?}: {error}"));
        Step { outcome, requests: self.server.chat_requests().split_off(seen) }
    }

    async fn send(&self, thread: &str, text: &str) -> Step {
        self.probe(thread, "send", text).await
    }

    /// Starts a `/planning` turn in its own process, which must exit with the plan pending and
    /// saved; returns the pending interrupt.
    async fn plan(&self, thread: &str) -> Interrupt {
        let step = self.send(thread, &format!("/planning {QUESTION}")).await;
        assert_eq!(step.outcome.status, "interrupted", "{}", step.outcome.response());
        assert_eq!(step.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1)]), "planning makes one plan call");
        let shown = step.outcome.response();
        for expected in ["HUMAN APPROVAL REQUIRED", "**Execution plan** (2 steps)", "Get the current weather in Prague", "`yes`"] {
            assert!(shown.contains(expected), "the approval prompt lacks {expected:?}:\n{shown}");
        }
        let interrupt = step.outcome.interrupt().clone();
        assert_eq!(interrupt.node, "orchestrator");
        assert_eq!(interrupt.payload["approval_type"], "orchestrator_plan");
        assert_eq!(interrupt.payload["resume_payload"]["execution_plan"], weather_plan("Prague", "prague_weather"));
        let saved = read_json(&self.pending_file(thread));
        assert_eq!(saved["steps"], weather_plan("Prague", "prague_weather")["steps"], "the shown plan is saved");
        assert_eq!(saved["__metadata__"]["original_query"], QUESTION);
        assert_eq!(saved["__metadata__"]["thread_id"], thread);
        assert_eq!(step.outcome.plan, None, "no plan is installed before approval");
        interrupt
    }

    /// Checks that the approved plan ran: no planning, one location call and one answer, the
    /// weather stored under `key`, and the saved plans gone.
    fn assert_ran_without_planning(&self, thread: &str, step: &Step, key: &str, location: &str) {
        let outcome = &step.outcome;
        assert_eq!(outcome.status, "completed", "{}", outcome.response());
        assert_eq!(outcome.has_error, Some(false), "the turn ends without an error");
        assert_eq!(step.counts(), counts(&[(CurrentWeather, 1), (Respond, 1)]), "no new ExecutionPlan (or any other) call");
        assert_eq!(outcome.weather, BTreeMap::from([(key.to_owned(), location.to_owned())]), "the approved plan's step ran");
        let location_prompt = step.requests_of(CurrentWeather)[0].prompt_text();
        assert!(location_prompt.contains(&format!("Request: Get the current weather in {location}")), "{location_prompt}");
        assert!(outcome.response().contains(&format!("Weather in {location} on")), "the answer: {}", outcome.response());
        assert!(outcome.plan.as_ref().is_some_and(|plan| plan[0]["context_key"] == key), "installed plan: {:?}", outcome.plan);
        assert!(!self.pending_file(thread).exists() && !self.pending_dir(thread).join("modified_execution_plan.json").exists());
        assert!(!self.pending_dir(thread).exists(), "the empty pending folder is removed too");
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    serde_json::from_str(&text).expect("the saved plan is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yes_in_a_new_process_runs_the_approved_plan_without_planning_again() {
    let setup = Setup::start(weather_script()).await;
    setup.plan("approve").await;
    let step = setup.send("approve", "yes").await;
    setup.assert_ran_without_planning("approve", &step, "prague_weather", "Prague");
    assert!(step.outcome.interrupt.is_none(), "nothing is pending any more");

    // Planning mode was for that turn only: the next question, in yet another process, runs
    // straight through.
    let step = setup.send("approve", QUESTION).await;
    assert_eq!(step.outcome.status, "completed", "{}", step.outcome.response());
    assert_eq!(step.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 1)]));
    assert!(step.outcome.response().contains("Weather in Prague on"), "{}", step.outcome.response());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_request_in_a_new_process_plans_again_and_asks_again() {
    let setup = Setup::start(revising_script()).await;
    let first = setup.plan("reject").await;

    let step = setup.send("reject", "no, plan it another way").await;
    assert_eq!(step.outcome.status, "interrupted", "{}", step.outcome.response());
    assert_eq!(
        step.counts(),
        counts(&[(Orchestrator, 1), (LlmCall::Other, 1)]),
        "the words are read, then only a new plan; the task and classification stay"
    );
    let prompt = step.requests_of(Orchestrator)[0].prompt_text();
    assert!(
        prompt.contains(REJECTED_MARKER) && prompt.contains("Get the current weather in Prague"),
        "the rejected plan is shown: {prompt}"
    );
    let second = step.outcome.interrupt().clone();
    assert_ne!(second.id, first.id, "a new question");
    let revised = weather_plan("Prague", "prague_weather_revised");
    assert_eq!(second.payload["resume_payload"]["execution_plan"], revised);
    assert_eq!(read_json(&setup.pending_file("reject"))["steps"], revised["steps"], "the new plan is saved in place of the old");

    let step = setup.send("reject", "yes").await;
    setup.assert_ran_without_planning("reject", &step, "prague_weather_revised", "Prague");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_in_a_new_process_withdraws_the_plan() {
    let setup = Setup::start(revising_script()).await;
    setup.plan("withdraw").await;
    assert!(setup.pending_file("withdraw").exists());
    let step = setup.send("withdraw", "no").await;
    assert_eq!(step.outcome.status, "abandoned", "{}", step.outcome.response());
    assert!(step.outcome.response().starts_with("Cancelled: the execution plan was not run"), "{}", step.outcome.response());
    assert_eq!(step.counts(), counts(&[]), "no LLM call: nothing is planned or run");
    assert!(step.outcome.interrupt.is_none(), "nothing is pending any more");
    assert!(!setup.pending_file("withdraw").exists(), "the withdrawn plan is gone");
    // The thread is idle: the next message is a new turn that runs straight through.
    let step = setup.send("withdraw", QUESTION).await;
    assert_eq!(step.outcome.status, "completed", "{}", step.outcome.response());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_plan_sent_with_the_approval_runs_instead_without_planning() {
    let setup = Setup::start(weather_script()).await;
    setup.plan("edit").await;
    let edited = weather_plan("Berlin", "berlin_weather");
    let step = setup.probe("edit", "approve-edit", &edited.to_string()).await;
    setup.assert_ran_without_planning("edit", &step, "berlin_weather", "Berlin");
    assert_eq!(step.outcome.plan, Some(edited["steps"].clone()), "the edit is the plan that ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_plan_file_written_before_yes_runs_instead_without_planning() {
    let setup = Setup::start(weather_script()).await;
    let asked = setup.plan("edit-file").await;
    let dir = PathBuf::from(asked.payload["resume_payload"]["pending_plans_dir"].as_str().expect("the folder is named"));
    assert_eq!(dir, setup.pending_dir("edit-file"));
    assert!(setup.pending_file("edit-file").exists());
    let edited = json!({"__metadata__": {"edited_by": "plan editor"}, "steps": weather_plan("Vienna", "vienna_weather")["steps"]});
    std::fs::write(dir.join("modified_execution_plan.json"), edited.to_string()).expect("write the edit");

    let step = setup.send("edit-file", "yes").await;
    setup.assert_ran_without_planning("edit-file", &step, "vienna_weather", "Vienna");
    assert_eq!(step.outcome.plan, Some(edited["steps"].clone()), "the edited file is the plan that ran");
}

/// An edit is untrusted: one naming a capability that does not exist never runs; the agent
/// plans again with the problem in the prompt and asks again, and the new plan can be approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_edited_plan_is_not_run_and_a_new_plan_is_asked_for() {
    let setup = Setup::start(weather_script()).await;
    let first = setup.plan("bad-edit").await;
    let mut edited = weather_plan("Prague", "prague_weather");
    edited["steps"][0]["capability"] = json!("teleport");
    let step = setup.probe("bad-edit", "approve-edit", &edited.to_string()).await;
    assert_eq!(step.outcome.status, "interrupted", "{}", step.outcome.response());
    assert_eq!(step.counts(), counts(&[(Orchestrator, 1)]), "planned again; nothing of the edit ran");
    assert!(step.outcome.weather.is_empty(), "no step ran: {:?}", step.outcome.weather);
    let prompt = step.requests_of(Orchestrator)[0].prompt_text();
    assert!(prompt.contains("REPLANNING CONTEXT") && prompt.contains("teleport"), "the problem is in the prompt: {prompt}");
    let second = step.outcome.interrupt().clone();
    assert_ne!(second.id, first.id);
    assert_eq!(second.payload["resume_payload"]["execution_plan"], weather_plan("Prague", "prague_weather"));
    assert!(setup.pending_file("bad-edit").exists(), "the new plan is saved for approval");
    assert_eq!(step.outcome.has_error, Some(false), "the recovered error is not shown with the new question");

    let step = setup.send("bad-edit", "yes").await;
    setup.assert_ran_without_planning("bad-edit", &step, "prague_weather", "Prague");
}

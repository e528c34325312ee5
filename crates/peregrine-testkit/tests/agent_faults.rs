//! The LLM layer's fault matrix injected at each node of a whole weather turn (the real agent on
//! a SQLite file, every role on the scripted server, no transport retries): every turn ends
//! with either a recovered answer or the error node's report naming the failed step, each node
//! makes exactly the expected number of requests, the router waits the node's own backoff, and
//! the thread then answers a healthy second turn.
//!
//! One test per case, so the real backoff waits (task extraction 1 s ×1.5, classifier 1 s ×1.8,
//! orchestrator 2 s ×2, capabilities 0.5 s ×1.5, respond 1 s ×2) overlap instead of adding up.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use peregrine_agent::infra::error_node::FALLBACK_ANALYSIS;
use peregrine_agent::{Agent, Session, TurnOptions, TurnResult, TurnStatus};
use peregrine_core::events::EventKind;
use peregrine_core::{AgentEvent, RetryPolicy, Role};
use peregrine_graph::RunEvent;
use peregrine_testkit::agent_fixture::{
    ANALYSIS, LlmCall, PRAGUE_TASK, answer_reply, call_counts, extracted_task, location_reply, selection, weather_agent, weather_plan,
    with_weather_replies,
};
use peregrine_testkit::{Fault, RecordedRequest, Reply, Script, ScriptedLlmServer};
use serde_json::json;

const THREAD: &str = "faulty-thread";
/// The first turn's question; the report names it as the task when task extraction failed.
const USER_QUESTION: &str = "What's the weather in Prague?";
/// The provider's read timeout in the tests that inject `Fault::Timeout` (each costs this long).
const TIMEOUT_SECONDS: f64 = 1.0;
/// The provider's read timeout everywhere else: generous, so a loaded machine never times out.
const RELAXED_TIMEOUT_SECONDS: f64 = 30.0;
/// What every recovered answer contains: the mock service's reading for Prague.
const PRAGUE_WEATHER: &str = "Weather in Prague on";

use LlmCall::{Classifier, CurrentWeather, ErrorAnalysis, Orchestrator, Respond, TaskExtraction};

/// One request per node: a healthy weather turn.
const HEALTHY: [(LlmCall, usize); 5] = [(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 1)];

/// The agent on a server whose faulty rules apply until the harness turns healthy.
struct Harness {
    server: ScriptedLlmServer,
    healthy: Arc<AtomicBool>,
    agent: Agent,
    _dir: tempfile::TempDir,
}

/// What one turn did.
struct Turn {
    result: TurnResult,
    /// The turn's chat requests.
    requests: Vec<RecordedRequest>,
    /// Node executions, by node.
    started: BTreeMap<String, usize>,
    /// Backoff waits the router scheduled, in order.
    waits: Vec<(String, Duration)>,
    /// What respond streamed: `Some(token)` per token, `None` where an attempt failed.
    respond_stream: Vec<Option<String>>,
}

impl Turn {
    fn counts(&self) -> BTreeMap<LlmCall, usize> {
        call_counts(&self.requests)
    }

    fn response(&self) -> &str {
        self.result.response.as_deref().unwrap_or_default()
    }

    fn requests_of(&self, call: LlmCall) -> Vec<&RecordedRequest> {
        self.requests.iter().filter(|request| LlmCall::of(request) == call).collect()
    }
}

fn counts(pairs: &[(LlmCall, usize)]) -> BTreeMap<LlmCall, usize> {
    pairs.iter().copied().filter(|(_, count)| *count > 0).collect()
}

fn started(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(node, count)| ((*node).to_owned(), *count)).collect()
}

/// The waits before `retries` retries of `node` under its `policy`.
fn backoff(node: &str, policy: RetryPolicy, retries: u32) -> Vec<(String, Duration)> {
    (1..=retries).map(|failures| (node.to_owned(), policy.delay_after(failures))).collect()
}

/// `current_weather`'s policy (upstream's capability default): 3 attempts, 0.5 s, ×1.5.
fn weather_policy() -> RetryPolicy {
    RetryPolicy::capability_default()
}

/// Respond's policy: 3 attempts, 1 s, ×2.
fn respond_policy() -> RetryPolicy {
    RetryPolicy::new(3, 1.0, 2.0)
}

/// The node executions of a healthy turn.
const HEALTHY_NODES: [(&str, usize); 5] =
    [("task_extraction", 1), ("classifier", 1), ("orchestrator", 1), ("current_weather", 1), ("respond", 1)];

impl Harness {
    /// Starts the server with `faults` (each applies to its call while the harness is faulty)
    /// in front of the healthy weather replies, and the agent on a fresh SQLite file.
    async fn start(faults: Vec<(LlmCall, Reply)>) -> Self {
        Self::start_with_timeout(faults, RELAXED_TIMEOUT_SECONDS).await
    }

    /// Like [`Harness::start`] with a 1 s provider timeout, for `Fault::Timeout`.
    async fn start_timing_out(faults: Vec<(LlmCall, Reply)>) -> Self {
        Self::start_with_timeout(faults, TIMEOUT_SECONDS).await
    }

    async fn start_with_timeout(faults: Vec<(LlmCall, Reply)>, timeout_seconds: f64) -> Self {
        let healthy = Arc::new(AtomicBool::new(false));
        let mut script = Script::new();
        for (call, reply) in faults {
            let flag = Arc::clone(&healthy);
            script = script.on_request(move |request| !flag.load(Ordering::SeqCst) && LlmCall::of(request) == call, reply);
        }
        let server = ScriptedLlmServer::start(with_weather_replies(script)).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let agent = weather_agent(&server.base_url(), timeout_seconds, &dir.path().join("checkpoints.sqlite"), &dir.path().join("data"))
            .await
            .expect("agent");
        Self { server, healthy, agent, _dir: dir }
    }

    async fn turn(&self, text: &str) -> Turn {
        let seen = self.server.chat_requests().len();
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<RunEvent<AgentEvent>>();
        let options = TurnOptions { events: Some(sender), ..TurnOptions::default() };
        let result = self.agent.send(THREAD, text, &Session::new("ada", "cli"), options).await.expect("the turn runs");
        let mut started = BTreeMap::new();
        let mut waits = Vec::new();
        let mut respond_stream = Vec::new();
        while let Ok(event) = receiver.try_recv() {
            match event {
                RunEvent::NodeStarted { node, .. } => *started.entry(node).or_insert(0) += 1,
                RunEvent::Waiting { node, delay } => waits.push((node, delay)),
                RunEvent::Custom(AgentEvent { component, kind, .. }) if component == "respond" => match kind {
                    EventKind::LlmToken { content, .. } => respond_stream.push(Some(content)),
                    EventKind::LlmResponse { success: false, .. } => respond_stream.push(None),
                    _ => {}
                },
                _ => {}
            }
        }
        Turn { result, requests: self.server.chat_requests().split_off(seen), started, waits, respond_stream }
    }

    /// The first turn, with the faults in place.
    async fn faulty_turn(&self) -> Turn {
        self.turn(USER_QUESTION).await
    }

    /// Turns the faults off and checks that the same thread answers the next question with one
    /// request per node and keeps the whole conversation.
    async fn assert_thread_usable(&self) {
        self.healthy.store(true, Ordering::SeqCst);
        let turn = self.turn("And now? Is it still the same in Prague?").await;
        assert_eq!(turn.result.status, TurnStatus::Completed, "second turn: {:?}", turn.result.response);
        assert!(turn.response().contains(PRAGUE_WEATHER), "second turn: {}", turn.response());
        assert_eq!(turn.counts(), counts(&HEALTHY), "second turn requests");
        assert_eq!(turn.started, started(&HEALTHY_NODES), "second turn nodes");
        assert!(turn.waits.is_empty(), "second turn waits: {:?}", turn.waits);
        let state = turn.result.state.expect("state");
        assert!(!state.control.has_error && state.control.retry_count == 0, "errors cleared: {:?}", state.control);
        let roles: Vec<Role> = state.messages.iter().map(|message| message.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User, Role::Assistant], "both turns are in the history");
    }
}

/// Checks a recovered turn: completed with the Prague answer, one assistant message.
fn assert_recovered(turn: &Turn) {
    assert_eq!(turn.result.status, TurnStatus::Completed, "{:?}", turn.result.response);
    assert!(turn.response().starts_with("Here is the current weather. Weather in Prague on"), "{}", turn.response());
    let state = turn.result.state.as_ref().expect("state");
    let answers = state.messages.iter().filter(|message| message.role == Role::Assistant).count();
    assert_eq!(answers, 1, "only the final answer is stored");
    assert!(!state.control.has_error, "the recovered error is cleared");
}

/// Checks a failed turn: the error node's report names `severity`, `task`, the failed
/// operation and `capability`, followed by `analysis`.
fn assert_report(turn: &Turn, severity: &str, task: &str, operation: &str, capability: &str, analysis: &str) {
    assert_eq!(turn.result.status, TurnStatus::Failed, "{:?}", turn.result.response);
    let report = turn.response();
    for expected in [
        "⚠️ **ERROR REPORT** - ".to_owned(),
        format!("**Error Severity:** {severity}"),
        format!("**Task:** {task}"),
        format!("**Failed Operation:** {operation}\n"),
        format!("**Capability:** {capability}\n"),
        "**Previous Execution Error:**".to_owned(),
        "**Execution Stats:**".to_owned(),
        format!("**Analysis:** {analysis}"),
    ] {
        assert!(report.contains(&expected), "the report lacks {expected:?}:\n{report}");
    }
    let state = turn.result.state.as_ref().expect("state");
    assert_eq!(state.messages.last().map(|message| message.role), Some(Role::Assistant));
}

// --- task extraction -------------------------------------------------------------------------

#[tokio::test]
async fn task_extraction_timeout_once_is_retried_and_recovers() {
    let reply = Reply::json(extracted_task(PRAGUE_TASK)).after_faults(vec![Fault::Timeout]);
    let harness = Harness::start_timing_out(vec![(TaskExtraction, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 2), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 1)]));
    assert_eq!(turn.started["task_extraction"], 2, "the node ran twice");
    assert_eq!(turn.waits, backoff("task_extraction", RetryPolicy::task_extraction(), 1));
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn task_extraction_failing_every_time_exhausts_its_retries_into_a_report() {
    let harness = Harness::start(vec![(TaskExtraction, Reply::fault(Fault::Status500))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "RETRIABLE", USER_QUESTION, "task_extraction", "task_extraction (infrastructure node)", ANALYSIS);
    assert!(turn.response().contains("LLM role 'task_extraction' via vllm"), "{}", turn.response());
    assert!(turn.response().contains("The failed operation ran 3 times: the agent retried it 2 times"), "{}", turn.response());
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 3), (ErrorAnalysis, 1)]));
    assert_eq!(turn.started, started(&[("task_extraction", 3), ("error", 1)]));
    assert_eq!(turn.waits, backoff("task_extraction", RetryPolicy::task_extraction(), 2));
    let analysis = &turn.requests_of(ErrorAnalysis)[0];
    assert!(analysis.prompt_text().contains("- Failed operation: task_extraction"), "the analysis is told what failed");
    harness.assert_thread_usable().await;
}

/// A CRITICAL fault goes straight to the report, and a failing analysis call still gives one.
#[tokio::test]
async fn task_extraction_refused_key_reports_at_once_even_when_the_analysis_call_fails() {
    let faults = vec![(TaskExtraction, Reply::fault(Fault::Unauthorized)), (ErrorAnalysis, Reply::fault(Fault::Timeout))];
    let harness = Harness::start_timing_out(faults).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "CRITICAL", USER_QUESTION, "task_extraction", "task_extraction (infrastructure node)", FALLBACK_ANALYSIS);
    assert!(turn.response().contains("api.providers.vllm.api_key"), "the report says what to fix: {}", turn.response());
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (ErrorAnalysis, 1)]), "no retries of a CRITICAL fault");
    assert_eq!(turn.started, started(&[("task_extraction", 1), ("error", 1)]));
    assert!(turn.waits.is_empty());
    harness.assert_thread_usable().await;
}

// --- classifier ------------------------------------------------------------------------------

#[tokio::test]
async fn classifier_server_error_once_is_retried_and_recovers() {
    let reply = Reply::json(selection(&["current_weather"])).after_faults(vec![Fault::Status500]);
    let harness = Harness::start(vec![(Classifier, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 2), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 1)]));
    assert_eq!(turn.started["classifier"], 2);
    assert_eq!(turn.waits, backoff("classifier", RetryPolicy::classifier(), 1));
    harness.assert_thread_usable().await;
}

/// A rate limit is transient: the node retries on its own backoff (the provider's Retry-After
/// only paces transport retries, which are off here) until its four attempts are used up.
#[tokio::test]
async fn classifier_rate_limited_every_time_exhausts_its_retries_into_a_report() {
    let harness = Harness::start(vec![(Classifier, Reply::fault(Fault::RateLimited { retry_after_secs: 1 }))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "RETRIABLE", PRAGUE_TASK, "classifier", "classifier (infrastructure node)", ANALYSIS);
    assert!(
        turn.response().contains("rate limited (429)")
            && turn.response().contains("The failed operation ran 4 times: the agent retried it 3 times"),
        "{}",
        turn.response()
    );
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 4), (ErrorAnalysis, 1)]));
    assert_eq!(turn.started, started(&[("task_extraction", 1), ("classifier", 4), ("error", 1)]));
    assert_eq!(turn.waits, backoff("classifier", RetryPolicy::classifier(), 3));
    let state = turn.result.state.as_ref().expect("state");
    assert_eq!(state.control.reclassification_count, 0, "retries are not re-classifications");
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn classifier_refused_key_is_critical_and_reported_without_retries() {
    let harness = Harness::start(vec![(Classifier, Reply::fault(Fault::Unauthorized))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "CRITICAL", PRAGUE_TASK, "classifier", "classifier (infrastructure node)", ANALYSIS);
    assert!(turn.response().contains("The failed operation ran once; it was not retried."), "{}", turn.response());
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (ErrorAnalysis, 1)]));
    assert_eq!(turn.started, started(&[("task_extraction", 1), ("classifier", 1), ("error", 1)]));
    assert!(turn.waits.is_empty());
    harness.assert_thread_usable().await;
}

// --- orchestrator ----------------------------------------------------------------------------

#[tokio::test]
async fn orchestrator_malformed_response_body_is_retried_and_recovers() {
    let reply = Reply::json(weather_plan("Prague", "prague_weather")).after_faults(vec![Fault::MalformedJson]);
    let harness = Harness::start(vec![(Orchestrator, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 2), (CurrentWeather, 1), (Respond, 1)]));
    assert_eq!(turn.started["orchestrator"], 2);
    assert_eq!(turn.waits, backoff("orchestrator", RetryPolicy::orchestrator(), 1));
    let state = turn.result.state.as_ref().expect("state");
    assert_eq!(state.control.planning_attempts, 1, "a transient failure does not use up a planning attempt");
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn orchestrator_refused_key_is_critical_and_reported_without_retries() {
    let harness = Harness::start(vec![(Orchestrator, Reply::fault(Fault::Unauthorized))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "CRITICAL", PRAGUE_TASK, "orchestrator", "orchestrator (infrastructure node)", ANALYSIS);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (ErrorAnalysis, 1)]));
    assert!(turn.waits.is_empty(), "a refused key is not retried");
    harness.assert_thread_usable().await;
}

/// Invalid output is fed back once inside the call; still invalid, the node fails RETRIABLE and
/// its retry gets a valid plan.
#[tokio::test]
async fn orchestrator_invalid_plan_output_is_fed_back_then_retried_and_recovers() {
    let reply = Reply::sequence(vec![
        Reply::text("First check the weather, then answer."),
        Reply::json(json!({"steps": "current_weather then respond"})),
        Reply::json(weather_plan("Prague", "prague_weather")),
    ]);
    let harness = Harness::start(vec![(Orchestrator, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 3), (CurrentWeather, 1), (Respond, 1)]));
    assert_eq!(turn.started["orchestrator"], 2, "two answers in the first run, one in the retry");
    assert_eq!(turn.waits, backoff("orchestrator", RetryPolicy::orchestrator(), 1));
    let plans = turn.requests_of(Orchestrator);
    let feedback = plans[1].last_message().unwrap_or_default();
    assert!(feedback.contains("Your answer could not be used"), "the problem is fed back: {feedback}");
    assert!(!plans[2].prompt_text().contains("Your answer could not be used"), "the node's retry starts a fresh call");
    harness.assert_thread_usable().await;
}

// --- current_weather (a capability) ----------------------------------------------------------

#[tokio::test]
async fn capability_server_error_once_is_retried_and_recovers() {
    let reply = location_reply().after_faults(vec![Fault::Status500]);
    let harness = Harness::start(vec![(CurrentWeather, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 2), (Respond, 1)]));
    assert_eq!(turn.started["current_weather"], 2);
    assert_eq!(turn.waits, backoff("current_weather", weather_policy(), 1));
    harness.assert_thread_usable().await;
}

/// Unparseable output (LLM layer) and a parseable but unusable location (the capability's own
/// validation) are both RETRIABLE; the third run gets a valid answer.
#[tokio::test]
async fn capability_invalid_output_and_invalid_location_are_retried_and_recover() {
    let reply = Reply::sequence(vec![
        Reply::text("The user is asking about Prague."),
        Reply::text("Prague"),
        Reply::json(json!({"location": "Prague\nCzech Republic"})),
        location_reply(),
    ]);
    let harness = Harness::start(vec![(CurrentWeather, reply)]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 4), (Respond, 1)]));
    assert_eq!(turn.started["current_weather"], 3);
    assert_eq!(turn.waits, backoff("current_weather", weather_policy(), 2));
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn capability_failing_every_time_is_reported_with_its_step() {
    let harness = Harness::start(vec![(CurrentWeather, Reply::fault(Fault::Status(503)))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "RETRIABLE", PRAGUE_TASK, "Get the current weather in Prague (step 1 of 2)", "current_weather", ANALYSIS);
    assert!(turn.response().contains("the provider failed (503)"), "{}", turn.response());
    assert!(turn.response().contains("❌ Step 1: Get the current weather in Prague (current_weather) - Failed"), "{}", turn.response());
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 3), (ErrorAnalysis, 1)]));
    assert_eq!(turn.started["current_weather"], 3);
    assert!(!turn.started.contains_key("respond"));
    assert_eq!(turn.waits, backoff("current_weather", weather_policy(), 2));
    harness.assert_thread_usable().await;
}

// --- respond (streamed) ----------------------------------------------------------------------

#[tokio::test]
async fn respond_stream_cut_mid_answer_is_retried_and_the_partial_answer_is_dropped() {
    let cut = Reply::text("The weather in Prague is currently rather").with_fault(Fault::TruncatedStream { after_chunks: 3 });
    let harness = Harness::start(vec![(Respond, Reply::sequence(vec![cut, answer_reply()]))]).await;
    let turn = harness.faulty_turn().await;
    assert_recovered(&turn);
    assert!(!turn.response().contains("rather"), "the cut answer is not kept: {}", turn.response());
    // Tokens of the cut attempt reached the interface, then a failed response that tells it to
    // drop them; the retry streams the whole answer.
    let failed_at = turn.respond_stream.iter().position(Option::is_none).expect("the failed attempt is announced");
    let streamed = |tokens: &[Option<String>]| tokens.iter().flatten().cloned().collect::<String>();
    let cut_tokens = streamed(&turn.respond_stream[..failed_at]);
    assert!(!cut_tokens.is_empty(), "the cut attempt streamed something before it broke");
    assert!("The weather ".starts_with(&cut_tokens), "only what was sent before the cut: {cut_tokens:?}");
    assert_eq!(streamed(&turn.respond_stream[failed_at + 1..]), turn.response());
    assert_eq!(turn.counts(), counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 2)]));
    assert!(turn.requests_of(Respond).iter().all(|request| request.stream), "respond streams");
    assert_eq!(turn.started["respond"], 2);
    assert_eq!(turn.waits, backoff("respond", respond_policy(), 1));
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn respond_stream_ending_early_every_time_is_reported_with_its_step() {
    let early = Reply::text("The weather in Prague is currently rather").with_fault(Fault::StreamEndsEarly { after_chunks: 2 });
    let harness = Harness::start(vec![(Respond, early)]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "RETRIABLE", PRAGUE_TASK, "Tell the user the current weather in Prague (step 2 of 2)", "respond", ANALYSIS);
    assert!(turn.response().contains("✅ Step 1: Get the current weather in Prague (current_weather)"), "{}", turn.response());
    assert_eq!(
        turn.counts(),
        counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 3), (ErrorAnalysis, 1)])
    );
    assert_eq!(turn.started["respond"], 3);
    assert_eq!(turn.waits, backoff("respond", respond_policy(), 2));
    harness.assert_thread_usable().await;
}

#[tokio::test]
async fn respond_refused_key_is_critical_and_reported_without_retries() {
    let harness = Harness::start(vec![(Respond, Reply::fault(Fault::Unauthorized))]).await;
    let turn = harness.faulty_turn().await;
    assert_report(&turn, "CRITICAL", PRAGUE_TASK, "Tell the user the current weather in Prague (step 2 of 2)", "respond", ANALYSIS);
    assert_eq!(
        turn.counts(),
        counts(&[(TaskExtraction, 1), (Classifier, 1), (Orchestrator, 1), (CurrentWeather, 1), (Respond, 1), (ErrorAnalysis, 1)])
    );
    assert!(turn.waits.is_empty());
    harness.assert_thread_usable().await;
}

//! Whole turns through the real agent (gateway, router, every framework node, SQLite
//! checkpoints) against the scripted OpenAI-compatible LLM server: the weather scenario in both
//! classifier modes, context reuse across turns, planning mode, direct chat, the bypass
//! commands, approval detection, the error report, memory with approval and data source, and a
//! REPLANNING recovery — reference §8.2 cases 8, 11–14 and 20–22.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::path::PathBuf;
use std::sync::Arc;

use hello_world_weather::register as register_weather;
use peregrine_agent::{
    Agent, AgentError, AgentSettings, ApprovalOutcome, ApprovalRef, ApprovalReply, ClassifierMode, PromptOverrides, Services, Session,
    TurnOptions, TurnResult, TurnStatus,
};
use peregrine_capabilities::{MemoryCapability, MemoryStore, TimeRangeCapability, UserMemoryDataSource};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_core::state::Role;
use peregrine_core::{
    AgentStateUpdate, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, Message, Registry,
};
use peregrine_graph::RunError;
use peregrine_llm::{LlmClient, LlmConfig, ModelConfig, ProviderConfig, Secret};
use peregrine_testkit::llm_server::{Fault, RecordedRequest, Reply, Script, ScriptedLlmServer};
use serde_json::{Value, json};

/// A capability you can talk to directly (`/chat:echo`); it answers without an LLM.
struct Echo(CapabilitySpec);

impl Echo {
    fn new() -> Self {
        let mut spec = CapabilitySpec::new("echo", "Repeats what you say");
        spec.direct_chat_enabled = true;
        Self(spec)
    }
}

impl Capability for Echo {
    fn spec(&self) -> &CapabilitySpec {
        &self.0
    }
    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let text = input.state.user_query().unwrap_or_default();
        let commands: Vec<String> = input.state.capability_slash_commands.iter().map(|(name, value)| format!(" /{name}={value}")).collect();
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(format!("echo: {text}{}", commands.concat())))))
    }
}

struct Harness {
    server: ScriptedLlmServer,
    agent: Agent,
    data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

fn llm_config(base_url: &str) -> LlmConfig {
    let mut config = LlmConfig::default();
    config.providers.insert(
        "scripted".into(),
        ProviderConfig {
            api_key: Some(Secret::new("sk-test")),
            base_url: Some(base_url.to_owned()),
            timeout_seconds: Some(10.0),
            max_retries: Some(0),
            protocol: Some("openai".into()),
            ..ProviderConfig::default()
        },
    );
    config.models.insert(
        "default".into(),
        ModelConfig { provider: "scripted".into(), model_id: "scripted-model".into(), max_tokens: None, temperature: None },
    );
    config
}

async fn harness(script: Script, mode: ClassifierMode) -> Harness {
    harness_with(script, mode, |_| {}, hello_world_weather::prompts::prompt_overrides()).await
}

/// The facility clock of the time-range capability: 2026-03-10 12:00 UTC.
fn fixed_now() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339("2026-03-10T12:00:00Z").expect("valid").with_timezone(&chrono::Utc)
}

async fn harness_with(
    script: Script,
    mode: ClassifierMode,
    configure: impl FnOnce(&mut AgentSettings),
    prompts: PromptOverrides,
) -> Harness {
    let server = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("agent_data");
    let llm = LlmClient::from_config(llm_config(&server.base_url())).expect("client");
    let settings = AgentSettings {
        agent_data_dir: data_dir.clone(),
        timezone: chrono_tz::America::Los_Angeles,
        classifier_mode: mode,
        ..AgentSettings::default()
    };
    let mut settings = settings;
    configure(&mut settings);
    let services = Services::new(Arc::new(llm), settings);
    let store = MemoryStore::new(&data_dir);
    let mut registry = Registry::new();
    register_weather(&mut registry, &services).expect("weather");
    registry.register(MemoryCapability::new(services.clone(), store.clone())).expect("memory");
    registry.register(TimeRangeCapability::new(services.clone()).with_clock(fixed_now)).expect("time range");
    registry.register(Echo::new()).expect("echo");
    let checkpointer = SqliteCheckpointer::open(dir.path().join("agent.db")).await.expect("sqlite");
    let agent = Agent::builder(registry, services)
        .checkpointer(Arc::new(checkpointer))
        .data_source(Arc::new(UserMemoryDataSource::new(store)))
        .prompts(prompts)
        .build()
        .expect("agent");
    Harness { server, agent, data_dir, _dir: dir }
}

impl Harness {
    async fn send(&self, thread: &str, text: &str) -> TurnResult {
        self.agent.send(thread, text, &Session::new("ada", "cli"), TurnOptions::default()).await.expect("the message is handled")
    }

    fn calls(&self, schema: &str) -> Vec<RecordedRequest> {
        self.server.chat_requests().into_iter().filter(|request| request.schema_name.as_deref() == Some(schema)).collect()
    }

    fn plain_calls(&self) -> Vec<RecordedRequest> {
        self.server.chat_requests().into_iter().filter(|request| request.schema_name.is_none()).collect()
    }

    fn pending_plan(&self, thread: &str) -> PathBuf {
        self.data_dir.join("execution_plans").join("pending_plans").join(thread).join("pending_execution_plan.json")
    }
}

fn extracted(task: &str, history: bool) -> Reply {
    Reply::json(json!({"task": task, "depends_on_chat_history": history, "depends_on_user_memory": false}))
}

fn selection(names: &[&str]) -> Reply {
    Reply::json(json!({"reasoning": "scripted", "selected": names}))
}

fn weather_plan(location: &str, key: &str) -> Value {
    json!({"steps": [
        {"context_key": key, "capability": "current_weather", "task_objective": format!("Get the current weather in {location}"),
         "success_criteria": "weather retrieved", "expected_output": "CURRENT_WEATHER", "inputs": []},
        {"context_key": "answer", "capability": "respond", "task_objective": "Tell the user the weather",
         "success_criteria": "answered", "expected_output": "user_response", "inputs": [{"CURRENT_WEATHER": key}]}
    ]})
}

/// The weather scenario's script; `respond` is the only plain call.
fn weather_script() -> Script {
    Script::new()
        .on_schema("ExtractedTask", extracted("Get the current weather in Prague", false))
        .on_schema("CapabilitySelection", selection(&["current_weather"]))
        .on_schema("ExecutionPlan", Reply::json(weather_plan("Prague", "weather_prague")))
        .on_schema("LocationExtraction", Reply::json(json!({"location": "Prague"})))
        .on_plain(Reply::text("It is mild and rainy in Prague right now."))
}

fn last_prompt(requests: &[RecordedRequest]) -> String {
    requests.last().map(RecordedRequest::prompt_text).unwrap_or_default()
}

#[tokio::test]
async fn the_weather_turn_runs_every_node_once_in_batched_mode() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let result = h.send("t", "What's the weather in Prague?").await;
    assert_eq!(result.status, TurnStatus::Completed, "{:?}", result.response);
    assert_eq!(result.response.as_deref(), Some("It is mild and rainy in Prague right now."));
    for schema in ["ExtractedTask", "CapabilitySelection", "ExecutionPlan", "LocationExtraction"] {
        assert_eq!(h.calls(schema).len(), 1, "{schema}");
    }
    let task_prompt = last_prompt(&h.calls("ExtractedTask"));
    assert!(task_prompt.contains("weather assistant task extraction specialist"), "the application's prompt override is used");
    let respond = h.plain_calls();
    assert_eq!(respond.len(), 1);
    assert!(respond[0].stream, "respond streams its answer");
    let respond_prompt = respond[0].prompt_text();
    assert!(respond_prompt.contains("Weather in Prague"), "respond sees the weather context: {respond_prompt}");
    // The plan schema only offers what the classifier activated.
    let plan_schema = h.calls("ExecutionPlan")[0].schema.clone().expect("native schema");
    let text = plan_schema.to_string();
    assert!(text.contains("current_weather") && text.contains("respond") && !text.contains("time_range_parsing"), "{text}");
    let state = result.state.expect("state");
    assert!(state.capability_context_data.contains("CURRENT_WEATHER", "weather_prague"));
    assert_eq!(state.messages.iter().filter(|message| message.role == Role::Assistant).count(), 1);
}

#[tokio::test]
async fn acceptance_case_11_per_capability_mode_asks_once_per_guided_capability() {
    let script = weather_script().on_schema(
        "CapabilityMatch",
        Reply::from_fn(|request| {
            // The weather capability's classifier instructions, and nothing else's.
            let about_weather = request.prompt_text().contains("requires current weather information for a specific location");
            Reply::json(json!({"is_match": about_weather}))
        }),
    );
    let h = harness(script, ClassifierMode::PerCapability).await;
    let result = h.send("t", "What's the weather in Prague?").await;
    assert_eq!(result.status, TurnStatus::Completed, "{:?}", result.response);
    // current_weather, memory and time_range_parsing have classifier guides; respond, clarify
    // (always active) and echo (no guide) are never asked about.
    assert_eq!(h.calls("CapabilityMatch").len(), 3);
    assert!(h.calls("CapabilitySelection").is_empty());
    let active = &result.state.expect("state").planning.active_capabilities;
    assert_eq!(active, &["current_weather", "respond", "clarify"], "exactly the matched capability plus the always-active ones");
}

#[tokio::test]
async fn context_from_turn_one_is_reused_in_turn_two() {
    let script = Script::new()
        .on_schema(
            "ExtractedTask",
            Reply::sequence(vec![
                extracted("Get the current weather in Prague", false),
                extracted("Decide whether an umbrella is needed in Prague given the current weather", true),
            ]),
        )
        .on_schema("CapabilitySelection", Reply::sequence(vec![selection(&["current_weather"]), selection(&[])]))
        .on_schema(
            "ExecutionPlan",
            // Like a model: reuse the stored weather when the prompt offers it, else fetch it.
            Reply::from_fn(|request| {
                if request.prompt_text().contains("{\"CURRENT_WEATHER\": \"weather_prague\"}") {
                    Reply::json(json!({"steps": [{"context_key": "advice", "capability": "respond",
                        "task_objective": "Advise on the umbrella from the stored weather", "success_criteria": "answered",
                        "inputs": [{"CURRENT_WEATHER": "weather_prague"}]}]}))
                } else {
                    Reply::json(weather_plan("Prague", "weather_prague"))
                }
            }),
        )
        .on_schema("LocationExtraction", Reply::json(json!({"location": "Prague"})))
        .on_plain(Reply::sequence(vec![Reply::text("Mild and rainy in Prague."), Reply::text("Yes, take an umbrella.")]));
    let h = harness(script, ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "What's the weather in Prague?").await.status, TurnStatus::Completed);
    let second = h.send("t", "Should I take an umbrella there?").await;
    assert_eq!(second.status, TurnStatus::Completed, "{:?}", second.response);
    assert_eq!(second.response.as_deref(), Some("Yes, take an umbrella."));
    assert_eq!(h.calls("LocationExtraction").len(), 1, "turn 2 reuses the stored weather instead of fetching it again");
    let planning = last_prompt(&h.calls("ExecutionPlan"));
    assert!(planning.contains("{\"CURRENT_WEATHER\": \"weather_prague\"}"), "the planner sees the stored context: {planning}");
    assert!(planning.contains("What's the weather in Prague?"), "the planner sees the history when the task depends on it");
    let task_prompt = last_prompt(&h.calls("ExtractedTask"));
    assert!(task_prompt.contains("Mild and rainy in Prague."), "task extraction sees the earlier answer");
    let respond = last_prompt(&h.plain_calls());
    assert!(respond.contains("Weather in Prague"), "respond gets the turn-1 data in turn 2: {respond}");
}

#[tokio::test]
async fn acceptance_case_14_planning_mode_asks_then_runs_the_saved_plan() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let asked = h.send("t", "/planning What's the weather in Prague?").await;
    assert_eq!(asked.status, TurnStatus::Interrupted);
    let prompt = asked.response.clone().expect("the plan is shown");
    assert!(prompt.contains("HUMAN APPROVAL REQUIRED") && prompt.contains("current_weather"), "{prompt}");
    let interrupt = asked.interrupt.clone().expect("pending");
    assert_eq!(interrupt.payload["resume_payload"]["approval_type"], "orchestrator_plan");
    assert!(h.pending_plan("t").exists(), "pending_execution_plan.json is written");
    assert!(h.calls("LocationExtraction").is_empty(), "nothing runs before the approval");

    let done = h.send("t", "yes").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.calls("ExecutionPlan").len(), 1, "the approved plan runs without a new planning call");
    assert_eq!(h.calls("LocationExtraction").len(), 1);
    assert!(!h.pending_plan("t").exists(), "the pending plan is removed once used");
    assert!(h.calls("ApprovalResponse").is_empty(), "'yes' needs no LLM");
}

#[tokio::test]
async fn acceptance_case_14_a_rejected_plan_is_replanned_and_asked_again() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "/planning What's the weather in Prague?").await.status, TurnStatus::Interrupted);
    // A change request (not a bare "no", which withdraws the plan) is read as a rejection.
    let again = h.send("t", "no, plan it another way").await;
    assert_eq!(again.approval.as_ref().map(|answered| answered.outcome), Some(ApprovalOutcome::Rejected));
    assert_eq!(again.status, TurnStatus::Interrupted, "planning mode is still on for the turn");
    assert_eq!(h.calls("ExecutionPlan").len(), 2);
    assert!(last_prompt(&h.calls("ExecutionPlan")).contains("REJECTED"), "the planner is told the plan was rejected");
    assert!(h.calls("LocationExtraction").is_empty(), "a rejected plan never runs");
}

#[tokio::test]
async fn no_or_cancel_withdraws_a_pending_plan_and_the_thread_is_idle() {
    for word in ["no", "Cancel"] {
        let h = harness(weather_script(), ClassifierMode::Batched).await;
        let asked = h.send("t", "/planning What's the weather in Prague?").await;
        let interrupt = asked.interrupt.clone().expect("pending");
        assert!(h.pending_plan("t").exists());
        let withdrawn = h.send("t", word).await;
        assert_eq!(withdrawn.status, TurnStatus::Abandoned, "{word}: {:?}", withdrawn.response);
        let answered = withdrawn.approval.clone().expect("the result says how the approval was answered");
        assert_eq!((answered.interrupt_id.as_str(), answered.outcome), (interrupt.id.as_str(), ApprovalOutcome::Abandoned));
        assert!(withdrawn.response.as_deref().is_some_and(|text| text.starts_with("Cancelled: the execution plan was not run")));
        assert_eq!(h.calls("ExecutionPlan").len(), 1, "{word}: no new plan is made");
        assert!(h.calls("LocationExtraction").is_empty(), "{word}: nothing of the plan runs");
        assert!(h.calls("ApprovalResponse").is_empty(), "{word}: a keyword needs no LLM");
        assert!(!h.pending_plan("t").exists(), "{word}: the withdrawn plan cannot be approved later");
        let thread = h.agent.thread("t").await.expect("read").expect("exists");
        assert_eq!(thread.status, peregrine_agent::ThreadStatus::Idle, "{word}: nothing pending, nothing to continue");
        let said: Vec<(Role, String)> = thread.state().messages.iter().map(|message| (message.role, message.content.clone())).collect();
        let n = said.len();
        assert_eq!(said[n - 2], (Role::User, word.to_owned()), "{word}: recorded in the history");
        assert!(said[n - 1].0 == Role::Assistant && said[n - 1].1.starts_with("Cancelled:"), "{said:?}");
        // An answer to the withdrawn question is refused; the next message is a new turn.
        let late =
            h.agent.answer_approval("t", &ApprovalRef::to(&interrupt), ApprovalReply::Approve { edit: None }, TurnOptions::default()).await;
        assert!(matches!(late, Err(AgentError::Run(peregrine_graph::RunError::NothingToResume { .. }))), "{late:?}");
        let continued = h.agent.continue_turn("t", TurnOptions::default()).await;
        assert!(matches!(continued, Err(AgentError::NothingToContinue(peregrine_agent::NothingToContinue::Finished))), "{continued:?}");
        let next = h.send("t", "What's the weather in Prague?").await;
        assert_eq!(next.status, TurnStatus::Completed, "{word}: {:?}", next.response);
        assert_eq!(h.calls("LocationExtraction").len(), 1);
    }
}

#[tokio::test]
async fn an_api_withdrawal_is_bound_to_the_question_shown() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let interrupt = h.send("t", "/planning What's the weather in Prague?").await.interrupt.expect("pending");
    let stale = ApprovalRef { interrupt_id: "another".into(), digest: None };
    let refused = h.agent.answer_approval("t", &stale, ApprovalReply::Abandon, TurnOptions::default()).await;
    assert!(matches!(refused, Err(AgentError::Run(peregrine_graph::RunError::StaleResume { .. }))), "{refused:?}");
    let forged = ApprovalRef { interrupt_id: interrupt.id.clone(), digest: Some("0".repeat(64)) };
    let refused = h.agent.answer_approval("t", &forged, ApprovalReply::Abandon, TurnOptions::default()).await;
    assert!(matches!(refused, Err(AgentError::Run(peregrine_graph::RunError::ForgedResume { .. }))), "{refused:?}");
    assert_eq!(h.agent.thread("t").await.expect("read").expect("exists").status, peregrine_agent::ThreadStatus::Interrupted);
    let done = h
        .agent
        .answer_approval("t", &ApprovalRef::to(&interrupt), ApprovalReply::Abandon, TurnOptions::default())
        .await
        .expect("withdrawn");
    assert_eq!(done.status, TurnStatus::Abandoned);
    assert_eq!(done.approval.map(|answered| (answered.outcome, answered.method)), Some((ApprovalOutcome::Abandoned, None)));
    let said = &done.state.expect("state").messages;
    assert!(said.last().is_some_and(|message| message.role == Role::Assistant && message.content.starts_with("Cancelled:")));
    assert!(
        said.iter().rev().nth(1).is_some_and(|message| message.role == Role::User && message.content.contains("Prague")),
        "no words were typed"
    );
}

#[tokio::test]
async fn acceptance_case_14_an_edited_plan_file_replaces_the_shown_one() {
    let script = Script::new()
        .on_request(
            |request| request.schema_name.as_deref() == Some("LocationExtraction") && request.prompt_text().contains("Berlin"),
            Reply::json(json!({"location": "Berlin"})),
        )
        .on_schema("ApprovalResponse", Reply::json(json!({"approved": true})));
    let mut script = script;
    for (matcher, reply) in [
        ("ExtractedTask", extracted("Get the current weather in Prague", false)),
        ("CapabilitySelection", selection(&["current_weather"])),
        ("ExecutionPlan", Reply::json(weather_plan("Prague", "weather_prague"))),
        ("LocationExtraction", Reply::json(json!({"location": "Prague"}))),
    ] {
        script = script.on_schema(matcher, reply);
    }
    let h = harness(script.on_plain(Reply::text("Cool and cloudy in Berlin.")), ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "/planning What's the weather in Prague?").await.status, TurnStatus::Interrupted);
    let modified = h.pending_plan("t").with_file_name("modified_execution_plan.json");
    std::fs::write(&modified, serde_json::to_vec(&weather_plan("Berlin", "weather_berlin")).expect("json")).expect("write");
    let done = h.send("t", "go ahead please").await;
    assert_eq!(h.calls("ApprovalResponse").len(), 1, "an unclear answer asks the approval model once");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    let state = done.state.expect("state");
    assert!(state.capability_context_data.contains("CURRENT_WEATHER", "weather_berlin"), "the edited plan ran");
    assert!(!state.capability_context_data.contains("CURRENT_WEATHER", "weather_prague"), "the shown plan did not");
    assert_eq!(h.calls("ExecutionPlan").len(), 1, "no new planning call");
    assert!(!modified.exists(), "the edit is consumed");
}

#[tokio::test]
async fn an_edited_plan_sent_with_the_approval_runs_instead() {
    let h = harness(
        weather_script().on_request(
            |request| request.schema_name.as_deref() == Some("LocationExtraction") && request.prompt_text().contains("Oslo"),
            Reply::json(json!({"location": "Oslo"})),
        ),
        ClassifierMode::Batched,
    )
    .await;
    let asked = h.send("t", "/planning What's the weather in Prague?").await;
    let interrupt = asked.interrupt.expect("pending");
    let edited = weather_plan("Oslo", "weather_oslo");
    let done = h
        .agent
        .answer_approval("t", &ApprovalRef::to(&interrupt), ApprovalReply::Approve { edit: Some(edited) }, TurnOptions::default())
        .await
        .expect("answered");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert!(done.state.expect("state").capability_context_data.contains("CURRENT_WEATHER", "weather_oslo"));
    assert_eq!(h.calls("ExecutionPlan").len(), 1);
    // The same interrupt cannot be answered twice.
    let again =
        h.agent.answer_approval("t", &ApprovalRef::to(&interrupt), ApprovalReply::Approve { edit: None }, TurnOptions::default()).await;
    assert!(matches!(again, Err(AgentError::Run(RunError::NothingToResume { .. }))), "a consumed approval is refused: {again:?}");
    assert_eq!(h.calls("LocationExtraction").len(), 1, "the approved plan ran once");
}

#[tokio::test]
async fn acceptance_case_13_unclear_answers_go_to_the_approval_model() {
    let script = weather_script().on_schema("ApprovalResponse", Reply::json(json!({"approved": false})));
    let h = harness(script, ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "/planning What's the weather in Prague?").await.status, TurnStatus::Interrupted);
    let answered = h.send("t", "hmm, not like this").await;
    assert_eq!(h.calls("ApprovalResponse").len(), 1);
    assert_eq!(answered.status, TurnStatus::Interrupted, "a rejection re-plans and asks again");
    assert!(last_prompt(&h.calls("ExecutionPlan")).contains("\"hmm, not like this\""), "the words reach the new plan");
    assert!(h.calls("LocationExtraction").is_empty());
}

#[tokio::test]
async fn acceptance_case_8_direct_chat_needs_no_llm() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let entered = h.send("t", "/chat:echo").await;
    assert_eq!(entered.status, TurnStatus::Updated, "a state-only update");
    let answer = h.send("t", "hello there").await;
    assert_eq!(answer.status, TurnStatus::Completed);
    assert_eq!(answer.response.as_deref(), Some("echo: hello there"));
    assert!(h.server.chat_requests().is_empty(), "direct chat skips task extraction, classification and planning");
    let left = h.send("t", "/exit").await;
    assert_eq!(left.status, TurnStatus::Updated);
    let state = left.state.expect("state");
    assert!(state.direct_chat_capability().is_none());
    assert!(state.messages.last().expect("marker").content.contains("End of direct chat session with 'echo'"));
    assert_eq!(h.send("t", "/exit").await.status, TurnStatus::Exit);
    let normal = h.send("t", "What's the weather in Prague?").await;
    assert_eq!(normal.status, TurnStatus::Completed, "normal routing again");
    assert_eq!(h.calls("ExtractedTask").len(), 1);
}

#[tokio::test]
async fn acceptance_cases_11_and_12_bypass_commands_skip_their_llm_calls() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let result = h.send("t", "/task:off /caps:off What's the weather in Prague?").await;
    assert_eq!(result.status, TurnStatus::Completed, "{:?}", result.response);
    assert!(h.calls("ExtractedTask").is_empty() && h.calls("CapabilitySelection").is_empty());
    let state = result.state.expect("state");
    assert!(state.task.depends_on_chat_history && state.task.depends_on_user_memory);
    assert!(state.task.current_task.as_deref().unwrap_or_default().contains("What's the weather in Prague?"));
    for name in ["current_weather", "memory", "time_range_parsing", "echo", "respond", "clarify"] {
        assert!(state.planning.active_capabilities.iter().any(|active| active == name), "{name} is active");
    }
    // A later turn without the commands classifies again: they last one turn.
    let next = h.send("t", "And in Prague again?").await;
    assert_eq!(next.status, TurnStatus::Completed);
    assert_eq!((h.calls("ExtractedTask").len(), h.calls("CapabilitySelection").len()), (1, 1));
}

#[tokio::test]
async fn acceptance_case_20_a_critical_failure_ends_in_the_error_report() {
    let script = Script::new()
        .on_schema("ExtractedTask", extracted("Get the current weather in Prague", false))
        .on_schema("CapabilitySelection", selection(&["current_weather"]))
        .on_schema("ExecutionPlan", Reply::json(weather_plan("Prague", "weather_prague")))
        .on_schema(
            "LocationExtraction",
            Reply::sequence(vec![Reply::fault(Fault::Unauthorized), Reply::json(json!({"location": "Prague"}))]),
        )
        .on_prompt_containing("error analysis", Reply::text("The weather service's model refused the credentials."))
        .on_plain(Reply::text("Mild and rainy in Prague."));
    let h = harness(script, ClassifierMode::Batched).await;
    let result = h.send("t", "What's the weather in Prague?").await;
    assert_eq!(result.status, TurnStatus::Failed);
    let report = result.response.expect("report");
    for needle in ["ERROR REPORT", "**Error Severity:** CRITICAL", "current_weather", "**Analysis:**", "refused the credentials"] {
        assert!(report.contains(needle), "missing {needle:?} in {report}");
    }
    assert_eq!(h.calls("LocationExtraction").len(), 1, "a CRITICAL failure is not retried");
    let next = h.send("t", "What's the weather in Prague?").await;
    assert_eq!(next.status, TurnStatus::Completed, "the thread stays usable: {:?}", next.response);
    assert_eq!(next.response.as_deref(), Some("Mild and rainy in Prague."));
}

fn memory_script(content: &str) -> Script {
    Script::new()
        .on_schema(
            "ExtractedTask",
            Reply::sequence(vec![extracted("Save to memory that my shift starts at 7am", false), extracted("What is my shift?", false)]),
        )
        .on_schema("CapabilitySelection", Reply::sequence(vec![selection(&["memory"]), selection(&[])]))
        .on_schema(
            "ExecutionPlan",
            Reply::sequence(vec![
                Reply::json(json!({"steps": [
                    {"context_key": "saved_shift", "capability": "memory", "task_objective": "Save that my shift starts at 7am",
                     "success_criteria": "saved", "inputs": []},
                    {"context_key": "answer", "capability": "respond", "task_objective": "Confirm", "success_criteria": "ok",
                     "inputs": [{"MEMORY_CONTEXT": "saved_shift"}]}]})),
                Reply::json(json!({"steps": [{"context_key": "answer", "capability": "respond", "task_objective": "Answer",
                    "success_criteria": "ok", "inputs": []}]})),
            ]),
        )
        .on_schema("MemoryOperationClassification", Reply::json(json!({"operation": "save", "reasoning": "asked to remember"})))
        .on_schema("MemoryContentExtraction", Reply::json(json!({"content": content, "found": true, "explanation": "stated"})))
        .on_plain(Reply::text("Done."))
}

#[tokio::test]
async fn acceptance_case_21_memory_saves_only_what_was_approved() {
    let h = harness(memory_script("My shift starts at 7am"), ClassifierMode::Batched).await;
    let asked = h.send("t", "Remember that my shift starts at 7am").await;
    assert_eq!(asked.status, TurnStatus::Interrupted);
    assert_eq!(asked.interrupt.as_ref().expect("pending").payload["resume_payload"]["approval_type"], "memory_save");
    assert!(asked.response.expect("prompt").contains("My shift starts at 7am"));
    let file = h.data_dir.join("user_memory").join("ada.json");
    assert!(!file.exists(), "nothing is saved before the approval");
    let done = h.send("t", "y").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    let saved: Value = serde_json::from_slice(&std::fs::read(&file).expect("saved")).expect("json");
    assert_eq!(saved["entries"][0]["content"], "My shift starts at 7am");
    assert_eq!(saved["entries"].as_array().expect("entries").len(), 1);
    assert_eq!(h.calls("MemoryContentExtraction").len(), 1, "the approved content is saved without extracting it again");
    // The memory reaches task extraction in the next turn through the data source.
    assert_eq!(h.send("t", "When does my shift start?").await.status, TurnStatus::Completed);
    assert!(last_prompt(&h.calls("ExtractedTask")).contains("My shift starts at 7am"), "user memory is offered to task extraction");
}

#[tokio::test]
async fn acceptance_case_21_a_rejected_memory_save_saves_nothing() {
    let h = harness(memory_script("My shift starts at 7am"), ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "Remember that my shift starts at 7am").await.status, TurnStatus::Interrupted);
    let done = h.send("t", "no, do not keep that").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert!(!h.data_dir.join("user_memory").join("ada.json").exists());
    assert_eq!(h.calls("MemoryContentExtraction").len(), 1, "a rejection does not ask again");
    assert!(last_prompt(&h.plain_calls()).contains("cancelled by the user"), "respond is told nothing was saved");
}

#[tokio::test]
async fn acceptance_case_21_a_withdrawn_memory_save_saves_nothing_and_ends_the_turn() {
    let h = harness(memory_script("My shift starts at 7am"), ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "Remember that my shift starts at 7am").await.status, TurnStatus::Interrupted);
    let plain_calls = h.plain_calls().len();
    let done = h.send("t", "cancel").await;
    assert_eq!(done.status, TurnStatus::Abandoned, "{:?}", done.response);
    assert!(done.response.as_deref().is_some_and(|text| text.contains("was not carried out")), "{:?}", done.response);
    assert!(!h.data_dir.join("user_memory").join("ada.json").exists());
    assert_eq!(h.plain_calls().len(), plain_calls, "the turn ends without another step");
    assert_eq!(h.agent.thread("t").await.expect("read").expect("exists").status, peregrine_agent::ThreadStatus::Idle);
}

#[tokio::test]
async fn acceptance_case_21_memory_without_a_user_is_critical() {
    let h = harness(memory_script("x"), ClassifierMode::Batched).await;
    let result =
        h.agent.send("t", "Remember that my shift starts at 7am", &Session::default(), TurnOptions::default()).await.expect("handled");
    assert_eq!(result.status, TurnStatus::Failed);
    let report = result.response.expect("report");
    assert!(report.contains("CRITICAL") && report.contains("user id"), "{report}");
}

#[tokio::test]
async fn acceptance_case_22_an_unfound_time_range_is_replanned_into_a_clarification() {
    let script = Script::new()
        .on_schema("ExtractedTask", extracted("Show the beam current for the usual period", false))
        .on_schema("CapabilitySelection", selection(&["time_range_parsing"]))
        .on_schema(
            "ExecutionPlan",
            Reply::sequence(vec![
                Reply::json(json!({"steps": [
                    {"context_key": "tr_usual", "capability": "time_range_parsing", "task_objective": "Parse 'the usual period'",
                     "success_criteria": "range", "inputs": []},
                    {"context_key": "answer", "capability": "respond", "task_objective": "Answer", "success_criteria": "ok",
                     "inputs": [{"TIME_RANGE": "tr_usual"}]}]})),
                Reply::json(json!({"steps": [{"context_key": "ask", "capability": "clarify",
                    "task_objective": "Ask which time range the user means", "success_criteria": "asked", "inputs": []}]})),
            ]),
        )
        .on_schema("TimeRangeOutput", Reply::json(json!({"start_date": "", "end_date": "", "found": false})))
        .on_schema(
            "ClarifyingQuestionsResponse",
            Reply::json(json!({"reason": "no range", "questions": ["Which time range do you mean?"], "missing_info": ["time range"]})),
        );
    let h = harness(script, ClassifierMode::Batched).await;
    let result = h.send("t", "Show the beam current for the usual period").await;
    assert_eq!(result.status, TurnStatus::Completed, "{:?}", result.response);
    assert_eq!(result.response.as_deref(), Some("I need some clarification:\n\n1. Which time range do you mean?"));
    assert_eq!(h.calls("TimeRangeOutput").len(), 1, "REPLANNING is not retried in place");
    assert_eq!(h.calls("ExecutionPlan").len(), 2);
    assert!(last_prompt(&h.calls("ExecutionPlan")).contains("REPLANNING"), "the new plan is made knowing what failed");
}

#[tokio::test]
async fn bad_commands_change_nothing() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    let error = h.agent.send("t", "/planning:maybe weather?", &Session::default(), TurnOptions::default()).await.expect_err("refused");
    assert!(error.to_string().contains("/planning takes on, off"), "{error}");
    assert!(h.agent.graph().get_state("t").await.expect("read").is_none(), "no checkpoint was written");
    let help = h.send("t", "/help").await;
    assert_eq!(help.status, TurnStatus::Reply);
    assert!(help.response.expect("help").contains("/planning"));
}

struct MarkedClassifier;
impl peregrine_agent::infra::classifier::ClassifierPrompts for MarkedClassifier {
    fn role(&self) -> String {
        "MARK-CLASSIFIER: you pick capabilities.".into()
    }
}

struct MarkedPlanner;
impl peregrine_agent::infra::orchestrator::OrchestratorPrompts for MarkedPlanner {
    fn role(&self) -> String {
        "MARK-ORCHESTRATOR: you plan.".into()
    }
}

struct MarkedResponder;
impl peregrine_agent::respond::ResponsePrompts for MarkedResponder {
    fn role(&self) -> String {
        "MARK-RESPOND: you answer.".into()
    }
    fn orchestrator_guide(&self) -> peregrine_core::OrchestratorGuide {
        peregrine_core::OrchestratorGuide {
            instructions: "MARK-RESPOND-GUIDE: end every plan with respond.".into(),
            examples: Vec::new(),
            priority: 100,
        }
    }
}

struct MarkedClarifier;
impl peregrine_agent::clarify::ClarificationPrompts for MarkedClarifier {
    fn role(&self) -> String {
        "MARK-CLARIFY: you ask.".into()
    }
}

struct MarkedAnalyst;
impl peregrine_agent::infra::error_node::ErrorAnalysisPrompts for MarkedAnalyst {
    fn role(&self) -> String {
        "MARK-ERROR: you explain failures.".into()
    }
}

#[tokio::test]
async fn prompt_overrides_reach_every_node_without_forking() {
    let script = Script::new()
        .on_schema(
            "ExtractedTask",
            Reply::sequence(vec![
                extracted("Get the current weather in Prague", false),
                extracted("Something vague", false),
                extracted("Get the current weather in Prague", false),
            ]),
        )
        .on_schema("CapabilitySelection", selection(&["current_weather"]))
        .on_schema(
            "ExecutionPlan",
            Reply::sequence(vec![
                Reply::json(weather_plan("Prague", "weather_prague")),
                Reply::json(json!({"steps": [{"context_key": "ask", "capability": "clarify", "task_objective": "Ask what they mean",
                    "success_criteria": "asked", "inputs": []}]})),
                Reply::json(weather_plan("Prague", "weather_prague_2")),
            ]),
        )
        .on_schema(
            "LocationExtraction",
            Reply::sequence(vec![Reply::json(json!({"location": "Prague"})), Reply::fault(Fault::Unauthorized)]),
        )
        .on_schema(
            "ClarifyingQuestionsResponse",
            Reply::json(json!({"reason": "vague", "questions": ["What do you mean?"], "missing_info": []})),
        )
        .on_prompt_containing("MARK-ERROR", Reply::text("The credentials were refused."))
        .on_plain(Reply::text("Mild and rainy in Prague."));
    let prompts = PromptOverrides {
        classifier: Some(Arc::new(MarkedClassifier)),
        orchestrator: Some(Arc::new(MarkedPlanner)),
        response: Some(Arc::new(MarkedResponder)),
        clarification: Some(Arc::new(MarkedClarifier)),
        error_analysis: Some(Arc::new(MarkedAnalyst)),
        ..hello_world_weather::prompts::prompt_overrides()
    };
    let h = harness_with(script, ClassifierMode::Batched, |_| {}, prompts).await;
    assert_eq!(h.send("t", "What's the weather in Prague?").await.status, TurnStatus::Completed);
    assert_eq!(h.send("t", "Hmm?").await.status, TurnStatus::Completed);
    let failed = h.send("t", "What's the weather in Prague again?").await;
    assert_eq!(failed.status, TurnStatus::Failed);
    assert!(failed.response.expect("report").contains("The credentials were refused."));
    assert!(last_prompt(&h.calls("CapabilitySelection")).contains("MARK-CLASSIFIER"));
    let planning = h.calls("ExecutionPlan")[0].prompt_text();
    assert!(planning.contains("MARK-ORCHESTRATOR"), "{planning}");
    assert!(planning.contains("MARK-RESPOND-GUIDE"), "respond is planned as its override describes it: {planning}");
    assert!(h.plain_calls().iter().any(|request| request.prompt_text().contains("MARK-RESPOND")));
    assert!(last_prompt(&h.calls("ClarifyingQuestionsResponse")).contains("MARK-CLARIFY"));
    assert!(h.plain_calls().iter().any(|request| request.prompt_text().contains("MARK-ERROR")));
}

#[tokio::test]
async fn an_edited_plan_file_that_cannot_be_used_is_refused_not_ignored() {
    for (case, write) in [("garbled", true), ("unreadable", false)] {
        let h = harness(weather_script(), ClassifierMode::Batched).await;
        assert_eq!(h.send("t", "/planning What's the weather in Prague?").await.status, TurnStatus::Interrupted);
        let modified = h.pending_plan("t").with_file_name("modified_execution_plan.json");
        if write {
            std::fs::write(&modified, "{not json").expect("write");
        } else {
            std::fs::create_dir(&modified).expect("a directory where the file should be");
        }
        let again = h.send("t", "yes").await;
        assert!(h.calls("LocationExtraction").is_empty(), "{case}: neither the edit nor the original plan ran");
        assert_eq!(h.calls("ExecutionPlan").len(), 2, "{case}: planned again");
        assert!(last_prompt(&h.calls("ExecutionPlan")).contains("REPLANNING"), "{case}: the planner is told why");
        if write {
            assert_eq!(again.status, TurnStatus::Interrupted, "{case}: a new plan is asked for: {:?}", again.response);
        } else {
            // The new plan cannot be offered while the stale edit cannot be removed: the turn
            // ends in a report naming the path rather than asking over a broken data directory.
            assert_eq!(again.status, TurnStatus::Failed, "{case}");
            assert!(again.response.expect("report").contains("modified_execution_plan.json"), "{case}");
        }
    }
}

#[tokio::test]
async fn forwarded_slash_commands_reach_the_capabilities_of_their_turn_only() {
    let h = harness(weather_script(), ClassifierMode::Batched).await;
    assert_eq!(h.send("t", "/chat:echo").await.status, TurnStatus::Updated);
    let with = h.send("t", "/beam:fast /verbose hi").await;
    assert_eq!(with.response.as_deref(), Some("echo: hi /beam=\"fast\" /verbose=true"));
    let without = h.send("t", "hi again").await;
    assert_eq!(without.response.as_deref(), Some("echo: hi again"), "they last one turn");
}

#[tokio::test]
async fn approval_commands_take_effect_within_the_operators_policy() {
    // Lowering approvals is refused unless the configuration allows it.
    let h = harness(memory_script("My shift starts at 7am"), ClassifierMode::Batched).await;
    let refused =
        h.agent.send("t", "/approval:off Remember that my shift starts at 7am", &Session::new("ada", "cli"), TurnOptions::default()).await;
    assert!(matches!(refused, Err(AgentError::Gateway(_))), "{refused:?}");
    assert!(h.server.chat_requests().is_empty(), "nothing ran");

    // Allowed by the configuration, /approval:off saves without asking.
    let allow = |settings: &mut AgentSettings| settings.approval.allow_chat_override = true;
    let h = harness_with(memory_script("My shift starts at 7am"), ClassifierMode::Batched, allow, PromptOverrides::default()).await;
    let saved = h.send("t", "/approval:off Remember that my shift starts at 7am").await;
    assert_eq!(saved.status, TurnStatus::Completed, "{:?}", saved.response);
    assert!(h.data_dir.join("user_memory").join("ada.json").exists(), "saved without an approval");

    // With memory approvals off in the configuration, /approval still makes the save ask.
    let no_memory_approval = |settings: &mut AgentSettings| settings.approval.capabilities.memory.enabled = false;
    let h = harness_with(memory_script("My shift starts at 7am"), ClassifierMode::Batched, no_memory_approval, PromptOverrides::default())
        .await;
    let plain = h.send("t", "Remember that my shift starts at 7am").await;
    assert_eq!(plain.status, TurnStatus::Completed, "the configuration does not ask");
    let h = harness_with(memory_script("My shift starts at 7am"), ClassifierMode::Batched, no_memory_approval, PromptOverrides::default())
        .await;
    let asked = h.send("t", "/approval Remember that my shift starts at 7am").await;
    assert_eq!(asked.status, TurnStatus::Interrupted, "/approval asks for every approvable action");
    assert!(!h.data_dir.join("user_memory").join("ada.json").exists());
}

#[tokio::test]
async fn acceptance_case_22_a_time_range_across_the_clock_change_reaches_respond_in_local_time() {
    let script = Script::new()
        .on_schema("ExtractedTask", extracted("Show the beam current from March 7 noon to March 9 noon", false))
        .on_schema("CapabilitySelection", selection(&["time_range_parsing"]))
        .on_schema(
            "ExecutionPlan",
            Reply::json(json!({"steps": [
                {"context_key": "tr_0307_0309", "capability": "time_range_parsing", "task_objective": "Parse March 7 noon to March 9 noon",
                 "success_criteria": "range", "inputs": []},
                {"context_key": "answer", "capability": "respond", "task_objective": "Answer", "success_criteria": "ok",
                 "inputs": [{"TIME_RANGE": "tr_0307_0309"}]}]})),
        )
        .on_schema(
            "TimeRangeOutput",
            Reply::json(json!({"start_date": "2026-03-07 12:00:00", "end_date": "2026-03-09T19:00:00Z", "found": true})),
        )
        .on_plain(Reply::text("Here is the range."));
    let h = harness(script, ClassifierMode::Batched).await;
    let result = h.send("t", "Beam current from March 7 noon to March 9 noon").await;
    assert_eq!(result.status, TurnStatus::Completed, "{:?}", result.response);
    let range = result.state.expect("state").capability_context_data.entry("TIME_RANGE", "tr_0307_0309").expect("stored").data.clone();
    assert_eq!(range["start_date"], "2026-03-07T12:00:00-08:00", "naive times are facility time (PST)");
    assert_eq!(range["end_date"], "2026-03-09T12:00:00-07:00", "UTC is converted to facility time (PDT after the change)");
    assert_eq!(range["timezone_name"], "America/Los_Angeles");
    let respond = last_prompt(&h.plain_calls());
    assert!(respond.contains("America/Los_Angeles"), "respond labels times with the facility timezone: {respond}");
}

#[tokio::test]
async fn a_turn_cancelled_while_its_approval_answer_is_read_changes_nothing() {
    // The approval model never answers: the person gives up (Ctrl-C) while it is asked.
    let script = weather_script().on_schema("ApprovalResponse", Reply::fault(Fault::Timeout));
    let h = harness(script, ClassifierMode::Batched).await;
    let asked = h.send("t", "/planning What's the weather in Prague?").await;
    let interrupt = asked.interrupt.expect("a plan approval is pending");
    let cancel = tokio_util::sync::CancellationToken::new();
    let options = TurnOptions { events: None, cancel: cancel.clone() };
    let session = Session::new("ada", "cli");
    let answer = h.agent.send("t", "hmm, maybe later", &session, options);
    tokio::pin!(answer);
    // Cancel once the approval model has the question (checked, not slept on).
    let result = loop {
        tokio::select! {
            result = &mut answer => break result,
            () = tokio::task::yield_now() => {
                if !h.calls("ApprovalResponse").is_empty() {
                    cancel.cancel();
                }
            }
        }
    };
    let result = result.expect("a cancelled turn is not an error");
    assert_eq!(result.status, TurnStatus::Cancelled);
    let snapshot = h.agent.graph().get_state("t").await.expect("state").expect("the thread");
    assert_eq!(snapshot.meta.interrupt.as_ref().map(|pending| pending.id.as_str()), Some(interrupt.id.as_str()), "still waiting");
    assert!(snapshot.meta.resume.is_none(), "no answer was recorded: the Ctrl-C is not a rejection");
    let done = h.send("t", "yes").await;
    assert_eq!(done.status, TurnStatus::Completed, "the approval is still there to answer: {:?}", done.response);
}

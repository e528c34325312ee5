//! Unit tests of task extraction, driving `execute` directly with a fake LLM and scripted data
//! sources (reference §8.2 case 12 and the §2.2 behaviour).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::TimeZone;
use peregrine_core::capability::BoxFuture;
use peregrine_core::state::{Message, Role, session_keys};
use peregrine_core::{ErrorSeverity, GraphState};
use peregrine_llm::{ChatRequest, FakeProvider, LlmErrorKind};

use super::*;
use crate::settings::AgentSettings;

enum Behaviour {
    Data(&'static str),
    Nothing,
    Fail,
    Hang,
}

struct ScriptedSource {
    name: &'static str,
    responds: bool,
    behaviour: Behaviour,
    calls: AtomicUsize,
}

impl ScriptedSource {
    fn new(name: &'static str, behaviour: Behaviour) -> Arc<Self> {
        Arc::new(Self { name, responds: true, behaviour, calls: AtomicUsize::new(0) })
    }

    fn silent(name: &'static str) -> Arc<Self> {
        Arc::new(Self { name, responds: false, behaviour: Behaviour::Data("never asked"), calls: AtomicUsize::new(0) })
    }
}

impl DataSource for ScriptedSource {
    fn name(&self) -> &str {
        self.name
    }

    fn should_respond(&self, request: &DataSourceRequest<'_>) -> bool {
        self.responds && request.requester == TASK_EXTRACTION
    }

    fn retrieve<'a>(&'a self, _request: &'a DataSourceRequest<'a>) -> BoxFuture<'a, Result<Option<RetrievedData>, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let result = match self.behaviour {
            Behaviour::Data(content) => {
                Ok(Some(RetrievedData { source: self.name.into(), title: format!("{} data", self.name), content: content.into() }))
            }
            Behaviour::Nothing => Ok(None),
            Behaviour::Fail => Err("the memory database is down".to_owned()),
            Behaviour::Hang => return Box::pin(std::future::pending()),
        };
        Box::pin(std::future::ready(result))
    }
}

fn at(hour: u32, minute: u32, second: u32) -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 3, 4, hour, minute, second).single().expect("valid time")
}

fn conversation() -> AgentState {
    let mut state = AgentState {
        messages: vec![
            Message::new(Role::User, "What is the beam current?", at(13, 0, 1)),
            Message::new(Role::Assistant, "The beam current SR:DCCT is 500.1 mA.", at(13, 0, 9)),
            Message::new(Role::User, "Plot it for the last hour", at(13, 2, 0)),
        ],
        ..AgentState::default()
    };
    state.session_state.insert(session_keys::USER_ID.into(), serde_json::json!("alice"));
    state
}

fn settings() -> AgentSettings {
    AgentSettings { timezone: chrono_tz::Europe::Berlin, data_source_timeout: Duration::from_secs(30), ..AgentSettings::default() }
}

fn answering(answer: &'static str) -> FakeProvider {
    FakeProvider::by_schema(move |schema, _request| match schema {
        "ExtractedTask" => Ok(answer.to_owned()),
        other => Err(FakeProvider::error(LlmErrorKind::BadRequest { status: 400 }, &format!("unexpected schema {other}"))),
    })
}

const GOOD_ANSWER: &str =
    r#"{"task": "  Plot SR:DCCT from 13:02 to 14:02 today  ", "depends_on_chat_history": true, "depends_on_user_memory": false}"#;

fn node(fake: &FakeProvider) -> TaskExtraction {
    TaskExtraction::new(Services::new(Arc::new(fake.client()), settings()))
}

fn node_with_budget(fake: &FakeProvider, prompt_history_chars: usize) -> TaskExtraction {
    TaskExtraction::new(Services::new(Arc::new(fake.client()), AgentSettings { prompt_history_chars, ..settings() }))
}

/// A thread of 30 question/answer pairs (each message about 120 characters) and a last question.
fn long_conversation() -> AgentState {
    let mut state = conversation();
    state.messages.clear();
    for index in 0..30 {
        state.messages.push(Message::new(Role::User, format!("question {index}: {}", "q".repeat(100)), at(10, index, 0)));
        state.messages.push(Message::new(Role::Assistant, format!("answer {index}: {}", "a".repeat(100)), at(10, index, 30)));
    }
    state.messages.push(Message::new(Role::User, "Plot the last one", at(13, 2, 0)));
    state
}

async fn run(node: &TaskExtraction, state: &AgentState) -> (Result<CapabilityOutcome, CapabilityError>, Vec<AgentEvent>) {
    crate::test_support::run_node(node, state).await
}

fn task_of(result: Result<CapabilityOutcome, CapabilityError>) -> TaskState {
    match result.expect("task extraction succeeds") {
        CapabilityOutcome::Done(update) => update.task.expect("the update sets the task"),
        other => panic!("unexpected outcome {other:?}"),
    }
}

fn prompt_text(request: &ChatRequest) -> String {
    request.messages.iter().map(|message| message.content.as_str()).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn one_structured_call_sets_the_trimmed_task_and_flags() {
    let fake = answering(GOOD_ANSWER);
    let (result, events) = run(&node(&fake), &conversation()).await;
    let task = task_of(result);
    assert_eq!(
        task,
        TaskState {
            current_task: Some("Plot SR:DCCT from 13:02 to 14:02 today".into()),
            depends_on_chat_history: true,
            depends_on_user_memory: false
        }
    );
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(fake.requests_for("ExtractedTask").len(), 1, "the schema is named ExtractedTask");
    assert!(events.iter().any(|event| matches!(
        &event.kind,
        EventKind::TaskExtracted { task, depends_on_chat_history: true, .. } if task == "Plot SR:DCCT from 13:02 to 14:02 today"
    )));
    assert!(events.iter().any(|event| matches!(event.kind, EventKind::LlmRequest { .. }) && event.component == TASK_EXTRACTION));
}

#[tokio::test]
async fn the_update_applies_to_the_state() {
    let fake = answering(GOOD_ANSWER);
    let mut state = conversation();
    let (result, _) = run(&node(&fake), &state).await;
    let CapabilityOutcome::Done(update) = result.expect("succeeds") else { panic!("no approval expected") };
    state.apply(update);
    assert_eq!(state.task.current_task.as_deref(), Some("Plot SR:DCCT from 13:02 to 14:02 today"));
}

#[tokio::test]
async fn prompt_holds_the_numbered_dated_history_in_the_facility_timezone_and_the_retrieved_data() {
    let fake = answering(GOOD_ANSWER);
    let memory = ScriptedSource::new("user_memory", Behaviour::Data("• watches SR01C:BPM4"));
    let node = node(&fake).with_data_sources(vec![memory.clone()]);
    task_of(run(&node, &conversation()).await.0);
    let requests = fake.requests_for("ExtractedTask");
    let prompt = prompt_text(&requests[0]);
    assert!(prompt.contains(
        "## Current Chat History:\n1. USER (2025-03-04 14:00:01): What is the beam current?\n\
         2. ASSISTANT (2025-03-04 14:00:09): The beam current SR:DCCT is 500.1 mA.\n3. USER (2025-03-04 14:02:00): Plot it for the last hour"
    ));
    assert!(prompt.contains("**Retrieved Data:**\n**user_memory data:**\n• watches SR01C:BPM4"));
    assert!(prompt.contains("(Europe/Berlin)"), "the current time is given in the facility timezone");
    assert!(!prompt.contains("No stored memories"), "upstream's placeholder defect is not reproduced");
    assert_eq!(memory.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_retrieved_data_the_prompt_has_no_data_section() {
    let fake = answering(GOOD_ANSWER);
    let node = node(&fake).with_data_sources(vec![ScriptedSource::new("empty", Behaviour::Nothing), ScriptedSource::silent("other")]);
    task_of(run(&node, &conversation()).await.0);
    let request = &fake.requests()[0];
    let conversation_part = &request.messages[1].content;
    assert!(!conversation_part.contains("Retrieved Data"), "only the examples in the system message show retrieved data");
    assert!(!prompt_text(request).contains("## User Memory"));
}

#[tokio::test(start_paused = true)]
async fn failing_and_hanging_sources_only_mean_less_context() {
    let fake = answering(GOOD_ANSWER);
    let hanging = ScriptedSource::new("archive", Behaviour::Hang);
    let failing = ScriptedSource::new("logbook", Behaviour::Fail);
    let memory = ScriptedSource::new("user_memory", Behaviour::Data("• prefers plots in mA"));
    let silent = ScriptedSource::silent("not_for_me");
    let node = node(&fake).with_data_sources(vec![hanging.clone(), failing.clone(), memory.clone(), silent.clone()]);
    let started = tokio::time::Instant::now();
    let task = task_of(run(&node, &conversation()).await.0);
    assert_eq!(task.current_task.as_deref(), Some("Plot SR:DCCT from 13:02 to 14:02 today"));
    assert_eq!(started.elapsed(), Duration::from_secs(30), "one overall deadline for all sources");
    let prompt = prompt_text(&fake.requests()[0]);
    assert!(prompt.contains("**user_memory data:**\n• prefers plots in mA"), "what finished in time is kept");
    assert!(!prompt.contains("archive data") && !prompt.contains("logbook data"));
    assert_eq!(silent.calls.load(Ordering::SeqCst), 0, "a source that should not respond is not asked");
    assert_eq!((hanging.calls.load(Ordering::SeqCst), failing.calls.load(Ordering::SeqCst)), (1, 1));
}

#[tokio::test]
async fn acceptance_case_12_bypass_makes_no_llm_call() {
    let fake = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Connect, "no LLM call expected")));
    let node = node(&fake).with_data_sources(vec![ScriptedSource::new("user_memory", Behaviour::Data("• watches SR01C:BPM4"))]);
    let mut state = conversation();
    state.agent_control.task_extraction_bypass_enabled = true;
    let (result, events) = run(&node, &state).await;
    let task = task_of(result);
    assert!(fake.requests().is_empty());
    assert!(task.depends_on_chat_history && task.depends_on_user_memory);
    assert_eq!(
        task.current_task.as_deref(),
        Some(
            "**Retrieved Data:**\n**user_memory data:**\n• watches SR01C:BPM4\n\nChat history:\n\
             1. USER (2025-03-04 14:00:01): What is the beam current?\n2. ASSISTANT (2025-03-04 14:00:09): The beam current SR:DCCT is 500.1 mA.\n\
             3. USER (2025-03-04 14:02:00): Plot it for the last hour"
        )
    );
    assert!(events.iter().any(|event| matches!(event.kind, EventKind::TaskExtracted { .. })));
}

#[tokio::test]
async fn bypass_without_data_is_just_the_history() {
    let fake = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Connect, "no LLM call expected")));
    let mut state = conversation();
    state.agent_control.task_extraction_bypass_enabled = true;
    let task = task_of(run(&node(&fake), &state).await.0);
    assert!(task.current_task.as_deref().is_some_and(|task| task.starts_with("Chat history:\n1. USER (2025-03-04 14:00:01)")));
}

#[tokio::test]
async fn a_long_thread_is_cut_to_the_history_budget_with_real_numbers() {
    let fake = answering(GOOD_ANSWER);
    let state = long_conversation();
    task_of(run(&node_with_budget(&fake, 1_000), &state).await.0);
    let conversation_part = fake.requests_for("ExtractedTask")[0].messages[1].content.clone();
    let history = conversation_part
        .split("## Current Chat History:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\nNow extract the task").next())
        .expect("a history section");
    assert!(history.chars().count() < 1_100, "the budget holds: {history}");
    let lines: Vec<&str> = history.lines().collect();
    let omitted: usize = lines[0]
        .strip_prefix('(')
        .and_then(|rest| rest.strip_suffix(" earlier messages omitted)"))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("an omitted-messages note first: {history}"));
    assert_eq!(omitted + lines.len() - 1, 61, "every message is either shown or counted");
    assert!(lines[1].starts_with(&format!("{}. ", omitted + 1)), "numbered by real position: {history}");
    assert_eq!(lines.last().copied(), Some("61. USER (2025-03-04 14:02:00): Plot the last one"));
    assert!(!history.contains("question 0:"));

    let everything = answering(GOOD_ANSWER);
    task_of(run(&node(&everything), &state).await.0);
    let full = everything.requests_for("ExtractedTask")[0].messages[1].content.clone();
    assert!(full.contains("## Current Chat History:\n1. USER (2025-03-04 11:00:00): question 0:"), "the default budget fits this thread");
    assert!(!full.contains("earlier messages omitted"));
}

#[tokio::test]
async fn bypass_uses_the_history_budget_too() {
    let fake = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Connect, "no LLM call expected")));
    let mut state = long_conversation();
    state.agent_control.task_extraction_bypass_enabled = true;
    let task = task_of(run(&node_with_budget(&fake, 300), &state).await.0).current_task.expect("a task");
    assert!(task.starts_with("Chat history:\n("), "{task}");
    assert!(task.contains("earlier messages omitted)\n"), "{task}");
    assert!(task.ends_with("61. USER (2025-03-04 14:02:00): Plot the last one"), "{task}");
    assert!(task.chars().count() < 400, "{task}");

    let mut state = conversation();
    state.agent_control.task_extraction_bypass_enabled = true;
    let no_history = task_of(run(&node_with_budget(&fake, 0), &state).await.0).current_task.expect("a task");
    assert_eq!(no_history, "Chat history:\n(2 earlier messages omitted)\n3. USER (2025-03-04 14:02:00): Plot it for the last hour");
}

#[tokio::test]
async fn an_empty_task_is_retriable() {
    let fake = answering(r#"{"task": "   ", "depends_on_chat_history": false, "depends_on_user_memory": false}"#);
    let node = node(&fake);
    let (result, events) = run(&node, &conversation()).await;
    let error = result.expect_err("an empty task is refused");
    let classification = node.classify_error(&error);
    assert_eq!(classification.severity, ErrorSeverity::Retriable);
    assert!(error.message().contains("returned no task"), "{}", error.message());
    assert!(events.iter().any(|event| matches!(event.kind, EventKind::PhaseComplete { success: false, .. })));
    assert!(!events.iter().any(|event| matches!(event.kind, EventKind::TaskExtracted { .. })));
}

#[tokio::test]
async fn llm_failures_are_classified_by_what_helps() {
    let table = [
        (LlmErrorKind::Timeout, ErrorSeverity::Retriable),
        (LlmErrorKind::Server { status: 503 }, ErrorSeverity::Retriable),
        (LlmErrorKind::Auth { status: 401 }, ErrorSeverity::Critical),
        (LlmErrorKind::Config, ErrorSeverity::Critical),
    ];
    for (kind, severity) in table {
        let failing = kind.clone();
        let fake = FakeProvider::by_schema(move |_, _| Err(FakeProvider::error(failing.clone(), "scripted failure")));
        let node = node(&fake);
        let error = run(&node, &conversation()).await.0.expect_err("the call fails");
        assert_eq!(node.classify_error(&error).severity, severity, "{kind:?}");
    }
    let garbage = answering("not json at all");
    let node = node(&garbage);
    let error = run(&node, &conversation()).await.0.expect_err("invalid output fails");
    assert_eq!(node.classify_error(&error).severity, ErrorSeverity::Retriable);
    assert_eq!(garbage.requests().len(), 2, "the structured layer feeds the problem back once");
    assert_eq!(node.classify_error(&CapabilityError::new("boom")).severity, ErrorSeverity::Critical);
}

struct FacilityPrompts;

impl TaskExtractionPrompts for FacilityPrompts {
    fn role(&self) -> String {
        "You turn ALS control-room conversations into tasks.".into()
    }

    fn examples(&self) -> Vec<TaskExtractionExample> {
        Vec::new()
    }
}

#[tokio::test]
async fn an_application_overrides_single_prompt_parts() {
    let fake = answering(GOOD_ANSWER);
    let node = node(&fake).with_prompts(Arc::new(FacilityPrompts));
    task_of(run(&node, &conversation()).await.0);
    let prompt = prompt_text(&fake.requests()[0]);
    assert!(prompt.starts_with("You turn ALS control-room conversations into tasks."));
    assert!(!prompt.contains("## Examples:"));
    assert!(prompt.contains("1. USER (2025-03-04 14:00:01): What is the beam current?"), "the default layout is kept");
}

#[test]
fn node_identity_and_policy() {
    let fake = answering(GOOD_ANSWER);
    let node = node(&fake);
    assert_eq!(node.name(), "task_extraction");
    assert_eq!(node.retry_policy(), RetryPolicy::task_extraction());
    assert_eq!(peregrine_llm::schema_for::<ExtractedTask>().name, "ExtractedTask");
}

//! Unit tests of the respond capability: prompt modes, history, interface guidelines,
//! streaming, failure classification and the prompt override mechanism.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::TimeZone;
use peregrine_core::capability::NoEvents;
use peregrine_core::state::{Artifact, ErrorInfo, StepRecord};
use peregrine_core::{AgentEvent, ContextEntry, ErrorSeverity, EventKind, EventSink, NodeKind, Role};
use peregrine_llm::{FakeProvider, LlmErrorKind};
use serde_json::json;

use super::*;
use crate::settings::AgentSettings;

#[derive(Default)]
struct RecordingEvents(Mutex<Vec<AgentEvent>>);

impl EventSink for RecordingEvents {
    fn emit(&self, event: AgentEvent) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(event);
    }
}

impl RecordingEvents {
    fn tokens(&self) -> Vec<(String, String, String)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|event| match &event.kind {
                EventKind::LlmToken { role, content } => Some((event.component.clone(), role.clone(), content.clone())),
                _ => None,
            })
            .collect()
    }
}

fn catalog() -> Arc<Catalog> {
    Arc::new(Catalog::new(vec![
        CapabilitySpec::new("python", "Run Python code for analysis"),
        CapabilitySpec::new("channel_read", "Read current channel values"),
        RespondCapability::default_spec(),
    ]))
}

fn respond_with(provider: &FakeProvider, timezone: chrono_tz::Tz) -> RespondCapability {
    let settings = AgentSettings { timezone, ..AgentSettings::default() };
    RespondCapability::new(Services::new(Arc::new(provider.client()), settings), catalog())
}

fn answering(text: &'static str) -> FakeProvider {
    FakeProvider::by_schema(move |_, _| Ok(text.to_owned()))
}

fn state_with_task(task: &str) -> AgentState {
    let mut state = AgentState::default();
    state.messages.push(Message::user("earlier question"));
    state.messages.push(Message::assistant("earlier answer"));
    state.messages.push(Message::user(task));
    state.task.current_task = Some(task.to_owned());
    state
}

fn respond_step(inputs: &[(&str, &str)]) -> PlannedStep {
    PlannedStep {
        inputs: inputs.iter().map(|(context_type, key)| peregrine_core::InputRef::new(*context_type, *key)).collect(),
        ..PlannedStep::generic_respond("t")
    }
}

fn record(key: &str, index: usize, capability: &str, objective: &str, error: Option<&str>) -> StepRecord {
    StepRecord {
        key: key.into(),
        step_index: index,
        capability: capability.into(),
        task_objective: objective.into(),
        success: error.is_none(),
        execution_time_ms: 5,
        timestamp: Utc::now(),
        error: error.map(str::to_owned),
    }
}

async fn run(
    respond: &RespondCapability,
    state: &AgentState,
    step: &PlannedStep,
    events: &dyn EventSink,
) -> Result<CapabilityOutcome, CapabilityError> {
    let spec = respond.spec().clone();
    respond.execute(CapabilityInput { state, step, spec: &spec, events, approval: None }).await
}

/// Runs respond once and returns the prompt the model saw.
async fn prompt_for(state: &AgentState, step: &PlannedStep) -> String {
    let provider = answering("done");
    run(&respond_with(&provider, chrono_tz::UTC), state, step, &NoEvents).await.expect("responds");
    let requests = provider.requests_for("");
    assert_eq!(requests.len(), 1, "one streamed call");
    assert_eq!(requests[0].messages.len(), 1);
    requests[0].messages[0].content.clone()
}

#[tokio::test]
async fn conversational_prompt_has_the_capabilities_overview_and_no_execution_data() {
    let state = state_with_task("What can you do?");
    let step = respond_step(&[]);
    let respond = respond_with(&answering("x"), chrono_tz::UTC);
    assert_eq!(respond.response_context(&state, &step, Utc::now()).mode, ResponseMode::Conversational);

    let prompt = prompt_for(&state, &step).await;
    assert!(prompt.starts_with("You are an expert assistant for workflow automation and data analysis."), "{prompt}");
    assert!(prompt.contains("CURRENT TASK: What can you do?"));
    assert!(prompt.contains("SYSTEM CAPABILITIES:\n- python: Run Python code for analysis\n- channel_read: Read current channel values"));
    assert!(!prompt.contains("RETRIEVED DATA") && !prompt.contains("EXECUTION SUMMARY"));
    assert!(!prompt.contains("CONVERSATION HISTORY"), "the task does not depend on the history");
    assert!(prompt.contains("GUIDELINES:\n1. Provide a clear, accurate response\n2. The current date and time is"));
    assert!(prompt.contains("Respond to greetings and social interactions professionally"));
    assert!(prompt.contains("NEVER make up data"));
}

#[tokio::test]
async fn specific_context_shows_only_the_steps_inputs() {
    let mut state = state_with_task("What is the beam current?");
    let store = &mut state.capability_context_data;
    store.insert("PV_VALUES", "beam", ContextEntry::new(json!({"SR:BEAM:CURRENT": 500.2, "units": "mA"}), None));
    store.insert("PV_VALUES", "vacuum", ContextEntry::new(json!({"SR:VAC:P1": 1e-9}), None));
    store.insert("TIME_RANGE", "tr", ContextEntry::new(json!({"start": "a"}), None));
    state.execution.step_results.push(record("beam", 0, "channel_read", "Read the beam current", None));
    let step = respond_step(&[("PV_VALUES", "beam")]);
    let respond = respond_with(&answering("x"), chrono_tz::UTC);
    assert_eq!(respond.response_context(&state, &step, Utc::now()).mode, ResponseMode::SpecificContext);

    let prompt = prompt_for(&state, &step).await;
    assert!(prompt.contains("RETRIEVED DATA:\n------------------------------\n\n[PV_VALUES: beam]\n{"), "{prompt}");
    assert!(prompt.contains("\"SR:BEAM:CURRENT\": 500.2"));
    assert!(!prompt.contains("SR:VAC:P1") && !prompt.contains("TIME_RANGE"), "only the step's inputs: {prompt}");
    assert!(!prompt.contains("SYSTEM CAPABILITIES") && !prompt.contains("EXECUTION SUMMARY"));
    assert!(prompt.contains("NEVER make up, estimate, or fabricate any data - only use what is actually retrieved"));
    assert!(!prompt.contains("Respond to greetings"), "no conversational guidelines with an execution history");
}

#[tokio::test]
async fn general_context_summarises_the_execution_in_plan_order() {
    let mut state = state_with_task("Plot the beam current");
    state.capability_context_data.insert("PV_VALUES", "beam", ContextEntry::new(json!({"x": 1}), None));
    let step = respond_step(&[]);
    state.execution.step_results = vec![
        record("plot", 1, "python", "Plot the values", Some("matplotlib missing")),
        record("infra_0_orchestrator", 0, "orchestrator", "planning", Some("timeout")),
        record("beam", 0, "channel_read", "Read the beam current", None),
        record(&step.context_key, 2, "respond", "earlier attempt", Some("rate limited")),
    ];
    let respond = respond_with(&answering("x"), chrono_tz::UTC);
    let context = respond.response_context(&state, &step, Utc::now());
    assert_eq!(context.mode, ResponseMode::GeneralContext);
    assert_eq!(context.capabilities_overview, None);

    let prompt = prompt_for(&state, &step).await;
    assert!(
        prompt.contains(
            "EXECUTION SUMMARY:\nStep 1: Read the beam current - Completed\nStep 2: Plot the values - Failed: matplotlib missing\n\n"
        ),
        "{prompt}"
    );
    assert!(!prompt.contains("planning") && !prompt.contains("earlier attempt"));
    assert!(!prompt.contains("RETRIEVED DATA") && !prompt.contains("SYSTEM CAPABILITIES"));
    assert!(prompt.contains("NEVER make up or fabricate any technical data - only describe what actually happened"));
}

#[tokio::test]
async fn chat_history_is_included_only_when_the_task_depends_on_it() {
    let mut state = state_with_task("And the second one?");
    let step = respond_step(&[]);
    assert!(!prompt_for(&state, &step).await.contains("CONVERSATION HISTORY"));

    state.task.depends_on_chat_history = true;
    let prompt = prompt_for(&state, &step).await;
    assert!(
        prompt.contains("CONVERSATION HISTORY:\nUser: earlier question\nAssistant: earlier answer\nUser: And the second one?"),
        "{prompt}"
    );
}

#[test]
fn a_long_chat_history_is_cut_to_the_history_budget() {
    let mut state = AgentState::default();
    for index in 0..50 {
        state.messages.push(Message::user(format!("question {index:02} {}", "q".repeat(60))));
        state.messages.push(Message::assistant(format!("answer {index:02} {}", "a".repeat(60))));
    }
    state.messages.push(Message::user("And the second one?"));
    state.task.current_task = Some("And the second one?".into());
    state.task.depends_on_chat_history = true;
    let settings = AgentSettings { prompt_history_chars: 400, ..AgentSettings::default() };
    let respond = RespondCapability::new(Services::new(Arc::new(answering("x").client()), settings), catalog());
    let context = respond.response_context(&state, &respond_step(&[]), Utc::now());
    let history = context.chat_history.expect("the task depends on the history");
    assert!(history.chars().count() <= 440, "{history}");
    let (note, rest) = history.split_once('\n').expect("a note line");
    let omitted: usize = note.trim_start_matches('(').split(' ').next().and_then(|count| count.parse().ok()).expect("a count");
    assert_eq!(note, format!("({omitted} earlier messages omitted)"));
    assert_eq!(omitted + rest.lines().count(), 101, "every message is shown or counted");
    assert!(rest.ends_with("Assistant: answer 49 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nUser: And the second one?"));
    assert!(!history.contains("question 00"));
    let prompt = DefaultResponsePrompts.build(&respond.response_context(&state, &respond_step(&[]), Utc::now()));
    assert!(prompt.contains(&format!("CONVERSATION HISTORY:\n({omitted} earlier messages omitted)\n")));
}

#[tokio::test]
async fn interface_guidelines_follow_the_session_interface() {
    let mut state = state_with_task("Plot it");
    state.ui_artifacts.push(Artifact {
        id: "fig1".into(),
        artifact_type: "image".into(),
        capability: "python".into(),
        created_at: Utc::now(),
        display_name: None,
        data: json!({"path": "/runs/1/figure.png"}),
    });
    let step = respond_step(&[]);
    let prompt_in = |interface: &str| {
        let mut state = state.clone();
        state.session_state.insert("interface".into(), json!(interface));
        let step = step.clone();
        async move { prompt_for(&state, &step).await }
    };
    let web = prompt_in("openwebui").await;
    let cli = prompt_in("cli").await;
    let api = prompt_in("api").await;
    assert!(web.contains("1 generated visualization(s) will be displayed automatically below your response"), "{web}");
    assert!(cli.contains("1 visualization(s) have been saved to files (/runs/1/figure.png)"), "{cli}");
    assert!(cli.contains("mention the file locations"));
    assert!(!cli.contains("below your response") && !web.contains("/runs/1/figure.png"));
    assert!(api.contains("Note: 1 visualization(s) have been generated"));
    assert!(!api.contains("below your response") && !api.contains("saved to files"));
}

#[tokio::test]
async fn tokens_stream_in_order_and_join_to_the_answer() {
    let provider = answering("The beam current is 500 mA.");
    let respond = respond_with(&provider, chrono_tz::UTC);
    let events = RecordingEvents::default();
    let state = state_with_task("beam current?");
    let outcome = run(&respond, &state, &respond_step(&[]), &events).await.expect("responds");

    let tokens = events.tokens();
    assert!(tokens.len() > 1, "streamed in pieces: {tokens:?}");
    assert!(tokens.iter().all(|(component, role, _)| component == "respond" && role == "response"));
    let joined: String = tokens.iter().map(|(_, _, content)| content.as_str()).collect();
    assert_eq!(joined, "The beam current is 500 mA.");
    let CapabilityOutcome::Done(update) = outcome else { panic!("respond never asks for approval") };
    assert_eq!(update.messages.len(), 1);
    assert_eq!(update.messages[0].role, Role::Assistant);
    assert_eq!(update.messages[0].content, joined);
    assert_eq!(AgentStateUpdate { messages: Vec::new(), ..update }, AgentStateUpdate::default(), "only the message");
}

#[tokio::test]
async fn an_llm_timeout_is_a_retriable_error_not_a_fake_answer() {
    let provider = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Timeout, "no answer within 60 s")));
    let respond = respond_with(&provider, chrono_tz::UTC);
    let error = run(&respond, &state_with_task("hi"), &respond_step(&[]), &NoEvents).await.expect_err("fails");
    let classification = respond.classify_error(&error);
    assert_eq!(classification.severity, ErrorSeverity::Retriable);
    assert!(error.message().contains("no answer within 60 s"), "{}", error.message());
    assert!(!error.message().contains("Response Generation Failed"));
    assert_eq!(provider.requests().len(), 1, "no transport retries in the fake client; the router retries");
    assert_eq!(respond.retry_policy().max_attempts, 3);
}

#[tokio::test]
async fn a_configuration_fault_is_critical() {
    let provider = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Auth { status: 401 }, "key refused")));
    let respond = respond_with(&provider, chrono_tz::UTC);
    let error = run(&respond, &state_with_task("hi"), &respond_step(&[]), &NoEvents).await.expect_err("fails");
    assert_eq!(respond.classify_error(&error).severity, ErrorSeverity::Critical);
}

#[tokio::test]
async fn an_empty_answer_is_retriable() {
    let provider = answering("  \n ");
    let respond = respond_with(&provider, chrono_tz::UTC);
    let error = run(&respond, &state_with_task("hi"), &respond_step(&[]), &NoEvents).await.expect_err("fails");
    assert_eq!(error.message(), EMPTY_ANSWER);
    assert_eq!(respond.classify_error(&error).severity, ErrorSeverity::Retriable);
}

#[test]
fn unclassified_errors_are_critical_and_name_the_failure() {
    let respond = respond_with(&answering("x"), chrono_tz::UTC);
    let classification = respond.classify_error(&CapabilityError::new("boom"));
    assert_eq!(classification.severity, ErrorSeverity::Critical);
    assert_eq!(classification.user_message.as_deref(), Some("Failed to generate response: boom"));
}

#[test]
fn the_date_is_in_the_facility_timezone_and_retrieved_timezones_are_noted() {
    let mut state = state_with_task("When did the beam drop?");
    let entry = json!({"start": "2025-01-15 08:00", "end": "2025-01-15 09:00", "timezone_name": "America/Los_Angeles"});
    state.capability_context_data.insert("TIME_RANGE", "tr", ContextEntry::new(entry, None));
    let respond = respond_with(&answering("x"), chrono_tz::America::Los_Angeles);
    let now = Utc.with_ymd_and_hms(2025, 1, 15, 18, 30, 0).single().expect("valid time");

    let context = respond.response_context(&state, &respond_step(&[("TIME_RANGE", "tr")]), now);
    assert_eq!(context.current_datetime, "2025-01-15 10:30 -0800 (America/Los_Angeles)");
    assert_eq!(context.data_timezone.as_deref(), Some("America/Los_Angeles"));
    assert!(
        context
            .current_task
            .starts_with("When did the beam drop? [NOTE: All retrieved times are in the system local timezone (America/Los_Angeles).")
    );
    let prompt = DefaultResponsePrompts.build(&context);
    assert!(prompt.contains("The current date and time is 2025-01-15 10:30 -0800 (America/Los_Angeles)"));
    assert!(prompt.contains("Label retrieved times with the timezone America/Los_Angeles"));

    let without = respond.response_context(&state, &respond_step(&[]), now);
    assert_eq!(without.data_timezone, None, "only the step's inputs count");
    assert_eq!(without.current_task, "When did the beam drop?");
}

#[test]
fn a_retry_after_a_context_overflow_shortens_the_prompt() {
    let mut state = state_with_task("Summarise the archive");
    state.task.depends_on_chat_history = true;
    // Summaries keep strings up to 200 characters and lists up to 10 items: 10 × 10 × 150 fits.
    let row: Vec<String> = (0..10).map(|index| format!("{index}{}", "x".repeat(150))).collect();
    let huge = vec![row; 10];
    state.capability_context_data.insert("ARCHIVE", "a", ContextEntry::new(json!({"rows": huge}), None));
    let step = respond_step(&[("ARCHIVE", "a")]);
    let respond = respond_with(&answering("x"), chrono_tz::UTC);
    let full = respond.response_context(&state, &step, Utc::now());
    assert!(full.chat_history.is_some());

    let overflow = FakeProvider::error(LlmErrorKind::ContextLength, "too long").classification();
    state.control.error_info = Some(ErrorInfo {
        node: "respond".into(),
        node_kind: NodeKind::Capability,
        classification: overflow,
        retry_policy: respond.retry_policy(),
        original_error: "too long".into(),
        execution_time_ms: 1,
        timestamp: Utc::now(),
    });
    let shortened = respond.response_context(&state, &step, Utc::now());
    assert_eq!(shortened.chat_history, None);
    let summary = shortened.relevant_context[0].1.as_str().expect("shortened to text");
    assert!(summary.ends_with("(shortened to fit the model's context window)"));
    assert!(summary.chars().count() < full.relevant_context[0].1.to_string().chars().count());
}

struct FacilityPrompts;

impl ResponsePrompts for FacilityPrompts {
    fn role(&self) -> String {
        "You are the ALS control-room assistant.".into()
    }

    fn orchestrator_guide(&self) -> peregrine_core::OrchestratorGuide {
        peregrine_core::OrchestratorGuide { instructions: "Always end with respond.".into(), examples: Vec::new(), priority: 100 }
    }
}

#[tokio::test]
async fn overriding_one_prompt_method_changes_the_prompt_and_keeps_the_rest() {
    let provider = answering("ok");
    let respond = respond_with(&provider, chrono_tz::UTC).with_prompts(Arc::new(FacilityPrompts));
    run(&respond, &state_with_task("hello"), &respond_step(&[]), &NoEvents).await.expect("responds");
    let prompt = provider.requests()[0].messages[0].content.clone();
    assert!(prompt.starts_with("You are the ALS control-room assistant.\n\nCURRENT TASK: hello"), "{prompt}");
    assert!(!prompt.contains("workflow automation"));
    assert!(prompt.contains("SYSTEM CAPABILITIES:") && prompt.contains("GUIDELINES:\n1. Provide a clear, accurate response"));
    let guide = respond.spec().orchestrator_guide.as_ref().expect("guide");
    assert_eq!(guide.instructions, "Always end with respond.");
}

#[test]
fn the_default_spec_matches_upstream() {
    let spec = RespondCapability::default_spec();
    assert_eq!(spec.name, "respond");
    assert!(spec.always_active);
    assert_eq!(spec.provides, vec!["FINAL_RESPONSE".to_owned()]);
    assert!(spec.requires.is_empty() && spec.classifier_guide.is_none());
    let guide = spec.orchestrator_guide.expect("orchestrator guide");
    assert_eq!(guide.priority, 100);
    assert!(guide.instructions.starts_with("Plan \"respond\" as the final step"));
    assert_eq!(guide.examples.len(), 2);
    assert!(guide.examples.iter().all(|example| example.step.capability == "respond"));
    assert_eq!(guide.examples[0].step.inputs.len(), 2);
    assert!(guide.examples[1].step.inputs.is_empty());
}

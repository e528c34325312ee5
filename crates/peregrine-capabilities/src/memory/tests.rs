//! Tests of the memory capability (reference §8.2 case 21 and the rejection fix).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use peregrine_agent::{AgentSettings, Services};
use peregrine_core::capability::NoEvents;
use peregrine_core::state::session_keys;
use peregrine_core::{
    AgentControl, AgentState, ApprovalAnswer, ApprovalMode, CapabilityError, CapabilityInput, CapabilityOutcome, ContextEntry,
    ErrorSeverity, InputRef, Message, PlannedStep,
};
use peregrine_llm::{ChatRequest, FakeProvider, LlmError, LlmErrorKind};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::*;

const CONTENT: &str = "The injector is most stable after a 15 minute warm-up";

fn fixed_now() -> DateTime<Utc> {
    // 10:30 in Los Angeles (PDT, the day after the March change).
    Utc.with_ymd_and_hms(2025, 3, 10, 17, 30, 0).single().expect("valid time")
}

struct Fixture {
    dir: TempDir,
    fake: FakeProvider,
    capability: MemoryCapability,
}

fn fixture_with(
    configure: impl FnOnce(&mut AgentSettings),
    answer: impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static,
) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = AgentSettings { timezone: chrono_tz::America::Los_Angeles, ..AgentSettings::with_data_dir(dir.path()) };
    configure(&mut settings);
    let fake = FakeProvider::by_schema(answer);
    let services = Services::new(Arc::new(fake.client()), settings);
    let store = MemoryStore::new(dir.path());
    let capability = MemoryCapability::new(services, store).with_clock(fixed_now);
    Fixture { dir, fake, capability }
}

fn answers(operation: &'static str, extraction: Value) -> impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static {
    move |schema, _| match schema {
        "MemoryOperationClassification" => Ok(json!({"operation": operation, "reasoning": "the user says so"}).to_string()),
        "MemoryContentExtraction" => Ok(extraction.to_string()),
        other => panic!("unexpected call with schema '{other}'"),
    }
}

fn saving() -> impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static {
    answers("save", json!({"content": format!("  {CONTENT}  "), "found": true, "explanation": "explicit request"}))
}

fn no_llm() -> impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static {
    |schema, _| panic!("no LLM call expected, got '{schema}'")
}

fn fixture(answer: impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static) -> Fixture {
    fixture_with(|_| {}, answer)
}

fn state(user_id: Option<&str>, approval_mode: ApprovalMode) -> AgentState {
    let mut state = AgentState {
        messages: vec![
            Message::user("The injector drifted again this morning"),
            Message::assistant("It settled after about 15 minutes."),
            Message::user(format!("Remember that: {CONTENT}")),
        ],
        agent_control: AgentControl { approval_mode, ..AgentControl::default() },
        session_state: BTreeMap::new(),
        ..AgentState::default()
    };
    if let Some(user_id) = user_id {
        state.session_state.insert(session_keys::USER_ID.into(), json!(user_id));
    }
    state.capability_context_data.insert("PV_VALUES", "injector_current", ContextEntry::new(json!({"current_mA": 4.2}), None));
    state
}

fn step() -> PlannedStep {
    PlannedStep {
        context_key: "memory_save".into(),
        capability: MEMORY_CAPABILITY.into(),
        task_objective: "Save the injector warm-up finding to memory".into(),
        success_criteria: "saved".into(),
        expected_output: Some(MEMORY_CONTEXT.into()),
        parameters: None,
        inputs: vec![InputRef::new("PV_VALUES", "injector_current")],
    }
}

async fn run(
    capability: &MemoryCapability,
    state: &AgentState,
    approval: Option<&ApprovalAnswer>,
) -> Result<CapabilityOutcome, CapabilityError> {
    let step = step();
    let input = CapabilityInput { state, step: &step, spec: capability.spec(), events: &NoEvents, approval };
    capability.execute(input).await
}

fn stored_context(outcome: CapabilityOutcome) -> MemoryContext {
    let CapabilityOutcome::Done(update) = outcome else { panic!("expected Done, got {outcome:?}") };
    update.context.expect("context stored").get::<MemoryContext>("memory_save").expect("decodes").expect("under the step key")
}

fn answer(payload: Value, approved: bool, delivery: u32) -> ApprovalAnswer {
    ApprovalAnswer { approval_type: MEMORY_SAVE_APPROVAL.into(), approved, payload, delivery, edit: None, feedback: None }
}

fn expected_payload() -> Value {
    json!({
        "approval_type": "memory_save",
        "step_objective": "Save the injector warm-up finding to memory",
        "content": CONTENT,
        "operation_type": "save",
        "user_id": "alice",
    })
}

#[tokio::test]
async fn a_save_with_approval_enabled_asks_first_and_writes_nothing() {
    let f = fixture(saving());
    let outcome = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect("runs");
    let CapabilityOutcome::NeedsApproval(request) = outcome else { panic!("expected an approval request, got {outcome:?}") };
    assert_eq!(request.approval_type, "memory_save");
    assert_eq!(request.payload, expected_payload());
    assert!(request.user_message.starts_with("⚠️ **HUMAN APPROVAL REQUIRED** ⚠️"));
    assert!(request.user_message.contains(&format!("```\n{CONTENT}\n```")), "{}", request.user_message);
    assert!(!f.dir.path().join("user_memory/alice.json").exists());
    assert_eq!(f.fake.requests_for("MemoryOperationClassification").len(), 1);
    let extraction = f.fake.requests_for("MemoryContentExtraction");
    assert_eq!(extraction.len(), 1);
    let prompt = &extraction[0].messages.last().expect("user message").content;
    assert!(prompt.contains("User: The injector drifted again this morning\nAssistant: It settled"), "{prompt}");
    assert!(prompt.contains("- {\"PV_VALUES\": \"injector_current\"}: {\"current_mA\":4.2}"), "{prompt}");
}

#[tokio::test]
async fn the_extraction_prompt_carries_only_the_recent_history_within_the_budget() {
    let f = fixture_with(|settings| settings.prompt_history_chars = 300, saving());
    let mut state = state(Some("alice"), ApprovalMode::Selective);
    let request = state.messages.pop().expect("the save request");
    for index in 0..40 {
        state.messages.push(Message::user(format!("shift note {index:02} {}", "n".repeat(50))));
        state.messages.push(Message::assistant(format!("noted {index:02} {}", "o".repeat(50))));
    }
    state.messages.push(request);
    run(&f.capability, &state, None).await.expect("asks for approval");
    let extraction = f.fake.requests_for("MemoryContentExtraction");
    let prompt = &extraction[0].messages.last().expect("user message").content;
    let history = prompt.split("Chat history:\n").nth(1).and_then(|rest| rest.split("\n\nStep inputs").next()).expect("a history section");
    assert!(history.chars().count() <= 340, "{history}");
    assert!(history.starts_with('(') && history.contains(" earlier messages omitted)\n"), "{history}");
    assert!(history.ends_with(&format!("User: Remember that: {CONTENT}")), "the request is always kept: {history}");
    assert!(!history.contains("shift note 00") && !history.contains("The injector drifted"));
}

#[tokio::test]
async fn an_approved_answer_appends_exactly_the_approved_content_without_llm_calls() {
    let f = fixture(no_llm());
    let outcome = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), Some(&answer(expected_payload(), true, 1)))
        .await
        .expect("saved");
    let context = stored_context(outcome);
    assert_eq!(context.operation_type, MemoryOperation::Save);
    assert_eq!(context.memory_data, json!({"saved_content": CONTENT, "timestamp": "2025-03-10 10:30"}));
    assert!(f.fake.requests().is_empty());
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("user_memory/alice.json")).expect("file")).expect("json");
    assert_eq!(file["entries"], json!([{"timestamp": "2025-03-10 10:30", "content": CONTENT}]));
}

#[tokio::test]
async fn a_redelivered_approval_does_not_save_twice() {
    let f = fixture(no_llm());
    let state = state(Some("alice"), ApprovalMode::Selective);
    run(&f.capability, &state, Some(&answer(expected_payload(), true, 1))).await.expect("saved");
    let again = stored_context(run(&f.capability, &state, Some(&answer(expected_payload(), true, 2))).await.expect("checked"));
    assert!(again.operation_result.contains("Already saved"), "{}", again.operation_result);
    assert_eq!(f.capability.store().entries("alice").await.expect("read").len(), 1);
    // A new approval (first delivery) of the same text is a deliberate second save.
    run(&f.capability, &state, Some(&answer(expected_payload(), true, 1))).await.expect("saved");
    assert_eq!(f.capability.store().entries("alice").await.expect("read").len(), 2);
}

#[tokio::test]
async fn a_rejected_save_writes_nothing_and_does_not_ask_again() {
    let f = fixture(no_llm());
    let outcome = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), Some(&answer(expected_payload(), false, 1)))
        .await
        .expect("handled");
    let context = stored_context(outcome);
    assert_eq!(context.operation_result, "cancelled by the user");
    assert_eq!(context.memory_data, json!({"rejected_content": CONTENT}));
    assert!(f.fake.requests().is_empty());
    assert!(!f.dir.path().join("user_memory/alice.json").exists());
}

#[tokio::test]
async fn an_edited_approval_saves_the_edit() {
    let f = fixture(no_llm());
    let mut edited = answer(expected_payload(), true, 1);
    edited.edit = Some(json!({"content": "Injector: allow a 20 minute warm-up"}));
    run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), Some(&edited)).await.expect("saved");
    let entries = f.capability.store().entries("alice").await.expect("read");
    assert_eq!(entries.iter().map(|e| e.content.as_str()).collect::<Vec<_>>(), ["Injector: allow a 20 minute warm-up"]);
    edited.edit = Some(json!(42));
    let error = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), Some(&edited)).await.expect_err("unusable edit");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Retriable);
}

#[tokio::test]
async fn an_approval_for_another_user_saves_nothing() {
    let f = fixture(no_llm());
    let error = run(&f.capability, &state(Some("mallory"), ApprovalMode::Selective), Some(&answer(expected_payload(), true, 1)))
        .await
        .expect_err("refused");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Critical);
    assert!(!f.dir.path().join("user_memory/mallory.json").exists() && !f.dir.path().join("user_memory/alice.json").exists());
}

#[tokio::test]
async fn no_user_id_is_critical_before_any_llm_call() {
    let f = fixture(no_llm());
    let error = run(&f.capability, &state(None, ApprovalMode::Selective), None).await.expect_err("no user");
    let classification = error.default_classification();
    assert_eq!(classification.severity, ErrorSeverity::Critical);
    assert_eq!(classification.user_message.as_deref(), Some("no user id in the session; memory needs one (set session user_id)"));
    assert!(f.fake.requests().is_empty());
}

#[tokio::test]
async fn without_approval_the_content_is_saved_directly() {
    let f = fixture(saving());
    let context = stored_context(run(&f.capability, &state(Some("alice"), ApprovalMode::Disabled), None).await.expect("saved"));
    assert_eq!(context.memory_data["saved_content"], CONTENT);
    assert_eq!(f.capability.store().entries("alice").await.expect("read").len(), 1);
    assert_eq!(f.fake.requests().len(), 2);

    let selective_off = fixture_with(|settings| settings.approval.capabilities.memory.enabled = false, saving());
    let outcome = run(&selective_off.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect("saved");
    assert!(matches!(outcome, CapabilityOutcome::Done(_)));
    let forced = fixture_with(|settings| settings.approval.capabilities.memory.enabled = false, saving());
    let outcome = run(&forced.capability, &state(Some("alice"), ApprovalMode::AllCapabilities), None).await.expect("asks");
    assert!(matches!(outcome, CapabilityOutcome::NeedsApproval(_)));
}

#[tokio::test]
async fn retrieve_returns_every_entry_with_one_llm_call() {
    let f = fixture(answers("retrieve", Value::Null));
    let now = chrono::NaiveDate::from_ymd_opt(2025, 3, 1).and_then(|d| d.and_hms_opt(8, 0, 0)).expect("valid");
    f.capability.store().append("alice", "first note", now).await.expect("saved");
    f.capability.store().append("alice", "second note", now).await.expect("saved");
    let context = stored_context(run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect("retrieved"));
    assert_eq!(context.operation_type, MemoryOperation::Retrieve);
    assert_eq!(
        context.memory_data,
        json!({"memories": [
            {"timestamp": "2025-03-01 08:00", "content": "first note"},
            {"timestamp": "2025-03-01 08:00", "content": "second note"}
        ]})
    );
    assert_eq!(context.operation_result, "Retrieved 2 memory entries");
    assert_eq!(f.fake.requests().len(), 1);
    let classification = &f.fake.requests_for("MemoryOperationClassification")[0];
    assert!(classification.messages.iter().any(|m| m.content.contains("Task: Save the injector warm-up finding to memory")));
}

#[tokio::test]
async fn nothing_to_save_asks_for_a_new_plan() {
    let f = fixture(answers("save", json!({"content": "", "found": false, "explanation": "only a question"})));
    let error = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect_err("nothing found");
    let classification = error.default_classification();
    assert_eq!(classification.severity, ErrorSeverity::Replanning);
    assert!(error.message().contains("only a question"), "{}", error.message());
}

#[tokio::test]
async fn llm_faults_keep_their_classification() {
    let f = fixture(|_, _| Err(FakeProvider::error(LlmErrorKind::Timeout, "slow")));
    let error = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect_err("timeout");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Retriable);
}

#[tokio::test]
async fn a_corrupt_memory_file_is_critical_and_named() {
    let f = fixture(answers("retrieve", Value::Null));
    std::fs::create_dir_all(f.dir.path().join("user_memory")).expect("dir");
    std::fs::write(f.dir.path().join("user_memory/alice.json"), "{oops").expect("write");
    let error = run(&f.capability, &state(Some("alice"), ApprovalMode::Selective), None).await.expect_err("corrupt");
    let classification = error.default_classification();
    assert_eq!(classification.severity, ErrorSeverity::Critical);
    assert!(classification.user_message.unwrap_or_default().contains("alice.json"));
}

#[test]
fn the_spec_describes_memory() {
    let f = fixture(no_llm());
    let spec = f.capability.spec();
    assert_eq!(spec.name, "memory");
    assert_eq!(spec.provides, ["MEMORY_CONTEXT"]);
    assert_eq!(spec.orchestrator_guide.as_ref().map(|guide| guide.priority), Some(10));
    let guide = spec.classifier_guide.as_ref().expect("classifier guide");
    assert!(guide.examples.iter().any(|e| e.result && e.query.starts_with("Remember")));
    assert!(guide.examples.iter().any(|e| !e.result));
}

#[test]
fn custom_prompts_replace_the_guides() {
    struct Terse;
    impl MemoryPrompts for Terse {
        fn orchestrator_guide(&self) -> peregrine_core::OrchestratorGuide {
            peregrine_core::OrchestratorGuide { instructions: "terse".into(), examples: Vec::new(), priority: 3 }
        }
    }
    let f = fixture(no_llm());
    let capability = f.capability.with_prompts(Arc::new(Terse));
    assert_eq!(capability.spec().orchestrator_guide.as_ref().map(|guide| guide.priority), Some(3));
    assert!(capability.spec().classifier_guide.is_some());
}

#[test]
fn approval_prompts_fence_content_that_contains_backticks() {
    let decision = peregrine_core::ApprovalDecision { needs_approval: true, reasoning: "memory saves ask".into() };
    let request = approval_request("save it", "alice", "run ```make``` first", &decision);
    assert!(request.user_message.contains("````\nrun ```make``` first\n````"), "{}", request.user_message);
}

//! Unit tests of the orchestrator: prompt sections, the narrowed schema, validation mapping,
//! and the planning-mode approval round trip (approve, edit, edited file, reject).

use std::sync::Arc;

use peregrine_core::state::{ErrorInfo, NodeKind};
use peregrine_core::{
    AgentState, CapabilityOutcome, CapabilitySpec, ContextEntry, ErrorClassification, ErrorSeverity, ExecutionPlan, Message,
    OrchestratorExample, OrchestratorGuide, PlannedStep, RetryPolicy, Slot,
};
use peregrine_graph::{NodeContext, ResumeRecord, RunEvent};
use peregrine_llm::{ChatRequest, FakeProvider, LlmErrorKind};
use serde_json::{Value, json};

use super::pending::PendingPlans;
use super::*;
use crate::settings::AgentSettings;

fn spec(name: &str, priority: Option<i32>) -> CapabilitySpec {
    let mut spec = CapabilitySpec::new(name, format!("{name} things"));
    spec.orchestrator_guide = priority.map(|priority| OrchestratorGuide {
        instructions: format!("Plan {name} steps like this."),
        examples: vec![OrchestratorExample {
            step: PlannedStep {
                context_key: format!("{name}_out"),
                capability: name.into(),
                task_objective: format!("Use {name}"),
                success_criteria: "done".into(),
                expected_output: Some("RESULT".into()),
                parameters: None,
                inputs: vec![],
            },
            scenario_description: format!("When {name} is needed"),
            context_requirements: None,
            notes: Some(format!("{name} note")),
        }],
        priority,
    });
    spec
}

fn catalog() -> Arc<Catalog> {
    Arc::new(Catalog::new(vec![
        spec("respond", Some(100)),
        spec("clarify", Some(99)),
        spec("python", Some(40)),
        spec("time_range_parsing", Some(5)),
        spec("channel_read", Some(10)),
        spec("no_guide", None),
    ]))
}

struct Fixture {
    fake: FakeProvider,
    orchestrator: Orchestrator,
    dir: tempfile::TempDir,
}

fn fixture(answer: impl Fn(&ChatRequest) -> Result<String, peregrine_llm::LlmError> + Send + Sync + 'static) -> Fixture {
    let fake = FakeProvider::by_schema(move |name, request| {
        assert_eq!(name, "ExecutionPlan", "the orchestrator only makes ExecutionPlan calls");
        answer(request)
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let services = Services::new(Arc::new(fake.client()), AgentSettings::with_data_dir(dir.path()));
    Fixture { orchestrator: Orchestrator::new(services, catalog()), fake, dir }
}

fn answering(plan: Value) -> Fixture {
    let text = plan.to_string();
    fixture(move |_| Ok(text.clone()))
}

fn step(key: &str, capability: &str, inputs: Value) -> Value {
    json!({"context_key": key, "capability": capability, "task_objective": format!("do {key}"), "success_criteria": "ok", "inputs": inputs})
}

fn state(active: &[&str]) -> AgentState {
    let mut state = AgentState::default();
    state.messages.push(Message::user("earlier question"));
    state.messages.push(Message::assistant("earlier answer"));
    state.messages.push(Message::user("plot the beam current"));
    state.task.current_task = Some("Plot the beam current of the last hour".into());
    state.planning.active_capabilities = active.iter().map(|name| (*name).to_owned()).collect();
    state
}

fn ctx() -> NodeContext<AgentState> {
    NodeContext::standalone("thread-1", ORCHESTRATOR)
}

fn resumed(request: &ApprovalRequest, answer: Value) -> NodeContext<AgentState> {
    ctx().with_resume(ResumeRecord {
        interrupt_id: "interrupt-1".into(),
        node: ORCHESTRATOR.into(),
        payload: json!({"approval_type": request.approval_type, "user_message": request.user_message, "resume_payload": request.payload}),
        answer,
        delivery: 1,
    })
}

fn planned(outcome: CapabilityOutcome) -> (ExecutionPlan, AgentStateUpdate) {
    match outcome {
        CapabilityOutcome::Done(update) => match &update.execution_plan {
            Slot::Set(Some(plan)) => (plan.clone(), update),
            other => panic!("no plan in the update: {other:?}"),
        },
        CapabilityOutcome::NeedsApproval(request) => panic!("unexpected approval request: {request:?}"),
    }
}

fn approval(outcome: CapabilityOutcome) -> ApprovalRequest {
    match outcome {
        CapabilityOutcome::NeedsApproval(request) => request,
        CapabilityOutcome::Done(update) => panic!("expected an approval request, got {update:?}"),
    }
}

fn capabilities(plan: &ExecutionPlan) -> Vec<&str> {
    plan.steps.iter().map(|step| step.capability.as_str()).collect()
}

fn prompt_of(fake: &FakeProvider) -> String {
    let requests = fake.requests_for("ExecutionPlan");
    requests.last().expect("one ExecutionPlan call").messages.iter().map(|message| message.content.clone()).collect::<Vec<_>>().join("\n")
}

fn position(haystack: &str, needle: &str) -> usize {
    haystack.find(needle).unwrap_or_else(|| panic!("{needle:?} missing from:\n{haystack}"))
}

fn error_info(classification: ErrorClassification) -> ErrorInfo {
    ErrorInfo {
        node: "python".into(),
        node_kind: NodeKind::Capability,
        classification,
        retry_policy: RetryPolicy::capability_default(),
        original_error: "boom".into(),
        execution_time_ms: 5,
        timestamp: Utc::now(),
    }
}

#[tokio::test]
async fn the_prompt_has_every_section_in_order() {
    let f = answering(json!({"steps": [step("answer", "respond", json!([]))]}));
    let mut state = state(&["respond", "python", "time_range_parsing", "clarify"]);
    state.task.depends_on_chat_history = true;
    state.capability_context_data.insert(
        "TIME_RANGE",
        "tr_1",
        ContextEntry::new(json!({"start": "a"}), Some("Parse \"last hour\"".into())),
    );
    state.capability_context_data.insert("CHANNEL_VALUES", "vals", ContextEntry::new(json!([1, 2]), None));
    state.control.has_error = true;
    state.control.error_info =
        Some(error_info(ErrorClassification::replanning("Channel not found").with_metadata("technical_details", "SR:XX does not exist")));
    f.orchestrator.execute(&state, &ctx()).await.expect("plans");
    let prompt = prompt_of(&f.fake);

    let order = [
        "You are an expert execution planner",
        "Each step must follow the PlannedStep structure",
        "End plans with either \"respond\" or \"clarify\"",
        "Never plan for simulated or fictional data",
        "**CONVERSATION HISTORY:**",
        "**CONTEXT REUSE GUIDANCE:**",
        "**REPLANNING CONTEXT:**",
        "**AVAILABLE CONTEXT:**",
        "# CAPABILITY PLANNING GUIDELINES",
        "## time_range_parsing",
        "## python",
        "## clarify",
        "## respond",
        "TASK TO PLAN: Plot the beam current of the last hour",
    ];
    let positions: Vec<usize> = order.iter().map(|needle| position(&prompt, needle)).collect();
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "sections out of order: {positions:?}\n{prompt}");
    assert!(prompt.ends_with("TASK TO PLAN: Plot the beam current of the last hour"));

    // The history, the last error as format_for_llm prints it, and the stored context.
    assert!(prompt.contains("User: earlier question") && prompt.contains("Assistant: earlier answer"));
    assert!(
        prompt.contains(
            "**Previous Execution Error:**\n- **User Message:** Channel not found\n- **Technical Details:** SR:XX does not exist"
        )
    );
    assert!(prompt.contains(r#"{"TIME_RANGE": "tr_1"}: "Parse \"last hour\"""#), "{prompt}");
    assert!(prompt.contains(r#"{"CHANNEL_VALUES": "vals"}: "(no description)""#), "{prompt}");
    assert!(prompt.contains("PRIORITIZE CONTEXT REUSE") && !prompt.contains("LEVERAGE USER MEMORY"));
    // Guides of inactive capabilities stay out; examples are PlannedStep(...) blocks.
    assert!(!prompt.contains("## channel_read") && !prompt.contains("## no_guide"));
    assert!(prompt.contains(
        "**Example 1:**\n**When python is needed**\n   PlannedStep(\n       context_key=\"python_out\",\n       capability=\"python\","
    ));
    assert!(prompt.contains("   - Note: python note"));
    assert!(!prompt.contains("PREVIOUS PLAN REJECTED"));
}

#[tokio::test]
async fn history_and_reuse_guidance_follow_the_dependency_flags() {
    let f = answering(json!({"steps": []}));
    let plain = state(&["python"]);
    f.orchestrator.execute(&plain, &ctx()).await.expect("plans");
    let prompt = prompt_of(&f.fake);
    for absent in ["CONVERSATION HISTORY", "earlier question", "CONTEXT REUSE GUIDANCE", "REPLANNING CONTEXT", "AVAILABLE CONTEXT"] {
        assert!(!prompt.contains(absent), "{absent} must be absent:\n{prompt}");
    }

    let mut memory = state(&["python"]);
    memory.task.depends_on_user_memory = true;
    f.orchestrator.execute(&memory, &ctx()).await.expect("plans");
    let prompt = prompt_of(&f.fake);
    assert!(prompt.contains("LEVERAGE USER MEMORY") && prompt.contains("EFFICIENCY FIRST"));
    assert!(!prompt.contains("CONVERSATION HISTORY") && !prompt.contains("PRIORITIZE CONTEXT REUSE"));
}

/// The `enum` of the `capability` property, wherever the schema keeps the step.
fn capability_enum(schema: &Value) -> Option<Vec<String>> {
    match schema {
        Value::Object(object) => {
            if let Some(values) = object.get("properties").and_then(|p| p.get("capability")).and_then(|c| c.get("enum")) {
                return Some(values.as_array()?.iter().filter_map(Value::as_str).map(str::to_owned).collect());
            }
            object.values().find_map(capability_enum)
        }
        Value::Array(items) => items.iter().find_map(capability_enum),
        _ => None,
    }
}

#[tokio::test]
async fn the_schema_allows_only_active_capabilities_plus_respond_and_clarify() {
    let f = answering(json!({"steps": []}));
    f.orchestrator.execute(&state(&["python", "time_range_parsing", "not_registered"]), &ctx()).await.expect("plans");
    let requests = f.fake.requests_for("ExecutionPlan");
    assert_eq!(requests.len(), 1, "exactly one structured call");
    let schema = requests[0].response_schema.as_ref().expect("schema sent");
    assert_eq!(schema.name, "ExecutionPlan");
    let allowed = capability_enum(&schema.schema).expect("capability enum");
    assert_eq!(allowed, ["time_range_parsing", "python", "respond", "clarify"]);
}

#[tokio::test]
async fn a_valid_plan_is_completed_and_installed() {
    let f = answering(json!({"steps": [step("t", "time_range_parsing", json!([])), step("p", "python", json!([{"TIME_RANGE": "t"}]))]}));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let context = ctx().with_events(tx);
    let outcome = f.orchestrator.execute(&state(&["python", "time_range_parsing", "respond"]), &context).await.expect("plans");
    let (plan, update) = planned(outcome);
    assert_eq!(capabilities(&plan), ["time_range_parsing", "python", "respond"], "respond appended");
    assert_eq!(plan.steps[2], PlannedStep::generic_respond("Plot the beam current of the last hour"));
    assert_eq!(update.current_step_index, Some(0));
    assert_eq!(f.fake.requests().len(), 1);
    let mut created = None;
    while let Ok(event) = rx.try_recv() {
        if let RunEvent::Custom(AgentEvent { kind: EventKind::PlanCreated { steps }, .. }) = event {
            created = Some(steps);
        }
    }
    assert_eq!(created.expect("PlanCreated emitted"), plan.steps);
}

#[tokio::test]
async fn validation_failures_map_to_their_recovery() {
    let table = [
        (json!({"steps": [step("x", "flux_capacitor", json!([]))]}), ErrorSeverity::Reclassification, "flux_capacitor"),
        (json!({"steps": [step("x", "python", json!([{"DATA": "missing"}]))]}), ErrorSeverity::Replanning, "{\"DATA\": \"missing\"}"),
        (
            json!({"steps": [step("a", "python", json!([{"TIME_RANGE": "b"}])), step("b", "time_range_parsing", json!([]))]}),
            ErrorSeverity::Replanning,
            "produces later",
        ),
    ];
    for (answer, severity, detail) in table {
        let f = answering(answer);
        let error = f.orchestrator.execute(&state(&["python", "time_range_parsing"]), &ctx()).await.expect_err("refused");
        let classification = f.orchestrator.classify_error(&error);
        assert_eq!(classification.severity, severity, "{error}");
        assert!(classification.format_for_llm().contains(detail), "{detail}: {}", classification.format_for_llm());
    }
}

#[tokio::test]
async fn preconditions_and_llm_failures_are_classified() {
    let f = answering(json!({"steps": []}));
    let mut no_task = state(&["python"]);
    no_task.task.current_task = None;
    let error = f.orchestrator.execute(&no_task, &ctx()).await.expect_err("no task");
    assert_eq!(f.orchestrator.classify_error(&error).severity, ErrorSeverity::Critical);
    let error = f.orchestrator.execute(&state(&[]), &ctx()).await.expect_err("nothing active");
    assert_eq!(f.orchestrator.classify_error(&error).severity, ErrorSeverity::Reclassification);
    assert!(f.fake.requests().is_empty(), "no LLM call when a precondition fails");

    for (kind, severity) in
        [(LlmErrorKind::Timeout, ErrorSeverity::Retriable), (LlmErrorKind::Auth { status: 401 }, ErrorSeverity::Critical)]
    {
        let failing = fixture(move |_| Err(FakeProvider::error(kind.clone(), "nope")));
        let error = failing.orchestrator.execute(&state(&["python"]), &ctx()).await.expect_err("LLM failed");
        assert_eq!(failing.orchestrator.classify_error(&error).severity, severity);
    }
    let garbage = fixture(|_| Ok("no plan here".into()));
    let error = garbage.orchestrator.execute(&state(&["python"]), &ctx()).await.expect_err("invalid output");
    assert_eq!(garbage.orchestrator.classify_error(&error).severity, ErrorSeverity::Retriable);
}

fn planning_state() -> AgentState {
    let mut state = state(&["python", "time_range_parsing"]);
    state.agent_control.planning_mode_enabled = true;
    state
}

async fn ask_for_approval(f: &Fixture) -> ApprovalRequest {
    approval(f.orchestrator.execute(&planning_state(), &ctx()).await.expect("asks"))
}

#[tokio::test]
async fn planning_mode_saves_the_plan_per_thread_and_asks_for_approval() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    assert_eq!(request.approval_type, "orchestrator_plan");
    assert_eq!(request.payload["approval_type"], "orchestrator_plan");
    let plan: ExecutionPlan = serde_json::from_value(request.payload["execution_plan"].clone()).expect("plan in payload");
    assert_eq!(capabilities(&plan), ["python", "respond"], "the validated plan is what gets approved");
    let path = f.dir.path().join("execution_plans/pending_plans/thread-1/pending_execution_plan.json");
    assert_eq!(request.payload["plan_file_path"], path.display().to_string());
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("pending file written")).expect("json");
    assert_eq!(saved["__metadata__"]["current_task"], "Plot the beam current of the last hour");
    assert_eq!(saved["__metadata__"]["original_query"], "plot the beam current");
    assert_eq!(saved["__metadata__"]["serialization_type"], "pending_execution_plan");
    assert_eq!(saved["steps"], request.payload["execution_plan"]["steps"]);
    assert!(request.user_message.starts_with("⚠️ **HUMAN APPROVAL REQUIRED** ⚠️"));
    assert!(request.user_message.contains("1. **python** → `p`: do p") && request.user_message.contains("2. **respond**"));
}

#[tokio::test]
async fn an_approved_plan_is_used_without_an_llm_call_and_the_files_are_removed() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    assert_eq!(f.fake.requests().len(), 1);
    let (plan, update) = planned(f.orchestrator.execute(&planning_state(), &resumed(&request, json!(true))).await.expect("approved"));
    assert_eq!(capabilities(&plan), ["python", "respond"]);
    assert_eq!(update.current_step_index, Some(0));
    assert_eq!(f.fake.requests().len(), 1, "no new LLM call after approval");
    let pending = PendingPlans::for_thread(f.dir.path(), "thread-1");
    assert!(!pending.pending_path().exists() && !pending.dir().exists(), "pending files removed");
}

#[tokio::test]
async fn an_edit_sent_with_the_approval_is_validated_and_used() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    let edit = json!({"steps": [step("t", "time_range_parsing", json!([])), step("p2", "python", json!([{"TIME_RANGE": "t"}]))]});
    let answer = json!({"approved": true, "edit": edit});
    let (plan, _) = planned(f.orchestrator.execute(&planning_state(), &resumed(&request, answer)).await.expect("edited"));
    assert_eq!(capabilities(&plan), ["time_range_parsing", "python", "respond"], "the edit, completed by validation");
    assert_eq!(f.fake.requests().len(), 1);
}

#[tokio::test]
async fn a_plan_file_changed_after_the_answer_does_not_change_what_runs() {
    // The agent attaches an editor's file to the answer when the answer is given; a file that
    // appears later (e.g. while the answer is redelivered after a crash) is ignored.
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    let pending = PendingPlans::for_thread(f.dir.path(), "thread-1");
    let modified = json!({"__metadata__": {"edited_by": "plan editor"}, "steps": [step("only", "clarify", json!([]))]});
    std::fs::write(pending.modified_path(), modified.to_string()).expect("write edited plan");
    assert_eq!(pending.load_modified_value().expect("readable"), Some(modified));
    let (plan, _) = planned(f.orchestrator.execute(&planning_state(), &resumed(&request, json!(true))).await.expect("approved"));
    assert_eq!(capabilities(&plan), ["python", "respond"], "the plan that was approved runs");
    assert!(!pending.modified_path().exists() && !pending.pending_path().exists(), "the files are cleared");
    assert_eq!(f.fake.requests().len(), 1);
}

#[tokio::test]
async fn an_invalid_edit_asks_for_a_new_plan() {
    let bad_edits = [
        (json!({"steps": [step("x", "flux_capacitor", json!([]))]}), "flux_capacitor"),
        (json!({"steps": [step("x", "python", json!([{"DATA": "missing"}]))]}), "missing"),
        (json!({"plan": "whatever"}), "expected an execution plan"),
        (json!({"steps": [{"capability": "python"}]}), "not a valid execution plan"),
    ];
    for (edit, detail) in bad_edits {
        let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
        let request = ask_for_approval(&f).await;
        let answer = json!({"approved": true, "edit": edit});
        let error = f.orchestrator.execute(&planning_state(), &resumed(&request, answer)).await.expect_err("invalid edit");
        let classification = f.orchestrator.classify_error(&error);
        assert_eq!(classification.severity, ErrorSeverity::Replanning, "{error}");
        assert!(classification.format_for_llm().contains(detail), "{detail}: {}", classification.format_for_llm());
        assert_eq!(f.fake.requests().len(), 1, "no LLM call for an invalid edit");
    }
}

#[tokio::test]
async fn a_rejected_plan_is_planned_again_differently() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    let again = approval(f.orchestrator.execute(&planning_state(), &resumed(&request, json!(false))).await.expect("plans again"));
    assert_eq!(f.fake.requests().len(), 2, "one new LLM call after a rejection");
    let prompt = prompt_of(&f.fake);
    assert!(prompt.contains("**PREVIOUS PLAN REJECTED:**") && prompt.contains("1. **python** → `p`: do p"), "{prompt}");
    assert_eq!(again.approval_type, "orchestrator_plan", "planning mode asks again");
    assert!(PendingPlans::for_thread(f.dir.path(), "thread-1").pending_path().exists(), "the new plan is pending");

    // Without planning mode the new plan is installed directly.
    let mut no_planning = planning_state();
    no_planning.agent_control.planning_mode_enabled = false;
    let (plan, _) = planned(f.orchestrator.execute(&no_planning, &resumed(&again, json!({"approved": false}))).await.expect("plans"));
    assert_eq!(capabilities(&plan), ["python", "respond"]);
    assert_eq!(f.fake.requests().len(), 3);
}

#[tokio::test]
async fn a_pending_plan_that_cannot_be_written_is_critical() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let blocker = f.dir.path().join("not_a_dir");
    std::fs::write(&blocker, "file").expect("write");
    let services = Services::new(Arc::new(f.fake.client()), AgentSettings::with_data_dir(&blocker));
    let orchestrator = Orchestrator::new(services, catalog());
    let error = orchestrator.execute(&planning_state(), &ctx()).await.expect_err("cannot write");
    let classification = orchestrator.classify_error(&error);
    assert_eq!(classification.severity, ErrorSeverity::Critical);
    assert!(classification.format_for_llm().contains("not_a_dir"), "{}", classification.format_for_llm());
}

#[tokio::test]
async fn custom_prompts_replace_sections() {
    struct Terse;
    impl OrchestratorPrompts for Terse {
        fn role(&self) -> String {
            "You plan beamline work.".into()
        }
    }
    let f = answering(json!({"steps": []}));
    let orchestrator = Orchestrator::new(Services::new(Arc::new(f.fake.client()), AgentSettings::with_data_dir(f.dir.path())), catalog())
        .with_prompts(Arc::new(Terse));
    orchestrator.execute(&state(&["python"]), &ctx()).await.expect("plans");
    let prompt = prompt_of(&f.fake);
    assert!(prompt.starts_with("You plan beamline work.") && !prompt.contains("expert execution planner"));
    assert!(prompt.contains("## python"));
}

#[tokio::test]
async fn what_the_user_said_when_rejecting_reaches_the_new_plan() {
    let f = answering(json!({"steps": [step("p", "python", json!([]))]}));
    let request = ask_for_approval(&f).await;
    let answer = json!({"approved": false, "feedback": "no, plot it as a histogram instead"});
    approval(f.orchestrator.execute(&planning_state(), &resumed(&request, answer)).await.expect("plans again"));
    let prompt = prompt_of(&f.fake);
    assert!(prompt.contains("The user said when rejecting it: \"no, plot it as a histogram instead\""), "{prompt}");
}

#[test]
fn the_approval_prompt_shows_everything_that_steers_a_step() {
    let mut planned = step("w", "python", json!([]));
    planned["parameters"] = json!({"setpoint": 50});
    planned["expected_output"] = json!("PYTHON_RESULTS");
    planned["success_criteria"] = json!("the setpoint is applied");
    let plan: ExecutionPlan = serde_json::from_value(json!({"steps": [planned]})).expect("plan");
    let shown = super::prompt::numbered_steps(&plan);
    for needle in ["parameters: `{\"setpoint\":50}`", "expected output: PYTHON_RESULTS", "success criteria: the setpoint is applied"] {
        assert!(shown.contains(needle), "{needle} missing in {shown}");
    }
}

#[tokio::test]
async fn a_turn_with_only_respond_and_clarify_is_planned_without_a_model_call() {
    let f = answering(json!({"steps": [step("clarification", "clarify", json!([]))]}));
    let (plan, _) = planned(f.orchestrator.execute(&state(&["respond", "clarify"]), &ctx()).await.expect("plans"));
    assert_eq!(capabilities(&plan), ["respond"]);
    assert_eq!(plan.steps[0].task_objective, "Respond to user request: Plot the beam current of the last hour");
    assert!(f.fake.requests_for("ExecutionPlan").is_empty(), "no model call for a plan with nothing to choose");

    // Re-planning after an error, and planning mode, still ask the model (which picks clarify here).
    let mut replanning = state(&["respond", "clarify"]);
    replanning.control.error_info = Some(error_info(ErrorClassification::replanning("the answer was not usable")));
    let (plan, _) = planned(f.orchestrator.execute(&replanning, &ctx()).await.expect("plans"));
    assert_eq!(capabilities(&plan), ["clarify"]);
    assert_eq!(f.fake.requests_for("ExecutionPlan").len(), 1);
    let mut planning = state(&["respond", "clarify"]);
    planning.agent_control.planning_mode_enabled = true;
    approval(f.orchestrator.execute(&planning, &ctx()).await.expect("asks"));
    assert_eq!(f.fake.requests_for("ExecutionPlan").len(), 2, "planning mode shows a plan the model wrote");
    // Context from an earlier turn: the model decides whether respond gets it.
    let mut with_context = state(&["respond", "clarify"]);
    with_context.capability_context_data.insert("CURRENT_WEATHER", "weather_prague", ContextEntry::new(json!({"temp": 3}), None));
    planned(f.orchestrator.execute(&with_context, &ctx()).await.expect("plans"));
    assert_eq!(f.fake.requests_for("ExecutionPlan").len(), 3, "stored context is offered to the model");
}

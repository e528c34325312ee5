//! Unit tests of the error node: the report of reference case 20, synthesized causes, bounded
//! error text, the fallback analysis, and FATAL self-classification.

use std::sync::Arc;

use chrono::{Duration as ChronoDuration, NaiveDateTime, Utc};
use peregrine_core::state::{ErrorInfo, NodeKind, StepRecord};
use peregrine_core::{
    AgentState, CapabilityError, CapabilityOutcome, CapabilitySpec, ErrorClassification, ErrorSeverity, ExecutionPlan, Message,
    PlannedStep, RetryPolicy,
};
use peregrine_graph::NodeContext;
use peregrine_llm::{ChatRequest, FakeProvider, LlmError, LlmErrorKind};

use super::*;
use crate::settings::AgentSettings;

fn node(answer: impl Fn(&ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static) -> (ErrorNode, FakeProvider) {
    let fake = FakeProvider::by_schema(move |name, request| {
        assert_eq!(name, "", "the analysis is a plain completion");
        answer(request)
    });
    let settings = AgentSettings { timezone: chrono_tz::America::Los_Angeles, ..AgentSettings::default() };
    let catalog = Catalog::new(vec![
        CapabilitySpec::new("channel_read", "Read control-system channels"),
        CapabilitySpec::new("respond", "Answer the user"),
    ]);
    (ErrorNode::new(Services::new(Arc::new(fake.client()), settings), Arc::new(catalog)), fake)
}

fn step(capability: &str, objective: &str) -> PlannedStep {
    PlannedStep { capability: capability.into(), task_objective: objective.into(), ..PlannedStep::generic_respond("t") }
}

fn record(index: usize, capability: &str, objective: &str, error: Option<&str>) -> StepRecord {
    StepRecord {
        key: format!("{index}_{capability}"),
        step_index: index,
        capability: capability.into(),
        task_objective: objective.into(),
        success: error.is_none(),
        execution_time_ms: 100,
        timestamp: Utc::now(),
        error: error.map(str::to_owned),
    }
}

fn failed_state(message: &str) -> AgentState {
    let mut state = AgentState::default();
    state.messages.push(Message::user("what is the beam current?"));
    state.task.current_task = Some("Report the beam current".into());
    state.planning.execution_plan = Some(ExecutionPlan {
        steps: vec![step("channel_finding", "Find the channel"), step("channel_read", "Read the beam current"), step("respond", "Answer")],
    });
    state.planning.current_step_index = 1;
    state.execution.start_time = Some(Utc::now() - ChronoDuration::milliseconds(2_500));
    state.execution.step_results =
        vec![record(0, "channel_finding", "Find the channel", None), record(1, "channel_read", "Read the beam current", Some("timeout"))];
    state.control.has_error = true;
    state.control.retry_count = 3;
    state.control.error_info = Some(ErrorInfo {
        node: "channel_read".into(),
        node_kind: NodeKind::Capability,
        classification: ErrorClassification::critical(message).with_metadata("technical_details", "SR:DCCT timed out after 5 s"),
        retry_policy: RetryPolicy::capability_default(),
        original_error: message.into(),
        execution_time_ms: 5_000,
        timestamp: Utc::now(),
    });
    state
}

fn message_of(outcome: CapabilityOutcome) -> String {
    match outcome {
        CapabilityOutcome::Done(update) => {
            assert_eq!(update.messages.len(), 1, "exactly one message");
            assert_eq!(update.messages[0].role, peregrine_core::Role::Assistant);
            update.messages[0].content.clone()
        }
        CapabilityOutcome::NeedsApproval(request) => panic!("unexpected approval: {request:?}"),
    }
}

#[tokio::test]
async fn acceptance_case_20_the_report_and_the_analysis() {
    let (node, fake) = node(|_| Ok("  The channel access gateway did not answer in time.  ".into()));
    let text =
        message_of(node.execute(&failed_state("Channel read timed out"), &NodeContext::standalone("t", ERROR)).await.expect("reports"));

    let header = text.lines().next().expect("header line");
    let stamp = header.strip_prefix("⚠️ **ERROR REPORT** - ").unwrap_or_else(|| panic!("header: {header}"));
    assert!(NaiveDateTime::parse_from_str(stamp, "%Y-%m-%d %H:%M:%S").is_ok(), "timestamp format: {stamp}");
    for expected in [
        "**Error Severity:** CRITICAL",
        "**Task:** Report the beam current",
        "**Failed Operation:** Read the beam current (step 2 of 3)",
        "**Capability:** channel_read",
        "**Previous Execution Error:**\n- **User Message:** Channel read timed out\n- **Technical Details:** SR:DCCT timed out after 5 s",
        "**Execution Stats:** Total operations: 2, Execution time: 2.",
        "**Attempts:** The failed operation ran 3 times: the agent retried it 2 times (retries inside one model call, set by a \
         provider's max_retries, are not counted here).",
        "**Execution Summary:**\n✅ Step 1: Find the channel (channel_finding)\n❌ Step 2: Read the beam current (channel_read) - Failed: timeout",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
    assert!(text.ends_with("\n\n**Analysis:** The channel access gateway did not answer in time."), "{text}");

    let calls = fake.requests_for("");
    assert_eq!(calls.len(), 1, "one plain analysis call");
    let prompt = &calls[0].messages[0].content;
    assert!(prompt.contains("2-3 sentences"));
    assert!(prompt.contains("SYSTEM CAPABILITIES:\n- channel_read: Read control-system channels\n- respond: Answer the user"));
    assert!(prompt.contains("- Error severity: CRITICAL") && prompt.contains("- Capability: channel_read"));
    assert!(prompt.contains("Channel read timed out"));
}

#[tokio::test]
async fn a_failed_analysis_falls_back_to_fixed_text() {
    for failure in [Err(FakeProvider::error(LlmErrorKind::Timeout, "slow")), Ok("   ".to_owned())] {
        let (node, _) = node(move |_| failure.clone());
        let text = message_of(node.execute(&failed_state("boom"), &NodeContext::standalone("t", ERROR)).await.expect("never fails"));
        assert!(text.contains("**Error Severity:** CRITICAL"));
        assert!(text.ends_with(&format!("**Analysis:** {FALLBACK_ANALYSIS}")), "{text}");
    }
}

#[tokio::test]
async fn huge_error_messages_are_truncated_in_report_and_prompt() {
    let (node, fake) = node(|_| Ok("why".into()));
    let huge = "x".repeat(50_000);
    let text = message_of(node.execute(&failed_state(&huge), &NodeContext::standalone("t", ERROR)).await.expect("reports"));
    assert!(text.len() < 10_000, "report bounded: {} bytes", text.len());
    assert!(text.contains("more characters truncated]"));
    let prompt = &fake.requests_for("")[0].messages[0].content;
    assert!(prompt.len() < 6_000, "prompt bounded: {} bytes", prompt.len());
}

#[test]
fn without_a_recorded_error_the_cause_is_synthesized_as_critical() {
    let catalog = Catalog::new(vec![CapabilitySpec::new("respond", "Answer")]);
    let now = Utc::now();

    let mut killed = AgentState::default();
    killed.control.is_killed = true;
    killed.control.kill_reason = Some("operator pressed stop".into());
    let summary = ErrorSummary::from_state(&killed, &catalog, now);
    assert_eq!(summary.classification.severity, ErrorSeverity::Critical);
    assert_eq!(summary.classification.user_message.as_deref(), Some("Execution was stopped: operator pressed stop"));
    assert_eq!(summary.task, "Unknown task");

    let mut exhausted = AgentState::default();
    exhausted.task.current_task = Some("t".into());
    exhausted.planning.execution_plan = Some(ExecutionPlan { steps: vec![step("respond", "a")] });
    exhausted.planning.current_step_index = 1;
    let summary = ErrorSummary::from_state(&exhausted, &catalog, now);
    assert!(summary.classification.user_message.as_deref().is_some_and(|m| m.contains("ran out after 1 steps")), "{summary:?}");

    let mut unknown = exhausted.clone();
    unknown.planning.execution_plan = Some(ExecutionPlan { steps: vec![step("respond", "a"), step("warp_drive", "b")] });
    let summary = ErrorSummary::from_state(&unknown, &catalog, now);
    assert!(summary.classification.user_message.as_deref().is_some_and(|m| m.contains("'warp_drive', which is not registered")));
    let report = structured_report(&summary, &[], "2026-01-01 00:00:00");
    assert!(report.contains("**Error Severity:** CRITICAL") && report.contains("**Failed Operation:** Plan step 2"));
    assert!(!report.contains("**Execution Summary:**"), "no summary without step records");
}

/// Open WebUI showed "Technical Details: Server { status: 500 }" and "Retry attempts: 2" with
/// `max_retries: 0`: the report says what happened in words and whose retries it counts.
#[test]
fn a_model_failure_is_reported_in_words_with_the_retries_the_agent_made() {
    let failure =
        LlmError::new(LlmErrorKind::Server { status: 500 }, "vllm", "qwen", "the provider failed (500): boom").with_role("task_extraction");
    let report_after = |failures: u32| {
        let mut state = failed_state("unused");
        state.control.retry_count = failures;
        if let Some(info) = state.control.error_info.as_mut() {
            info.node = "task_extraction".into();
            info.node_kind = NodeKind::Infrastructure;
            info.classification = failure.classification();
        }
        let summary = ErrorSummary::from_state(&state, &Catalog::default(), Utc::now());
        structured_report(&summary, &state.execution.step_results, "2026-01-01 00:00:00")
    };
    let report = report_after(3);
    assert!(
        report.contains("- **Technical Details:** the model provider failed with a server error (HTTP 500)"),
        "the kind in words: {report}"
    );
    assert!(!report.contains("Server {") && !report.contains("status:"), "no Rust debug output: {report}");
    assert!(report.contains("**Attempts:** The failed operation ran 3 times: the agent retried it 2 times"), "{report}");
    assert!(report.contains("not counted here"), "the provider's own retries are another count: {report}");
    assert!(!report.contains("Retry attempts"), "{report}");
    let once = report_after(1);
    assert!(once.contains("**Attempts:** The failed operation ran once; it was not retried."), "{once}");
    assert!(report_after(2).contains("**Attempts:** The failed operation ran 2 times: the agent retried it once"));

    // A synthesized cause (nothing ran and failed) has no attempts to count.
    let mut killed = AgentState::default();
    killed.control.is_killed = true;
    let summary = ErrorSummary::from_state(&killed, &Catalog::default(), Utc::now());
    assert!(!structured_report(&summary, &[], "2026-01-01 00:00:00").contains("**Attempts:**"));
}

#[test]
fn infrastructure_failures_name_the_node() {
    let mut state = failed_state("planning failed");
    if let Some(info) = state.control.error_info.as_mut() {
        info.node = "orchestrator".into();
        info.node_kind = NodeKind::Infrastructure;
    }
    state.execution.step_results.push(StepRecord {
        key: "infra_1_orchestrator".into(),
        capability: "orchestrator".into(),
        task_objective: "Execution Planning".into(),
        ..record(1, "orchestrator", "", Some("bad plan"))
    });
    let summary = ErrorSummary::from_state(&state, &Catalog::default(), Utc::now());
    let report = structured_report(&summary, &state.execution.step_results, "2026-01-01 00:00:00");
    assert!(report.contains("**Failed Operation:** orchestrator\n**Capability:** orchestrator (infrastructure node)"), "{report}");
    assert!(report.contains("❌ orchestrator: Execution Planning - Failed: bad plan"), "{report}");
}

#[test]
fn a_failure_inside_the_error_node_is_fatal() {
    let (node, _) = node(|_| Ok(String::new()));
    let classification = node.classify_error(&CapabilityError::new("disk on fire"));
    assert_eq!(classification.severity, ErrorSeverity::Fatal);
    assert!(classification.format_for_llm().contains("Error node failure: disk on fire"));
    assert_eq!(node.name(), "error");
}

#[test]
fn truncation_counts_characters() {
    assert_eq!(truncate("ééé", 5), "ééé");
    assert_eq!(truncate("ééééé", 2), "éé… [3 more characters truncated]");
}

/// A provider that never answers (a hung model server).
struct Hanging;

impl peregrine_llm::LlmProvider for Hanging {
    fn name(&self) -> &str {
        "hanging"
    }
    fn features(&self) -> peregrine_llm::ProviderFeatures {
        peregrine_llm::ProviderFeatures::default()
    }
    async fn complete(&self, _request: ChatRequest) -> Result<peregrine_llm::ChatResponse, LlmError> {
        std::future::pending().await
    }
    async fn stream(&self, _request: ChatRequest) -> Result<peregrine_llm::EventStream, LlmError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_model_cannot_hold_up_the_report() {
    let (_, fake) = node(|_| Ok("unused".into()));
    let client = fake.client().with_provider("fake", Hanging);
    let catalog = Catalog::new(vec![CapabilitySpec::new("respond", "Answer the user")]);
    let node = ErrorNode::new(Services::new(Arc::new(client), AgentSettings::default()), Arc::new(catalog));
    let started = tokio::time::Instant::now();
    let text = message_of(node.execute(&failed_state("boom"), &NodeContext::standalone("t", ERROR)).await.expect("never fails"));
    assert!(text.ends_with(&format!("**Analysis:** {FALLBACK_ANALYSIS}")), "{text}");
    assert_eq!(started.elapsed(), ANALYSIS_DEADLINE, "the report waits for the analysis exactly as long as its deadline");
}

//! The error node (reference §2.9): ends a failed turn with one assistant message — a
//! structured report built without an LLM (severity, task, failed operation, the
//! classification's `format_for_llm` block, execution stats, how often the failed operation ran,
//! and a per-step summary) followed by
//! a short LLM analysis, or a fixed text when that call fails. A failure of the node itself is
//! FATAL, so the router aborts instead of looping back into error handling.

pub mod prompt;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use peregrine_core::state::{NodeKind, StepRecord};
use peregrine_core::{AgentState, AgentStateUpdate, CapabilityError, CapabilityOutcome, ErrorClassification, ErrorSeverity, Message};
use peregrine_graph::NodeContext;
use peregrine_llm::{CallOptions, ChatMessage, roles};

pub use self::prompt::{DefaultErrorAnalysisPrompts, ErrorAnalysisPrompts};
use crate::catalog::Catalog;
use crate::nodes::{InfrastructureNode, NodeEvents};
use crate::router::ERROR;
use crate::services::Services;

/// How long the error node waits for its analysis before using [`FALLBACK_ANALYSIS`].
pub const ANALYSIS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// The analysis shown when the LLM explanation cannot be had.
pub const FALLBACK_ANALYSIS: &str = "Error details are provided in the structured report above.";

/// The most characters of the classification block the report shows.
const MAX_REPORT_ERROR_CHARS: usize = 6_000;
/// The most characters of one step's error in the execution summary.
const MAX_STEP_ERROR_CHARS: usize = 300;
/// The most characters of LLM analysis kept.
const MAX_ANALYSIS_CHARS: usize = 2_000;

/// The facts an error report is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorSummary {
    /// The error's classification (synthesized as CRITICAL when none was recorded).
    pub classification: ErrorClassification,
    /// The task of the turn.
    pub task: String,
    /// What failed: the step objective, or the node.
    pub failed_operation: String,
    /// The failing capability or node.
    pub capability: Option<String>,
    /// Operations that ran this turn.
    pub total_operations: usize,
    /// Time since the turn started (or the failed operation's time when unknown).
    pub execution_time: Duration,
    /// How many times the agent retried the failed operation before it gave up (a provider's
    /// transport retries inside one model call are not counted); `None` when no operation
    /// failed (the cause was synthesized: a kill switch, a plan that ran out).
    pub retry_attempts: Option<u32>,
}

impl ErrorSummary {
    /// The summary of `state` at `now`; `catalog` names the registered capabilities.
    pub fn from_state(state: &AgentState, catalog: &Catalog, now: DateTime<Utc>) -> Self {
        let task = state
            .task
            .current_task
            .as_deref()
            .or_else(|| state.user_query())
            .filter(|task| !task.trim().is_empty())
            .unwrap_or("Unknown task")
            .to_owned();
        let turn_time = state.execution.start_time.and_then(|start| (now - start).to_std().ok());
        let total_operations = state.execution.step_results.len();
        match &state.control.error_info {
            Some(info) => {
                let (failed_operation, capability) = match info.node_kind {
                    NodeKind::Capability => (step_operation(state, &info.node), Some(info.node.clone())),
                    NodeKind::Infrastructure => (info.node.clone(), Some(format!("{} (infrastructure node)", info.node))),
                };
                Self {
                    classification: info.classification.clone(),
                    task,
                    failed_operation,
                    capability,
                    total_operations,
                    execution_time: turn_time.unwrap_or(Duration::from_millis(info.execution_time_ms)),
                    // The failing node's consecutive failures, this one included.
                    retry_attempts: Some(state.control.retry_count.saturating_sub(1)),
                }
            }
            None => {
                let (message, failed_operation) = synthesized_cause(state, catalog);
                Self {
                    classification: ErrorClassification::critical(message),
                    task,
                    failed_operation,
                    capability: None,
                    total_operations,
                    execution_time: turn_time.unwrap_or_default(),
                    retry_attempts: None,
                }
            }
        }
    }
}

/// The failing plan step's objective, when the current step is the failing capability's.
fn step_operation(state: &AgentState, node: &str) -> String {
    let planning = &state.planning;
    match (planning.current_step(), &planning.execution_plan) {
        (Some(step), Some(plan)) if step.capability == node => {
            format!("{} (step {} of {})", step.task_objective, planning.current_step_index + 1, plan.steps.len())
        }
        _ => node.to_owned(),
    }
}

/// Why the turn ended in the error node when no error was recorded: kill switch, a plan that
/// ran out of steps, or a step naming an unknown capability.
fn synthesized_cause(state: &AgentState, catalog: &Catalog) -> (String, String) {
    if state.control.is_killed {
        let reason = state.control.kill_reason.as_deref().filter(|reason| !reason.trim().is_empty());
        let message = match reason {
            Some(reason) => format!("Execution was stopped: {reason}"),
            None => "Execution was stopped by the kill switch".to_owned(),
        };
        return (message, "Execution control (kill switch)".to_owned());
    }
    if state.control.has_error {
        return ("A step failed without recording error details".to_owned(), "Unknown operation".to_owned());
    }
    if let Some(plan) = &state.planning.execution_plan {
        let index = state.planning.current_step_index;
        return match plan.steps.get(index) {
            None => (
                format!("The execution plan ran out after {} steps without a respond or clarify step to answer", plan.steps.len()),
                "Plan execution".to_owned(),
            ),
            Some(step) if !catalog.contains(&step.capability) => (
                format!("Plan step {} uses the capability '{}', which is not registered", index + 1, step.capability),
                format!("Plan step {}", index + 1),
            ),
            Some(_) => ("Execution stopped without a recorded error".to_owned(), format!("Plan step {}", index + 1)),
        };
    }
    ("Execution stopped without a recorded error".to_owned(), "Unknown operation".to_owned())
}

/// The structured part of the report, stamped `timestamp` (already in the facility's zone).
pub fn structured_report(summary: &ErrorSummary, steps: &[StepRecord], timestamp: &str) -> String {
    let mut lines = vec![
        format!("⚠️ **ERROR REPORT** - {timestamp}"),
        format!("**Error Severity:** {}", summary.classification.severity),
        format!("**Task:** {}", summary.task),
        format!("**Failed Operation:** {}", summary.failed_operation),
    ];
    if let Some(capability) = &summary.capability {
        lines.push(format!("**Capability:** {capability}"));
    }
    lines.push(truncate(&summary.classification.format_for_llm(), MAX_REPORT_ERROR_CHARS).into_owned());
    lines.push(format!(
        "**Execution Stats:** Total operations: {}, Execution time: {:.1}s",
        summary.total_operations,
        summary.execution_time.as_secs_f64(),
    ));
    if let Some(retries) = summary.retry_attempts {
        lines.push(format!("**Attempts:** {}", attempts_text(retries)));
    }
    if !steps.is_empty() {
        lines.push("**Execution Summary:**".to_owned());
        lines.extend(steps.iter().map(step_line));
    }
    lines.join("\n")
}

/// How often the failed operation ran, in words. The count is the agent's own retries of the
/// operation; a provider's `max_retries` (retries inside one model call) is another count, which
/// people otherwise take this one for.
fn attempts_text(retries: u32) -> String {
    match retries {
        0 => "The failed operation ran once; it was not retried.".to_owned(),
        1 => "The failed operation ran 2 times: the agent retried it once (retries inside one model call, set by a provider's \
              max_retries, are not counted here)."
            .to_owned(),
        _ => format!(
            "The failed operation ran {} times: the agent retried it {retries} times (retries inside one model call, set by a \
             provider's max_retries, are not counted here).",
            retries.saturating_add(1)
        ),
    }
}

fn step_line(record: &StepRecord) -> String {
    let label = if record.key.starts_with("infra_") {
        format!("{}: {}", record.capability, record.task_objective)
    } else {
        format!("Step {}: {} ({})", record.step_index + 1, record.task_objective, record.capability)
    };
    if record.success {
        format!("✅ {label}")
    } else {
        let error = record.error.as_deref().map(|error| truncate(error, MAX_STEP_ERROR_CHARS)).unwrap_or(Cow::Borrowed("unknown error"));
        format!("❌ {label} - Failed: {error}")
    }
}

/// `text` cut to `max_chars` characters, saying how much was left out.
pub fn truncate(text: &str, max_chars: usize) -> Cow<'_, str> {
    let total = text.chars().count();
    if total <= max_chars {
        return Cow::Borrowed(text);
    }
    let kept: String = text.chars().take(max_chars).collect();
    Cow::Owned(format!("{kept}… [{} more characters truncated]", total - max_chars))
}

/// The error node.
pub struct ErrorNode {
    services: Services,
    catalog: Arc<Catalog>,
    prompts: Arc<dyn ErrorAnalysisPrompts>,
}

impl ErrorNode {
    /// An error node with the default analysis prompt.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog, prompts: Arc::new(DefaultErrorAnalysisPrompts) }
    }

    /// Replaces the analysis prompt builder.
    pub fn with_prompts(mut self, prompts: Arc<dyn ErrorAnalysisPrompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// The LLM's short analysis, or [`FALLBACK_ANALYSIS`] on any failure or empty answer.
    async fn analysis(&self, summary: &ErrorSummary, ctx: &NodeContext<AgentState>) -> String {
        let prompt = self.prompts.analysis_prompt(summary, &self.catalog.overview());
        let events = NodeEvents(ctx);
        let options = CallOptions { events: Some(&events), component: Some(ERROR) };
        // The report must come out even when the model is what failed: the analysis gets a
        // short deadline of its own instead of the provider's timeout and retries.
        let call = self.services.llm.complete(roles::RESPONSE, vec![ChatMessage::user(prompt)], options);
        let Ok(result) = tokio::time::timeout(ANALYSIS_DEADLINE, call).await else {
            tracing::warn!(deadline = ?ANALYSIS_DEADLINE, "the error analysis took too long; using the fallback text");
            return FALLBACK_ANALYSIS.to_owned();
        };
        match result {
            Ok(response) if !response.content.trim().is_empty() => truncate(response.content.trim(), MAX_ANALYSIS_CHARS).into_owned(),
            Ok(_) => {
                tracing::warn!("the error analysis came back empty; using the fallback text");
                FALLBACK_ANALYSIS.to_owned()
            }
            Err(error) => {
                tracing::warn!(%error, "the error analysis failed; using the fallback text");
                FALLBACK_ANALYSIS.to_owned()
            }
        }
    }
}

impl InfrastructureNode for ErrorNode {
    fn name(&self) -> &str {
        ERROR
    }

    fn description(&self) -> &str {
        "Error Response Generation"
    }

    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        ErrorClassification::new(ErrorSeverity::Fatal, "Error node failed during error handling")
            .with_metadata("technical_details", format!("Error node failure: {}", error.message()))
    }

    async fn execute(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let now = Utc::now();
        let summary = ErrorSummary::from_state(state, &self.catalog, now);
        let timestamp = now.with_timezone(&self.services.settings.timezone).format("%Y-%m-%d %H:%M:%S").to_string();
        let report = structured_report(&summary, &state.execution.step_results, &timestamp);
        let analysis = self.analysis(&summary, ctx).await;
        let text = format!("{report}\n\n**Analysis:** {analysis}");
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(text))))
    }
}

#[cfg(test)]
mod tests;

//! The `respond` capability (reference §2.7): the always-active final step that answers the
//! user from the step's inputs, the execution history or, for conversation, the capabilities
//! overview, with the answer streamed as `LlmToken` events.
//!
//! Unlike upstream, a failure is not turned into a fake "Response Generation Failed" answer:
//! it is a classified `CapabilityError`, so a transient fault is retried by the router with
//! backoff and an exhausted budget ends in the error node, which reports it.

pub mod prompts;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use peregrine_core::plan::RESPOND;
use peregrine_core::state::StepRecord;
use peregrine_core::{
    AgentState, AgentStateUpdate, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ErrorClassification,
    Message, PlannedStep, RetryPolicy,
};
use peregrine_llm::{CallOptions, ChatMessage, LlmError, roles};
use serde_json::Value;

pub use prompts::{
    ArtifactSummary, DefaultResponsePrompts, Interface, ResponseContext, ResponseMode, ResponsePrompts, format_chat_history,
};

use crate::catalog::Catalog;
use crate::services::Services;

/// The message of the error an empty answer raises.
pub const EMPTY_ANSWER: &str = "the model returned an empty answer";

/// On a retry after a context-window overflow, each retrieved summary is cut to this many
/// characters of JSON (and the chat history is left out) so the prompt fits.
const SHORTENED_SUMMARY_CHARS: usize = 4_000;

/// The capability that writes the final answer.
pub struct RespondCapability {
    services: Services,
    catalog: Arc<Catalog>,
    prompts: Arc<dyn ResponsePrompts>,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for RespondCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RespondCapability").field("spec", &self.spec.name).finish_non_exhaustive()
    }
}

impl RespondCapability {
    /// Respond with upstream's prompts; `catalog` supplies the capabilities overview.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog, prompts: Arc::new(DefaultResponsePrompts), spec: Self::default_spec() }
    }

    /// Uses `prompts` instead of the defaults; the spec's orchestrator guide follows them.
    pub fn with_prompts(mut self, prompts: Arc<dyn ResponsePrompts>) -> Self {
        self.spec.orchestrator_guide = Some(prompts.orchestrator_guide());
        self.prompts = prompts;
        self
    }

    /// Upstream's spec: always active, provides `FINAL_RESPONSE`, the priority-100
    /// orchestrator guide and no classifier guide.
    pub fn default_spec() -> CapabilitySpec {
        CapabilitySpec {
            provides: vec!["FINAL_RESPONSE".into()],
            always_active: true,
            orchestrator_guide: Some(prompts::default_orchestrator_guide()),
            ..CapabilitySpec::new(
                RESPOND,
                "Respond to user queries by generating appropriate responses for both technical and conversational questions",
            )
        }
    }

    /// Gathers what the prompt needs for `step` at `now` (upstream's `_gather_information`).
    pub fn response_context(&self, state: &AgentState, step: &PlannedStep, now: DateTime<Utc>) -> ResponseContext {
        let store = &state.capability_context_data;
        let mode = match (step.inputs.is_empty(), store.is_empty()) {
            (true, true) => ResponseMode::Conversational,
            (false, _) => ResponseMode::SpecificContext,
            (true, false) => ResponseMode::GeneralContext,
        };
        let shortened = retrying_after_overflow(state);
        let mut relevant_context = store.summaries(Some(step));
        let data_timezone = relevant_context.iter().find_map(|(_, summary)| summary.get("timezone_name")?.as_str().map(str::to_owned));
        if shortened {
            relevant_context = relevant_context.into_iter().map(|(reference, summary)| (reference, shorten(summary))).collect();
        }
        let mut current_task = state.task.current_task.clone().unwrap_or_else(|| "General information request".into());
        if let Some(timezone) = &data_timezone {
            current_task.push_str(&format!(
                " [NOTE: All retrieved times are in the system local timezone ({timezone}). Use this timezone name when labeling times, \
                 NOT the timezone name used in the original request. This may differ in name from the timezone in the user's request \
                 but represents the same moment in time - do not flag this as a discrepancy.]"
            ));
        }
        let conversational = mode == ResponseMode::Conversational;
        ResponseContext {
            current_task,
            mode,
            relevant_context,
            execution_history: if conversational { Vec::new() } else { execution_history(state, step) },
            capabilities_overview: conversational.then(|| self.catalog.overview()),
            chat_history: (state.task.depends_on_chat_history && !shortened && !state.messages.is_empty())
                .then(|| format_chat_history(&state.messages, self.services.settings.prompt_history_chars)),
            current_datetime: facility_datetime(now, self.services.settings.timezone),
            data_timezone,
            interface: Interface::from_name(state.interface()),
            artifacts: ArtifactSummary::from_artifacts(&state.ui_artifacts),
        }
    }
}

/// The turn's step records in plan order, without infrastructure records and without this
/// step's own earlier failed attempts.
fn execution_history(state: &AgentState, step: &PlannedStep) -> Vec<StepRecord> {
    let mut records: Vec<StepRecord> = state
        .execution
        .step_results
        .iter()
        .filter(|record| record.key != step.context_key && !record.key.starts_with("infra_"))
        .cloned()
        .collect();
    records.sort_by_key(|record| record.step_index);
    records
}

/// Whether this run retries respond after its prompt overflowed the model's context window
/// (`LlmError::classification` marks that with a `replanning_reason`).
fn retrying_after_overflow(state: &AgentState) -> bool {
    state
        .control
        .error_info
        .as_ref()
        .is_some_and(|info| info.node == RESPOND && info.classification.metadata.contains_key("replanning_reason"))
}

fn shorten(summary: Value) -> Value {
    let text = summary.to_string();
    if text.chars().count() <= SHORTENED_SUMMARY_CHARS {
        return summary;
    }
    let head: String = text.chars().take(SHORTENED_SUMMARY_CHARS).collect();
    Value::String(format!("{head}... (shortened to fit the model's context window)"))
}

/// `YYYY-MM-DD HH:MM ±HHMM (Zone)` in `timezone`.
pub fn facility_datetime(now: DateTime<Utc>, timezone: chrono_tz::Tz) -> String {
    format!("{} ({})", now.with_timezone(&timezone).format("%Y-%m-%d %H:%M %z"), timezone.name())
}

impl Capability for RespondCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    /// The attached classification (LLM faults: RETRIABLE when transient, CRITICAL for
    /// configuration); anything unclassified is CRITICAL.
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        error
            .classification()
            .cloned()
            .or_else(|| error.downcast_ref::<LlmError>().map(LlmError::classification))
            .unwrap_or_else(|| ErrorClassification::critical(format!("Failed to generate response: {}", error.message())))
    }

    /// 3 attempts, 1 s then 2 s: the answer is the whole turn's product, so a rate limit or an
    /// overloaded provider gets a little more patience than the capability default.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::new(3, 1.0, 2.0)
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let context = self.response_context(input.state, input.step, Utc::now());
        tracing::debug!(mode = ?context.mode, inputs = context.relevant_context.len(), "generating the response");
        let prompt = self.prompts.build(&context);
        let options = CallOptions { events: Some(input.events), component: Some(RESPOND) };
        let response = self
            .services
            .llm
            .complete_streaming(roles::RESPONSE, vec![ChatMessage::user(prompt)], options)
            .await
            .map_err(CapabilityError::from)?;
        let answer = response.content.trim();
        if answer.is_empty() {
            return Err(CapabilityError::new(EMPTY_ANSWER)
                .classified(ErrorClassification::retriable(format!("The response could not be generated: {EMPTY_ANSWER}"))));
        }
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(answer))))
    }
}

#[cfg(test)]
mod tests;

//! Task extraction (reference §2.2): turns the conversation into one self-contained task for the
//! classifier and orchestrator. It first asks the data sources for context (concurrently, under
//! one overall timeout; a failing or slow source only means less context), then makes one
//! structured `ExtractedTask` call — or none with `/task:off`, where the task is the retrieved
//! data plus the formatted history. Both show the most recent messages within the history
//! budget (`AgentSettings::prompt_history_chars`), so a long thread never overflows the model.

mod prompts;

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use peregrine_core::events::{EventKind, Phase};
use peregrine_core::state::TaskState;
use peregrine_core::{AgentEvent, AgentState, AgentStateUpdate, CapabilityError, CapabilityOutcome, ErrorClassification, RetryPolicy};
use peregrine_graph::NodeContext;
use peregrine_llm::{CallOptions, LlmError, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::prompts::{
    DefaultTaskExtractionPrompts, ExampleMessage, TaskExtractionExample, TaskExtractionInput, TaskExtractionPrompts, default_build,
    default_examples, format_examples, format_history, format_retrieved_data,
};
use crate::datasource::{DataSource, DataSourceRequest, RetrievedData};
use crate::nodes::{InfrastructureNode, NodeEvents};
use crate::router::TASK_EXTRACTION;
use crate::services::Services;

/// What the model answers: the task and whether it needs the history or the retrieved data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExtractedTask {
    /// The actionable, self-contained task extracted from the conversation.
    pub task: String,
    /// Whether the task depends on previous conversation context.
    pub depends_on_chat_history: bool,
    /// Whether the task depends on stored user memory (retrieved data).
    pub depends_on_user_memory: bool,
}

/// The task-extraction node.
pub struct TaskExtraction {
    services: Services,
    data_sources: Vec<Arc<dyn DataSource>>,
    prompts: Arc<dyn TaskExtractionPrompts>,
}

impl TaskExtraction {
    /// Task extraction with no data sources and the default prompts.
    pub fn new(services: Services) -> Self {
        Self { services, data_sources: Vec::new(), prompts: Arc::new(DefaultTaskExtractionPrompts) }
    }

    /// Sets the data sources asked for context before every extraction.
    pub fn with_data_sources(mut self, data_sources: Vec<Arc<dyn DataSource>>) -> Self {
        self.data_sources = data_sources;
        self
    }

    /// Replaces the prompt builder.
    pub fn with_prompts(mut self, prompts: Arc<dyn TaskExtractionPrompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// Context from every data source that responds to this request, in registration order.
    /// They run concurrently under one overall deadline (`data_source_timeout`); what finished
    /// by then is kept, failures and late sources are logged and skipped.
    async fn retrieve(&self, state: &AgentState) -> Vec<RetrievedData> {
        let request = DataSourceRequest { user_id: state.user_id(), requester: TASK_EXTRACTION, query: state.user_query() };
        let request = &request;
        let mut pending: FuturesUnordered<_> = self
            .data_sources
            .iter()
            .enumerate()
            .filter(|(_, source)| source.should_respond(request))
            .map(|(index, source)| async move { (index, source.name(), source.retrieve(request).await) })
            .collect();
        let deadline = tokio::time::Instant::now() + self.services.settings.data_source_timeout;
        let mut retrieved = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(Some((index, _, Ok(Some(data))))) => retrieved.push((index, data)),
                Ok(Some((_, _, Ok(None)))) => {}
                Ok(Some((_, source, Err(error)))) => {
                    tracing::warn!(source, %error, "data source failed; task extraction continues without its context");
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        unfinished = pending.len(),
                        timeout_s = self.services.settings.data_source_timeout.as_secs_f64(),
                        "data sources did not finish in time; task extraction continues without their context"
                    );
                    break;
                }
            }
        }
        retrieved.sort_by_key(|(index, _)| *index);
        retrieved.into_iter().map(|(_, data)| data).collect()
    }

    /// The task without an LLM call (`/task:off`): retrieved data, then the history within the
    /// budget.
    fn bypass_task(&self, state: &AgentState, retrieved: &[RetrievedData]) -> TaskState {
        let settings = &self.services.settings;
        let now = Utc::now().with_timezone(&settings.timezone);
        let history = format!("Chat history:\n{}", format_history(&state.messages, now, settings.prompt_history_chars));
        let task = match format_retrieved_data(retrieved) {
            Some(data) => format!("{data}\n\n{history}"),
            None => history,
        };
        TaskState { current_task: Some(task), depends_on_chat_history: true, depends_on_user_memory: true }
    }

    /// One `ExtractedTask` call, validated.
    async fn extract(
        &self,
        state: &AgentState,
        retrieved: &[RetrievedData],
        ctx: &NodeContext<AgentState>,
    ) -> Result<TaskState, CapabilityError> {
        let settings = &self.services.settings;
        let now = Utc::now().with_timezone(&settings.timezone);
        let input = TaskExtractionInput { history: &state.messages, retrieved, now, history_chars: settings.prompt_history_chars };
        let messages = self.prompts.build_prompt(&input);
        let sink = NodeEvents(ctx);
        let options = CallOptions { events: Some(&sink), component: Some(TASK_EXTRACTION) };
        let extracted: ExtractedTask =
            self.services.llm.structured(roles::TASK_EXTRACTION, messages, options).await.map_err(CapabilityError::from)?;
        let task = extracted.task.trim();
        if task.is_empty() {
            let message = "the task-extraction model returned no task (an empty `task` field)";
            return Err(CapabilityError::new(message).classified(ErrorClassification::retriable(message)));
        }
        Ok(TaskState {
            current_task: Some(task.to_owned()),
            depends_on_chat_history: extracted.depends_on_chat_history,
            depends_on_user_memory: extracted.depends_on_user_memory,
        })
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl InfrastructureNode for TaskExtraction {
    fn name(&self) -> &str {
        TASK_EXTRACTION
    }

    fn description(&self) -> &str {
        "task extraction"
    }

    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        if let Some(classification) = error.classification() {
            return classification.clone();
        }
        match error.downcast_ref::<LlmError>() {
            Some(llm) => llm.classification(),
            None => ErrorClassification::critical(format!("Task extraction failed: {}", error.message())),
        }
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::task_extraction()
    }

    async fn execute(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let started = Instant::now();
        ctx.emit(AgentEvent::new(
            TASK_EXTRACTION,
            EventKind::PhaseStart { phase: Phase::TaskExtraction, description: "Extracting the task from the conversation".into() },
        ));
        let retrieved = self.retrieve(state).await;
        let result = if state.agent_control.task_extraction_bypass_enabled {
            Ok(self.bypass_task(state, &retrieved))
        } else {
            self.extract(state, &retrieved, ctx).await
        };
        ctx.emit(AgentEvent::new(
            TASK_EXTRACTION,
            EventKind::PhaseComplete { phase: Phase::TaskExtraction, duration_ms: elapsed_ms(started), success: result.is_ok() },
        ));
        let task = result?;
        ctx.emit(AgentEvent::new(
            TASK_EXTRACTION,
            EventKind::TaskExtracted {
                task: task.current_task.clone().unwrap_or_default(),
                depends_on_chat_history: task.depends_on_chat_history,
                depends_on_user_memory: task.depends_on_user_memory,
            },
        ));
        Ok(CapabilityOutcome::Done(AgentStateUpdate { task: Some(task), ..AgentStateUpdate::default() }))
    }
}

#[cfg(test)]
mod tests;

//! The `memory` capability (reference §5.2): save content to, or show, the user's memory file.
//! A save extracts the exact content with the `memory` model, asks for approval when the
//! policy says so (§4), and on an approved answer appends exactly the approved content — no
//! second extraction, and at most once even when the answer is redelivered after a crash. A
//! rejected save writes nothing and reports the cancellation (upstream re-extracted and asked
//! again instead).

mod datasource;
mod prompts;
mod store;

use std::sync::Arc;

use chrono::Utc;
use peregrine_agent::Services;
use peregrine_agent::respond::format_chat_history;
use peregrine_core::events::StatusLevel;
use peregrine_core::{
    AgentEvent, ApprovalAnswer, ApprovalDecision, ApprovalRequest, Capability, CapabilityError, CapabilityInput, CapabilityOutcome,
    CapabilitySpec, ContextType, ErrorClassification, approval_message,
};
use peregrine_llm::{CallOptions, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use datasource::{MAX_RETRIEVED_MEMORIES, USER_MEMORY_SOURCE, USER_MEMORY_TITLE, UserMemoryDataSource, format_memories};
pub use prompts::{
    DefaultMemoryPrompts, ExtractionRequest, MemoryPrompts, default_classifier_guide, default_extraction_messages,
    default_operation_messages, default_orchestrator_guide,
};
pub use store::{MEMORY_DIR, MemoryEntry, MemoryError, MemoryStore, TIMESTAMP_FORMAT, sanitize_user_id};

use crate::Clock;

/// The capability's name.
pub const MEMORY_CAPABILITY: &str = "memory";
/// The context type it stores.
pub const MEMORY_CONTEXT: &str = "MEMORY_CONTEXT";
/// The approval type of a save (`{capability}_{operation}`).
pub const MEMORY_SAVE_APPROVAL: &str = "memory_save";
/// `operation_result` of a save the user rejected.
pub const CANCELLED_BY_USER: &str = "cancelled by the user";

/// Save or retrieve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemoryOperation {
    /// Store new content.
    Save,
    /// Show what is stored.
    Retrieve,
}

/// The classifier model's answer: which operation the step asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryOperationClassification {
    /// `save` to store new content, `retrieve` to show saved memories.
    pub operation: MemoryOperation,
    /// One sentence on why.
    pub reasoning: String,
}

/// The memory model's answer: the exact content to save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryContentExtraction {
    /// The content to save, without the instruction around it; empty when none was found.
    pub content: String,
    /// Whether content to save was found.
    pub found: bool,
    /// A brief explanation of the decision.
    pub explanation: String,
}

/// `MEMORY_CONTEXT`: what a memory step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryContext {
    /// Retrieve: `{memories: [{timestamp, content}]}`; save: `{saved_content, timestamp}`; a
    /// rejected save: `{rejected_content}`.
    pub memory_data: Value,
    /// `save` or `retrieve`.
    pub operation_type: MemoryOperation,
    /// One line for the response, e.g. `Saved to memory` or `cancelled by the user`.
    pub operation_result: String,
}

impl ContextType for MemoryContext {
    const CONTEXT_TYPE: &'static str = MEMORY_CONTEXT;
    const CONTEXT_CATEGORY: &'static str = "CONTEXTUAL_KNOWLEDGE";
}

/// The `memory` capability.
pub struct MemoryCapability {
    services: Services,
    store: MemoryStore,
    prompts: Arc<dyn MemoryPrompts>,
    clock: Clock,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for MemoryCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCapability").field("store", &self.store).finish_non_exhaustive()
    }
}

fn memory_spec(prompts: &dyn MemoryPrompts) -> CapabilitySpec {
    CapabilitySpec {
        provides: vec![MEMORY_CONTEXT.into()],
        classifier_guide: Some(prompts.classifier_guide()),
        orchestrator_guide: Some(prompts.orchestrator_guide()),
        ..CapabilitySpec::new(MEMORY_CAPABILITY, "Save content to the user's memory (after approval) or show what is saved")
    }
}

impl MemoryCapability {
    /// The capability over `store`, with the default prompts and the system clock.
    pub fn new(services: Services, store: MemoryStore) -> Self {
        let prompts: Arc<dyn MemoryPrompts> = Arc::new(DefaultMemoryPrompts);
        let spec = memory_spec(prompts.as_ref());
        Self { services, store, prompts, clock: Arc::new(Utc::now), spec }
    }

    /// Replaces the prompts (and the guides in the spec).
    pub fn with_prompts(mut self, prompts: Arc<dyn MemoryPrompts>) -> Self {
        self.spec = memory_spec(prompts.as_ref());
        self.prompts = prompts;
        self
    }

    /// Replaces the clock that stamps saved entries (tests).
    pub fn with_clock(mut self, clock: impl Fn() -> chrono::DateTime<Utc> + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store it reads and writes.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn options<'a>(input: &'a CapabilityInput<'_>) -> CallOptions<'a> {
        CallOptions { events: Some(input.events), component: Some(MEMORY_CAPABILITY) }
    }

    fn status(input: &CapabilityInput<'_>, level: StatusLevel, message: impl Into<String>) {
        input.events.emit(AgentEvent::status(MEMORY_CAPABILITY, level, message));
    }

    async fn retrieve(&self, input: &CapabilityInput<'_>, user_id: &str) -> Result<CapabilityOutcome, CapabilityError> {
        let entries = self.store.entries(user_id).await.map_err(storage_error)?;
        let operation_result =
            if entries.is_empty() { "No memories saved yet".to_owned() } else { format!("Retrieved {} memory entries", entries.len()) };
        Self::status(input, StatusLevel::Info, operation_result.clone());
        let context =
            MemoryContext { memory_data: json!({ "memories": entries }), operation_type: MemoryOperation::Retrieve, operation_result };
        Ok(CapabilityOutcome::Done(input.store_output(&context)?))
    }

    async fn extract(&self, input: &CapabilityInput<'_>) -> Result<String, CapabilityError> {
        // Only the recent conversation, within the history budget: a long thread must not
        // overflow the extraction prompt.
        let chat_history = format_chat_history(&input.state.messages, self.services.settings.prompt_history_chars);
        let step_inputs = input.state.capability_context_data.summary_lines(input.step);
        let request = ExtractionRequest { task_objective: input.task_objective(), chat_history: &chat_history, step_inputs: &step_inputs };
        let extraction: MemoryContentExtraction = self
            .services
            .llm
            .structured(roles::MEMORY, self.prompts.extraction_messages(&request), Self::options(input))
            .await
            .map_err(CapabilityError::from)?;
        let content = extraction.content.trim();
        if !extraction.found || content.is_empty() {
            let message = format!("found no content to save to memory ({})", extraction.explanation.trim());
            return Err(CapabilityError::new(message.clone()).classified(
                ErrorClassification::replanning("Could not identify what to save to memory; say exactly what should be remembered")
                    .with_metadata("technical_details", format!("ContentExtraction: {message}")),
            ));
        }
        Ok(content.to_owned())
    }

    async fn save(&self, input: &CapabilityInput<'_>, user_id: &str) -> Result<CapabilityOutcome, CapabilityError> {
        let content = self.extract(input).await?;
        let decision = self.services.settings.approval.memory_save(input.state.agent_control.approval_mode);
        if decision.needs_approval {
            Self::status(input, StatusLevel::Info, "Memory save needs approval");
            return Ok(CapabilityOutcome::NeedsApproval(approval_request(input.task_objective(), user_id, &content, &decision)));
        }
        self.commit(input, user_id, &content, false).await
    }

    /// Appends `content`; on a redelivered approval only if it is not already the last entry.
    async fn commit(
        &self,
        input: &CapabilityInput<'_>,
        user_id: &str,
        content: &str,
        redelivery: bool,
    ) -> Result<CapabilityOutcome, CapabilityError> {
        let now = (self.clock)().with_timezone(&self.services.settings.timezone).naive_local();
        let (entry, written) = if redelivery {
            self.store.append_unless_last(user_id, content, now).await
        } else {
            self.store.append(user_id, content, now).await.map(|entry| (entry, true))
        }
        .map_err(storage_error)?;
        if !written {
            tracing::info!(user_id, "memory save skipped: the redelivered approval's content is already the last entry");
        }
        let operation_result = if written { "Saved to memory" } else { "Already saved to memory (the approval was delivered again)" };
        Self::status(input, StatusLevel::Success, operation_result);
        let context = MemoryContext {
            memory_data: json!({ "saved_content": entry.content, "timestamp": entry.timestamp }),
            operation_type: MemoryOperation::Save,
            operation_result: operation_result.into(),
        };
        Ok(CapabilityOutcome::Done(input.store_output(&context)?))
    }

    /// The run after a person answered this step's approval request: no LLM call, only the
    /// approved content (or nothing, on a rejection).
    async fn resume(
        &self,
        input: &CapabilityInput<'_>,
        user_id: &str,
        answer: &ApprovalAnswer,
    ) -> Result<CapabilityOutcome, CapabilityError> {
        if answer.approval_type != MEMORY_SAVE_APPROVAL {
            return Err(critical(format!(
                "memory received an answer to a '{}' approval but only asks for '{MEMORY_SAVE_APPROVAL}'; nothing was saved",
                answer.approval_type
            )));
        }
        let approved_for = answer.payload.get("user_id").and_then(Value::as_str);
        if approved_for != Some(user_id) {
            return Err(critical(format!(
                "the approved memory save was for user '{}' but this session's user is '{user_id}'; nothing was saved",
                approved_for.unwrap_or("<none>")
            )));
        }
        let content = answer.payload.get("content").and_then(Value::as_str).filter(|content| !content.trim().is_empty());
        let Some(content) = content else {
            return Err(critical("the approved memory save carries no content; nothing was saved"));
        };
        if !answer.approves(MEMORY_SAVE_APPROVAL) {
            Self::status(input, StatusLevel::Warning, "Memory save cancelled by the user");
            let context = MemoryContext {
                memory_data: json!({ "rejected_content": content }),
                operation_type: MemoryOperation::Save,
                operation_result: CANCELLED_BY_USER.into(),
            };
            return Ok(CapabilityOutcome::Done(input.store_output(&context)?));
        }
        let content = match &answer.edit {
            None => content.to_owned(),
            Some(edit) => edited_content(edit)?,
        };
        self.commit(input, user_id, &content, answer.is_redelivery()).await
    }
}

impl Capability for MemoryCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let Some(user_id) = input.state.user_id() else {
            return Err(critical("no user id in the session; memory needs one (set session user_id)"));
        };
        if let Some(answer) = input.approval {
            return self.resume(&input, user_id, answer).await;
        }
        let classification: MemoryOperationClassification = self
            .services
            .llm
            .structured(roles::CLASSIFIER, self.prompts.operation_messages(input.task_objective()), Self::options(&input))
            .await
            .map_err(CapabilityError::from)?;
        match classification.operation {
            MemoryOperation::Retrieve => self.retrieve(&input, user_id).await,
            MemoryOperation::Save => self.save(&input, user_id).await,
        }
    }
}

/// The approval request of a save: the prompt shows exactly what will be written.
fn approval_request(task_objective: &str, user_id: &str, content: &str, decision: &ApprovalDecision) -> ApprovalRequest {
    let fence = "`".repeat(longest_backtick_run(content).max(2) + 1);
    let body = format!(
        "**Content to save to the memory of `{user_id}`:**\n\n{fence}\n{content}\n{fence}\n\n\
         Exactly this text will be appended to your memory file.\n_Why this asks: {}._",
        decision.reasoning
    );
    ApprovalRequest {
        approval_type: MEMORY_SAVE_APPROVAL.into(),
        user_message: approval_message("Memory save", Some(task_objective), &body),
        payload: json!({
            "approval_type": MEMORY_SAVE_APPROVAL,
            "step_objective": task_objective,
            "content": content,
            "operation_type": "save",
            "user_id": user_id,
        }),
    }
}

/// The longest run of backticks in `text`, so a code fence around it cannot be closed early.
fn longest_backtick_run(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// Content a person edited before approving: a string or `{"content": string}`, not empty.
fn edited_content(edit: &Value) -> Result<String, CapabilityError> {
    let text = edit.as_str().or_else(|| edit.get("content").and_then(Value::as_str)).map(str::trim).filter(|text| !text.is_empty());
    text.map(str::to_owned).ok_or_else(|| {
        CapabilityError::new(format!("the edited memory content is not usable text: {edit}"))
            .classified(ErrorClassification::retriable("The edited memory content was empty or not text; nothing was saved, asking again"))
    })
}

fn critical(message: impl Into<String>) -> CapabilityError {
    let message = message.into();
    CapabilityError::new(message.clone()).classified(ErrorClassification::critical(message))
}

fn storage_error(error: MemoryError) -> CapabilityError {
    // The technical details in words: the error and its causes, never a Rust debug dump.
    let mut details = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(inner) = cause {
        details.push_str(": ");
        details.push_str(&inner.to_string());
        cause = inner.source();
    }
    let classification =
        ErrorClassification::critical(format!("Memory storage failed: {error}")).with_metadata("technical_details", details);
    CapabilityError::from_error(error).classified(classification)
}

#[cfg(test)]
mod tests;

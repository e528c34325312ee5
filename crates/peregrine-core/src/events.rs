//! Typed agent events (reference §7.6): what interfaces render while a turn runs. Nodes emit
//! them; the graph engine forwards them on the run's event stream.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::plan::PlannedStep;

/// Severity or flavour of a status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusLevel {
    /// Routine progress.
    Info,
    /// Something worth attention.
    Warning,
    /// A failure.
    Error,
    /// Diagnostic detail.
    Debug,
    /// A completed phase.
    Success,
    /// Important information.
    KeyInfo,
}

/// Phases of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Task extraction.
    TaskExtraction,
    /// Capability classification.
    Classification,
    /// Orchestration.
    Planning,
    /// Plan steps.
    Execution,
    /// Respond / clarify.
    Response,
}

/// Where a control-system write is ([`EventKind::ChannelWrite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelWriteStage {
    /// A gate stopped it (writes disabled, a limit, access); nothing was written.
    Blocked,
    /// It passed the gates before the approval and is shown for approval.
    AwaitingApproval,
    /// It was written and its verification held (or no verification was asked for).
    Written,
    /// The approval was delivered again and the channel already read the approved value.
    AlreadyWritten,
    /// It was sent but failed, could not be confirmed, or its verification did not hold.
    Failed,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A status line.
    Status {
        /// Text.
        message: String,
        /// Level.
        level: StatusLevel,
        /// Step number, for plan steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<usize>,
        /// Plan length, for plan steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total_steps: Option<usize>,
    },
    /// A phase began.
    PhaseStart {
        /// Which.
        phase: Phase,
        /// What it does.
        description: String,
    },
    /// A phase ended.
    PhaseComplete {
        /// Which.
        phase: Phase,
        /// How long it took.
        duration_ms: u64,
        /// Whether it succeeded.
        success: bool,
    },
    /// Task extraction produced a task.
    TaskExtracted {
        /// The task.
        task: String,
        /// Whether it needs the chat history.
        depends_on_chat_history: bool,
        /// Whether it needs user memory.
        depends_on_user_memory: bool,
    },
    /// The classifier chose capabilities.
    CapabilitiesSelected {
        /// Chosen.
        capability_names: Vec<String>,
        /// Everything registered.
        all_capability_names: Vec<String>,
    },
    /// The orchestrator wrote a plan.
    PlanCreated {
        /// Its steps.
        steps: Vec<PlannedStep>,
    },
    /// A plan step started.
    CapabilityStart {
        /// Capability.
        capability_name: String,
        /// 1-based step number.
        step_number: usize,
        /// Plan length.
        total_steps: usize,
        /// The step objective.
        description: String,
    },
    /// A plan step ended.
    CapabilityComplete {
        /// Capability.
        capability_name: String,
        /// Whether it succeeded.
        success: bool,
        /// How long it took.
        duration_ms: u64,
        /// The error, for failures.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_message: Option<String>,
    },
    /// An LLM call is about to be made.
    LlmRequest {
        /// The model role (`orchestrator`, `classifier`, …).
        #[serde(default)]
        role: String,
        /// The structured-output schema name, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<String>,
        /// The first 200 characters of the prompt.
        prompt_preview: String,
        /// Prompt length in characters.
        prompt_length: usize,
        /// Model id.
        model: String,
        /// Provider name.
        provider: String,
    },
    /// An LLM call returned.
    LlmResponse {
        /// The model role.
        #[serde(default)]
        role: String,
        /// Whether the call succeeded.
        #[serde(default)]
        success: bool,
        /// The first 200 characters of the response.
        response_preview: String,
        /// Response length in characters.
        response_length: usize,
        /// Prompt tokens.
        input_tokens: Option<u64>,
        /// Completion tokens.
        output_tokens: Option<u64>,
        /// How long it took.
        duration_ms: u64,
    },
    /// A piece of a streamed LLM answer.
    LlmToken {
        /// The model role that is answering.
        role: String,
        /// The text.
        content: String,
    },
    /// The run paused for a human decision.
    ApprovalRequired {
        /// e.g. `orchestrator_plan`, `python_executor`, `memory_save`, `channel_write`.
        approval_type: String,
        /// The prompt shown to the person.
        user_message: String,
    },
    /// A human decision arrived.
    ApprovalReceived {
        /// Which approval.
        approval_type: String,
        /// The decision.
        approved: bool,
    },
    /// A control-system write at one of its gates: stopped by a gate, shown for approval,
    /// written, verified, or found already written when an approval was delivered again.
    ChannelWrite {
        /// Where the write is.
        stage: ChannelWriteStage,
        /// The channel.
        channel_address: String,
        /// The value to write (or written).
        value: String,
        /// The channel's value before the write, when it was read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous: Option<String>,
        /// What the gate or the verification found, in words.
        detail: String,
    },
    /// A node failed.
    Error {
        /// Error class, e.g. `InfrastructureError`.
        error_type: String,
        /// Text.
        error_message: String,
        /// Whether the router will retry.
        recoverable: bool,
    },
}

/// An event with its origin and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentEvent {
    /// When it happened.
    pub timestamp: DateTime<Utc>,
    /// The emitting node or component.
    pub component: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl AgentEvent {
    /// An event stamped now.
    pub fn new(component: impl Into<String>, kind: EventKind) -> Self {
        Self { timestamp: Utc::now(), component: component.into(), kind }
    }

    /// A status line.
    pub fn status(component: impl Into<String>, level: StatusLevel, message: impl Into<String>) -> Self {
        Self::new(component, EventKind::Status { message: message.into(), level, step: None, total_steps: None })
    }
}

/// Cuts text to at most `max_chars` characters for previews.
pub fn preview(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_with_a_tag_and_round_trip() {
        let event = AgentEvent::new(
            "classifier",
            EventKind::CapabilitiesSelected {
                capability_names: vec!["respond".into()],
                all_capability_names: vec!["respond".into(), "python".into()],
            },
        );
        let json = serde_json::to_value(&event).expect("serializes");
        assert_eq!(json["event"], "capabilities_selected");
        assert_eq!(json["component"], "classifier");
        assert_eq!(serde_json::from_value::<AgentEvent>(json).expect("parses"), event);
    }

    #[test]
    fn preview_counts_characters_not_bytes() {
        assert_eq!(preview("ééé", 2), "éé");
    }
}

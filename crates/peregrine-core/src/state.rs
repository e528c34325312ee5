//! `AgentState`, the state of one conversation thread, and `AgentStateUpdate`, the delta nodes
//! return. Messages, capability context and session state persist across turns; every other
//! group is reset when a new turn starts (reference §1.4–§1.5).
//!
//! Upstream fields that nothing read are left out: `task_custom_message`,
//! `execution_pending_approvals`, `execution_total_time`, `control_current_step_retry_count`,
//! `control_last_error`, `control_max_retries`, the `control_*validation*` trio and the
//! `runtime_*` pair. `status_updates` / `progress_events` are replaced by the typed event stream,
//! and the legacy `ui_captured_*` lists by `ui_artifacts` alone. The router node's
//! `control_routing_*` keys never existed in upstream's state (LangGraph dropped them).
//! `approval_approved` / `approved_payload` are gone on purpose: upstream let any state update
//! claim an approval; here the answer reaches the resumed node only through the engine's
//! verified resume record (`CapabilityInput::approval`), bound to the digest of what was asked.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::ContextStore;
use crate::error::{ErrorClassification, ErrorSeverity, RetryPolicy};
use crate::events::AgentEvent;
use crate::graph_state::{GraphState, Slot};
use crate::plan::{ExecutionPlan, PlannedStep};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The person.
    User,
    /// The agent.
    Assistant,
    /// The framework (markers such as the end of a direct-chat session).
    System,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Text.
    pub content: String,
    /// When it was written.
    pub timestamp: DateTime<Utc>,
}

impl Message {
    /// A message stamped `timestamp`.
    pub fn new(role: Role, content: impl Into<String>, timestamp: DateTime<Utc>) -> Self {
        Self { role, content: content.into(), timestamp }
    }

    /// A user message stamped now.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content, Utc::now())
    }

    /// An assistant message stamped now.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content, Utc::now())
    }

    /// A system message stamped now.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content, Utc::now())
    }
}

/// Well-known `session_state` keys.
pub mod session_keys {
    /// The user id (memory is stored per user).
    pub const USER_ID: &str = "user_id";
    /// The interface: `cli`, `openwebui` or `api`.
    pub const INTERFACE: &str = "interface";
    /// The capability of a direct-chat session.
    pub const DIRECT_CHAT_CAPABILITY: &str = "direct_chat_capability";
    /// The last result of a direct-chat session.
    pub const LAST_DIRECT_CHAT_RESULT: &str = "last_direct_chat_result";
}

/// Which approvals are asked for (`approval.global_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// No approvals at all.
    Disabled,
    /// Per-capability settings decide.
    #[default]
    Selective,
    /// Every approvable action asks.
    AllCapabilities,
}

/// Per-turn switches, rebuilt from config defaults every turn and changed by slash commands for
/// that turn only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentControl {
    /// `/planning`: the orchestrator asks for approval of its plan.
    pub planning_mode_enabled: bool,
    /// Master switch for control-system writes (the first of the three write gates).
    pub control_system_writes_enabled: bool,
    /// `/approval`: approval mode for this turn.
    pub approval_mode: ApprovalMode,
    /// `/task:off`: skip the task-extraction LLM call.
    pub task_extraction_bypass_enabled: bool,
    /// `/caps:off`: activate every capability without classification.
    pub capability_selection_bypass_enabled: bool,
}

/// The extracted task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskState {
    /// The task; the router sends a turn without one to task extraction.
    pub current_task: Option<String>,
    /// Whether prompts need the chat history.
    pub depends_on_chat_history: bool,
    /// Whether prompts need user memory.
    pub depends_on_user_memory: bool,
}

/// Classifier and orchestrator output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanningState {
    /// Capabilities the classifier selected; empty sends the router to the classifier.
    pub active_capabilities: Vec<String>,
    /// The plan; absent sends the router to the orchestrator.
    pub execution_plan: Option<ExecutionPlan>,
    /// The next step to run.
    pub current_step_index: usize,
}

impl PlanningState {
    /// The step the router dispatches next, if any.
    pub fn current_step(&self) -> Option<&PlannedStep> {
        self.execution_plan.as_ref()?.steps.get(self.current_step_index)
    }
}

/// What ran in this turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step's context key, `{index}_{capability}`, or `infra_{index}_{node}`.
    pub key: String,
    /// Plan step index.
    pub step_index: usize,
    /// Capability or node name.
    pub capability: String,
    /// The step's objective.
    pub task_objective: String,
    /// Whether it succeeded.
    pub success: bool,
    /// Duration of the execution.
    pub execution_time_ms: u64,
    /// When it finished.
    pub timestamp: DateTime<Utc>,
    /// The error, for failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The outcome of the last node execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastResult {
    /// Capability or node name.
    pub capability: String,
    /// Whether it succeeded.
    pub success: bool,
    /// Duration of the execution.
    pub execution_time_ms: u64,
    /// The error, for failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error's severity, for failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<ErrorSeverity>,
    /// When it finished.
    pub timestamp: DateTime<Utc>,
}

/// Execution bookkeeping of the turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecutionState {
    /// One record per step key, in the order they first ran.
    pub step_results: Vec<StepRecord>,
    /// The last node's outcome.
    pub last_result: Option<LastResult>,
    /// When the turn started; `None` for a state-only update.
    pub start_time: Option<DateTime<Utc>>,
}

/// Whether a failing node is a capability (a plan step) or an infrastructure node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A plan step.
    Capability,
    /// Task extraction, classifier, orchestrator, error and the like.
    Infrastructure,
}

/// Everything the router needs to recover from a failed node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The node that failed.
    pub node: String,
    /// Capability or infrastructure.
    pub node_kind: NodeKind,
    /// Its classification.
    pub classification: ErrorClassification,
    /// Its retry policy.
    pub retry_policy: RetryPolicy,
    /// The error as raised.
    pub original_error: String,
    /// Duration of the failed execution.
    pub execution_time_ms: u64,
    /// When it failed.
    pub timestamp: DateTime<Utc>,
}

/// Recovery counters and error flags, counted per turn in persisted state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlState {
    /// Re-classifications so far.
    pub reclassification_count: u32,
    /// Why the last re-classification was asked for.
    pub reclassification_reason: Option<String>,
    /// Planning attempts so far, failed ones included.
    pub planning_attempts: u32,
    /// Consecutive failed executions of the failing node.
    pub retry_count: u32,
    /// Whether the last node failed.
    pub has_error: bool,
    /// The last failure.
    pub error_info: Option<ErrorInfo>,
    /// Kill switch: routes the turn to the error node.
    pub is_killed: bool,
    /// Why the turn was killed.
    pub kill_reason: Option<String>,
}

/// Something a capability produced for the interface to show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// Unique id.
    pub id: String,
    /// `image`, `notebook`, `command`, `html` or `file`.
    pub artifact_type: String,
    /// Producing capability.
    pub capability: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Optional label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Path, URL or inline data.
    pub data: Value,
}

/// Reactive-orchestration bookkeeping (ReAct mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReactState {
    /// Decisions and observations, in order.
    pub messages: Vec<Value>,
    /// Reactive iterations so far.
    pub step_count: u32,
    /// Consecutive step-approval rejections.
    pub rejection_count: u32,
    /// Whether the reactive orchestrator answered directly (ends the turn).
    pub response_generated: bool,
}

/// The whole state of one thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentState {
    // Persistent across turns.
    /// Full chat history.
    pub messages: Vec<Message>,
    /// Capability context, accumulated across turns.
    pub capability_context_data: ContextStore,
    /// Session values (`direct_chat_capability`, `session_id`, …), shallow-merged.
    pub session_state: BTreeMap<String, Value>,

    // Reset every turn.
    /// Per-turn switches.
    pub agent_control: AgentControl,
    /// The extracted task.
    pub task: TaskState,
    /// Classifier and orchestrator output.
    pub planning: PlanningState,
    /// Step records and timing.
    pub execution: ExecutionState,
    /// Recovery counters and error flags.
    pub control: ControlState,
    /// Artifacts for the interface.
    pub ui_artifacts: Vec<Artifact>,
    /// ReAct bookkeeping.
    pub react: ReactState,
    /// Slash commands forwarded to capabilities (`/name` → `true`, `/name:value` → value).
    pub capability_slash_commands: BTreeMap<String, Value>,
}

impl AgentState {
    /// The content of the latest user message.
    pub fn user_query(&self) -> Option<&str> {
        self.messages.iter().rev().find(|message| message.role == Role::User).map(|message| message.content.as_str())
    }

    /// The user this conversation belongs to (session key `user_id`), for per-user data such
    /// as memory.
    pub fn user_id(&self) -> Option<&str> {
        self.session_state.get(session_keys::USER_ID).and_then(Value::as_str).filter(|id| !id.is_empty())
    }

    /// The interface the conversation runs in (session key `interface`: `cli`, `openwebui`,
    /// `api`), for interface-aware response guidelines.
    pub fn interface(&self) -> Option<&str> {
        self.session_state.get(session_keys::INTERFACE).and_then(Value::as_str)
    }

    /// The direct-chat capability, if the session is in direct-chat mode.
    pub fn direct_chat_capability(&self) -> Option<&str> {
        self.session_state.get(session_keys::DIRECT_CHAT_CAPABILITY).and_then(Value::as_str)
    }

    /// Resets every turn-scoped group, keeping messages, context and session (reference §1.5).
    fn start_turn(&mut self, turn: TurnStart) {
        let persistent = (
            std::mem::take(&mut self.messages),
            std::mem::take(&mut self.capability_context_data),
            std::mem::take(&mut self.session_state),
        );
        *self = Self { messages: persistent.0, capability_context_data: persistent.1, session_state: persistent.2, ..Self::default() };
        self.messages.push(turn.message);
        self.agent_control = turn.agent_control;
        self.capability_slash_commands = turn.capability_slash_commands;
        self.execution.start_time = Some(turn.start_time);
    }
}

/// What the gateway records to start a new turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The user's message.
    pub message: Message,
    /// This turn's switches (config defaults plus slash commands).
    pub agent_control: AgentControl,
    /// Slash commands forwarded to capabilities.
    #[serde(default)]
    pub capability_slash_commands: BTreeMap<String, Value>,
    /// When the turn started.
    pub start_time: DateTime<Utc>,
}

impl TurnStart {
    /// A turn for `text` with default switches, starting now.
    pub fn new(text: impl Into<String>, agent_control: AgentControl) -> Self {
        let message = Message::user(text);
        let start_time = message.timestamp;
        Self { message, agent_control, capability_slash_commands: BTreeMap::new(), start_time }
    }
}

/// Patch of the control group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ControlUpdate {
    /// New re-classification count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclassification_count: Option<u32>,
    /// New re-classification reason.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub reclassification_reason: Slot<Option<String>>,
    /// New planning-attempt count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planning_attempts: Option<u32>,
    /// New retry count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<u32>,
    /// New error flag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub has_error: Option<bool>,
    /// New error info.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub error_info: Slot<Option<ErrorInfo>>,
    /// New kill flag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_killed: Option<bool>,
    /// New kill reason.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub kill_reason: Slot<Option<String>>,
}

impl ControlUpdate {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Folds `later` into `self`; fields `later` sets win.
    pub fn merge_from(&mut self, later: Self) {
        self.reclassification_count = later.reclassification_count.or(self.reclassification_count);
        self.reclassification_reason = later.reclassification_reason.or_earlier(std::mem::take(&mut self.reclassification_reason));
        self.planning_attempts = later.planning_attempts.or(self.planning_attempts);
        self.retry_count = later.retry_count.or(self.retry_count);
        self.has_error = later.has_error.or(self.has_error);
        self.error_info = later.error_info.or_earlier(std::mem::take(&mut self.error_info));
        self.is_killed = later.is_killed.or(self.is_killed);
        self.kill_reason = later.kill_reason.or_earlier(std::mem::take(&mut self.kill_reason));
    }

    fn apply_to(self, control: &mut ControlState) {
        if let Some(value) = self.reclassification_count {
            control.reclassification_count = value;
        }
        self.reclassification_reason.apply_to(&mut control.reclassification_reason);
        if let Some(value) = self.planning_attempts {
            control.planning_attempts = value;
        }
        if let Some(value) = self.retry_count {
            control.retry_count = value;
        }
        if let Some(value) = self.has_error {
            control.has_error = value;
        }
        self.error_info.apply_to(&mut control.error_info);
        if let Some(value) = self.is_killed {
            control.is_killed = value;
        }
        self.kill_reason.apply_to(&mut control.kill_reason);
    }
}

/// The delta a node returns. Empty fields change nothing; list fields append (step records
/// upsert by key); context and session merge; everything else replaces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStateUpdate {
    /// Starts a new turn first (resets turn-scoped groups, appends the user message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_turn: Option<TurnStart>,
    /// Messages to append (with `new_turn`: before the turn's user message).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// Context entries to merge at (type, key) granularity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextStore>,
    /// Session keys to set (shallow merge).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub session: BTreeMap<String, Value>,
    /// New per-turn switches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_control: Option<AgentControl>,
    /// New task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskState>,
    /// New active capabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_capabilities: Option<Vec<String>>,
    /// New plan.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub execution_plan: Slot<Option<ExecutionPlan>>,
    /// New step index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step_index: Option<usize>,
    /// Step records to upsert by key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub step_results: Vec<StepRecord>,
    /// New last result.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub last_result: Slot<Option<LastResult>>,
    /// New turn start time.
    #[serde(skip_serializing_if = "Slot::is_keep")]
    pub execution_start_time: Slot<Option<DateTime<Utc>>>,
    /// Control patch.
    #[serde(skip_serializing_if = "ControlUpdate::is_empty")]
    pub control: ControlUpdate,
    /// Artifacts to append.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ui_artifacts: Vec<Artifact>,
    /// New ReAct state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub react: Option<ReactState>,
}

impl AgentStateUpdate {
    /// An update that appends one message.
    pub fn message(message: Message) -> Self {
        Self { messages: vec![message], ..Self::default() }
    }

    /// An update that starts a new turn.
    pub fn new_turn(turn: TurnStart) -> Self {
        Self { new_turn: Some(turn), ..Self::default() }
    }
}

fn upsert_record(records: &mut Vec<StepRecord>, record: StepRecord) {
    match records.iter_mut().find(|existing| existing.key == record.key) {
        Some(existing) => *existing = record,
        None => records.push(record),
    }
}

impl GraphState for AgentState {
    type Update = AgentStateUpdate;
    type Event = AgentEvent;

    fn apply(&mut self, update: AgentStateUpdate) {
        // Messages sent with a new turn (markers such as the end of a direct chat) precede its
        // user message.
        self.messages.extend(update.messages);
        if let Some(turn) = update.new_turn {
            self.start_turn(turn);
        }
        if let Some(context) = update.context {
            self.capability_context_data.merge(context);
        }
        self.session_state.extend(update.session);
        if let Some(agent_control) = update.agent_control {
            self.agent_control = agent_control;
        }
        if let Some(task) = update.task {
            self.task = task;
        }
        if let Some(active) = update.active_capabilities {
            self.planning.active_capabilities = active;
        }
        update.execution_plan.apply_to(&mut self.planning.execution_plan);
        if let Some(index) = update.current_step_index {
            self.planning.current_step_index = index;
        }
        for record in update.step_results {
            upsert_record(&mut self.execution.step_results, record);
        }
        update.last_result.apply_to(&mut self.execution.last_result);
        update.execution_start_time.apply_to(&mut self.execution.start_time);
        update.control.apply_to(&mut self.control);
        self.ui_artifacts.extend(update.ui_artifacts);
        if let Some(react) = update.react {
            self.react = react;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::context::ContextEntry;

    fn busy_state() -> AgentState {
        let mut state = AgentState::default();
        state.messages.push(Message::user("first"));
        state.messages.push(Message::assistant("answer"));
        state.capability_context_data.insert("TIME_RANGE", "tr", ContextEntry::new(json!({"start": 1}), None));
        state.session_state.insert("session_id".into(), json!("s1"));
        state.agent_control.planning_mode_enabled = true;
        state.task.current_task = Some("old task".into());
        state.planning.active_capabilities = vec!["python".into()];
        state.planning.execution_plan = Some(ExecutionPlan { steps: vec![PlannedStep::generic_respond("t")] });
        state.planning.current_step_index = 1;
        state.control = ControlState {
            reclassification_count: 1,
            planning_attempts: 2,
            retry_count: 3,
            has_error: true,
            is_killed: true,
            ..ControlState::default()
        };
        state.react.step_count = 4;
        state.capability_slash_commands.insert("beam".into(), json!(true));
        state
    }

    #[test]
    fn acceptance_case_18_fresh_turn_keeps_persistent_fields_and_resets_the_rest() {
        let before = busy_state();
        let mut state = before.clone();
        let turn = TurnStart::new("second", AgentControl::default());
        state.apply(AgentStateUpdate::new_turn(turn.clone()));

        assert_eq!(state.messages.len(), 3);
        assert_eq!(state.user_query(), Some("second"));
        assert_eq!(state.capability_context_data, before.capability_context_data);
        assert_eq!(state.session_state, before.session_state);

        let expected = AgentState {
            messages: state.messages.clone(),
            capability_context_data: before.capability_context_data.clone(),
            session_state: before.session_state.clone(),
            execution: ExecutionState { start_time: Some(turn.start_time), ..ExecutionState::default() },
            ..AgentState::default()
        };
        assert_eq!(state, expected);
    }

    #[test]
    fn session_merge_is_shallow() {
        let mut state = busy_state();
        let mut update = AgentStateUpdate::default();
        update.session.insert("direct_chat_capability".into(), json!("state_manager"));
        state.apply(update);
        assert_eq!(state.session_state.get("session_id"), Some(&json!("s1")));
        assert_eq!(state.direct_chat_capability(), Some("state_manager"));
    }

    #[test]
    fn updates_round_trip_through_json_compactly() {
        let update = AgentStateUpdate {
            execution_plan: Slot::Set(None),
            control: ControlUpdate { retry_count: Some(2), ..ControlUpdate::default() },
            ..AgentStateUpdate::default()
        };
        let json = serde_json::to_value(&update).expect("serializes");
        assert_eq!(json, json!({"execution_plan": null, "control": {"retry_count": 2}}));
        assert_eq!(serde_json::from_value::<AgentStateUpdate>(json).expect("parses"), update);
        assert_eq!(serde_json::to_value(AgentStateUpdate::default()).expect("serializes"), json!({}));
    }

    #[test]
    fn state_round_trips_through_json() {
        let state = busy_state();
        let text = serde_json::to_string(&state).expect("serializes");
        assert_eq!(serde_json::from_str::<AgentState>(&text).expect("parses"), state);
    }
}

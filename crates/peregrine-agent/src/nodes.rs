//! Node wrappers: what turns a `Capability` or an `InfrastructureNode` into a graph node. They
//! add step bookkeeping, timing, events and error capture: a failure becomes state (error flag,
//! classification, retry policy, counters) for the router to recover from, and success clears
//! it — for infrastructure nodes and capabilities alike. They also hand a node the answer to
//! its approval request, taken from the engine's verified resume record and nothing else.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use peregrine_core::events::{EventKind, StatusLevel};
use peregrine_core::state::{LastResult, NodeKind, StepRecord};
use peregrine_core::{
    AgentEvent, AgentState, AgentStateUpdate, ApprovalAnswer, ApprovalRequest, CapabilityError, CapabilityInput, CapabilityOutcome,
    ControlUpdate, DynCapability, ErrorClassification, ErrorInfo, ErrorSeverity, EventSink, PlannedStep, RetryPolicy, Slot,
};
use peregrine_graph::{Node, NodeContext, NodeOutput, NodeResult};

use crate::router::{CLASSIFIER, ORCHESTRATOR};

/// A recovery budget an infrastructure node's executions count against; decided by the node's
/// name, so no implementation can opt out of its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecoveryCounter {
    /// Every execution that does not end in a retriable failure is a planning attempt.
    Planning,
    /// An execution while a RECLASSIFICATION error is pending is a re-classification.
    Reclassification,
}

/// A framework node that is not a plan step: task extraction, classifier, orchestrator, error.
pub trait InfrastructureNode: Send + Sync + 'static {
    /// Node name.
    fn name(&self) -> &str;

    /// What it does, for status events.
    fn description(&self) -> &str;

    /// Classifies a failure; CRITICAL by default.
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        error
            .classification()
            .cloned()
            .unwrap_or_else(|| ErrorClassification::critical(format!("Infrastructure error in {}: {}", self.name(), error.message())))
    }

    /// Retry policy; 2 attempts, 0.2 s, ×1.2 by default.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::infrastructure_default()
    }

    /// Quiet nodes emit no start/complete status events.
    fn quiet(&self) -> bool {
        false
    }

    /// Runs the node.
    fn execute(
        &self,
        state: &AgentState,
        ctx: &NodeContext<AgentState>,
    ) -> impl Future<Output = Result<CapabilityOutcome, CapabilityError>> + Send;
}

/// Sends core events (and LLM events, via `CallOptions::events`) into the run's event stream.
pub struct NodeEvents<'a>(pub &'a NodeContext<AgentState>);

impl EventSink for NodeEvents<'_> {
    fn emit(&self, event: AgentEvent) {
        self.0.emit(event);
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The answer to the approval request this node made, when it runs again after one: read from
/// the engine's resume record, which is bound to the digest of what was asked. An answer that
/// is not an explicit approval (`true` or `{"approved": true}`) counts as a rejection; an
/// approval may carry an edited payload (`{"approved": true, "edit": …}`).
pub fn approval_answer(ctx: &NodeContext<AgentState>) -> Option<ApprovalAnswer> {
    let record = ctx.resume()?;
    let approved = match &record.answer {
        serde_json::Value::Bool(approved) => *approved,
        answer => answer.get("approved").and_then(serde_json::Value::as_bool).unwrap_or(false),
    };
    Some(ApprovalAnswer {
        approval_type: record.payload.get("approval_type").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned(),
        approved,
        payload: record.payload.get("resume_payload").cloned().unwrap_or(serde_json::Value::Null),
        delivery: record.delivery,
        edit: if approved { record.answer.get("edit").filter(|edit| !edit.is_null()).cloned() } else { None },
        feedback: record.answer.get("feedback").and_then(serde_json::Value::as_str).map(str::to_owned),
    })
}

/// The interrupt payload of an approval request.
fn interrupt_for(request: ApprovalRequest, ctx: &NodeContext<AgentState>, component: &str) -> NodeResult<AgentStateUpdate> {
    ctx.emit(AgentEvent::new(
        component,
        EventKind::ApprovalRequired { approval_type: request.approval_type.clone(), user_message: request.user_message.clone() },
    ));
    let payload = serde_json::json!({
        "approval_type": request.approval_type,
        "user_message": request.user_message,
        "resume_payload": request.payload,
    });
    // Asking is not failing: an error this node recovered from (a retried call, an invalid
    // edit re-planned) is over once it asks, so the paused state shows none.
    let update = AgentStateUpdate { control: cleared_errors(), ..AgentStateUpdate::default() };
    Ok(NodeOutput::Interrupt { payload, update })
}

/// The last result of a successful execution.
fn succeeded(node: &str, execution_time_ms: u64, timestamp: chrono::DateTime<Utc>) -> LastResult {
    LastResult { capability: node.into(), success: true, execution_time_ms, error: None, severity: None, timestamp }
}

/// The part of every success update that clears error state.
fn cleared_errors() -> ControlUpdate {
    ControlUpdate { retry_count: Some(0), has_error: Some(false), error_info: Slot::Set(None), ..ControlUpdate::default() }
}

/// Consecutive failures of `node`, counting this one: failures of another node start afresh.
fn failures_of(state: &AgentState, node: &str) -> u32 {
    match &state.control.error_info {
        Some(info) if state.control.has_error && info.node == node => state.control.retry_count + 1,
        _ => 1,
    }
}

struct Failure<'a> {
    node: &'a str,
    kind: NodeKind,
    record_key: String,
    step_index: usize,
    task_objective: String,
    error: &'a CapabilityError,
    classification: ErrorClassification,
    retry_policy: RetryPolicy,
    execution_time_ms: u64,
}

fn failure_update(state: &AgentState, failure: Failure<'_>) -> AgentStateUpdate {
    let now = Utc::now();
    let severity = failure.classification.severity;
    AgentStateUpdate {
        step_results: vec![StepRecord {
            key: failure.record_key,
            step_index: failure.step_index,
            capability: failure.node.into(),
            task_objective: failure.task_objective,
            success: false,
            execution_time_ms: failure.execution_time_ms,
            timestamp: now,
            error: Some(failure.error.message().into()),
        }],
        last_result: Slot::Set(Some(LastResult {
            capability: failure.node.into(),
            success: false,
            execution_time_ms: failure.execution_time_ms,
            error: Some(failure.error.message().into()),
            severity: Some(severity),
            timestamp: now,
        })),
        control: ControlUpdate {
            retry_count: Some(failures_of(state, failure.node)),
            has_error: Some(true),
            error_info: Slot::Set(Some(ErrorInfo {
                node: failure.node.into(),
                node_kind: failure.kind,
                classification: failure.classification,
                retry_policy: failure.retry_policy,
                original_error: failure.error.message().into(),
                execution_time_ms: failure.execution_time_ms,
                timestamp: now,
            })),
            ..ControlUpdate::default()
        },
        ..AgentStateUpdate::default()
    }
}

/// A capability as a graph node (upstream's `@capability_node`).
pub struct CapabilityNode {
    capability: Arc<dyn DynCapability>,
}

impl CapabilityNode {
    /// Wraps a registered capability.
    pub fn new(capability: Arc<dyn DynCapability>) -> Self {
        Self { capability }
    }

    /// The step this execution runs: the plan's current step, or a synthesized one in direct chat.
    fn current_step(&self, state: &AgentState) -> Result<(PlannedStep, bool), CapabilityError> {
        let spec = self.capability.spec();
        let name = &spec.name;
        // The same predicate as the router's: only a direct-chat capability is talked to directly.
        if spec.direct_chat_enabled && state.direct_chat_capability() == Some(name.as_str()) {
            let step = PlannedStep {
                context_key: format!("direct_chat_{name}"),
                capability: name.clone(),
                task_objective: state.user_query().unwrap_or_default().to_owned(),
                success_criteria: String::new(),
                expected_output: None,
                parameters: None,
                inputs: Vec::new(),
            };
            return Ok((step, true));
        }
        match state.planning.current_step() {
            Some(step) if &step.capability == name => Ok((step.clone(), false)),
            Some(step) => Err(CapabilityError::new(format!(
                "capability '{name}' was dispatched but the current plan step is for '{}'",
                step.capability
            ))),
            None => Err(CapabilityError::new(format!("capability '{name}' was dispatched but there is no current plan step"))),
        }
    }
}

impl Node<AgentState> for CapabilityNode {
    async fn run(&self, state: Arc<AgentState>, ctx: &NodeContext<AgentState>) -> NodeResult<AgentStateUpdate> {
        let spec = self.capability.spec();
        let name = spec.name.as_str();
        let index = state.planning.current_step_index;
        let total_steps = state.planning.execution_plan.as_ref().map_or(1, |plan| plan.steps.len());
        let started = Instant::now();
        let (step, direct_chat) = match self.current_step(&state) {
            Ok(found) => found,
            Err(error) => {
                let classification = ErrorClassification::critical(error.message());
                let failure = Failure {
                    node: name,
                    kind: NodeKind::Capability,
                    record_key: format!("{index}_{name}"),
                    step_index: index,
                    task_objective: String::new(),
                    error: &error,
                    classification,
                    retry_policy: self.capability.retry_policy(),
                    execution_time_ms: 0,
                };
                return Ok(NodeOutput::Update(failure_update(&state, failure)));
            }
        };
        ctx.emit(AgentEvent::new(
            name,
            EventKind::CapabilityStart {
                capability_name: name.into(),
                step_number: index + 1,
                total_steps,
                description: step.task_objective.clone(),
            },
        ));
        let sink = NodeEvents(ctx);
        let approval = approval_answer(ctx);
        let input = CapabilityInput { state: &state, step: &step, spec, events: &sink, approval: approval.as_ref() };
        let result = self.capability.execute_boxed(input).await;
        let execution_time_ms = elapsed_ms(started);
        match result {
            Ok(CapabilityOutcome::Done(update)) => {
                ctx.emit(AgentEvent::new(
                    name,
                    EventKind::CapabilityComplete {
                        capability_name: name.into(),
                        success: true,
                        duration_ms: execution_time_ms,
                        error_message: None,
                    },
                ));
                let mut update = update;
                let now = Utc::now();
                if !direct_chat {
                    update.current_step_index = Some(index + 1);
                }
                update.step_results.push(StepRecord {
                    key: step.context_key.clone(),
                    step_index: index,
                    capability: name.into(),
                    task_objective: step.task_objective.clone(),
                    success: true,
                    execution_time_ms,
                    timestamp: now,
                    error: None,
                });
                update.last_result = Slot::Set(Some(succeeded(name, execution_time_ms, now)));
                update.control.merge_from(cleared_errors());
                Ok(NodeOutput::Update(update))
            }
            Ok(CapabilityOutcome::NeedsApproval(request)) => interrupt_for(request, ctx, name),
            Err(error) => {
                let classification = self.capability.classify_error(&error);
                ctx.emit(AgentEvent::new(
                    name,
                    EventKind::CapabilityComplete {
                        capability_name: name.into(),
                        success: false,
                        duration_ms: execution_time_ms,
                        error_message: Some(error.message().into()),
                    },
                ));
                ctx.emit(AgentEvent::new(
                    name,
                    EventKind::Error {
                        error_type: "CapabilityError".into(),
                        error_message: error.message().into(),
                        recoverable: classification.severity != ErrorSeverity::Critical && classification.severity != ErrorSeverity::Fatal,
                    },
                ));
                let failure = Failure {
                    node: name,
                    kind: NodeKind::Capability,
                    record_key: step.context_key.clone(),
                    step_index: index,
                    task_objective: step.task_objective.clone(),
                    error: &error,
                    classification,
                    retry_policy: self.capability.retry_policy(),
                    execution_time_ms,
                };
                Ok(NodeOutput::Update(failure_update(&state, failure)))
            }
        }
    }
}

/// An infrastructure node as a graph node (upstream's `@infrastructure_node`).
pub struct InfrastructureWrapper<N>(pub N);

impl<N: InfrastructureNode> InfrastructureWrapper<N> {
    fn recovery_counter(&self) -> Option<RecoveryCounter> {
        match self.0.name() {
            ORCHESTRATOR => Some(RecoveryCounter::Planning),
            CLASSIFIER => Some(RecoveryCounter::Reclassification),
            _ => None,
        }
    }

    fn counters(&self, state: &AgentState, severity: Option<ErrorSeverity>) -> ControlUpdate {
        let mut control = ControlUpdate::default();
        match self.recovery_counter() {
            Some(RecoveryCounter::Planning) if severity != Some(ErrorSeverity::Retriable) => {
                control.planning_attempts = Some(state.control.planning_attempts + 1);
            }
            Some(RecoveryCounter::Reclassification) => {
                let reclassifying = state.control.has_error
                    && state
                        .control
                        .error_info
                        .as_ref()
                        .is_some_and(|info| info.classification.severity == ErrorSeverity::Reclassification);
                if reclassifying {
                    control.reclassification_count = Some(state.control.reclassification_count + 1);
                    control.reclassification_reason = Slot::Set(None);
                }
            }
            _ => {}
        }
        control
    }
}

impl<N: InfrastructureNode> Node<AgentState> for InfrastructureWrapper<N> {
    async fn run(&self, state: Arc<AgentState>, ctx: &NodeContext<AgentState>) -> NodeResult<AgentStateUpdate> {
        let node = &self.0;
        let name = node.name();
        if !node.quiet() {
            ctx.emit(AgentEvent::status(name, StatusLevel::Info, format!("Starting {}", node.description())));
        }
        let started = Instant::now();
        let result = node.execute(&state, ctx).await;
        let execution_time_ms = elapsed_ms(started);
        match result {
            Ok(CapabilityOutcome::Done(update)) => {
                if !node.quiet() {
                    ctx.emit(AgentEvent::status(
                        name,
                        StatusLevel::Success,
                        format!("Completed {} in {:.1}s", node.description(), execution_time_ms as f64 / 1000.0),
                    ));
                }
                let mut update = update;
                update.last_result = Slot::Set(Some(succeeded(name, execution_time_ms, Utc::now())));
                update.control.merge_from(cleared_errors());
                update.control.merge_from(self.counters(&state, None));
                // What the router relies on after these nodes, whatever the node itself returned:
                // a new classification invalidates the plan, a new plan starts at its first step.
                match self.recovery_counter() {
                    Some(RecoveryCounter::Reclassification) => {
                        update.execution_plan = Slot::Set(None);
                        update.current_step_index = Some(0);
                    }
                    Some(RecoveryCounter::Planning) => update.current_step_index = Some(0),
                    None => {}
                }
                Ok(NodeOutput::Update(update))
            }
            Ok(CapabilityOutcome::NeedsApproval(request)) => interrupt_for(request, ctx, name),
            Err(error) => {
                let classification = node.classify_error(&error);
                let severity = classification.severity;
                ctx.emit(AgentEvent::new(
                    name,
                    EventKind::Error {
                        error_type: "InfrastructureError".into(),
                        error_message: error.message().into(),
                        recoverable: severity == ErrorSeverity::Retriable,
                    },
                ));
                let index = state.planning.current_step_index;
                let failure = Failure {
                    node: name,
                    kind: NodeKind::Infrastructure,
                    record_key: format!("infra_{index}_{name}"),
                    step_index: index,
                    task_objective: node.description().into(),
                    error: &error,
                    classification,
                    retry_policy: node.retry_policy(),
                    execution_time_ms,
                };
                let mut update = failure_update(&state, failure);
                update.control.merge_from(self.counters(&state, Some(severity)));
                Ok(NodeOutput::Update(update))
            }
        }
    }
}

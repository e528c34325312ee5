//! The demo agent: the real framework (router, wrappers, durable SQLite checkpoints, events)
//! with rule-based task extraction, classification and planning (until the LLM-backed nodes
//! land) and a respond capability that answers through the LLM layer's `response` role when a
//! model is configured — the embedded local model by default in the main job.

use peregrine_agent::{AgentGraphBuilder, InfrastructureNode};
use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::state::TaskState;
use peregrine_core::{
    AgentState, AgentStateUpdate, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ExecutionLimits,
    ExecutionPlan, Message, PlannedStep, Registry, RetryPolicy, Slot,
};
use peregrine_graph::{DynCheckpointer, Graph, NodeContext};
use peregrine_llm::{CallOptions, ChatMessage, LlmClient, roles};
use std::sync::Arc;

/// Task extraction without an LLM: the task is the latest user message.
struct EchoTaskExtraction;

impl InfrastructureNode for EchoTaskExtraction {
    fn name(&self) -> &str {
        "task_extraction"
    }
    fn description(&self) -> &str {
        "task extraction"
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::task_extraction()
    }
    async fn execute(&self, state: &AgentState, _ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let task = state.user_query().unwrap_or_default().trim().to_owned();
        if task.is_empty() {
            return Err(CapabilityError::new("the message is empty; say what you need"));
        }
        Ok(CapabilityOutcome::Done(AgentStateUpdate {
            task: Some(TaskState { current_task: Some(task), ..TaskState::default() }),
            ..AgentStateUpdate::default()
        }))
    }
}

/// Classification without an LLM: every capability is active.
struct SelectAll(Vec<String>);

impl InfrastructureNode for SelectAll {
    fn name(&self) -> &str {
        "classifier"
    }
    fn description(&self) -> &str {
        "capability classification"
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::classifier()
    }
    async fn execute(&self, _state: &AgentState, _ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        Ok(CapabilityOutcome::Done(AgentStateUpdate {
            active_capabilities: Some(self.0.clone()),
            execution_plan: Slot::Set(None),
            current_step_index: Some(0),
            ..AgentStateUpdate::default()
        }))
    }
}

/// Planning without an LLM: a question mark asks for clarification, anything else is answered.
struct RulePlanner;

impl InfrastructureNode for RulePlanner {
    fn name(&self) -> &str {
        "orchestrator"
    }
    fn description(&self) -> &str {
        "execution planning"
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::orchestrator()
    }
    async fn execute(&self, state: &AgentState, _ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let task = state.task.current_task.clone().unwrap_or_default();
        let step = if task.trim() == "?" {
            PlannedStep { capability: CLARIFY.into(), context_key: "clarification".into(), ..PlannedStep::generic_respond(&task) }
        } else {
            PlannedStep::generic_respond(&task)
        };
        Ok(CapabilityOutcome::Done(AgentStateUpdate {
            execution_plan: Slot::Set(Some(ExecutionPlan { steps: vec![step] })),
            current_step_index: Some(0),
            ..AgentStateUpdate::default()
        }))
    }
}

/// The error report, without the LLM analysis part.
struct ErrorReport;

impl InfrastructureNode for ErrorReport {
    fn name(&self) -> &str {
        "error"
    }
    fn description(&self) -> &str {
        "error reporting"
    }
    fn classify_error(&self, error: &CapabilityError) -> peregrine_core::ErrorClassification {
        peregrine_core::ErrorClassification::fatal(format!("the error node itself failed: {}", error.message()))
    }
    async fn execute(&self, state: &AgentState, _ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let report = match &state.control.error_info {
            Some(info) => format!(
                "⚠️ **ERROR REPORT**\n**Error Severity:** {}\n**Failed Operation:** {}\n{}",
                info.classification.severity,
                info.node,
                info.classification.format_for_llm()
            ),
            None => "⚠️ **ERROR REPORT**\n**Error Severity:** CRITICAL\nThe turn was stopped.".to_owned(),
        };
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(report))))
    }
}

/// Respond: with a model for the `response` role, the answer is generated (streamed as token
/// events); without one, it says what the framework did.
struct DemoRespond {
    spec: CapabilitySpec,
    llm: Option<Arc<LlmClient>>,
}

impl Capability for DemoRespond {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    fn classify_error(&self, error: &CapabilityError) -> peregrine_core::ErrorClassification {
        error.default_classification()
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let state = input.state;
        let task = state.task.current_task.as_deref().unwrap_or_default();
        let Some(llm) = &self.llm else {
            let turns = state.messages.iter().filter(|message| message.role == peregrine_core::Role::User).count();
            let text = format!(
                "Task: {task}\nCapabilities selected: {}\nThis is turn {turns} of this thread; every step was checkpointed. \
                 No language model is configured, so this answer comes from the built-in demo responder.",
                state.planning.active_capabilities.join(", "),
            );
            return Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(text))));
        };
        let messages = vec![
            ChatMessage::system(
                "You are a control-room assistant for a particle accelerator. Answer briefly and plainly; never invent measured values.",
            ),
            ChatMessage::user(task),
        ];
        let options = CallOptions { events: Some(input.events), component: Some(RESPOND) };
        let response = llm.complete_streaming(roles::RESPONSE, messages, options).await.map_err(CapabilityError::from)?;
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(response.content.trim()))))
    }
}

/// Clarify without an LLM.
struct DemoClarify(CapabilitySpec);

impl Capability for DemoClarify {
    fn spec(&self) -> &CapabilitySpec {
        &self.0
    }
    async fn execute(&self, _input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(
            "I need some clarification:\n\n1. What would you like me to do?",
        ))))
    }
}

/// Assembles the demo agent over `checkpointer`; `llm`, when given, answers the `response` role.
pub fn graph(
    checkpointer: Arc<dyn DynCheckpointer>,
    limits: ExecutionLimits,
    llm: Option<Arc<LlmClient>>,
) -> anyhow::Result<Graph<AgentState>> {
    let mut registry = Registry::new();
    let spec =
        CapabilitySpec { always_active: true, provides: vec!["FINAL_RESPONSE".into()], ..CapabilitySpec::new(RESPOND, "Answer the user") };
    registry.register(DemoRespond { spec, llm })?;
    registry.register(DemoClarify(CapabilitySpec {
        always_active: true,
        ..CapabilitySpec::new(CLARIFY, "Ask the user for missing details")
    }))?;
    let names = registry.names().map(str::to_owned).collect();
    let graph = AgentGraphBuilder::new(registry, limits)
        .infrastructure(EchoTaskExtraction)
        .infrastructure(SelectAll(names))
        .infrastructure(RulePlanner)
        .infrastructure(ErrorReport)
        .checkpointer(checkpointer)
        .build()?;
    Ok(graph)
}

//! Scripted nodes: infrastructure nodes and capabilities whose every execution is decided by a
//! closure, with a log of when each call happened (on tokio's clock, so paused-time tests can
//! check backoff exactly).

use std::sync::{Arc, Mutex};

use peregrine_agent::{AgentGraphBuilder, InfrastructureNode};
use peregrine_core::{
    AgentState, AgentStateUpdate, ApprovalAnswer, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec,
    ErrorClassification, ExecutionLimits, ExecutionPlan, Message, PlannedStep, Registry, RetryPolicy, Slot,
};
use peregrine_graph::{DynCheckpointer, Graph, NodeContext};
use tokio::time::Instant;

/// What a scripted node does on its n-th call (1-based), given the state.
pub type Behaviour = Arc<dyn Fn(&AgentState, u32) -> Result<CapabilityOutcome, CapabilityError> + Send + Sync>;

/// When each call of a scripted node happened.
#[derive(Debug, Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Instant>>>);

impl CallLog {
    fn record(&self) -> u32 {
        let mut calls = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.push(Instant::now());
        u32::try_from(calls.len()).unwrap_or(u32::MAX)
    }

    /// How many times the node ran.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// When it ran.
    pub fn instants(&self) -> Vec<Instant> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// An infrastructure node driven by a closure.
pub struct ScriptedInfra {
    name: String,
    policy: RetryPolicy,
    behaviour: Behaviour,
    calls: CallLog,
}

impl ScriptedInfra {
    /// A node named `name` behaving as `behaviour`, with the infrastructure default policy.
    pub fn new(
        name: &str,
        behaviour: impl Fn(&AgentState, u32) -> Result<CapabilityOutcome, CapabilityError> + Send + Sync + 'static,
    ) -> Self {
        Self { name: name.into(), policy: RetryPolicy::infrastructure_default(), behaviour: Arc::new(behaviour), calls: CallLog::default() }
    }

    /// Sets the retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The call log (shared with the node).
    pub fn calls(&self) -> CallLog {
        self.calls.clone()
    }
}

impl InfrastructureNode for ScriptedInfra {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "scripted infrastructure node"
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.policy
    }

    async fn execute(&self, state: &AgentState, _ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        let call = self.calls.record();
        (self.behaviour)(state, call)
    }
}

/// A capability driven by a closure.
pub struct ScriptedCapability {
    spec: CapabilitySpec,
    policy: RetryPolicy,
    behaviour: Behaviour,
    calls: CallLog,
    approvals: ApprovalLog,
}

/// The approval answer each call of a scripted capability received (`None`: no answer).
#[derive(Debug, Clone, Default)]
pub struct ApprovalLog(Arc<Mutex<Vec<Option<ApprovalAnswer>>>>);

impl ApprovalLog {
    fn record(&self, answer: Option<&ApprovalAnswer>) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(answer.cloned());
    }

    /// What each call received, in call order.
    pub fn received(&self) -> Vec<Option<ApprovalAnswer>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl ScriptedCapability {
    /// A capability named `name` behaving as `behaviour`, with the capability default policy.
    pub fn new(
        name: &str,
        behaviour: impl Fn(&AgentState, u32) -> Result<CapabilityOutcome, CapabilityError> + Send + Sync + 'static,
    ) -> Self {
        let spec = CapabilitySpec {
            always_active: name == "respond" || name == "clarify",
            ..CapabilitySpec::new(name, format!("scripted {name}"))
        };
        Self {
            spec,
            policy: RetryPolicy::capability_default(),
            behaviour: Arc::new(behaviour),
            calls: CallLog::default(),
            approvals: ApprovalLog::default(),
        }
    }

    /// A capability that always succeeds, appending `"<name> done"` as an assistant message.
    pub fn succeeding(name: &str) -> Self {
        let message = format!("{name} done");
        Self::new(name, move |_, _| Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(message.clone())))))
    }

    /// Sets the retry policy.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The call log (shared with the capability).
    pub fn calls(&self) -> CallLog {
        self.calls.clone()
    }

    /// The approval answers the capability received (shared with the capability).
    pub fn approvals(&self) -> ApprovalLog {
        self.approvals.clone()
    }

    /// Marks the capability as reachable with `/chat:<name>`.
    pub fn direct_chat(mut self) -> Self {
        self.spec.direct_chat_enabled = true;
        self
    }
}

impl Capability for ScriptedCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.policy
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let call = self.calls.record();
        self.approvals.record(input.approval);
        (self.behaviour)(input.state, call)
    }
}

/// Fails with a classification.
pub fn fail(classification: ErrorClassification) -> Result<CapabilityOutcome, CapabilityError> {
    Err(CapabilityError::new(classification.user_message.clone().unwrap_or_default()).classified(classification))
}

/// A whole agent with scripted infrastructure: task extraction sets a task, the classifier
/// selects `capabilities`, the orchestrator plans one step per capability (then respond), the
/// error node appends an error report. Replace any piece before building.
pub struct ScriptedAgent {
    /// Task extraction.
    pub task_extraction: ScriptedInfra,
    /// Classifier.
    pub classifier: ScriptedInfra,
    /// Orchestrator.
    pub orchestrator: ScriptedInfra,
    /// Error node.
    pub error: ScriptedInfra,
    /// Capabilities, respond and clarify included.
    pub capabilities: Vec<ScriptedCapability>,
    /// Limits.
    pub limits: ExecutionLimits,
}

impl ScriptedAgent {
    /// An agent whose plan runs `plan` (capability names) and then respond.
    pub fn planning(plan: &[&str]) -> Self {
        let plan_names: Vec<String> = plan.iter().map(|name| name.to_string()).collect();
        let selected = plan_names.clone();
        let steps: Vec<PlannedStep> = plan_names
            .iter()
            .enumerate()
            .map(|(index, name)| PlannedStep {
                context_key: format!("{index}_{name}"),
                capability: name.clone(),
                task_objective: format!("run {name}"),
                ..PlannedStep::generic_respond("t")
            })
            .chain(std::iter::once(PlannedStep::generic_respond("the task")))
            .collect();
        let mut capabilities: Vec<ScriptedCapability> = plan_names
            .iter()
            .filter(|name| *name != "respond" && *name != "clarify")
            .map(|name| ScriptedCapability::succeeding(name))
            .collect();
        capabilities.push(ScriptedCapability::succeeding("respond"));
        capabilities.push(ScriptedCapability::succeeding("clarify"));
        Self {
            task_extraction: ScriptedInfra::new("task_extraction", |_, _| {
                Ok(CapabilityOutcome::Done(AgentStateUpdate {
                    task: Some(peregrine_core::state::TaskState { current_task: Some("the task".into()), ..Default::default() }),
                    ..Default::default()
                }))
            })
            .with_policy(RetryPolicy::task_extraction()),
            classifier: ScriptedInfra::new("classifier", move |_, _| {
                let mut active = selected.clone();
                active.extend(["respond".to_string(), "clarify".to_string()]);
                Ok(CapabilityOutcome::Done(AgentStateUpdate {
                    active_capabilities: Some(active),
                    execution_plan: Slot::Set(None),
                    current_step_index: Some(0),
                    ..Default::default()
                }))
            })
            .with_policy(RetryPolicy::classifier()),
            orchestrator: ScriptedInfra::new("orchestrator", move |_, _| {
                Ok(CapabilityOutcome::Done(AgentStateUpdate {
                    execution_plan: Slot::Set(Some(ExecutionPlan { steps: steps.clone() })),
                    current_step_index: Some(0),
                    ..Default::default()
                }))
            })
            .with_policy(RetryPolicy::orchestrator()),
            error: ScriptedInfra::new("error", |state, _| {
                let severity =
                    state.control.error_info.as_ref().map_or("unknown".to_string(), |info| info.classification.severity.to_string());
                Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(format!("ERROR REPORT: {severity}")))))
            }),
            capabilities,
            limits: ExecutionLimits::default(),
        }
    }

    /// Replaces (or adds) a capability.
    pub fn with_capability(mut self, capability: ScriptedCapability) -> Self {
        self.capabilities.retain(|existing| existing.spec.name != capability.spec.name);
        self.capabilities.push(capability);
        self
    }

    /// The call log of a capability.
    pub fn capability_calls(&self, name: &str) -> CallLog {
        self.capabilities.iter().find(|capability| capability.spec.name == name).map(ScriptedCapability::calls).unwrap_or_default()
    }

    /// Assembles the graph.
    pub fn build(self, checkpointer: Option<Arc<dyn DynCheckpointer>>) -> anyhow::Result<Graph<AgentState>> {
        let mut registry = Registry::new();
        for capability in self.capabilities {
            registry.register(capability)?;
        }
        let mut builder = AgentGraphBuilder::new(registry, self.limits)
            .infrastructure(self.task_extraction)
            .infrastructure(self.classifier)
            .infrastructure(self.orchestrator)
            .infrastructure(self.error);
        if let Some(checkpointer) = checkpointer {
            builder = builder.checkpointer(checkpointer);
        }
        Ok(builder.build()?)
    }
}

//! The orchestrator (reference §2.4, §4): turns the task and the active capabilities into a
//! validated `ExecutionPlan` with one structured LLM call, and in planning mode asks a person
//! to approve the plan first (saved per thread for plan editors), then uses the approved — or
//! edited, re-validated — plan without calling the model again.
//!
//! Plans are validated against every *registered* capability, as upstream does; the schema's
//! `capability` enum already steers the model to the active ones, and a registered but
//! inactive capability still runs correctly when dispatched.

pub mod pending;
pub mod prompt;
pub mod schema;

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use peregrine_core::events::{EventKind, Phase};
use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::{
    AgentEvent, AgentState, AgentStateUpdate, ApprovalAnswer, ApprovalRequest, CapabilityError, CapabilityOutcome, CapabilitySpec,
    ErrorClassification, ExecutionPlan, PlanValidationError, PlannedStep, RetryPolicy, Slot, approval_message, validate_plan,
};
use peregrine_graph::NodeContext;
use peregrine_llm::{CallOptions, ChatMessage, roles};
use serde_json::Value;

use self::pending::{PendingPlans, PlanMetadata, parse_plan};
pub use self::prompt::{DefaultOrchestratorPrompts, OrchestratorPrompts, PlanningPromptInput};
use crate::catalog::Catalog;
use crate::nodes::{InfrastructureNode, NodeEvents, approval_answer};
use crate::router::ORCHESTRATOR;
use crate::services::Services;

/// The approval type of a plan awaiting approval in planning mode.
pub const PLAN_APPROVAL_TYPE: &str = "orchestrator_plan";

/// The plan-first orchestrator node.
pub struct Orchestrator {
    services: Services,
    catalog: Arc<Catalog>,
    prompts: Arc<dyn OrchestratorPrompts>,
}

/// A plan the person rejected, and what they said.
struct Rejection {
    plan: ExecutionPlan,
    feedback: Option<String>,
}

/// Where an approved plan came from; edits are untrusted and re-validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApprovedSource {
    /// An edited plan sent with the approval (the agent attaches a plan editor's
    /// `modified_execution_plan.json` here when the answer is given, so it is stored with the
    /// answer and redelivered unchanged after a crash).
    Edit,
    /// The plan shown in the approval request.
    Payload,
}

impl ApprovedSource {
    fn describe(self) -> &'static str {
        match self {
            Self::Edit => "the edited plan sent with the approval",
            Self::Payload => "the approved plan",
        }
    }
}

impl Orchestrator {
    /// An orchestrator planning with `catalog` and the default prompts.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog, prompts: Arc::new(DefaultOrchestratorPrompts) }
    }

    /// Replaces the prompt builder.
    pub fn with_prompts(mut self, prompts: Arc<dyn OrchestratorPrompts>) -> Self {
        self.prompts = prompts;
        self
    }

    /// The active capabilities that are registered, each once, sorted by guide priority
    /// (capabilities without a guide last; ties keep the classifier's order).
    fn active_specs(&self, state: &AgentState) -> Vec<&CapabilitySpec> {
        let mut specs: Vec<&CapabilitySpec> = Vec::new();
        for name in &state.planning.active_capabilities {
            if let Some(spec) = self.catalog.get(name)
                && !specs.iter().any(|known| known.name == spec.name)
            {
                specs.push(spec);
            }
        }
        specs.sort_by_key(|spec| spec.orchestrator_guide.as_ref().map_or(i32::MAX, |guide| guide.priority));
        specs
    }

    /// The names the schema allows: the active capabilities, plus respond and clarify when
    /// registered, since every plan must end with one of them.
    fn allowed_names(&self, active: &[&CapabilitySpec]) -> Vec<String> {
        let mut names: Vec<String> = active.iter().map(|spec| spec.name.clone()).collect();
        for terminal in [RESPOND, CLARIFY] {
            if self.catalog.contains(terminal) && !names.iter().any(|name| name == terminal) {
                names.push(terminal.to_owned());
            }
        }
        names
    }

    fn validate(&self, plan: ExecutionPlan, task: &str, state: &AgentState) -> Result<ExecutionPlan, PlanValidationError> {
        validate_plan(
            plan,
            task,
            |name| self.catalog.contains(name),
            || self.catalog.names().map(str::to_owned).collect(),
            &state.capability_context_data,
        )
    }

    fn pending_plans(&self, ctx: &NodeContext<AgentState>) -> PendingPlans {
        PendingPlans::for_thread(&self.services.settings.agent_data_dir, ctx.thread_id())
    }

    async fn run(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        // An answer to our own plan approval comes first: an approved plan is used as is.
        let mut rejection = None;
        if let Some(answer) = approval_answer(ctx).filter(|answer| answer.approval_type == PLAN_APPROVAL_TYPE) {
            let pending = self.pending_plans(ctx);
            if answer.approved {
                return self.use_approved_plan(state, ctx, &answer, &pending);
            }
            clear_pending(&pending);
            let plan = answer.payload.get("execution_plan").cloned().and_then(|plan| parse_plan(plan).ok());
            rejection = plan.map(|plan| Rejection { plan, feedback: answer.feedback.clone() });
            tracing::info!(thread = ctx.thread_id(), "plan rejected; planning again");
        }
        self.plan(state, ctx, rejection.as_ref()).await
    }

    /// Plans with one LLM call; in planning mode, asks for approval of the validated plan.
    async fn plan(
        &self,
        state: &AgentState,
        ctx: &NodeContext<AgentState>,
        rejection: Option<&Rejection>,
    ) -> Result<CapabilityOutcome, CapabilityError> {
        let Some(task) = state.task.current_task.as_deref().filter(|task| !task.trim().is_empty()) else {
            return Err(CapabilityError::new("the orchestrator ran without a task")
                .classified(ErrorClassification::critical("There is no task to plan; task extraction did not produce one")));
        };
        let active = self.active_specs(state);
        if active.is_empty() {
            let message = if state.planning.active_capabilities.is_empty() {
                "no capabilities are active for this task".to_owned()
            } else {
                format!("none of the active capabilities is registered: {}", state.planning.active_capabilities.join(", "))
            };
            return Err(CapabilityError::new(message.clone()).classified(
                ErrorClassification::reclassification("No usable capabilities were selected").with_metadata("technical_details", message),
            ));
        }
        // Nothing to plan: with no capability beyond respond and clarify (a conversational
        // turn) and no stored context respond could be given, the plan is the one respond step
        // — no model call. Upstream asks the model, which can only pick respond or clarify;
        // respond sees the history and can ask back. Re-planning after an error or a
        // rejection, planning mode, and a thread holding context from earlier turns (the model
        // decides what to reuse) still ask the model.
        let terminal_only = active.iter().all(|spec| spec.name == RESPOND || spec.name == CLARIFY);
        if terminal_only
            && state.capability_context_data.is_empty()
            && self.catalog.contains(RESPOND)
            && rejection.is_none()
            && state.control.error_info.is_none()
            && !state.agent_control.planning_mode_enabled
        {
            let plan = self.validate(ExecutionPlan { steps: vec![PlannedStep::generic_respond(task)] }, task, state)?;
            return Ok(plan_created(ctx, plan));
        }
        let input = PlanningPromptInput {
            task,
            state,
            capabilities: &active,
            error: state.control.error_info.as_ref().map(|info| &info.classification),
            rejected_plan: rejection.map(|rejection| &rejection.plan),
            rejection_feedback: rejection.and_then(|rejection| rejection.feedback.as_deref()),
            history_chars: self.services.settings.prompt_history_chars,
        };
        let prompt = self.prompts.planning_prompt(&input);
        let schema = schema::plan_schema(&self.allowed_names(&active));
        let events = NodeEvents(ctx);
        let options = CallOptions { events: Some(&events), component: Some(ORCHESTRATOR) };
        let plan: ExecutionPlan = self
            .services
            .llm
            .structured_with_schema(roles::ORCHESTRATOR, vec![ChatMessage::user(prompt)], schema, options)
            .await
            .map_err(CapabilityError::from)?;
        let plan = self.validate(plan, task, state)?;
        if state.agent_control.planning_mode_enabled {
            return self.request_approval(state, ctx, task, plan);
        }
        Ok(plan_created(ctx, plan))
    }

    /// Saves the plan for this thread and asks for its approval.
    fn request_approval(
        &self,
        state: &AgentState,
        ctx: &NodeContext<AgentState>,
        task: &str,
        plan: ExecutionPlan,
    ) -> Result<CapabilityOutcome, CapabilityError> {
        let pending = self.pending_plans(ctx);
        let metadata = PlanMetadata {
            current_task: task,
            original_query: state.user_query().unwrap_or_default(),
            thread_id: ctx.thread_id(),
            created_at: Utc::now().to_rfc3339(),
        };
        let path = pending.save(&plan, &metadata).map_err(|(path, error)| {
            let message = format!("cannot save the pending execution plan at {}: {error}", path.display());
            CapabilityError::new(message.clone()).classified(
                ErrorClassification::critical("The plan could not be saved for approval")
                    .with_metadata("technical_details", message)
                    .with_metadata("suggestions", "check that file_paths.agent_data_dir is writable"),
            )
        })?;
        let plan_value = serde_json::to_value(&plan).map_err(|error| {
            CapabilityError::from_error(error).classified(ErrorClassification::critical("The plan could not be serialized for approval"))
        })?;
        // The plan files are on the agent's machine: only a terminal user there can edit them
        // (API and web clients send an edited plan with their answer instead).
        let remote = state
            .session_state
            .get(peregrine_core::state::session_keys::INTERFACE)
            .and_then(Value::as_str)
            .is_some_and(|interface| matches!(interface, "api" | "openwebui"));
        let mut body = format!("**Execution plan** ({} steps):\n\n{}", plan.steps.len(), prompt::numbered_steps(&plan));
        if !remote {
            body.push_str(&format!(
                "\n\n_The plan is saved at `{}`. To change it before approving, write the edited plan to `{}`._",
                path.display(),
                pending.modified_path().display(),
            ));
        }
        let payload = serde_json::json!({
            "approval_type": PLAN_APPROVAL_TYPE,
            "execution_plan": plan_value,
            "plan_file_path": path.display().to_string(),
            "pending_plans_dir": pending.dir().display().to_string(),
        });
        Ok(CapabilityOutcome::NeedsApproval(ApprovalRequest {
            approval_type: PLAN_APPROVAL_TYPE.into(),
            user_message: approval_message("Execution plan approval", Some(task), &body),
            payload,
        }))
    }

    /// The approved plan: an edit sent with the approval, else the plan that was shown;
    /// validated again (edits are untrusted input), with no LLM call. The node never reads the
    /// plan files itself: a file changed after the answer must not change what runs.
    fn use_approved_plan(
        &self,
        state: &AgentState,
        ctx: &NodeContext<AgentState>,
        answer: &ApprovalAnswer,
        pending: &PendingPlans,
    ) -> Result<CapabilityOutcome, CapabilityError> {
        let result = approved_plan(answer);
        clear_pending(pending);
        let (plan, source) = result?;
        let task = state.task.current_task.as_deref().unwrap_or_default();
        let plan = self.validate(plan, task, state).map_err(|error| {
            let classification = match source {
                ApprovedSource::Payload => error.classification(),
                ApprovedSource::Edit => invalid_edit(source, &error.to_string()),
            };
            CapabilityError::from_error(error).classified(classification)
        })?;
        tracing::info!(thread = ctx.thread_id(), source = source.describe(), steps = plan.steps.len(), "using the approved plan");
        Ok(plan_created(ctx, plan))
    }
}

/// Picks the approved plan's source (edit or payload) and parses it.
fn approved_plan(answer: &ApprovalAnswer) -> Result<(ExecutionPlan, ApprovedSource), CapabilityError> {
    let unusable = |source: ApprovedSource, problem: String| {
        CapabilityError::new(format!("{} cannot be used: {problem}", source.describe())).classified(invalid_edit(source, &problem))
    };
    if let Some(edit) = &answer.edit {
        let plan = parse_plan(edit.clone()).map_err(|problem| unusable(ApprovedSource::Edit, problem))?;
        return Ok((plan, ApprovedSource::Edit));
    }
    let shown = answer.payload.get("execution_plan").cloned().unwrap_or(Value::Null);
    let plan = parse_plan(shown).map_err(|problem| unusable(ApprovedSource::Payload, problem))?;
    Ok((plan, ApprovedSource::Payload))
}

/// REPLANNING: an approved plan that cannot run is planned again with the problem in the prompt.
fn invalid_edit(source: ApprovedSource, problem: &str) -> ErrorClassification {
    ErrorClassification::replanning(format!("{} is not a valid execution plan", source.describe()))
        .with_metadata("technical_details", problem.to_owned())
        .with_metadata("replanning_reason", "the approved plan could not be used; create a new plan for the task")
}

fn clear_pending(pending: &PendingPlans) {
    for (path, error) in pending.clear() {
        tracing::warn!(path = %path.display(), %error, "could not remove a pending plan file");
    }
}

/// The update installing `plan`, announced as a `PlanCreated` event.
fn plan_created(ctx: &NodeContext<AgentState>, plan: ExecutionPlan) -> CapabilityOutcome {
    ctx.emit(AgentEvent::new(ORCHESTRATOR, EventKind::PlanCreated { steps: plan.steps.clone() }));
    CapabilityOutcome::Done(AgentStateUpdate {
        execution_plan: Slot::Set(Some(plan)),
        current_step_index: Some(0),
        ..AgentStateUpdate::default()
    })
}

impl InfrastructureNode for Orchestrator {
    fn name(&self) -> &str {
        ORCHESTRATOR
    }

    fn description(&self) -> &str {
        "Execution Planning"
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::orchestrator()
    }

    async fn execute(&self, state: &AgentState, ctx: &NodeContext<AgentState>) -> Result<CapabilityOutcome, CapabilityError> {
        ctx.emit(AgentEvent::new(
            ORCHESTRATOR,
            EventKind::PhaseStart { phase: Phase::Planning, description: "Creating execution plan".into() },
        ));
        let started = Instant::now();
        let result = self.run(state, ctx).await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        ctx.emit(AgentEvent::new(ORCHESTRATOR, EventKind::PhaseComplete { phase: Phase::Planning, duration_ms, success: result.is_ok() }));
        result
    }
}

#[cfg(test)]
mod tests;

//! The agent: a registry of capabilities plus the framework's nodes, assembled into one durable
//! graph behind the gateway. [`Agent::send`] is what every interface calls with user text: it
//! runs a turn, answers a pending approval, or changes state without a run, and reports what
//! happened ([`TurnResult`]).

use std::sync::Arc;

use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::{AgentEvent, AgentState, CapabilitySpec, EventSink, Registry, Role};
use peregrine_graph::{DynCheckpointer, Graph, PendingInterrupt, Resume, RunError, RunEvent, RunOptions, RunOutcome};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::assembly::{AgentGraphBuilder, AssemblyError};
use crate::catalog::Catalog;
use crate::clarify::{ClarificationPrompts, ClarifyCapability};
use crate::datasource::DataSource;
use crate::gateway::{Gateway, GatewayAction, GatewayError, Session};
use crate::infra::classifier::{Classifier, ClassifierPrompts};
use crate::infra::error_node::{ErrorAnalysisPrompts, ErrorNode};
use crate::infra::orchestrator::pending::PendingPlans;
use crate::infra::orchestrator::{Orchestrator, OrchestratorPrompts, PLAN_APPROVAL_TYPE};
use crate::infra::task_extraction::{TaskExtraction, TaskExtractionPrompts};
use crate::respond::{RespondCapability, ResponsePrompts};
use crate::router::ERROR;
use crate::services::Services;

/// Prompt builders an application replaces (reference §1.10); `None` keeps the framework's.
#[derive(Clone, Default)]
pub struct PromptOverrides {
    /// Task extraction.
    pub task_extraction: Option<Arc<dyn TaskExtractionPrompts>>,
    /// Classifier.
    pub classifier: Option<Arc<dyn ClassifierPrompts>>,
    /// Orchestrator.
    pub orchestrator: Option<Arc<dyn OrchestratorPrompts>>,
    /// The error node's analysis.
    pub error_analysis: Option<Arc<dyn ErrorAnalysisPrompts>>,
    /// Respond.
    pub response: Option<Arc<dyn ResponsePrompts>>,
    /// Clarify.
    pub clarification: Option<Arc<dyn ClarificationPrompts>>,
}

/// Builds an [`Agent`].
pub struct AgentBuilder {
    registry: Registry,
    services: Services,
    checkpointer: Option<Arc<dyn DynCheckpointer>>,
    data_sources: Vec<Arc<dyn DataSource>>,
    prompts: PromptOverrides,
}

impl AgentBuilder {
    /// An agent of the application's capabilities; the framework adds `respond` and `clarify`
    /// unless the registry already has its own.
    pub fn new(registry: Registry, services: Services) -> Self {
        Self { registry, services, checkpointer: None, data_sources: Vec::new(), prompts: PromptOverrides::default() }
    }

    /// Persists every step with `checkpointer` (required: approvals and conversations live in
    /// it; `MemoryCheckpointer` keeps them in memory).
    pub fn checkpointer(mut self, checkpointer: Arc<dyn DynCheckpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Adds a data source for task extraction (user memory, …).
    pub fn data_source(mut self, source: Arc<dyn DataSource>) -> Self {
        self.data_sources.push(source);
        self
    }

    /// Replaces prompt builders.
    pub fn prompts(mut self, prompts: PromptOverrides) -> Self {
        self.prompts = prompts;
        self
    }

    /// Assembles the agent.
    pub fn build(self) -> Result<Agent, AssemblyError> {
        let Self { mut registry, services, checkpointer, data_sources, prompts } = self;
        let Some(checkpointer) = checkpointer else { return Err(AssemblyError::MissingCheckpointer) };
        let mut specs: Vec<CapabilitySpec> = registry.iter().map(|capability| capability.spec().clone()).collect();
        // The framework's respond and clarify, described as their prompt overrides describe them.
        let mut respond_spec = RespondCapability::default_spec();
        if let Some(prompts) = &prompts.response {
            respond_spec.orchestrator_guide = Some(prompts.orchestrator_guide());
        }
        let mut clarify_spec = ClarifyCapability::default_spec();
        if let Some(prompts) = &prompts.clarification {
            clarify_spec.orchestrator_guide = Some(prompts.orchestrator_guide());
        }
        for (name, spec) in [(RESPOND, respond_spec), (CLARIFY, clarify_spec)] {
            if !registry.contains(name) {
                specs.push(spec);
            }
        }
        let catalog = Arc::new(Catalog::new(specs));
        if !registry.contains(RESPOND) {
            let mut respond = RespondCapability::new(services.clone(), catalog.clone());
            if let Some(prompts) = prompts.response.clone() {
                respond = respond.with_prompts(prompts);
            }
            registry.register(respond).map_err(AssemblyError::Registry)?;
        }
        if !registry.contains(CLARIFY) {
            let mut clarify = ClarifyCapability::new(services.clone(), catalog.clone());
            if let Some(prompts) = prompts.clarification.clone() {
                clarify = clarify.with_prompts(prompts);
            }
            registry.register(clarify).map_err(AssemblyError::Registry)?;
        }
        let mut task_extraction = TaskExtraction::new(services.clone()).with_data_sources(data_sources);
        if let Some(prompts) = prompts.task_extraction {
            task_extraction = task_extraction.with_prompts(prompts);
        }
        let mut classifier = Classifier::new(services.clone(), catalog.clone());
        if let Some(prompts) = prompts.classifier {
            classifier = classifier.with_prompts(prompts);
        }
        let mut orchestrator = Orchestrator::new(services.clone(), catalog.clone());
        if let Some(prompts) = prompts.orchestrator {
            orchestrator = orchestrator.with_prompts(prompts);
        }
        let mut error_node = ErrorNode::new(services.clone(), catalog.clone());
        if let Some(prompts) = prompts.error_analysis {
            error_node = error_node.with_prompts(prompts);
        }
        let graph = AgentGraphBuilder::new(registry, services.settings.limits)
            .infrastructure(task_extraction)
            .infrastructure(classifier)
            .infrastructure(orchestrator)
            .infrastructure(error_node)
            .checkpointer(checkpointer)
            .build()?;
        let graph = Arc::new(graph);
        let gateway = Gateway::new(services.clone(), catalog.clone());
        Ok(Agent { graph, gateway, services, catalog })
    }
}

/// Where a turn's events go, and how to stop it.
#[derive(Debug, Clone, Default)]
pub struct TurnOptions {
    /// The run's engine and domain events (node started/finished, LLM tokens, …).
    pub events: Option<UnboundedSender<RunEvent<AgentEvent>>>,
    /// Cancels the turn; the last checkpoint stays, and [`Agent::continue_turn`] finishes it.
    pub cancel: CancellationToken,
}

impl TurnOptions {
    fn run_options(&self) -> RunOptions<AgentEvent> {
        RunOptions { events: self.events.clone(), cancel: self.cancel.clone(), limits: None }
    }
}

/// How a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnStatus {
    /// The turn ended with an answer (respond, clarify or a direct-chat capability).
    Completed,
    /// The turn ended with the error node's report.
    Failed,
    /// The turn waits for an approval; the next message answers it.
    Interrupted,
    /// The turn was cancelled; continue it with [`Agent::continue_turn`].
    Cancelled,
    /// State changed without a run (`/chat:<name>`, `/exit` in direct chat).
    Updated,
    /// Text for the person; nothing changed (`/help`, `/chat`).
    Reply,
    /// A command for the interface itself (`/clear`, `/config`, `/status`).
    InterfaceCommand,
    /// The person asked to leave the interface.
    Exit,
}

/// What happened to a message.
#[derive(Debug, Clone)]
pub struct TurnResult {
    /// How it ended.
    pub status: TurnStatus,
    /// The text to show: the answer, the error report, the approval prompt, a notice or a reply.
    pub response: Option<String>,
    /// The pending approval, for `Interrupted`.
    pub interrupt: Option<PendingInterrupt>,
    /// The interface command, for `InterfaceCommand`.
    pub command: Option<crate::commands::SlashCommand>,
    /// The thread's state afterwards (absent for replies and exits).
    pub state: Option<Arc<AgentState>>,
}

impl TurnResult {
    fn text(status: TurnStatus, text: impl Into<String>) -> Self {
        Self { status, response: Some(text.into()), interrupt: None, command: None, state: None }
    }
}

/// A message the agent could not act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The gateway refused the message (bad command, empty message, …); nothing changed.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The engine refused or stopped the run (a FATAL error, a limit, storage, a busy thread).
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Forwards gateway LLM events into a turn's event stream.
struct StreamSink<'a>(&'a UnboundedSender<RunEvent<AgentEvent>>);

impl EventSink for StreamSink<'_> {
    fn emit(&self, event: AgentEvent) {
        // Nobody listening any more is not an error for the turn.
        let _ = self.0.send(RunEvent::Custom(event));
    }
}

/// An assembled agent.
pub struct Agent {
    graph: Arc<Graph<AgentState>>,
    gateway: Gateway,
    services: Services,
    catalog: Arc<Catalog>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("capabilities", &self.catalog.names().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts building an agent.
    pub fn builder(registry: Registry, services: Services) -> AgentBuilder {
        AgentBuilder::new(registry, services)
    }

    /// The graph (state, history, threads, time travel).
    pub fn graph(&self) -> &Arc<Graph<AgentState>> {
        &self.graph
    }

    /// The gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// The shared services.
    pub fn services(&self) -> &Services {
        &self.services
    }

    /// The registered capabilities.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Handles one message of `thread_id`: a turn, an approval answer, or a state change.
    pub async fn send(&self, thread_id: &str, text: &str, session: &Session, options: TurnOptions) -> Result<TurnResult, AgentError> {
        self.handle(thread_id, text, session, options, true).await
    }

    /// Handles one message of `thread_id` that is never an approval answer: on a thread waiting
    /// for one it is refused ([`RunError::PendingInterrupt`]), and the question stays pending.
    /// For interfaces that answer approvals with [`Agent::answer_approval`] or
    /// [`Agent::answer_approval_text`], naming the question.
    pub async fn send_message(
        &self,
        thread_id: &str,
        text: &str,
        session: &Session,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        self.handle(thread_id, text, session, options, false).await
    }

    async fn handle(
        &self,
        thread_id: &str,
        text: &str,
        session: &Session,
        options: TurnOptions,
        answers_approvals: bool,
    ) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        let state = snapshot.as_ref().map(|snapshot| snapshot.state.clone());
        let pending = snapshot.as_ref().and_then(|snapshot| snapshot.meta.interrupt.clone());
        if !answers_approvals && let Some(interrupt) = &pending {
            // Refused here too; the engine refuses a run over a question asked meanwhile.
            return Err(RunError::PendingInterrupt {
                thread_id: thread_id.into(),
                interrupt_id: interrupt.id.clone(),
                node: interrupt.node.clone(),
            }
            .into());
        }
        let sink = options.events.as_ref().map(StreamSink);
        let events = sink.as_ref().map(|sink| sink as &dyn EventSink);
        // Cancelled before anything was written (an approval answer can take an LLM call): the
        // thread stays as it was — a Ctrl-C must never become an answer.
        let action = tokio::select! {
            biased;
            () = options.cancel.cancelled() => return Ok(Self::cancelled_unchanged(state)),
            action = self.gateway.process(state.as_deref(), pending.as_ref(), text, session, events) => action?,
        };
        if options.cancel.is_cancelled() && matches!(action, GatewayAction::Run(_) | GatewayAction::Resume { .. }) {
            return Ok(Self::cancelled_unchanged(state));
        }
        let before = state.as_ref().map_or(0, |state| state.messages.len());
        self.act(thread_id, action, pending.as_ref(), state, before, &options).await
    }

    /// Answers `interrupt`, the question the person was shown, with their words (yes/no
    /// keywords, else one LLM call that reads them), for interfaces that know which question a
    /// typed answer is for. A question no longer pending is refused
    /// ([`RunError::StaleResume`]), so words never answer a question the person did not see.
    pub async fn answer_approval_text(
        &self,
        thread_id: &str,
        interrupt: &PendingInterrupt,
        text: &str,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        let state = snapshot.as_ref().map(|snapshot| snapshot.state.clone());
        let sink = options.events.as_ref().map(StreamSink);
        let events = sink.as_ref().map(|sink| sink as &dyn EventSink);
        let action = tokio::select! {
            biased;
            () = options.cancel.cancelled() => return Ok(Self::cancelled_unchanged(state)),
            action = self.gateway.answer(interrupt, text, events) => action?,
        };
        if options.cancel.is_cancelled() {
            return Ok(Self::cancelled_unchanged(state));
        }
        let before = state.as_ref().map_or(0, |state| state.messages.len());
        self.act(thread_id, action, Some(interrupt), state, before, &options).await
    }

    /// Carries out what the gateway decided.
    async fn act(
        &self,
        thread_id: &str,
        action: GatewayAction,
        pending: Option<&PendingInterrupt>,
        state: Option<Arc<AgentState>>,
        before: usize,
        options: &TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        match action {
            GatewayAction::Run(update) => {
                let outcome = self.graph.run(thread_id, update, options.run_options()).await?;
                Ok(Self::result(outcome, before))
            }
            GatewayAction::Resume { mut resume, .. } => {
                if let Some(interrupt) = pending {
                    self.attach_plan_edit(thread_id, interrupt, &mut resume.answer);
                }
                let outcome = self.graph.resume(thread_id, resume, options.run_options()).await?;
                Ok(Self::result(outcome, before))
            }
            GatewayAction::StateOnly { update, notice } => {
                let snapshot = self.graph.update_state(thread_id, update, None).await?;
                Ok(TurnResult { state: Some(snapshot.state), ..TurnResult::text(TurnStatus::Updated, notice) })
            }
            GatewayAction::Reply(text) => Ok(TurnResult::text(TurnStatus::Reply, text)),
            GatewayAction::Interface(command) => {
                Ok(TurnResult { status: TurnStatus::InterfaceCommand, response: None, interrupt: None, command: Some(command), state })
            }
            GatewayAction::Exit => Ok(TurnResult { status: TurnStatus::Exit, response: None, interrupt: None, command: None, state }),
        }
    }

    /// A turn cancelled before it changed anything.
    fn cancelled_unchanged(state: Option<Arc<AgentState>>) -> TurnResult {
        TurnResult { status: TurnStatus::Cancelled, response: None, interrupt: None, command: None, state }
    }

    /// Answers the pending approval of `thread_id` directly (for APIs with approve / reject
    /// buttons); `edit` is an edited payload approved instead of the shown one (an edited plan).
    pub async fn answer_approval(
        &self,
        thread_id: &str,
        interrupt: &PendingInterrupt,
        approved: bool,
        edit: Option<Value>,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        // Cancelled before the answer was recorded: it never counts.
        if options.cancel.is_cancelled() {
            return Ok(Self::cancelled_unchanged(snapshot.map(|snapshot| snapshot.state)));
        }
        let before = snapshot.map_or(0, |snapshot| snapshot.state.messages.len());
        let mut answer = serde_json::json!({ "approved": approved });
        if let (true, Some(edit)) = (approved, edit) {
            answer["edit"] = edit;
        }
        self.attach_plan_edit(thread_id, interrupt, &mut answer);
        let outcome = self.graph.resume(thread_id, Resume::to(interrupt, answer), options.run_options()).await?;
        Ok(Self::result(outcome, before))
    }

    /// Finishes a turn that was cut off (crash, kill, cancel) from its last checkpoint, without
    /// repeating finished steps.
    pub async fn continue_turn(&self, thread_id: &str, options: TurnOptions) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        if options.cancel.is_cancelled() {
            return Ok(Self::cancelled_unchanged(snapshot.map(|snapshot| snapshot.state)));
        }
        let before = snapshot.map_or(0, |snapshot| snapshot.state.messages.len());
        let outcome = self.graph.continue_run(thread_id, options.run_options()).await?;
        Ok(Self::result(outcome, before))
    }

    /// A plan approval takes a plan editor's `modified_execution_plan.json` as the approved
    /// edit, read when the answer is given and stored with it: a crash and redelivery run the
    /// same plan, and a file changed later changes nothing. An unreadable file becomes an edit
    /// the orchestrator refuses (re-plans), never a silent fallback to the original plan.
    fn attach_plan_edit(&self, thread_id: &str, interrupt: &PendingInterrupt, answer: &mut Value) {
        let approved = answer.get("approved").and_then(Value::as_bool) == Some(true);
        let is_plan = interrupt.payload.get("approval_type").and_then(Value::as_str) == Some(PLAN_APPROVAL_TYPE);
        if !approved || !is_plan || answer.get("edit").is_some() {
            return;
        }
        match PendingPlans::for_thread(&self.services.settings.agent_data_dir, thread_id).load_modified_value() {
            Ok(Some(edit)) => answer["edit"] = edit,
            Ok(None) => {}
            Err(problem) => answer["edit"] = Value::String(problem),
        }
    }

    fn result(outcome: RunOutcome<AgentState>, messages_before: usize) -> TurnResult {
        match outcome {
            RunOutcome::Completed { state, .. } => {
                let failed = state.execution.last_result.as_ref().is_some_and(|last| last.capability == ERROR);
                let response = state
                    .messages
                    .iter()
                    .skip(messages_before)
                    .rev()
                    .find(|message| message.role == Role::Assistant)
                    .map(|message| message.content.clone());
                let status = if failed { TurnStatus::Failed } else { TurnStatus::Completed };
                TurnResult { status, response, interrupt: None, command: None, state: Some(state) }
            }
            RunOutcome::Interrupted { state, interrupt, .. } => {
                let prompt = interrupt.payload.get("user_message").and_then(Value::as_str).map(str::to_owned);
                TurnResult {
                    status: TurnStatus::Interrupted,
                    response: prompt,
                    interrupt: Some(interrupt),
                    command: None,
                    state: Some(state),
                }
            }
            RunOutcome::Cancelled { state, .. } => {
                TurnResult { status: TurnStatus::Cancelled, response: None, interrupt: None, command: None, state: Some(state) }
            }
        }
    }
}

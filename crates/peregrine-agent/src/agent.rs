//! The agent: a registry of capabilities plus the framework's nodes, assembled into one durable
//! graph behind the gateway. [`Agent::send`] is what every interface calls with user text: it
//! runs a turn, answers a pending approval, or changes state without a run, and reports what
//! happened ([`TurnResult`]).

use std::sync::Arc;

use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::{AgentEvent, AgentState, CapabilitySpec, EventSink, Registry, Role};
use peregrine_graph::{CheckpointError, DynCheckpointer, Graph, PendingInterrupt, Resume, RunError, RunEvent, RunOptions, RunOutcome};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::assembly::{AgentGraphBuilder, AssemblyError};
use crate::catalog::Catalog;
use crate::clarify::{ClarificationPrompts, ClarifyCapability};
use crate::datasource::DataSource;
use crate::gateway::{ApprovalMethod, Gateway, GatewayAction, GatewayError, Session};
use crate::infra::classifier::{Classifier, ClassifierPrompts};
use crate::infra::error_node::{ErrorAnalysisPrompts, ErrorNode};
use crate::infra::orchestrator::pending::PendingPlans;
use crate::infra::orchestrator::{Orchestrator, OrchestratorPrompts, PLAN_APPROVAL_TYPE};
use crate::infra::task_extraction::{TaskExtraction, TaskExtractionPrompts};
use crate::respond::{RespondCapability, ResponsePrompts};
use crate::router::ERROR;
use crate::services::Services;
use crate::threads::ThreadStatus;

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
    /// The pending approval was withdrawn unanswered (`no`, `cancel`, an API's abandon): its
    /// action did not run, the withdrawal is recorded in the history and the thread is idle.
    Abandoned,
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

impl TurnStatus {
    /// The status's name in every interface's JSON: `completed`, `failed`, `interrupted`,
    /// `abandoned`, `cancelled`, `updated`, `reply`, `interface_command` or `exit`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::Abandoned => "abandoned",
            Self::Cancelled => "cancelled",
            Self::Updated => "updated",
            Self::Reply => "reply",
            Self::InterfaceCommand => "interface_command",
            Self::Exit => "exit",
        }
    }
}

/// How a pending approval was answered by a message or an API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalOutcome {
    /// Approved: the action ran (or runs, when the turn was cut off).
    Approved,
    /// Rejected: the node that asked decides what follows (a plan is made again, a save is
    /// reported as not done).
    Rejected,
    /// Withdrawn unanswered: nothing ran and the thread is idle.
    Abandoned,
}

impl ApprovalOutcome {
    /// `approved`, `rejected` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Abandoned => "abandoned",
        }
    }
}

/// The pending approval a message or an API call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsweredApproval {
    /// The interrupt answered.
    pub interrupt_id: String,
    /// How.
    pub outcome: ApprovalOutcome,
    /// How the answer was read from words (keywords, the LLM); `None` for an explicit answer
    /// (an API's approve/reject/abandon).
    pub method: Option<ApprovalMethod>,
}

/// An answer to a pending approval, given through [`Agent::answer_approval`].
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalReply {
    /// Approve what was shown; `edit` is an edited payload approved instead (an edited plan).
    Approve {
        /// The edited payload.
        edit: Option<Value>,
    },
    /// Reject it: the node that asked decides what follows (a plan is made again).
    Reject,
    /// Withdraw it unanswered: nothing runs and the thread returns to idle.
    Abandon,
    /// The person's words, read as the gateway reads a chat answer: `yes`-like keywords
    /// approve, `no`/`cancel`-like keywords abandon, other words are read by one LLM call
    /// (a rejection carries them to the node, so "no, use Oslo" plans again).
    Words(String),
}

/// The pending approval an answer is for: its id, and the digest of what was shown when the
/// interface knows it. An answer to any other question is refused ([`RunError::StaleResume`],
/// [`RunError::ForgedResume`]), so it never reaches a question the person did not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRef {
    /// The interrupt's id.
    pub interrupt_id: String,
    /// The digest of its payload (`PendingInterrupt::digest`).
    pub digest: Option<String>,
}

impl ApprovalRef {
    /// The reference to `interrupt` (id and digest).
    pub fn to(interrupt: &PendingInterrupt) -> Self {
        Self { interrupt_id: interrupt.id.clone(), digest: Some(interrupt.digest.clone()) }
    }

    /// A reference by id alone.
    pub fn id(interrupt_id: impl Into<String>) -> Self {
        Self { interrupt_id: interrupt_id.into(), digest: None }
    }
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
    /// The pending approval this message answered, and how.
    pub approval: Option<AnsweredApproval>,
    /// The thread held a run that was cut off, which this message's new turn left unfinished.
    pub left_cut_off_run: bool,
}

impl TurnResult {
    /// A result of `status` showing `text`.
    pub fn text(status: TurnStatus, text: impl Into<String>) -> Self {
        Self { status, response: Some(text.into()), interrupt: None, command: None, state: None, approval: None, left_cut_off_run: false }
    }

    /// A result of `status` without text.
    fn bare(status: TurnStatus, state: Option<Arc<AgentState>>) -> Self {
        Self { status, response: None, interrupt: None, command: None, state, approval: None, left_cut_off_run: false }
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
    /// [`Agent::continue_turn`] on a thread with no cut-off run; nothing changed.
    #[error("{0}")]
    NothingToContinue(NothingToContinue),
}

/// Why a thread has no cut-off run to continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NothingToContinue {
    /// No such thread.
    #[error("the thread does not exist, so there is no run to continue; send a message instead")]
    NoThread,
    /// It waits for an approval: the answer continues it.
    #[error("the thread waits for an approval, not a continuation; answer it (yes, no, or what to change)")]
    ApprovalPending,
    /// Its last run finished.
    #[error("the thread's last run finished, so there is nothing to continue; send a new message instead")]
    Finished,
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

    /// Handles one message of `thread_id`: a turn, an approval answer, or a state change. With
    /// an approval pending the message answers it (yes approves, no/cancel withdraws it, other
    /// words are read by the LLM): for the terminal, where the pending question is the one on
    /// the screen.
    pub async fn send(&self, thread_id: &str, text: &str, session: &Session, options: TurnOptions) -> Result<TurnResult, AgentError> {
        self.handle(thread_id, text, session, options, Pending::Answer).await
    }

    /// Handles one message of `thread_id` that is never an approval answer: on a thread waiting
    /// for one it is refused ([`RunError::PendingInterrupt`]), and the question stays pending.
    /// For interfaces that answer approvals with [`Agent::answer_approval`], naming the question.
    pub async fn send_message(
        &self,
        thread_id: &str,
        text: &str,
        session: &Session,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        self.handle(thread_id, text, session, options, Pending::Refuse).await
    }

    /// Handles one message written after the person saw `shown` (the conversation's last answer
    /// as their client shows it): it answers a pending approval only when `shown` holds that
    /// approval's question. Otherwise nothing changes and the result (status `Interrupted`)
    /// shows the question with a note that the message was not taken as its answer, so a `yes`
    /// never approves a question asked elsewhere (another process, another client).
    pub async fn send_after(
        &self,
        thread_id: &str,
        text: &str,
        shown: Option<&str>,
        session: &Session,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        self.handle(thread_id, text, session, options, Pending::AnswerIfShown(shown.unwrap_or_default())).await
    }

    async fn handle(
        &self,
        thread_id: &str,
        text: &str,
        session: &Session,
        options: TurnOptions,
        policy: Pending<'_>,
    ) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        let state = snapshot.as_ref().map(|snapshot| snapshot.state.clone());
        let pending = snapshot.as_ref().and_then(|snapshot| snapshot.meta.interrupt.clone());
        if let Some(interrupt) = &pending {
            match policy {
                Pending::Answer => {}
                // Refused here too; the engine refuses a run over a question asked meanwhile.
                Pending::Refuse => {
                    return Err(RunError::PendingInterrupt {
                        thread_id: thread_id.into(),
                        interrupt_id: interrupt.id.clone(),
                        node: interrupt.node.clone(),
                    }
                    .into());
                }
                Pending::AnswerIfShown(shown) if !question_shown(interrupt, shown) => {
                    return Ok(Self::unshown(interrupt, state));
                }
                Pending::AnswerIfShown(_) => {}
            }
        }
        if let (None, Pending::AnswerIfShown(shown)) = (&pending, policy)
            && crate::gateway::keyword_answer(text).is_some()
            && let Some(late) = self.answered_elsewhere(thread_id, shown).await?
        {
            return Ok(late);
        }
        let sink = options.events.as_ref().map(StreamSink);
        let events = sink.as_ref().map(|sink| sink as &dyn EventSink);
        // Cancelled before anything was written (an approval answer can take an LLM call): the
        // thread stays as it was — a Ctrl-C must never become an answer.
        let action = tokio::select! {
            biased;
            () = options.cancel.cancelled() => return Ok(TurnResult::bare(TurnStatus::Cancelled, state)),
            action = self.gateway.process(state.as_deref(), pending.as_ref(), text, session, events) => action?,
        };
        if options.cancel.is_cancelled()
            && matches!(action, GatewayAction::Run(_) | GatewayAction::Resume { .. } | GatewayAction::Abandon { .. })
        {
            return Ok(TurnResult::bare(TurnStatus::Cancelled, state));
        }
        let before = state.as_ref().map_or(0, |state| state.messages.len());
        let leaves_cut_off = matches!(action, GatewayAction::Run(_)) && snapshot.as_ref().is_some_and(crate::threads::mid_run);
        // A plan editor's file is the terminal's way to edit a plan; an answer from a client
        // that showed the plan approves what it showed.
        let disk_edit = matches!(policy, Pending::Answer);
        let result = self.act(thread_id, action, pending.as_ref(), state, before, disk_edit, &options).await?;
        Ok(TurnResult { left_cut_off_run: leaves_cut_off, ..result })
    }

    /// A yes/no written to a question that is no longer pending (answered or withdrawn in
    /// another window or process meanwhile): `shown` ends with one of the thread's recent
    /// questions. Said so, and nothing runs — a late "no" must not become a new turn while the
    /// action it meant to stop has run.
    async fn answered_elsewhere(&self, thread_id: &str, shown: &str) -> Result<Option<TurnResult>, RunError> {
        const RECENT: usize = 64;
        let recent = self.graph.history(thread_id, peregrine_graph::ListQuery { before: None, limit: Some(RECENT) }).await?;
        let asked = recent.iter().filter_map(|meta| meta.interrupt.as_ref()).any(|interrupt| question_shown(interrupt, shown));
        Ok(asked.then(|| {
            TurnResult::text(
                TurnStatus::Reply,
                "The approval you answered is no longer pending: it was answered or withdrawn elsewhere (another window or \
                 process) in the meantime, so your answer changed nothing. The conversation shows what happened; say what you \
                 want to do next.",
            )
        }))
    }

    /// The answer to a message that would have answered a question its client never showed.
    fn unshown(interrupt: &PendingInterrupt, state: Option<Arc<AgentState>>) -> TurnResult {
        let question = approval_prompt(interrupt).unwrap_or("(the approval has no text to show; answer it through the API)");
        let note = format!(
            "This conversation waits for an approval that was not shown here, so your message was not taken as its answer and \
             nothing changed. The approval:\n\n{question}"
        );
        TurnResult { interrupt: Some(interrupt.clone()), state, ..TurnResult::text(TurnStatus::Interrupted, note) }
    }

    /// Answers the pending approval of `thread_id` named by `approval` (the question the person
    /// was shown): approve (with an edited payload), reject, withdraw, or their words. Refused
    /// when that question is no longer pending ([`RunError::StaleResume`]), when its digest
    /// differs ([`RunError::ForgedResume`]), when none is ([`RunError::NothingToResume`]) and
    /// while an earlier answer waits for its node ([`RunError::PendingResume`]).
    pub async fn answer_approval(
        &self,
        thread_id: &str,
        approval: &ApprovalRef,
        reply: ApprovalReply,
        options: TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        let snapshot = self.graph.get_state(thread_id).await?;
        let Some(snapshot) = snapshot else { return Err(RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: None }.into()) };
        if let Some(resume) = &snapshot.meta.resume {
            return Err(RunError::PendingResume { thread_id: thread_id.into(), node: resume.node.clone() }.into());
        }
        let Some(interrupt) = snapshot.meta.interrupt.clone() else {
            return Err(RunError::NothingToResume { thread_id: thread_id.into() }.into());
        };
        if approval.interrupt_id != interrupt.id {
            return Err(
                RunError::StaleResume { thread_id: thread_id.into(), given: approval.interrupt_id.clone(), pending: interrupt.id }.into()
            );
        }
        if approval.digest.as_ref().is_some_and(|digest| *digest != interrupt.digest) {
            return Err(RunError::ForgedResume { thread_id: thread_id.into(), interrupt_id: interrupt.id }.into());
        }
        let state = Some(snapshot.state.clone());
        let before = snapshot.state.messages.len();
        let action = match reply {
            ApprovalReply::Approve { edit } => {
                let mut answer = serde_json::json!({ "approved": true });
                if let Some(edit) = edit {
                    answer["edit"] = edit;
                }
                GatewayAction::Resume { resume: Resume::to(&interrupt, answer), approved: true, method: None }
            }
            ApprovalReply::Reject => GatewayAction::Resume {
                resume: Resume::to(&interrupt, serde_json::json!({ "approved": false })),
                approved: false,
                method: None,
            },
            ApprovalReply::Abandon => GatewayAction::Abandon { resume: crate::gateway::abandonment(&interrupt, None), method: None },
            ApprovalReply::Words(text) => {
                let sink = options.events.as_ref().map(StreamSink);
                let events = sink.as_ref().map(|sink| sink as &dyn EventSink);
                tokio::select! {
                    biased;
                    () = options.cancel.cancelled() => return Ok(TurnResult::bare(TurnStatus::Cancelled, state)),
                    action = self.gateway.answer(&interrupt, &text, events) => action?,
                }
            }
        };
        // Cancelled before the answer was recorded: it never counts.
        if options.cancel.is_cancelled() {
            return Ok(TurnResult::bare(TurnStatus::Cancelled, state));
        }
        self.act(thread_id, action, Some(&interrupt), state, before, false, &options).await
    }

    /// Carries out what the gateway decided; `disk_edit`: an approved plan takes a plan
    /// editor's file (the terminal).
    #[allow(clippy::too_many_arguments, reason = "the turn's parts, each used once")]
    async fn act(
        &self,
        thread_id: &str,
        action: GatewayAction,
        pending: Option<&PendingInterrupt>,
        state: Option<Arc<AgentState>>,
        before: usize,
        disk_edit: bool,
        options: &TurnOptions,
    ) -> Result<TurnResult, AgentError> {
        match action {
            GatewayAction::Run(update) => {
                let outcome = self.graph.run(thread_id, update, options.run_options()).await?;
                Ok(Self::result(outcome, before))
            }
            GatewayAction::Resume { mut resume, approved, method } => {
                if let Some(interrupt) = pending.filter(|_| disk_edit) {
                    self.attach_plan_edit(thread_id, interrupt, &mut resume.answer);
                }
                let outcome = if approved { ApprovalOutcome::Approved } else { ApprovalOutcome::Rejected };
                let answered = AnsweredApproval { interrupt_id: resume.interrupt_id.clone(), outcome, method };
                let run = self.graph.resume(thread_id, resume, options.run_options()).await?;
                Ok(TurnResult { approval: Some(answered), ..Self::result(run, before) })
            }
            GatewayAction::Abandon { resume, method } => {
                let answered = AnsweredApproval { interrupt_id: resume.interrupt_id.clone(), outcome: ApprovalOutcome::Abandoned, method };
                let snapshot = self.graph.abandon(thread_id, resume).await?;
                if pending
                    .is_some_and(|interrupt| interrupt.payload.get("approval_type").and_then(Value::as_str) == Some(PLAN_APPROVAL_TYPE))
                {
                    // The plan that waited is not run: no editor may approve it later.
                    for (path, error) in PendingPlans::for_thread(&self.services.settings.agent_data_dir, thread_id).clear() {
                        tracing::warn!(path = %path.display(), %error, "could not remove a pending plan file");
                    }
                }
                tracing::info!(thread = thread_id, interrupt = %answered.interrupt_id, "pending approval withdrawn");
                let response =
                    snapshot.state.messages.last().filter(|message| message.role == Role::Assistant).map(|message| message.content.clone());
                Ok(TurnResult { response, approval: Some(answered), ..TurnResult::bare(TurnStatus::Abandoned, Some(snapshot.state)) })
            }
            GatewayAction::StateOnly { update, notice } => {
                let snapshot = self.graph.update_state(thread_id, update, None).await?;
                Ok(TurnResult { state: Some(snapshot.state), ..TurnResult::text(TurnStatus::Updated, notice) })
            }
            GatewayAction::Reply(text) => Ok(TurnResult::text(TurnStatus::Reply, text)),
            GatewayAction::Interface(command) => {
                Ok(TurnResult { command: Some(command), ..TurnResult::bare(TurnStatus::InterfaceCommand, state) })
            }
            GatewayAction::Exit => Ok(TurnResult::bare(TurnStatus::Exit, state)),
        }
    }

    /// Finishes a turn that was cut off (crash, kill, cancel) from its last checkpoint, without
    /// repeating finished steps; an approved action cut off is handed its answer again (its
    /// node checks whether it already ran). Refused when there is nothing to finish
    /// ([`AgentError::NothingToContinue`]) and while another process runs the thread
    /// ([`peregrine_graph::CheckpointError::ThreadBusy`]).
    pub async fn continue_turn(&self, thread_id: &str, options: TurnOptions) -> Result<TurnResult, AgentError> {
        let Some(thread) = self.thread(thread_id).await? else { return Err(AgentError::NothingToContinue(NothingToContinue::NoThread)) };
        match thread.status {
            ThreadStatus::Unfinished => {}
            ThreadStatus::Busy => return Err(RunError::Checkpoint(CheckpointError::ThreadBusy { thread_id: thread_id.into() }).into()),
            ThreadStatus::Interrupted => return Err(AgentError::NothingToContinue(NothingToContinue::ApprovalPending)),
            ThreadStatus::Idle | ThreadStatus::Failed => return Err(AgentError::NothingToContinue(NothingToContinue::Finished)),
        }
        if options.cancel.is_cancelled() {
            return Ok(TurnResult::bare(TurnStatus::Cancelled, Some(thread.snapshot.state)));
        }
        let before = thread.snapshot.state.messages.len();
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
                TurnResult { response, ..TurnResult::bare(status, Some(state)) }
            }
            RunOutcome::Interrupted { state, interrupt, .. } => {
                let prompt = approval_prompt(&interrupt).map(str::to_owned);
                TurnResult { response: prompt, interrupt: Some(interrupt), ..TurnResult::bare(TurnStatus::Interrupted, Some(state)) }
            }
            RunOutcome::Cancelled { state, .. } => TurnResult::bare(TurnStatus::Cancelled, Some(state)),
        }
    }
}

/// What a message does with a pending approval.
#[derive(Debug, Clone, Copy)]
enum Pending<'a> {
    /// It is the answer (the terminal).
    Answer,
    /// It is refused.
    Refuse,
    /// It is the answer when this text, the conversation's last answer as shown, holds the
    /// approval's question.
    AnswerIfShown(&'a str),
}

/// The question an approval shows the person.
pub fn approval_prompt(interrupt: &PendingInterrupt) -> Option<&str> {
    interrupt.payload.get("user_message").and_then(Value::as_str).filter(|text| !text.trim().is_empty())
}

/// Whether `shown` ends with the question of `interrupt` (an approval prompt, and the note
/// that repeats one, end with the question), line endings and trailing spaces aside: clients
/// trim what they resend and may turn `\r\n` into `\n`.
fn question_shown(interrupt: &PendingInterrupt, shown: &str) -> bool {
    let Some(question) = approval_prompt(interrupt) else { return false };
    let lines = |text: &str| text.lines().map(str::trim_end).collect::<Vec<_>>().join("\n").trim().to_owned();
    let question = lines(question);
    !question.is_empty() && lines(shown).ends_with(&question)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(question: &str) -> PendingInterrupt {
        let payload = serde_json::json!({"approval_type": "orchestrator_plan", "user_message": question});
        PendingInterrupt { id: "i".into(), node: "orchestrator".into(), digest: peregrine_graph::payload_digest(&payload), payload }
    }

    #[test]
    fn a_question_counts_as_shown_only_at_the_end_of_what_was_shown() {
        let plan = asking("**HUMAN APPROVAL REQUIRED**\n\n1. current_weather  \n2. respond\n\nReply yes or no.");
        // As streamed, after progress lines and the mark; resent with CRLF and trimmed.
        assert!(question_shown(
            &plan,
            "\u{2060}mark\n\n> planning…\n**HUMAN APPROVAL REQUIRED**\n\n1. current_weather\n2. respond\n\nReply yes or no."
        ));
        assert!(question_shown(&plan, "**HUMAN APPROVAL REQUIRED**\r\n\r\n1. current_weather\r\n2. respond\r\n\r\nReply yes or no.\n\n"));
        // An answer that quotes the question and goes on, another question, a rewrapped one.
        assert!(!question_shown(&plan, "**HUMAN APPROVAL REQUIRED**\n\n1. current_weather\n2. respond\n\nReply yes or no. And then?"));
        assert!(!question_shown(&plan, "**HUMAN APPROVAL REQUIRED**\n\n1. current_weather\n2. memory\n\nReply yes or no."));
        assert!(!question_shown(&plan, "**HUMAN APPROVAL REQUIRED** 1. current_weather 2. respond Reply yes or no."));
        assert!(!question_shown(&plan, ""));
        // A question with no text is never shown.
        assert!(!question_shown(&asking("   "), "anything"));
        let no_text = PendingInterrupt { payload: serde_json::json!({"approval_type": "x"}), ..asking("") };
        assert!(!question_shown(&no_text, "anything"));
    }
}

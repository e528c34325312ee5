//! The gateway (reference §2.1): the one entry point every interface sends user text through.
//! With an approval pending, the text is the answer: `yes`-like keywords approve, `no`/`cancel`
//! -like keywords withdraw it (nothing runs, the thread is idle), other words are read by one
//! `ApprovalResponse` call on the `approval` role (a rejection carries the words to the node that
//! asked, so "no, use Oslo" plans again; unclear or failing counts as a rejection). Otherwise slash
//! commands are applied and a new turn starts with fresh per-turn state (history, context and
//! session kept), or the state changes without a run.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use peregrine_core::state::session_keys;
use peregrine_core::{AgentControl, AgentState, AgentStateUpdate, ApprovalMode, EventSink, Message, TurnStart};
use peregrine_graph::{PendingInterrupt, Resume};
use peregrine_llm::{CallOptions, ChatMessage, roles};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::catalog::Catalog;
use crate::commands::{self, Builtin, CommandError, SlashCommand};
use crate::services::Services;

/// Who is talking, from the interface: kept in the thread's session state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// The user (memory is per user).
    pub user_id: Option<String>,
    /// `cli`, `openwebui` or `api`.
    pub interface: Option<String>,
}

impl Session {
    /// A session of `user_id` in `interface`.
    pub fn new(user_id: impl Into<String>, interface: impl Into<String>) -> Self {
        Self { user_id: Some(user_id.into()), interface: Some(interface.into()) }
    }
}

/// How an approval answer was recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalMethod {
    /// A yes/no keyword; no LLM call.
    Keyword,
    /// One `ApprovalResponse` call.
    Llm,
    /// The call failed or no `approval` model is configured: counted as a rejection.
    Fallback,
}

impl ApprovalMethod {
    /// `keyword`, `llm` or `fallback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyword => "keyword",
            Self::Llm => "llm",
            Self::Fallback => "fallback",
        }
    }
}

/// An approval answer read from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDetection {
    /// Whether it approves.
    pub approved: bool,
    /// A `no`/`cancel` keyword: the approval is withdrawn rather than rejected.
    pub abandon: bool,
    /// How it was decided.
    pub method: ApprovalMethod,
}

/// What the interface should do with a message.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayAction {
    /// Start a turn with this input (`new_turn` set).
    Run(AgentStateUpdate),
    /// Withdraw the pending approval unanswered (`no`, `cancel`): the node that asked does not
    /// run again, `resume.update` records the withdrawal in the history, the thread is idle.
    Abandon {
        /// Bound to the interrupt's id and digest, with the history record as its update.
        resume: Resume<AgentStateUpdate>,
        /// How the answer was recognised (`None`: an explicit withdrawal, no words read).
        method: Option<ApprovalMethod>,
    },
    /// Answer the pending approval and continue the paused run.
    Resume {
        /// The answer, bound to the interrupt's id and digest.
        resume: Resume<AgentStateUpdate>,
        /// Whether it approves.
        approved: bool,
        /// How the answer was recognised (`None`: an explicit answer, no words read).
        method: Option<ApprovalMethod>,
    },
    /// Change the thread's state without running the graph.
    StateOnly {
        /// The change.
        update: AgentStateUpdate,
        /// What changed, for the person.
        notice: String,
    },
    /// Show this text; nothing changes (`/help`, the `/chat` list).
    Reply(String),
    /// A command the interface itself handles (`/clear`, `/config`, `/status`).
    Interface(SlashCommand),
    /// Leave the interface.
    Exit,
}

/// A message the gateway cannot act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// A malformed command or option.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// Nothing to do.
    #[error("the message is empty; type a question, or /help for the commands")]
    Empty,
    /// An empty message while an approval is pending.
    #[error("an approval is pending and the message is empty: answer yes or no (or say what to change)")]
    EmptyAnswer,
    /// `/chat:<name>` for a capability that cannot be talked to directly.
    #[error("'{name}' is not a capability you can chat with directly; available: {available}")]
    NotDirectChat {
        /// The name given.
        name: String,
        /// The direct-chat capabilities.
        available: String,
    },
    /// `/approval` asked for fewer approvals than the configuration requires.
    #[error(
        "/approval cannot lower approvals to {requested:?}: the configuration sets approval.global_mode to {configured:?} and does not allow chats to lower it (approval.allow_chat_override)"
    )]
    ApprovalOverride {
        /// What was asked for.
        requested: ApprovalMode,
        /// What the configuration sets.
        configured: ApprovalMode,
    },
    /// A command while an approval is pending.
    #[error("an approval is pending, so /{command} cannot run now: answer yes or no first (/help and /exit still work)")]
    ApprovalPending {
        /// The command.
        command: String,
    },
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ApprovalResponse {
    /// True for approval, false for rejection or when unclear.
    approved: bool,
}

const APPROVE: [&str; 6] = ["yes", "y", "ok", "okay", "yep", "yeah"];
/// Keywords that withdraw the pending approval (a change request needs other words).
const ABANDON: [&str; 7] = ["no", "n", "nope", "nah", "cancel", "abort", "stop"];

/// The yes/no keyword answer, after normalising case, whitespace and trailing punctuation:
/// `Some(true)` approves, `Some(false)` withdraws the approval.
pub fn keyword_answer(text: &str) -> Option<bool> {
    let normalised = text.trim().to_lowercase();
    let normalised = normalised.trim_end_matches(['.', '!', '?']).trim();
    if APPROVE.contains(&normalised) {
        Some(true)
    } else if ABANDON.contains(&normalised) {
        Some(false)
    } else {
        None
    }
}

/// Approval types a model never reads free words for: only the keywords approve them.
pub const KEYWORD_ONLY: &[&str] = &["channel_write"];

/// The withdrawal of `interrupt`, bound to its id and digest, with the history record as its
/// update: the person's words (when the withdrawal was typed) and the agent's note that the
/// action did not run.
pub(crate) fn abandonment(interrupt: &PendingInterrupt, text: Option<&str>) -> Resume<AgentStateUpdate> {
    let now = Utc::now();
    let note = match interrupt.payload.get("approval_type").and_then(Value::as_str) {
        Some(crate::infra::orchestrator::PLAN_APPROVAL_TYPE) => "Cancelled: the execution plan was not run. Ask again whenever you like.",
        _ => "Cancelled: the action that waited for approval was not carried out (steps that ran before it are not undone).",
    };
    let mut messages = Vec::with_capacity(2);
    if let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) {
        messages.push(Message::new(peregrine_core::Role::User, text, now));
    }
    messages.push(Message::new(peregrine_core::Role::Assistant, note, now));
    let update = AgentStateUpdate { messages, ..AgentStateUpdate::default() };
    Resume::to(interrupt, serde_json::json!({ "abandon": true })).with_update(update)
}

/// The gateway of one agent.
#[derive(Debug, Clone)]
pub struct Gateway {
    services: Services,
    catalog: Arc<Catalog>,
}

impl Gateway {
    /// A gateway over the agent's services and capability catalog.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog }
    }

    /// Reads an approval answer: keywords without an LLM, else one `ApprovalResponse` call;
    /// anything unclear or failing is a rejection.
    pub async fn detect_approval(&self, text: &str, events: Option<&dyn EventSink>) -> ApprovalDetection {
        if let Some(approved) = keyword_answer(text) {
            return ApprovalDetection { approved, abandon: !approved, method: ApprovalMethod::Keyword };
        }
        let prompt = format!(
            "Analyze this user message and determine if it indicates approval or rejection of a pending action.\n\n\
             User message: \"{}\"\n\n\
             Respond with true if the message clearly approves (e.g. go ahead, proceed, sounds good), \
             false if it rejects, cancels or asks for changes, or if it is unclear.",
            text.trim()
        );
        let options = CallOptions { events, component: Some("gateway") };
        match self.services.llm.structured::<ApprovalResponse>(roles::APPROVAL, vec![ChatMessage::user(prompt)], options).await {
            Ok(answer) => ApprovalDetection { approved: answer.approved, abandon: false, method: ApprovalMethod::Llm },
            Err(error) => {
                tracing::warn!(%error, "approval detection failed; the answer counts as a rejection");
                ApprovalDetection { approved: false, abandon: false, method: ApprovalMethod::Fallback }
            }
        }
    }

    /// Decides what `text` means for a thread whose current state is `state` (None for a new
    /// thread) and whose pending question, if any, is `pending`.
    pub async fn process(
        &self,
        state: Option<&AgentState>,
        pending: Option<&PendingInterrupt>,
        text: &str,
        session: &Session,
        events: Option<&dyn EventSink>,
    ) -> Result<GatewayAction, GatewayError> {
        if let Some(interrupt) = pending {
            return self.answer(interrupt, text, events).await;
        }
        let parsed = commands::parse_input(text)?;
        let mut control = self.services.settings.turn_defaults();
        let mut session_changes: BTreeMap<String, Value> = self.session_changes(state, session);
        let mut forwarded: BTreeMap<String, Value> = BTreeMap::new();
        let mut notices: Vec<String> = Vec::new();
        let mut system_messages: Vec<Message> = Vec::new();
        let direct_chat = state.and_then(AgentState::direct_chat_capability).map(str::to_owned);
        for command in &parsed.commands {
            match commands::builtin(&command.name) {
                Some(Builtin::Help) => return Ok(GatewayAction::Reply(commands::help_text(command.value.as_deref()))),
                Some(Builtin::Interface) => return Ok(GatewayAction::Interface(command.clone())),
                Some(Builtin::Exit) => match &direct_chat {
                    Some(capability) => {
                        session_changes.insert(session_keys::DIRECT_CHAT_CAPABILITY.into(), Value::Null);
                        session_changes.insert(session_keys::LAST_DIRECT_CHAT_RESULT.into(), Value::Null);
                        system_messages.push(Message::system(format!("[End of direct chat session with '{capability}']")));
                        notices.push(format!("Left the direct chat with '{capability}'."));
                    }
                    None => return Ok(GatewayAction::Exit),
                },
                Some(Builtin::Chat) => match &command.value {
                    None => return Ok(GatewayAction::Reply(self.direct_chat_list())),
                    Some(name) => {
                        let name = self.direct_chat_target(name)?;
                        session_changes.insert(session_keys::DIRECT_CHAT_CAPABILITY.into(), Value::String(name.clone()));
                        notices.push(format!("Direct chat with '{name}': your messages go straight to it; /exit ends it."));
                    }
                },
                Some(Builtin::Planning) => control.planning_mode_enabled = commands::switch_value(command)?,
                Some(Builtin::Approval) => control.approval_mode = self.approval_mode(command)?,
                Some(Builtin::Task) => control.task_extraction_bypass_enabled = !commands::switch_value(command)?,
                Some(Builtin::Caps) => control.capability_selection_bypass_enabled = !commands::switch_value(command)?,
                None => {
                    forwarded.insert(command.name.clone(), command.value.clone().map_or(Value::Bool(true), Value::String));
                }
            }
        }
        if parsed.message.is_empty() {
            return self.without_message(&parsed.commands, session_changes, system_messages, notices);
        }
        Ok(GatewayAction::Run(Self::new_turn(parsed.message, control, forwarded, session_changes, system_messages)))
    }

    /// Reads `text` as the answer to `interrupt`, the question the person was shown: yes/no
    /// keywords, else one `ApprovalResponse` call; `/help` and `/exit` still work, other commands
    /// are refused. The resume it returns is bound to that question's id and digest.
    pub async fn answer(
        &self,
        interrupt: &PendingInterrupt,
        text: &str,
        events: Option<&dyn EventSink>,
    ) -> Result<GatewayAction, GatewayError> {
        // An empty line is not an answer (it would count as a rejection).
        if text.trim().is_empty() {
            return Err(GatewayError::EmptyAnswer);
        }
        if text.trim().starts_with('/') {
            let parsed = commands::parse_input(text)?;
            if let Some(command) = parsed.commands.first() {
                return match commands::builtin(&command.name) {
                    Some(Builtin::Help) => Ok(GatewayAction::Reply(commands::help_text(command.value.as_deref()))),
                    Some(Builtin::Exit) => Ok(GatewayAction::Exit),
                    _ => Err(GatewayError::ApprovalPending { command: command.name.clone() }),
                };
            }
        }
        let keyword_only = interrupt.payload.get("approval_type").and_then(Value::as_str).is_some_and(|kind| KEYWORD_ONLY.contains(&kind));
        let detection = match keyword_answer(text) {
            // A control-system write is approved by `yes` alone: words such as "yes, but make it
            // 52" are not read by a model as an approval of what was shown; they reject it.
            None if keyword_only => ApprovalDetection { approved: false, abandon: false, method: ApprovalMethod::Fallback },
            _ => self.detect_approval(text, events).await,
        };
        if detection.abandon {
            return Ok(GatewayAction::Abandon { resume: abandonment(interrupt, Some(text)), method: Some(detection.method) });
        }
        let mut answer = serde_json::json!({ "approved": detection.approved });
        if detection.method != ApprovalMethod::Keyword {
            // "no, use Oslo instead": a node that asks again takes the words into account.
            answer["feedback"] = Value::String(text.trim().to_owned());
        }
        let resume = Resume::to(interrupt, answer);
        Ok(GatewayAction::Resume { resume, approved: detection.approved, method: Some(detection.method) })
    }

    /// The approval mode `/approval` asks for; it may only ask for more approvals than the
    /// configuration unless `approval.allow_chat_override` is set (a chat must not switch off
    /// what the operator requires).
    fn approval_mode(&self, command: &SlashCommand) -> Result<ApprovalMode, GatewayError> {
        let requested = commands::approval_value(command)?;
        let approval = &self.services.settings.approval;
        let strictness = |mode: ApprovalMode| match mode {
            ApprovalMode::Disabled => 0,
            ApprovalMode::Selective => 1,
            ApprovalMode::AllCapabilities => 2,
        };
        if strictness(requested) < strictness(approval.global_mode) && !approval.allow_chat_override {
            return Err(GatewayError::ApprovalOverride { requested, configured: approval.global_mode });
        }
        Ok(requested)
    }

    /// Session keys the interface's session changes (user, interface).
    fn session_changes(&self, state: Option<&AgentState>, session: &Session) -> BTreeMap<String, Value> {
        let mut changes = BTreeMap::new();
        let current = |key: &str| state.and_then(|state| state.session_state.get(key)).and_then(Value::as_str).map(str::to_owned);
        for (key, value) in [(session_keys::USER_ID, &session.user_id), (session_keys::INTERFACE, &session.interface)] {
            if let Some(value) = value
                && current(key).as_deref() != Some(value.as_str())
            {
                changes.insert(key.to_owned(), Value::String(value.clone()));
            }
        }
        changes
    }

    fn without_message(
        &self,
        parsed: &[SlashCommand],
        session: BTreeMap<String, Value>,
        messages: Vec<Message>,
        notices: Vec<String>,
    ) -> Result<GatewayAction, GatewayError> {
        if parsed.is_empty() {
            return Err(GatewayError::Empty);
        }
        let changes_session = parsed.iter().any(|command| matches!(commands::builtin(&command.name), Some(Builtin::Chat | Builtin::Exit)));
        if !changes_session {
            let names = parsed.iter().map(|command| format!("/{}", command.name)).collect::<Vec<_>>().join(" ");
            return Err(CommandError::MissingArgument {
                command: parsed[0].name.clone(),
                usage: format!("{names} applies to one turn; put your question after it, e.g. `{names} <question>`"),
            }
            .into());
        }
        let update = AgentStateUpdate {
            session,
            messages,
            execution_plan: peregrine_core::Slot::Set(None),
            current_step_index: Some(0),
            last_result: peregrine_core::Slot::Set(None),
            execution_start_time: peregrine_core::Slot::Set(None),
            ..AgentStateUpdate::default()
        };
        Ok(GatewayAction::StateOnly { update, notice: notices.join(" ") })
    }

    fn new_turn(
        message: String,
        agent_control: AgentControl,
        capability_slash_commands: BTreeMap<String, Value>,
        session: BTreeMap<String, Value>,
        system_messages: Vec<Message>,
    ) -> AgentStateUpdate {
        let now = Utc::now();
        let turn = TurnStart {
            message: Message::new(peregrine_core::Role::User, message, now),
            agent_control,
            capability_slash_commands,
            start_time: now,
        };
        // Markers such as the end of a direct chat precede the new question in the history.
        let mut update = AgentStateUpdate { new_turn: Some(turn), session, ..AgentStateUpdate::default() };
        if !system_messages.is_empty() {
            update.messages = system_messages;
        }
        update
    }

    fn direct_chat_names(&self) -> Vec<&str> {
        self.catalog.specs().iter().filter(|spec| spec.direct_chat_enabled).map(|spec| spec.name.as_str()).collect()
    }

    fn direct_chat_list(&self) -> String {
        let names = self.direct_chat_names();
        if names.is_empty() {
            return "No capability offers direct chat in this agent.".into();
        }
        let lines: Vec<String> = self
            .catalog
            .specs()
            .iter()
            .filter(|spec| spec.direct_chat_enabled)
            .map(|spec| format!("  /chat:{:<24} {}", spec.name, spec.description))
            .collect();
        format!("Capabilities you can chat with directly:\n{}", lines.join("\n"))
    }

    fn direct_chat_target(&self, name: &str) -> Result<String, GatewayError> {
        let names = self.direct_chat_names();
        if names.contains(&name) {
            return Ok(name.to_owned());
        }
        Err(GatewayError::NotDirectChat {
            name: name.to_owned(),
            available: if names.is_empty() { "none".into() } else { names.join(", ") },
        })
    }
}

#[cfg(test)]
mod tests {
    use peregrine_core::CapabilitySpec;
    use peregrine_graph::payload_digest;
    use peregrine_llm::{FakeProvider, LlmClient, LlmConfig, LlmErrorKind};

    use super::*;
    use crate::settings::AgentSettings;

    fn catalog() -> Arc<Catalog> {
        let mut state_manager = CapabilitySpec::new("state_manager", "Inspect the agent state");
        state_manager.direct_chat_enabled = true;
        Arc::new(Catalog::new(vec![CapabilitySpec::new("respond", "Answer"), state_manager]))
    }

    fn gateway(llm: LlmClient) -> Gateway {
        Gateway::new(Services::new(Arc::new(llm), AgentSettings::default()), catalog())
    }

    fn approving(approved: bool) -> FakeProvider {
        FakeProvider::by_schema(move |_, _| Ok(format!("{{\"approved\": {approved}}}")))
    }

    fn interrupt() -> PendingInterrupt {
        let payload = serde_json::json!({"approval_type": "orchestrator_plan", "resume_payload": {"execution_plan": {"steps": []}}});
        PendingInterrupt { id: "int-1".into(), node: "orchestrator".into(), digest: payload_digest(&payload), payload }
    }

    fn direct_chat_state() -> AgentState {
        let mut state = AgentState::default();
        state.session_state.insert(session_keys::DIRECT_CHAT_CAPABILITY.into(), Value::String("state_manager".into()));
        state
    }

    async fn run(gateway: &Gateway, state: Option<&AgentState>, text: &str) -> Result<GatewayAction, GatewayError> {
        gateway.process(state, None, text, &Session::new("ada", "cli"), None).await
    }

    #[tokio::test]
    async fn acceptance_case_13_keywords_need_no_llm_and_anything_else_asks_once() {
        let provider = approving(true);
        let gateway = gateway(provider.client());
        for (text, approved) in [
            ("yes", true),
            ("Y.", true),
            ("  ok!  ", true),
            ("Okay", true),
            ("yep", true),
            ("  YEAH?  ", true),
            ("no", false),
            ("n", false),
            ("NOPE.", false),
            ("Nope!!", false),
            ("cancel", false),
            ("nah", false),
            ("Abort.", false),
            ("stop", false),
        ] {
            let detection = gateway.detect_approval(text, None).await;
            assert_eq!(detection, ApprovalDetection { approved, abandon: !approved, method: ApprovalMethod::Keyword }, "{text}");
        }
        assert!(provider.requests().is_empty());
        for not_a_keyword in ["yes please", "nope, wait", "yess", "no way"] {
            assert_eq!(keyword_answer(not_a_keyword), None, "{not_a_keyword} needs the approval model");
        }
        let detection = gateway.detect_approval("go ahead please", None).await;
        assert_eq!(detection, ApprovalDetection { approved: true, abandon: false, method: ApprovalMethod::Llm });
        let calls = provider.requests_for("ApprovalResponse");
        assert_eq!(calls.len(), 1);
        assert!(calls[0].messages[0].content.contains("\"go ahead please\""));
    }

    #[tokio::test]
    async fn acceptance_case_13_failures_and_missing_models_reject() {
        let failing = FakeProvider::by_schema(|_, _| Err(FakeProvider::error(LlmErrorKind::Timeout, "timed out")));
        let detection = gateway(failing.client()).detect_approval("sure, why not", None).await;
        assert_eq!(detection, ApprovalDetection { approved: false, abandon: false, method: ApprovalMethod::Fallback });
        let unconfigured = gateway(LlmClient::new(LlmConfig::default()));
        assert_eq!(unconfigured.detect_approval("sure, why not", None).await.method, ApprovalMethod::Fallback);
    }

    #[tokio::test]
    async fn a_pending_interrupt_turns_every_message_into_a_bound_answer() {
        let gateway = gateway(approving(false).client());
        let interrupt = interrupt();
        let action = gateway.process(None, Some(&interrupt), "yes", &Session::default(), None).await.expect("answer");
        let GatewayAction::Resume { resume, approved, method } = action else { panic!("expected a resume, got {action:?}") };
        assert!(approved);
        assert_eq!(method, Some(ApprovalMethod::Keyword));
        assert_eq!((resume.interrupt_id.as_str(), resume.payload_digest.as_str()), ("int-1", interrupt.digest.as_str()));
        assert_eq!(resume.answer, serde_json::json!({"approved": true}));
        // "no" and "cancel" withdraw the question: bound to it, recorded in the history.
        for word in ["no", "Cancel."] {
            let withdrawn = gateway.process(None, Some(&interrupt), word, &Session::default(), None).await.expect("answer");
            let GatewayAction::Abandon { resume, method: Some(ApprovalMethod::Keyword) } = withdrawn else {
                panic!("expected a withdrawal, got {withdrawn:?}")
            };
            assert_eq!((resume.interrupt_id.as_str(), resume.payload_digest.as_str()), ("int-1", interrupt.digest.as_str()));
            let record = resume.update.expect("the history record");
            let said: Vec<(peregrine_core::Role, &str)> =
                record.messages.iter().map(|message| (message.role, message.content.as_str())).collect();
            assert_eq!(said.len(), 2, "{said:?}");
            assert_eq!(said[0], (peregrine_core::Role::User, word));
            assert!(said[1].0 == peregrine_core::Role::Assistant && said[1].1.starts_with("Cancelled:"), "{said:?}");
        }
        let rejected = gateway.process(None, Some(&interrupt), "hmm, change step 2", &Session::default(), None).await.expect("answer");
        let GatewayAction::Resume { resume, approved: false, method: Some(ApprovalMethod::Llm) } = rejected else {
            panic!("expected an LLM-read rejection, got {rejected:?}")
        };
        assert_eq!(resume.answer, serde_json::json!({"approved": false, "feedback": "hmm, change step 2"}), "the words travel with it");
        let command = gateway.process(None, Some(&interrupt), "/planning:off", &Session::default(), None).await;
        assert!(matches!(command, Err(GatewayError::ApprovalPending { .. })), "{command:?}");
        let help = gateway.process(None, Some(&interrupt), "/help", &Session::default(), None).await.expect("help");
        assert!(matches!(help, GatewayAction::Reply(_)));
        let provider = approving(true);
        let gateway = self::gateway(provider.client());
        let empty = gateway.process(None, Some(&interrupt), "  \n ", &Session::default(), None).await;
        assert_eq!(empty, Err(GatewayError::EmptyAnswer), "an empty line is not a rejection");
        assert!(provider.requests().is_empty(), "and asks no model");
    }

    #[tokio::test]
    async fn turn_commands_take_effect_for_the_turn() {
        let gateway = gateway(approving(true).client());
        let refused = run(&gateway, None, "/approval:off What is the current?").await.expect_err("lowering is refused by default");
        assert!(refused.to_string().contains("approval.allow_chat_override"), "{refused}");
        let stricter = run(&gateway, None, "/approval What is the current?").await.expect("raising is allowed");
        let GatewayAction::Run(update) = stricter else { panic!("expected a run") };
        assert_eq!(update.new_turn.expect("turn").agent_control.approval_mode, ApprovalMode::AllCapabilities);
        let mut settings = AgentSettings::default();
        settings.approval.allow_chat_override = true;
        let gateway = Gateway::new(Services::new(Arc::new(approving(true).client()), settings), catalog());
        let action = run(&gateway, None, "/planning /approval:off /task:off /caps:off /beam:fast What is the current?").await.expect("run");
        let GatewayAction::Run(update) = action else { panic!("expected a run, got {action:?}") };
        let turn = update.new_turn.expect("a new turn");
        assert_eq!(turn.message.content, "What is the current?");
        assert!(turn.agent_control.planning_mode_enabled);
        assert_eq!(turn.agent_control.approval_mode, ApprovalMode::Disabled);
        assert!(turn.agent_control.task_extraction_bypass_enabled && turn.agent_control.capability_selection_bypass_enabled);
        assert_eq!(turn.capability_slash_commands.get("beam"), Some(&Value::String("fast".into())));
        assert_eq!(update.session.get(session_keys::USER_ID), Some(&Value::String("ada".into())));
        let plain = run(&gateway, None, "hello").await.expect("run");
        let GatewayAction::Run(update) = plain else { panic!("expected a run") };
        let control = update.new_turn.expect("turn").agent_control;
        assert_eq!((control.planning_mode_enabled, control.approval_mode), (false, ApprovalMode::Selective));
    }

    #[tokio::test]
    async fn acceptance_case_8_direct_chat_commands() {
        let gateway = gateway(approving(true).client());
        let action = run(&gateway, None, "/chat:state_manager").await.expect("state only");
        let GatewayAction::StateOnly { update, .. } = action else { panic!("expected a state-only update, got {action:?}") };
        assert_eq!(update.session.get(session_keys::DIRECT_CHAT_CAPABILITY), Some(&Value::String("state_manager".into())));
        assert!(update.new_turn.is_none());
        let refused = run(&gateway, None, "/chat:respond").await;
        assert!(matches!(&refused, Err(GatewayError::NotDirectChat { available, .. }) if available == "state_manager"), "{refused:?}");
        let listing = run(&gateway, None, "/chat").await.expect("list");
        assert!(matches!(&listing, GatewayAction::Reply(text) if text.contains("/chat:state_manager")));
        let state = direct_chat_state();
        let exit = run(&gateway, Some(&state), "/exit").await.expect("exit direct chat");
        let GatewayAction::StateOnly { update, .. } = exit else { panic!("expected a state-only update, got {exit:?}") };
        assert_eq!(update.session.get(session_keys::DIRECT_CHAT_CAPABILITY), Some(&Value::Null));
        assert!(update.messages[0].content.contains("End of direct chat session with 'state_manager'"));
        assert_eq!(run(&gateway, None, "/quit").await.expect("exit"), GatewayAction::Exit);
    }

    #[tokio::test]
    async fn bad_input_gets_a_clear_error() {
        let gateway = gateway(approving(true).client());
        assert_eq!(run(&gateway, None, "   ").await, Err(GatewayError::Empty));
        let bare = run(&gateway, None, "/planning").await.expect_err("needs a question");
        assert!(bare.to_string().contains("put your question after it"), "{bare}");
        let malformed = run(&gateway, None, "/plan-ning what").await.expect_err("malformed");
        assert!(malformed.to_string().contains("/name or /name:value"), "{malformed}");
        let option = run(&gateway, None, "/task:sometimes what").await.expect_err("bad option");
        assert!(option.to_string().contains("/task takes on, off"), "{option}");
    }
}

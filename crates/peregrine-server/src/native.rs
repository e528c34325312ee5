//! The native threads/runs API: threads (create, list, get, delete, state, history) and runs
//! (start as a background task, follow over SSE and reconnect with `Last-Event-ID`, wait,
//! cancel), with approvals answered by a run of kind `resume`.
//!
//! Thread ownership is part of the thread id (`t-<owner tag>-…`, `oai-<owner tag>-…`), so every
//! process serving the same store agrees on it without any table of its own; a thread of
//! another key answers 404 exactly like a missing one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use peregrine_agent::{AgentError, ApprovalRef, ApprovalReply, Session, Thread, ThreadStatus, TurnOptions, TurnResult};
use peregrine_graph::{CheckpointError, ListQuery, RunError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::auth::Caller;
use crate::chat::{BusyThread, ServerState, Shared};
use crate::error::{ApiError, json_response};
use crate::request::DEFAULT_USER;
use crate::runs::{LoggedEvent, Run, RunKind, interrupt_json, redact_value, strip_server_paths};

/// The interface name runs of this API give their session.
pub(crate) const API_INTERFACE: &str = "api";
/// How often an idle SSE stream sends a `: keep-alive` comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long a run retries a thread that another process still holds (a PostgreSQL lock is
/// released shortly after its run ended) before it is refused as busy.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(2);
/// The longest thread id accepted from a client.
const MAX_THREAD_ID_CHARS: usize = 128;
/// The default and the largest page of `GET /threads` and `GET …/history`.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 1000;

/// The routes of the native API.
pub(crate) fn routes() -> Router<Arc<ServerState>> {
    Router::new()
        .route("/info", get(info))
        .route("/threads", post(create_thread).get(list_threads))
        .route("/threads/{thread_id}", get(get_thread).delete(delete_thread))
        .route("/threads/{thread_id}/state", get(thread_state))
        .route("/threads/{thread_id}/history", get(thread_history))
        .route("/threads/{thread_id}/runs", post(create_run).get(list_runs))
        .route("/threads/{thread_id}/runs/stream", post(create_run_stream))
        .route("/threads/{thread_id}/runs/wait", post(create_run_wait))
        .route("/threads/{thread_id}/runs/{run_id}", get(get_run))
        .route("/threads/{thread_id}/runs/{run_id}/stream", get(stream_run))
        .route("/threads/{thread_id}/runs/{run_id}/wait", get(wait_run))
        .route("/threads/{thread_id}/runs/{run_id}/cancel", post(cancel_run))
}

/// Runs a handler body and turns its error into the JSON error answer.
fn respond(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

/// A JSON answer with the configuration's secrets removed (thread contents may quote errors).
fn ok_json(state: &ServerState, status: StatusCode, body: &Value) -> Result<Response, ApiError> {
    Ok(json_response(status, &redact_value(&state.redact, body)))
}

/// `GET /info` (no key needed): what the web UI shows before it has a key.
async fn info(State(state): Shared) -> Response {
    json_response(StatusCode::OK, &json!({"name": state.model_id, "version": env!("CARGO_PKG_VERSION"), "auth": state.keys.required()}))
}

/// The caller, who must be allowed to see `thread_id` (else 404, as for a missing thread).
fn caller_of(state: &ServerState, headers: &HeaderMap, thread_id: &str) -> Result<Caller, ApiError> {
    let caller = state.keys.authenticate(headers)?;
    if !caller.owns(thread_id) {
        return Err(ApiError::thread_not_found(thread_id));
    }
    Ok(caller)
}

/// A storage failure, with the configuration's secrets removed from its text.
fn store_error(state: &ServerState, error: &RunError) -> ApiError {
    let error = ApiError::server_error(format!("The thread store failed: {error}. Try again; if it persists, check the checkpointer."));
    tracing::warn!(error = %(state.redact)(&error.message), "native API store failure");
    error.redacted(&state.redact)
}

/// The thread's newest state and status, or 404.
async fn thread_of(state: &ServerState, thread_id: &str) -> Result<Thread, ApiError> {
    match state.agent.thread(thread_id).await {
        Ok(Some(thread)) => Ok(thread),
        Ok(None) => Err(ApiError::thread_not_found(thread_id)),
        Err(error) => Err(store_error(state, &error)),
    }
}

/// 404 unless the thread exists (its newest checkpoint's metadata; the state is not read).
async fn exists(state: &ServerState, thread_id: &str) -> Result<(), ApiError> {
    let newest = state.agent.history(thread_id, ListQuery { before: None, limit: Some(1) }).await;
    match newest {
        Ok(newest) if newest.is_empty() => Err(ApiError::thread_not_found(thread_id)),
        Ok(_) => Ok(()),
        Err(error) => Err(store_error(state, &error)),
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(state: &ServerState, headers: &HeaderMap, body: Body) -> Result<Option<T>, ApiError> {
    let bytes = crate::limits::read_body(headers, body, &state.body_limits).await?;
    parse_json_body(&bytes)
}

/// A body as [`read_json`] reads it: `None` when it is empty or whitespace, else a JSON object
/// of `T`'s shape.
pub(crate) fn parse_json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<Option<T>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let unusable = |error: serde_json::Error| {
        ApiError::invalid_request(format!("The body cannot be used: {error}. See the API documentation of peregrine serve."))
    };
    let value: Value = serde_json::from_slice(bytes).map_err(unusable)?;
    if !value.is_object() {
        return Err(ApiError::invalid_request("The body must be a JSON object. See the API documentation of peregrine serve."));
    }
    serde_json::from_value(value).map(Some).map_err(unusable)
}

/// A path parameter; a URL that cannot be decoded is a JSON 400.
struct ApiPath<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::invalid_request(format!("The URL cannot be used: {}", rejection.body_text()))),
        }
    }
}

/// The query string; one that cannot be read is a JSON 400.
struct ApiQuery<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::invalid_request(format!("The query string cannot be used: {}", rejection.body_text()))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Threads

/// The thread's `status` and `resumable` fields: `busy` (a run of this process, or another
/// process holding its lock), `interrupted`, `error` (the last turn ended in the error node, or
/// a run was cut off: `resumable`), `idle`.
fn status_fields(state: &ServerState, thread: &Thread) -> (&'static str, bool) {
    let thread_id = thread.id();
    if state.runs.active(thread_id).is_some() || state.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(thread_id) {
        return ("busy", false);
    }
    match thread.status {
        ThreadStatus::Busy => ("busy", false),
        ThreadStatus::Interrupted => ("interrupted", false),
        ThreadStatus::Unfinished => ("error", true),
        ThreadStatus::Failed => ("error", false),
        ThreadStatus::Idle => ("idle", false),
    }
}

/// The Thread object.
async fn thread_json(state: &ServerState, thread: &Thread) -> Value {
    let (status, resumable) = status_fields(state, thread);
    let created = state.agent.created_at(thread.id()).await.ok().flatten().unwrap_or(thread.updated_at());
    json!({
        "thread_id": thread.id(),
        "created_at": created.to_rfc3339(),
        "updated_at": thread.updated_at().to_rfc3339(),
        "status": status,
        "resumable": resumable,
        "title": thread.title(),
        "messages": thread.state().messages.len(),
        "interrupt": thread.interrupt().map(interrupt_json),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateThread {
    #[serde(default)]
    thread_id: Option<String>,
    /// Accepted for LangGraph clients; not stored.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted and ignored")]
    metadata: Option<Value>,
}

/// `POST /threads`.
async fn create_thread(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    respond(create_thread_inner(&state, &headers, body).await)
}

async fn create_thread_inner(state: &ServerState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let caller = state.keys.authenticate(headers)?;
    let request: Option<CreateThread> = read_json(state, headers, body).await?;
    let thread_id = match request.and_then(|request| request.thread_id) {
        None => format!("t-{}-{}", caller.owner_tag(), uuid::Uuid::new_v4().simple()),
        Some(_) if caller != Caller::Anonymous => {
            return Err(ApiError::invalid_request(
                "With API keys configured, thread ids are assigned by the server (they carry the key's owner tag); omit 'thread_id'.",
            ));
        }
        Some(id) => {
            let valid = !id.is_empty()
                && id.chars().count() <= MAX_THREAD_ID_CHARS
                && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
            if !valid {
                return Err(ApiError::invalid_request(format!(
                    "'thread_id' must be 1 to {MAX_THREAD_ID_CHARS} characters of letters, digits and - _ . : (or omitted)."
                )));
            }
            id
        }
    };
    let Some(thread) = state.agent.create_thread(&thread_id).await.map_err(|error| store_error(state, &error))? else {
        return Err(ApiError::conflict("thread_exists", format!("Thread '{thread_id}' exists already; pick another id or omit it.")));
    };
    tracing::info!(thread = %thread_id, "thread created");
    ok_json(state, StatusCode::CREATED, &thread_json(state, &thread).await)
}

#[derive(Debug, Default, Deserialize)]
struct Page {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    before: Option<u64>,
}

impl Page {
    fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE)
    }
}

/// `GET /threads`.
async fn list_threads(State(state): Shared, headers: HeaderMap, ApiQuery(page): ApiQuery<Page>) -> Response {
    respond(list_threads_inner(&state, &headers, &page).await)
}

async fn list_threads_inner(state: &ServerState, headers: &HeaderMap, page: &Page) -> Result<Response, ApiError> {
    let caller = state.keys.authenticate(headers)?;
    let mut threads = state.agent.threads().await.map_err(|error| store_error(state, &error))?;
    threads.retain(|summary| caller.owns(&summary.thread_id));
    let mut listed = Vec::new();
    for summary in threads.iter().skip(page.offset.unwrap_or(0)).take(page.limit()) {
        // A thread deleted meanwhile is simply not listed.
        if let Ok(Some(thread)) = state.agent.thread(&summary.thread_id).await {
            listed.push(thread_json(state, &thread).await);
        }
    }
    ok_json(state, StatusCode::OK, &Value::Array(listed))
}

/// `GET /threads/{thread_id}`.
async fn get_thread(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>) -> Response {
    respond(
        async {
            caller_of(&state, &headers, &thread_id)?;
            let thread = thread_of(&state, &thread_id).await?;
            ok_json(&state, StatusCode::OK, &thread_json(&state, &thread).await)
        }
        .await,
    )
}

/// `DELETE /threads/{thread_id}`: refused while a run holds it (here or in another process).
async fn delete_thread(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>) -> Response {
    respond(delete_thread_inner(&state, &headers, &thread_id).await)
}

async fn delete_thread_inner(state: &Arc<ServerState>, headers: &HeaderMap, thread_id: &str) -> Result<Response, ApiError> {
    caller_of(state, headers, thread_id)?;
    let _busy = BusyThread::claim(state, thread_id)?;
    match state.agent.delete_thread(thread_id).await {
        Ok(true) => {}
        Ok(false) => return Err(ApiError::thread_not_found(thread_id)),
        Err(RunError::Checkpoint(CheckpointError::ThreadBusy { .. })) => return Err(ApiError::thread_busy()),
        Err(error) => return Err(store_error(state, &error)),
    }
    state.runs.forget_thread(thread_id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /threads/{thread_id}/state`.
async fn thread_state(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>) -> Response {
    respond(
        async {
            caller_of(&state, &headers, &thread_id)?;
            let thread = thread_of(&state, &thread_id).await?;
            let (status, resumable) = status_fields(&state, &thread);
            let snapshot = &thread.snapshot;
            let agent_state = &snapshot.state;
            let messages: Vec<Value> = agent_state
                .messages
                .iter()
                .map(|message| json!({"role": message.role, "content": message.content, "timestamp": message.timestamp.to_rfc3339()}))
                .collect();
            let plan = agent_state.planning.execution_plan.as_ref().map(|plan| {
                let results: Vec<Value> = agent_state
                    .execution
                    .step_results
                    .iter()
                    .map(|step| json!({"step_index": step.step_index, "capability": step.capability, "success": step.success, "error": step.error}))
                    .collect();
                json!({"steps": plan.steps, "current_step": agent_state.planning.current_step_index, "results": results})
            });
            let values = serde_json::to_value(&**agent_state).unwrap_or(Value::Null);
            ok_json(&state, StatusCode::OK,
                &json!({
                    "thread_id": thread_id,
                    "status": status,
                    "resumable": resumable,
                    "checkpoint_id": snapshot.meta.checkpoint_id,
                    "next": snapshot.next,
                    "messages": messages,
                    "plan": plan,
                    "interrupt": snapshot.meta.interrupt.as_ref().map(interrupt_json),
                    "values": values,
                }),
            )
        }
        .await,
    )
}

/// `GET /threads/{thread_id}/history`: checkpoint metadata, newest first.
async fn thread_history(
    State(state): Shared,
    headers: HeaderMap,
    ApiPath(thread_id): ApiPath<String>,
    ApiQuery(page): ApiQuery<Page>,
) -> Response {
    respond(
        async {
            caller_of(&state, &headers, &thread_id)?;
            let query = ListQuery { before: page.before, limit: Some(page.limit()) };
            let history = state.agent.history(&thread_id, query).await.map_err(|error| store_error(&state, &error))?;
            if history.is_empty() && page.before.is_none() {
                return Err(ApiError::thread_not_found(&thread_id));
            }
            let mut history = serde_json::to_value(&history).unwrap_or(Value::Null);
            strip_server_paths(&mut history);
            ok_json(&state, StatusCode::OK, &history)
        }
        .await,
    )
}

// ---------------------------------------------------------------------------------------------
// Runs

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRequest {
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    resume: Option<ResumeRequest>,
    #[serde(default, rename = "continue")]
    continue_run: Option<bool>,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeRequest {
    #[serde(default)]
    approved: Option<bool>,
    /// `true` withdraws the approval unanswered: nothing runs and the thread is idle.
    #[serde(default)]
    abandon: Option<bool>,
    /// The digest of the approval's payload as the client showed it (optional; checked when given).
    #[serde(default)]
    digest: Option<String>,
    /// The person's words, read as yes/no (keywords, else the LLM); needs `interrupt_id`.
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    interrupt_id: Option<String>,
    #[serde(default)]
    plan: Option<Value>,
}

/// What a run does, checked before it starts.
enum Operation {
    Message(String),
    /// An approval's answer, bound to the question the client names.
    Answer {
        approval: ApprovalRef,
        reply: ApprovalReply,
    },
    Continue,
}

impl Operation {
    fn kind(&self) -> RunKind {
        match self {
            Operation::Message(_) => RunKind::Message,
            Operation::Answer { .. } => RunKind::Resume,
            Operation::Continue => RunKind::Continue,
        }
    }
}

const RUN_BODY_HELP: &str = "Send exactly one of {\"input\": \"text\"}, {\"resume\": {\"interrupt_id\": \"…\", \"approved\": true|false}} (or \"answer\": \"text\", or \"abandon\": true, in place of \"approved\") or {\"continue\": true} (optionally with \"user\").";

/// Checks a run request and turns it into an operation and a session. What needs the thread's
/// state (a pending approval, a cut-off run) is checked by the agent as the run starts, on the
/// state it reads once.
async fn operation(
    state: &ServerState,
    caller: &Caller,
    thread_id: &str,
    request: Option<RunRequest>,
) -> Result<(Operation, Session), ApiError> {
    let (asked, session) = read_run_request(request, caller)?;
    let operation = match asked {
        RunAsk::Input(input) => {
            let text = input_text(input)?;
            crate::limits::check_message(&text, state.max_message_bytes, "input")?;
            // A run on an unknown thread would create it: the threads of this API are created first.
            exists(state, thread_id).await?;
            Operation::Message(text)
        }
        RunAsk::Resume(resume) => {
            // An answer names the question it answers, so that it never reaches one asked after
            // the client looked (another process may ask a new question at any time).
            let Some(interrupt_id) = resume.interrupt_id.clone() else {
                return Err(ApiError::invalid_request(format!(
                    "A resume names the approval it answers: send its 'interrupt_id' (GET /threads/{thread_id} shows the pending one)."
                )));
            };
            let approval = ApprovalRef { interrupt_id, digest: resume.digest.clone() };
            let reply = match resume_answer(resume, state.max_message_bytes)? {
                ResumeAnswer::Decision { approved: true, edit } => ApprovalReply::Approve { edit },
                ResumeAnswer::Decision { approved: false, .. } => ApprovalReply::Reject,
                ResumeAnswer::Abandon => ApprovalReply::Abandon,
                ResumeAnswer::Words(text) => ApprovalReply::Words(text),
            };
            Operation::Answer { approval, reply }
        }
        RunAsk::Continue => Operation::Continue,
    };
    Ok((operation, session))
}

/// The one thing a run body asks for, before the thread is read.
#[derive(Debug)]
pub(crate) enum RunAsk {
    /// `input`: a message (its type is checked by [`input_text`]).
    Input(Value),
    /// `resume`: an approval's answer (checked by [`resume_answer`] once the approval is known).
    Resume(ResumeRequest),
    /// `continue: true`.
    Continue,
}

/// The checks of a run body that need no thread: a body, exactly one of `input`, `resume` and
/// `continue: true`, and a `user` of at most 200 characters (the session's user, per key).
pub(crate) fn read_run_request(request: Option<RunRequest>, caller: &Caller) -> Result<(RunAsk, Session), ApiError> {
    let Some(request) = request else { return Err(ApiError::invalid_request(format!("The body is empty. {RUN_BODY_HELP}"))) };
    let given =
        usize::from(request.input.is_some()) + usize::from(request.resume.is_some()) + usize::from(request.continue_run == Some(true));
    if given != 1 {
        return Err(ApiError::invalid_request(format!("A run does one thing. {RUN_BODY_HELP}")));
    }
    let user = request.user.as_deref().map(str::trim).filter(|user| !user.is_empty()).unwrap_or(DEFAULT_USER);
    if user.chars().count() > 200 {
        return Err(ApiError::invalid_request("'user' is longer than 200 characters."));
    }
    // Memory is per user id: the key is part of it, so a key cannot reach another key's users.
    let user_id = match caller {
        Caller::Anonymous => user.to_owned(),
        Caller::Key(_) => format!("{}:{user}", &caller.identity()[..16]),
    };
    let session = Session::new(user_id, API_INTERFACE);
    let asked = match (request.input, request.resume) {
        (Some(input), _) => RunAsk::Input(input),
        (None, Some(resume)) => RunAsk::Resume(resume),
        (None, None) => RunAsk::Continue,
    };
    Ok((asked, session))
}

/// The message text of an `input`, which must be a string.
pub(crate) fn input_text(input: Value) -> Result<String, ApiError> {
    match input {
        Value::String(text) => Ok(text),
        _ => Err(ApiError::invalid_request(format!("'input' must be the message text (a string). {RUN_BODY_HELP}"))),
    }
}

/// What a `resume` answers, once the thread is known to wait for the approval it names.
#[derive(Debug)]
pub(crate) enum ResumeAnswer {
    /// `approved` (with an edited `plan` only when approving).
    Decision {
        /// Whether the action was approved.
        approved: bool,
        /// An edited plan sent with the approval.
        edit: Option<Value>,
    },
    /// An `answer` in words (with the `interrupt_id` it is bound to).
    Words(String),
    /// `abandon: true`: withdraw the approval unanswered.
    Abandon,
}

/// The checks of a `resume` that need only the body: exactly one of `approved`, `answer` and
/// `abandon: true`, an edited plan only with an approval, an answer in words only with its
/// `interrupt_id`, not empty and not over `max_message_bytes`.
pub(crate) fn resume_answer(resume: ResumeRequest, max_message_bytes: usize) -> Result<ResumeAnswer, ApiError> {
    if let Some(abandon) = resume.abandon {
        if !abandon || resume.approved.is_some() || resume.answer.is_some() || resume.plan.is_some() {
            return Err(ApiError::invalid_request(format!(
                "\"abandon\" is given as true and alone (no 'approved', 'answer' or 'plan'). {RUN_BODY_HELP}"
            )));
        }
        return Ok(ResumeAnswer::Abandon);
    }
    match (resume.approved, resume.answer) {
        (Some(approved), None) => {
            if resume.plan.is_some() && !approved {
                return Err(ApiError::invalid_request("An edited 'plan' can only be approved; send it with \"approved\": true."));
            }
            Ok(ResumeAnswer::Decision { approved, edit: resume.plan })
        }
        (None, Some(text)) => {
            if resume.interrupt_id.is_none() {
                return Err(ApiError::invalid_request(
                    "An 'answer' in words needs the 'interrupt_id' of the approval it answers (GET /threads/{id} shows it).",
                ));
            }
            if resume.plan.is_some() {
                return Err(ApiError::invalid_request("An edited 'plan' is approved with \"approved\": true, not with an 'answer'."));
            }
            if text.trim().is_empty() {
                return Err(ApiError::invalid_request("The 'answer' is empty: say yes or no (or what to change)."));
            }
            crate::limits::check_message(&text, max_message_bytes, "answer")?;
            Ok(ResumeAnswer::Words(text))
        }
        _ => Err(ApiError::invalid_request(format!("A resume has exactly one of 'approved', 'answer' and 'abandon'. {RUN_BODY_HELP}"))),
    }
}

fn unfinished_approval(thread_id: &str) -> ApiError {
    ApiError::conflict(
        "unfinished_run",
        format!("Thread '{thread_id}' holds an approved action that was cut off; finish it first with a run of {{\"continue\": true}}."),
    )
}

fn approval_pending(thread_id: &str) -> ApiError {
    ApiError::conflict(
        "approval_pending",
        format!(
            "Thread '{thread_id}' waits for an approval; answer it with a run of {{\"resume\": {{\"approved\": true|false, \"interrupt_id\": \"…\"}}}} (GET /threads/{thread_id} shows it)."
        ),
    )
}

fn stale_approval(thread_id: &str) -> ApiError {
    ApiError::conflict(
        "stale_approval",
        format!(
            "The approval answered is no longer the one thread '{thread_id}' waits for; GET /threads/{thread_id} shows the current one."
        ),
    )
}

/// The API's error for what the agent refused or failed at.
fn run_error(state: &ServerState, thread_id: &str, error: AgentError) -> ApiError {
    let error = match error {
        AgentError::Gateway(error) => ApiError::invalid_request(error.to_string()),
        AgentError::Run(RunError::Checkpoint(CheckpointError::ThreadBusy { .. })) => ApiError::thread_busy(),
        AgentError::Run(RunError::PendingResume { .. }) => unfinished_approval(thread_id),
        AgentError::Run(RunError::StaleResume { .. } | RunError::ForgedResume { .. }) => stale_approval(thread_id),
        AgentError::Run(RunError::NothingToResume { .. }) => {
            ApiError::conflict("no_pending_approval", format!("Thread '{thread_id}' waits for no approval."))
        }
        AgentError::Run(RunError::PendingInterrupt { .. }) => approval_pending(thread_id),
        AgentError::Run(RunError::NotFound { checkpoint_id: None, .. }) => ApiError::thread_not_found(thread_id),
        AgentError::NothingToContinue(peregrine_agent::NothingToContinue::NoThread) => ApiError::thread_not_found(thread_id),
        AgentError::NothingToContinue(why) => {
            ApiError::conflict("nothing_to_continue", format!("Thread '{thread_id}' has no cut-off run to continue: {why}."))
        }
        other => ApiError::server_error(format!("The agent could not finish the run: {other}")),
    };
    error.redacted(&state.redact)
}

/// Starts a run: it is returned once it holds its thread (or has already ended, for replies).
async fn launch(state: &Arc<ServerState>, headers: &HeaderMap, thread_id: &str, body: Body) -> Result<Arc<Run>, ApiError> {
    let caller = match caller_of(state, headers, thread_id) {
        Ok(caller) => caller,
        Err(error) => {
            crate::limits::drain(body).await;
            return Err(error);
        }
    };
    let request: Option<RunRequest> = read_json(state, headers, body).await?;
    let slot = state.turn_slots.take()?;
    let (operation, session) = operation(state, &caller, thread_id, request).await?;
    let busy = BusyThread::claim(state, thread_id)?.holding(slot);
    let run = state.runs.start(thread_id, operation.kind());
    tracing::info!(thread = %thread_id, run = %run.id, kind = ?operation.kind(), "run starts");
    state.tasks.spawn(drive(Arc::clone(state), Arc::clone(&run), operation, session, busy));
    run.wait_until(Run::started_or_finished).await;
    if let Some(error) = run.error().filter(|_| !run.has_started()) {
        // Refused before it held the thread: nothing ran, so there is no run to keep.
        state.runs.forget(&run.id);
        return Err(error);
    }
    Ok(run)
}

/// Runs `attempt` again for a moment while another process still holds the thread (a
/// PostgreSQL lock is released just after its run ended); a thread held longer is refused as
/// busy. Only the engine's lock fails with
/// `ThreadBusy`, and it is taken before anything is written, so an attempt is safe to repeat.
pub(crate) async fn retry_while_held<F, Fut>(cancel: &CancellationToken, mut attempt: F) -> Result<TurnResult, AgentError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<TurnResult, AgentError>>,
{
    let until = Instant::now() + BUSY_RETRY_FOR;
    let mut delay = Duration::from_millis(10);
    loop {
        let outcome = attempt().await;
        let held = matches!(&outcome, Err(AgentError::Run(RunError::Checkpoint(CheckpointError::ThreadBusy { .. }))));
        if !held || cancel.is_cancelled() || Instant::now() + delay >= until {
            return outcome;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cancel.cancelled() => return outcome,
        }
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// Ends a run whose task stopped without ending it (a panic): its followers and waiters get
/// `end` instead of hanging, and the thread stops counting as busy.
struct FinishOnDrop(Arc<Run>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if !self.0.is_finished() {
            self.0.finish(Err(ApiError::server_error(
                "The run stopped unexpectedly (a defect of the server; please report it). The thread keeps its last checkpoint: continue it with {\"continue\": true}.",
            )));
        }
    }
}

/// Executes a run to its end, logging every event.
async fn drive(state: Arc<ServerState>, run: Arc<Run>, operation: Operation, session: Session, busy: BusyThread) {
    let _finish = FinishOnDrop(Arc::clone(&run));
    let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
    let options = TurnOptions { events: Some(sender), cancel: run.cancel.clone() };
    let (agent, thread_id, operation, session) = (&state.agent, run.thread_id.as_str(), &operation, &session);
    let turn = retry_while_held(&run.cancel, || {
        let options = options.clone();
        async move {
            match operation {
                Operation::Message(text) => agent.send_message(thread_id, text, session, options).await,
                Operation::Answer { approval, reply } => agent.answer_approval(thread_id, approval, reply.clone(), options).await,
                Operation::Continue => agent.continue_turn(thread_id, options).await,
            }
        }
    });
    tokio::pin!(turn);
    let outcome: Result<TurnResult, AgentError> = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => run.record(&event),
            outcome = &mut turn => break outcome,
        }
    };
    while let Ok(event) = events.try_recv() {
        run.record(&event);
    }
    match &outcome {
        Ok(result) => tracing::info!(thread = %thread_id, run = %run.id, status = ?result.status, "run ended"),
        Err(error) => tracing::warn!(thread = %thread_id, run = %run.id, error = %(state.redact)(&error.to_string()), "run failed"),
    }
    let outcome = outcome.map_err(|error| run_error(&state, thread_id, error));
    // The thread is free before anyone waiting for the run hears that it ended.
    drop(busy);
    run.finish(outcome);
}

/// `POST /threads/{thread_id}/runs`: 201 with the run once it holds the thread.
async fn create_run(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>, body: Body) -> Response {
    respond(launch(&state, &headers, &thread_id, body).await.and_then(|run| ok_json(&state, StatusCode::CREATED, &run.json())))
}

/// `POST /threads/{thread_id}/runs/stream`: the new run's events.
async fn create_run_stream(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>, body: Body) -> Response {
    respond(launch(&state, &headers, &thread_id, body).await.map(|run| sse(run, 0)))
}

/// `POST /threads/{thread_id}/runs/wait`: the run once it ended.
async fn create_run_wait(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>, body: Body) -> Response {
    match launch(&state, &headers, &thread_id, body).await {
        Ok(run) => {
            run.wait_until(Run::is_finished).await;
            json_response(StatusCode::OK, &run.json())
        }
        Err(error) => error.into_response(),
    }
}

/// `GET /threads/{thread_id}/runs`: the runs of this process, newest first.
async fn list_runs(State(state): Shared, headers: HeaderMap, ApiPath(thread_id): ApiPath<String>) -> Response {
    respond(
        async {
            caller_of(&state, &headers, &thread_id)?;
            exists(&state, &thread_id).await?;
            let runs: Vec<Value> = state.runs.of_thread(&thread_id).iter().map(|run| run.json()).collect();
            ok_json(&state, StatusCode::OK, &Value::Array(runs))
        }
        .await,
    )
}

/// The run, or 404 naming what is missing (the thread, or the run of an existing thread).
async fn find_run(state: &ServerState, headers: &HeaderMap, thread_id: &str, run_id: &str) -> Result<Arc<Run>, ApiError> {
    caller_of(state, headers, thread_id)?;
    if let Some(run) = state.runs.get(thread_id, run_id) {
        return Ok(run);
    }
    exists(state, thread_id).await?;
    Err(ApiError::run_not_found(thread_id, run_id))
}

/// `GET /threads/{thread_id}/runs/{run_id}`.
async fn get_run(State(state): Shared, headers: HeaderMap, ApiPath((thread_id, run_id)): ApiPath<(String, String)>) -> Response {
    respond(find_run(&state, &headers, &thread_id, &run_id).await.and_then(|run| ok_json(&state, StatusCode::OK, &run.json())))
}

#[derive(Debug, Default, Deserialize)]
struct StreamQuery {
    #[serde(default)]
    last_event_id: Option<u64>,
}

/// `GET /threads/{thread_id}/runs/{run_id}/stream`: the run's events from the start, or after
/// `Last-Event-ID`.
async fn stream_run(
    State(state): Shared,
    headers: HeaderMap,
    ApiPath((thread_id, run_id)): ApiPath<(String, String)>,
    ApiQuery(stream_query): ApiQuery<StreamQuery>,
) -> Response {
    respond(find_run(&state, &headers, &thread_id, &run_id).await.and_then(|run| {
        let header = headers.get("last-event-id").map(|value| value.to_str().ok().and_then(|text| text.trim().parse::<u64>().ok()));
        let after = match (header, stream_query.last_event_id) {
            (Some(Some(seq)), _) => seq,
            (Some(None), _) => return Err(ApiError::invalid_request("'Last-Event-ID' must be the number of an event of this run.")),
            (None, seq) => seq.unwrap_or(0),
        };
        // Events are numbered as they are recorded, so no client has seen one past the last,
        // whether the run still goes on or not.
        let last = run.last_seq();
        if after > last {
            return Err(ApiError::invalid_request(format!("Last-Event-ID {after} is past the last event of this run ({last}).")));
        }
        Ok(sse(run, after))
    }))
}

/// `GET /threads/{thread_id}/runs/{run_id}/wait`.
async fn wait_run(State(state): Shared, headers: HeaderMap, ApiPath((thread_id, run_id)): ApiPath<(String, String)>) -> Response {
    match find_run(&state, &headers, &thread_id, &run_id).await {
        Ok(run) => {
            run.wait_until(Run::is_finished).await;
            json_response(StatusCode::OK, &run.json())
        }
        Err(error) => error.into_response(),
    }
}

/// `POST /threads/{thread_id}/runs/{run_id}/cancel`: 202; the run ends `cancelled` and its
/// thread keeps its last checkpoint.
async fn cancel_run(State(state): Shared, headers: HeaderMap, ApiPath((thread_id, run_id)): ApiPath<(String, String)>) -> Response {
    respond(find_run(&state, &headers, &thread_id, &run_id).await.and_then(|run| {
        if run.is_finished() {
            return Err(ApiError::conflict("run_finished", format!("Run '{run_id}' has already ended; there is nothing to cancel.")));
        }
        tracing::info!(thread = %thread_id, run = %run_id, "run cancelled by request");
        run.cancel.cancel();
        ok_json(&state, StatusCode::ACCEPTED, &run.json())
    }))
}

/// The SSE answer following `run` from after event `after`; ends after its `end` event.
fn sse(run: Arc<Run>, after: u64) -> Response {
    struct Follow {
        run: Arc<Run>,
        seq: u64,
        changes: tokio::sync::watch::Receiver<u64>,
        queue: VecDeque<LoggedEvent>,
        ended: bool,
    }
    let changes = run.subscribe();
    let follow = Follow { run, seq: after, changes, queue: VecDeque::new(), ended: false };
    let stream = futures::stream::unfold(follow, |mut follow| async move {
        loop {
            if let Some(event) = follow.queue.pop_front() {
                follow.seq = event.seq;
                follow.ended = event.name == "end";
                let sse = Event::default().id(event.seq.to_string()).event(event.name).data(&*event.data);
                return Some((Ok::<_, Infallible>(sse), follow));
            }
            if follow.ended {
                return None;
            }
            let batch = follow.run.events_after(follow.seq);
            if !batch.is_empty() {
                follow.queue.extend(batch);
                continue;
            }
            if follow.run.is_finished() || follow.changes.changed().await.is_err() {
                return None;
            }
        }
    });
    let mut response = Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response.headers_mut().insert(header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    response
}

//! The handlers of the OpenAI-compatible API: `GET /v1/models`, `GET /v1/models/{model}` and
//! `POST /v1/chat/completions` (one JSON answer, or an SSE stream with keep-alive comments).
//! Each turn runs as its own task that a dropped request cancels; every answer of a conversation
//! known by its nonce opens with the invisible mark its later requests are known by; Open
//! WebUI's background tasks get one direct LLM call instead of a turn.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use peregrine_agent::{Agent, AgentError, Session, TurnOptions, TurnResult, TurnStatus};
use peregrine_core::events::EventKind;
use peregrine_core::{AgentEvent, EventSink};
use peregrine_graph::RunEvent;
use peregrine_llm::{CallOptions, ChatMessage, LlmClient, roles};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::Redact;
use crate::auth::ApiKeys;
use crate::error::{ApiError, json_response};
use crate::limits::{TurnSlot, check_message, drain, read_body};
use crate::progress::{Piece, StatusLines, TurnTrace, Usage};
use crate::request::{BackgroundTask, ChatRequest, Conversation, TurnInput};
use crate::request_log::LoggedThread;

/// How long a stream may send nothing before it sends [`KEEP_ALIVE`], so that proxies do not cut
/// a long turn. (Before the run has started, which acknowledges the message, nothing is sent.)
pub(crate) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// The SSE comment a silent stream sends (clients ignore comments).
const KEEP_ALIVE: &str = ": keep-alive\n\n";
/// The last event of every stream.
const DONE: &str = "data: [DONE]\n\n";
/// The header the official `openai` clients obey before they retry an error answer.
const SHOULD_RETRY: &str = "x-should-retry";
/// The most answer pieces (streamed tokens) a background task's LLM call may produce; the call
/// is stopped there and answered with `finish_reason: "length"`.
pub(crate) const TASK_MAX_TOKENS: usize = 1024;
/// The component a background task's LLM call is made for.
const BACKGROUND_TASK: &str = "background_task";

/// What every handler shares.
pub(crate) struct ServerState {
    pub agent: Arc<Agent>,
    pub model_id: String,
    pub keys: ApiKeys,
    pub body_limits: crate::limits::BodyLimits,
    /// The largest message text (`server.max_message_bytes`).
    pub max_message_bytes: usize,
    /// The places of the turns in flight (`server.max_turns_in_flight`).
    pub turn_slots: crate::limits::TurnSlots,
    pub status_lines: StatusLines,
    /// Unix time of the server's start (the model's `created`).
    pub started_unix: i64,
    /// Threads with a turn running now (both APIs).
    pub busy: Mutex<HashSet<String>>,
    /// Applied to every error text.
    pub redact: crate::Redact,
    /// The native API's runs.
    pub runs: crate::runs::RunRegistry,
    /// Every running turn (chat completions and runs), for a clean shutdown.
    pub tasks: tokio_util::task::TaskTracker,
    /// Cancelled when the server stops: the parent of every turn's cancel token.
    pub stopping: CancellationToken,
}

pub(crate) type Shared = State<Arc<ServerState>>;

/// `GET /v1/models`: the one served model.
pub(crate) async fn models(State(state): Shared, headers: HeaderMap) -> Response {
    if let Err(error) = state.keys.authenticate(&headers) {
        return error.into_response();
    }
    let model = json!({"id": state.model_id, "object": "model", "created": state.started_unix, "owned_by": "peregrine"});
    json_response(StatusCode::OK, &json!({"object": "list", "data": [model]}))
}

/// `GET /v1/models/{model}`: the served model, or 404.
pub(crate) async fn model(State(state): Shared, headers: HeaderMap, axum::extract::Path(model): axum::extract::Path<String>) -> Response {
    if let Err(error) = state.keys.authenticate(&headers) {
        return error.into_response();
    }
    if model != state.model_id {
        return ApiError::model_not_found(&model, &state.model_id).into_response();
    }
    json_response(StatusCode::OK, &json!({"id": state.model_id, "object": "model", "created": state.started_unix, "owned_by": "peregrine"}))
}

/// A known route with another method: 405 with an OpenAI error body.
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}

/// Any other route: 404 with an OpenAI error body.
pub(crate) async fn unknown_route(method: Method, uri: Uri) -> Response {
    ApiError::unknown_url(method.as_str(), uri.path()).into_response()
}

/// `POST /v1/chat/completions`. Every error text is redacted before it is answered or logged;
/// a turn's answer (or refusal) names its thread to the request log.
pub(crate) async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let mut thread = None;
    let mut response = match answer(&state, &headers, body, &mut thread).await {
        Ok(response) => response,
        Err(error) => {
            let error = error.redacted(&state.redact);
            if error.status.is_server_error() {
                tracing::warn!(error = %error.message, "chat completion failed");
            }
            refusal(error)
        }
    };
    if let Some(thread) = thread {
        response.extensions_mut().insert(LoggedThread(thread));
    }
    response
}

/// An error answer. A 500 (the turn failed after it may have written checkpoints) and a 409
/// (`thread_busy`: the turn still runs; `nothing_to_continue`: the same request is refused
/// again) say `x-should-retry: false`: the official clients would otherwise send the same
/// request again on their own.
fn refusal(error: ApiError) -> Response {
    let final_answer = error.status == StatusCode::INTERNAL_SERVER_ERROR || error.status == StatusCode::CONFLICT;
    let mut response = error.into_response();
    if final_answer {
        response.headers_mut().insert(SHOULD_RETRY, HeaderValue::from_static("false"));
    }
    response
}

/// Authenticates, reads and checks the request, then answers a background task directly, or
/// claims the conversation's thread (its id goes into `thread`) and answers with a turn.
async fn answer(state: &Arc<ServerState>, headers: &HeaderMap, body: Body, thread: &mut Option<String>) -> Result<Response, ApiError> {
    let caller = match state.keys.authenticate(headers) {
        Ok(caller) => caller,
        Err(error) => {
            drain(body).await;
            return Err(error);
        }
    };
    let body = read_body(headers, body, &state.body_limits).await?;
    let slot = state.turn_slots.take()?;
    let request = ChatRequest::parse(&body)?;
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    request.check_supported()?;
    if let Some(task) = request.background_task() {
        // A failed task changed nothing: its 500 leaves retrying to the client. Its slot is
        // held until its answer is complete (the answer is not streamed from the call).
        let _slot = slot;
        return Ok(background_task(state, &request, task).await.unwrap_or_else(|error| {
            let error = error.redacted(&state.redact);
            tracing::warn!(error = %error.message, "background task failed");
            error.into_response()
        }));
    }
    let conversation = request.conversation(&caller, headers)?;
    if let TurnInput::Message(text) = &conversation.input {
        check_message(text, state.max_message_bytes, "messages")?;
    }
    *thread = Some(conversation.thread_id.clone());
    let busy = BusyThread::claim(state, &conversation.thread_id)?.holding(slot);
    let continuing = matches!(conversation.input, TurnInput::Continue { .. });
    tracing::info!(
        thread = %conversation.thread_id, identity = ?conversation.identity, stream = request.is_stream(), continuing,
        "chat completion turn starts"
    );
    let opening = crate::continuation::opening(&conversation);
    let turn = RunningTurn::start(Arc::clone(state), conversation, busy);
    if request.is_stream() { stream_answer(state, &request, turn, opening).await } else { json_answer(state, turn, opening).await }
}

/// One of Open WebUI's background tasks (a title, tags, follow-ups, …): one LLM call of the
/// `response` role with the task's prompt alone, stopped after [`TASK_MAX_TOKENS`], answered in
/// the usual shape. No turn runs and no thread is read or written.
async fn background_task(state: &ServerState, request: &ChatRequest, task: BackgroundTask) -> Result<Response, ApiError> {
    tracing::info!(task = %task.name, stream = request.is_stream(), "background task: one direct LLM call, no agent turn");
    let answer = capped_completion(&state.agent.services().llm, task.prompt).await.map_err(|error| {
        ApiError::server_error(format!(
            "The model could not answer this background task ({error}); no conversation changed, send the request again."
        ))
    })?;
    if !request.is_stream() {
        let mut body = completion(&state.model_id, &answer.content, &answer.usage);
        body["choices"][0]["finish_reason"] = json!(answer.finish_reason);
        return Ok(json_response(StatusCode::OK, &body));
    }
    let chunks = Chunks::new(&state.model_id);
    let mut body = chunks.chunk(json!({"role": "assistant"}), None);
    if !answer.content.is_empty() {
        body.push_str(&chunks.chunk(json!({"content": answer.content}), None));
    }
    body.push_str(&chunks.chunk(json!({}), Some(answer.finish_reason)));
    if request.include_usage() {
        body.push_str(&chunks.usage(&answer.usage));
    }
    body.push_str(DONE);
    Ok(sse_response(Body::from(body)))
}

/// A background task's answer.
struct TaskAnswer {
    content: String,
    usage: Usage,
    finish_reason: &'static str,
}

/// `prompt` answered by the `response` role, streamed so that the call can be stopped once it
/// goes past [`TASK_MAX_TOKENS`] pieces (the configuration caps nothing for a caller's prompt);
/// the answer is then its first [`TASK_MAX_TOKENS`] pieces.
async fn capped_completion(llm: &LlmClient, prompt: String) -> Result<TaskAnswer, peregrine_llm::LlmError> {
    let tokens = TaskTokens::default();
    let options = CallOptions { events: Some(&tokens), component: Some(BACKGROUND_TASK) };
    let call = llm.complete_streaming(roles::RESPONSE, vec![ChatMessage::user(prompt)], options);
    // The call is dropped when the limit is passed first: its request is closed, and the
    // provider stops generating.
    let finished = tokio::select! {
        response = call => Some(response?),
        () = tokens.exceeded.notified() => None,
    };
    let received = tokens.taken();
    let usage = finished.as_ref().map_or(Usage { prompt_tokens: 0, completion_tokens: received.pieces as u64 }, |response| Usage {
        prompt_tokens: response.usage.input_tokens.unwrap_or(0),
        completion_tokens: response.usage.output_tokens.unwrap_or(0),
    });
    match finished {
        Some(response) if !received.over => Ok(TaskAnswer { content: response.content, usage, finish_reason: "stop" }),
        _ => {
            tracing::info!(pieces = received.pieces, "a background task's answer was cut at its limit");
            Ok(TaskAnswer { content: received.text, usage, finish_reason: "length" })
        }
    }
}

/// What a background task's call streamed, up to [`TASK_MAX_TOKENS`] pieces.
#[derive(Debug, Default)]
struct Received {
    text: String,
    pieces: usize,
    /// More pieces came than were kept.
    over: bool,
}

/// Collects a background task's streamed answer and says when it goes past [`TASK_MAX_TOKENS`].
#[derive(Default)]
struct TaskTokens {
    received: Mutex<Received>,
    exceeded: Notify,
}

impl TaskTokens {
    fn taken(&self) -> Received {
        std::mem::take(&mut *self.received.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl EventSink for TaskTokens {
    fn emit(&self, event: AgentEvent) {
        let EventKind::LlmToken { content, .. } = event.kind else { return };
        let mut received = self.received.lock().unwrap_or_else(PoisonError::into_inner);
        if received.pieces < TASK_MAX_TOKENS {
            received.text.push_str(&content);
            received.pieces += 1;
        } else if !received.over {
            received.over = true;
            self.exceeded.notify_one();
        }
    }
}

/// Marks a thread busy until dropped (when its turn task ends); both APIs claim it, so a thread
/// never runs two turns of this process at once.
pub(crate) struct BusyThread {
    state: Arc<ServerState>,
    thread_id: String,
    /// The turn's place among those in flight, given back with the thread.
    slot: Option<TurnSlot>,
}

impl BusyThread {
    /// Claims `thread_id`, or 409 `thread_busy` when a turn of this process holds it.
    pub(crate) fn claim(state: &Arc<ServerState>, thread_id: &str) -> Result<Self, ApiError> {
        let mut busy = state.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.insert(thread_id.to_owned()) {
            return Err(ApiError::thread_busy());
        }
        Ok(Self { state: Arc::clone(state), thread_id: thread_id.to_owned(), slot: None })
    }

    /// The same claim, also holding the turn's place among those in flight.
    pub(crate) fn holding(mut self, slot: TurnSlot) -> Self {
        self.slot = Some(slot);
        self
    }
}

impl Drop for BusyThread {
    fn drop(&mut self) {
        self.state.busy.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.thread_id);
        // The place is free once the thread is, never before.
        self.slot.take();
    }
}

type TurnOutcome = Result<TurnResult, ApiError>;

/// A turn running in its own task; dropping this cancels it (the last checkpoint stays).
struct RunningTurn {
    events: UnboundedReceiver<RunEvent<AgentEvent>>,
    ended: oneshot::Receiver<Result<TurnResult, AgentError>>,
    ended_seen: bool,
    outcome: Option<TurnOutcome>,
    _cancel_on_drop: DropGuard,
}

impl RunningTurn {
    fn start(state: Arc<ServerState>, conversation: Conversation, busy: BusyThread) -> Self {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let cancel = state.stopping.child_token();
        let options = TurnOptions { events: Some(sender), cancel: cancel.clone() };
        let Conversation { thread_id, input, shown, session, .. } = conversation;
        let (ended_sender, ended) = oneshot::channel();
        let tasks = state.tasks.clone();
        tasks.spawn(async move {
            let _busy = busy;
            let result = send(&state, &thread_id, input, shown.as_deref(), &session, options).await;
            let _ = ended_sender.send(result);
        });
        Self { events, ended, ended_seen: false, outcome: None, _cancel_on_drop: cancel.drop_guard() }
    }

    /// The turn's next event; `None` once it has ended and every event was read. Cancel-safe.
    async fn next_event(&mut self) -> Option<RunEvent<AgentEvent>> {
        loop {
            if self.ended_seen {
                return self.events.try_recv().ok();
            }
            tokio::select! {
                biased;
                Some(event) = self.events.recv() => return Some(event),
                ended = &mut self.ended => {
                    self.ended_seen = true;
                    self.outcome = Some(match ended {
                        Ok(result) => result.map_err(ApiError::from),
                        Err(_) => Err(ApiError::server_error("The turn stopped unexpectedly; its last checkpoint is kept, send the message again.")),
                    });
                }
            }
        }
    }

    /// How the turn ended (after [`RunningTurn::next_event`] returned `None`).
    fn take_outcome(&mut self) -> TurnOutcome {
        self.outcome
            .take()
            .unwrap_or_else(|| Err(ApiError::server_error("The turn's outcome was already taken; this is a bug in the server.")))
    }
}

/// Runs the request's turn: finishes the cut-off turn for a continuation (refused with 409
/// `nothing_to_continue` when there is none), else sends the message, which answers a pending
/// approval only when `shown` (the answer the person saw) holds its question.
async fn send(
    state: &ServerState,
    thread_id: &str,
    input: TurnInput,
    shown: Option<&str>,
    session: &Session,
    options: TurnOptions,
) -> Result<TurnResult, AgentError> {
    let agent = &state.agent;
    let input = match input {
        TurnInput::Message(text) => text,
        TurnInput::Continue { .. } => {
            tracing::info!(thread = %thread_id, "continuing the conversation's cut-off turn");
            let result = crate::native::retry_while_held(&options.cancel, || agent.continue_turn(thread_id, options.clone())).await;
            log_end(state, thread_id, &result);
            return result;
        }
    };
    // An approval answered in a turn that was then cut off (the client disconnected right
    // after "yes") holds an answer its node has not taken yet: the engine takes no new run on
    // such a thread, and the message is refused (409 `unfinished_run`), never answered with
    // that turn's result as if it had been taken; Continue Response finishes the approved
    // action. Any other cut-off turn is simply left behind by the new message.
    let result =
        crate::native::retry_while_held(&options.cancel, || agent.send_after(thread_id, &input, shown, session, options.clone())).await;
    log_end(state, thread_id, &result);
    result
}

fn log_end(state: &ServerState, thread_id: &str, result: &Result<TurnResult, AgentError>) {
    match result {
        Ok(turn) => tracing::info!(thread = %thread_id, status = ?turn.status, "chat completion turn ended"),
        Err(error) => tracing::warn!(thread = %thread_id, error = %(state.redact)(&error.to_string()), "chat completion turn failed"),
    }
}

/// The text of a turn that has no response of its own.
fn fallback_text(result: &TurnResult) -> Option<&'static str> {
    match result.status {
        TurnStatus::InterfaceCommand => Some("This command works only in the terminal chat (peregrine chat)."),
        TurnStatus::Exit => Some("There is nothing to leave here; start a new chat instead."),
        TurnStatus::Cancelled => Some("The turn was stopped; your message is kept. Continue the answer (Continue Response) to finish it."),
        _ => None,
    }
}

/// The text a turn answers with; an error report is redacted (it may quote a provider's or the
/// store's error).
fn response_text(result: &TurnResult, redact: &Redact) -> Option<String> {
    let text = result.response.clone().or_else(|| fallback_text(result).map(str::to_owned))?;
    Some(if result.status == TurnStatus::Failed { redact(&text) } else { text })
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A `chat.completion` answer.
fn completion(model: &str, content: &str, usage: &Usage) -> Value {
    json!({
        "id": format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()), "object": "chat.completion", "created": now_unix(), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": usage.json(),
    })
}

/// The non-stream answer; `opening` (the conversation's mark and a blank line, or a continued
/// answer's note) opens its content.
async fn json_answer(state: &ServerState, mut turn: RunningTurn, opening: Option<String>) -> Result<Response, ApiError> {
    let mut trace = TurnTrace::new(StatusLines::Off, None);
    while let Some(event) = turn.next_event().await {
        trace.observe(&event);
    }
    let result = turn.take_outcome()?;
    let text = response_text(&result, &state.redact).unwrap_or_default();
    let content = match opening {
        Some(opening) => format!("{opening}{text}"),
        None => text,
    };
    Ok(json_response(StatusCode::OK, &completion(&state.model_id, &content, &trace.usage)))
}

fn sse_response(body: Body) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no")),
    ];
    (StatusCode::OK, headers, body).into_response()
}

/// The streamed answer. See [`wait_for_start`] for when it begins.
async fn stream_answer(
    state: &ServerState,
    request: &ChatRequest,
    mut turn: RunningTurn,
    opening: Option<String>,
) -> Result<Response, ApiError> {
    let held = wait_for_start(&mut turn).await?;
    let trace = TurnTrace::new(state.status_lines, opening);
    let sse = SseTurn::new(Chunks::new(&state.model_id), request.include_usage(), trace, held, turn, Arc::clone(&state.redact));
    let stream =
        futures::stream::unfold(sse, |mut sse| async move { sse.next_bytes().await.map(|bytes| (Ok::<_, std::io::Error>(bytes), sse)) });
    Ok(sse_response(Body::from_stream(stream)))
}

/// The turn's events until its run starts, held back: the response's first byte acknowledges the
/// message, so it is sent only once the run has started, which the engine announces after the
/// input is durable in the checkpoint store. A message the gateway refuses, or a thread another
/// process holds, is answered with an HTTP error instead.
async fn wait_for_start(turn: &mut RunningTurn) -> Result<VecDeque<RunEvent<AgentEvent>>, ApiError> {
    let mut held = VecDeque::new();
    loop {
        match turn.next_event().await {
            Some(event) => {
                let started = matches!(event, RunEvent::RunStarted { .. });
                held.push_back(event);
                if started {
                    return Ok(held);
                }
            }
            None => {
                if let Some(Err(error)) = &turn.outcome {
                    return Err(error.clone());
                }
                return Ok(held);
            }
        }
    }
}

/// What every chunk of one streamed answer shares: the id, the creation time and the model.
struct Chunks {
    id: String,
    created: i64,
    model: String,
}

impl Chunks {
    fn new(model: &str) -> Self {
        Self { id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()), created: now_unix(), model: model.to_owned() }
    }

    /// A `chat.completion.chunk` event with one choice.
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> String {
        event(&json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }))
    }

    /// The usage event: no choices.
    fn usage(&self, usage: &Usage) -> String {
        event(&json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [], "usage": usage.json(),
        }))
    }
}

/// One streamed answer of a turn.
struct SseTurn {
    chunks: Chunks,
    include_usage: bool,
    trace: TurnTrace,
    held: VecDeque<RunEvent<AgentEvent>>,
    turn: RunningTurn,
    started: bool,
    done: bool,
    keep_alive: Duration,
    /// When the stream last sent bytes: a keep-alive follows [`SseTurn::keep_alive`] later,
    /// whatever happened meanwhile that sent nothing.
    last_write: Instant,
    redact: Redact,
}

impl SseTurn {
    fn new(
        chunks: Chunks,
        include_usage: bool,
        trace: TurnTrace,
        held: VecDeque<RunEvent<AgentEvent>>,
        turn: RunningTurn,
        redact: Redact,
    ) -> Self {
        Self {
            chunks,
            include_usage,
            trace,
            held,
            turn,
            started: false,
            done: false,
            keep_alive: KEEP_ALIVE_INTERVAL,
            last_write: Instant::now(),
            redact,
        }
    }

    /// Chunks for `pieces`: `content` deltas, and `reasoning_content` deltas for progress shown
    /// as reasoning.
    fn content(&self, pieces: &[Piece]) -> String {
        let delta = |piece: &Piece| match piece {
            Piece::Content(text) => json!({"content": text}),
            Piece::Reasoning(text) => json!({"reasoning_content": text}),
        };
        pieces.iter().map(|piece| self.chunks.chunk(delta(piece), None)).collect()
    }

    /// `text` as the next bytes, noting the time.
    fn written(&mut self, text: String) -> Option<Bytes> {
        self.last_write = Instant::now();
        Some(Bytes::from(text))
    }

    /// The next bytes of the stream; `None` after `[DONE]`.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            let opening = self.trace.opening();
            let first = self.chunks.chunk(json!({"role": "assistant"}), None) + &self.content(&opening);
            return self.written(first);
        }
        loop {
            let next = match self.held.pop_front() {
                Some(event) => Some(event),
                None => match tokio::time::timeout_at(self.last_write + self.keep_alive, self.turn.next_event()).await {
                    Ok(next) => next,
                    Err(_silent) => return self.written(KEEP_ALIVE.to_owned()),
                },
            };
            let Some(run_event) = next else { break };
            let pieces = self.trace.observe(&run_event);
            if !pieces.is_empty() {
                let content = self.content(&pieces);
                return self.written(content);
            }
        }
        self.done = true;
        let outcome = self.turn.take_outcome();
        let end = self.finish(outcome);
        self.written(end)
    }

    /// The end: the response text if it was not streamed; `finish_reason: "stop"`, usage and
    /// `[DONE]`; or an error event when the turn failed after the stream began.
    fn finish(&mut self, outcome: TurnOutcome) -> String {
        let closing = match &outcome {
            Ok(result) => {
                let response = response_text(result, &self.redact);
                self.trace.closing_text(response.as_deref(), result.status == TurnStatus::Failed)
            }
            Err(_) => None,
        };
        let mut out = closing.map(|text| self.content(&[Piece::Content(text)])).unwrap_or_default();
        match outcome {
            Ok(_) => {
                out.push_str(&self.chunks.chunk(json!({}), Some("stop")));
                if self.include_usage {
                    out.push_str(&self.chunks.usage(&self.trace.usage));
                }
            }
            Err(error) => out.push_str(&event(&error.redacted(&self.redact).body())),
        }
        out.push_str(DONE);
        out
    }
}

fn event(data: &Value) -> String {
    format!("data: {data}\n\n")
}

#[cfg(test)]
mod tests {
    use peregrine_core::events::EventKind;
    use tokio::sync::mpsc::UnboundedSender;

    use super::*;

    type Ended = oneshot::Sender<Result<TurnResult, AgentError>>;

    const MARK: &str = "\u{2060}\u{200B}\u{200C}";

    /// A turn whose events and end the test sends itself.
    fn fake_turn() -> (RunningTurn, UnboundedSender<RunEvent<AgentEvent>>, Ended) {
        let (events_sender, events) = tokio::sync::mpsc::unbounded_channel();
        let (ended_sender, ended) = oneshot::channel();
        let turn = RunningTurn { events, ended, ended_seen: false, outcome: None, _cancel_on_drop: CancellationToken::new().drop_guard() };
        (turn, events_sender, ended_sender)
    }

    fn sse(turn: RunningTurn, redact: Redact) -> SseTurn {
        SseTurn::new(Chunks::new("m"), false, TurnTrace::new(StatusLines::Content, None), VecDeque::new(), turn, redact)
    }

    fn token(text: &str) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new("respond", EventKind::LlmToken { role: "response".into(), content: text.into() }))
    }

    /// An event that adds nothing to the answer.
    fn quiet() -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::status("classifier", peregrine_core::events::StatusLevel::Info, "thinking"))
    }

    fn ended(status: TurnStatus, response: &str) -> Result<TurnResult, AgentError> {
        Ok(TurnResult::text(status, response))
    }

    fn text(bytes: Option<Bytes>) -> String {
        String::from_utf8(bytes.expect("more bytes").to_vec()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_sends_keep_alive_comments() {
        let (turn, events, end) = fake_turn();
        let mut sse = sse(turn, Arc::new(str::to_owned));
        assert!(text(sse.next_bytes().await).contains(r#""delta":{"role":"assistant"}"#));
        let waited = Instant::now();
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE, "nothing happened for a while");
        assert_eq!(waited.elapsed(), KEEP_ALIVE_INTERVAL);
        events.send(token("Hi")).unwrap();
        assert!(text(sse.next_bytes().await).contains(r#""content":"Hi""#), "an event comes through at once");
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE);
        end.send(ended(TurnStatus::Completed, "Hi")).unwrap();
        let last = text(sse.next_bytes().await);
        assert!(last.contains(r#""finish_reason":"stop""#) && last.ends_with(DONE), "{last}");
        assert!(!last.contains("Hi"), "the streamed answer is not sent twice: {last}");
        assert!(sse.next_bytes().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn events_that_send_nothing_do_not_put_off_the_keep_alive() {
        let (turn, events, _end) = fake_turn();
        let mut sse = sse(turn, Arc::new(str::to_owned));
        sse.next_bytes().await;
        let written = Instant::now();
        // Something happens every 10 s, but nothing the client sees.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if events.send(quiet()).is_err() {
                    break;
                }
            }
        });
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE);
        assert_eq!(written.elapsed(), KEEP_ALIVE_INTERVAL, "15 s after the last bytes, not after the last event");
        let written = Instant::now();
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE);
        assert_eq!(written.elapsed(), KEEP_ALIVE_INTERVAL);
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_waits_for_the_durable_start_and_a_refused_turn_is_answered_at_once() {
        let (turn, events, _end) = fake_turn();
        events.send(quiet()).unwrap();
        let waiting = tokio::spawn(async move {
            let mut turn = turn;
            wait_for_start(&mut turn).await.map(|held| held.len())
        });
        // However long the gateway takes, nothing is acknowledged before the run has started.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!waiting.is_finished(), "no response before the run started");
        events.send(RunEvent::RunStarted { thread_id: "t".into(), run_id: "r".into() }).unwrap();
        events.send(token("later")).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), 2, "held: the quiet event and the start");

        let (mut turn, _events, end) = fake_turn();
        end.send(Err(AgentError::Run(peregrine_graph::RunError::Checkpoint(peregrine_graph::CheckpointError::ThreadBusy {
            thread_id: "t".into(),
        }))))
        .unwrap();
        let refused = wait_for_start(&mut turn).await.unwrap_err();
        assert_eq!((refused.status.as_u16(), refused.code), (409, Some("thread_busy")));
    }

    #[tokio::test]
    async fn the_mark_and_a_blank_line_are_the_first_content_chunk_after_the_role() {
        for status_lines in [StatusLines::Off, StatusLines::Content, StatusLines::Reasoning] {
            let (turn, events, end) = fake_turn();
            let trace = TurnTrace::new(status_lines, Some(format!("{MARK}\n\n")));
            let mut stream = SseTurn::new(Chunks::new("m"), false, trace, VecDeque::new(), turn, Arc::new(str::to_owned));
            let first = text(stream.next_bytes().await);
            let chunks: Vec<Value> = first
                .split("\n\n")
                .filter_map(|event| event.strip_prefix("data: "))
                .map(|data| serde_json::from_str(data).unwrap())
                .collect();
            assert_eq!(chunks.len(), 2, "{first}");
            assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant"}));
            assert_eq!(chunks[1]["choices"][0]["delta"], json!({"content": format!("{MARK}\n\n")}), "status lines {status_lines:?}");
            events.send(RunEvent::NodeStarted { node: peregrine_agent::ORCHESTRATOR.into(), step: 1 }).unwrap();
            events.send(token("Hi")).unwrap();
            let mut rest = String::new();
            end.send(ended(TurnStatus::Completed, "Hi")).unwrap();
            while let Some(bytes) = stream.next_bytes().await {
                rest.push_str(std::str::from_utf8(&bytes).unwrap());
            }
            assert!(!rest.contains(MARK) && rest.contains(r#""content":"Hi""#), "sent once: {rest}");
        }

        // A turn that fails after the stream began: the mark was sent first all the same.
        let (turn, _events, end) = fake_turn();
        let trace = TurnTrace::new(StatusLines::Content, Some(format!("{MARK}\n\n")));
        let mut stream = SseTurn::new(Chunks::new("m"), false, trace, VecDeque::new(), turn, Arc::new(str::to_owned));
        assert!(text(stream.next_bytes().await).contains(MARK));
        let storage = peregrine_graph::CheckpointError::Corrupt { thread_id: "t".into(), reason: "unreadable".into() };
        end.send(Err(AgentError::Run(peregrine_graph::RunError::Checkpoint(storage)))).unwrap();
        let last = text(stream.next_bytes().await);
        assert!(last.contains(r#"{"error":"#) && !last.contains(MARK), "{last}");
    }

    #[tokio::test]
    async fn a_failed_turns_report_and_error_events_are_redacted() {
        let redact: Redact = Arc::new(|text: &str| text.replace("pa55word", "[REDACTED]"));
        let (turn, _events, end) = fake_turn();
        let mut stream = sse(turn, Arc::clone(&redact));
        stream.next_bytes().await;
        end.send(ended(TurnStatus::Failed, "postgres://user:pa55word@db refused the connection")).unwrap();
        let last = text(stream.next_bytes().await);
        assert!(last.contains("[REDACTED]") && !last.contains("pa55word"), "{last}");

        let (turn, _events, end) = fake_turn();
        let mut stream = sse(turn, redact);
        stream.next_bytes().await;
        let storage = peregrine_graph::CheckpointError::Corrupt { thread_id: "t".into(), reason: "pa55word".into() };
        end.send(Err(AgentError::Run(peregrine_graph::RunError::Checkpoint(storage)))).unwrap();
        let last = text(stream.next_bytes().await);
        assert!(last.contains(r#"data: {"error":"#) && last.contains("[REDACTED]") && !last.contains("pa55word"), "{last}");
    }

    #[test]
    fn failed_turns_and_busy_threads_are_not_retried_by_clients() {
        let should_retry = |error: ApiError| refusal(error).headers().get(SHOULD_RETRY).map(|value| value.to_str().unwrap().to_owned());
        assert_eq!(should_retry(ApiError::thread_busy()).as_deref(), Some("false"));
        assert_eq!(should_retry(ApiError::server_error("failed")).as_deref(), Some("false"));
        assert_eq!(should_retry(ApiError::invalid_messages("x")), None);
        assert_eq!(should_retry(ApiError::conflict("nothing_to_continue", "x")).as_deref(), Some("false"));
        assert_eq!(should_retry(ApiError::invalid_request("x")), None);
    }

    #[tokio::test]
    async fn a_background_tasks_answer_stops_at_its_limit() {
        let tokens = TaskTokens::default();
        let piece = |number: usize| {
            AgentEvent::new(BACKGROUND_TASK, EventKind::LlmToken { role: "response".into(), content: format!("{number} ") })
        };
        for number in 0..TASK_MAX_TOKENS {
            tokens.emit(piece(number));
        }
        let (text, pieces, over) = {
            let received = tokens.received.lock().unwrap();
            (received.text.clone(), received.pieces, received.over)
        };
        assert_eq!((pieces, over), (TASK_MAX_TOKENS, false), "as many as allowed: {text}");
        for number in TASK_MAX_TOKENS..TASK_MAX_TOKENS + 5 {
            tokens.emit(piece(number));
        }
        tokio::time::timeout(Duration::from_secs(5), tokens.exceeded.notified()).await.expect("passing the limit is announced");
        let received = tokens.taken();
        assert_eq!((received.pieces, received.over), (TASK_MAX_TOKENS, true));
        assert!(received.text.ends_with(&format!(" {} ", TASK_MAX_TOKENS - 1)), "nothing past the limit: {}", received.text);
    }
}

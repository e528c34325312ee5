//! The handlers of the OpenAI-compatible API: `GET /v1/models`, `GET /v1/models/{model}` and
//! `POST /v1/chat/completions` (one JSON answer, or an SSE stream with keep-alive comments).
//! Each turn runs as its own task that a dropped request cancels; a conversation's first turn is
//! filed under the thread id its first exchange derives; Open WebUI's background tasks get one
//! direct LLM call instead of a turn.

mod filing;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use peregrine_agent::{Agent, AgentError, Session, TurnOptions, TurnResult, TurnStatus};
use peregrine_core::AgentEvent;
use peregrine_graph::RunEvent;
use peregrine_llm::{CallOptions, roles};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use self::filing::Filing;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::Redact;
use crate::auth::ApiKeys;
use crate::error::{ApiError, json_response};
use crate::progress::{TurnTrace, Usage};
use crate::request::{ChatRequest, Conversation};

/// How long a stream may send nothing before it sends [`KEEP_ALIVE`], so that proxies do not cut
/// a long turn.
pub(crate) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// The SSE comment a silent stream sends (clients ignore comments).
const KEEP_ALIVE: &str = ": keep-alive\n\n";
/// The last event of every stream.
const DONE: &str = "data: [DONE]\n\n";

/// What every handler shares.
pub(crate) struct ServerState {
    pub agent: Arc<Agent>,
    pub model_id: String,
    pub keys: ApiKeys,
    pub max_body_bytes: usize,
    pub status_lines: bool,
    /// Unix time of the server's start (the model's `created`).
    pub started_unix: i64,
    /// Threads with a turn running now (both APIs).
    pub busy: Mutex<HashSet<String>>,
    /// Applied to every error text.
    pub redact: crate::Redact,
    /// `<agent_data_dir>`, for the pending plan files of deleted threads.
    pub agent_data_dir: Option<std::path::PathBuf>,
    /// The native API's runs.
    pub runs: crate::runs::RunRegistry,
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

/// `POST /v1/chat/completions`. Every error text is redacted before it is answered or logged.
pub(crate) async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    match answer(&state, &headers, body).await {
        Ok(response) => response,
        Err(error) => {
            let error = error.redacted(&state.redact);
            if error.status.is_server_error() {
                tracing::warn!(error = %error.message, "chat completion failed");
            }
            error.into_response()
        }
    }
}

/// Authenticates, reads and checks the request, then answers a background task directly, or
/// claims the conversation's thread and answers with a turn.
async fn answer(state: &Arc<ServerState>, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let caller = state.keys.authenticate(headers)?;
    let body = read_body(headers, body, state.max_body_bytes).await?;
    let request = ChatRequest::parse(&body)?;
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    request.check_supported()?;
    if let Some(task) = request.background_task() {
        return background_task(state, &request, &task).await;
    }
    let conversation = request.conversation(&caller, headers)?;
    let busy = BusyThread::claim(state, &conversation.thread_id)?;
    tracing::info!(
        thread = %conversation.thread_id, first_turn = conversation.first_turn.is_some(), stream = request.is_stream(),
        "chat completion turn starts"
    );
    let turn = RunningTurn::start(Arc::clone(state), conversation, busy);
    if request.is_stream() { stream_answer(state, &request, turn).await } else { json_answer(state, turn).await }
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()).and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::body_too_large(limit))
}

/// One of Open WebUI's background tasks (a title, tags, follow-ups, …): one LLM call of the
/// `response` role with the request's messages as they are, answered in the usual shape. No
/// turn runs and no thread is read or written.
async fn background_task(state: &ServerState, request: &ChatRequest, task: &str) -> Result<Response, ApiError> {
    let messages = request.llm_messages()?;
    tracing::info!(task, stream = request.is_stream(), "background task: one direct LLM call, no agent turn");
    let response = state.agent.services().llm.complete(roles::RESPONSE, messages, CallOptions::default()).await.map_err(|error| {
        ApiError::server_error(format!(
            "The model could not answer this background task ({error}); no conversation changed, send the request again."
        ))
    })?;
    let usage =
        Usage { prompt_tokens: response.usage.input_tokens.unwrap_or(0), completion_tokens: response.usage.output_tokens.unwrap_or(0) };
    if !request.is_stream() {
        return Ok(json_response(StatusCode::OK, &completion(&state.model_id, &response.content, &usage)));
    }
    let chunks = Chunks::new(&state.model_id);
    let mut body = chunks.chunk(json!({"role": "assistant"}), None);
    if !response.content.is_empty() {
        body.push_str(&chunks.chunk(json!({"content": response.content}), None));
    }
    body.push_str(&chunks.chunk(json!({}), Some("stop")));
    if request.include_usage() {
        body.push_str(&chunks.usage(&usage));
    }
    body.push_str(DONE);
    Ok(sse_response(Body::from(body)))
}

/// Marks a thread busy until dropped (when its turn task ends); both APIs claim it, so a thread
/// never runs two turns of this process at once.
pub(crate) struct BusyThread {
    state: Arc<ServerState>,
    thread_id: String,
}

impl BusyThread {
    /// Claims `thread_id`, or 409 `thread_busy` when a turn of this process holds it.
    pub(crate) fn claim(state: &Arc<ServerState>, thread_id: &str) -> Result<Self, ApiError> {
        let mut busy = state.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !busy.insert(thread_id.to_owned()) {
            return Err(ApiError::thread_busy());
        }
        Ok(Self { state: Arc::clone(state), thread_id: thread_id.to_owned() })
    }
}

impl Drop for BusyThread {
    fn drop(&mut self) {
        self.state.busy.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.thread_id);
    }
}

type TurnOutcome = Result<TurnResult, ApiError>;

/// A turn running in its own task; dropping this cancels it (the last checkpoint stays).
struct RunningTurn {
    thread_id: String,
    events: UnboundedReceiver<RunEvent<AgentEvent>>,
    ended: oneshot::Receiver<Result<TurnResult, AgentError>>,
    ended_seen: bool,
    outcome: Option<TurnOutcome>,
    /// For a conversation's first turn: where the content sent goes.
    filing: Option<Filing>,
    _cancel_on_drop: DropGuard,
}

impl RunningTurn {
    fn start(state: Arc<ServerState>, conversation: Conversation, busy: BusyThread) -> Self {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let options = TurnOptions { events: Some(sender), cancel: cancel.clone() };
        let Conversation { thread_id, first_turn, input, session } = conversation;
        let task_thread_id = thread_id.clone();
        let (ended_sender, ended) = oneshot::channel();
        let (filing, filer) = first_turn.map(filing::channel).unzip();
        tokio::spawn(async move {
            let _busy = busy;
            let result = send(&state, &task_thread_id, &input, &session, options).await;
            // The answer needs the outcome for its last content, and only then reports it.
            let _ = ended_sender.send(result);
            if let Some(filer) = filer {
                filer.file(&state, &task_thread_id).await;
            }
        });
        Self { thread_id, events, ended, ended_seen: false, outcome: None, filing, _cancel_on_drop: cancel.drop_guard() }
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

    /// Notes content sent to the client: a first turn's thread is filed under what it derives.
    fn sent(&mut self, text: &str) {
        if let Some(filing) = &mut self.filing {
            filing.push(text);
        }
    }

    /// For a first turn: hands the complete answer to the turn's task and waits until the
    /// thread is filed (see [`Filing::finish`]); other turns get `last` back as is.
    async fn file(&mut self, last: Option<String>) -> Option<String> {
        match self.filing.take() {
            Some(filing) => filing.finish(&self.thread_id, last).await,
            None => last,
        }
    }
}

async fn send(
    state: &ServerState,
    thread_id: &str,
    input: &str,
    session: &Session,
    options: TurnOptions,
) -> Result<TurnResult, AgentError> {
    let agent = &state.agent;
    // An approval answered in a turn that was then cut off (the client disconnected right
    // after "yes") holds an answer its node has not taken yet: the engine takes no new run on
    // such a thread, so the approved action is finished first, from its last checkpoint, and
    // its result is this request's answer (the new message is not sent). Any other cut-off
    // turn is simply left behind by the new message.
    let snapshot = agent.graph().get_state(thread_id).await?;
    if snapshot.as_ref().is_some_and(|snapshot| snapshot.meta.resume.is_some()) {
        tracing::info!(thread = %thread_id, "finishing the conversation's cut-off turn before anything else");
        return agent.continue_turn(thread_id, options).await;
    }
    let result = agent.send(thread_id, input, session, options).await;
    match &result {
        Ok(turn) => tracing::info!(thread = %thread_id, status = ?turn.status, "chat completion turn ended"),
        Err(error) => tracing::warn!(thread = %thread_id, error = %(state.redact)(&error.to_string()), "chat completion turn failed"),
    }
    result
}

/// The text of a turn that has no response of its own.
fn fallback_text(result: &TurnResult) -> Option<&'static str> {
    match result.status {
        TurnStatus::InterfaceCommand => Some("This command works only in the terminal chat (peregrine chat)."),
        TurnStatus::Exit => Some("There is nothing to leave here; start a new chat instead."),
        TurnStatus::Cancelled => Some("The turn was cancelled; send the message again to continue."),
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

/// The non-stream answer.
async fn json_answer(state: &ServerState, mut turn: RunningTurn) -> Result<Response, ApiError> {
    let mut trace = TurnTrace::new(false);
    while let Some(event) = turn.next_event().await {
        trace.observe(&event);
    }
    let result = turn.take_outcome()?;
    let content = turn.file(response_text(&result, &state.redact)).await.unwrap_or_default();
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

/// The streamed answer. Events are held back until the run starts, so that a message the
/// gateway refuses is still answered with an HTTP error.
async fn stream_answer(state: &ServerState, request: &ChatRequest, mut turn: RunningTurn) -> Result<Response, ApiError> {
    let mut held = VecDeque::new();
    loop {
        match turn.next_event().await {
            Some(event) => {
                let started = matches!(event, RunEvent::RunStarted { .. } | RunEvent::NodeStarted { .. });
                held.push_back(event);
                if started {
                    break;
                }
            }
            None => {
                if let Some(Err(error)) = &turn.outcome {
                    return Err(error.clone());
                }
                break;
            }
        }
    }
    let trace = TurnTrace::new(state.status_lines);
    let sse = SseTurn::new(Chunks::new(&state.model_id), request.include_usage(), trace, held, turn, Arc::clone(&state.redact));
    let stream =
        futures::stream::unfold(sse, |mut sse| async move { sse.next_bytes().await.map(|bytes| (Ok::<_, std::io::Error>(bytes), sse)) });
    Ok(sse_response(Body::from_stream(stream)))
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
    role_sent: bool,
    done: bool,
    keep_alive: Duration,
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
        Self { chunks, include_usage, trace, held, turn, role_sent: false, done: false, keep_alive: KEEP_ALIVE_INTERVAL, redact }
    }

    /// Content chunks for `pieces`, noted as sent.
    fn content(&mut self, pieces: &[String]) -> String {
        let mut out = String::new();
        for piece in pieces {
            self.turn.sent(piece);
            out.push_str(&self.chunks.chunk(json!({"content": piece}), None));
        }
        out
    }

    /// The next bytes of the stream; `None` after `[DONE]`.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.role_sent {
            self.role_sent = true;
            return Some(Bytes::from(self.chunks.chunk(json!({"role": "assistant"}), None)));
        }
        loop {
            let next = match self.held.pop_front() {
                Some(event) => Some(event),
                None => match tokio::time::timeout(self.keep_alive, self.turn.next_event()).await {
                    Ok(next) => next,
                    Err(_silent) => return Some(Bytes::from_static(KEEP_ALIVE.as_bytes())),
                },
            };
            let Some(run_event) = next else { break };
            let pieces = self.trace.observe(&run_event);
            if !pieces.is_empty() {
                return Some(Bytes::from(self.content(&pieces)));
            }
        }
        self.done = true;
        let outcome = self.turn.take_outcome();
        Some(Bytes::from(self.finish(outcome).await))
    }

    /// The end: the response text if it was not streamed (a first turn's thread is filed
    /// before the client sees it, so its next request finds it), `finish_reason: "stop"`, usage
    /// and `[DONE]`; or an error event when the turn failed after the stream began.
    async fn finish(&mut self, outcome: TurnOutcome) -> String {
        let mut out = String::new();
        let closing = outcome.as_ref().ok().and_then(|result| {
            let response = response_text(result, &self.redact);
            self.trace.closing_text(response.as_deref(), result.status == TurnStatus::Failed)
        });
        if let Some(text) = self.turn.file(closing).await {
            out.push_str(&self.content(&[text]));
        }
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

    const FRESH: &str = "oai-0123456789ab-0123456789abcdef";

    /// A turn whose events and end the test sends itself.
    fn fake_turn(filing: Option<Filing>) -> (RunningTurn, UnboundedSender<RunEvent<AgentEvent>>, Ended) {
        let (events_sender, events) = tokio::sync::mpsc::unbounded_channel();
        let (ended_sender, ended) = oneshot::channel();
        let turn = RunningTurn {
            thread_id: FRESH.to_owned(),
            events,
            ended,
            ended_seen: false,
            outcome: None,
            filing,
            _cancel_on_drop: CancellationToken::new().drop_guard(),
        };
        (turn, events_sender, ended_sender)
    }

    fn sse(turn: RunningTurn, redact: Redact) -> SseTurn {
        SseTurn::new(Chunks::new("m"), false, TurnTrace::new(true), VecDeque::new(), turn, redact)
    }

    fn token(text: &str) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new("respond", EventKind::LlmToken { role: "response".into(), content: text.into() }))
    }

    fn ended(status: TurnStatus, response: &str) -> Result<TurnResult, AgentError> {
        Ok(TurnResult { status, response: Some(response.into()), interrupt: None, command: None, state: None })
    }

    fn text(bytes: Option<Bytes>) -> String {
        String::from_utf8(bytes.expect("more bytes").to_vec()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_sends_keep_alive_comments() {
        let (turn, events, end) = fake_turn(None);
        let mut sse = sse(turn, Arc::new(str::to_owned));
        assert!(text(sse.next_bytes().await).contains(r#""delta":{"role":"assistant"}"#));
        let waited = tokio::time::Instant::now();
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE, "nothing happened for a while");
        assert!(waited.elapsed() >= KEEP_ALIVE_INTERVAL);
        events.send(token("Hi")).unwrap();
        assert!(text(sse.next_bytes().await).contains(r#""content":"Hi""#), "an event comes through at once");
        assert_eq!(text(sse.next_bytes().await), KEEP_ALIVE);
        end.send(ended(TurnStatus::Completed, "Hi")).unwrap();
        let last = text(sse.next_bytes().await);
        assert!(last.contains(r#""finish_reason":"stop""#) && last.ends_with(DONE), "{last}");
        assert!(!last.contains("Hi"), "the streamed answer is not sent twice: {last}");
        assert!(sse.next_bytes().await.is_none());
    }

    #[tokio::test]
    async fn a_failed_turns_report_and_error_events_are_redacted() {
        let redact: Redact = Arc::new(|text: &str| text.replace("pa55word", "[REDACTED]"));
        let (turn, _events, end) = fake_turn(None);
        let mut stream = sse(turn, Arc::clone(&redact));
        stream.next_bytes().await;
        end.send(ended(TurnStatus::Failed, "postgres://user:pa55word@db refused the connection")).unwrap();
        let last = text(stream.next_bytes().await);
        assert!(last.contains("[REDACTED]") && !last.contains("pa55word"), "{last}");

        let (turn, _events, end) = fake_turn(None);
        let mut stream = sse(turn, redact);
        stream.next_bytes().await;
        let storage = peregrine_graph::CheckpointError::Corrupt { thread_id: "t".into(), reason: "pa55word".into() };
        end.send(Err(AgentError::Run(peregrine_graph::RunError::Checkpoint(storage)))).unwrap();
        let last = text(stream.next_bytes().await);
        assert!(last.contains(r#"data: {"error":"#) && last.contains("[REDACTED]") && !last.contains("pa55word"), "{last}");
    }

    #[tokio::test]
    async fn a_first_answer_hands_over_what_it_sent_also_when_dropped_half_way() {
        // Dropped half way: what was sent, not complete.
        let (first, transcript, _filed) = filing::detached();
        let (turn, events, _end) = fake_turn(Some(first));
        let mut stream = sse(turn, Arc::new(str::to_owned));
        stream.next_bytes().await;
        events.send(token("Hel")).unwrap();
        stream.next_bytes().await;
        drop(stream);
        assert_eq!(transcript.await.unwrap(), ("Hel".to_owned(), false));

        // Complete: everything, the closing text as the turn wrote it; the client gets it naming
        // the thread it was filed under, then the mark, then the end.
        let (first, transcript, filed) = filing::detached();
        let (turn, events, end) = fake_turn(Some(first));
        let mut stream = sse(turn, Arc::new(str::to_owned));
        stream.next_bytes().await;
        events.send(token("Hello.")).unwrap();
        stream.next_bytes().await;
        end.send(ended(TurnStatus::Failed, &format!("Report: see {FRESH}/plan.json"))).unwrap();
        let filer = tokio::spawn(async move {
            let handed = transcript.await.unwrap();
            filed.send(Some(filing::Filed { thread_id: "oai-derived".into(), mark: "\u{2060}\u{200B}".into() })).unwrap();
            handed
        });
        let last = text(stream.next_bytes().await);
        assert_eq!(filer.await.unwrap(), (format!("Hello.\n\nReport: see {FRESH}/plan.json"), true));
        assert!(last.contains("Report: see oai-derived/plan.json") && !last.contains(FRESH), "{last}");
        let mark_at = last.find("\u{2060}\u{200B}").expect("the mark is sent");
        assert!(mark_at < last.find("\"stop\"").unwrap(), "the mark comes before the end: {last}");
    }
}

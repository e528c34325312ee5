//! The handlers: `GET /v1/models` and `POST /v1/chat/completions` (one JSON answer or an SSE
//! stream), each turn running as its own task that a dropped request cancels.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use peregrine_agent::{Agent, AgentError, Session, TurnOptions, TurnResult, TurnStatus};
use peregrine_core::AgentEvent;
use peregrine_graph::RunEvent;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::auth::ApiKeys;
use crate::error::{ApiError, json_response};
use crate::progress::TurnTrace;
use crate::request::{ChatRequest, Conversation};

/// What every handler shares.
pub(crate) struct ServerState {
    pub agent: Arc<Agent>,
    pub model_id: String,
    pub keys: ApiKeys,
    pub max_body_bytes: usize,
    pub status_lines: bool,
    /// Unix time of the server's start (the model's `created`).
    pub started_unix: i64,
    /// Threads with a turn running now.
    pub busy: Mutex<HashSet<String>>,
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

/// Any other route: 404 with an OpenAI error body.
pub(crate) async fn unknown_route(method: Method, uri: Uri) -> Response {
    ApiError::unknown_url(method.as_str(), uri.path()).into_response()
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    match start_turn(&state, &headers, body).await {
        Ok((request, turn)) if request.is_stream() => stream_answer(&state, &request, turn).await,
        Ok((_, turn)) => json_answer(&state, turn).await,
        Err(error) => error.into_response(),
    }
}

/// Authenticates, reads and checks the request, claims its thread and starts the turn.
async fn start_turn(state: &Arc<ServerState>, headers: &HeaderMap, body: Body) -> Result<(ChatRequest, RunningTurn), ApiError> {
    let caller = state.keys.authenticate(headers)?;
    let body = read_body(headers, body, state.max_body_bytes).await?;
    let request = ChatRequest::parse(&body)?;
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    let conversation = request.conversation(&caller, headers)?;
    let busy = BusyThread::claim(state, &conversation.thread_id)?;
    tracing::info!(thread = %conversation.thread_id, stream = request.is_stream(), "chat completion turn starts");
    Ok((request, RunningTurn::start(Arc::clone(&state.agent), conversation, busy)))
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()).and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::body_too_large(limit))
}

/// Marks a thread busy until dropped (when its turn task ends).
struct BusyThread {
    state: Arc<ServerState>,
    thread_id: String,
}

impl BusyThread {
    fn claim(state: &Arc<ServerState>, thread_id: &str) -> Result<Self, ApiError> {
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
    events: UnboundedReceiver<RunEvent<AgentEvent>>,
    task: JoinHandle<Result<TurnResult, AgentError>>,
    outcome: Option<TurnOutcome>,
    _cancel_on_drop: DropGuard,
}

impl RunningTurn {
    fn start(agent: Arc<Agent>, conversation: Conversation, busy: BusyThread) -> Self {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let options = TurnOptions { events: Some(sender), cancel: cancel.clone() };
        let Conversation { thread_id, input, session } = conversation;
        let task = tokio::spawn(async move {
            let _busy = busy;
            send(&agent, &thread_id, &input, &session, options).await
        });
        Self { events, task, outcome: None, _cancel_on_drop: cancel.drop_guard() }
    }

    /// The turn's next event; `None` once it has ended and every event was read.
    async fn next_event(&mut self) -> Option<RunEvent<AgentEvent>> {
        loop {
            if self.outcome.is_some() {
                return self.events.try_recv().ok();
            }
            tokio::select! {
                biased;
                Some(event) = self.events.recv() => return Some(event),
                joined = &mut self.task => {
                    self.outcome = Some(match joined {
                        Ok(result) => result.map_err(ApiError::from),
                        Err(error) => Err(ApiError::server_error(format!("The turn stopped unexpectedly ({error}); its last checkpoint is kept, send the message again."))),
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

async fn send(agent: &Agent, thread_id: &str, input: &str, session: &Session, options: TurnOptions) -> Result<TurnResult, AgentError> {
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
        Err(error) => tracing::warn!(thread = %thread_id, %error, "chat completion turn failed"),
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

fn response_text(result: &TurnResult) -> Option<String> {
    result.response.clone().or_else(|| fallback_text(result).map(str::to_owned))
}

fn completion_id() -> String {
    format!("chatcmpl-{}", uuid::Uuid::new_v4().simple())
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The non-stream answer.
async fn json_answer(state: &ServerState, mut turn: RunningTurn) -> Response {
    let mut trace = TurnTrace::new(false);
    while let Some(event) = turn.next_event().await {
        trace.observe(&event);
    }
    let result = match turn.take_outcome() {
        Ok(result) => result,
        Err(error) => return error.into_response(),
    };
    let body = json!({
        "id": completion_id(), "object": "chat.completion", "created": now_unix(), "model": state.model_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": response_text(&result).unwrap_or_default()}, "finish_reason": "stop"}],
        "usage": trace.usage.json(),
    });
    json_response(StatusCode::OK, &body)
}

/// The streamed answer. Events are held back until the run starts, so that a message the
/// gateway refuses is still answered with an HTTP error.
async fn stream_answer(state: &ServerState, request: &ChatRequest, mut turn: RunningTurn) -> Response {
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
                    return error.clone().into_response();
                }
                break;
            }
        }
    }
    let sse = SseTurn {
        id: completion_id(),
        created: now_unix(),
        model: state.model_id.clone(),
        include_usage: request.include_usage(),
        trace: TurnTrace::new(state.status_lines),
        held,
        turn,
        role_sent: false,
        done: false,
    };
    let stream =
        futures::stream::unfold(sse, |mut sse| async move { sse.next_bytes().await.map(|bytes| (Ok::<_, std::io::Error>(bytes), sse)) });
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no")),
    ];
    (StatusCode::OK, headers, Body::from_stream(stream)).into_response()
}

/// One streamed answer: `chat.completion.chunk` events with the same id and created time.
struct SseTurn {
    id: String,
    created: i64,
    model: String,
    include_usage: bool,
    trace: TurnTrace,
    held: VecDeque<RunEvent<AgentEvent>>,
    turn: RunningTurn,
    role_sent: bool,
    done: bool,
}

impl SseTurn {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        })
    }

    fn content(&self, pieces: &[String]) -> String {
        pieces.iter().map(|piece| event(&self.chunk(json!({"content": piece}), None))).collect()
    }

    /// The next bytes of the stream; `None` after `[DONE]`.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.role_sent {
            self.role_sent = true;
            return Some(Bytes::from(event(&self.chunk(json!({"role": "assistant"}), None))));
        }
        loop {
            let next = match self.held.pop_front() {
                Some(event) => Some(event),
                None => self.turn.next_event().await,
            };
            let Some(run_event) = next else { break };
            let pieces = self.trace.observe(&run_event);
            if !pieces.is_empty() {
                return Some(Bytes::from(self.content(&pieces)));
            }
        }
        self.done = true;
        let outcome = self.turn.take_outcome();
        Some(Bytes::from(self.finish(outcome)))
    }

    /// The end: the response text if it was not streamed, `finish_reason: "stop"`, usage, `[DONE]`;
    /// or an error event when the turn failed after the stream began.
    fn finish(&self, outcome: TurnOutcome) -> String {
        let mut out = String::new();
        match outcome {
            Ok(result) => {
                let response = response_text(&result);
                if let Some(text) = self.trace.closing_text(response.as_deref(), result.status == TurnStatus::Failed) {
                    out.push_str(&self.content(&[text]));
                }
                out.push_str(&event(&self.chunk(json!({}), Some("stop"))));
                if self.include_usage {
                    let usage = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                        "choices": [], "usage": self.trace.usage.json(),
                    });
                    out.push_str(&event(&usage));
                }
            }
            Err(error) => out.push_str(&event(&error.body())),
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}

fn event(data: &Value) -> String {
    format!("data: {data}\n\n")
}

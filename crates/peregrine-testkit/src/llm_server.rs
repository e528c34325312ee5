//! A scripted OpenAI- and Ollama-compatible LLM server on 127.0.0.1 for tests and benchmarks: replies are chosen
//! by schema name, prompt text or a closure, every request is recorded, and faults are injected per reply.
//!
//! # Endpoints
//! - `POST /v1/chat/completions`: OpenAI chat completions, non-stream JSON or SSE (`stream: true`), with the usage
//!   chunk (`choices: []`) before `data: [DONE]` when `stream_options.include_usage` is true.
//! - `GET /v1/models`: the script's model ids (`Script::with_model`, else [`DEFAULT_MODEL`]).
//! - `POST /api/chat`: Ollama chat, one JSON object (`stream: false`) or NDJSON lines (`stream` absent or true,
//!   as in real Ollama). `GET /api/tags` lists the model ids the Ollama way.
//! - Anything else: 404 with an OpenAI error body (code `unknown_url`), recorded like every other request.
//!
//! # How a request's schema name is found ([`RecordedRequest::schema_name`])
//! 1. OpenAI `response_format: {"type": "json_schema", "json_schema": {"name": N, "schema": {..}}}` → `N`.
//! 2. Ollama `format: {..schema..}` with a string `title` → the title.
//! 3. Otherwise a line `Schema name: N` (see [`SCHEMA_MARKER`]) in the LAST message → `N`; clients that carry the
//!    schema in the prompt instead of the API put that marker line there.
//!
//! A request with no schema name is "plain". Rules are tried in the order they were added; the first match wins.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{IncomingStream, Listener};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The model id listed by `/v1/models` and `/api/tags` when the script names none.
pub const DEFAULT_MODEL: &str = "scripted-model";

/// The prefix of the line that names the schema when it travels in the prompt: `Schema name: ExtractedTask`.
pub const SCHEMA_MARKER: &str = "Schema name:";

/// Streamed content is cut at word boundaries and into pieces of at most this many characters.
const MAX_CHUNK_CHARS: usize = 16;

/// What a [`Fault::MalformedJson`] reply sends where JSON is expected.
const MALFORMED_BODY: &str = "{\"id\": \"chatcmpl-scripted\", \"choices\": [ this is not JSON";

// ---------------------------------------------------------------------------------------------------------------
// Faults and replies
// ---------------------------------------------------------------------------------------------------------------

/// A misbehaviour injected into one reply; latencies combine with an answer, every other fault replaces it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Wait this long before sending the status line (several add up).
    Latency(Duration),
    /// In a stream, wait this long between chunks (per-token delay); no effect on a non-stream answer.
    TokenLatency(Duration),
    /// Accept the request and never answer; the handler is released only when the server shuts down.
    Timeout,
    /// Close this request's TCP connection without writing a byte: the client sees the connection closed
    /// before any response ("connection closed before message completed"), not an HTTP status.
    RefuseConnection,
    /// 429 with `Retry-After: <secs>` and an error body with code `rate_limit_exceeded`.
    RateLimited {
        /// Value of the `Retry-After` header, in seconds.
        retry_after_secs: u64,
    },
    /// This HTTP status with a generic error body (`server_error` for 5xx, `invalid_request_error` otherwise).
    Status(u16),
    /// 500 with an error body of type `server_error`.
    Status500,
    /// 401, type `invalid_request_error`, code `invalid_api_key` ("Incorrect API key provided").
    Unauthorized,
    /// 403, type `permission_error`, code `invalid_api_key` (a key that may not use this model or project).
    Forbidden,
    /// 404, param `model`, code `model_not_found`, naming the requested model.
    ModelNotFound,
    /// 400, param `messages`, code `context_length_exceeded`.
    ContextLengthExceeded,
    /// Any status with an error body of your own.
    Http {
        /// The HTTP status code.
        status: u16,
        /// The body's `error.type`.
        error_type: String,
        /// The body's `error.code` (null when `None`).
        code: Option<String>,
        /// The body's `error.message`.
        message: String,
    },
    /// 200 whose body is not JSON (for a stream: one SSE event or NDJSON line that is not JSON, then the end).
    MalformedJson,
    /// Send the first `after_chunks` SSE events / NDJSON lines, then abort the connection mid-body (no `[DONE]`, no
    /// final chunk of the chunked encoding): the client's body stream yields an error. A non-stream answer sends
    /// half its JSON, then aborts.
    TruncatedStream {
        /// How many events (role chunk and usage chunk included) are sent before the abort.
        after_chunks: usize,
    },
    /// Send the first `after_chunks` events, then end the HTTP body cleanly without `[DONE]` / `done: true`.
    StreamEndsEarly {
        /// How many events are sent before the clean end.
        after_chunks: usize,
    },
    /// Send the first `after_chunks` events, then send nothing more until the server shuts down (read timeouts).
    StreamStall {
        /// How many events are sent before the stall.
        after_chunks: usize,
    },
}

/// One function call the assistant asks for: the tool's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON text (sent verbatim, so it may be deliberately broken).
    pub arguments: String,
}

/// Token counts reported in `usage` (OpenAI) or `prompt_eval_count` / `eval_count` (Ollama).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens in the completion.
    pub completion_tokens: u64,
}

type ReplyFn = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

#[derive(Clone)]
enum Source {
    Fixed,
    Sequence(Arc<Sequence>),
    FromFn(ReplyFn),
}

struct Sequence {
    replies: Vec<Reply>,
    next: AtomicUsize,
}

/// An answer (content, tool calls, usage) with faults, or a sequence / closure that yields one per call.
///
/// Setters on a sequence or closure reply override what it yields (content, usage, finish reason, chunks) or add
/// to it (tool calls, faults).
#[derive(Clone)]
pub struct Reply {
    source: Source,
    content: Option<String>,
    tool_calls: Vec<ToolCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    chunks: Option<Vec<String>>,
    faults: Vec<Fault>,
}

impl Reply {
    fn with_source(source: Source) -> Self {
        Reply { source, content: None, tool_calls: Vec::new(), usage: None, finish_reason: None, chunks: None, faults: Vec::new() }
    }

    /// An assistant message with this text.
    pub fn text(content: impl Into<String>) -> Self {
        Reply { content: Some(content.into()), ..Reply::with_source(Source::Fixed) }
    }

    /// An assistant message whose text is this JSON value (compact), as a structured-output answer.
    pub fn json(value: Value) -> Self {
        Reply::text(value.to_string())
    }

    /// An assistant message with no text and one tool call (finish reason `tool_calls`).
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Reply::with_source(Source::Fixed).with_tool_call(name, arguments)
    }

    /// A reply that is only this fault (for sequences: `Reply::sequence(vec![Reply::fault(..), Reply::text(..)])`).
    pub fn fault(fault: Fault) -> Self {
        Reply::with_source(Source::Fixed).with_fault(fault)
    }

    /// Successive calls get successive replies; the last one repeats. An empty sequence answers empty text.
    pub fn sequence(replies: Vec<Reply>) -> Self {
        Reply::with_source(Source::Sequence(Arc::new(Sequence { replies, next: AtomicUsize::new(0) })))
    }

    /// The reply is computed from the request on every call.
    pub fn from_fn(reply: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) -> Self {
        Reply::with_source(Source::FromFn(Arc::new(reply)))
    }

    /// Adds a tool call with these JSON arguments.
    pub fn with_tool_call(self, name: impl Into<String>, arguments: Value) -> Self {
        self.with_raw_tool_call(name, arguments.to_string())
    }

    /// Adds a tool call whose arguments string is sent verbatim (e.g. broken JSON).
    pub fn with_raw_tool_call(mut self, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        self.tool_calls.push(ToolCall { name: name.into(), arguments: arguments.into() });
        self
    }

    /// Reports these token counts instead of the default word counts of prompt and completion.
    pub fn with_usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = Some(Usage { prompt_tokens, completion_tokens });
        self
    }

    /// Sends this finish reason instead of `stop` (or `tool_calls` when there are tool calls).
    pub fn with_finish_reason(mut self, finish_reason: impl Into<String>) -> Self {
        self.finish_reason = Some(finish_reason.into());
        self
    }

    /// Streams the content as exactly these pieces (the content becomes their concatenation).
    pub fn with_chunks(mut self, chunks: Vec<String>) -> Self {
        self.content = Some(chunks.concat());
        self.chunks = Some(chunks);
        self
    }

    /// Adds a fault to this reply.
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Waits this long before answering.
    pub fn with_latency(self, latency: Duration) -> Self {
        self.with_fault(Fault::Latency(latency))
    }

    /// Waits this long between streamed chunks.
    pub fn with_token_latency(self, latency: Duration) -> Self {
        self.with_fault(Fault::TokenLatency(latency))
    }

    /// The first calls get these faults, one per call, and later calls get this reply.
    pub fn after_faults(self, faults: Vec<Fault>) -> Self {
        let mut replies: Vec<Reply> = faults.into_iter().map(Reply::fault).collect();
        replies.push(self);
        Reply::sequence(replies)
    }

    /// Turns this reply into the answer and faults for one request.
    fn resolve(&self, request: &RecordedRequest, depth: usize) -> Resolved {
        let mut resolved = match &self.source {
            Source::Fixed => Resolved::default(),
            Source::Sequence(sequence) => match sequence.replies.len().checked_sub(1) {
                None => Resolved::default(),
                Some(last) => {
                    let call = sequence.next.fetch_add(1, Ordering::Relaxed);
                    sequence.replies.get(call.min(last)).map(|reply| reply.resolve(request, depth + 1)).unwrap_or_default()
                }
            },
            // A closure that keeps returning closures would recurse forever; answer 508 instead.
            Source::FromFn(_) if depth > 32 => Resolved { faults: vec![Fault::Status(508)], ..Resolved::default() },
            Source::FromFn(reply) => reply(request).resolve(request, depth + 1),
        };
        let mut faults = self.faults.clone();
        faults.append(&mut resolved.faults);
        resolved.faults = faults;
        resolved.tool_calls.extend(self.tool_calls.iter().cloned());
        resolved.content = self.content.clone().or(resolved.content);
        resolved.usage = self.usage.or(resolved.usage);
        resolved.finish_reason = self.finish_reason.clone().or(resolved.finish_reason);
        resolved.chunks = self.chunks.clone().or(resolved.chunks);
        resolved
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Fixed => "fixed".to_owned(),
            Source::Sequence(sequence) => format!("sequence of {}", sequence.replies.len()),
            Source::FromFn(_) => "from_fn".to_owned(),
        };
        f.debug_struct("Reply")
            .field("source", &source)
            .field("content", &self.content)
            .field("tool_calls", &self.tool_calls)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// A reply resolved for one request.
#[derive(Default)]
struct Resolved {
    content: Option<String>,
    tool_calls: Vec<ToolCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    chunks: Option<Vec<String>>,
    faults: Vec<Fault>,
}

// ---------------------------------------------------------------------------------------------------------------
// Script
// ---------------------------------------------------------------------------------------------------------------

type Predicate = Arc<dyn Fn(&RecordedRequest) -> bool + Send + Sync>;

#[derive(Clone)]
enum Matcher {
    Schema(String),
    Plain,
    PromptContaining(String),
    Request(Predicate),
}

impl Matcher {
    fn matches(&self, request: &RecordedRequest) -> bool {
        match self {
            Matcher::Schema(name) => request.schema_name.as_deref() == Some(name.as_str()),
            Matcher::Plain => request.schema_name.is_none(),
            Matcher::PromptContaining(needle) => request.prompt_text().contains(needle.as_str()),
            Matcher::Request(predicate) => predicate(request),
        }
    }
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::Schema(name) => write!(f, "schema {name:?}"),
            Matcher::Plain => write!(f, "plain"),
            Matcher::PromptContaining(needle) => write!(f, "prompt containing {needle:?}"),
            Matcher::Request(_) => write!(f, "request predicate"),
        }
    }
}

/// What the server answers: rules tried in the order they were added (first match wins), then the fallback.
#[derive(Clone, Default, Debug)]
pub struct Script {
    rules: Vec<(Matcher, Reply)>,
    fallback: Option<Reply>,
    models: Vec<String>,
}

impl Script {
    /// An empty script: every chat request gets 501 `no_scripted_reply` until rules are added.
    pub fn new() -> Self {
        Script::default()
    }

    /// Answers requests whose schema name is `name` (from `response_format`, Ollama `format.title` or the marker).
    pub fn on_schema(self, name: impl Into<String>, reply: Reply) -> Self {
        self.on(Matcher::Schema(name.into()), reply)
    }

    /// Answers requests without a schema name.
    pub fn on_plain(self, reply: Reply) -> Self {
        self.on(Matcher::Plain, reply)
    }

    /// Answers requests where the text of any message contains `needle`.
    pub fn on_prompt_containing(self, needle: impl Into<String>, reply: Reply) -> Self {
        self.on(Matcher::PromptContaining(needle.into()), reply)
    }

    /// Answers requests for which `predicate` is true.
    pub fn on_request(self, predicate: impl Fn(&RecordedRequest) -> bool + Send + Sync + 'static, reply: Reply) -> Self {
        self.on(Matcher::Request(Arc::new(predicate)), reply)
    }

    /// Answers requests that no rule matched.
    pub fn otherwise(mut self, reply: Reply) -> Self {
        self.fallback = Some(reply);
        self
    }

    /// Lists this model id in `/v1/models` and `/api/tags` (replacing the default [`DEFAULT_MODEL`]).
    pub fn with_model(mut self, id: impl Into<String>) -> Self {
        self.models.push(id.into());
        self
    }

    fn on(mut self, matcher: Matcher, reply: Reply) -> Self {
        self.rules.push((matcher, reply));
        self
    }

    fn reply_for(&self, request: &RecordedRequest) -> Option<&Reply> {
        self.rules.iter().find(|(matcher, _)| matcher.matches(request)).map(|(_, reply)| reply).or(self.fallback.as_ref())
    }

    fn model_ids(&self) -> Vec<String> {
        if self.models.is_empty() { vec![DEFAULT_MODEL.to_owned()] } else { self.models.clone() }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Recorded requests
// ---------------------------------------------------------------------------------------------------------------

/// Which endpoint a request reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `GET /v1/models`.
    Models,
    /// `POST /api/chat` (Ollama).
    OllamaChat,
    /// `GET /api/tags` (Ollama).
    OllamaTags,
    /// Any other path (answered 404).
    Unknown,
}

/// Where a request's schema name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaSource {
    /// OpenAI `response_format.json_schema.name`.
    ResponseFormat,
    /// Ollama `format.title`.
    OllamaFormat,
    /// A `Schema name: N` line in the last message.
    PromptMarker,
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Arrival order, from 0, over all endpoints.
    pub index: usize,
    /// The endpoint it reached.
    pub endpoint: Endpoint,
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// All headers with valid UTF-8 values, names lower-case (the last value wins for repeated names).
    pub headers: BTreeMap<String, String>,
    /// The `Authorization` header, e.g. `Bearer sk-test`.
    pub authorization: Option<String>,
    /// The parsed JSON body (`Null` when empty or not JSON).
    pub body: Value,
    /// The body's `model`.
    pub model: Option<String>,
    /// Whether a streamed answer was asked for (Ollama streams unless `stream: false`).
    pub stream: bool,
    /// The schema name, if any (see the module docs for how it is found).
    pub schema_name: Option<String>,
    /// The JSON schema itself when the request carried one (`response_format` or Ollama `format`).
    pub schema: Option<Value>,
    /// Where the schema name came from.
    pub schema_source: Option<SchemaSource>,
    /// When it arrived.
    pub received_at: Instant,
}

impl RecordedRequest {
    /// `(role, text)` of every message; text parts of multi-part content are joined with newlines.
    pub fn messages(&self) -> Vec<(String, String)> {
        let Some(messages) = self.body.get("messages").and_then(Value::as_array) else { return Vec::new() };
        messages
            .iter()
            .map(|message| (message.get("role").and_then(Value::as_str).unwrap_or_default().to_owned(), content_text(message)))
            .collect()
    }

    /// The text of the last message.
    pub fn last_message(&self) -> Option<String> {
        self.messages().pop().map(|(_, text)| text)
    }

    /// The texts of all messages, joined with newlines.
    pub fn prompt_text(&self) -> String {
        self.messages().into_iter().map(|(_, text)| text).collect::<Vec<_>>().join("\n")
    }

    /// The bearer token of the `Authorization` header.
    pub fn bearer_token(&self) -> Option<&str> {
        self.authorization.as_deref().and_then(|value| value.strip_prefix("Bearer "))
    }

    /// A header's value by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    /// The names of the tools offered in `tools[].function.name`.
    pub fn tool_names(&self) -> Vec<String> {
        let Some(tools) = self.body.get("tools").and_then(Value::as_array) else { return Vec::new() };
        tools.iter().filter_map(|tool| tool.pointer("/function/name").and_then(Value::as_str)).map(str::to_owned).collect()
    }

    /// Whether this was a chat request (OpenAI or Ollama).
    pub fn is_chat(&self) -> bool {
        matches!(self.endpoint, Endpoint::ChatCompletions | Endpoint::OllamaChat)
    }
}

fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

fn detect_schema(body: &Value) -> (Option<String>, Option<Value>, Option<SchemaSource>) {
    let response_format = &body["response_format"];
    if response_format["type"] == "json_schema"
        && let Some(name) = response_format["json_schema"]["name"].as_str()
    {
        return (Some(name.to_owned()), response_format["json_schema"].get("schema").cloned(), Some(SchemaSource::ResponseFormat));
    }
    let ollama_schema = body.get("format").filter(|format| format.is_object()).cloned();
    if let Some(title) = ollama_schema.as_ref().and_then(|schema| schema["title"].as_str()) {
        return (Some(title.to_owned()), ollama_schema.clone(), Some(SchemaSource::OllamaFormat));
    }
    let last = body["messages"].as_array().and_then(|messages| messages.last()).map(content_text).unwrap_or_default();
    let marker = last.lines().find_map(|line| line.trim().strip_prefix(SCHEMA_MARKER)).map(str::trim).filter(|name| !name.is_empty());
    match marker {
        Some(name) => (Some(name.to_owned()), ollama_schema, Some(SchemaSource::PromptMarker)),
        None => (None, ollama_schema, None),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------------------------

struct ServerState {
    script: Script,
    log: Mutex<Vec<RecordedRequest>>,
    shutdown: CancellationToken,
    started_unix: u64,
}

impl ServerState {
    fn record(&self, endpoint: Endpoint, method: &Method, path: &str, headers: &HeaderMap, body: Value) -> RecordedRequest {
        let headers: BTreeMap<String, String> = headers
            .iter()
            .filter_map(|(name, value)| value.to_str().ok().map(|value| (name.as_str().to_owned(), value.to_owned())))
            .collect();
        let (schema_name, schema, schema_source) = detect_schema(&body);
        let stream = match endpoint {
            Endpoint::OllamaChat => body["stream"].as_bool().unwrap_or(true),
            _ => body["stream"].as_bool().unwrap_or(false),
        };
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let request = RecordedRequest {
            index: log.len(),
            endpoint,
            method: method.to_string(),
            path: path.to_owned(),
            authorization: headers.get("authorization").cloned(),
            headers,
            model: body["model"].as_str().map(str::to_owned),
            stream,
            schema_name,
            schema,
            schema_source,
            body,
            received_at: Instant::now(),
        };
        log.push(request.clone());
        request
    }

    /// Sleeps unless the server shuts down first; false when it did.
    async fn sleep(&self, delay: Duration) -> bool {
        sleep_unless_shutdown(delay, &self.shutdown).await
    }
}

async fn sleep_unless_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = shutdown.cancelled() => false,
    }
}

/// A scripted LLM server listening on 127.0.0.1; it shuts down when dropped.
pub struct ScriptedLlmServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    task: Option<JoinHandle<()>>,
}

impl ScriptedLlmServer {
    /// Starts the server on an OS-assigned port; panics if 127.0.0.1 cannot be bound.
    ///
    /// The server runs as a task on the current runtime: a test whose client blocks a thread needs the
    /// multi-thread flavour.
    pub async fn start(script: Script) -> Self {
        match Self::try_start(script).await {
            Ok(server) => server,
            Err(error) => panic!("scripted LLM server: cannot listen on 127.0.0.1: {error}"),
        }
    }

    /// Starts the server on an OS-assigned port.
    pub async fn try_start(script: Script) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_secs()).unwrap_or_default();
        let state = Arc::new(ServerState { script, log: Mutex::new(Vec::new()), shutdown: CancellationToken::new(), started_unix });
        let app = router(Arc::clone(&state)).into_make_service_with_connect_info::<ConnectionHandle>();
        let shutdown = state.shutdown.clone();
        let task = tokio::spawn(async move {
            // axum documents that serving never returns an error; accept errors are retried inside the listener.
            let _ = axum::serve(KillableListener { inner: listener }, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        });
        Ok(ScriptedLlmServer { addr, state, task: Some(task) })
    }

    /// A base URL where nothing listens (a port bound, then released), for connection-refused tests.
    pub fn refusing() -> String {
        match std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|listener| listener.local_addr()) {
            Ok(addr) => format!("http://{addr}/v1"),
            Err(error) => panic!("scripted LLM server: cannot find a free port on 127.0.0.1: {error}"),
        }
    }

    /// The OpenAI base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The Ollama base URL (no `/v1`), `http://127.0.0.1:PORT`.
    pub fn ollama_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order (all endpoints).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The chat requests received so far (OpenAI and Ollama), in arrival order.
    pub fn chat_requests(&self) -> Vec<RecordedRequest> {
        self.requests().into_iter().filter(RecordedRequest::is_chat).collect()
    }

    /// How many requests arrived so far (all endpoints).
    pub fn request_count(&self) -> usize {
        self.state.log.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Stops accepting, releases held requests (`Timeout`, stalls, latencies) and waits for the server task to end.
    pub async fn shutdown(mut self) {
        self.state.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ScriptedLlmServer {
    /// Signals shutdown; the server task ends by itself once in-flight responses (all released at once) are done.
    fn drop(&mut self) {
        self.state.shutdown.cancel();
    }
}

impl fmt::Debug for ScriptedLlmServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedLlmServer").field("addr", &self.addr).field("requests", &self.request_count()).finish()
    }
}

fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/models", get(openai_models))
        .route("/api/chat", post(ollama_chat))
        .route("/api/tags", get(ollama_tags))
        .fallback(unknown_route)
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

type Shared = State<Arc<ServerState>>;

async fn openai_chat(State(state): Shared, ConnectInfo(conn): ConnectInfo<ConnectionHandle>, headers: HeaderMap, body: Bytes) -> Response {
    chat(&state, &conn, Endpoint::ChatCompletions, &headers, &body).await
}

async fn ollama_chat(State(state): Shared, ConnectInfo(conn): ConnectInfo<ConnectionHandle>, headers: HeaderMap, body: Bytes) -> Response {
    chat(&state, &conn, Endpoint::OllamaChat, &headers, &body).await
}

async fn openai_models(State(state): Shared, headers: HeaderMap) -> Response {
    state.record(Endpoint::Models, &Method::GET, "/v1/models", &headers, Value::Null);
    let data: Vec<Value> = state
        .script
        .model_ids()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": state.started_unix, "owned_by": "peregrine-testkit"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn ollama_tags(State(state): Shared, headers: HeaderMap) -> Response {
    state.record(Endpoint::OllamaTags, &Method::GET, "/api/tags", &headers, Value::Null);
    let models: Vec<Value> =
        state.script.model_ids().into_iter().map(|id| json!({"name": id, "model": id, "size": 0, "digest": "", "details": {}})).collect();
    json_response(StatusCode::OK, &json!({"models": models}))
}

async fn unknown_route(State(state): Shared, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let request = state.record(Endpoint::Unknown, &method, uri.path(), &headers, serde_json::from_slice(&body).unwrap_or(Value::Null));
    let message = format!(
        "scripted LLM server: no route for {} {} (OpenAI clients need a base URL ending in /v1, Ollama clients one without)",
        request.method, request.path
    );
    error_response(Endpoint::ChatCompletions, &ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("unknown_url"), message))
}

// ---------------------------------------------------------------------------------------------------------------
// One chat exchange
// ---------------------------------------------------------------------------------------------------------------

/// What the faults of a reply make of the answer.
enum Outcome {
    Answer,
    Timeout,
    Refuse,
    Error(ApiError),
    Malformed,
    Truncate(usize),
    EndEarly(usize),
    Stall(usize),
}

async fn chat(state: &ServerState, conn: &ConnectionHandle, endpoint: Endpoint, headers: &HeaderMap, body: &Bytes) -> Response {
    let parsed = serde_json::from_slice::<Value>(body);
    let path = if endpoint == Endpoint::OllamaChat { "/api/chat" } else { "/v1/chat/completions" };
    let request = state.record(endpoint, &Method::POST, path, headers, parsed.as_ref().cloned().unwrap_or(Value::Null));
    if let Err(error) = parsed {
        let message = format!("We could not parse the JSON body of your request: {error}");
        return error_response(endpoint, &ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_json"), message));
    }
    let Some(reply) = state.script.reply_for(&request) else {
        return error_response(endpoint, &ApiError::no_rule(&request));
    };
    let resolved = reply.resolve(&request, 0);
    let latency: Duration =
        resolved.faults.iter().map(|fault| if let Fault::Latency(delay) = fault { *delay } else { Duration::ZERO }).sum();
    let token_latency =
        resolved.faults.iter().rev().find_map(|fault| if let Fault::TokenLatency(delay) = fault { Some(*delay) } else { None });
    let outcome = resolved.faults.iter().find_map(|fault| outcome_of(fault, &request)).unwrap_or(Outcome::Answer);
    if !latency.is_zero() && !state.sleep(latency).await {
        return error_response(endpoint, &ApiError::shutting_down());
    }
    let end = match outcome {
        Outcome::Answer => StreamEnd::Complete,
        Outcome::Timeout => {
            state.shutdown.cancelled().await;
            return error_response(endpoint, &ApiError::shutting_down());
        }
        Outcome::Refuse => {
            conn.kill();
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        Outcome::Error(error) => return error_response(endpoint, &error),
        Outcome::Malformed => return malformed_response(endpoint, request.stream),
        Outcome::Truncate(after) => StreamEnd::Abort(after),
        Outcome::EndEarly(after) => StreamEnd::Clean(after),
        Outcome::Stall(after) => StreamEnd::Stall(after),
    };
    let exchange = Exchange::new(&request, resolved, state.started_unix);
    let (content_type, events) = match (endpoint, request.stream) {
        (Endpoint::OllamaChat, true) => ("application/x-ndjson", exchange.ollama_lines()),
        (Endpoint::OllamaChat, false) => ("application/json", vec![Bytes::from(exchange.ollama_body().to_string())]),
        (_, true) => ("text/event-stream", exchange.openai_events(openai_include_usage(&request))),
        (_, false) => ("application/json", vec![Bytes::from(exchange.openai_body().to_string())]),
    };
    // A non-stream body cut short is cut in the middle of its JSON.
    let (events, end) = match (request.stream, end) {
        (false, StreamEnd::Abort(_)) => (split_in_half(events), StreamEnd::Abort(1)),
        (false, StreamEnd::Clean(_)) => (split_in_half(events), StreamEnd::Clean(1)),
        (false, StreamEnd::Stall(_)) => (split_in_half(events), StreamEnd::Stall(1)),
        (_, end) => (events, end),
    };
    let body = match (request.stream, end, events.as_slice()) {
        (false, StreamEnd::Complete, [only]) => Body::from(only.clone()),
        _ => streamed_body(events, token_latency.unwrap_or_default(), end, state.shutdown.clone()),
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if request.stream {
        response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    response
}

fn openai_include_usage(request: &RecordedRequest) -> bool {
    request.body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false)
}

fn outcome_of(fault: &Fault, request: &RecordedRequest) -> Option<Outcome> {
    let error = |status: StatusCode, error_type: &str, code: &str, message: String| {
        Some(Outcome::Error(ApiError::new(status, error_type, Some(code), message)))
    };
    match fault {
        Fault::Latency(_) | Fault::TokenLatency(_) => None,
        Fault::Timeout => Some(Outcome::Timeout),
        Fault::RefuseConnection => Some(Outcome::Refuse),
        Fault::RateLimited { retry_after_secs } => {
            let message = format!("Rate limit reached for requests (scripted). Please try again in {retry_after_secs}s.");
            let mut api_error = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "requests", Some("rate_limit_exceeded"), message);
            api_error.retry_after = Some(*retry_after_secs);
            Some(Outcome::Error(api_error))
        }
        Fault::Status(status) => Some(Outcome::Error(ApiError::generic(*status))),
        Fault::Status500 => Some(Outcome::Error(ApiError::generic(500))),
        Fault::Unauthorized => {
            error(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.".into())
        }
        Fault::Forbidden => {
            error(StatusCode::FORBIDDEN, "permission_error", "invalid_api_key", "The API key may not be used for this request.".into())
        }
        Fault::ModelNotFound => {
            let model = request.model.as_deref().unwrap_or_default();
            let message = format!("The model `{model}` does not exist or you do not have access to it.");
            let mut api_error = ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("model_not_found"), message);
            api_error.param = Some("model");
            Some(Outcome::Error(api_error))
        }
        Fault::ContextLengthExceeded => {
            let tokens = word_count(&request.prompt_text());
            let message = format!(
                "This model's maximum context length is 4096 tokens. However, your messages resulted in {tokens} tokens. \
                 Please reduce the length of the messages."
            );
            let mut api_error = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("context_length_exceeded"), message);
            api_error.param = Some("messages");
            Some(Outcome::Error(api_error))
        }
        Fault::Http { status, error_type, code, message } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Some(Outcome::Error(ApiError::new(status, error_type, code.as_deref(), message.clone())))
        }
        Fault::MalformedJson => Some(Outcome::Malformed),
        Fault::TruncatedStream { after_chunks } => Some(Outcome::Truncate(*after_chunks)),
        Fault::StreamEndsEarly { after_chunks } => Some(Outcome::EndEarly(*after_chunks)),
        Fault::StreamStall { after_chunks } => Some(Outcome::Stall(*after_chunks)),
    }
}

/// The answer to one chat request, ready to be rendered in either protocol.
struct Exchange {
    id: String,
    created: u64,
    created_at: String,
    model: String,
    content: String,
    chunks: Vec<String>,
    tool_calls: Vec<ToolCall>,
    finish_reason: String,
    usage: Usage,
}

impl Exchange {
    fn new(request: &RecordedRequest, resolved: Resolved, started_unix: u64) -> Self {
        let content = resolved.content.unwrap_or_default();
        let completion_words = word_count(&content) + resolved.tool_calls.iter().map(|call| word_count(&call.arguments)).sum::<u64>();
        let usage =
            resolved.usage.unwrap_or(Usage { prompt_tokens: word_count(&request.prompt_text()), completion_tokens: completion_words });
        let default_finish = if resolved.tool_calls.is_empty() { "stop" } else { "tool_calls" };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_secs()).unwrap_or(started_unix);
        Exchange {
            id: format!("chatcmpl-scripted-{}", request.index),
            created,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            model: request.model.clone().unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
            chunks: resolved.chunks.unwrap_or_else(|| split_into_chunks(&content)),
            content,
            tool_calls: resolved.tool_calls,
            finish_reason: resolved.finish_reason.unwrap_or_else(|| default_finish.to_owned()),
            usage,
        }
    }

    fn tool_call_id(&self, index: usize) -> String {
        format!("call_{}_{index}", self.id.trim_start_matches("chatcmpl-"))
    }

    fn usage_json(&self) -> Value {
        let Usage { prompt_tokens, completion_tokens } = self.usage;
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
    }

    fn openai_body(&self) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), "assistant".into());
        let content = if self.content.is_empty() && !self.tool_calls.is_empty() { Value::Null } else { self.content.clone().into() };
        message.insert("content".into(), content);
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.iter().enumerate().map(|(index, call)| {
                json!({"id": self.tool_call_id(index), "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
            });
            message.insert("tool_calls".into(), calls.collect());
        }
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": self.finish_reason}],
            "usage": self.usage_json(),
        })
    }

    /// SSE events: role chunk, content and tool-call deltas (the last carries `finish_reason`), usage chunk, `[DONE]`.
    fn openai_events(&self, include_usage: bool) -> Vec<Bytes> {
        let mut deltas: Vec<Value> = self.chunks.iter().map(|piece| json!({"content": piece})).collect();
        for (index, call) in self.tool_calls.iter().enumerate() {
            let id = self.tool_call_id(index);
            deltas.push(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}),
            );
            for piece in split_into_chunks(&call.arguments) {
                deltas.push(json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}));
            }
        }
        if deltas.is_empty() {
            deltas.push(json!({}));
        }
        let last = deltas.len() - 1;
        let mut chunks = vec![self.openai_chunk(json!({"role": "assistant", "content": ""}), None, include_usage)];
        for (position, delta) in deltas.into_iter().enumerate() {
            let finish = (position == last).then_some(self.finish_reason.as_str());
            chunks.push(self.openai_chunk(delta, finish, include_usage));
        }
        if include_usage {
            chunks.push(json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage_json(),
            }));
        }
        let mut events: Vec<Bytes> = chunks.into_iter().map(|chunk| Bytes::from(format!("data: {chunk}\n\n"))).collect();
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        events
    }

    fn openai_chunk(&self, delta: Value, finish_reason: Option<&str>, include_usage: bool) -> Value {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        });
        if include_usage && let Some(fields) = chunk.as_object_mut() {
            fields.insert("usage".into(), Value::Null);
        }
        chunk
    }

    fn ollama_tool_calls(&self) -> Value {
        let calls = self.tool_calls.iter().map(|call| {
            // Ollama sends arguments as an object; arguments that are not JSON go as a string.
            let arguments = serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| call.arguments.clone().into());
            json!({"function": {"name": call.name, "arguments": arguments}})
        });
        calls.collect()
    }

    fn ollama_message(&self, content: &str, with_tools: bool) -> Value {
        let mut message = json!({"role": "assistant", "content": content});
        if with_tools
            && !self.tool_calls.is_empty()
            && let Some(fields) = message.as_object_mut()
        {
            fields.insert("tool_calls".into(), self.ollama_tool_calls());
        }
        message
    }

    fn ollama_final(&self, message: Value) -> Value {
        let done_reason = if self.finish_reason == "tool_calls" { "stop" } else { self.finish_reason.as_str() };
        json!({
            "model": self.model, "created_at": self.created_at, "message": message, "done": true, "done_reason": done_reason,
            "total_duration": 0, "load_duration": 0, "prompt_eval_count": self.usage.prompt_tokens, "prompt_eval_duration": 0,
            "eval_count": self.usage.completion_tokens, "eval_duration": 0,
        })
    }

    fn ollama_body(&self) -> Value {
        self.ollama_final(self.ollama_message(&self.content, true))
    }

    /// NDJSON lines: one per content piece, one with the tool calls if any, then the `done: true` line.
    fn ollama_lines(&self) -> Vec<Bytes> {
        let mut lines: Vec<Value> = self
            .chunks
            .iter()
            .map(|piece| json!({"model": self.model, "created_at": self.created_at, "message": self.ollama_message(piece, false), "done": false}))
            .collect();
        if !self.tool_calls.is_empty() {
            lines
                .push(json!({"model": self.model, "created_at": self.created_at, "message": self.ollama_message("", true), "done": false}));
        }
        lines.push(self.ollama_final(self.ollama_message("", false)));
        lines.into_iter().map(|line| Bytes::from(format!("{line}\n"))).collect()
    }
}

fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// Cuts text after each run of whitespace that precedes a word, and into pieces of at most [`MAX_CHUNK_CHARS`].
fn split_into_chunks(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut length = 0;
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        current.push(ch);
        length += 1;
        let word_follows = ch.is_whitespace() && chars.peek().is_some_and(|next| !next.is_whitespace());
        if word_follows || length >= MAX_CHUNK_CHARS {
            pieces.push(std::mem::take(&mut current));
            length = 0;
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

fn split_in_half(events: Vec<Bytes>) -> Vec<Bytes> {
    events
        .into_iter()
        .flat_map(|event| {
            let mut first = event;
            let second = first.split_off(first.len() / 2);
            [first, second]
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Wire helpers
// ---------------------------------------------------------------------------------------------------------------

/// An error answer, rendered as `{"error":{"message","type","param","code"}}` (OpenAI) or `{"error": message}` (Ollama).
struct ApiError {
    status: StatusCode,
    error_type: String,
    code: Option<String>,
    param: Option<&'static str>,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, error_type: &str, code: Option<&str>, message: String) -> Self {
        ApiError { status, error_type: error_type.to_owned(), code: code.map(str::to_owned), param: None, message, retry_after: None }
    }

    fn generic(status: u16) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let error_type = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
        let message = format!("scripted fault: HTTP {status}");
        ApiError::new(status, error_type, None, message)
    }

    fn no_rule(request: &RecordedRequest) -> Self {
        let last: String = request.last_message().unwrap_or_default().chars().take(120).collect();
        let message = format!(
            "scripted LLM server: no rule matches this request (schema name: {:?}, last message: {last:?}); \
             add Script::on_schema, on_plain, on_prompt_containing or otherwise",
            request.schema_name
        );
        ApiError::new(StatusCode::NOT_IMPLEMENTED, "scripted_server_error", Some("no_scripted_reply"), message)
    }

    fn shutting_down() -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", None, "scripted LLM server is shutting down".to_owned())
    }
}

fn error_response(endpoint: Endpoint, error: &ApiError) -> Response {
    let body = match endpoint {
        Endpoint::OllamaChat | Endpoint::OllamaTags => json!({"error": error.message}),
        _ => json!({"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.code}}),
    };
    let mut response = json_response(error.status, &body);
    if let Some(seconds) = error.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string()).into_response()
}

fn malformed_response(endpoint: Endpoint, stream: bool) -> Response {
    let (content_type, body) = match (endpoint, stream) {
        (Endpoint::OllamaChat, true) => ("application/x-ndjson", format!("{MALFORMED_BODY}\n")),
        (_, true) => ("text/event-stream", format!("data: {MALFORMED_BODY}\n\ndata: [DONE]\n\n")),
        (_, false) => ("application/json", MALFORMED_BODY.to_owned()),
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body).into_response()
}

/// How a streamed body ends after its events.
#[derive(Clone, Copy)]
enum StreamEnd {
    Complete,
    Abort(usize),
    Clean(usize),
    Stall(usize),
}

enum Step {
    Send(Bytes),
    Wait(Duration),
    Stall,
    Abort,
}

fn streamed_body(events: Vec<Bytes>, token_latency: Duration, end: StreamEnd, shutdown: CancellationToken) -> Body {
    let keep = match end {
        StreamEnd::Complete => events.len(),
        StreamEnd::Abort(after) | StreamEnd::Clean(after) | StreamEnd::Stall(after) => after.min(events.len()),
    };
    let mut steps = Vec::with_capacity(keep * 2 + 1);
    for (position, event) in events.into_iter().take(keep).enumerate() {
        if position > 0 && !token_latency.is_zero() {
            steps.push(Step::Wait(token_latency));
        }
        steps.push(Step::Send(event));
    }
    match end {
        StreamEnd::Complete | StreamEnd::Clean(_) => {}
        StreamEnd::Abort(_) => steps.push(Step::Abort),
        StreamEnd::Stall(_) => steps.push(Step::Stall),
    }
    let aborted = || io::Error::new(io::ErrorKind::ConnectionAborted, "scripted LLM server: stream cut short");
    let stream = futures::stream::unfold((steps.into_iter(), shutdown), move |(mut steps, shutdown)| async move {
        loop {
            match steps.next()? {
                Step::Send(bytes) => return Some((Ok(bytes), (steps, shutdown))),
                Step::Wait(delay) => {
                    if !sleep_unless_shutdown(delay, &shutdown).await {
                        return Some((Err(aborted()), (Vec::new().into_iter(), shutdown)));
                    }
                }
                Step::Stall => {
                    shutdown.cancelled().await;
                    return Some((Err(aborted()), (Vec::new().into_iter(), shutdown)));
                }
                Step::Abort => {
                    // hyper drops unflushed bytes when a body fails; one Pending lets it flush what was sent.
                    tokio::task::yield_now().await;
                    return Some((Err(aborted()), (Vec::new().into_iter(), shutdown)));
                }
            }
        }
    });
    Body::from_stream(stream)
}

// ---------------------------------------------------------------------------------------------------------------
// Connections that a handler can close (Fault::RefuseConnection)
// ---------------------------------------------------------------------------------------------------------------

/// Lets a handler close its own connection without a response.
#[derive(Clone, Debug)]
struct ConnectionHandle {
    killed: Arc<AtomicBool>,
}

impl ConnectionHandle {
    fn kill(&self) {
        self.killed.store(true, Ordering::Release);
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnectionHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        ConnectionHandle { killed: Arc::clone(&stream.io().killed) }
    }
}

struct KillableListener {
    inner: TcpListener,
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    // Small SSE chunks must leave at once, not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    return (KillableStream { inner: stream, killed: Arc::new(AtomicBool::new(false)) }, addr);
                }
                // Out of file descriptors or an aborted handshake: back off briefly and accept again.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A TCP stream that reads EOF and fails writes once killed, so hyper drops it without writing a response.
struct KillableStream {
    inner: TcpStream,
    killed: Arc<AtomicBool>,
}

impl KillableStream {
    fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }
}

fn killed_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed by Fault::RefuseConnection")
}

impl AsyncRead for KillableStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.is_killed() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.is_killed() {
            return Poll::Ready(Err(killed_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.is_killed() {
            return Poll::Ready(Err(killed_error()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_reassemble_to_the_text_and_respect_the_size_limit() {
        for text in ["", "hello", "hello world", "  lead and trail  ", "{\"a_rather_long_key\":\"and a value\"}", "ünïcödé wörds ok"] {
            let chunks = split_into_chunks(text);
            assert_eq!(chunks.concat(), text);
            assert!(chunks.iter().all(|chunk| chunk.chars().count() <= MAX_CHUNK_CHARS), "{chunks:?}");
        }
        assert_eq!(split_into_chunks("hello big world"), ["hello ", "big ", "world"]);
    }

    #[test]
    fn schema_names_come_from_response_format_ollama_title_or_marker() {
        let cases = [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {}}}}),
                Some("A"),
                Some(SchemaSource::ResponseFormat),
            ),
            (json!({"format": {"title": "B", "type": "object"}}), Some("B"), Some(SchemaSource::OllamaFormat)),
            (json!({"messages": [{"role": "user", "content": "x\n  Schema name: C \ny"}]}), Some("C"), Some(SchemaSource::PromptMarker)),
            (json!({"messages": [{"role": "system", "content": "Schema name: D"}, {"role": "user", "content": "hi"}]}), None, None),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Schema name: E"}]}]}),
                Some("E"),
                Some(SchemaSource::PromptMarker),
            ),
            (json!({"response_format": {"type": "json_object"}, "messages": []}), None, None),
        ];
        for (body, name, source) in cases {
            let (found, _, found_source) = detect_schema(&body);
            assert_eq!((found.as_deref(), found_source), (name, source), "{body}");
        }
    }
}

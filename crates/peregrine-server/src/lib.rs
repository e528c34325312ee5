//! Serves a Peregrine [`Agent`](peregrine_agent::Agent) over an OpenAI-compatible HTTP API, for
//! Open WebUI and the official `openai` clients (the first part of `peregrine serve`).
//!
//! # Routes
//! - `GET /v1/models`: the one served model, `{"object":"list","data":[{"id","object":"model","created","owned_by":"peregrine"}]}`.
//! - `POST /v1/chat/completions`: one turn of the agent; a JSON answer, or SSE with `stream: true`.
//! - Anything else: 404 with an OpenAI error body.
//!
//! Errors are `{"error":{"message","type","param","code"}}`: 401 `invalid_api_key`, 404
//! `model_not_found`, 400 with `param: "messages"`, 413 for a body over
//! [`ServerOptions::max_body_bytes`], 409 `thread_busy` while the conversation's previous turn
//! still runs, 400 when the agent's gateway refuses the message, 500 `server_error` when the
//! run fails.
//!
//! # Authentication
//! With [`ServerOptions::api_keys`] set, every `/v1` route needs `Authorization: Bearer <key>`.
//! Only SHA-256 digests of the keys are kept; a presented key is hashed and compared with each
//! of them in constant time. Keys never appear in answers or logs.
//!
//! # Conversation identity
//! Chat clients resend the whole history with every request, so the agent thread is derived
//! from the request: `oai-` + the first 16 hex digits of SHA-256 over, each followed by `\n`,
//! 1. the caller: the hex SHA-256 of its API key, or `anonymous` when the server has no keys
//!    (so two keys never share a thread);
//! 2. the source and its value, the first of:
//!    header `X-OpenWebUI-Chat-Id` (`chat-id`), header `X-Session-Id` (`session-id`), the
//!    body's `user` field with the first user message (`user`, value `<user>\n<first message>`),
//!    else the first user message's text alone (`first-message`).
//!
//! A client that resends the history therefore stays on its thread, and a pending approval is
//! answered by the next request's last user message (the agent's gateway reads it). The last
//! user message is the turn's input; the earlier messages only identify the conversation (the
//! agent keeps its own history in its checkpoints). The session's user id is the `user` field,
//! else header `X-OpenWebUI-User-Id`, else `api`; its interface is `openwebui`.
//!
//! # Streaming
//! Every chunk has the same `id` and `created`; the first delta is `{"role":"assistant"}`. With
//! [`ServerOptions::status_lines`], progress goes **into the content** as lines such as
//! `> planning…` or `> step 1/2 current_weather…`, followed by a blank line before the answer,
//! so that Open WebUI (which shows only content) shows what the agent is doing. Then come the
//! answer tokens; a turn that streamed no tokens (an error report, an approval prompt, a reply)
//! sends its text as one piece. A final chunk carries `finish_reason: "stop"` (every other
//! chunk has `null`); with `stream_options.include_usage`, a chunk with `choices: []` and the
//! turn's `usage` comes just before `data: [DONE]`. A run error after the stream began is sent
//! as a `data: {"error": {..}}` event before `[DONE]`.
//!
//! # Cancellation
//! A client that disconnects (or drops a non-stream request) cancels the turn; its last
//! checkpoint stays and the next message continues the conversation.

mod auth;
mod chat;
mod error;
mod progress;
mod request;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use peregrine_agent::Agent;
use peregrine_llm::Secret;

pub use error::ApiError;
pub use request::{CHAT_ID_HEADER, DEFAULT_USER, INTERFACE, SESSION_ID_HEADER, USER_ID_HEADER};

/// The default limit on a request body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The owner every listed model has.
pub const OWNED_BY: &str = "peregrine";

/// How the API is served.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The model id clients select (and must send as `model`).
    pub model_id: String,
    /// Accepted API keys; empty serves without authentication.
    pub api_keys: Vec<Secret>,
    /// The largest request body accepted (larger ones get 413).
    pub max_body_bytes: usize,
    /// Whether a stream carries progress lines in its content before the answer.
    pub status_lines: bool,
}

impl ServerOptions {
    /// Options serving `model_id` without keys, with a 1 MiB body limit and status lines.
    pub fn new(model_id: impl Into<String>) -> Self {
        Self { model_id: model_id.into(), api_keys: Vec::new(), max_body_bytes: DEFAULT_MAX_BODY_BYTES, status_lines: true }
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self::new("peregrine")
    }
}

/// The OpenAI-compatible API of `agent`.
pub fn router(agent: Arc<Agent>, options: ServerOptions) -> Router {
    let ServerOptions { model_id, api_keys, max_body_bytes, status_lines } = options;
    let state = chat::ServerState {
        agent,
        model_id,
        keys: auth::ApiKeys::new(&api_keys),
        max_body_bytes,
        status_lines,
        started_unix: chrono::Utc::now().timestamp(),
        busy: Mutex::new(HashSet::new()),
    };
    Router::new()
        .route("/v1/models", get(chat::models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .fallback(chat::unknown_route)
        // The chat handler reads the body itself, with its own limit and an OpenAI 413.
        .layer(DefaultBodyLimit::disable())
        .with_state(Arc::new(state))
}

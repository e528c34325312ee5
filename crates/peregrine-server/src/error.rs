//! OpenAI error answers: every failure of the API becomes `{"error":{"message","type","param","code"}}`
//! with its HTTP status here, and nowhere else.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use peregrine_agent::AgentError;
use peregrine_graph::{CheckpointError, RunError};
use serde_json::{Value, json};

/// An error answer of the OpenAI-compatible API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// `error.type` (`invalid_request_error`, `server_error`).
    pub error_type: &'static str,
    /// `error.param`: the request field at fault, if any.
    pub param: Option<&'static str>,
    /// `error.code`: a machine-readable reason, if any.
    pub code: Option<&'static str>,
    /// `error.message`: what happened and what to do.
    pub message: String,
    /// Seconds for the `Retry-After` header (503 when the server is full).
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, error_type: &'static str, code: Option<&'static str>, message: impl Into<String>) -> Self {
        Self { status, error_type, param: None, code, message: message.into(), retry_after_seconds: None }
    }

    fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// 401: no or a wrong `Authorization: Bearer` key (the key itself is never repeated).
    pub fn invalid_api_key(given: bool) -> Self {
        let message = if given {
            "Incorrect API key provided. Use one of the keys this server was started with."
        } else {
            "No API key provided. Send it as 'Authorization: Bearer <key>'."
        };
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", Some("invalid_api_key"), message)
    }

    /// 404: the request names a model this server does not serve.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        let requested: String = requested.chars().take(200).collect();
        let message = format!("The model '{requested}' does not exist on this server; it serves '{served}' (see GET /v1/models).");
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("model_not_found"), message).with_param("model")
    }

    /// 400: the body is not a chat completions request.
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_json"), message)
    }

    /// 400: the `messages` field cannot be used.
    pub fn invalid_messages(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", None, message).with_param("messages")
    }

    /// 413: the body is larger than the server accepts.
    pub fn body_too_large(limit: usize) -> Self {
        let message = format!("The request body is larger than this server's limit of {limit} bytes; send a shorter request.");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", Some("request_too_large"), message)
    }

    /// 409: another request is still running a turn on the same conversation.
    pub fn thread_busy() -> Self {
        let message = "A turn of this conversation is still running; wait for its answer (or stop it) and send the message again.";
        Self::new(StatusCode::CONFLICT, "invalid_request_error", Some("thread_busy"), message)
    }

    /// 404: no such route.
    pub fn unknown_url(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        let message = format!(
            "Unknown request URL: {method} {path}. This server offers GET /v1/models, POST /v1/chat/completions, the threads API under /threads and the web UI at /."
        );
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("unknown_url"), message)
    }

    /// 405: the route exists, but not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        let message = format!("{path} does not accept {method}; see the API's routes in the documentation of peregrine serve.");
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", Some("method_not_allowed"), message)
    }

    /// 500: the turn stopped for a reason of the server.
    pub fn server_error(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, message)
    }

    /// 404: no thread of that id is visible to the caller (it does not exist, or belongs to
    /// another key: the answer is the same).
    pub fn thread_not_found(thread_id: &str) -> Self {
        let thread_id: String = thread_id.chars().take(200).collect();
        let message = format!("There is no thread '{thread_id}' (GET /threads lists yours; POST /threads creates one).");
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("thread_not_found"), message)
    }

    /// 404: this server knows no such run of the thread.
    pub fn run_not_found(thread_id: &str, run_id: &str) -> Self {
        let run_id: String = run_id.chars().take(200).collect();
        let message = format!(
            "There is no run '{run_id}' of thread '{thread_id}' on this server (runs are kept by the process that started them, and only \
             for a while after they end; GET /threads/{thread_id}/state shows the thread itself)."
        );
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("run_not_found"), message)
    }

    /// 400: a native API request that cannot be used.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_request"), message)
    }

    /// 409: a thread operation that conflicts with the thread's state (no approval pending, a
    /// stale approval id, a thread id that exists already).
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", Some(code), message)
    }

    /// 403 `host_not_allowed`: a server without keys answers only requests addressed to a loopback
    /// name (or a host of `server.allowed_origins`), so a web page cannot reach it through DNS
    /// rebinding.
    pub fn host_not_allowed(host: &str) -> Self {
        let message = format!(
            "This server has no API keys, so it answers only requests for a loopback address (localhost, 127.0.0.1, [::1]), not for host '{host}'. Open it as http://127.0.0.1:<port>/, or set server.api_keys (or server.allowed_origins) in config.yml."
        );
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", Some("host_not_allowed"), message)
    }

    /// 403 `origin_not_allowed`: a request a web page of another origin made.
    pub fn origin_not_allowed(origin: &str) -> Self {
        let message = format!(
            "Requests from web pages of another origin ('{origin}') are refused: a server without keys obeys only its own web UI and clients that are not browsers. To use a UI served elsewhere, list its origin in server.allowed_origins in config.yml."
        );
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", Some("origin_not_allowed"), message)
    }

    /// 415 `unsupported_media_type`: a body that is not declared as JSON.
    pub fn unsupported_media_type(given: &str) -> Self {
        let message = format!("The body must be sent as 'Content-Type: application/json', not '{given}'.");
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", Some("unsupported_media_type"), message)
    }

    /// 503 `server_overloaded` with `Retry-After`: `server.max_turns_in_flight` turns run already.
    pub fn overloaded(limit: usize, retry_after_seconds: u64) -> Self {
        let message = format!(
            "The server is handling as many requests as it is configured for ({limit} at once, server.max_turns_in_flight); nothing was started. Send the request again in a few seconds."
        );
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("server_overloaded"), message);
        error.retry_after_seconds = Some(retry_after_seconds);
        error
    }

    /// 408 `request_timeout`: the body did not arrive within `server.body_timeout_seconds`.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        let message = format!(
            "The request body was not all sent within {} s (server.body_timeout_seconds); nothing was started. Send the request again.",
            limit.as_secs()
        );
        Self::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", Some("request_timeout"), message)
    }

    /// 414 `uri_too_long`: a URL longer than the server reads.
    pub fn uri_too_long(limit: usize) -> Self {
        let message = format!("The URL is longer than {limit} bytes; no route of this server takes one that long.");
        Self::new(StatusCode::URI_TOO_LONG, "invalid_request_error", Some("uri_too_long"), message)
    }

    /// 413 `message_too_large`: a message over `server.max_message_bytes`.
    pub fn message_too_large(limit: usize, param: &'static str) -> Self {
        let message = format!(
            "The message is larger than this server accepts ({limit} bytes of text, server.max_message_bytes); nothing was started. Shorten it, or attach the data another way."
        );
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", Some("message_too_large"), message).with_param(param)
    }

    /// The same error with its message passed through `redact` (secrets of the configuration
    /// that a storage or provider error may quote).
    pub fn redacted(mut self, redact: &crate::Redact) -> Self {
        self.message = redact(&self.message);
        self
    }

    /// The `{"error": {..}}` body.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}})
    }

    /// 400 `unsupported_value`: a request option whose answer this server cannot give (`n` over 1,
    /// a forced tool call, structured output), named in `param`.
    pub fn unsupported_value(param: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("unsupported_value"), message).with_param(param)
    }

    /// 400 `invalid_body`: the body could not be read to its end (`why`: the transport's
    /// error); the client stopped sending it, or broke its encoding.
    pub fn body_unreadable(why: &str) -> Self {
        let why: String = why.chars().take(200).collect();
        let message = format!("The request body could not be read to its end ({why}); send the request again.");
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_body"), message)
    }
}

impl From<AgentError> for ApiError {
    fn from(error: AgentError) -> Self {
        match error {
            AgentError::Gateway(error) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", None, error.to_string()),
            AgentError::Run(RunError::Checkpoint(CheckpointError::ThreadBusy { .. })) => ApiError::thread_busy(),
            AgentError::Run(RunError::PendingResume { .. }) => ApiError::conflict(
                "unfinished_run",
                "The previous turn was cut off after its approval was given, so the approved action has not finished; nothing was \
                 sent. Continue that answer first (Open WebUI: Continue Response), then send your message again.",
            ),
            AgentError::NothingToContinue(why) => crate::continuation::nothing_to_continue(why),
            AgentError::Run(
                RunError::StaleResume { .. }
                | RunError::ForgedResume { .. }
                | RunError::NothingToResume { .. }
                | RunError::PendingInterrupt { .. },
            ) => ApiError::conflict(
                "approval_changed",
                "The approval this message answered was answered, withdrawn or replaced in the meantime (another window or \
                 process), so nothing was done. Send the message again to see where the conversation stands.",
            ),
            AgentError::Run(error) => ApiError::server_error(format!("The agent could not finish the turn: {error}")),
            other => ApiError::server_error(format!("The agent could not handle the message: {other}")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &self.body());
        if let Some(seconds) = self.retry_after_seconds {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A JSON answer with this status.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string()).into_response()
}

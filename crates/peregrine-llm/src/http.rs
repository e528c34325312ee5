//! HTTP plumbing shared by the remote providers: the client, the mapping of transport
//! errors and HTTP statuses to [`LlmErrorKind`]s with messages that say what to fix, and the
//! driver that turns a line-oriented streamed body (SSE, NDJSON) into [`StreamEvent`]s.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use crate::error::{LlmError, LlmErrorKind};
use crate::provider::EventStream;
use crate::types::StreamEvent;

/// An HTTP client with the provider's timeout, applied to connecting and to every read: a
/// server that goes silent that long fails, while a long answer that keeps streaming does not.
pub fn client(timeout: Duration) -> Result<reqwest::Client, LlmError> {
    reqwest::Client::builder()
        .read_timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .build()
        .map_err(|error| LlmError::new(LlmErrorKind::Config, "-", "-", format!("cannot build the HTTP client: {error}")))
}

/// Sends a prepared request and turns transport failures and error statuses into
/// [`LlmError`]s; returns the response of a 2xx.
///
/// Providers sometimes quote the credentials they refused ("Incorrect API key provided: …"):
/// every credential header value of the request is scrubbed from the error body before it can
/// reach an error message, an event, a log or a checkpoint.
pub async fn send(builder: reqwest::RequestBuilder, provider: &str, model: &str, url: &str) -> Result<reqwest::Response, LlmError> {
    let (client, request) = builder.build_split();
    let request = request.map_err(|error| transport_error(provider, model, url, &error))?;
    let credentials = credentials_of(request.headers());
    let response = client.execute(request).await.map_err(|error| transport_error(provider, model, url, &error))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let headers = response.headers().clone();
    let body = scrub(&response.text().await.unwrap_or_default(), &credentials);
    Err(status_error(provider, model, status, &headers, &body))
}

/// The secret parts of a request's credential headers (`Authorization` with and without its
/// scheme, `x-api-key`, `api-key`).
fn credentials_of(headers: &HeaderMap) -> Vec<String> {
    let mut secrets = Vec::new();
    for name in [reqwest::header::AUTHORIZATION.as_str(), "x-api-key", "api-key"] {
        for value in headers.get_all(name) {
            let Ok(value) = value.to_str() else { continue };
            let value = value.trim();
            if let Some((_, token)) = value.split_once(' ') {
                secrets.push(token.trim().to_owned());
            }
            secrets.push(value.to_owned());
        }
    }
    // The longest first, so a key is never half-replaced inside its `Bearer` form.
    secrets.retain(|secret| secret.len() >= 4);
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets
}

/// `text` with every credential replaced by `***`.
fn scrub(text: &str, credentials: &[String]) -> String {
    credentials.iter().fold(text.to_owned(), |text, secret| text.replace(secret.as_str(), "***"))
}

/// Checks a provider's `base_url`: an http(s) URL without credentials or a query (keys belong
/// in `api_key`, where they are never printed), returned without a trailing slash.
pub fn validate_base_url(provider: &str, base_url: &str) -> Result<String, LlmError> {
    let trimmed = base_url.trim().trim_end_matches('/');
    let invalid =
        |why: &str| LlmError::new(LlmErrorKind::Config, provider, "-", format!("api.providers.{provider}.base_url is invalid: {why}"));
    if trimmed.is_empty() {
        return Err(invalid("it is empty; set it to the server's URL, e.g. http://localhost:8000/v1"));
    }
    let url =
        reqwest::Url::parse(trimmed).map_err(|error| invalid(&format!("{error}; write it with its scheme, e.g. http://{trimmed}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(invalid(&format!("the scheme must be http or https, not '{}'", url.scheme())));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(invalid("it carries credentials or a query; put the key in api.providers.<name>.api_key, where it is never printed"));
    }
    Ok(trimmed.to_owned())
}

/// A transport failure (no HTTP status).
pub fn transport_error(provider: &str, model: &str, url: &str, error: &reqwest::Error) -> LlmError {
    let (kind, message) = if error.is_timeout() {
        (
            LlmErrorKind::Timeout,
            format!("no answer from {url} within the timeout; raise api.providers.{provider}.timeout_seconds or check the server"),
        )
    } else if error.is_connect() {
        (
            LlmErrorKind::Connect,
            format!("cannot connect to {url}: {error}; check api.providers.{provider}.base_url and that the server runs"),
        )
    } else if error.is_builder() {
        (LlmErrorKind::Config, format!("cannot build a request to {url}: {error}; check api.providers.{provider}.base_url"))
    } else if error.is_decode() || error.is_body() {
        (LlmErrorKind::StreamCut, format!("the answer from {url} broke off: {error}"))
    } else {
        (LlmErrorKind::Connect, format!("request to {url} failed: {error}"))
    };
    LlmError::new(kind, provider, model, message)
}

/// `Retry-After` as seconds or an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    (date.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().ok()
}

/// An error status, classified; `body` is the provider's error text (JSON or not).
pub fn status_error(provider: &str, model: &str, status: StatusCode, headers: &HeaderMap, body: &str) -> LlmError {
    let detail = error_detail(body);
    let lower = detail.to_lowercase();
    let code = status.as_u16();
    let (kind, message) = match code {
        429 if lower.contains("insufficient_quota") || lower.contains("billing") => (
            LlmErrorKind::Auth { status: code },
            format!("the account has no quota left ({code}): {detail}; check the billing or the key in api.providers.{provider}.api_key"),
        ),
        429 => (LlmErrorKind::RateLimited, format!("rate limited (429): {detail}")),
        408 => (LlmErrorKind::Timeout, format!("the provider timed out the request (408): {detail}")),
        413 => (LlmErrorKind::ContextLength, format!("the request is too large for the provider (413): {detail}")),
        401 | 403 => (
            LlmErrorKind::Auth { status: code },
            format!("the provider refused the credentials ({code}): {detail}; check api.providers.{provider}.api_key"),
        ),
        404 if lower.contains("model") => (
            LlmErrorKind::InvalidModel,
            format!(
                "model '{model}' is unknown to the provider ({code}): {detail}; fix the model_id of this role in config.yml (models.<role>.model_id)"
            ),
        ),
        400 | 422 if is_context_overflow(&lower) => {
            (LlmErrorKind::ContextLength, format!("the prompt does not fit the model's context window ({code}): {detail}"))
        }
        400 | 422 if lower.contains("model") && (lower.contains("not found") || lower.contains("does not exist")) => (
            LlmErrorKind::InvalidModel,
            format!(
                "model '{model}' is unknown to the provider ({code}): {detail}; fix the model_id of this role in config.yml (models.<role>.model_id)"
            ),
        ),
        404 => (
            LlmErrorKind::BadRequest { status: code },
            format!(
                "the provider has no such endpoint (404): {detail}; check api.providers.{provider}.base_url (OpenAI-compatible servers usually end in /v1)"
            ),
        ),
        500..=599 => (LlmErrorKind::Server { status: code }, format!("the provider failed ({code}): {detail}")),
        _ => (LlmErrorKind::BadRequest { status: code }, format!("the provider rejected the request ({code}): {detail}")),
    };
    LlmError::new(kind, provider, model, message).with_retry_after(retry_after(headers))
}

fn is_context_overflow(lower: &str) -> bool {
    // "exceed context limit": Anthropic's "input length and `max_tokens` exceed context limit".
    [
        "context_length_exceeded",
        "context length",
        "maximum context",
        "context window",
        "too many tokens",
        "prompt is too long",
        "exceed context limit",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// The message of an error body: OpenAI `{"error":{"message","code"}}`, Anthropic
/// `{"error":{"type","message"}}`, Ollama `{"error":"…"}`, or the raw text.
pub fn error_detail(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let detail = parsed.as_ref().and_then(|value| {
        let error = value.get("error")?;
        if let Some(text) = error.as_str() {
            return Some(text.to_owned());
        }
        let message = error.get("message").and_then(serde_json::Value::as_str).unwrap_or_default();
        let code = error.get("code").or_else(|| error.get("type")).and_then(serde_json::Value::as_str);
        Some(match code {
            Some(code) => format!("{message} [{code}]"),
            None => message.to_owned(),
        })
    });
    detail.unwrap_or_else(|| body.chars().take(300).collect())
}

/// Turns the lines of one streamed body into events; one implementation per wire format.
pub trait LineParser: Send + 'static {
    /// Handles one complete line (newline and trailing `\r` removed), pushing the events it
    /// makes. A `Done` or an error ends the stream.
    fn line(&mut self, line: &str, events: &mut Vec<Result<StreamEvent, LlmError>>);

    /// The error for a body that ended before the stream's final event (`StreamCut`).
    fn cut(&self) -> LlmError;
}

/// The events of a streamed `response` decoded line by line with `parser`. Lines are split on
/// bytes, so a UTF-8 character cut across chunks survives; the stream stops after `Done` or the
/// first error; a body that ends early or breaks off yields `StreamCut`.
pub fn line_events(response: reqwest::Response, parser: impl LineParser, provider: &str, model: &str, url: &str) -> EventStream {
    let state = LineState {
        bytes: response.bytes_stream(),
        parser,
        buffer: Vec::new(),
        pending: VecDeque::new(),
        finished: false,
        origin: [provider.to_owned(), model.to_owned(), url.to_owned()],
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.pending.pop_front() {
                if !matches!(event, Ok(StreamEvent::Token(_))) {
                    state.finished = true;
                    state.pending.clear();
                }
                return Some((event, state));
            }
            if state.finished {
                return None;
            }
            match state.bytes.next().await {
                Some(Ok(chunk)) => state.take_lines(&chunk),
                Some(Err(error)) => {
                    let [provider, model, url] = &state.origin;
                    let error = transport_error(provider, model, url, &error);
                    state.pending.push_back(Err(LlmError { kind: LlmErrorKind::StreamCut, ..error }));
                }
                None => state.end_of_body(),
            }
        }
    }))
}

/// State of [`line_events`]: undelivered bytes and events.
struct LineState<S, P> {
    bytes: S,
    parser: P,
    buffer: Vec<u8>,
    pending: VecDeque<Result<StreamEvent, LlmError>>,
    finished: bool,
    /// Provider, model and URL, for transport errors.
    origin: [String; 3],
}

impl<S, P: LineParser> LineState<S, P> {
    fn take_lines(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
        while let Some(newline) = self.buffer.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=newline).collect();
            self.feed(&line[..newline]);
        }
    }

    fn feed(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let mut events = Vec::new();
        self.parser.line(text.trim_end_matches('\r'), &mut events);
        self.pending.extend(events);
    }

    /// The body ended: its last line may lack a newline; without a final event it was cut.
    fn end_of_body(&mut self) {
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            self.feed(&rest);
        }
        if self.pending.iter().all(|event| matches!(event, Ok(StreamEvent::Token(_)))) {
            self.pending.push_back(Err(self.parser.cut()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(status: u16, body: &str) -> LlmErrorKind {
        let status = StatusCode::from_u16(status).expect("valid status");
        status_error("openai", "gpt-x", status, &HeaderMap::new(), body).kind
    }

    #[test]
    fn credentials_are_scrubbed_from_error_bodies() {
        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, "Bearer sk-live-0123456789".parse().expect("header"));
        headers.insert("x-api-key", "anthropic-key-987".parse().expect("header"));
        let credentials = credentials_of(&headers);
        let body = "Incorrect API key provided: Bearer sk-live-0123456789 (also sk-live-0123456789, anthropic-key-987)";
        let scrubbed = scrub(body, &credentials);
        assert_eq!(scrubbed, "Incorrect API key provided: *** (also ***, ***)");
        assert!(credentials_of(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn statuses_map_to_the_callers_next_action() {
        assert_eq!(classify(429, "{}"), LlmErrorKind::RateLimited);
        assert_eq!(classify(401, "{\"error\":{\"message\":\"bad key\"}}"), LlmErrorKind::Auth { status: 401 });
        assert_eq!(
            classify(404, "{\"error\":{\"message\":\"The model `x` does not exist\",\"code\":\"model_not_found\"}}"),
            LlmErrorKind::InvalidModel
        );
        assert_eq!(
            classify(
                400,
                "{\"error\":{\"message\":\"This model's maximum context length is 8192 tokens\",\"code\":\"context_length_exceeded\"}}"
            ),
            LlmErrorKind::ContextLength
        );
        assert_eq!(classify(400, "{\"error\":\"model 'llama9' not found, try pulling it first\"}"), LlmErrorKind::InvalidModel);
        assert_eq!(classify(503, "upstream down"), LlmErrorKind::Server { status: 503 });
        assert_eq!(classify(400, "{\"error\":{\"message\":\"bad field\"}}"), LlmErrorKind::BadRequest { status: 400 });
        assert_eq!(
            classify(429, "{\"error\":{\"message\":\"quota\",\"code\":\"insufficient_quota\"}}"),
            LlmErrorKind::Auth { status: 429 }
        );
        assert_eq!(classify(408, "timeout"), LlmErrorKind::Timeout);
        assert_eq!(classify(413, "{\"error\":{\"type\":\"request_too_large\"}}"), LlmErrorKind::ContextLength);
        assert_eq!(classify(404, "<html>404 page not found</html>"), LlmErrorKind::BadRequest { status: 404 });
        let anthropic_overflow = "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"input length and `max_tokens` exceed context limit: 198000 + 4096 > 200000\"}}";
        assert_eq!(classify(400, anthropic_overflow), LlmErrorKind::ContextLength);
    }

    #[test]
    fn base_urls_are_checked_once() {
        assert_eq!(validate_base_url("vllm", "http://localhost:8000/v1/").expect("valid"), "http://localhost:8000/v1");
        for (bad, why) in [
            ("localhost:11434", "scheme"),
            ("http://user:sk-1@host/v1", "credentials"),
            ("https://host/v1?api-key=sk", "credentials"),
            ("", "empty"),
        ] {
            let error = validate_base_url("vllm", bad).expect_err(bad);
            assert_eq!(error.kind, LlmErrorKind::Config);
            let message = error.to_string();
            assert!(message.contains(why) && message.contains("api.providers.vllm.base_url"), "{bad}: {message}");
            assert!(!message.contains("sk-1") || bad.is_empty(), "the secret is not echoed: {message}");
        }
    }

    #[test]
    fn retry_after_reads_seconds() {
        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().expect("header"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        let error = status_error("openai", "m", StatusCode::TOO_MANY_REQUESTS, &headers, "{}");
        assert_eq!(error.retry_after, Some(Duration::from_secs(2)));
    }
}

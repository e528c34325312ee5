//! A fixture HTTP server for the provider tests: it answers each request with the next scripted
//! reply (a recorded body from `tests/fixtures/`, optionally in small chunks or broken off) and
//! records what the provider sent, so tests check both sides of the wire.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use peregrine_llm::{LlmConfig, ModelConfig};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// The structured answer the fixtures carry.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
pub struct BeamStatus {
    /// Beam current.
    pub current_ma: f64,
    /// Whether it is stable.
    pub stable: bool,
    /// One sentence.
    pub summary: String,
}

/// The fixture answer for [`BeamStatus`].
pub fn expected_beam_status() -> BeamStatus {
    BeamStatus { current_ma: 500.2, stable: true, summary: "Beam current is stable.".into() }
}

/// The text of `tests/fixtures/<path>`.
pub fn fixture(path: &str) -> String {
    let full = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|error| panic!("fixture {full}: {error}"))
}

/// A config with one role (`classifier`) on `provider`/`model_id`.
pub fn one_role_config(provider: &str, model_id: &str, max_tokens: Option<u32>) -> LlmConfig {
    let mut config = LlmConfig::default();
    config
        .models
        .insert("classifier".into(), ModelConfig { provider: provider.into(), model_id: model_id.into(), max_tokens, temperature: None });
    config
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send the body in pieces of this many bytes (splitting lines and UTF-8 characters).
    chunk_size: Option<usize>,
    /// Break the connection off after the body instead of ending it cleanly.
    abort: bool,
}

impl Reply {
    /// `fixture` with `status` as `application/json`.
    pub fn json(status: u16, fixture_path: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: fixture(fixture_path).into_bytes(),
            chunk_size: None,
            abort: false,
        }
    }

    /// `fixture` as a 200 stream of `content_type`, sent in 7-byte pieces.
    pub fn stream(fixture_path: &str, content_type: &str) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            body: fixture(fixture_path).into_bytes(),
            chunk_size: Some(7),
            abort: false,
        }
    }

    /// Adds a response header.
    #[allow(dead_code, reason = "each test crate compiles this module; not all add headers")]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Breaks the connection off after the body (a transport failure mid-stream).
    pub fn aborted(mut self) -> Self {
        self.abort = true;
        self
    }

    fn into_response(self) -> Response {
        let pieces: Vec<Result<Bytes, std::io::Error>> = match self.chunk_size {
            Some(size) => self.body.chunks(size).map(|piece| Ok(Bytes::copy_from_slice(piece))).collect(),
            None => vec![Ok(Bytes::from(self.body))],
        };
        let cut = self.abort.then(|| Err(std::io::Error::other("fixture server cut the connection")));
        let body = Body::from_stream(futures::stream::iter(pieces.into_iter().chain(cut)));
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(self.status).expect("valid status");
        for (name, value) in self.headers {
            response
                .headers_mut()
                .insert(HeaderName::try_from(name).expect("header name"), HeaderValue::try_from(value).expect("header value"));
        }
        response
    }
}

/// One request the provider sent.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Request path.
    pub path: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// The JSON body.
    pub body: Value,
}

impl Recorded {
    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default()
    }
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    requests: Vec<Recorded>,
}

type Shared = Arc<Mutex<Script>>;

/// The fixture server on 127.0.0.1 (stops with the test's runtime).
pub struct FixtureServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    script: Shared,
}

impl FixtureServer {
    /// Serves `replies`, one per request, in order.
    pub async fn start(replies: impl IntoIterator<Item = Reply>) -> Self {
        let script: Shared = Arc::new(Mutex::new(Script { replies: replies.into_iter().collect(), requests: Vec::new() }));
        let router = Router::new().fallback(answer).with_state(Arc::clone(&script));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("fixture server") });
        Self { url, script }
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.script.lock().expect("script").requests.clone()
    }

    /// The one request received.
    pub fn only_request(&self) -> Recorded {
        let requests = self.requests();
        assert_eq!(requests.len(), 1, "expected one request, got {requests:?}");
        requests.into_iter().next().expect("one request")
    }
}

async fn answer(State(script): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let mut script = script.lock().expect("script");
    let body = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    script.requests.push(Recorded { path: uri.path().to_owned(), headers, body });
    match script.replies.pop_front() {
        Some(reply) => reply.into_response(),
        None => Reply { status: 500, headers: Vec::new(), body: b"no scripted reply left".to_vec(), chunk_size: None, abort: false }
            .into_response(),
    }
}

/// Every event of `stream`, tokens as text and the end as the response or error.
pub async fn collect(
    mut stream: peregrine_llm::EventStream,
) -> (Vec<String>, Result<peregrine_llm::ChatResponse, peregrine_llm::LlmError>) {
    let mut tokens = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(peregrine_llm::StreamEvent::Token(token)) => tokens.push(token),
            Ok(peregrine_llm::StreamEvent::Done(response)) => {
                assert!(stream.next().await.is_none(), "nothing may follow Done");
                return (tokens, Ok(response));
            }
            Err(error) => {
                assert!(stream.next().await.is_none(), "nothing may follow an error");
                return (tokens, Err(error));
            }
        }
    }
    panic!("the stream ended without Done or an error (tokens so far: {tokens:?})");
}

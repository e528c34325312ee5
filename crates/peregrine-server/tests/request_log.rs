//! The request log over real HTTP: one `info` line per request (method, path, status,
//! duration; a turn's thread) and never a key, a body or a query string. Alone in its test
//! binary, so that its global `tracing` subscriber is the only one.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;

use peregrine_agent::Agent;
use peregrine_llm::Secret;
use peregrine_server::{ServerOptions, router};
use peregrine_testkit::agent_fixture::{weather_agent, weather_script};
use peregrine_testkit::llm_server::ScriptedLlmServer;
use serde_json::{Value, json};

const MODEL: &str = "peregrine-weather";

struct Served {
    url: String,
    client: reqwest::Client,
    agent: Arc<Agent>,
    _llm: ScriptedLlmServer,
    _dir: tempfile::TempDir,
}

async fn serve(options: ServerOptions) -> Served {
    let llm = ScriptedLlmServer::start(weather_script()).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &dir.path().join("data")).await.unwrap();
    let agent = Arc::new(agent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let app = router(Arc::clone(&agent), options);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { url, client: reqwest::Client::new(), agent, _llm: llm, _dir: dir }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

impl Served {
    async fn chat_as(&self, key: Option<&str>, messages: Value) -> (u16, Value) {
        let mut request = self.client.post(format!("{}/chat/completions", self.url)).json(&json!({"model": MODEL, "messages": messages}));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn threads(&self) -> Vec<String> {
        self.agent.graph().threads().await.unwrap().into_iter().map(|thread| thread.thread_id).collect()
    }
}

/// What a `tracing` subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// `serve --log-file` at its default level showed nothing: every request gets one line (method,
/// path, status, duration; a turn's thread), and no key, body or query string is ever written.
#[tokio::test]
async fn every_request_is_logged_once_without_its_key_body_or_query() {
    const KEY: &str = "sk-logged-never-4711";
    let log = CapturedLog::default();
    // The only test of this binary: a global subscriber sees every thread's events, and no other
    // test's subscriber comes and goes meanwhile (which made a thread's own default miss events).
    let subscriber = tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).with_max_level(tracing::Level::INFO).finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
    let served = serve(ServerOptions { api_keys: vec![Secret::new(KEY)], ..ServerOptions::new(MODEL) }).await;

    let models = served.client.get(format!("{}/models?secret_query=hidden-value", served.url)).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(models.status().as_u16(), 200);
    let refused = served.client.get(format!("{}/models", served.url)).bearer_auth("sk-wrong-0815").send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let (status, body) = served.chat_as(Some(KEY), json!([user("What's the weather in Prague? my-body-text")])).await;
    assert_eq!(status, 200, "{body}");
    let missing = served.client.get(format!("{}/nowhere", served.url)).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);

    let threads = served.threads().await;
    assert_eq!(threads.len(), 1, "{threads:?}");
    let text = log.text();
    let lines: Vec<&str> = text.lines().filter(|line| line.contains(peregrine_server::REQUEST_LOG_TARGET)).collect();
    assert_eq!(lines.len(), 4, "one line per request:\n{text}");
    let expected = [
        ("method=GET path=/v1/models status=200 duration_ms=", None),
        ("method=GET path=/v1/models status=401 duration_ms=", None),
        ("method=POST path=/v1/chat/completions status=200 duration_ms=", Some(&threads[0])),
        ("method=GET path=/v1/nowhere status=404 duration_ms=", None),
    ];
    for (line, (fields, thread)) in lines.iter().zip(expected) {
        assert!(line.contains(" INFO ") && line.contains(fields), "{line}");
        assert_eq!(thread.is_some_and(|thread| line.contains(&format!("thread={thread}"))), thread.is_some(), "{line}");
        assert!(thread.is_some() || !line.contains("thread="), "{line}");
    }
    for secret in [KEY, "sk-wrong-0815", "Bearer", "secret_query", "hidden-value"] {
        assert!(!text.contains(secret), "{secret:?} was logged:\n{text}");
    }
    assert!(lines.iter().all(|line| !line.contains("my-body-text") && !line.contains("Prague")), "no body in the request log");
}

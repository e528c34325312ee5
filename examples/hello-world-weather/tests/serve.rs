//! `hello-world-weather serve` end to end: the real binary in a temp project, serving against the
//! scripted LLM server; the address it prints, bearer keys from config.yml, a chat completion, the
//! web UI page, a native run, a clean stop on SIGINT, and the refusal to serve the network
//! without keys.

#![allow(clippy::expect_used, reason = "test helpers report failures by panicking")]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use peregrine_testkit::agent_fixture::{project_config, weather_script};
use peregrine_testkit::llm_server::ScriptedLlmServer;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const SERVE_KEY: &str = "serve-key-3f9a1c";

fn project(base_url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = project_config(base_url, "sk-test")
        + "server:
  api_keys:
    - ${SERVE_KEY}
";
    std::fs::write(dir.path().join("config.yml"), config).expect("config");
    std::fs::write(dir.path().join(".env"), format!("SERVE_KEY={SERVE_KEY}\n")).expect(".env");
    dir
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Kills the server when the test ends, however it ends.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_openai_requests_with_the_configured_key() {
    let llm = ScriptedLlmServer::start(weather_script()).await;
    let dir = project(&llm.base_url());
    let mut child = command(dir.path(), &["serve", "--port", "0", "--log-file", "serve.log"]).spawn().expect("serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut server = Server(Some(child));
    let address = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("the address line");
        line.trim().strip_prefix("listening on ").map(str::to_owned).expect("listening on http://…")
    })
    .await
    .expect("joined");
    assert!(address.starts_with("http://127.0.0.1:"), "loopback by default: {address}");
    let client = reqwest::Client::new();

    let refused = client.get(format!("{address}/v1/models")).send().await.expect("request");
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.expect("JSON error");
    assert_eq!(body["error"]["code"], "invalid_api_key");

    let models: Value =
        client.get(format!("{address}/v1/models")).bearer_auth(SERVE_KEY).send().await.expect("request").json().await.expect("JSON");
    assert_eq!(models["data"][0]["id"], "hello-world-weather");

    let answer = client
        .post(format!("{address}/v1/chat/completions"))
        .bearer_auth(SERVE_KEY)
        .json(&json!({"model": "hello-world-weather", "messages": [{"role": "user", "content": "What's the weather in Prague?"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("JSON");
    let content = answer["choices"][0]["message"]["content"].as_str().expect("content");
    assert!(content.contains("Weather in Prague"), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");

    // The web UI and the native API are served too.
    let page = client.get(format!("{address}/")).send().await.expect("request");
    assert_eq!(page.status(), 200);
    assert!(page.text().await.expect("page").to_lowercase().starts_with("<!doctype html"));
    let thread: Value = client
        .post(format!("{address}/threads"))
        .bearer_auth(SERVE_KEY)
        .json(&json!({}))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("JSON");
    let thread_id = thread["thread_id"].as_str().expect("thread id");
    let run: Value = client
        .post(format!("{address}/threads/{thread_id}/runs/wait"))
        .bearer_auth(SERVE_KEY)
        .json(&json!({"input": "What's the weather in Prague?"}))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("JSON");
    assert_eq!(run["status"], "success", "{run}");

    // Ctrl-C with nothing running stops at once, cleanly.
    let mut child = server.0.take().expect("the server");
    let interrupted = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(interrupted.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), tokio::task::spawn_blocking(move || child.wait()))
        .await
        .expect("serve stops within 30 s of SIGINT")
        .expect("joined")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    llm.shutdown().await;

    // The log file, at the default level, has one line per request, and never the key.
    let log = std::fs::read_to_string(dir.path().join("serve.log")).expect("the log file");
    let requests: Vec<&str> = log.lines().filter(|line| line.contains(" INFO ") && line.contains(" status=")).collect();
    assert_eq!(requests.len(), 6, "one line per request:\n{log}");
    assert!(requests[0].contains("method=GET path=/v1/models status=401 duration_ms="), "{log}");
    assert!(requests[2].contains("method=POST path=/v1/chat/completions status=200") && requests[2].contains("thread=oai-"), "{log}");
    assert!(!log.contains(SERVE_KEY), "the key is never logged:\n{log}");
}

#[test]
fn serving_the_network_without_keys_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("config.yml"), "models:\n  default:\n    provider: openai\n    model_id: gpt-4o\n").expect("config");
    let output = command(dir.path(), &["serve", "--host", "0.0.0.0", "--port", "0"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("server.api_keys"), "{message}");
}

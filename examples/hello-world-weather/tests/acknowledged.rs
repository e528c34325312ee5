//! Nothing acknowledged is lost: the real `serve` binary on SQLite takes 30 messages at once
//! (half as native runs, half as streamed chat completions), and is killed with SIGKILL the
//! moment the first acknowledgement (a 201, the first bytes of a stream) reaches its client (in
//! every other round, a later one). After a restart every acknowledged message is in its thread.
//! Ten rounds.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use peregrine_testkit::agent_fixture::{project_config, weather_script};
use peregrine_testkit::llm_server::ScriptedLlmServer;
use serde_json::{Value, json};
use tokio::sync::mpsc;

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const ROUNDS: usize = 10;
const MESSAGES: usize = 30;
/// How long one step may take before the test fails; a bound, never a synchronisation.
const PATIENCE: Duration = Duration::from_secs(60);

/// Kills the server when dropped.
struct Serving {
    child: Child,
    address: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(dir: &Path) -> Serving {
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0"])
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let address = tokio::time::timeout(
        PATIENCE,
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).expect("the address line");
            line.trim().strip_prefix("listening on ").map(str::to_owned).expect("listening on http://…")
        }),
    )
    .await
    .expect("serve prints its address")
    .expect("joined");
    Serving { child, address }
}

/// Sends one message and reports its text once the server acknowledged it.
async fn send(client: reqwest::Client, address: String, thread: Option<String>, text: String, acknowledged: mpsc::UnboundedSender<String>) {
    let response = match &thread {
        Some(thread) => client.post(format!("{address}/threads/{thread}/runs")).json(&json!({"input": text})).send().await,
        None => {
            let body = json!({"model": "hello-world-weather", "stream": true, "messages": [{"role": "user", "content": text}]});
            client.post(format!("{address}/v1/chat/completions")).header("X-Session-Id", text.as_str()).json(&body).send().await
        }
    };
    let Ok(mut response) = response else { return };
    let acknowledged_now = match thread {
        Some(_) => response.status().as_u16() == 201,
        // A stream acknowledges with its first bytes.
        None => response.status().as_u16() == 200 && matches!(response.chunk().await, Ok(Some(_))),
    };
    if acknowledged_now {
        let _ = acknowledged.send(text);
    }
}

/// Every user message of every thread of the store.
async fn stored_messages(client: &reqwest::Client, address: &str) -> BTreeSet<String> {
    let threads: Value = client.get(format!("{address}/threads?limit=1000")).send().await.expect("threads").json().await.expect("JSON");
    let mut messages = BTreeSet::new();
    for thread in threads.as_array().expect("a list") {
        let id = thread["thread_id"].as_str().expect("id");
        let state: Value = client.get(format!("{address}/threads/{id}/state")).send().await.expect("state").json().await.expect("JSON");
        for message in state["messages"].as_array().into_iter().flatten() {
            if message["role"] == "user" {
                messages.insert(message["content"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_acknowledged_message_is_lost_when_the_server_is_killed_at_the_first_acknowledgement() {
    let llm = ScriptedLlmServer::start(weather_script()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("config.yml"), project_config(&llm.base_url(), "sk-test")).expect("config");
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
    let mut acknowledged_total = 0;
    for round in 0..ROUNDS {
        let serving = start(dir.path()).await;
        let mut threads = Vec::new();
        for _ in 0..MESSAGES / 2 {
            let thread: Value = client
                .post(format!("{}/threads", serving.address))
                .json(&json!({}))
                .send()
                .await
                .expect("create")
                .json()
                .await
                .expect("JSON");
            threads.push(thread["thread_id"].as_str().expect("id").to_owned());
        }
        let (sender, mut acknowledgements) = mpsc::unbounded_channel();
        let mut senders = Vec::new();
        for index in 0..MESSAGES {
            let text = format!("round {round} message {index}: what's the weather in Prague?");
            let thread = threads.get(index / 2).filter(|_| index % 2 == 0).cloned();
            senders.push(tokio::spawn(send(client.clone(), serving.address.clone(), thread, text, sender.clone())));
        }
        drop(sender);
        // Killed at the first acknowledgement, or (every other round) at a later one, so that
        // more acknowledged messages are checked.
        let kill_at = if round % 2 == 0 { 1 } else { 1 + round * 2 };
        let mut acknowledged = Vec::new();
        while acknowledged.len() < kill_at {
            match tokio::time::timeout(PATIENCE, acknowledgements.recv()).await.expect("an acknowledgement") {
                Some(text) => acknowledged.push(text),
                None => break,
            }
        }
        assert!(!acknowledged.is_empty(), "round {round}: nothing was acknowledged");
        drop(serving); // SIGKILL, at once
        for sender in senders {
            tokio::time::timeout(PATIENCE, sender).await.expect("the clients end").expect("joined");
        }
        while let Ok(text) = acknowledgements.try_recv() {
            acknowledged.push(text);
        }
        let restarted = start(dir.path()).await;
        let stored = stored_messages(&client, &restarted.address).await;
        let lost: Vec<&String> = acknowledged.iter().filter(|text| !stored.contains(*text)).collect();
        assert!(lost.is_empty(), "round {round}: {} of {} acknowledged messages lost: {lost:?}", lost.len(), acknowledged.len());
        acknowledged_total += acknowledged.len();
    }
    eprintln!("{acknowledged_total} messages acknowledged over {ROUNDS} rounds, none lost");
}

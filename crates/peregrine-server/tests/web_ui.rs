//! The web UI in a real browser: the weather agent on the scripted LLM server (scripted to answer
//! about San Francisco), served by `router()` on 127.0.0.1 with an API key, and
//! `tests/python/web_ui_check.py` driving the page at `/` in headless Chromium through Playwright:
//! the key field, a thread, a streamed answer with its live plan, a plan approval in planning
//! mode answered with the buttons and then by typing `yes` (planning mode still ticked), the
//! thread list, a stream cut mid-answer and followed again with `Last-Event-ID`, a long answer
//! ([`LONG_ANSWER_PIECES`] token events), a message sent right after a thread is picked (while
//! its state loads), a step waiting for an approval, a refused run, a thread busy with a run the
//! page does not follow, a reload. Needs Debian's Chromium and the pinned Playwright client
//! (`bash scripts/install-browser-deps.sh`); without them the test fails, it never skips.
//! The screenshot lands in `<workspace>/target/test-artifacts/web_ui.png`.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use peregrine_llm::Secret;
use peregrine_server::{ConnectionLimits, ServerOptions, router};
use peregrine_testkit::agent_fixture::{
    EXECUTION_PLAN, EXTRACTED_TASK, LlmCall, call_counts, extracted_task, is_error_analysis, weather_agent, weather_plan,
    with_weather_replies,
};
use peregrine_testkit::llm_server::{RecordedRequest, Reply, Script, ScriptedLlmServer};
use sha2::{Digest, Sha256};

const MODEL: &str = "peregrine-weather";
const API_KEY: &str = "sk-web-ui-test";
const CHROMIUM: &str = "/usr/bin/chromium";
const INSTALL_HINT: &str = "run `bash scripts/install-browser-deps.sh` (CI runs it)";
/// Bounds one run of the script; each of its waits has its own timeout of at most 60 s.
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

/// The script's question that gets the long answer contains this (so does its extracted task,
/// which respond's prompt carries).
const LONG_MARK: &str = "long report";
/// How many token events the long answer streams.
const LONG_ANSWER_PIECES: usize = 2_600;
/// The long answer's last piece.
const LONG_ANSWER_END: &str = "LONG-ANSWER-END.";

/// The long answer in [`LONG_ANSWER_PIECES`] pieces: numbered words, a line break every 40,
/// [`LONG_ANSWER_END`] last.
fn long_answer_pieces() -> Vec<String> {
    let mut pieces: Vec<String> =
        (1..LONG_ANSWER_PIECES).map(|index| format!("w{index}{}", if index % 40 == 0 { "\n" } else { " " })).collect();
    pieces.push(LONG_ANSWER_END.to_owned());
    pieces
}

/// Every call of a weather turn answered, about San Francisco; a question with [`LONG_MARK`]
/// gets the long answer.
fn san_francisco_script() -> Script {
    let asks_long = |request: &RecordedRequest| request.prompt_text().contains(LONG_MARK);
    with_weather_replies(
        Script::new()
            .on_request(
                move |request| request.schema_name.as_deref() == Some(EXTRACTED_TASK) && asks_long(request),
                Reply::json(extracted_task("Get a long report on the current weather in San Francisco")),
            )
            .on_request(
                move |request| request.schema_name.is_none() && !is_error_analysis(request) && asks_long(request),
                Reply::text("").with_chunks(long_answer_pieces()),
            )
            .on_schema(EXTRACTED_TASK, Reply::json(extracted_task("Get the current weather in San Francisco")))
            .on_schema(EXECUTION_PLAN, Reply::json(weather_plan("San Francisco", "san_francisco_weather"))),
    )
}

struct Served {
    base_url: String,
    llm: ScriptedLlmServer,
    _dir: tempfile::TempDir,
}

impl Served {
    fn calls(&self, call: LlmCall) -> usize {
        call_counts(&self.llm.chat_requests()).get(&call).copied().unwrap_or(0)
    }
}

async fn serve() -> Served {
    let llm = ScriptedLlmServer::start(san_francisco_script()).await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &data_dir).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let options = ServerOptions { api_keys: vec![Secret::new(API_KEY)], ..ServerOptions::new(MODEL) };
    let app = router(Arc::new(agent), options);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { base_url, llm, _dir: dir }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/web_ui_check.py")
}

fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap_or_else(|error| panic!("cannot create {}: {error}", dir.display()));
    dir.canonicalize().unwrap().join("web_ui.png")
}

/// `python3` with an environment that cannot send the browser elsewhere (proxies).
fn python3() -> Command {
    let mut command = Command::new("python3");
    for variable in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        command.env_remove(variable);
    }
    command.env("NO_PROXY", "127.0.0.1,localhost").env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

/// Fails (never skips) when Chromium or Playwright is missing.
fn assert_browser_installed() {
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: {INSTALL_HINT}");
    match python3().args(["-c", "import playwright.sync_api"]).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!("python3 cannot import playwright ({}): {INSTALL_HINT}", String::from_utf8_lossy(&output.stderr).trim()),
        Err(error) => panic!("python3 does not run ({error}): {INSTALL_HINT}"),
    }
}

/// Runs `web_ui_check.py <base_url> <key> <screenshot> <long answer pieces> <long answer end>`,
/// prints its output, asserts it succeeded.
async fn run_browser_check(served: &Served, screenshot: &Path) {
    let out = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out.path().join("stdout"), out.path().join("stderr"));
    // Output goes to files, so a chatty failure cannot block the child on a full pipe.
    let mut child = python3()
        .arg(script())
        .args([served.base_url.as_str(), API_KEY])
        .arg(screenshot)
        .args([LONG_ANSWER_PIECES.to_string().as_str(), LONG_ANSWER_END])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("python3 starts");
    let deadline = tokio::time::Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            panic!(
                "web_ui_check.py still ran after {SCRIPT_LIMIT:?}:\n{}\n{}",
                std::fs::read_to_string(&stdout_path).unwrap(),
                std::fs::read_to_string(&stderr_path).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (stdout, stderr) = (std::fs::read_to_string(&stdout_path).unwrap(), std::fs::read_to_string(&stderr_path).unwrap());
    eprintln!("web_ui_check.py ({status}):\n{stdout}{stderr}");
    assert!(status.success(), "web_ui_check.py failed ({status}); screenshot: {}\n{stderr}\nstdout:\n{stdout}", screenshot.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_runs_a_turn_and_a_plan_approval_in_chromium() {
    assert_browser_installed();
    let served = serve().await;

    let page = reqwest::get(format!("{}/", served.base_url)).await.unwrap();
    assert_eq!(page.status().as_u16(), 200, "the page is served without a key");
    let csp = page.headers().get("content-security-policy").map(|value| value.to_str().unwrap().to_owned()).unwrap_or_default();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("id=\"message-input\""));

    let screenshot = screenshot_path();
    std::fs::remove_file(&screenshot).ok();
    run_browser_check(&served, &screenshot).await;
    eprintln!("screenshot: {}", screenshot.display());
    assert!(std::fs::metadata(&screenshot).is_ok_and(|meta| meta.len() > 0), "no screenshot at {}", screenshot.display());

    // Seven questions: plain, in planning mode (approved with the button), in planning mode
    // (approved by typing yes), in planning mode (cancelled: planned, nothing ran), plain with its
    // stream cut and followed again, the long answer, and the one sent right after picking the
    // thread. The page's synthetic runs reach no LLM.
    assert_eq!(served.calls(LlmCall::Orchestrator), 7, "one plan per question; an approved plan runs without planning again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 6, "the weather step ran once per question");
    assert_eq!(served.calls(LlmCall::Respond), 6, "one streamed answer per question; a reconnect runs nothing again");
    assert_eq!(served.calls(LlmCall::Other), 0, "typing yes answers the approval without asking the LLM what it means");
}

/// What reached a server: the `Origin` (or "-"), the method, the path and the status answered.
type Seen = Arc<std::sync::Mutex<Vec<(String, String, String, u16)>>>;

/// A keyless server (the default of `peregrine serve`) with the web UI's agent; every request
/// that reaches it is recorded.
async fn serve_keyless() -> (Served, reqwest::Client, Seen) {
    let llm = ScriptedLlmServer::start(san_francisco_script()).await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &data_dir).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let options = ServerOptions::new(MODEL);
    let seen = Seen::default();
    let record = Arc::clone(&seen);
    let app = router(Arc::new(agent), options).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let record = Arc::clone(&record);
            async move {
                let origin = request.headers().get("origin").and_then(|value| value.to_str().ok()).unwrap_or("-").to_owned();
                let (method, path) = (request.method().to_string(), request.uri().path().to_owned());
                let response = next.run(request).await;
                record.lock().unwrap().push((origin, method, path, response.status().as_u16()));
                response
            }
        },
    ));
    tokio::spawn(peregrine_server::serve(listener, app, ConnectionLimits::default(), tokio_util::sync::CancellationToken::new()));
    (Served { base_url, llm, _dir: dir }, reqwest::Client::new(), seen)
}

/// A new thread of `served` waiting for the approval of its plan, and that approval's id.
async fn thread_with_pending_plan(served: &Served, client: &reqwest::Client) -> (String, String) {
    let thread: serde_json::Value =
        client.post(format!("{}/threads", served.base_url)).json(&serde_json::json!({})).send().await.unwrap().json().await.unwrap();
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let body = serde_json::json!({"input": "/planning What's the weather in San Francisco?"});
    let run: serde_json::Value =
        client.post(format!("{}/threads/{thread}/runs/wait", served.base_url)).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(run["status"], "interrupted", "{run}");
    let interrupt = run["result"]["interrupt"]["id"].as_str().unwrap().to_owned();
    (thread, interrupt)
}

async fn thread_json(served: &Served, client: &reqwest::Client, thread: &str) -> (u16, serde_json::Value) {
    let response = client.get(format!("{}/threads/{thread}", served.base_url)).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_origins_in_chromium_cannot_control_a_keyless_server() {
    assert_browser_installed();
    let (served, client, seen) = serve_keyless().await;
    let (pending, pending_interrupt) = thread_with_pending_plan(&served, &client).await;
    let (control, control_interrupt) = thread_with_pending_plan(&served, &client).await;
    let victim: serde_json::Value =
        client.post(format!("{}/threads", served.base_url)).json(&serde_json::json!({})).send().await.unwrap().json().await.unwrap();
    let victim = victim["thread_id"].as_str().unwrap().to_owned();
    let (_, before) = thread_json(&served, &client, &pending).await;
    let threads_before =
        client.get(format!("{}/threads", served.base_url)).send().await.unwrap().json::<serde_json::Value>().await.unwrap();

    // The other site: a page of its own on another port of loopback.
    let attacker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let attacker_port = attacker.local_addr().unwrap().port();
    let page =
        axum::Router::new().fallback(|| async { axum::response::Html("<!doctype html><title>another site</title><p>nothing to see</p>") });
    tokio::spawn(async move { axum::serve(attacker, page).await });
    let origins = [format!("http://localhost:{attacker_port}"), format!("http://127.0.0.1:{attacker_port}")];

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/cross_origin_check.py");
    let output = tokio::time::timeout(
        SCRIPT_LIMIT,
        tokio::process::Command::from(python3())
            .arg(script)
            .args([served.base_url.as_str(), &pending, &pending_interrupt, &victim, &control, &control_interrupt])
            .args(&origins)
            .output(),
    )
    .await
    .expect("cross_origin_check.py ends")
    .expect("python3 runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "cross_origin_check.py failed:\n{stderr}\n{stdout}");
    let results: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("not JSON: {stdout}"));
    eprintln!("{results:#}");

    // The attacks were made, and every one that reached the server was refused.
    let seen = seen.lock().unwrap().clone();
    for origin in &origins {
        let attempts = results[origin].as_array().unwrap_or_else(|| panic!("{results}"));
        assert!(attempts.len() >= 30, "{origin}: {attempts:?}");
        for attempt in attempts {
            let outcome = attempt[1].as_str().unwrap_or_default();
            assert!(!outcome.starts_with("status 2"), "{origin}: a page of another origin read an answer: {attempt}");
        }
        let reached: Vec<_> = seen.iter().filter(|(from, ..)| from == origin).collect();
        eprintln!("{origin}: {} requests reached the server", reached.len());
        assert!(reached.len() >= 20, "{origin}: the page's requests reached the server: {seen:?}");
        for (_, method, path, status) in &reached {
            assert!(matches!(status, 403 | 415), "{origin}: {method} {path} was answered {status}");
        }
    }
    // ... and changed nothing.
    let (_, after) = thread_json(&served, &client, &pending).await;
    assert_eq!((after["status"].as_str(), &after["interrupt"]), (Some("interrupted"), &before["interrupt"]), "{after}");
    let (status, victim_after) = thread_json(&served, &client, &victim).await;
    assert_eq!(status, 200, "the victim thread was not deleted: {victim_after}");
    assert_eq!(victim_after["messages"], 0, "nothing was written to it: {victim_after}");
    let threads_after = client.get(format!("{}/threads", served.base_url)).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(threads_after.as_array().map(Vec::len), threads_before.as_array().map(Vec::len), "no thread was created");
    // The control: the same approval from the server's own origin is obeyed, so the requests
    // above were real ones.
    let (_, control_after) = thread_json(&served, &client, &control).await;
    assert_eq!(control_after["status"], "idle", "{control_after}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1, "only the control's plan ran");
}

#[test]
fn the_long_answer_is_as_many_pieces_as_announced() {
    let pieces = long_answer_pieces();
    assert_eq!(pieces.len(), LONG_ANSWER_PIECES);
    assert!(pieces.concat().ends_with(LONG_ANSWER_END));
    assert!(pieces.concat().contains("w40\nw41 "));
}

/// Standard base64 with padding (RFC 4648), as CSP hash sources are written.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut padded = [0u8; 3];
        padded[..chunk.len()].copy_from_slice(chunk);
        let sextets =
            [padded[0] >> 2, (padded[0] & 0b11) << 4 | padded[1] >> 4, (padded[1] & 0b1111) << 2 | padded[2] >> 6, padded[2] & 0b11_1111];
        for (index, sextet) in sextets.into_iter().enumerate() {
            out.push(if index <= chunk.len() { char::from(ALPHABET[usize::from(sextet)]) } else { '=' });
        }
    }
    out
}

/// The page's CSP allows its one inline script by the SHA-256 of its text, not with
/// `'unsafe-inline'`; checked against the page as it is in the tree, so that an edit of the page
/// that the policy does not follow fails here (and not only as a blank page in a browser).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_csp_allows_exactly_the_pages_inline_script() {
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64(b"fooba"), "Zm9vYmE=");
    assert_eq!(base64(&[0xfb, 0xff, 0xfe, 0x01]), "+//+AQ==");

    let html = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ui/index.html")).unwrap();
    assert_eq!(html.matches("<script").count(), 1, "the page has one inline script, the one its CSP allows");
    let start = html.find("<script>").expect("a <script> element without attributes") + "<script>".len();
    let end = start + html[start..].find("</script>").expect("the script ends");
    let hash = base64(&Sha256::digest(&html.as_bytes()[start..end]));

    let served = serve().await;
    let page = reqwest::get(format!("{}/", served.base_url)).await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let csp = page.headers().get("content-security-policy").map(|value| value.to_str().unwrap().to_owned()).unwrap_or_default();
    assert_eq!(page.text().await.unwrap(), html, "the page served is the page in the tree");
    let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
    assert!(directives.contains(&"default-src 'none'"), "{csp}");
    assert!(
        directives.contains(&format!("script-src 'sha256-{hash}'").as_str()),
        "the CSP's script-src is not exactly the hash of the page's inline script ('sha256-{hash}'): {csp}"
    );
}

//! `serve` under load (`cargo bench -p hello-world-weather --bench serve_load`): the release
//! `hello-world-weather serve` in a temp project (SQLite checkpoints) against the scripted LLM
//! server, which answers every call after 200 ms; many conversations at once, each with its own
//! `X-Session-Id`, each asking the weather question for a few sequential turns.
//!
//! - **latency added by Peregrine**: a turn's wall time minus its LLM calls × 200 ms. A weather
//!   turn's calls are sequential (task extraction → classifier → orchestrator → location
//!   extraction → respond, each node reading the one before); the baseline checks that on the
//!   recorded arrival times. Every scripted answer reports 1 prompt and 1 completion token, so a
//!   turn's `usage` counts its LLM calls.
//! - **throughput**: turns and LLM calls per second over each load round.
//! - **memory and CPU** of the serve process: `VmHWM` from `/proc/<pid>/status` at the end, and
//!   `utime + stime` from `/proc/<pid>/stat` per turn; threads and open files sampled meanwhile.
//! - **baseline**: the same turns one at a time, showing the added latency without load.
//!
//! Settings (environment): `PEREGRINE_BENCH_CONVERSATIONS` (1000), `PEREGRINE_BENCH_TURNS` (3),
//! `PEREGRINE_BENCH_ROUNDS` (3), `PEREGRINE_BENCH_STREAMED` (100 streamed conversations after
//! the rounds, 0 for none), `PEREGRINE_BENCH_BASELINE` (3 conversations one at a time),
//! `PEREGRINE_BENCH_TIMEOUT_SECS` (300, per request), `PEREGRINE_BENCH_CHECKPOINTER` (`sqlite`,
//! or `memory` for comparison, written to `serve_load_memory.{json,md}` instead),
//! `PEREGRINE_BENCH_QUIET_WAIT_SECS` (120: before each round, wait up to this long for the
//! machine's CPUs to be idle, as other work on a shared machine skews the figures; the CPU time
//! other processes used during each round is reported).
//!
//! Raises its own `RLIMIT_NOFILE` soft limit when it is below 2 × conversations + 1024
//! (re-executing itself under `sh -c 'ulimit -n …'`); the serve process inherits it. Writes
//! `bench-results/serve_load.{json,md}`, then fails if any turn failed or serve died.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "a benchmark reports failures by panicking")]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use peregrine_testkit::agent_fixture::{LlmCall, project_config, slow_weather_script};
use peregrine_testkit::llm_server::{Reply, Script, ScriptedLlmServer};
use serde::Serialize;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const MODEL: &str = "hello-world-weather";
const QUESTION: &str = "What's the weather in Prague?";
const ANSWER_MARKER: &str = "Weather in Prague";
/// What the scripted server waits before every answer.
const LLM_LATENCY: Duration = Duration::from_millis(200);
/// Set in the re-executed bench so that it does not raise its limit twice.
const NOFILE_MARKER: &str = "PEREGRINE_BENCH_NOFILE_RAISED";
/// The soft limit on open files asked for when the current one is too low.
const NOFILE_WANTED: u64 = 65_536;

// ---------------------------------------------------------------------------------------------
// Settings and statistics
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Serialize)]
struct Settings {
    conversations: usize,
    turns: usize,
    rounds: usize,
    streamed_conversations: usize,
    baseline_conversations: usize,
    request_timeout_secs: u64,
    /// The longest wait for a quiet machine before each round.
    quiet_wait_secs: u64,
    llm_latency_ms: u64,
    /// `sqlite` (the default) or `memory`, the serve process's checkpointer.
    checkpointer: &'static str,
}

impl Settings {
    fn from_env() -> Self {
        let read = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .map_or(default, |value| value.trim().parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
        };
        Self {
            conversations: read("PEREGRINE_BENCH_CONVERSATIONS", 1000).max(1),
            turns: read("PEREGRINE_BENCH_TURNS", 3).max(1),
            rounds: read("PEREGRINE_BENCH_ROUNDS", 3).max(1),
            streamed_conversations: read("PEREGRINE_BENCH_STREAMED", 100),
            baseline_conversations: read("PEREGRINE_BENCH_BASELINE", 3).max(1),
            request_timeout_secs: read("PEREGRINE_BENCH_TIMEOUT_SECS", 300) as u64,
            quiet_wait_secs: read("PEREGRINE_BENCH_QUIET_WAIT_SECS", 120) as u64,
            llm_latency_ms: LLM_LATENCY.as_millis() as u64,
            checkpointer: match std::env::var("PEREGRINE_BENCH_CHECKPOINTER").as_deref() {
                Ok("memory") => "memory",
                Ok("sqlite") | Err(_) => "sqlite",
                Ok(other) => panic!("PEREGRINE_BENCH_CHECKPOINTER={other}: use sqlite or memory"),
            },
        }
    }
}

/// Percentiles of a sample (linear interpolation between ranks).
#[derive(Debug, Clone, Serialize)]
struct Distribution {
    p50: f64,
    p90: f64,
    p99: f64,
    min: f64,
    max: f64,
    mean: f64,
    samples: usize,
}

impl Distribution {
    fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |quantile: f64| {
            let rank = quantile * (sorted.len() - 1) as f64;
            let (low, high) = (sorted[rank.floor() as usize], sorted[rank.ceil() as usize]);
            low + (high - low) * (rank - rank.floor())
        };
        Some(Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            samples: sorted.len(),
        })
    }
}

/// Median and range over rounds.
#[derive(Debug, Clone, Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
    samples: usize,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) { (sorted[middle - 1] + sorted[middle]) / 2.0 } else { sorted[middle] };
        Self { median, min: sorted[0], max: sorted[sorted.len() - 1], samples: sorted.len() }
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// The open-files limit
// ---------------------------------------------------------------------------------------------

/// `(soft, hard)` "Max open files" of a process (`None` for unlimited).
fn nofile_of(pid: &str) -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let line = limits.lines().find(|line| line.starts_with("Max open files")).unwrap_or_default();
    let mut fields = line.trim_start_matches("Max open files").split_whitespace().map(|field| field.parse::<u64>().ok());
    (fields.next().flatten(), fields.next().flatten())
}

/// Re-executes this bench under `sh -c 'ulimit -n …'` when its soft limit on open files is below
/// what the load needs (each conversation holds a client and an upstream socket here).
fn raise_nofile(settings: &Settings) {
    let needed = (settings.conversations.max(settings.streamed_conversations) as u64) * 2 + 1024;
    let (soft, hard) = nofile_of("self");
    if soft.is_none_or(|soft| soft >= needed) || std::env::var_os(NOFILE_MARKER).is_some() {
        return;
    }
    let wanted = NOFILE_WANTED.max(needed);
    // Raising the hard limit needs privileges; without them the soft one goes up to the hard one.
    let script = match hard {
        Some(hard) if hard < wanted => format!("ulimit -n {wanted} 2>/dev/null || ulimit -Sn {hard}; exec \"$0\" \"$@\""),
        _ => format!("ulimit -Sn {wanted}; exec \"$0\" \"$@\""),
    };
    let exe = std::env::current_exe().expect("the bench's own path");
    eprintln!("serve_load: open-files limit {soft:?} < {needed}; re-executing under `{script}`");
    let error = Command::new("sh").arg("-c").arg(&script).arg(exe).args(std::env::args_os().skip(1)).env(NOFILE_MARKER, "1").exec();
    panic!("cannot re-execute the bench under sh to raise the open-files limit: {error}");
}

// ---------------------------------------------------------------------------------------------
// The scripted LLM server and the serve process
// ---------------------------------------------------------------------------------------------

/// `count` requests at once straight to a scripted server answering after `LLM_LATENCY`, twice:
/// on new connections, then on the pooled ones. The wall time of a burst shows whether the
/// harness itself serializes; the warm burst's excess over the latency is what the harness adds
/// to each LLM call at this concurrency.
async fn harness_check(count: usize) -> HarnessCheck {
    let server = ScriptedLlmServer::start(Script::new().otherwise(Reply::text("ok").with_latency(LLM_LATENCY))).await;
    let client = http_client(count, 120);
    let url = format!("{}/chat/completions", server.base_url());
    let cold = burst(&client, &url, count).await;
    let warm = burst(&client, &url, count).await;
    server.shutdown().await;
    HarnessCheck { requests: count, cold, warm }
}

async fn burst(client: &reqwest::Client, url: &str, count: usize) -> Burst {
    // A prompt of a few kB, like the agent's.
    let body = Arc::new(json!({"model": "scripted-model", "messages": [{"role": "user", "content": "weather ".repeat(500)}]}));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (client, url, body) = (client.clone(), url.to_owned(), Arc::clone(&body));
        tasks.spawn(async move {
            let sent = Instant::now();
            let ok = match client.post(&url).json(&*body).send().await {
                Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
                Err(_) => false,
            };
            (ok, ms(sent.elapsed()))
        });
    }
    let mut latencies = Vec::new();
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        let (ok, latency) = joined.expect("joined");
        if ok { latencies.push(latency) } else { failed += 1 }
    }
    Burst { failed, wall_ms: ms(started.elapsed()), latency_ms: Distribution::of(&latencies) }
}

fn http_client(pool: usize, timeout_secs: u64) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(pool + 64)
        .timeout(Duration::from_secs(timeout_secs))
        .connect_timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// The running `serve` process (killed when dropped) and its project directory.
struct Served {
    child: Child,
    pid: u32,
    address: String,
    stderr_path: PathBuf,
    _stdout: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(base_url: &str, checkpointer: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = project_config(base_url, "sk-bench");
        if checkpointer == "memory" {
            let sqlite = "checkpointer:\n  type: sqlite\n  path: ./state/peregrine.db\n";
            assert!(config.contains(sqlite), "project_config's checkpointer section changed: {config}");
            config = config.replace(sqlite, "checkpointer:\n  type: memory\n");
        }
        // Every conversation of a round runs at once, beyond the default turn limit.
        config.push_str("server:\n  max_turns_in_flight: 100000\n");
        std::fs::write(dir.path().join("config.yml"), config).expect("config");
        let stderr_path = dir.path().join("serve.stderr.log");
        let stderr = File::create(&stderr_path).expect("stderr log");
        let mut child = Command::new(BIN)
            .args(["serve", "--port", "0"])
            .current_dir(dir.path())
            .env_remove("PEREGRINE_CONFIG")
            .env_remove("CONFIG_FILE")
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("serve starts");
        let pid = child.id();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let read = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("serve's stdout");
            (line, stdout)
        });
        let (line, stdout) = match tokio::time::timeout(Duration::from_secs(60), read).await {
            Ok(joined) => joined.expect("joined"),
            Err(_) => panic!("serve printed no address within 60 s; stderr: {}", tail(&stderr_path, 20)),
        };
        let Some(address) = line.trim().strip_prefix("listening on ").map(str::to_owned) else {
            panic!("serve's first line is not `listening on http://…`: {line:?}; stderr: {}", tail(&stderr_path, 20));
        };
        Self { child, pid, address, stderr_path, _stdout: stdout, _dir: dir }
    }

    fn exit_status(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|status| status.to_string())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------------------------

/// A `kB` field of `/proc/<pid>/status` in MB, or a plain count (`Threads:`).
fn status_field(pid: u32, name: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rest = status.lines().find_map(|line| line.strip_prefix(name))?.trim();
    match rest.strip_suffix("kB") {
        Some(kb) => kb.trim().parse::<f64>().ok().map(|kb| kb / 1024.0),
        None => rest.parse().ok(),
    }
}

/// `utime + stime` of a process, in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; fields after its closing parenthesis are positional.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |index: usize| fields.get(index).and_then(|value| value.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat; `after` starts at field 3.
    field(11) + field(12)
}

/// `(busy, total)` CPU time of the whole machine (all CPUs) in clock ticks, from `/proc/stat`;
/// busy is all but idle and iowait.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().find(|line| line.starts_with("cpu ")).unwrap_or_default();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let fields: Vec<u64> = line.split_whitespace().skip(1).take(8).filter_map(|field| field.parse().ok()).collect();
    let total = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Waits, up to `limit`, for a second in which the machine's CPUs were at most 15 % busy: other
/// work on a shared machine (a build) takes the CPUs the serve process needs. Returns the wait.
async fn wait_for_quiet(limit: Duration) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit {
        let (busy, total) = machine_ticks();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (busy_after, total_after) = machine_ticks();
        if (busy_after - busy) as f64 <= 0.15 * (total_after - total) as f64 {
            break;
        }
    }
    started.elapsed()
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8_lossy(&output.stdout).trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Peaks of the serve process sampled every 100 ms while a phase runs.
#[derive(Debug, Clone, Default, Serialize)]
struct Peaks {
    rss_mb: f64,
    threads: f64,
    open_files: usize,
}

fn sample_peaks(pid: u32) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Peaks>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let sampler = tokio::spawn(async move {
        let mut peaks = Peaks::default();
        while !stopped.load(Ordering::Relaxed) {
            peaks.rss_mb = peaks.rss_mb.max(status_field(pid, "VmRSS:").unwrap_or(0.0));
            peaks.threads = peaks.threads.max(status_field(pid, "Threads:").unwrap_or(0.0));
            peaks.open_files = peaks.open_files.max(open_files(pid));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peaks
    });
    (stop, sampler)
}

// ---------------------------------------------------------------------------------------------
// Conversations
// ---------------------------------------------------------------------------------------------

/// One turn as the client saw it.
#[derive(Debug, Clone)]
struct TurnSample {
    /// Its place in the conversation, from 0.
    turn: usize,
    latency_ms: f64,
    /// Time to the first body byte (streamed turns).
    first_byte_ms: Option<f64>,
    /// LLM calls, from the answer's `usage`.
    llm_calls: Option<u64>,
    error: Option<String>,
}

impl TurnSample {
    fn added_ms(&self, fallback_calls: Option<u64>) -> Option<f64> {
        let calls = self.llm_calls.or(fallback_calls)?;
        Some(self.latency_ms - calls as f64 * ms(LLM_LATENCY))
    }
}

struct Answer {
    content: String,
    calls: Option<u64>,
    first_byte: Option<Duration>,
}

/// `reqwest`'s error with its causes.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    if error.is_timeout() {
        text.push_str(" (client timeout)");
    }
    text
}

fn clip(text: &str) -> String {
    text.chars().take(400).collect()
}

async fn ask(client: &reqwest::Client, address: &str, session: &str, messages: &[Value], stream: bool) -> Result<Answer, String> {
    let mut body = json!({"model": MODEL, "messages": messages});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let sent = Instant::now();
    let response = client
        .post(format!("{address}/v1/chat/completions"))
        .header("X-Session-Id", session)
        .json(&body)
        .send()
        .await
        .map_err(|error| error_chain(&error))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("HTTP {status}: {}", clip(&text)));
    }
    if stream { read_stream(response, sent).await } else { read_json(response).await }
}

async fn read_json(response: reqwest::Response) -> Result<Answer, String> {
    let answer: Value = response.json().await.map_err(|error| format!("body: {}", error_chain(&error)))?;
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    Ok(Answer { content, calls: answer["usage"]["completion_tokens"].as_u64(), first_byte: None })
}

/// Reads an SSE answer: the content deltas, the usage chunk, an error event, `[DONE]`.
async fn read_stream(mut response: reqwest::Response, sent: Instant) -> Result<Answer, String> {
    // Bytes, not text: a chunk may end inside a multi-byte character; an event never does.
    let mut buffer: Vec<u8> = Vec::new();
    let mut answer = Answer { content: String::new(), calls: None, first_byte: None };
    let mut done = false;
    while let Some(chunk) = response.chunk().await.map_err(|error| format!("stream: {}", error_chain(&error)))? {
        answer.first_byte.get_or_insert_with(|| sent.elapsed());
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let event = String::from_utf8(event).map_err(|error| format!("SSE event is not UTF-8: {error}"))?;
            let Some(data) = event.trim().strip_prefix("data:").map(str::trim) else { continue };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let value: Value = serde_json::from_str(data).map_err(|error| format!("SSE event is not JSON ({error}): {}", clip(data)))?;
            if value.get("error").is_some() {
                return Err(format!("error event: {}", clip(data)));
            }
            if let Some(piece) = value["choices"][0]["delta"]["content"].as_str() {
                answer.content.push_str(piece);
            }
            if let Some(calls) = value["usage"]["completion_tokens"].as_u64() {
                answer.calls = Some(calls);
            }
        }
    }
    if !done {
        return Err("the stream ended without [DONE]".to_owned());
    }
    Ok(answer)
}

/// One conversation: `turns` weather questions in a row, the history resent each time.
async fn conversation(client: reqwest::Client, address: Arc<str>, session: String, turns: usize, stream: bool) -> Vec<TurnSample> {
    let mut messages = Vec::new();
    let mut samples = Vec::with_capacity(turns);
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": QUESTION}));
        let sent = Instant::now();
        let result = ask(&client, &address, &session, &messages, stream).await;
        let mut sample = TurnSample { turn, latency_ms: ms(sent.elapsed()), first_byte_ms: None, llm_calls: None, error: None };
        match result {
            Ok(answer) => {
                sample.first_byte_ms = answer.first_byte.map(ms);
                sample.llm_calls = answer.calls;
                if !answer.content.contains(ANSWER_MARKER) {
                    sample.error = Some(format!("answer without the weather: {}", clip(&answer.content)));
                }
                messages.push(json!({"role": "assistant", "content": answer.content}));
            }
            Err(error) => sample.error = Some(error),
        }
        let failed = sample.error.is_some();
        samples.push(sample);
        if failed {
            break;
        }
    }
    samples
}

/// `count` conversations started at the same instant; every turn's sample, and the wall time.
async fn concurrent(
    client: &reqwest::Client,
    address: &Arc<str>,
    prefix: &str,
    count: usize,
    turns: usize,
    stream: bool,
) -> (Vec<TurnSample>, Duration) {
    let barrier = Arc::new(tokio::sync::Barrier::new(count + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..count {
        let (client, address, barrier) = (client.clone(), Arc::clone(address), Arc::clone(&barrier));
        let session = format!("{prefix}-{index}");
        tasks.spawn(async move {
            barrier.wait().await;
            conversation(client, address, session, turns, stream).await
        });
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut samples = Vec::with_capacity(count * turns);
    while let Some(joined) = tasks.join_next().await {
        samples.extend(joined.expect("conversation task"));
    }
    (samples, started.elapsed())
}

// ---------------------------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct HarnessCheck {
    requests: usize,
    /// On new connections.
    cold: Burst,
    /// On the pooled connections of the cold burst.
    warm: Burst,
}

#[derive(Debug, Serialize)]
struct Burst {
    failed: usize,
    wall_ms: f64,
    latency_ms: Option<Distribution>,
}

/// One baseline turn: exact calls from the scripted server's log.
#[derive(Debug, Serialize)]
struct BaselineTurn {
    turn: usize,
    latency_ms: f64,
    added_ms: f64,
    llm_calls_recorded: usize,
    llm_calls_in_usage: Option<u64>,
    calls: Vec<String>,
    /// The shortest time between two successive calls' arrivals: ≥ the LLM latency when each
    /// call waited for the previous answer.
    min_gap_between_calls_ms: Option<f64>,
    /// Where the added latency goes: request sent → first LLM call arrives.
    before_first_call_ms: Option<f64>,
    /// The gaps between successive calls' arrivals beyond the LLM latency, summed.
    between_calls_ms: Option<f64>,
    /// The last call answered (its arrival + the LLM latency) → the answer read.
    after_last_call_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Baseline {
    turns: Vec<BaselineTurn>,
    latency_ms: Option<Distribution>,
    added_ms: Option<Distribution>,
    /// LLM calls of the n-th turn of a conversation (from the first baseline conversation).
    calls_by_turn: Vec<usize>,
    calls_sequential: bool,
    usage_counts_calls: bool,
}

async fn baseline(client: &reqwest::Client, served: &Served, llm: &ScriptedLlmServer, settings: &Settings) -> Baseline {
    let address: Arc<str> = Arc::from(served.address.as_str());
    let mut turns = Vec::new();
    let mut calls_by_turn = Vec::new();
    for conversation in 0..settings.baseline_conversations {
        let session = format!("baseline-{conversation}");
        let mut messages = Vec::new();
        for turn in 0..settings.turns {
            messages.push(json!({"role": "user", "content": QUESTION}));
            let before = llm.request_count();
            let sent = Instant::now();
            let answer =
                ask(client, &address, &session, &messages, false).await.unwrap_or_else(|error| panic!("baseline turn failed: {error}"));
            let latency = sent.elapsed();
            assert!(answer.content.contains(ANSWER_MARKER), "baseline answer without the weather: {}", answer.content);
            messages.push(json!({"role": "assistant", "content": answer.content}));
            let requests: Vec<_> = llm.requests().into_iter().skip(before).filter(|request| request.is_chat()).collect();
            let gaps = requests.windows(2).map(|pair| ms(pair[1].received_at.duration_since(pair[0].received_at)));
            let min_gap = gaps.clone().reduce(f64::min);
            let between_calls = gaps.map(|gap| gap - ms(LLM_LATENCY)).reduce(|sum, excess| sum + excess);
            let before_first = requests.first().map(|first| ms(first.received_at.duration_since(sent)));
            let after_last = requests.last().map(|last| ms(latency) - ms(last.received_at.duration_since(sent)) - ms(LLM_LATENCY));
            if conversation == 0 {
                calls_by_turn.push(requests.len());
            }
            turns.push(BaselineTurn {
                turn,
                latency_ms: ms(latency),
                added_ms: ms(latency) - requests.len() as f64 * ms(LLM_LATENCY),
                llm_calls_recorded: requests.len(),
                llm_calls_in_usage: answer.calls,
                calls: requests.iter().map(|request| format!("{:?}", LlmCall::of(request))).collect(),
                min_gap_between_calls_ms: min_gap,
                before_first_call_ms: before_first,
                between_calls_ms: between_calls,
                after_last_call_ms: after_last,
            });
        }
    }
    let latency: Vec<f64> = turns.iter().map(|turn| turn.latency_ms).collect();
    let added: Vec<f64> = turns.iter().map(|turn| turn.added_ms).collect();
    // Sequential: successive arrivals at least one LLM latency apart (less 1 ms of timer slack).
    let calls_sequential = turns.iter().all(|turn| turn.min_gap_between_calls_ms.is_none_or(|gap| gap >= ms(LLM_LATENCY) - 1.0));
    let usage_counts_calls = turns.iter().all(|turn| turn.llm_calls_in_usage == Some(turn.llm_calls_recorded as u64));
    Baseline {
        turns,
        latency_ms: Distribution::of(&latency),
        added_ms: Distribution::of(&added),
        calls_by_turn,
        calls_sequential,
        usage_counts_calls,
    }
}

/// A load phase's figures.
#[derive(Debug, Serialize)]
struct Round {
    conversations: usize,
    turns_per_conversation: usize,
    stream: bool,
    wall_s: f64,
    turns_ok: usize,
    turns_failed: usize,
    turns_not_sent: usize,
    llm_calls: usize,
    turns_per_s: f64,
    llm_calls_per_s: f64,
    latency_ms: Option<Distribution>,
    added_ms: Option<Distribution>,
    first_byte_ms: Option<Distribution>,
    /// Added latency of the n-th turn of the conversations.
    added_ms_by_turn: Vec<Option<Distribution>>,
    serve_cpu_s: f64,
    serve_cpu_ms_per_turn: f64,
    bench_cpu_s: f64,
    /// CPU time of every other process on the machine meanwhile (other work competing for the CPUs).
    other_cpu_s: f64,
    /// How long the round waited for the machine to be quiet before it started.
    waited_for_quiet_s: f64,
    peaks: Peaks,
    errors: BTreeMap<String, usize>,
}

struct Phase<'a> {
    client: &'a reqwest::Client,
    served: &'a Served,
    llm: &'a ScriptedLlmServer,
    calls_by_turn: &'a [usize],
    ticks: f64,
    quiet_wait: Duration,
}

impl Phase<'_> {
    async fn run(&self, prefix: &str, conversations: usize, turns: usize, stream: bool) -> (Round, Vec<TurnSample>) {
        let address: Arc<str> = Arc::from(self.served.address.as_str());
        let pid = self.served.pid.to_string();
        let waited_for_quiet_s = wait_for_quiet(self.quiet_wait).await.as_secs_f64();
        let (serve_cpu, bench_cpu, machine, calls) = (cpu_ticks(&pid), cpu_ticks("self"), machine_ticks().0, self.llm.request_count());
        let (stop, sampler) = sample_peaks(self.served.pid);
        let (samples, wall) = concurrent(self.client, &address, prefix, conversations, turns, stream).await;
        stop.store(true, Ordering::Relaxed);
        let peaks = sampler.await.expect("sampler");
        let serve_cpu_s = (cpu_ticks(&pid) - serve_cpu) as f64 / self.ticks;
        let bench_cpu_s = (cpu_ticks("self") - bench_cpu) as f64 / self.ticks;
        let other_cpu_s = ((machine_ticks().0 - machine) as f64 / self.ticks - serve_cpu_s - bench_cpu_s).max(0.0);
        let llm_calls = self.llm.request_count() - calls;

        let ok: Vec<&TurnSample> = samples.iter().filter(|sample| sample.error.is_none()).collect();
        let fallback = |sample: &TurnSample| self.calls_by_turn.get(sample.turn).map(|calls| *calls as u64);
        let latency: Vec<f64> = ok.iter().map(|sample| sample.latency_ms).collect();
        let added: Vec<f64> = ok.iter().filter_map(|sample| sample.added_ms(fallback(sample))).collect();
        let first_byte: Vec<f64> = ok.iter().filter_map(|sample| sample.first_byte_ms).collect();
        let added_by_turn = (0..turns)
            .map(|turn| {
                let values: Vec<f64> =
                    ok.iter().filter(|sample| sample.turn == turn).filter_map(|sample| sample.added_ms(fallback(sample))).collect();
                Distribution::of(&values)
            })
            .collect();
        let mut errors = BTreeMap::new();
        for sample in samples.iter().filter(|sample| sample.error.is_some()) {
            *errors.entry(sample.error.clone().unwrap_or_default()).or_insert(0) += 1;
        }
        let wall_s = wall.as_secs_f64();
        let round = Round {
            conversations,
            turns_per_conversation: turns,
            stream,
            wall_s,
            turns_ok: ok.len(),
            turns_failed: samples.len() - ok.len(),
            turns_not_sent: conversations * turns - samples.len(),
            llm_calls,
            turns_per_s: ok.len() as f64 / wall_s,
            llm_calls_per_s: llm_calls as f64 / wall_s,
            latency_ms: Distribution::of(&latency),
            added_ms: Distribution::of(&added),
            first_byte_ms: Distribution::of(&first_byte),
            added_ms_by_turn: added_by_turn,
            serve_cpu_s,
            serve_cpu_ms_per_turn: serve_cpu_s * 1e3 / ok.len().max(1) as f64,
            bench_cpu_s,
            other_cpu_s,
            waited_for_quiet_s,
            peaks,
            errors,
        };
        (round, samples)
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    nproc: usize,
    cpu_model: Option<String>,
    binary: String,
    settings: Settings,
    nofile_bench: (Option<u64>, Option<u64>),
    nofile_serve: (Option<u64>, Option<u64>),
    harness_check: HarnessCheck,
    baseline: Baseline,
    rounds: Vec<Round>,
    load: LoadSummary,
    streamed: Option<Round>,
    serve: ServeProcess,
}

#[derive(Debug, Serialize)]
struct LoadSummary {
    turns_ok: usize,
    turns_failed: usize,
    latency_ms: Option<Distribution>,
    added_ms: Option<Distribution>,
    turns_per_s: Spread,
    llm_calls_per_s: Spread,
    wall_s: Spread,
    serve_cpu_ms_per_turn: Spread,
}

#[derive(Debug, Serialize)]
struct ServeProcess {
    rss_idle_mb: Option<f64>,
    peak_rss_mb: Option<f64>,
    rss_end_mb: Option<f64>,
    threads_end: Option<f64>,
    peak_threads: f64,
    peak_open_files: usize,
    alive_at_end: bool,
    exit_status: Option<String>,
    stderr_lines: usize,
    stderr_warnings: usize,
    stderr_tail: Option<String>,
}

fn main() {
    let settings = Settings::from_env();
    raise_nofile(&settings);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    runtime.block_on(run(settings));
}

async fn run(settings: Settings) {
    let started = Instant::now();
    let progress = |what: &str| eprintln!("serve_load [{:>6.1} s] {what}", started.elapsed().as_secs_f64());
    progress(&format!("{settings:?}"));
    let harness_check = harness_check(settings.conversations).await;
    progress(&format!(
        "harness check: {} requests at once in {:.0} ms (new connections), {:.0} ms (pooled)",
        harness_check.requests, harness_check.cold.wall_ms, harness_check.warm.wall_ms
    ));

    let llm = ScriptedLlmServer::start(slow_weather_script(LLM_LATENCY)).await;
    let mut served = Served::start(&llm.base_url(), settings.checkpointer).await;
    progress(&format!("serve (pid {}) at {}", served.pid, served.address));
    let client = http_client(settings.conversations.max(settings.streamed_conversations), settings.request_timeout_secs);

    let address: Arc<str> = Arc::from(served.address.as_str());
    let (warm, _) = concurrent(&client, &address, "warmup", 10, 1, false).await;
    if let Some(error) = warm.iter().find_map(|sample| sample.error.as_deref()) {
        panic!("warm-up turn failed: {error}; serve stderr: {}", tail(&served.stderr_path, 20));
    }
    let rss_idle_mb = status_field(served.pid, "VmRSS:");
    let baseline = baseline(&client, &served, &llm, &settings).await;
    progress(&format!(
        "baseline: calls per turn {:?}, sequential {}, added p50 {:.1} ms",
        baseline.calls_by_turn,
        baseline.calls_sequential,
        baseline.added_ms.as_ref().map_or(f64::NAN, |added| added.p50)
    ));

    let phase = Phase {
        client: &client,
        served: &served,
        llm: &llm,
        calls_by_turn: &baseline.calls_by_turn,
        ticks: clock_ticks_per_second(),
        quiet_wait: Duration::from_secs(settings.quiet_wait_secs),
    };
    let mut rounds = Vec::new();
    let mut all = Vec::new();
    for round in 0..settings.rounds {
        let (figures, samples) = phase.run(&format!("load{round}"), settings.conversations, settings.turns, false).await;
        progress(&format!(
            "round {round}: {} ok, {} failed in {:.1} s ({:.1} turns/s), added p50 {:.0} ms p99 {:.0} ms; other CPU {:.1} s, waited {:.0} s",
            figures.turns_ok,
            figures.turns_failed,
            figures.wall_s,
            figures.turns_per_s,
            figures.added_ms.as_ref().map_or(f64::NAN, |added| added.p50),
            figures.added_ms.as_ref().map_or(f64::NAN, |added| added.p99),
            figures.other_cpu_s,
            figures.waited_for_quiet_s
        ));
        all.extend(samples);
        rounds.push(figures);
    }
    let streamed = if settings.streamed_conversations > 0 {
        let (figures, _) = phase.run("stream", settings.streamed_conversations, settings.turns, true).await;
        progress(&format!("streamed: {} ok, {} failed in {:.1} s", figures.turns_ok, figures.turns_failed, figures.wall_s));
        Some(figures)
    } else {
        None
    };

    let nofile_serve = nofile_of(&served.pid.to_string());
    let serve = serve_process(&mut served, rss_idle_mb, &rounds, streamed.as_ref());
    drop(served);
    let fallback = |sample: &TurnSample| baseline.calls_by_turn.get(sample.turn).map(|calls| *calls as u64);
    let ok: Vec<&TurnSample> = all.iter().filter(|sample| sample.error.is_none()).collect();
    let per_round = |value: fn(&Round) -> f64| Spread::of(&rounds.iter().map(value).collect::<Vec<_>>());
    let load = LoadSummary {
        turns_ok: ok.len(),
        turns_failed: rounds.iter().map(|round| round.turns_failed).sum(),
        latency_ms: Distribution::of(&ok.iter().map(|sample| sample.latency_ms).collect::<Vec<_>>()),
        added_ms: Distribution::of(&ok.iter().filter_map(|sample| sample.added_ms(fallback(sample))).collect::<Vec<_>>()),
        turns_per_s: per_round(|round| round.turns_per_s),
        llm_calls_per_s: per_round(|round| round.llm_calls_per_s),
        wall_s: per_round(|round| round.wall_s),
        serve_cpu_ms_per_turn: per_round(|round| round.serve_cpu_ms_per_turn),
    };
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines().find(|line| line.starts_with("model name")).and_then(|line| line.split_once(':')).map(|(_, m)| m.trim().to_owned())
    });
    let report = Report {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        nproc: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_model,
        binary: BIN.to_owned(),
        settings,
        nofile_bench: nofile_of("self"),
        nofile_serve,
        harness_check,
        baseline,
        rounds,
        load,
        streamed,
        serve,
    };
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results");
    write(&out, &report);
    progress(&format!("wrote {}", out.join(format!("{}.md", report.file_stem())).display()));
    llm.shutdown().await;
    let failed = report.load.turns_failed + report.streamed.as_ref().map_or(0, |round| round.turns_failed);
    assert!(failed == 0 && report.serve.alive_at_end, "{failed} turns failed or serve died; see bench-results/{}.md", report.file_stem());
}

fn serve_process(served: &mut Served, rss_idle_mb: Option<f64>, rounds: &[Round], streamed: Option<&Round>) -> ServeProcess {
    let peak_rss_mb = status_field(served.pid, "VmHWM:");
    let rss_end_mb = status_field(served.pid, "VmRSS:");
    let threads_end = status_field(served.pid, "Threads:");
    let exit_status = served.exit_status();
    let log = std::fs::read_to_string(&served.stderr_path).unwrap_or_default();
    let stderr_warnings = log.lines().filter(|line| line.contains("WARN") || line.contains("ERROR")).count();
    let phases = rounds.iter().chain(streamed);
    ServeProcess {
        rss_idle_mb,
        peak_rss_mb,
        rss_end_mb,
        threads_end,
        peak_threads: phases.clone().map(|round| round.peaks.threads).fold(0.0, f64::max),
        peak_open_files: phases.map(|round| round.peaks.open_files).max().unwrap_or(0),
        alive_at_end: exit_status.is_none(),
        exit_status,
        stderr_lines: log.lines().count(),
        stderr_warnings,
        stderr_tail: (stderr_warnings > 0).then(|| tail(&served.stderr_path, 15)),
    }
}

fn row(name: &str, distribution: Option<&Distribution>) -> String {
    match distribution {
        Some(d) => format!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n", d.p50, d.p90, d.p99, d.max, d.min, d.samples),
        None => format!("| {name} | – | – | – | – | – | 0 |\n"),
    }
}

fn spread(spread: &Spread, decimals: usize) -> String {
    format!("{:.decimals$} ({:.decimals$}–{:.decimals$})", spread.median, spread.min, spread.max)
}

impl Report {
    /// `serve_load`, or `serve_load_memory` for the in-memory checkpointer comparison.
    fn file_stem(&self) -> &'static str {
        if self.settings.checkpointer == "memory" { "serve_load_memory" } else { "serve_load" }
    }
}

fn write(dir: &Path, report: &Report) {
    std::fs::create_dir_all(dir).expect("bench-results");
    let stem = report.file_stem();
    std::fs::write(dir.join(format!("{stem}.json")), serde_json::to_string_pretty(report).expect("JSON") + "\n").expect("JSON file");
    let settings = &report.settings;
    let mut md = String::new();
    md.push_str("# `serve` under load: concurrent conversations, hello-world-weather\n\n");
    md.push_str(&format!(
        "{} · {} CPUs · {} · release binary · open-files limit {} (bench), {} (serve)\n\n",
        report.date,
        report.nproc,
        report.cpu_model.as_deref().unwrap_or("unknown CPU"),
        report.nofile_bench.0.map_or("unlimited".to_owned(), |soft| soft.to_string()),
        report.nofile_serve.0.map_or("unlimited".to_owned(), |soft| soft.to_string()),
    ));
    md.push_str(&format!(
        "{} conversations at once (`X-Session-Id` each), {} sequential non-stream turns each of \"{QUESTION}\", {} rounds; \
         the scripted LLM server (in the bench process, same 2 CPUs) answers every call after {} ms. \
         Added latency = turn latency − LLM calls of the turn × {} ms. Checkpointer: {} in a temp project.\n\n",
        settings.conversations, settings.turns, settings.rounds, settings.llm_latency_ms, settings.llm_latency_ms, settings.checkpointer
    ));
    let load = &report.load;
    md.push_str(&format!(
        "**Throughput** (median of rounds, min–max): {} turns/s, {} LLM calls/s; a round takes {} s. \
         **Errors**: {} of {} turns. **Serve process**: peak RSS {:.1} MB (idle after warm-up {:.1} MB), \
         CPU {} ms per turn, up to {:.0} threads and {} open files.\n\n",
        spread(&load.turns_per_s, 1),
        spread(&load.llm_calls_per_s, 0),
        spread(&load.wall_s, 1),
        load.turns_failed,
        load.turns_failed + load.turns_ok,
        report.serve.peak_rss_mb.unwrap_or(f64::NAN),
        report.serve.rss_idle_mb.unwrap_or(f64::NAN),
        spread(&load.serve_cpu_ms_per_turn, 2),
        report.serve.peak_threads,
        report.serve.peak_open_files,
    ));
    md.push_str("| ms | p50 | p90 | p99 | max | min | turns |\n|---|---|---|---|---|---|---|\n");
    md.push_str(&row("baseline (1 at a time): turn latency", report.baseline.latency_ms.as_ref()));
    md.push_str(&row("baseline (1 at a time): added latency", report.baseline.added_ms.as_ref()));
    md.push_str(&row(&format!("{} at once: turn latency", settings.conversations), load.latency_ms.as_ref()));
    md.push_str(&row(&format!("{} at once: added latency", settings.conversations), load.added_ms.as_ref()));
    if let Some(round) = report.rounds.first() {
        for (turn, added) in round.added_ms_by_turn.iter().enumerate() {
            md.push_str(&row(&format!("round 1, turn {} of each conversation: added", turn + 1), added.as_ref()));
        }
    }
    if let Some(streamed) = &report.streamed {
        md.push_str(&row(&format!("{} streamed at once: turn latency", streamed.conversations), streamed.latency_ms.as_ref()));
        md.push_str(&row(&format!("{} streamed at once: added latency", streamed.conversations), streamed.added_ms.as_ref()));
        md.push_str(&row(&format!("{} streamed at once: first byte", streamed.conversations), streamed.first_byte_ms.as_ref()));
    }
    md.push_str("\n| round | wall s | turns ok | failed | turns/s | LLM calls/s | added p50 | added p99 | serve CPU ms/turn | serve / bench / other CPU s | peak RSS MB | peak threads | peak fds |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let rounds = report.rounds.iter().enumerate().map(|(index, round)| (format!("{}", index + 1), round));
    for (name, round) in rounds.chain(report.streamed.iter().map(|round| ("streamed".to_owned(), round))) {
        md.push_str(&format!(
            "| {name} | {:.1} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} / {:.1} | {:.1} | {:.0} | {} |\n",
            round.wall_s,
            round.turns_ok,
            round.turns_failed + round.turns_not_sent,
            round.turns_per_s,
            round.llm_calls_per_s,
            round.added_ms.as_ref().map_or(f64::NAN, |added| added.p50),
            round.added_ms.as_ref().map_or(f64::NAN, |added| added.p99),
            round.serve_cpu_ms_per_turn,
            round.serve_cpu_s,
            round.bench_cpu_s,
            round.other_cpu_s,
            round.peaks.rss_mb,
            round.peaks.threads,
            round.peaks.open_files,
        ));
    }
    md.push_str(&format!(
        "\nA round of W s offers W × {} CPU-seconds; \"other\" is what the rest of the machine used meanwhile.\n",
        report.nproc
    ));
    let (other, offered) = report
        .rounds
        .iter()
        .fold((0.0, 0.0), |(other, offered), round| (other + round.other_cpu_s, offered + round.wall_s * report.nproc as f64));
    if other > 0.1 * offered {
        md.push_str(&format!(
            "\n**Warning**: other processes used {:.0} % of the machine's CPU time during the rounds; throughput and latency \
             are worse than on a quiet machine.\n",
            100.0 * other / offered
        ));
    }
    let baseline = &report.baseline;
    md.push_str(&format!(
        "\nLLM calls per turn (baseline, turn 1, 2, …): {:?}; sequential (successive calls ≥ {} ms apart): {}; `usage` counts them: {}. \
         Calls of a turn: {}.\n",
        baseline.calls_by_turn,
        settings.llm_latency_ms,
        baseline.calls_sequential,
        baseline.usage_counts_calls,
        baseline.turns.first().map_or(String::new(), |turn| turn.calls.join(" → ")),
    ));
    let median = |part: fn(&BaselineTurn) -> Option<f64>| {
        let values: Vec<f64> = baseline.turns.iter().filter_map(part).collect();
        Distribution::of(&values).map_or(f64::NAN, |distribution| distribution.p50)
    };
    md.push_str(&format!(
        "Baseline added latency by where it goes (medians): request → first LLM call {:.1} ms, between calls (beyond {} ms each) \
         {:.1} ms in all, last answer → response read {:.1} ms.\n",
        median(|turn| turn.before_first_call_ms),
        settings.llm_latency_ms,
        median(|turn| turn.between_calls_ms),
        median(|turn| turn.after_last_call_ms),
    ));
    let check = &report.harness_check;
    let burst = |burst: &Burst| {
        let latency = burst.latency_ms.as_ref();
        format!(
            "{:.0} ms in all (per request p50 {:.0} ms, p99 {:.0} ms, {} failed)",
            burst.wall_ms,
            latency.map_or(f64::NAN, |latency| latency.p50),
            latency.map_or(f64::NAN, |latency| latency.p99),
            burst.failed
        )
    };
    md.push_str(&format!(
        "\nHarness check: {} requests at once straight to a scripted server ({} ms latency): on new connections {}; \
         again on the pooled connections {}. The LLM stand-in does not serialize; the pooled burst's excess over {} ms \
         is what the harness itself adds to an LLM call at this concurrency.\n",
        check.requests,
        settings.llm_latency_ms,
        burst(&check.cold),
        burst(&check.warm),
        settings.llm_latency_ms,
    ));
    let errors: BTreeMap<&String, usize> = report.rounds.iter().chain(&report.streamed).flat_map(|round| round.errors.iter()).fold(
        BTreeMap::new(),
        |mut all, (error, count)| {
            *all.entry(error).or_insert(0) += count;
            all
        },
    );
    if !errors.is_empty() {
        md.push_str("\n## Errors\n\n| count | error |\n|---|---|\n");
        for (error, count) in errors {
            md.push_str(&format!("| {count} | {} |\n", error.replace('|', "\\|").replace('\n', " ")));
        }
    }
    if !report.serve.alive_at_end {
        md.push_str(&format!("\n**The serve process died**: {}\n", report.serve.exit_status.as_deref().unwrap_or("?")));
    }
    if let Some(stderr) = &report.serve.stderr_tail {
        md.push_str(&format!(
            "\nServe stderr ({} warnings/errors of {} lines), last lines:\n\n```\n{stderr}\n```\n",
            report.serve.stderr_warnings, report.serve.stderr_lines
        ));
    }
    std::fs::write(dir.join(format!("{stem}.md")), md).expect("Markdown file");
}

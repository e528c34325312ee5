//! `serve` overloaded (`cargo bench -p hello-world-weather --bench serve_overload`): the release
//! `hello-world-weather serve` in a temp project (SQLite checkpoints, `server.max_turns_in_flight`
//! at its default, messages of up to 1 MiB allowed) against the scripted LLM server. Each round sends 500 chat completions at once, each with a 1 MiB
//! message and its own `X-Session-Id`, and counts the answers: at most `max_turns_in_flight`
//! turns may run (200), the rest must be refused with 503 and `Retry-After` before anything
//! starts. The LLM answers after 1 s, so a turn (5 calls) lasts 5 s and every request of a
//! round arrives while the admitted turns still run: more than `max_turns_in_flight` answers of
//! 200 would mean more turns ran at once. The serve process's RSS is sampled every 50 ms: before the load (idle after a
//! warm-up), its peak, and after the load (1 s, 5 s and 10 s after the last answer).
//!
//! Settings (environment): `PEREGRINE_BENCH_REQUESTS` (500), `PEREGRINE_BENCH_MESSAGE_BYTES`
//! (1 MiB), `PEREGRINE_BENCH_ROUNDS` (3). Writes `bench-results/serve_overload.{json,md}`, then
//! fails when more turns ran than allowed, a refusal lacked `Retry-After`, an answer was neither
//! 200 nor 503, or serve died.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "a benchmark reports failures by panicking")]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use peregrine_testkit::agent_fixture::{project_config, slow_weather_script};
use peregrine_testkit::llm_server::ScriptedLlmServer;
use serde::Serialize;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const MODEL: &str = "hello-world-weather";
const LLM_LATENCY: Duration = Duration::from_secs(1);
/// `server.max_turns_in_flight`'s default, which the bench leaves in place.
const MAX_TURNS_IN_FLIGHT: usize = peregrine::server::DEFAULT_MAX_TURNS_IN_FLIGHT;

#[derive(Debug, Clone, Copy, Serialize)]
struct Settings {
    requests: usize,
    message_bytes: usize,
    rounds: usize,
    max_turns_in_flight: usize,
    llm_latency_ms: u64,
}

impl Settings {
    fn from_env() -> Self {
        let read = |name: &str, default: usize| std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default);
        Self {
            requests: read("PEREGRINE_BENCH_REQUESTS", 500),
            message_bytes: read("PEREGRINE_BENCH_MESSAGE_BYTES", 1 << 20),
            rounds: read("PEREGRINE_BENCH_ROUNDS", 3),
            max_turns_in_flight: MAX_TURNS_IN_FLIGHT,
            llm_latency_ms: LLM_LATENCY.as_millis() as u64,
        }
    }
}

/// The serve process, killed when dropped.
struct Served {
    child: Child,
    pid: u32,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(base_url: &str, settings: &Settings) -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = project_config(base_url, "sk-bench")
        + &format!("server:\n  max_message_bytes: {}\n  max_body_bytes: {}\n", settings.message_bytes, settings.message_bytes * 2 + 4096);
    std::fs::write(dir.path().join("config.yml"), config).expect("config");
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0"])
        .current_dir(dir.path())
        .env_remove("PEREGRINE_CONFIG")
        .env_remove("CONFIG_FILE")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("serve's address");
    let address = line.trim().strip_prefix("listening on ").expect("listening on http://…").to_owned();
    Served { pid: child.id(), child, address, _dir: dir }
}

/// `VmRSS` (or another kB field) of `/proc/<pid>/status`, in MB.
fn status_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

#[derive(Debug, Default, Serialize)]
struct Round {
    ok: usize,
    refused: usize,
    refused_without_retry_after: usize,
    other: Vec<String>,
    wall_s: f64,
    rss_before_mb: f64,
    rss_peak_mb: f64,
    rss_after_1s_mb: f64,
    rss_after_5s_mb: f64,
    rss_after_10s_mb: f64,
}

async fn chat(client: reqwest::Client, address: String, session: String, message: Arc<String>) -> Result<(u16, bool), String> {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": *message}]});
    let response = client
        .post(format!("{address}/v1/chat/completions"))
        .header("X-Session-Id", session)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    response.bytes().await.map_err(|error| error.to_string())?;
    Ok((status, retry_after))
}

async fn round(client: &reqwest::Client, served: &Served, settings: &Settings, number: usize) -> Round {
    let mut figures = Round { rss_before_mb: status_mb(served.pid, "VmRSS:"), ..Round::default() };
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (Arc::clone(&stop), served.pid);
        tokio::spawn(async move {
            let mut peak = 0f64;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(status_mb(pid, "VmRSS:"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        })
    };
    let message = Arc::new(format!("What's the weather in Prague? {}", "x".repeat(settings.message_bytes - 40)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..settings.requests {
        tasks.spawn(chat(client.clone(), served.address.clone(), format!("overload-{number}-{index}"), Arc::clone(&message)));
    }
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("joined") {
            Ok((200, _)) => figures.ok += 1,
            Ok((503, retry_after)) => {
                figures.refused += 1;
                figures.refused_without_retry_after += usize::from(!retry_after);
            }
            Ok((status, _)) => figures.other.push(format!("HTTP {status}")),
            Err(error) => figures.other.push(error),
        }
    }
    figures.wall_s = started.elapsed().as_secs_f64();
    drop(message);
    for (after, slot) in [(1u64, 0usize), (5, 1), (10, 2)] {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            started + Duration::from_secs_f64(figures.wall_s) + Duration::from_secs(after),
        ))
        .await;
        let rss = status_mb(served.pid, "VmRSS:");
        match slot {
            0 => figures.rss_after_1s_mb = rss,
            1 => figures.rss_after_5s_mb = rss,
            _ => figures.rss_after_10s_mb = rss,
        }
    }
    stop.store(true, Ordering::Relaxed);
    figures.rss_peak_mb = sampler.await.expect("sampler");
    figures
}

#[derive(Serialize)]
struct Report {
    date: String,
    nproc: usize,
    settings: Settings,
    /// RSS after the warm-up, before any load.
    rss_idle_mb: f64,
    rounds: Vec<Round>,
    peak_hwm_mb: f64,
}

fn write(report: &Report) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results");
    std::fs::create_dir_all(&dir).expect("bench-results");
    std::fs::write(dir.join("serve_overload.json"), serde_json::to_string_pretty(report).expect("JSON") + "\n").expect("JSON file");
    let settings = &report.settings;
    let mut md = format!(
        "# `serve` overloaded: {} chat completions at once with {} KiB messages\n\n{} · {} CPUs · release binary · SQLite · \
         `max_turns_in_flight` {} (default) · the scripted LLM answers after {} ms · {} rounds\n\n\
         | round | 200 | 503 (all with Retry-After?) | other | wall s | RSS before MB | peak MB | after 1 s | after 5 s | after 10 s |\n|---|---|---|---|---|---|---|---|---|---|\n",
        settings.requests,
        settings.message_bytes / 1024,
        report.date,
        report.nproc,
        settings.max_turns_in_flight,
        settings.llm_latency_ms,
        settings.rounds
    );
    for (index, round) in report.rounds.iter().enumerate() {
        md.push_str(&format!(
            "| {index} | {} | {} ({}) | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            round.ok,
            round.refused,
            if round.refused_without_retry_after == 0 { "yes" } else { "no" },
            round.other.len(),
            round.wall_s,
            round.rss_before_mb,
            round.rss_peak_mb,
            round.rss_after_1s_mb,
            round.rss_after_5s_mb,
            round.rss_after_10s_mb
        ));
    }
    let ratios = |of: &dyn Fn(&Round) -> f64| {
        report.rounds.iter().map(|round| format!("{:.2}", round.rss_after_10s_mb / of(round))).collect::<Vec<_>>()
    };
    md.push_str(&format!(
        "\nIdle RSS after the warm-up, before any load: {:.1} MB. Peak RSS of the process (VmHWM): {:.1} MB. \
         RSS 10 s after each round / RSS just before it: {}; / the idle RSS: {}.\n",
        report.rss_idle_mb,
        report.peak_hwm_mb,
        ratios(&|round| round.rss_before_mb).join(", "),
        ratios(&|_| report.rss_idle_mb).join(", "),
    ));
    std::fs::write(dir.join("serve_overload.md"), md).expect("md file");
}

fn main() {
    let settings = Settings::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    runtime.block_on(async move {
        let llm = ScriptedLlmServer::start(slow_weather_script(LLM_LATENCY)).await;
        let served = start(&llm.base_url(), &settings);
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(300)).build().expect("client");
        // Warm-up: a few ordinary turns, then the idle RSS.
        for index in 0..5 {
            let outcome =
                chat(client.clone(), served.address.clone(), format!("warmup-{index}"), Arc::new("What's the weather in Prague?".into()))
                    .await;
            assert_eq!(outcome.map(|(status, _)| status), Ok(200), "warm-up turn");
        }
        let rss_idle_mb = status_mb(served.pid, "VmRSS:");
        let mut rounds = Vec::new();
        for number in 0..settings.rounds {
            let figures = round(&client, &served, &settings, number).await;
            eprintln!("serve_overload round {number}: {figures:?}");
            rounds.push(figures);
        }
        let peak_hwm_mb = status_mb(served.pid, "VmHWM:");
        let alive = std::fs::metadata(format!("/proc/{}", served.pid)).is_ok();
        let report = Report {
            date: chrono::Utc::now().to_rfc3339(),
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            settings,
            rss_idle_mb,
            rounds,
            peak_hwm_mb,
        };
        write(&report);
        eprintln!("wrote bench-results/serve_overload.md");
        for round in &report.rounds {
            assert!(round.ok <= MAX_TURNS_IN_FLIGHT, "{} turns ran, more than {MAX_TURNS_IN_FLIGHT}", round.ok);
            assert!(round.other.is_empty(), "answers other than 200 and 503: {:?}", round.other);
            assert_eq!(round.refused_without_retry_after, 0, "a 503 without Retry-After");
        }
        assert!(alive, "serve died");
        llm.shutdown().await;
    });
}

//! Start-up and memory of an application binary (`cargo bench -p hello-world-weather --bench
//! startup`): the release `hello-world-weather` binary in a temp project against the scripted
//! LLM server answering instantly on loopback.
//!
//! - **start → first LLM request**: from spawning `run "What's the weather in Prague?"` to the
//!   server receiving the turn's first request (task extraction): process start, config and
//!   `.env`, SQLite open, agent assembly, gateway, state load, prompt building. Next to it, the
//!   floor: spawning `--version` to its exit.
//! - **whole one-shot turn**: spawn to exit of the same `run` (five LLM calls answered at once).
//! - **peak RSS over 5 turns**: one `chat` process (stdin piped) asked the weather question five
//!   times; `VmHWM` from `/proc/<pid>/status` after the fifth answer, before stdin closes.
//!
//! Upstream Osprey 0.11.5 measured on the same class of machine (shared/architecture.md): 8.4 s
//! to the first LLM request, 319 MB peak RSS. Writes `bench-results/startup.{json,md}`; asserts
//! nothing.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "a benchmark reports failures by panicking")]

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use peregrine_testkit::agent_fixture::{project_config, weather_script};
use peregrine_testkit::llm_server::ScriptedLlmServer;
use serde::Serialize;

const BIN: &str = env!("CARGO_BIN_EXE_hello-world-weather");
const QUESTION: &str = "What's the weather in Prague?";
const ANSWER_MARKER: &str = "Here is the current weather";
const UPSTREAM_FIRST_REQUEST_MS: f64 = 8400.0;
const UPSTREAM_PEAK_RSS_MB: f64 = 319.0;
const TARGET_FIRST_REQUEST_MS: f64 = 50.0;
const TARGET_PEAK_RSS_MB: f64 = 30.0;

#[derive(Debug, Clone, Serialize)]
struct Spread {
    median: f64,
    p10: f64,
    p90: f64,
    min: f64,
    max: f64,
    samples: usize,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |quantile: f64| {
            let rank = quantile * (sorted.len() - 1) as f64;
            let (low, high) = (sorted[rank.floor() as usize], sorted[rank.ceil() as usize]);
            low + (high - low) * (rank - rank.floor())
        };
        Self { median: at(0.5), p10: at(0.1), p90: at(0.9), min: sorted[0], max: sorted[sorted.len() - 1], samples: sorted.len() }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    nproc: usize,
    cpu_model: Option<String>,
    binary: String,
    binary_size_mb: f64,
    version_exit_ms: Spread,
    first_llm_request_ms: Spread,
    first_run_first_llm_request_ms: f64,
    one_shot_turn_ms: Spread,
    chat_five_turns: ChatMemory,
    upstream: Upstream,
}

#[derive(Debug, Serialize)]
struct ChatMemory {
    peak_rss_mb: Spread,
    rss_after_mb: Spread,
    turns: usize,
}

#[derive(Debug, Serialize)]
struct Upstream {
    first_llm_request_ms: f64,
    peak_rss_mb: f64,
    target_first_llm_request_ms: f64,
    target_peak_rss_mb: f64,
}

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(base_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = project_config(base_url, "sk-bench");
        std::fs::write(dir.path().join("config.yml"), config).expect("config");
        Self { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("PEREGRINE_CONFIG")
            .env_remove("CONFIG_FILE")
            .env("HOME", self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// `VmHWM` and `VmRSS` of a live process, in MB.
fn memory_of(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .expect("field present")
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Spawns `run`, returns (spawn → first request, spawn → exit).
async fn one_shot(server: &ScriptedLlmServer, project: &Project, thread: &str) -> (Duration, Duration) {
    let before = server.request_count();
    let mut command = project.command(&["run", "--thread", thread, QUESTION]);
    let (started, exited) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let output = command.output().expect("run");
        let exited = started.elapsed();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stdout).contains(ANSWER_MARKER));
        (started, exited)
    })
    .await
    .expect("joined");
    let first = server.requests().into_iter().nth(before).expect("the turn's first request");
    (first.received_at.duration_since(started), exited)
}

/// One chat process, five turns through a pipe; peak and current RSS after the fifth answer.
fn chat_memory(project: &Project, turns: usize) -> (f64, f64) {
    let mut child = project.command(&["chat", "--thread", "memory"]).stdin(Stdio::piped()).spawn().expect("chat");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    for _ in 0..turns {
        writeln!(stdin, "{QUESTION}").expect("question written");
        stdin.flush().expect("flushed");
        let mut line = String::new();
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).expect("read") > 0, "chat ended before answering");
            if line.contains(ANSWER_MARKER) {
                break;
            }
        }
    }
    let memory = memory_of(child.id());
    drop(stdin);
    let status = child.wait().expect("chat exits");
    assert!(status.success(), "chat exits cleanly at end of input");
    memory
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let repeats = if quick { 5 } else { 30 };
    let server = ScriptedLlmServer::start(weather_script()).await;
    let project = Project::new(&server.base_url());

    let mut version = Vec::new();
    for _ in 0..repeats {
        let mut command = project.command(&["--version"]);
        let started = Instant::now();
        let output = tokio::task::spawn_blocking(move || command.output().expect("--version")).await.expect("joined");
        version.push(ms(started.elapsed()));
        assert!(output.status.success());
    }

    let (first_run, _) = one_shot(&server, &project, "first").await;
    let mut first_request = Vec::new();
    let mut turn = Vec::new();
    for index in 0..repeats {
        let (to_request, to_exit) = one_shot(&server, &project, &format!("t{index}")).await;
        first_request.push(ms(to_request));
        turn.push(ms(to_exit));
    }

    let chat_project = Project::new(&server.base_url());
    let chat_repeats = if quick { 2 } else { 5 };
    let mut peaks = Vec::new();
    let mut currents = Vec::new();
    for _ in 0..chat_repeats {
        let fresh = Project::new(&server.base_url());
        let (peak, current) = tokio::task::block_in_place(|| chat_memory(&fresh, 5));
        peaks.push(peak);
        currents.push(current);
    }
    drop(chat_project);

    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines().find(|line| line.starts_with("model name")).and_then(|line| line.split_once(':')).map(|(_, m)| m.trim().to_owned())
    });
    let report = Report {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        nproc: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_model,
        binary: BIN.to_owned(),
        binary_size_mb: std::fs::metadata(BIN).map_or(0.0, |meta| meta.len() as f64 / 1_048_576.0),
        version_exit_ms: Spread::of(&version),
        first_llm_request_ms: Spread::of(&first_request),
        first_run_first_llm_request_ms: ms(first_run),
        one_shot_turn_ms: Spread::of(&turn),
        chat_five_turns: ChatMemory { peak_rss_mb: Spread::of(&peaks), rss_after_mb: Spread::of(&currents), turns: 5 },
        upstream: Upstream {
            first_llm_request_ms: UPSTREAM_FIRST_REQUEST_MS,
            peak_rss_mb: UPSTREAM_PEAK_RSS_MB,
            target_first_llm_request_ms: TARGET_FIRST_REQUEST_MS,
            target_peak_rss_mb: TARGET_PEAK_RSS_MB,
        },
    };
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results");
    write(&out, &report);
    server.shutdown().await;
}

fn write(dir: &Path, report: &Report) {
    std::fs::create_dir_all(dir).expect("bench-results");
    let json: PathBuf = dir.join("startup.json");
    std::fs::write(&json, serde_json::to_string_pretty(report).expect("JSON") + "\n").expect("startup.json");
    let row = |name: &str, spread: &Spread, unit: &str| {
        format!(
            "| {name} | {:.1} {unit} | {:.1}–{:.1} | {:.1}–{:.1} | {} |\n",
            spread.median, spread.p10, spread.p90, spread.min, spread.max, spread.samples
        )
    };
    let mut md = String::new();
    md.push_str("# Start-up and memory: the hello-world-weather binary\n\n");
    md.push_str(&format!(
        "{} · {} CPUs · {} · binary {:.1} MB (release)\n\n",
        report.date,
        report.nproc,
        report.cpu_model.as_deref().unwrap_or("unknown CPU"),
        report.binary_size_mb
    ));
    md.push_str("Scripted LLM server on loopback answering at once; a temp project with config.yml and SQLite.\n\n");
    md.push_str("| measurement | median | p10–p90 | min–max | samples |\n|---|---|---|---|---|\n");
    md.push_str(&row("`--version`: spawn → exit (process floor)", &report.version_exit_ms, "ms"));
    md.push_str(&row("`run`: spawn → first LLM request", &report.first_llm_request_ms, "ms"));
    md.push_str(&row("`run`: spawn → exit (whole turn, 5 LLM calls)", &report.one_shot_turn_ms, "ms"));
    md.push_str(&row("`chat`, 5 turns: peak RSS (VmHWM)", &report.chat_five_turns.peak_rss_mb, "MB"));
    md.push_str(&row("`chat`, 5 turns: RSS after the 5th", &report.chat_five_turns.rss_after_mb, "MB"));
    md.push_str(&format!(
        "\nFirst `run` in a new project (creates the SQLite file): {:.1} ms to the first LLM request.\n\n",
        report.first_run_first_llm_request_ms
    ));
    md.push_str(&format!(
        "| | Peregrine (median) | target | upstream Osprey 0.11.5 |\n|---|---|---|---|\n\
         | start → first LLM request | {:.1} ms | < {:.0} ms | {:.0} ms |\n\
         | peak RSS over 5 weather turns | {:.1} MB | ≤ {:.0} MB | {:.0} MB |\n",
        report.first_llm_request_ms.median,
        TARGET_FIRST_REQUEST_MS,
        UPSTREAM_FIRST_REQUEST_MS,
        report.chat_five_turns.peak_rss_mb.median,
        TARGET_PEAK_RSS_MB,
        UPSTREAM_PEAK_RSS_MB
    ));
    std::fs::write(dir.join("startup.md"), md).expect("startup.md");
}

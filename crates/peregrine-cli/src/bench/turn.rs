//! `peregrine bench turn`: whole agent turns of the hello-world-weather example ("What's the
//! weather in Prague?") against a scripted model. It counts LLM calls and prompt bytes per turn,
//! times the framework's overhead with the model answering instantly — for 0, 5 and 20 extra
//! registered capabilities, both classifier modes, in-memory and SQLite checkpoints (on disk and on tmpfs) —, times turns
//! against a 200 ms model to compare with the critical path of its sequential calls, and, given a
//! local model, measures the classifier's accuracy in both modes on a labelled set.
//!
//! With an instant model the whole turn time is framework overhead: gateway, graph engine and
//! checkpoints, prompt building, parsing the scripted answers, events. Numbers are reported,
//! never asserted (the test below asserts call counts and the structural critical path only).

mod accuracy;
mod report;
mod script;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use peregrine_agent::{Agent, AgentSettings, ClassifierMode, Services, Session, TurnOptions, TurnStatus};
use peregrine_core::{AgentEvent, ExecutionLimits, Registry};
use peregrine_graph::{ListQuery, RunEvent};
use tokio::time::Instant;

use self::report::{Floors, LatencyResult, OverheadResult, SchemaCalls, TurnBenchReport, TurnSettings};
use self::script::{ANSWER, CallRecord, QUESTION, ScriptedLlm, WEATHER_KEY};
use super::graph::Backend;
use super::report::{MILLIS, Spread, machine_info};
use super::scenarios::disk_sync;
use super::{ScratchDir, with_extension_appended};

/// Timed turns per configuration unless told otherwise.
pub const DEFAULT_TURNS: usize = 200;
/// Timed turns per configuration of the latency scenario unless told otherwise.
pub const DEFAULT_LATENCY_TURNS: usize = 10;
/// The scripted model's latency in the latency scenario.
pub const LATENCY: Duration = Duration::from_millis(200);
/// Extra (stand-in) capabilities registered beside `current_weather`.
const EXTRAS: [usize; 3] = [0, 5, 20];
/// Extra capabilities in the latency scenario.
const LATENCY_EXTRAS: usize = 20;
const MODES: [ClassifierMode; 2] = [ClassifierMode::Batched, ClassifierMode::PerCapability];
const QUICK_TURNS: usize = 20;
const QUICK_LATENCY_TURNS: usize = 2;
/// Raw disk syncs timed before each SQLite configuration, to read its turns against.
const DISK_SYNCS: usize = 30;
/// A tmpfs for the SQLite-without-disk rows.
const TMPFS: &str = "/dev/shm";
/// Bare sleeps timed, to read the slow turns against.
const SLEEP_SAMPLES: usize = 5;

/// `peregrine bench turn` options.
#[derive(Debug, Clone, clap::Args)]
pub struct TurnBenchArgs {
    /// Output path without extension: `<out>.json` and `<out>.md` are written.
    #[arg(long, default_value = "bench-results/turn")]
    pub out: PathBuf,
    /// Timed turns per configuration with the instant model (after one warm-up).
    #[arg(long, default_value_t = DEFAULT_TURNS)]
    pub turns: usize,
    /// Timed turns per configuration with the 200 ms model.
    #[arg(long, default_value_t = DEFAULT_LATENCY_TURNS)]
    pub latency_turns: usize,
    /// 20 instant and 2 slow turns per configuration (a smoke run).
    #[arg(long)]
    pub quick: bool,
    /// A GGUF model for the classifier-accuracy part (needs a `--features local` build;
    /// `scripts/fetch-model.sh` prints one). Without it that part is skipped.
    #[arg(long, env = "PEREGRINE_LOCAL_MODEL")]
    pub model: Option<PathBuf>,
}

impl TurnBenchArgs {
    fn sizes(&self) -> TurnSizes {
        let (turns, latency_turns) = if self.quick {
            (self.turns.clamp(1, QUICK_TURNS), self.latency_turns.min(QUICK_LATENCY_TURNS))
        } else {
            (self.turns.max(1), self.latency_turns)
        };
        TurnSizes { turns, latency_turns, latency: LATENCY, stores: &[Store::Memory, Store::Sqlite, Store::SqliteTmpfs] }
    }
}

/// How much to run (the CLI derives it from the options; the test shrinks it).
#[derive(Debug, Clone, Copy)]
struct TurnSizes {
    turns: usize,
    latency_turns: usize,
    latency: Duration,
    stores: &'static [Store],
}

/// Where a configuration keeps its checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    /// `MemoryCheckpointer`.
    Memory,
    /// `SqliteCheckpointer` on the results' filesystem (durable: every commit syncs the disk).
    Sqlite,
    /// `SqliteCheckpointer` on tmpfs (`/dev/shm`), where a sync costs nothing: SQLite's CPU
    /// cost without the disk's latency.
    SqliteTmpfs,
}

impl Store {
    fn backend(self) -> Backend {
        match self {
            Self::Memory => Backend::Memory,
            Self::Sqlite | Self::SqliteTmpfs => Backend::Sqlite,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::SqliteTmpfs => "sqlite_tmpfs",
        }
    }
}

/// One configuration of the agent.
#[derive(Debug, Clone, Copy)]
struct Config {
    store: Store,
    mode: ClassifierMode,
    extra: usize,
}

impl Config {
    fn label(self) -> String {
        format!("{}-{}-{}", self.store.name(), mode_name(self.mode), self.extra)
    }
}

fn mode_name(mode: ClassifierMode) -> &'static str {
    match mode {
        ClassifierMode::Batched => "batched",
        ClassifierMode::PerCapability => "per_capability",
    }
}

/// The weather agent as the example configures it (its task-extraction prompts) with `extra`
/// stand-ins, answering through `llm`.
async fn weather_agent(config: Config, llm: &ScriptedLlm, scratch: &ScratchDir) -> anyhow::Result<Agent> {
    let settings = AgentSettings { classifier_mode: config.mode, ..AgentSettings::with_data_dir(scratch.path.join("agent-data")) };
    let services = Services::new(Arc::new(llm.client()), settings);
    let mut registry = Registry::new();
    hello_world_weather::register(&mut registry, &services)?;
    hello_world_weather::register_extra_capabilities(&mut registry, config.extra)?;
    let checkpointer = config.store.backend().open(scratch, &format!("turn-{}.sqlite", config.label())).await?;
    let checkpointer = checkpointer.context("the agent needs a checkpointer; the turn bench measures memory and SQLite")?;
    let agent = Agent::builder(registry, services).checkpointer(checkpointer).prompts(hello_world_weather::prompts::prompt_overrides());
    Ok(agent.build()?)
}

/// What one turn cost.
struct TurnSample {
    elapsed: Duration,
    calls: Vec<CallRecord>,
    events: usize,
}

impl TurnSample {
    fn prompt_bytes(&self) -> usize {
        self.calls.iter().map(|call| call.prompt_bytes).sum()
    }
}

/// Runs one turn on a fresh `thread` and checks it answered from the weather reading. Events
/// are buffered during the turn and counted afterwards (an interface's rendering is not timed).
async fn run_turn(agent: &Agent, llm: &ScriptedLlm, thread: &str) -> anyhow::Result<TurnSample> {
    let session = Session::new("bench-user", "cli");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<RunEvent<AgentEvent>>();
    let options = TurnOptions { events: Some(sender), ..TurnOptions::default() };
    drop(llm.take_calls());
    let started = Instant::now();
    let result = agent.send(thread, QUESTION, &session, options).await.with_context(|| format!("turn on thread '{thread}'"))?;
    let elapsed = started.elapsed();
    let calls = llm.take_calls();
    let mut events = 0;
    while receiver.try_recv().is_ok() {
        events += 1;
    }
    anyhow::ensure!(result.status == TurnStatus::Completed, "the turn on '{thread}' ended {:?}: {:?}", result.status, result.response);
    anyhow::ensure!(result.response.as_deref() == Some(ANSWER.trim()), "the turn on '{thread}' answered {:?}", result.response);
    let stored = result.state.as_ref().is_some_and(|state| state.capability_context_data.entry("CURRENT_WEATHER", WEATHER_KEY).is_some());
    anyhow::ensure!(stored, "the turn on '{thread}' did not store the weather reading");
    Ok(TurnSample { elapsed, calls, events })
}

/// Calls per schema name, from one turn's records (in first-call order).
fn calls_by_schema(calls: &[CallRecord]) -> Vec<SchemaCalls> {
    let mut by_schema: Vec<SchemaCalls> = Vec::new();
    for call in calls {
        let name = if call.schema.is_empty() { "(plain, streamed)" } else { call.schema.as_str() };
        let index = match by_schema.iter().position(|entry| entry.schema == name) {
            Some(index) => index,
            None => {
                by_schema.push(SchemaCalls { schema: name.to_owned(), calls: 0, prompt_bytes: 0, schema_bytes: 0 });
                by_schema.len() - 1
            }
        };
        let entry = &mut by_schema[index];
        entry.calls += 1;
        entry.prompt_bytes += call.prompt_bytes;
        entry.schema_bytes += call.schema_bytes.unwrap_or(0);
    }
    by_schema
}

/// Sequential LLM rounds of a turn: every call in turn, except that the per-capability
/// classifier's `CapabilityMatch` calls run `limit` at a time.
fn sequential_rounds(calls: &[CallRecord], limit: usize) -> usize {
    let matches = calls.iter().filter(|call| call.schema == "CapabilityMatch").count();
    calls.len() - matches + matches.div_ceil(limit.max(1))
}

fn spread_of_counts(values: impl Iterator<Item = usize>) -> Spread {
    Spread::of(&values.map(|value| value as f64).collect::<Vec<_>>())
}

/// Framework overhead: `turns` timed turns with the instant model, after one warm-up turn that
/// also measures the schemas sent.
async fn measure_overhead(config: Config, scratch: &ScratchDir, turns: usize) -> anyhow::Result<OverheadResult> {
    eprintln!("bench turn: {} backend, {} classifier, {} extra capabilities", config.store.name(), mode_name(config.mode), config.extra);
    let llm = ScriptedLlm::new(None);
    let agent = weather_agent(config, &llm, scratch).await?;
    // The disk's sync latency drifts by 10× on a shared VM: measure it right beside the turns.
    let disk_sync_us = match config.store.backend() {
        Backend::Sqlite => Some(disk_sync(scratch, &format!("{}-disk-sync", config.label()), DISK_SYNCS).await?),
        _ => None,
    };
    llm.measure_schemas(true);
    let warmup_thread = format!("{}-warmup", config.label());
    let warmup = run_turn(&agent, &llm, &warmup_thread).await?;
    llm.measure_schemas(false);
    let checkpoints_per_turn = agent.history(&warmup_thread, ListQuery::default()).await?.len();
    let mut samples = Vec::with_capacity(turns);
    for turn in 0..turns {
        samples.push(run_turn(&agent, &llm, &format!("{}-{turn}", config.label())).await?);
    }
    let durations: Vec<Duration> = samples.iter().map(|sample| sample.elapsed).collect();
    let total: Duration = durations.iter().sum();
    let by_schema = calls_by_schema(&warmup.calls);
    Ok(OverheadResult {
        backend: config.store.name().to_owned(),
        mode: mode_name(config.mode).to_owned(),
        extra_capabilities: config.extra,
        registered_capabilities: agent.catalog().names().count(),
        classifier_candidates: config.extra + 1,
        checkpoints_per_turn,
        disk_sync_us,
        turns,
        llm_calls_per_turn: spread_of_counts(samples.iter().map(|sample| sample.calls.len())),
        prompt_bytes_per_turn: spread_of_counts(samples.iter().map(TurnSample::prompt_bytes)),
        schema_bytes_per_turn: by_schema.iter().map(|entry| entry.schema_bytes).sum(),
        events_per_turn: spread_of_counts(samples.iter().map(|sample| sample.events)),
        turn_ms: Spread::of_durations(&durations, MILLIS, 1.0),
        turns_per_second: turns as f64 / total.as_secs_f64().max(f64::EPSILON),
        calls_by_schema: by_schema,
    })
}

/// What one `tokio::time::sleep(latency)` really takes here (ms): the timer's floor per round.
async fn calibrate_sleep(latency: Duration, samples: usize) -> Spread {
    let mut durations = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        tokio::time::sleep(latency).await;
        durations.push(started.elapsed());
    }
    Spread::of_durations(&durations, MILLIS, 1.0)
}

/// Turn wall time with a model that takes `latency` per call, against the critical path and
/// against the same rounds of bare sleeps (`sleep_ms`, the timer's own cost per round).
async fn measure_latency(
    config: Config,
    scratch: &ScratchDir,
    turns: usize,
    latency: Duration,
    sleep_ms: f64,
) -> anyhow::Result<LatencyResult> {
    eprintln!(
        "bench turn: {} ms model, {} backend, {} classifier, {} extra",
        latency.as_millis(),
        config.store.name(),
        mode_name(config.mode),
        config.extra
    );
    let llm = ScriptedLlm::new(Some(latency));
    let agent = weather_agent(config, &llm, scratch).await?;
    let warmup = run_turn(&agent, &llm, &format!("{}-slow-warmup", config.label())).await?;
    let limit = ExecutionLimits::default().max_concurrent_classifications;
    let rounds = sequential_rounds(&warmup.calls, limit);
    let critical_path = latency * u32::try_from(rounds).unwrap_or(u32::MAX);
    let mut samples = Vec::with_capacity(turns);
    for turn in 0..turns {
        samples.push(run_turn(&agent, &llm, &format!("{}-slow-{turn}", config.label())).await?);
    }
    let durations: Vec<Duration> = samples.iter().map(|sample| sample.elapsed).collect();
    let critical_ms = critical_path.as_secs_f64() * MILLIS;
    let timer_ms = sleep_ms * rounds as f64;
    let turn_ms: Vec<f64> = durations.iter().map(|duration| duration.as_secs_f64() * MILLIS).collect();
    Ok(LatencyResult {
        backend: config.store.name().to_owned(),
        mode: mode_name(config.mode).to_owned(),
        extra_capabilities: config.extra,
        latency_ms: latency.as_secs_f64() * MILLIS,
        max_concurrent_classifications: limit,
        turns,
        llm_calls_per_turn: warmup.calls.len(),
        sequential_rounds: rounds,
        critical_path_ms: critical_ms,
        turn_ms: Spread::of(&turn_ms),
        ratio_to_critical_path: Spread::of(&turn_ms.iter().map(|ms| ms / critical_ms).collect::<Vec<_>>()),
        overhead_ms: Spread::of(&turn_ms.iter().map(|ms| ms - critical_ms).collect::<Vec<_>>()),
        timer_path_ms: timer_ms,
        overhead_beyond_timer_ms: Spread::of(&turn_ms.iter().map(|ms| ms - timer_ms).collect::<Vec<_>>()),
    })
}

/// Runs the benchmark, writes `<out>.json` and `<out>.md`, prints the Markdown.
pub async fn run(args: &TurnBenchArgs) -> anyhow::Result<TurnBenchReport> {
    run_with(args, args.sizes()).await
}

async fn run_with(args: &TurnBenchArgs, sizes: TurnSizes) -> anyhow::Result<TurnBenchReport> {
    let scratch = ScratchDir::beside(&args.out)?;
    let machine = machine_info(&scratch);
    let tmpfs = if Path::new(TMPFS).is_dir() { Some(ScratchDir::beside(&Path::new(TMPFS).join("turn"))?) } else { None };
    let mut overhead = Vec::new();
    for &store in sizes.stores {
        let store_scratch = match (store, &tmpfs) {
            (Store::SqliteTmpfs, Some(tmpfs)) => tmpfs,
            (Store::SqliteTmpfs, None) => {
                eprintln!("bench turn: no {TMPFS}; the SQLite-on-tmpfs rows are left out");
                continue;
            }
            _ => &scratch,
        };
        for mode in MODES {
            for extra in EXTRAS {
                overhead.push(measure_overhead(Config { store, mode, extra }, store_scratch, sizes.turns).await?);
            }
        }
    }
    let mut latency = Vec::new();
    let mut sleep_ms = None;
    if sizes.latency_turns > 0 {
        eprintln!("bench turn: calibrating tokio::time::sleep({} ms)", sizes.latency.as_millis());
        let sleep = calibrate_sleep(sizes.latency, SLEEP_SAMPLES).await;
        let per_round = sleep.median;
        sleep_ms = Some(sleep);
        for &store in sizes.stores.iter().filter(|store| **store != Store::SqliteTmpfs) {
            for mode in MODES {
                let config = Config { store, mode, extra: LATENCY_EXTRAS };
                latency.push(measure_latency(config, &scratch, sizes.latency_turns, sizes.latency, per_round).await?);
            }
        }
    }
    let accuracy = accuracy::run(args.model.as_deref(), &scratch).await;
    let settings = TurnSettings {
        question: QUESTION.to_owned(),
        turns: sizes.turns,
        latency_turns: sizes.latency_turns,
        latency_ms: sizes.latency.as_secs_f64() * MILLIS,
        quick: args.quick,
        answer_bytes: ANSWER.len(),
    };
    let floors = Floors { sleep_ms };
    let report = TurnBenchReport::new(machine, settings, floors, overhead, latency, accuracy);
    write_report(&args.out, &report)?;
    Ok(report)
}

fn write_report(out: &Path, report: &TurnBenchReport) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let json_path = with_extension_appended(out, "json");
    let json = serde_json::to_string_pretty(report).context("serializing the turn bench report")?;
    std::fs::write(&json_path, json + "\n").with_context(|| format!("writing {}", json_path.display()))?;
    let markdown = report.to_markdown();
    let markdown_path = with_extension_appended(out, "md");
    std::fs::write(&markdown_path, &markdown).with_context(|| format!("writing {}", markdown_path.display()))?;
    println!("{markdown}");
    eprintln!("bench turn: wrote {} and {}", json_path.display(), markdown_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path) -> TurnBenchArgs {
        TurnBenchArgs { out: dir.join("results/turn"), turns: 2, latency_turns: 0, quick: true, model: None }
    }

    /// Calls per turn of the weather task: batched is 5 whatever is registered; per capability
    /// is 4 plus one `CapabilityMatch` per guided candidate (current_weather + the stand-ins).
    #[tokio::test]
    async fn llm_calls_per_turn_follow_the_classifier_mode_not_the_registry_size() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sizes = TurnSizes { turns: 2, latency_turns: 0, latency: LATENCY, stores: &[Store::Memory] };
        let report = run_with(&args(dir.path()), sizes).await.expect("bench runs");

        assert_eq!(report.overhead.len(), MODES.len() * EXTRAS.len());
        for result in &report.overhead {
            let expected = match result.mode.as_str() {
                "batched" => 5,
                _ => 4 + result.classifier_candidates,
            };
            assert_eq!(result.classifier_candidates, result.extra_capabilities + 1);
            assert_eq!((result.llm_calls_per_turn.min, result.llm_calls_per_turn.max), (expected as f64, expected as f64), "{result:?}");
            let schemas: Vec<(&str, usize)> = result.calls_by_schema.iter().map(|entry| (entry.schema.as_str(), entry.calls)).collect();
            let classifier = match result.mode.as_str() {
                "batched" => ("CapabilitySelection", 1),
                _ => ("CapabilityMatch", result.classifier_candidates),
            };
            let expected_schemas =
                [("ExtractedTask", 1), classifier, ("ExecutionPlan", 1), ("LocationExtraction", 1), ("(plain, streamed)", 1)];
            assert_eq!(schemas, expected_schemas, "{} / {}", result.mode, result.extra_capabilities);
            assert!(result.prompt_bytes_per_turn.median > 0.0 && result.events_per_turn.median > 0.0);
            // The turn's input, then one checkpoint per node: task extraction, classifier,
            // orchestrator, current_weather, respond.
            assert_eq!(result.checkpoints_per_turn, 6, "{result:?}");
        }
        // The plan is made for the active capabilities only: its prompt does not grow with the registry.
        let plan_bytes = |extra: usize| {
            let result = report.overhead.iter().find(|result| result.mode == "batched" && result.extra_capabilities == extra);
            result
                .and_then(|result| result.calls_by_schema.iter().find(|entry| entry.schema == "ExecutionPlan"))
                .map(|entry| entry.prompt_bytes)
        };
        assert_eq!(plan_bytes(0), plan_bytes(20));
        assert!(dir.path().join("results/turn.json").is_file() && dir.path().join("results/turn.md").is_file());
        let markdown = std::fs::read_to_string(dir.path().join("results/turn.md")).expect("markdown written");
        assert!(markdown.contains("classifier accuracy was skipped"), "{markdown}");
    }

    /// On tokio's paused clock the framework's own work takes no time, so a turn lasts exactly
    /// its sequential LLM rounds: 5 batched; 4 + ceil(21 / 5) = 9 with per-capability calls
    /// running 5 at a time (virtual time, not wall-clock).
    #[tokio::test(start_paused = true)]
    async fn a_slow_model_costs_exactly_the_sequential_rounds() {
        let dir = tempfile::tempdir().expect("temp dir");
        let scratch = ScratchDir::beside(&dir.path().join("turn")).expect("scratch");
        for (mode, rounds) in [(ClassifierMode::Batched, 5), (ClassifierMode::PerCapability, 9)] {
            let config = Config { store: Store::Memory, mode, extra: LATENCY_EXTRAS };
            let result = measure_latency(config, &scratch, 1, LATENCY, 200.0).await.expect("runs");
            assert_eq!(result.overhead_beyond_timer_ms.median, 0.0);
            assert_eq!(result.sequential_rounds, rounds, "{mode:?}");
            assert_eq!(result.turn_ms.median, result.critical_path_ms, "{mode:?}");
            assert_eq!(result.critical_path_ms, 200.0 * rounds as f64);
        }
    }

    #[tokio::test]
    async fn the_meter_sees_every_request_the_fake_answers() {
        let dir = tempfile::tempdir().expect("temp dir");
        let scratch = ScratchDir::beside(&dir.path().join("turn")).expect("scratch");
        let llm = ScriptedLlm::new(None);
        let config = Config { store: Store::Sqlite, mode: ClassifierMode::PerCapability, extra: 5 };
        let agent = weather_agent(config, &llm, &scratch).await.expect("agent");
        let sample = run_turn(&agent, &llm, "meter").await.expect("turn");
        let requests = llm.fake().requests();
        assert_eq!(sample.calls.len(), requests.len());
        assert_eq!(sample.calls.len(), 4 + 6);
        let bytes: usize = requests.iter().flat_map(|request| &request.messages).map(|message| message.content.len()).sum();
        assert_eq!(sample.prompt_bytes(), bytes);
        let answered = requests.iter().filter(|request| request.response_schema.is_none()).count();
        assert_eq!(answered, 1, "one streamed answer");
    }

    #[test]
    fn rounds_group_match_calls_by_the_concurrency_limit() {
        let call = |schema: &str| CallRecord { schema: schema.into(), prompt_bytes: 1, schema_bytes: None };
        let mut calls = vec![call("ExtractedTask")];
        calls.extend((0..21).map(|_| call("CapabilityMatch")));
        calls.extend([call("ExecutionPlan"), call("LocationExtraction"), call("")]);
        assert_eq!(sequential_rounds(&calls, 5), 9);
        assert_eq!(sequential_rounds(&calls, 1), 25);
        assert_eq!(calls_by_schema(&calls)[1].calls, 21);
    }
}

//! The measured scenarios: the router loop per backend, one long conversation, the interrupt
//! round trip, state reads, and the disk's raw sync cost.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use peregrine_graph::{Graph, ListQuery, Resume, RunOptions, RunOutcome};
use serde::Serialize;
use serde_json::json;

use super::graph::{Backend, BenchState, BenchUpdate, bench_graph, timed_turn};
use super::report::{MICROS, MILLIS, Spread};
use super::{ScratchDir, Sizes};

/// Scenario 1: one turn of the router loop on a fresh thread, per backend.
#[derive(Debug, Clone, Serialize)]
pub struct RouterLoopResult {
    /// The checkpointer.
    pub backend: String,
    /// Node executions per turn (plan + respond).
    pub node_steps: u32,
    /// LangGraph supersteps for the same turn (router before every node).
    pub langgraph_supersteps: u32,
    /// Checkpoints written per turn (input + one per node), 0 without a checkpointer.
    pub checkpoints_per_turn: u32,
    /// Whole turn (ms).
    pub per_turn_ms: Spread,
    /// Turn time / node executions (µs).
    pub per_node_step_us: Spread,
    /// Turn time / LangGraph supersteps (µs): compare with LangGraph's per-superstep figures.
    pub per_langgraph_superstep_us: Spread,
}

pub(super) async fn router_loop(backend: Backend, scratch: &ScratchDir, sizes: Sizes, repeats: usize) -> anyhow::Result<RouterLoopResult> {
    eprintln!("bench: router loop, {}", backend.label());
    let graph = bench_graph(backend.open(scratch, "router-loop.sqlite").await?, sizes)?;
    timed_turn(&graph, "router-loop-warmup", sizes).await?;
    let mut turns = Vec::with_capacity(repeats);
    for repeat in 0..repeats {
        turns.push(timed_turn(&graph, &format!("router-loop-{repeat}"), sizes).await?);
    }
    Ok(RouterLoopResult {
        backend: backend.label().into(),
        node_steps: sizes.node_steps(),
        langgraph_supersteps: sizes.langgraph_supersteps(),
        checkpoints_per_turn: if backend == Backend::None { 0 } else { sizes.node_steps() + 1 },
        per_turn_ms: Spread::of_durations(&turns, MILLIS, 1.0),
        per_node_step_us: Spread::of_durations(&turns, MICROS, f64::from(sizes.node_steps())),
        per_langgraph_superstep_us: Spread::of_durations(&turns, MICROS, f64::from(sizes.langgraph_supersteps())),
    })
}

/// Scenario 2: the durable step cost early and late in one long conversation. The state grows
/// with the conversation (a list reducer), so each turn's run also loads a bigger state; a
/// `get_state` just before each turn (not part of the turn's time) estimates that load, so the
/// step cost proper can be told apart from it.
#[derive(Debug, Clone, Serialize)]
pub struct LongConversationResult {
    /// The checkpointer.
    pub backend: String,
    /// Turns run on the one thread.
    pub turns: usize,
    /// Turns compared at each end.
    pub window: usize,
    /// Node executions per turn.
    pub node_steps_per_turn: u32,
    /// Checkpoints on the thread at the end.
    pub checkpoints: usize,
    /// Messages in the state at the end.
    pub messages: usize,
    /// Size of the final state as JSON (bytes).
    pub state_bytes: usize,
    /// Per node step over the first `window` turns (µs).
    pub early_per_node_step_us: Spread,
    /// Per node step over the last `window` turns (µs).
    pub late_per_node_step_us: Spread,
    /// Late median / early median: about 1 when a step costs the same however long the thread.
    pub late_over_early: f64,
    /// Loading the thread's state (`get_state`) before the first `window` turns (µs).
    pub early_state_load_us: Spread,
    /// Loading the thread's state before the last `window` turns (µs).
    pub late_state_load_us: Spread,
    /// (turn − state load) / node steps over the first `window` turns (µs).
    pub early_per_node_step_excluding_load_us: Spread,
    /// (turn − state load) / node steps over the last `window` turns (µs).
    pub late_per_node_step_excluding_load_us: Spread,
    /// Late / early median of the step cost without the state load.
    pub late_over_early_excluding_load: f64,
    /// Per node step of a turn on a brand-new thread (same database) run just before each of
    /// the last `window` turns: the same disk conditions without the long history (µs).
    pub late_control_per_node_step_us: Spread,
    /// Late median / control median: robust to the disk's latency drifting during the run.
    pub late_over_control: f64,
    /// Per node step of every turn, in order (µs).
    pub per_node_step_us_by_turn: Vec<f64>,
    /// The state load before every turn, in order (µs).
    pub state_load_us_by_turn: Vec<f64>,
}

/// The spreads of the first and the last `window` values.
fn ends(series: &[f64], window: usize) -> (Spread, Spread) {
    let early = series.get(..window).unwrap_or_default();
    let late = series.get(series.len().saturating_sub(window)..).unwrap_or_default();
    (Spread::of(early), Spread::of(late))
}

pub(super) async fn long_conversation(scratch: &ScratchDir, sizes: Sizes) -> anyhow::Result<LongConversationResult> {
    const THREAD: &str = "long-conversation";
    let backend = Backend::Sqlite;
    eprintln!("bench: {} turns on one thread, {}", sizes.turns, backend.label());
    let graph = bench_graph(backend.open(scratch, "long-conversation.sqlite").await?, sizes)?;
    timed_turn(&graph, "long-conversation-warmup", sizes).await?;
    let node_steps = f64::from(sizes.node_steps());
    let (mut by_turn, mut loads, mut excluding_load, mut control) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for turn_index in 0..sizes.turns {
        if turn_index + sizes.window >= sizes.turns {
            let fresh = timed_turn(&graph, &format!("long-conversation-control-{turn_index}"), sizes).await?;
            control.push(fresh.as_secs_f64() * MICROS / node_steps);
        }
        let started = Instant::now();
        graph.get_state(THREAD).await?;
        let load = started.elapsed().as_secs_f64() * MICROS;
        let turn = timed_turn(&graph, THREAD, sizes).await?.as_secs_f64() * MICROS;
        by_turn.push(turn / node_steps);
        loads.push(load);
        excluding_load.push((turn - load).max(0.0) / node_steps);
    }
    let window = sizes.window.clamp(1, by_turn.len().max(1));
    let (early, late) = ends(&by_turn, window);
    let (early_load, late_load) = ends(&loads, window);
    let (early_steps, late_steps) = ends(&excluding_load, window);
    let late_control = Spread::of(&control);
    let checkpoints = graph.history(THREAD, ListQuery::default()).await?.len();
    let last = graph.get_state(THREAD).await?.context("the long conversation lost its thread")?;
    Ok(LongConversationResult {
        backend: backend.label().into(),
        turns: sizes.turns,
        window,
        node_steps_per_turn: sizes.node_steps(),
        checkpoints,
        messages: last.state.messages.len(),
        state_bytes: serde_json::to_vec(&*last.state)?.len(),
        late_over_early: late.median / early.median,
        late_over_control: late.median / late_control.median,
        late_control_per_node_step_us: late_control,
        early_per_node_step_us: early,
        late_per_node_step_us: late,
        early_state_load_us: early_load,
        late_state_load_us: late_load,
        late_over_early_excluding_load: late_steps.median / early_steps.median,
        early_per_node_step_excluding_load_us: early_steps,
        late_per_node_step_excluding_load_us: late_steps,
        per_node_step_us_by_turn: by_turn,
        state_load_us_by_turn: loads,
    })
}

/// Scenario 3: a node interrupts for approval; time to the pause and from the answer to the end.
#[derive(Debug, Clone, Serialize)]
pub struct InterruptResult {
    /// The checkpointer.
    pub backend: String,
    /// New turn → one capability → the approval node interrupts (ms).
    pub run_to_pause_ms: Spread,
    /// Answer → the approval node runs again → respond (ms).
    pub resume_to_end_ms: Spread,
}

async fn round_trip(graph: &Graph<BenchState>, thread: &str) -> anyhow::Result<(Duration, Duration)> {
    let started = Instant::now();
    let paused = graph.run(thread, BenchUpdate::turn(1, true), RunOptions::default()).await?;
    let to_pause = started.elapsed();
    let interrupt = paused.interrupt().cloned().with_context(|| format!("the approval node on '{thread}' did not interrupt"))?;
    let started = Instant::now();
    let finished = graph.resume(thread, Resume::to(&interrupt, json!(true)), RunOptions::default()).await?;
    let to_end = started.elapsed();
    anyhow::ensure!(
        matches!(finished, RunOutcome::Completed { .. }) && finished.state().approved,
        "the resumed run on '{thread}' did not finish approved"
    );
    Ok((to_pause, to_end))
}

pub(super) async fn interrupt_round_trip(
    backend: Backend,
    scratch: &ScratchDir,
    sizes: Sizes,
    repeats: usize,
) -> anyhow::Result<InterruptResult> {
    eprintln!("bench: interrupt round trip, {}", backend.label());
    let graph = bench_graph(backend.open(scratch, "interrupt.sqlite").await?, sizes)?;
    round_trip(&graph, "interrupt-warmup").await?;
    let (mut pauses, mut resumes) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    for repeat in 0..repeats {
        let (pause, resume) = round_trip(&graph, &format!("interrupt-{repeat}")).await?;
        pauses.push(pause);
        resumes.push(resume);
    }
    Ok(InterruptResult {
        backend: backend.label().into(),
        run_to_pause_ms: Spread::of_durations(&pauses, MILLIS, 1.0),
        resume_to_end_ms: Spread::of_durations(&resumes, MILLIS, 1.0),
    })
}

/// Scenario 4: reading a thread with about 100 checkpoints.
#[derive(Debug, Clone, Serialize)]
pub struct StateReadsResult {
    /// The checkpointer.
    pub backend: String,
    /// Checkpoints on the thread.
    pub checkpoints: usize,
    /// The `limit` given to `history`.
    pub history_limit: usize,
    /// Entries `history` returned.
    pub history_returned: usize,
    /// `get_state` (newest state, rebuilt from snapshot + deltas) (µs).
    pub get_state_us: Spread,
    /// `history(limit)` (metadata only) (ms).
    pub history_ms: Spread,
}

pub(super) async fn state_reads(scratch: &ScratchDir, sizes: Sizes) -> anyhow::Result<StateReadsResult> {
    const THREAD: &str = "state-reads";
    const HISTORY_LIMIT: usize = 100;
    let backend = Backend::Sqlite;
    eprintln!("bench: get_state and history, {}", backend.label());
    let graph = bench_graph(backend.open(scratch, "state-reads.sqlite").await?, sizes)?;
    for _ in 0..sizes.history_turns {
        timed_turn(&graph, THREAD, sizes).await?;
    }
    let checkpoints = graph.history(THREAD, ListQuery::default()).await?.len();
    let query = ListQuery { before: None, limit: Some(HISTORY_LIMIT) };
    graph.get_state(THREAD).await?.context("the state-read thread has no state")?;
    let mut history_returned = graph.history(THREAD, query).await?.len();
    let (mut gets, mut histories) = (Vec::with_capacity(sizes.state_reads), Vec::with_capacity(sizes.state_reads));
    for _ in 0..sizes.state_reads {
        let started = Instant::now();
        let snapshot = graph.get_state(THREAD).await?;
        gets.push(started.elapsed());
        anyhow::ensure!(snapshot.is_some(), "get_state lost the thread");
        let started = Instant::now();
        history_returned = graph.history(THREAD, query).await?.len();
        histories.push(started.elapsed());
    }
    Ok(StateReadsResult {
        backend: backend.label().into(),
        checkpoints,
        history_limit: HISTORY_LIMIT,
        history_returned,
        get_state_us: Spread::of_durations(&gets, MICROS, 1.0),
        history_ms: Spread::of_durations(&histories, MILLIS, 1.0),
    })
}

/// The disk's own cost of a durable write, measured beside the SQLite files: the floor under any
/// durable step, and the yardstick for how noisy the disk was during the run.
#[derive(Debug, Clone, Serialize)]
pub struct DiskSyncResult {
    /// What one sample does.
    pub probe: String,
    /// Before the scenarios (µs).
    pub before_us: Spread,
    /// After the scenarios (µs).
    pub after_us: Spread,
}

/// Appends 256 bytes to a file and `fdatasync`s it, `samples` times after one warm-up.
pub(super) async fn disk_sync(scratch: &ScratchDir, name: &str, samples: usize) -> anyhow::Result<Spread> {
    let path = scratch.path.join(name);
    let probe = move || -> std::io::Result<Vec<Duration>> {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let block = [b'x'; 256];
        let mut timed = || {
            let started = Instant::now();
            file.write_all(&block)?;
            file.sync_data()?;
            Ok(started.elapsed())
        };
        timed()?;
        (0..samples).map(|_| timed()).collect()
    };
    let durations = tokio::task::spawn_blocking(probe).await.context("the disk sync probe panicked")??;
    Ok(Spread::of_durations(&durations, MICROS, 1.0))
}

//! `peregrine bench`: times the graph engine on LangGraph's "router loop" scenarios and writes
//! the numbers, beside LangGraph's published figures and our targets, as JSON and Markdown.
//!
//! Step mapping: LangGraph's router is a node, so one plan step costs two supersteps there
//! (`router`, then the capability) and a 50-step plan plus `respond` is 102 supersteps. Our
//! router is an edge (a pure function between nodes), so the same turn is 51 node executions.
//! We report per node step, and per LangGraph-equivalent superstep (turn time / 102, i.e. half
//! a node step), which is what LangGraph's per-superstep figures compare against.
//!
//! Numbers are measured with `std::time::Instant` after one warm-up and are reported, never
//! asserted: on a shared 2-core VM they move by tens of percent between runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use peregrine_checkpoint::{MemoryCheckpointer, SqliteCheckpointer};
use peregrine_core::{GraphState, Slot};
use peregrine_graph::{
    DynCheckpointer, Graph, GraphLimits, ListQuery, NodeError, NodeInfo, NodeOutput, NodeResult, Resume, Route, RunOptions, RunOutcome,
    node_fn,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Timed runs per measurement unless told otherwise.
pub const DEFAULT_REPEATS: usize = 15;
/// The most timed runs per measurement in quick mode.
pub const QUICK_REPEATS: usize = 3;

/// What to measure and where to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Output path without extension: `<out>.json` and `<out>.md` are written.
    pub out: PathBuf,
    /// Timed runs per measurement (at least 1; quick mode caps it at [`QUICK_REPEATS`]).
    pub repeats: usize,
    /// Fewer repeats and a 20-turn instead of a 100-turn conversation, for a fast look.
    pub quick: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { out: PathBuf::from("bench-results/graph"), repeats: DEFAULT_REPEATS, quick: false }
    }
}

impl BenchOptions {
    fn effective_repeats(&self) -> usize {
        if self.quick { self.repeats.clamp(1, QUICK_REPEATS) } else { self.repeats.max(1) }
    }
}

/// The sizes of the scenarios (the CLI uses [`Sizes::full`] or [`Sizes::quick`]; tests shrink them).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Capability steps in a turn's plan (LangGraph's harness: 50).
    plan_steps: u32,
    /// Turns on one thread in the conversation-length scenario.
    turns: usize,
    /// Turns compared at each end of that conversation.
    window: usize,
    /// Turns run to give the state-read thread its checkpoints (2 turns of 52 = 104).
    history_turns: usize,
    /// Timed `get_state` and `history` calls.
    state_reads: usize,
    /// Timed raw disk syncs, before and after the scenarios.
    disk_syncs: usize,
}

impl Sizes {
    fn full(repeats: usize) -> Self {
        Self {
            plan_steps: 50,
            turns: 100,
            window: 5,
            history_turns: 2,
            state_reads: (repeats * 10).max(20),
            disk_syncs: (repeats * 4).max(20),
        }
    }

    fn quick(repeats: usize) -> Self {
        Self { turns: 20, ..Self::full(repeats) }
    }

    /// Node executions per turn: the plan, then `respond`.
    fn node_steps(self) -> u32 {
        self.plan_steps + 1
    }

    /// LangGraph supersteps for the same turn: `router` before every capability and before `respond`.
    fn langgraph_supersteps(self) -> u32 {
        2 * self.plan_steps + 2
    }
}

/// LangGraph 1.2.22 on a 2-vCPU VM, "router loop" harness, runs 1 and 2: copied from
/// `shared/reference/langgraph-and-serving.md` §2.2 (measured there, not here).
mod langgraph {
    /// Per superstep, no checkpointer (µs).
    pub const SUPERSTEP_NO_CHECKPOINTER_US: [f64; 2] = [334.0, 339.0];
    /// Per superstep, InMemorySaver with `durability="sync"` (µs); our engine checkpoints
    /// synchronously after every node. Exit/async durability: 325/462 and 884/761 µs.
    pub const SUPERSTEP_IN_MEMORY_SYNC_US: [f64; 2] = [541.0, 816.0];
    /// Per superstep, SqliteSaver on a WAL file with sync durability (µs).
    pub const SUPERSTEP_SQLITE_SYNC_US: [f64; 2] = [2427.0, 2568.0];
    /// `interrupt()` run-to-pause, InMemorySaver (ms).
    pub const INTERRUPT_PAUSE_MEMORY_MS: [f64; 2] = [4.5, 7.1];
    /// Resume-to-end, InMemorySaver (ms).
    pub const INTERRUPT_RESUME_MEMORY_MS: [f64; 2] = [3.9, 7.0];
    /// `interrupt()` run-to-pause, SqliteSaver (ms).
    pub const INTERRUPT_PAUSE_SQLITE_MS: [f64; 2] = [11.1, 12.3];
    /// Resume-to-end, SqliteSaver (ms).
    pub const INTERRUPT_RESUME_SQLITE_MS: [f64; 2] = [15.4, 12.5];
    /// `get_state` on a SQLite thread with about 100 checkpoints (µs; 0.13 and 0.07 ms).
    pub const GET_STATE_US: [f64; 2] = [130.0, 70.0];
    /// `get_state_history` of 104 checkpoints (ms).
    pub const HISTORY_MS: [f64; 2] = [25.9, 22.9];
}

/// Our targets: `shared/architecture.md` (performance budget) and the reference's §8.
mod target {
    /// Per step, no checkpointer (µs, p50).
    pub const STEP_NO_CHECKPOINTER_US: f64 = 20.0;
    /// Per step, in-memory checkpointer (µs, p50).
    pub const STEP_MEMORY_US: f64 = 50.0;
    /// Durable (SQLite WAL, fsync) step, independent of conversation length (µs, p50).
    pub const STEP_DURABLE_US: f64 = 1000.0;
    /// Interrupt run-to-pause and resume-to-end in memory (ms).
    pub const INTERRUPT_MEMORY_MS: f64 = 1.0;
    /// Interrupt run-to-pause and resume-to-end on SQLite (ms).
    pub const INTERRUPT_SQLITE_MS: f64 = 3.0;
    /// `get_state` (µs).
    pub const GET_STATE_US: f64 = 50.0;
    /// History of 100 checkpoints (ms).
    pub const HISTORY_MS: f64 = 2.0;
}

const PAYLOAD_BYTES: usize = 200;
const CAPABILITY: &str = "capability";
const APPROVE: &str = "approve";
const RESPOND: &str = "respond";

// ---------------------------------------------------------------------------------------------
// The benchmark graph: a router loop over a list-reducer state, plus an approval interrupt.
// ---------------------------------------------------------------------------------------------

/// The bench state: a growing message list (LangGraph's list reducer) and the plan cursor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct BenchState {
    messages: Vec<String>,
    step: u32,
    plan_steps: u32,
    needs_approval: bool,
    approved: bool,
}

/// A bench node's update: messages to append and cursor fields to set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct BenchUpdate {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    append: Vec<String>,
    #[serde(default, skip_serializing_if = "Slot::is_keep")]
    step: Slot<u32>,
    #[serde(default, skip_serializing_if = "Slot::is_keep")]
    plan_steps: Slot<u32>,
    #[serde(default, skip_serializing_if = "Slot::is_keep")]
    needs_approval: Slot<bool>,
    #[serde(default, skip_serializing_if = "Slot::is_keep")]
    approved: Slot<bool>,
}

impl BenchUpdate {
    /// A new turn: the user's message, a fresh plan of `plan_steps` capability steps.
    fn turn(plan_steps: u32, needs_approval: bool) -> Self {
        Self {
            append: vec![payload("user", 0)],
            step: Slot::Set(0),
            plan_steps: Slot::Set(plan_steps),
            needs_approval: Slot::Set(needs_approval),
            approved: Slot::Set(false),
        }
    }
}

impl GraphState for BenchState {
    type Update = BenchUpdate;
    type Event = ();

    fn apply(&mut self, update: BenchUpdate) {
        self.messages.extend(update.append);
        update.step.apply_to(&mut self.step);
        update.plan_steps.apply_to(&mut self.plan_steps);
        update.needs_approval.apply_to(&mut self.needs_approval);
        update.approved.apply_to(&mut self.approved);
    }
}

/// A message of exactly [`PAYLOAD_BYTES`] bytes.
fn payload(label: &str, step: u32) -> String {
    let mut text = format!("{label} {step:04} ");
    let padding = PAYLOAD_BYTES.saturating_sub(text.len());
    text.extend(std::iter::repeat_n('x', padding));
    text
}

/// The router edge: run the plan, ask for approval when the turn needs it, then respond.
fn route(state: &BenchState) -> Route {
    if state.step < state.plan_steps {
        Route::to(CAPABILITY)
    } else if state.needs_approval && !state.approved {
        Route::to(APPROVE)
    } else {
        Route::to(RESPOND)
    }
}

async fn capability(state: Arc<BenchState>, _info: NodeInfo) -> NodeResult<BenchUpdate> {
    let update = BenchUpdate { append: vec![payload("result", state.step)], step: Slot::Set(state.step + 1), ..BenchUpdate::default() };
    Ok(NodeOutput::Update(update))
}

async fn approve(state: Arc<BenchState>, info: NodeInfo) -> NodeResult<BenchUpdate> {
    match info.resume {
        None => Ok(NodeOutput::Interrupt {
            payload: json!({ "action": "apply plan", "steps": state.plan_steps }),
            update: BenchUpdate::default(),
        }),
        Some(answer) => {
            let approved = answer.answer == json!(true);
            Ok(NodeOutput::Update(BenchUpdate { approved: Slot::Set(approved), ..BenchUpdate::default() }))
        }
    }
}

async fn respond(state: Arc<BenchState>, _info: NodeInfo) -> NodeResult<BenchUpdate> {
    if state.needs_approval && !state.approved {
        return Err(NodeError::fatal("the plan was not approved"));
    }
    Ok(NodeOutput::Update(BenchUpdate { append: vec![payload("answer", state.step)], ..BenchUpdate::default() }))
}

fn bench_graph(checkpointer: Option<Arc<dyn DynCheckpointer>>, sizes: Sizes) -> anyhow::Result<Graph<BenchState>> {
    let limits =
        GraphLimits { recursion_limit: GraphLimits::default().recursion_limit.max(sizes.node_steps() + 2), ..GraphLimits::default() };
    let builder = Graph::builder()
        .node(CAPABILITY, node_fn(capability))
        .node(APPROVE, node_fn(approve))
        .node(RESPOND, node_fn(respond))
        .router(route)
        .terminal(RESPOND)
        .limits(limits);
    let builder = match checkpointer {
        Some(checkpointer) => builder.shared_checkpointer(checkpointer),
        None => builder,
    };
    Ok(builder.build()?)
}

/// Where checkpoints are kept during a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    None,
    Memory,
    Sqlite,
}

impl Backend {
    fn label(self) -> &'static str {
        match self {
            Self::None => "no checkpointer",
            Self::Memory => "MemoryCheckpointer",
            Self::Sqlite => "SqliteCheckpointer (file, WAL, synchronous=FULL)",
        }
    }

    /// Opens the backend; SQLite gets its own fresh file in the scratch directory.
    async fn open(self, scratch: &ScratchDir, file: &str) -> anyhow::Result<Option<Arc<dyn DynCheckpointer>>> {
        Ok(match self {
            Self::None => None,
            Self::Memory => Some(Arc::new(MemoryCheckpointer::new())),
            Self::Sqlite => {
                let path = scratch.path.join(file);
                let sqlite = SqliteCheckpointer::open(&path).await.with_context(|| format!("opening {}", path.display()))?;
                Some(Arc::new(sqlite))
            }
        })
    }
}

/// Runs one whole turn on `thread` and returns its wall time.
async fn timed_turn(graph: &Graph<BenchState>, thread: &str, sizes: Sizes) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let outcome = graph.run(thread, BenchUpdate::turn(sizes.plan_steps, false), RunOptions::default()).await?;
    let elapsed = started.elapsed();
    let finished = matches!(&outcome, RunOutcome::Completed { last_node: Some(node), .. } if node == RESPOND);
    anyhow::ensure!(finished && outcome.state().step == sizes.plan_steps, "the bench turn on '{thread}' did not run its plan to the end");
    Ok(elapsed)
}

// ---------------------------------------------------------------------------------------------
// Statistics.
// ---------------------------------------------------------------------------------------------

/// The distribution of one measurement's samples, in the unit its field name says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// How many timed samples.
    pub samples: usize,
    /// Median (p50).
    pub median: f64,
    /// Fastest sample.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 25th percentile.
    pub p25: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Slowest sample.
    pub max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |quantile| percentile(&sorted, quantile);
        Self {
            samples: sorted.len(),
            median: at(0.5),
            min: at(0.0),
            p10: at(0.1),
            p25: at(0.25),
            p75: at(0.75),
            p90: at(0.9),
            max: at(1.0),
        }
    }

    fn of_durations(durations: &[Duration], unit_per_second: f64, divisor: f64) -> Self {
        let values: Vec<f64> = durations.iter().map(|duration| duration.as_secs_f64() * unit_per_second / divisor).collect();
        Self::of(&values)
    }
}

/// Linear interpolation between the closest ranks; NaN (JSON `null`) for no samples.
fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else { return f64::NAN };
    let rank = quantile * last as f64;
    let lower = rank.floor() as usize;
    let upper = rank.ceil() as usize;
    match (sorted.get(lower), sorted.get(upper)) {
        (Some(low), Some(high)) => low + (high - low) * (rank - lower as f64),
        _ => f64::NAN,
    }
}

const MICROS: f64 = 1e6;
const MILLIS: f64 = 1e3;

// ---------------------------------------------------------------------------------------------
// Scenarios.
// ---------------------------------------------------------------------------------------------

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

async fn router_loop(backend: Backend, scratch: &ScratchDir, sizes: Sizes, repeats: usize) -> anyhow::Result<RouterLoopResult> {
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

async fn long_conversation(scratch: &ScratchDir, sizes: Sizes) -> anyhow::Result<LongConversationResult> {
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

async fn interrupt_round_trip(backend: Backend, scratch: &ScratchDir, sizes: Sizes, repeats: usize) -> anyhow::Result<InterruptResult> {
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

async fn state_reads(scratch: &ScratchDir, sizes: Sizes) -> anyhow::Result<StateReadsResult> {
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
async fn disk_sync(scratch: &ScratchDir, name: &str, samples: usize) -> anyhow::Result<Spread> {
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

// ---------------------------------------------------------------------------------------------
// The report.
// ---------------------------------------------------------------------------------------------

/// Every scenario's detailed results.
#[derive(Debug, Clone, Serialize)]
pub struct Scenarios {
    /// Scenario 1, per backend.
    pub router_loop: Vec<RouterLoopResult>,
    /// Scenario 2.
    pub long_conversation: LongConversationResult,
    /// Scenario 3, per backend.
    pub interrupt_round_trip: Vec<InterruptResult>,
    /// Scenario 4.
    pub state_reads: StateReadsResult,
    /// The disk's raw sync cost, for reading the durable numbers.
    pub disk_sync: DiskSyncResult,
}

/// The machine and build the numbers come from.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// When the bench ran (RFC 3339, UTC).
    pub date: String,
    /// Logical CPUs available to the process.
    pub nproc: usize,
    /// CPU model, where the OS says.
    pub cpu_model: Option<String>,
    /// Operating system and architecture.
    pub os: String,
    /// `release` or `debug` (debug numbers mean nothing).
    pub build: String,
    /// The Peregrine version.
    pub peregrine_version: String,
    /// Where the SQLite files were written.
    pub scratch_dir: String,
    /// The filesystem type of `scratch_dir`, from `/proc/mounts` (tmpfs would fake fsync).
    pub scratch_filesystem: Option<String>,
}

/// The sizes the scenarios ran with.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSettings {
    /// Timed runs per measurement (after one warm-up).
    pub repeats: usize,
    /// Whether quick mode was on.
    pub quick: bool,
    /// Capability steps per turn.
    pub plan_steps: u32,
    /// Node executions per turn here.
    pub node_steps_per_turn: u32,
    /// LangGraph supersteps for the same turn.
    pub langgraph_supersteps_per_turn: u32,
    /// Bytes appended to the message list per step.
    pub payload_bytes: usize,
    /// Turns in the long-conversation scenario.
    pub conversation_turns: usize,
}

/// One line of the comparison with LangGraph and our targets.
#[derive(Debug, Clone, Serialize)]
pub struct ComparisonRow {
    /// What was measured.
    pub measurement: String,
    /// The unit of every number in this row.
    pub unit: String,
    /// Ours, on the same basis as LangGraph's figure (per LangGraph superstep for the loop).
    pub ours: Spread,
    /// Ours per node step, for router-loop rows.
    pub ours_per_node_step: Option<Spread>,
    /// LangGraph's two runs from the reference, §2.2.
    pub langgraph: Option<[f64; 2]>,
    /// LangGraph / ours (median), low and high over LangGraph's two runs.
    pub ratio_langgraph_over_ours: Option<[f64; 2]>,
    /// Our target (p50).
    pub target: Option<f64>,
    /// Whether our median meets the target; per node step where there is one (the stricter reading).
    pub within_target: Option<bool>,
}

impl ComparisonRow {
    fn new(measurement: impl Into<String>, unit: &str, ours: Spread, langgraph: Option<[f64; 2]>, target: Option<f64>) -> Self {
        let ratio = langgraph.map(|[first, second]| [first.min(second) / ours.median, first.max(second) / ours.median]);
        let within = target.map(|target| ours.median <= target);
        Self {
            measurement: measurement.into(),
            unit: unit.into(),
            ours,
            ours_per_node_step: None,
            langgraph,
            ratio_langgraph_over_ours: ratio,
            target,
            within_target: within,
        }
    }

    fn per_node_step(mut self, per_node_step: Spread) -> Self {
        self.within_target = self.target.map(|target| per_node_step.median <= target);
        self.ours_per_node_step = Some(per_node_step);
        self
    }
}

/// Everything one `peregrine bench` run measured, with the reference figures beside it.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine and build.
    pub machine: MachineInfo,
    /// The sizes used.
    pub settings: BenchSettings,
    /// How our node steps map to LangGraph supersteps.
    pub step_mapping: String,
    /// Ours next to LangGraph and our targets.
    pub comparison: Vec<ComparisonRow>,
    /// The detailed results.
    pub scenarios: Scenarios,
    /// How to read the numbers.
    pub notes: Vec<String>,
}

fn step_mapping(sizes: Sizes) -> String {
    format!(
        "LangGraph routes with a router node, so its turn of {plan} plan steps then respond is {supersteps} supersteps \
         (router, capability, … router, respond). Our router is an edge between nodes, so the same turn is {steps} node \
         executions, each followed by one checkpoint (plus one for the turn's input). One node step here does the work of \
         a LangGraph router+capability superstep pair; 'per LangGraph superstep' = turn time / {supersteps} = half a node step.",
        plan = sizes.plan_steps,
        supersteps = sizes.langgraph_supersteps(),
        steps = sizes.node_steps(),
    )
}

fn comparison(scenarios: &Scenarios) -> Vec<ComparisonRow> {
    let mut rows = Vec::new();
    let loop_refs = [
        (langgraph::SUPERSTEP_NO_CHECKPOINTER_US, target::STEP_NO_CHECKPOINTER_US),
        (langgraph::SUPERSTEP_IN_MEMORY_SYNC_US, target::STEP_MEMORY_US),
        (langgraph::SUPERSTEP_SQLITE_SYNC_US, target::STEP_DURABLE_US),
    ];
    for (result, (reference, goal)) in scenarios.router_loop.iter().zip(loop_refs) {
        let name = format!("Router loop, per superstep-equivalent, {}", result.backend);
        let row = ComparisonRow::new(name, "µs", result.per_langgraph_superstep_us.clone(), Some(reference), Some(goal));
        rows.push(row.per_node_step(result.per_node_step_us.clone()));
    }
    let disk = &scenarios.disk_sync;
    for (when, spread) in [("before", &disk.before_us), ("after", &disk.after_us)] {
        let name = format!("Disk floor {when} the scenarios: 256-byte append + fdatasync (no SQLite)");
        rows.push(ComparisonRow::new(name, "µs", spread.clone(), None, None));
    }
    let long = &scenarios.long_conversation;
    for (which, spread) in [("first", &long.early_per_node_step_us), ("last", &long.late_per_node_step_us)] {
        let name = format!("Durable node step, {which} {} of {} turns on one thread", long.window, long.turns);
        rows.push(ComparisonRow::new(name, "µs", spread.clone(), None, Some(target::STEP_DURABLE_US)));
    }
    let control = format!("Durable node step, new thread beside the last {} turns (control)", long.window);
    rows.push(ComparisonRow::new(control, "µs", long.late_control_per_node_step_us.clone(), None, Some(target::STEP_DURABLE_US)));
    let interrupt_refs = [
        (langgraph::INTERRUPT_PAUSE_MEMORY_MS, langgraph::INTERRUPT_RESUME_MEMORY_MS, target::INTERRUPT_MEMORY_MS),
        (langgraph::INTERRUPT_PAUSE_SQLITE_MS, langgraph::INTERRUPT_RESUME_SQLITE_MS, target::INTERRUPT_SQLITE_MS),
    ];
    for (result, (pause_ref, resume_ref, goal)) in scenarios.interrupt_round_trip.iter().zip(interrupt_refs) {
        let pause = format!("Interrupt run-to-pause, {}", result.backend);
        rows.push(ComparisonRow::new(pause, "ms", result.run_to_pause_ms.clone(), Some(pause_ref), Some(goal)));
        let resume = format!("Interrupt resume-to-end, {}", result.backend);
        rows.push(ComparisonRow::new(resume, "ms", result.resume_to_end_ms.clone(), Some(resume_ref), Some(goal)));
    }
    let reads = &scenarios.state_reads;
    let get_state = format!("get_state, SQLite, thread with {} checkpoints", reads.checkpoints);
    rows.push(ComparisonRow::new(get_state, "µs", reads.get_state_us.clone(), Some(langgraph::GET_STATE_US), Some(target::GET_STATE_US)));
    let history = format!("history(limit {}), SQLite, {} returned", reads.history_limit, reads.history_returned);
    rows.push(ComparisonRow::new(history, "ms", reads.history_ms.clone(), Some(langgraph::HISTORY_MS), Some(target::HISTORY_MS)));
    rows
}

fn notes(machine: &MachineInfo) -> Vec<String> {
    let mut notes = vec![
        "LangGraph figures are copied from shared/reference/langgraph-and-serving.md §2.2 (langgraph 1.2.22, 2 vCPU, \
         median of 5-7 runs, runs 1 and 2; repeat runs there differed by up to 2.7×). They were measured on another day \
         with another harness: read the ratios as orders of magnitude."
            .to_owned(),
        "The MemoryCheckpointer row compares with InMemorySaver under durability=\"sync\" (541 / 816 µs), because our engine \
         checkpoints synchronously after every node; with durability exit / async LangGraph measured 325 / 462 and 884 / 761 µs."
            .to_owned(),
        "Targets come from shared/architecture.md (performance budget) and the reference's §8. For router-loop rows the \
         target is checked against our per-node-step median, the stricter reading."
            .to_owned(),
        "A durable step costs at least one disk sync: read the SQLite rows against the 'Disk floor' rows, measured on the \
         same filesystem at the start and the end. On a shared VM the disk's sync latency alone moves by 10× between runs."
            .to_owned(),
        "Every figure is wall time from std::time::Instant after one warm-up; medians over the repeats. Numbers on a shared \
         VM move by tens of percent between runs; they are reported, never asserted."
            .to_owned(),
    ];
    if machine.build != "release" {
        notes.push("This is a DEBUG build: its numbers mean nothing; run `cargo run --release -p peregrine-cli -- bench`.".to_owned());
    }
    if machine.scratch_filesystem.as_deref() == Some("tmpfs") {
        notes.push("The SQLite files were on tmpfs, where fsync costs nothing: the durable numbers are flattered.".to_owned());
    }
    notes
}

fn machine_info(scratch: &ScratchDir) -> MachineInfo {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|cpuinfo| {
        cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))
            .and_then(|line| line.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
    });
    MachineInfo {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        nproc: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_model,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        build: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
        peregrine_version: env!("CARGO_PKG_VERSION").to_owned(),
        scratch_dir: scratch.path.display().to_string(),
        scratch_filesystem: filesystem_of(&scratch.path),
    }
}

/// The type of the filesystem holding `path`: the longest mount point in `/proc/mounts` above it.
fn filesystem_of(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            Some((fields.next()?, fields.next()?))
        })
        .filter(|(mount_point, _)| path.starts_with(mount_point))
        .max_by_key(|(mount_point, _)| mount_point.len())
        .map(|(_, filesystem)| filesystem.to_owned())
}

/// A number with about three significant digits.
fn number(value: f64) -> String {
    match value.abs() {
        v if v.is_nan() => "–".to_owned(),
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.3}"),
    }
}

fn median_and_range(spread: &Spread) -> String {
    format!("{} ({}–{})", number(spread.median), number(spread.p10), number(spread.p90))
}

impl BenchReport {
    /// The report as Markdown: the comparison table, then the details.
    pub fn to_markdown(&self) -> String {
        let mut lines = self.markdown_header();
        lines.extend(self.comparison.iter().map(markdown_row));
        lines.extend(self.markdown_details());
        lines.extend([String::new(), "**Notes.**".to_owned(), String::new()]);
        lines.extend(self.notes.iter().map(|note| format!("- {note}")));
        lines.push(String::new());
        lines.join("\n")
    }

    fn markdown_header(&self) -> Vec<String> {
        let machine = &self.machine;
        let settings = &self.settings;
        vec![
            "# Peregrine graph engine benchmark".to_owned(),
            String::new(),
            format!(
                "{} · {} CPUs ({}) · {} · {} build · peregrine {}",
                machine.date,
                machine.nproc,
                machine.cpu_model.as_deref().unwrap_or("unknown CPU"),
                machine.os,
                machine.build,
                machine.peregrine_version
            ),
            format!(
                "SQLite scratch: `{}` ({}) · {} repeats after one warm-up{} · {} plan steps of {} bytes per turn",
                machine.scratch_dir,
                machine.scratch_filesystem.as_deref().unwrap_or("filesystem unknown"),
                settings.repeats,
                if settings.quick { " (quick mode)" } else { "" },
                settings.plan_steps,
                settings.payload_bytes
            ),
            String::new(),
            format!("**Step mapping.** {}", self.step_mapping),
            String::new(),
            "| Measurement | Unit | Ours: median (p10–p90) | Ours per node step | LangGraph run 1 / run 2 | LangGraph ÷ ours | Target | Within |"
                .to_owned(),
            "|---|---|---|---|---|---|---|---|".to_owned(),
        ]
    }

    fn markdown_details(&self) -> Vec<String> {
        let long = &self.scenarios.long_conversation;
        let mut lines = vec![
            String::new(),
            format!(
                "**Conversation length.** {} turns of {} node steps on one thread ({} checkpoints; {} messages, {} KiB of state at \
                 the end): per node step {} µs over the first {} turns, {} µs over the last {}; late ÷ early = **{}** (about 1 means \
                 a step costs the same however long the conversation).",
                long.turns,
                long.node_steps_per_turn,
                long.checkpoints,
                long.messages,
                long.state_bytes / 1024,
                median_and_range(&long.early_per_node_step_us),
                long.window,
                median_and_range(&long.late_per_node_step_us),
                long.window,
                number(long.late_over_early)
            ),
            String::new(),
            format!(
                "Part of each turn is loading the thread's state, which grows with the conversation: a `get_state` before each \
                 turn took {} µs early and {} µs late. Without one such load per turn, a node step costs {} µs early and {} µs \
                 late (late ÷ early = {}). A turn on a brand-new thread run just before each of the last {} turns (same disk, \
                 same moment) cost {} µs per node step: last turns ÷ this control = **{}**.",
                median_and_range(&long.early_state_load_us),
                median_and_range(&long.late_state_load_us),
                median_and_range(&long.early_per_node_step_excluding_load_us),
                median_and_range(&long.late_per_node_step_excluding_load_us),
                number(long.late_over_early_excluding_load),
                long.window,
                median_and_range(&long.late_control_per_node_step_us),
                number(long.late_over_control)
            ),
            String::new(),
            "**Router loop, whole turn (ms).**".to_owned(),
            String::new(),
        ];
        for result in &self.scenarios.router_loop {
            let turn = &result.per_turn_ms;
            lines.push(format!(
                "- {}: median {} ms, min {}, p10 {}, p90 {}, max {} ({} node steps, {} checkpoints per turn)",
                result.backend,
                number(turn.median),
                number(turn.min),
                number(turn.p10),
                number(turn.p90),
                number(turn.max),
                result.node_steps,
                result.checkpoints_per_turn
            ));
        }
        lines
    }
}

fn markdown_row(row: &ComparisonRow) -> String {
    let none = || "–".to_owned();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |",
        row.measurement,
        row.unit,
        median_and_range(&row.ours),
        row.ours_per_node_step.as_ref().map_or_else(none, median_and_range),
        row.langgraph.map_or_else(none, |[first, second]| format!("{} / {}", number(first), number(second))),
        row.ratio_langgraph_over_ours.map_or_else(none, |[low, high]| format!("{}–{}×", number(low), number(high))),
        row.target.map_or_else(none, |target| format!("≤ {}", number(target))),
        row.within_target.map_or("–", |within| if within { "yes" } else { "no" }),
    )
}

// ---------------------------------------------------------------------------------------------
// Entry point.
// ---------------------------------------------------------------------------------------------

/// A directory for the bench's SQLite files beside the output, removed when dropped. It sits
/// beside the results rather than in the system temp dir, which may be tmpfs (free fsync).
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn beside(out: &Path) -> anyhow::Result<Self> {
        let parent = out.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let path = parent.join(format!(".peregrine-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating the bench scratch directory {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover scratch directory is harmless and named for the process.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn with_extension_appended(out: &Path, extension: &str) -> PathBuf {
    let mut path = OsString::from(out.as_os_str());
    path.push(".");
    path.push(extension);
    PathBuf::from(path)
}

/// Runs every scenario, writes `<out>.json` and `<out>.md`, prints the Markdown and returns the report.
pub async fn run(options: &BenchOptions) -> anyhow::Result<BenchReport> {
    let repeats = options.effective_repeats();
    let sizes = if options.quick { Sizes::quick(repeats) } else { Sizes::full(repeats) };
    run_with(options, repeats, sizes).await
}

async fn run_with(options: &BenchOptions, repeats: usize, sizes: Sizes) -> anyhow::Result<BenchReport> {
    let scratch = ScratchDir::beside(&options.out)?;
    let machine = machine_info(&scratch);
    eprintln!("bench: raw disk sync (append + fdatasync)");
    let disk_sync_before = disk_sync(&scratch, "disk-sync-before", sizes.disk_syncs).await?;
    let mut router_loops = Vec::new();
    for backend in [Backend::None, Backend::Memory, Backend::Sqlite] {
        router_loops.push(router_loop(backend, &scratch, sizes, repeats).await?);
    }
    let long_conversation = long_conversation(&scratch, sizes).await?;
    let mut interrupts = Vec::new();
    for backend in [Backend::Memory, Backend::Sqlite] {
        interrupts.push(interrupt_round_trip(backend, &scratch, sizes, repeats).await?);
    }
    let state_reads = state_reads(&scratch, sizes).await?;
    let disk_sync = DiskSyncResult {
        probe: "append 256 bytes to a file and fdatasync it, on the scratch filesystem".to_owned(),
        before_us: disk_sync_before,
        after_us: disk_sync(&scratch, "disk-sync-after", sizes.disk_syncs).await?,
    };
    let scenarios = Scenarios { router_loop: router_loops, long_conversation, interrupt_round_trip: interrupts, state_reads, disk_sync };
    let report = BenchReport {
        settings: BenchSettings {
            repeats,
            quick: options.quick,
            plan_steps: sizes.plan_steps,
            node_steps_per_turn: sizes.node_steps(),
            langgraph_supersteps_per_turn: sizes.langgraph_supersteps(),
            payload_bytes: PAYLOAD_BYTES,
            conversation_turns: sizes.turns,
        },
        step_mapping: step_mapping(sizes),
        comparison: comparison(&scenarios),
        notes: notes(&machine),
        machine,
        scenarios,
    };
    write_report(&options.out, &report)?;
    Ok(report)
}

fn write_report(out: &Path, report: &BenchReport) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let json_path = with_extension_appended(out, "json");
    let json = serde_json::to_string_pretty(report).context("serializing the bench report")?;
    std::fs::write(&json_path, json + "\n").with_context(|| format!("writing {}", json_path.display()))?;
    let markdown = report.to_markdown();
    let markdown_path = with_extension_appended(out, "md");
    std::fs::write(&markdown_path, &markdown).with_context(|| format!("writing {}", markdown_path.display()))?;
    println!("{markdown}");
    eprintln!("bench: wrote {} and {}", json_path.display(), markdown_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Sizes {
        Sizes { plan_steps: 3, turns: 3, window: 1, history_turns: 2, state_reads: 2, disk_syncs: 2 }
    }

    #[tokio::test]
    async fn quick_bench_writes_every_scenario_as_json_and_markdown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = BenchOptions { out: dir.path().join("results/graph"), repeats: 1, quick: true };
        let report = run_with(&options, 1, tiny()).await.expect("bench runs");

        let json = std::fs::read_to_string(dir.path().join("results/graph.json")).expect("json written");
        let value: serde_json::Value = serde_json::from_str(&json).expect("json parses");
        let scenarios = &value["scenarios"];
        assert_eq!(scenarios["router_loop"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["interrupt_round_trip"].as_array().map(Vec::len), Some(2));
        assert_eq!(scenarios["long_conversation"]["per_node_step_us_by_turn"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["long_conversation"]["state_load_us_by_turn"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["long_conversation"]["checkpoints"], json!(3 * 5));
        assert_eq!(scenarios["state_reads"]["checkpoints"], json!(2 * 5));
        assert!(value["machine"]["nproc"].as_u64().is_some_and(|nproc| nproc >= 1));
        assert_eq!(value["comparison"].as_array().map(Vec::len), Some(report.comparison.len()));
        assert_eq!(report.comparison.len(), 3 + 2 + 3 + 4 + 2);
        assert_eq!(scenarios["long_conversation"]["late_control_per_node_step_us"]["samples"], json!(1));
        assert_eq!(scenarios["disk_sync"]["after_us"]["samples"], json!(2));

        let markdown = std::fs::read_to_string(dir.path().join("results/graph.md")).expect("markdown written");
        assert!(markdown.contains("| Measurement |"));
        assert!(markdown.contains("Interrupt resume-to-end"));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("results")).expect("results dir").collect();
        assert_eq!(leftovers.len(), 2, "only the two report files remain");
    }

    #[test]
    fn router_runs_the_plan_then_approval_then_respond() {
        let cases = [
            (BenchState { step: 0, plan_steps: 2, ..BenchState::default() }, CAPABILITY),
            (BenchState { step: 2, plan_steps: 2, ..BenchState::default() }, RESPOND),
            (BenchState { step: 1, plan_steps: 1, needs_approval: true, ..BenchState::default() }, APPROVE),
            (BenchState { step: 1, plan_steps: 1, needs_approval: true, approved: true, ..BenchState::default() }, RESPOND),
        ];
        for (state, node) in cases {
            assert_eq!(route(&state), Route::to(node), "{state:?}");
        }
    }

    #[test]
    fn payloads_are_exactly_the_configured_size() {
        assert_eq!(payload("result", 7).len(), PAYLOAD_BYTES);
        assert_eq!(payload("user", 0).len(), PAYLOAD_BYTES);
    }

    #[test]
    fn spread_interpolates_percentiles() {
        let spread = Spread::of(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((spread.min, spread.median, spread.max, spread.samples), (1.0, 3.0, 5.0, 5));
        assert!((spread.p10 - 1.4).abs() < 1e-9);
        assert!(Spread::of(&[]).median.is_nan());
    }

    #[test]
    fn outputs_append_extensions() {
        assert_eq!(with_extension_appended(Path::new("out/graph.v2"), "json"), PathBuf::from("out/graph.v2.json"));
    }
}

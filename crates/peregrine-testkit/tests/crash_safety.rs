//! Crash safety through the real `crash_probe` binary on a SQLite file: SIGKILL a 60-node run at
//! seeded random points (sometimes its continuation too), continue it in a new process, and check
//! that no checkpointed node ever runs again, that at most the one node in flight at each kill
//! repeats its side effect, and that the checkpoint history is one unbroken chain.
//!
//! Set `PEREGRINE_CRASH_SEED` to try another seed; a failure names the seed and the iteration.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_core::GraphState;
use peregrine_graph::{CheckpointSource, Graph, ListQuery, NodeContext, NodeOutput, NodeResult, Route};
use serde::{Deserialize, Serialize};

const PROBE: &str = env!("CARGO_BIN_EXE_crash_probe");
const DEFAULT_SEED: u64 = 0x5EED_0C4A_5E11;
const ITERATIONS: usize = 25;
const CHAIN_LEN: usize = 60;
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Hard cap on polls while waiting for the side-effect log to grow (30 s).
const MAX_POLLS: u32 = 15_000;
/// Upper bound of the random pause between seeing the awaited log line and the kill; it spreads
/// the kills over node bodies and checkpoint writes.
const MAX_KILL_JITTER_MICROS: u64 = 3_000;
const THREAD: &str = "crash";

/// What the rng picked for one iteration; drawn up front so the picks depend only on the seed.
#[derive(Debug, Clone, Copy)]
struct KillPlan {
    /// Kill the first run once this many side effects are logged (1..CHAIN_LEN).
    first_kill_after: usize,
    /// Pause before the first kill.
    first_jitter: Duration,
    /// Whether the first continuation is killed too.
    kill_continuation: bool,
    /// Raw pick for how many more side effects the continuation logs before its kill.
    second_kill_pick: usize,
    /// Pause before the second kill.
    second_jitter: Duration,
}

impl KillPlan {
    fn draw(rng: &mut fastrand::Rng) -> Self {
        Self {
            first_kill_after: rng.usize(1..CHAIN_LEN),
            first_jitter: Duration::from_micros(rng.u64(0..=MAX_KILL_JITTER_MICROS)),
            kill_continuation: rng.u8(0..3) == 0,
            second_kill_pick: rng.usize(0..CHAIN_LEN),
            second_jitter: Duration::from_micros(rng.u64(0..=MAX_KILL_JITTER_MICROS)),
        }
    }
}

/// The part of the probe's state this test reads.
#[derive(Debug, Deserialize)]
struct ProbeState {
    visited: Vec<String>,
    steps: u64,
}

/// What `crash_probe state` prints for a known thread.
#[derive(Debug, Deserialize)]
struct StateReport {
    state: ProbeState,
    next: Option<String>,
}

/// What `crash_probe run|continue` prints.
#[derive(Debug, Deserialize)]
struct OutcomeReport {
    status: String,
    state: ProbeState,
}

/// One kill as observed after the killed process was reaped.
#[derive(Debug, Clone, Copy)]
struct Kill {
    /// Side-effect log lines at the kill.
    log_lines: usize,
    /// Nodes checkpointed at the kill.
    checkpointed: usize,
}

fn chain_node_name(index: usize) -> String {
    format!("n{index:02}")
}

fn chain() -> Vec<String> {
    (0..CHAIN_LEN).map(chain_node_name).collect()
}

/// One iteration's files: the SQLite database and the side-effect log, in a fresh temp dir.
struct Scenario {
    _dir: tempfile::TempDir,
    db: PathBuf,
    side_log: PathBuf,
}

impl Scenario {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("checkpoints.sqlite");
        let side_log = dir.path().join("side-effects.log");
        Ok(Self { _dir: dir, db, side_log })
    }

    fn spawn(&self, command: &str) -> anyhow::Result<Child> {
        Command::new(PROBE)
            .args([command, path_arg(&self.db)?, THREAD, path_arg(&self.side_log)?])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {PROBE} {command}"))
    }

    /// The side-effect log as node names, read when no probe runs; every line must be complete.
    fn log(&self) -> anyhow::Result<Vec<String>> {
        let text = match std::fs::read_to_string(&self.side_log) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error).context("reading the side-effect log"),
        };
        ensure!(text.is_empty() || text.ends_with('\n'), "the side-effect log ends with a partial line: {text:?}");
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// Complete lines in the log while a probe may be writing it.
    fn logged_so_far(&self) -> anyhow::Result<usize> {
        match std::fs::read(&self.side_log) {
            Ok(bytes) => Ok(bytes.iter().filter(|byte| **byte == b'\n').count()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(error).context("reading the side-effect log"),
        }
    }

    /// Waits until the log has `lines` lines or the child exits, then kills and reaps the child.
    fn kill_after(&self, mut child: Child, lines: usize, jitter: Duration) -> anyhow::Result<Kill> {
        let mut polls = 0;
        loop {
            if self.logged_so_far()? >= lines {
                break;
            }
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("the probe failed before logging {lines} side effects: {}", describe(&child.wait_with_output()?));
                }
                break;
            }
            polls += 1;
            ensure!(polls < MAX_POLLS, "the side-effect log did not reach {lines} lines within {MAX_POLLS} polls");
            std::thread::sleep(POLL_INTERVAL);
        }
        // Not synchronisation: a random pause that moves the kill point off the poll's beat.
        std::thread::sleep(jitter);
        // `kill` sends SIGKILL on Unix (and is a no-op for a child that already exited).
        child.kill()?;
        child.wait()?;
        let checkpointed = self.checkpointed_nodes()?;
        Ok(Kill { log_lines: self.log()?.len(), checkpointed })
    }

    /// The chain nodes checkpointed so far; checks they are a prefix of the chain.
    fn checkpointed_nodes(&self) -> anyhow::Result<usize> {
        let report = self.state()?;
        let chain = chain();
        let visited = &report.state.visited;
        ensure!(chain.starts_with(visited), "checkpointed nodes are not a prefix of the chain: {visited:?}");
        ensure!(report.state.steps == visited.len() as u64, "{} updates applied for {} visits", report.state.steps, visited.len());
        Ok(visited.len())
    }

    fn state(&self) -> anyhow::Result<StateReport> {
        let output = Command::new(PROBE).args(["state", path_arg(&self.db)?, THREAD]).output()?;
        ensure!(output.status.success(), "crash_probe state failed: {}", describe(&output));
        serde_json::from_slice::<Option<StateReport>>(&output.stdout)?.context("the thread has no checkpoint after its first side effect")
    }

    fn continue_to_end(&self) -> anyhow::Result<OutcomeReport> {
        let output = self.spawn("continue")?.wait_with_output()?;
        ensure!(output.status.success(), "crash_probe continue failed: {}", describe(&output));
        Ok(serde_json::from_slice(&output.stdout)?)
    }
}

fn path_arg(path: &Path) -> anyhow::Result<&str> {
    path.to_str().with_context(|| format!("temp path {} is not UTF-8", path.display()))
}

fn describe(output: &Output) -> String {
    format!("{} stdout={} stderr={}", output.status, String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Checks the side-effect log against the kills: each process logged the chain from the first
/// node not checkpointed before it started up to its kill, and at each kill at most the node in
/// flight (the one after the last checkpointed node) had logged without being checkpointed.
/// Returns the nodes whose side effect happened twice.
fn check_log(log: &[String], kills: &[Kill]) -> anyhow::Result<Vec<String>> {
    let chain = chain();
    let mut duplicated = Vec::new();
    let (mut logged, mut checkpointed) = (0, 0);
    for (index, kill) in kills.iter().enumerate() {
        let segment = &log[logged..kill.log_lines];
        let reached = checkpointed + segment.len();
        ensure!(
            reached <= CHAIN_LEN && segment == &chain[checkpointed..reached],
            "process {index} logged {segment:?}, expected the chain from node {checkpointed}"
        );
        ensure!(
            kill.checkpointed == reached || kill.checkpointed + 1 == reached,
            "kill {index}: {reached} nodes had run their side effect but {} were checkpointed",
            kill.checkpointed
        );
        if kill.checkpointed + 1 == reached {
            // The node in flight: its side effect happened, its checkpoint was not written.
            duplicated.push(chain[kill.checkpointed].clone());
        }
        (logged, checkpointed) = (kill.log_lines, kill.checkpointed);
    }
    ensure!(
        log[logged..] == chain[checkpointed..],
        "the final process logged {:?}, expected the chain from node {checkpointed}",
        &log[logged..]
    );
    Ok(duplicated)
}

/// A state with no content: `Graph::history` reads checkpoint metadata only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct MetadataOnly;

impl GraphState for MetadataOnly {
    type Update = ();
    type Event = ();
    fn apply(&mut self, (): ()) {}
}

struct Unused;

impl peregrine_graph::Node<MetadataOnly> for Unused {
    async fn run(&self, _state: Arc<MetadataOnly>, _ctx: &NodeContext<MetadataOnly>) -> NodeResult<()> {
        Ok(NodeOutput::Update(()))
    }
}

/// Reads the thread's history in this process and checks it is the input checkpoint followed by
/// one checkpoint per chain node, in order, each the child of the previous, all in one run.
fn check_history(db: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut history = runtime.block_on(async {
        let checkpointer = SqliteCheckpointer::open(db).await?;
        let graph = Graph::<MetadataOnly>::builder().node("unused", Unused).router(|_| Route::End).checkpointer(checkpointer).build()?;
        anyhow::Ok(graph.history(THREAD, ListQuery::default()).await?)
    })?;
    history.reverse();
    let Some((input, steps)) = history.split_first() else { bail!("the thread has no checkpoints") };
    ensure!(input.source == CheckpointSource::Input && input.parent_id.is_none(), "the first checkpoint is not the run's input: {input:?}");
    let nodes: Vec<Option<String>> = steps.iter().map(|meta| meta.node.clone()).collect();
    let expected: Vec<Option<String>> = chain().into_iter().map(Some).collect();
    ensure!(nodes == expected, "checkpointed nodes are not the chain, once each, in order: {nodes:?}");
    for (step, pair) in history.windows(2).enumerate() {
        let [parent, child] = pair else { unreachable!("windows(2) yields pairs") };
        ensure!(child.source == CheckpointSource::Loop, "checkpoint {} is not a node's: {:?}", child.checkpoint_id, child.source);
        ensure!(
            child.parent_id == Some(parent.checkpoint_id),
            "checkpoint {} does not follow {}",
            child.checkpoint_id,
            parent.checkpoint_id
        );
        ensure!(
            child.run_step as usize == step + 1,
            "checkpoint {} has run step {}, expected {}",
            child.checkpoint_id,
            child.run_step,
            step + 1
        );
        ensure!(child.run_id == input.run_id, "checkpoint {} belongs to another run", child.checkpoint_id);
    }
    Ok(())
}

/// Tallies over all iterations, printed at the end.
#[derive(Debug, Default)]
struct Tally {
    kills: usize,
    kills_with_node_in_flight: usize,
    continuations_killed: usize,
}

fn crash_and_recover(plan: KillPlan, tally: &mut Tally) -> anyhow::Result<()> {
    let scenario = Scenario::new()?;
    let mut kills = vec![scenario.kill_after(scenario.spawn("run")?, plan.first_kill_after, plan.first_jitter)?];
    let first = kills[0];
    if plan.kill_continuation && first.checkpointed < CHAIN_LEN {
        let further = 1 + plan.second_kill_pick % (CHAIN_LEN - first.checkpointed);
        kills.push(scenario.kill_after(scenario.spawn("continue")?, first.log_lines + further, plan.second_jitter)?);
        tally.continuations_killed += 1;
    }
    let outcome = scenario.continue_to_end()?;
    ensure!(outcome.status == "completed", "the continued run ended {}", outcome.status);
    ensure!(outcome.state.visited == chain(), "the continued run visited {:?}", outcome.state.visited);

    let report = scenario.state()?;
    ensure!(report.state.visited == chain(), "the final state visited {:?}", report.state.visited);
    ensure!(report.state.steps == CHAIN_LEN as u64, "{} updates applied for {CHAIN_LEN} nodes", report.state.steps);
    ensure!(report.next.is_none(), "the finished run still has a next node: {:?}", report.next);

    let log = scenario.log()?;
    let duplicated = check_log(&log, &kills).with_context(|| format!("side-effect log {log:?}, kills {kills:?}"))?;
    for (index, node) in chain().iter().enumerate() {
        let runs = log.iter().filter(|line| *line == node).count();
        let expected = 1 + duplicated.iter().filter(|repeated| *repeated == node).count();
        ensure!(runs == expected, "node {node} ran its side effect {runs} times, expected {expected}: {log:?}");
        ensure!(index >= first.checkpointed || runs == 1, "node {node} was checkpointed before the first kill but ran {runs} times");
    }
    check_history(&scenario.db)?;

    let summary: Vec<String> = kills.iter().map(|kill| format!("{} logged/{} checkpointed", kill.log_lines, kill.checkpointed)).collect();
    println!("kills at {}; repeated side effects {duplicated:?}", summary.join(", "));
    tally.kills += kills.len();
    tally.kills_with_node_in_flight += duplicated.len();
    Ok(())
}

#[test]
fn killed_runs_continue_without_repeating_checkpointed_nodes() -> anyhow::Result<()> {
    let seed = match std::env::var("PEREGRINE_CRASH_SEED") {
        Ok(seed) => seed.parse().with_context(|| format!("PEREGRINE_CRASH_SEED={seed} is not a u64"))?,
        Err(_) => DEFAULT_SEED,
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    let mut tally = Tally::default();
    for iteration in 0..ITERATIONS {
        let plan = KillPlan::draw(&mut rng);
        crash_and_recover(plan, &mut tally).with_context(|| format!("iteration {iteration} of seed {seed} ({plan:?})"))?;
    }
    println!("{ITERATIONS} iterations, seed {seed}, {tally:?}, {:.1?}", started.elapsed());
    Ok(())
}

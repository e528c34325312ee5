//! `crash_probe`: a child process the crash-safety and cross-process interrupt tests start, kill
//! and restart. It runs graphs on a SQLite checkpoint file:
//!
//! - a chain of 60 nodes `n00..n59`; each appends `"<node>\n"` to a side-effect log (and syncs
//!   it) before returning its update, so a test can count how often every node really ran;
//! - an approval graph whose node `approve` pauses with an interrupt and, once answered, records
//!   the decision in the state.
//!
//! ```text
//! crash_probe run <db> <thread> <sidelog>        start a chain run; print the outcome
//! crash_probe continue <db> <thread> <sidelog>   continue the chain run after a crash
//! crash_probe state <db> <thread>                print the newest state (`null`: unknown thread)
//! crash_probe ask <db> <thread>                  start an approval; print the pending interrupt
//! crash_probe answer <db> <thread> <interrupt_id> <digest> <answer-json>
//! ```
//!
//! Outcomes and states go to stdout as one JSON line; errors (refused answers included) go to
//! stderr with exit code 1.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_core::GraphState;
use peregrine_graph::{
    CheckpointId, Graph, Node, NodeContext, NodeError, NodeOutput, NodeResult, PendingInterrupt, Resume, Route, RunError, RunOptions,
    RunOutcome,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Nodes in the chain.
const CHAIN_LEN: usize = 60;
/// The approval graph's only node.
const APPROVE: &str = "approve";
/// Yields inside every chain node, before and after its side effect, so that a kill can land
/// inside a node as well as between nodes.
const YIELDS_PER_HALF: usize = 3;

/// Which graph a thread runs; set by the input of `run` or `ask`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ThreadKind {
    /// Nothing started yet.
    #[default]
    Unset,
    /// The 60-node chain.
    Chain,
    /// The approval graph.
    Approval,
}

/// An answered approval as recorded by `approve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Decision {
    /// The interrupt that was answered.
    interrupt_id: String,
    /// Whether the person approved.
    approved: bool,
    /// The action asked about.
    action: Value,
}

/// The probe's state: what the chain visited and what the approval graph decided.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ProbeState {
    kind: ThreadKind,
    /// Chain nodes whose update was applied, in order.
    visited: Vec<String>,
    /// Chain updates applied (equals `visited.len()` unless an update is applied twice).
    steps: u64,
    /// Approvals asked for by `ask`.
    requests: u32,
    /// Answered approvals, in order.
    decisions: Vec<Decision>,
}

/// One node's (or one input's) change to [`ProbeState`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ProbeUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<ThreadKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    visit: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    request: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decision: Option<Decision>,
}

impl GraphState for ProbeState {
    type Update = ProbeUpdate;
    type Event = ();

    fn apply(&mut self, update: ProbeUpdate) {
        if let Some(kind) = update.kind {
            self.kind = kind;
        }
        if let Some(node) = update.visit {
            self.visited.push(node);
            self.steps += 1;
        }
        if update.request {
            self.requests += 1;
        }
        if let Some(decision) = update.decision {
            self.decisions.push(decision);
        }
    }
}

fn chain_node_name(index: usize) -> String {
    format!("n{index:02}")
}

/// The router: a pure function of the state.
fn route(state: &ProbeState) -> Route {
    match state.kind {
        ThreadKind::Chain => (0..CHAIN_LEN).map(chain_node_name).find(|name| !state.visited.contains(name)).map_or(Route::End, Route::Node),
        ThreadKind::Approval if state.decisions.len() < state.requests as usize => Route::to(APPROVE),
        ThreadKind::Approval | ThreadKind::Unset => Route::End,
    }
}

/// A chain node: writes its name to the side-effect log, then returns its visit.
struct ChainNode {
    name: String,
    side_log: Option<Arc<Path>>,
}

impl ChainNode {
    fn record_side_effect(&self) -> Result<(), NodeError> {
        let Some(side_log) = &self.side_log else {
            return Err(NodeError::fatal(format!(
                "chain node '{}' needs a side-effect log; start chains with `run` or `continue`",
                self.name
            )));
        };
        let write = || -> std::io::Result<()> {
            let mut file = OpenOptions::new().create(true).append(true).open(side_log)?;
            file.write_all(format!("{}\n", self.name).as_bytes())?;
            file.sync_data()
        };
        write().map_err(|error| NodeError::fatal(format!("node '{}' could not append to {}: {error}", self.name, side_log.display())))
    }
}

impl Node<ProbeState> for ChainNode {
    async fn run(&self, _state: Arc<ProbeState>, _ctx: &NodeContext<ProbeState>) -> NodeResult<ProbeUpdate> {
        for _ in 0..YIELDS_PER_HALF {
            tokio::task::yield_now().await;
        }
        self.record_side_effect()?;
        for _ in 0..YIELDS_PER_HALF {
            tokio::task::yield_now().await;
        }
        Ok(NodeOutput::Update(ProbeUpdate { visit: Some(self.name.clone()), ..ProbeUpdate::default() }))
    }
}

/// Asks to approve a write the first time; records the answer when run again after it.
struct ApproveNode;

impl Node<ProbeState> for ApproveNode {
    async fn run(&self, _state: Arc<ProbeState>, ctx: &NodeContext<ProbeState>) -> NodeResult<ProbeUpdate> {
        let Some(answered) = ctx.resume() else {
            let payload = json!({"action": "write", "pv": "SR:X", "value": 5});
            return Ok(NodeOutput::Interrupt { payload, update: ProbeUpdate::default() });
        };
        let approved = answered.answer.get("approved").and_then(Value::as_bool).unwrap_or(false);
        let decision = Decision { interrupt_id: answered.interrupt_id.clone(), approved, action: answered.payload.clone() };
        Ok(NodeOutput::Update(ProbeUpdate { decision: Some(decision), ..ProbeUpdate::default() }))
    }
}

async fn open_graph(db: &Path, side_log: Option<&Path>) -> anyhow::Result<Graph<ProbeState>> {
    let checkpointer =
        SqliteCheckpointer::open(db).await.with_context(|| format!("could not open the checkpoint database {}", db.display()))?;
    let side_log: Option<Arc<Path>> = side_log.map(Arc::from);
    let mut builder = Graph::builder().node(APPROVE, ApproveNode).router(route).checkpointer(checkpointer);
    for name in (0..CHAIN_LEN).map(chain_node_name) {
        builder = builder.node(name.clone(), ChainNode { name, side_log: side_log.clone() });
    }
    Ok(builder.build()?)
}

/// How a run ended, as printed on stdout.
#[derive(Serialize)]
struct OutcomeReport<'a> {
    status: &'static str,
    state: &'a ProbeState,
    checkpoint_id: Option<CheckpointId>,
    interrupt: Option<&'a PendingInterrupt>,
}

impl<'a> OutcomeReport<'a> {
    fn of(outcome: &'a RunOutcome<ProbeState>) -> Self {
        match outcome {
            RunOutcome::Completed { state, checkpoint_id, .. } => {
                Self { status: "completed", state, checkpoint_id: *checkpoint_id, interrupt: None }
            }
            RunOutcome::Interrupted { state, interrupt, checkpoint_id } => {
                Self { status: "interrupted", state, checkpoint_id: Some(*checkpoint_id), interrupt: Some(interrupt) }
            }
            RunOutcome::Cancelled { state, checkpoint_id } => {
                Self { status: "cancelled", state, checkpoint_id: *checkpoint_id, interrupt: None }
            }
        }
    }
}

/// A thread's newest state, as printed on stdout.
#[derive(Serialize)]
struct StateReport<'a> {
    state: &'a ProbeState,
    checkpoint_id: CheckpointId,
    next: Option<&'a str>,
    interrupt: Option<&'a PendingInterrupt>,
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// A parsed command line.
enum Command {
    Run { db: PathBuf, thread: String, side_log: PathBuf },
    Continue { db: PathBuf, thread: String, side_log: PathBuf },
    State { db: PathBuf, thread: String },
    Ask { db: PathBuf, thread: String },
    Answer { db: PathBuf, thread: String, resume: Box<Resume<ProbeUpdate>> },
}

const USAGE: &str = "usage: crash_probe run|continue <db> <thread> <sidelog> | state|ask <db> <thread> | answer <db> <thread> <interrupt_id> <digest> <answer-json>";

fn parse(args: &[String]) -> anyhow::Result<Command> {
    let command = match args {
        [command, db, thread, side_log] if command == "run" => {
            Command::Run { db: db.into(), thread: thread.clone(), side_log: side_log.into() }
        }
        [command, db, thread, side_log] if command == "continue" => {
            Command::Continue { db: db.into(), thread: thread.clone(), side_log: side_log.into() }
        }
        [command, db, thread] if command == "state" => Command::State { db: db.into(), thread: thread.clone() },
        [command, db, thread] if command == "ask" => Command::Ask { db: db.into(), thread: thread.clone() },
        [command, db, thread, interrupt_id, digest, answer] if command == "answer" => {
            let answer: Value = serde_json::from_str(answer).with_context(|| format!("the answer {answer:?} is not JSON"))?;
            let resume = Resume { interrupt_id: interrupt_id.clone(), payload_digest: digest.clone(), answer, update: None };
            Command::Answer { db: db.into(), thread: thread.clone(), resume: Box::new(resume) }
        }
        _ => bail!("{USAGE}"),
    };
    Ok(command)
}

async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { db, thread, side_log } => {
            let graph = open_graph(&db, Some(&side_log)).await?;
            let input = ProbeUpdate { kind: Some(ThreadKind::Chain), ..ProbeUpdate::default() };
            let outcome =
                graph.run(&thread, input, RunOptions::default()).await.with_context(|| format!("chain run on '{thread}' failed"))?;
            print_json(&OutcomeReport::of(&outcome))
        }
        Command::Continue { db, thread, side_log } => {
            let graph = open_graph(&db, Some(&side_log)).await?;
            let outcome =
                graph.continue_run(&thread, RunOptions::default()).await.with_context(|| format!("continuing '{thread}' failed"))?;
            print_json(&OutcomeReport::of(&outcome))
        }
        Command::State { db, thread } => {
            let graph = open_graph(&db, None).await?;
            match graph.get_state(&thread).await? {
                Some(snapshot) => print_json(&StateReport {
                    state: &snapshot.state,
                    checkpoint_id: snapshot.meta.checkpoint_id,
                    next: snapshot.next.as_deref(),
                    interrupt: snapshot.meta.interrupt.as_ref(),
                }),
                None => print_json(&Value::Null),
            }
        }
        Command::Ask { db, thread } => {
            let graph = open_graph(&db, None).await?;
            let input = ProbeUpdate { kind: Some(ThreadKind::Approval), request: true, ..ProbeUpdate::default() };
            let outcome = graph.run(&thread, input, RunOptions::default()).await.with_context(|| format!("asking on '{thread}' failed"))?;
            print_json(&OutcomeReport::of(&outcome))
        }
        Command::Answer { db, thread, resume } => {
            let graph = open_graph(&db, None).await?;
            let interrupt_id = resume.interrupt_id.clone();
            let outcome = match graph.resume(&thread, *resume, RunOptions::default()).await {
                Ok(outcome) => outcome,
                // Refusals happen before anything is written.
                Err(
                    refused @ (RunError::StaleResume { .. }
                    | RunError::ForgedResume { .. }
                    | RunError::NothingToResume { .. }
                    | RunError::NotFound { .. }),
                ) => bail!("answer refused, thread '{thread}' is unchanged: {refused}"),
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!("answering interrupt {interrupt_id} on '{thread}' failed")));
                }
            };
            print_json(&OutcomeReport::of(&outcome))
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(|command| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("could not start the async runtime")?;
        runtime.block_on(execute(command))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("crash_probe: {error:#}");
            ExitCode::FAILURE
        }
    }
}

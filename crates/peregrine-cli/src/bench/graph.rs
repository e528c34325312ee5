//! The benchmark graph: a router loop over a list-reducer state, plus an approval interrupt;
//! the checkpoint backends it runs on, and one timed turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use peregrine_checkpoint::{MemoryCheckpointer, SqliteCheckpointer};
use peregrine_core::{GraphState, Slot};
use peregrine_graph::{
    DynCheckpointer, Graph, GraphLimits, NodeError, NodeInfo, NodeOutput, NodeResult, Route, RunOptions, RunOutcome, node_fn,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ScratchDir, Sizes};

pub(super) const PAYLOAD_BYTES: usize = 200;
const CAPABILITY: &str = "capability";
const APPROVE: &str = "approve";
const RESPOND: &str = "respond";

/// The bench state: a growing message list (LangGraph's list reducer) and the plan cursor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct BenchState {
    pub(super) messages: Vec<String>,
    step: u32,
    plan_steps: u32,
    needs_approval: bool,
    pub(super) approved: bool,
}

/// A bench node's update: messages to append and cursor fields to set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct BenchUpdate {
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
    pub(super) fn turn(plan_steps: u32, needs_approval: bool) -> Self {
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

pub(super) fn bench_graph(checkpointer: Option<Arc<dyn DynCheckpointer>>, sizes: Sizes) -> anyhow::Result<Graph<BenchState>> {
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
pub(super) enum Backend {
    None,
    Memory,
    Sqlite,
}

impl Backend {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::None => "no checkpointer",
            Self::Memory => "MemoryCheckpointer",
            Self::Sqlite => "SqliteCheckpointer (file, WAL, synchronous=FULL)",
        }
    }

    /// Opens the backend; SQLite gets its own fresh file in the scratch directory.
    pub(super) async fn open(self, scratch: &ScratchDir, file: &str) -> anyhow::Result<Option<Arc<dyn DynCheckpointer>>> {
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
pub(super) async fn timed_turn(graph: &Graph<BenchState>, thread: &str, sizes: Sizes) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let outcome = graph.run(thread, BenchUpdate::turn(sizes.plan_steps, false), RunOptions::default()).await?;
    let elapsed = started.elapsed();
    let finished = matches!(&outcome, RunOutcome::Completed { last_node: Some(node), .. } if node == RESPOND);
    anyhow::ensure!(finished && outcome.state().step == sizes.plan_steps, "the bench turn on '{thread}' did not run its plan to the end");
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

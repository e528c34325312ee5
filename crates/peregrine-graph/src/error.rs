//! Why a run stopped without reaching its end. Every message says what happened, what was kept
//! (the last checkpoint always is) and what to do next.

use std::time::Duration;

use crate::checkpoint::{CheckpointError, CheckpointId};

/// A run that could not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A node failed fatally.
    #[error("run aborted by node '{node}' in thread '{thread_id}': {message}. {checkpoint}; fix the cause and start a new turn")]
    Aborted {
        /// The thread.
        thread_id: String,
        /// The node.
        node: String,
        /// Its explanation.
        message: String,
        /// The checkpoint kept.
        checkpoint: CheckpointLabel,
    },
    /// The router decided to abort (a FATAL error in state).
    #[error("run aborted in thread '{thread_id}': {message}. {checkpoint}; fix the cause and start a new turn")]
    RouterAborted {
        /// The thread.
        thread_id: String,
        /// The router's explanation.
        message: String,
        /// The checkpoint kept.
        checkpoint: CheckpointLabel,
    },
    /// Too many node executions in one run.
    #[error(
        "run stopped in thread '{thread_id}' after {limit} node executions (graph_recursion_limit) before running '{next_node}'; this usually means a loop. {checkpoint}; raise execution_control.limits.graph_recursion_limit if the work really needs more steps"
    )]
    RecursionLimit {
        /// The thread.
        thread_id: String,
        /// The limit.
        limit: u32,
        /// The node that would have run next.
        next_node: String,
        /// The checkpoint kept.
        checkpoint: CheckpointLabel,
    },
    /// The run took longer than its wall-clock budget.
    #[error(
        "run stopped in thread '{thread_id}' after exceeding its time budget of {limit:?} (max_execution_time_seconds) while {doing}. {checkpoint}; raise the limit or continue the thread"
    )]
    TimeLimit {
        /// The thread.
        thread_id: String,
        /// The budget.
        limit: Duration,
        /// What was running.
        doing: String,
        /// The checkpoint kept.
        checkpoint: CheckpointLabel,
    },
    /// The router named a node the graph does not have.
    #[error("the router chose node '{node}', which this graph does not have (nodes: {}); this is a bug in the router", known.join(", "))]
    UnknownNode {
        /// The name chosen.
        node: String,
        /// What exists.
        known: Vec<String>,
    },
    /// A node panicked.
    #[error("node '{node}' panicked in thread '{thread_id}': {message}. {checkpoint}")]
    NodePanicked {
        /// The thread.
        thread_id: String,
        /// The node.
        node: String,
        /// The panic message.
        message: String,
        /// The checkpoint kept.
        checkpoint: CheckpointLabel,
    },
    /// `run` on a thread that waits for an answer.
    #[error(
        "thread '{thread_id}' is waiting for an answer to interrupt {interrupt_id} from node '{node}'; answer it with resume before starting a new run"
    )]
    PendingInterrupt {
        /// The thread.
        thread_id: String,
        /// The pending interrupt.
        interrupt_id: String,
        /// The node that asked.
        node: String,
    },
    /// `run` on a thread whose answered interrupt has not been acted on yet.
    #[error(
        "thread '{thread_id}' holds an answer for node '{node}' that has not finished running (the run was cancelled or crashed after the answer); finish it with continue_run before starting a new run"
    )]
    PendingResume {
        /// The thread.
        thread_id: String,
        /// The node the answer is for.
        node: String,
    },
    /// `resume` on a thread with nothing to answer.
    #[error("thread '{thread_id}' has no pending interrupt to answer")]
    NothingToResume {
        /// The thread.
        thread_id: String,
    },
    /// An answer that quotes another interrupt than the pending one.
    #[error("the answer is for interrupt {given}, but thread '{thread_id}' is waiting for {pending}; the answer is stale and was refused")]
    StaleResume {
        /// The thread.
        thread_id: String,
        /// The interrupt quoted.
        given: String,
        /// The interrupt pending.
        pending: String,
    },
    /// An answer whose payload digest does not match what was asked.
    #[error(
        "the answer to interrupt {interrupt_id} in thread '{thread_id}' approves a different payload than the one asked about; it was refused"
    )]
    ForgedResume {
        /// The thread.
        thread_id: String,
        /// The interrupt.
        interrupt_id: String,
    },
    /// The thread or checkpoint asked for does not exist.
    #[error("thread '{thread_id}' has no checkpoint {}", checkpoint_id.map_or_else(|| "at all".to_string(), |id| id.to_string()))]
    NotFound {
        /// The thread.
        thread_id: String,
        /// The checkpoint asked for.
        checkpoint_id: Option<CheckpointId>,
    },
    /// Interrupts and resumes need a checkpointer.
    #[error(
        "node '{node}' asked for approval, but this graph has no checkpointer to keep the paused run; build the graph with a checkpointer"
    )]
    InterruptWithoutCheckpointer {
        /// The node.
        node: String,
    },
    /// State that cannot be (de)serialized.
    #[error("state of thread '{thread_id}' could not be {action}: {source}")]
    State {
        /// The thread.
        thread_id: String,
        /// `serialized` or `rebuilt`.
        action: &'static str,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The checkpointer failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl RunError {
    /// Whether the same call may succeed later (busy thread, storage hiccup).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Checkpoint(error) if error.is_retryable())
    }
}

/// What an error message says was kept: the last checkpoint, or nothing without a checkpointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointLabel(pub Option<CheckpointId>);

impl std::fmt::Display for CheckpointLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(id) => write!(f, "The last checkpoint (checkpoint {id}) is kept"),
            None => f.write_str("Nothing was stored (the graph has no checkpointer)"),
        }
    }
}

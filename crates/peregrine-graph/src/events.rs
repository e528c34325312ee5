//! The event stream of one run: engine events (node start and finish, waits, checkpoints,
//! interrupts) interleaved with the domain events nodes emit.

use std::time::Duration;

use serde::Serialize;

use crate::checkpoint::{CheckpointId, PendingInterrupt};

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunEvent<E> {
    /// A run (or the continuation of one) began, and its input (a message, an approval's
    /// answer) is durable in the checkpoint store: interfaces acknowledge the input on this event.
    RunStarted {
        /// The thread.
        thread_id: String,
        /// The run.
        run_id: String,
    },
    /// A node is about to run.
    NodeStarted {
        /// The node.
        node: String,
        /// 1-based execution number within the run.
        step: u32,
    },
    /// The router scheduled a wait before running a node (retry backoff).
    Waiting {
        /// The node that will run.
        node: String,
        /// How long.
        delay: Duration,
    },
    /// A node finished and its checkpoint is stored.
    NodeFinished {
        /// The node.
        node: String,
        /// 1-based execution number within the run.
        step: u32,
        /// The checkpoint written.
        checkpoint_id: Option<CheckpointId>,
        /// How long the node ran.
        duration: Duration,
    },
    /// The run paused for a person.
    Interrupted {
        /// The question.
        interrupt: PendingInterrupt,
    },
    /// The run reached its end.
    RunFinished {
        /// The last node.
        last_node: Option<String>,
    },
    /// A domain event from a node.
    Custom(E),
}

//! A generic durable state machine: nodes plus one router, a checkpoint after every node,
//! interrupts that pause a run until a person answers, recursion and wall-clock limits,
//! cancellation, a per-run event stream, state inspection and time travel.
//!
//! Invariants: only the router chooses the next node; a node's update is applied and
//! checkpointed before the router runs again, so a crash never loses a finished node and a
//! continued thread never re-runs one; waits between retries are engine-scheduled async sleeps
//! that cancellation interrupts.

pub mod checkpoint;
pub mod engine;
pub mod error;
pub mod events;
pub mod node;

pub use checkpoint::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, DynCheckpointer, ListQuery, LoadedCheckpoint,
    NewCheckpoint, PendingInterrupt, ResumeRecord, ThreadLock, ThreadSummary,
};
pub use engine::{
    BuildError, Graph, GraphBuilder, GraphLimits, Resume, Route, Router, RunOptions, RunOutcome, StateSnapshot, payload_digest,
};
pub use error::{CheckpointLabel, RunError};
pub use events::RunEvent;
pub use node::{DynNode, FnNode, Node, NodeContext, NodeError, NodeInfo, NodeOutput, NodeResult, node_fn};
pub use tokio_util::sync::CancellationToken;

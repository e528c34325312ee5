//! A generic durable state machine: nodes plus one router, a checkpoint after every node,
//! interrupts that pause a run until a person answers, recursion and wall-clock limits,
//! cancellation, a per-run event stream, state inspection and time travel.

pub mod checkpoint;

pub use checkpoint::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, DynCheckpointer, ListQuery, LoadedCheckpoint, NewCheckpoint,
    PendingInterrupt, ResumeRecord, ThreadLock, ThreadSummary,
};

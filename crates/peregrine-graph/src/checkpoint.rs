//! The `Checkpointer` trait every backend implements, and the records it stores.
//!
//! A checkpoint is written after every node. It stores the node's update (the *delta*) and, now
//! and then, a full *snapshot* of the state; a state is rebuilt from the nearest snapshot on its
//! parent chain plus the deltas after it. Storing a step therefore costs the size of its update,
//! not the size of the conversation.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Identifies a checkpoint within its thread; increases with every checkpoint written.
pub type CheckpointId = u64;

/// Why a checkpoint was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointSource {
    /// A run's input was applied.
    Input,
    /// A node finished.
    Loop,
    /// An interrupt was answered; the interrupted node runs next.
    Resume,
    /// State changed outside a run (`update_state`).
    Update,
    /// A run was started from an earlier checkpoint (time travel).
    Fork,
    /// A pending interrupt was withdrawn unanswered ([`crate::Graph::abandon`]): its node does
    /// not run again and the run ended here.
    Abandon,
}

/// A question a node asked; the run is paused until it is answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingInterrupt {
    /// Unique id; an answer must quote it.
    pub id: String,
    /// The node that asked and runs again once answered.
    pub node: String,
    /// What is to be approved.
    pub payload: Value,
    /// SHA-256 of the canonical JSON of `payload`; an answer must quote it.
    pub digest: String,
}

/// An answered interrupt, handed to the node when it runs again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeRecord {
    /// The interrupt answered.
    pub interrupt_id: String,
    /// The node to run again.
    pub node: String,
    /// What was asked.
    pub payload: Value,
    /// The answer.
    pub answer: Value,
    /// How many times the answer has been handed to the node: 1 on the first delivery, more
    /// when the node is run again after a crash or cancellation interrupted it.
    #[serde(default = "first_delivery")]
    pub delivery: u32,
}

fn first_delivery() -> u32 {
    1
}

/// Everything about a checkpoint except the state itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The thread.
    pub thread_id: String,
    /// This checkpoint.
    pub checkpoint_id: CheckpointId,
    /// The checkpoint this one follows.
    pub parent_id: Option<CheckpointId>,
    /// Why it was written.
    pub source: CheckpointSource,
    /// The node that produced it (for `Loop`, and `Update` written as a node).
    pub node: Option<String>,
    /// The run it belongs to.
    pub run_id: String,
    /// Node executions of that run up to here.
    pub run_step: u32,
    /// A pending question, if the run paused here.
    pub interrupt: Option<PendingInterrupt>,
    /// An answered question whose node has not yet run again.
    pub resume: Option<ResumeRecord>,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

/// A checkpoint to store; the backend assigns its id.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCheckpoint {
    /// The thread.
    pub thread_id: String,
    /// The checkpoint this one follows; `None` starts a new root, which must carry a snapshot.
    pub parent_id: Option<CheckpointId>,
    /// Why it is written.
    pub source: CheckpointSource,
    /// The node that produced it.
    pub node: Option<String>,
    /// The run it belongs to.
    pub run_id: String,
    /// Node executions of the run up to here.
    pub run_step: u32,
    /// A pending question.
    pub interrupt: Option<PendingInterrupt>,
    /// An answered question.
    pub resume: Option<ResumeRecord>,
    /// The serialized update that leads from the parent's state to this one.
    pub delta: Vec<u8>,
    /// The serialized full state, when the engine decides to store one; required without a
    /// parent.
    pub snapshot: Option<Vec<u8>>,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

impl NewCheckpoint {
    /// The metadata this checkpoint will have once stored under `checkpoint_id`.
    pub fn meta(&self, checkpoint_id: CheckpointId) -> CheckpointMeta {
        CheckpointMeta {
            thread_id: self.thread_id.clone(),
            checkpoint_id,
            parent_id: self.parent_id,
            source: self.source,
            node: self.node.clone(),
            run_id: self.run_id.clone(),
            run_step: self.run_step,
            interrupt: self.interrupt.clone(),
            resume: self.resume.clone(),
            created_at: self.created_at,
        }
    }
}

/// A checkpoint as loaded: rebuild the state by applying `deltas` in order to `snapshot`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedCheckpoint {
    /// Its metadata.
    pub meta: CheckpointMeta,
    /// The nearest snapshot on its parent chain (its own, if it has one).
    pub snapshot: Vec<u8>,
    /// The deltas of the checkpoints after that snapshot, oldest first, ending with this
    /// checkpoint's own delta; empty when the checkpoint has its own snapshot.
    pub deltas: Vec<Vec<u8>>,
}

/// Which checkpoints `list` returns: newest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only checkpoints older than this one.
    pub before: Option<CheckpointId>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// A thread as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSummary {
    /// The thread.
    pub thread_id: String,
    /// Its newest checkpoint.
    pub latest: CheckpointMeta,
    /// How many checkpoints it has.
    pub checkpoints: u64,
}

/// What can go wrong in a checkpointer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Another run holds the thread.
    #[error("thread '{thread_id}' is busy: another run is in progress on it; wait for it to finish or cancel it")]
    ThreadBusy {
        /// The thread.
        thread_id: String,
    },
    /// A parent that does not exist in the thread.
    #[error("checkpoint {parent_id} does not exist in thread '{thread_id}'")]
    UnknownParent {
        /// The thread.
        thread_id: String,
        /// The missing parent.
        parent_id: CheckpointId,
    },
    /// Another writer advanced the thread since this run read it (optimistic concurrency: two
    /// processes on one SQLite file, or any writer that bypassed the thread lock).
    #[error(
        "thread '{thread_id}' was changed by another run: its newest checkpoint is {}, but this write follows {}; nothing was written. Reload the thread and try again",
        latest.map_or_else(|| "none".to_string(), |id| id.to_string()),
        expected.map_or_else(|| "none".to_string(), |id| id.to_string())
    )]
    Conflict {
        /// The thread.
        thread_id: String,
        /// The parent the write named.
        expected: Option<CheckpointId>,
        /// The thread's actual newest checkpoint.
        latest: Option<CheckpointId>,
    },
    /// A checkpoint without a parent and without a snapshot.
    #[error("a checkpoint without a parent in thread '{thread_id}' must carry a full snapshot")]
    MissingSnapshot {
        /// The thread.
        thread_id: String,
    },
    /// `copy_thread` onto a thread that already has checkpoints.
    #[error("thread '{thread_id}' already exists; delete it first or copy to a new id")]
    ThreadExists {
        /// The thread.
        thread_id: String,
    },
    /// `copy_thread` from a thread that does not exist.
    #[error("thread '{thread_id}' does not exist")]
    ThreadNotFound {
        /// The thread.
        thread_id: String,
    },
    /// Storage written by a newer version of Peregrine.
    #[error(
        "the {backend} checkpoint store has schema version {found}, but this build understands up to {supported}; upgrade Peregrine or use another store"
    )]
    UnsupportedSchema {
        /// `sqlite`, `postgres`, …
        backend: &'static str,
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// Stored data that cannot be read back.
    #[error("checkpoint data of thread '{thread_id}' is corrupt: {reason}")]
    Corrupt {
        /// The thread.
        thread_id: String,
        /// What is wrong.
        reason: String,
    },
    /// The storage itself failed (I/O, connection, SQL).
    #[error("{backend} checkpoint storage failed while trying to {operation}: {source}")]
    Backend {
        /// `sqlite`, `postgres`, …
        backend: &'static str,
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CheckpointError {
    /// Wraps a storage error.
    pub fn backend(backend: &'static str, operation: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Backend { backend, operation, source: Box::new(source) }
    }

    /// Whether trying again later may succeed (busy threads, conflicts, storage failures).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::ThreadBusy { .. } | Self::Conflict { .. } | Self::Backend { .. })
    }
}

/// Exclusive hold on a thread; released when dropped (also when the process dies). Release may
/// complete shortly after the drop for backends that must talk to a server (PostgreSQL).
pub struct ThreadLock {
    _guard: Box<dyn Send + Sync>,
}

impl ThreadLock {
    /// Wraps whatever releases the lock on drop.
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        Self { _guard: Box::new(guard) }
    }
}

impl std::fmt::Debug for ThreadLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadLock")
    }
}

/// Durable storage of checkpoints.
///
/// Contract (checked by `peregrine_checkpoint::conformance`):
/// - `put` is atomic and durable when it returns; ids are `max + 1` within a thread (so they
///   restart at 1 after `delete_thread`), and a put without a parent must carry a snapshot;
/// - a put whose source is not [`CheckpointSource::Fork`] must name the thread's newest
///   checkpoint as its parent (no parent on an empty thread), else it fails with
///   [`CheckpointError::Conflict`] and writes nothing: a run only ever extends the tip it read,
///   even when two processes share one store. A fork may name any existing checkpoint;
/// - timestamps keep at least microsecond precision;
/// - `threads` orders by the `created_at` of each thread's newest checkpoint, then thread id;
/// - `load` of `None` is the newest checkpoint of the thread (highest id);
/// - `list` is newest first and never returns state;
/// - `lock_thread` fails fast with [`CheckpointError::ThreadBusy`] while another holder exists;
/// - `is_thread_locked` is true while some holder (this process or, for shared backends, another)
///   holds the thread's lock, and takes nothing: probing never makes a `lock_thread` fail.
pub trait Checkpointer: Send + Sync + 'static {
    /// Stores a checkpoint and returns its metadata with the assigned id.
    fn put(&self, checkpoint: NewCheckpoint) -> impl Future<Output = Result<CheckpointMeta, CheckpointError>> + Send;
    /// Loads a checkpoint (the newest when `checkpoint_id` is `None`) with what is needed to
    /// rebuild its state; `None` when the thread or checkpoint does not exist.
    fn load(
        &self,
        thread_id: &str,
        checkpoint_id: Option<CheckpointId>,
    ) -> impl Future<Output = Result<Option<LoadedCheckpoint>, CheckpointError>> + Send;
    /// Lists checkpoint metadata, newest first.
    fn list(&self, thread_id: &str, query: ListQuery) -> impl Future<Output = Result<Vec<CheckpointMeta>, CheckpointError>> + Send;
    /// Lists threads, most recently updated first.
    fn threads(&self) -> impl Future<Output = Result<Vec<ThreadSummary>, CheckpointError>> + Send;
    /// Deletes a thread and all its checkpoints; deleting a missing thread is not an error.
    fn delete_thread(&self, thread_id: &str) -> impl Future<Output = Result<(), CheckpointError>> + Send;
    /// Copies every checkpoint of `from` into the new thread `to`, keeping ids.
    fn copy_thread(&self, from: &str, to: &str) -> impl Future<Output = Result<(), CheckpointError>> + Send;
    /// Takes the thread's run lock without waiting.
    fn lock_thread(&self, thread_id: &str) -> impl Future<Output = Result<ThreadLock, CheckpointError>> + Send;
    /// Whether the thread's run lock is held now: true while some holder (this process or, for
    /// shared backends, another) holds it. Takes nothing, so it never makes a `lock_thread` fail;
    /// the answer may be stale by the time it arrives, so it is for reporting, not for exclusion.
    fn is_thread_locked(&self, thread_id: &str) -> impl Future<Output = Result<bool, CheckpointError>> + Send;
}

/// A boxed future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Checkpointer`], implemented for every checkpointer.
pub trait DynCheckpointer: Send + Sync + 'static {
    /// See [`Checkpointer::put`].
    fn put_boxed(&self, checkpoint: NewCheckpoint) -> BoxFuture<'_, Result<CheckpointMeta, CheckpointError>>;
    /// See [`Checkpointer::load`].
    fn load_boxed<'a>(
        &'a self,
        thread_id: &'a str,
        checkpoint_id: Option<CheckpointId>,
    ) -> BoxFuture<'a, Result<Option<LoadedCheckpoint>, CheckpointError>>;
    /// See [`Checkpointer::list`].
    fn list_boxed<'a>(&'a self, thread_id: &'a str, query: ListQuery) -> BoxFuture<'a, Result<Vec<CheckpointMeta>, CheckpointError>>;
    /// See [`Checkpointer::threads`].
    fn threads_boxed(&self) -> BoxFuture<'_, Result<Vec<ThreadSummary>, CheckpointError>>;
    /// See [`Checkpointer::delete_thread`].
    fn delete_thread_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<(), CheckpointError>>;
    /// See [`Checkpointer::copy_thread`].
    fn copy_thread_boxed<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, Result<(), CheckpointError>>;
    /// See [`Checkpointer::lock_thread`].
    fn lock_thread_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<ThreadLock, CheckpointError>>;
    /// See [`Checkpointer::is_thread_locked`].
    fn is_thread_locked_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<bool, CheckpointError>>;
}

impl<C: Checkpointer> DynCheckpointer for C {
    fn put_boxed(&self, checkpoint: NewCheckpoint) -> BoxFuture<'_, Result<CheckpointMeta, CheckpointError>> {
        Box::pin(self.put(checkpoint))
    }
    fn load_boxed<'a>(
        &'a self,
        thread_id: &'a str,
        checkpoint_id: Option<CheckpointId>,
    ) -> BoxFuture<'a, Result<Option<LoadedCheckpoint>, CheckpointError>> {
        Box::pin(self.load(thread_id, checkpoint_id))
    }
    fn list_boxed<'a>(&'a self, thread_id: &'a str, query: ListQuery) -> BoxFuture<'a, Result<Vec<CheckpointMeta>, CheckpointError>> {
        Box::pin(self.list(thread_id, query))
    }
    fn threads_boxed(&self) -> BoxFuture<'_, Result<Vec<ThreadSummary>, CheckpointError>> {
        Box::pin(self.threads())
    }
    fn delete_thread_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<(), CheckpointError>> {
        Box::pin(self.delete_thread(thread_id))
    }
    fn copy_thread_boxed<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, Result<(), CheckpointError>> {
        Box::pin(self.copy_thread(from, to))
    }
    fn lock_thread_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<ThreadLock, CheckpointError>> {
        Box::pin(self.lock_thread(thread_id))
    }
    fn is_thread_locked_boxed<'a>(&'a self, thread_id: &'a str) -> BoxFuture<'a, Result<bool, CheckpointError>> {
        Box::pin(self.is_thread_locked(thread_id))
    }
}

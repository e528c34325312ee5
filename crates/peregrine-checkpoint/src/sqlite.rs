//! The SQLite checkpointer: the embedded, single-process default. One file in WAL mode with
//! `synchronous=FULL`, so every `put` is on disk when it returns.
//!
//! Thread locks live in process memory, shared by the clones of one opened
//! [`SqliteCheckpointer`]; two handles (or two processes) on the same file do not see each other's
//! locks. What still keeps two runs from both continuing one checkpoint is `put`'s compare-and-set:
//! it reads the thread's newest id inside its write transaction, so the slower of two writers
//! extending the same tip gets `CheckpointError::Conflict` and its run stops. Serve a thread from
//! one process at a time to avoid those failed runs, or use the PostgreSQL backend, which locks
//! threads in the database for several server processes.
//!
//! Concurrency: writes go to one writer thread owning the read-write connection, which commits
//! the puts queued at a moment together (group commit: one transaction and one fsync for many
//! concurrent conversations, each put in its own savepoint so that a failed check fails only that
//! put); a put returns only after its batch's commit did. Reads run on a few read-only
//! connections on tokio's blocking pool, which in WAL mode neither wait for the writer nor block
//! it, and see every put that returned before they began. The async runtime never waits on disk
//! I/O. An in-memory database (or a file SQLite cannot put in WAL mode) has no read connections:
//! its reads queue on the writer thread.

mod queries;
mod readers;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use peregrine_graph::checkpoint::{
    CheckpointError, CheckpointId, CheckpointMeta, Checkpointer, ListQuery, LoadedCheckpoint, NewCheckpoint, ThreadLock, ThreadSummary,
};
use rusqlite::Connection;

use crate::memory::ThreadLocks;
use readers::Readers;
use writer::Writer;

const BACKEND: &str = "sqlite";

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: i64 = 1;

/// How long a statement waits for another connection's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Read-only connections per opened file: reads that run at once (each is short).
const READ_CONNECTIONS: usize = 4;

/// Stores checkpoints in one SQLite file; clones share the writer thread, the read connections
/// and the thread locks.
#[derive(Debug, Clone)]
pub struct SqliteCheckpointer {
    writer: Arc<Writer>,
    /// `None` for an in-memory database: reads then go through the writer.
    readers: Option<Arc<Readers>>,
    locks: ThreadLocks,
}

impl SqliteCheckpointer {
    /// Opens (creating if needed) the database file at `path` and its schema; refuses a file
    /// written with a newer schema version.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref().to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(&path))
            .await
            .map_err(|error| CheckpointError::backend(BACKEND, "open the database", error))?
    }

    fn open_blocking(path: &Path) -> Result<Self, CheckpointError> {
        let mut connection = Connection::open(path).map_err(failed("open the database"))?;
        let journal_mode = queries::prepare(&mut connection)?;
        // Read connections beside the writer need WAL; without it they would block its commits.
        let readers = if journal_mode.eq_ignore_ascii_case("wal") {
            Some(Arc::new(Readers::open(path, READ_CONNECTIONS)?))
        } else {
            tracing::warn!(journal_mode = %journal_mode, path = %path.display(), "SQLite could not use WAL mode: checkpoint reads will wait for writes");
            None
        };
        Self::start(connection, readers)
    }

    /// A private in-memory database (for tests): nothing is written to disk.
    pub fn open_in_memory() -> Result<Self, CheckpointError> {
        let mut connection = Connection::open_in_memory().map_err(failed("open an in-memory database"))?;
        queries::prepare(&mut connection)?;
        Self::start(connection, None)
    }

    fn start(connection: Connection, readers: Option<Arc<Readers>>) -> Result<Self, CheckpointError> {
        Ok(Self { writer: Arc::new(Writer::start(connection)?), readers, locks: ThreadLocks::default() })
    }

    /// Runs a read on a read connection (or, without any, on the writer thread).
    async fn read<T, F>(&self, operation: &'static str, work: F) -> Result<T, CheckpointError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, CheckpointError> + Send + 'static,
    {
        match &self.readers {
            Some(readers) => readers.run(operation, work).await,
            None => self.writer.exclusive(operation, work).await,
        }
    }
}

/// Wraps a SQLite error as a storage failure while doing `operation`.
fn failed(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> CheckpointError {
    move |error| CheckpointError::backend(BACKEND, operation, error)
}

fn corrupt(thread_id: &str, reason: String) -> CheckpointError {
    CheckpointError::Corrupt { thread_id: thread_id.to_owned(), reason }
}

/// A checkpoint id as stored; `None` for ids SQLite cannot hold (and which therefore do not exist).
fn sql_id(checkpoint_id: CheckpointId) -> Option<i64> {
    i64::try_from(checkpoint_id).ok()
}

/// A stored checkpoint id, checked.
fn checkpoint_id(thread_id: &str, stored: i64) -> Result<CheckpointId, CheckpointError> {
    CheckpointId::try_from(stored).map_err(|_| corrupt(thread_id, format!("checkpoint id {stored} is negative")))
}

impl Checkpointer for SqliteCheckpointer {
    async fn put(&self, checkpoint: NewCheckpoint) -> Result<CheckpointMeta, CheckpointError> {
        // Refused before it is queued: it needs no database.
        if checkpoint.parent_id.is_none() && checkpoint.snapshot.is_none() {
            return Err(CheckpointError::MissingSnapshot { thread_id: checkpoint.thread_id });
        }
        self.writer.put(checkpoint).await
    }

    async fn load(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        let wanted = match checkpoint_id {
            Some(checkpoint_id) => match sql_id(checkpoint_id) {
                Some(id) => Some(id),
                None => return Ok(None),
            },
            None => None,
        };
        let thread_id = thread_id.to_owned();
        self.read("load a checkpoint", move |connection| queries::load(connection, &thread_id, wanted)).await
    }

    async fn list(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        let thread_id = thread_id.to_owned();
        self.read("list checkpoints", move |connection| queries::list(connection, &thread_id, query)).await
    }

    async fn threads(&self) -> Result<Vec<ThreadSummary>, CheckpointError> {
        self.read("list threads", queries::threads).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        let thread_id = thread_id.to_owned();
        self.writer.exclusive("delete a thread", move |connection| queries::delete_thread(connection, &thread_id)).await
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let (from, to) = (from.to_owned(), to.to_owned());
        self.writer.exclusive("copy a thread", move |connection| queries::copy_thread(connection, &from, &to)).await
    }

    async fn lock_thread(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        self.locks.acquire(thread_id)
    }

    /// Sees only this handle's (and its clones') locks, like `lock_thread`.
    async fn is_thread_locked(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        Ok(self.locks.is_held(thread_id))
    }
}

#[cfg(test)]
mod tests;

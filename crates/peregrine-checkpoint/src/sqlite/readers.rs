//! The read connections: a few read-only connections to the file, each used by one blocking task
//! at a time. In WAL mode readers never wait for the writer nor block it, and each read
//! transaction sees every commit that returned before it began.

use std::path::Path;
use std::sync::{Arc, Mutex};

use peregrine_graph::checkpoint::CheckpointError;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{BACKEND, failed, queries};
use crate::memory::lock_ignoring_poison;

/// A permit was held but no connection was idle: a bug in the lending below.
#[derive(Debug, thiserror::Error)]
#[error("no SQLite read connection was free although one was reserved (a bug in Peregrine); try again")]
struct NoIdleConnection;

/// The idle read connections; a semaphore with one permit per connection makes callers wait in
/// async code (not on blocking-pool threads) while all of them are busy.
#[derive(Debug)]
pub(super) struct Readers {
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl Readers {
    /// Opens `count` read-only connections to the file at `path`, whose schema is set up.
    pub(super) fn open(path: &Path, count: usize) -> Result<Self, CheckpointError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let connections = (0..count)
            .map(|_| {
                let connection = Connection::open_with_flags(path, flags).map_err(failed("open a read connection"))?;
                queries::prepare_reader(&connection)?;
                Ok(connection)
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        Ok(Self { idle: Mutex::new(connections), permits: Arc::new(Semaphore::new(count)) })
    }

    /// Runs `work` on the blocking pool with an idle read connection, waiting for one if needed.
    pub(super) async fn run<T, F>(self: &Arc<Self>, operation: &'static str, work: F) -> Result<T, CheckpointError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, CheckpointError> + Send + 'static,
    {
        // The semaphore is never closed.
        let permit =
            Arc::clone(&self.permits).acquire_owned().await.map_err(|error| CheckpointError::backend(BACKEND, operation, error))?;
        let readers = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut lease = Lease::take(readers, permit);
            let connection = lease.connection.as_mut().ok_or_else(|| CheckpointError::backend(BACKEND, operation, NoIdleConnection))?;
            work(connection)
        })
        .await
        .map_err(|error| CheckpointError::backend(BACKEND, operation, error))?
    }

    /// How many connections are idle now (for tests).
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        lock_ignoring_poison(&self.idle).len()
    }

    /// Runs `work` on an idle connection on this thread (for tests).
    #[cfg(test)]
    pub(super) fn with_idle<T>(&self, work: impl FnOnce(&Connection) -> T) -> Option<T> {
        lock_ignoring_poison(&self.idle).first().map(work)
    }
}

/// A borrowed read connection; goes back to the idle list when dropped (also when the work
/// panicked), before its permit is released.
struct Lease {
    readers: Arc<Readers>,
    /// `None` only if no connection was idle (see [`NoIdleConnection`]).
    connection: Option<Connection>,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    fn take(readers: Arc<Readers>, permit: OwnedSemaphorePermit) -> Self {
        let connection = lock_ignoring_poison(&readers.idle).pop();
        Self { readers, connection, _permit: permit }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            lock_ignoring_poison(&self.readers.idle).push(connection);
        }
    }
}

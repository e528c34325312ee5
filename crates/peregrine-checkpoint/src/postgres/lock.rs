//! Thread locks: a session-level advisory lock per thread, taken on a connection reserved for it
//! and released by a spawned task when the lock is dropped, plus this instance's own view of the
//! threads it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Object, Timeouts};
use peregrine_graph::{CheckpointError, ThreadLock};
use tokio::sync::watch;

use super::{BACKEND, PostgresCheckpointer, PostgresProblem, backend, pool_error};

/// How long `lock_thread` waits for this instance's own release of the same thread to finish.
const LOCAL_RELEASE_WAIT: Duration = Duration::from_secs(5);

const LOCK_SQL: &str = "SELECT k, pg_try_advisory_lock(k) FROM (SELECT hashtextextended($1::text, 0) AS k) AS key";
const UNLOCK_SQL: &str = "SELECT pg_advisory_unlock($1::bigint)";
/// Whether any session of this database holds a lock on the thread's key: a single-key advisory
/// lock shows in `pg_locks` with the key's high 32 bits as `classid`, its low ones as `objid` and
/// `objsubid = 1`. Reading `pg_locks` takes no advisory lock, so a probe never makes a `lock_thread` fail.
const PROBE_SQL: &str = "
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid = ((key.k >> 32) & 4294967295)::oid
      AND objid = (key.k & 4294967295)::oid
)
FROM (SELECT hashtextextended($1::text, 0) AS k) AS key";

impl PostgresCheckpointer {
    /// The advisory-lock key `lock_thread` uses for a thread, for finding its holder in `pg_locks`
    /// (`classid` is the high and `objid` the low 32 bits, `objsubid = 1`).
    pub async fn thread_lock_key(&self, thread_id: &str) -> Result<i64, CheckpointError> {
        let client = self.pool.get().await.map_err(pool_error("compute a thread lock key"))?;
        let row = client
            .query_one("SELECT hashtextextended($1::text, 0)", &[&self.lock_name(thread_id)])
            .await
            .map_err(backend("compute a thread lock key"))?;
        row.try_get(0).map_err(backend("compute a thread lock key"))
    }

    /// The text hashed into a thread's lock key; length-prefixed so no two (schema, thread)
    /// pairs give the same text.
    fn lock_name(&self, thread_id: &str) -> String {
        format!("peregrine:{}:{}:{}", self.schema.len(), self.schema, thread_id)
    }

    /// Claims the thread for this instance, then takes its advisory lock on a reserved connection
    /// (what [`Checkpointer::lock_thread`](peregrine_graph::Checkpointer::lock_thread) does here).
    pub(super) async fn acquire_thread_lock(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        const OPERATION: &str = "lock a thread";
        let claim = self.local_locks.claim(thread_id).await?;
        let no_wait = Timeouts { wait: Some(Duration::ZERO), ..self.lock_pool.timeouts() };
        let connection = match self.lock_pool.timeout_get(&no_wait).await {
            Ok(connection) => connection,
            Err(deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {
                return Err(CheckpointError::backend(
                    BACKEND,
                    OPERATION,
                    PostgresProblem::LockConnectionsExhausted { limit: self.max_thread_locks },
                ));
            }
            Err(e) => return Err(CheckpointError::backend(BACKEND, OPERATION, e)),
        };
        let attempt = LockAttempt(Some(connection));
        let (key, acquired) = attempt.try_lock(&self.lock_name(thread_id)).await?;
        let connection = attempt.settle();
        if !acquired {
            return Err(CheckpointError::ThreadBusy { thread_id: thread_id.to_owned() });
        }
        Ok(ThreadLock::new(HeldThread { connection, key, claim: Some(claim) }))
    }

    /// Whether the thread's lock is held, by this instance or any other session on the database
    /// (what [`Checkpointer::is_thread_locked`](peregrine_graph::Checkpointer::is_thread_locked)
    /// does here). A thread this instance holds or is locking is answered without a round trip;
    /// otherwise one query on a pooled query connection (never a lock connection) reads
    /// `pg_locks`, so a lock this instance is still releasing counts until the server has
    /// released it.
    pub(super) async fn probe_thread_lock(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        const OPERATION: &str = "check a thread lock";
        if self.local_locks.holds(thread_id) {
            return Ok(true);
        }
        let client = self.client(OPERATION).await?;
        let statement = client.prepare_cached(PROBE_SQL).await.map_err(backend(OPERATION))?;
        let row = client.query_one(&statement, &[&self.lock_name(thread_id)]).await.map_err(backend(OPERATION))?;
        row.try_get(0).map_err(backend(OPERATION))
    }
}

/// A lock connection whose lock state is not known yet: if the attempt is cancelled or fails,
/// the connection is closed (the server then drops any lock it took) instead of going back to
/// the pool still holding the lock.
struct LockAttempt(Option<Object>);

impl LockAttempt {
    /// Tries the lock; returns its key and whether it was taken.
    async fn try_lock(&self, lock_name: &str) -> Result<(i64, bool), CheckpointError> {
        const OPERATION: &str = "lock a thread";
        let Some(client) = self.0.as_ref() else {
            return Err(CheckpointError::backend(BACKEND, OPERATION, std::io::Error::other("lock connection already settled")));
        };
        let statement = client.prepare_cached(LOCK_SQL).await.map_err(backend(OPERATION))?;
        let row = client.query_one(&statement, &[&lock_name]).await.map_err(backend(OPERATION))?;
        let key: i64 = row.try_get(0).map_err(backend(OPERATION))?;
        let acquired: bool = row.try_get(1).map_err(backend(OPERATION))?;
        Ok((key, acquired))
    }

    /// The connection, once its lock state is known.
    fn settle(mut self) -> Option<Object> {
        self.0.take()
    }
}

impl Drop for LockAttempt {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(Object::take(connection));
        }
    }
}

/// A held advisory lock; dropping it unlocks in a spawned task and only then returns the
/// connection to the pool.
struct HeldThread {
    connection: Option<Object>,
    key: i64,
    claim: Option<LocalClaim>,
}

impl Drop for HeldThread {
    fn drop(&mut self) {
        let (Some(connection), Some(claim)) = (self.connection.take(), self.claim.take()) else {
            return;
        };
        let releasing = claim.start_release();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let key = self.key;
                runtime.spawn(async move {
                    unlock(connection, key).await;
                    drop(releasing);
                });
            }
            // No runtime to unlock on: close the session, which makes the server release it.
            Err(_) => drop(Object::take(connection)),
        }
    }
}

async fn unlock(connection: Object, key: i64) {
    let unlocked = match connection.query_one(UNLOCK_SQL, &[&key]).await {
        Ok(row) => row.try_get::<_, bool>(0).unwrap_or(false),
        Err(e) => {
            tracing::warn!(error = %e, "could not release a thread lock; closing its connection so the server releases it");
            false
        }
    };
    if !unlocked {
        // Never hand a connection that may still hold the lock back to the pool.
        drop(Object::take(connection));
    }
}

/// This instance's own view of its locks: a second `lock_thread` of a held thread fails without
/// a round trip, and one made while the previous holder's unlock is still in flight waits for it
/// instead of failing.
#[derive(Clone, Default)]
pub(super) struct LocalLocks {
    entries: Arc<Mutex<HashMap<String, LocalState>>>,
}

enum LocalState {
    Held,
    /// The unlock task is running; the receiver wakes when its sender is dropped.
    Releasing(watch::Receiver<()>),
}

impl LocalLocks {
    async fn claim(&self, thread_id: &str) -> Result<LocalClaim, CheckpointError> {
        loop {
            let mut releasing = {
                let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
                match entries.get(thread_id) {
                    None => {
                        entries.insert(thread_id.to_owned(), LocalState::Held);
                        return Ok(LocalClaim { locks: self.clone(), thread_id: thread_id.to_owned(), releasing: false });
                    }
                    Some(LocalState::Held) => return Err(CheckpointError::ThreadBusy { thread_id: thread_id.to_owned() }),
                    Some(LocalState::Releasing(receiver)) => receiver.clone(),
                }
            };
            // `changed` fails once the release task drops its sender, i.e. when it is done.
            if tokio::time::timeout(LOCAL_RELEASE_WAIT, releasing.changed()).await.is_err() {
                return Err(CheckpointError::ThreadBusy { thread_id: thread_id.to_owned() });
            }
        }
    }

    /// Whether this instance holds the thread, or is taking its lock now (not while releasing it).
    fn holds(&self, thread_id: &str) -> bool {
        matches!(self.entries.lock().unwrap_or_else(PoisonError::into_inner).get(thread_id), Some(LocalState::Held))
    }

    fn remove(&self, thread_id: &str) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).remove(thread_id);
    }
}

/// This instance's claim on a thread; removed on drop unless turned into a release.
struct LocalClaim {
    locks: LocalLocks,
    thread_id: String,
    releasing: bool,
}

impl LocalClaim {
    fn start_release(mut self) -> LocalRelease {
        let (sender, receiver) = watch::channel(());
        self.releasing = true;
        self.locks.entries.lock().unwrap_or_else(PoisonError::into_inner).insert(self.thread_id.clone(), LocalState::Releasing(receiver));
        LocalRelease { locks: self.locks.clone(), thread_id: std::mem::take(&mut self.thread_id), _done: sender }
    }
}

impl Drop for LocalClaim {
    fn drop(&mut self) {
        if !self.releasing {
            self.locks.remove(&self.thread_id);
        }
    }
}

/// Marks a release in flight; dropping it ends the release and wakes waiters.
struct LocalRelease {
    locks: LocalLocks,
    thread_id: String,
    _done: watch::Sender<()>,
}

impl Drop for LocalRelease {
    fn drop(&mut self) {
        self.locks.remove(&self.thread_id);
    }
}

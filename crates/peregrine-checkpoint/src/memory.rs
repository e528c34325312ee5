//! The in-memory checkpointer (tests, ephemeral runs) and the in-process thread-lock registry it
//! shares with the SQLite backend.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use peregrine_graph::checkpoint::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, ListQuery, LoadedCheckpoint, NewCheckpoint, ThreadLock,
    ThreadSummary,
};

/// Locks a std mutex, carrying on after a panic elsewhere: every critical section here leaves the
/// data consistent before it can panic, so a poisoned lock holds nothing half-written.
pub(crate) fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The set of threads whose run lock is held in this process; clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThreadLocks {
    held: Arc<Mutex<HashSet<String>>>,
}

impl ThreadLocks {
    /// Takes the lock of `thread_id`, or fails with `ThreadBusy` if someone holds it.
    pub(crate) fn acquire(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        if !lock_ignoring_poison(&self.held).insert(thread_id.to_owned()) {
            return Err(CheckpointError::ThreadBusy { thread_id: thread_id.to_owned() });
        }
        Ok(ThreadLock::new(HeldThread { held: Arc::clone(&self.held), thread_id: thread_id.to_owned() }))
    }

    /// Whether someone holds the lock of `thread_id`; takes nothing.
    pub(crate) fn is_held(&self, thread_id: &str) -> bool {
        lock_ignoring_poison(&self.held).contains(thread_id)
    }
}

/// Releases one thread's lock when dropped.
struct HeldThread {
    held: Arc<Mutex<HashSet<String>>>,
    thread_id: String,
}

impl Drop for HeldThread {
    fn drop(&mut self) {
        lock_ignoring_poison(&self.held).remove(&self.thread_id);
    }
}

/// One stored checkpoint.
#[derive(Debug, Clone)]
struct StoredCheckpoint {
    meta: CheckpointMeta,
    delta: Vec<u8>,
    snapshot: Option<Vec<u8>>,
}

/// Every thread's checkpoints, by id.
type Threads = HashMap<String, BTreeMap<CheckpointId, StoredCheckpoint>>;

/// Keeps checkpoints in process memory; clones share the same data and locks. Nothing survives
/// the process.
#[derive(Debug, Clone, Default)]
pub struct MemoryCheckpointer {
    threads: Arc<Mutex<Threads>>,
    locks: ThreadLocks,
}

impl MemoryCheckpointer {
    /// An empty checkpointer.
    pub fn new() -> Self {
        Self::default()
    }

    fn threads(&self) -> MutexGuard<'_, Threads> {
        lock_ignoring_poison(&self.threads)
    }
}

/// Rebuilds what `load` returns for `target` by walking its parent chain to the nearest snapshot.
fn resolve(
    thread_id: &str,
    checkpoints: &BTreeMap<CheckpointId, StoredCheckpoint>,
    target: &StoredCheckpoint,
) -> Result<LoadedCheckpoint, CheckpointError> {
    let mut deltas = Vec::new();
    let mut current = target;
    let snapshot = loop {
        if let Some(snapshot) = &current.snapshot {
            break snapshot.clone();
        }
        deltas.push(current.delta.clone());
        let parent = current.meta.parent_id.and_then(|parent_id| checkpoints.get(&parent_id));
        current = parent.ok_or_else(|| CheckpointError::Corrupt {
            thread_id: thread_id.to_owned(),
            reason: format!("checkpoint {} has no snapshot on its parent chain", target.meta.checkpoint_id),
        })?;
    };
    deltas.reverse();
    Ok(LoadedCheckpoint { meta: target.meta.clone(), snapshot, deltas })
}

impl Checkpointer for MemoryCheckpointer {
    async fn put(&self, checkpoint: NewCheckpoint) -> Result<CheckpointMeta, CheckpointError> {
        let mut threads = self.threads();
        let existing = threads.get(&checkpoint.thread_id);
        match checkpoint.parent_id {
            None if checkpoint.snapshot.is_none() => {
                return Err(CheckpointError::MissingSnapshot { thread_id: checkpoint.thread_id });
            }
            Some(parent_id) if !existing.is_some_and(|checkpoints| checkpoints.contains_key(&parent_id)) => {
                return Err(CheckpointError::UnknownParent { thread_id: checkpoint.thread_id, parent_id });
            }
            _ => {}
        }
        let latest = existing.and_then(|checkpoints| checkpoints.last_key_value()).map(|(id, _)| *id);
        if checkpoint.source != CheckpointSource::Fork && checkpoint.parent_id != latest {
            return Err(CheckpointError::Conflict { thread_id: checkpoint.thread_id, expected: checkpoint.parent_id, latest });
        }
        let checkpoint_id = latest.map_or(1, |id| id + 1);
        let meta = checkpoint.meta(checkpoint_id);
        let stored = StoredCheckpoint { meta: meta.clone(), delta: checkpoint.delta, snapshot: checkpoint.snapshot };
        threads.entry(checkpoint.thread_id).or_default().insert(checkpoint_id, stored);
        Ok(meta)
    }

    async fn load(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        let threads = self.threads();
        let Some(checkpoints) = threads.get(thread_id) else {
            return Ok(None);
        };
        let target = match checkpoint_id {
            Some(checkpoint_id) => checkpoints.get(&checkpoint_id),
            None => checkpoints.last_key_value().map(|(_, stored)| stored),
        };
        target.map(|target| resolve(thread_id, checkpoints, target)).transpose()
    }

    async fn list(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        let threads = self.threads();
        let Some(checkpoints) = threads.get(thread_id) else {
            return Ok(Vec::new());
        };
        let older = checkpoints.range(..query.before.unwrap_or(CheckpointId::MAX)).rev();
        Ok(older.take(query.limit.unwrap_or(usize::MAX)).map(|(_, stored)| stored.meta.clone()).collect())
    }

    async fn threads(&self) -> Result<Vec<ThreadSummary>, CheckpointError> {
        let threads = self.threads();
        let mut summaries: Vec<ThreadSummary> = threads
            .iter()
            .filter_map(|(thread_id, checkpoints)| {
                let (_, latest) = checkpoints.last_key_value()?;
                Some(ThreadSummary { thread_id: thread_id.clone(), latest: latest.meta.clone(), checkpoints: checkpoints.len() as u64 })
            })
            .collect();
        summaries.sort_by(|a, b| b.latest.created_at.cmp(&a.latest.created_at).then_with(|| a.thread_id.cmp(&b.thread_id)));
        Ok(summaries)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        self.threads().remove(thread_id);
        Ok(())
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let mut threads = self.threads();
        let Some(source) = threads.get(from) else {
            return Err(CheckpointError::ThreadNotFound { thread_id: from.to_owned() });
        };
        if threads.contains_key(to) {
            return Err(CheckpointError::ThreadExists { thread_id: to.to_owned() });
        }
        let copy = source
            .iter()
            .map(|(id, stored)| {
                let mut stored = stored.clone();
                to.clone_into(&mut stored.meta.thread_id);
                (*id, stored)
            })
            .collect();
        threads.insert(to.to_owned(), copy);
        Ok(())
    }

    async fn lock_thread(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        self.locks.acquire(thread_id)
    }

    async fn is_thread_locked(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        Ok(self.locks.is_held(thread_id))
    }
}

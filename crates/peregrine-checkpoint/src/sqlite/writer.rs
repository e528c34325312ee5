//! The writer: one std thread owning the read-write connection, fed by a channel. It commits the
//! puts queued at a moment together (group commit): one `BEGIN IMMEDIATE` transaction, each put
//! in its own savepoint (so a put that fails its checks rolls back alone and gets its own error),
//! one `COMMIT` (one fsync) for all, and only then answers each put. Deletes and copies run alone
//! between batches, in the order they were queued.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, mpsc};

use peregrine_graph::checkpoint::{CheckpointError, CheckpointMeta, NewCheckpoint};
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::{BACKEND, failed, queries};

/// The most puts one commit covers, so that a put's wait stays bounded however many are queued.
pub(super) const MAX_BATCH: usize = 256;

/// What a put is answered with.
type PutResult = Result<CheckpointMeta, CheckpointError>;

/// A put waiting for its batch.
pub(super) struct PendingPut {
    pub(super) checkpoint: NewCheckpoint,
    pub(super) reply: oneshot::Sender<PutResult>,
}

/// Work for the writer thread.
pub(super) enum Job {
    /// Stored in the next batch.
    Put(Box<PendingPut>),
    /// Anything else that needs the write connection (deletes, copies, and reads where there are
    /// no read connections): runs alone between batches. It answers its caller itself.
    Exclusive(Box<dyn FnOnce(&mut Connection) + Send>),
}

/// The writer dropped a job unanswered: the job panicked, or the thread is gone.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite writer thread gave no answer (the operation panicked, or the thread stopped; see the log); try again")]
struct WriterStopped;

/// The batch a put was committed with failed as a whole.
#[derive(Debug, thiserror::Error)]
#[error("this checkpoint was one of {puts} committed together, and that commit failed: none of them was stored; try again")]
struct BatchFailed {
    puts: usize,
    #[source]
    cause: Arc<CheckpointError>,
}

/// The sending side of the writer thread's queue; the thread ends once every clone is dropped.
#[derive(Debug)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread on a prepared connection.
    pub(super) fn start(connection: Connection) -> Result<Self, CheckpointError> {
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("peregrine-sqlite-writer".to_owned())
            .spawn(move || serve(connection, &queue))
            .map_err(|error| CheckpointError::backend(BACKEND, "start the SQLite writer thread", error))?;
        Ok(Self { jobs })
    }

    /// Queues a put and waits until its batch is committed (or fails).
    pub(super) async fn put(&self, checkpoint: NewCheckpoint) -> PutResult {
        let operation = "store a checkpoint";
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job::Put(Box::new(PendingPut { checkpoint, reply }))).map_err(|_| stopped(operation))?;
        answer.await.map_err(|_| stopped(operation))?
    }

    /// Runs `work` on the write connection, alone, after everything queued before it.
    pub(super) async fn exclusive<T, F>(&self, operation: &'static str, work: F) -> Result<T, CheckpointError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, CheckpointError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Job::Exclusive(Box::new(move |connection| {
            // The caller may have stopped waiting; the work is done either way.
            let _ = reply.send(work(connection));
        }));
        self.jobs.send(job).map_err(|_| stopped(operation))?;
        answer.await.map_err(|_| stopped(operation))?
    }
}

fn stopped(operation: &'static str) -> CheckpointError {
    CheckpointError::backend(BACKEND, operation, WriterStopped)
}

/// The writer thread's loop: until every sender is gone, take the next job; a put starts a batch
/// of the puts queued behind it.
fn serve(mut connection: Connection, queue: &mpsc::Receiver<Job>) {
    let mut next = None;
    loop {
        let job = match next.take() {
            Some(job) => job,
            None => match queue.recv() {
                Ok(job) => job,
                Err(mpsc::RecvError) => return,
            },
        };
        // A panic (a bug) fails only the callers of this job, who find their answer dropped, as
        // a panic on the blocking pool would; the writer goes on with the next one.
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| match job {
            Job::Exclusive(work) => work(&mut connection),
            Job::Put(first) => {
                let (batch, after) = gather(first, queue);
                next = after;
                commit_batch(&mut connection, batch);
            }
        }));
        if outcome.is_err() {
            tracing::error!("the SQLite writer's job panicked; its callers get an error");
            if !connection.is_autocommit() {
                let _ = connection.execute_batch("ROLLBACK");
            }
        }
    }
}

/// The batch that starts with `first`: the puts queued behind it, up to [`MAX_BATCH`] and up to
/// the first job of another kind, which is returned to run after the batch.
pub(super) fn gather(first: Box<PendingPut>, queue: &mpsc::Receiver<Job>) -> (Vec<PendingPut>, Option<Job>) {
    let mut batch = vec![*first];
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(Job::Put(put)) => batch.push(*put),
            Ok(other) => return (batch, Some(other)),
            Err(_) => break,
        }
    }
    (batch, None)
}

/// Stores a batch and answers each of its puts, only after the commit returned.
pub(super) fn commit_batch(connection: &mut Connection, batch: Vec<PendingPut>) {
    let puts = batch.len();
    let (checkpoints, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|put| (put.checkpoint, put.reply)).unzip();
    match store_batch(connection, checkpoints) {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
        Err(cause) => {
            tracing::warn!(puts, error = %cause, "a batch of SQLite checkpoints failed; none of them was stored");
            let cause = Arc::new(cause);
            for reply in replies {
                let failure = BatchFailed { puts, cause: Arc::clone(&cause) };
                let _ = reply.send(Err(CheckpointError::backend(BACKEND, "store a checkpoint", failure)));
            }
        }
    }
}

/// Writes every checkpoint in one transaction, each in its own savepoint, and commits once.
/// `Ok` holds one result per checkpoint (the stored ones are durable); `Err` means nothing of the
/// batch was stored.
pub(super) fn store_batch(connection: &mut Connection, checkpoints: Vec<NewCheckpoint>) -> Result<Vec<PutResult>, CheckpointError> {
    let operation = "commit a batch of checkpoints";
    // IMMEDIATE takes the file's write lock now: no other connection (another handle or process)
    // can move a thread's newest id between a put's check and the commit.
    let mut transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(failed(operation))?;
    let mut results = Vec::with_capacity(checkpoints.len());
    for checkpoint in checkpoints {
        let savepoint = transaction.savepoint().map_err(failed(operation))?;
        let result = queries::put_in(&savepoint, checkpoint);
        match &result {
            Ok(_) => savepoint.commit().map_err(failed(operation))?,
            // Rolls back to the savepoint and releases it. This fails when SQLite already rolled
            // the whole transaction back (some I/O errors do): then the batch fails.
            Err(_) => savepoint.finish().map_err(failed(operation))?,
        }
        results.push(result);
    }
    // A failed COMMIT leaves the transaction to be rolled back when it is dropped.
    transaction.commit().map_err(failed(operation))?;
    Ok(results)
}

//! Unit tests of the SQLite checkpointer's internals: connection settings, how the writer groups
//! queued puts, and what a batch does when one put or the commit fails.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::mpsc;

use chrono::Utc;
use peregrine_graph::checkpoint::CheckpointSource;
use tokio::sync::oneshot;

use super::writer::{Job, MAX_BATCH, PendingPut, commit_batch, gather, store_batch};
use super::*;

fn checkpoint(thread_id: &str, parent_id: Option<u64>, source: CheckpointSource) -> NewCheckpoint {
    NewCheckpoint {
        thread_id: thread_id.to_owned(),
        parent_id,
        source,
        node: None,
        run_id: "run".to_owned(),
        run_step: 0,
        interrupt: None,
        resume: None,
        delta: format!("{thread_id}:{parent_id:?}").into_bytes(),
        snapshot: parent_id.is_none().then(|| b"snapshot".to_vec()),
        created_at: Utc::now(),
    }
}

fn root(thread_id: &str) -> NewCheckpoint {
    checkpoint(thread_id, None, CheckpointSource::Input)
}

fn child(thread_id: &str, parent_id: u64) -> NewCheckpoint {
    checkpoint(thread_id, Some(parent_id), CheckpointSource::Loop)
}

fn pending(checkpoint: NewCheckpoint) -> (PendingPut, oneshot::Receiver<Result<CheckpointMeta, CheckpointError>>) {
    let (reply, answer) = oneshot::channel();
    (PendingPut { checkpoint, reply }, answer)
}

fn rows(connection: &Connection) -> Vec<(String, i64)> {
    let mut statement = connection.prepare("SELECT thread_id, checkpoint_id FROM checkpoints ORDER BY thread_id, checkpoint_id").unwrap();
    statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

#[tokio::test]
async fn every_commit_is_synced_to_disk_and_reads_use_read_only_connections() {
    let dir = tempfile::tempdir().unwrap();
    let checkpointer = SqliteCheckpointer::open(dir.path().join("checkpoints.db")).await.unwrap();
    let (synchronous, busy_timeout) = checkpointer
        .writer
        .exclusive("inspect", |connection| {
            let synchronous: i64 = connection.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap();
            let busy_timeout: i64 = connection.query_row("PRAGMA busy_timeout", [], |row| row.get(0)).unwrap();
            Ok((synchronous, busy_timeout))
        })
        .await
        .unwrap();
    assert_eq!(synchronous, 2, "synchronous=FULL: WAL commits are fsynced before put returns");
    assert_eq!(busy_timeout, 5000);

    let readers = checkpointer.readers.as_ref().expect("a WAL file gets read connections");
    assert_eq!(readers.idle(), READ_CONNECTIONS);
    let (read_only, busy_timeout) = readers
        .with_idle(|connection| {
            let busy_timeout: i64 = connection.query_row("PRAGMA busy_timeout", [], |row| row.get(0)).unwrap();
            (connection.is_readonly(rusqlite::MAIN_DB).unwrap(), busy_timeout)
        })
        .unwrap();
    assert!(read_only, "reads cannot write");
    assert_eq!(busy_timeout, 5000);

    // Every lent connection comes back, also after a failed read.
    let reads: Vec<_> = (0..3 * READ_CONNECTIONS).map(|index| checkpointer.load(if index % 2 == 0 { "t" } else { "u" }, None)).collect();
    for read in futures::future::join_all(reads).await {
        assert!(read.unwrap().is_none());
    }
    let error = readers.run("fail", |_| Err::<(), _>(CheckpointError::ThreadNotFound { thread_id: "x".to_owned() })).await;
    assert!(matches!(error, Err(CheckpointError::ThreadNotFound { .. })));
    assert_eq!(readers.idle(), READ_CONNECTIONS);
}

#[test]
fn in_memory_databases_read_through_the_writer() {
    let checkpointer = SqliteCheckpointer::open_in_memory().unwrap();
    assert!(checkpointer.readers.is_none(), "a private in-memory database cannot be shared with other connections");
}

#[test]
fn the_writer_gathers_the_queued_puts_up_to_the_next_other_job() {
    let (jobs, queue) = mpsc::channel();
    for thread in ["a", "b", "c"] {
        jobs.send(Job::Put(Box::new(pending(root(thread)).0))).unwrap();
    }
    jobs.send(Job::Exclusive(Box::new(|_| {}))).unwrap();
    jobs.send(Job::Put(Box::new(pending(root("d")).0))).unwrap();

    let Ok(Job::Put(first)) = queue.try_recv() else { panic!("a put was queued first") };
    let (batch, after) = gather(first, &queue);
    let threads: Vec<_> = batch.iter().map(|put| put.checkpoint.thread_id.as_str()).collect();
    assert_eq!(threads, ["a", "b", "c"], "queue order, stopping before the delete or copy");
    assert!(matches!(after, Some(Job::Exclusive(_))), "the other job runs right after the batch");
    let Ok(Job::Put(next)) = queue.try_recv() else { panic!("the put behind the other job is still queued") };
    assert_eq!(next.checkpoint.thread_id, "d");
}

#[test]
fn a_batch_holds_at_most_max_batch_puts() {
    let (jobs, queue) = mpsc::channel();
    for index in 0..MAX_BATCH + 10 {
        jobs.send(Job::Put(Box::new(pending(root(&format!("t{index}"))).0))).unwrap();
    }
    let Ok(Job::Put(first)) = queue.try_recv() else { panic!("a put was queued") };
    let (batch, after) = gather(first, &queue);
    assert_eq!(batch.len(), MAX_BATCH);
    assert!(after.is_none());
    assert_eq!(queue.try_iter().count(), 10, "the rest waits for the next batch");
}

#[test]
fn a_put_failing_its_checks_rolls_back_alone_and_the_others_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let mut connection = Connection::open(&path).unwrap();
    queries::prepare(&mut connection).unwrap();

    let results = store_batch(
        &mut connection,
        vec![
            root("t"),
            child("t", 1),
            // Extends checkpoint 1, which the put before it in this same batch already extended.
            child("t", 1),
            root("u"),
            checkpoint("u", Some(99), CheckpointSource::Fork),
            child("t", 2),
            checkpoint("t", Some(1), CheckpointSource::Fork),
        ],
    )
    .unwrap();

    let ids: Vec<_> = results.iter().map(|result| result.as_ref().map(|meta| (meta.checkpoint_id, meta.parent_id)).ok()).collect();
    assert_eq!(ids, [Some((1, None)), Some((2, Some(1))), None, Some((1, None)), None, Some((3, Some(2))), Some((4, Some(1)))]);
    assert!(
        matches!(&results[2], Err(CheckpointError::Conflict { thread_id, expected: Some(1), latest: Some(2) }) if thread_id == "t"),
        "got {:?}",
        results[2]
    );
    assert!(matches!(&results[4], Err(CheckpointError::UnknownParent { parent_id: 99, .. })), "got {:?}", results[4]);

    let other = Connection::open(&path).unwrap();
    let expected = [("t", 1), ("t", 2), ("t", 3), ("t", 4), ("u", 1)].map(|(thread, id)| (thread.to_owned(), id));
    assert_eq!(rows(&other), expected, "committed once the batch returned; the failed puts left nothing");
    assert!(connection.is_autocommit(), "no transaction is left open");
}

#[test]
fn a_failed_commit_fails_every_put_of_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let mut connection = Connection::open(&path).unwrap();
    queries::prepare(&mut connection).unwrap();
    // A rollback journal lets a reader's shared lock make COMMIT fail with SQLITE_BUSY (a WAL
    // commit cannot be made to fail from outside).
    let mode: String = connection.pragma_update_and_check(None, "journal_mode", "DELETE", |row| row.get(0)).unwrap();
    assert_eq!(mode, "delete");
    connection.busy_timeout(Duration::ZERO).unwrap();
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let before: i64 = reader.query_row("SELECT COUNT(*) FROM checkpoints", [], |row| row.get(0)).unwrap();
    assert_eq!(before, 0);

    let (batch, answers): (Vec<_>, Vec<_>) = [root("t"), child("t", 1), root("u"), child("u", 5)].into_iter().map(pending).unzip();
    commit_batch(&mut connection, batch);

    for (index, answer) in answers.into_iter().enumerate() {
        let error = answer.blocking_recv().unwrap().expect_err("no put of a failed commit may succeed");
        assert!(matches!(error, CheckpointError::Backend { backend: "sqlite", .. }), "put {index}: got {error:?}");
        assert!(error.is_retryable());
        let message = format!("{error}: {}", std::error::Error::source(&error).unwrap());
        assert!(message.contains("none of them was stored"), "put {index}: unclear message: {message}");
    }
    reader.execute_batch("COMMIT").unwrap();
    assert!(connection.is_autocommit(), "the failed transaction was rolled back");
    assert_eq!(rows(&reader), Vec::new(), "nothing of the failed batch is stored");

    // The connection goes on working for the next batch.
    let (batch, answers): (Vec<_>, Vec<_>) = [root("t")].into_iter().map(pending).unzip();
    commit_batch(&mut connection, batch);
    assert_eq!(answers.into_iter().next().unwrap().blocking_recv().unwrap().unwrap().checkpoint_id, 1);
    assert_eq!(rows(&reader), [("t".to_owned(), 1)]);
}

#[tokio::test]
async fn a_panicking_job_fails_its_caller_and_the_writer_goes_on() {
    let checkpointer = SqliteCheckpointer::open_in_memory().unwrap();
    let error = checkpointer
        .writer
        .exclusive("panic on purpose", |connection| -> Result<(), CheckpointError> {
            connection.execute_batch("BEGIN IMMEDIATE").unwrap();
            panic!("a bug inside the writer");
        })
        .await
        .expect_err("the caller of a panicked job gets an error");
    assert!(matches!(error, CheckpointError::Backend { backend: "sqlite", .. }), "got {error:?}");
    assert!(error.is_retryable());
    let meta = checkpointer.put(root("t")).await.expect("the writer still works, its transaction rolled back");
    assert_eq!(meta.checkpoint_id, 1);
}

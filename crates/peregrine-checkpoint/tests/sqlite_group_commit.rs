//! `SqliteCheckpointer` under concurrency: many conversations putting at once (their puts are
//! committed together), each put visible to other connections as soon as it returns, ordering
//! within a thread kept, conflicting puts failing alone, reads not waiting for the writer.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;

use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_graph::checkpoint::{CheckpointError, CheckpointSource, Checkpointer, ListQuery, NewCheckpoint};

const THREADS: usize = 48;
const PUTS_PER_THREAD: u64 = 20;

fn checkpoint(thread_id: &str, parent_id: Option<u64>, delta: &str) -> NewCheckpoint {
    NewCheckpoint {
        thread_id: thread_id.to_owned(),
        parent_id,
        source: if parent_id.is_none() { CheckpointSource::Input } else { CheckpointSource::Loop },
        node: parent_id.map(|_| "node".to_owned()),
        run_id: "run".to_owned(),
        run_step: 0,
        interrupt: None,
        resume: None,
        delta: delta.as_bytes().to_vec(),
        snapshot: parent_id.is_none().then(|| b"snapshot".to_vec()),
        created_at: chrono::Utc::now(),
    }
}

/// A connection of its own, as another process would have: it sees committed rows only.
fn outside_connection(path: &Path) -> rusqlite::Connection {
    let connection = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    connection.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    connection
}

fn stored_delta(connection: &rusqlite::Connection, thread_id: &str, checkpoint_id: u64) -> Option<Vec<u8>> {
    use rusqlite::OptionalExtension as _;
    connection
        .query_row(
            "SELECT delta FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2",
            rusqlite::params![thread_id, i64::try_from(checkpoint_id).unwrap()],
            |row| row.get(0),
        )
        .optional()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_on_many_threads_are_committed_before_they_return_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();

    let writers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let checkpointer = checkpointer.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let thread_id = format!("thread-{thread}");
                let outside = outside_connection(&path);
                let mut parent = None;
                for step in 1..=PUTS_PER_THREAD {
                    let delta = format!("{thread_id}/{step}");
                    let meta = checkpointer.put(checkpoint(&thread_id, parent, &delta)).await.unwrap();
                    assert_eq!((meta.checkpoint_id, meta.parent_id), (step, parent), "{thread_id}: ids follow the thread's order");
                    // Returned, so committed: another connection sees it at once, and so do reads.
                    assert_eq!(
                        stored_delta(&outside, &thread_id, step).as_deref(),
                        Some(delta.as_bytes()),
                        "{thread_id}: checkpoint {step} was answered before it was committed"
                    );
                    let loaded = checkpointer.load(&thread_id, None).await.unwrap().expect("the thread exists");
                    assert_eq!(loaded.meta, meta, "{thread_id}: a read after a put sees it");
                    parent = Some(step);
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    drop(checkpointer);

    let reopened = SqliteCheckpointer::open(&path).await.unwrap();
    let threads = reopened.threads().await.unwrap();
    assert_eq!(threads.len(), THREADS);
    assert!(threads.iter().all(|summary| summary.checkpoints == PUTS_PER_THREAD && summary.latest.checkpoint_id == PUTS_PER_THREAD));
    for thread in 0..THREADS {
        let thread_id = format!("thread-{thread}");
        let history = reopened.list(&thread_id, ListQuery::default()).await.unwrap();
        let ids: Vec<_> = history.iter().map(|meta| (meta.checkpoint_id, meta.parent_id)).collect();
        let expected: Vec<_> = (1..=PUTS_PER_THREAD).rev().map(|id| (id, (id > 1).then(|| id - 1))).collect();
        assert_eq!(ids, expected, "{thread_id}: one unbroken chain");
        let loaded = reopened.load(&thread_id, None).await.unwrap().unwrap();
        let deltas: Vec<_> = (2..=PUTS_PER_THREAD).map(|step| format!("{thread_id}/{step}").into_bytes()).collect();
        assert_eq!(loaded.deltas, deltas, "{thread_id}: deltas in the order they were put");
    }
    let rows: i64 = outside_connection(&path).query_row("SELECT COUNT(*) FROM checkpoints", [], |row| row.get(0)).unwrap();
    assert_eq!(rows, i64::try_from(THREADS as u64 * PUTS_PER_THREAD).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_puts_fail_alone_while_puts_queued_beside_them_succeed() {
    const CONTENDERS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("contested", None, "root")).await.unwrap();

    // All at once, so that contenders and bystanders share batches.
    let contenders: Vec<_> = (0..CONTENDERS)
        .map(|index| {
            let checkpointer = checkpointer.clone();
            tokio::spawn(async move { checkpointer.put(checkpoint("contested", Some(1), &format!("contender {index}"))).await })
        })
        .collect();
    let bystanders: Vec<_> = (0..CONTENDERS)
        .map(|index| {
            let checkpointer = checkpointer.clone();
            tokio::spawn(async move { checkpointer.put(checkpoint(&format!("bystander-{index}"), None, "root")).await })
        })
        .collect();

    let mut winners = Vec::new();
    for contender in contenders {
        match contender.await.unwrap() {
            Ok(meta) => winners.push(meta),
            Err(CheckpointError::Conflict { thread_id, expected, latest }) => {
                assert_eq!((thread_id.as_str(), expected, latest), ("contested", Some(1), Some(2)));
            }
            Err(other) => panic!("a losing contender must get Conflict, got {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one put extends checkpoint 1: {winners:?}");
    assert_eq!((winners[0].checkpoint_id, winners[0].parent_id), (2, Some(1)));
    for bystander in bystanders {
        assert_eq!(bystander.await.unwrap().unwrap().checkpoint_id, 1, "a conflict beside it does not fail another put");
    }

    let outside = outside_connection(&path);
    let contested: i64 = outside.query_row("SELECT COUNT(*) FROM checkpoints WHERE thread_id = 'contested'", [], |row| row.get(0)).unwrap();
    assert_eq!(contested, 2, "the losers wrote nothing");
    let winner_delta = stored_delta(&outside, "contested", 2).unwrap();
    assert!(winner_delta.starts_with(b"contender "), "the stored checkpoint is the winner's");
    let bystanders: i64 =
        outside.query_row("SELECT COUNT(*) FROM checkpoints WHERE thread_id LIKE 'bystander-%'", [], |row| row.get(0)).unwrap();
    assert_eq!(bystanders, i64::try_from(CONTENDERS).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_and_copies_keep_their_place_among_puts() {
    let dir = tempfile::tempdir().unwrap();
    let checkpointer = SqliteCheckpointer::open(dir.path().join("checkpoints.db")).await.unwrap();
    for round in 0..10_u64 {
        let thread_id = format!("t{round}");
        let copy = format!("copy{round}");
        // Issued together; each future queues its job only when first polled, in join order.
        let (root, copied, child, deleted, again) = tokio::join!(
            checkpointer.put(checkpoint(&thread_id, None, "root")),
            checkpointer.copy_thread(&thread_id, &copy),
            checkpointer.put(checkpoint(&thread_id, Some(1), "child")),
            checkpointer.delete_thread(&thread_id),
            checkpointer.put(checkpoint(&thread_id, None, "root again")),
        );
        assert_eq!(root.unwrap().checkpoint_id, 1);
        copied.unwrap();
        assert_eq!(child.unwrap().checkpoint_id, 2);
        deleted.unwrap();
        assert_eq!(again.unwrap().checkpoint_id, 1, "ids restart after the delete that was queued before");
        assert_eq!(checkpointer.list(&copy, ListQuery::default()).await.unwrap().len(), 1, "the copy saw only the root");
        assert_eq!(checkpointer.list(&thread_id, ListQuery::default()).await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_do_not_wait_for_a_blocked_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("t", None, "root")).await.unwrap();

    // Another process holds the file's write lock: the writer thread waits for it.
    let other_process = rusqlite::Connection::open(&path).unwrap();
    other_process.execute_batch("BEGIN IMMEDIATE").unwrap();
    let put = tokio::spawn({
        let checkpointer = checkpointer.clone();
        async move { checkpointer.put(checkpoint("t", Some(1), "child")).await }
    });
    let loaded = checkpointer.load("t", None).await.unwrap().unwrap();
    assert_eq!(loaded.meta.checkpoint_id, 1, "reads see the committed state");
    assert_eq!(checkpointer.threads().await.unwrap().len(), 1);
    assert!(!put.is_finished(), "the put cannot commit while the write lock is held elsewhere");

    other_process.execute_batch("COMMIT").unwrap();
    assert_eq!(put.await.unwrap().unwrap().checkpoint_id, 2);
    assert_eq!(checkpointer.load("t", None).await.unwrap().unwrap().meta.checkpoint_id, 2);
}

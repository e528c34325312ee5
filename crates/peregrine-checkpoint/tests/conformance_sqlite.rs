//! Runs the checkpoint conformance suite against `SqliteCheckpointer` (each case on a fresh
//! temporary file, and the whole suite in memory), plus durability across reopening, schema
//! versioning and corrupt-data handling.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;

use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_checkpoint::conformance;
use peregrine_checkpoint::sqlite::SCHEMA_VERSION;
use peregrine_graph::checkpoint::{CheckpointError, CheckpointSource, Checkpointer, ListQuery, NewCheckpoint};
use tempfile::TempDir;

async fn open_fresh_file() -> (TempDir, SqliteCheckpointer) {
    let dir = tempfile::tempdir().unwrap();
    let checkpointer = SqliteCheckpointer::open(dir.path().join("checkpoints.db")).await.unwrap();
    (dir, checkpointer)
}

/// One test per case, each on its own new database file.
macro_rules! conformance_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (_dir, checkpointer) = open_fresh_file().await;
                conformance::$case(checkpointer).await;
            }
        )*
    };
}

conformance_cases!(
    put_assigns_ids_and_round_trips,
    put_validates_parent_and_snapshot,
    non_fork_puts_must_extend_the_tip,
    load_resolves_nearest_snapshot,
    load_follows_branches,
    list_newest_first,
    threads_summarize_newest_first,
    delete_thread_removes_only_that_thread,
    copy_thread_copies_everything,
    interrupts_and_resumes_persist,
    concurrent_writers_lose_nothing,
    lock_thread_is_exclusive,
    is_thread_locked_probes_without_locking,
    large_history_loads_every_delta,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes_in_memory() {
    conformance::run_all(|| async { SqliteCheckpointer::open_in_memory().unwrap() }).await;
}

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

fn raw_connection(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[tokio::test]
async fn checkpoints_survive_closing_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let first = SqliteCheckpointer::open(&path).await.unwrap();
    let root = first.put(checkpoint("t", None, "root")).await.unwrap();
    let child = first.put(checkpoint("t", Some(1), "child")).await.unwrap();
    first.put(checkpoint("other", None, "root")).await.unwrap();
    drop(first);

    let reopened = SqliteCheckpointer::open(&path).await.unwrap();
    assert_eq!(reopened.list("t", ListQuery::default()).await.unwrap(), vec![child.clone(), root]);
    let loaded = reopened.load("t", None).await.unwrap().unwrap();
    assert_eq!(loaded.meta, child);
    assert_eq!(loaded.snapshot, b"snapshot");
    assert_eq!(loaded.deltas, vec![b"child".to_vec()]);
    assert_eq!(reopened.threads().await.unwrap().len(), 2);
    assert_eq!(reopened.put(checkpoint("t", Some(2), "more")).await.unwrap().checkpoint_id, 3, "ids continue after reopening");
}

#[tokio::test]
async fn file_is_in_wal_mode_with_schema_version_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    let raw = raw_connection(&path);
    let mode: String = raw.query_row("PRAGMA journal_mode", [], |row| row.get(0)).unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = raw.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    drop(checkpointer);
    drop(SqliteCheckpointer::open(&path).await.unwrap());
    let versions: i64 = raw.query_row("SELECT COUNT(*) FROM schema_version", [], |row| row.get(0)).unwrap();
    assert_eq!(versions, 1, "reopening records the version once");
}

#[tokio::test]
async fn newer_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("t", None, "root")).await.unwrap();
    drop(checkpointer);
    raw_connection(&path).execute("UPDATE schema_version SET version = ?1", [SCHEMA_VERSION + 1]).unwrap();

    let error = SqliteCheckpointer::open(&path).await.expect_err("a file from a newer version must be refused");
    let CheckpointError::UnsupportedSchema { backend: "sqlite", found, supported } = &error else {
        panic!("expected an unsupported-schema error, got {error:?}");
    };
    assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
    assert!(!error.is_retryable(), "retrying cannot help");
    let message = error.to_string();
    assert!(message.contains("schema version 2") && message.contains("upgrade Peregrine"), "unclear message: {message}");

    let version: i64 = raw_connection(&path).query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION + 1, "a refused file is left unchanged");
}

#[tokio::test]
async fn corrupt_metadata_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("t", None, "root")).await.unwrap();
    raw_connection(&path).execute("UPDATE checkpoints SET meta = '{not json' WHERE thread_id = 't'", []).unwrap();

    let error = checkpointer.load("t", None).await.expect_err("corrupt metadata cannot load");
    assert!(matches!(&error, CheckpointError::Corrupt { thread_id, .. } if thread_id == "t"), "got {error:?}");
    let error = checkpointer.list("t", ListQuery::default()).await.expect_err("corrupt metadata cannot list");
    assert!(matches!(error, CheckpointError::Corrupt { .. }), "got {error:?}");
}

#[tokio::test]
async fn missing_snapshot_on_the_chain_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("t", None, "root")).await.unwrap();
    checkpointer.put(checkpoint("t", Some(1), "child")).await.unwrap();
    raw_connection(&path).execute("UPDATE checkpoints SET snapshot = NULL WHERE checkpoint_id = 1", []).unwrap();

    let error = checkpointer.load("t", Some(2)).await.expect_err("a chain without a snapshot cannot load");
    assert!(matches!(error, CheckpointError::Corrupt { .. }), "got {error:?}");
}

#[tokio::test]
async fn copy_rewrites_the_thread_id_in_stored_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    checkpointer.put(checkpoint("from", None, "root")).await.unwrap();
    checkpointer.copy_thread("from", "to").await.unwrap();
    let stored: String = raw_connection(&path)
        .query_row("SELECT meta ->> '$.thread_id' FROM checkpoints WHERE thread_id = 'to'", [], |row| row.get(0))
        .unwrap();
    assert_eq!(stored, "to");
}

#[tokio::test]
async fn clones_share_locks_but_separate_handles_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let checkpointer = SqliteCheckpointer::open(&path).await.unwrap();
    let clone = checkpointer.clone();
    let held = checkpointer.lock_thread("t").await.unwrap();
    assert!(clone.is_thread_locked("t").await.unwrap(), "a clone sees the lock as held");
    assert!(matches!(clone.lock_thread("t").await, Err(CheckpointError::ThreadBusy { .. })));
    // The documented limit of the embedded backend: locks are per opened handle.
    let separate = SqliteCheckpointer::open(&path).await.unwrap();
    assert!(!separate.is_thread_locked("t").await.unwrap(), "a separate handle does not see the lock");
    let _separate_lock = separate.lock_thread("t").await.unwrap();
    drop(held);
    assert!(!clone.is_thread_locked("t").await.unwrap(), "a dropped lock is free at once");
    let _retaken = clone.lock_thread("t").await.expect("a dropped lock is free at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_assign_unique_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    let first = SqliteCheckpointer::open(&path).await.unwrap();
    let second = SqliteCheckpointer::open(&path).await.unwrap();
    first.put(checkpoint("t", None, "root")).await.unwrap();
    let writers = [first, second].map(|handle| {
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..20 {
                let branch = NewCheckpoint { source: CheckpointSource::Fork, ..checkpoint("t", Some(1), "branch") };
                ids.push(handle.put(branch).await.unwrap().checkpoint_id);
            }
            ids
        })
    });
    let mut ids = Vec::new();
    for writer in writers {
        ids.extend(writer.await.unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, (2..=41).collect::<Vec<u64>>(), "the write transaction makes max+1 atomic across connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_extending_the_same_tip_let_exactly_one_through() {
    const ROUNDS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.db");
    // Separately opened handles, as two processes have: neither sees the other's thread lock.
    let first = SqliteCheckpointer::open(&path).await.unwrap();
    let second = SqliteCheckpointer::open(&path).await.unwrap();
    first.put(checkpoint("t", None, "root")).await.unwrap();
    let _first_lock = first.lock_thread("t").await.unwrap();
    let _second_lock = second.lock_thread("t").await.unwrap();

    for round in 1..=ROUNDS {
        let tip = first.load("t", None).await.unwrap().unwrap().meta.checkpoint_id;
        assert_eq!(second.load("t", None).await.unwrap().unwrap().meta.checkpoint_id, tip, "both handles read the same tip");
        assert_eq!(tip, round);
        let (a, b) = tokio::join!(
            tokio::spawn({
                let first = first.clone();
                async move { first.put(checkpoint("t", Some(tip), "first")).await }
            }),
            tokio::spawn({
                let second = second.clone();
                async move { second.put(checkpoint("t", Some(tip), "second")).await }
            }),
        );
        let (winner, loser) = match (a.unwrap(), b.unwrap()) {
            (Ok(meta), Err(error)) | (Err(error), Ok(meta)) => (meta, error),
            other => panic!("round {round}: exactly one of two puts extending checkpoint {tip} must succeed, got {other:?}"),
        };
        assert_eq!((winner.checkpoint_id, winner.parent_id), (tip + 1, Some(tip)));
        assert!(
            matches!(&loser, CheckpointError::Conflict { thread_id, expected, latest } if thread_id == "t" && *expected == Some(tip) && *latest == Some(tip + 1)),
            "round {round}: the slower writer must get Conflict, got {loser:?}"
        );
        assert!(loser.is_retryable());
    }

    let history = second.list("t", ListQuery::default()).await.unwrap();
    assert_eq!(history.len() as u64, ROUNDS + 1, "only the winners are stored");
    assert!(history.windows(2).all(|pair| pair[0].parent_id == Some(pair[1].checkpoint_id)), "one unbroken chain: {history:?}");
}

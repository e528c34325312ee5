//! Runs the checkpoint conformance suite against `MemoryCheckpointer`, plus what is particular to it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use peregrine_checkpoint::MemoryCheckpointer;
use peregrine_checkpoint::conformance;
use peregrine_graph::checkpoint::{CheckpointError, CheckpointSource, Checkpointer, NewCheckpoint};

/// One test per case, so that a failure names its case and the rest still run.
macro_rules! conformance_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                conformance::$case(MemoryCheckpointer::new()).await;
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
async fn run_all_passes() {
    conformance::run_all(|| async { MemoryCheckpointer::new() }).await;
}

fn first_checkpoint(thread_id: &str) -> NewCheckpoint {
    NewCheckpoint {
        thread_id: thread_id.to_owned(),
        parent_id: None,
        source: CheckpointSource::Input,
        node: None,
        run_id: "run".to_owned(),
        run_step: 0,
        interrupt: None,
        resume: None,
        delta: b"delta".to_vec(),
        snapshot: Some(b"snapshot".to_vec()),
        created_at: chrono::Utc::now(),
    }
}

#[tokio::test]
async fn clones_share_checkpoints_and_locks() {
    let checkpointer = MemoryCheckpointer::new();
    let clone = checkpointer.clone();
    checkpointer.put(first_checkpoint("t")).await.unwrap();
    assert_eq!(clone.load("t", None).await.unwrap().unwrap().meta.checkpoint_id, 1);

    let held = checkpointer.lock_thread("t").await.unwrap();
    assert!(clone.is_thread_locked("t").await.unwrap(), "a clone sees the lock as held");
    assert!(matches!(clone.lock_thread("t").await, Err(CheckpointError::ThreadBusy { .. })));
    drop(held);
    assert!(!clone.is_thread_locked("t").await.unwrap(), "a dropped lock is free at once");
    let _retaken = clone.lock_thread("t").await.expect("a dropped lock is free at once");
}

#[tokio::test]
async fn separate_checkpointers_are_independent() {
    let first = MemoryCheckpointer::new();
    let second = MemoryCheckpointer::default();
    first.put(first_checkpoint("t")).await.unwrap();
    assert!(second.load("t", None).await.unwrap().is_none());
    let _held = first.lock_thread("t").await.unwrap();
    assert!(!second.is_thread_locked("t").await.unwrap(), "locks belong to one checkpointer");
    let _other = second.lock_thread("t").await.expect("locks belong to one checkpointer");
}

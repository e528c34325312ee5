//! The conformance suite every [`Checkpointer`] backend must pass: call [`run_all`] with a factory
//! of fresh, empty checkpointers, or call the cases one by one.
//!
//! Each case takes a fresh, empty checkpointer (it lists every thread, so it must see no data of
//! other cases) and panics with a message naming the case when the backend breaks the contract.
//! Timestamps in the suite have microsecond precision, so a backend must keep at least that.
//! Run it on a multi-threaded tokio runtime so that the concurrency case really runs in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a conformance suite reports failures by panicking")]

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::FutureExt;
use peregrine_graph::checkpoint::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, ListQuery, LoadedCheckpoint, NewCheckpoint,
    PendingInterrupt, ResumeRecord,
};
use serde_json::json;

/// Runs every case, each on a fresh checkpointer from `make`; panics naming the first failing case.
pub async fn run_all<C, F, Fut>(make: F)
where
    C: Checkpointer,
    F: Fn() -> Fut,
    Fut: Future<Output = C>,
{
    put_assigns_ids_and_round_trips(make().await).await;
    put_validates_parent_and_snapshot(make().await).await;
    non_fork_puts_must_extend_the_tip(make().await).await;
    load_resolves_nearest_snapshot(make().await).await;
    load_follows_branches(make().await).await;
    list_newest_first(make().await).await;
    threads_summarize_newest_first(make().await).await;
    delete_thread_removes_only_that_thread(make().await).await;
    copy_thread_copies_everything(make().await).await;
    interrupts_and_resumes_persist(make().await).await;
    concurrent_writers_lose_nothing(make().await).await;
    lock_thread_is_exclusive(make().await).await;
    is_thread_locked_probes_without_locking(make().await).await;
    large_history_loads_every_delta(make().await).await;
}

/// Runs `body`, turning a panic inside it into one that names `case`.
async fn case(case: &str, body: impl Future<Output = ()>) {
    if let Err(panic) = AssertUnwindSafe(body).catch_unwind().await {
        panic!("checkpoint conformance case `{case}` failed: {}", panic_message(panic.as_ref()));
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(panic without a message)")
}

/// A fixed instant with microseconds, `seconds` after the suite's epoch.
fn at(seconds: i64) -> DateTime<Utc> {
    let epoch = DateTime::parse_from_rfc3339("2025-03-04T05:06:07.123456Z").expect("valid timestamp").with_timezone(&Utc);
    epoch + TimeDelta::seconds(seconds)
}

/// The delta the suite writes for the checkpoint labelled `label` of `thread_id`.
fn delta(thread_id: &str, label: &str) -> Vec<u8> {
    format!("delta {thread_id}/{label}").into_bytes()
}

/// The snapshot the suite writes for the checkpoint labelled `label` of `thread_id`.
fn snapshot(thread_id: &str, label: &str) -> Vec<u8> {
    format!("snapshot {thread_id}/{label}").into_bytes()
}

/// A checkpoint labelled `label`: a snapshot when it has no parent, else a delta only.
fn checkpoint(thread_id: &str, parent_id: Option<CheckpointId>, label: &str, created_at: DateTime<Utc>) -> NewCheckpoint {
    NewCheckpoint {
        thread_id: thread_id.to_owned(),
        parent_id,
        source: if parent_id.is_none() { CheckpointSource::Input } else { CheckpointSource::Loop },
        node: parent_id.map(|_| format!("node-{label}")),
        run_id: format!("run-{thread_id}"),
        run_step: parent_id.map_or(0, |id| u32::try_from(id).unwrap_or(u32::MAX)),
        interrupt: None,
        resume: None,
        delta: delta(thread_id, label),
        snapshot: parent_id.is_none().then(|| snapshot(thread_id, label)),
        created_at,
    }
}

/// The same checkpoint written as a fork, which may follow any existing checkpoint.
fn forked(mut checkpoint: NewCheckpoint) -> NewCheckpoint {
    checkpoint.source = CheckpointSource::Fork;
    checkpoint
}

/// The same checkpoint, carrying a snapshot as well.
fn with_snapshot(mut checkpoint: NewCheckpoint, label: &str) -> NewCheckpoint {
    checkpoint.snapshot = Some(snapshot(&checkpoint.thread_id, label));
    checkpoint
}

async fn put<C: Checkpointer>(checkpointer: &C, checkpoint: NewCheckpoint) -> CheckpointMeta {
    let expected_thread = checkpoint.thread_id.clone();
    match checkpointer.put(checkpoint).await {
        Ok(meta) => meta,
        Err(error) => panic!("put into thread '{expected_thread}' failed: {error}"),
    }
}

/// Puts a chain of delta-only `Loop` checkpoints under `parent_id` (which must be the thread's
/// newest), labelled by `labels`; returns their metadata.
async fn put_chain<C: Checkpointer>(checkpointer: &C, thread_id: &str, parent_id: CheckpointId, labels: &[&str]) -> Vec<CheckpointMeta> {
    put_labelled(checkpointer, thread_id, parent_id, labels, CheckpointSource::Loop).await
}

/// Like [`put_chain`], but the first checkpoint is a `Fork`, so `parent_id` may be any
/// checkpoint: a new branch, as time travel writes it.
async fn put_branch<C: Checkpointer>(checkpointer: &C, thread_id: &str, parent_id: CheckpointId, labels: &[&str]) -> Vec<CheckpointMeta> {
    put_labelled(checkpointer, thread_id, parent_id, labels, CheckpointSource::Fork).await
}

async fn put_labelled<C: Checkpointer>(
    checkpointer: &C,
    thread_id: &str,
    mut parent_id: CheckpointId,
    labels: &[&str],
    first_source: CheckpointSource,
) -> Vec<CheckpointMeta> {
    let mut metas = Vec::new();
    for label in labels {
        let mut next = checkpoint(thread_id, Some(parent_id), label, at(i64::try_from(parent_id).unwrap_or(0) + 1));
        if metas.is_empty() {
            next.source = first_source;
        }
        let meta = put(checkpointer, next).await;
        parent_id = meta.checkpoint_id;
        metas.push(meta);
    }
    metas
}

async fn load<C: Checkpointer>(checkpointer: &C, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> LoadedCheckpoint {
    match checkpointer.load(thread_id, checkpoint_id).await {
        Ok(Some(loaded)) => loaded,
        Ok(None) => panic!("load('{thread_id}', {checkpoint_id:?}) found nothing, but that checkpoint was stored"),
        Err(error) => panic!("load('{thread_id}', {checkpoint_id:?}) failed: {error}"),
    }
}

async fn list<C: Checkpointer>(checkpointer: &C, thread_id: &str, query: ListQuery) -> Vec<CheckpointMeta> {
    checkpointer.list(thread_id, query).await.unwrap_or_else(|error| panic!("list('{thread_id}', {query:?}) failed: {error}"))
}

fn ids(metas: &[CheckpointMeta]) -> Vec<CheckpointId> {
    metas.iter().map(|meta| meta.checkpoint_id).collect()
}

/// Checks that `loaded` is checkpoint `id` rebuilt from the snapshot labelled `snapshot_label`
/// plus the deltas labelled `delta_labels`, in that order.
fn assert_resolved(loaded: &LoadedCheckpoint, thread_id: &str, id: CheckpointId, snapshot_label: &str, delta_labels: &[&str]) {
    assert_eq!(loaded.meta.checkpoint_id, id, "load returned checkpoint {} instead of {id}", loaded.meta.checkpoint_id);
    assert_eq!(
        String::from_utf8_lossy(&loaded.snapshot),
        String::from_utf8_lossy(&snapshot(thread_id, snapshot_label)),
        "checkpoint {id} must be rebuilt from the nearest snapshot on its parent chain"
    );
    let got: Vec<String> = loaded.deltas.iter().map(|delta| String::from_utf8_lossy(delta).into_owned()).collect();
    let want: Vec<String> = delta_labels.iter().map(|label| String::from_utf8_lossy(&delta(thread_id, label)).into_owned()).collect();
    assert_eq!(got, want, "checkpoint {id} must carry the deltas after its snapshot along its parent chain, oldest first");
}

/// Ids are 1, 2, 3… per thread; `put` returns `NewCheckpoint::meta(id)` unchanged (no re-stamped
/// time); `load` finds the newest or a given checkpoint, `None` for what does not exist; metadata
/// and binary payloads (all byte values, empty delta, empty snapshot) round-trip exactly.
pub async fn put_assigns_ids_and_round_trips<C: Checkpointer>(checkpointer: C) {
    case("put_assigns_ids_and_round_trips", async {
        let c = &checkpointer;
        let first = checkpoint("t", None, "a", at(0));
        let meta = put(c, first.clone()).await;
        assert_eq!(meta, first.meta(1), "the first checkpoint of a thread gets id 1 and exactly the given metadata");

        let mut second = checkpoint("t", Some(1), "b", at(1));
        second.delta = (0..=255).collect();
        second.node = None;
        second.source = CheckpointSource::Update;
        second.run_id = "run-ß-🦀".to_owned();
        second.run_step = u32::MAX;
        let meta = put(c, second.clone()).await;
        assert_eq!(meta, second.meta(2), "the second checkpoint gets id 2 and exactly the given metadata");

        let mut third = checkpoint("t", Some(2), "c", at(-5));
        third.delta = Vec::new();
        third.snapshot = Some(Vec::new());
        third.source = CheckpointSource::Fork;
        let meta = put(c, third.clone()).await;
        assert_eq!(meta, third.meta(3), "created_at must be kept as given, even when older than the parent's");

        let other = put(c, checkpoint("other", None, "a", at(9))).await;
        assert_eq!(other.checkpoint_id, 1, "ids are counted per thread");

        let newest = load(c, "t", None).await;
        assert_eq!(newest.meta, third.meta(3), "load(None) returns the checkpoint with the highest id");
        assert_eq!(newest.snapshot, Vec::<u8>::new(), "an empty snapshot is a snapshot, not a missing one");
        assert!(newest.deltas.is_empty(), "a checkpoint with its own snapshot loads with no deltas");

        let loaded = load(c, "t", Some(2)).await;
        assert_eq!(loaded.meta, second.meta(2), "metadata round-trips exactly");
        assert_eq!(loaded.snapshot, snapshot("t", "a"));
        assert_eq!(loaded.deltas, vec![(0..=255).collect::<Vec<u8>>()], "binary deltas round-trip byte for byte");

        let loaded = load(c, "t", Some(1)).await;
        assert_eq!(loaded, LoadedCheckpoint { meta: first.meta(1), snapshot: snapshot("t", "a"), deltas: Vec::new() });

        for (thread_id, checkpoint_id) in
            [("t", Some(4)), ("t", Some(0)), ("t", Some(CheckpointId::MAX)), ("missing", None), ("missing", Some(1))]
        {
            let found = c
                .load(thread_id, checkpoint_id)
                .await
                .unwrap_or_else(|error| panic!("load of a missing checkpoint must be Ok(None): {error}"));
            assert!(found.is_none(), "load('{thread_id}', {checkpoint_id:?}) must be None, got {found:?}");
        }
    })
    .await;
}

/// A checkpoint without a parent must carry a snapshot (`MissingSnapshot`); a parent must exist in
/// the same thread (`UnknownParent`); a refused put stores nothing and uses up no id.
pub async fn put_validates_parent_and_snapshot<C: Checkpointer>(checkpointer: C) {
    case("put_validates_parent_and_snapshot", async {
        let c = &checkpointer;
        let mut no_snapshot = checkpoint("t", None, "a", at(0));
        no_snapshot.snapshot = None;
        let result = c.put(no_snapshot.clone()).await;
        assert!(
            matches!(&result, Err(CheckpointError::MissingSnapshot { thread_id }) if thread_id == "t"),
            "the first checkpoint without a snapshot must fail with MissingSnapshot, got {result:?}"
        );

        let result = c.put(checkpoint("t", Some(1), "b", at(1))).await;
        assert!(
            matches!(&result, Err(CheckpointError::UnknownParent { thread_id, parent_id: 1 }) if thread_id == "t"),
            "a parent in an empty thread must fail with UnknownParent, got {result:?}"
        );
        assert!(list(c, "t", ListQuery::default()).await.is_empty(), "refused puts must store nothing");

        put(c, checkpoint("t", None, "a", at(0))).await;
        put(c, checkpoint("other", None, "a", at(0))).await;
        put_chain(c, "other", 1, &["b", "c"]).await;

        let result = c.put(checkpoint("t", Some(3), "x", at(1))).await;
        assert!(
            matches!(&result, Err(CheckpointError::UnknownParent { thread_id, parent_id: 3 }) if thread_id == "t"),
            "a parent that exists only in another thread must fail with UnknownParent, got {result:?}"
        );
        let result = c.put(checkpoint("t", Some(2), "x", at(1))).await;
        assert!(
            matches!(&result, Err(CheckpointError::UnknownParent { thread_id, parent_id: 2 }) if thread_id == "t"),
            "a parent that does not exist must fail with UnknownParent, got {result:?}"
        );
        let result = c.put(no_snapshot).await;
        assert!(
            matches!(&result, Err(CheckpointError::MissingSnapshot { thread_id }) if thread_id == "t"),
            "a checkpoint without a parent must carry a snapshot even in an existing thread, got {result:?}"
        );

        let meta = put(c, checkpoint("t", Some(1), "b", at(1))).await;
        assert_eq!(meta.checkpoint_id, 2, "refused puts must not use up ids");
        assert_eq!(ids(&list(c, "t", ListQuery::default()).await), vec![2, 1]);
        assert_eq!(ids(&list(c, "other", ListQuery::default()).await), vec![3, 2, 1], "refused puts must not touch other threads");
    })
    .await;
}

/// Every source but `Fork` must extend the thread's newest checkpoint (or start an empty thread);
/// otherwise `put` fails with a retryable `Conflict` naming the parent it was given and the
/// actual newest, and stores nothing. A fork may follow any checkpoint; once it has, the old
/// branch's tip is no longer the newest and cannot be extended without another fork. A parent
/// that does not exist stays `UnknownParent`, whatever the source.
pub async fn non_fork_puts_must_extend_the_tip<C: Checkpointer>(checkpointer: C) {
    case("non_fork_puts_must_extend_the_tip", async {
        let c = &checkpointer;
        // Any source may start an empty thread.
        let mut root = checkpoint("t", None, "1", at(0));
        root.source = CheckpointSource::Loop;
        put(c, root).await;
        put_chain(c, "t", 1, &["2", "3"]).await;
        let before = list(c, "t", ListQuery::default()).await;

        let non_fork = [CheckpointSource::Input, CheckpointSource::Loop, CheckpointSource::Resume, CheckpointSource::Update];
        for source in non_fork {
            for parent_id in [Some(1), Some(2), None] {
                let mut stale = checkpoint("t", parent_id, "stale", at(9));
                stale.source = source;
                let result = c.put(stale).await;
                assert_conflict(
                    &result,
                    "t",
                    parent_id,
                    Some(3),
                    &format!("a {source:?} put following {parent_id:?} while 3 is the newest"),
                );
            }
        }
        let result = c.put(checkpoint("t", Some(99), "nowhere", at(9))).await;
        assert!(
            matches!(&result, Err(CheckpointError::UnknownParent { thread_id, parent_id: 99 }) if thread_id == "t"),
            "a non-fork put naming a checkpoint that does not exist must fail with UnknownParent, not Conflict, got {result:?}"
        );
        assert_eq!(list(c, "t", ListQuery::default()).await, before, "refused puts store nothing");
        assert_eq!(load(c, "t", None).await.meta.checkpoint_id, 3, "refused puts leave the newest checkpoint");
        let other = put(c, checkpoint("other", None, "1", at(0))).await;
        assert_eq!(other.checkpoint_id, 1, "another thread's newest checkpoint does not matter");

        let fork = put(c, forked(checkpoint("t", Some(2), "fork", at(4)))).await;
        assert_eq!((fork.checkpoint_id, fork.parent_id), (4, Some(2)), "a fork may follow an older checkpoint; refused puts use up no id");
        let extended = put_chain(c, "t", 4, &["5"]).await;
        assert_eq!(extended[0].checkpoint_id, 5, "the fork is the newest checkpoint and can be extended");

        let result = c.put(checkpoint("t", Some(3), "old branch", at(6))).await;
        assert_conflict(&result, "t", Some(3), Some(5), "a Loop put on the old branch's tip after a fork");
        let result = c.put(checkpoint("t", Some(4), "behind", at(6))).await;
        assert_conflict(&result, "t", Some(4), Some(5), "a Loop put on the fork's first checkpoint once it was extended");
        assert_eq!(ids(&list(c, "t", ListQuery::default()).await), vec![5, 4, 3, 2, 1], "refused puts store nothing");

        let revived = put(c, forked(checkpoint("t", Some(3), "revived", at(7)))).await;
        assert_eq!((revived.checkpoint_id, revived.parent_id), (6, Some(3)), "the old branch is continued with a fork");
        let result = c.put(forked(checkpoint("t", Some(7), "missing", at(8)))).await;
        assert!(
            matches!(&result, Err(CheckpointError::UnknownParent { thread_id, parent_id: 7 }) if thread_id == "t"),
            "a fork must still name an existing checkpoint, got {result:?}"
        );
    })
    .await;
}

/// Checks that `result` is the `Conflict` of a put into `thread` that named `expected` while
/// `latest` was the newest checkpoint.
fn assert_conflict(
    result: &Result<CheckpointMeta, CheckpointError>,
    thread: &str,
    expected: Option<CheckpointId>,
    latest: Option<CheckpointId>,
    what: &str,
) {
    let Err(error @ CheckpointError::Conflict { thread_id, expected: got_expected, latest: got_latest }) = result else {
        panic!("{what} must fail with Conflict, got {result:?}");
    };
    assert_eq!(
        (thread_id.as_str(), *got_expected, *got_latest),
        (thread, expected, latest),
        "{what}: Conflict must name the thread, the parent the put named and the actual newest checkpoint"
    );
    assert!(error.is_retryable(), "Conflict is retryable: reload the thread and try again");
    assert!(error.to_string().contains("changed by another run"), "{what}: unclear message: {error}");
}

/// `load` rebuilds from the nearest snapshot on the chain: its own (no deltas) or an ancestor's
/// followed by the deltas after it, oldest first, ending with its own.
pub async fn load_resolves_nearest_snapshot<C: Checkpointer>(checkpointer: C) {
    case("load_resolves_nearest_snapshot", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "1", at(0))).await;
        put_chain(c, "t", 1, &["2", "3"]).await;
        put(c, with_snapshot(checkpoint("t", Some(3), "4", at(4)), "4")).await;
        put_chain(c, "t", 4, &["5", "6"]).await;

        assert_resolved(&load(c, "t", Some(1)).await, "t", 1, "1", &[]);
        assert_resolved(&load(c, "t", Some(2)).await, "t", 2, "1", &["2"]);
        assert_resolved(&load(c, "t", Some(3)).await, "t", 3, "1", &["2", "3"]);
        assert_resolved(&load(c, "t", Some(4)).await, "t", 4, "4", &[]);
        assert_resolved(&load(c, "t", Some(5)).await, "t", 5, "4", &["5"]);
        assert_resolved(&load(c, "t", Some(6)).await, "t", 6, "4", &["5", "6"]);
        assert_resolved(&load(c, "t", None).await, "t", 6, "4", &["5", "6"]);
    })
    .await;
}

/// Forks (puts with source `Fork`) make branches: a checkpoint's deltas come from its parent
/// chain, never from a sibling branch with lower ids; `load(None)` is still the highest id,
/// whatever its branch.
pub async fn load_follows_branches<C: Checkpointer>(checkpointer: C) {
    case("load_follows_branches", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "1", at(0))).await;
        put_chain(c, "t", 1, &["2", "3"]).await;
        put_branch(c, "t", 2, &["4"]).await;
        assert_resolved(&load(c, "t", Some(4)).await, "t", 4, "1", &["2", "4"]);
        assert_resolved(&load(c, "t", Some(3)).await, "t", 3, "1", &["2", "3"]);

        put_branch(c, "t", 3, &["5"]).await;
        put_branch(c, "t", 1, &["6"]).await;
        put_branch(c, "t", 4, &["7"]).await;
        assert_resolved(&load(c, "t", Some(5)).await, "t", 5, "1", &["2", "3", "5"]);
        assert_resolved(&load(c, "t", Some(6)).await, "t", 6, "1", &["6"]);
        assert_resolved(&load(c, "t", Some(7)).await, "t", 7, "1", &["2", "4", "7"]);
        assert_resolved(&load(c, "t", None).await, "t", 7, "1", &["2", "4", "7"]);

        // The branch point holds a snapshot: the fork starts from it.
        put(c, checkpoint("s", None, "1", at(0))).await;
        put(c, with_snapshot(checkpoint("s", Some(1), "2", at(1)), "2")).await;
        put_chain(c, "s", 2, &["3"]).await;
        put_branch(c, "s", 2, &["4", "5"]).await;
        assert_resolved(&load(c, "s", Some(4)).await, "s", 4, "2", &["4"]);
        assert_resolved(&load(c, "s", Some(5)).await, "s", 5, "2", &["4", "5"]);
        assert_resolved(&load(c, "s", Some(3)).await, "s", 3, "2", &["3"]);
    })
    .await;
}

/// `list` is newest first, `before` is exclusive, `limit` is respected, and an unknown thread
/// lists nothing.
pub async fn list_newest_first<C: Checkpointer>(checkpointer: C) {
    case("list_newest_first", async {
        let c = &checkpointer;
        let mut stored = vec![put(c, checkpoint("t", None, "1", at(0))).await];
        stored.extend(put_chain(c, "t", 1, &["2", "3", "4", "5"]).await);
        put(c, checkpoint("other", None, "1", at(0))).await;
        stored.reverse();

        assert_eq!(list(c, "t", ListQuery::default()).await, stored, "list returns every checkpoint's metadata, newest first");
        let cases: [(Option<CheckpointId>, Option<usize>, Vec<CheckpointId>); 9] = [
            (Some(4), None, vec![3, 2, 1]),
            (None, Some(2), vec![5, 4]),
            (Some(4), Some(2), vec![3, 2]),
            (Some(1), None, vec![]),
            (Some(2), Some(5), vec![1]),
            (None, Some(0), vec![]),
            (None, Some(100), vec![5, 4, 3, 2, 1]),
            (Some(100), None, vec![5, 4, 3, 2, 1]),
            (Some(CheckpointId::MAX), Some(1), vec![5]),
        ];
        for (before, limit, want) in cases {
            let query = ListQuery { before, limit };
            assert_eq!(ids(&list(c, "t", query).await), want, "list with {query:?}");
        }
        assert!(list(c, "missing", ListQuery::default()).await.is_empty(), "an unknown thread lists nothing");
    })
    .await;
}

/// `threads` gives one summary per thread (its newest checkpoint and the count), the most
/// recently updated first, ties broken by thread id.
pub async fn threads_summarize_newest_first<C: Checkpointer>(checkpointer: C) {
    case("threads_summarize_newest_first", async {
        let c = &checkpointer;
        assert!(c.threads().await.expect("threads").is_empty(), "an empty checkpointer has no threads");

        put(c, checkpoint("a", None, "1", at(0))).await;
        let a_latest = put(c, checkpoint("a", Some(1), "2", at(30))).await;
        let c_latest = put(c, checkpoint("c", None, "1", at(50))).await;
        put(c, checkpoint("b", None, "1", at(10))).await;
        put(c, checkpoint("b", Some(1), "2", at(20))).await;
        let b_latest = put(c, checkpoint("b", Some(2), "3", at(50))).await;
        let d_latest = put(c, checkpoint("d", None, "1", at(40))).await;

        let summaries = c.threads().await.expect("threads");
        let order: Vec<&str> = summaries.iter().map(|summary| summary.thread_id.as_str()).collect();
        assert_eq!(order, ["b", "c", "d", "a"], "threads are ordered by their newest checkpoint's created_at, newest first, then by id");
        let want = [("b", &b_latest, 3), ("c", &c_latest, 1), ("d", &d_latest, 1), ("a", &a_latest, 2)];
        for (summary, (thread_id, latest, count)) in summaries.iter().zip(want) {
            assert_eq!(&summary.latest, latest, "thread '{thread_id}' must be summarized by its newest checkpoint's metadata");
            assert_eq!(summary.checkpoints, count, "thread '{thread_id}' has {count} checkpoints");
        }
    })
    .await;
}

/// `delete_thread` removes that thread's checkpoints and nothing else; deleting a missing thread is
/// fine; a deleted thread starts again at id 1, and its new root is its newest checkpoint.
pub async fn delete_thread_removes_only_that_thread<C: Checkpointer>(checkpointer: C) {
    case("delete_thread_removes_only_that_thread", async {
        let c = &checkpointer;
        put(c, checkpoint("a", None, "1", at(0))).await;
        put_chain(c, "a", 1, &["2", "3"]).await;
        put(c, checkpoint("b", None, "1", at(0))).await;
        let b_chain = put_chain(c, "b", 1, &["2"]).await;
        let b_before = list(c, "b", ListQuery::default()).await;

        c.delete_thread("a").await.expect("delete_thread of an existing thread");
        assert!(c.load("a", None).await.expect("load").is_none(), "a deleted thread has no newest checkpoint");
        assert!(c.load("a", Some(2)).await.expect("load").is_none(), "a deleted thread's checkpoints are gone");
        assert!(list(c, "a", ListQuery::default()).await.is_empty(), "a deleted thread lists nothing");
        let threads = c.threads().await.expect("threads");
        assert_eq!(threads.iter().map(|summary| summary.thread_id.as_str()).collect::<Vec<_>>(), ["b"], "a deleted thread is not listed");

        assert_eq!(list(c, "b", ListQuery::default()).await, b_before, "other threads are untouched");
        assert_resolved(&load(c, "b", None).await, "b", b_chain[0].checkpoint_id, "1", &["2"]);

        c.delete_thread("a").await.expect("deleting a thread twice is fine");
        c.delete_thread("never-existed").await.expect("deleting a missing thread is fine");

        let meta = put(c, checkpoint("a", None, "again", at(5))).await;
        assert_eq!(meta.checkpoint_id, 1, "a deleted thread starts again at id 1");
        let result = c.put(checkpoint("a", Some(2), "x", at(6))).await;
        assert!(matches!(result, Err(CheckpointError::UnknownParent { .. })), "deleted checkpoints cannot be parents, got {result:?}");
        let result = c.put(checkpoint("a", None, "root again", at(6))).await;
        assert!(
            matches!(&result, Err(CheckpointError::Conflict { expected: None, latest: Some(1), .. })),
            "the recreated thread's newest checkpoint is 1, got {result:?}"
        );
        assert_eq!(
            put_chain(c, "a", 1, &["2"]).await[0].checkpoint_id,
            2,
            "the recreated thread is extended from its own newest checkpoint"
        );
    })
    .await;
}

/// `copy_thread` copies every checkpoint with the same ids, parents, snapshots, deltas and
/// metadata (only the thread id changes); the copy's newest checkpoint is the source's; the copy is
/// independent; an existing target is `ThreadExists`, a missing source `ThreadNotFound`.
pub async fn copy_thread_copies_everything<C: Checkpointer>(checkpointer: C) {
    case("copy_thread_copies_everything", async {
        let c = &checkpointer;
        put(c, checkpoint("from", None, "1", at(0))).await;
        put_chain(c, "from", 1, &["2", "3"]).await;
        let mut interrupted = forked(with_snapshot(checkpoint("from", Some(2), "4", at(4)), "4"));
        interrupted.interrupt = Some(pending_interrupt());
        put(c, interrupted).await;
        put_chain(c, "from", 4, &["5"]).await;
        put(c, checkpoint("other", None, "1", at(0))).await;

        c.copy_thread("from", "to").await.expect("copy_thread to a new thread");
        let source = list(c, "from", ListQuery::default()).await;
        let copied = list(c, "to", ListQuery::default()).await;
        let renamed: Vec<CheckpointMeta> =
            source.iter().cloned().map(|meta| CheckpointMeta { thread_id: "to".to_owned(), ..meta }).collect();
        assert_eq!(copied, renamed, "the copy has the same checkpoints and metadata, under the new thread id");
        for id in 1..=5 {
            let original = load(c, "from", Some(id)).await;
            let copy = load(c, "to", Some(id)).await;
            assert_eq!(
                copy.meta,
                CheckpointMeta { thread_id: "to".to_owned(), ..original.meta.clone() },
                "metadata of copied checkpoint {id}"
            );
            assert_eq!((copy.snapshot, copy.deltas), (original.snapshot, original.deltas), "state of copied checkpoint {id}");
        }

        let result = c.copy_thread("from", "other").await;
        assert!(
            matches!(&result, Err(CheckpointError::ThreadExists { thread_id }) if thread_id == "other"),
            "copying onto an existing thread must fail with ThreadExists, got {result:?}"
        );
        assert_eq!(ids(&list(c, "other", ListQuery::default()).await), vec![1], "a refused copy leaves the target as it was");
        let result = c.copy_thread("missing", "new").await;
        assert!(
            matches!(&result, Err(CheckpointError::ThreadNotFound { thread_id }) if thread_id == "missing"),
            "copying a missing thread must fail with ThreadNotFound, got {result:?}"
        );
        assert!(c.load("new", None).await.expect("load").is_none(), "a refused copy creates nothing");

        let result = c.put(checkpoint("to", Some(3), "6", at(6))).await;
        assert!(
            matches!(&result, Err(CheckpointError::Conflict { thread_id, expected: Some(3), latest: Some(5) }) if thread_id == "to"),
            "the copy's newest checkpoint is the source's: a non-fork put on checkpoint 3 must conflict with 5, got {result:?}"
        );
        let written = put(c, forked(checkpoint("to", Some(3), "6", at(6)))).await;
        assert_eq!(written.checkpoint_id, 6, "the copy continues from the copied ids");
        assert_eq!(put_chain(c, "to", 6, &["7"]).await[0].checkpoint_id, 7, "the copy's own newest checkpoint can be extended");
        assert_eq!(list(c, "from", ListQuery::default()).await, source, "writes to the copy do not reach the source");
        assert!(c.load("from", Some(6)).await.expect("load").is_none(), "writes to the copy do not reach the source");
        c.delete_thread("to").await.expect("delete the copy");
        assert_eq!(list(c, "from", ListQuery::default()).await, source, "deleting the copy leaves the source");
    })
    .await;
}

fn pending_interrupt() -> PendingInterrupt {
    PendingInterrupt {
        id: "interrupt-1".to_owned(),
        node: "approve".to_owned(),
        payload: json!({"action": "write", "channels": ["SR:C01:X", "SR:C01:Y"], "values": [1.5, null, {"nested": true}], "note": "ünïcødé"}),
        digest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".to_owned(),
    }
}

fn resume_record() -> ResumeRecord {
    ResumeRecord {
        interrupt_id: "interrupt-1".to_owned(),
        node: "approve".to_owned(),
        payload: pending_interrupt().payload,
        answer: json!({"approved": true, "comment": "ok", "edits": [{"channel": "SR:C01:X", "value": 2}]}),
        delivery: 2,
    }
}

/// A pending interrupt and a resume record (with JSON payloads) are stored and come back from
/// `load`, `list` and `threads` unchanged.
pub async fn interrupts_and_resumes_persist<C: Checkpointer>(checkpointer: C) {
    case("interrupts_and_resumes_persist", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "1", at(0))).await;
        let mut paused = checkpoint("t", Some(1), "2", at(1));
        paused.interrupt = Some(pending_interrupt());
        let paused_meta = put(c, paused).await;
        assert_eq!(paused_meta.interrupt, Some(pending_interrupt()));

        let loaded = load(c, "t", None).await;
        assert_eq!(loaded.meta, paused_meta, "a pending interrupt is stored");
        assert_eq!(loaded.meta.interrupt, Some(pending_interrupt()));

        let mut resumed = checkpoint("t", Some(2), "3", at(2));
        resumed.source = CheckpointSource::Resume;
        resumed.resume = Some(resume_record());
        let resumed_meta = put(c, resumed).await;
        let mut both = checkpoint("t", Some(3), "4", at(3));
        both.interrupt = Some(PendingInterrupt { id: "interrupt-2".to_owned(), ..pending_interrupt() });
        both.resume = Some(resume_record());
        let both_meta = put(c, both).await;

        assert_eq!(load(c, "t", Some(3)).await.meta, resumed_meta, "a resume record is stored");
        assert_eq!(load(c, "t", Some(3)).await.meta.resume, Some(resume_record()));
        assert_eq!(load(c, "t", Some(4)).await.meta, both_meta, "an interrupt and a resume record are stored together");
        let listed = list(c, "t", ListQuery::default()).await;
        assert_eq!(listed[..3], [both_meta.clone(), resumed_meta, paused_meta], "list returns interrupts and resume records too");
        let threads = c.threads().await.expect("threads");
        assert_eq!(threads[0].latest, both_meta, "threads returns the newest checkpoint's interrupt");
    })
    .await;
}

const WRITERS_PER_KIND: usize = 4;
const PUTS_PER_WRITER: usize = 25;

/// Eight writers put 25 checkpoints each at once. Four race on one shared thread, each extending
/// whatever `load(None)` returned: a put either succeeds or fails with `Conflict` (another writer
/// got there first), and the successful ones form one unbroken chain with gapless ids. Each
/// refused put lost to a success inside its load-to-put window, and a success lies in at most one
/// window per other writer, so there are at least as many successes as rounds. Four write their
/// own threads and are never refused. No stored checkpoint is lost.
pub async fn concurrent_writers_lose_nothing<C: Checkpointer>(checkpointer: C) {
    case("concurrent_writers_lose_nothing", async {
        let c = Arc::new(checkpointer);
        put(&*c, checkpoint("shared", None, "seed", at(0))).await;
        let shared: Vec<_> = (0..WRITERS_PER_KIND).map(|writer| tokio::spawn(shared_writer(Arc::clone(&c), writer))).collect();
        let own: Vec<_> = (0..WRITERS_PER_KIND).map(|writer| tokio::spawn(own_thread_writer(Arc::clone(&c), writer))).collect();

        let mut chain = Vec::new();
        for writer in shared {
            chain.extend(writer.await.unwrap_or_else(|error| panic!("a shared-thread writer failed: {error}")));
        }
        for writer in own {
            let (thread_id, written) = writer.await.unwrap_or_else(|error| panic!("a writer task failed: {error}"));
            let want: Vec<CheckpointId> = (1..=PUTS_PER_WRITER as CheckpointId).collect();
            assert_eq!(written, want, "a writer alone on thread '{thread_id}' gets ids 1, 2, 3… in order");
            assert_eq!(ids(&list(&*c, &thread_id, ListQuery::default()).await).len(), PUTS_PER_WRITER);
        }

        chain.sort_unstable_by_key(|meta| meta.checkpoint_id);
        let successes = chain.len();
        assert!(successes >= PUTS_PER_WRITER, "only {successes} of the shared puts succeeded; every round must let at least one through");
        let mut stored = list(c.as_ref(), "shared", ListQuery::default()).await;
        stored.reverse();
        assert_eq!(stored.len(), successes + 1, "the shared thread holds the seed and exactly the successful puts");
        for (index, meta) in stored.iter().enumerate() {
            let id = index as CheckpointId + 1;
            assert_eq!(meta.checkpoint_id, id, "the shared thread's ids are gapless");
            assert_eq!(meta.parent_id, id.checked_sub(1).filter(|&parent| parent > 0), "the shared thread is one unbroken chain");
        }
        assert_eq!(chain, stored[1..], "what the writers were told they wrote is what is stored");

        let summaries = c.threads().await.expect("threads");
        let total: u64 = summaries.iter().map(|summary| summary.checkpoints).sum();
        assert_eq!(total, (WRITERS_PER_KIND * PUTS_PER_WRITER + successes + 1) as u64, "no successful put is lost");
        assert_eq!(summaries.len(), WRITERS_PER_KIND + 1);
    })
    .await;
}

/// Extends the shared thread's newest checkpoint `PUTS_PER_WRITER` times; returns what it wrote.
async fn shared_writer<C: Checkpointer>(c: Arc<C>, writer: usize) -> Vec<CheckpointMeta> {
    let mut written = Vec::new();
    for step in 0..PUTS_PER_WRITER {
        let parent = load(c.as_ref(), "shared", None).await.meta.checkpoint_id;
        match c.put(checkpoint("shared", Some(parent), &format!("w{writer}-{step}"), at(1))).await {
            Ok(meta) => {
                assert_eq!(meta.checkpoint_id, parent + 1, "a put extending the newest checkpoint {parent} gets the next id");
                written.push(meta);
            }
            Err(CheckpointError::Conflict { thread_id, expected, latest }) => {
                assert_eq!((thread_id.as_str(), expected), ("shared", Some(parent)), "Conflict names the thread and the parent given");
                assert!(latest > Some(parent), "a refused put lost to a newer checkpoint than its parent {parent}, got {latest:?}");
            }
            Err(error) => panic!("a put racing other writers may only fail with Conflict, got: {error}"),
        }
    }
    written
}

async fn own_thread_writer<C: Checkpointer>(c: Arc<C>, writer: usize) -> (String, Vec<CheckpointId>) {
    let thread_id = format!("own-{writer}");
    let mut written = vec![put(c.as_ref(), checkpoint(&thread_id, None, "0", at(1))).await.checkpoint_id];
    for step in 1..PUTS_PER_WRITER {
        let parent = written[step - 1];
        written.push(put(c.as_ref(), checkpoint(&thread_id, Some(parent), &step.to_string(), at(1))).await.checkpoint_id);
    }
    (thread_id, written)
}

/// How long a released lock may take to become free again (a server-side lock may be released
/// asynchronously after its guard is dropped).
const LOCK_RELEASE_DEADLINE: Duration = Duration::from_secs(5);

/// A second `lock_thread` on a held thread fails at once with `ThreadBusy`; other threads (also
/// ones without checkpoints) can be locked meanwhile; after the lock is dropped, even on another
/// task, the thread can be locked again.
pub async fn lock_thread_is_exclusive<C: Checkpointer>(checkpointer: C) {
    case("lock_thread_is_exclusive", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "1", at(0))).await;
        let held = c.lock_thread("t").await.expect("locking a free thread");
        let result = c.lock_thread("t").await;
        assert!(
            matches!(&result, Err(CheckpointError::ThreadBusy { thread_id }) if thread_id == "t"),
            "locking a held thread must fail with ThreadBusy, got {result:?}"
        );
        assert!(result.as_ref().is_err_and(CheckpointError::is_retryable), "ThreadBusy is retryable");
        let other = c.lock_thread("no-checkpoints-yet").await.expect("other threads, even empty ones, are not blocked");
        put(c, checkpoint("t", Some(1), "2", at(1))).await;

        drop(held);
        let again = lock_again(c, "t").await;
        assert!(matches!(c.lock_thread("t").await, Err(CheckpointError::ThreadBusy { .. })), "the retaken lock is exclusive again");

        tokio::spawn(async move { drop(again) }).await.expect("dropping a lock on another task");
        let _again = lock_again(c, "t").await;
        drop(other);
        let _other = lock_again(c, "no-checkpoints-yet").await;
    })
    .await;
}

/// Takes the lock of `thread_id`, allowing `LOCK_RELEASE_DEADLINE` for a previous holder's
/// release to land.
async fn lock_again<C: Checkpointer>(c: &C, thread_id: &str) -> peregrine_graph::checkpoint::ThreadLock {
    let deadline = tokio::time::Instant::now() + LOCK_RELEASE_DEADLINE;
    loop {
        match c.lock_thread(thread_id).await {
            Ok(lock) => return lock,
            Err(CheckpointError::ThreadBusy { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => panic!("a dropped lock on '{thread_id}' must become free again: {error}"),
        }
    }
}

/// Rounds of a probe racing a `lock_thread` of the same free thread.
const PROBE_RACES: usize = 20;

/// `is_thread_locked` is false for a free thread (also one without checkpoints), true while the
/// lock is held (and for that thread only), and false again once the lock is dropped, even on
/// another task (a server-side release may land a little later, so that is polled for). Probing
/// takes nothing: a held lock stays held however often it is probed, a probe racing a
/// `lock_thread` of the free thread never makes it fail, and once the probe says false the
/// thread can be locked at once.
pub async fn is_thread_locked_probes_without_locking<C: Checkpointer>(checkpointer: C) {
    case("is_thread_locked_probes_without_locking", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "1", at(0))).await;
        assert!(!probe(c, "t").await, "a thread nobody locked is not locked");
        assert!(!probe(c, "never-stored").await, "a thread without checkpoints nobody locked is not locked");

        for _ in 0..3 {
            probe(c, "t").await;
        }
        let held = c.lock_thread("t").await.expect("probing a free thread must leave it free to lock");
        assert!(probe(c, "t").await, "a thread is locked while its lock is held");
        assert!(!probe(c, "never-stored").await, "holding one thread's lock does not lock another");
        for _ in 0..3 {
            assert!(probe(c, "t").await, "probing again does not release the lock");
        }
        let result = c.lock_thread("t").await;
        assert!(matches!(&result, Err(CheckpointError::ThreadBusy { .. })), "a probed lock is still exclusive, got {result:?}");
        assert!(probe(c, "t").await, "a refused lock_thread does not release the holder's lock");
        let other = c.lock_thread("never-stored").await.expect("other threads can be locked meanwhile");
        assert!(probe(c, "never-stored").await, "a thread without checkpoints is locked while its lock is held");

        drop(held);
        wait_until_unlocked(c, "t").await;
        let again = c.lock_thread("t").await.expect("once is_thread_locked says false, lock_thread succeeds");
        assert!(probe(c, "t").await, "the retaken lock shows as held");
        assert!(probe(c, "never-stored").await, "releasing one thread leaves another held");

        tokio::spawn(async move { drop(again) }).await.expect("dropping a lock on another task");
        wait_until_unlocked(c, "t").await;
        drop(other);
        wait_until_unlocked(c, "never-stored").await;

        for round in 0..PROBE_RACES {
            let (probed, locked) = futures::future::join(c.is_thread_locked("t"), c.lock_thread("t")).await;
            probed.unwrap_or_else(|error| panic!("round {round}: is_thread_locked('t') failed: {error}"));
            let lock =
                locked.unwrap_or_else(|error| panic!("round {round}: a probe racing lock_thread of a free thread made it fail: {error}"));
            assert!(probe(c, "t").await, "round {round}: the lock taken beside a probe is held");
            drop(lock);
            wait_until_unlocked(c, "t").await;
        }
    })
    .await;
}

/// `is_thread_locked(thread_id)`, panicking on an error.
async fn probe<C: Checkpointer>(c: &C, thread_id: &str) -> bool {
    c.is_thread_locked(thread_id).await.unwrap_or_else(|error| panic!("is_thread_locked('{thread_id}') failed: {error}"))
}

/// Polls `is_thread_locked` until it says false, allowing `LOCK_RELEASE_DEADLINE` for a dropped
/// lock's release to land.
async fn wait_until_unlocked<C: Checkpointer>(c: &C, thread_id: &str) {
    let deadline = tokio::time::Instant::now() + LOCK_RELEASE_DEADLINE;
    while probe(c, thread_id).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "'{thread_id}' still shows as locked {LOCK_RELEASE_DEADLINE:?} after its lock was dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const LARGE_HISTORY: usize = 300;

/// A snapshot followed by 300 delta-only checkpoints loads with all 300 deltas in order (and a
/// checkpoint half-way with the first half).
pub async fn large_history_loads_every_delta<C: Checkpointer>(checkpointer: C) {
    case("large_history_loads_every_delta", async {
        let c = &checkpointer;
        put(c, checkpoint("t", None, "root", at(0))).await;
        let labels: Vec<String> = (1..=LARGE_HISTORY).map(|step| step.to_string()).collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        put_chain(c, "t", 1, &labels).await;

        let newest = load(c, "t", None).await;
        assert_eq!(newest.deltas.len(), LARGE_HISTORY, "every delta after the snapshot is returned");
        assert_resolved(&newest, "t", LARGE_HISTORY as CheckpointId + 1, "root", &labels);
        let halfway = LARGE_HISTORY / 2;
        assert_resolved(
            &load(c, "t", Some(halfway as CheckpointId + 1)).await,
            "t",
            halfway as CheckpointId + 1,
            "root",
            &labels[..halfway],
        );
    })
    .await;
}

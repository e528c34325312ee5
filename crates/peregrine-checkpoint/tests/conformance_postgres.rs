//! The checkpoint conformance suite against PostgreSQL, plus what only this backend promises:
//! thread locks shared by separate instances (separate pools, as separate server processes have),
//! locks freed when their session dies, gapless ids across instances and the schema guard.
//!
//! Needs `PEREGRINE_TEST_POSTGRES_URL` (`eval "$(scripts/postgres.sh start)"` sets it). Without it
//! the tests skip, unless `CI` is set, where they fail. Every test works in its own schemas, so
//! the tests run in parallel and leave the database's other contents alone.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests report failures by panicking")]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use peregrine_checkpoint::conformance;
use peregrine_checkpoint::{PostgresCheckpointer, PostgresOptions};
use peregrine_graph::{CheckpointError, CheckpointSource, Checkpointer, ListQuery, NewCheckpoint, PendingInterrupt, ThreadLock};
use serde_json::json;
use tokio_postgres::NoTls;

const URL_VARIABLE: &str = "PEREGRINE_TEST_POSTGRES_URL";

/// How many times a test polls for a lock released by another session before giving up.
const RELEASE_ATTEMPTS: usize = 500;
const RELEASE_POLL: Duration = Duration::from_millis(10);

/// The server to test against; `None` (after saying so) when there is none outside CI.
fn server_url() -> Option<String> {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{URL_VARIABLE} is not set, and CI is: run `eval \"$(scripts/postgres.sh start)\"` before `cargo test`")
        }
        _ => {
            eprintln!("skipping PostgreSQL checkpointer tests: {URL_VARIABLE} is not set (run `eval \"$(scripts/postgres.sh start)\"`)");
            None
        }
    }
}

/// Fresh schemas on the test server, each reached through its own URL; dropped by `cleanup`.
struct Scratch {
    url: String,
    admin: tokio_postgres::Client,
    schemas: Mutex<Vec<String>>,
}

impl Scratch {
    async fn new(url: &str) -> Self {
        let (admin, connection) = tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
        tokio::spawn(connection);
        Self { url: url.to_owned(), admin, schemas: Mutex::new(Vec::new()) }
    }

    /// Creates an empty schema and returns it with a URL whose `search_path` is that schema.
    async fn schema(&self) -> (String, String) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.subsec_nanos());
        let name = format!("peregrine_test_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        self.admin.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("create a scratch schema");
        self.schemas.lock().unwrap().push(name.clone());
        let url = if self.url.starts_with("postgres://") || self.url.starts_with("postgresql://") {
            let separator = if self.url.contains('?') { '&' } else { '?' };
            format!("{}{separator}options=-csearch_path%3D{name}", self.url)
        } else {
            format!("{} options='-csearch_path={name}'", self.url)
        };
        (name, url)
    }

    /// A checkpointer on a fresh, empty schema.
    async fn checkpointer(&self) -> PostgresCheckpointer {
        let (_, url) = self.schema().await;
        PostgresCheckpointer::connect(&url).await.expect("connect to a fresh schema")
    }

    async fn cleanup(self) {
        let schemas = std::mem::take(&mut *self.schemas.lock().unwrap());
        for name in schemas {
            self.admin.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await.expect("drop a scratch schema");
        }
    }
}

fn new_checkpoint(thread_id: &str, parent_id: Option<u64>, step: u32) -> NewCheckpoint {
    NewCheckpoint {
        thread_id: thread_id.to_owned(),
        parent_id,
        source: if parent_id.is_some() { CheckpointSource::Loop } else { CheckpointSource::Input },
        node: parent_id.map(|_| "node".to_owned()),
        run_id: "run".to_owned(),
        run_step: step,
        interrupt: None,
        resume: None,
        delta: format!("delta {step}").into_bytes(),
        snapshot: parent_id.is_none().then(|| b"snapshot".to_vec()),
        created_at: Utc.timestamp_opt(1_700_000_000 + i64::from(step), 123_456_000).unwrap(),
    }
}

fn is_busy(result: &Result<ThreadLock, CheckpointError>, thread: &str) -> bool {
    matches!(result, Err(CheckpointError::ThreadBusy { thread_id }) if thread_id == thread)
}

/// Polls `lock_thread` until the lock another session held is released, a bounded number of times.
async fn lock_when_released(checkpointer: &PostgresCheckpointer, thread_id: &str) -> ThreadLock {
    for _ in 0..RELEASE_ATTEMPTS {
        match checkpointer.lock_thread(thread_id).await {
            Ok(lock) => return lock,
            Err(CheckpointError::ThreadBusy { .. }) => tokio::time::sleep(RELEASE_POLL).await,
            Err(error) => panic!("lock_thread('{thread_id}') failed: {error}"),
        }
    }
    panic!("the lock on '{thread_id}' was not released after {RELEASE_ATTEMPTS} attempts")
}

/// Polls `is_thread_locked` until a lock another session held shows as released, a bounded
/// number of times.
async fn probe_until_unlocked(checkpointer: &PostgresCheckpointer, thread_id: &str) {
    for _ in 0..RELEASE_ATTEMPTS {
        match checkpointer.is_thread_locked(thread_id).await {
            Ok(false) => return,
            Ok(true) => tokio::time::sleep(RELEASE_POLL).await,
            Err(error) => panic!("is_thread_locked('{thread_id}') failed: {error}"),
        }
    }
    panic!("'{thread_id}' still showed as locked after {RELEASE_ATTEMPTS} probes")
}

/// One test per case, each on its own schema, so that a failure names its case and the rest run.
macro_rules! conformance_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(url) = server_url() else { return };
                let scratch = Scratch::new(&url).await;
                conformance::$case(scratch.checkpointer().await).await;
                scratch.cleanup().await;
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

/// Also through `run_all`, so a case added to the suite is never missed here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    conformance::run_all(|| scratch.checkpointer()).await;
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_locked_by_one_instance_is_busy_for_another_until_released() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    let a = PostgresCheckpointer::connect(&schema_url).await.unwrap();
    let b = PostgresCheckpointer::connect(&schema_url).await.unwrap();

    let held_by_a = a.lock_thread("t").await.expect("instance A locks a free thread");
    assert!(is_busy(&b.lock_thread("t").await, "t"), "instance B must not lock a thread instance A holds");
    assert!(is_busy(&a.lock_thread("t").await, "t"), "instance A must not lock its own held thread twice");
    let other = b.lock_thread("u").await.expect("instance B locks another thread meanwhile");

    drop(held_by_a);
    let held_by_b = lock_when_released(&b, "t").await;
    assert!(is_busy(&a.lock_thread("t").await, "t"), "once B holds the thread, A is refused");
    drop(other);
    drop(held_by_b);
    let _again = lock_when_released(&a, "t").await;
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_instance_probes_a_held_thread_without_taking_it() {
    const ROUNDS: usize = 20;
    const PROBES_PER_ROUND: usize = 5;
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    // One lock connection each: a probe that needed a lock connection would find none free.
    let options = PostgresOptions { max_thread_locks: 1, ..PostgresOptions::default() };
    let a = Arc::new(PostgresCheckpointer::connect_with(&schema_url, options).await.unwrap());
    let b = Arc::new(PostgresCheckpointer::connect_with(&schema_url, options).await.unwrap());
    let elsewhere = scratch.checkpointer().await;

    assert!(!b.is_thread_locked("t").await.unwrap(), "nobody holds 't' yet");
    let held_by_a = a.lock_thread("t").await.expect("instance A locks a free thread");
    assert!(a.is_thread_locked("t").await.unwrap(), "the holder sees its own lock");
    assert!(b.is_thread_locked("t").await.unwrap(), "another instance sees the lock through pg_locks");
    assert!(!b.is_thread_locked("u").await.unwrap(), "other threads stay unlocked");
    assert!(!a.is_thread_locked("u").await.unwrap(), "A probes on a query connection while its only lock connection is in use");
    assert!(!elsewhere.is_thread_locked("t").await.unwrap(), "the same thread id in another schema is another lock");
    assert!(is_busy(&b.lock_thread("t").await, "t"), "B still cannot lock the thread it probed");
    let key = a.thread_lock_key("t").await.unwrap();
    let holders: i64 = scratch
        .admin
        .query_one(
            "SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objsubid = 1
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holders, 1, "probes took no lock of their own: only A's session holds 't'");
    drop(held_by_a);
    probe_until_unlocked(&b, "t").await;

    // Each round one instance locks the free thread while the other probes it in parallel, then
    // the other takes it once its probe says it is free; neither lock may fail.
    for round in 0..ROUNDS {
        let (holder, prober) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let probing = tokio::spawn({
            let prober = Arc::clone(prober);
            async move {
                for _ in 0..PROBES_PER_ROUND {
                    prober.is_thread_locked("t").await.expect("probe 't'");
                }
            }
        });
        let lock = holder
            .lock_thread("t")
            .await
            .unwrap_or_else(|error| panic!("round {round}: a probe from the other instance made lock_thread fail: {error}"));
        probing.await.unwrap();
        assert!(prober.is_thread_locked("t").await.unwrap(), "round {round}: the other instance sees the lock");
        assert!(holder.is_thread_locked("t").await.unwrap(), "round {round}: probes did not release the holder's lock");
        assert!(is_busy(&prober.lock_thread("t").await, "t"), "round {round}: the lock stays exclusive");
        drop(lock);
        probe_until_unlocked(prober, "t").await;
        let taken = prober.lock_thread("t").await.unwrap_or_else(|error| {
            panic!("round {round}: once is_thread_locked says false, the other instance must lock at once: {error}")
        });
        assert!(holder.is_thread_locked("t").await.unwrap(), "round {round}: the former holder sees the new holder");
        drop(taken);
        probe_until_unlocked(holder, "t").await;
    }
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_session_dies_is_released() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    let a = PostgresCheckpointer::connect(&schema_url).await.unwrap();
    let b = PostgresCheckpointer::connect(&schema_url).await.unwrap();

    let held_by_a = a.lock_thread("t").await.expect("instance A locks a free thread");
    assert!(is_busy(&b.lock_thread("t").await, "t"));
    // Simulate instance A crashing: its lock connection is killed server-side.
    let key = a.thread_lock_key("t").await.unwrap();
    let holders = scratch
        .admin
        .query(
            "SELECT pid FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND objsubid = 1
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(holders.len(), 1, "exactly one session holds the advisory lock of 't'");
    let pid: i32 = holders[0].get(0);
    let terminated: bool = scratch.admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    assert!(terminated, "the lock's session was terminated");

    let held_by_b = lock_when_released(&b, "t").await;
    // A's guard now fails to unlock on its dead connection; that must not disturb anyone.
    drop(held_by_a);
    assert!(is_busy(&a.lock_thread("t").await, "t"), "B holds the thread after A's session died");
    drop(held_by_b);
    let _again = lock_when_released(&a, "t").await;
    a.put(new_checkpoint("t", None, 0)).await.expect("instance A still works after losing a connection");
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_outside_the_runtime_is_released() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    let a = PostgresCheckpointer::connect(&schema_url).await.unwrap();
    let b = PostgresCheckpointer::connect(&schema_url).await.unwrap();

    let held_by_a = a.lock_thread("t").await.unwrap();
    std::thread::spawn(move || drop(held_by_a)).join().expect("drop the lock on a thread without a tokio runtime");
    let _held_by_b = lock_when_released(&b, "t").await;
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_from_two_instances_get_unique_gapless_ids() {
    const TASKS_PER_INSTANCE: usize = 4;
    const PUTS_PER_TASK: u32 = 20;
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    let a = Arc::new(PostgresCheckpointer::connect(&schema_url).await.unwrap());
    let b = Arc::new(PostgresCheckpointer::connect(&schema_url).await.unwrap());
    a.put(new_checkpoint("shared", None, 0)).await.unwrap();

    let mut tasks = Vec::new();
    for instance in [&a, &b] {
        for _ in 0..TASKS_PER_INSTANCE {
            let instance = Arc::clone(instance);
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for step in 1..=PUTS_PER_TASK {
                    let branch = NewCheckpoint { source: CheckpointSource::Fork, ..new_checkpoint("shared", Some(1), step) };
                    ids.push(instance.put(branch).await.unwrap().checkpoint_id);
                }
                ids
            }));
        }
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    ids.sort_unstable();
    let total = 2 * TASKS_PER_INSTANCE as u64 * u64::from(PUTS_PER_TASK);
    assert_eq!(ids, (2..=total + 1).collect::<Vec<_>>(), "ids from both instances are unique and gapless");
    let stored = b.list("shared", ListQuery::default()).await.unwrap();
    assert_eq!(stored.len() as u64, total + 1, "every put is stored");
    let summaries = a.threads().await.unwrap();
    assert_eq!(summaries[0].checkpoints, total + 1, "the thread's count includes every put");
    assert_eq!(summaries[0].latest.checkpoint_id, total + 1);
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_extending_the_same_tip_let_exactly_one_through() {
    const ROUNDS: u32 = 10;
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (_, schema_url) = scratch.schema().await;
    let a = Arc::new(PostgresCheckpointer::connect(&schema_url).await.unwrap());
    let b = Arc::new(PostgresCheckpointer::connect(&schema_url).await.unwrap());
    a.put(new_checkpoint("t", None, 0)).await.unwrap();

    for round in 1..=ROUNDS {
        let tip = a.load("t", None).await.unwrap().unwrap().meta.checkpoint_id;
        assert_eq!(b.load("t", None).await.unwrap().unwrap().meta.checkpoint_id, tip, "both instances read the same tip");
        let puts = [&a, &b].map(|instance| {
            let instance = Arc::clone(instance);
            tokio::spawn(async move { instance.put(new_checkpoint("t", Some(tip), round)).await })
        });
        let [first, second] = puts;
        let (winner, loser) = match (first.await.unwrap(), second.await.unwrap()) {
            (Ok(meta), Err(error)) | (Err(error), Ok(meta)) => (meta, error),
            other => panic!("round {round}: exactly one of two puts extending checkpoint {tip} must succeed, got {other:?}"),
        };
        assert_eq!((winner.checkpoint_id, winner.parent_id), (tip + 1, Some(tip)));
        assert!(
            matches!(&loser, CheckpointError::Conflict { thread_id, expected, latest } if thread_id == "t" && *expected == Some(tip) && *latest == Some(tip + 1)),
            "round {round}: the slower writer must get Conflict, got {loser:?}"
        );
    }
    let history = b.list("t", ListQuery::default()).await.unwrap();
    assert_eq!(history.len(), ROUNDS as usize + 1, "only the winners are stored");
    assert!(history.windows(2).all(|pair| pair[0].parent_id == Some(pair[1].checkpoint_id)), "one unbroken chain: {history:?}");
    let summaries = a.threads().await.unwrap();
    assert_eq!((summaries[0].checkpoints, summaries[0].latest.checkpoint_id), (u64::from(ROUNDS) + 1, u64::from(ROUNDS) + 1));
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_starting_together_create_the_schema_once() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (name, schema_url) = scratch.schema().await;
    let connects = (0..6).map(|_| PostgresCheckpointer::connect(&schema_url));
    for result in futures::future::join_all(connects).await {
        result.expect("every instance starts while the others create the schema");
    }
    let versions: Vec<i32> = scratch
        .admin
        .query(&format!("SELECT version FROM {name}.peregrine_schema_version"), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, [1], "the schema is created once, at version 1");
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_version_is_refused() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let (name, schema_url) = scratch.schema().await;
    drop(PostgresCheckpointer::connect(&schema_url).await.unwrap());
    scratch.admin.batch_execute(&format!("INSERT INTO {name}.peregrine_schema_version (version) VALUES (2)")).await.unwrap();

    let error = PostgresCheckpointer::connect(&schema_url).await.expect_err("a database from a newer release is refused");
    assert!(matches!(error, CheckpointError::UnsupportedSchema { backend: "postgres", found: 2, supported: 1 }), "{error:?}");
    assert!(!error.is_retryable(), "retrying cannot help");
    let message = error.to_string();
    assert!(message.contains("schema version 2") && message.contains("upgrade Peregrine"), "unclear error: {message}");
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_that_jsonb_would_alter_round_trips_exactly() {
    let Some(url) = server_url() else { return };
    let scratch = Scratch::new(&url).await;
    let checkpointer = scratch.checkpointer().await;
    let mut first = new_checkpoint("t\u{1f980}", None, 0);
    first.interrupt = Some(PendingInterrupt {
        id: "nul\u{0}inside".to_owned(),
        node: "approve".to_owned(),
        payload: json!({"nul": "a\u{0}b", "float": 0.1, "big": u64::MAX, "tiny": 1e-300, "z": 1, "a": 2}),
        digest: "d".to_owned(),
    });
    let stored = checkpointer.put(first).await.unwrap();
    let loaded = checkpointer.load("t\u{1f980}", None).await.unwrap().expect("stored checkpoint");
    assert_eq!(loaded.meta, stored, "metadata comes back exactly as written");
    assert_eq!(loaded.snapshot, b"snapshot");
    assert!(loaded.deltas.is_empty());
    scratch.cleanup().await;
}

//! PostgreSQL checkpointer: several server instances share threads through one database, and a
//! per-thread advisory lock makes sure one thread never runs twice at once.
//!
//! Layout (schema version 1, created by [`PostgresCheckpointer::connect`]):
//! - `peregrine_checkpoints`: one row per checkpoint, keyed by `(thread_id, checkpoint_id)`, with
//!   the parent id, the metadata as JSON text, the delta and the optional snapshot. The metadata
//!   is `TEXT`, not `JSONB`, so that it round-trips byte for byte (`JSONB` rejects `\u0000` in
//!   strings and rewrites numbers and key order).
//! - `peregrine_threads`: one row per thread with its highest id, its checkpoint count and its
//!   newest checkpoint's time (for `threads()` ordering). `put` bumps this row with
//!   `INSERT … ON CONFLICT DO UPDATE … RETURNING`, which both assigns the next id and serialises
//!   writers of the same thread until commit, so ids are gapless under concurrent writers, even
//!   across server instances. The counter always equals the thread's highest stored id (`put`
//!   bumps it and inserts in one transaction, `delete_thread` removes both, `copy_thread` copies
//!   both), so the value before the bump is the newest checkpoint: a non-fork write naming any
//!   other parent is refused there with `Conflict`, under the same row lock.
//! - `peregrine_schema_version`: the schema version; a newer one than this build knows is refused.
//!
//! Thread locks are session-level advisory locks (`pg_try_advisory_lock`) held on a connection
//! reserved for the lock: the server releases them when the lock is dropped, or when the session
//! ends because the process died. Keys are 64-bit `hashtextextended` hashes of the schema and the
//! thread id, so two threads can share a key: a collision makes a run see a false "busy" (never a
//! missed exclusion), with odds of about n²/2⁶⁵ for n threads locked at once. Other applications
//! using single-key advisory locks in the same database share the key space. `is_thread_locked`
//! reads `pg_locks` for the key instead of trying the lock, so probing never makes a run busy.
//!
//! Connections are unencrypted (`NoTls`): point it at a server on a trusted network or loopback.

mod lock;

use std::str::FromStr;
use std::time::Duration;

use chrono::SecondsFormat;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use peregrine_graph::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, ListQuery, LoadedCheckpoint, NewCheckpoint, ThreadLock,
    ThreadSummary,
};
use tokio_postgres::NoTls;

use lock::LocalLocks;

const BACKEND: &str = "postgres";

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 1;

/// Connections used for queries when none is given.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Threads one instance can hold locked at once when no limit is given (one connection each).
pub const DEFAULT_MAX_THREAD_LOCKS: usize = 64;

/// How long a query waits for a free pooled connection before failing.
const POOL_WAIT: Duration = Duration::from_secs(60);
/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Key of the transaction-level advisory lock that serialises schema creation across instances.
const SCHEMA_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended('peregrine_checkpoint_schema', 0))";

const SCHEMA_V1: &str = r#"
CREATE TABLE peregrine_threads (
    thread_id TEXT PRIMARY KEY,
    last_checkpoint_id BIGINT NOT NULL,
    checkpoints BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX peregrine_threads_updated ON peregrine_threads (updated_at DESC, thread_id COLLATE "C");
CREATE TABLE peregrine_checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_id BIGINT NOT NULL,
    parent_id BIGINT,
    meta TEXT NOT NULL,
    delta BYTEA NOT NULL,
    snapshot BYTEA,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id)
);
CREATE TABLE peregrine_schema_version (version INTEGER PRIMARY KEY);
INSERT INTO peregrine_schema_version (version) VALUES (1);
"#;

/// The schema holding `peregrine_schema_version` as the search path resolves it (NULL when
/// there is none), and the schema new tables would go to.
const EXISTING_SCHEMA_SQL: &str =
    "SELECT (SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass('peregrine_schema_version')), current_schema()";

const BUMP_THREAD_SQL: &str = "
INSERT INTO peregrine_threads AS t (thread_id, last_checkpoint_id, checkpoints, updated_at)
VALUES ($1::text, 1, 1, $2::text::timestamptz)
ON CONFLICT (thread_id) DO UPDATE
SET last_checkpoint_id = t.last_checkpoint_id + 1, checkpoints = t.checkpoints + 1, updated_at = EXCLUDED.updated_at
RETURNING last_checkpoint_id";

const CHECKPOINT_EXISTS_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM peregrine_checkpoints WHERE thread_id = $1::text AND checkpoint_id = $2::bigint)";

const INSERT_CHECKPOINT_SQL: &str = "
INSERT INTO peregrine_checkpoints (thread_id, checkpoint_id, parent_id, meta, delta, snapshot, created_at)
SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::bytea, $6::bytea, $7::text::timestamptz
WHERE $3::bigint IS NULL
   OR EXISTS (SELECT 1 FROM peregrine_checkpoints WHERE thread_id = $1::text AND checkpoint_id = $3::bigint)";

/// Walks the parent chain from the target up to (and including) the nearest snapshot; rows come
/// oldest first. Only the target's metadata, the snapshot and the deltas after it are returned.
const LOAD_SQL: &str = "
WITH RECURSIVE chain (checkpoint_id, parent_id, has_snapshot, depth) AS (
    SELECT c.checkpoint_id, c.parent_id, c.snapshot IS NOT NULL, 0
    FROM peregrine_checkpoints c
    WHERE c.thread_id = $1::text
      AND c.checkpoint_id = COALESCE($2::bigint, (SELECT max(checkpoint_id) FROM peregrine_checkpoints WHERE thread_id = $1::text))
  UNION ALL
    SELECT p.checkpoint_id, p.parent_id, p.snapshot IS NOT NULL, chain.depth + 1
    FROM chain
    JOIN peregrine_checkpoints p ON p.thread_id = $1::text AND p.checkpoint_id = chain.parent_id
    WHERE NOT chain.has_snapshot
)
SELECT chain.checkpoint_id, chain.parent_id,
       CASE WHEN chain.depth = 0 THEN c.meta END AS meta,
       CASE WHEN chain.has_snapshot THEN NULL ELSE c.delta END AS delta,
       c.snapshot
FROM chain
JOIN peregrine_checkpoints c ON c.thread_id = $1::text AND c.checkpoint_id = chain.checkpoint_id
ORDER BY chain.depth DESC";

const LIST_SQL: &str = "
SELECT checkpoint_id, parent_id, meta FROM peregrine_checkpoints
WHERE thread_id = $1::text AND ($2::bigint IS NULL OR checkpoint_id < $2::bigint)
ORDER BY checkpoint_id DESC
LIMIT $3::bigint";

const THREADS_SQL: &str = r#"
SELECT t.thread_id, t.checkpoints, c.checkpoint_id, c.parent_id, c.meta
FROM peregrine_threads t
JOIN peregrine_checkpoints c ON c.thread_id = t.thread_id AND c.checkpoint_id = t.last_checkpoint_id
ORDER BY t.updated_at DESC, t.thread_id COLLATE "C""#;

/// How a [`PostgresCheckpointer`] sizes its connection pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Connections shared by all queries.
    pub pool_size: usize,
    /// Threads this instance can hold locked at once; each lock keeps one extra connection open.
    pub max_thread_locks: usize,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self { pool_size: DEFAULT_POOL_SIZE, max_thread_locks: DEFAULT_MAX_THREAD_LOCKS }
    }
}

/// Problems of this backend that have no `tokio_postgres` error behind them.
#[derive(Debug, thiserror::Error)]
enum PostgresProblem {
    #[error(
        "schema '{schema}' has an empty peregrine_schema_version table, so its checkpoint tables cannot be trusted; repair or drop them"
    )]
    SchemaVersionMissing { schema: String },
    #[error("all {limit} connections reserved for thread locks are in use; wait for runs to finish or raise max_thread_locks")]
    LockConnectionsExhausted { limit: usize },
    #[error("a pool size must be at least 1 (got pool_size {pool_size}, max_thread_locks {max_thread_locks})")]
    EmptyPool { pool_size: usize, max_thread_locks: usize },
}

/// Checkpoints in PostgreSQL, shareable by several server instances.
pub struct PostgresCheckpointer {
    pool: Pool,
    lock_pool: Pool,
    max_thread_locks: usize,
    /// Distinguishes this schema's threads from same-named threads in other schemas when
    /// deriving advisory-lock keys (locks are per database).
    schema: String,
    local_locks: LocalLocks,
}

impl std::fmt::Debug for PostgresCheckpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCheckpointer").field("schema", &self.schema).finish_non_exhaustive()
    }
}

fn backend(operation: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CheckpointError {
    move |e| CheckpointError::backend(BACKEND, operation, e)
}

fn pool_error(operation: &'static str) -> impl FnOnce(deadpool_postgres::PoolError) -> CheckpointError {
    move |e| CheckpointError::backend(BACKEND, operation, e)
}

impl PostgresCheckpointer {
    /// Connects with default pool sizes and creates the schema if needed.
    pub async fn connect(url: &str) -> Result<Self, CheckpointError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects with `pool_size` query connections and creates the schema if needed.
    pub async fn connect_with_pool_size(url: &str, pool_size: usize) -> Result<Self, CheckpointError> {
        Self::connect_with(url, PostgresOptions { pool_size, ..PostgresOptions::default() }).await
    }

    /// Connects with the given options and creates the schema if needed.
    ///
    /// `url` is a libpq-style URL or key/value string; tables live in the first schema of the
    /// connection's `search_path` (set it with `options=-csearch_path%3Dname`).
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, CheckpointError> {
        if options.pool_size == 0 || options.max_thread_locks == 0 {
            return Err(CheckpointError::backend(
                BACKEND,
                "connect",
                PostgresProblem::EmptyPool { pool_size: options.pool_size, max_thread_locks: options.max_thread_locks },
            ));
        }
        let mut config = tokio_postgres::Config::from_str(url).map_err(backend("parse the connection URL"))?;
        if config.get_application_name().is_none() {
            config.application_name("peregrine-checkpoint");
        }
        let pool = build_pool(config.clone(), options.pool_size, Some(POOL_WAIT))?;
        let lock_pool = build_pool(config, options.max_thread_locks, Some(Duration::ZERO))?;
        let schema = create_schema(&pool).await?;
        Ok(Self { pool, lock_pool, max_thread_locks: options.max_thread_locks, schema, local_locks: LocalLocks::default() })
    }

    async fn client(&self, operation: &'static str) -> Result<Object, CheckpointError> {
        self.pool.get().await.map_err(pool_error(operation))
    }
}

fn build_pool(config: tokio_postgres::Config, size: usize, wait: Option<Duration>) -> Result<Pool, CheckpointError> {
    // `Fast` recycling only checks the connection is open: `Clean` would run
    // `pg_advisory_unlock_all()`, and lock connections are only returned once unlocked anyway.
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(CONNECT_TIMEOUT))
        .wait_timeout(wait)
        .build()
        .map_err(|e| CheckpointError::backend(BACKEND, "create the connection pool", e))
}

/// Creates the tables unless they exist, under a transaction-level advisory lock so instances
/// starting together do not race; returns the schema the tables live in. Existing tables are only
/// read, so a role without `CREATE` can use a schema made for it.
async fn create_schema(pool: &Pool) -> Result<String, CheckpointError> {
    const OPERATION: &str = "create the schema";
    let mut client = pool.get().await.map_err(pool_error("connect"))?;
    let tx = client.transaction().await.map_err(backend(OPERATION))?;
    tx.batch_execute(SCHEMA_LOCK_SQL).await.map_err(backend(OPERATION))?;
    let row = tx.query_one(EXISTING_SCHEMA_SQL, &[]).await.map_err(backend(OPERATION))?;
    let existing: Option<String> = row.try_get(0).map_err(backend(OPERATION))?;
    let current: Option<String> = row.try_get(1).map_err(backend(OPERATION))?;
    let schema = match existing {
        Some(schema) => {
            let row = tx.query_one("SELECT max(version) FROM peregrine_schema_version", &[]).await.map_err(backend(OPERATION))?;
            match row.try_get::<_, Option<i32>>(0).map_err(backend(OPERATION))? {
                Some(found) if found <= SCHEMA_VERSION => {}
                Some(found) => {
                    return Err(CheckpointError::UnsupportedSchema {
                        backend: BACKEND,
                        found: found.into(),
                        supported: SCHEMA_VERSION.into(),
                    });
                }
                None => {
                    let problem = PostgresProblem::SchemaVersionMissing { schema: schema.clone() };
                    return Err(CheckpointError::backend(BACKEND, "check the schema version", problem));
                }
            }
            schema
        }
        None => {
            // Without a schema on the search path the DDL fails with the server's own clear error.
            tx.batch_execute(SCHEMA_V1).await.map_err(backend(OPERATION))?;
            current.unwrap_or_default()
        }
    };
    tx.commit().await.map_err(backend(OPERATION))?;
    Ok(schema)
}

fn to_db_id(id: CheckpointId) -> Option<i64> {
    i64::try_from(id).ok()
}

fn from_db_id(thread_id: &str, id: i64) -> Result<CheckpointId, CheckpointError> {
    CheckpointId::try_from(id).map_err(|_| corrupt(thread_id, format!("negative checkpoint id {id}")))
}

fn corrupt(thread_id: &str, reason: String) -> CheckpointError {
    CheckpointError::Corrupt { thread_id: thread_id.to_owned(), reason }
}

/// Reads stored metadata; the columns, not the JSON, decide the thread and ids (a copied
/// thread keeps its source's JSON).
fn read_meta(thread_id: &str, checkpoint_id: i64, parent_id: Option<i64>, meta: &str) -> Result<CheckpointMeta, CheckpointError> {
    let mut parsed: CheckpointMeta = serde_json::from_str(meta)
        .map_err(|e| corrupt(thread_id, format!("metadata of checkpoint {checkpoint_id} is not valid JSON metadata: {e}")))?;
    parsed.thread_id = thread_id.to_owned();
    parsed.checkpoint_id = from_db_id(thread_id, checkpoint_id)?;
    parsed.parent_id = parent_id.map(|id| from_db_id(thread_id, id)).transpose()?;
    Ok(parsed)
}

fn meta_row(thread_id: &str, row: &tokio_postgres::Row, operation: &'static str) -> Result<CheckpointMeta, CheckpointError> {
    let checkpoint_id: i64 = row.try_get("checkpoint_id").map_err(backend(operation))?;
    let parent_id: Option<i64> = row.try_get("parent_id").map_err(backend(operation))?;
    let meta: &str = row.try_get("meta").map_err(backend(operation))?;
    read_meta(thread_id, checkpoint_id, parent_id, meta)
}

impl Checkpointer for PostgresCheckpointer {
    async fn put(&self, checkpoint: NewCheckpoint) -> Result<CheckpointMeta, CheckpointError> {
        const OPERATION: &str = "store a checkpoint";
        let thread_id = checkpoint.thread_id.as_str();
        if checkpoint.parent_id.is_none() && checkpoint.snapshot.is_none() {
            // A root without a snapshot could never be loaded.
            return Err(CheckpointError::MissingSnapshot { thread_id: thread_id.to_owned() });
        }
        let unknown_parent = |parent_id| CheckpointError::UnknownParent { thread_id: thread_id.to_owned(), parent_id };
        let parent_id = match checkpoint.parent_id {
            Some(parent) => Some(to_db_id(parent).ok_or_else(|| unknown_parent(parent))?),
            None => None,
        };

        // Microseconds, the precision of `timestamptz`; the exact value lives in the metadata.
        let created_at = checkpoint.created_at.to_rfc3339_opts(SecondsFormat::Micros, true);

        let mut client = self.client(OPERATION).await?;
        let tx = client.transaction().await.map_err(backend(OPERATION))?;
        let bump = tx.prepare_cached(BUMP_THREAD_SQL).await.map_err(backend(OPERATION))?;
        let id: i64 = tx.query_one(&bump, &[&thread_id, &created_at]).await.and_then(|row| row.try_get(0)).map_err(backend(OPERATION))?;
        let checkpoint_id = from_db_id(thread_id, id)?;
        // The counter row stays locked until commit and held the highest id before the bump; an
        // id of 1 means the bump created it for an empty thread.
        let latest = (checkpoint_id > 1).then(|| checkpoint_id - 1);
        if checkpoint.source != CheckpointSource::Fork && checkpoint.parent_id != latest {
            if let (Some(parent), Some(db_parent)) = (checkpoint.parent_id, parent_id) {
                // A parent that does not exist at all is reported as such, as for forks.
                let exists = tx.prepare_cached(CHECKPOINT_EXISTS_SQL).await.map_err(backend(OPERATION))?;
                let exists: bool =
                    tx.query_one(&exists, &[&thread_id, &db_parent]).await.and_then(|row| row.try_get(0)).map_err(backend(OPERATION))?;
                if !exists {
                    tx.rollback().await.map_err(backend(OPERATION))?;
                    return Err(unknown_parent(parent));
                }
            }
            tx.rollback().await.map_err(backend(OPERATION))?;
            return Err(CheckpointError::Conflict { thread_id: thread_id.to_owned(), expected: checkpoint.parent_id, latest });
        }
        let meta = checkpoint.meta(checkpoint_id);
        let meta_json = serde_json::to_string(&meta).map_err(|e| CheckpointError::backend(BACKEND, "serialize checkpoint metadata", e))?;
        let insert = tx.prepare_cached(INSERT_CHECKPOINT_SQL).await.map_err(backend(OPERATION))?;
        let inserted = tx
            .execute(&insert, &[&thread_id, &id, &parent_id, &meta_json, &checkpoint.delta, &checkpoint.snapshot, &created_at])
            .await
            .map_err(backend(OPERATION))?;
        if let (0, Some(parent)) = (inserted, checkpoint.parent_id) {
            // Only a missing parent filters the row out.
            tx.rollback().await.map_err(backend(OPERATION))?;
            return Err(unknown_parent(parent));
        }
        tx.commit().await.map_err(backend(OPERATION))?;
        Ok(meta)
    }

    async fn load(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        const OPERATION: &str = "load a checkpoint";
        let wanted = match checkpoint_id {
            Some(id) => match to_db_id(id) {
                Some(id) => Some(id),
                None => return Ok(None),
            },
            None => None,
        };
        let client = self.client(OPERATION).await?;
        let statement = client.prepare_cached(LOAD_SQL).await.map_err(backend(OPERATION))?;
        let rows = client.query(&statement, &[&thread_id, &wanted]).await.map_err(backend(OPERATION))?;
        let Some((first, rest)) = rows.split_first() else {
            return Ok(None);
        };
        let Some(target) = rows.last() else {
            return Ok(None);
        };
        let target_id: i64 = target.try_get("checkpoint_id").map_err(backend(OPERATION))?;
        let Some(snapshot) = first.try_get::<_, Option<Vec<u8>>>("snapshot").map_err(backend(OPERATION))? else {
            let oldest: i64 = first.try_get("checkpoint_id").map_err(backend(OPERATION))?;
            return Err(corrupt(
                thread_id,
                format!("the parent chain of checkpoint {target_id} ends at checkpoint {oldest} without reaching a snapshot"),
            ));
        };
        let mut deltas = Vec::with_capacity(rest.len());
        for row in rest {
            let delta: Option<Vec<u8>> = row.try_get("delta").map_err(backend(OPERATION))?;
            let id: i64 = row.try_get("checkpoint_id").map_err(backend(OPERATION))?;
            deltas.push(delta.ok_or_else(|| corrupt(thread_id, format!("checkpoint {id} has a snapshot in the middle of a delta chain")))?);
        }
        let meta = meta_row(thread_id, target, OPERATION)?;
        Ok(Some(LoadedCheckpoint { meta, snapshot, deltas }))
    }

    async fn list(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        const OPERATION: &str = "list checkpoints";
        // Ids never exceed i64::MAX, so a larger bound excludes nothing.
        let before = query.before.map(|id| to_db_id(id).unwrap_or(i64::MAX));
        let limit = query.limit.map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
        let client = self.client(OPERATION).await?;
        let statement = client.prepare_cached(LIST_SQL).await.map_err(backend(OPERATION))?;
        let rows = client.query(&statement, &[&thread_id, &before, &limit]).await.map_err(backend(OPERATION))?;
        rows.iter().map(|row| meta_row(thread_id, row, OPERATION)).collect()
    }

    async fn threads(&self) -> Result<Vec<ThreadSummary>, CheckpointError> {
        const OPERATION: &str = "list threads";
        let client = self.client(OPERATION).await?;
        let statement = client.prepare_cached(THREADS_SQL).await.map_err(backend(OPERATION))?;
        let rows = client.query(&statement, &[]).await.map_err(backend(OPERATION))?;
        rows.iter()
            .map(|row| {
                let thread_id: String = row.try_get("thread_id").map_err(backend(OPERATION))?;
                let count: i64 = row.try_get("checkpoints").map_err(backend(OPERATION))?;
                let checkpoints = u64::try_from(count).map_err(|_| corrupt(&thread_id, format!("negative checkpoint count {count}")))?;
                let latest = meta_row(&thread_id, row, OPERATION)?;
                Ok(ThreadSummary { thread_id, latest, checkpoints })
            })
            .collect()
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        const OPERATION: &str = "delete a thread";
        let mut client = self.client(OPERATION).await?;
        let tx = client.transaction().await.map_err(backend(OPERATION))?;
        // Locking the thread row first waits out writers in flight and blocks new ones, so no
        // checkpoint slips in between the two deletes.
        let found = tx
            .query_opt("SELECT 1 FROM peregrine_threads WHERE thread_id = $1::text FOR UPDATE", &[&thread_id])
            .await
            .map_err(backend(OPERATION))?;
        if found.is_some() {
            tx.execute("DELETE FROM peregrine_checkpoints WHERE thread_id = $1::text", &[&thread_id]).await.map_err(backend(OPERATION))?;
            tx.execute("DELETE FROM peregrine_threads WHERE thread_id = $1::text", &[&thread_id]).await.map_err(backend(OPERATION))?;
        }
        tx.commit().await.map_err(backend(OPERATION))
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        const OPERATION: &str = "copy a thread";
        let mut client = self.client(OPERATION).await?;
        let tx = client.transaction().await.map_err(backend(OPERATION))?;
        // FOR SHARE keeps writers of `from` out until the copy commits, so it is consistent.
        let source = tx
            .query_opt("SELECT 1 FROM peregrine_threads WHERE thread_id = $1::text FOR SHARE", &[&from])
            .await
            .map_err(backend(OPERATION))?;
        if source.is_none() {
            tx.rollback().await.map_err(backend(OPERATION))?;
            return Err(CheckpointError::ThreadNotFound { thread_id: from.to_owned() });
        }
        let created = tx
            .execute(
                "INSERT INTO peregrine_threads (thread_id, last_checkpoint_id, checkpoints, updated_at)
                 SELECT $2::text, last_checkpoint_id, checkpoints, updated_at FROM peregrine_threads WHERE thread_id = $1::text
                 ON CONFLICT (thread_id) DO NOTHING",
                &[&from, &to],
            )
            .await
            .map_err(backend(OPERATION))?;
        if created == 0 {
            tx.rollback().await.map_err(backend(OPERATION))?;
            return Err(CheckpointError::ThreadExists { thread_id: to.to_owned() });
        }
        tx.execute(
            "INSERT INTO peregrine_checkpoints (thread_id, checkpoint_id, parent_id, meta, delta, snapshot, created_at)
             SELECT $2::text, checkpoint_id, parent_id, meta, delta, snapshot, created_at
             FROM peregrine_checkpoints WHERE thread_id = $1::text",
            &[&from, &to],
        )
        .await
        .map_err(backend(OPERATION))?;
        tx.commit().await.map_err(backend(OPERATION))
    }

    async fn lock_thread(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        self.acquire_thread_lock(thread_id).await
    }

    async fn is_thread_locked(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        self.probe_thread_lock(thread_id).await
    }
}

//! The SQL of the SQLite checkpointer: schema setup, and each operation as a blocking function
//! over a connection (the writer's or a reader's), without any threading.

use std::collections::HashSet;

use chrono::SecondsFormat;
use peregrine_graph::checkpoint::{
    CheckpointError, CheckpointMeta, CheckpointSource, ListQuery, LoadedCheckpoint, NewCheckpoint, ThreadSummary,
};
use rusqlite::{Connection, TransactionBehavior, params};

use super::{BACKEND, BUSY_TIMEOUT, SCHEMA_VERSION, checkpoint_id, corrupt, failed, sql_id};

const CREATE_VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)";

const CREATE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id     TEXT    NOT NULL,
    checkpoint_id INTEGER NOT NULL,
    parent_id     INTEGER,
    meta          TEXT    NOT NULL, -- JSON of CheckpointMeta; the columns above win over it
    delta         BLOB    NOT NULL,
    snapshot      BLOB,
    created_at    TEXT    NOT NULL, -- RFC 3339 with nanoseconds, so that text order is time order
    PRIMARY KEY (thread_id, checkpoint_id)
);";

/// The thread's newest id (NULL for an empty thread): one seek on the primary key.
const LATEST_ID: &str = "SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ?1";

const CHECKPOINT_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2)";

const THREAD_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = ?1)";

const INSERT: &str = "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_id, meta, delta, snapshot, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// The ids of the target checkpoint (newest when ?2 is NULL) and its ancestors up to the first
/// one holding a snapshot. Walks ids only: carrying blobs through the recursion (or joining them
/// back onto it) cost several times more than the two queries together.
const CHAIN_IDS: &str = "
WITH RECURSIVE chain (checkpoint_id, parent_id, has_snapshot) AS (
    SELECT checkpoint_id, parent_id, snapshot IS NOT NULL
    FROM checkpoints
    WHERE thread_id = ?1
      AND checkpoint_id = COALESCE(?2, (SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ?1))
    UNION ALL
    SELECT parent.checkpoint_id, parent.parent_id, parent.snapshot IS NOT NULL
    FROM chain
    JOIN checkpoints AS parent ON parent.thread_id = ?1 AND parent.checkpoint_id = chain.parent_id
    WHERE NOT chain.has_snapshot
)
SELECT checkpoint_id FROM chain";

/// The rows of an id range, oldest first: a parent always has a lower id than its child, so a
/// chain lies inside the range from its snapshot holder to its target (other branches' rows in
/// that range are skipped by the caller).
const CHAIN_ROWS: &str = "SELECT checkpoint_id, parent_id, CASE WHEN checkpoint_id = ?3 THEN meta END, delta, snapshot
FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id BETWEEN ?2 AND ?3 ORDER BY checkpoint_id";

const LIST: &str = "SELECT checkpoint_id, parent_id, meta FROM checkpoints
WHERE thread_id = ?1 AND checkpoint_id < ?2
ORDER BY checkpoint_id DESC
LIMIT ?3";

const THREADS: &str = "
SELECT newest.thread_id, newest.checkpoint_id, newest.parent_id, newest.meta, counts.checkpoints
FROM (SELECT thread_id, MAX(checkpoint_id) AS latest, COUNT(*) AS checkpoints FROM checkpoints GROUP BY thread_id) AS counts
JOIN checkpoints AS newest ON newest.thread_id = counts.thread_id AND newest.checkpoint_id = counts.latest
ORDER BY newest.created_at DESC, newest.thread_id ASC";

const DELETE_THREAD: &str = "DELETE FROM checkpoints WHERE thread_id = ?1";

const COPY_THREAD: &str = "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_id, meta, delta, snapshot, created_at)
SELECT ?2, checkpoint_id, parent_id, json_set(meta, '$.thread_id', ?2), delta, snapshot, created_at
FROM checkpoints WHERE thread_id = ?1";

/// How many prepared statements each connection keeps.
const STATEMENT_CACHE: usize = 32;

/// Sets the write connection up and brings the schema to `SCHEMA_VERSION`, changing nothing in a
/// file it refuses. Returns the journal mode in effect (`wal` for a file SQLite can share with
/// readers, `memory` for an in-memory database).
pub(super) fn prepare(connection: &mut Connection) -> Result<String, CheckpointError> {
    let operation = "prepare the database";
    connection.busy_timeout(BUSY_TIMEOUT).map_err(failed(operation))?;
    connection.pragma_update(None, "synchronous", "FULL").map_err(failed(operation))?;
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);

    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(failed(operation))?;
    transaction.execute_batch(CREATE_VERSION_TABLE).map_err(failed(operation))?;
    let found: Option<i64> =
        transaction.query_row("SELECT MAX(version) FROM schema_version", [], |row| row.get(0)).map_err(failed(operation))?;
    match found {
        Some(SCHEMA_VERSION) => {}
        Some(found) => {
            return Err(CheckpointError::UnsupportedSchema { backend: BACKEND, found, supported: SCHEMA_VERSION });
        }
        None => {
            transaction.execute("INSERT INTO schema_version (version) VALUES (?1)", [SCHEMA_VERSION]).map_err(failed(operation))?;
        }
    }
    transaction.execute_batch(CREATE_SCHEMA).map_err(failed(operation))?;
    transaction.commit().map_err(failed(operation))?;

    // Set only once the file is known to be ours; in-memory databases answer "memory".
    let mode: String = connection.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)).map_err(failed(operation))?;
    tracing::debug!(journal_mode = %mode, "sqlite checkpoint database ready");
    Ok(mode)
}

/// Sets a read-only connection up.
pub(super) fn prepare_reader(connection: &Connection) -> Result<(), CheckpointError> {
    connection.busy_timeout(BUSY_TIMEOUT).map_err(failed("open a read connection"))?;
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// A stored row's metadata: the JSON, with the thread and ids taken from the columns.
fn decode_meta(thread_id: &str, stored_id: i64, stored_parent: Option<i64>, json: &str) -> Result<CheckpointMeta, CheckpointError> {
    let mut meta: CheckpointMeta = serde_json::from_str(json).map_err(|error| {
        corrupt(thread_id, format!("the metadata of checkpoint {stored_id} is not valid JSON of a checkpoint: {error}"))
    })?;
    thread_id.clone_into(&mut meta.thread_id);
    meta.checkpoint_id = checkpoint_id(thread_id, stored_id)?;
    meta.parent_id = stored_parent.map(|parent| checkpoint_id(thread_id, parent)).transpose()?;
    Ok(meta)
}

/// Stores one checkpoint inside the caller's write transaction (the writer's savepoint), which
/// holds the file's write lock, so no other connection can move the newest id between reading it
/// here and the commit. A failure writes nothing the caller's rollback would not undo.
pub(super) fn put_in(connection: &Connection, checkpoint: NewCheckpoint) -> Result<CheckpointMeta, CheckpointError> {
    let operation = "store a checkpoint";
    if checkpoint.parent_id.is_none() && checkpoint.snapshot.is_none() {
        return Err(CheckpointError::MissingSnapshot { thread_id: checkpoint.thread_id });
    }
    let thread_id = checkpoint.thread_id.as_str();
    let stored_latest: Option<i64> = connection
        .prepare_cached(LATEST_ID)
        .map_err(failed(operation))?
        .query_row([thread_id], |row| row.get(0))
        .map_err(failed(operation))?;
    let latest = stored_latest.map(|id| checkpoint_id(thread_id, id)).transpose()?;
    // The newest checkpoint exists; any other parent is looked up.
    if let Some(parent_id) = checkpoint.parent_id
        && checkpoint.parent_id != latest
    {
        let exists = match sql_id(parent_id) {
            Some(parent) => {
                let mut statement = connection.prepare_cached(CHECKPOINT_EXISTS).map_err(failed(operation))?;
                statement.query_row(params![thread_id, parent], |row| row.get(0)).map_err(failed(operation))?
            }
            None => false,
        };
        if !exists {
            return Err(CheckpointError::UnknownParent { thread_id: thread_id.to_owned(), parent_id });
        }
    }
    if checkpoint.source != CheckpointSource::Fork && checkpoint.parent_id != latest {
        return Err(CheckpointError::Conflict { thread_id: thread_id.to_owned(), expected: checkpoint.parent_id, latest });
    }
    let next_id = stored_latest.map_or(1, |id| id + 1);
    let meta = checkpoint.meta(checkpoint_id(thread_id, next_id)?);
    let json = serde_json::to_string(&meta).map_err(|error| CheckpointError::backend(BACKEND, operation, error))?;
    let created_at = meta.created_at.to_rfc3339_opts(SecondsFormat::Nanos, true);
    let parent = checkpoint.parent_id.and_then(sql_id);
    connection
        .prepare_cached(INSERT)
        .map_err(failed(operation))?
        .execute(params![thread_id, next_id, parent, json, checkpoint.delta, checkpoint.snapshot, created_at])
        .map_err(failed(operation))?;
    Ok(meta)
}

/// One row of the chain query.
struct ChainRow {
    checkpoint_id: i64,
    parent_id: Option<i64>,
    meta: Option<String>,
    delta: Vec<u8>,
    snapshot: Option<Vec<u8>>,
}

pub(super) fn load(connection: &mut Connection, thread_id: &str, wanted: Option<i64>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
    let operation = "load a checkpoint";
    // One read transaction, so both queries see the same snapshot of the file.
    let transaction = connection.transaction().map_err(failed(operation))?;
    let mut ids_statement = transaction.prepare_cached(CHAIN_IDS).map_err(failed(operation))?;
    let ids = ids_statement
        .query_map(params![thread_id, wanted], |row| row.get::<_, i64>(0))
        .map_err(failed(operation))?
        .collect::<Result<HashSet<i64>, _>>()
        .map_err(failed(operation))?;
    let (Some(&first), Some(&last)) = (ids.iter().min(), ids.iter().max()) else {
        return Ok(None);
    };
    let mut statement = transaction.prepare_cached(CHAIN_ROWS).map_err(failed(operation))?;
    let rows = statement
        .query_map(params![thread_id, first, last], |row| {
            Ok(ChainRow {
                checkpoint_id: row.get(0)?,
                parent_id: row.get(1)?,
                meta: row.get(2)?,
                delta: row.get(3)?,
                snapshot: row.get(4)?,
            })
        })
        .map_err(failed(operation))?;
    let mut chain = Vec::with_capacity(ids.len());
    for row in rows {
        let row = row.map_err(failed(operation))?;
        if ids.contains(&row.checkpoint_id) {
            chain.push(row);
        }
    }
    drop((statement, ids_statement));
    transaction.finish().map_err(failed(operation))?;
    if chain.len() != ids.len() {
        return Err(corrupt(thread_id, format!("the chain of checkpoint {last} has rows the range scan did not find")));
    }
    let Some(target) = chain.pop() else {
        return Ok(None);
    };
    let json = target.meta.as_deref().ok_or_else(|| corrupt(thread_id, "the chain query lost the target's metadata".to_owned()))?;
    let meta = decode_meta(thread_id, target.checkpoint_id, target.parent_id, json)?;
    // What is left are the target's ancestors, the snapshot holder first.
    let mut ancestors = chain.into_iter();
    let (snapshot, deltas) = match ancestors.next() {
        None => (target.snapshot, Vec::new()),
        Some(holder) => {
            let mut deltas: Vec<Vec<u8>> = ancestors.map(|row| row.delta).collect();
            deltas.push(target.delta);
            (holder.snapshot, deltas)
        }
    };
    let snapshot =
        snapshot.ok_or_else(|| corrupt(thread_id, format!("checkpoint {} has no snapshot on its parent chain", meta.checkpoint_id)))?;
    Ok(Some(LoadedCheckpoint { meta, snapshot, deltas }))
}

pub(super) fn list(connection: &mut Connection, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, CheckpointError> {
    let operation = "list checkpoints";
    let before = query.before.map_or(i64::MAX, |before| sql_id(before).unwrap_or(i64::MAX));
    // SQLite reads a negative LIMIT as "no limit".
    let limit = query.limit.map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let mut statement = connection.prepare_cached(LIST).map_err(failed(operation))?;
    let rows = statement
        .query_map(params![thread_id, before, limit], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Option<i64>>(1)?, row.get::<_, String>(2)?))
        })
        .map_err(failed(operation))?;
    let rows = rows.collect::<Result<Vec<_>, _>>().map_err(failed(operation))?;
    rows.iter().map(|(id, parent, json)| decode_meta(thread_id, *id, *parent, json)).collect()
}

pub(super) fn threads(connection: &mut Connection) -> Result<Vec<ThreadSummary>, CheckpointError> {
    let operation = "list threads";
    let mut statement = connection.prepare_cached(THREADS).map_err(failed(operation))?;
    let rows = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Option<i64>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, i64>(4)?,
            ))
        })
        .map_err(failed(operation))?;
    let rows = rows.collect::<Result<Vec<_>, _>>().map_err(failed(operation))?;
    rows.into_iter()
        .map(|(thread_id, id, parent, json, count)| {
            let latest = decode_meta(&thread_id, id, parent, &json)?;
            let checkpoints = u64::try_from(count).map_err(|_| corrupt(&thread_id, format!("negative checkpoint count {count}")))?;
            Ok(ThreadSummary { thread_id, latest, checkpoints })
        })
        .collect()
}

pub(super) fn delete_thread(connection: &mut Connection, thread_id: &str) -> Result<(), CheckpointError> {
    let operation = "delete a thread";
    connection.prepare_cached(DELETE_THREAD).map_err(failed(operation))?.execute([thread_id]).map_err(failed(operation))?;
    Ok(())
}

pub(super) fn copy_thread(connection: &mut Connection, from: &str, to: &str) -> Result<(), CheckpointError> {
    let operation = "copy a thread";
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(failed(operation))?;
    {
        let mut exists = transaction.prepare_cached(THREAD_EXISTS).map_err(failed(operation))?;
        if !exists.query_row([from], |row| row.get::<_, bool>(0)).map_err(failed(operation))? {
            return Err(CheckpointError::ThreadNotFound { thread_id: from.to_owned() });
        }
        if exists.query_row([to], |row| row.get::<_, bool>(0)).map_err(failed(operation))? {
            return Err(CheckpointError::ThreadExists { thread_id: to.to_owned() });
        }
        transaction.prepare_cached(COPY_THREAD).map_err(failed(operation))?.execute([from, to]).map_err(failed(operation))?;
    }
    transaction.commit().map_err(failed(operation))
}

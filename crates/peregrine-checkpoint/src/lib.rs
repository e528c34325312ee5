//! Checkpoint backends for `peregrine-graph`: in-memory, SQLite (the embedded default: one file,
//! WAL, durable on every step) and PostgreSQL (several server instances sharing threads, with a
//! per-thread lock), plus the conformance suite every backend passes.

pub mod conformance;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::MemoryCheckpointer;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresCheckpointer, PostgresOptions};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteCheckpointer;

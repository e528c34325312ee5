//! The per-user memory files (reference §5.2): `<agent_data_dir>/user_memory/<user>.json`,
//! append-only, written durably (temp file in the same directory, fsync, rename, fsync of the
//! directory) so a crash leaves either the old file or the new one, never a torn one. Each
//! append's read-modify-write holds an exclusive OS lock on the sidecar `<user>.json.lock`, so
//! processes sharing a data directory (a CLI and a server) never lose each other's saves;
//! readers need no lock, since a rename replaces the file whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How timestamps are written in memory files (`YYYY-MM-DD HH:MM`, upstream's format).
pub const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M";

/// The directory under the agent data directory that holds the memory files.
pub const MEMORY_DIR: &str = "user_memory";

/// One saved memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryEntry {
    /// When it was saved, `YYYY-MM-DD HH:MM` in the facility's local time.
    pub timestamp: String,
    /// What was saved.
    pub content: String,
    /// Fields other tools added to the entry; kept as they are when the file is rewritten.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl MemoryEntry {
    /// An entry saved at `now` (the facility's local time).
    pub fn new(content: impl Into<String>, now: NaiveDateTime) -> Self {
        Self { timestamp: now.format(TIMESTAMP_FORMAT).to_string(), content: content.into(), extra: Map::new() }
    }
}

/// The whole file of one user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemoryFile {
    /// The user id as given (not sanitized), so two ids that map to one file name are told apart.
    #[serde(default)]
    user_id: String,
    /// When an entry was last added.
    #[serde(default)]
    last_updated: String,
    /// The entries, oldest first.
    entries: Vec<MemoryEntry>,
    /// Fields other tools added; kept when the file is rewritten.
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// Why a memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The user id has no character of `[A-Za-z0-9_-]`, so it names no file.
    #[error("user id '{user_id}' has no letters, digits, '-' or '_', so it cannot name a memory file; use another session user_id")]
    InvalidUserId {
        /// The id as given.
        user_id: String,
    },
    /// Nothing to save.
    #[error("refusing to save an empty memory entry")]
    EmptyContent,
    /// The file exists but is not a memory file; it is left untouched.
    #[error("memory file {} is corrupt ({reason}); it was left untouched: repair or move it away, then try again", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the JSON decoder said.
        reason: String,
    },
    /// The file belongs to another user id that sanitizes to the same file name.
    #[error(
        "memory file {} belongs to user '{stored}', not '{requested}' (both map to the same file name); use a user id of letters, digits, '-' and '_' only",
        path.display()
    )]
    UserMismatch {
        /// The file.
        path: PathBuf,
        /// The user id recorded in the file.
        stored: String,
        /// The user id asked for.
        requested: String,
    },
    /// The file system refused.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`read`, `write`, `create directory`, …).
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The blocking file task panicked or was cancelled.
    #[error("the memory file task did not finish: {0}")]
    Task(String),
}

/// Keeps the characters upstream keeps in file names: ASCII letters, digits, `-` and `_`.
pub fn sanitize_user_id(user_id: &str) -> String {
    user_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect()
}

/// One JSON file per user under `<agent_data_dir>/user_memory/`. Cloning shares the in-process
/// write lock, so every clone in a process serializes its appends; an OS file lock serializes
/// them with other stores and other processes on the same directory.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    directory: PathBuf,
    write_lock: Arc<tokio::sync::Mutex<()>>,
}

/// Distinguishes temp files of concurrent writers in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl MemoryStore {
    /// The store of the agent data directory `agent_data_dir` (files live in its `user_memory/`).
    pub fn new(agent_data_dir: impl AsRef<Path>) -> Self {
        Self { directory: agent_data_dir.as_ref().join(MEMORY_DIR), write_lock: Arc::new(tokio::sync::Mutex::new(())) }
    }

    /// The directory holding the memory files.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The file of `user_id`.
    pub fn path_for(&self, user_id: &str) -> Result<PathBuf, MemoryError> {
        let sanitized = sanitize_user_id(user_id);
        if sanitized.is_empty() {
            return Err(MemoryError::InvalidUserId { user_id: user_id.to_owned() });
        }
        Ok(self.directory.join(format!("{sanitized}.json")))
    }

    /// Every entry of `user_id`, oldest first; none when the user has no file yet.
    pub async fn entries(&self, user_id: &str) -> Result<Vec<MemoryEntry>, MemoryError> {
        let path = self.path_for(user_id)?;
        let user_id = user_id.to_owned();
        blocking(move || Ok(load(&path, &user_id)?.map(|file| file.entries).unwrap_or_default())).await
    }

    /// Appends `content` saved at `now` (the facility's local time) and returns the new entry.
    pub async fn append(&self, user_id: &str, content: &str, now: NaiveDateTime) -> Result<MemoryEntry, MemoryError> {
        self.append_inner(user_id, content, now, false).await.map(|(entry, _)| entry)
    }

    /// Like [`MemoryStore::append`], unless the last entry already holds exactly `content`: then
    /// nothing is written and that entry is returned with `false`. For redelivered approvals,
    /// whose save may already have happened before a crash.
    pub async fn append_unless_last(&self, user_id: &str, content: &str, now: NaiveDateTime) -> Result<(MemoryEntry, bool), MemoryError> {
        self.append_inner(user_id, content, now, true).await
    }

    async fn append_inner(
        &self,
        user_id: &str,
        content: &str,
        now: NaiveDateTime,
        skip_if_last: bool,
    ) -> Result<(MemoryEntry, bool), MemoryError> {
        if content.trim().is_empty() {
            return Err(MemoryError::EmptyContent);
        }
        let path = self.path_for(user_id)?;
        let directory = self.directory.clone();
        let user_id = user_id.to_owned();
        let entry = MemoryEntry::new(content, now);
        // Held across the blocking task: appends in this process never interleave their
        // read-modify-write cycles, and only one of them at a time waits for the file lock.
        let _guard = self.write_lock.lock().await;
        blocking(move || {
            // Other stores and other processes on this directory take the same OS lock.
            let _file_lock = FileLock::acquire(&directory, &path)?;
            let mut file = load(&path, &user_id)?.unwrap_or_else(|| MemoryFile {
                user_id: user_id.clone(),
                last_updated: String::new(),
                entries: Vec::new(),
                extra: Map::new(),
            });
            if skip_if_last && let Some(last) = file.entries.last().filter(|last| last.content == entry.content) {
                return Ok((last.clone(), false));
            }
            if file.user_id.is_empty() {
                file.user_id = user_id;
            }
            file.last_updated = entry.timestamp.clone();
            file.entries.push(entry.clone());
            write_atomically(&directory, &path, &file)?;
            Ok((entry, true))
        })
        .await
    }
}

/// An exclusive OS lock on `<user>.json.lock` beside a memory file, held for one
/// read-modify-write and released when dropped. The sidecar is never deleted: removing it while
/// another process waits on it would let two writers hold "the" lock at once.
struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Blocks until this process holds the lock of the memory file `path`.
    fn acquire(directory: &Path, path: &Path) -> Result<Self, MemoryError> {
        fs::create_dir_all(directory).map_err(io_error("create directory", directory))?;
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or("memory.json");
        let lock_path = directory.join(format!("{name}.lock"));
        let file = open_lock_file(&lock_path).map_err(io_error("open lock file", &lock_path))?;
        file.lock().map_err(io_error("lock", &lock_path))?;
        Ok(Self { file, path: lock_path })
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the file releases the lock as well; unlocking first releases it even if the
        // descriptor were shared.
        if let Err(error) = self.file.unlock() {
            tracing::warn!(path = %self.path.display(), %error, "cannot unlock the memory lock file; closing it releases the lock");
        }
    }
}

/// The lock file, created empty if missing (owner-only, like the memories) and never truncated.
fn open_lock_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T, MemoryError> + Send + 'static) -> Result<T, MemoryError> {
    tokio::task::spawn_blocking(work).await.map_err(|error| MemoryError::Task(error.to_string()))?
}

/// Reads the file of `user_id`; `None` when it does not exist.
fn load(path: &Path, user_id: &str) -> Result<Option<MemoryFile>, MemoryError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(MemoryError::Io { action: "read", path: path.to_owned(), source }),
    };
    let file: MemoryFile =
        serde_json::from_str(&text).map_err(|error| MemoryError::Corrupt { path: path.to_owned(), reason: error.to_string() })?;
    if !file.user_id.is_empty() && file.user_id != user_id {
        return Err(MemoryError::UserMismatch { path: path.to_owned(), stored: file.user_id, requested: user_id.to_owned() });
    }
    Ok(Some(file))
}

/// Writes `file` to a new temp file beside `path`, syncs it, renames it over `path` and syncs
/// the directory, so the rename itself survives a power loss.
fn write_atomically(directory: &Path, path: &Path, file: &MemoryFile) -> Result<(), MemoryError> {
    fs::create_dir_all(directory).map_err(io_error("create directory", directory))?;
    let mut json = serde_json::to_vec_pretty(file).map_err(|error| MemoryError::Task(format!("cannot encode the memory file: {error}")))?;
    json.push(b'\n');
    let name = path.file_name().and_then(|name| name.to_str()).unwrap_or("memory.json");
    let temp = directory.join(format!(".{name}.{}.{}.tmp", std::process::id(), TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut out = private_file(&temp).map_err(io_error("create", &temp))?;
        out.write_all(&json).map_err(io_error("write", &temp))?;
        out.sync_all().map_err(io_error("sync", &temp))?;
        fs::rename(&temp, path).map_err(io_error("replace", path))
    })();
    if written.is_err() {
        // Best effort: the original file is intact either way.
        let _ = fs::remove_file(&temp);
    }
    written?;
    sync_directory(directory).map_err(io_error("sync directory", directory))
}

/// Wraps an OS error with what was being done where.
fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MemoryError + use<> {
    let path = path.to_owned();
    move |source| MemoryError::Io { action, path, source }
}

/// A new file readable only by its owner: memories are personal.
fn private_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

#[cfg(unix)]
fn sync_directory(directory: &Path) -> io::Result<()> {
    File::open(directory)?.sync_all()
}

#[cfg(not(unix))]
fn sync_directory(_directory: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn at(hour: u32, minute: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(2025, 3, 10).and_then(|day| day.and_hms_opt(hour, minute, 0)).expect("valid time")
    }

    #[test]
    fn user_ids_are_filtered_to_file_name_characters() {
        assert_eq!(sanitize_user_id("jane.doe@lab-1_x"), "janedoelab-1_x");
        assert_eq!(sanitize_user_id("../../etc/passwd"), "etcpasswd");
        let store = MemoryStore::new("/data");
        assert_eq!(store.path_for("jane.doe").expect("valid"), PathBuf::from("/data/user_memory/janedoe.json"));
        assert!(matches!(store.path_for("@@/.."), Err(MemoryError::InvalidUserId { .. })));
    }

    #[tokio::test]
    async fn appends_keep_old_entries_in_upstreams_format() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        assert!(store.entries("alice").await.expect("no file yet").is_empty());
        store.append("alice", "beam tuning works best at 6 PM", at(9, 5)).await.expect("saved");
        store.append("alice", "use BPM 3 for orbit checks", at(10, 30)).await.expect("saved");
        let entries = store.entries("alice").await.expect("read");
        let contents: Vec<&str> = entries.iter().map(|entry| entry.content.as_str()).collect();
        assert_eq!(contents, ["beam tuning works best at 6 PM", "use BPM 3 for orbit checks"]);
        let raw: Value = serde_json::from_str(&fs::read_to_string(dir.path().join("user_memory/alice.json")).expect("file")).expect("json");
        assert_eq!(raw["user_id"], "alice");
        assert_eq!(raw["last_updated"], "2025-03-10 10:30");
        assert_eq!(raw["entries"][0], serde_json::json!({"timestamp": "2025-03-10 09:05", "content": "beam tuning works best at 6 PM"}));
        let mut leftovers: Vec<String> = fs::read_dir(dir.path().join("user_memory"))
            .expect("dir")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        leftovers.sort();
        assert_eq!(leftovers, ["alice.json", "alice.json.lock"], "no temp files are left behind; the lock file stays");
    }

    #[tokio::test]
    async fn fields_added_by_other_tools_survive_a_rewrite() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        fs::create_dir_all(store.directory()).expect("dir");
        let existing = serde_json::json!({
            "user_id": "bob", "last_updated": "2025-01-01 08:00", "ui_version": 2,
            "entries": [{"timestamp": "2025-01-01 08:00", "content": "old note", "tags": ["ops"]}]
        });
        fs::write(store.path_for("bob").expect("path"), existing.to_string()).expect("write");
        store.append("bob", "new note", at(11, 0)).await.expect("saved");
        let raw: Value = serde_json::from_str(&fs::read_to_string(store.path_for("bob").expect("path")).expect("file")).expect("json");
        assert_eq!(raw["ui_version"], 2);
        assert_eq!(raw["entries"][0]["tags"], serde_json::json!(["ops"]));
        assert_eq!(raw["entries"][1]["content"], "new note");
    }

    #[tokio::test]
    async fn a_corrupt_file_is_named_and_never_overwritten() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        fs::create_dir_all(store.directory()).expect("dir");
        let path = store.path_for("carol").expect("path");
        fs::write(&path, "{\"entries\": [ truncated").expect("write");
        let read = store.entries("carol").await.expect_err("corrupt");
        assert!(matches!(read, MemoryError::Corrupt { .. }));
        assert!(read.to_string().contains(&path.display().to_string()), "{read}");
        let append = store.append("carol", "x", at(12, 0)).await.expect_err("corrupt");
        assert!(matches!(append, MemoryError::Corrupt { .. }));
        assert_eq!(fs::read_to_string(&path).expect("file"), "{\"entries\": [ truncated");
    }

    #[tokio::test]
    async fn ids_sharing_a_file_name_do_not_share_memories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        store.append("a.b", "private", at(8, 0)).await.expect("saved");
        assert!(matches!(store.entries("ab").await, Err(MemoryError::UserMismatch { .. })));
        assert!(matches!(store.append("ab", "other", at(8, 1)).await, Err(MemoryError::UserMismatch { .. })));
        assert_eq!(store.entries("a.b").await.expect("own file").len(), 1);
    }

    #[tokio::test]
    async fn empty_content_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        assert!(matches!(store.append("dave", "  \n", at(8, 0)).await, Err(MemoryError::EmptyContent)));
        assert!(!store.path_for("dave").expect("path").exists());
    }

    #[tokio::test]
    async fn append_unless_last_skips_exact_repeats_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        let (_, written) = store.append_unless_last("erin", "note A", at(8, 0)).await.expect("saved");
        assert!(written);
        let (entry, written) = store.append_unless_last("erin", "note A", at(8, 5)).await.expect("checked");
        assert!(!written);
        assert_eq!(entry.timestamp, "2025-03-10 08:00");
        let (_, written) = store.append_unless_last("erin", "note B", at(8, 6)).await.expect("saved");
        assert!(written);
        assert_eq!(store.entries("erin").await.expect("read").len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_appends_lose_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        let tasks: Vec<_> = (0..16)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move { store.append("frank", &format!("note {n}"), at(9, 0)).await })
            })
            .collect();
        for task in tasks {
            task.await.expect("joined").expect("saved");
        }
        let mut contents: Vec<String> = store.entries("frank").await.expect("read").into_iter().map(|entry| entry.content).collect();
        contents.sort();
        let mut expected: Vec<String> = (0..16).map(|n| format!("note {n}")).collect();
        expected.sort();
        assert_eq!(contents, expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_stores_on_one_directory_lose_nothing() {
        // Two stores do not share the in-process mutex: like two processes, only the OS file
        // lock keeps their read-modify-write cycles apart.
        let dir = tempfile::tempdir().expect("temp dir");
        let stores = [MemoryStore::new(dir.path()), MemoryStore::new(dir.path())];
        let tasks: Vec<_> = (0..40)
            .map(|n| {
                let store = stores[n % 2].clone();
                tokio::spawn(async move { store.append("gina", &format!("note {n}"), at(9, 0)).await })
            })
            .collect();
        for task in tasks {
            task.await.expect("joined").expect("saved");
        }
        let mut contents: Vec<String> = stores[0].entries("gina").await.expect("read").into_iter().map(|entry| entry.content).collect();
        contents.sort();
        let mut expected: Vec<String> = (0..40).map(|n| format!("note {n}")).collect();
        expected.sort();
        assert_eq!(contents, expected);
        assert!(dir.path().join("user_memory/gina.json.lock").exists());
    }
}

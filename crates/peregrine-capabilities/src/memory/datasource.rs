//! `core_user_memory`: the user's saved memories offered to task extraction as a data source,
//! so a task like "use my usual BPM" can be resolved from what the user saved before.

use peregrine_agent::{DataSource, DataSourceRequest, RetrievedData};
use peregrine_core::capability::BoxFuture;

use super::store::{MemoryEntry, MemoryStore};

/// The data source's name (upstream's).
pub const USER_MEMORY_SOURCE: &str = "core_user_memory";

/// The heading task-extraction prompts show above the memories.
pub const USER_MEMORY_TITLE: &str = "🧠 User Memory";

/// User memory as a task-extraction data source; responds whenever the session has a user id.
#[derive(Debug, Clone)]
pub struct UserMemoryDataSource {
    store: MemoryStore,
}

impl UserMemoryDataSource {
    /// A data source reading `store`.
    pub fn new(store: MemoryStore) -> Self {
        Self { store }
    }
}

/// `(N saved entries):` then one `• [timestamp] content` line per entry, oldest first.
pub fn format_memories(entries: &[MemoryEntry]) -> String {
    let mut text = format!("({} saved entries):", entries.len());
    for entry in entries {
        text.push_str(&format!("\n• [{}] {}", entry.timestamp, entry.content));
    }
    text
}

impl DataSource for UserMemoryDataSource {
    fn name(&self) -> &str {
        USER_MEMORY_SOURCE
    }

    fn should_respond(&self, request: &DataSourceRequest<'_>) -> bool {
        request.user_id.is_some_and(|id| !id.is_empty())
    }

    fn retrieve<'a>(&'a self, request: &'a DataSourceRequest<'a>) -> BoxFuture<'a, Result<Option<RetrievedData>, String>> {
        Box::pin(async move {
            let Some(user_id) = request.user_id.filter(|id| !id.is_empty()) else { return Ok(None) };
            let entries = self.store.entries(user_id).await.map_err(|error| error.to_string())?;
            if entries.is_empty() {
                return Ok(None);
            }
            Ok(Some(RetrievedData {
                source: USER_MEMORY_SOURCE.into(),
                title: USER_MEMORY_TITLE.into(),
                content: format_memories(&entries),
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn request(user_id: Option<&str>) -> DataSourceRequest<'_> {
        DataSourceRequest { user_id, requester: "task_extraction", query: Some("what did I save?") }
    }

    #[tokio::test]
    async fn formats_saved_entries_for_task_extraction() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        let now = NaiveDate::from_ymd_opt(2025, 3, 10).and_then(|day| day.and_hms_opt(9, 5, 0)).expect("valid");
        store.append("alice", "my usual BPM is SR01C:BPM3", now).await.expect("saved");
        store.append("alice", "shift B starts at 16:00", now).await.expect("saved");
        let source = UserMemoryDataSource::new(store);
        assert_eq!(source.name(), "core_user_memory");
        let data = source.retrieve(&request(Some("alice"))).await.expect("read").expect("has entries");
        assert_eq!(data.title, "🧠 User Memory");
        assert_eq!(data.source, "core_user_memory");
        assert_eq!(
            data.content,
            "(2 saved entries):\n• [2025-03-10 09:05] my usual BPM is SR01C:BPM3\n• [2025-03-10 09:05] shift B starts at 16:00"
        );
    }

    #[tokio::test]
    async fn responds_only_with_a_user_and_only_when_there_is_something() {
        let dir = tempfile::tempdir().expect("temp dir");
        let source = UserMemoryDataSource::new(MemoryStore::new(dir.path()));
        assert!(!source.should_respond(&request(None)));
        assert!(!source.should_respond(&request(Some(""))));
        assert!(source.should_respond(&request(Some("bob"))));
        assert_eq!(source.retrieve(&request(Some("bob"))).await, Ok(None));
    }

    #[tokio::test]
    async fn a_corrupt_file_is_reported_not_hidden() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        std::fs::create_dir_all(store.directory()).expect("dir");
        std::fs::write(store.path_for("carol").expect("path"), "not json").expect("write");
        let error = UserMemoryDataSource::new(store).retrieve(&request(Some("carol"))).await.expect_err("corrupt");
        assert!(error.contains("carol.json") && error.contains("corrupt"), "{error}");
    }
}

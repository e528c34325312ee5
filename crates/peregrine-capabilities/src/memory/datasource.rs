//! `core_user_memory`: the user's saved memories offered to task extraction as a data source,
//! so a task like "use my usual BPM" can be resolved from what the user saved before. Only the
//! most recent [`MAX_RETRIEVED_MEMORIES`] are offered, so a long memory file cannot crowd the
//! task-extraction prompt out of the model's context window.

use peregrine_agent::{DataSource, DataSourceRequest, RetrievedData};
use peregrine_core::capability::BoxFuture;

use super::store::{MemoryEntry, MemoryStore};

/// The data source's name (upstream's).
pub const USER_MEMORY_SOURCE: &str = "core_user_memory";

/// The heading task-extraction prompts show above the memories.
pub const USER_MEMORY_TITLE: &str = "🧠 User Memory";

/// At most this many saved memories, the most recent, are offered to task extraction.
pub const MAX_RETRIEVED_MEMORIES: usize = 50;

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

/// `(N saved entries):` then one `• [timestamp] content` line per entry, oldest first. With
/// more than [`MAX_RETRIEVED_MEMORIES`] entries only the most recent ones are listed, and the
/// heading says how many older entries exist.
pub fn format_memories(entries: &[MemoryEntry]) -> String {
    let older = entries.len().saturating_sub(MAX_RETRIEVED_MEMORIES);
    let mut text = if older == 0 {
        format!("({} saved entries):", entries.len())
    } else {
        let older_entries = if older == 1 { "1 older entry is".to_owned() } else { format!("{older} older entries are") };
        format!("({} saved entries; the {MAX_RETRIEVED_MEMORIES} most recent are listed, {older_entries} not shown):", entries.len())
    };
    for entry in &entries[older..] {
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
    async fn only_the_fifty_most_recent_entries_are_offered() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = MemoryStore::new(dir.path());
        let day = NaiveDate::from_ymd_opt(2025, 3, 10).expect("valid day");
        for index in 0..53u32 {
            let at = day.and_hms_opt(8 + index / 60, index % 60, 0).expect("valid time");
            store.append("alice", &format!("note {index:02}"), at).await.expect("saved");
        }
        let data = UserMemoryDataSource::new(store).retrieve(&request(Some("alice"))).await.expect("read").expect("has entries");
        let lines: Vec<&str> = data.content.lines().collect();
        assert_eq!(lines[0], "(53 saved entries; the 50 most recent are listed, 3 older entries are not shown):");
        assert_eq!(lines.len(), 51);
        assert_eq!(lines[1], "• [2025-03-10 08:03] note 03");
        assert_eq!(lines[50], "• [2025-03-10 08:52] note 52");
        assert!(!data.content.contains("note 02"));

        let one_more: Vec<MemoryEntry> =
            (0..51).map(|index| MemoryEntry::new(format!("n{index}"), day.and_hms_opt(9, 0, 0).expect("valid"))).collect();
        assert!(
            format_memories(&one_more)
                .starts_with("(51 saved entries; the 50 most recent are listed, 1 older entry is not shown):\n• [2025-03-10 09:00] n1\n")
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

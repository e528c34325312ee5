//! Data sources: external context task extraction retrieves before it writes the task (upstream's
//! `DataSourceManager`). The framework's own is user memory (in `peregrine-capabilities`);
//! applications add theirs. A failing or slow source only means less context, never a failed turn.

use peregrine_core::capability::BoxFuture;

/// What a data source is asked.
#[derive(Debug, Clone, Copy)]
pub struct DataSourceRequest<'a> {
    /// The conversation's user, when known.
    pub user_id: Option<&'a str>,
    /// The component asking (`task_extraction`).
    pub requester: &'a str,
    /// The latest user message.
    pub query: Option<&'a str>,
}

/// Context a data source returned.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrievedData {
    /// The source's name.
    pub source: String,
    /// Heading in prompts, e.g. `🧠 User Memory`.
    pub title: String,
    /// The context, formatted for a prompt.
    pub content: String,
}

/// A provider of external context.
pub trait DataSource: Send + Sync + 'static {
    /// Unique name.
    fn name(&self) -> &str;

    /// Whether it has anything for this request (e.g. user memory needs a user id).
    fn should_respond(&self, request: &DataSourceRequest<'_>) -> bool;

    /// Retrieves its context; `Ok(None)` when it has nothing. Errors are logged and skipped.
    fn retrieve<'a>(&'a self, request: &'a DataSourceRequest<'a>) -> BoxFuture<'a, Result<Option<RetrievedData>, String>>;
}

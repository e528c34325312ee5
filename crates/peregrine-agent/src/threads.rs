//! The thread API every interface stands on: where a thread stands ([`ThreadStatus`], one
//! definition for the terminal, the native API and the OpenAI API), its state and checkpoint
//! history, creating and deleting it. Turns and approval answers are [`Agent`]'s other methods.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use peregrine_core::{AgentState, AgentStateUpdate, Role};
use peregrine_graph::{
    CheckpointError, CheckpointMeta, CheckpointSource, ListQuery, PendingInterrupt, RunError, StateSnapshot, ThreadSummary,
};

use crate::agent::Agent;
use crate::infra::orchestrator::pending::PendingPlans;
use crate::router::ERROR;

/// Where a thread stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatus {
    /// Its last turn finished with an answer (or nothing ran yet): a message starts a turn.
    Idle,
    /// Its last turn ended with the error node's report: a message starts a turn.
    Failed,
    /// It waits for an approval: answer it (approve, reject, withdraw).
    Interrupted,
    /// A run was cut off (crash, kill, cancel), or an answered approval waits for its node:
    /// [`Agent::continue_turn`] finishes it.
    Unfinished,
    /// A run of another process holds it (or the store cannot tell whether one does).
    Busy,
}

impl ThreadStatus {
    /// `idle`, `failed`, `interrupted`, `unfinished` or `busy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::Unfinished => "unfinished",
            Self::Busy => "busy",
        }
    }
}

/// A thread's newest state and where it stands, read once.
#[derive(Debug, Clone)]
pub struct Thread {
    /// The newest checkpoint's state and metadata.
    pub snapshot: StateSnapshot<AgentState>,
    /// Where it stands.
    pub status: ThreadStatus,
}

impl Thread {
    /// The thread's id.
    pub fn id(&self) -> &str {
        &self.snapshot.meta.thread_id
    }

    /// Its state.
    pub fn state(&self) -> &Arc<AgentState> {
        &self.snapshot.state
    }

    /// The approval it waits for.
    pub fn interrupt(&self) -> Option<&PendingInterrupt> {
        self.snapshot.meta.interrupt.as_ref()
    }

    /// Whether an approval was answered and its node has not taken the answer yet (a new
    /// message is refused until the turn is continued).
    pub fn answer_pending(&self) -> bool {
        self.snapshot.meta.resume.is_some()
    }

    /// The number of messages the person sent.
    pub fn turns(&self) -> usize {
        self.snapshot.state.messages.iter().filter(|message| message.role == Role::User).count()
    }

    /// The first message of the person, cut to 80 characters.
    pub fn title(&self) -> Option<String> {
        let first = self.snapshot.state.messages.iter().find(|message| message.role == Role::User)?;
        let text = first.content.trim();
        let mut title: String = text.chars().take(80).collect();
        if title.len() < text.len() {
            title.push('…');
        }
        Some(title)
    }

    /// When the newest checkpoint was written.
    pub fn updated_at(&self) -> DateTime<Utc> {
        self.snapshot.meta.created_at
    }
}

/// Whether a snapshot stands in the middle of a run: an answer waits for its node, or a node
/// would run next after a checkpoint a run wrote (a thread created empty, or changed by a state
/// update between turns, is not in a run).
pub(crate) fn mid_run(snapshot: &StateSnapshot<AgentState>) -> bool {
    snapshot.meta.resume.is_some()
        || (snapshot.next.is_some() && snapshot.meta.source != CheckpointSource::Update && !snapshot.state.messages.is_empty())
}

impl Agent {
    /// The thread's newest state and status, or `None` for an unknown thread. A thread in the
    /// middle of a run is `Busy` while another process holds its lock (probed, never taken)
    /// and `Unfinished` when none does.
    pub async fn thread(&self, thread_id: &str) -> Result<Option<Thread>, RunError> {
        let Some(snapshot) = self.graph().get_state(thread_id).await? else { return Ok(None) };
        let status = self.status_of(&snapshot).await;
        Ok(Some(Thread { snapshot, status }))
    }

    async fn status_of(&self, snapshot: &StateSnapshot<AgentState>) -> ThreadStatus {
        if snapshot.meta.interrupt.is_some() {
            return ThreadStatus::Interrupted;
        }
        if mid_run(snapshot) {
            // Running in another process, or cut off: only the lock tells which. When the
            // probe cannot answer, the thread is not offered for continuing.
            let held = match self.graph().checkpointer() {
                Some(store) => store.is_thread_locked_boxed(&snapshot.meta.thread_id).await,
                None => Ok(false),
            };
            return if matches!(held, Ok(false)) { ThreadStatus::Unfinished } else { ThreadStatus::Busy };
        }
        let failed = snapshot.state.execution.last_result.as_ref().is_some_and(|last| last.capability == ERROR);
        if failed { ThreadStatus::Failed } else { ThreadStatus::Idle }
    }

    /// Every thread, most recently updated first.
    pub async fn threads(&self) -> Result<Vec<ThreadSummary>, RunError> {
        let mut threads = self.graph().threads().await?;
        threads.sort_by(|a, b| b.latest.created_at.cmp(&a.latest.created_at).then_with(|| a.thread_id.cmp(&b.thread_id)));
        Ok(threads)
    }

    /// The thread's checkpoints, newest first (metadata only).
    pub async fn history(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, RunError> {
        self.graph().history(thread_id, query).await
    }

    /// When the thread's first checkpoint was written.
    pub async fn created_at(&self, thread_id: &str) -> Result<Option<DateTime<Utc>>, RunError> {
        let first = self.graph().history(thread_id, ListQuery { before: Some(2), limit: Some(1) }).await?;
        Ok(first.first().map(|meta| meta.created_at))
    }

    /// Creates an empty thread, or returns `None` when `thread_id` exists already (also when
    /// another request creates it at the same moment).
    pub async fn create_thread(&self, thread_id: &str) -> Result<Option<Thread>, RunError> {
        if self.graph().get_state(thread_id).await?.is_some() {
            return Ok(None);
        }
        match self.graph().update_state(thread_id, AgentStateUpdate::default(), None).await {
            Ok(snapshot) => Ok(Some(Thread { snapshot, status: ThreadStatus::Idle })),
            Err(RunError::Checkpoint(CheckpointError::ThreadBusy { .. } | CheckpointError::Conflict { .. })) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Deletes the thread, its checkpoints and the plan that waited for its approval (a later
    /// thread of the same id must not find it). Returns `false` for an unknown thread; refused
    /// with [`CheckpointError::ThreadBusy`] while a run (of any process) holds it.
    pub async fn delete_thread(&self, thread_id: &str) -> Result<bool, RunError> {
        let Some(store) = self.graph().checkpointer() else { return Ok(false) };
        let _lock = store.lock_thread_boxed(thread_id).await?;
        if store.list_boxed(thread_id, ListQuery { before: None, limit: Some(1) }).await?.is_empty() {
            return Ok(false);
        }
        store.delete_thread_boxed(thread_id).await?;
        let plans = PendingPlans::for_thread(&self.services().settings.agent_data_dir, thread_id);
        match std::fs::remove_dir_all(plans.dir()) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(thread = %thread_id, %error, dir = %plans.dir().display(), "the thread is deleted, but not its pending plan files");
            }
        }
        tracing::info!(thread = %thread_id, "thread deleted");
        Ok(true)
    }
}

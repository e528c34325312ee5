//! The engine: `Graph<S>` runs nodes chosen by one router, applies each node's update,
//! checkpoints it *before* routing again, and pauses, resumes, continues or forks threads.
//!
//! The loop of one run:
//! ```text
//! next = resume pending? → that node | last node terminal? → END | router(state)
//! wait (retry backoff, cancellable) → run node → apply update → checkpoint → events → repeat
//! ```

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use peregrine_core::GraphState;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{
    CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, DynCheckpointer, ListQuery, NewCheckpoint, PendingInterrupt,
    ResumeRecord, ThreadLock, ThreadSummary,
};
use crate::error::{CheckpointLabel, RunError};
use crate::events::RunEvent;
use crate::node::{DynNode, Node, NodeContext, NodeOutput};

/// The router's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Run this node next.
    Node(String),
    /// Run this node after waiting (retry backoff, scheduled by the engine and cancellable).
    After {
        /// The node.
        node: String,
        /// The wait.
        delay: Duration,
    },
    /// The run is finished.
    End,
    /// Stop the run with this explanation (a FATAL error).
    Abort(String),
}

impl Route {
    /// Run `node` next.
    pub fn to(node: impl Into<String>) -> Self {
        Self::Node(node.into())
    }
}

/// The router: a pure function of the state.
pub type Router<S> = Arc<dyn Fn(&S) -> Route + Send + Sync>;

/// Limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Node executions allowed per run.
    pub recursion_limit: u32,
    /// Wall-clock budget of a run (each continuation of a paused run gets a fresh budget).
    pub max_run_time: Option<Duration>,
}

impl Default for GraphLimits {
    fn default() -> Self {
        Self { recursion_limit: 100, max_run_time: Some(Duration::from_secs(300)) }
    }
}

/// Per-run options.
pub struct RunOptions<E> {
    /// Where to send the run's events.
    pub events: Option<UnboundedSender<RunEvent<E>>>,
    /// Cancels the run; the last checkpoint stays intact.
    pub cancel: CancellationToken,
    /// Overrides the graph's limits for this run.
    pub limits: Option<GraphLimits>,
}

impl<E> Default for RunOptions<E> {
    fn default() -> Self {
        Self { events: None, cancel: CancellationToken::new(), limits: None }
    }
}

impl<E> RunOptions<E> {
    /// Options sending events to `events`.
    pub fn with_events(events: UnboundedSender<RunEvent<E>>) -> Self {
        Self { events: Some(events), ..Self::default() }
    }
}

/// How a run ended.
#[derive(Debug, Clone)]
pub enum RunOutcome<S> {
    /// The router said END or a terminal node ran.
    Completed {
        /// The final state.
        state: Arc<S>,
        /// The last checkpoint.
        checkpoint_id: Option<CheckpointId>,
        /// The last node that ran.
        last_node: Option<String>,
    },
    /// A node asked a question; answer it with [`Graph::resume`].
    Interrupted {
        /// The state while paused.
        state: Arc<S>,
        /// The question.
        interrupt: PendingInterrupt,
        /// The checkpoint holding it.
        checkpoint_id: CheckpointId,
    },
    /// The run was cancelled; continue it with [`Graph::continue_run`].
    Cancelled {
        /// The state at the last checkpoint.
        state: Arc<S>,
        /// The last checkpoint.
        checkpoint_id: Option<CheckpointId>,
    },
}

impl<S> RunOutcome<S> {
    /// The state the run ended with.
    pub fn state(&self) -> &Arc<S> {
        match self {
            Self::Completed { state, .. } | Self::Interrupted { state, .. } | Self::Cancelled { state, .. } => state,
        }
    }

    /// The pending interrupt, if the run paused.
    pub fn interrupt(&self) -> Option<&PendingInterrupt> {
        match self {
            Self::Interrupted { interrupt, .. } => Some(interrupt),
            _ => None,
        }
    }
}

/// An answer to a pending interrupt. It must quote the interrupt's id and the digest of the
/// payload it answers; anything else is refused as stale or forged.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume<U> {
    /// The interrupt answered.
    pub interrupt_id: String,
    /// The digest of the payload the person saw.
    pub payload_digest: String,
    /// The answer handed to the node.
    pub answer: Value,
    /// A state update applied before the node runs again.
    pub update: Option<U>,
}

impl<U> Resume<U> {
    /// An answer to `interrupt`, quoting its id and digest.
    pub fn to(interrupt: &PendingInterrupt, answer: Value) -> Self {
        Self { interrupt_id: interrupt.id.clone(), payload_digest: interrupt.digest.clone(), answer, update: None }
    }

    /// Adds a state update applied before the node runs again.
    pub fn with_update(mut self, update: U) -> Self {
        self.update = Some(update);
        self
    }
}

/// A thread's state at a checkpoint.
#[derive(Debug, Clone)]
pub struct StateSnapshot<S> {
    /// The state.
    pub state: Arc<S>,
    /// The checkpoint.
    pub meta: CheckpointMeta,
    /// The node that would run next; `None` when the run is finished.
    pub next: Option<String>,
}

/// SHA-256 (hex) of the canonical JSON of an interrupt payload (object keys sorted). The keys
/// are sorted here, not by `serde_json::Map`: a dependency that turns on serde_json's
/// `preserve_order` (Cargo unifies features across a build) must not change a digest.
pub fn payload_digest(payload: &Value) -> String {
    let bytes = serde_json::to_vec(&sorted_keys(payload)).unwrap_or_default();
    Sha256::digest(&bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `value` with every object's keys in sorted order.
fn sorted_keys(value: &Value) -> Value {
    match value {
        Value::Object(fields) => {
            let mut entries: Vec<(&String, &Value)> = fields.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(entries.into_iter().map(|(key, value)| (key.clone(), sorted_keys(value))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// A graph that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No router was set.
    #[error("the graph has no router; call GraphBuilder::router")]
    NoRouter,
    /// No nodes were added.
    #[error("the graph has no nodes")]
    NoNodes,
    /// A node name was used twice.
    #[error("node '{0}' is added twice")]
    DuplicateNode(String),
    /// A terminal node that is not a node.
    #[error("terminal node '{0}' is not a node of the graph")]
    UnknownTerminal(String),
}

/// Builds a [`Graph`].
pub struct GraphBuilder<S: GraphState> {
    nodes: HashMap<Arc<str>, Arc<dyn DynNode<S>>>,
    duplicate: Option<String>,
    router: Option<Router<S>>,
    terminal: HashSet<String>,
    checkpointer: Option<Arc<dyn DynCheckpointer>>,
    limits: GraphLimits,
}

impl<S: GraphState> Default for GraphBuilder<S> {
    fn default() -> Self {
        Self {
            nodes: HashMap::new(),
            duplicate: None,
            router: None,
            terminal: HashSet::new(),
            checkpointer: None,
            limits: GraphLimits::default(),
        }
    }
}

impl<S: GraphState> GraphBuilder<S> {
    /// Adds a node.
    pub fn node(mut self, name: impl Into<String>, node: impl Node<S>) -> Self {
        self.add_dyn(name.into(), Arc::new(node));
        self
    }

    /// Adds a type-erased node.
    pub fn dyn_node(mut self, name: impl Into<String>, node: Arc<dyn DynNode<S>>) -> Self {
        self.add_dyn(name.into(), node);
        self
    }

    fn add_dyn(&mut self, name: String, node: Arc<dyn DynNode<S>>) {
        if self.nodes.insert(Arc::from(name.as_str()), node).is_some() {
            self.duplicate.get_or_insert(name);
        }
    }

    /// Sets the router.
    pub fn router(mut self, router: impl Fn(&S) -> Route + Send + Sync + 'static) -> Self {
        self.router = Some(Arc::new(router));
        self
    }

    /// Marks a node after which the run ends (respond, clarify, error).
    pub fn terminal(mut self, name: impl Into<String>) -> Self {
        self.terminal.insert(name.into());
        self
    }

    /// Persists every step with `checkpointer`.
    pub fn checkpointer(mut self, checkpointer: impl Checkpointer) -> Self {
        self.checkpointer = Some(Arc::new(checkpointer));
        self
    }

    /// Persists every step with a shared checkpointer.
    pub fn shared_checkpointer(mut self, checkpointer: Arc<dyn DynCheckpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Sets the default limits.
    pub fn limits(mut self, limits: GraphLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Checks and builds the graph.
    pub fn build(self) -> Result<Graph<S>, BuildError> {
        if let Some(name) = self.duplicate {
            return Err(BuildError::DuplicateNode(name));
        }
        let router = self.router.ok_or(BuildError::NoRouter)?;
        if self.nodes.is_empty() {
            return Err(BuildError::NoNodes);
        }
        if let Some(unknown) = self.terminal.iter().find(|name| !self.nodes.contains_key(name.as_str())) {
            return Err(BuildError::UnknownTerminal(unknown.clone()));
        }
        Ok(Graph {
            inner: Arc::new(Inner {
                nodes: self.nodes,
                router,
                terminal: self.terminal,
                checkpointer: self.checkpointer,
                limits: self.limits,
            }),
        })
    }
}

struct Inner<S: GraphState> {
    nodes: HashMap<Arc<str>, Arc<dyn DynNode<S>>>,
    router: Router<S>,
    terminal: HashSet<String>,
    checkpointer: Option<Arc<dyn DynCheckpointer>>,
    limits: GraphLimits,
}

/// A durable, router-controlled state machine over `S`. Cheap to clone.
pub struct Graph<S: GraphState> {
    inner: Arc<Inner<S>>,
}

impl<S: GraphState> Clone for Graph<S> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

/// Where the thread stands: the newest checkpoint and how far its state is from a snapshot.
/// Without a checkpointer `meta` describes the last step in memory and `stored` is false.
#[derive(Debug, Clone, Default)]
struct Tip {
    meta: Option<CheckpointMeta>,
    stored: bool,
    snapshot_bytes: usize,
    delta_bytes: usize,
    deltas: usize,
}

impl Tip {
    fn id(&self) -> Option<CheckpointId> {
        self.meta.as_ref().filter(|_| self.stored).map(|meta| meta.checkpoint_id)
    }

    fn label(&self) -> CheckpointLabel {
        CheckpointLabel(self.id())
    }
}

/// A state snapshot is written when the deltas since the last one outweigh it (so rebuilding
/// costs at most about twice the state) or when this many deltas have piled up.
const MAX_DELTAS_BETWEEN_SNAPSHOTS: usize = 256;
/// States smaller than this are not snapshotted more often than this many delta bytes.
const MIN_SNAPSHOT_INTERVAL_BYTES: usize = 4096;

/// What runs next.
enum Next {
    Run { node: String, delay: Duration, resume: Option<ResumeRecord> },
    Finished,
    Paused(PendingInterrupt),
    Abort(String),
}

/// One checkpoint to write.
struct Write<U> {
    source: CheckpointSource,
    node: Option<String>,
    update: U,
    run_step: u32,
    interrupt: Option<PendingInterrupt>,
    resume: Option<ResumeRecord>,
}

struct RunCtx<'a, E> {
    thread_id: Arc<str>,
    run_id: Arc<str>,
    opts: &'a RunOptions<E>,
    limits: GraphLimits,
    deadline: Option<Instant>,
}

impl<E> RunCtx<'_, E> {
    fn send(&self, event: RunEvent<E>) {
        if let Some(events) = &self.opts.events {
            // A closed receiver means nobody listens any more; the run goes on.
            let _ = events.send(event);
        }
    }
}

enum Interruption {
    Cancelled,
    TimedOut,
}

async fn until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl<S: GraphState> Graph<S> {
    /// Starts building a graph.
    pub fn builder() -> GraphBuilder<S> {
        GraphBuilder::default()
    }

    /// The checkpointer, if any.
    pub fn checkpointer(&self) -> Option<&Arc<dyn DynCheckpointer>> {
        self.inner.checkpointer.as_ref()
    }

    /// Starts a new run on `thread_id` by applying `input` to its latest state (a new thread
    /// starts from `S::default()`), then runs until END, an interrupt, cancellation or an error.
    /// Refused while the thread waits for an answer, or holds one whose node has not finished.
    pub async fn run(&self, thread_id: &str, input: S::Update, opts: RunOptions<S::Event>) -> Result<RunOutcome<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load_or_default(thread_id).await?;
        if let Some(meta) = &tip.meta {
            if let Some(interrupt) = &meta.interrupt {
                let (interrupt_id, node) = (interrupt.id.clone(), interrupt.node.clone());
                return Err(RunError::PendingInterrupt { thread_id: thread_id.into(), interrupt_id, node });
            }
            if let Some(resume) = &meta.resume {
                return Err(RunError::PendingResume { thread_id: thread_id.into(), node: resume.node.clone() });
            }
        }
        let ctx = self.run_ctx(thread_id, Arc::from(uuid::Uuid::new_v4().to_string()), &opts);
        let write = Write { source: CheckpointSource::Input, node: None, update: input, run_step: 0, interrupt: None, resume: None };
        self.persist(&ctx, &mut state, &mut tip, write).await?;
        // Announced only once the input is durable: interfaces acknowledge a message on this event.
        ctx.send(RunEvent::RunStarted { thread_id: thread_id.into(), run_id: ctx.run_id.to_string() });
        self.drive(&ctx, state, tip).await
    }

    /// Answers the thread's pending interrupt and continues the run: the interrupted node runs
    /// again with [`NodeContext::resume`] set. Stale or forged answers are refused.
    pub async fn resume(&self, thread_id: &str, resume: Resume<S::Update>, opts: RunOptions<S::Event>) -> Result<RunOutcome<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load(thread_id, None).await?;
        let (meta, interrupt) = Self::answered(thread_id, &tip, &resume)?;
        let ctx = self.run_ctx(thread_id, Arc::from(meta.run_id.as_str()), &opts);
        if meta.run_step >= ctx.limits.recursion_limit {
            // Refused before the answer is recorded, so it can still be given under a larger limit.
            let limit = ctx.limits.recursion_limit;
            return Err(RunError::RecursionLimit {
                thread_id: thread_id.into(),
                limit,
                next_node: interrupt.node,
                checkpoint: tip.label(),
            });
        }
        let run_id = meta.run_id.clone();
        let record = ResumeRecord {
            interrupt_id: interrupt.id,
            node: interrupt.node,
            payload: interrupt.payload,
            answer: resume.answer,
            delivery: 1,
        };
        let write = Write {
            source: CheckpointSource::Resume,
            node: None,
            update: resume.update.unwrap_or_default(),
            run_step: meta.run_step,
            interrupt: None,
            resume: Some(record),
        };
        self.persist(&ctx, &mut state, &mut tip, write).await?;
        // After the answer is durable, as for `run`.
        ctx.send(RunEvent::RunStarted { thread_id: thread_id.into(), run_id });
        self.drive(&ctx, state, tip).await
    }

    /// Withdraws the thread's pending interrupt without answering it: the node that asked does
    /// not run again, `update` is applied (the record of what happened, for the history) and
    /// the run ends there, so the thread is idle. Bound like [`Graph::resume`]: a stale or
    /// forged id or digest is refused and nothing changes. Nothing runs, so no events are sent.
    pub async fn abandon(&self, thread_id: &str, resume: Resume<S::Update>) -> Result<StateSnapshot<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load(thread_id, None).await?;
        let (meta, interrupt) = Self::answered(thread_id, &tip, &resume)?;
        let opts = RunOptions::default();
        let ctx = self.run_ctx(thread_id, Arc::from(meta.run_id.as_str()), &opts);
        let write = Write {
            source: CheckpointSource::Abandon,
            node: Some(interrupt.node),
            update: resume.update.unwrap_or_default(),
            run_step: meta.run_step,
            interrupt: None,
            resume: None,
        };
        self.persist(&ctx, &mut state, &mut tip, write).await?;
        let meta = tip.meta.clone().ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: None })?;
        let next = self.next_label(&state, Some(&meta));
        Ok(StateSnapshot { state, meta, next })
    }

    /// The newest checkpoint's metadata and the interrupt `resume` answers: refused unless it
    /// quotes the pending interrupt's id and the digest of its payload (which must still match).
    fn answered(thread_id: &str, tip: &Tip, resume: &Resume<S::Update>) -> Result<(CheckpointMeta, PendingInterrupt), RunError> {
        let meta = tip.meta.clone().ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: None })?;
        let interrupt = meta.interrupt.clone().ok_or_else(|| RunError::NothingToResume { thread_id: thread_id.into() })?;
        if resume.interrupt_id != interrupt.id {
            return Err(RunError::StaleResume { thread_id: thread_id.into(), given: resume.interrupt_id.clone(), pending: interrupt.id });
        }
        if resume.payload_digest != interrupt.digest || payload_digest(&interrupt.payload) != interrupt.digest {
            return Err(RunError::ForgedResume { thread_id: thread_id.into(), interrupt_id: interrupt.id });
        }
        Ok((meta, interrupt))
    }

    /// Continues an unfinished run from the thread's newest checkpoint (after a crash or a
    /// cancellation). A finished run completes at once; a paused one reports its interrupt. An
    /// answer whose node was interrupted is delivered again with its delivery count raised, so
    /// the node can tell that its approved action may already have run.
    pub async fn continue_run(&self, thread_id: &str, opts: RunOptions<S::Event>) -> Result<RunOutcome<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load(thread_id, None).await?;
        let run_id = tip.meta.as_ref().map_or_else(|| uuid::Uuid::new_v4().to_string(), |meta| meta.run_id.clone());
        let ctx = self.run_ctx(thread_id, Arc::from(run_id.as_str()), &opts);
        if let Some(meta) = tip.meta.clone()
            && let Some(record) = meta.resume
        {
            let record = ResumeRecord { delivery: record.delivery.saturating_add(1), ..record };
            let write = Write {
                source: CheckpointSource::Resume,
                node: None,
                update: S::Update::default(),
                run_step: meta.run_step,
                interrupt: None,
                resume: Some(record),
            };
            self.persist(&ctx, &mut state, &mut tip, write).await?;
        }
        ctx.send(RunEvent::RunStarted { thread_id: thread_id.into(), run_id });
        self.drive(&ctx, state, tip).await
    }

    /// Time travel: starts a new run from an earlier checkpoint, optionally applying `input`
    /// first. The new checkpoints branch off that checkpoint; the old branch is kept. With new
    /// input the branch is routed afresh; without, it continues where the origin stood, except
    /// that an open or answered question is asked again under a new id: an answer given on the
    /// old branch never counts on the new one.
    pub async fn run_from(
        &self,
        thread_id: &str,
        checkpoint_id: CheckpointId,
        input: Option<S::Update>,
        opts: RunOptions<S::Event>,
    ) -> Result<RunOutcome<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load(thread_id, Some(checkpoint_id)).await?;
        let origin =
            tip.meta.clone().ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: Some(checkpoint_id) })?;
        let ctx = self.run_ctx(thread_id, Arc::from(uuid::Uuid::new_v4().to_string()), &opts);
        let (node, interrupt) = match (&input, origin.interrupt, origin.resume) {
            (Some(_), _, _) => (None, None),
            (None, Some(asked), _) => (origin.node, Some(Self::reask(asked.node, asked.payload))),
            (None, None, Some(answered)) => (origin.node, Some(Self::reask(answered.node, answered.payload))),
            (None, None, None) => (origin.node, None),
        };
        let write = Write { source: CheckpointSource::Fork, node, update: input.unwrap_or_default(), run_step: 0, interrupt, resume: None };
        self.persist(&ctx, &mut state, &mut tip, write).await?;
        ctx.send(RunEvent::RunStarted { thread_id: thread_id.into(), run_id: ctx.run_id.to_string() });
        self.drive(&ctx, state, tip).await
    }

    /// A question with the same payload under a fresh id.
    fn reask(node: String, payload: Value) -> PendingInterrupt {
        PendingInterrupt { id: uuid::Uuid::new_v4().to_string(), node, digest: payload_digest(&payload), payload }
    }

    /// Applies an update outside any run (as if `as_node` had returned it), keeping a pending
    /// interrupt pending.
    pub async fn update_state(&self, thread_id: &str, update: S::Update, as_node: Option<&str>) -> Result<StateSnapshot<S>, RunError> {
        let _lock = self.lock(thread_id).await?;
        let (mut state, mut tip) = self.load_or_default(thread_id).await?;
        let run_id = tip.meta.as_ref().map_or_else(|| uuid::Uuid::new_v4().to_string(), |meta| meta.run_id.clone());
        let opts = RunOptions::default();
        let ctx = self.run_ctx(thread_id, Arc::from(run_id.as_str()), &opts);
        let previous = tip.meta.clone();
        let write = Write {
            source: CheckpointSource::Update,
            node: as_node.map(str::to_owned),
            update,
            run_step: previous.as_ref().map_or(0, |meta| meta.run_step),
            interrupt: previous.as_ref().and_then(|meta| meta.interrupt.clone()),
            resume: previous.and_then(|meta| meta.resume),
        };
        self.persist(&ctx, &mut state, &mut tip, write).await?;
        let meta = tip.meta.clone().ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: None })?;
        let next = self.next_label(&state, Some(&meta));
        Ok(StateSnapshot { state, meta, next })
    }

    /// The thread's newest state, or `None` for an unknown thread.
    pub async fn get_state(&self, thread_id: &str) -> Result<Option<StateSnapshot<S>>, RunError> {
        self.state_at_opt(thread_id, None).await
    }

    /// The thread's state at a checkpoint.
    pub async fn state_at(&self, thread_id: &str, checkpoint_id: CheckpointId) -> Result<StateSnapshot<S>, RunError> {
        self.state_at_opt(thread_id, Some(checkpoint_id))
            .await?
            .ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id: Some(checkpoint_id) })
    }

    async fn state_at_opt(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<Option<StateSnapshot<S>>, RunError> {
        let Some(checkpointer) = &self.inner.checkpointer else { return Ok(None) };
        let Some(loaded) = checkpointer.load_boxed(thread_id, checkpoint_id).await? else { return Ok(None) };
        let (state, tip) = Self::rebuild(thread_id, loaded)?;
        let meta = tip.meta.clone().ok_or_else(|| RunError::NotFound { thread_id: thread_id.into(), checkpoint_id })?;
        let next = self.next_label(&state, Some(&meta));
        Ok(Some(StateSnapshot { state, meta, next }))
    }

    /// The thread's checkpoints, newest first (metadata only).
    pub async fn history(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, RunError> {
        match &self.inner.checkpointer {
            Some(checkpointer) => Ok(checkpointer.list_boxed(thread_id, query).await?),
            None => Ok(Vec::new()),
        }
    }

    /// Every thread, most recently updated first.
    pub async fn threads(&self) -> Result<Vec<ThreadSummary>, RunError> {
        match &self.inner.checkpointer {
            Some(checkpointer) => Ok(checkpointer.threads_boxed().await?),
            None => Ok(Vec::new()),
        }
    }

    async fn lock(&self, thread_id: &str) -> Result<Option<ThreadLock>, RunError> {
        match &self.inner.checkpointer {
            Some(checkpointer) => Ok(Some(checkpointer.lock_thread_boxed(thread_id).await?)),
            None => Ok(None),
        }
    }

    fn run_ctx<'a>(&self, thread_id: &str, run_id: Arc<str>, opts: &'a RunOptions<S::Event>) -> RunCtx<'a, S::Event> {
        let limits = opts.limits.unwrap_or(self.inner.limits);
        // A budget too large to represent means no deadline.
        let deadline = limits.max_run_time.and_then(|budget| Instant::now().checked_add(budget));
        RunCtx { thread_id: Arc::from(thread_id), run_id, opts, limits, deadline }
    }

    async fn load_or_default(&self, thread_id: &str) -> Result<(Arc<S>, Tip), RunError> {
        let Some(checkpointer) = &self.inner.checkpointer else { return Ok((Arc::new(S::default()), Tip::default())) };
        match checkpointer.load_boxed(thread_id, None).await? {
            Some(loaded) => Self::rebuild(thread_id, loaded),
            None => Ok((Arc::new(S::default()), Tip::default())),
        }
    }

    async fn load(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<(Arc<S>, Tip), RunError> {
        let not_found = || RunError::NotFound { thread_id: thread_id.into(), checkpoint_id };
        let checkpointer = self.inner.checkpointer.as_ref().ok_or_else(not_found)?;
        let loaded = checkpointer.load_boxed(thread_id, checkpoint_id).await?.ok_or_else(not_found)?;
        Self::rebuild(thread_id, loaded)
    }

    fn rebuild(thread_id: &str, loaded: crate::checkpoint::LoadedCheckpoint) -> Result<(Arc<S>, Tip), RunError> {
        let rebuilt = |source| RunError::State { thread_id: thread_id.into(), action: "rebuilt", source };
        let mut state: S = serde_json::from_slice(&loaded.snapshot).map_err(rebuilt)?;
        let mut delta_bytes = 0;
        for delta in &loaded.deltas {
            delta_bytes += delta.len();
            state.apply(serde_json::from_slice(delta).map_err(rebuilt)?);
        }
        let tip =
            Tip { meta: Some(loaded.meta), stored: true, snapshot_bytes: loaded.snapshot.len(), delta_bytes, deltas: loaded.deltas.len() };
        Ok((Arc::new(state), tip))
    }

    /// Applies the write's update and stores the checkpoint (when there is a checkpointer).
    async fn persist(
        &self,
        ctx: &RunCtx<'_, S::Event>,
        state: &mut Arc<S>,
        tip: &mut Tip,
        write: Write<S::Update>,
    ) -> Result<(), RunError> {
        let serialize_error = |source| RunError::State { thread_id: ctx.thread_id.to_string(), action: "serialized", source };
        let delta = match self.inner.checkpointer {
            Some(_) => serde_json::to_vec(&write.update).map_err(serialize_error)?,
            None => Vec::new(),
        };
        Arc::make_mut(state).apply(write.update);
        let mut checkpoint = NewCheckpoint {
            thread_id: ctx.thread_id.to_string(),
            parent_id: tip.id(),
            source: write.source,
            node: write.node,
            run_id: ctx.run_id.to_string(),
            run_step: write.run_step,
            interrupt: write.interrupt,
            resume: write.resume,
            delta,
            snapshot: None,
            created_at: Utc::now(),
        };
        let Some(checkpointer) = &self.inner.checkpointer else {
            // Nothing is stored; the tip still tells the loop which node ran last.
            tip.meta = Some(checkpoint.meta(0));
            return Ok(());
        };
        let delta_len = checkpoint.delta.len();
        let snapshot_due = tip.meta.is_none()
            || tip.deltas + 1 > MAX_DELTAS_BETWEEN_SNAPSHOTS
            || tip.delta_bytes + delta_len > tip.snapshot_bytes.max(MIN_SNAPSHOT_INTERVAL_BYTES);
        if snapshot_due {
            checkpoint.snapshot = Some(serde_json::to_vec(&**state).map_err(serialize_error)?);
        }
        let snapshot_len = checkpoint.snapshot.as_ref().map(Vec::len);
        let meta = checkpointer.put_boxed(checkpoint).await?;
        *tip = match snapshot_len {
            Some(snapshot_bytes) => Tip { meta: Some(meta), stored: true, snapshot_bytes, delta_bytes: 0, deltas: 0 },
            None => Tip {
                meta: Some(meta),
                stored: true,
                snapshot_bytes: tip.snapshot_bytes,
                delta_bytes: tip.delta_bytes + delta_len,
                deltas: tip.deltas + 1,
            },
        };
        Ok(())
    }

    fn next(&self, state: &S, meta: Option<&CheckpointMeta>) -> Next {
        if let Some(meta) = meta {
            if let Some(interrupt) = &meta.interrupt {
                return Next::Paused(interrupt.clone());
            }
            if let Some(resume) = &meta.resume {
                return Next::Run { node: resume.node.clone(), delay: Duration::ZERO, resume: Some(resume.clone()) };
            }
            if meta.source == CheckpointSource::Abandon {
                return Next::Finished;
            }
            let finished_node = matches!(meta.source, CheckpointSource::Loop | CheckpointSource::Update | CheckpointSource::Fork);
            if finished_node && meta.node.as_ref().is_some_and(|node| self.inner.terminal.contains(node)) {
                return Next::Finished;
            }
        }
        match (self.inner.router)(state) {
            Route::Node(node) => Next::Run { node, delay: Duration::ZERO, resume: None },
            Route::After { node, delay } => Next::Run { node, delay, resume: None },
            Route::End => Next::Finished,
            Route::Abort(message) => Next::Abort(message),
        }
    }

    fn next_label(&self, state: &S, meta: Option<&CheckpointMeta>) -> Option<String> {
        match self.next(state, meta) {
            Next::Run { node, .. } => Some(node),
            Next::Paused(interrupt) => Some(interrupt.node),
            Next::Finished | Next::Abort(_) => None,
        }
    }

    /// Waits for `future` unless the run is cancelled or out of time first. `deadline` is the
    /// run's one deadline timer, shared by every wait of the run. The work is polled first, so a
    /// node that finished is kept even when a cancel or the deadline arrived in the same instant.
    async fn guarded<T>(
        ctx: &RunCtx<'_, S::Event>,
        deadline: std::pin::Pin<&mut (impl Future<Output = ()> + ?Sized)>,
        future: impl Future<Output = T>,
    ) -> Result<T, Interruption> {
        tokio::select! {
            biased;
            value = future => Ok(value),
            () = ctx.opts.cancel.cancelled() => Err(Interruption::Cancelled),
            () = deadline => Err(Interruption::TimedOut),
        }
    }

    fn interrupted(
        &self,
        ctx: &RunCtx<'_, S::Event>,
        how: Interruption,
        state: Arc<S>,
        tip: &Tip,
        doing: String,
    ) -> Result<RunOutcome<S>, RunError> {
        match how {
            Interruption::Cancelled => Ok(RunOutcome::Cancelled { state, checkpoint_id: tip.id() }),
            Interruption::TimedOut => Err(RunError::TimeLimit {
                thread_id: ctx.thread_id.to_string(),
                limit: ctx.limits.max_run_time.unwrap_or_default(),
                doing,
                checkpoint: tip.label(),
            }),
        }
    }

    /// The run loop.
    async fn drive(&self, ctx: &RunCtx<'_, S::Event>, mut state: Arc<S>, mut tip: Tip) -> Result<RunOutcome<S>, RunError> {
        let mut run_step = tip.meta.as_ref().map_or(0, |meta| meta.run_step);
        let mut deadline = std::pin::pin!(until_deadline(ctx.deadline));
        loop {
            if ctx.opts.cancel.is_cancelled() {
                return Ok(RunOutcome::Cancelled { state, checkpoint_id: tip.id() });
            }
            let (node_name, delay, resume) = match self.next(&state, tip.meta.as_ref()) {
                Next::Run { node, delay, resume } => (node, delay, resume),
                Next::Finished => {
                    let last_node = tip.meta.as_ref().and_then(|meta| meta.node.clone());
                    ctx.send(RunEvent::RunFinished { last_node: last_node.clone() });
                    return Ok(RunOutcome::Completed { state, checkpoint_id: tip.id(), last_node });
                }
                Next::Paused(interrupt) => {
                    let checkpoint_id = tip.id().unwrap_or_default();
                    ctx.send(RunEvent::Interrupted { interrupt: interrupt.clone() });
                    return Ok(RunOutcome::Interrupted { state, interrupt, checkpoint_id });
                }
                Next::Abort(message) => {
                    return Err(RunError::RouterAborted { thread_id: ctx.thread_id.to_string(), message, checkpoint: tip.label() });
                }
            };
            let Some((name, node)) = self.inner.nodes.get_key_value(node_name.as_str()) else {
                let mut known: Vec<String> = self.inner.nodes.keys().map(|name| name.to_string()).collect();
                known.sort();
                return Err(RunError::UnknownNode { node: node_name, known });
            };
            if run_step >= ctx.limits.recursion_limit {
                return Err(RunError::RecursionLimit {
                    thread_id: ctx.thread_id.to_string(),
                    limit: ctx.limits.recursion_limit,
                    next_node: node_name,
                    checkpoint: tip.label(),
                });
            }
            if !delay.is_zero() {
                ctx.send(RunEvent::Waiting { node: node_name.clone(), delay });
                if let Err(how) = Self::guarded(ctx, deadline.as_mut(), tokio::time::sleep(delay)).await {
                    return self.interrupted(ctx, how, state, &tip, format!("waiting {delay:?} to retry '{node_name}'"));
                }
            }
            run_step += 1;
            ctx.send(RunEvent::NodeStarted { node: node_name.clone(), step: run_step });
            let node_ctx = NodeContext {
                thread_id: ctx.thread_id.clone(),
                run_id: ctx.run_id.clone(),
                node: name.clone(),
                step: run_step,
                resume,
                events: ctx.opts.events.clone(),
                cancel: ctx.opts.cancel.clone(),
            };
            let started = Instant::now();
            let running = AssertUnwindSafe(node.run_boxed(state.clone(), &node_ctx)).catch_unwind();
            let output = match Self::guarded(ctx, deadline.as_mut(), running).await {
                Ok(Ok(Ok(output))) => output,
                Ok(Ok(Err(error))) => {
                    return Err(RunError::Aborted {
                        thread_id: ctx.thread_id.to_string(),
                        node: node_name,
                        message: error.message,
                        checkpoint: tip.label(),
                    });
                }
                Ok(Err(panic)) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    return Err(RunError::NodePanicked {
                        thread_id: ctx.thread_id.to_string(),
                        node: node_name,
                        message,
                        checkpoint: tip.label(),
                    });
                }
                Err(how) => return self.interrupted(ctx, how, state, &tip, format!("running node '{node_name}'")),
            };
            drop(node_ctx);
            let duration = started.elapsed();
            match output {
                NodeOutput::Update(update) => {
                    let write = Write {
                        source: CheckpointSource::Loop,
                        node: Some(node_name.clone()),
                        update,
                        run_step,
                        interrupt: None,
                        resume: None,
                    };
                    self.persist(ctx, &mut state, &mut tip, write).await?;
                    ctx.send(RunEvent::NodeFinished { node: node_name, step: run_step, checkpoint_id: tip.id(), duration });
                }
                NodeOutput::Interrupt { payload, update } => {
                    if self.inner.checkpointer.is_none() {
                        return Err(RunError::InterruptWithoutCheckpointer { node: node_name });
                    }
                    let interrupt = PendingInterrupt {
                        id: uuid::Uuid::new_v4().to_string(),
                        node: node_name.clone(),
                        digest: payload_digest(&payload),
                        payload,
                    };
                    let write = Write {
                        source: CheckpointSource::Loop,
                        node: Some(node_name.clone()),
                        update,
                        run_step,
                        interrupt: Some(interrupt),
                        resume: None,
                    };
                    self.persist(ctx, &mut state, &mut tip, write).await?;
                    ctx.send(RunEvent::NodeFinished { node: node_name, step: run_step, checkpoint_id: tip.id(), duration });
                }
            }
        }
    }
}

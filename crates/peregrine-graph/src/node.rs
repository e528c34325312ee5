//! Nodes: the units of work a graph runs. A node reads the state and returns an update, asks a
//! question (interrupt), or fails fatally; it never routes and never touches storage.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use peregrine_core::GraphState;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::ResumeRecord;
use crate::events::RunEvent;

/// What a node returns when it does not fail fatally.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeOutput<U> {
    /// Apply this update, checkpoint, and route again.
    Update(U),
    /// Apply `update`, checkpoint with a pending question, and pause the run. When answered,
    /// the same node runs again with [`NodeContext::resume`] set.
    Interrupt {
        /// What the person is asked to approve; the answer is bound to its digest.
        payload: Value,
        /// Changes to keep while paused (often empty).
        update: U,
    },
}

/// A failure that ends the run; the last checkpoint is kept. Recoverable failures are state
/// (an update recording the error) so the router can recover from them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    /// What happened and what to do about it.
    pub message: String,
}

impl NodeError {
    /// A fatal error with a message.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

/// The result of running a node.
pub type NodeResult<U> = Result<NodeOutput<U>, NodeError>;

/// What a node knows about the run it is part of.
pub struct NodeContext<S: GraphState> {
    pub(crate) thread_id: Arc<str>,
    pub(crate) run_id: Arc<str>,
    pub(crate) node: Arc<str>,
    pub(crate) step: u32,
    pub(crate) resume: Option<ResumeRecord>,
    pub(crate) events: Option<UnboundedSender<RunEvent<S::Event>>>,
    pub(crate) cancel: CancellationToken,
}

impl<S: GraphState> NodeContext<S> {
    /// A context outside any run, for driving one node directly (unit tests, tools): step 1,
    /// no resume record, no event listener, never cancelled.
    pub fn standalone(thread_id: &str, node: &str) -> Self {
        Self {
            thread_id: Arc::from(thread_id),
            run_id: Arc::from("standalone"),
            node: Arc::from(node),
            step: 1,
            resume: None,
            events: None,
            cancel: CancellationToken::new(),
        }
    }

    /// The same context carrying the answer to the node's interrupt.
    pub fn with_resume(mut self, resume: ResumeRecord) -> Self {
        self.resume = Some(resume);
        self
    }

    /// The same context sending events to `events`.
    pub fn with_events(mut self, events: UnboundedSender<RunEvent<S::Event>>) -> Self {
        self.events = Some(events);
        self
    }

    /// The thread being run.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// 1-based number of this node execution within the run.
    pub fn step(&self) -> u32 {
        self.step
    }

    /// The answer to this node's interrupt, when it runs again after one.
    pub fn resume(&self) -> Option<&ResumeRecord> {
        self.resume.as_ref()
    }

    /// Sends a domain event on the run's event stream (dropped when nobody listens).
    pub fn emit(&self, event: S::Event) {
        if let Some(events) = &self.events {
            // A closed receiver means nobody listens any more; the run goes on.
            let _ = events.send(RunEvent::Custom(event));
        }
    }

    /// Whether the run has been cancelled; long nodes may check it between pieces of work.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The run's cancellation token, for `select!` inside long nodes.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// A unit of work in a graph.
pub trait Node<S: GraphState>: Send + Sync + 'static {
    /// Runs the node on the current state.
    fn run(&self, state: Arc<S>, ctx: &NodeContext<S>) -> impl Future<Output = NodeResult<S::Update>> + Send;
}

/// A boxed future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Node`], implemented for every node.
pub trait DynNode<S: GraphState>: Send + Sync + 'static {
    /// See [`Node::run`].
    fn run_boxed<'a>(&'a self, state: Arc<S>, ctx: &'a NodeContext<S>) -> BoxFuture<'a, NodeResult<S::Update>>;
}

impl<S: GraphState, N: Node<S>> DynNode<S> for N {
    fn run_boxed<'a>(&'a self, state: Arc<S>, ctx: &'a NodeContext<S>) -> BoxFuture<'a, NodeResult<S::Update>> {
        Box::pin(self.run(state, ctx))
    }
}

/// A node made from an async closure `|state, ctx| async move { … }` that owns its inputs.
pub struct FnNode<F>(pub F);

impl<S, F, Fut> Node<S> for FnNode<F>
where
    S: GraphState,
    F: Fn(Arc<S>, NodeInfo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = NodeResult<S::Update>> + Send + 'static,
{
    fn run(&self, state: Arc<S>, ctx: &NodeContext<S>) -> impl Future<Output = NodeResult<S::Update>> + Send {
        (self.0)(state, NodeInfo { node: ctx.node.clone(), step: ctx.step, resume: ctx.resume.clone() })
    }
}

/// The owned part of a [`NodeContext`] handed to closure nodes.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node's name.
    pub node: Arc<str>,
    /// 1-based number of this execution within the run.
    pub step: u32,
    /// The answer to this node's interrupt, when it runs again after one.
    pub resume: Option<ResumeRecord>,
}

/// Wraps an async closure as a node.
pub fn node_fn<S, F, Fut>(function: F) -> FnNode<F>
where
    S: GraphState,
    F: Fn(Arc<S>, NodeInfo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = NodeResult<S::Update>> + Send + 'static,
{
    FnNode(function)
}

//! Graph assembly: a `Registry` of capabilities plus the infrastructure nodes become one
//! router-controlled graph, with the limits of `execution_control.limits` wired into the router
//! and the engine.

use std::sync::Arc;

use peregrine_core::error::InvalidLimit;
use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::{AgentState, ExecutionLimits, Registry};
use peregrine_graph::{BuildError, DynCheckpointer, DynNode, Graph, GraphLimits};

use crate::nodes::{CapabilityNode, InfrastructureNode, InfrastructureWrapper};
use crate::router::{CLASSIFIER, ERROR, ORCHESTRATOR, RouterConfig, TASK_EXTRACTION, route};

/// An agent graph that cannot be assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AssemblyError {
    /// A limit that cannot work.
    #[error(transparent)]
    InvalidLimits(#[from] InvalidLimit),
    /// A required infrastructure node is missing.
    #[error("the agent graph needs the infrastructure node '{0}'; add it with AgentGraphBuilder::infrastructure")]
    MissingNode(&'static str),
    /// A required capability is missing.
    #[error("the agent graph needs the capability '{0}' in the registry (it ends turns)")]
    MissingCapability(&'static str),
    /// An infrastructure node and a capability share a name.
    #[error("'{0}' is both an infrastructure node and a capability; rename one of them")]
    NameClash(String),
    /// An agent without a checkpointer could not keep conversations or approvals.
    #[error(
        "the agent needs a checkpointer: conversations and approvals live in it; use AgentBuilder::checkpointer (MemoryCheckpointer for tests)"
    )]
    MissingCheckpointer,
    /// A framework capability could not be registered.
    #[error(transparent)]
    Registry(peregrine_core::RegistryError),
    /// The graph engine refused the graph.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// Builds the agent graph.
pub struct AgentGraphBuilder {
    registry: Registry,
    limits: ExecutionLimits,
    infrastructure: Vec<(String, Arc<dyn DynNode<AgentState>>)>,
    checkpointer: Option<Arc<dyn DynCheckpointer>>,
}

impl AgentGraphBuilder {
    /// Starts from a registry and limits.
    pub fn new(registry: Registry, limits: ExecutionLimits) -> Self {
        Self { registry, limits, infrastructure: Vec::new(), checkpointer: None }
    }

    /// Adds an infrastructure node.
    pub fn infrastructure(mut self, node: impl InfrastructureNode) -> Self {
        let name = node.name().to_owned();
        self.infrastructure.push((name, Arc::new(InfrastructureWrapper(node))));
        self
    }

    /// Persists every step with `checkpointer`.
    pub fn checkpointer(mut self, checkpointer: Arc<dyn DynCheckpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Checks and assembles the graph.
    pub fn build(self) -> Result<Graph<AgentState>, AssemblyError> {
        self.limits.validate()?;
        for required in [TASK_EXTRACTION, CLASSIFIER, ORCHESTRATOR, ERROR] {
            if !self.infrastructure.iter().any(|(name, _)| name == required) {
                return Err(AssemblyError::MissingNode(required));
            }
        }
        for required in [RESPOND, CLARIFY] {
            if !self.registry.contains(required) {
                return Err(AssemblyError::MissingCapability(required));
            }
        }
        if let Some((name, _)) = self.infrastructure.iter().find(|(name, _)| self.registry.contains(name)) {
            return Err(AssemblyError::NameClash(name.clone()));
        }
        let config = RouterConfig::new(&self.registry, self.limits);
        let mut builder = Graph::builder().router(move |state: &AgentState| route(state, &config)).limits(GraphLimits {
            recursion_limit: self.limits.graph_recursion_limit,
            max_run_time: Some(self.limits.max_execution_time()),
        });
        for capability in self.registry.iter() {
            builder = builder.node(capability.spec().name.clone(), CapabilityNode::new(capability.clone()));
        }
        for (name, node) in self.infrastructure {
            builder = builder.dyn_node(name, node);
        }
        if let Some(checkpointer) = self.checkpointer {
            builder = builder.shared_checkpointer(checkpointer);
        }
        Ok(builder.build()?)
    }
}

//! The Peregrine agent framework proper: the router edge with Osprey's recovery semantics, the
//! node wrappers that turn capabilities and infrastructure nodes into graph nodes, and the
//! assembly of one router-controlled graph from a capability registry.

pub mod assembly;
pub mod nodes;
pub mod router;

pub use assembly::{AgentGraphBuilder, AssemblyError};
pub use nodes::{CapabilityNode, InfrastructureNode, InfrastructureWrapper, approval_answer};
pub use router::{CLASSIFIER, ERROR, ORCHESTRATOR, RouterConfig, TASK_EXTRACTION, TERMINAL_NODES, route};

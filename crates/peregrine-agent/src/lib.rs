//! The Peregrine agent framework proper: the router edge with Osprey's recovery semantics, the
//! node wrappers that turn capabilities and infrastructure nodes into graph nodes, the
//! framework's infrastructure nodes and terminal capabilities with their prompt builders, and
//! the assembly of one router-controlled graph from a capability registry.

pub mod agent;
pub mod answer_stream;
pub mod assembly;
pub mod catalog;
pub mod clarify;
pub mod commands;
pub mod datasource;
pub mod gateway;
pub mod history;
pub mod infra;
pub mod nodes;
pub mod respond;
pub mod router;
pub mod services;
pub mod settings;
#[cfg(test)]
mod test_support;
pub mod threads;
pub mod wire;

pub use agent::{
    Agent, AgentBuilder, AgentError, AnsweredApproval, ApprovalOutcome, ApprovalRef, ApprovalReply, NothingToContinue, PromptOverrides,
    TurnOptions, TurnResult, TurnStatus, approval_prompt,
};
pub use answer_stream::{AnswerStream, StreamStep};
pub use assembly::{AgentGraphBuilder, AssemblyError};
pub use catalog::Catalog;
pub use commands::{CommandError, ParsedInput, SlashCommand, parse_input};
pub use datasource::{DataSource, DataSourceRequest, RetrievedData};
pub use gateway::{ApprovalDetection, ApprovalMethod, Gateway, GatewayAction, GatewayError, Session, keyword_answer};
pub use nodes::{CapabilityNode, InfrastructureNode, InfrastructureWrapper, NodeEvents, approval_answer};
pub use router::{CLASSIFIER, ERROR, ORCHESTRATOR, RouterConfig, TASK_EXTRACTION, TERMINAL_NODES, route};
pub use services::Services;
pub use settings::{AgentSettings, ClassifierMode};
pub use threads::{Thread, ThreadStatus};

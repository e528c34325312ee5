//! Peregrine's vocabulary: the agent state and its updates, execution plans and their
//! validation, error severities and retry policies, execution limits, the typed capability
//! context store, the `Capability` trait and `Registry`, and typed events.
//!
//! This crate does no I/O: everything here is data and pure functions, so the router, plan
//! validation and context rules can be table-tested without a runtime.

pub mod approval;
pub mod capability;
pub mod concurrency;
pub mod context;
pub mod error;
pub mod events;
pub mod graph_state;
pub mod plan;
pub mod registry;
pub mod state;

pub use approval::{ApprovalConfig, ApprovalDecision, approval_message};
pub use capability::{
    ApprovalAnswer, ApprovalRequest, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ClassifierExample,
    ClassifierGuide, DynCapability, EventSink, OrchestratorExample, OrchestratorGuide,
};
pub use context::{Cardinality, ConstraintMode, ContextEntry, ContextError, ContextStore, ContextType, Requirement};
pub use error::{ErrorClassification, ErrorSeverity, ExecutionLimits, RetryPolicy};
pub use events::{AgentEvent, ChannelWriteStage, EventKind};
pub use graph_state::{GraphState, Slot};
pub use plan::{ExecutionPlan, InputRef, PlanValidationError, PlannedStep, validate_plan};
pub use registry::{Registry, RegistryError};
pub use state::{AgentControl, AgentState, AgentStateUpdate, ApprovalMode, ControlUpdate, ErrorInfo, Message, NodeKind, Role, TurnStart};

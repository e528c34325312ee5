//! The framework's infrastructure nodes: task extraction, classifier, orchestrator and the
//! error node, each with its prompt builder, error classification and retry policy (§2, §3.3).

pub mod classifier;
pub mod error_node;
pub mod orchestrator;
pub mod task_extraction;

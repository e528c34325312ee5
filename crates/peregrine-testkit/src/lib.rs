//! Test support for Peregrine: scripted infrastructure nodes and capabilities whose behaviour
//! is a closure of (state, call number), call recorders, and a ready-made agent graph with no
//! LLM, for exercising the router, wrappers and engine end to end.

pub mod agent_fixture;
pub mod llm_server;
pub mod scripted;

pub use llm_server::{Endpoint, Fault, RecordedRequest, Reply, SchemaSource, Script, ScriptedLlmServer, ToolCall, Usage};
pub use scripted::{ApprovalLog, Behaviour, CallLog, ScriptedAgent, ScriptedCapability, ScriptedInfra, fail};

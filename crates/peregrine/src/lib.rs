//! Peregrine applications: `config.yml` (Osprey-compatible), the agent runtime and the command
//! line. An application built on Peregrine gets every command — `chat`, `run`, `init`,
//! `serve`, `health`, `config`, `threads`, `completions` — from one call:
//!
//! ```no_run
//! use peregrine::{Application, Registry, RegistryError, Services};
//!
//! struct MyApp;
//!
//! impl Application for MyApp {
//!     fn name(&self) -> &str {
//!         "my-app"
//!     }
//!     fn register(&self, _registry: &mut Registry, _services: &Services) -> Result<(), RegistryError> {
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     peregrine::main(MyApp)
//! }
//! ```
//!
//! The framework crates are re-exported (`peregrine::core`, `peregrine::agent`, …) so an
//! application needs only this dependency.

pub mod app;
pub mod cli;
mod commands;
pub mod config;
pub mod embedded;
pub mod output;
pub mod runtime;
pub mod turn;

pub use app::{Application, FrameworkApp, main};

/// Every binary that links Peregrine allocates with mimalloc (feature `mimalloc`, on by default),
/// which returns freed memory to the system: with glibc's malloc a server kept the memory of a
/// burst of large messages long after the burst.
#[cfg(all(feature = "mimalloc", not(test)))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
pub use peregrine_agent::{PromptOverrides, Services};
pub use peregrine_core::{Registry, RegistryError};

/// The agent: gateway, infrastructure nodes, prompts, graph assembly.
pub use peregrine_agent as agent;
/// Built-in capabilities.
pub use peregrine_capabilities as capabilities;
/// Checkpoint stores.
pub use peregrine_checkpoint as checkpoint;
/// The control-system layer: connectors (mock, EPICS), limits, write gates.
pub use peregrine_control as control;
/// The framework's vocabulary: state, capabilities, errors, plans, events.
pub use peregrine_core as core;
/// The durable graph engine.
pub use peregrine_graph as graph;
/// The LLM layer.
pub use peregrine_llm as llm;
/// The HTTP server behind `serve`.
pub use peregrine_server as server;

//! `{{package}}`: a Peregrine application with one capability.
//!
//! A turn goes: task extraction → classifier (which capabilities does the task need?) →
//! orchestrator (a plan of steps) → the capabilities of the plan → respond. This crate adds one
//! capability to the framework's own (`respond`, `clarify`, `memory`, `time_range_parsing`):
//!
//! - [`hello`]: the `hello` capability, its classifier and orchestrator guides;
//! - [`context`]: `GREETING`, the typed context `hello` stores and `respond` reads;
//! - [`app`]: the [`peregrine::Application`] that registers it.
//!
//! To add a capability, copy `hello.rs` and `context.rs`, give the copies a new name and context
//! type, and register the capability in `app.rs`.

pub mod app;
pub mod context;
pub mod hello;

pub use app::{APP_NAME, App};
pub use context::GreetingContext;
pub use hello::HelloCapability;

//! `GREETING`: the typed context `hello` stores. Capabilities exchange data only through typed
//! contexts: a step stores one under its `context_key`, and later steps (here `respond`) name
//! it in their `inputs`.

use peregrine::core::ContextType;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A greeting prepared for the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GreetingContext {
    /// The greeting itself.
    pub greeting: String,
    /// What the step was asked to do (the plan step's objective).
    pub request: String,
}

impl GreetingContext {
    /// The greeting for one request.
    pub fn for_request(request: &str) -> Self {
        Self {
            greeting: format!("Hello from {}! This greeting comes from the `hello` capability.", crate::APP_NAME),
            request: request.trim().to_owned(),
        }
    }
}

impl ContextType for GreetingContext {
    /// The name plans and the context store use for this type.
    const CONTEXT_TYPE: &'static str = "GREETING";
    /// `COMPUTATIONAL_DATA`, `METADATA` or `CONTEXTUAL_KNOWLEDGE`.
    const CONTEXT_CATEGORY: &'static str = "CONTEXTUAL_KNOWLEDGE";

    /// What `respond` (and the orchestrator) see of a stored greeting; keep it short.
    fn summary(&self) -> Value {
        json!({ "greeting": self.greeting, "request": self.request })
    }
}

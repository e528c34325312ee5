//! What the framework's nodes and the application's capabilities share: the LLM client and the
//! settings. Cloning is cheap (both shared). The framework's own nodes also get the capability
//! [`Catalog`](crate::catalog::Catalog), which is only complete once every capability is built.

use std::sync::Arc;

use peregrine_llm::LlmClient;

use crate::settings::AgentSettings;

/// Shared services of one agent.
#[derive(Debug, Clone)]
pub struct Services {
    /// LLM calls by role.
    pub llm: Arc<LlmClient>,
    /// Framework settings.
    pub settings: Arc<AgentSettings>,
}

impl Services {
    /// Services from a client and settings.
    pub fn new(llm: Arc<LlmClient>, settings: AgentSettings) -> Self {
        Self { llm, settings: Arc::new(settings) }
    }
}

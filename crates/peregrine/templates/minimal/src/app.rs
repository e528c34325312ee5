//! The application as Peregrine runs it: its name and its capabilities.

use peregrine::{Application, Registry, RegistryError, Services};

use crate::hello::HelloCapability;

/// The application's name (the command's name in `--help`).
pub const APP_NAME: &str = "{{package}}";

/// The application: `hello` plus the framework's built-in capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct App;

impl Application for App {
    fn name(&self) -> &str {
        APP_NAME
    }

    fn about(&self) -> &str {
        "{{package}}: a Peregrine agent"
    }

    /// Registers the application's capabilities; the framework adds `respond`, `clarify`,
    /// `memory` and `time_range_parsing` itself. `services` carries the LLM client and the
    /// settings (timezone, data directory) for capabilities that need them.
    fn register(&self, registry: &mut Registry, services: &Services) -> Result<(), RegistryError> {
        let _ = services;
        registry.register(HelloCapability::new())
    }

    // Optional: `fn prompts(&self) -> PromptOverrides` replaces single prompt builders (task
    // extraction, classifier, orchestrator, respond, …); `fn data_sources` adds data that task
    // extraction sees. The hello-world-weather template shows both.
}

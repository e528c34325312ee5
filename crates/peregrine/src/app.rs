//! What an application tells Peregrine, and the one entry point that gives it every command.

use std::process::ExitCode;
use std::sync::Arc;

use peregrine_agent::{DataSource, PromptOverrides, Services};
use peregrine_core::{Registry, RegistryError};

/// An application built on Peregrine: its capabilities, prompt overrides and data sources. The
/// framework adds its own (`respond`, `clarify`, `memory`, `time_range_parsing` and the user
/// memory data source) unless [`Application::framework_capabilities`] says otherwise.
pub trait Application: Send + Sync + 'static {
    /// The command's name in help and messages (`hello-world-weather`).
    fn name(&self) -> &str;

    /// One line for `--help`.
    fn about(&self) -> &str {
        "A Peregrine agent: router-controlled capabilities with durable execution"
    }

    /// Adds the application's capabilities.
    fn register(&self, registry: &mut Registry, services: &Services) -> Result<(), RegistryError>;

    /// Prompt builders that replace the framework's (task extraction, classifier, …).
    fn prompts(&self) -> PromptOverrides {
        PromptOverrides::default()
    }

    /// Extra data sources offered to task extraction.
    fn data_sources(&self, services: &Services) -> Vec<Arc<dyn DataSource>> {
        let _ = services;
        Vec::new()
    }

    /// Whether the framework's built-in capabilities (`memory`, `time_range_parsing`) and the
    /// user-memory data source are added (upstream's `extend_framework_registry`); true by default.
    fn framework_capabilities(&self) -> bool {
        true
    }
}

/// The framework on its own: respond, clarify and the built-in capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameworkApp;

impl Application for FrameworkApp {
    fn name(&self) -> &str {
        "peregrine"
    }

    fn register(&self, _registry: &mut Registry, _services: &Services) -> Result<(), RegistryError> {
        Ok(())
    }
}

/// Parses the command line and runs the command for `app`; the process's exit code: 0 on
/// success (a turn that ended in an error report is still a success for `run`), 2 for usage or
/// configuration errors, 1 for other failures (a store that cannot be opened, a failed health
/// check).
pub fn main(app: impl Application) -> ExitCode {
    crate::cli::main(Arc::new(app), None)
}

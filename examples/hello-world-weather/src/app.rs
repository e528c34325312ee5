//! The application as Peregrine runs it: `hello-world-weather chat|run|health|…`.

use peregrine::{Application, PromptOverrides, Registry, RegistryError, Services};

/// The hello-world-weather application: `current_weather`, the template's task-extraction
/// prompts, and the framework's built-in capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct WeatherApp;

impl Application for WeatherApp {
    fn name(&self) -> &str {
        "hello-world-weather"
    }

    fn about(&self) -> &str {
        "Peregrine's hello-world-weather agent: current weather from a mock service"
    }

    fn register(&self, registry: &mut Registry, services: &Services) -> Result<(), RegistryError> {
        crate::register(registry, services)
    }

    fn prompts(&self) -> PromptOverrides {
        crate::prompts::prompt_overrides()
    }
}

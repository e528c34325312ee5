//! The hello-world-weather example application (Osprey's `hello_world_weather` template): one
//! `current_weather` capability that reads the location from the step objective with one
//! structured LLM call and stores a `CURRENT_WEATHER` context from a deterministic mock weather
//! service; plus the template's task-extraction prompts and, for benchmarks, stand-in
//! capabilities of other domains.

pub mod app;
pub mod bench_support;
pub mod capability;
pub mod context;
pub mod guides;
pub mod mock_service;
pub mod prompts;

use peregrine_agent::Services;
use peregrine_core::{Registry, RegistryError};

pub use app::WeatherApp;
pub use bench_support::{StandInCapability, extra_capabilities, register_extra_capabilities};
pub use capability::{CurrentWeatherCapability, DEFAULT_LOCATION, LOCATION_EXTRACTION_ROLE, LocationExtraction, WeatherError};
pub use context::CurrentWeatherContext;
pub use mock_service::{CurrentWeatherReading, KNOWN_CITIES, MockWeatherService};

/// Adds the application's capabilities (`current_weather`) to `registry`.
///
/// Only the application's own capabilities: the framework adds its terminal capabilities
/// (`respond`, `clarify`) and any built-in ones when it assembles the agent, as upstream's
/// `extend_framework_registry` does. Fails only when a capability of the same name is already
/// registered.
pub fn register(registry: &mut Registry, services: &Services) -> Result<(), RegistryError> {
    registry.register(CurrentWeatherCapability::new(services.clone()))
}

/// A registry holding the application's capabilities only (see [`register`]).
pub fn registry(services: &Services) -> Result<Registry, RegistryError> {
    let mut registry = Registry::new();
    register(&mut registry, services)?;
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use peregrine_agent::AgentSettings;
    use peregrine_llm::FakeProvider;

    use super::*;

    #[test]
    fn the_registry_holds_the_application_capabilities_only() {
        let services = Services::new(Arc::new(FakeProvider::new(|_| Ok(String::new())).client()), AgentSettings::default());
        let registry = registry(&services).expect("registers");
        assert_eq!(registry.names().collect::<Vec<_>>(), ["current_weather"]);
        assert_eq!(registry.providers_of("CURRENT_WEATHER"), ["current_weather"]);
        let mut again = registry.clone();
        assert_eq!(register(&mut again, &services), Err(RegistryError::Duplicate("current_weather".into())));
    }
}

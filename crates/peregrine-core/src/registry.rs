//! The capability registry: register, override and exclude capabilities; look them up by name;
//! find which capability provides a context type.

use std::collections::HashMap;
use std::sync::Arc;

use crate::capability::{Capability, DynCapability};

/// A registry operation that cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A second capability with an existing name.
    #[error("a capability named '{0}' is already registered; use override_capability to replace it")]
    Duplicate(String),
    /// An override or exclusion of a name that is not registered.
    #[error("no capability named '{name}' is registered (registered: {})", registered.join(", "))]
    NotRegistered {
        /// The name asked for.
        name: String,
        /// What is registered.
        registered: Vec<String>,
    },
    /// A name plans could not use.
    #[error("capability name '{0}' is invalid: use letters, digits and underscores, starting with a letter")]
    InvalidName(String),
}

/// The set of capabilities of an application, in registration order.
#[derive(Clone, Default)]
pub struct Registry {
    capabilities: Vec<Arc<dyn DynCapability>>,
    index: HashMap<String, usize>,
    /// Context type → positions of the capabilities that provide it, in registration order.
    providers: HashMap<String, Vec<usize>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic()) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a capability; refuses a name that is taken.
    pub fn register(&mut self, capability: impl Capability) -> Result<(), RegistryError> {
        self.register_arc(Arc::new(capability))
    }

    /// Adds a shared capability; refuses a name that is taken.
    pub fn register_arc(&mut self, capability: Arc<dyn DynCapability>) -> Result<(), RegistryError> {
        let name = capability.spec().name.clone();
        if !valid_name(&name) {
            return Err(RegistryError::InvalidName(name));
        }
        if self.index.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.index.insert(name, self.capabilities.len());
        self.capabilities.push(capability);
        self.reindex_providers();
        Ok(())
    }

    fn reindex_providers(&mut self) {
        self.providers.clear();
        for (position, capability) in self.capabilities.iter().enumerate() {
            for provided in &capability.spec().provides {
                let positions = self.providers.entry(provided.clone()).or_default();
                if !positions.contains(&position) {
                    positions.push(position);
                }
            }
        }
    }

    /// Replaces the capability with the same name, keeping its position.
    pub fn override_capability(&mut self, capability: impl Capability) -> Result<(), RegistryError> {
        let name = capability.spec().name.clone();
        let position = *self.index.get(&name).ok_or_else(|| self.not_registered(&name))?;
        self.capabilities[position] = Arc::new(capability);
        self.reindex_providers();
        Ok(())
    }

    /// Removes a capability.
    pub fn exclude(&mut self, name: &str) -> Result<(), RegistryError> {
        let position = self.index.remove(name).ok_or_else(|| self.not_registered(name))?;
        self.capabilities.remove(position);
        for index in self.index.values_mut() {
            if *index > position {
                *index -= 1;
            }
        }
        self.reindex_providers();
        Ok(())
    }

    fn not_registered(&self, name: &str) -> RegistryError {
        RegistryError::NotRegistered { name: name.into(), registered: self.names().map(str::to_owned).collect() }
    }

    /// The capability named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn DynCapability>> {
        self.index.get(name).map(|&position| &self.capabilities[position])
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every capability in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn DynCapability>> {
        self.capabilities.iter()
    }

    /// Every name in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.capabilities.iter().map(|capability| capability.spec().name.as_str())
    }

    /// Number of capabilities.
    pub fn len(&self) -> usize {
        self.capabilities.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.capabilities.is_empty()
    }

    /// Names of always-active capabilities.
    pub fn always_active_names(&self) -> Vec<&str> {
        self.iter().filter(|capability| capability.spec().always_active).map(|capability| capability.spec().name.as_str()).collect()
    }

    /// Capabilities that provide `context_type`.
    pub fn providers_of(&self, context_type: &str) -> Vec<&str> {
        self.providers
            .get(context_type)
            .map_or_else(Vec::new, |positions| positions.iter().map(|&position| self.capabilities[position].spec().name.as_str()).collect())
    }

    /// `• name: description` lines.
    pub fn overview(&self) -> String {
        self.iter()
            .map(|capability| format!("• {}: {}", capability.spec().name, capability.spec().description))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Required context types no registered capability provides, as `(capability, type)`.
    pub fn unprovided_requirements(&self) -> Vec<(String, String)> {
        let mut missing = Vec::new();
        for capability in self.iter() {
            for requirement in &capability.spec().requires {
                if self.providers_of(&requirement.context_type).is_empty() {
                    missing.push((capability.spec().name.clone(), requirement.context_type.clone()));
                }
            }
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::{CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec};
    use crate::context::Requirement;
    use crate::state::AgentStateUpdate;

    struct Fake(CapabilitySpec);

    impl Capability for Fake {
        fn spec(&self) -> &CapabilitySpec {
            &self.0
        }
        async fn execute(&self, _input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
            Ok(CapabilityOutcome::Done(AgentStateUpdate::default()))
        }
    }

    fn fake(name: &str, provides: &[&str], requires: &[&str]) -> Fake {
        Fake(CapabilitySpec {
            provides: provides.iter().map(|s| s.to_string()).collect(),
            requires: requires.iter().map(|s| Requirement::any(*s)).collect(),
            always_active: name == "respond",
            ..CapabilitySpec::new(name, format!("{name} things"))
        })
    }

    #[test]
    fn register_override_exclude_and_lookup() {
        let mut registry = Registry::new();
        registry.register(fake("respond", &["FINAL_RESPONSE"], &[])).expect("registers");
        registry.register(fake("channel_finding", &["CHANNEL_ADDRESSES"], &[])).expect("registers");
        registry.register(fake("channel_write", &["CHANNEL_WRITE_RESULTS"], &["CHANNEL_ADDRESSES"])).expect("registers");
        assert_eq!(registry.register(fake("respond", &[], &[])), Err(RegistryError::Duplicate("respond".into())));
        assert!(matches!(registry.register(fake("9bad", &[], &[])), Err(RegistryError::InvalidName(_))));

        assert_eq!(registry.providers_of("CHANNEL_ADDRESSES"), ["channel_finding"]);
        assert_eq!(registry.always_active_names(), ["respond"]);
        assert!(registry.unprovided_requirements().is_empty());

        registry.override_capability(fake("channel_finding", &["CHANNEL_ADDRESSES", "EXTRA"], &[])).expect("overrides");
        assert_eq!(registry.names().collect::<Vec<_>>(), ["respond", "channel_finding", "channel_write"]);
        assert_eq!(registry.providers_of("EXTRA"), ["channel_finding"]);

        registry.exclude("channel_finding").expect("excludes");
        assert_eq!(registry.names().collect::<Vec<_>>(), ["respond", "channel_write"]);
        assert!(registry.get("channel_write").is_some());
        assert_eq!(registry.unprovided_requirements(), [("channel_write".to_string(), "CHANNEL_ADDRESSES".to_string())]);
        assert!(matches!(registry.exclude("channel_finding"), Err(RegistryError::NotRegistered { .. })));
        assert_eq!(registry.overview(), "• respond: respond things\n• channel_write: channel_write things");
    }
}

//! The capability catalog: the specs of every registered capability, which the classifier,
//! orchestrator and respond read (guides, provides/requires, the capabilities overview).

use peregrine_core::{CapabilitySpec, Registry};

/// The specs of the registered capabilities, in registration order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    specs: Vec<CapabilitySpec>,
}

impl Catalog {
    /// A catalog of these specs.
    pub fn new(specs: Vec<CapabilitySpec>) -> Self {
        Self { specs }
    }

    /// The catalog of a registry.
    pub fn from_registry(registry: &Registry) -> Self {
        Self::new(registry.iter().map(|capability| capability.spec().clone()).collect())
    }

    /// Every spec.
    pub fn specs(&self) -> &[CapabilitySpec] {
        &self.specs
    }

    /// One capability's spec.
    pub fn get(&self, name: &str) -> Option<&CapabilitySpec> {
        self.specs.iter().find(|spec| spec.name == name)
    }

    /// Whether a capability of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().map(|spec| spec.name.as_str())
    }

    /// Capabilities that provide `context_type`.
    pub fn providers_of(&self, context_type: &str) -> impl Iterator<Item = &CapabilitySpec> {
        self.specs.iter().filter(move |spec| spec.provides.iter().any(|provided| provided == context_type))
    }

    /// `- name: description` per capability, for prompts.
    pub fn overview(&self) -> String {
        self.specs.iter().map(|spec| format!("- {}: {}", spec.name, spec.description)).collect::<Vec<_>>().join("\n")
    }
}

//! `channel_read`: the channels of the step's `CHANNEL_ADDRESSES` inputs — or, when the plan
//! gives none, the channels the task names, read by the `channel_finder` model — read through
//! the connector into `CHANNEL_VALUES`.

use std::collections::BTreeMap;
use std::sync::Arc;

use peregrine_agent::Services;
use peregrine_control::{ControlError, SharedControlSystem};
use peregrine_core::events::StatusLevel;
use peregrine_core::{AgentEvent, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ErrorClassification};
use peregrine_llm::{CallOptions, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    CHANNEL_READ_CAPABILITY, CHANNEL_VALUES, ChannelPrompts, ChannelReading, ChannelValues, DefaultChannelPrompts, MAX_CHANNELS_PER_STEP,
    addresses_from_inputs, control_error,
};

/// The `channel_finder` model's answer when the plan gives no addresses: the channels the task
/// names, exactly as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChannelAddressExtraction {
    /// The channel addresses (EPICS process variable names) the task asks to read; empty when
    /// it names none.
    pub channels: Vec<String>,
}

/// The `channel_read` capability.
pub struct ChannelReadCapability {
    services: Services,
    connector: SharedControlSystem,
    prompts: Arc<dyn ChannelPrompts>,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for ChannelReadCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelReadCapability").field("connector", &self.connector.name()).finish_non_exhaustive()
    }
}

fn read_spec(prompts: &dyn ChannelPrompts) -> CapabilitySpec {
    CapabilitySpec {
        provides: vec![CHANNEL_VALUES.into()],
        classifier_guide: Some(prompts.read_classifier_guide()),
        orchestrator_guide: Some(prompts.read_orchestrator_guide()),
        ..CapabilitySpec::new(CHANNEL_READ_CAPABILITY, "Read the current values of control-system channels (process variables)")
    }
}

impl ChannelReadCapability {
    /// The capability over `connector`, with the default prompts.
    pub fn new(services: Services, connector: SharedControlSystem) -> Self {
        let prompts: Arc<dyn ChannelPrompts> = Arc::new(DefaultChannelPrompts);
        Self { services, connector, spec: read_spec(prompts.as_ref()), prompts }
    }

    /// Replaces the prompts (and the guides in the spec).
    pub fn with_prompts(mut self, prompts: Arc<dyn ChannelPrompts>) -> Self {
        self.spec = read_spec(prompts.as_ref());
        self.prompts = prompts;
        self
    }

    async fn addresses(&self, input: &CapabilityInput<'_>) -> Result<Vec<String>, CapabilityError> {
        let given = addresses_from_inputs(input)?;
        if !given.is_empty() {
            return Ok(given);
        }
        let options = CallOptions { events: Some(input.events), component: Some(CHANNEL_READ_CAPABILITY) };
        let found: ChannelAddressExtraction = self
            .services
            .llm
            .structured(roles::CHANNEL_FINDER, self.prompts.address_messages(input.task_objective()), options)
            .await
            .map_err(CapabilityError::from)?;
        let mut addresses: Vec<String> = Vec::new();
        for address in found.channels.iter().map(|address| address.trim()).filter(|address| !address.is_empty()) {
            if !addresses.iter().any(|known| known == address) {
                addresses.push(address.to_owned());
            }
        }
        Ok(addresses)
    }
}

impl Capability for ChannelReadCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let addresses = self.addresses(&input).await?;
        if addresses.is_empty() {
            return Err(CapabilityError::new("no channel to read: the step names no channel address").classified(
                ErrorClassification::replanning(
                    "No channel address was found for the read; the plan must name the channels (or find them first)",
                ),
            ));
        }
        if addresses.len() > MAX_CHANNELS_PER_STEP {
            return Err(CapabilityError::new(format!("{} channels in one read step", addresses.len())).classified(
                ErrorClassification::replanning(format!(
                    "One read step names {} channels; read at most {MAX_CHANNELS_PER_STEP} per step",
                    addresses.len()
                )),
            ));
        }
        let readings = self.connector.read_many_boxed(&addresses).await;
        let mut values = BTreeMap::new();
        let mut failures: Vec<ControlError> = Vec::new();
        for (address, reading) in addresses.iter().zip(readings) {
            match reading {
                Ok(reading) => {
                    values.insert(address.clone(), ChannelReading::from(&reading));
                }
                Err(error) => failures.push(error),
            }
        }
        if !failures.is_empty() {
            // An unknown channel is the plan's mistake (re-plan); otherwise the first failure
            // decides (a timeout or a lost connection retries).
            let decisive = failures.iter().position(|error| matches!(error, ControlError::UnknownChannel { .. })).unwrap_or(0);
            let others: Vec<String> = failures.iter().map(ToString::to_string).collect();
            let error = failures.swap_remove(decisive);
            let mut failed = control_error(error);
            if others.len() > 1 {
                let classification = failed.default_classification();
                failed = failed.classified(classification.with_metadata("all_failures", others.join("; ")));
            }
            return Err(failed);
        }
        let count = values.len();
        input.events.emit(AgentEvent::status(
            CHANNEL_READ_CAPABILITY,
            StatusLevel::Success,
            format!("Read {count} channel{}", if count == 1 { "" } else { "s" }),
        ));
        Ok(CapabilityOutcome::Done(input.store_output(&ChannelValues { channel_values: values })?))
    }
}

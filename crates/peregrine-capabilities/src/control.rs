//! The control-system capabilities (reference §5.4): `channel_read` reads channels into
//! `CHANNEL_VALUES`; `channel_write` turns a task into typed write operations and sends them
//! through the write gates of `peregrine-control` in order — the master switch, the channel
//! limits, a digest-bound approval showing every channel's current value, new value and limits,
//! the write, its verification. A gate's stop ends the turn with a report (CRITICAL), never a
//! retry or a re-plan; an approved operation is written exactly as approved, once, even when
//! the answer is delivered again after a crash.

mod prompts;
mod read;
mod write;

use std::collections::BTreeMap;

use peregrine_control::{ChannelValue, ControlError, Reading, VerificationLevel};
use peregrine_core::{AgentEvent, CapabilityError, CapabilityInput, ChannelWriteStage, ContextType, ErrorClassification, EventKind};
use serde::{Deserialize, Serialize};

pub use prompts::{
    ChannelPrompts, DefaultChannelPrompts, WriteParsingRequest, default_address_messages, default_read_classifier_guide,
    default_read_orchestrator_guide, default_write_classifier_guide, default_write_messages, default_write_orchestrator_guide,
};
pub use read::{ChannelAddressExtraction, ChannelReadCapability};
pub use write::{ChannelWriteCapability, WriteOperation, WriteOperationsOutput, WriteValue};

/// The `channel_read` capability's name.
pub const CHANNEL_READ_CAPABILITY: &str = "channel_read";
/// The `channel_write` capability's name.
pub const CHANNEL_WRITE_CAPABILITY: &str = "channel_write";
/// Channel addresses found for a task (`channel_finding` provides them).
pub const CHANNEL_ADDRESSES: &str = "CHANNEL_ADDRESSES";
/// Channel readings.
pub const CHANNEL_VALUES: &str = "CHANNEL_VALUES";
/// What a write operation did.
pub const CHANNEL_WRITE_RESULTS: &str = "CHANNEL_WRITE_RESULTS";
/// The approval type of a control-system write.
pub const CHANNEL_WRITE_APPROVAL: &str = "channel_write";
/// The most channels one step reads or writes; more is a plan to split, not one step.
pub const MAX_CHANNELS_PER_STEP: usize = 100;

/// `CHANNEL_ADDRESSES`: the channels a task is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelAddresses {
    /// The addresses (EPICS: PV names).
    pub channels: Vec<String>,
    /// The request they were found for.
    #[serde(default)]
    pub original_query: Option<String>,
}

impl ContextType for ChannelAddresses {
    const CONTEXT_TYPE: &'static str = CHANNEL_ADDRESSES;
    const CONTEXT_CATEGORY: &'static str = "CONTROL_SYSTEM";
}

/// One channel's reading in `CHANNEL_VALUES`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelReading {
    /// The value as a person reads it (an enum's label with its index).
    pub value: String,
    /// The typed value.
    pub typed_value: ChannelValue,
    /// Engineering units.
    #[serde(default)]
    pub units: Option<String>,
    /// When the control system took the value (RFC 3339, UTC).
    pub timestamp: String,
    /// `no_alarm`, `minor`, `major` or `invalid`.
    pub alarm_severity: peregrine_control::AlarmSeverity,
}

impl From<&Reading> for ChannelReading {
    fn from(reading: &Reading) -> Self {
        Self {
            value: reading.value.display(),
            typed_value: reading.value.clone(),
            units: reading.units.clone(),
            timestamp: reading.timestamp.to_rfc3339(),
            alarm_severity: reading.severity,
        }
    }
}

/// `CHANNEL_VALUES`: readings by address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelValues {
    /// Each channel's reading.
    pub channel_values: BTreeMap<String, ChannelReading>,
}

impl ContextType for ChannelValues {
    const CONTEXT_TYPE: &'static str = CHANNEL_VALUES;
    const CONTEXT_CATEGORY: &'static str = "CONTROL_SYSTEM";
}

/// One write of an operation (Osprey's `ChannelWriteResult`, its verification flattened so
/// the response sees it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelWriteResult {
    /// The channel.
    pub channel_address: String,
    /// The value written.
    pub value_written: String,
    /// The value before the write.
    #[serde(default)]
    pub previous_value: Option<String>,
    /// Whether it was written and its verification held (or none was asked for).
    pub success: bool,
    /// Not sent again: a redelivered approval found it already written.
    #[serde(default)]
    pub already_written: bool,
    /// `none`, `callback` or `readback`.
    pub verification_level: VerificationLevel,
    /// Whether the verification was done and held.
    pub verified: bool,
    /// The value read back.
    #[serde(default)]
    pub readback_value: Option<String>,
    /// The readback tolerance used, in the channel's units.
    #[serde(default)]
    pub tolerance_used: Option<f64>,
    /// What the verification found.
    pub verification_notes: String,
}

/// `CHANNEL_WRITE_RESULTS`: what an operation did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelWriteResults {
    /// Each write, in order.
    pub results: Vec<ChannelWriteResult>,
    /// How many writes the operation had.
    pub total_writes: usize,
    /// How many were written and verified.
    pub successful_count: usize,
    /// How many failed.
    pub failed_count: usize,
    /// `written`, or `cancelled by the user` when the approval was rejected (nothing written).
    pub operation_result: String,
}

impl ContextType for ChannelWriteResults {
    const CONTEXT_TYPE: &'static str = CHANNEL_WRITE_RESULTS;
    const CONTEXT_CATEGORY: &'static str = "CONTROL_SYSTEM";
}

/// The addresses of the step's `CHANNEL_ADDRESSES` inputs, in order, each once.
pub(crate) fn addresses_from_inputs(input: &CapabilityInput<'_>) -> Result<Vec<String>, CapabilityError> {
    let mut addresses: Vec<String> = Vec::new();
    for reference in input.step.inputs.iter().filter(|reference| reference.context_type == CHANNEL_ADDRESSES) {
        let Some(entry) = input.state.capability_context_data.entry(&reference.context_type, &reference.key) else {
            return Err(CapabilityError::new(format!("the step's input {CHANNEL_ADDRESSES}:{} is not stored", reference.key)).classified(
                ErrorClassification::replanning(format!(
                    "The plan names channel addresses '{}' that no earlier step produced",
                    reference.key
                )),
            ));
        };
        let found: ChannelAddresses = serde_json::from_value(entry.data.clone()).map_err(|error| {
            CapabilityError::new(format!("the stored {CHANNEL_ADDRESSES}:{} is not a list of channels: {error}", reference.key))
                .classified(ErrorClassification::critical("The stored channel addresses cannot be read"))
        })?;
        for address in found.channels {
            if !addresses.contains(&address) {
                addresses.push(address);
            }
        }
    }
    Ok(addresses)
}

/// A control error as the capability's error: its own classification, the error kept as the
/// source. A gate's stop says that nothing was written and that it is not retried.
pub(crate) fn control_error(error: ControlError) -> CapabilityError {
    let mut classification = error.classification();
    if error.is_block() {
        classification =
            ErrorClassification::critical(format!("{error}. Nothing was written; a stopped write is reported, not retried another way"))
                .with_metadata("technical_details", format!("write gate: {error}"));
    }
    CapabilityError::from_error(error).classified(classification)
}

/// Emits a `channel_write` event.
pub(crate) fn write_event(
    input: &CapabilityInput<'_>,
    stage: ChannelWriteStage,
    address: &str,
    value: String,
    previous: Option<String>,
    detail: impl Into<String>,
) {
    input.events.emit(AgentEvent::new(
        CHANNEL_WRITE_CAPABILITY,
        EventKind::ChannelWrite { stage, channel_address: address.to_owned(), value, previous, detail: detail.into() },
    ));
}

/// Text from the model or the control system made inert for the approval prompt: control and
/// bidirectional-formatting characters removed (a right-to-left override could show "FFO" as
/// "OFF"), zero-width and line-separator characters removed, line breaks flattened, and the
/// Markdown and HTML characters that could draw a table, emphasis, a link, a tag or an entity
/// (`&#x202E;`) escaped — so no channel name, value, unit or objective can fake a
/// row of the table the person approves.
pub fn approval_cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            '\u{200B}'..='\u{200F}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{061C}'
            | '\u{FEFF}' => {}
            c if c.is_control() => {}
            '\\' | '|' | '*' | '_' | '~' | '`' | '<' | '>' | '[' | ']' | '#' | '&' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;

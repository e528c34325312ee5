//! The `time_range_parsing` capability (reference §5.3): one `time_parsing` model call turns the
//! step's time expression into a `TIME_RANGE` whose datetimes carry the facility's zone
//! (`system.timezone`): the prompt states the local time, answers in UTC are converted, naive
//! answers are read as local time, and the zone's IANA name travels with the range (the
//! naive/UTC mix-ups of upstream #187/#189 cannot happen).

mod parse;
mod prompts;

use std::sync::Arc;

use chrono::{DateTime, FixedOffset, Utc};
use chrono_tz::Tz;
use peregrine_agent::Services;
use peregrine_core::events::StatusLevel;
use peregrine_core::{AgentEvent, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ContextType};
use peregrine_llm::{CallOptions, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use parse::{TimeRangeError, parse_datetime};
pub use prompts::{
    DefaultTimeRangePrompts, TimeRangePrompts, default_classifier_guide, default_orchestrator_guide, default_parsing_messages,
};

use crate::Clock;

/// The capability's name.
pub const TIME_RANGE_CAPABILITY: &str = "time_range_parsing";
/// The context type it stores.
pub const TIME_RANGE: &str = "TIME_RANGE";

/// The time-parsing model's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TimeRangeOutput {
    /// Start, 'YYYY-MM-DD HH:MM:SS' in the facility's local time (or ISO 8601 with an offset).
    pub start_date: String,
    /// End, 'YYYY-MM-DD HH:MM:SS' in the facility's local time (or ISO 8601 with an offset).
    pub end_date: String,
    /// True if the query contains a time range, false otherwise.
    pub found: bool,
}

/// `TIME_RANGE`: a range in the facility's zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeRangeContext {
    /// Start, serialized as RFC 3339 with the local offset in force at that instant.
    pub start_date: DateTime<FixedOffset>,
    /// End, serialized as RFC 3339 with the local offset in force at that instant (which may
    /// differ from the start's across a daylight-saving change).
    pub end_date: DateTime<FixedOffset>,
    /// The facility's IANA zone, e.g. `America/Los_Angeles`.
    pub timezone_name: String,
}

impl TimeRangeContext {
    /// The range between two instants of one zone.
    pub fn new(start: DateTime<Tz>, end: DateTime<Tz>) -> Self {
        Self { timezone_name: start.timezone().name().to_owned(), start_date: start.fixed_offset(), end_date: end.fixed_offset() }
    }

    /// The zone, if `timezone_name` is a known IANA name.
    pub fn timezone(&self) -> Option<Tz> {
        self.timezone_name.parse().ok()
    }

    /// How long the range is.
    pub fn duration(&self) -> chrono::Duration {
        self.end_date - self.start_date
    }
}

/// `1 day 2 hours`, `45 minutes`, `0 seconds`.
fn human_duration(duration: chrono::Duration) -> String {
    let total = duration.num_seconds().max(0);
    let parts = [(total / 86_400, "day"), (total % 86_400 / 3_600, "hour"), (total % 3_600 / 60, "minute"), (total % 60, "second")];
    let words: Vec<String> = parts
        .iter()
        .filter(|(amount, _)| *amount > 0)
        .map(|(amount, unit)| format!("{amount} {unit}{}", if *amount == 1 { "" } else { "s" }))
        .collect();
    if words.is_empty() { "0 seconds".into() } else { words.join(" ") }
}

impl ContextType for TimeRangeContext {
    const CONTEXT_TYPE: &'static str = TIME_RANGE;
    const CONTEXT_CATEGORY: &'static str = "METADATA";

    fn access_details(&self, key: &str) -> Value {
        json!({
            "start_date": self.start_date.to_rfc3339(),
            "end_date": self.end_date.to_rfc3339(),
            "timezone_name": self.timezone_name,
            "duration": human_duration(self.duration()),
            "access_pattern": format!("context.{TIME_RANGE}.{key}.start_date and context.{TIME_RANGE}.{key}.end_date"),
            "data_structure": "start_date and end_date are timezone-aware datetimes (RFC 3339 with the local UTC offset); timezone_name is the IANA zone",
        })
    }

    fn summary(&self) -> Value {
        json!({
            "type": "Time Range",
            "start_date": self.start_date.to_rfc3339(),
            "end_date": self.end_date.to_rfc3339(),
            // The field's own name, which respond looks for to add its timezone note.
            "timezone_name": self.timezone_name,
            "duration": human_duration(self.duration()),
        })
    }
}

/// The `time_range_parsing` capability.
pub struct TimeRangeCapability {
    services: Services,
    prompts: Arc<dyn TimeRangePrompts>,
    clock: Clock,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for TimeRangeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimeRangeCapability").field("timezone", &self.services.settings.timezone).finish_non_exhaustive()
    }
}

fn time_range_spec(prompts: &dyn TimeRangePrompts) -> CapabilitySpec {
    CapabilitySpec {
        provides: vec![TIME_RANGE.into()],
        classifier_guide: Some(prompts.classifier_guide()),
        orchestrator_guide: Some(prompts.orchestrator_guide()),
        ..CapabilitySpec::new(TIME_RANGE_CAPABILITY, "Parse time references into absolute, timezone-aware datetime ranges")
    }
}

impl TimeRangeCapability {
    /// The capability with the default prompts and the system clock.
    pub fn new(services: Services) -> Self {
        let prompts: Arc<dyn TimeRangePrompts> = Arc::new(DefaultTimeRangePrompts);
        let spec = time_range_spec(prompts.as_ref());
        Self { services, prompts, clock: Arc::new(Utc::now), spec }
    }

    /// Replaces the prompts (and the guides in the spec).
    pub fn with_prompts(mut self, prompts: Arc<dyn TimeRangePrompts>) -> Self {
        self.spec = time_range_spec(prompts.as_ref());
        self.prompts = prompts;
        self
    }

    /// Replaces the clock "now" is read from (tests).
    pub fn with_clock(mut self, clock: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

impl Capability for TimeRangeCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let now = (self.clock)().with_timezone(&self.services.settings.timezone);
        let query = input.task_objective();
        let options = CallOptions { events: Some(input.events), component: Some(TIME_RANGE_CAPABILITY) };
        let output: TimeRangeOutput = self
            .services
            .llm
            .structured(roles::TIME_PARSING, self.prompts.parsing_messages(query, &now), options)
            .await
            .map_err(CapabilityError::from)?;
        let context = parse::validate(&output, query, &now).map_err(|error| {
            let classification = error.classification();
            CapabilityError::from_error(error).classified(classification)
        })?;
        input.events.emit(AgentEvent::status(
            TIME_RANGE_CAPABILITY,
            StatusLevel::Success,
            format!("Time range: {} to {} ({})", context.start_date, context.end_date, context.timezone_name),
        ));
        Ok(CapabilityOutcome::Done(input.store_output(&context)?))
    }
}

#[cfg(test)]
mod tests;

//! `current_weather`: reads the location from the step objective with one structured LLM call,
//! asks the mock weather service, and stores a `CURRENT_WEATHER` context under the step's key.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use peregrine_agent::Services;
use peregrine_core::events::StatusLevel;
use peregrine_core::{
    AgentEvent, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ErrorClassification, RetryPolicy,
};
use peregrine_llm::{CallOptions, ChatMessage, LlmError, roles};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::context::CurrentWeatherContext;
use crate::guides::{self, NAME};
use crate::mock_service::MockWeatherService;

/// The model role of the location extraction: a one-field extraction, so the small, fast
/// model that also answers the classifier's yes/no questions (falls back to `models.default`).
pub const LOCATION_EXTRACTION_ROLE: &str = roles::CLASSIFIER;

/// The location used when the request names none (upstream: "What's the weather like?" uses
/// "local").
pub const DEFAULT_LOCATION: &str = "local";

/// The longest location name accepted from the model; anything longer is prose, not a place.
pub const MAX_LOCATION_CHARS: usize = 100;

/// Answers that mean "no location was named"; they become [`DEFAULT_LOCATION`].
const NO_LOCATION_ANSWERS: [&str; 8] = ["", "local", "unknown", "none", "null", "n/a", "not specified", "unspecified"];

/// The structured answer of the location extraction call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocationExtraction {
    /// The place the weather request is about, as the user named it (a city, region or
    /// landmark), or "local" when the request names no location.
    pub location: String,
}

/// Why `current_weather` failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WeatherError {
    /// The location extraction call failed (transport, configuration or unusable output).
    #[error("could not extract the location from the request: {0}")]
    LocationExtraction(#[source] LlmError),
    /// The model answered something that is not a location name.
    #[error("the model's location answer cannot be used ({reason}): {location:?}")]
    InvalidLocation {
        /// What the model answered (shortened).
        location: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl WeatherError {
    /// What the router should do: LLM faults as the LLM layer classifies them (RETRIABLE
    /// for transient faults and invalid output, CRITICAL for configuration); an unusable
    /// location answer is invalid model output, so RETRIABLE.
    pub fn classification(&self) -> ErrorClassification {
        match self {
            Self::LocationExtraction(error) => error.classification(),
            Self::InvalidLocation { reason, .. } => {
                ErrorClassification::retriable("The location could not be read from the request; retrying.")
                    .with_metadata("technical_details", self.to_string())
                    .with_metadata("validation_problem", *reason)
            }
        }
    }
}

type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The `current_weather` capability.
#[derive(Clone)]
pub struct CurrentWeatherCapability {
    spec: CapabilitySpec,
    services: Services,
    weather: MockWeatherService,
    clock: Clock,
}

impl std::fmt::Debug for CurrentWeatherCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentWeatherCapability").field("spec", &self.spec.name).finish_non_exhaustive()
    }
}

impl CurrentWeatherCapability {
    /// The capability on the agent's services, reading the clock for timestamps.
    pub fn new(services: Services) -> Self {
        Self { spec: guides::spec(), services, weather: MockWeatherService::new(), clock: Arc::new(Utc::now) }
    }

    /// Stamps readings with `clock` instead of the system clock (tests, reproducible benchmarks).
    pub fn with_clock(mut self, clock: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The one LLM call: the location named in the step objective (or the task).
    async fn extract_location(&self, input: &CapabilityInput<'_>) -> Result<String, WeatherError> {
        let prompt = location_prompt(input.task_objective(), input.state.task.current_task.as_deref());
        let options = CallOptions { events: Some(input.events), component: Some(NAME) };
        let answer: LocationExtraction = self
            .services
            .llm
            .structured(LOCATION_EXTRACTION_ROLE, vec![ChatMessage::user(prompt)], options)
            .await
            .map_err(WeatherError::LocationExtraction)?;
        validate_location(&answer.location)
    }
}

/// The location extraction prompt: the step objective, and the user's task when it differs
/// (a generic step objective such as "the specified location" then still finds the place).
pub fn location_prompt(objective: &str, task: Option<&str>) -> String {
    let mut prompt = String::from(
        "You extract the location a weather request is about.\n\n\
         Rules:\n\
         - Answer with the place name only, as the user wrote it: a city, region or landmark (e.g. \"Prague\", \"New York\").\n\
         - If the request names several places, answer the first one; every location gets its own step.\n\
         - If the request names no location, answer \"local\".\n\
         - Do not guess a place the request does not name.\n\n",
    );
    prompt.push_str(&format!("Request: {}\n", objective.trim()));
    if let Some(task) = task.map(str::trim).filter(|task| !task.is_empty() && *task != objective.trim()) {
        prompt.push_str(&format!("The user's overall task (use it only if the request names no location): {task}\n"));
    }
    prompt
}

/// Checks the model's answer: blanks and quotes trimmed; "no location" answers become
/// [`DEFAULT_LOCATION`]; prose, line breaks and control characters are refused.
pub fn validate_location(answer: &str) -> Result<String, WeatherError> {
    let location = answer.trim().trim_matches(|c| c == '"' || c == '\'').trim();
    let invalid = |reason| WeatherError::InvalidLocation { location: location.chars().take(MAX_LOCATION_CHARS).collect(), reason };
    if NO_LOCATION_ANSWERS.contains(&location.to_lowercase().as_str()) {
        return Ok(DEFAULT_LOCATION.to_owned());
    }
    if location.chars().any(char::is_control) {
        return Err(invalid("it contains line breaks or control characters; answer with the place name only"));
    }
    if location.chars().count() > MAX_LOCATION_CHARS {
        return Err(invalid("it is longer than 100 characters; answer with the place name only"));
    }
    Ok(location.to_owned())
}

impl Capability for CurrentWeatherCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    /// Our own failures by their [`WeatherError::classification`]; anything else (a store
    /// failure) is upstream's CRITICAL "Weather service error".
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        match error.downcast_ref::<WeatherError>() {
            Some(weather_error) => weather_error.classification(),
            None => error.classification().cloned().unwrap_or_else(|| {
                ErrorClassification::critical(format!("Weather service error: {}", error.message()))
                    .with_metadata("technical_details", error.message().to_owned())
            }),
        }
    }

    /// Upstream's policy: 3 attempts, 0.5 s, ×1.5.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::new(3, 0.5, 1.5)
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        input.events.emit(AgentEvent::status(NAME, StatusLevel::Info, "Extracting location from query..."));
        let location = self.extract_location(&input).await.map_err(CapabilityError::from_error)?;
        input.events.emit(AgentEvent::status(NAME, StatusLevel::Info, format!("Getting weather for {location}...")));
        let now = (self.clock)().with_timezone(&self.services.settings.timezone).fixed_offset();
        let context = CurrentWeatherContext::from(self.weather.get_current_weather(&location, now));
        let update = input.store_output(&context)?;
        input.events.emit(AgentEvent::status(
            NAME,
            StatusLevel::Success,
            format!("Weather retrieved: {} - {:.1}°C", context.location, context.temperature),
        ));
        Ok(CapabilityOutcome::Done(update))
    }
}

#[cfg(test)]
mod tests;

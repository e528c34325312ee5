//! `CURRENT_WEATHER`: the context `current_weather` stores and respond reads (upstream's
//! `CurrentWeatherContext`).

use chrono::{DateTime, FixedOffset};
use peregrine_core::ContextType;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::mock_service::CurrentWeatherReading;

/// The current weather at one location.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentWeatherContext {
    /// Location name.
    pub location: String,
    /// Temperature in Celsius.
    pub temperature: f64,
    /// Weather conditions description.
    pub conditions: String,
    /// Timestamp of the weather data, in the facility's timezone.
    pub timestamp: DateTime<FixedOffset>,
}

impl From<CurrentWeatherReading> for CurrentWeatherContext {
    fn from(reading: CurrentWeatherReading) -> Self {
        Self { location: reading.location, temperature: reading.temperature, conditions: reading.conditions, timestamp: reading.timestamp }
    }
}

impl ContextType for CurrentWeatherContext {
    const CONTEXT_TYPE: &'static str = "CURRENT_WEATHER";
    // Upstream's category for live readings (not one of the framework's three).
    const CONTEXT_CATEGORY: &'static str = "LIVE_DATA";

    /// How generated code reaches the reading (upstream's `get_access_details`).
    fn access_details(&self, key: &str) -> Value {
        let base = format!("context.{}.{key}", Self::CONTEXT_TYPE);
        json!({
            "location": self.location,
            "current_temp": format!("{:.1}°C", self.temperature),
            "conditions": self.conditions,
            "access_pattern": format!("{base}.temperature, {base}.conditions"),
            "example_usage": format!("The temperature in {} is {{{base}.temperature}}°C with {{{base}.conditions}} conditions", self.location),
            "available_fields": ["location", "temperature", "conditions", "timestamp"],
        })
    }

    /// `{"summary": "Weather in <location> on <YYYY-MM-DD>: <t>°C, <conditions>"}` (upstream's
    /// `get_summary`); this is what respond sees.
    fn summary(&self) -> Value {
        json!({
            "summary": format!(
                "Weather in {} on {}: {:.1}°C, {}",
                self.location,
                self.timestamp.format("%Y-%m-%d"),
                self.temperature,
                self.conditions
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use peregrine_core::ContextStore;

    use super::*;

    fn prague() -> CurrentWeatherContext {
        let at = FixedOffset::east_opt(3600).and_then(|tz| tz.with_ymd_and_hms(2025, 1, 15, 23, 30, 0).single()).expect("valid time");
        CurrentWeatherContext { location: "Prague".into(), temperature: 14.0, conditions: "Rainy".into(), timestamp: at }
    }

    #[test]
    fn summary_matches_upstream() {
        assert_eq!(prague().summary(), json!({"summary": "Weather in Prague on 2025-01-15: 14.0°C, Rainy"}));
    }

    #[test]
    fn access_details_name_the_fields() {
        let details = prague().access_details("prague_weather");
        assert_eq!(
            details["access_pattern"],
            "context.CURRENT_WEATHER.prague_weather.temperature, context.CURRENT_WEATHER.prague_weather.conditions"
        );
        assert_eq!(details["current_temp"], "14.0°C");
        assert_eq!(
            details["example_usage"],
            "The temperature in Prague is {context.CURRENT_WEATHER.prague_weather.temperature}°C with {context.CURRENT_WEATHER.prague_weather.conditions} conditions"
        );
    }

    #[test]
    fn round_trips_through_the_store_with_its_summary() {
        let mut store = ContextStore::default();
        store.set("w", &prague(), Some("Get the weather in Prague".into())).expect("stores");
        assert_eq!(store.get::<CurrentWeatherContext>("w").expect("decodes"), Some(prague()));
        let entry = store.entry("CURRENT_WEATHER", "w").expect("stored");
        assert_eq!(entry.summary(), prague().summary());
        assert_eq!(entry.data["timestamp"], "2025-01-15T23:30:00+01:00");
    }
}

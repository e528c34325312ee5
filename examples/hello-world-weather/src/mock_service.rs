//! The mock weather service behind `current_weather`: a self-contained stand-in for a real
//! weather API (no network, no keys), deterministic per location so tests and benchmarks are
//! reproducible.
//!
//! Upstream's `SimpleWeatherAPI` draws a random temperature and condition on every call. Ours
//! draws them from a generator seeded by the (normalised) location name instead, so the same
//! location always gives the same reading; only the timestamp, which the caller passes in,
//! changes. The value ranges are upstream's:
//!
//! - the three cities of the tutorial (San Francisco, New York, Prague) keep their city
//!   profiles — base temperature −5…+8 °C and a city-specific list of conditions;
//! - **any other location is accepted** (as in the later upstream mock, which takes whatever
//!   location the LLM extracted, "local" included) and gets a generic profile — 0…35 °C and any
//!   of eleven conditions — under the name it was asked for. The earlier upstream mock
//!   answered San Francisco's weather for unknown places, which silently reports the wrong
//!   city; we do not reproduce that.

use chrono::{DateTime, FixedOffset};
use serde::{Deserialize, Serialize};

/// The weather profile of a city the mock knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CityProfile {
    /// The canonical name readings carry, e.g. `New York`.
    pub name: &'static str,
    /// Lower-case names that also mean this city (the canonical name included).
    pub aliases: &'static [&'static str],
    /// Average temperature in °C; readings vary by −5…+8 °C around it.
    pub base_temperature: i32,
    /// The conditions a reading picks from.
    pub conditions: &'static [&'static str],
}

/// The cities with their own profiles (upstream's `CITY_DATA`, with the aliases upstream's
/// keyword matcher accepted: "nyc", "praha").
pub const KNOWN_CITIES: [CityProfile; 3] = [
    CityProfile {
        name: "San Francisco",
        aliases: &["san francisco", "sf", "san francisco, ca"],
        base_temperature: 18,
        conditions: &["Sunny", "Foggy", "Partly Cloudy"],
    },
    CityProfile {
        name: "New York",
        aliases: &["new york", "nyc", "new york city", "new york, ny"],
        base_temperature: 15,
        conditions: &["Sunny", "Rainy", "Cloudy", "Snow"],
    },
    CityProfile { name: "Prague", aliases: &["prague", "praha"], base_temperature: 12, conditions: &["Rainy", "Cloudy", "Partly Cloudy"] },
];

/// The conditions of the generic profile used for every other location (upstream's
/// `ALL_CONDITIONS`).
pub const ALL_CONDITIONS: [&str; 11] =
    ["Sunny", "Partly Cloudy", "Cloudy", "Overcast", "Foggy", "Rainy", "Drizzle", "Thunderstorms", "Snow", "Windy", "Clear"];

/// Temperature range of the generic profile, in °C (inclusive).
pub const GENERIC_TEMPERATURE_RANGE: (i32, i32) = (0, 35);

/// Variation around a city's base temperature, in °C (inclusive).
pub const CITY_VARIATION: (i32, i32) = (-5, 8);

/// One reading of the mock service (upstream's `CurrentWeatherReading`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentWeatherReading {
    /// The canonical city name, or the location as asked for when the mock does not know it.
    pub location: String,
    /// Temperature in °C (whole degrees, as upstream).
    pub temperature: f64,
    /// A description such as `Foggy`.
    pub conditions: String,
    /// When the reading was taken.
    pub timestamp: DateTime<FixedOffset>,
}

/// The mock weather service. Stateless; cloning is free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockWeatherService;

impl MockWeatherService {
    /// The service.
    pub fn new() -> Self {
        Self
    }

    /// The profile of `location` when it names a known city (case, surrounding blanks and
    /// repeated spaces do not matter; "NYC" and "Praha" are aliases).
    pub fn known_city(&self, location: &str) -> Option<&'static CityProfile> {
        let key = normalise(location);
        KNOWN_CITIES.iter().find(|city| city.aliases.contains(&key.as_str()))
    }

    /// The current weather at `location`, stamped `at`. Deterministic in the location: the same
    /// place always gives the same temperature and conditions.
    pub fn get_current_weather(&self, location: &str, at: DateTime<FixedOffset>) -> CurrentWeatherReading {
        let key = normalise(location);
        let mut draws = SplitMix64::new(fnv1a(&key));
        let (name, temperature, conditions) = match self.known_city(location) {
            Some(city) => (
                city.name.to_owned(),
                city.base_temperature + draws.in_range(CITY_VARIATION.0, CITY_VARIATION.1),
                draws.pick(city.conditions),
            ),
            None => (
                location.trim().to_owned(),
                draws.in_range(GENERIC_TEMPERATURE_RANGE.0, GENERIC_TEMPERATURE_RANGE.1),
                draws.pick(&ALL_CONDITIONS),
            ),
        };
        CurrentWeatherReading { location: name, temperature: f64::from(temperature), conditions: conditions.to_owned(), timestamp: at }
    }
}

/// Lower case, blanks collapsed: the key both lookups and seeds use.
fn normalise(location: &str) -> String {
    location.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// FNV-1a: a hash that, unlike `DefaultHasher`, is the same on every platform and Rust
/// release, so readings never change under a toolchain upgrade.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// A tiny deterministic generator (SplitMix64) for the draws of one reading.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `low..=high`.
    fn in_range(&mut self, low: i32, high: i32) -> i32 {
        let span = u64::from(high.abs_diff(low)) + 1;
        // `span` is at most 2^32, so the remainder fits an i64 and the sum stays in range.
        let offset = i64::try_from(self.next() % span).unwrap_or_default();
        i32::try_from(i64::from(low) + offset).unwrap_or(low)
    }

    /// One element of a non-empty list (the first for an empty one, which the profiles never
    /// are).
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        let len = u64::try_from(items.len()).unwrap_or(u64::MAX).max(1);
        let index = usize::try_from(self.next() % len).unwrap_or_default();
        items.get(index).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at() -> DateTime<FixedOffset> {
        FixedOffset::west_opt(8 * 3600).and_then(|tz| tz.with_ymd_and_hms(2025, 1, 15, 9, 30, 0).single()).expect("valid time")
    }

    #[test]
    fn readings_are_deterministic_per_location() {
        let service = MockWeatherService::new();
        for location in ["Prague", "New York", "San Francisco", "Tokyo", "local"] {
            assert_eq!(service.get_current_weather(location, at()), service.get_current_weather(location, at()), "{location}");
        }
        // Different places are not all the same reading.
        let temperatures: std::collections::BTreeSet<i64> = ["Tokyo", "London", "Paris", "Berlin", "Oslo", "Lima"]
            .iter()
            .map(|l| service.get_current_weather(l, at()).temperature as i64)
            .collect();
        assert!(temperatures.len() > 1, "seeded by name, so places differ: {temperatures:?}");
    }

    #[test]
    fn known_cities_use_their_profile_and_canonical_name() {
        let service = MockWeatherService::new();
        let table = [
            ("Prague", "Prague"),
            ("  praha ", "Prague"),
            ("PRAGUE", "Prague"),
            ("NYC", "New York"),
            ("new   york", "New York"),
            ("New York City", "New York"),
            ("san francisco", "San Francisco"),
            ("SF", "San Francisco"),
        ];
        for (asked, canonical) in table {
            let reading = service.get_current_weather(asked, at());
            assert_eq!(reading.location, canonical, "{asked}");
            let city = service.known_city(asked).expect("known");
            let low = f64::from(city.base_temperature + CITY_VARIATION.0);
            let high = f64::from(city.base_temperature + CITY_VARIATION.1);
            assert!((low..=high).contains(&reading.temperature), "{asked}: {}", reading.temperature);
            assert!(city.conditions.contains(&reading.conditions.as_str()), "{asked}: {}", reading.conditions);
            assert_eq!(reading.timestamp, at());
        }
        // Spelling variants of one city share one seed, so one reading.
        assert_eq!(service.get_current_weather("Prague", at()), service.get_current_weather("  PRAGUE ", at()));
    }

    #[test]
    fn unknown_locations_are_accepted_with_the_generic_profile() {
        let service = MockWeatherService::new();
        for location in ["Tokyo", "London", "local", "Mount Everest base camp", "Zürich"] {
            assert!(service.known_city(location).is_none(), "{location}");
            let reading = service.get_current_weather(&format!("  {location} "), at());
            assert_eq!(reading.location, location, "the name is kept as asked (trimmed)");
            let (low, high) = GENERIC_TEMPERATURE_RANGE;
            assert!((f64::from(low)..=f64::from(high)).contains(&reading.temperature), "{location}: {}", reading.temperature);
            assert!(ALL_CONDITIONS.contains(&reading.conditions.as_str()), "{location}: {}", reading.conditions);
        }
    }

    #[test]
    fn draws_cover_their_ranges() {
        let mut draws = SplitMix64::new(7);
        let values: std::collections::BTreeSet<i32> = (0..2000).map(|_| draws.in_range(-5, 8)).collect();
        assert_eq!(values.first(), Some(&-5));
        assert_eq!(values.last(), Some(&8));
        assert_eq!(values.len(), 14);
        let picked: std::collections::BTreeSet<&str> = (0..500).map(|_| draws.pick(&ALL_CONDITIONS)).collect();
        assert_eq!(picked.len(), ALL_CONDITIONS.len());
    }

    #[test]
    fn the_seed_is_stable_across_platforms() {
        // FNV-1a test vectors: a changed hash would silently change every reading.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
    }
}

//! The channel-limits database (reference §5.6): a JSON object of channel → `{min_value,
//! max_value, max_step, writable, verification{level, tolerance_absolute|tolerance_percent}}`,
//! with an optional `defaults` entry and `_`-prefixed keys ignored. A database that cannot be
//! read is an error the gate turns into "every write is refused", never into "no limits".

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Violation;
use crate::value::{ChannelValue, VerificationLevel};

/// Why a limits database cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// The file cannot be read.
    #[error("{path} cannot be read: {detail}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        detail: String,
    },
    /// The text is not a database of the expected shape.
    #[error("the limits database is not valid: {detail}")]
    Invalid {
        /// What is wrong, with the channel it is about.
        detail: String,
    },
}

/// How one channel's writes are verified (overrides the configured default).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelVerification {
    /// The level.
    #[serde(default)]
    pub level: Option<VerificationLevel>,
    /// The readback tolerance in the channel's units.
    #[serde(default)]
    pub tolerance_absolute: Option<f64>,
    /// The readback tolerance as a percentage of the value written.
    #[serde(default)]
    pub tolerance_percent: Option<f64>,
}

/// One channel's limits.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelLimits {
    /// The smallest value that may be written.
    #[serde(default)]
    pub min_value: Option<f64>,
    /// The largest value that may be written.
    #[serde(default)]
    pub max_value: Option<f64>,
    /// The largest change from the current value one write may make.
    #[serde(default)]
    pub max_step: Option<f64>,
    /// Whether the channel may be written at all (default true for a listed channel).
    #[serde(default = "yes")]
    pub writable: bool,
    /// How its writes are verified.
    #[serde(default)]
    pub verification: Option<ChannelVerification>,
}

fn yes() -> bool {
    true
}

/// The channel-limits database.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LimitsDatabase {
    channels: BTreeMap<String, ChannelLimits>,
    defaults: Option<ChannelLimits>,
}

impl LimitsDatabase {
    /// Reads the database at `path`.
    pub fn load(path: &Path) -> Result<Self, LimitsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| LimitsError::Unreadable { path: path.display().to_string(), detail: error.to_string() })?;
        Self::parse(&text)
    }

    /// Parses a database. Every entry is checked: numbers finite, `min_value ≤ max_value`,
    /// `max_step` and tolerances positive; one bad entry makes the whole database unusable.
    pub fn parse(text: &str) -> Result<Self, LimitsError> {
        let invalid = |detail: String| LimitsError::Invalid { detail };
        let value: Value = serde_json::from_str(text).map_err(|error| invalid(format!("not JSON ({error})")))?;
        let Value::Object(entries) = value else { return Err(invalid("the top level must be a JSON object of channels".into())) };
        let mut database = Self::default();
        for (key, entry) in entries {
            if key.starts_with('_') {
                continue;
            }
            let limits: ChannelLimits = serde_json::from_value(entry).map_err(|error| invalid(format!("channel '{key}': {error}")))?;
            check_entry(&limits).map_err(|problem| invalid(format!("channel '{key}': {problem}")))?;
            if key == "defaults" {
                database.defaults = Some(limits);
                continue;
            }
            // Keys are stored as writes are looked up: `X.VAL` is `X`, fields in capitals.
            let canonical = canonical_address(&key).map_err(|_| {
                invalid(format!("channel '{key}' is not a channel address (a record name, optionally '.' and a field name)"))
            })?;
            if database.channels.insert(canonical.clone(), limits).is_some() {
                return Err(invalid(format!("channel '{key}' is listed twice (as '{canonical}')")));
            }
        }
        Ok(database)
    }

    /// The entry of `address` (`X.VAL` finds `X`), when it is listed.
    pub fn channel(&self, address: &str) -> Option<&ChannelLimits> {
        canonical_address(address).ok().and_then(|canonical| self.channels.get(&canonical))
    }

    /// The `defaults` entry (the limits of unlisted channels, when they are allowed).
    pub fn defaults(&self) -> Option<&ChannelLimits> {
        self.defaults.as_ref()
    }

    /// The checks that need no reading, before the channel is read: the address, listed (or
    /// unlisted channels allowed), writable, a finite value, min and max. Returns the limits
    /// that apply — the channel's entry, else `defaults` for an allowed unlisted channel — which
    /// are also the limits shown for approval and whose verification is used. A field address
    /// is the record's channel for `.VAL` (`X.VAL` meets the entry of `X`); any other field of
    /// a listed record (`X.DRVH`) must be listed itself, so a write to a record's limits never
    /// goes around its entry.
    pub fn check_static(&self, address: &str, value: &ChannelValue, allow_unlisted: bool) -> Result<Option<&ChannelLimits>, Violation> {
        let limits = self.check_address(address, allow_unlisted)?;
        if let Some(limits) = limits {
            check_bounds(limits, value)?;
        }
        Ok(limits)
    }

    /// The checks that need neither a reading nor the value: the address, listed (or unlisted
    /// channels allowed), writable. Returns the limits that apply, as [`Self::check_static`].
    pub fn check_address(&self, address: &str, allow_unlisted: bool) -> Result<Option<&ChannelLimits>, Violation> {
        let canonical = canonical_address(address)?;
        let listed = self.channels.get(&canonical);
        if listed.is_none()
            && let Some((record, _)) = canonical.split_once('.')
            && self.channels.contains_key(record)
        {
            return Err(Violation::UnlistedField);
        }
        let limits = match (listed, allow_unlisted) {
            (Some(limits), _) => limits,
            (None, false) => return Err(Violation::UnlistedChannel),
            // An allowed unlisted channel is a record's value, never another field of it (a link
            // such as `CALC:X.OUT` could point a later write anywhere).
            (None, true) if canonical.contains('.') => return Err(Violation::UnlistedField),
            (None, true) => match &self.defaults {
                Some(defaults) => defaults,
                None => return Ok(None),
            },
        };
        if !limits.writable {
            return Err(Violation::ReadOnly);
        }
        Ok(Some(limits))
    }

    /// Every check of a write of `value` to `address` whose current value is `current`:
    /// [`LimitsDatabase::check_static`], then the step from the current value.
    pub fn check(
        &self,
        address: &str,
        value: &ChannelValue,
        current: Option<&ChannelValue>,
        allow_unlisted: bool,
    ) -> Result<(), Violation> {
        match self.check_static(address, value, allow_unlisted)? {
            Some(limits) => check_step(limits, value, current),
            None => Ok(()),
        }
    }
}

/// The address a write names, as the limits database is keyed: the record name up to the first
/// `.` (as EPICS splits it), then the field in capitals, with `VAL` (and an empty field) being
/// the record itself. Anything but letters, digits and `: _ - .` (EPICS channel filters
/// `{…}`, `[…]`, `$`, spaces, other scripts) is refused: a write must name exactly one field.
pub fn canonical_address(address: &str) -> Result<String, Violation> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-' | '.');
    if address.is_empty() || address.len() > 256 || !address.chars().all(allowed) {
        return Err(Violation::MalformedAddress);
    }
    let Some((record, field)) = address.split_once('.') else { return Ok(address.to_owned()) };
    if record.is_empty() || field.contains('.') || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Violation::MalformedAddress);
    }
    let field = field.to_ascii_uppercase();
    Ok(if field.is_empty() || field == "VAL" { record.to_owned() } else { format!("{record}.{field}") })
}

/// Refuses a value that holds a non-finite number (NaN, infinite), whatever the limits: no
/// control system should be sent one.
pub fn check_finite(value: &ChannelValue) -> Result<(), Violation> {
    let finite = match value {
        ChannelValue::Double(number) => number.is_finite(),
        ChannelValue::DoubleArray(numbers) => numbers.iter().all(|number| number.is_finite()),
        _ => true,
    };
    if finite { Ok(()) } else { Err(Violation::NotANumber) }
}

/// The checks of one channel's limits that need no reading: writable, a finite number when any
/// numeric limit is set, min, max.
fn check_bounds(limits: &ChannelLimits, value: &ChannelValue) -> Result<(), Violation> {
    if !limits.writable {
        return Err(Violation::ReadOnly);
    }
    check_finite(value)?;
    let numeric = limits.min_value.is_some() || limits.max_value.is_some() || limits.max_step.is_some();
    if !numeric {
        return Ok(());
    }
    let Some(number) = value.as_f64().filter(|number| number.is_finite()) else { return Err(Violation::NotANumber) };
    if let Some(min) = limits.min_value
        && number < min
    {
        return Err(Violation::BelowMin { min });
    }
    if let Some(max) = limits.max_value
        && number > max
    {
        return Err(Violation::AboveMax { max });
    }
    Ok(())
}

/// The step from the current value, for a channel with a largest step (an unreadable current
/// value fails closed).
pub(crate) fn check_step(limits: &ChannelLimits, value: &ChannelValue, current: Option<&ChannelValue>) -> Result<(), Violation> {
    let Some(max_step) = limits.max_step else { return Ok(()) };
    let Some(number) = value.as_f64().filter(|number| number.is_finite()) else { return Err(Violation::NotANumber) };
    let Some(current) = current.and_then(ChannelValue::as_f64).filter(|current| current.is_finite()) else {
        return Err(Violation::StepUncheckable);
    };
    if (number - current).abs() > max_step {
        return Err(Violation::StepTooLarge { max_step, current });
    }
    Ok(())
}

fn check_entry(limits: &ChannelLimits) -> Result<(), String> {
    let finite = |name: &str, number: Option<f64>| match number {
        Some(number) if !number.is_finite() => Err(format!("{name} must be a finite number")),
        _ => Ok(()),
    };
    finite("min_value", limits.min_value)?;
    finite("max_value", limits.max_value)?;
    finite("max_step", limits.max_step)?;
    if let (Some(min), Some(max)) = (limits.min_value, limits.max_value)
        && min > max
    {
        return Err(format!("min_value {min} is above max_value {max}"));
    }
    if limits.max_step.is_some_and(|step| step <= 0.0) {
        return Err("max_step must be above 0".into());
    }
    if let Some(verification) = &limits.verification {
        for (name, tolerance) in
            [("tolerance_absolute", verification.tolerance_absolute), ("tolerance_percent", verification.tolerance_percent)]
        {
            if tolerance.is_some_and(|tolerance| !tolerance.is_finite() || tolerance < 0.0) {
                return Err(format!("verification.{name} must be a finite number of at least 0"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const DATABASE: &str = r#"{
        "_comment": "ignored",
        "defaults": {"max_step": 5.0},
        "LINAC:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10},
        "SR:STATUS": {"writable": false},
        "SR:MODE": {}
    }"#;

    fn double(value: f64) -> ChannelValue {
        ChannelValue::Double(value)
    }

    #[test]
    fn writes_meet_the_channels_limits_in_order() {
        let database = LimitsDatabase::parse(DATABASE).expect("valid");
        let amp = "LINAC:RF:AMP:SP";
        let current = double(50.0);
        type Case<'a> = (&'a str, ChannelValue, Option<&'a ChannelValue>, bool, Result<(), Violation>);
        let table: [Case<'_>; 17] = [
            (amp, double(55.0), Some(&current), false, Ok(())),
            (amp, double(-1.0), Some(&current), false, Err(Violation::BelowMin { min: 0.0 })),
            ("LINAC:RF:AMP:SP.VAL", double(70.0), Some(&current), true, Err(Violation::AboveMax { max: 60.0 })),
            ("LINAC:RF:AMP:SP.DRVH", double(100.0), Some(&current), true, Err(Violation::UnlistedField)),
            ("LINAC:RF:AMP:SP.{\"dbnd\":{\"d\":0.5}}", double(1000.0), Some(&current), true, Err(Violation::MalformedAddress)),
            ("LINAC:RF:AMP:SP.VAL$", double(1000.0), Some(&current), true, Err(Violation::MalformedAddress)),
            ("LINAC:RF:AMP:SP ", double(1000.0), Some(&current), true, Err(Violation::MalformedAddress)),
            ("LINAC:RF:AMP:SP.", double(70.0), Some(&current), true, Err(Violation::AboveMax { max: 60.0 })),
            ("LINAC:RF:AMP:SP.val", double(70.0), Some(&current), true, Err(Violation::AboveMax { max: 60.0 })),
            (amp, double(70.0), Some(&current), false, Err(Violation::AboveMax { max: 60.0 })),
            (amp, double(30.0), Some(&current), false, Err(Violation::StepTooLarge { max_step: 10.0, current: 50.0 })),
            (amp, double(55.0), None, false, Err(Violation::StepUncheckable)),
            (amp, double(f64::NAN), Some(&current), false, Err(Violation::NotANumber)),
            ("SR:STATUS", ChannelValue::String("x".into()), None, true, Err(Violation::ReadOnly)),
            ("SR:MODE", ChannelValue::String("top-up".into()), None, false, Ok(())),
            ("UNLISTED", double(1.0), Some(&double(0.0)), false, Err(Violation::UnlistedChannel)),
            ("UNLISTED", double(9.0), Some(&double(0.0)), true, Err(Violation::StepTooLarge { max_step: 5.0, current: 0.0 })),
        ];
        for (address, value, current, allow_unlisted, expected) in table {
            assert_eq!(database.check(address, &value, current, allow_unlisted), expected, "{address} ← {value:?}");
        }
    }

    #[test]
    fn a_bad_database_is_refused_whole() {
        for (text, says) in [
            ("[1, 2]", "top level"),
            ("{not json", "not JSON"),
            (r#"{"A": {"min_value": 5, "max_value": 1}}"#, "channel 'A': min_value 5 is above max_value 1"),
            (r#"{"A": {"max_step": 0}}"#, "max_step must be above 0"),
            (r#"{"A": {"max_value": "high"}}"#, "channel 'A'"),
            (r#"{"A": {"maximum": 3}}"#, "unknown field"),
            (r#"{"A": {"verification": {"tolerance_percent": -1}}}"#, "tolerance_percent"),
            (r#"{"A": {}, "A.VAL": {}}"#, "listed twice"),
            (r#"{"A {x}": {}}"#, "not a channel address"),
        ] {
            let error = LimitsDatabase::parse(text).expect_err(text).to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    proptest! {
        /// No value passes a channel's limits that is outside them, whatever the database.
        #[test]
        fn nothing_outside_the_limits_passes(
            min in -1e6f64..1e6, span in 0f64..1e6, step in 1e-3f64..1e6, current in -2e6f64..2e6, value in prop::num::f64::ANY,
            writable in any::<bool>(),
        ) {
            let max = min + span;
            let text = serde_json::json!({"C": {"min_value": min, "max_value": max, "max_step": step, "writable": writable}}).to_string();
            let database = LimitsDatabase::parse(&text).expect("valid");
            if database.check("C", &double(value), Some(&double(current)), false).is_ok() {
                prop_assert!(writable);
                prop_assert!(value.is_finite() && value >= min && value <= max && (value - current).abs() <= step);
            }
            prop_assert_eq!(database.check("D", &double(value), Some(&double(current)), false), Err(Violation::UnlistedChannel));
        }

        /// No way of naming a listed record's fields gets a value past its entry.
        #[test]
        fn no_address_form_goes_around_a_records_entry(field in "(\\.[A-Za-z0-9$_{}\\[\\]\" .:-]{0,8})?", value in 60.001f64..1e12) {
            let database = LimitsDatabase::parse(r#"{"X": {"max_value": 60}}"#).expect("valid");
            let address = format!("X{field}");
            prop_assert!(database.check_static(&address, &double(value), true).is_err(), "{} passed", address);
        }

        /// Any text either parses into a database or is refused; it never panics.
        #[test]
        fn any_text_is_a_database_or_refused(text in "\\PC{0,200}") {
            let _ = LimitsDatabase::parse(&text);
        }
    }
}

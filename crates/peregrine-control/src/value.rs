//! Typed channel values, readings with their units, timestamp and alarm severity, channel
//! metadata (units, limits, precision, enum strings, access), and how a write is verified.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ControlError;

/// A channel's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum ChannelValue {
    /// A floating-point value (EPICS DBR_DOUBLE/FLOAT).
    Double(f64),
    /// An integer value (DBR_LONG/SHORT/CHAR).
    Integer(i64),
    /// A string (DBR_STRING).
    String(String),
    /// An enumerated value: its index and, when known, its label (DBR_ENUM).
    Enum {
        /// The state's index.
        index: u16,
        /// The state's label from the channel's enum strings.
        label: Option<String>,
    },
    /// A waveform of floating-point values.
    DoubleArray(Vec<f64>),
    /// A waveform of integers.
    IntegerArray(Vec<i64>),
}

impl ChannelValue {
    /// The value as a number, for limits and verification (an enum's index; `None` for strings
    /// and arrays).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Double(value) => Some(*value),
            #[allow(clippy::cast_precision_loss, reason = "channel integers are far below 2^53")]
            Self::Integer(value) => Some(*value as f64),
            Self::Enum { index, .. } => Some(f64::from(*index)),
            Self::String(_) | Self::DoubleArray(_) | Self::IntegerArray(_) => None,
        }
    }

    /// Parses `text` as a value of the channel whose current value is `current` (the channel's
    /// type decides: a number, a whole number, text, an enum state by label or index, or
    /// comma-separated numbers for a waveform); `enum_strings` are the channel's state labels.
    pub fn parse_as(text: &str, current: &ChannelValue, enum_strings: &[String], address: &str) -> Result<Self, ControlError> {
        let invalid = |detail: String| ControlError::InvalidValue { address: address.to_owned(), value: text.to_owned(), detail };
        let text = text.trim();
        match current {
            Self::Double(_) => text
                .parse::<f64>()
                .ok()
                .filter(|value| value.is_finite())
                .map(Self::Double)
                .ok_or_else(|| invalid("the channel takes a number".into())),
            Self::Integer(_) => text.parse::<i64>().map(Self::Integer).map_err(|_| invalid("the channel takes a whole number".into())),
            Self::String(_) => Ok(Self::String(text.to_owned())),
            Self::Enum { .. } => {
                // An empty label is an undefined state, never matched (nor is empty text).
                let by_label = enum_strings.iter().position(|label| !label.trim().is_empty() && label.trim().eq_ignore_ascii_case(text));
                let defined = |index: &usize| match enum_strings.get(*index) {
                    Some(label) => !label.trim().is_empty(),
                    None => enum_strings.is_empty() && *index == 0,
                };
                let by_index = text.parse::<usize>().ok().filter(defined);
                let index =
                    by_label.or(by_index).ok_or_else(|| invalid(format!("the channel's states are: {}", enum_strings.join(", "))))?;
                let index = u16::try_from(index).map_err(|_| invalid("no such state".into()))?;
                Ok(Self::Enum { index, label: enum_strings.get(usize::from(index)).cloned() })
            }
            Self::DoubleArray(_) => text
                .split(',')
                .map(|item| item.trim().parse::<f64>().ok().filter(|value| value.is_finite()))
                .collect::<Option<Vec<_>>>()
                .map(Self::DoubleArray)
                .ok_or_else(|| invalid("the channel takes comma-separated numbers".into())),
            Self::IntegerArray(_) => text
                .split(',')
                .map(|item| item.trim().parse::<i64>().ok())
                .collect::<Option<Vec<_>>>()
                .map(Self::IntegerArray)
                .ok_or_else(|| invalid("the channel takes comma-separated whole numbers".into())),
        }
    }

    /// The value as a person reads it (an enum's label when known).
    pub fn display(&self) -> String {
        let join = |items: Vec<String>| format!("[{}]", items.join(", "));
        match self {
            Self::Double(value) => value.to_string(),
            Self::Integer(value) => value.to_string(),
            Self::String(text) => text.clone(),
            Self::Enum { index, label: Some(label) } => format!("{label} ({index})"),
            Self::Enum { index, label: None } => index.to_string(),
            Self::DoubleArray(values) => join(values.iter().map(f64::to_string).collect()),
            Self::IntegerArray(values) => join(values.iter().map(i64::to_string).collect()),
        }
    }
}

/// A channel's alarm severity (EPICS: NO_ALARM, MINOR, MAJOR, INVALID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlarmSeverity {
    /// No alarm.
    #[default]
    NoAlarm,
    /// A minor alarm.
    Minor,
    /// A major alarm.
    Major,
    /// The value is invalid (e.g. its source is disconnected).
    Invalid,
}

/// One read of a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// The channel's address (EPICS: the PV name).
    pub address: String,
    /// Its value.
    pub value: ChannelValue,
    /// Its engineering units (`EGU`), when it has any.
    pub units: Option<String>,
    /// When the value was taken (the IOC's timestamp for EPICS).
    pub timestamp: DateTime<Utc>,
    /// Its alarm severity.
    pub severity: AlarmSeverity,
}

/// What is known about a channel besides its value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelMetadata {
    /// The channel's address.
    pub address: String,
    /// Engineering units.
    pub units: Option<String>,
    /// Display precision (decimal places).
    pub precision: Option<u16>,
    /// The display range (`LOPR`..`HOPR`).
    pub display_limits: Option<(f64, f64)>,
    /// The control range the connector enforces (`DRVL`..`DRVH`).
    pub control_limits: Option<(f64, f64)>,
    /// The labels of an enumerated channel, by index.
    pub enum_strings: Vec<String>,
    /// Whether the connector may read it.
    pub readable: bool,
    /// Whether the connector may write it.
    pub writable: bool,
}

/// How a write is checked after it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationLevel {
    /// Not checked.
    None,
    /// The control system confirmed the write completed (EPICS put-callback).
    #[default]
    Callback,
    /// The value read back after the write is the value written, within the tolerance.
    Readback,
}

/// How a write was verified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// The level checked.
    pub level: VerificationLevel,
    /// Whether it was checked and held (false when the level is `none`: nothing was checked).
    pub verified: bool,
    /// The value read back (for `readback`).
    pub readback: Option<ChannelValue>,
    /// The tolerance used, in the channel's units (for `readback`).
    pub tolerance: Option<f64>,
    /// What the check found, for the person.
    pub notes: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_states_are_read_by_defined_label_or_index_only() {
        let labels: Vec<String> = ["Standby", "", "Stored"].iter().map(|label| (*label).to_owned()).collect();
        let current = ChannelValue::Enum { index: 0, label: None };
        let parse = |text: &str| ChannelValue::parse_as(text, &current, &labels, "X:MODE");
        assert_eq!(parse("stored").expect("by label"), ChannelValue::Enum { index: 2, label: Some("Stored".into()) });
        assert_eq!(parse("0").expect("by index"), ChannelValue::Enum { index: 0, label: Some("Standby".into()) });
        for undefined in ["", "1", "3", "-1"] {
            assert!(parse(undefined).is_err(), "{undefined:?} names no defined state");
        }
        let integer = ChannelValue::Integer(0);
        assert!(ChannelValue::parse_as("9223372036854775808", &integer, &[], "X").is_err(), "past i64");
    }
}

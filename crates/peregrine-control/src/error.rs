//! What can go wrong talking to a control system, classified by what the framework does next:
//! a timeout or a lost connection is RETRIABLE, an unknown channel is REPLANNING, and a write a
//! gate stopped (writes disabled, a limit, read-only, an unreadable limits database) is a
//! *block*: reported to the person and never retried around.

use peregrine_core::ErrorClassification;
use serde::{Deserialize, Serialize};

/// Why the limits database stops a write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Violation {
    /// The channel is not in the database and unlisted channels are not allowed.
    UnlistedChannel,
    /// The database marks the channel read-only.
    ReadOnly,
    /// A field other than the value (`X.DRVH`, `X.OUT`) that is not listed itself: of a listed
    /// record, or of any record when unlisted channels are allowed.
    UnlistedField,
    /// The operation writes this channel more than once.
    WrittenTwice,
    /// The address is not one plain channel (EPICS channel filters `{…}` `[…]` `$`, spaces,
    /// characters outside `A-Z a-z 0-9 : _ - .`).
    MalformedAddress,
    /// The value is below the channel's minimum.
    BelowMin {
        /// The minimum.
        min: f64,
    },
    /// The value is above the channel's maximum.
    AboveMax {
        /// The maximum.
        max: f64,
    },
    /// The change from the current value is larger than the channel's largest step.
    StepTooLarge {
        /// The largest step.
        max_step: f64,
        /// The current value the step is measured from.
        current: f64,
    },
    /// The step cannot be checked: the current value could not be read as a number.
    StepUncheckable,
    /// The value is not a finite number (NaN, infinite) or not a number at all.
    NotANumber,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnlistedChannel => write!(f, "the channel is not in the limits database, which allows no unlisted channels"),
            Self::ReadOnly => write!(f, "the limits database marks the channel read-only"),
            Self::MalformedAddress => {
                write!(
                    f,
                    "the address is not one plain channel (a record name of letters, digits and : _ - ., optionally '.' and a field name)"
                )
            }
            Self::WrittenTwice => write!(f, "the operation writes this channel more than once; one write per channel"),
            Self::UnlistedField => {
                write!(
                    f,
                    "it is a record field other than .VAL, and the field itself is not listed in the limits database (only .VAL meets the record's entry)"
                )
            }
            Self::BelowMin { min } => write!(f, "the value is below the channel's minimum of {min}"),
            Self::AboveMax { max } => write!(f, "the value is above the channel's maximum of {max}"),
            Self::StepTooLarge { max_step, current } => {
                write!(f, "the change from the current value {current} is larger than the channel's largest step of {max_step}")
            }
            Self::StepUncheckable => write!(f, "the channel has a largest step, but its current value cannot be read as a number"),
            Self::NotANumber => write!(f, "the value is not a finite number"),
        }
    }
}

/// A control-system failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The control system did not answer in time.
    #[error("channel '{address}' did not answer within {seconds} s")]
    Timeout {
        /// The channel.
        address: String,
        /// The timeout.
        seconds: f64,
    },
    /// The connection to the channel's server was lost (or never made).
    #[error("channel '{address}' is disconnected: {detail}")]
    Disconnected {
        /// The channel.
        address: String,
        /// What the connector saw.
        detail: String,
    },
    /// No server has the channel.
    #[error("channel '{address}' was not found on the control system")]
    UnknownChannel {
        /// The channel.
        address: String,
    },
    /// `control_system.writes_enabled` is off.
    #[error("writes to the control system are disabled (control_system.writes_enabled is false); '{address}' was not written")]
    WritesDisabled {
        /// The channel.
        address: String,
    },
    /// The limits database stops the write.
    #[error("the write of {value} to '{address}' is refused: {violation}")]
    LimitViolation {
        /// The channel.
        address: String,
        /// The value asked for.
        value: String,
        /// Why.
        violation: Violation,
    },
    /// Limits checking is on, but its database cannot be used: every write is refused.
    #[error("every write is refused: the channel limits database cannot be used ({detail})")]
    LimitsUnavailable {
        /// Why.
        detail: String,
    },
    /// The control system refuses access (EPICS access security, a read-only gateway).
    #[error("the control system refuses to {action} '{address}'")]
    AccessDenied {
        /// The channel.
        address: String,
        /// `read` or `write`.
        action: &'static str,
    },
    /// The value does not fit the channel (a string to a number, an unknown enum label).
    #[error("'{value}' cannot be written to '{address}': {detail}")]
    InvalidValue {
        /// The channel.
        address: String,
        /// The value.
        value: String,
        /// Why.
        detail: String,
    },
    /// The write was sent and its completion was not confirmed (a timeout or a lost connection
    /// after sending): the value may or may not have been written. Never retried blindly.
    #[error("the write to '{address}' may or may not have happened ({detail}); read the channel back before trying again")]
    WriteUncertain {
        /// The channel.
        address: String,
        /// What the connector saw.
        detail: String,
    },
    /// The write was sent, but its verification failed.
    #[error("the write to '{address}' was sent but not verified: {notes}")]
    VerificationFailed {
        /// The channel.
        address: String,
        /// What the check found.
        notes: String,
    },
    /// Any other failure of the connector.
    #[error("the control system connector failed: {detail}")]
    Connector {
        /// What happened.
        detail: String,
    },
}

impl ControlError {
    /// Whether a gate stopped the write before it reached the control system: reported as it
    /// is, never retried, never re-planned around.
    pub fn is_block(&self) -> bool {
        matches!(
            self,
            Self::WritesDisabled { .. } | Self::LimitViolation { .. } | Self::LimitsUnavailable { .. } | Self::AccessDenied { .. }
        )
    }

    /// How the framework recovers: retry a timeout or a lost connection, re-plan an unknown
    /// channel or a value that does not fit, and end the turn with a report for a block or a
    /// failed verification (a write that may have happened is never repeated blindly).
    pub fn classification(&self) -> ErrorClassification {
        let message = self.to_string();
        match self {
            Self::Timeout { .. } | Self::Disconnected { .. } => ErrorClassification::retriable(message),
            Self::UnknownChannel { .. } | Self::InvalidValue { .. } => ErrorClassification::replanning(message),
            Self::WritesDisabled { .. }
            | Self::LimitViolation { .. }
            | Self::LimitsUnavailable { .. }
            | Self::AccessDenied { .. }
            | Self::WriteUncertain { .. }
            | Self::VerificationFailed { .. }
            | Self::Connector { .. } => ErrorClassification::critical(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use peregrine_core::ErrorSeverity;

    use super::*;

    #[test]
    fn errors_are_classified_by_what_happens_next() {
        let address = || "SR:RF:AMP".to_owned();
        let table = [
            (ControlError::Timeout { address: address(), seconds: 5.0 }, ErrorSeverity::Retriable, false),
            (ControlError::Disconnected { address: address(), detail: "closed".into() }, ErrorSeverity::Retriable, false),
            (ControlError::UnknownChannel { address: address() }, ErrorSeverity::Replanning, false),
            (ControlError::WritesDisabled { address: address() }, ErrorSeverity::Critical, true),
            (
                ControlError::LimitViolation { address: address(), value: "70".into(), violation: Violation::AboveMax { max: 60.0 } },
                ErrorSeverity::Critical,
                true,
            ),
            (ControlError::LimitsUnavailable { detail: "missing".into() }, ErrorSeverity::Critical, true),
            (ControlError::AccessDenied { address: address(), action: "write" }, ErrorSeverity::Critical, true),
            (ControlError::VerificationFailed { address: address(), notes: "read 54".into() }, ErrorSeverity::Critical, false),
            (ControlError::WriteUncertain { address: address(), detail: "timed out".into() }, ErrorSeverity::Critical, false),
        ];
        for (error, severity, block) in table {
            assert_eq!(error.classification().severity, severity, "{error}");
            assert_eq!(error.is_block(), block, "{error}");
        }
    }
}

//! The write gates, in order: `control_system.writes_enabled`, then the channel-limits
//! database (against the channel's current value, read for it), then — asked by the capability
//! between [`WriteGate::plan`] and [`WriteGate::execute`] — the person's approval of exactly the
//! planned writes, then the write and its verification. [`WriteGate::execute`] checks the first
//! two gates again against the value current at that moment: a step measured from a value that
//! changed while the approval waited is measured again.

use crate::connector::DynControlSystem;
use crate::error::ControlError;
use crate::limits::{ChannelLimits, LimitsDatabase, LimitsError, check_finite, check_step};
use crate::value::{AlarmSeverity, ChannelValue, Reading, Verification, VerificationLevel};

/// Whether and how writes are checked against the limits database.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitsCheck {
    /// No limits checking (`limits_checking.enabled: false`).
    Off,
    /// Every write meets the database; one that could not be loaded refuses every write.
    On {
        /// The database, or why it cannot be used.
        database: Result<LimitsDatabase, LimitsError>,
        /// Whether channels not in the database may be written.
        allow_unlisted: bool,
    },
}

/// The write settings of `control_system`.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteSettings {
    /// The master switch (`writes_enabled`).
    pub writes_enabled: bool,
    /// The limits check (`limits_checking`).
    pub limits: LimitsCheck,
    /// The default verification level (`write_verification.default_level`).
    pub verification: VerificationLevel,
    /// The default readback tolerance in percent of the value (`default_tolerance_percent`).
    pub tolerance_percent: f64,
}

impl Default for WriteSettings {
    /// Writes off, limits off, callback verification with a 0.1 % tolerance (Osprey's defaults).
    fn default() -> Self {
        Self { writes_enabled: false, limits: LimitsCheck::Off, verification: VerificationLevel::Callback, tolerance_percent: 0.1 }
    }
}

/// A write that passed the gates before the approval: what the person is shown.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedWrite {
    /// The channel.
    pub address: String,
    /// The value to write.
    pub value: ChannelValue,
    /// The channel's current reading.
    pub current: Reading,
    /// The channel's limits from the database, when it is listed.
    pub limits: Option<ChannelLimits>,
    /// How the write will be verified.
    pub verification: VerificationLevel,
    /// The readback tolerance, in the channel's units.
    pub tolerance: f64,
}

/// A write that happened.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteOutcome {
    /// The channel.
    pub address: String,
    /// The value written.
    pub value: ChannelValue,
    /// The value before the write.
    pub previous: ChannelValue,
    /// How it was verified.
    pub verification: Verification,
}

/// The gates of one control system.
pub struct WriteGate<'a> {
    settings: &'a WriteSettings,
    connector: &'a dyn DynControlSystem,
}

impl std::fmt::Debug for WriteGate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGate").field("settings", self.settings).field("connector", &self.connector.name()).finish()
    }
}

impl<'a> WriteGate<'a> {
    /// The gates of `settings` in front of `connector`.
    pub fn new(settings: &'a WriteSettings, connector: &'a dyn DynControlSystem) -> Self {
        Self { settings, connector }
    }

    /// Passes `writes` through the switch and the limits (reading each channel's current
    /// value), before anyone is asked to approve them. The first write stopped stops them all:
    /// an operation is approved whole or not at all.
    pub async fn plan(&self, writes: &[(String, ChannelValue)]) -> Result<Vec<PlannedWrite>, ControlError> {
        let mut planned = Vec::with_capacity(writes.len());
        for (address, value) in writes {
            planned.push(self.check(address, value).await?);
        }
        Ok(planned)
    }

    /// Writes a planned (and approved) write: the switch and the limits are checked again
    /// against the value current now, then the connector writes and verifies. A write whose
    /// completion is not confirmed (a timeout, a lost connection) is
    /// [`ControlError::WriteUncertain`]: it may have happened, so it is never retried blindly.
    pub async fn execute(&self, write: &PlannedWrite) -> Result<WriteOutcome, ControlError> {
        let fresh = self.check(&write.address, &write.value).await?;
        let verification = self.connector.write_boxed(&write.address, &write.value, fresh.verification, fresh.tolerance).await.map_err(
            |error| match error {
                ControlError::Timeout { address, seconds } => {
                    ControlError::WriteUncertain { address, detail: format!("no answer within {seconds} s") }
                }
                ControlError::Disconnected { address, detail } => ControlError::WriteUncertain { address, detail },
                other => other,
            },
        )?;
        Ok(WriteOutcome { address: write.address.clone(), value: write.value.clone(), previous: fresh.current.value, verification })
    }

    /// The gates before the approval, for one write, in order: the master switch, the checks
    /// that need no reading (address, listed, writable, finite, min, max), then the channel is
    /// read and the step from its current value is checked (a reading in INVALID alarm counts
    /// as no current value: a step cannot be measured from it).
    async fn check(&self, address: &str, value: &ChannelValue) -> Result<PlannedWrite, ControlError> {
        if !self.settings.writes_enabled {
            return Err(ControlError::WritesDisabled { address: address.to_owned() });
        }
        let refused = |violation| ControlError::LimitViolation { address: address.to_owned(), value: value.display(), violation };
        check_finite(value).map_err(refused)?;
        let limits = match &self.settings.limits {
            LimitsCheck::Off => None,
            LimitsCheck::On { database: Err(error), .. } => return Err(ControlError::LimitsUnavailable { detail: error.to_string() }),
            LimitsCheck::On { database: Ok(database), allow_unlisted } => {
                database.check_static(address, value, *allow_unlisted).map_err(refused)?.cloned()
            }
        };
        let current = self.connector.read_boxed(address).await?;
        if let Some(limits) = &limits {
            let measurable = (current.severity != AlarmSeverity::Invalid).then_some(&current.value);
            check_step(limits, value, measurable).map_err(refused)?;
        }
        let own = limits.as_ref().and_then(|limits| limits.verification);
        let verification = own.and_then(|own| own.level).unwrap_or(self.settings.verification);
        let magnitude = value.as_f64().map_or(0.0, f64::abs);
        let tolerance = match own {
            Some(own) if own.tolerance_absolute.is_some() => own.tolerance_absolute.unwrap_or_default(),
            Some(own) if own.tolerance_percent.is_some() => magnitude * own.tolerance_percent.unwrap_or_default() / 100.0,
            _ => magnitude * self.settings.tolerance_percent / 100.0,
        };
        Ok(PlannedWrite { address: address.to_owned(), value: value.clone(), current, limits, verification, tolerance })
    }
}

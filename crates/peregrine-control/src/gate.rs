//! The write gates, in order: `control_system.writes_enabled`, then the channel-limits
//! database (against the channel's current value, read for it), then — asked by the capability
//! between [`WriteGate::plan`] and [`WriteGate::execute`] — the person's approval of exactly the
//! planned writes, then the write and its verification. [`WriteGate::execute`] checks the first
//! two gates again against the value current at that moment: a step measured from a value that
//! changed while the approval waited is measured again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::connector::DynControlSystem;
use crate::error::{ControlError, Violation};
use crate::journal::{JournalState, WriteJournal};
use crate::limits::{ChannelLimits, LimitsDatabase, LimitsError, canonical_address, check_finite, check_step};
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
    /// Not sent again: an approval delivered again after a crash found the channel already at
    /// the approved value (the first delivery's write had happened).
    pub already_written: bool,
}

/// An approved operation that stopped part-way: the writes before the failed one happened.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialWrite {
    /// The writes that happened, in order.
    pub done: Vec<WriteOutcome>,
    /// Why the operation stopped (for a gate's stop before any write, `done` is empty).
    pub error: ControlError,
}

/// One lock per channel in this process, taken around an operation's re-check and write, so two
/// turns never both measure a step from the same value and then both write.
#[derive(Debug, Default, Clone)]
pub struct ChannelLocks {
    locks: Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl ChannelLocks {
    /// Takes the locks of `addresses` (canonical, each once, in sorted order so two operations
    /// never wait for each other).
    pub async fn lock(&self, addresses: impl IntoIterator<Item = &str>) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let keys: BTreeSet<String> =
            addresses.into_iter().map(|address| canonical_address(address).unwrap_or_else(|_| address.to_owned())).collect();
        let mutexes: Vec<_> = {
            let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            keys.into_iter().map(|key| Arc::clone(locks.entry(key).or_default())).collect()
        };
        let mut guards = Vec::with_capacity(mutexes.len());
        for mutex in mutexes {
            guards.push(mutex.lock_owned().await);
        }
        guards
    }
}

/// How long after an interrupted write was recorded as sending its channel is read to settle
/// it: a put still on its way lands within this time.
pub const SETTLE_AFTER: Duration = Duration::from_secs(2);

/// The outcome of a write the journal records as done before a crash.
fn already_written(address: &str, value: &ChannelValue, shown: Option<ChannelValue>) -> WriteOutcome {
    let verification = Verification {
        level: VerificationLevel::None,
        verified: true,
        readback: None,
        tolerance: None,
        notes: "written before the process stopped (the write journal and the readback show it); not sent again".into(),
    };
    WriteOutcome {
        address: address.to_owned(),
        value: value.clone(),
        previous: shown.unwrap_or_else(|| value.clone()),
        verification,
        already_written: true,
    }
}

/// What the channel's readback says about a write interrupted between being sent and being
/// confirmed.
enum Settled {
    /// The channel reads the approved new value: the write happened.
    Written,
    /// The channel still reads the value shown at the approval: the write did not happen.
    NotWritten,
    /// The readback cannot tell (why, in words).
    Unknown(String),
}

/// Settles an interrupted write by its readback, only when the channel is verified by readback
/// (a momentary or triggered channel's readback does not show a write) and the approved value
/// and the value shown at the approval are told apart by more than the tolerance.
fn settle(write: &PlannedWrite, shown: Option<&ChannelValue>) -> Settled {
    if write.verification != VerificationLevel::Readback {
        return Settled::Unknown(
            "the channel is not verified by readback, so its reading cannot tell; read it before writing again".into(),
        );
    }
    let Some(shown) = shown else { return Settled::Unknown("the value shown at the approval is not known".into()) };
    if write.current.severity == AlarmSeverity::Invalid {
        return Settled::Unknown("the channel's reading is INVALID".into());
    }
    let near = |a: &ChannelValue, b: &ChannelValue| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() <= write.tolerance,
        _ => a == b,
    };
    if near(&write.value, shown) {
        return Settled::Unknown(format!("the new value {} is within the tolerance of the old one", write.value.display()));
    }
    if near(&write.current.value, &write.value) {
        Settled::Written
    } else if near(&write.current.value, shown) {
        Settled::NotWritten
    } else {
        Settled::Unknown(format!(
            "the channel reads {}, neither the old value {} nor the new {}",
            write.current.value.display(),
            shown.display(),
            write.value.display()
        ))
    }
}

/// An operation writes each channel once (`X` and `X.VAL` are one channel): two writes to one
/// channel would each measure their step from the same current value.
fn once_each(writes: &[(String, ChannelValue)]) -> Result<(), ControlError> {
    let mut seen = BTreeSet::new();
    for (address, value) in writes {
        if !seen.insert(canonical_address(address).unwrap_or_else(|_| address.clone())) {
            return Err(ControlError::LimitViolation {
                address: address.clone(),
                value: value.display(),
                violation: Violation::WrittenTwice,
            });
        }
    }
    Ok(())
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
        once_each(writes)?;
        let mut planned = Vec::with_capacity(writes.len());
        for (address, value) in writes {
            planned.push(self.check(address, value).await?);
        }
        Ok(planned)
    }

    /// The gates that need no reading, before anything is read or parsed: the master switch,
    /// then the address, listed and writable — and, when `value` is known already, a finite
    /// value within min and max. A channel the gates stop is never read for the write.
    pub fn precheck(&self, address: &str, value: Option<&ChannelValue>) -> Result<(), ControlError> {
        if !self.settings.writes_enabled {
            return Err(ControlError::WritesDisabled { address: address.to_owned() });
        }
        let shown = value.map_or_else(String::new, ChannelValue::display);
        let refused = |violation| ControlError::LimitViolation { address: address.to_owned(), value: shown.clone(), violation };
        if let Some(value) = value {
            check_finite(value).map_err(refused)?;
        }
        match &self.settings.limits {
            LimitsCheck::Off => Ok(()),
            LimitsCheck::On { database: Err(error), .. } => Err(ControlError::LimitsUnavailable { detail: error.to_string() }),
            LimitsCheck::On { database: Ok(database), allow_unlisted } => match value {
                Some(value) => database.check_static(address, value, *allow_unlisted).map(drop).map_err(refused),
                None => database.check_address(address, *allow_unlisted).map(drop).map_err(refused),
            },
        }
    }

    /// Writes an approved operation exactly as approved, whole or not at all as far as the gates
    /// go: under the channels' locks, every write is checked again against the values current
    /// now (a stop writes nothing), then each is written and verified in order; a failure stops
    /// the writes after it. With a `journal` (the operation's, kept across crashes), a write it
    /// records as done is not sent again; one it records as being sent is settled by its
    /// readback where that can tell (see [`WriteJournal`]) and otherwise stops the operation as
    /// [`ControlError::WriteUncertain`] before anything is sent.
    pub async fn execute_all(
        &self,
        writes: &[(String, ChannelValue)],
        locks: &ChannelLocks,
        mut journal: Option<&mut WriteJournal>,
    ) -> Result<Vec<WriteOutcome>, PartialWrite> {
        once_each(writes).map_err(|error| PartialWrite { done: Vec::new(), error })?;
        let _guards = locks.lock(writes.iter().map(|(address, _)| address.as_str())).await;
        let state = |journal: &Option<&mut WriteJournal>, index: usize| {
            journal.as_ref().map_or(JournalState::Unsent, |journal| journal.state(index))
        };
        let shown = |journal: &Option<&mut WriteJournal>, index: usize| journal.as_ref().and_then(|journal| journal.shown(index)).cloned();
        // What happened before a crash is reported whatever stops the rest.
        let mut done: Vec<WriteOutcome> = Vec::with_capacity(writes.len());
        for (index, (address, value)) in writes.iter().enumerate() {
            if state(&journal, index) == JournalState::Done {
                done.push(already_written(address, value, shown(&journal, index)));
            }
        }
        // Every other write is checked (and an interrupted one settled) before any is sent.
        let mut fresh: Vec<Option<PlannedWrite>> = Vec::with_capacity(writes.len());
        for (index, (address, value)) in writes.iter().enumerate() {
            let current_state = state(&journal, index);
            if current_state == JournalState::Done {
                fresh.push(None);
                continue;
            }
            if let JournalState::Sending(Some(at)) = current_state {
                // A put still on its way (in a dead process's socket, a gateway's queue) lands
                // within this time; the channel is read after it.
                let elapsed = SystemTime::now().duration_since(at).unwrap_or_default();
                if let Some(wait) = SETTLE_AFTER.checked_sub(elapsed) {
                    tokio::time::sleep(wait).await;
                }
            }
            let write = match self.check(address, value).await {
                Ok(write) => write,
                Err(error) => return Err(PartialWrite { done, error }),
            };
            if let JournalState::Sending(_) = current_state {
                match settle(&write, shown(&journal, index).as_ref()) {
                    Settled::Written => {
                        if let Some(journal) = journal.as_deref_mut()
                            && let Err(error) = journal.done(index).await
                        {
                            return Err(PartialWrite { done, error });
                        }
                        done.push(already_written(address, value, shown(&journal, index)));
                        fresh.push(None);
                        continue;
                    }
                    Settled::NotWritten => {}
                    Settled::Unknown(why) => {
                        let error = ControlError::WriteUncertain {
                            address: address.clone(),
                            detail: format!("it was being sent when the process stopped and its completion was never recorded; {why}"),
                        };
                        return Err(PartialWrite { done, error });
                    }
                }
            }
            fresh.push(Some(write));
        }
        for (index, write) in fresh.into_iter().enumerate() {
            let Some(write) = write else { continue };
            if let Some(journal) = journal.as_deref_mut()
                && let Err(error) = journal.sending(index).await
            {
                return Err(PartialWrite { done, error });
            }
            match self.send(&write).await {
                Ok(outcome) => {
                    let recorded = match journal.as_deref_mut() {
                        Some(journal) => journal.done(index).await,
                        None => Ok(()),
                    };
                    done.push(outcome);
                    if let Err(error) = recorded {
                        return Err(PartialWrite { done, error });
                    }
                }
                Err(error) => return Err(PartialWrite { done, error }),
            }
        }
        Ok(done)
    }

    /// Writes a planned (and approved) write: the switch and the limits are checked again
    /// against the value current now, then the connector writes and verifies. A write whose
    /// completion is not confirmed (a timeout, a lost connection) is
    /// [`ControlError::WriteUncertain`]: it may have happened, so it is never retried blindly.
    pub async fn execute(&self, write: &PlannedWrite) -> Result<WriteOutcome, ControlError> {
        let fresh = self.check(&write.address, &write.value).await?;
        self.send(&fresh).await
    }

    /// The write of a write that just passed the gates, and its verification.
    async fn send(&self, fresh: &PlannedWrite) -> Result<WriteOutcome, ControlError> {
        let verification = self.connector.write_boxed(&fresh.address, &fresh.value, fresh.verification, fresh.tolerance).await.map_err(
            |error| match error {
                ControlError::Timeout { address, seconds } => {
                    ControlError::WriteUncertain { address, detail: format!("no answer within {seconds} s") }
                }
                ControlError::Disconnected { address, detail } => ControlError::WriteUncertain { address, detail },
                other => other,
            },
        )?;
        Ok(WriteOutcome {
            address: fresh.address.clone(),
            value: fresh.value.clone(),
            previous: fresh.current.value.clone(),
            verification,
            already_written: false,
        })
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

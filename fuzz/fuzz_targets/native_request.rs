//! A native run body (`POST /threads/{id}/runs`) as any bytes: a JSON object without unknown
//! fields, one thing asked, its checks that need no store; an edited plan it carries goes on
//! through the plan check.

#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_server::fuzzing::{self, RunOutcome};
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let outcome = fuzzing::native_run(body);
    match &outcome {
        RunOutcome::Refused(error) => assert!(error.status.is_client_error(), "{error:?}"),
        RunOutcome::Message { user_id, .. } => assert!(user_id.is_some()),
        RunOutcome::Decision { approved, edit } => {
            assert!(*approved || edit.is_none(), "an edit is only approved");
            if let Some(edit) = edit {
                let _ = peregrine_agent::infra::orchestrator::pending::parse_plan(edit.clone());
            }
        }
        RunOutcome::Answer(text) => assert!(!text.trim().is_empty()),
        RunOutcome::Abandon => {}
        RunOutcome::Continue => {}
    }
    // The outcome depends on the JSON, not on its layout.
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let again = fuzzing::native_run(serde_json::to_string_pretty(&value).unwrap_or_default().as_bytes());
        match (&outcome, &again) {
            (RunOutcome::Refused(one), RunOutcome::Refused(other)) => {
                assert_eq!((one.status, one.code, one.param), (other.status, other.code, other.param));
            }
            _ => assert_eq!(outcome, again),
        }
    }
});

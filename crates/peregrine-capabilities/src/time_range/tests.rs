//! Tests of the time-range capability (reference §8.2 case 22, #187/#189 timezones).

use std::sync::Arc;

use chrono::TimeZone;
use peregrine_agent::respond::{DefaultResponsePrompts, RespondCapability, ResponsePrompts};
use peregrine_agent::{AgentSettings, Catalog, Services};
use peregrine_core::capability::NoEvents;
use peregrine_core::{AgentState, CapabilityInput, ErrorSeverity, InputRef, PlannedStep};
use peregrine_llm::{ChatRequest, FakeProvider, LlmError, LlmErrorKind};

use super::*;

fn fixed_now() -> DateTime<Utc> {
    // Monday 2025-03-10 10:30 in Los Angeles (PDT since the day before).
    Utc.with_ymd_and_hms(2025, 3, 10, 17, 30, 0).single().expect("valid time")
}

fn capability(
    answer: impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync + 'static,
) -> (FakeProvider, TimeRangeCapability) {
    let fake = FakeProvider::by_schema(answer);
    let settings = AgentSettings { timezone: chrono_tz::America::Los_Angeles, ..AgentSettings::default() };
    let services = Services::new(Arc::new(fake.client()), settings);
    (fake, TimeRangeCapability::new(services).with_clock(fixed_now))
}

fn answering(start: &'static str, end: &'static str, found: bool) -> impl Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync {
    move |schema, _| {
        assert_eq!(schema, "TimeRangeOutput");
        Ok(serde_json::json!({"start_date": start, "end_date": end, "found": found}).to_string())
    }
}

async fn run(capability: &TimeRangeCapability) -> Result<CapabilityOutcome, CapabilityError> {
    let state = AgentState::default();
    let step = PlannedStep {
        context_key: "tr_0308_0310".into(),
        capability: TIME_RANGE_CAPABILITY.into(),
        task_objective: "Parse 'from March 8 to March 10' into absolute datetimes".into(),
        success_criteria: String::new(),
        expected_output: Some(TIME_RANGE.into()),
        parameters: None,
        inputs: Vec::new(),
    };
    let input = CapabilityInput { state: &state, step: &step, spec: capability.spec(), events: &NoEvents, approval: None };
    capability.execute(input).await
}

fn stored(outcome: CapabilityOutcome) -> (TimeRangeContext, Value) {
    let CapabilityOutcome::Done(update) = outcome else { panic!("expected Done, got {outcome:?}") };
    let store = update.context.expect("context stored");
    let entry = store.entry(TIME_RANGE, "tr_0308_0310").expect("stored under the step key");
    let raw = entry.data.clone();
    (store.get::<TimeRangeContext>("tr_0308_0310").expect("decodes").expect("present"), raw)
}

#[tokio::test]
async fn a_range_across_the_march_change_keeps_each_offset() {
    let (fake, capability) = capability(answering("2025-03-08 00:00:00", "2025-03-10 00:00:00", true));
    let (context, raw) = stored(run(&capability).await.expect("parsed"));
    assert_eq!(
        raw,
        serde_json::json!({
            "start_date": "2025-03-08T00:00:00-08:00",
            "end_date": "2025-03-10T00:00:00-07:00",
            "timezone_name": "America/Los_Angeles"
        })
    );
    assert_eq!(context.duration(), chrono::Duration::hours(47));
    assert_eq!(context.timezone(), Some(chrono_tz::America::Los_Angeles));
    assert_eq!(context.summary()["duration"], "1 day 23 hours");
    assert_eq!(fake.requests_for("TimeRangeOutput").len(), 1);
}

#[tokio::test]
async fn utc_answers_are_converted_to_local_time() {
    let (_, capability) = capability(answering("2025-03-10T15:30:00Z", "2025-03-10 17:30:00 UTC", true));
    let (_, raw) = stored(run(&capability).await.expect("parsed"));
    assert_eq!(raw["start_date"], "2025-03-10T08:30:00-07:00");
    assert_eq!(raw["end_date"], "2025-03-10T10:30:00-07:00");
}

#[tokio::test]
async fn no_time_reference_asks_for_a_new_plan() {
    let (_, capability) = capability(answering("2025-03-10 10:30:00", "2025-03-10 10:30:00", false));
    let error = run(&capability).await.expect_err("not found");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Replanning);
    assert!(matches!(error.downcast_ref::<TimeRangeError>(), Some(TimeRangeError::NotFound { .. })));
}

#[tokio::test]
async fn malformed_ranges_are_retried() {
    let cases: [(&'static str, &'static str); 4] = [
        ("2025-03-10 10:00:00", "2025-03-10 09:00:00"), // reversed
        ("2025-03-10 10:00:00", "2025-03-10 10:00:00"), // empty
        ("last tuesday", "2025-03-10 10:00:00"),        // not a datetime
        ("2026-01-01 00:00:00", "2026-01-02 00:00:00"), // a year that has not begun
    ];
    for (start, end) in cases {
        let (_, capability) = capability(answering(start, end, true));
        let error = run(&capability).await.expect_err("invalid");
        assert_eq!(error.default_classification().severity, ErrorSeverity::Retriable, "{start} → {end}: {error}");
    }
    let (_, capability) = capability(answering("last tuesday", "2025-03-10 10:00:00", true));
    let error = run(&capability).await.expect_err("invalid");
    assert!(error.message().contains("'last tuesday'"), "{}", error.message());
}

#[tokio::test]
async fn a_skipped_local_hour_is_retried() {
    let (_, capability) = capability(answering("2025-03-09 02:30:00", "2025-03-09 05:00:00", true));
    let error = run(&capability).await.expect_err("nonexistent");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Retriable);
    assert!(error.message().contains("daylight-saving"), "{}", error.message());
}

#[tokio::test]
async fn llm_faults_keep_their_classification() {
    let (_, capability) = capability(|_, _| Err(FakeProvider::error(LlmErrorKind::Auth { status: 401 }, "bad key")));
    let error = run(&capability).await.expect_err("auth");
    assert_eq!(error.default_classification().severity, ErrorSeverity::Critical);
}

#[tokio::test]
async fn the_prompt_states_local_time_and_computed_examples() {
    let (fake, capability) = capability(answering("2025-03-10 08:30:00", "2025-03-10 10:30:00", true));
    run(&capability).await.expect("parsed");
    let request = &fake.requests_for("TimeRangeOutput")[0];
    let system = &request.messages[0].content;
    for expected in [
        "Current datetime: 2025-03-10 10:30:00",
        "Current weekday: Monday",
        "America/Los_Angeles (UTC-07:00 now)",
        "\"last 2 hours\" → start_date: \"2025-03-10 08:30:00\"",
        "\"yesterday\" → start_date: \"2025-03-09 00:00:00\", end_date: \"2025-03-09 23:59:59\"",
        // 24 real hours earlier (17:30Z on the 9th) is already PDT, so the wall clock reads 10:30.
        "\"last 24 hours\" → start_date: \"2025-03-09 10:30:00\"",
        // Two weeks back on the calendar keeps the wall-clock time, across the change.
        "\"past 2 weeks\" → start_date: \"2025-02-24 10:30:00\"",
        "Never use a year after 2025",
    ] {
        assert!(system.contains(expected), "missing {expected:?} in\n{system}");
    }
    assert_eq!(request.messages[1].content, "User query to parse: Parse 'from March 8 to March 10' into absolute datetimes");
}

#[test]
fn the_spec_describes_time_range_parsing() {
    let (_, capability) = capability(|_, _| panic!("no call"));
    let spec = capability.spec();
    assert_eq!(spec.name, "time_range_parsing");
    assert_eq!(spec.provides, ["TIME_RANGE"]);
    let guide = spec.orchestrator_guide.as_ref().expect("orchestrator guide");
    assert_eq!(guide.priority, 5);
    assert!(guide.instructions.contains("tr_0301_0308"));
    assert!(guide.examples.iter().any(|example| example.step.context_key == "tr_0301_0308"));
    assert!(
        spec.classifier_guide
            .as_ref()
            .is_some_and(|guide| guide.examples.iter().any(|e| e.result) && guide.examples.iter().any(|e| !e.result))
    );
}

#[tokio::test]
async fn respond_notes_the_timezone_of_a_stored_range() {
    let (_, capability) = capability(answering("2025-03-10 08:30:00", "2025-03-10 10:30:00", true));
    let (context, _) = stored(run(&capability).await.expect("parsed"));
    assert_eq!(context.summary()["timezone_name"], "America/Los_Angeles", "the summary names the field as the data does");

    let mut state = AgentState::default();
    state.task.current_task = Some("When did the beam drop in the last two hours (Pacific time)?".into());
    state.capability_context_data.set("tr_0308_0310", &context, None).expect("stored");
    let step = PlannedStep {
        inputs: vec![InputRef::new(TIME_RANGE, "tr_0308_0310")],
        ..PlannedStep::generic_respond("Answer with the time range")
    };
    let fake = FakeProvider::by_schema(|_, _| Ok("unused".into()));
    let settings = AgentSettings { timezone: chrono_tz::America::Los_Angeles, ..AgentSettings::default() };
    let respond = RespondCapability::new(
        Services::new(Arc::new(fake.client()), settings),
        Arc::new(Catalog::new(vec![RespondCapability::default_spec()])),
    );
    let gathered = respond.response_context(&state, &step, fixed_now());
    assert_eq!(gathered.data_timezone.as_deref(), Some("America/Los_Angeles"));
    assert!(
        gathered.current_task.contains("[NOTE: All retrieved times are in the system local timezone (America/Los_Angeles)."),
        "{}",
        gathered.current_task
    );
    let prompt = DefaultResponsePrompts.build(&gathered);
    assert!(prompt.contains("Label retrieved times with the timezone America/Los_Angeles"), "{prompt}");
    assert!(prompt.contains("\"timezone_name\": \"America/Los_Angeles\""), "{prompt}");
}

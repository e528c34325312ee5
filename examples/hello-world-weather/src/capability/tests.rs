//! Unit tests of `current_weather` against the fake LLM provider: one structured call, the
//! stored context, and the classification of every failure.

use std::sync::{Arc, Mutex};

use chrono::TimeZone;
use peregrine_agent::AgentSettings;
use peregrine_core::capability::NoEvents;
use peregrine_core::{AgentState, ContextStore, ErrorSeverity, EventKind, EventSink, PlannedStep};
use peregrine_llm::{FakeProvider, LlmErrorKind};

use super::*;
use crate::mock_service::MockWeatherService;

fn fixed_now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 15, 17, 30, 0).single().expect("valid time")
}

fn capability(provider: &FakeProvider) -> CurrentWeatherCapability {
    let settings = AgentSettings { timezone: chrono_tz::Europe::Prague, ..AgentSettings::default() };
    CurrentWeatherCapability::new(Services::new(Arc::new(provider.client()), settings)).with_clock(fixed_now)
}

fn answering(location_json: impl Into<String>) -> FakeProvider {
    let location_json = location_json.into();
    FakeProvider::by_schema(move |schema, _| match schema {
        "LocationExtraction" => Ok(location_json.clone()),
        other => Err(FakeProvider::error(LlmErrorKind::InvalidOutput, &format!("unexpected schema {other}"))),
    })
}

fn state(task: &str) -> AgentState {
    let mut state = AgentState::default();
    state.task.current_task = Some(task.into());
    state
}

fn step(key: &str, objective: &str) -> PlannedStep {
    PlannedStep {
        context_key: key.into(),
        capability: "current_weather".into(),
        task_objective: objective.into(),
        success_criteria: "Current weather data retrieved".into(),
        expected_output: Some("CURRENT_WEATHER".into()),
        parameters: None,
        inputs: Vec::new(),
    }
}

async fn run(
    capability: &CurrentWeatherCapability,
    state: &AgentState,
    step: &PlannedStep,
    events: &dyn EventSink,
) -> Result<CapabilityOutcome, CapabilityError> {
    let input = CapabilityInput { state, step, spec: capability.spec(), events, approval: None };
    capability.execute(input).await
}

fn stored(outcome: CapabilityOutcome) -> ContextStore {
    match outcome {
        CapabilityOutcome::Done(update) => update.context.expect("the update stores context"),
        CapabilityOutcome::NeedsApproval(request) => panic!("no approval expected: {request:?}"),
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<AgentEvent>>);

impl EventSink for Recorder {
    fn emit(&self, event: AgentEvent) {
        self.0.lock().expect("not poisoned").push(event);
    }
}

#[tokio::test]
async fn parses_the_location_and_stores_the_mock_reading_under_the_step_key() {
    let provider = answering(r#"{"location": "Prague"}"#);
    let capability = capability(&provider);
    let state = state("What's the weather in Prague?");
    let step = step("prague_weather", "Get current weather conditions for Prague");
    let events = Recorder::default();

    let store = stored(run(&capability, &state, &step, &events).await.expect("succeeds"));

    let context = store.get::<CurrentWeatherContext>("prague_weather").expect("decodes").expect("stored under the step key");
    let expected_time = fixed_now().with_timezone(&chrono_tz::Europe::Prague).fixed_offset();
    let reading = MockWeatherService::new().get_current_weather("Prague", expected_time);
    assert_eq!(context, CurrentWeatherContext::from(reading));
    assert_eq!(context.timestamp.to_rfc3339(), "2025-01-15T18:30:00+01:00", "stamped in the facility's timezone");
    let entry = store.entry("CURRENT_WEATHER", "prague_weather").expect("entry");
    assert_eq!(entry.meta.task_objective.as_deref(), Some("Get current weather conditions for Prague"));
    assert!(entry.summary()["summary"].as_str().expect("text").starts_with("Weather in Prague on 2025-01-15: "));

    // Exactly one LLM call, structured, for the classifier role.
    assert_eq!(provider.requests().len(), 1);
    let request = &provider.requests_for("LocationExtraction")[0];
    assert_eq!(request.messages.len(), 1);
    assert!(request.messages[0].content.contains("Request: Get current weather conditions for Prague"));
    assert!(request.messages[0].content.contains("What's the weather in Prague?"), "the task is given as a fallback");
    let usage = capability.services.llm.usage();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].role, "classifier");
    assert_eq!(usage[0].schema.as_deref(), Some("LocationExtraction"));

    let statuses: Vec<String> = events
        .0
        .lock()
        .expect("not poisoned")
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Status { message, .. } if event.component == "current_weather" => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(statuses[..2], ["Extracting location from query...".to_string(), "Getting weather for Prague...".to_string()]);
    assert_eq!(statuses[2], format!("Weather retrieved: Prague - {:.1}°C", context.temperature));
}

#[tokio::test]
async fn the_step_objective_is_used_and_an_empty_one_falls_back_to_the_task() {
    let provider = answering(r#"{"location": "New York"}"#);
    let capability = capability(&provider);
    let state = state("Compare the weather in Prague and New York");
    let store =
        stored(run(&capability, &state, &step("ny", "Get current weather conditions for New York"), &NoEvents).await.expect("succeeds"));
    assert_eq!(store.get::<CurrentWeatherContext>("ny").expect("decodes").map(|c| c.location), Some("New York".into()));

    run(&capability, &state, &step("w", ""), &NoEvents).await.expect("succeeds");
    let prompt = &provider.requests()[1].messages[0].content;
    assert!(prompt.contains("Request: Compare the weather in Prague and New York"), "{prompt}");
    assert!(!prompt.contains("overall task"), "the task is not repeated when it is the request: {prompt}");
}

#[tokio::test]
async fn no_location_means_local_as_upstream() {
    for answer in [r#"{"location": "local"}"#, r#"{"location": ""}"#, r#"{"location": "  Unknown "}"#, r#"{"location": "\"N/A\""}"#] {
        let provider = answering(answer);
        let capability = capability(&provider);
        let store = stored(
            run(&capability, &state("What's the weather like?"), &step("w", "Get the current weather"), &NoEvents).await.expect("succeeds"),
        );
        let context = store.get::<CurrentWeatherContext>("w").expect("decodes").expect("stored");
        assert_eq!(context.location, "local", "{answer}");
        assert_eq!(provider.requests().len(), 1, "no second call for a default: {answer}");
    }
}

#[tokio::test]
async fn any_named_location_is_reported_under_its_own_name() {
    let provider = answering(r#"{"location": " Tokyo "}"#);
    let capability = capability(&provider);
    let store = stored(
        run(&capability, &state("How's the weather in Tokyo?"), &step("tokyo", "Get weather in Tokyo"), &NoEvents).await.expect("succeeds"),
    );
    assert_eq!(store.get::<CurrentWeatherContext>("tokyo").expect("decodes").map(|c| c.location), Some("Tokyo".into()));
}

#[tokio::test]
async fn unusable_location_answers_are_retriable_with_the_problem() {
    let long = format!(r#"{{"location": "{}"}}"#, "The user seems to be asking about a place ".repeat(4));
    let cases: [(String, &str); 2] = [(long, "longer than 100 characters"), (r#"{"location": "Prague\nNew York"}"#.into(), "line breaks")];
    for (answer, problem) in cases {
        let provider = answering(answer.as_str());
        let capability = capability(&provider);
        let error = run(&capability, &state("weather?"), &step("w", "Get the weather"), &NoEvents).await.expect_err("refused");
        let classification = capability.classify_error(&error);
        assert_eq!(classification.severity, ErrorSeverity::Retriable, "{answer}");
        let metadata = classification.metadata["validation_problem"].as_str().expect("problem named");
        assert!(metadata.contains(problem), "{metadata}");
        assert!(matches!(error.downcast_ref::<WeatherError>(), Some(WeatherError::InvalidLocation { .. })));
        assert_eq!(provider.requests().len(), 1, "a parsed but unusable answer is not re-asked inside the step");
    }
}

#[tokio::test]
async fn output_that_does_not_parse_is_retriable_after_the_structured_retry() {
    let provider = answering("I think the user means Prague.");
    let capability = capability(&provider);
    let error = run(&capability, &state("weather in Prague"), &step("w", "Get the weather in Prague"), &NoEvents).await.expect_err("fails");
    let classification = capability.classify_error(&error);
    assert_eq!(classification.severity, ErrorSeverity::Retriable);
    assert!(classification.user_message.as_deref().unwrap_or_default().contains("LocationExtraction"), "{classification:?}");
    // The structured-output protocol feeds the problem back once: one call, two answers.
    assert_eq!(provider.requests_for("LocationExtraction").len(), 2);
}

#[tokio::test]
async fn llm_faults_keep_the_llm_layers_classification() {
    let table = [
        (LlmErrorKind::Timeout, ErrorSeverity::Retriable),
        (LlmErrorKind::Auth { status: 401 }, ErrorSeverity::Critical),
        (LlmErrorKind::Config, ErrorSeverity::Critical),
    ];
    for (kind, severity) in table {
        let failure = kind.clone();
        let provider = FakeProvider::new(move |_| Err(FakeProvider::error(failure.clone(), "refused")));
        let capability = capability(&provider);
        let error = run(&capability, &state("weather?"), &step("w", "Get the weather"), &NoEvents).await.expect_err("fails");
        assert_eq!(capability.classify_error(&error).severity, severity, "{kind:?}");
        assert!(matches!(error.downcast_ref::<WeatherError>(), Some(WeatherError::LocationExtraction(_))));
    }
}

#[tokio::test]
async fn a_spec_without_current_weather_in_provides_is_refused_critically() {
    let provider = answering(r#"{"location": "Prague"}"#);
    let mut capability = capability(&provider);
    capability.spec.provides.clear();
    let error = run(&capability, &state("weather?"), &step("w", "Get the weather in Prague"), &NoEvents).await.expect_err("refused");
    let classification = capability.classify_error(&error);
    assert_eq!(classification.severity, ErrorSeverity::Critical);
    assert!(classification.user_message.as_deref().unwrap_or_default().starts_with("Weather service error: "));
}

#[test]
fn retry_policy_is_upstreams() {
    let provider = answering("{}");
    assert_eq!(capability(&provider).retry_policy(), RetryPolicy::new(3, 0.5, 1.5));
}

#[test]
fn validation_table() {
    let table: [(&str, Option<&str>); 8] = [
        ("Prague", Some("Prague")),
        ("  'San Francisco'  ", Some("San Francisco")),
        ("", Some("local")),
        ("LOCAL", Some("local")),
        ("not specified", Some("local")),
        ("Paris, France", Some("Paris, France")),
        ("a\tb", None),
        ("x\u{7}", None),
    ];
    for (answer, expected) in table {
        assert_eq!(validate_location(answer).ok().as_deref(), expected, "{answer:?}");
    }
    assert!(validate_location(&"x".repeat(100)).is_ok());
    assert!(validate_location(&"x".repeat(101)).is_err());
}

//! Tests of `channel_read` and `channel_write` on the mock machine with a fake model: what the
//! capabilities do with odd model output and with approval answers that do not fit.

use std::sync::Arc;

use peregrine_agent::{AgentSettings, Services};
use peregrine_control::{ControlSystem as _, LimitsCheck, LimitsDatabase, MockControlSystem, MockSettings, WriteSettings};
use peregrine_core::capability::NoEvents;
use peregrine_core::{
    AgentControl, AgentState, ApprovalAnswer, CapabilityError, CapabilityInput, CapabilityOutcome, ContextEntry, ErrorSeverity, InputRef,
    PlannedStep,
};
use peregrine_llm::{ChatRequest, FakeProvider, LlmError};
use serde_json::{Value, json};

use super::*;

type Answer = Box<dyn Fn(&str, &ChatRequest) -> Result<String, LlmError> + Send + Sync>;

struct Fixture {
    _dir: tempfile::TempDir,
    fake: FakeProvider,
    mock: Arc<MockControlSystem>,
    read: ChannelReadCapability,
    write: ChannelWriteCapability,
}

fn fixture(answer: Answer) -> Fixture {
    let fake = FakeProvider::by_schema(answer);
    let dir = tempfile::tempdir().expect("temp dir");
    let services = Services::new(Arc::new(fake.client()), AgentSettings::with_data_dir(dir.path()));
    let mock = Arc::new(MockControlSystem::new(MockSettings::default()));
    let settings = WriteSettings {
        writes_enabled: true,
        limits: LimitsCheck::On {
            database: LimitsDatabase::parse(r#"{"SR:RF:AMP": {"max_value": 60, "max_step": 10}, "SR:RF:PHASE": {}}"#),
            allow_unlisted: false,
        },
        ..WriteSettings::default()
    };
    let read = ChannelReadCapability::new(services.clone(), mock.clone());
    let write = ChannelWriteCapability::new(services, mock.clone(), settings);
    Fixture { _dir: dir, fake, mock, read, write }
}

fn operations(operations: Value) -> Answer {
    Box::new(move |schema, _| match schema {
        "WriteOperationsOutput" => Ok(json!({"write_operations": operations}).to_string()),
        "ChannelAddressExtraction" => Ok(json!({"channels": []}).to_string()),
        other => panic!("unexpected call with schema '{other}'"),
    })
}

fn state(with_addresses: bool) -> AgentState {
    let mut state = AgentState {
        agent_control: AgentControl { control_system_writes_enabled: true, ..AgentControl::default() },
        ..AgentState::default()
    };
    if with_addresses {
        let found = json!({"channels": ["SR:RF:AMP"], "original_query": "the RF amplitude"});
        state.capability_context_data.insert(CHANNEL_ADDRESSES, "rf", ContextEntry::new(found, None));
    }
    state
}

fn step(capability: &str, with_addresses: bool) -> PlannedStep {
    PlannedStep {
        context_key: "step".into(),
        capability: capability.into(),
        task_objective: "Set the RF amplitude to 55".into(),
        success_criteria: "done".into(),
        expected_output: None,
        parameters: None,
        inputs: if with_addresses { vec![InputRef::new(CHANNEL_ADDRESSES, "rf")] } else { Vec::new() },
    }
}

async fn run(
    capability: &dyn peregrine_core::DynCapability,
    state: &AgentState,
    step: &PlannedStep,
    approval: Option<&ApprovalAnswer>,
) -> Result<CapabilityOutcome, CapabilityError> {
    let input = CapabilityInput { state, step, spec: capability.spec(), events: &NoEvents, approval };
    capability.execute_boxed(input).await
}

fn severity(error: &CapabilityError) -> ErrorSeverity {
    error.default_classification().severity
}

fn answer(payload: Value, approved: bool) -> ApprovalAnswer {
    ApprovalAnswer { approval_type: CHANNEL_WRITE_APPROVAL.into(), approved, payload, delivery: 1, edit: None, feedback: None }
}

#[tokio::test]
async fn odd_write_operations_from_the_model_are_refused_before_anything_is_read_or_written() {
    let cases = [
        (json!([]), "No write operation"),
        (json!([{"channel_address": "  ", "value": 1}]), "names no channel"),
        (json!([{"channel_address": "SR:RF:PHASE", "value": 1}]), "not among the step's CHANNEL_ADDRESSES"),
        (json!((0..=MAX_CHANNELS_PER_STEP).map(|_| json!({"channel_address": "SR:RF:AMP", "value": 1})).collect::<Vec<_>>()), "at most"),
    ];
    for (ops, why) in cases {
        let f = fixture(operations(ops.clone()));
        let error = run(&f.write, &state(true), &step(CHANNEL_WRITE_CAPABILITY, true), None).await.expect_err("refused");
        assert_eq!(severity(&error), ErrorSeverity::Replanning, "{ops}: {error}");
        assert!(error.default_classification().user_message.unwrap_or_default().contains(why), "{ops}: {error}");
        assert_eq!(f.mock.writes("SR:RF:AMP") + f.mock.writes("SR:RF:PHASE"), 0);
    }
}

#[tokio::test]
async fn the_approval_payload_carries_typed_operations_and_the_answer_writes_exactly_them() {
    let f = fixture(operations(json!([{"channel_address": "SR:RF:AMP", "value": 55, "notes": "asked"}])));
    let outcome = run(&f.write, &state(true), &step(CHANNEL_WRITE_CAPABILITY, true), None).await.expect("asks");
    let CapabilityOutcome::NeedsApproval(request) = outcome else { panic!("expected an approval request, got {outcome:?}") };
    let operation = &request.payload["operations"][0];
    assert_eq!(operation["channel_address"], "SR:RF:AMP");
    assert_eq!(operation["value"], json!({"type": "double", "value": 55.0}));
    assert_eq!(operation["current_value"], json!({"type": "double", "value": 50.0}));
    assert_eq!(operation["limits"]["max_value"], 60.0);

    // The answer writes what its payload (bound by the digest to what was shown) says.
    let mut approved = request.payload.clone();
    approved["operations"][0]["value"] = json!({"type": "double", "value": 52.0});
    let done = run(&f.write, &state(true), &step(CHANNEL_WRITE_CAPABILITY, true), Some(&answer(approved, true))).await.expect("writes");
    assert!(matches!(done, CapabilityOutcome::Done(_)));
    assert_eq!(f.mock.writes("SR:RF:AMP"), 1);
    assert_eq!(f.mock.read("SR:RF:AMP").await.expect("read").value, peregrine_control::ChannelValue::Double(52.0), "the payload's value");
    assert_eq!(f.fake.requests_for("WriteOperationsOutput").len(), 1, "no second model call");
}

#[tokio::test]
async fn answers_that_do_not_fit_write_nothing() {
    let f = fixture(operations(json!([])));
    let payload = json!({"approval_type": CHANNEL_WRITE_APPROVAL, "operations": [
        {"channel_address": "SR:RF:AMP", "value": {"type": "double", "value": 55.0}}]});
    let state = state(false);
    let step = step(CHANNEL_WRITE_CAPABILITY, false);

    let mut foreign = answer(payload.clone(), true);
    foreign.approval_type = "memory_save".into();
    let mut edited = answer(payload.clone(), true);
    edited.edit = Some(json!({"value": 59}));
    let unreadable = answer(json!({"operations": [{"channel_address": "SR:RF:AMP", "value": 55}]}), true);
    let empty = answer(json!({"operations": []}), true);
    for bad in [foreign, edited, unreadable, empty] {
        let error = run(&f.write, &state, &step, Some(&bad)).await.expect_err("refused");
        assert_eq!(severity(&error), ErrorSeverity::Critical, "{bad:?}: {error}");
        assert!(error.message().contains("nothing was written"), "{error}");
    }
    let rejected = run(&f.write, &state, &step, Some(&answer(payload, false))).await.expect("a rejection is an answer");
    let CapabilityOutcome::Done(update) = rejected else { panic!("done") };
    let results: ChannelWriteResults = update.context.expect("stored").get("step").expect("decodes").expect("under the key");
    assert_eq!(results.operation_result, "cancelled by the user");
    assert_eq!(f.mock.writes("SR:RF:AMP"), 0);
}

#[tokio::test]
async fn the_turn_switch_and_the_config_switch_must_both_be_on() {
    let f = fixture(operations(json!([{"channel_address": "SR:RF:AMP", "value": 55}])));
    let mut off = state(false);
    off.agent_control.control_system_writes_enabled = false;
    let error = run(&f.write, &off, &step(CHANNEL_WRITE_CAPABILITY, false), None).await.expect_err("blocked");
    assert_eq!(severity(&error), ErrorSeverity::Critical);
    assert!(f.fake.requests_for("WriteOperationsOutput").is_empty(), "the switch is checked before the model is asked");
    // An approval answered after the switch went off writes nothing either.
    let payload =
        json!({"operation_id": "op-off", "operations": [{"channel_address": "SR:RF:AMP", "value": {"type": "double", "value": 55.0}}]});
    let error =
        run(&f.write, &off, &step(CHANNEL_WRITE_CAPABILITY, false), Some(&answer(payload, true))).await.expect_err("blocked at execution");
    assert!(error.message().contains("disabled"), "{error}");
    assert_eq!(f.mock.writes("SR:RF:AMP"), 0);
}

#[tokio::test]
async fn a_read_takes_the_plans_addresses_or_the_ones_the_task_names() {
    let f = fixture(operations(json!([])));
    let outcome = run(&f.read, &state(true), &step(CHANNEL_READ_CAPABILITY, true), None).await.expect("reads");
    let CapabilityOutcome::Done(update) = outcome else { panic!("done") };
    let values: ChannelValues = update.context.expect("stored").get("step").expect("decodes").expect("under the key");
    assert_eq!(values.channel_values["SR:RF:AMP"].value, "50");
    assert_eq!(values.channel_values["SR:RF:AMP"].units.as_deref(), Some("%"));
    assert!(f.fake.requests_for("ChannelAddressExtraction").is_empty(), "the plan's addresses need no model call");

    let error = run(&f.read, &state(false), &step(CHANNEL_READ_CAPABILITY, false), None).await.expect_err("no channel named");
    assert_eq!(severity(&error), ErrorSeverity::Replanning);
    let error = run(&f.read, &state(false), &step(CHANNEL_READ_CAPABILITY, true), None).await.expect_err("input not stored");
    assert_eq!(severity(&error), ErrorSeverity::Replanning);
}

#[tokio::test]
async fn a_value_in_other_units_than_the_channels_is_refused() {
    let f = fixture(operations(json!([{"channel_address": "SR:RF:AMP", "value": 55, "units": "MV"}])));
    let error = run(&f.write, &state(false), &step(CHANNEL_WRITE_CAPABILITY, false), None).await.expect_err("refused");
    assert_eq!(severity(&error), ErrorSeverity::Critical);
    assert!(error.message().contains("in MV, but the channel is in %") && error.message().contains("nothing was written"), "{error}");
    // The same units, or none stated, pass on to the approval.
    let f = fixture(operations(json!([{"channel_address": "SR:RF:AMP", "value": 55, "units": "%"}])));
    let asked = run(&f.write, &state(false), &step(CHANNEL_WRITE_CAPABILITY, false), None).await.expect("asks");
    assert!(matches!(asked, CapabilityOutcome::NeedsApproval(_)));
}

#[test]
fn approval_cells_cannot_draw_rows_links_tags_or_reversed_text() {
    let cell = approval_cell("a | b\n| **c** <img src=x> [l](u) `d`\u{202E}FFO\u{0007}");
    assert!(!cell.contains('\n') && !cell.contains('\u{202E}') && !cell.contains('\u{0007}'), "{cell}");
    assert!(cell.contains("a \\| b") && cell.contains("\\*\\*c\\*\\*") && cell.contains("\\<img") && cell.contains("\\[l\\]"), "{cell}");
    assert_eq!(approval_cell("-0.5 MV"), "-0.5 MV", "numbers and units stay as they are");
    assert_eq!(approval_cell("&#x202E;FFO\u{200B}"), "\\&\\#x202E;FFO", "an entity is not decoded, a zero-width space is gone");
}

//! Whole control-system turns through the real agent (gateway, router, every framework node,
//! SQLite checkpoints) against the scripted OpenAI-compatible LLM server and the mock machine,
//! which counts every write that reaches it: a read turn quoting the machine's value; an
//! approved write shown with old/new value and limits, written once and verified; every gate's
//! stop (writes disabled, above max, step too large, read-only, unlisted) refused with a clear
//! report, 0 writes reaching the machine and no retry or re-plan around it; a rejected write;
//! and a turn cut off after its approval was recorded — before the write, and after the write
//! reached the machine but before it was checkpointed — continued to exactly one write.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use peregrine_agent::{Agent, AgentSettings, ClassifierMode, Services, Session, TurnOptions, TurnResult, TurnStatus};
use peregrine_capabilities::{ChannelReadCapability, ChannelWriteCapability};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_control::{
    ChannelMetadata, ChannelValue, ControlError, ControlSystem, LimitsCheck, LimitsDatabase, MockControlSystem, MockSettings, Monitor,
    Reading, Verification, VerificationLevel, WriteSettings,
};
use peregrine_core::events::EventKind;
use peregrine_core::{AgentEvent, ChannelWriteStage, Registry};
use peregrine_graph::RunEvent;
use peregrine_llm::LlmClient;
use peregrine_testkit::agent_fixture::{extracted_task, llm_config, selection as fixture_selection};
use peregrine_testkit::llm_server::{RecordedRequest, Reply, Script, ScriptedLlmServer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const LIMITS: &str = r#"{
    "_comment": "the test machine's limits",
    "SR:RF:AMP": {"min_value": 0, "max_value": 60, "max_step": 10, "verification": {"level": "readback", "tolerance_absolute": 0.01}},
    "SR:HCM:01:CURRENT": {"min_value": 0, "max_value": 1000, "max_step": 10},
    "SR:DCCT:CURRENT": {"writable": false},
    "SR:RF:MODE": {}
}"#;

/// The machine, with a switch that cuts the turn off right after a write reached it.
struct Machine {
    mock: MockControlSystem,
    cut_before_write: AtomicBool,
    cut_after_write: AtomicBool,
    cancel: CancellationToken,
}

impl ControlSystem for Machine {
    fn name(&self) -> &str {
        "test-machine"
    }
    async fn read(&self, address: &str) -> Result<Reading, ControlError> {
        self.mock.read(address).await
    }
    async fn write(
        &self,
        address: &str,
        value: &ChannelValue,
        level: VerificationLevel,
        tolerance: f64,
    ) -> Result<Verification, ControlError> {
        if self.cut_before_write.swap(false, Ordering::SeqCst) {
            // The approval is recorded; the process "dies" before the write is sent.
            self.cancel.cancel();
            std::future::pending::<()>().await;
        }
        let verification = self.mock.write(address, value, level, tolerance).await?;
        if self.cut_after_write.swap(false, Ordering::SeqCst) {
            // The write reached the machine; the process "dies" before anything is recorded.
            self.cancel.cancel();
            std::future::pending::<()>().await;
        }
        Ok(verification)
    }
    async fn metadata(&self, address: &str) -> Result<ChannelMetadata, ControlError> {
        self.mock.metadata(address).await
    }
    async fn monitor(&self, address: &str) -> Result<Monitor, ControlError> {
        self.mock.monitor(address).await
    }
}

struct Harness {
    server: ScriptedLlmServer,
    agent: Agent,
    machine: Arc<Machine>,
    _dir: tempfile::TempDir,
}

fn gates(writes_enabled: bool) -> WriteSettings {
    WriteSettings {
        writes_enabled,
        limits: LimitsCheck::On { database: LimitsDatabase::parse(LIMITS), allow_unlisted: false },
        ..WriteSettings::default()
    }
}

async fn harness(script: Script, writes: WriteSettings) -> Harness {
    let server = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let llm = LlmClient::from_config(llm_config(&server.base_url(), 10.0)).expect("client");
    let mut settings =
        AgentSettings { classifier_mode: ClassifierMode::Batched, ..AgentSettings::with_data_dir(dir.path().join("agent_data")) };
    settings.agent_control.control_system_writes_enabled = writes.writes_enabled;
    let services = Services::new(Arc::new(llm), settings);
    let machine = Arc::new(Machine {
        mock: MockControlSystem::new(MockSettings::default()),
        cut_before_write: AtomicBool::new(false),
        cut_after_write: AtomicBool::new(false),
        cancel: CancellationToken::new(),
    });
    let mut registry = Registry::new();
    registry.register(ChannelReadCapability::new(services.clone(), machine.clone())).expect("channel_read");
    registry.register(ChannelWriteCapability::new(services.clone(), machine.clone(), writes)).expect("channel_write");
    let checkpointer = SqliteCheckpointer::open(dir.path().join("agent.db")).await.expect("sqlite");
    let agent = Agent::builder(registry, services).checkpointer(Arc::new(checkpointer)).build().expect("agent");
    Harness { server, agent, machine, _dir: dir }
}

impl Harness {
    async fn send(&self, thread: &str, text: &str) -> TurnResult {
        self.agent.send(thread, text, &Session::new("ada", "cli"), TurnOptions::default()).await.expect("the message is handled")
    }

    /// Sends `text` and returns the `channel_write` events of the turn.
    async fn send_watching(&self, thread: &str, text: &str, cancel: CancellationToken) -> (TurnResult, Vec<(ChannelWriteStage, String)>) {
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let options = TurnOptions { events: Some(sender), cancel };
        let result = self.agent.send(thread, text, &Session::new("ada", "cli"), options).await.expect("the message is handled");
        let mut events = Vec::new();
        while let Ok(event) = receiver.try_recv() {
            if let RunEvent::Custom(AgentEvent { kind: EventKind::ChannelWrite { stage, channel_address, .. }, .. }) = event {
                events.push((stage, channel_address));
            }
        }
        (result, events)
    }

    fn calls(&self, schema: &str) -> Vec<RecordedRequest> {
        self.server.chat_requests().into_iter().filter(|request| request.schema_name.as_deref() == Some(schema)).collect()
    }

    fn plain_calls(&self) -> Vec<RecordedRequest> {
        self.server.chat_requests().into_iter().filter(|request| request.schema_name.is_none()).collect()
    }

    fn writes(&self, address: &str) -> u32 {
        self.machine.mock.writes(address)
    }

    async fn value(&self, address: &str) -> ChannelValue {
        self.machine.mock.read(address).await.expect("reads").value
    }
}

fn extracted(task: &str) -> Reply {
    Reply::json(extracted_task(task))
}

fn selection(names: &[&str]) -> Reply {
    Reply::json(fixture_selection(names))
}

fn plan(capability: &str, key: &str, objective: &str, output: &str) -> Reply {
    Reply::json(json!({"steps": [
        {"context_key": key, "capability": capability, "task_objective": objective, "success_criteria": "done",
         "expected_output": output, "inputs": []},
        {"context_key": "answer", "capability": "respond", "task_objective": "Tell the user", "success_criteria": "answered",
         "expected_output": "user_response", "inputs": [{output: key}]}
    ]}))
}

fn read_script() -> Script {
    Script::new()
        .on_schema("ExtractedTask", extracted("Read the beam current SR:DCCT:CURRENT"))
        .on_schema("CapabilitySelection", selection(&["channel_read"]))
        .on_schema("ExecutionPlan", plan("channel_read", "beam_current", "Read SR:DCCT:CURRENT", "CHANNEL_VALUES"))
        .on_schema("ChannelAddressExtraction", Reply::json(json!({"channels": ["SR:DCCT:CURRENT"]})))
        .on_plain(Reply::text("The beam current is 500 mA."))
}

fn write_script(address: &str, value: Value) -> Script {
    let objective = format!("Set {address} to {value}");
    Script::new()
        .on_schema("ExtractedTask", extracted(&objective))
        .on_schema("CapabilitySelection", selection(&["channel_write"]))
        .on_schema("ExecutionPlan", plan("channel_write", "set_value", &objective, "CHANNEL_WRITE_RESULTS"))
        .on_schema(
            "WriteOperationsOutput",
            Reply::json(json!({"write_operations": [{"channel_address": address, "value": value, "notes": "asked"}]})),
        )
        .on_plain(Reply::text("Done."))
}

#[tokio::test]
async fn what_is_the_beam_current_reads_the_machine_and_the_answer_quotes_it() {
    let h = harness(read_script(), gates(false)).await;
    let done = h.send("t", "What is the beam current?").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    let respond_prompt = h.plain_calls().last().map(RecordedRequest::prompt_text).expect("respond was called");
    assert!(
        respond_prompt.contains("SR:DCCT:CURRENT") && respond_prompt.contains("500") && respond_prompt.contains("mA"),
        "{respond_prompt}"
    );
    assert_eq!(h.writes("SR:DCCT:CURRENT"), 0);
}

#[tokio::test]
async fn set_the_rf_amplitude_shows_old_new_and_limits_then_writes_once_and_verifies() {
    let h = harness(write_script("SR:RF:AMP", json!(55)), gates(true)).await;
    let (asked, events) = h.send_watching("t", "Set the RF amplitude to 55", CancellationToken::new()).await;
    assert_eq!(asked.status, TurnStatus::Interrupted, "{:?}", asked.response);
    let prompt = asked.response.expect("the approval prompt");
    for shown in ["SR:RF:AMP", "| 50 %", "**55** %", "min 0, max 60, step ≤ 10", "readback ± 0.01"] {
        assert!(prompt.contains(shown), "the approval shows {shown:?}: {prompt}");
    }
    assert_eq!(events, vec![(ChannelWriteStage::AwaitingApproval, "SR:RF:AMP".to_owned())]);
    assert_eq!(h.writes("SR:RF:AMP"), 0, "nothing is written before the approval");

    let (done, events) = h.send_watching("t", "yes", CancellationToken::new()).await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.writes("SR:RF:AMP"), 1, "written exactly once");
    assert_eq!(h.value("SR:RF:AMP").await, ChannelValue::Double(55.0));
    assert_eq!(events, vec![(ChannelWriteStage::Written, "SR:RF:AMP".to_owned())]);
    assert_eq!(h.calls("WriteOperationsOutput").len(), 1, "the approved operation is written without asking the model again");
    let respond_prompt = h.plain_calls().last().map(RecordedRequest::prompt_text).expect("respond");
    assert!(
        respond_prompt.contains("\"verification_level\": \"readback\"") && respond_prompt.contains("\"verified\": true"),
        "{respond_prompt}"
    );
}

#[tokio::test]
async fn a_rejected_write_writes_nothing() {
    let h = harness(write_script("SR:RF:AMP", json!(55)), gates(true)).await;
    assert_eq!(h.send("t", "Set the RF amplitude to 55").await.status, TurnStatus::Interrupted);
    let done = h.send("t", "no, leave it as it is").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.writes("SR:RF:AMP"), 0);
    assert!(h.plain_calls().last().map(RecordedRequest::prompt_text).unwrap_or_default().contains("cancelled by the user"));
}

/// Each gate's stop: the turn ends with the error report naming why, nothing reaches the machine,
/// and nothing is retried or planned again around it.
#[tokio::test]
async fn every_gate_stops_its_write_with_a_report_and_no_retry() {
    let cases: [(&str, Value, bool, &str); 6] = [
        ("SR:RF:AMP", json!(55), false, "writes to the control system are disabled"),
        ("SR:RF:AMP", json!(70), true, "above the channel's maximum of 60"),
        ("SR:HCM:01:CURRENT", json!(600), true, "largest step"),
        ("SR:DCCT:CURRENT", json!(400), true, "read-only"),
        ("SR:OTHER:VOLT", json!(5), true, "not in the limits database"),
        ("SR:RF:AMP.DRVH", json!(100), true, "the field itself is not listed"),
    ];
    for (address, value, writes_enabled, why) in cases {
        let h = harness(write_script(address, value.clone()), gates(writes_enabled)).await;
        let (result, events) = h.send_watching("t", &format!("Set {address} to {value}"), CancellationToken::new()).await;
        assert_eq!(result.status, TurnStatus::Failed, "{address}={value}: {:?}", result.response);
        let report = result.response.expect("the error report");
        assert!(report.to_lowercase().contains(why), "{address}={value}: the report says {why:?}: {report}");
        assert!(report.contains("Nothing was written"), "{report}");
        assert_eq!(h.writes(address) + h.writes("SR:RF:AMP"), 0, "{address}={value}: no write reached the machine");
        assert!(events.iter().all(|(stage, _)| *stage == ChannelWriteStage::Blocked) && !events.is_empty(), "{events:?}");
        assert_eq!(h.calls("ExecutionPlan").len(), 1, "{address}={value}: not planned again");
        let asked = h.calls("WriteOperationsOutput").len();
        assert_eq!(asked, usize::from(writes_enabled), "{address}={value}: the model is asked once at most (never with writes off)");
        assert_eq!(h.agent.thread("t").await.expect("read").expect("exists").status, peregrine_agent::ThreadStatus::Failed);
    }
}

#[tokio::test]
async fn a_turn_cut_off_after_the_approval_is_recorded_writes_once_when_continued() {
    let h = harness(write_script("SR:RF:AMP", json!(55)), gates(true)).await;
    assert_eq!(h.send("t", "Set the RF amplitude to 55").await.status, TurnStatus::Interrupted);
    // Cut off after the answer is recorded and the gates passed again, before the write is sent.
    h.machine.cut_before_write.store(true, Ordering::SeqCst);
    let (cut, _) = h.send_watching("t", "yes", h.machine.cancel.clone()).await;
    assert_eq!(cut.status, TurnStatus::Cancelled, "{:?}", cut.response);
    assert_eq!(h.writes("SR:RF:AMP"), 0);
    let done = h.agent.continue_turn("t", TurnOptions::default()).await.expect("continues");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.writes("SR:RF:AMP"), 1, "the redelivered approval writes once");
    assert_eq!(h.value("SR:RF:AMP").await, ChannelValue::Double(55.0));
}

#[tokio::test]
async fn a_turn_cut_off_after_the_write_reached_the_machine_is_not_written_twice() {
    let h = harness(write_script("SR:RF:AMP", json!(55)), gates(true)).await;
    assert_eq!(h.send("t", "Set the RF amplitude to 55").await.status, TurnStatus::Interrupted);
    h.machine.cut_after_write.store(true, Ordering::SeqCst);
    let (cut, _) = h.send_watching("t", "yes", h.machine.cancel.clone()).await;
    assert_eq!(cut.status, TurnStatus::Cancelled, "{:?}", cut.response);
    assert_eq!(h.writes("SR:RF:AMP"), 1, "the write reached the machine before the cut");

    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let done = h.agent.continue_turn("t", TurnOptions { events: Some(sender), cancel: CancellationToken::new() }).await.expect("continues");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.writes("SR:RF:AMP"), 1, "the redelivered approval found the value written and did not write again");
    let mut stages = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        if let RunEvent::Custom(AgentEvent { kind: EventKind::ChannelWrite { stage, .. }, .. }) = event {
            stages.push(stage);
        }
    }
    assert_eq!(stages, vec![ChannelWriteStage::AlreadyWritten]);
}

#[tokio::test]
async fn a_value_the_channel_cannot_take_is_refused_before_any_write() {
    let h = harness(write_script("SR:RF:AMP", json!("high")), gates(true)).await;
    let result = h.send("t", "Set the RF amplitude to high").await;
    assert_eq!(result.status, TurnStatus::Failed, "{:?}", result.response);
    let report = result.response.expect("report");
    assert!(report.contains("takes a number"), "{report}");
    assert_eq!(h.writes("SR:RF:AMP"), 0);
}

#[tokio::test]
async fn only_the_yes_keyword_approves_a_write() {
    let h = harness(write_script("SR:RF:AMP", json!(55)), gates(true)).await;
    assert_eq!(h.send("t", "Set the RF amplitude to 55").await.status, TurnStatus::Interrupted);
    let done = h.send("t", "yes, but make it 52").await;
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(h.writes("SR:RF:AMP"), 0, "words around a yes do not approve what was shown");
    assert!(h.calls("ApprovalResponse").is_empty(), "no model reads the answer to a write approval");
    assert!(h.plain_calls().last().map(RecordedRequest::prompt_text).unwrap_or_default().contains("cancelled by the user"));
}

#[tokio::test]
async fn a_channel_value_cannot_draw_its_own_row_in_the_approval() {
    let h = harness(write_script("SR:RF:MODE", json!("ON")), gates(true)).await;
    // The channel holds text that would end the row, draw a fake one and reverse the display.
    let hostile = ChannelValue::String("x | **51** |\n| SR:RF:AMP | 50 | **51** | \u{202E}FFO &#x202E;".into());
    h.machine.mock.write("SR:RF:MODE", &hostile, VerificationLevel::None, 0.0).await.expect("set");
    let asked = h.send("t", "Set the RF mode to ON").await;
    assert_eq!(asked.status, TurnStatus::Interrupted, "{:?}", asked.response);
    let prompt = asked.response.expect("prompt");
    let rows: Vec<&str> = prompt.lines().filter(|line| line.starts_with('|')).collect();
    assert_eq!(rows.len(), 3, "header, rule and the one write: {prompt}");
    assert_eq!(rows[2].matches(" | ").count(), 4, "five cells, no more: {}", rows[2]);
    assert!(!prompt.contains('\u{202E}') && !prompt.contains(" &#x202E;"), "{prompt}");
}

/// The real IOC of `scripts/epics-ioc.sh`, when the test command started it.
fn ioc() -> Option<String> {
    let server = std::env::var("PEREGRINE_TEST_CA_SERVER").ok();
    if server.is_none() {
        assert!(std::env::var_os("PEREGRINE_REQUIRE_IOC").is_none(), "PEREGRINE_REQUIRE_IOC is set but PEREGRINE_TEST_CA_SERVER is not");
        eprintln!("PEREGRINE_TEST_CA_SERVER is not set: no IOC to test against (scripts/test.sh starts one)");
    }
    server
}

async fn ioc_agent(server: &str, script: Script, writes_enabled: bool) -> (ScriptedLlmServer, Agent, tempfile::TempDir) {
    use peregrine_control::epics::{EpicsSettings, LazyEpicsControlSystem};
    let llm_server = ScriptedLlmServer::start(script).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let llm = LlmClient::from_config(llm_config(&llm_server.base_url(), 10.0)).expect("client");
    let mut settings =
        AgentSettings { classifier_mode: ClassifierMode::Batched, ..AgentSettings::with_data_dir(dir.path().join("agent_data")) };
    settings.agent_control.control_system_writes_enabled = writes_enabled;
    let services = Services::new(Arc::new(llm), settings);
    let epics = Arc::new(LazyEpicsControlSystem::new(EpicsSettings {
        timeout: std::time::Duration::from_secs(2),
        addresses: vec![server.to_owned()],
        server_port: 5064,
    }));
    let limits = r#"{
        "TURN:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10, "verification": {"level": "readback", "tolerance_absolute": 0.01}},
        "TEST:BEAM:CURRENT": {"writable": false}
    }"#;
    let writes = WriteSettings {
        writes_enabled,
        limits: LimitsCheck::On { database: LimitsDatabase::parse(limits), allow_unlisted: false },
        ..WriteSettings::default()
    };
    let mut registry = Registry::new();
    registry.register(ChannelReadCapability::new(services.clone(), epics.clone())).expect("channel_read");
    registry.register(ChannelWriteCapability::new(services.clone(), epics, writes)).expect("channel_write");
    let checkpointer = SqliteCheckpointer::open(dir.path().join("agent.db")).await.expect("sqlite");
    let agent = Agent::builder(registry, services).checkpointer(Arc::new(checkpointer)).build().expect("agent");
    (llm_server, agent, dir)
}

/// A second client to the IOC, for what the test checks on the IOC's side.
async fn ioc_client(server: &str) -> peregrine_control::epics::EpicsControlSystem {
    let settings = peregrine_control::epics::EpicsSettings {
        timeout: std::time::Duration::from_secs(2),
        addresses: vec![server.to_owned()],
        server_port: 5064,
    };
    peregrine_control::epics::EpicsControlSystem::connect(settings).await.expect("CA client")
}

async fn puts(ioc: &peregrine_control::epics::EpicsControlSystem) -> f64 {
    ioc.read("TURN:RF:AMP:SP:PUTS").await.expect("the put counter").value.as_f64().expect("a number")
}

#[tokio::test]
async fn the_beam_current_comes_from_the_real_ioc() {
    let Some(server) = ioc() else { return };
    let script = Script::new()
        .on_schema("ExtractedTask", extracted("Read the beam current TEST:BEAM:CURRENT"))
        .on_schema("CapabilitySelection", selection(&["channel_read"]))
        .on_schema("ExecutionPlan", plan("channel_read", "beam_current", "Read TEST:BEAM:CURRENT", "CHANNEL_VALUES"))
        .on_schema("ChannelAddressExtraction", Reply::json(json!({"channels": ["TEST:BEAM:CURRENT"]})))
        .on_plain(Reply::text("The beam current is about 500 mA."));
    let (llm, agent, _dir) = ioc_agent(&server, script, false).await;
    let done = agent.send("t", "What is the beam current?", &Session::new("ada", "cli"), TurnOptions::default()).await.expect("handled");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    let thread = agent.thread("t").await.expect("read").expect("exists");
    let values: peregrine_capabilities::ChannelValues =
        thread.state().capability_context_data.get("beam_current").expect("decodes").expect("stored under the step key");
    let reading = &values.channel_values["TEST:BEAM:CURRENT"];
    let number = reading.typed_value.as_f64().expect("a number");
    assert!((490.0..=510.0).contains(&number) && reading.units.as_deref() == Some("mA"), "{reading:?}");
    let respond_prompt = llm.chat_requests().into_iter().rfind(|request| request.schema_name.is_none()).expect("respond");
    assert!(respond_prompt.prompt_text().contains(&reading.value), "the answer is built on the IOC's value");
}

/// The acceptance case on the real IOC: an approved write reaches it exactly once and reads
/// back; above max, a step too large, a read-only channel and writes disabled reach it never
/// (counted by the IOC's own put counter).
#[tokio::test]
async fn writes_reach_the_real_ioc_once_when_approved_and_never_when_a_gate_stops_them() {
    let Some(server) = ioc() else { return };
    let ca = ioc_client(&server).await;
    let current = ca.read("TURN:RF:AMP:SP").await.expect("read").value.as_f64().expect("a number");
    let target = if current <= 50.0 { current + 5.0 } else { current - 5.0 };
    let before = puts(&ca).await;

    let (_llm, agent, _dir) = ioc_agent(&server, write_script("TURN:RF:AMP:SP", json!(target)), true).await;
    let session = Session::new("ada", "cli");
    let asked = agent.send("t", "Set the RF amplitude", &session, TurnOptions::default()).await.expect("handled");
    assert_eq!(asked.status, TurnStatus::Interrupted, "{:?}", asked.response);
    let prompt = asked.response.expect("prompt");
    assert!(prompt.contains("TURN:RF:AMP:SP") && prompt.contains("MV") && prompt.contains("max 60"), "{prompt}");
    assert_eq!(puts(&ca).await, before, "nothing reaches the IOC before the approval");
    let done = agent.send("t", "yes", &session, TurnOptions::default()).await.expect("handled");
    assert_eq!(done.status, TurnStatus::Completed, "{:?}", done.response);
    assert_eq!(puts(&ca).await, before + 1.0, "written exactly once");
    let now = ca.read("TURN:RF:AMP:SP").await.expect("read").value.as_f64().expect("a number");
    assert!((now - target).abs() < 1e-9, "the IOC holds {now}, not {target}");

    let stopped = [
        ("TURN:RF:AMP:SP", json!(70), true, "maximum of 60"),
        ("TURN:RF:AMP:SP", json!(now - 20.0), true, "largest step"),
        ("TEST:BEAM:CURRENT", json!(400), true, "read-only"),
        ("TURN:RF:AMP:SP", json!(now + 1.0), false, "disabled"),
        ("TEST:MAG:QF1:STEPS", json!(11), true, "not in the limits database"),
    ];
    for (address, value, writes_enabled, why) in stopped {
        let (llm, agent, _dir) = ioc_agent(&server, write_script(address, value.clone()), writes_enabled).await;
        let result = agent.send("t", "Set it", &session, TurnOptions::default()).await.expect("handled");
        assert_eq!(result.status, TurnStatus::Failed, "{address}={value}: {:?}", result.response);
        let report = result.response.expect("report");
        assert!(report.contains(why) && report.contains("Nothing was written"), "{address}={value}: {report}");
        assert_eq!(llm.chat_requests().iter().filter(|request| request.schema_name.as_deref() == Some("ExecutionPlan")).count(), 1);
    }
    assert_eq!(puts(&ca).await, before + 1.0, "no stopped write reached the IOC");
}

/// An IOC of this test's own (so killing it disturbs no other test), on its own CA port.
struct PrivateIoc {
    child: std::process::Child,
    server: String,
    _dir: tempfile::TempDir,
}

impl PrivateIoc {
    fn start(port: u16) -> Option<Self> {
        let bin = std::env::var("EPICS_BIN").ok()?;
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("private.db");
        std::fs::write(
            &db,
            "record(ai, \"PRIV:BEAM:CURRENT\") {\n  field(PINI, \"YES\")\n  field(VAL, \"321\")\n  field(EGU, \"mA\")\n}\n",
        )
        .expect("db");
        let child = std::process::Command::new(std::path::Path::new(&bin).join("softIoc"))
            .args(["-S", "-d"])
            .arg(&db)
            .env("EPICS_CAS_INTF_ADDR_LIST", "127.0.0.1")
            .env("EPICS_CAS_SERVER_PORT", port.to_string())
            .env("EPICS_CAS_AUTO_BEACON_ADDR_LIST", "NO")
            .env("EPICS_CAS_BEACON_ADDR_LIST", "127.0.0.1")
            .env("EPICS_CAS_BEACON_PORT", (port + 1).to_string())
            .env("EPICS_CA_AUTO_ADDR_LIST", "NO")
            .env("EPICS_CA_ADDR_LIST", "127.0.0.1")
            .env("EPICS_CA_REPEATER_PORT", (port + 1).to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("softIoc starts");
        Some(Self { child, server: format!("127.0.0.1:{port}"), _dir: dir })
    }
}

impl Drop for PrivateIoc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn an_ioc_lost_mid_conversation_is_retried_then_reported_clearly() {
    if ioc().is_none() {
        return;
    }
    let Some(mut private) = PrivateIoc::start(15264) else {
        assert!(std::env::var_os("PEREGRINE_REQUIRE_IOC").is_none(), "PEREGRINE_REQUIRE_IOC is set but EPICS_BIN is not");
        eprintln!("EPICS_BIN is not set: no softIoc to start");
        return;
    };
    // Ready when a client reads it: each try waits at most the connector's timeout.
    let ca = ioc_client(&private.server).await;
    let mut tries = 0;
    while ca.read("PRIV:BEAM:CURRENT").await.is_err() {
        tries += 1;
        assert!(tries < 15, "the private IOC did not start");
    }
    let script = Script::new()
        .on_schema("ExtractedTask", extracted("Read PRIV:BEAM:CURRENT"))
        .on_schema("CapabilitySelection", selection(&["channel_read"]))
        .on_schema("ExecutionPlan", plan("channel_read", "beam_current", "Read PRIV:BEAM:CURRENT", "CHANNEL_VALUES"))
        .on_schema("ChannelAddressExtraction", Reply::json(json!({"channels": ["PRIV:BEAM:CURRENT"]})))
        .on_plain(Reply::text("321 mA."));
    let (llm, agent, _dir) = ioc_agent(&private.server, script, false).await;
    let session = Session::new("ada", "cli");
    let first = agent.send("t", "What is the beam current?", &session, TurnOptions::default()).await.expect("handled");
    assert_eq!(first.status, TurnStatus::Completed, "{:?}", first.response);

    private.child.kill().expect("kill the IOC");
    private.child.wait().expect("reaped");
    let reads_before = llm.chat_requests().len();
    let lost = agent.send("t", "And now?", &session, TurnOptions::default()).await.expect("handled");
    assert_eq!(lost.status, TurnStatus::Failed, "{:?}", lost.response);
    let report = lost.response.expect("the error report");
    assert!(report.contains("PRIV:BEAM:CURRENT") && report.contains("disconnected"), "{report}");
    assert!(report.contains("the agent retried it"), "the report says the read was retried: {report}");
    assert!(!report.contains("ran once"), "{report}");
    let _ = reads_before;
}

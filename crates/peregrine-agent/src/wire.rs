//! One JSON form of what a turn reports, for every interface: a run's events (the native API's
//! SSE events, the command line's `--json` lines), a pending approval and how one was answered,
//! and one table of what a framework node starting means to the person waiting.

use peregrine_core::AgentEvent;
use peregrine_graph::{PendingInterrupt, RunEvent};
use serde_json::{Map, Value, json};

use crate::agent::AnsweredApproval;
use crate::router::{CLASSIFIER, ERROR, ORCHESTRATOR, TASK_EXTRACTION};

/// What a framework node starting means to the person waiting (`None` for capabilities, which
/// report their own steps, and for unknown nodes).
pub fn node_activity(node: &str) -> Option<&'static str> {
    Some(match node {
        TASK_EXTRACTION => "understanding the request",
        CLASSIFIER => "choosing capabilities",
        ORCHESTRATOR => "planning",
        ERROR => "analysing the error",
        peregrine_core::plan::RESPOND => "writing the answer",
        peregrine_core::plan::CLARIFY => "asking for clarification",
        _ => return None,
    })
}

/// `value` without the file paths an approval payload names on the disk of the process that
/// asked (a pending plan's folder and file).
pub fn strip_local_paths(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.remove("pending_plans_dir");
            fields.remove("plan_file_path");
            fields.values_mut().for_each(strip_local_paths);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_local_paths),
        _ => {}
    }
}

/// A pending approval: its id and digest (an answer quotes them), the node that asked, the
/// approval type, the text shown to the person and what is to be approved (without the
/// envelope the approval node wraps it in, nor local file paths).
pub fn interrupt_json(interrupt: &PendingInterrupt) -> Value {
    let text = |key: &str| interrupt.payload.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut payload = interrupt.payload.get("resume_payload").unwrap_or(&interrupt.payload).clone();
    strip_local_paths(&mut payload);
    json!({
        "id": interrupt.id,
        "digest": interrupt.digest,
        "node": interrupt.node,
        "approval_type": text("approval_type"),
        "message": text("user_message"),
        "payload": payload,
    })
}

/// How a pending approval was answered: `{interrupt_id, outcome, read_by}` (`read_by`:
/// `keyword`, `llm`, `fallback`, or null for an explicit answer).
pub fn approval_json(answered: &AnsweredApproval) -> Value {
    json!({
        "interrupt_id": answered.interrupt_id,
        "outcome": answered.outcome.as_str(),
        "read_by": answered.method.map(|method| method.as_str()),
    })
}

/// An event's name and data; `None` for events an interface has no use for.
pub fn event_json(event: &RunEvent<AgentEvent>) -> Option<(&'static str, Value)> {
    let named = match event {
        RunEvent::RunStarted { thread_id, run_id } => ("run_started", json!({"thread_id": thread_id, "run_id": run_id})),
        RunEvent::NodeStarted { node, step } => ("node_started", json!({"node": node, "step": step})),
        RunEvent::Waiting { node, delay } => ("waiting", json!({"node": node, "delay_ms": millis(*delay)})),
        RunEvent::NodeFinished { node, step, checkpoint_id, duration } => {
            ("node_finished", json!({"node": node, "step": step, "checkpoint_id": checkpoint_id, "duration_ms": millis(*duration)}))
        }
        RunEvent::Interrupted { interrupt } => ("interrupt", interrupt_json(interrupt)),
        RunEvent::RunFinished { last_node } => ("run_finished", json!({"last_node": last_node})),
        RunEvent::Custom(event) => return agent_event_json(event),
        _ => return None,
    };
    Some(named)
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An agent event under its kind's name (`plan_created`, `capability_start`, …; answer pieces
/// as `token`), with its timestamp and component; a kind without a name of its own is `event`
/// with the kind in `kind`.
fn agent_event_json(event: &AgentEvent) -> Option<(&'static str, Value)> {
    let Value::Object(mut fields) = serde_json::to_value(event).ok()? else { return None };
    let kind = fields.remove("event");
    let name = match kind.as_ref().and_then(Value::as_str)? {
        "llm_token" => "token",
        "status" => "status",
        "phase_start" => "phase_start",
        "phase_complete" => "phase_complete",
        "task_extracted" => "task_extracted",
        "capabilities_selected" => "capabilities_selected",
        "plan_created" => "plan_created",
        "capability_start" => "capability_start",
        "capability_complete" => "capability_complete",
        "llm_request" => "llm_request",
        "llm_response" => "llm_response",
        "approval_required" => "approval_required",
        "approval_received" => "approval_received",
        "error" => "error",
        _ => "event",
    };
    if name == "event" {
        fields.insert("kind".to_owned(), kind.unwrap_or(Value::Null));
    }
    Some((name, Value::Object(Map::from_iter(fields))))
}

/// The event as one object with its name in `type` (the command line's `--json` lines).
pub fn typed_event_json(event: &RunEvent<AgentEvent>) -> Option<Value> {
    let (name, data) = event_json(event)?;
    Some(match data {
        Value::Object(mut fields) => {
            fields.insert("type".to_owned(), Value::String(name.to_owned()));
            Value::Object(fields)
        }
        other => json!({"type": name, "data": other}),
    })
}

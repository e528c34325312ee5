//! Runs of the native API: each is a turn (a message, an approval answer or the continuation of
//! a cut-off run) executing in its own task, with every event it produced kept in order so that
//! any number of clients can follow it, and reconnect, with `Last-Event-ID`.
//!
//! Runs live in the process that started them: another process serving the same store sees the
//! thread (its state, its status, its pending approval) but not this process's run records.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use peregrine_agent::{TurnResult, TurnStatus};
use peregrine_core::AgentEvent;
use peregrine_graph::{PendingInterrupt, RunEvent};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// How many finished runs a process keeps (the oldest are forgotten first).
pub(crate) const MAX_FINISHED_RUNS: usize = 1000;

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunKind {
    /// A user message.
    Message,
    /// An answer to the pending approval.
    Resume,
    /// The continuation of a cut-off run.
    Continue,
}

impl RunKind {
    fn as_str(self) -> &'static str {
        match self {
            RunKind::Message => "message",
            RunKind::Resume => "resume",
            RunKind::Continue => "continue",
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunStatus {
    /// Still going.
    Running,
    /// Ended with an answer (or a reply, or a state change).
    Success,
    /// Ended with the error node's report, or could not run.
    Error,
    /// Paused for an approval.
    Interrupted,
    /// Cancelled; the thread keeps its last checkpoint.
    Cancelled,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Error => "error",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

/// One event of a run as sent over SSE.
#[derive(Debug, Clone)]
pub(crate) struct LoggedEvent {
    /// 1, 2, 3, … (the SSE `id`).
    pub seq: u64,
    /// The SSE `event` name.
    pub name: &'static str,
    /// The SSE `data`, already serialized.
    pub data: Arc<str>,
}

#[derive(Debug)]
struct RunLog {
    events: Vec<LoggedEvent>,
    status: RunStatus,
    started: bool,
    finished_at: Option<DateTime<Utc>>,
    result: Option<Value>,
    error: Option<ApiError>,
}

/// A run and everything it has produced so far.
#[derive(Debug)]
pub(crate) struct Run {
    /// The run id.
    pub id: String,
    /// Its thread.
    pub thread_id: String,
    /// What it does.
    pub kind: RunKind,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// Cancels it.
    pub cancel: CancellationToken,
    log: Mutex<RunLog>,
    /// The number of events logged, plus one once the run has ended.
    changed: watch::Sender<u64>,
}

impl Run {
    fn new(thread_id: &str, kind: RunKind) -> Self {
        let id = uuid::Uuid::new_v4().to_string();
        let log = RunLog { events: Vec::new(), status: RunStatus::Running, started: false, finished_at: None, result: None, error: None };
        let run = Self {
            id: id.clone(),
            thread_id: thread_id.to_owned(),
            kind,
            created_at: Utc::now(),
            cancel: CancellationToken::new(),
            log: Mutex::new(log),
            changed: watch::channel(0).0,
        };
        run.push("metadata", &json!({"run_id": id, "thread_id": thread_id}));
        run
    }

    fn log(&self) -> MutexGuard<'_, RunLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, name: &'static str, data: &Value) {
        let mut log = self.log();
        let seq = log.events.len() as u64 + 1;
        log.events.push(LoggedEvent { seq, name, data: Arc::from(data.to_string()) });
        drop(log);
        self.changed.send_modify(|count| *count += 1);
    }

    /// Logs an engine or agent event (the ones an interface has no use for are dropped).
    pub(crate) fn record(&self, event: &RunEvent<AgentEvent>) {
        if matches!(event, RunEvent::RunStarted { .. }) {
            self.log().started = true;
        }
        if let Some((name, data)) = event_json(event) {
            self.push(name, &data);
        }
        if matches!(event, RunEvent::RunStarted { .. }) {
            // Wakes whoever waits for the run to hold its thread even when the event was the
            // first one after `metadata`.
            self.changed.send_modify(|_| {});
        }
    }

    /// Ends the run with the turn's result or an error, and logs the final `end` event.
    pub(crate) fn finish(&self, outcome: Result<TurnResult, ApiError>) {
        let mut log = self.log();
        if log.finished_at.is_some() {
            return;
        }
        match outcome {
            Ok(result) => {
                log.status = match result.status {
                    TurnStatus::Failed => RunStatus::Error,
                    TurnStatus::Interrupted => RunStatus::Interrupted,
                    TurnStatus::Cancelled => RunStatus::Cancelled,
                    _ => RunStatus::Success,
                };
                log.result = Some(result_json(&result));
            }
            Err(error) => {
                log.status = if self.cancel.is_cancelled() { RunStatus::Cancelled } else { RunStatus::Error };
                log.error = Some(error);
            }
        }
        log.finished_at = Some(Utc::now());
        drop(log);
        let end = self.json();
        self.push("end", &end);
    }

    /// Whether the run has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.log().finished_at.is_some()
    }

    /// Whether the engine started the run (it held its thread).
    pub(crate) fn has_started(&self) -> bool {
        self.log().started
    }

    /// Whether the run holds its thread (the engine started it), or has already ended.
    pub(crate) fn started_or_finished(&self) -> bool {
        let log = self.log();
        log.started || log.finished_at.is_some()
    }

    /// The error it ended with, if any.
    pub(crate) fn error(&self) -> Option<ApiError> {
        self.log().error.clone()
    }

    /// The events after `seq`.
    pub(crate) fn events_after(&self, seq: u64) -> Vec<LoggedEvent> {
        let log = self.log();
        let from = usize::try_from(seq).unwrap_or(usize::MAX).min(log.events.len());
        log.events[from..].to_vec()
    }

    /// A receiver that sees every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits until `done(self)` holds.
    pub(crate) async fn wait_until(&self, done: impl Fn(&Run) -> bool) {
        let mut changes = self.subscribe();
        while !done(self) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// The Run object of the API.
    pub(crate) fn json(&self) -> Value {
        let log = self.log();
        json!({
            "run_id": self.id,
            "thread_id": self.thread_id,
            "kind": self.kind.as_str(),
            "status": log.status.as_str(),
            "created_at": self.created_at.to_rfc3339(),
            "finished_at": log.finished_at.map(|at| at.to_rfc3339()),
            "result": log.result,
            "error": log.error.as_ref().map(|error| json!({"message": error.message, "code": error.code, "http_status": error.status.as_u16()})),
        })
    }
}

/// The runs this process knows: the running ones and the last [`MAX_FINISHED_RUNS`] finished.
#[derive(Debug, Default)]
pub(crate) struct RunRegistry {
    inner: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    runs: HashMap<String, Arc<Run>>,
    order: VecDeque<String>,
}

impl RunRegistry {
    fn inner(&self) -> MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new run of `thread_id`.
    pub(crate) fn start(&self, thread_id: &str, kind: RunKind) -> Arc<Run> {
        let run = Arc::new(Run::new(thread_id, kind));
        let mut inner = self.inner();
        inner.runs.insert(run.id.clone(), Arc::clone(&run));
        inner.order.push_back(run.id.clone());
        // Forget the oldest finished runs beyond the limit (running ones are always kept).
        let finished = inner.runs.values().filter(|run| run.is_finished()).count();
        if finished > MAX_FINISHED_RUNS {
            let mut excess = finished - MAX_FINISHED_RUNS;
            let mut kept = VecDeque::with_capacity(inner.order.len());
            while let Some(id) = inner.order.pop_front() {
                let forget = excess > 0 && inner.runs.get(&id).is_none_or(|run| run.is_finished());
                if forget {
                    inner.runs.remove(&id);
                    excess -= 1;
                } else {
                    kept.push_back(id);
                }
            }
            inner.order = kept;
        }
        run
    }

    /// Forgets a run (one that never started).
    pub(crate) fn forget(&self, run_id: &str) {
        let mut inner = self.inner();
        inner.runs.remove(run_id);
        inner.order.retain(|id| id != run_id);
    }

    /// Forgets every run of a deleted thread.
    pub(crate) fn forget_thread(&self, thread_id: &str) {
        let mut inner = self.inner();
        inner.runs.retain(|_, run| run.thread_id != thread_id);
        let Registry { runs, order } = &mut *inner;
        order.retain(|id| runs.contains_key(id));
    }

    /// The run `run_id` of `thread_id`.
    pub(crate) fn get(&self, thread_id: &str, run_id: &str) -> Option<Arc<Run>> {
        self.inner().runs.get(run_id).filter(|run| run.thread_id == thread_id).cloned()
    }

    /// The runs of `thread_id`, newest first.
    pub(crate) fn of_thread(&self, thread_id: &str) -> Vec<Arc<Run>> {
        let inner = self.inner();
        inner.order.iter().rev().filter_map(|id| inner.runs.get(id)).filter(|run| run.thread_id == thread_id).cloned().collect()
    }

    /// The running run of `thread_id`, if any.
    pub(crate) fn active(&self, thread_id: &str) -> Option<Arc<Run>> {
        self.inner().runs.values().find(|run| run.thread_id == thread_id && !run.is_finished()).cloned()
    }
}

/// The API's form of a pending approval.
pub(crate) fn interrupt_json(interrupt: &PendingInterrupt) -> Value {
    let text = |key: &str| interrupt.payload.get(key).and_then(Value::as_str).map(str::to_owned);
    // What is to be approved (a plan approval's `execution_plan`, …), without the envelope the
    // approval node wraps it in, nor the paths of files on the server's disk.
    let mut payload = interrupt.payload.get("resume_payload").unwrap_or(&interrupt.payload).clone();
    if let Value::Object(fields) = &mut payload {
        fields.remove("pending_plans_dir");
        fields.remove("plan_file_path");
    }
    json!({
        "id": interrupt.id,
        "node": interrupt.node,
        "approval_type": text("approval_type"),
        "message": text("user_message"),
        "payload": payload,
    })
}

fn result_json(result: &TurnResult) -> Value {
    let status = match result.status {
        TurnStatus::Completed => "completed",
        TurnStatus::Failed => "failed",
        TurnStatus::Interrupted => "interrupted",
        TurnStatus::Cancelled => "cancelled",
        TurnStatus::Updated => "updated",
        TurnStatus::Reply => "reply",
        TurnStatus::InterfaceCommand => "interface_command",
        TurnStatus::Exit => "exit",
    };
    let response = result.response.clone().or_else(|| match result.status {
        TurnStatus::InterfaceCommand => Some("This command works only in the terminal chat (peregrine chat).".to_owned()),
        TurnStatus::Exit => Some("There is nothing to leave here; start a new thread instead.".to_owned()),
        _ => None,
    });
    json!({"status": status, "response": response, "interrupt": result.interrupt.as_ref().map(interrupt_json)})
}

/// The SSE name and data of an event; `None` for events an interface has no use for.
fn event_json(event: &RunEvent<AgentEvent>) -> Option<(&'static str, Value)> {
    let named = match event {
        RunEvent::RunStarted { thread_id, run_id } => ("run_started", json!({"thread_id": thread_id, "run_id": run_id})),
        RunEvent::NodeStarted { node, step } => ("node_started", json!({"node": node, "step": step})),
        RunEvent::Waiting { node, delay } => ("waiting", json!({"node": node, "delay_ms": delay.as_millis()})),
        RunEvent::NodeFinished { node, step, checkpoint_id, duration } => {
            ("node_finished", json!({"node": node, "step": step, "checkpoint_id": checkpoint_id, "duration_ms": duration.as_millis()}))
        }
        RunEvent::Interrupted { interrupt } => ("interrupt", interrupt_json(interrupt)),
        RunEvent::RunFinished { last_node } => ("run_finished", json!({"last_node": last_node})),
        RunEvent::Custom(event) => return agent_event_json(event),
        _ => return None,
    };
    Some(named)
}

/// An agent event under its kind's name (`plan_created`, `capability_start`, …; answer pieces
/// as `token`), with its timestamp and component.
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use peregrine_core::events::EventKind;

    use super::*;

    #[test]
    fn events_are_numbered_and_named_by_kind() {
        let run = Run::new("t-1", RunKind::Message);
        run.record(&RunEvent::RunStarted { thread_id: "t-1".into(), run_id: "engine".into() });
        run.record(&RunEvent::NodeFinished {
            node: "classifier".into(),
            step: 2,
            checkpoint_id: Some(7),
            duration: Duration::from_millis(12),
        });
        run.record(&RunEvent::Custom(AgentEvent::new("respond", EventKind::LlmToken { role: "response".into(), content: "Hi".into() })));
        let events = run.events_after(0);
        let names: Vec<_> = events.iter().map(|event| event.name).collect();
        assert_eq!(names, ["metadata", "run_started", "node_finished", "token"]);
        assert_eq!(events.iter().map(|event| event.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
        let token: Value = serde_json::from_str(&events[3].data).unwrap();
        assert_eq!((token["content"].as_str(), token["role"].as_str()), (Some("Hi"), Some("response")));
        assert_eq!(token["component"], "respond");
        let finished: Value = serde_json::from_str(&events[2].data).unwrap();
        assert_eq!((finished["duration_ms"].as_u64(), finished["checkpoint_id"].as_u64()), (Some(12), Some(7)));
        assert_eq!(run.events_after(3).len(), 1);
        assert!(run.events_after(99).is_empty());
        assert!(run.started_or_finished() && !run.is_finished());
    }

    #[test]
    fn the_end_event_carries_the_run() {
        let run = Run::new("t-1", RunKind::Resume);
        run.finish(Err(ApiError::thread_busy()));
        run.finish(Err(ApiError::server_error("again")));
        let events = run.events_after(0);
        assert_eq!(events.last().map(|event| event.name), Some("end"));
        let end: Value = serde_json::from_str(&events[events.len() - 1].data).unwrap();
        assert_eq!(end["status"], "error");
        assert_eq!(end["error"]["code"], "thread_busy", "the first outcome counts");
        assert_eq!(end["kind"], "resume");
    }

    #[test]
    fn finished_runs_are_forgotten_beyond_the_limit_running_ones_never() {
        let registry = RunRegistry::default();
        let running = registry.start("busy", RunKind::Message);
        for _ in 0..MAX_FINISHED_RUNS + 5 {
            registry.start("t", RunKind::Message).finish(Err(ApiError::thread_busy()));
        }
        registry.start("t", RunKind::Message);
        assert!(registry.get("busy", &running.id).is_some());
        assert!(registry.get("t", &running.id).is_none(), "a run is found only under its own thread");
        assert_eq!(registry.active("busy").map(|run| run.id.clone()), Some(running.id.clone()));
        let kept = registry.of_thread("t");
        assert_eq!(kept.iter().filter(|run| run.is_finished()).count(), MAX_FINISHED_RUNS);
        registry.forget_thread("t");
        assert!(registry.of_thread("t").is_empty());
        assert_eq!(registry.of_thread("busy").len(), 1);
    }
}

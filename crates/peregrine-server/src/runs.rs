//! Runs of the native API: each is a turn (a message, an approval answer or the continuation of
//! a cut-off run) executing in its own task, with every event it produced kept in order so that
//! any number of clients can follow it, and reconnect, with `Last-Event-ID`.
//!
//! Runs live in the process that started them: another process serving the same store sees the
//! thread (its state, its status, its pending approval) but not this process's run records.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use peregrine_agent::wire::event_json;
pub(crate) use peregrine_agent::wire::{interrupt_json, strip_local_paths as strip_server_paths};
use peregrine_agent::{TurnResult, TurnStatus};
use peregrine_core::AgentEvent;
use peregrine_graph::RunEvent;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::Redact;
use crate::error::ApiError;

/// How many finished runs a process keeps (the ones that ended first are forgotten first).
pub(crate) const MAX_FINISHED_RUNS: usize = 1000;
/// How many bytes of events the finished runs of a process keep at most.
pub(crate) const MAX_FINISHED_BYTES: usize = 128 * 1024 * 1024;
/// A finished run is kept at least this long whatever the limits (a client waiting for it or
/// reconnecting to its stream finds it).
pub(crate) const MIN_RETENTION: std::time::Duration = std::time::Duration::from_secs(60);

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
    /// The bytes of `events`' data.
    bytes: usize,
    status: RunStatus,
    started: bool,
    finished_at: Option<DateTime<Utc>>,
    result: Option<Value>,
    error: Option<ApiError>,
}

/// A run and everything it has produced so far.
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
    /// Bumped on every change (an event logged, the run started or ended).
    changed: watch::Sender<u64>,
    /// Removes the configuration's secrets from everything the run logs.
    redact: Redact,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("id", &self.id).field("thread_id", &self.thread_id).field("kind", &self.kind).finish_non_exhaustive()
    }
}

impl Run {
    fn new(thread_id: &str, kind: RunKind, redact: Redact, cancel: CancellationToken) -> Self {
        let id = uuid::Uuid::new_v4().to_string();
        let log = RunLog {
            events: Vec::new(),
            bytes: 0,
            status: RunStatus::Running,
            started: false,
            finished_at: None,
            result: None,
            error: None,
        };
        let run = Self {
            id: id.clone(),
            thread_id: thread_id.to_owned(),
            kind,
            created_at: Utc::now(),
            cancel,
            log: Mutex::new(log),
            changed: watch::channel(0).0,
            redact,
        };
        let mut log = run.log();
        run.push_locked(&mut log, "metadata", &json!({"run_id": id, "thread_id": thread_id}));
        drop(log);
        run
    }

    fn log(&self) -> MutexGuard<'_, RunLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs an event (its data redacted); the caller wakes the followers.
    fn push_locked(&self, log: &mut RunLog, name: &'static str, data: &Value) {
        let seq = log.events.len() as u64 + 1;
        let data: Arc<str> = Arc::from((self.redact)(&data.to_string()));
        log.bytes += data.len();
        log.events.push(LoggedEvent { seq, name, data });
    }

    fn push(&self, name: &'static str, data: &Value) {
        let mut log = self.log();
        self.push_locked(&mut log, name, data);
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

    /// Ends the run with the turn's result or an error, and logs the final `end` event (in one
    /// step: a run that is finished always has `end` as its last event).
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
                log.result = Some(redact_value(&self.redact, &result_json(&result)));
            }
            Err(error) => {
                log.status = if self.cancel.is_cancelled() { RunStatus::Cancelled } else { RunStatus::Error };
                log.error = Some(error.redacted(&self.redact));
            }
        }
        log.finished_at = Some(Utc::now());
        let end = self.json_of(&log);
        self.push_locked(&mut log, "end", &end);
        drop(log);
        self.changed.send_modify(|count| *count += 1);
    }

    /// When the run ended.
    fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.log().finished_at
    }

    /// The bytes of its events.
    fn bytes(&self) -> usize {
        self.log().bytes
    }

    /// The number of its last event.
    pub(crate) fn last_seq(&self) -> u64 {
        self.log().events.len() as u64
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
        self.json_of(&log)
    }

    fn json_of(&self, log: &RunLog) -> Value {
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

/// The runs this process knows: the running ones and the finished ones within
/// [`MAX_FINISHED_RUNS`] and [`MAX_FINISHED_BYTES`] (those that ended first are forgotten first,
/// none within [`MIN_RETENTION`] of its end).
pub(crate) struct RunRegistry {
    inner: Mutex<Registry>,
    redact: Redact,
    /// The parent of every run's cancel token: cancelled when the server stops.
    stopping: CancellationToken,
}

impl std::fmt::Debug for RunRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRegistry").field("runs", &self.inner().runs.len()).finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Registry {
    runs: HashMap<String, Arc<Run>>,
    /// Run ids in the order they were accepted.
    order: VecDeque<String>,
}

impl RunRegistry {
    /// A registry whose runs log through `redact` and are cancelled with `stopping`.
    pub(crate) fn new(redact: Redact, stopping: CancellationToken) -> Self {
        Self { inner: Mutex::new(Registry::default()), redact, stopping }
    }

    fn inner(&self) -> MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new run of `thread_id`.
    pub(crate) fn start(&self, thread_id: &str, kind: RunKind) -> Arc<Run> {
        let run = Arc::new(Run::new(thread_id, kind, Arc::clone(&self.redact), self.stopping.child_token()));
        let mut inner = self.inner();
        Self::evict(&mut inner, Utc::now());
        inner.runs.insert(run.id.clone(), Arc::clone(&run));
        inner.order.push_back(run.id.clone());
        run
    }

    /// Forgets the finished runs beyond the limits, those that ended first first.
    fn evict(inner: &mut Registry, now: DateTime<Utc>) {
        let mut finished: Vec<(DateTime<Utc>, usize, String)> =
            inner.runs.values().filter_map(|run| run.finished_at().map(|at| (at, run.bytes(), run.id.clone()))).collect();
        let (mut count, mut bytes) = (finished.len(), finished.iter().map(|(_, bytes, _)| bytes).sum::<usize>());
        if count <= MAX_FINISHED_RUNS && bytes <= MAX_FINISHED_BYTES {
            return;
        }
        finished.sort();
        let keep_after = now - chrono::Duration::from_std(MIN_RETENTION).unwrap_or_default();
        for (at, size, id) in finished {
            if (count <= MAX_FINISHED_RUNS && bytes <= MAX_FINISHED_BYTES) || at > keep_after {
                break;
            }
            inner.runs.remove(&id);
            count -= 1;
            bytes -= size;
        }
        let Registry { runs, order } = inner;
        order.retain(|id| runs.contains_key(id));
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

/// `value` with the configuration's secrets removed from its text.
pub(crate) fn redact_value(redact: &Redact, value: &Value) -> Value {
    let text = value.to_string();
    let redacted = redact(&text);
    if redacted == text {
        return value.clone();
    }
    serde_json::from_str(&redacted).unwrap_or(Value::String(redacted))
}

fn result_json(result: &TurnResult) -> Value {
    let status = result.status.as_str();
    let response = result.response.clone().or_else(|| match result.status {
        TurnStatus::InterfaceCommand => Some("This command works only in the terminal chat (peregrine chat).".to_owned()),
        TurnStatus::Exit => Some("There is nothing to leave here; start a new thread instead.".to_owned()),
        _ => None,
    });
    let approval = result.approval.as_ref().map(peregrine_agent::wire::approval_json);
    json!({"status": status, "response": response, "interrupt": result.interrupt.as_ref().map(interrupt_json), "approval": approval})
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use peregrine_core::events::EventKind;

    use super::*;

    #[test]
    fn events_are_numbered_and_named_by_kind() {
        let run = Run::new("t-1", RunKind::Message, Arc::new(str::to_owned), CancellationToken::new());
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
    fn the_end_event_carries_the_run_and_everything_is_redacted() {
        let redact: Redact = Arc::new(|text: &str| text.replace("sk-secret", "***"));
        let run = Run::new("t-1", RunKind::Resume, redact, CancellationToken::new());
        run.record(&RunEvent::Custom(AgentEvent::new(
            "respond",
            EventKind::LlmToken { role: "response".into(), content: "sk-secret".into() },
        )));
        run.finish(Err(ApiError::server_error("the provider said: bad key sk-secret")));
        run.finish(Err(ApiError::server_error("again")));
        let events = run.events_after(0);
        assert_eq!(events.last().map(|event| event.name), Some("end"));
        assert!(run.is_finished() && run.last_seq() == events.len() as u64);
        let end: Value = serde_json::from_str(&events[events.len() - 1].data).unwrap();
        assert_eq!(end["status"], "error");
        assert_eq!(end["error"]["message"], "the provider said: bad key ***", "the first outcome counts, redacted");
        assert_eq!(end["kind"], "resume");
        assert!(events.iter().all(|event| !event.data.contains("sk-secret")));
        assert!(!run.json().to_string().contains("sk-secret"));
    }

    fn registry() -> RunRegistry {
        RunRegistry::new(Arc::new(str::to_owned), CancellationToken::new())
    }

    #[test]
    fn finished_runs_are_forgotten_in_the_order_they_ended_never_too_soon() {
        let registry = registry();
        let long = registry.start("long", RunKind::Message);
        let running = registry.start("busy", RunKind::Message);
        for _ in 0..MAX_FINISHED_RUNS + 5 {
            registry.start("t", RunKind::Message).finish(Err(ApiError::thread_busy()));
        }
        long.finish(Err(ApiError::thread_busy()));
        registry.start("t", RunKind::Message);
        assert_eq!(registry.of_thread("t").len(), MAX_FINISHED_RUNS + 6, "runs that just ended are all kept");
        RunRegistry::evict(&mut registry.inner(), Utc::now() + chrono::Duration::minutes(5));
        assert!(registry.get("long", &long.id).is_some(), "the run that ended last is kept although it started first");
        assert!(registry.get("busy", &running.id).is_some(), "running runs are never forgotten");
        assert!(registry.get("t", &running.id).is_none(), "a run is found only under its own thread");
        assert_eq!(registry.active("busy").map(|run| run.id.clone()), Some(running.id.clone()));
        let kept = registry.of_thread("t");
        assert_eq!(kept.iter().filter(|run| run.is_finished()).count() + 1, MAX_FINISHED_RUNS);
        registry.forget_thread("t");
        assert!(registry.of_thread("t").is_empty());
        assert_eq!(registry.of_thread("busy").len(), 1);
    }

    #[test]
    fn server_paths_are_stripped_everywhere() {
        let mut value = json!({"a": {"plan_file_path": "/srv/x", "keep": 1}, "b": [{"pending_plans_dir": "/srv"}]});
        strip_server_paths(&mut value);
        assert_eq!(value, json!({"a": {"keep": 1}, "b": [{}]}));
    }
}

//! Drives one turn and shows it: the engine's events as a live status line (terminal) or plain
//! progress lines, answer tokens as they stream, or one JSON object per event (`--json`);
//! Ctrl-C cancels the turn and keeps its last checkpoint.

use std::io::Write as _;
use std::time::{Duration, Instant};

use peregrine_agent::{Agent, AgentError, Session, TurnOptions, TurnResult};
use peregrine_core::AgentEvent;
use peregrine_core::events::EventKind;
use peregrine_graph::RunEvent;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::output::{Output, Style};

/// What to do on the thread.
#[derive(Debug, Clone, Copy)]
pub enum TurnRequest<'a> {
    /// A message (a new turn, an approval answer or a command).
    Send(&'a str),
    /// Finish the run that was cut off.
    Continue,
}

/// How a driven turn went.
#[derive(Debug)]
pub struct Driven {
    /// The agent's answer, or why it could not act.
    pub result: Result<TurnResult, AgentError>,
    /// Whether answer tokens were streamed to the output (the answer need not be printed again).
    pub streamed: bool,
    /// Whether the person pressed Ctrl-C.
    pub interrupted_by_user: bool,
}

/// Receives a turn's events.
pub trait TurnView {
    /// One event.
    fn event(&mut self, event: &RunEvent<AgentEvent>);
    /// Called about ten times a second while the turn runs (spinners).
    fn tick(&mut self) {}
    /// The turn ended; clear any live line.
    fn finish(&mut self) {}
    /// Whether answer tokens were written.
    fn streamed(&self) -> bool;
}

/// Runs `request` on `thread`, showing its events in `view`, until it ends or Ctrl-C cancels it.
pub async fn drive(agent: &Agent, thread: &str, request: TurnRequest<'_>, session: &Session, view: &mut dyn TurnView) -> Driven {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let options = TurnOptions { events: Some(sender), cancel: cancel.clone() };
    let turn = async {
        match request {
            TurnRequest::Send(text) => agent.send(thread, text, session, options).await,
            TurnRequest::Continue => agent.continue_turn(thread, options).await,
        }
    };
    tokio::pin!(turn);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted_by_user = false;
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            biased;
            Some(event) = receiver.recv() => view.event(&event),
            result = &mut turn => break result,
            signal = &mut ctrl_c, if !interrupted_by_user => {
                // Without a signal handler there is nothing to cancel with; the turn goes on.
                if signal.is_ok() {
                    interrupted_by_user = true;
                    cancel.cancel();
                }
            }
            _ = ticker.tick() => view.tick(),
        }
    };
    while let Ok(event) = receiver.try_recv() {
        view.event(&event);
    }
    view.finish();
    Driven { result, streamed: view.streamed(), interrupted_by_user }
}

/// Human output: answer tokens on stdout as they stream; progress on stderr — a live line with
/// a spinner, the step and the elapsed time on a terminal, plain lines otherwise (verbose only).
#[derive(Debug)]
pub struct TextView {
    out: Output,
    streamed: bool,
    started: Instant,
    status: Option<String>,
    live_shown: bool,
    frame: usize,
}

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

impl TextView {
    /// A view writing to the process's stdout and stderr.
    pub fn new(out: Output) -> Self {
        Self { out, streamed: false, started: Instant::now(), status: None, live_shown: false, frame: 0 }
    }

    fn live(&self) -> bool {
        self.out.stderr_tty && self.out.notes()
    }

    fn clear_live(&mut self) {
        if self.live_shown {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
            self.live_shown = false;
        }
    }

    fn draw(&mut self) {
        let Some(status) = &self.status else { return };
        if !self.live() || self.streamed {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let spinner = SPINNER[self.frame % SPINNER.len()];
        let line = format!("{spinner} {status} {}", Style::Dim.paint(&format!("({elapsed:.1}s)"), self.out.color_stderr));
        eprint!("\r\x1b[2K{line}");
        let _ = std::io::stderr().flush();
        self.live_shown = true;
    }

    fn set_status(&mut self, status: String) {
        if self.live() {
            self.status = Some(status);
            self.draw();
        } else if self.out.verbose() {
            eprintln!("{}", Style::Dim.paint(&format!("· {status}"), self.out.color_stderr));
        }
    }
}

/// The one-line description of a node starting.
fn node_status(node: &str) -> Option<String> {
    Some(match node {
        "task_extraction" => "extracting the task".to_owned(),
        "classifier" => "selecting capabilities".to_owned(),
        "orchestrator" => "planning".to_owned(),
        "respond" => "writing the answer".to_owned(),
        "clarify" => "asking for clarification".to_owned(),
        "error" => "reporting the error".to_owned(),
        _ => return None,
    })
}

impl TurnView for TextView {
    fn event(&mut self, event: &RunEvent<AgentEvent>) {
        match event {
            RunEvent::NodeStarted { node, .. } => {
                if let Some(status) = node_status(node) {
                    self.set_status(status);
                }
            }
            RunEvent::Waiting { node, delay } => self.set_status(format!("retrying {node} in {:.1}s", delay.as_secs_f64())),
            RunEvent::Custom(event) => match &event.kind {
                EventKind::CapabilityStart { capability_name, step_number, total_steps, description } => {
                    self.set_status(format!("step {step_number}/{total_steps} {capability_name}: {description}"));
                }
                EventKind::Error { error_message, recoverable, .. } if self.out.verbose() || *recoverable => {
                    let what = if *recoverable { "recovering from" } else { "error in" };
                    self.set_status(format!("{what} {}: {error_message}", event.component));
                }
                EventKind::LlmRequest { role, model, .. } if self.out.verbose() => {
                    self.set_status(format!("{}: calling {model} ({role})", event.component));
                }
                EventKind::LlmToken { content, .. } => {
                    self.clear_live();
                    print!("{content}");
                    // A failed flush only delays the text; the whole answer is stored regardless.
                    let _ = std::io::stdout().flush();
                    self.streamed = true;
                }
                _ => {}
            },
            _ => {}
        }
    }

    fn tick(&mut self) {
        self.frame += 1;
        self.draw();
    }

    fn finish(&mut self) {
        self.clear_live();
        if self.streamed {
            println!();
        }
    }

    fn streamed(&self) -> bool {
        self.streamed
    }
}

/// `--json`: one JSON object per line on stdout for every event.
#[derive(Debug, Default)]
pub struct JsonView {
    streamed: bool,
}

impl JsonView {
    /// Prints one object as a line.
    pub fn emit(value: &Value) {
        let mut stdout = std::io::stdout().lock();
        // A closed pipe ends the output; the turn itself is stored regardless.
        let _ = writeln!(stdout, "{value}");
        let _ = stdout.flush();
    }
}

/// The JSON form of an event: `{"type": …}` with durations in milliseconds, answer tokens as
/// `{"type":"token","content":…}` and domain events as `{"type":"event","event":…,…}`.
pub fn event_json(event: &RunEvent<AgentEvent>) -> Value {
    match event {
        RunEvent::RunStarted { thread_id, run_id } => json!({"type": "run_started", "thread_id": thread_id, "run_id": run_id}),
        RunEvent::NodeStarted { node, step } => json!({"type": "node_started", "node": node, "step": step}),
        RunEvent::Waiting { node, delay } => json!({"type": "waiting", "node": node, "delay_ms": delay.as_millis() as u64}),
        RunEvent::NodeFinished { node, step, checkpoint_id, duration } => json!({
            "type": "node_finished", "node": node, "step": step, "checkpoint_id": checkpoint_id, "duration_ms": duration.as_millis() as u64
        }),
        RunEvent::Interrupted { interrupt } => json!({"type": "interrupted", "interrupt": interrupt}),
        RunEvent::RunFinished { last_node } => json!({"type": "run_finished", "last_node": last_node}),
        RunEvent::Custom(event) => match &event.kind {
            EventKind::LlmToken { role, content } => json!({"type": "token", "role": role, "content": content}),
            _ => {
                let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut value {
                    map.insert("type".into(), Value::String("event".into()));
                }
                value
            }
        },
        _ => json!({"type": "unknown"}),
    }
}

impl TurnView for JsonView {
    fn event(&mut self, event: &RunEvent<AgentEvent>) {
        if matches!(event, RunEvent::Custom(AgentEvent { kind: EventKind::LlmToken { .. }, .. })) {
            self.streamed = true;
        }
        Self::emit(&event_json(event));
    }

    fn streamed(&self) -> bool {
        self.streamed
    }
}

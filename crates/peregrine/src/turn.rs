//! Drives one turn and shows it: the engine's events as a live status line (terminal) or plain
//! progress lines, answer tokens as they stream, or one JSON object per event (`--json`);
//! Ctrl-C cancels the turn and keeps its last checkpoint, a second Ctrl-C exits at once. Also
//! what every command shares for its output: stdout that a closed pipe silences instead of
//! panicking, thread ids checked and quoted for the hints that name them.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use peregrine_agent::{Agent, AgentError, AnswerStream, Session, StreamStep, TurnOptions, TurnResult, TurnStatus};
use peregrine_core::AgentEvent;
use peregrine_core::events::EventKind;
use peregrine_graph::RunEvent;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::output::{Output, Style};

/// Exit code after Ctrl-C (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// What to do on the thread.
#[derive(Debug, Clone, Copy)]
pub enum TurnRequest<'a> {
    /// A message (a new turn, an approval answer or a command); it answers whatever approval is
    /// pending (the one-shot `run`, whose person saw the question in an earlier process).
    Send(&'a str),
    /// A message written after the person saw `shown`, the approval question this terminal
    /// printed last: it answers a pending approval only when that is the one shown.
    SendAfter(&'a str, Option<&'a str>),
    /// Finish the run that was cut off.
    Continue,
}

/// How a driven turn went.
#[derive(Debug)]
pub struct Driven {
    /// The agent's answer, or why it could not act.
    pub result: Result<TurnResult, AgentError>,
    /// The answer text streamed since the last restart of the answer (empty when nothing was).
    pub streamed: String,
    /// Whether the person pressed Ctrl-C.
    pub interrupted_by_user: bool,
}

/// Receives a turn's events.
pub trait TurnView {
    /// One event.
    fn event(&mut self, event: &RunEvent<AgentEvent>);
    /// Called about ten times a second while the turn runs (spinners).
    fn tick(&mut self) {}
    /// The turn ended; clear any live line and end a streamed answer's line.
    fn finish(&mut self) {}
    /// The answer text streamed since the last restart of the answer.
    fn streamed(&self) -> &str;
    /// A second Ctrl-C: the process exits right after this; say so.
    fn abort(&mut self) {}
}

/// Runs `request` on `thread`, showing its events in `view`, until it ends or Ctrl-C cancels
/// it. A second Ctrl-C exits the process at once with [`EXIT_INTERRUPTED`] (every finished step
/// is already checkpointed), so a turn that does not react to the cancellation cannot hold the
/// terminal hostage.
pub async fn drive(agent: &Agent, thread: &str, request: TurnRequest<'_>, session: &Session, view: &mut dyn TurnView) -> Driven {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let options = TurnOptions { events: Some(sender), cancel: cancel.clone() };
    let turn = async {
        match request {
            TurnRequest::Send(text) => agent.send(thread, text, session, options).await,
            TurnRequest::SendAfter(text, shown) => agent.send_after(thread, text, shown, session, options).await,
            TurnRequest::Continue => agent.continue_turn(thread, options).await,
        }
    };
    tokio::pin!(turn);
    // `None` once listening failed: a finished future is never polled again.
    let mut ctrl_c = Some(Box::pin(tokio::signal::ctrl_c()));
    let mut interrupted_by_user = false;
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            biased;
            // First, so that a flood of tokens never starves it.
            signal = next_signal(&mut ctrl_c) => match signal {
                Ok(()) if !interrupted_by_user => {
                    interrupted_by_user = true;
                    cancel.cancel();
                    // tokio's handler now swallows SIGINT: keep listening for the second one.
                    ctrl_c = Some(Box::pin(tokio::signal::ctrl_c()));
                }
                Ok(()) => {
                    view.abort();
                    std::process::exit(i32::from(EXIT_INTERRUPTED));
                }
                // Without a signal handler there is nothing to cancel with; the turn goes on.
                Err(_) => ctrl_c = None,
            },
            Some(event) = receiver.recv() => view.event(&event),
            result = &mut turn => break result,
            _ = ticker.tick() => view.tick(),
        }
    };
    while let Ok(event) = receiver.try_recv() {
        view.event(&event);
    }
    view.finish();
    Driven { result, streamed: view.streamed().to_owned(), interrupted_by_user }
}

/// The next Ctrl-C, or never when nobody listens.
async fn next_signal<F: Future<Output = std::io::Result<()>>>(slot: &mut Option<Pin<Box<F>>>) -> std::io::Result<()> {
    match slot {
        Some(signal) => signal.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The text to print after a turn: the response (or `fallback`, e.g. an interface command's
/// reply) unless exactly that answer was already streamed. An error report is always printed.
pub fn text_to_print(result: &TurnResult, streamed: &str, fallback: Option<String>) -> Option<String> {
    let text = result.response.clone().or(fallback)?;
    let already_shown = !streamed.trim().is_empty() && streamed.trim() == text.trim();
    (result.status == TurnStatus::Failed || !already_shown).then_some(text)
}

// ---------------------------------------------------------------------------------------------
// Human output
// ---------------------------------------------------------------------------------------------

/// The note when a streamed answer starts over.
const RETRY_NOTE: &str = "(the answer was cut off; retrying)";
/// The note when a streamed answer broke and was not retried.
const CUT_NOTE: &str = "(the answer was cut off)";

/// Human output: answer tokens on stdout as they stream; progress on stderr — a live line with
/// a spinner, the step and the elapsed time on a terminal, plain lines otherwise (verbose only).
#[derive(Debug)]
pub struct TextView {
    out: Output,
    started: Instant,
    status: Option<String>,
    live_shown: bool,
    frame: usize,
    columns: usize,
    dumb: bool,
    stream: AnswerStream,
    /// Streamed text on stdout whose line is not ended yet.
    line_open: bool,
    /// A cut whose note waits for the retry (or the end of the turn).
    cut_unreported: bool,
    abort_hint: String,
}

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

impl TextView {
    /// A view writing to the process's stdout and stderr; `abort_hint` says how to finish the
    /// turn after a second Ctrl-C ended the process.
    pub fn new(out: Output, abort_hint: impl Into<String>) -> Self {
        let columns = std::env::var("COLUMNS").ok().and_then(|columns| columns.trim().parse::<usize>().ok()).filter(|columns| *columns > 0);
        let dumb = std::env::var("TERM").is_ok_and(|term| term == "dumb");
        Self {
            out,
            started: Instant::now(),
            status: None,
            live_shown: false,
            frame: 0,
            columns: columns.unwrap_or(80),
            dumb,
            stream: AnswerStream::default(),
            line_open: false,
            cut_unreported: false,
            abort_hint: abort_hint.into(),
        }
    }

    fn live(&self) -> bool {
        self.out.stderr_tty && self.out.notes() && !self.dumb
    }

    fn clear_live(&mut self) {
        if self.live_shown {
            write_stderr("\r\x1b[2K");
            self.live_shown = false;
        }
    }

    fn draw(&mut self) {
        let Some(status) = &self.status else { return };
        if !self.live() || !self.stream.text().is_empty() {
            return;
        }
        let spinner = SPINNER[self.frame % SPINNER.len()];
        let elapsed = format!("({:.1}s)", self.started.elapsed().as_secs_f64());
        // One line, never wrapped: a wrapped line cannot be cleared with `\r`.
        let room = self.columns.saturating_sub(elapsed.chars().count() + 4);
        let status = truncate(status, room);
        let line = format!("{spinner} {status} {}", Style::Dim.paint(&elapsed, self.out.color_stderr));
        write_stderr(&format!("\r\x1b[2K{line}"));
        self.live_shown = true;
    }

    fn set_status(&mut self, status: String) {
        if self.live() {
            self.status = Some(status);
            self.draw();
        } else if self.out.verbose() {
            self.note_line(&format!("· {status}"));
        }
    }

    /// A dim line on stderr, after clearing the live line.
    fn note_line(&mut self, text: &str) {
        self.clear_live();
        write_stderr(&format!("{}\n", Style::Dim.paint(text, self.out.color_stderr)));
    }

    fn end_line(&mut self) {
        if self.line_open {
            print_out("\n");
            self.line_open = false;
        }
    }

    fn token(&mut self, content: &str) {
        self.clear_live();
        print_out(content);
        if !content.is_empty() {
            self.line_open = !content.ends_with('\n');
        }
    }
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// The one-line description of a node starting.
fn node_status(node: &str) -> Option<String> {
    peregrine_agent::wire::node_activity(node).map(str::to_owned)
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
            RunEvent::Custom(event) => {
                match self.stream.observe(event) {
                    StreamStep::Token => {
                        if let EventKind::LlmToken { content, .. } = &event.kind {
                            self.token(content);
                        }
                        return;
                    }
                    StreamStep::Cut => {
                        self.end_line();
                        self.cut_unreported = true;
                    }
                    StreamStep::Restart { .. } => {
                        self.end_line();
                        self.cut_unreported = false;
                        if self.out.notes() {
                            self.note_line(RETRY_NOTE);
                        }
                    }
                    StreamStep::Other => {}
                }
                match &event.kind {
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
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn tick(&mut self) {
        self.frame += 1;
        self.draw();
    }

    fn finish(&mut self) {
        self.clear_live();
        self.end_line();
        if std::mem::take(&mut self.cut_unreported) && self.out.notes() {
            self.note_line(CUT_NOTE);
        }
    }

    fn streamed(&self) -> &str {
        self.stream.text()
    }

    fn abort(&mut self) {
        self.clear_live();
        self.end_line();
        let note = format!("second Ctrl-C: stopped at once; the finished steps are kept — {}", self.abort_hint);
        write_stderr(&format!("{}\n", Style::Warning.paint(&note, self.out.color_stderr)));
    }
}

// ---------------------------------------------------------------------------------------------
// JSON output
// ---------------------------------------------------------------------------------------------

/// `--json`: one JSON object per line on stdout for every event; `{"type":"stream_reset",…}`
/// when a streamed answer starts over (the tokens before it are void).
#[derive(Debug)]
pub struct JsonView {
    thread: String,
    stream: AnswerStream,
}

impl JsonView {
    /// A view of a turn on `thread`.
    pub fn new(thread: impl Into<String>) -> Self {
        Self { thread: thread.into(), stream: AnswerStream::default() }
    }

    /// Prints one object as a line.
    pub fn emit(value: &Value) {
        print_out(&format!("{value}\n"));
    }
}

impl TurnView for JsonView {
    fn event(&mut self, event: &RunEvent<AgentEvent>) {
        if let RunEvent::Custom(agent_event) = event {
            let step = self.stream.observe(agent_event);
            if matches!(step, StreamStep::Cut | StreamStep::Restart { after_cut: false }) {
                let (component, role) = self.stream.source().unwrap_or_default();
                Self::emit(
                    &json!({"type": "stream_reset", "component": component, "role": role, "reason": "the answer is streamed again from the start"}),
                );
            }
        }
        if let Some(line) = peregrine_agent::wire::typed_event_json(event) {
            Self::emit(&line);
        }
    }

    fn streamed(&self) -> &str {
        self.stream.text()
    }

    fn abort(&mut self) {
        Self::emit(&json!({
            "type": "result", "thread_id": self.thread, "status": "cancelled", "response": Value::Null, "interrupt": Value::Null,
            "error": "a second Ctrl-C stopped the process at once; the finished steps are kept (--resume finishes the turn)",
        }));
    }
}

// ---------------------------------------------------------------------------------------------
// stdout and stderr that never panic
// ---------------------------------------------------------------------------------------------

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stdout and flushes it. Once stdout is gone (a closed pipe: `| head -1`),
/// this and every later write do nothing: the output stops, never the command, which finishes
/// its work and exits as if everything had been read. Returns whether stdout is still open.
pub fn print_out(text: &str) -> bool {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return false;
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => true,
        Err(error) => {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            if error.kind() != std::io::ErrorKind::BrokenPipe {
                write_stderr(&format!("cannot write to stdout ({error}); the rest of the output is dropped\n"));
            }
            false
        }
    }
}

/// [`print_out`] with a newline.
pub fn println_out(text: &str) -> bool {
    print_out(&format!("{text}\n"))
}

/// Writes `text` to stderr; a stderr that cannot be written to loses the text, nothing else.
pub fn write_stderr(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes()).and_then(|()| stderr.flush());
}

// ---------------------------------------------------------------------------------------------
// Thread ids in arguments and hints
// ---------------------------------------------------------------------------------------------

/// Checks a thread id given on the command line: not empty, no control characters.
pub fn check_thread_id(thread: &str) -> Result<(), String> {
    if thread.trim().is_empty() {
        return Err("a thread id cannot be empty".into());
    }
    if thread.chars().any(char::is_control) {
        return Err(format!("the thread id {thread:?} contains control characters; use letters, digits, '-', '_' or spaces"));
    }
    Ok(())
}

/// A clap value parser for thread ids ([`check_thread_id`]).
pub fn parse_thread_id(thread: &str) -> Result<String, String> {
    check_thread_id(thread).map(|()| thread.to_owned())
}

/// `text` as one shell word: unchanged when it is plain, else in single quotes.
pub fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,/:@%+=".contains(c));
    if plain { text.to_owned() } else { format!("'{}'", text.replace('\'', r"'\''")) }
}

/// `--thread <id>` as a user can paste it (`--thread 'my thread'`; `--thread=-x` for an id
/// that starts with `-`, which would otherwise read as an option).
pub fn thread_flag(thread: &str) -> String {
    if thread.starts_with('-') { format!("--thread={}", shell_quote(thread)) } else { format!("--thread {}", shell_quote(thread)) }
}

/// The name the program was started as (for hints in commands that do not know the
/// application's name).
pub fn invoked_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|arg| std::path::Path::new(&arg).file_name().map(|name| name.to_string_lossy().into_owned()))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "peregrine".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: TurnStatus, response: Option<&str>) -> TurnResult {
        TurnResult { response: response.map(str::to_owned), ..TurnResult::text(status, "") }
    }

    #[test]
    fn the_answer_is_printed_unless_exactly_it_was_streamed() {
        let cases = [
            (TurnStatus::Completed, Some("Full answer."), "Full answer. ", None),
            (TurnStatus::Completed, Some("Full answer."), "", Some("Full answer.")),
            (TurnStatus::Completed, Some("Full answer."), "PARTIAL-A", Some("Full answer.")),
            (TurnStatus::Failed, Some("ERROR REPORT"), "ERROR REPORT", Some("ERROR REPORT")),
            (TurnStatus::Interrupted, Some("HUMAN APPROVAL REQUIRED"), "", Some("HUMAN APPROVAL REQUIRED")),
            (TurnStatus::Completed, None, "", None),
        ];
        for (status, response, streamed, expected) in cases {
            assert_eq!(
                text_to_print(&result(status, response), streamed, None).as_deref(),
                expected,
                "{status:?} {response:?} {streamed:?}"
            );
        }
        assert_eq!(text_to_print(&result(TurnStatus::InterfaceCommand, None), "", Some("3 turns".into())).as_deref(), Some("3 turns"));
    }

    #[test]
    fn thread_ids_are_checked_and_quoted_for_the_shell() {
        assert!(check_thread_id("main").is_ok());
        assert!(check_thread_id("my thread").is_ok());
        assert!(check_thread_id("").is_err());
        assert!(check_thread_id("  ").is_err());
        assert!(check_thread_id("a\nb").is_err());
        assert!(check_thread_id("a\x1b[31m").is_err());
        let cases = [
            ("main", "--thread main"),
            ("chat-20250101-120000-abcd", "--thread chat-20250101-120000-abcd"),
            ("my thread", "--thread 'my thread'"),
            ("it's", r"--thread 'it'\''s'"),
            ("$HOME", "--thread '$HOME'"),
            ("-x", "--thread=-x"),
            ("-x y", "--thread='-x y'"),
        ];
        for (thread, flag) in cases {
            assert_eq!(thread_flag(thread), flag, "{thread}");
        }
    }

    #[test]
    fn status_lines_fit_the_terminal() {
        assert_eq!(truncate("writing the answer", 40), "writing the answer");
        assert_eq!(truncate("writing the answer", 8), "writing…");
        assert_eq!(truncate("writing", 0), "…");
    }
}

//! `peregrine chat`: the interactive conversation. Each line is one message on the thread
//! (a turn, an approval answer or a slash command); answers stream as they are written, a live
//! status line shows the step, approvals are asked and answered at the prompt, and Ctrl-C
//! cancels a running turn while keeping its finished steps (`/resume` finishes it). With stdin
//! piped, it reads one message per line without line editing and exits at the end of input.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use peregrine_agent::commands::{BUILTINS, canonical_name, parse_input};
use peregrine_agent::{Agent, AgentError, Session, SlashCommand, ThreadStatus, TurnResult, TurnStatus};
use peregrine_core::{AgentState, Role};
use peregrine_graph::StateSnapshot;
use peregrine_llm::roles;
use rustyline::completion::Completer;
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};
use tokio::sync::oneshot;

use crate::app::Application;
use crate::cli::Failure;
use crate::commands::run::{approval_note, cli_session};
use crate::config::Config;
use crate::output::{Output, Style};
use crate::runtime;
use crate::turn::{
    Driven, TextView, TurnRequest, drive, parse_thread_id, print_out, println_out, text_to_print, thread_flag, write_stderr,
};

/// `chat` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ChatArgs {
    /// The conversation thread to open or continue (default: a new one).
    #[arg(long, short = 't', value_parser = parse_thread_id)]
    pub thread: Option<String>,
    /// The user id (memory is per user; default: $USER).
    #[arg(long)]
    pub user: Option<String>,
}

/// The file (under the agent data directory) that keeps the prompt's history across sessions.
const HISTORY_FILE: &str = "chat_history.txt";
/// The conversation prompt.
const PROMPT: &str = "you> ";
/// The recap of a resumed thread shows at most this many characters of each message.
const RECAP_CHARS: usize = 600;
/// What `/help` adds about the chat itself.
const CHAT_KEYS: &str = "Chat: /resume finishes a turn cut off by Ctrl-C · Ctrl-C cancels a running turn (at the prompt: clears the line) · Ctrl-D or /exit leaves · ↑/↓ browse the history";

/// Runs the conversation until `/exit` or Ctrl-D. A store that cannot be opened fails with 1, a
/// configuration the agent cannot be built from with 2.
pub async fn run(args: &ChatArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<(), Failure> {
    let store = runtime::open_store(config).await.map_err(Failure::from)?;
    let agent = runtime::agent_on(config, app, store).map_err(|error| Failure::usage(format!("{error:#}")))?;
    let thread = args.thread.clone().unwrap_or_else(new_thread_id);
    let bin = app.name().to_owned();
    let mut chat = Chat { agent, config, out: *out, thread, session: cli_session(args.user.as_deref()), bin, shown: None };
    chat.header(app);
    let mut input = if out.interactive { LineReader::terminal(history_path(config, out), out.color_stdout) } else { LineReader::piped() };
    if chat.reopen(&mut input).await? == Flow::Exit {
        return Ok(());
    }
    loop {
        let line = match input.read(Ask::Message).await? {
            Line::Text(line) => line,
            // Ctrl-C at the prompt: the line is dropped, the session goes on.
            Line::Interrupted => continue,
            Line::Eof => break,
        };
        if chat.message(&line).await == Flow::Exit {
            break;
        }
    }
    Ok(())
}

/// Whether the conversation goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

/// A new thread id: `chat-<YYYYMMDD-HHMMSS>-<4 hex>`.
fn new_thread_id() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("chat-{}-{}", chrono::Local::now().format("%Y%m%d-%H%M%S"), &random[..4])
}

/// `<agent_data_dir>/chat_history.txt`, its directory created; `None` (history kept in memory
/// only) when the directory cannot be created.
fn history_path(config: &Config, out: &Output) -> Option<PathBuf> {
    let dir = &config.settings.agent_data_dir;
    match std::fs::create_dir_all(dir) {
        Ok(()) => Some(dir.join(HISTORY_FILE)),
        Err(error) => {
            out.warn(&format!("the prompt history is not saved: cannot create {}: {error}", dir.display()));
            None
        }
    }
}

/// One conversation on one thread.
struct Chat<'a> {
    agent: Agent,
    config: &'a Config,
    out: Output,
    thread: String,
    session: Session,
    /// The program's name, for hints.
    bin: String,
    /// The approval question printed last: a message answers only that one.
    shown: Option<String>,
}

impl Chat<'_> {
    /// The thread, the answering model and where the configuration came from (stderr).
    fn header(&self, app: &dyn Application) {
        let model = match self.config.llm.model_for(roles::RESPONSE) {
            Ok(resolved) => format!("{} ({})", resolved.model.model_id, resolved.model.provider),
            Err(_) => "no response model configured".to_owned(),
        };
        let source = self.config.source.as_ref().map_or_else(|| "embedded defaults".to_owned(), |path| path.display().to_string());
        let color = self.out.color_stderr;
        self.out.note(&format!(
            "{} · thread {} · {model} · config {source}",
            Style::Bold.paint(app.name(), color),
            Style::Accent.paint(&self.thread, color)
        ));
        if self.out.interactive {
            self.out.note("/help lists the commands · Ctrl-C cancels a running turn · Ctrl-D leaves");
        }
    }

    /// Picks up an existing thread: shows its last exchange, offers to finish a cut-off run and
    /// repeats a pending approval question.
    async fn reopen(&mut self, input: &mut LineReader) -> anyhow::Result<Flow> {
        let Some(thread) = self.agent.thread(&self.thread).await? else { return Ok(Flow::Continue) };
        self.recap(&thread.snapshot.state);
        match thread.status {
            ThreadStatus::Idle | ThreadStatus::Failed => {}
            ThreadStatus::Interrupted => {
                if let Some(prompt) = thread.interrupt().and_then(peregrine_agent::approval_prompt) {
                    println_out(prompt.trim_end());
                    self.shown = Some(prompt.to_owned());
                }
                self.approval_hint();
            }
            ThreadStatus::Busy => self.out.warn("a run of another process holds this thread; messages are refused until it ends"),
            ThreadStatus::Unfinished => return self.offer_to_finish(&thread.snapshot, input).await,
        }
        Ok(Flow::Continue)
    }

    /// The last message of the person and the agent's last answer (stderr).
    fn recap(&self, state: &AgentState) {
        let turns = state.messages.iter().filter(|message| message.role == Role::User).count();
        self.out.note(&format!("continuing thread '{}' ({turns} turns so far)", self.thread));
        let last = |role: Role| state.messages.iter().rev().find(|message| message.role == role);
        for (label, message) in [("you", last(Role::User)), ("agent", last(Role::Assistant))] {
            if let Some(message) = message {
                self.out.note(&format!("  {label}> {}", shorten(message.content.trim(), RECAP_CHARS)));
            }
        }
    }

    async fn offer_to_finish(&mut self, snapshot: &StateSnapshot<AgentState>, input: &mut LineReader) -> anyhow::Result<Flow> {
        let at = snapshot.next.as_deref().unwrap_or("its next step");
        // An answered approval whose node has not run: a new turn is refused until it has.
        let answered = snapshot.meta.resume.is_some();
        if answered {
            self.out.warn(&format!("the last turn on this thread was cut off after its approval was answered, before {at} ran"));
        } else {
            self.out.warn(&format!("the last turn on this thread was cut off before {at}"));
        }
        let otherwise = if answered { "it must be finished before a new turn" } else { "a new message starts a new turn" };
        if !input.is_terminal() {
            // Piped lines are messages, not answers to our questions.
            self.out.note(&format!("/resume finishes it; {otherwise}"));
            return Ok(Flow::Continue);
        }
        match input.read(Ask::YesNo("finish it now? [Y/n] ")).await? {
            Line::Eof => Ok(Flow::Exit),
            Line::Text(answer) if matches!(answer.trim().to_ascii_lowercase().as_str(), "" | "y" | "yes") => {
                Ok(self.turn(TurnRequest::Continue, "").await)
            }
            Line::Text(_) | Line::Interrupted => {
                self.out.note(&format!("kept as it is: /resume finishes it; {otherwise}"));
                Ok(Flow::Continue)
            }
        }
    }

    /// Handles one line.
    async fn message(&mut self, line: &str) -> Flow {
        let text = line.trim();
        if text.is_empty() {
            return Flow::Continue;
        }
        let mut words = text.split_whitespace();
        if words.next().is_some_and(|first| first.eq_ignore_ascii_case("/resume")) {
            if words.next().is_some() {
                self.out.note("/resume takes nothing after it: it finishes the turn that was cut off; send your message on its own line");
                return Flow::Continue;
            }
            return self.resume().await;
        }
        let shown = self.shown.clone();
        self.turn(TurnRequest::SendAfter(text, shown.as_deref()), text).await
    }

    /// `/resume`: finishes the run Ctrl-C (or a crash) cut off.
    async fn resume(&mut self) -> Flow {
        self.turn(TurnRequest::Continue, "").await
    }

    /// Drives one request and shows how it ended; `text` is the line sent (empty for a resume).
    async fn turn(&mut self, request: TurnRequest<'_>, text: &str) -> Flow {
        // Piped input gets plain output: no live status line even when stderr is a terminal.
        let view_out = if self.out.interactive { self.out } else { Output { stderr_tty: false, ..self.out } };
        let hint = format!("`{} chat {}` offers to finish the turn", self.bin, thread_flag(&self.thread));
        let mut view = TextView::new(view_out, hint);
        let driven = drive(&self.agent, &self.thread, request, &self.session, &mut view).await;
        if let Ok(TurnResult { approval: Some(answered), .. }) = &driven.result {
            self.out.note(&approval_note(answered.outcome));
        }
        self.show(driven, text).await
    }

    async fn show(&mut self, driven: Driven, text: &str) -> Flow {
        let result = match driven.result {
            Ok(result) => result,
            Err(AgentError::Run(peregrine_graph::RunError::PendingResume { .. })) => {
                self.out.note("this thread has a turn to finish first: /resume finishes it");
                return Flow::Continue;
            }
            Err(AgentError::NothingToContinue(why)) => {
                self.out.note(&format!("nothing to resume: {why}"));
                return Flow::Continue;
            }
            Err(error) => {
                // The thread keeps its last checkpoint; the conversation goes on.
                self.out.error(&self.config.redact(&error.to_string()));
                return Flow::Continue;
            }
        };
        // The question now on the screen: the one this turn printed; a reply, a cancelled answer
        // or an interface command leave the earlier one there.
        match (&result.status, &result.interrupt) {
            (TurnStatus::Interrupted, Some(interrupt)) => self.shown = peregrine_agent::approval_prompt(interrupt).map(str::to_owned),
            (TurnStatus::Reply | TurnStatus::Cancelled | TurnStatus::InterfaceCommand, _) => {}
            _ => self.shown = None,
        }
        match result.status {
            TurnStatus::Exit => return Flow::Exit,
            TurnStatus::Cancelled => write_stderr(&format!(
                "{}\n",
                Style::Warning.paint(
                    "cancelled — the finished steps are kept; /resume finishes the turn, a new message starts another",
                    self.out.color_stderr
                )
            )),
            TurnStatus::InterfaceCommand => {
                if let Some(command) = &result.command {
                    self.interface(command, &result).await;
                }
            }
            TurnStatus::Interrupted => {
                print_answer(text_to_print(&result, &driven.streamed, None).as_deref());
                self.approval_hint();
            }
            TurnStatus::Reply => {
                print_answer(text_to_print(&result, &driven.streamed, None).as_deref());
                if asks_for_help(text) {
                    println_out(CHAT_KEYS);
                }
            }
            // An error report is always printed, even when part of an answer was streamed;
            // an answer only when exactly it was not streamed.
            TurnStatus::Failed | TurnStatus::Completed | TurnStatus::Updated | TurnStatus::Abandoned => {
                print_answer(text_to_print(&result, &driven.streamed, None).as_deref());
            }
        }
        Flow::Continue
    }

    fn approval_hint(&self) {
        self.out
            .note(&format!("{} answer yes / no (or say what to change)", Style::Warning.paint("approval needed:", self.out.color_stderr)));
    }

    /// `/clear`, `/config` and `/status`.
    async fn interface(&self, command: &SlashCommand, result: &TurnResult) {
        match canonical_name(&command.name).unwrap_or(command.name.as_str()) {
            "clear" => {
                if self.out.interactive {
                    print_out("\x1b[2J\x1b[3J\x1b[H");
                }
                self.out.note(&format!("screen cleared; the conversation on thread {} is kept", self.thread));
            }
            "config" => {
                println_out(&self.config_text());
            }
            "status" => {
                println_out(&self.status_text(result).await);
            }
            other => self.out.note(&format!("/{other} has no effect in chat")),
        }
    }

    /// The configuration with secrets redacted, as YAML.
    fn config_text(&self) -> String {
        let source = self
            .config
            .source
            .as_ref()
            .map_or_else(|| "the embedded defaults (no config.yml)".to_owned(), |path| path.display().to_string());
        let document = self.config.redacted();
        let body = if document.is_null() {
            String::new()
        } else {
            serde_norway::to_string(&document).or_else(|_| serde_json::to_string_pretty(&document)).unwrap_or_default()
        };
        format!("# configuration: {source}\n{}", body.trim_end())
    }

    async fn status_text(&self, result: &TurnResult) -> String {
        let thread = self.agent.thread(&self.thread).await;
        let (status, state) = match &thread {
            Ok(Some(thread)) => (status_name(thread.status), Some(thread.snapshot.state.clone())),
            Ok(None) => ("new (nothing sent yet)", None),
            Err(_) => ("unknown (the checkpoint store cannot be read)", result.state.clone()),
        };
        let turns = state.as_ref().map_or(0, |state| state.messages.iter().filter(|message| message.role == Role::User).count());
        let configured = self.config.settings.approval.global_mode;
        let mode = |mode| serde_json::to_value(mode).ok().and_then(|value| value.as_str().map(str::to_owned)).unwrap_or_default();
        let mut approval = format!("{} (approval.global_mode; /approval changes one turn)", mode(configured));
        if let Some(last) = state.as_ref().map(|state| state.agent_control.approval_mode).filter(|last| *last != configured) {
            approval.push_str(&format!(", last turn: {}", mode(last)));
        }
        let mut lines = vec![
            format!("thread:    {}", self.thread),
            format!("status:    {status}"),
            format!("turns:     {turns}"),
            format!("approvals: {approval}"),
        ];
        if let Some(capability) = state.as_ref().and_then(|state| state.direct_chat_capability()) {
            lines.push(format!("direct chat with: {capability} (/exit ends it)"));
        }
        lines.join("\n")
    }
}

fn status_name(status: ThreadStatus) -> &'static str {
    match status {
        ThreadStatus::Idle => "idle",
        ThreadStatus::Failed => "idle (the last turn ended with an error report)",
        ThreadStatus::Interrupted => "waiting for an approval",
        ThreadStatus::Unfinished => "a turn was cut off (/resume finishes it)",
        ThreadStatus::Busy => "a run of another process holds it",
    }
}

/// Whether `text` is `/help` without a topic (the chat's own keys are added to that list).
fn asks_for_help(text: &str) -> bool {
    parse_input(text).is_ok_and(|parsed| {
        parsed.commands.first().is_some_and(|command| canonical_name(&command.name) == Some("help") && command.value.is_none())
    })
}

fn print_answer(text: Option<&str>) {
    if let Some(text) = text.map(str::trim_end).filter(|text| !text.is_empty()) {
        println_out(text);
    }
}

/// `text` cut to `max` characters (on one line).
fn shorten(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

// ---------------------------------------------------------------------------------------------
// Reading lines
// ---------------------------------------------------------------------------------------------

/// What was read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of piped input.
    Eof,
}

/// What a line is read for.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// A message (kept in the history).
    Message,
    /// An answer to this question (not kept).
    YesNo(&'static str),
}

type Request = (Ask, oneshot::Sender<anyhow::Result<Line>>);

/// Reads lines on a thread of its own, one per request: `readline` blocks (and a pending read
/// must never hold up the runtime's shutdown), and the terminal is in raw mode only while a
/// line is being read, so Ctrl-C during a turn is a signal that cancels it.
struct LineReader {
    requests: std::sync::mpsc::Sender<Request>,
    terminal: bool,
}

impl LineReader {
    /// Line editing and history with rustyline.
    fn terminal(history: Option<PathBuf>, color: bool) -> Self {
        let styled = Style::Accent.paint(PROMPT, color);
        Self::spawn(true, move |requests| {
            let mut editor: Option<Editor<ChatHelper, DefaultHistory>> = None;
            for (ask, reply) in requests {
                let editor = match &mut editor {
                    Some(editor) => editor,
                    None => match new_editor(history.as_deref()) {
                        Ok(created) => editor.insert(created),
                        Err(error) => {
                            let _ = reply.send(Err(anyhow::anyhow!("cannot use the terminal for line editing: {error}")));
                            return;
                        }
                    },
                };
                let _ = reply.send(read_terminal_line(editor, ask, &styled, history.as_deref()));
            }
        })
    }

    /// Plain lines from piped stdin: no prompt, no editing.
    fn piped() -> Self {
        Self::spawn(false, |requests| {
            let stdin = std::io::stdin();
            for (_, reply) in requests {
                let mut bytes = Vec::new();
                let line = match stdin.lock().read_until(b'\n', &mut bytes) {
                    Ok(0) => Ok(Line::Eof),
                    Ok(_) => Ok(Line::Text(String::from_utf8_lossy(&bytes).trim_end_matches(['\n', '\r']).to_owned())),
                    Err(error) => Err(anyhow::anyhow!("cannot read stdin: {error}")),
                };
                let _ = reply.send(line);
            }
        })
    }

    fn spawn(terminal: bool, body: impl FnOnce(std::sync::mpsc::Receiver<Request>) + Send + 'static) -> Self {
        let (requests, receiver) = std::sync::mpsc::channel::<Request>();
        // Detached: the process may exit while a piped read still waits.
        std::thread::Builder::new()
            .name("chat-input".into())
            .spawn(move || body(receiver))
            .map(drop)
            .unwrap_or_else(|error| tracing::error!(%error, "cannot start the input thread"));
        Self { requests, terminal }
    }

    fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// The next line. Piped input ends at Ctrl-C too (a terminal reads Ctrl-C as a key).
    async fn read(&mut self, ask: Ask) -> anyhow::Result<Line> {
        let (reply, answer) = oneshot::channel();
        if self.requests.send((ask, reply)).is_err() {
            anyhow::bail!("the input thread has stopped");
        }
        if self.terminal {
            return answer.await.unwrap_or_else(|_| Err(anyhow::anyhow!("the input thread has stopped")));
        }
        tokio::select! {
            line = answer => line.unwrap_or_else(|_| Err(anyhow::anyhow!("the input thread has stopped"))),
            signal = tokio::signal::ctrl_c() => match signal {
                Ok(()) => Ok(Line::Eof),
                Err(error) => Err(anyhow::anyhow!("cannot listen for Ctrl-C: {error}")),
            },
        }
    }
}

fn new_editor(history: Option<&Path>) -> rustyline::Result<Editor<ChatHelper, DefaultHistory>> {
    let config = rustyline::Config::builder().auto_add_history(false).max_history_size(1000)?.build();
    let mut editor = Editor::with_config(config)?;
    editor.set_helper(Some(ChatHelper));
    if let Some(path) = history.filter(|path| path.exists())
        && let Err(error) = editor.load_history(path)
    {
        tracing::warn!(%error, path = %path.display(), "the prompt history cannot be read; starting without it");
    }
    Ok(editor)
}

fn read_terminal_line(
    editor: &mut Editor<ChatHelper, DefaultHistory>,
    ask: Ask,
    styled: &str,
    history: Option<&Path>,
) -> anyhow::Result<Line> {
    let read = match ask {
        Ask::Message => editor.readline(&(PROMPT, styled)),
        Ask::YesNo(question) => editor.readline(question),
    };
    match read {
        Ok(line) => {
            if matches!(ask, Ask::Message) && !line.trim().is_empty() {
                let _ = editor.add_history_entry(line.as_str());
                if let Some(path) = history
                    && let Err(error) = editor.append_history(path)
                {
                    tracing::warn!(%error, path = %path.display(), "the prompt history cannot be saved");
                }
            }
            Ok(Line::Text(line))
        }
        Err(ReadlineError::Interrupted | ReadlineError::Signal(_)) => Ok(Line::Interrupted),
        Err(ReadlineError::Eof) => Ok(Line::Eof),
        Err(error) => Err(anyhow::anyhow!("cannot read the terminal: {error}")),
    }
}

/// Completes slash commands; the prompt is shown in its styled form.
struct ChatHelper;

impl Completer for ChatHelper {
    type Candidate = String;

    fn complete(&self, line: &str, pos: usize, _: &Context<'_>) -> rustyline::Result<(usize, Vec<String>)> {
        Ok((0, complete_command(&line[..pos])))
    }
}

/// The commands starting with `typed` (a first word that starts with `/`).
fn complete_command(typed: &str) -> Vec<String> {
    if !typed.starts_with('/') || typed.contains(char::is_whitespace) {
        return Vec::new();
    }
    let names = BUILTINS.iter().map(|(_, name, ..)| *name).chain(["resume"]);
    let mut found: Vec<String> = names.map(|name| format!("/{name}")).filter(|command| command.starts_with(typed)).collect();
    found.sort();
    found.dedup();
    found
}

impl Hinter for ChatHelper {
    type Hint = String;
}

impl Highlighter for ChatHelper {}

impl Validator for ChatHelper {}

impl Helper for ChatHelper {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_carry_the_time_and_four_hex_digits() {
        let id = new_thread_id();
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(parts.len(), 4, "{id}");
        assert_eq!(parts[0], "chat");
        assert_eq!((parts[1].len(), parts[2].len()), (8, 6), "{id}");
        assert!(parts[3].len() == 4 && parts[3].chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        assert_ne!(new_thread_id(), new_thread_id());
    }

    #[test]
    fn slash_commands_complete() {
        assert_eq!(complete_command("/pl"), vec!["/planning".to_owned()]);
        assert_eq!(complete_command("/re"), vec!["/resume".to_owned()]);
        assert!(complete_command("/c").contains(&"/config".to_owned()) && complete_command("/c").contains(&"/clear".to_owned()));
        assert!(complete_command("hello").is_empty());
        assert!(complete_command("/planning what").is_empty());
    }

    #[test]
    fn help_is_recognised_with_aliases_but_not_with_a_topic() {
        assert!(asks_for_help("/help"));
        assert!(asks_for_help("/h"));
        assert!(!asks_for_help("/help:planning"));
        assert!(!asks_for_help("help me"));
    }

    #[test]
    fn recaps_are_short_and_on_one_line() {
        assert_eq!(shorten("a\nb  c", 10), "a b c");
        assert_eq!(shorten("abcdef", 3), "abc…");
    }
}

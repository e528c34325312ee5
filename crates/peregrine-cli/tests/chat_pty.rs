//! `peregrine chat` in a pseudo-terminal against the scripted OpenAI-compatible server: a
//! streamed answer, `/help` with the chat's keys, a planning turn whose plan approval is asked
//! and answered at the prompt, Ctrl-C cancelling a slow answer and `/resume` finishing it,
//! and Ctrl-D leaving with exit code 0; the live status line cut to the terminal's width and
//! left out on a dumb terminal. Piped stdin: one turn per line, exit at the end; a streamed
//! answer cut off and retried is shown once.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use expectrl::process::unix::WaitStatus;
use expectrl::{Eof, Expect as _, Session};
use peregrine_testkit::agent_fixture::project_config;
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use serde_json::json;

/// How long any one expected output may take (generous: a debug build on a busy machine).
const STEP: Duration = Duration::from_secs(15);

/// The first answer, streamed in these pieces.
const BEAM_CHUNKS: [&str; 4] = ["The beam ", "energy is ", "3 GeV ", "right now."];
/// The answer after the approved plan.
const PLANNED_ANSWER: &str = "Plan executed: the vacuum is nominal.";
/// The slow answer's pieces; Ctrl-C arrives after the first.
const SLOW_CHUNKS: [&str; 6] = ["Counting ", "one, ", "two, ", "three, ", "four, ", "five."];
/// The answer `/resume` produces.
const RESUMED_ANSWER: &str = "Resumed: every magnet was counted.";

/// A plan whose only step is respond.
fn respond_plan() -> serde_json::Value {
    json!({"steps": [{
        "context_key": "answer", "capability": "respond", "task_objective": "Answer the user",
        "success_criteria": "answered", "expected_output": "user_response", "inputs": []
    }]})
}

/// Every node's reply; respond (the only plain call of these turns) gives `answers` in order.
fn script(answers: Vec<Reply>) -> Script {
    Script::new()
        .on_schema(
            "ExtractedTask",
            Reply::json(json!({"task": "Answer the user's question", "depends_on_chat_history": false, "depends_on_user_memory": false})),
        )
        .on_schema("CapabilitySelection", Reply::json(json!({"reasoning": "no tools needed", "selected": []})))
        .on_schema("ExecutionPlan", Reply::json(respond_plan()))
        .on_plain(Reply::sequence(answers))
}

/// `pieces` streamed one by one.
fn streamed(pieces: &[&str]) -> Reply {
    Reply::text("").with_chunks(pieces.iter().map(|piece| (*piece).to_owned()).collect())
}

/// The slow answer: half a second between pieces, so Ctrl-C lands in the middle.
fn slow() -> Reply {
    streamed(&SLOW_CHUNKS).with_token_latency(Duration::from_millis(500))
}

/// Starts the server for `answers` on a runtime of the test's own (the test thread blocks on
/// the terminal).
fn start(answers: Vec<Reply>) -> (tokio::runtime::Runtime, ScriptedLlmServer) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let server = runtime.block_on(ScriptedLlmServer::start(script(answers)));
    (runtime, server)
}

/// A project directory: `config.yml` pointing every role at the server, SQLite checkpoints.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(base_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = project_config(base_url, "sk-test");
        std::fs::write(dir.path().join("config.yml"), config).expect("config.yml");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.path().join("config.yml")
    }

    /// `peregrine --config config.yml chat <args>` with a clean environment.
    fn chat(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_peregrine"));
        command
            .current_dir(self.path())
            .arg("--config")
            .arg(self.config())
            .arg("chat")
            .args(args)
            .env("HOME", self.path())
            .env("TERM", "xterm")
            .env("NO_COLOR", "1")
            .env("USER", "ada");
        for variable in ["PEREGRINE_CONFIG", "CONFIG_FILE", "PEREGRINE_LOG", "PEREGRINE_DATA_DIR"] {
            command.env_remove(variable);
        }
        command
    }
}

/// Waits for `needle` in the terminal output; on failure, says what was being waited for.
fn expect(session: &mut expectrl::session::OsSession, needle: &str, what: &str) -> String {
    match session.expect(needle) {
        Ok(found) => String::from_utf8_lossy(found.before()).into_owned(),
        Err(error) => panic!("{what}: waiting for {needle:?}: {error}"),
    }
}

/// `peregrine chat <args>` in a pseudo-terminal.
fn spawn(project: &Project, args: &[&str]) -> expectrl::session::OsSession {
    let mut session = Session::spawn(project.chat(args)).expect("spawn peregrine chat in a pty");
    session.set_expect_timeout(Some(STEP));
    session
}

/// Ctrl-D at the prompt ends the chat with exit code 0.
fn leave(mut session: expectrl::session::OsSession) {
    session.send("\x04").expect("Ctrl-D");
    session.expect(Eof).expect("the chat ends at Ctrl-D");
    let status = session.get_process().wait().expect("wait");
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "Ctrl-D exits with 0: {status:?}");
}

/// `lines` piped into `peregrine chat <args>`: (exit success, stdout, stderr).
fn piped(project: &Project, args: &[&str], lines: &str) -> (bool, String, String) {
    let mut child =
        project.chat(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn peregrine chat");
    child.stdin.take().expect("stdin").write_all(lines.as_bytes()).expect("write stdin");
    let output = child.wait_with_output().expect("chat ends at the end of input");
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_conversation_in_a_terminal_streams_asks_cancels_resumes_and_exits() {
    let (_runtime, server) = start(vec![streamed(&BEAM_CHUNKS), Reply::text(PLANNED_ANSWER), slow(), Reply::text(RESUMED_ANSWER)]);
    let project = Project::new(&server.base_url());
    let mut session = spawn(&project, &[]);

    let header = expect(&mut session, "you> ", "the first prompt");
    assert!(header.contains("thread chat-"), "the header names the new thread: {header}");
    assert!(header.contains("scripted-model (scripted)"), "the header names the response model: {header}");

    session.send_line("What is the beam energy?").expect("send");
    expect(&mut session, &BEAM_CHUNKS.concat(), "the streamed answer");
    expect(&mut session, "you> ", "the prompt after the answer");

    session.send_line("/help").expect("send");
    expect(&mut session, "Commands (put them before your question)", "the gateway's help");
    expect(&mut session, "Ctrl-D", "the chat's keys in the help");
    expect(&mut session, "you> ", "the prompt after /help");

    session.send_line("/planning Check the vacuum").expect("send");
    expect(&mut session, "HUMAN APPROVAL REQUIRED", "the plan approval prompt");
    expect(&mut session, "answer yes / no", "the approval hint");
    expect(&mut session, "you> ", "the prompt for the approval answer");
    session.send_line("yes").expect("send");
    expect(&mut session, PLANNED_ANSWER, "the answer of the approved plan");
    expect(&mut session, "you> ", "the prompt after the planned turn");

    session.send_line("/status").expect("send");
    expect(&mut session, "status:    idle", "/status");
    expect(&mut session, "turns:     2", "/status counts the turns");
    expect(&mut session, "approvals: selective", "/status shows the approval mode");
    expect(&mut session, "you> ", "the prompt after /status");
    session.send_line("/config").expect("send");
    let shown = expect(&mut session, "you> ", "/config");
    assert!(shown.contains("scripted-model") && shown.contains("state/peregrine.db"), "/config shows the configuration: {shown}");
    assert!(!shown.contains("sk-test"), "/config never shows the API key: {shown}");

    session.send_line("Count the magnets slowly").expect("send");
    expect(&mut session, SLOW_CHUNKS[0], "the first token of the slow answer");
    session.send("\x03").expect("Ctrl-C");
    expect(&mut session, "cancelled", "the cancellation notice");
    expect(&mut session, "you> ", "the prompt after Ctrl-C");
    session.send_line("/resume").expect("send");
    expect(&mut session, RESUMED_ANSWER, "the resumed turn's answer");
    expect(&mut session, "you> ", "the prompt after /resume");

    // Ctrl-C at the prompt clears the line and keeps the session.
    session.send("half a line\x03").expect("Ctrl-C at the prompt");
    expect(&mut session, "you> ", "the prompt after Ctrl-C at the prompt");

    leave(session);

    let history = std::fs::read_to_string(project.path().join("_agent_data").join("chat_history.txt")).expect("history file");
    assert!(history.contains("Count the magnets slowly") && history.contains("/resume"), "the prompt history is saved: {history}");
    assert!(!history.contains("half a line"), "an interrupted line is not kept: {history}");
}

#[test]
fn a_cut_off_turn_is_offered_for_finishing_when_the_thread_is_reopened() {
    let (_runtime, server) = start(vec![slow(), Reply::text(RESUMED_ANSWER)]);
    let project = Project::new(&server.base_url());
    let mut session = spawn(&project, &["--thread", "magnets"]);
    expect(&mut session, "you> ", "the first prompt");
    session.send_line("Count the magnets slowly").expect("send");
    expect(&mut session, SLOW_CHUNKS[0], "the first token of the slow answer");
    session.send("\x03").expect("Ctrl-C");
    expect(&mut session, "cancelled", "the cancellation notice");
    expect(&mut session, "you> ", "the prompt after Ctrl-C");
    leave(session);

    let mut session = spawn(&project, &["--thread", "magnets"]);
    expect(&mut session, "continuing thread 'magnets' (1 turns so far)", "the recap");
    expect(&mut session, "you> Count the magnets slowly", "the recap shows the last message");
    expect(&mut session, "finish it now? [Y/n] ", "the offer to finish the cut-off turn");
    session.send_line("").expect("Enter");
    expect(&mut session, RESUMED_ANSWER, "the finished turn's answer");
    expect(&mut session, "you> ", "the prompt after finishing");
    leave(session);
    assert_eq!(server.chat_requests().iter().filter(|request| request.schema_name.is_none()).count(), 2, "respond ran twice");
    assert_eq!(
        server.chat_requests().iter().filter(|request| request.schema_name.as_deref() == Some("ExtractedTask")).count(),
        1,
        "the finished steps are not repeated"
    );
}

#[test]
fn piped_lines_are_one_turn_each_and_a_pending_approval_is_shown_on_reopening() {
    let (_runtime, server) = start(vec![Reply::text("First answer."), Reply::text("Second answer."), Reply::text(PLANNED_ANSWER)]);
    let project = Project::new(&server.base_url());

    let (success, stdout, stderr) =
        piped(&project, &["--thread", "piped"], "first question\n\nsecond question\n/planning Check the vacuum\n");
    assert!(success, "exit 0 at the end of input: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..2], ["First answer.", "Second answer."], "one answer per line; an empty line is no turn: {stdout}");
    assert!(stdout.contains("HUMAN APPROVAL REQUIRED"), "the plan approval is asked: {stdout}");
    assert!(!stdout.contains("you> ") && !stderr.contains("you> "), "no prompt when piped");
    assert!(stderr.contains("thread piped"), "the header names the thread: {stderr}");

    let (success, stdout, stderr) = piped(&project, &["--thread", "piped"], "yes\n");
    assert!(success, "exit 0: {stderr}");
    assert!(stderr.contains("continuing thread 'piped' (3 turns so far)"), "the recap: {stderr}");
    assert!(stderr.contains("answer yes / no"), "the pending approval is repeated with the hint: {stderr}");
    assert!(stderr.contains("your message was taken as the answer to the pending approval: approved"), "{stderr}");
    assert!(stdout.starts_with("⚠️ **HUMAN APPROVAL REQUIRED**"), "the approval prompt comes first: {stdout}");
    assert!(stdout.trim_end().ends_with(PLANNED_ANSWER), "the next line answers it: {stdout}");
    assert_eq!(server.chat_requests().iter().filter(|request| request.schema_name.is_none()).count(), 3);
}

#[test]
fn a_streamed_answer_cut_off_and_retried_is_shown_once_whole() {
    let cut = streamed(&["PARTIAL-A ", "PARTIAL-B ", "never sent"]).with_fault(Fault::TruncatedStream { after_chunks: 3 });
    let (_runtime, server) = start(vec![cut, streamed(&["Full ", "answer."])]);
    let project = Project::new(&server.base_url());
    let (success, stdout, stderr) = piped(&project, &["-t", "retry"], "What is the answer?\n/resume now please\n");
    assert!(success, "{stderr}");
    assert_eq!(stdout.lines().last(), Some("Full answer."), "the retried answer on a line of its own: {stdout:?}");
    assert_eq!(stdout.matches("Full answer.").count(), 1, "printed once: {stdout:?}");
    assert!(stderr.contains("the answer was cut off; retrying"), "{stderr}");
    assert!(stderr.contains("/resume takes nothing after it"), "/resume with words is refused: {stderr}");
    assert!(stderr.contains("thread retry"), "-t names the thread: {stderr}");
}

#[test]
fn the_live_line_fits_the_terminal_and_a_dumb_terminal_gets_none() {
    let (_runtime, server) = start(vec![Reply::text("First answer."), Reply::text("Second answer.")]);
    let project = Project::new(&server.base_url());
    let mut command = project.chat(&[]);
    command.env("COLUMNS", "24");
    let mut session = Session::spawn(command).expect("spawn peregrine chat in a pty");
    session.set_expect_timeout(Some(STEP));
    expect(&mut session, "you> ", "the first prompt");
    session.send_line("What is the beam energy?").expect("send");
    let shown = expect(&mut session, "First answer.", "the answer");
    assert!(shown.contains("\x1b[2K"), "a live line is drawn: {shown:?}");
    assert!(shown.contains("understanding") && !shown.contains("understanding the request"), "cut to 24 columns: {shown:?}");
    expect(&mut session, "you> ", "the prompt after the answer");
    leave(session);

    let mut command = project.chat(&[]);
    command.env("TERM", "dumb");
    let mut session = Session::spawn(command).expect("spawn peregrine chat in a pty");
    session.set_expect_timeout(Some(STEP));
    expect(&mut session, "you> ", "the first prompt");
    session.send_line("What is the beam energy?").expect("send");
    let shown = expect(&mut session, "Second answer.", "the answer");
    assert!(!shown.contains("\x1b[2K") && !shown.contains("extracting"), "no live line on a dumb terminal: {shown:?}");
    expect(&mut session, "you> ", "the prompt after the answer");
    leave(session);
}

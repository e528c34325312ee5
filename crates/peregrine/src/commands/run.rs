//! `peregrine run`: one turn for scripts. Answering an approval is the next `run` on the same
//! thread; `--resume` finishes a run that was cut off.

use std::process::ExitCode;

use peregrine_agent::{AgentError, ApprovalOutcome, NothingToContinue, Session, TurnResult, TurnStatus};
use peregrine_graph::RunError;
use serde_json::{Value, json};

use crate::app::Application;
use crate::cli::{EXIT_FAILURE, Failure};
use crate::config::Config;
use crate::output::{Output, Style};
use crate::runtime;
use crate::turn::{
    EXIT_INTERRUPTED, JsonView, TextView, TurnRequest, TurnView, check_thread_id, drive, println_out, text_to_print, thread_flag,
};

/// What `run --help` adds about the output and the exit codes.
const AFTER_HELP: &str = "\
Output: the answer on stdout (streamed as it is written), progress and notes on stderr. With \
--json, stdout carries only JSON lines: one object per event, then always a final \
{\"type\":\"result\",\"status\":…} — status completed, interrupted (an approval is needed: the \
next `run` on the thread answers it: yes, no/cancel to withdraw it, or what to change), \
abandoned (this message withdrew the approval: nothing ran), error, or cancelled.

Exit codes: 0 when the turn ran (even when it ended in an error report: status error); 2 for \
usage and configuration errors (the JSON result says why); 1 when the checkpoint store fails; \
130 after Ctrl-C (status cancelled: the finished steps are kept, `--resume` finishes the turn; \
a second Ctrl-C exits at once). A closed stdout (`| head`) stops the output, not the turn: it \
finishes, is stored, and the exit code is the turn's.";

/// `run` options.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct RunArgs {
    /// The message (an answer when the thread waits for an approval).
    #[arg(required_unless_present = "resume")]
    pub message: Option<String>,
    /// The conversation thread.
    #[arg(long, short = 't', default_value = "main")]
    pub thread: String,
    /// One JSON object per event on stdout, then a final `{"type":"result",…}` (also on errors).
    #[arg(long)]
    pub json: bool,
    /// Continue the thread's run that was cut off (crash, kill, Ctrl-C) from its last checkpoint.
    #[arg(long, conflicts_with = "message")]
    pub resume: bool,
    /// The user id (memory is per user; default: $USER).
    #[arg(long)]
    pub user: Option<String>,
}

/// The session of a command-line user.
pub fn cli_session(user: Option<&str>) -> Session {
    let user =
        user.map(str::to_owned).or_else(|| std::env::var("USER").ok().filter(|user| !user.is_empty())).unwrap_or_else(|| "cli_user".into());
    Session::new(user, "cli")
}

/// Runs the turn. With `--json`, every failure also ends stdout with an error result.
pub async fn run(args: &RunArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<ExitCode, Failure> {
    let outcome = execute(args, config, app, out).await;
    if let Err(failure) = &outcome {
        report_failure(args, failure);
    }
    outcome
}

/// With `--json`, ends stdout with the error result of `failure` — for every failure of `run`,
/// including those found before it starts (a configuration that does not load).
pub fn report_failure(args: &RunArgs, failure: &Failure) {
    if args.json {
        JsonView::emit(&error_json(&args.thread, &failure.message));
    }
}

async fn execute(args: &RunArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<ExitCode, Failure> {
    let bin = app.name();
    let thread = args.thread.as_str();
    check_thread_id(thread).map_err(Failure::usage)?;
    let flag = thread_flag(thread);
    if let Some(message) = args.message.as_deref() {
        check_message(message, bin, &flag)?;
    }
    // A store that cannot be opened is a failure (1); an agent that cannot be built from the
    // configuration is a configuration error (2).
    let store = runtime::open_store(config).await.map_err(Failure::from)?;
    let agent = runtime::agent_on(config, app, store).map_err(|error| Failure::usage(format!("{error:#}")))?;
    let request = if args.resume { TurnRequest::Continue } else { TurnRequest::Send(args.message.as_deref().unwrap_or_default()) };
    let session = cli_session(args.user.as_deref());
    let abort_hint = format!("`{bin} run {flag} --resume` finishes the turn");
    let mut json_view = JsonView::new(thread);
    let mut text_view = TextView::new(*out, abort_hint);
    let view: &mut dyn TurnView = if args.json { &mut json_view } else { &mut text_view };
    let driven = drive(&agent, thread, request, &session, view).await;
    let code = if driven.interrupted_by_user { ExitCode::from(EXIT_INTERRUPTED) } else { ExitCode::SUCCESS };
    let result = match driven.result {
        Ok(result) => result,
        Err(AgentError::Gateway(error)) => return Err(Failure::usage(error.to_string())),
        Err(AgentError::NothingToContinue(why)) => {
            return Err(Failure::usage(match why {
                NothingToContinue::NoThread => {
                    format!("there is no thread '{thread}' to resume; `{bin} threads list` shows the threads")
                }
                NothingToContinue::Finished => {
                    format!("thread '{thread}' has no unfinished run: its last run finished; send a new message instead")
                }
                NothingToContinue::ApprovalPending => {
                    format!("thread '{thread}' waits for an approval, not a resume; answer it: `{bin} run {flag} yes` (or no)")
                }
            }));
        }
        Err(AgentError::Run(RunError::PendingResume { .. })) => return Err(Failure::usage(finish_first(thread, bin, &flag))),
        Err(AgentError::Run(error @ (RunError::Checkpoint(_) | RunError::State { .. }))) => {
            return Err(Failure { message: config.redact(&error.to_string()), code: EXIT_FAILURE });
        }
        Err(error) => {
            let message = config.redact(&error.to_string());
            if args.json {
                JsonView::emit(&error_json(thread, &message));
            } else {
                out.error(&message);
            }
            return Ok(code);
        }
    };
    if args.json {
        if let Some(answered) = &result.approval {
            JsonView::emit(&json!({
                "type": "approval_answer", "thread_id": thread, "interrupt_id": answered.interrupt_id,
                "approved": answered.outcome == ApprovalOutcome::Approved, "outcome": answered.outcome.as_str(),
            }));
        }
        JsonView::emit(&result_json(thread, &result, config));
    } else {
        if result.left_cut_off_run {
            out.warn(&format!(
                "thread '{thread}' had a run that was cut off; this message started a new turn instead (`{bin} run {flag} --resume` would have finished it)"
            ));
        }
        if let Some(answered) = &result.approval {
            out.note(&approval_note(answered.outcome));
        }
        show_text(&result, &driven.streamed, config, out, bin, &flag);
    }
    Ok(code)
}

/// Refuses messages that cannot be a turn: empty ones (on a waiting thread they would count as
/// a rejection) and chat's `/resume`.
fn check_message(message: &str, bin: &str, flag: &str) -> Result<(), Failure> {
    let trimmed = message.trim();
    if trimmed.is_empty() {
        return Err(Failure::usage("the message is empty; say what you want (or `yes` / `no` to answer a pending approval)"));
    }
    let first = trimmed.split_whitespace().next().unwrap_or_default();
    if first.eq_ignore_ascii_case("/resume") {
        return Err(Failure::usage(format!("/resume is a chat command; `run` finishes a cut-off turn with `{bin} run {flag} --resume`")));
    }
    Ok(())
}

/// The refusal for a thread holding an answer whose node has not run yet.
fn finish_first(thread: &str, bin: &str, flag: &str) -> String {
    format!("thread '{thread}' has a turn to finish first: `{bin} run {flag} --resume`")
}

/// The note when a message answered a pending approval.
pub fn approval_note(outcome: ApprovalOutcome) -> String {
    match outcome {
        ApprovalOutcome::Abandoned => "your message withdrew the pending approval: nothing was run".to_owned(),
        outcome => format!("your message was taken as the answer to the pending approval: {}", outcome.as_str()),
    }
}

/// `completed`, `interrupted`, `error` or `cancelled`.
fn status_name(status: TurnStatus) -> &'static str {
    match status {
        TurnStatus::Failed => "error",
        TurnStatus::Interrupted => "interrupted",
        TurnStatus::Cancelled => "cancelled",
        TurnStatus::Abandoned => "abandoned",
        _ => "completed",
    }
}

/// The text of interface commands in a one-shot run.
fn interface_reply(result: &TurnResult, config: &Config) -> Option<String> {
    let command = result.command.as_ref()?;
    Some(match command.name.as_str() {
        "config" => serde_json::to_string_pretty(&config.redacted()).unwrap_or_default(),
        "status" => {
            let state = result.state.as_ref();
            let turns = state.map_or(0, |state| state.messages.iter().filter(|m| m.role == peregrine_core::Role::User).count());
            format!("{turns} turns on this thread")
        }
        other => format!("/{other} has no effect in a one-shot run"),
    })
}

fn result_json(thread: &str, result: &TurnResult, config: &Config) -> Value {
    let response = result.response.clone().or_else(|| interface_reply(result, config));
    json!({
        "type": "result",
        "thread_id": thread,
        "status": status_name(result.status),
        "response": response,
        "interrupt": result.interrupt.as_ref().map(peregrine_agent::wire::interrupt_json),
    })
}

/// The final object of a run that could not act.
fn error_json(thread: &str, message: &str) -> Value {
    json!({"type": "result", "thread_id": thread, "status": "error", "response": Value::Null, "interrupt": Value::Null, "error": message})
}

fn show_text(result: &TurnResult, streamed: &str, config: &Config, out: &Output, bin: &str, flag: &str) {
    match result.status {
        TurnStatus::Cancelled => {
            out.warn(&format!("cancelled; the finished steps are kept: `{bin} run {flag} --resume` finishes the turn"));
        }
        TurnStatus::Exit => {}
        _ => {
            if let Some(text) = text_to_print(result, streamed, interface_reply(result, config)) {
                println_out(text.trim_end());
            }
            if result.status == TurnStatus::Interrupted {
                out.note(&format!(
                    "{} answer with `{bin} run {flag} yes` or `… no` (or say what to change)",
                    Style::Warning.paint("approval needed:", out.color_stderr)
                ));
            }
        }
    }
}

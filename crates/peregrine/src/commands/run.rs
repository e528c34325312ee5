//! `peregrine run`: one turn for scripts. Answering an approval is the next `run` on the same
//! thread; `--resume` finishes a run that was cut off.

use std::process::ExitCode;

use peregrine_agent::{AgentError, Session, TurnResult, TurnStatus};
use serde_json::{Value, json};

use crate::app::Application;
use crate::cli::Failure;
use crate::config::Config;
use crate::output::{Output, Style};
use crate::runtime::{self, ThreadStatus};
use crate::turn::{JsonView, TextView, TurnRequest, TurnView, drive};

/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// `run` options.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The message (an answer when the thread waits for an approval).
    #[arg(required_unless_present = "resume")]
    pub message: Option<String>,
    /// The conversation thread.
    #[arg(long, short = 't', default_value = "main")]
    pub thread: String,
    /// One JSON object per event on stdout, then a final `{"type":"result",…}`.
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

/// Runs the turn.
pub async fn run(args: &RunArgs, config: &Config, app: &dyn Application, out: &Output) -> Result<ExitCode, Failure> {
    let agent = runtime::agent(config, app).await.map_err(|error| Failure::usage(format!("{error:#}")))?;
    let thread = args.thread.as_str();
    let snapshot = agent.graph().get_state(thread).await.map_err(|error| Failure::from(anyhow::Error::from(error)))?;
    let status = snapshot.as_ref().map(ThreadStatus::of);
    let request = if args.resume {
        let bin = app.name();
        match status {
            None => return Err(Failure::usage(format!("there is no thread '{thread}' to resume; `{bin} threads list` shows the threads"))),
            Some(ThreadStatus::Idle) => {
                return Err(Failure::usage(format!(
                    "thread '{thread}' has no unfinished run: its last run finished; send a new message instead"
                )));
            }
            Some(ThreadStatus::Interrupted) => {
                return Err(Failure::usage(format!(
                    "thread '{thread}' waits for an approval, not a resume; answer it: `{bin} run --thread {thread} yes` (or no)"
                )));
            }
            Some(ThreadStatus::Unfinished) => TurnRequest::Continue,
        }
    } else {
        if status == Some(ThreadStatus::Unfinished) {
            out.warn(&format!(
                "thread '{thread}' has a run that was cut off; this message starts a new turn (`--resume` would have finished it)"
            ));
        }
        TurnRequest::Send(args.message.as_deref().unwrap_or_default())
    };
    let session = cli_session(args.user.as_deref());
    let mut json_view = JsonView::default();
    let mut text_view = TextView::new(*out);
    let view: &mut dyn TurnView = if args.json { &mut json_view } else { &mut text_view };
    let driven = drive(&agent, thread, request, &session, view).await;
    let code = if driven.interrupted_by_user { ExitCode::from(EXIT_INTERRUPTED) } else { ExitCode::SUCCESS };
    match driven.result {
        Ok(result) => {
            if args.json {
                JsonView::emit(&result_json(thread, &result, config));
            } else {
                show_text(thread, &result, driven.streamed, config, app, out);
            }
            Ok(code)
        }
        Err(AgentError::Gateway(error)) => Err(Failure::usage(error.to_string())),
        Err(error) => {
            let message = config.redact(&error.to_string());
            if args.json {
                JsonView::emit(
                    &json!({"type": "result", "thread_id": thread, "status": "error", "response": Value::Null, "interrupt": Value::Null, "error": message}),
                );
            } else {
                out.error(&message);
            }
            Ok(code)
        }
    }
}

/// `completed`, `interrupted`, `error` or `cancelled`.
fn status_name(status: TurnStatus) -> &'static str {
    match status {
        TurnStatus::Failed => "error",
        TurnStatus::Interrupted => "interrupted",
        TurnStatus::Cancelled => "cancelled",
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
        "interrupt": result.interrupt,
    })
}

fn show_text(thread: &str, result: &TurnResult, streamed: bool, config: &Config, app: &dyn Application, out: &Output) {
    let bin = app.name();
    match result.status {
        TurnStatus::Cancelled => {
            out.warn(&format!("cancelled; the finished steps are kept: `{bin} run --thread {thread} --resume` finishes the turn"));
        }
        TurnStatus::Exit => {}
        _ => {
            let text = result.response.clone().or_else(|| interface_reply(result, config));
            if let (false, Some(text)) = (streamed, text) {
                println!("{}", text.trim_end());
            }
            if result.status == TurnStatus::Interrupted {
                out.note(&format!(
                    "{} answer with `{bin} run --thread {thread} yes` or `… no` (or say what to change)",
                    Style::Warning.paint("approval needed:", out.color_stderr)
                ));
            }
        }
    }
}

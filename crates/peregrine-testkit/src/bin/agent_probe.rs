//! `agent_probe`: a child process the cross-process agent tests start once per message. It
//! builds the hello-world-weather agent on a SQLite checkpoint file, a data directory and the
//! scripted LLM server at a base URL (the test's, over loopback), handles ONE message (or one
//! approval with an edited plan), prints the outcome as one JSON line and exits.
//!
//! ```text
//! agent_probe <db> <data_dir> <base_url> <thread> send <message>
//! agent_probe <db> <data_dir> <base_url> <thread> approve-edit <plan-json>
//! ```
//!
//! `send` goes through `Agent::send` like any interface (a pending approval is answered by the
//! text); `approve-edit` approves the thread's pending question with an edited payload through
//! `Agent::answer_approval`. The outcome: `{"status", "response", "interrupt": {id, node,
//! digest, payload} | null, "plan": [steps] | null, "weather": {context_key: location},
//! "messages": n, "has_error": bool}`. Errors go to stderr with exit code 1.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use peregrine_agent::{Agent, ApprovalRef, ApprovalReply, Session, TurnOptions, TurnResult};
use peregrine_testkit::agent_fixture::weather_agent;
use serde_json::{Map, Value, json};

/// The provider read timeout of the probe's agent: generous, the tests inject no timeouts here.
const TIMEOUT_SECONDS: f64 = 30.0;

const USAGE: &str = "usage: agent_probe <db> <data_dir> <base_url> <thread> send <message> | approve-edit <plan-json>";

/// What to do with the thread.
enum Action {
    /// A message through `Agent::send`.
    Send(String),
    /// Approve the pending question with this edited plan.
    ApproveEdit(Value),
}

/// A parsed command line.
struct Command {
    db: PathBuf,
    data_dir: PathBuf,
    base_url: String,
    thread: String,
    action: Action,
}

fn parse(args: &[String]) -> anyhow::Result<Command> {
    let [db, data_dir, base_url, thread, verb, argument] = args else { bail!("{USAGE}") };
    let action = match verb.as_str() {
        "send" => Action::Send(argument.clone()),
        "approve-edit" => {
            Action::ApproveEdit(serde_json::from_str(argument).with_context(|| format!("the edited plan {argument:?} is not JSON"))?)
        }
        _ => bail!("{USAGE}"),
    };
    Ok(Command { db: db.into(), data_dir: data_dir.into(), base_url: base_url.clone(), thread: thread.clone(), action })
}

/// The outcome line.
fn report(result: &TurnResult) -> Value {
    let interrupt = result
        .interrupt
        .as_ref()
        .map(|interrupt| json!({"id": interrupt.id, "node": interrupt.node, "digest": interrupt.digest, "payload": interrupt.payload}));
    let state = result.state.as_deref();
    let plan = state.and_then(|state| state.planning.execution_plan.as_ref()).map(|plan| json!(plan.steps));
    let weather: Map<String, Value> = state
        .map(|state| {
            state
                .capability_context_data
                .all_of_type("CURRENT_WEATHER")
                .map(|(key, entry)| (key.to_owned(), entry.data.get("location").cloned().unwrap_or(Value::Null)))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "status": result.status.as_str(),
        "response": result.response,
        "interrupt": interrupt,
        "plan": plan,
        "weather": weather,
        "messages": state.map(|state| state.messages.len()),
        "has_error": state.map(|state| state.control.has_error),
    })
}

async fn execute(command: Command) -> anyhow::Result<Value> {
    let agent: Agent = weather_agent(&command.base_url, TIMEOUT_SECONDS, &command.db, &command.data_dir).await?;
    let thread = command.thread.as_str();
    let result = match command.action {
        Action::Send(text) => agent
            .send(thread, &text, &Session::new("probe-user", "cli"), TurnOptions::default())
            .await
            .with_context(|| format!("the message {text:?} on '{thread}' failed"))?,
        Action::ApproveEdit(plan) => {
            let found = agent.thread(thread).await?.with_context(|| format!("thread '{thread}' has no checkpoint"))?;
            let interrupt = found.interrupt().cloned().with_context(|| format!("thread '{thread}' has no pending approval"))?;
            agent
                .answer_approval(thread, &ApprovalRef::to(&interrupt), ApprovalReply::Approve { edit: Some(plan) }, TurnOptions::default())
                .await
                .with_context(|| format!("approving interrupt {} on '{thread}' failed", interrupt.id))?
        }
    };
    Ok(report(&result))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(|command| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("could not start the async runtime")?;
        runtime.block_on(execute(command))
    });
    match result.and_then(|outcome| Ok(serde_json::to_string(&outcome)?)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("agent_probe: {error:#}");
            ExitCode::FAILURE
        }
    }
}

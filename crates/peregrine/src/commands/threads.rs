//! `peregrine threads list|show|history|delete`.

use anyhow::Context as _;
use peregrine_agent::{Agent, ThreadStatus};
use peregrine_core::Role;
use peregrine_graph::{CheckpointError, ListQuery, RunError};
use serde_json::json;

use crate::app::FrameworkApp;
use crate::config::Config;
use crate::output::{Output, Style};
use crate::runtime::{open_store, reader_agent};
use crate::turn::{invoked_name, parse_thread_id, println_out, thread_flag};

/// `threads` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ThreadsCommand {
    /// Every thread: status, checkpoints, last activity.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A thread's conversation and status.
    Show {
        /// The thread.
        #[arg(value_parser = parse_thread_id)]
        thread: String,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A thread's checkpoints, newest first.
    History {
        /// The thread.
        #[arg(value_parser = parse_thread_id)]
        thread: String,
        /// At most this many (1 or more).
        #[arg(long, value_parser = parse_limit)]
        limit: Option<usize>,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a thread, all its checkpoints and its pending plan.
    Delete {
        /// The thread.
        #[arg(value_parser = parse_thread_id)]
        thread: String,
    },
}

/// `--limit`: a positive count (0 would list nothing and look like a missing thread).
fn parse_limit(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("the limit must be at least 1".into()),
        Ok(limit) => Ok(limit),
        Err(_) => Err(format!("'{text}' is not a count; give a number of checkpoints, e.g. 20")),
    }
}

/// Runs the subcommand.
pub async fn run(command: &ThreadsCommand, config: &Config, out: &Output) -> anyhow::Result<()> {
    let store = open_store(config).await?;
    // Any registry decodes the state; the framework's is enough and loads no model.
    let agent = reader_agent(config, &FrameworkApp, store)?;
    let bin = invoked_name();
    match command {
        ThreadsCommand::List { json } => list(&agent, *json, out).await,
        ThreadsCommand::Show { thread, json } => show(&agent, thread, *json, out, &bin).await,
        ThreadsCommand::History { thread, limit, json } => history(&agent, thread, *limit, *json, out, &bin).await,
        ThreadsCommand::Delete { thread } => delete(&agent, thread, &bin).await,
    }
}

fn no_such_thread(thread: &str, bin: &str) -> String {
    format!("there is no thread '{thread}'; `{bin} threads list` shows the threads")
}

async fn delete(agent: &Agent, thread: &str, bin: &str) -> anyhow::Result<()> {
    match agent.delete_thread(thread).await {
        Ok(true) => {}
        Ok(false) => anyhow::bail!(no_such_thread(thread, bin)),
        Err(RunError::Checkpoint(CheckpointError::ThreadBusy { .. })) => {
            anyhow::bail!("thread '{thread}' is running in another process; delete it once that run has ended")
        }
        Err(error) => return Err(error.into()),
    }
    println_out(&format!("deleted thread '{thread}'"));
    Ok(())
}

async fn list(agent: &Agent, as_json: bool, out: &Output) -> anyhow::Result<()> {
    let threads = agent.threads().await?;
    let mut rows = Vec::with_capacity(threads.len());
    for summary in &threads {
        // A thread deleted meanwhile is simply not listed.
        if let Some(thread) = agent.thread(&summary.thread_id).await? {
            rows.push((summary, thread.status, thread.turns()));
        }
    }
    if as_json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(summary, status, turns)| {
                json!({"thread_id": summary.thread_id, "status": status, "turns": turns, "checkpoints": summary.checkpoints, "updated_at": summary.latest.created_at})
            })
            .collect();
        println_out(&serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        out.note("no threads yet");
        return Ok(());
    }
    let header = format!("{:<28} {:<12} {:>5} {:>11}  {}", "THREAD", "STATUS", "TURNS", "CHECKPOINTS", "UPDATED");
    if !println_out(&Style::Bold.paint(&header, out.color_stdout)) {
        return Ok(());
    }
    for (summary, status, turns) in rows {
        let status = status.as_str();
        let row = format!(
            "{:<28} {:<12} {:>5} {:>11}  {}",
            summary.thread_id,
            status,
            turns,
            summary.checkpoints,
            summary.latest.created_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
        // A closed pipe (`| head -1`) ends the listing.
        if !println_out(&row) {
            break;
        }
    }
    Ok(())
}

async fn show(agent: &Agent, thread: &str, as_json: bool, out: &Output, bin: &str) -> anyhow::Result<()> {
    let found = agent.thread(thread).await?.with_context(|| no_such_thread(thread, bin))?;
    let (snapshot, status) = (&found.snapshot, found.status);
    if as_json {
        let value = json!({
            "thread_id": thread,
            "status": status,
            "messages": snapshot.state.messages,
            "interrupt": snapshot.meta.interrupt,
            "checkpoint_id": snapshot.meta.checkpoint_id,
        });
        println_out(&serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    for message in &snapshot.state.messages {
        let who = match message.role {
            Role::User => Style::Accent.paint("you", out.color_stdout),
            Role::Assistant => Style::Bold.paint("agent", out.color_stdout),
            _ => Style::Dim.paint("system", out.color_stdout),
        };
        let when = Style::Dim.paint(&message.timestamp.format("%Y-%m-%d %H:%M").to_string(), out.color_stdout);
        if !println_out(&format!("{who} {when}\n{}\n", message.content.trim_end())) {
            return Ok(());
        }
    }
    let flag = thread_flag(thread);
    let footer = match status {
        ThreadStatus::Idle | ThreadStatus::Failed => return Ok(()),
        ThreadStatus::Busy => "a run of another process holds this thread".to_owned(),
        ThreadStatus::Interrupted => {
            format!("waiting for an approval: the next message answers it (`{bin} run {flag} yes` or `… no`)")
        }
        ThreadStatus::Unfinished if snapshot.meta.resume.is_some() => {
            format!("an answered approval waits for its step to run; finish the turn with `{bin} run {flag} --resume`")
        }
        ThreadStatus::Unfinished => format!("a run was cut off; finish it with `{bin} run {flag} --resume`"),
    };
    println_out(&Style::Warning.paint(&footer, out.color_stdout));
    Ok(())
}

async fn history(agent: &Agent, thread: &str, limit: Option<usize>, as_json: bool, out: &Output, bin: &str) -> anyhow::Result<()> {
    let history = agent.history(thread, ListQuery { before: None, limit }).await?;
    if history.is_empty() {
        anyhow::bail!(no_such_thread(thread, bin));
    }
    if as_json {
        println_out(&serde_json::to_string_pretty(&history)?);
        return Ok(());
    }
    let rows: Vec<_> = history
        .iter()
        .map(|meta| {
            let source = serde_json::to_value(meta.source).ok().and_then(|value| value.as_str().map(str::to_lowercase));
            let node = match (&meta.node, &meta.interrupt) {
                (Some(node), Some(_)) => format!("{node} (waiting)"),
                (Some(node), None) => node.clone(),
                (None, _) => "-".to_owned(),
            };
            (meta, source.unwrap_or_else(|| format!("{:?}", meta.source).to_lowercase()), node)
        })
        .collect();
    // Wide enough for every node name of this thread ("orchestrator (waiting)").
    let width = rows.iter().map(|(_, _, node)| node.chars().count()).max().unwrap_or(0).max("NODE".len());
    let header = format!("{:>6}  {:<7} {:<width$} {:>4}  {:<23} {}", "ID", "SOURCE", "NODE", "STEP", "TIME", "RUN");
    if !println_out(&Style::Bold.paint(&header, out.color_stdout)) {
        return Ok(());
    }
    for (meta, source, node) in rows {
        let row = format!(
            "{:>6}  {:<7} {:<width$} {:>4}  {:<23} {}",
            meta.checkpoint_id,
            source,
            node,
            meta.run_step,
            meta.created_at.format("%Y-%m-%d %H:%M:%S%.3f"),
            meta.run_id
        );
        if !println_out(&row) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_a_positive_count() {
        assert_eq!(parse_limit("20"), Ok(20));
        assert!(parse_limit("0").is_err());
        assert!(parse_limit("-1").is_err());
        assert!(parse_limit("many").is_err());
    }
}

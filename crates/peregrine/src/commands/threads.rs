//! `peregrine threads list|show|history|delete`.

use std::sync::Arc;

use anyhow::Context as _;
use peregrine_core::{AgentState, Role};
use peregrine_graph::{DynCheckpointer, Graph, ListQuery};
use serde_json::json;

use crate::app::FrameworkApp;
use crate::config::Config;
use crate::output::{Output, Style};
use crate::runtime::{ThreadStatus, open_store, reader_agent};

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
        thread: String,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A thread's checkpoints, newest first.
    History {
        /// The thread.
        thread: String,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a thread and all its checkpoints.
    Delete {
        /// The thread.
        thread: String,
    },
}

/// Runs the subcommand.
pub async fn run(command: &ThreadsCommand, config: &Config, out: &Output) -> anyhow::Result<()> {
    let store = open_store(config).await?;
    match command {
        ThreadsCommand::List { json } => list(&store, config, *json, out).await,
        ThreadsCommand::Show { thread, json } => show(store, config, thread, *json, out).await,
        ThreadsCommand::History { thread, limit, json } => history(&store, thread, *limit, *json, out).await,
        ThreadsCommand::Delete { thread } => {
            if store.list_boxed(thread, ListQuery { before: None, limit: Some(1) }).await?.is_empty() {
                anyhow::bail!("there is no thread '{thread}'; `threads list` shows the threads");
            }
            store.delete_thread_boxed(thread).await?;
            println!("deleted thread '{thread}'");
            Ok(())
        }
    }
}

fn graph(store: Arc<dyn DynCheckpointer>, config: &Config) -> anyhow::Result<Arc<Graph<AgentState>>> {
    // Any registry decodes the state; the framework's is enough and loads no model.
    Ok(reader_agent(config, &FrameworkApp, store)?.graph().clone())
}

async fn list(store: &Arc<dyn DynCheckpointer>, config: &Config, as_json: bool, out: &Output) -> anyhow::Result<()> {
    let mut threads = store.threads_boxed().await?;
    threads.sort_by_key(|summary| std::cmp::Reverse(summary.latest.created_at));
    let graph = graph(store.clone(), config)?;
    let mut rows = Vec::with_capacity(threads.len());
    for summary in &threads {
        let snapshot = graph.get_state(&summary.thread_id).await?;
        let status = snapshot.as_ref().map_or(ThreadStatus::Idle, ThreadStatus::of);
        let turns = snapshot.as_ref().map_or(0, |snapshot| snapshot.state.messages.iter().filter(|m| m.role == Role::User).count());
        rows.push((summary, status, turns));
    }
    if as_json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(summary, status, turns)| {
                json!({"thread_id": summary.thread_id, "status": status, "turns": turns, "checkpoints": summary.checkpoints, "updated_at": summary.latest.created_at})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        out.note("no threads yet");
        return Ok(());
    }
    println!(
        "{}",
        Style::Bold
            .paint(&format!("{:<28} {:<12} {:>5} {:>11}  {}", "THREAD", "STATUS", "TURNS", "CHECKPOINTS", "UPDATED"), out.color_stdout)
    );
    for (summary, status, turns) in rows {
        let status = serde_json::to_value(status)?.as_str().unwrap_or_default().to_owned();
        println!(
            "{:<28} {:<12} {:>5} {:>11}  {}",
            summary.thread_id,
            status,
            turns,
            summary.checkpoints,
            summary.latest.created_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    Ok(())
}

async fn show(store: Arc<dyn DynCheckpointer>, config: &Config, thread: &str, as_json: bool, out: &Output) -> anyhow::Result<()> {
    let graph = graph(store, config)?;
    let snapshot =
        graph.get_state(thread).await?.with_context(|| format!("there is no thread '{thread}'; `threads list` shows the threads"))?;
    let status = ThreadStatus::of(&snapshot);
    if as_json {
        let value = json!({
            "thread_id": thread,
            "status": status,
            "messages": snapshot.state.messages,
            "interrupt": snapshot.meta.interrupt,
            "checkpoint_id": snapshot.meta.checkpoint_id,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    for message in &snapshot.state.messages {
        let who = match message.role {
            Role::User => Style::Accent.paint("you", out.color_stdout),
            Role::Assistant => Style::Bold.paint("agent", out.color_stdout),
            _ => Style::Dim.paint("system", out.color_stdout),
        };
        println!("{who} {}", Style::Dim.paint(&message.timestamp.format("%Y-%m-%d %H:%M").to_string(), out.color_stdout));
        println!("{}\n", message.content.trim_end());
    }
    match status {
        ThreadStatus::Idle => {}
        ThreadStatus::Interrupted => {
            println!("{}", Style::Warning.paint("waiting for an approval: the next message answers it", out.color_stdout))
        }
        ThreadStatus::Unfinished => println!(
            "{}",
            Style::Warning.paint(&format!("a run was cut off; finish it with `run --thread {thread} --resume`"), out.color_stdout)
        ),
    }
    Ok(())
}

async fn history(store: &Arc<dyn DynCheckpointer>, thread: &str, limit: Option<usize>, as_json: bool, out: &Output) -> anyhow::Result<()> {
    let history = store.list_boxed(thread, ListQuery { before: None, limit }).await?;
    if history.is_empty() {
        anyhow::bail!("there is no thread '{thread}'; `threads list` shows the threads");
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&history)?);
        return Ok(());
    }
    println!(
        "{}",
        Style::Bold
            .paint(&format!("{:>6}  {:<7} {:<18} {:>4}  {:<23} {}", "ID", "SOURCE", "NODE", "STEP", "TIME", "RUN"), out.color_stdout)
    );
    for meta in history {
        let source = serde_json::to_value(meta.source)?.as_str().map(str::to_owned).unwrap_or_else(|| format!("{:?}", meta.source));
        let node = match (&meta.node, &meta.interrupt) {
            (Some(node), Some(_)) => format!("{node} (waiting)"),
            (Some(node), None) => node.clone(),
            (None, _) => "-".to_owned(),
        };
        println!(
            "{:>6}  {:<7} {:<18} {:>4}  {:<23} {}",
            meta.checkpoint_id,
            source.to_lowercase(),
            node,
            meta.run_step,
            meta.created_at.format("%Y-%m-%d %H:%M:%S%.3f"),
            meta.run_id
        );
    }
    Ok(())
}

//! The `peregrine` binary: the composition root. It parses the command line, opens the
//! checkpoint store, assembles the agent and renders runs.

mod bench;
mod demo;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_core::events::EventKind;
use peregrine_core::{AgentState, AgentStateUpdate, ExecutionLimits, TurnStart};
use peregrine_graph::{DynCheckpointer, Graph, ListQuery, RunEvent, RunOptions, RunOutcome};

#[derive(Parser)]
#[command(name = "peregrine", version, about = "Router-controlled domain agents with durable execution")]
struct Cli {
    /// The SQLite checkpoint file.
    #[arg(long, global = true, default_value = "peregrine.db", env = "PEREGRINE_DB")]
    db: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one turn of the agent on a thread and prints its events and answer.
    Run {
        /// The user message.
        message: String,
        /// The conversation thread.
        #[arg(long, default_value = "main")]
        thread: String,
    },
    /// Measures graph-step overhead, durable steps, interrupts and state reads; writes
    /// `<out>.json` and `<out>.md`. Build with --release for meaningful numbers.
    Bench {
        /// Output path without extension.
        #[arg(long, default_value = "bench-results/graph")]
        out: PathBuf,
        /// Measured runs per scenario.
        #[arg(long, default_value_t = bench::DEFAULT_REPEATS)]
        repeats: usize,
        /// Fewer repeats and a shorter conversation (a smoke run).
        #[arg(long)]
        quick: bool,
    },
    /// Lists threads, or shows one thread's checkpoints.
    Threads {
        /// Show this thread's checkpoint history.
        thread: Option<String>,
        /// Delete the thread instead.
        #[arg(long, requires = "thread")]
        delete: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { message, thread } => run_turn(&cli.db, &thread, &message).await,
        Command::Threads { thread, delete } => threads(&cli.db, thread.as_deref(), delete).await,
        Command::Bench { out, repeats, quick } => bench::run(&bench::BenchOptions { out, repeats, quick }).await.map(drop),
    }
}

async fn open_store(db: &std::path::Path) -> anyhow::Result<Arc<dyn DynCheckpointer>> {
    let store = SqliteCheckpointer::open(db).await.with_context(|| format!("opening the checkpoint file {}", db.display()))?;
    Ok(Arc::new(store))
}

async fn run_turn(db: &std::path::Path, thread: &str, message: &str) -> anyhow::Result<()> {
    let graph: Graph<AgentState> = demo::graph(open_store(db).await?, ExecutionLimits::default())?;
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let input = AgentStateUpdate::new_turn(TurnStart::new(message, Default::default()));
    let printer = tokio::spawn(async move {
        while let Some(event) = receiver.recv().await {
            render(&event);
        }
    });
    let outcome = graph.run(thread, input, RunOptions::with_events(sender)).await;
    printer.await.context("event printer")?;
    match outcome? {
        RunOutcome::Completed { state, checkpoint_id, .. } => {
            let answer = state.messages.last().map(|message| message.content.as_str()).unwrap_or_default();
            println!("\n{answer}\n");
            println!("(thread '{thread}', checkpoint {}, stored in {})", checkpoint_id.unwrap_or_default(), db.display());
        }
        RunOutcome::Interrupted { interrupt, .. } => println!("waiting for approval: {}", interrupt.payload),
        RunOutcome::Cancelled { .. } => println!("cancelled; the last checkpoint is kept"),
    }
    Ok(())
}

fn render(event: &RunEvent<peregrine_core::AgentEvent>) {
    match event {
        RunEvent::NodeStarted { node, step } => eprintln!("  [{step:>3}] {node}"),
        RunEvent::Waiting { node, delay } => eprintln!("        retrying {node} in {delay:?}"),
        RunEvent::Custom(event) => match &event.kind {
            EventKind::Status { message, .. } => eprintln!("        {}: {message}", event.component),
            EventKind::Error { error_message, .. } => eprintln!("        error in {}: {error_message}", event.component),
            _ => {}
        },
        _ => {}
    }
}

async fn threads(db: &std::path::Path, thread: Option<&str>, delete: bool) -> anyhow::Result<()> {
    let store = open_store(db).await?;
    match (thread, delete) {
        (Some(thread), true) => {
            store.delete_thread_boxed(thread).await?;
            println!("deleted thread '{thread}'");
        }
        (Some(thread), false) => {
            let history = store.list_boxed(thread, ListQuery::default()).await?;
            if history.is_empty() {
                anyhow::bail!("thread '{thread}' has no checkpoints in {}", db.display());
            }
            for meta in history {
                println!(
                    "{:>5}  {:<7} {:<16} run {} step {}",
                    meta.checkpoint_id,
                    format!("{:?}", meta.source).to_lowercase(),
                    meta.node.unwrap_or_default(),
                    meta.run_id,
                    meta.run_step
                );
            }
        }
        (None, _) => {
            for summary in store.threads_boxed().await? {
                println!("{:<24} {:>6} checkpoints, last {}", summary.thread_id, summary.checkpoints, summary.latest.created_at);
            }
        }
    }
    Ok(())
}

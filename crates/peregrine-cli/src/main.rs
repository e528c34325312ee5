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
use peregrine_llm::{LlmClient, LlmConfig, ModelConfig, ProviderConfig, roles};

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
        /// A GGUF model file for the embedded model (`scripts/fetch-model.sh` prints one);
        /// without it the demo responder answers without a model.
        #[arg(long, env = "PEREGRINE_LOCAL_MODEL")]
        model: Option<PathBuf>,
        /// Output token cap of the answer.
        #[arg(long, default_value_t = 160)]
        max_tokens: u32,
    },
    /// Benchmarks; each writes `<out>.json` and `<out>.md`. Build with --release for meaningful
    /// numbers. Without a suite: the graph engine (`bench graph`).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        suite: Option<BenchSuite>,
        #[command(flatten)]
        graph: GraphBenchArgs,
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

#[derive(Subcommand)]
enum BenchSuite {
    /// Measures graph-step overhead, durable steps, interrupts and state reads (the default).
    Graph(GraphBenchArgs),
    /// Measures whole agent turns of the weather example: LLM calls, prompt bytes and framework
    /// overhead per turn, turn time against a 200 ms model, and (with --model) classifier accuracy.
    Turn(bench::turn::TurnBenchArgs),
}

/// `peregrine bench graph` options.
#[derive(clap::Args)]
struct GraphBenchArgs {
    /// Output path without extension.
    #[arg(long, default_value = "bench-results/graph")]
    out: PathBuf,
    /// Measured runs per scenario.
    #[arg(long, default_value_t = bench::DEFAULT_REPEATS)]
    repeats: usize,
    /// Fewer repeats and a shorter conversation (a smoke run).
    #[arg(long)]
    quick: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { message, thread, model, max_tokens } => run_turn(&cli.db, &thread, &message, model.as_deref(), max_tokens).await,
        Command::Threads { thread, delete } => threads(&cli.db, thread.as_deref(), delete).await,
        Command::Bench { suite, graph } => match suite.unwrap_or(BenchSuite::Graph(graph)) {
            BenchSuite::Graph(GraphBenchArgs { out, repeats, quick }) => {
                bench::run(&bench::BenchOptions { out, repeats, quick }).await.map(drop)
            }
            BenchSuite::Turn(args) => bench::turn::run(&args).await.map(drop),
        },
    }
}

async fn open_store(db: &std::path::Path) -> anyhow::Result<Arc<dyn DynCheckpointer>> {
    let store = SqliteCheckpointer::open(db).await.with_context(|| format!("opening the checkpoint file {}", db.display()))?;
    Ok(Arc::new(store))
}

/// The LLM client of the main job: the embedded model answers the `response` role.
fn local_llm(model: &std::path::Path, max_tokens: u32) -> anyhow::Result<Arc<LlmClient>> {
    let mut config = LlmConfig::default();
    let provider = ProviderConfig { model_path: Some(model.display().to_string()), ..ProviderConfig::default() };
    config.providers.insert("local".into(), provider);
    let response = ModelConfig {
        provider: "local".into(),
        model_id: "smollm2-135m-instruct".into(),
        max_tokens: Some(max_tokens),
        temperature: Some(0.0),
    };
    config.models.insert(roles::RESPONSE.into(), response);
    Ok(Arc::new(LlmClient::from_config(config)?))
}

async fn run_turn(
    db: &std::path::Path,
    thread: &str,
    message: &str,
    model: Option<&std::path::Path>,
    max_tokens: u32,
) -> anyhow::Result<()> {
    let llm = model.map(|model| local_llm(model, max_tokens)).transpose()?;
    let graph: Graph<AgentState> = demo::graph(open_store(db).await?, ExecutionLimits::default(), llm)?;
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let input = AgentStateUpdate::new_turn(TurnStart::new(message, Default::default()));
    let printer = tokio::spawn(async move {
        let mut streamed = false;
        while let Some(event) = receiver.recv().await {
            streamed |= render(&event);
        }
        streamed
    });
    let outcome = graph.run(thread, input, RunOptions::with_events(sender)).await;
    let streamed = printer.await.context("event printer")?;
    match outcome? {
        RunOutcome::Completed { state, checkpoint_id, .. } => {
            if streamed {
                println!();
            } else {
                let answer = state.messages.last().map(|message| message.content.as_str()).unwrap_or_default();
                println!("\n{answer}\n");
            }
            println!("\n(thread '{thread}', checkpoint {}, stored in {})", checkpoint_id.unwrap_or_default(), db.display());
        }
        RunOutcome::Interrupted { interrupt, .. } => println!("waiting for approval: {}", interrupt.payload),
        RunOutcome::Cancelled { .. } => println!("cancelled; the last checkpoint is kept"),
    }
    Ok(())
}

/// Prints one event; returns whether it was a streamed answer token (printed to stdout).
fn render(event: &RunEvent<peregrine_core::AgentEvent>) -> bool {
    match event {
        RunEvent::NodeStarted { node, step } => eprintln!("  [{step:>3}] {node}"),
        RunEvent::Waiting { node, delay } => eprintln!("        retrying {node} in {delay:?}"),
        RunEvent::Custom(event) => match &event.kind {
            EventKind::Status { message, .. } => eprintln!("        {}: {message}", event.component),
            EventKind::Error { error_message, .. } => eprintln!("        error in {}: {error_message}", event.component),
            EventKind::LlmToken { content, .. } => {
                use std::io::Write as _;
                print!("{content}");
                // A failed flush only delays the text; the whole answer is stored regardless.
                let _ = std::io::stdout().flush();
                return true;
            }
            _ => {}
        },
        _ => {}
    }
    false
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

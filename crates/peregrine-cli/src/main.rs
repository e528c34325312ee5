//! The `peregrine` binary: every command of a Peregrine application (`chat`, `run`, `init`,
//! `health`, `config`, `threads`) for the framework on its own, plus `bench`.

mod bench;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{FromArgMatches as _, Subcommand};
use peregrine::FrameworkApp;
use peregrine::cli::Extension;

/// The `bench` command group.
#[derive(Subcommand)]
enum Extra {
    /// Benchmarks; each writes `<out>.json` and `<out>.md`. Build with --release for meaningful
    /// numbers. Without a suite: the graph engine (`bench graph`).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        suite: Option<BenchSuite>,
        #[command(flatten)]
        graph: GraphBenchArgs,
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

fn main() -> ExitCode {
    let extension = Extension {
        augment: <Extra as Subcommand>::augment_subcommands,
        has: <Extra as Subcommand>::has_subcommand,
        run: Box::new(|matches| {
            let Extra::Bench { suite, graph } = Extra::from_arg_matches(matches)?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                match suite.unwrap_or(BenchSuite::Graph(graph)) {
                    BenchSuite::Graph(GraphBenchArgs { out, repeats, quick }) => {
                        bench::run(&bench::BenchOptions { out, repeats, quick }).await.map(drop)
                    }
                    BenchSuite::Turn(args) => bench::turn::run(&args).await.map(drop),
                }
            })
        }),
    };
    peregrine::cli::main(Arc::new(FrameworkApp), Some(extension))
}

//! `peregrine bench`: times the graph engine on LangGraph's "router loop" scenarios and writes
//! the numbers, beside LangGraph's published figures and our targets, as JSON and Markdown.
//!
//! Step mapping: LangGraph's router is a node, so one plan step costs two supersteps there
//! (`router`, then the capability) and a 50-step plan plus `respond` is 102 supersteps. Our
//! router is an edge (a pure function between nodes), so the same turn is 51 node executions.
//! We report per node step, and per LangGraph-equivalent superstep (turn time / 102, i.e. half
//! a node step), which is what LangGraph's per-superstep figures compare against.
//!
//! Numbers are measured with `std::time::Instant` after one warm-up and are reported, never
//! asserted: on a shared 2-core VM they move by tens of percent between runs.

mod graph;
mod report;
mod scenarios;
pub mod turn;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use graph::{Backend, PAYLOAD_BYTES};
pub use report::BenchReport;
use report::{BenchSettings, Scenarios, comparison, machine_info, notes, step_mapping};
use scenarios::{DiskSyncResult, disk_sync, interrupt_round_trip, long_conversation, router_loop, state_reads};

/// Timed runs per measurement unless told otherwise.
pub const DEFAULT_REPEATS: usize = 15;
/// The most timed runs per measurement in quick mode.
pub const QUICK_REPEATS: usize = 3;

/// What to measure and where to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Output path without extension: `<out>.json` and `<out>.md` are written.
    pub out: PathBuf,
    /// Timed runs per measurement (at least 1; quick mode caps it at [`QUICK_REPEATS`]).
    pub repeats: usize,
    /// Fewer repeats and a 20-turn instead of a 100-turn conversation, for a fast look.
    pub quick: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { out: PathBuf::from("bench-results/graph"), repeats: DEFAULT_REPEATS, quick: false }
    }
}

impl BenchOptions {
    fn effective_repeats(&self) -> usize {
        if self.quick { self.repeats.clamp(1, QUICK_REPEATS) } else { self.repeats.max(1) }
    }
}

/// The sizes of the scenarios (the CLI uses [`Sizes::full`] or [`Sizes::quick`]; tests shrink them).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Capability steps in a turn's plan (LangGraph's harness: 50).
    plan_steps: u32,
    /// Turns on one thread in the conversation-length scenario.
    turns: usize,
    /// Turns compared at each end of that conversation.
    window: usize,
    /// Turns run to give the state-read thread its checkpoints (2 turns of 52 = 104).
    history_turns: usize,
    /// Timed `get_state` and `history` calls.
    state_reads: usize,
    /// Timed raw disk syncs, before and after the scenarios.
    disk_syncs: usize,
}

impl Sizes {
    fn full(repeats: usize) -> Self {
        Self {
            plan_steps: 50,
            turns: 100,
            window: 5,
            history_turns: 2,
            state_reads: (repeats * 10).max(20),
            disk_syncs: (repeats * 4).max(20),
        }
    }

    fn quick(repeats: usize) -> Self {
        Self { turns: 20, ..Self::full(repeats) }
    }

    /// Node executions per turn: the plan, then `respond`.
    fn node_steps(self) -> u32 {
        self.plan_steps + 1
    }

    /// LangGraph supersteps for the same turn: `router` before every capability and before `respond`.
    fn langgraph_supersteps(self) -> u32 {
        2 * self.plan_steps + 2
    }
}

/// A directory for the bench's SQLite files beside the output, removed when dropped. It sits
/// beside the results rather than in the system temp dir, which may be tmpfs (free fsync).
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn beside(out: &Path) -> anyhow::Result<Self> {
        let parent = out.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let path = parent.join(format!(".peregrine-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating the bench scratch directory {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover scratch directory is harmless and named for the process.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn with_extension_appended(out: &Path, extension: &str) -> PathBuf {
    let mut path = OsString::from(out.as_os_str());
    path.push(".");
    path.push(extension);
    PathBuf::from(path)
}

/// Runs every scenario, writes `<out>.json` and `<out>.md`, prints the Markdown and returns the report.
pub async fn run(options: &BenchOptions) -> anyhow::Result<BenchReport> {
    let repeats = options.effective_repeats();
    let sizes = if options.quick { Sizes::quick(repeats) } else { Sizes::full(repeats) };
    run_with(options, repeats, sizes).await
}

async fn run_with(options: &BenchOptions, repeats: usize, sizes: Sizes) -> anyhow::Result<BenchReport> {
    let scratch = ScratchDir::beside(&options.out)?;
    let machine = machine_info(&scratch);
    eprintln!("bench: raw disk sync (append + fdatasync)");
    let disk_sync_before = disk_sync(&scratch, "disk-sync-before", sizes.disk_syncs).await?;
    let mut router_loops = Vec::new();
    for backend in [Backend::None, Backend::Memory, Backend::Sqlite] {
        router_loops.push(router_loop(backend, &scratch, sizes, repeats).await?);
    }
    let long_conversation = long_conversation(&scratch, sizes).await?;
    let mut interrupts = Vec::new();
    for backend in [Backend::Memory, Backend::Sqlite] {
        interrupts.push(interrupt_round_trip(backend, &scratch, sizes, repeats).await?);
    }
    let state_reads = state_reads(&scratch, sizes).await?;
    let disk_sync = DiskSyncResult {
        probe: "append 256 bytes to a file and fdatasync it, on the scratch filesystem".to_owned(),
        before_us: disk_sync_before,
        after_us: disk_sync(&scratch, "disk-sync-after", sizes.disk_syncs).await?,
    };
    let scenarios = Scenarios { router_loop: router_loops, long_conversation, interrupt_round_trip: interrupts, state_reads, disk_sync };
    let report = BenchReport {
        settings: BenchSettings {
            repeats,
            quick: options.quick,
            plan_steps: sizes.plan_steps,
            node_steps_per_turn: sizes.node_steps(),
            langgraph_supersteps_per_turn: sizes.langgraph_supersteps(),
            payload_bytes: PAYLOAD_BYTES,
            conversation_turns: sizes.turns,
        },
        step_mapping: step_mapping(sizes),
        comparison: comparison(&scenarios),
        notes: notes(&machine),
        machine,
        scenarios,
    };
    write_report(&options.out, &report)?;
    Ok(report)
}

fn write_report(out: &Path, report: &BenchReport) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let json_path = with_extension_appended(out, "json");
    let json = serde_json::to_string_pretty(report).context("serializing the bench report")?;
    std::fs::write(&json_path, json + "\n").with_context(|| format!("writing {}", json_path.display()))?;
    let markdown = report.to_markdown();
    let markdown_path = with_extension_appended(out, "md");
    std::fs::write(&markdown_path, &markdown).with_context(|| format!("writing {}", markdown_path.display()))?;
    println!("{markdown}");
    eprintln!("bench: wrote {} and {}", json_path.display(), markdown_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tiny() -> Sizes {
        Sizes { plan_steps: 3, turns: 3, window: 1, history_turns: 2, state_reads: 2, disk_syncs: 2 }
    }

    #[tokio::test]
    async fn quick_bench_writes_every_scenario_as_json_and_markdown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = BenchOptions { out: dir.path().join("results/graph"), repeats: 1, quick: true };
        let report = run_with(&options, 1, tiny()).await.expect("bench runs");

        let json = std::fs::read_to_string(dir.path().join("results/graph.json")).expect("json written");
        let value: serde_json::Value = serde_json::from_str(&json).expect("json parses");
        let scenarios = &value["scenarios"];
        assert_eq!(scenarios["router_loop"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["interrupt_round_trip"].as_array().map(Vec::len), Some(2));
        assert_eq!(scenarios["long_conversation"]["per_node_step_us_by_turn"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["long_conversation"]["state_load_us_by_turn"].as_array().map(Vec::len), Some(3));
        assert_eq!(scenarios["long_conversation"]["checkpoints"], json!(3 * 5));
        assert_eq!(scenarios["state_reads"]["checkpoints"], json!(2 * 5));
        assert!(value["machine"]["nproc"].as_u64().is_some_and(|nproc| nproc >= 1));
        assert_eq!(value["comparison"].as_array().map(Vec::len), Some(report.comparison.len()));
        assert_eq!(report.comparison.len(), 3 + 2 + 3 + 4 + 2);
        assert_eq!(scenarios["long_conversation"]["late_control_per_node_step_us"]["samples"], json!(1));
        assert_eq!(scenarios["disk_sync"]["after_us"]["samples"], json!(2));

        let markdown = std::fs::read_to_string(dir.path().join("results/graph.md")).expect("markdown written");
        assert!(markdown.contains("| Measurement |"));
        assert!(markdown.contains("Interrupt resume-to-end"));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("results")).expect("results dir").collect();
        assert_eq!(leftovers.len(), 2, "only the two report files remain");
    }

    #[test]
    fn outputs_append_extensions() {
        assert_eq!(with_extension_appended(Path::new("out/graph.v2"), "json"), PathBuf::from("out/graph.v2.json"));
    }
}

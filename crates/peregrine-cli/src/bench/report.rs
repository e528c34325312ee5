//! The bench's statistics and report: sample spreads, LangGraph's published figures and our
//! targets, the comparison table, the machine description, and the Markdown rendering.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::scenarios::{DiskSyncResult, InterruptResult, LongConversationResult, RouterLoopResult, StateReadsResult};
use super::{ScratchDir, Sizes};

/// LangGraph 1.2.22 on a 2-vCPU VM, "router loop" harness, runs 1 and 2: copied from
/// `shared/reference/langgraph-and-serving.md` §2.2 (measured there, not here).
mod langgraph {
    /// Per superstep, no checkpointer (µs).
    pub const SUPERSTEP_NO_CHECKPOINTER_US: [f64; 2] = [334.0, 339.0];
    /// Per superstep, InMemorySaver with `durability="sync"` (µs); our engine checkpoints
    /// synchronously after every node. Exit/async durability: 325/462 and 884/761 µs.
    pub const SUPERSTEP_IN_MEMORY_SYNC_US: [f64; 2] = [541.0, 816.0];
    /// Per superstep, SqliteSaver on a WAL file with sync durability (µs).
    pub const SUPERSTEP_SQLITE_SYNC_US: [f64; 2] = [2427.0, 2568.0];
    /// `interrupt()` run-to-pause, InMemorySaver (ms).
    pub const INTERRUPT_PAUSE_MEMORY_MS: [f64; 2] = [4.5, 7.1];
    /// Resume-to-end, InMemorySaver (ms).
    pub const INTERRUPT_RESUME_MEMORY_MS: [f64; 2] = [3.9, 7.0];
    /// `interrupt()` run-to-pause, SqliteSaver (ms).
    pub const INTERRUPT_PAUSE_SQLITE_MS: [f64; 2] = [11.1, 12.3];
    /// Resume-to-end, SqliteSaver (ms).
    pub const INTERRUPT_RESUME_SQLITE_MS: [f64; 2] = [15.4, 12.5];
    /// `get_state` on a SQLite thread with about 100 checkpoints (µs; 0.13 and 0.07 ms).
    pub const GET_STATE_US: [f64; 2] = [130.0, 70.0];
    /// `get_state_history` of 104 checkpoints (ms).
    pub const HISTORY_MS: [f64; 2] = [25.9, 22.9];
}

/// Our targets: `shared/architecture.md` (performance budget) and the reference's §8.
mod target {
    /// Per step, no checkpointer (µs, p50).
    pub const STEP_NO_CHECKPOINTER_US: f64 = 20.0;
    /// Per step, in-memory checkpointer (µs, p50).
    pub const STEP_MEMORY_US: f64 = 50.0;
    /// Durable (SQLite WAL, fsync) step, independent of conversation length (µs, p50).
    pub const STEP_DURABLE_US: f64 = 1000.0;
    /// Interrupt run-to-pause and resume-to-end in memory (ms).
    pub const INTERRUPT_MEMORY_MS: f64 = 1.0;
    /// Interrupt run-to-pause and resume-to-end on SQLite (ms).
    pub const INTERRUPT_SQLITE_MS: f64 = 3.0;
    /// `get_state` (µs).
    pub const GET_STATE_US: f64 = 50.0;
    /// History of 100 checkpoints (ms).
    pub const HISTORY_MS: f64 = 2.0;
}
/// The distribution of one measurement's samples, in the unit its field name says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// How many timed samples.
    pub samples: usize,
    /// Median (p50).
    pub median: f64,
    /// Fastest sample.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 25th percentile.
    pub p25: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Slowest sample.
    pub max: f64,
}

impl Spread {
    pub(super) fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |quantile| percentile(&sorted, quantile);
        Self {
            samples: sorted.len(),
            median: at(0.5),
            min: at(0.0),
            p10: at(0.1),
            p25: at(0.25),
            p75: at(0.75),
            p90: at(0.9),
            max: at(1.0),
        }
    }

    pub(super) fn of_durations(durations: &[Duration], unit_per_second: f64, divisor: f64) -> Self {
        let values: Vec<f64> = durations.iter().map(|duration| duration.as_secs_f64() * unit_per_second / divisor).collect();
        Self::of(&values)
    }
}

/// Linear interpolation between the closest ranks; NaN (JSON `null`) for no samples.
fn percentile(sorted: &[f64], quantile: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else { return f64::NAN };
    let rank = quantile * last as f64;
    let lower = rank.floor() as usize;
    let upper = rank.ceil() as usize;
    match (sorted.get(lower), sorted.get(upper)) {
        (Some(low), Some(high)) => low + (high - low) * (rank - lower as f64),
        _ => f64::NAN,
    }
}

pub(super) const MICROS: f64 = 1e6;
pub(super) const MILLIS: f64 = 1e3;
/// Every scenario's detailed results.
#[derive(Debug, Clone, Serialize)]
pub struct Scenarios {
    /// Scenario 1, per backend.
    pub router_loop: Vec<RouterLoopResult>,
    /// Scenario 2.
    pub long_conversation: LongConversationResult,
    /// Scenario 3, per backend.
    pub interrupt_round_trip: Vec<InterruptResult>,
    /// Scenario 4.
    pub state_reads: StateReadsResult,
    /// The disk's raw sync cost, for reading the durable numbers.
    pub disk_sync: DiskSyncResult,
}

/// The machine and build the numbers come from.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// When the bench ran (RFC 3339, UTC).
    pub date: String,
    /// Logical CPUs available to the process.
    pub nproc: usize,
    /// CPU model, where the OS says.
    pub cpu_model: Option<String>,
    /// Operating system and architecture.
    pub os: String,
    /// `release` or `debug` (debug numbers mean nothing).
    pub build: String,
    /// The Peregrine version.
    pub peregrine_version: String,
    /// Where the SQLite files were written.
    pub scratch_dir: String,
    /// The filesystem type of `scratch_dir`, from `/proc/mounts` (tmpfs would fake fsync).
    pub scratch_filesystem: Option<String>,
}

/// The sizes the scenarios ran with.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSettings {
    /// Timed runs per measurement (after one warm-up).
    pub repeats: usize,
    /// Whether quick mode was on.
    pub quick: bool,
    /// Capability steps per turn.
    pub plan_steps: u32,
    /// Node executions per turn here.
    pub node_steps_per_turn: u32,
    /// LangGraph supersteps for the same turn.
    pub langgraph_supersteps_per_turn: u32,
    /// Bytes appended to the message list per step.
    pub payload_bytes: usize,
    /// Turns in the long-conversation scenario.
    pub conversation_turns: usize,
}

/// One line of the comparison with LangGraph and our targets.
#[derive(Debug, Clone, Serialize)]
pub struct ComparisonRow {
    /// What was measured.
    pub measurement: String,
    /// The unit of every number in this row.
    pub unit: String,
    /// Ours, on the same basis as LangGraph's figure (per LangGraph superstep for the loop).
    pub ours: Spread,
    /// Ours per node step, for router-loop rows.
    pub ours_per_node_step: Option<Spread>,
    /// LangGraph's two runs from the reference, §2.2.
    pub langgraph: Option<[f64; 2]>,
    /// LangGraph / ours (median), low and high over LangGraph's two runs.
    pub ratio_langgraph_over_ours: Option<[f64; 2]>,
    /// Our target (p50).
    pub target: Option<f64>,
    /// Whether our median meets the target; per node step where there is one (the stricter reading).
    pub within_target: Option<bool>,
}

impl ComparisonRow {
    fn new(measurement: impl Into<String>, unit: &str, ours: Spread, langgraph: Option<[f64; 2]>, target: Option<f64>) -> Self {
        let ratio = langgraph.map(|[first, second]| [first.min(second) / ours.median, first.max(second) / ours.median]);
        let within = target.map(|target| ours.median <= target);
        Self {
            measurement: measurement.into(),
            unit: unit.into(),
            ours,
            ours_per_node_step: None,
            langgraph,
            ratio_langgraph_over_ours: ratio,
            target,
            within_target: within,
        }
    }

    fn per_node_step(mut self, per_node_step: Spread) -> Self {
        self.within_target = self.target.map(|target| per_node_step.median <= target);
        self.ours_per_node_step = Some(per_node_step);
        self
    }
}

/// Everything one `peregrine bench` run measured, with the reference figures beside it.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine and build.
    pub machine: MachineInfo,
    /// The sizes used.
    pub settings: BenchSettings,
    /// How our node steps map to LangGraph supersteps.
    pub step_mapping: String,
    /// Ours next to LangGraph and our targets.
    pub comparison: Vec<ComparisonRow>,
    /// The detailed results.
    pub scenarios: Scenarios,
    /// How to read the numbers.
    pub notes: Vec<String>,
}

pub(super) fn step_mapping(sizes: Sizes) -> String {
    format!(
        "LangGraph routes with a router node, so its turn of {plan} plan steps then respond is {supersteps} supersteps \
         (router, capability, … router, respond). Our router is an edge between nodes, so the same turn is {steps} node \
         executions, each followed by one checkpoint (plus one for the turn's input). One node step here does the work of \
         a LangGraph router+capability superstep pair; 'per LangGraph superstep' = turn time / {supersteps} = half a node step.",
        plan = sizes.plan_steps,
        supersteps = sizes.langgraph_supersteps(),
        steps = sizes.node_steps(),
    )
}

pub(super) fn comparison(scenarios: &Scenarios) -> Vec<ComparisonRow> {
    let mut rows = Vec::new();
    let loop_refs = [
        (langgraph::SUPERSTEP_NO_CHECKPOINTER_US, target::STEP_NO_CHECKPOINTER_US),
        (langgraph::SUPERSTEP_IN_MEMORY_SYNC_US, target::STEP_MEMORY_US),
        (langgraph::SUPERSTEP_SQLITE_SYNC_US, target::STEP_DURABLE_US),
    ];
    for (result, (reference, goal)) in scenarios.router_loop.iter().zip(loop_refs) {
        let name = format!("Router loop, per superstep-equivalent, {}", result.backend);
        let row = ComparisonRow::new(name, "µs", result.per_langgraph_superstep_us.clone(), Some(reference), Some(goal));
        rows.push(row.per_node_step(result.per_node_step_us.clone()));
    }
    let disk = &scenarios.disk_sync;
    for (when, spread) in [("before", &disk.before_us), ("after", &disk.after_us)] {
        let name = format!("Disk floor {when} the scenarios: 256-byte append + fdatasync (no SQLite)");
        rows.push(ComparisonRow::new(name, "µs", spread.clone(), None, None));
    }
    let long = &scenarios.long_conversation;
    for (which, spread) in [("first", &long.early_per_node_step_us), ("last", &long.late_per_node_step_us)] {
        let name = format!("Durable node step, {which} {} of {} turns on one thread", long.window, long.turns);
        rows.push(ComparisonRow::new(name, "µs", spread.clone(), None, Some(target::STEP_DURABLE_US)));
    }
    let control = format!("Durable node step, new thread beside the last {} turns (control)", long.window);
    rows.push(ComparisonRow::new(control, "µs", long.late_control_per_node_step_us.clone(), None, Some(target::STEP_DURABLE_US)));
    let interrupt_refs = [
        (langgraph::INTERRUPT_PAUSE_MEMORY_MS, langgraph::INTERRUPT_RESUME_MEMORY_MS, target::INTERRUPT_MEMORY_MS),
        (langgraph::INTERRUPT_PAUSE_SQLITE_MS, langgraph::INTERRUPT_RESUME_SQLITE_MS, target::INTERRUPT_SQLITE_MS),
    ];
    for (result, (pause_ref, resume_ref, goal)) in scenarios.interrupt_round_trip.iter().zip(interrupt_refs) {
        let pause = format!("Interrupt run-to-pause, {}", result.backend);
        rows.push(ComparisonRow::new(pause, "ms", result.run_to_pause_ms.clone(), Some(pause_ref), Some(goal)));
        let resume = format!("Interrupt resume-to-end, {}", result.backend);
        rows.push(ComparisonRow::new(resume, "ms", result.resume_to_end_ms.clone(), Some(resume_ref), Some(goal)));
    }
    let reads = &scenarios.state_reads;
    let get_state = format!("get_state, SQLite, thread with {} checkpoints", reads.checkpoints);
    rows.push(ComparisonRow::new(get_state, "µs", reads.get_state_us.clone(), Some(langgraph::GET_STATE_US), Some(target::GET_STATE_US)));
    let history = format!("history(limit {}), SQLite, {} returned", reads.history_limit, reads.history_returned);
    rows.push(ComparisonRow::new(history, "ms", reads.history_ms.clone(), Some(langgraph::HISTORY_MS), Some(target::HISTORY_MS)));
    rows
}

pub(super) fn notes(machine: &MachineInfo) -> Vec<String> {
    let mut notes = vec![
        "LangGraph figures are copied from shared/reference/langgraph-and-serving.md §2.2 (langgraph 1.2.22, 2 vCPU, \
         median of 5-7 runs, runs 1 and 2; repeat runs there differed by up to 2.7×). They were measured on another day \
         with another harness: read the ratios as orders of magnitude."
            .to_owned(),
        "The MemoryCheckpointer row compares with InMemorySaver under durability=\"sync\" (541 / 816 µs), because our engine \
         checkpoints synchronously after every node; with durability exit / async LangGraph measured 325 / 462 and 884 / 761 µs."
            .to_owned(),
        "Targets come from shared/architecture.md (performance budget) and the reference's §8. For router-loop rows the \
         target is checked against our per-node-step median, the stricter reading."
            .to_owned(),
        "A durable step costs at least one disk sync: read the SQLite rows against the 'Disk floor' rows, measured on the \
         same filesystem at the start and the end. On a shared VM the disk's sync latency alone moves by 10× between runs."
            .to_owned(),
        "Every figure is wall time from std::time::Instant after one warm-up; medians over the repeats. Numbers on a shared \
         VM move by tens of percent between runs; they are reported, never asserted."
            .to_owned(),
    ];
    if machine.build != "release" {
        notes.push("This is a DEBUG build: its numbers mean nothing; run `cargo run --release -p peregrine-cli -- bench`.".to_owned());
    }
    if machine.scratch_filesystem.as_deref() == Some("tmpfs") {
        notes.push("The SQLite files were on tmpfs, where fsync costs nothing: the durable numbers are flattered.".to_owned());
    }
    notes
}

pub(super) fn machine_info(scratch: &ScratchDir) -> MachineInfo {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|cpuinfo| {
        cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))
            .and_then(|line| line.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
    });
    MachineInfo {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        nproc: std::thread::available_parallelism().map_or(1, usize::from),
        cpu_model,
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        build: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
        peregrine_version: env!("CARGO_PKG_VERSION").to_owned(),
        scratch_dir: scratch.path.display().to_string(),
        scratch_filesystem: filesystem_of(&scratch.path),
    }
}

/// The type of the filesystem holding `path`: the longest mount point in `/proc/mounts` above it.
fn filesystem_of(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            Some((fields.next()?, fields.next()?))
        })
        .filter(|(mount_point, _)| path.starts_with(mount_point))
        .max_by_key(|(mount_point, _)| mount_point.len())
        .map(|(_, filesystem)| filesystem.to_owned())
}

/// A number with about three significant digits.
fn number(value: f64) -> String {
    match value.abs() {
        v if v.is_nan() => "–".to_owned(),
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.3}"),
    }
}

fn median_and_range(spread: &Spread) -> String {
    format!("{} ({}–{})", number(spread.median), number(spread.p10), number(spread.p90))
}

impl BenchReport {
    /// The report as Markdown: the comparison table, then the details.
    pub fn to_markdown(&self) -> String {
        let mut lines = self.markdown_header();
        lines.extend(self.comparison.iter().map(markdown_row));
        lines.extend(self.markdown_details());
        lines.extend([String::new(), "**Notes.**".to_owned(), String::new()]);
        lines.extend(self.notes.iter().map(|note| format!("- {note}")));
        lines.push(String::new());
        lines.join("\n")
    }

    fn markdown_header(&self) -> Vec<String> {
        let machine = &self.machine;
        let settings = &self.settings;
        vec![
            "# Peregrine graph engine benchmark".to_owned(),
            String::new(),
            format!(
                "{} · {} CPUs ({}) · {} · {} build · peregrine {}",
                machine.date,
                machine.nproc,
                machine.cpu_model.as_deref().unwrap_or("unknown CPU"),
                machine.os,
                machine.build,
                machine.peregrine_version
            ),
            format!(
                "SQLite scratch: `{}` ({}) · {} repeats after one warm-up{} · {} plan steps of {} bytes per turn",
                machine.scratch_dir,
                machine.scratch_filesystem.as_deref().unwrap_or("filesystem unknown"),
                settings.repeats,
                if settings.quick { " (quick mode)" } else { "" },
                settings.plan_steps,
                settings.payload_bytes
            ),
            String::new(),
            format!("**Step mapping.** {}", self.step_mapping),
            String::new(),
            "| Measurement | Unit | Ours: median (p10–p90) | Ours per node step | LangGraph run 1 / run 2 | LangGraph ÷ ours | Target | Within |"
                .to_owned(),
            "|---|---|---|---|---|---|---|---|".to_owned(),
        ]
    }

    fn markdown_details(&self) -> Vec<String> {
        let long = &self.scenarios.long_conversation;
        let mut lines = vec![
            String::new(),
            format!(
                "**Conversation length.** {} turns of {} node steps on one thread ({} checkpoints; {} messages, {} KiB of state at \
                 the end): per node step {} µs over the first {} turns, {} µs over the last {}; late ÷ early = **{}** (about 1 means \
                 a step costs the same however long the conversation).",
                long.turns,
                long.node_steps_per_turn,
                long.checkpoints,
                long.messages,
                long.state_bytes / 1024,
                median_and_range(&long.early_per_node_step_us),
                long.window,
                median_and_range(&long.late_per_node_step_us),
                long.window,
                number(long.late_over_early)
            ),
            String::new(),
            format!(
                "Part of each turn is loading the thread's state, which grows with the conversation: a `get_state` before each \
                 turn took {} µs early and {} µs late. Without one such load per turn, a node step costs {} µs early and {} µs \
                 late (late ÷ early = {}). A turn on a brand-new thread run just before each of the last {} turns (same disk, \
                 same moment) cost {} µs per node step: last turns ÷ this control = **{}**.",
                median_and_range(&long.early_state_load_us),
                median_and_range(&long.late_state_load_us),
                median_and_range(&long.early_per_node_step_excluding_load_us),
                median_and_range(&long.late_per_node_step_excluding_load_us),
                number(long.late_over_early_excluding_load),
                long.window,
                median_and_range(&long.late_control_per_node_step_us),
                number(long.late_over_control)
            ),
            String::new(),
            "**Router loop, whole turn (ms).**".to_owned(),
            String::new(),
        ];
        for result in &self.scenarios.router_loop {
            let turn = &result.per_turn_ms;
            lines.push(format!(
                "- {}: median {} ms, min {}, p10 {}, p90 {}, max {} ({} node steps, {} checkpoints per turn)",
                result.backend,
                number(turn.median),
                number(turn.min),
                number(turn.p10),
                number(turn.p90),
                number(turn.max),
                result.node_steps,
                result.checkpoints_per_turn
            ));
        }
        lines
    }
}

fn markdown_row(row: &ComparisonRow) -> String {
    let none = || "–".to_owned();
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |",
        row.measurement,
        row.unit,
        median_and_range(&row.ours),
        row.ours_per_node_step.as_ref().map_or_else(none, median_and_range),
        row.langgraph.map_or_else(none, |[first, second]| format!("{} / {}", number(first), number(second))),
        row.ratio_langgraph_over_ours.map_or_else(none, |[low, high]| format!("{}–{}×", number(low), number(high))),
        row.target.map_or_else(none, |target| format!("≤ {}", number(target))),
        row.within_target.map_or("–", |within| if within { "yes" } else { "no" }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_interpolates_percentiles() {
        let spread = Spread::of(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((spread.min, spread.median, spread.max, spread.samples), (1.0, 3.0, 5.0, 5));
        assert!((spread.p10 - 1.4).abs() < 1e-9);
        assert!(Spread::of(&[]).median.is_nan());
    }
}

//! Two processes on one SQLite file, simulated by two separately opened handles (each with its own
//! in-process thread lock, so neither keeps the other out): when both answer the same pending
//! approval at once, the checkpointer's compare-and-set lets exactly one of them run the approved
//! action, and the other's run stops before its node runs.

#![allow(clippy::expect_used, reason = "test fixtures report setup failures by panicking")]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_core::GraphState;
use peregrine_graph::{
    CheckpointError, CheckpointId, CheckpointMeta, CheckpointSource, Checkpointer, DynCheckpointer, Graph, ListQuery, LoadedCheckpoint,
    NewCheckpoint, NodeOutput, PendingInterrupt, Resume, Route, RunError, RunOptions, RunOutcome, ThreadLock, ThreadSummary, node_fn,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Barrier;

const THREAD: &str = "approval";

/// Fresh files raced per test; the winner varies with scheduling.
const ITERATIONS: usize = 50;

/// How long one race may take before the test reports a hang (a failure, never a synchronisation).
const RACE_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Approval {
    decisions: Vec<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct ApprovalUpdate {
    decision: Option<Value>,
}

impl GraphState for Approval {
    type Update = ApprovalUpdate;
    type Event = String;

    fn apply(&mut self, update: ApprovalUpdate) {
        self.decisions.extend(update.decision);
    }
}

/// `approve` asks first; once answered it executes the action (counted in `executions`, shared by
/// every graph of a race, as the outside world is) and records the decision.
fn approval_graph(checkpointer: Arc<dyn DynCheckpointer>, executions: Arc<AtomicU32>) -> Graph<Approval> {
    Graph::builder()
        .node(
            "approve",
            node_fn(move |_state: Arc<Approval>, info| {
                let executions = executions.clone();
                async move {
                    match info.resume {
                        Some(resume) => {
                            executions.fetch_add(1, Ordering::SeqCst);
                            Ok(NodeOutput::Update(ApprovalUpdate { decision: Some(resume.answer) }))
                        }
                        None => Ok(NodeOutput::Interrupt {
                            payload: json!({"write": "SR:MAG:QF1:SP", "value": 20.0}),
                            update: ApprovalUpdate::default(),
                        }),
                    }
                }
            }),
        )
        .router(|state: &Approval| if state.decisions.is_empty() { Route::to("approve") } else { Route::End })
        .shared_checkpointer(checkpointer)
        .build()
        .expect("graph")
}

/// A SQLite handle that holds every `Resume` put until both racers have reached theirs, so both
/// have loaded the pending interrupt before either writes.
struct BothLoadFirst {
    inner: SqliteCheckpointer,
    gate: Arc<Barrier>,
}

impl Checkpointer for BothLoadFirst {
    async fn put(&self, checkpoint: NewCheckpoint) -> Result<CheckpointMeta, CheckpointError> {
        if checkpoint.source == CheckpointSource::Resume {
            self.gate.wait().await;
        }
        self.inner.put(checkpoint).await
    }

    async fn load(&self, thread_id: &str, checkpoint_id: Option<CheckpointId>) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        self.inner.load(thread_id, checkpoint_id).await
    }

    async fn list(&self, thread_id: &str, query: ListQuery) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        self.inner.list(thread_id, query).await
    }

    async fn threads(&self) -> Result<Vec<ThreadSummary>, CheckpointError> {
        self.inner.threads().await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        self.inner.copy_thread(from, to).await
    }

    async fn lock_thread(&self, thread_id: &str) -> Result<ThreadLock, CheckpointError> {
        self.inner.lock_thread(thread_id).await
    }

    async fn is_thread_locked(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        self.inner.is_thread_locked(thread_id).await
    }
}

/// Two "processes": graphs over separately opened handles on the file at `path`, optionally gated
/// so that both load before either writes.
async fn two_processes(path: &Path, executions: &Arc<AtomicU32>, gated: bool) -> [Graph<Approval>; 2] {
    let gate = gated.then(|| Arc::new(Barrier::new(2)));
    [process(path, executions, gate.clone()).await, process(path, executions, gate).await]
}

/// One "process": its own handle on the file, so its own thread locks.
async fn process(path: &Path, executions: &Arc<AtomicU32>, gate: Option<Arc<Barrier>>) -> Graph<Approval> {
    let handle = SqliteCheckpointer::open(path).await.expect("open the shared file");
    let checkpointer: Arc<dyn DynCheckpointer> = match gate {
        Some(gate) => Arc::new(BothLoadFirst { inner: handle, gate }),
        None => Arc::new(handle),
    };
    approval_graph(checkpointer, Arc::clone(executions))
}

/// Asks once from the first graph; returns the pending question.
async fn ask(graph: &Graph<Approval>) -> PendingInterrupt {
    let outcome = graph.run(THREAD, ApprovalUpdate::default(), RunOptions::default()).await.expect("the first run pauses");
    outcome.interrupt().cloned().expect("the first run asks for approval")
}

/// Answers `interrupt` from both graphs at once, each with its own answer; returns both results
/// with the answers given.
async fn race(graphs: &[Graph<Approval>; 2], interrupt: &PendingInterrupt) -> [(Value, Result<RunOutcome<Approval>, RunError>); 2] {
    let answers = [json!({"approved": true, "by": "process a"}), json!({"approved": true, "by": "process b"})];
    let tasks = [0, 1].map(|index| {
        let graph = graphs[index].clone();
        let resume = Resume::to(interrupt, answers[index].clone());
        tokio::spawn(async move { graph.resume(THREAD, resume, RunOptions::default()).await })
    });
    let [a, b] = tasks;
    let (a, b) = tokio::time::timeout(RACE_DEADLINE, async { tokio::join!(a, b) }).await.expect("both resumes finish");
    let [answer_a, answer_b] = answers;
    [(answer_a, a.expect("resume task a")), (answer_b, b.expect("resume task b"))]
}

/// How the slower resume ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// It loaded the question too, but the other run wrote first.
    Conflict,
    /// It loaded after the other run had answered the question.
    NothingToResume,
}

/// Checks the invariants after a race on a fresh file: exactly one resume completed, with its own
/// answer recorded once; the action ran exactly once; the file holds one unbroken chain; the
/// loser can reload and sees nothing left to answer. Returns how the loser failed.
async fn check_race(
    iteration: usize,
    graphs: &[Graph<Approval>; 2],
    interrupt: &PendingInterrupt,
    results: [(Value, Result<RunOutcome<Approval>, RunError>); 2],
    executions: &AtomicU32,
    path: &Path,
) -> Lost {
    let [(answer_a, a), (answer_b, b)] = results;
    let (winner_answer, completed, loser, error) = match (a, b) {
        (Ok(outcome), Err(error)) => (answer_a, outcome, 1, error),
        (Err(error), Ok(outcome)) => (answer_b, outcome, 0, error),
        (a, b) => panic!("iteration {iteration}: exactly one resume must complete, got {a:?} and {b:?}"),
    };
    assert!(matches!(completed, RunOutcome::Completed { .. }), "iteration {iteration}: the winner completes, got {completed:?}");
    assert_eq!(
        completed.state().decisions,
        std::slice::from_ref(&winner_answer),
        "iteration {iteration}: the winner's decision is recorded once"
    );
    let lost = match &error {
        RunError::Checkpoint(CheckpointError::Conflict { thread_id, .. }) if thread_id == THREAD => {
            assert!(error.to_string().contains("changed by another run"), "iteration {iteration}: unclear message: {error}");
            assert!(error.is_retryable(), "iteration {iteration}: a conflict is retryable");
            Lost::Conflict
        }
        RunError::NothingToResume { .. } => Lost::NothingToResume,
        other => panic!("iteration {iteration}: the losing resume must fail with a conflict or NothingToResume, got {other}"),
    };
    assert_eq!(executions.load(Ordering::SeqCst), 1, "iteration {iteration}: the approved action ran exactly once");

    let reader = SqliteCheckpointer::open(path).await.expect("reopen the shared file");
    let history = reader.list(THREAD, ListQuery::default()).await.expect("history");
    assert!(
        history.windows(2).all(|pair| pair[0].parent_id == Some(pair[1].checkpoint_id)),
        "iteration {iteration}: the stored history is a single chain: {history:?}"
    );
    assert_eq!(history.last().map(|meta| meta.parent_id), Some(None), "iteration {iteration}: the chain starts at the root");
    let resumes = history.iter().filter(|meta| meta.source == CheckpointSource::Resume).count();
    assert_eq!(resumes, 1, "iteration {iteration}: exactly one answer is stored");

    let retried = graphs[loser].resume(THREAD, Resume::to(interrupt, json!({"approved": true})), RunOptions::default()).await;
    assert!(matches!(retried, Err(RunError::NothingToResume { .. })), "iteration {iteration}: reloading shows the question answered");
    let stored = graphs[loser].get_state(THREAD).await.expect("state").expect("exists");
    assert_eq!(stored.state.decisions, [winner_answer], "iteration {iteration}: the loser's process sees the winner's decision");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "iteration {iteration}: retrying runs nothing");
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_both_processes_loaded_the_question_only_one_answer_runs_the_action() {
    for iteration in 0..ITERATIONS {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpoints.db");
        let executions = Arc::new(AtomicU32::new(0));
        let graphs = two_processes(&path, &executions, true).await;
        let interrupt = ask(&graphs[0]).await;
        assert_eq!(executions.load(Ordering::SeqCst), 0, "asking executes nothing");

        let results = race(&graphs, &interrupt).await;
        let lost = check_race(iteration, &graphs, &interrupt, results, &executions, &path).await;
        assert_eq!(lost, Lost::Conflict, "iteration {iteration}: both loaded the question, so the slower write conflicts");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_racing_from_two_processes_run_the_action_once() {
    for iteration in 0..ITERATIONS {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpoints.db");
        let executions = Arc::new(AtomicU32::new(0));
        let graphs = two_processes(&path, &executions, false).await;
        let interrupt = ask(&graphs[1]).await;

        let results = race(&graphs, &interrupt).await;
        check_race(iteration, &graphs, &interrupt, results, &executions, &path).await;
    }
}

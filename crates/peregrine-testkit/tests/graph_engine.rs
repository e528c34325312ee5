//! The graph engine on a small generic state: a checkpoint after every node, state rebuilt
//! from snapshots plus deltas, interrupts with stale and forged answers refused, time travel,
//! `update_state`, panics, busy threads and the event stream — on the memory, SQLite and
//! PostgreSQL backends alike.

#![allow(clippy::expect_used, reason = "test fixtures report setup failures by panicking")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use peregrine_core::GraphState;
use peregrine_graph::{
    CheckpointSource, DynCheckpointer, Graph, ListQuery, NodeError, NodeOutput, Resume, Route, RunError, RunEvent, RunOptions, RunOutcome,
    node_fn, payload_digest,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Trail {
    visited: Vec<String>,
    target: usize,
    approved: Vec<serde_json::Value>,
    payload: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct TrailUpdate {
    visit: Option<String>,
    target: Option<usize>,
    approved: Option<serde_json::Value>,
    payload: Option<String>,
}

impl GraphState for Trail {
    type Update = TrailUpdate;
    type Event = String;

    fn apply(&mut self, update: TrailUpdate) {
        self.visited.extend(update.visit);
        if let Some(target) = update.target {
            self.target = target;
        }
        self.approved.extend(update.approved);
        if let Some(payload) = update.payload {
            self.payload.push_str(&payload);
        }
    }
}

fn visit(name: &str) -> TrailUpdate {
    TrailUpdate { visit: Some(name.into()), payload: Some("x".repeat(200)), ..TrailUpdate::default() }
}

/// `step` runs until `target` visits, then `done` (terminal) ends the run.
fn counting_graph(checkpointer: Arc<dyn DynCheckpointer>) -> Graph<Trail> {
    Graph::builder()
        .node(
            "step",
            node_fn(|state: Arc<Trail>, _info| async move { Ok(NodeOutput::Update(visit(&format!("step{}", state.visited.len() + 1)))) }),
        )
        .node("done", node_fn(|_state: Arc<Trail>, _info| async move { Ok(NodeOutput::Update(visit("done"))) }))
        .router(|state: &Trail| if state.visited.len() < state.target { Route::to("step") } else { Route::to("done") })
        .terminal("done")
        .shared_checkpointer(checkpointer)
        .build()
        .expect("graph")
}

/// `approve` asks once; when answered it records the answer and ends.
fn approval_graph(checkpointer: Arc<dyn DynCheckpointer>, runs: Arc<AtomicU32>) -> Graph<Trail> {
    Graph::builder()
        .node(
            "approve",
            node_fn(move |_state: Arc<Trail>, info| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    match info.resume {
                        Some(resume) => Ok(NodeOutput::Update(TrailUpdate {
                            approved: Some(resume.answer),
                            visit: Some("approve".into()),
                            ..TrailUpdate::default()
                        })),
                        None => Ok(NodeOutput::Interrupt {
                            payload: json!({"write": "SR:MAG:QF1:SP", "value": 20.0}),
                            update: TrailUpdate::default(),
                        }),
                    }
                }
            }),
        )
        .router(|state: &Trail| if state.visited.is_empty() { Route::to("approve") } else { Route::End })
        .shared_checkpointer(checkpointer)
        .build()
        .expect("graph")
}

fn start(target: usize) -> TrailUpdate {
    TrailUpdate { target: Some(target), ..TrailUpdate::default() }
}

async fn backends() -> Vec<(&'static str, Arc<dyn DynCheckpointer>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = peregrine_checkpoint::SqliteCheckpointer::open(dir.path().join("engine.db")).await.expect("sqlite");
    let mut backends: Vec<(&'static str, Arc<dyn DynCheckpointer>, Option<tempfile::TempDir>)> =
        vec![("memory", Arc::new(peregrine_checkpoint::MemoryCheckpointer::new()), None), ("sqlite", Arc::new(sqlite), Some(dir))];
    if let Some(postgres) = postgres().await {
        backends.push(("postgres", postgres, None));
    }
    backends
}

/// A PostgreSQL checkpointer in a fresh schema of the test server, when one is configured
/// (`scripts/postgres.sh start`); CI always configures one.
async fn postgres() -> Option<Arc<dyn DynCheckpointer>> {
    let Ok(url) = std::env::var("PEREGRINE_TEST_POSTGRES_URL") else {
        assert!(std::env::var_os("CI").is_none(), "CI must provide PostgreSQL: run `eval \"$(bash scripts/postgres.sh start)\"` first");
        eprintln!("PEREGRINE_TEST_POSTGRES_URL is not set: the engine tests skip the PostgreSQL backend");
        return None;
    };
    let schema = format!("engine_{:016x}", fastrand::u64(..));
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect to the test server");
    tokio::spawn(connection);
    admin.batch_execute(&format!("CREATE SCHEMA {schema}")).await.expect("create a scratch schema");
    let separator = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{separator}options=-csearch_path%3D{schema}");
    let checkpointer = peregrine_checkpoint::PostgresCheckpointer::connect(&scoped).await.expect("postgres checkpointer");
    Some(Arc::new(checkpointer))
}

#[tokio::test]
async fn a_checkpoint_is_written_after_every_node_and_the_state_rebuilds_exactly() {
    for (backend, checkpointer, _dir) in backends().await {
        let graph = counting_graph(checkpointer);
        let outcome = graph
            .run(
                "t",
                start(600),
                RunOptions {
                    limits: Some(peregrine_graph::GraphLimits { recursion_limit: 1000, max_run_time: None }),
                    ..RunOptions::default()
                },
            )
            .await
            .expect(backend);
        let RunOutcome::Completed { state, last_node, .. } = outcome else { panic!("{backend}: expected completion") };
        assert_eq!(last_node.as_deref(), Some("done"));
        assert_eq!(state.visited.len(), 601);
        let history = graph.history("t", ListQuery::default()).await.expect(backend);
        assert_eq!(history.len(), 602, "{backend}: the input plus one checkpoint per node");
        assert_eq!(history.last().map(|meta| meta.source), Some(CheckpointSource::Input));
        assert!(history.windows(2).all(|pair| pair[0].parent_id == Some(pair[1].checkpoint_id)), "{backend}: a single chain");
        let stored = graph.get_state("t").await.expect(backend).expect("exists");
        assert_eq!(*stored.state, *state, "{backend}: snapshot + deltas rebuild the same state");
        assert_eq!(stored.next, None, "{backend}: finished");
        let middle = graph.state_at("t", 300).await.expect(backend);
        assert_eq!(middle.state.visited.len(), 299, "{backend}: checkpoint 300 follows 299 nodes");
        assert_eq!(middle.next.as_deref(), Some("step"));
    }
}

#[tokio::test]
async fn interrupts_pause_and_resume_exactly_once_and_refuse_stale_or_forged_answers() {
    for (backend, checkpointer, _dir) in backends().await {
        let runs = Arc::new(AtomicU32::new(0));
        let graph = approval_graph(checkpointer, runs.clone());
        let outcome = graph.run("t", TrailUpdate::default(), RunOptions::default()).await.expect(backend);
        let interrupt = outcome.interrupt().cloned().expect("paused");
        assert_eq!(interrupt.node, "approve");
        assert_eq!(interrupt.digest, payload_digest(&json!({"value": 20.0, "write": "SR:MAG:QF1:SP"})), "digest of canonical JSON");
        let paused = graph.get_state("t").await.expect(backend).expect("exists");
        assert_eq!(paused.meta.interrupt.as_ref(), Some(&interrupt), "{backend}: the interrupt is persisted");
        assert_eq!(paused.next.as_deref(), Some("approve"));

        let busy = graph.run("t", TrailUpdate::default(), RunOptions::default()).await;
        assert!(matches!(busy, Err(RunError::PendingInterrupt { .. })), "{backend}: a new run must not skip the question");
        let mut forged = Resume::to(&interrupt, json!({"approved": true}));
        forged.payload_digest = payload_digest(&json!({"write": "SR:MAG:QF1:SP", "value": 99.0}));
        assert!(matches!(graph.resume("t", forged, RunOptions::default()).await, Err(RunError::ForgedResume { .. })), "{backend}");
        let mut stale = Resume::to(&interrupt, json!({"approved": true}));
        stale.interrupt_id = "an-old-interrupt".into();
        assert!(matches!(graph.resume("t", stale, RunOptions::default()).await, Err(RunError::StaleResume { .. })), "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: refused answers run nothing");

        let done = graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), RunOptions::default()).await.expect(backend);
        assert!(matches!(done, RunOutcome::Completed { .. }), "{backend}");
        assert_eq!(done.state().approved, vec![json!({"approved": true})]);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let again = graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), RunOptions::default()).await;
        assert!(matches!(again, Err(RunError::NothingToResume { .. })), "{backend}: an answer is used once");
        let continued = graph.continue_run("t", RunOptions::default()).await.expect(backend);
        assert_eq!(continued.state().approved.len(), 1, "{backend}: nothing re-runs after completion");
    }
}

#[tokio::test]
async fn an_abandoned_question_ends_the_run_unanswered_and_is_bound_like_an_answer() {
    for (backend, checkpointer, _dir) in backends().await {
        let runs = Arc::new(AtomicU32::new(0));
        let graph = approval_graph(checkpointer, runs.clone());
        let interrupt =
            graph.run("t", TrailUpdate::default(), RunOptions::default()).await.expect(backend).interrupt().cloned().expect("paused");
        let note = TrailUpdate { payload: Some("cancelled".into()), ..TrailUpdate::default() };
        let mut forged = Resume::to(&interrupt, json!({"abandon": true})).with_update(note.clone());
        forged.payload_digest = payload_digest(&json!({"write": "SR:MAG:QF1:SP", "value": 99.0}));
        assert!(matches!(graph.abandon("t", forged).await, Err(RunError::ForgedResume { .. })), "{backend}");
        let mut stale = Resume::to(&interrupt, json!({"abandon": true})).with_update(note.clone());
        stale.interrupt_id = "an-old-interrupt".into();
        assert!(matches!(graph.abandon("t", stale).await, Err(RunError::StaleResume { .. })), "{backend}");
        let still = graph.get_state("t").await.expect(backend).expect("exists");
        assert_eq!(still.meta.interrupt.as_ref(), Some(&interrupt), "{backend}: refused withdrawals change nothing");

        let abandoned = graph.abandon("t", Resume::to(&interrupt, json!({"abandon": true})).with_update(note)).await.expect(backend);
        assert_eq!(abandoned.meta.source, CheckpointSource::Abandon);
        assert_eq!((abandoned.meta.interrupt.as_ref(), abandoned.meta.resume.as_ref()), (None, None), "{backend}: nothing pending");
        assert_eq!(abandoned.next, None, "{backend}: the run ended");
        assert_eq!(abandoned.state.payload, "cancelled", "{backend}: the record is applied");
        let stored = graph.get_state("t").await.expect(backend).expect("exists");
        assert_eq!((stored.meta.source, stored.next.clone()), (CheckpointSource::Abandon, None), "{backend}: stored as such");

        let answer = graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), RunOptions::default()).await;
        assert!(matches!(answer, Err(RunError::NothingToResume { .. })), "{backend}: a withdrawn question takes no answer");
        let again = graph.abandon("t", Resume::to(&interrupt, json!({"abandon": true}))).await;
        assert!(matches!(again, Err(RunError::NothingToResume { .. })), "{backend}: nor a second withdrawal");
        let continued = graph.continue_run("t", RunOptions::default()).await.expect(backend);
        assert!(matches!(continued, RunOutcome::Completed { .. }), "{backend}: nothing to finish");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{backend}: the node that asked never ran again");
        assert!(stored.state.approved.is_empty(), "{backend}: never approved");
        // The thread takes new runs again.
        assert!(graph.run("t", TrailUpdate::default(), RunOptions::default()).await.is_ok(), "{backend}: idle");
    }
}

#[tokio::test]
async fn time_travel_forks_from_an_earlier_checkpoint_and_keeps_the_old_branch() {
    for (backend, checkpointer, _dir) in backends().await {
        let graph = counting_graph(checkpointer);
        graph.run("t", start(5), RunOptions::default()).await.expect(backend);
        let original = graph.get_state("t").await.expect(backend).expect("exists");
        let forked = graph.run_from("t", 3, Some(start(3)), RunOptions::default()).await.expect(backend);
        assert_eq!(forked.state().visited, ["step1", "step2", "step3", "done"], "{backend}: branch from checkpoint 3 (two steps in)");
        let fork_tip = graph.get_state("t").await.expect(backend).expect("exists");
        let history = graph.history("t", ListQuery::default()).await.expect(backend);
        let fork_point = history.iter().find(|meta| meta.source == CheckpointSource::Fork).expect("fork recorded");
        assert_eq!(fork_point.parent_id, Some(3));
        assert_ne!(fork_tip.meta.checkpoint_id, original.meta.checkpoint_id);
        let old = graph.state_at("t", original.meta.checkpoint_id).await.expect(backend);
        assert_eq!(old.state.visited.len(), 6, "{backend}: the old branch is intact");
    }
}

#[tokio::test]
async fn update_state_changes_state_without_running_and_keeps_interrupts() {
    for (backend, checkpointer, _dir) in backends().await {
        let graph = approval_graph(checkpointer, Arc::new(AtomicU32::new(0)));
        let paused = graph.run("t", TrailUpdate::default(), RunOptions::default()).await.expect(backend);
        let interrupt = paused.interrupt().cloned().expect("paused");
        let updated =
            graph.update_state("t", TrailUpdate { payload: Some("note".into()), ..TrailUpdate::default() }, None).await.expect(backend);
        assert_eq!(updated.state.payload, "note");
        assert_eq!(updated.meta.source, CheckpointSource::Update);
        assert_eq!(updated.meta.interrupt.as_ref(), Some(&interrupt), "{backend}: still waiting for the answer");
        let done = graph.resume("t", Resume::to(&interrupt, json!("yes")), RunOptions::default()).await.expect(backend);
        assert_eq!(done.state().payload, "note");
    }
}

#[tokio::test]
async fn node_panics_and_fatal_errors_end_the_run_with_the_checkpoint_intact() {
    for (backend, checkpointer, _dir) in backends().await {
        let graph: Graph<Trail> = Graph::builder()
            .node("ok", node_fn(|_s: Arc<Trail>, _i| async move { Ok(NodeOutput::Update(visit("ok"))) }))
            .node("boom", node_fn(|_s: Arc<Trail>, _i| async move { panic!("sensor array on fire") }))
            .node("fatal", node_fn(|_s: Arc<Trail>, _i| async move { Err(NodeError::fatal("interlock tripped")) }))
            .router(|state: &Trail| match (state.visited.len(), state.target) {
                (0, _) => Route::to("ok"),
                (_, 1) => Route::to("boom"),
                _ => Route::to("fatal"),
            })
            .shared_checkpointer(checkpointer)
            .build()
            .expect("graph");
        let panicked = graph.run("p", start(1), RunOptions::default()).await.expect_err("panic is an error");
        assert!(
            matches!(&panicked, RunError::NodePanicked { node, message, .. } if node == "boom" && message.contains("on fire")),
            "{backend}: {panicked}"
        );
        let fatal = graph.run("f", start(2), RunOptions::default()).await.expect_err("fatal is an error");
        assert!(fatal.to_string().contains("interlock tripped") && fatal.to_string().contains("checkpoint 2"), "{backend}: {fatal}");
        let kept = graph.get_state("p").await.expect(backend).expect("exists");
        assert_eq!(kept.state.visited, ["ok"], "{backend}");
        assert_eq!(kept.meta.checkpoint_id, 2);
    }
}

#[tokio::test]
async fn one_thread_never_runs_twice_at_once() {
    for (backend, checkpointer, _dir) in backends().await {
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let gates = Arc::new(std::sync::Mutex::new((Some(entered_tx), Some(release_rx))));
        let graph: Graph<Trail> = Graph::builder()
            .node(
                "hold",
                node_fn(move |_s: Arc<Trail>, _i| {
                    let gates = gates.clone();
                    async move {
                        let (entered, release) = {
                            let mut gates = gates.lock().expect("lock");
                            (gates.0.take(), gates.1.take())
                        };
                        if let (Some(entered), Some(release)) = (entered, release) {
                            let _ = entered.send(());
                            let _ = release.await;
                        }
                        Ok(NodeOutput::Update(visit("hold")))
                    }
                }),
            )
            .router(|state: &Trail| if state.visited.is_empty() { Route::to("hold") } else { Route::End })
            .shared_checkpointer(checkpointer)
            .build()
            .expect("graph");
        let first = tokio::spawn({
            let graph = graph.clone();
            async move { graph.run("t", TrailUpdate::default(), RunOptions::default()).await }
        });
        entered_rx.await.expect("first run entered its node");
        let second = graph.run("t", TrailUpdate::default(), RunOptions::default()).await;
        assert!(matches!(&second, Err(error) if error.is_retryable() && error.to_string().contains("busy")), "{backend}: {second:?}");
        assert!(graph.run("other", TrailUpdate::default(), RunOptions::default()).await.is_ok(), "{backend}: other threads are free");
        release_tx.send(()).expect("release");
        first.await.expect("task").expect(backend);
    }
}

#[tokio::test]
async fn the_event_stream_reports_nodes_checkpoints_and_domain_events_in_order() {
    let checkpointer: Arc<dyn DynCheckpointer> = Arc::new(peregrine_checkpoint::MemoryCheckpointer::new());
    let graph: Graph<Trail> = Graph::builder()
        .node("a", node_fn(|_s: Arc<Trail>, _i| async move { Ok(NodeOutput::Update(visit("a"))) }))
        .router(|state: &Trail| if state.visited.is_empty() { Route::to("a") } else { Route::End })
        .shared_checkpointer(checkpointer)
        .build()
        .expect("graph");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    graph.run("t", TrailUpdate::default(), RunOptions::with_events(sender)).await.expect("runs");
    let mut kinds = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        kinds.push(match event {
            RunEvent::RunStarted { .. } => "started".to_string(),
            RunEvent::NodeStarted { node, step } => format!("node {node} #{step}"),
            RunEvent::NodeFinished { node, checkpoint_id, .. } => format!("finished {node} at {checkpoint_id:?}"),
            RunEvent::RunFinished { last_node } => format!("end after {last_node:?}"),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(kinds, ["started", "node a #1", "finished a at Some(2)", "end after Some(\"a\")"]);
}

#[tokio::test]
async fn forks_ask_again_under_a_new_id_so_old_answers_never_count_twice() {
    for (backend, checkpointer, _dir) in backends().await {
        let runs = Arc::new(AtomicU32::new(0));
        let graph = approval_graph(checkpointer, runs.clone());
        let asked = graph.run("t", TrailUpdate::default(), RunOptions::default()).await.expect(backend);
        let first = asked.interrupt().cloned().expect("paused");
        let question_checkpoint = asked_checkpoint(&asked);
        graph.resume("t", Resume::to(&first, json!(true)), RunOptions::default()).await.expect(backend);
        let answer_checkpoint = graph
            .history("t", ListQuery::default())
            .await
            .expect(backend)
            .into_iter()
            .find(|meta| meta.resume.is_some())
            .expect("resume recorded");

        for origin in [question_checkpoint, answer_checkpoint.checkpoint_id] {
            let forked = graph.run_from("t", origin, None, RunOptions::default()).await.expect(backend);
            let again = forked.interrupt().cloned().unwrap_or_else(|| panic!("{backend}: the fork from {origin} asks again"));
            assert_ne!(again.id, first.id, "{backend}: a fresh id");
            assert_eq!(
                (again.payload.clone(), again.digest.clone()),
                (first.payload.clone(), first.digest.clone()),
                "{backend}: the same question"
            );
            let replay = graph.resume("t", Resume::to(&first, json!(true)), RunOptions::default()).await;
            assert!(matches!(replay, Err(RunError::StaleResume { .. })), "{backend}: the used answer is stale on the fork: {replay:?}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{backend}: the ask and the answered run; a fork re-asks without running the node");
        let with_input = graph
            .run_from(
                "t",
                question_checkpoint,
                Some(TrailUpdate { visit: Some("manual".into()), ..TrailUpdate::default() }),
                RunOptions::default(),
            )
            .await
            .expect(backend);
        assert!(matches!(with_input, RunOutcome::Completed { .. }), "{backend}: new input routes afresh and drops the question");
    }
}

fn asked_checkpoint(outcome: &RunOutcome<Trail>) -> u64 {
    match outcome {
        RunOutcome::Interrupted { checkpoint_id, .. } => *checkpoint_id,
        other => panic!("expected an interrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn payloads_with_any_float_survive_storage_with_their_digest() {
    for (backend, checkpointer, _dir) in backends().await {
        let graph: Graph<Trail> = Graph::builder()
            .node(
                "approve",
                node_fn(|_s: Arc<Trail>, info| async move {
                    match info.resume {
                        Some(resume) => Ok(NodeOutput::Update(TrailUpdate {
                            approved: Some(resume.payload),
                            visit: Some("approve".into()),
                            ..TrailUpdate::default()
                        })),
                        None => Ok(NodeOutput::Interrupt {
                            payload: json!({"values": [2.017351698988807e285, 10.277846898011259, 0.1 + 0.2, -1.0e-300]}),
                            update: TrailUpdate::default(),
                        }),
                    }
                }),
            )
            .router(|state: &Trail| if state.visited.is_empty() { Route::to("approve") } else { Route::End })
            .shared_checkpointer(checkpointer)
            .build()
            .expect("graph");
        let asked = graph.run("t", TrailUpdate::default(), RunOptions::default()).await.expect(backend);
        let interrupt = asked.interrupt().cloned().expect("paused");
        let done = graph.resume("t", Resume::to(&interrupt, json!(true)), RunOptions::default()).await.expect(backend);
        assert_eq!(done.state().approved, vec![interrupt.payload.clone()], "{backend}: the exact floats come back");
    }
}

#[tokio::test]
async fn resuming_at_the_recursion_limit_keeps_the_question_open() {
    for (backend, checkpointer, _dir) in backends().await {
        let runs = Arc::new(AtomicU32::new(0));
        let graph = approval_graph(checkpointer, runs.clone());
        let tight = || RunOptions {
            limits: Some(peregrine_graph::GraphLimits { recursion_limit: 1, max_run_time: None }),
            ..RunOptions::default()
        };
        let interrupt = graph.run("t", TrailUpdate::default(), tight()).await.expect(backend).interrupt().cloned().expect("paused");
        let refused = graph.resume("t", Resume::to(&interrupt, json!(true)), tight()).await;
        assert!(matches!(refused, Err(RunError::RecursionLimit { .. })), "{backend}: {refused:?}");
        let done = graph.resume("t", Resume::to(&interrupt, json!(true)), RunOptions::default()).await.expect("the answer still counts");
        assert!(matches!(done, RunOutcome::Completed { .. }));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn huge_time_budgets_mean_no_deadline_and_errors_say_what_was_kept() {
    let graph: Graph<Trail> = Graph::builder()
        .node("fatal", node_fn(|_s: Arc<Trail>, _i| async move { Err(NodeError::fatal("interlock tripped")) }))
        .router(|_state: &Trail| Route::to("fatal"))
        .build()
        .expect("graph");
    let options = RunOptions {
        limits: Some(peregrine_graph::GraphLimits { recursion_limit: 10, max_run_time: Some(std::time::Duration::MAX) }),
        ..RunOptions::default()
    };
    let error = graph.run("t", TrailUpdate::default(), options).await.expect_err("fatal");
    let message = error.to_string();
    assert!(message.contains("Nothing was stored (the graph has no checkpointer)"), "{message}");
}

//! The whole agent graph with scripted nodes (no LLM): every recovery path of the router —
//! retry with growing backoff, retries exhausted, re-planning within budget, re-classification,
//! FATAL abort, infrastructure-node retries — and the recursion and wall-clock limits.
//! Time is paused, so backoff waits are exact and cost nothing.

use std::sync::Arc;
use std::time::Duration;

use peregrine_core::{
    AgentState, AgentStateUpdate, CapabilityOutcome, ErrorClassification, ErrorSeverity, ExecutionLimits, RetryPolicy, TurnStart,
};
use peregrine_graph::{DynCheckpointer, Graph, RunError, RunEvent, RunOptions, RunOutcome};
use peregrine_testkit::{ScriptedAgent, ScriptedCapability, ScriptedInfra, fail};
use tokio::sync::mpsc;

fn turn(text: &str) -> AgentStateUpdate {
    AgentStateUpdate::new_turn(TurnStart::new(text, Default::default()))
}

struct Run {
    outcome: Result<RunOutcome<AgentState>, RunError>,
    events: Vec<RunEvent<peregrine_core::AgentEvent>>,
}

impl Run {
    fn nodes(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|event| if let RunEvent::NodeStarted { node, .. } = event { Some(node.clone()) } else { None })
            .collect()
    }

    fn waits(&self) -> Vec<(String, Duration)> {
        self.events
            .iter()
            .filter_map(|event| if let RunEvent::Waiting { node, delay } = event { Some((node.clone(), *delay)) } else { None })
            .collect()
    }

    fn completed(&self) -> (&Arc<AgentState>, Option<&str>) {
        match &self.outcome {
            Ok(RunOutcome::Completed { state, last_node, .. }) => (state, last_node.as_deref()),
            other => panic!("expected a completed run, got {other:?}"),
        }
    }
}

async fn run(graph: &Graph<AgentState>, thread: &str) -> Run {
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let outcome = graph.run(thread, turn("do the thing"), RunOptions::with_events(sender)).await;
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    Run { outcome, events }
}

fn memory() -> Option<Arc<dyn DynCheckpointer>> {
    Some(Arc::new(peregrine_checkpoint::MemoryCheckpointer::new()))
}

#[tokio::test(start_paused = true)]
async fn retriable_twice_then_success_runs_three_times_with_growing_backoff() {
    let python = ScriptedCapability::new("python", |_, call| {
        if call <= 2 {
            fail(ErrorClassification::retriable("kernel busy"))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate::default()))
        }
    })
    .with_policy(RetryPolicy::new(3, 0.5, 1.5));
    let calls = python.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(None).expect("graph");
    let result = run(&graph, "t").await;

    let (state, last_node) = result.completed();
    assert_eq!(last_node, Some("respond"));
    assert_eq!(calls.count(), 3, "two failures and one success");
    assert_eq!(result.waits(), vec![("python".into(), Duration::from_millis(500)), ("python".into(), Duration::from_millis(750))]);
    let instants = calls.instants();
    assert_eq!(instants[1] - instants[0], Duration::from_millis(500));
    assert_eq!(instants[2] - instants[1], Duration::from_millis(750));
    assert!(
        !state.control.has_error && state.control.retry_count == 0 && state.control.error_info.is_none(),
        "success clears the error state"
    );
    assert_eq!(result.nodes(), ["task_extraction", "classifier", "orchestrator", "python", "python", "python", "respond"]);
}

#[tokio::test(start_paused = true)]
async fn retries_exhausted_go_to_the_error_node() {
    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::retriable("kernel busy")))
        .with_policy(RetryPolicy::new(3, 0.5, 1.5));
    let calls = python.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (state, last_node) = result.completed();
    assert_eq!(last_node, Some("error"));
    assert_eq!(calls.count(), 3, "max_attempts counts every execution");
    assert_eq!(state.messages.last().map(|m| m.content.as_str()), Some("ERROR REPORT: RETRIABLE"));
    assert!(!result.nodes().contains(&"respond".to_string()));
}

#[tokio::test(start_paused = true)]
async fn replanning_returns_to_the_orchestrator_until_the_budget_then_errors() {
    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::replanning("channel not found")));
    let calls = python.calls();
    let agent = ScriptedAgent::planning(&["python"]).with_capability(python);
    let orchestrator_calls = agent.orchestrator.calls();
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (state, last_node) = result.completed();
    assert_eq!(last_node, Some("error"));
    assert_eq!(orchestrator_calls.count(), 2, "the first plan and one re-plan (max_planning_attempts = 2)");
    assert_eq!(calls.count(), 2);
    assert_eq!(state.control.planning_attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_failing_orchestrator_counts_its_planning_attempts() {
    let mut agent = ScriptedAgent::planning(&["python"]);
    agent.orchestrator =
        ScriptedInfra::new("orchestrator", |_, _| fail(ErrorClassification::replanning("plan reads an unknown context key")))
            .with_policy(RetryPolicy::orchestrator());
    let orchestrator_calls = agent.orchestrator.calls();
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (_, last_node) = result.completed();
    assert_eq!(last_node, Some("error"), "upstream looped here until the recursion limit");
    assert_eq!(orchestrator_calls.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn reclassification_reruns_the_classifier_once_then_errors() {
    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::reclassification("wrong tool")));
    let agent = ScriptedAgent::planning(&["python"]).with_capability(python);
    let classifier_calls = agent.classifier.calls();
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (state, last_node) = result.completed();
    assert_eq!(last_node, Some("error"));
    assert_eq!(classifier_calls.count(), 2, "initial classification plus max_reclassifications = 1");
    assert_eq!(state.control.reclassification_count, 1);
    assert_eq!(
        result.nodes(),
        ["task_extraction", "classifier", "orchestrator", "python", "classifier", "orchestrator", "python", "error"]
    );
}

#[tokio::test(start_paused = true)]
async fn fatal_aborts_the_run_and_keeps_the_checkpoint() {
    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::fatal("interlock state unknown")));
    let checkpointer = memory();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(checkpointer).expect("graph");
    let result = run(&graph, "t").await;
    let nodes = result.nodes();
    let error = result.outcome.expect_err("FATAL aborts");
    let message = error.to_string();
    assert!(matches!(error, RunError::RouterAborted { .. }), "{message}");
    assert!(message.contains("FATAL error in 'python': interlock state unknown"), "{message}");
    assert!(message.contains("last checkpoint"), "{message}");
    let snapshot = graph.get_state("t").await.expect("state").expect("thread exists");
    let info = snapshot.state.control.error_info.clone().expect("the failure is recorded");
    assert_eq!(info.classification.severity, ErrorSeverity::Fatal);
    assert_eq!(snapshot.meta.node.as_deref(), Some("python"));
    assert!(!nodes.contains(&"error".to_string()), "FATAL never reaches the error node");
}

#[tokio::test(start_paused = true)]
async fn infrastructure_retriable_failures_retry_and_clear_the_error() {
    let mut agent = ScriptedAgent::planning(&["python"]);
    agent.task_extraction = ScriptedInfra::new("task_extraction", |_, call| {
        if call == 1 {
            fail(ErrorClassification::retriable("LLM timeout"))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate {
                task: Some(peregrine_core::state::TaskState { current_task: Some("t".into()), ..Default::default() }),
                ..Default::default()
            }))
        }
    })
    .with_policy(RetryPolicy::task_extraction());
    let calls = agent.task_extraction.calls();
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (_, last_node) = result.completed();
    assert_eq!(last_node, Some("respond"), "upstream re-ran task extraction until the recursion limit");
    assert_eq!(calls.count(), 2);
    assert_eq!(result.waits(), vec![("task_extraction".into(), Duration::from_secs(1))]);
}

#[tokio::test(start_paused = true)]
async fn infrastructure_retries_are_bounded_by_their_policy() {
    let mut agent = ScriptedAgent::planning(&["python"]);
    agent.task_extraction = ScriptedInfra::new("task_extraction", |_, _| fail(ErrorClassification::retriable("LLM timeout")))
        .with_policy(RetryPolicy::task_extraction());
    let calls = agent.task_extraction.calls();
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    assert_eq!(result.completed().1, Some("error"));
    assert_eq!(calls.count(), 3);
    assert_eq!(result.waits().iter().map(|(_, delay)| *delay).collect::<Vec<_>>(), [Duration::from_secs(1), Duration::from_millis(1500)]);
}

#[tokio::test(start_paused = true)]
async fn the_recursion_limit_stops_a_runaway_loop() {
    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::retriable("always")))
        .with_policy(RetryPolicy::new(10_000, 0.01, 1.0));
    let mut agent = ScriptedAgent::planning(&["python"]).with_capability(python);
    agent.limits = ExecutionLimits { max_step_retries: 10_000, graph_recursion_limit: 40, ..ExecutionLimits::default() };
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    let nodes = result.nodes();
    let error = result.outcome.expect_err("runaway stopped");
    assert!(matches!(error, RunError::RecursionLimit { limit: 40, .. }), "{error}");
    assert!(error.to_string().contains("graph_recursion_limit"), "the message names the setting: {error}");
    assert_eq!(nodes.len(), 40);
}

#[tokio::test(start_paused = true)]
async fn the_wall_clock_limit_stops_a_slow_turn() {
    let slow = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::retriable("slow")))
        .with_policy(RetryPolicy::new(1_000, 2.0, 1.0));
    let mut agent = ScriptedAgent::planning(&["python"]).with_capability(slow);
    agent.limits = ExecutionLimits { max_step_retries: 1_000, max_execution_time_seconds: 5, ..ExecutionLimits::default() };
    let graph = agent.build(None).expect("graph");
    let started = tokio::time::Instant::now();
    let result = run(&graph, "t").await;
    let error = result.outcome.expect_err("out of time");
    assert!(matches!(error, RunError::TimeLimit { .. }), "{error}");
    assert!(error.to_string().contains("max_execution_time_seconds"), "{error}");
    assert_eq!(started.elapsed(), Duration::from_secs(5), "stopped exactly at the budget, during a backoff wait");
}

#[tokio::test(start_paused = true)]
async fn max_step_retries_caps_a_generous_policy() {
    let python =
        ScriptedCapability::new("python", |_, _| fail(ErrorClassification::retriable("busy"))).with_policy(RetryPolicy::new(50, 0.1, 1.0));
    let calls = python.calls();
    let mut agent = ScriptedAgent::planning(&["python"]).with_capability(python);
    agent.limits = ExecutionLimits { max_step_retries: 2, ..ExecutionLimits::default() };
    let graph = agent.build(None).expect("graph");
    let result = run(&graph, "t").await;
    assert_eq!(result.completed().1, Some("error"));
    assert_eq!(calls.count(), 3, "one execution plus max_step_retries = 2");
}

#[tokio::test(start_paused = true)]
async fn cancelling_during_backoff_keeps_the_checkpoint_and_the_run_continues() {
    let python = ScriptedCapability::new("python", |_, call| {
        if call == 1 { fail(ErrorClassification::retriable("busy")) } else { Ok(CapabilityOutcome::Done(AgentStateUpdate::default())) }
    })
    .with_policy(RetryPolicy::new(3, 30.0, 1.0));
    let calls = python.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(memory()).expect("graph");
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let options = RunOptions::with_events(sender);
    let cancel = options.cancel.clone();
    let running = tokio::spawn({
        let graph = graph.clone();
        async move { graph.run("t", turn("go"), options).await }
    });
    while let Some(event) = receiver.recv().await {
        if matches!(event, RunEvent::Waiting { .. }) {
            cancel.cancel();
            break;
        }
    }
    let outcome = running.await.expect("task").expect("cancelled, not failed");
    let RunOutcome::Cancelled { checkpoint_id, .. } = outcome else { panic!("expected cancellation, got {outcome:?}") };
    let kept = graph.get_state("t").await.expect("state").expect("thread");
    assert_eq!(Some(kept.meta.checkpoint_id), checkpoint_id);
    assert!(kept.state.control.has_error, "the failure stays recorded for the continuation");
    assert_eq!(kept.next.as_deref(), Some("python"));
    let continued = graph.continue_run("t", RunOptions::default()).await.expect("continues");
    assert!(matches!(continued, RunOutcome::Completed { ref last_node, .. } if last_node.as_deref() == Some("respond")));
    assert_eq!(calls.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn acceptance_case_17_capability_wrapper_bookkeeping() {
    let python = ScriptedCapability::new("python", |_, call| {
        if call == 1 {
            fail(ErrorClassification::retriable("kernel busy"))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate::default()))
        }
    })
    .with_policy(RetryPolicy::new(3, 0.5, 1.5));
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(memory()).expect("graph");
    run(&graph, "t").await.completed();
    let history = graph.history("t", peregrine_graph::ListQuery::default()).await.expect("history");
    let python_checkpoints: Vec<_> = history.iter().rev().filter(|meta| meta.node.as_deref() == Some("python")).collect();
    assert_eq!(python_checkpoints.len(), 2);

    let failed = graph.state_at("t", python_checkpoints[0].checkpoint_id).await.expect("failed step").state;
    assert_eq!(failed.planning.current_step_index, 0, "a failure does not advance the plan");
    assert!(failed.control.has_error);
    assert_eq!(failed.control.retry_count, 1, "previous count + 1");
    let info = failed.control.error_info.as_ref().expect("error info");
    assert_eq!((info.node.as_str(), info.classification.severity), ("python", ErrorSeverity::Retriable));
    assert_eq!(info.retry_policy, RetryPolicy::new(3, 0.5, 1.5));
    let record = failed.execution.step_results.iter().find(|record| record.key == "0_python").expect("failed step record");
    assert!(!record.success && record.error.as_deref() == Some("kernel busy"));

    let succeeded = graph.state_at("t", python_checkpoints[1].checkpoint_id).await.expect("successful step").state;
    assert_eq!(succeeded.planning.current_step_index, 1, "success advances the plan");
    assert!(!succeeded.control.has_error && succeeded.control.retry_count == 0 && succeeded.control.error_info.is_none());
    let record = succeeded.execution.step_results.iter().find(|record| record.key == "0_python").expect("step record, replaced");
    assert!(record.success);
    assert_eq!(succeeded.execution.step_results.iter().filter(|record| record.key == "0_python").count(), 1);
    let last = succeeded.execution.last_result.as_ref().expect("last result");
    assert!(last.success && last.capability == "python");
}

#[tokio::test(start_paused = true)]
async fn fatal_in_an_infrastructure_node_and_a_failing_error_node_both_abort() {
    let mut agent = ScriptedAgent::planning(&["python"]);
    agent.classifier = ScriptedInfra::new("classifier", |_, _| fail(ErrorClassification::fatal("registry is inconsistent")));
    let graph = agent.build(None).expect("graph");
    let error = run(&graph, "t").await.outcome.expect_err("FATAL in the classifier aborts");
    assert!(error.to_string().contains("FATAL error in 'classifier': registry is inconsistent"), "{error}");

    let python = ScriptedCapability::new("python", |_, _| fail(ErrorClassification::critical("broken")));
    let mut agent = ScriptedAgent::planning(&["python"]).with_capability(python);
    agent.error = ScriptedInfra::new("error", |_, _| fail(ErrorClassification::critical("cannot format the report")));
    let error_calls = agent.error.calls();
    let graph = agent.build(None).expect("graph");
    let error = run(&graph, "t").await.outcome.expect_err("a failing error node aborts");
    assert!(error.to_string().contains("error node itself failed"), "{error}");
    assert_eq!(error_calls.count(), 1, "the error node is not retried into a loop");
}

#[tokio::test(start_paused = true)]
async fn a_failing_respond_is_retried_instead_of_ending_the_turn() {
    let respond = ScriptedCapability::new("respond", |_, call| {
        if call == 1 {
            fail(ErrorClassification::retriable("LLM timeout"))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate::message(peregrine_core::Message::assistant("the answer"))))
        }
    });
    let calls = respond.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(respond).build(None).expect("graph");
    let result = run(&graph, "t").await;
    let (state, last_node) = result.completed();
    assert_eq!((last_node, calls.count()), (Some("respond"), 2));
    assert_eq!(state.messages.last().map(|m| m.content.as_str()), Some("the answer"));
}

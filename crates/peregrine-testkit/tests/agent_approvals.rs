//! Approvals in the agent graph: the answer reaches only the node that asked, exactly as asked
//! (bound to the payload's digest, not to anything a caller writes into state), is consumed
//! once, never leaks to the next node, and is marked as a redelivery when a cancelled run
//! continues. Also: direct chat with a capability that does not allow it falls back to normal
//! routing instead of looping.

#![allow(clippy::expect_used, reason = "test fixtures report setup failures by panicking")]

use std::sync::Arc;

use peregrine_core::{
    AgentState, AgentStateUpdate, ApprovalRequest, CapabilityOutcome, ExecutionPlan, Message, PlannedStep, Slot, TurnStart,
};
use peregrine_graph::{DynCheckpointer, Graph, Resume, RunError, RunOptions, RunOutcome};
use peregrine_testkit::{ScriptedAgent, ScriptedCapability, ScriptedInfra};
use serde_json::json;

fn turn(text: &str) -> AgentStateUpdate {
    AgentStateUpdate::new_turn(TurnStart::new(text, Default::default()))
}

fn memory() -> Option<Arc<dyn DynCheckpointer>> {
    Some(Arc::new(peregrine_checkpoint::MemoryCheckpointer::new()))
}

/// A `channel_write`-like capability: asks on its first call, acts on the next.
fn writer() -> ScriptedCapability {
    ScriptedCapability::new("channel_write", |_, call| {
        if call == 1 {
            Ok(CapabilityOutcome::NeedsApproval(ApprovalRequest {
                approval_type: "channel_write".into(),
                user_message: "⚠️ **HUMAN APPROVAL REQUIRED** write SR:MAG:QF1:SP = 20.0".into(),
                payload: json!({"operations": [{"channel_address": "SR:MAG:QF1:SP", "value": 20.0}]}),
            }))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant("written"))))
        }
    })
}

async fn ask(graph: &Graph<AgentState>, thread: &str) -> peregrine_graph::PendingInterrupt {
    let outcome = graph.run(thread, turn("set QF1 to 20 A"), RunOptions::default()).await.expect("runs");
    outcome.interrupt().cloned().expect("the write asks for approval")
}

#[tokio::test]
async fn the_capability_receives_exactly_what_was_approved_once() {
    let capability = writer();
    let approvals = capability.approvals();
    let graph = ScriptedAgent::planning(&["channel_write"]).with_capability(capability).build(memory()).expect("graph");
    let interrupt = ask(&graph, "t").await;
    assert_eq!(interrupt.payload["approval_type"], "channel_write");

    let done = graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), RunOptions::default()).await.expect("resumes");
    assert!(matches!(done, RunOutcome::Completed { .. }));
    let received = approvals.received();
    assert_eq!(received.len(), 2, "asked once, acted once");
    assert_eq!(received[0], None);
    let answer = received[1].clone().expect("the acting call carries the answer");
    assert!(answer.approves("channel_write") && !answer.is_redelivery());
    assert_eq!(answer.payload, json!({"operations": [{"channel_address": "SR:MAG:QF1:SP", "value": 20.0}]}));
    assert!(matches!(
        graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), RunOptions::default()).await,
        Err(RunError::NothingToResume { .. })
    ));
}

#[tokio::test]
async fn anything_but_an_explicit_approval_is_a_rejection() {
    for answer in [json!({"approved": false}), json!("yes please"), json!({"approve": true}), json!(null), json!(false)] {
        let capability = writer();
        let approvals = capability.approvals();
        let graph = ScriptedAgent::planning(&["channel_write"]).with_capability(capability).build(memory()).expect("graph");
        let interrupt = ask(&graph, "t").await;
        graph.resume("t", Resume::to(&interrupt, answer.clone()), RunOptions::default()).await.expect("resumes");
        let received = approvals.received();
        let delivered = received[1].clone().expect("the answer is delivered");
        assert!(!delivered.approved, "{answer} must not approve");
    }
    let capability = writer();
    let approvals = capability.approvals();
    let graph = ScriptedAgent::planning(&["channel_write"]).with_capability(capability).build(memory()).expect("graph");
    let interrupt = ask(&graph, "t").await;
    graph.resume("t", Resume::to(&interrupt, json!(true)), RunOptions::default()).await.expect("resumes");
    assert!(approvals.received()[1].as_ref().is_some_and(|answer| answer.approved), "a bare `true` approves");
}

#[tokio::test]
async fn an_approval_given_to_the_orchestrator_does_not_reach_the_next_capability() {
    let mut agent = ScriptedAgent::planning(&["channel_write"]);
    let steps = vec![
        PlannedStep { context_key: "w".into(), capability: "channel_write".into(), ..PlannedStep::generic_respond("t") },
        PlannedStep::generic_respond("t"),
    ];
    agent.orchestrator = ScriptedInfra::new("orchestrator", move |_, call| {
        if call == 1 {
            Ok(CapabilityOutcome::NeedsApproval(ApprovalRequest {
                approval_type: "orchestrator_plan".into(),
                user_message: "approve the plan".into(),
                payload: json!({"execution_plan": {"steps": ["channel_write", "respond"]}}),
            }))
        } else {
            Ok(CapabilityOutcome::Done(AgentStateUpdate {
                execution_plan: Slot::Set(Some(ExecutionPlan { steps: steps.clone() })),
                ..AgentStateUpdate::default()
            }))
        }
    });
    let capability = writer();
    let approvals = capability.approvals();
    let graph = agent.with_capability(capability).build(memory()).expect("graph");
    let plan_question = ask(&graph, "t").await;
    assert_eq!(plan_question.payload["approval_type"], "orchestrator_plan");
    let outcome = graph.resume("t", Resume::to(&plan_question, json!({"approved": true})), RunOptions::default()).await.expect("resumes");
    let write_question = outcome.interrupt().cloned().expect("the write asks for its own approval");
    assert_eq!(write_question.payload["approval_type"], "channel_write");
    assert_eq!(approvals.received(), vec![None], "the plan approval did not reach channel_write");
}

#[tokio::test]
async fn a_cancelled_approved_action_is_redelivered_and_a_new_run_must_wait_for_it() {
    let capability = ScriptedCapability::new("channel_write", move |_, call| match call {
        1 => Ok(CapabilityOutcome::NeedsApproval(ApprovalRequest {
            approval_type: "channel_write".into(),
            user_message: "approve".into(),
            payload: json!({"value": 1}),
        })),
        _ => Ok(CapabilityOutcome::Done(AgentStateUpdate::default())),
    });
    let approvals = capability.approvals();
    let graph = ScriptedAgent::planning(&["channel_write"]).with_capability(capability).build(memory()).expect("graph");
    let interrupt = ask(&graph, "t").await;

    // Cancelled right after the answer is recorded, before the node runs: the engine cannot
    // know how far a cancelled or crashed node got, so either way the answer is redelivered.
    let options = RunOptions::default();
    options.cancel.cancel();
    let cancelled = graph.resume("t", Resume::to(&interrupt, json!({"approved": true})), options).await.expect("cancelled, not failed");
    assert!(matches!(cancelled, RunOutcome::Cancelled { .. }));
    assert_eq!(approvals.received(), vec![None], "the node did not run yet");

    let refused = graph.run("t", turn("something else"), RunOptions::default()).await;
    assert!(matches!(refused, Err(RunError::PendingResume { ref node, .. }) if node == "channel_write"), "{refused:?}");

    let continued = graph.continue_run("t", RunOptions::default()).await.expect("continues");
    assert!(matches!(continued, RunOutcome::Completed { .. }));
    let received = approvals.received();
    assert_eq!(received.len(), 2);
    let answer = received[1].clone().expect("answer delivered after the cancellation");
    assert!(answer.approved && answer.delivery == 2 && answer.is_redelivery(), "{answer:?}");
}

#[tokio::test]
async fn direct_chat_with_a_capability_that_does_not_allow_it_routes_normally() {
    let python = ScriptedCapability::succeeding("python");
    let calls = python.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(python).build(None).expect("graph");
    let mut input = turn("run the script");
    input.session.insert("direct_chat_capability".into(), json!("python"));
    let outcome = graph.run("t", input, RunOptions::default()).await.expect("completes instead of looping");
    assert!(matches!(outcome, RunOutcome::Completed { ref last_node, .. } if last_node.as_deref() == Some("respond")));
    assert_eq!(calls.count(), 1, "the plan step ran once");

    let chat = ScriptedCapability::succeeding("state_manager").direct_chat();
    let chat_calls = chat.calls();
    let graph = ScriptedAgent::planning(&["python"]).with_capability(chat).build(None).expect("graph");
    let mut input = turn("what is in my context?");
    input.session.insert("direct_chat_capability".into(), json!("state_manager"));
    let outcome = graph.run("t", input, RunOptions::default()).await.expect("direct chat completes");
    assert!(matches!(outcome, RunOutcome::Completed { ref last_node, .. } if last_node.as_deref() == Some("state_manager")));
    assert_eq!(chat_calls.count(), 1);
}

//! Helpers for the unit tests of single nodes.

use peregrine_core::{AgentEvent, AgentState, CapabilityError, CapabilityOutcome};
use peregrine_graph::{NodeContext, RunEvent};

use crate::nodes::InfrastructureNode;

/// Runs `node` once outside any graph and returns its result with the domain events it emitted.
pub(crate) async fn run_node<N: InfrastructureNode>(
    node: &N,
    state: &AgentState,
) -> (Result<CapabilityOutcome, CapabilityError>, Vec<AgentEvent>) {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let ctx = NodeContext::standalone("thread", node.name()).with_events(sender);
    let result = node.execute(state, &ctx).await;
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        if let RunEvent::Custom(event) = event {
            events.push(event);
        }
    }
    (result, events)
}

//! The router edge: a pure function of the agent state that picks every next step. Error
//! recovery comes first (retry with backoff, re-plan, re-classify, report, abort), then the kill
//! switch and direct chat, then task extraction → classification → planning → plan steps.

use std::collections::HashSet;

use peregrine_core::plan::{CLARIFY, RESPOND};
use peregrine_core::{AgentState, ErrorSeverity, ExecutionLimits, Registry};
use peregrine_graph::Route;

/// Node name of task extraction.
pub const TASK_EXTRACTION: &str = "task_extraction";
/// Node name of the classifier.
pub const CLASSIFIER: &str = "classifier";
/// Node name of the orchestrator.
pub const ORCHESTRATOR: &str = "orchestrator";
/// Node name of the error node.
pub const ERROR: &str = "error";
/// Nodes whose success ends a turn.
pub const TERMINAL_NODES: [&str; 3] = [RESPOND, CLARIFY, ERROR];

/// What the router knows besides the state: limits and which capabilities exist.
#[derive(Debug, Clone, Default)]
pub struct RouterConfig {
    /// Execution limits.
    pub limits: ExecutionLimits,
    /// Registered capability names.
    pub capabilities: HashSet<String>,
    /// Capabilities that can be talked to directly (`/chat:<name>`).
    pub direct_chat: HashSet<String>,
    /// Infrastructure node names.
    pub infrastructure: HashSet<String>,
}

impl RouterConfig {
    /// The router configuration for a registry.
    pub fn new(registry: &Registry, limits: ExecutionLimits) -> Self {
        Self {
            limits,
            capabilities: registry.names().map(str::to_owned).collect(),
            direct_chat: registry.iter().filter(|c| c.spec().direct_chat_enabled).map(|c| c.spec().name.clone()).collect(),
            infrastructure: [TASK_EXTRACTION, CLASSIFIER, ORCHESTRATOR, ERROR].into_iter().map(str::to_owned).collect(),
        }
    }

    /// Whether the graph has a node of this name (a capability or an infrastructure node).
    pub fn has_node(&self, name: &str) -> bool {
        self.capabilities.contains(name) || self.infrastructure.contains(name)
    }
}

/// Decides the next node from the state.
pub fn route(state: &AgentState, config: &RouterConfig) -> Route {
    // A turn ends when respond, clarify or the error node has just succeeded; a failed one is
    // recovered like any other node (upstream ended the turn after them whatever happened).
    if state.execution.last_result.as_ref().is_some_and(|last| last.success && TERMINAL_NODES.contains(&last.capability.as_str())) {
        return Route::End;
    }
    if state.control.has_error {
        return route_error(state, config);
    }
    if state.control.is_killed {
        return Route::to(ERROR);
    }
    if let Some(capability) = state.direct_chat_capability()
        && config.direct_chat.contains(capability)
        && config.capabilities.contains(capability)
    {
        let already_answered = state.execution.last_result.as_ref().is_some_and(|last| last.capability == capability && last.success);
        return if already_answered { Route::End } else { Route::to(capability) };
    }
    if state.task.current_task.as_deref().is_none_or(str::is_empty) {
        return Route::to(TASK_EXTRACTION);
    }
    if state.planning.active_capabilities.is_empty() {
        return Route::to(CLASSIFIER);
    }
    let Some(plan) = &state.planning.execution_plan else { return Route::to(ORCHESTRATOR) };
    // An exhausted plan (it never reached respond or clarify) or a step naming an unknown
    // capability cannot go on: the error node reports it.
    let Some(step) = plan.steps.get(state.planning.current_step_index) else { return Route::to(ERROR) };
    if config.capabilities.contains(&step.capability) { Route::to(step.capability.clone()) } else { Route::to(ERROR) }
}

fn route_error(state: &AgentState, config: &RouterConfig) -> Route {
    let Some(info) = &state.control.error_info else { return Route::to(ERROR) };
    if info.node == ERROR {
        // Reporting failed: routing back to the error node could loop, so stop here.
        return Route::Abort(format!("the error node itself failed while reporting an error: {}", info.original_error));
    }
    let limits = &config.limits;
    match info.classification.severity {
        ErrorSeverity::Retriable if !config.has_node(&info.node) => Route::to(ERROR),
        ErrorSeverity::Retriable => {
            let failures = state.control.retry_count;
            if failures < limits.effective_attempts(&info.retry_policy) {
                Route::After { node: info.node.clone(), delay: info.retry_policy.delay_after(failures) }
            } else {
                Route::to(ERROR)
            }
        }
        ErrorSeverity::Replanning if state.control.planning_attempts < limits.max_planning_attempts => Route::to(ORCHESTRATOR),
        ErrorSeverity::Reclassification if state.control.reclassification_count < limits.max_reclassifications => Route::to(CLASSIFIER),
        ErrorSeverity::Replanning | ErrorSeverity::Reclassification | ErrorSeverity::Critical => Route::to(ERROR),
        ErrorSeverity::Fatal => Route::Abort(format!(
            "FATAL error in '{}': {}; execution terminated to protect system integrity",
            info.node,
            info.classification.user_message.as_deref().unwrap_or(&info.original_error)
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use peregrine_core::state::{LastResult, NodeKind};
    use peregrine_core::{ErrorClassification, ErrorInfo, ExecutionPlan, PlannedStep, RetryPolicy};

    use super::*;

    fn config() -> RouterConfig {
        let names = [
            "respond",
            "clarify",
            "memory",
            "time_range_parsing",
            "python",
            "channel_finding",
            "channel_read",
            "channel_write",
            "state_manager",
            "plain",
        ];
        RouterConfig {
            limits: ExecutionLimits::default(),
            capabilities: names.iter().map(|s| s.to_string()).collect(),
            direct_chat: ["state_manager"].iter().map(|s| s.to_string()).collect(),
            infrastructure: [TASK_EXTRACTION, CLASSIFIER, ORCHESTRATOR, ERROR].iter().map(|s| s.to_string()).collect(),
        }
    }

    fn step(capability: &str) -> PlannedStep {
        PlannedStep { capability: capability.into(), ..PlannedStep::generic_respond("t") }
    }

    fn planned(capabilities: &[&str], index: usize) -> AgentState {
        let mut state = AgentState::default();
        state.task.current_task = Some("task".into());
        state.planning.active_capabilities = vec!["respond".into()];
        state.planning.execution_plan = Some(ExecutionPlan { steps: capabilities.iter().map(|c| step(c)).collect() });
        state.planning.current_step_index = index;
        state
    }

    fn failed(node: &str, severity: ErrorSeverity, policy: RetryPolicy) -> AgentState {
        let mut state = planned(&["python", "respond"], 0);
        state.control.has_error = true;
        state.control.error_info = Some(ErrorInfo {
            node: node.into(),
            node_kind: NodeKind::Capability,
            classification: ErrorClassification::new(severity, "it broke"),
            retry_policy: policy,
            original_error: "boom".into(),
            execution_time_ms: 1,
            timestamp: Utc::now(),
        });
        state
    }

    #[test]
    fn acceptance_case_1_fresh_turn_routing() {
        let mut state = AgentState::default();
        assert_eq!(route(&state, &config()), Route::to(TASK_EXTRACTION));
        state.task.current_task = Some("t".into());
        assert_eq!(route(&state, &config()), Route::to(CLASSIFIER));
        state.planning.active_capabilities = vec!["respond".into()];
        assert_eq!(route(&state, &config()), Route::to(ORCHESTRATOR));
    }

    #[test]
    fn acceptance_case_2_plan_dispatch() {
        let table = [(0, "channel_finding"), (1, "channel_read"), (2, "respond")];
        for (index, expected) in table {
            assert_eq!(
                route(&planned(&["channel_finding", "channel_read", "respond"], index), &config()),
                Route::to(expected),
                "index {index}"
            );
        }
        assert_eq!(route(&planned(&["foo", "respond"], 0), &config()), Route::to(ERROR));
        assert_eq!(route(&planned(&["python"], 1), &config()), Route::to(ERROR), "an exhausted plan is reported");
        assert_eq!(route(&planned(&[], 0), &config()), Route::to(ERROR), "so is an empty one");
    }

    #[test]
    fn acceptance_case_3_retriable_retry_with_backoff() {
        let policy = RetryPolicy::new(3, 0.5, 1.5);
        let table = [(1, Some(500)), (2, Some(750)), (3, None)];
        for (retry_count, delay_ms) in table {
            let mut state = failed("python", ErrorSeverity::Retriable, policy);
            state.control.retry_count = retry_count;
            let expected = match delay_ms {
                Some(ms) => Route::After { node: "python".into(), delay: Duration::from_millis(ms) },
                None => Route::to(ERROR),
            };
            assert_eq!(route(&state, &config()), expected, "retry_count {retry_count}");
        }
    }

    #[test]
    fn a_retry_of_a_node_the_graph_does_not_have_is_reported() {
        let mut state = failed("retired_capability", ErrorSeverity::Retriable, RetryPolicy::default());
        state.control.retry_count = 1;
        assert_eq!(route(&state, &config()), Route::to(ERROR));
    }

    #[test]
    fn max_step_retries_caps_every_policy() {
        let mut state = failed("classifier", ErrorSeverity::Retriable, RetryPolicy::classifier());
        state.control.retry_count = 2;
        let mut strict = config();
        strict.limits.max_step_retries = 1;
        assert_eq!(route(&state, &strict), Route::to(ERROR));
        assert!(matches!(route(&state, &config()), Route::After { .. }));
    }

    #[test]
    fn acceptance_case_4_replanning() {
        let mut state = failed("python", ErrorSeverity::Replanning, RetryPolicy::default());
        state.control.planning_attempts = 1;
        assert_eq!(route(&state, &config()), Route::to(ORCHESTRATOR));
        state.control.planning_attempts = 2;
        assert_eq!(route(&state, &config()), Route::to(ERROR));
    }

    #[test]
    fn acceptance_case_5_reclassification() {
        let mut state = failed("python", ErrorSeverity::Reclassification, RetryPolicy::default());
        assert_eq!(route(&state, &config()), Route::to(CLASSIFIER));
        state.control.reclassification_count = 1;
        assert_eq!(route(&state, &config()), Route::to(ERROR));
    }

    #[test]
    fn acceptance_case_6_critical_fatal_and_unclassified() {
        let state = failed("python", ErrorSeverity::Critical, RetryPolicy::default());
        assert_eq!(route(&state, &config()), Route::to(ERROR));
        let state = failed("orchestrator", ErrorSeverity::Fatal, RetryPolicy::default());
        assert!(matches!(route(&state, &config()), Route::Abort(message) if message.contains("FATAL error in 'orchestrator': it broke")));
        let mut state = planned(&["respond"], 0);
        state.control.has_error = true;
        assert_eq!(route(&state, &config()), Route::to(ERROR));
    }

    #[test]
    fn a_failing_error_node_aborts_instead_of_looping() {
        for severity in [ErrorSeverity::Retriable, ErrorSeverity::Critical, ErrorSeverity::Replanning] {
            let state = failed(ERROR, severity, RetryPolicy::infrastructure_default());
            assert!(
                matches!(route(&state, &config()), Route::Abort(message) if message.contains("error node itself failed")),
                "{severity}"
            );
        }
    }

    #[test]
    fn a_turn_ends_when_a_terminal_node_succeeds_and_not_when_it_fails() {
        let now = Utc::now();
        for terminal in TERMINAL_NODES {
            let mut state = planned(&["respond"], 0);
            state.execution.last_result = Some(LastResult {
                capability: terminal.into(),
                success: true,
                execution_time_ms: 1,
                error: None,
                severity: None,
                timestamp: now,
            });
            assert_eq!(route(&state, &config()), Route::End, "{terminal}");
        }
        let mut state = failed("respond", ErrorSeverity::Retriable, RetryPolicy::capability_default());
        state.control.retry_count = 1;
        state.execution.last_result = Some(LastResult {
            capability: "respond".into(),
            success: false,
            execution_time_ms: 1,
            error: Some("x".into()),
            severity: Some(ErrorSeverity::Retriable),
            timestamp: now,
        });
        assert!(matches!(route(&state, &config()), Route::After { node, .. } if node == "respond"));
    }

    #[test]
    fn acceptance_case_7_kill_switch() {
        let mut state = planned(&["respond"], 0);
        state.control.is_killed = true;
        assert_eq!(route(&state, &config()), Route::to(ERROR));
    }

    #[test]
    fn direct_chat_routing() {
        let mut state = AgentState::default();
        state.session_state.insert("direct_chat_capability".into(), "state_manager".into());
        assert_eq!(route(&state, &config()), Route::to("state_manager"));
        state.execution.last_result = Some(LastResult {
            capability: "state_manager".into(),
            success: true,
            execution_time_ms: 1,
            error: None,
            severity: None,
            timestamp: Utc::now(),
        });
        assert_eq!(route(&state, &config()), Route::End);
        state.session_state.insert("direct_chat_capability".into(), "plain".into());
        assert_eq!(route(&state, &config()), Route::to(TASK_EXTRACTION), "not direct-chat enabled");
    }
}

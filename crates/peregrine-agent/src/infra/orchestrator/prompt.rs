//! The orchestrator's prompt builder (reference §1.10, §2.4 step 3): role and task, the step
//! format, planning guidelines, the chat history when the task depends on it, context-reuse
//! guidance, the last error when re-planning, a rejected plan, the context already stored
//! (from this and earlier turns), the capability guides sorted by priority, and the task.
//! Every section is a trait method with a default, so applications override only what they
//! need.
//!
//! Both sections that grow with the thread are bounded: the history shows the most recent
//! messages within the history budget, and AVAILABLE CONTEXT lists at most
//! [`MAX_AVAILABLE_CONTEXT`] entries, each with a note saying how much was left out.

use peregrine_core::{
    AgentState, CapabilitySpec, ContextEntry, ErrorClassification, ExecutionPlan, InputRef, Message, OrchestratorExample, PlannedStep,
};
use serde_json::Value;

use crate::history::{HistoryWindow, speaker};

/// At most this many stored context entries are listed under AVAILABLE CONTEXT.
pub const MAX_AVAILABLE_CONTEXT: usize = 40;

/// What the planning prompt is built from.
pub struct PlanningPromptInput<'a> {
    /// The task to plan.
    pub task: &'a str,
    /// The whole state (history, dependency flags, stored context, last error).
    pub state: &'a AgentState,
    /// The active capabilities, sorted by orchestrator-guide priority.
    pub capabilities: &'a [&'a CapabilitySpec],
    /// The last error when the orchestrator runs to re-plan.
    pub error: Option<&'a ErrorClassification>,
    /// A plan the user just rejected; the new plan must differ.
    pub rejected_plan: Option<&'a ExecutionPlan>,
    /// What the user said when rejecting it ("no, use Oslo"), if more than a no.
    pub rejection_feedback: Option<&'a str>,
    /// The chat-history budget in characters (`AgentSettings::prompt_history_chars`).
    pub history_chars: usize,
}

/// Builds the orchestrator's planning prompt; override any section.
pub trait OrchestratorPrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "You are an expert execution planner for the assistant system.".into()
    }

    /// What it must produce.
    fn task_definition(&self) -> String {
        "TASK: Create a detailed execution plan that breaks down the user's request into specific, actionable steps.".into()
    }

    /// The meaning of each `PlannedStep` field.
    fn step_format(&self) -> String {
        r#"Each step must follow the PlannedStep structure:
- context_key: Unique identifier for this step's output (e.g., "data_sources", "historical_data")
- capability: Type of execution node (one of the available capabilities below)
- task_objective: Complete, self-sufficient description of what this step must accomplish
- expected_output: Context type key (e.g., "HISTORICAL_DATA", "SYSTEM_STATUS")
- success_criteria: Clear criteria for determining step success
- inputs: List of input objects mapping context types to context keys:
  [
    {"DATA_QUERY_RESULTS": "some_data_context"},
    {"ANALYSIS_RESULTS": "some_analysis_context"}
  ]
  **CRITICAL**: Include ALL required context sources! Complex operations often need multiple inputs.
- parameters: Optional object for step-specific configuration (e.g., {"precision_ms": 1000, "location": "San Francisco"})
  **IMPORTANT**: Parameter values MUST be simple types (string, number, or boolean) - NOT lists or nested objects"#
            .into()
    }

    /// How to plan.
    fn planning_guidelines(&self) -> String {
        r#"Planning Guidelines:
1. Dependencies between steps (ensure proper sequencing: a step can only read context that exists already or that an earlier step produces)
2. Cost optimization (avoid unnecessary expensive operations)
3. Clear success criteria for each step
4. Proper input/output schema definitions
5. Always reference available context using exact keys shown in context information
6. **CRITICAL**: End plans with either "respond" or "clarify" step to ensure user gets feedback

The execution plan is an ExecutionPlan object containing a list of PlannedStep objects.

Focus on being practical and efficient while ensuring robust execution.
Be factual and realistic about what can be accomplished.
Never plan for simulated or fictional data - only real system operations."#
            .into()
    }

    /// The conversation so far, for tasks that build on it: the most recent messages within
    /// `history_chars` characters, after a `(N earlier messages omitted)` line when some were
    /// left out.
    fn chat_history(&self, messages: &[Message], history_chars: usize) -> String {
        let heavy = "═".repeat(60);
        let light = "─".repeat(60);
        let window = HistoryWindow::select(messages, history_chars, &format!("\n{light}\n"), |_, message| {
            format!("{}: {}", speaker(message.role), message.content)
        });
        format!("**CONVERSATION HISTORY:**\n{heavy}\n{}\n{heavy}", window.render())
    }

    /// Guidance to reuse what earlier turns produced, when the task depends on them.
    fn context_reuse_guidance(&self, depends_on_chat_history: bool, depends_on_user_memory: bool) -> String {
        let mut parts = Vec::new();
        if depends_on_chat_history {
            parts.push(
                "• **PRIORITIZE CONTEXT REUSE**: This task builds on previous conversation context. \
                 Look for existing context data that can be reused instead of recreating it.",
            );
        }
        if depends_on_user_memory {
            parts.push(
                "• **LEVERAGE USER MEMORY**: This task depends on user memory information. \
                 Check for existing memory context before planning new retrieval steps.",
            );
        }
        parts.push(
            "• **EFFICIENCY FIRST**: Avoid redundant context creation when suitable data already exists. \
             Reference existing context keys in your step inputs.",
        );
        format!("**CONTEXT REUSE GUIDANCE:**\n{}", parts.join("\n"))
    }

    /// The error that made the previous plan fail.
    fn replanning_context(&self, classification: &ErrorClassification) -> String {
        format!(
            "**REPLANNING CONTEXT:**\n\n\
             The previous execution failed and needs replanning. Consider this error information when creating the new plan:\n\n\
             {}\n\n\
             **Replanning Guidelines:**\n\
             - Analyze the error context to understand why the previous approach failed\n\
             - Consider alternative capabilities or different sequencing to avoid the same issue\n\
             - If required context is missing, include clarification steps to gather needed information\n\
             - Learn from the technical details and suggestions provided in the error context\n\
             - Adapt the execution strategy based on the specific failure mode identified",
            classification.format_for_llm()
        )
    }

    /// A plan the user rejected, so the new one differs.
    fn rejected_plan(&self, plan: &ExecutionPlan, feedback: Option<&str>) -> String {
        let said = feedback
            .map(|feedback| format!("\n\nThe user said when rejecting it: \"{feedback}\"\nFollow what they asked for."))
            .unwrap_or_default();
        format!(
            "**PREVIOUS PLAN REJECTED:**\n\
             The user reviewed and rejected this execution plan for the same task:\n\n{}{said}\n\n\
             Create a different plan: change the steps, their order or their objectives so that it no longer matches the rejected one. \
             If it is unclear what the user wants instead, plan a single \"clarify\" step.",
            numbered_steps(plan)
        )
    }

    /// The context already stored, one `{"TYPE": "key"}: "<objective>"` line per entry, at
    /// most [`MAX_AVAILABLE_CONTEXT`] of them (see [`listed_context`]) with a line saying how
    /// many older ones are not listed; `None` when nothing is stored.
    fn available_context(&self, state: &AgentState) -> Option<String> {
        let (listed, left_out) = listed_context(state, MAX_AVAILABLE_CONTEXT);
        if listed.is_empty() {
            return None;
        }
        let mut lines: Vec<String> = listed
            .iter()
            .map(|(reference, entry)| {
                let objective = entry.meta.task_objective.as_deref().filter(|text| !text.trim().is_empty()).unwrap_or("(no description)");
                format!("{reference}: {}", Value::String(objective.to_owned()))
            })
            .collect();
        if left_out > 0 {
            let entries = if left_out == 1 { "entry is" } else { "entries are" };
            lines.push(format!("({left_out} older context {entries} not listed.)"));
        }
        Some(format!(
            "**AVAILABLE CONTEXT:**\n\
             The following context data is already available (from this and earlier turns) for use in your execution plan. \
             Reference it in step inputs exactly as shown:\n\n{}\n\n\
             **CONTEXT REUSE PRINCIPLE:** If the data a step would produce is already available above, do not plan a step to \
             produce it again; reference the existing context key in the inputs of the steps that need it.",
            lines.join("\n")
        ))
    }

    /// The planning guide of each capability, in the order given (sorted by priority); `None`
    /// when no capability has one.
    fn capability_guides(&self, capabilities: &[&CapabilitySpec]) -> Option<String> {
        let sections: Vec<String> = capabilities
            .iter()
            .filter_map(|spec| {
                let guide = spec.orchestrator_guide.as_ref().filter(|guide| !guide.instructions.trim().is_empty())?;
                let mut section = format!("## {}\n{}", spec.name, guide.instructions.trim_end());
                if !guide.examples.is_empty() {
                    section.push_str("\n\n");
                    section.push_str(&format_examples(&guide.examples));
                }
                Some(section)
            })
            .collect();
        if sections.is_empty() {
            return None;
        }
        Some(format!("# CAPABILITY PLANNING GUIDELINES\n\n{}", sections.join("\n\n")))
    }

    /// The whole prompt: sections joined by blank lines, ending with `TASK TO PLAN: <task>`.
    /// The history gets `input.history_chars` characters at most.
    fn planning_prompt(&self, input: &PlanningPromptInput<'_>) -> String {
        let task_state = &input.state.task;
        let mut sections = vec![self.role(), self.task_definition(), self.step_format(), self.planning_guidelines()];
        if task_state.depends_on_chat_history && !input.state.messages.is_empty() {
            sections.push(self.chat_history(&input.state.messages, input.history_chars));
        }
        if task_state.depends_on_chat_history || task_state.depends_on_user_memory {
            sections.push(self.context_reuse_guidance(task_state.depends_on_chat_history, task_state.depends_on_user_memory));
        }
        if let Some(error) = input.error {
            sections.push(self.replanning_context(error));
        }
        if let Some(plan) = input.rejected_plan {
            sections.push(self.rejected_plan(plan, input.rejection_feedback));
        }
        sections.extend(self.available_context(input.state));
        sections.extend(self.capability_guides(input.capabilities));
        sections.push(format!("TASK TO PLAN: {}", input.task));
        sections.join("\n\n")
    }
}

/// The framework's default prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultOrchestratorPrompts;

impl OrchestratorPrompts for DefaultOrchestratorPrompts {}

/// The stored entries the planner is shown, in the store's order, and how many were left out.
/// The store keeps no insertion time, so recency is approximated: entries this turn's steps
/// produced (successful step records) come first, then the last entries in the store's order,
/// up to `limit` in all.
pub fn listed_context(state: &AgentState, limit: usize) -> (Vec<(InputRef, &ContextEntry)>, usize) {
    let store = &state.capability_context_data;
    let all: Vec<(InputRef, &ContextEntry)> = store.iter().collect();
    if all.len() <= limit {
        return (all, 0);
    }
    let this_turn = |reference: &InputRef| state.execution.step_results.iter().any(|record| record.success && record.key == reference.key);
    let mut keep = vec![false; all.len()];
    let mut kept = 0;
    for (index, (reference, _)) in all.iter().enumerate().rev() {
        if kept < limit && this_turn(reference) {
            keep[index] = true;
            kept += 1;
        }
    }
    for index in (0..all.len()).rev() {
        if kept < limit && !keep[index] {
            keep[index] = true;
            kept += 1;
        }
    }
    let left_out = all.len() - kept;
    let listed = all.into_iter().zip(keep).filter_map(|(entry, keep)| keep.then_some(entry)).collect();
    (listed, left_out)
}

/// `1. capability → context_key: objective (inputs …)`, one line per step.
pub fn numbered_steps(plan: &ExecutionPlan) -> String {
    plan.steps
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let mut line = format!("{}. **{}** → `{}`: {}", index + 1, step.capability, step.context_key, step.task_objective);
            if !step.inputs.is_empty() {
                let inputs: Vec<String> = step.inputs.iter().map(ToString::to_string).collect();
                line.push_str(&format!(" (inputs: {})", inputs.join(", ")));
            }
            // Everything that steers the step is shown: an approval covers exactly this.
            if let Some(parameters) = step.parameters.as_ref().filter(|parameters| !parameters.is_empty()) {
                line.push_str(&format!("\n   parameters: `{}`", serde_json::Value::Object(parameters.clone())));
            }
            if let Some(expected) = step.expected_output.as_deref().filter(|expected| !expected.trim().is_empty()) {
                line.push_str(&format!("\n   expected output: {expected}"));
            }
            if !step.success_criteria.trim().is_empty() {
                line.push_str(&format!("\n   success criteria: {}", step.success_criteria));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Examples numbered `**Example N:**`, each as upstream's `PlannedStep(field=value, …)`.
pub fn format_examples(examples: &[OrchestratorExample]) -> String {
    examples
        .iter()
        .enumerate()
        .map(|(index, example)| format!("**Example {}:**\n{}", index + 1, format_example(example)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One example: scenario, context requirements, the step, notes.
pub fn format_example(example: &OrchestratorExample) -> String {
    let mut text = format!("**{}**\n", example.scenario_description);
    if let Some(requirements) = example.context_requirements.as_deref().filter(|text| !text.trim().is_empty()) {
        text.push_str(&format!("   - Context requirements: {requirements}\n"));
    }
    text.push_str(&format_planned_step(&example.step));
    if let Some(notes) = example.notes.as_deref().filter(|text| !text.trim().is_empty()) {
        text.push_str(&format!("   - Note: {notes}\n"));
    }
    text
}

/// `PlannedStep(\n       field=value,\n …)` with empty fields left out; strings quoted as JSON.
pub fn format_planned_step(step: &PlannedStep) -> String {
    let quoted = |text: &str| Value::String(text.to_owned()).to_string();
    let mut fields = vec![
        format!("context_key={}", quoted(&step.context_key)),
        format!("capability={}", quoted(&step.capability)),
        format!("task_objective={}", quoted(&step.task_objective)),
    ];
    if !step.success_criteria.is_empty() {
        fields.push(format!("success_criteria={}", quoted(&step.success_criteria)));
    }
    if let Some(expected) = step.expected_output.as_deref() {
        fields.push(format!("expected_output={}", quoted(expected)));
    }
    if let Some(parameters) = step.parameters.as_ref().filter(|parameters| !parameters.is_empty()) {
        fields.push(format!("parameters={}", Value::Object(parameters.clone())));
    }
    if !step.inputs.is_empty() {
        let inputs: Vec<String> = step.inputs.iter().map(ToString::to_string).collect();
        fields.push(format!("inputs=[{}]", inputs.join(", ")));
    }
    let body: Vec<String> = fields.into_iter().map(|field| format!("       {field}")).collect();
    format!("   PlannedStep(\n{}\n   )\n", body.join(",\n"))
}

#[cfg(test)]
mod tests {
    use crate::history::DEFAULT_PROMPT_HISTORY_CHARS;
    use chrono::Utc;
    use peregrine_core::ContextEntry;
    use peregrine_core::state::StepRecord;
    use serde_json::json;

    use super::*;

    fn prompt_for(state: &AgentState) -> String {
        let input = PlanningPromptInput {
            task: "Plot it",
            state,
            capabilities: &[],
            error: None,
            rejected_plan: None,
            rejection_feedback: None,
            history_chars: DEFAULT_PROMPT_HISTORY_CHARS,
        };
        DefaultOrchestratorPrompts.planning_prompt(&input)
    }

    fn store_entries(state: &mut AgentState, count: usize) {
        for index in 0..count {
            let entry = ContextEntry::new(json!({"value": index}), Some(format!("objective {index:02}")));
            state.capability_context_data.insert("PV_VALUES", format!("values_{index:02}"), entry);
        }
    }

    #[test]
    fn a_long_history_keeps_the_recent_messages_and_counts_the_rest() {
        let mut state = AgentState::default();
        state.task.depends_on_chat_history = true;
        for index in 0..400 {
            state.messages.push(Message::user(format!("question {index:03} {}", "q".repeat(100))));
            state.messages.push(Message::assistant(format!("answer {index:03} {}", "a".repeat(100))));
        }
        state.messages.push(Message::user("and plot the last one"));
        let prompt = prompt_for(&state);
        let history = prompt.split("**CONVERSATION HISTORY:**").nth(1).expect("a history section");
        assert!(history.chars().count() < DEFAULT_PROMPT_HISTORY_CHARS + 2_000, "bounded: {} characters", history.chars().count());
        assert!(!prompt.contains("question 000"));
        assert!(prompt.contains("answer 399"));
        assert!(prompt.contains(&format!("{}\nUser: and plot the last one\n{}", "─".repeat(60), "═".repeat(60))));
        let body = history.split(&"═".repeat(60)).nth(1).expect("the framed history").trim_matches('\n');
        let (note, shown) = body.split_once('\n').expect("a note line");
        let omitted: usize = note
            .strip_prefix('(')
            .and_then(|rest| rest.strip_suffix(" earlier messages omitted)"))
            .and_then(|n| n.parse().ok())
            .expect("a count");
        assert_eq!(omitted + shown.split(&format!("\n{}\n", "─".repeat(60))).count(), 801, "every message is shown or counted");
    }

    #[test]
    fn the_history_section_honours_its_budget_and_separator() {
        let messages = vec![Message::user("first"), Message::assistant("second"), Message::user("third")];
        let light = "─".repeat(60);
        let heavy = "═".repeat(60);
        assert_eq!(
            DefaultOrchestratorPrompts.chat_history(&messages, 1_000),
            format!("**CONVERSATION HISTORY:**\n{heavy}\nUser: first\n{light}\nAssistant: second\n{light}\nUser: third\n{heavy}")
        );
        // "User: third" is 11 characters; the 62-character separator keeps "Assistant: second" out.
        assert_eq!(
            DefaultOrchestratorPrompts.chat_history(&messages, 60),
            format!("**CONVERSATION HISTORY:**\n{heavy}\n(2 earlier messages omitted)\nUser: third\n{heavy}")
        );
    }

    #[test]
    fn available_context_lists_at_most_forty_entries() {
        let mut state = AgentState::default();
        store_entries(&mut state, 40);
        let prompt = prompt_for(&state);
        assert!(prompt.contains(r#"{"PV_VALUES": "values_00"}: "objective 00""#));
        assert!(prompt.contains(r#"{"PV_VALUES": "values_39"}: "objective 39""#));
        assert!(!prompt.contains("not listed"));

        store_entries(&mut state, 52);
        let prompt = prompt_for(&state);
        let listed = prompt.lines().filter(|line| line.starts_with(r#"{"PV_VALUES": "#)).count();
        assert_eq!(listed, MAX_AVAILABLE_CONTEXT);
        assert!(prompt.contains(r#""values_51"}"#) && prompt.contains(r#""values_12"}"#), "the last in the store's order");
        assert!(!prompt.contains(r#""values_11"}"#));
        assert!(prompt.contains("(12 older context entries are not listed.)"), "{prompt}");
    }

    #[test]
    fn entries_this_turn_produced_are_always_listed() {
        let mut state = AgentState::default();
        store_entries(&mut state, 45);
        state.execution.step_results.push(StepRecord {
            key: "values_02".into(),
            step_index: 0,
            capability: "channel_read".into(),
            task_objective: "read".into(),
            success: true,
            execution_time_ms: 1,
            timestamp: Utc::now(),
            error: None,
        });
        let (listed, left_out) = listed_context(&state, MAX_AVAILABLE_CONTEXT);
        assert_eq!((listed.len(), left_out), (40, 5));
        let keys: Vec<&str> = listed.iter().map(|(reference, _)| reference.key.as_str()).collect();
        assert_eq!(keys[0], "values_02", "this turn's output first in the store's order");
        assert_eq!(keys[1], "values_06");
        assert_eq!(keys.last().copied(), Some("values_44"));
        assert!(prompt_for(&state).contains("(5 older context entries are not listed.)"));
        assert_eq!(listed_context(&AgentState::default(), 40).0.len(), 0);
        assert!(prompt_for(&AgentState::default()).find("AVAILABLE CONTEXT").is_none());
    }
}

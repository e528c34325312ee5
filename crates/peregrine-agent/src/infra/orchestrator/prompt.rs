//! The orchestrator's prompt builder (reference §1.10, §2.4 step 3): role and task, the step
//! format, planning guidelines, the chat history when the task depends on it, context-reuse
//! guidance, the last error when re-planning, a rejected plan, the context already stored
//! (from this and earlier turns), the capability guides sorted by priority, and the task.
//! Every section is a trait method with a default, so applications override only what they
//! need.

use peregrine_core::state::Role;
use peregrine_core::{
    AgentState, CapabilitySpec, ContextStore, ErrorClassification, ExecutionPlan, Message, OrchestratorExample, PlannedStep,
};
use serde_json::Value;

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

    /// The conversation so far, for tasks that build on it.
    fn chat_history(&self, messages: &[Message]) -> String {
        let heavy = "═".repeat(60);
        let light = "─".repeat(60);
        let turns: Vec<String> = messages
            .iter()
            .map(|message| {
                let speaker = match message.role {
                    Role::User => "User",
                    Role::Assistant => "Assistant",
                    Role::System => "System",
                };
                format!("{speaker}: {}", message.content)
            })
            .collect();
        format!("**CONVERSATION HISTORY:**\n{heavy}\n{}\n{heavy}", turns.join(&format!("\n{light}\n")))
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
    fn rejected_plan(&self, plan: &ExecutionPlan) -> String {
        format!(
            "**PREVIOUS PLAN REJECTED:**\n\
             The user reviewed and rejected this execution plan for the same task:\n\n{}\n\n\
             Create a different plan: change the steps, their order or their objectives so that it no longer matches the rejected one. \
             If it is unclear what the user wants instead, plan a single \"clarify\" step.",
            numbered_steps(plan)
        )
    }

    /// The context already stored, one `{"TYPE": "key"}: "<objective>"` line per entry; `None`
    /// when nothing is stored.
    fn available_context(&self, context: &ContextStore) -> Option<String> {
        if context.is_empty() {
            return None;
        }
        let lines: Vec<String> = context
            .iter()
            .map(|(reference, entry)| {
                let objective = entry.meta.task_objective.as_deref().filter(|text| !text.trim().is_empty()).unwrap_or("(no description)");
                format!("{reference}: {}", Value::String(objective.to_owned()))
            })
            .collect();
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
    fn planning_prompt(&self, input: &PlanningPromptInput<'_>) -> String {
        let task_state = &input.state.task;
        let mut sections = vec![self.role(), self.task_definition(), self.step_format(), self.planning_guidelines()];
        if task_state.depends_on_chat_history && !input.state.messages.is_empty() {
            sections.push(self.chat_history(&input.state.messages));
        }
        if task_state.depends_on_chat_history || task_state.depends_on_user_memory {
            sections.push(self.context_reuse_guidance(task_state.depends_on_chat_history, task_state.depends_on_user_memory));
        }
        if let Some(error) = input.error {
            sections.push(self.replanning_context(error));
        }
        if let Some(plan) = input.rejected_plan {
            sections.push(self.rejected_plan(plan));
        }
        sections.extend(self.available_context(&input.state.capability_context_data));
        sections.extend(self.capability_guides(input.capabilities));
        sections.push(format!("TASK TO PLAN: {}", input.task));
        sections.join("\n\n")
    }
}

/// The framework's default prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultOrchestratorPrompts;

impl OrchestratorPrompts for DefaultOrchestratorPrompts {}

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

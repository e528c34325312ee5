//! The memory capability's prompts and guides: the classifier and orchestrator guides, the
//! save-or-retrieve classification prompt and the content-extraction prompt. Applications
//! override any of them by implementing [`MemoryPrompts`].

use peregrine_core::{ClassifierExample, ClassifierGuide, OrchestratorExample, OrchestratorGuide, PlannedStep};
use peregrine_llm::ChatMessage;

/// What the content-extraction prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct ExtractionRequest<'a> {
    /// The step objective.
    pub task_objective: &'a str,
    /// The recent conversation within the history budget (`AgentSettings::prompt_history_chars`),
    /// one message per line block (`User: …`, `Assistant: …`), after a
    /// `(N earlier messages omitted)` line when earlier messages were left out.
    pub chat_history: &'a str,
    /// Summaries of the step's inputs, one `- {TYPE: key}: summary` line each; empty if none.
    pub step_inputs: &'a str,
}

/// The memory capability's prompts; every method has upstream's default.
pub trait MemoryPrompts: Send + Sync + 'static {
    /// When the classifier selects `memory`.
    fn classifier_guide(&self) -> ClassifierGuide {
        default_classifier_guide()
    }

    /// How the orchestrator plans `memory` steps.
    fn orchestrator_guide(&self) -> OrchestratorGuide {
        default_orchestrator_guide()
    }

    /// The `MemoryOperationClassification` call: save or retrieve.
    fn operation_messages(&self, task_objective: &str) -> Vec<ChatMessage> {
        default_operation_messages(task_objective)
    }

    /// The `MemoryContentExtraction` call: what exactly to save.
    fn extraction_messages(&self, request: &ExtractionRequest<'_>) -> Vec<ChatMessage> {
        default_extraction_messages(request)
    }
}

/// Upstream's prompts, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultMemoryPrompts;

impl MemoryPrompts for DefaultMemoryPrompts {}

fn example(query: &str, result: bool, reason: &str) -> ClassifierExample {
    ClassifierExample { query: query.into(), result, reason: reason.into() }
}

/// The default classifier guide: explicit save/remember/recall requests only.
pub fn default_classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the task involves saving content to the user's memory or retrieving content from it. \
                       Only explicit memory requests count (save, store, remember, show my saved notes)."
            .into(),
        examples: vec![
            example(
                "Save this finding to my memory: the injector is most stable after a 15 minute warm-up",
                true,
                "Direct memory save request with specific content to preserve",
            ),
            example("Remember that BPM 3 in sector 1 reads 20 µm high", true, "Memory save request using the 'remember' keyword"),
            example("What do I have saved in my memory about orbit corrections?", true, "Memory retrieval request"),
            example("Show me my saved notes", true, "Memory retrieval request for displaying saved content"),
            example("What is the current beam current?", false, "A live data request, not a memory operation"),
            example("Remind me how the RF system works", false, "A general knowledge question, not the user's saved memory"),
        ],
        actions_if_true: None,
    }
}

fn planned(context_key: &str, objective: &str, criteria: &str) -> PlannedStep {
    PlannedStep {
        context_key: context_key.into(),
        capability: super::MEMORY_CAPABILITY.into(),
        task_objective: objective.into(),
        success_criteria: criteria.into(),
        expected_output: Some(super::MEMORY_CONTEXT.into()),
        parameters: None,
        inputs: Vec::new(),
    }
}

/// The default orchestrator guide (priority 10: specialized, printed late).
pub fn default_orchestrator_guide() -> OrchestratorGuide {
    OrchestratorGuide {
        instructions: "**When to plan \"memory\" steps:**\n\
            - When the user explicitly asks to save, store or remember something for later\n\
            - When the user asks to show, display or recall their saved memory\n\n\
            Only plan this step for explicit memory requests; it is not general context storage.\n\
            A save asks the user for approval before anything is written (when approvals are on).\n\n\
            **Step Structure:**\n\
            - context_key: a unique identifier, e.g. \"memory_save\" or \"memory_display\"\n\
            - task_objective: the memory operation, with the content to save when there is one\n\n\
            **Output: MEMORY_CONTEXT**\n\
            - save: the saved content and its timestamp, for the respond step to confirm\n\
            - retrieve: every saved entry, for the respond step to present"
            .into(),
        examples: vec![
            OrchestratorExample {
                step: planned(
                    "memory_save",
                    "Save the finding that the injector is most stable after a 15 minute warm-up to memory",
                    "Memory entry saved",
                ),
                scenario_description: "Saving important information to the user's memory".into(),
                context_requirements: None,
                notes: Some("The saved content comes back as MEMORY_CONTEXT for the response to confirm.".into()),
            },
            OrchestratorExample {
                step: planned("memory_display", "Show all my saved memory entries", "Memory content retrieved"),
                scenario_description: "Displaying stored memory content".into(),
                context_requirements: None,
                notes: Some("Retrieves every entry as MEMORY_CONTEXT; follow with a respond step.".into()),
            },
        ],
        priority: 10,
    }
}

/// The default save-or-retrieve classification prompt.
pub fn default_operation_messages(task_objective: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::system(
            "You are a memory operation classifier. Decide whether the task asks to:\n\
             - save: store new information in memory (save, store, remember, record, add, note down)\n\
             - retrieve: show existing memories (show, display, view, retrieve, list, what did I save)\n\n\
             Focus on the user's intent, not on individual words. Answer with operation \"save\" or \"retrieve\" \
             and a one-sentence reasoning.",
        ),
        ChatMessage::user(format!("Task: {task_objective}")),
    ]
}

const EXTRACTION_EXAMPLES: &str = r#"1. Chat history:
  User: Please save this finding: "Orbit drifts by 5 µm when the tunnel warms by 1 °C"
Expected output: {"content": "Orbit drifts by 5 µm when the tunnel warms by 1 °C", "found": true, "explanation": "Explicit request to save a quoted finding"}

2. Chat history:
  User: Today's trip was caused by an RF fault, but don't save that. Do remember that the klystron needs 10 minutes to recover after a trip.
Expected output: {"content": "The klystron needs 10 minutes to recover after a trip", "found": true, "explanation": "Saves only the part the user asked to remember"}

3. Chat history:
  User: How do I configure the archiver retention?
Expected output: {"content": "", "found": false, "explanation": "A question, not content to remember"}"#;

/// The default content-extraction prompt.
pub fn default_extraction_messages(request: &ExtractionRequest<'_>) -> Vec<ChatMessage> {
    let system = format!(
        "You are an expert content extraction assistant. Identify the content the user wants saved to their memory.\n\n\
         INSTRUCTIONS:\n\
         1. Find the content the user explicitly wants saved (\"save this:\", \"remember that …\", \"store … in my memory\", quoted text to save).\n\
         2. Extract the CONTENT itself, without the instruction (drop \"save this:\", \"remember that\", surrounding quotes).\n\
         3. Content may come from earlier results listed under step inputs when the user asks to save them.\n\
         4. Never extract questions, commands or small talk. If nothing is clearly meant to be saved, set found=false and content=\"\".\n\
         5. Explain your decision briefly.\n\n\
         EXAMPLES:\n{EXTRACTION_EXAMPLES}"
    );
    let mut user = format!("Task: {}\n\nChat history:\n{}", request.task_objective, request.chat_history);
    if !request.step_inputs.is_empty() {
        user.push_str(&format!("\n\nStep inputs (results of earlier steps):\n{}", request.step_inputs));
    }
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

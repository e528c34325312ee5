//! The response-generation prompt (reference §1.10, §2.7): what respond gathered
//! ([`ResponseContext`]), the overridable [`ResponsePrompts`] builder with upstream's sections
//! (CURRENT TASK, CONVERSATION HISTORY, RETRIEVED DATA or EXECUTION SUMMARY, SYSTEM
//! CAPABILITIES, numbered GUIDELINES) and respond's orchestrator guide.

use peregrine_core::plan::RESPOND;
use peregrine_core::state::{Artifact, StepRecord};
use peregrine_core::{InputRef, Message, OrchestratorExample, OrchestratorGuide, PlannedStep};
use serde_json::Value;

use crate::history::format_dialogue;

/// How respond answers, decided from the step's inputs and the context store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMode {
    /// No step inputs and no stored context: a conversational answer with the capabilities
    /// overview and no execution history.
    Conversational,
    /// The step names its inputs: answer from their summaries.
    SpecificContext,
    /// Context exists but the step names none: answer from the execution history.
    GeneralContext,
}

/// The interface the conversation runs in (session key `interface`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interface {
    /// Open WebUI: artifacts are rendered below the answer.
    OpenWebUi,
    /// The terminal: artifacts are files on disk.
    Cli,
    /// Anything else (API clients): no assumption about rendering.
    Other,
}

impl Interface {
    /// The interface named by the session (`openwebui`, `cli`; anything else is `Other`).
    pub fn from_name(name: Option<&str>) -> Self {
        match name.map(str::to_ascii_lowercase).as_deref() {
            Some("openwebui") => Self::OpenWebUi,
            Some("cli") => Self::Cli,
            _ => Self::Other,
        }
    }
}

/// What the turn produced for the interface to show, by kind; each entry is the artifact's
/// location (path or URL) or, failing that, its name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArtifactSummary {
    /// Images and HTML figures.
    pub figures: Vec<String>,
    /// Jupyter notebooks.
    pub notebooks: Vec<String>,
    /// Launchable commands.
    pub commands: Vec<String>,
    /// Other files.
    pub files: Vec<String>,
}

impl ArtifactSummary {
    /// Groups the turn's artifacts by kind.
    pub fn from_artifacts(artifacts: &[Artifact]) -> Self {
        let mut summary = Self::default();
        for artifact in artifacts {
            let location = artifact_location(artifact);
            match artifact.artifact_type.as_str() {
                "image" | "html" | "figure" => summary.figures.push(location),
                "notebook" => summary.notebooks.push(location),
                "command" => summary.commands.push(location),
                _ => summary.files.push(location),
            }
        }
        summary
    }
}

fn artifact_location(artifact: &Artifact) -> String {
    let from_data = match &artifact.data {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Object(map) => ["path", "file_path", "url", "command"].iter().find_map(|key| map.get(*key)?.as_str().map(str::to_owned)),
        _ => None,
    };
    from_data.or_else(|| artifact.display_name.clone()).unwrap_or_else(|| artifact.id.clone())
}

/// Everything respond gathered for its prompt (upstream's `ResponseContext`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseContext {
    /// The task, with the timezone note appended when retrieved data names its timezone.
    pub current_task: String,
    /// The response mode.
    pub mode: ResponseMode,
    /// Summaries of the step's inputs (only those), in input order.
    pub relevant_context: Vec<(InputRef, Value)>,
    /// The turn's step records in plan order (empty in conversational mode).
    pub execution_history: Vec<StepRecord>,
    /// `- name: description` per capability, in conversational mode only.
    pub capabilities_overview: Option<String>,
    /// The recent chat history within the history budget, when the task depends on it.
    pub chat_history: Option<String>,
    /// Now in the facility timezone: `YYYY-MM-DD HH:MM ±HHMM (Zone)`.
    pub current_datetime: String,
    /// The timezone retrieved times are in, when a context names one (`timezone_name`).
    pub data_timezone: Option<String>,
    /// Where the answer will be shown.
    pub interface: Interface,
    /// What the turn produced for the interface.
    pub artifacts: ArtifactSummary,
}

/// The response-generation prompt builder. Every method has upstream's default; an
/// application overrides the ones it needs (its role, domain guidelines, the whole layout) and
/// hands the result to `RespondCapability::with_prompts`.
pub trait ResponsePrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "You are an expert assistant for workflow automation and data analysis.".into()
    }

    /// Guidelines for conversational answers (no execution): override for domain tone.
    fn conversational_guidelines(&self) -> Vec<String> {
        [
            "Be warm, professional, and genuine while staying focused on providing assistance",
            "Answer general questions about the system and your capabilities naturally",
            "Respond to greetings and social interactions professionally",
            "Ask clarifying questions to better understand user needs when appropriate",
            "Provide helpful context about system operations when relevant",
            "Be encouraging about the technical assistance available",
            "NEVER make up data, measurements or results - nothing was retrieved in this turn; say so and offer to retrieve it",
        ]
        .map(String::from)
        .to_vec()
    }

    /// Notes on how the interface presents the turn's artifacts (none without artifacts).
    fn interface_guidelines(&self, interface: Interface, artifacts: &ArtifactSummary) -> Vec<String> {
        default_interface_guidelines(interface, artifacts)
    }

    /// The numbered guidelines, in order.
    fn guidelines(&self, context: &ResponseContext) -> Vec<String> {
        let mut guidelines = vec!["Provide a clear, accurate response".to_owned()];
        guidelines.extend(self.interface_guidelines(context.interface, &context.artifacts));
        guidelines.push(format!(
            "The current date and time is {} (facility timezone) - use it for temporal context and date references",
            context.current_datetime
        ));
        if context.execution_history.is_empty() {
            guidelines.extend(self.conversational_guidelines());
        }
        if !context.relevant_context.is_empty() {
            guidelines.extend(
                [
                    "Be very accurate but use reasonable judgment when rounding or abbreviating numerical data for readability",
                    "NEVER make up, estimate, or fabricate any data - only use what is actually retrieved",
                    "Explain data limitations or warnings, but note that truncation markers like '(truncated ...)' or '[N items]' only mean the summary was shortened for this prompt",
                    "Be specific about time ranges and data sources",
                ]
                .map(String::from),
            );
        } else if !context.execution_history.is_empty() {
            guidelines.extend(
                [
                    "Explain what was accomplished during execution",
                    "Note any limitations in accessing detailed results",
                    "NEVER make up or fabricate any technical data - only describe what actually happened",
                ]
                .map(String::from),
            );
        }
        if let Some(timezone) = &context.data_timezone {
            guidelines.push(format!(
                "Label retrieved times with the timezone {timezone}, not the timezone named in the request; they are the same instants"
            ));
        }
        guidelines
    }

    /// The whole prompt: the role and the sections, separated by blank lines.
    fn build(&self, context: &ResponseContext) -> String {
        let mut sections = vec![self.role(), format!("CURRENT TASK: {}", context.current_task)];
        if let Some(history) = &context.chat_history {
            sections.push(format!("CONVERSATION HISTORY:\n{history}"));
        }
        if !context.relevant_context.is_empty() {
            sections.push(format!("RETRIEVED DATA:\n{}", format_retrieved_data(&context.relevant_context)));
        } else if !context.execution_history.is_empty() {
            sections.push(format!("EXECUTION SUMMARY:\n{}", format_execution_summary(&context.execution_history)));
        }
        if context.execution_history.is_empty()
            && let Some(overview) = &context.capabilities_overview
        {
            sections.push(format!("SYSTEM CAPABILITIES:\n{overview}"));
        }
        let guidelines = self.guidelines(context);
        let numbered: Vec<String> = guidelines.iter().enumerate().map(|(index, line)| format!("{}. {line}", index + 1)).collect();
        sections.push(format!("GUIDELINES:\n{}", numbered.join("\n")));
        sections.join("\n\n")
    }

    /// How the orchestrator is told to plan respond.
    fn orchestrator_guide(&self) -> OrchestratorGuide {
        default_orchestrator_guide()
    }
}

/// Upstream's response prompts, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultResponsePrompts;

impl ResponsePrompts for DefaultResponsePrompts {}

/// Upstream's per-interface notes on figures, notebooks, commands and files.
pub fn default_interface_guidelines(interface: Interface, artifacts: &ArtifactSummary) -> Vec<String> {
    let mut notes = Vec::new();
    let figures = artifacts.figures.len();
    if figures > 0 {
        notes.push(match interface {
            Interface::OpenWebUi => format!(
                "Note: {figures} generated visualization(s) will be displayed automatically below your response - acknowledge and refer to them appropriately. Don't explain figure metadata unless explicitly requested"
            ),
            Interface::Cli => format!(
                "Note: {figures} visualization(s) have been saved to files ({}) - they cannot be rendered in this terminal; mention the file locations",
                artifacts.figures.join(", ")
            ),
            Interface::Other => format!("Note: {figures} visualization(s) have been generated"),
        });
    }
    let notebooks = artifacts.notebooks.len();
    if notebooks > 0 {
        notes.push(match interface {
            Interface::OpenWebUi => format!(
                "Note: {notebooks} Jupyter notebook(s) with the complete execution code, results, and analysis will be displayed as clickable link(s) below your response - you can reference these for users who want to see the detailed implementation"
            ),
            Interface::Cli => format!(
                "Note: {notebooks} Jupyter notebook(s) with the complete execution code and results have been saved ({}) - mention these paths for users who want to review the detailed implementation",
                artifacts.notebooks.join(", ")
            ),
            Interface::Other => format!("Note: {notebooks} Jupyter notebook(s) with the complete execution details have been generated"),
        });
    }
    let commands = artifacts.commands.len();
    if commands > 0 {
        notes.push(match interface {
            Interface::OpenWebUi => format!(
                "Note: {commands} executable command(s) have been registered and will be displayed as clickable launch button(s) below your response - acknowledge these and explain what they will do when launched"
            ),
            Interface::Cli => format!(
                "Note: {commands} executable command(s) have been prepared for launch - explain what applications or tools these commands will open and how users can access them"
            ),
            Interface::Other => format!("Note: {commands} executable command(s) have been registered for launch"),
        });
    }
    let files = artifacts.files.len();
    if files > 0 {
        notes.push(match interface {
            Interface::OpenWebUi => {
                format!("Note: {files} file(s) will be offered as download link(s) below your response - refer to them")
            }
            Interface::Cli => format!("Note: {files} file(s) have been saved ({}) - give their paths", artifacts.files.join(", ")),
            Interface::Other => format!("Note: {files} file(s) have been generated"),
        });
    }
    notes
}

/// The retrieved data block: each input's summary as pretty JSON under `[TYPE: key]`.
pub fn format_retrieved_data(context: &[(InputRef, Value)]) -> String {
    let rule = "-".repeat(30);
    let mut lines = vec![rule.clone()];
    for (reference, summary) in context {
        lines.push(format!("\n[{}: {}]", reference.context_type, reference.key));
        lines.push(serde_json::to_string_pretty(summary).unwrap_or_else(|_| summary.to_string()));
        lines.push(rule.clone());
    }
    lines.join("\n")
}

/// `Step N: <objective> - Completed` or `- Failed: <error>` per record, in order.
pub fn format_execution_summary(history: &[StepRecord]) -> String {
    history
        .iter()
        .enumerate()
        .map(|(index, record)| {
            let objective = if record.task_objective.is_empty() { record.capability.as_str() } else { record.task_objective.as_str() };
            match (record.success, record.error.as_deref()) {
                (true, _) => format!("Step {}: {objective} - Completed", index + 1),
                (false, error) => format!("Step {}: {objective} - Failed: {}", index + 1, error.unwrap_or("Unknown error")),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The recent chat history as `User: …` / `Assistant: …` lines, oldest first: the most recent
/// messages within `history_chars` characters, after a `(N earlier messages omitted)` line when
/// some were left out (see [`crate::history`]).
pub fn format_chat_history(messages: &[Message], history_chars: usize) -> String {
    format_dialogue(messages, history_chars)
}

/// Upstream's respond guide: priority 100 (printed last), with a technical and a
/// conversational example.
pub fn default_orchestrator_guide() -> OrchestratorGuide {
    let step = |objective: &str, criteria: &str, inputs: Vec<InputRef>| PlannedStep {
        context_key: "user_response".into(),
        capability: RESPOND.into(),
        task_objective: objective.into(),
        success_criteria: criteria.into(),
        expected_output: Some("user_response".into()),
        parameters: None,
        inputs,
    };
    let technical = OrchestratorExample {
        step: step(
            "Respond to user question about data analysis with statistical results",
            "Complete response using execution context data and analysis results",
            vec![InputRef::new("ANALYSIS_RESULTS", "data_statistics"), InputRef::new("DATA_VALUES", "current_readings")],
        ),
        scenario_description: "Technical query with available execution context".into(),
        context_requirements: None,
        notes: Some("Will automatically use context-aware response generation with data retrieval.".into()),
    };
    let conversational = OrchestratorExample {
        step: step(
            "Respond to user question about available tools",
            "Friendly, informative response about assistant capabilities",
            Vec::new(),
        ),
        scenario_description: "Conversational query 'What tools do you have?'".into(),
        context_requirements: None,
        notes: Some("Applies to all conversational user queries with no clear task objective.".into()),
    };
    OrchestratorGuide {
        instructions: "Plan \"respond\" as the final step to deliver results to the user.\nAlways include respond as the last step in execution plans."
            .into(),
        examples: vec![technical, conversational],
        priority: 100,
    }
}

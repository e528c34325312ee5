//! The `clarify` capability (reference §2.8): the always-active final step that asks the user
//! one to four specific questions when the request lacks details, with its overridable prompt
//! builder ([`ClarificationPrompts`]) and orchestrator guide.

use std::sync::Arc;

use peregrine_core::plan::CLARIFY;
use peregrine_core::{
    AgentState, AgentStateUpdate, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ErrorClassification,
    InputRef, Message, OrchestratorExample, OrchestratorGuide, PlannedStep,
};
use peregrine_llm::{CallOptions, ChatMessage, LlmError, roles};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::catalog::Catalog;
use crate::respond::format_chat_history;
use crate::services::Services;

/// At most this many questions reach the user.
pub const MAX_QUESTIONS: usize = 4;

/// The model's answer (schema `ClarifyingQuestionsResponse`).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
pub struct ClarifyingQuestionsResponse {
    /// Brief explanation of why clarification is needed.
    pub reason: String,
    /// Specific, targeted questions to clarify the user's request (1 to 4).
    #[schemars(length(min = 1, max = 4))]
    pub questions: Vec<String>,
    /// Types of missing information (e.g. `time_range`, `system_specification`).
    #[serde(default)]
    pub missing_info: Vec<String>,
}

/// What the clarification prompt is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct ClarificationContext {
    /// The recent chat history within the history budget (`AgentSettings::prompt_history_chars`).
    pub chat_history: String,
    /// The user's latest message.
    pub user_query: String,
    /// The orchestrator's instruction: what is missing.
    pub instruction: String,
    /// Summaries of the step's inputs.
    pub available_context: Vec<(InputRef, Value)>,
    /// `- name: description` per capability; unused by the default prompt, there for builders
    /// that want to say what the assistant can do.
    pub capabilities_overview: String,
}

/// The clarification prompt builder; every method has upstream's default.
pub trait ClarificationPrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "You are helping to clarify ambiguous user queries for the assistant system.".into()
    }

    /// The query: history, the user's request, the orchestrator's instruction, the rules and a
    /// good/bad example.
    fn clarification_query(&self, chat_history: &str, user_query: &str, instruction: &str) -> String {
        format!(
            "CONVERSATION HISTORY:\n{chat_history}\n\n\
             USER'S ORIGINAL QUERY:\n\"{user_query}\"\n\n\
             ORCHESTRATOR'S CLARIFICATION INSTRUCTION:\n{instruction}\n\n\
             Your task is to generate specific clarifying questions that address the missing information.\n\n\
             IMPORTANT:\n\
             - The user asked: \"{user_query}\"\n\
             - The orchestrator identified what's missing: \"{instruction}\"\n\
             - Generate 1-3 specific, targeted questions that will get the missing information (simplicity is appreciated)\n\
             - Make questions conversational and easy to answer\n\
             - Be specific to what's missing - don't ask generic \"what do you need?\" questions\n\
             - Reference the user's original intent when appropriate\n\n\
             Example:\n\
             - User query: \"what's the weather?\"\n\
             - Missing info: \"location not specified\"\n\
             - Good question: \"Which location would you like weather information for?\"\n\
             - Bad question: \"What do you need help with?\"\n\n\
             Consider:\n\
             - What has already been discussed in the conversation history\n\
             - Avoid asking for information already provided earlier\n\
             - Focus on the specific missing information from the orchestrator's instruction"
        )
    }

    /// The whole prompt: role, query and the available context.
    fn build(&self, context: &ClarificationContext) -> String {
        let mut prompt =
            format!("{}\n\n{}", self.role(), self.clarification_query(&context.chat_history, &context.user_query, &context.instruction));
        if !context.available_context.is_empty() {
            let items: Vec<String> = context
                .available_context
                .iter()
                .map(|(reference, summary)| format!("- {} ({}): {summary}", reference.context_type, reference.key))
                .collect();
            prompt.push_str(&format!("\n\nAvailable context data:\n{}", items.join("\n")));
        }
        prompt
    }

    /// How the orchestrator is told to plan clarify.
    fn orchestrator_guide(&self) -> OrchestratorGuide {
        default_orchestrator_guide()
    }
}

/// Upstream's clarification prompts, unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClarificationPrompts;

impl ClarificationPrompts for DefaultClarificationPrompts {}

/// Upstream's clarify guide: priority 99 (just before respond), with one example.
pub fn default_orchestrator_guide() -> OrchestratorGuide {
    let example = OrchestratorExample {
        step: PlannedStep {
            context_key: "data_clarification".into(),
            capability: CLARIFY.into(),
            task_objective: "Ask user for clarification when request 'show me some data' is too vague".into(),
            success_criteria: "Specific questions about data type, system, and time range".into(),
            expected_output: None,
            parameters: None,
            inputs: Vec::new(),
        },
        scenario_description: "Vague data request needing system and parameter clarification".into(),
        context_requirements: None,
        notes: None,
    };
    OrchestratorGuide {
        instructions: "Plan \"clarify\" when user queries lack specific details needed for execution.\n\
                       Use instead of respond when information is insufficient.\n\
                       Replaces technical execution steps until user provides clarification."
            .into(),
        examples: vec![example],
        priority: 99,
    }
}

/// The capability that asks the user for missing details.
pub struct ClarifyCapability {
    services: Services,
    catalog: Arc<Catalog>,
    prompts: Arc<dyn ClarificationPrompts>,
    spec: CapabilitySpec,
}

impl std::fmt::Debug for ClarifyCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClarifyCapability").field("spec", &self.spec.name).finish_non_exhaustive()
    }
}

impl ClarifyCapability {
    /// Clarify with upstream's prompts.
    pub fn new(services: Services, catalog: Arc<Catalog>) -> Self {
        Self { services, catalog, prompts: Arc::new(DefaultClarificationPrompts), spec: Self::default_spec() }
    }

    /// Uses `prompts` instead of the defaults; the spec's orchestrator guide follows them.
    pub fn with_prompts(mut self, prompts: Arc<dyn ClarificationPrompts>) -> Self {
        self.spec.orchestrator_guide = Some(prompts.orchestrator_guide());
        self.prompts = prompts;
        self
    }

    /// Upstream's spec: always active, no outputs, the priority-99 orchestrator guide and no
    /// classifier guide.
    pub fn default_spec() -> CapabilitySpec {
        CapabilitySpec {
            always_active: true,
            orchestrator_guide: Some(default_orchestrator_guide()),
            ..CapabilitySpec::new(CLARIFY, "Ask specific questions when user queries are ambiguous or missing critical details")
        }
    }

    /// What the prompt is built from for `step`.
    pub fn clarification_context(&self, state: &AgentState, step: &PlannedStep, instruction: &str) -> ClarificationContext {
        ClarificationContext {
            chat_history: format_chat_history(&state.messages, self.services.settings.prompt_history_chars),
            user_query: state.user_query().unwrap_or_default().to_owned(),
            instruction: instruction.to_owned(),
            available_context: state.capability_context_data.summaries(Some(step)),
            capabilities_overview: self.catalog.overview(),
        }
    }
}

/// The questions to show: trimmed, blanks dropped, at most [`MAX_QUESTIONS`]; none is an
/// invalid answer (RETRIABLE).
pub fn validate_questions(response: ClarifyingQuestionsResponse) -> Result<Vec<String>, CapabilityError> {
    let mut questions: Vec<String> =
        response.questions.iter().map(|question| question.trim()).filter(|question| !question.is_empty()).map(str::to_owned).collect();
    if questions.is_empty() {
        let problem = format!(
            "the model returned no clarifying questions ({} given, all blank); reason given: {}",
            response.questions.len(),
            if response.reason.trim().is_empty() { "none" } else { response.reason.trim() }
        );
        return Err(
            CapabilityError::new(problem.clone()).classified(ErrorClassification::retriable(format!("Invalid clarification: {problem}")))
        );
    }
    if questions.len() > MAX_QUESTIONS {
        tracing::warn!(
            count = questions.len(),
            kept = MAX_QUESTIONS,
            "the model asked too many clarifying questions; keeping the first ones"
        );
        questions.truncate(MAX_QUESTIONS);
    }
    Ok(questions)
}

/// `I need some clarification:` followed by the numbered questions.
pub fn format_questions(questions: &[String]) -> String {
    let numbered: Vec<String> = questions.iter().enumerate().map(|(index, question)| format!("{}. {question}", index + 1)).collect();
    format!("I need some clarification:\n\n{}", numbered.join("\n"))
}

impl Capability for ClarifyCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    /// The attached classification (LLM faults classified by the LLM layer); anything else is
    /// RETRIABLE, as upstream.
    fn classify_error(&self, error: &CapabilityError) -> ErrorClassification {
        error.classification().cloned().or_else(|| error.downcast_ref::<LlmError>().map(LlmError::classification)).unwrap_or_else(|| {
            ErrorClassification::retriable(format!("Failed to generate clarifying questions: {}", error.message()))
                .with_metadata("technical_details", error.message())
        })
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let context = self.clarification_context(input.state, input.step, input.task_objective());
        let prompt = self.prompts.build(&context);
        let options = CallOptions { events: Some(input.events), component: Some(CLARIFY) };
        let response: ClarifyingQuestionsResponse =
            self.services.llm.structured(roles::RESPONSE, vec![ChatMessage::user(prompt)], options).await.map_err(CapabilityError::from)?;
        let questions = validate_questions(response)?;
        Ok(CapabilityOutcome::Done(AgentStateUpdate::message(Message::assistant(format_questions(&questions)))))
    }
}

#[cfg(test)]
mod tests {
    use peregrine_core::capability::NoEvents;
    use peregrine_core::{ContextEntry, ErrorSeverity, Role};
    use peregrine_llm::{FakeProvider, LlmErrorKind};
    use serde_json::json;

    use super::*;
    use crate::settings::AgentSettings;

    fn clarify_with(provider: &FakeProvider) -> ClarifyCapability {
        let services = Services::new(Arc::new(provider.client()), AgentSettings::default());
        ClarifyCapability::new(services, Arc::new(Catalog::new(vec![ClarifyCapability::default_spec()])))
    }

    fn answering(answer: Value) -> FakeProvider {
        FakeProvider::by_schema(move |schema, _| {
            assert_eq!(schema, "ClarifyingQuestionsResponse");
            Ok(answer.to_string())
        })
    }

    fn vague_state() -> AgentState {
        let mut state = AgentState::default();
        state.messages.push(Message::user("hello"));
        state.messages.push(Message::assistant("Hi! How can I help?"));
        state.messages.push(Message::user("show me some data"));
        state.task.current_task = Some("Show the user some data".into());
        state
    }

    fn clarify_step(inputs: Vec<InputRef>) -> PlannedStep {
        PlannedStep {
            context_key: "data_clarification".into(),
            capability: CLARIFY.into(),
            task_objective: "Ask which system and time range the data should cover".into(),
            success_criteria: String::new(),
            expected_output: None,
            parameters: None,
            inputs,
        }
    }

    async fn run(clarify: &ClarifyCapability, state: &AgentState, step: &PlannedStep) -> Result<CapabilityOutcome, CapabilityError> {
        let spec = clarify.spec().clone();
        clarify.execute(CapabilityInput { state, step, spec: &spec, events: &NoEvents, approval: None }).await
    }

    fn message_of(outcome: CapabilityOutcome) -> Message {
        let CapabilityOutcome::Done(update) = outcome else { panic!("clarify never asks for approval") };
        assert_eq!(update.messages.len(), 1);
        update.messages.into_iter().next().expect("one message")
    }

    #[tokio::test]
    async fn formats_numbered_questions_from_one_structured_call() {
        let provider = answering(json!({
            "reason": "no system or time range",
            "questions": ["Which system's data do you want?", "  For what time range?  "],
            "missing_info": ["system", "time_range"]
        }));
        let clarify = clarify_with(&provider);
        let mut state = vague_state();
        state.capability_context_data.insert("TIME_RANGE", "tr", ContextEntry::new(json!({"start": "08:00"}), None));
        state.capability_context_data.insert("PV_VALUES", "other", ContextEntry::new(json!({"SR:VAC": 1}), None));
        let step = clarify_step(vec![InputRef::new("TIME_RANGE", "tr")]);
        let message = message_of(run(&clarify, &state, &step).await.expect("asks"));
        assert_eq!(message.role, Role::Assistant);
        assert_eq!(message.content, "I need some clarification:\n\n1. Which system's data do you want?\n2. For what time range?");

        let requests = provider.requests_for("ClarifyingQuestionsResponse");
        assert_eq!(requests.len(), 1);
        let prompt = &requests[0].messages[0].content;
        assert!(
            prompt.starts_with("You are helping to clarify ambiguous user queries for the assistant system.\n\nCONVERSATION HISTORY:\n")
        );
        assert!(prompt.contains("User: hello\nAssistant: Hi! How can I help?\nUser: show me some data"));
        assert!(prompt.contains("USER'S ORIGINAL QUERY:\n\"show me some data\""));
        assert!(prompt.contains("ORCHESTRATOR'S CLARIFICATION INSTRUCTION:\nAsk which system and time range the data should cover"));
        assert!(prompt.contains("Generate 1-3 specific, targeted questions"));
        assert!(prompt.contains("Good question: \"Which location would you like weather information for?\""));
        assert!(prompt.contains("Bad question: \"What do you need help with?\""));
        assert!(prompt.contains("Available context data:\n- TIME_RANGE (tr): {\"start\":\"08:00\"}"), "{prompt}");
        assert!(!prompt.contains("SR:VAC"), "only the step's inputs");
    }

    #[tokio::test]
    async fn the_prompt_carries_only_the_recent_history_within_the_budget() {
        let provider = answering(json!({"reason": "vague", "questions": ["Which system?"]}));
        let settings = AgentSettings { prompt_history_chars: 200, ..AgentSettings::default() };
        let clarify = ClarifyCapability::new(
            Services::new(Arc::new(provider.client()), settings),
            Arc::new(Catalog::new(vec![ClarifyCapability::default_spec()])),
        );
        let mut state = AgentState::default();
        for index in 0..30 {
            state.messages.push(Message::user(format!("old request {index:02} {}", "r".repeat(40))));
            state.messages.push(Message::assistant(format!("old answer {index:02} {}", "a".repeat(40))));
        }
        state.messages.push(Message::user("show me some data"));
        run(&clarify, &state, &clarify_step(Vec::new())).await.expect("asks");
        let prompt = provider.requests_for("ClarifyingQuestionsResponse")[0].messages[0].content.clone();
        let history = prompt
            .split("CONVERSATION HISTORY:\n")
            .nth(1)
            .and_then(|rest| rest.split("\n\nUSER'S ORIGINAL QUERY:").next())
            .expect("a history section");
        assert!(history.chars().count() <= 240, "{history}");
        assert!(history.starts_with('(') && history.contains(" earlier messages omitted)\n"), "{history}");
        assert!(history.ends_with("\nUser: show me some data"), "{history}");
        assert!(!history.contains("old request 00"));
        assert!(prompt.contains("USER'S ORIGINAL QUERY:\n\"show me some data\""));
    }

    #[tokio::test]
    async fn no_questions_is_a_retriable_invalid_answer() {
        let provider = answering(json!({"reason": "unclear", "questions": ["   ", ""], "missing_info": []}));
        let clarify = clarify_with(&provider);
        let error = run(&clarify, &vague_state(), &clarify_step(Vec::new())).await.expect_err("invalid");
        let classification = clarify.classify_error(&error);
        assert_eq!(classification.severity, ErrorSeverity::Retriable);
        assert!(error.message().contains("no clarifying questions"), "{}", error.message());
        assert!(classification.user_message.as_deref().is_some_and(|message| message.contains("no clarifying questions")));
    }

    #[tokio::test]
    async fn more_than_four_questions_are_cut_to_the_first_four() {
        let questions: Vec<String> = (1..=6).map(|index| format!("Question {index}?")).collect();
        let provider = answering(json!({"reason": "many gaps", "questions": questions}));
        let message = message_of(run(&clarify_with(&provider), &vague_state(), &clarify_step(Vec::new())).await.expect("asks"));
        assert_eq!(message.content, "I need some clarification:\n\n1. Question 1?\n2. Question 2?\n3. Question 3?\n4. Question 4?");
    }

    #[tokio::test]
    async fn llm_failures_keep_the_llm_layers_classification() {
        let table = [(LlmErrorKind::Timeout, ErrorSeverity::Retriable), (LlmErrorKind::Config, ErrorSeverity::Critical)];
        for (kind, severity) in table {
            let provider = FakeProvider::by_schema(move |_, _| Err(FakeProvider::error(kind.clone(), "failed")));
            let clarify = clarify_with(&provider);
            let error = run(&clarify, &vague_state(), &clarify_step(Vec::new())).await.expect_err("fails");
            assert_eq!(clarify.classify_error(&error).severity, severity);
        }
        let unparseable = FakeProvider::by_schema(|_, _| Ok("not json".into()));
        let clarify = clarify_with(&unparseable);
        let error = run(&clarify, &vague_state(), &clarify_step(Vec::new())).await.expect_err("fails");
        assert_eq!(clarify.classify_error(&error).severity, ErrorSeverity::Retriable);
        assert_eq!(unparseable.requests().len(), 2, "one retry with the validation error fed back");
        assert_eq!(clarify.retry_policy(), peregrine_core::RetryPolicy::capability_default());
    }

    #[test]
    fn unclassified_errors_are_retriable() {
        let clarify = clarify_with(&answering(json!({})));
        assert_eq!(clarify.classify_error(&CapabilityError::new("boom")).severity, ErrorSeverity::Retriable);
    }

    struct TersePrompts;

    impl ClarificationPrompts for TersePrompts {
        fn role(&self) -> String {
            "You ask the beamline scientist short questions.".into()
        }
    }

    #[tokio::test]
    async fn a_custom_role_changes_only_the_role() {
        let provider = answering(json!({"reason": "r", "questions": ["Which beamline?"]}));
        let clarify = clarify_with(&provider).with_prompts(Arc::new(TersePrompts));
        run(&clarify, &vague_state(), &clarify_step(Vec::new())).await.expect("asks");
        let prompt = provider.requests()[0].messages[0].content.clone();
        assert!(prompt.starts_with("You ask the beamline scientist short questions.\n\nCONVERSATION HISTORY:"), "{prompt}");
        assert!(prompt.contains("ORCHESTRATOR'S CLARIFICATION INSTRUCTION:"));
    }

    #[test]
    fn the_default_spec_matches_upstream() {
        let spec = ClarifyCapability::default_spec();
        assert_eq!(spec.name, "clarify");
        assert!(spec.always_active && spec.provides.is_empty() && spec.classifier_guide.is_none());
        let guide = spec.orchestrator_guide.expect("guide");
        assert_eq!(guide.priority, 99);
        assert!(guide.instructions.starts_with("Plan \"clarify\" when user queries lack specific details"));
        assert!(guide.instructions.contains("Use instead of respond when information is insufficient."));
        assert_eq!(guide.examples.len(), 1);
        assert_eq!(guide.examples[0].step.capability, "clarify");
    }
}

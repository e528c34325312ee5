//! `hello`: a capability that stores a `GREETING` context. It calls no model, so it shows the
//! parts every capability has: a spec (name, what it provides, classifier and orchestrator
//! guides) and `execute`, which turns a plan step into a state update.

use peregrine::core::events::StatusLevel;
use peregrine::core::plan::RESPOND;
use peregrine::core::{
    AgentEvent, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ClassifierExample, ClassifierGuide,
    ContextType, InputRef, OrchestratorExample, OrchestratorGuide, PlannedStep,
};

use crate::context::GreetingContext;

/// The capability's name; plan steps refer to it.
pub const NAME: &str = "hello";

/// The `hello` capability.
#[derive(Debug, Clone)]
pub struct HelloCapability {
    spec: CapabilitySpec,
}

impl HelloCapability {
    /// The capability. A capability that calls a model takes the application's `Services`
    /// here and uses `services.llm` (see the hello-world-weather template).
    pub fn new() -> Self {
        Self { spec: spec() }
    }
}

impl Default for HelloCapability {
    fn default() -> Self {
        Self::new()
    }
}

/// What the registry, the classifier and the orchestrator know about `hello`.
pub fn spec() -> CapabilitySpec {
    CapabilitySpec {
        // Every context type the capability stores; storing another one is refused.
        provides: vec![GreetingContext::CONTEXT_TYPE.into()],
        classifier_guide: Some(classifier_guide()),
        orchestrator_guide: Some(orchestrator_guide()),
        ..CapabilitySpec::new(NAME, "Greet the user on behalf of this application")
    }
}

fn example(query: &str, result: bool, reason: &str) -> ClassifierExample {
    ClassifierExample { query: query.into(), result, reason: reason.into() }
}

/// When the classifier selects `hello`. Without a classifier guide a capability is never
/// selected (unless its spec says `always_active`).
pub fn classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the user wants to be greeted or says hello to the assistant.".into(),
        examples: vec![
            example("Hello!", true, "The user greets the assistant."),
            example("Say hello to me", true, "The user asks for a greeting."),
            example("Good morning, how are you?", true, "A greeting expects a greeting back."),
            example("What is the capital of France?", false, "A factual question, not a greeting."),
            example("What tools do you have?", false, "A question about the assistant's tools, not a greeting."),
        ],
        actions_if_true: None,
    }
}

/// How the orchestrator plans `hello`: one step, then a `respond` step that reads the greeting.
pub fn orchestrator_guide() -> OrchestratorGuide {
    let greeting = GreetingContext::CONTEXT_TYPE;
    let step = |context_key: &str, capability: &str, objective: &str, inputs: Vec<InputRef>| PlannedStep {
        context_key: context_key.into(),
        capability: capability.into(),
        task_objective: objective.into(),
        success_criteria: "Done".into(),
        expected_output: None,
        parameters: None,
        inputs,
    };
    OrchestratorGuide {
        instructions: format!(
            "**When to plan \"hello\" steps:** when the user greets the assistant or asks to be greeted.\n\
             **Output: {greeting}** (the greeting text).\n\
             Plan TWO steps: 1. hello (context_key \"greeting\"), 2. respond with inputs=[{{\"{greeting}\": \"greeting\"}}]."
        ),
        examples: vec![
            OrchestratorExample {
                step: step("greeting", NAME, "Prepare a greeting for the user", Vec::new()),
                scenario_description: "The user says hello".into(),
                context_requirements: None,
                notes: Some(format!("Output stored as {greeting}.")),
            },
            OrchestratorExample {
                step: step(
                    "final_response",
                    RESPOND,
                    "Greet the user with the prepared greeting",
                    vec![InputRef::new(greeting, "greeting")],
                ),
                scenario_description: "The second step: respond reads the greeting".into(),
                context_requirements: None,
                notes: Some("The respond step MUST list the greeting in its inputs.".into()),
            },
        ],
        priority: 10,
    }
}

impl Capability for HelloCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    // Optional: `classify_error` (what the router does with a failure: retry, re-plan,
    // re-classify, stop) and `retry_policy` (attempts and backoff).

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        input.events.emit(AgentEvent::status(NAME, StatusLevel::Info, "Preparing a greeting..."));
        let greeting = GreetingContext::for_request(input.task_objective());
        // Stored under the step's context key, where the respond step's inputs find it.
        let update = input.store_output(&greeting)?;
        input.events.emit(AgentEvent::status(NAME, StatusLevel::Success, "Greeting ready"));
        Ok(CapabilityOutcome::Done(update))
    }
}

#[cfg(test)]
mod tests {
    use peregrine::core::AgentState;
    use peregrine::core::capability::NoEvents;

    use super::*;

    #[tokio::test]
    async fn stores_a_greeting_under_the_step_key() {
        let capability = HelloCapability::new();
        let state = AgentState::default();
        let step = orchestrator_guide().examples[0].step.clone();
        let input = CapabilityInput { state: &state, step: &step, spec: capability.spec(), events: &NoEvents, approval: None };

        let CapabilityOutcome::Done(update) = capability.execute(input).await.expect("succeeds") else {
            panic!("hello never asks for approval");
        };

        let store = update.context.expect("the update stores context");
        let greeting = store.get::<GreetingContext>("greeting").expect("decodes").expect("stored under the step key");
        assert_eq!(greeting.request, "Prepare a greeting for the user");
        assert!(greeting.greeting.starts_with("Hello from "), "{}", greeting.greeting);
    }

    #[test]
    fn the_classifier_and_the_orchestrator_are_told_about_hello() {
        let spec = spec();
        assert_eq!(spec.provides, ["GREETING"]);
        assert!(spec.classifier_guide.is_some_and(|guide| guide.examples.iter().any(|example| example.result)));
        let guide = spec.orchestrator_guide.expect("orchestrator guide");
        assert_eq!(guide.examples[1].step.inputs, [InputRef::new("GREETING", "greeting")]);
    }
}

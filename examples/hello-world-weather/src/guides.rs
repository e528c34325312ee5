//! What the classifier and the orchestrator are told about `current_weather`: upstream's
//! classifier guide word for word, and its orchestrator guide with the location lines brought
//! in line with what the capability does (any location; "local" when none is named).

use peregrine_core::plan::RESPOND;
use peregrine_core::{
    CapabilitySpec, ClassifierExample, ClassifierGuide, ContextType, InputRef, OrchestratorExample, OrchestratorGuide, PlannedStep,
};

use crate::context::CurrentWeatherContext;

/// The capability's name.
pub const NAME: &str = "current_weather";

/// The capability's one-line description.
pub const DESCRIPTION: &str = "Get current weather conditions for a location";

/// Where `current_weather` prints in the planning prompt (upstream's `order=5`).
pub const ORCHESTRATOR_PRIORITY: i32 = 5;

/// The capability's spec: provides `CURRENT_WEATHER`, requires nothing.
pub fn spec() -> CapabilitySpec {
    CapabilitySpec {
        provides: vec![CurrentWeatherContext::CONTEXT_TYPE.into()],
        classifier_guide: Some(classifier_guide()),
        orchestrator_guide: Some(orchestrator_guide()),
        ..CapabilitySpec::new(NAME, DESCRIPTION)
    }
}

fn example(query: &str, result: bool, reason: &str) -> ClassifierExample {
    ClassifierExample { query: query.into(), result, reason: reason.into() }
}

/// Upstream's classifier guide: when a task needs current weather.
pub fn classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the task requires current weather information for a specific location.".into(),
        examples: vec![
            example(
                "What's the weather like in San Francisco right now?",
                true,
                "Request asks for current weather conditions in a specific location.",
            ),
            example("How's the weather today?", true, "Current weather request, though location may need to be inferred."),
            example("What was the weather like last week?", false, "Request is for historical weather data, not current conditions."),
            example("What tools do you have?", false, "Request is for tool information, not weather."),
            example("What's the temperature in New York?", true, "Temperature is a key component of weather conditions."),
            example("Is it rainy in San Francisco right now?", true, "Rain query relates to current atmospheric conditions."),
            example("Should I bring a jacket today?", true, "Clothing decision depends on current weather/temperature conditions."),
            example(
                "Calculate the average of today's temperature readings",
                true,
                "Mathematical calculations on weather metrics require current weather data.",
            ),
        ],
        actions_if_true: None,
    }
}

/// Upstream's orchestrator guide: when to plan a weather step and how respond reads it.
pub fn orchestrator_guide() -> OrchestratorGuide {
    let weather = CurrentWeatherContext::CONTEXT_TYPE;
    let single_step = OrchestratorExample {
        step: PlannedStep {
            context_key: "current_weather".into(),
            capability: NAME.into(),
            task_objective: "Get current weather conditions for the specified location".into(),
            success_criteria: "Current weather data retrieved with temperature and conditions".into(),
            expected_output: Some(weather.into()),
            parameters: None,
            inputs: Vec::new(),
        },
        scenario_description: "Getting current weather for a location".into(),
        context_requirements: None,
        notes: Some(format!("Output stored as {weather} with live weather data.")),
    };
    let with_response = OrchestratorExample {
        step: PlannedStep {
            context_key: "final_response".into(),
            capability: RESPOND.into(),
            task_objective: "Inform the user of the current temperature using the weather data".into(),
            success_criteria: "User receives clear response with temperature information".into(),
            expected_output: Some("FINAL_RESPONSE".into()),
            parameters: None,
            inputs: vec![InputRef::new(weather, "current_weather")],
        },
        scenario_description: "Complete workflow: weather retrieval followed by response generation".into(),
        context_requirements: None,
        notes: Some(format!(
            "This shows the SECOND step in a two-step plan:\n\
             Step 1: current_weather capability (context_key='current_weather') retrieves weather data\n\
             Step 2: respond capability uses that data via inputs=[{{\"{weather}\": \"current_weather\"}}]\n\n\
             CRITICAL: The respond step MUST reference the weather data from Step 1 in its inputs list."
        )),
    };
    OrchestratorGuide {
        instructions: format!(
            "**When to plan \"current_weather\" steps:**\n\
             - When users ask for current weather conditions\n\
             - For real-time weather information requests\n\
             - When location-specific current conditions are needed\n\n\
             **Output: {weather}**\n\
             - Contains: location, temperature, conditions, timestamp\n\
             - Available for immediate display or further analysis\n\n\
             **Location Support:**\n\
             - Name the location in the step's task_objective; one step per location\n\
             - Any location works; San Francisco, New York and Prague have city-specific data\n\
             - Uses \"local\" if no location is specified\n\n\
             **Multi-Step Planning:**\n\
             When weather data needs to be communicated to the user, plan TWO steps:\n\
             1. current_weather step (retrieves data)\n\
             2. respond step with inputs=[{{\"{weather}\": \"<weather_step_key>\"}}]\n\
             The respond step MUST include the weather data in its inputs list to access the retrieved information."
        ),
        examples: vec![single_step, with_response],
        priority: ORCHESTRATOR_PRIORITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_matches_upstream() {
        let spec = spec();
        assert_eq!(spec.name, "current_weather");
        assert_eq!(spec.description, "Get current weather conditions for a location");
        assert_eq!(spec.provides, ["CURRENT_WEATHER"]);
        assert!(spec.requires.is_empty() && !spec.always_active && !spec.direct_chat_enabled);

        let classifier = spec.classifier_guide.expect("classifier guide");
        assert_eq!(classifier.examples.len(), 8);
        assert_eq!(classifier.examples.iter().filter(|example| example.result).count(), 6);
        assert_eq!(
            classifier.examples[2].format_for_prompt(),
            "User Query: \"What was the weather like last week?\" -> Expected Output: false -> Reason: Request is for historical weather data, not current conditions."
        );

        let orchestrator = spec.orchestrator_guide.expect("orchestrator guide");
        assert_eq!(orchestrator.priority, 5);
        assert_eq!(orchestrator.examples.len(), 2);
        assert_eq!(orchestrator.examples[1].step.inputs, [InputRef::new("CURRENT_WEATHER", "current_weather")]);
        assert!(orchestrator.instructions.contains("respond step with inputs=[{\"CURRENT_WEATHER\": \"<weather_step_key>\"}]"));
        assert!(orchestrator.instructions.contains("Uses \"local\" if no location is specified"));
    }
}

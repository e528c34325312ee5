//! The application's task-extraction customisation (upstream's
//! `WeatherTaskExtractionPromptBuilder`): a weather-specific role and instructions, and eight
//! weather examples that replace the framework's defaults — plugged in through
//! [`prompt_overrides`], without forking the framework.

use std::sync::Arc;

use peregrine_agent::PromptOverrides;
use peregrine_agent::RetrievedData;
use peregrine_agent::infra::task_extraction::{
    ExampleMessage, ExtractedTask, TaskExtractionExample as FrameworkExample, TaskExtractionPrompts,
};
use peregrine_core::Role;

/// One task-extraction example: a conversation, the user's memory, and the expected task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExtractionExample {
    /// The conversation, oldest first.
    pub messages: Vec<(Role, &'static str)>,
    /// The user's memory entries.
    pub user_memory: Vec<&'static str>,
    /// The expected task.
    pub task: &'static str,
    /// Whether the task depends on the chat history.
    pub depends_on_chat_history: bool,
    /// Whether the task depends on user memory.
    pub depends_on_user_memory: bool,
}

/// The role line of the task-extraction prompt.
pub const TASK_EXTRACTION_ROLE: &str =
    "You are a weather assistant task extraction specialist that analyzes conversations to extract actionable weather-related tasks.";

/// The instructions of the task-extraction prompt.
pub const TASK_EXTRACTION_INSTRUCTIONS: &str = "Your job is to:
1. Understand what the user is asking for in the context of weather information
2. Extract a clear, actionable task related to weather queries
3. Determine if the task depends on chat history context
4. Determine if the task depends on user memory

## Weather-Specific Guidelines:
- Create self-contained task descriptions executable without conversation context
- Resolve temporal references (\"tomorrow\", \"next week\") to specific time periods
- Carry forward location references from previous messages (e.g., \"What about tomorrow there?\")
- Extract specific locations, times, and weather parameters from previous responses
- Set depends_on_chat_history=True if task references previous messages
- Set depends_on_user_memory=True only when task needs specific information from user memory
- Be specific and actionable in task descriptions";

fn example(
    messages: &[(Role, &'static str)],
    user_memory: &[&'static str],
    task: &'static str,
    depends_on_chat_history: bool,
    depends_on_user_memory: bool,
) -> TaskExtractionExample {
    TaskExtractionExample {
        messages: messages.to_vec(),
        user_memory: user_memory.to_vec(),
        task,
        depends_on_chat_history,
        depends_on_user_memory,
    }
}

/// Upstream's eight weather examples, in order.
pub fn task_extraction_examples() -> Vec<TaskExtractionExample> {
    use Role::{Assistant, User};
    vec![
        // Simple temporal follow-up.
        example(
            &[
                (User, "What's the current weather in Paris?"),
                (
                    Assistant,
                    "The current weather in Paris is 15°C with overcast skies and light rain. Wind speed is 12 km/h from the northwest.",
                ),
                (User, "What was it like 3 hours ago?"),
            ],
            &[],
            "Get historical weather conditions for Paris from 3 hours ago",
            true,
            false,
        ),
        // Location carry-forward with a temporal change.
        example(
            &[
                (User, "What's the weather like in San Francisco tonight?"),
                (
                    Assistant,
                    "Tonight in San Francisco, expect partly cloudy skies with temperatures around 13°C. Light winds from the west at 12 km/h.",
                ),
                (User, "What about tomorrow?"),
            ],
            &[],
            "Get weather forecast for San Francisco for tomorrow",
            true,
            false,
        ),
        // Location switching.
        example(
            &[
                (User, "How's the weather in Prague?"),
                (Assistant, "The current weather in Prague shows 8°C with rainy conditions. Humidity is at 85% with moderate winds."),
                (User, "What about in Paris?"),
            ],
            &[],
            "Get current weather conditions for Paris",
            true,
            false,
        ),
        // Conversational query.
        example(
            &[
                (User, "Hi, what weather information can you provide?"),
                (
                    Assistant,
                    "I can help you check current weather conditions and forecasts for various cities! I can tell you about temperature, precipitation, wind, and general conditions.",
                ),
                (User, "Which cities do you cover?"),
            ],
            &[],
            "List the cities available for weather queries",
            false,
            false,
        ),
        // Fresh request.
        example(&[(User, "Can you check the weather in New York?")], &[], "Get current weather conditions for New York", false, false),
        // Implicit location reference ("there").
        example(
            &[
                (User, "What's the current weather in Paris?"),
                (Assistant, "Paris is currently experiencing clear weather at 16°C with light winds and good visibility."),
                (User, "How about tomorrow there?"),
            ],
            &[],
            "Get weather forecast for Paris for tomorrow",
            true,
            false,
        ),
        // Location preference from memory.
        example(
            &[(User, "What's the weather like at home?")],
            &["[2025-01-15] Home location: San Francisco"],
            "Get current weather conditions for San Francisco",
            false,
            true,
        ),
        // Activity preferences from memory.
        example(
            &[(User, "Is it good running weather right now?")],
            &[
                "[2025-01-14] Running conditions: Prefer temperature < 20°C, no rain, wind < 15 km/h",
                "[2025-01-15] Home location: San Francisco",
            ],
            "Check if current weather in San Francisco meets running conditions: temperature below 20°C, no rain, and wind under 15 km/h",
            false,
            true,
        ),
    ]
}

/// The weather application's task-extraction prompts: upstream's role, instructions and eight
/// examples; everything else (layout, history, retrieved data) is the framework's.
#[derive(Debug, Clone, Copy, Default)]
pub struct WeatherTaskExtractionPrompts;

impl TaskExtractionPrompts for WeatherTaskExtractionPrompts {
    fn role(&self) -> String {
        TASK_EXTRACTION_ROLE.into()
    }

    fn instructions(&self) -> String {
        TASK_EXTRACTION_INSTRUCTIONS.into()
    }

    fn examples(&self) -> Vec<FrameworkExample> {
        task_extraction_examples().iter().map(TaskExtractionExample::to_framework).collect()
    }
}

impl TaskExtractionExample {
    /// The example in the framework's form (memory entries shown as the user-memory data
    /// source shows them).
    pub fn to_framework(&self) -> FrameworkExample {
        let retrieved_data = if self.user_memory.is_empty() {
            Vec::new()
        } else {
            let entries: Vec<String> = self.user_memory.iter().map(|entry| format!("• {entry}")).collect();
            vec![RetrievedData {
                source: "core_user_memory".into(),
                title: "🧠 User Memory".into(),
                content: format!("({} saved entries):\n{}", entries.len(), entries.join("\n")),
            }]
        };
        FrameworkExample {
            history: self.messages.iter().map(|(role, text)| ExampleMessage::new(*role, text)).collect(),
            retrieved_data,
            expected: ExtractedTask {
                task: self.task.into(),
                depends_on_chat_history: self.depends_on_chat_history,
                depends_on_user_memory: self.depends_on_user_memory,
            },
        }
    }
}

/// The prompt builders this application replaces; pass to `AgentBuilder::prompts`.
pub fn prompt_overrides() -> PromptOverrides {
    PromptOverrides { task_extraction: Some(Arc::new(WeatherTaskExtractionPrompts)), ..PromptOverrides::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weather_prompts_replace_the_framework_examples() {
        let prompts = WeatherTaskExtractionPrompts;
        let examples = prompts.examples();
        assert_eq!(examples.len(), 8);
        assert!(examples[6].retrieved_data[0].content.contains("Home location: San Francisco"));
        let messages = prompts.build(
            &[peregrine_core::Message::user("How's the weather in Prague?")],
            &[],
            chrono::Utc::now().with_timezone(&chrono_tz::UTC),
        );
        let text: String = messages.iter().map(|message| message.content.as_str()).collect();
        assert!(text.contains("weather assistant task extraction specialist"), "{text}");
        assert!(text.contains("Get historical weather conditions for Paris from 3 hours ago"));
        assert!(!text.contains("Convert chat conversations into actionable task descriptions."), "the framework role is replaced");
    }

    #[test]
    fn examples_follow_upstream() {
        let examples = task_extraction_examples();
        assert_eq!(examples.len(), 8);
        assert_eq!(examples.iter().filter(|e| e.depends_on_chat_history).count(), 4);
        assert_eq!(examples.iter().filter(|e| e.depends_on_user_memory).count(), 2);
        assert!(examples.iter().all(|e| e.messages.last().is_some_and(|(role, _)| *role == Role::User)), "each ends with the user");
        assert!(TASK_EXTRACTION_INSTRUCTIONS.starts_with("Your job is to:\n1. "));
    }
}

//! The task-extraction prompt (reference §2.2, §1.10): role, guidelines, few-shot examples, the
//! numbered chat history in the facility's timezone and the retrieved data. Applications change
//! one part by implementing [`TaskExtractionPrompts`] for their own type and overriding only
//! that method.
//!
//! Upstream puts the whole history into the prompt, so a long thread eventually overflows the
//! model's context window on every turn. Here the history is the most recent messages that fit
//! the history budget (`AgentSettings::prompt_history_chars`), numbered by their real position
//! after a `(N earlier messages omitted)` line, always with the latest user message. Messages
//! from another local day show their date as well as their time, so "an hour ago" or
//! "yesterday" resolve correctly in threads spanning days. Unlike upstream, there is no literal
//! "No stored memories" placeholder: retrieved data (user memory included) appears only when a
//! data source returned some.

use chrono::DateTime;
use chrono_tz::Tz;
use peregrine_core::state::{Message, Role};
use peregrine_llm::ChatMessage;

use super::ExtractedTask;
use crate::datasource::RetrievedData;
use crate::history::{DEFAULT_PROMPT_HISTORY_CHARS, HistoryWindow};

/// One message of an example conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleMessage {
    /// Author.
    pub role: Role,
    /// Local time of the message, `HH:MM:SS` as the live history shows it for today's
    /// messages (`YYYY-MM-DD HH:MM:SS` for other days); examples about
    /// temporal references need one, others may leave it out.
    pub time: Option<String>,
    /// Text.
    pub content: String,
}

impl ExampleMessage {
    /// A message without a time.
    pub fn new(role: Role, content: &str) -> Self {
        Self { role, time: None, content: content.into() }
    }

    /// A user message at `time`.
    pub fn user(time: &str, content: &str) -> Self {
        Self { role: Role::User, time: Some(time.into()), content: content.into() }
    }

    /// An assistant message at `time`.
    pub fn assistant(time: &str, content: &str) -> Self {
        Self { role: Role::Assistant, time: Some(time.into()), content: content.into() }
    }
}

/// A few-shot example: a conversation, the data retrieved for it, and the expected answer.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskExtractionExample {
    /// The conversation, oldest first.
    pub history: Vec<ExampleMessage>,
    /// Data retrieved for the conversation (user memory, …), shown as the live prompt shows it.
    pub retrieved_data: Vec<RetrievedData>,
    /// What the model should answer.
    pub expected: ExtractedTask,
}

impl TaskExtractionExample {
    /// The example as it appears in the prompt; the expected output is the JSON the model writes.
    pub fn format_for_prompt(&self) -> String {
        let history = self
            .history
            .iter()
            .enumerate()
            .map(|(index, message)| history_line(index + 1, message.role, message.time.as_deref(), &message.content))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = format!("**Chat History:**\n{history}\n");
        if let Some(data) = format_retrieved_data(&self.retrieved_data) {
            out.push_str(&format!("\n{data}\n"));
        }
        // Field order as in the schema, task first; serializing three plain fields cannot fail.
        let expected = serde_json::to_string(&self.expected).unwrap_or_default();
        out.push_str(&format!("\n**Expected Output:**\n{expected}"));
        out
    }
}

/// How the task-extraction prompt is built; every method has a default, so an application
/// overrides only what it needs (`impl TaskExtractionPrompts for MyPrompts { fn role(..) }`).
pub trait TaskExtractionPrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "Convert chat conversations into actionable task descriptions.".into()
    }

    /// The guidelines.
    fn instructions(&self) -> String {
        [
            "- Extract the single task the user wants accomplished now, from their latest message.",
            "- Write a self-contained task description that can be executed without the conversation.",
            "- Resolve references such as \"that\", \"it\" or \"the second one\" to what they refer to in earlier messages.",
            "- Resolve temporal references (\"an hour ago\", \"yesterday\", \"the last 6 hours\") to concrete times, using the message times and the current time.",
            "- Carry over specific details from previous answers: channel names, values, times, units.",
            "- Set depends_on_chat_history=true only when the task needs information from earlier messages.",
            "- Set depends_on_user_memory=true only when the task directly uses specific information from the retrieved data (such as the user's saved memories).",
            "- Do not invent details that are in neither the conversation nor the retrieved data.",
        ]
        .join("\n")
    }

    /// Few-shot examples, shown in this order.
    fn examples(&self) -> Vec<TaskExtractionExample> {
        default_examples()
    }

    /// The messages of the call; the node calls this, so override it (not [`Self::build`]) to
    /// replace the whole layout.
    fn build_prompt(&self, input: &TaskExtractionInput<'_>) -> Vec<ChatMessage> {
        default_build(self, input)
    }

    /// [`Self::build_prompt`] with the default history budget: `history` is the whole thread,
    /// `retrieved` what the data sources returned, `now` the current time in the facility's
    /// timezone.
    fn build(&self, history: &[Message], retrieved: &[RetrievedData], now: DateTime<Tz>) -> Vec<ChatMessage> {
        self.build_prompt(&TaskExtractionInput { history, retrieved, now, history_chars: DEFAULT_PROMPT_HISTORY_CHARS })
    }
}

/// What the task-extraction prompt is built from.
#[derive(Debug, Clone, Copy)]
pub struct TaskExtractionInput<'a> {
    /// The whole thread, oldest first.
    pub history: &'a [Message],
    /// What the data sources returned.
    pub retrieved: &'a [RetrievedData],
    /// The current time in the facility's timezone.
    pub now: DateTime<Tz>,
    /// The history budget in characters (`AgentSettings::prompt_history_chars`).
    pub history_chars: usize,
}

/// The framework's task-extraction prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultTaskExtractionPrompts;

impl TaskExtractionPrompts for DefaultTaskExtractionPrompts {}

/// The default layout: a system message with role, guidelines, output format and examples, and
/// a user message with the current time, the numbered history (within the budget) and any
/// retrieved data.
pub fn default_build<P: TaskExtractionPrompts + ?Sized>(prompts: &P, input: &TaskExtractionInput<'_>) -> Vec<ChatMessage> {
    let TaskExtractionInput { history, retrieved, now, history_chars } = *input;
    let examples = format_examples(&prompts.examples());
    let mut system = format!(
        "{}\n\nYou analyze a chat history, and any data retrieved for it, and extract the task the user wants done.\n\n\
         ## Guidelines:\n{}\n\n\
         ## Output:\nOne JSON object with the fields \"task\" (string), \"depends_on_chat_history\" (boolean) and \
         \"depends_on_user_memory\" (boolean).",
        prompts.role(),
        prompts.instructions(),
    );
    if !examples.is_empty() {
        system.push_str(&format!("\n\n## Examples:\n{examples}"));
    }
    let mut user = format!(
        "Current time: {} ({})\n\n## Current Chat History:\n{}",
        now.format("%Y-%m-%d %H:%M:%S %Z"),
        now.timezone().name(),
        format_history(history, now, history_chars),
    );
    if let Some(data) = format_retrieved_data(retrieved) {
        user.push_str(&format!("\n\n{data}"));
    }
    user.push_str("\n\nNow extract the task from the latest user message, using the chat history and any retrieved data above.");
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

/// Examples as `## Example N:` blocks separated by blank lines.
pub fn format_examples(examples: &[TaskExtractionExample]) -> String {
    examples
        .iter()
        .enumerate()
        .map(|(index, example)| format!("## Example {}:\n{}", index + 1, example.format_for_prompt()))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The most recent messages that fit `history_chars`, one line per message numbered by its
/// position in the thread: `{i}. USER|ASSISTANT|SYSTEM (HH:MM:SS): content` in `now`'s timezone,
/// `(YYYY-MM-DD HH:MM:SS)` for messages from another local day than `now`'s; preceded by
/// `(N earlier messages omitted)` when earlier messages were left out.
pub fn format_history(messages: &[Message], now: DateTime<Tz>, history_chars: usize) -> String {
    let timezone = now.timezone();
    let today = now.date_naive();
    HistoryWindow::select(messages, history_chars, "\n", |position, message| {
        let local = message.timestamp.with_timezone(&timezone);
        let time = if local.date_naive() == today { local.format("%H:%M:%S") } else { local.format("%Y-%m-%d %H:%M:%S") };
        history_line(position + 1, message.role, Some(&time.to_string()), &message.content)
    })
    .render()
}

fn history_line(number: usize, role: Role, time: Option<&str>, content: &str) -> String {
    let role = match role {
        Role::User => "USER",
        Role::Assistant => "ASSISTANT",
        Role::System => "SYSTEM",
    };
    match time {
        Some(time) => format!("{number}. {role} ({time}): {content}"),
        None => format!("{number}. {role}: {content}"),
    }
}

/// `**Retrieved Data:**` followed by `**<title>:**\n<content>` per source; `None` when no
/// source returned anything (so prompts never carry an empty placeholder).
pub fn format_retrieved_data(retrieved: &[RetrievedData]) -> Option<String> {
    let sections: Vec<String> = retrieved
        .iter()
        .filter(|data| !data.content.trim().is_empty())
        .map(|data| format!("**{}:**\n{}", data.title, data.content.trim()))
        .collect();
    if sections.is_empty() { None } else { Some(format!("**Retrieved Data:**\n{}", sections.join("\n\n"))) }
}

fn task(task: &str, depends_on_chat_history: bool, depends_on_user_memory: bool) -> ExtractedTask {
    ExtractedTask { task: task.into(), depends_on_chat_history, depends_on_user_memory }
}

/// The framework's examples: temporal references, "it"/"that" resolved against earlier
/// answers, a fresh request, general chat, a topic change and retrieved user memory.
pub fn default_examples() -> Vec<TaskExtractionExample> {
    vec![
        TaskExtractionExample {
            history: vec![
                ExampleMessage::user("14:20:11", "What's the beam current in the storage ring right now?"),
                ExampleMessage::assistant("14:20:15", "The storage ring beam current (SR:DCCT:CURRENT) is 500.2 mA, read at 14:20:13."),
                ExampleMessage::user("14:21:02", "And what was it two hours ago?"),
            ],
            retrieved_data: Vec::new(),
            expected: task(
                "Retrieve the archived storage ring beam current (SR:DCCT:CURRENT) at around 12:20 today, two hours before the 14:20 reading of 500.2 mA",
                true,
                false,
            ),
        },
        TaskExtractionExample {
            history: vec![
                ExampleMessage::user("09:02:40", "Find the channels of the horizontal corrector magnets in sector 3"),
                ExampleMessage::assistant(
                    "09:02:52",
                    "I found 4 horizontal corrector setpoints in sector 3: SR03C:HCM1:SP, SR03C:HCM2:SP, SR03C:HCM3:SP and SR03C:HCM4:SP.",
                ),
                ExampleMessage::user("09:05:40", "Plot the second one over the last day"),
            ],
            retrieved_data: Vec::new(),
            expected: task(
                "Plot the archived values of the horizontal corrector setpoint SR03C:HCM2:SP from 09:05 yesterday to 09:05 today",
                true,
                false,
            ),
        },
        TaskExtractionExample {
            history: vec![
                ExampleMessage::user("10:14:03", "What is the voltage setpoint of RF cavity 1?"),
                ExampleMessage::assistant("10:14:09", "The voltage setpoint of RF cavity 1 (SR:RF:CAV1:VOLT:SP) is 1.25 MV."),
                ExampleMessage::user("10:15:30", "Set it to 1.3"),
            ],
            retrieved_data: Vec::new(),
            expected: task("Set the RF cavity 1 voltage setpoint SR:RF:CAV1:VOLT:SP to 1.3 MV (currently 1.25 MV)", true, false),
        },
        TaskExtractionExample {
            history: vec![ExampleMessage::user("16:00:05", "Show me the injector vacuum pressure over the last 6 hours")],
            retrieved_data: Vec::new(),
            expected: task("Retrieve and plot the injector vacuum pressure readings from 10:00 to 16:00 today", false, false),
        },
        TaskExtractionExample {
            history: vec![
                ExampleMessage::user("11:40:00", "What is beam emittance?"),
                ExampleMessage::assistant(
                    "11:40:08",
                    "Beam emittance measures the spread of the particles in position and angle; a smaller emittance means a more parallel, focused beam.",
                ),
                ExampleMessage::user("11:41:15", "How does that relate to brightness?"),
            ],
            retrieved_data: Vec::new(),
            expected: task("Explain how beam emittance relates to the brightness of a synchrotron light source", true, false),
        },
        TaskExtractionExample {
            history: vec![
                ExampleMessage::user("08:30:12", "Plot the beam current for yesterday"),
                ExampleMessage::assistant("08:30:40", "Here is yesterday's beam current: it stayed between 498 and 502 mA apart from a refill at 14:00."),
                ExampleMessage::user("08:32:05", "Thanks! Unrelated question: what can you help me with?"),
            ],
            retrieved_data: Vec::new(),
            expected: task("Explain what this assistant can help with and which capabilities it has", false, false),
        },
        TaskExtractionExample {
            history: vec![ExampleMessage::user("13:10:00", "Has my problem BPM settled down this week?")],
            retrieved_data: vec![RetrievedData {
                source: "user_memory".into(),
                title: "🧠 User Memory".into(),
                content: "(2 saved entries):\n• [2025-01-14 16:42] The BPM I watch: SR01C:BPM4, drifting horizontally since the December shutdown\n\
                          • [2025-01-20 09:10] Prefer plots in mm, not µm"
                    .into(),
            }],
            expected: task(
                "Check whether the horizontal position reading of BPM SR01C:BPM4 has stopped drifting over the past 7 days",
                false,
                true,
            ),
        },
    ]
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn at(hour: u32, minute: u32, second: u32) -> chrono::DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 3, 4, hour, minute, second).single().expect("valid time")
    }

    fn berlin(time: chrono::DateTime<Utc>) -> DateTime<Tz> {
        time.with_timezone(&chrono_tz::Europe::Berlin)
    }

    #[test]
    fn history_is_numbered_in_the_facility_timezone() {
        let messages = vec![
            Message::new(Role::User, "read the beam current", at(13, 0, 1)),
            Message::new(Role::Assistant, "500 mA", at(13, 0, 9)),
            Message::new(Role::User, "plot it", at(13, 2, 0)),
        ];
        assert_eq!(
            format_history(&messages, berlin(at(13, 5, 0)), DEFAULT_PROMPT_HISTORY_CHARS),
            "1. USER (14:00:01): read the beam current\n2. ASSISTANT (14:00:09): 500 mA\n3. USER (14:02:00): plot it"
        );
    }

    #[test]
    fn messages_from_another_local_day_show_their_date() {
        // 23:30 UTC on March 3rd is already March 4th in Berlin: the local day is what counts.
        let late = Utc.with_ymd_and_hms(2025, 3, 3, 23, 30, 0).single().expect("valid time");
        let day_before = Utc.with_ymd_and_hms(2025, 3, 3, 13, 3, 10).single().expect("valid time");
        let messages = vec![
            Message::new(Role::User, "what was the lifetime?", day_before),
            Message::new(Role::Assistant, "10 hours", late),
            Message::new(Role::User, "and an hour ago?", at(13, 2, 0)),
        ];
        assert_eq!(
            format_history(&messages, berlin(at(13, 5, 0)), DEFAULT_PROMPT_HISTORY_CHARS),
            "1. USER (2025-03-03 14:03:10): what was the lifetime?\n2. ASSISTANT (00:30:00): 10 hours\n\
             3. USER (14:02:00): and an hour ago?"
        );
    }

    #[test]
    fn a_long_history_keeps_the_latest_messages_with_their_real_numbers() {
        let mut messages: Vec<Message> =
            (0..40).map(|index| Message::new(Role::User, format!("question {index} {}", "q".repeat(100)), at(12, index, 0))).collect();
        messages.push(Message::new(Role::User, "plot the last one", at(13, 0, 0)));
        let now = berlin(at(13, 5, 0));
        let history = format_history(&messages, now, 500);
        assert!(history.chars().count() < 600, "{history}");
        let lines: Vec<&str> = history.lines().collect();
        assert!(lines[0].ends_with("earlier messages omitted)"), "{history}");
        let omitted: usize = lines[0].trim_start_matches('(').split(' ').next().and_then(|n| n.parse().ok()).expect("a count");
        assert!(lines[1].starts_with(&format!("{}. USER", omitted + 1)), "numbered by real position: {history}");
        assert_eq!(lines.last().copied(), Some("41. USER (14:00:00): plot the last one"));
        assert_eq!(omitted + lines.len() - 1, 41);

        let built =
            DefaultTaskExtractionPrompts.build_prompt(&TaskExtractionInput { history: &messages, retrieved: &[], now, history_chars: 500 });
        assert!(built[1].content.contains(&format!("## Current Chat History:\n({omitted} earlier messages omitted)\n{}.", omitted + 1)));
        assert!(!built[1].content.contains("question 0 "));
    }

    #[test]
    fn a_huge_request_is_cut_and_the_default_build_keeps_the_default_budget() {
        let huge = "x".repeat(DEFAULT_PROMPT_HISTORY_CHARS * 2);
        let messages = vec![Message::new(Role::Assistant, "hello", at(12, 0, 0)), Message::new(Role::User, huge.as_str(), at(13, 0, 0))];
        let built = DefaultTaskExtractionPrompts.build(&messages, &[], berlin(at(13, 5, 0)));
        let user = &built[1].content;
        assert!(user.contains("(1 earlier message omitted)\n2. USER (14:00:00): xxx"), "the request stays, cut");
        assert!(user.contains("[message truncated: the first "), "a marker says it was cut");
        assert!(user.chars().count() < DEFAULT_PROMPT_HISTORY_CHARS + 1_000, "{} characters", user.chars().count());
    }

    #[test]
    fn retrieved_data_appears_only_when_there_is_some() {
        assert_eq!(format_retrieved_data(&[]), None);
        let blank = RetrievedData { source: "memory".into(), title: "🧠 User Memory".into(), content: "  ".into() };
        assert_eq!(format_retrieved_data(&[blank]), None);
        let memory = RetrievedData { source: "memory".into(), title: "🧠 User Memory".into(), content: "• likes BPMs".into() };
        assert_eq!(format_retrieved_data(&[memory]).as_deref(), Some("**Retrieved Data:**\n**🧠 User Memory:**\n• likes BPMs"));
    }

    #[test]
    fn examples_show_history_and_the_expected_json() {
        let examples = default_examples();
        assert!(examples.len() >= 6);
        let text = format_examples(&examples);
        assert!(text.starts_with("## Example 1:\n**Chat History:**\n1. USER (14:20:11): What's the beam current"));
        assert!(text.contains("\"depends_on_chat_history\":true"));
        assert!(text.contains("**🧠 User Memory:**"));
        assert!(!text.contains("No stored memories"));
        let untimed = TaskExtractionExample {
            history: vec![ExampleMessage::new(Role::User, "What's the weather in Paris?")],
            retrieved_data: Vec::new(),
            expected: task("Report the current weather in Paris", false, false),
        };
        assert_eq!(
            untimed.format_for_prompt(),
            "**Chat History:**\n1. USER: What's the weather in Paris?\n\n**Expected Output:**\n\
             {\"task\":\"Report the current weather in Paris\",\"depends_on_chat_history\":false,\"depends_on_user_memory\":false}"
        );
    }

    #[test]
    fn default_prompt_has_role_examples_time_and_history() {
        let now = Utc.with_ymd_and_hms(2025, 3, 4, 13, 5, 0).single().expect("valid time").with_timezone(&chrono_tz::Europe::Berlin);
        let messages = vec![Message::new(Role::User, "What is the RF frequency?", at(13, 4, 59))];
        let built = DefaultTaskExtractionPrompts.build(&messages, &[], now);
        assert_eq!(built.len(), 2);
        assert!(built[0].content.starts_with("Convert chat conversations into actionable task descriptions."));
        assert!(built[0].content.contains("## Examples:\n## Example 1:"));
        assert!(built[1].content.starts_with("Current time: 2025-03-04 14:05:00 CET (Europe/Berlin)"));
        assert!(built[1].content.contains("## Current Chat History:\n1. USER (14:04:59): What is the RF frequency?"));
        assert!(!built[1].content.contains("Retrieved Data"));
        assert!(!built[1].content.contains("No stored memories"));
    }
}

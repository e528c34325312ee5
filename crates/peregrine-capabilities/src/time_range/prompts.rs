//! The time-range capability's prompts and guides. The parsing prompt states the current time,
//! weekday and zone of the facility and worked examples computed from them, so the model
//! writes local wall-clock times; the orchestrator guide asks for context keys named after the
//! range (`tr_0301_0308`) so later turns reuse the right one (upstream #75).

use chrono::{DateTime, Duration, NaiveDateTime};
use chrono_tz::Tz;
use peregrine_core::{ClassifierExample, ClassifierGuide, OrchestratorExample, OrchestratorGuide, PlannedStep};
use peregrine_llm::ChatMessage;

/// The time-range capability's prompts; every method has a default.
pub trait TimeRangePrompts: Send + Sync + 'static {
    /// When the classifier selects `time_range_parsing`.
    fn classifier_guide(&self) -> ClassifierGuide {
        default_classifier_guide()
    }

    /// How the orchestrator plans `time_range_parsing` steps.
    fn orchestrator_guide(&self) -> OrchestratorGuide {
        default_orchestrator_guide()
    }

    /// The `TimeRangeOutput` call for `query`, with `now` in the facility's zone.
    fn parsing_messages(&self, query: &str, now: &DateTime<Tz>) -> Vec<ChatMessage> {
        default_parsing_messages(query, now)
    }
}

/// The default prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultTimeRangePrompts;

impl TimeRangePrompts for DefaultTimeRangePrompts {}

fn example(query: &str, result: bool, reason: &str) -> ClassifierExample {
    ClassifierExample { query: query.into(), result, reason: reason.into() }
}

/// The default classifier guide.
pub fn default_classifier_guide() -> ClassifierGuide {
    ClassifierGuide {
        instructions: "Determine if the task involves time-based data that needs a time range parsed from the user's words \
                       (relative like 'last 2 hours', named like 'yesterday', or explicit dates)."
            .into(),
        examples: vec![
            example("Which tools do you have?", false, "A question about the assistant, no time range"),
            example("Plot the beam current for the last 2 hours", true, "'last 2 hours' must be parsed"),
            example("What is the current beam energy?", false, "A current value, no time range"),
            example("Show me vacuum trends from yesterday", true, "'yesterday' must be parsed"),
            example("Get archived data from 2025-01-15 09:00 to 2025-01-15 21:00", true, "An explicit range to validate"),
            example("Show recent trends", true, "'recent' implies a short range ending now"),
            example("How does the accelerator work?", false, "A general question, no time data"),
        ],
        actions_if_true: None,
    }
}

fn planned(context_key: &str, objective: &str) -> PlannedStep {
    PlannedStep {
        context_key: context_key.into(),
        capability: super::TIME_RANGE_CAPABILITY.into(),
        task_objective: objective.into(),
        success_criteria: "Time range parsed into timezone-aware start and end datetimes".into(),
        expected_output: Some(super::TIME_RANGE.into()),
        parameters: None,
        inputs: Vec::new(),
    }
}

/// The default orchestrator guide (priority 5).
pub fn default_orchestrator_guide() -> OrchestratorGuide {
    OrchestratorGuide {
        instructions: "**When to plan \"time_range_parsing\" steps:**\n\
            - When a task needs time-based data (historical trends, archiver data, logs)\n\
            - When the request contains a time reference to turn into absolute datetimes\n\
            - As an early step, before the capabilities that consume a TIME_RANGE\n\n\
            **Context keys name the range they hold:** `tr_<start MMDD>_<end MMDD>` for dates \
            (e.g. `tr_0301_0308` for March 1 to March 8), or a short description for relative ranges \
            (`tr_last_2h`, `tr_yesterday`). Never give a different range an existing key.\n\n\
            **Reusing ranges across turns:** reuse an existing TIME_RANGE only when it is exactly the range the \
            current request asks for. A request for another period (other dates, or 'last 2 hours' asked again \
            later) gets a new time_range_parsing step with its own key.\n\n\
            **Output: TIME_RANGE** — `start_date` and `end_date` (RFC 3339 with the facility's UTC offset) and \
            `timezone_name` (IANA, e.g. America/Los_Angeles).\n\
            Write the task_objective so it contains the user's time expression verbatim."
            .into(),
        examples: vec![
            OrchestratorExample {
                step: planned("tr_last_2h", "Parse 'the last 2 hours' into absolute datetimes"),
                scenario_description: "A relative time reference ('last hour', 'yesterday')".into(),
                context_requirements: None,
                notes: Some("Stored as TIME_RANGE under a key describing the range.".into()),
            },
            OrchestratorExample {
                step: planned("tr_0301_0308", "Parse the range 'March 1 to March 8' into absolute datetimes"),
                scenario_description: "Explicit dates; the key carries the dates so later turns can tell ranges apart".into(),
                context_requirements: None,
                notes: Some("If the user later asks about March 10 to 12, plan a new step `tr_0310_0312`.".into()),
            },
            OrchestratorExample {
                step: planned("tr_recent_5min", "Infer a range for 'current trend' data (the last 5 minutes)"),
                scenario_description: "'current' or 'recent' data requests".into(),
                context_requirements: None,
                notes: Some("A short range ending now.".into()),
            },
        ],
        priority: 5,
    }
}

const LOCAL_FORMAT: &str = "%Y-%m-%d %H:%M:%S";

fn local(time: NaiveDateTime) -> String {
    time.format(LOCAL_FORMAT).to_string()
}

/// The default parsing prompt: role, rules, the facility's current time and zone, and worked
/// examples computed from them (hours are counted in real elapsed time, days and weeks on the
/// local calendar).
pub fn default_parsing_messages(query: &str, now: &DateTime<Tz>) -> Vec<ChatMessage> {
    let zone = now.timezone().name();
    let wall = now.naive_local();
    let current = local(wall);
    let two_hours_ago = local((*now - Duration::hours(2)).naive_local());
    let day_ago = local((*now - Duration::hours(24)).naive_local());
    let two_weeks_ago = local(wall - Duration::days(14));
    let yesterday = (wall - Duration::days(1)).date();
    let system = format!(
        "You are an expert time range parser. Convert the time reference in the user's query into an absolute range.\n\n\
         Current time at the facility:\n\
         - Current datetime: {current} (local time)\n\
         - Current weekday: {weekday}\n\
         - Timezone: {zone} (UTC{offset} now)\n\n\
         RULES:\n\
         - Write start_date and end_date as 'YYYY-MM-DD HH:MM:SS' in the facility's local time ({zone}); do not convert to UTC.\n\
         - Only if the user states another zone (e.g. UTC), write that time in ISO 8601 with its offset, e.g. 2025-03-10T17:00:00Z.\n\
         - start_date MUST be before end_date.\n\
         - Never use a year after {year}.\n\
         - For 'last/past X hours/days', end_date is now and start_date is X earlier.\n\
         - 'yesterday' is the previous local day from 00:00:00 to 23:59:59; 'today' runs from 00:00:00 to now.\n\
         - 'current'/'recent' data means the last few minutes.\n\
         - Set found=true when you identified a time range; found=false when the query has no time reference \
         (then put the current datetime in both fields).\n\n\
         EXAMPLES (now is {current}):\n\
         - \"last 2 hours\" → start_date: \"{two_hours_ago}\", end_date: \"{current}\"\n\
         - \"yesterday\" → start_date: \"{yesterday} 00:00:00\", end_date: \"{yesterday} 23:59:59\"\n\
         - \"last 24 hours\" → start_date: \"{day_ago}\", end_date: \"{current}\"\n\
         - \"past 2 weeks\" → start_date: \"{two_weeks_ago}\", end_date: \"{current}\"",
        weekday = now.format("%A"),
        offset = now.format("%:z"),
        year = now.format("%Y"),
    );
    vec![ChatMessage::system(system), ChatMessage::user(format!("User query to parse: {query}"))]
}

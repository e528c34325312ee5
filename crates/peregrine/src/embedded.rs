//! What the embedded defaults change for the small local model: a short response prompt. The
//! framework's response prompt (role, sections, a dozen numbered guidelines) is written for
//! capable models; the embedded 135M-parameter model loses the question in it and loops on the
//! guidelines' wording. A short instruction, the last exchanges and the question last keep it on
//! the question.

use peregrine_agent::respond::{ResponseContext, ResponsePrompts};

/// Earlier messages shown before the question.
const EARLIER_MESSAGES: usize = 4;

const INSTRUCTION: &str = "You are a helpful assistant in the control room of a particle accelerator facility. Answer the \
                           question in two or three plain sentences. If you do not know, say so; never invent measured values.";

/// The response prompt of the embedded defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct CompactResponsePrompts;

impl ResponsePrompts for CompactResponsePrompts {
    fn build(&self, context: &ResponseContext) -> String {
        let mut messages = conversation(&context.current_task);
        let Some(question) = messages.iter().rposition(|(user, _)| *user).map(|index| messages.remove(index).1) else {
            // Not a history (task extraction ran): the task is the question.
            return format!("{INSTRUCTION}\n\nQuestion: {}", context.current_task.trim());
        };
        let earlier: Vec<String> = messages
            .iter()
            .rev()
            .take(EARLIER_MESSAGES)
            .rev()
            .map(|(user, text)| format!("{}: {text}", if *user { "User" } else { "Assistant" }))
            .collect();
        if earlier.is_empty() {
            format!("{INSTRUCTION}\n\nQuestion: {question}")
        } else {
            format!("{INSTRUCTION}\n\nEarlier conversation:\n{}\n\nQuestion: {question}", earlier.join("\n"))
        }
    }
}

/// The user and assistant messages of a bypassed task (`N. USER (HH:MM:SS): text` lines, text
/// possibly spanning lines), in order; `(is_user, text)`.
fn conversation(task: &str) -> Vec<(bool, String)> {
    let mut messages: Vec<(bool, String)> = Vec::new();
    let mut in_history = false;
    for line in task.lines() {
        match history_line(line) {
            Some((role, text)) => {
                in_history = true;
                match role {
                    "USER" => messages.push((true, text.to_owned())),
                    "ASSISTANT" => messages.push((false, text.to_owned())),
                    _ => {}
                }
            }
            None if in_history => {
                if let Some((_, text)) = messages.last_mut() {
                    text.push('\n');
                    text.push_str(line);
                }
            }
            None => {}
        }
    }
    messages
}

/// `(role, text)` of a `N. ROLE (time): text` line.
fn history_line(line: &str) -> Option<(&str, &str)> {
    let (number, rest) = line.split_once(". ")?;
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let (role, rest) = rest.split_once(' ')?;
    if !matches!(role, "USER" | "ASSISTANT" | "SYSTEM") {
        return None;
    }
    let text = rest.strip_prefix('(')?.split_once("): ")?.1;
    Some((role, text))
}

#[cfg(test)]
mod tests {
    use peregrine_agent::respond::{ArtifactSummary, Interface, ResponseMode};

    use super::*;

    fn context(task: &str) -> ResponseContext {
        ResponseContext {
            current_task: task.to_owned(),
            mode: ResponseMode::Conversational,
            relevant_context: Vec::new(),
            execution_history: Vec::new(),
            capabilities_overview: None,
            chat_history: None,
            current_datetime: String::new(),
            data_timezone: None,
            interface: Interface::Cli,
            artifacts: ArtifactSummary::default(),
        }
    }

    #[test]
    fn the_last_user_message_is_the_question_and_comes_last() {
        let task = "Chat history:\n1. USER (10:00:00): What does a BPM measure?\n2. ASSISTANT (10:00:01): The beam position.\n\
                    It is read out in mm.\n3. USER (10:01:00): And a quadrupole?";
        let prompt = CompactResponsePrompts.build(&context(task));
        assert!(prompt.ends_with("Question: And a quadrupole?"), "{prompt}");
        assert!(prompt.contains("User: What does a BPM measure?\nAssistant: The beam position.\nIt is read out in mm."), "{prompt}");
        assert!(prompt.starts_with(INSTRUCTION));
    }

    #[test]
    fn a_plain_task_is_the_question_and_old_messages_are_left_out() {
        assert!(CompactResponsePrompts.build(&context("Explain the RF system")).ends_with("Question: Explain the RF system"));
        let task: String = (1..=9).map(|n| format!("{n}. {} (10:00:00): m{n}\n", if n % 2 == 1 { "USER" } else { "ASSISTANT" })).collect();
        let prompt = CompactResponsePrompts.build(&context(&task));
        assert!(!prompt.contains("m4\n") && prompt.contains("User: m5\nAssistant: m6\nUser: m7\nAssistant: m8"), "{prompt}");
        assert!(prompt.ends_with("Question: m9"), "{prompt}");
    }
}

//! What a turn's events become in an answer: status lines while the agent works (`> planning…`),
//! the streamed answer tokens, and the token usage of the turn's LLM calls.

use peregrine_agent::{CLASSIFIER, ERROR, ORCHESTRATOR, TASK_EXTRACTION};
use peregrine_core::AgentEvent;
use peregrine_core::events::EventKind;
use peregrine_graph::RunEvent;

/// Token counts of a turn, summed over its LLM calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// The OpenAI `usage` object.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// Follows one turn's events.
#[derive(Debug, Default)]
pub(crate) struct TurnTrace {
    status_lines: bool,
    last_status: Option<String>,
    status_shown: bool,
    /// The answer tokens streamed so far.
    pub answer: String,
    /// The usage so far.
    pub usage: Usage,
}

impl TurnTrace {
    /// A trace that writes status lines when `status_lines`.
    pub(crate) fn new(status_lines: bool) -> Self {
        Self { status_lines, ..Self::default() }
    }

    /// The content pieces `event` adds to the answer (status lines, the blank line that ends
    /// them, answer tokens); also counts usage.
    pub(crate) fn observe(&mut self, event: &RunEvent<AgentEvent>) -> Vec<String> {
        match event {
            RunEvent::NodeStarted { node, .. } => self.status(node_status(node)),
            RunEvent::Custom(event) => match &event.kind {
                EventKind::CapabilityStart { capability_name, step_number, total_steps, .. } => {
                    self.status(Some(format!("step {step_number}/{total_steps} {capability_name}")))
                }
                EventKind::LlmResponse { input_tokens, output_tokens, .. } => {
                    self.usage.prompt_tokens += input_tokens.unwrap_or(0);
                    self.usage.completion_tokens += output_tokens.unwrap_or(0);
                    Vec::new()
                }
                EventKind::LlmToken { content, .. } if !content.is_empty() => {
                    let mut pieces = Vec::new();
                    if self.answer.is_empty() && self.status_shown {
                        pieces.push("\n".to_owned());
                    }
                    self.answer.push_str(content);
                    pieces.push(content.clone());
                    pieces
                }
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// A status line when it differs from the last one and no answer has started.
    fn status(&mut self, status: Option<String>) -> Vec<String> {
        let Some(status) = status else { return Vec::new() };
        if !self.status_lines || !self.answer.is_empty() || self.last_status.as_deref() == Some(status.as_str()) {
            return Vec::new();
        }
        let line = format!("> {status}…\n");
        self.last_status = Some(status);
        self.status_shown = true;
        vec![line]
    }

    /// The content that ends the answer: the turn's response text when it was not streamed
    /// (error reports, approval prompts, replies) or differs from what was (always for a failed turn).
    pub(crate) fn closing_text(&self, response: Option<&str>, failed: bool) -> Option<String> {
        let response = response.filter(|text| !text.trim().is_empty())?;
        let already_shown = !self.answer.trim().is_empty() && self.answer.trim() == response.trim();
        if already_shown && !failed {
            return None;
        }
        let separator = if !self.answer.is_empty() {
            "\n\n"
        } else if self.status_shown {
            "\n"
        } else {
            ""
        };
        Some(format!("{separator}{response}"))
    }
}

/// The status of a framework node starting (capability steps have their own event).
fn node_status(node: &str) -> Option<String> {
    let status = match node {
        TASK_EXTRACTION => "understanding the request",
        CLASSIFIER => "choosing capabilities",
        ORCHESTRATOR => "planning",
        ERROR => "analysing the error",
        _ => return None,
    };
    Some(status.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom(kind: EventKind) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new("test", kind))
    }

    fn node(name: &str) -> RunEvent<AgentEvent> {
        RunEvent::NodeStarted { node: name.into(), step: 1 }
    }

    fn token(text: &str) -> RunEvent<AgentEvent> {
        custom(EventKind::LlmToken { role: "response".into(), content: text.into() })
    }

    fn step(number: usize) -> RunEvent<AgentEvent> {
        custom(EventKind::CapabilityStart {
            capability_name: "current_weather".into(),
            step_number: number,
            total_steps: 2,
            description: String::new(),
        })
    }

    #[test]
    fn status_lines_then_a_blank_line_then_the_answer() {
        let mut trace = TurnTrace::new(true);
        let events =
            [node(TASK_EXTRACTION), node(ORCHESTRATOR), node(ORCHESTRATOR), node("current_weather"), step(1), token("Hi"), token(" there")];
        let pieces: Vec<String> = events.iter().flat_map(|event| trace.observe(event)).collect();
        assert_eq!(pieces, ["> understanding the request…\n", "> planning…\n", "> step 1/2 current_weather…\n", "\n", "Hi", " there"]);
        assert_eq!(trace.answer, "Hi there");
        assert_eq!(trace.observe(&node(ERROR)), Vec::<String>::new(), "no status inside the answer");
        assert_eq!(trace.closing_text(Some("Hi there"), false), None);
        assert_eq!(trace.closing_text(Some("Report"), true).as_deref(), Some("\n\nReport"));
    }

    #[test]
    fn without_status_lines_only_tokens_and_usage() {
        let mut trace = TurnTrace::new(false);
        let response = |input, output| {
            custom(EventKind::LlmResponse {
                role: "x".into(),
                success: true,
                response_preview: String::new(),
                response_length: 0,
                input_tokens: input,
                output_tokens: output,
                duration_ms: 0,
            })
        };
        let events = [node(ORCHESTRATOR), step(1), response(Some(10), Some(2)), response(Some(5), None), token("A")];
        let pieces: Vec<String> = events.iter().flat_map(|event| trace.observe(event)).collect();
        assert_eq!(pieces, ["A"]);
        assert_eq!(trace.usage, Usage { prompt_tokens: 15, completion_tokens: 2 });
        assert_eq!(trace.usage.json()["total_tokens"], 17);
        let quiet = TurnTrace::new(false);
        assert_eq!(quiet.closing_text(Some("Approve?"), false).as_deref(), Some("Approve?"));
        assert_eq!(quiet.closing_text(None, false), None);
    }
}

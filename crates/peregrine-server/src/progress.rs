//! What a turn's events become in an answer: progress while the agent works (`planning…`, as
//! reasoning or as content lines, per [`StatusLines`]), the streamed answer tokens (a stream cut
//! and retried is noted, not repeated), the text that opens the answer (the invisible mark of a
//! conversation known by its nonce, its first paragraph), and the token usage of the turn's LLM
//! calls.

use peregrine_agent::{AnswerStream, StreamStep};
use peregrine_core::AgentEvent;
use peregrine_core::events::EventKind;
use peregrine_graph::RunEvent;
use serde::de::{self, Deserializer, Visitor};

/// Sent when a streamed answer broke after some text: that text stays on screen, the answer
/// that follows replaces it.
pub(crate) const CUT_NOTE: &str = "\n\n_(the answer was cut off)_\n\n";
/// Sent when the answer's caller asks again after some text without reporting a failure first.
pub(crate) const RETRY_NOTE: &str = "\n\n_(the answer was cut off; trying again)_\n\n";

/// Where a stream shows what the agent is doing before it answers (`server.status_lines`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusLines {
    /// As `reasoning_content` deltas (`planning…`, `step 1/2 current_weather…`, a line each):
    /// Open WebUI shows them live in a collapsible reasoning block and keeps them out of the
    /// answer's text (it neither resends them nor quotes them in titles, tags or the clipboard);
    /// clients that do not know the field ignore it and see only the answer.
    #[default]
    Reasoning,
    /// As lines of the content before the answer (`> planning…`, then a blank line): every client
    /// shows them, and keeps them as part of the answer (Open WebUI resends them with the history,
    /// quotes them in its title and tag prompts and copies them with the answer).
    Content,
    /// Not shown.
    Off,
}

impl StatusLines {
    /// The configuration word: `reasoning`, `content` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reasoning => "reasoning",
            Self::Content => "content",
            Self::Off => "off",
        }
    }

    /// The mode a configuration word names (case aside): `reasoning`, `content` or `off`, and the
    /// booleans of earlier configurations (`true`, `yes`, `on` are `reasoning`; `false`, `no`,
    /// `off` are `off`).
    pub fn from_word(word: &str) -> Option<Self> {
        match word.trim().to_ascii_lowercase().as_str() {
            "reasoning" | "true" | "yes" | "on" => Some(Self::Reasoning),
            "content" => Some(Self::Content),
            "off" | "false" | "no" => Some(Self::Off),
            _ => None,
        }
    }
}

impl From<bool> for StatusLines {
    /// `true` (progress shown) is the default, [`StatusLines::Reasoning`]; `false` is
    /// [`StatusLines::Off`].
    fn from(shown: bool) -> Self {
        if shown { Self::Reasoning } else { Self::Off }
    }
}

impl<'de> serde::Deserialize<'de> for StatusLines {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Words;
        impl Visitor<'_> for Words {
            type Value = StatusLines;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("one of reasoning, content, off (or true / false)")
            }

            fn visit_bool<E: de::Error>(self, shown: bool) -> Result<StatusLines, E> {
                Ok(shown.into())
            }

            fn visit_str<E: de::Error>(self, word: &str) -> Result<StatusLines, E> {
                StatusLines::from_word(word).ok_or_else(|| E::invalid_value(de::Unexpected::Str(word), &self))
            }
        }
        deserializer.deserialize_any(Words)
    }
}

/// A piece of a streamed answer: answer text, or progress shown as reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Part of the content (the answer, the opening, notes, content status lines).
    Content(String),
    /// Progress as `reasoning_content`.
    Reasoning(String),
}

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
    status_lines: StatusLines,
    last_status: Option<String>,
    /// The last content sent was a status line: an answer starts after a blank line.
    after_status: bool,
    /// Whether any content was sent.
    sent_any: bool,
    /// How many line breaks the content sent so far ends with (at most 2).
    trailing_newlines: usize,
    /// The text that opens the answer, until it is sent.
    opening: Option<String>,
    /// The answer streamed so far, across cuts and retries.
    stream: AnswerStream,
    /// The usage so far.
    pub usage: Usage,
}

impl TurnTrace {
    /// A trace that shows progress as `status_lines` says, and opens the answer with `opening`
    /// (see [`TurnTrace::opening`]).
    pub(crate) fn new(status_lines: StatusLines, opening: Option<String>) -> Self {
        Self { status_lines, opening, ..Self::default() }
    }

    /// The content that opens the answer before any event: for a conversation known by its
    /// mark, the mark followed by a blank line (an invisible first paragraph, so that the
    /// answer's markdown begins a block of its own and an answer stopped at any moment holds the
    /// mark); nothing without an opening.
    pub(crate) fn opening(&mut self) -> Vec<Piece> {
        match self.opening.take() {
            Some(text) if !text.is_empty() => self.deliver(text),
            _ => Vec::new(),
        }
    }

    /// The pieces `event` adds to the answer (progress, the blank line that ends content status
    /// lines, answer tokens, a note when the answer's stream broke); also counts usage.
    pub(crate) fn observe(&mut self, event: &RunEvent<AgentEvent>) -> Vec<Piece> {
        match event {
            RunEvent::NodeStarted { node, .. } => self.status(node_status(node)),
            RunEvent::Custom(event) => {
                match &event.kind {
                    EventKind::CapabilityStart { capability_name, step_number, total_steps, .. } => {
                        return self.status(Some(format!("step {step_number}/{total_steps} {capability_name}")));
                    }
                    EventKind::LlmResponse { input_tokens, output_tokens, .. } => {
                        self.usage.prompt_tokens += input_tokens.unwrap_or(0);
                        self.usage.completion_tokens += output_tokens.unwrap_or(0);
                    }
                    EventKind::LlmToken { content, .. } if content.is_empty() => return Vec::new(),
                    _ => {}
                }
                match self.stream.observe(event) {
                    StreamStep::Token => {
                        let EventKind::LlmToken { content, .. } = &event.kind else { return Vec::new() };
                        let mut pieces = Vec::new();
                        if self.after_status {
                            pieces.extend(self.deliver("\n".to_owned()));
                        }
                        pieces.extend(self.deliver(content.clone()));
                        pieces
                    }
                    StreamStep::Cut => self.deliver(CUT_NOTE.to_owned()),
                    StreamStep::Restart { after_cut: false } => self.deliver(RETRY_NOTE.to_owned()),
                    StreamStep::Restart { after_cut: true } | StreamStep::Other => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    /// A status line when it differs from the last one and no answer is under way: a line of
    /// reasoning, or a `> …` line of the content.
    fn status(&mut self, status: Option<String>) -> Vec<Piece> {
        let Some(status) = status else { return Vec::new() };
        if self.status_lines == StatusLines::Off || !self.stream.text().is_empty() || self.last_status.as_deref() == Some(status.as_str()) {
            return Vec::new();
        }
        let line = format!("{status}…\n");
        self.last_status = Some(status);
        if self.status_lines == StatusLines::Reasoning {
            return vec![Piece::Reasoning(line)];
        }
        let pieces = self.deliver(format!("> {line}"));
        self.after_status = true;
        pieces
    }

    /// `piece` as content, as it is sent; notes how the content now ends.
    fn deliver(&mut self, piece: String) -> Vec<Piece> {
        self.after_status = false;
        self.sent_any = true;
        let newlines = piece.chars().rev().take_while(|c| *c == '\n').count();
        self.trailing_newlines =
            if newlines == piece.chars().count() { (self.trailing_newlines + newlines).min(2) } else { newlines.min(2) };
        vec![Piece::Content(piece)]
    }

    /// The content that ends the answer: the turn's response text when it was not streamed
    /// (error reports, approval prompts, replies) or differs from what was (always for a failed
    /// turn), after a blank line.
    pub(crate) fn closing_text(&mut self, response: Option<&str>, failed: bool) -> Option<String> {
        let response = response.filter(|text| !text.trim().is_empty());
        let already_shown = response.is_some_and(|text| !self.stream.text().trim().is_empty() && self.stream.text().trim() == text.trim());
        let response = response.filter(|_| failed || !already_shown)?;
        let separator = match (self.sent_any, self.trailing_newlines) {
            (false, _) | (true, 2..) => "",
            (true, 1) => "\n",
            (true, _) => "\n\n",
        };
        let text = format!("{separator}{response}");
        self.deliver(text.clone());
        Some(text)
    }
}

/// The status of a framework node starting (capability steps have their own event; the answer
/// nodes show their answer instead).
fn node_status(node: &str) -> Option<String> {
    if node == peregrine_core::plan::RESPOND || node == peregrine_core::plan::CLARIFY {
        return None;
    }
    peregrine_agent::wire::node_activity(node).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use peregrine_agent::{ERROR, ORCHESTRATOR, TASK_EXTRACTION};

    use super::*;

    fn custom(kind: EventKind) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new("respond", kind))
    }

    fn node(name: &str) -> RunEvent<AgentEvent> {
        RunEvent::NodeStarted { node: name.into(), step: 1 }
    }

    fn token(text: &str) -> RunEvent<AgentEvent> {
        custom(EventKind::LlmToken { role: "response".into(), content: text.into() })
    }

    fn request(component: &str) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new(
            component,
            EventKind::LlmRequest {
                role: "response".into(),
                schema: None,
                prompt_preview: String::new(),
                prompt_length: 0,
                model: "m".into(),
                provider: "p".into(),
            },
        ))
    }

    fn response(component: &str, success: bool, tokens: Option<u64>) -> RunEvent<AgentEvent> {
        RunEvent::Custom(AgentEvent::new(
            component,
            EventKind::LlmResponse {
                role: "response".into(),
                success,
                response_preview: String::new(),
                response_length: 0,
                input_tokens: tokens,
                output_tokens: tokens.map(|tokens| tokens / 5),
                duration_ms: 0,
            },
        ))
    }

    fn step(number: usize) -> RunEvent<AgentEvent> {
        custom(EventKind::CapabilityStart {
            capability_name: "current_weather".into(),
            step_number: number,
            total_steps: 2,
            description: String::new(),
        })
    }

    /// What `events` add, content as it is and reasoning prefixed with `reasoning: `.
    fn content(trace: &mut TurnTrace, events: &[RunEvent<AgentEvent>]) -> Vec<String> {
        events.iter().flat_map(|event| trace.observe(event)).map(shown).collect()
    }

    fn shown(piece: Piece) -> String {
        match piece {
            Piece::Content(text) => text,
            Piece::Reasoning(text) => format!("reasoning: {text}"),
        }
    }

    #[test]
    fn status_lines_then_a_blank_line_then_the_answer() {
        let mut trace = TurnTrace::new(StatusLines::Content, None);
        assert!(trace.opening().is_empty());
        let events =
            [node(TASK_EXTRACTION), node(ORCHESTRATOR), node(ORCHESTRATOR), node("current_weather"), step(1), token("Hi"), token(" there")];
        let pieces = content(&mut trace, &events);
        assert_eq!(pieces, ["> understanding the request…\n", "> planning…\n", "> step 1/2 current_weather…\n", "\n", "Hi", " there"]);
        assert_eq!(trace.stream.text(), "Hi there");
        assert!(trace.observe(&node(ERROR)).is_empty(), "no status inside the answer");
        assert_eq!(trace.closing_text(Some("Hi there"), false), None);
        assert_eq!(trace.closing_text(Some("Report"), true).as_deref(), Some("\n\nReport"));
        let mut prompt = TurnTrace::new(StatusLines::Content, None);
        content(&mut prompt, &[node(ORCHESTRATOR)]);
        assert_eq!(prompt.closing_text(Some("Approve?"), false).as_deref(), Some("\nApprove?"), "a blank line after the status lines");
    }

    #[test]
    fn progress_as_reasoning_keeps_the_content_to_the_mark_and_the_answer() {
        const MARK: &str = "\u{2060}\u{200B}\u{200C}";
        let mut trace = TurnTrace::new(StatusLines::Reasoning, Some(format!("{MARK}\n\n")));
        assert_eq!(trace.opening(), [Piece::Content(format!("{MARK}\n\n"))], "the mark first, so a stopped answer holds it");
        let events =
            [node(TASK_EXTRACTION), node(ORCHESTRATOR), node(ORCHESTRATOR), node("current_weather"), step(1), token("Hi"), token(" there")];
        let pieces = content(&mut trace, &events);
        assert_eq!(
            pieces,
            ["reasoning: understanding the request…\n", "reasoning: planning…\n", "reasoning: step 1/2 current_weather…\n", "Hi", " there"],
            "no blank line before the answer: the content holds nothing but it"
        );
        assert!(trace.observe(&node(ERROR)).is_empty(), "no progress inside the answer");
        assert_eq!(trace.closing_text(Some("Hi there"), false), None);

        // A reply that streamed nothing follows the mark's blank line directly.
        let mut prompt = TurnTrace::new(StatusLines::Reasoning, Some(format!("{MARK}\n\n")));
        prompt.opening();
        assert_eq!(content(&mut prompt, &[node(ORCHESTRATOR)]), ["reasoning: planning…\n"]);
        assert_eq!(prompt.closing_text(Some("Approve?"), false).as_deref(), Some("Approve?"));
        // Without a mark the reasoning comes first and the content is the answer alone.
        let mut unmarked = TurnTrace::new(StatusLines::Reasoning, None);
        assert!(unmarked.opening().is_empty());
        assert_eq!(content(&mut unmarked, &[node(ORCHESTRATOR), token("A")]), ["reasoning: planning…\n", "A"]);
    }

    #[test]
    fn status_lines_are_read_from_words_and_from_the_old_booleans() {
        let read = |yaml: &str| serde_json::from_str::<StatusLines>(yaml).map_err(|error| error.to_string());
        assert_eq!(read(r#""reasoning""#), Ok(StatusLines::Reasoning));
        assert_eq!(read(r#""Content""#), Ok(StatusLines::Content));
        assert_eq!(read(r#""off""#), Ok(StatusLines::Off));
        assert_eq!(read("true"), Ok(StatusLines::Reasoning), "true, the old default, is the new default");
        assert_eq!(read("false"), Ok(StatusLines::Off));
        assert!(read(r#""sometimes""#).is_err_and(|error| error.contains("reasoning, content, off")));
        assert_eq!(StatusLines::default(), StatusLines::Reasoning);
        for mode in [StatusLines::Reasoning, StatusLines::Content, StatusLines::Off] {
            assert_eq!(StatusLines::from_word(mode.as_str()), Some(mode));
        }
    }

    #[test]
    fn without_status_lines_only_tokens_and_usage() {
        let mut trace = TurnTrace::new(StatusLines::Off, None);
        let events = [node(ORCHESTRATOR), step(1), response("orchestrator", true, Some(10)), response("x", true, None), token("A")];
        assert_eq!(content(&mut trace, &events), ["A"]);
        assert_eq!(trace.usage, Usage { prompt_tokens: 10, completion_tokens: 2 });
        assert_eq!(trace.usage.json()["total_tokens"], 12);
        let mut quiet = TurnTrace::new(StatusLines::Off, None);
        assert_eq!(quiet.closing_text(Some("Approve?"), false).as_deref(), Some("Approve?"));
        assert_eq!(quiet.closing_text(None, false), None);
    }

    #[test]
    fn a_stream_cut_and_retried_is_noted_once_and_not_repeated() {
        let mut trace = TurnTrace::new(StatusLines::Content, None);
        let events = [
            node(ORCHESTRATOR),
            request("respond"),
            token("The weather "),
            token("in Prague is"),
            request("classifier"),
            response("error", false, None),
            response("respond", false, None),
            request("respond"),
            token("Here is "),
            token("the weather."),
            response("respond", true, Some(5)),
        ];
        let pieces = content(&mut trace, &events);
        assert_eq!(pieces, ["> planning…\n", "\n", "The weather ", "in Prague is", CUT_NOTE, "Here is ", "the weather."]);
        assert_eq!(trace.stream.text(), "Here is the weather.");
        assert_eq!(trace.closing_text(Some("Here is the weather."), false), None, "the retried answer is not sent again");
        assert_eq!(trace.closing_text(Some("Report"), true).as_deref(), Some("\n\nReport"));

        // Asked again without a failure reported first; and a cut that is not retried, then the report.
        let mut trace = TurnTrace::new(StatusLines::Off, None);
        let pieces = content(&mut trace, &[token("Part"), request("respond"), token("Whole.")]);
        assert_eq!(pieces, ["Part", RETRY_NOTE, "Whole."]);
        let mut trace = TurnTrace::new(StatusLines::Content, None);
        let pieces = content(&mut trace, &[token("Part"), response("respond", false, None), node(ERROR)]);
        assert_eq!(pieces, ["Part", CUT_NOTE, "> analysing the error…\n"]);
        assert_eq!(trace.closing_text(Some("Report"), true).as_deref(), Some("\nReport"));
        assert_eq!(trace.closing_text(Some("Report"), false).as_deref(), Some("\n\nReport"), "after the report, a blank line");
        // A request before any token, and another caller's failure, change nothing.
        let mut trace = TurnTrace::new(StatusLines::Off, None);
        assert_eq!(content(&mut trace, &[request("respond"), response("respond", false, None), token("A")]), ["A"]);
    }

    #[test]
    fn the_mark_and_a_blank_line_open_the_answer_before_anything_else() {
        const MARK: &str = "\u{2060}\u{200B}\u{200C}";
        let mut trace = TurnTrace::new(StatusLines::Content, Some(format!("{MARK}\n\n")));
        assert_eq!(trace.opening(), [Piece::Content(format!("{MARK}\n\n"))]);
        assert!(trace.opening().is_empty(), "once");
        let pieces = content(&mut trace, &[node(TASK_EXTRACTION), node(ORCHESTRATOR), token("> quoted")]);
        assert_eq!(pieces, ["> understanding the request…\n", "> planning…\n", "\n", "> quoted"], "no mark in the status lines");

        // Without status lines: the answer's markdown begins its own block after the mark.
        let mut trace = TurnTrace::new(StatusLines::Off, Some(format!("{MARK}\n\n")));
        trace.opening();
        assert_eq!(content(&mut trace, &[token("1. one"), token("\n2. two")]), ["1. one", "\n2. two"], "a list stays a list");
        let mut trace = TurnTrace::new(StatusLines::Off, Some(format!("{MARK}\n\n")));
        trace.opening();
        assert_eq!(trace.closing_text(Some("Approve?"), false).as_deref(), Some("Approve?"), "the blank line is already there");
        let mut trace = TurnTrace::new(StatusLines::Content, Some(format!("{MARK}\n\n")));
        trace.opening();
        assert_eq!(trace.closing_text(None, false), None);
        assert!(TurnTrace::new(StatusLines::Content, None).opening().is_empty(), "no mark, nothing");
    }
}

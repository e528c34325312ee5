//! The answer a turn streams, followed across retries: a node whose stream broke, or that runs
//! again, streams its answer from the start, so what an interface showed before no longer counts.
//! Every interface (the terminal, the served APIs) reads the turn's events through this.

use peregrine_core::AgentEvent;
use peregrine_core::events::EventKind;

/// Follows the streamed answer: its text, the component and role that stream it, and whether a
/// stream was cut. A retried node streams its answer again from the start, so what was printed
/// before no longer counts.
#[derive(Debug, Default)]
pub struct AnswerStream {
    text: String,
    source: Option<(String, String)>,
    cut: bool,
}

/// What an event did to the streamed answer.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamStep {
    /// A piece of the answer.
    Token,
    /// The stream broke after some text; that text is void.
    Cut,
    /// The same caller asks again; `after_cut` when [`StreamStep::Cut`] was already reported.
    Restart {
        /// Whether the cut was reported before.
        after_cut: bool,
    },
    /// Nothing to do with the answer.
    Other,
}

impl AnswerStream {
    /// The answer streamed so far (of the current attempt).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The component and role that stream the answer, once a token came.
    pub fn source(&self) -> Option<(&str, &str)> {
        self.source.as_ref().map(|(component, role)| (component.as_str(), role.as_str()))
    }

    fn is_source(&self, component: &str, role: &str) -> bool {
        self.source.as_ref().is_some_and(|(streaming, streaming_role)| streaming == component && streaming_role == role)
    }

    /// What `event` does to the answer.
    pub fn observe(&mut self, event: &AgentEvent) -> StreamStep {
        match &event.kind {
            EventKind::LlmToken { role, content } => {
                if self.source.is_none() {
                    self.source = Some((event.component.clone(), role.clone()));
                }
                self.text.push_str(content);
                StreamStep::Token
            }
            EventKind::LlmResponse { role, success: false, .. } if self.is_source(&event.component, role) && !self.text.is_empty() => {
                self.text.clear();
                self.cut = true;
                StreamStep::Cut
            }
            EventKind::LlmRequest { role, .. } if self.is_source(&event.component, role) && (self.cut || !self.text.is_empty()) => {
                let after_cut = self.cut;
                self.text.clear();
                self.cut = false;
                StreamStep::Restart { after_cut }
            }
            _ => StreamStep::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(component: &str, kind: EventKind) -> AgentEvent {
        AgentEvent { timestamp: chrono::Utc::now(), component: component.into(), kind }
    }

    fn token(text: &str) -> AgentEvent {
        event("respond", EventKind::LlmToken { role: "response".into(), content: text.into() })
    }

    fn request(component: &str, role: &str) -> AgentEvent {
        event(
            component,
            EventKind::LlmRequest {
                role: role.into(),
                schema: None,
                prompt_preview: String::new(),
                prompt_length: 0,
                model: "m".into(),
                provider: "p".into(),
            },
        )
    }

    fn response(component: &str, success: bool) -> AgentEvent {
        event(
            component,
            EventKind::LlmResponse {
                role: "response".into(),
                success,
                response_preview: String::new(),
                response_length: 0,
                input_tokens: None,
                output_tokens: None,
                duration_ms: 0,
            },
        )
    }

    #[test]
    fn a_cut_stream_and_its_retry_start_the_answer_over() {
        let mut stream = AnswerStream::default();
        assert_eq!(stream.observe(&request("respond", "response")), StreamStep::Other, "nothing streamed yet");
        assert_eq!(stream.observe(&token("PARTIAL-A ")), StreamStep::Token);
        assert_eq!(stream.observe(&token("PARTIAL-B ")), StreamStep::Token);
        assert_eq!(stream.observe(&request("classifier", "classifier")), StreamStep::Other, "another caller");
        assert_eq!(stream.observe(&response("error", false)), StreamStep::Other, "another caller's failure");
        assert_eq!(stream.observe(&response("respond", false)), StreamStep::Cut);
        assert_eq!(stream.text(), "");
        assert_eq!(stream.observe(&request("respond", "response")), StreamStep::Restart { after_cut: true });
        assert_eq!(stream.observe(&token("Full answer.")), StreamStep::Token);
        assert_eq!(stream.observe(&response("respond", true)), StreamStep::Other);
        assert_eq!(stream.text(), "Full answer.");
        // A node run again after a whole answer streams it again.
        assert_eq!(stream.observe(&request("respond", "response")), StreamStep::Restart { after_cut: false });
        assert_eq!(stream.text(), "");
    }
}

//! The classifier's prompts (reference §2.3, §1.10): upstream's yes/no `CapabilityMatch`
//! question per capability, and the batched `CapabilitySelection` question over every candidate
//! at once. Applications change one part by implementing [`ClassifierPrompts`] for their own
//! type and overriding only that method.
//!
//! Few-shot examples keep the order their guide gives them. Upstream shuffles them on every
//! call to avoid order bias; we keep prompts reproducible instead (the same state gives the same
//! prompt, so recorded calls replay and prompt tests are exact).

use peregrine_core::{CapabilitySpec, ClassifierGuide};
use peregrine_llm::ChatMessage;

/// A capability the classifier asks about, with its guide.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// The capability.
    pub spec: &'a CapabilitySpec,
    /// What the classifier is told about it.
    pub guide: &'a ClassifierGuide,
}

/// What the per-capability question is built from.
#[derive(Debug, Clone, Copy)]
pub struct MatchRequest<'a> {
    /// The extracted task.
    pub task: &'a str,
    /// The capability asked about.
    pub candidate: Candidate<'a>,
    /// `Capability X requested reclassification: …` when re-classifying.
    pub previous_failure: Option<&'a str>,
}

/// What the batched question is built from.
#[derive(Debug, Clone, Copy)]
pub struct SelectionRequest<'a> {
    /// The extracted task.
    pub task: &'a str,
    /// Every capability to decide on, in catalog order.
    pub candidates: &'a [Candidate<'a>],
    /// `Capability X requested reclassification: …` when re-classifying.
    pub previous_failure: Option<&'a str>,
}

/// How the classifier's prompts are built; every method has a default.
pub trait ClassifierPrompts: Send + Sync {
    /// Who the model is.
    fn role(&self) -> String {
        "You are an expert task classification assistant.".into()
    }

    /// The per-capability goal.
    fn match_task(&self) -> String {
        "Your goal is to determine if a user's request requires a certain capability.".into()
    }

    /// The per-capability output instructions.
    fn match_instructions(&self) -> String {
        "Based on the instructions and examples, you must output a JSON object with a key \"is_match\": a boolean (true or false) \
         indicating if the user's request matches the capability.\n\n\
         Respond ONLY with the JSON object. Do not provide any explanation, preamble, or additional text."
            .into()
    }

    /// A guide's examples, one `  - User Query: … -> Expected Output: … -> Reason: …` line
    /// each, in the guide's order.
    fn format_examples(&self, guide: &ClassifierGuide) -> String {
        guide.examples.iter().map(|example| format!("  - {}", example.format_for_prompt())).collect::<Vec<_>>().join("\n")
    }

    /// The messages of one `CapabilityMatch` call.
    fn build_match(&self, request: &MatchRequest<'_>) -> Vec<ChatMessage> {
        let guide = request.candidate.guide;
        let mut system = format!(
            "{}\n\n{}\n\n{}\n\nHere is the capability you need to assess:\n{}",
            self.role(),
            self.match_task(),
            self.match_instructions(),
            guide.instructions.trim()
        );
        let examples = self.format_examples(guide);
        if !examples.is_empty() {
            system.push_str(&format!("\n\nExamples:\n{examples}"));
        }
        vec![ChatMessage::system(system), ChatMessage::user(user_request(request.task, request.previous_failure))]
    }

    /// The batched goal.
    fn selection_task(&self) -> String {
        "Your goal is to decide which of the capabilities below a user's request requires.".into()
    }

    /// The batched output instructions.
    fn selection_instructions(&self) -> String {
        "Assess every capability against the request using its instructions and examples. Select each capability the request \
         needs, and only those; a request that can be answered from general knowledge or the conversation needs none. Responding \
         to the user and asking clarifying questions are always available: never select anything for them.\n\n\
         Output a JSON object with \"reasoning\" (one or two sentences on what the request needs) and \"selected\" (the names of \
         the needed capabilities, possibly empty). Use only the capability names listed below, spelled exactly."
            .into()
    }

    /// The messages of the one `CapabilitySelection` call.
    fn build_selection(&self, request: &SelectionRequest<'_>) -> Vec<ChatMessage> {
        let capabilities = request
            .candidates
            .iter()
            .map(|candidate| {
                let mut section = format!("### {}\n{}", candidate.spec.name, candidate.guide.instructions.trim());
                let examples = self.format_examples(candidate.guide);
                if !examples.is_empty() {
                    section.push_str(&format!("\nExamples:\n{examples}"));
                }
                section
            })
            .collect::<Vec<_>>()
            .join("\n\n");
        let system = format!(
            "{}\n\n{}\n\n{}\n\n## Capabilities:\n\n{capabilities}",
            self.role(),
            self.selection_task(),
            self.selection_instructions()
        );
        vec![ChatMessage::system(system), ChatMessage::user(user_request(request.task, request.previous_failure))]
    }
}

/// The framework's classifier prompts.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifierPrompts;

impl ClassifierPrompts for DefaultClassifierPrompts {}

/// `Previous approach failed: …` (when re-classifying), then `User request:\n<task>`.
pub fn user_request(task: &str, previous_failure: Option<&str>) -> String {
    match previous_failure {
        Some(failure) => format!("Previous approach failed: {failure}\n\nUser request:\n{task}"),
        None => format!("User request:\n{task}"),
    }
}

#[cfg(test)]
mod tests {
    use peregrine_core::ClassifierExample;

    use super::*;

    fn guide() -> ClassifierGuide {
        ClassifierGuide {
            instructions: "Determine if the task needs live channel values.".into(),
            examples: vec![
                ClassifierExample { query: "read the beam current".into(), result: true, reason: "a live value".into() },
                ClassifierExample { query: "what is emittance?".into(), result: false, reason: "general knowledge".into() },
            ],
            actions_if_true: None,
        }
    }

    #[test]
    fn match_prompt_follows_upstreams_layout_with_examples_in_order() {
        let spec = CapabilitySpec::new("channel_read", "reads channels");
        let guide = guide();
        let request = MatchRequest { task: "Read SR:DCCT", candidate: Candidate { spec: &spec, guide: &guide }, previous_failure: None };
        let messages = DefaultClassifierPrompts.build_match(&request);
        assert_eq!(
            messages[0].content,
            "You are an expert task classification assistant.\n\n\
             Your goal is to determine if a user's request requires a certain capability.\n\n\
             Based on the instructions and examples, you must output a JSON object with a key \"is_match\": a boolean (true or false) \
             indicating if the user's request matches the capability.\n\n\
             Respond ONLY with the JSON object. Do not provide any explanation, preamble, or additional text.\n\n\
             Here is the capability you need to assess:\nDetermine if the task needs live channel values.\n\n\
             Examples:\n\
             \x20 - User Query: \"read the beam current\" -> Expected Output: true -> Reason: a live value\n\
             \x20 - User Query: \"what is emittance?\" -> Expected Output: false -> Reason: general knowledge"
        );
        assert_eq!(messages[1].content, "User request:\nRead SR:DCCT");
        assert_eq!(DefaultClassifierPrompts.build_match(&request), messages, "prompts are reproducible");
    }

    #[test]
    fn previous_failure_precedes_the_request() {
        assert_eq!(
            user_request("Read SR:DCCT", Some("Capability python requested reclassification: needs channel_read")),
            "Previous approach failed: Capability python requested reclassification: needs channel_read\n\nUser request:\nRead SR:DCCT"
        );
    }

    #[test]
    fn selection_prompt_lists_every_candidate_with_its_guide() {
        let read = CapabilitySpec::new("channel_read", "reads channels");
        let python = CapabilitySpec::new("python", "runs code");
        let read_guide = guide();
        let python_guide =
            ClassifierGuide { instructions: "Determine if the task needs computation.".into(), ..ClassifierGuide::default() };
        let candidates = [Candidate { spec: &read, guide: &read_guide }, Candidate { spec: &python, guide: &python_guide }];
        let request = SelectionRequest { task: "Read SR:DCCT", candidates: &candidates, previous_failure: None };
        let messages = DefaultClassifierPrompts.build_selection(&request);
        let system = &messages[0].content;
        assert!(system.contains(
            "## Capabilities:\n\n### channel_read\nDetermine if the task needs live channel values.\nExamples:\n  - User Query: \"read the beam current\""
        ));
        assert!(system.ends_with("### python\nDetermine if the task needs computation."));
        assert_eq!(messages[1].content, "User request:\nRead SR:DCCT");
    }
}

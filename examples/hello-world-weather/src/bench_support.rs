//! Stand-in capabilities for the benchmark "0, 5 and 20 extra registered capabilities": each is
//! a plausible capability of another domain (stocks, parcels, recipes, …) with classifier and
//! orchestrator guides, so the classifier and the planner have to tell it apart from
//! `current_weather`. None of them is ever what a weather question needs.
//!
//! They make no LLM call and touch nothing: a stand-in that does run (a misclassification)
//! stores a small "no data" context and succeeds, so a benchmark turn still finishes and the
//! wrong selection shows in the plan and the events rather than as a failure.

use peregrine_core::{
    AgentStateUpdate, Capability, CapabilityError, CapabilityInput, CapabilityOutcome, CapabilitySpec, ClassifierExample, ClassifierGuide,
    ContextEntry, ContextStore, OrchestratorExample, OrchestratorGuide, PlannedStep, Registry, RegistryError,
};
use serde_json::json;

/// One domain of the table below.
struct Domain {
    name: &'static str,
    description: &'static str,
    context_type: &'static str,
    /// "… requires {need}".
    need: &'static str,
    positives: [&'static str; 2],
    negative: (&'static str, &'static str),
    objective: &'static str,
}

const fn domain(
    name: &'static str,
    description: &'static str,
    context_type: &'static str,
    need: &'static str,
    positives: [&'static str; 2],
    negative: (&'static str, &'static str),
    objective: &'static str,
) -> Domain {
    Domain { name, description, context_type, need, positives, negative, objective }
}

/// Twenty domains far from weather; past twenty they repeat with a numeric suffix.
const DOMAINS: [Domain; 20] = [
    domain(
        "stock_quote",
        "Look up the latest trading price of a stock",
        "STOCK_QUOTE",
        "the latest trading price of a stock or market index",
        ["What is Apple trading at?", "How did the S&P 500 close today?"],
        ("Buy me 10 shares of Tesla", "Placing trades is not a price lookup."),
        "Get the latest price of the AAPL stock",
    ),
    domain(
        "currency_exchange",
        "Convert amounts between currencies at current rates",
        "EXCHANGE_RATE",
        "converting money between currencies",
        ["How many euros is 250 dollars?", "What's the yen to pound rate?"],
        ("What currency does Peru use?", "A general knowledge question, not a conversion."),
        "Convert 250 USD to EUR",
    ),
    domain(
        "package_tracking",
        "Track the delivery status of a parcel",
        "PACKAGE_STATUS",
        "the delivery status of a parcel with a tracking number",
        ["Where is my parcel 1Z999AA10123456784?", "Has my package been delivered yet?"],
        ("How do I send a parcel abroad?", "Shipping advice, not tracking."),
        "Track parcel 1Z999AA10123456784",
    ),
    domain(
        "flight_status",
        "Report the departure and arrival status of a flight",
        "FLIGHT_STATUS",
        "the status of a specific flight by its flight number",
        ["Is flight LH 454 on time?", "When does BA 287 land?"],
        ("Book me a flight to Rome", "Booking is not a status lookup."),
        "Get the status of flight LH 454",
    ),
    domain(
        "calendar_lookup",
        "List the user's calendar events for a date",
        "CALENDAR_EVENTS",
        "the user's own calendar events",
        ["What meetings do I have tomorrow?", "Am I free on Friday afternoon?"],
        ("What day of the week is Christmas?", "A date fact, not the user's calendar."),
        "List the user's calendar events for tomorrow",
    ),
    domain(
        "email_drafting",
        "Draft an email from a short description",
        "EMAIL_DRAFT",
        "writing an email or message draft",
        ["Draft an email asking for a day off", "Write a thank-you note to the team"],
        ("How many unread emails do I have?", "Reading the mailbox, not drafting."),
        "Draft an email asking the manager for a day off",
    ),
    domain(
        "translation",
        "Translate text between languages",
        "TRANSLATION",
        "translating text into another language",
        ["Translate 'good morning' into German", "How do you say 'thank you' in Japanese?"],
        ("Which languages are spoken in Canada?", "A general knowledge question, not a translation."),
        "Translate 'good morning' into German",
    ),
    domain(
        "recipe_search",
        "Find recipes by ingredient or dish",
        "RECIPES",
        "finding a recipe or cooking instructions",
        ["How do I make a risotto?", "Find a recipe with chickpeas and spinach"],
        ("Which restaurants serve risotto nearby?", "Looking for a restaurant, not a recipe."),
        "Find a risotto recipe",
    ),
    domain(
        "news_headlines",
        "Fetch the latest news headlines on a topic",
        "NEWS_HEADLINES",
        "current news headlines on a topic",
        ["What's the latest news on the elections?", "Any tech headlines today?"],
        ("Summarize this article I pasted", "Summarizing given text needs no news lookup."),
        "Get today's technology headlines",
    ),
    domain(
        "dictionary_lookup",
        "Look up definitions and synonyms of a word",
        "WORD_DEFINITION",
        "the definition, synonyms or spelling of a word",
        ["What does 'ephemeral' mean?", "Give me a synonym for 'happy'"],
        ("Translate 'happy' into French", "A translation, not a definition."),
        "Define the word 'ephemeral'",
    ),
    domain(
        "sports_scores",
        "Report the latest scores and fixtures of a sports team",
        "SPORTS_SCORES",
        "sports results, scores or fixtures",
        ["Did the Lakers win last night?", "When does Sparta Prague play next?"],
        ("Who invented basketball?", "Sports history, not a score."),
        "Get the latest Lakers score",
    ),
    domain(
        "restaurant_finder",
        "Find restaurants by cuisine and neighbourhood",
        "RESTAURANTS",
        "finding a restaurant to eat at",
        ["Find a sushi place near the office", "Where can I get vegan food downtown?"],
        ("How do I make sushi rice?", "Cooking instructions, not a restaurant."),
        "Find sushi restaurants near the office",
    ),
    domain(
        "movie_showtimes",
        "List cinema showtimes for a film",
        "SHOWTIMES",
        "cinema showtimes or ticket availability",
        ["When is Dune playing tonight?", "Which cinemas show the new Pixar film?"],
        ("Who directed Dune?", "Film trivia, not showtimes."),
        "List tonight's showtimes for Dune",
    ),
    domain(
        "book_search",
        "Search a library catalogue by title or author",
        "BOOK_RECORDS",
        "finding a book in the library catalogue",
        ["Is 'Dune' available in the library?", "List books by Ursula K. Le Guin"],
        ("Summarize the plot of Dune", "A summary needs no catalogue search."),
        "Search the catalogue for books by Ursula K. Le Guin",
    ),
    domain(
        "shopping_list",
        "Add items to or read the user's shopping list",
        "SHOPPING_LIST",
        "reading or changing the user's shopping list",
        ["Add milk and eggs to my shopping list", "What's on my shopping list?"],
        ("Where is the nearest supermarket?", "A place search, not the list."),
        "Add milk and eggs to the shopping list",
    ),
    domain(
        "expense_report",
        "Summarize the user's recorded expenses for a period",
        "EXPENSE_SUMMARY",
        "a summary of the user's recorded expenses",
        ["How much did I spend on travel in March?", "Total my expenses for last week"],
        ("What is a good monthly budget?", "General advice, not the user's records."),
        "Summarize travel expenses for March",
    ),
    domain(
        "meeting_scheduler",
        "Find a free slot for a meeting among attendees",
        "MEETING_SLOT",
        "finding a common free time for a meeting",
        ["Find an hour next week when Ana and Ben are free", "Schedule a call with the design team"],
        ("What meetings do I have today?", "Reading the calendar, not scheduling."),
        "Find a one-hour slot next week for Ana and Ben",
    ),
    domain(
        "ticket_lookup",
        "Look up an IT support ticket by number",
        "SUPPORT_TICKET",
        "the status of an IT support ticket",
        ["What's the status of ticket INC-4412?", "Has IT answered my laptop ticket?"],
        ("How do I reset my password?", "How-to advice, not a ticket lookup."),
        "Get the status of ticket INC-4412",
    ),
    domain(
        "commit_history",
        "Summarize recent commits of a code repository",
        "COMMIT_HISTORY",
        "the recent commit history of a code repository",
        ["What changed in the backend repo this week?", "Who last touched the parser module?"],
        ("Explain what a git rebase is", "A concept question, not repository history."),
        "Summarize this week's commits in the backend repository",
    ),
    domain(
        "trivia_quiz",
        "Generate trivia questions on a topic",
        "TRIVIA_QUESTIONS",
        "generating quiz or trivia questions",
        ["Give me five questions about space", "Make a history quiz for kids"],
        ("What is the capital of Australia?", "Answering one fact, not making a quiz."),
        "Generate five trivia questions about space",
    ),
];

/// A stand-in capability of another domain.
#[derive(Debug, Clone)]
pub struct StandInCapability {
    spec: CapabilitySpec,
    context_type: String,
}

impl StandInCapability {
    fn new(domain: &Domain, round: usize) -> Self {
        // Round 0 keeps the plain names; later rounds add a suffix so names stay distinct.
        let (name, context_type, description) = match round {
            0 => (domain.name.to_owned(), domain.context_type.to_owned(), domain.description.to_owned()),
            round => (
                format!("{}_{}", domain.name, round + 1),
                format!("{}_{}", domain.context_type, round + 1),
                format!("{} (instance {})", domain.description, round + 1),
            ),
        };
        let positive =
            |query: &str| ClassifierExample { query: query.into(), result: true, reason: format!("The request asks for {}.", domain.need) };
        let classifier_guide = ClassifierGuide {
            instructions: format!("Determine if the task requires {}.", domain.need),
            examples: vec![
                positive(domain.positives[0]),
                positive(domain.positives[1]),
                ClassifierExample { query: domain.negative.0.into(), result: false, reason: domain.negative.1.into() },
            ],
            actions_if_true: None,
        };
        let example = OrchestratorExample {
            step: PlannedStep {
                context_key: format!("{name}_result"),
                capability: name.clone(),
                task_objective: domain.objective.into(),
                success_criteria: format!("{context_type} retrieved"),
                expected_output: Some(context_type.clone()),
                parameters: None,
                inputs: Vec::new(),
            },
            scenario_description: domain.description.into(),
            context_requirements: None,
            notes: Some(format!("Output stored as {context_type}.")),
        };
        let orchestrator_guide = OrchestratorGuide {
            instructions: format!(
                "**When to plan \"{name}\" steps:**\n- When the user asks for {}\n\n**Output: {context_type}**\n- Reference it in the inputs of the respond step.",
                domain.need
            ),
            examples: vec![example],
            priority: 10,
        };
        let spec = CapabilitySpec {
            provides: vec![context_type.clone()],
            classifier_guide: Some(classifier_guide),
            orchestrator_guide: Some(orchestrator_guide),
            ..CapabilitySpec::new(name, description)
        };
        Self { spec, context_type }
    }
}

impl Capability for StandInCapability {
    fn spec(&self) -> &CapabilitySpec {
        &self.spec
    }

    async fn execute(&self, input: CapabilityInput<'_>) -> Result<CapabilityOutcome, CapabilityError> {
        let mut store = ContextStore::default();
        let data = json!({"capability": self.spec.name, "result": "no data (benchmark stand-in)"});
        store.insert(
            self.context_type.clone(),
            input.step.context_key.clone(),
            ContextEntry::new(data, Some(input.step.task_objective.clone())),
        );
        Ok(CapabilityOutcome::Done(AgentStateUpdate { context: Some(store), ..AgentStateUpdate::default() }))
    }
}

/// `n` stand-in capabilities with distinct names, in a fixed order: the first twenty are the
/// plain domains, then they repeat as `<name>_2`, `<name>_3`, …
pub fn extra_capabilities(n: usize) -> Vec<StandInCapability> {
    (0..n).map(|index| StandInCapability::new(&DOMAINS[index % DOMAINS.len()], index / DOMAINS.len())).collect()
}

/// Registers [`extra_capabilities`]`(n)` after what `registry` already holds.
pub fn register_extra_capabilities(registry: &mut Registry, n: usize) -> Result<(), RegistryError> {
    extra_capabilities(n).into_iter().try_for_each(|capability| registry.register(capability))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use peregrine_agent::{AgentSettings, Services};
    use peregrine_core::AgentState;
    use peregrine_core::capability::NoEvents;
    use peregrine_llm::FakeProvider;

    use super::*;

    #[test]
    fn stand_ins_are_distinct_complete_and_not_about_weather() {
        for n in [0, 5, 20, 45] {
            let extras = extra_capabilities(n);
            assert_eq!(extras.len(), n);
            let names: BTreeSet<&str> = extras.iter().map(|c| c.spec().name.as_str()).collect();
            assert_eq!(names.len(), n, "distinct names");
            let types: BTreeSet<&str> = extras.iter().flat_map(|c| c.spec().provides.iter().map(String::as_str)).collect();
            assert_eq!(types.len(), n, "distinct context types");
            for capability in &extras {
                let spec = capability.spec();
                let classifier = spec.classifier_guide.as_ref().expect("classifier guide");
                assert!(classifier.examples.iter().any(|e| e.result) && classifier.examples.iter().any(|e| !e.result), "{}", spec.name);
                let orchestrator = spec.orchestrator_guide.as_ref().expect("orchestrator guide");
                assert_eq!(orchestrator.examples[0].step.capability, spec.name);
                let text = format!("{spec:?}").to_lowercase();
                for word in ["weather", "temperature", "forecast", "rain", "celsius"] {
                    assert!(!text.contains(word), "{} mentions {word}", spec.name);
                }
            }
        }
        assert_eq!(extra_capabilities(22)[21].spec().name, "currency_exchange_2");
    }

    #[test]
    fn stand_ins_register_beside_the_weather_application() {
        let services = Services::new(Arc::new(FakeProvider::new(|_| Ok(String::new())).client()), AgentSettings::default());
        let mut registry = crate::registry(&services).expect("registers");
        register_extra_capabilities(&mut registry, 20).expect("registers");
        assert_eq!(registry.len(), 21);
        assert_eq!(registry.providers_of("CURRENT_WEATHER"), ["current_weather"]);
        assert!(registry.unprovided_requirements().is_empty());
    }

    #[tokio::test]
    async fn a_stand_in_that_runs_stores_a_no_data_context() {
        let capability = &extra_capabilities(1)[0];
        let step = PlannedStep {
            context_key: "quote".into(),
            capability: capability.spec().name.clone(),
            task_objective: "Get the AAPL price".into(),
            success_criteria: String::new(),
            expected_output: None,
            parameters: None,
            inputs: Vec::new(),
        };
        let state = AgentState::default();
        let input = CapabilityInput { state: &state, step: &step, spec: capability.spec(), events: &NoEvents, approval: None };
        let CapabilityOutcome::Done(update) = capability.execute(input).await.expect("succeeds") else { panic!("no approval expected") };
        let entry = update.context.as_ref().and_then(|store| store.entry("STOCK_QUOTE", "quote")).cloned().expect("stored");
        assert_eq!(entry.data["result"], "no data (benchmark stand-in)");
    }
}

//! Classifier accuracy with a real model: a labelled set of requests for an agent with the
//! weather application, `memory`, `time_range_parsing` and five stand-ins, classified by the
//! classifier node alone in both modes. Only meaningful with a real model, so it runs only with
//! a `--features local` build and `--model` (a scripted model would score whatever it was told).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use peregrine_agent::infra::classifier::Classifier;
use peregrine_agent::{Agent, AgentSettings, CLASSIFIER, ClassifierMode, InfrastructureNode, Services};
use peregrine_capabilities::{MEMORY_CAPABILITY, MemoryCapability, MemoryStore, TIME_RANGE_CAPABILITY, TimeRangeCapability};
use peregrine_checkpoint::MemoryCheckpointer;
use peregrine_core::{AgentState, CapabilityOutcome, Registry};
use peregrine_graph::NodeContext;
use peregrine_llm::{LlmClient, LlmConfig, ModelConfig, ProviderConfig, roles};
use serde::Serialize;
use tokio::time::Instant;

use super::report::{median_and_range, number};
use crate::bench::ScratchDir;
use crate::bench::report::{MILLIS, Spread};

const WEATHER: &str = "current_weather";
/// The stand-ins registered: the first five of `hello_world_weather::bench_support`.
const STAND_INS: usize = 5;

/// The capabilities scored, in catalog order.
const SCORED: [&str; 8] = [
    WEATHER,
    MEMORY_CAPABILITY,
    TIME_RANGE_CAPABILITY,
    "stock_quote",
    "currency_exchange",
    "package_tracking",
    "flight_status",
    "calendar_lookup",
];

/// Requests and the capabilities they need (respond and clarify are always active, not scored).
const LABELLED: [(&str, &[&str]); 22] = [
    ("What's the weather in Prague?", &[WEATHER]),
    ("Is it raining in London right now?", &[WEATHER]),
    ("Should I take an umbrella to work today?", &[WEATHER]),
    ("How cold is it in Oslo at the moment?", &[WEATHER]),
    ("What's the temperature in Tokyo, and what is Apple trading at?", &[WEATHER, "stock_quote"]),
    ("What's the weather like in Paris? Save it to my memory.", &[WEATHER, MEMORY_CAPABILITY]),
    ("Remember that my favourite city is Lisbon", &[MEMORY_CAPABILITY]),
    ("Show me what I have saved in my memory", &[MEMORY_CAPABILITY]),
    ("How many euros is 300 dollars?", &["currency_exchange"]),
    ("Convert 50 pounds to yen and remember the result", &["currency_exchange", MEMORY_CAPABILITY]),
    ("Where is my parcel 1Z999AA10123456784?", &["package_tracking"]),
    ("Is flight LH 454 on time?", &["flight_status"]),
    ("What meetings do I have tomorrow?", &["calendar_lookup", TIME_RANGE_CAPABILITY]),
    ("Is Tesla stock up today?", &["stock_quote"]),
    ("How did the Microsoft share price move over the last 2 hours?", &["stock_quote", TIME_RANGE_CAPABILITY]),
    ("Turn 'the last 3 days' into exact start and end dates", &[TIME_RANGE_CAPABILITY]),
    ("What tools do you have?", &[]),
    ("Tell me a joke about penguins", &[]),
    ("What currency does Peru use?", &[]),
    ("How do I send a parcel abroad?", &[]),
    ("Book me a flight to Rome", &[]),
    ("What day of the week is Christmas?", &[]),
];

/// The accuracy part's outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AccuracySection {
    /// Not run, and why.
    Skipped {
        /// Why.
        reason: String,
    },
    /// The model could not be set up.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Measured.
    Measured(AccuracyReport),
}

/// Accuracy of both modes on the labelled set.
#[derive(Debug, Clone, Serialize)]
pub struct AccuracyReport {
    /// The model file.
    pub model: String,
    /// CPU threads per request (`PEREGRINE_LOCAL_THREADS`, default 1).
    pub threads: String,
    /// Labelled requests.
    pub requests: usize,
    /// Per mode.
    pub modes: Vec<ModeAccuracy>,
}

/// One mode's scores.
#[derive(Debug, Clone, Serialize)]
pub struct ModeAccuracy {
    /// `batched` or `per_capability`.
    pub mode: String,
    /// Requests whose selected set equals the expected set exactly.
    pub exact_matches: usize,
    /// `exact_matches / requests`.
    pub exact_set_accuracy: f64,
    /// Requests where the classifier failed (counted as selecting nothing).
    pub failures: usize,
    /// LLM calls over the whole set.
    pub llm_calls: usize,
    /// Wall time per request (ms).
    pub request_ms: Spread,
    /// Per scored capability.
    pub per_capability: Vec<CapabilityScore>,
    /// Every request's result.
    pub cases: Vec<CaseResult>,
}

/// Precision and recall of one capability.
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityScore {
    /// The capability.
    pub capability: String,
    /// Selected and expected.
    pub true_positives: usize,
    /// Selected, not expected.
    pub false_positives: usize,
    /// Expected, not selected.
    pub false_negatives: usize,
    /// TP / (TP + FP); NaN when never selected.
    pub precision: f64,
    /// TP / (TP + FN); NaN when never expected.
    pub recall: f64,
}

/// One request's classification.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The request (used as the extracted task).
    pub request: String,
    /// Expected capabilities.
    pub expected: Vec<String>,
    /// Selected capabilities (scored ones only).
    pub selected: Vec<String>,
    /// The classifier's error, if it failed.
    pub error: Option<String>,
}

/// Runs the accuracy part when a model is given and this build has the embedded model.
pub(super) async fn run(model: Option<&Path>, scratch: &ScratchDir) -> AccuracySection {
    let Some(model) = model else {
        let reason = "no model given: pass --model <gguf> or set PEREGRINE_LOCAL_MODEL (scripts/fetch-model.sh prints one); \
                      with the scripted LLM the accuracy would only repeat the script";
        return AccuracySection::Skipped { reason: reason.to_owned() };
    };
    if !cfg!(feature = "local") {
        let reason = format!("a model was given ({}) but this build has no embedded model: rebuild with --features local", model.display());
        return AccuracySection::Skipped { reason };
    }
    match measure(model, scratch).await {
        Ok(report) => AccuracySection::Measured(report),
        Err(error) => AccuracySection::Failed { error: format!("{error:#}") },
    }
}

fn local_client(model: &Path) -> anyhow::Result<Arc<LlmClient>> {
    let mut config = LlmConfig::default();
    config.providers.insert("local".into(), ProviderConfig { model_path: Some(model.display().to_string()), ..ProviderConfig::default() });
    let model_id = model.file_name().map_or_else(|| "local".to_owned(), |name| name.to_string_lossy().into_owned());
    let classifier = ModelConfig { provider: "local".into(), model_id, max_tokens: Some(256), temperature: Some(0.0) };
    config.models.insert(roles::CLASSIFIER.into(), classifier);
    Ok(Arc::new(LlmClient::from_config(config)?))
}

async fn measure(model: &Path, scratch: &ScratchDir) -> anyhow::Result<AccuracyReport> {
    let llm = local_client(model)?;
    let mut modes = Vec::new();
    for mode in [ClassifierMode::Batched, ClassifierMode::PerCapability] {
        modes.push(measure_mode(&llm, mode, scratch).await?);
    }
    Ok(AccuracyReport {
        model: model.display().to_string(),
        threads: std::env::var("PEREGRINE_LOCAL_THREADS").unwrap_or_else(|_| "1".to_owned()),
        requests: LABELLED.len(),
        modes,
    })
}

/// The classifier of the accuracy agent: weather, memory, time ranges and five stand-ins.
fn classifier(llm: &Arc<LlmClient>, mode: ClassifierMode, scratch: &ScratchDir) -> anyhow::Result<Classifier> {
    let data_dir = scratch.path.join("accuracy-data");
    let settings = AgentSettings { classifier_mode: mode, ..AgentSettings::with_data_dir(&data_dir) };
    let services = Services::new(llm.clone(), settings);
    let mut registry = Registry::new();
    hello_world_weather::register(&mut registry, &services)?;
    registry.register(MemoryCapability::new(services.clone(), MemoryStore::new(&data_dir)))?;
    registry.register(TimeRangeCapability::new(services.clone()))?;
    hello_world_weather::register_extra_capabilities(&mut registry, STAND_INS)?;
    // Built only for its catalog (respond and clarify added as in a real agent).
    let agent = Agent::builder(registry, services.clone()).checkpointer(Arc::new(MemoryCheckpointer::new())).build()?;
    Ok(Classifier::new(services, agent.catalog().clone()))
}

async fn measure_mode(llm: &Arc<LlmClient>, mode: ClassifierMode, scratch: &ScratchDir) -> anyhow::Result<ModeAccuracy> {
    let mode_name = super::mode_name(mode);
    let classifier = classifier(llm, mode, scratch)?;
    let calls_before = llm.usage().len();
    let (mut cases, mut times) = (Vec::new(), Vec::new());
    for (index, (request, expected)) in LABELLED.iter().enumerate() {
        eprintln!("bench turn: accuracy, {mode_name}, request {}/{}", index + 1, LABELLED.len());
        let mut state = AgentState::default();
        state.task.current_task = Some((*request).to_owned());
        let ctx = NodeContext::<AgentState>::standalone("accuracy", CLASSIFIER);
        let started = Instant::now();
        let outcome = InfrastructureNode::execute(&classifier, &state, &ctx).await;
        times.push(started.elapsed());
        let (selected, error) = match outcome {
            Ok(CapabilityOutcome::Done(update)) => (update.active_capabilities.unwrap_or_default(), None),
            Ok(CapabilityOutcome::NeedsApproval(_)) => (Vec::new(), Some("the classifier asked for approval".to_owned())),
            Err(error) => (Vec::new(), Some(error.message().to_owned())),
        };
        let selected = SCORED.iter().filter(|name| selected.iter().any(|chosen| chosen == *name)).map(|name| (*name).to_owned()).collect();
        cases.push(CaseResult {
            request: (*request).to_owned(),
            expected: expected.iter().map(|name| (*name).to_owned()).collect(),
            selected,
            error,
        });
    }
    let exact_matches = cases.iter().filter(|case| set(&case.expected) == set(&case.selected)).count();
    Ok(ModeAccuracy {
        mode: mode_name.to_owned(),
        exact_matches,
        exact_set_accuracy: exact_matches as f64 / cases.len() as f64,
        failures: cases.iter().filter(|case| case.error.is_some()).count(),
        llm_calls: llm.usage().len() - calls_before,
        request_ms: Spread::of_durations(&times, MILLIS, 1.0),
        per_capability: SCORED.iter().map(|name| score(name, &cases)).collect(),
        cases,
    })
}

fn set(names: &[String]) -> BTreeSet<&str> {
    names.iter().map(String::as_str).collect()
}

fn score(capability: &str, cases: &[CaseResult]) -> CapabilityScore {
    let has = |names: &[String]| names.iter().any(|name| name == capability);
    let count = |keep: &dyn Fn(&CaseResult) -> bool| cases.iter().filter(|case| keep(case)).count();
    let true_positives = count(&|case| has(&case.expected) && has(&case.selected));
    let false_positives = count(&|case| !has(&case.expected) && has(&case.selected));
    let false_negatives = count(&|case| has(&case.expected) && !has(&case.selected));
    let ratio = |part: usize, whole: usize| if whole == 0 { f64::NAN } else { part as f64 / whole as f64 };
    CapabilityScore {
        capability: capability.to_owned(),
        true_positives,
        false_positives,
        false_negatives,
        precision: ratio(true_positives, true_positives + false_positives),
        recall: ratio(true_positives, true_positives + false_negatives),
    }
}

impl AccuracySection {
    /// The section's Markdown.
    pub fn to_markdown(&self) -> Vec<String> {
        let report = match self {
            Self::Skipped { reason } => {
                return vec![String::new(), format!("**Classifier accuracy.** The classifier accuracy was skipped: {reason}.")];
            }
            Self::Failed { error } => return vec![String::new(), format!("**Classifier accuracy.** Failed: {error}")],
            Self::Measured(report) => report,
        };
        let mut lines = vec![
            String::new(),
            format!(
                "**Classifier accuracy** ({} labelled requests; the classifier node alone, model `{}`, {} thread(s); agent: \
                 current_weather, memory, time_range_parsing and {STAND_INS} stand-ins).",
                report.requests, report.model, report.threads
            ),
            String::new(),
            "| Mode | Exact-set accuracy | Failures | LLM calls | ms / request: median (p10–p90) |".to_owned(),
            "|---|---|---|---|---|".to_owned(),
        ];
        for mode in &report.modes {
            lines.push(format!(
                "| {} | {}/{} = {} | {} | {} | {} |",
                mode.mode,
                mode.exact_matches,
                report.requests,
                number(mode.exact_set_accuracy),
                mode.failures,
                mode.llm_calls,
                median_and_range(&mode.request_ms)
            ));
        }
        lines.extend([
            String::new(),
            "| Capability | Mode | Precision | Recall | TP / FP / FN |".to_owned(),
            "|---|---|---|---|---|".to_owned(),
        ]);
        for name in SCORED {
            for mode in &report.modes {
                if let Some(score) = mode.per_capability.iter().find(|score| score.capability == name) {
                    lines.push(format!(
                        "| {name} | {} | {} | {} | {} / {} / {} |",
                        mode.mode,
                        number(score.precision),
                        number(score.recall),
                        score.true_positives,
                        score.false_positives,
                        score.false_negatives
                    ));
                }
            }
        }
        lines.extend([String::new(), "Misclassified requests:".to_owned(), String::new()]);
        for mode in &report.modes {
            for case in mode.cases.iter().filter(|case| set(&case.expected) != set(&case.selected)) {
                let error = case.error.as_deref().map(|error| format!(" (error: {})", shortened(error))).unwrap_or_default();
                lines.push(format!(
                    "- {}: \"{}\" expected {:?}, selected {:?}{error}",
                    mode.mode, case.request, case.expected, case.selected
                ));
            }
        }
        lines
    }
}

/// The first 240 characters of an error (model answers quoted in errors can be long).
fn shortened(text: &str) -> String {
    const MAX_CHARS: usize = 240;
    let mut short: String = text.chars().take(MAX_CHARS).collect();
    if text.chars().nth(MAX_CHARS).is_some() {
        short.push('…');
    }
    short.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_only_scored_capabilities_and_scores_count_both_errors() {
        for (request, expected) in LABELLED {
            assert!(expected.iter().all(|name| SCORED.contains(name)), "{request}");
        }
        let case = |expected: &[&str], selected: &[&str]| CaseResult {
            request: String::new(),
            expected: expected.iter().map(|name| (*name).to_owned()).collect(),
            selected: selected.iter().map(|name| (*name).to_owned()).collect(),
            error: None,
        };
        let cases = [case(&[WEATHER], &[WEATHER]), case(&[WEATHER], &[]), case(&[], &[WEATHER])];
        let weather = score(WEATHER, &cases);
        assert_eq!((weather.true_positives, weather.false_positives, weather.false_negatives), (1, 1, 1));
        assert_eq!((weather.precision, weather.recall), (0.5, 0.5));
        assert!(score("memory", &cases).precision.is_nan());
    }
}

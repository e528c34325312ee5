//! A ready-made hello-world-weather agent on the scripted LLM server, for whole-turn tests and the
//! `agent_probe` binary: the LLM configuration (one OpenAI-compatible provider for every role, no
//! transport retries, so node-level recovery is what a fault exercises), the agent on a SQLite
//! checkpoint file, the healthy replies of every call of a weather turn, and a way to tell the
//! recorded requests apart by the node that made them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use peregrine_agent::{Agent, AgentSettings, Services};
use peregrine_checkpoint::SqliteCheckpointer;
use peregrine_llm::{LlmClient, LlmConfig, ModelConfig, ProviderConfig, Secret};
use serde_json::{Value, json};

use crate::llm_server::{DEFAULT_MODEL, RecordedRequest, Reply, Script};

/// The schema name of task extraction's call.
pub const EXTRACTED_TASK: &str = "ExtractedTask";
/// The schema name of the batched classifier's call.
pub const CAPABILITY_SELECTION: &str = "CapabilitySelection";
/// The schema name of the orchestrator's call.
pub const EXECUTION_PLAN: &str = "ExecutionPlan";
/// The schema name of `current_weather`'s location extraction.
pub const LOCATION_EXTRACTION: &str = "LocationExtraction";
/// The first words of the error node's analysis prompt; respond's prompt never contains them.
pub const ERROR_ANALYSIS_MARKER: &str = "You are providing error analysis";
/// The provider name every role uses (an OpenAI-compatible protocol by name).
pub const PROVIDER: &str = "vllm";
/// The task every healthy task extraction answers.
pub const PRAGUE_TASK: &str = "Get the current weather in Prague";

/// Which node's LLM call a recorded request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LlmCall {
    /// `task_extraction` (`ExtractedTask`).
    TaskExtraction,
    /// `classifier` (`CapabilitySelection`).
    Classifier,
    /// `orchestrator` (`ExecutionPlan`).
    Orchestrator,
    /// `current_weather` (`LocationExtraction`).
    CurrentWeather,
    /// `respond` (plain, streamed).
    Respond,
    /// The error node's analysis (plain, its prompt starts with [`ERROR_ANALYSIS_MARKER`]).
    ErrorAnalysis,
    /// Anything else (e.g. the gateway's `ApprovalResponse`).
    Other,
}

impl LlmCall {
    /// The call `request` belongs to, by schema name or, for plain requests, by prompt.
    pub fn of(request: &RecordedRequest) -> Self {
        match request.schema_name.as_deref() {
            Some(EXTRACTED_TASK) => Self::TaskExtraction,
            Some(CAPABILITY_SELECTION) => Self::Classifier,
            Some(EXECUTION_PLAN) => Self::Orchestrator,
            Some(LOCATION_EXTRACTION) => Self::CurrentWeather,
            Some(_) => Self::Other,
            None if is_error_analysis(request) => Self::ErrorAnalysis,
            None => Self::Respond,
        }
    }
}

/// Whether `request` is the error node's analysis call.
pub fn is_error_analysis(request: &RecordedRequest) -> bool {
    request.schema_name.is_none() && request.prompt_text().contains(ERROR_ANALYSIS_MARKER)
}

/// How many requests each call made (calls with none are left out).
pub fn call_counts(requests: &[RecordedRequest]) -> BTreeMap<LlmCall, usize> {
    let mut counts = BTreeMap::new();
    for request in requests.iter().filter(|request| request.is_chat()) {
        *counts.entry(LlmCall::of(request)).or_insert(0) += 1;
    }
    counts
}

/// One OpenAI-compatible provider at `base_url` for every role (`models.default`), with no
/// transport retries and a read timeout of `timeout_seconds`.
pub fn llm_config(base_url: &str, timeout_seconds: f64) -> LlmConfig {
    let provider = ProviderConfig {
        api_key: Some(Secret::new("sk-scripted")),
        base_url: Some(base_url.to_owned()),
        timeout_seconds: Some(timeout_seconds),
        max_retries: Some(0),
        ..ProviderConfig::default()
    };
    let mut config = LlmConfig::default();
    config.providers.insert(PROVIDER.into(), provider);
    let model = ModelConfig { provider: PROVIDER.into(), model_id: DEFAULT_MODEL.into(), max_tokens: None, temperature: None };
    config.models.insert("default".into(), model);
    config
}

/// The `config.yml` of a test project whose every role uses the scripted server at `base_url`
/// (provider `scripted`, OpenAI protocol, no transport retries) with `api_key`, SQLite
/// checkpoints in `./state/peregrine.db` and the agent data in `./_agent_data`, both relative
/// to the file. Tests append sections of their own (`server:`, …).
pub fn project_config(base_url: &str, api_key: &str) -> String {
    format!(
        "models:\n  default:\n    provider: scripted\n    model_id: {DEFAULT_MODEL}\n\
         api:\n  providers:\n    scripted:\n      protocol: openai\n      base_url: {base_url}\n      api_key: {api_key}\n      max_retries: 0\n      timeout_seconds: 20\n\
         checkpointer:\n  type: sqlite\n  path: ./state/peregrine.db\n\
         file_paths:\n  agent_data_dir: ./_agent_data\n"
    )
}

/// The weather agent (the application's `current_weather` plus the framework's nodes, respond
/// and clarify) on the LLM server at `base_url`, checkpointing to the SQLite file `db` and
/// keeping pending plans under `data_dir`.
pub async fn weather_agent(base_url: &str, timeout_seconds: f64, db: &Path, data_dir: &Path) -> anyhow::Result<Agent> {
    let llm = LlmClient::from_config(llm_config(base_url, timeout_seconds)).context("the LLM client cannot be built")?;
    let services = Services::new(Arc::new(llm), AgentSettings::with_data_dir(data_dir));
    let registry = hello_world_weather::registry(&services).context("the weather capabilities cannot be registered")?;
    let checkpointer =
        SqliteCheckpointer::open(db).await.with_context(|| format!("cannot open the checkpoint database {}", db.display()))?;
    Agent::builder(registry, services).checkpointer(Arc::new(checkpointer)).build().context("the agent cannot be assembled")
}

/// An `ExtractedTask` answer with no dependencies.
pub fn extracted_task(task: &str) -> Value {
    json!({"task": task, "depends_on_chat_history": false, "depends_on_user_memory": false})
}

/// A `CapabilitySelection` answer selecting `names`.
pub fn selection(names: &[&str]) -> Value {
    json!({"reasoning": "The request asks for current weather conditions.", "selected": names})
}

/// A two-step plan: `current_weather` for `location` stored under `context_key`, then respond
/// reading it.
pub fn weather_plan(location: &str, context_key: &str) -> Value {
    json!({"steps": [
        {
            "context_key": context_key,
            "capability": "current_weather",
            "task_objective": format!("Get the current weather in {location}"),
            "success_criteria": "Current weather data retrieved",
            "expected_output": "CURRENT_WEATHER",
            "parameters": null,
            "inputs": [],
        },
        {
            "context_key": "user_response",
            "capability": "respond",
            "task_objective": format!("Tell the user the current weather in {location}"),
            "success_criteria": "The user has the weather",
            "expected_output": "user_response",
            "parameters": null,
            "inputs": [{"CURRENT_WEATHER": context_key}],
        },
    ]})
}

/// The location named in the `Request:` line of a location-extraction prompt: the words after
/// its last " in " (e.g. "Get the current weather in Prague" → "Prague"), else "local".
pub fn location_in_request(prompt: &str) -> String {
    let request = prompt.lines().find_map(|line| line.trim().strip_prefix("Request:")).unwrap_or_default();
    let location = request.rsplit_once(" in ").map_or("local", |(_, place)| place);
    location.trim().trim_end_matches(['.', '?', '!']).to_owned()
}

/// The weather summary (`Weather in <place> on <date>: <t>°C, <conditions>`) a respond prompt
/// carries, if any.
pub fn weather_summary_in(prompt: &str) -> Option<String> {
    let start = prompt.find("Weather in ")?;
    let rest = &prompt[start..];
    let end = rest.find(['"', '\n']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_owned())
}

/// The `LocationExtraction` answer naming the place of the step objective in the prompt.
pub fn location_reply() -> Reply {
    Reply::from_fn(|request| Reply::json(json!({"location": location_in_request(&request.prompt_text())})))
}

/// Respond's answer: the weather summary found in its prompt.
pub fn answer_reply() -> Reply {
    Reply::from_fn(|request| match weather_summary_in(&request.prompt_text()) {
        Some(summary) => Reply::text(format!("Here is the current weather. {summary}.")),
        None => Reply::text("I have no weather data to report."),
    })
}

/// The error node's analysis answer.
pub const ANALYSIS: &str = "The language model service did not answer usably, so the step could not finish.";

/// Adds the healthy replies of every call of a weather turn to `script`, after its own rules
/// (which therefore win): task, selection of `current_weather`, the Prague plan, the location
/// from the step objective, the answer from the retrieved weather, and the error analysis.
pub fn with_weather_replies(script: Script) -> Script {
    script
        .on_prompt_containing(ERROR_ANALYSIS_MARKER, Reply::text(ANALYSIS))
        .on_schema(EXTRACTED_TASK, Reply::json(extracted_task(PRAGUE_TASK)))
        .on_schema(CAPABILITY_SELECTION, Reply::json(selection(&["current_weather"])))
        .on_schema(EXECUTION_PLAN, Reply::json(weather_plan("Prague", "prague_weather")))
        .on_schema(LOCATION_EXTRACTION, location_reply())
        .on_plain(answer_reply())
}

/// A script answering every call of a weather turn correctly.
pub fn weather_script() -> Script {
    with_weather_replies(Script::new())
}

/// [`weather_script`] answering every call after `latency`, each reporting 1 prompt and 1
/// completion token (so a turn's usage counts its calls): the load benchmarks' model.
pub fn slow_weather_script(latency: std::time::Duration) -> Script {
    let slow = |reply: Reply| reply.with_latency(latency).with_usage(1, 1);
    Script::new()
        .on_prompt_containing(ERROR_ANALYSIS_MARKER, slow(Reply::text(ANALYSIS)))
        .on_schema(EXTRACTED_TASK, slow(Reply::json(extracted_task(PRAGUE_TASK))))
        .on_schema(CAPABILITY_SELECTION, slow(Reply::json(selection(&["current_weather"]))))
        .on_schema(EXECUTION_PLAN, slow(Reply::json(weather_plan("Prague", "prague_weather"))))
        .on_schema(LOCATION_EXTRACTION, slow(location_reply()))
        .on_plain(slow(answer_reply()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_and_summaries_are_read_from_prompts() {
        assert_eq!(location_in_request("Rules...\nRequest: Get the current weather in New York.\nmore"), "New York");
        assert_eq!(location_in_request("Request: What's the weather?"), "local");
        assert_eq!(location_in_request("no request line"), "local");
        let prompt = "{\"summary\": \"Weather in Prague on 2025-01-01: 3.0°C, Snow\"}";
        assert_eq!(weather_summary_in(prompt).as_deref(), Some("Weather in Prague on 2025-01-01: 3.0°C, Snow"));
        assert_eq!(weather_summary_in("nothing here"), None);
    }
}

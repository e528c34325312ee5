//! The turn benchmark's model: `FakeProvider` answers the weather turn with fixed, realistic-size
//! answers (the same in every configuration), behind a wrapper that meters every call (count,
//! prompt bytes, schema) and can wait a fixed latency before answering, like a remote model.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use peregrine_llm::{
    ChatRequest, ChatResponse, EventStream, FakeProvider, LlmClient, LlmConfig, LlmError, LlmErrorKind, LlmProvider, ModelConfig,
    ProviderConfig, ProviderFeatures,
};

/// What the user asks in every benchmark turn.
pub const QUESTION: &str = "What's the weather in Prague?";
/// The context key the scripted plan stores the reading under.
pub const WEATHER_KEY: &str = "weather_prague";
/// The scripted answer `respond` streams (a real model's length: about 60 words).
pub const ANSWER: &str = "Right now in Prague it is fairly mild for the season, with light rain falling over the city centre \
    and a gentle breeze from the west. The reading from the weather service gives the current temperature and conditions \
    shown above; if you are heading out, a light waterproof jacket or an umbrella would be a good idea, and the rain is \
    expected to ease later this evening.";

const TASK: &str = r#"{"task": "Get the current weather conditions (temperature and general conditions) for Prague, Czech Republic, and report them to the user.", "depends_on_chat_history": false, "depends_on_user_memory": false}"#;
const SELECTION: &str = r#"{"reasoning": "The user asks for the current weather in Prague, which is exactly what current_weather provides; none of the other capabilities concern weather.", "selected": ["current_weather"]}"#;
const MATCH_YES: &str = r#"{"is_match": true}"#;
const MATCH_NO: &str = r#"{"is_match": false}"#;
const LOCATION: &str = r#"{"location": "Prague"}"#;
const PLAN: &str = r#"{"steps": [{"context_key": "weather_prague", "capability": "current_weather", "task_objective": "Get the current weather conditions for Prague, Czech Republic", "success_criteria": "Current weather data for Prague retrieved with temperature and conditions", "expected_output": "CURRENT_WEATHER", "parameters": null, "inputs": []}, {"context_key": "user_response", "capability": "respond", "task_objective": "Tell the user the current weather in Prague using the retrieved reading", "success_criteria": "The answer states the temperature and conditions in Prague", "expected_output": "user_response", "parameters": null, "inputs": [{"CURRENT_WEATHER": "weather_prague"}]}]}"#;

/// The scripted answer to `request`, by the name of its schema (`""` for the plain answer).
/// `CapabilityMatch` says yes only when asked about `current_weather` (its guide's instructions
/// are in the prompt; the stand-ins never mention weather).
pub fn answer(schema: &str, request: &ChatRequest) -> Result<String, LlmError> {
    let text = match schema {
        "ExtractedTask" => TASK,
        "CapabilitySelection" => SELECTION,
        "CapabilityMatch" if asks_about_weather(request) => MATCH_YES,
        "CapabilityMatch" => MATCH_NO,
        "ExecutionPlan" => PLAN,
        "LocationExtraction" => LOCATION,
        "" => ANSWER,
        other => return Err(FakeProvider::error(LlmErrorKind::InvalidOutput, &format!("the benchmark has no answer for schema {other}"))),
    };
    Ok(text.to_owned())
}

fn asks_about_weather(request: &ChatRequest) -> bool {
    let instructions = hello_world_weather::guides::classifier_guide().instructions;
    request.messages.iter().any(|message| message.content.contains(&instructions))
}

/// One metered LLM call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// The schema's name (`""` for plain calls).
    pub schema: String,
    /// Bytes of message content sent.
    pub prompt_bytes: usize,
    /// Bytes of the response schema as JSON (sent natively beside the prompt), when measured.
    pub schema_bytes: Option<usize>,
}

/// The scripted `FakeProvider` behind a meter and an optional latency.
#[derive(Clone)]
pub struct ScriptedLlm {
    fake: FakeProvider,
    latency: Option<Duration>,
    calls: Arc<Mutex<Vec<CallRecord>>>,
    /// Whether schema sizes are measured (serializing them costs time inside the turn).
    measure_schemas: Arc<std::sync::atomic::AtomicBool>,
}

impl ScriptedLlm {
    /// The weather script answering instantly, or after `latency` per call.
    pub fn new(latency: Option<Duration>) -> Self {
        Self {
            fake: FakeProvider::by_schema(answer),
            latency,
            calls: Arc::new(Mutex::new(Vec::new())),
            measure_schemas: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// The wrapped fake (its request log).
    #[cfg(test)]
    pub fn fake(&self) -> &FakeProvider {
        &self.fake
    }

    /// An `LlmClient` whose every role uses this provider, with no transport retries.
    pub fn client(&self) -> LlmClient {
        let mut config = LlmConfig::default();
        let model = ModelConfig { provider: "scripted".into(), model_id: "scripted-weather".into(), max_tokens: None, temperature: None };
        config.models.insert("default".into(), model);
        config.providers.insert("scripted".into(), ProviderConfig { max_retries: Some(0), ..ProviderConfig::default() });
        LlmClient::new(config).with_provider("scripted", self.clone())
    }

    /// Measures schema sizes from now on (for an untimed turn) or stops.
    pub fn measure_schemas(&self, on: bool) {
        self.measure_schemas.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The calls since the last take.
    pub fn take_calls(&self) -> Vec<CallRecord> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }

    async fn before_answer(&self, request: &ChatRequest) {
        if let Some(latency) = self.latency {
            tokio::time::sleep(latency).await;
        }
        let measure = self.measure_schemas.load(std::sync::atomic::Ordering::Relaxed);
        let record = CallRecord {
            schema: request.response_schema.as_ref().map(|schema| schema.name.clone()).unwrap_or_default(),
            prompt_bytes: request.messages.iter().map(|message| message.content.len()).sum(),
            schema_bytes: request
                .response_schema
                .as_ref()
                .filter(|_| measure)
                .map(|schema| serde_json::to_vec(&schema.schema).map_or(0, |json| json.len())),
        };
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(record);
    }
}

impl LlmProvider for ScriptedLlm {
    fn name(&self) -> &str {
        "scripted"
    }

    fn features(&self) -> ProviderFeatures {
        LlmProvider::features(&self.fake)
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        self.before_answer(&request).await;
        LlmProvider::complete(&self.fake, request).await
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        self.before_answer(&request).await;
        LlmProvider::stream(&self.fake, request).await
    }
}

#[cfg(test)]
mod tests {
    use peregrine_core::ExecutionPlan;
    use peregrine_llm::{ChatMessage, ResponseSchema};

    use super::*;

    fn request(schema: &str, prompt: &str) -> ChatRequest {
        ChatRequest {
            messages: vec![ChatMessage::user(prompt)],
            response_schema: Some(ResponseSchema { name: schema.into(), schema: serde_json::json!({}) }),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn scripted_answers_parse_and_say_yes_only_to_the_weather_capability() {
        let plan: ExecutionPlan = serde_json::from_str(PLAN).expect("the plan parses");
        assert_eq!(plan.steps.len(), 2);
        assert_eq!(plan.steps[1].inputs[0].key, WEATHER_KEY);
        let weather = hello_world_weather::guides::classifier_guide().instructions;
        assert_eq!(answer("CapabilityMatch", &request("CapabilityMatch", &format!("assess: {weather}"))).ok().as_deref(), Some(MATCH_YES));
        assert_eq!(answer("CapabilityMatch", &request("CapabilityMatch", "assess: stock prices")).ok().as_deref(), Some(MATCH_NO));
        assert!(answer("Unknown", &request("Unknown", "")).is_err());
        for text in [TASK, SELECTION, LOCATION] {
            serde_json::from_str::<serde_json::Value>(text).expect("valid JSON");
        }
    }
}

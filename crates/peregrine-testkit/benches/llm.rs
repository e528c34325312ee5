//! LLM-layer benchmark (`cargo bench -p peregrine-testkit --bench llm [--features local]`):
//! the client-side overhead of one structured call (schema, request, parsing, accounting)
//! measured three ways in one run — against an in-process provider, over loopback HTTP to the
//! scripted server, and a raw HTTP request to the same server for reference — plus, with the
//! `local` feature and `PEREGRINE_LOCAL_MODEL` set, the embedded model's prompt and generation
//! speed. Writes `bench-results/llm.json` and `bench-results/llm.md`; asserts nothing.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "a benchmark reports failures by panicking")]

use std::time::{Duration, Instant};

use peregrine_llm::{
    CallOptions, ChatMessage, ChatRequest, ChatResponse, EventStream, LlmClient, LlmConfig, LlmError, LlmProvider, ModelConfig,
    OpenAiCompatible, ProviderConfig, ProviderFeatures, StreamEvent, Usage,
};
use peregrine_testkit::llm_server::{Reply, Script, ScriptedLlmServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Deserialize, JsonSchema)]
#[allow(dead_code, reason = "parsed to measure parsing")]
struct ExtractedTask {
    task: String,
    depends_on_chat_history: bool,
    depends_on_user_memory: bool,
}

/// Answers instantly in-process with a fixed structured reply.
struct InstantProvider;

impl LlmProvider for InstantProvider {
    fn name(&self) -> &str {
        "instant"
    }
    fn features(&self) -> ProviderFeatures {
        ProviderFeatures { native_json_schema: true, streaming: false, tools: false }
    }
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        Ok(ChatResponse {
            content: json!({"task": "read SR:BEAM:CURRENT", "depends_on_chat_history": false, "depends_on_user_memory": false}).to_string(),
            model: request.model,
            usage: Usage { input_tokens: Some(10), output_tokens: Some(10) },
            ..ChatResponse::default()
        })
    }
    async fn stream(&self, _request: ChatRequest) -> Result<EventStream, LlmError> {
        Ok(Box::pin(futures::stream::empty::<Result<StreamEvent, LlmError>>()))
    }
}

#[derive(Debug, Clone, Serialize)]
struct Spread {
    median: f64,
    p10: f64,
    p90: f64,
    min: f64,
    max: f64,
    samples: usize,
}

impl Spread {
    fn of(samples: &mut [Duration]) -> Self {
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
        Spread { median: at(0.5), p10: at(0.1), p90: at(0.9), min: at(0.0), max: at(1.0), samples: samples.len() }
    }
}

fn client_with(provider_name: &str, model: &str, config_provider: ProviderConfig) -> LlmConfig {
    let mut config = LlmConfig::default();
    config.providers.insert(provider_name.into(), config_provider);
    config.models.insert(
        "task_extraction".into(),
        ModelConfig { provider: provider_name.into(), model_id: model.into(), max_tokens: Some(64), temperature: Some(0.0) },
    );
    config
}

async fn time_structured(client: &LlmClient, rounds: usize) -> Spread {
    let messages = vec![
        ChatMessage::system("Convert chat conversations into actionable task descriptions."),
        ChatMessage::user("What is the beam current?"),
    ];
    for _ in 0..20 {
        let _: ExtractedTask = client.structured("task_extraction", messages.clone(), CallOptions::default()).await.unwrap();
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let _: ExtractedTask = client.structured("task_extraction", messages.clone(), CallOptions::default()).await.unwrap();
        samples.push(started.elapsed());
    }
    Spread::of(&mut samples)
}

async fn time_raw_http(url: &str, rounds: usize) -> Spread {
    let http = reqwest::Client::new();
    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "What is the beam current?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "ExtractedTask", "schema": {}}}});
    let post = || http.post(format!("{url}/chat/completions")).json(&body).send();
    for _ in 0..20 {
        post().await.unwrap().bytes().await.unwrap();
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        post().await.unwrap().bytes().await.unwrap();
        samples.push(started.elapsed());
    }
    Spread::of(&mut samples)
}

#[derive(Debug, Serialize)]
struct LocalModel {
    model: String,
    threads: String,
    prompt_tokens: u64,
    generated_tokens: u64,
    generation_tokens_per_second: Spread,
    structured_call_ms: Spread,
}

#[cfg(feature = "local")]
async fn local_model(rounds: usize) -> Option<LocalModel> {
    let path = std::env::var("PEREGRINE_LOCAL_MODEL").ok()?;
    let provider_config = ProviderConfig { model_path: Some(path.clone()), ..ProviderConfig::default() };
    let provider = peregrine_llm::LocalProvider::load("local", &provider_config).expect("the local model loads");
    let request = ChatRequest {
        model: "smollm2".into(),
        messages: vec![ChatMessage::user("Explain in two sentences what a beam position monitor measures.")],
        max_tokens: Some(64),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let mut speeds = Vec::new();
    let (mut prompt_tokens, mut generated_tokens) = (0, 0);
    for _ in 0..rounds {
        let started = Instant::now();
        let response = provider.complete(request.clone()).await.expect("generates");
        let elapsed = started.elapsed();
        prompt_tokens = response.usage.input_tokens.unwrap_or(0);
        generated_tokens = response.usage.output_tokens.unwrap_or(0);
        // Recorded as the time per generated token, so the spread reads in tokens/s below.
        speeds.push(elapsed.checked_div(u32::try_from(generated_tokens.max(1)).unwrap_or(1)).unwrap_or_default());
    }
    let per_token = Spread::of(&mut speeds);
    let to_rate = |micros: f64| if micros > 0.0 { 1e6 / micros } else { 0.0 };
    let generation_tokens_per_second = Spread {
        median: to_rate(per_token.median),
        p10: to_rate(per_token.p90),
        p90: to_rate(per_token.p10),
        min: to_rate(per_token.max),
        max: to_rate(per_token.min),
        samples: per_token.samples,
    };
    let client = LlmClient::new(client_with("local", "smollm2", provider_config)).with_provider("local", provider);
    let mut structured = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let _: ExtractedTask = client
            .structured("task_extraction", vec![ChatMessage::user("What is the beam current?")], CallOptions::default())
            .await
            .expect("parses");
        structured.push(started.elapsed());
    }
    let mut structured_call_ms = Spread::of(&mut structured);
    for value in [
        &mut structured_call_ms.median,
        &mut structured_call_ms.p10,
        &mut structured_call_ms.p90,
        &mut structured_call_ms.min,
        &mut structured_call_ms.max,
    ] {
        *value /= 1000.0;
    }
    Some(LocalModel {
        model: path,
        threads: std::env::var("PEREGRINE_LOCAL_THREADS").unwrap_or_else(|_| "1".into()),
        prompt_tokens,
        generated_tokens,
        generation_tokens_per_second,
        structured_call_ms,
    })
}

#[cfg(not(feature = "local"))]
async fn local_model(_rounds: usize) -> Option<LocalModel> {
    None
}

fn row(name: &str, spread: &Spread, unit: &str) -> String {
    format!(
        "| {name} | {:.1} {unit} | {:.1}–{:.1} | {:.1}–{:.1} | {} |",
        spread.median, spread.p10, spread.p90, spread.min, spread.max, spread.samples
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::var("PEREGRINE_BENCH_ROUNDS").ok().and_then(|value| value.parse().ok()).unwrap_or(300);
    let reply = Reply::json(json!({"task": "read SR:BEAM:CURRENT", "depends_on_chat_history": false, "depends_on_user_memory": false}));
    let server = ScriptedLlmServer::start(Script::new().otherwise(reply)).await;
    let http_provider_config = ProviderConfig { base_url: Some(server.base_url()), ..ProviderConfig::default() };

    let in_process = LlmClient::new(client_with("instant", "instant", ProviderConfig::default())).with_provider("instant", InstantProvider);
    let in_process = time_structured(&in_process, rounds).await;
    let provider = OpenAiCompatible::new("vllm", &http_provider_config, "").expect("provider");
    let over_http = LlmClient::new(client_with("vllm", "gpt-test", http_provider_config)).with_provider("vllm", provider);
    let over_http = time_structured(&over_http, rounds).await;
    let raw = time_raw_http(&server.base_url(), rounds).await;
    let local = local_model(5).await;

    let report = json!({
        "date": chrono::Utc::now(),
        "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(0),
        "structured_call_in_process_us": in_process,
        "structured_call_over_loopback_http_us": over_http,
        "raw_http_request_us": raw,
        "client_overhead_over_raw_http_us": over_http.median - raw.median,
        "local_model": local,
    });
    let mut markdown = format!(
        "# Peregrine LLM-layer benchmark\n\n{} · {} CPUs · {rounds} calls per row after 20 warm-up calls\n\n| measurement | median | p10–p90 | min–max | samples |\n|---|---|---|---|---|\n",
        report["date"].as_str().unwrap_or_default(),
        report["cpus"]
    );
    markdown
        .push_str(&format!("{}\n", row("structured call (ExtractedTask), in-process provider: client overhead alone", &in_process, "µs")));
    markdown.push_str(&format!("{}\n", row("structured call over loopback HTTP to the scripted server", &over_http, "µs")));
    markdown.push_str(&format!("{}\n", row("raw HTTP POST of the same request (reqwest, no client layer)", &raw, "µs")));
    markdown.push_str(&format!(
        "\nClient layer over raw HTTP (medians, same run): {:.1} µs — this includes the larger request body (the schema) the server parses; the in-process row is the client alone.\n",
        over_http.median - raw.median
    ));
    match &local {
        Some(local) => {
            markdown.push_str(&format!(
                "\n## Embedded model ({}; {} thread(s))\n\n| measurement | median | p10–p90 | min–max | samples |\n|---|---|---|---|---|\n{}\n{}\n\nPrompt {} tokens, {} generated per call.\n",
                local.model,
                local.threads,
                row("generation speed", &local.generation_tokens_per_second, "tokens/s"),
                row("structured call (ExtractedTask, grammar-constrained)", &local.structured_call_ms, "ms"),
                local.prompt_tokens,
                local.generated_tokens
            ));
        }
        None => markdown.push_str("\nEmbedded model: not measured (build with `--features local` and set PEREGRINE_LOCAL_MODEL).\n"),
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench-results");
    std::fs::create_dir_all(&out).expect("bench-results directory");
    std::fs::write(out.join("llm.json"), serde_json::to_vec_pretty(&report).expect("json")).expect("write json");
    std::fs::write(out.join("llm.md"), &markdown).expect("write markdown");
    println!("{markdown}");
}

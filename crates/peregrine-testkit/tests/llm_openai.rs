//! The OpenAI-compatible provider through `LlmClient`, against the scripted server: plain,
//! streamed and structured completions (native schema and schema in the prompt), clean-up and
//! the validation-feedback retry, tools, config honoured on every path, usage accounting and
//! call recording — and the fault matrix, each fault with its classification and retries.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use peregrine_core::events::EventKind;
use peregrine_core::{AgentEvent, ErrorSeverity, EventSink};
use peregrine_llm::{
    CallOptions, ChatMessage, FaultClass, LlmClient, LlmConfig, LlmErrorKind, ModelConfig, OpenAiCompatible, ProviderConfig, Secret,
};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
struct ExtractedTask {
    task: String,
    depends_on_chat_history: bool,
    depends_on_user_memory: bool,
}

#[derive(Default)]
struct Events(Mutex<Vec<AgentEvent>>);

impl EventSink for Events {
    fn emit(&self, event: AgentEvent) {
        self.0.lock().unwrap().push(event);
    }
}

struct Setup {
    timeout: Option<f64>,
    retries: Option<u32>,
    native: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self { timeout: Some(5.0), retries: Some(2), native: true }
    }
}

fn client_for(base_url: &str, setup: Setup) -> LlmClient {
    let provider_config = ProviderConfig {
        api_key: Some(Secret::new("sk-test")),
        base_url: Some(base_url.to_owned()),
        timeout_seconds: setup.timeout,
        max_retries: setup.retries,
        ..ProviderConfig::default()
    };
    let mut config = LlmConfig::default();
    config.providers.insert("vllm".into(), provider_config.clone());
    for role in ["task_extraction", "response", "classifier"] {
        config.models.insert(
            role.into(),
            ModelConfig { provider: "vllm".into(), model_id: "gpt-test".into(), max_tokens: Some(321), temperature: Some(0.25) },
        );
    }
    let mut provider = OpenAiCompatible::new("vllm", &provider_config, "http://unused.invalid").expect("provider");
    if !setup.native {
        provider = provider.without_native_schema();
    }
    LlmClient::new(config).with_provider("vllm", provider)
}

fn task_json() -> serde_json::Value {
    json!({"task": "read SR:BEAM:CURRENT", "depends_on_chat_history": false, "depends_on_user_memory": false})
}

#[tokio::test]
async fn plain_completion_sends_the_configured_model_settings_and_accounts_usage() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::text("The beam current is 500 mA.").with_usage(42, 7))).await;
    let client = client_for(&server.base_url(), Setup::default());
    let events = Events::default();
    let response = client
        .complete("response", vec![ChatMessage::system("be brief"), ChatMessage::user("beam?")], CallOptions::events(&events))
        .await
        .unwrap();
    assert_eq!(response.content, "The beam current is 500 mA.");
    assert_eq!((response.usage.input_tokens, response.usage.output_tokens), (Some(42), Some(7)));

    let request = &server.chat_requests()[0];
    assert_eq!(request.bearer_token(), Some("sk-test"));
    assert_eq!(request.body["max_tokens"], 321);
    assert_eq!(request.body["temperature"], 0.25);
    assert_eq!(request.body["model"], "gpt-test");
    let usage = client.usage();
    assert_eq!(usage.len(), 1);
    assert_eq!((usage[0].role.as_str(), usage[0].attempts, usage[0].success), ("response", 1, true));
    let kinds: Vec<_> = events.0.lock().unwrap().iter().map(|event| event.kind.clone()).collect();
    assert!(matches!(&kinds[0], EventKind::LlmRequest { role, model, .. } if role == "response" && model == "gpt-test"));
    assert!(matches!(&kinds[1], EventKind::LlmResponse { input_tokens: Some(42), output_tokens: Some(7), success: true, .. }));
}

#[tokio::test]
async fn streaming_uses_the_configured_endpoint_and_emits_tokens() {
    let reply = Reply::text("one two three").with_chunks(vec!["one ".into(), "two ".into(), "three".into()]).with_usage(5, 3);
    let server = ScriptedLlmServer::start(Script::new().on_plain(reply)).await;
    let client = client_for(&server.base_url(), Setup::default());
    let events = Events::default();
    let response = client.complete_streaming("response", vec![ChatMessage::user("count")], CallOptions::events(&events)).await.unwrap();
    assert_eq!(response.content, "one two three");
    assert_eq!(response.usage.output_tokens, Some(3));
    let tokens: Vec<String> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|event| if let EventKind::LlmToken { content, .. } = &event.kind { Some(content.clone()) } else { None })
        .collect();
    assert_eq!(tokens, ["one ", "two ", "three"]);
    let request = &server.chat_requests()[0];
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.body["temperature"], 0.25, "streaming honours the config too");
}

#[tokio::test]
async fn structured_output_native_and_in_prompt_is_named_after_the_type() {
    for native in [true, false] {
        let server = ScriptedLlmServer::start(Script::new().on_schema("ExtractedTask", Reply::json(task_json()))).await;
        let client = client_for(&server.base_url(), Setup { native, ..Setup::default() });
        let task: ExtractedTask = client
            .structured("task_extraction", vec![ChatMessage::user("what is the beam current?")], CallOptions::default())
            .await
            .unwrap();
        assert_eq!(task.task, "read SR:BEAM:CURRENT");
        let request = &server.chat_requests()[0];
        assert_eq!(request.schema_name.as_deref(), Some("ExtractedTask"), "native = {native}");
        if native {
            assert_eq!(request.body["response_format"]["json_schema"]["name"], "ExtractedTask");
        } else {
            assert!(request.body.get("response_format").is_none());
            assert!(request.last_message().unwrap().contains("Schema name: ExtractedTask"));
        }
        assert_eq!(client.usage()[0].schema.as_deref(), Some("ExtractedTask"));
    }
}

#[tokio::test]
async fn invalid_output_is_cleaned_or_fed_back_once_then_classified_retriable() {
    let fenced = "```json\n{\"task\": \"x\", \"depends_on_chat_history\": True, \"depends_on_user_memory\": False}\n```";
    let server = ScriptedLlmServer::start(Script::new().on_schema("ExtractedTask", Reply::text(fenced))).await;
    let client = client_for(&server.base_url(), Setup::default());
    let task: ExtractedTask = client.structured("task_extraction", vec![ChatMessage::user("q")], CallOptions::default()).await.unwrap();
    assert!(task.depends_on_chat_history && !task.depends_on_user_memory);

    let server = ScriptedLlmServer::start(
        Script::new().on_schema("ExtractedTask", Reply::sequence(vec![Reply::text("{\"task\": 5}"), Reply::json(task_json())])),
    )
    .await;
    let client = client_for(&server.base_url(), Setup::default());
    let task: ExtractedTask = client.structured("task_extraction", vec![ChatMessage::user("q")], CallOptions::default()).await.unwrap();
    assert_eq!(task.task, "read SR:BEAM:CURRENT");
    let second = &server.chat_requests()[1];
    let feedback = second.last_message().unwrap();
    assert!(feedback.contains("could not be used") && feedback.contains("invalid type"), "{feedback}");

    let server = ScriptedLlmServer::start(Script::new().on_schema("ExtractedTask", Reply::text("I cannot answer that."))).await;
    let client = client_for(&server.base_url(), Setup::default());
    let error =
        client.structured::<ExtractedTask>("task_extraction", vec![ChatMessage::user("q")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::InvalidOutput);
    assert_eq!(error.classification().severity, ErrorSeverity::Retriable);
    assert_eq!(server.chat_requests().len(), 2, "one feedback retry, no more");
    assert!(error.to_string().contains("no valid ExtractedTask"), "{error}");
}

#[tokio::test]
async fn tool_calls_come_back_with_their_arguments() {
    let server =
        ScriptedLlmServer::start(Script::new().otherwise(Reply::tool_call("read_channel", json!({"pv": "SR:BEAM:CURRENT"})))).await;
    let client = client_for(&server.base_url(), Setup::default());
    let tools = vec![peregrine_llm::ToolSpec {
        name: "read_channel".into(),
        description: "read a PV".into(),
        parameters: json!({"type": "object"}),
    }];
    let response = client.complete_with_tools("response", vec![ChatMessage::user("read it")], tools, CallOptions::default()).await.unwrap();
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(response.tool_calls[0].name, "read_channel");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&response.tool_calls[0].arguments).unwrap(), json!({"pv": "SR:BEAM:CURRENT"}));
    assert_eq!(server.chat_requests()[0].tool_names(), ["read_channel"]);
}

#[tokio::test]
async fn calls_are_recorded_to_a_directory_when_asked() {
    let server =
        ScriptedLlmServer::start(Script::new().on_schema("ExtractedTask", Reply::json(task_json())).on_plain(Reply::text("hi"))).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client_for(&server.base_url(), Setup::default()).record_calls_to(dir.path().join("api_calls")).unwrap();
    client.complete("response", vec![ChatMessage::user("hello")], CallOptions::default()).await.unwrap();
    let _: ExtractedTask = client.structured("task_extraction", vec![ChatMessage::user("q")], CallOptions::default()).await.unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path().join("api_calls")).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["000000-response.json", "000001-task_extraction-ExtractedTask.json"]);
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("api_calls").join(&names[1])).unwrap()).unwrap();
    assert_eq!(record["request"]["messages"][0]["content"], "q");
    assert!(record["response"]["content"].as_str().unwrap().contains("SR:BEAM:CURRENT"));

    let resumed = client_for(&server.base_url(), Setup::default()).record_calls_to(dir.path().join("api_calls")).unwrap();
    resumed.complete("response", vec![ChatMessage::user("again")], CallOptions::default()).await.unwrap();
    assert!(dir.path().join("api_calls/000002-response.json").exists(), "a new process continues after the existing records");
    let first: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("api_calls/000000-response.json")).unwrap()).unwrap();
    assert_eq!(first["request"]["messages"][0]["content"], "hello", "earlier records are kept");
}

// ---- the fault matrix ----

#[tokio::test]
async fn server_errors_are_retried_with_backoff_then_succeed() {
    let server =
        ScriptedLlmServer::start(Script::new().on_plain(Reply::text("ok").after_faults(vec![Fault::Status500, Fault::Status(503)]))).await;
    let client = client_for(&server.base_url(), Setup::default());
    let started = Instant::now();
    let response = client.complete("response", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap();
    assert_eq!(response.content, "ok");
    assert_eq!(client.usage()[0].attempts, 3);
    assert!(started.elapsed() >= Duration::from_millis(1500), "waited 0.5 s then 1 s between attempts");
}

#[tokio::test]
async fn rate_limits_wait_for_retry_after() {
    let server =
        ScriptedLlmServer::start(Script::new().on_plain(Reply::text("ok").after_faults(vec![Fault::RateLimited { retry_after_secs: 1 }])))
            .await;
    let client = client_for(&server.base_url(), Setup::default());
    let started = Instant::now();
    client.complete("response", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was honoured");
    let requests = server.chat_requests();
    assert!(requests[1].received_at.duration_since(requests[0].received_at) >= Duration::from_secs(1));
}

#[tokio::test]
async fn exhausted_retries_and_each_fault_are_classified_for_the_callers_next_action() {
    struct Case {
        fault: Fault,
        kind: fn(&LlmErrorKind) -> bool,
        class: FaultClass,
        attempts: usize,
    }
    let cases = [
        Case {
            fault: Fault::Status500,
            kind: |k| matches!(k, LlmErrorKind::Server { status: 500 }),
            class: FaultClass::Retriable,
            attempts: 2,
        },
        Case {
            fault: Fault::RateLimited { retry_after_secs: 0 },
            kind: |k| *k == LlmErrorKind::RateLimited,
            class: FaultClass::Retriable,
            attempts: 2,
        },
        Case {
            fault: Fault::Unauthorized,
            kind: |k| matches!(k, LlmErrorKind::Auth { status: 401 }),
            class: FaultClass::Critical,
            attempts: 1,
        },
        Case {
            fault: Fault::Forbidden,
            kind: |k| matches!(k, LlmErrorKind::Auth { status: 403 }),
            class: FaultClass::Critical,
            attempts: 1,
        },
        Case { fault: Fault::ModelNotFound, kind: |k| *k == LlmErrorKind::InvalidModel, class: FaultClass::Critical, attempts: 1 },
        Case {
            fault: Fault::ContextLengthExceeded,
            kind: |k| *k == LlmErrorKind::ContextLength,
            class: FaultClass::ContextOverflow,
            attempts: 1,
        },
        Case { fault: Fault::MalformedJson, kind: |k| *k == LlmErrorKind::Protocol, class: FaultClass::Retriable, attempts: 2 },
        Case { fault: Fault::RefuseConnection, kind: |k| *k == LlmErrorKind::Connect, class: FaultClass::Retriable, attempts: 2 },
    ];
    for case in cases {
        let label = format!("{:?}", case.fault);
        let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(case.fault))).await;
        let client = client_for(&server.base_url(), Setup { retries: Some(1), ..Setup::default() });
        let error = client.complete("classifier", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
        assert!((case.kind)(&error.kind), "{label}: got {:?}", error.kind);
        assert_eq!(error.class(), case.class, "{label}");
        assert_eq!(server.chat_requests().len(), case.attempts, "{label}: transient faults are retried, the others are not");
        let message = error.to_string();
        assert!(message.contains("LLM role 'classifier' via vllm model 'gpt-test'"), "{label}: {message}");
        if case.class == FaultClass::Critical {
            assert!(message.contains("config.yml") || message.contains("api.providers.vllm"), "{label}: says what to fix: {message}");
            assert_eq!(error.classification().severity, ErrorSeverity::Critical);
        }
    }
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_retriable_with_a_clear_message() {
    let server = ScriptedLlmServer::start(Script::new().on_plain(Reply::fault(Fault::Timeout))).await;
    let client = client_for(&server.base_url(), Setup { timeout: Some(0.3), retries: Some(0), native: true });
    let error = client.complete("response", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::Timeout);
    assert!(error.to_string().contains("timeout_seconds"), "{error}");
    assert_eq!(error.classification().severity, ErrorSeverity::Retriable);

    let client = client_for(&ScriptedLlmServer::refusing(), Setup { retries: Some(0), ..Setup::default() });
    let error = client.complete("response", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::Connect);
    assert!(error.to_string().contains("base_url"), "{error}");
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_retriable() {
    let reply = Reply::text("a b c d")
        .with_chunks(vec!["a ".into(), "b ".into(), "c ".into(), "d".into()])
        .with_fault(Fault::TruncatedStream { after_chunks: 2 });
    let server = ScriptedLlmServer::start(Script::new().on_plain(reply)).await;
    let client = client_for(&server.base_url(), Setup::default());
    let error = client.complete_streaming("response", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::StreamCut);
    assert_eq!(error.class(), FaultClass::Retriable);
}

#[tokio::test]
async fn a_role_without_a_model_or_with_an_unknown_provider_is_a_config_error() {
    let client = client_for("http://127.0.0.1:9/v1", Setup::default());
    let error = client.complete("memory", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
    assert_eq!(error.kind, LlmErrorKind::Config);
    assert!(error.to_string().contains("add models.memory"), "{error}");
    let mut config = client.config().clone();
    config
        .models
        .insert("memory".into(), ModelConfig { provider: "nowhere".into(), model_id: "m".into(), max_tokens: None, temperature: None });
    let error = LlmClient::new(config).complete("memory", vec![ChatMessage::user("x")], CallOptions::default()).await.unwrap_err();
    assert!(error.to_string().contains("api.providers.nowhere"), "{error}");
}

//! `config.yml` as users write it: Osprey 0.11's generated file, interpolation, `.env`, errors
//! with line, column and key, secrets that never print, the embedded defaults and the
//! checkpointer section. The environment is injected: no test reads or changes the process
//! environment or working directory.

use std::path::{Path, PathBuf};

use peregrine::config::{CheckpointerConfig, Config, ConfigError, LoadOptions};
use peregrine::core::state::ApprovalMode;
use peregrine_agent::ClassifierMode;
use peregrine_core::approval::PythonApprovalMode;
use peregrine_llm::ModelConfig;
use peregrine_server::StatusLines;

const CBORG_KEY: &str = "cborg-test-key-7f3a9c2e41d8";

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
    move |name| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/osprey-0.11/config.yml")
}

fn parse(text: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_text(text, Path::new("/srv/agent/config.yml"), &env(pairs))
}

fn parse_err(text: &str, pairs: &[(&str, &str)]) -> ConfigError {
    match parse(text, pairs) {
        Ok(config) => panic!("the configuration must be refused; it loaded as {config:?}"),
        Err(error) => error,
    }
}

const MINIMAL: &str = "models:\n  orchestrator:\n    provider: openai\n    model_id: gpt-4o\n";

#[test]
fn osprey_generated_config_is_accepted_and_mapped() {
    let config = Config::from_file(&fixture(), &env(&[("CBORG_API_KEY", CBORG_KEY), ("HOME", "/home/operator")])).expect("loads");
    let dir = fixture().parent().expect("fixture dir").to_owned();
    assert_eq!(config.source.as_deref(), Some(fixture().as_path()));
    assert_eq!(config.project_dir, dir);

    let orchestrator = &config.llm.models["orchestrator"];
    assert_eq!(
        *orchestrator,
        ModelConfig { provider: "cborg".into(), model_id: "anthropic/claude-haiku".into(), max_tokens: Some(4096), temperature: None }
    );
    assert_eq!(config.llm.models.len(), 8, "{:?}", config.llm.models.keys());
    assert_eq!(config.llm.model_for("reactive_orchestrator").expect("falls back").config_key, "orchestrator");
    let cborg = config.llm.provider("cborg");
    assert_eq!(cborg.base_url.as_deref(), Some("https://api.cborg.lbl.gov/v1"));
    assert_eq!(cborg.api_key.as_ref().map(|key| key.expose()), Some(CBORG_KEY));
    assert_eq!(config.llm.provider("ollama").base_url.as_deref(), Some("http://localhost:11434"));

    let settings = &config.settings;
    assert_eq!(settings.timezone, chrono_tz::America::Los_Angeles, "${{TZ:-America/Los_Angeles}} with TZ unset");
    assert_eq!(settings.limits.max_execution_time_seconds, 3000);
    assert_eq!(settings.limits.max_step_retries, 3);
    assert_eq!(settings.limits.max_concurrent_classifications, 5);
    assert_eq!(settings.approval.global_mode, ApprovalMode::Selective);
    assert_eq!(settings.approval.capabilities.python_execution.mode, PythonApprovalMode::ControlWrites);
    assert_eq!(settings.turn_defaults().approval_mode, ApprovalMode::Selective);
    assert!(!settings.agent_control.task_extraction_bypass_enabled && !settings.agent_control.planning_mode_enabled);
    assert_eq!(settings.classifier_mode, ClassifierMode::Batched);
    assert_eq!(settings.agent_data_dir, dir.join("_agent_data"));
    assert_eq!(config.checkpointer, CheckpointerConfig::Sqlite { path: dir.join("_agent_data/checkpoints/peregrine.db") });
    assert!(config.development.save_api_calls && !config.development.raise_raw_errors);

    for key in [
        "services",
        "deployed_services",
        "project_name",
        "execution",
        "control_system.connector.mock.simulate_delays",
        "control_system.write_verification.fail_on_mismatch",
        "control_system.connector.epics.gateways.read_only.use_name_server",
        "python_executor",
        "cli",
        "api.providers.ollama.host",
        "api.providers.ollama.port",
        "file_paths.user_memory_dir",
        "development.prompts",
        "logging.logging_colors",
    ] {
        assert!(config.ignored_keys.iter().any(|ignored| ignored == key), "{key} not in {:?}", config.ignored_keys);
    }
    // Osprey's control_system section: the mock, writes off, no limits, no verification; the
    // gateways become CA addresses for the EPICS connector.
    let control = &config.control_system;
    assert_eq!(control.kind, peregrine::config::ControlSystemKind::Mock);
    assert!(!control.writes.writes_enabled);
    assert_eq!(control.writes.limits, peregrine_control::LimitsCheck::Off);
    assert_eq!(control.writes.verification, peregrine_control::VerificationLevel::None);
    assert_eq!(control.epics.read_gateway.as_deref(), Some("your-gateway.example.com:5064"));
    assert_eq!(control.epics.write_gateway.as_deref(), Some("your-gateway.example.com:5084"));
    let mut sorted = config.ignored_keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, config.ignored_keys, "sorted, each once");
    assert!(!config.ignored_keys.iter().any(|key| key.starts_with("models") || key.starts_with("services.")), "{:?}", config.ignored_keys);
    // Every model uses cborg: the unset keys of the other providers Osprey's template lists do
    // not warn, cborg's would (it is set here).
    assert!(!config.warnings.iter().any(|warning| warning.contains("api_key uses")), "{:?}", config.warnings);
    assert!(!config.warnings.iter().any(|warning| warning.contains("did you mean")), "no false typo hints: {:?}", config.warnings);

    // The key never prints.
    let shown = serde_json::to_string_pretty(&config.redacted()).expect("serializes");
    assert!(!shown.contains(CBORG_KEY), "{shown}");
    let redacted = config.redacted();
    assert_eq!(redacted["api"]["providers"]["cborg"]["api_key"], "***");
    assert_eq!(redacted["api"]["providers"]["cborg"]["protocol"], "openai");
    assert_eq!(redacted["api"]["providers"]["ollama"]["protocol"], "ollama", "the placeholder key `ollama` is not scrubbed");
    assert_eq!(redacted["models"]["orchestrator"]["max_tokens"], 4096);
    assert_eq!(redacted["models"]["state_manager_react"]["from"], "models.orchestrator");
    assert_eq!(redacted["system"]["timezone"], "America/Los_Angeles");
    assert_eq!(redacted["execution_control"]["limits"]["graph_recursion_limit"], 100);
    assert_eq!(redacted["checkpointer"]["type"], "sqlite");
    assert!(redacted["ignored_keys"].as_array().is_some_and(|keys| keys.iter().any(|key| key == "services")));
    assert!(!format!("{config:?}").contains(CBORG_KEY));
    assert!(!serde_json::to_string(&config.llm).expect("serializes").contains(CBORG_KEY));
    assert_eq!(config.redact(&format!("401 for key {CBORG_KEY}")), "401 for key ***");
}

#[test]
fn defaults_in_references_are_used_and_unset_references_kept_with_a_warning() {
    let text = "\
models:
  orchestrator:
    provider: openai
    model_id: ${MODEL:-gpt-4o-mini}
    max_tokens: ${MAX_TOKENS:-2048}
    temperature: ${TEMPERATURE:-0.2}
api:
  providers:
    openai:
      api_key: ${OPENAI_API_KEY}
      base_url: $OPENAI_BASE/v1
execution_control:
  agent_control:
    planning_mode_enabled: ${PLANNING:-true}
";
    let config = parse(text, &[("OPENAI_BASE", "https://gateway.example")]).expect("loads");
    let model = &config.llm.models["orchestrator"];
    assert_eq!((model.model_id.as_str(), model.max_tokens, model.temperature), ("gpt-4o-mini", Some(2048), Some(0.2)));
    assert!(config.settings.agent_control.planning_mode_enabled);
    let openai = config.llm.provider("openai");
    assert_eq!(openai.base_url.as_deref(), Some("https://gateway.example/v1"));
    assert_eq!(openai.api_key.as_ref().map(|key| key.expose()), Some("${OPENAI_API_KEY}"), "kept verbatim, as upstream");
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("api.providers.openai.api_key uses ${OPENAI_API_KEY}, which is not set"),
        "{:?}",
        config.warnings
    );
    // The placeholder is not a secret: the warning that names it stays readable.
    assert_eq!(config.redact(&config.warnings[0]), config.warnings[0]);

    let set = parse(text, &[("OPENAI_BASE", "https://gateway.example"), ("MAX_TOKENS", "300"), ("OPENAI_API_KEY", "sk-live-abcdef123456")])
        .expect("loads");
    assert_eq!(set.llm.models["orchestrator"].max_tokens, Some(300));
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    assert_eq!(set.redact("Bearer sk-live-abcdef123456"), "Bearer ***");
}

#[test]
fn dotenv_beside_the_file_wins_over_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("config.yml"),
        "models:\n  response:\n    provider: openai\n    model_id: gpt-4o\napi:\n  providers:\n    openai:\n      api_key: ${OPENAI_API_KEY}\nsystem:\n  timezone: ${TZ:-UTC}\n",
    )
    .expect("write");
    std::fs::write(dir.path().join(".env"), "OPENAI_API_KEY=sk-from-dotenv-0001\n").expect("write");
    let process = env(&[("OPENAI_API_KEY", "sk-from-environment-0002"), ("TZ", "Europe/Berlin")]);
    let config = Config::load_with(&LoadOptions::default(), dir.path(), &process).expect("loads ./config.yml");
    assert_eq!(config.source, Some(dir.path().join("config.yml")));
    assert_eq!(config.llm.provider("openai").api_key.as_ref().map(|key| key.expose()), Some("sk-from-dotenv-0001"));
    assert_eq!(config.settings.timezone, chrono_tz::Europe::Berlin, "variables not in .env come from the environment");
    assert_eq!(config.redact("sk-from-dotenv-0001"), "***");

    std::fs::write(dir.path().join(".env"), "OPENAI_API_KEY=\"sk-unterminated\n").expect("write");
    let error = Config::load_with(&LoadOptions::default(), dir.path(), &process).expect_err("malformed .env");
    assert_eq!(error.file, Some(dir.path().join(".env")));
    assert_eq!(error.line, Some(1));
    assert!(!error.to_string().contains("sk-unterminated"), "{error}");
}

#[test]
fn discovery_order_and_a_missing_explicit_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("config.yml"), MINIMAL).expect("write");
    std::fs::write(dir.path().join("peregrine.yml"), "models:\n  orchestrator:\n    provider: anthropic\n    model_id: claude\n")
        .expect("write");
    let none = env(&[]);
    let by_variable = env(&[("PEREGRINE_CONFIG", "peregrine.yml")]);
    let found = |env: &dyn Fn(&str) -> Option<String>, explicit: Option<&str>| {
        Config::load_with(&LoadOptions { explicit: explicit.map(PathBuf::from) }, dir.path(), env).expect("loads").llm.models["orchestrator"].provider.clone()
    };
    assert_eq!(found(&none, None), "openai");
    assert_eq!(found(&by_variable, None), "anthropic");
    assert_eq!(found(&by_variable, Some("config.yml")), "openai", "--config wins");
    let error = Config::load_with(&LoadOptions { explicit: Some("missing.yml".into()) }, dir.path(), &none).expect_err("missing");
    assert_eq!(error.file, Some(dir.path().join("missing.yml")));
    assert!(error.to_string().contains("missing.yml"), "{error}");
}

#[test]
fn bad_yaml_has_a_line_and_column() {
    let error = parse_err("models:\n  orchestrator:\n    provider: openai\n      model_id: gpt-4o\n", &[]);
    assert_eq!(error.file.as_deref(), Some(Path::new("/srv/agent/config.yml")));
    assert_eq!(error.line, Some(4), "{error}");
    assert!(error.column.is_some(), "{error}");
    assert!(!error.message.contains(" at line "), "the position is in the fields, not repeated: {error}");
    assert!(error.to_string().starts_with("/srv/agent/config.yml:4:"), "{error}");
}

#[test]
fn wrong_types_have_the_line_and_dotted_key() {
    let error = parse_err("models:\n  orchestrator:\n    provider: openai\n    model_id: gpt-4o\n    max_tokens: lots\n", &[]);
    assert_eq!((error.line, error.column), (Some(5), Some(17)), "{error}");
    assert_eq!(error.key.as_deref(), Some("models.orchestrator.max_tokens"));
    assert!(error.message.contains("expected a positive integer"), "{error}");

    let error = parse_err("execution_control:\n  limits:\n    graph_recursion_limit: many\n", &[]);
    assert_eq!(error.line, Some(3), "{error}");
    assert_eq!(error.key.as_deref(), Some("execution_control.limits.graph_recursion_limit"));
    assert!(error.message.contains("expected a whole number"), "{error}");

    let error = parse_err("system:\n  timezone: Mars/Olympus_Mons\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("system.timezone")), "{error}");
    assert!(error.message.contains("IANA timezone"), "{error}");

    let error = parse_err("approval:\n  global_mode: sometimes\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("approval.global_mode")), "{error}");
    assert!(error.message.contains("selective") && error.message.contains("all_capabilities"), "{error}");

    let error = parse_err("execution_control:\n  classifier_mode: psychic\n", &[]);
    assert!(error.message.contains("per_capability"), "{error}");

    let error = parse_err("execution_control:\n  limits:\n    max_planning_attempts: 0\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(3), Some("execution_control.limits.max_planning_attempts")), "{error}");
}

#[test]
fn an_unknown_provider_points_at_its_provider_key() {
    let text = "\
api:
  providers:
    my-gateway:
      protocol: openai
      base_url: http://127.0.0.1:9/v1
models:
  classifier:
    provider: my-gateway
    model_id: m
  orchestrator:
    model_id: m
    provider: cborgg
";
    let error = parse_err(text, &[]);
    assert_eq!((error.line, error.column), (Some(12), Some(5)), "{error}");
    assert_eq!(error.key.as_deref(), Some("models.orchestrator.provider"));
    assert!(error.message.contains("cborgg") && error.message.contains("cborg") && error.message.contains("my-gateway"), "{error}");
}

#[test]
fn unknown_keys_in_peregrine_sections_are_errors_and_elsewhere_ignored() {
    let error = parse_err("models:\n  orchestrator:\n    provider: openai\n    model_id: gpt-4o\n    max_token: 10\n", &[]);
    assert_eq!(error.line, Some(5), "{error}");
    assert_eq!(error.key.as_deref(), Some("models.orchestrator.max_token"));
    assert!(error.message.contains("`max_token`") && error.message.contains("did you mean `max_tokens`"), "{error}");

    let error = parse_err("checkpointer:\n  type: sqlite\n  pth: x.db\n", &[]);
    assert!(error.message.contains("did you mean `path`"), "{error}");

    let config = parse(
        &format!(
            "{MINIMAL}my_extension:\n  enabled: true\nlogging:\n  levle: debug\napi:\n  providers:\n    openai:\n      base_ur1: http://x\n"
        ),
        &[],
    )
    .expect("lenient sections load");
    assert_eq!(config.ignored_keys, ["api.providers.openai.base_ur1", "logging.levle", "my_extension"]);
    assert!(config.warnings.iter().any(|warning| warning.contains("did you mean logging.level?")), "{:?}", config.warnings);
    assert!(config.warnings.iter().any(|warning| warning.contains("did you mean api.providers.openai.base_url?")), "{:?}", config.warnings);
}

#[test]
fn secrets_never_reach_an_error_message() {
    let text = "api:\n  providers:\n    openai:\n      timeout_seconds: ${SECRET_TOKEN}\n";
    let error = parse_err(text, &[("SECRET_TOKEN", "hunter2-super-secret")]);
    assert_eq!((error.line, error.key.as_deref()), (Some(4), Some("api.providers.openai.timeout_seconds")), "{error}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
    assert!(error.message.contains("***") && error.message.contains("positive number of seconds"), "{error}");

    let error = parse_err("approval:\n  global_mode: ${DB_PASSWORD}\n", &[("DB_PASSWORD", "correct-horse-battery")]);
    assert!(!error.to_string().contains("correct-horse"), "{error}");
    // Even a secret too short to scrub from every message stays out of the error about its key.
    let error = parse_err("approval:\n  global_mode: ${DB_PASSWORD}\n", &[("DB_PASSWORD", "pw1")]);
    assert!(!error.to_string().contains("pw1"), "{error}");
}

#[test]
fn embedded_defaults_come_from_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lookups = env(&[("PEREGRINE_MODEL_DIR", "/models"), ("XDG_DATA_HOME", "/xdg"), ("HOME", "/home/op")]);
    let config = Config::load_with(&LoadOptions::default(), dir.path(), &lookups).expect("no file is fine");
    assert_eq!(config.source, None);
    assert_eq!(config.project_dir, dir.path());
    let model = config.llm.model_for("orchestrator").expect("every role has a model");
    assert_eq!(model.config_key, "default");
    assert_eq!(
        *model.model,
        ModelConfig { provider: "local".into(), model_id: "smollm2-135m-instruct".into(), max_tokens: Some(512), temperature: Some(0.0) }
    );
    assert_eq!(config.llm.provider("local").model_path.as_deref(), Some("/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(config.settings.agent_data_dir, Path::new("/xdg/peregrine"));
    assert_eq!(config.checkpointer, CheckpointerConfig::Sqlite { path: PathBuf::from("/xdg/peregrine/checkpoints/peregrine.db") });
    assert_eq!(config.redacted()["source"], serde_json::Value::Null);
    // The working directory's .env is read for the embedded defaults too.
    std::fs::write(dir.path().join(".env"), "PEREGRINE_DATA_DIR=/from-dotenv\n").expect("write");
    let config = Config::load_with(&LoadOptions::default(), dir.path(), &lookups).expect("no file is fine");
    assert_eq!(config.settings.agent_data_dir, Path::new("/from-dotenv"));

    let home_only = Config::embedded_with(dir.path(), &env(&[("HOME", "/home/op"), ("PEREGRINE_LOCAL_MODEL", "/m/model.gguf")]));
    assert_eq!(home_only.settings.agent_data_dir, Path::new("/home/op/.local/share/peregrine"));
    assert_eq!(home_only.llm.provider("local").model_path.as_deref(), Some("/m/model.gguf"));

    // A file without `models` runs on the embedded model too; its paths follow the file.
    let config = parse("approval:\n  global_mode: disabled\n", &[("HOME", "/home/op")]).expect("loads");
    assert_eq!(config.llm.model_for("response").expect("default").model.provider, "local");
    assert_eq!(
        config.llm.provider("local").model_path.as_deref(),
        Some("/home/op/.cache/peregrine/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    assert_eq!(config.settings.agent_data_dir, Path::new("/srv/agent/_agent_data"));
    assert_eq!(config.settings.turn_defaults().approval_mode, ApprovalMode::Disabled);
    // An empty file is the defaults.
    assert!(parse("# nothing yet\n", &[]).expect("empty is fine").llm.models.contains_key("default"));
}

#[test]
fn checkpointer_sections() {
    let sqlite = parse("checkpointer:\n  type: sqlite\n  path: state/threads.db\n", &[]).expect("loads");
    assert_eq!(sqlite.checkpointer, CheckpointerConfig::Sqlite { path: PathBuf::from("/srv/agent/state/threads.db") });
    let default_path = parse("file_paths:\n  agent_data_dir: /var/lib/agent\n", &[]).expect("loads");
    assert_eq!(default_path.checkpointer, CheckpointerConfig::Sqlite { path: PathBuf::from("/var/lib/agent/checkpoints/peregrine.db") });

    let memory = parse("checkpointer:\n  type: memory\n", &[]).expect("loads");
    assert_eq!(memory.checkpointer, CheckpointerConfig::Memory);
    assert_eq!(memory.redacted()["checkpointer"]["type"], "memory");

    let error = parse_err("models: {}\ncheckpointer:\n  type: postgres\n  pool_size: 4\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(3), Some("checkpointer.type")), "{error}");
    assert!(error.message.contains("checkpointer.url"), "{error}");

    let text = "checkpointer:\n  type: postgres\n  url: postgres://agent:${PG_PASSWORD}@db.example:5432/peregrine\n  pool_size: 4\n";
    let postgres = parse(text, &[("PG_PASSWORD", "pg-pass-93f1")]).expect("loads");
    let CheckpointerConfig::Postgres { url, pool_size } = &postgres.checkpointer else {
        panic!("postgres expected: {:?}", postgres.checkpointer);
    };
    assert_eq!((url.expose(), *pool_size), ("postgres://agent:pg-pass-93f1@db.example:5432/peregrine", Some(4)));
    assert_eq!(postgres.redacted()["checkpointer"]["url"], "postgres://agent:***@db.example:5432/peregrine");
    assert!(!postgres.redacted().to_string().contains("pg-pass-93f1"));
    assert!(!format!("{postgres:?}").contains("pg-pass-93f1"));
    assert_eq!(postgres.redact("connection to postgres://agent:pg-pass-93f1@db failed"), "connection to postgres://agent:***@db failed");

    let error = parse_err("checkpointer:\n  type: redis\n", &[]);
    assert_eq!(error.line, Some(2), "{error}");
    assert!(error.message.contains("sqlite") && error.message.contains("postgres"), "{error}");
}

#[test]
fn react_is_not_supported_and_peregrine_keys_are_read() {
    let text = "\
execution_control:
  agent_control:
    orchestration_mode: react
    capability_selection_bypass_enabled: true
  classifier_mode: per_capability
  prompt_history_chars: 8000
  data_source_timeout_seconds: 2.5
logging:
  level: peregrine=debug,warn
  file: logs/peregrine.log
  rich_tracebacks: true
development:
  raise_raw_errors: true
";
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("logs")).expect("mkdir");
    let config = Config::from_text(text, &dir.path().join("config.yml"), &env(&[])).expect("loads");
    assert!(config.warnings.iter().any(|warning| warning.contains("react") && warning.contains("plan_first")), "{:?}", config.warnings);
    assert!(config.settings.agent_control.capability_selection_bypass_enabled);
    assert_eq!(config.settings.classifier_mode, ClassifierMode::PerCapability);
    assert_eq!(config.settings.prompt_history_chars, 8000);
    assert_eq!(config.settings.data_source_timeout, std::time::Duration::from_millis(2500));
    assert_eq!(config.logging.level.as_deref(), Some("peregrine=debug,warn"));
    assert_eq!(config.logging.file, Some(dir.path().join("logs/peregrine.log")));
    assert!(config.development.raise_raw_errors && !config.development.save_api_calls);
    assert_eq!(config.ignored_keys, ["logging.rich_tracebacks"]);
    assert_eq!(config.redacted()["execution_control"]["agent_control"]["orchestration_mode"], "plan_first");
}

#[test]
fn built_in_capabilities_can_be_left_out_by_name_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.yml");
    let config = Config::from_text("capabilities:\n  exclude: [memory]\n", &path, &env(&[])).expect("loads");
    assert!(!config.capabilities.includes("memory") && config.capabilities.includes("time_range_parsing"));
    assert_eq!(config.redacted()["capabilities"]["exclude"], serde_json::json!(["memory"]));
    let error =
        Config::from_text("models: {}\ncapabilities:\n  exclude: [current_weather]\n", &path, &env(&[])).expect_err("not a built-in");
    assert_eq!((error.line, error.key.as_deref()), (Some(3), Some("capabilities.exclude")), "{error}");
    assert!(error.message.contains("memory, time_range_parsing"), "{error}");
    let error = Config::from_text("capabilities:\n  exclued: [memory]\n", &path, &env(&[])).expect_err("a typo");
    assert_eq!(error.line, Some(2), "{error}");

    // The embedded defaults: a conversational agent for the small local model.
    let embedded = Config::embedded_with(dir.path(), &env(&[("HOME", "/home/operator")]));
    assert!(embedded.settings.agent_control.task_extraction_bypass_enabled);
    assert!(!embedded.capabilities.includes("memory") && !embedded.capabilities.includes("time_range_parsing"));
    let from_file = Config::from_text(&format!("{MINIMAL}system:\n  timezone: UTC\n"), &path, &env(&[])).expect("loads");
    assert!(from_file.capabilities.exclude.is_empty() && !from_file.settings.agent_control.task_extraction_bypass_enabled);
}

/// The checkpointer's `url` of a configuration, as `config show` prints it.
fn shown_url(config: &Config) -> String {
    config.redacted()["checkpointer"]["url"].as_str().unwrap_or_default().to_owned()
}

fn postgres(url: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    parse(&format!("{MINIMAL}checkpointer:\n  type: postgres\n  url: \"{url}\"\n"), pairs)
}

#[test]
fn postgres_passwords_never_print_in_any_form() {
    let cases: &[(&str, &str, &str)] = &[
        ("host=db user=app password=hunter2-kv dbname=x", "hunter2-kv", "host=db user=app password=*** dbname=x"),
        ("host=db password = 'quoted pw 42' dbname=x", "quoted pw 42", "host=db password = *** dbname=x"),
        ("postgres://app:pa#ss?w0rd@127.0.0.1:9/x", "pa#ss?w0rd", "postgres://app:***@127.0.0.1:9/x"),
        ("postgresql://app:pa%23ss-enc@db/x", "pa#ss-enc", "postgresql://app:***@db/x"),
        ("postgres://db:5432/x?user=app&password=query-pw-7", "query-pw-7", "postgres://db:5432/x?user=app&password=***"),
    ];
    for (url, password, shown) in cases {
        let config = postgres(url, &[]).unwrap_or_else(|error| panic!("{url}: {error}"));
        assert_eq!(shown_url(&config), *shown, "{url}");
        let everything = format!("{} {config:?}", config.redacted());
        assert!(!everything.contains(password), "{url}: {everything}");
        assert_eq!(config.redact(&format!("auth failed for {password}")), "auth failed for ***", "{url}");
    }
    // The percent-encoded form of a password is hidden too.
    let config = postgres("postgresql://app:pa%23ss-enc@db/x", &[]).expect("loads");
    assert!(!config.redact("pa%23ss-enc").contains("pa%23ss"), "the written form is a secret too");

    // DATABASE_URL (a *_URL variable holding a password) is a secret wherever it is used.
    let config = postgres("${DATABASE_URL}", &[("DATABASE_URL", "postgres://app:dburl-secret-77@db/x")]).expect("loads");
    assert_eq!(shown_url(&config), "postgres://app:***@db/x");
    assert_eq!(config.redact("postgres://app:dburl-secret-77@db/x"), "***");
    assert_eq!(config.redact("password dburl-secret-77"), "password ***");

    // A URL that does not parse is an error at its line that does not quote it.
    let error = postgres("postgres://app:unparsed-pw@[::1/x", &[]).expect_err("a broken host");
    assert_eq!((error.line, error.key.as_deref()), (Some(7), Some("checkpointer.url")), "{error}");
    assert!(!error.to_string().contains("unparsed-pw"), "{error}");
    let error = postgres("host=db password='unterminated", &[]).expect_err("an unterminated quote");
    assert_eq!(error.key.as_deref(), Some("checkpointer.url"), "{error}");
    assert!(!error.to_string().contains("unterminated") || !error.to_string().contains("password='"), "{error}");
}

#[test]
fn a_literal_dollar_in_a_secret_is_hidden_and_never_quoted() {
    let with_key = |key: &str| format!("{MINIMAL}api:\n  providers:\n    openai:\n      api_key: {key}\n");
    let config = parse(&with_key("sk-abc$defSecretTail"), &[]).expect("loads");
    assert_eq!(config.llm.provider("openai").api_key.as_ref().map(|key| key.expose()), Some("sk-abc$defSecretTail"));
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0]
            .starts_with("api.providers.openai.api_key contains a `$` reference to a variable that is not set; it is kept as written"),
        "{:?}",
        config.warnings
    );
    let everything = format!("{} {config:?} {:?}", config.redacted(), config.warnings);
    assert!(!everything.contains("SecretTail") && !everything.contains("sk-abc"), "{everything}");
    assert_eq!(config.redact("key sk-abc$defSecretTail"), "key ***");

    // `$$` is a literal `$`.
    let config = parse(&with_key("sk-abc$$defSecretTail"), &[]).expect("loads");
    assert_eq!(config.llm.provider("openai").api_key.as_ref().map(|key| key.expose()), Some("sk-abc$defSecretTail"));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(config.redact("key sk-abc$defSecretTail"), "key ***");

    // A key that is not a secret still names the variable.
    let config = parse("models:\n  orchestrator:\n    provider: openai\n    model_id: m-$UNSET_SUFFIX\n", &[]).expect("loads");
    assert!(config.warnings.iter().any(|warning| warning.contains("$UNSET_SUFFIX")), "{:?}", config.warnings);
}

#[test]
fn dotenv_values_follow_python_dotenv() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("config.yml"),
        format!("{MINIMAL}api:\n  providers:\n    openai:\n      api_key: ${{PG_PASSWORD}}\n      base_url: ${{BASE:-http://127.0.0.1:9}}/${{SUFFIX}}\n"),
    )
    .expect("write");
    // python-dotenv 1.2: PG_PASSWORD is `abc$defXYZ9`, SUFFIX is `q$HOME` (no bare `$VAR` expansion).
    std::fs::write(dir.path().join(".env"), "PG_PASSWORD=abc$defXYZ9\nSUFFIX=\"q$HOME\"\n").expect("write");
    let config = Config::load_with(&LoadOptions::default(), dir.path(), &env(&[("HOME", "/home/op")])).expect("loads");
    let openai = config.llm.provider("openai");
    assert_eq!(openai.api_key.as_ref().map(|key| key.expose()), Some("abc$defXYZ9"));
    assert_eq!(openai.base_url.as_deref(), Some("http://127.0.0.1:9/q$HOME"));

    std::fs::write(dir.path().join(".env"), "GOOD=1\n\nX=\"q\nY=2\n").expect("write");
    let error = Config::load_with(&LoadOptions::default(), dir.path(), &env(&[])).expect_err("unterminated quote");
    assert_eq!((error.file.clone(), error.line), (Some(dir.path().join(".env")), Some(3)), "{error}");
}

#[test]
fn dotenv_is_read_from_the_working_directory_and_beside_the_file() {
    let work = tempfile::tempdir().expect("temp dir");
    let project = work.path().join("project");
    std::fs::create_dir(&project).expect("mkdir");
    std::fs::write(project.join("config.yml"), "models:\n  orchestrator:\n    provider: openai\n    model_id: ${MODEL}-${SIZE}-${TIER}\n")
        .expect("write");
    std::fs::write(work.path().join(".env"), "MODEL=from-cwd\nSIZE=cwd-size\nTIER=${SIZE}\n").expect("write");
    std::fs::write(project.join(".env"), "MODEL=from-project\n").expect("write");
    let options = LoadOptions { explicit: Some(PathBuf::from("project/config.yml")) };
    let config = Config::load_with(&options, work.path(), &env(&[("SIZE", "process-size")])).expect("loads");
    assert_eq!(config.llm.models["orchestrator"].model_id, "from-project-cwd-size-cwd-size", "the config's .env wins, then the cwd's");

    // A config file in the working directory: its .env is read once (not expanded twice).
    std::fs::write(work.path().join("config.yml"), "models:\n  orchestrator:\n    provider: openai\n    model_id: ${HOME}\n")
        .expect("write");
    std::fs::write(work.path().join(".env"), "HOME=${HOME}/x\n").expect("write");
    let config = Config::load_with(&LoadOptions::default(), work.path(), &env(&[("HOME", "/home/op")])).expect("loads");
    assert_eq!(config.llm.models["orchestrator"].model_id, "/home/op/x");
}

const MERGED: &str = "\
defaults: &d
  provider: openai
  model_id: 3.10
models:
  orchestrator:
    <<: *d
    max_tokens: 100
api:
  providers:
    openai:
      api_key: 1234567890
";

#[test]
fn merge_keys_keep_the_text_of_every_scalar() {
    let config = parse(MERGED, &[]).expect("loads");
    assert_eq!(config.llm.models["orchestrator"].model_id, "3.10", "not the number 3.1");
    assert_eq!(config.llm.models["orchestrator"].max_tokens, Some(100));
    assert_eq!(config.llm.provider("openai").api_key.as_ref().map(|key| key.expose()), Some("1234567890"));
}

#[test]
fn an_all_digit_key_is_a_secret_in_a_file_with_merge_keys() {
    let config = parse(MERGED, &[]).expect("loads");
    assert_eq!(config.redact("key 1234567890"), "key ***");
}

#[test]
fn merge_keys_in_flow_style_are_merged() {
    let text = "defaults: &d {provider: openai, model_id: gpt-4o}\nmodels:\n  response: {<<: *d, model_id: 0.5e1, max_tokens: 7}\n";
    let config = parse(text, &[]).expect("loads");
    let response = &config.llm.models["response"];
    assert_eq!((response.provider.as_str(), response.model_id.as_str(), response.max_tokens), ("openai", "0.5e1", Some(7)));
}

#[test]
fn a_block_scalar_line_starting_with_two_angle_brackets_is_text() {
    let text = "models:\n  orchestrator:\n    provider: openai\n    model_id: 3.10\nnotes: |\n  <<SYS>> a prompt format\n";
    assert_eq!(parse(text, &[]).expect("loads").llm.models["orchestrator"].model_id, "3.10");
}

#[test]
fn config_validate_refuses_what_run_refuses() {
    let provider = |base_url: &str| format!("{MINIMAL}api:\n  providers:\n    openai:\n      base_url: {base_url}\n");
    let error = parse_err(&provider("localhost:8080/v1"), &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(8), Some("api.providers.openai.base_url")), "{error}");
    assert!(error.message.contains("http://"), "{error}");
    parse(&provider("http://localhost:8080/v1"), &[]).expect("a URL with a scheme");
    let unused = "models:\n  orchestrator: {provider: openai, model_id: m}\napi:\n  providers:\n    vllm:\n      base_url: nowhere\n";
    parse(unused, &[]).expect("a provider no model uses is not built, so not checked");
}

#[test]
fn config_validate_refuses_log_levels_tracing_refuses() {
    let logging = |level: &str| format!("{MINIMAL}logging:\n  level: {level}\n");
    for level in ["peregrine=loud", "verbose", "debug,chatty"] {
        let error = parse_err(&logging(level), &[]);
        assert_eq!((error.line, error.key.as_deref()), (Some(6), Some("logging.level")), "{level}: {error}");
        assert!(error.message.contains("trace, debug, info, warn, error"), "{level}: {error}");
    }
    for level in ["info", "WARN", "peregrine=debug,warn", "off", "peregrine_llm=trace"] {
        parse(&logging(level), &[]).unwrap_or_else(|error| panic!("{level}: {error}"));
    }
}

#[test]
fn config_validate_refuses_a_log_file_in_a_missing_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = format!("{MINIMAL}logging:\n  file: missing-dir/peregrine.log\n");
    let error = Config::from_text(&text, &dir.path().join("config.yml"), &env(&[])).expect_err("no such directory");
    assert_eq!((error.line, error.key.as_deref()), (Some(6), Some("logging.file")), "{error}");
    assert!(error.message.contains("missing-dir"), "{error}");
    std::fs::create_dir(dir.path().join("missing-dir")).expect("mkdir");
    Config::from_text(&text, &dir.path().join("config.yml"), &env(&[])).expect("the directory exists now");
}

#[test]
fn an_unset_variable_in_a_typed_value_says_what_to_do() {
    let error = parse_err("models:\n  orchestrator:\n    provider: openai\n    model_id: m\n    max_tokens: ${NOPE}\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(5), Some("models.orchestrator.max_tokens")), "{error}");
    assert!(
        error.message.starts_with("`${NOPE}` is not set (so max_tokens got the text `${NOPE}`): set it in the environment or .env"),
        "{error}"
    );
    assert!(error.message.contains("`${NOPE:-4096}`"), "{error}");

    let nested = "models:\n  orchestrator:\n    provider: openai\n    model_id: ${MODEL:-${FALLBACK_MODEL:-gpt-4o}}\n";
    assert_eq!(parse(nested, &[]).expect("loads").llm.models["orchestrator"].model_id, "gpt-4o");
    assert_eq!(parse(nested, &[("FALLBACK_MODEL", "mini")]).expect("loads").llm.models["orchestrator"].model_id, "mini");
    assert_eq!(parse(nested, &[("MODEL", "big"), ("FALLBACK_MODEL", "mini")]).expect("loads").llm.models["orchestrator"].model_id, "big");

    let config = parse("models:\n  orchestrator:\n    provider: openai\n    model_id: ${MODEL\n", &[]).expect("loads");
    assert!(
        config.warnings.iter().any(|warning| warning.contains("models.orchestrator.model_id") && warning.contains("unterminated")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn short_secrets_do_not_garble_messages() {
    let config = postgres("postgres://app:a@localhost/x", &[]).expect("loads");
    assert_eq!(shown_url(&config), "postgres://app:***@localhost/x");
    assert_eq!(config.redact("local data"), "local data");
    assert_eq!(config.redacted()["source"], "/srv/agent/config.yml");
    let config = parse(&format!("{MINIMAL}api:\n  providers:\n    openai:\n      api_key: x1\n"), &[]).expect("loads");
    assert_eq!(config.redacted()["api"]["providers"]["openai"]["api_key"], "***");
    assert_eq!(config.redact("x1 and x10"), "x1 and x10");
}

#[test]
fn tz_naming_a_zone_file_is_resolved_through_its_link() {
    let dir = tempfile::tempdir().expect("temp dir");
    let link = dir.path().join("localtime");
    std::os::unix::fs::symlink("/usr/share/zoneinfo/Europe/Paris", &link).expect("symlink");
    let text = "system:\n  timezone: ${TZ:-America/Los_Angeles}\n";
    let config = parse(text, &[("TZ", &format!(":{}", link.display()))]).expect("loads");
    assert_eq!(config.settings.timezone, chrono_tz::Europe::Paris);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let plain = dir.path().join("plain");
    std::fs::write(&plain, "TZif").expect("write");
    let config = parse(text, &[("TZ", &format!(":{}", plain.display()))]).expect("a zone file that is not a link");
    assert_eq!(config.settings.timezone, chrono_tz::UTC);
    assert!(config.warnings.iter().any(|warning| warning.contains("TZ") && warning.contains("UTC")), "{:?}", config.warnings);
}

#[test]
fn a_file_without_models_gets_the_embedded_profile() {
    let config = parse("approval:\n  global_mode: disabled\n", &[]).expect("loads");
    assert!(config.uses_embedded_model());
    assert!(config.settings.agent_control.task_extraction_bypass_enabled);
    assert!(!config.capabilities.includes("memory") && !config.capabilities.includes("time_range_parsing"));

    let explicit = "execution_control:\n  agent_control:\n    task_extraction_bypass_enabled: false\ncapabilities:\n  exclude: [memory]\n";
    let config = parse(explicit, &[]).expect("loads");
    assert!(config.uses_embedded_model());
    assert!(!config.settings.agent_control.task_extraction_bypass_enabled, "set explicitly");
    assert_eq!(config.capabilities.exclude, ["memory"], "the file's section");

    let config = parse(MINIMAL, &[]).expect("loads");
    assert!(!config.uses_embedded_model());
    assert!(!config.settings.agent_control.task_extraction_bypass_enabled && config.capabilities.exclude.is_empty());
    assert!(Config::embedded_with(Path::new("/w"), &env(&[])).uses_embedded_model());
}

#[test]
fn yaml_1_1_booleans_are_read_as_pyyaml_reads_them() {
    let text = "execution_control:\n  agent_control:\n    planning_mode_enabled: yes\n    capability_selection_bypass_enabled: On\ndevelopment:\n  raise_raw_errors: no\n  api_calls:\n    save_all: off\n";
    let config = parse(&format!("{MINIMAL}{text}"), &[]).expect("loads");
    assert!(config.settings.agent_control.planning_mode_enabled && config.settings.agent_control.capability_selection_bypass_enabled);
    assert!(!config.development.raise_raw_errors && !config.development.save_api_calls);
}

#[test]
fn a_byte_order_mark_does_not_move_lines_or_hide_the_first_key() {
    let error = parse_err("\u{feff}models:\n  orchestrator:\n    provider: nowhere\n    model_id: m\n", &[]);
    assert_eq!((error.line, error.column), (Some(3), Some(5)), "{error}");
}

#[test]
fn a_missing_key_points_at_the_mapping_that_lacks_it() {
    let error = parse_err("models:\n  orchestrator:\n    provider: openai\n\napi: {}\n", &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("models.orchestrator")), "{error}");
    assert!(error.message.contains("missing key `model_id`"), "{error}");
}

#[test]
fn debug_shows_every_section() {
    let config = parse("capabilities:\n  exclude: [memory]\n", &[]).expect("loads");
    assert!(format!("{config:?}").contains("capabilities: CapabilitiesConfig"), "{config:?}");
}

#[test]
fn the_server_section_defaults_to_loopback_and_hides_its_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.yml");
    let config = Config::from_text("system:\n  timezone: UTC\n", &path, &env(&[])).expect("loads");
    assert_eq!((config.server.host.as_str(), config.server.port, config.server.api_keys.len()), ("127.0.0.1", 8000, 0));
    let text = "server:\n  host: 0.0.0.0\n  port: 9090\n  api_keys:\n    - ${SERVE_KEY}\n    - second-key-123456\n  status_lines: no\n";
    let config = Config::from_text(text, &path, &env(&[("SERVE_KEY", "first-key-abcdef")])).expect("loads");
    assert_eq!((config.server.host.as_str(), config.server.port, config.server.status_lines), ("0.0.0.0", 9090, StatusLines::Off));
    assert_eq!(config.server.api_keys.iter().map(|key| key.expose()).collect::<Vec<_>>(), ["first-key-abcdef", "second-key-123456"]);
    assert_eq!(config.redacted()["server"]["status_lines"], "off");
    // Progress as reasoning by default; the words, the old booleans and a variable all read.
    assert_eq!(Config::from_text("server: {}\n", &path, &env(&[])).expect("loads").server.status_lines, StatusLines::Reasoning);
    for (written, mode) in [
        ("content", StatusLines::Content),
        ("reasoning", StatusLines::Reasoning),
        ("off", StatusLines::Off),
        ("true", StatusLines::Reasoning),
        ("yes", StatusLines::Reasoning),
        ("false", StatusLines::Off),
        ("${STATUS_LINES}", StatusLines::Content),
    ] {
        let text = format!("server:\n  status_lines: {written}\n");
        let config = Config::from_text(&text, &path, &env(&[("STATUS_LINES", "content")])).expect(written);
        assert_eq!(config.server.status_lines, mode, "{written}");
    }
    let error = Config::from_text("server:\n  status_lines: loud\n", &path, &env(&[])).expect_err("not a mode");
    assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("server.status_lines")), "{error}");
    let shown = config.redacted().to_string() + &format!("{config:?}");
    assert!(!shown.contains("first-key-abcdef") && !shown.contains("second-key-123456"), "{shown}");
    assert_eq!(config.redact("key second-key-123456 used"), "key *** used");
    let error = Config::from_text("server:\n  port: 70000\n", &path, &env(&[])).expect_err("not a port");
    assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("server.port")), "{error}");
    let error = Config::from_text("server:\n  api_keys:\n    - ${UNSET_SERVE_KEY}\n", &path, &env(&[])).expect_err("unset key");
    assert_eq!(error.key.as_deref(), Some("server.api_keys"), "{error}");
    assert!(!error.message.contains("UNSET_SERVE_KEY}") || error.message.contains("not set"), "{error}");
}

#[test]
fn deeply_nested_defaults_are_refused_with_their_position_not_a_crash() {
    let nested = |levels: usize| format!("{}x{}", "${A:-".repeat(levels), "}".repeat(levels));
    let value = |levels: usize| format!("models:\n  orchestrator:\n    provider: openai\n    model_id: {}\n", nested(levels));
    let config = parse(&value(32), &[]).expect("32 levels are allowed");
    assert_eq!(config.llm.models["orchestrator"].model_id, "x");
    for levels in [33, 100_000] {
        let error = parse_err(&value(levels), &[]);
        assert_eq!((error.line, error.column), (Some(4), Some(15)), "{levels}: {error}");
        assert_eq!(error.key.as_deref(), Some("models.orchestrator.model_id"), "{levels}: {error}");
        assert!(error.message.contains("more than 32 levels"), "{levels}: {error}");
        assert!(error.to_string().starts_with("/srv/agent/config.yml:4:15: models.orchestrator.model_id: "), "{error}");
    }
    // Megabytes of unclosed or unbalanced `${` are refused too, in one pass over the value.
    for junk in ["${".repeat(2_000_000), "${A:-${B}".repeat(300_000), format!("{}{}", "${".repeat(40), "}".repeat(1_000_000))] {
        let error = parse_err(&format!("system:\n  timezone: \"{junk}\"\n"), &[]);
        assert_eq!((error.line, error.key.as_deref()), (Some(2), Some("system.timezone")), "{}", error.message.len());
        assert!(error.message.contains("more than 32 levels"), "{}", &error.message[..200.min(error.message.len())]);
    }
}

#[test]
fn pool_sizes_are_bounded_by_what_a_pool_can_hold() {
    let checkpointer = |size: &str| format!("checkpointer:\n  type: postgres\n  url: postgres://agent@db/peregrine\n  pool_size: {size}\n");
    let config = parse(&checkpointer("256"), &[]).expect("256 connections");
    assert!(matches!(config.checkpointer, CheckpointerConfig::Postgres { pool_size: Some(256), .. }), "{:?}", config.checkpointer);
    for size in ["257", "4294967295", "${POOL:-100000}"] {
        let error = parse_err(&checkpointer(size), &[]);
        assert_eq!((error.line, error.column, error.key.as_deref()), (Some(4), Some(3), Some("checkpointer.pool_size")), "{size}: {error}");
        assert!(error.message.contains("from 1 to 256"), "{size}: {error}");
    }
    let error = parse_err(&checkpointer("0"), &[]);
    assert_eq!((error.line, error.key.as_deref()), (Some(4), Some("checkpointer.pool_size")), "{error}");
}

#[test]
fn sizes_and_budgets_that_would_exhaust_memory_or_never_end_are_refused() {
    let cases: &[(&str, &str, usize, &str)] = &[
        ("server:\n  max_body_bytes: 4294967295\n", "server.max_body_bytes", 2, "from 1024 to 67108864"),
        ("server:\n  max_body_bytes: 100\n", "server.max_body_bytes", 2, "from 1024 to 67108864"),
        (
            "execution_control:\n  limits:\n    graph_recursion_limit: 4294967295\n",
            "execution_control.limits.graph_recursion_limit",
            3,
            "10000",
        ),
        (
            "execution_control:\n  limits:\n    max_execution_time_seconds: 18446744073709551615\n",
            "execution_control.limits.max_execution_time_seconds",
            3,
            "86400",
        ),
        ("api:\n  providers:\n    openai:\n      timeout_seconds: 999999999\n", "api.providers.openai.timeout_seconds", 4, "86400"),
        ("execution_control:\n  data_source_timeout_seconds: 1e8\n", "execution_control.data_source_timeout_seconds", 2, "86400"),
    ];
    for (text, key, line, says) in cases {
        let error = parse_err(&format!("{MINIMAL}{text}"), &[]);
        assert_eq!((error.line, error.key.as_deref()), (Some(line + 4), Some(*key)), "{text}: {error}");
        assert!(error.message.contains(says), "{text}: {error}");
    }
    let text = "server:\n  max_body_bytes: 67108864\nexecution_control:\n  limits:\n    graph_recursion_limit: 10000\n    max_execution_time_seconds: 86400\n";
    let config = parse(&format!("{MINIMAL}{text}"), &[]).expect("the largest values allowed");
    assert_eq!((config.server.max_body_bytes, config.settings.limits.graph_recursion_limit), (64 << 20, 10_000));
}

#[test]
fn an_agent_data_dir_that_is_a_file_is_refused_by_validate_and_run_alike() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.yml");
    std::fs::write(dir.path().join("data"), "not a directory").expect("write");
    let text = format!("{MINIMAL}file_paths:\n  agent_data_dir: data\n");
    std::fs::write(&path, &text).expect("write");
    // `config validate` and `run` both load through `Config::load`.
    let options = LoadOptions { explicit: Some(path.clone()) };
    let error = Config::load_with(&options, dir.path(), &env(&[])).expect_err("a file is not a directory");
    assert_eq!((error.line, error.column, error.key.as_deref()), (Some(6), Some(3), Some("file_paths.agent_data_dir")), "{error}");
    assert!(error.message.contains("is a file") && error.message.contains("directory"), "{error}");

    let below_a_file = format!("{MINIMAL}file_paths:\n  agent_data_dir: data/agent\n");
    let error = Config::from_text(&below_a_file, &path, &env(&[])).expect_err("cannot be created below a file");
    assert_eq!(error.key.as_deref(), Some("file_paths.agent_data_dir"), "{error}");
    assert!(error.message.contains("is a file"), "{error}");

    let missing = format!("{MINIMAL}file_paths:\n  agent_data_dir: not-yet/agent\n");
    let config = Config::from_text(&missing, &path, &env(&[])).expect("a directory that does not exist yet is created");
    assert_eq!(config.settings.agent_data_dir, dir.path().join("not-yet/agent"));

    // The default directory beside the file is checked the same way.
    std::fs::write(dir.path().join("_agent_data"), "").expect("write");
    let error = Config::from_text(MINIMAL, &path, &env(&[])).expect_err("the default directory is a file");
    assert!(error.message.contains("is a file") && error.message.contains("file_paths.agent_data_dir"), "{error}");
}

#[test]
fn a_duplicate_key_is_reported_where_it_is_written_again() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        ("models:\n  a: {provider: openai, model_id: m}\nmodels:\n  b: {provider: openai, model_id: m}\n", (3, 1), "models"),
        ("models:\n  a:\n    provider: openai\n    provider: anthropic\n    model_id: m\n", (4, 5), "models.a.provider"),
        ("models:\n  a: {provider: openai, model_id: m}\n  a: {provider: openai, model_id: n}\n", (3, 3), "models.a"),
        ("models: {a: {provider: openai, model_id: m}, a: {provider: openai, model_id: n}}\n", (1, 46), "models.a"),
        ("system:\n  timezone: UTC\nfile_paths: {}\nsystem:\n  timezone: UTC\n", (4, 1), "system"),
        ("api:\n  providers:\n    openai:\n      api_key: k\n    openai:\n      api_key: k\n", (5, 5), "api.providers.openai"),
        ("base: &b\n  provider: openai\n  model_id: m\nmodels:\n  a:\n    <<: *b\n  a:\n    <<: *b\n", (7, 3), "models.a"),
        ("base: &b\n  provider: openai\nmodels:\n  a:\n    <<: *b\n    model_id: m\n    model_id: n\n", (7, 5), "models.a.model_id"),
    ];
    for (text, (line, column), key) in cases {
        let error = parse_err(text, &[]);
        assert_eq!((error.line, error.column, error.key.as_deref()), (Some(*line), Some(*column), Some(*key)), "{text}: {error}");
        let name = key.rsplit('.').next().expect("a name");
        assert!(error.message.contains(&format!("`{name}`")) && error.message.contains("more than once"), "{text}: {error}");
    }
}

/// Lines of a YAML-ish file: the keys Peregrine reads, at any indentation, with values that mix
/// references, flow collections, anchors, quotes and block scalars.
fn yaml_ish() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let key = prop::sample::select(vec![
        "models",
        "orchestrator",
        "provider",
        "model_id",
        "max_tokens",
        "api",
        "providers",
        "openai",
        "base_url",
        "api_key",
        "checkpointer",
        "type",
        "pool_size",
        "url",
        "server",
        "max_body_bytes",
        "file_paths",
        "agent_data_dir",
        "logging",
        "level",
        "execution_control",
        "limits",
        "graph_recursion_limit",
        "system",
        "timezone",
        "<<",
        "- name",
        "-",
    ]);
    let value = prop::sample::select(vec![
        "",
        "openai",
        "4096",
        "-1",
        "1e400",
        "0x10",
        "4294967295",
        "${A:-${B:-x}}",
        "${A",
        "$$",
        "$A",
        "{a: b}",
        "[1, 2]",
        "&x",
        "*x",
        "|",
        ">-",
        "'quoted'",
        "\"dq ${HOME}\"",
        "~",
        "null",
        "yes",
        "postgres://u:p@h/d",
        "\t",
        "#",
        "{",
        "]",
        ": :",
    ]);
    let line =
        (0..4usize, key, value, "[ -~]{0,8}").prop_map(|(indent, key, value, junk)| format!("{}{key}: {value}{junk}", "  ".repeat(indent)));
    prop::collection::vec(line, 0..24).prop_map(|lines| lines.join("\n"))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    #[test]
    fn the_loader_never_panics_on_any_text(text in "\\PC{0,400}") {
        let _ = parse(&text, &[("A", "1"), ("HOME", "/home/op")]);
    }

    #[test]
    fn the_loader_never_panics_on_yaml_ish_files(text in yaml_ish()) {
        if let Err(error) = parse(&text, &[("A", "1"), ("HOME", "/home/op")]) {
            // Every error names the file, and a line that exists when it has one.
            proptest::prop_assert_eq!(error.file.as_deref(), Some(Path::new("/srv/agent/config.yml")));
            if let Some(line) = error.line {
                proptest::prop_assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "{error}");
            }
        }
    }
}

/// Found by the `config` fuzz target (a config.yml with classic Mac line endings): YAML counts a
/// lone carriage return as a line break, so a YAML error names the line as YAML and most editors
/// count it, which may be past the number of `\n` in the text. Nothing panics.
#[test]
fn bare_carriage_returns_are_line_breaks_in_yaml_errors() {
    let error = parse_err("models:\r  default:\r    provider: \"openai\r    model_id: x\r", &[]);
    assert_eq!(error.file.as_deref(), Some(Path::new("/srv/agent/config.yml")));
    let line = error.line.expect("a YAML error has a line");
    assert!(line > 1 && line <= 5, "line {line}: {error}");
}

#[test]
fn control_system_writes_stay_off_unless_enabled_and_a_named_limits_database_must_load() {
    let dir = tempfile::tempdir().expect("temp dir");
    let load = |text: &str| {
        let path = dir.path().join("config.yml");
        std::fs::write(&path, format!("{MINIMAL}{text}")).expect("written");
        Config::from_file(&path, &env(&[]))
    };
    let defaults = load("").expect("loads");
    assert!(!defaults.control_system.writes.writes_enabled, "writes are off by default");
    assert_eq!(defaults.control_system.kind, peregrine::config::ControlSystemKind::Mock);

    std::fs::write(dir.path().join("limits.json"), r#"{"LINAC:RF:AMP:SP": {"min_value": 0, "max_value": 60, "max_step": 10}}"#)
        .expect("written");
    let enabled = load(
        "control_system:\n  type: epics\n  writes_enabled: true\n  limits_checking:\n    enabled: true\n    database_path: limits.json\n  write_verification:\n    default_level: readback\n    default_tolerance_percent: 0.5\n  connector:\n    epics:\n      timeout: 2.5\n      addr_list: [127.0.0.1]\n      auto_addr_list: false\n      server_port: 5072\n",
    )
    .expect("loads");
    let control = &enabled.control_system;
    assert_eq!(control.kind, peregrine::config::ControlSystemKind::Epics);
    assert!(control.writes.writes_enabled);
    let peregrine_control::LimitsCheck::On { database: Ok(database), allow_unlisted: false } = &control.writes.limits else {
        panic!("{:?}", control.writes.limits)
    };
    assert!(database.channel("LINAC:RF:AMP:SP").is_some());
    assert_eq!((control.writes.verification, control.writes.tolerance_percent), (peregrine_control::VerificationLevel::Readback, 0.5));
    assert_eq!(
        (control.epics.addr_list.clone(), control.epics.auto_addr_list, control.epics.server_port),
        (vec!["127.0.0.1".to_owned()], Some(false), Some(5072))
    );
    assert_eq!(control.epics.timeout, std::time::Duration::from_millis(2500));

    assert!(control.configured && !defaults.control_system.configured, "only a control_system section adds the channel capabilities");
    assert!(enabled.settings.agent_control.control_system_writes_enabled, "the turn's switch starts as the configured one");
    assert!(!defaults.settings.agent_control.control_system_writes_enabled);

    // Osprey's legacy switch enables nothing, and says so.
    let legacy = load("execution_control:\n  epics:\n    writes_enabled: true\n").expect("loads");
    assert!(!legacy.control_system.writes.writes_enabled && !legacy.settings.agent_control.control_system_writes_enabled);
    assert!(legacy.warnings.iter().any(|warning| warning.contains("legacy write switch")), "{:?}", legacy.warnings);

    // Enabled without a database: loads, warns, and every write is refused.
    let blocked = load("control_system:\n  writes_enabled: true\n  limits_checking:\n    enabled: true\n").expect("loads");
    assert!(matches!(blocked.control_system.writes.limits, peregrine_control::LimitsCheck::On { database: Err(_), .. }));
    assert!(blocked.warnings.iter().any(|warning| warning.contains("every write is refused")), "{:?}", blocked.warnings);

    // Errors name the key and say what is expected.
    std::fs::write(dir.path().join("broken.json"), "{\"A\": {\"min_value\": 5, \"max_value\": 1}}").expect("written");
    for (text, key, says) in [
        (
            "control_system:\n  limits_checking:\n    enabled: true\n    database_path: missing.json\n",
            "control_system.limits_checking.database_path",
            "cannot be read",
        ),
        (
            "control_system:\n  limits_checking:\n    enabled: true\n    database_path: broken.json\n",
            "control_system.limits_checking.database_path",
            "min_value 5 is above max_value 1",
        ),
        ("control_system:\n  type: tango\n", "control_system.type", "mock"),
        (
            "control_system:\n  write_verification:\n    default_tolerance_percent: -1\n",
            "control_system.write_verification.default_tolerance_percent",
            "percentage",
        ),
        (
            "control_system:\n  connector:\n    epics:\n      server_port: 70000\n",
            "control_system.connector.epics.server_port",
            "not a port",
        ),
        ("control_system:\n  connector:\n    mock:\n      noise_level: 2\n", "control_system.connector.mock.noise_level", "fraction"),
    ] {
        let error = load(text).expect_err(text);
        assert_eq!(error.key.as_deref(), Some(key), "{text}: {error}");
        assert!(error.to_string().contains(says), "{text}: {error}");
    }
}

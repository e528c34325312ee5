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
        "control_system",
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
    assert!(config.ignored_keys.is_empty() && config.warnings.is_empty());
    assert_eq!(config.redacted()["source"], serde_json::Value::Null);

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
    let config = parse(text, &[]).expect("loads");
    assert!(config.warnings.iter().any(|warning| warning.contains("react") && warning.contains("plan_first")), "{:?}", config.warnings);
    assert!(config.settings.agent_control.capability_selection_bypass_enabled);
    assert_eq!(config.settings.classifier_mode, ClassifierMode::PerCapability);
    assert_eq!(config.settings.prompt_history_chars, 8000);
    assert_eq!(config.settings.data_source_timeout, std::time::Duration::from_millis(2500));
    assert_eq!(config.logging.level.as_deref(), Some("peregrine=debug,warn"));
    assert_eq!(config.logging.file.as_deref(), Some(Path::new("/srv/agent/logs/peregrine.log")));
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
    let from_file = Config::from_text("system:\n  timezone: UTC\n", &path, &env(&[])).expect("loads");
    assert!(from_file.capabilities.exclude.is_empty() && !from_file.settings.agent_control.task_extraction_bypass_enabled);
}

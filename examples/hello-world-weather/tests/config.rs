//! The example's `config.yml` is a real configuration: the framework's loader reads it with no
//! ignored key and no warning, every role names the provider it sets up, and that provider can be
//! built, as `config validate` checks (through the library: no binary, no `local` feature).

#![allow(clippy::expect_used, reason = "test")]

use std::collections::BTreeSet;
use std::path::Path;

use peregrine::config::{CheckpointerConfig, Config};

#[test]
fn the_example_config_loads_and_validates() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.yml");
    let env = |name: &str| (name == "ANTHROPIC_API_KEY").then(|| "sk-ant-example".to_owned());
    let config = Config::from_file(&path, &env).unwrap_or_else(|error| panic!("config.yml does not load: {error}"));
    assert!(config.ignored_keys.is_empty(), "keys the loader does not use: {:?}", config.ignored_keys);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let roles: BTreeSet<&str> = config.llm.models.keys().map(String::as_str).collect();
    let expected = ["approval", "classifier", "default", "memory", "orchestrator", "response", "task_extraction", "time_parsing"];
    assert_eq!(roles, expected.into_iter().collect(), "every role of the framework");
    assert!(config.llm.models.values().all(|model| model.provider == "anthropic" && !model.model_id.is_empty()));
    let provider = config.llm.provider("anthropic");
    assert!(provider.api_key.is_some(), "the key is interpolated from the environment");
    peregrine::llm::build_provider("anthropic", &provider).expect("the provider is usable");

    assert_eq!(config.settings.timezone, chrono_tz::UTC);
    let project = Path::new(env!("CARGO_MANIFEST_DIR"));
    match &config.checkpointer {
        CheckpointerConfig::Sqlite { path } => assert_eq!(path, &project.join("_agent_data/checkpoints/peregrine.db")),
        other => panic!("a SQLite checkpointer, not {other:?}"),
    }
}

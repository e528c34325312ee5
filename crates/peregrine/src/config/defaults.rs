//! The embedded defaults: the local SmolLM2 model for every role, the agent data directory of a
//! run without `config.yml`, the SQLite checkpoint file, the timezone.

use std::path::{Path, PathBuf};

use peregrine_llm::ModelConfig;

use super::de::EnvLookup;
use super::raw::Timezone;

/// The provider of the embedded model.
pub(crate) const LOCAL_PROVIDER: &str = "local";
/// The embedded model's id.
pub(crate) const LOCAL_MODEL_ID: &str = "smollm2-135m-instruct";
/// The file `scripts/fetch-model.sh` downloads.
pub(crate) const LOCAL_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `models.default` of the embedded defaults.
pub(crate) fn model() -> ModelConfig {
    ModelConfig { provider: LOCAL_PROVIDER.to_owned(), model_id: LOCAL_MODEL_ID.to_owned(), max_tokens: Some(512), temperature: Some(0.0) }
}

/// `PEREGRINE_LOCAL_MODEL`, else `$PEREGRINE_MODEL_DIR/<file>`, else
/// `$HOME/.cache/peregrine/models/<file>` (where `scripts/fetch-model.sh` puts it).
pub(crate) fn local_model_path(env: EnvLookup<'_>) -> PathBuf {
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if let Some(path) = set("PEREGRINE_LOCAL_MODEL") {
        return PathBuf::from(path);
    }
    if let Some(dir) = set("PEREGRINE_MODEL_DIR") {
        return Path::new(&dir).join(LOCAL_MODEL_FILE);
    }
    match set("HOME") {
        Some(home) => Path::new(&home).join(".cache/peregrine/models").join(LOCAL_MODEL_FILE),
        None => PathBuf::from(LOCAL_MODEL_FILE),
    }
}

/// The agent data directory without a config file: `PEREGRINE_DATA_DIR`, else
/// `$XDG_DATA_HOME/peregrine`, else `$HOME/.local/share/peregrine`, else `_agent_data` in the
/// working directory.
pub(crate) fn data_dir(working_dir: &Path, env: EnvLookup<'_>) -> PathBuf {
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if let Some(dir) = set("PEREGRINE_DATA_DIR") {
        return working_dir.join(dir);
    }
    if let Some(dir) = set("XDG_DATA_HOME") {
        return working_dir.join(dir).join("peregrine");
    }
    match set("HOME") {
        Some(home) => Path::new(&home).join(".local/share/peregrine"),
        None => working_dir.join("_agent_data"),
    }
}

/// `<agent_data_dir>/checkpoints/peregrine.db`.
pub(crate) fn checkpoint_file(agent_data_dir: &Path) -> PathBuf {
    agent_data_dir.join("checkpoints").join("peregrine.db")
}

/// The timezone when `system.timezone` is not set: `TZ` when it names one (a zone file such as
/// `:/etc/localtime` through its link), else UTC.
pub(crate) fn timezone(env: EnvLookup<'_>) -> chrono_tz::Tz {
    env("TZ").and_then(|tz| Timezone::resolve(&tz).ok()).unwrap_or(chrono_tz::UTC)
}

/// `~` or `~/…` with the home directory; `None` for other paths or without `HOME`.
pub(crate) fn expand_home(text: &str, env: EnvLookup<'_>) -> Option<PathBuf> {
    let rest = if text == "~" { "" } else { text.strip_prefix("~/")? };
    let home = env("HOME").filter(|home| !home.is_empty())?;
    Some(Path::new(&home).join(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_owned())
    }

    #[test]
    fn the_local_model_path_follows_fetch_model_sh() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("PEREGRINE_LOCAL_MODEL", "/m/x.gguf"), ("PEREGRINE_MODEL_DIR", "/d"), ("HOME", "/h")], "/m/x.gguf"),
            (&[("PEREGRINE_MODEL_DIR", "/d"), ("HOME", "/h")], "/d/SmolLM2-135M-Instruct.Q4_1.gguf"),
            (&[("HOME", "/h")], "/h/.cache/peregrine/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            (&[("PEREGRINE_LOCAL_MODEL", " "), ("HOME", "/h")], "/h/.cache/peregrine/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ];
        for (env, expected) in cases {
            assert_eq!(local_model_path(&lookup(env)), PathBuf::from(expected), "{env:?}");
        }
    }

    #[test]
    fn the_data_dir_follows_xdg() {
        let work = Path::new("/work");
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("PEREGRINE_DATA_DIR", "/data"), ("XDG_DATA_HOME", "/xdg"), ("HOME", "/h")], "/data"),
            (&[("XDG_DATA_HOME", "/xdg"), ("HOME", "/h")], "/xdg/peregrine"),
            (&[("HOME", "/h")], "/h/.local/share/peregrine"),
            (&[], "/work/_agent_data"),
        ];
        for (env, expected) in cases {
            assert_eq!(data_dir(work, &lookup(env)), PathBuf::from(expected), "{env:?}");
        }
    }

    #[test]
    fn home_and_timezone() {
        let env = lookup(&[("HOME", "/h"), ("TZ", ":Europe/Berlin")]);
        assert_eq!(expand_home("~/data", &env), Some(PathBuf::from("/h/data")));
        assert_eq!(expand_home("~", &env), Some(PathBuf::from("/h")));
        assert_eq!(expand_home("data", &env), None);
        assert_eq!(timezone(&env), chrono_tz::Europe::Berlin);
        assert_eq!(timezone(&lookup(&[("TZ", "/usr/share/zoneinfo/Asia/Tokyo")])), chrono_tz::Asia::Tokyo);
        assert_eq!(timezone(&lookup(&[("TZ", "nonsense")])), chrono_tz::UTC);
    }
}

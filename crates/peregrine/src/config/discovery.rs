//! Which file to load (`--config`, `PEREGRINE_CONFIG`, `CONFIG_FILE`, `./config.yml`) and the
//! `.env` files (the working directory's and the config file's), read without touching the
//! process environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::de::EnvLookup;
use super::{ConfigError, dotenv};

/// The file to load, or `None` for the embedded defaults. A file named explicitly (by
/// `--config` or a variable) must exist; `./config.yml` is optional.
pub(crate) fn find(explicit: Option<&Path>, working_dir: &Path, env: EnvLookup<'_>) -> Result<Option<PathBuf>, ConfigError> {
    let named = match explicit {
        Some(path) => Some((path.to_owned(), "given with --config")),
        None => ["PEREGRINE_CONFIG", "CONFIG_FILE"].into_iter().find_map(|variable| {
            let value = env(variable).filter(|value| !value.trim().is_empty())?;
            let origin = if variable == "PEREGRINE_CONFIG" { "named by PEREGRINE_CONFIG" } else { "named by CONFIG_FILE" };
            Some((PathBuf::from(value), origin))
        }),
    };
    if let Some((path, origin)) = named {
        let path = working_dir.join(path);
        let path = if path.is_dir() { path.join("config.yml") } else { path };
        if !path.is_file() {
            return Err(ConfigError {
                file: Some(path),
                line: None,
                column: None,
                key: None,
                message: format!("the configuration file ({origin}) does not exist; check the path, or run `peregrine init` to create one"),
            });
        }
        return Ok(Some(path));
    }
    let default = working_dir.join("config.yml");
    Ok(default.is_file().then_some(default))
}

/// The variables of a `.env` file (none when it does not exist), parsed as python-dotenv does
/// (see [`super::dotenv`]); `${VAR}` in a value resolves to the file's earlier lines, then to
/// `outer`. Like upstream's `load_dotenv(override=True)` the values win over the environment;
/// unlike it, the process environment is not changed.
pub(crate) fn read_dotenv(path: &Path, outer: EnvLookup<'_>) -> Result<HashMap<String, String>, ConfigError> {
    if !path.is_file() {
        return Ok(HashMap::new());
    }
    let failure =
        |line: Option<usize>, message: String| ConfigError { file: Some(path.to_owned()), line, column: None, key: None, message };
    let content = std::fs::read_to_string(path).map_err(|error| failure(None, format!("cannot read the .env file: {error}")))?;
    let content = content.strip_prefix('\u{feff}').unwrap_or(&content);
    // The message never quotes the line: it may hold a secret.
    let entries = dotenv::parse(content, outer)
        .map_err(|error| failure(Some(error.line), format!("cannot parse the .env entry starting on this line: {}", error.message)))?;
    Ok(entries.into_iter().collect())
}

/// Whether two paths name the same file (so that one `.env` is not read twice).
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_then_variables_then_the_working_dir() {
        let dir = tempfile::tempdir().expect("temp dir");
        let none = |_: &str| None;
        assert_eq!(find(None, dir.path(), &none).expect("no file is fine"), None);
        std::fs::write(dir.path().join("config.yml"), "{}").expect("write");
        std::fs::write(dir.path().join("other.yml"), "{}").expect("write");
        assert_eq!(find(None, dir.path(), &none).expect("found"), Some(dir.path().join("config.yml")));
        let upstream = |name: &str| (name == "CONFIG_FILE").then(|| "other.yml".to_owned());
        assert_eq!(find(None, dir.path(), &upstream).expect("found"), Some(dir.path().join("other.yml")));
        let both = |name: &str| match name {
            "PEREGRINE_CONFIG" => Some("config.yml".to_owned()),
            "CONFIG_FILE" => Some("other.yml".to_owned()),
            _ => None,
        };
        assert_eq!(find(None, dir.path(), &both).expect("found"), Some(dir.path().join("config.yml")));
        assert_eq!(find(Some(Path::new("other.yml")), dir.path(), &both).expect("found"), Some(dir.path().join("other.yml")));
        assert_eq!(
            find(Some(dir.path()), dir.path(), &none).expect("a directory means its config.yml"),
            Some(dir.path().join("config.yml"))
        );
        let missing = find(Some(Path::new("nope.yml")), dir.path(), &none).expect_err("explicit and missing");
        assert!(missing.to_string().contains("nope.yml") && missing.message.contains("--config"), "{missing}");
        let missing_variable = |name: &str| (name == "CONFIG_FILE").then(|| "gone.yml".to_owned());
        let error = find(None, dir.path(), &missing_variable).expect_err("named and missing");
        assert!(error.to_string().contains("gone.yml") && error.message.contains("CONFIG_FILE"), "{error}");
    }

    #[test]
    fn dotenv_is_read_without_touching_the_environment() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(".env");
        let none = |_: &str| None;
        assert!(read_dotenv(&path, &none).expect("absent is empty").is_empty());
        std::fs::write(&path, "# keys\nPEREGRINE_TEST_DOTENV_ONLY=from-dotenv\nQUOTED=\"a b\"\n").expect("write");
        let variables = read_dotenv(&path, &none).expect("parses");
        assert_eq!(variables.get("PEREGRINE_TEST_DOTENV_ONLY").map(String::as_str), Some("from-dotenv"));
        assert_eq!(variables.get("QUOTED").map(String::as_str), Some("a b"));
        assert!(std::env::var_os("PEREGRINE_TEST_DOTENV_ONLY").is_none());
    }

    #[test]
    fn a_malformed_dotenv_names_the_file_and_line_but_not_the_value() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(".env");
        std::fs::write(&path, "GOOD=1\n# comment\nOPENAI_API_KEY=\"sk-unterminated\n").expect("write");
        let none = |_: &str| None;
        let error = read_dotenv(&path, &none).expect_err("unterminated quote");
        assert_eq!(error.file.as_deref(), Some(path.as_path()));
        assert_eq!(error.line, Some(3), "{error}");
        assert!(!error.to_string().contains("sk-unterminated"), "{error}");
        std::fs::write(&path, "GOOD=1\nnot a variable line\n").expect("write");
        let error = read_dotenv(&path, &none).expect_err("no =");
        assert_eq!(error.line, Some(2), "{error}");
    }
}

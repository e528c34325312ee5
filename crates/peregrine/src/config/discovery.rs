//! Which file to load (`--config`, `PEREGRINE_CONFIG`, `CONFIG_FILE`, `./config.yml`) and the
//! `.env` beside it, read without touching the process environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::ConfigError;
use super::de::EnvLookup;

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

/// The variables of a `.env` file (none when it does not exist). Like upstream's
/// `load_dotenv(override=True)` its values win over the environment; unlike it, the process
/// environment is not changed. A `${VAR}` inside a `.env` value is expanded by dotenvy against
/// the process environment and earlier lines of the file.
pub(crate) fn read_dotenv(path: &Path) -> Result<HashMap<String, String>, ConfigError> {
    if !path.is_file() {
        return Ok(HashMap::new());
    }
    let failure = |line: Option<usize>, column: Option<usize>, message: String| ConfigError {
        file: Some(path.to_owned()),
        line,
        column,
        key: None,
        message,
    };
    let entries = dotenvy::from_path_iter(path).map_err(|error| failure(None, None, format!("cannot read the .env file: {error}")))?;
    let mut variables = HashMap::new();
    for entry in entries {
        match entry {
            Ok((name, value)) => {
                variables.insert(name, value);
            }
            Err(dotenvy::Error::LineParse(text, index)) => {
                // The message must not quote the line: it may hold a secret.
                let line = std::fs::read_to_string(path).ok().and_then(|content| line_of(&content, &text));
                return Err(failure(
                    line,
                    Some(index + 1),
                    "cannot parse this .env line; expected NAME=value (quote values with spaces, close every quote)".to_owned(),
                ));
            }
            Err(error) => return Err(failure(None, None, format!("cannot read the .env file: {error}"))),
        }
    }
    Ok(variables)
}

/// The 1-based line where the logical line `text` (as dotenvy reports it) starts.
fn line_of(content: &str, text: &str) -> Option<usize> {
    let first = text.lines().next().unwrap_or_default().trim_end();
    if first.is_empty() {
        return None;
    }
    content.lines().position(|line| line.trim_end_matches('\r').starts_with(first)).map(|index| index + 1)
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
        assert!(read_dotenv(&path).expect("absent is empty").is_empty());
        std::fs::write(&path, "# keys\nPEREGRINE_TEST_DOTENV_ONLY=from-dotenv\nQUOTED=\"a b\"\n").expect("write");
        let variables = read_dotenv(&path).expect("parses");
        assert_eq!(variables.get("PEREGRINE_TEST_DOTENV_ONLY").map(String::as_str), Some("from-dotenv"));
        assert_eq!(variables.get("QUOTED").map(String::as_str), Some("a b"));
        assert!(std::env::var_os("PEREGRINE_TEST_DOTENV_ONLY").is_none());
    }

    #[test]
    fn a_malformed_dotenv_names_the_file_and_line_but_not_the_value() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(".env");
        std::fs::write(&path, "GOOD=1\n# comment\nOPENAI_API_KEY=\"sk-unterminated\n").expect("write");
        let error = read_dotenv(&path).expect_err("unterminated quote");
        assert_eq!(error.file.as_deref(), Some(path.as_path()));
        assert_eq!(error.line, Some(3), "{error}");
        assert!(!error.to_string().contains("sk-unterminated"), "{error}");
        std::fs::write(&path, "GOOD=1\nnot a variable line\n").expect("write");
        let error = read_dotenv(&path).expect_err("no =");
        assert_eq!(error.line, Some(2), "{error}");
    }
}

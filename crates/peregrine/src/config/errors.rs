//! Turning what serde and serde_norway report into [`ConfigError`]s a user can act on: the line
//! and column (or the line of the key), the dotted key, a message in the words of a config file
//! ("expected a whole number", "did you mean `max_tokens`?", which variable is not set), secrets
//! redacted; and the "did you mean" hints for ignored keys.

use std::path::Path;

use super::de::{Unresolved, Walk};
use super::lines::key_position;
use super::raw::known_keys;
use super::{ConfigError, Secrets};

/// Top-level keys of Osprey 0.11's `config.yml` that Peregrine does not use (reported as
/// ignored, never hinted as typos).
const OSPREY_TOP_LEVEL: &[&str] = &[
    "project_name",
    "build_dir",
    "project_root",
    "registry_path",
    "container_runtime",
    "deployment",
    "services",
    "deployed_services",
    "execution",
    "archiver",
    "channel_finder",
    "machine_state",
    "ariel",
    "python_executor",
    "pipeline",
    "cli",
    "applications",
];

/// A YAML syntax error (no secret can be in it: nothing is interpolated yet).
pub(crate) fn yaml_error(error: &serde_norway::Error, file: &Path) -> ConfigError {
    let location = error.location();
    ConfigError {
        file: Some(file.to_owned()),
        line: location.as_ref().map(serde_norway::Location::line),
        column: location.as_ref().map(serde_norway::Location::column),
        key: None,
        message: bare_message(&error.to_string(), "."),
    }
}

/// The error about a value that failed because a variable it references is not set: which one,
/// what the key got instead, and how to fix it (with an example default taken from `expected`,
/// the message that says what the key expects).
pub(crate) fn unset_message(key: &str, unresolved: &Unresolved, expected: &str) -> String {
    let field = key.rsplit('.').next().unwrap_or(key);
    // A bare `$NAME` in a secret may be part of the secret: never quoted.
    let nameable: Vec<&String> =
        unresolved.references.iter().filter(|reference| !unresolved.secret || reference.starts_with("${")).collect();
    let Some(first) = nameable.first() else {
        return format!(
            "{field} contains a `$` reference to a variable that is not set, so it is kept as written: set the variable in the environment or .env, or write `$$` for a literal `$`"
        );
    };
    let names = nameable.iter().map(|reference| format!("`{reference}`")).collect::<Vec<_>>().join(" and ");
    let verb = if nameable.len() == 1 { "is" } else { "are" };
    let got = if unresolved.secret { String::new() } else { format!(" (so {field} got the text `{}`)", unresolved.text) };
    let name = first.trim_start_matches('$').trim_start_matches('{').trim_end_matches('}');
    let example = expected
        .split_once("such as ")
        .and_then(|(_, rest)| rest.split([')', ',', ' ', ';']).next())
        .filter(|example| !example.is_empty())
        .unwrap_or("…");
    format!("{names} {verb} not set{got}: set it in the environment or .env, or give a default `${{{name}:-{example}}}`")
}

/// A deserialization error as a [`ConfigError`]: serde_norway's line and column (for a missing
/// key, the line of the mapping that lacks it), the dotted key from serde_path_to_error, a
/// message that says what is expected (or which variable is not set), secrets redacted.
pub(crate) fn deserialize_error(
    error: serde_path_to_error::Error<serde_norway::Error>,
    file: &Path,
    text: &str,
    walk: &Walk,
) -> ConfigError {
    let path = error.path().to_string();
    let inner = error.into_inner();
    let location = inner.location();
    let mut message = bare_message(&inner.to_string(), &path);
    let mut key = (path != "." && !path.is_empty()).then(|| path.trim_end_matches(".?").trim_end_matches('?').to_owned());
    let missing = message.starts_with("missing field");
    if let Some((field, expected)) = unknown_field(&message) {
        let hint = closest(&field, &expected).map(|candidate| format!("did you mean `{candidate}`? ")).unwrap_or_default();
        let expected = expected.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
        message = format!("unknown key `{field}`; {hint}expected one of {expected}");
        key = Some(match key {
            Some(parent) if !parent.ends_with(&field) => format!("{parent}.{field}"),
            Some(parent) => parent,
            None => field,
        });
    } else if key.is_none() && message.contains("expected struct RawConfig") {
        message = "config.yml must be a mapping of sections (models:, api:, execution_control:, …)".to_owned();
    }
    if let Some(duplicate) = &walk.duplicate {
        key = Some(duplicate.clone());
    }
    let written = key.as_ref().and_then(|key| key_position(text, &key.split('.').collect::<Vec<_>>()));
    let position = match (&location, written) {
        // serde_norway reports a missing key where the mapping ends: the next key's line.
        (_, Some(written)) if missing => Some(written),
        (Some(location), _) => Some((location.line(), location.column())),
        (None, written) => written,
    };
    let mut message = polish(&message);
    if let Some(unresolved) = key.as_ref().and_then(|key| walk.unresolved.get(key)) {
        message = unset_message(key.as_deref().unwrap_or_default(), unresolved, &message);
    }
    // The value of a secret key is hidden even when it is too short to scrub everywhere.
    if let Some(value) = key.as_ref().and_then(|key| walk.secret_values.get(key)).filter(|value| !value.is_empty()) {
        for quoted in [format!("\"{value}\""), format!("`{value}`"), format!("'{value}'")] {
            message = message.replace(&quoted, "***");
        }
    }
    ConfigError {
        file: Some(file.to_owned()),
        line: position.map(|(line, _)| line),
        column: position.map(|(_, column)| column),
        key,
        message: Secrets::redact_with(&walk.secrets, &message),
    }
}

/// serde_norway's message without its own key prefix and position suffix (they are fields of
/// the error).
fn bare_message(text: &str, path: &str) -> String {
    // serde_norway prefixes its own key path, which may stop short of serde_path_to_error's.
    let mut message = match text.split_once(": ") {
        Some((head, rest)) if !head.contains(char::is_whitespace) && (head == "." || path.starts_with(head)) => rest.to_owned(),
        _ => text.to_owned(),
    };
    for marker in [" at line ", " at position "] {
        while let Some(start) = message.find(marker) {
            let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let rest = &message[start + marker.len()..];
            let mut end = start + marker.len() + digits(rest);
            if let Some(column) = message[end..].strip_prefix(" column ") {
                end += " column ".len() + digits(column);
            }
            message.replace_range(start..end, "");
        }
    }
    message
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a`").
fn unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected = rest.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    Some((field.to_owned(), expected))
}

/// Serde's Rust type names in messages, said in the words of a config file.
fn polish(message: &str) -> String {
    let mut out = message.replace("missing field", "missing key");
    for (rust, words) in [
        ("expected u8", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected a string", "expected text"),
    ] {
        out = out.replace(rust, words);
    }
    if let Some(start) = out.find("expected struct ") {
        let end = out[start..].find([',', ';']).map_or(out.len(), |offset| start + offset);
        out.replace_range(start..end, "expected a mapping of keys");
    }
    out
}

/// Warnings for ignored keys that look like misspelt keys Peregrine reads.
pub(crate) fn typo_hints(ignored: &[String]) -> Vec<String> {
    ignored
        .iter()
        .filter_map(|key| {
            let (section, name) = key.rsplit_once('.').unwrap_or(("", key.as_str()));
            if section.is_empty() && OSPREY_TOP_LEVEL.contains(&name) {
                return None;
            }
            let known: Vec<String> = known_keys(section).iter().map(|known| (*known).to_owned()).collect();
            let candidate = closest(name, &known)?;
            let suggestion = if section.is_empty() { candidate } else { format!("{section}.{candidate}") };
            Some(format!("{key} is not a key Peregrine reads (ignored); did you mean {suggestion}?"))
        })
        .collect()
}

/// The known name closest to `name`: within one edit for names of up to four characters, two
/// for longer ones.
fn closest(name: &str, known: &[String]) -> Option<String> {
    let allowed = if name.chars().count() <= 4 { 1 } else { 2 };
    known
        .iter()
        .filter(|candidate| candidate.as_str() != name)
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate.clone())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            current[j + 1] = (previous[j] + usize::from(ca != *cb)).min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_lose_their_position_and_prefix() {
        assert_eq!(
            bare_message("models.x.max_tokens: invalid type: string \"lots\", expected u32 at line 4 column 17", "models.x.max_tokens"),
            "invalid type: string \"lots\", expected u32"
        );
        assert_eq!(
            bare_message("did not find expected key at line 3 column 1, while parsing a block mapping at line 1 column 1", "."),
            "did not find expected key, while parsing a block mapping"
        );
        assert_eq!(
            bare_message("models.x: unknown field `max_token`, expected `provider`", "models.x.max_token"),
            "unknown field `max_token`, expected `provider`"
        );
        assert_eq!(bare_message("invalid type: string \"x\", expected u32", "a.b"), "invalid type: string \"x\", expected u32");
        assert_eq!(polish("invalid type: string \"x\", expected u32"), "invalid type: string \"x\", expected a whole number (0 or more)");
        assert_eq!(polish("invalid type: sequence, expected struct RawModel"), "invalid type: sequence, expected a mapping of keys");
    }

    #[test]
    fn unknown_fields_get_a_suggestion() {
        let (field, expected) =
            unknown_field("unknown field `max_token`, expected one of `provider`, `model_id`, `max_tokens`, `temperature`")
                .expect("recognised");
        assert_eq!(field, "max_token");
        assert_eq!(expected, ["provider", "model_id", "max_tokens", "temperature"]);
        assert_eq!(closest("max_token", &expected), Some("max_tokens".to_owned()));
        assert_eq!(closest("pth", &["path".to_owned()]), Some("path".to_owned()));
        assert_eq!(closest("url", &["uri_x".to_owned(), "type".to_owned()]), None, "short names need a close match");
        assert_eq!(edit_distance("base_ur1", "base_url"), 1);
    }

    #[test]
    fn typo_hints_skip_osprey_keys() {
        let ignored = ["cli".to_owned(), "services".to_owned(), "api.providers.openai.base_ur1".to_owned(), "logging.levle".to_owned()];
        let hints = typo_hints(&ignored);
        assert_eq!(hints.len(), 2, "{hints:?}");
        assert!(hints[0].contains("did you mean api.providers.openai.base_url?"), "{hints:?}");
        assert!(hints[1].contains("did you mean logging.level?"), "{hints:?}");
    }
}

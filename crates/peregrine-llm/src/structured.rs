//! Structured output: the JSON schema of the expected Rust type (named after the type), the
//! schema-in-prompt fallback for providers without a native mode, clean-up of what models
//! actually write (code fences, prose around the object, Python-style booleans), and parsing
//! that reports exactly what was wrong so the model can be told.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::types::{ChatMessage, ChatRole, ResponseSchema};

/// The schema of `T`, named after `T` (`ExtractedTask`, `CapabilityMatch`, …).
pub fn schema_for<T: JsonSchema>() -> ResponseSchema {
    let schema = schemars::schema_for!(T);
    ResponseSchema { name: T::schema_name().into_owned(), schema: schema.to_value() }
}

/// The instruction appended to the last message when the provider has no native JSON-schema
/// mode. Its first line names the schema so logs and test servers can tell calls apart.
pub fn schema_prompt(schema: &ResponseSchema) -> String {
    format!(
        "Schema name: {}\nRespond ONLY with one JSON object that matches this JSON schema (no prose, no code fences):\n{}",
        schema.name, schema.schema
    )
}

/// Appends `text` to the last user message (or adds one): where the schema-in-prompt goes.
pub(crate) fn append_to_last_user(messages: &mut Vec<ChatMessage>, text: &str) {
    match messages.iter_mut().rev().find(|message| message.role == ChatRole::User) {
        Some(message) => {
            message.content.push_str("\n\n");
            message.content.push_str(text);
        }
        None => messages.push(ChatMessage::user(text)),
    }
}

/// What models wrap JSON in, removed: code fences, text before the first `{`/`[` and after the
/// matching last `}`/`]`, and Python literals `True`/`False`/`None` outside strings.
pub fn clean_json(text: &str) -> String {
    let trimmed = text.trim();
    let unfenced = strip_fences(trimmed);
    let sliced = slice_outer(unfenced);
    pythonic_literals_to_json(sliced)
}

fn strip_fences(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else { return text };
    let body = rest.split_once('\n').map_or(rest, |(_, body)| body);
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

fn slice_outer(text: &str) -> &str {
    let start = text.find(['{', '[']);
    let end = text.rfind(['}', ']']);
    match (start, end) {
        (Some(start), Some(end)) if start < end => &text[start..=end],
        _ => text,
    }
}

fn pythonic_literals_to_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        let replaced = [("True", "true"), ("False", "false"), ("None", "null")].into_iter().find(|(python, _)| {
            rest.starts_with(python)
                && !out.chars().last().is_some_and(is_word)
                && !rest[python.len()..].chars().next().is_some_and(is_word)
        });
        match replaced {
            Some((python, json)) => {
                out.push_str(json);
                rest = &rest[python.len()..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses model output into `T` after [`clean_json`]; the error says what was wrong in words a
/// model can act on.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    // Valid JSON is taken as it is; clean-up is only for what is not.
    if let Ok(value) = serde_json::from_str(text.trim()) {
        return Ok(value);
    }
    let cleaned = clean_json(text);
    serde_json::from_str(&cleaned).map_err(|error| {
        let preview: String = text.chars().take(200).collect();
        format!("the answer is not valid JSON for the schema: {error} (answer began: {preview:?})")
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    struct CapabilityMatch {
        is_match: bool,
    }

    #[derive(Debug, PartialEq, Deserialize, JsonSchema)]
    struct ExtractedTask {
        task: String,
        depends_on_chat_history: bool,
    }

    #[test]
    fn schemas_are_named_after_their_type() {
        let schema = schema_for::<CapabilityMatch>();
        assert_eq!(schema.name, "CapabilityMatch");
        assert_eq!(schema.schema["properties"]["is_match"]["type"], "boolean");
        assert!(schema_prompt(&schema).starts_with("Schema name: CapabilityMatch\n"));
    }

    #[test]
    fn what_models_write_is_cleaned_up() {
        let table = [
            ("{\"is_match\": true}", Some(true)),
            ("```json\n{\"is_match\": false}\n```", Some(false)),
            ("```\n{\"is_match\": True}\n```", Some(true)),
            ("Sure! Here is the JSON: {\"is_match\": False} Hope that helps.", Some(false)),
            ("{\"is_match\": \"True\"}", None),
            ("no json at all", None),
        ];
        for (text, expected) in table {
            assert_eq!(parse::<CapabilityMatch>(text).ok().map(|m| m.is_match), expected, "{text}");
        }
    }

    #[test]
    fn python_literals_inside_strings_are_left_alone() {
        let parsed: ExtractedTask =
            parse("{\"task\": \"check if True or None \\\"False\\\"\", \"depends_on_chat_history\": True}").expect("parses");
        assert_eq!(parsed, ExtractedTask { task: "check if True or None \"False\"".into(), depends_on_chat_history: true });
        assert!(clean_json("{\"TrueNorth\": None}").contains("\"TrueNorth\": null"));
    }

    #[test]
    fn valid_json_is_never_rewritten() {
        assert_eq!(parse::<String>("\"a {b}\"").expect("a JSON string"), "a {b}");
    }

    #[test]
    fn parse_errors_say_what_was_wrong() {
        let error = parse::<ExtractedTask>("{\"task\": 3}").expect_err("wrong type");
        assert!(error.contains("invalid type") && error.contains("answer began"), "{error}");
    }
}

//! `config.yml` as any UTF-8 text: parsed, interpolated (with a fixed environment whose values
//! hold references of their own) and validated into a `Config`, or refused with an error that
//! names the file and a line the text has.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use peregrine::config::Config;

/// Where the text claims to come from: a directory that does not exist, so nothing is read.
const PATH: &str = "/nonexistent/peregrine-fuzz/config.yml";

/// The environment: a few ordinary names, a secret, a URL with a password, an empty value and
/// values that are themselves references or half of one (they must be taken literally).
fn env(name: &str) -> Option<String> {
    let value = match name {
        "HOME" => "/home/fuzz",
        "A" => "1",
        "EMPTY" => "",
        "OPENAI_API_KEY" => "sk-fuzz-secret",
        "DATABASE_URL" => "postgres://app:fuzz-password@db:5432/peregrine",
        "NESTED" => "${HOME}",
        "HALF" => "${",
        "DEFAULTED" => "${MISSING:-x}",
        "DOLLARS" => "$$",
        _ => return None,
    };
    Some(value.to_owned())
}

/// The lines of `text` as the YAML parser (libyaml) counts them: `\n`, `\r\n`, a lone `\r`,
/// NEL, LS and PS each end one (found by this target: a file with classic Mac line endings has
/// errors past its count of `\n`).
fn yaml_lines(text: &str) -> usize {
    let breaks = text
        .match_indices(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
        .filter(|(at, found)| *found != "\r" || !text[at + 1..].starts_with('\n'))
        .count();
    breaks + 1
}

fuzz_target!(|text: &str| {
    match Config::from_text(text, Path::new(PATH), &env) {
        Ok(config) => {
            // Everything a user can print of it works.
            let _ = format!("{config:?}");
            let _ = config.redacted();
            let _ = config.redact(text);
        }
        Err(error) => {
            assert_eq!(error.file.as_deref(), Some(Path::new(PATH)), "{error}");
            if let Some(line) = error.line {
                assert!(line >= 1 && line <= yaml_lines(text) + 1, "line {line} of a {}-line text: {error}", yaml_lines(text));
            }
            let _ = error.to_string();
        }
    }
});

//! `${VAR}`, `${VAR:-default}` and `$VAR` in one string value, and what counts as a secret
//! (variable and key names, passwords inside URLs).
//!
//! Differences from upstream, on purpose: `${VAR:-default}` uses the default when `VAR` is unset
//! *or empty* (as a shell does; upstream's `os.environ.get` keeps an empty value), and a
//! substituted value is not expanded again (upstream runs its `$VAR` pass over the result of the
//! `${VAR}` pass, so a password containing `$x` was mangled).

/// The result of interpolating one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interpolated {
    /// The text with every resolvable reference replaced.
    pub text: String,
    /// Whether anything was replaced.
    pub changed: bool,
    /// References left as written because their variable is not set (`${VAR}` or `$VAR`).
    pub unresolved: Vec<String>,
    /// `(variable, substituted value)` for every replaced reference (defaults included).
    pub substituted: Vec<(String, String)>,
}

/// Interpolates `input` with `env`; unresolved references are kept verbatim.
pub(crate) fn interpolate(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Interpolated {
    let mut out =
        Interpolated { text: String::with_capacity(input.len()), changed: false, unresolved: Vec::new(), substituted: Vec::new() };
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        out.text.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let consumed = if let Some(braced) = after.strip_prefix('{') {
            braced_reference(braced, env, &mut out)
        } else {
            bare_reference(after, env, &mut out)
        };
        match consumed {
            Some(length) => rest = &after[length..],
            None => {
                out.text.push('$');
                rest = after;
            }
        }
    }
    out.text.push_str(rest);
    out
}

/// `${NAME}` or `${NAME:-default}` (after the `$`); returns the bytes consumed after the `$`, or
/// `None` when this is not a reference (kept as written, no warning).
fn braced_reference(braced: &str, env: &dyn Fn(&str) -> Option<String>, out: &mut Interpolated) -> Option<usize> {
    let close = braced.find('}')?;
    let expression = &braced[..close];
    let (name, default) = match expression.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (expression, None),
    };
    if !is_variable_name(name) {
        return None;
    }
    let value = env(name);
    let chosen = match (value, default) {
        (Some(value), None) => Some(value),
        (Some(value), Some(_)) if !value.is_empty() => Some(value),
        (_, Some(default)) => Some(default.to_owned()),
        (None, None) => None,
    };
    match chosen {
        Some(value) => substitute(name, value, out),
        None => {
            let written = format!("${{{name}}}");
            out.text.push_str(&written);
            out.unresolved.push(written);
        }
    }
    Some(close + 2)
}

/// `$NAME` (after the `$`).
fn bare_reference(after: &str, env: &dyn Fn(&str) -> Option<String>, out: &mut Interpolated) -> Option<usize> {
    let length = after
        .char_indices()
        .find(|&(index, c)| !(c == '_' || c.is_ascii_alphabetic() || (index > 0 && c.is_ascii_digit())))
        .map_or(after.len(), |(index, _)| index);
    let name = &after[..length];
    if !is_variable_name(name) {
        return None;
    }
    match env(name) {
        Some(value) => substitute(name, value, out),
        None => {
            out.text.push('$');
            out.text.push_str(name);
            out.unresolved.push(format!("${name}"));
        }
    }
    Some(length)
}

fn substitute(name: &str, value: String, out: &mut Interpolated) {
    out.text.push_str(&value);
    out.changed = true;
    out.substituted.push((name.to_owned(), value));
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic()) && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Whether a variable or key name holds a secret: one of its words (split on `_`, `-`, `.`)
/// ends with KEY, TOKEN, SECRET, PASSWORD or PASSWD, case-insensitively. `OPENAI_API_KEY`,
/// `SECRET_TOKEN`, `api_key` and `DB_PASSWORD` are secrets; `MAX_TOKENS` is not.
pub(crate) fn is_secret_name(name: &str) -> bool {
    name.split(['_', '-', '.']).any(|word| {
        let word = word.to_ascii_uppercase();
        ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"].iter().any(|suffix| word.ends_with(suffix))
    })
}

/// Whether an API key is a placeholder rather than a secret: the provider's own name (Osprey
/// writes `api_key: ollama`) or a conventional dummy value. Placeholders are still shown as
/// `***`, but are not scrubbed from every message (that would hide the word `ollama`).
pub(crate) fn is_placeholder_key(provider: &str, value: &str) -> bool {
    let value = value.trim();
    value.eq_ignore_ascii_case(provider)
        || ["none", "null", "empty", "dummy", "unused", "not-needed", "no-key", "ollama", "lm-studio", "-"]
            .iter()
            .any(|placeholder| value.eq_ignore_ascii_case(placeholder))
}

/// The passwords inside a URL: `scheme://user:PASSWORD@host…` and `password=VALUE` query
/// parameters.
pub(crate) fn url_passwords(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some((_, after_scheme)) = text.split_once("://") {
        let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or_default();
        if let Some((userinfo, _)) = authority.rsplit_once('@')
            && let Some((_, password)) = userinfo.split_once(':')
            && !password.is_empty()
        {
            found.push(password.to_owned());
        }
        if let Some((_, query)) = after_scheme.split_once('?') {
            for pair in query.split(['&', ';']) {
                if let Some((name, value)) = pair.split_once('=')
                    && is_secret_name(name)
                    && !value.is_empty()
                {
                    found.push(value.to_owned());
                }
            }
        }
    }
    found
}

/// `text` with the passwords of a URL replaced by `***` (for showing an endpoint).
pub(crate) fn hide_url_passwords(text: &str) -> String {
    let mut out = text.to_owned();
    for password in url_passwords(text) {
        out = out.replace(&password, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/op".into()),
            "EMPTY" => Some(String::new()),
            "DOLLAR" => Some("pa$word".into()),
            _ => None,
        }
    }

    #[test]
    fn references_resolve_like_a_shell() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("${HOME}/data", "/home/op/data", &[]),
            ("$HOME/data", "/home/op/data", &[]),
            ("${TZ:-America/Los_Angeles}", "America/Los_Angeles", &[]),
            ("${EMPTY:-fallback}", "fallback", &[]),
            ("${EMPTY}", "", &[]),
            ("${MISSING}", "${MISSING}", &["${MISSING}"]),
            ("$MISSING and ${ALSO}", "$MISSING and ${ALSO}", &["$MISSING", "${ALSO}"]),
            ("${HOME:-x}${MISSING:-}", "/home/op", &[]),
            ("cost: $5, ${ not a ref}, ${unclosed", "cost: $5, ${ not a ref}, ${unclosed", &[]),
            ("${DOLLAR}", "pa$word", &[]),
            ("trailing $", "trailing $", &[]),
        ];
        for (input, expected, unresolved) in cases {
            let result = interpolate(input, &env);
            assert_eq!(result.text, *expected, "{input}");
            assert_eq!(result.unresolved, *unresolved, "{input}");
            assert_eq!(result.changed, input != expected, "{input}");
        }
    }

    #[test]
    fn secret_names_are_words_ending_in_key_token_secret_or_password() {
        for name in ["OPENAI_API_KEY", "SECRET_TOKEN", "api_key", "DB_PASSWORD", "APIKEY", "github-token"] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["MAX_TOKENS", "max_tokens", "TZ", "HOME", "base_url", "KEYBOARD_LAYOUT"] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn url_passwords_are_found_and_hidden() {
        assert_eq!(url_passwords("postgres://app:s3cret@db:5432/peregrine"), ["s3cret"]);
        assert_eq!(url_passwords("postgres://db/peregrine?user=app&password=s3cret"), ["s3cret"]);
        assert!(url_passwords("https://api.openai.com/v1").is_empty());
        assert!(url_passwords("http://user@host/x").is_empty());
        assert_eq!(hide_url_passwords("postgres://app:s3cret@db/p"), "postgres://app:***@db/p");
    }
}

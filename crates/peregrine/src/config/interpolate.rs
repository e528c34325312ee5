//! `${VAR}`, `${VAR:-default}` and `$VAR` in one string value of `config.yml`, `$$` for a literal
//! `$`, and what counts as a secret (variable and key names, passwords inside URLs and
//! PostgreSQL connection strings).
//!
//! Differences from upstream, on purpose: `${VAR:-default}` uses the default when `VAR` is unset
//! *or empty* (as a shell does; upstream's `os.environ.get` keeps an empty value); a default may
//! itself hold references (`${A:-${B:-x}}`, resolved only when used); `$$` is a literal `$` (so
//! that a secret containing `$` can be written as is); and a substituted value is not expanded
//! again (upstream runs its `$VAR` pass over the result of the `${VAR}` pass, so a password
//! containing `$x` was mangled).

use std::fmt;

use super::dsn;

/// How deeply `${…}` may nest (`${A:-${B:-x}}` nests two levels). Deeper is refused: a default
/// is resolved by interpolating it in turn, so the depth bounds both the recursion (no stack
/// overflow on hostile input) and the number of times a character is scanned (linear time).
pub(crate) const MAX_NESTING: usize = 32;

/// A value whose `${` nest more than [`MAX_NESTING`] levels deep (or leave more than that many
/// open). Says nothing of the value, which may be a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep;

impl fmt::Display for TooDeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`${{` references nest more than {MAX_NESTING} levels deep (or more than {MAX_NESTING} `${{` are left open), which is refused; nest defaults at most {MAX_NESTING} levels, such as `${{A:-${{B:-default}}}}`, and write `$$` for a literal `$`"
        )
    }
}

/// The result of interpolating one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interpolated {
    /// The text with every resolvable reference replaced.
    pub text: String,
    /// Whether anything was replaced (`$$` included).
    pub changed: bool,
    /// References left as written because their variable is not set (`${VAR}` or `$VAR`).
    pub unresolved: Vec<String>,
    /// `(variable, substituted value)` for every replaced reference (defaults included).
    pub substituted: Vec<(String, String)>,
    /// Whether a `${` has no closing `}` (kept as written).
    pub unterminated: bool,
}

/// Interpolates `input` with `env`; unresolved references are kept verbatim. Refuses `${` nested
/// more than [`MAX_NESTING`] levels deep.
pub(crate) fn interpolate(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Interpolated, TooDeep> {
    let mut out = Interpolated {
        text: String::with_capacity(input.len()),
        changed: false,
        unresolved: Vec::new(),
        substituted: Vec::new(),
        unterminated: false,
    };
    interpolate_into(input, env, &mut out)?;
    Ok(out)
}

fn interpolate_into(input: &str, env: &dyn Fn(&str) -> Option<String>, out: &mut Interpolated) -> Result<(), TooDeep> {
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        out.text.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let consumed = if after.starts_with('$') {
            out.text.push('$');
            out.changed = true;
            Some(1)
        } else if let Some(braced) = after.strip_prefix('{') {
            braced_reference(braced, env, out)?
        } else {
            bare_reference(after, env, out)
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
    Ok(())
}

/// The index of the `}` closing a `${` whose content starts `braced`, skipping nested `${…}`;
/// `None` when it is not closed. The scan stops as soon as more than [`MAX_NESTING`] levels are
/// open, so that a `${` is never scanned past that depth: a top-level `${` sees every level
/// inside it, so the defaults it resolves (recursively) are known to nest no deeper.
fn closing_brace(braced: &str) -> Result<Option<usize>, TooDeep> {
    // Levels open inside this `${`, which is itself one.
    let mut depth = 0usize;
    let bytes = braced.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'$' if bytes.get(index + 1) == Some(&b'{') => {
                depth += 1;
                if depth >= MAX_NESTING {
                    return Err(TooDeep);
                }
                index += 1;
            }
            b'}' if depth == 0 => return Ok(Some(index)),
            b'}' => depth -= 1,
            _ => {}
        }
        index += 1;
    }
    Ok(None)
}

/// `${NAME}` or `${NAME:-default}` (after the `$`); returns the bytes consumed after the `$`, or
/// `None` when this is not a reference (kept as written; an unclosed `${` is flagged).
fn braced_reference(braced: &str, env: &dyn Fn(&str) -> Option<String>, out: &mut Interpolated) -> Result<Option<usize>, TooDeep> {
    let Some(close) = closing_brace(braced)? else {
        out.unterminated = true;
        return Ok(None);
    };
    let expression = &braced[..close];
    let (name, default) = match expression.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (expression, None),
    };
    if !is_variable_name(name) {
        return Ok(None);
    }
    match (env(name), default) {
        (Some(value), None) => substitute(name, value, out),
        (Some(value), Some(_)) if !value.is_empty() => substitute(name, value, out),
        (_, Some(default)) => {
            // The default may hold references of its own, resolved now that it is used (one
            // level less deep than this one, as `closing_brace` made sure).
            let mut inner = interpolate(default, env)?;
            out.unresolved.append(&mut inner.unresolved);
            out.substituted.append(&mut inner.substituted);
            out.unterminated |= inner.unterminated;
            substitute(name, inner.text, out);
        }
        (None, None) => {
            let written = format!("${{{name}}}");
            out.text.push_str(&written);
            out.unresolved.push(written);
        }
    }
    Ok(Some(close + 2))
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

/// Whether `raw` is nothing but `${…}` references (and blanks): a placeholder that holds no
/// secret of its own even under a secret key.
pub(crate) fn only_braced_references(raw: &str) -> bool {
    let mut rest = raw.trim();
    while let Some(braced) = rest.strip_prefix("${") {
        match closing_brace(braced) {
            Ok(Some(close)) => rest = braced[close + 1..].trim_start(),
            Ok(None) | Err(TooDeep) => return false,
        }
    }
    rest.is_empty() && !raw.trim().is_empty()
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

/// Whether a variable names a connection URL (`DATABASE_URL`, `PG_DSN`): its value is a secret
/// when it holds a password.
pub(crate) fn is_url_name(name: &str) -> bool {
    let last = name.rsplit(['_', '-', '.']).next().unwrap_or_default().to_ascii_uppercase();
    name.contains(['_', '-', '.']) && ["URL", "DSN", "URI"].contains(&last.as_str())
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
/// parameters, and those of a PostgreSQL connection string (URL or `key=value` form, as
/// tokio-postgres reads it, both as written and decoded).
pub(crate) fn url_passwords(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    if dsn::looks_like(text)
        && let Ok(parsed) = dsn::parse(text)
    {
        return parsed.secrets();
    }
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

/// `text` with the passwords of a URL replaced by `***` where they are written (for showing an
/// endpoint; a short password does not garble the rest of the URL).
pub(crate) fn hide_url_passwords(text: &str) -> String {
    if dsn::looks_like(text) {
        return dsn::masked(text);
    }
    let Some(scheme_end) = text.find("://").map(|index| index + 3) else {
        return text.to_owned();
    };
    let mut spans = Vec::new();
    let after_scheme = &text[scheme_end..];
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && let Some(colon) = userinfo.find(':')
        && colon + 1 < userinfo.len()
    {
        spans.push(scheme_end + colon + 1..scheme_end + userinfo.len());
    }
    if let Some(question) = after_scheme.find('?') {
        let query_start = scheme_end + question + 1;
        let query_end = text[query_start..].find('#').map_or(text.len(), |hash| query_start + hash);
        let mut offset = query_start;
        for pair in text[query_start..query_end].split(['&', ';']) {
            if let Some((name, value)) = pair.split_once('=')
                && is_secret_name(name)
                && !value.is_empty()
            {
                spans.push(offset + name.len() + 1..offset + pair.len());
            }
            offset += pair.len() + 1;
        }
    }
    dsn::mask_spans(text, &spans)
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
            ("cost: $5, ${ not a ref}", "cost: $5, ${ not a ref}", &[]),
            ("${DOLLAR}", "pa$word", &[]),
            ("trailing $", "trailing $", &[]),
        ];
        for (input, expected, unresolved) in cases {
            let result = interpolate(input, &env).expect("shallow");
            assert_eq!(result.text, *expected, "{input}");
            assert_eq!(result.unresolved, *unresolved, "{input}");
            assert_eq!(result.changed, input != expected, "{input}");
            assert!(!result.unterminated, "{input}");
        }
    }

    #[test]
    fn dollars_nested_defaults_and_unclosed_references() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("sk-abc$$def", "sk-abc$def", &[]),
            ("$$HOME and $$", "$HOME and $", &[]),
            ("${MISSING:-${HOME}/x}", "/home/op/x", &[]),
            ("${MISSING:-${ALSO:-deep}}", "deep", &[]),
            ("${MISSING:-${ALSO}}", "${ALSO}", &["${ALSO}"]),
            ("${HOME:-${ALSO}}", "/home/op", &[]),
            ("${MISSING:-$$}", "$", &[]),
        ];
        for (input, expected, unresolved) in cases {
            let result = interpolate(input, &env).expect("shallow");
            assert_eq!(result.text, *expected, "{input}");
            assert_eq!(result.unresolved, *unresolved, "{input}");
            assert!(result.changed && !result.unterminated, "{input}");
        }
        let unclosed = interpolate("${unclosed and ${HOME}", &env).expect("shallow");
        assert!(unclosed.unterminated);
        assert_eq!(unclosed.text, "${unclosed and /home/op");
        assert!(only_braced_references("${A} ${B:-x}") && !only_braced_references("sk-${A}") && !only_braced_references("$A"));
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused_in_one_pass() {
        let nested = |levels: usize| format!("{}deep{}", "${MISSING:-".repeat(levels), "}".repeat(levels));
        assert_eq!(interpolate(&nested(MAX_NESTING), &env).map(|result| result.text), Ok("deep".to_owned()));
        for levels in [MAX_NESTING + 1, 100_000] {
            assert_eq!(interpolate(&nested(levels), &env), Err(TooDeep), "{levels}");
        }
        // A set variable skips its default, which is refused all the same.
        assert_eq!(interpolate(&format!("${{HOME:-{}}}", nested(MAX_NESTING)), &env), Err(TooDeep));
        // Unclosed `${` count as open levels: a few are kept as written, megabytes are refused.
        let open = interpolate(&"${".repeat(MAX_NESTING), &env).expect("kept");
        assert!(open.unterminated && open.text == "${".repeat(MAX_NESTING));
        assert_eq!(interpolate(&"${".repeat(2_000_000), &env), Err(TooDeep));
        assert_eq!(interpolate(&"${A:-${HOME}".repeat(300_000), &env), Err(TooDeep));
        // Side by side is not nested.
        let flat = "${MISSING:-x}".repeat(100_000);
        assert_eq!(interpolate(&flat, &env).map(|result| result.text.len()), Ok(100_000));
        assert!(!only_braced_references(&nested(100_000)));
        assert!(TooDeep.to_string().contains("more than 32 levels"));
    }

    proptest::proptest! {
        #[test]
        fn any_text_interpolates_without_panicking(input in "\\PC*", dollars in "[${}:A-Z_-]{0,64}") {
            for text in [input.clone(), dollars.clone(), format!("{input}{dollars}")] {
                if let Ok(result) = interpolate(&text, &env) {
                    proptest::prop_assert!(result.changed || result.text == text);
                }
            }
        }

        #[test]
        fn text_without_a_dollar_is_unchanged(input in "[^$]*") {
            let result = interpolate(&input, &env).expect("no reference, no nesting");
            proptest::prop_assert_eq!(&result.text, &input);
            proptest::prop_assert!(!result.changed && !result.unterminated);
            proptest::prop_assert!(result.unresolved.is_empty() && result.substituted.is_empty());
        }

        #[test]
        fn doubled_dollars_are_literal_dollars(input in "\\PC*") {
            let result = interpolate(&input.replace('$', "$$"), &env).expect("no reference");
            proptest::prop_assert_eq!(result.text, input);
        }

        #[test]
        fn nested_defaults_resolve_to_the_innermost(levels in 1..=MAX_NESTING, innermost in "[a-z0-9/]{0,12}") {
            let text = format!("{}{innermost}{}", "${MISSING:-".repeat(levels), "}".repeat(levels));
            proptest::prop_assert_eq!(interpolate(&text, &env).map(|result| result.text), Ok(innermost));
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
        for name in ["DATABASE_URL", "PG_DSN", "database_url", "MONGO_URI"] {
            assert!(is_url_name(name), "{name}");
        }
        for name in ["URL", "CURL", "BASE_URLS", "HOME"] {
            assert!(!is_url_name(name), "{name}");
        }
    }

    #[test]
    fn url_passwords_are_found_and_hidden() {
        assert_eq!(url_passwords("postgres://app:s3cret@db:5432/peregrine"), ["s3cret"]);
        assert_eq!(url_passwords("postgres://db/peregrine?user=app&password=s3cret"), ["s3cret"]);
        assert!(url_passwords("https://api.openai.com/v1").is_empty());
        assert!(url_passwords("http://user@host/x").is_empty());
        assert_eq!(hide_url_passwords("postgres://app:s3cret@db/p"), "postgres://app:***@db/p");
        assert_eq!(url_passwords("host=db password=hunter2 user=a"), ["hunter2"]);
        assert_eq!(url_passwords("postgres://app:pa#ss?w0rd@db/x"), ["pa#ss?w0rd"]);
        assert_eq!(
            hide_url_passwords("https://u:a@gateway.example/v1?x=1&api_key=k&a=b"),
            "https://u:***@gateway.example/v1?x=1&api_key=***&a=b"
        );
    }
}

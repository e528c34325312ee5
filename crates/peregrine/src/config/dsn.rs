//! PostgreSQL connection strings (`checkpointer.url`, a `DATABASE_URL`): checked with
//! tokio-postgres's own parser, the one the checkpointer connects with, and their password
//! located where it is written, so that `config show` masks exactly it and messages never
//! carry it, in either form tokio-postgres reads:
//! - a URL, `postgres[ql]://user:password@host:port/db?password=…` — tokio-postgres takes the
//!   credentials up to the *first* `@`, so a password may hold `/`, `?` or `#` unencoded;
//! - `key=value` pairs, `host=db user=app password='a b' dbname=x` (single quotes, `\` escapes).

use std::ops::Range;
use std::str::FromStr;

/// A connection string tokio-postgres accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dsn {
    /// The password as the server receives it (percent-decoded, unescaped), when it is UTF-8.
    password: Option<String>,
    /// The password as written in the string (each occurrence).
    written: Vec<String>,
    /// The string with each password replaced by `***` (all of it `***` when the password could
    /// not be located).
    masked: String,
}

impl Dsn {
    /// The values to keep out of every message: the password, decoded and as written.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.password.iter().chain(&self.written).filter(|value| !value.is_empty()).cloned().collect();
        secrets.dedup();
        secrets
    }
}

/// Parses `text` as tokio-postgres does; the error says why without quoting the string.
pub(crate) fn parse(text: &str) -> Result<Dsn, String> {
    let config = tokio_postgres::Config::from_str(text).map_err(|error| describe(&error))?;
    let spans: Vec<Range<usize>> = if url_prefix(text).is_some() {
        url_password_spans(text).unwrap_or_default()
    } else {
        key_values(text).unwrap_or_default().into_iter().filter(|(key, _)| key == "password").map(|(_, span)| span).collect()
    };
    let spans: Vec<Range<usize>> = spans.into_iter().filter(|span| !span.is_empty()).collect();
    let password = config.get_password().and_then(|bytes| String::from_utf8(bytes.to_vec()).ok());
    let has_password = config.get_password().is_some_and(|bytes| !bytes.is_empty());
    let masked = if has_password && spans.is_empty() { "***".to_owned() } else { mask_spans(text, &spans) };
    let written = spans.iter().map(|span| unquote(&text[span.clone()]).to_owned()).collect();
    Ok(Dsn { password, written, masked })
}

/// `text` with its password masked; `***` when it does not parse.
pub(crate) fn masked(text: &str) -> String {
    parse(text).map_or_else(|_| "***".to_owned(), |dsn| dsn.masked)
}

/// Whether `text` is meant as a PostgreSQL connection string with credentials: a
/// `postgres://` URL, or `key=value` pairs with a `password`.
pub(crate) fn looks_like(text: &str) -> bool {
    url_prefix(text).is_some() || key_values(text).is_some_and(|pairs| pairs.iter().any(|(key, _)| key == "password"))
}

/// `text` with every span replaced by `***`.
pub(crate) fn mask_spans(text: &str, spans: &[Range<usize>]) -> String {
    let mut spans = spans.to_vec();
    spans.sort_by_key(|span| span.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in spans {
        if span.start < at || span.end > text.len() {
            continue;
        }
        out.push_str(&text[at..span.start]);
        out.push_str("***");
        at = span.end;
    }
    out.push_str(&text[at..]);
    out
}

/// tokio-postgres's reason, without the character it stopped at (it may be one of the password).
fn describe(error: &tokio_postgres::Error) -> String {
    let reason = std::error::Error::source(error).map_or_else(|| error.to_string(), ToString::to_string);
    let reason = reason.split(" but got").next().unwrap_or_default();
    format!(
        "not a PostgreSQL connection string ({reason}); write postgres://user:password@host:5432/database (percent-encode `@` and `:` in the password) or key=value pairs such as host=db user=app password=… dbname=peregrine"
    )
}

fn url_prefix(text: &str) -> Option<usize> {
    ["postgres://", "postgresql://"].into_iter().find(|prefix| text.starts_with(prefix)).map(str::len)
}

/// The spans of the password in a URL: after the first `:` of the credentials (which end at the
/// first `@`), and every `password=` parameter.
fn url_password_spans(text: &str) -> Option<Vec<Range<usize>>> {
    let mut at = url_prefix(text)?;
    let mut spans = Vec::new();
    if let Some(end) = text[at..].find('@') {
        if let Some(colon) = text[at..at + end].find(':') {
            spans.push(at + colon + 1..at + end);
        }
        at += end + 1;
    }
    if let Some(question) = text[at..].find('?') {
        let mut start = at + question + 1;
        while start < text.len() {
            let equals = start + text[start..].find('=')?;
            let end = text[equals + 1..].find('&').map_or(text.len(), |amp| equals + 1 + amp);
            if percent_decode(&text[start..equals]) == "password" {
                spans.push(equals + 1..end);
            }
            start = end + 1;
        }
    }
    Some(spans)
}

/// The `key=value` pairs of a connection string as tokio-postgres reads them, with each value's
/// span (quotes included); `None` when it is not that form.
fn key_values(text: &str) -> Option<Vec<(String, Range<usize>)>> {
    let mut pairs = Vec::new();
    let mut chars = text.char_indices().peekable();
    let skip_blanks = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_blanks(&mut chars);
        let start = chars.peek().map_or(text.len(), |(index, _)| *index);
        while chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=').is_some() {}
        let end = chars.peek().map_or(text.len(), |(index, _)| *index);
        if start == end {
            return Some(pairs);
        }
        let key = text[start..end].to_owned();
        skip_blanks(&mut chars);
        chars.next_if(|(_, c)| *c == '=')?;
        skip_blanks(&mut chars);
        let value_start = chars.peek().map_or(text.len(), |(index, _)| *index);
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let mut closed = !quoted;
        while let Some(&(_, c)) = chars.peek() {
            if (quoted && c == '\'') || (!quoted && c.is_whitespace()) {
                break;
            }
            chars.next();
            if c == '\\' {
                chars.next();
            }
        }
        if quoted {
            closed = chars.next_if(|(_, c)| *c == '\'').is_some();
        }
        let value_end = chars.peek().map_or(text.len(), |(index, _)| *index);
        if !closed || value_end == value_start {
            return None;
        }
        pairs.push((key, value_start..value_end));
    }
}

fn unquote(value: &str) -> &str {
    value.strip_prefix('\'').and_then(|inner| inner.strip_suffix('\'')).unwrap_or(value)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |offset: usize| bytes.get(index + offset).and_then(|digit| (*digit as char).to_digit(16));
        match (bytes[index], hex(1), hex(2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                index += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_where_tokio_postgres_finds_them() {
        let cases: &[(&str, &[&str], &str)] = &[
            ("postgres://app:s3cret@db:5432/x", &["s3cret"], "postgres://app:***@db:5432/x"),
            ("postgres://app:pa#ss?w0rd@127.0.0.1:9/x", &["pa#ss?w0rd"], "postgres://app:***@127.0.0.1:9/x"),
            ("postgresql://app:pa%40ss@db/x", &["pa@ss", "pa%40ss"], "postgresql://app:***@db/x"),
            ("postgres://db/x?user=a&pass%77ord=q-pw&sslmode=disable", &["q-pw"], "postgres://db/x?user=a&pass%77ord=***&sslmode=disable"),
            ("host=db user=app password=hunter2 dbname=x", &["hunter2"], "host=db user=app password=*** dbname=x"),
            ("password = 'it\\'s here' host=db", &["it's here", "it\\'s here"], "password = *** host=db"),
            ("postgres://app@db/x", &[], "postgres://app@db/x"),
            ("host=/run/postgresql dbname=x", &[], "host=/run/postgresql dbname=x"),
        ];
        for (text, secrets, masked) in cases {
            let dsn = parse(text).unwrap_or_else(|error| panic!("{text}: {error}"));
            assert_eq!(dsn.secrets(), *secrets, "{text}");
            assert_eq!(dsn.masked, *masked, "{text}");
        }
    }

    #[test]
    fn what_tokio_postgres_refuses_is_described_without_the_text() {
        for text in ["postgres://app:pw-1@[::1/x", "host=db password='pw-2", "http://x", "${DATABASE_URL}", "host=db password=pw-3 x"] {
            let error = parse(text).expect_err(text);
            assert!(error.contains("not a PostgreSQL connection string") && !error.contains("pw-"), "{text}: {error}");
            assert_eq!(masked(text), "***");
        }
        assert!(looks_like("postgres://x") && looks_like("host=db password=x") && !looks_like("host=db") && !looks_like("gpt-4o"));
    }
}

//! A `.env` parser with python-dotenv 1.x semantics (what upstream's `load_dotenv` reads), so
//! that one `.env` means the same to Osprey and to Peregrine.
//!
//! - `NAME=value`, an optional `export ` prefix, `'quoted'` names, `#` comment lines, blank lines;
//!   a line with a name and no `=` sets nothing.
//! - Unquoted values are trimmed and lose an inline comment (` #…`; a `#` with no space before
//!   it is part of the value).
//! - `"double quotes"` may span lines and decode `\n \t \r \" \\ \' \a \b \f \v`; `'single
//!   quotes'` decode only `\'` and `\\`. Text after the closing quote other than a comment is an
//!   error.
//! - Every value (single-quoted ones too, as python-dotenv does) expands `${NAME}` and
//!   `${NAME:-default}`, nothing else: a bare `$NAME` or `$$` stays as written. A name resolves
//!   to the earlier lines of the file, then to the outer lookup (the process environment, or an
//!   earlier `.env`); an unset name without a default is empty. The default is used only when
//!   the name is unset (an empty value is kept), and is not itself expanded.
//!
//! Unlike python-dotenv, which logs a warning and skips a line it cannot parse, a malformed line
//! is an error (the file's line number, never its text: it may hold a secret).

use std::collections::HashMap;

use super::de::EnvLookup;

/// A line that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DotenvError {
    /// 1-based line where the entry starts.
    pub line: usize,
    /// What is wrong (no text of the file).
    pub message: &'static str,
}

/// The variables `content` sets, in file order (a later line wins), expanded against the earlier
/// lines and `outer`.
pub(crate) fn parse(content: &str, outer: EnvLookup<'_>) -> Result<Vec<(String, String)>, DotenvError> {
    let mut reader = Reader { rest: content, line: 1 };
    // Earlier entries by name, including names without `=` (they expand to nothing).
    let mut earlier: HashMap<String, Option<String>> = HashMap::new();
    let mut out = Vec::new();
    while let Some((name, value)) = reader.entry()? {
        let value = value.map(|value| {
            expand(&value, &|variable: &str| match earlier.get(variable) {
                Some(known) => Some(known.clone().unwrap_or_default()),
                None => outer(variable),
            })
        });
        if let Some(value) = &value {
            out.push((name.clone(), value.clone()));
        }
        earlier.insert(name, value);
    }
    Ok(out)
}

struct Reader<'a> {
    rest: &'a str,
    line: usize,
}

impl<'a> Reader<'a> {
    /// Consumes `count` bytes, counting line breaks (`\r\n` is one).
    fn advance(&mut self, count: usize) -> &'a str {
        let (taken, rest) = self.rest.split_at(count);
        self.line += taken.matches(['\r', '\n']).count() - taken.matches("\r\n").count();
        self.rest = rest;
        taken
    }

    /// Consumes horizontal whitespace.
    fn skip_blanks(&mut self) {
        let end = self.rest.find(|c: char| !is_blank(c)).unwrap_or(self.rest.len());
        self.advance(end);
    }

    /// The next `(name, value)`; `None` at the end. Comment lines are skipped.
    fn entry(&mut self) -> Result<Option<(String, Option<String>)>, DotenvError> {
        loop {
            let end = self.rest.find(|c: char| !c.is_whitespace()).unwrap_or(self.rest.len());
            self.advance(end);
            if self.rest.is_empty() {
                return Ok(None);
            }
            let line = self.line;
            let fail = |message| DotenvError { line, message };
            if let Some(after) = self.rest.strip_prefix("export") {
                let blanks = after.len() - after.trim_start_matches(is_blank).len();
                if blanks > 0 {
                    self.advance("export".len() + blanks);
                }
            }
            let name = if self.rest.starts_with('#') {
                None
            } else if let Some(quoted) = self.rest.strip_prefix('\'') {
                let close =
                    quoted.find('\'').filter(|close| *close > 0).ok_or_else(|| fail("a quoted name is not closed; expected NAME=value"))?;
                let name = quoted[..close].to_owned();
                self.advance(close + 2);
                Some(name)
            } else {
                let end = self.rest.find(|c: char| c == '=' || c == '#' || c.is_whitespace()).unwrap_or(self.rest.len());
                if end == 0 {
                    return Err(fail("expected NAME=value (a name, then `=`)"));
                }
                Some(self.advance(end).to_owned())
            };
            self.skip_blanks();
            let value = match self.rest.strip_prefix('=') {
                Some(_) => {
                    self.advance(1);
                    self.skip_blanks();
                    Some(self.value().map_err(fail)?)
                }
                None => None,
            };
            self.end_of_line().map_err(fail)?;
            if let Some(name) = name {
                return Ok(Some((name, value)));
            }
        }
    }

    fn value(&mut self) -> Result<String, &'static str> {
        match self.rest.chars().next() {
            Some(quote @ ('\'' | '"')) => {
                let (content, consumed) =
                    quoted(&self.rest[1..], quote).ok_or("a quoted value is not closed; close it with the quote it opens with")?;
                let content = content.to_owned();
                self.advance(1 + consumed);
                Ok(if quote == '"' { unescape(&content, "\\'\"abfnrtv") } else { unescape(&content, "\\'") })
            }
            None | Some('\r' | '\n') => Ok(String::new()),
            Some(_) => {
                let end = self.rest.find(['\r', '\n']).unwrap_or(self.rest.len());
                Ok(strip_inline_comment(self.advance(end)).trim_end().to_owned())
            }
        }
    }

    /// An optional comment, then the end of the line or of the file.
    fn end_of_line(&mut self) -> Result<(), &'static str> {
        self.skip_blanks();
        if self.rest.starts_with('#') {
            let end = self.rest.find(['\r', '\n']).unwrap_or(self.rest.len());
            self.advance(end);
        }
        if self.rest.starts_with("\r\n") {
            self.advance(2);
        } else if self.rest.starts_with(['\r', '\n']) {
            self.advance(1);
        } else if !self.rest.is_empty() {
            return Err("unexpected text after the value (quote a value with spaces, escape a quote inside quotes)");
        }
        Ok(())
    }
}

/// Whitespace other than a line break.
fn is_blank(c: char) -> bool {
    c.is_whitespace() && c != '\r' && c != '\n'
}

/// The content of a quoted value (after its opening quote) and the bytes consumed with the
/// closing quote, as python-dotenv's `'((?:\\'|[^'])*)'` matches: `\` + quote is skipped over,
/// and when no unescaped quote closes the value, the last escaped one does.
fn quoted(text: &str, quote: char) -> Option<(&str, usize)> {
    let mut last_escaped = None;
    let mut chars = text.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        if c == '\\' && chars.peek().is_some_and(|(_, next)| *next == quote) {
            last_escaped = Some(index);
            chars.next();
        } else if c == quote {
            return Some((&text[..index], index + 1));
        }
    }
    last_escaped.map(|backslash| (&text[..=backslash], backslash + 2))
}

/// Decodes `\x` for every `x` in `escapable`; other backslashes stay.
fn unescape(text: &str, escapable: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match chars.peek().copied() {
            Some(next) if c == '\\' && escapable.contains(next) => {
                chars.next();
                out.push(match next {
                    'a' => '\x07',
                    'b' => '\x08',
                    'f' => '\x0c',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    'v' => '\x0b',
                    other => other,
                });
            }
            _ => out.push(c),
        }
    }
    out
}

/// An unquoted value without its inline comment: from the whitespace before the first `#` that
/// follows whitespace.
fn strip_inline_comment(value: &str) -> &str {
    let mut previous_blank_start = None;
    for (index, c) in value.char_indices() {
        if c.is_whitespace() {
            previous_blank_start.get_or_insert(index);
        } else if c == '#' && previous_blank_start.is_some() {
            return &value[..previous_blank_start.unwrap_or(index)];
        } else {
            previous_blank_start = None;
        }
    }
    value
}

/// `${NAME}` and `${NAME:-default}` in `value`, as python-dotenv's `\$\{([^}:]*)(?::-([^}]*))?\}`
/// finds them: an unset name is its default, else empty.
fn expand(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let name_end = after.find(['}', ':']).unwrap_or(after.len());
        let name = &after[..name_end];
        let tail = &after[name_end..];
        let matched = if tail.starts_with('}') {
            Some((None, name_end + 1))
        } else if let Some(default) = tail.strip_prefix(":-") {
            default.find('}').map(|close| (Some(&default[..close]), name_end + 2 + close + 1))
        } else {
            None
        };
        match matched {
            Some((default, consumed)) => {
                out.push_str(&lookup(name).unwrap_or_else(|| default.unwrap_or_default().to_owned()));
                rest = &after[consumed..];
            }
            None => {
                out.push('$');
                rest = &rest[start + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outer(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/op".into()),
            "PROC" => Some("proc".into()),
            "A" => Some("proc-a".into()),
            _ => None,
        }
    }

    fn values(content: &str) -> Vec<(String, String)> {
        parse(content, &outer).unwrap_or_else(|error| panic!("{content:?}: {error:?}"))
    }

    /// Each line's result as python-dotenv 1.2.2's `dotenv_values` gave it (HOME=/home/op,
    /// PROC=proc, A=proc-a in the environment).
    #[test]
    fn values_match_python_dotenv() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("PG_PASSWORD=abc$defXYZ9", &[("PG_PASSWORD", "abc$defXYZ9")]),
            ("A=a$$b", &[("A", "a$$b")]),
            ("X=\"q$HOME\"", &[("X", "q$HOME")]),
            ("S='${HOME}'", &[("S", "/home/op")]),
            ("S=${NOPE:-d}", &[("S", "d")]),
            ("S=${NOPE}x", &[("S", "x")]),
            ("A=1\nB=${A}2", &[("A", "1"), ("B", "12")]),
            ("E=\nB=${E:-def}", &[("E", ""), ("B", "")]),
            ("B=${NOPE:-${HOME}}", &[("B", "${HOME}")]),
            ("B=\"a\\nb\\tc\\\"d\\\\e\\x\"", &[("B", "a\nb\tc\"d\\e\\x")]),
            ("B='a\\nb\\'c'", &[("B", "a\\nb'c")]),
            ("B=value # comment", &[("B", "value")]),
            ("B=value#notcomment", &[("B", "value#notcomment")]),
            ("B=  spaced  value  ", &[("B", "spaced  value")]),
            ("export B=1", &[("B", "1")]),
            ("export  B = 1", &[("B", "1")]),
            ("'B'=1", &[("B", "1")]),
            ("B", &[]),
            ("B=", &[("B", "")]),
            ("B=\"multi\nline\"", &[("B", "multi\nline")]),
            ("B=\"x\" # c", &[("B", "x")]),
            ("B=#x", &[("B", "#x")]),
            ("B=${A:x}", &[("B", "${A:x}")]),
            ("HOME=${HOME}/x\nY=${HOME}", &[("HOME", "/home/op/x"), ("Y", "/home/op/x")]),
            ("B=1\r\nC=2", &[("B", "1"), ("C", "2")]),
            ("A=from-file\nB=${A}", &[("A", "from-file"), ("B", "from-file")]),
            ("B=${PROC}", &[("B", "proc")]),
            ("B=${A}", &[("B", "proc-a")]),
            ("B=\"a\\\"", &[("B", "a\\")]),
            ("B=\"${NOPE:-x y}\"", &[("B", "x y")]),
            ("B=${NOPE:-}", &[("B", "")]),
            ("K=v\nK=w", &[("K", "v"), ("K", "w")]),
            ("  # indented comment\nB=1", &[("B", "1")]),
            ("B=a\tb #c", &[("B", "a\tb")]),
            ("B=\\$HOME", &[("B", "\\$HOME")]),
            ("A\nB=${A:-d}", &[("B", "")]),
            ("B=\"\\a\\b\\f\\v\\r\"", &[("B", "\x07\x08\x0c\x0b\r")]),
        ];
        for (content, expected) in cases {
            let expected: Vec<(String, String)> = expected.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
            assert_eq!(values(content), expected, "{content:?}");
        }
    }

    /// Lines python-dotenv skips with "could not parse statement": errors here, at the line the
    /// entry starts on.
    #[test]
    fn malformed_lines_are_errors_with_their_line() {
        let cases: &[(&str, usize)] = &[
            ("GOOD=1\n\nnot a variable line\n", 3),
            ("A=1\nB=\"unterminated\nC=1\n", 2),
            ("B=\"x\" trailing", 1),
            ("B='it''s'", 1),
            ("\r\n\r\n=value", 3),
            ("OK='a'\nB=\"a\\\" b\nC=\"x\"\n", 2),
        ];
        for (content, line) in cases {
            let error = parse(content, &outer).expect_err(content);
            assert_eq!(error.line, *line, "{content:?}");
        }
    }
}

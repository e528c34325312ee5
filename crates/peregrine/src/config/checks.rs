//! Checks of single values that `run` would otherwise fail on after `config validate` said the
//! file was fine: the `logging.level` filter, the `logging.file` directory, the
//! `file_paths.agent_data_dir` directory. (A provider's
//! `base_url` is checked with `peregrine_llm::http::validate_base_url`, the check the provider
//! itself makes; `checkpointer.url` with tokio-postgres, see [`super::dsn`].) Each returns what is
//! wrong, without the key: the caller adds the key and line.

use std::path::Path;

/// The levels a bare word of a filter may be (tracing's names, and its numbers).
const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off", "0", "1", "2", "3", "4", "5"];

/// A `tracing` filter as `init_tracing` will build it. tracing reads a bare word that is not a
/// level as a target (`verbose` would mean "everything from a module called verbose"), which
/// in a config file is always a mistake, so a bare word must be a level.
pub(crate) fn log_level(filter: &str) -> Result<(), String> {
    let usage =
        "use a level (trace, debug, info, warn, error or off) or comma-separated target=level directives such as peregrine=debug,warn";
    for directive in filter.split(',').map(str::trim).filter(|directive| !directive.is_empty()) {
        let bare = !directive.contains(['=', '[', ':']);
        if bare && !LEVELS.iter().any(|level| level.eq_ignore_ascii_case(directive)) {
            return Err(format!("`{directive}` is not a level; {usage}"));
        }
    }
    match tracing_subscriber::EnvFilter::try_new(filter) {
        Ok(_) => Ok(()),
        Err(error) => Err(format!("`{filter}` is not a filter tracing can read ({error}); {usage}")),
    }
}

/// A log file that can be opened for appending: its directory exists and it is not a directory.
pub(crate) fn log_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{} is a directory; name a file in it, such as {}", path.display(), path.join("peregrine.log").display()));
    }
    match path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        Some(parent) if !parent.is_dir() => Err(format!(
            "the directory {} does not exist; create it (mkdir -p {}) or choose a file in an existing directory",
            parent.display(),
            parent.display()
        )),
        _ => Ok(()),
    }
}

/// A directory `run` can use or create: neither it nor its nearest existing ancestor is a file
/// (one that does not exist yet is created).
pub(crate) fn data_dir(path: &Path) -> Result<(), String> {
    for (index, ancestor) in path.ancestors().enumerate() {
        match std::fs::metadata(ancestor) {
            Ok(metadata) if metadata.is_dir() => return Ok(()),
            Ok(_) if index == 0 => {
                return Err(format!(
                    "{} is a file, not a directory; point the agent data directory at a directory (one that does not exist yet is created) or move the file away",
                    path.display()
                ));
            }
            Ok(_) => {
                return Err(format!(
                    "{} is a file, so the directory {} cannot be created in it; choose a directory elsewhere or move the file away",
                    ancestor.display(),
                    path.display()
                ));
            }
            // Missing (created by `run`) or unreadable here (reported by `run` with its cause).
            Err(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_levels_or_directives() {
        for good in ["info", "WARN", "peregrine=debug,warn", "off", "peregrine_llm=trace", "3", "peregrine[run]=debug"] {
            assert_eq!(log_level(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("verbose", "`verbose` is not a level"),
            ("debug,chatty", "`chatty` is not a level"),
            ("peregrine=loud", "not a filter"),
            ("=debug", "not a filter"),
            ("warn, peregrine=info", "not a filter"),
        ] {
            let message = log_level(bad).expect_err(bad);
            assert!(message.contains(says) && message.contains("trace, debug, info, warn, error"), "{bad}: {message}");
        }
    }

    #[test]
    fn a_data_dir_may_be_missing_but_not_a_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("write");
        assert_eq!(data_dir(dir.path()), Ok(()));
        assert_eq!(data_dir(&dir.path().join("new/deeper")), Ok(()));
        assert!(data_dir(&file).expect_err("a file").contains("is a file, not a directory"));
        assert!(data_dir(&file.join("below")).expect_err("below a file").contains("cannot be created in it"));
    }

    #[test]
    fn a_log_file_needs_its_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(log_file(&dir.path().join("peregrine.log")), Ok(()));
        assert!(log_file(&dir.path().join("nope/peregrine.log")).expect_err("missing").contains("does not exist"));
        assert!(log_file(dir.path()).expect_err("a directory").contains("is a directory"));
    }
}

/// A web origin as browsers send it: `http` or `https`, `://`, a host and an optional port,
/// nothing after (a trailing `/` is tolerated).
pub(crate) fn web_origin(origin: &str) -> bool {
    let origin = origin.trim().trim_end_matches('/');
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, rest)) => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https")
        && !host.is_empty()
        && !host.contains(['/', '?', '#', '@', ' ', '*', '[', ']'])
        && port.is_none_or(|port| !port.is_empty() && port.len() <= 5 && port.bytes().all(|byte| byte.is_ascii_digit()))
}

#[cfg(test)]
mod web_origin_tests {
    #[test]
    fn origins_are_scheme_host_and_port_only() {
        for good in ["https://ui.example.org", "http://localhost:3000", "http://127.0.0.1:8080/", "http://[::1]:3000"] {
            assert!(super::web_origin(good), "{good}");
        }
        for bad in
            ["ui.example.org", "ftp://x", "http://", "https://ui.example.org/path", "*", "http://*.example.org", "http://a:b", "http://u@h"]
        {
            assert!(!super::web_origin(bad), "{bad}");
        }
    }
}

/// Whether YAML flow collections (`[`, `{`) nest at most `max` deep, outside quoted scalars and
/// comments; the 1-based line and column of the first bracket too deep otherwise. Outside a flow
/// collection a bracket opens one only where a value starts (after `:`, `-`, `?` or at the start
/// of a line), so `${A:-x}` in a plain value is not counted.
pub(crate) fn flow_nesting(text: &str, max: usize) -> Result<(), (usize, usize)> {
    let mut depth = 0usize;
    for (number, line) in text.lines().enumerate() {
        let mut quote: Option<char> = None;
        let mut previous = ' ';
        // The last character that was not whitespace on this line, outside quotes.
        let mut last: Option<char> = None;
        for (column, character) in line.chars().enumerate() {
            if let Some(open) = quote {
                let escaped = open == '"' && previous == '\\';
                if character == open && !escaped {
                    quote = None;
                }
                // A doubled backslash escapes nothing after it.
                previous = if escaped && character == '\\' { ' ' } else { character };
                continue;
            }
            let starts_value = depth > 0 || matches!(last, None | Some(':' | '-' | '?'));
            match character {
                '"' | '\'' if starts_value || previous.is_whitespace() => quote = Some(character),
                '#' if previous.is_whitespace() => break,
                '[' | '{' if starts_value => {
                    depth += 1;
                    if depth > max {
                        return Err((number + 1, column + 1));
                    }
                }
                ']' | '}' if depth > 0 => depth -= 1,
                _ => {}
            }
            if !character.is_whitespace() {
                last = Some(character);
            }
            previous = character;
        }
    }
    Ok(())
}

#[cfg(test)]
mod flow_nesting_tests {
    use super::flow_nesting;

    #[test]
    fn deep_brackets_are_found_and_quoted_ones_are_not_counted() {
        assert_eq!(flow_nesting("a: [[[1]]]\nb: {c: [d]}\n", 3), Ok(()));
        assert_eq!(flow_nesting("a: [[[[1]]]]\n", 3), Err((1, 7)));
        assert_eq!(flow_nesting(&format!("a: {}\n", "[".repeat(100_000)), 64), Err((1, 68)));
        assert_eq!(flow_nesting("a: \"[[[[[[\"\nb: '{{{{{'\nc: x # [[[[[[\n", 3), Ok(()));
        assert_eq!(flow_nesting("a: \"say \\\"[[[[[\\\" \"\n", 3), Ok(()));
        assert_eq!(flow_nesting(&format!("a: {}x{}\n", "${A:-".repeat(100), "}".repeat(100)), 3), Ok(()), "not flow");
        assert_eq!(flow_nesting("- [[[[1]]]]\n", 3), Err((1, 6)));
        assert_eq!(flow_nesting("a:\n  [[\n   [[1]]]]\n", 3), Err((3, 5)));
    }
}

//! Where a dotted key is written in a YAML file, for errors found after parsing (an unknown
//! provider, a PostgreSQL checkpointer without a URL). Block-style mappings are followed by
//! indentation; a key written in flow style (`{provider: x}`) is not found, and the deepest
//! ancestor that is found is returned instead.

/// The 1-based `(line, column)` of the key `path` (segments of a dotted key), or of its deepest
/// written ancestor; `None` when not even the first segment is written in block style.
pub(crate) fn key_position(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    let mut ancestry: Vec<(usize, String)> = Vec::new();
    let mut best: Option<(usize, usize, usize)> = None;
    let mut block_scalar_parent: Option<usize> = None;
    // Lines as YAML counts them: `\r\n`, `\n` and a bare `\r` each end one.
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    for (index, line) in text.lines().enumerate() {
        let content = line.trim_start_matches(' ');
        let mut indent = line.len() - content.len();
        if content.trim().is_empty() {
            continue;
        }
        if let Some(parent) = block_scalar_parent {
            if indent > parent {
                continue;
            }
            block_scalar_parent = None;
        }
        if content.starts_with('#') {
            continue;
        }
        if indent == 0 && (content.starts_with("---") || content.starts_with("...")) {
            ancestry.clear();
            continue;
        }
        let mut rest = content;
        while let Some(item) = rest.strip_prefix('-').filter(|item| item.is_empty() || item.starts_with(' ')) {
            let spaces = item.len() - item.trim_start_matches(' ').len();
            indent += 1 + spaces;
            rest = &item[spaces..];
        }
        let Some((key, value)) = split_key(rest) else {
            continue;
        };
        while ancestry.last().is_some_and(|(parent_indent, _)| *parent_indent >= indent) {
            ancestry.pop();
        }
        ancestry.push((indent, key));
        let value = value.trim_start();
        if value.starts_with('|') || value.starts_with('>') {
            block_scalar_parent = Some(indent);
        }
        let depth = ancestry.len();
        let matches = depth <= path.len() && ancestry.iter().zip(path).all(|((_, written), wanted)| written == wanted);
        if matches && best.is_none_or(|(best_depth, _, _)| depth > best_depth) {
            best = Some((depth, index + 1, indent + 1));
            if depth == path.len() {
                break;
            }
        }
    }
    best.map(|(_, line, column)| (line, column))
}

/// `key: value` → the key (unquoted) and the rest after the colon; `None` for a line that is not
/// a mapping entry.
fn split_key(text: &str) -> Option<(String, &str)> {
    let quote = text.chars().next().filter(|c| *c == '"' || *c == '\'');
    if let Some(quote) = quote {
        let close = text[1..].find(quote)? + 1;
        let after = text[close + 1..].trim_start_matches(' ');
        let value = after.strip_prefix(':')?;
        return (value.is_empty() || value.starts_with([' ', '\t'])).then(|| (text[1..close].to_owned(), value));
    }
    if text.starts_with(['{', '[', '&', '*', '!', '|', '>', '#']) {
        return None;
    }
    let mut search = 0;
    while let Some(offset) = text[search..].find(':') {
        let colon = search + offset;
        let after = &text[colon + 1..];
        if after.is_empty() || after.starts_with([' ', '\t']) {
            let key = text[..colon].trim_end();
            if key.contains(" #") {
                return None;
            }
            return Some((key.to_owned(), after));
        }
        search = colon + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_yaml_line_break_counts() {
        for text in [
            "a: 1\nmodels:\n  x:\n    provider: p\n",
            "a: 1\r\nmodels:\r\n  x:\r\n    provider: p\r\n",
            "a: 1\rmodels:\r  x:\r    provider: p\r",
        ] {
            assert_eq!(key_position(text, &["models", "x", "provider"]), Some((4, 5)), "{text:?}");
        }
    }

    const TEXT: &str = "\
# Peregrine
project_name: demo   # a comment: with a colon
models:
  orchestrator:
    provider: cborg
    model_id: anthropic/claude-sonnet
  classifier: {provider: ollama, model_id: mistral}
  'quoted role':
    provider: \"openai\"
prompt: |
  models:
    provider: not-a-key
api:
  providers:
    cborg:
      api_key: ${CBORG_API_KEY}
      base_url: https://api.cborg.lbl.gov   # url: with colon
deployed_services:
  - jupyter
  - name: open_webui
    port: 8080
checkpointer:
  type: postgres
";

    #[test]
    fn keys_are_found_by_indentation() {
        let cases: &[(&str, Option<(usize, usize)>)] = &[
            ("project_name", Some((2, 1))),
            ("models", Some((3, 1))),
            ("models.orchestrator.provider", Some((5, 5))),
            ("models.orchestrator.model_id", Some((6, 5))),
            ("models.quoted role.provider", Some((9, 5))),
            ("api.providers.cborg.base_url", Some((17, 7))),
            ("deployed_services.name", Some((20, 5))),
            ("checkpointer.type", Some((23, 3))),
            // Flow style and missing keys: the deepest written ancestor.
            ("models.classifier.provider", Some((7, 3))),
            ("models.memory.provider", Some((3, 1))),
            ("api.providers.openai", Some((14, 3))),
            ("services", None),
        ];
        for (dotted, expected) in cases {
            let path: Vec<&str> = dotted.split('.').collect();
            assert_eq!(key_position(TEXT, &path), *expected, "{dotted}");
        }
    }

    #[test]
    fn block_scalar_content_is_not_a_key() {
        assert_eq!(key_position(TEXT, &["prompt", "models"]), Some((10, 1)));
        assert_eq!(key_position("a:\n  b: 1\n---\nb: 2\n", &["b"]), Some((4, 1)));
    }
}

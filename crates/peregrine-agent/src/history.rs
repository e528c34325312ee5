//! The prompt-history budget every prompt that shows the conversation shares: the most recent
//! messages whose formatted size fits a character budget (`AgentSettings::prompt_history_chars`),
//! always with the latest user message (cut with a marker when it alone is too long), and a
//! count of the earlier messages left out, so a long thread never overflows the model's context
//! window on every turn.

use peregrine_core::state::{Message, Role};

/// The default history budget: 24 000 characters, about 6 000 tokens.
pub const DEFAULT_PROMPT_HISTORY_CHARS: usize = 24_000;

/// The part of a thread a prompt shows: the formatted lines of its most recent messages, oldest
/// first, and how many earlier messages were left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryWindow {
    omitted: usize,
    lines: Vec<String>,
    separator: String,
}

impl HistoryWindow {
    /// Formats the most recent `messages` with `format(position, message)` (the 0-based
    /// position in the whole thread, so numbering stays real) while the lines, joined by
    /// `separator`, fit `budget_chars` characters. The window is a suffix of the thread that
    /// always holds the latest user message: when that message (or one after it) does not fit
    /// what is left, its content is cut to fit, with a marker saying so.
    ///
    /// A budget of 0 means "no history": only the latest user message and anything after it,
    /// whole (it is the request itself, not history).
    pub fn select(messages: &[Message], budget_chars: usize, separator: &str, format: impl Fn(usize, &Message) -> String) -> Self {
        let latest_user = messages.iter().rposition(|message| message.role == Role::User);
        let separator_chars = separator.chars().count();
        let mut kept: Vec<String> = Vec::new();
        let mut used = 0;
        for (position, message) in messages.iter().enumerate().rev() {
            let must_keep = latest_user.is_some_and(|latest| position >= latest);
            if budget_chars == 0 {
                if !must_keep {
                    break;
                }
                kept.push(format(position, message));
                continue;
            }
            let joint = if kept.is_empty() { 0 } else { separator_chars };
            let line = format(position, message);
            let cost = joint + line.chars().count();
            if used + cost <= budget_chars {
                used += cost;
                kept.push(line);
            } else if must_keep {
                let cut = truncated_line(position, message, budget_chars.saturating_sub(used + joint), &format);
                // A short message is kept whole rather than "cut" into something longer.
                let line = if cut.chars().count() < line.chars().count() { cut } else { line };
                used += joint + line.chars().count();
                kept.push(line);
            } else {
                break;
            }
        }
        kept.reverse();
        Self { omitted: messages.len() - kept.len(), lines: kept, separator: separator.to_owned() }
    }

    /// How many earlier messages were left out.
    pub fn omitted(&self) -> usize {
        self.omitted
    }

    /// The kept messages, formatted, oldest first.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// Whether no message is shown.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// `(12 earlier messages omitted)`; `None` when nothing was left out.
    pub fn omitted_note(&self) -> Option<String> {
        match self.omitted {
            0 => None,
            1 => Some("(1 earlier message omitted)".to_owned()),
            count => Some(format!("({count} earlier messages omitted)")),
        }
    }

    /// The note (when messages were left out) on its own first line, then the kept lines
    /// joined by the separator.
    pub fn render(&self) -> String {
        let body = self.lines.join(&self.separator);
        match self.omitted_note() {
            Some(note) if body.is_empty() => note,
            Some(note) => format!("{note}\n{body}"),
            None => body,
        }
    }
}

/// `User`, `Assistant` or `System`: how the prose-style histories name a message's author.
pub fn speaker(role: Role) -> &'static str {
    match role {
        Role::User => "User",
        Role::Assistant => "Assistant",
        Role::System => "System",
    }
}

/// The recent conversation as `User: …` / `Assistant: …` lines within `budget_chars`, with the
/// omitted-messages note first when earlier messages were left out.
pub fn format_dialogue(messages: &[Message], budget_chars: usize) -> String {
    HistoryWindow::select(messages, budget_chars, "\n", |_, message| format!("{}: {}", speaker(message.role), message.content)).render()
}

/// `message` formatted with its content cut so the line is at most about `allowance` characters
/// (never less than the line's own frame and the marker).
fn truncated_line(position: usize, message: &Message, allowance: usize, format: &impl Fn(usize, &Message) -> String) -> String {
    let total = message.content.chars().count();
    let frame = format(position, &Message::new(message.role, String::new(), message.timestamp)).chars().count();
    // The marker's length with `shown = total` bounds the real one (fewer digits or as many).
    let marker_chars = marker(total, total).chars().count();
    let shown = allowance.saturating_sub(frame + marker_chars).min(total);
    let head: String = message.content.chars().take(shown).collect();
    format(position, &Message::new(message.role, format!("{head}{}", marker(shown, total)), message.timestamp))
}

fn marker(shown: usize, total: usize) -> String {
    format!(" … [message truncated: the first {shown} of {total} characters are shown]")
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn thread(contents: &[(Role, &str)]) -> Vec<Message> {
        let at = Utc.with_ymd_and_hms(2025, 3, 4, 12, 0, 0).single().expect("valid time");
        contents.iter().map(|(role, content)| Message::new(*role, *content, at)).collect()
    }

    fn numbered(position: usize, message: &Message) -> String {
        format!("{}. {}: {}", position + 1, speaker(message.role), message.content)
    }

    #[test]
    fn everything_fits_in_a_large_budget() {
        let messages = thread(&[(Role::User, "a"), (Role::Assistant, "b"), (Role::User, "c")]);
        let window = HistoryWindow::select(&messages, 1_000, "\n", numbered);
        assert_eq!(window.omitted(), 0);
        assert_eq!(window.omitted_note(), None);
        assert_eq!(window.render(), "1. User: a\n2. Assistant: b\n3. User: c");
    }

    #[test]
    fn the_most_recent_messages_that_fit_are_kept_with_their_real_numbers() {
        // Each line is 13 characters ("N. User: xxxx"); with the newline, two lines take 27.
        let messages = thread(&[(Role::User, "aaaa"), (Role::User, "bbbb"), (Role::User, "cccc"), (Role::User, "dddd")]);
        let window = HistoryWindow::select(&messages, 27, "\n", numbered);
        assert_eq!(window.omitted(), 2);
        assert_eq!(window.lines(), ["3. User: cccc", "4. User: dddd"]);
        assert_eq!(window.render(), "(2 earlier messages omitted)\n3. User: cccc\n4. User: dddd");
        let tighter = HistoryWindow::select(&messages, 26, "\n", numbered);
        assert_eq!(tighter.render(), "(3 earlier messages omitted)\n4. User: dddd");
    }

    #[test]
    fn the_separator_counts_against_the_budget() {
        let messages = thread(&[(Role::User, "aaaa"), (Role::User, "bbbb")]);
        assert_eq!(HistoryWindow::select(&messages, 36, "\n----------\n", numbered).omitted(), 1);
        assert_eq!(HistoryWindow::select(&messages, 38, "\n----------\n", numbered).omitted(), 0);
    }

    #[test]
    fn a_latest_user_message_larger_than_the_budget_is_cut_with_a_marker() {
        let long = "x".repeat(500);
        let messages = thread(&[(Role::User, "earlier"), (Role::Assistant, "answer"), (Role::User, &long)]);
        let window = HistoryWindow::select(&messages, 200, "\n", numbered);
        assert_eq!(window.omitted(), 2);
        let line = &window.lines()[0];
        assert!(line.starts_with("3. User: xxx"), "{line}");
        assert!(line.ends_with("of 500 characters are shown]"), "{line}");
        assert!(line.chars().count() <= 200, "{} characters", line.chars().count());
        assert!(line.contains("[message truncated: the first "), "{line}");
        assert!(window.render().starts_with("(2 earlier messages omitted)\n3. User: xxx"));
    }

    #[test]
    fn a_tiny_budget_keeps_the_latest_user_message_cut_or_whole_whichever_is_shorter() {
        let long = "p".repeat(300);
        let messages = thread(&[(Role::User, &long)]);
        let window = HistoryWindow::select(&messages, 5, "\n", numbered);
        assert_eq!(window.lines(), ["1. User:  … [message truncated: the first 0 of 300 characters are shown]"]);
        let short = thread(&[(Role::User, "please plot the beam current")]);
        assert_eq!(HistoryWindow::select(&short, 5, "\n", numbered).lines(), ["1. User: please plot the beam current"]);
    }

    #[test]
    fn messages_after_the_latest_user_message_do_not_crowd_it_out() {
        let messages = thread(&[(Role::User, "question"), (Role::Assistant, &"y".repeat(300))]);
        let window = HistoryWindow::select(&messages, 100, "\n", numbered);
        assert_eq!(window.omitted(), 0, "the answer after the request and the request are both kept");
        assert!(window.lines()[1].contains("[message truncated"));
        assert!(window.lines()[0].starts_with("1. User: "));
    }

    #[test]
    fn a_zero_budget_keeps_only_the_request_whole() {
        let long = "z".repeat(100);
        let messages = thread(&[(Role::User, "old"), (Role::Assistant, "older answer"), (Role::User, &long)]);
        let window = HistoryWindow::select(&messages, 0, "\n", numbered);
        assert_eq!(window.omitted(), 2);
        assert_eq!(window.lines(), [format!("3. User: {long}")]);
        assert_eq!(window.omitted_note().as_deref(), Some("(2 earlier messages omitted)"));
    }

    #[test]
    fn without_a_user_message_only_what_fits_is_kept() {
        let messages = thread(&[(Role::Assistant, &"a".repeat(50)), (Role::System, "short")]);
        let window = HistoryWindow::select(&messages, 20, "\n", numbered);
        assert_eq!(window.render(), "(1 earlier message omitted)\n2. System: short");
        assert!(HistoryWindow::select(&[], 20, "\n", numbered).is_empty());
        let nothing_fits = HistoryWindow::select(&messages, 3, "\n", numbered);
        assert!(nothing_fits.is_empty());
        assert_eq!(nothing_fits.render(), "(2 earlier messages omitted)");
    }

    #[test]
    fn the_dialogue_format_names_the_speakers() {
        let messages = thread(&[(Role::System, "note"), (Role::User, "hello"), (Role::Assistant, "hi"), (Role::User, "again")]);
        assert_eq!(format_dialogue(&messages, 1_000), "System: note\nUser: hello\nAssistant: hi\nUser: again");
        assert_eq!(format_dialogue(&messages, 12), "(3 earlier messages omitted)\nUser: again");
    }
}

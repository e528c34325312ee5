//! Slash commands (reference §2.1): parsing `/name` and `/name:value` at the start of a
//! message, and what each framework command means. Every command here takes effect (upstream's
//! `/approval` changed a field nothing read); a malformed command or an invalid option is an
//! error that names it and lists what is valid.

use peregrine_core::ApprovalMode;

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlashCommand {
    /// The name without the slash, lower-cased.
    pub name: String,
    /// The text after `:`, if any.
    pub value: Option<String>,
}

/// A message split into its leading commands and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedInput {
    /// The commands, in order.
    pub commands: Vec<SlashCommand>,
    /// The message text after the commands (trimmed; may be empty).
    pub message: String,
}

/// A command that cannot be used as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// Not of the form `/name` or `/name:value`.
    #[error("'{0}' is not a valid command: commands look like /name or /name:value (letters, digits and _); type /help for the list")]
    Malformed(String),
    /// An option the command does not take.
    #[error("'/{command}:{value}' is not valid: /{command} takes {valid}")]
    InvalidOption {
        /// The command.
        command: String,
        /// The option given.
        value: String,
        /// The options it takes.
        valid: String,
    },
    /// A command that needs an argument got none.
    #[error("/{command} needs an argument: {usage}")]
    MissingArgument {
        /// The command.
        command: String,
        /// How to use it.
        usage: String,
    },
}

/// Splits `text` into leading slash commands and the message. Only input that starts with `/`
/// has commands; every leading token that starts with `/` is one, and the first token that
/// does not starts the message (so `/planning compare /dev/null` keeps `/dev/null` as text). A
/// token with a second slash is a path and starts the message (`/usr/bin/python crashed`).
pub fn parse_input(text: &str) -> Result<ParsedInput, CommandError> {
    let trimmed = text.trim();
    if !trimmed.starts_with('/') {
        return Ok(ParsedInput { commands: Vec::new(), message: trimmed.to_owned() });
    }
    let mut commands = Vec::new();
    let mut rest = trimmed;
    // A token with a second slash is a path ("/usr/bin/python crashed"), not a command.
    let is_command = |token: &&str| token.starts_with('/') && !token[1..].contains('/');
    while let Some(token) = rest.split_whitespace().next().filter(is_command) {
        commands.push(parse_command(token)?);
        rest = rest[rest.find(token).map_or(rest.len(), |at| at + token.len())..].trim_start();
    }
    Ok(ParsedInput { commands, message: rest.trim().to_owned() })
}

fn parse_command(token: &str) -> Result<SlashCommand, CommandError> {
    let body = &token[1..];
    let (name, value) = match body.split_once(':') {
        Some((name, value)) => (name, Some(value)),
        None => (body, None),
    };
    let valid_name = name.chars().next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_name || value.is_some_and(str::is_empty) {
        return Err(CommandError::Malformed(token.to_owned()));
    }
    Ok(SlashCommand { name: name.to_ascii_lowercase(), value: value.map(str::to_owned) })
}

/// A framework command, resolved from its name or alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// `/help [command]`.
    Help,
    /// `/exit`: leave direct chat, or the interface.
    Exit,
    /// `/planning[:on|off]`.
    Planning,
    /// `/approval[:on|off|selective]`.
    Approval,
    /// `/task:on|off`.
    Task,
    /// `/caps:on|off`.
    Caps,
    /// `/chat[:capability]`.
    Chat,
    /// `/clear`, `/config`, `/status`: handled by the interface.
    Interface,
}

/// Name, aliases, syntax and description of every framework command, for `/help`.
pub const BUILTINS: &[(Builtin, &str, &[&str], &str, &str)] = &[
    (Builtin::Help, "help", &["h"], "/help [command]", "Show the commands, or help for one"),
    (Builtin::Exit, "exit", &["quit", "bye", "q"], "/exit", "Leave direct chat, or the interface"),
    (
        Builtin::Planning,
        "planning",
        &[],
        "/planning[:on|off] <question>",
        "Show the execution plan for approval before it runs (this turn)",
    ),
    (
        Builtin::Approval,
        "approval",
        &[],
        "/approval[:on|off|selective] <question>",
        "Approvals for this turn: on = every approvable action asks, off = none, selective = per config",
    ),
    (
        Builtin::Task,
        "task",
        &[],
        "/task:off <question>",
        "Skip the task-extraction LLM call; the task is the whole conversation (this turn)",
    ),
    (Builtin::Caps, "caps", &["capabilities"], "/caps:off <question>", "Skip classification; every capability is active (this turn)"),
    (Builtin::Chat, "chat", &[], "/chat[:capability]", "List capabilities you can talk to directly, or start a direct chat with one"),
    (Builtin::Interface, "clear", &["cls", "c"], "/clear", "Clear the screen (interfaces)"),
    (Builtin::Interface, "config", &[], "/config", "Show the configuration (interfaces)"),
    (Builtin::Interface, "status", &[], "/status", "Run the health checks (interfaces)"),
];

/// The framework command `name` names (by name or alias), if any.
pub fn builtin(name: &str) -> Option<Builtin> {
    BUILTINS.iter().find(|(_, canonical, aliases, _, _)| *canonical == name || aliases.contains(&name)).map(|(builtin, ..)| *builtin)
}

/// The canonical name of a framework command.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|(_, canonical, aliases, _, _)| *canonical == name || aliases.contains(&name)).map(|(_, canonical, ..)| *canonical)
}

const SWITCH_OPTIONS: &str = "on, off, enabled, disabled, true or false";

/// The on/off value of a switch command; no value means on.
pub fn switch_value(command: &SlashCommand) -> Result<bool, CommandError> {
    match command.value.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("on" | "enabled" | "true" | "yes") => Ok(true),
        Some("off" | "disabled" | "false" | "no") => Ok(false),
        Some(other) => {
            Err(CommandError::InvalidOption { command: command.name.clone(), value: other.into(), valid: SWITCH_OPTIONS.into() })
        }
    }
}

/// The approval mode `/approval[:…]` asks for; no value means on (every action asks).
pub fn approval_value(command: &SlashCommand) -> Result<ApprovalMode, CommandError> {
    match command.value.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("on" | "enabled" | "true" | "all" | "all_capabilities") => Ok(ApprovalMode::AllCapabilities),
        Some("off" | "disabled" | "false") => Ok(ApprovalMode::Disabled),
        Some("selective") => Ok(ApprovalMode::Selective),
        Some(other) => Err(CommandError::InvalidOption {
            command: command.name.clone(),
            value: other.into(),
            valid: "on (all_capabilities), off (disabled) or selective".into(),
        }),
    }
}

/// The `/help` text: every command, or the one asked about.
pub fn help_text(topic: Option<&str>) -> String {
    if let Some(topic) = topic.map(|topic| topic.trim_start_matches('/').to_ascii_lowercase()) {
        if let Some((_, name, aliases, syntax, description)) =
            BUILTINS.iter().find(|(_, canonical, aliases, _, _)| *canonical == topic || aliases.contains(&topic.as_str()))
        {
            let aliases = if aliases.is_empty() { String::new() } else { format!("\nAliases: /{}", aliases.join(", /")) };
            return format!("/{name}: {description}\nUsage: {syntax}{aliases}");
        }
        return format!(
            "There is no framework command /{topic}. Type /help for the list; other /name[:value] commands go to capabilities."
        );
    }
    let mut text = String::from("Commands (put them before your question):\n");
    for (_, _, _, syntax, description) in BUILTINS {
        text.push_str(&format!("  {syntax:<42} {description}\n"));
    }
    text.push_str("Any other /name or /name:value is passed to the capabilities of this turn.");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(name: &str, value: Option<&str>) -> SlashCommand {
        SlashCommand { name: name.into(), value: value.map(str::to_owned) }
    }

    #[test]
    fn only_leading_tokens_are_commands() {
        let parsed = parse_input("  /planning /task:off What is /dev/null used for?  ").expect("parses");
        assert_eq!(parsed.commands, vec![command("planning", None), command("task", Some("off"))]);
        assert_eq!(parsed.message, "What is /dev/null used for?");
        let plain = parse_input("what about /planning?").expect("parses");
        assert!(plain.commands.is_empty());
        assert_eq!(plain.message, "what about /planning?");
        let only = parse_input("/chat:state_manager").expect("parses");
        assert_eq!((only.commands, only.message), (vec![command("chat", Some("state_manager"))], String::new()));
        assert_eq!(parse_input("/Planning:ON x").expect("parses").commands, vec![command("planning", Some("ON"))]);
        let path = parse_input("/usr/bin/python crashed again").expect("a path is text");
        assert!(path.commands.is_empty());
        assert_eq!(path.message, "/usr/bin/python crashed again");
    }

    #[test]
    fn malformed_commands_are_refused_with_the_syntax() {
        for bad in ["/ hello", "/9lives", "/foo-bar", "/planning:"] {
            let error = parse_input(bad).expect_err(bad);
            assert!(error.to_string().contains("/name or /name:value"), "{bad}: {error}");
        }
    }

    #[test]
    fn options_are_checked() {
        assert_eq!(switch_value(&command("planning", None)), Ok(true));
        assert_eq!(switch_value(&command("task", Some("OFF"))), Ok(false));
        let error = switch_value(&command("planning", Some("maybe"))).expect_err("refused");
        assert_eq!(error.to_string(), "'/planning:maybe' is not valid: /planning takes on, off, enabled, disabled, true or false");
        assert_eq!(approval_value(&command("approval", Some("off"))), Ok(ApprovalMode::Disabled));
        assert_eq!(approval_value(&command("approval", None)), Ok(ApprovalMode::AllCapabilities));
        assert_eq!(approval_value(&command("approval", Some("selective"))), Ok(ApprovalMode::Selective));
        assert!(approval_value(&command("approval", Some("sometimes"))).is_err());
    }

    #[test]
    fn aliases_resolve_and_help_describes() {
        assert_eq!(builtin("q"), Some(Builtin::Exit));
        assert_eq!(builtin("capabilities"), Some(Builtin::Caps));
        assert_eq!(builtin("beam_mode"), None);
        assert!(help_text(None).contains("/planning[:on|off] <question>"));
        assert!(help_text(Some("/quit")).starts_with("/exit: Leave direct chat"));
        assert!(help_text(Some("nothing")).contains("no framework command /nothing"));
    }

    /// Text that is often a run of commands: slash tokens with names, values, paths and
    /// malformed parts, then words, with any whitespace between.
    fn command_like() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let token = prop_oneof![
            "/[a-zA-Z_][a-zA-Z0-9_]{0,6}",
            "/[a-zA-Z_]{1,6}:[a-zA-Z0-9:_-]{0,6}",
            "/[a-z]{1,4}/[a-z]{0,4}",
            "/[^ ]{0,6}",
            "\\PC{0,8}",
        ];
        let space = prop_oneof![Just(" ".to_owned()), "[ \t\n\u{3000}\u{85}]{0,3}"];
        prop::collection::vec((token, space), 0..6).prop_map(|parts| parts.into_iter().map(|(token, space)| token + &space).collect())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn any_text_parses_or_names_its_malformed_command(text in proptest::prop_oneof![command_like(), "\\PC{0,40}"]) {
            match parse_input(&text) {
                Ok(parsed) => {
                    proptest::prop_assert_eq!(parsed.message.trim(), parsed.message.as_str());
                    proptest::prop_assert!(parsed.commands.is_empty() || text.trim_start().starts_with('/'));
                    for command in &parsed.commands {
                        let name_ok = command.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                        proptest::prop_assert!(name_ok && !command.name.is_empty(), "{command:?}");
                        proptest::prop_assert!(command.value.as_ref().is_none_or(|value| !value.is_empty()));
                        // Options never panic either.
                        let _ = (switch_value(command), approval_value(command), builtin(&command.name));
                    }
                    // Written back as commands and a message, it parses to the same.
                    let mut written: Vec<String> = parsed.commands.iter().map(|command| match &command.value {
                        Some(value) => format!("/{}:{value}", command.name),
                        None => format!("/{}", command.name),
                    }).collect();
                    written.push(parsed.message.clone());
                    proptest::prop_assert_eq!(parse_input(&written.join(" ")), Ok(parsed));
                }
                Err(CommandError::Malformed(token)) => proptest::prop_assert!(text.contains(&token) && token.starts_with('/')),
                Err(other) => proptest::prop_assert!(false, "parse_input only refuses malformed commands: {other}"),
            }
        }

        #[test]
        fn help_answers_any_topic(topic in "\\PC{0,20}") {
            proptest::prop_assert!(!help_text(Some(&topic)).is_empty());
        }
    }
}

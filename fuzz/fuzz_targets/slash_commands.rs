//! A user's message as slash commands: parsed into leading commands and the message, or refused
//! naming the malformed command; a parse written back parses to the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_agent::commands::{self, CommandError, SlashCommand};
use peregrine_agent::parse_input;

fn written(command: &SlashCommand) -> String {
    match &command.value {
        Some(value) => format!("/{}:{value}", command.name),
        None => format!("/{}", command.name),
    }
}

fuzz_target!(|text: &str| {
    match parse_input(text) {
        Ok(parsed) => {
            assert_eq!(parsed.message.trim(), parsed.message, "the message is trimmed");
            assert!(parsed.commands.is_empty() || text.trim_start().starts_with('/'));
            for command in &parsed.commands {
                assert!(!command.name.is_empty() && command.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
                assert!(command.value.as_ref().is_none_or(|value| !value.is_empty()));
                let _ = (commands::switch_value(command), commands::approval_value(command), commands::builtin(&command.name));
                let _ = commands::help_text(command.value.as_deref());
            }
            let mut again: Vec<String> = parsed.commands.iter().map(written).collect();
            again.push(parsed.message.clone());
            assert_eq!(parse_input(&again.join(" ")), Ok(parsed), "written back, it parses to the same");
        }
        Err(CommandError::Malformed(token)) => assert!(token.starts_with('/') && text.contains(&token), "{token:?}"),
        Err(other) => panic!("parse_input refuses only malformed commands: {other}"),
    }
});

//! How commands talk to people: colours only on a terminal (and never with `NO_COLOR`), plain
//! text when piped, `--quiet` / `--verbose`, and diagnostics through `tracing` to stderr or a
//! file — never into stdout, which carries answers and `--json` events only.

use std::io::IsTerminal as _;
use std::path::Path;

use tracing_subscriber::EnvFilter;

/// When to colour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// How much to say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Answers and errors only.
    Quiet,
    /// Answers, progress and notes.
    #[default]
    Normal,
    /// Also details (every node, LLM calls).
    Verbose,
}

/// The output settings of one invocation.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Colour on stdout.
    pub color_stdout: bool,
    /// Colour on stderr.
    pub color_stderr: bool,
    /// Whether stderr is a terminal (live status lines).
    pub stderr_tty: bool,
    /// Whether stdin and stdout are a terminal (interactive prompts).
    pub interactive: bool,
    /// How much to say.
    pub verbosity: Verbosity,
}

impl Output {
    /// Decides from the flags and the environment.
    pub fn detect(choice: ColorChoice, verbosity: Verbosity) -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        let stdout_tty = std::io::stdout().is_terminal();
        let stderr_tty = std::io::stderr().is_terminal();
        let decide = |tty: bool| match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => tty && !no_color && std::env::var("TERM").map_or(true, |term| term != "dumb"),
        };
        Self {
            color_stdout: decide(stdout_tty),
            color_stderr: decide(stderr_tty),
            stderr_tty,
            interactive: stdout_tty && std::io::stdin().is_terminal(),
            verbosity,
        }
    }

    /// Plain output for tests and pipes.
    pub fn plain() -> Self {
        Self { color_stdout: false, color_stderr: false, stderr_tty: false, interactive: false, verbosity: Verbosity::Normal }
    }

    /// Whether notes and progress are shown.
    pub fn notes(&self) -> bool {
        self.verbosity >= Verbosity::Normal
    }

    /// Whether details are shown.
    pub fn verbose(&self) -> bool {
        self.verbosity >= Verbosity::Verbose
    }

    /// A note on stderr (not in quiet mode).
    pub fn note(&self, text: &str) {
        if self.notes() {
            eprintln!("{}", Style::Dim.paint(text, self.color_stderr));
        }
    }

    /// A warning on stderr (not in quiet mode).
    pub fn warn(&self, text: &str) {
        if self.notes() {
            eprintln!("{} {text}", Style::Warning.paint("warning:", self.color_stderr));
        }
    }

    /// An error on stderr (always).
    pub fn error(&self, text: &str) {
        eprintln!("{} {text}", Style::Error.paint("error:", self.color_stderr));
    }
}

/// A few ANSI styles; `paint` returns the text unchanged without colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Secondary text.
    Dim,
    /// Bold.
    Bold,
    /// Success.
    Success,
    /// Warnings.
    Warning,
    /// Errors.
    Error,
    /// Names, commands.
    Accent,
}

impl Style {
    fn code(self) -> &'static str {
        match self {
            Style::Dim => "2",
            Style::Bold => "1",
            Style::Success => "32",
            Style::Warning => "33",
            Style::Error => "1;31",
            Style::Accent => "36",
        }
    }

    /// `text` in this style when `color`.
    pub fn paint(self, text: &str, color: bool) -> String {
        if color { format!("\x1b[{}m{text}\x1b[0m", self.code()) } else { text.to_owned() }
    }
}

/// Sends `tracing` diagnostics to stderr (or `file`), filtered by `PEREGRINE_LOG`, else by
/// `level` (`logging.level`), else by the verbosity. Idempotent.
pub fn init_tracing(verbosity: Verbosity, level: Option<&str>, file: Option<&Path>, color: bool) -> anyhow::Result<()> {
    let default = match verbosity {
        Verbosity::Quiet => "error",
        Verbosity::Normal => level.unwrap_or("warn"),
        Verbosity::Verbose => {
            "warn,peregrine=debug,peregrine_agent=debug,peregrine_llm=debug,peregrine_graph=info,peregrine_capabilities=debug"
        }
    };
    let filter = EnvFilter::try_from_env("PEREGRINE_LOG").or_else(|_| EnvFilter::try_new(default))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|error| anyhow::anyhow!("cannot open the log file {}: {error}", path.display()))?;
            builder.with_ansi(false).with_writer(std::sync::Mutex::new(file)).try_init()
        }
        None => builder.with_ansi(color).with_writer(std::io::stderr).try_init(),
    };
    // Already initialised (tests calling twice): keep the first.
    let _ = result;
    Ok(())
}

//! How commands talk to people: colours only on a terminal (and never with `NO_COLOR`), plain
//! text when piped, `--quiet` / `--verbose`, and diagnostics through `tracing` to stderr or a
//! file — never into stdout, which carries answers and `--json` events only.

use std::io::{IsTerminal as _, Write as _};
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
            let _ = writeln!(std::io::stderr(), "{}", Style::Dim.paint(text, self.color_stderr));
        }
    }

    /// A warning on stderr (not in quiet mode).
    pub fn warn(&self, text: &str) {
        if self.notes() {
            let _ = writeln!(std::io::stderr(), "{} {text}", Style::Warning.paint("warning:", self.color_stderr));
        }
    }

    /// An error on stderr (always).
    pub fn error(&self, text: &str) {
        let _ = writeln!(std::io::stderr(), "{} {text}", Style::Error.paint("error:", self.color_stderr));
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

/// Replaces secrets in a piece of text.
pub type Redactor = std::sync::Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Sends `tracing` diagnostics to stderr (or `file`), filtered by `PEREGRINE_LOG`, else by
/// `level` (`logging.level`), else by the verbosity (by default warnings, and `serve`'s request
/// log: one line per HTTP request); every line passes through `redact` (the configuration's
/// secrets) before it is written. Idempotent.
pub fn init_tracing(verbosity: Verbosity, level: Option<&str>, file: Option<&Path>, color: bool, redact: Redactor) -> anyhow::Result<()> {
    let requests = peregrine_server::REQUEST_LOG_TARGET;
    let default = match (verbosity, level) {
        (Verbosity::Quiet, _) => "error".to_owned(),
        (Verbosity::Normal, Some(level)) => level.to_owned(),
        (Verbosity::Normal, None) => format!("warn,{requests}=info"),
        (Verbosity::Verbose, _) => "warn,peregrine=debug,peregrine_agent=debug,peregrine_llm=debug,peregrine_graph=info,\
                                    peregrine_capabilities=debug,peregrine_server=debug"
            .to_owned(),
    };
    let filter = EnvFilter::try_from_env("PEREGRINE_LOG").or_else(|_| EnvFilter::try_new(&default))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|error| anyhow::anyhow!("cannot open the log file {}: {error}", path.display()))?;
            let file = std::sync::Arc::new(std::sync::Mutex::new(file));
            builder.with_ansi(false).with_writer(RedactingWriter::factory(redact, move || SharedFile(file.clone()))).try_init()
        }
        None => builder.with_ansi(color).with_writer(RedactingWriter::factory(redact, std::io::stderr)).try_init(),
    };
    // Already initialised (tests calling twice): keep the first.
    let _ = result;
    Ok(())
}

/// A log file shared by every writer the subscriber makes.
struct SharedFile(std::sync::Arc<std::sync::Mutex<std::fs::File>>);

impl std::io::Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush()
    }
}

/// Buffers one formatted event and writes it redacted when dropped (the fmt layer makes one
/// writer per event, so a secret is never split across two writes).
struct RedactingWriter<W: std::io::Write> {
    inner: W,
    buffer: Vec<u8>,
    redact: Redactor,
}

impl<W: std::io::Write> RedactingWriter<W> {
    fn factory(redact: Redactor, make: impl Fn() -> W + Send + Sync + 'static) -> impl for<'a> tracing_subscriber::fmt::MakeWriter<'a> {
        move || RedactingWriter { inner: make(), buffer: Vec::new(), redact: redact.clone() }
    }
}

impl<W: std::io::Write> std::io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<W: std::io::Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let text = (self.redact)(&String::from_utf8_lossy(&self.buffer));
        // A log line that cannot be written is dropped; diagnostics never stop the command.
        let _ = self.inner.write_all(text.as_bytes());
        let _ = self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn log_lines_are_redacted_as_a_whole() {
        let sink = Sink::default();
        let redact: Redactor = Arc::new(|text: &str| text.replace("sk-secret-42", "***"));
        {
            let mut writer = RedactingWriter { inner: sink.clone(), buffer: Vec::new(), redact };
            // The fmt layer may write one event in pieces; a secret split across them is still found.
            writer.write_all(b"provider said: sk-sec").expect("write");
            writer.write_all(b"ret-42 is wrong\n").expect("write");
        }
        assert_eq!(String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8"), "provider said: *** is wrong\n");
    }
}

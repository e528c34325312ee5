//! The command line every Peregrine application gets: parsing, logging, configuration and the
//! dispatch to one module per command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::app::Application;
use crate::commands::{channels, chat, config_cmd, health, init, run, serve, threads};
use crate::config::{Config, LoadOptions};
use crate::output::{ColorChoice, Output, Verbosity, init_tracing};

/// Exit code for usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for other failures.
pub const EXIT_FAILURE: u8 = 1;

#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Options of every command.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// The configuration file (default: $PEREGRINE_CONFIG, $CONFIG_FILE, else ./config.yml;
    /// without one, the embedded defaults: SQLite and the local model).
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Answers and errors only.
    #[arg(long, short = 'q', global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Every node, LLM call and diagnostic.
    #[arg(long, short = 'v', global = true)]
    pub verbose: bool,
    /// When to use colours.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Write diagnostics to this file instead of stderr (also `logging.file`).
    #[arg(long, global = true, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Talk to the agent interactively (streamed answers, approvals at the prompt, slash commands).
    Chat(chat::ChatArgs),
    /// Run one turn for scripts: prints the answer, or one JSON object per event with --json.
    Run(run::RunArgs),
    /// Serve the agent over HTTP: the OpenAI-compatible API (/v1/models, /v1/chat/completions).
    Serve(serve::ServeArgs),
    /// Create a new application project.
    Init(init::InitArgs),
    /// Check the configuration, the providers, the checkpoint store and the local model.
    Health(health::HealthArgs),
    /// Show or validate the configuration (secrets redacted).
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// List, show and delete conversation threads.
    #[command(subcommand)]
    Threads(threads::ThreadsCommand),
    /// Read, write, monitor and inspect control-system channels (through the write gates).
    #[command(subcommand)]
    Channels(channels::ChannelsCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Runs an extension's subcommand from the parsed command line.
pub type ExtensionRunner = Box<dyn FnOnce(&clap::ArgMatches) -> anyhow::Result<()>>;

/// An extra command group a binary adds to the standard ones (the `peregrine` binary's `bench`).
pub struct Extension {
    /// Adds the extra subcommands to the command line.
    pub augment: fn(clap::Command) -> clap::Command,
    /// Whether a subcommand name belongs to the extension.
    pub has: fn(&str) -> bool,
    /// Runs an extra subcommand.
    pub run: ExtensionRunner,
}

/// Parses the command line and runs it; see [`crate::main`].
pub fn main(app: Arc<dyn Application>, extension: Option<Extension>) -> ExitCode {
    let mut command = Cli::command().name(app.name().to_owned()).about(app.about().to_owned());
    if let Some(extension) = &extension {
        // The extension's own doc comment must not replace the application's description.
        command = (extension.augment)(command).about(app.about().to_owned());
    }
    let matches = command.clone().get_matches();
    if let (Some(extension), Some((name, _))) = (extension, matches.subcommand())
        && (extension.has)(name)
    {
        return match (extension.run)(&matches) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                Output::detect(ColorChoice::Auto, Verbosity::Normal).error(&format!("{error:#}"));
                ExitCode::from(EXIT_FAILURE)
            }
        };
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.with_cmd(&command).exit(),
    };
    let verbosity = if cli.global.quiet {
        Verbosity::Quiet
    } else if cli.global.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    };
    let out = Output::detect(cli.global.color, verbosity);
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            out.error(&format!("cannot start the async runtime: {error}"));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(dispatch(cli, app.as_ref(), &out, command)) {
        Ok(code) => code,
        Err(failure) => {
            out.error(&failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// A command's failure: the message and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// What happened and what to do.
    pub message: String,
    /// The exit code.
    pub code: u8,
}

impl Failure {
    /// A usage or configuration error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self { message: message.into(), code: EXIT_USAGE }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self { message: format!("{error:#}"), code: EXIT_FAILURE }
    }
}

async fn dispatch(cli: Cli, app: &dyn Application, out: &Output, mut command: clap::Command) -> Result<ExitCode, Failure> {
    let global = cli.global;
    match cli.command {
        Command::Completions { shell } => {
            let name = command.get_name().to_owned();
            // Generated into memory: clap_complete panics when stdout is closed (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, name, &mut script);
            crate::turn::print_out(&String::from_utf8_lossy(&script));
            return Ok(ExitCode::SUCCESS);
        }
        Command::Init(args) => {
            init_tracing(out.verbosity, None, global.log_file.as_deref(), out.color_stderr, Arc::new(str::to_owned))
                .map_err(Failure::from)?;
            // A bad name, a non-empty directory or a missing checkout is a usage error (exit 2).
            init::run(&args, out).map_err(|error| match error.downcast_ref::<init::InitError>() {
                Some(init::InitError::Io { .. }) | None => Failure::from(error),
                Some(_) => Failure::usage(format!("{error:#}")),
            })?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let config = Config::load(&LoadOptions { explicit: global.config.clone() }).map_err(|error| {
        let failure = Failure::usage(error.to_string());
        if let Command::Run(args) = &cli.command {
            run::report_failure(args, &failure);
        }
        failure
    })?;
    let log_file = global.log_file.clone().or_else(|| config.logging.file.clone());
    let secrets = config.clone();
    let redact: crate::output::Redactor = Arc::new(move |text: &str| secrets.redact(text));
    init_tracing(out.verbosity, config.logging.level.as_deref(), log_file.as_deref(), out.color_stderr, redact)
        .map_err(|error| Failure::usage(format!("{error:#}")))?;
    if !matches!(cli.command, Command::Config(_)) {
        report_config(&config, out);
    }
    match cli.command {
        Command::Chat(args) => chat::run(&args, &config, app, out).await?,
        Command::Run(args) => return run::run(&args, &config, app, out).await,
        Command::Serve(args) => serve::run(&args, &config, app, out).await?,
        Command::Health(args) => {
            if !health::run(&args, &config, app, out).await? {
                return Ok(ExitCode::from(EXIT_FAILURE));
            }
        }
        Command::Config(command) => return config_cmd::run(&command, &config, out),
        Command::Threads(command) => threads::run(&command, &config, out).await?,
        Command::Channels(command) => channels::run(&command, &config, out).await?,
        Command::Completions { .. } | Command::Init(_) => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Says once which file is used and which of its keys are ignored.
fn report_config(config: &Config, out: &Output) {
    if !out.verbose() && config.ignored_keys.is_empty() && config.warnings.is_empty() {
        return;
    }
    match &config.source {
        Some(path) if out.verbose() => out.note(&format!("configuration: {}", path.display())),
        None if out.verbose() => out.note("configuration: the embedded defaults (no config.yml)"),
        _ => {}
    }
    match config.ignored_keys.len() {
        0 => {}
        _ if out.verbose() => out.note(&format!("ignored (Peregrine does not use them): {}", config.ignored_keys.join(", "))),
        count => {
            out.note(&format!("{count} keys of the configuration are not used by Peregrine and ignored (`config validate` lists them)"))
        }
    }
    for warning in &config.warnings {
        out.warn(warning);
    }
}

//! `peregrine init NAME [--template minimal|hello-world-weather]`: a new application project.
//!
//! The project depends on a Peregrine checkout by path and gets the template's sources, an
//! Osprey-style `config.yml`, `.env.example`, `.gitignore` and a README, plus the checkout's
//! `Cargo.lock`, `rust-toolchain.toml` and `rustfmt.toml`, so that it builds offline with the
//! same dependency versions and compiler. The template files live in `crates/peregrine/templates/`; the
//! hello-world-weather template embeds `examples/hello-world-weather` itself, so it cannot drift
//! from the example.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::output::{Output, Style};

/// `init` options.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The project's name (a directory of this name is created; the crate is named after it).
    pub name: String,
    /// The project template.
    #[arg(long, short = 't', value_enum, default_value_t = Template::Minimal)]
    pub template: Template,
    /// Where to create the project directory (default: the working directory).
    #[arg(long, short = 'o')]
    pub output_dir: Option<PathBuf>,
    /// Write into an existing non-empty directory.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// The Peregrine checkout the project depends on (default: $PEREGRINE_SOURCE_DIR, else the
    /// checkout this binary was built from).
    #[arg(long)]
    pub peregrine_path: Option<PathBuf>,
}

/// Project templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Template {
    /// One example capability and context type.
    Minimal,
    /// Osprey's hello_world_weather: `current_weather` on a mock weather service.
    #[value(alias = "hello_world_weather")]
    HelloWorldWeather,
}

impl Template {
    /// The template's name on the command line.
    pub fn id(self) -> &'static str {
        match self {
            Template::Minimal => "minimal",
            Template::HelloWorldWeather => "hello-world-weather",
        }
    }
}

/// The environment variable naming the Peregrine checkout (after `--peregrine-path`).
pub const SOURCE_DIR_ENV: &str = "PEREGRINE_SOURCE_DIR";

/// The checkout this binary was built from (`crates/peregrine/../..`).
const BUILT_FROM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Where the checkout path came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckoutOrigin {
    /// `--peregrine-path`.
    Flag,
    /// `PEREGRINE_SOURCE_DIR`.
    Env,
    /// The checkout this binary was built from.
    BuiltFrom,
}

impl fmt::Display for CheckoutOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckoutOrigin::Flag => "--peregrine-path",
            CheckoutOrigin::Env => SOURCE_DIR_ENV,
            CheckoutOrigin::BuiltFrom => "the checkout this binary was built from",
        })
    }
}

/// Why a project cannot be created; each message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The name cannot be a Cargo package / Rust crate name.
    #[error("`{name}` cannot be the project's crate name: {reason}{}", suggestion.as_ref().map(|s| format!("; try `{s}`")).unwrap_or_default())]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
        /// A usable name close to it.
        suggestion: Option<String>,
    },
    /// The project directory exists and holds files.
    #[error(
        "{} already exists and is not empty; pick another name or --output-dir, or pass --force to write the project's files into it (files of the same name are replaced, others are kept)",
        dir.display()
    )]
    NotEmpty {
        /// The project directory.
        dir: PathBuf,
    },
    /// The project path exists and is a file.
    #[error("{} exists and is not a directory; pick another name or --output-dir", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// No Peregrine checkout where one was expected.
    #[error(
        "no Peregrine checkout at {} ({} not found; the path came from {origin}); pass --peregrine-path <the directory holding Peregrine's Cargo.toml and crates/>",
        path.display(),
        Path::new("crates/peregrine/Cargo.toml").display()
    )]
    CheckoutNotFound {
        /// The path tried.
        path: PathBuf,
        /// Where it came from.
        origin: CheckoutOrigin,
    },
    /// A path Cargo.toml cannot name.
    #[error("the path {} is not valid UTF-8, so Cargo.toml cannot name it; move the Peregrine checkout to a UTF-8 path", path.display())]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
    /// A file-system operation failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done (`write`, `read`, `create the directory`).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InitError {
    let path = path.to_owned();
    move |source| InitError::Io { action, path, source }
}

/// The project's names: its directory, Cargo package and Rust crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectName {
    /// The directory created: NAME as given.
    pub dir: String,
    /// The Cargo package (and binary): NAME in lower case.
    pub package: String,
    /// The library crate as Rust code names it (`-` becomes `_`).
    pub crate_name: String,
}

/// Rust keywords (2024 edition, reserved ones included): not usable as a crate name.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn", "for", "if", "impl",
    "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true",
    "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "gen", "macro", "override", "priv", "try",
    "typeof", "unsized", "virtual", "yield",
];

/// Names Cargo refuses or that shadow the standard library, and Peregrine's own.
const RESERVED: &[&str] = &["test", "std", "core", "alloc", "proc_macro", "deps", "examples", "build", "incremental", "peregrine"];

/// Device names Windows reserves (`con`, `nul`, `com1`, …): no directory can have them.
fn is_windows_device(name: &str) -> bool {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix).is_some_and(|digit| digit.len() == 1 && digit != "0" && digit.chars().all(|c| c.is_ascii_digit()))
    };
    ["con", "prn", "aux", "nul"].contains(&name) || numbered("com") || numbered("lpt")
}

/// The longest package name accepted (crates.io's limit).
const MAX_NAME_CHARS: usize = 64;

impl ProjectName {
    /// Checks NAME and derives the package and crate names from it.
    pub fn parse(name: &str) -> Result<Self, InitError> {
        check_name(name).map_err(|reason| InitError::InvalidName { name: name.to_owned(), reason, suggestion: suggest(name) })?;
        let package = name.to_ascii_lowercase();
        Ok(Self { dir: name.to_owned(), crate_name: package.replace('-', "_"), package })
    }

    /// Refuses names of the project's dependencies and of the checkout's crates: Cargo cannot
    /// tell two packages of the same name apart in one dependency graph.
    fn check_clashes(&self, taken: &[String]) -> Result<(), InitError> {
        match taken.iter().find(|taken| taken.replace('-', "_") == self.crate_name) {
            Some(taken) => Err(InitError::InvalidName {
                name: self.dir.clone(),
                reason: format!("the project depends on a crate named `{taken}`"),
                suggestion: Some(format!("my-{}", self.package)),
            }),
            None => Ok(()),
        }
    }
}

/// What is wrong with `name` as a directory, package and crate name, if anything.
fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("it is empty".into());
    }
    if name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err("it is a path; give a plain name, and the parent directory with --output-dir".into());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(format!("{bad:?} is not allowed (ASCII letters, digits, '-' and '_' only)"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("it must start with a letter".into());
    }
    if name.len() > MAX_NAME_CHARS {
        return Err(format!("it is longer than {MAX_NAME_CHARS} characters"));
    }
    let crate_name = name.to_ascii_lowercase().replace('-', "_");
    if KEYWORDS.contains(&crate_name.as_str()) {
        return Err("it is a Rust keyword".into());
    }
    if RESERVED.contains(&crate_name.as_str()) || is_windows_device(&crate_name) {
        return Err("Cargo, the standard library, Peregrine or Windows already use this name".into());
    }
    Ok(())
}

/// A usable name close to `name`: lower case, runs of other characters as one `-`, and `app-`
/// in front where it would not start with a letter or is reserved.
fn suggest(name: &str) -> Option<String> {
    let mut out = String::new();
    for c in name.trim().chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches(['-', '_']).chars().take(MAX_NAME_CHARS - 4).collect();
    if out.is_empty() {
        return None;
    }
    [out.clone(), format!("app-{out}")].into_iter().find(|candidate| check_name(candidate).is_ok())
}

/// The Peregrine checkout a project depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// The checkout's root (absolute): `Cargo.toml`, `Cargo.lock`, `crates/`.
    pub root: PathBuf,
    /// Where the path came from.
    pub origin: CheckoutOrigin,
}

/// Finds the checkout: `--peregrine-path`, else `PEREGRINE_SOURCE_DIR` (`env_value`, ignored
/// when empty), else `built_from`; it must hold `crates/peregrine/Cargo.toml`.
pub fn resolve_checkout(flag: Option<&Path>, env_value: Option<OsString>, built_from: &Path) -> Result<Checkout, InitError> {
    let (path, origin) = match (flag, env_value.filter(|value| !value.is_empty())) {
        (Some(path), _) => (path.to_owned(), CheckoutOrigin::Flag),
        (None, Some(value)) => (PathBuf::from(value), CheckoutOrigin::Env),
        (None, None) => (built_from.to_owned(), CheckoutOrigin::BuiltFrom),
    };
    let not_found = || InitError::CheckoutNotFound { path: path.clone(), origin };
    let root = std::fs::canonicalize(&path).map_err(|_| not_found())?;
    if !root.join("crates/peregrine/Cargo.toml").is_file() {
        return Err(not_found());
    }
    Ok(Checkout { root, origin })
}

/// What to create.
#[derive(Debug, Clone)]
pub struct Request {
    /// The project's names.
    pub name: ProjectName,
    /// The template.
    pub template: Template,
    /// The directory the project directory is created in.
    pub parent: PathBuf,
    /// Write into an existing non-empty directory, replacing files of the same name.
    pub force: bool,
    /// The Peregrine checkout (absolute; see [`resolve_checkout`]).
    pub checkout: PathBuf,
}

/// A created project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The project directory.
    pub dir: PathBuf,
    /// The files written, relative to `dir`, in order.
    pub files: Vec<String>,
    /// The files of `files` that existed before and were replaced (only with `--force`).
    pub replaced: Vec<String>,
    /// Whether the checkout's `Cargo.lock` was copied.
    pub lock_copied: bool,
}

/// One file of a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectFile {
    /// The path relative to the project directory, `/`-separated.
    pub path: String,
    /// The contents.
    pub contents: Vec<u8>,
}

impl ProjectFile {
    fn text(path: &str, contents: impl Into<String>) -> Self {
        Self { path: path.to_owned(), contents: contents.into().into_bytes() }
    }
}

/// Creates the project: checks the name against its dependencies, renders every file, then
/// writes them (nothing is written when a check fails).
pub fn generate(request: &Request) -> Result<Generated, InitError> {
    request.name.check_clashes(&taken_names(request.template, &request.checkout))?;
    let files = render(request.template, &request.name, &request.checkout)?;
    let dir = request.parent.join(&request.name.dir);
    prepare_dir(&dir, request.force)?;
    let mut generated = Generated { dir: dir.clone(), files: Vec::new(), replaced: Vec::new(), lock_copied: false };
    for file in files {
        let path = dir.join(&file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error("create the directory", parent))?;
        }
        if path.exists() {
            generated.replaced.push(file.path.clone());
        }
        std::fs::write(&path, &file.contents).map_err(io_error("write", &path))?;
        generated.lock_copied |= file.path == "Cargo.lock";
        generated.files.push(file.path);
    }
    Ok(generated)
}

/// Creates `dir`, or accepts it when it is empty (or with `force`).
fn prepare_dir(dir: &Path, force: bool) -> Result<(), InitError> {
    match std::fs::metadata(dir) {
        Ok(metadata) if !metadata.is_dir() => Err(InitError::NotADirectory { path: dir.to_owned() }),
        Ok(_) => {
            let mut entries = std::fs::read_dir(dir).map_err(io_error("read the directory", dir))?;
            if !force && entries.next().is_some() {
                return Err(InitError::NotEmpty { dir: dir.to_owned() });
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io_error("create the directory", dir))
        }
        Err(error) => Err(io_error("read", dir)(error)),
    }
}

/// The framework crates a template's sources use directly (each a path dependency).
fn framework_dependencies(template: Template) -> &'static [&'static str] {
    match template {
        Template::Minimal => &["peregrine"],
        Template::HelloWorldWeather => &["peregrine", "peregrine-core", "peregrine-agent", "peregrine-llm"],
    }
}

/// The registry dependencies of a template's sources and of its tests; their versions and
/// features are the Peregrine workspace's.
fn registry_dependencies(template: Template) -> (&'static [&'static str], &'static [&'static str]) {
    match template {
        Template::Minimal => (&["serde", "serde_json"], &["tokio"]),
        Template::HelloWorldWeather => (&["serde", "serde_json", "schemars", "chrono", "chrono-tz", "thiserror"], &["tokio"]),
    }
}

/// Names the project may not take: its dependencies and every crate of the checkout.
fn taken_names(template: Template, checkout: &Path) -> Vec<String> {
    let (dependencies, dev_dependencies) = registry_dependencies(template);
    let mut taken: Vec<String> =
        framework_dependencies(template).iter().chain(dependencies).chain(dev_dependencies).map(|name| (*name).to_owned()).collect();
    if let Ok(entries) = std::fs::read_dir(checkout.join("crates")) {
        taken.extend(
            entries
                .flatten()
                .filter(|entry| entry.path().join("Cargo.toml").is_file())
                .filter_map(|entry| entry.file_name().into_string().ok()),
        );
    }
    taken
}

/// The Peregrine workspace manifest this binary was built with: the fallback for dependency
/// specs a checkout's manifest lacks.
const EMBEDDED_WORKSPACE_MANIFEST: &str = include_str!("../../../../Cargo.toml");

/// The `[workspace.dependencies]` of a workspace manifest: name → the value as written
/// (`"1"`, `{ version = "1", features = ["derive"] }`); values may span lines.
fn workspace_dependencies(manifest: &str) -> BTreeMap<String, String> {
    let mut specs = BTreeMap::new();
    let mut in_section = false;
    let mut pending: Option<(String, String)> = None;
    for line in manifest.lines() {
        if let Some((name, mut value)) = pending.take() {
            value.push(' ');
            value.push_str(line.trim());
            if bracket_depth(&value) > 0 {
                pending = Some((name, value));
            } else {
                specs.insert(name, value);
            }
            continue;
        }
        let trimmed = line.trim();
        if trimmed.starts_with('[') && !trimmed.starts_with("[[") {
            in_section = trimmed == "[workspace.dependencies]";
            continue;
        }
        if !in_section || trimmed.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = trimmed.split_once('=') {
            let (name, value) = (name.trim().trim_matches('"').to_owned(), value.trim().to_owned());
            if bracket_depth(&value) > 0 {
                pending = Some((name, value));
            } else {
                specs.insert(name, value);
            }
        }
    }
    specs
}

/// Open `{`/`[` minus closed ones, outside strings.
fn bracket_depth(value: &str) -> i32 {
    let (mut depth, mut quote) = (0, None);
    for c in value.chars() {
        match (quote, c) {
            (Some(open), c) if c == open => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth -= 1,
            (None, _) => {}
        }
    }
    depth
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::from('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn utf8_path(path: &Path) -> Result<&str, InitError> {
    path.to_str().ok_or_else(|| InitError::NonUtf8Path { path: path.to_owned() })
}

/// The dependency lines of the project's `Cargo.toml` (`[dependencies]`, `[dev-dependencies]`).
fn dependency_lines(template: Template, checkout: &Path) -> Result<(String, String), InitError> {
    let checkout_manifest = std::fs::read_to_string(checkout.join("Cargo.toml")).unwrap_or_default();
    let (from_checkout, embedded) = (workspace_dependencies(&checkout_manifest), workspace_dependencies(EMBEDDED_WORKSPACE_MANIFEST));
    let registry_line = |name: &str| {
        let spec = from_checkout.get(name).or_else(|| embedded.get(name)).map_or("\"*\"", String::as_str);
        format!("{name} = {spec}\n")
    };
    let mut dependencies = String::new();
    for name in framework_dependencies(template).iter().filter(|name| **name != "peregrine") {
        let path = checkout.join("crates").join(name);
        dependencies.push_str(&format!("{name} = {{ path = {} }}\n", toml_string(utf8_path(&path)?)));
    }
    let (registry, dev) = registry_dependencies(template);
    dependencies.extend(registry.iter().map(|name| registry_line(name)));
    Ok((dependencies, dev.iter().map(|name| registry_line(name)).collect()))
}

/// Replaces every `{{key}}` of `template`.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    values.iter().fold(template.to_owned(), |text, (key, value)| text.replace(&format!("{{{{{key}}}}}"), value))
}

const COMMON_CARGO_TOML: &str = include_str!("../../templates/common/Cargo.toml");
const COMMON_CONFIG: &str = include_str!("../../templates/common/config.yml");
const COMMON_ENV_EXAMPLE: &str = include_str!("../../templates/common/env.example");
const COMMON_GITIGNORE: &str = include_str!("../../templates/common/gitignore");
const COMMON_README: &str = include_str!("../../templates/common/README.md");

/// The minimal template's sources (placeholders `{{package}}`, `{{crate}}`).
const MINIMAL_SOURCES: [(&str, &str); 5] = [
    ("src/main.rs", include_str!("../../templates/minimal/src/main.rs")),
    ("src/lib.rs", include_str!("../../templates/minimal/src/lib.rs")),
    ("src/app.rs", include_str!("../../templates/minimal/src/app.rs")),
    ("src/hello.rs", include_str!("../../templates/minimal/src/hello.rs")),
    ("src/context.rs", include_str!("../../templates/minimal/src/context.rs")),
];
const MINIMAL_LAYOUT: &str = include_str!("../../templates/minimal/README-layout.md");

/// The weather example's sources, as they are in `examples/hello-world-weather`.
const WEATHER_SOURCES: [(&str, &str); 10] = [
    ("src/main.rs", include_str!("../../../../examples/hello-world-weather/src/main.rs")),
    ("src/lib.rs", include_str!("../../../../examples/hello-world-weather/src/lib.rs")),
    ("src/app.rs", include_str!("../../../../examples/hello-world-weather/src/app.rs")),
    ("src/capability.rs", include_str!("../../../../examples/hello-world-weather/src/capability.rs")),
    ("src/capability/tests.rs", include_str!("../../../../examples/hello-world-weather/src/capability/tests.rs")),
    ("src/context.rs", include_str!("../../../../examples/hello-world-weather/src/context.rs")),
    ("src/guides.rs", include_str!("../../../../examples/hello-world-weather/src/guides.rs")),
    ("src/mock_service.rs", include_str!("../../../../examples/hello-world-weather/src/mock_service.rs")),
    ("src/prompts.rs", include_str!("../../../../examples/hello-world-weather/src/prompts.rs")),
    ("src/bench_support.rs", include_str!("../../../../examples/hello-world-weather/src/bench_support.rs")),
];
const WEATHER_LAYOUT: &str = include_str!("../../templates/hello-world-weather/README-layout.md");

/// The example's crate and application names, replaced by the project's.
const WEATHER_CRATE: &str = "hello_world_weather";
const WEATHER_APP_NAME: &str = "\"hello-world-weather\"";

/// The weather example's sources for a project: the crate and application names replaced, and
/// `bench_support` (stand-in capabilities for the `bench` command) left out unless the library
/// still needs it.
fn weather_sources(name: &ProjectName) -> Vec<ProjectFile> {
    let is_bench_line = |line: &str| {
        let line = line.trim();
        line == "pub mod bench_support;" || line.starts_with("pub use bench_support::")
    };
    let mut files = Vec::new();
    let mut keep_bench_support = true;
    for (path, text) in WEATHER_SOURCES {
        let mut text = text.replace(&format!("{WEATHER_CRATE}::"), &format!("{}::", name.crate_name));
        match path {
            "src/lib.rs" => {
                text = text.replace(" and, for benchmarks, stand-in\n//! capabilities of other domains.", ".");
                text = text.lines().filter(|line| !is_bench_line(line)).map(|line| format!("{line}\n")).collect();
                keep_bench_support = text.contains("bench_support");
            }
            "src/app.rs" => text = text.replace(WEATHER_APP_NAME, &format!("\"{}\"", name.package)),
            "src/bench_support.rs" if !keep_bench_support => continue,
            _ => {}
        }
        files.push(ProjectFile::text(path, text));
    }
    files
}

/// Files copied from the checkout's root when it has them.
const COPIED_FROM_CHECKOUT: [&str; 3] = ["Cargo.lock", "rust-toolchain.toml", "rustfmt.toml"];

/// Every file of the project, in memory.
pub fn render(template: Template, name: &ProjectName, checkout: &Path) -> Result<Vec<ProjectFile>, InitError> {
    let peregrine_path = checkout.join("crates").join("peregrine");
    let (dependencies, dev_dependencies) = dependency_lines(template, checkout)?;
    let (layout, example_request, test_example) = match template {
        Template::Minimal => (MINIMAL_LAYOUT, "Hello!", "`src/hello.rs`"),
        Template::HelloWorldWeather => (WEATHER_LAYOUT, "What's the weather in Prague?", "`src/capability/tests.rs`"),
    };
    let peregrine_path_toml = toml_string(utf8_path(&peregrine_path)?);
    let values = [
        ("package", name.package.as_str()),
        ("crate", name.crate_name.as_str()),
        ("template", template.id()),
        ("peregrine_path", peregrine_path_toml.as_str()),
        ("peregrine_dir", utf8_path(checkout)?),
        ("dependencies", dependencies.as_str()),
        ("dev_dependencies", dev_dependencies.as_str()),
        ("layout", layout),
        ("example_request", example_request),
        ("test_example", test_example),
    ];
    let mut files = vec![
        ProjectFile::text("Cargo.toml", fill(COMMON_CARGO_TOML, &values)),
        ProjectFile::text("config.yml", fill(COMMON_CONFIG, &values)),
        ProjectFile::text(".env.example", COMMON_ENV_EXAMPLE),
        ProjectFile::text(".gitignore", COMMON_GITIGNORE),
        ProjectFile::text("README.md", fill(COMMON_README, &values)),
    ];
    match template {
        Template::Minimal => files.extend(MINIMAL_SOURCES.iter().map(|(path, text)| ProjectFile::text(path, fill(text, &values)))),
        Template::HelloWorldWeather => files.extend(weather_sources(name)),
    }
    // The checkout's lock file, toolchain and formatting: the same dependency versions (Cargo
    // drops the entries the project does not use) and the same compiler, so an offline build
    // works; `cargo fmt` keeps the template's layout.
    for copied in COPIED_FROM_CHECKOUT {
        let source = checkout.join(copied);
        match std::fs::read(&source) {
            Ok(contents) => files.push(ProjectFile { path: copied.to_owned(), contents }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error("read", &source)(error)),
        }
    }
    Ok(files)
}

/// Creates the project.
pub fn run(args: &InitArgs, out: &Output) -> anyhow::Result<()> {
    let name = ProjectName::parse(&args.name)?;
    let checkout = resolve_checkout(args.peregrine_path.as_deref(), std::env::var_os(SOURCE_DIR_ENV), Path::new(BUILT_FROM))?;
    let parent = match &args.output_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().map_err(io_error("read the working directory", Path::new(".")))?,
    };
    let request = Request { name, template: args.template, parent, force: args.force, checkout: checkout.root };
    let project = generate(&request)?;
    report(&request, &project, args.output_dir.as_deref(), out);
    Ok(())
}

/// Prints the files written and the next steps (stdout), and notes (stderr).
fn report(request: &Request, project: &Generated, output_dir: Option<&Path>, out: &Output) {
    let color = out.color_stdout;
    let name = &request.name;
    if name.package != name.dir {
        out.note(&format!("package name: {} (from {})", name.package, name.dir));
    }
    out.note(&format!("depends on the Peregrine checkout at {}", request.checkout.display()));
    if !project.lock_copied {
        out.warn("the checkout has no Cargo.lock: the first build resolves dependency versions and needs the network");
    }
    if !project.replaced.is_empty() {
        out.warn(&format!("replaced existing files: {}", project.replaced.join(", ")));
    }
    println!(
        "{} {} {} in {}",
        Style::Success.paint("created", color),
        Style::Bold.paint(&name.package, color),
        Style::Dim.paint(&format!("(template {})", request.template.id()), color),
        project.dir.display()
    );
    for file in &project.files {
        println!("  {}", Style::Accent.paint(file, color));
    }
    let cd = output_dir.map_or_else(|| PathBuf::from(&name.dir), |dir| dir.join(&name.dir));
    let example = match request.template {
        Template::Minimal => "Hello!",
        Template::HelloWorldWeather => "What's the weather in Prague?",
    };
    println!("\n{}", Style::Bold.paint("next steps:", color));
    for (command, comment) in [
        (format!("cd {}", cd.display()), ""),
        ("cp .env.example .env".to_owned(), "# set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server"),
        ("cargo run -- config validate".to_owned(), ""),
        ("cargo run -- chat".to_owned(), ""),
        (format!("cargo run -- run \"{example}\""), ""),
    ] {
        match comment {
            "" => println!("  {}", Style::Accent.paint(&command, color)),
            comment => println!("  {}   {}", Style::Accent.paint(&command, color), Style::Dim.paint(comment, color)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// The checkout these tests run in.
    fn checkout() -> PathBuf {
        resolve_checkout(None, None, Path::new(BUILT_FROM)).expect("the tests run in a Peregrine checkout").root
    }

    fn request(parent: &Path, name: &str, template: Template) -> Request {
        Request {
            name: ProjectName::parse(name).expect("valid name"),
            template,
            parent: parent.to_owned(),
            force: false,
            checkout: checkout(),
        }
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap_or_else(|error| panic!("{file}: {error}"))
    }

    #[test]
    fn names_become_package_and_crate_names() {
        for (name, package, crate_name) in [
            ("my-agent", "my-agent", "my_agent"),
            ("MyAgent", "myagent", "myagent"),
            ("beam_finder2", "beam_finder2", "beam_finder2"),
            ("hello-world-weather", "hello-world-weather", "hello_world_weather"),
        ] {
            let parsed = ProjectName::parse(name).expect(name);
            assert_eq!((parsed.dir.as_str(), parsed.package.as_str(), parsed.crate_name.as_str()), (name, package, crate_name));
        }
    }

    #[test]
    fn names_that_cannot_be_crates_are_refused_with_a_reason_and_a_suggestion() {
        for (name, reason, suggestion) in [
            ("", "it is empty", None),
            ("my agent", "' ' is not allowed", Some("my-agent")),
            ("My Agent!", "' ' is not allowed", Some("my-agent")),
            ("agent.v2", "'.' is not allowed", Some("agent-v2")),
            ("ünïcode", "'ü' is not allowed", Some("n-code")),
            ("2fast", "must start with a letter", Some("app-2fast")),
            ("-agent", "must start with a letter", Some("agent")),
            ("apps/agent", "it is a path", Some("apps-agent")),
            ("..", "it is a path", None),
            ("fn", "a Rust keyword", Some("app-fn")),
            ("async", "a Rust keyword", Some("app-async")),
            ("test", "already use this name", Some("app-test")),
            ("Core", "already use this name", Some("app-core")),
            ("proc-macro", "already use this name", Some("app-proc-macro")),
            ("peregrine", "already use this name", Some("app-peregrine")),
            ("NUL", "already use this name", Some("app-nul")),
            ("com7", "already use this name", Some("app-com7")),
            (&"a".repeat(65), "longer than 64", Some(&*"a".repeat(60))),
        ] {
            let Err(InitError::InvalidName { reason: got, suggestion: suggested, .. }) = ProjectName::parse(name) else {
                panic!("{name:?} must be refused");
            };
            assert!(got.contains(reason), "{name:?}: {got}");
            assert_eq!(suggested.as_deref(), suggestion, "{name:?}");
        }
        let message = ProjectName::parse("my agent").expect_err("refused").to_string();
        assert_eq!(
            message,
            "`my agent` cannot be the project's crate name: ' ' is not allowed (ASCII letters, digits, '-' and '_' only); try `my-agent`"
        );
    }

    #[test]
    fn names_of_dependencies_and_framework_crates_are_refused() {
        let parent = tempfile::tempdir().expect("temp dir");
        for (name, template, clash) in [
            ("serde_json", Template::Minimal, "serde_json"),
            ("serde-json", Template::Minimal, "serde_json"),
            ("chrono-tz", Template::HelloWorldWeather, "chrono-tz"),
            ("peregrine_core", Template::Minimal, "peregrine-core"),
            ("peregrine-graph", Template::HelloWorldWeather, "peregrine-graph"),
        ] {
            let error = generate(&request(parent.path(), name, template)).expect_err(name);
            assert!(error.to_string().contains(&format!("depends on a crate named `{clash}`")), "{name}: {error}");
        }
        assert_eq!(std::fs::read_dir(parent.path()).expect("readable").count(), 0, "nothing is written for a refused name");
    }

    #[test]
    fn the_checkout_comes_from_the_flag_then_the_environment_then_the_build() {
        let real = checkout();
        let elsewhere = tempfile::tempdir().expect("temp dir");
        let missing = elsewhere.path().join("missing");

        let from_flag = resolve_checkout(Some(&real), Some(missing.clone().into()), &missing).expect("flag");
        assert_eq!((from_flag.root, from_flag.origin), (real.clone(), CheckoutOrigin::Flag));
        let from_env = resolve_checkout(None, Some(real.clone().into()), &missing).expect("env");
        assert_eq!(from_env.origin, CheckoutOrigin::Env);
        let from_build = resolve_checkout(None, Some(OsString::new()), &real).expect("an empty variable counts as unset");
        assert_eq!(from_build.origin, CheckoutOrigin::BuiltFrom);

        for (flag, env, origin) in [
            (Some(elsewhere.path()), None, "--peregrine-path"),
            (None, Some(elsewhere.path().into()), "PEREGRINE_SOURCE_DIR"),
            (None, None, "the checkout this binary was built from"),
        ] {
            let built_from = if flag.is_none() && env.is_none() { missing.as_path() } else { real.as_path() };
            let error = resolve_checkout(flag, env, built_from).expect_err("no checkout there");
            assert!(matches!(error, InitError::CheckoutNotFound { .. }), "{error:?}");
            let message = error.to_string();
            assert!(message.contains(&format!("the path came from {origin}")), "{message}");
            assert!(message.contains("crates/peregrine/Cargo.toml not found") && message.contains("pass --peregrine-path"), "{message}");
        }
    }

    #[test]
    fn a_non_empty_directory_is_refused_without_force() {
        let parent = tempfile::tempdir().expect("temp dir");
        let dir = parent.path().join("agent");
        std::fs::create_dir(&dir).expect("created");
        std::fs::write(dir.join("notes.txt"), "mine").expect("written");
        std::fs::write(dir.join("README.md"), "my readme").expect("written");

        let error = generate(&request(parent.path(), "agent", Template::Minimal)).expect_err("not empty");
        assert!(matches!(error, InitError::NotEmpty { .. }), "{error:?}");
        assert!(error.to_string().contains("pass --force"), "{error}");
        assert_eq!(read(&dir, "README.md"), "my readme", "nothing is replaced");
        assert!(!dir.join("Cargo.toml").exists(), "nothing is written");

        let forced = generate(&Request { force: true, ..request(parent.path(), "agent", Template::Minimal) }).expect("forced");
        assert_eq!(forced.replaced, ["README.md"]);
        assert_eq!(read(&dir, "notes.txt"), "mine", "other files are kept");
        assert!(read(&dir, "README.md").starts_with("# agent\n"));
    }

    #[test]
    fn an_empty_directory_is_used_and_a_file_is_refused() {
        let parent = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(parent.path().join("empty")).expect("created");
        let generated = generate(&request(parent.path(), "empty", Template::Minimal)).expect("an empty directory is fine");
        assert!(generated.replaced.is_empty());
        std::fs::write(parent.path().join("taken"), "a file").expect("written");
        let error = generate(&request(parent.path(), "taken", Template::Minimal)).expect_err("a file");
        assert!(matches!(error, InitError::NotADirectory { .. }), "{error:?}");
    }

    #[test]
    fn each_template_writes_its_files() {
        let parent = tempfile::tempdir().expect("temp dir");
        let common = ["Cargo.toml", "config.yml", ".env.example", ".gitignore", "README.md"];
        let copied = ["Cargo.lock", "rust-toolchain.toml", "rustfmt.toml"];
        let minimal = generate(&request(parent.path(), "My-Agent", Template::Minimal)).expect("minimal");
        let sources = ["src/main.rs", "src/lib.rs", "src/app.rs", "src/hello.rs", "src/context.rs"];
        assert_eq!(minimal.files, [&common[..], &sources, &copied].concat());
        assert!(minimal.lock_copied && minimal.replaced.is_empty());
        assert_eq!(minimal.dir, parent.path().join("My-Agent"));

        let weather = generate(&request(parent.path(), "wx", Template::HelloWorldWeather)).expect("weather");
        let sources = [
            "src/main.rs",
            "src/lib.rs",
            "src/app.rs",
            "src/capability.rs",
            "src/capability/tests.rs",
            "src/context.rs",
            "src/guides.rs",
            "src/mock_service.rs",
            "src/prompts.rs",
        ];
        assert_eq!(weather.files, [&common[..], &sources, &copied].concat(), "bench_support is left out");
        for file in &weather.files {
            assert!(weather.dir.join(file).is_file(), "{file}");
        }
    }

    #[test]
    fn the_files_name_the_project_and_the_checkout() {
        let parent = tempfile::tempdir().expect("temp dir");
        let checkout = checkout();
        let minimal = generate(&request(parent.path(), "My-Agent", Template::Minimal)).expect("minimal");
        let manifest = read(&minimal.dir, "Cargo.toml");
        assert!(manifest.contains("name = \"my-agent\"\n"), "{manifest}");
        assert!(manifest.contains("\n[workspace]\n"), "{manifest}");
        let peregrine = toml_string(checkout.join("crates/peregrine").to_str().expect("utf-8"));
        assert!(manifest.contains(&format!("peregrine = {{ path = {peregrine} }}\n")), "{manifest}");
        assert!(manifest.contains("serde = { version = \"1\", features = [\"derive\"] }\n"), "{manifest}");
        assert!(manifest.contains("[features]\n") && manifest.contains("local = [\"peregrine/local\"]"), "{manifest}");
        assert!(read(&minimal.dir, "src/main.rs").contains("peregrine::main(my_agent::App)"));
        assert!(read(&minimal.dir, "src/app.rs").contains("pub const APP_NAME: &str = \"my-agent\";"));
        assert_eq!(read(&minimal.dir, ".gitignore"), "/target\n_agent_data/\n.env\n");
        let config = read(&minimal.dir, "config.yml");
        for key in [
            "${OPENAI_API_KEY}",
            "${OPENAI_BASE_URL:-https://api.openai.com/v1}",
            "approval:",
            "execution_control:",
            "timezone:",
            "file_paths:",
            "type: sqlite",
        ] {
            assert!(config.contains(key), "config.yml lacks {key}");
        }
        let readme = read(&minimal.dir, "README.md");
        assert!(
            readme.contains("cargo run -- chat")
                && readme.contains("cargo run -- run \"Hello!\"")
                && readme.contains("## Adding a capability")
        );
        assert_eq!(
            std::fs::read(minimal.dir.join("Cargo.lock")).expect("copied"),
            std::fs::read(checkout.join("Cargo.lock")).expect("lock")
        );

        let weather = generate(&request(parent.path(), "wx", Template::HelloWorldWeather)).expect("weather");
        assert!(read(&weather.dir, "src/main.rs").contains("peregrine::main(wx::WeatherApp)"));
        assert!(read(&weather.dir, "src/app.rs").contains("\"wx\""), "the application is named after the project");
        assert!(!read(&weather.dir, "src/lib.rs").contains("bench_support"));
        assert!(read(&weather.dir, "Cargo.toml").contains("peregrine-core = { path = "));
        for dir in [&minimal.dir, &weather.dir] {
            for file in walk(dir) {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                assert!(unfilled_placeholder(&text).is_none(), "{}: {:?}", file.display(), unfilled_placeholder(&text));
                assert!(!text.contains("hello_world_weather::"), "{}", file.display());
            }
        }
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).expect("readable").flatten() {
            let path = entry.path();
            if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
        }
        files
    }

    /// A `{{word}}` left in a rendered file.
    fn unfilled_placeholder(text: &str) -> Option<&str> {
        text.match_indices("{{").find_map(|(start, _)| {
            let rest = &text[start + 2..];
            let end = rest.find("}}")?;
            let word = &rest[..end];
            (!word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then_some(word)
        })
    }

    #[test]
    fn a_checkout_without_a_lock_file_still_gets_a_project() {
        let fake = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(fake.path().join("crates/peregrine")).expect("created");
        std::fs::write(fake.path().join("crates/peregrine/Cargo.toml"), "[package]\nname = \"peregrine\"\n").expect("written");
        let root = resolve_checkout(Some(fake.path()), None, Path::new(BUILT_FROM)).expect("a checkout").root;
        let parent = tempfile::tempdir().expect("temp dir");
        let generated = generate(&Request { checkout: root, ..request(parent.path(), "agent", Template::Minimal) }).expect("generated");
        assert!(!generated.lock_copied && !generated.files.contains(&"Cargo.lock".to_owned()));
        // Without the checkout's manifest, versions come from the one this binary was built with.
        assert!(read(&generated.dir, "Cargo.toml").contains("serde_json = { version = \"1\""));
    }

    #[test]
    fn workspace_dependency_specs_are_read_as_written() {
        let manifest = "[workspace]\nmembers = [\"a\"]\n\n[workspace.dependencies]\n# comment\nserde = { version = \"1\", features = [\"derive\"] }\nanyhow = \"1\"\ntokio = { version = \"1\", features = [\n    \"macros\",\n    \"rt\",\n] }\n\"quoted\" = \"2\"\n\n[profile.release]\ndebug = 1\n";
        let specs = workspace_dependencies(manifest);
        assert_eq!(specs.keys().collect::<Vec<_>>(), ["anyhow", "quoted", "serde", "tokio"]);
        assert_eq!(specs["serde"], "{ version = \"1\", features = [\"derive\"] }");
        assert_eq!(specs["tokio"], "{ version = \"1\", features = [ \"macros\", \"rt\", ] }");
        // Every dependency a template needs has its spec in the workspace manifest.
        let embedded = workspace_dependencies(EMBEDDED_WORKSPACE_MANIFEST);
        for template in [Template::Minimal, Template::HelloWorldWeather] {
            let (dependencies, dev_dependencies) = registry_dependencies(template);
            for name in dependencies.iter().chain(dev_dependencies) {
                assert!(embedded.contains_key(*name), "{name} is not in [workspace.dependencies]");
            }
        }
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string("/a b/c"), "\"/a b/c\"");
        assert_eq!(toml_string("C:\\src\\\"x\""), "\"C:\\\\src\\\\\\\"x\\\"\"");
    }

    /// Generates both templates and builds, tests and runs them against this checkout, offline.
    /// The shared target directory keeps the dependencies between runs: the first run compiles
    /// them all (minutes), later ones only the two projects.
    #[test]
    fn generated_projects_build() {
        let checkout = checkout();
        let target_dir = checkout.join("target/init-projects");
        let parent = tempfile::tempdir().expect("temp dir");
        for (template, package) in [(Template::Minimal, "init-test-minimal"), (Template::HelloWorldWeather, "init-test-weather")] {
            let project = generate(&request(parent.path(), package, template)).expect("generated");
            prune_earlier_builds(&target_dir, &package.replace('-', "_"));
            cargo(&project.dir, &target_dir, &["build", "--offline", "--quiet"]);
            cargo(&project.dir, &target_dir, &["test", "--offline", "--quiet"]);
            let binary = target_dir.join("debug").join(format!("{package}{}", std::env::consts::EXE_SUFFIX));

            let help = app(&binary, &project.dir, &["--help"]);
            assert!(help.contains(&format!("Usage: {package} [OPTIONS] <COMMAND>")), "{help}");
            assert!(["chat", "run", "init", "health", "config", "threads"].iter().all(|command| help.contains(command)), "{help}");

            let validate = app(&binary, &project.dir, &["config", "validate"]);
            assert!(validate.starts_with("valid: ") && validate.contains("config.yml"), "the project's config.yml is read: {validate}");
            assert!(
                !validate.contains("ignored keys") && !validate.contains("warning"),
                "every key is used, nothing to warn about: {validate}"
            );

            if template == Template::HelloWorldWeather {
                assert_eq!(app(&binary, &project.dir, &["threads", "list", "--json"]).trim(), "[]");
                assert!(project.dir.join("_agent_data/checkpoints/peregrine.db").is_file(), "the configured SQLite store");
            }
        }
    }

    /// Runs cargo in `project` on the shared target directory; fails the test with cargo's output.
    fn cargo(project: &Path, target_dir: &Path, args: &[&str]) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(cargo)
            .args(args)
            .current_dir(project)
            .env("CARGO_TARGET_DIR", target_dir)
            // Small binaries and no incremental state: these builds are checked, not debugged.
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .env("CARGO_INCREMENTAL", "0")
            .output()
            .expect("cargo starts");
        assert!(
            output.status.success(),
            "cargo {} in {} failed:\n{}{}",
            args.join(" "),
            project.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Runs the built application in `project` without outside configuration; its stdout.
    fn app(binary: &Path, project: &Path, args: &[&str]) -> String {
        let output = Command::new(binary)
            .args(args)
            .current_dir(project)
            .env("NO_COLOR", "1")
            .env("OPENAI_API_KEY", "sk-test-never-sent")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_MODEL")
            .env_remove("PEREGRINE_CONFIG")
            .env_remove("CONFIG_FILE")
            .env_remove("PEREGRINE_LOG")
            .output()
            .expect("the application starts");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{} {args:?} failed:\n{stdout}{}", binary.display(), String::from_utf8_lossy(&output.stderr));
        stdout
    }

    /// Each run's projects live in a new temp dir, so their artifacts get new hashes: removes
    /// what earlier runs left for `crate_name` in the shared target directory.
    fn prune_earlier_builds(target_dir: &Path, crate_name: &str) {
        for sub in ["debug/deps", "debug/.fingerprint", "debug/incremental", "debug/build"] {
            let Ok(entries) = std::fs::read_dir(target_dir.join(sub)) else { continue };
            for entry in entries.flatten() {
                let file_name = entry.file_name().to_string_lossy().replace('-', "_");
                if file_name.strip_prefix("lib").unwrap_or(&file_name).starts_with(&format!("{crate_name}_")) {
                    let path = entry.path();
                    let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                }
            }
        }
    }
}

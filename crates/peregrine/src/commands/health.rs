//! `peregrine health`: the configuration, every provider a role uses (a 1-token completion
//! unless `--basic`), the checkpoint store, the agent data directory and the application's
//! assembly, as a table with one row per check; a failed check makes the command exit 1.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peregrine_checkpoint::MemoryCheckpointer;
use peregrine_graph::{CheckpointSource, DynCheckpointer, NewCheckpoint};
use peregrine_llm::{ChatMessage, ChatRequest, DynLlmProvider, LlmError, LlmErrorKind, ProviderConfig, build_provider, default_protocol};

use crate::app::Application;
use crate::config::{CheckpointerConfig, Config};
use crate::output::{Output, Style};
use crate::runtime::{open_store, reader_agent};

/// `health` options.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Skip the 1-token completion per provider (configuration and files only).
    #[arg(long, short = 'b')]
    pub basic: bool,
}

/// How long a remote provider has to answer the 1-token completion.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the embedded model has, once loaded, to produce its token.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long opening the checkpoint store (a PostgreSQL connection) and its probe may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(15);
/// The thread written and deleted to prove the store is writable.
const PROBE_THREAD: &str = "__health_probe__";

/// Runs the checks; `Ok(false)` when one failed.
pub async fn run(args: &HealthArgs, config: &Config, app: &dyn Application, out: &Output) -> anyhow::Result<bool> {
    let checks = checks(args, config, app).await;
    let count = |status: Status| checks.iter().filter(|check| check.status == status).count();
    let (failed, warned, skipped) = (count(Status::Fail), count(Status::Warn), count(Status::Skipped));
    let mut summary = if failed > 0 { format!("{failed} of {} checks failed", checks.len()) } else { "all checks passed".to_owned() };
    if warned > 0 {
        summary.push_str(&format!(", {warned} with a warning"));
    }
    if skipped > 0 {
        summary.push_str(&format!(", {skipped} skipped"));
    }
    let style = match (failed, warned) {
        (0, 0) => Style::Success,
        (0, _) => Style::Warning,
        _ => Style::Error,
    };
    let mut text = render(&checks, out.color_stdout);
    text.push_str("\n\n");
    text.push_str(&style.paint(&summary, out.color_stdout));
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")?;
    stdout.flush()?;
    Ok(failed == 0)
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
    Skipped,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skipped => "skipped",
        }
    }

    fn style(self) -> Style {
        match self {
            Status::Ok => Style::Success,
            Status::Warn => Style::Warning,
            Status::Fail => Style::Error,
            Status::Skipped => Style::Dim,
        }
    }
}

/// One row of the table; `detail` may have more lines (shown under the first).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    name: String,
    status: Status,
    detail: String,
}

impl Check {
    fn new(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Self {
        Self { name: name.into(), status, detail: detail.into() }
    }
}

/// Every check, in table order, with every secret of the configuration redacted.
async fn checks(args: &HealthArgs, config: &Config, app: &dyn Application) -> Vec<Check> {
    let mut checks = vec![configuration(config)];
    let (providers, (store_check, store)) = tokio::join!(providers(config, args.basic), store(config));
    checks.extend(providers);
    checks.push(store_check);
    checks.push(data_dir(&config.settings.agent_data_dir));
    checks.push(application(config, app, store));
    let secrets = Secrets::of(config);
    for check in &mut checks {
        check.detail = secrets.redact(&check.detail);
    }
    checks
}

/// The table: name, status, detail; colours only when `color`.
fn render(checks: &[Check], color: bool) -> String {
    let name_width = checks.iter().map(|check| check.name.len()).chain([5]).max().unwrap_or(5);
    let status_width = checks.iter().map(|check| check.status.label().len()).chain([6]).max().unwrap_or(6);
    let indent = " ".repeat(name_width + status_width + 4);
    let mut text = Style::Bold.paint(&format!("{:name_width$}  {:status_width$}  DETAIL", "CHECK", "STATUS"), color);
    for check in checks {
        let label = format!("{:status_width$}", check.status.label());
        let mut lines = check.detail.lines();
        let first = lines.next().unwrap_or_default();
        text.push_str(&format!("\n{:name_width$}  {}  {first}", check.name, check.status.style().paint(&label, color)));
        for line in lines {
            text.push_str(&format!("\n{indent}{line}"));
        }
    }
    text
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

fn configuration(config: &Config) -> Check {
    let mut detail = match &config.source {
        Some(path) => path.display().to_string(),
        None => "embedded defaults (no config.yml)".to_owned(),
    };
    if !config.ignored_keys.is_empty() {
        let count = config.ignored_keys.len();
        detail.push_str(&format!("; {count} ignored key{}: {}", plural(count), config.ignored_keys.join(", ")));
    }
    let mut warnings = config.warnings.clone();
    if config.llm.models.is_empty() {
        warnings.push("no models.<role> is configured: every LLM call will fail; add models.default: {provider, model_id}".to_owned());
    }
    for warning in &warnings {
        detail.push_str(&format!("\nwarning: {warning}"));
    }
    Check::new("configuration", if warnings.is_empty() { Status::Ok } else { Status::Warn }, detail)
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

// ---------------------------------------------------------------------------------------------
// Providers
// ---------------------------------------------------------------------------------------------

/// A provider some roles use: `(role, model_id)` in role order.
struct ProviderUse<'a> {
    name: &'a str,
    uses: Vec<(&'a str, &'a str)>,
}

impl ProviderUse<'_> {
    fn roles(&self) -> String {
        self.uses.iter().map(|(role, _)| *role).collect::<Vec<_>>().join(", ")
    }

    /// The model of the first role that uses the provider.
    fn model(&self) -> &str {
        self.uses.first().map_or("-", |(_, model)| model)
    }
}

fn providers_in_use(config: &Config) -> Vec<ProviderUse<'_>> {
    let mut by_name: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (role, model) in &config.llm.models {
        by_name.entry(model.provider.as_str()).or_default().push((role.as_str(), model.model_id.as_str()));
    }
    by_name.into_iter().map(|(name, uses)| ProviderUse { name, uses }).collect()
}

/// One row per used provider, checked concurrently.
async fn providers(config: &Config, basic: bool) -> Vec<Check> {
    let used = providers_in_use(config);
    futures::future::join_all(used.iter().map(|provider| async move {
        let (status, detail) = check_provider(config, provider, basic).await;
        Check::new(format!("provider {}", provider.name), status, format!("{detail} (used by {})", provider.roles()))
    }))
    .await
}

async fn check_provider(config: &Config, provider: &ProviderUse<'_>, basic: bool) -> (Status, String) {
    let name = provider.name;
    let settings = config.llm.provider(name);
    if let Some(problem) = unset_key(name, &settings, config) {
        return (Status::Fail, problem);
    }
    let protocol = settings.protocol.clone().or_else(|| default_protocol(name).map(str::to_owned));
    match protocol.as_deref() {
        Some("local") => check_local(name, &settings, provider.model(), basic).await,
        _ => check_remote(name, &settings, protocol.as_deref().unwrap_or_default(), provider.model(), basic).await,
    }
}

/// A used provider's `api_key` that names an environment variable nobody set: the placeholder
/// left verbatim in the value, or a loader warning about `api.providers.<name>.api_key`.
fn unset_key(name: &str, settings: &ProviderConfig, config: &Config) -> Option<String> {
    let key_path = format!("api.providers.{name}.api_key");
    let mut variables: BTreeSet<String> = settings.api_key.as_ref().map(|key| placeholders(key.expose())).unwrap_or_default();
    let warned: Vec<&String> = config.warnings.iter().filter(|warning| warning.contains(&key_path)).collect();
    for warning in &warned {
        variables.extend(placeholders(warning));
    }
    if !variables.is_empty() {
        let names = variables.into_iter().collect::<Vec<_>>();
        let list = names.join(", ");
        return Some(format!(
            "{key_path} needs the environment variable {list}, which is not set; export {} or add it to .env",
            names.iter().map(|variable| format!("{variable}=…")).collect::<Vec<_>>().join(" ")
        ));
    }
    warned.first().map(|warning| format!("{key_path}: {warning}"))
}

/// The variable names of `${NAME}`, `${NAME:-default}` and a whole-value `$NAME` in `text`.
fn placeholders(text: &str) -> BTreeSet<String> {
    let is_name = |name: &str| {
        let mut chars = name.chars();
        chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let name = after[..end].split(":-").next().unwrap_or_default();
        if is_name(name) {
            found.insert(name.to_owned());
        }
        rest = &after[end..];
    }
    let trimmed = text.trim();
    if let Some(name) = trimmed.strip_prefix('$').filter(|name| is_name(name)) {
        found.insert(name.to_owned());
    }
    found
}

/// The embedded model: the file exists and is readable; without `--basic` it is loaded and
/// produces one token.
async fn check_local(name: &str, settings: &ProviderConfig, model: &str, basic: bool) -> (Status, String) {
    let Some(path) = settings.model_path.as_deref().filter(|path| !path.trim().is_empty()) else {
        return (Status::Fail, format!("api.providers.{name}.model_path is not set; point it at a GGUF model file"));
    };
    let size = match model_file_size(Path::new(path)) {
        Ok(size) => size,
        Err(problem) => {
            return (
                Status::Fail,
                format!("{problem}; fix api.providers.{name}.model_path (scripts/fetch-model.sh downloads SmolLM2-135M-Instruct)"),
            );
        }
    };
    let file = format!("{path} ({})", human_size(size));
    if basic {
        return (Status::Ok, format!("model file {file}; not loaded (--basic)"));
    }
    let started = Instant::now();
    let (owned_name, owned_settings) = (name.to_owned(), settings.clone());
    let built = tokio::task::spawn_blocking(move || build_provider(&owned_name, &owned_settings)).await;
    let provider = match built {
        Ok(Ok(provider)) => provider,
        Ok(Err(error)) => return (Status::Fail, format!("model file {file} cannot be loaded: {}", error.message)),
        Err(error) => return (Status::Fail, format!("loading the model file {file} failed: {error}")),
    };
    let loaded = started.elapsed();
    match one_token(provider.as_ref(), model, LOCAL_TIMEOUT).await {
        Ok(answered) => (Status::Ok, format!("model file {file}; loaded in {}, answered in {}", seconds(loaded), seconds(answered))),
        Err(Some(error)) => (Status::Fail, format!("model file {file} loaded, but generating failed: {}", error.message)),
        Err(None) => (Status::Fail, format!("model file {file} loaded, but no token within {}", seconds(LOCAL_TIMEOUT))),
    }
}

fn model_file_size(path: &Path) -> Result<u64, String> {
    let metadata = std::fs::metadata(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => format!("the model file {} does not exist", path.display()),
        _ => format!("the model file {} cannot be read: {error}", path.display()),
    })?;
    if !metadata.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    std::fs::File::open(path).map_err(|error| format!("the model file {} cannot be opened: {error}", path.display()))?;
    Ok(metadata.len())
}

/// A remote provider: its configuration builds; without `--basic`, a 1-token completion.
async fn check_remote(name: &str, settings: &ProviderConfig, protocol: &str, model: &str, basic: bool) -> (Status, String) {
    let mut probe_settings = settings.clone();
    let timeout = settings.timeout(name).map_or(REMOTE_TIMEOUT, |configured| configured.min(REMOTE_TIMEOUT));
    probe_settings.timeout_seconds = Some(timeout.as_secs_f64());
    let provider = match build_provider(name, &probe_settings) {
        Ok(provider) => provider,
        Err(error) => return (Status::Fail, error.message),
    };
    let url = base_url(name, protocol, settings);
    let key = if settings.api_key.as_ref().is_some_and(|key| !key.expose().is_empty()) { "API key set" } else { "no API key" };
    if basic {
        return (Status::Skipped, format!("{url}, {key}; completion not tried (--basic)"));
    }
    match one_token(provider.as_ref(), model, timeout).await {
        Ok(answered) => (Status::Ok, format!("{url}: model {model} answered in {}", millis(answered))),
        Err(Some(error)) => classify(name, &url, timeout, &error).await,
        Err(None) => (Status::Fail, format!("cannot reach {url}: no answer within {}", seconds(timeout))),
    }
}

/// The endpoint a provider talks to, for messages.
fn base_url(name: &str, protocol: &str, settings: &ProviderConfig) -> String {
    let default = match protocol {
        "openai" => peregrine_llm::openai::default_base_url(name).unwrap_or("(no base_url)"),
        "anthropic" => peregrine_llm::anthropic::DEFAULT_BASE_URL,
        "ollama" => peregrine_llm::ollama::DEFAULT_BASE_URL,
        _ => "(no base_url)",
    };
    settings.base_url.as_deref().unwrap_or(default).trim().trim_end_matches('/').to_owned()
}

/// One completion of at most one token; the time it took, or the error (`None`: timed out).
async fn one_token(provider: &dyn DynLlmProvider, model: &str, timeout: Duration) -> Result<Duration, Option<LlmError>> {
    let request = ChatRequest {
        model: model.to_owned(),
        messages: vec![ChatMessage::user("Reply with OK.")],
        max_tokens: Some(1),
        ..ChatRequest::default()
    };
    let started = Instant::now();
    match tokio::time::timeout(timeout, provider.complete_boxed(request)).await {
        Ok(Ok(_)) => Ok(started.elapsed()),
        Ok(Err(error)) => Err(Some(error)),
        Err(_) => Err(None),
    }
}

/// A failed completion as the row shows it.
async fn classify(name: &str, url: &str, timeout: Duration, error: &LlmError) -> (Status, String) {
    let message = &error.message;
    match &error.kind {
        LlmErrorKind::Auth { status: status @ (401 | 403) } => {
            (Status::Fail, format!("authentication failed: check api.providers.{name}.api_key (HTTP {status} from {url})"))
        }
        LlmErrorKind::Auth { .. } => (Status::Fail, format!("authentication failed: {message}")),
        LlmErrorKind::Connect => {
            let reason = diagnose_connection(url).await;
            (Status::Fail, format!("cannot reach {url}: {reason}; check api.providers.{name}.base_url and that the server runs"))
        }
        LlmErrorKind::Timeout => (Status::Fail, format!("cannot reach {url}: no answer within {}", seconds(timeout))),
        LlmErrorKind::RateLimited => (Status::Warn, format!("reachable and authenticated, but rate limited: {message}")),
        LlmErrorKind::InvalidModel => (Status::Fail, format!("unknown model: {message}")),
        LlmErrorKind::Server { .. } => (Status::Fail, format!("server error: {message}")),
        LlmErrorKind::BadRequest { .. } => (Status::Fail, format!("request rejected: {message}")),
        LlmErrorKind::Protocol | LlmErrorKind::StreamCut | LlmErrorKind::InvalidOutput => {
            (Status::Fail, format!("unexpected answer: {message}"))
        }
        LlmErrorKind::Config => (Status::Fail, format!("configuration: {message}")),
        _ => (Status::Fail, message.clone()),
    }
}

/// Why a connection to `url` fails: the DNS lookup, the TCP connection, or neither (TLS, proxy).
async fn diagnose_connection(url: &str) -> String {
    let Some(authority) = authority(url) else { return "the connection failed".to_owned() };
    let diagnosis = tokio::task::spawn_blocking(move || {
        use std::net::ToSocketAddrs as _;
        let addresses = match authority.to_socket_addrs() {
            Ok(addresses) => addresses.collect::<Vec<_>>(),
            Err(error) => return format!("DNS lookup of {authority} failed ({error})"),
        };
        let Some(address) = addresses.first() else { return format!("{authority} resolves to no address") };
        match std::net::TcpStream::connect_timeout(address, Duration::from_secs(5)) {
            Ok(_) => "the TCP connection works but the HTTP request failed (TLS or a proxy?)".to_owned(),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
            Err(error) => format!("connecting to {address} failed ({error})"),
        }
    })
    .await;
    diagnosis.unwrap_or_else(|_| "the connection failed".to_owned())
}

/// `host:port` of an http(s) URL (the scheme's port when none is given).
fn authority(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().filter(|authority| !authority.is_empty())?;
    let has_port = match authority.rfind(']') {
        Some(bracket) => authority[bracket..].contains(':'),
        None => authority.contains(':'),
    };
    if has_port {
        return Some(authority.to_owned());
    }
    let port = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
    Some(format!("{authority}:{port}"))
}

// ---------------------------------------------------------------------------------------------
// Checkpoint store, data directory, application
// ---------------------------------------------------------------------------------------------

/// Opens the store and writes, reads and deletes a probe thread; the store for the assembly.
async fn store(config: &Config) -> (Check, Option<Arc<dyn DynCheckpointer>>) {
    let what = match &config.checkpointer {
        CheckpointerConfig::Sqlite { path } => format!("SQLite {}", tidy(path).display()),
        CheckpointerConfig::Postgres { url, .. } => {
            postgres_target(url.expose()).map_or_else(|| "PostgreSQL".to_owned(), |target| format!("PostgreSQL {target}"))
        }
        CheckpointerConfig::Memory => "in memory".to_owned(),
    };
    let name = "checkpoint store";
    let store = match tokio::time::timeout(STORE_TIMEOUT, open_store(config)).await {
        Ok(Ok(store)) => store,
        Ok(Err(error)) => return (Check::new(name, Status::Fail, format!("{what}: {error:#}")), None),
        Err(_) => return (Check::new(name, Status::Fail, format!("{what}: not opened within {}", seconds(STORE_TIMEOUT))), None),
    };
    let check = match tokio::time::timeout(STORE_TIMEOUT, probe(store.as_ref())).await {
        Ok(Ok(_)) if matches!(config.checkpointer, CheckpointerConfig::Memory) => Check::new(
            name,
            Status::Warn,
            format!("{what}: writable, but conversations are lost when the process exits; set checkpointer.type: sqlite"),
        ),
        Ok(Ok(threads)) => {
            Check::new(name, Status::Ok, format!("{what}: probe checkpoint written, read and deleted; {threads} thread{}", plural(threads)))
        }
        Ok(Err(problem)) => Check::new(name, Status::Fail, format!("{what}: {problem}")),
        Err(_) => Check::new(name, Status::Fail, format!("{what}: the probe did not finish within {}", seconds(STORE_TIMEOUT))),
    };
    (check, Some(store))
}

/// `host:port/database` of a PostgreSQL URL, without credentials or options; `None` for the
/// `key=value` form.
fn postgres_target(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let target = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    target.split('?').next().filter(|target| !target.is_empty())
}

/// Writes, reads back and deletes one checkpoint of [`PROBE_THREAD`]; the number of other threads.
async fn probe(store: &dyn DynCheckpointer) -> Result<usize, String> {
    let threads = store.threads_boxed().await.map_err(|error| format!("cannot list the threads: {error}"))?;
    let others = threads.iter().filter(|summary| summary.thread_id != PROBE_THREAD).count();
    // A probe left by an interrupted earlier check goes first.
    store.delete_thread_boxed(PROBE_THREAD).await.map_err(|error| format!("cannot delete the probe thread: {error}"))?;
    let checkpoint = NewCheckpoint {
        thread_id: PROBE_THREAD.to_owned(),
        parent_id: None,
        source: CheckpointSource::Input,
        node: None,
        run_id: "health".to_owned(),
        run_step: 0,
        interrupt: None,
        resume: None,
        delta: b"{}".to_vec(),
        snapshot: Some(b"{}".to_vec()),
        created_at: chrono::Utc::now(),
    };
    let written = store.put_boxed(checkpoint).await.map_err(|error| format!("cannot write a checkpoint: {error}"))?;
    let loaded = store
        .load_boxed(PROBE_THREAD, Some(written.checkpoint_id))
        .await
        .map_err(|error| format!("cannot read a checkpoint back: {error}"))?;
    let deleted = store.delete_thread_boxed(PROBE_THREAD).await.map_err(|error| format!("cannot delete the probe thread: {error}"));
    if loaded.is_none() {
        return Err("a checkpoint just written cannot be read back".to_owned());
    }
    deleted?;
    Ok(others)
}

/// The agent data directory exists (or is created) and takes a file.
fn data_dir(dir: &Path) -> Check {
    let name = "agent data directory";
    let existed = dir.is_dir();
    if let Err(error) = std::fs::create_dir_all(dir) {
        return Check::new(name, Status::Fail, format!("{} cannot be created: {error}", dir.display()));
    }
    let probe = dir.join(format!(".health-probe-{}", std::process::id()));
    let written = std::fs::OpenOptions::new().write(true).create_new(true).open(&probe).and_then(|mut file| file.write_all(b"ok"));
    let removed = std::fs::remove_file(&probe);
    match (written, removed) {
        (Ok(()), Ok(())) => Check::new(name, Status::Ok, format!("{} ({}writable)", dir.display(), if existed { "" } else { "created, " })),
        (Err(error), _) => Check::new(name, Status::Fail, format!("{} is not writable: {error}", dir.display())),
        (Ok(()), Err(error)) => Check::new(name, Status::Fail, format!("cannot delete {}: {error}", probe.display())),
    }
}

/// The application's registry and graph assemble; the capability names.
fn application(config: &Config, app: &dyn Application, store: Option<Arc<dyn DynCheckpointer>>) -> Check {
    let store = store.unwrap_or_else(|| Arc::new(MemoryCheckpointer::new()));
    match reader_agent(config, app, store) {
        Ok(agent) => {
            let names = agent.catalog().names().collect::<Vec<_>>();
            let count = names.len();
            Check::new(
                "application",
                Status::Ok,
                format!("{}: {count} capabilit{} ({})", app.name(), if count == 1 { "y" } else { "ies" }, names.join(", ")),
            )
        }
        Err(error) => Check::new("application", Status::Fail, format!("{}: {error:#}", app.name())),
    }
}

// ---------------------------------------------------------------------------------------------
// Formatting and redaction
// ---------------------------------------------------------------------------------------------

/// Every value that must not print: the configuration's own list plus the used keys and the
/// store URL (in case a message quotes one the list lacks).
struct Secrets<'a> {
    config: &'a Config,
    values: Vec<String>,
}

impl<'a> Secrets<'a> {
    fn of(config: &'a Config) -> Self {
        let mut values: Vec<String> = config
            .llm
            .providers
            .values()
            .filter_map(|provider| provider.api_key.as_ref().map(|key| key.expose().to_owned()))
            // An unresolved placeholder names a variable, not a secret.
            .filter(|key| key.len() >= 4 && placeholders(key).is_empty())
            .collect();
        if let CheckpointerConfig::Postgres { url, .. } = &config.checkpointer {
            values.push(url.expose().to_owned());
        }
        Self { config, values }
    }

    fn redact(&self, text: &str) -> String {
        let mut out = self.config.redact(text);
        for secret in &self.values {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }
}

fn human_size(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss, reason = "a displayed size")]
    let value = bytes as f64;
    match bytes {
        0..1_024 => format!("{bytes} B"),
        1_024..1_048_576 => format!("{:.1} KiB", value / 1_024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", value / 1_048_576.0),
        _ => format!("{:.2} GiB", value / 1_073_741_824.0),
    }
}

/// `path` without `.` components (`/project/./cp.db` reads `/project/cp.db`).
fn tidy(path: &Path) -> std::path::PathBuf {
    path.components().filter(|component| !matches!(component, std::path::Component::CurDir)).collect()
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

fn millis(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

    use peregrine_llm::{LlmConfig, ModelConfig, Secret};
    use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};

    use super::*;
    use crate::app::FrameworkApp;

    const KEY: &str = "sk-health-test-0123456789";

    fn config(dir: &Path, base_url: &str, api_key: &str) -> Config {
        // No environment: the machine's variables and data directory stay out of the test.
        let mut config = Config::embedded_with(dir, &|_| None);
        config.settings.agent_data_dir = dir.join("data");
        let mut llm = LlmConfig::default();
        for role in ["default", "classifier"] {
            llm.models.insert(
                role.into(),
                ModelConfig { provider: "scripted".into(), model_id: "scripted-model".into(), max_tokens: None, temperature: None },
            );
        }
        llm.providers.insert(
            "scripted".into(),
            ProviderConfig {
                protocol: Some("openai".into()),
                base_url: Some(base_url.into()),
                api_key: Some(Secret::new(api_key)),
                max_retries: Some(0),
                ..ProviderConfig::default()
            },
        );
        config.llm = llm;
        config.checkpointer = CheckpointerConfig::Sqlite { path: dir.join("cp.db") };
        config
    }

    fn row<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|check| check.name == name).unwrap_or_else(|| panic!("no row {name}: {checks:#?}"))
    }

    fn server_script() -> Script {
        Script::new()
            .on_request(|request| request.bearer_token() != Some(KEY), Reply::fault(Fault::Status(401)))
            .otherwise(Reply::text("OK"))
    }

    #[test]
    fn placeholders_name_the_variables() {
        let table: [(&str, &[&str]); 6] = [
            ("${MISSING_KEY}", &["MISSING_KEY"]),
            ("${A:-x} and ${B}", &["A", "B"]),
            ("$OPENAI_API_KEY", &["OPENAI_API_KEY"]),
            ("sk-$notavar-123", &[]),
            ("${1BAD}", &[]),
            ("plain", &[]),
        ];
        for (text, expected) in table {
            assert_eq!(placeholders(text).into_iter().collect::<Vec<_>>(), expected.to_vec(), "{text}");
        }
    }

    #[test]
    fn postgres_targets_drop_the_credentials() {
        assert_eq!(postgres_target("postgresql://app:s3cret@db.example:5432/agent?sslmode=require"), Some("db.example:5432/agent"));
        assert_eq!(postgres_target("postgres://localhost/agent"), Some("localhost/agent"));
        assert_eq!(postgres_target("host=db user=app password=s3cret"), None);
    }

    #[test]
    fn authorities_get_the_schemes_port() {
        assert_eq!(authority("http://127.0.0.1:9/v1").as_deref(), Some("127.0.0.1:9"));
        assert_eq!(authority("https://api.openai.com/v1").as_deref(), Some("api.openai.com:443"));
        assert_eq!(authority("http://[::1]/v1").as_deref(), Some("[::1]:80"));
        assert_eq!(authority("http://[::1]:8080").as_deref(), Some("[::1]:8080"));
        assert_eq!(authority("not a url"), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_healthy_setup_passes_every_check() {
        let dir = tempfile::tempdir().unwrap();
        let server = ScriptedLlmServer::start(server_script()).await;
        let rows = checks(&HealthArgs { basic: false }, &config(dir.path(), &server.base_url(), KEY), &FrameworkApp).await;
        assert!(rows.iter().all(|check| check.status != Status::Fail), "{rows:#?}");
        let provider = row(&rows, "provider scripted");
        assert_eq!(provider.status, Status::Ok, "{provider:?}");
        assert!(provider.detail.contains("used by classifier, default"), "{provider:?}");
        let requests = server.chat_requests();
        assert_eq!(requests.len(), 1, "one completion per provider, not per role");
        assert_eq!(requests[0].body["max_tokens"], 1);
        assert_eq!(row(&rows, "checkpoint store").status, Status::Ok);
        assert!(row(&rows, "application").detail.contains("respond"), "{rows:#?}");
        assert!(
            !dir.path()
                .join("data")
                .read_dir()
                .unwrap()
                .any(|entry| { entry.unwrap().file_name().to_string_lossy().starts_with(".health-probe") })
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn failures_say_what_to_fix_and_never_print_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let server = ScriptedLlmServer::start(server_script()).await;
        let wrong = "sk-wrong-key-9876543210";
        let rows = checks(&HealthArgs { basic: false }, &config(dir.path(), &server.base_url(), wrong), &FrameworkApp).await;
        let provider = row(&rows, "provider scripted");
        assert_eq!(provider.status, Status::Fail);
        assert!(provider.detail.contains("authentication failed: check api.providers.scripted.api_key"), "{provider:?}");
        let table = render(&rows, false);
        assert!(!table.contains(wrong), "{table}");

        let refusing = ScriptedLlmServer::refusing();
        let rows = checks(&HealthArgs { basic: false }, &config(dir.path(), &refusing, KEY), &FrameworkApp).await;
        let provider = row(&rows, "provider scripted");
        assert_eq!(provider.status, Status::Fail);
        assert!(provider.detail.contains(&format!("cannot reach {refusing}: connection refused")), "{provider:?}");

        let rows = checks(&HealthArgs { basic: false }, &config(dir.path(), &server.base_url(), "${MISSING_KEY}"), &FrameworkApp).await;
        let provider = row(&rows, "provider scripted");
        assert_eq!(provider.status, Status::Fail);
        assert!(provider.detail.contains("environment variable MISSING_KEY"), "{provider:?}");
        assert_eq!(server.request_count(), 1, "only the wrong key reached the server");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn basic_sends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let server = ScriptedLlmServer::start(server_script()).await;
        let rows = checks(&HealthArgs { basic: true }, &config(dir.path(), &server.base_url(), KEY), &FrameworkApp).await;
        assert_eq!(row(&rows, "provider scripted").status, Status::Skipped);
        assert_eq!(server.request_count(), 0);
    }

    #[tokio::test]
    async fn basic_checks_the_local_model_file_without_loading_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::embedded_with(dir.path(), &|_| None);
        config.settings.agent_data_dir = dir.path().join("data");
        let model = dir.path().join("model.gguf");
        let local = |path: &Path| ProviderConfig { model_path: Some(path.display().to_string()), ..ProviderConfig::default() };
        config.llm.providers.insert("local".into(), local(&model));
        config.llm.models.insert(
            "default".into(),
            ModelConfig { provider: "local".into(), model_id: "smollm2".into(), max_tokens: None, temperature: None },
        );
        let rows = checks(&HealthArgs { basic: true }, &config, &FrameworkApp).await;
        let provider = row(&rows, "provider local");
        assert_eq!(provider.status, Status::Fail);
        assert!(provider.detail.contains("does not exist") && provider.detail.contains("api.providers.local.model_path"), "{provider:?}");

        std::fs::write(&model, vec![0_u8; 2048]).unwrap();
        let rows = checks(&HealthArgs { basic: true }, &config, &FrameworkApp).await;
        let provider = row(&rows, "provider local");
        assert_eq!(provider.status, Status::Ok, "{provider:?}");
        assert!(provider.detail.contains("(2.0 KiB); not loaded (--basic)"), "{provider:?}");
    }

    #[test]
    fn the_table_aligns_and_continues_details() {
        let checks = [
            Check::new("configuration", Status::Warn, "config.yml\nwarning: ${X} is not set"),
            Check::new("application", Status::Ok, "peregrine: 2 capabilities"),
        ];
        let table = render(&checks, false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "CHECK          STATUS  DETAIL");
        assert_eq!(lines[1], "configuration  warn    config.yml");
        assert_eq!(lines[2], "                       warning: ${X} is not set");
        assert_eq!(lines[3], "application    ok      peregrine: 2 capabilities");
        assert!(render(&checks, true).contains("\x1b[33mwarn  \x1b[0m"));
    }
}

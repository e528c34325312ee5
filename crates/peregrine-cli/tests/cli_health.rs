//! `peregrine health` through the real binary against the scripted OpenAI-compatible server:
//! a healthy setup passes, a wrong key, an unreachable server and an unset `${VAR}` fail with
//! a row that says what to fix (and never the key), `--basic` sends nothing, and the
//! connectivity check is a 1-token completion.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output};

use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};

/// The key the scripted server accepts.
const GOOD_KEY: &str = "sk-health-good-0123456789abcdef";
/// A key it refuses.
const WRONG_KEY: &str = "sk-health-wrong-fedcba9876543210";

/// 401 for any bearer token but [`GOOD_KEY`], "OK" otherwise.
fn script() -> Script {
    Script::new()
        .on_request(|request| request.bearer_token() != Some(GOOD_KEY), Reply::fault(Fault::Status(401)))
        .otherwise(Reply::text("OK"))
}

/// A project directory with a `config.yml` whose `scripted` provider is at `base_url` with
/// `api_key` written verbatim into the YAML.
struct Project {
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    data: tempfile::TempDir,
}

impl Project {
    fn new(base_url: &str, api_key: &str) -> Self {
        let project = Self { dir: tempfile::tempdir().unwrap(), home: tempfile::tempdir().unwrap(), data: tempfile::tempdir().unwrap() };
        let config = format!(
            "models:\n  default: {{provider: scripted, model_id: scripted-model}}\n  classifier: {{provider: scripted, model_id: scripted-model}}\n\
             api:\n  providers:\n    scripted:\n      protocol: openai\n      base_url: {base_url}\n      api_key: \"{api_key}\"\n      max_retries: 0\n\
             checkpointer: {{type: sqlite, path: ./cp.db}}\n"
        );
        std::fs::write(project.dir.path().join("config.yml"), config).unwrap();
        project
    }

    fn config(&self) -> std::path::PathBuf {
        self.dir.path().join("config.yml")
    }

    /// Runs `peregrine health <args>` with a clean environment plus `env`.
    async fn health(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_peregrine"));
        command
            .current_dir(self.dir.path())
            .arg("--config")
            .arg(self.config())
            .arg("health")
            .args(args)
            .env("HOME", self.home.path())
            .env("PEREGRINE_DATA_DIR", self.data.path())
            .env("NO_COLOR", "1")
            .env_remove("PEREGRINE_CONFIG")
            .env_remove("CONFIG_FILE")
            .env_remove("PEREGRINE_LOG")
            .env_remove("SCRIPTED_KEY")
            .env_remove("MISSING_KEY");
        for (name, value) in env {
            command.env(name, value);
        }
        // The scripted server runs on this test's runtime: wait for the child off its workers.
        let output = tokio::task::spawn_blocking(move || command.output().expect("the binary runs")).await.unwrap();
        Run::from(output)
    }
}

/// What one run printed.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    /// The table row of `check` (its first line) as `(status, detail)`.
    fn row(&self, check: &str) -> (String, String) {
        let line = self
            .stdout
            .lines()
            .find(|line| line.starts_with(check))
            .unwrap_or_else(|| panic!("no row '{check}' in:\n{}\nstderr:\n{}", self.stdout, self.stderr));
        let rest = line[check.len()..].trim_start();
        let (status, detail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        (status.to_owned(), detail.trim().to_owned())
    }

    fn context(&self) -> String {
        format!("exit {:?}\nstdout:\n{}\nstderr:\n{}", self.code, self.stdout, self.stderr)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_setup_passes_with_one_token_per_provider() {
    let server = ScriptedLlmServer::start(script()).await;
    let project = Project::new(&server.base_url(), "${SCRIPTED_KEY}");
    let run = project.health(&[], &[("SCRIPTED_KEY", GOOD_KEY)]).await;
    assert_eq!(run.code, Some(0), "{}", run.context());
    let (status, detail) = run.row("provider scripted");
    assert_eq!(status, "ok", "{}", run.context());
    assert!(detail.contains("classifier, default"), "the roles using it are listed: {detail}");
    assert_eq!(run.row("checkpoint store").0, "ok", "{}", run.context());
    assert_eq!(run.row("agent data directory").0, "ok", "{}", run.context());
    assert_eq!(run.row("application").0, "ok", "{}", run.context());
    assert!(run.row("configuration").1.contains("config.yml"), "the file used is named: {}", run.context());
    assert!(project.dir.path().join("cp.db").exists(), "the configured SQLite store was the one probed");

    let requests = server.chat_requests();
    assert_eq!(requests.len(), 1, "one completion for the provider, not one per role: {}", run.context());
    assert_eq!(requests[0].body["max_tokens"], 1, "a 1-token completion: {}", requests[0].body);
    assert_eq!(requests[0].model.as_deref(), Some("scripted-model"));
    assert!(!run.stdout.contains(GOOD_KEY) && !run.stderr.contains(GOOD_KEY), "the key never prints: {}", run.context());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_key_fails_authentication_without_printing_it() {
    let server = ScriptedLlmServer::start(script()).await;
    let project = Project::new(&server.base_url(), WRONG_KEY);
    let run = project.health(&[], &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.context());
    let (status, detail) = run.row("provider scripted");
    assert_eq!(status, "FAIL", "{}", run.context());
    assert!(detail.contains("authentication failed: check api.providers.scripted.api_key"), "{}", run.context());
    assert_eq!(server.chat_requests().len(), 1, "the key was really tried");
    assert!(!run.stdout.contains(WRONG_KEY) && !run.stderr.contains(WRONG_KEY), "the key never prints: {}", run.context());
    assert_eq!(run.row("checkpoint store").0, "ok", "other checks still run: {}", run.context());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_provider_says_cannot_reach() {
    let refusing = ScriptedLlmServer::refusing();
    // Nothing listens there: connecting is refused, not answered.
    assert!(std::net::TcpStream::connect(refusing.trim_start_matches("http://").trim_end_matches("/v1")).is_err(), "{refusing}");
    let project = Project::new(&refusing, GOOD_KEY);
    let run = project.health(&[], &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.context());
    let (status, detail) = run.row("provider scripted");
    assert_eq!(status, "FAIL", "{}", run.context());
    assert!(detail.contains(&format!("cannot reach {refusing}")), "{}", run.context());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unset_variable_fails_naming_it_and_sends_nothing() {
    let server = ScriptedLlmServer::start(script()).await;
    let project = Project::new(&server.base_url(), "${MISSING_KEY}");
    let run = project.health(&[], &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.context());
    let (status, detail) = run.row("provider scripted");
    assert_eq!(status, "FAIL", "{}", run.context());
    assert!(detail.contains("MISSING_KEY"), "the variable is named: {}", run.context());
    assert_eq!(server.request_count(), 0, "a key known to be missing is not sent: {}", run.context());
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_checks_files_and_configuration_only() {
    let server = ScriptedLlmServer::start(script()).await;
    let project = Project::new(&server.base_url(), "${SCRIPTED_KEY}");
    let run = project.health(&["--basic"], &[("SCRIPTED_KEY", GOOD_KEY)]).await;
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(run.row("provider scripted").0, "skipped", "{}", run.context());
    assert_eq!(run.row("checkpoint store").0, "ok", "{}", run.context());
    assert_eq!(server.request_count(), 0, "--basic makes no request: {}", run.context());
}

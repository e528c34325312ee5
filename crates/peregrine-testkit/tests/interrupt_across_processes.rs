//! Interrupts across processes through the real `crash_probe` binary on a SQLite file: one
//! process asks and exits with the question pending, a new process answers it; stale, forged and
//! unexpected answers are refused with a clear message and leave the thread exactly as it was.

use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context as _, ensure};
use peregrine_graph::payload_digest;
use serde::Deserialize;
use serde_json::{Value, json};

const PROBE: &str = env!("CARGO_BIN_EXE_crash_probe");
const APPROVED: &str = r#"{"approved": true}"#;

/// What `approve` asks about.
fn asked_payload() -> Value {
    json!({"action": "write", "pv": "SR:X", "value": 5})
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Interrupt {
    id: String,
    node: String,
    payload: Value,
    digest: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Decision {
    interrupt_id: String,
    approved: bool,
    action: Value,
}

#[derive(Debug, Deserialize)]
struct ProbeState {
    requests: u32,
    decisions: Vec<Decision>,
}

/// What `ask` and `answer` print.
#[derive(Debug, Deserialize)]
struct Outcome {
    status: String,
    state: ProbeState,
    interrupt: Option<Interrupt>,
}

/// A SQLite file in a fresh temp dir.
struct Store {
    _dir: tempfile::TempDir,
    db: PathBuf,
}

impl Store {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("checkpoints.sqlite");
        Ok(Self { _dir: dir, db })
    }

    fn probe(&self, command: &str, thread: &str, extra: &[&str]) -> anyhow::Result<Output> {
        let db = self.db.to_str().context("the temp path is not UTF-8")?;
        Command::new(PROBE).args([command, db, thread]).args(extra).output().with_context(|| format!("could not start {PROBE} {command}"))
    }

    /// Starts an approval in its own process, which must exit with the question pending.
    fn ask(&self, thread: &str) -> anyhow::Result<Interrupt> {
        let output = self.probe("ask", thread, &[])?;
        ensure!(output.status.success(), "ask failed: {}", describe(&output));
        let outcome: Outcome = serde_json::from_slice(&output.stdout)?;
        ensure!(outcome.status == "interrupted", "ask ended {} instead of pausing", outcome.status);
        outcome.interrupt.context("a paused run without its interrupt")
    }

    /// Answers in its own process.
    fn answer(&self, thread: &str, interrupt_id: &str, digest: &str, answer: &str) -> anyhow::Result<Output> {
        self.probe("answer", thread, &[interrupt_id, digest, answer])
    }

    /// Answers and expects the run to complete.
    fn answer_ok(&self, thread: &str, interrupt: &Interrupt) -> anyhow::Result<Outcome> {
        let output = self.answer(thread, &interrupt.id, &interrupt.digest, APPROVED)?;
        ensure!(output.status.success(), "the answer was not accepted: {}", describe(&output));
        let outcome: Outcome = serde_json::from_slice(&output.stdout)?;
        ensure!(outcome.status == "completed", "the answered run ended {}", outcome.status);
        Ok(outcome)
    }

    /// Answers, expects a refusal whose message contains `reason`, and checks the thread is
    /// unchanged (same checkpoint, state and pending interrupt).
    fn answer_refused(&self, thread: &str, interrupt_id: &str, digest: &str, reason: &str) -> anyhow::Result<()> {
        let before = self.state(thread)?;
        let output = self.answer(thread, interrupt_id, digest, APPROVED)?;
        ensure!(!output.status.success(), "the answer was accepted: {}", describe(&output));
        let message = String::from_utf8_lossy(&output.stderr);
        ensure!(message.contains(reason) && message.contains("refused"), "unclear refusal (expected {reason:?}): {message}");
        ensure!(output.stdout.is_empty(), "a refused answer printed an outcome: {}", describe(&output));
        let after = self.state(thread)?;
        ensure!(before == after, "a refused answer changed the thread:\nbefore {before}\nafter  {after}");
        Ok(())
    }

    /// `crash_probe state` as JSON (`null` for an unknown thread).
    fn state(&self, thread: &str) -> anyhow::Result<Value> {
        let output = self.probe("state", thread, &[])?;
        ensure!(output.status.success(), "state failed: {}", describe(&output));
        Ok(serde_json::from_slice(&output.stdout)?)
    }
}

fn describe(output: &Output) -> String {
    format!("{} stdout={} stderr={}", output.status, String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn approved(interrupt: &Interrupt) -> Decision {
    Decision { interrupt_id: interrupt.id.clone(), approved: true, action: asked_payload() }
}

fn approved_json(interrupt: &Interrupt) -> Value {
    json!({"interrupt_id": interrupt.id, "approved": true, "action": asked_payload()})
}

#[test]
fn an_answer_from_a_new_process_completes_the_paused_run_once() -> anyhow::Result<()> {
    let store = Store::new()?;
    let interrupt = store.ask("t")?;
    ensure!(interrupt.node == "approve" && interrupt.payload == asked_payload(), "unexpected question {interrupt:?}");
    ensure!(interrupt.digest == payload_digest(&asked_payload()), "the digest is not the payload's");

    let paused = store.state("t")?;
    ensure!(paused["interrupt"]["id"] == interrupt.id.as_str(), "the pending interrupt is not stored: {paused}");
    ensure!(paused["next"] == "approve" && paused["state"]["decisions"] == json!([]), "unexpected paused state {paused}");

    let outcome = store.answer_ok("t", &interrupt)?;
    ensure!(outcome.interrupt.is_none(), "the completed run still reports an interrupt");
    ensure!(outcome.state.decisions == [approved(&interrupt)], "decisions after the answer: {:?}", outcome.state.decisions);

    let finished = store.state("t")?;
    ensure!(finished["interrupt"].is_null() && finished["next"].is_null(), "the run is not finished: {finished}");
    ensure!(finished["state"]["decisions"] == json!([approved_json(&interrupt)]), "the action is not recorded exactly once: {finished}");
    Ok(())
}

#[test]
fn a_stale_answer_is_refused_and_the_pending_question_stays() -> anyhow::Result<()> {
    let store = Store::new()?;
    let first = store.ask("t")?;
    store.answer_ok("t", &first)?;
    let second = store.ask("t")?;
    ensure!(second.id != first.id, "a new question reused the id {}", first.id);
    // Same payload, same digest: only the id tells the answers apart.
    ensure!(second.digest == first.digest, "the same payload has two digests");

    store.answer_refused("t", &first.id, &first.digest, "stale")?;

    let outcome = store.answer_ok("t", &second)?;
    ensure!(outcome.state.requests == 2, "requests: {}", outcome.state.requests);
    ensure!(outcome.state.decisions == [approved(&first), approved(&second)], "decisions: {:?}", outcome.state.decisions);
    Ok(())
}

#[test]
fn a_forged_answer_is_refused_and_the_genuine_one_still_works() -> anyhow::Result<()> {
    let store = Store::new()?;
    let interrupt = store.ask("t")?;
    let other_payload = json!({"action": "write", "pv": "SR:X", "value": 500});
    store.answer_refused("t", &interrupt.id, &payload_digest(&other_payload), "different payload")?;
    store.answer_refused("t", &interrupt.id, "not-a-digest", "different payload")?;

    let outcome = store.answer_ok("t", &interrupt)?;
    ensure!(outcome.state.decisions == [approved(&interrupt)], "decisions: {:?}", outcome.state.decisions);
    Ok(())
}

#[test]
fn answering_a_thread_with_nothing_pending_is_refused() -> anyhow::Result<()> {
    let store = Store::new()?;
    let interrupt = store.ask("t")?;
    store.answer_ok("t", &interrupt)?;
    // The very answer that was accepted, sent again.
    store.answer_refused("t", &interrupt.id, &interrupt.digest, "no pending interrupt")?;
    ensure!(store.state("t")?["state"]["decisions"] == json!([approved_json(&interrupt)]), "the action was recorded again");

    store.answer_refused("never-started", &interrupt.id, &interrupt.digest, "has no checkpoint")?;
    ensure!(store.state("never-started")?.is_null(), "answering created a thread");
    Ok(())
}

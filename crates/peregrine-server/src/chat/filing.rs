//! Filing a conversation's first turn. A request whose history has no answer yet runs on a fresh
//! thread, because the id that the conversation's later requests derive includes the first
//! answer. The answer side hands what it sent to the turn's task, which copies the fresh thread's
//! checkpoints (and moves its pending plan) to the derived id and deletes the fresh thread, all
//! in the shared store, so any process serving it finds the conversation. A complete answer is
//! only sent after that, so the client's next request finds the thread filed.

use std::path::Path;
use std::sync::Arc;

use peregrine_agent::infra::orchestrator::pending::PendingPlans;
use peregrine_graph::CheckpointError;
use tokio::sync::oneshot;

use super::{BusyThread, ServerState};
use crate::request::{FirstExchange, distinguishing_mark};

/// How often a first turn tries another mark when the id it derives is taken.
const FILING_ATTEMPTS: usize = 4;

/// Where a first turn's thread was filed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Filed {
    /// The derived thread id.
    pub(super) thread_id: String,
    /// The [`distinguishing_mark`] the answer ends with, or empty.
    pub(super) mark: String,
}

/// The answer's side of filing a first turn.
pub(super) struct Filing {
    transcript: Transcript,
    /// Where the thread was filed, once it is.
    filed: oneshot::Receiver<Option<Filed>>,
}

/// The turn task's side of filing a first turn.
pub(super) struct Filer {
    exchange: FirstExchange,
    transcript: oneshot::Receiver<(String, bool)>,
    filed: oneshot::Sender<Option<Filed>>,
}

/// The two sides of filing the first turn of `exchange`'s conversation.
pub(super) fn channel(exchange: FirstExchange) -> (Filing, Filer) {
    let (report, transcript) = oneshot::channel();
    let (filed_sender, filed) = oneshot::channel();
    (Filing { transcript: Transcript::new(report), filed }, Filer { exchange, transcript, filed: filed_sender })
}

/// An answer's side whose other side the test holds: what it hands over, and where to say the
/// thread was filed.
#[cfg(test)]
pub(super) fn detached() -> (Filing, oneshot::Receiver<(String, bool)>, oneshot::Sender<Option<Filed>>) {
    let (report, transcript) = oneshot::channel();
    let (filed_sender, filed) = oneshot::channel();
    (Filing { transcript: Transcript::new(report), filed }, transcript, filed_sender)
}

impl Filing {
    /// Notes content sent to the client.
    pub(super) fn push(&mut self, text: &str) {
        self.transcript.sent.push_str(text);
    }

    /// Hands the complete answer to the turn's task and waits until the thread is filed. `last`
    /// is the answer's content not sent yet (`fresh` is the first turn's own thread); it comes
    /// back naming the thread it was filed under instead (an approval prompt names its plan's
    /// path), and ending with the mark when another conversation had the same first exchange.
    pub(super) async fn finish(mut self, fresh: &str, last: Option<String>) -> Option<String> {
        if let Some(last) = &last {
            self.push(last);
        }
        self.transcript.hand_over(true);
        let Ok(Some(filed)) = self.filed.await else { return last };
        let mut last = last.map(|text| text.replace(fresh, &filed.thread_id)).unwrap_or_default();
        last.push_str(&filed.mark);
        (!last.is_empty()).then_some(last)
    }
}

/// The content a first turn's answer has sent. It goes to the turn's task when the answer is
/// complete, or when the answer is dropped half way (a client that went away resends what it got).
struct Transcript {
    sent: String,
    report: Option<oneshot::Sender<(String, bool)>>,
}

impl Transcript {
    fn new(report: oneshot::Sender<(String, bool)>) -> Self {
        Self { sent: String::new(), report: Some(report) }
    }

    fn hand_over(&mut self, complete: bool) {
        if let Some(report) = self.report.take() {
            let _ = report.send((std::mem::take(&mut self.sent), complete));
        }
    }
}

impl Drop for Transcript {
    fn drop(&mut self) {
        self.hand_over(false);
    }
}

impl Filer {
    /// Waits for what the answer sent, files the thread `fresh`, and says where.
    pub(super) async fn file(self, state: &Arc<ServerState>, fresh: &str) {
        let (sent, complete) = self.transcript.await.unwrap_or_default();
        let filed = file_first_turn(state, fresh, &self.exchange, &sent, complete).await;
        let _ = self.filed.send(filed);
    }
}

/// Files the first turn's thread `fresh` under the id `exchange` derives with the answer `sent`
/// (what the conversation's next requests derive): copies its checkpoints there, moves its
/// pending plan, deletes `fresh`. When another conversation of the caller has that id already
/// (the same first message got the same answer), a complete answer gets a
/// [`distinguishing_mark`] and is filed under the id with the mark; an answer cut off cannot get
/// one, so its conversation joins the other thread. Failures are logged: the conversation's next
/// message then starts a new thread.
async fn file_first_turn(state: &Arc<ServerState>, fresh: &str, exchange: &FirstExchange, sent: &str, complete: bool) -> Option<Filed> {
    let checkpointer = state.agent.graph().checkpointer()?;
    let mut mark = String::new();
    for _ in 0..FILING_ATTEMPTS {
        let derived = exchange.thread_id(&format!("{sent}{mark}"));
        // A turn of this process on the derived thread means it is taken too.
        let copied = match BusyThread::claim(state, &derived) {
            Ok(_claim) => checkpointer.copy_thread_boxed(fresh, &derived).await,
            Err(_) => Err(CheckpointError::ThreadExists { thread_id: derived.clone() }),
        };
        match copied {
            Ok(()) => {
                if let Err(error) = move_pending_plan(&state.agent.services().settings.agent_data_dir, fresh, &derived) {
                    let error = (state.redact)(&error.to_string());
                    tracing::warn!(from = fresh, to = %derived, %error, "the pending plan stays under the first turn's thread");
                }
                discard(state, fresh).await;
                tracing::info!(from = fresh, to = %derived, "first turn filed under its conversation's thread");
                return Some(Filed { thread_id: derived, mark });
            }
            // Nothing was stored (a refused message, a reply): nothing to file.
            Err(CheckpointError::ThreadNotFound { .. }) => return None,
            Err(CheckpointError::ThreadExists { .. }) if complete => mark = distinguishing_mark(),
            Err(CheckpointError::ThreadExists { .. }) => {
                tracing::info!(thread = %derived, "a cut-off first turn joins the thread of a conversation with the same first exchange");
                discard(state, fresh).await;
                return None;
            }
            Err(error) => {
                let error = (state.redact)(&error.to_string());
                tracing::warn!(thread = fresh, %error, "the first turn could not be filed; the conversation's next message starts a new thread");
                return None;
            }
        }
    }
    tracing::warn!(thread = fresh, "every id the first turn derived was taken; the conversation's next message starts a new thread");
    None
}

/// Deletes a first turn's thread (filed elsewhere, or joined to another) with its pending plan.
async fn discard(state: &ServerState, thread_id: &str) {
    let Some(checkpointer) = state.agent.graph().checkpointer() else { return };
    if let Err(error) = checkpointer.delete_thread_boxed(thread_id).await {
        let error = (state.redact)(&error.to_string());
        tracing::warn!(thread = thread_id, %error, "a filed first turn's thread could not be deleted");
    }
    PendingPlans::for_thread(&state.agent.services().settings.agent_data_dir, thread_id).clear();
}

/// Moves the pending plan folder of `from` (if any) to that of `to`.
fn move_pending_plan(agent_data_dir: &Path, from: &str, to: &str) -> std::io::Result<()> {
    let source = PendingPlans::for_thread(agent_data_dir, from);
    if !source.dir().exists() {
        return Ok(());
    }
    let target = PendingPlans::for_thread(agent_data_dir, to);
    if let Some(parent) = target.dir().parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(source.dir(), target.dir())
}

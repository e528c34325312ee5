//! The write journal of an approved operation: one small append-only file per operation in
//! which, for each write, `sending N` is made durable before the write is sent and `done N`
//! after the control system confirmed it. When an approval's answer is delivered again after a
//! crash, the journal — not a guess from the channel's readback — says what happened: a write
//! recorded done is not sent again, a write not recorded at all was never sent, and a write
//! recorded as sending without done may or may not have reached the control system: it is
//! settled by reading the channel only where the readback is known to show a write (the
//! channel is verified by readback) and tells the approved new value from the value shown at
//! the approval; otherwise it is reported as uncertain, never re-sent blindly. A torn last line (a crash while recording) counts
//! as not recorded: the write after it was not sent yet.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt as _;

use crate::error::ControlError;
use crate::value::ChannelValue;

/// What the journal knows about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalState {
    /// Never sent.
    Unsent,
    /// Sent (or about to be) with no confirmation recorded: it may have happened.
    Sending,
    /// Sent and confirmed.
    Done,
}

/// The journal of one approved operation.
#[derive(Debug)]
pub struct WriteJournal {
    path: PathBuf,
    states: Vec<JournalState>,
    shown: Vec<Option<ChannelValue>>,
}

fn journal_error(path: &Path, error: &std::io::Error) -> ControlError {
    ControlError::Connector { detail: format!("the write journal {} cannot be used ({error}); nothing was sent", path.display()) }
}

impl WriteJournal {
    /// Opens (or starts) the journal of operation `id` in `dir`, one write per entry of `shown`:
    /// each channel's value as the approval showed it (when known). The id is letters, digits
    /// and `-` only (it names the file).
    pub async fn open(dir: &Path, id: &str, shown: Vec<Option<ChannelValue>>) -> Result<Self, ControlError> {
        let count = shown.len();
        if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(ControlError::Connector { detail: format!("'{id}' is not a write operation id; nothing was sent") });
        }
        let path = dir.join(format!("{id}.journal"));
        let mut states = vec![JournalState::Unsent; count];
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                for line in text.lines() {
                    let Some((verb, index)) = line.split_once(' ') else { continue };
                    let Some(state) = index.parse::<usize>().ok().and_then(|index| states.get_mut(index)) else { continue };
                    match verb {
                        "sending" if *state == JournalState::Unsent => *state = JournalState::Sending,
                        "done" => *state = JournalState::Done,
                        _ => {}
                    }
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                // The file and its directory entry are durable before any write is sent.
                tokio::fs::create_dir_all(dir).await.map_err(|error| journal_error(dir, &error))?;
                let file = tokio::fs::File::create(&path).await.map_err(|error| journal_error(&path, &error))?;
                file.sync_all().await.map_err(|error| journal_error(&path, &error))?;
                let directory = tokio::fs::File::open(dir).await.map_err(|error| journal_error(dir, &error))?;
                directory.sync_all().await.map_err(|error| journal_error(dir, &error))?;
            }
            Err(error) => return Err(journal_error(&path, &error)),
        }
        Ok(Self { path, states, shown })
    }

    /// The state of write `index` (writes past the operation's count are unsent).
    pub fn state(&self, index: usize) -> JournalState {
        self.states.get(index).copied().unwrap_or(JournalState::Unsent)
    }

    /// The value write `index`'s channel had when the approval was shown.
    pub fn shown(&self, index: usize) -> Option<&ChannelValue> {
        self.shown.get(index).and_then(Option::as_ref)
    }

    /// Records, durably, that write `index` is about to be sent.
    pub async fn sending(&mut self, index: usize) -> Result<(), ControlError> {
        self.append(&format!("sending {index}\n")).await?;
        if let Some(state) = self.states.get_mut(index) {
            *state = JournalState::Sending;
        }
        Ok(())
    }

    /// Records, durably, that write `index` was confirmed.
    pub async fn done(&mut self, index: usize) -> Result<(), ControlError> {
        self.append(&format!("done {index}\n")).await?;
        if let Some(state) = self.states.get_mut(index) {
            *state = JournalState::Done;
        }
        Ok(())
    }

    async fn append(&self, line: &str) -> Result<(), ControlError> {
        let error = |error: std::io::Error| journal_error(&self.path, &error);
        let mut file = tokio::fs::OpenOptions::new().create(true).append(true).open(&self.path).await.map_err(error)?;
        file.write_all(line.as_bytes()).await.map_err(error)?;
        // The line is on disk before the write it announces is sent.
        file.sync_all().await.map_err(error)?;
        Ok(())
    }
}

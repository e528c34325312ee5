//! The write journal of an approved operation: one small append-only file per operation in
//! which, for each write, `sending N T` (T: milliseconds since the Unix epoch) is made durable
//! before the write is sent and `done N` after the control system confirmed it. When an
//! approval's answer is delivered again after a crash, the journal — not a guess from the
//! channel's readback — says what happened: a write recorded done is not sent again, a write
//! not recorded at all was never sent, and a write recorded as sending without done may or may
//! not have reached the control system: it is settled by reading the channel only where the
//! readback is known to show a write (the channel is verified by readback) and tells the
//! approved new value from the value shown at the approval; otherwise it is reported as
//! uncertain, never re-sent blindly.
//!
//! The journal's file is locked (an exclusive advisory lock) while an operation is written, so
//! two processes answering the same approval never both send; a torn last line (a crash while
//! recording) counts as not recorded, and is ended before anything is appended.

use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::ControlError;
use crate::value::ChannelValue;

/// What the journal knows about one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalState {
    /// Never sent.
    Unsent,
    /// Sent (or about to be) with no confirmation recorded: it may have happened. The time
    /// it was recorded, when known.
    Sending(Option<SystemTime>),
    /// Sent and confirmed.
    Done,
}

/// The journal of one approved operation, holding its file's lock.
#[derive(Debug)]
pub struct WriteJournal {
    path: PathBuf,
    file: Arc<Mutex<std::fs::File>>,
    states: Vec<JournalState>,
    shown: Vec<Option<ChannelValue>>,
}

fn journal_error(path: &Path, error: &std::io::Error) -> ControlError {
    ControlError::Connector { detail: format!("the write journal {} cannot be used ({error}); nothing was sent", path.display()) }
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis())
}

/// Reads the states of `count` writes from the journal's text; anything but an exact
/// `sending N [T]` or `done N` line is not a record.
fn parse(text: &str, count: usize) -> Vec<JournalState> {
    let mut states = vec![JournalState::Unsent; count];
    for line in text.split_terminator('\n') {
        let words: Vec<&str> = line.split(' ').collect();
        let index = words.get(1).and_then(|index| index.parse::<usize>().ok());
        let Some(state) = index.and_then(|index| states.get_mut(index)) else { continue };
        match words.as_slice() {
            ["done", _] => *state = JournalState::Done,
            ["sending", _] | ["sending", _, _] if *state != JournalState::Done => {
                let at = words.get(2).and_then(|ms| ms.parse::<u64>().ok()).map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
                *state = JournalState::Sending(at);
            }
            _ => {}
        }
    }
    states
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Opens the journal file under its lock, blocking (run off the async threads).
fn open_locked(dir: &Path, path: &Path, fresh: bool, count: usize) -> Result<(std::fs::File, Vec<JournalState>), ControlError> {
    let error = |error: std::io::Error| journal_error(path, &error);
    let existed = path.exists();
    if !existed {
        std::fs::create_dir_all(dir).map_err(|error| journal_error(dir, &error))?;
    }
    let mut file = std::fs::OpenOptions::new().read(true).append(true).create(true).open(path).map_err(error)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(ControlError::Connector {
                detail: format!(
                    "another process is writing this operation now (its journal {} is locked); nothing was sent",
                    path.display()
                ),
            });
        }
        Err(std::fs::TryLockError::Error(io)) => return Err(error(io)),
    }
    if !existed {
        // The file and its directory entries are durable before any write is sent.
        file.sync_all().map_err(error)?;
        sync_dir(dir).map_err(|error| journal_error(dir, &error))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent).map_err(|error| journal_error(parent, &error))?;
        }
    }
    let mut text = String::new();
    file.rewind().map_err(error)?;
    file.read_to_string(&mut text).map_err(error)?;
    if fresh && !text.is_empty() {
        return Err(ControlError::Connector {
            detail: format!(
                "this approved operation was already carried out (its journal {} has records), and this answer is not a redelivery; \
                 nothing was sent — ask again to write again",
                path.display()
            ),
        });
    }
    if !text.is_empty() && !text.ends_with('\n') {
        // A torn last line is ended, so the next record is a line of its own.
        file.write_all(b"\n").and_then(|()| file.sync_data()).map_err(error)?;
    }
    Ok((file, parse(&text, count)))
}

impl WriteJournal {
    /// Opens (or starts) the journal of operation `id` in `dir` and locks it, one write per
    /// entry of `shown`: each channel's value as the approval showed it (when known). `fresh`
    /// (a first delivery of the approval's answer) requires a journal with no records: an
    /// operation is carried out once. The id is letters, digits and `-` only (it names the file).
    pub async fn open(dir: &Path, id: &str, shown: Vec<Option<ChannelValue>>, fresh: bool) -> Result<Self, ControlError> {
        if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(ControlError::Connector { detail: format!("'{id}' is not a write operation id; nothing was sent") });
        }
        let path = dir.join(format!("{id}.journal"));
        let count = shown.len();
        let (dir_owned, path_owned) = (dir.to_owned(), path.clone());
        let (file, states) =
            tokio::task::spawn_blocking(move || open_locked(&dir_owned, &path_owned, fresh, count)).await.map_err(|error| {
                ControlError::Connector { detail: format!("the write journal could not be opened ({error}); nothing was sent") }
            })??;
        Ok(Self { path, file: Arc::new(Mutex::new(file)), states, shown })
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
        self.append(format!("sending {index} {}\n", now_ms())).await?;
        if let Some(state) = self.states.get_mut(index) {
            *state = JournalState::Sending(Some(SystemTime::now()));
        }
        Ok(())
    }

    /// Records, durably, that write `index` was confirmed.
    pub async fn done(&mut self, index: usize) -> Result<(), ControlError> {
        self.append(format!("done {index}\n")).await?;
        if let Some(state) = self.states.get_mut(index) {
            *state = JournalState::Done;
        }
        Ok(())
    }

    async fn append(&self, line: String) -> Result<(), ControlError> {
        let file = Arc::clone(&self.file);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            // The line is on disk before the write it announces is sent; any failure is an error.
            file.write_all(line.as_bytes()).and_then(|()| file.sync_data()).map_err(|error| journal_error(&path, &error))
        })
        .await
        .map_err(|error| ControlError::Connector {
            detail: format!("the write journal could not be written ({error}); nothing was sent"),
        })?
    }
}

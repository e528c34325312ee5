//! What one request may cost: its body (size, time to send it, and a place among the bodies
//! being read: twice `server.max_turns_in_flight`), its message, and a place among the turns in
//! flight (`server.max_turns_in_flight`); beyond either, a 503 with `Retry-After` before anything
//! starts. Refusals read and drop the rest of a body the client is still
//! sending (up to a bound), so that the client reads the error instead of a broken pipe.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// The default number of turns (chat completions, background tasks and runs) in flight.
pub const DEFAULT_MAX_TURNS_IN_FLIGHT: usize = 256;

/// The default largest message text: 256 KiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The default time a client has to send a request body: 60 s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a 503 tells clients to wait before they try again.
const RETRY_AFTER_SECONDS: u64 = 2;

/// How much of a refused body is read and dropped, at most, so that the client reads the refusal.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;

/// How long a refused body is drained, at most.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Request-body limits.
#[derive(Debug, Clone)]
pub(crate) struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
    /// Bodies being read at once (twice as many as turns may run): the memory they hold is
    /// bounded, and a client that sends a body slowly holds no turn's place.
    pub readers: Arc<Semaphore>,
    /// How many bodies may be read at once.
    pub max_readers: usize,
}

impl BodyLimits {
    pub(crate) fn new(max_bytes: usize, timeout: Duration, readers: usize) -> Self {
        let max_readers = readers.clamp(1, Semaphore::MAX_PERMITS);
        Self { max_bytes, timeout, readers: Arc::new(Semaphore::new(max_readers)), max_readers }
    }
}

/// The body, up to `limits.max_bytes`: 413 beyond (after draining what the client still sends),
/// 408 when it is not all sent within `limits.timeout`, 400 `invalid_body` when it cannot be
/// read (the client stopped sending it, or broke its encoding).
pub(crate) async fn read_body(headers: &HeaderMap, body: Body, limits: &BodyLimits) -> Result<Bytes, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()).and_then(|value| value.parse::<u64>().ok());
    let limit = limits.max_bytes;
    if declared.is_some_and(|length| length > limit as u64) {
        drain(body).await;
        return Err(ApiError::body_too_large(limit));
    }
    let Ok(_reading) = Arc::clone(&limits.readers).try_acquire_owned() else {
        drain(body).await;
        return Err(ApiError::overloaded(limits.max_readers, RETRY_AFTER_SECONDS));
    };
    let mut stream = body.into_data_stream();
    let read = async {
        let mut read = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| ApiError::body_unreadable(&error.to_string()))?;
            if read.len() + chunk.len() > limit {
                return Err(ApiError::body_too_large(limit));
            }
            read.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(read))
    };
    let outcome = match tokio::time::timeout(limits.timeout, read).await {
        Ok(outcome) => outcome,
        Err(_late) => return Err(ApiError::body_timeout(limits.timeout)),
    };
    if let Err(error) = &outcome
        && error.code == Some("request_too_large")
    {
        drain(Body::from_stream(stream)).await;
    }
    outcome
}

/// Reads and drops what is left of a refused body, up to [`DRAIN_LIMIT`] bytes and
/// [`DRAIN_TIME`]: a client still sending then reads the error answer instead of a reset.
pub(crate) async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut dropped = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(chunk)) = stream.next().await {
            dropped = dropped.saturating_add(chunk.len());
            if dropped > DRAIN_LIMIT {
                break;
            }
        }
    })
    .await;
}

/// 413 `message_too_large` when `text` is over `max_bytes`.
pub(crate) fn check_message(text: &str, max_bytes: usize, param: &'static str) -> Result<(), ApiError> {
    if text.len() > max_bytes { Err(ApiError::message_too_large(max_bytes, param)) } else { Ok(()) }
}

/// The places of the turns in flight.
#[derive(Debug)]
pub(crate) struct TurnSlots {
    slots: Arc<Semaphore>,
    max: usize,
}

impl TurnSlots {
    pub(crate) fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self { slots: Arc::new(Semaphore::new(max)), max }
    }

    /// A place for one turn, held until it is dropped; 503 with `Retry-After` when all are taken.
    pub(crate) fn take(&self) -> Result<TurnSlot, ApiError> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => Ok(TurnSlot(permit)),
            Err(_full) => Err(ApiError::overloaded(self.max, RETRY_AFTER_SECONDS)),
        }
    }

    /// How many turns hold a place now.
    pub(crate) fn in_flight(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// A turn's place among those in flight.
#[derive(Debug)]
pub(crate) struct TurnSlot(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> BodyLimits {
        BodyLimits::new(1024, Duration::from_secs(60), 4)
    }

    #[tokio::test]
    async fn a_body_too_large_and_a_body_cut_off_are_told_apart() {
        let cut = Body::from_stream(futures::stream::iter([Ok(Bytes::from_static(b"{\"model\"")), Err(std::io::Error::other("reset"))]));
        let error = read_body(&HeaderMap::new(), cut, &limits()).await.unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (400, Some("invalid_body")), "{error}");
        assert!(!error.message.contains("large"), "{error}");
        let large = Body::from_stream(futures::stream::iter((0..2).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 600])))));
        let error = read_body(&HeaderMap::new(), large, &limits()).await.unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (413, Some("request_too_large")));
        let fits = Body::from_stream(futures::stream::iter((0..2).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 512])))));
        assert_eq!(read_body(&HeaderMap::new(), fits, &limits()).await.unwrap().len(), 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_sent_too_slowly_is_refused_at_its_deadline() {
        let slow = Body::from_stream(futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(61)).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"{}"))
        }));
        let started = tokio::time::Instant::now();
        let error = read_body(&HeaderMap::new(), slow, &limits()).await.unwrap_err();
        assert_eq!((error.status.as_u16(), error.code), (408, Some("request_timeout")));
        assert_eq!(started.elapsed(), limits().timeout);
    }

    #[tokio::test]
    async fn a_refused_body_is_read_to_its_end_so_the_client_can_read_the_answer() {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream_of(receiver));
        let sending = tokio::spawn(async move {
            for _ in 0..8 {
                sender.send(Ok(Bytes::from(vec![b'x'; 600]))).await.unwrap();
            }
        });
        assert_eq!(read_body(&HeaderMap::new(), body, &limits()).await.unwrap_err().code, Some("request_too_large"));
        // Every chunk was taken: the sender, waiting on a channel of one, finished.
        sending.await.unwrap();
    }

    fn tokio_stream_of(
        mut receiver: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
        futures::stream::poll_fn(move |context| receiver.poll_recv(context))
    }

    #[test]
    fn turns_beyond_the_limit_are_refused_with_a_retry_after_until_one_ends() {
        let slots = TurnSlots::new(2);
        let (first, _second) = (slots.take().unwrap(), slots.take().unwrap());
        let refused = slots.take().unwrap_err();
        assert_eq!((refused.status.as_u16(), refused.code, refused.retry_after_seconds), (503, Some("server_overloaded"), Some(2)));
        assert_eq!(slots.in_flight(), 2);
        drop(first);
        assert!(slots.take().is_ok());
    }

    #[test]
    fn messages_over_the_limit_are_refused() {
        assert!(check_message(&"x".repeat(10), 10, "input").is_ok());
        let error = check_message(&"x".repeat(11), 10, "input").unwrap_err();
        assert_eq!((error.status.as_u16(), error.code, error.param), (413, Some("message_too_large"), Some("input")));
    }
}

//! Accepts HTTP/1.1 connections for the router with the bounds a server that anyone on its
//! address can reach needs: a connection must send a whole request head within
//! [`ConnectionLimits::header_timeout`] of opening or of its previous answer (so a client that
//! sends one header line every few seconds, or opens connections and sends nothing, is cut
//! off), a write that makes no progress for [`ConnectionLimits::write_timeout`] closes the
//! connection (a client that stops reading its answers cannot hold it), and at most
//! [`ConnectionLimits::max_connections`] are open at once (further ones wait in the listen
//! backlog). Request bodies have their own deadline where handlers read them.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

/// The default time to send a request head: 30 s.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The default number of open connections: 4,096.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The default time a write may make no progress: 60 s (four keep-alive intervals of a stream).
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Bounds on connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a connection may take to send a request head, counted from its opening or from
    /// the end of its previous answer (an idle keep-alive connection is closed after it too).
    pub header_timeout: Duration,
    /// Connections open at once; the next one is accepted when one closes.
    pub max_connections: usize,
    /// How long a write may make no progress (the client reads nothing) before the connection
    /// is closed.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { header_timeout: DEFAULT_HEADER_TIMEOUT, max_connections: DEFAULT_MAX_CONNECTIONS, write_timeout: DEFAULT_WRITE_TIMEOUT }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled; then stops accepting, lets each
/// connection finish the request it is answering, and returns once all have closed.
pub async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, shutdown: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
        };
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        // Answers are written in small pieces (SSE events); never delay them.
        let _ = stream.set_nodelay(true);
        let stream = StalledWrites::new(stream, limits.write_timeout);
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection whose writes fail with `TimedOut` once one has waited `limit` without progress.
struct StalledWrites {
    stream: TcpStream,
    limit: Duration,
    /// Running while a write waits for the client to read.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StalledWrites {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Self { stream, limit, stalled: None }
    }

    /// `poll` (a write or a flush) unless it has waited too long.
    fn guard<T>(&mut self, context: &mut Context<'_>, poll: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(stalled.as_mut().poll(context));
        Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client read nothing of the answer for too long")))
    }
}

impl AsyncRead for StalledWrites {
    fn poll_read(mut self: Pin<&mut Self>, context: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buf)
    }
}

impl AsyncWrite for StalledWrites {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(context, buf);
        self.guard(context, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(context, bufs);
        self.guard(context, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(context);
        self.guard(context, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_shutdown(context);
        self.guard(context, poll)
    }
}

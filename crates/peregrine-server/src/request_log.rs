//! The request log: one `info` line per HTTP request under the target [`REQUEST_LOG_TARGET`] — method, path
//! (never the query string), status, duration, and for a turn its thread — and never a key, a
//! header or a body.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

/// The `tracing` target of the request lines, so that a log filter can keep them on their own
/// (`peregrine serve` logs them at its default level).
pub const REQUEST_LOG_TARGET: &str = "peregrine_server::request";

/// The most characters of a path a line shows (a client may send any path).
const MAX_PATH_CHARS: usize = 256;

/// The thread a response's turn runs on, put into the response's extensions by its handler for
/// the request log.
#[derive(Debug, Clone)]
pub(crate) struct LoggedThread(pub String);

/// Runs the request, then logs its line once the response's head is ready (a stream's body
/// follows later, so its duration is the time to the first byte).
pub(crate) async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = shown_path(request.uri().path());
    let started = Instant::now();
    let response = next.run(request).await;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let status = response.status().as_u16();
    match response.extensions().get::<LoggedThread>() {
        Some(LoggedThread(thread)) => tracing::info!(target: REQUEST_LOG_TARGET, %method, %path, status, duration_ms, %thread, "request"),
        None => tracing::info!(target: REQUEST_LOG_TARGET, %method, %path, status, duration_ms, "request"),
    }
    response
}

/// `path` cut to [`MAX_PATH_CHARS`] characters.
fn shown_path(path: &str) -> String {
    match path.char_indices().nth(MAX_PATH_CHARS) {
        Some((at, _)) => format!("{}…", &path[..at]),
        None => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_paths_are_cut() {
        assert_eq!(shown_path("/v1/models"), "/v1/models");
        let long = "/x".repeat(200);
        assert_eq!(shown_path(&long).chars().count(), MAX_PATH_CHARS + 1);
        assert!(shown_path(&long).ends_with('…'));
    }
}

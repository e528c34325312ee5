//! The web UI: one self-contained page (HTML, CSS and JavaScript inline, no build step) served
//! at `/`. It talks to the native API (`/threads…`) with the key the person enters, which it
//! keeps in the browser's `localStorage`.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::chat::ServerState;

/// The page.
const INDEX_HTML: &str = include_str!("ui/index.html");

/// `GET /` and `GET /index.html`.
pub(crate) fn routes() -> Router<Arc<ServerState>> {
    Router::new().route("/", get(index)).route("/index.html", get(index))
}

async fn index() -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
        ),
    ];
    (headers, INDEX_HTML).into_response()
}

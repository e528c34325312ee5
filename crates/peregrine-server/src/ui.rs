//! The web UI: one self-contained page (HTML, CSS and JavaScript inline, no build step) served
//! at `/`. It talks to the native API (`/threads…`) with the key the person enters, which it
//! keeps in the browser's `localStorage`.
//!
//! Its Content-Security-Policy allows exactly the page's one inline `<script>`, by the SHA-256 of
//! its text (computed here from the page, so that editing the page cannot break it), instead of
//! `'unsafe-inline'`: an injected script would not run.

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::chat::ServerState;

/// The page.
const INDEX_HTML: &str = include_str!("ui/index.html");

/// The page's Content-Security-Policy.
static CONTENT_SECURITY_POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    // Without a script to hash (it cannot happen: a test reads the page) no script runs.
    let script =
        inline_script(INDEX_HTML).map_or_else(|| "'none'".to_owned(), |script| format!("'sha256-{}'", base64(&Sha256::digest(script))));
    let policy = format!(
        "default-src 'none'; script-src {script}; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    HeaderValue::from_str(&policy).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"))
});

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
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY.clone()),
    ];
    (headers, INDEX_HTML).into_response()
}

/// The text of the page's `<script>` element (between `<script>` and `</script>`, as the
/// browser hashes it).
fn inline_script(html: &str) -> Option<&str> {
    let start = html.find("<script>")? + "<script>".len();
    let end = start + html.get(start..)?.find("</script>")?;
    html.get(start..end)
}

/// Standard base64 with padding (RFC 4648 §4), as a CSP hash source is written.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        for (input, expected) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(input.as_bytes()), expected);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn the_policy_hashes_the_pages_one_script() {
        let script = inline_script(INDEX_HTML).unwrap();
        assert!(script.contains("use strict"));
        let policy = CONTENT_SECURITY_POLICY.to_str().unwrap();
        assert!(policy.contains(&format!("script-src 'sha256-{}';", base64(&Sha256::digest(script)))), "{policy}");
        assert!(!policy.contains("script-src 'unsafe-inline'"), "{policy}");
    }
}

//! The browser guard of a server without keys: such a server obeys whoever can reach it, and a
//! web page the operator visits can reach loopback. It answers only requests addressed to a
//! loopback name (no DNS rebinding), from no browser page or a page of its own origin (or one of
//! `server.allowed_origins`), whose bodies are declared as JSON (a cross-site form or `no-cors`
//! fetch cannot send that without a CORS preflight, which this server never grants to others).
//! A server with keys needs none of this: a page of another origin cannot send the key.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The longest URL any route takes (longer ones get a JSON 414; hyper itself refuses those
/// over 64 KiB, with an empty 414).
const MAX_URI_BYTES: usize = 8 * 1024;

/// Who may talk to a server without keys.
#[derive(Debug, Clone, Default)]
pub(crate) struct BrowserGuard {
    /// Whether the server has keys (then the guard lets everything through).
    keyed: bool,
    /// Normalised `scheme://host[:port]` origins whose pages may use the server.
    allowed_origins: Vec<String>,
}

impl BrowserGuard {
    pub(crate) fn new(keyed: bool, allowed_origins: &[String]) -> Self {
        Self { keyed, allowed_origins: allowed_origins.iter().filter_map(|origin| normalise_origin(origin)).collect() }
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        normalise_origin(origin).is_some_and(|origin| self.allowed_origins.contains(&origin))
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        is_loopback_host(&host)
            || self.allowed_origins.iter().any(|origin| origin.split_once("://").is_some_and(|(_, authority)| authority == host))
    }

    /// Why `request` is refused, if it is.
    fn check(&self, method: &Method, headers: &HeaderMap, uri_host: Option<&str>) -> Result<(), ApiError> {
        if self.keyed {
            return Ok(());
        }
        let host = header_text(headers, header::HOST).or(uri_host).unwrap_or("");
        if !self.host_allowed(host) {
            return Err(ApiError::host_not_allowed(&truncated(host)));
        }
        match header_text(headers, header::ORIGIN) {
            Some(origin) => {
                let same_origin = origin
                    .split_once("://")
                    .is_some_and(|(scheme, authority)| matches!(scheme, "http" | "https") && authority.eq_ignore_ascii_case(host));
                if !same_origin && !self.origin_allowed(origin) {
                    return Err(ApiError::origin_not_allowed(&truncated(origin)));
                }
            }
            // A browser that sent no Origin still says where the request came from.
            None => {
                let fetch_site = header_text(headers, "sec-fetch-site").unwrap_or("none");
                if !matches!(fetch_site, "same-origin" | "none") && !is_safe(method) {
                    return Err(ApiError::origin_not_allowed(&format!("a {fetch_site} page")));
                }
            }
        }
        if !is_safe(method) && has_body(headers) {
            let content_type = header_text(headers, header::CONTENT_TYPE).unwrap_or("");
            let essence = content_type.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                return Err(ApiError::unsupported_media_type(&truncated(content_type)));
            }
        }
        Ok(())
    }
}

/// The middleware: refuses what [`BrowserGuard::check`] refuses, before any handler reads the
/// request.
pub(crate) async fn guard(State(guard): State<Arc<BrowserGuard>>, request: Request, next: Next) -> Response {
    let uri_host = request.uri().authority().map(|authority| authority.as_str().to_owned());
    let checked = if request.uri().to_string().len() > MAX_URI_BYTES {
        Err(ApiError::uri_too_long(MAX_URI_BYTES))
    } else {
        guard.check(request.method(), request.headers(), uri_host.as_deref())
    };
    match checked {
        Ok(()) => next.run(request).await,
        Err(error) => {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), code = ?error.code, "refused a request");
            let mut response = error.into_response();
            // The connection is not reused: the body the client may still send is not read.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn has_body(headers: &HeaderMap) -> bool {
    let length = header_text(headers, header::CONTENT_LENGTH).map(str::trim);
    headers.contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|length| length != "0")
}

fn header_text(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    headers.get(name).map(|value| value.to_str().unwrap_or("\u{fffd}"))
}

/// At most 200 characters of a header quoted in an error.
fn truncated(text: &str) -> String {
    text.chars().take(200).collect()
}

/// `localhost`, `127.x.x.x` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => name,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(digits: &str) -> bool {
    !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|byte| byte.is_ascii_digit())
}

/// `scheme://host[:port]` in lower case without a path or a trailing slash; `None` for what is
/// not an http(s) origin.
pub(crate) fn normalise_origin(origin: &str) -> Option<String> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, authority) = origin.split_once("://")?;
    if !matches!(scheme, "http" | "https") || authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return None;
    }
    Some(origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn code(guard: &BrowserGuard, method: Method, pairs: &[(&'static str, &str)]) -> Option<&'static str> {
        guard.check(&method, &headers(pairs), None).err().and_then(|error| error.code)
    }

    #[test]
    fn a_keyless_server_obeys_only_loopback_hosts_and_its_own_pages() {
        let guard = BrowserGuard::new(false, &["https://ui.example.org/".into()]);
        let json = ("content-type", "application/json; charset=utf-8");
        type Case<'a> = (Method, &'a [(&'static str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (Method::GET, &[("host", "127.0.0.1:8000")], None),
            (Method::GET, &[("host", "localhost")], None),
            (Method::GET, &[("host", "[::1]:8000")], None),
            (Method::GET, &[("host", "127.8.9.1:1")], None),
            (Method::GET, &[("host", "attacker.example:8000")], Some("host_not_allowed")),
            (Method::GET, &[("host", "localhost.attacker.example")], Some("host_not_allowed")),
            (Method::GET, &[("host", "127.0.0.1.nip.io:8000")], Some("host_not_allowed")),
            (Method::GET, &[("host", "[::1]x")], Some("host_not_allowed")),
            (Method::GET, &[], Some("host_not_allowed")),
            (Method::GET, &[("host", "ui.example.org")], None),
            (Method::POST, &[("host", "127.0.0.1:8000"), json, ("content-length", "2")], None),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8000"), json, ("content-length", "2")], None),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("origin", "http://evil.example"), json], Some("origin_not_allowed")),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:3000"), json], Some("origin_not_allowed")),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("origin", "null"), json], Some("origin_not_allowed")),
            (Method::GET, &[("host", "127.0.0.1:8000"), ("origin", "http://evil.example")], Some("origin_not_allowed")),
            (Method::DELETE, &[("host", "127.0.0.1:8000"), ("origin", "http://evil.example")], Some("origin_not_allowed")),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("origin", "https://UI.example.org"), json, ("content-length", "2")], None),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("sec-fetch-site", "cross-site")], Some("origin_not_allowed")),
            (Method::GET, &[("host", "127.0.0.1:8000"), ("sec-fetch-site", "cross-site")], None),
            (
                Method::POST,
                &[("host", "127.0.0.1:8000"), ("content-type", "text/plain"), ("content-length", "28")],
                Some("unsupported_media_type"),
            ),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("content-length", "2")], Some("unsupported_media_type")),
            (
                Method::POST,
                &[("host", "127.0.0.1:8000"), ("content-type", "application/jsonx"), ("transfer-encoding", "chunked")],
                Some("unsupported_media_type"),
            ),
            (Method::POST, &[("host", "127.0.0.1:8000")], None),
            (Method::POST, &[("host", "127.0.0.1:8000"), ("content-length", "0")], None),
        ];
        for (method, pairs, expected) in cases {
            assert_eq!(code(&guard, method.clone(), pairs), *expected, "{method} {pairs:?}");
        }
    }

    #[test]
    fn a_server_with_keys_leaves_it_to_the_keys() {
        let guard = BrowserGuard::new(true, &[]);
        assert_eq!(code(&guard, Method::POST, &[("host", "agent.example"), ("origin", "http://evil.example")]), None);
    }

    #[test]
    fn origins_are_normalised_and_junk_is_dropped() {
        assert_eq!(normalise_origin("HTTPS://Ui.Example.org/").as_deref(), Some("https://ui.example.org"));
        for junk in ["ui.example.org", "ftp://x", "http://", "http://a/b", "http://u@evil", "null"] {
            assert_eq!(normalise_origin(junk), None, "{junk}");
        }
    }
}

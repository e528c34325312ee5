//! API keys: only their SHA-256 digests are kept, a presented key is hashed and compared with
//! every digest in constant time, and the caller is known by its key's digest (which also keeps
//! the conversations of two keys apart).

use axum::http::{HeaderMap, header};
use peregrine_llm::Secret;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// A SHA-256 digest.
pub(crate) type KeyDigest = [u8; 32];

/// Who is calling: the digest of the key they presented, or nobody when the server needs none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The server has no keys.
    Anonymous,
    /// A caller with a valid key.
    Key(KeyDigest),
}

impl Caller {
    /// What the conversation identity is salted with: the key digest in hex, or `anonymous`.
    pub(crate) fn identity(&self) -> String {
        match self {
            Caller::Anonymous => "anonymous".to_owned(),
            Caller::Key(digest) => digest.iter().map(|byte| format!("{byte:02x}")).collect(),
        }
    }

    /// The owner part of the caller's thread ids: the first 12 hex digits of SHA-256 over
    /// `peregrine-thread-owner\n` and [`Caller::identity`]. It names no key (a one-way digest
    /// of a digest) and is only ever shown to the caller it belongs to.
    pub(crate) fn owner_tag(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"peregrine-thread-owner\n");
        hasher.update(self.identity().as_bytes());
        hasher.finalize().iter().take(6).map(|byte| format!("{byte:02x}")).collect()
    }

    /// Whether the caller may see `thread_id`: a thread of its own (`<kind>-<owner tag>-…`), or
    /// any thread when the server has no keys (one user: the terminal's threads show too).
    pub(crate) fn owns(&self, thread_id: &str) -> bool {
        match self {
            Caller::Anonymous => true,
            Caller::Key(_) => thread_id.split('-').nth(1).is_some_and(|owner| owner == self.owner_tag()),
        }
    }
}

/// The keys a server accepts, as digests.
#[derive(Clone, Default)]
pub(crate) struct ApiKeys {
    digests: Vec<KeyDigest>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys").field("count", &self.digests.len()).finish()
    }
}

impl ApiKeys {
    /// Keeps the digests of `keys` (empty strings are no keys).
    pub(crate) fn new(keys: &[Secret]) -> Self {
        let digests = keys.iter().filter(|key| !key.expose().is_empty()).map(|key| digest(key.expose())).collect();
        Self { digests }
    }

    /// Whether requests need a key.
    pub(crate) fn required(&self) -> bool {
        !self.digests.is_empty()
    }

    /// The caller of a request with these headers, or 401.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.digests.is_empty() {
            return Ok(Caller::Anonymous);
        }
        let Some(presented) = bearer_token(headers) else { return Err(ApiError::invalid_api_key(false)) };
        let presented = digest(presented);
        // Look at every key, so the time taken does not tell which one (or whether any) matched.
        let matched = self.digests.iter().fold(false, |found, known| constant_time_eq(known, &presented) | found);
        if matched { Ok(Caller::Key(presented)) } else { Err(ApiError::invalid_api_key(true)) }
    }
}

fn digest(text: &str) -> KeyDigest {
    Sha256::digest(text.as_bytes()).into()
}

fn constant_time_eq(left: &KeyDigest, right: &KeyDigest) -> bool {
    left.iter().zip(right).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn keys_are_checked_by_digest() {
        let keys = ApiKeys::new(&[Secret::new("sk-one"), Secret::new("sk-two")]);
        assert_eq!(keys.authenticate(&headers(Some("Bearer sk-two"))), Ok(Caller::Key(digest("sk-two"))));
        assert_eq!(keys.authenticate(&headers(Some("bearer  sk-one "))), Ok(Caller::Key(digest("sk-one"))));
        for wrong in [None, Some("Bearer"), Some("Bearer sk-three"), Some("Basic sk-one"), Some("sk-one")] {
            let error = keys.authenticate(&headers(wrong)).unwrap_err();
            assert_eq!(error.code, Some("invalid_api_key"), "{wrong:?}");
            assert!(!error.message.contains("sk-"), "{}", error.message);
        }
        assert!(!format!("{keys:?}").contains("sk-"));
    }

    #[test]
    fn no_keys_means_anonymous() {
        assert_eq!(ApiKeys::new(&[]).authenticate(&headers(None)), Ok(Caller::Anonymous));
        assert_eq!(ApiKeys::new(&[Secret::new("")]).authenticate(&headers(Some("Bearer x"))), Ok(Caller::Anonymous));
        assert_eq!(Caller::Anonymous.identity(), "anonymous");
        assert_eq!(Caller::Key([0xab; 32]).identity().len(), 64);
        assert!(Caller::Anonymous.owns("main"), "without keys every thread is the one user's");
    }

    #[test]
    fn threads_belong_to_the_key_that_made_them() {
        let (one, two) = (Caller::Key(digest("sk-one")), Caller::Key(digest("sk-two")));
        let tag = one.owner_tag();
        assert_eq!(tag.len(), 12);
        assert_ne!(tag, two.owner_tag());
        assert!(!one.identity().contains(&tag), "the tag is not a prefix of the key digest");
        assert!(one.owns(&format!("t-{tag}-0123")) && one.owns(&format!("oai-{tag}-abcd")));
        assert!(!two.owns(&format!("t-{tag}-0123")));
        assert!(!one.owns("main") && !one.owns(&tag) && !one.owns(&format!("t-{tag}x-1")));
    }
}

//! The chat completions request: the fields this server reads (every other field is ignored),
//! its validation, and the conversation it belongs to (thread, input text, session).

use axum::http::HeaderMap;
use peregrine_agent::Session;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::error::ApiError;

/// Header with Open WebUI's chat id (sent when `ENABLE_FORWARD_USER_INFO_HEADERS` is on).
pub const CHAT_ID_HEADER: &str = "x-openwebui-chat-id";
/// Header with a client's own conversation id.
pub const SESSION_ID_HEADER: &str = "x-session-id";
/// Header with Open WebUI's user id.
pub const USER_ID_HEADER: &str = "x-openwebui-user-id";
/// The session interface of every request.
pub const INTERFACE: &str = "openwebui";
/// The user id when the request names none.
pub const DEFAULT_USER: &str = "api";

/// The part of a `POST /v1/chat/completions` body the server uses.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatRequest {
    /// Must be the served model id.
    pub model: String,
    /// The conversation so far; the last one is the user's new message.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    /// SSE when true.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage` adds a usage chunk to a stream.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// The end user (OpenAI's abuse-monitoring id; here also the session's user).
    #[serde(default)]
    pub user: Option<String>,
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, …
    #[serde(default)]
    pub role: String,
    /// A string, or an array of parts of which the `text` ones count.
    #[serde(default)]
    pub content: Value,
}

impl ChatMessage {
    /// The message's text: the string, or its text parts joined by newlines.
    fn text(&self) -> Option<String> {
        match &self.content {
            Value::String(text) => Some(text.clone()),
            Value::Array(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect();
                (!texts.is_empty()).then(|| texts.join("\n"))
            }
            _ => None,
        }
    }
}

/// Stream settings.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct StreamOptions {
    /// Send a usage chunk before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

impl ChatRequest {
    /// Parses a body; unknown fields are ignored.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, ApiError> {
        serde_json::from_slice(body).map_err(|error| {
            ApiError::invalid_body(format!("The body is not a chat completions request ({error}); send JSON with 'model' and 'messages'."))
        })
    }

    /// Whether the answer is streamed.
    pub(crate) fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether a streamed answer ends with a usage chunk.
    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|options| options.include_usage) == Some(true)
    }

    /// The first user message's text (the anchor of a conversation that is resent in full).
    fn first_user_text(&self) -> Option<String> {
        self.messages.iter().filter(|message| message.role == "user").find_map(ChatMessage::text)
    }

    /// The conversation of this request from `caller`, or why the messages cannot be used.
    pub(crate) fn conversation(&self, caller: &Caller, headers: &HeaderMap) -> Result<Conversation, ApiError> {
        let Some(last) = self.messages.last() else {
            return Err(ApiError::invalid_messages("'messages' is empty; send at least one user message."));
        };
        if last.role != "user" {
            let role: String = last.role.chars().take(40).collect();
            return Err(ApiError::invalid_messages(format!(
                "The last message has role '{role}'; the last message must be the user's (role 'user') new message."
            )));
        }
        let Some(input) = last.text() else {
            return Err(ApiError::invalid_messages("The last user message has no text; send a string or text content parts."));
        };
        let first = self.first_user_text().unwrap_or_default();
        let user = non_empty(self.user.as_deref());
        let (source, key) = if let Some(chat_id) = header(headers, CHAT_ID_HEADER) {
            ("chat-id", chat_id.to_owned())
        } else if let Some(session_id) = header(headers, SESSION_ID_HEADER) {
            ("session-id", session_id.to_owned())
        } else if let Some(user) = user {
            ("user", format!("{user}\n{first}"))
        } else {
            ("first-message", first)
        };
        let thread_id = thread_id(caller, source, &key);
        let user = user.or_else(|| header(headers, USER_ID_HEADER)).unwrap_or(DEFAULT_USER);
        // Memory is per user id: the caller's key is part of it, so a key can neither read nor
        // write the memories of another key's users by naming them.
        let user_id = match caller {
            Caller::Anonymous => user.to_owned(),
            Caller::Key(_) => format!("{}:{user}", &caller.identity()[..16]),
        };
        Ok(Conversation { thread_id, input, session: Session::new(user_id, INTERFACE) })
    }
}

/// Which agent thread a request continues, what it says, and who says it.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    /// `oai-` + 16 hex digits.
    pub thread_id: String,
    /// The last user message: the turn's input.
    pub input: String,
    /// The session (user id, interface `openwebui`).
    pub session: Session,
}

/// `oai-` + the first 16 hex digits of SHA-256 over `caller`, `source` and `key`, each followed by a newline.
fn thread_id(caller: &Caller, source: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [caller.identity().as_str(), source, key] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().take(8).map(|byte| format!("{byte:02x}")).collect();
    format!("oai-{hex}")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    non_empty(headers.get(name).and_then(|value| value.to_str().ok()))
}

fn non_empty(text: Option<&str>) -> Option<&str> {
    text.map(str::trim).filter(|text| !text.is_empty())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn request(body: Value) -> ChatRequest {
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    fn with_header(name: &'static str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn unknown_fields_are_ignored_and_options_read() {
        let parsed = request(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi", "name": "x"}], "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0.2, "tools": [], "user": null,
        }));
        assert!(parsed.is_stream() && parsed.include_usage());
        let plain = request(json!({"model": "m", "messages": [], "stream": null, "stream_options": null}));
        assert!(!plain.is_stream() && !plain.include_usage());
        assert!(ChatRequest::parse(b"{\"messages\": []}").is_err(), "model is required");
        assert!(ChatRequest::parse(b"not json").is_err());
    }

    #[test]
    fn the_last_message_must_be_a_user_text() {
        let cases = [
            (json!([]), false),
            (json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]), false),
            (json!([{"role": "user", "content": null}]), false),
            (json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), false),
            (json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]), true),
            (json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]), true),
        ];
        for (messages, ok) in cases {
            let result = request(json!({"model": "m", "messages": messages})).conversation(&Caller::Anonymous, &HeaderMap::new());
            assert_eq!(result.is_ok(), ok, "{messages}");
            if let Err(error) = result {
                assert_eq!(error.param, Some("messages"));
            }
        }
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]);
        let conversation = request(json!({"model": "m", "messages": parts})).conversation(&Caller::Anonymous, &HeaderMap::new()).unwrap();
        assert_eq!(conversation.input, "a\nb");
    }

    #[test]
    fn resent_history_keeps_its_thread_and_callers_are_apart() {
        let first = request(json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}));
        let second = request(json!({"model": "m", "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "yes"},
        ]}));
        let none = HeaderMap::new();
        let a = first.conversation(&Caller::Anonymous, &none).unwrap();
        let b = second.conversation(&Caller::Anonymous, &none).unwrap();
        assert_eq!(a.thread_id, b.thread_id);
        assert_eq!(b.input, "yes");
        assert!(a.thread_id.starts_with("oai-") && a.thread_id.len() == 20, "{}", a.thread_id);
        assert_eq!(a.session.user_id.as_deref(), Some(DEFAULT_USER));
        assert_eq!(a.session.interface.as_deref(), Some(INTERFACE));
        let keyed = first.conversation(&Caller::Key([1; 32]), &none).unwrap();
        let other_key = first.conversation(&Caller::Key([2; 32]), &none).unwrap();
        assert_ne!(keyed.thread_id, a.thread_id);
        assert_ne!(keyed.thread_id, other_key.thread_id);
        // Memory is per user id, and a key's users are its own: naming another key's user
        // reaches nothing of theirs.
        let named = request(json!({"model": "m", "user": "alice", "messages": [{"role": "user", "content": "hello"}]}));
        let alice_of_1 = named.conversation(&Caller::Key([1; 32]), &none).unwrap().session.user_id;
        let alice_of_2 = named.conversation(&Caller::Key([2; 32]), &none).unwrap().session.user_id;
        assert_ne!(alice_of_1, alice_of_2);
        assert!(alice_of_1.as_deref().is_some_and(|id| id.ends_with(":alice")), "{alice_of_1:?}");
        assert_ne!(keyed.session.user_id, other_key.session.user_id, "the default user is per key too");
    }

    #[test]
    fn headers_and_user_choose_the_thread_in_order() {
        let body = json!({"model": "m", "user": "ada", "messages": [{"role": "user", "content": "hello"}]});
        let with_user = request(body.clone());
        let anonymous = &Caller::Anonymous;
        let by_chat = with_user.conversation(anonymous, &with_header(CHAT_ID_HEADER, "c1")).unwrap();
        let by_session = with_user.conversation(anonymous, &with_header(SESSION_ID_HEADER, "c1")).unwrap();
        let by_user = with_user.conversation(anonymous, &HeaderMap::new()).unwrap();
        let by_message = request(json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
            .conversation(anonymous, &HeaderMap::new())
            .unwrap();
        let ids = [&by_chat.thread_id, &by_session.thread_id, &by_user.thread_id, &by_message.thread_id];
        for (index, id) in ids.iter().enumerate() {
            assert!(ids.iter().skip(index + 1).all(|other| other != id), "{ids:?}");
        }
        assert_eq!(by_user.session.user_id.as_deref(), Some("ada"));
        let other_chat = request(body).conversation(anonymous, &with_header(CHAT_ID_HEADER, "c2")).unwrap();
        assert_ne!(other_chat.thread_id, by_chat.thread_id);
        let user_header = request(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
            .conversation(anonymous, &with_header(USER_ID_HEADER, "u7"))
            .unwrap();
        assert_eq!(user_header.session.user_id.as_deref(), Some("u7"));
    }
}

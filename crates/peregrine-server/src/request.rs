//! The chat completions request: the fields this server reads (every other field is ignored),
//! the options it refuses, whether it is one of Open WebUI's background tasks, and the
//! conversation it belongs to (thread, input text, session).

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
/// How the prompts of Open WebUI's background tasks (title, tags, follow-ups, search queries,
/// autocompletion, image prompts) begin.
pub(crate) const TASK_PROMPT_PREFIX: &str = "### Task:";

/// The part of a `POST /v1/chat/completions` body the server uses.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatRequest {
    /// Must be the served model id.
    pub model: String,
    /// The conversation so far; the last user message is the new one.
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    /// SSE when true.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage` adds a usage chunk to a stream.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// The end user (OpenAI's abuse-monitoring id; here also the session's user and part of the
    /// conversation's identity). Only a string counts: an object or a number is ignored.
    #[serde(default)]
    user: Option<Value>,
    /// How many choices to generate; only one is offered.
    #[serde(default)]
    n: Option<Value>,
    /// Whether a tool call is forced; the agent calls no client tools.
    #[serde(default)]
    tool_choice: Option<Value>,
    /// Structured output; not offered.
    #[serde(default)]
    response_format: Option<Value>,
    /// Open WebUI's request metadata, when a client passes it on (`task` names a background task).
    #[serde(default)]
    metadata: Option<Value>,
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

    /// The `user` field when it is a non-empty string.
    fn user(&self) -> Option<&str> {
        non_empty(self.user.as_ref().and_then(Value::as_str))
    }

    /// Refuses the options whose answer this server cannot give: more than one choice, a forced
    /// tool call, structured output. Every other option is ignored.
    pub(crate) fn check_supported(&self) -> Result<(), ApiError> {
        if let Some(n) = self.n.as_ref().filter(|n| n.as_f64().is_some_and(|n| n > 1.0)) {
            return Err(ApiError::unsupported_value(
                "n",
                format!("'n' is {n}, but this server returns one choice; send n: 1 or leave it out."),
            ));
        }
        if self.tool_choice.as_ref().is_some_and(forces_a_tool) {
            return Err(ApiError::unsupported_value(
                "tool_choice",
                "'tool_choice' asks for a call of a client tool, but this agent calls no client tools (it answers in text and uses \
                 its own capabilities); send tool_choice 'auto' or 'none', or leave it out.",
            ));
        }
        let format = self.response_format.as_ref().and_then(|format| format.get("type")).and_then(Value::as_str);
        if let Some(kind @ ("json_schema" | "json_object")) = format {
            return Err(ApiError::unsupported_value(
                "response_format",
                format!(
                    "response_format '{kind}' asks for structured output, which this server does not offer (the agent answers in \
                     text); leave response_format out or send {{\"type\": \"text\"}}."
                ),
            ));
        }
        Ok(())
    }

    /// Which background task of Open WebUI this request is, if it is one: `metadata.task` when
    /// the client passes it on, else `task prompt` when the last user message begins with
    /// [`TASK_PROMPT_PREFIX`] (Open WebUI drops `metadata` before it calls a connection).
    pub(crate) fn background_task(&self) -> Option<String> {
        let named = self.metadata.as_ref().and_then(|metadata| metadata.get("task")).and_then(Value::as_str);
        if let Some(task) = non_empty(named) {
            return Some(task.chars().take(60).collect());
        }
        let last_user = self.messages.iter().rev().find(|message| message.role == "user")?.text()?;
        last_user.trim_start().starts_with(TASK_PROMPT_PREFIX).then(|| "task prompt".to_owned())
    }

    /// The messages as they are, for one direct LLM call: `system` and `developer` messages as
    /// system messages, `assistant` ones as the model's, every other role as the user's; messages
    /// without text are left out.
    pub(crate) fn llm_messages(&self) -> Result<Vec<peregrine_llm::ChatMessage>, ApiError> {
        let messages: Vec<peregrine_llm::ChatMessage> = self
            .messages
            .iter()
            .filter_map(|message| {
                let text = message.text()?;
                Some(match message.role.as_str() {
                    "system" | "developer" => peregrine_llm::ChatMessage::system(text),
                    "assistant" => peregrine_llm::ChatMessage::assistant(text),
                    _ => peregrine_llm::ChatMessage::user(text),
                })
            })
            .collect();
        if messages.is_empty() {
            return Err(ApiError::invalid_messages("'messages' has no message with text; send the task's prompt as a user message."));
        }
        Ok(messages)
    }

    /// The turn's input: the last user message, after which only system messages may come.
    fn input(&self) -> Result<String, ApiError> {
        let Some(last) = self.messages.iter().rev().find(|message| message.role != "system") else {
            return Err(ApiError::invalid_messages(if self.messages.is_empty() {
                "'messages' is empty; send at least one user message."
            } else {
                "'messages' has only system messages; add the user's message (role 'user')."
            }));
        };
        if last.role != "user" {
            let role: String = last.role.chars().take(40).collect();
            return Err(ApiError::invalid_messages(format!(
                "The last message has role '{role}'; the last message must be the user's (role 'user') new message, followed by \
                 nothing but system messages."
            )));
        }
        last.text().ok_or_else(|| ApiError::invalid_messages("The last user message has no text; send a string or text content parts."))
    }

    /// The index of the first user message with text (the anchor of a conversation).
    fn first_user_index(&self) -> Option<usize> {
        self.messages.iter().position(|message| message.role == "user" && message.text().is_some())
    }

    /// The first assistant message after the first user message, as the client resends it
    /// (`""` for one without text); `None` while the conversation has no answer yet.
    fn first_answer(&self) -> Option<String> {
        let first_user = self.first_user_index()?;
        let answer = self.messages.iter().skip(first_user + 1).find(|message| message.role == "assistant")?;
        Some(answer.text().unwrap_or_default())
    }

    /// The conversation of this request from `caller`, or why the messages cannot be used.
    pub(crate) fn conversation(&self, caller: &Caller, headers: &HeaderMap) -> Result<Conversation, ApiError> {
        let input = self.input()?;
        let user = self.user();
        let openwebui_user = header(headers, USER_ID_HEADER);
        let (thread_id, first_turn) = if let Some(chat_id) = header(headers, CHAT_ID_HEADER) {
            (header_thread_id(caller, "chat-id", chat_id), None)
        } else if let Some(session_id) = header(headers, SESSION_ID_HEADER) {
            (header_thread_id(caller, "session-id", session_id), None)
        } else {
            let first_message = self.first_user_index().and_then(|index| self.messages[index].text()).unwrap_or_default();
            let exchange = FirstExchange {
                caller: *caller,
                user: user.unwrap_or_default().to_owned(),
                openwebui_user: openwebui_user.unwrap_or_default().to_owned(),
                first_message,
            };
            match self.first_answer() {
                Some(answer) => (exchange.thread_id(&answer), None),
                None => (fresh_thread_id(caller), Some(exchange)),
            }
        };
        let user = user.or(openwebui_user).unwrap_or(DEFAULT_USER);
        // Memory is per user id: the caller's key is part of it, so a key can neither read nor
        // write the memories of another key's users by naming them.
        let user_id = match caller {
            Caller::Anonymous => user.to_owned(),
            Caller::Key(_) => format!("{}:{user}", &caller.identity()[..16]),
        };
        Ok(Conversation { thread_id, first_turn, input, session: Session::new(user_id, INTERFACE) })
    }
}

/// Whether a `tool_choice` forces a tool call: `"required"`, a named function (or any other
/// object), except `allowed_tools` in mode `auto`.
fn forces_a_tool(choice: &Value) -> bool {
    match choice {
        Value::String(mode) => mode == "required",
        Value::Object(object) => {
            object.get("type").and_then(Value::as_str) != Some("allowed_tools")
                || choice.pointer("/allowed_tools/mode").and_then(Value::as_str) != Some("auto")
        }
        _ => false,
    }
}

/// Which agent thread a request continues, what it says, and who says it.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    /// Where the turn runs: `oai-<owner tag>-<16 hex digits>`.
    pub thread_id: String,
    /// For the first turn of a conversation (no answer in its history yet): what derives the id
    /// its thread is filed under once the answer is known. `thread_id` is then a fresh one.
    pub first_turn: Option<FirstExchange>,
    /// The last user message: the turn's input.
    pub input: String,
    /// The session (user id, interface `openwebui`).
    pub session: Session,
}

/// What identifies a conversation without a chat or session id, except its first answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FirstExchange {
    caller: Caller,
    /// The body's `user` string, or empty.
    user: String,
    /// Header `X-OpenWebUI-User-Id`, or empty.
    openwebui_user: String,
    /// The first user message's text.
    first_message: String,
}

impl FirstExchange {
    /// The conversation's thread once `answer` is its first assistant message: `oai-<owner
    /// tag>-` + the first 16 hex digits of SHA-256 over `<caller>\nhistory\n`, then the `user`
    /// field, header `X-OpenWebUI-User-Id`, the first user message and the answer as
    /// [`normalize_answer`] makes it, each as `<UTF-8 byte length>:<text>\n`.
    pub(crate) fn thread_id(&self, answer: &str) -> String {
        let answer = normalize_answer(answer);
        let mut hasher = Sha256::new();
        hasher.update(caller_line(&self.caller));
        hasher.update(b"history\n");
        for part in [self.user.as_str(), self.openwebui_user.as_str(), self.first_message.as_str(), answer.as_str()] {
            hasher.update(format!("{}:", part.len()).as_bytes());
            hasher.update(part.as_bytes());
            hasher.update(b"\n");
        }
        oai_thread_id(&self.caller, &hasher.finalize())
    }
}

/// Ends a first answer whose exchange another conversation of the caller already has, so that
/// the two resend different histories: U+2060 WORD JOINER, then 20 random bits as U+200B (0) and
/// U+200C (1). Invisible, not whitespace (trimming and [`normalize_answer`] keep it), and
/// resent with the text.
pub(crate) fn distinguishing_mark() -> String {
    let bits = uuid::Uuid::new_v4().as_u128();
    std::iter::once('\u{2060}').chain((0..20).map(|bit| if (bits >> bit) & 1 == 1 { '\u{200C}' } else { '\u{200B}' })).collect()
}

/// An answer as the conversation's identity counts it: every thread id (`oai-`, 12 hex digits,
/// `-`, 16 hex digits) made `oai-*`, because a first answer may name its thread (an approval
/// prompt's plan path) and is sent naming the thread it is filed under; then every run of
/// whitespace made one space, trimmed (a client may re-wrap or trim the answer it resends).
pub(crate) fn normalize_answer(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("oai-") {
        masked.push_str(&rest[..at]);
        let candidate = &rest[at..];
        let (kept, after) = if is_thread_id(candidate) { ("oai-*", THREAD_ID_LEN) } else { ("oai-", 4) };
        masked.push_str(kept);
        rest = &candidate[after..];
    }
    masked.push_str(rest);
    masked.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The length of `oai-<12 hex>-<16 hex>`.
const THREAD_ID_LEN: usize = 33;

/// Whether `text` starts with `oai-<12 hex>-<16 hex>`.
fn is_thread_id(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= THREAD_ID_LEN
        && bytes[4..16].iter().all(u8::is_ascii_hexdigit)
        && bytes[16] == b'-'
        && bytes[17..THREAD_ID_LEN].iter().all(u8::is_ascii_hexdigit)
}

fn caller_line(caller: &Caller) -> Vec<u8> {
    format!("{}\n", caller.identity()).into_bytes()
}

/// `oai-<owner tag>-` + the first 16 hex digits of SHA-256 over `caller`, `source` and `key`,
/// each followed by a newline.
fn header_thread_id(caller: &Caller, source: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(caller_line(caller));
    for part in [source, key] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    oai_thread_id(caller, &hasher.finalize())
}

/// A new conversation's thread until its first answer files it: `oai-<owner tag>-` + 16 random
/// hex digits.
fn fresh_thread_id(caller: &Caller) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("oai-{}-{}", caller.owner_tag(), &random[..16])
}

fn oai_thread_id(caller: &Caller, digest: &[u8]) -> String {
    let hex: String = digest.iter().take(8).map(|byte| format!("{byte:02x}")).collect();
    format!("oai-{}-{hex}", caller.owner_tag())
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

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    fn assistant(text: &str) -> Value {
        json!({"role": "assistant", "content": text})
    }

    fn conversation(messages: Value, caller: &Caller, headers: &HeaderMap) -> Conversation {
        request(json!({"model": "m", "messages": messages})).conversation(caller, headers).unwrap()
    }

    fn is_oai_id(id: &str, caller: &Caller) -> bool {
        let Some(rest) = id.strip_prefix(&format!("oai-{}-", caller.owner_tag())) else { return false };
        rest.len() == 16 && rest.chars().all(|c| c.is_ascii_hexdigit())
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
        for ignored in [json!({"id": "u1", "name": "Ada"}), json!(42), json!(""), json!("  ")] {
            let parsed = request(json!({"model": "m", "messages": [user("hi")], "user": ignored}));
            assert_eq!(parsed.user(), None, "{ignored}");
            let session = parsed.conversation(&Caller::Anonymous, &HeaderMap::new()).unwrap().session;
            assert_eq!(session.user_id.as_deref(), Some(DEFAULT_USER), "{ignored}");
        }
    }

    #[test]
    fn the_input_is_the_last_user_message_followed_only_by_system_messages() {
        let system = json!({"role": "system", "content": "context"});
        let cases = [
            (json!([]), None),
            (json!([system]), None),
            (json!([user("hi"), assistant("hello")]), None),
            (json!([user("hi"), {"role": "tool", "content": "42", "tool_call_id": "c"}]), None),
            (json!([user("hi"), assistant("hello"), system]), None),
            (json!([{"role": "user", "content": null}]), None),
            (json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), None),
            (json!([system, user("hi")]), Some("hi")),
            (json!([user("hi"), system]), Some("hi")),
            (json!([user("hi"), assistant("hello"), user("bye"), system, system]), Some("bye")),
            (json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]), Some("a\nb")),
        ];
        for (messages, input) in cases {
            let result = request(json!({"model": "m", "messages": messages})).conversation(&Caller::Anonymous, &HeaderMap::new());
            match (result, input) {
                (Ok(conversation), Some(input)) => assert_eq!(conversation.input, input, "{messages}"),
                (Err(error), None) => assert_eq!(error.param, Some("messages"), "{messages}"),
                (result, _) => panic!("{messages}: {result:?}"),
            }
        }
    }

    #[test]
    fn options_without_an_answer_here_are_refused_by_name() {
        let cases = [
            (json!({"n": 1}), None),
            (json!({"n": null}), None),
            (json!({"n": 2}), Some("n")),
            (json!({"n": 3.0}), Some("n")),
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}]}), None),
            (json!({"tools": [], "tool_choice": "auto"}), None),
            (json!({"tool_choice": "none"}), None),
            (json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}}), None),
            (json!({"tools": [], "tool_choice": "required"}), Some("tool_choice")),
            (json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}), Some("tool_choice")),
            (json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}}}), Some("tool_choice")),
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"response_format": {"type": "json_object"}}), Some("response_format")),
            (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}), Some("response_format")),
        ];
        for (options, refused) in cases {
            let mut body = json!({"model": "m", "messages": [user("hi")]});
            body.as_object_mut().unwrap().extend(options.as_object().unwrap().clone());
            let result = request(body).check_supported();
            assert_eq!(result.as_ref().err().and_then(|error| error.param), refused, "{options}");
            if let Err(error) = result {
                assert_eq!((error.status.as_u16(), error.code), (400, Some("unsupported_value")), "{options}");
            }
        }
    }

    #[test]
    fn background_tasks_are_told_by_metadata_or_their_prompt() {
        let title = "### Task:\nGenerate a concise, 3-5 word title.\n<chat_history>\nUSER: hi\n</chat_history>";
        let cases = [
            (json!({"messages": [user(title)]}), Some("task prompt")),
            (json!({"messages": [{"role": "system", "content": "s"}, user(&format!("\n  {title}"))]}), Some("task prompt")),
            (json!({"messages": [user("hi")], "metadata": {"task": "title_generation"}}), Some("title_generation")),
            (json!({"messages": [user("hi")], "metadata": {"task": ""}}), None),
            (json!({"messages": [user("hi")], "metadata": {"chat_id": "c"}}), None),
            (json!({"messages": [user("What is ### Task: about?")]}), None),
            (json!({"messages": [user(title), assistant("t"), user("hi")]}), None),
        ];
        for (mut body, task) in cases {
            body["model"] = json!("m");
            assert_eq!(request(body.clone()).background_task().as_deref(), task, "{body}");
        }
        let messages = request(json!({"model": "m", "messages": [
            {"role": "developer", "content": "d"}, user("u"), assistant("a"), {"role": "tool", "content": "t"}, {"role": "user", "content": null},
        ]}))
        .llm_messages()
        .unwrap();
        let roles: Vec<_> = messages.iter().map(|message| (message.role, message.content.as_str())).collect();
        use peregrine_llm::ChatRole::{Assistant, System, User};
        assert_eq!(roles, [(System, "d"), (User, "u"), (Assistant, "a"), (User, "t")]);
        assert!(request(json!({"model": "m", "messages": []})).llm_messages().is_err());
    }

    #[test]
    fn a_new_conversation_runs_on_a_fresh_thread_filed_under_its_first_exchange() {
        let none = HeaderMap::new();
        let anonymous = Caller::Anonymous;
        let first = conversation(json!([user("hi")]), &anonymous, &none);
        let again = conversation(json!([user("hi")]), &anonymous, &none);
        assert_ne!(first.thread_id, again.thread_id, "two chats that both start with 'hi' are two conversations");
        assert!(is_oai_id(&first.thread_id, &anonymous), "{}", first.thread_id);
        let exchange = first.first_turn.clone().expect("a first turn is filed");
        assert_eq!(exchange, again.first_turn.clone().unwrap(), "both derive from the same anchor");

        // The answer as the client resends it (status lines included) finds the filed thread.
        let answer = "> planning…\n\nHello! How can I help?";
        let later =
            conversation(json!([{"role": "system", "content": "s"}, user("hi"), assistant(answer), user("weather?")]), &anonymous, &none);
        assert_eq!(later.thread_id, exchange.thread_id(answer));
        assert!(later.first_turn.is_none() && is_oai_id(&later.thread_id, &anonymous));
        assert_eq!(later.input, "weather?");
        let further =
            conversation(json!([user("hi"), assistant(answer), user("weather?"), assistant("sunny"), user("thanks")]), &anonymous, &none);
        assert_eq!(further.thread_id, later.thread_id, "only the first exchange counts");
        let rewrapped =
            conversation(json!([user("hi"), assistant(" > planning…\n\nHello!  How can\nI help? \n"), user("x")]), &anonymous, &none);
        assert_eq!(rewrapped.thread_id, later.thread_id, "whitespace does not count");
        let other_answer = conversation(json!([user("hi"), assistant("Hi there."), user("weather?")]), &anonymous, &none);
        assert_ne!(other_answer.thread_id, later.thread_id);
        let other_first = conversation(json!([user("hello"), assistant(answer), user("weather?")]), &anonymous, &none);
        assert_ne!(other_first.thread_id, later.thread_id);
        // An assistant greeting before the first user message does not make a history.
        let greeted = conversation(json!([assistant("Welcome!"), user("hi")]), &anonymous, &none);
        assert!(greeted.first_turn.is_some());
    }

    #[test]
    fn the_identity_holds_the_caller_and_the_user() {
        let none = HeaderMap::new();
        let history = json!([user("hi"), assistant("Hello"), user("weather?")]);
        let (one, two) = (Caller::Key([1; 32]), Caller::Key([2; 32]));
        let anonymous = conversation(history.clone(), &Caller::Anonymous, &none);
        let keyed = conversation(history.clone(), &one, &none);
        let other_key = conversation(history.clone(), &two, &none);
        assert!(is_oai_id(&keyed.thread_id, &one) && is_oai_id(&other_key.thread_id, &two));
        assert_ne!(keyed.thread_id, anonymous.thread_id);
        let by_user = |user_field: Value, headers: &HeaderMap| {
            request(json!({"model": "m", "user": user_field, "messages": history})).conversation(&one, headers).unwrap()
        };
        let ada = by_user(json!("ada"), &none);
        let bob = by_user(json!("bob"), &none);
        let webui_ada = by_user(Value::Null, &with_header(USER_ID_HEADER, "ada"));
        let webui_bob = by_user(Value::Null, &with_header(USER_ID_HEADER, "bob"));
        let ids = [&keyed.thread_id, &ada.thread_id, &bob.thread_id, &webui_ada.thread_id, &webui_bob.thread_id];
        for (index, id) in ids.iter().enumerate() {
            assert!(ids.iter().skip(index + 1).all(|other| other != id), "{ids:?}");
        }
        assert_eq!(by_user(json!(7), &none).thread_id, keyed.thread_id, "a user that is not a string is ignored");
        // The parts are length-prefixed: moving text from one part to the next changes the id.
        let exchange = |user: &str, first_message: &str| FirstExchange {
            caller: one,
            user: user.into(),
            openwebui_user: String::new(),
            first_message: first_message.into(),
        };
        assert_ne!(exchange("a\n1:b", "c").thread_id("x"), exchange("a", "b\n1:c").thread_id("x"));

        // Memory is per user id, and a key's users are its own: naming another key's user
        // reaches nothing of theirs.
        assert!(ada.session.user_id.as_deref().is_some_and(|id| id.ends_with(":ada")), "{:?}", ada.session.user_id);
        let ada_of_two = request(json!({"model": "m", "user": "ada", "messages": history})).conversation(&two, &none).unwrap();
        assert_ne!(ada.session.user_id, ada_of_two.session.user_id);
        assert_ne!(keyed.session.user_id, other_key.session.user_id, "the default user is per key too");
        assert_eq!(anonymous.session.user_id.as_deref(), Some(DEFAULT_USER));
        assert_eq!(anonymous.session.interface.as_deref(), Some(INTERFACE));
        assert!(webui_ada.session.user_id.as_deref().is_some_and(|id| id.ends_with(":ada")));
    }

    #[test]
    fn answers_count_without_thread_ids_and_whitespace_but_with_marks() {
        let id_a = "oai-0123456789ab-0123456789abcdef";
        let id_b = "oai-0123456789ab-fedcba9876543210";
        let prompt = |id: &str| format!("Approve?\n\n_The plan is saved at `/data/pending_plans/{id}/pending.json`._ ");
        assert_eq!(normalize_answer(&prompt(id_a)), normalize_answer(&prompt(id_b)));
        assert_eq!(normalize_answer(&prompt(id_a)), "Approve? _The plan is saved at `/data/pending_plans/oai-*/pending.json`._");
        for kept in ["oai-", "oai-0123456789ab-0123", "xoai-zz", "oai-0123456789ab_0123456789abcdef", "naïve oai-ü"] {
            assert_eq!(normalize_answer(kept), kept, "not a thread id");
        }
        let mark = distinguishing_mark();
        assert_eq!(mark.chars().count(), 21);
        assert!(mark.chars().all(|c| !c.is_whitespace() && matches!(c, '\u{2060}' | '\u{200B}' | '\u{200C}')), "{mark:?}");
        let answer = "Hello! How can I help?";
        assert_eq!(normalize_answer(&format!("{answer}{mark}\n")), format!("{answer}{mark}"), "trimming keeps the mark");
        let exchange =
            FirstExchange { caller: Caller::Anonymous, user: String::new(), openwebui_user: String::new(), first_message: "hi".into() };
        let marks: std::collections::HashSet<String> =
            (0..8).map(|_| exchange.thread_id(&format!("{answer}{}", distinguishing_mark()))).collect();
        assert!(marks.len() > 1 && !marks.contains(&exchange.thread_id(answer)), "a mark makes another id");
    }

    #[test]
    fn chat_and_session_headers_name_the_thread_first() {
        let anonymous = &Caller::Anonymous;
        let new_chat = json!([user("hello")]);
        let by_chat = conversation(new_chat.clone(), anonymous, &with_header(CHAT_ID_HEADER, "c1"));
        let by_chat_later = conversation(json!([user("hello"), assistant("hi"), user("x")]), anonymous, &with_header(CHAT_ID_HEADER, "c1"));
        let by_session = conversation(new_chat.clone(), anonymous, &with_header(SESSION_ID_HEADER, "c1"));
        let other_chat = conversation(new_chat, anonymous, &with_header(CHAT_ID_HEADER, "c2"));
        assert_eq!(by_chat.thread_id, by_chat_later.thread_id);
        assert!(by_chat.first_turn.is_none() && by_session.first_turn.is_none(), "nothing to file");
        assert_ne!(by_chat.thread_id, by_session.thread_id);
        assert_ne!(by_chat.thread_id, other_chat.thread_id);
        // The ids of chat-id threads are those of earlier versions: SHA-256 over caller, source and id.
        let mut hasher = Sha256::new();
        hasher.update(b"anonymous\nchat-id\nc1\n");
        assert_eq!(by_chat.thread_id, oai_thread_id(anonymous, &hasher.finalize()));
    }
}

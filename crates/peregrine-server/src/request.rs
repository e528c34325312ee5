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
/// How the prompts of most of Open WebUI's background tasks (title, tags, follow-ups, search
/// queries, autocompletion, image prompts) begin.
pub(crate) const TASK_PROMPT_PREFIX: &str = "### Task:";
/// Open WebUI's background task names (its `TASKS`, as `metadata.task` holds them), but
/// `function_calling`, whose prompt is a conversation's.
pub(crate) const TASK_NAMES: [&str; 8] = [
    "title_generation",
    "tags_generation",
    "follow_up_generation",
    "query_generation",
    "emoji_generation",
    "autocomplete_generation",
    "image_prompt_generation",
    "moa_response_generation",
];
/// The prefixes of Open WebUI's chat ids that name no stored chat (its `NON_SAVED_CHAT_ID_PREFIXES`:
/// temporary chats, `temporary:<socket id>` since 0.12 and `local:<socket id>` before, and
/// channels): such an id counts as absent.
const UNSTORED_CHAT_PREFIXES: [&str; 3] = ["temporary:", "local:", "channel:"];
/// Open WebUI's emoji template (`DEFAULT_EMOJI_GENERATION_PROMPT_TEMPLATE`, asked in voice mode)
/// before its `{{prompt}}`; the prompt is followed by [`EMOJI_TEMPLATE_END`] and nothing else.
const EMOJI_TEMPLATE_START: &str = "Your task is to reflect the speaker's likely facial expression through a fitting emoji. \
    Interpret emotions from the message and reflect their facial expression using fitting, diverse emojis (e.g., 😊, 😢, 😡, 😱).\n\n\
    Message: ```";
/// What ends Open WebUI's emoji prompt, after the message.
const EMOJI_TEMPLATE_END: &str = "```";
/// Open WebUI's mixture-of-agents template (`DEFAULT_MOA_GENERATION_PROMPT_TEMPLATE`) before
/// its `{{prompt}}`.
const MOA_TEMPLATE_START: &str = "You have been provided with a set of responses from various models to the latest user query: \"";
/// The MoA template between `{{prompt}}` and the space before `{{responses}}` (the models'
/// answers, each in triple quotes, separated by blank lines).
const MOA_TEMPLATE_INSTRUCTIONS: &str = "\"\n\nYour task is to synthesize these responses into a single, high-quality response. \
    It is crucial to critically evaluate the information provided in these responses, recognizing that some of it may be biased \
    or incorrect. Your response should not simply replicate the given answers but should offer a refined, accurate, and \
    comprehensive reply to the instruction. Ensure your response is well-structured, coherent, and adheres to the highest \
    standards of accuracy and reliability.\n\nResponses from models:";
/// How Open WebUI quotes each model's answer in a MoA prompt.
const MOA_RESPONSE_QUOTES: &str = "\"\"\"";

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

    /// The background task of Open WebUI this request is, if it is one: a request whose
    /// `metadata.task` is one of [`TASK_NAMES`] (a client that passes Open WebUI's metadata on),
    /// or whose only message but system / developer ones is a user message built from one of
    /// Open WebUI's task templates (see [`task_template`]). Its prompt is that message (for
    /// `metadata.task`, the last user message); nothing else is forwarded.
    pub(crate) fn background_task(&self) -> Option<BackgroundTask> {
        let named = non_empty(self.metadata.as_ref().and_then(|metadata| metadata.get("task")).and_then(Value::as_str));
        if let Some(task) = named.filter(|task| TASK_NAMES.contains(task)) {
            let prompt = self.messages.iter().rev().find(|message| message.role == "user")?.text()?;
            return Some(BackgroundTask { name: task.to_owned(), prompt });
        }
        let mut others = self.messages.iter().filter(|message| !is_instruction(&message.role));
        let (Some(only), None) = (others.next(), others.next()) else { return None };
        let prompt = only.text().filter(|_| only.role == "user")?;
        let name = task_template(&prompt)?;
        Some(BackgroundTask { name: name.to_owned(), prompt })
    }

    /// What the request asks of its conversation: the last message but system and developer
    /// ones is the user's new message, or the assistant's answer to continue (Open WebUI's
    /// "Continue Response" resends the history up to the answer, which may have been cut off).
    fn input(&self) -> Result<TurnInput, ApiError> {
        let Some(last) = self.messages.iter().rev().find(|message| !is_instruction(&message.role)) else {
            return Err(ApiError::invalid_messages(if self.messages.is_empty() {
                "'messages' is empty; send at least one user message."
            } else {
                "'messages' has only system or developer messages; add the user's message (role 'user')."
            }));
        };
        match last.role.as_str() {
            "user" => last
                .text()
                .map(TurnInput::Message)
                .ok_or_else(|| ApiError::invalid_messages("The last user message has no text; send a string or text content parts.")),
            "assistant" => Ok(TurnInput::Continue {
                shown: last.text().is_some_and(|text| !normalize_answer(&without_reasoning_blocks(&text)).is_empty()),
            }),
            role => {
                let role: String = role.chars().take(40).collect();
                Err(ApiError::invalid_messages(format!(
                    "The last message has role '{role}'; the last message must be the user's (role 'user') new message, or the \
                     assistant's answer to continue it, followed by nothing but system or developer messages."
                )))
            }
        }
    }

    /// The conversation's last answer before the new message, as the client shows it (reasoning
    /// blocks removed): what the person saw when they wrote the message. A message answers a
    /// pending approval only when this holds its question.
    fn shown(&self) -> Option<String> {
        let last_user = self.messages.iter().rposition(|message| message.role == "user")?;
        let answer = self.messages[..last_user].iter().rev().find(|message| message.role == "assistant")?;
        Some(without_reasoning_blocks(&answer.text()?))
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

    /// The nonce of the first whole mark in the assistant messages, in order (any of a
    /// conversation's answers carries it, so a history the client cut to its last messages
    /// still has it).
    fn marked_nonce(&self) -> Option<Nonce> {
        self.messages.iter().filter(|message| message.role == "assistant").find_map(|message| Nonce::find(&message.text()?))
    }

    /// The conversation of this request from `caller`, or why the messages cannot be used.
    pub(crate) fn conversation(&self, caller: &Caller, headers: &HeaderMap) -> Result<Conversation, ApiError> {
        let input = self.input()?;
        let user = self.user();
        let openwebui_user = header(headers, USER_ID_HEADER);
        let people = People { caller: *caller, user: user.unwrap_or_default(), openwebui_user: openwebui_user.unwrap_or_default() };
        let chat_id = header(headers, CHAT_ID_HEADER).filter(|id| !UNSTORED_CHAT_PREFIXES.iter().any(|prefix| id.starts_with(prefix)));
        let (thread_id, identity, mark) = if let Some(chat_id) = chat_id {
            (people.thread_id("chat-id", &[chat_id]), Identity::ChatId, None)
        } else if let Some(session_id) = header(headers, SESSION_ID_HEADER) {
            (people.thread_id("session-id", &[session_id]), Identity::SessionId, None)
        } else if let Some(nonce) = self.marked_nonce() {
            (people.nonce_thread_id(nonce), Identity::Mark, Some(nonce.mark()))
        } else {
            match self.first_answer() {
                None => {
                    let nonce = Nonce::random();
                    (people.nonce_thread_id(nonce), Identity::New, Some(nonce.mark()))
                }
                Some(answer) => {
                    let first_message = self.first_user_index().and_then(|index| self.messages[index].text()).unwrap_or_default();
                    (people.history_thread_id(&first_message, &answer), Identity::History, None)
                }
            }
        };
        let user = user.or(openwebui_user).unwrap_or(DEFAULT_USER);
        // Memory is per user id: the caller's key is part of it, so a key can neither read nor
        // write the memories of another key's users by naming them.
        let user_id = match caller {
            Caller::Anonymous => user.to_owned(),
            Caller::Key(_) => format!("{}:{user}", &caller.identity()[..16]),
        };
        Ok(Conversation { thread_id, identity, mark, input, shown: self.shown(), session: Session::new(user_id, INTERFACE) })
    }
}

/// `text` without the reasoning blocks Open WebUI renders (`<details type="reasoning" …>` …
/// `</details>`; a block left open runs to the end): what of an answer is its text.
fn without_reasoning_blocks(text: &str) -> String {
    const OPEN: &str = "<details type=\"reasoning\"";
    const CLOSE: &str = "</details>";
    let mut kept = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        kept.push_str(&rest[..start]);
        rest = rest[start..].find(CLOSE).map_or("", |end| &rest[start + end + CLOSE.len()..]);
    }
    kept.push_str(rest);
    kept
}

/// Whether messages of `role` only instruct the model (the agent has its own prompts).
fn is_instruction(role: &str) -> bool {
    matches!(role, "system" | "developer")
}

/// The task whose Open WebUI template `prompt` was built from, if it was built from one (leading
/// and trailing whitespace aside): `task prompt` for one that begins with [`TASK_PROMPT_PREFIX`]
/// and holds a `<chat_history>` … `</chat_history>` block (titles, tags, follow-ups, search
/// queries, autocompletion, image prompts; Open WebUI's RAG template, a question about files,
/// knowledge or a web search, has no history), `emoji_generation` for the emoji template and
/// `moa_response_generation` for the mixture-of-agents template. Each of the last two must be
/// the template's whole fixed text around its placeholders, so a user's message that merely
/// quotes or resembles one is not mistaken for it.
fn task_template(prompt: &str) -> Option<&'static str> {
    let text = prompt.trim();
    if text.starts_with(TASK_PROMPT_PREFIX) && holds_chat_history(text) {
        Some("task prompt")
    } else if is_emoji_prompt(text) {
        Some("emoji_generation")
    } else if is_moa_prompt(text) {
        Some("moa_response_generation")
    } else {
        None
    }
}

/// Whether `text` is Open WebUI's emoji template around a message: [`EMOJI_TEMPLATE_START`], the
/// message, [`EMOJI_TEMPLATE_END`].
fn is_emoji_prompt(text: &str) -> bool {
    text.strip_prefix(EMOJI_TEMPLATE_START).is_some_and(|message| message.ends_with(EMOJI_TEMPLATE_END))
}

/// Whether `text` is Open WebUI's MoA template around a query and the models' responses:
/// [`MOA_TEMPLATE_START`], the query, [`MOA_TEMPLATE_INSTRUCTIONS`], then nothing (`text` is
/// trimmed, and so is the space before an empty `{{responses}}`) or a space and the responses,
/// which begin and end with [`MOA_RESPONSE_QUOTES`]. The query may itself hold the instructions'
/// text, so every place they occur is tried.
fn is_moa_prompt(text: &str) -> bool {
    let Some(rest) = text.strip_prefix(MOA_TEMPLATE_START) else { return false };
    rest.match_indices(MOA_TEMPLATE_INSTRUCTIONS).any(|(at, instructions)| {
        let after = &rest[at + instructions.len()..];
        after.is_empty()
            || after.strip_prefix(' ').is_some_and(|responses| {
                responses.len() >= 2 * MOA_RESPONSE_QUOTES.len()
                    && responses.starts_with(MOA_RESPONSE_QUOTES)
                    && responses.ends_with(MOA_RESPONSE_QUOTES)
            })
    })
}

/// Whether `text` holds a chat history as Open WebUI's task templates put it: `<chat_history>`,
/// then `</chat_history>`.
fn holds_chat_history(text: &str) -> bool {
    text.find("<chat_history>").is_some_and(|at| text[at..].contains("</chat_history>"))
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

/// One of Open WebUI's background tasks: answered by one LLM call with its prompt alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BackgroundTask {
    /// `metadata.task` (one of [`TASK_NAMES`]), or what [`task_template`] found.
    pub name: String,
    /// The user message forwarded to the model.
    pub prompt: String,
}

/// What a request asks of its conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnInput {
    /// A new turn: the last user message.
    Message(String),
    /// Finish the conversation's cut-off turn: the history ends with the assistant's answer.
    Continue {
        /// Whether the answer being continued shows any text (not only invisible characters and
        /// whitespace, such as a bare mark).
        shown: bool,
    },
}

/// Which agent thread a request continues, what it says, and who says it.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    /// Where the turn runs: `oai-<owner tag>-<16 hex digits>`.
    pub thread_id: String,
    /// How `thread_id` was found.
    pub identity: Identity,
    /// For a conversation known by its nonce (new, or found by its mark): the [`Nonce::mark`]
    /// that opens every answer, from which the conversation's later requests derive `thread_id`
    /// again.
    pub mark: Option<String>,
    /// The turn's input: the last user message, or a continuation of the cut-off turn.
    pub input: TurnInput,
    /// The conversation's last answer before the new message, as the client shows it.
    pub shown: Option<String>,
    /// The session (user id, interface `openwebui`).
    pub session: Session,
}

/// How a request's thread was found (for the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// Header `X-OpenWebUI-Chat-Id`.
    ChatId,
    /// Header `X-Session-Id`.
    SessionId,
    /// A new conversation: a fresh nonce.
    New,
    /// The nonce marked in an answer.
    Mark,
    /// The first exchange, for a history whose answers hold no mark.
    History,
}

/// Who a conversation belongs to.
#[derive(Debug, Clone, Copy)]
struct People<'a> {
    caller: Caller,
    /// The body's `user` string, or empty.
    user: &'a str,
    /// Header `X-OpenWebUI-User-Id`, or empty.
    openwebui_user: &'a str,
}

impl People<'_> {
    /// The thread of the conversation whose first answer carries `nonce`: `oai-<owner tag>-` +
    /// the first 16 hex digits of SHA-256 over `<caller>\nnonce\n` and the `user` field, header
    /// `X-OpenWebUI-User-Id` and the nonce in 16 hex digits, each as `<UTF-8 byte length>:<text>\n`.
    fn nonce_thread_id(&self, nonce: Nonce) -> String {
        self.thread_id("nonce", &[&format!("{:016x}", nonce.0)])
    }

    /// The thread of a conversation whose answers hold no mark (a client dropped it): as
    /// [`People::nonce_thread_id`] with `history` for `nonce` and the first user message and
    /// the first answer as [`normalize_answer`] makes it for the nonce.
    fn history_thread_id(&self, first_message: &str, answer: &str) -> String {
        self.thread_id("history", &[first_message, &normalize_answer(answer)])
    }

    /// `oai-<owner tag>-` + the first 16 hex digits of SHA-256 over `<caller>\n<kind>\n` and the
    /// `user` field, header `X-OpenWebUI-User-Id` and `parts`, each as `<UTF-8 byte length>:<text>\n`.
    fn thread_id(&self, kind: &str, parts: &[&str]) -> String {
        let mut hasher = Sha256::new();
        hasher.update(caller_line(&self.caller));
        hasher.update(format!("{kind}\n").as_bytes());
        for part in [self.user, self.openwebui_user].iter().chain(parts) {
            hasher.update(format!("{}:", part.len()).as_bytes());
            hasher.update(part.as_bytes());
            hasher.update(b"\n");
        }
        oai_thread_id(&self.caller, &hasher.finalize())
    }
}

/// The random number a new conversation is known by: its first answer carries it as an
/// invisible [`Nonce::mark`], which the client resends with the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nonce(pub(crate) u64);

/// Begins a mark: U+2060 WORD JOINER.
const MARK_START: char = '\u{2060}';
/// A 0 bit of a mark: U+200B ZERO WIDTH SPACE.
const MARK_ZERO: char = '\u{200B}';
/// A 1 bit of a mark: U+200C ZERO WIDTH NON-JOINER.
const MARK_ONE: char = '\u{200C}';
/// The bits a mark holds.
const MARK_BITS: usize = 64;

impl Nonce {
    /// A fresh nonce: 64 random bits.
    pub(crate) fn random() -> Self {
        // A v4 UUID has 122 random bits; its halves' fixed bits are at different places, so
        // their XOR is random throughout.
        let bits = uuid::Uuid::new_v4().as_u128();
        Self((bits >> 64) as u64 ^ bits as u64)
    }

    /// The nonce as text that shows nothing: U+2060 WORD JOINER, then its 64 bits (most
    /// significant first) as U+200B (0) and U+200C (1). Not whitespace, so trimming keeps it.
    pub(crate) fn mark(self) -> String {
        std::iter::once(MARK_START)
            .chain((0..MARK_BITS).rev().map(|bit| if (self.0 >> bit) & 1 == 1 { MARK_ONE } else { MARK_ZERO }))
            .collect()
    }

    /// The nonce of the first whole mark in `text`. Whitespace between its characters is
    /// skipped (a client that re-wraps the text it resends may put line breaks there).
    pub(crate) fn find(text: &str) -> Option<Self> {
        text.match_indices(MARK_START).find_map(|(at, start)| {
            let mut bits = text[at + start.len()..].chars().filter(|c| !c.is_whitespace());
            let mut value = 0u64;
            for _ in 0..MARK_BITS {
                value = (value << 1)
                    | match bits.next()? {
                        MARK_ZERO => 0,
                        MARK_ONE => 1,
                        _ => return None,
                    };
            }
            Some(Self(value))
        })
    }
}

/// A first answer as the fallback identity counts it: without invisible characters (a client
/// that dropped the mark may have dropped others), every run of whitespace made one space,
/// trimmed (a client may re-wrap or trim the answer it resends).
pub(crate) fn normalize_answer(text: &str) -> String {
    let visible: String = text.chars().filter(|c| !matches!(c, '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}')).collect();
    visible.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn caller_line(caller: &Caller) -> Vec<u8> {
    format!("{}\n", caller.identity()).into_bytes()
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
    fn the_input_is_the_last_user_message_or_the_answer_to_continue_followed_only_by_system_messages() {
        let system = json!({"role": "system", "content": "context"});
        let message = |text: &str| Some(TurnInput::Message(text.to_owned()));
        let (shown, bare) = (Some(TurnInput::Continue { shown: true }), Some(TurnInput::Continue { shown: false }));
        let mark = Nonce(9).mark();
        let details =
            "<details type=\"reasoning\" done=\"true\" duration=\"1\">\n<summary>Thought for 1 seconds</summary>\n> planning…\n</details>";
        let cases = [
            (json!([]), None),
            (json!([system]), None),
            (json!([user("hi"), {"role": "tool", "content": "42", "tool_call_id": "c"}]), None),
            (json!([{"role": "user", "content": null}]), None),
            (json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), None),
            (json!([system, user("hi")]), message("hi")),
            (json!([user("hi"), system]), message("hi")),
            (json!([user("hi"), {"role": "developer", "content": "d"}, system]), message("hi")),
            (json!([user("hi"), assistant("hello"), user("bye"), system, system]), message("bye")),
            (json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]), message("a\nb")),
            // Open WebUI's "Continue Response": the history ends with the answer to continue.
            (json!([user("hi"), assistant("hello")]), shown.clone()),
            (json!([user("hi"), assistant("hello"), system]), shown.clone()),
            (json!([user("hi"), assistant(&format!("{mark}\n\n{details}\nThe weather"))]), shown),
            (json!([user("hi"), assistant(&format!("{mark}\n\n"))]), bare.clone()),
            (json!([user("hi"), {"role": "assistant", "content": null}]), bare),
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
    fn a_reasoning_block_in_an_answer_neither_hides_its_mark_nor_becomes_the_input() {
        // An answer as a client that keeps Open WebUI's rendered reasoning block resends it:
        // the mark, the block with the progress, the answer.
        let none = HeaderMap::new();
        let mark = Nonce(0x0bad_cafe).mark();
        let details = "<details type=\"reasoning\" done=\"true\" duration=\"0\">\n<summary>Thought for 0 seconds</summary>\n\
                       > planning…\n> step 1/2 current_weather…\n</details>";
        let answer = format!("{mark}\n{details}\nIt is 12 °C in Prague.");
        let asked = conversation(json!([user("weather?"), assistant(&answer), user("and tomorrow?")]), &Caller::Anonymous, &none);
        assert_eq!((asked.identity, asked.mark.as_ref()), (Identity::Mark, Some(&mark)));
        assert_eq!(asked.input, TurnInput::Message("and tomorrow?".to_owned()));
        let continued = conversation(json!([user("weather?"), assistant(&answer)]), &Caller::Anonymous, &none);
        assert_eq!((continued.thread_id.as_str(), continued.input), (asked.thread_id.as_str(), TurnInput::Continue { shown: true }));
        // Stopped while the agent worked: the block alone after the mark.
        let stopped = conversation(json!([user("weather?"), assistant(&format!("{mark}\n{details}"))]), &Caller::Anonymous, &none);
        assert_eq!((stopped.thread_id.as_str(), stopped.input), (asked.thread_id.as_str(), TurnInput::Continue { shown: false }));
        assert_eq!(without_reasoning_blocks(&format!("a{details}b{details}")), "ab");
        assert_eq!(without_reasoning_blocks("a<details type=\"reasoning\">\n> planning…"), "a", "a block cut off");
        assert_eq!(without_reasoning_blocks("a <details>b</details>"), "a <details>b</details>", "other blocks are text");
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
    fn background_tasks_are_one_task_prompt_or_named_by_metadata() {
        let title = "### Task:\nGenerate a concise, 3-5 word title.\n<chat_history>\nUSER: hi\n</chat_history>";
        let rag = "### Task:\nRespond to the user query using the provided context.\n\n<context>\n<source id=\"1\">Prague: 12 °C</source>\n\
                   </context>\n\nWhat's the weather in Prague?";
        let system = json!({"role": "system", "content": "s"});
        let developer = json!({"role": "developer", "content": "d"});
        let task = |prompt: &str| Some(("task prompt".to_owned(), prompt.to_owned()));
        let cases = [
            (json!({"messages": [user(title)]}), task(title)),
            (json!({"messages": [user(&format!("\n  {title}"))]}), task(&format!("\n  {title}"))),
            // A model with a system prompt in Open WebUI gets it in its task requests too: not forwarded.
            (json!({"messages": [system, developer, user(title)]}), task(title)),
            (json!({"messages": [user(title), system]}), task(title)),
            // A question about files, knowledge or a web search (the RAG template) is a turn, and
            // so is any `### Task:` message without a chat history.
            (json!({"messages": [user(rag)]}), None),
            (json!({"messages": [user("### Task:\nTell me a joke about clouds.")]}), None),
            (json!({"messages": [user("### Task:\n<chat_history>\nUSER: hi")]}), None),
            (json!({"messages": [user("hi")], "metadata": {"task": "my_task"}}), None),
            (json!({"messages": [user("hi")], "metadata": {"task": "function_calling"}}), None),
            (json!({"messages": [user("What is ### Task: about?")]}), None),
            (json!({"messages": [user(title), assistant("t"), user("hi")]}), None),
            (json!({"messages": [user("hi"), assistant("t"), user(title)]}), None),
            (json!({"messages": [user(title), user(title)]}), None),
            (json!({"messages": [assistant(title)]}), None),
            (
                json!({"messages": [user("a"), user("b")], "metadata": {"task": "title_generation"}}),
                Some(("title_generation".into(), "b".into())),
            ),
            (json!({"messages": [user("hi")], "metadata": {"task": ""}}), None),
            (json!({"messages": [user("hi")], "metadata": {"chat_id": "c"}}), None),
            (json!({"messages": [system], "metadata": {"task": "tags_generation"}}), None),
        ];
        for (mut body, expected) in cases {
            body["model"] = json!("m");
            let found = request(body.clone()).background_task().map(|task| (task.name, task.prompt));
            assert_eq!(found, expected, "{body}");
        }
    }

    /// Open WebUI's `DEFAULT_EMOJI_GENERATION_PROMPT_TEMPLATE` (voice mode), as its source has it.
    const OPEN_WEBUI_EMOJI_TEMPLATE: &str = "Your task is to reflect the speaker's likely facial expression through a fitting emoji. \
        Interpret emotions from the message and reflect their facial expression using fitting, diverse emojis (e.g., 😊, 😢, 😡, 😱).\n\n\
        Message: ```{{prompt}}```";
    /// Open WebUI's `DEFAULT_MOA_GENERATION_PROMPT_TEMPLATE`, as its source has it.
    const OPEN_WEBUI_MOA_TEMPLATE: &str = "You have been provided with a set of responses from various models to the latest user query: \
        \"{{prompt}}\"\n\nYour task is to synthesize these responses into a single, high-quality response. It is crucial to \
        critically evaluate the information provided in these responses, recognizing that some of it may be biased or incorrect. \
        Your response should not simply replicate the given answers but should offer a refined, accurate, and comprehensive \
        reply to the instruction. Ensure your response is well-structured, coherent, and adheres to the highest standards of \
        accuracy and reliability.\n\nResponses from models: {{responses}}";

    /// The emoji prompt Open WebUI builds for `message`.
    fn emoji_prompt(message: &str) -> String {
        OPEN_WEBUI_EMOJI_TEMPLATE.replace("{{prompt}}", message)
    }

    /// The MoA prompt Open WebUI builds for `query` and the models' `responses`: each in triple
    /// quotes, joined by blank lines.
    fn moa_prompt(query: &str, responses: &[&str]) -> String {
        let responses: Vec<String> = responses.iter().map(|response| format!("\"\"\"{response}\"\"\"")).collect();
        OPEN_WEBUI_MOA_TEMPLATE.replace("{{prompt}}", query).replace("{{responses}}", &responses.join("\n\n"))
    }

    #[test]
    fn open_webui_emoji_and_moa_prompts_are_background_tasks_and_near_misses_are_turns() {
        let emoji = emoji_prompt("I can't believe it, we won!");
        let tricky_emoji = emoji_prompt("a ```code``` block\nand a second line");
        let moa = moa_prompt("What's the weather in Prague?", &["It is 12 °C.", "Partly cloudy,\n12 °C \"\"\"quoted\"\"\"."]);
        let moa_of_none = moa_prompt("hi", &[]);
        // A query that quotes the template's instructions: they come twice.
        let (_, after_query) = OPEN_WEBUI_MOA_TEMPLATE.split_once("{{prompt}}").unwrap();
        let (instructions, _) = after_query.split_once("{{responses}}").unwrap();
        let moa_quoting_itself = moa_prompt(&format!("Explain: {instructions}"), &["ok"]);
        let system = json!({"role": "system", "content": "You are Peregrine."});
        let named = |name: &str, prompt: &str| Some((name.to_owned(), prompt.to_owned()));
        let emoji_task = |prompt: &str| named("emoji_generation", prompt);
        let moa_task = |prompt: &str| named("moa_response_generation", prompt);
        let (emoji_intro, _) = OPEN_WEBUI_EMOJI_TEMPLATE.split_once("Message:").unwrap();
        let (moa_intro, _) = OPEN_WEBUI_MOA_TEMPLATE.split_once("Responses from models:").unwrap();
        let cases = [
            (json!({"messages": [user(&emoji)]}), emoji_task(&emoji)),
            (json!({"messages": [user(&tricky_emoji)]}), emoji_task(&tricky_emoji)),
            (json!({"messages": [system, user(&emoji)]}), emoji_task(&emoji)),
            (json!({"messages": [user(&format!("\n{emoji}\n"))]}), emoji_task(&format!("\n{emoji}\n"))),
            (json!({"messages": [user(&moa)]}), moa_task(&moa)),
            (json!({"messages": [user(&moa_of_none)]}), moa_task(&moa_of_none)),
            (json!({"messages": [user(&moa_quoting_itself)]}), moa_task(&moa_quoting_itself)),
            (json!({"messages": [system, user(&moa)]}), moa_task(&moa)),
            // Near misses are the user's own messages: turns.
            (json!({"messages": [user(emoji_intro)]}), None),
            (json!({"messages": [user(&emoji.replace("fitting, diverse emojis", "fitting emojis"))]}), None),
            (json!({"messages": [user(emoji.trim_end_matches('`'))]}), None),
            (json!({"messages": [user(&format!("{emoji} Also, what's the weather?"))]}), None),
            (json!({"messages": [user(&format!("Why do you ask: {emoji}"))]}), None),
            (json!({"messages": [user("Your task is to reflect the speaker's likely facial expression through a fitting emoji.")]}), None),
            (json!({"messages": [user("hi"), assistant("hello"), user(&emoji)]}), None),
            (json!({"messages": [user(&emoji), user(&emoji)]}), None),
            (json!({"messages": [assistant(&emoji)]}), None),
            (json!({"messages": [user(moa_intro)]}), None),
            (json!({"messages": [user(&moa.replace("Responses from models: \"\"\"", "Responses from models: "))]}), None),
            (json!({"messages": [user(&format!("{moa} What do you think?"))]}), None),
            (json!({"messages": [user(&format!("Look at this: {moa}"))]}), None),
            (json!({"messages": [user(&moa.replace("single, high-quality response", "single response"))]}), None),
            (json!({"messages": [user("hi"), assistant("hello"), user(&moa)]}), None),
        ];
        for (mut body, expected) in cases {
            body["model"] = json!("m");
            let found = request(body.clone()).background_task().map(|task| (task.name, task.prompt));
            assert_eq!(found, expected, "{body}");
        }
    }

    #[test]
    fn a_new_conversation_gets_a_nonce_that_its_first_answer_carries() {
        let none = HeaderMap::new();
        let anonymous = Caller::Anonymous;
        let first = conversation(json!([user("hi")]), &anonymous, &none);
        let again = conversation(json!([user("hi")]), &anonymous, &none);
        assert_ne!(first.thread_id, again.thread_id, "two chats that both start with 'hi' are two conversations");
        assert!(is_oai_id(&first.thread_id, &anonymous), "{}", first.thread_id);
        assert_eq!(first.identity, Identity::New);
        let mark = first.mark.clone().expect("a new conversation's answer carries a mark");
        assert_ne!(Some(&mark), again.mark.as_ref());

        // The answer as the client resends it (status lines, the mark inside the first one) finds the thread.
        let answer = format!("> planning{mark}…\n\nHello! How can I help?");
        let later =
            conversation(json!([{"role": "system", "content": "s"}, user("hi"), assistant(&answer), user("weather?")]), &anonymous, &none);
        assert_eq!(
            (later.thread_id.as_str(), later.identity, later.mark.as_ref()),
            (first.thread_id.as_str(), Identity::Mark, Some(&mark)),
            "every answer of the conversation carries its mark"
        );
        assert_eq!(later.input, TurnInput::Message("weather?".to_owned()));
        let further =
            conversation(json!([user("hi"), assistant(&answer), user("weather?"), assistant("sunny"), user("thanks")]), &anonymous, &none);
        assert_eq!(further.thread_id, first.thread_id, "an answer without the mark changes nothing");
        // A client that sends only the last messages: any answer's mark finds the thread.
        let sunny = format!("{mark}\n\nsunny");
        let truncated = conversation(json!([assistant(&sunny), user("thanks")]), &anonymous, &none);
        assert_eq!((truncated.thread_id.as_str(), truncated.identity), (first.thread_id.as_str(), Identity::Mark));
        let truncated = conversation(json!([user("weather?"), assistant("no mark"), assistant(&sunny), user("thanks")]), &anonymous, &none);
        assert_eq!(truncated.thread_id, first.thread_id, "the first whole mark of any answer");
        // A stopped answer holds the mark as soon as it holds anything; the first user message does not count.
        let stopped = conversation(json!([user("hello?"), assistant(&format!("> plan{mark}")), user("go on")]), &anonymous, &none);
        assert_eq!(stopped.thread_id, first.thread_id);
        // Another user of the same key, resending the same history, has a thread of their own.
        let other_user = request(json!({"model": "m", "user": "bob", "messages": [user("hi"), assistant(&answer), user("x")]}))
            .conversation(&anonymous, &none)
            .unwrap();
        assert_ne!(other_user.thread_id, first.thread_id);
        // An assistant greeting (without a mark) before the first user message does not make a history.
        let greeted = conversation(json!([assistant("Hello! Ask me anything."), user("hi")]), &anonymous, &none);
        assert_eq!(greeted.identity, Identity::New);
    }

    #[test]
    fn marks_hold_the_nonce_invisibly_and_are_found_in_the_answer() {
        for nonce in [Nonce(0), Nonce(1), Nonce(u64::MAX), Nonce(0x0123_4567_89ab_cdef), Nonce::random()] {
            let mark = nonce.mark();
            assert_eq!(mark.chars().count(), 1 + MARK_BITS);
            assert!(mark.chars().all(|c| !c.is_whitespace() && matches!(c, MARK_START | MARK_ZERO | MARK_ONE)), "{mark:?}");
            assert_eq!(mark.trim(), mark, "trimming keeps it");
            let (head, tail) = mark.split_at(mark.char_indices().nth(30).unwrap().0);
            let rewrapped = format!("{head}\n \r\n{tail}");
            for text in [mark.clone(), format!("> planning{mark}…\n"), format!("x\u{2060}y{mark} and \u{2060}\u{200B} more"), rewrapped] {
                assert_eq!(Nonce::find(&text), Some(nonce), "{text:?}");
            }
        }
        let mark = Nonce(5).mark();
        assert_eq!(Nonce::find(&mark[..mark.len() - MARK_ONE.len_utf8()]), None, "a cut mark is no mark");
        assert_eq!(Nonce::find("Hello"), None);
        assert_ne!(Nonce::random(), Nonce::random());
    }

    #[test]
    fn an_answer_without_its_mark_falls_back_to_the_first_exchange() {
        let none = HeaderMap::new();
        let anonymous = Caller::Anonymous;
        let stripped = conversation(json!([user("hi"), assistant("> planning…\n\nHello! How can I help?"), user("x")]), &anonymous, &none);
        assert_eq!((stripped.identity, stripped.mark.as_ref()), (Identity::History, None));
        let rewrapped =
            conversation(json!([user("hi"), assistant(" > planning…\n\nHello!  How can\nI help? \n"), user("y")]), &anonymous, &none);
        assert_eq!(rewrapped.thread_id, stripped.thread_id, "whitespace does not count");
        let half_mark = conversation(
            json!([user("hi"), assistant("> planning\u{2060}\u{200B}…\n\nHello! How can I help?"), user("y")]),
            &anonymous,
            &none,
        );
        assert_eq!(half_mark.thread_id, stripped.thread_id, "invisible characters do not count");
        let other_answer = conversation(json!([user("hi"), assistant("Hi there."), user("x")]), &anonymous, &none);
        assert_ne!(other_answer.thread_id, stripped.thread_id);
        let other_first =
            conversation(json!([user("hello"), assistant("> planning…\n\nHello! How can I help?"), user("x")]), &anonymous, &none);
        assert_ne!(other_first.thread_id, stripped.thread_id);
        assert_eq!(normalize_answer(" a \u{200B}b\u{FEFF}\n\n c\u{2060} "), "a b c");
        // The parts are length-prefixed: moving text from one part to the next changes the id.
        let people = |user| People { caller: anonymous, user, openwebui_user: "" };
        assert_ne!(people("a\n1:b").history_thread_id("c", "x"), people("a").history_thread_id("b\n1:c", "x"));
        assert_ne!(people("").nonce_thread_id(Nonce(7)), people("").history_thread_id("", "0000000000000007"));
    }

    #[test]
    fn the_identity_holds_the_caller_and_the_user() {
        let none = HeaderMap::new();
        let mark = Nonce(42).mark();
        let history = json!([user("hi"), assistant(&format!("Hello{mark}")), user("weather?")]);
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
    fn chat_and_session_headers_name_the_thread_first() {
        let anonymous = &Caller::Anonymous;
        let new_chat = json!([user("hello")]);
        let by_chat = conversation(new_chat.clone(), anonymous, &with_header(CHAT_ID_HEADER, "c1"));
        let by_chat_later = conversation(json!([user("hello"), assistant("hi"), user("x")]), anonymous, &with_header(CHAT_ID_HEADER, "c1"));
        let by_session = conversation(new_chat.clone(), anonymous, &with_header(SESSION_ID_HEADER, "c1"));
        let other_chat = conversation(new_chat, anonymous, &with_header(CHAT_ID_HEADER, "c2"));
        assert_eq!(by_chat.thread_id, by_chat_later.thread_id);
        assert!(by_chat.mark.is_none() && by_session.mark.is_none(), "the header names the conversation: no mark");
        assert_ne!(by_chat.thread_id, by_session.thread_id);
        assert_ne!(by_chat.thread_id, other_chat.thread_id);
        // SHA-256 over caller, source, and the user parts and the id, length-prefixed.
        let mut hasher = Sha256::new();
        hasher.update(b"anonymous\nchat-id\n0:\n0:\n2:c1\n");
        assert_eq!(by_chat.thread_id, oai_thread_id(anonymous, &hasher.finalize()));

        // Two users of one key with the same session id have two threads.
        let by_user = |user_field: Value, headers: &HeaderMap| {
            request(json!({"model": "m", "user": user_field, "messages": [user("hello")]})).conversation(anonymous, headers).unwrap()
        };
        let session = with_header(SESSION_ID_HEADER, "s1");
        let (ada, bob, nobody) = (by_user(json!("ada"), &session), by_user(json!("bob"), &session), by_user(Value::Null, &session));
        assert!(ada.thread_id != bob.thread_id && ada.thread_id != nobody.thread_id && bob.thread_id != nobody.thread_id);
        assert_eq!(by_user(json!("ada"), &session).thread_id, ada.thread_id);
        let mut webui = with_header(CHAT_ID_HEADER, "c1");
        webui.insert(USER_ID_HEADER, HeaderValue::from_static("u1"));
        let owner = conversation(json!([user("hello")]), anonymous, &webui);
        webui.insert(USER_ID_HEADER, HeaderValue::from_static("u2"));
        let clone = conversation(json!([user("hello")]), anonymous, &webui);
        assert_eq!(owner.identity, Identity::ChatId);
        assert_ne!(owner.thread_id, clone.thread_id, "a shared chat's other user does not reach the owner's thread");

        // Temporary chats (`temporary:` since Open WebUI 0.12, `local:` before) and channels have
        // no stored chat: their ids count as absent.
        for unstored in ["temporary:abc", "local:abc", "channel:xyz"] {
            let temporary = conversation(json!([user("hello")]), anonymous, &with_header(CHAT_ID_HEADER, unstored));
            assert_eq!(temporary.identity, Identity::New, "{unstored}");
            assert!(temporary.mark.is_some());
            let mut headers = with_header(CHAT_ID_HEADER, unstored);
            headers.insert(SESSION_ID_HEADER, HeaderValue::from_static("c1"));
            assert_eq!(conversation(json!([user("hello")]), anonymous, &headers).thread_id, by_session.thread_id);
        }
    }
}

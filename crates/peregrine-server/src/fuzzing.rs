//! The request parsers of both APIs, run on a body alone, for the fuzz targets in `fuzz/` and
//! the property tests: not part of the API (hidden from the docs), and no behaviour of its own —
//! each function runs the same steps, in the same order, that a request goes through, up to the
//! first step that needs a store, an agent or the network.

use axum::http::HeaderMap;
use serde_json::Value;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::native::{ResumeAnswer, RunAsk, RunRequest};
use crate::request::{ChatRequest, Identity, Nonce, TurnInput};

/// The served model id [`chat_completion`] expects in a body.
pub const MODEL: &str = "peregrine-fuzz";
/// The key digest of the caller of every request here: a keyed caller, so the user ids
/// derived from it are exercised too.
const CALLER_KEY: [u8; 32] = [7; 32];
/// The message limit requests are checked against (the server's default).
const MAX_MESSAGE_BYTES: usize = crate::limits::DEFAULT_MAX_MESSAGE_BYTES;

/// What `POST /v1/chat/completions` makes of a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatOutcome {
    /// Refused before anything ran.
    Refused(ApiError),
    /// One of Open WebUI's background tasks: one LLM call with `prompt`.
    BackgroundTask {
        /// The task's name.
        name: String,
        /// The prompt forwarded to the model.
        prompt: String,
    },
    /// A turn of a conversation.
    Turn(ChatTurn),
}

/// The turn a chat completion runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn {
    /// `oai-<owner tag>-<16 hex digits>`.
    pub thread_id: String,
    /// Whether the thread is new (a fresh random nonce), so another parse of the same body
    /// names another thread.
    pub is_new: bool,
    /// The mark that opens the answer, when the conversation is known by its nonce.
    pub mark: Option<String>,
    /// The new message, or `None` to continue the cut-off answer.
    pub message: Option<String>,
    /// The text the answer opens with.
    pub opening: Option<String>,
    /// The session's user id.
    pub user_id: Option<String>,
}

/// Runs a chat completions body through the steps a request goes through before its turn
/// starts: parse, model, supported options, background task detection, conversation identity
/// (from a fixed keyed caller with no headers), the message limit and the answer's opening.
pub fn chat_completion(body: &[u8]) -> ChatOutcome {
    match chat_steps(body) {
        Ok(outcome) => outcome,
        Err(error) => ChatOutcome::Refused(error),
    }
}

fn chat_steps(body: &[u8]) -> Result<ChatOutcome, ApiError> {
    let request = ChatRequest::parse(body)?;
    if request.model != MODEL {
        return Err(ApiError::model_not_found(&request.model, MODEL));
    }
    request.check_supported()?;
    if let Some(task) = request.background_task() {
        return Ok(ChatOutcome::BackgroundTask { name: task.name, prompt: task.prompt });
    }
    let conversation = request.conversation(&Caller::Key(CALLER_KEY), &HeaderMap::new())?;
    if let TurnInput::Message(text) = &conversation.input {
        crate::limits::check_message(text, MAX_MESSAGE_BYTES, "messages")?;
    }
    let opening = crate::continuation::opening(&conversation);
    let message = match conversation.input {
        TurnInput::Message(text) => Some(text),
        TurnInput::Continue { .. } => None,
    };
    Ok(ChatOutcome::Turn(ChatTurn {
        thread_id: conversation.thread_id,
        is_new: conversation.identity == Identity::New,
        mark: conversation.mark,
        message,
        opening,
        user_id: conversation.session.user_id,
    }))
}

/// The owner tag in the thread ids of [`chat_completion`]'s caller.
pub fn owner_tag() -> String {
    Caller::Key(CALLER_KEY).owner_tag()
}

/// The nonce of the first whole mark in `text`, as an answer's mark is read back.
pub fn read_mark(text: &str) -> Option<u64> {
    Nonce::find(text).map(|nonce| nonce.0)
}

/// The mark of `nonce`, as an answer carries it.
pub fn mark(nonce: u64) -> String {
    Nonce(nonce).mark()
}

/// What a native run (`POST /threads/{id}/runs`) makes of a body, on a thread that is idle and
/// waits for the approval the body names (the checks that need a store are left out).
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Refused before anything ran.
    Refused(ApiError),
    /// A message.
    Message {
        /// The text.
        text: String,
        /// The session's user id.
        user_id: Option<String>,
    },
    /// An approval withdrawn unanswered.
    Abandon,
    /// An approval's decision, with an edited plan.
    Decision {
        /// Whether it was approved.
        approved: bool,
        /// The edited plan (only with an approval).
        edit: Option<Value>,
    },
    /// An approval answered in words.
    Answer(String),
    /// Continue the cut-off run.
    Continue,
}

/// Runs a native run body through the checks that need no store: the body (JSON object, no
/// unknown fields), one thing asked, the user, the input's type and size, a resume's shape.
pub fn native_run(body: &[u8]) -> RunOutcome {
    match run_steps(body) {
        Ok(outcome) => outcome,
        Err(error) => RunOutcome::Refused(error),
    }
}

fn run_steps(body: &[u8]) -> Result<RunOutcome, ApiError> {
    let request: Option<RunRequest> = crate::native::parse_json_body(body)?;
    let (asked, session) = crate::native::read_run_request(request, &Caller::Key(CALLER_KEY))?;
    Ok(match asked {
        RunAsk::Input(input) => {
            let text = crate::native::input_text(input)?;
            crate::limits::check_message(&text, MAX_MESSAGE_BYTES, "input")?;
            RunOutcome::Message { text, user_id: session.user_id }
        }
        RunAsk::Resume(resume) => match crate::native::resume_answer(resume, MAX_MESSAGE_BYTES)? {
            ResumeAnswer::Decision { approved, edit } => RunOutcome::Decision { approved, edit },
            ResumeAnswer::Words(text) => RunOutcome::Answer(text),
            ResumeAnswer::Abandon => RunOutcome::Abandon,
        },
        RunAsk::Continue => RunOutcome::Continue,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Text with what the parsers look for: marks (whole, cut, re-wrapped), Open WebUI's
    /// templates, slashes, whitespace and any other characters.
    fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "\\PC{0,12}",
            "[ \n\t]{1,3}",
            any::<u64>().prop_map(mark),
            any::<u64>().prop_map(|nonce| mark(nonce).chars().take(20).collect()),
            Just("\u{2060}\u{200B}\u{200C}\u{FEFF}".to_owned()),
            Just("### Task:\n<chat_history>\nUSER: hi\n</chat_history>".to_owned()),
            Just("<details type=\"reasoning\">thinking</details>".to_owned()),
            Just("\"\"\"".to_owned()),
            Just("```".to_owned()),
        ];
        prop::collection::vec(piece, 0..6).prop_map(|pieces| pieces.concat())
    }

    /// Any JSON value, small.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e3f64..1e3).prop_map(Value::from),
            text().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4).prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    fn role() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => prop::sample::select(vec!["user", "assistant", "system", "developer", "tool", ""]).prop_map(Value::from),
            1 => any_json(),
        ]
    }

    fn content() -> impl Strategy<Value = Value> {
        let part =
            (prop::sample::select(vec!["text", "image_url", "input_audio", ""]), prop_oneof![text().prop_map(Value::from), any_json()])
                .prop_map(|(kind, text)| json!({"type": kind, "text": text}));
        prop_oneof![
            4 => text().prop_map(Value::from),
            2 => prop::collection::vec(part, 0..4).prop_map(Value::from),
            1 => any_json(),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        (role(), content(), any::<bool>()).prop_map(|(role, content, extra)| {
            let mut message = json!({"role": role, "content": content});
            if extra {
                message["name"] = json!("n");
            }
            message
        })
    }

    /// A value shaped like a chat completions body: a few of the fields the server reads, each
    /// usually well typed, sometimes anything.
    fn chat_body() -> impl Strategy<Value = Value> {
        let optional = |value: BoxedStrategy<Value>| prop::option::weighted(0.3, value);
        let model = prop_oneof![8 => Just(Value::from(MODEL)), 1 => any_json()];
        let task = prop::sample::select(vec!["title_generation", "emoji_generation", "function_calling", "x"]);
        (
            model,
            prop::collection::vec(message(), 0..5),
            optional(prop_oneof![any::<bool>().prop_map(Value::from), any_json()].boxed()),
            optional(prop_oneof![text().prop_map(Value::from), any_json()].boxed()),
            optional(prop_oneof![(0i64..3).prop_map(Value::from), any_json()].boxed()),
            optional(prop_oneof![Just(json!("required")), Just(json!("auto")), any_json()].boxed()),
            optional(prop_oneof![Just(json!({"type": "json_object"})), Just(json!({"type": "text"})), any_json()].boxed()),
            optional(prop_oneof![task.prop_map(|task| json!({"task": task})), any_json()].boxed()),
        )
            .prop_map(|(model, messages, stream, user, n, tool_choice, response_format, metadata)| {
                let mut body = json!({"model": model, "messages": messages});
                for (name, value) in [
                    ("stream", stream),
                    ("user", user),
                    ("n", n),
                    ("tool_choice", tool_choice),
                    ("response_format", response_format),
                    ("metadata", metadata),
                ] {
                    if let Some(value) = value {
                        body[name] = value;
                    }
                }
                body
            })
    }

    /// A value shaped like a native run body.
    fn run_body() -> impl Strategy<Value = Value> {
        let resume = (
            prop::option::of(prop_oneof![any::<bool>().prop_map(Value::from), any_json()]),
            prop::option::of(prop_oneof![text().prop_map(Value::from), any_json()]),
            prop::option::of(prop_oneof!["[a-z0-9-]{0,12}".prop_map(Value::from), any_json()]),
            prop::option::of(any_json()),
            prop::option::of(prop_oneof![any::<bool>().prop_map(Value::from), any_json()]),
        )
            .prop_map(|(approved, answer, interrupt_id, plan, abandon)| {
                let mut resume = json!({});
                let fields =
                    [("approved", approved), ("answer", answer), ("interrupt_id", interrupt_id), ("plan", plan), ("abandon", abandon)];
                for (name, value) in fields {
                    if let Some(value) = value {
                        resume[name] = value;
                    }
                }
                resume
            });
        let field = prop::sample::select(vec!["input", "resume", "continue", "user", "stream", ""]);
        let value = prop_oneof![text().prop_map(Value::from), resume, any::<bool>().prop_map(Value::from), any_json()];
        prop_oneof![
            4 => prop::collection::btree_map(field, value, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().map(|(name, value)| (name.to_owned(), value)).collect())),
            1 => any_json(),
        ]
    }

    /// What a refusal is, its message aside (which may quote a position in the body).
    fn refusal_kind(error: &ApiError) -> (u16, Option<&'static str>, Option<&'static str>) {
        (error.status.as_u16(), error.code, error.param)
    }

    fn is_thread_id(id: &str) -> bool {
        let Some(rest) = id.strip_prefix("oai-").and_then(|rest| rest.strip_prefix(owner_tag().as_str())) else { return false };
        rest.strip_prefix('-').is_some_and(|hex| hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn chat_bodies_are_answered_or_refused_as_client_errors(body in chat_body()) {
            let bytes = body.to_string().into_bytes();
            match chat_completion(&bytes) {
                ChatOutcome::Refused(error) => prop_assert!(error.status.is_client_error(), "{error:?}"),
                ChatOutcome::BackgroundTask { name, .. } => prop_assert!(!name.is_empty()),
                ChatOutcome::Turn(turn) => {
                    prop_assert!(is_thread_id(&turn.thread_id), "{}", turn.thread_id);
                    prop_assert!(!turn.is_new || turn.mark.is_some(), "a new conversation's answer carries a mark");
                    if let Some(mark) = &turn.mark {
                        prop_assert!(read_mark(mark).is_some());
                    }
                    let again = chat_completion(&bytes);
                    let ChatOutcome::Turn(again) = again else { return Err(TestCaseError::fail("a second parse differs")) };
                    prop_assert_eq!((&again.message, &again.user_id), (&turn.message, &turn.user_id));
                    // Only a new conversation gets a thread of its own each time.
                    prop_assert_eq!(again.thread_id == turn.thread_id, !turn.is_new);
                }
            }
        }

        #[test]
        fn a_chat_outcome_depends_on_the_json_not_its_layout(body in chat_body()) {
            let compact = chat_completion(body.to_string().as_bytes());
            let pretty = chat_completion(serde_json::to_string_pretty(&body).unwrap_or_default().as_bytes());
            match (&compact, &pretty) {
                (ChatOutcome::Refused(one), ChatOutcome::Refused(other)) => prop_assert_eq!(refusal_kind(one), refusal_kind(other)),
                (ChatOutcome::Turn(one), ChatOutcome::Turn(other)) if one.is_new => prop_assert_eq!(&one.message, &other.message),
                _ => prop_assert_eq!(compact, pretty),
            }
        }

        #[test]
        fn a_new_conversations_answer_leads_back_to_its_thread(body in chat_body(), answer in text(), next in "[a-z]{1,8}") {
            let ChatOutcome::Turn(turn) = chat_completion(body.to_string().as_bytes()) else { return Ok(()) };
            let Some(mark) = turn.mark.filter(|_| turn.is_new) else { return Ok(()) };
            // The client resends the history with the answer (the mark first) and a new message;
            // without metadata, which could name a background task.
            let mut follow_up = body.clone();
            if let Some(object) = follow_up.as_object_mut() {
                object.remove("metadata");
            }
            let mut messages = follow_up["messages"].as_array().cloned().unwrap_or_default();
            messages.push(json!({"role": "assistant", "content": format!("{mark}\n\n{answer}")}));
            messages.push(json!({"role": "user", "content": next}));
            follow_up["messages"] = Value::from(messages);
            let ChatOutcome::Turn(later) = chat_completion(follow_up.to_string().as_bytes()) else {
                return Err(TestCaseError::fail(format!("the follow-up is no turn: {follow_up}")));
            };
            prop_assert_eq!(&later.thread_id, &turn.thread_id);
            prop_assert!(!later.is_new);
            prop_assert_eq!(later.message, Some(next));
        }

        #[test]
        fn the_first_whole_mark_is_read(prefix in text(), nonce in any::<u64>(), suffix in text()) {
            let marked = format!("{prefix}{}{suffix}", mark(nonce));
            match read_mark(&prefix) {
                None => prop_assert_eq!(read_mark(&marked), Some(nonce)),
                Some(earlier) => prop_assert_eq!(read_mark(&marked), Some(earlier)),
            }
        }

        #[test]
        fn run_bodies_are_taken_or_refused_as_client_errors(body in run_body()) {
            let bytes = body.to_string().into_bytes();
            let outcome = native_run(&bytes);
            match &outcome {
                RunOutcome::Refused(error) => prop_assert!(error.status.is_client_error(), "{error:?}"),
                RunOutcome::Message { text, user_id } => {
                    prop_assert_eq!(Some(text.as_str()), body.get("input").and_then(Value::as_str));
                    prop_assert!(user_id.is_some());
                }
                RunOutcome::Decision { approved, edit } => {
                    prop_assert!(*approved || edit.is_none(), "an edit is only approved");
                    prop_assert_eq!(edit.as_ref(), body.pointer("/resume/plan").filter(|plan| !plan.is_null()));
                }
                RunOutcome::Answer(text) => prop_assert!(!text.trim().is_empty()),
                RunOutcome::Abandon => {
                    prop_assert_eq!(body.pointer("/resume/abandon"), Some(&json!(true)));
                    for alone in ["approved", "answer", "plan"] {
                        prop_assert!(body.pointer(&format!("/resume/{alone}")).is_none_or(Value::is_null), "abandon with {}", alone);
                    }
                }
                RunOutcome::Continue => prop_assert_eq!(body.get("continue"), Some(&json!(true))),
            }
            let pretty = native_run(serde_json::to_string_pretty(&body).unwrap_or_default().as_bytes());
            match (&outcome, &pretty) {
                (RunOutcome::Refused(one), RunOutcome::Refused(other)) => prop_assert_eq!(refusal_kind(one), refusal_kind(other)),
                _ => prop_assert_eq!(&outcome, &pretty),
            }
        }

        #[test]
        fn any_bytes_are_taken_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let ChatOutcome::Refused(error) = chat_completion(&bytes) {
                prop_assert!(error.status.is_client_error());
            }
            if let RunOutcome::Refused(error) = native_run(&bytes) {
                prop_assert!(error.status.is_client_error());
            }
        }
    }

    #[test]
    fn well_formed_bodies_run_the_whole_sequence() {
        let turn = chat_completion(json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).to_string().as_bytes());
        let ChatOutcome::Turn(turn) = turn else { panic!("{turn:?}") };
        assert!(turn.is_new && turn.mark.is_some() && turn.message.as_deref() == Some("hi"), "{turn:?}");
        let task = json!({"model": MODEL, "messages": [{"role": "user", "content": "### Task:\n<chat_history>\n</chat_history>"}]});
        assert!(matches!(chat_completion(task.to_string().as_bytes()), ChatOutcome::BackgroundTask { .. }));
        let other_model = chat_completion(json!({"model": "m", "messages": []}).to_string().as_bytes());
        assert!(matches!(other_model, ChatOutcome::Refused(ApiError { code: Some("model_not_found"), .. })), "{other_model:?}");
        assert_eq!(native_run(br#"{"continue": true}"#), RunOutcome::Continue);
        assert_eq!(native_run(br#"{"resume": {"answer": "yes", "interrupt_id": "i"}}"#), RunOutcome::Answer("yes".to_owned()));
        assert!(matches!(native_run(br#"{"input": "hi", "extra": 1}"#), RunOutcome::Refused(_)));
        assert!(matches!(native_run(b" \n"), RunOutcome::Refused(_)), "an empty body asks for nothing");
    }
}

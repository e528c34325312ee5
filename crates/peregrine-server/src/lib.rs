//! Serves a Peregrine [`Agent`] over HTTP: an OpenAI-compatible API for
//! Open WebUI and the official `openai` clients, a native threads/runs API with live events and
//! approvals, and a web UI. [`router`] is an axum router; `peregrine serve` binds it.
//!
//! # Routes
//! - `GET /v1/models`, `GET /v1/models/{model}`: the one served model,
//!   `{"object":"list","data":[{"id","object":"model","created","owned_by":"peregrine"}]}`.
//! - `POST /v1/chat/completions`: one turn of the agent; a JSON answer, or SSE with `stream: true`.
//! - `GET /info` (no key needed): `{"name","version","auth"}`.
//! - The native API under `/threads` (below).
//! - `GET /`: the web UI, one self-contained page (no build step) that uses the native API.
//! - Anything else: 404 (405 for a known route with another method) with an error body.
//!
//! Errors are `{"error":{"message","type","param","code"}}`: 401 `invalid_api_key`, 404
//! `model_not_found` / `thread_not_found` / `run_not_found`, 400 `invalid_json` for a body that
//! is not a chat completions request, 400 `invalid_body` for a body that could not be read to its
//! end (the client stopped sending it), 400 with `param: "messages"` or code
//! `invalid_request`, 400 `unsupported_value` with `param` `n`, `tool_choice` or
//! `response_format` (see Requests), 413 `request_too_large` for a body over [`ServerOptions::max_body_bytes`],
//! 409 `thread_busy` while a turn of the thread runs (in this process or, with PostgreSQL, in
//! another), 409 `no_pending_approval` / `stale_approval` / `approval_pending` /
//! `unfinished_run` / `nothing_to_continue` (also a chat completion that asks to continue an
//! answer with no cut-off turn behind it: see Requests) / `run_finished` / `thread_exists`, 400 when the agent's gateway refuses the message, 500 `server_error` when
//! the run fails. Every message passes through [`ServerOptions::redact`] first, and so does the
//! report of a turn that ended in the error node (it may quote a provider's or the store's error).
//!
//! # Native API
//! Threads:
//! - `POST /threads` (body `{}`; `{"thread_id": "…"}` only on a server without keys) → 201 Thread.
//! - `GET /threads?limit=50&offset=0` → the caller's threads, most recently updated first.
//! - `GET /threads/{id}` → Thread; `DELETE /threads/{id}` → 204 (409 while a run holds it; its
//!   pending plan files go too).
//! - `GET /threads/{id}/state` → `{"thread_id","status","resumable","checkpoint_id","next",
//!   "messages":[{"role","content","timestamp"}],"plan":{"steps","current_step","results"}|null,
//!   "interrupt","values"}` (`values`: the whole agent state).
//! - `GET /threads/{id}/history?limit=&before=` → checkpoint metadata, newest first.
//!
//! Thread = `{"thread_id","created_at","updated_at","status","resumable","title","messages","interrupt"}`
//! with `status` one of `idle`, `busy` (a run holds it, here or in another process), `interrupted`
//! (an approval is pending: `interrupt` = `{"id","digest","node","approval_type","message","payload"}`;
//! a plan approval's `payload.execution_plan` is the plan), `error` (the last turn ended in the
//! error node, or a run was cut off: then `resumable` is true).
//!
//! Runs (`POST` bodies: exactly one of `{"input": "text"}`, `{"resume": {"approved": bool,
//! "interrupt_id": "…", "plan"?: <edited plan>}}`, `{"resume": {"interrupt_id": "…", "answer":
//! "text"}}` (an approval answered in words: yes approves, no/cancel withdraw it, other words
//! are read by the LLM), `{"resume": {"interrupt_id": "…", "abandon": true}}` (the approval is
//! withdrawn unanswered: nothing runs, the withdrawal is recorded in the history and the thread
//! is idle; result status `abandoned`), `{"continue": true}`; optional `"user"`; a `resume` may
//! add the interrupt's `"digest"`, checked when given). A message (`input`) is never taken as an
//! approval's answer: on a thread waiting for one it is refused with 409 `approval_pending`, and
//! an answer comes as a `resume` naming the question shown by its `interrupt_id` (400 without
//! it), so an answer never reaches a question asked after it was given: 409 `stale_approval`.
//! - `POST /threads/{id}/runs` → 201 Run, once the run holds the thread and its input (message
//!   or answer) is durable in the checkpoint store (409 `thread_busy` if another run holds it); `POST …/runs/stream` → its events as SSE; `POST …/runs/wait` → the Run
//!   once it ended.
//! - `GET /threads/{id}/runs`, `GET …/runs/{run}`, `GET …/runs/{run}/wait`,
//!   `GET …/runs/{run}/stream` (from the start, or after header `Last-Event-ID: N` or
//!   `?last_event_id=N`), `POST …/runs/{run}/cancel` → 202.
//!
//! Run = `{"run_id","thread_id","kind":"message|resume|continue","status":"running|success|error|interrupted|cancelled",
//! "created_at","finished_at","result":{"status","response","interrupt","approval"}|null,"error":{"message","code","http_status"}|null}`
//! (`approval`: which pending approval the run answered and how, `{"interrupt_id","outcome":
//! "approved|rejected|abandoned","read_by":"keyword|llm|fallback"|null}`).
//! A run is a task of its own: a client that disconnects from its stream does not stop it, and
//! can reconnect. Runs are kept in memory by the process that started them: every running run,
//! and of the finished ones the last 1,000 and at most 128 MiB of events, each for at least a
//! minute after it ended (so `wait`, `stream` and `cancel` of a run must reach that process).
//! Threads, their state and their approvals are in the checkpoint store, so any process serving
//! the store can answer an approval or continue a run another started. A thread held by a run
//! of another process shows `busy` with the PostgreSQL checkpointer; SQLite and memory locks are
//! per process, so there another process's run shows as a cut-off (`resumable`) run. On
//! shutdown ([`Server::shut_down`]) running runs get a grace period, then are cancelled: each
//! ends `cancelled` at its last checkpoint and its followers get `end`.
//!
//! Everything answered (events, results, state, history) passes through
//! [`ServerOptions::redact`], and approval payloads leave out the paths of files on the
//! server's disk. URLs and query strings that cannot be read are JSON 400s.
//!
//! SSE events are `id: N` (1, 2, 3, …), `event: NAME`, `data: JSON`: `metadata`
//! `{"run_id","thread_id"}` first; the engine's `run_started`, `node_started` `{"node","step"}`,
//! `node_finished` `{"node","step","checkpoint_id","duration_ms"}`, `waiting`, `interrupt`
//! (the Interrupt), `run_finished`; the agent's events named by kind (`task_extracted`,
//! `capabilities_selected`, `plan_created` `{"steps"}`, `capability_start`
//! `{"capability_name","step_number","total_steps","description"}`, `capability_complete`,
//! `status`, `llm_request`, `llm_response`, `approval_required`, `approval_received`, `error`, …,
//! each with `timestamp` and `component`); answer pieces as `token` `{"role","content"}`; and
//! last `end` with the final Run. An idle stream sends a `: keep-alive` comment every 15 s. A
//! `Last-Event-ID` beyond the run's last event so far is a 400.
//!
//! # Thread ownership
//! Thread ids carry their owner: `t-<owner tag>-<32 hex>` (native) and
//! `oai-<owner tag>-<16 hex>` (OpenAI-compatible conversations), where the owner tag is the
//! first 12 hex digits of SHA-256 over `peregrine-thread-owner\n` and the caller's identity
//! (the hex SHA-256 of its key). A key sees, lists and runs only threads with its own tag; any
//! other thread answers 404 like a missing one. Every process agrees without a table of its own.
//! A server without keys has one user, who sees every thread of the store (the terminal's too).

//! # Authentication
//! With [`ServerOptions::api_keys`] set, every route but `/` and `/info` needs
//! `Authorization: Bearer <key>`.
//! Only SHA-256 digests of the keys are kept; a presented key is hashed and compared with each
//! of them in constant time. Keys never appear in answers or logs.
//!
//! A server **without keys** (the default, on loopback) obeys whoever reaches it, and a web page
//! the operator visits reaches loopback. So it answers only (403 otherwise, before any handler
//! runs):
//! - requests whose `Host` is a loopback name (`localhost`, `127.x.x.x`, `[::1]`, any port) or
//!   the host of an allowed origin: `host_not_allowed` (no DNS rebinding);
//! - with an `Origin` header, the server's own origin (`http(s)://` + the `Host`) or one of
//!   [`ServerOptions::allowed_origins`]: `origin_not_allowed`; without one, a state-changing
//!   method only when `Sec-Fetch-Site` is absent, `same-origin` or `none`;
//! - state-changing requests with a body only when it is declared `application/json`: 415
//!   `unsupported_media_type` (a cross-site form or `no-cors` fetch can send only
//!   `text/plain`, form or multipart bodies without a CORS preflight).
//!
//! Allowed origins also get CORS answers (preflights for `GET`/`POST`/`DELETE` with the
//! `Authorization`, `Content-Type`, `Last-Event-ID` and `X-Session-ID` headers); no other origin
//! does, so no other page can read an answer. A URL over 8 KiB is a JSON 414.
//!
//! # Limits
//! - [`ServerOptions::max_turns_in_flight`] (default 256): turns running at once (chat
//!   completions, background tasks, runs); one more is refused with 503 `server_overloaded` and
//!   `Retry-After: 2` before anything starts. Twice as many request bodies may be read at once
//!   (on every route that reads one, after the key is checked); one more is refused the same
//!   way, unread, so that slow senders hold no turn's place and the memory of bodies in flight
//!   is bounded (2 × 256 × 1 MiB by default).
//! - [`ServerOptions::max_message_bytes`] (default 256 KiB): a message's text (the last user
//!   message, a run's `input` or `answer`); larger: 413 `message_too_large`.
//! - [`ServerOptions::max_body_bytes`] (default 1 MiB): 413 `request_too_large`;
//!   [`ServerOptions::body_timeout`] (default 60 s) to send it: 408 `request_timeout`. A refused
//!   body is read to its end (up to 16 MiB, 5 s) so that the client reads the answer.
//! - [`serve`] with [`ConnectionLimits`]: a connection must send a whole request head within
//!   30 s of opening or of its previous answer (an idle keep-alive connection is closed then),
//!   a write that waits 60 s for the client to read closes it, and at most 4,096 are open at
//!   once.
//!
//! # Requests
//! `POST /v1/chat/completions` reads `model` (the served id), `messages`, `stream`,
//! `stream_options.include_usage`, `user` and `metadata.task`; every other field is ignored,
//! except three whose answer this server cannot give, refused with 400 `unsupported_value`
//! naming the field in `param`: `n` over 1 (one choice is returned), `tool_choice` `"required"`
//! or a named function (the agent calls no client tools; `"auto"`, `"none"` and `tools` alone
//! are ignored), and `response_format` of type `json_schema` or `json_object` (no structured
//! output). `user` counts only as a non-empty string; an object or a number is ignored. A
//! message's text is its string content or its `text` parts joined by newlines. The turn's input
//! is the last user message; only `system` and `developer` messages may follow it (ignored, like
//! every system and developer message: the agent has its own prompts); a trailing `tool` message
//! is a 400 with `param: "messages"`.
//!
//! A history whose last message (but `system` and `developer` ones) is the assistant's answer asks
//! to **continue** that answer: Open WebUI's "Continue Response" sends it, after the Stop button
//! or a dropped connection cut the answer off. The conversation is found as usual (see
//! Conversation identity: the mark of the answers, the trailing one included, or the chat or
//! session id). When its thread holds a cut-off turn (the same test as the native API's
//! `resumable`: a run stopped in its middle, by a client that went away, a shutdown or a crash,
//! that no process holds now; or an approval answered whose action was cut off), that turn is
//! finished from its last checkpoint, without repeating its finished steps (the step that was
//! running runs again from its start), and its answer is the response, streamed or not, as for a
//! message. That answer carries no mark (the client adds it to the answer it continues); when the
//! answer being continued shows text (anything but invisible characters, whitespace and a
//! `<details type="reasoning">` block), it opens with `_(the answer was cut off)_` between blank
//! lines, since the new answer is whole and does not carry on mid-sentence. Anything else is a
//! 409 `nothing_to_continue` whose message says why (no thread for this history on this server,
//! the last turn finished, or it asks for an approval that is still pending) and what to do
//! instead (send a message; answer the approval); 409 because the request is well formed but the
//! conversation's state has nothing to continue, as the native API's `{"continue": true}`
//! answers. A run of another process holding the thread is a 409 `thread_busy`.
//!
//! A 500 of a turn and every 409 answer carry the header `x-should-retry: false`, which the
//! official `openai` clients obey: a failed turn may have written checkpoints, and a busy
//! thread's turn still runs, so sending the same turn again on their own would run it twice, and
//! a continuation with nothing to continue is refused again (a background task's 500 changed
//! nothing and does not carry it).
//!
//! # Background tasks
//! Open WebUI asks the chat's model for titles, tags, follow-up suggestions, search queries,
//! image prompts and autocompletions, each as a request whose one message is a user message
//! built from a prompt template that begins with `### Task:` and quotes the chat in a
//! `<chat_history>` block; in voice mode it asks for an emoji of the speaker's expression, and a
//! chat with several models asks one of them to merge their answers (mixture of agents, MoA),
//! with templates of their own that have neither (Open WebUI drops `metadata` before it calls a
//! connection, and adds the model's system prompt when one is set for it). A request is such a
//! task only when
//! - its `metadata.task` is one of Open WebUI's task names: `title_generation`,
//!   `tags_generation`, `follow_up_generation`, `query_generation`, `emoji_generation`,
//!   `autocomplete_generation`, `image_prompt_generation`, `moa_response_generation` (a client
//!   that passes Open WebUI's metadata on; any other value is ignored), or
//! - its messages but `system` and `developer` ones are exactly one user message that, leading
//!   and trailing whitespace aside,
//!   - begins with `### Task:` and holds `<chat_history>` followed by `</chat_history>`, or
//!   - is Open WebUI's default emoji template (`DEFAULT_EMOJI_GENERATION_PROMPT_TEMPLATE`)
//!     around a message: its whole fixed text (`Your task is to reflect the speaker's likely
//!     facial expression through a fitting emoji. …` up to `Message: ` and three backticks),
//!     the message, then three backticks as the end, or
//!   - is Open WebUI's default MoA template (`DEFAULT_MOA_GENERATION_PROMPT_TEMPLATE`) around a
//!     query and the models' answers: `You have been provided with a set of responses from
//!     various models to the latest user query: "`, the query, the template's whole fixed text
//!     from `"` and `Your task is to synthesize these responses …` up to `Responses from models:
//!     `, then nothing or the answers, which begin and end with `"""` (Open WebUI quotes each so).
//!
//! Anything else runs as a turn (each on a conversation of its own when it is a first message):
//! Open WebUI's question about files, knowledge or a web search (its RAG template, put before the
//! user's message when `RAG_SYSTEM_CONTEXT` is off, begins with `### Task:` but has no chat
//! history), any other `### Task:` message without one, a `### Task:` message with a history
//! before it, a message that quotes, shortens or adds to the emoji or MoA template, either of them
//! after other messages, the tools function-calling prompt (system `Available Tools: …`, user
//! `Query: History: …`; give the model native function calling in Open WebUI, or no tools), and a
//! template an admin rewrote (without `### Task:` or `<chat_history>`, or any change to the emoji
//! or MoA template's fixed text).
//!
//! A task runs no turn and reads or writes no thread. Its prompt alone (that user message; for
//! `metadata.task`, the last user message) goes to one LLM call of the `response` role, which is
//! stopped after 1,024 streamed pieces (then `finish_reason` is `length`); its text and usage are
//! answered in the usual shape, JSON or SSE. A task cut at its limit reports `prompt_tokens` 0
//! (the provider reports usage only at the end of a call, and the call was stopped) and
//! `completion_tokens` the pieces kept. A failed call is a 500 `server_error` without
//! `x-should-retry` (nothing changed, so a retry is fine).
//!
//! # Conversation identity
//! Chat clients resend the whole history with every request, so the agent thread is found from
//! the request. Its id is `oai-<owner tag>-<16 hex>`, the hex digits the first 16 of SHA-256 over
//! `<caller>\n<kind>\n` and parts each written as `<UTF-8 byte length>:<text>\n`, always
//! beginning with the `user` field (or empty) and header `X-OpenWebUI-User-Id` (or empty); the
//! kind and the parts that follow come from the first rule that applies:
//! 1. Header `X-OpenWebUI-Chat-Id` (Open WebUI with `ENABLE_FORWARD_USER_INFO_HEADERS`), else
//!    header `X-Session-Id`: kind `chat-id` or `session-id`, then the id. Two users of one key
//!    who send the same id have two threads. Open WebUI's ids that name no stored chat, those of
//!    temporary chats (`temporary:…` since Open WebUI 0.12, `local:…` before) and channels
//!    (`channel:…`), count as absent. No mark is sent.
//! 2. An assistant message (any, in order: the first whole mark wins) holds a mark: kind
//!    `nonce`, then the nonce it holds as 16 lowercase hex digits. The answer carries the mark
//!    again (below).
//! 3. A history without an answer (no `assistant` message after the first user message with
//!    text) starts a conversation: the server draws a random 64-bit nonce, and the id is that of
//!    rule 2. The id is known before the turn runs.
//! 4. A history whose answers hold no mark (a client that drops invisible characters): kind
//!    `history`, then the first user message with text, and the first answer (the first
//!    `assistant` message after it) as the client resends it, without invisible characters
//!    (U+200B–U+200D, U+2060, U+FEFF), its whitespace runs made single spaces, trimmed. This is
//!    not the first turn's thread: the conversation's thread begins with its second turn and does
//!    not remember the first (and two chats whose first exchanges are the same share it). No mark
//!    is sent.
//!
//! The mark is the nonce, invisible: U+2060 WORD JOINER, then the 64 bits, most significant
//! first, as U+200B (0) and U+200C (1) (whitespace between them is skipped when it is read).
//! Every answer of a conversation of rules 2 and 3 begins with it, followed by a blank line: a
//! stream's first content chunk, right after the role chunk and before anything else (progress,
//! the answer); a non-stream answer's first characters. It is an invisible first
//! paragraph, so the answer's markdown (a heading, a list, a table) begins a block of its own, and
//! an answer stopped at any moment holds it. Clients keep it in the text they resend (trimming
//! keeps it: it is not whitespace), so every later request of the conversation finds the first
//! turn's thread, whichever process serving a shared store answers it, and so does a client that
//! resends only the last messages, as long as one answer among them kept its mark. API callers
//! that parse the content (JSON, an exact match) should send `X-Session-Id`: with it, or with a
//! chat id, no mark is sent.
//!
//! `<caller>` is the hex SHA-256 of the caller's API key, or `anonymous` when the server has no
//! keys, so two keys never share a thread; the `user` field and Open WebUI's user id keep one
//! key's users apart. Two chats that both start with "hi" are two conversations (two nonces);
//! without headers, regenerating or editing the first message starts a new one (with a chat or
//! session id, it goes on in the same thread). For Open WebUI, turn on
//! `ENABLE_FORWARD_USER_INFO_HEADERS`: the chat id then wins (a chat is one thread however its
//! messages are edited), and a cloned or shared chat, continued by another user, does not reach
//! the owner's thread (the user id is part of the id). A history whose thread does not exist
//! starts it. One-shot calls, regenerations and requests mistaken for turns each create an
//! `oai-` thread that stays in the store; `peregrine threads delete` or `DELETE /threads/{id}`
//! removes them. A first turn that ends in an approval prompt leaves it pending on its thread,
//! so the next request (the history with the prompt, then `yes`, `no`/`cancel` to withdraw it,
//! or words that say what to change) answers it; the agent's gateway reads the last user
//! message. It answers the approval only when the answer just before it in the history shows
//! that approval's question: a message written in a window that never showed it (another tab,
//! another client of the same conversation) changes nothing and is answered with the question
//! and a note, so `yes` approves only what the person saw. The last user message is the turn's input; the earlier
//! messages only identify the conversation (the agent keeps its own history in its checkpoints,
//! so a later message edited in the client is not edited there). The session's user id is the
//! `user` field, else header `X-OpenWebUI-User-Id`, else `api`, prefixed with `<first 16 hex
//! digits of the key's digest>:` on a server with keys; its interface is `openwebui`.
//!
//! # Streaming
//! Every chunk has the same `id` and `created`; the first delta is `{"role":"assistant"}`.
//! [`ServerOptions::status_lines`] ([`StatusLines`], `server.status_lines` in `config.yml`) says
//! how the agent's progress (`planning…`, `step 1/2 current_weather…`, a line each while no answer
//! is under way) is shown:
//! - `reasoning` (the default): as `{"reasoning_content": "planning…\n"}` deltas, each chunk
//!   holding either content or reasoning. Open WebUI (0.12) shows them live in a collapsible
//!   reasoning block and keeps them out of the answer: it stores them as a reasoning item of the
//!   message, apart from its text, and does not resend them with the history (its
//!   `convert_output_to_messages` leaves reasoning out for an OpenAI connection; earlier versions
//!   stored a `<details type="reasoning">` block and removed it before resending), nor quote them
//!   in title and tag prompts or copy them. The content is only the conversation's mark with its
//!   blank line, then the answer. The mark comes first so that an answer stopped at any moment
//!   holds it; Open WebUI then draws the block as already finished ("Thought for 0 seconds")
//!   while it fills, where a stream without a mark (a chat or session id: see Conversation
//!   identity) shows it as "Thinking…" until the answer begins. Clients that do not know the
//!   field (the official `openai` clients keep it as an extra attribute of the delta) show the
//!   answer alone.
//! - `content`: as lines of the content, `> planning…`, after the mark and its blank line, then a
//!   blank line before the answer. Every client shows them, and as part of the answer: Open WebUI
//!   resends them with every later request, quotes them in its title and tag prompts and copies
//!   them with the answer, and after Stop they may be all that remains.
//! - `off`: nothing but the answer.
//!
//! `true` and `false`, the booleans of earlier versions, read as `reasoning` and `off`. Then come
//! the answer tokens; a turn that streamed no tokens (an error report, an approval prompt, a reply)
//! sends its text as one piece. When the answer's stream breaks and its call is made again, what
//! was shown stays, followed by `_(the answer was cut off)_` on a line of its own and the answer
//! of the new call (which is not sent again at the end); when the call is made again without a
//! reported failure, the note is `_(the answer was cut off; trying again)_`. A final chunk carries `finish_reason:
//! "stop"` (every other chunk has `null`); with `stream_options.include_usage`, a chunk with
//! `choices: []` and the turn's `usage` comes just before `data: [DONE]`. The response (and its
//! first byte) is held back until the turn's run has started, which is after its message (or
//! approval answer) is durable in the checkpoint store: a response that began is never a message
//! lost by a crash. A message the gateway refuses, or a thread busy in another process, is
//! answered with an HTTP error instead; a run error after the stream began comes as a
//! `data: {"error": {..}}` event before `[DONE]`. A stream that has written nothing
//! for 15 s (whatever the turn did meanwhile) sends the SSE comment `: keep-alive` (clients
//! ignore comments), so that proxies do not cut a long turn.
//!
//! # Request log
//! Every request gets one `info` line under the `tracing` target [`REQUEST_LOG_TARGET`] (which
//! `peregrine serve` logs at its default level) once its response's head is ready: `method`,
//! `path` (never the query string), `status`, `duration_ms` (for a stream, the time to its
//! head), and for a chat completion turn its `thread`. No header, key or body is logged.
//!
//! # Cancellation
//! On `/v1/chat/completions`, a client that disconnects (or drops a non-stream request) cancels
//! the turn; its last checkpoint stays and the next message continues the conversation (an
//! answer stopped at any moment holds its conversation's mark, which comes first: see
//! Conversation identity), or a request to continue the answer finishes the cut-off turn (see
//! Requests). Native runs are cancelled only by `POST …/cancel`.

mod auth;
mod chat;
mod continuation;
mod error;
/// The request parsers run on a body alone, for the fuzz targets in `fuzz/` and the property
/// tests: public only because a fuzz target is another crate. Not part of the API.
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod limits;
mod listen;
mod native;
mod progress;
mod request;
mod request_log;
mod runs;
mod ui;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use peregrine_agent::Agent;
use peregrine_llm::Secret;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use error::ApiError;
pub use limits::{DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_TURNS_IN_FLIGHT};
pub use listen::{ConnectionLimits, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_WRITE_TIMEOUT, serve};
pub use progress::StatusLines;
pub use request::{CHAT_ID_HEADER, DEFAULT_USER, INTERFACE, SESSION_ID_HEADER, USER_ID_HEADER};
pub use request_log::REQUEST_LOG_TARGET;

/// The default limit on a request body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The owner every listed model has.
pub const OWNED_BY: &str = "peregrine";

/// Replaces the secrets of the configuration in a text (error messages quote storage and
/// provider errors, which may quote a URL with its password).
pub type Redact = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// How the API is served.
#[derive(Clone)]
pub struct ServerOptions {
    /// The model id clients select (and must send as `model`); also the name the web UI shows.
    pub model_id: String,
    /// Accepted API keys; empty serves without authentication.
    pub api_keys: Vec<Secret>,
    /// The largest request body accepted (larger ones get 413).
    pub max_body_bytes: usize,
    /// How long a client may take to send a request body (then 408).
    pub body_timeout: std::time::Duration,
    /// The largest message text (a chat message, a run's input or answer); larger ones get 413.
    pub max_message_bytes: usize,
    /// Turns (chat completions, background tasks, runs) running at once; more get 503 with
    /// `Retry-After` before anything starts.
    pub max_turns_in_flight: usize,
    /// Origins (`https://ui.example.org`) whose web pages may use a server without keys, which
    /// otherwise obeys only its own page and clients that are not browsers; they also get CORS
    /// answers.
    pub allowed_origins: Vec<String>,
    /// How a stream shows the agent's progress before the answer (see Streaming).
    pub status_lines: StatusLines,
    /// Applied to every error text before it is answered or logged.
    pub redact: Redact,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("model_id", &self.model_id)
            .field("api_keys", &self.api_keys.len())
            .field("max_body_bytes", &self.max_body_bytes)
            .field("body_timeout", &self.body_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("max_turns_in_flight", &self.max_turns_in_flight)
            .field("allowed_origins", &self.allowed_origins)
            .field("status_lines", &self.status_lines)
            .finish_non_exhaustive()
    }
}

impl ServerOptions {
    /// Options serving `model_id` without keys, with a 1 MiB body limit and progress shown as
    /// reasoning.
    pub fn new(model_id: impl Into<String>) -> Self {
        Self {
            model_id: model_id.into(),
            api_keys: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_turns_in_flight: DEFAULT_MAX_TURNS_IN_FLIGHT,
            allowed_origins: Vec::new(),
            status_lines: StatusLines::default(),
            redact: Arc::new(str::to_owned),
        }
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self::new("peregrine")
    }
}

/// The whole HTTP surface of `agent`: the OpenAI-compatible API, the native threads/runs API
/// and the web UI. Use [`Server`] to also stop running turns cleanly.
pub fn router(agent: Arc<Agent>, options: ServerOptions) -> Router {
    Server::new(agent, options).router()
}

/// A served agent: its routes, and the turns they run.
#[derive(Clone)]
pub struct Server {
    state: Arc<chat::ServerState>,
    guard: Arc<guard::BrowserGuard>,
    allowed_origins: Vec<axum::http::HeaderValue>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("model_id", &self.state.model_id).field("running", &self.state.tasks.len()).finish_non_exhaustive()
    }
}

impl Server {
    /// Serves `agent` with `options`.
    pub fn new(agent: Arc<Agent>, options: ServerOptions) -> Self {
        let ServerOptions {
            model_id,
            api_keys,
            max_body_bytes,
            body_timeout,
            max_message_bytes,
            max_turns_in_flight,
            allowed_origins,
            status_lines,
            redact,
        } = options;
        let stopping = CancellationToken::new();
        let keys = auth::ApiKeys::new(&api_keys);
        // Keyed exactly when keys are checked (blank keys are dropped there).
        let guard = Arc::new(guard::BrowserGuard::new(keys.required(), &allowed_origins));
        let allowed_origins = allowed_origins
            .iter()
            .filter_map(|origin| guard::normalise_origin(origin))
            .filter_map(|origin| axum::http::HeaderValue::from_str(&origin).ok())
            .collect();
        let state = chat::ServerState {
            agent,
            model_id,
            keys,
            body_limits: limits::BodyLimits::new(max_body_bytes, body_timeout, max_turns_in_flight.saturating_mul(2)),
            max_message_bytes,
            turn_slots: limits::TurnSlots::new(max_turns_in_flight),
            status_lines,
            started_unix: chrono::Utc::now().timestamp(),
            busy: Mutex::new(HashSet::new()),
            runs: runs::RunRegistry::new(Arc::clone(&redact), stopping.clone()),
            redact,
            tasks: TaskTracker::new(),
            stopping,
        };
        Self { state: Arc::new(state), guard, allowed_origins }
    }

    /// The routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/models", get(chat::models))
            .route("/v1/models/{model}", get(chat::model))
            .route("/v1/chat/completions", post(chat::chat_completions))
            .merge(native::routes())
            .merge(ui::routes())
            .fallback(chat::unknown_route)
            .method_not_allowed_fallback(chat::method_not_allowed)
            // The handlers read bodies themselves, with their own limit and a JSON 413.
            .layer(DefaultBodyLimit::disable())
            .layer(self.cors())
            // Outside the CORS answers: nothing (not even a preflight) is answered for a refused
            // request.
            .layer(axum::middleware::from_fn_with_state(Arc::clone(&self.guard), guard::guard))
            // Outermost: every request is logged, refused ones too.
            .layer(axum::middleware::from_fn(request_log::log_request))
            .with_state(Arc::clone(&self.state))
    }

    /// CORS answers for `allowed_origins` only (none when there are none): a page served there
    /// may call the API, and no other page can read an answer.
    fn cors(&self) -> tower_http::cors::CorsLayer {
        use axum::http::{Method, header};
        use tower_http::cors::{AllowOrigin, CorsLayer};
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(self.allowed_origins.clone()))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("last-event-id"),
                header::HeaderName::from_static(SESSION_ID_HEADER),
            ])
            .max_age(std::time::Duration::from_secs(600))
    }

    /// How many turns (chat completions and runs) are running now.
    pub fn running(&self) -> usize {
        self.state.tasks.len()
    }

    /// How many turns hold a place among `max_turns_in_flight` now (background tasks included).
    pub fn turns_in_flight(&self) -> usize {
        self.state.turn_slots.in_flight()
    }

    /// Stops the turns: no new ones start; the running ones get up to `grace` to end, then
    /// the rest are cancelled (each keeps its last checkpoint and can be continued; its
    /// followers get its `end` event). Returns how many were cancelled.
    pub async fn shut_down(&self, grace: std::time::Duration) -> usize {
        self.state.tasks.close();
        if tokio::time::timeout(grace, self.state.tasks.wait()).await.is_ok() {
            return 0;
        }
        let cut_off = self.state.tasks.len();
        tracing::warn!(turns = cut_off, "cancelling the turns still running");
        self.state.stopping.cancel();
        // A cancelled turn ends at its next await point; do not hang on one that does not.
        let _ = tokio::time::timeout(grace, self.state.tasks.wait()).await;
        cut_off
    }
}

//! The native threads/runs API over real HTTP: the weather agent on the scripted LLM server,
//! served by `router()` on 127.0.0.1 and called with reqwest as the web UI or a LangGraph-style
//! client would: the SSE events of a whole turn, reconnection with `Last-Event-ID`, cancel and
//! continue, busy threads, key isolation, approvals and bad requests.

#![allow(clippy::expect_used, clippy::unwrap_used, reason = "tests")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use peregrine_llm::Secret;
use peregrine_server::{ConnectionLimits, Server, ServerOptions};
use peregrine_testkit::agent_fixture::{LOCATION_EXTRACTION, LlmCall, call_counts, location_reply, weather_agent, with_weather_replies};
use peregrine_testkit::llm_server::{Fault, Reply, Script, ScriptedLlmServer};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

const MODEL: &str = "peregrine-weather";
const QUESTION: &str = "What's the weather in San Francisco?";
const PLANNING: &str = "/planning What's the weather in San Francisco?";
/// What every answer of the scripted weather turn says (its task extraction always names Prague).
const PRAGUE_ANSWER: &str = "Weather in Prague";
const KEY_A: &str = "sk-native-alpha";
const KEY_B: &str = "sk-native-bravo";
/// How long one step of a test may take before the test fails; a bound, never a synchronisation.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Setup

/// How `current_weather`'s LLM call (its location extraction) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum WeatherCall {
    /// Correctly.
    Answer = 0,
    /// Not at all: the call is reported, then held until its run is cancelled (the agent's
    /// 30 s read timeout is far beyond any test's patience).
    Hold = 1,
    /// With HTTP 500, so that the step fails and the turn ends in the error node.
    Fail = 2,
}

/// The server under test, its scripted LLM, and the switch for `current_weather`'s call.
struct Served {
    url: String,
    llm: ScriptedLlmServer,
    client: reqwest::Client,
    weather_call: Arc<AtomicU8>,
    /// One message per `current_weather` call held.
    held: Mutex<mpsc::UnboundedReceiver<()>>,
    /// The served agent (its running turns, its shutdown).
    server: Server,
    _dir: tempfile::TempDir,
}

/// The healthy weather turn, except for `current_weather`'s call while `mode` says otherwise.
fn switchable_weather_script(mode: Arc<AtomicU8>, held: mpsc::UnboundedSender<()>) -> Script {
    let location = location_reply();
    let reply = Reply::from_fn(move |_| match mode.load(Ordering::SeqCst) {
        mode if mode == WeatherCall::Hold as u8 => {
            let _ = held.send(());
            Reply::fault(Fault::Timeout)
        }
        mode if mode == WeatherCall::Fail as u8 => Reply::fault(Fault::Status(500)),
        _ => location.clone(),
    });
    with_weather_replies(Script::new().on_schema(LOCATION_EXTRACTION, reply))
}

async fn serve(options: ServerOptions) -> Served {
    serve_with(options, ConnectionLimits::default()).await
}

async fn serve_with(options: ServerOptions, limits: ConnectionLimits) -> Served {
    let weather_call = Arc::new(AtomicU8::new(WeatherCall::Answer as u8));
    let (held_sender, held) = mpsc::unbounded_channel();
    let llm = ScriptedLlmServer::start(switchable_weather_script(Arc::clone(&weather_call), held_sender)).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agent = weather_agent(&llm.base_url(), 30.0, &dir.path().join("checkpoints.db"), &data).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = Server::new(Arc::new(agent), options);
    let app = server.router();
    tokio::spawn(peregrine_server::serve(listener, app, limits, tokio_util::sync::CancellationToken::new()));
    Served { url, llm, client: reqwest::Client::new(), weather_call, held: Mutex::new(held), server, _dir: dir }
}

fn open() -> ServerOptions {
    ServerOptions::new(MODEL)
}

fn keyed() -> ServerOptions {
    ServerOptions { api_keys: vec![Secret::new(KEY_A), Secret::new(KEY_B)], ..open() }
}

/// Awaits `future`, failing the test when it takes longer than [`PATIENCE`].
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future).await.unwrap_or_else(|_| panic!("{what} took longer than {PATIENCE:?}"))
}

/// A caller of the API: no key, or one of the server's keys.
#[derive(Clone, Copy)]
struct As(Option<&'static str>);

const ANYONE: As = As(None);
const ALPHA: As = As(Some(KEY_A));
const BRAVO: As = As(Some(KEY_B));

impl Served {
    fn request(&self, who: As, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.url));
        match who.0 {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// Sends a request and reads its JSON answer (`null` for an empty body).
    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = within("a request", request.send()).await.unwrap();
        let status = response.status().as_u16();
        let text = within("an answer", response.text()).await.unwrap();
        let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}")) };
        (status, body)
    }

    async fn get(&self, who: As, path: &str) -> (u16, Value) {
        self.send(self.request(who, Method::GET, path)).await
    }

    async fn post(&self, who: As, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.request(who, Method::POST, path).json(body)).await
    }

    async fn delete(&self, who: As, path: &str) -> (u16, Value) {
        self.send(self.request(who, Method::DELETE, path)).await
    }

    async fn create_thread(&self, who: As) -> String {
        let (status, thread) = self.post(who, "/threads", &json!({})).await;
        assert_eq!(status, 201, "{thread}");
        thread["thread_id"].as_str().unwrap().to_owned()
    }

    /// Starts a run with `POST …/runs`: 201 with the run, which holds its thread by now.
    async fn start_run(&self, who: As, thread: &str, body: &Value) -> Value {
        let (status, run) = self.post(who, &format!("/threads/{thread}/runs"), body).await;
        assert_eq!(status, 201, "{run}");
        assert_eq!(run["thread_id"], thread, "{run}");
        run
    }

    /// Runs to the end with `POST …/runs/wait`.
    async fn run_to_end(&self, who: As, thread: &str, body: &Value) -> Value {
        let (status, run) = self.post(who, &format!("/threads/{thread}/runs/wait"), body).await;
        assert_eq!(status, 200, "{run}");
        assert!(run["finished_at"].is_string(), "a waited run has ended: {run}");
        run
    }

    async fn thread(&self, who: As, thread: &str) -> Value {
        let (status, body) = self.get(who, &format!("/threads/{thread}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn state(&self, who: As, thread: &str) -> Value {
        let (status, body) = self.get(who, &format!("/threads/{thread}/state")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Opens an SSE answer and checks it is one.
    async fn sse(&self, request: reqwest::RequestBuilder) -> Sse {
        let response = within("an SSE answer", request.send()).await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{:?}", within("an error body", response.text()).await);
        let content_type = response.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or_default();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        Sse { body: Box::pin(response.bytes_stream()), buffer: Vec::new() }
    }

    /// Follows a run's stream with `GET …/runs/{rid}/stream`, after `Last-Event-ID: after` if given.
    async fn follow(&self, who: As, thread: &str, run: &str, after: Option<&str>) -> Sse {
        let mut request = self.request(who, Method::GET, &format!("/threads/{thread}/runs/{run}/stream"));
        if let Some(after) = after {
            request = request.header("Last-Event-ID", after);
        }
        self.sse(request).await
    }

    /// How `current_weather`'s calls are answered from now on (a call already held stays held
    /// until its run is cancelled).
    fn weather_calls(&self, mode: WeatherCall) {
        self.weather_call.store(mode as u8, Ordering::SeqCst);
    }

    /// Waits until a `current_weather` call is held: the run is mid-way, inside that step.
    async fn held_weather_call(&self) {
        let mut held = self.held.lock().await;
        within("the held current_weather call", held.recv()).await.expect("the scripted server is running");
    }

    fn calls(&self, call: LlmCall) -> usize {
        call_counts(&self.llm.chat_requests()).get(&call).copied().unwrap_or(0)
    }
}

fn assert_error(status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status, expected_status, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"].as_str(), Some(code), "{body}");
    assert!(error["message"].as_str().is_some_and(|message| message.len() > 20), "a message that explains: {body}");
    assert!(error["type"].is_string() && error.get("param").is_some(), "{body}");
}

// ---------------------------------------------------------------------------------------------
// SSE

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: u64,
    name: String,
    data: Value,
}

/// An SSE answer read event by event: `id:`, `event:` and `data:` lines, `:` comments skipped.
struct Sse {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buffer: Vec<u8>,
}

impl Sse {
    /// The next event, or `None` once the stream has closed.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_event(std::str::from_utf8(&block).expect("SSE is UTF-8")) {
                    return Some(event);
                }
                continue;
            }
            match within("the next SSE event", self.body.next()).await {
                Some(chunk) => self.buffer.extend_from_slice(&chunk.expect("the SSE body reads")),
                None => {
                    assert!(self.buffer.iter().all(u8::is_ascii_whitespace), "the stream ended mid-event: {:?}", self.buffer);
                    return None;
                }
            }
        }
    }

    /// Every event up to the end of the stream.
    async fn rest(mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }

    /// Events until (and with) the first one `last` accepts.
    async fn until(&mut self, last: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.unwrap_or_else(|| panic!("the stream ended before the awaited event: {events:?}"));
            let done = last(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

/// One event block; `None` for a block of comments only (`: keep-alive`).
fn parse_event(block: &str) -> Option<Event> {
    let (mut id, mut name, mut data) = (None, None, Vec::new());
    for line in block.lines().map(|line| line.trim_end_matches('\r')).filter(|line| !line.is_empty()) {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.parse::<u64>().unwrap_or_else(|_| panic!("an event id is a number: {block:?}"))),
            "event" => name = Some(value.to_owned()),
            "data" => data.push(value),
            other => panic!("unknown SSE field {other:?} in {block:?}"),
        }
    }
    if id.is_none() && name.is_none() && data.is_empty() {
        return None;
    }
    let data = data.join("\n");
    Some(Event {
        id: id.unwrap_or_else(|| panic!("every event has an id: {block:?}")),
        name: name.unwrap_or_else(|| panic!("every event has a name: {block:?}")),
        data: serde_json::from_str(&data).unwrap_or_else(|_| panic!("the data is JSON: {block:?}")),
    })
}

fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|event| event.name.as_str()).collect()
}

/// Checks the ids run `first`, `first + 1`, … with no gap or repeat.
fn assert_consecutive(events: &[Event], first: u64) {
    let ids: Vec<u64> = events.iter().map(|event| event.id).collect();
    let expected: Vec<u64> = (first..first + events.len() as u64).collect();
    assert_eq!(ids, expected, "{:?}", names(events));
}

/// Checks a whole run's events: `metadata` first, `end` last and only there, the ids 1, 2, 3, …;
/// returns the `end` event's run.
fn assert_whole_run(events: &[Event], thread: &str) -> Value {
    assert_consecutive(events, 1);
    let metadata = &events[0];
    assert_eq!(metadata.name, "metadata", "{:?}", names(events));
    assert_eq!(metadata.data["thread_id"], thread);
    let end = events.last().unwrap();
    assert_eq!(end.name, "end", "{:?}", names(events));
    assert_eq!(events.iter().filter(|event| event.name == "end").count(), 1, "{:?}", names(events));
    assert_eq!(end.data["run_id"], metadata.data["run_id"], "the end event is the run's");
    end.data.clone()
}

fn first_index(events: &[Event], name: &str) -> usize {
    events.iter().position(|event| event.name == name).unwrap_or_else(|| panic!("no {name} event in {:?}", names(events)))
}

// ---------------------------------------------------------------------------------------------
// 1. A whole turn

#[tokio::test]
async fn a_streamed_turn_sends_every_event_in_order_and_leaves_the_thread_idle() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let other = served.create_thread(ANYONE).await;
    let stream_request = served.request(ANYONE, Method::POST, &format!("/threads/{thread}/runs/stream")).json(&json!({"input": QUESTION}));
    let events = served.sse(stream_request).await.rest().await;
    let end = assert_whole_run(&events, &thread);
    let run_id = events[0].data["run_id"].as_str().unwrap().to_owned();
    assert!(!run_id.is_empty());

    assert_eq!(events[1].name, "run_started", "{:?}", names(&events));
    assert_eq!(events[1].data["thread_id"], thread.as_str());

    // Nodes run one at a time: each node_started is followed by its node_finished.
    let node_events: Vec<&Event> = events.iter().filter(|event| event.name.starts_with("node_")).collect();
    let mut nodes = Vec::new();
    for pair in node_events.chunks(2) {
        let [started, finished] = pair else { panic!("a node_started without its node_finished: {:?}", names(&events)) };
        assert_eq!((started.name.as_str(), finished.name.as_str()), ("node_started", "node_finished"), "{:?}", names(&events));
        assert_eq!(started.data["node"], finished.data["node"]);
        assert_eq!(started.data["step"], finished.data["step"]);
        assert!(finished.data["checkpoint_id"].is_u64() && finished.data["duration_ms"].is_u64(), "{:?}", finished.data);
        nodes.push(started.data["node"].as_str().unwrap().to_owned());
    }
    assert_eq!(nodes, ["task_extraction", "classifier", "orchestrator", "current_weather", "respond"]);

    let plan_created = first_index(&events, "plan_created");
    assert!(plan_created < first_index(&events, "capability_start"), "{:?}", names(&events));
    let steps = events[plan_created].data["steps"].as_array().unwrap();
    let planned: Vec<&str> = steps.iter().map(|step| step["capability"].as_str().unwrap()).collect();
    assert_eq!(planned, ["current_weather", "respond"]);

    // Each step: capability_start, then its capability_complete before the next step starts.
    let step_events: Vec<&Event> = events.iter().filter(|event| event.name.starts_with("capability_")).collect();
    let mut started = Vec::new();
    for pair in step_events.chunks(2) {
        let [start, complete] = pair else { panic!("a capability_start without its capability_complete: {:?}", names(&events)) };
        assert_eq!((start.name.as_str(), complete.name.as_str()), ("capability_start", "capability_complete"));
        assert_eq!(start.data["capability_name"], complete.data["capability_name"]);
        assert_eq!(complete.data["success"], true, "{:?}", complete.data);
        assert_eq!(start.data["total_steps"], 2, "{:?}", start.data);
        started.push((start.data["step_number"].as_u64().unwrap(), start.data["capability_name"].as_str().unwrap().to_owned()));
    }
    assert_eq!(started, [(1, "current_weather".to_owned()), (2, "respond".to_owned())]);
    for agent_event in events.iter().filter(|event| event.name.starts_with("capability_") || event.name == "plan_created") {
        assert!(agent_event.data["timestamp"].is_string() && agent_event.data["component"].is_string(), "{agent_event:?}");
    }

    let tokens: String = events.iter().filter(|event| event.name == "token").map(|event| event.data["content"].as_str().unwrap()).collect();
    assert!(tokens.starts_with("Here is the current weather.") && tokens.contains(PRAGUE_ANSWER), "{tokens:?}");
    let first_token = first_index(&events, "token");
    assert!(first_token > first_index(&events, "capability_start"), "tokens come from the respond step");
    let run_finished = first_index(&events, "run_finished");
    assert_eq!(run_finished, events.len() - 2, "run_finished comes just before end: {:?}", names(&events));
    assert_eq!(events[run_finished].data["last_node"], "respond");

    assert_eq!(end["status"], "success", "{end}");
    assert_eq!(end["kind"], "message");
    assert_eq!(end["thread_id"], thread.as_str());
    assert_eq!(end["result"]["status"], "completed");
    assert_eq!(end["result"]["response"].as_str(), Some(tokens.as_str()), "the streamed tokens are the answer");
    assert!(end["result"]["interrupt"].is_null() && end["error"].is_null(), "{end}");

    // The thread afterwards.
    let state = served.state(ANYONE, &thread).await;
    assert_eq!(state["status"], "idle", "{state}");
    assert_eq!(state["thread_id"], thread.as_str());
    let messages: Vec<(&str, &str)> =
        state["messages"].as_array().unwrap().iter().map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap())).collect();
    assert_eq!(messages, [("user", QUESTION), ("assistant", tokens.as_str())]);
    let plan: Vec<&str> = state["plan"]["steps"].as_array().unwrap().iter().map(|step| step["capability"].as_str().unwrap()).collect();
    assert_eq!(plan, ["current_weather", "respond"]);
    assert!(state["interrupt"].is_null() && state["next"].is_null(), "{state}");
    assert!(state["checkpoint_id"].is_u64() && state["values"].is_object(), "{state}");

    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!(
        (summary["status"].as_str(), summary["resumable"].as_bool(), summary["messages"].as_u64(), summary["title"].as_str()),
        (Some("idle"), Some(false), Some(2), Some(QUESTION)),
        "{summary}"
    );
    assert!(summary["created_at"].as_str() <= summary["updated_at"].as_str(), "{summary}");

    let (status, listed) = served.get(ANYONE, "/threads").await;
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|listed| listed["thread_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [thread.as_str(), other.as_str()], "the most recently updated first");
    assert_eq!(listed[0], summary, "a listed thread is the thread");
    let (_, second_page) = served.get(ANYONE, "/threads?limit=1&offset=1").await;
    assert_eq!(second_page.as_array().map(Vec::len), Some(1), "{second_page}");
    assert_eq!(second_page[0]["thread_id"], other.as_str());

    let (status, history) = served.get(ANYONE, &format!("/threads/{thread}/history")).await;
    assert_eq!(status, 200, "{history}");
    let ids: Vec<u64> = history.as_array().unwrap().iter().map(|meta| meta["checkpoint_id"].as_u64().unwrap()).collect();
    assert!(ids.len() > 5, "{history}");
    assert!(ids.windows(2).all(|pair| pair[0] > pair[1]), "newest first: {ids:?}");
    assert_eq!(Some(ids[0]), state["checkpoint_id"].as_u64(), "the newest checkpoint is the state's");
    let (_, page) = served.get(ANYONE, &format!("/threads/{thread}/history?limit=2&before={}", ids[1])).await;
    let paged: Vec<u64> = page.as_array().unwrap().iter().map(|meta| meta["checkpoint_id"].as_u64().unwrap()).collect();
    assert_eq!(paged, ids[2..4], "a page before a checkpoint");

    let (status, runs) = served.get(ANYONE, &format!("/threads/{thread}/runs")).await;
    assert_eq!(status, 200, "{runs}");
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs[0]["run_id"], run_id.as_str());
    assert_eq!(runs[0]["status"], "success");
    let (status, run) = served.get(ANYONE, &format!("/threads/{thread}/runs/{run_id}")).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run, end, "the run is what its end event said");
}

// ---------------------------------------------------------------------------------------------
// 2. Reconnecting

#[tokio::test]
async fn a_stream_resumes_after_last_event_id_without_gap_or_repeat() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let run = served.start_run(ANYONE, &thread, &json!({"input": QUESTION})).await;
    let run_id = run["run_id"].as_str().unwrap();
    assert_eq!(run["kind"], "message");

    let mut first = served.follow(ANYONE, &thread, run_id, None).await;
    let head = first.until(|event| event.id == 3).await;
    assert_consecutive(&head, 1);
    drop(first);
    let tail = served.follow(ANYONE, &thread, run_id, Some("3")).await.rest().await;
    assert_consecutive(&tail, 4);
    let joined: Vec<Event> = head.iter().chain(&tail).cloned().collect();
    let end = assert_whole_run(&joined, &thread);
    assert_eq!(end["status"], "success", "{end}");

    // The run has ended: its stream replays everything, then closes.
    let replay = served.follow(ANYONE, &thread, run_id, None).await.rest().await;
    assert_eq!(replay, joined, "a finished run's stream is the same events");

    let query = served.request(ANYONE, Method::GET, &format!("/threads/{thread}/runs/{run_id}/stream?last_event_id=5"));
    let after_five = served.sse(query).await.rest().await;
    assert_eq!(after_five, joined[5..], "?last_event_id= works like the header");

    let both = served
        .request(ANYONE, Method::GET, &format!("/threads/{thread}/runs/{run_id}/stream?last_event_id=1"))
        .header("Last-Event-ID", joined.len().to_string());
    assert_eq!(served.sse(both).await.rest().await, [], "the header wins; after the last event nothing is left");

    for bad in ["abc", "-1", "3.5", ""] {
        let request = served.request(ANYONE, Method::GET, &format!("/threads/{thread}/runs/{run_id}/stream")).header("Last-Event-ID", bad);
        let (status, body) = served.send(request).await;
        assert_error(status, &body, 400, "invalid_request");
    }
}

#[tokio::test]
async fn a_dropped_stream_client_does_not_cancel_its_run() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let request = served.request(ANYONE, Method::POST, &format!("/threads/{thread}/runs/stream")).json(&json!({"input": QUESTION}));
    let mut stream = served.sse(request).await;
    let head = stream.until(|event| event.id == 3).await;
    drop(stream);
    let run_id = head[0].data["run_id"].as_str().unwrap();
    let (status, waited) = served.get(ANYONE, &format!("/threads/{thread}/runs/{run_id}/wait")).await;
    assert_eq!(status, 200, "{waited}");
    assert_eq!(waited["status"], "success", "{waited}");
    assert!(waited["result"]["response"].as_str().is_some_and(|answer| answer.contains(PRAGUE_ANSWER)), "{waited}");
    let tail = served.follow(ANYONE, &thread, run_id, Some("3")).await.rest().await;
    let joined: Vec<Event> = head.iter().chain(&tail).cloned().collect();
    assert_eq!(assert_whole_run(&joined, &thread), waited);
}

// ---------------------------------------------------------------------------------------------
// 3. Cancel and continue

#[tokio::test]
async fn a_cancelled_run_leaves_a_resumable_thread_that_continue_finishes() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    served.weather_calls(WeatherCall::Hold);
    let run = served.start_run(ANYONE, &thread, &json!({"input": QUESTION})).await;
    let run_id = run["run_id"].as_str().unwrap();
    assert_eq!(run["status"], "running", "{run}");
    served.held_weather_call().await;

    // Follow the live run up to the held step, drop the connection, cancel, and reconnect.
    let mut live = served.follow(ANYONE, &thread, run_id, None).await;
    let head = live.until(|event| event.name == "capability_start").await;
    drop(live);
    assert_eq!(head.last().unwrap().data["capability_name"], "current_weather");
    let (status, run) = served.get(ANYONE, &format!("/threads/{thread}/runs/{run_id}")).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("running")), "a dropped stream does not cancel the run: {run}");

    let (status, accepted) = served.post(ANYONE, &format!("/threads/{thread}/runs/{run_id}/cancel"), &json!({})).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["run_id"], run_id);
    let after = head.last().unwrap().id.to_string();
    let tail = served.follow(ANYONE, &thread, run_id, Some(&after)).await.rest().await;
    let joined: Vec<Event> = head.iter().chain(&tail).cloned().collect();
    let end = assert_whole_run(&joined, &thread);
    assert_eq!(end["status"], "cancelled", "{end}");
    assert!(!names(&tail).contains(&"token"), "nothing was answered: {:?}", names(&tail));

    let (status, waited) = served.get(ANYONE, &format!("/threads/{thread}/runs/{run_id}/wait")).await;
    assert_eq!(status, 200, "{waited}");
    assert_eq!(waited["status"], "cancelled", "{waited}");
    assert!(waited["finished_at"].is_string(), "{waited}");
    assert!(waited["error"].is_null(), "a cancel is not an error: {waited}");

    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), summary["resumable"].as_bool()), (Some("error"), Some(true)), "{summary}");
    let state = served.state(ANYONE, &thread).await;
    assert!(state["next"].is_string(), "the thread stopped mid-run: {state}");

    served.weather_calls(WeatherCall::Answer);
    let continued = served.run_to_end(ANYONE, &thread, &json!({"continue": true})).await;
    assert_eq!((continued["kind"].as_str(), continued["status"].as_str()), (Some("continue"), Some("success")), "{continued}");
    let answer = continued["result"]["response"].as_str().unwrap_or_default();
    assert!(answer.starts_with("Here is the current weather.") && answer.contains(PRAGUE_ANSWER), "{continued}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1, "the plan was not made again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 2, "the held call, then the continued one");
    assert_eq!(served.calls(LlmCall::Respond), 1);

    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), summary["resumable"].as_bool()), (Some("idle"), Some(false)), "{summary}");
    let state = served.state(ANYONE, &thread).await;
    let roles: Vec<&str> = state["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant"], "one question, one answer: {state}");

    let (status, body) = served.post(ANYONE, &format!("/threads/{thread}/runs/{run_id}/cancel"), &json!({})).await;
    assert_error(status, &body, 409, "run_finished");
    let (status, runs) = served.get(ANYONE, &format!("/threads/{thread}/runs")).await;
    assert_eq!(status, 200);
    let kinds: Vec<(&str, &str)> =
        runs.as_array().unwrap().iter().map(|run| (run["kind"].as_str().unwrap(), run["status"].as_str().unwrap())).collect();
    assert_eq!(kinds, [("continue", "success"), ("message", "cancelled")], "newest first");
}

// ---------------------------------------------------------------------------------------------
// 4. A busy thread

#[tokio::test]
async fn a_thread_with_an_active_run_refuses_a_second_run_a_chat_turn_and_deletion() {
    let served = serve(open()).await;
    // An OpenAI-compatible conversation, which the native API sees as a thread.
    let chat = |text: &str| {
        served
            .request(ANYONE, Method::POST, "/v1/chat/completions")
            .header("X-Session-Id", "native-busy")
            .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": text}]}))
    };
    let (status, answer) = served.send(chat(QUESTION)).await;
    assert_eq!(status, 200, "{answer}");
    let (_, threads) = served.get(ANYONE, "/threads").await;
    let thread = threads.as_array().unwrap()[0]["thread_id"].as_str().unwrap().to_owned();
    assert!(thread.starts_with("oai-"), "{threads}");

    // Two runs asked for at once: exactly one gets the thread.
    served.weather_calls(WeatherCall::Hold);
    let runs = format!("/threads/{thread}/runs");
    let body = json!({"input": "And in Brno?"});
    let (one, two) = tokio::join!(served.post(ANYONE, &runs, &body), served.post(ANYONE, &runs, &body));
    let (run, refused) = if one.0 == 201 { (one.1, two) } else { (two.1, one) };
    assert_error(refused.0, &refused.1, 409, "thread_busy");
    let run_id = run["run_id"].as_str().unwrap_or_else(|| panic!("one run starts: {run}"));
    served.held_weather_call().await;

    for path in [runs.clone(), format!("{runs}/wait"), format!("{runs}/stream")] {
        let (status, body) = served.post(ANYONE, &path, &json!({"input": QUESTION})).await;
        assert_error(status, &body, 409, "thread_busy");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("still running"), "the message says why and what to do: {message}");
    }
    let (status, body) = served.post(ANYONE, &runs, &json!({"continue": true})).await;
    assert_error(status, &body, 409, "thread_busy");
    let (status, body) = served.send(chat(QUESTION)).await;
    assert_error(status, &body, 409, "thread_busy");
    let (status, body) = served.delete(ANYONE, &format!("/threads/{thread}")).await;
    assert_error(status, &body, 409, "thread_busy");

    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), summary["resumable"].as_bool()), (Some("busy"), Some(false)), "{summary}");
    assert_eq!(served.state(ANYONE, &thread).await["status"], "busy");
    let (_, listed) = served.get(ANYONE, &runs).await;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "refused runs are not kept: {listed}");
    assert_eq!((listed[0]["run_id"].as_str(), listed[0]["status"].as_str()), (Some(run_id), Some("running")));

    let (status, _) = served.post(ANYONE, &format!("{runs}/{run_id}/cancel"), &json!({})).await;
    assert_eq!(status, 202);
    let (_, waited) = served.get(ANYONE, &format!("{runs}/{run_id}/wait")).await;
    assert_eq!(waited["status"], "cancelled", "{waited}");
    assert_ne!(served.thread(ANYONE, &thread).await["status"], "busy");
    let (status, body) = served.delete(ANYONE, &format!("/threads/{thread}")).await;
    assert_eq!(status, 204, "{body}");
}

// ---------------------------------------------------------------------------------------------
// 5. Keys

#[tokio::test]
async fn a_thread_is_invisible_to_another_key() {
    let served = serve(keyed()).await;
    let thread = served.create_thread(ALPHA).await;
    assert!(thread.starts_with("t-"), "{thread}");
    let run = served.run_to_end(ALPHA, &thread, &json!({"input": QUESTION})).await;
    assert_eq!(run["status"], "success", "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let theirs = served.create_thread(BRAVO).await;
    assert_ne!(thread.split('-').nth(1), theirs.split('-').nth(1), "each key has its own owner tag");

    let (status, listed) = served.get(BRAVO, "/threads").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed.as_array().unwrap().iter().map(|thread| thread["thread_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [theirs.as_str()], "B lists only its own thread");

    let thread_paths = [format!("/threads/{thread}"), format!("/threads/{thread}/state"), format!("/threads/{thread}/history")];
    let run_paths = [
        format!("/threads/{thread}/runs"),
        format!("/threads/{thread}/runs/{run_id}"),
        format!("/threads/{thread}/runs/{run_id}/stream"),
        format!("/threads/{thread}/runs/{run_id}/wait"),
    ];
    for path in thread_paths.iter().chain(&run_paths) {
        let (status, body) = served.get(BRAVO, path).await;
        assert_error(status, &body, 404, "thread_not_found");
        let message = body["error"]["message"].as_str().unwrap();
        let (missing_status, missing) = served.get(BRAVO, &path.replace(&thread, &format!("{thread}0"))).await;
        assert_eq!(missing_status, 404, "{missing}");
        assert_eq!(message, missing["error"]["message"].as_str().unwrap().replace(&format!("{thread}0"), &thread), "same as a missing one");
    }
    for path in ["runs", "runs/wait", "runs/stream"] {
        let (status, body) = served.post(BRAVO, &format!("/threads/{thread}/{path}"), &json!({"input": QUESTION})).await;
        assert_error(status, &body, 404, "thread_not_found");
    }
    let (status, body) = served.post(BRAVO, &format!("/threads/{thread}/runs/{run_id}/cancel"), &json!({})).await;
    assert_error(status, &body, 404, "thread_not_found");
    let (status, body) = served.delete(BRAVO, &format!("/threads/{thread}")).await;
    assert_error(status, &body, 404, "thread_not_found");

    for path in ["/threads".to_owned(), format!("/threads/{thread}"), format!("/threads/{thread}/state")] {
        let (status, body) = served.get(ANYONE, &path).await;
        assert_error(status, &body, 401, "invalid_api_key");
        let (status, body) = served.get(As(Some("sk-wrong")), &path).await;
        assert_error(status, &body, 401, "invalid_api_key");
    }
    let (status, body) = served.post(ANYONE, "/threads", &json!({})).await;
    assert_error(status, &body, 401, "invalid_api_key");
    let (status, body) = served.post(ANYONE, &format!("/threads/{thread}/runs"), &json!({"input": QUESTION})).await;
    assert_error(status, &body, 401, "invalid_api_key");
    let (status, body) = served.post(ALPHA, "/threads", &json!({"thread_id": "mine"})).await;
    assert_error(status, &body, 400, "invalid_request");

    // A still sees it all, and can delete it.
    assert_eq!(served.state(ALPHA, &thread).await["messages"].as_array().map(Vec::len), Some(2));
    let (status, body) = served.delete(ALPHA, &format!("/threads/{thread}")).await;
    assert_eq!(status, 204, "{body}");
    for path in &thread_paths {
        let (status, body) = served.get(ALPHA, path).await;
        assert_error(status, &body, 404, "thread_not_found");
    }
    let (status, body) = served.get(ALPHA, &format!("/threads/{thread}/runs/{run_id}")).await;
    assert_error(status, &body, 404, "thread_not_found");
    let (_, listed) = served.get(ALPHA, "/threads").await;
    assert_eq!(listed, json!([]), "{listed}");
}

// ---------------------------------------------------------------------------------------------
// 6. Approvals

fn approval_of(run: &Value) -> Value {
    assert_eq!(run["status"], "interrupted", "{run}");
    assert_eq!(run["result"]["status"], "interrupted", "{run}");
    let interrupt = run["result"]["interrupt"].clone();
    assert_eq!(interrupt["approval_type"], "orchestrator_plan", "{run}");
    assert!(interrupt["id"].as_str().is_some_and(|id| !id.is_empty()), "{interrupt}");
    assert!(interrupt["message"].as_str().is_some_and(|message| message.contains("HUMAN APPROVAL REQUIRED")), "{interrupt}");
    assert_eq!(run["result"]["response"], interrupt["message"], "the prompt is the run's response");
    let steps = interrupt["payload"]["execution_plan"]["steps"].as_array().unwrap_or_else(|| panic!("{interrupt:#}"));
    let planned: Vec<&str> = steps.iter().map(|step| step["capability"].as_str().unwrap()).collect();
    assert_eq!(planned, ["current_weather", "respond"], "{interrupt}");
    for field in ["context_key", "task_objective", "success_criteria", "expected_output", "inputs"] {
        assert!(steps[0].get(field).is_some(), "{field} in {}", steps[0]);
    }
    interrupt
}

#[tokio::test]
async fn a_plan_approval_can_be_rejected_then_approved_with_an_edit() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let asked = served.run_to_end(ANYONE, &thread, &json!({"input": PLANNING})).await;
    let first = approval_of(&asked);
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0, "nothing runs before the approval");

    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!(summary["status"], "interrupted", "{summary}");
    assert_eq!(summary["interrupt"], first, "{summary}");
    assert_eq!(served.state(ANYONE, &thread).await["interrupt"], first);

    let runs = format!("/threads/{thread}/runs");
    let (status, body) = served.post(ANYONE, &runs, &json!({"resume": {"approved": true, "interrupt_id": "not-this-one"}})).await;
    assert_error(status, &body, 409, "stale_approval");
    let edited_rejection = json!({"resume": {"approved": false, "plan": first["payload"]["execution_plan"]}});
    let (status, body) = served.post(ANYONE, &runs, &edited_rejection).await;
    assert_error(status, &body, 400, "invalid_request");

    let rejected = served.run_to_end(ANYONE, &thread, &json!({"resume": {"approved": false, "interrupt_id": first["id"]}})).await;
    assert_eq!(rejected["kind"], "resume");
    let second = approval_of(&rejected);
    assert_ne!(second["id"], first["id"], "a new plan is a new question");
    assert_eq!(served.calls(LlmCall::Orchestrator), 2, "the rejection planned again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0);
    let (status, body) = served.post(ANYONE, &runs, &json!({"resume": {"approved": true, "interrupt_id": first["id"]}})).await;
    assert_error(status, &body, 409, "stale_approval");

    let mut plan = second["payload"]["execution_plan"].clone();
    plan["steps"][0]["task_objective"] = json!("Get the current weather in Paris");
    let approve = json!({"resume": {"approved": true, "interrupt_id": second["id"], "plan": plan}});
    let done = served.run_to_end(ANYONE, &thread, &approve).await;
    assert_eq!((done["kind"].as_str(), done["status"].as_str()), (Some("resume"), Some("success")), "{done}");
    let answer = done["result"]["response"].as_str().unwrap_or_default();
    assert!(answer.contains("Weather in Paris"), "the edited plan ran: {done}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 2, "an approved plan is not planned again");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 1);

    let state = served.state(ANYONE, &thread).await;
    assert_eq!(state["plan"]["steps"][0]["task_objective"], "Get the current weather in Paris", "{state}");
    assert!(state["interrupt"].is_null(), "{state}");
    assert_eq!(state["status"], "idle");
    assert_eq!(state["messages"].as_array().unwrap().last().unwrap()["content"], answer);

    let (status, body) = served.post(ANYONE, &runs, &json!({"resume": {"approved": true, "interrupt_id": second["id"]}})).await;
    assert_error(status, &body, 409, "no_pending_approval");
}

#[tokio::test]
async fn an_approval_can_be_withdrawn_by_id_and_digest_and_the_thread_is_idle() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let asked = served.run_to_end(ANYONE, &thread, &json!({"input": PLANNING})).await;
    let interrupt = approval_of(&asked);
    let runs = format!("/threads/{thread}/runs");
    for malformed in [
        json!({"resume": {"interrupt_id": interrupt["id"], "abandon": false}}),
        json!({"resume": {"interrupt_id": interrupt["id"], "abandon": true, "approved": true}}),
        json!({"resume": {"interrupt_id": interrupt["id"], "abandon": true, "answer": "no"}}),
        json!({"resume": {"abandon": true}}),
    ] {
        let (status, body) = served.post(ANYONE, &runs, &malformed).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    let forged = json!({"resume": {"interrupt_id": interrupt["id"], "digest": "0".repeat(64), "abandon": true}});
    let (status, body) = served.post(ANYONE, &runs, &forged).await;
    assert_error(status, &body, 409, "stale_approval");
    assert_eq!(served.thread(ANYONE, &thread).await["status"], "interrupted", "refused withdrawals change nothing");

    let withdraw = json!({"resume": {"interrupt_id": interrupt["id"], "abandon": true}});
    let done = served.run_to_end(ANYONE, &thread, &withdraw).await;
    assert_eq!((done["kind"].as_str(), done["status"].as_str()), (Some("resume"), Some("success")), "{done}");
    assert_eq!(done["result"]["status"], "abandoned", "{done}");
    assert_eq!(done["result"]["approval"]["outcome"], "abandoned", "{done}");
    assert_eq!(done["result"]["approval"]["interrupt_id"], interrupt["id"], "{done}");
    assert!(done["result"]["response"].as_str().is_some_and(|text| text.starts_with("Cancelled:")), "{done}");
    assert_eq!((served.calls(LlmCall::Orchestrator), served.calls(LlmCall::CurrentWeather)), (1, 0), "no new plan, nothing ran");
    let shown = served.thread(ANYONE, &thread).await;
    assert_eq!((shown["status"].as_str(), shown["resumable"].as_bool()), (Some("idle"), Some(false)), "{shown}");
    assert!(shown["interrupt"].is_null(), "{shown}");
    let state = served.state(ANYONE, &thread).await;
    let last = state["messages"].as_array().and_then(|messages| messages.last()).cloned().unwrap_or_default();
    assert_eq!(last["role"], "assistant", "the withdrawal is in the history: {state}");
    let (status, body) = served.post(ANYONE, &runs, &withdraw).await;
    assert_error(status, &body, 409, "no_pending_approval");
    let (status, body) = served.post(ANYONE, &runs, &json!({"continue": true})).await;
    assert_error(status, &body, 409, "nothing_to_continue");
    let (status, body) = served.post(ANYONE, "/threads/no-such-thread/runs", &json!({"continue": true})).await;
    assert_error(status, &body, 404, "thread_not_found");
}

#[tokio::test]
async fn a_message_never_answers_a_pending_approval_an_answer_in_words_names_its_question() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let request = served.request(ANYONE, Method::POST, &format!("/threads/{thread}/runs/stream")).json(&json!({"input": PLANNING}));
    let events = served.sse(request).await.rest().await;
    let end = assert_whole_run(&events, &thread);
    let interrupt = approval_of(&end);
    let asked = first_index(&events, "approval_required");
    assert_eq!(events[asked].data["approval_type"], "orchestrator_plan");
    let paused = first_index(&events, "interrupt");
    assert!(asked < paused && paused == events.len() - 2, "the interrupt comes just before end: {:?}", names(&events));
    assert_eq!(events[paused].data, interrupt, "the interrupt event is the pending approval");
    assert!(!names(&events).contains(&"token") && !names(&events).contains(&"capability_start"), "{:?}", names(&events));
    let runs = format!("/threads/{thread}/runs");
    for text in ["yes", "no", "What about Paris instead?"] {
        let (status, body) = served.post(ANYONE, &runs, &json!({"input": text})).await;
        assert_error(status, &body, 409, "approval_pending");
    }
    for unnamed in [json!({"resume": {"answer": "yes"}}), json!({"resume": {"approved": true}}), json!({"resume": {"approved": false}})] {
        let (status, body) = served.post(ANYONE, &runs, &unnamed).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    let (status, body) = served.post(ANYONE, &runs, &json!({"resume": {"answer": "yes", "interrupt_id": "an-older-question"}})).await;
    assert_error(status, &body, 409, "stale_approval");
    let (status, body) =
        served.post(ANYONE, &runs, &json!({"resume": {"answer": "yes", "approved": true, "interrupt_id": interrupt["id"]}})).await;
    assert_error(status, &body, 400, "invalid_request");
    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), &summary["interrupt"]), (Some("interrupted"), &interrupt), "nothing answered it: {summary}");
    let messages = served.state(ANYONE, &thread).await["messages"].clone();
    assert!(!messages.to_string().contains("Paris"), "a refused message is not stored: {messages}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0);

    let done = served.run_to_end(ANYONE, &thread, &json!({"resume": {"answer": "yes", "interrupt_id": interrupt["id"]}})).await;
    assert_eq!((done["kind"].as_str(), done["status"].as_str()), (Some("resume"), Some("success")), "{done}");
    assert!(done["result"]["response"].as_str().is_some_and(|answer| answer.contains(PRAGUE_ANSWER)), "{done}");
    assert_eq!(served.calls(LlmCall::Orchestrator), 1);
    assert_eq!(served.thread(ANYONE, &thread).await["status"], "idle");
}

#[tokio::test]
async fn a_turn_that_ends_in_the_error_node_leaves_an_error_thread_that_a_new_message_clears() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    served.weather_calls(WeatherCall::Fail);
    let failed = served.run_to_end(ANYONE, &thread, &json!({"input": QUESTION})).await;
    assert_eq!((failed["status"].as_str(), failed["result"]["status"].as_str()), (Some("error"), Some("failed")), "{failed}");
    let report = failed["result"]["response"].as_str().unwrap_or_default();
    assert!(report.contains("ERROR REPORT") && report.contains("current_weather"), "the error node's report: {failed}");
    assert!(failed["error"].is_null(), "the agent handled the failure; the run did not break: {failed}");
    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), summary["resumable"].as_bool()), (Some("error"), Some(false)), "{summary}");

    served.weather_calls(WeatherCall::Answer);
    let answered = served.run_to_end(ANYONE, &thread, &json!({"input": QUESTION})).await;
    assert_eq!(answered["status"], "success", "{answered}");
    assert_eq!(served.thread(ANYONE, &thread).await["status"], "idle");
}

// ---------------------------------------------------------------------------------------------
// 7. Bad requests

#[tokio::test]
async fn bad_run_requests_are_refused_with_400_413_and_404() {
    let served = serve(ServerOptions { max_body_bytes: 4096, ..open() }).await;
    let thread = served.create_thread(ANYONE).await;
    let runs = format!("/threads/{thread}/runs");
    let bad_bodies = [
        json!({"input": QUESTION, "continue": true}),
        json!({"input": QUESTION, "resume": {"approved": true}}),
        json!({}),
        json!({"continue": false}),
        json!({"input": QUESTION, "stream": true}),
        json!({"input": 42}),
        json!({"input": ["What's", "the weather?"]}),
        json!({"resume": {"approve": true}}),
        json!({"input": QUESTION, "user": "u".repeat(201)}),
    ];
    for body in &bad_bodies {
        let (status, answer) = served.post(ANYONE, &runs, body).await;
        assert_error(status, &answer, 400, "invalid_request");
    }
    for raw in ["", "  \n", "{\"input\": ", "input=hello"] {
        let declared = served.request(ANYONE, Method::POST, &runs).header("content-type", "application/json").body(raw);
        let (status, answer) = served.send(declared).await;
        assert_error(status, &answer, 400, "invalid_request");
    }

    let too_long = json!({"input": "x".repeat(5000)});
    let (status, answer) = served.post(ANYONE, &runs, &too_long).await;
    assert_error(status, &answer, 413, "request_too_large");
    let (status, answer) = served.post(ANYONE, "/threads", &json!({"metadata": {"notes": "y".repeat(5000)}})).await;
    assert_error(status, &answer, 413, "request_too_large");
    // Without a Content-Length (chunked), the limit holds while reading.
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok("{\"input\": \"".to_owned()), Ok("z".repeat(5000)), Ok("\"}".to_owned())];
    let chunked = served
        .request(ANYONE, Method::POST, &runs)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)));
    let (status, answer) = served.send(chunked).await;
    assert_error(status, &answer, 413, "request_too_large");

    let (_, listed) = served.get(ANYONE, &runs).await;
    assert_eq!(listed, json!([]), "no refused request left a run");
    assert_eq!(served.llm.chat_requests().len(), 0, "nothing reached the agent");

    let unknown = format!("{runs}/no-such-run");
    for path in [unknown.clone(), format!("{unknown}/stream"), format!("{unknown}/wait")] {
        let (status, answer) = served.get(ANYONE, &path).await;
        assert_error(status, &answer, 404, "run_not_found");
    }
    let (status, answer) = served.post(ANYONE, &format!("{unknown}/cancel"), &json!({})).await;
    assert_error(status, &answer, 404, "run_not_found");
    for path in ["/threads/t-nobody/runs", "/threads/t-nobody/runs/wait"] {
        let (status, answer) = served.post(ANYONE, path, &json!({"input": QUESTION})).await;
        assert_error(status, &answer, 404, "thread_not_found");
    }
    let (status, answer) = served.post(ANYONE, "/threads", &json!({"thread_id": thread})).await;
    assert_error(status, &answer, 409, "thread_exists");
    let (status, answer) = served.post(ANYONE, "/threads", &json!({"thread_id": "has space"})).await;
    assert_error(status, &answer, 400, "invalid_request");
    let (status, created) = served.post(ANYONE, "/threads", &json!({"thread_id": "my-thread_1"})).await;
    assert_eq!((status, created["thread_id"].as_str()), (201, Some("my-thread_1")), "{created}");
    assert_eq!((created["status"].as_str(), created["messages"].as_u64()), (Some("idle"), Some(0)), "{created}");
}

#[tokio::test]
async fn a_query_string_that_cannot_be_read_is_a_json_400() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let run = served.run_to_end(ANYONE, &thread, &json!({"input": QUESTION})).await;
    let run_id = run["run_id"].as_str().unwrap();
    for path in [
        "/threads?limit=abc".to_owned(),
        "/threads?offset=-1".to_owned(),
        format!("/threads/{thread}/history?before=latest"),
        format!("/threads/{thread}/runs/{run_id}/stream?last_event_id=x"),
    ] {
        let response = within("a request", served.request(ANYONE, Method::GET, &path).send()).await.unwrap();
        let status = response.status().as_u16();
        let text = within("an answer", response.text()).await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("GET {path}: the error is not JSON: {status} {text:?}"));
        assert_error(status, &body, 400, "invalid_request");
    }
}

#[tokio::test]
async fn a_run_body_must_be_a_json_object() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    let runs = format!("/threads/{thread}/runs");
    for body in [json!([QUESTION]), json!([QUESTION, null, null, "someone"]), json!(QUESTION), json!(null)] {
        let (status, answer) = served.post(ANYONE, &runs, &body).await;
        assert_error(status, &answer, 400, "invalid_request");
    }
    let (_, listed) = served.get(ANYONE, &runs).await;
    assert_eq!(listed, json!([]), "no run started: {listed}");
    assert_eq!(served.llm.chat_requests().len(), 0, "nothing reached the agent");
}

#[tokio::test]
async fn continue_needs_a_cut_off_run() {
    let served = serve(open()).await;
    let fresh = served.create_thread(ANYONE).await;
    let finished = served.create_thread(ANYONE).await;
    served.run_to_end(ANYONE, &finished, &json!({"input": QUESTION})).await;
    let calls = served.llm.chat_requests().len();
    for thread in [&fresh, &finished] {
        let before = served.state(ANYONE, thread).await;
        let (status, answer) = served.post(ANYONE, &format!("/threads/{thread}/runs/wait"), &json!({"continue": true})).await;
        assert_eq!(status, 409, "nothing was cut off, so there is nothing to continue: {answer}");
        assert!(answer["error"]["code"].is_string() && answer["error"]["message"].is_string(), "{answer}");
        assert_eq!(served.state(ANYONE, thread).await["checkpoint_id"], before["checkpoint_id"], "the thread is unchanged");
    }
    assert_eq!(served.llm.chat_requests().len(), calls, "no LLM call");
}

#[tokio::test]
async fn info_needs_no_key_and_tells_whether_one_is_needed() {
    let keyed = serve(keyed()).await;
    let (status, info) = keyed.get(ANYONE, "/info").await;
    assert_eq!(status, 200, "{info}");
    assert_eq!((info["name"].as_str(), info["auth"].as_bool()), (Some(MODEL), Some(true)), "{info}");
    assert!(info["version"].as_str().is_some_and(|version| !version.is_empty()), "{info}");
    let open = serve(open()).await;
    let (status, info) = open.get(ANYONE, "/info").await;
    assert_eq!((status, info["auth"].as_bool()), (200, Some(false)), "{info}");
}

#[tokio::test]
async fn shutting_down_cancels_the_runs_still_going_after_the_grace_and_ends_their_streams() {
    let served = serve(open()).await;
    assert_eq!(within("a shutdown with nothing running", served.server.shut_down(Duration::from_secs(60))).await, 0);
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    served.weather_calls(WeatherCall::Hold);
    let run = served.start_run(ANYONE, &thread, &json!({"input": "What's the weather in San Francisco?"})).await;
    let run_id = run["run_id"].as_str().unwrap();
    served.held_weather_call().await;
    let stream = served.follow(ANYONE, &thread, run_id, None).await;
    assert_eq!(served.server.running(), 1);
    // The run is held for good, so the grace always runs out and the run is cancelled.
    let cut_off = within("the shutdown", served.server.shut_down(Duration::from_millis(100))).await;
    assert_eq!(cut_off, 1);
    assert_eq!(served.server.running(), 0, "the cancelled run has ended");
    let events = stream.rest().await;
    let end = events.last().expect("events");
    assert_eq!(end.name, "end", "{:?}", events.iter().map(|event| &event.name).collect::<Vec<_>>());
    assert_eq!(end.data["status"], "cancelled", "{}", end.data);
    let after = served.thread(ANYONE, &thread).await;
    assert_eq!((after["status"].as_str(), after["resumable"].as_bool()), (Some("error"), Some(true)), "{after}");
}

#[tokio::test]
async fn answers_never_carry_the_configurations_secrets_nor_server_paths() {
    // "Prague" stands in for a secret: the scripted weather answer names it.
    let redacting = ServerOptions { redact: Arc::new(|text: &str| text.replace("Prague", "***")), ..open() };
    let served = serve(redacting).await;
    let thread = served.create_thread(ANYONE).await;
    let request = served.request(ANYONE, Method::POST, &format!("/threads/{thread}/runs/stream")).json(&json!({"input": QUESTION}));
    let events = served.sse(request).await.rest().await;
    let end = events.last().expect("events");
    assert_eq!(end.name, "end");
    let answer = end.data["result"]["response"].as_str().unwrap_or_default().to_owned();
    assert!(answer.contains("***"), "the answer named the stand-in secret, redacted: {answer}");
    for event in &events {
        assert!(!event.data.to_string().contains("Prague"), "{} {}", event.name, event.data);
    }
    let state = served.state(ANYONE, &thread).await;
    assert!(!state.to_string().contains("Prague"), "{state}");
    let run_id = end.data["run_id"].as_str().unwrap();
    let (_, run) = served.get(ANYONE, &format!("/threads/{thread}/runs/{run_id}")).await;
    assert!(!run.to_string().contains("Prague") && run["result"]["response"] == answer.as_str(), "{run}");

    // A plan approval names the plan files on the server's disk; no answer does.
    let (status, asked) = served.post(ANYONE, &format!("/threads/{thread}/runs/wait"), &json!({"input": PLANNING})).await;
    assert_eq!((status, asked["status"].as_str()), (200, Some("interrupted")), "{asked}");
    let (_, history) = served.get(ANYONE, &format!("/threads/{thread}/history")).await;
    let state = served.state(ANYONE, &thread).await;
    for body in [&asked, &history, &state] {
        let text = body.to_string();
        assert!(!text.contains("pending_plans") && !text.contains("plan_file_path"), "{text}");
    }
    assert!(history.to_string().contains("execution_plan"), "the history still shows what was asked: {history}");
}

#[tokio::test]
async fn urls_that_cannot_be_decoded_and_ids_past_the_end_are_json_400s() {
    let served = serve(open()).await;
    for path in ["/threads/%FF", "/threads/%C0/state", "/threads/%FF/runs/x"] {
        let (status, body) = served.get(ANYONE, path).await;
        assert_error(status, &body, 400, "invalid_request");
    }
    let thread = served.create_thread(ANYONE).await;
    let run = served.run_to_end(ANYONE, &thread, &json!({"input": QUESTION})).await;
    let run_id = run["run_id"].as_str().unwrap();
    let all = served.follow(ANYONE, &thread, run_id, None).await.rest().await;
    let last = all.last().expect("events").id;
    let at_end = served.follow(ANYONE, &thread, run_id, Some(&last.to_string())).await.rest().await;
    assert!(at_end.is_empty(), "nothing after the last event");
    let (status, body) = served
        .send(
            served
                .request(ANYONE, Method::GET, &format!("/threads/{thread}/runs/{run_id}/stream"))
                .header("Last-Event-ID", (last + 1).to_string()),
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");
}

// ---------------------------------------------------------------------------------------------
// Hardening: a keyless server and web pages, limits, connections

/// A plan waiting for approval on a new thread of a keyless server, and its interrupt.
async fn pending_plan(served: &Served) -> (String, Value) {
    let thread = served.create_thread(ANYONE).await;
    let asked = served.run_to_end(ANYONE, &thread, &json!({"input": PLANNING})).await;
    (thread, approval_of(&asked))
}

#[tokio::test]
async fn a_keyless_server_refuses_other_origins_other_hosts_and_bodies_not_declared_json() {
    let served = serve(open()).await;
    let (thread, interrupt) = pending_plan(&served).await;
    let runs = format!("{}/threads/{thread}/runs", served.url);
    let approve = r#"{"resume":{"approved":true}}"#;
    // What a page of another origin can send without a CORS preflight, and what it cannot.
    let attempts = [
        (served.client.post(&runs).header("content-type", "text/plain;charset=UTF-8").body(approve), 415, "unsupported_media_type"),
        (
            served.client.post(&runs).header("content-type", "text/plain").header("origin", "http://evil.example").body(approve),
            403,
            "origin_not_allowed",
        ),
        (
            served.client.post(&runs).header("origin", "http://evil.example").json(&json!({"resume": {"approved": true}})),
            403,
            "origin_not_allowed",
        ),
        (served.client.post(&runs).header("origin", "null").json(&json!({"resume": {"approved": true}})), 403, "origin_not_allowed"),
        (
            served
                .client
                .post(&runs)
                .header("sec-fetch-site", "cross-site")
                .header("content-type", "application/x-www-form-urlencoded")
                .body("a=b"),
            403,
            "origin_not_allowed",
        ),
        (
            served.client.post(&runs).header("host", "attacker.example:8000").json(&json!({"resume": {"approved": true}})),
            403,
            "host_not_allowed",
        ),
        (
            served.client.get(format!("{}/threads/{thread}/state", served.url)).header("host", "rebound.attacker.example"),
            403,
            "host_not_allowed",
        ),
        (
            served.client.delete(format!("{}/threads/{thread}", served.url)).header("origin", "http://localhost:3000"),
            403,
            "origin_not_allowed",
        ),
    ];
    for (request, status, code) in attempts {
        let (got, body) = served.send(request).await;
        assert_error(got, &body, status, code);
    }
    let summary = served.thread(ANYONE, &thread).await;
    assert_eq!((summary["status"].as_str(), &summary["interrupt"]), (Some("interrupted"), &interrupt), "{summary}");
    assert_eq!(served.calls(LlmCall::CurrentWeather), 0, "nothing was approved");
    // Its own page and clients that are not browsers are served.
    let own = served
        .client
        .post(&runs)
        .header("origin", served.url.as_str())
        .json(&json!({"resume": {"approved": true, "interrupt_id": interrupt["id"]}}));
    let (status, run) = served.send(own).await;
    assert_eq!(status, 201, "{run}");
}

#[tokio::test]
async fn allowed_origins_get_cors_answers_and_a_server_with_keys_leaves_origins_to_the_keys() {
    let served = serve(ServerOptions { allowed_origins: vec!["https://ui.example.org".into()], ..open() }).await;
    let preflight = served
        .client
        .request(Method::OPTIONS, format!("{}/threads", served.url))
        .header("origin", "https://ui.example.org")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{preflight:?}");
    assert_eq!(preflight.headers()["access-control-allow-origin"], "https://ui.example.org");
    let created = served.client.post(format!("{}/threads", served.url)).header("origin", "https://ui.example.org").json(&json!({}));
    let response = created.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(response.headers()["access-control-allow-origin"], "https://ui.example.org");
    let other = served.client.post(format!("{}/threads", served.url)).header("origin", "https://other.example.org").json(&json!({}));
    let (status, body) = served.send(other).await;
    assert_error(status, &body, 403, "origin_not_allowed");

    let keyed = serve(keyed()).await;
    let from_anywhere =
        keyed.request(ALPHA, Method::POST, "/threads").header("origin", "http://elsewhere.example").header("host", "agent.example");
    assert_eq!(keyed.send(from_anywhere.json(&json!({}))).await.0, 201, "a key is the credential");
    let without_key = keyed.request(ANYONE, Method::POST, "/threads").header("origin", "http://elsewhere.example");
    let (status, body) = keyed.send(without_key.json(&json!({}))).await;
    assert_error(status, &body, 401, "invalid_api_key");
}

#[tokio::test]
async fn turns_beyond_max_turns_in_flight_get_503_with_retry_after_and_nothing_starts() {
    let served = serve(ServerOptions { max_turns_in_flight: 1, ..open() }).await;
    let busy = served.create_thread(ANYONE).await;
    let other = served.create_thread(ANYONE).await;
    served.weather_calls(WeatherCall::Hold);
    let run = served.start_run(ANYONE, &busy, &json!({"input": QUESTION})).await;
    served.held_weather_call().await;
    let response =
        served.request(ANYONE, Method::POST, &format!("/threads/{other}/runs")).json(&json!({"input": QUESTION})).send().await.unwrap();
    assert_eq!(response.headers().get("retry-after").and_then(|value| value.to_str().ok()), Some("2"));
    let (status, body) = (response.status().as_u16(), response.json::<Value>().await.unwrap());
    assert_error(status, &body, 503, "server_overloaded");
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]});
    let (status, body) = served.post(ANYONE, "/v1/chat/completions", &chat).await;
    assert_error(status, &body, 503, "server_overloaded");
    assert!(served.state(ANYONE, &other).await["messages"].as_array().unwrap().is_empty(), "nothing started");
    assert_eq!(served.server.turns_in_flight(), 1);

    let run_id = run["run_id"].as_str().unwrap();
    let (status, _) = served.post(ANYONE, &format!("/threads/{busy}/runs/{run_id}/cancel"), &json!({})).await;
    assert_eq!(status, 202);
    within("the cancelled run", served.follow(ANYONE, &busy, run_id, None).await.rest()).await;
    served.weather_calls(WeatherCall::Answer);
    let done = served.run_to_end(ANYONE, &other, &json!({"input": QUESTION})).await;
    assert_eq!(done["status"], "success", "a place is free again once a turn ended: {done}");
}

#[tokio::test]
async fn a_message_over_max_message_bytes_is_413_and_a_refused_body_is_read_so_the_client_sees_the_answer() {
    let served = serve(ServerOptions { max_message_bytes: 1000, max_body_bytes: 64 * 1024, ..open() }).await;
    let thread = served.create_thread(ANYONE).await;
    let (status, body) = served.post(ANYONE, &format!("/threads/{thread}/runs"), &json!({"input": "x".repeat(1001)})).await;
    assert_error(status, &body, 413, "message_too_large");
    assert_eq!(body["error"]["param"], "input");
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(1001)}]});
    let (status, body) = served.post(ANYONE, "/v1/chat/completions", &chat).await;
    assert_error(status, &body, 413, "message_too_large");
    // A body far over the limit, sent without a length: the client still reads the 413.
    let chunks = futures::stream::iter((0..64).map(|_| Ok::<_, std::io::Error>(vec![b' '; 16 * 1024])));
    let huge = served
        .request(ANYONE, Method::POST, &format!("/threads/{thread}/runs"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks));
    let (status, body) = served.send(huge).await;
    assert_error(status, &body, 413, "request_too_large");
}

#[tokio::test]
async fn last_event_id_past_the_end_of_a_running_run_is_a_400() {
    let served = serve(open()).await;
    let thread = served.create_thread(ANYONE).await;
    served.weather_calls(WeatherCall::Hold);
    let run = served.start_run(ANYONE, &thread, &json!({"input": QUESTION})).await;
    served.held_weather_call().await;
    let run_id = run["run_id"].as_str().unwrap();
    let request = served.request(ANYONE, Method::GET, &format!("/threads/{thread}/runs/{run_id}/stream")).header("Last-Event-ID", "100000");
    let (status, body) = served.send(request).await;
    assert_error(status, &body, 400, "invalid_request");
    served.post(ANYONE, &format!("/threads/{thread}/runs/{run_id}/cancel"), &json!({})).await;
}

#[tokio::test]
async fn a_long_url_is_a_json_414() {
    let served = serve(open()).await;
    let (status, body) = served.get(ANYONE, &format!("/threads/{}", "a".repeat(10_000))).await;
    assert_error(status, &body, 414, "uri_too_long");
}

/// Reads from `stream` until the server closes it; what it sent.
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut received = Vec::new();
    within("the server closing the connection", async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => received.extend_from_slice(&buffer[..read]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn slow_and_idle_connections_are_closed_after_the_header_timeout() {
    use tokio::io::AsyncWriteExt as _;
    let limits = ConnectionLimits { header_timeout: Duration::from_millis(500), ..ConnectionLimits::default() };
    let served = serve_with(open(), limits).await;
    let address = served.url.trim_start_matches("http://").to_owned();
    // A head that never ends (one header line, then nothing): closed without an answer.
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    let answered = read_until_closed(&mut slow).await;
    assert!(!answered.contains("200 OK"), "{answered}");
    // A connection that sends nothing at all.
    let mut silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    read_until_closed(&mut silent).await;
    // A keep-alive connection after its answer.
    let mut idle = tokio::net::TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let answered = read_until_closed(&mut idle).await;
    assert!(answered.starts_with("HTTP/1.1 200 OK"), "answered, then closed while idle: {answered}");
}

#[tokio::test]
async fn a_blank_key_is_no_key_and_leaves_the_browser_guard_on() {
    let served = serve(ServerOptions { api_keys: vec![Secret::new("")], ..open() }).await;
    let request = served.client.post(format!("{}/threads", served.url)).header("origin", "http://evil.example").json(&json!({}));
    let (status, body) = served.send(request).await;
    assert_error(status, &body, 403, "origin_not_allowed");
    let request = served.client.post(format!("{}/threads", served.url)).header("content-type", "text/plain").body("{}");
    let (status, body) = served.send(request).await;
    assert_error(status, &body, 415, "unsupported_media_type");
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answers_loses_its_connection() {
    use tokio::io::AsyncWriteExt as _;
    let limits = ConnectionLimits { write_timeout: Duration::from_millis(500), max_connections: 1, ..ConnectionLimits::default() };
    let served = serve_with(open(), limits).await;
    let address: std::net::SocketAddr = served.url.trim_start_matches("http://").parse().unwrap();
    // A small receive buffer, many answers asked for, none read: the server's writes stall.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(address).await.unwrap();
    let requests = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(64);
    stalled.write_all(requests.as_bytes()).await.unwrap();
    // The only connection the server takes is free again once the stalled one was closed.
    let (status, info) = served.get(ANYONE, "/info").await;
    assert_eq!(status, 200, "{info}");
    drop(stalled);
}

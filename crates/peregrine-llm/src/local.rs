//! The `local` provider (crate feature `local`): a GGUF model run in-process by llama.cpp, e.g.
//! the SmolLM2-135M-Instruct file `scripts/fetch-model.sh` installs. The model loads once per
//! file and is shared; requests run one at a time on a blocking thread, each with a fresh
//! context; a `response_schema` becomes a GBNF grammar, so structured answers always parse.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex as StdMutex, OnceLock, PoisonError, Weak};
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{LogOptions, json_schema_to_grammar, send_logs_to_tracing};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::config::ProviderConfig;
use crate::error::{LlmError, LlmErrorKind};
use crate::provider::{EventStream, LlmProvider};
use crate::structured::{append_to_last_user, schema_prompt};
use crate::types::{ChatMessage, ChatRequest, ChatResponse, ChatRole, ProviderFeatures, ResponseSchema, StreamEvent, Usage};

/// The environment variable that sets the CPU threads per request (default 1: on a busy
/// 2-core machine a second thread spin-waits and makes generation slower, not faster).
pub const THREADS_ENV: &str = "PEREGRINE_LOCAL_THREADS";
/// Output tokens when the request sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 256;
/// The smallest context a request gets.
const MIN_CONTEXT_TOKENS: u32 = 2048;
/// The largest context a request gets, whatever the model was trained for (bounds memory).
const MAX_CONTEXT_TOKENS: u32 = 16_384;
/// Prompt tokens decoded per llama.cpp batch.
const PROMPT_BATCH_TOKENS: u32 = 512;
/// The seed of the sampler used when `temperature > 0`: runs are reproducible.
const SAMPLING_SEED: u32 = 0x5EED;
/// Streamed events buffered between the inference thread and the consumer.
const STREAM_BUFFER: usize = 64;
const FETCH_HINT: &str = "run scripts/fetch-model.sh, which downloads SmolLM2-135M-Instruct.Q4_1.gguf and prints its path";

/// The embedded-model provider. Cloning is cheap: clones share the loaded model.
#[derive(Clone)]
pub struct LocalProvider {
    name: String,
    engine: Arc<Engine>,
    threads: u16,
}

impl fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalProvider")
            .field("name", &self.name)
            .field("model_path", &self.engine.path)
            .field("threads", &self.threads)
            .finish()
    }
}

impl LocalProvider {
    /// Loads the GGUF file at `api.providers.<name>.model_path` (or shares it when this process
    /// already has it loaded). Blocks while loading (about 0.1 s for SmolLM2). Threads per
    /// request come from `PEREGRINE_LOCAL_THREADS` (default 1).
    pub fn load(name: &str, config: &ProviderConfig) -> Result<Self, LlmError> {
        let Some(path) = config.model_path.as_deref().filter(|path| !path.trim().is_empty()) else {
            return Err(LlmError::new(
                LlmErrorKind::Config,
                name,
                "-",
                format!("api.providers.{name}.model_path is not set; point it at a GGUF model file ({FETCH_HINT})"),
            ));
        };
        let path = Path::new(path);
        let model_name = path.file_name().map_or_else(|| "-".to_owned(), |file| file.to_string_lossy().into_owned());
        let config_error = |message: String| LlmError::new(LlmErrorKind::Config, name, &model_name, message);
        if !path.is_file() {
            return Err(config_error(format!(
                "the model file {} (api.providers.{name}.model_path) does not exist; {FETCH_HINT}",
                path.display()
            )));
        }
        let threads = threads_from(std::env::var(THREADS_ENV).ok().as_deref()).map_err(config_error)?;
        let engine = Engine::shared(path).map_err(config_error)?;
        Ok(Self { name: name.to_owned(), engine, threads })
    }

    /// Uses `threads` CPU threads per request instead of `PEREGRINE_LOCAL_THREADS`.
    pub fn with_threads(mut self, threads: u16) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// The loaded model file.
    pub fn model_path(&self) -> &Path {
        &self.engine.path
    }

    /// CPU threads per request.
    pub fn threads(&self) -> u16 {
        self.threads
    }

    fn error(&self, kind: LlmErrorKind, model: &str, message: impl Into<String>) -> LlmError {
        LlmError::new(kind, &self.name, model, message)
    }

    /// The embedded models have no tool-calling template: say so rather than ignore the tools.
    fn reject_tools(&self, request: &ChatRequest) -> Result<(), LlmError> {
        if request.tools.is_empty() {
            return Ok(());
        }
        Err(self.error(
            LlmErrorKind::Config,
            &request.model,
            format!("the local provider cannot call tools; route this role to a provider with tool support (api.providers.{})", self.name),
        ))
    }

    fn thread_panicked(&self, model: &str) -> LlmError {
        self.error(LlmErrorKind::Server { status: 500 }, model, "the local inference thread stopped without an answer (it panicked)")
    }
}

impl LlmProvider for LocalProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn features(&self) -> ProviderFeatures {
        ProviderFeatures { native_json_schema: true, streaming: true, tools: false }
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        self.reject_tools(&request)?;
        let model = request.model.clone();
        let guard = Arc::clone(&self.engine.busy).lock_owned().await;
        let (engine, threads, provider) = (Arc::clone(&self.engine), self.threads, self.name.clone());
        let (answer_tx, answer_rx) = oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let _one_request_at_a_time = guard;
            // A caller that stopped waiting (dropped future) stops the generation too.
            let result = engine
                .prepare(&request, threads)
                .and_then(|job| engine.generate(job, &mut |_piece| !answer_tx.is_closed()))
                .map(|generation| generation.into_response(&request.model))
                .map_err(|failure| failure.into_error(&provider, &request.model));
            // Nobody to tell when the caller is gone.
            let _ = answer_tx.send(result);
        });
        answer_rx.await.map_err(|_| self.thread_panicked(&model))?
    }

    async fn stream(&self, request: ChatRequest) -> Result<EventStream, LlmError> {
        self.reject_tools(&request)?;
        let model = request.model.clone();
        let guard = Arc::clone(&self.engine.busy).lock_owned().await;
        let (engine, threads, provider) = (Arc::clone(&self.engine), self.threads, self.name.clone());
        let (ready_tx, ready_rx) = oneshot::channel();
        let (events_tx, events_rx) = mpsc::channel(STREAM_BUFFER);
        tokio::task::spawn_blocking(move || {
            let _one_request_at_a_time = guard;
            let job = match engine.prepare(&request, threads) {
                Ok(job) => job,
                Err(failure) => {
                    let _ = ready_tx.send(Err(failure.into_error(&provider, &request.model)));
                    return;
                }
            };
            if ready_tx.send(Ok(())).is_err() {
                return;
            }
            // A dropped stream closes the channel, which stops the generation.
            let result = engine.generate(job, &mut |piece| events_tx.blocking_send(Ok(StreamEvent::Token(piece.to_owned()))).is_ok());
            let last = result
                .map(|generation| StreamEvent::Done(generation.into_response(&request.model)))
                .map_err(|failure| failure.into_error(&provider, &request.model));
            let _ = events_tx.blocking_send(last);
        });
        ready_rx.await.map_err(|_| self.thread_panicked(&model))??;
        Ok(Box::pin(futures::stream::unfold(events_rx, |mut events| async move { events.recv().await.map(|event| (event, events)) })))
    }
}

/// Why a local request failed, before it is attributed to a provider and model.
#[derive(Debug)]
struct Failure {
    kind: LlmErrorKind,
    message: String,
}

impl Failure {
    /// llama.cpp itself failed (context allocation, decoding): reported like a provider's 5xx.
    fn engine(what: &str, error: impl fmt::Display) -> Self {
        Self { kind: LlmErrorKind::Server { status: 500 }, message: format!("llama.cpp failed to {what}: {error}") }
    }

    fn into_error(self, provider: &str, model: &str) -> LlmError {
        LlmError::new(self.kind, provider, model, self.message)
    }
}

/// The llama.cpp backend: initialised once per process and never freed (re-initialising it
/// while another thread drops it would race).
fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp logs every load and context to stderr; route it through `tracing` instead.
            send_logs_to_tracing(LogOptions::default());
            LlamaBackend::init()
                .map_err(|error| format!("cannot initialise llama.cpp ({error}); something else in this process initialised it"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A loaded model: shared by every provider that names the same file.
struct Engine {
    model: LlamaModel,
    backend: &'static LlamaBackend,
    /// The model's own chat template, if it has one (ChatML otherwise).
    template: Option<LlamaChatTemplate>,
    path: PathBuf,
    /// One request at a time: contexts are not shareable, and creating them concurrently from
    /// one model is unsound in llama.cpp.
    busy: Arc<Mutex<()>>,
}

/// What one request will run: the prompt's tokens, the output budget and the sampler.
struct Job {
    prompt: Vec<LlamaToken>,
    max_tokens: u32,
    context_tokens: u32,
    threads: u16,
    sampler: LlamaSampler,
}

/// What one request produced.
#[derive(Debug)]
struct Generation {
    content: String,
    prompt_tokens: usize,
    output_tokens: u32,
    finish_reason: &'static str,
}

impl Generation {
    fn into_response(self, model: &str) -> ChatResponse {
        ChatResponse {
            content: self.content,
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: Some(self.prompt_tokens as u64), output_tokens: Some(u64::from(self.output_tokens)) },
            finish_reason: Some(self.finish_reason.to_owned()),
            model: model.to_owned(),
        }
    }
}

impl Engine {
    fn shared(path: &Path) -> Result<Arc<Self>, String> {
        static ENGINES: LazyLock<StdMutex<HashMap<PathBuf, Weak<Engine>>>> = LazyLock::new(StdMutex::default);
        let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let mut engines = ENGINES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(engine) = engines.get(&key).and_then(Weak::upgrade) {
            return Ok(engine);
        }
        engines.retain(|_, engine| engine.strong_count() > 0);
        let backend = backend()?;
        let started = Instant::now();
        let model = LlamaModel::load_from_file(backend, &key, &LlamaModelParams::default())
            .map_err(|error| format!("llama.cpp could not load {} as a GGUF model ({error}); {FETCH_HINT}", key.display()))?;
        tracing::debug!(path = %key.display(), elapsed_ms = started.elapsed().as_millis(), "loaded the local model");
        let template = model.chat_template(None).ok();
        let engine = Arc::new(Self { model, backend, template, path: key.clone(), busy: Arc::new(Mutex::new(())) });
        engines.insert(key, Arc::downgrade(&engine));
        Ok(engine)
    }

    /// Renders and tokenizes the prompt, sizes the context and builds the sampler.
    fn prepare(&self, request: &ChatRequest, threads: u16) -> Result<Job, Failure> {
        let mut messages = request.messages.clone();
        let grammar = match &request.response_schema {
            None => None,
            Some(schema) => match self.grammar_sampler(schema) {
                Ok(sampler) => Some(sampler),
                Err(reason) => {
                    // The same fallback the client uses for providers without a native mode:
                    // the answer then goes through its clean-up, validation and retry.
                    tracing::warn!(schema = %schema.name, %reason, "no grammar for the response schema; asking for it in the prompt instead");
                    append_to_last_user(&mut messages, &schema_prompt(schema));
                    None
                }
            },
        };
        let prompt = self.render(&messages)?;
        let tokens = self.model.vocab().tokenize(prompt.as_bytes(), true, true);
        let budget = plan_context(tokens.len(), request.max_tokens, self.model.n_ctx_train())
            .map_err(|message| Failure { kind: LlmErrorKind::ContextLength, message })?;
        Ok(Job {
            prompt: tokens,
            max_tokens: budget.max_tokens,
            context_tokens: budget.context_tokens,
            threads,
            sampler: sampler(grammar, request.temperature),
        })
    }

    /// A grammar sampler forcing JSON that matches `schema`.
    fn grammar_sampler(&self, schema: &ResponseSchema) -> Result<LlamaSampler, String> {
        let grammar =
            json_schema_to_grammar(&schema.schema.to_string()).map_err(|error| format!("llama.cpp cannot convert the schema: {error}"))?;
        LlamaSampler::grammar(&self.model, &grammar, "root").map_err(|error| format!("llama.cpp rejected the grammar: {error}"))
    }

    /// The conversation in the model's chat template (ChatML when it has none or it fails),
    /// ending with the assistant's turn opened.
    fn render(&self, messages: &[ChatMessage]) -> Result<String, Failure> {
        let chat = messages
            .iter()
            .map(|message| {
                let role = match message.role {
                    ChatRole::System => "system",
                    ChatRole::User => "user",
                    ChatRole::Assistant => "assistant",
                };
                // C strings end at NUL: drop NULs rather than fail the request over them.
                LlamaChatMessage::new(role.to_owned(), message.content.replace('\0', ""))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| Failure::engine("accept a chat message", error))?;
        if let Some(template) = &self.template {
            match self.model.apply_chat_template(template, &chat, true) {
                Ok(prompt) => return Ok(prompt),
                Err(error) => tracing::debug!(%error, "the model's chat template failed; using ChatML"),
            }
        }
        let chatml = LlamaChatTemplate::new("chatml").map_err(|error| Failure::engine("build the ChatML template", error))?;
        self.model.apply_chat_template(&chatml, &chat, true).map_err(|error| Failure::engine("apply the ChatML template", error))
    }

    /// Decodes the prompt, then samples until end-of-generation or `max_tokens`, handing each
    /// piece of text to `on_piece`; it stops early when `on_piece` returns false.
    fn generate(&self, job: Job, on_piece: &mut dyn FnMut(&str) -> bool) -> Result<Generation, Failure> {
        let Job { prompt, max_tokens, context_tokens, threads, mut sampler } = job;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(context_tokens))
            .with_n_batch(PROMPT_BATCH_TOKENS)
            .with_n_threads(i32::from(threads))
            .with_n_threads_batch(i32::from(threads));
        let mut context = self.model.new_context(self.backend, params).map_err(|error| Failure::engine("create a context", error))?;
        let started = Instant::now();
        let mut batch = LlamaBatch::new(PROMPT_BATCH_TOKENS as usize, 1);
        let mut position: i32 = 0;
        for chunk in prompt.chunks(PROMPT_BATCH_TOKENS as usize) {
            batch.clear();
            for token in chunk {
                // Logits only for the last prompt token: that is where sampling starts.
                let is_last = position as usize + 1 == prompt.len();
                batch.add(*token, position, &[0], is_last).map_err(|error| Failure::engine("batch the prompt", error))?;
                position += 1;
            }
            context.decode(&mut batch).map_err(|error| Failure::engine("decode the prompt", error))?;
        }
        let prefilled = Instant::now();
        let vocab = self.model.vocab();
        let mut logits_at = batch.n_tokens() - 1;
        let mut text = Utf8Pieces::default();
        let mut content = String::new();
        let mut output_tokens = 0;
        let finish_reason = loop {
            if output_tokens == max_tokens {
                break "length";
            }
            // `sample` also accepts the token into every sampler (grammar included): accepting
            // it again would corrupt the grammar state and abort.
            let token = sampler.sample(&context, logits_at);
            if vocab.is_eog(token) {
                break "stop";
            }
            output_tokens += 1;
            let piece = text.push(&vocab.token_to_piece(token, false, None));
            content.push_str(&piece);
            if !piece.is_empty() && !on_piece(&piece) {
                break "cancelled";
            }
            if output_tokens == max_tokens {
                break "length";
            }
            batch.clear();
            batch.add(token, position, &[0], true).map_err(|error| Failure::engine("batch a token", error))?;
            position += 1;
            context.decode(&mut batch).map_err(|error| Failure::engine("decode a token", error))?;
            logits_at = 0;
        };
        let tail = text.finish();
        if !tail.is_empty() {
            content.push_str(&tail);
            on_piece(&tail);
        }
        let generating = prefilled.elapsed().as_secs_f64();
        tracing::debug!(
            prompt_tokens = prompt.len(),
            output_tokens,
            prompt_ms = (prefilled - started).as_millis(),
            tokens_per_second = if generating > 0.0 { f64::from(output_tokens) / generating } else { 0.0 },
            finish_reason,
            "local generation"
        );
        Ok(Generation { content, prompt_tokens: prompt.len(), output_tokens, finish_reason })
    }
}

/// Greedy decoding, or a seeded draw at `temperature` when it is positive; after the grammar
/// when there is one.
fn sampler(grammar: Option<LlamaSampler>, temperature: Option<f32>) -> LlamaSampler {
    let mut samplers: Vec<LlamaSampler> = grammar.into_iter().collect();
    match temperature.filter(|temperature| *temperature > 0.0) {
        Some(temperature) => {
            samplers.push(LlamaSampler::temp(temperature));
            samplers.push(LlamaSampler::dist(SAMPLING_SEED));
        }
        None => samplers.push(LlamaSampler::greedy()),
    }
    LlamaSampler::chain_simple(samplers)
}

/// A request's token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ContextPlan {
    /// Output tokens: as requested (default 256), trimmed to what the context can hold.
    max_tokens: u32,
    /// Context size: at least 2048, enough for prompt + output, at most the model's training
    /// context (and 16384).
    context_tokens: u32,
}

fn plan_context(prompt_tokens: usize, requested: Option<u32>, trained_context: u32) -> Result<ContextPlan, String> {
    let cap = if trained_context == 0 { MAX_CONTEXT_TOKENS } else { trained_context.min(MAX_CONTEXT_TOKENS) };
    let prompt = u32::try_from(prompt_tokens).ok().filter(|prompt| *prompt > 0 && *prompt < cap).ok_or_else(|| {
        format!("the prompt is {prompt_tokens} tokens; the local model's context holds {cap}: shorten the prompt or history")
    })?;
    let max_tokens = requested.unwrap_or(DEFAULT_MAX_TOKENS).max(1).min(cap - prompt);
    let context_tokens = (prompt + max_tokens).max(MIN_CONTEXT_TOKENS).min(cap);
    Ok(ContextPlan { max_tokens, context_tokens })
}

fn threads_from(value: Option<&str>) -> Result<u16, String> {
    let Some(value) = value else { return Ok(1) };
    value
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|threads| *threads >= 1)
        .ok_or_else(|| format!("{THREADS_ENV}={value:?} is not a positive number of threads; unset it for 1"))
}

/// Token pieces turned into text: a character split across tokens waits for its remaining
/// bytes; invalid bytes become U+FFFD.
#[derive(Debug, Default)]
struct Utf8Pieces {
    pending: Vec<u8>,
}

impl Utf8Pieces {
    /// The text completed by `bytes`.
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    return text;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match error.error_len() {
                        // An incomplete character at the end: wait for the next piece.
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + invalid);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left (an incomplete character) when generation ends.
    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_fit_the_prompt_and_the_output() {
        // (prompt tokens, requested max_tokens, trained context) -> (max_tokens, context)
        let table = [
            (100, None, 8192, Ok((256, 2048))),
            (100, Some(48), 8192, Ok((48, 2048))),
            (3000, Some(256), 8192, Ok((256, 3256))),
            (8000, Some(256), 8192, Ok((192, 8192))),
            (100, Some(0), 8192, Ok((1, 2048))),
            (100, Some(100_000), 0, Ok((16_284, 16_384))),
            (1000, Some(10), 1024, Ok((10, 1024))),
            (8192, Some(1), 8192, Err(())),
            (0, None, 8192, Err(())),
        ];
        for (prompt, requested, trained, expected) in table {
            let plan = plan_context(prompt, requested, trained).map(|plan| (plan.max_tokens, plan.context_tokens)).map_err(|_| ());
            assert_eq!(plan, expected, "prompt {prompt}, requested {requested:?}, trained {trained}");
        }
        let error = plan_context(9000, None, 8192).expect_err("too long");
        assert!(error.contains("9000 tokens") && error.contains("8192"), "{error}");
    }

    #[test]
    fn threads_default_to_one_and_must_be_positive() {
        assert_eq!(threads_from(None), Ok(1));
        assert_eq!(threads_from(Some(" 2 ")), Ok(2));
        for bad in ["0", "-1", "two", ""] {
            let error = threads_from(Some(bad)).expect_err(bad);
            assert!(error.contains(THREADS_ENV), "{error}");
        }
    }

    #[test]
    fn characters_split_across_tokens_are_joined() {
        let mut pieces = Utf8Pieces::default();
        let euro = "€".as_bytes();
        assert_eq!(pieces.push(b"price: "), "price: ");
        assert_eq!(pieces.push(&euro[..1]), "");
        assert_eq!(pieces.push(&euro[1..]), "€");
        assert_eq!(pieces.push(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        assert_eq!(pieces.push(&euro[..2]), "");
        assert_eq!(pieces.finish(), "\u{FFFD}");
        assert_eq!(pieces.finish(), "");
    }

    #[test]
    fn missing_model_files_say_how_to_fetch_one() {
        let unset = LocalProvider::load("local", &ProviderConfig::default()).expect_err("no model_path");
        assert_eq!(unset.kind, LlmErrorKind::Config);
        assert!(unset.message.contains("api.providers.local.model_path") && unset.message.contains("scripts/fetch-model.sh"), "{unset}");

        let config = ProviderConfig { model_path: Some("/nonexistent/model.gguf".into()), ..ProviderConfig::default() };
        let missing = LocalProvider::load("embedded", &config).expect_err("no such file");
        assert_eq!((missing.kind.clone(), missing.model.as_str()), (LlmErrorKind::Config, "model.gguf"));
        assert!(
            missing.message.contains("/nonexistent/model.gguf")
                && missing.message.contains("api.providers.embedded.model_path")
                && missing.message.contains("scripts/fetch-model.sh"),
            "{missing}"
        );
    }

    #[test]
    fn files_that_are_not_gguf_are_refused_clearly() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("broken.gguf");
        std::fs::write(&path, b"not a model").expect("write");
        let config = ProviderConfig { model_path: Some(path.display().to_string()), ..ProviderConfig::default() };
        let error = LocalProvider::load("local", &config).expect_err("not GGUF");
        assert_eq!(error.kind, LlmErrorKind::Config);
        assert!(error.message.contains("could not load") && error.message.contains("broken.gguf"), "{error}");
    }
}

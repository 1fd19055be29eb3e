//! The serving engine: one worker thread owns the pipeline (the model on its device), the batch
//! cache and the scheduler, and nothing else touches them. Callers [`Engine::submit`] requests
//! through a bounded command channel and read each request's events (token by token, then a
//! terminal summary or failure) from a bounded channel of its own through its
//! [`RequestHandle`]; dropping or cancelling a handle cancels the request at the worker's next
//! step, which frees its pages. [`Engine::shutdown`] finishes (or cancels) the requests in
//! flight and joins the worker. The tokenizer and chat template a front end needs are loaded
//! again for the caller's side, so the worker's state stays its own.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::batch::{
    BatchOptions, BatchOutput, BatchRunner, PagedKvCacheConfig, RequestId, RunnerEvent, SchedulerStats,
};
use crate::chat::ChatTemplate;
use crate::constraint::ConstraintCompiler;
use crate::error::LlmError;
use crate::generate::{GenerateParams, StopReason, TokenLogprobs};
use crate::pipeline::Pipeline;
use crate::tokenizer::Tokenizer;

/// Events a request's channel holds before a client that does not read them is cancelled.
const EVENTS_PER_REQUEST: usize = 4096;

/// How an engine batches and what it admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Batching limits; `num_pages` `None`: `max_active` requests of `max_model_len` fit.
    pub batch: BatchOptions,
    /// The longest request (prompt plus new tokens); `None`: the model's
    /// `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Requests waiting for a slot beyond the `max_active` running; more are refused
    /// ([`EngineError::Saturated`]).
    pub max_pending: usize,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig { batch: BatchOptions::default(), max_model_len: None, max_pending: 64 }
    }
}

/// A request: prompt token ids and generation settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
}

/// What a request's handle receives, in order: tokens, then exactly one of `Finished` or
/// `Failed` (none after a cancellation).
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A generated token and the reply's new streamable text (possibly empty, and possibly
    /// covering earlier tokens whose text was held back), with the token's logprobs when the
    /// request asked for them.
    Token { token: u32, text: String, logprobs: Option<TokenLogprobs> },
    /// The reply's last text not streamed yet, and its summary.
    Finished { text: String, output: EngineOutput },
    /// The request could not run (the message says why).
    Failed(String),
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOutput {
    pub prompt_tokens: usize,
    pub generated_token_ids: Vec<u32>,
    pub generated_text: String,
    pub stop_reason: StopReason,
    /// From submission to the first token, and to the end.
    pub time_to_first_token: Duration,
    pub latency: Duration,
}

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The pending and active bounds are reached: try again later.
    #[error("the engine is at capacity ({0} requests in flight)")]
    Saturated(usize),
    /// The request itself is invalid (the message names what).
    #[error("{0}")]
    Invalid(String),
    /// The engine is shutting down or its worker stopped.
    #[error("the engine is not accepting requests: {0}")]
    Closed(String),
}

/// What an engine serves, for front ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// The model folder's name.
    pub model_name: String,
    /// The longest request (prompt plus new tokens) it takes.
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// The EOS ids of the model's generation config.
    pub eos_token_ids: Vec<u32>,
}

/// Latency histograms with vLLM's buckets (seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub buckets: &'static [f64],
    /// Observations at most each bucket's bound (not cumulative).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Histogram {
        Histogram { buckets, counts: vec![0; buckets.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(i) = self.buckets.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// vLLM's bounds of `time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's bounds of `inter_token_latency_seconds`.
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's bounds of `e2e_request_latency_seconds`.
pub const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0];

/// What the engine has done, as `/metrics` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineMetrics {
    pub scheduler: SchedulerStats,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
    pub requests_finished: u64,
    pub requests_failed: u64,
    pub requests_cancelled: u64,
}

impl Default for EngineMetrics {
    fn default() -> EngineMetrics {
        EngineMetrics {
            scheduler: SchedulerStats::default(),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            e2e_request_latency: Histogram::new(E2E_BUCKETS),
            requests_finished: 0,
            requests_failed: 0,
            requests_cancelled: 0,
        }
    }
}

/// How [`Engine::shutdown`] ends the requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Run them to their end first.
    Finish,
    /// Cancel them (their handles see no terminal event).
    Cancel,
}

enum Command {
    /// Boxed: a request with its parameters is far larger than the other commands.
    Submit {
        id: u64,
        request: Box<EngineRequest>,
        events: SyncSender<EngineEvent>,
    },
    Shutdown(Shutdown),
}

/// State the caller's side and the worker share: no model state.
struct Shared {
    /// Requests submitted and not ended (the admission bound).
    in_flight: AtomicUsize,
    /// Handles dropped or cancelled, for the worker's next step.
    cancelled: Mutex<HashSet<u64>>,
    metrics: Mutex<EngineMetrics>,
    accepting: AtomicBool,
    /// Why the worker failed, if it did.
    failure: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running engine (see the module docs).
pub struct Engine {
    commands: SyncSender<Command>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    capacity: usize,
    info: EngineInfo,
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    /// Compiles response formats on the caller's side, so a bad one never reaches the worker;
    /// why not, for a tokenizer it cannot serve.
    constraints: Result<Arc<ConstraintCompiler>, String>,
}

/// One submitted request: its events, and cancellation (also on drop).
pub struct RequestHandle {
    id: u64,
    events: Receiver<EngineEvent>,
    shared: Arc<Shared>,
    ended: bool,
}

impl RequestHandle {
    /// The request's id, unique in its engine.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event, waiting for it; `None` once the request ended (after its terminal event,
    /// or when it was cancelled or the engine stopped).
    pub fn recv(&mut self) -> Option<EngineEvent> {
        self.track(self.events.recv().ok())
    }

    /// [`RequestHandle::recv`] waiting at most `timeout`; `Err(())` when it passed.
    #[allow(clippy::result_unit_err)]
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<EngineEvent>, ()> {
        match self.events.recv_timeout(timeout) {
            Ok(e) => Ok(self.track(Some(e))),
            Err(RecvTimeoutError::Timeout) => Err(()),
            Err(RecvTimeoutError::Disconnected) => Ok(self.track(None)),
        }
    }

    /// The next event if one is there.
    pub fn try_recv(&mut self) -> Option<EngineEvent> {
        match self.events.try_recv() {
            Ok(e) => self.track(Some(e)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => self.track(None),
        }
    }

    fn track(&mut self, e: Option<EngineEvent>) -> Option<EngineEvent> {
        if !matches!(e, Some(EngineEvent::Token { .. })) {
            self.ended = true;
        }
        e
    }

    /// Cancel the request: the worker drops it at its next step and frees its pages.
    pub fn cancel(&mut self) {
        if !self.ended {
            lock(&self.shared.cancelled).insert(self.id);
            self.ended = true;
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl Engine {
    /// Start the worker on `pipeline` (moved to it). Errors: a bad configuration, or a batch
    /// cache the device cannot hold, reported before this returns.
    pub fn start(pipeline: Pipeline, config: EngineConfig) -> Result<Engine, LlmError> {
        let dir = pipeline.loaded.directory.clone();
        let max_positions = pipeline.model().config().max_position_embeddings;
        let max_model_len = config.max_model_len.unwrap_or(max_positions);
        if max_model_len == 0 || max_model_len > max_positions {
            return Err(LlmError::InvalidArgument(format!(
                "max_model_len {max_model_len} must be 1 to the model's {max_positions} positions"
            )));
        }
        if config.batch.max_active == 0 {
            return Err(LlmError::InvalidArgument("max_active must be at least 1".into()));
        }
        let block_size = config.batch.block_size.max(1);
        let kv = PagedKvCacheConfig {
            block_size,
            num_pages: config.batch.num_pages.unwrap_or(config.batch.max_active * max_model_len.div_ceil(block_size)),
            max_sequence_length: max_model_len,
        };
        let info = EngineInfo {
            model_name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
            max_model_len,
            vocab_size: pipeline.model().config().vocab_size,
            eos_token_ids: pipeline.loaded.default_eos_token_ids.clone(),
        };
        let tokenizer = Tokenizer::load(&dir)?;
        let chat = ChatTemplate::load(&dir)?;
        // Built once (the token trie); a tokenizer it cannot serve fails constrained requests
        // only.
        let constraints = ConstraintCompiler::new(&tokenizer, &info.eos_token_ids, info.vocab_size)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            cancelled: Mutex::new(HashSet::new()),
            metrics: Mutex::new(EngineMetrics::default()),
            accepting: AtomicBool::new(true),
            failure: Mutex::new(None),
        });
        let capacity = config.batch.max_active + config.max_pending;
        let (commands, inbox) = mpsc::sync_channel(capacity.max(1));
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let worker_shared = shared.clone();
        let batch = config.batch;
        let worker = std::thread::Builder::new()
            .name("ruda-engine".into())
            .spawn(move || worker_main(pipeline, kv, batch, inbox, worker_shared, ready_tx))
            .map_err(|e| LlmError::InvalidArgument(format!("starting the engine's worker thread: {e}")))?;
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = worker.join();
                return Err(e);
            }
            Err(_) => {
                let _ = worker.join();
                return Err(LlmError::InvalidArgument("the engine's worker stopped while starting".into()));
            }
        }
        Ok(Engine {
            commands,
            worker: Some(worker),
            shared,
            next_id: AtomicU64::new(0),
            capacity,
            info,
            tokenizer,
            chat,
            constraints,
        })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The model's tokenizer, for the caller's side (encoding prompts, `/tokenize`).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The compiler of response formats ([`GenerateParams::constraint`]) for this model's
    /// tokenizer and vocabulary, shared by the caller's threads.
    pub fn constraints(&self) -> Result<Arc<ConstraintCompiler>, LlmError> {
        self.constraints.clone().map_err(LlmError::Constraint)
    }

    /// The model's chat template, for the caller's side.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> EngineMetrics {
        lock(&self.shared.metrics).clone()
    }

    /// Requests submitted and not ended.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the worker runs and takes requests.
    pub fn is_serving(&self) -> bool {
        self.shared.accepting.load(Ordering::SeqCst) && lock(&self.shared.failure).is_none()
    }

    /// Queue `request`; its events arrive on the returned handle. Refused at once (never
    /// waiting) when it cannot fit the context, when `max_active + max_pending` requests are in
    /// flight, or when the engine is shutting down.
    pub fn submit(&self, request: EngineRequest) -> Result<RequestHandle, EngineError> {
        if let Some(why) = lock(&self.shared.failure).clone() {
            return Err(EngineError::Closed(why));
        }
        if !self.shared.accepting.load(Ordering::SeqCst) {
            return Err(EngineError::Closed("shutting down".into()));
        }
        request.params.validate_for(self.info.vocab_size).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let total = request.prompt.len() + request.params.max_new_tokens;
        if request.prompt.is_empty() || total > self.info.max_model_len {
            return Err(EngineError::Invalid(format!(
                "{} prompt tokens + {} new tokens must be 1 to the context of {} positions",
                request.prompt.len(),
                request.params.max_new_tokens,
                self.info.max_model_len
            )));
        }
        if let Some(bad) = request.prompt.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(EngineError::Invalid(format!("token id {bad} is outside the vocabulary")));
        }
        let in_flight = self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        if in_flight >= self.capacity {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Saturated(in_flight));
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (events_tx, events) = mpsc::sync_channel(EVENTS_PER_REQUEST);
        match self.commands.try_send(Command::Submit { id, request: Box::new(request), events: events_tx }) {
            Ok(()) => Ok(RequestHandle { id, events, shared: self.shared.clone(), ended: false }),
            Err(e) => {
                self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                match e {
                    TrySendError::Full(_) => Err(EngineError::Saturated(in_flight)),
                    TrySendError::Disconnected(_) => Err(EngineError::Closed("the worker stopped".into())),
                }
            }
        }
    }

    /// Stop taking requests, end those in flight as `mode` says, and join the worker.
    pub fn shutdown(mut self, mode: Shutdown) -> Result<(), LlmError> {
        self.stop(mode)
    }

    fn stop(&mut self, mode: Shutdown) -> Result<(), LlmError> {
        self.shared.accepting.store(false, Ordering::SeqCst);
        let Some(worker) = self.worker.take() else { return Ok(()) };
        // Blocking send: the worker drains its inbox every step, so this waits at most a step.
        let _ = self.commands.send(Command::Shutdown(mode));
        worker.join().map_err(|_| LlmError::InvalidArgument("the engine's worker panicked".into()))?;
        match lock(&self.shared.failure).clone() {
            Some(why) => Err(LlmError::InvalidArgument(why)),
            None => Ok(()),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.stop(Shutdown::Cancel);
    }
}

/// A request the worker runs: who to tell, and its timings.
struct Running {
    client: u64,
    events: SyncSender<EngineEvent>,
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

fn worker_main(
    pipeline: Pipeline,
    kv: PagedKvCacheConfig,
    batch: BatchOptions,
    inbox: Receiver<Command>,
    shared: Arc<Shared>,
    ready: SyncSender<Result<(), LlmError>>,
) {
    let mut runner = match BatchRunner::new(&pipeline, kv, &batch) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut running: HashMap<RequestId, Running> = HashMap::new();
    let mut by_client: HashMap<u64, RequestId> = HashMap::new();
    let mut shutdown: Option<Shutdown> = None;
    // Requests cancelled after the last step's report: theirs is still to come.
    let mut unreported = false;
    let end = |shared: &Shared| {
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    };
    loop {
        // Commands: wait for one when idle, else take what is there.
        let mut next = if runner.has_work() || shutdown.is_some() || unreported {
            inbox.try_recv().ok()
        } else {
            match inbox.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        };
        while let Some(command) = next.take() {
            match command {
                Command::Submit { id, request, events } => {
                    if shutdown.is_some() {
                        let _ = events.try_send(EngineEvent::Failed("the engine is shutting down".into()));
                        end(&shared);
                    } else {
                        match runner.submit(id as usize, request.prompt, &request.params) {
                            Ok(rid) => {
                                by_client.insert(id, rid);
                                running.insert(
                                    rid,
                                    Running {
                                        client: id,
                                        events,
                                        submitted: Instant::now(),
                                        first_token: None,
                                        last_token: None,
                                    },
                                );
                            }
                            Err(e) => {
                                let _ = events.try_send(EngineEvent::Failed(e.to_string()));
                                lock(&shared.metrics).requests_failed += 1;
                                end(&shared);
                            }
                        }
                    }
                }
                Command::Shutdown(mode) => {
                    shutdown = Some(mode);
                    if mode == Shutdown::Cancel {
                        for rid in running.keys() {
                            let _ = runner.cancel(*rid);
                        }
                    }
                }
            }
            next = inbox.try_recv().ok();
        }
        // Cancellations of dropped handles.
        let cancelled: Vec<u64> = lock(&shared.cancelled).drain().collect();
        for client in cancelled {
            if let Some(rid) = by_client.get(&client) {
                let _ = runner.cancel(*rid);
            }
        }
        let mut to_cancel = Vec::new();
        let has_work = runner.has_work();
        let on_event = |event: RunnerEvent<'_>| match event {
            RunnerEvent::Token { id, token, text, logprobs, .. } => {
                if let Some(r) = running.get_mut(&id) {
                    let now = Instant::now();
                    let mut m = lock(&shared.metrics);
                    match r.last_token {
                        None => m.time_to_first_token.observe((now - r.submitted).as_secs_f64()),
                        Some(last) => m.inter_token_latency.observe((now - last).as_secs_f64()),
                    }
                    r.first_token.get_or_insert(now);
                    r.last_token = Some(now);
                    // A client that went away or stopped reading is cancelled.
                    if r.events
                        .try_send(EngineEvent::Token { token, text: text.to_string(), logprobs: logprobs.cloned() })
                        .is_err()
                    {
                        to_cancel.push(id);
                    }
                }
            }
            RunnerEvent::Finished { id, output, text } => {
                if let Some(r) = running.remove(&id) {
                    by_client.remove(&r.client);
                    let now = Instant::now();
                    let out = engine_output(output, &r, now);
                    {
                        let mut m = lock(&shared.metrics);
                        m.e2e_request_latency.observe(out.latency.as_secs_f64());
                        m.requests_finished += 1;
                    }
                    let _ = r.events.try_send(EngineEvent::Finished { text: text.to_string(), output: out });
                    end(&shared);
                }
            }
            RunnerEvent::Failed { id, error, .. } => {
                if let Some(r) = running.remove(&id) {
                    by_client.remove(&r.client);
                    let _ = r.events.try_send(EngineEvent::Failed(error.to_string()));
                    lock(&shared.metrics).requests_failed += 1;
                    end(&shared);
                }
            }
            RunnerEvent::Cancelled { id, .. } => {
                if let Some(r) = running.remove(&id) {
                    by_client.remove(&r.client);
                    lock(&shared.metrics).requests_cancelled += 1;
                    end(&shared);
                }
            }
        };
        if !has_work {
            // Requests cancelled while nothing runs end here.
            if let Err(e) = runner.flush_finished(on_event) {
                *lock(&shared.failure) = Some(format!("the engine stopped: {e}"));
                break;
            }
            lock(&shared.metrics).scheduler = runner.stats();
            unreported = false;
            if shutdown.is_some() {
                break;
            }
            continue;
        }
        let step = runner.step(on_event);
        unreported = !to_cancel.is_empty();
        for id in to_cancel {
            let _ = runner.cancel(id);
        }
        // A batch that could not be scheduled while requests wait would never change: fail
        // them rather than spin (the scheduler admits only requests that fit the pool).
        let step = match step {
            Ok(false) if runner.has_work() => Err(LlmError::InvalidArgument("no batch could be scheduled".into())),
            other => other,
        };
        match step {
            Ok(_) => lock(&shared.metrics).scheduler = runner.stats(),
            Err(e) => {
                // The batch cache is unusable: every request in flight fails, and a new runner
                // serves the next ones.
                let message = format!("the model failed: {e}");
                for (_, r) in running.drain() {
                    let _ = r.events.try_send(EngineEvent::Failed(message.clone()));
                    lock(&shared.metrics).requests_failed += 1;
                    end(&shared);
                }
                by_client.clear();
                match BatchRunner::new(&pipeline, kv, &batch) {
                    Ok(r) => runner = r,
                    Err(e) => {
                        *lock(&shared.failure) = Some(format!("the engine stopped: {e}"));
                        break;
                    }
                }
            }
        }
    }
    // Whatever is still queued when the worker stops.
    shared.accepting.store(false, Ordering::SeqCst);
    while let Ok(command) = inbox.try_recv() {
        if let Command::Submit { events, .. } = command {
            let _ = events.try_send(EngineEvent::Failed("the engine stopped".into()));
            end(&shared);
        }
    }
}

fn engine_output(output: &BatchOutput, r: &Running, now: Instant) -> EngineOutput {
    EngineOutput {
        prompt_tokens: output.prompt_tokens,
        generated_token_ids: output.generated_token_ids.clone(),
        generated_text: output.generated_text.clone(),
        stop_reason: output.stop_reason,
        time_to_first_token: r.first_token.unwrap_or(now) - r.submitted,
        latency: now - r.submitted,
    }
}

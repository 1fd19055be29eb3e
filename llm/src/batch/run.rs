//! Batched generation end to end: requests through the [`ContinuousBatchScheduler`] and a
//! model's batched executor ([`CausalLm::forward_batch`]), each row's next token picked with
//! its own settings, each reply decoded incrementally and checked for stop sequences as it
//! grows. [`BatchRunner`] is one step at a time (what a serving engine drives);
//! [`Pipeline::generate_batch`] runs a list of requests to the end (what `ruda-llm batch` runs).

use std::collections::HashMap;
use std::time::Instant;

use ruda_ops::api;
use ruda_runtime::{DType, Tensor};

use super::generate::{BatchRequest, IncrementalDecoder, StopSequenceMatcher};
use super::scheduler::{
    ContinuousBatchConfig, ContinuousBatchScheduler, PagedKvCacheConfig, RequestId, ScheduledBatch, SchedulerStats,
};
use crate::error::LlmError;
use crate::generate::{GenerateParams, StopReason, TextStream, TokenLogprobs};
use crate::models::{BatchCache, CausalLm};
use crate::pipeline::{Pipeline, TokenPicker};

/// The batching limits and the KV pool of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// Requests running at once (each holds a slot of the linear-attention state pools).
    pub max_active: usize,
    /// Tokens one batch carries at most (prompts longer than that are prefilled in chunks).
    pub max_batch_tokens: usize,
    /// Positions per KV page.
    pub block_size: usize,
    /// Pages in the pool; `None`: enough for `max_active` of the longest request (prompt plus
    /// `max_new_tokens`), so nothing is preempted.
    pub num_pages: Option<usize>,
    /// Share the KV pages of common prompt prefixes (see [`PrefixCacheBounds`]).
    pub prefix_cache: Option<PrefixCacheBounds>,
    /// Leave special tokens out of the replies' text.
    pub skip_special_tokens: bool,
}

/// How much the prefix cache may hold; `None` fields take the defaults of
/// [`PrefixCacheBounds::resolve`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheBounds {
    pub max_bytes: Option<u64>,
    pub max_entries: Option<usize>,
}

impl PrefixCacheBounds {
    /// `(max_bytes, max_entries)`: by default every page of the pool may be cached, and the
    /// bytes allow that many pages plus `max_active` linear-attention snapshots (as much again
    /// as the state pools hold).
    pub fn resolve(&self, cache: &BatchCache) -> (u64, usize) {
        let pages = cache.kv_config().num_pages;
        let entries = self.max_entries.unwrap_or(pages);
        let bytes = pages as u64 * cache.page_bytes() + cache.max_active() as u64 * cache.snapshot_bytes();
        (self.max_bytes.unwrap_or(bytes), entries)
    }
}

impl Default for BatchOptions {
    /// 16 active requests, 512 tokens a batch, pages of 16 positions, a pool sized to fit, no
    /// prefix cache.
    fn default() -> BatchOptions {
        BatchOptions {
            max_active: 16,
            max_batch_tokens: 512,
            block_size: 16,
            num_pages: None,
            prefix_cache: None,
            skip_special_tokens: true,
        }
    }
}

/// One finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutput {
    /// The request's tag ([`BatchRequest::index`] in [`Pipeline::generate_batch`]).
    pub index: usize,
    pub prompt_tokens: usize,
    pub generated_token_ids: Vec<u32>,
    /// The reply, cut before a stop sequence when one ended it.
    pub generated_text: String,
    pub stop_reason: StopReason,
}

/// What a [`Pipeline::generate_batch`] run did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchSummary {
    pub requests: usize,
    pub generated_tokens: usize,
    /// From the first batch to the last request's end (loading and encoding excluded).
    pub seconds: f64,
    /// `generated_tokens / seconds`.
    pub tokens_per_second: f64,
    pub batches: usize,
    pub preemptions: u64,
    pub prefix_hits: u64,
}

/// What a [`Pipeline::generate_batch`] run reports as it goes.
pub enum BatchEvent<'a> {
    /// A request finished (in finish order).
    Finished(&'a BatchOutput),
    /// A batch ran: the scheduler's state after it, and the requests finished so far of all.
    Step { stats: SchedulerStats, finished: usize, requests: usize },
}

/// What one [`BatchRunner::step`] reports, request by request.
pub enum RunnerEvent<'a> {
    /// Request `id` (tagged `tag`) generated `token`; `text` is the reply's new streamable text
    /// (empty while a character or a possible stop sequence is incomplete; it may cover earlier
    /// tokens held back until then); `logprobs` when the request asked for them.
    Token { id: RequestId, tag: usize, token: u32, text: &'a str, logprobs: Option<&'a TokenLogprobs> },
    /// Request `id` finished; `text` is what its reply had not streamed yet.
    Finished { id: RequestId, output: &'a BatchOutput, text: &'a str },
    /// Request `id` was cancelled ([`BatchRunner::cancel`]); its pages and slot are free.
    Cancelled { id: RequestId, tag: usize },
    /// Request `id` could not go on (its response format's grammar allowed no token, or
    /// failed); its pages and slot are free, and the other requests run on.
    Failed { id: RequestId, tag: usize, error: &'a LlmError },
}

/// A running request's host state.
struct Active {
    tag: usize,
    prompt_tokens: usize,
    picker: TokenPicker,
    /// Prompt and reply so far (what a repetition penalty sees).
    history: Vec<u32>,
    generated: usize,
    reply: IncrementalDecoder,
    stops: Vec<String>,
    matcher: StopSequenceMatcher,
    /// How much of the reply was streamed.
    streamed: usize,
    /// Where a stop sequence cut the reply.
    cut: Option<usize>,
}

/// A batch's picks: each row's token, its logprobs where asked for, and the rows whose
/// constraint failed with their errors.
type Picked = (Vec<u32>, Vec<Option<TokenLogprobs>>, Vec<(RequestId, LlmError)>);

/// Continuous batching one step at a time over a pipeline's model: submit and cancel requests
/// at any point, call [`BatchRunner::step`] while [`BatchRunner::has_work`].
pub struct BatchRunner<'p> {
    pipeline: &'p Pipeline,
    scheduler: ContinuousBatchScheduler,
    cache: BatchCache,
    active: HashMap<RequestId, Active>,
    /// Requests ended by their own failure, reported as such instead of as cancelled.
    failed: HashMap<RequestId, LlmError>,
    skip_special_tokens: bool,
    max_sequence_length: usize,
    batches: usize,
}

impl<'p> BatchRunner<'p> {
    /// A runner over `kv`'s pool for requests of at most `kv.max_sequence_length` positions
    /// (`options.num_pages` is ignored: `kv` says it).
    pub fn new(pipeline: &'p Pipeline, kv: PagedKvCacheConfig, options: &BatchOptions) -> Result<Self, LlmError> {
        let model = pipeline.model();
        let config = ContinuousBatchConfig {
            max_active_sequences: options.max_active,
            max_batch_tokens: options.max_batch_tokens,
        };
        let mut scheduler = ContinuousBatchScheduler::new(config, kv)?;
        let cache = model.new_batch_cache(kv, options.max_active)?;
        if let Some(bounds) = &options.prefix_cache {
            let (max_bytes, max_entries) = bounds.resolve(&cache);
            scheduler = scheduler.with_prefix_cache(cache.prefix_cache_config(max_bytes, max_entries))?;
        }
        Ok(BatchRunner {
            pipeline,
            scheduler,
            cache,
            active: HashMap::new(),
            failed: HashMap::new(),
            skip_special_tokens: options.skip_special_tokens,
            max_sequence_length: kv.max_sequence_length,
            batches: 0,
        })
    }

    /// Queue a request of `prompt` token ids, tagged `tag` in its events. Errors: invalid
    /// settings, an empty prompt, or one whose prompt plus `max_new_tokens` exceeds the
    /// runner's `max_sequence_length`.
    pub fn submit(&mut self, tag: usize, prompt: Vec<u32>, params: &GenerateParams) -> Result<RequestId, LlmError> {
        params.validate_for(self.pipeline.model().config().vocab_size)?;
        let device = self.pipeline.model().device().clone();
        let picker = TokenPicker::new(&device, params)?;
        let id = self.scheduler.submit(prompt.clone(), params.clone())?;
        self.active.insert(
            id,
            Active {
                tag,
                prompt_tokens: prompt.len(),
                picker,
                history: prompt,
                generated: 0,
                reply: IncrementalDecoder::new(self.skip_special_tokens),
                stops: params.stop_sequences.clone(),
                matcher: StopSequenceMatcher::new(&params.stop_sequences),
                streamed: 0,
                cut: None,
            },
        );
        Ok(id)
    }

    /// Drop request `id` (at once, or when the batch it is in ends); a [`RunnerEvent::Cancelled`]
    /// follows.
    pub fn cancel(&mut self, id: RequestId) -> Result<(), LlmError> {
        self.scheduler.cancel(id)
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn stats(&self) -> SchedulerStats {
        self.scheduler.stats()
    }

    /// Batches run so far.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// The longest request (prompt plus new tokens) the runner takes.
    pub fn max_sequence_length(&self) -> usize {
        self.max_sequence_length
    }

    /// Run one batch (if any can be scheduled) and report its tokens and the requests that
    /// ended, in order. Returns whether a batch ran. A model failure fails the batch (its rows
    /// are scheduled again) and is returned; the cache is then unusable, so every later step
    /// fails too.
    pub fn step(&mut self, mut on_event: impl FnMut(RunnerEvent<'_>)) -> Result<bool, LlmError> {
        let Some(batch) = self.scheduler.schedule()? else {
            self.report_finished(&mut on_event)?;
            return Ok(false);
        };
        let (tokens, logprobs, failures) = match self.run_batch(&batch) {
            Ok(picked) => picked,
            Err(e) => {
                self.scheduler.fail_batch(batch.id)?;
                return Err(e);
            }
        };
        self.batches += 1;
        // A row whose own constraint failed ends alone (its token is not recorded).
        for (id, e) in failures {
            self.scheduler.cancel(id)?;
            self.failed.insert(id, e);
        }
        self.scheduler.complete_batch(batch.id, &tokens)?;
        let tokenizer = self.pipeline.tokenizer();
        for ((row, &token), logprobs) in batch.sequences.iter().zip(&tokens).zip(&logprobs) {
            if self.failed.contains_key(&row.request_id) {
                continue;
            }
            let logprobs = logprobs.as_ref();
            let Some(a) = self.active.get_mut(&row.request_id).filter(|_| row.samples) else { continue };
            a.history.push(token);
            a.generated += 1;
            let reply = a.reply.push(tokenizer, token)?;
            if let Some(cut) = a.matcher.check(reply) {
                a.cut = Some(cut);
                // Unless the same token already finished it (an EOS, or the last one): then the
                // scheduler no longer knows it, and the cut still applies.
                if self.scheduler.is_active(row.request_id) {
                    self.scheduler.finish_request(row.request_id, StopReason::StopSequence)?;
                }
            }
            if a.picker.grammar_finished() && self.scheduler.is_active(row.request_id) {
                self.scheduler.finish_request(row.request_id, StopReason::Grammar)?;
            }
            if self.scheduler.is_active(row.request_id) {
                let mut stream = TextStream::resuming(&a.stops, a.streamed);
                let piece = stream.next(reply, false);
                a.streamed += piece.len();
                on_event(RunnerEvent::Token { id: row.request_id, tag: a.tag, token, text: piece, logprobs });
            } else {
                on_event(RunnerEvent::Token { id: row.request_id, tag: a.tag, token, text: "", logprobs });
            }
        }
        self.report_finished(&mut on_event)?;
        Ok(true)
    }

    /// Report the requests cancelled (or finished) since the last step without running a batch.
    pub fn flush_finished(&mut self, mut on_event: impl FnMut(RunnerEvent<'_>)) -> Result<(), LlmError> {
        self.report_finished(&mut on_event)
    }

    /// Report the requests the scheduler finished or cancelled since the last call.
    fn report_finished(&mut self, on_event: &mut impl FnMut(RunnerEvent<'_>)) -> Result<(), LlmError> {
        let tokenizer = self.pipeline.tokenizer();
        for f in self.scheduler.pop_finished() {
            let Some(mut a) = self.active.remove(&f.request_id) else { continue };
            let Some(reason) = f.stop_reason else {
                match self.failed.remove(&f.request_id) {
                    Some(error) => on_event(RunnerEvent::Failed { id: f.request_id, tag: a.tag, error: &error }),
                    None => on_event(RunnerEvent::Cancelled { id: f.request_id, tag: a.tag }),
                }
                continue;
            };
            let mut text = a.reply.finish(tokenizer)?.to_string();
            // A stop sequence that came with the last token still ends the reply there.
            let stop_reason = match a.cut {
                Some(cut) => {
                    text.truncate(cut);
                    StopReason::StopSequence
                }
                // The last token allowed may also complete the grammar: that is the reason.
                None if reason == StopReason::Length && a.picker.grammar_finished() => StopReason::Grammar,
                None => reason,
            };
            let rest = text.get(a.streamed..).unwrap_or("").to_string();
            let output = BatchOutput {
                index: a.tag,
                prompt_tokens: a.prompt_tokens,
                generated_token_ids: f.generated_token_ids,
                generated_text: text,
                stop_reason,
            };
            on_event(RunnerEvent::Finished { id: f.request_id, output: &output, text: &rest });
        }
        Ok(())
    }

    /// Runs `batch` and picks each sampling row's next token (0 for the others, and for rows
    /// whose constraint failed: those come back with their error), with its logprobs where the
    /// request asked for them.
    fn run_batch(&mut self, batch: &ScheduledBatch) -> Result<Picked, LlmError> {
        let model: &dyn CausalLm = self.pipeline.model();
        let logits = model.forward_batch(batch, &mut self.cache)?;
        let rows = &batch.sequences;
        let active = &mut self.active;
        let plain =
            rows.iter().all(|r| !r.samples || active.get(&r.request_id).is_some_and(|a| a.picker.is_plain_greedy()));
        if plain {
            // One argmax over every row, one read back.
            let device = logits.device().clone();
            let chosen = Tensor::zeros(&device, DType::U32, &[rows.len()])?;
            api::argmax_into(&device.default_stream(), &logits, &chosen, None)
                .map_err(|e| LlmError::op("argmax", e))?;
            let ids = chosen.to_vec::<u32>()?;
            let tokens: Vec<u32> = rows.iter().zip(ids).map(|(r, id)| if r.samples { id } else { 0 }).collect();
            let mut logprobs = Vec::with_capacity(rows.len());
            for (i, (row, &id)) in rows.iter().zip(&tokens).enumerate() {
                logprobs.push(match active.get_mut(&row.request_id).filter(|_| row.samples) {
                    Some(a) => a.picker.logprobs(&logits.narrow(0, i, 1)?, id)?,
                    None => None,
                });
            }
            return Ok((tokens, logprobs, Vec::new()));
        }
        let mut tokens = Vec::with_capacity(rows.len());
        let mut logprobs = Vec::with_capacity(rows.len());
        let mut failures = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            match active.get_mut(&row.request_id).filter(|_| row.samples) {
                Some(a) => {
                    let row_logits = logits.narrow(0, i, 1)?;
                    match a.picker.pick(&row_logits, &a.history, a.generated) {
                        Ok(id) => {
                            tokens.push(id);
                            logprobs.push(a.picker.logprobs(&row_logits, id)?);
                        }
                        Err(e @ LlmError::Constraint(_)) => {
                            failures.push((row.request_id, e));
                            tokens.push(0);
                            logprobs.push(None);
                        }
                        Err(e) => return Err(e),
                    }
                }
                None => {
                    tokens.push(0);
                    logprobs.push(None);
                }
            }
        }
        Ok((tokens, logprobs, failures))
    }
}

impl Pipeline {
    /// Generate for every request at once through continuous batching (see the module docs),
    /// calling `on_event` as requests finish and batches run; returns the totals. Each request
    /// keeps its own settings (greedy unless it has sampling settings; EOS ids, stop sequences,
    /// repetition penalty, `max_new_tokens`). Requests are checked before anything runs: an
    /// empty prompt, or one too long for the model, is an error naming its index.
    pub fn generate_batch(
        &self,
        requests: &[BatchRequest],
        options: &BatchOptions,
        mut on_event: impl FnMut(BatchEvent<'_>),
    ) -> Result<BatchSummary, LlmError> {
        if requests.is_empty() {
            return Err(LlmError::InvalidArgument("generate_batch: no requests".into()));
        }
        let max_positions = self.model().config().max_position_embeddings;
        let mut prompts = Vec::with_capacity(requests.len());
        for r in requests {
            r.params.validate_for(self.model().config().vocab_size)?;
            let ids = self.encode(&r.prompt, true)?;
            let total = ids.len() + r.params.max_new_tokens;
            if ids.is_empty() || total > max_positions {
                return Err(LlmError::InvalidArgument(format!(
                    "request {}: {} prompt tokens + {} new tokens must be 1 to the model's {max_positions} positions",
                    r.index,
                    ids.len(),
                    r.params.max_new_tokens
                )));
            }
            prompts.push(ids);
        }
        let longest = prompts.iter().zip(requests).map(|(p, r)| p.len() + r.params.max_new_tokens).max().unwrap_or(1);
        let block_size = options.block_size.max(1);
        let kv = PagedKvCacheConfig {
            block_size,
            num_pages: options.num_pages.unwrap_or(options.max_active * longest.div_ceil(block_size)),
            max_sequence_length: longest,
        };
        let mut runner = BatchRunner::new(self, kv, options)?;
        for (r, ids) in requests.iter().zip(prompts) {
            runner.submit(r.index, ids, &r.params)?;
        }
        let start = Instant::now();
        let (mut finished, mut generated_tokens) = (0, 0);
        while runner.has_work() {
            let ran = runner.step(|event| {
                if let RunnerEvent::Finished { output, .. } = event {
                    generated_tokens += output.generated_token_ids.len();
                    finished += 1;
                    on_event(BatchEvent::Finished(output));
                }
            })?;
            if !ran && runner.has_work() {
                return Err(LlmError::InvalidArgument(
                    "generate_batch: requests are left but none can be scheduled".into(),
                ));
            }
            on_event(BatchEvent::Step { stats: runner.stats(), finished, requests: requests.len() });
        }
        let seconds = start.elapsed().as_secs_f64();
        let stats = runner.stats();
        Ok(BatchSummary {
            requests: requests.len(),
            generated_tokens,
            seconds,
            tokens_per_second: if seconds > 0.0 { generated_tokens as f64 / seconds } else { 0.0 },
            batches: runner.batches(),
            preemptions: stats.preemptions,
            prefix_hits: stats.prefix_hits,
        })
    }
}

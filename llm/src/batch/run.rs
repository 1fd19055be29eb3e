//! Batched generation end to end: requests through the [`ContinuousBatchScheduler`] and a
//! model's batched executor ([`CausalLm::forward_batch`]), each row's next token picked with
//! its own settings, stop sequences checked on each reply as it grows. What `ruda-llm batch`
//! runs; [`Pipeline::generate_batch`] is the library's call.

use std::collections::HashMap;
use std::time::Instant;

use ruda_ops::api;
use ruda_runtime::{DType, Tensor};

use super::generate::{BatchRequest, StopSequenceMatcher};
use super::scheduler::{
    ContinuousBatchConfig, ContinuousBatchScheduler, PagedKvCacheConfig, RequestId, ScheduledBatch, SchedulerStats,
};
use crate::error::LlmError;
use crate::generate::StopReason;
use crate::models::CausalLm;
use crate::pipeline::{Pipeline, TokenPicker};

/// The batching limits and the KV pool of a [`Pipeline::generate_batch`] run.
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
    /// Share the KV pages of common prompt prefixes (not built yet: an error).
    pub prefix_cache: bool,
    /// Leave special tokens out of `generated_text`.
    pub skip_special_tokens: bool,
}

impl Default for BatchOptions {
    /// 16 active requests, 512 tokens a batch, pages of 16 positions, a pool sized to fit.
    fn default() -> BatchOptions {
        BatchOptions {
            max_active: 16,
            max_batch_tokens: 512,
            block_size: 16,
            num_pages: None,
            prefix_cache: false,
            skip_special_tokens: true,
        }
    }
}

/// One finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutput {
    /// The request's [`BatchRequest::index`] (its line of the prompt file).
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
}

/// What a run reports as it goes.
pub enum BatchEvent<'a> {
    /// A request finished (in finish order).
    Finished(&'a BatchOutput),
    /// A batch ran: the scheduler's state after it, and the requests finished so far of all.
    Step { stats: SchedulerStats, finished: usize, requests: usize },
}

/// A running request's host state.
struct Active {
    index: usize,
    prompt_tokens: usize,
    picker: TokenPicker,
    /// Prompt and reply so far (what a repetition penalty sees).
    history: Vec<u32>,
    generated: usize,
    stops: Option<StopSequenceMatcher>,
    /// Where a stop sequence cut the reply.
    cut: Option<usize>,
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
        if options.prefix_cache {
            return Err(LlmError::InvalidArgument(
                "generate_batch: the prefix cache is not implemented yet (run without it)".into(),
            ));
        }
        let model = self.model();
        let max_positions = model.config().max_position_embeddings;
        let mut prompts = Vec::with_capacity(requests.len());
        for r in requests {
            r.params.validate()?;
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
        let config = ContinuousBatchConfig {
            max_active_sequences: options.max_active,
            max_batch_tokens: options.max_batch_tokens,
        };
        let mut scheduler = ContinuousBatchScheduler::new(config, kv)?;
        let mut cache = model.new_batch_cache(kv, options.max_active)?;
        let device = model.device().clone();
        let mut active: HashMap<RequestId, Active> = HashMap::new();
        for (r, ids) in requests.iter().zip(prompts) {
            let id = scheduler.submit(ids.clone(), r.params.clone())?;
            let stops =
                (!r.params.stop_sequences.is_empty()).then(|| StopSequenceMatcher::new(&r.params.stop_sequences));
            active.insert(
                id,
                Active {
                    index: r.index,
                    prompt_tokens: ids.len(),
                    picker: TokenPicker::new(&device, &r.params)?,
                    history: ids,
                    generated: 0,
                    stops,
                    cut: None,
                },
            );
        }
        let start = Instant::now();
        let (mut finished, mut generated_tokens, mut batches) = (0, 0, 0);
        while scheduler.has_work() {
            let batch = scheduler.schedule()?.ok_or_else(|| {
                LlmError::InvalidArgument("generate_batch: requests are left but none can be scheduled".into())
            })?;
            let tokens = match self.run_one(model, &batch, &mut cache, &mut active) {
                Ok(tokens) => tokens,
                Err(e) => {
                    scheduler.fail_batch(batch.id)?;
                    return Err(e);
                }
            };
            batches += 1;
            scheduler.complete_batch(batch.id, &tokens)?;
            for (row, &token) in batch.sequences.iter().zip(&tokens) {
                let Some(a) = active.get_mut(&row.request_id).filter(|_| row.samples) else { continue };
                a.history.push(token);
                a.generated += 1;
                if let Some(stops) = &mut a.stops {
                    let reply = self.decode(&a.history[a.prompt_tokens..], options.skip_special_tokens)?;
                    if let Some(cut) = stops.check(&reply) {
                        a.cut = Some(cut);
                        // Unless the same token already finished it (an EOS, or the last one):
                        // then the scheduler no longer knows it, and the cut still applies.
                        if scheduler.is_active(row.request_id) {
                            scheduler.finish_request(row.request_id, StopReason::StopSequence)?;
                        }
                    }
                }
            }
            for f in scheduler.pop_finished() {
                let a = active
                    .remove(&f.request_id)
                    .ok_or_else(|| LlmError::InvalidArgument(format!("{} finished twice", f.request_id)))?;
                let mut text = self.decode(&f.generated_token_ids, options.skip_special_tokens)?;
                // A stop sequence that came with the last token still ends the reply there.
                let stop_reason = match a.cut {
                    Some(cut) => {
                        text.truncate(cut);
                        StopReason::StopSequence
                    }
                    None => f.stop_reason.ok_or_else(|| {
                        LlmError::InvalidArgument(format!(
                            "{} was cancelled, which generate_batch never does",
                            f.request_id
                        ))
                    })?,
                };
                generated_tokens += f.generated_token_ids.len();
                finished += 1;
                let output = BatchOutput {
                    index: a.index,
                    prompt_tokens: a.prompt_tokens,
                    generated_token_ids: f.generated_token_ids,
                    generated_text: text,
                    stop_reason,
                };
                on_event(BatchEvent::Finished(&output));
            }
            on_event(BatchEvent::Step { stats: scheduler.stats(), finished, requests: requests.len() });
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok(BatchSummary {
            requests: requests.len(),
            generated_tokens,
            seconds,
            tokens_per_second: if seconds > 0.0 { generated_tokens as f64 / seconds } else { 0.0 },
            batches,
            preemptions: scheduler.stats().preemptions,
        })
    }

    /// Runs `batch` and picks each sampling row's next token (0 for the others).
    fn run_one(
        &self,
        model: &dyn CausalLm,
        batch: &ScheduledBatch,
        cache: &mut crate::models::BatchCache,
        active: &mut HashMap<RequestId, Active>,
    ) -> Result<Vec<u32>, LlmError> {
        let logits = model.forward_batch(batch, cache)?;
        let rows = &batch.sequences;
        let plain =
            rows.iter().all(|r| !r.samples || active.get(&r.request_id).is_some_and(|a| a.picker.is_plain_greedy()));
        if plain {
            // One argmax over every row, one read back.
            let device = logits.device().clone();
            let chosen = Tensor::zeros(&device, DType::U32, &[rows.len()])?;
            api::argmax_into(&device.default_stream(), &logits, &chosen, None)
                .map_err(|e| LlmError::op("argmax", e))?;
            let ids = chosen.to_vec::<u32>()?;
            return Ok(rows.iter().zip(ids).map(|(r, id)| if r.samples { id } else { 0 }).collect());
        }
        let mut tokens = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            match active.get_mut(&row.request_id).filter(|_| row.samples) {
                Some(a) => tokens.push(a.picker.pick(&logits.narrow(0, i, 1)?, &a.history, a.generated)?),
                None => tokens.push(0),
            }
        }
        Ok(tokens)
    }
}

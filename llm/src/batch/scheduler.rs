//! The continuous-batching scheduler: FIFO admission, chunked prefill under a token budget,
//! decode before prefill (with a bound so prefill is not starved), KV pages reserved as
//! positions are needed, and preemption by recompute when the pool runs out.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use super::pages::PagePool;
use crate::{GenerateParams, LlmError, StopReason};

/// After this many consecutive decode batches, a pending prefill gets the next batch, so new
/// requests are not starved by a steady stream of decodes.
const DECODE_STREAK_LIMIT: usize = 4;

/// How many requests run at once and how many tokens one batch may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuousBatchConfig {
    pub max_active_sequences: usize,
    pub max_batch_tokens: usize,
}

/// The paged KV cache: `num_pages` pages of `block_size` positions each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedKvCacheConfig {
    pub block_size: usize,
    pub num_pages: usize,
    pub max_sequence_length: usize,
}

/// Bounds of the prefix cache: bytes (`page_bytes` per cached page plus `snapshot_bytes` per
/// linear-attention snapshot, 0 without linear-attention layers) and entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    pub max_bytes: u64,
    pub max_entries: usize,
    pub page_bytes: u64,
    pub snapshot_bytes: u64,
}

/// A submitted request, numbered from 0 in submission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// A saved copy of a sequence's linear-attention states (hybrid models).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotId(pub u64);

/// One kind per batch: prompt chunks, or one token per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKind {
    Prefill,
    Decode,
}

/// Copy-on-write of a page: copy page `src` to `dst` in every layer before running the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    pub src: u32,
    pub dst: u32,
}

/// One row of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSequence {
    pub request_id: RequestId,
    /// This step's tokens: a prompt chunk, or the one last token (decode).
    pub tokens: Vec<u32>,
    /// Absolute position of `tokens[0]`; 0 is a fresh sequence (reset its states).
    pub start_position: usize,
    /// `start_position + tokens.len()`: the KV length after this step.
    pub context_length: usize,
    /// Physical pages covering positions `0..context_length`.
    pub block_table: Vec<u32>,
    /// In `0..max_active_sequences`, stable while the request is active.
    pub slot: usize,
    /// Whether this row's last token yields a generated token (last prompt chunk, or decode).
    pub samples: bool,
    pub restore_snapshot: Option<SnapshotId>,
    pub save_snapshot: Option<SnapshotId>,
}

/// What the executor runs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledBatch {
    pub id: u64,
    pub kind: BatchKind,
    pub sequences: Vec<ScheduledSequence>,
    pub copies: Vec<PageCopy>,
    pub released_snapshots: Vec<SnapshotId>,
}

impl ScheduledBatch {
    /// One row per sequence, padded with token 0 to the longest row.
    pub fn token_matrix(&self) -> Vec<Vec<u32>> {
        let width = self.sequences.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        self.sequences
            .iter()
            .map(|s| {
                let mut row = s.tokens.clone();
                row.resize(width, 0);
                row
            })
            .collect()
    }

    /// The KV length of each row after this step.
    pub fn context_lengths(&self) -> Vec<u32> {
        self.sequences.iter().map(|s| s.context_length as u32).collect()
    }

    /// The block tables row by row, each padded with page 0 (a valid page, never read since it
    /// lies past the row's context length) to the widest table; returns (table, width).
    pub fn flattened_block_table(&self) -> (Vec<u32>, usize) {
        let width = self.sequences.iter().map(|s| s.block_table.len()).max().unwrap_or(0);
        let mut flat = Vec::with_capacity(width * self.sequences.len());
        for s in &self.sequences {
            flat.extend_from_slice(&s.block_table);
            flat.resize(flat.len() + width - s.block_table.len(), 0);
        }
        (flat, width)
    }
}

/// A request that left the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedRequest {
    pub request_id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub generated_token_ids: Vec<u32>,
    /// `None`: cancelled.
    pub stop_reason: Option<StopReason>,
}

/// The serving metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub pages_used: usize,
    pub pages_free: usize,
    /// `pages_used / num_pages`.
    pub kv_usage: f64,
    pub preemptions: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
}

#[derive(Debug)]
struct Request {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    params: GenerateParams,
    /// Positions whose KV is in the cache.
    computed: usize,
    /// Prefilling `prompt + generated` (fresh, or recomputing after a preemption).
    prefilling: bool,
    pages: Vec<u32>,
    slot: Option<usize>,
    /// A cancel or finish asked for while the request was in the outstanding batch.
    deferred: Option<Option<StopReason>>,
}

impl Request {
    fn token(&self, position: usize) -> u32 {
        if position < self.prompt.len() {
            self.prompt[position]
        } else {
            self.generated[position - self.prompt.len()]
        }
    }

    fn len(&self) -> usize {
        self.prompt.len() + self.generated.len()
    }
}

/// See the module documentation and `docs/batching.md` for the rules.
#[derive(Debug)]
pub struct ContinuousBatchScheduler {
    config: ContinuousBatchConfig,
    kv: PagedKvCacheConfig,
    requests: HashMap<RequestId, Request>,
    waiting: VecDeque<RequestId>,
    /// In admission order: the last is the youngest, preempted first.
    running: Vec<RequestId>,
    free_slots: Vec<usize>,
    pool: PagePool,
    outstanding: Option<ScheduledBatch>,
    finished: Vec<FinishedRequest>,
    next_request: u64,
    next_batch: u64,
    decode_streak: usize,
    stats: SchedulerStats,
}

impl ContinuousBatchScheduler {
    pub fn new(config: ContinuousBatchConfig, kv: PagedKvCacheConfig) -> Result<Self, LlmError> {
        let bad = |m: &str| Err(LlmError::InvalidArgument(format!("continuous batching: {m}")));
        if config.max_active_sequences == 0 {
            return bad("max_active_sequences must be at least 1");
        }
        if config.max_batch_tokens == 0 {
            return bad("max_batch_tokens must be at least 1");
        }
        if kv.block_size == 0 || kv.num_pages == 0 || kv.max_sequence_length == 0 {
            return bad("block_size, num_pages and max_sequence_length must be at least 1");
        }
        if kv.num_pages > u32::MAX as usize {
            return bad("num_pages must fit in u32");
        }
        Ok(ContinuousBatchScheduler {
            config,
            kv,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots: (0..config.max_active_sequences).rev().collect(),
            pool: PagePool::new(kv.num_pages),
            outstanding: None,
            finished: Vec::new(),
            next_request: 0,
            next_batch: 0,
            decode_streak: 0,
            stats: SchedulerStats::default(),
        })
    }

    /// Prefix caching is not implemented yet: this is an error rather than a silent no-op.
    pub fn with_prefix_cache(self, prefix: PrefixCacheConfig) -> Result<Self, LlmError> {
        Err(LlmError::InvalidArgument(format!(
            "continuous batching: prefix caching ({prefix:?}) is not implemented yet"
        )))
    }

    /// Queue a request. Errors: an empty prompt, invalid generation settings, a prompt plus
    /// `max_new_tokens` longer than `max_sequence_length`, or one needing more pages than the pool has.
    pub fn submit(&mut self, prompt_token_ids: Vec<u32>, generation: GenerateParams) -> Result<RequestId, LlmError> {
        generation.validate()?;
        if prompt_token_ids.is_empty() {
            return Err(LlmError::InvalidArgument("continuous batching: the prompt is empty".into()));
        }
        let total = prompt_token_ids.len() + generation.max_new_tokens;
        if total > self.kv.max_sequence_length {
            return Err(LlmError::InvalidArgument(format!(
                "continuous batching: prompt ({}) plus max_new_tokens ({}) exceeds max_sequence_length {}",
                prompt_token_ids.len(),
                generation.max_new_tokens,
                self.kv.max_sequence_length
            )));
        }
        // The last generated token is never fed back, so its position needs no KV.
        let pages = (total - 1).div_ceil(self.kv.block_size);
        if pages > self.kv.num_pages {
            return Err(LlmError::InvalidArgument(format!(
                "continuous batching: the request needs {pages} KV pages, the pool has {}",
                self.kv.num_pages
            )));
        }
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.stats.prompt_tokens += prompt_token_ids.len() as u64;
        self.requests.insert(
            id,
            Request {
                prompt: prompt_token_ids,
                generated: Vec::new(),
                params: generation,
                computed: 0,
                prefilling: true,
                pages: Vec::new(),
                slot: None,
                deferred: None,
            },
        );
        self.waiting.push_back(id);
        Ok(id)
    }

    /// The next batch, or `None` when nothing can run. An error while a batch is outstanding.
    pub fn schedule(&mut self) -> Result<Option<ScheduledBatch>, LlmError> {
        if let Some(b) = &self.outstanding {
            return Err(LlmError::InvalidArgument(format!(
                "continuous batching: batch {} is still outstanding (complete or fail it first)",
                b.id
            )));
        }
        self.admit();
        let decodable = self.running.iter().any(|id| !self.requests[id].prefilling);
        let prefillable = self.running.iter().any(|id| self.requests[id].prefilling);
        let kind = if decodable && !(prefillable && self.decode_streak >= DECODE_STREAK_LIMIT) {
            BatchKind::Decode
        } else if prefillable {
            BatchKind::Prefill
        } else {
            return Ok(None);
        };
        let mut sequences = self.rows(kind);
        let mut kind = kind;
        if sequences.is_empty() {
            // The preferred kind could not get pages (its rows were preempted): try the other one.
            kind = if kind == BatchKind::Decode { BatchKind::Prefill } else { BatchKind::Decode };
            sequences = self.rows(kind);
        }
        if sequences.is_empty() {
            return Ok(None);
        }
        self.decode_streak = if kind == BatchKind::Decode { self.decode_streak + 1 } else { 0 };
        let batch =
            ScheduledBatch { id: self.next_batch, kind, sequences, copies: Vec::new(), released_snapshots: Vec::new() };
        self.next_batch += 1;
        self.outstanding = Some(batch.clone());
        Ok(Some(batch))
    }

    /// Record the batch's results: one token per row (ignored for rows that do not sample).
    pub fn complete_batch(&mut self, batch_id: u64, generated_token_ids: &[u32]) -> Result<(), LlmError> {
        let batch = self.take_outstanding(batch_id)?;
        if generated_token_ids.len() != batch.sequences.len() {
            let n = batch.sequences.len();
            self.outstanding = Some(batch);
            return Err(LlmError::InvalidArgument(format!(
                "continuous batching: batch {batch_id} has {n} rows, got {} tokens",
                generated_token_ids.len()
            )));
        }
        for (row, &token) in batch.sequences.iter().zip(generated_token_ids) {
            let id = row.request_id;
            let r = self.requests.get_mut(&id).expect("a scheduled request exists until its batch ends");
            if let Some(reason) = r.deferred {
                self.finish(id, reason);
                continue;
            }
            r.computed = row.context_length;
            if !row.samples {
                continue;
            }
            r.prefilling = false;
            r.generated.push(token);
            self.stats.generation_tokens += 1;
            let stop = if r.params.eos_token_ids.contains(&token) {
                Some(StopReason::Eos)
            } else if r.generated.len() >= r.params.max_new_tokens {
                Some(StopReason::Length)
            } else {
                None
            };
            if let Some(reason) = stop {
                self.finish(id, Some(reason));
            }
        }
        Ok(())
    }

    /// The batch did not run: its rows are scheduled again (deferred cancels and finishes apply).
    pub fn fail_batch(&mut self, batch_id: u64) -> Result<(), LlmError> {
        let batch = self.take_outstanding(batch_id)?;
        for row in &batch.sequences {
            if let Some(reason) = self.requests[&row.request_id].deferred {
                self.finish(row.request_id, reason);
            }
        }
        Ok(())
    }

    /// Stop a request for a reason the executor detected (a stop sequence).
    pub fn finish_request(&mut self, id: RequestId, reason: StopReason) -> Result<(), LlmError> {
        self.end(id, Some(reason))
    }

    /// Drop a request at any point; deferred until its batch ends while it is in the outstanding one.
    pub fn cancel(&mut self, id: RequestId) -> Result<(), LlmError> {
        self.end(id, None)
    }

    /// Requests finished (or cancelled) since the last call, in the order they ended.
    pub fn pop_finished(&mut self) -> Vec<FinishedRequest> {
        std::mem::take(&mut self.finished)
    }

    /// Whether request `id` is still waiting or running (not finished nor cancelled).
    pub fn is_active(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    /// Whether any request is waiting, running or in an outstanding batch.
    pub fn has_work(&self) -> bool {
        !self.requests.is_empty()
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pages_used: self.pool.used_count(),
            pages_free: self.pool.free_count(),
            kv_usage: self.pool.used_count() as f64 / self.pool.total() as f64,
            ..self.stats
        }
    }

    fn end(&mut self, id: RequestId, reason: Option<StopReason>) -> Result<(), LlmError> {
        let in_batch = self.outstanding.as_ref().is_some_and(|b| b.sequences.iter().any(|s| s.request_id == id));
        let Some(r) = self.requests.get_mut(&id) else {
            return Err(LlmError::InvalidArgument(format!("continuous batching: {id} is not active")));
        };
        if in_batch {
            r.deferred.get_or_insert(reason);
        } else {
            self.finish(id, reason);
        }
        Ok(())
    }

    fn take_outstanding(&mut self, batch_id: u64) -> Result<ScheduledBatch, LlmError> {
        match self.outstanding.take() {
            Some(b) if b.id == batch_id => Ok(b),
            other => {
                let expected = other.as_ref().map(|b| b.id);
                self.outstanding = other;
                Err(LlmError::InvalidArgument(format!(
                    "continuous batching: batch {batch_id} is not the outstanding batch ({expected:?})"
                )))
            }
        }
    }

    /// The rows of a `kind` batch, in admission order, under the token budget.
    fn rows(&mut self, kind: BatchKind) -> Vec<ScheduledSequence> {
        let mut sequences = Vec::new();
        let mut budget = self.config.max_batch_tokens;
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let id = self.running[index];
            let r = &self.requests[&id];
            if r.prefilling != (kind == BatchKind::Prefill) {
                index += 1;
                continue;
            }
            let start = r.computed;
            let count = if r.prefilling { (r.len() - start).min(budget) } else { 1 };
            let (start, end) = if r.prefilling { (start, start + count) } else { (r.len() - 1, r.len()) };
            if !self.reserve(id, end, &sequences) {
                // `id` itself was preempted: it left `running`, so do not advance.
                continue;
            }
            let r = &self.requests[&id];
            let tokens = (start..end).map(|p| r.token(p)).collect();
            sequences.push(ScheduledSequence {
                request_id: id,
                tokens,
                start_position: start,
                context_length: end,
                block_table: r.pages[..end.div_ceil(self.kv.block_size)].to_vec(),
                slot: r.slot.expect("a running request has a slot"),
                samples: end == r.len(),
                restore_snapshot: None,
                save_snapshot: None,
            });
            budget -= count;
            // Preemption may have removed requests after this one, never before it.
            index = self.running.iter().position(|&r| r == id).map_or(index, |i| i + 1);
        }
        sequences
    }

    /// FIFO admission while there is a free slot.
    fn admit(&mut self) {
        while let Some(&id) = self.waiting.front() {
            let Some(slot) = self.free_slots.pop() else { break };
            self.waiting.pop_front();
            self.requests.get_mut(&id).expect("a waiting request exists").slot = Some(slot);
            self.running.push(id);
        }
    }

    /// Give `id` pages for positions `0..end`, preempting the youngest running requests not in
    /// `batch` (possibly `id` itself) while the pool is short. False when `id` was preempted.
    fn reserve(&mut self, id: RequestId, end: usize, batch: &[ScheduledSequence]) -> bool {
        let needed = end.div_ceil(self.kv.block_size);
        loop {
            let have = self.requests[&id].pages.len();
            if have >= needed {
                return true;
            }
            if let Some(page) = self.pool.take() {
                self.requests.get_mut(&id).expect("reserving for a live request").pages.push(page);
                continue;
            }
            let victim = *self
                .running
                .iter()
                .rev()
                .find(|v| !batch.iter().any(|s| s.request_id == **v))
                .expect("the request being reserved is running and not yet in the batch");
            self.preempt(victim);
            if victim == id {
                return false;
            }
        }
    }

    /// Recompute preemption: pages and slot given back, re-queued at the front with prompt and
    /// generated tokens to prefill again.
    fn preempt(&mut self, id: RequestId) {
        self.stats.preemptions += 1;
        let r = self.requests.get_mut(&id).expect("preempting a live request");
        self.pool.give_back(r.pages.drain(..));
        self.free_slots.push(r.slot.take().expect("a running request has a slot"));
        r.computed = 0;
        r.prefilling = true;
        self.running.retain(|&v| v != id);
        self.waiting.push_front(id);
    }

    fn finish(&mut self, id: RequestId, reason: Option<StopReason>) {
        let r = self.requests.remove(&id).expect("finishing a live request");
        self.pool.give_back(r.pages);
        if let Some(slot) = r.slot {
            self.free_slots.push(slot);
        }
        self.running.retain(|&v| v != id);
        self.waiting.retain(|&v| v != id);
        self.finished.push(FinishedRequest {
            request_id: id,
            prompt_token_ids: r.prompt,
            generated_token_ids: r.generated,
            stop_reason: reason,
        });
    }
}

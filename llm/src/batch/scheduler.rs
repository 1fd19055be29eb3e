//! The continuous-batching scheduler: FIFO admission, chunked prefill under a token budget,
//! decode before prefill (with a bound so prefill is not starved), KV pages reserved as
//! positions are needed, preemption by recompute when the pool runs out, and (opt-in) prefix
//! caching: full prompt pages shared between requests, with copy-on-write and, for hybrid
//! models, snapshots of the linear-attention states.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use super::pages::PagePool;
use super::prefix::{Evicted, PrefixCache};
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
    /// Pages not on the free list: held by requests or by the prefix cache.
    pub pages_used: usize,
    pub pages_free: usize,
    /// `pages_used / num_pages`.
    pub kv_usage: f64,
    pub preemptions: u64,
    /// Prefix-cache lookups (one each time a request starts prefilling from position 0).
    pub prefix_queries: u64,
    /// Lookups that reused at least one page.
    pub prefix_hits: u64,
    /// Positions whose KV (and states) came from the prefix cache instead of being computed.
    pub prefix_hit_tokens: u64,
    /// Pages held by the prefix cache (its entries), referenced or not.
    pub prefix_cached_pages: usize,
    /// Linear-attention snapshots held by the prefix cache.
    pub prefix_cached_snapshots: usize,
    /// `prefix_cached_pages * page_bytes + prefix_cached_snapshots * snapshot_bytes`.
    pub prefix_cache_bytes: u64,
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
    /// The chain hashes of the prompt's full pages (with prefix caching).
    hashes: Vec<u64>,
    /// How many leading `pages` are prefix-cache entries (the request holds a reference to each).
    shared: usize,
    /// Whether newly completed prompt pages may still become entries in this prefill pass.
    caching: bool,
    /// The snapshot to load the slot's states from before the first row of this pass runs.
    restore: Option<SnapshotId>,
    /// End a prefill chunk at this position and save a snapshot there (hybrid models).
    snapshot_at: Option<usize>,
    /// A copy-on-write that has not run yet: the source entry (still referenced) and the copy.
    cow: Option<(u64, PageCopy)>,
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
    prefix: Option<PrefixCache>,
    /// Snapshots to hand to the executor with the next batch.
    released: Vec<SnapshotId>,
    next_snapshot: u64,
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
            prefix: None,
            released: Vec::new(),
            next_snapshot: 0,
        })
    }

    /// Share full pages of prompt tokens between requests (see `docs/batching.md`). Errors: a
    /// bound of 0, or requests already submitted. `snapshot_bytes == 0` is a model without
    /// linear-attention layers; above 0, a hybrid model, whose hits need a snapshot.
    pub fn with_prefix_cache(mut self, prefix: PrefixCacheConfig) -> Result<Self, LlmError> {
        if prefix.max_bytes == 0 || prefix.max_entries == 0 || prefix.page_bytes == 0 {
            return Err(LlmError::InvalidArgument(format!(
                "continuous batching: prefix cache bounds must be at least 1 ({prefix:?})"
            )));
        }
        if !self.requests.is_empty() {
            return Err(LlmError::InvalidArgument(
                "continuous batching: enable the prefix cache before submitting requests".into(),
            ));
        }
        self.prefix = Some(PrefixCache::new(prefix));
        Ok(self)
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
        let hashes =
            self.prefix.as_ref().map_or_else(Vec::new, |c| c.page_hashes(&prompt_token_ids, self.kv.block_size));
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
                hashes,
                shared: 0,
                caching: false,
                restore: None,
                snapshot_at: None,
                cow: None,
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
        let (mut sequences, mut copies) = self.rows(kind);
        let mut kind = kind;
        if sequences.is_empty() {
            // The preferred kind could not get pages (its rows were preempted): try the other one.
            kind = if kind == BatchKind::Decode { BatchKind::Prefill } else { BatchKind::Decode };
            (sequences, copies) = self.rows(kind);
        }
        if sequences.is_empty() {
            return Ok(None);
        }
        self.decode_streak = if kind == BatchKind::Decode { self.decode_streak + 1 } else { 0 };
        let released_snapshots = std::mem::take(&mut self.released);
        let batch = ScheduledBatch { id: self.next_batch, kind, sequences, copies, released_snapshots };
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
                // The executor saved the snapshot, but nothing will use it.
                self.released.extend(row.save_snapshot);
                self.finish(id, reason);
                continue;
            }
            r.computed = row.context_length;
            r.restore = None;
            self.cache_pages(id, row.save_snapshot);
            let r = self.requests.get_mut(&id).expect("a scheduled request exists until its batch ends");
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

    /// The batch did not run: its rows are scheduled again (deferred cancels and finishes apply),
    /// with their copies and restores; its released snapshots go with the next batch.
    pub fn fail_batch(&mut self, batch_id: u64) -> Result<(), LlmError> {
        let batch = self.take_outstanding(batch_id)?;
        self.released.splice(0..0, batch.released_snapshots.iter().copied());
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
            prefix_cached_pages: self.prefix.as_ref().map_or(0, |c| c.entries()),
            prefix_cached_snapshots: self.prefix.as_ref().map_or(0, |c| c.snapshots()),
            prefix_cache_bytes: self.prefix.as_ref().map_or(0, |c| c.bytes()),
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

    /// The rows of a `kind` batch, in admission order, under the token budget, and the page
    /// copies to run before them.
    fn rows(&mut self, kind: BatchKind) -> (Vec<ScheduledSequence>, Vec<PageCopy>) {
        let block = self.kv.block_size;
        let mut sequences = Vec::new();
        let mut copies = Vec::new();
        let mut budget = self.config.max_batch_tokens;
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let id = self.running[index];
            let r = &self.requests[&id];
            if r.prefilling != (kind == BatchKind::Prefill) {
                index += 1;
                continue;
            }
            let (start, mut end) = if r.prefilling {
                (r.computed, r.computed + (r.len() - r.computed).min(budget))
            } else {
                (r.len() - 1, r.len())
            };
            let cow = start / block < r.shared;
            let save = if r.prefilling { self.snapshot_due(id, start, end) } else { None };
            if let Some(p) = save {
                end = p;
            }
            if cow {
                let Some(fresh) = self.take_page(id, &sequences) else { continue };
                self.copy_on_write(id, start / block, fresh);
            }
            if !self.reserve(id, end, &sequences) {
                // `id` itself was preempted: it left `running`, so do not advance.
                continue;
            }
            let save_snapshot = save.map(|_| {
                self.next_snapshot += 1;
                SnapshotId(self.next_snapshot - 1)
            });
            let r = &self.requests[&id];
            copies.extend(r.cow.map(|(_, copy)| copy));
            let tokens = (start..end).map(|p| r.token(p)).collect();
            sequences.push(ScheduledSequence {
                request_id: id,
                tokens,
                start_position: start,
                context_length: end,
                block_table: r.pages[..end.div_ceil(block)].to_vec(),
                slot: r.slot.expect("a running request has a slot"),
                samples: end == r.len(),
                restore_snapshot: r.restore,
                save_snapshot,
            });
            budget -= end - start;
            // Preemption may have removed requests after this one, never before it.
            index = self.running.iter().position(|&r| r == id).map_or(index, |i| i + 1);
        }
        (sequences, copies)
    }

    /// FIFO admission while there is a free slot.
    fn admit(&mut self) {
        while let Some(&id) = self.waiting.front() {
            let Some(slot) = self.free_slots.pop() else { break };
            self.waiting.pop_front();
            self.requests.get_mut(&id).expect("a waiting request exists").slot = Some(slot);
            self.running.push(id);
            self.lookup(id);
        }
    }

    /// Prefix-cache lookup for a request starting to prefill from position 0: reuse the matched
    /// pages (non-hybrid: up to all but the last position; hybrid: up to the deepest boundary
    /// with a snapshot) and plan this pass's snapshot.
    fn lookup(&mut self, id: RequestId) {
        let Some(cache) = &mut self.prefix else { return };
        let block = self.kv.block_size;
        let r = self.requests.get_mut(&id).expect("an admitted request exists");
        let matched = cache.matched(&r.prompt, &r.hashes, block);
        let len = r.len();
        let start = if cache.hybrid() {
            let pages = (1..=matched.len()).rev().find(|&k| matched[k - 1].is_some() && k * block < len).unwrap_or(0);
            r.restore = pages.checked_sub(1).and_then(|k| matched[k]);
            pages * block
        } else {
            let start = (matched.len() * block).min(len - 1);
            // Starting inside a cached page copies it while holding it: one page more than the
            // table, which must fit in the pool (else start at the page boundary).
            if !start.is_multiple_of(block) && start.div_ceil(block) >= self.kv.num_pages {
                start / block * block
            } else {
                start
            }
        };
        let pages = start.div_ceil(block);
        self.stats.prefix_queries += 1;
        if pages > 0 {
            self.stats.prefix_hits += 1;
            self.stats.prefix_hit_tokens += start as u64;
            r.pages = cache.acquire(&r.hashes[..pages]);
        }
        r.shared = pages;
        r.computed = start;
        r.caching = true;
        let p = (r.prompt.len() - 1) / block * block;
        r.snapshot_at = (cache.hybrid() && p > start).then_some(p);
    }

    /// `Some(P)` when a prefill row `start..end` reaches this pass's snapshot boundary `P` and
    /// no cached entry ending at `P` has a snapshot yet: the row then ends at `P` and saves one.
    fn snapshot_due(&mut self, id: RequestId, start: usize, end: usize) -> Option<usize> {
        let block = self.kv.block_size;
        let r = self.requests.get_mut(&id).expect("scheduling a live request");
        let p = r.snapshot_at.filter(|&p| start < p && p <= end)?;
        let cache = self.prefix.as_ref().expect("snapshots are planned with a prefix cache");
        let saved = cache.matched(&r.prompt, &r.hashes, block).get(p / block - 1).copied().flatten().is_some();
        if saved {
            r.snapshot_at = None;
            None
        } else {
            Some(p)
        }
    }

    /// The row writes into page `index`, a cache entry: `fresh` replaces it in the request's
    /// table, and the copy runs with the row's batch (the source stays referenced until then).
    fn copy_on_write(&mut self, id: RequestId, index: usize, fresh: u32) {
        let r = self.requests.get_mut(&id).expect("scheduling a live request");
        // Positions are written from `computed` on and only completed pages are cached, so the
        // page written into is the last one of the table.
        debug_assert_eq!(index + 1, r.pages.len());
        debug_assert_eq!(r.shared, r.pages.len());
        let src = std::mem::replace(&mut r.pages[index], fresh);
        r.cow = Some((r.hashes[index], PageCopy { src, dst: fresh }));
        r.shared = index;
    }

    /// After a row completed: its newly completed full prompt pages become cache entries while
    /// they can, its copy's source is released, and its saved snapshot is attached.
    fn cache_pages(&mut self, id: RequestId, save: Option<SnapshotId>) {
        let Some(cache) = &mut self.prefix else { return };
        let block = self.kv.block_size;
        let r = self.requests.get_mut(&id).expect("a completed request exists");
        let mut evicted = Evicted::default();
        if let Some((src, _)) = r.cow.take() {
            cache.release(src);
        }
        let full = r.computed.min(r.prompt.len()) / block;
        while r.caching && r.shared < full {
            let k = r.shared;
            let parent = k.checked_sub(1).map(|p| r.hashes[p]);
            if cache.insert(r.hashes[k], parent, &r.prompt[k * block..(k + 1) * block], r.pages[k], &mut evicted) {
                r.shared += 1;
            } else {
                // Kept private; later pages too, so that a request holds whole chains.
                r.caching = false;
            }
        }
        if let Some(snapshot) = save {
            // The row ended at the boundary: attach to the entry of the page ending there (this
            // request's, or an equal one it kept its own page beside), pinned while making room.
            let k = r.computed / block;
            r.snapshot_at = None;
            let mut attached = false;
            if cache.matched(&r.prompt, &r.hashes, block).len() >= k {
                let chain = &r.hashes[..k];
                cache.acquire(chain);
                attached = cache.attach_snapshot(chain[k - 1], snapshot, &mut evicted);
                chain.iter().for_each(|&h| cache.release(h));
            }
            if !attached {
                evicted.snapshots.push(snapshot);
            }
        }
        self.pool.give_back(evicted.pages);
        self.released.extend(evicted.snapshots);
    }

    /// Give `id` pages for positions `0..end` (see [`Self::take_page`]). False when `id` was preempted.
    fn reserve(&mut self, id: RequestId, end: usize, batch: &[ScheduledSequence]) -> bool {
        let needed = end.div_ceil(self.kv.block_size);
        while self.requests[&id].pages.len() < needed {
            let Some(page) = self.take_page(id, batch) else { return false };
            self.requests.get_mut(&id).expect("reserving for a live request").pages.push(page);
        }
        true
    }

    /// A free page for `id`: from the free list, else by evicting unreferenced cached pages (LRU),
    /// else by preempting the youngest running requests not in `batch` (possibly `id` itself:
    /// then `None`).
    fn take_page(&mut self, id: RequestId, batch: &[ScheduledSequence]) -> Option<u32> {
        loop {
            if let Some(page) = self.pool.take() {
                return Some(page);
            }
            if let Some(cache) = &mut self.prefix {
                let mut evicted = Evicted::default();
                if cache.evict_lru(&mut evicted) {
                    self.pool.give_back(evicted.pages);
                    self.released.extend(evicted.snapshots);
                    continue;
                }
            }
            let victim = *self
                .running
                .iter()
                .rev()
                .find(|v| !batch.iter().any(|s| s.request_id == **v))
                .expect("the request being reserved is running and not yet in the batch");
            self.preempt(victim);
            if victim == id {
                return None;
            }
        }
    }

    /// Recompute preemption: pages and slot given back, re-queued at the front with prompt and
    /// generated tokens to prefill again.
    fn preempt(&mut self, id: RequestId) {
        self.stats.preemptions += 1;
        let r = self.requests.get_mut(&id).expect("preempting a live request");
        drop_pages(r, &mut self.pool, self.prefix.as_mut());
        self.free_slots.push(r.slot.take().expect("a running request has a slot"));
        r.computed = 0;
        r.prefilling = true;
        r.caching = false;
        r.restore = None;
        r.snapshot_at = None;
        self.running.retain(|&v| v != id);
        self.waiting.push_front(id);
    }

    fn finish(&mut self, id: RequestId, reason: Option<StopReason>) {
        let mut r = self.requests.remove(&id).expect("finishing a live request");
        drop_pages(&mut r, &mut self.pool, self.prefix.as_mut());
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

/// Private pages back to the free list, references to cache entries dropped (their pages stay cached).
fn drop_pages(r: &mut Request, pool: &mut PagePool, cache: Option<&mut PrefixCache>) {
    if let Some(cache) = cache {
        for &h in &r.hashes[..r.shared] {
            cache.release(h);
        }
        if let Some((src, _)) = r.cow.take() {
            cache.release(src);
        }
    }
    let shared = r.shared;
    pool.give_back(r.pages.drain(shared..));
    r.pages.clear();
    r.shared = 0;
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;

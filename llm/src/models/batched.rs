//! Batched execution: a [`ScheduledBatch`] of the continuous-batching scheduler through the
//! decoder. Its rows are packed (prefill chunks of several sequences, or one token per sequence
//! in decode); every full-attention layer appends them to its physical KV arena
//! `[num_pages, block_size, Hkv, D]` at the pages of each row's block table and attends over
//! those pages, and every gated DeltaNet layer continues each sequence's conv and recurrent
//! states in that sequence's slot of a state pool. The result is each row's last-position
//! logits.
//!
//! How attention reads the arena is the cache's [`PagedAttentionMode`], fixed when
//! [`CausalLm::new_batch_cache`](super::CausalLm::new_batch_cache) makes it from
//! `RUDA_PAGED_ATTENTION`: `legacy` gathers each sequence's pages into contiguous buffers
//! `[max_active, Hkv, max_sequence_length, D]` and runs the contiguous kernels; `fused` runs the
//! paged kernels over the pages in place.
//!
//! Before a batch runs, its prefix-cache edits apply (copy-on-write page copies, snapshots
//! restored into slots, released snapshots dropped); after it, rows that save a snapshot copy
//! their slot out. With `RUDA_CUDA_GRAPHS` on, a decode batch is padded to its bucket
//! ([`decode_bucket`]) and replays that bucket's graph from its second step on. See
//! `docs/batching.md`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use ruda_ops::api::paged_attention::{DevicePlan, HostPlan, PlanCapacity, SplitWorkspace};
use ruda_ops::api::{self, DecodeWorkspace};
use ruda_ops::paged_attention::mla::MLA_MAX_SPLITS;
use ruda_runtime::{Graph, GraphMode, PagedAttentionMode, Stream, Tensor};

use super::decoder::{Decoder, Mixer, Workspace};
use crate::batch::{BatchKind, PagedKvCacheConfig, PrefixCacheConfig, ScheduledBatch, SnapshotId};
use crate::cache::LinearStatePool;
use crate::error::LlmError;
use crate::layers::{AttentionShape, BatchRow, KvTarget, LinearBatch, PagedKv, PagedRead};

/// Workspaces kept per batch shape (rows, sequences), least recently used dropped first.
const WORKSPACES: usize = 8;

/// The device state of batched generation: per layer a paged KV arena or a linear-attention
/// state pool of `max_active` slots, and the buffers the batches run in. Rows name their
/// sequence's slot (`ScheduledSequence::slot`) and pages (`block_table`), as the scheduler
/// assigns them; the cache trusts that a row continuing a sequence (`start_position > 0`) has
/// that sequence's earlier positions in its pages and its states in its slot.
pub struct BatchCache {
    kv: PagedKvCacheConfig,
    max_active: usize,
    /// Pad rows a decode bucket may add: the arenas hold that many scratch pages past
    /// `kv.num_pages`, and the state pools that many scratch slots past `max_active`.
    scratch: usize,
    mode: PagedAttentionMode,
    layers: Vec<BatchLayer>,
    /// The attention layers' shape (one for all of them), `None` without attention layers.
    shape: Option<AttentionShape>,
    /// Legacy path: the gather buffers `[largest bucket, Hkv, max_sequence_length, D]` every
    /// attention layer fills in turn.
    gathered: Option<(Tensor, Tensor)>,
    /// The paged plan of the last batch, in buffers of its capacity (updated in place while a
    /// batch fits them).
    plan: Option<(DevicePlan, PlanCapacity)>,
    /// Legacy path: split-KV decode's workspace per batch size.
    decode: HashMap<usize, DecodeWorkspace>,
    /// Fused path: the key-split workspace of decode per batch size (none where one split
    /// suffices).
    splits: HashMap<usize, Option<SplitWorkspace>>,
    /// The most recently used last.
    workspaces: Vec<Workspace>,
    /// Saved linear-attention states (prefix caching of hybrid models): per snapshot, one
    /// slot's states of every linear-attention layer, in layer order.
    snapshots: HashMap<SnapshotId, Vec<SlotStates>>,
    /// Whether decode batches are padded to their bucket and replay captured graphs
    /// (`RUDA_CUDA_GRAPHS`).
    graphs: GraphMode,
    /// Per decode bucket: its buffers (kept for its graph, whose kernels read them) and graph.
    decode_graphs: HashMap<usize, DecodeGraph>,
    /// Why the cache can no longer be used (a failed step left its states half-written).
    broken: Option<String>,
}

/// A decode bucket's buffers and, once a step of that size ran eagerly (kernels compiled and
/// tuned), the graph captured from the next one.
struct DecodeGraph {
    workspace: Workspace,
    graph: Option<Graph>,
    eager_runs: usize,
}

/// The decode bucket of a batch of `rows` rows, the size its graph is captured at: 1, 2, 4, 8,
/// then multiples of 8. A smaller batch is padded up to it.
pub fn decode_bucket(rows: usize) -> usize {
    match rows {
        0..=2 => rows,
        3..=4 => 4,
        _ => rows.div_ceil(8) * 8,
    }
}

/// Rows a padded decode batch of at most `max_active` real rows may add (each pad row has a
/// scratch page and a scratch state slot of its own past the scheduler's).
fn most_pad_rows(max_active: usize) -> usize {
    (1..=max_active).map(|b| decode_bucket(b) - b).max().unwrap_or(0)
}

/// Qwen3.5's batch cache (its linear-attention layers keep one conv and recurrent state per
/// active sequence): the same type as every architecture's.
pub type Qwen35BatchCache = BatchCache;

enum BatchLayer {
    Paged { k: Tensor, v: Tensor },
    Linear(LinearStatePool),
}

/// One slot of a [`LinearStatePool`]: the three conv states `[1, C, W − 1]` and the recurrent
/// state `[1, Hv, K, V]`.
struct SlotStates(Vec<Tensor>);

impl SlotStates {
    /// Views of `slot` in `pool`.
    fn of(pool: &LinearStatePool, slot: usize) -> Result<SlotStates, LlmError> {
        let all = pool.conv.iter().chain([&pool.recurrent]);
        Ok(SlotStates(all.map(|t| t.narrow(0, slot, 1)).collect::<Result<_, _>>()?))
    }

    /// New device buffers shaped as `like`'s.
    fn empty_like(like: &SlotStates) -> Result<SlotStates, LlmError> {
        let empty = |t: &Tensor| Tensor::empty(t.device(), t.dtype(), t.shape());
        Ok(SlotStates(like.0.iter().map(empty).collect::<Result<_, _>>()?))
    }

    /// Copy `from` into `self` on `s` (device to device).
    fn copy_from(&self, s: &Stream, from: &SlotStates) -> Result<(), LlmError> {
        for (dst, src) in self.0.iter().zip(&from.0) {
            api::cast_into(s, src, dst).map_err(|e| LlmError::op("copying linear-attention states", e))?;
        }
        Ok(())
    }
}

impl BatchCache {
    pub fn kv_config(&self) -> PagedKvCacheConfig {
        self.kv
    }

    pub fn max_active(&self) -> usize {
        self.max_active
    }

    /// The attention path chosen when the cache was made.
    pub fn mode(&self) -> PagedAttentionMode {
        self.mode
    }

    /// Bytes of the KV arenas, the state pools and (legacy) the gather buffers.
    pub fn device_bytes(&self) -> u64 {
        let bytes = |t: &Tensor| (t.numel() * t.dtype().size()) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| match l {
                BatchLayer::Paged { k, v } => bytes(k) + bytes(v),
                BatchLayer::Linear(p) => p.conv.iter().map(bytes).sum::<u64>() + bytes(&p.recurrent),
            })
            .sum();
        layers + self.gathered.as_ref().map_or(0, |(k, v)| bytes(k) + bytes(v))
    }

    /// Bytes of one KV page across the attention layers (what a cached prefix page holds).
    pub fn page_bytes(&self) -> u64 {
        let page = |t: &Tensor| (t.numel() / t.shape()[0] * t.dtype().size()) as u64;
        let paged = self.layers.iter().filter_map(|l| match l {
            BatchLayer::Paged { k, v } => Some(page(k) + page(v)),
            BatchLayer::Linear(_) => None,
        });
        paged.sum()
    }

    /// Bytes of one sequence's linear-attention states across the layers (what a prefix
    /// snapshot holds; 0 without linear-attention layers).
    pub fn snapshot_bytes(&self) -> u64 {
        let slot = |t: &Tensor| (t.numel() / t.shape()[0] * t.dtype().size()) as u64;
        linear_pools(&self.layers).map(|p| p.conv.iter().map(slot).sum::<u64>() + slot(&p.recurrent)).sum()
    }

    /// The prefix cache bounds of `max_bytes` and `max_entries` for this cache's pages and
    /// snapshots (what [`crate::ContinuousBatchScheduler::with_prefix_cache`] takes).
    pub fn prefix_cache_config(&self, max_bytes: u64, max_entries: usize) -> PrefixCacheConfig {
        PrefixCacheConfig {
            max_bytes,
            max_entries,
            page_bytes: self.page_bytes(),
            snapshot_bytes: self.snapshot_bytes(),
        }
    }

    /// This cache with decode graphs switched on or off (made with `RUDA_CUDA_GRAPHS`'s value).
    pub fn with_graphs(mut self, graphs: GraphMode) -> BatchCache {
        self.graphs = graphs;
        self.decode_graphs.clear();
        self
    }

    /// Decode buckets with a captured graph, ascending.
    pub fn captured_decode_graphs(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> =
            self.decode_graphs.iter().filter(|(_, g)| g.graph.is_some()).map(|(&b, _)| b).collect();
        sizes.sort();
        sizes
    }

    /// Snapshots held now.
    pub fn snapshots(&self) -> usize {
        self.snapshots.len()
    }

    /// Whether a failed step broke the cache, and why.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// A workspace for `tokens` rows of `sequences` sequences, made on first use (the most
    /// recently used kept).
    fn workspace(&mut self, model: &Decoder, tokens: usize, sequences: usize) -> Result<&Workspace, LlmError> {
        let found = self.workspaces.iter().position(|w| w.shape() == (tokens, sequences));
        let w = match found {
            Some(i) => self.workspaces.remove(i),
            None => model.workspace(tokens, sequences)?,
        };
        if self.workspaces.len() >= WORKSPACES {
            self.workspaces.remove(0);
        }
        self.workspaces.push(w);
        self.workspaces.last().ok_or_else(|| LlmError::InvalidArgument("no workspace".into()))
    }
}

impl Decoder {
    pub(super) fn batch_cache(
        &self,
        kv: PagedKvCacheConfig,
        max_active: usize,
        mode: PagedAttentionMode,
        graphs: GraphMode,
    ) -> Result<BatchCache, LlmError> {
        let bad = |m: String| Err(LlmError::InvalidArgument(format!("batch cache: {m}")));
        let max_positions = self.spec.config.max_position_embeddings;
        if kv.block_size == 0 || kv.num_pages == 0 || kv.max_sequence_length == 0 || max_active == 0 {
            return bad(format!("block_size, num_pages, max_sequence_length and max_active must be positive ({kv:?}, max_active {max_active})"));
        }
        if kv.max_sequence_length > max_positions {
            return bad(format!(
                "max_sequence_length {} exceeds the model's {max_positions} positions",
                kv.max_sequence_length
            ));
        }
        if kv.num_pages.checked_mul(kv.block_size).is_none_or(|rows| u32::try_from(rows).is_err()) {
            return bad(format!("{} pages of {} positions exceed u32 rows", kv.num_pages, kv.block_size));
        }
        let (dev, dt) = (&self.device, self.dtype);
        let scratch = most_pad_rows(max_active);
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut shape = None;
        for layer in &self.layers {
            layers.push(match &layer.mixer {
                Mixer::Attention(a) => {
                    let AttentionShape { kv_heads, head_dim, .. } = a.shape();
                    shape.get_or_insert(a.shape());
                    let arena = [kv.num_pages + scratch, kv.block_size, kv_heads, head_dim];
                    BatchLayer::Paged { k: Tensor::zeros(dev, dt, &arena)?, v: Tensor::zeros(dev, dt, &arena)? }
                }
                Mixer::GatedDeltaNet(g) => BatchLayer::Linear(g.new_state_pool(dev, dt, max_active + scratch)?),
            });
        }
        let gathered = match (mode, shape) {
            (PagedAttentionMode::Legacy, Some(AttentionShape { kv_heads, head_dim, .. })) => {
                let s = [decode_bucket(max_active), kv_heads, kv.max_sequence_length, head_dim];
                Some((Tensor::zeros(dev, dt, &s)?, Tensor::zeros(dev, dt, &s)?))
            }
            _ => None,
        };
        Ok(BatchCache {
            kv,
            max_active,
            scratch,
            mode,
            layers,
            shape,
            gathered,
            plan: None,
            decode: HashMap::new(),
            splits: HashMap::new(),
            workspaces: Vec::new(),
            snapshots: HashMap::new(),
            graphs,
            decode_graphs: HashMap::new(),
            broken: None,
        })
    }

    /// Checks `batch` against the model and `cache`; returns its rows, its token ids and its
    /// paged plan, with `pad` rows added (token 0 at position 0, each in a scratch page and a
    /// scratch slot).
    fn batch_inputs(
        &self,
        batch: &ScheduledBatch,
        cache: &BatchCache,
        pad: usize,
    ) -> Result<(Vec<BatchRow>, Vec<u32>, HostPlan), LlmError> {
        let bad = |m: String| Err(LlmError::InvalidArgument(format!("batch {}: {m}", batch.id)));
        if batch.sequences.is_empty() {
            return bad("no rows".into());
        }
        let kv = cache.kv;
        for c in &batch.copies {
            if c.src as usize >= kv.num_pages || c.dst as usize >= kv.num_pages || c.src == c.dst {
                return bad(format!("page copy {} → {} (the pool has {} pages)", c.src, c.dst, kv.num_pages));
            }
        }
        for (i, r) in batch.sequences.iter().enumerate() {
            if let Some(id) = r.restore_snapshot.filter(|id| !cache.snapshots.contains_key(id)) {
                return bad(format!("row {i} restores snapshot {id:?}, which the cache does not hold"));
            }
            let saved_before = |id: &SnapshotId| batch.sequences[..i].iter().any(|o| o.save_snapshot == Some(*id));
            if let Some(id) = r.save_snapshot.filter(|id| cache.snapshots.contains_key(id) || saved_before(id)) {
                return bad(format!("row {i} saves snapshot {id:?}, which already exists"));
            }
        }
        let (mut rows, mut ids) = (Vec::with_capacity(batch.sequences.len()), Vec::new());
        let (mut sequence_ids, mut positions) = (Vec::new(), Vec::new());
        for (i, r) in batch.sequences.iter().enumerate() {
            let n = r.tokens.len();
            if n == 0 || (batch.kind == BatchKind::Decode && n != 1) {
                return bad(format!("row {i} ({}) has {n} tokens", r.request_id));
            }
            if r.context_length != r.start_position + n || r.context_length > kv.max_sequence_length {
                return bad(format!(
                    "row {i} ({}): {n} tokens from position {} to a context of {} (at most {})",
                    r.request_id, r.start_position, r.context_length, kv.max_sequence_length
                ));
            }
            if let Some(p) = r.block_table.iter().find(|&&p| p as usize >= kv.num_pages) {
                return bad(format!("row {i} ({}): page {p} is past the {} pages", r.request_id, kv.num_pages));
            }
            if r.slot >= cache.max_active || rows.iter().any(|b: &BatchRow| b.slot == r.slot) {
                return bad(format!(
                    "row {i} ({}): slot {} is past the {} slots or given twice",
                    r.request_id, r.slot, cache.max_active
                ));
            }
            ids.extend_from_slice(&r.tokens);
            sequence_ids.extend(std::iter::repeat_n(i as u32, n));
            positions.extend((r.start_position..r.context_length).map(|p| p as u32));
            rows.push(BatchRow { start: r.start_position, count: n, slot: r.slot });
        }
        if let Err(e) = self.check_ids(&ids) {
            return bad(e.to_string());
        }
        let mut tables: Vec<Vec<u32>> = batch.sequences.iter().map(|r| r.block_table.clone()).collect();
        let mut lengths = batch.context_lengths();
        for j in 0..pad {
            ids.push(0);
            sequence_ids.push(rows.len() as u32);
            positions.push(0);
            rows.push(BatchRow { start: 0, count: 1, slot: cache.max_active + j });
            tables.push(vec![(kv.num_pages + j) as u32]);
            lengths.push(1);
        }
        let pages = kv.num_pages + cache.scratch;
        let plan = HostPlan::new(kv.block_size, pages, &tables, &lengths, &sequence_ids, &positions)
            .map_err(|e| LlmError::op(format!("batch {}'s page tables", batch.id), e))?;
        Ok((rows, ids, plan))
    }

    /// See [`CausalLm::forward_batch`](super::CausalLm::forward_batch).
    pub(super) fn forward_batch(&self, batch: &ScheduledBatch, cache: &mut BatchCache) -> Result<Tensor, LlmError> {
        if let Some(why) = &cache.broken {
            return Err(LlmError::InvalidArgument(format!(
                "the batch cache is unusable after a failed step ({why}); make a new one with new_batch_cache"
            )));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(LlmError::InvalidArgument(format!(
                "the batch cache has {} layers, the model {}: it was made by another model",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        let decode = batch.kind == BatchKind::Decode;
        let real = batch.sequences.len();
        // With graphs, a decode batch runs at its bucket's size (padded), whose graph replays.
        let graphed = cache.graphs == GraphMode::On && decode;
        let pad = if graphed { decode_bucket(real) - real } else { 0 };
        let (rows, ids, host) = self.batch_inputs(batch, cache, pad)?;
        let (t, b) = (ids.len(), rows.len());
        let max_q = rows.iter().map(|r| r.count).max().unwrap_or(1);
        // Buffers first (allocations, no state changed yet).
        if let (Some(shape), true) = (cache.shape, decode) {
            let AttentionShape { q_heads, kv_heads, head_dim } = shape;
            let splits = api::decode_splits(b, q_heads, kv_heads, head_dim, cache.kv.max_sequence_length);
            let q = || Tensor::zeros(&self.device, self.dtype, &[b, q_heads, head_dim]);
            let op = |e| LlmError::op("decode attention workspace", e);
            match cache.mode {
                PagedAttentionMode::Legacy if !cache.decode.contains_key(&b) => {
                    cache.decode.insert(b, DecodeWorkspace::new(&q()?, splits).map_err(op)?);
                }
                PagedAttentionMode::Fused if !cache.splits.contains_key(&b) => {
                    let ws = match splits {
                        1 => None,
                        _ => Some(
                            SplitWorkspace::new(&q()?, b, q_heads, head_dim, splits.min(MLA_MAX_SPLITS)).map_err(op)?,
                        ),
                    };
                    cache.splits.insert(b, ws);
                }
                _ => {}
            }
        }
        let pages_per_sequence = cache.kv.max_sequence_length.div_ceil(cache.kv.block_size);
        let probe = if graphed {
            let graph = match cache.decode_graphs.entry(b) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    e.insert(DecodeGraph { workspace: self.workspace(t, b)?, graph: None, eager_runs: 0 })
                }
            };
            graph.workspace.ids().clone()
        } else {
            cache.workspace(self, t, b)?.ids().clone()
        };
        match &mut cache.plan {
            Some((plan, cap)) if cap.queries >= t && cap.sequences >= b => {
                plan.update(&host).map_err(|e| LlmError::op("updating the paged plan", e))?
            }
            slot => {
                // New buffers: graphs captured over the old ones are stale.
                for g in cache.decode_graphs.values_mut() {
                    g.graph = None;
                }
                let largest = decode_bucket(cache.max_active);
                let cap = PlanCapacity {
                    queries: t.next_power_of_two().max(16).max(largest),
                    sequences: largest,
                    pages_per_sequence,
                };
                let plan = DevicePlan::upload_with_capacity(&host, &probe, cap)
                    .map_err(|e| LlmError::op("uploading the paged plan", e))?;
                *slot = Some((plan, cap));
            }
        }
        // From here the step writes the caches: a failure leaves them half-written.
        let result = self.run_batch(batch, cache, &rows, &ids, max_q, graphed);
        if let Err(e) = &result {
            cache.broken = Some(e.to_string());
        }
        // The pad rows' logits are not the caller's.
        Ok(result?.narrow(0, 0, real)?)
    }

    /// The device half of [`Decoder::forward_batch`]: prefix edits, inputs, then the kernels, or
    /// for a decode bucket with graphs on, its graph (captured from its second step).
    fn run_batch(
        &self,
        batch: &ScheduledBatch,
        cache: &mut BatchCache,
        rows: &[BatchRow],
        ids: &[u32],
        max_q: usize,
        graphed: bool,
    ) -> Result<Tensor, LlmError> {
        let (t, b) = (ids.len(), rows.len());
        let s = self.device.default_stream();
        self.apply_prefix_edits(&s, batch, cache)?;
        let pinned = cache.decode_graphs.get(&b).filter(|_| graphed);
        let w = match pinned {
            Some(g) => &g.workspace,
            None => cache
                .workspaces
                .iter()
                .rev()
                .find(|w| w.shape() == (t, b))
                .ok_or_else(|| LlmError::InvalidArgument("no workspace for the batch".into()))?,
        };
        w.write_inputs(ids, rows)?;
        let kernels = || self.batch_kernels(batch, cache, w, rows, max_q);
        let (logits, captured) = match pinned {
            Some(DecodeGraph { graph: Some(graph), .. }) => {
                graph.launch(&s)?;
                (w.logits().clone(), None)
            }
            Some(DecodeGraph { graph: None, eager_runs, .. }) if *eager_runs > 0 => {
                s.begin_capture()?;
                let recorded = kernels();
                let graph = s.end_capture();
                let (logits, graph) = (recorded?, graph?);
                // Capturing ran nothing: this step runs now.
                graph.launch(&s)?;
                (logits, Some(graph))
            }
            _ => (kernels()?, None),
        };
        if let Some(g) = cache.decode_graphs.get_mut(&b).filter(|_| graphed) {
            g.eager_runs += usize::from(g.graph.is_none() && captured.is_none());
            if captured.is_some() {
                g.graph = captured;
            }
        }
        self.save_snapshots(&s, batch, cache)?;
        Ok(logits)
    }

    /// The kernels of a batch whose inputs are in `w` (no host copy, no allocation: what a
    /// decode graph captures).
    fn batch_kernels(
        &self,
        batch: &ScheduledBatch,
        cache: &BatchCache,
        w: &Workspace,
        rows: &[BatchRow],
        max_q: usize,
    ) -> Result<Tensor, LlmError> {
        let b = rows.len();
        let (plan, _) = cache.plan.as_ref().ok_or_else(|| LlmError::InvalidArgument("no paged plan".into()))?;
        let cu_seqlens: Vec<u32> = std::iter::once(0)
            .chain(rows.iter().scan(0u32, |acc, r| {
                *acc += r.count as u32;
                Some(*acc)
            }))
            .collect();
        let slots: Vec<u32> = rows.iter().map(|r| r.slot as u32).collect();
        // Pad rows (past the batch's) are never fresh: a decode step zeroes no slot.
        let fresh: Vec<bool> = (0..b).map(|i| batch.sequences.get(i).is_some_and(|r| r.start_position == 0)).collect();
        let decode = cache.decode.get(&b).filter(|_| batch.kind == BatchKind::Decode);
        let split = cache.splits.get(&b).filter(|_| batch.kind == BatchKind::Decode);
        self.run_layers(w, |l, s, x, out| match (&self.layers[l].mixer, &cache.layers[l]) {
            (Mixer::Attention(a), BatchLayer::Paged { k, v }) => {
                let scratch = w.attention()?;
                let read = match &cache.gathered {
                    Some((gk, gv)) => PagedRead::Gather { k: gk, v: gv, decode, max_q },
                    None => PagedRead::Fused { split: split.and_then(Option::as_ref) },
                };
                let kv = KvTarget::Paged(PagedKv { plan, k_cache: k, v_cache: v, read });
                a.forward(s, w.plan(), &self.rope, w.step(), x, kv, scratch, out)
            }
            (Mixer::GatedDeltaNet(g), BatchLayer::Linear(pool)) => {
                let linear = LinearBatch {
                    cu_seqlens: w.step().cu_seqlens(),
                    cu_seqlens_host: &cu_seqlens,
                    slots: w.step().sequence_slots(),
                    slots_host: &slots,
                    fresh: &fresh,
                };
                g.forward(s, w.plan(), x, &linear, pool, w.linear()?, out)
            }
            _ => Err(LlmError::InvalidArgument(format!(
                "layer {l}: the batch cache holds another kind of state: it was made by another model"
            ))),
        })?;
        self.last_row_logits(w)
    }

    /// Before a batch: drop the released snapshots, copy the copy-on-write pages in every
    /// attention layer, and load restored snapshots into their rows' slots.
    fn apply_prefix_edits(&self, s: &Stream, batch: &ScheduledBatch, cache: &mut BatchCache) -> Result<(), LlmError> {
        for id in &batch.released_snapshots {
            cache.snapshots.remove(id);
        }
        for c in &batch.copies {
            for layer in &cache.layers {
                if let BatchLayer::Paged { k, v } = layer {
                    for t in [k, v] {
                        let (src, dst) = (t.narrow(0, c.src as usize, 1)?, t.narrow(0, c.dst as usize, 1)?);
                        api::cast_into(s, &src, &dst)
                            .map_err(|e| LlmError::op("copying a KV page (copy-on-write)", e))?;
                    }
                }
            }
        }
        for r in &batch.sequences {
            let Some(id) = r.restore_snapshot else { continue };
            let saved =
                cache.snapshots.get(&id).ok_or_else(|| LlmError::InvalidArgument(format!("no snapshot {id:?}")))?;
            for (pool, states) in linear_pools(&cache.layers).zip(saved) {
                SlotStates::of(pool, r.slot)?.copy_from(s, states)?;
            }
        }
        Ok(())
    }

    /// After a batch: copy the states of rows that save a snapshot out of their slots (into new
    /// device buffers: saving allocates).
    fn save_snapshots(&self, s: &Stream, batch: &ScheduledBatch, cache: &mut BatchCache) -> Result<(), LlmError> {
        for r in &batch.sequences {
            let Some(id) = r.save_snapshot else { continue };
            let mut saved = Vec::new();
            for pool in linear_pools(&cache.layers) {
                let slot = SlotStates::of(pool, r.slot)?;
                let copy = SlotStates::empty_like(&slot)?;
                copy.copy_from(s, &slot)?;
                saved.push(copy);
            }
            cache.snapshots.insert(id, saved);
        }
        Ok(())
    }
}

/// The linear-attention layers' state pools, in layer order.
fn linear_pools(layers: &[BatchLayer]) -> impl Iterator<Item = &LinearStatePool> {
    layers.iter().filter_map(|l| match l {
        BatchLayer::Linear(pool) => Some(pool),
        BatchLayer::Paged { .. } => None,
    })
}

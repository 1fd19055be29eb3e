//! The paged KV cache's plan (block tables, lengths, each query's sequence and position) on the
//! host and on the device, and its data movement: `append` and `gather_into`.

use std::collections::HashMap;

use ruda_runtime::{LaunchConfig, Stream, Tensor};

pub use super::attention::SplitWorkspace;
use super::attention_kernel::PAGED_QUERIES_PER_BLOCK;
use super::kernel::{PagedAppendParams, PagedCopyConfig, PagedGatherParams, PAGED_COPY_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// The error of every paged attention entry point.
pub type PagedAttentionError = OpError;

pub(crate) const OP: &str = "paged_attention";

pub(crate) fn invalid(message: String) -> OpError {
    OpError::InvalidArgument { op: OP, message }
}

/// One step's paged KV layout, checked on the host: the KV cache is `pages` pages of `page_size`
/// positions; sequence `s` holds its positions `0..lengths[s]` in the pages `tables[s]` (position
/// `t` at page `tables[s][t / page_size]`, slot `t % page_size`); query `i` belongs to sequence
/// `sequence_ids[i]` at absolute position `positions[i]`, where `append` writes its key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPlan {
    page_size: usize,
    pages: usize,
    tables: Vec<Vec<u32>>,
    lengths: Vec<u32>,
    sequence_ids: Vec<u32>,
    positions: Vec<u32>,
    /// Each query's cache row `page * page_size + slot`.
    slots: Vec<u32>,
    /// The fused attention's query blocks: `(first query, queries, largest position + 1)` for
    /// each run of at most [`PAGED_QUERIES_PER_BLOCK`] consecutive queries of one sequence.
    blocks: Vec<u32>,
}

impl HostPlan {
    /// One block table and one KV length (after this step's append) per sequence; one sequence
    /// id and one absolute zero-based position per query (position < length of its sequence).
    /// Sequences may share pages (a shared prefix), but no two queries may write one (page, slot).
    pub fn new(
        page_size: usize,
        pages: usize,
        tables: &[Vec<u32>],
        lengths: &[u32],
        sequence_ids: &[u32],
        positions: &[u32],
    ) -> std::result::Result<HostPlan, PagedAttentionError> {
        if page_size == 0 || pages == 0 {
            return Err(invalid(format!("page_size ({page_size}) and pages ({pages}) must be positive")));
        }
        if pages.checked_mul(page_size).is_none_or(|rows| u32::try_from(rows).is_err()) {
            return Err(invalid(format!("{pages} pages of {page_size} positions exceed u32 rows")));
        }
        if tables.len() != lengths.len() {
            return Err(invalid(format!(
                "{} block tables for {} lengths (one each per sequence)",
                tables.len(),
                lengths.len()
            )));
        }
        if tables.is_empty() {
            return Err(invalid("no sequences".into()));
        }
        if sequence_ids.len() != positions.len() {
            return Err(invalid(format!(
                "{} sequence ids for {} positions (one each per query)",
                sequence_ids.len(),
                positions.len()
            )));
        }
        if sequence_ids.is_empty() {
            return Err(invalid("no queries".into()));
        }
        for (s, (table, &len)) in tables.iter().zip(lengths).enumerate() {
            if let Some((i, &p)) = table.iter().enumerate().find(|&(_, &p)| p as usize >= pages) {
                return Err(invalid(format!(
                    "block table of sequence {s}: entry {i} is page {p}, past the {pages} pages"
                )));
            }
            let needed = (len as usize).div_ceil(page_size);
            if table.len() < needed {
                return Err(invalid(format!(
                    "block table of sequence {s} has {} pages; its length {len} needs {needed} of {page_size} positions",
                    table.len()
                )));
            }
        }
        let mut slots = Vec::with_capacity(positions.len());
        let mut writers: HashMap<u32, usize> = HashMap::new();
        for (i, (&s, &pos)) in sequence_ids.iter().zip(positions).enumerate() {
            let Some(&len) = lengths.get(s as usize) else {
                return Err(invalid(format!("query {i}: sequence id {s} is past the {} sequences", lengths.len())));
            };
            if pos >= len {
                return Err(invalid(format!(
                    "query {i}: position {pos} is not below the length {len} of sequence {s}"
                )));
            }
            let (page_index, offset) = (pos as usize / page_size, pos as usize % page_size);
            let page = tables[s as usize][page_index];
            let slot = (page as usize * page_size + offset) as u32;
            if let Some(first) = writers.insert(slot, i) {
                return Err(invalid(format!(
                    "queries {first} and {i} both write page {page}, slot {offset} (query {i}: sequence {s}, position {pos})"
                )));
            }
            slots.push(slot);
        }
        let blocks = query_blocks(sequence_ids, positions);
        Ok(HostPlan {
            page_size,
            pages,
            tables: tables.to_vec(),
            lengths: lengths.to_vec(),
            sequence_ids: sequence_ids.to_vec(),
            positions: positions.to_vec(),
            slots,
            blocks,
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn queries(&self) -> usize {
        self.sequence_ids.len()
    }

    pub fn sequences(&self) -> usize {
        self.lengths.len()
    }

    /// The longest block table.
    pub fn max_pages_per_sequence(&self) -> usize {
        self.tables.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The longest sequence.
    pub fn max_length(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0) as usize
    }

    /// The fused attention's query blocks (runs of at most [`PAGED_QUERIES_PER_BLOCK`]
    /// consecutive queries of one sequence).
    pub fn query_blocks(&self) -> usize {
        self.blocks.len() / 3
    }

    /// The most queries of one query block.
    fn max_block_queries(&self) -> usize {
        self.blocks.chunks(3).map(|b| b[1] as usize).max().unwrap_or(0)
    }
}

/// `(first query, queries, largest position + 1)` for each run of at most
/// [`PAGED_QUERIES_PER_BLOCK`] consecutive queries of one sequence.
fn query_blocks(sequence_ids: &[u32], positions: &[u32]) -> Vec<u32> {
    let mut blocks: Vec<u32> = Vec::new();
    for (i, (&s, &pos)) in sequence_ids.iter().zip(positions).enumerate() {
        let n = blocks.len();
        let joins =
            n >= 3 && sequence_ids[blocks[n - 3] as usize] == s && (blocks[n - 2] as usize) < PAGED_QUERIES_PER_BLOCK;
        if joins {
            blocks[n - 2] += 1;
            blocks[n - 1] = blocks[n - 1].max(pos + 1);
        } else {
            blocks.extend([i as u32, 1, pos + 1]);
        }
    }
    blocks
}

/// The sizes a [`DevicePlan`]'s buffers are allocated for, so later steps' plans can be
/// [`update`](DevicePlan::update)d into them (no allocation: graph capture, steady decode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanCapacity {
    pub queries: usize,
    pub sequences: usize,
    pub pages_per_sequence: usize,
}

/// A [`HostPlan`] on the device: `u32` tables `[sequences, pages_per_sequence]` (capacity; rows
/// padded with page 0), lengths `[sequences]` (0 past the plan's sequences), and per query
/// (capacity) its sequence id, position and cache row, and the fused attention's query blocks
/// (`3 ×` the queries capacity). Fields are shared with the attention kernels of this module.
pub struct DevicePlan {
    pub(crate) page_size: usize,
    pub(crate) pages: usize,
    pub(crate) queries: usize,
    pub(crate) sequences: usize,
    pub(crate) max_length: usize,
    pub(crate) query_blocks: usize,
    pub(crate) max_block_queries: usize,
    pub(crate) capacity: PlanCapacity,
    pub(crate) tables: Tensor,
    pub(crate) lengths: Tensor,
    pub(crate) sequence_ids: Tensor,
    pub(crate) positions: Tensor,
    pub(crate) slots: Tensor,
    pub(crate) blocks: Tensor,
}

/// `xs` padded with zeros to `n`.
fn padded(xs: &[u32], n: usize) -> Vec<u32> {
    let mut v = xs.to_vec();
    v.resize(n, 0);
    v
}

/// The host arrays of `host` at `cap`: tables, lengths, sequence ids, positions, slots, query
/// blocks.
fn host_arrays(host: &HostPlan, cap: PlanCapacity) -> [Vec<u32>; 6] {
    let mut tables = vec![0u32; cap.sequences * cap.pages_per_sequence];
    for (s, t) in host.tables.iter().enumerate() {
        tables[s * cap.pages_per_sequence..][..t.len()].copy_from_slice(t);
    }
    [
        tables,
        padded(&host.lengths, cap.sequences),
        padded(&host.sequence_ids, cap.queries),
        padded(&host.positions, cap.queries),
        padded(&host.slots, cap.queries),
        padded(&host.blocks, 3 * cap.queries),
    ]
}

fn check_fits(host: &HostPlan, cap: PlanCapacity) -> Result<()> {
    let sizes = [
        ("queries", host.queries(), cap.queries),
        ("sequences", host.sequences(), cap.sequences),
        ("pages per sequence", host.max_pages_per_sequence(), cap.pages_per_sequence),
    ];
    for (what, n, c) in sizes {
        if c == 0 {
            return Err(invalid(format!("the plan capacity's {what} must be positive")));
        }
        if n > c {
            return Err(invalid(format!("the plan has {n} {what}, past the capacity of {c}")));
        }
    }
    Ok(())
}

impl DevicePlan {
    /// `host` on `q`'s device, its buffers of exactly the plan's sizes.
    pub fn upload(host: &HostPlan, q: &Tensor) -> Result<DevicePlan> {
        let cap = PlanCapacity {
            queries: host.queries(),
            sequences: host.sequences(),
            pages_per_sequence: host.max_pages_per_sequence().max(1),
        };
        Self::upload_with_capacity(host, q, cap)
    }

    /// `host` on `q`'s device, in buffers sized for `cap` (which must hold it).
    pub fn upload_with_capacity(host: &HostPlan, q: &Tensor, cap: PlanCapacity) -> Result<DevicePlan> {
        check_fits(host, cap)?;
        let stream = q.buffer().stream();
        let [tables, lengths, sequence_ids, positions, slots, blocks] = host_arrays(host, cap);
        let up = |xs: &[u32], shape: &[usize]| Tensor::from_slice_on(&stream, xs, shape);
        Ok(DevicePlan {
            page_size: host.page_size,
            pages: host.pages,
            queries: host.queries(),
            sequences: host.sequences(),
            max_length: host.max_length(),
            query_blocks: host.query_blocks(),
            max_block_queries: host.max_block_queries(),
            capacity: cap,
            tables: up(&tables, &[cap.sequences, cap.pages_per_sequence])?,
            lengths: up(&lengths, &[cap.sequences])?,
            sequence_ids: up(&sequence_ids, &[cap.queries])?,
            positions: up(&positions, &[cap.queries])?,
            slots: up(&slots, &[cap.queries])?,
            blocks: up(&blocks, &[3 * cap.queries])?,
        })
    }

    /// Replace the plan by `host` in the same buffers (host-to-device copies only, on the
    /// buffers' stream). `host` must have this plan's page size and page count and fit its
    /// capacity.
    pub fn update(&mut self, host: &HostPlan) -> Result<()> {
        if host.page_size != self.page_size || host.pages != self.pages {
            return Err(invalid(format!(
                "update: the plan has {} pages of {} positions, the new one {} of {}",
                self.pages, self.page_size, host.pages, host.page_size
            )));
        }
        check_fits(host, self.capacity)?;
        let arrays = host_arrays(host, self.capacity);
        let tensors = [&self.tables, &self.lengths, &self.sequence_ids, &self.positions, &self.slots, &self.blocks];
        for (t, xs) in tensors.into_iter().zip(&arrays) {
            t.copy_from_slice(xs)?;
        }
        self.queries = host.queries();
        self.sequences = host.sequences();
        self.max_length = host.max_length();
        self.query_blocks = host.query_blocks();
        self.max_block_queries = host.max_block_queries();
        Ok(())
    }

    /// `u32 [sequences capacity]`: each sequence's length (0 past the plan's sequences), the
    /// legacy path's `seq_lens`.
    pub fn lengths(&self) -> &Tensor {
        &self.lengths
    }

    /// Checks a cache `[pages, page_size, Hkv, dim]` and returns `(Hkv, dim)`.
    pub(crate) fn cache_dims(&self, name: &str, cache: &Tensor) -> Result<(usize, usize)> {
        contiguous_nonempty(OP, name, cache)?;
        float_dtype(OP, cache)?;
        let s = cache.shape();
        if s.len() != 4 || s[0] != self.pages || s[1] != self.page_size {
            return Err(OpError::Shape {
                op: OP,
                message: format!(
                    "`{name}` must be [pages = {}, page_size = {}, kv heads, head dim], is {s:?}",
                    self.pages, self.page_size
                ),
            });
        }
        if (self.pages * self.page_size).checked_mul(s[2]).is_none_or(|n| u32::try_from(n).is_err()) {
            return Err(invalid(format!("`{name}` of shape {s:?} has more rows than fit u32")));
        }
        Ok((s[2], s[3]))
    }

    /// Writes `k` `[queries, Hkv, D]` and `v` `[queries, Hkv, Dv]` at each query's (page, slot)
    /// of `key_cache` `[pages, page_size, Hkv, D]` and `value_cache` `[pages, page_size, Hkv, Dv]`,
    /// in place on `stream`: no allocation, no synchronisation.
    pub fn append_into(
        &self,
        stream: &Stream,
        k: &Tensor,
        v: &Tensor,
        key_cache: &Tensor,
        value_cache: &Tensor,
    ) -> Result<()> {
        let (heads, dim) = self.cache_dims("key_cache", key_cache)?;
        let (value_heads, value_dim) = self.cache_dims("value_cache", value_cache)?;
        if value_heads != heads {
            return Err(OpError::Shape {
                op: OP,
                message: format!("`key_cache` has {heads} kv heads, `value_cache` {value_heads}"),
            });
        }
        if key_cache.buffer().same_memory(value_cache.buffer()) {
            return Err(invalid("`key_cache` and `value_cache` share one allocation".into()));
        }
        let dtype = float_dtype(OP, key_cache)?;
        for (name, t, d) in [("k", k, dim), ("v", v, value_dim)] {
            contiguous_nonempty(OP, name, t)?;
            expect_dtype(OP, name, t, key_cache.dtype())?;
            expect_shape(OP, name, t, &[self.queries, heads, d])?;
        }
        expect_dtype(OP, "value_cache", value_cache, key_cache.dtype())?;
        same_device(
            OP,
            stream,
            &[("k", k), ("v", v), ("key_cache", key_cache), ("value_cache", value_cache), ("plan", &self.slots)],
        )?;
        let cfg = PagedCopyConfig { dtype };
        let kernel = kernel(cfg.append_id(), || crate::kernels::paged_attention::paged_append(&cfg))?;
        let args = PagedAppendParams {
            slots: &self.slots,
            k,
            v,
            key_cache,
            value_cache,
            heads: to_u32(OP, "kv heads", heads)?,
            dim: to_u32(OP, "head dim", dim)?,
            value_dim: to_u32(OP, "value head dim", value_dim)?,
        };
        let grid = LaunchConfig {
            grid: [to_u32(OP, "queries", self.queries)?, grid_y(heads)?, 1],
            block: [PAGED_COPY_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        params::launch(stream, &kernel, grid, &args.args())?;
        Ok(())
    }

    /// [`append_into`](Self::append_into) on the caches' default stream, returning them. A cache
    /// whose allocation another live handle shares is copied first, so that handle never sees
    /// the write.
    pub fn append(&self, k: &Tensor, v: &Tensor, key_cache: Tensor, value_cache: Tensor) -> Result<(Tensor, Tensor)> {
        let own = |t: Tensor| -> Result<Tensor> {
            if t.buffer().is_shared() {
                crate::api::cast(&t, t.dtype())
            } else {
                Ok(t)
            }
        };
        let (key_cache, value_cache) = (own(key_cache)?, own(value_cache)?);
        self.append_into(&key_cache.device().default_stream(), k, v, &key_cache, &value_cache)?;
        Ok((key_cache, value_cache))
    }

    /// Legacy path: sequence `s`'s first `lengths[s]` positions copied from `cache`
    /// `[pages, page_size, Hkv, D]` into `out` `[B, Hkv, S_max, D]` (`B` at least the plan's
    /// sequences, `S_max` at least its longest length; positions past a length are left alone),
    /// the contiguous layout `attention_prefill_cache_into` and `attention_decode_into` read.
    pub fn gather_into(&self, stream: &Stream, cache: &Tensor, out: &Tensor) -> Result<()> {
        let (heads, dim) = self.cache_dims("cache", cache)?;
        contiguous_nonempty(OP, "out", out)?;
        expect_dtype(OP, "out", out, cache.dtype())?;
        let s = out.shape();
        if s.len() != 4 || s[0] < self.sequences || s[1] != heads || s[2] < self.max_length || s[3] != dim {
            return Err(OpError::Shape {
                op: OP,
                message: format!(
                    "`out` must be [at least {} sequences, {heads} kv heads, at least {} positions, {dim}], is {s:?}",
                    self.sequences, self.max_length
                ),
            });
        }
        if u32::try_from(out.numel() / dim).is_err() {
            return Err(invalid(format!("`out` of shape {s:?} has more rows than fit u32")));
        }
        same_device(OP, stream, &[("cache", cache), ("out", out), ("plan", &self.tables)])?;
        if self.max_length == 0 {
            return Ok(());
        }
        let dtype = float_dtype(OP, cache)?;
        let cfg = PagedCopyConfig { dtype };
        let kernel = kernel(cfg.gather_id(), || crate::kernels::paged_attention::paged_gather(&cfg))?;
        let args = PagedGatherParams {
            tables: &self.tables,
            lengths: &self.lengths,
            cache,
            out,
            page_size: to_u32(OP, "page size", self.page_size)?,
            table_width: to_u32(OP, "table width", self.capacity.pages_per_sequence)?,
            heads: to_u32(OP, "kv heads", heads)?,
            dim: to_u32(OP, "head dim", dim)?,
            max_length: to_u32(OP, "out positions", s[2])?,
        };
        // One block per position of `out`, not of the plan's longest length: the launch then
        // depends on no host value that changes from step to step (a captured decode step
        // stays valid as sequences grow); blocks past a sequence's length do nothing.
        let grid = LaunchConfig {
            grid: [to_u32(OP, "out positions", s[2])?, grid_y(self.sequences * heads)?, 1],
            block: [PAGED_COPY_THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        params::launch(stream, &kernel, grid, &args.args())?;
        Ok(())
    }
}

/// A grid's y extent (CUDA allows 65535).
pub(crate) fn grid_y(n: usize) -> Result<u32> {
    if n > 65535 {
        return Err(invalid(format!("{n} blocks along the grid's y (at most 65535: sequences × kv heads)")));
    }
    Ok(n as u32)
}

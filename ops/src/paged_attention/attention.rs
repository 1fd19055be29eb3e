//! Fused paged attention: packed variable-length prefill and decode reading the physical pages
//! of a paged KV cache directly. Query `i` (sequence `sequence_ids[i]`, position
//! `positions[i]`) attends the keys `[0, lengths[seq])` of its sequence, causal: `[0, min(len,
//! position + 1))`; query head `h` reads kv head `h / (Hq / Hkv)` (GQA). A query without keys
//! outputs zeros.
//!
//! One block per (split, kv head and row chunk, query block). A plan's query blocks are runs of
//! at most [`PAGED_QUERIES_PER_BLOCK`] consecutive queries of one sequence (decode: one query
//! each); a block's rows are (query, head) pairs of one query block that share one kv head, up
//! to [`PAGED_MAX_ROWS_PER_BLOCK`] (fewer as `Dv` grows: a 6144-element f32 accumulator), so
//! each key and value tile, staged once in shared memory as f32, serves queries × GQA group
//! rows: decode reads each K/V page once per GQA group (while the group fits one block). Rows of
//! one block may end at different keys (causal prefill): a key past a row's end scores -inf.
//! Scores are warp dot products; the online softmax is in the log2 domain with f32 statistics
//! and accumulators. The split form writes per (query, head, split) accumulators and
//! `(max, sum)` to an f32 workspace in paged MLA's layout, merged by `paged_mla_combine`.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::api::{invalid, DevicePlan, OP};
pub use super::attention_kernel::*;
use super::mla::{mla_combine, mla_workspace_len, MlaCombineParams, PagedMlaConfig, MLA_MAX_SPLITS, MLA_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Most bytes of a [`SplitWorkspace`].
pub const SPLIT_WORKSPACE_MAX_BYTES: usize = 64 << 20;

fn shape_error(message: String) -> OpError {
    OpError::Shape { op: OP, message }
}

/// An f32 workspace for split paged attention or MLA: per (query, head, split) an accumulator of
/// `value_dim` elements and a `(max, sum)` pair, for `queries` queries of `heads` heads and
/// 2..=32 `splits`, at most [`SPLIT_WORKSPACE_MAX_BYTES`]. It lives on the stream of the `q` it
/// was made for and serves only calls of exactly its sizes on that stream.
pub struct SplitWorkspace {
    tensor: Tensor,
    stream: Stream,
    queries: usize,
    heads: usize,
    value_dim: usize,
    splits: usize,
}

impl SplitWorkspace {
    /// A workspace on `q`'s device and stream for `queries` queries of `heads` heads, a value
    /// dim (attention's `Dv`, MLA's `R`) of `value_dim` and `splits` splits of the keys.
    pub fn new(q: &Tensor, queries: usize, heads: usize, value_dim: usize, splits: usize) -> Result<SplitWorkspace> {
        if !(2..=MLA_MAX_SPLITS).contains(&splits) {
            return Err(invalid(format!("splits ({splits}) must be in 2..={MLA_MAX_SPLITS}")));
        }
        if queries == 0 || heads == 0 || value_dim == 0 {
            return Err(shape_error(format!(
                "a split workspace needs positive sizes, got {queries} queries, {heads} heads, value dim {value_dim}"
            )));
        }
        let len =
            queries.checked_mul(heads).and_then(|n| n.checked_mul(splits)).and_then(|n| n.checked_mul(value_dim + 2));
        let Some(len) = len.filter(|n| n.checked_mul(4).is_some_and(|b| b <= SPLIT_WORKSPACE_MAX_BYTES)) else {
            let bytes = queries as u128 * heads as u128 * splits as u128 * (value_dim as u128 + 2) * 4;
            return Err(invalid(format!(
                "a split workspace for {queries} queries, {heads} heads, value dim {value_dim} and {splits} splits \
                 needs {bytes} bytes, past the limit of {SPLIT_WORKSPACE_MAX_BYTES} (64 MiB)"
            )));
        };
        let stream = q.buffer().stream();
        let tensor = Tensor::empty_on(&stream, DType::F32, &[len])?;
        Ok(SplitWorkspace { tensor, stream, queries, heads, value_dim, splits })
    }

    /// The f32 buffer (`mla_workspace_len(queries, heads, value_dim, splits)` elements).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The stream it was made on (that of its `q`).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn queries(&self) -> usize {
        self.queries
    }

    pub fn heads(&self) -> usize {
        self.heads
    }

    pub fn value_dim(&self) -> usize {
        self.value_dim
    }

    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The buffer and split count for a call of these sizes on `stream`.
    pub(crate) fn check(
        &self,
        stream: &Stream,
        queries: usize,
        heads: usize,
        value_dim: usize,
    ) -> Result<(&Tensor, usize)> {
        if (self.queries, self.heads, self.value_dim) != (queries, heads, value_dim) {
            return Err(shape_error(format!(
                "the split workspace was made for {} queries, {} heads and value dim {}; this call has {queries}, \
                 {heads} and {value_dim}",
                self.queries, self.heads, self.value_dim
            )));
        }
        if !stream.same_stream(&self.stream) {
            return Err(invalid(format!(
                "the split workspace was made on {:?}, the call runs on {stream:?}: a workspace serves one stream",
                self.stream
            )));
        }
        Ok((&self.tensor, self.splits))
    }
}

/// The validated sizes of one call.
struct Dims {
    queries: usize,
    q_heads: usize,
    kv_heads: usize,
    dim: usize,
    value_dim: usize,
}

impl DevicePlan {
    fn attention_dims(
        &self,
        stream: &Stream,
        [q, k_cache, v_cache]: [&Tensor; 3],
        scale: f32,
        out: &Tensor,
    ) -> Result<Dims> {
        float_dtype(OP, q)?;
        let named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)];
        for (n, t) in named {
            contiguous_nonempty(OP, n, t)?;
            expect_dtype(OP, n, t, q.dtype())?;
            to_u32(OP, &format!("elements of `{n}`"), t.numel())?;
        }
        if q.rank() != 3 {
            return Err(shape_error(format!("`q` must be [queries, q heads, head dim], is {:?}", q.shape())));
        }
        let (queries, q_heads, dim) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        if queries != self.queries {
            return Err(shape_error(format!("`q` has {queries} queries, the plan {}", self.queries)));
        }
        let (kv_heads, k_dim) = self.cache_dims("k_cache", k_cache)?;
        let (v_heads, value_dim) = self.cache_dims("v_cache", v_cache)?;
        if v_heads != kv_heads {
            return Err(shape_error(format!("`k_cache` has {kv_heads} kv heads, `v_cache` {v_heads}")));
        }
        if k_dim != dim {
            return Err(shape_error(format!("`q` has head dim {dim}, `k_cache` {k_dim}")));
        }
        if !q_heads.is_multiple_of(kv_heads) {
            return Err(shape_error(format!(
                "the query heads of `q` ({q_heads}) must be a multiple of the kv heads of `k_cache` ({kv_heads})"
            )));
        }
        for (what, n) in [("head dim D", dim), ("value head dim Dv", value_dim)] {
            if !(1..=PAGED_ATTENTION_MAX_DIM).contains(&n) {
                return Err(shape_error(format!("the {what} ({n}) must be in 1..={PAGED_ATTENTION_MAX_DIM}")));
            }
        }
        if !(scale.is_finite() && scale > 0.0) {
            return Err(invalid(format!("scale must be finite and positive, is {scale}")));
        }
        expect_shape(OP, "out", out, &[queries, q_heads, value_dim])?;
        same_device(OP, stream, &named)?;
        same_device(OP, stream, &[("plan", &self.blocks)])?;
        if k_cache.buffer().same_memory(v_cache.buffer()) {
            return Err(invalid("`k_cache` and `v_cache` share one allocation".into()));
        }
        for (n, t) in [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)] {
            if out.buffer().same_memory(t.buffer()) {
                return Err(invalid(format!("`out` shares its allocation with `{n}`")));
            }
        }
        Ok(Dims { queries, q_heads, kv_heads, dim, value_dim })
    }

    /// Fused paged attention over this plan into `out [queries, Hq, Dv]` on `stream` (see the
    /// module docs): `q [queries, Hq, D]`, `k_cache [pages, page_size, Hkv, D]`, `v_cache
    /// [pages, page_size, Hkv, Dv]`, one float dtype, contiguous, on one device; `Hq` a multiple
    /// of `Hkv`; D and Dv in 1..=1024; a finite positive `scale`. With `split = Some((workspace,
    /// splits))` (2..=32 splits, an f32 workspace of at least `mla_workspace_len(queries, Hq, Dv,
    /// splits)` elements) the keys are split and merged in f32. Neither form allocates or waits
    /// for the device.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_into(
        &self,
        stream: &Stream,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scale: f32,
        causal: bool,
        split: Option<(&Tensor, usize)>,
        out: &Tensor,
    ) -> Result<()> {
        let Dims { queries, q_heads, kv_heads, dim, value_dim } =
            self.attention_dims(stream, [q, k_cache, v_cache], scale, out)?;
        let group = q_heads / kv_heads;
        let rows = self.max_block_queries * group;
        let (rows_per_block, tile) = paged_attention_block_shape(rows, dim, value_dim);
        let grid_y = kv_heads * rows.div_ceil(rows_per_block);
        if grid_y > 65535 || self.query_blocks > 65535 {
            return Err(invalid(format!(
                "at most 65535 kv head row chunks and query blocks per launch (got {grid_y} and {})",
                self.query_blocks
            )));
        }
        let splits = match split {
            None => 1,
            Some((ws, splits)) => {
                if !(2..=MLA_MAX_SPLITS).contains(&splits) {
                    return Err(invalid(format!("splits ({splits}) must be in 2..={MLA_MAX_SPLITS}")));
                }
                let need = mla_workspace_len(queries, q_heads, value_dim, splits);
                expect_dtype(OP, "workspace", ws, DType::F32)?;
                same_device(OP, stream, &[("workspace", ws)])?;
                if !ws.is_contiguous() || ws.numel() < need {
                    return Err(shape_error(format!(
                        "the workspace must be contiguous with at least {need} f32 elements, has {}",
                        ws.numel()
                    )));
                }
                to_u32(OP, "workspace elements", need)?;
                if queries > 65535 || q_heads > 65535 {
                    return Err(invalid(format!(
                        "the split merge takes at most 65535 queries and heads (got {queries} and {q_heads})"
                    )));
                }
                splits
            }
        };
        let dtype = q.dtype().scalar_type();
        let cfg = PagedAttentionConfig { dtype, split: split.is_some() };
        let kern = kernel(cfg.id(), || paged_attention(&cfg))?;
        let block = [PAGED_ATTENTION_THREADS, 1, 1];
        let launch = LaunchConfig {
            grid: [splits as u32, grid_y as u32, self.query_blocks as u32],
            block,
            dynamic_shared_bytes: 0,
        };
        let u = |what: &str, n: usize| to_u32(OP, what, n);
        let params = PagedAttentionParams {
            q,
            k_cache,
            v_cache,
            tables: &self.tables,
            lengths: &self.lengths,
            sequence_ids: &self.sequence_ids,
            positions: &self.positions,
            blocks: &self.blocks,
            out: split.is_none().then_some(out),
            workspace: split.map(|(ws, _)| ws),
            scale,
            q_heads: u("query heads", q_heads)?,
            kv_heads: u("kv heads", kv_heads)?,
            group: u("GQA group", group)?,
            dim: dim as u32,
            value_dim: value_dim as u32,
            page_size: u("page size", self.page_size)?,
            table_width: u("table width", self.capacity.pages_per_sequence)?,
            rows_per_block: rows_per_block as u32,
            tile: tile as u32,
            causal: causal as u32,
            queries: split.map(|_| queries as u32),
        };
        params::launch(stream, &kern, launch, &params.args())?;
        if let Some((ws, _)) = split {
            let cfg = PagedMlaConfig { dtype, split: true };
            let kern = kernel(cfg.combine_id(), || mla_combine(&cfg))?;
            let launch = LaunchConfig {
                grid: [(value_dim as u32).div_ceil(MLA_THREADS), q_heads as u32, queries as u32],
                block: [MLA_THREADS, 1, 1],
                dynamic_shared_bytes: 0,
            };
            let p = MlaCombineParams {
                workspace: ws,
                out,
                heads: q_heads as u32,
                rank: value_dim as u32,
                splits: splits as u32,
            };
            params::launch(stream, &kern, launch, &p.args())?;
        }
        Ok(())
    }

    /// The `[queries, Hq, Dv]` output of a call on `q`'s stream: `q`'s dtype, `v_cache`'s value
    /// dim (a malformed `q` or `v_cache` is refused by the call's checks, which see them before
    /// `out`).
    fn attention_out(q: &Tensor, v_cache: &Tensor) -> Result<Tensor> {
        let (queries, heads) = (q.shape().first().copied().unwrap_or(0), q.shape().get(1).copied().unwrap_or(0));
        let value_dim = v_cache.shape().last().copied().unwrap_or(0);
        Ok(Tensor::empty_on(&q.buffer().stream(), q.dtype(), &[queries, heads, value_dim])?)
    }

    /// Fused paged attention over this plan, unsplit, on `q`'s stream: `q [queries, Hq, D]`,
    /// `k_cache [pages, page_size, Hkv, D]`, `v_cache [pages, page_size, Hkv, Dv]` → a new
    /// `[queries, Hq, Dv]` (see [`attention_into`](Self::attention_into)).
    pub fn attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scale: f32,
        causal: bool,
    ) -> Result<Tensor> {
        let out = Self::attention_out(q, v_cache)?;
        self.attention_into(&q.buffer().stream(), q, k_cache, v_cache, scale, causal, None, &out)?;
        Ok(out)
    }

    /// Split fused paged attention into `out` on `stream`, over `workspace`'s splits (made for
    /// this call's queries, `Hq` and `Dv`, on `stream`): see [`attention_into`](Self::attention_into).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_with_workspace_into(
        &self,
        stream: &Stream,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scale: f32,
        causal: bool,
        workspace: &SplitWorkspace,
        out: &Tensor,
    ) -> Result<()> {
        let Dims { queries, q_heads, value_dim, .. } =
            self.attention_dims(stream, [q, k_cache, v_cache], scale, out)?;
        let split = workspace.check(stream, queries, q_heads, value_dim)?;
        self.attention_into(stream, q, k_cache, v_cache, scale, causal, Some(split), out)
    }

    /// Split fused paged attention on `q`'s stream, a new `[queries, Hq, Dv]` (see
    /// [`attention_with_workspace_into`](Self::attention_with_workspace_into)).
    pub fn attention_with_workspace(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scale: f32,
        causal: bool,
        workspace: &SplitWorkspace,
    ) -> Result<Tensor> {
        let out = Self::attention_out(q, v_cache)?;
        self.attention_with_workspace_into(&q.buffer().stream(), q, k_cache, v_cache, scale, causal, workspace, &out)?;
        Ok(out)
    }
}

/// The fused paged attention kernels in every float dtype, unsplit and split (family
/// `paged_attention`; the split form's merge is `paged_mla_combine`).
pub struct PagedAttention;

impl crate::family::Family for PagedAttention {
    fn names(&self) -> &'static [&'static str] {
        &["paged_attention"]
    }

    fn configs(&self) -> Vec<crate::registry::Registered> {
        use crate::registry::Registered;
        let mut out = Vec::new();
        for dtype in crate::blocks::FLOAT_DTYPES {
            for split in [false, true] {
                let cfg = PagedAttentionConfig { dtype, split };
                out.push(Registered::new(cfg.id(), "paged_attention", Some(dtype), move || paged_attention(&cfg)));
            }
        }
        out
    }

    fn sample(&self, _: &str, id: &str) -> Option<crate::problem::Case> {
        // Two sequences of 13 and 7 keys over pages of 4 slots (8 physical pages, shuffled):
        // causal prefill queries at positions 11 and 12 of the first (one query block) and 3 of
        // the second; Hq 4 over Hkv 2, D 40 ≠ Dv 24.
        let split = id.ends_with(".split");
        let (rows_per_block, tile) = paged_attention_block_shape(2 * 2, 40, 24);
        let mut c = crate::problem::Case::new([if split { 2 } else { 1 }, 2, 2]);
        c.indices.insert("tables", vec![5, 2, 7, 0, 3, 6, 1, 4]);
        c.indices.insert("lengths", vec![13, 7]);
        c.indices.insert("sequence_ids", vec![0, 0, 1]);
        c.indices.insert("positions", vec![11, 12, 3]);
        c.indices.insert("blocks", vec![0, 2, 13, 2, 1, 4]);
        c.scalars.extend([("q_heads", 4), ("kv_heads", 2), ("group", 2), ("dim", 40), ("value_dim", 24)]);
        c.scalars.extend([("page_size", 4), ("table_width", 4), ("rows_per_block", rows_per_block as u64)]);
        c.scalars.extend([("tile", tile as u64), ("causal", 1), ("queries", 3)]);
        Some(c)
    }
}

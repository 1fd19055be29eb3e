//! The dispatch and combine kernels: token rows grouped by expert ([`moe_dispatch_count`],
//! [`moe_dispatch_scan`], [`moe_dispatch_scatter`]) and the weighted sum back in token order
//! ([`moe_combine`]).
//!
//! **Order.** Dispatch is a stable counting sort of the `N = T · top_k` routing entries (entry
//! `i = t · top_k + s` is token `t`'s slot `s`) by expert: expert `e`'s rows are
//! `offsets[e]..offsets[e + 1]`, and within an expert the entries keep their flat order, so
//! the layout depends only on the routing, never on scheduling. The contract allows any order
//! within an expert; a fixed one costs no atomics and makes the layout testable.
//!
//! **Kernels.** Entries go in chunks of [`DISPATCH_CHUNK`], one block each. (1) `count`: each
//! thread ranks its entry among the chunk's entries of the same expert (a broadcast read of
//! the chunk's ids from shared memory per entry), the last of each expert writes the chunk's
//! count for it to `counts[chunk, e]`, and the routing weights are widened to `f32` for the
//! combine. (2) `scan`: one block, a thread per expert, turns each column of `counts` into
//! its exclusive prefix over chunks (in place) and the totals into `offsets`. (3) `scatter`:
//! each entry's row is `offsets[e] + counts[chunk, e] + rank`; the maps (`slot_rows`: entry →
//! row, `row_slots`: row → entry) are written and the block copies its entries' token rows,
//! one row at a time with every thread (coalesced). The combine runs a thread per output
//! column and adds a token's `top_k` rows in slot order, in `f32`, rounded once.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SharedId, SpecialReg, Value, VerifyError};

use super::kernel::MAX_EXPERTS;
use crate::blocks::{load_f32, row_ptr, store_from_f32};

/// Routing entries per block of the count and scatter kernels (its threads).
pub const DISPATCH_CHUNK: u32 = 256;
/// Threads per block of the combine (along `H`).
pub const COMBINE_THREADS: u32 = 256;
/// Most blocks along the combine's tokens; more tokens loop.
pub const COMBINE_MAX_ROW_BLOCKS: u32 = 65535;

/// The count kernel for routing weights of `weight_dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DispatchCountConfig {
    pub weight_dtype: ScalarType,
}

impl DispatchCountConfig {
    /// `moe_dispatch_count.bf16`.
    pub fn id(&self) -> String {
        format!("moe_dispatch_count.{}", self.weight_dtype)
    }
}

/// The scan kernel (one configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DispatchScanConfig;

impl DispatchScanConfig {
    /// `moe_dispatch_scan`.
    pub fn id(&self) -> String {
        "moe_dispatch_scan".into()
    }
}

/// The scatter kernel for token rows of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DispatchScatterConfig {
    pub dtype: ScalarType,
}

impl DispatchScatterConfig {
    /// `moe_dispatch_scatter.bf16`.
    pub fn id(&self) -> String {
        format!("moe_dispatch_scatter.{}", self.dtype)
    }
}

/// The combine kernel for expert outputs of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CombineConfig {
    pub dtype: ScalarType,
}

impl CombineConfig {
    /// `moe_combine.bf16`.
    pub fn id(&self) -> String {
        format!("moe_combine.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_dispatch_count`], in order.
    pub struct DispatchCountParams, DispatchCountValues for DispatchCountConfig as cfg {
        indices: tensor(ScalarType::U32),
        weights: tensor(cfg.weight_dtype),
        counts: tensor(ScalarType::U32),
        slot_weights: tensor(ScalarType::F32),
        entries: scalar(u32),
        experts: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_dispatch_scan`], in order.
    pub struct DispatchScanParams, DispatchScanValues for DispatchScanConfig as _cfg {
        counts: tensor(ScalarType::U32),
        offsets: tensor(ScalarType::U32),
        chunks: scalar(u32),
        experts: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_dispatch_scatter`], in order.
    pub struct DispatchScatterParams, DispatchScatterValues for DispatchScatterConfig as cfg {
        indices: tensor(ScalarType::U32),
        counts: tensor(ScalarType::U32),
        offsets: tensor(ScalarType::U32),
        input: tensor(cfg.dtype),
        rows: tensor(cfg.dtype),
        slot_rows: tensor(ScalarType::U32),
        row_slots: tensor(ScalarType::U32),
        entries: scalar(u32),
        experts: scalar(u32),
        top_k: scalar(u32),
        hidden: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_combine`], in order.
    pub struct CombineParams, CombineValues for CombineConfig as cfg {
        expert_out: tensor(cfg.dtype),
        slot_rows: tensor(ScalarType::U32),
        slot_weights: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        tokens: scalar(u32),
        top_k: scalar(u32),
        hidden: scalar(u32),
    }
}

/// This thread's entry of the block's chunk: its flat index, whether it exists, and its
/// expert (clamped below `experts`, so a bad id cannot index out of bounds; `experts` itself
/// for a missing entry, which matches no real id). The ids go to `ids[tid]`; the caller's
/// barrier publishes them.
#[track_caller]
fn chunk_entry(b: &mut KernelBuilder, indices: Value, entries: Value, experts: Value, ids: SharedId) -> [Value; 4] {
    let chunk = b.block_id_x();
    let tid = b.thread_id_x();
    let size = b.const_u32(DISPATCH_CHUNK);
    let i = b.fma(chunk, size, tid);
    let valid = b.lt(i, entries);
    let e = b.if_else(
        valid,
        |b| {
            let p = b.ptr_add(indices, i);
            let raw = b.load(p);
            let one = b.const_u32(1);
            let last = b.sub(experts, one);
            vec![b.min(raw, last)]
        },
        |_| vec![experts],
    )[0];
    let smem = b.shared_ptr(ids);
    let p = b.ptr_add(smem, tid);
    b.store(p, e);
    [chunk, i, valid, e]
}

/// The entries of the chunk with expert `e` before this thread's, and (with `after`) those
/// after it: one pass over the chunk's ids (a broadcast read each).
#[track_caller]
fn rank_in_chunk(b: &mut KernelBuilder, ids: SharedId, e: Value, after: bool) -> (Value, Option<Value>) {
    let tid = b.thread_id_x();
    let smem = b.shared_ptr(ids);
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let size = b.const_u32(DISPATCH_CHUNK);
    let init: Vec<Value> = if after { vec![zero, zero] } else { vec![zero] };
    let out = b.for_range(zero, size, one, &init, |b, j, acc| {
        let p = b.ptr_add(smem, j);
        let other = b.load(p);
        let same = b.eq(other, e);
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let add = b.select(same, one, zero);
        let earlier = b.lt(j, tid);
        let before = b.select(earlier, add, zero);
        let mut next = vec![b.add(acc[0], before)];
        if after {
            let later = b.gt(j, tid);
            let a = b.select(later, add, zero);
            next.push(b.add(acc[1], a));
        }
        next
    });
    (out[0], out.get(1).copied())
}

/// Count kernel. Parameters: indices (`u32 [N]`, the plan's `[T, top_k]`), weights (`[N]`, the
/// plan's dtype), counts (`u32 [chunks, E]`), slot_weights (`f32 [N]`), entries (`N`),
/// experts (`E ≤ 1024`). Grid: `ceil(N / 256)` blocks of [`DISPATCH_CHUNK`] threads.
pub fn moe_dispatch_count(cfg: &DispatchCountConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let DispatchCountValues { indices, weights, counts, slot_weights, entries, experts } =
        DispatchCountParams::declare(&mut b, cfg);
    b.launch_bounds(DISPATCH_CHUNK, None);
    let ids = b.shared_array("ids", ScalarType::U32, DISPATCH_CHUNK);
    let hist = b.shared_array("hist", ScalarType::U32, MAX_EXPERTS);
    let [chunk, i, valid, e] = chunk_entry(&mut b, indices, entries, experts, ids);
    b.if_then(valid, |b| {
        let w = load_f32(b, weights, i);
        store_from_f32(b, slot_weights, i, w);
    });
    let tid = b.thread_id_x();
    let step = b.const_u32(DISPATCH_CHUNK);
    let h = b.shared_ptr(hist);
    b.for_each(tid, experts, step, |b, j| {
        let p = b.ptr_add(h, j);
        let zero = b.const_u32(0);
        b.store(p, zero);
    });
    b.barrier();
    let (before, after) = rank_in_chunk(&mut b, ids, e, true);
    let zero = b.const_u32(0);
    let last = after.map_or(valid, |a| b.eq(a, zero));
    let writes = b.and(valid, last);
    // The last entry of each expert in the chunk knows the chunk's count for it.
    b.if_then(writes, |b| {
        let p = b.ptr_add(h, e);
        let one = b.const_u32(1);
        let n = b.add(before, one);
        b.store(p, n);
    });
    b.barrier();
    let row = row_ptr(&mut b, counts, chunk, experts);
    b.for_each(tid, experts, step, |b, j| {
        let p = b.ptr_add(h, j);
        let n = b.load(p);
        let q = b.ptr_add(row, j);
        b.store(q, n);
    });
    b.finish()
}

/// Scan kernel. Parameters: counts (`u32 [chunks, E]`, per chunk and expert; becomes each
/// column's exclusive prefix over chunks), offsets (`u32 [E + 1]`: where each expert's rows
/// start, then `N`), chunks, experts (`E ≤ 1024`). Grid: one block of `E` threads rounded up
/// to a warp.
pub fn moe_dispatch_scan(cfg: &DispatchScanConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let DispatchScanValues { counts, offsets, chunks, experts } = DispatchScanParams::declare(&mut b, cfg);
    b.launch_bounds(MAX_EXPERTS, None);
    let totals = b.shared_array("totals", ScalarType::U32, MAX_EXPERTS);
    let e = b.thread_id_x();
    let valid = b.lt(e, experts);
    let t = b.shared_ptr(totals);
    let total = b.if_else(
        valid,
        |b| {
            let (zero, one) = (b.const_u32(0), b.const_u32(1));
            // Column `e`: consecutive threads read consecutive words of each chunk's row.
            let total = b.for_range(zero, chunks, one, &[zero], |b, c, acc| {
                let row = row_ptr(b, counts, c, experts);
                let p = b.ptr_add(row, e);
                let n = b.load(p);
                b.store(p, acc[0]);
                vec![b.add(acc[0], n)]
            })[0];
            let p = b.ptr_add(t, e);
            b.store(p, total);
            vec![total]
        },
        |b| vec![b.const_u32(0)],
    )[0];
    b.barrier();
    b.if_then(valid, |b| {
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let start = b.for_range(zero, e, one, &[zero], |b, j, acc| {
            let p = b.ptr_add(t, j);
            let n = b.load(p);
            vec![b.add(acc[0], n)]
        })[0];
        let p = b.ptr_add(offsets, e);
        b.store(p, start);
        let last = b.sub(experts, one);
        let is_last = b.eq(e, last);
        b.if_then(is_last, |b| {
            let p = b.ptr_add(offsets, experts);
            let end = b.add(start, total);
            b.store(p, end);
        });
    });
    b.finish()
}

/// Scatter kernel. Parameters: indices (`u32 [N]`), counts (the scan's chunk prefixes),
/// offsets (`u32 [E + 1]`), input (`[T, H]`), rows (`[N, H]`), slot_rows (`u32 [N]`: entry →
/// row), row_slots (`u32 [N]`: row → entry), entries, experts, top_k, hidden (`u32`). Grid: the
/// count kernel's.
pub fn moe_dispatch_scatter(cfg: &DispatchScatterConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let DispatchScatterValues {
        indices,
        counts,
        offsets,
        input,
        rows,
        slot_rows,
        row_slots,
        entries,
        experts,
        top_k,
        hidden,
    } = DispatchScatterParams::declare(&mut b, cfg);
    b.launch_bounds(DISPATCH_CHUNK, None);
    let ids = b.shared_array("ids", ScalarType::U32, DISPATCH_CHUNK);
    let positions = b.shared_array("positions", ScalarType::U32, DISPATCH_CHUNK);
    let [chunk, i, valid, e] = chunk_entry(&mut b, indices, entries, experts, ids);
    b.barrier();
    let (before, _) = rank_in_chunk(&mut b, ids, e, false);
    let tid = b.thread_id_x();
    let pos_smem = b.shared_ptr(positions);
    b.if_then(valid, |b| {
        let p = b.ptr_add(offsets, e);
        let start = b.load(p);
        let row = row_ptr(b, counts, chunk, experts);
        let p = b.ptr_add(row, e);
        let base = b.load(p);
        let pos = b.add(start, base);
        let pos = b.add(pos, before);
        let p = b.ptr_add(slot_rows, i);
        b.store(p, pos);
        let p = b.ptr_add(row_slots, pos);
        b.store(p, i);
        let p = b.ptr_add(pos_smem, tid);
        b.store(p, pos);
    });
    b.barrier();
    // Copy the chunk's token rows, one row at a time across the block.
    let size = b.const_u32(DISPATCH_CHUNK);
    let first = b.mul(chunk, size);
    let left = b.sub(entries, first);
    let len = b.min(left, size);
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    b.for_each(zero, len, one, |b, j| {
        let p = b.ptr_add(pos_smem, j);
        let pos = b.load(p);
        let entry = b.add(first, j);
        let token = b.div(entry, top_k);
        let src = row_ptr(b, input, token, hidden);
        let dst = row_ptr(b, rows, pos, hidden);
        let step = b.const_u32(DISPATCH_CHUNK);
        b.for_each(tid, hidden, step, |b, h| {
            let p = b.ptr_add(src, h);
            let v = b.load(p);
            let q = b.ptr_add(dst, h);
            b.store(q, v);
        });
    });
    b.finish()
}

/// Combine kernel. Parameters: expert_out (`[N, H]`, dispatched order), slot_rows (`u32 [T ·
/// top_k]`), slot_weights (`f32 [T · top_k]`), out (`[T, H]`), tokens, top_k, hidden (`u32`).
/// Grid: `(ceil(H / 256), min(T, 65535))`, block [`COMBINE_THREADS`]; block row `y` handles
/// tokens `y, y + gridDim.y, ...`.
///
/// `out[t, j] = Σ_s w[t, s] · expert_out[slot_rows[t, s], j]` in `f32` (fused multiply-adds in
/// slot order), rounded once.
pub fn moe_combine(cfg: &CombineConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let CombineValues { expert_out, slot_rows, slot_weights, out, tokens, top_k, hidden } =
        CombineParams::declare(&mut b, cfg);
    combine_body(&mut b, expert_out, Some(slot_rows), slot_weights, out, [tokens, top_k, hidden]);
    b.finish()
}

/// The combine's body: `out[t, j] = Σ_s w[t · top_k + s] · expert_out[row, j]` in `f32`, the
/// row `slot_rows[t · top_k + s]`, or the slot itself without `slot_rows` (expert rows in slot
/// order, as the decode path writes them); `weights` of any float dtype. Grid and block as
/// [`moe_combine`].
#[track_caller]
pub(super) fn combine_body(
    b: &mut KernelBuilder,
    expert_out: Value,
    slot_rows: Option<Value>,
    weights: Value,
    out: Value,
    [tokens, top_k, hidden]: [Value; 3],
) {
    b.launch_bounds(COMBINE_THREADS, None);
    let j = b.global_thread_id_x();
    let in_range = b.lt(j, hidden);
    b.if_then(in_range, |b| {
        let first = b.block_id_y();
        let step = b.special(SpecialReg::NctaidY);
        b.for_each(first, tokens, step, |b, t| {
            let base = b.mul(t, top_k);
            let (zero, one) = (b.const_u32(0), b.const_u32(1));
            let zero_f = b.const_f32(0.0);
            let acc = b.for_range(zero, top_k, one, &[zero_f], |b, s, acc| {
                let slot = b.add(base, s);
                let r = match slot_rows {
                    Some(rows) => {
                        let p = b.ptr_add(rows, slot);
                        b.load(p)
                    }
                    None => slot,
                };
                let w = load_f32(b, weights, slot);
                let src = row_ptr(b, expert_out, r, hidden);
                let x = load_f32(b, src, j);
                vec![b.fma(w, x, acc[0])]
            })[0];
            let dst = row_ptr(b, out, t, hidden);
            store_from_f32(b, dst, j, acc);
        });
    });
}

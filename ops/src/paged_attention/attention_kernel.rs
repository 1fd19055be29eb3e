//! The fused paged attention kernel: softmax attention of packed queries over the physical
//! pages of a paged KV cache (the algorithm is described in [`super::attention`]). Its split
//! form's partials are merged by [`super::mla_kernel::mla_combine`], whose workspace layout it
//! shares (`R := Dv`).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, VerifyError};

use super::tile::{
    accumulate, lane_dot, load_at, normalize, online_softmax, stage_keys, store_at, store_stats, BlockValues,
    PagedRows, SoftmaxState,
};
use crate::blocks::{store_from_f32, warp_reduce, Combine};

/// Threads per block.
pub const PAGED_ATTENTION_THREADS: u32 = 128;
/// The largest head dim `D` and value head dim `Dv`.
pub const PAGED_ATTENTION_MAX_DIM: usize = 1024;
/// Most consecutive queries of one sequence in one query block (the plan's blocks).
pub const PAGED_QUERIES_PER_BLOCK: usize = 16;
/// Most rows ((query, head) pairs) one block accumulates.
pub const PAGED_MAX_ROWS_PER_BLOCK: usize = 64;
/// `f32` elements of the shared accumulator (rows per block · Dv).
const ACC_ELEMS: u32 = 6144;
/// `f32` elements of the staged key tile (keys per tile · D).
const KEY_ELEMS: u32 = 2048;
/// `f32` elements of the staged value tile (keys per tile · Dv).
const VALUE_ELEMS: u32 = 2048;
/// `f32` elements of the score tile (rows per block · (keys per tile | 1)).
const SCORE_ELEMS: u32 = 1024;
/// Most keys per tile.
const MAX_TILE: usize = 16;

/// The block shape for `rows` rows wanted per (query block, kv head) (the largest query
/// block's queries times the GQA group), head dim `dim` and value head dim `value_dim`:
/// `(rows per block, keys per tile)`.
pub fn paged_attention_block_shape(rows: usize, dim: usize, value_dim: usize) -> (usize, usize) {
    let rb = rows.min(PAGED_MAX_ROWS_PER_BLOCK).min(ACC_ELEMS as usize / value_dim.max(1)).max(1);
    let tile = MAX_TILE
        .min(KEY_ELEMS as usize / dim.max(1))
        .min(VALUE_ELEMS as usize / value_dim.max(1))
        .min((SCORE_ELEMS as usize / rb).saturating_sub(1))
        .max(1);
    (rb, tile)
}

/// A fused paged attention configuration. Parameters: `q [queries, Hq, D]`, `k_cache [pages,
/// page_size, Hkv, D]`, `v_cache [pages, page_size, Hkv, Dv]` (dtype), `tables` (u32
/// `[sequences, table_width]`), `lengths` (u32 `[sequences]`), `sequence_ids`, `positions` (u32
/// per query), `blocks` (u32 `(first query, queries, largest position + 1)` per query block: its
/// queries are consecutive and of one sequence), then `out [queries, Hq, Dv]` (unsplit) or the
/// f32 `workspace` (split, laid out as [`super::mla_kernel::mla_workspace_len`] with `H := Hq`,
/// `R := Dv`), `scale: f32`, `q_heads, kv_heads, group (Hq / Hkv), dim, value_dim, page_size,
/// table_width, rows_per_block, tile, causal (0/1): u32`, and with `split` `queries: u32`.
/// Launch: grid `(splits, Hkv · chunks, query blocks)` (1 split unsplit) with `chunks =
/// ceil(largest block's queries · group / rows_per_block)`, [`PAGED_ATTENTION_THREADS`]
/// threads, the block shape from [`paged_attention_block_shape`]; split `s` of a query block
/// whose keys end at `E` covers keys `[s · L, (s + 1) · L)` with `L = max(1, ceil(E / splits))`,
/// computed in the kernel from the plan on the device, so a launch depends on no host length (a
/// captured decode step stays valid as its sequences grow).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedAttentionConfig {
    pub dtype: ScalarType,
    pub split: bool,
}

impl PagedAttentionConfig {
    /// `paged_attention.bf16` (`.split` for the split form).
    pub fn id(&self) -> String {
        let split = if self.split { ".split" } else { "" };
        format!("paged_attention.{}{split}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`paged_attention`] (see [`PagedAttentionConfig`]).
    pub struct PagedAttentionParams, PagedAttentionValues for PagedAttentionConfig as cfg {
        q: tensor(cfg.dtype),
        k_cache: tensor(cfg.dtype),
        v_cache: tensor(cfg.dtype),
        tables: tensor(ScalarType::U32),
        lengths: tensor(ScalarType::U32),
        sequence_ids: tensor(ScalarType::U32),
        positions: tensor(ScalarType::U32),
        blocks: tensor(ScalarType::U32),
        out: opt_tensor(cfg.dtype, !cfg.split),
        workspace: opt_tensor(ScalarType::F32, cfg.split),
        scale: scalar(f32),
        q_heads: scalar(u32),
        kv_heads: scalar(u32),
        group: scalar(u32),
        dim: scalar(u32),
        value_dim: scalar(u32),
        page_size: scalar(u32),
        table_width: scalar(u32),
        rows_per_block: scalar(u32),
        tile: scalar(u32),
        causal: scalar(u32),
        queries: opt_scalar(u32, cfg.split),
    }
}

/// Build the fused paged attention kernel (see [`PagedAttentionConfig`]).
pub fn paged_attention(cfg: &PagedAttentionConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = PagedAttentionParams::declare(&mut b, cfg);
    b.launch_bounds(PAGED_ATTENTION_THREADS, None);
    let (f32t, u32t) = (ScalarType::F32, ScalarType::U32);
    let max_rows = PAGED_MAX_ROWS_PER_BLOCK as u32;
    let acc_id = b.shared_array("acc", f32t, ACC_ELEMS);
    let k_id = b.shared_array("key_tile", f32t, KEY_ELEMS);
    let v_id = b.shared_array("value_tile", f32t, VALUE_ELEMS);
    let sc_id = b.shared_array("scores", f32t, SCORE_ELEMS);
    let m_id = b.shared_array("row_max", f32t, max_rows);
    let l_id = b.shared_array("row_sum", f32t, max_rows);
    let al_id = b.shared_array("alpha", f32t, max_rows);
    let rq_id = b.shared_array("row_q", u32t, max_rows);
    let re_id = b.shared_array("row_end", u32t, max_rows);
    let acc_s = b.shared_ptr(acc_id);
    let k_s = b.shared_ptr(k_id);
    let v_s = b.shared_ptr(v_id);
    let sc_s = b.shared_ptr(sc_id);
    let m_s = b.shared_ptr(m_id);
    let l_s = b.shared_ptr(l_id);
    let al_s = b.shared_ptr(al_id);
    let rq_s = b.shared_ptr(rq_id);
    let re_s = b.shared_ptr(re_id);

    let (group, dim, value_dim, page_size, tile) = (p.group, p.dim, p.value_dim, p.page_size, p.tile);
    let tid = b.thread_id_x();
    let split = b.block_id_x();
    let yid = b.block_id_y();
    let qb = b.special(SpecialReg::CtaidZ);
    let ny = b.special(SpecialReg::NctaidY);
    let threads = b.const_u32(PAGED_ATTENTION_THREADS);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let three = b.const_u32(3);
    // Grid y is (kv head, row chunk).
    let chunks = b.div(ny, p.kv_heads);
    let kvh = b.div(yid, chunks);
    let chunk = b.rem(yid, chunks);
    // The query block: `count` consecutive queries of one sequence from `first`.
    let bi = b.mul(qb, three);
    let first = load_at(&mut b, p.blocks, bi);
    let bi1 = b.add(bi, one);
    let count = load_at(&mut b, p.blocks, bi1);
    let bi2 = b.add(bi1, one);
    let causal_end = load_at(&mut b, p.blocks, bi2);
    let seq = load_at(&mut b, p.sequence_ids, first);
    let len = load_at(&mut b, p.lengths, seq);
    let is_causal = b.ne(p.causal, zero);
    let block_causal_end = b.min(len, causal_end);
    let block_end = b.select(is_causal, block_causal_end, len);
    // This chunk's rows: (query, head) pairs r0 .. r0 + nr of the block's count · group,
    // query-major, all of kv head `kvh`.
    let total = b.mul(count, group);
    let r0 = b.mul(chunk, p.rows_per_block);
    let r0c = b.min(r0, total);
    let left = b.sub(total, r0c);
    let nr = b.min(p.rows_per_block, left);
    let (begin, stop) = if cfg.split {
        let splits = b.special(SpecialReg::NctaidX);
        let last = b.sub(splits, one);
        let padded = b.add(block_end, last);
        let per = b.div(padded, splits);
        let split_len = b.max(per, one);
        let begin = b.mul(split, split_len);
        let stop = b.add(begin, split_len);
        (begin, b.min(stop, block_end))
    } else {
        (zero, block_end)
    };
    // An empty chunk (a block with fewer queries than the largest) reads no keys.
    let has_rows = b.gt(nr, zero);
    let stop = b.select(has_rows, stop, begin);
    let table_row = b.mul(seq, p.table_width);

    let zf = b.const_f32(0.0);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let acc_len = b.mul(nr, value_dim);
    b.for_each(tid, acc_len, threads, |b, i| store_at(b, acc_s, i, zf));
    let row_lt = b.lt(tid, nr);
    b.if_then(row_lt, |b| {
        let gr = b.add(r0, tid);
        let ql = b.div(gr, group);
        let g = b.rem(gr, group);
        let query = b.add(first, ql);
        let head = b.fma(kvh, group, g);
        let qrow = b.fma(query, p.q_heads, head);
        let pos = load_at(b, p.positions, query);
        let pos1 = b.add(pos, one);
        let row_causal_end = b.min(len, pos1);
        let end = b.select(is_causal, row_causal_end, len);
        store_at(b, rq_s, tid, qrow);
        store_at(b, re_s, tid, end);
        store_at(b, m_s, tid, ninf);
        store_at(b, l_s, tid, zf);
    });
    b.barrier();

    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let s2 = b.mul(p.scale, log2e);
    let five = b.const_u32(5);
    let warp = b.shr(tid, five);
    let lane = b.lane_id();
    let warps = b.const_u32(PAGED_ATTENTION_THREADS / 32);
    let warp_size = b.const_u32(32);
    // The score tile's rows are `tile | 1` apart: an odd stride keeps the per-row walks of the
    // softmax free of bank conflicts.
    let sc_stride = b.or(tile, one);
    let v = BlockValues { tid, threads, zero, one, zf };
    let softmax = SoftmaxState { scores: sc_s, stride: sc_stride, row_max: m_s, row_sum: l_s, alpha: al_s };
    let rows = PagedRows { tables: p.tables, table_row, page_size, heads: Some((p.kv_heads, kvh)) };
    b.for_each(begin, stop, tile, |b, k0| {
        let rest = b.sub(stop, k0);
        let n = b.min(tile, rest);
        // Stage keys k0 .. k0 + n of kv head `kvh` as f32, read through the block table.
        stage_keys(b, v, rows, k0, n, p.k_cache, k_s, dim);
        stage_keys(b, v, rows, k0, n, p.v_cache, v_s, value_dim);
        b.barrier();

        // Scores (log2 domain) of the block's rows against the tile, one warp per pair; a key
        // past its row's end scores -inf.
        let pairs = b.mul(nr, n);
        b.for_each(warp, pairs, warps, |b, pair| {
            let hl = b.div(pair, n);
            let jj = b.rem(pair, n);
            let qrow = load_at(b, rq_s, hl);
            let d = lane_dot(b, (lane, warp_size), p.q, qrow, k_s, jj, dim, zf);
            let d = warp_reduce(b, Combine::Sum, d);
            let first_lane = b.eq(lane, zero);
            b.if_then(first_lane, |b| {
                let end = load_at(b, re_s, hl);
                let key = b.add(k0, jj);
                let live = b.lt(key, end);
                let s = b.mul(d, s2);
                let s = b.select(live, s, ninf);
                let at = b.fma(hl, sc_stride, jj);
                store_at(b, sc_s, at, s);
            });
        });
        b.barrier();

        // Online softmax per row, then acc[row, c] = acc[row, c] · alpha[row] + Σ_j p[row, j] · v[j, c].
        online_softmax(b, v, softmax, row_lt, n, Some(ninf));
        b.barrier();
        accumulate(b, v, softmax, acc_s, acc_len, v_s, value_dim, n);
        b.barrier();
    });

    match (p.out, p.workspace, p.queries) {
        (Some(out), _, _) => {
            // out[qrow, c] = acc / l, zeros for a row without keys.
            b.for_each(tid, acc_len, threads, |b, i| {
                let hl = b.div(i, value_dim);
                let c = b.rem(i, value_dim);
                let qrow = load_at(b, rq_s, hl);
                let l = load_at(b, l_s, hl);
                let a = load_at(b, acc_s, i);
                let y = normalize(b, zf, a, l);
                let at = b.fma(qrow, value_dim, c);
                store_from_f32(b, out, at, y);
            });
        }
        (None, Some(ws), Some(queries)) => {
            let splits = b.special(SpecialReg::NctaidX);
            // Entry (query, head, split) = qrow · splits + split.
            b.for_each(tid, acc_len, threads, |b, i| {
                let hl = b.div(i, value_dim);
                let c = b.rem(i, value_dim);
                let qrow = load_at(b, rq_s, hl);
                let entry = b.fma(qrow, splits, split);
                let at = b.fma(entry, value_dim, c);
                let a = load_at(b, acc_s, i);
                store_from_f32(b, ws, at, a);
            });
            b.if_then(row_lt, |b| {
                let qh = b.mul(queries, p.q_heads);
                let all = b.mul(qh, splits);
                let stats = b.mul(all, value_dim);
                let qrow = load_at(b, rq_s, tid);
                let entry = b.fma(qrow, splits, split);
                store_stats(b, v, softmax, ws, stats, entry);
            });
        }
        _ => {}
    }
    b.finish()
}

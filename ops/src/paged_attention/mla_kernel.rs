//! The paged MLA kernels: the attention over a shared latent cache and the merge of its splits
//! (the algorithm is described in [`super::mla`]).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use super::tile::{
    accumulate, lane_dot, load_at, normalize, online_softmax, stage_keys, store_at, store_stats, BlockValues,
    PagedRows, SoftmaxState,
};
use crate::blocks::{load_f32, store_from_f32, warp_reduce, Combine};

/// Threads per block.
pub const MLA_THREADS: u32 = 128;
/// The largest latent rank R.
pub const MLA_MAX_RANK: usize = 1024;
/// The largest positional dim P.
pub const MLA_MAX_POS_DIM: usize = 256;
/// Most heads one block accumulates.
pub const MLA_MAX_HEADS_PER_BLOCK: usize = 64;
/// `f32` elements of the shared accumulator (heads per block · R).
const ACC_ELEMS: u32 = 8192;
/// `f32` elements of the staged latent tile (keys per tile · R).
const LATENT_ELEMS: u32 = 2048;
/// `f32` elements of the staged positional tile (keys per tile · P).
const POS_ELEMS: u32 = 1024;
/// `f32` elements of the score tile (heads per block · keys per tile).
const SCORE_ELEMS: u32 = 512;
/// Most keys per tile (the score tile holds `heads per block · (keys per tile | 1)`).
const MAX_TILE: usize = 16;

/// The block shape for `heads` heads of rank `rank` and positional dim `pos_dim`:
/// `(heads per block, keys per tile)`.
pub fn mla_block_shape(heads: usize, rank: usize, pos_dim: usize) -> (usize, usize) {
    let hb = heads.min(MLA_MAX_HEADS_PER_BLOCK).min(ACC_ELEMS as usize / rank).max(1);
    let tile = MAX_TILE
        .min(LATENT_ELEMS as usize / rank)
        .min(POS_ELEMS as usize / pos_dim)
        .min((SCORE_ELEMS as usize / hb).saturating_sub(1))
        .max(1);
    (hb, tile)
}

/// Elements of the split workspace: per (query, head, split) an `f32` accumulator of `R`
/// elements (first region) and a `(max, sum)` pair (second region).
pub fn mla_workspace_len(queries: usize, heads: usize, rank: usize, splits: usize) -> usize {
    queries * heads * splits * (rank + 2)
}

/// A paged MLA configuration. Parameters: `q [queries, H, R]`, `qp [queries, H, P]`,
/// `latent [pages, page_size, R]`, `kp [pages, page_size, P]` (dtype), `tables` (u32
/// `[sequences, table_width]`), `lengths` (u32 `[sequences]`), `sequence_ids`, `positions`
/// (u32 `[queries]`), then `out [queries, H, R]` (unsplit) or the f32 `workspace` (split, see
/// [`mla_workspace_len`]), `scale: f32`, `heads, rank, pos_dim, page_size, table_width,
/// heads_per_block, tile, causal (0/1): u32` and with `split` `split_len: u32`. Launch: grid
/// `(splits, ceil(H / heads_per_block), queries)` (1 split unsplit), [`MLA_THREADS`] threads, the
/// block shape from [`mla_block_shape`]; split `s` covers keys `[s · split_len, (s + 1) · split_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedMlaConfig {
    pub dtype: ScalarType,
    pub split: bool,
}

impl PagedMlaConfig {
    /// `paged_mla.bf16` (`.split` for the split form).
    pub fn id(&self) -> String {
        let split = if self.split { ".split" } else { "" };
        format!("paged_mla.{}{split}", self.dtype)
    }
    /// `paged_mla_combine.bf16`.
    pub fn combine_id(&self) -> String {
        format!("paged_mla_combine.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`paged_mla`] (see [`PagedMlaConfig`]).
    pub struct PagedMlaParams, PagedMlaValues for PagedMlaConfig as cfg {
        q: tensor(cfg.dtype),
        qp: tensor(cfg.dtype),
        latent: tensor(cfg.dtype),
        kp: tensor(cfg.dtype),
        tables: tensor(ScalarType::U32),
        lengths: tensor(ScalarType::U32),
        sequence_ids: tensor(ScalarType::U32),
        positions: tensor(ScalarType::U32),
        out: opt_tensor(cfg.dtype, !cfg.split),
        workspace: opt_tensor(ScalarType::F32, cfg.split),
        scale: scalar(f32),
        heads: scalar(u32),
        rank: scalar(u32),
        pos_dim: scalar(u32),
        page_size: scalar(u32),
        table_width: scalar(u32),
        heads_per_block: scalar(u32),
        tile: scalar(u32),
        causal: scalar(u32),
        split_len: opt_scalar(u32, cfg.split),
    }
}

/// Build the paged MLA kernel (see [`PagedMlaConfig`]).
pub fn paged_mla(cfg: &PagedMlaConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = PagedMlaParams::declare(&mut b, cfg);
    b.launch_bounds(MLA_THREADS, None);
    let f32t = ScalarType::F32;
    let acc_id = b.shared_array("acc", f32t, ACC_ELEMS);
    let lat_id = b.shared_array("latent_tile", f32t, LATENT_ELEMS);
    let pos_id = b.shared_array("pos_tile", f32t, POS_ELEMS);
    let sc_id = b.shared_array("scores", f32t, SCORE_ELEMS);
    let m_id = b.shared_array("row_max", f32t, MLA_MAX_HEADS_PER_BLOCK as u32);
    let l_id = b.shared_array("row_sum", f32t, MLA_MAX_HEADS_PER_BLOCK as u32);
    let al_id = b.shared_array("alpha", f32t, MLA_MAX_HEADS_PER_BLOCK as u32);
    let acc_s = b.shared_ptr(acc_id);
    let lat_s = b.shared_ptr(lat_id);
    let pos_s = b.shared_ptr(pos_id);
    let sc_s = b.shared_ptr(sc_id);
    let m_s = b.shared_ptr(m_id);
    let l_s = b.shared_ptr(l_id);
    let al_s = b.shared_ptr(al_id);

    let (heads, rank, pos_dim, page_size, tile) = (p.heads, p.rank, p.pos_dim, p.page_size, p.tile);
    let tid = b.thread_id_x();
    let split = b.block_id_x();
    let chunk = b.block_id_y();
    let qi = b.special(SpecialReg::CtaidZ);
    let threads = b.const_u32(MLA_THREADS);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    // The score tile's rows are `tile | 1` apart: an odd stride keeps the per-head walks of the
    // softmax free of bank conflicts.
    let sc_stride = b.or(tile, one);
    let softmax = SoftmaxState { scores: sc_s, stride: sc_stride, row_max: m_s, row_sum: l_s, alpha: al_s };
    let h0 = b.mul(chunk, p.heads_per_block);
    let left = b.sub(heads, h0);
    let nh = b.min(p.heads_per_block, left);

    // The query's sequence and the keys it attends: [0, length), causal: [0, position].
    let sp = b.ptr_add(p.sequence_ids, qi);
    let seq = b.load(sp);
    let lp = b.ptr_add(p.lengths, seq);
    let len = b.load(lp);
    let pp = b.ptr_add(p.positions, qi);
    let pos = b.load(pp);
    let pos1 = b.add(pos, one);
    let causal_end = b.min(len, pos1);
    let is_causal = b.ne(p.causal, zero);
    let end = b.select(is_causal, causal_end, len);
    let (begin, stop) = match p.split_len {
        Some(split_len) => {
            let begin = b.mul(split, split_len);
            let stop = b.add(begin, split_len);
            (begin, b.min(stop, end))
        }
        None => (zero, end),
    };
    let table_row = b.mul(seq, p.table_width);
    let rows = PagedRows { tables: p.tables, table_row, page_size, heads: None };
    // Rows of q and qp: (query · H + h0 + hl).
    let q_row0 = b.fma(qi, heads, h0);

    let zf = b.const_f32(0.0);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let v = BlockValues { tid, threads, zero, one, zf };
    let acc_len = b.mul(nh, rank);
    b.for_each(tid, acc_len, threads, |b, i| store_at(b, acc_s, i, zf));
    let head_lt = b.lt(tid, nh);
    b.if_then(head_lt, |b| {
        store_at(b, m_s, tid, ninf);
        store_at(b, l_s, tid, zf);
    });
    b.barrier();

    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let s2 = b.mul(p.scale, log2e);
    let five = b.const_u32(5);
    let warp = b.shr(tid, five);
    let lane = b.lane_id();
    let warps = b.const_u32(MLA_THREADS / 32);
    let warp_size = b.const_u32(32);
    b.for_each(begin, stop, tile, |b, k0| {
        let rest = b.sub(stop, k0);
        let n = b.min(tile, rest);
        // Stage rows k0 .. k0 + n of the latent and positional caches, read through the table.
        stage_keys(b, v, rows, k0, n, p.latent, lat_s, rank);
        stage_keys(b, v, rows, k0, n, p.kp, pos_s, pos_dim);
        b.barrier();

        // Scores (log2 domain) of the block's heads against the tile, one warp per pair.
        let pairs = b.mul(nh, n);
        b.for_each(warp, pairs, warps, |b, pair| {
            let hl = b.div(pair, n);
            let jj = b.rem(pair, n);
            let qrow = b.add(q_row0, hl);
            let d = lane_dot(b, (lane, warp_size), p.q, qrow, lat_s, jj, rank, zf);
            let d = lane_dot(b, (lane, warp_size), p.qp, qrow, pos_s, jj, pos_dim, d);
            let d = warp_reduce(b, Combine::Sum, d);
            let first = b.eq(lane, zero);
            b.if_then(first, |b| {
                let s = b.mul(d, s2);
                let at = b.fma(hl, sc_stride, jj);
                store_at(b, sc_s, at, s);
            });
        });
        b.barrier();

        // Online softmax per head, then acc[h, r] = acc[h, r] · alpha[h] + Σ_j p[h, j] · latent[j, r].
        online_softmax(b, v, softmax, head_lt, n, None);
        b.barrier();
        accumulate(b, v, softmax, acc_s, acc_len, lat_s, rank, n);
        b.barrier();
    });

    match (p.out, p.workspace) {
        (Some(out), _) => {
            // out[query, h0 + hl, r] = acc / l, zeros for a query without keys.
            b.for_each(tid, acc_len, threads, |b, i| {
                let hl = b.div(i, rank);
                let l = load_at(b, l_s, hl);
                let a = load_at(b, acc_s, i);
                let y = normalize(b, zf, a, l);
                let base = b.mul(q_row0, rank);
                let at = b.add(base, i);
                store_from_f32(b, out, at, y);
            });
        }
        (None, Some(ws)) => {
            let splits = b.special(SpecialReg::NctaidX);
            let queries = b.special(SpecialReg::NctaidZ);
            // Entry (query, head, split) = (q_row0 + hl) · splits + split.
            b.for_each(tid, acc_len, threads, |b, i| {
                let hl = b.div(i, rank);
                let r = b.rem(i, rank);
                let row = b.add(q_row0, hl);
                let entry = b.fma(row, splits, split);
                let at = b.fma(entry, rank, r);
                let a = load_at(b, acc_s, i);
                store_from_f32(b, ws, at, a);
            });
            b.if_then(head_lt, |b| {
                let qh = b.mul(queries, heads);
                let all = b.mul(qh, splits);
                let stats = b.mul(all, rank);
                let row = b.add(q_row0, tid);
                let entry = b.fma(row, splits, split);
                store_stats(b, v, softmax, ws, stats, entry);
            });
        }
        (None, None) => {}
    }
    b.finish()
}

crate::kernel_params! {
    /// The parameters of [`mla_combine`]: the split workspace, `out [queries, H, R]`, and
    /// `heads, rank, splits: u32`.
    pub struct MlaCombineParams, MlaCombineValues for PagedMlaConfig as cfg {
        workspace: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        heads: scalar(u32),
        rank: scalar(u32),
        splits: scalar(u32),
    }
}

/// Merge the splits of [`paged_mla`]: `out = Σ_s acc_s · 2^(m_s - M) / Σ_s l_s · 2^(m_s - M)`
/// with `M` the largest split max (splits without keys skipped; zeros if none has keys).
/// Launch: grid `(ceil(R / MLA_THREADS), H, queries)`, [`MLA_THREADS`] threads.
pub fn mla_combine(cfg: &PagedMlaConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.combine_id().replace('.', "_"));
    let MlaCombineValues { workspace: ws, out, heads, rank, splits } = MlaCombineParams::declare(&mut b, cfg);
    b.launch_bounds(MLA_THREADS, None);
    let r = b.global_thread_id_x();
    let h = b.block_id_y();
    let qi = b.special(SpecialReg::CtaidZ);
    let queries = b.special(SpecialReg::NctaidZ);
    let in_range = b.lt(r, rank);
    b.if_then(in_range, |b| {
        let zero = b.const_u32(0);
        let one = b.const_u32(1);
        let two = b.const_u32(2);
        let zf = b.const_f32(0.0);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        let row = b.fma(qi, heads, h);
        let first = b.mul(row, splits);
        let qh = b.mul(queries, heads);
        let all = b.mul(qh, splits);
        let stats = b.mul(all, rank);
        let stat = |b: &mut KernelBuilder, s: Value, which: Value| {
            let e = b.add(first, s);
            let at = b.fma(e, two, stats);
            let at = b.add(at, which);
            load_f32(b, ws, at)
        };
        let mx = b.for_range(zero, splits, one, &[ninf], |b, s, acc| {
            let m = stat(b, s, zero);
            vec![b.max(acc[0], m)]
        })[0];
        let sums = b.for_range(zero, splits, one, &[zf, zf], |b, s, acc| {
            let m = stat(b, s, zero);
            let l = stat(b, s, one);
            let has = b.gt(l, zf);
            let d = b.sub(m, mx);
            let w = b.ex2(d);
            let w = b.select(has, w, zf);
            let e = b.add(first, s);
            let at = b.fma(e, rank, r);
            let a = load_f32(b, ws, at);
            let num = b.fma(a, w, acc[0]);
            let den = b.fma(l, w, acc[1]);
            vec![num, den]
        });
        let any = b.gt(sums[1], zf);
        let inv = b.rcp(sums[1]);
        let inv = b.select(any, inv, zf);
        let y = b.mul(sums[0], inv);
        let at = b.fma(row, rank, r);
        store_from_f32(b, out, at, y);
    });
    b.finish()
}

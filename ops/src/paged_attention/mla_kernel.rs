//! The paged MLA kernels: the attention over a shared latent cache and the merge of its splits
//! (the algorithm is described in [`super::mla`]).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use crate::blocks::{combine, load_f32, store_from_f32, warp_reduce, Combine};

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

/// `u32` constant.
fn c32(b: &mut KernelBuilder, v: u32) -> Value {
    b.const_u32(v)
}

/// Load `ptr[index]` from shared memory.
fn lds(b: &mut KernelBuilder, base: Value, index: Value) -> Value {
    let p = b.ptr_add(base, index);
    b.load(p)
}

/// Store `v` at `ptr[index]` in shared memory.
fn sts(b: &mut KernelBuilder, base: Value, index: Value, v: Value) {
    let p = b.ptr_add(base, index);
    b.store(p, v);
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
    let threads = c32(&mut b, MLA_THREADS);
    let zero = c32(&mut b, 0);
    let one = c32(&mut b, 1);
    // The score tile's rows are `tile | 1` apart: an odd stride keeps the per-head walks of the
    // softmax free of bank conflicts.
    let sc_stride = b.or(tile, one);
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
    // Rows of q and qp: (query · H + h0 + hl).
    let q_row0 = b.fma(qi, heads, h0);

    let zf = b.const_f32(0.0);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let acc_len = b.mul(nh, rank);
    b.for_each(tid, acc_len, threads, |b, i| sts(b, acc_s, i, zf));
    let head_lt = b.lt(tid, nh);
    b.if_then(head_lt, |b| {
        sts(b, m_s, tid, ninf);
        sts(b, l_s, tid, zf);
    });
    b.barrier();

    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let s2 = b.mul(p.scale, log2e);
    let five = c32(&mut b, 5);
    let warp = b.shr(tid, five);
    let lane = b.lane_id();
    let warps = c32(&mut b, MLA_THREADS / 32);
    let warp_size = c32(&mut b, 32);
    b.for_each(begin, stop, tile, |b, k0| {
        let rest = b.sub(stop, k0);
        let n = b.min(tile, rest);
        // Stage rows k0 .. k0 + n of the latent and positional caches, read through the table.
        let stage = |b: &mut KernelBuilder, src: Value, dst: Value, width: Value| {
            let count = b.mul(n, width);
            b.for_each(tid, count, threads, |b, i| {
                let jj = b.div(i, width);
                let col = b.rem(i, width);
                let key = b.add(k0, jj);
                let page_idx = b.div(key, page_size);
                let slot = b.rem(key, page_size);
                let tp = b.add(table_row, page_idx);
                let tpp = b.ptr_add(p.tables, tp);
                let page = b.load(tpp);
                let row = b.fma(page, page_size, slot);
                let at = b.fma(row, width, col);
                let x = load_f32(b, src, at);
                sts(b, dst, i, x);
            });
        };
        stage(b, p.latent, lat_s, rank);
        stage(b, p.kp, pos_s, pos_dim);
        b.barrier();

        // Scores (log2 domain) of the block's heads against the tile, one warp per pair.
        let pairs = b.mul(nh, n);
        b.for_each(warp, pairs, warps, |b, pair| {
            let hl = b.div(pair, n);
            let jj = b.rem(pair, n);
            let qrow = b.add(q_row0, hl);
            let part = |b: &mut KernelBuilder, src: Value, tile_s: Value, width: Value, acc: Value| {
                let qbase = b.mul(qrow, width);
                let tbase = b.mul(jj, width);
                b.for_range(lane, width, warp_size, &[acc], |b, r, acc| {
                    let qa = b.add(qbase, r);
                    let x = load_f32(b, src, qa);
                    let ta = b.add(tbase, r);
                    let y = lds(b, tile_s, ta);
                    vec![b.fma(x, y, acc[0])]
                })[0]
            };
            let d = part(b, p.q, lat_s, rank, zf);
            let d = part(b, p.qp, pos_s, pos_dim, d);
            let d = warp_reduce(b, Combine::Sum, d);
            let first = b.eq(lane, zero);
            b.if_then(first, |b| {
                let s = b.mul(d, s2);
                let at = b.fma(hl, sc_stride, jj);
                sts(b, sc_s, at, s);
            });
        });
        b.barrier();

        // Online softmax per head: new max, probabilities in place, rescale factor.
        b.if_then(head_lt, |b| {
            let row = b.mul(tid, sc_stride);
            let m_old = lds(b, m_s, tid);
            let mx = b.for_range(zero, n, one, &[m_old], |b, jj, acc| {
                let at = b.add(row, jj);
                let s = lds(b, sc_s, at);
                vec![combine(b, Combine::MaxNan, acc[0], s)]
            })[0];
            let sum = b.for_range(zero, n, one, &[zf], |b, jj, acc| {
                let at = b.add(row, jj);
                let s = lds(b, sc_s, at);
                let d = b.sub(s, mx);
                let e = b.ex2(d);
                sts(b, sc_s, at, e);
                vec![b.add(acc[0], e)]
            })[0];
            let d = b.sub(m_old, mx);
            let alpha = b.ex2(d);
            let l_old = lds(b, l_s, tid);
            let l_new = b.fma(l_old, alpha, sum);
            sts(b, l_s, tid, l_new);
            sts(b, m_s, tid, mx);
            sts(b, al_s, tid, alpha);
        });
        b.barrier();

        // acc[h, r] = acc[h, r] · alpha[h] + Σ_j p[h, j] · latent[j, r].
        b.for_each(tid, acc_len, threads, |b, i| {
            let hl = b.div(i, rank);
            let r = b.rem(i, rank);
            let alpha = lds(b, al_s, hl);
            let a = lds(b, acc_s, i);
            let a = b.mul(a, alpha);
            let row = b.mul(hl, sc_stride);
            let a = b.for_range(zero, n, one, &[a], |b, jj, acc| {
                let at = b.add(row, jj);
                let pj = lds(b, sc_s, at);
                let la = b.fma(jj, rank, r);
                let x = lds(b, lat_s, la);
                vec![b.fma(pj, x, acc[0])]
            })[0];
            sts(b, acc_s, i, a);
        });
        b.barrier();
    });

    match (p.out, p.workspace) {
        (Some(out), _) => {
            // out[query, h0 + hl, r] = acc / l, zeros for a query without keys.
            b.for_each(tid, acc_len, threads, |b, i| {
                let hl = b.div(i, rank);
                let l = lds(b, l_s, hl);
                let a = lds(b, acc_s, i);
                let any = b.gt(l, zf);
                let inv = b.rcp(l);
                let inv = b.select(any, inv, zf);
                let y = b.mul(a, inv);
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
                let a = lds(b, acc_s, i);
                store_from_f32(b, ws, at, a);
            });
            b.if_then(head_lt, |b| {
                let qh = b.mul(queries, heads);
                let all = b.mul(qh, splits);
                let stats = b.mul(all, rank);
                let row = b.add(q_row0, tid);
                let entry = b.fma(row, splits, split);
                let two = c32(b, 2);
                let at = b.fma(entry, two, stats);
                let m = lds(b, m_s, tid);
                let l = lds(b, l_s, tid);
                store_from_f32(b, ws, at, m);
                let at1 = b.add(at, one);
                store_from_f32(b, ws, at1, l);
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
        let zero = c32(b, 0);
        let one = c32(b, 1);
        let two = c32(b, 2);
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

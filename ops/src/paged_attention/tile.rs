//! The steps the fused paged attention and the paged MLA kernels share, one key tile at a time:
//! staging cache rows through the block table, a warp's dot product against a staged tile, the
//! online softmax over the score tile, and the rescaled `P · V` accumulation. Each step takes the
//! block's constants from the kernel, so both kernels emit what they emitted when each had its
//! own copy.

use ruda_ir::{KernelBuilder, Value};

use crate::blocks::{combine, load_f32, store_from_f32, Combine};

/// `base[index]`.
pub(super) fn load_at(b: &mut KernelBuilder, base: Value, index: Value) -> Value {
    let p = b.ptr_add(base, index);
    b.load(p)
}

/// `base[index] = v`.
pub(super) fn store_at(b: &mut KernelBuilder, base: Value, index: Value, v: Value) {
    let p = b.ptr_add(base, index);
    b.store(p, v);
}

/// What every step reads: the thread, the block's width, and the constants `0u32`, `1u32`,
/// `0f32` made once at the top of the kernel.
#[derive(Clone, Copy)]
pub(super) struct BlockValues {
    pub tid: Value,
    pub threads: Value,
    pub zero: Value,
    pub one: Value,
    pub zf: Value,
}

/// The shared-memory state of the online softmax: the score tile (rows `stride` apart), and per
/// row its running max, running sum and the last tile's rescale factor.
#[derive(Clone, Copy)]
pub(super) struct SoftmaxState {
    pub scores: Value,
    pub stride: Value,
    pub row_max: Value,
    pub row_sum: Value,
    pub alpha: Value,
}

/// Where one sequence's cache rows live: its block table row, the page size, and for a cache of
/// several kv heads `(kv_heads, this block's kv head)`.
#[derive(Clone, Copy)]
pub(super) struct PagedRows {
    pub tables: Value,
    pub table_row: Value,
    pub page_size: Value,
    pub heads: Option<(Value, Value)>,
}

/// Stage the `width` columns of keys `k0 .. k0 + n` of `src` (a paged cache) as `f32` into the
/// shared tile `dst` (`[n, width]`), read through the block table.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_keys(
    b: &mut KernelBuilder,
    v: BlockValues,
    rows: PagedRows,
    k0: Value,
    n: Value,
    src: Value,
    dst: Value,
    width: Value,
) {
    let elems = b.mul(n, width);
    b.for_each(v.tid, elems, v.threads, |b, i| {
        let jj = b.div(i, width);
        let col = b.rem(i, width);
        let key = b.add(k0, jj);
        let page_idx = b.div(key, rows.page_size);
        let slot = b.rem(key, rows.page_size);
        let tp = b.add(rows.table_row, page_idx);
        let page = load_at(b, rows.tables, tp);
        let cache_row = b.fma(page, rows.page_size, slot);
        let row = match rows.heads {
            Some((heads, head)) => b.fma(cache_row, heads, head),
            None => cache_row,
        };
        let at = b.fma(row, width, col);
        let x = load_f32(b, src, at);
        store_at(b, dst, i, x);
    });
}

/// `acc + Σ_r src[qrow, r] · tile[jj, r]` over `width` columns, this lane's share of them (the
/// caller reduces across the warp).
#[allow(clippy::too_many_arguments)]
pub(super) fn lane_dot(
    b: &mut KernelBuilder,
    (lane, warp_size): (Value, Value),
    src: Value,
    qrow: Value,
    tile: Value,
    jj: Value,
    width: Value,
    acc: Value,
) -> Value {
    let qbase = b.mul(qrow, width);
    let tbase = b.mul(jj, width);
    b.for_range(lane, width, warp_size, &[acc], |b, r, acc| {
        let qa = b.add(qbase, r);
        let x = load_f32(b, src, qa);
        let ta = b.add(tbase, r);
        let y = load_at(b, tile, ta);
        vec![b.fma(x, y, acc[0])]
    })[0]
}

/// The online softmax of row `tid` (where `live`) over the tile's `n` scores (log2 domain): the
/// new max, the probabilities in place of the scores, the rescale factor, the new sum. With
/// `masked` (the kernel's -inf constant) the scores may be -inf (a key past its row's end), and
/// a row whose max is still -inf (no live key yet) gets probabilities 0 and alpha 1, never NaN.
#[allow(clippy::too_many_arguments)]
pub(super) fn online_softmax(
    b: &mut KernelBuilder,
    v: BlockValues,
    s: SoftmaxState,
    live: Value,
    n: Value,
    masked: Option<Value>,
) {
    let BlockValues { tid, zero, one, zf, .. } = v;
    b.if_then(live, |b| {
        let row = b.mul(tid, s.stride);
        let m_old = load_at(b, s.row_max, tid);
        let mx = b.for_range(zero, n, one, &[m_old], |b, jj, acc| {
            let at = b.add(row, jj);
            let x = load_at(b, s.scores, at);
            vec![combine(b, Combine::MaxNan, acc[0], x)]
        })[0];
        let dead = masked.map(|ninf| b.eq(mx, ninf));
        let base = match dead {
            Some(dead) => b.select(dead, zf, mx),
            None => mx,
        };
        let sum = b.for_range(zero, n, one, &[zf], |b, jj, acc| {
            let at = b.add(row, jj);
            let x = load_at(b, s.scores, at);
            let d = b.sub(x, base);
            let e = b.ex2(d);
            store_at(b, s.scores, at, e);
            vec![b.add(acc[0], e)]
        })[0];
        let d = b.sub(m_old, base);
        let alpha = b.ex2(d);
        let alpha = match dead {
            Some(dead) => {
                let onef = b.const_f32(1.0);
                b.select(dead, onef, alpha)
            }
            None => alpha,
        };
        let l_old = load_at(b, s.row_sum, tid);
        let l_new = b.fma(l_old, alpha, sum);
        store_at(b, s.row_sum, tid, l_new);
        store_at(b, s.row_max, tid, mx);
        store_at(b, s.alpha, tid, alpha);
    });
}

/// `acc[row, c] = acc[row, c] · alpha[row] + Σ_j p[row, j] · tile[j, c]` over the `acc_len`
/// elements of the shared accumulator `acc` (`[rows, width]`) and the tile's `n` keys.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    b: &mut KernelBuilder,
    v: BlockValues,
    s: SoftmaxState,
    acc: Value,
    acc_len: Value,
    tile: Value,
    width: Value,
    n: Value,
) {
    let BlockValues { tid, threads, zero, one, .. } = v;
    b.for_each(tid, acc_len, threads, |b, i| {
        let hl = b.div(i, width);
        let c = b.rem(i, width);
        let alpha = load_at(b, s.alpha, hl);
        let a = load_at(b, acc, i);
        let a = b.mul(a, alpha);
        let row = b.mul(hl, s.stride);
        let a = b.for_range(zero, n, one, &[a], |b, jj, sum| {
            let at = b.add(row, jj);
            let pj = load_at(b, s.scores, at);
            let va = b.fma(jj, width, c);
            let x = load_at(b, tile, va);
            vec![b.fma(pj, x, sum[0])]
        })[0];
        store_at(b, acc, i, a);
    });
}

/// `acc / l`, or 0 for a row without keys (`l = 0`).
pub(super) fn normalize(b: &mut KernelBuilder, zf: Value, acc: Value, l: Value) -> Value {
    let any = b.gt(l, zf);
    let inv = b.rcp(l);
    let inv = b.select(any, inv, zf);
    b.mul(acc, inv)
}

/// Write row `tid`'s `(max, sum)` pair to the split workspace `ws` at pair `entry` of the
/// stats region starting at `stats`.
pub(super) fn store_stats(
    b: &mut KernelBuilder,
    v: BlockValues,
    s: SoftmaxState,
    ws: Value,
    stats: Value,
    entry: Value,
) {
    let two = b.const_u32(2);
    let at = b.fma(entry, two, stats);
    let m = load_at(b, s.row_max, v.tid);
    let l = load_at(b, s.row_sum, v.tid);
    store_from_f32(b, ws, at, m);
    let at1 = b.add(at, v.one);
    store_from_f32(b, ws, at1, l);
}

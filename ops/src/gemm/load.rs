//! The tensor-core GEMM's loads: tiles of `x` and `w` staged from global into shared memory in
//! 16-byte chunks, swizzled against bank conflicts ([`swizzle_chunk`] for `K`-major tiles,
//! [`swizzle_mn_chunk`] for tiles whose rows are `k`), through a ring of `cp.async` stages
//! (`k_loop`). The swizzles' arguments are in [`super::kernels::tc`].

use ruda_ir::{KernelBuilder, Value};

use super::tile::{GemmTile, BK};

/// 16-byte chunks (8 halves) per staged row.
pub(crate) const CHUNKS_PER_ROW: u32 = BK / 8;

/// The physical 16-byte chunk (0..4) of a row where logical chunk `chunk` of staged row `row`
/// lives (see the module documentation).
pub fn swizzle_chunk(row: u32, chunk: u32) -> u32 {
    chunk ^ ((row >> 1) & 3)
}

/// `chunk ^ ((row >> 1) & 3)` in the IR ([`swizzle_chunk`]).
#[track_caller]
pub(crate) fn swizzle(b: &mut KernelBuilder, row: Value, chunk: Value) -> Value {
    let one = b.const_u32(1);
    let s = b.shr(row, one);
    let three = b.const_u32(3);
    let s = b.and(s, three);
    b.xor(chunk, s)
}

/// The physical 16-byte chunk of a row where logical chunk `chunk` of staged row `row` lives
/// in a tile whose rows are `k` (at least 8 chunks wide; see the module documentation of
/// [`super::kernels::tc`]).
pub fn swizzle_mn_chunk(row: u32, chunk: u32) -> u32 {
    chunk ^ (row & 7)
}

/// `chunk ^ (row & 7)` in the IR ([`swizzle_mn_chunk`]).
#[track_caller]
pub(crate) fn swizzle_mn(b: &mut KernelBuilder, row: Value, chunk: Value) -> Value {
    let seven = b.const_u32(7);
    let s = b.and(row, seven);
    b.xor(chunk, s)
}

/// A 16-byte chunk a thread stages per k-tile.
pub(crate) struct Chunk {
    /// Element offset in its stage (swizzled).
    pub(crate) smem: Value,
    /// Global element index at `k = 0`, the row clamped into the matrix.
    pub(crate) gidx: Value,
    /// Whether the row exists.
    pub(crate) row_ok: Value,
    /// The chunk's first `k`.
    pub(crate) kc: Value,
    /// Elements between consecutive `k` in memory: `None` for 1 (a `K`-major row), the row
    /// stride where the matrix's rows are `k`.
    pub(crate) k_stride: Option<Value>,
    /// Where rows `k ≥ from_k` come from another matrix (see [`Segment`]).
    pub(crate) segment: Option<Segment>,
}

/// The `k` rows from `from_k` on of an operand stored as two matrices (split gate and up
/// weights): they live at `base`, `skip` elements before where the first matrix would put them.
#[derive(Clone, Copy)]
pub(crate) struct Segment {
    pub(crate) base: Value,
    pub(crate) from_k: Value,
    pub(crate) skip: Value,
}

/// Whether chunk `c` exists at `k0`, and its global element index there.
#[track_caller]
fn chunk_at(b: &mut KernelBuilder, c: &Chunk, k0: Value, k: Value) -> (Value, Value) {
    let gk = b.add(k0, c.kc);
    let k_ok = b.lt(gk, k);
    let ok = b.and(c.row_ok, k_ok);
    let idx = match c.k_stride {
        None => b.add(c.gidx, k0),
        Some(stride) => b.fma(k0, stride, c.gidx),
    };
    (ok, idx)
}

/// `tile.stages` shared stages in a ring, filled by `cp.async` (zero-filling chunks past the
/// matrix edges with a source size of 0). The prologue issues k-tiles `0..S-1`, one commit
/// group each; iteration `t` waits until tile `t`'s group is complete (at most `S - 2`
/// younger groups pending), and one barrier then makes every thread's copies of tile `t`
/// visible and guarantees that every warp has finished tile `t - 1`, whose stage the copies of
/// tile `t + S - 1` issued next overwrite while the mma consumes tile `t`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn k_loop(
    b: &mut KernelBuilder,
    tile: GemmTile,
    chunks: &[(bool, Chunk)],
    gmem: [Value; 2],
    smem: [Value; 2],
    k: Value,
    init: &[Value],
    mut compute: impl FnMut(&mut KernelBuilder, (Value, Value), &[Value]) -> Vec<Value>,
) -> Vec<Value> {
    let s = tile.stages;
    let (bm, bn) = tile.tile.dims();
    let stage_elems = [bm * BK, bn * BK].map(|e| b.const_u32(e));
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let (sixteen, last_stage) = (b.const_u32(16), b.const_u32(s - 1));
    let bk = b.const_u32(BK);
    // Issue the copies of the k-tile at `k0` into stage `stage`, then commit them as a group.
    let issue = |b: &mut KernelBuilder, stage: Value, k0: Value| {
        let bases = stage_elems.map(|e| b.mul(stage, e));
        for (is_x, c) in chunks {
            let op = if *is_x { 0 } else { 1 };
            let (ok, idx) = chunk_at(b, c, k0, k);
            let so = b.add(bases[op], c.smem);
            let dst = b.ptr_add(smem[op], so);
            // A chunk past the edge reads nothing from the matrix's first element.
            let idx = b.select(ok, idx, zero);
            let src = match c.segment {
                None => b.ptr_add(gmem[op], idx),
                Some(seg) => {
                    let gk = b.add(k0, c.kc);
                    let late = b.le(seg.from_k, gk);
                    let late = b.and(ok, late);
                    let base = b.select(late, seg.base, gmem[op]);
                    let moved = b.sub(idx, seg.skip);
                    let idx = b.select(late, moved, idx);
                    b.ptr_add(base, idx)
                }
            };
            let size = b.select(ok, sixteen, zero);
            b.cp_async_zfill(dst, src, 16, size);
        }
        b.cp_async_commit();
    };
    for t in 0..s - 1 {
        let stage = b.const_u32(t);
        let k0 = b.const_u32(t * BK);
        issue(b, stage, k0);
    }
    // Carried: the stage to read, the stage to fill, then the accumulators.
    let mut carried = vec![zero, last_stage];
    carried.extend_from_slice(init);
    let out = b.for_range(zero, k, bk, &carried, |b, k0, c| {
        let (rd, wr) = (c[0], c[1]);
        b.cp_async_wait((s - 2) as u8);
        b.barrier();
        let ahead = b.const_u32((s - 1) * BK);
        let k_next = b.add(k0, ahead);
        issue(b, wr, k_next);
        let stage = [0, 1].map(|op| {
            let o = b.mul(rd, stage_elems[op]);
            b.ptr_add(smem[op], o)
        });
        let acc = compute(b, (stage[0], stage[1]), &c[2..]);
        let next = |b: &mut KernelBuilder, v: Value| {
            let at_end = b.eq(v, last_stage);
            let inc = b.add(v, one);
            b.select(at_end, zero, inc)
        };
        let mut yields = vec![next(b, rd), next(b, wr)];
        yields.extend(acc);
        yields
    });
    out[2..].to_vec()
}

//! The pieces the flash kernels share (prefill and decode): small builder helpers, a lane's
//! runs of `q` and the accumulator, K/V tile staging, the chunked online-softmax core, and the
//! mask/bias staging that prefill and the fallback's softmax share.

use ruda_ir::{KernelBuilder, ScalarType, SharedId, Type, Value};

use super::geometry::*;
use crate::blocks::to_f32;

// ---- small builder helpers -------------------------------------------------------------------

#[track_caller]
pub(super) fn u32c(b: &mut KernelBuilder, v: u32) -> Value {
    b.const_u32(v)
}

#[track_caller]
pub(super) fn to_u64(b: &mut KernelBuilder, v: Value) -> Value {
    b.cvt(v, ScalarType::U64)
}

/// `a · b + c` in u64 (operands widened as needed).
#[track_caller]
pub(super) fn mad64(b: &mut KernelBuilder, a: Value, bb: Value, c: Value) -> Value {
    let a = if b.ty(a) == Type::U64 { a } else { to_u64(b, a) };
    let bb = if b.ty(bb) == Type::U64 { bb } else { to_u64(b, bb) };
    let c = if b.ty(c) == Type::U64 { c } else { to_u64(b, c) };
    b.fma(a, bb, c)
}

/// `base + x` with `x` u32 and `base` u64.
#[track_caller]
pub(super) fn add64(b: &mut KernelBuilder, x: Value, base: Value) -> Value {
    let x = to_u64(b, x);
    b.add(base, x)
}

/// `min(x, hi)` for u32.
#[track_caller]
pub(super) fn clamp_to(b: &mut KernelBuilder, x: Value, hi: Value) -> Value {
    b.min(x, hi)
}

/// Load 4 consecutive elements at `ptr + index` (u64 index) and widen them to f32.
#[track_caller]
pub(super) fn load4_f32(b: &mut KernelBuilder, ptr: Value, index: Value) -> [Value; 4] {
    let p = b.ptr_add(ptr, index);
    let v = b.load_vec(p, 4);
    [0u8, 1, 2, 3].map(|i| {
        let e = b.extract(v, i);
        to_f32(b, e)
    })
}

/// Round 4 f32 values to the pointee type of `ptr` and store them at `ptr + index`.
#[track_caller]
pub(super) fn store4_from_f32(b: &mut KernelBuilder, ptr: Value, index: Value, vals: &[Value]) {
    let elem = b.ty(ptr).elem();
    let vals: Vec<Value> = vals.iter().map(|&v| if elem == ScalarType::F32 { v } else { b.cvt(v, elem) }).collect();
    let v = b.make_vector(&vals);
    let p = b.ptr_add(ptr, index);
    b.store(p, v);
}

// ---- the shared flash core -------------------------------------------------------------------

/// Which dimensions of a 4-wide run exist: all of them (known when building), or those of
/// `dim + e < limit` (`dim`, the run's first, is per lane).
#[derive(Clone, Copy)]
pub(super) enum RunBound {
    All,
    Below { dim: Value, limit: u32 },
}

/// `dim + e < limit`.
pub(super) fn below(b: &mut KernelBuilder, dim: Value, e: u32, limit: u32) -> Value {
    let d = offset(b, dim, e);
    let lim = u32c(b, limit);
    b.lt(d, lim)
}

/// The 4 elements at `ptr + index` (u64) as f32, zeros where `bound` excludes them. With
/// `vector` one 4-wide load (the limit is then a multiple of 4: a run is all in or all out),
/// else one load per element.
pub(super) fn load4_bounded(
    b: &mut KernelBuilder,
    ptr: Value,
    index: Value,
    bound: RunBound,
    vector: bool,
) -> Vec<Value> {
    let zeros = |b: &mut KernelBuilder, n: usize| {
        let z = b.const_f32(0.0);
        vec![z; n]
    };
    match (bound, vector) {
        (RunBound::All, true) => load4_f32(b, ptr, index).to_vec(),
        (RunBound::Below { dim, limit }, true) => {
            let ok = below(b, dim, 0, limit);
            b.if_else(ok, |b| load4_f32(b, ptr, index).to_vec(), |b| zeros(b, 4))
        }
        (_, false) => (0..4u32)
            .map(|e| {
                let load = |b: &mut KernelBuilder| {
                    let c = b.const_u64(e as u64);
                    let i = b.add(index, c);
                    let p = b.ptr_add(ptr, i);
                    let x = b.load(p);
                    vec![to_f32(b, x)]
                };
                match bound {
                    RunBound::All => load(b)[0],
                    RunBound::Below { dim, limit } => {
                        let ok = below(b, dim, e, limit);
                        b.if_else(ok, load, |b| zeros(b, 1))[0]
                    }
                }
            })
            .collect(),
    }
}

/// Store 4 f32 values at `ptr + index` (u64), rounded to its element type, where `bound`
/// includes them (`vector` as [`load4_bounded`]).
pub(super) fn store4_bounded(
    b: &mut KernelBuilder,
    ptr: Value,
    index: Value,
    vals: &[Value],
    bound: RunBound,
    vector: bool,
) {
    match (bound, vector) {
        (RunBound::All, true) => store4_from_f32(b, ptr, index, vals),
        (RunBound::Below { dim, limit }, true) => {
            let ok = below(b, dim, 0, limit);
            b.if_then(ok, |b| store4_from_f32(b, ptr, index, vals));
        }
        (_, false) => {
            let elem = b.ty(ptr).elem();
            for (e, &v) in vals.iter().enumerate() {
                let store = |b: &mut KernelBuilder| {
                    let v = if elem == ScalarType::F32 { v } else { b.cvt(v, elem) };
                    let c = b.const_u64(e as u64);
                    let i = b.add(index, c);
                    let p = b.ptr_add(ptr, i);
                    b.store(p, v);
                };
                match bound {
                    RunBound::All => store(b),
                    RunBound::Below { dim, limit } => {
                        let ok = below(b, dim, e as u32, limit);
                        b.if_then(ok, store);
                    }
                }
            }
        }
    }
}

/// Where the calling lane sits: its query rows in the block and its place in their group.
pub(super) struct Lane {
    /// Rows of the block this lane works on (`(tid / G) · rows_per_lane + i`).
    pub(super) rows: Vec<Value>,
    /// Offset, within a row, of the lane's first dimension (`(tid % G) · 4`).
    pub(super) dim0: Value,
    /// Whether any row of the lane's warp is below the limit (else the warp skips the math).
    pub(super) warp_live: Value,
}

/// The lane of this thread; block row `r` is row `row_base + r` of a range of `row_limit`.
pub(super) fn lane(b: &mut KernelBuilder, geo: &Geometry, row_base: Value, row_limit: Value) -> Lane {
    let tid = b.thread_id_x();
    let shift = u32c(b, geo.group.trailing_zeros());
    let pair = b.shr(tid, shift);
    let rl = u32c(b, geo.rows_per_lane);
    let row0 = b.mul(pair, rl);
    let rows = (0..geo.rows_per_lane).map(|i| if i == 0 { row0 } else { offset(b, row0, i) }).collect();
    let mask = u32c(b, geo.group - 1);
    let g = b.and(tid, mask);
    let four = u32c(b, 4);
    let dim0 = b.mul(g, four);
    let warp_mask = u32c(b, !31);
    let warp_first = b.and(tid, warp_mask);
    let warp_pair = b.shr(warp_first, shift);
    let warp_row = b.mul(warp_pair, rl);
    let first = b.add(row_base, warp_row);
    let warp_live = b.lt(first, row_limit);
    Lane { rows, dim0, warp_live }
}

/// `v + c` (u32; `v` itself when `c` is 0).
#[track_caller]
pub(super) fn offset(b: &mut KernelBuilder, v: Value, c: u32) -> Value {
    if c == 0 {
        return v;
    }
    let c = u32c(b, c);
    b.add(v, c)
}

/// The row dimension of the lane's run `r`: `dim0 + r · 4G`.
pub(super) fn run_dim(b: &mut KernelBuilder, geo: &Geometry, lane: &Lane, r: u32) -> Value {
    offset(b, lane.dim0, r * 4 * geo.group)
}

/// Which dimensions of the lane's run `r` (first dimension `d`) a row of `dims` has.
pub(super) fn run_bound(geo: &Geometry, r: u32, d: Value, dims: u32) -> RunBound {
    if (r + 1) * 4 * geo.group <= dims {
        RunBound::All
    } else {
        RunBound::Below { dim: d, limit: dims }
    }
}

/// The lane's `runs` runs of a row of `dims` dimensions at `ptr + row_offset` (u64) as f32,
/// zeros past `dims` and where `ok` is false (the row is then never read).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_row(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    ptr: Value,
    row_offset: Value,
    ok: Value,
    (runs, dims): (u32, u32),
) -> Vec<Value> {
    b.if_else(
        ok,
        |b| {
            let mut vals = Vec::with_capacity(4 * runs as usize);
            for r in 0..runs {
                let d = run_dim(b, geo, lane, r);
                let idx = add64(b, d, row_offset);
                vals.extend(load4_bounded(b, ptr, idx, run_bound(geo, r, d, dims), geo.vector()));
            }
            vals
        },
        |b| {
            let z = b.const_f32(0.0);
            vec![z; 4 * runs as usize]
        },
    )
}

#[track_caller]
pub(super) fn u32c_64(b: &mut KernelBuilder, v: u64) -> Value {
    b.const_u64(v)
}

/// Store the lane's dimensions of a row of `Dv` at `ptr + row_offset` (u64).
pub(super) fn store_row(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    ptr: Value,
    row_offset: Value,
    vals: &[Value],
) {
    for r in 0..geo.runs_v {
        let d = run_dim(b, geo, lane, r);
        let idx = add64(b, d, row_offset);
        let bound = run_bound(geo, r, d, geo.v_head_dim);
        store4_bounded(b, ptr, idx, &vals[(r * 4) as usize..(r * 4 + 4) as usize], bound, geo.vector());
    }
}

/// The online-softmax state of one of a lane's rows: running max and sum (log2 domain) and
/// the lane's accumulator dimensions.
pub(super) struct RowState {
    pub(super) m: Value,
    pub(super) l: Value,
    pub(super) acc: Vec<Value>,
}

impl RowState {
    pub(super) fn init(b: &mut KernelBuilder, geo: &Geometry) -> RowState {
        let m = b.const_f32(f32::NEG_INFINITY);
        let l = b.const_f32(0.0);
        let z = b.const_f32(0.0);
        RowState { m, l, acc: vec![z; 4 * geo.runs_v as usize] }
    }
}

/// The lane's row states flattened into loop-carried values, and back.
pub(super) fn flatten(states: &[RowState]) -> Vec<Value> {
    states
        .iter()
        .flat_map(|st| {
            let mut v = vec![st.m, st.l];
            v.extend(&st.acc);
            v
        })
        .collect()
}

pub(super) fn unflatten(geo: &Geometry, v: &[Value]) -> Vec<RowState> {
    let state_len = 2 + 4 * geo.runs_v as usize;
    v.chunks(state_len).map(|c| RowState { m: c[0], l: c[1], acc: c[2..].to_vec() }).collect()
}

/// The key/value source of the flash core.
pub(super) struct KeySource {
    pub(super) k: Value,
    pub(super) v: Value,
    /// u64 element offset of key 0 of this (sequence, kv head) in `k`, and the u64 stride
    /// between keys.
    pub(super) base: Value,
    pub(super) stride: Value,
    /// The same for `v` (`base` and `stride` again when `Dv = D`).
    pub(super) v_base: Value,
    pub(super) v_stride: Value,
}

/// How the block copies a tile of keys (rows of `dims` elements, staged `width` wide with
/// zeros past `dims`) to shared memory.
pub(super) enum Staging {
    /// Thread `t` takes column run `t % (width/4)` of tile rows `row0 + r · rows_per_pass`,
    /// `r < passes`: one column per thread, so the addresses advance by constant strides.
    /// For rows of at most [`THREADS`] runs; threads past the last whole row of a pass idle.
    Columns {
        row0: Value,
        /// `4 · (t % (width/4))` as u64 (the element offset within a global row).
        col64: Value,
        /// Shared index of the thread's first element (`row0 · width + col`).
        shared0: Value,
        width: u32,
        rows_per_pass: u32,
        passes: u32,
        /// `rows_per_pass · key stride` (u64).
        global_step: Value,
        bound: RunBound,
        /// Whether the thread has a row of its own (`row0 < rows_per_pass`), where some idle.
        active: Option<Value>,
    },
    /// Pass `i` of thread `t` takes run `e = t + i · THREADS` of the tile (row `e / (width/4)`),
    /// for rows wider than the block.
    Flat { dims: u32, width: u32 },
}

impl Staging {
    pub(super) fn new(b: &mut KernelBuilder, geo: &Geometry, (dims, width): (u32, u32), stride: Value) -> Staging {
        let runs_per_row = width / 4;
        if runs_per_row > THREADS {
            return Staging::Flat { dims, width };
        }
        let rows_per_pass = THREADS / runs_per_row;
        let tid = b.thread_id_x();
        let (row0, c4) = if runs_per_row.is_power_of_two() {
            let shift = u32c(b, runs_per_row.trailing_zeros());
            let row0 = b.shr(tid, shift);
            let mask = u32c(b, runs_per_row - 1);
            (row0, b.and(tid, mask))
        } else {
            let row0 = div_const(b, tid, runs_per_row, THREADS);
            let rpr = u32c(b, runs_per_row);
            let whole = b.mul(row0, rpr);
            (row0, b.sub(tid, whole))
        };
        let four = u32c(b, 4);
        let col = b.mul(c4, four);
        let col64 = to_u64(b, col);
        let dd = u32c(b, width);
        let shared0 = b.fma(row0, dd, col);
        let rpp = b.const_u64(rows_per_pass as u64);
        let global_step = b.mul(rpp, stride);
        let bound = if dims == width { RunBound::All } else { RunBound::Below { dim: col, limit: dims } };
        let active = (rows_per_pass * runs_per_row < THREADS).then(|| {
            let rpp = u32c(b, rows_per_pass);
            b.lt(row0, rpp)
        });
        Staging::Columns {
            row0,
            col64,
            shared0,
            width,
            rows_per_pass,
            passes: geo.keys.div_ceil(rows_per_pass),
            global_step,
            bound,
            active,
        }
    }

    /// Stage the tile of keys from `k0` (zeros past `end`) of each `(tensor, shared tile)`
    /// pair, all of this staging's shape, rows `base + key · stride` (u64).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage(
        &self,
        b: &mut KernelBuilder,
        geo: &Geometry,
        (k0, end): (Value, Value),
        (base, stride): (Value, Value),
        pairs: &[(Value, Value)],
    ) {
        let vector = geo.vector();
        let load = |b: &mut KernelBuilder, ok: Value, ptr: Value, off: Value, bound: RunBound| {
            let vals = b.if_else(
                ok,
                |b| load4_bounded(b, ptr, off, bound, vector),
                |b| {
                    let z = b.const_f32(0.0);
                    vec![z; 4]
                },
            );
            b.make_vector(&vals)
        };
        // Stores under `guard` where there is one.
        let store = |b: &mut KernelBuilder, guard: Option<Value>, p: Value, v: Value| match guard {
            Some(g) => b.if_then(g, |b| b.store(p, v)),
            None => b.store(p, v),
        };
        match *self {
            Staging::Columns { row0, col64, shared0, width, rows_per_pass, passes, global_step, bound, active } => {
                let mut key = b.add(k0, row0);
                let row = mad64(b, key, stride, base);
                let mut off = b.add(row, col64);
                for r in 0..passes {
                    if r > 0 {
                        key = offset(b, key, rows_per_pass);
                        off = b.add(off, global_step);
                    }
                    // The thread's row of this pass exists (only the last pass can run past
                    // the tile).
                    let mut guard = active;
                    if (r + 1) * rows_per_pass > geo.keys {
                        let tile_row = offset(b, row0, r * rows_per_pass);
                        let keys = u32c(b, geo.keys);
                        let in_tile = b.lt(tile_row, keys);
                        guard = Some(match guard {
                            Some(g) => b.and(g, in_tile),
                            None => in_tile,
                        });
                    }
                    let mut ok = b.lt(key, end);
                    if let Some(g) = guard {
                        ok = b.and(ok, g);
                    }
                    for &(ptr, smem) in pairs {
                        let v = load(b, ok, ptr, off, bound);
                        let p = b.ptr_add(smem, shared0);
                        let p = if r == 0 {
                            p
                        } else {
                            let c = u32c(b, r * rows_per_pass * width);
                            b.ptr_add(p, c)
                        };
                        store(b, guard, p, v);
                    }
                }
            }
            Staging::Flat { dims, width } => {
                let runs_per_row = width / 4;
                let total = geo.keys * runs_per_row;
                let tid = b.thread_id_x();
                let passes = total.div_ceil(THREADS);
                for i in 0..passes {
                    let e = offset(b, tid, i * THREADS);
                    let row = div_const(b, e, runs_per_row, passes * THREADS);
                    let rpr = u32c(b, runs_per_row);
                    let whole = b.mul(row, rpr);
                    let c4 = b.sub(e, whole);
                    let four = u32c(b, 4);
                    let col = b.mul(c4, four);
                    let key = b.add(k0, row);
                    let mut ok = b.lt(key, end);
                    // Only the last pass can run past the tile.
                    let in_tile = ((i + 1) * THREADS > total).then(|| {
                        let t = u32c(b, total);
                        b.lt(e, t)
                    });
                    if let Some(t) = in_tile {
                        ok = b.and(ok, t);
                    }
                    let row_off = mad64(b, key, stride, base);
                    let off = add64(b, col, row_off);
                    let bound = if dims == width { RunBound::All } else { RunBound::Below { dim: col, limit: dims } };
                    for &(ptr, smem) in pairs {
                        let v = load(b, ok, ptr, off, bound);
                        // Run `e` of the tile starts at shared element `4e`.
                        let at = b.mul(e, four);
                        let p = b.ptr_add(smem, at);
                        store(b, in_tile, p, v);
                    }
                }
            }
        }
    }
}

/// `x / divisor` for `x < bound` (u32), as a shift or a multiply and a shift: a division by
/// a constant that is not a power of two becomes a subroutine in SASS, with a stack frame.
pub(super) fn div_const(b: &mut KernelBuilder, x: Value, divisor: u32, bound: u32) -> Value {
    if divisor.is_power_of_two() {
        let s = u32c(b, divisor.trailing_zeros());
        return b.shr(x, s);
    }
    // The smallest shift whose rounded-up reciprocal is exact below the bound, in u32.
    let (m, s) = (1..32u32)
        .map(|s| ((1u64 << s).div_ceil(divisor as u64), s))
        .find(|&(m, s)| {
            (bound as u64) * m <= u32::MAX as u64 && (0..bound as u64).all(|x| (x * m) >> s == x / divisor as u64)
        })
        .expect("a 16-bit multiplier suffices below 2^15");
    let m = u32c(b, m as u32);
    let p = b.mul(x, m);
    let s = u32c(b, s);
    b.shr(p, s)
}

/// Masking of one score: `(b, row i of the lane, key, tile column j, s)` → the score, or `-inf`
/// where that row may not attend `key`.
pub(super) type MaskScore<'a> = &'a dyn Fn(&mut KernelBuilder, usize, Value, Value, Value) -> Value;

/// Extra per-tile staging `(b, k0)`, run by every thread before the tile's barrier.
pub(super) type StageExtra<'a> = Option<&'a dyn Fn(&mut KernelBuilder, Value)>;

/// Run the flash loop over keys `[begin, end)` (uniform u32 values) for the lane's rows, whose
/// `q` dimensions (pre-scaled into the log2 domain) are `q[i]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_core(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    tiles: (SharedId, SharedId),
    src: &KeySource,
    q: &[Vec<Value>],
    begin: Value,
    end: Value,
    mask_score: MaskScore<'_>,
    stage_extra: StageExtra<'_>,
) -> Vec<RowState> {
    let k_s = b.shared_ptr(tiles.0);
    let v_s = b.shared_ptr(tiles.1);
    let bc = u32c(b, geo.keys);
    // With `Dv = D`, one staging copies both tiles, interleaved; else one each.
    let shared = geo.head_dim == geo.v_head_dim;
    let stage_k = Staging::new(b, geo, (geo.head_dim, geo.width_k()), src.stride);
    let stage_v = (!shared).then(|| Staging::new(b, geo, (geo.v_head_dim, geo.width_v()), src.v_stride));
    let init: Vec<RowState> = (0..geo.rows_per_lane).map(|_| RowState::init(b, geo)).collect();
    let out = b.for_range(begin, end, bc, &flatten(&init), |b, k0, carried| {
        // Stage the tile: BC rows of K and V as f32, zeros past `end` and past the head dims.
        match &stage_v {
            None => stage_k.stage(b, geo, (k0, end), (src.base, src.stride), &[(src.k, k_s), (src.v, v_s)]),
            Some(stage_v) => {
                stage_k.stage(b, geo, (k0, end), (src.base, src.stride), &[(src.k, k_s)]);
                stage_v.stage(b, geo, (k0, end), (src.v_base, src.v_stride), &[(src.v, v_s)]);
            }
        }
        if let Some(extra) = stage_extra {
            extra(b, k0);
        }
        b.barrier();
        let chunk = u32c(b, CHUNK);
        let zero = u32c(b, 0);
        // A warp whose rows are all out of range skips the arithmetic (whole warps, so the
        // shuffles inside still see every lane).
        let state = b.if_else(
            lane.warp_live,
            |b| {
                b.for_range(zero, bc, chunk, carried, |b, jc, carried| {
                    let st = unflatten(geo, carried);
                    flatten(&chunk_step(b, geo, lane, (k_s, v_s), q, k0, jc, st, mask_score))
                })
            },
            |_| carried.to_vec(),
        );
        // The tiles are overwritten next iteration only after every thread has read them.
        b.barrier();
        state
    });
    unflatten(geo, &out)
}

/// One chunk of `CHUNK` keys starting at tile row `jc` (tile starting at key `k0`).
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_step(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    (k_s, v_s): (Value, Value),
    q: &[Vec<Value>],
    k0: Value,
    jc: Value,
    st: Vec<RowState>,
    mask_score: MaskScore<'_>,
) -> Vec<RowState> {
    let rl = geo.rows_per_lane as usize;
    let (wk, wv) = (geo.width_k(), geo.width_v());
    let dd = u32c(b, wk);
    // One base pointer per tile and chunk; every element is then a constant offset from it.
    let first = b.fma(jc, dd, lane.dim0);
    let k_base = b.ptr_add(k_s, first);
    let v_base = if wv == wk {
        b.ptr_add(v_s, first)
    } else {
        let dv = u32c(b, wv);
        let first_v = b.fma(jc, dv, lane.dim0);
        b.ptr_add(v_s, first_v)
    };
    let at = |b: &mut KernelBuilder, base: Value, width: u32, jj: u32, r: u32| {
        let off = jj * width + r * 4 * geo.group;
        if off == 0 {
            base
        } else {
            let c = u32c(b, off);
            b.ptr_add(base, c)
        }
    };
    // Partial dot products over the lane's dimensions, each K element used by every row.
    let mut scores: Vec<Vec<Value>> = (0..rl).map(|_| Vec::with_capacity(CHUNK as usize)).collect();
    for jj in 0..CHUNK {
        let zero = b.const_f32(0.0);
        let mut s = vec![zero; rl];
        for r in 0..geo.runs_k {
            let p = at(b, k_base, wk, jj, r);
            let kv = b.load_vec(p, 4);
            for e in 0..4u8 {
                let x = b.extract(kv, e);
                for (i, si) in s.iter_mut().enumerate() {
                    *si = b.fma(q[i][(r * 4) as usize + e as usize], x, *si);
                }
            }
        }
        for (i, si) in s.into_iter().enumerate() {
            scores[i].push(si);
        }
    }
    // Butterfly over the group (every lane of the group ends with the same sums), masking,
    // and each row's online-softmax rescale.
    let mut probs = Vec::with_capacity(rl);
    let mut next = Vec::with_capacity(rl);
    for (i, (row_scores, st)) in scores.into_iter().zip(st).enumerate() {
        let mut masked = Vec::with_capacity(CHUNK as usize);
        for (jj, mut s) in row_scores.into_iter().enumerate() {
            let mut m = geo.group / 2;
            while m >= 1 {
                let other = b.shfl_xor(s, m);
                s = b.add(s, other);
                m /= 2;
            }
            let j = offset(b, jc, jj as u32);
            let key = b.add(k0, j);
            masked.push(mask_score(b, i, key, j, s));
        }
        let mut cmax = masked[0];
        for &s in &masked[1..] {
            cmax = b.max(cmax, s);
        }
        let m_new = b.max(st.m, cmax);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        let none = b.eq(m_new, ninf);
        let zero_f = b.const_f32(0.0);
        // With nothing attended yet, shift by 0 so that ex2(-inf - 0) = 0 instead of NaN.
        let m_use = b.select(none, zero_f, m_new);
        let dm = b.sub(st.m, m_use);
        let alpha = b.ex2(dm);
        let mut l = b.mul(st.l, alpha);
        let acc: Vec<Value> = st.acc.iter().map(|&a| b.mul(a, alpha)).collect();
        let p: Vec<Value> = masked
            .iter()
            .map(|&s| {
                let ds = b.sub(s, m_use);
                let p = b.ex2(ds);
                l = b.add(l, p);
                p
            })
            .collect();
        probs.push(p);
        next.push(RowState { m: m_new, l, acc });
    }
    // acc += p · v, each V element used by every row.
    for jj in 0..CHUNK as usize {
        for r in 0..geo.runs_v {
            let ptr = at(b, v_base, wv, jj as u32, r);
            let vv = b.load_vec(ptr, 4);
            for e in 0..4u8 {
                let x = b.extract(vv, e);
                for (st, p) in next.iter_mut().zip(&probs) {
                    let a = &mut st.acc[(r * 4) as usize + e as usize];
                    *a = b.fma(p[jj], x, *a);
                }
            }
        }
    }
    next
}

/// Declare the two f32 tiles (rows at the padded widths).
pub(super) fn tiles(b: &mut KernelBuilder, geo: &Geometry) -> (SharedId, SharedId) {
    (
        b.shared_array("k_tile", ScalarType::F32, geo.keys * geo.width_k()),
        b.shared_array("v_tile", ScalarType::F32, geo.keys * geo.width_v()),
    )
}

/// Load the lane's q dimensions of a row and scale them into the log2 domain.
#[allow(clippy::too_many_arguments)]
pub(super) fn load_q(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    q: Value,
    offset: Value,
    ok: Value,
    scale_log2: Value,
) -> Vec<Value> {
    let raw = load_row(b, geo, lane, q, offset, ok, (geo.runs_k, geo.head_dim));
    raw.iter().map(|&x| b.mul(x, scale_log2)).collect()
}

/// `scale · log2 e`: scores then live in the log2 domain of `ex2`.
pub(super) fn log2_scale(b: &mut KernelBuilder, scale: Value) -> Value {
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    b.mul(scale, log2e)
}

/// `acc / l`, or zeros when `l = 0` (nothing attended).
pub(super) fn normalize(b: &mut KernelBuilder, st: &RowState) -> Vec<Value> {
    let zero = b.const_f32(0.0);
    let any = b.gt(st.l, zero);
    let r = b.rcp(st.l);
    let inv = b.select(any, r, zero);
    st.acc.iter().map(|&a| b.mul(a, inv)).collect()
}

/// Mask (u8) and bias (f32) with their (batch, head, query, key) strides.
pub(super) struct MaskBias {
    pub(super) mask: Value,
    pub(super) bias: Value,
    pub(super) mask_strides: [Value; 4],
    pub(super) bias_strides: [Value; 4],
}

/// The values of a group of optional parameters, declared together (all `Some`) or not at all.
pub(super) fn declared<const N: usize>(values: [Option<Value>; N]) -> Option<[Value; N]> {
    values.iter().all(Option::is_some).then(|| values.map(|v| v.expect("every value is declared")))
}

/// The mask and bias parameters with their (batch, head, query, key) strides, when declared.
pub(super) fn mask_bias(
    tensors: Option<(Value, Value)>,
    mask_strides: [Option<Value>; 4],
    bias_strides: [Option<Value>; 4],
) -> Option<MaskBias> {
    let ((mask, bias), (mask_strides, bias_strides)) =
        tensors.zip(declared(mask_strides).zip(declared(bias_strides)))?;
    Some(MaskBias { mask, bias, mask_strides, bias_strides })
}

/// Row stride of the staged bias tile: `BC + 1`, so that the groups of a warp, which read
/// different rows of one column, hit different banks.
pub(super) fn bias_stride(geo: &Geometry) -> u32 {
    geo.keys + 1
}

/// Stage, for the block's query rows (those below `q_len`) and the tile's `BC` keys,
/// `bias · log2 e` where the mask allows the pair and `-inf` where it does not, into `tile`
/// (f32, rows of [`bias_stride`]). Keys past `kv_len` are staged as `-inf` without reading mask
/// or bias, whose offsets are clamped to element 0 so every load stays in bounds; rows past
/// `q_len` are not staged (their scores are discarded).
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_mask_bias(
    b: &mut KernelBuilder,
    geo: &Geometry,
    mb: &MaskBias,
    tile: SharedId,
    (seq, head): (Value, Value),
    (q0, q_len): (Value, Value),
    (k0, kv_len): (Value, Value),
) {
    let tid = b.thread_id_x();
    let smem = b.shared_ptr(tile);
    let z64 = u32c_64(b, 0);
    let base = |b: &mut KernelBuilder, st: &[Value; 4]| {
        let a = mad64(b, seq, st[0], z64);
        mad64(b, head, st[1], a)
    };
    let mask_base = base(b, &mb.mask_strides);
    let bias_base = base(b, &mb.bias_strides);
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let cols_shift = u32c(b, geo.keys.trailing_zeros());
    let cols_mask = u32c(b, geo.keys - 1);
    let stride = u32c(b, bias_stride(geo));
    // Only the rows that exist (a loop with a run-time bound, so it stays a loop: unrolled, its
    // independent global loads would all be in flight at once and exhaust the registers).
    let left = b.sub(q_len, q0);
    let br = u32c(b, geo.rows);
    let rows = b.min(left, br);
    let bc = u32c(b, geo.keys);
    let elems = b.mul(rows, bc);
    let step = u32c(b, THREADS);
    b.for_each(tid, elems, step, |b, e| {
        let i = b.shr(e, cols_shift);
        let j = b.and(e, cols_mask);
        let qi = b.add(q0, i);
        let key = b.add(k0, j);
        let valid = b.lt(key, kv_len);
        let at = |b: &mut KernelBuilder, base: Value, st: &[Value; 4]| {
            let a = mad64(b, qi, st[2], base);
            let a = mad64(b, key, st[3], a);
            b.select(valid, a, z64)
        };
        let mi = at(b, mask_base, &mb.mask_strides);
        let bi = at(b, bias_base, &mb.bias_strides);
        let mp = b.ptr_add(mb.mask, mi);
        let m = b.load(mp);
        let bp = b.ptr_add(mb.bias, bi);
        let bias = b.load(bp);
        let x = b.mul(bias, log2e);
        // PTX compares no 8-bit integers: widen first.
        let m = b.cvt(m, ScalarType::U32);
        let zero = u32c(b, 0);
        let allowed = b.ne(m, zero);
        let ok = b.and(valid, allowed);
        let x = b.select(ok, x, ninf);
        let s_idx = b.fma(i, stride, j);
        let p = b.ptr_add(smem, s_idx);
        b.store(p, x);
    });
}

/// The u64 element offset `b·s0 + h·s1 + i·s2` of a (sequence, head, query) row.
pub(super) fn mb_row(b: &mut KernelBuilder, strides: &[Value; 4], seq: Value, head: Value, row: Value) -> Value {
    let z = u32c_64(b, 0);
    let a = mad64(b, seq, strides[0], z);
    let a = mad64(b, head, strides[1], a);
    mad64(b, row, strides[2], a)
}

/// Apply mask and bias to a log2-domain score `s` of an in-range `(row, key)` (`valid`); the
/// offsets are clamped to element 0 elsewhere so that every load stays in bounds.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_mask_bias(
    b: &mut KernelBuilder,
    mb: &MaskBias,
    mask_row: Value,
    bias_row: Value,
    key: Value,
    valid: Value,
    s: Value,
) -> Value {
    let z64 = u32c_64(b, 0);
    let mi = mad64(b, key, mb.mask_strides[3], mask_row);
    let mi = b.select(valid, mi, z64);
    let bi = mad64(b, key, mb.bias_strides[3], bias_row);
    let bi = b.select(valid, bi, z64);
    let mp = b.ptr_add(mb.mask, mi);
    let m = b.load(mp);
    let bp = b.ptr_add(mb.bias, bi);
    let bias = b.load(bp);
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let s = b.fma(bias, log2e, s);
    // PTX compares no 8-bit integers: widen first.
    let m = b.cvt(m, ScalarType::U32);
    let zero = u32c(b, 0);
    let allowed = b.ne(m, zero);
    let ok = b.and(valid, allowed);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    b.select(ok, s, ninf)
}

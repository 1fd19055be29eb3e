//! Attention: a SIMT flash-attention forward for prefill (packed variable-length batches, GQA,
//! causal or not, optional mask and bias), split-KV decode over a contiguous KV cache with its
//! combine kernel, and the masked softmax of the multi-kernel fallback.
//!
//! # The flash kernels
//!
//! One block of [`THREADS`] threads handles a tile of `BR` query rows of one head of one
//! sequence (decode: the query heads of one GQA group, for one split of the keys). Each pair of
//! query rows belongs to a group of `G = D / 16` consecutive lanes; each lane keeps 16 of each
//! row's dimensions of `q` (pre-scaled by `scale · log2 e`) and of the output accumulator in
//! registers, as 4 runs of 4 dimensions strided by `4 G` (so a group reads 16-byte runs side by
//! side and the other groups of the warp read the same addresses, a broadcast). Keys and values
//! are staged through shared memory as `f32` in tiles of `BC` rows (`BC · D = 2048`: 16 KiB for
//! both); every element a lane reads from there feeds both of its rows, which halves the
//! shared-memory traffic that bounds a SIMT attention. A tile is consumed in chunks of
//! [`CHUNK`] keys: partial dot products, a butterfly sum over the group's lanes (so every lane
//! holds the same scores bit for bit), masking, then the online softmax update in the log2
//! domain (running max `m`, running sum `l`, accumulator rescaled by `ex2(m_old - m_new)`) and
//! `acc += p · v`. With a mask or bias, `bias · log2 e` (or `-inf` where the mask forbids) is
//! staged per tile too, as a `BR × BC` f32 tile. Statistics and accumulation are `f32`
//! whatever the input dtype; `ex2` is PTX's approximate one, so results are compared with
//! tolerances.
//!
//! Tiles and chunks are sized so that every configuration stays within 128 registers without
//! spills (`rudac check`), i.e. four blocks of 128 threads per SM.
//!
//! A row without any key to attend (all masked, an empty sequence, a decode split past the
//! sequence's end) has `l = 0` and produces zeros.

use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, SharedId, SpecialReg, Type, Value, VerifyError};

use super::common::{block_reduce, combine, identity, to_f32, Combine};

/// Threads per block of the flash kernels (prefill and decode).
pub const THREADS: u32 = 128;
/// Keys per online-softmax step (scores live in registers for one chunk at a time).
pub const CHUNK: u32 = 4;
/// Elements of one staged tile (`BC · D`): K and V tiles take 16 KiB of shared memory, and
/// each thread has 4 vector loads per tensor in flight (more made ptxas spill on sm_80).
const TILE_ELEMS: u32 = 2048;
/// Query rows per lane: each K or V element read from shared memory feeds this many FMAs.
const ROWS_PER_LANE: u32 = 2;
/// Dimensions of each of its rows a lane owns (`ROWS_PER_LANE · DIMS_PER_ROW = 32` registers of
/// `q` and of the accumulator).
const DIMS_PER_ROW: u32 = 16;
/// Head dimensions the flash kernels are built for.
pub const FLASH_HEAD_DIMS: [u32; 3] = [64, 128, 256];
/// Threads per block of the fallback softmax.
pub const SOFTMAX_THREADS: u32 = 256;

/// The tile shape for a head dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub head_dim: u32,
    /// Lanes sharing a pair of query rows (each owning 16 of the row's dimensions).
    pub group: u32,
    /// Query rows per block.
    pub rows: u32,
    /// Keys per shared-memory tile.
    pub keys: u32,
}

impl Geometry {
    pub fn new(head_dim: u32) -> Geometry {
        let group = head_dim / DIMS_PER_ROW;
        Geometry { head_dim, group, rows: THREADS / group * ROWS_PER_LANE, keys: TILE_ELEMS / head_dim }
    }

    /// 4-wide runs of a row each lane owns.
    fn runs(&self) -> u32 {
        DIMS_PER_ROW / 4
    }
}

/// A flash prefill configuration. Parameters, in order:
/// `q, k, v, out` (dtype), `cu_q, cu_k` (u32, `batch + 1` cumulative lengths), then with
/// `masked` `mask` (u8, nonzero = may attend) and `bias` (f32, added to the scaled scores),
/// then `scale: f32`, `total_q, total_k, group: u32` (rows of `q`, rows of `k`, `Hq / Hkv`), the
/// element strides `q_token, q_head, q_batch, k_token, k_head, k_batch: u64` (`out` has `q`'s,
/// `v` has `k`'s), then with `masked` the strides `(batch, head, query, key)` of mask and bias
/// (u64; 0 broadcasts). Element `(seq b, position t, head h, dim d)` of `q` lives at
/// `(cu_q[b] + t) · q_token + h · q_head + b · q_batch + d`, so a packed `[T, H, D]` tensor has
/// strides `(H·D, D, 0)` and a batched `[B, H, T, D]` one `(D, T·D, (H-1)·T·D)` with
/// `cu_q = [0, T, 2T, ...]`. With [`KvSource::Cache`], `cu_k` is `seq_lens` (u32 `[batch]`)
/// and sequence `b`'s keys are positions `0..seq_lens[b]` (clamped to `total_k`) of its cache
/// rows: a `[B, Hkv, S_max, D]` cache has strides `(D, S_max·D, Hkv·S_max·D)`.
/// Launch: grid `(ceil(max_q / rows), Hq, batch)`, [`THREADS`] threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionPrefillConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
    pub causal: bool,
    pub masked: bool,
    pub kv: KvSource,
}

/// Where the prefill kernel finds each sequence's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvSource {
    /// Packed rows `cu_k[b]..cu_k[b + 1]` (flash-attn's varlen layout).
    Packed,
    /// The first `seq_lens[b]` positions of sequence `b`'s rows of a KV cache.
    Cache,
}

impl AttentionPrefillConfig {
    pub fn id(&self) -> String {
        let causal = if self.causal { ".causal" } else { "" };
        let masked = if self.masked { ".masked" } else { "" };
        let cache = if self.kv == KvSource::Cache { ".cache" } else { "" };
        format!("attention_prefill.{}.d{}{causal}{masked}{cache}", self.dtype, self.head_dim)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim)
    }
}

/// A split-KV decode configuration (the partial kernel). Parameters: `q` (`[B, Hq, D]`),
/// `k_cache, v_cache` (`[B, Hkv, S_max, D]`), `seq_lens` (u32 `[B]`, clamped to `S_max`),
/// `workspace` (f32, see [`decode_workspace_len`]), `scale: f32`, `s_max, kv_heads, group,
/// split_len: u32`. Launch: grid `(splits, Hkv · ceil(group / rows), B)`, [`THREADS`] threads;
/// split `s` covers keys `[s · split_len, (s + 1) · split_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionDecodeConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
}

impl AttentionDecodeConfig {
    pub fn id(&self) -> String {
        format!("attention_decode.{}.d{}", self.dtype, self.head_dim)
    }
    pub fn combine_id(&self) -> String {
        format!("attention_decode_combine.{}.d{}", self.dtype, self.head_dim)
    }
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim)
    }
}

/// Elements of the decode workspace: per (sequence, query head, split) an `f32` accumulator of
/// `D` elements (first region), and a `(max, sum)` pair (second region).
pub fn decode_workspace_len(batch: usize, q_heads: usize, head_dim: usize, splits: usize) -> usize {
    batch * q_heads * splits * (head_dim + 2)
}

/// The fallback's masked softmax over f32 scores `[T, S]` of one (sequence, head).
/// Parameters: `scores, probs` (f32 `[T, S]`), with `masked` `mask` (u8) and `bias` (f32),
/// then `scale: f32`, `q_len, kv_len: u32`, with `masked` `batch, head: u32` and the strides
/// `(batch, head, query, key)` of mask and bias (u64). `probs = softmax(scores · scale + bias)`
/// over the keys each query may attend (causal: aligned to the end), zeros for a row with none.
/// Launch: grid `(T)`, [`SOFTMAX_THREADS`] threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionSoftmaxConfig {
    pub causal: bool,
    pub masked: bool,
}

impl AttentionSoftmaxConfig {
    pub fn id(&self) -> String {
        let causal = if self.causal { ".causal" } else { "" };
        let masked = if self.masked { ".masked" } else { "" };
        format!("attention_softmax.f32{causal}{masked}")
    }
}

// ---- small builder helpers -------------------------------------------------------------------

#[track_caller]
fn u32c(b: &mut KernelBuilder, v: u32) -> Value {
    b.const_u32(v)
}

#[track_caller]
fn to_u64(b: &mut KernelBuilder, v: Value) -> Value {
    b.cvt(v, ScalarType::U64)
}

/// `a · b + c` in u64 (operands widened as needed).
#[track_caller]
fn mad64(b: &mut KernelBuilder, a: Value, bb: Value, c: Value) -> Value {
    let a = if b.ty(a) == Type::U64 { a } else { to_u64(b, a) };
    let bb = if b.ty(bb) == Type::U64 { bb } else { to_u64(b, bb) };
    let c = if b.ty(c) == Type::U64 { c } else { to_u64(b, c) };
    b.fma(a, bb, c)
}

/// `base + x` with `x` u32 and `base` u64.
#[track_caller]
fn add64(b: &mut KernelBuilder, x: Value, base: Value) -> Value {
    let x = to_u64(b, x);
    b.add(base, x)
}

/// `min(x, hi)` for u32.
#[track_caller]
fn clamp_to(b: &mut KernelBuilder, x: Value, hi: Value) -> Value {
    b.min(x, hi)
}

/// Load 4 consecutive elements at `ptr + index` (u64 index) and widen them to f32.
#[track_caller]
fn load4_f32(b: &mut KernelBuilder, ptr: Value, index: Value) -> [Value; 4] {
    let p = b.ptr_add(ptr, index);
    let v = b.load_vec(p, 4);
    [0u8, 1, 2, 3].map(|i| {
        let e = b.extract(v, i);
        to_f32(b, e)
    })
}

/// Round 4 f32 values to the pointee type of `ptr` and store them at `ptr + index`.
#[track_caller]
fn store4_from_f32(b: &mut KernelBuilder, ptr: Value, index: Value, vals: &[Value]) {
    let elem = b.ty(ptr).elem();
    let vals: Vec<Value> = vals.iter().map(|&v| if elem == ScalarType::F32 { v } else { b.cvt(v, elem) }).collect();
    let v = b.make_vector(&vals);
    let p = b.ptr_add(ptr, index);
    b.store(p, v);
}

// ---- the shared flash core -------------------------------------------------------------------

const RL: usize = ROWS_PER_LANE as usize;

/// Where the calling lane sits: its query rows in the block and its place in their group.
struct Lane {
    /// Rows of the block this lane works on (`(tid / G) · RL + i`).
    rows: [Value; RL],
    /// Offset, within a row, of the lane's first dimension (`(tid % G) · 4`).
    dim0: Value,
    /// Whether any row of the lane's warp is below the limit (else the warp skips the math).
    warp_live: Value,
}

/// The lane of this thread; block row `r` is row `row_base + r` of a range of `row_limit`.
fn lane(b: &mut KernelBuilder, geo: &Geometry, row_base: Value, row_limit: Value) -> Lane {
    let tid = b.thread_id_x();
    let shift = u32c(b, geo.group.trailing_zeros());
    let pair = b.shr(tid, shift);
    let rl = u32c(b, ROWS_PER_LANE);
    let row0 = b.mul(pair, rl);
    let rows = std::array::from_fn(|i| if i == 0 { row0 } else { offset(b, row0, i as u32) });
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
fn offset(b: &mut KernelBuilder, v: Value, c: u32) -> Value {
    if c == 0 {
        return v;
    }
    let c = u32c(b, c);
    b.add(v, c)
}

/// The row dimension of the lane's run `r`: `dim0 + r · 4G`.
fn run_dim(b: &mut KernelBuilder, geo: &Geometry, lane: &Lane, r: u32) -> Value {
    offset(b, lane.dim0, r * 4 * geo.group)
}

/// The lane's dimensions of a row at `ptr + row_offset` (u64) as f32, or zeros where `ok` is
/// false (the row is then never read).
fn load_row(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    ptr: Value,
    row_offset: Value,
    ok: Value,
) -> Vec<Value> {
    b.if_else(
        ok,
        |b| {
            let mut vals = Vec::with_capacity(DIMS_PER_ROW as usize);
            for r in 0..geo.runs() {
                let d = run_dim(b, geo, lane, r);
                let idx = add64(b, d, row_offset);
                vals.extend(load4_f32(b, ptr, idx));
            }
            vals
        },
        |b| {
            let z = b.const_f32(0.0);
            vec![z; DIMS_PER_ROW as usize]
        },
    )
}

#[track_caller]
fn u32c_64(b: &mut KernelBuilder, v: u64) -> Value {
    b.const_u64(v)
}

/// Store the lane's dimensions of a row at `ptr + row_offset` (u64).
fn store_row(b: &mut KernelBuilder, geo: &Geometry, lane: &Lane, ptr: Value, row_offset: Value, vals: &[Value]) {
    for r in 0..geo.runs() {
        let d = run_dim(b, geo, lane, r);
        let idx = add64(b, d, row_offset);
        store4_from_f32(b, ptr, idx, &vals[(r * 4) as usize..(r * 4 + 4) as usize]);
    }
}

/// The online-softmax state of one of a lane's rows: running max and sum (log2 domain) and
/// the lane's accumulator dimensions.
struct RowState {
    m: Value,
    l: Value,
    acc: Vec<Value>,
}

const STATE_LEN: usize = 2 + DIMS_PER_ROW as usize;

impl RowState {
    fn init(b: &mut KernelBuilder) -> RowState {
        let m = b.const_f32(f32::NEG_INFINITY);
        let l = b.const_f32(0.0);
        let z = b.const_f32(0.0);
        RowState { m, l, acc: vec![z; DIMS_PER_ROW as usize] }
    }
}

/// The lane's row states flattened into loop-carried values, and back.
fn flatten(states: &[RowState]) -> Vec<Value> {
    states
        .iter()
        .flat_map(|st| {
            let mut v = vec![st.m, st.l];
            v.extend(&st.acc);
            v
        })
        .collect()
}

fn unflatten(v: &[Value]) -> Vec<RowState> {
    v.chunks(STATE_LEN).map(|c| RowState { m: c[0], l: c[1], acc: c[2..].to_vec() }).collect()
}

/// The key/value source of the flash core.
struct KeySource {
    k: Value,
    v: Value,
    /// u64 element offset of key 0 of this (sequence, kv head), and the u64 stride between keys.
    base: Value,
    stride: Value,
}

/// How the block copies a tile of keys to shared memory: thread `t` takes column run
/// `t % (D/4)` of tile rows `row0 + r · rows_per_pass`, `r < passes`.
struct Staging {
    row0: Value,
    /// `4 · (t % (D/4))` as u64 (the element offset within a global row).
    col64: Value,
    /// Shared index of the thread's first element (`row0 · D + col`).
    shared0: Value,
    rows_per_pass: u32,
    passes: u32,
    /// `rows_per_pass · key stride` (u64).
    global_step: Value,
}

impl Staging {
    fn new(b: &mut KernelBuilder, geo: &Geometry, stride: Value) -> Staging {
        let runs_per_row = geo.head_dim / 4;
        let rows_per_pass = THREADS / runs_per_row;
        let tid = b.thread_id_x();
        let shift = u32c(b, runs_per_row.trailing_zeros());
        let row0 = b.shr(tid, shift);
        let mask = u32c(b, runs_per_row - 1);
        let c4 = b.and(tid, mask);
        let four = u32c(b, 4);
        let col = b.mul(c4, four);
        let col64 = to_u64(b, col);
        let dd = u32c(b, geo.head_dim);
        let shared0 = b.fma(row0, dd, col);
        let rpp = b.const_u64(rows_per_pass as u64);
        let global_step = b.mul(rpp, stride);
        Staging { row0, col64, shared0, rows_per_pass, passes: geo.keys / rows_per_pass, global_step }
    }
}

/// Masking of one score: `(b, row i of the lane, key, tile column j, s)` → the score, or `-inf`
/// where that row may not attend `key`.
type MaskScore<'a> = &'a dyn Fn(&mut KernelBuilder, usize, Value, Value, Value) -> Value;

/// Extra per-tile staging `(b, k0)`, run by every thread before the tile's barrier.
type StageExtra<'a> = Option<&'a dyn Fn(&mut KernelBuilder, Value)>;

/// Run the flash loop over keys `[begin, end)` (uniform u32 values) for the lane's rows, whose
/// `q` dimensions (pre-scaled into the log2 domain) are `q[i]`.
#[allow(clippy::too_many_arguments)]
fn flash_core(
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
    let d = geo.head_dim;
    let k_s = b.shared_ptr(tiles.0);
    let v_s = b.shared_ptr(tiles.1);
    let bc = u32c(b, geo.keys);
    let stage = Staging::new(b, geo, src.stride);
    let init: Vec<RowState> = (0..RL).map(|_| RowState::init(b)).collect();
    let out = b.for_range(begin, end, bc, &flatten(&init), |b, k0, carried| {
        // Stage the tile: BC rows of K and V as f32, zeros past `end`. Thread t copies run
        // `t % (D/4)` of rows `t / (D/4) + r · step`: one column per thread, so the addresses
        // advance by constant strides.
        let mut key = b.add(k0, stage.row0);
        let row = mad64(b, key, src.stride, src.base);
        let mut off = b.add(row, stage.col64);
        for r in 0..stage.passes {
            if r > 0 {
                key = offset(b, key, stage.rows_per_pass);
                off = b.add(off, stage.global_step);
            }
            let ok = b.lt(key, end);
            for (ptr, smem) in [(src.k, k_s), (src.v, v_s)] {
                let vals = b.if_else(
                    ok,
                    |b| load4_f32(b, ptr, off).to_vec(),
                    |b| {
                        let z = b.const_f32(0.0);
                        vec![z; 4]
                    },
                );
                let v = b.make_vector(&vals);
                let p = b.ptr_add(smem, stage.shared0);
                let p = if r == 0 {
                    p
                } else {
                    let c = u32c(b, r * stage.rows_per_pass * d);
                    b.ptr_add(p, c)
                };
                b.store(p, v);
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
                    let st = unflatten(carried);
                    flatten(&chunk_step(b, geo, lane, (k_s, v_s), q, k0, jc, st, mask_score))
                })
            },
            |_| carried.to_vec(),
        );
        // The tiles are overwritten next iteration only after every thread has read them.
        b.barrier();
        state
    });
    unflatten(&out)
}

/// One chunk of `CHUNK` keys starting at tile row `jc` (tile starting at key `k0`).
#[allow(clippy::too_many_arguments)]
fn chunk_step(
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
    let d = geo.head_dim;
    let dd = u32c(b, d);
    // One base pointer per tile and chunk; every element is then a constant offset from it.
    let first = b.fma(jc, dd, lane.dim0);
    let k_base = b.ptr_add(k_s, first);
    let v_base = b.ptr_add(v_s, first);
    let at = |b: &mut KernelBuilder, base: Value, jj: u32, r: u32| {
        let off = jj * d + r * 4 * geo.group;
        if off == 0 {
            base
        } else {
            let c = u32c(b, off);
            b.ptr_add(base, c)
        }
    };
    // Partial dot products over the lane's dimensions, each K element used by every row.
    let mut scores: Vec<Vec<Value>> = (0..RL).map(|_| Vec::with_capacity(CHUNK as usize)).collect();
    for jj in 0..CHUNK {
        let zero = b.const_f32(0.0);
        let mut s = [zero; RL];
        for r in 0..geo.runs() {
            let p = at(b, k_base, jj, r);
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
    let mut probs = Vec::with_capacity(RL);
    let mut next = Vec::with_capacity(RL);
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
        for r in 0..geo.runs() {
            let ptr = at(b, v_base, jj as u32, r);
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

/// Declare the two f32 tiles.
fn tiles(b: &mut KernelBuilder, geo: &Geometry) -> (SharedId, SharedId) {
    let n = geo.keys * geo.head_dim;
    (b.shared_array("k_tile", ScalarType::F32, n), b.shared_array("v_tile", ScalarType::F32, n))
}

/// Load the lane's q dimensions of a row and scale them into the log2 domain.
#[allow(clippy::too_many_arguments)]
fn load_q(
    b: &mut KernelBuilder,
    geo: &Geometry,
    lane: &Lane,
    q: Value,
    offset: Value,
    ok: Value,
    scale_log2: Value,
) -> Vec<Value> {
    let raw = load_row(b, geo, lane, q, offset, ok);
    raw.iter().map(|&x| b.mul(x, scale_log2)).collect()
}

/// `scale · log2 e`: scores then live in the log2 domain of `ex2`.
fn log2_scale(b: &mut KernelBuilder, scale: Value) -> Value {
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    b.mul(scale, log2e)
}

/// `acc / l`, or zeros when `l = 0` (nothing attended).
fn normalize(b: &mut KernelBuilder, st: &RowState) -> Vec<Value> {
    let zero = b.const_f32(0.0);
    let any = b.gt(st.l, zero);
    let r = b.rcp(st.l);
    let inv = b.select(any, r, zero);
    st.acc.iter().map(|&a| b.mul(a, inv)).collect()
}

/// Mask (u8) and bias (f32) with their (batch, head, query, key) strides.
struct MaskBias {
    mask: Value,
    bias: Value,
    mask_strides: [Value; 4],
    bias_strides: [Value; 4],
}

/// Row stride of the staged bias tile: `BC + 1`, so that the groups of a warp, which read
/// different rows of one column, hit different banks.
fn bias_stride(geo: &Geometry) -> u32 {
    geo.keys + 1
}

/// Stage, for the block's query rows (those below `q_len`) and the tile's `BC` keys,
/// `bias · log2 e` where the mask allows the pair and `-inf` where it does not, into `tile`
/// (f32, rows of [`bias_stride`]). Keys past `kv_len` are staged as `-inf` without reading mask
/// or bias, whose offsets are clamped to element 0 so every load stays in bounds; rows past
/// `q_len` are not staged (their scores are discarded).
#[allow(clippy::too_many_arguments)]
fn stage_mask_bias(
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
fn mb_row(b: &mut KernelBuilder, strides: &[Value; 4], seq: Value, head: Value, row: Value) -> Value {
    let z = u32c_64(b, 0);
    let a = mad64(b, seq, strides[0], z);
    let a = mad64(b, head, strides[1], a);
    mad64(b, row, strides[2], a)
}

/// Apply mask and bias to a log2-domain score `s` of an in-range `(row, key)` (`valid`); the
/// offsets are clamped to element 0 elsewhere so that every load stays in bounds.
#[allow(clippy::too_many_arguments)]
fn apply_mask_bias(
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

/// Build the prefill kernel (see [`AttentionPrefillConfig`] for parameters and launch).
pub fn attention_prefill(cfg: &AttentionPrefillConfig) -> Result<Kernel, VerifyError> {
    let geo = cfg.geometry();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let gptr = |t| Type::Ptr(AddrSpace::Global, t);
    let q = b.param("q", gptr(cfg.dtype));
    let k = b.param("k", gptr(cfg.dtype));
    let v = b.param("v", gptr(cfg.dtype));
    let out = b.param("out", gptr(cfg.dtype));
    let cu_q = b.param("cu_q", gptr(ScalarType::U32));
    let cu_k = b.param(if cfg.kv == KvSource::Cache { "seq_lens" } else { "cu_k" }, gptr(ScalarType::U32));
    let mask_ptrs = cfg.masked.then(|| (b.param("mask", gptr(ScalarType::U8)), b.param("bias", gptr(ScalarType::F32))));
    let scale = b.param("scale", Type::F32);
    let total_q = b.param("total_q", Type::U32);
    let total_k = b.param("total_k", Type::U32);
    let group = b.param("group", Type::U32);
    let q_strides = [b.param("q_token", Type::U64), b.param("q_head", Type::U64), b.param("q_batch", Type::U64)];
    let k_strides = [b.param("k_token", Type::U64), b.param("k_head", Type::U64), b.param("k_batch", Type::U64)];
    let mb = mask_ptrs.map(|(mask, bias)| {
        let names = ["batch", "head", "query", "key"];
        let mask_strides = names.map(|n| b.param(format!("mask_{n}"), Type::U64));
        let bias_strides = names.map(|n| b.param(format!("bias_{n}"), Type::U64));
        MaskBias { mask, bias, mask_strides, bias_strides }
    });
    b.launch_bounds(THREADS, None);
    let tiles = tiles(&mut b, &geo);
    let bias_tile = cfg.masked.then(|| b.shared_array("bias_tile", ScalarType::F32, geo.rows * bias_stride(&geo)));

    let tile = b.block_id_x();
    let head = b.block_id_y();
    let seq = b.special(SpecialReg::CtaidZ);
    // Sequence bounds, clamped so that bad cumulative lengths cannot address outside q or k.
    let bounds = |b: &mut KernelBuilder, cu: Value, total: Value| {
        let p0 = b.ptr_add(cu, seq);
        let start = b.load(p0);
        let next = offset(b, seq, 1);
        let p1 = b.ptr_add(cu, next);
        let stop = b.load(p1);
        let start = clamp_to(b, start, total);
        let stop = clamp_to(b, stop, total);
        let stop = b.max(stop, start);
        let len = b.sub(stop, start);
        (start, len)
    };
    let (q_start, q_len) = bounds(&mut b, cu_q, total_q);
    let (k_start, kv_len) = match cfg.kv {
        KvSource::Packed => bounds(&mut b, cu_k, total_k),
        KvSource::Cache => {
            let p = b.ptr_add(cu_k, seq);
            let len = b.load(p);
            (u32c(&mut b, 0), clamp_to(&mut b, len, total_k))
        }
    };
    let br = u32c(&mut b, geo.rows);
    let q0 = b.mul(tile, br);
    let live = b.lt(q0, q_len);
    b.if_then(live, |b| {
        let lane = lane(b, &geo, q0, q_len);
        let kv_head = b.div(head, group);
        // Row offsets: (start + t) · token + head · head_stride + seq · batch.
        let seq_head_base = |b: &mut KernelBuilder, strides: &[Value; 3], h: Value| {
            let z = u32c_64(b, 0);
            let a = mad64(b, h, strides[1], z);
            mad64(b, seq, strides[2], a)
        };
        let q_base = seq_head_base(b, &q_strides, head);
        let s2 = log2_scale(b, scale);
        // Per row of the lane: its index, whether it exists, its q offset, its q.
        let mut rows = Vec::with_capacity(RL);
        for &r in &lane.rows {
            let qi = b.add(q0, r);
            let ok = b.lt(qi, q_len);
            let pos = b.add(q_start, qi);
            let at = mad64(b, pos, q_strides[0], q_base);
            let qv = load_q(b, &geo, &lane, q, at, ok, s2);
            let qi_plus_kv = b.add(qi, kv_len);
            // The row's first element in the staged bias tile.
            let bias_row = bias_tile.map(|_| {
                let stride = u32c(b, bias_stride(&geo));
                b.mul(r, stride)
            });
            rows.push((ok, at, qv, qi_plus_kv, bias_row));
        }
        let k_base = seq_head_base(b, &k_strides, kv_head);
        let k_base = mad64(b, k_start, k_strides[0], k_base);
        let src = KeySource { k, v, base: k_base, stride: k_strides[0] };
        // Causal (aligned to the end): row i attends keys j with j + q_len <= i + kv_len.
        let end = if cfg.causal {
            let last = b.add(q0, br);
            let lim = b.add(last, kv_len);
            let over = b.gt(lim, q_len);
            let lim = b.sub(lim, q_len);
            let zero = u32c(b, 0);
            let lim = b.select(over, lim, zero);
            b.min(lim, kv_len)
        } else {
            kv_len
        };
        let mask_score = |b: &mut KernelBuilder, i: usize, key: Value, j: Value, s: Value| {
            let (row_ok, _, _, qi_plus_kv, bias_row) = &rows[i];
            let in_seq = b.lt(key, kv_len);
            let mut valid = b.and(*row_ok, in_seq);
            if cfg.causal {
                let kq = b.add(key, q_len);
                let c = b.le(kq, *qi_plus_kv);
                valid = b.and(valid, c);
            }
            // Staged `bias · log2 e`, or -inf where the mask forbids the pair.
            let s = match (bias_tile, bias_row) {
                (Some(t), Some(row)) => {
                    let base = b.shared_ptr(t);
                    let p = b.ptr_add(base, *row);
                    let p = b.ptr_add(p, j);
                    let x = b.load(p);
                    b.add(s, x)
                }
                _ => s,
            };
            let ninf = b.const_f32(f32::NEG_INFINITY);
            b.select(valid, s, ninf)
        };
        let stage = |b: &mut KernelBuilder, k0: Value| {
            if let (Some(mb), Some(t)) = (&mb, bias_tile) {
                stage_mask_bias(b, &geo, mb, t, (seq, head), (q0, q_len), (k0, kv_len));
            }
        };
        let qs: Vec<Vec<Value>> = rows.iter().map(|r| r.2.clone()).collect();
        let zero = u32c(b, 0);
        let extra: StageExtra<'_> = if cfg.masked { Some(&stage) } else { None };
        let states = flash_core(b, &geo, &lane, tiles, &src, &qs, zero, end, &mask_score, extra);
        for (st, (ok, at, ..)) in states.iter().zip(&rows) {
            let o = normalize(b, st);
            b.if_then(*ok, |b| store_row(b, &geo, &lane, out, *at, &o));
        }
    });
    b.finish()
}

/// Build the split-KV decode kernel (see [`AttentionDecodeConfig`]).
pub fn attention_decode(cfg: &AttentionDecodeConfig) -> Result<Kernel, VerifyError> {
    let geo = cfg.geometry();
    let d = geo.head_dim;
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let gptr = |t| Type::Ptr(AddrSpace::Global, t);
    let q = b.param("q", gptr(cfg.dtype));
    let k = b.param("k_cache", gptr(cfg.dtype));
    let v = b.param("v_cache", gptr(cfg.dtype));
    let seq_lens = b.param("seq_lens", gptr(ScalarType::U32));
    let ws = b.param("workspace", gptr(ScalarType::F32));
    let scale = b.param("scale", Type::F32);
    let s_max = b.param("s_max", Type::U32);
    let kv_heads = b.param("kv_heads", Type::U32);
    let group = b.param("group", Type::U32);
    let split_len = b.param("split_len", Type::U32);
    b.launch_bounds(THREADS, None);
    let tiles = tiles(&mut b, &geo);

    let split = b.block_id_x();
    let gy = b.block_id_y();
    let seq = b.special(SpecialReg::CtaidZ);
    let splits = b.special(SpecialReg::NctaidX);
    let batch = b.special(SpecialReg::NctaidZ);
    let br = u32c(&mut b, geo.rows);
    let brm1 = u32c(&mut b, geo.rows - 1);
    let chunks = b.add(group, brm1);
    let chunks = b.div(chunks, br);
    let kv_head = b.div(gy, chunks);
    let chunk = b.rem(gy, chunks);
    let lp = b.ptr_add(seq_lens, seq);
    let len = b.load(lp);
    let len = clamp_to(&mut b, len, s_max);
    let begin = b.mul(split, split_len);
    let stop = b.add(begin, split_len);
    let end = b.min(stop, len);

    // The block's rows are query heads `chunk · BR ..` of the GQA group of `kv_head`.
    let r0 = b.mul(chunk, br);
    let lane = lane(&mut b, &geo, r0, group);
    let head_base = b.mul(kv_head, group);
    let q_heads = b.mul(kv_heads, group);
    let dd = u32c_64(&mut b, d as u64);
    let z64 = b.const_u64(0);
    let s2 = log2_scale(&mut b, scale);
    let mut rows = Vec::with_capacity(RL);
    for &lr in &lane.rows {
        let r = b.add(r0, lr);
        let ok = b.lt(r, group);
        let head = b.add(head_base, r);
        // q[seq, head, :]
        let qrow = b.fma(seq, q_heads, head);
        let at = mad64(&mut b, qrow, dd, z64);
        let qv = load_q(&mut b, &geo, &lane, q, at, ok, s2);
        rows.push((ok, head, qv));
    }
    // cache[seq, kv_head, j, :] = ((seq · Hkv + kv_head) · S_max + j) · D
    let sh = b.fma(seq, kv_heads, kv_head);
    let base = mad64(&mut b, sh, s_max, z64);
    let base = b.mul(base, dd);
    let src = KeySource { k, v, base, stride: dd };
    let mask_score = |b: &mut KernelBuilder, i: usize, key: Value, _j: Value, s: Value| {
        let in_split = b.lt(key, end);
        let valid = b.and(rows[i].0, in_split);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        b.select(valid, s, ninf)
    };
    let qs: Vec<Vec<Value>> = rows.iter().map(|r| r.2.clone()).collect();
    let states = flash_core(&mut b, &geo, &lane, tiles, &src, &qs, begin, end, &mask_score, None);
    // Workspace row (seq, head, split): accumulator, then (max, sum) in the stats region after
    // all accumulators (batch · Hq · splits rows).
    let bh = b.mul(batch, q_heads);
    let total_rows = b.mul(bh, splits);
    let acc_len = mad64(&mut b, total_rows, dd, z64);
    for (st, (ok, head, _)) in states.iter().zip(&rows) {
        b.if_then(*ok, |b| {
            let sq = b.fma(seq, q_heads, *head);
            let wrow = b.fma(sq, splits, split);
            let z = b.const_u64(0);
            let acc_off = mad64(b, wrow, dd, z);
            store_row(b, &geo, &lane, ws, acc_off, &st.acc);
            let zero = u32c(b, 0);
            let first = b.eq(lane.dim0, zero);
            b.if_then(first, |b| {
                let two = b.const_u64(2);
                let st_off = mad64(b, wrow, two, acc_len);
                let pm = b.ptr_add(ws, st_off);
                b.store(pm, st.m);
                let one64 = b.const_u64(1);
                let st_off1 = b.add(st_off, one64);
                let pl = b.ptr_add(ws, st_off1);
                b.store(pl, st.l);
            });
        });
    }
    b.finish()
}

/// Build the decode combine kernel: merges the splits' `(max, sum, acc)` of each (sequence,
/// head) into `out` (`[B, Hq, D]`, the dtype). Parameters: `workspace` (f32), `out`,
/// `splits: u32`. Launch: grid `(B · Hq)`, `D` threads.
pub fn attention_decode_combine(cfg: &AttentionDecodeConfig) -> Result<Kernel, VerifyError> {
    let d = cfg.head_dim;
    let mut b = KernelBuilder::new(cfg.combine_id().replace('.', "_"));
    let ws = b.param("workspace", Type::Ptr(AddrSpace::Global, ScalarType::F32));
    let out = b.param("out", Type::Ptr(AddrSpace::Global, cfg.dtype));
    let splits = b.param("splits", Type::U32);
    b.launch_bounds(d, None);

    let row = b.block_id_x();
    let rows = b.grid_dim_x();
    let dim = b.thread_id_x();
    let dd = b.const_u64(d as u64);
    let z64 = b.const_u64(0);
    let first = b.mul(row, splits);
    let total = b.mul(rows, splits);
    let stats = mad64(&mut b, total, dd, z64);
    let two = b.const_u64(2);
    let stat = |b: &mut KernelBuilder, s: Value, which: u64| {
        let w = b.add(first, s);
        let off = mad64(b, w, two, stats);
        let c = b.const_u64(which);
        let off = b.add(off, c);
        let p = b.ptr_add(ws, off);
        b.load(p)
    };
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let m = b.for_range(zero, splits, one, &[ninf], |b, s, acc| {
        let ms = stat(b, s, 0);
        vec![b.max(acc[0], ms)]
    })[0];
    let none = b.eq(m, ninf);
    let zf = b.const_f32(0.0);
    let m_use = b.select(none, zf, m);
    let sums = b.for_range(zero, splits, one, &[zf, zf], |b, s, acc| {
        let ms = stat(b, s, 0);
        let ls = stat(b, s, 1);
        let dm = b.sub(ms, m_use);
        let w = b.ex2(dm);
        let den = b.fma(w, ls, acc[0]);
        let w_row = b.add(first, s);
        let off = mad64(b, w_row, dd, dim);
        let p = b.ptr_add(ws, off);
        let a = b.load(p);
        let num = b.fma(w, a, acc[1]);
        vec![den, num]
    });
    let any = b.gt(sums[0], zf);
    let q = b.div(sums[1], sums[0]);
    let y = b.select(any, q, zf);
    let o = mad64(&mut b, row, dd, dim);
    let elem = cfg.dtype;
    let y = if elem == ScalarType::F32 { y } else { b.cvt(y, elem) };
    let p = b.ptr_add(out, o);
    b.store(p, y);
    b.finish()
}

/// Build the fallback's masked softmax (see [`AttentionSoftmaxConfig`]).
pub fn attention_softmax(cfg: &AttentionSoftmaxConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let gptr = |t| Type::Ptr(AddrSpace::Global, t);
    let scores = b.param("scores", gptr(ScalarType::F32));
    let probs = b.param("probs", gptr(ScalarType::F32));
    let mask_ptrs = cfg.masked.then(|| (b.param("mask", gptr(ScalarType::U8)), b.param("bias", gptr(ScalarType::F32))));
    let scale = b.param("scale", Type::F32);
    let q_len = b.param("q_len", Type::U32);
    let kv_len = b.param("kv_len", Type::U32);
    let mb = mask_ptrs.map(|(mask, bias)| {
        let seq = b.param("batch", Type::U32);
        let head = b.param("head", Type::U32);
        let names = ["batch", "head", "query", "key"];
        let mask_strides = names.map(|n| b.param(format!("mask_{n}"), Type::U64));
        let bias_strides = names.map(|n| b.param(format!("bias_{n}"), Type::U64));
        (MaskBias { mask, bias, mask_strides, bias_strides }, seq, head)
    });
    b.launch_bounds(SOFTMAX_THREADS, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, SOFTMAX_THREADS / 32);
    let sum_scratch = b.shared_array("sum_partials", ScalarType::F32, SOFTMAX_THREADS / 32);

    let i = b.block_id_x();
    let tid = b.thread_id_x();
    let step = b.const_u32(SOFTMAX_THREADS);
    let z64 = b.const_u64(0);
    let row = mad64(&mut b, i, kv_len, z64);
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let s2 = b.mul(scale, log2e);
    let rows_mb = mb.as_ref().map(|(mb, seq, head)| {
        (mb_row(&mut b, &mb.mask_strides, *seq, *head, i), mb_row(&mut b, &mb.bias_strides, *seq, *head, i))
    });
    let i_plus_kv = b.add(i, kv_len);
    let t = b.const_pred(true);
    // The log2-domain logit of column j, -inf where the row may not attend it.
    let logit = |b: &mut KernelBuilder, j: Value| {
        let j64 = to_u64(b, j);
        let idx = b.add(row, j64);
        let p = b.ptr_add(scores, idx);
        let x = b.load(p);
        let x = b.mul(x, s2);
        let valid = if cfg.causal {
            let jq = b.add(j, q_len);
            b.le(jq, i_plus_kv)
        } else {
            t
        };
        match (&mb, rows_mb) {
            (Some((mb, _, _)), Some((mrow, brow))) => apply_mask_bias(b, mb, mrow, brow, j, valid, x),
            _ => {
                let ninf = b.const_f32(f32::NEG_INFINITY);
                b.select(valid, x, ninf)
            }
        }
    };
    let init = identity(&mut b, Combine::MaxNan);
    let partial = b.for_range(tid, kv_len, step, &[init], |b, j, acc| {
        let x = logit(b, j);
        vec![combine(b, Combine::MaxNan, acc[0], x)]
    })[0];
    let max = block_reduce(&mut b, Combine::MaxNan, partial, SOFTMAX_THREADS, max_scratch);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let none = b.eq(max, ninf);
    let zf = b.const_f32(0.0);
    let m_use = b.select(none, zf, max);
    let partial = b.for_range(tid, kv_len, step, &[zf], |b, j, acc| {
        let x = logit(b, j);
        let d = b.sub(x, m_use);
        let e = b.ex2(d);
        vec![b.add(acc[0], e)]
    })[0];
    let sum = block_reduce(&mut b, Combine::Sum, partial, SOFTMAX_THREADS, sum_scratch);
    let any = b.gt(sum, zf);
    let r = b.rcp(sum);
    let inv = b.select(any, r, zf);
    b.for_each(tid, kv_len, step, |b, j| {
        let x = logit(b, j);
        let d = b.sub(x, m_use);
        let e = b.ex2(d);
        let y = b.mul(e, inv);
        let j64 = to_u64(b, j);
        let idx = b.add(row, j64);
        let p = b.ptr_add(probs, idx);
        b.store(p, y);
    });
    b.finish()
}

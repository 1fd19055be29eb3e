//! Attention: a SIMT flash-attention forward for prefill (packed variable-length batches, GQA,
//! causal or not, optional mask and bias), split-KV decode over a contiguous KV cache with its
//! combine kernel, and the masked softmax of the multi-kernel fallback.
//!
//! # The flash kernels
//!
//! One block of [`THREADS`] threads handles a tile of `BR` query rows of one head of one
//! sequence (decode: the query heads of one GQA group, for one split of the keys). Queries and
//! keys have head dim `D`, values and the output `Dv` (each 1 to 1024; see [`Geometry`]). Each
//! pair of query rows (one row for large head dims) belongs to a group of `G` consecutive
//! lanes (`G = D / 16` at D = Dv = 64, 128, 256); each lane keeps its runs of 4 dimensions,
//! strided by `4 G`, of `q` (pre-scaled by `scale · log2 e`) and of the output accumulator in
//! registers (so a group reads 16-byte runs side by side and the other groups of the warp read
//! the same addresses, a broadcast). Keys and values are staged through shared memory as `f32`
//! in tiles of `BC` rows (`BC · D = 2048` at those dims: 16 KiB for both); every element a lane
//! reads from there feeds both of its rows, which halves the shared-memory traffic that bounds
//! a SIMT attention. A tile is consumed in chunks of
//! [`CHUNK`] keys: partial dot products, a butterfly sum over the group's lanes (so every lane
//! holds the same scores bit for bit), masking, then the online softmax update in the log2
//! domain (running max `m`, running sum `l`, accumulator rescaled by `ex2(m_old - m_new)`) and
//! `acc += p · v`. With a mask or bias, `bias · log2 e` (or `-inf` where the mask forbids) is
//! staged per tile too, as a `BR × BC` f32 tile. Statistics and accumulation are `f32`
//! whatever the input dtype; `ex2` is PTX's approximate one, so results are compared with
//! tolerances.
//!
//! Tiles and chunks are sized so that every configuration stays within 128 registers without
//! spills (`rudac check`), i.e. four blocks of 128 threads per SM (three for some; see
//! [`Geometry::min_blocks`]).
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
/// Most keys per tile: the masked kernels stage a `rows × (BC + 1)` bias tile as well, and
/// with one lane per row (small head dims) 256 rows of 33 keys already take 33 KiB.
const MAX_TILE_KEYS: u32 = 32;
/// Registers of `q` plus accumulator a lane may keep (`rows per lane · (q dims + v dims)`):
/// 64, as at D = 64, 128 and 256, keeps every configuration within 128 registers.
const LANE_VALUES: u32 = 64;
/// Head dims (of `q`/`k` and of `v`) the flash kernels take: any in this range.
pub const FLASH_HEAD_DIM_RANGE: std::ops::RangeInclusive<u32> = 1..=1024;
/// Head dims with registered (checked, snapshotted) flash configurations, `Dv = D`: the
/// common ones, whose tiles fit them exactly or nearly (others are built on first use).
pub const FLASH_HEAD_DIMS: [u32; 6] = [64, 80, 96, 128, 192, 256];
/// `(D, Dv)` pairs registered for the general path: a scalar-load dim, padded dims, a
/// value head dim other than the key's (both ways), and the largest.
pub const FLASH_GENERAL_HEAD_DIMS: [(u32, u32); 6] =
    [(1, 1), (48, 32), (64, 128), (112, 112), (200, 200), (1024, 1024)];
/// Threads per block of the fallback softmax.
pub const SOFTMAX_THREADS: u32 = 256;

/// The tile shape for a pair of head dims.
///
/// Each of a lane's `rows_per_lane` query rows is shared by a group of `G` lanes, lane `g`
/// owning the 4-wide runs of dimensions `4g + 4G·r` (`r < runs_k` of `q`, `r < runs_v` of the
/// accumulator): the smallest power-of-two `G` (two rows per lane when they fit, else one)
/// whose runs keep [`LANE_VALUES`] registers. Dims past `D` (or `Dv`) are padding: loaded as
/// zeros and never stored, and the tiles are staged at the padded widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub head_dim: u32,
    pub v_head_dim: u32,
    /// Lanes sharing a row (each owning `4 · runs` of the row's dimensions).
    pub group: u32,
    /// Query rows per lane: each K or V element read from shared memory feeds this many FMAs.
    pub rows_per_lane: u32,
    /// Query rows per block.
    pub rows: u32,
    /// Keys per shared-memory tile.
    pub keys: u32,
    /// 4-wide runs of `q` (and K) dimensions per lane.
    pub runs_k: u32,
    /// 4-wide runs of accumulator (and V) dimensions per lane.
    pub runs_v: u32,
}

impl Geometry {
    /// The geometry of `D = head_dim`, `Dv = v_head_dim` (each in [`FLASH_HEAD_DIM_RANGE`]).
    pub fn new(head_dim: u32, v_head_dim: u32) -> Geometry {
        let (d, dv) = (head_dim.max(1), v_head_dim.max(1));
        let fits = |rl: u32, g: u32| rl * 4 * (d.div_ceil(4 * g) + dv.div_ceil(4 * g)) <= LANE_VALUES;
        let (rows_per_lane, group) = [2, 1]
            .into_iter()
            .flat_map(|rl| [1, 2, 4, 8, 16, 32].map(|g| (rl, g)))
            .find(|&(rl, g)| fits(rl, g))
            .unwrap_or((1, 32));
        let (runs_k, runs_v) = (d.div_ceil(4 * group), dv.div_ceil(4 * group));
        let width = 4 * group * runs_k.max(runs_v);
        let keys = (TILE_ELEMS / width).max(1);
        let keys = (1 << keys.ilog2()).clamp(CHUNK, MAX_TILE_KEYS);
        let rows = THREADS / group * rows_per_lane;
        Geometry { head_dim, v_head_dim, group, rows_per_lane, rows, keys, runs_k, runs_v }
    }

    /// Padded widths of a K and a V tile row.
    fn width_k(&self) -> u32 {
        4 * self.group * self.runs_k
    }
    fn width_v(&self) -> u32 {
        4 * self.group * self.runs_v
    }

    /// The blocks per SM the kernels ask ptxas to fit (measured with ptxas 12.9 on every
    /// registered configuration, so that none spills): none where K and V rows have one
    /// power-of-two width, as at D = 64, 128, 256, which ptxas gives 128 registers unasked;
    /// else 4 (128 registers), which left to itself ptxas cuts to 96 and spills; 3 for groups
    /// of 16 or more lanes, whose butterflies need more than 128 there.
    pub fn min_blocks(&self) -> Option<u32> {
        let (wk, wv) = (self.width_k(), self.width_v());
        if wk == wv && wk.is_power_of_two() {
            None
        } else if self.group >= 16 {
            Some(3)
        } else {
            Some(4)
        }
    }

    /// Whether rows may be read 4 elements at a time (both head dims multiples of 4; the
    /// tensors then start at a multiple of 4 elements too, which the entry points check).
    pub fn vector(&self) -> bool {
        self.head_dim.is_multiple_of(4) && self.v_head_dim.is_multiple_of(4)
    }
}

/// The id suffix of a pair of head dims: `d64`, or `d48v32` when `Dv ≠ D`.
fn dims_id(head_dim: u32, v_head_dim: u32) -> String {
    if head_dim == v_head_dim {
        format!("d{head_dim}")
    } else {
        format!("d{head_dim}v{v_head_dim}")
    }
}

/// `(D, Dv)` of a flash configuration id (`d64` or `d48v32` among its dotted parts), for
/// the sample problems.
pub fn head_dims_of_id(id: &str) -> Option<(u32, u32)> {
    id.split('.').find_map(|p| {
        let rest = p.strip_prefix('d')?;
        match rest.split_once('v') {
            Some((d, v)) => Some((d.parse().ok()?, v.parse().ok()?)),
            None => rest.parse().ok().map(|d| (d, d)),
        }
    })
}

/// A flash prefill configuration. Parameters, in order:
/// `q, k, v, out` (dtype), `cu_q, cu_k` (u32, `batch + 1` cumulative lengths), then with
/// `masked` `mask` (u8, nonzero = may attend) and `bias` (f32, added to the scaled scores),
/// then `scale: f32`, `total_q, total_k, group: u32` (rows of `q`, rows of `k`, `Hq / Hkv`), the
/// element strides `q_token, q_head, q_batch, k_token, k_head, k_batch: u64` (with `Dv = D`
/// `out` has `q`'s and `v` has `k`'s; with `Dv ≠ D` the strides `v_token, v_head, v_batch,
/// o_token, o_head, o_batch: u64` follow), then with `masked` the strides `(batch, head, query,
/// key)` of mask and bias (u64; 0 broadcasts). `q`, `k` rows have `D` elements, `v`, `out` rows
/// `Dv`. Element `(seq b, position t, head h, dim d)` of `q` lives at
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
    /// `Dv`, the head dim of `v` and of the output.
    pub v_head_dim: u32,
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
        let dims = dims_id(self.head_dim, self.v_head_dim);
        format!("attention_prefill.{}.{dims}{causal}{masked}{cache}", self.dtype)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim, self.v_head_dim)
    }

    /// Whether `v` and `out` have strides of their own (`Dv ≠ D`).
    fn own_v_strides(&self) -> bool {
        self.head_dim != self.v_head_dim
    }
}

/// A split-KV decode configuration (the partial kernel). Parameters: `q` (`[B, Hq, D]`),
/// `k_cache` (`[B, Hkv, S_max, D]`), `v_cache` (`[B, Hkv, S_max, Dv]`), `seq_lens` (u32 `[B]`, clamped to `S_max`),
/// `workspace` (f32, see [`decode_workspace_len`]), `scale: f32`, `s_max, kv_heads, group,
/// split_len: u32`. Launch: grid `(splits, Hkv · ceil(group / rows), B)`, [`THREADS`] threads;
/// split `s` covers keys `[s · split_len, (s + 1) · split_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionDecodeConfig {
    pub dtype: ScalarType,
    pub head_dim: u32,
    /// `Dv`, the head dim of the V cache and of the output.
    pub v_head_dim: u32,
}

impl AttentionDecodeConfig {
    pub fn id(&self) -> String {
        format!("attention_decode.{}.{}", self.dtype, dims_id(self.head_dim, self.v_head_dim))
    }
    pub fn combine_id(&self) -> String {
        format!("attention_decode_combine.{}.{}", self.dtype, dims_id(self.head_dim, self.v_head_dim))
    }
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.head_dim, self.v_head_dim)
    }
}

/// Elements of the decode workspace: per (sequence, query head, split) an `f32` accumulator of
/// `Dv` elements (first region), and a `(max, sum)` pair (second region).
pub fn decode_workspace_len(batch: usize, q_heads: usize, v_head_dim: usize, splits: usize) -> usize {
    batch * q_heads * splits * (v_head_dim + 2)
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

/// Which dimensions of a 4-wide run exist: all of them (known when building), or those of
/// `dim + e < limit` (`dim`, the run's first, is per lane).
#[derive(Clone, Copy)]
enum RunBound {
    All,
    Below { dim: Value, limit: u32 },
}

/// `dim + e < limit`.
fn below(b: &mut KernelBuilder, dim: Value, e: u32, limit: u32) -> Value {
    let d = offset(b, dim, e);
    let lim = u32c(b, limit);
    b.lt(d, lim)
}

/// The 4 elements at `ptr + index` (u64) as f32, zeros where `bound` excludes them. With
/// `vector` one 4-wide load (the limit is then a multiple of 4: a run is all in or all out),
/// else one load per element.
fn load4_bounded(b: &mut KernelBuilder, ptr: Value, index: Value, bound: RunBound, vector: bool) -> Vec<Value> {
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
fn store4_bounded(b: &mut KernelBuilder, ptr: Value, index: Value, vals: &[Value], bound: RunBound, vector: bool) {
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
struct Lane {
    /// Rows of the block this lane works on (`(tid / G) · rows_per_lane + i`).
    rows: Vec<Value>,
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

/// Which dimensions of the lane's run `r` (first dimension `d`) a row of `dims` has.
fn run_bound(geo: &Geometry, r: u32, d: Value, dims: u32) -> RunBound {
    if (r + 1) * 4 * geo.group <= dims {
        RunBound::All
    } else {
        RunBound::Below { dim: d, limit: dims }
    }
}

/// The lane's `runs` runs of a row of `dims` dimensions at `ptr + row_offset` (u64) as f32,
/// zeros past `dims` and where `ok` is false (the row is then never read).
#[allow(clippy::too_many_arguments)]
fn load_row(
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
fn u32c_64(b: &mut KernelBuilder, v: u64) -> Value {
    b.const_u64(v)
}

/// Store the lane's dimensions of a row of `Dv` at `ptr + row_offset` (u64).
fn store_row(b: &mut KernelBuilder, geo: &Geometry, lane: &Lane, ptr: Value, row_offset: Value, vals: &[Value]) {
    for r in 0..geo.runs_v {
        let d = run_dim(b, geo, lane, r);
        let idx = add64(b, d, row_offset);
        let bound = run_bound(geo, r, d, geo.v_head_dim);
        store4_bounded(b, ptr, idx, &vals[(r * 4) as usize..(r * 4 + 4) as usize], bound, geo.vector());
    }
}

/// The online-softmax state of one of a lane's rows: running max and sum (log2 domain) and
/// the lane's accumulator dimensions.
struct RowState {
    m: Value,
    l: Value,
    acc: Vec<Value>,
}

impl RowState {
    fn init(b: &mut KernelBuilder, geo: &Geometry) -> RowState {
        let m = b.const_f32(f32::NEG_INFINITY);
        let l = b.const_f32(0.0);
        let z = b.const_f32(0.0);
        RowState { m, l, acc: vec![z; 4 * geo.runs_v as usize] }
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

fn unflatten(geo: &Geometry, v: &[Value]) -> Vec<RowState> {
    let state_len = 2 + 4 * geo.runs_v as usize;
    v.chunks(state_len).map(|c| RowState { m: c[0], l: c[1], acc: c[2..].to_vec() }).collect()
}

/// The key/value source of the flash core.
struct KeySource {
    k: Value,
    v: Value,
    /// u64 element offset of key 0 of this (sequence, kv head) in `k`, and the u64 stride
    /// between keys.
    base: Value,
    stride: Value,
    /// The same for `v` (`base` and `stride` again when `Dv = D`).
    v_base: Value,
    v_stride: Value,
}

/// How the block copies a tile of keys (rows of `dims` elements, staged `width` wide with
/// zeros past `dims`) to shared memory.
enum Staging {
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
    fn new(b: &mut KernelBuilder, geo: &Geometry, (dims, width): (u32, u32), stride: Value) -> Staging {
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
    fn stage(
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
fn div_const(b: &mut KernelBuilder, x: Value, divisor: u32, bound: u32) -> Value {
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
fn tiles(b: &mut KernelBuilder, geo: &Geometry) -> (SharedId, SharedId) {
    (
        b.shared_array("k_tile", ScalarType::F32, geo.keys * geo.width_k()),
        b.shared_array("v_tile", ScalarType::F32, geo.keys * geo.width_v()),
    )
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
    let raw = load_row(b, geo, lane, q, offset, ok, (geo.runs_k, geo.head_dim));
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
    let vo_strides = cfg.own_v_strides().then(|| {
        let v = ["v_token", "v_head", "v_batch"].map(|n| b.param(n, Type::U64));
        let o = ["o_token", "o_head", "o_batch"].map(|n| b.param(n, Type::U64));
        (v, o)
    });
    let (v_strides, o_strides) = vo_strides.unwrap_or((k_strides, q_strides));
    let mb = mask_ptrs.map(|(mask, bias)| {
        let names = ["batch", "head", "query", "key"];
        let mask_strides = names.map(|n| b.param(format!("mask_{n}"), Type::U64));
        let bias_strides = names.map(|n| b.param(format!("bias_{n}"), Type::U64));
        MaskBias { mask, bias, mask_strides, bias_strides }
    });
    b.launch_bounds(THREADS, geo.min_blocks());
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
        let o_base = vo_strides.map(|_| seq_head_base(b, &o_strides, head));
        let mut rows = Vec::with_capacity(lane.rows.len());
        for &r in &lane.rows {
            let qi = b.add(q0, r);
            let ok = b.lt(qi, q_len);
            let pos = b.add(q_start, qi);
            let at = mad64(b, pos, q_strides[0], q_base);
            let qv = load_q(b, &geo, &lane, q, at, ok, s2);
            // The output row: `q`'s offset, or its own with `Dv ≠ D`.
            let at = match o_base {
                Some(o_base) => mad64(b, pos, o_strides[0], o_base),
                None => at,
            };
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
        let (v_base, v_stride) = match vo_strides {
            Some(_) => {
                let v_base = seq_head_base(b, &v_strides, kv_head);
                (mad64(b, k_start, v_strides[0], v_base), v_strides[0])
            }
            None => (k_base, k_strides[0]),
        };
        let src = KeySource { k, v, base: k_base, stride: k_strides[0], v_base, v_stride };
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
    let (d, dv) = (geo.head_dim, geo.v_head_dim);
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
    b.launch_bounds(THREADS, geo.min_blocks());
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
    let mut rows = Vec::with_capacity(lane.rows.len());
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
    let k_base = b.mul(base, dd);
    // The V cache's rows have `Dv` elements.
    let (v_base, ddv) = if dv == d {
        (k_base, dd)
    } else {
        let ddv = u32c_64(&mut b, dv as u64);
        (b.mul(base, ddv), ddv)
    };
    let src = KeySource { k, v, base: k_base, stride: dd, v_base, v_stride: ddv };
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
    let acc_len = mad64(&mut b, total_rows, ddv, z64);
    for (st, (ok, head, _)) in states.iter().zip(&rows) {
        b.if_then(*ok, |b| {
            let sq = b.fma(seq, q_heads, *head);
            let wrow = b.fma(sq, splits, split);
            let z = b.const_u64(0);
            let acc_off = mad64(b, wrow, ddv, z);
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
/// head) into `out` (`[B, Hq, Dv]`, the dtype). Parameters: `workspace` (f32), `out`,
/// `splits: u32`. Launch: grid `(B · Hq)`, `Dv` threads.
pub fn attention_decode_combine(cfg: &AttentionDecodeConfig) -> Result<Kernel, VerifyError> {
    let d = cfg.v_head_dim;
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

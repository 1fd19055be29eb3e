//! The routing kernels: softmax top-k ([`moe_route`]) and group-limited sigmoid top-k
//! ([`moe_route_grouped`]).
//!
//! Layout: one block per token row and one thread per expert, the block `E` rounded up to a
//! warp (at most [`MAX_EXPERTS`] = 1024 threads). Routing rows are short (8 to 512 experts in
//! the models we serve), so a thread per expert keeps every score in a register, and the
//! selection is one pass over shared memory rather than `top_k` rounds of block reductions
//! (each two barriers): a row of `E ≤ 32` is a single warp either way, and prefill's many rows
//! fill the device with blocks of `E` threads instead of idle ones.
//!
//! Selection: every expert's score becomes one `u64` key, `(order_key(score) << 32) |
//! (0xffff_ffff - id)`, so keys are distinct and a larger key is a larger score or, at equal
//! scores, a lower id. Keys go to shared memory; each thread counts the keys above its own
//! (its rank, a broadcast read per key: no bank conflicts) and the experts of rank `< top_k`
//! write their id and weight to column `rank` of the outputs. No atomics, nothing that depends
//! on scheduling; the sum of the selected weights is a block reduction in expert order.
//!
//! Rows whose logits hold NaN or `+inf`, or only `-inf` (and, grouped, rows where a bias makes
//! a corrected score NaN) get NaN weights and the indices `0, 1, ..., top_k - 1`: their keys
//! are all `id` alone.

use ruda_ir::{CmpOp, Constant, Kernel, KernelBuilder, ScalarType, SharedId, Value, VerifyError};

use crate::blocks::{identity, load_f32, order_key, pack, row_ptr, store_from_f32, warp_reduce, Combine};

/// The most experts (and threads) a routing block handles.
pub const MAX_EXPERTS: u32 = 1024;
/// The most expert groups of [`moe_route_grouped`].
pub const MAX_GROUPS: u32 = 128;
/// Added to the selected scores' sum before [`moe_route_grouped`] divides by it (DeepSeek-V3's
/// `topk_weight.sum() + 1e-20`): all-zero scores give zero weights, not NaN.
pub const GROUPED_RENORM_EPS: f32 = 1e-20;

/// The threads a row of `experts` experts is launched with: one per expert, a whole warp at
/// least.
pub fn route_threads(experts: u32) -> u32 {
    experts.div_ceil(32).max(1) * 32
}

/// A softmax top-k routing kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteConfig {
    pub dtype: ScalarType,
}

impl RouteConfig {
    /// `moe_route.bf16`.
    pub fn id(&self) -> String {
        format!("moe_route.{}", self.dtype)
    }
}

/// A group-limited sigmoid top-k routing kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedRouteConfig {
    pub dtype: ScalarType,
    /// Whether an `f32 [E]` correction bias is added to the scores for selection.
    pub bias: bool,
}

impl GroupedRouteConfig {
    /// `moe_route_grouped.f16`, `moe_route_grouped.f16.bias`.
    pub fn id(&self) -> String {
        let bias = if self.bias { ".bias" } else { "" };
        format!("moe_route_grouped.{}{bias}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_route`], in order (`renormalize`: 0 or 1).
    pub struct RouteParams, RouteValues for RouteConfig as cfg {
        logits: tensor(cfg.dtype),
        indices: tensor(ScalarType::U32),
        weights: tensor(cfg.dtype),
        experts: scalar(u32),
        top_k: scalar(u32),
        renormalize: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_route_grouped`], in order (`group_top_two`, `renormalize`: 0
    /// or 1).
    pub struct GroupedRouteParams, GroupedRouteValues for GroupedRouteConfig as cfg {
        logits: tensor(cfg.dtype),
        bias: opt_tensor(ScalarType::F32, cfg.bias),
        indices: tensor(ScalarType::U32),
        weights: tensor(cfg.dtype),
        experts: scalar(u32),
        top_k: scalar(u32),
        groups: scalar(u32),
        selected_groups: scalar(u32),
        group_top_two: scalar(u32),
        renormalize: scalar(u32),
        scale: scalar(f32),
    }
}

/// A block reduction for a block of any whole number of warps (the launch's, at most 32):
/// every thread gets the result. `scratch` holds one `f32` per warp.
#[track_caller]
pub(super) fn block_reduce_any(b: &mut KernelBuilder, how: Combine, v: Value, scratch: SharedId) -> Value {
    let v = warp_reduce(b, how, v);
    let tid = b.thread_id_x();
    let c32 = b.const_u32(32);
    let warp = b.div(tid, c32);
    let lane = b.lane_id();
    let smem = b.shared_ptr(scratch);
    let zero = b.const_u32(0);
    let lane0 = b.eq(lane, zero);
    b.if_then(lane0, |b| {
        let p = b.ptr_add(smem, warp);
        b.store(p, v);
    });
    b.barrier();
    let threads = b.block_dim_x();
    let warps = b.div(threads, c32);
    let present = b.lt(lane, warps);
    let partial = b.if_else(
        present,
        |b| {
            let p = b.ptr_add(smem, lane);
            vec![b.load(p)]
        },
        |b| vec![identity(b, how)],
    )[0];
    let total = warp_reduce(b, how, partial);
    // The slots are reused only after every warp has read them.
    b.barrier();
    total
}

/// Whether a row's maximum logit says the row is unusable: NaN, `+inf` or `-inf` (only when
/// every logit is `-inf`).
#[track_caller]
fn bad_row(b: &mut KernelBuilder, max: Value) -> Value {
    let a = b.abs(max);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.lt(a, inf); // false for NaN
    b.not(finite)
}

/// The selection key of expert `id` with score `score` (not NaN): larger is better, ties to the
/// lower id; in a bad row, `id` alone.
#[track_caller]
fn select_key(b: &mut KernelBuilder, score: Value, id: Value, bad: Value) -> Value {
    let key = order_key(b, score);
    let zero = b.const_u32(0);
    let key = b.select(bad, zero, key);
    let inv = b.not(id);
    pack(b, key, inv)
}

/// Store this thread's `key` at `keys[id]` (when `valid`), then count the keys above it among
/// the first `experts`: the expert's rank (0 = best). Invalid threads get `u32::MAX`.
#[track_caller]
fn rank(b: &mut KernelBuilder, keys: SharedId, key: Value, id: Value, valid: Value, experts: Value) -> Value {
    let smem = b.shared_ptr(keys);
    b.if_then(valid, |b| {
        let p = b.ptr_add(smem, id);
        b.store(p, key);
    });
    b.barrier();
    b.if_else(
        valid,
        |b| {
            let zero = b.const_u32(0);
            let one = b.const_u32(1);
            let count = b.for_range(zero, experts, one, &[zero], |b, j, acc| {
                let p = b.ptr_add(smem, j);
                let other = b.load(p);
                let above = b.gt(other, key);
                let zero = b.const_u32(0);
                let one = b.const_u32(1);
                let add = b.select(above, one, zero);
                vec![b.add(acc[0], add)]
            })[0];
            vec![count]
        },
        |b| vec![b.const_u32(u32::MAX)],
    )[0]
}

/// A token's rows of the two outputs.
struct RowOut {
    indices: Value,
    weights: Value,
}

impl RowOut {
    #[track_caller]
    fn new(b: &mut KernelBuilder, indices: Value, weights: Value, row: Value, top_k: Value) -> RowOut {
        RowOut { indices: row_ptr(b, indices, row, top_k), weights: row_ptr(b, weights, row, top_k) }
    }

    /// Write expert `id`'s index and weight (`f32`, stored in the weights' dtype) to column
    /// `rank`, when it is selected.
    #[track_caller]
    fn write(&self, b: &mut KernelBuilder, selected: Value, rank: Value, id: Value, weight: Value) {
        b.if_then(selected, |b| {
            let p = b.ptr_add(self.indices, rank);
            b.store(p, id);
            store_from_f32(b, self.weights, rank, weight);
        });
    }
}

/// `w / sum` where `renormalize` is set (non-zero), else `w`.
#[track_caller]
fn maybe_renormalize(b: &mut KernelBuilder, renormalize: Value, w: Value, sum: Value) -> Value {
    let zero = b.const_u32(0);
    let on = b.ne(renormalize, zero);
    let divided = b.div(w, sum);
    b.select(on, divided, w)
}

/// Softmax top-k routing. Parameters: logits `[T, E]`, indices (`u32 [T, top_k]`), weights
/// (`[T, top_k]`, the logits' dtype), experts, top_k, renormalize (`u32`). Grid: `T` blocks of
/// [`route_threads`]`(E)` threads (any whole number of warps `≥ E`, at most 1024).
///
/// `p = softmax(z)` in `f32` (`exp` as `ex2((z - max) · log2 e)`, then `e / Σe` correctly
/// rounded); the `top_k` largest `p` (ties: lower id) in descending order; with `renormalize`,
/// each divided by their sum.
pub fn moe_route(cfg: &RouteConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RouteValues { logits, indices, weights, experts, top_k, renormalize } = RouteParams::declare(&mut b, cfg);
    b.launch_bounds(MAX_EXPERTS, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, MAX_EXPERTS / 32);
    let sum_scratch = b.shared_array("sum_partials", ScalarType::F32, MAX_EXPERTS / 32);
    let sel_scratch = b.shared_array("selected_partials", ScalarType::F32, MAX_EXPERTS / 32);
    let keys = b.shared_array("keys", ScalarType::U64, MAX_EXPERTS);

    let row = b.block_id_x();
    let id = b.thread_id_x();
    let valid = b.lt(id, experts);
    let row_in = row_ptr(&mut b, logits, row, experts);
    let z = b.if_else(valid, |b| vec![load_f32(b, row_in, id)], |b| vec![b.const_f32(f32::NEG_INFINITY)])[0];
    let max = block_reduce_any(&mut b, Combine::MaxNan, z, max_scratch);
    let bad = bad_row(&mut b, max);

    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let d = b.sub(z, max);
    let t = b.mul(d, log2e);
    let e = b.ex2(t);
    let zero_f = b.const_f32(0.0);
    let e = b.select(valid, e, zero_f);
    let sum = block_reduce_any(&mut b, Combine::Sum, e, sum_scratch);
    let p = b.div(e, sum);
    let p = b.select(bad, zero_f, p); // keeps NaN out of the key; the weight is NaN below

    let key = select_key(&mut b, p, id, bad);
    let r = rank(&mut b, keys, key, id, valid, experts);
    let selected = b.lt(r, top_k);
    let kept = b.select(selected, p, zero_f);
    let kept_sum = block_reduce_any(&mut b, Combine::Sum, kept, sel_scratch);
    let w = maybe_renormalize(&mut b, renormalize, p, kept_sum);
    let nan = b.const_f32(f32::NAN);
    let w = b.select(bad, nan, w);
    RowOut::new(&mut b, indices, weights, row, top_k).write(&mut b, selected, r, id, w);
    b.finish()
}

/// The larger and smaller of two top-two pairs merged (a multiset's two largest values, so the
/// result does not depend on the order of merging).
#[track_caller]
fn merge_top_two(b: &mut KernelBuilder, (a1, a2): (Value, Value), (b1, b2): (Value, Value)) -> (Value, Value) {
    let first = b.max(a1, b1);
    let lower = b.min(a1, b1);
    let seconds = b.max(a2, b2);
    (first, b.max(lower, seconds))
}

/// Group-limited sigmoid top-k routing (DeepSeek-V3's `noaux_tc`). Parameters: logits `[T,
/// E]`, bias (`f32 [E]`, in the `.bias` configurations), indices (`u32 [T, top_k]`), weights
/// (`[T, top_k]`, the logits' dtype), experts, top_k, groups, selected_groups, group_top_two,
/// renormalize (`u32`), scale (`f32`). Grid: `T` blocks of [`route_threads`]`(E)` threads.
///
/// `s = sigmoid(z)` in `f32` (`1 / (1 + ex2(-z · log2 e))`), `c = s + bias`; a group's score is
/// its largest `c`, or the sum of its two largest with `group_top_two`; the `selected_groups`
/// best groups (ties: lower group id) are kept, and among their experts the `top_k` largest
/// `c` (ties: lower id), in descending `c` order. Weights are their `s`, divided by `Σs +`
/// [`GROUPED_RENORM_EPS`] with `renormalize`, times `scale`.
pub fn moe_route_grouped(cfg: &GroupedRouteConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GroupedRouteValues {
        logits,
        bias,
        indices,
        weights,
        experts,
        top_k,
        groups,
        selected_groups,
        group_top_two,
        renormalize,
        scale,
    } = GroupedRouteParams::declare(&mut b, cfg);
    b.launch_bounds(MAX_EXPERTS, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, MAX_EXPERTS / 32);
    let sel_scratch = b.shared_array("selected_partials", ScalarType::F32, MAX_EXPERTS / 32);
    let corrected = b.shared_array("corrected", ScalarType::F32, MAX_EXPERTS);
    let group_scores = b.shared_array("group_scores", ScalarType::F32, MAX_GROUPS);
    let keys = b.shared_array("keys", ScalarType::U64, MAX_EXPERTS);

    let row = b.block_id_x();
    let id = b.thread_id_x();
    let valid = b.lt(id, experts);
    let row_in = row_ptr(&mut b, logits, row, experts);
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let z = b.if_else(valid, |b| vec![load_f32(b, row_in, id)], |b| vec![b.const_f32(f32::NEG_INFINITY)])[0];
    let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
    let t = b.mul(z, neg_log2e);
    let e = b.ex2(t);
    let one_f = b.const_f32(1.0);
    let denom = b.add(one_f, e);
    let s = b.rcp(denom);
    let c = match bias {
        Some(bias) => {
            let beta = b.if_else(valid, |b| vec![load_f32(b, bias, id)], |b| vec![b.const_f32(0.0)])[0];
            b.add(s, beta)
        }
        None => s,
    };
    let c = b.select(valid, c, ninf);
    // A NaN corrected score (from the bias) marks the row bad like a NaN logit.
    let c_nan = b.cmp(CmpOp::Nan, c, c);
    let nan = b.const_f32(f32::NAN);
    let probe = b.select(c_nan, nan, z);
    let max = block_reduce_any(&mut b, Combine::MaxNan, probe, max_scratch);
    let bad = bad_row(&mut b, max);
    let corr = b.shared_ptr(corrected);
    b.if_then(valid, |b| {
        let p = b.ptr_add(corr, id);
        b.store(p, c);
    });
    b.barrier();

    // Group scores: warp w scores groups w, w + warps, ...; its lanes read the group's
    // consecutive corrected scores and merge their top two across the warp.
    let per_group = b.div(experts, groups);
    let c32 = b.const_u32(32);
    let warp = b.div(id, c32);
    let threads = b.block_dim_x();
    let warps = b.div(threads, c32);
    let lane = b.lane_id();
    let zero = b.const_u32(0);
    let top_two_on = b.ne(group_top_two, zero);
    let gs = b.shared_ptr(group_scores);
    b.for_each(warp, groups, warps, |b, g| {
        let base = b.mul(g, per_group);
        let ninf = b.const_f32(f32::NEG_INFINITY);
        let step = b.const_u32(32);
        let top = b.for_range(lane, per_group, step, &[ninf, ninf], |b, j, acc| {
            let i = b.add(base, j);
            let p = b.ptr_add(corr, i);
            let v = b.load(p);
            let ninf = b.const_f32(f32::NEG_INFINITY);
            let (a1, a2) = merge_top_two(b, (acc[0], acc[1]), (v, ninf));
            vec![a1, a2]
        });
        let (mut a1, mut a2) = (top[0], top[1]);
        for mask in [16, 8, 4, 2, 1] {
            let o1 = b.shfl_xor(a1, mask);
            let o2 = b.shfl_xor(a2, mask);
            (a1, a2) = merge_top_two(b, (a1, a2), (o1, o2));
        }
        let pair = b.add(a1, a2);
        let score = b.select(top_two_on, pair, a1);
        let zero = b.const_u32(0);
        let lane0 = b.eq(lane, zero);
        b.if_then(lane0, |b| {
            let p = b.ptr_add(gs, g);
            b.store(p, score);
        });
    });
    b.barrier();

    // Whether this expert's group is among the best `selected_groups`: its group's rank
    // (a broadcast read per group) against them.
    let own_group = b.div(id, per_group);
    let in_best = b.if_else(
        valid,
        |b| {
            let p = b.ptr_add(gs, own_group);
            let own = b.load(p);
            let never = b.const_pred(false);
            let own_key = select_key(b, own, own_group, never);
            let zero = b.const_u32(0);
            let one = b.const_u32(1);
            let above = b.for_range(zero, groups, one, &[zero], |b, g, acc| {
                let p = b.ptr_add(gs, g);
                let v = b.load(p);
                let never = b.const_pred(false);
                let key = select_key(b, v, g, never);
                let gt = b.gt(key, own_key);
                let zero = b.const_u32(0);
                let one = b.const_u32(1);
                let add = b.select(gt, one, zero);
                vec![b.add(acc[0], add)]
            })[0];
            vec![b.lt(above, selected_groups)]
        },
        |b| vec![b.const_pred(false)],
    )[0];

    let key = select_key(&mut b, c, id, bad);
    let zero64 = b.constant(Constant::u64(0));
    let candidate = b.or(in_best, bad);
    let key = b.select(candidate, key, zero64);
    let r = rank(&mut b, keys, key, id, valid, experts);
    let selected = b.lt(r, top_k);
    let zero_f = b.const_f32(0.0);
    let kept = b.select(selected, s, zero_f);
    let kept_sum = block_reduce_any(&mut b, Combine::Sum, kept, sel_scratch);
    let eps = b.const_f32(GROUPED_RENORM_EPS);
    let denom = b.add(kept_sum, eps);
    let w = maybe_renormalize(&mut b, renormalize, s, denom);
    let w = b.mul(w, scale);
    let w = b.select(bad, nan, w);
    RowOut::new(&mut b, indices, weights, row, top_k).write(&mut b, selected, r, id, w);
    b.finish()
}

//! The router-training kernels: the weights of a fixed selection of experts
//! ([`moe_router_weights`]) and their gradient with respect to the logits
//! ([`moe_router_backward`]).
//!
//! Layout as the routing kernels': one block per token row, one thread per expert
//! ([`super::kernel::route_threads`]), so each score stays in a register. The row's scores (softmax over all
//! `E` experts, or each expert's sigmoid) go to shared memory; the first `top_k` threads read
//! the selected ids there (gather semantics: an id may repeat), and the sums over the selection
//! are block reductions. The backward's per-expert sums over the selection (`G_e = Σ_{k: i_k =
//! e} g_k` and the multiplicity `m_e`) are a loop over the `top_k ≤ 64` ids in shared memory,
//! a broadcast read each.
//!
//! An index outside `0..E` (negative ones included, for the signed types) makes its whole row
//! NaN; it is never used to address memory (the threads read score 0 instead).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use super::kernel::{block_reduce_any, MAX_EXPERTS};
use crate::blocks::{load_f32, row_ptr, store_from_f32, Combine};

/// The most experts one token selects in training.
pub const MAX_TRAINING_TOP_K: u32 = 64;

/// A router-training kernel: the logits' float dtype and the indices' integer dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouterTrainConfig {
    pub dtype: ScalarType,
    /// `U32`, `I32` or `I64`.
    pub index: ScalarType,
}

impl RouterTrainConfig {
    /// `moe_router_weights.bf16.s64`.
    pub fn weights_id(&self) -> String {
        format!("moe_router_weights.{}.{}", self.dtype, self.index)
    }

    /// `moe_router_backward.f32.u32`.
    pub fn backward_id(&self) -> String {
        format!("moe_router_backward.{}.{}", self.dtype, self.index)
    }
}

/// The index dtypes the kernels take.
pub const INDEX_DTYPES: [ScalarType; 3] = [ScalarType::U32, ScalarType::I32, ScalarType::I64];

crate::kernel_params! {
    /// The parameters of [`moe_router_weights`], in order (`sigmoid`, `renormalize`: 0 or 1).
    pub struct RouterWeightsParams, RouterWeightsValues for RouterTrainConfig as cfg {
        logits: tensor(cfg.dtype),
        indices: tensor(cfg.index),
        weights: tensor(ScalarType::F32),
        experts: scalar(u32),
        top_k: scalar(u32),
        sigmoid: scalar(u32),
        renormalize: scalar(u32),
        scale: scalar(f32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_router_backward`], in order (`sigmoid`, `renormalize`: 0 or 1).
    pub struct RouterBackwardParams, RouterBackwardValues for RouterTrainConfig as cfg {
        logits: tensor(cfg.dtype),
        indices: tensor(cfg.index),
        grad_weights: tensor(ScalarType::F32),
        grad_logits: tensor(cfg.dtype),
        experts: scalar(u32),
        top_k: scalar(u32),
        sigmoid: scalar(u32),
        renormalize: scalar(u32),
        scale: scalar(f32),
    }
}

/// What both kernels compute first for their row.
struct RowScores {
    /// This thread's expert id and whether it is one (`id < E`).
    id: Value,
    valid: Value,
    /// Its score: `p = softmax(z)` or `σ(z)`, `f32` (0 for threads past `E`).
    score: Value,
    /// Whether the row is scored by sigmoid.
    sigmoid: Value,
    /// Whether this thread is a selection slot (`k < top_k`), and the score of its expert (0 when
    /// the index is invalid).
    slot: Value,
    selected_score: Value,
    /// Whether any index of the row is outside `0..E`.
    bad_index: Value,
}

/// The scores of one row, stored to `scores` in shared memory, and each selection slot's id
/// and score. `ids` (shared `u32 [64]`) receives the selection's ids.
#[track_caller]
fn row_scores(
    b: &mut KernelBuilder,
    cfg: &RouterTrainConfig,
    (logits, indices): (Value, Value),
    (experts, top_k, sigmoid): (Value, Value, Value),
    shared: &Shared,
) -> RowScores {
    let row = b.block_id_x();
    let id = b.thread_id_x();
    let valid = b.lt(id, experts);
    let row_in = row_ptr(b, logits, row, experts);
    let z = b.if_else(valid, |b| vec![load_f32(b, row_in, id)], |b| vec![b.const_f32(f32::NEG_INFINITY)])[0];
    let zero_u = b.const_u32(0);
    let sigmoid = b.ne(sigmoid, zero_u);
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let zero_f = b.const_f32(0.0);
    // The softmax's maximum and sum are taken in every row (uniform control flow), used in
    // softmax rows only.
    let max = block_reduce_any(b, Combine::MaxNan, z, shared.max);
    let d = b.sub(z, max);
    let t = b.mul(d, log2e);
    let e = b.ex2(t);
    let e = b.select(valid, e, zero_f);
    let sum = block_reduce_any(b, Combine::Sum, e, shared.sum);
    let p = b.div(e, sum);
    let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
    let t = b.mul(z, neg_log2e);
    let e = b.ex2(t);
    let one_f = b.const_f32(1.0);
    let denom = b.add(one_f, e);
    let s = b.rcp(denom);
    let score = b.select(sigmoid, s, p);
    let score = b.select(valid, score, zero_f);
    let scores = b.shared_ptr(shared.scores);
    b.if_then(valid, |b| {
        let ptr = b.ptr_add(scores, id);
        b.store(ptr, score);
    });

    // Selection slots: thread k < top_k reads index k of the row.
    let slot = b.lt(id, top_k);
    let row_idx = row_ptr(b, indices, row, top_k);
    let (index_ok, selected_id) = {
        let out = b.if_else(
            slot,
            |b| {
                let p = b.ptr_add(row_idx, id);
                let raw = b.load(p);
                let ok = index_in_range(b, cfg.index, raw, experts);
                let as_u32 = if cfg.index == ScalarType::U32 { raw } else { b.cvt(raw, ScalarType::U32) };
                let zero = b.const_u32(0);
                vec![ok, b.select(ok, as_u32, zero)]
            },
            |b| vec![b.const_pred(true), b.const_u32(0)],
        );
        (out[0], out[1])
    };
    let ids = b.shared_ptr(shared.ids);
    b.if_then(slot, |b| {
        let p = b.ptr_add(ids, id);
        b.store(p, selected_id);
    });
    let one_f = b.const_f32(1.0);
    let flag = b.select(index_ok, zero_f, one_f);
    let bad_count = block_reduce_any(b, Combine::Sum, flag, shared.flags);
    let bad_index = b.gt(bad_count, zero_f);
    b.barrier();
    let selected_score = b.if_else(
        slot,
        |b| {
            let p = b.ptr_add(scores, selected_id);
            vec![b.load(p)]
        },
        |b| vec![b.const_f32(0.0)],
    )[0];
    RowScores { id, valid, score, sigmoid, slot, selected_score, bad_index }
}

/// Whether `raw` (of the indices' dtype) names one of the `experts`.
#[track_caller]
fn index_in_range(b: &mut KernelBuilder, index: ScalarType, raw: Value, experts: Value) -> Value {
    match index {
        ScalarType::U32 => b.lt(raw, experts),
        ScalarType::I32 => {
            let zero = b.const_i32(0);
            let e = b.cvt(experts, ScalarType::I32);
            let non_negative = b.ge(raw, zero);
            let below = b.lt(raw, e);
            b.and(non_negative, below)
        }
        _ => {
            let zero = b.const_i64(0);
            let e = b.cvt(experts, ScalarType::I64);
            let non_negative = b.ge(raw, zero);
            let below = b.lt(raw, e);
            b.and(non_negative, below)
        }
    }
}

/// The shared arrays both kernels use.
struct Shared {
    max: ruda_ir::SharedId,
    sum: ruda_ir::SharedId,
    flags: ruda_ir::SharedId,
    selected: ruda_ir::SharedId,
    scores: ruda_ir::SharedId,
    ids: ruda_ir::SharedId,
}

impl Shared {
    fn declare(b: &mut KernelBuilder) -> Shared {
        let warps = MAX_EXPERTS / 32;
        Shared {
            max: b.shared_array("max_partials", ScalarType::F32, warps),
            sum: b.shared_array("sum_partials", ScalarType::F32, warps),
            flags: b.shared_array("flag_partials", ScalarType::F32, warps),
            selected: b.shared_array("selected_partials", ScalarType::F32, warps),
            scores: b.shared_array("scores", ScalarType::F32, MAX_EXPERTS),
            ids: b.shared_array("selected_ids", ScalarType::U32, MAX_TRAINING_TOP_K),
        }
    }
}

/// The selected scores' sum `S` (over the `top_k` slots, repeats counted).
#[track_caller]
fn selected_sum(b: &mut KernelBuilder, r: &RowScores, shared: &Shared) -> Value {
    block_reduce_any(b, Combine::Sum, r.selected_score, shared.selected)
}

/// The weights of a fixed selection. Parameters: logits `[T, E]`, indices (`[T, top_k]`, the
/// config's integer dtype), weights (`f32 [T, top_k]`), experts, top_k, sigmoid, renormalize
/// (`u32`), scale (`f32`). Grid: `T` blocks of [`super::kernel::route_threads`]`(E)` threads.
///
/// Scores `s = softmax(z)` over all `E` (as [`super::kernel::moe_route`]) or `s = σ(z)` (as
/// [`super::kernel::moe_route_grouped`]), in `f32`; slot `k`'s weight is `s[i_k]`, divided by
/// `Σ_j s[i_j]` with `renormalize`, times `scale`. A row with an index outside `0..E` is NaN.
pub fn moe_router_weights(cfg: &RouterTrainConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.weights_id().replace('.', "_"));
    let RouterWeightsValues { logits, indices, weights, experts, top_k, sigmoid, renormalize, scale } =
        RouterWeightsParams::declare(&mut b, cfg);
    b.launch_bounds(MAX_EXPERTS, None);
    let shared = Shared::declare(&mut b);
    let r = row_scores(&mut b, cfg, (logits, indices), (experts, top_k, sigmoid), &shared);
    let total = selected_sum(&mut b, &r, &shared);
    let zero = b.const_u32(0);
    let renorm = b.ne(renormalize, zero);
    let divided = b.div(r.selected_score, total);
    let w = b.select(renorm, divided, r.selected_score);
    let w = b.mul(w, scale);
    let nan = b.const_f32(f32::NAN);
    let w = b.select(r.bad_index, nan, w);
    let row = b.block_id_x();
    let out = row_ptr(&mut b, weights, row, top_k);
    b.if_then(r.slot, |b| store_from_f32(b, out, r.id, w));
    b.finish()
}

/// The gradient of the logits from the weights' gradient, for a fixed selection. Parameters:
/// logits `[T, E]`, indices (`[T, top_k]`), grad_weights (`f32 [T, top_k]`), grad_logits (`[T,
/// E]`, the logits' dtype), experts, top_k, sigmoid, renormalize (`u32`), scale (`f32`). Grid:
/// `T` blocks of [`super::kernel::route_threads`]`(E)` threads.
///
/// With `c = scale`, `G_e = Σ_{k: i_k = e} g_k`, multiplicity `m_e`, `S = Σ_k s[i_k]` and `A =
/// Σ_k g_k s[i_k] / S`: the scores' gradient is `q_e = c G_e`, or `q_e = (c / S)(G_e − m_e A)`
/// with `renormalize`; the logits' is `s_e (q_e − Σ_j s_j q_j)` for softmax and `q_e s_e (1 −
/// s_e)` for sigmoid. A row with an index outside `0..E` is NaN.
pub fn moe_router_backward(cfg: &RouterTrainConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.backward_id().replace('.', "_"));
    let RouterBackwardValues {
        logits,
        indices,
        grad_weights,
        grad_logits,
        experts,
        top_k,
        sigmoid,
        renormalize,
        scale,
    } = RouterBackwardParams::declare(&mut b, cfg);
    b.launch_bounds(MAX_EXPERTS, None);
    let shared = Shared::declare(&mut b);
    let grads = b.shared_array("selected_grads", ScalarType::F32, MAX_TRAINING_TOP_K);
    let r = row_scores(&mut b, cfg, (logits, indices), (experts, top_k, sigmoid), &shared);
    let row = b.block_id_x();
    let g_row = row_ptr(&mut b, grad_weights, row, top_k);
    let g = b.if_else(r.slot, |b| vec![load_f32(b, g_row, r.id)], |b| vec![b.const_f32(0.0)])[0];
    let gs = b.shared_ptr(grads);
    b.if_then(r.slot, |b| {
        let p = b.ptr_add(gs, r.id);
        b.store(p, g);
    });
    let total = selected_sum(&mut b, &r, &shared);
    let gw = b.mul(g, r.selected_score);
    let weighted = block_reduce_any(&mut b, Combine::Sum, gw, shared.sum);
    let a = b.div(weighted, total);

    // G_e and m_e: this expert's slots (the barrier in the reduction above published the ids
    // and gradients).
    let ids = b.shared_ptr(shared.ids);
    let zero_u = b.const_u32(0);
    let one_u = b.const_u32(1);
    let zero_f = b.const_f32(0.0);
    let sums = b.for_range(zero_u, top_k, one_u, &[zero_f, zero_f], |b, k, acc| {
        let p = b.ptr_add(ids, k);
        let e = b.load(p);
        let mine = b.eq(e, r.id);
        let p = b.ptr_add(gs, k);
        let gk = b.load(p);
        let zero = b.const_f32(0.0);
        let one = b.const_f32(1.0);
        let add_g = b.select(mine, gk, zero);
        let add_m = b.select(mine, one, zero);
        vec![b.add(acc[0], add_g), b.add(acc[1], add_m)]
    });
    let (big_g, m) = (sums[0], sums[1]);
    let renorm = b.ne(renormalize, zero_u);
    let ma = b.mul(m, a);
    let centred = b.sub(big_g, ma);
    let over_s = b.div(scale, total);
    let q_renorm = b.mul(over_s, centred);
    let q_plain = b.mul(scale, big_g);
    let q = b.select(renorm, q_renorm, q_plain);
    let q = b.select(r.valid, q, zero_f);

    // Softmax: s_e (q_e − Σ s q), the sum taken in every row (uniform control flow).
    let sq = b.mul(r.score, q);
    let dot = block_reduce_any(&mut b, Combine::Sum, sq, shared.max);
    let diff = b.sub(q, dot);
    let d_softmax = b.mul(r.score, diff);
    let one_f = b.const_f32(1.0);
    let rest = b.sub(one_f, r.score);
    let slope = b.mul(r.score, rest);
    let d_sigmoid = b.mul(q, slope);
    let d = b.select(r.sigmoid, d_sigmoid, d_softmax);
    let nan = b.const_f32(f32::NAN);
    let d = b.select(r.bad_index, nan, d);
    let out = row_ptr(&mut b, grad_logits, row, experts);
    b.if_then(r.valid, |b| store_from_f32(b, out, r.id, d));
    b.finish()
}

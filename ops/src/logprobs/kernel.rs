//! Log-probabilities of one row of logits: the chosen token's and the `n` largest (`n` ≤
//! [`LOGPROBS_MAX_TOP`]), as `log_softmax` (vLLM's `raw_logprobs`: the model's logits before
//! penalties or temperature) in f32.
//!
//! For a row `z` (widened to f32), one block per row:
//!
//! 1. `m = max(z)`, NaN-propagating, and the largest element by the order below (one pass).
//! 2. `s = Σ ex2((z_i - m) · log2(e))` (one pass; `ex2` is PTX's `ex2.approx`), `l = lg2(s) ·
//!    ln(2)`; a token's value is `(z_i - m) - l` (so `-inf` for a `-inf` logit).
//! 3. The top `n` in `torch.topk`'s order: larger first, NaN above everything, ties to the
//!    lower id, `-0 == +0`. Each candidate is the `u64` `(key << 32) | !id` of argmax, so the
//!    order is the integer order of those words and round `r` (one pass each) takes the largest
//!    word below round `r - 1`'s: exact and independent of the order of combination.
//!
//! NaN rule: a row holding a NaN, a `+inf`, or only `-inf` has no finite log-softmax: every value
//! of it is NaN (`m` or `s` is NaN there). A chosen id outside the row gets NaN too.

use ruda_ir::{Constant, Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{
    argmax_key, block_reduce, block_reduce_with, load_f32, low32, pack, row_ptr, warp_max_u64, Combine,
};

/// Threads per block.
pub const LOGPROBS_THREADS: u32 = 256;

/// The most top tokens one call returns (OpenAI's `top_logprobs` limit).
pub const LOGPROBS_MAX_TOP: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogprobsConfig {
    pub dtype: ScalarType,
}

impl LogprobsConfig {
    /// `logprobs.bf16`.
    pub fn id(&self) -> String {
        format!("logprobs.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`logprobs`] (the kernel), in order.
    pub struct LogprobsKernelParams, LogprobsValues for LogprobsConfig as cfg {
        logits: tensor(cfg.dtype),
        chosen: tensor(ScalarType::U32),
        ids: tensor(ScalarType::U32),
        values: tensor(ScalarType::F32),
        cols: scalar(u32),
        top: scalar(u32),
    }
}

/// Parameters: logits `[rows, cols]`, chosen (`u32 [rows]`), ids (`u32 [rows, 1 + top]`),
/// values (`f32 [rows, 1 + top]`), cols, top (`u32`, at most [`LOGPROBS_MAX_TOP`] and `cols`).
/// Column 0 of ids and values is the chosen token, columns `1..=top` the top tokens, largest
/// first. Grid: `rows` blocks of [`LOGPROBS_THREADS`].
pub fn logprobs(cfg: &LogprobsConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let LogprobsValues { logits, chosen, ids, values, cols, top } = LogprobsKernelParams::declare(&mut b, cfg);
    b.launch_bounds(LOGPROBS_THREADS, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, LOGPROBS_THREADS / 32);
    let sum_scratch = b.shared_array("sum_partials", ScalarType::F32, LOGPROBS_THREADS / 32);
    let top_scratch = b.shared_array("top_partials", ScalarType::U64, LOGPROBS_THREADS / 32);

    let row_id = b.block_id_x();
    let row = row_ptr(&mut b, logits, row_id, cols);
    let tid = b.thread_id_x();
    let step = b.const_u32(LOGPROBS_THREADS);
    let word = |b: &mut KernelBuilder, z, j| {
        let key = argmax_key(b, z);
        let inv = b.not(j);
        pack(b, key, inv)
    };

    // 1. The maximum and the first of the top tokens.
    let ninf = b.const_f32(f32::NEG_INFINITY);
    let none = b.constant(Constant::u64(0));
    let acc = b.for_range(tid, cols, step, &[ninf, none], |b, j, acc| {
        let z = load_f32(b, row, j);
        let m = crate::blocks::combine(b, Combine::MaxNan, acc[0], z);
        let w = word(b, z, j);
        vec![m, b.max(acc[1], w)]
    });
    let m = block_reduce(&mut b, Combine::MaxNan, acc[0], LOGPROBS_THREADS, max_scratch);
    let first = block_reduce_with(
        &mut b,
        acc[1],
        LOGPROBS_THREADS,
        top_scratch,
        |b| b.constant(Constant::u64(0)),
        |b, v| warp_max_u64(b, v),
    );

    // 2. The log of the sum of exponentials relative to the maximum.
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let zero = b.const_f32(0.0);
    let partial = b.for_range(tid, cols, step, &[zero], |b, j, acc| {
        let z = load_f32(b, row, j);
        let d = b.sub(z, m);
        let t = b.mul(d, log2e);
        let e = b.ex2(t);
        vec![b.add(acc[0], e)]
    })[0];
    let s = block_reduce(&mut b, Combine::Sum, partial, LOGPROBS_THREADS, sum_scratch);
    let lg = b.lg2(s);
    let ln2 = b.const_f32(std::f32::consts::LN_2);
    let l = b.mul(lg, ln2);
    let value_of = |b: &mut KernelBuilder, j| {
        let z = load_f32(b, row, j);
        let d = b.sub(z, m);
        b.sub(d, l)
    };

    // Thread 0 writes column `c` of the row.
    let width = {
        let one = b.const_u32(1);
        b.add(top, one)
    };
    let out_base = b.mul(row_id, width);
    let zero_u = b.const_u32(0);
    let writer = b.eq(tid, zero_u);
    let write = |b: &mut KernelBuilder, c, id, v| {
        b.if_then(writer, |b| {
            let i = b.add(out_base, c);
            let p = b.ptr_add(ids, i);
            b.store(p, id);
            let p = b.ptr_add(values, i);
            b.store(p, v);
        });
    };

    // The chosen token (NaN when outside the row; its load is clamped inside).
    let p = b.ptr_add(chosen, row_id);
    let c = b.load(p);
    let inside = b.lt(c, cols);
    let one = b.const_u32(1);
    let last = b.sub(cols, one);
    let safe = b.min(c, last);
    let v = value_of(&mut b, safe);
    let nan = b.const_f32(f32::NAN);
    let v = b.select(inside, v, nan);
    write(&mut b, zero_u, c, v);

    // 3. The top tokens, one block-wide maximum below the previous one per round.
    let has_top = b.ge(top, one);
    b.if_then(has_top, |b| {
        let inv = low32(b, first);
        let id = b.not(inv);
        let v = value_of(b, id);
        write(b, one, id, v);
    });
    let two = b.const_u32(2);
    let end = b.add(top, one);
    b.for_range(two, end, one, &[first], |b, col, prev| {
        let prev = prev[0];
        let none = b.constant(Constant::u64(0));
        let best = b.for_range(tid, cols, step, &[none], |b, j, acc| {
            let z = load_f32(b, row, j);
            let w = word(b, z, j);
            let below = b.lt(w, prev);
            let zero64 = b.constant(Constant::u64(0));
            let w = b.select(below, w, zero64);
            vec![b.max(acc[0], w)]
        })[0];
        let best = block_reduce_with(
            b,
            best,
            LOGPROBS_THREADS,
            top_scratch,
            |b| b.constant(Constant::u64(0)),
            |b, v| warp_max_u64(b, v),
        );
        let inv = low32(b, best);
        let id = b.not(inv);
        let v = value_of(b, id);
        write(b, col, id, v);
        vec![best]
    });
    b.finish()
}

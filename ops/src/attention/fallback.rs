//! The multi-kernel fallback's masked softmax over f32 scores (the GEMMs around it are the
//! GEMM family's).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use super::flash::*;
use super::geometry::*;
use crate::blocks::{block_reduce, combine, identity, Combine};

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

crate::kernel_params! {
    /// The parameters of [`attention_softmax`] (see [`AttentionSoftmaxConfig`]): `mask`, `bias`,
    /// the (sequence, head) of the scores and the mask's and bias's strides when masked.
    pub struct AttentionSoftmaxParams, AttentionSoftmaxValues for AttentionSoftmaxConfig as cfg {
        scores: tensor(ScalarType::F32),
        probs: tensor(ScalarType::F32),
        mask: opt_tensor(ScalarType::U8, cfg.masked),
        bias: opt_tensor(ScalarType::F32, cfg.masked),
        scale: scalar(f32),
        q_len: scalar(u32),
        kv_len: scalar(u32),
        batch: opt_scalar(u32, cfg.masked),
        head: opt_scalar(u32, cfg.masked),
        mask_batch: opt_scalar(u64, cfg.masked),
        mask_head: opt_scalar(u64, cfg.masked),
        mask_query: opt_scalar(u64, cfg.masked),
        mask_key: opt_scalar(u64, cfg.masked),
        bias_batch: opt_scalar(u64, cfg.masked),
        bias_head: opt_scalar(u64, cfg.masked),
        bias_query: opt_scalar(u64, cfg.masked),
        bias_key: opt_scalar(u64, cfg.masked),
    }
}

/// Build the fallback's masked softmax (see [`AttentionSoftmaxConfig`]).
pub fn attention_softmax(cfg: &AttentionSoftmaxConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = AttentionSoftmaxParams::declare(&mut b, cfg);
    let AttentionSoftmaxValues { scores, probs, scale, q_len, kv_len, .. } = p;
    let mb = mask_bias(
        p.mask.zip(p.bias),
        [p.mask_batch, p.mask_head, p.mask_query, p.mask_key],
        [p.bias_batch, p.bias_head, p.bias_query, p.bias_key],
    )
    .zip(p.batch.zip(p.head))
    .map(|(mb, (seq, head))| (mb, seq, head));
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

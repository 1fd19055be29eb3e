//! RMSNorm fused with the residual add before it, in Hugging Face's order of roundings
//! (`Qwen2RMSNorm` after `hidden_states = residual + hidden_states`):
//!
//! ```text
//! r   = round(x + residual)                  # the residual stream stays in the model dtype
//! var = mean(r²)                             # f32, over the row
//! h   = round(r · (1 / sqrt(var + eps)))     # hidden.to(f32) * rsqrt(...), then .to(dtype)
//! out = round(gamma · h)                     # weight * hidden, weight in f32 here
//! ```
//!
//! `round` rounds to the model dtype (nearest even; the identity for `f32`). Hugging Face keeps
//! the weight in the model dtype, so with `gamma` holding those (bf16) values exactly the last
//! product is the same. `1 / sqrt` is two correctly rounded steps, as in [`crate::norm::kernel`].
//!
//! Without the residual (`rms_norm_hf`), `r = x`: Hugging Face's RMSNorm alone, for a model's
//! norms that follow no residual add (the first layer's input norm, Qwen3's q/k norms). The
//! plain `rms_norm` ([`crate::norm::kernel`]) instead rounds once, after `gamma`.
//! One block per row; the hidden size is compiled in.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{block_reduce, load_f32, round_to, row_ptr, store_from_f32, Combine, ROW_BLOCK};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FusedNormConfig {
    pub dtype: ScalarType,
    pub hidden: u32,
    /// With the residual add (`rms_norm_residual`); without it, the same RMSNorm alone in Hugging
    /// Face's rounding order (`rms_norm_hf`: `r = x`).
    pub residual: bool,
}

impl FusedNormConfig {
    /// `rms_norm_residual.bf16.h896` or `rms_norm_hf.bf16.h128`.
    pub fn id(&self) -> String {
        let op = if self.residual { "rms_norm_residual" } else { "rms_norm_hf" };
        format!("{op}.{}.h{}", self.dtype, self.hidden)
    }
}

crate::kernel_params! {
    /// The parameters of [`rms_norm_residual`], in order (the residual pair only when
    /// `cfg.residual`).
    pub struct RmsNormResidualParams, RmsNormResidualValues for FusedNormConfig as cfg {
        x: tensor(cfg.dtype),
        residual: opt_tensor(cfg.dtype, cfg.residual),
        gamma: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        residual_out: opt_tensor(cfg.dtype, cfg.residual),
        eps: scalar(f32),
    }
}

/// Parameters: x, residual, gamma (`f32 [H]`), out, residual_out, eps (`f32`); without
/// `cfg.residual`: x, gamma, out, eps. Grid: one block of [`ROW_BLOCK`] threads per row. Each
/// thread re-reads only the `residual_out` elements it wrote, so on CUDA `residual_out` may
/// alias `residual` (or `x`).
pub fn rms_norm_residual(cfg: &FusedNormConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RmsNormResidualValues { x, residual, gamma, out, residual_out, eps } =
        RmsNormResidualParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_BLOCK, None);
    let scratch = b.shared_array("partials", ScalarType::F32, ROW_BLOCK / 32);

    let row_id = b.block_id_x();
    let cols = b.const_u32(cfg.hidden);
    let x_row = row_ptr(&mut b, x, row_id, cols);
    // Without a residual, `r` is `x` itself.
    let rows =
        residual.zip(residual_out).map(|(r, s)| (row_ptr(&mut b, r, row_id, cols), row_ptr(&mut b, s, row_id, cols)));
    let sum_row = rows.map_or(x_row, |(_, s)| s);
    let out_row = row_ptr(&mut b, out, row_id, cols);
    let tid = b.thread_id_x();
    let step = b.const_u32(ROW_BLOCK);
    let zero = b.const_f32(0.0);
    let partial = b.for_range(tid, cols, step, &[zero], |b, j, acc| {
        let a = load_f32(b, x_row, j);
        let s = match rows {
            Some((res_row, sum_row)) => {
                let r = load_f32(b, res_row, j);
                let s = b.add(a, r);
                let s = round_to(b, cfg.dtype, s);
                store_from_f32(b, sum_row, j, s);
                s
            }
            None => a,
        };
        let sq = b.mul(s, s);
        vec![b.add(acc[0], sq)]
    })[0];
    let sum_sq = block_reduce(&mut b, Combine::Sum, partial, ROW_BLOCK, scratch);
    let h = b.const_f32(cfg.hidden as f32);
    let mean_sq = b.div(sum_sq, h);
    let var_eps = b.add(mean_sq, eps);
    let root = b.sqrt(var_eps);
    let scale = b.rcp(root);
    b.for_each(tid, cols, step, |b, j| {
        let s = load_f32(b, sum_row, j);
        let g = load_f32(b, gamma, j);
        let y = b.mul(s, scale);
        let y = round_to(b, cfg.dtype, y);
        let y = b.mul(g, y);
        store_from_f32(b, out_row, j, y);
    });
    b.finish()
}

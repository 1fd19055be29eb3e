//! RMSNorm fused with the residual add, and RMSNorm alone, in Hugging Face's rounding order (see
//! [`super::kernel`]).

use ruda_runtime::{LaunchConfig, Stream, Tensor};

use super::kernel::{FusedNormConfig, RmsNormResidualParams};
use crate::blocks::ROW_BLOCK;
use crate::error::Result;
use crate::host::*;
use crate::norm::api::check_norm;
use crate::params;

/// `residual_out = x + residual` (rounded to the dtype: the residual stream stays in the model
/// dtype) and `out = gamma · round(residual_out / sqrt(mean(residual_out²) + eps))`, statistics in
/// `f32`, `gamma` `f32 [H]` — the order of roundings of Hugging Face's decoder layer followed by
/// `Qwen2RMSNorm`. `x`, `residual`, `out` and `residual_out` share shape `[..., H]` and dtype. On
/// CUDA `residual_out` may be `residual` (in place); the CPU device rejects aliasing.
pub fn rms_norm_residual_into(
    stream: &Stream,
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    eps: f32,
    out: &Tensor,
    residual_out: &Tensor,
) -> Result<()> {
    launch_hf_norm("rms_norm_residual", stream, x, Some((residual, residual_out)), gamma, eps, out)
}

/// Check and launch Hugging Face's RMSNorm, after the residual add when `residual` holds
/// `(residual, residual_out)`.
fn launch_hf_norm(
    name: &'static str,
    stream: &Stream,
    x: &Tensor,
    residual: Option<(&Tensor, &Tensor)>,
    gamma: &Tensor,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let (dtype, rows, hidden) = check_norm(name, stream, x, &[("gamma", gamma)], eps, out)?;
    if let Some((r, r_out)) = residual {
        for (what, t) in [("residual", r), ("residual_out", r_out)] {
            contiguous_nonempty(name, what, t)?;
            expect_shape(name, what, t, x.shape())?;
            expect_dtype(name, what, t, x.dtype())?;
        }
        same_device(name, stream, &[("residual", r), ("residual_out", r_out)])?;
    }
    let cfg = FusedNormConfig { dtype, hidden, residual: residual.is_some() };
    let k = kernel(cfg.id(), || crate::kernels::fused_norm::rms_norm_residual(&cfg))?;
    let args = RmsNormResidualParams {
        x,
        residual: residual.map(|(r, _)| r),
        gamma,
        out,
        residual_out: residual.map(|(_, r_out)| r_out),
        eps,
    };
    params::launch(stream, &k, LaunchConfig::linear(rows, ROW_BLOCK), &args.args())?;
    Ok(())
}

/// `(out, residual_out)` of [`rms_norm_residual_into`].
pub fn rms_norm_residual(x: &Tensor, residual: &Tensor, gamma: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    let residual_out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rms_norm_residual_into(&x.device().default_stream(), x, residual, gamma, eps, &out, &residual_out)?;
    Ok((out, residual_out))
}

/// RMSNorm over the last axis in Hugging Face's order of roundings (`Qwen2RMSNorm`):
/// `out = round(gamma · round(x / sqrt(mean(x²) + eps)))`, statistics in `f32`, `gamma` `f32 [H]`,
/// `out` in `x`'s dtype and shape. [`crate::api::rms_norm_into`] rounds only once, after
/// `gamma`; for f32 the two are the same. The CPU device rejects `out` aliasing `x`.
pub fn rms_norm_hf_into(stream: &Stream, x: &Tensor, gamma: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    launch_hf_norm("rms_norm_hf", stream, x, None, gamma, eps, out)
}

/// [`rms_norm_hf_into`] into a new tensor.
pub fn rms_norm_hf(x: &Tensor, gamma: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rms_norm_hf_into(&x.device().default_stream(), x, gamma, eps, &out)?;
    Ok(out)
}

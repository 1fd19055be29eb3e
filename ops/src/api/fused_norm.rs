//! RMSNorm fused with the residual add, and RMSNorm alone, in Hugging Face's rounding order (see
//! [`crate::kernels::fused_norm`]).

use ruda_runtime::{Arg, DType, LaunchConfig, Stream, Tensor};

use super::*;
use crate::kernels::fused_norm::FusedNormConfig;
use crate::kernels::rows::ROW_BLOCK;

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
    let name = "rms_norm_residual";
    let dtype = float_dtype(name, x)?;
    for (what, t) in [("x", x), ("residual", residual), ("out", out), ("residual_out", residual_out)] {
        contiguous_nonempty(name, what, t)?;
        expect_shape(name, what, t, x.shape())?;
        expect_dtype(name, what, t, x.dtype())?;
    }
    let hidden = *x.shape().last().unwrap_or(&0);
    contiguous_nonempty(name, "gamma", gamma)?;
    expect_shape(name, "gamma", gamma, &[hidden])?;
    expect_dtype(name, "gamma", gamma, DType::F32)?;
    same_device(
        name,
        stream,
        &[("x", x), ("residual", residual), ("gamma", gamma), ("out", out), ("residual_out", residual_out)],
    )?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OpError::InvalidArgument {
            op: name,
            message: format!("epsilon must be finite and positive, got {eps}"),
        });
    }
    let (rows, hidden) = rows_cols(name, x)?;
    let cfg = FusedNormConfig { dtype, hidden, residual: true };
    let k = kernel(cfg.id(), || crate::kernels::fused_norm::rms_norm_residual(&cfg))?;
    let args = [
        Arg::Tensor(x),
        Arg::Tensor(residual),
        Arg::Tensor(gamma),
        Arg::Tensor(out),
        Arg::Tensor(residual_out),
        Arg::scalar(eps),
    ];
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
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
/// `out` in `x`'s dtype and shape. [`rms_norm_into`] (the ruDNN contract) rounds only once, after
/// `gamma`; for f32 the two are the same. The CPU device rejects `out` aliasing `x`.
pub fn rms_norm_hf_into(stream: &Stream, x: &Tensor, gamma: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let name = "rms_norm_hf";
    let dtype = float_dtype(name, x)?;
    for (what, t) in [("x", x), ("out", out)] {
        contiguous_nonempty(name, what, t)?;
        expect_shape(name, what, t, x.shape())?;
        expect_dtype(name, what, t, x.dtype())?;
    }
    let hidden = *x.shape().last().unwrap_or(&0);
    contiguous_nonempty(name, "gamma", gamma)?;
    expect_shape(name, "gamma", gamma, &[hidden])?;
    expect_dtype(name, "gamma", gamma, DType::F32)?;
    same_device(name, stream, &[("x", x), ("gamma", gamma), ("out", out)])?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OpError::InvalidArgument { op: name, message: format!("epsilon must be finite and positive, got {eps}") });
    }
    let (rows, hidden) = rows_cols(name, x)?;
    let cfg = FusedNormConfig { dtype, hidden, residual: false };
    let k = kernel(cfg.id(), || crate::kernels::fused_norm::rms_norm_residual(&cfg))?;
    let args = [Arg::Tensor(x), Arg::Tensor(gamma), Arg::Tensor(out), Arg::scalar(eps)];
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
    Ok(())
}

/// [`rms_norm_hf_into`] into a new tensor.
pub fn rms_norm_hf(x: &Tensor, gamma: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rms_norm_hf_into(&x.device().default_stream(), x, gamma, eps, &out)?;
    Ok(out)
}

//! RMSNorm and LayerNorm.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;
use ruda_ir::ScalarType;

use super::kernel::{LayerNormParams, NormConfig, RmsNormParams};
use crate::blocks::ROW_BLOCK;

pub(super) fn check_norm(
    name: &'static str,
    stream: &Stream,
    input: &Tensor,
    params: &[(&str, &Tensor)],
    eps: f32,
    out: &Tensor,
) -> Result<(ScalarType, u32, u32)> {
    let dtype = float_dtype(name, input)?;
    contiguous_nonempty(name, "input", input)?;
    let hidden = *input.shape().last().unwrap_or(&0);
    for (pname, p) in params {
        contiguous_nonempty(name, pname, p)?;
        expect_shape(name, pname, p, &[hidden])?;
        expect_dtype(name, pname, p, DType::F32)?;
    }
    expect_tensor(name, "out", out, input.dtype(), input.shape())?;
    same_device(name, stream, &[("input", input), ("out", out)])?;
    same_device(name, stream, params)?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OpError::InvalidArgument {
            op: name,
            message: format!("epsilon must be finite and positive, got {eps}"),
        });
    }
    let (rows, hidden) = rows_cols(name, input)?;
    Ok((dtype, rows, hidden))
}

/// RMSNorm over the last axis: `out = x / sqrt(mean(x²) + eps) * gamma`, statistics in `f32`,
/// `gamma` `f32` of shape `[H]`, `out` in the input dtype.
pub fn rms_norm_into(stream: &Stream, input: &Tensor, gamma: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let (dtype, rows, hidden) = check_norm("rms_norm", stream, input, &[("gamma", gamma)], eps, out)?;
    let cfg = NormConfig { dtype, hidden, beta: false };
    let k = kernel(cfg.rms_id(), || crate::kernels::rms_norm(&cfg))?;
    params::launch(
        stream,
        &k,
        LaunchConfig::linear(rows, ROW_BLOCK),
        &RmsNormParams { input, gamma, out, eps }.args(),
    )?;
    Ok(())
}

/// RMSNorm over the last axis (see [`rms_norm_into`]).
pub fn rms_norm(input: &Tensor, gamma: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(input.device(), input.dtype(), input.shape())?;
    rms_norm_into(&input.device().default_stream(), input, gamma, eps, &out)?;
    Ok(out)
}

/// LayerNorm over the last axis: `out = (x - mean) / sqrt(var + eps) * gamma + beta`, with
/// `f32` statistics and affine parameters of shape `[H]`; `out` in the input dtype.
pub fn layer_norm_into(
    stream: &Stream,
    input: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let mut params = vec![("gamma", gamma)];
    params.extend(beta.map(|b| ("beta", b)));
    let (dtype, rows, hidden) = check_norm("layer_norm", stream, input, &params, eps, out)?;
    let cfg = NormConfig { dtype, hidden, beta: beta.is_some() };
    let k = kernel(cfg.layer_id(), || crate::kernels::layer_norm(&cfg))?;
    params::launch(
        stream,
        &k,
        LaunchConfig::linear(rows, ROW_BLOCK),
        &LayerNormParams { input, gamma, beta, out, eps }.args(),
    )?;
    Ok(())
}

/// LayerNorm over the last axis (see [`layer_norm_into`]).
pub fn layer_norm(input: &Tensor, gamma: &Tensor, beta: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(input.device(), input.dtype(), input.shape())?;
    layer_norm_into(&input.device().default_stream(), input, gamma, beta, eps, &out)?;
    Ok(out)
}

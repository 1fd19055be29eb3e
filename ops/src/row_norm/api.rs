//! L2 normalisation, the zero-centred RMSNorm and the gated RMSNorm over the last axis.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{
    row_norm, RowNormConfig, RowNormKind, RowNormParams, RowOwner, ROWS_PER_WARP_BLOCK, ROW_NORM_THREADS,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Rows longer than this are one block's rather than one warp's.
pub const ROW_NORM_WARP_MAX_COLS: u32 = 1024;

/// The tensors of one norm (those its kind takes).
struct Operands<'a> {
    x: &'a Tensor,
    /// `(residual, residual_out)`.
    residual: Option<(&'a Tensor, &'a Tensor)>,
    z: Option<&'a Tensor>,
    weight: Option<&'a Tensor>,
    out: &'a Tensor,
}

/// Check the operands of one norm and launch it.
fn launch_row_norm(kind: RowNormKind, stream: &Stream, ops: Operands<'_>, eps: f32) -> Result<()> {
    let Operands { x, residual, z, weight, out } = ops;
    let name = kind.name();
    let dtype = float_dtype(name, x)?;
    let x_stride = row_stride(name, "x", x)?;
    let cols = *x.shape().last().unwrap_or(&0);
    let like_x = residual.into_iter().flat_map(|(r, s)| [("residual", r), ("residual_out", s)]);
    for (what, t) in like_x.chain(z.map(|z| ("z", z))) {
        contiguous_nonempty(name, what, t)?;
        expect_shape(name, what, t, x.shape())?;
        expect_dtype(name, what, t, x.dtype())?;
        same_device(name, stream, &[(what, t)])?;
    }
    if let Some(w) = weight {
        expect_tensor(name, "weight", w, DType::F32, &[cols])?;
        same_device(name, stream, &[("weight", w)])?;
    }
    expect_tensor(name, "out", out, x.dtype(), x.shape())?;
    same_device(name, stream, &[("x", x), ("out", out)])?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OpError::InvalidArgument {
            op: name,
            message: format!("epsilon must be finite and positive, got {eps}"),
        });
    }
    let (rows, cols) = rows_cols(name, x)?;
    let owner = if cols <= ROW_NORM_WARP_MAX_COLS { RowOwner::Warp } else { RowOwner::Block };
    let cfg = RowNormConfig { kind, dtype, owner };
    let k = kernel(cfg.id(), || row_norm(&cfg))?;
    let blocks = match owner {
        RowOwner::Warp => rows.div_ceil(ROWS_PER_WARP_BLOCK),
        RowOwner::Block => rows,
    };
    let (residual, residual_out) = (residual.map(|(r, _)| r), residual.map(|(_, s)| s));
    let args = RowNormParams { x, residual, z, weight, out, residual_out, rows, cols, x_stride, eps };
    params::launch(stream, &k, LaunchConfig::linear(blocks, ROW_NORM_THREADS), &args.args())
}

/// L2 normalisation over the last axis: `out = x · (1 / sqrt(Σx² + eps))` in `f32`, rounded to
/// `x`'s dtype (Qwen3.5's `l2norm` of q and k per head, `eps` 1e-6). `out` has `x`'s shape and
/// dtype. In every norm here `x` may be a view whose last axis is dense and whose rows are
/// evenly spaced (read in place); the other tensors are dense.
pub fn l2_norm_into(stream: &Stream, x: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    launch_row_norm(RowNormKind::L2, stream, Operands { x, residual: None, z: None, weight: None, out }, eps)
}

/// [`l2_norm_into`] into a new tensor.
pub fn l2_norm(x: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    l2_norm_into(&x.device().default_stream(), x, eps, &out)?;
    Ok(out)
}

/// Qwen3.5's RMSNorm over the last axis, its weight stored as an offset from one:
/// `out = x · (1 / sqrt(mean(x²) + eps)) · (1 + weight)`, all in `f32` and rounded once to
/// `x`'s dtype (as `Qwen3_5RMSNorm`, which casts only the product). `weight` is `f32 [D]`.
pub fn rms_norm_zero_centred_into(stream: &Stream, x: &Tensor, weight: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    let ops = Operands { x, residual: None, z: None, weight: Some(weight), out };
    launch_row_norm(RowNormKind::ZeroCentred, stream, ops, eps)
}

/// [`rms_norm_zero_centred_into`] into a new tensor.
pub fn rms_norm_zero_centred(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rms_norm_zero_centred_into(&x.device().default_stream(), x, weight, eps, &out)?;
    Ok(out)
}

/// The residual add and Qwen3.5's RMSNorm of its decoder layers in one pass, in Hugging Face's
/// order: `residual_out = round(x + residual)` (the residual stream stays in the dtype), then
/// `out = residual_out · (1 / sqrt(mean(residual_out²) + eps)) · (1 + weight)` in `f32`, rounded
/// once. `x`, `residual`, `out` and `residual_out` share shape `[..., D]` and dtype, `weight` is
/// `f32 [D]`. On CUDA `residual_out` may be `residual` (in place); the CPU device rejects
/// aliasing.
pub fn rms_norm_zero_centred_residual_into(
    stream: &Stream,
    x: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    eps: f32,
    out: &Tensor,
    residual_out: &Tensor,
) -> Result<()> {
    let ops = Operands { x, residual: Some((residual, residual_out)), z: None, weight: Some(weight), out };
    launch_row_norm(RowNormKind::ZeroCentredResidual, stream, ops, eps)
}

/// `(out, residual_out)` of [`rms_norm_zero_centred_residual_into`].
pub fn rms_norm_zero_centred_residual(
    x: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    let residual_out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    let stream = x.device().default_stream();
    rms_norm_zero_centred_residual_into(&stream, x, residual, weight, eps, &out, &residual_out)?;
    Ok((out, residual_out))
}

/// The gated RMSNorm of the linear-attention output, per row (one value head):
/// `out = weight · (x · (1 / sqrt(mean(x²) + eps))) · silu(z)`, in `f32` and rounded once to
/// `x`'s dtype (Hugging Face also rounds the normalised `x` to the dtype before the weight; this
/// is at least as accurate). `z` has `x`'s shape and dtype, `weight` is `f32 [V]` (not
/// zero-centred).
pub fn gated_rms_norm_into(
    stream: &Stream,
    x: &Tensor,
    z: &Tensor,
    weight: &Tensor,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let ops = Operands { x, residual: None, z: Some(z), weight: Some(weight), out };
    launch_row_norm(RowNormKind::Gated, stream, ops, eps)
}

/// [`gated_rms_norm_into`] into a new tensor.
pub fn gated_rms_norm(x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    gated_rms_norm_into(&x.device().default_stream(), x, z, weight, eps, &out)?;
    Ok(out)
}

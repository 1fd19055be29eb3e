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

/// Check the operands of one norm and launch it.
fn launch_row_norm(
    kind: RowNormKind,
    stream: &Stream,
    x: &Tensor,
    z: Option<&Tensor>,
    weight: Option<&Tensor>,
    eps: f32,
    out: &Tensor,
) -> Result<()> {
    let name = kind.name();
    let dtype = float_dtype(name, x)?;
    contiguous_nonempty(name, "x", x)?;
    let cols = *x.shape().last().unwrap_or(&0);
    if let Some(z) = z {
        contiguous_nonempty(name, "z", z)?;
        expect_shape(name, "z", z, x.shape())?;
        expect_dtype(name, "z", z, x.dtype())?;
        same_device(name, stream, &[("z", z)])?;
    }
    if let Some(w) = weight {
        contiguous_nonempty(name, "weight", w)?;
        expect_shape(name, "weight", w, &[cols])?;
        expect_dtype(name, "weight", w, DType::F32)?;
        same_device(name, stream, &[("weight", w)])?;
    }
    contiguous_nonempty(name, "out", out)?;
    expect_shape(name, "out", out, x.shape())?;
    expect_dtype(name, "out", out, x.dtype())?;
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
    let args = RowNormParams { x, z, weight, out, rows, cols, eps };
    params::launch(stream, &k, LaunchConfig::linear(blocks, ROW_NORM_THREADS), &args.args())
}

/// L2 normalisation over the last axis: `out = x · (1 / sqrt(Σx² + eps))` in `f32`, rounded to
/// `x`'s dtype (Qwen3.5's `l2norm` of q and k per head, `eps` 1e-6). `out` has `x`'s shape and
/// dtype.
pub fn l2_norm_into(stream: &Stream, x: &Tensor, eps: f32, out: &Tensor) -> Result<()> {
    launch_row_norm(RowNormKind::L2, stream, x, None, None, eps, out)
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
    launch_row_norm(RowNormKind::ZeroCentred, stream, x, None, Some(weight), eps, out)
}

/// [`rms_norm_zero_centred_into`] into a new tensor.
pub fn rms_norm_zero_centred(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    rms_norm_zero_centred_into(&x.device().default_stream(), x, weight, eps, &out)?;
    Ok(out)
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
    launch_row_norm(RowNormKind::Gated, stream, x, Some(z), Some(weight), eps, out)
}

/// [`gated_rms_norm_into`] into a new tensor.
pub fn gated_rms_norm(x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    gated_rms_norm_into(&x.device().default_stream(), x, z, weight, eps, &out)?;
    Ok(out)
}

//! The full-attention output gate: split `q_proj`'s per-head halves, and `x · sigmoid(gate)`.

use ruda_runtime::{LaunchConfig, Stream, Tensor};

use super::kernel::{
    sigmoid_gate as gate_kernel, split_heads_halves as split_kernel, AttnGateConfig, SigmoidGateParams,
    SplitHalvesParams, ATTN_GATE_THREADS,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// `out = x · sigmoid(gate)` elementwise, in `f32` and rounded once (Qwen3.5's
/// `attn_output * torch.sigmoid(gate)`, which also rounds the sigmoid to the dtype first).
/// `x`, `gate` and `out` share one shape and float dtype; `gate` may be a view whose last axis
/// is dense and whose rows are evenly spaced, such as `q_proj`'s output `[T, H, 2·D]` narrowed
/// to its second halves (read in place, so no split is needed).
pub fn sigmoid_gate_into(stream: &Stream, x: &Tensor, gate: &Tensor, out: &Tensor) -> Result<()> {
    let op = "sigmoid_gate";
    let dtype = float_dtype(op, x)?;
    let gate_stride = row_stride(op, "gate", gate)?;
    expect_shape(op, "gate", gate, x.shape())?;
    expect_dtype(op, "gate", gate, x.dtype())?;
    for (name, t) in [("x", x), ("out", out)] {
        contiguous_nonempty(op, name, t)?;
        expect_shape(op, name, t, x.shape())?;
        expect_dtype(op, name, t, x.dtype())?;
    }
    same_device(op, stream, &[("x", x), ("gate", gate), ("out", out)])?;
    let n = to_u32(op, "elements", x.numel())?;
    let cols = to_u32(op, "last axis", *x.shape().last().unwrap_or(&1))?;
    let cfg = AttnGateConfig { dtype };
    let k = kernel(cfg.gate_id(), || gate_kernel(&cfg))?;
    let launch = LaunchConfig::linear(n.div_ceil(ATTN_GATE_THREADS), ATTN_GATE_THREADS);
    params::launch(stream, &k, launch, &SigmoidGateParams { x, gate, out, n, cols, gate_stride }.args())
}

/// [`sigmoid_gate_into`] into a new tensor.
pub fn sigmoid_gate(x: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    sigmoid_gate_into(&x.device().default_stream(), x, gate, &out)?;
    Ok(out)
}

/// The shape of either half of `x` `[..., 2·D]`: `[..., D]`.
fn half_shape(op: &'static str, x: &Tensor) -> Result<Vec<usize>> {
    let mut shape = x.shape().to_vec();
    match shape.last_mut() {
        Some(last) if *last % 2 == 0 && *last > 0 => {
            *last /= 2;
            Ok(shape)
        }
        _ => Err(OpError::Shape {
            op,
            message: format!("`x` is {:?}; its last axis must be even: [first half | second half]", x.shape()),
        }),
    }
}

/// Split every row of `x` `[..., 2·D]` (Qwen3.5's `q_proj` output viewed as `[T, H, 2·D]`)
/// into its first halves (`first`, the queries) and second halves (`second`, the gates), both
/// `[..., D]` of `x`'s dtype; an exact copy.
pub fn split_heads_halves_into(stream: &Stream, x: &Tensor, first: &Tensor, second: &Tensor) -> Result<()> {
    let op = "split_heads_halves";
    let dtype = float_dtype(op, x)?;
    contiguous_nonempty(op, "x", x)?;
    let shape = half_shape(op, x)?;
    for (name, t) in [("first", first), ("second", second)] {
        contiguous_nonempty(op, name, t)?;
        expect_shape(op, name, t, &shape)?;
        expect_dtype(op, name, t, x.dtype())?;
    }
    same_device(op, stream, &[("x", x), ("first", first), ("second", second)])?;
    let n = to_u32(op, "elements", first.numel())?;
    let half = to_u32(op, "half width", *shape.last().unwrap_or(&0))?;
    let cfg = AttnGateConfig { dtype };
    let k = kernel(cfg.split_id(), || split_kernel(&cfg))?;
    let launch = LaunchConfig::linear(n.div_ceil(ATTN_GATE_THREADS), ATTN_GATE_THREADS);
    params::launch(stream, &k, launch, &SplitHalvesParams { x, first, second, n, half }.args())
}

/// `(first, second)` of [`split_heads_halves_into`], on `x`'s default stream.
pub fn split_heads_halves(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = "split_heads_halves";
    float_dtype(op, x)?;
    let shape = half_shape(op, x)?;
    let first = Tensor::empty(x.device(), x.dtype(), &shape)?;
    let second = Tensor::empty(x.device(), x.dtype(), &shape)?;
    split_heads_halves_into(&x.device().default_stream(), x, &first, &second)?;
    Ok((first, second))
}

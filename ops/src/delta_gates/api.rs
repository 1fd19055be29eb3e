//! The gates of the gated delta rule (`beta`, `g`) from the `in_proj_b` / `in_proj_a` outputs.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{gated_delta_gates as gates_kernel, GatesConfig, GatesParams, GATES_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// `beta = sigmoid(b)` and `g = -exp(a_log) · softplus(a + dt_bias)` (softplus the identity
/// above 20, as torch's), all in `f32`: the `beta` and `log_decay` of the gated delta rule. `a`
/// and `b` are `[T, Hv]` (or any shape ending in `Hv`) of one float dtype; `a_log` and `dt_bias`
/// `[Hv]`, both `f32` or both of `a`'s dtype, broadcast over the tokens; `beta` and `g` are
/// `f32` of `a`'s shape.
pub fn gated_delta_gates_into(
    stream: &Stream,
    a: &Tensor,
    b: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    beta: &Tensor,
    g: &Tensor,
) -> Result<()> {
    let op = "gated_delta_gates";
    let dtype = float_dtype(op, a)?;
    contiguous_nonempty(op, "a", a)?;
    expect_tensor(op, "b", b, a.dtype(), a.shape())?;
    let heads = *a.shape().last().unwrap_or(&0);
    for (name, p) in [("a_log", a_log), ("dt_bias", dt_bias)] {
        contiguous_nonempty(op, name, p)?;
        expect_shape(op, name, p, &[heads])?;
    }
    let params_dtype = a_log.dtype();
    if params_dtype != DType::F32 && params_dtype != a.dtype() {
        return Err(OpError::DType {
            op,
            message: format!("`a_log` is {params_dtype}, expected f32 or {}", a.dtype()),
        });
    }
    expect_dtype(op, "dt_bias", dt_bias, params_dtype)?;
    for (name, t) in [("beta", beta), ("g", g)] {
        contiguous_nonempty(op, name, t)?;
        expect_shape(op, name, t, a.shape())?;
        expect_dtype(op, name, t, DType::F32)?;
    }
    same_device(op, stream, &[("a", a), ("b", b), ("a_log", a_log), ("dt_bias", dt_bias), ("beta", beta), ("g", g)])?;
    let n = to_u32(op, "elements", a.numel())?;
    let heads = to_u32(op, "heads", heads)?;
    let cfg = GatesConfig { dtype, params: params_dtype.scalar_type() };
    let k = kernel(cfg.id(), || gates_kernel(&cfg))?;
    let args = GatesParams { a, b, a_log, dt_bias, beta, g, n, heads };
    params::launch(stream, &k, LaunchConfig::linear(n.div_ceil(GATES_THREADS), GATES_THREADS), &args.args())
}

/// `(beta, g)` of [`gated_delta_gates_into`], on `a`'s default stream.
pub fn gated_delta_gates(a: &Tensor, b: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<(Tensor, Tensor)> {
    let beta = Tensor::empty(a.device(), DType::F32, a.shape())?;
    let g = Tensor::empty(a.device(), DType::F32, a.shape())?;
    gated_delta_gates_into(&a.device().default_stream(), a, b, a_log, dt_bias, &beta, &g)?;
    Ok((beta, g))
}

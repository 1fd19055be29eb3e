//! AWQ projections: `out[M, N] = x[M, K] · W (+ bias)` with `W` in AutoAWQ's GEMM layout.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{
    AwqDequantizeConfig, AwqDequantizeParams, AwqGemvConfig, AwqGemvParams, AWQ_DEQUANT_THREADS, AWQ_DEQUANT_TILE,
    AWQ_GEMV_THREADS, AWQ_GEMV_WORDS,
};
use crate::error::{OpError, Result};
use crate::gemm::api::{linear_with_into, Epilogue, LinearProblem, Strategy};
use crate::gemv::api::GEMV_MAX_M;
use crate::host::*;
use crate::params;

/// One projection's AWQ weights (AutoAWQ's `WQLinear_GEMM`, 4 bits with zero points):
/// `qweight` `i32 [K, N/8]`, `qzeros` `i32 [K/G, N/8]`, `scales` `f16 [K/G, N]`, for `K` inputs,
/// `N` outputs and groups of `group_size` (`G`) inputs. See [`crate::awq::kernel`] for the
/// packing and the weight each nibble stands for.
#[derive(Clone, Copy)]
pub struct AwqWeight<'a> {
    pub qweight: &'a Tensor,
    pub qzeros: &'a Tensor,
    pub scales: &'a Tensor,
    pub group_size: usize,
}

impl AwqWeight<'_> {
    /// `(N, K)`: outputs and inputs, read from `qweight`'s shape.
    pub fn shape(&self) -> (usize, usize) {
        match self.qweight.shape() {
            [k, words] => (8 * words, *k),
            _ => (0, 0),
        }
    }
}

/// Validated `(N, K, G)` of `w` on `stream`'s device.
fn check_weight(op: &'static str, stream: &Stream, w: &AwqWeight<'_>) -> Result<(u32, u32, u32)> {
    let shape_err = |message: String| OpError::Shape { op, message };
    for (name, t, dtype) in
        [("qweight", w.qweight, DType::I32), ("qzeros", w.qzeros, DType::I32), ("scales", w.scales, DType::F16)]
    {
        contiguous_nonempty(op, name, t)?;
        expect_dtype(op, name, t, dtype)?;
        if t.rank() != 2 {
            return Err(shape_err(format!("`{name}` must be 2-D, is {:?}", t.shape())));
        }
    }
    same_device(op, stream, &[("qweight", w.qweight), ("qzeros", w.qzeros), ("scales", w.scales)])?;
    let (n, k) = w.shape();
    let g = w.group_size;
    if g == 0 || !k.is_multiple_of(g) {
        return Err(OpError::InvalidArgument {
            op,
            message: format!("group_size {g} must be positive and divide K = {k} (`qweight`'s rows)"),
        });
    }
    if !(w.scales.offset() * 2).is_multiple_of(16) {
        return Err(OpError::InvalidArgument {
            op,
            message: "`scales` must start 16-byte aligned (the GEMV reads a word's eight scales at once)".into(),
        });
    }
    expect_shape(op, "qzeros", w.qzeros, &[k / g, n / 8])?;
    expect_shape(op, "scales", w.scales, &[k / g, n])?;
    to_u32(op, "elements of the dense weight", n * k)?;
    Ok((to_u32(op, "n", n)?, to_u32(op, "k", k)?, to_u32(op, "group_size", g)?))
}

/// `out[M, N] = x[M, K] · W (+ bias[N])` for `M ≤ 16` rows (decode), reading the packed weights
/// once: `x`, `bias` and `out` of one float dtype, each weight as [`awq_dequantize_into`] writes
/// it in that dtype, products and sums in `f32`, rounded once.
/// Neither allocates nor synchronises.
pub fn awq_gemv_into(
    stream: &Stream,
    x: &Tensor,
    w: &AwqWeight<'_>,
    bias: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let op = "awq_gemv";
    let dtype = float_dtype(op, x)?;
    let (n, k, group_size) = check_weight(op, stream, w)?;
    contiguous_nonempty(op, "x", x)?;
    let m = match x.shape() {
        [m, kx] if *kx == k as usize => *m,
        other => {
            return Err(OpError::Shape { op, message: format!("`x` is {other:?}; the weight takes [M, {k}]") });
        }
    };
    if m > GEMV_MAX_M {
        return Err(OpError::Shape {
            op,
            message: format!("`x` has {m} rows; the AWQ GEMV takes at most {GEMV_MAX_M} (`awq_linear_into` takes any)"),
        });
    }
    expect_tensor(op, "out", out, x.dtype(), &[m, n as usize])?;
    contiguous_nonempty(op, "out", out)?;
    if let Some(bias) = bias {
        expect_tensor(op, "bias", bias, x.dtype(), &[n as usize])?;
        contiguous_nonempty(op, "bias", bias)?;
        same_device(op, stream, &[("bias", bias)])?;
    }
    same_device(op, stream, &[("x", x), ("out", out)])?;
    let m = to_u32(op, "m", m)?;
    let cfg = AwqGemvConfig { dtype, m_tile: AwqGemvConfig::m_tile_for(m), bias: bias.is_some() };
    let kernel = kernel(cfg.id(), || crate::kernels::awq::awq_gemv(&cfg))?;
    let launch = LaunchConfig {
        grid: [n.div_ceil(8 * AWQ_GEMV_WORDS), m.div_ceil(cfg.m_tile), 1],
        block: [AWQ_GEMV_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args =
        AwqGemvParams { x, qweight: w.qweight, qzeros: w.qzeros, scales: w.scales, out, bias, m, n, k, group_size };
    params::launch(stream, &kernel, launch, &args.args())
}

/// The dense weight `out[N, K]` (`nn.Linear`'s layout, any float dtype) of `w`: each element
/// `f16((q − zero) · scale)`, then converted to `out`'s dtype (exact for f32; bf16 rounds it
/// again). Neither allocates nor synchronises.
pub fn awq_dequantize_into(stream: &Stream, w: &AwqWeight<'_>, out: &Tensor) -> Result<()> {
    let op = "awq_dequantize";
    let (n, k, group_size) = check_weight(op, stream, w)?;
    let dtype = float_dtype(op, out)?;
    contiguous_nonempty(op, "out", out)?;
    expect_shape(op, "out", out, &[n as usize, k as usize])?;
    same_device(op, stream, &[("out", out)])?;
    let cfg = AwqDequantizeConfig { dtype };
    let kernel = kernel(cfg.id(), || crate::kernels::awq::awq_dequantize(&cfg))?;
    let launch = LaunchConfig {
        grid: [k.div_ceil(AWQ_DEQUANT_TILE), (n / 8).div_ceil(AWQ_DEQUANT_TILE), 1],
        block: [AWQ_DEQUANT_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args = AwqDequantizeParams { qweight: w.qweight, qzeros: w.qzeros, scales: w.scales, out, n, k, group_size };
    params::launch(stream, &kernel, launch, &args.args())
}

/// The dense weight `[N, K]` of `w` in `dtype` (see [`awq_dequantize_into`]).
pub fn awq_dequantize(w: &AwqWeight<'_>, dtype: DType) -> Result<Tensor> {
    let (n, k) = w.shape();
    let out = Tensor::empty(w.qweight.device(), dtype, &[n, k])?;
    awq_dequantize_into(&w.qweight.device().default_stream(), w, &out)?;
    Ok(out)
}

/// `out[M, N] = x[M, K] · W (+ bias[N])` for any `M`: up to [`GEMV_MAX_M`] rows the AWQ GEMV;
/// beyond, `W` dequantised into `scratch` (at least `N · K` elements of `x`'s dtype; the
/// first `N · K` are overwritten) and the product (bias in its epilogue) by
/// [`linear_with_into`] with `strategy` (`Strategy::Auto`, or a tuned tile). Neither allocates
/// nor synchronises.
pub fn awq_linear_into(
    stream: &Stream,
    x: &Tensor,
    w: &AwqWeight<'_>,
    bias: Option<&Tensor>,
    out: &Tensor,
    scratch: Option<&Tensor>,
    strategy: Strategy,
) -> Result<()> {
    let op = "awq_linear";
    if x.rank() == 2 && x.shape()[0] <= GEMV_MAX_M {
        return awq_gemv_into(stream, x, w, bias, out);
    }
    let (n, k) = w.shape();
    let scratch = scratch.ok_or_else(|| OpError::InvalidArgument {
        op,
        message: format!("{} rows need a scratch of N·K = {} elements for the dense weight", x.shape()[0], n * k),
    })?;
    expect_dtype(op, "scratch", scratch, x.dtype())?;
    contiguous_nonempty(op, "scratch", scratch)?;
    if scratch.numel() < n * k {
        return Err(OpError::Shape {
            op,
            message: format!("`scratch` holds {} elements; the dense weight needs N·K = {}", scratch.numel(), n * k),
        });
    }
    let dense = scratch.reshape(&[scratch.numel()])?.narrow(0, 0, n * k)?.reshape(&[n, k])?;
    awq_dequantize_into(stream, w, &dense)?;
    linear_with_into(stream, LinearProblem::new(x, &dense, out), Epilogue { bias, residual: None }, strategy)
}

/// `x · W (+ bias)` in a new tensor of `x`'s dtype, allocating the dense weight where `x` has
/// more than [`GEMV_MAX_M`] rows (see [`awq_linear_into`]).
pub fn awq_linear(x: &Tensor, w: &AwqWeight<'_>, bias: Option<&Tensor>) -> Result<Tensor> {
    let (n, k) = w.shape();
    let rows = x.shape().first().copied().unwrap_or(0);
    let out = Tensor::empty(x.device(), x.dtype(), &[rows, n])?;
    let scratch = if rows > GEMV_MAX_M { Some(Tensor::empty(x.device(), x.dtype(), &[n * k])?) } else { None };
    let stream = x.device().default_stream();
    awq_linear_into(&stream, x, w, bias, &out, scratch.as_ref(), Strategy::Auto)?;
    Ok(out)
}

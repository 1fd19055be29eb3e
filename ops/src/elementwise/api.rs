//! Elementwise ops and casts.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{
    elementwise, AddBiasParams, BiasConfig, ElementwiseConfig, ElementwiseOp, ElementwiseParams, BIAS_MAX_ROW_BLOCKS,
    BIAS_THREADS, ELEMENTWISE_BLOCK,
};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

fn elementwise_into(
    op: ElementwiseOp,
    name: &'static str,
    stream: &Stream,
    inputs: &[&Tensor],
    out: &Tensor,
) -> Result<()> {
    let input_dtype = float_dtype(name, inputs[0])?;
    let output_dtype = float_dtype(name, out)?;
    for (i, t) in inputs.iter().enumerate() {
        contiguous_nonempty(name, if i == 0 { "a" } else { "b" }, t)?;
        expect_shape(name, "input", t, inputs[0].shape())?;
        expect_dtype(name, "input", t, inputs[0].dtype())?;
        same_device(name, stream, &[("input", t)])?;
    }
    contiguous_nonempty(name, "out", out)?;
    expect_shape(name, "out", out, inputs[0].shape())?;
    same_device(name, stream, &[("out", out)])?;
    if op != ElementwiseOp::Cast && input_dtype != output_dtype {
        return Err(OpError::DType { op: name, message: "`out` must have the input dtype".into() });
    }
    let n = to_u32(name, "elements", out.numel())?;
    let cfg = ElementwiseConfig { op, input: input_dtype, output: output_dtype };
    let k = kernel(cfg.id(), || elementwise(&cfg))?;
    let args = ElementwiseParams { a: inputs[0], b: inputs.get(1).copied(), out, n };
    params::launch(stream, &k, LaunchConfig::linear(n.div_ceil(ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK), &args.args())
}

/// `out = a + b` (elementwise, same shape and dtype), computed in `f32`.
pub fn add_into(stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    elementwise_into(ElementwiseOp::Add, "add", stream, &[a, b], out)
}

/// `a + b`.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(a.device(), a.dtype(), a.shape())?;
    add_into(&a.device().default_stream(), a, b, &out)?;
    Ok(out)
}

/// `out = a * b` (elementwise), computed in `f32`.
pub fn mul_into(stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    elementwise_into(ElementwiseOp::Mul, "mul", stream, &[a, b], out)
}

/// `a * b`.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(a.device(), a.dtype(), a.shape())?;
    mul_into(&a.device().default_stream(), a, b, &out)?;
    Ok(out)
}

/// `out = x * sigmoid(x)`.
pub fn silu_into(stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    elementwise_into(ElementwiseOp::Silu, "silu", stream, &[x], out)
}

/// `x * sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    silu_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

/// Convert between `f32`, `f16` and `bf16` (round to nearest even).
pub fn cast_into(stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    elementwise_into(ElementwiseOp::Cast, "cast", stream, &[x], out)
}

/// `x` converted to `dtype` (a copy when the dtype is unchanged).
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), dtype, x.shape())?;
    cast_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

/// `out[r, c] = x[r, c] + bias[c]` for `x` and `out` `[..., N]` and `bias` `[N]`, all of one
/// float dtype, computed in `f32` and rounded once (as PyTorch's `x + b`). 16-byte accesses when
/// `N` fills whole 16-byte units and every tensor is 16-byte aligned, one element per thread
/// otherwise. `out` may be `x` itself (in place) on CUDA; the CPU interpreter device rejects
/// arguments that share elements, so there `out` must be a separate tensor.
pub fn add_bias_into(stream: &Stream, x: &Tensor, bias: &Tensor, out: &Tensor) -> Result<()> {
    let name = "add_bias";
    let dtype = float_dtype(name, x)?;
    contiguous_nonempty(name, "x", x)?;
    contiguous_nonempty(name, "bias", bias)?;
    contiguous_nonempty(name, "out", out)?;
    let (rows, cols) = rows_cols(name, x)?;
    expect_dtype(name, "bias", bias, x.dtype())?;
    expect_shape(name, "bias", bias, &[cols as usize])?;
    expect_dtype(name, "out", out, x.dtype())?;
    expect_shape(name, "out", out, x.shape())?;
    same_device(name, stream, &[("x", x), ("bias", bias), ("out", out)])?;
    let size = x.dtype().size();
    let aligned = |t: &Tensor| (t.offset() * size).is_multiple_of(16);
    let vector = (cols as usize * size).is_multiple_of(16) && aligned(x) && aligned(bias) && aligned(out);
    let cfg = BiasConfig { dtype, vector };
    let units = cols / cfg.per_thread();
    let k = kernel(cfg.id(), || crate::kernels::elementwise::add_bias(&cfg))?;
    let launch = LaunchConfig {
        grid: [units.div_ceil(BIAS_THREADS), rows.min(BIAS_MAX_ROW_BLOCKS), 1],
        block: [BIAS_THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    params::launch(stream, &k, launch, &AddBiasParams { x, bias, out, units, rows }.args())
}

/// `x + bias` broadcast over the rows of `x` (see [`add_bias_into`]).
pub fn add_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    add_bias_into(&x.device().default_stream(), x, bias, &out)?;
    Ok(out)
}

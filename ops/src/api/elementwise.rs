//! Elementwise ops and casts.

use ruda_runtime::{Arg, DType, LaunchConfig, Stream, Tensor};

use super::*;
use crate::kernels::elementwise::ELEMENTWISE_BLOCK;
use crate::kernels::{elementwise, ElementwiseConfig, ElementwiseOp};

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
    let mut args: Vec<Arg> = inputs.iter().map(|t| Arg::Tensor(t)).collect();
    args.push(Arg::Tensor(out));
    args.push(Arg::scalar(n));
    stream.launch(&*k, LaunchConfig::linear(n.div_ceil(ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK), &args)?;
    Ok(())
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


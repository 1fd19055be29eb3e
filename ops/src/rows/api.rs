//! Row reductions and softmax over the last axis.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{row_reduce, softmax, RowReduceConfig, RowReduceOp, RowReduceParams, SoftmaxConfig, SoftmaxParams};
use crate::blocks::ROW_BLOCK;
use crate::error::Result;
use crate::host::*;
use crate::params;

/// The shape without its last axis (`[n]` → `[1]`).
fn reduced_shape(t: &Tensor) -> Vec<usize> {
    let s = &t.shape()[..t.rank() - 1];
    if s.is_empty() {
        vec![1]
    } else {
        s.to_vec()
    }
}

fn reduce_into(op: RowReduceOp, name: &'static str, stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    let dtype = float_dtype(name, x)?;
    contiguous_nonempty(name, "input", x)?;
    expect_tensor(name, "out", out, DType::F32, &reduced_shape(x))?;
    same_device(name, stream, &[("input", x), ("out", out)])?;
    let (rows, cols) = rows_cols(name, x)?;
    let cfg = RowReduceConfig { op, dtype };
    let k = kernel(cfg.id(), || row_reduce(&cfg))?;
    let args = RowReduceParams { input: x, out, cols };
    params::launch(stream, &k, LaunchConfig::linear(rows, ROW_BLOCK), &args.args())
}

/// Sum over the last axis into an `f32` tensor of the remaining shape.
pub fn reduce_sum_into(stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    reduce_into(RowReduceOp::Sum, "reduce_sum", stream, x, out)
}

/// Sum over the last axis (`f32` result).
pub fn reduce_sum(x: &Tensor) -> Result<Tensor> {
    contiguous_nonempty("reduce_sum", "input", x)?;
    let out = Tensor::empty(x.device(), DType::F32, &reduced_shape(x))?;
    reduce_sum_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

/// Maximum over the last axis into `f32`; a row containing NaN gives NaN.
pub fn reduce_max_into(stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    reduce_into(RowReduceOp::Max, "reduce_max", stream, x, out)
}

/// Maximum over the last axis (`f32` result; NaN if the row has a NaN).
pub fn reduce_max(x: &Tensor) -> Result<Tensor> {
    contiguous_nonempty("reduce_max", "input", x)?;
    let out = Tensor::empty(x.device(), DType::F32, &reduced_shape(x))?;
    reduce_max_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

/// Softmax over the last axis, output in the input dtype. Rows containing NaN or +inf, or only
/// -inf, produce NaN.
pub fn softmax_last_axis_into(stream: &Stream, x: &Tensor, out: &Tensor) -> Result<()> {
    let name = "softmax_last_axis";
    let dtype = float_dtype(name, x)?;
    contiguous_nonempty(name, "input", x)?;
    expect_tensor(name, "out", out, x.dtype(), x.shape())?;
    same_device(name, stream, &[("input", x), ("out", out)])?;
    let (rows, cols) = rows_cols(name, x)?;
    let cfg = SoftmaxConfig { dtype };
    let k = kernel(cfg.id(), || softmax(&cfg))?;
    let args = SoftmaxParams { input: x, out, cols };
    params::launch(stream, &k, LaunchConfig::linear(rows, ROW_BLOCK), &args.args())
}

/// Softmax over the last axis.
pub fn softmax_last_axis(x: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    softmax_last_axis_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

//! Host entry points: validate shapes, dtypes and devices, pick the kernel configuration, and
//! launch. Each op has an `_into(stream, ..., out)` form that neither allocates nor waits for
//! the device, beside an allocating wrapper that runs on the input's default stream.
//!
//! Float ops accept `F32`, `F16` and `BF16` tensors; inputs must be contiguous and non-empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ruda_ir::{Kernel, ScalarType, VerifyError};
use ruda_runtime::{Arg, DType, HashedKernel, LaunchConfig, RuntimeError, Stream, Tensor};

use crate::kernels::elementwise::ELEMENTWISE_BLOCK;
use crate::kernels::rows::ROW_BLOCK;
use crate::kernels::*;

/// Why an op refused its inputs or failed to run.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{op}: shape mismatch: {message}")]
    Shape { op: &'static str, message: String },
    #[error("{op}: unsupported or mismatched dtype: {message}")]
    DType { op: &'static str, message: String },
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
    #[error("{op}: tensors are on different devices: {message}")]
    Device { op: &'static str, message: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("kernel does not verify: {0}")]
    Kernel(#[from] VerifyError),
}

/// The ruDNN contract's name for normalization errors.
pub type NormalizationError = OpError;

pub type Result<T> = std::result::Result<T, OpError>;

/// Built kernels, by configuration id: building and hashing a kernel is done once per process.
fn kernel(id: String, build: impl FnOnce() -> std::result::Result<Kernel, VerifyError>) -> Result<Arc<HashedKernel>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<HashedKernel>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return Ok(k.clone());
    }
    let k = Arc::new(HashedKernel::new(build()?));
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(id, k.clone());
    Ok(k)
}

fn float_dtype(op: &'static str, t: &Tensor) -> Result<ScalarType> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(t.dtype().scalar_type()),
        other => Err(OpError::DType { op, message: format!("{other} (expected f32, f16 or bf16)") }),
    }
}

fn contiguous_nonempty(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    if !t.is_contiguous() {
        return Err(OpError::InvalidArgument { op, message: format!("`{name}` must be contiguous") });
    }
    if t.numel() == 0 || t.rank() == 0 {
        return Err(OpError::Shape { op, message: format!("`{name}` is empty (shape {:?})", t.shape()) });
    }
    Ok(())
}

fn same_device(op: &'static str, stream: &Stream, tensors: &[(&str, &Tensor)]) -> Result<()> {
    for (name, t) in tensors {
        if !t.device().same_device(stream.device()) {
            return Err(OpError::Device {
                op,
                message: format!("`{name}` is on {}, the stream on {}", t.device(), stream.device()),
            });
        }
    }
    Ok(())
}

fn expect_shape(op: &'static str, name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(OpError::Shape { op, message: format!("`{name}` is {:?}, expected {shape:?}", t.shape()) });
    }
    Ok(())
}

fn expect_dtype(op: &'static str, name: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(OpError::DType { op, message: format!("`{name}` is {}, expected {dtype}", t.dtype()) });
    }
    Ok(())
}

fn to_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| OpError::InvalidArgument { op, message: format!("{what} = {n} exceeds u32") })
}

/// `(rows, cols)` of a tensor seen as `[rows, last axis]`.
fn rows_cols(op: &'static str, t: &Tensor) -> Result<(u32, u32)> {
    let cols = *t.shape().last().unwrap_or(&0);
    Ok((to_u32(op, "rows", t.numel() / cols.max(1))?, to_u32(op, "last axis", cols)?))
}

// ---- elementwise -----------------------------------------------------------------------------

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

// ---- row reductions and softmax ---------------------------------------------------------------

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
    contiguous_nonempty(name, "out", out)?;
    expect_shape(name, "out", out, &reduced_shape(x))?;
    expect_dtype(name, "out", out, DType::F32)?;
    same_device(name, stream, &[("input", x), ("out", out)])?;
    let (rows, cols) = rows_cols(name, x)?;
    let cfg = RowReduceConfig { op, dtype };
    let k = kernel(cfg.id(), || row_reduce(&cfg))?;
    let args = [Arg::Tensor(x), Arg::Tensor(out), Arg::scalar(cols)];
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
    Ok(())
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
    contiguous_nonempty(name, "out", out)?;
    expect_shape(name, "out", out, x.shape())?;
    expect_dtype(name, "out", out, x.dtype())?;
    same_device(name, stream, &[("input", x), ("out", out)])?;
    let (rows, cols) = rows_cols(name, x)?;
    let cfg = SoftmaxConfig { dtype };
    let k = kernel(cfg.id(), || softmax(&cfg))?;
    let args = [Arg::Tensor(x), Arg::Tensor(out), Arg::scalar(cols)];
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
    Ok(())
}

/// Softmax over the last axis.
pub fn softmax_last_axis(x: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(x.device(), x.dtype(), x.shape())?;
    softmax_last_axis_into(&x.device().default_stream(), x, &out)?;
    Ok(out)
}

// ---- normalization ----------------------------------------------------------------------------

fn check_norm(
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
    contiguous_nonempty(name, "out", out)?;
    expect_shape(name, "out", out, input.shape())?;
    expect_dtype(name, "out", out, input.dtype())?;
    same_device(name, stream, &[("input", input), ("out", out)])?;
    same_device(name, stream, params)?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(OpError::InvalidArgument { op: name, message: format!("epsilon must be finite and positive, got {eps}") });
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
    let args = [Arg::Tensor(input), Arg::Tensor(gamma), Arg::Tensor(out), Arg::scalar(eps)];
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
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
    let mut args = vec![Arg::Tensor(input), Arg::Tensor(gamma)];
    args.extend(beta.map(Arg::Tensor));
    args.extend([Arg::Tensor(out), Arg::scalar(eps)]);
    stream.launch(&*k, LaunchConfig::linear(rows, ROW_BLOCK), &args)?;
    Ok(())
}

/// LayerNorm over the last axis (see [`layer_norm_into`]).
pub fn layer_norm(input: &Tensor, gamma: &Tensor, beta: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let out = Tensor::empty(input.device(), input.dtype(), input.shape())?;
    layer_norm_into(&input.device().default_stream(), input, gamma, beta, eps, &out)?;
    Ok(out)
}

// ---- GEMM -------------------------------------------------------------------------------------

fn gemm_into(name: &'static str, layout: BLayout, stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    let dtype = float_dtype(name, a)?;
    for (n, t) in [("a", a), ("b", b), ("out", out)] {
        contiguous_nonempty(name, n, t)?;
        expect_dtype(name, n, t, a.dtype())?;
        if t.rank() != 2 {
            return Err(OpError::Shape { op: name, message: format!("`{n}` must be 2-D, is {:?}", t.shape()) });
        }
    }
    same_device(name, stream, &[("a", a), ("b", b), ("out", out)])?;
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (kb, n) = match layout {
        BLayout::RowMajor => (b.shape()[0], b.shape()[1]),
        BLayout::Transposed => (b.shape()[1], b.shape()[0]),
    };
    if kb != k {
        return Err(OpError::Shape {
            op: name,
            message: format!("inner dimensions differ: a is {:?}, b is {:?}", a.shape(), b.shape()),
        });
    }
    expect_shape(name, "out", out, &[m, n])?;
    // Element indices are computed in u32 inside the kernel.
    for (what, len) in [("a", m * k), ("b", k * n), ("out", m * n)] {
        to_u32(name, &format!("elements of `{what}`"), len)?;
    }
    let (m, n, k) = (to_u32(name, "m", m)?, to_u32(name, "n", n)?, to_u32(name, "k", k)?);
    let cfg = GemmConfig { dtype, b_layout: layout };
    let kern = kernel(cfg.id(), || gemm_simt(&cfg))?;
    let launch = LaunchConfig { grid: GemmConfig::grid(m, n), block: [GemmConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
    let args = [Arg::Tensor(a), Arg::Tensor(b), Arg::Tensor(out), Arg::scalar(m), Arg::scalar(n), Arg::scalar(k)];
    stream.launch(&*kern, launch, &args)?;
    Ok(())
}

/// `out[M, N] = a[M, K] · b[K, N]`, accumulating in `f32`.
pub fn matmul_into(stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    gemm_into("matmul", BLayout::RowMajor, stream, a, b, out)
}

/// `a[M, K] · b[K, N]`.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, n) = (a.shape().first().copied().unwrap_or(0), b.shape().get(1).copied().unwrap_or(0));
    let out = Tensor::empty(a.device(), a.dtype(), &[m, n])?;
    matmul_into(&a.device().default_stream(), a, b, &out)?;
    Ok(out)
}

/// `out[M, N] = x[M, K] · wᵀ` for a weight `w[N, K]` (the layout of `nn.Linear`).
pub fn linear_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    gemm_into("linear", BLayout::Transposed, stream, x, w, out)
}

/// `x[M, K] · w[N, K]ᵀ`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, n) = (x.shape().first().copied().unwrap_or(0), w.shape().first().copied().unwrap_or(0));
    let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
    linear_into(&x.device().default_stream(), x, w, &out)?;
    Ok(out)
}

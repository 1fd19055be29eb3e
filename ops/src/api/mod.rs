//! Host entry points: validate shapes, dtypes and devices, pick the kernel configuration, and
//! launch. Each op has an `_into(stream, ..., out)` form that neither allocates nor waits for
//! the device, beside an allocating wrapper that runs on the input's default stream.
//!
//! Float ops accept `F32`, `F16` and `BF16` tensors; inputs must be contiguous and non-empty.
//! One submodule per op family; everything is re-exported here.

mod argmax;
mod attention;
mod elementwise;
mod embedding;
mod fused_norm;
mod gemm;
mod gemv;
mod norm;
mod penalty;
mod rope;
mod rows;
mod sampling;
mod swiglu;

pub use argmax::*;
pub use attention::*;
pub use elementwise::*;
pub use embedding::*;
pub use fused_norm::*;
pub use gemm::*;
pub use gemv::*;
pub use norm::*;
pub use penalty::*;
pub use rope::*;
pub use rows::*;
pub use sampling::*;
pub use swiglu::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ruda_ir::{Kernel, ScalarType, VerifyError};
use ruda_runtime::{DType, HashedKernel, RuntimeError, Stream, Tensor};

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
    Runtime(Box<RuntimeError>),
    #[error("kernel does not verify: {0}")]
    Kernel(Box<VerifyError>),
    #[error(transparent)]
    Pass(Box<ruda_ir::passes::PassError>),
}

// The large errors are boxed so that `Result<_, OpError>` stays small on hot paths.
impl From<RuntimeError> for OpError {
    fn from(e: RuntimeError) -> OpError {
        OpError::Runtime(Box::new(e))
    }
}

impl From<VerifyError> for OpError {
    fn from(e: VerifyError) -> OpError {
        OpError::Kernel(Box::new(e))
    }
}

impl From<ruda_ir::passes::PassError> for OpError {
    fn from(e: ruda_ir::passes::PassError) -> OpError {
        OpError::Pass(Box::new(e))
    }
}

/// The ruDNN contract's name for normalization errors.
pub type NormalizationError = OpError;

pub type Result<T> = std::result::Result<T, OpError>;

/// Built and optimised kernels, by configuration id: building, optimising and hashing a kernel
/// is done once per process.
pub(crate) fn kernel(
    id: String,
    build: impl FnOnce() -> std::result::Result<Kernel, VerifyError>,
) -> Result<Arc<HashedKernel>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<HashedKernel>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return Ok(k.clone());
    }
    let mut built = build()?;
    ruda_ir::passes::optimize(&mut built)?;
    let k = Arc::new(HashedKernel::new(built));
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(id, k.clone());
    Ok(k)
}

pub(crate) fn float_dtype(op: &'static str, t: &Tensor) -> Result<ScalarType> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(t.dtype().scalar_type()),
        other => Err(OpError::DType { op, message: format!("{other} (expected f32, f16 or bf16)") }),
    }
}

pub(crate) fn contiguous_nonempty(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    if !t.is_contiguous() {
        return Err(OpError::InvalidArgument { op, message: format!("`{name}` must be contiguous") });
    }
    if t.numel() == 0 || t.rank() == 0 {
        return Err(OpError::Shape { op, message: format!("`{name}` is empty (shape {:?})", t.shape()) });
    }
    Ok(())
}

pub(crate) fn same_device(op: &'static str, stream: &Stream, tensors: &[(&str, &Tensor)]) -> Result<()> {
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

pub(crate) fn expect_shape(op: &'static str, name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() != shape {
        return Err(OpError::Shape { op, message: format!("`{name}` is {:?}, expected {shape:?}", t.shape()) });
    }
    Ok(())
}

pub(crate) fn expect_dtype(op: &'static str, name: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(OpError::DType { op, message: format!("`{name}` is {}, expected {dtype}", t.dtype()) });
    }
    Ok(())
}

pub(crate) fn to_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| OpError::InvalidArgument { op, message: format!("{what} = {n} exceeds u32") })
}

/// `(rows, cols)` of a tensor seen as `[rows, last axis]`.
pub(crate) fn rows_cols(op: &'static str, t: &Tensor) -> Result<(u32, u32)> {
    let cols = *t.shape().last().unwrap_or(&0);
    Ok((to_u32(op, "rows", t.numel() / cols.max(1))?, to_u32(op, "last axis", cols)?))
}

//! Host-side building blocks every family's entry points share: the per-process cache of built
//! kernels and the checks of shapes, dtypes and devices.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ruda_ir::{Kernel, ScalarType, VerifyError};
use ruda_runtime::{DType, HashedKernel, Stream, Tensor};

use crate::error::{OpError, Result};

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

/// A contiguous, non-empty tensor of `dtype` and `shape` (checked in that order).
pub(crate) fn expect_tensor(op: &'static str, name: &str, t: &Tensor, dtype: DType, shape: &[usize]) -> Result<()> {
    contiguous_nonempty(op, name, t)?;
    expect_dtype(op, name, t, dtype)?;
    expect_shape(op, name, t, shape)
}

pub(crate) fn to_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| OpError::InvalidArgument { op, message: format!("{what} = {n} exceeds u32") })
}

/// `(rows, cols)` of a tensor seen as `[rows, last axis]`.
pub(crate) fn rows_cols(op: &'static str, t: &Tensor) -> Result<(u32, u32)> {
    let cols = *t.shape().last().unwrap_or(&0);
    Ok((to_u32(op, "rows", t.numel() / cols.max(1))?, to_u32(op, "last axis", cols)?))
}

/// The elements from one row of `t` (its last axis) to the next, for a `t` whose last axis is
/// dense and whose rows are evenly spaced, such as `q_proj`'s output `[T, H, 2·D]` narrowed to
/// its first or second halves (row stride `2·D`); the row length for a dense `t`.
pub(crate) fn row_stride(op: &'static str, name: &str, t: &Tensor) -> Result<u32> {
    let (shape, strides) = (t.shape(), t.strides());
    if t.numel() == 0 || t.rank() == 0 {
        return Err(OpError::Shape { op, message: format!("`{name}` is empty (shape {shape:?})") });
    }
    let n = shape.len();
    let cols = shape[n - 1];
    let uneven = || OpError::InvalidArgument {
        op,
        message: format!(
            "`{name}` (shape {shape:?}, strides {strides:?}) must have a dense last axis and evenly spaced rows"
        ),
    };
    if cols != 1 && strides[n - 1] != 1 {
        return Err(uneven());
    }
    // Walk the leading axes inwards-out: the innermost non-trivial one sets the row stride, and
    // each outer one must continue it densely.
    let (mut row, mut next) = (None, 0);
    for i in (0..n - 1).rev().filter(|&i| shape[i] != 1) {
        match row {
            None => row = Some(strides[i]),
            Some(_) if strides[i] != next => return Err(uneven()),
            Some(_) => {}
        }
        next = strides[i] * shape[i];
    }
    let row = row.unwrap_or(cols);
    if row < cols {
        return Err(uneven());
    }
    to_u32(op, "row stride", row)
}

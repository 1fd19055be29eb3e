//! Index arithmetic: row pointers, strided row folds and folded constant offsets.

use ruda_ir::{KernelBuilder, ScalarType, Value};

use super::{combine, identity, load_f32, Combine};

/// Threads per block of the row kernels.
pub const ROW_BLOCK: u32 = 256;

/// The row pointer `base + row * cols` (64-bit arithmetic so large tensors do not wrap).
#[track_caller]
pub(crate) fn row_ptr(b: &mut KernelBuilder, base: Value, row: Value, cols: Value) -> Value {
    let row64 = b.cvt(row, ScalarType::U64);
    let cols64 = b.cvt(cols, ScalarType::U64);
    let offset = b.mul(row64, cols64);
    b.ptr_add(base, offset)
}

/// Each thread folds `x[tid], x[tid + block], ...` of one row with `how`, starting from its
/// identity, applying `map` to each element first.
#[track_caller]
pub(crate) fn strided_fold(
    b: &mut KernelBuilder,
    how: Combine,
    row: Value,
    cols: Value,
    map: impl Fn(&mut KernelBuilder, Value) -> Value,
) -> Value {
    let tid = b.thread_id_x();
    let step = b.const_u32(ROW_BLOCK);
    let init = identity(b, how);
    b.for_range(tid, cols, step, &[init], |b, j, acc| {
        let x = load_f32(b, row, j);
        let x = map(b, x);
        vec![combine(b, how, acc[0], x)]
    })[0]
}

/// `v + constant` (the constant folded away when zero).
#[track_caller]
pub(crate) fn offset(b: &mut KernelBuilder, v: Value, constant: u32) -> Value {
    if constant == 0 {
        return v;
    }
    let c = b.const_u32(constant);
    b.add(v, c)
}

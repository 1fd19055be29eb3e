//! Building blocks shared by the kernels of several families, so no family imports a sibling:
//! dtype-generic loads and stores through `f32`, rounding to a dtype, warp- and block-wide
//! reductions, activations ([`silu`]), index arithmetic ([`index`]) and bit packing ([`bits`]).

use ruda_ir::{CmpOp, KernelBuilder, ScalarType, Value};

pub mod bits;
pub mod index;

pub(crate) use bits::*;
pub use index::ROW_BLOCK;
pub(crate) use index::{offset, row_ptr, strided_fold};

/// The element types the op library's float kernels accept.
pub const FLOAT_DTYPES: [ScalarType; 3] = [ScalarType::F32, ScalarType::F16, ScalarType::BF16];

/// Short dtype names used in kernel ids (`rms_norm.bf16.h4096`).
pub fn dtype_name(t: ScalarType) -> &'static str {
    t.name()
}

/// Load `ptr[index]` and widen it to `f32` (exact for f16/bf16).
#[track_caller]
pub fn load_f32(b: &mut KernelBuilder, ptr: Value, index: Value) -> Value {
    let p = b.ptr_add(ptr, index);
    let v = b.load(p);
    to_f32(b, v)
}

/// Widen a loaded element to `f32`.
#[track_caller]
pub fn to_f32(b: &mut KernelBuilder, v: Value) -> Value {
    if b.ty(v).elem() == ScalarType::F32 {
        v
    } else {
        b.cvt(v, ScalarType::F32)
    }
}

/// Round an `f32` to the pointee type of `ptr` (nearest even) and store it at `ptr[index]`.
#[track_caller]
pub fn store_from_f32(b: &mut KernelBuilder, ptr: Value, index: Value, v: Value) {
    let elem = b.ty(ptr).elem();
    let v = if elem == ScalarType::F32 { v } else { b.cvt(v, elem) };
    let p = b.ptr_add(ptr, index);
    b.store(p, v);
}

/// How a reduction combines two partial results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    Sum,
    /// Maximum that propagates NaN (PTX `max` would drop it): any NaN makes the result NaN.
    MaxNan,
}

/// Combine two `f32` partials.
#[track_caller]
pub fn combine(b: &mut KernelBuilder, how: Combine, x: Value, y: Value) -> Value {
    match how {
        Combine::Sum => b.add(x, y),
        Combine::MaxNan => {
            let m = b.max(x, y);
            let any_nan = b.cmp(CmpOp::Nan, x, y);
            let nan = b.const_f32(f32::NAN);
            b.select(any_nan, nan, m)
        }
    }
}

/// The identity of a combine.
#[track_caller]
pub fn identity(b: &mut KernelBuilder, how: Combine) -> Value {
    match how {
        Combine::Sum => b.const_f32(0.0),
        Combine::MaxNan => b.const_f32(f32::NEG_INFINITY),
    }
}

/// Reduce a value across the 32 lanes of each warp; every lane gets the result.
#[track_caller]
pub fn warp_reduce(b: &mut KernelBuilder, how: Combine, mut v: Value) -> Value {
    for mask in [16, 8, 4, 2, 1] {
        let other = b.shfl_xor(v, mask);
        v = combine(b, how, v, other);
    }
    v
}

/// Reduce a value across a whole block of `threads` threads (a multiple of 32, at most 1024);
/// every thread gets the result. Uses a shared array of one slot per warp, named `scratch`
/// (each call site must pass its own array so that reductions do not race).
#[track_caller]
pub fn block_reduce(b: &mut KernelBuilder, how: Combine, v: Value, threads: u32, scratch: ruda_ir::SharedId) -> Value {
    block_reduce_with(b, v, threads, scratch, |b| identity(b, how), |b, v| warp_reduce(b, how, v))
}

/// [`block_reduce`] for any reduction: `warp` reduces across a warp (every lane gets the
/// result) and `identity` fills the slots of warps that do not exist.
#[track_caller]
pub fn block_reduce_with(
    b: &mut KernelBuilder,
    v: Value,
    threads: u32,
    scratch: ruda_ir::SharedId,
    identity: impl Fn(&mut KernelBuilder) -> Value,
    warp: impl Fn(&mut KernelBuilder, Value) -> Value,
) -> Value {
    let warps = threads / 32;
    let v = warp(b, v);
    if warps == 1 {
        return v;
    }
    let tid = b.thread_id_x();
    let c32 = b.const_u32(32);
    let warp_id = b.div(tid, c32);
    let lane = b.lane_id();
    let smem = b.shared_ptr(scratch);
    let zero = b.const_u32(0);
    let lane0 = b.eq(lane, zero);
    b.if_then(lane0, |b| {
        let p = b.ptr_add(smem, warp_id);
        b.store(p, v);
    });
    b.barrier();
    // Every warp reads all partials and reduces them the same way, so all threads agree.
    let nwarps = b.const_u32(warps);
    let in_range = b.lt(lane, nwarps);
    let partial = b.if_else(
        in_range,
        |b| {
            let p = b.ptr_add(smem, lane);
            vec![b.load(p)]
        },
        |b| vec![identity(b)],
    )[0];
    let total = warp(b, partial);
    // The scratch slots may be reused only after every warp has read them.
    b.barrier();
    total
}

/// Round an `f32` to `dtype` and widen it back (the identity for `f32`): one PyTorch op's
/// rounding in the model dtype.
#[track_caller]
pub(crate) fn round_to(b: &mut KernelBuilder, dtype: ScalarType, v: Value) -> Value {
    if dtype == ScalarType::F32 {
        return v;
    }
    let r = b.cvt(v, dtype);
    b.cvt(r, ScalarType::F32)
}

/// `x / (1 + 2^(-x * log2(e)))`: one approximate `ex2`, the rest correctly rounded.
#[track_caller]
pub fn silu(b: &mut KernelBuilder, x: Value) -> Value {
    let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
    let t = b.mul(x, neg_log2e);
    let e = b.ex2(t);
    let one = b.const_f32(1.0);
    let denom = b.add(one, e);
    b.div(x, denom)
}

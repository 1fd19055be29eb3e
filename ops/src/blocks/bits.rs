//! Bit packing: 16-bit floats unpacked from a word, order-preserving `f32` keys, `u64`s as two
//! `u32`s (packed, split, shuffled).

use ruda_ir::{CmpOp, KernelBuilder, ScalarType, ShflMode, Value};

/// The two 16-bit floats of a little-endian word, widened to `f32` (exactly).
#[track_caller]
pub(crate) fn unpack_halves(b: &mut KernelBuilder, half: ScalarType, w: Value) -> (Value, Value) {
    let sixteen = b.const_u32(16);
    if half == ScalarType::BF16 {
        // A bf16 is the top half of the f32 with the same value.
        let lo = b.shl(w, sixteen);
        let mask = b.const_u32(0xffff_0000);
        let hi = b.and(w, mask);
        (b.bitcast(lo, ScalarType::F32), b.bitcast(hi, ScalarType::F32))
    } else {
        let widen = |b: &mut KernelBuilder, bits: Value| {
            let h = b.cvt(bits, ScalarType::U16); // integer narrowing keeps the low 16 bits
            let h = b.bitcast(h, half);
            b.cvt(h, ScalarType::F32)
        };
        let lo = widen(b, w);
        let shifted = b.shr(w, sixteen);
        let hi = widen(b, shifted);
        (lo, hi)
    }
}

/// The eight 16-bit floats of 16-byte chunk `chunk` of the row at `row` (16-byte aligned) in one
/// vector load, widened to `f32`, in order.
#[track_caller]
pub(crate) fn load_halves8(b: &mut KernelBuilder, half: ScalarType, row: Value, chunk: Value) -> Vec<Value> {
    // Eight halves as four u32 words; element 2j is the low half of word j.
    let words = b.ptr_cast(row, ScalarType::U32);
    let four = b.const_u32(4);
    let i = b.mul(chunk, four);
    let p = b.ptr_add(words, i);
    let v = b.load_vec(p, 4);
    let mut out = Vec::with_capacity(8);
    for j in 0..4 {
        let w = b.extract(v, j);
        let (lo, hi) = unpack_halves(b, half, w);
        out.extend([lo, hi]);
    }
    out
}

/// The bits of an `f32` as a `u32` of the same order (`-0.0` first made `+0.0`; NaN is not
/// handled here).
#[track_caller]
pub(crate) fn order_key(b: &mut KernelBuilder, v: Value) -> Value {
    let zero = b.const_f32(0.0);
    let v = b.add(v, zero); // -0 + +0 = +0
    let bits = b.bitcast(v, ScalarType::U32);
    let sign = b.const_u32(0x8000_0000);
    let negative = b.ge(bits, sign);
    let flipped = b.not(bits);
    let raised = b.or(bits, sign);
    b.select(negative, flipped, raised)
}

/// `(hi << 32) | lo` for two `u32`s.
#[track_caller]
pub(crate) fn pack(b: &mut KernelBuilder, hi: Value, lo: Value) -> Value {
    let hi = b.cvt(hi, ScalarType::U64);
    let thirty_two = b.const_u32(32);
    let hi = b.shl(hi, thirty_two);
    let lo = b.cvt(lo, ScalarType::U64);
    b.or(hi, lo)
}

/// The low 32 bits of a `u64` (integer narrowing keeps them).
#[track_caller]
pub(crate) fn low32(b: &mut KernelBuilder, v: Value) -> Value {
    b.cvt(v, ScalarType::U32)
}

/// A warp shuffle of a `u64`, as two 32-bit shuffles.
#[track_caller]
pub(crate) fn shfl_u64(b: &mut KernelBuilder, mode: ShflMode, v: Value, lane: Value) -> Value {
    let lo = low32(b, v);
    let thirty_two = b.const_u32(32);
    let hi = b.shr(v, thirty_two);
    let hi = low32(b, hi);
    let lo = b.shfl(mode, lo, lane);
    let hi = b.shfl(mode, hi, lane);
    pack(b, hi, lo)
}

/// [`order_key`] with NaN above everything (`torch.argmax`'s and `torch.topk`'s order).
#[track_caller]
pub(crate) fn argmax_key(b: &mut KernelBuilder, v: Value) -> Value {
    let key = order_key(b, v);
    let nan = b.cmp(CmpOp::Nan, v, v);
    let top = b.const_u32(u32::MAX);
    b.select(nan, top, key)
}

/// The maximum of a `u64` across the warp; every lane gets it.
#[track_caller]
pub(crate) fn warp_max_u64(b: &mut KernelBuilder, mut v: Value) -> Value {
    for mask in [16, 8, 4, 2, 1] {
        let m = b.const_u32(mask);
        let other = shfl_u64(b, ShflMode::Bfly, v, m);
        v = b.max(v, other);
    }
    v
}

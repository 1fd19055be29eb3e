//! PTX's scalar semantics on register bits. Encoding, rounding, conversions and `min`/`max`
//! are the interpreter's reference helpers ([`ruda_ir::interp::num`]), so both engines agree
//! bit for bit by construction; only what PTX adds lives here: `.ftz` flushing and the
//! `.approx` functions with the forms the IR has no op for (`rcp`, `sqrt`, the f64 ones).

pub(crate) use ruda_ir::interp::num::{
    decode, float_to_f64, float_to_float, float_to_int, fmax, fmin, int_to_float, int_to_int, Decoded, FloatLane, Fmt,
    IntFmt,
};
pub(crate) use ruda_ir::Rounding;

/// Whether `bits` is a subnormal of `fmt`.
pub(crate) fn is_subnormal(bits: u64, fmt: Fmt) -> bool {
    let (eb, fb) = (fmt.exp_bits(), fmt.frac_bits());
    (bits >> fb) & ((1 << eb) - 1) == 0 && bits & ((1 << fb) - 1) != 0
}

/// `.ftz`: a subnormal becomes a zero of its sign.
pub(crate) fn flush(bits: u64, fmt: Fmt) -> u64 {
    if is_subnormal(bits, fmt) {
        bits & fmt.sign_bit()
    } else {
        bits
    }
}

/// PTX's approximate functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Approx {
    Rsqrt,
    Ex2,
    Lg2,
    Tanh,
    Sin,
    Cos,
    Rcp,
    Sqrt,
}

/// The model of the `.approx.f32` functions, the interpreter's: the correctly rounded f64
/// result of the function rounded to f32 (NaN canonical). Every result lies within the PTX
/// ISA's stated bounds of the true value.
pub(crate) fn approx32(op: Approx, x: u64) -> u64 {
    let x = f32::from_lane(x) as f64;
    (approx64(op, x) as f32).canon()
}

/// The same model for the f64 forms (`rsqrt.approx.f64`, `rcp.approx.ftz.f64`, ...): the f64
/// result of the computation.
pub(crate) fn approx64(op: Approx, x: f64) -> f64 {
    match op {
        Approx::Rsqrt => 1.0 / x.sqrt(),
        Approx::Ex2 => x.exp2(),
        Approx::Lg2 => x.log2(),
        Approx::Tanh => x.tanh(),
        Approx::Sin => x.sin(),
        Approx::Cos => x.cos(),
        Approx::Rcp => 1.0 / x,
        Approx::Sqrt => x.sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_keeps_the_sign_of_subnormals_only() {
        assert_eq!(flush(1, Fmt::F32), 0);
        assert_eq!(flush(0x8000_0001, Fmt::F32), 0x8000_0000);
        assert_eq!(flush(0x0080_0000, Fmt::F32), 0x0080_0000);
        assert_eq!(flush(0x8000_0000_0000_0001, Fmt::F64), 0x8000_0000_0000_0000);
    }
}

//! Scalar semantics of PTX instructions on register bits, written to agree bit for bit with
//! the interpreter's (`ruda_ir::interp`, whose numeric helpers are private to it): canonical
//! NaNs from arithmetic, PTX's min/max rules, conversions in every rounding mode without double
//! rounding, and the approximate functions computed in f64 and rounded once to f32.

/// The canonical NaN PTX arithmetic produces.
pub(crate) const F32_NAN: u64 = 0x7fff_ffff;
pub(crate) const F64_NAN: u64 = 0x7fff_ffff_ffff_ffff;

#[inline(always)]
pub(crate) fn f32c(x: f32) -> u64 {
    if x.is_nan() {
        F32_NAN
    } else {
        x.to_bits() as u64
    }
}

#[inline(always)]
pub(crate) fn f64c(x: f64) -> u64 {
    if x.is_nan() {
        F64_NAN
    } else {
        x.to_bits()
    }
}

#[inline(always)]
pub(crate) fn f32of(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

#[inline(always)]
pub(crate) fn f64of(x: u64) -> f64 {
    f64::from_bits(x)
}

/// Rounding of a conversion (`.rn/.rz/.rm/.rp`, or `.rni/...` to integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rnd {
    Rn,
    Rz,
    Rm,
    Rp,
}

/// An IEEE binary format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fmt {
    F16,
    BF16,
    F32,
    F64,
}

impl Fmt {
    fn exp_bits(self) -> u32 {
        match self {
            Fmt::F16 => 5,
            Fmt::BF16 | Fmt::F32 => 8,
            Fmt::F64 => 11,
        }
    }
    fn frac_bits(self) -> u32 {
        match self {
            Fmt::F16 => 10,
            Fmt::BF16 => 7,
            Fmt::F32 => 23,
            Fmt::F64 => 52,
        }
    }
    fn bias(self) -> i32 {
        (1 << (self.exp_bits() - 1)) - 1
    }
    pub(crate) fn sign_bit(self) -> u64 {
        1 << (self.exp_bits() + self.frac_bits())
    }
    fn inf(self) -> u64 {
        ((1 << self.exp_bits()) - 1) << self.frac_bits()
    }
    /// The canonical NaN: all exponent and fraction bits set, sign clear.
    pub(crate) fn nan(self) -> u64 {
        self.sign_bit() - 1
    }
    pub(crate) fn bits(self) -> u32 {
        1 + self.exp_bits() + self.frac_bits()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Decoded {
    Nan,
    Inf(bool),
    Zero(bool),
    /// `(-1)^neg * mant * 2^exp`.
    Finite { neg: bool, mant: u64, exp: i32 },
}

pub(crate) fn decode(bits: u64, fmt: Fmt) -> Decoded {
    let (eb, fb) = (fmt.exp_bits(), fmt.frac_bits());
    let neg = (bits >> (eb + fb)) & 1 == 1;
    let e = ((bits >> fb) & ((1 << eb) - 1)) as i32;
    let f = bits & ((1 << fb) - 1);
    if e == (1 << eb) - 1 {
        if f == 0 {
            Decoded::Inf(neg)
        } else {
            Decoded::Nan
        }
    } else if e == 0 {
        if f == 0 {
            Decoded::Zero(neg)
        } else {
            Decoded::Finite { neg, mant: f, exp: 1 - fmt.bias() - fb as i32 }
        }
    } else {
        Decoded::Finite { neg, mant: f | (1 << fb), exp: e - fmt.bias() - fb as i32 }
    }
}

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

/// `mant / 2^shift` rounded to an integer per `mode`, for a number of sign `neg`.
pub(crate) fn shift_round(mant: u64, shift: u32, neg: bool, mode: Rnd) -> u64 {
    if shift == 0 {
        return mant;
    }
    let m = mant as u128;
    let (q, above_half, exactly_half) = if shift > 64 {
        (0, false, false)
    } else {
        let rem = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        (m >> shift, rem > half, rem == half)
    };
    let inexact = q << shift.min(64) != m;
    let up = match mode {
        Rnd::Rn => above_half || (exactly_half && q & 1 == 1),
        Rnd::Rz => false,
        Rnd::Rm => neg && inexact,
        Rnd::Rp => !neg && inexact,
    };
    (q + up as u128) as u64
}

/// The float of `fmt` nearest per `mode` to `(-1)^neg * mant * 2^exp` (subnormals kept,
/// overflow to infinity or the largest finite number as the direction demands).
pub(crate) fn encode(neg: bool, mant: u64, exp: i32, fmt: Fmt, mode: Rnd) -> u64 {
    let sign = if neg { fmt.sign_bit() } else { 0 };
    if mant == 0 {
        return sign;
    }
    let fb = fmt.frac_bits() as i32;
    let emin = 1 - fmt.bias();
    let e = 63 - mant.leading_zeros() as i32 + exp;
    let lsb = e.max(emin) - fb;
    let q = if lsb <= exp { mant << (exp - lsb) } else { shift_round(mant, (lsb - exp) as u32, neg, mode) };
    let enc = (((e.max(emin) + fmt.bias() - 1) as u64) << fb) + q;
    if enc >= fmt.inf() {
        let to_inf = match mode {
            Rnd::Rn => true,
            Rnd::Rz => false,
            Rnd::Rm => neg,
            Rnd::Rp => !neg,
        };
        return sign | if to_inf { fmt.inf() } else { fmt.inf() - 1 };
    }
    sign | enc
}

/// An integer type: width and signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IntTy {
    pub(crate) bits: u32,
    pub(crate) signed: bool,
}

impl IntTy {
    #[inline(always)]
    pub(crate) fn mask(self) -> u64 {
        if self.bits >= 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }
    /// The value of a register holding this type (sign- or zero-extended).
    #[inline(always)]
    pub(crate) fn value(self, x: u64) -> i128 {
        if self.signed {
            let shift = 64 - self.bits;
            (((x << shift) as i64) >> shift) as i128
        } else {
            (x & self.mask()) as i128
        }
    }
    fn range(self) -> (i128, i128) {
        if self.signed {
            (-(1i128 << (self.bits - 1)), (1i128 << (self.bits - 1)) - 1)
        } else {
            (0, (1i128 << self.bits) - 1)
        }
    }
    /// Clamp to the range when `sat`, then keep the low bits.
    pub(crate) fn bits_of(self, v: i128, sat: bool) -> u64 {
        let v = if sat {
            let (lo, hi) = self.range();
            v.clamp(lo, hi)
        } else {
            v
        };
        (v as u64) & self.mask()
    }
}

/// The exact `f64` value of a float of any format.
#[inline]
pub(crate) fn to_f64(x: u64, from: Fmt) -> f64 {
    match from {
        Fmt::F64 => f64::from_bits(x),
        Fmt::F32 => f32::from_bits(x as u32) as f64,
        Fmt::F16 => half::f16::from_bits(x as u16).to_f64(),
        Fmt::BF16 => f32::from_bits((x as u32) << 16) as f64,
    }
}

/// `cvt.rni/rzi/rmi/rpi` from a float to an integer: round, then saturate. NaN gives 0,
/// except from f64 or into a 64-bit integer, where it gives `1 << (bits - 1)` (the PTX ISA's
/// rule).
pub(crate) fn float_to_int(x: u64, from: Fmt, to: IntTy, mode: Rnd) -> u64 {
    let v = to_f64(x, from);
    if v.is_nan() {
        return if from == Fmt::F64 || to.bits == 64 { 1u64 << (to.bits - 1) } else { 0 };
    }
    let r = match mode {
        Rnd::Rn => v.round_ties_even(),
        Rnd::Rz => v.trunc(),
        Rnd::Rm => v.floor(),
        Rnd::Rp => v.ceil(),
    };
    to.bits_of(r as i128, true)
}

/// An integer to a float, rounded once.
pub(crate) fn int_to_float(x: u64, from: IntTy, to: Fmt, mode: Rnd) -> u64 {
    let v = from.value(x);
    encode(v < 0, v.unsigned_abs() as u64, 0, to, mode)
}

/// Between floats: exact when widening, rounded per `mode` when narrowing, rounded to an
/// integral value when both formats are equal and `integral` is set. NaN becomes the
/// destination's canonical NaN.
pub(crate) fn float_to_float(x: u64, from: Fmt, to: Fmt, mode: Rnd, integral: bool) -> u64 {
    match decode(x, from) {
        Decoded::Nan => to.nan(),
        Decoded::Inf(neg) => to.inf() | if neg { to.sign_bit() } else { 0 },
        Decoded::Zero(neg) => {
            if neg {
                to.sign_bit()
            } else {
                0
            }
        }
        Decoded::Finite { neg, mant, exp } if integral => {
            if exp >= 0 {
                encode(neg, mant, exp, to, Rnd::Rn)
            } else {
                encode(neg, shift_round(mant, exp.unsigned_abs(), neg, mode), 0, to, Rnd::Rn)
            }
        }
        Decoded::Finite { neg, mant, exp } => encode(neg, mant, exp, to, mode),
    }
}

/// PTX `min`: a NaN operand yields the other one, two NaNs the canonical NaN, `-0 < +0`.
pub(crate) fn fmin32(a: f32, b: f32) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F32_NAN } else { b.to_bits() as u64 };
    }
    if b.is_nan() || a < b {
        a.to_bits() as u64
    } else if b < a || b.is_sign_negative() {
        b.to_bits() as u64
    } else {
        a.to_bits() as u64
    }
}

pub(crate) fn fmax32(a: f32, b: f32) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F32_NAN } else { b.to_bits() as u64 };
    }
    if b.is_nan() || a > b {
        a.to_bits() as u64
    } else if b > a || b.is_sign_positive() {
        b.to_bits() as u64
    } else {
        a.to_bits() as u64
    }
}

pub(crate) fn fmin64(a: f64, b: f64) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F64_NAN } else { b.to_bits() };
    }
    if b.is_nan() || a < b {
        a.to_bits()
    } else if b < a || b.is_sign_negative() {
        b.to_bits()
    } else {
        a.to_bits()
    }
}

pub(crate) fn fmax64(a: f64, b: f64) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F64_NAN } else { b.to_bits() };
    }
    if b.is_nan() || a > b {
        a.to_bits()
    } else if b > a || b.is_sign_positive() {
        b.to_bits()
    } else {
        a.to_bits()
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
    let x = f32of(x) as f64;
    f32c(approx64(op, x) as f32)
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
    fn nan_to_integer_follows_the_ptx_rule() {
        let s32 = IntTy { bits: 32, signed: true };
        let u64t = IntTy { bits: 64, signed: false };
        let u8t = IntTy { bits: 8, signed: false };
        assert_eq!(float_to_int(F32_NAN, Fmt::F32, s32, Rnd::Rz), 0);
        assert_eq!(float_to_int(F64_NAN, Fmt::F64, s32, Rnd::Rz), 0x8000_0000);
        assert_eq!(float_to_int(F32_NAN, Fmt::F32, u64t, Rnd::Rn), 1 << 63);
        assert_eq!(float_to_int(F64_NAN, Fmt::F64, u8t, Rnd::Rn), 0x80);
        assert_eq!(float_to_int(0x7e00, Fmt::F16, u8t, Rnd::Rn), 0);
        assert_eq!(float_to_int((-3.5f32).to_bits() as u64, Fmt::F32, s32, Rnd::Rn), (-4i32) as u32 as u64);
        assert_eq!(float_to_int((1e10f32).to_bits() as u64, Fmt::F32, s32, Rnd::Rn), i32::MAX as u64);
    }

    #[test]
    fn min_max_signed_zero_and_nan() {
        assert_eq!(fmin32(0.0, -0.0), (-0.0f32).to_bits() as u64);
        assert_eq!(fmin32(-0.0, 0.0), (-0.0f32).to_bits() as u64);
        assert_eq!(fmax32(-0.0, 0.0), 0);
        assert_eq!(fmax32(0.0, -0.0), 0);
        assert_eq!(fmax32(f32::NAN, 1.0), 1f32.to_bits() as u64);
        assert_eq!(fmin64(f64::NAN, f64::NAN), F64_NAN);
    }

    #[test]
    fn narrowing_and_integral_rounding() {
        let x = (1.0f32 + f32::EPSILON).to_bits() as u64;
        assert_eq!(float_to_float(x, Fmt::F32, Fmt::F16, Rnd::Rn, false), 0x3c00);
        assert_eq!(float_to_float(x, Fmt::F32, Fmt::F16, Rnd::Rp, false), 0x3c01);
        assert_eq!(float_to_float((2.5f32).to_bits() as u64, Fmt::F32, Fmt::F32, Rnd::Rn, true), 2f32.to_bits() as u64);
        assert_eq!(float_to_float((-2.5f32).to_bits() as u64, Fmt::F32, Fmt::F32, Rnd::Rm, true), (-3f32).to_bits() as u64);
        assert_eq!(float_to_float((1e30f32).to_bits() as u64, Fmt::F32, Fmt::F32, Rnd::Rz, true), (1e30f32).to_bits() as u64);
        assert_eq!(float_to_float(0x7f80_0001, Fmt::F32, Fmt::BF16, Rnd::Rn, false), 0x7fff);
        assert_eq!(flush(1, Fmt::F32), 0);
        assert_eq!(flush(0x8000_0001, Fmt::F32), 0x8000_0000);
    }
}

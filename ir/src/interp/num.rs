//! Scalar semantics: PTX's integer, float and conversion rules on lane values, which hold every
//! scalar as its bit pattern zero-extended to 64 bits (a predicate as 0 or 1).
//!
//! The public items are the reference semantics of float encoding, rounding, conversions
//! (`cvt` in every rounding mode, without double rounding) and `min`/`max`, shared by the
//! interpreter and the PTX emulator (`ruda-ptx-emu`) so that both agree bit for bit by
//! construction. PTX-only variants (`.ftz`, `.relu`, `.sat` on floats, packed forms) live in
//! the emulator on top of these.

use crate::kernel::{Rounding, UnaryOp};
use crate::types::ScalarType;

/// An integer type the IR does arithmetic on, viewed through its native Rust type.
pub(crate) trait IntLane: Copy + Ord {
    fn from_lane(x: u64) -> Self;
    fn to_lane(self) -> u64;
    fn is_zero(self) -> bool;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// High half of the double-width product.
    fn mulhi(self, o: Self) -> Self;
    /// Truncating division; `MIN / -1` wraps to `MIN` (the caller rejects a zero divisor).
    fn div(self, o: Self) -> Self;
    /// Remainder with the dividend's sign; `MIN % -1` is 0.
    fn rem(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    fn neg(self) -> Self;
    /// Wrapping absolute value (`abs(MIN) == MIN`); the identity on unsigned types.
    fn abs(self) -> Self;
    /// Shift left; amounts of the width or more give 0.
    fn shl(self, amount: u32) -> Self;
    /// Shift right: arithmetic on signed types (amounts of the width or more give all sign
    /// bits), logical on unsigned ones (they give 0).
    fn shr(self, amount: u32) -> Self;
    fn popc(self) -> Self;
    fn clz(self) -> Self;
}

macro_rules! int_lane {
    ($t:ty, $u:ty, $wide:ty, |$s:ident, $amount:ident| abs = $abs:expr, shr = $shr:expr) => {
        impl IntLane for $t {
            #[inline(always)]
            fn from_lane(x: u64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_lane(self) -> u64 {
                self as $u as u64
            }
            #[inline(always)]
            fn is_zero(self) -> bool {
                self == 0
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn mulhi(self, o: Self) -> Self {
                ((self as $wide * o as $wide) >> <$t>::BITS) as $t
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            #[inline(always)]
            fn rem(self, o: Self) -> Self {
                self.wrapping_rem(o)
            }
            #[inline(always)]
            fn and(self, o: Self) -> Self {
                self & o
            }
            #[inline(always)]
            fn or(self, o: Self) -> Self {
                self | o
            }
            #[inline(always)]
            fn xor(self, o: Self) -> Self {
                self ^ o
            }
            #[inline(always)]
            fn not(self) -> Self {
                !self
            }
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn abs(self) -> Self {
                let $s = self;
                $abs
            }
            #[inline(always)]
            fn shl(self, amount: u32) -> Self {
                if amount >= <$t>::BITS {
                    0
                } else {
                    self << amount
                }
            }
            #[inline(always)]
            fn shr(self, amount: u32) -> Self {
                let ($s, $amount) = (self, amount);
                $shr
            }
            #[inline(always)]
            fn popc(self) -> Self {
                self.count_ones() as $t
            }
            #[inline(always)]
            fn clz(self) -> Self {
                self.leading_zeros() as $t
            }
        }
    };
}

macro_rules! signed_lane {
    ($t:ty, $u:ty, $wide:ty) => {
        int_lane!($t, $u, $wide, |s, a| abs = s.wrapping_abs(), shr = s >> a.min(<$t>::BITS - 1));
    };
}
macro_rules! unsigned_lane {
    ($t:ty, $wide:ty) => {
        int_lane!($t, $t, $wide, |s, a| abs = s, shr = s.checked_shr(a).unwrap_or(0));
    };
}
signed_lane!(i16, u16, i32);
signed_lane!(i32, u32, i64);
signed_lane!(i64, u64, i128);
unsigned_lane!(u16, u32);
unsigned_lane!(u32, u64);
unsigned_lane!(u64, u128);

/// `f32` or `f64` as held in a lane.
pub trait FloatLane:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    /// The canonical NaN PTX arithmetic produces.
    const NAN_BITS: u64;
    const SIGN_BIT: u64;
    const ONE: Self;
    fn from_lane(x: u64) -> Self;
    fn bits(self) -> u64;
    fn is_nan(self) -> bool;
    fn fma(self, b: Self, c: Self) -> Self;
    fn sqrt(self) -> Self;
    /// The bits of an arithmetic result: any NaN becomes the canonical NaN.
    #[inline(always)]
    fn canon(self) -> u64 {
        if self.is_nan() {
            Self::NAN_BITS
        } else {
            self.bits()
        }
    }
}

impl FloatLane for f32 {
    const NAN_BITS: u64 = 0x7fff_ffff;
    const SIGN_BIT: u64 = 0x8000_0000;
    const ONE: f32 = 1.0;
    #[inline(always)]
    fn from_lane(x: u64) -> f32 {
        f32::from_bits(x as u32)
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
    #[inline(always)]
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
}

impl FloatLane for f64 {
    const NAN_BITS: u64 = 0x7fff_ffff_ffff_ffff;
    const SIGN_BIT: u64 = 0x8000_0000_0000_0000;
    const ONE: f64 = 1.0;
    #[inline(always)]
    fn from_lane(x: u64) -> f64 {
        f64::from_bits(x)
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self.to_bits()
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    #[inline(always)]
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
    #[inline(always)]
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
}

/// PTX `min.f32/f64`: a NaN operand yields the other one, two NaNs the canonical NaN, and
/// `-0` is below `+0`.
#[inline(always)]
pub fn fmin<F: FloatLane>(a: F, b: F) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F::NAN_BITS } else { b.bits() };
    }
    if b.is_nan() || a < b {
        a.bits()
    } else if b < a {
        b.bits()
    } else if a.bits() & F::SIGN_BIT != 0 {
        a.bits()
    } else {
        b.bits()
    }
}

/// PTX `max.f32/f64`, the mirror of [`fmin`] (`+0` is above `-0`).
#[inline(always)]
pub fn fmax<F: FloatLane>(a: F, b: F) -> u64 {
    if a.is_nan() {
        return if b.is_nan() { F::NAN_BITS } else { b.bits() };
    }
    if b.is_nan() || a > b {
        a.bits()
    } else if b > a {
        b.bits()
    } else if a.bits() & F::SIGN_BIT == 0 {
        a.bits()
    } else {
        b.bits()
    }
}

/// PTX's approximate `f32` functions (`.approx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Approx {
    Rsqrt,
    Ex2,
    Lg2,
    Tanh,
    Sin,
    Cos,
}

impl Approx {
    pub(crate) fn of(op: UnaryOp) -> Option<Approx> {
        Some(match op {
            UnaryOp::Rsqrt => Approx::Rsqrt,
            UnaryOp::Ex2 => Approx::Ex2,
            UnaryOp::Lg2 => Approx::Lg2,
            UnaryOp::Tanh => Approx::Tanh,
            UnaryOp::Sin => Approx::Sin,
            UnaryOp::Cos => Approx::Cos,
            _ => return None,
        })
    }
}

/// The approximate functions, modelled by the correctly rounded `f64` result rounded to
/// `f32`. Hardware differs within the error bounds the PTX ISA states; engines compare these
/// ops against each other within those bounds, never bit for bit.
#[inline(always)]
pub(crate) fn approx(op: Approx, x: u64) -> u64 {
    let x = f32::from_bits(x as u32) as f64;
    let r = match op {
        Approx::Rsqrt => 1.0 / x.sqrt(),
        Approx::Ex2 => x.exp2(),
        Approx::Lg2 => x.log2(),
        Approx::Tanh => x.tanh(),
        Approx::Sin => x.sin(),
        Approx::Cos => x.cos(),
    };
    (r as f32).canon()
}

/// An IEEE binary floating-point format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fmt {
    F16,
    BF16,
    F32,
    F64,
}

impl Fmt {
    pub fn of(t: ScalarType) -> Option<Fmt> {
        match t {
            ScalarType::F16 => Some(Fmt::F16),
            ScalarType::BF16 => Some(Fmt::BF16),
            ScalarType::F32 => Some(Fmt::F32),
            ScalarType::F64 => Some(Fmt::F64),
            _ => None,
        }
    }
    pub fn exp_bits(self) -> u32 {
        match self {
            Fmt::F16 => 5,
            Fmt::BF16 | Fmt::F32 => 8,
            Fmt::F64 => 11,
        }
    }
    pub fn frac_bits(self) -> u32 {
        match self {
            Fmt::F16 => 10,
            Fmt::BF16 => 7,
            Fmt::F32 => 23,
            Fmt::F64 => 52,
        }
    }
    /// The width of the format.
    pub fn bits(self) -> u32 {
        1 + self.exp_bits() + self.frac_bits()
    }
    fn bias(self) -> i32 {
        (1 << (self.exp_bits() - 1)) - 1
    }
    pub fn sign_bit(self) -> u64 {
        1 << (self.exp_bits() + self.frac_bits())
    }
    /// Positive infinity.
    pub fn inf(self) -> u64 {
        ((1 << self.exp_bits()) - 1) << self.frac_bits()
    }
    /// The canonical NaN: all exponent and fraction bits set, sign clear.
    pub fn nan(self) -> u64 {
        self.sign_bit() - 1
    }
}

/// A float's value: `mant * 2^exp` for finite non-zero numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decoded {
    Nan,
    Inf(bool),
    Zero(bool),
    Finite { neg: bool, mant: u64, exp: i32 },
}

/// The value of the float of format `fmt` held in the low bits of `bits`.
pub fn decode(bits: u64, fmt: Fmt) -> Decoded {
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

/// `mant / 2^shift` rounded to an integer per `mode`, for a number of sign `neg`.
pub fn shift_round(mant: u64, shift: u32, neg: bool, mode: Rounding) -> u64 {
    if shift == 0 {
        return mant;
    }
    let m = mant as u128;
    let (q, above_half, exactly_half) = if shift > 64 {
        // Everything shifts out and stays below half of the last place (mant < 2^64).
        (0, false, false)
    } else {
        let rem = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        (m >> shift, rem > half, rem == half)
    };
    let inexact = q << shift.min(64) != m;
    let up = match mode {
        Rounding::Rn => above_half || (exactly_half && q & 1 == 1),
        Rounding::Rz => false,
        Rounding::Rm => neg && inexact,
        Rounding::Rp => !neg && inexact,
    };
    (q + up as u128) as u64
}

/// The float of format `fmt` nearest, per `mode`, to `(-1)^neg * mant * 2^exp`: subnormals
/// kept, overflow to infinity or the largest finite number as the direction demands.
pub fn encode(neg: bool, mant: u64, exp: i32, fmt: Fmt, mode: Rounding) -> u64 {
    let sign = if neg { fmt.sign_bit() } else { 0 };
    if mant == 0 {
        return sign;
    }
    let fb = fmt.frac_bits() as i32;
    let emin = 1 - fmt.bias();
    // The value lies in [2^e, 2^(e+1)).
    let e = 63 - mant.leading_zeros() as i32 + exp;
    // Weight of the last mantissa bit of the result (fixed below the normal range).
    let lsb = e.max(emin) - fb;
    let q = if lsb <= exp { mant << (exp - lsb) } else { shift_round(mant, (lsb - exp) as u32, neg, mode) };
    // With the implicit bit inside `q`, adding it to the exponent field one below the real
    // one encodes normals, subnormals, and a carry out of the mantissa alike.
    let enc = (((e.max(emin) + fmt.bias() - 1) as u64) << fb) + q;
    if enc >= fmt.inf() {
        let to_inf = match mode {
            Rounding::Rn => true,
            Rounding::Rz => false,
            Rounding::Rm => neg,
            Rounding::Rp => !neg,
        };
        return sign | if to_inf { fmt.inf() } else { fmt.inf() - 1 };
    }
    sign | enc
}

/// An integer format: its width in bits (1 to 64) and signedness. Every integer function here
/// takes anything that converts into one, a [`ScalarType`] included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntFmt {
    pub bits: u32,
    pub signed: bool,
}

impl From<ScalarType> for IntFmt {
    #[inline]
    fn from(t: ScalarType) -> IntFmt {
        IntFmt { bits: t.bits(), signed: t.is_signed_int() }
    }
}

impl IntFmt {
    /// The low `bits` bits set.
    #[inline]
    pub fn mask(self) -> u64 {
        if self.bits >= 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }

    /// The value of a lane holding this format (sign- or zero-extended by it).
    #[inline]
    pub fn value(self, x: u64) -> i128 {
        if self.signed {
            let shift = 64 - self.bits;
            (((x << shift) as i64) >> shift) as i128
        } else {
            (x & self.mask()) as i128
        }
    }

    /// The range as `i128`, for saturation.
    fn range(self) -> (i128, i128) {
        if self.signed {
            (-(1i128 << (self.bits - 1)), (1i128 << (self.bits - 1)) - 1)
        } else {
            (0, (1i128 << self.bits) - 1)
        }
    }

    /// The bits of `v` in this format: truncated, or clamped to the range first with `sat`.
    #[inline]
    pub fn bits_of(self, v: i128, sat: bool) -> u64 {
        let v = if sat {
            let (lo, hi) = self.range();
            v.clamp(lo, hi)
        } else {
            v
        };
        (v as u64) & self.mask()
    }
}

/// `cvt` between integers: extend by the source's signedness, then truncate, or clamp to the
/// destination's range with `sat`.
#[inline]
pub fn int_to_int(x: u64, from: impl Into<IntFmt>, to: impl Into<IntFmt>, sat: bool) -> u64 {
    to.into().bits_of(from.into().value(x), sat)
}

/// `cvt.rni/rzi/rmi/rpi` from a float to an integer: round, then saturate. NaN gives 0, except
/// from `f64` or into a 64-bit integer, where it gives `1 << (bits - 1)` (the PTX ISA's rule,
/// which an H200 follows).
#[inline]
pub fn float_to_int(x: u64, from: Fmt, to: impl Into<IntFmt>, mode: Rounding) -> u64 {
    let to = to.into();
    let v = float_to_f64(x, from);
    if v.is_nan() {
        return if from == Fmt::F64 || to.bits == 64 { 1u64 << (to.bits - 1) } else { 0 };
    }
    let r = match mode {
        Rounding::Rn => v.round_ties_even(),
        Rounding::Rz => v.trunc(),
        Rounding::Rm => v.floor(),
        Rounding::Rp => v.ceil(),
    };
    // `as i128` saturates.
    to.bits_of(r as i128, true)
}

/// The exact `f64` value of a float of any format (NaN payloads are not preserved).
#[inline]
pub fn float_to_f64(x: u64, from: Fmt) -> f64 {
    match from {
        Fmt::F64 => f64::from_bits(x),
        Fmt::F32 => f32::from_bits(x as u32) as f64,
        Fmt::F16 => half::f16::from_bits(x as u16).to_f64(),
        Fmt::BF16 => f32::from_bits((x as u32) << 16) as f64,
    }
}

/// `cvt` from an integer to a float, rounded per `mode` in one step (no double rounding).
#[inline]
pub fn int_to_float(x: u64, from: impl Into<IntFmt>, to: Fmt, mode: Rounding) -> u64 {
    let v = from.into().value(x);
    encode(v < 0, v.unsigned_abs() as u64, 0, to, mode)
}

/// `cvt` between floats: exact when widening, rounded per `mode` when narrowing, rounded to
/// an integral value when both formats are the same and a mode is given. NaN becomes the
/// destination's canonical NaN.
pub fn float_to_float(x: u64, from: Fmt, to: Fmt, mode: Option<Rounding>) -> u64 {
    match (decode(x, from), mode) {
        (Decoded::Nan, _) => to.nan(),
        (Decoded::Inf(neg), _) => to.inf() | if neg { to.sign_bit() } else { 0 },
        (Decoded::Zero(neg), _) => {
            if neg {
                to.sign_bit()
            } else {
                0
            }
        }
        (Decoded::Finite { neg, mant, exp }, Some(mode)) if from == to => {
            if exp >= 0 {
                x
            } else {
                encode(neg, shift_round(mant, exp.unsigned_abs(), neg, mode), 0, to, Rounding::Rn)
            }
        }
        (Decoded::Finite { neg, mant, exp }, mode) => encode(neg, mant, exp, to, mode.unwrap_or(Rounding::Rn)),
    }
}

/// One warp's `mma.m16n8k16` with f32 accumulators (see [`crate::Op::Mma`] for the layouts and
/// the accumulation model): per lane, the A (4), B (2) and C (4) registers as bits; returns
/// each lane's 4 D registers (f32 bits).
pub fn mma_m16n8k16(ty: crate::MmaType, a: &[[u32; 4]; 32], b: &[[u32; 2]; 32], c: &[[u32; 4]; 32]) -> [[u32; 4]; 32] {
    let fmt = match ty {
        crate::MmaType::F16 => Fmt::F16,
        crate::MmaType::BF16 => Fmt::BF16,
    };
    let half = |bits: u32| float_to_f64((bits & 0xffff) as u64, fmt) as f32;
    let (mut am, mut bm, mut cm) = ([[0f32; 16]; 16], [[0f32; 8]; 16], [[0f32; 8]; 16]);
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for i in 0..4 {
            let (row, col) = (g + 8 * (i % 2), 2 * t + 8 * (i / 2));
            am[row][col] = half(a[l][i]);
            am[row][col + 1] = half(a[l][i] >> 16);
            cm[g + 8 * (i / 2)][2 * t + i % 2] = f32::from_bits(c[l][i]);
        }
        for i in 0..2 {
            bm[2 * t + 8 * i][g] = half(b[l][i]);
            bm[2 * t + 8 * i + 1][g] = half(b[l][i] >> 16);
        }
    }
    let mut d = [[0u32; 4]; 32];
    for (l, dl) in d.iter_mut().enumerate() {
        let (g, t) = (l / 4, l % 4);
        for (i, di) in dl.iter_mut().enumerate() {
            let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
            // Rust float arithmetic is IEEE round-to-nearest-even and never contracted.
            let sum = (0..16).fold(0f32, |s, k| s + am[row][k] * bm[k][col]);
            let r = sum + cm[row][col];
            *di = if r.is_nan() { 0x7fff_ffff } else { r.to_bits() };
        }
    }
    d
}

/// One warp's `ldmatrix.m8n8.b16` register contents (see [`crate::Op::LdMatrix`]): `rows[m][r]`
/// is row `r` of matrix `m` as read from the address lane `8 * m + r` gave; returns each lane's
/// registers (the first `count` are meaningful).
pub fn ldmatrix_fragments(rows: &[[[u16; 8]; 8]; 4], count: usize, trans: bool) -> [[u32; 4]; 32] {
    let mut out = [[0u32; 4]; 32];
    for (l, regs) in out.iter_mut().enumerate() {
        let (g, t) = (l / 4, l % 4);
        for (m, reg) in regs.iter_mut().enumerate().take(count) {
            let mat = &rows[m];
            let (lo, hi) = if trans { (mat[2 * t][g], mat[2 * t + 1][g]) } else { (mat[g][2 * t], mat[g][2 * t + 1]) };
            *reg = lo as u32 | (hi as u32) << 16;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_matches_native_round_to_nearest() {
        let samples: [u64; 12] = [
            0,
            1,
            3,
            (1 << 24) + 1,
            (1 << 24) + 3,
            u64::MAX,
            u64::MAX >> 1,
            0x8000_0000_0000_0001,
            123_456_789_123,
            (1 << 53) + 1,
            0xffff_ff80_0000_0000,
            0xffff_ff7f_ffff_ffff,
        ];
        for &m in &samples {
            assert_eq!(encode(false, m, 0, Fmt::F32, Rounding::Rn), (m as f32).to_bits() as u64, "{m}");
            assert_eq!(encode(false, m, 0, Fmt::F64, Rounding::Rn), (m as f64).to_bits(), "{m}");
        }
    }

    #[test]
    fn shift_round_directions() {
        // 5 / 2 = 2.5
        assert_eq!(shift_round(5, 1, false, Rounding::Rn), 2);
        assert_eq!(shift_round(7, 1, false, Rounding::Rn), 4);
        assert_eq!(shift_round(5, 1, false, Rounding::Rz), 2);
        assert_eq!(shift_round(5, 1, false, Rounding::Rp), 3);
        assert_eq!(shift_round(5, 1, true, Rounding::Rm), 3);
        assert_eq!(shift_round(5, 1, true, Rounding::Rp), 2);
        assert_eq!(shift_round(1, 100, false, Rounding::Rp), 1);
        assert_eq!(shift_round(1, 100, false, Rounding::Rn), 0);
        assert_eq!(shift_round(u64::MAX, 64, false, Rounding::Rn), 1);
        assert_eq!(shift_round(1 << 63, 64, false, Rounding::Rn), 0);
    }

    #[test]
    fn nan_to_integer_follows_the_ptx_rule() {
        let (f32_nan, f64_nan) = (Fmt::F32.nan(), Fmt::F64.nan());
        let u8t = IntFmt { bits: 8, signed: false };
        assert_eq!(float_to_int(f32_nan, Fmt::F32, ScalarType::I32, Rounding::Rz), 0);
        assert_eq!(float_to_int(f64_nan, Fmt::F64, ScalarType::I32, Rounding::Rz), 0x8000_0000);
        assert_eq!(float_to_int(f32_nan, Fmt::F32, ScalarType::U64, Rounding::Rn), 1 << 63);
        assert_eq!(float_to_int(f64_nan, Fmt::F64, u8t, Rounding::Rn), 0x80);
        assert_eq!(float_to_int(0x7e00, Fmt::F16, u8t, Rounding::Rn), 0);
        let bits = |x: f32| x.to_bits() as u64;
        assert_eq!(float_to_int(bits(-3.5), Fmt::F32, ScalarType::I32, Rounding::Rn), (-4i32) as u32 as u64);
        assert_eq!(float_to_int(bits(1e10), Fmt::F32, ScalarType::I32, Rounding::Rn), i32::MAX as u64);
    }

    #[test]
    fn integer_conversions_extend_truncate_and_saturate() {
        assert_eq!(int_to_int(0xff, ScalarType::I8, ScalarType::I32, false), 0xffff_ffff);
        assert_eq!(int_to_int(0xff, ScalarType::U8, ScalarType::I32, false), 0xff);
        assert_eq!(int_to_int(0x1_0000, ScalarType::U32, ScalarType::U16, false), 0);
        assert_eq!(int_to_int(0x1_0000, ScalarType::U32, ScalarType::U16, true), 0xffff);
        assert_eq!(int_to_int(0xffff_ffff, ScalarType::I32, ScalarType::U16, true), 0);
        assert_eq!(int_to_float(0xffff_ffff, ScalarType::I32, Fmt::F32, Rounding::Rn), (-1f32).to_bits() as u64);
    }

    #[test]
    fn min_max_signed_zero_and_nan() {
        let bits = |x: f32| x.to_bits() as u64;
        assert_eq!(fmin(0.0f32, -0.0), bits(-0.0));
        assert_eq!(fmin(-0.0f32, 0.0), bits(-0.0));
        assert_eq!(fmax(-0.0f32, 0.0), 0);
        assert_eq!(fmax(0.0f32, -0.0), 0);
        assert_eq!(fmax(f32::NAN, 1.0), bits(1.0));
        assert_eq!(fmin(f64::NAN, f64::NAN), Fmt::F64.nan());
    }

    #[test]
    fn narrowing_and_integral_rounding() {
        let bits = |x: f32| x.to_bits() as u64;
        let x = bits(1.0 + f32::EPSILON);
        assert_eq!(float_to_float(x, Fmt::F32, Fmt::F16, Some(Rounding::Rn)), 0x3c00);
        assert_eq!(float_to_float(x, Fmt::F32, Fmt::F16, Some(Rounding::Rp)), 0x3c01);
        assert_eq!(float_to_float(x, Fmt::F32, Fmt::F32, None), x);
        assert_eq!(float_to_float(bits(2.5), Fmt::F32, Fmt::F32, Some(Rounding::Rn)), bits(2.0));
        assert_eq!(float_to_float(bits(-2.5), Fmt::F32, Fmt::F32, Some(Rounding::Rm)), bits(-3.0));
        assert_eq!(float_to_float(bits(1e30), Fmt::F32, Fmt::F32, Some(Rounding::Rz)), bits(1e30));
        assert_eq!(float_to_float(0x7f80_0001, Fmt::F32, Fmt::BF16, Some(Rounding::Rn)), 0x7fff);
    }
}

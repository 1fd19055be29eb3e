//! Constants as C++ expressions of exactly the constant's bits.
//!
//! Floats that are small integers print as decimals (`3.0f`, `-0.0f`); other finite floats as
//! hexadecimal literals (exact, C++17) with the shortest decimal in a comment; infinities and
//! NaNs through their bit patterns.

use ruda_ir::{Constant, ScalarType};

pub(crate) fn literal(c: Constant) -> String {
    use ScalarType::*;
    let v = c.as_i64();
    match c.ty {
        Pred => (if c.bits != 0 { "true" } else { "false" }).into(),
        I8 => format!("(signed char){v}"),
        I16 => format!("(short){v}"),
        I32 if v == i32::MIN as i64 => "(int)0x80000000u".into(),
        I32 => format!("{v}"),
        I64 if v == i64::MIN => "(long long)0x8000000000000000ull".into(),
        I64 => format!("{v}ll"),
        U8 => format!("(unsigned char){}", c.bits),
        U16 => format!("(unsigned short){}", c.bits),
        U32 => format!("{}u", c.bits),
        U64 => format!("{}ull", c.bits),
        F16 | BF16 => format!("(unsigned short)0x{:04x} /* {} bits */", c.bits, c.ty),
        F32 => f32_literal(c.bits as u32),
        F64 => f64_literal(c.bits),
    }
}

/// How a literal's comment names a NaN or an infinity.
fn non_finite(nan: bool, negative: bool) -> &'static str {
    match (nan, negative) {
        (true, _) => "NaN",
        (false, true) => "-inf",
        (false, false) => "inf",
    }
}

fn f32_literal(bits: u32) -> String {
    let v = f32::from_bits(bits);
    if !v.is_finite() {
        let what = non_finite(v.is_nan(), v < 0.0);
        return format!("__uint_as_float(0x{bits:08x}u) /* {what} */");
    }
    if v == v.trunc() && v.abs() < (1u32 << 24) as f32 {
        return format!("{v:.1}f");
    }
    let exp = ((bits >> 23) & 0xff) as i32;
    let frac = (bits & 0x7f_ffff) as u64;
    format!("{}f /* {v:e} */", hex_float(bits >> 31 == 1, exp, frac << 1, 6, 127))
}

fn f64_literal(bits: u64) -> String {
    let v = f64::from_bits(bits);
    if !v.is_finite() {
        let what = non_finite(v.is_nan(), v < 0.0);
        return format!("__longlong_as_double(0x{bits:016x}ll) /* {what} */");
    }
    if v == v.trunc() && v.abs() < (1u64 << 53) as f64 {
        return format!("{v:.1}");
    }
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & 0xf_ffff_ffff_ffff;
    format!("{} /* {v:e} */", hex_float(bits >> 63 == 1, exp, frac, 13, 1023))
}

/// `[-]0x1.<digits>p<exp>` (normal) or `[-]0x0.<digits>p<1-bias>` (subnormal); `frac` holds
/// the fraction left-aligned in `digits` hexadecimal digits.
fn hex_float(neg: bool, biased_exp: i32, frac: u64, digits: usize, bias: i32) -> String {
    let (lead, exp) = if biased_exp == 0 { (0, 1 - bias) } else { (1, biased_exp - bias) };
    let hex = format!("{frac:0digits$x}");
    let hex = hex.trim_end_matches('0');
    let dot = if hex.is_empty() { String::new() } else { format!(".{hex}") };
    let sign = if neg { "-" } else { "" };
    format!("{sign}0x{lead}{dot}p{exp:+}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_exactly() {
        assert_eq!(literal(Constant::f32(3.0)), "3.0f");
        assert_eq!(literal(Constant::f32(-0.0)), "-0.0f");
        assert_eq!(literal(Constant::f32(0.1)), "0x1.99999ap-4f /* 1e-1 */");
        assert_eq!(literal(Constant::f32(-1.5e-45)), "-0x0.000002p-126f /* -1e-45 */");
        assert_eq!(literal(Constant::f32(f32::MAX)), "0x1.fffffep+127f /* 3.4028235e38 */");
        assert_eq!(literal(Constant::f32(f32::NEG_INFINITY)), "__uint_as_float(0xff800000u) /* -inf */");
        assert_eq!(literal(Constant::f64(0.5)), "0x1p-1 /* 5e-1 */");
        assert_eq!(literal(Constant::f64(1e-310)), "0x0.012688b70e62bp-1022 /* 1e-310 */");
        assert_eq!(literal(Constant::f64(-((1u64 << 53) as f64))), "-0x1p+53 /* -9.007199254740992e15 */");
        assert_eq!(literal(Constant::f64(f64::NAN)), "__longlong_as_double(0x7ff8000000000000ll) /* NaN */");
    }

    #[test]
    fn integer_extremes_are_valid_cpp() {
        assert_eq!(literal(Constant::i32(i32::MIN)), "(int)0x80000000u");
        assert_eq!(literal(Constant::i32(-7)), "-7");
        assert_eq!(literal(Constant::i64(i64::MIN)), "(long long)0x8000000000000000ull");
        assert_eq!(literal(Constant::u64(u64::MAX)), "18446744073709551615ull");
        assert_eq!(literal(Constant::new(ScalarType::I8, 0x80)), "(signed char)-128");
        assert_eq!(literal(Constant::new(ScalarType::BF16, 0x3f80)), "(unsigned short)0x3f80 /* bf16 bits */");
    }
}

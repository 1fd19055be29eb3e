//! Conversions. Integer to integer is plain C++ (a cast extends by the source's signedness and
//! truncates; `.sat` is an explicit clamp). Everything involving a float is the PTX instruction
//! the PTX backend emits, as inline `asm`: PTX's rounding modes, its saturation of float to
//! integer, its NaN rules and NaN encodings come with the instruction, and NVVM cannot
//! constant-fold it with other rules. bf16 sources widen to f32 by a shift (exact), as in the
//! PTX backend; `.rm/.rp` to bf16, f64 to bf16 and 32/64-bit integers to bf16 need sm_90 and are
//! recorded as requirements.

use ruda_ir::target::Arch;
use ruda_ir::{Constant, Cvt, InstId, Rounding, ScalarType};

use crate::cxx::Emitter;
use crate::helpers::c_scalar;
use crate::literal::literal;
use crate::NvrtcError;

/// Integer rounding modifier for float -> integer and float -> integral float.
fn irnd(r: Rounding) -> &'static str {
    match r {
        Rounding::Rn => "rni",
        Rounding::Rz => "rzi",
        Rounding::Rm => "rmi",
        Rounding::Rp => "rpi",
    }
}

fn int_range(t: ScalarType) -> (i128, i128) {
    let bits = t.bits();
    if t.is_signed_int() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// bf16 bits as the f32 they exactly are.
fn bf16_to_f32(a: &str) -> String {
    format!("__uint_as_float((unsigned){a} << 16)")
}

/// Integer to integer: extend by the source's signedness then truncate, or clamp with `sat`.
fn int_to_int(from: ScalarType, to: ScalarType, sat: bool, a: &str) -> String {
    let ct = c_scalar(to);
    let (from_lo, from_hi) = int_range(from);
    let (lo, hi) = int_range(to);
    let mut clamped = a.to_string();
    if sat && (from_lo < lo || from_hi > hi) {
        // The bounds are values of both types, written as constants of the source type.
        let bound = |v: i128| literal(Constant::new(from, v as u64));
        if from_hi > hi {
            clamped = format!("{a} > {b} ? {b} : {clamped}", b = bound(hi));
        }
        if from_lo < lo {
            clamped = format!("{a} < {b} ? {b} : {clamped}", b = bound(lo));
        }
        clamped = format!("({clamped})");
    }
    if c_scalar(from) == ct {
        clamped
    } else {
        format!("({ct}){clamped}")
    }
}

impl Emitter<'_> {
    /// The expression converting `a` (of type `from`) per `cvt`.
    pub(crate) fn cvt(&mut self, id: InstId, from: ScalarType, cvt: Cvt, a: &str) -> Result<String, NvrtcError> {
        use ScalarType::{BF16, F32};
        let to = cvt.to;
        // The verifier requires a rounding wherever one applies.
        let r = cvt.rounding.unwrap_or(Rounding::Rn);
        if from == to {
            return Ok(match cvt.rounding {
                Some(r) if from.is_float() => self.round_to_integral(id, from, r, a),
                _ => a.to_string(),
            });
        }
        Ok(match (from.is_float(), to.is_float()) {
            (false, false) => int_to_int(from, to, cvt.sat, a),
            (false, true) if to == BF16 => {
                if from.bits() <= 16 {
                    // Exact in f32, so the one rounding is the bf16 one.
                    let f = self.asm1(&format!("cvt.rn.f32.{from}"), from, F32, a);
                    self.f32_to_bf16(id, r, &f)
                } else {
                    let form = format!("cvt.{r}.bf16.{from}");
                    self.require(id, &form, Arch::Sm90);
                    self.asm1(&form, from, BF16, a)
                }
            }
            (false, true) => self.asm1(&format!("cvt.{r}.{to}.{from}"), from, to, a),
            (true, false) => {
                let (from, x) = widen_bf16(from, a);
                self.asm1(&format!("cvt.{}.{to}.{from}", irnd(r)), from, to, &x)
            }
            (true, true) if from == BF16 && to == F32 => bf16_to_f32(a),
            (true, true) => {
                let (from, x) = widen_bf16(from, a);
                self.float_to_float(id, from, to, r, &x)
            }
        })
    }

    fn f32_to_bf16(&mut self, id: InstId, r: Rounding, f: &str) -> String {
        let form = format!("cvt.{r}.bf16.f32");
        if matches!(r, Rounding::Rm | Rounding::Rp) {
            self.require(id, &form, Arch::Sm90);
        }
        self.asm1(&form, ScalarType::F32, ScalarType::BF16, f)
    }

    /// Float to another float type; `from` is not bf16 (already widened) and the pair is not
    /// f32 -> f32.
    fn float_to_float(&mut self, id: InstId, from: ScalarType, to: ScalarType, r: Rounding, x: &str) -> String {
        use ScalarType::{BF16, F16, F32, F64};
        if to == BF16 {
            return match from {
                F64 => {
                    let form = format!("cvt.{r}.bf16.f64");
                    self.require(id, &form, Arch::Sm90);
                    self.asm1(&form, F64, BF16, x)
                }
                F16 => {
                    let f = self.asm1("cvt.f32.f16", F16, F32, x);
                    self.f32_to_bf16(id, r, &f)
                }
                _ => self.f32_to_bf16(id, r, x),
            };
        }
        if to.bits() > from.bits() {
            self.asm1(&format!("cvt.{to}.{from}"), from, to, x)
        } else {
            self.asm1(&format!("cvt.{r}.{to}.{from}"), from, to, x)
        }
    }

    /// A float rounded to an integral value of its own type.
    fn round_to_integral(&mut self, id: InstId, t: ScalarType, r: Rounding, a: &str) -> String {
        if t != ScalarType::BF16 {
            return self.asm1(&format!("cvt.{}.{t}.{t}", irnd(r)), t, t, a);
        }
        // An integral bf16 value rounded in f32 is a bf16 value again: the last step is exact.
        let integral =
            self.asm1(&format!("cvt.{}.f32.f32", irnd(r)), ScalarType::F32, ScalarType::F32, &bf16_to_f32(a));
        self.f32_to_bf16(id, Rounding::Rn, &integral)
    }
}

/// A bf16 source as the f32 it is exactly; other sources unchanged.
fn widen_bf16(from: ScalarType, a: &str) -> (ScalarType, String) {
    if from == ScalarType::BF16 {
        (ScalarType::F32, bf16_to_f32(a))
    } else {
        (from, a.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturating_integer_conversions_clamp_in_the_source_type() {
        use ScalarType::*;
        assert_eq!(int_to_int(I32, I8, true, "x"), "(signed char)(x < -128 ? -128 : x > 127 ? 127 : x)");
        assert_eq!(
            int_to_int(U64, I64, true, "x"),
            "(long long)(x > 9223372036854775807ull ? 9223372036854775807ull : x)"
        );
        assert_eq!(int_to_int(I16, U32, true, "x"), "(unsigned)(x < (short)0 ? (short)0 : x)");
        assert_eq!(int_to_int(U8, I16, true, "x"), "(short)x", "no clamp where every value fits");
        assert_eq!(int_to_int(I32, U32, false, "x"), "(unsigned)x");
        assert_eq!(int_to_int(I64, U64, true, "x"), "(unsigned long long)(x < 0ll ? 0ll : x)");
    }
}

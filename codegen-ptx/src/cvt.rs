//! Lowering of `cvt`: every pair of non-predicate scalar types, every rounding mode.
//!
//! - bf16 -> anything goes through f32, which holds every bf16 exactly: zero-extend, shift left
//!   16, reinterpret (`cvt.f32.bf16` needs sm_90, and the result is the same bit for bit).
//! - f16 -> bf16 and 8/16-bit integers -> bf16 also go through f32 (exact), so the one rounding
//!   happens in `cvt.<rnd>.bf16.f32`.
//! - `cvt.rn/rz.bf16.f32` need sm_80 and PTX 7.0; `.rm/.rp` need sm_90 and PTX 7.8, as do
//!   f64 -> bf16 and 32/64-bit integers -> bf16 (going through f32 or f64 would round twice).
//!   On older targets these are errors naming the op, never a silent approximation.
//! - `.sat` on an integer conversion is dropped where the source range fits the destination
//!   (PTX rejects it there) and float-to-integer conversions saturate without it in PTX.
//! - f16 <-> bf16 conversions round by the mode the IR gives (the verifier requires one):
//!   f16 -> bf16 through f32 as above, bf16 -> f16 through f32 and `cvt.<rnd>.f16.f32`.

use ruda_ir::{Cvt, InstId, Rounding, ScalarType};

use crate::lower::{mov_suffix, Lower, Ops};
use crate::regs::{Reg, RegClass};
use crate::{Arch, CodegenError, PtxVersion};

/// Float rounding modifier (`.rn`, ...).
fn frnd(r: Rounding) -> &'static str {
    r.name()
}

/// Integer rounding modifier for float -> integer and float -> integral float (`.rni`, ...).
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

/// Whether every value of integer type `from` is a value of `to` (saturation cannot happen).
fn fits(from: ScalarType, to: ScalarType) -> bool {
    let (a, b) = int_range(from);
    let (c, d) = int_range(to);
    c <= a && b <= d
}

impl Lower<'_> {
    pub(crate) fn cvt(&mut self, id: InstId, from: ScalarType, cvt: Cvt, src: Reg, d: Reg) -> Result<(), CodegenError> {
        let to = cvt.to;
        // The verifier requires a rounding wherever PTX does, except f16 <-> bf16 (see above).
        let r = cvt.rounding.unwrap_or(Rounding::Rn);
        if from == to {
            return match cvt.rounding {
                Some(r) if from.is_float() => self.round_to_integral(id, from, r, src, d),
                _ => {
                    self.mov(d, src);
                    Ok(())
                }
            };
        }
        match (from.is_float(), to.is_float()) {
            (false, false) => {
                let sat = cvt.sat && !fits(from, to);
                if from.bits() == to.bits() && !sat {
                    self.mov(d, src);
                } else {
                    let sat = if sat { ".sat" } else { "" };
                    self.ins(&format!("cvt{sat}.{to}.{from}"), Ops(&[&d, &src]));
                }
            }
            (false, true) if to == ScalarType::BF16 => {
                if from.bits() <= 16 {
                    let f = self.fresh(RegClass::F32);
                    self.ins(&format!("cvt.rn.f32.{from}"), Ops(&[&f, &src]));
                    self.f32_to_bf16(id, r, f, d)?;
                } else {
                    let m = format!("cvt.{}.bf16.{from}", frnd(r));
                    self.require(id, &m, Arch::Sm90, PtxVersion::new(7, 8))?;
                    self.ins(&m, Ops(&[&d, &src]));
                }
            }
            (false, true) => self.ins(&format!("cvt.{}.{to}.{from}", frnd(r)), Ops(&[&d, &src])),
            (true, false) => {
                let (from, src) = self.widen_bf16(from, src);
                self.ins(&format!("cvt.{}.{to}.{from}", irnd(r)), Ops(&[&d, &src]));
            }
            (true, true) if from == ScalarType::BF16 && to == ScalarType::F32 => self.bf16_to_f32(src, d),
            (true, true) => {
                let (from, src) = self.widen_bf16(from, src);
                self.float_to_float(id, from, to, r, src, d)?;
            }
        }
        Ok(())
    }

    fn mov(&mut self, d: Reg, s: Reg) {
        self.ins(&format!("mov.{}", mov_suffix(d.class)), Ops(&[&d, &s]));
    }

    /// A bf16 source as the f32 it exactly is; other sources unchanged.
    fn widen_bf16(&mut self, from: ScalarType, src: Reg) -> (ScalarType, Reg) {
        if from != ScalarType::BF16 {
            return (from, src);
        }
        let f = self.fresh(RegClass::F32);
        self.bf16_to_f32(src, f);
        (ScalarType::F32, f)
    }

    /// Exact: the bf16 bits are the high half of the f32.
    fn bf16_to_f32(&mut self, src: Reg, d: Reg) {
        let (wide, shifted) = (self.fresh(RegClass::B32), self.fresh(RegClass::B32));
        self.ins("cvt.u32.u16", Ops(&[&wide, &src]));
        self.ins("shl.b32", format!("{shifted}, {wide}, 16"));
        self.ins("mov.b32", Ops(&[&d, &shifted]));
    }

    fn f32_to_bf16(&mut self, id: InstId, r: Rounding, src: Reg, d: Reg) -> Result<(), CodegenError> {
        let m = format!("cvt.{}.bf16.f32", frnd(r));
        match r {
            Rounding::Rn | Rounding::Rz => self.require(id, &m, Arch::Sm80, PtxVersion::new(7, 0))?,
            Rounding::Rm | Rounding::Rp => self.require(id, &m, Arch::Sm90, PtxVersion::new(7, 8))?,
        }
        self.ins(&m, Ops(&[&d, &src]));
        Ok(())
    }

    /// Float to a different float type; `from` is not bf16 (already widened to f32), and the
    /// pair is not f32 -> f32.
    fn float_to_float(
        &mut self,
        id: InstId,
        from: ScalarType,
        to: ScalarType,
        r: Rounding,
        src: Reg,
        d: Reg,
    ) -> Result<(), CodegenError> {
        if to == ScalarType::BF16 {
            return match from {
                ScalarType::F64 => {
                    let m = format!("cvt.{}.bf16.f64", frnd(r));
                    self.require(id, &m, Arch::Sm90, PtxVersion::new(7, 8))?;
                    self.ins(&m, Ops(&[&d, &src]));
                    Ok(())
                }
                ScalarType::F16 => {
                    let f = self.fresh(RegClass::F32);
                    self.ins("cvt.f32.f16", Ops(&[&f, &src]));
                    self.f32_to_bf16(id, r, f, d)
                }
                _ => self.f32_to_bf16(id, r, src, d),
            };
        }
        if to.bits() > from.bits() {
            self.ins(&format!("cvt.{to}.{from}"), Ops(&[&d, &src]));
        } else {
            self.ins(&format!("cvt.{}.{to}.{from}", frnd(r)), Ops(&[&d, &src]));
        }
        Ok(())
    }

    /// A float rounded to an integral value of the same type (`cvt.rni.f32.f32`, ...).
    fn round_to_integral(
        &mut self,
        id: InstId,
        t: ScalarType,
        r: Rounding,
        src: Reg,
        d: Reg,
    ) -> Result<(), CodegenError> {
        if t != ScalarType::BF16 {
            self.ins(&format!("cvt.{}.{t}.{t}", irnd(r)), Ops(&[&d, &src]));
            return Ok(());
        }
        // An integral bf16 value rounded in f32 is again a bf16 value, so the final
        // conversion is exact and may use the sm_80 `.rn` form whatever `r` is.
        let (wide, integral) = (self.fresh(RegClass::F32), self.fresh(RegClass::F32));
        self.bf16_to_f32(src, wide);
        self.ins(&format!("cvt.{}.f32.f32", irnd(r)), Ops(&[&integral, &wide]));
        self.f32_to_bf16(id, Rounding::Rn, integral, d)
    }
}

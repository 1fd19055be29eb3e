//! Virtual registers: one class per PTX register type, numbered per class in the order they are
//! first needed (program order), and the map from IR values to the registers that hold them.

use std::fmt;

use ruda_ir::{ScalarType, Type, Value};

use crate::CodegenError;

/// A PTX register class, i.e. one `.reg` declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum RegClass {
    Pred,
    /// 8- and 16-bit integers, f16 and bf16.
    B16,
    /// 32-bit integers and shared-memory pointers.
    B32,
    /// 64-bit integers and global pointers.
    B64,
    F32,
    F64,
}

impl RegClass {
    const ALL: [RegClass; 6] =
        [RegClass::Pred, RegClass::B16, RegClass::B32, RegClass::B64, RegClass::F32, RegClass::F64];

    fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "p",
            RegClass::B16 => "rs",
            RegClass::B32 => "r",
            RegClass::B64 => "rd",
            RegClass::F32 => "f",
            RegClass::F64 => "fd",
        }
    }

    fn decl_type(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::B64 => ".b64",
            RegClass::F32 => ".f32",
            RegClass::F64 => ".f64",
        }
    }

    /// The untyped-bits suffix for moves and selects (`b16`, ..., `pred`).
    pub(crate) fn bits_suffix(self) -> &'static str {
        match self {
            RegClass::Pred => "pred",
            RegClass::B16 => "b16",
            RegClass::B32 | RegClass::F32 => "b32",
            RegClass::B64 | RegClass::F64 => "b64",
        }
    }

    /// Where a scalar of type `t` lives. 8-bit integers live in 16-bit registers (PTX has no
    /// 8-bit registers); only their low byte is meaningful.
    pub(crate) fn of_scalar(t: ScalarType) -> RegClass {
        use ScalarType::*;
        match t {
            Pred => RegClass::Pred,
            I8 | U8 | I16 | U16 | F16 | BF16 => RegClass::B16,
            I32 | U32 => RegClass::B32,
            I64 | U64 => RegClass::B64,
            F32 => RegClass::F32,
            F64 => RegClass::F64,
        }
    }

    /// The class of each element of a value of type `t` and how many registers it takes.
    pub(crate) fn of_type(t: Type) -> (RegClass, u32) {
        match t {
            Type::Scalar(s) => (RegClass::of_scalar(s), 1),
            Type::Vector(s, n) => (RegClass::of_scalar(s), n as u32),
            Type::Ptr(space, _) => (if space.pointer_bits() == 64 { RegClass::B64 } else { RegClass::B32 }, 1),
        }
    }
}

/// One virtual register, e.g. `%rd3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Reg {
    pub(crate) class: RegClass,
    index: u32,
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}{}", self.class.prefix(), self.index)
    }
}

/// Hands out registers and the registers of each IR value.
pub(crate) struct Regs {
    /// Registers used so far per class; numbering starts at 1, as NVRTC's does.
    counts: [u32; 6],
    values: Vec<Vec<Reg>>,
}

impl Regs {
    pub(crate) fn new(value_count: usize) -> Regs {
        Regs { counts: [0; 6], values: vec![Vec::new(); value_count] }
    }

    /// A fresh register of `class`.
    pub(crate) fn fresh(&mut self, class: RegClass) -> Reg {
        let slot = RegClass::ALL.iter().position(|c| *c == class).unwrap_or(0);
        self.counts[slot] += 1;
        Reg { class, index: self.counts[slot] }
    }

    /// Give `v` (of type `ty`) its registers: one per vector lane.
    pub(crate) fn define(&mut self, v: Value, ty: Type) -> Result<Vec<Reg>, CodegenError> {
        let (class, n) = RegClass::of_type(ty);
        let regs: Vec<Reg> = (0..n).map(|_| self.fresh(class)).collect();
        let slot = self
            .values
            .get_mut(v.index())
            .ok_or_else(|| CodegenError::Internal(format!("value {v} is outside the value table")))?;
        if !slot.is_empty() {
            return Err(CodegenError::Internal(format!("value {v} is given registers twice")));
        }
        slot.clone_from(&regs);
        Ok(regs)
    }

    /// The registers holding `v`.
    pub(crate) fn of(&self, v: Value) -> Result<&[Reg], CodegenError> {
        match self.values.get(v.index()) {
            Some(regs) if !regs.is_empty() => Ok(regs),
            _ => Err(CodegenError::Internal(format!("value {v} is used before it has a register"))),
        }
    }

    /// The single register of a scalar or pointer value.
    pub(crate) fn one(&self, v: Value) -> Result<Reg, CodegenError> {
        match self.of(v)? {
            [r] => Ok(*r),
            regs => {
                Err(CodegenError::Internal(format!("value {v} has {} registers where one was expected", regs.len())))
            }
        }
    }

    /// The `.reg` declarations of every class in use, e.g. `.reg .b32 %r<12>;`.
    pub(crate) fn declarations(&self) -> Vec<String> {
        RegClass::ALL
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| format!(".reg {} %{}<{}>;", c.decl_type(), c.prefix(), n + 1))
            .collect()
    }
}

//! The type system: scalars, short vectors and typed pointers with address spaces.

use std::fmt;

/// A scalar type. `F16` and `BF16` are storage types: arithmetic on them happens after a
/// conversion to `F32` (the verifier enforces this), which keeps every engine bit-exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarType {
    Pred,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
}

impl ScalarType {
    pub const ALL: [ScalarType; 13] = [
        ScalarType::Pred,
        ScalarType::I8,
        ScalarType::I16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F16,
        ScalarType::BF16,
        ScalarType::F32,
        ScalarType::F64,
    ];

    /// Width in bits (a predicate counts as 1).
    pub fn bits(self) -> u32 {
        use ScalarType::*;
        match self {
            Pred => 1,
            I8 | U8 => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            I64 | U64 | F64 => 64,
        }
    }

    /// Size in memory in bytes (a predicate cannot live in memory; reported as 1).
    pub fn bytes(self) -> u32 {
        self.bits().div_ceil(8)
    }

    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64)
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(self, ScalarType::U8 | ScalarType::U16 | ScalarType::U32 | ScalarType::U64)
    }

    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F16 | ScalarType::BF16 | ScalarType::F32 | ScalarType::F64)
    }

    /// Floats on which the IR allows arithmetic (f16/bf16 are storage only).
    pub fn is_arith_float(self) -> bool {
        matches!(self, ScalarType::F32 | ScalarType::F64)
    }

    /// The name used in the text IR, also the PTX type suffix for most types.
    pub fn name(self) -> &'static str {
        use ScalarType::*;
        match self {
            Pred => "pred",
            I8 => "s8",
            I16 => "s16",
            I32 => "s32",
            I64 => "s64",
            U8 => "u8",
            U16 => "u16",
            U32 => "u32",
            U64 => "u64",
            F16 => "f16",
            BF16 => "bf16",
            F32 => "f32",
            F64 => "f64",
        }
    }

    pub fn from_name(name: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a pointer points, as in PTX state spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrSpace {
    Global,
    Shared,
    Local,
    Param,
    Const,
}

impl AddrSpace {
    pub fn name(self) -> &'static str {
        match self {
            AddrSpace::Global => "global",
            AddrSpace::Shared => "shared",
            AddrSpace::Local => "local",
            AddrSpace::Param => "param",
            AddrSpace::Const => "const",
        }
    }

    pub fn from_name(name: &str) -> Option<AddrSpace> {
        [AddrSpace::Global, AddrSpace::Shared, AddrSpace::Local, AddrSpace::Param, AddrSpace::Const]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// Width of an address in this space, in bits (shared/local/param windows are 32-bit).
    pub fn pointer_bits(self) -> u32 {
        match self {
            AddrSpace::Global | AddrSpace::Const => 64,
            AddrSpace::Shared | AddrSpace::Local | AddrSpace::Param => 32,
        }
    }
}

impl fmt::Display for AddrSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of an SSA value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Type {
    Scalar(ScalarType),
    /// A short vector (2 or 4 lanes) as produced by vector loads and consumed by vector stores.
    Vector(ScalarType, u8),
    /// A pointer to elements of `elem` in `space`. Pointer arithmetic counts in elements.
    Ptr(AddrSpace, ScalarType),
}

impl Type {
    pub const PRED: Type = Type::Scalar(ScalarType::Pred);
    pub const I32: Type = Type::Scalar(ScalarType::I32);
    pub const U32: Type = Type::Scalar(ScalarType::U32);
    pub const I64: Type = Type::Scalar(ScalarType::I64);
    pub const U64: Type = Type::Scalar(ScalarType::U64);
    pub const F32: Type = Type::Scalar(ScalarType::F32);
    pub const F64: Type = Type::Scalar(ScalarType::F64);
    pub const F16: Type = Type::Scalar(ScalarType::F16);
    pub const BF16: Type = Type::Scalar(ScalarType::BF16);

    pub fn scalar(self) -> Option<ScalarType> {
        match self {
            Type::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// The element type of a scalar, vector or pointer.
    pub fn elem(self) -> ScalarType {
        match self {
            Type::Scalar(s) | Type::Vector(s, _) | Type::Ptr(_, s) => s,
        }
    }

    pub fn lanes(self) -> u32 {
        match self {
            Type::Vector(_, n) => n as u32,
            _ => 1,
        }
    }

    pub fn is_ptr(self) -> bool {
        matches!(self, Type::Ptr(..))
    }

    /// Size in bytes of the value when stored to memory.
    pub fn bytes(self) -> u32 {
        match self {
            Type::Scalar(s) => s.bytes(),
            Type::Vector(s, n) => s.bytes() * n as u32,
            Type::Ptr(space, _) => space.pointer_bits() / 8,
        }
    }
}

impl From<ScalarType> for Type {
    fn from(s: ScalarType) -> Type {
        Type::Scalar(s)
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Scalar(s) => write!(f, "{s}"),
            Type::Vector(s, n) => write!(f, "v{n}{s}"),
            Type::Ptr(space, s) => write!(f, "ptr<{space},{s}>"),
        }
    }
}

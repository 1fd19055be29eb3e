//! Element types of tensors and the Rust types that hold them on the host.

use std::fmt;

use half::{bf16, f16};
use ruda_ir::{Constant, ScalarType};

/// The element type of a tensor: every IR scalar type that can live in memory (all but `pred`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.scalar_type().bytes() as usize
    }

    /// `f32`, `bf16`, `i32`, ... (the names PyTorch and safetensors use, not the IR's `s32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The IR type of one element.
    pub fn scalar_type(self) -> ScalarType {
        match self {
            DType::F32 => ScalarType::F32,
            DType::F16 => ScalarType::F16,
            DType::BF16 => ScalarType::BF16,
            DType::F64 => ScalarType::F64,
            DType::I8 => ScalarType::I8,
            DType::I16 => ScalarType::I16,
            DType::I32 => ScalarType::I32,
            DType::I64 => ScalarType::I64,
            DType::U8 => ScalarType::U8,
            DType::U16 => ScalarType::U16,
            DType::U32 => ScalarType::U32,
            DType::U64 => ScalarType::U64,
        }
    }

    /// The dtype of an IR scalar type; `None` for `pred`, which has no memory form.
    pub fn from_scalar_type(ty: ScalarType) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.scalar_type() == ty)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that holds one tensor element on the host. Sealed: implemented exactly for the
/// types that match a [`DType`]; device memory is little-endian.
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    const DTYPE: DType;
    /// Append the element's little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Read one element from the first `DTYPE.size()` little-endian bytes (`None` if fewer).
    fn read_le(bytes: &[u8]) -> Option<Self>;
    /// The element as an IR constant of the same type (a scalar kernel argument).
    fn to_constant(self) -> Constant;
}

macro_rules! element {
    ($($t:ty => $dtype:ident, |$v:ident| $bits:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Option<Self> {
                let raw = bytes.get(..std::mem::size_of::<$t>())?.try_into().ok()?;
                Some(<$t>::from_le_bytes(raw))
            }
            fn to_constant(self) -> Constant {
                let $v = self;
                Constant::new(DType::$dtype.scalar_type(), $bits)
            }
        }
    )*};
}

element! {
    f32 => F32, |v| v.to_bits() as u64;
    f16 => F16, |v| v.to_bits() as u64;
    bf16 => BF16, |v| v.to_bits() as u64;
    f64 => F64, |v| v.to_bits();
    i8 => I8, |v| v as u8 as u64;
    i16 => I16, |v| v as u16 as u64;
    i32 => I32, |v| v as u32 as u64;
    i64 => I64, |v| v as u64;
    u8 => U8, |v| v as u64;
    u16 => U16, |v| v as u64;
    u32 => U32, |v| v as u64;
    u64 => U64, |v| v;
}

/// Decode one little-endian element of a float `dtype` to `f32` (`None` for integer dtypes).
pub(crate) fn decode_f32(dtype: DType, bytes: &[u8]) -> Option<f32> {
    match dtype {
        DType::F32 => f32::read_le(bytes),
        DType::F16 => f16::read_le(bytes).map(f16::to_f32),
        DType::BF16 => bf16::read_le(bytes).map(bf16::to_f32),
        DType::F64 => f64::read_le(bytes).map(|v| v as f32),
        _ => None,
    }
}

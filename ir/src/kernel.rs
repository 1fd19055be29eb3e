//! The IR: a kernel is typed SSA values, instructions and structured regions, each held in an
//! arena and addressed by a typed handle.
//!
//! Control flow is structured in the manner of MLIR's `scf` dialect: an `if` has two regions that
//! yield the if's results, a `for` has a body region whose parameters are the induction variable
//! followed by the loop-carried values, and whose yields are the next iteration's carried values.

use std::fmt;
use std::sync::Arc;

use crate::types::{ScalarType, Type};

macro_rules! handle {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

handle!(
    /// An SSA value.
    Value,
    "%"
);
handle!(
    /// An instruction.
    InstId,
    "inst"
);
handle!(
    /// A region (a block of instructions with parameters and yields).
    RegionId,
    "region"
);
handle!(
    /// A static shared-memory array.
    SharedId,
    "@shared"
);

/// A Rust source location recorded by the builder (`#[track_caller]`), carried into PTX `.loc`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub file: Arc<str>,
    pub line: u32,
    pub col: u32,
}

impl Loc {
    pub fn from_caller(caller: &std::panic::Location<'_>) -> Loc {
        Loc { file: Arc::from(caller.file()), line: caller.line(), col: caller.column() }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// A typed constant; `bits` holds the value's bit pattern zero-extended to 64 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Constant {
    pub ty: ScalarType,
    pub bits: u64,
}

impl Constant {
    pub fn new(ty: ScalarType, bits: u64) -> Constant {
        let mask = if ty.bits() >= 64 { u64::MAX } else { (1u64 << ty.bits()) - 1 };
        Constant { ty, bits: bits & mask }
    }
    pub fn u32(v: u32) -> Constant {
        Constant::new(ScalarType::U32, v as u64)
    }
    pub fn i32(v: i32) -> Constant {
        Constant::new(ScalarType::I32, v as u32 as u64)
    }
    pub fn u64(v: u64) -> Constant {
        Constant::new(ScalarType::U64, v)
    }
    pub fn i64(v: i64) -> Constant {
        Constant::new(ScalarType::I64, v as u64)
    }
    pub fn f32(v: f32) -> Constant {
        Constant::new(ScalarType::F32, v.to_bits() as u64)
    }
    pub fn f64(v: f64) -> Constant {
        Constant::new(ScalarType::F64, v.to_bits())
    }
    pub fn pred(v: bool) -> Constant {
        Constant::new(ScalarType::Pred, v as u64)
    }

    /// Whether the constant is a float NaN other than its type's canonical NaN (all exponent
    /// and fraction bits set, sign clear: `0x7fff` for f16 and bf16, `0x7fffffff` for f32), the
    /// only NaN arithmetic produces.
    pub fn is_payload_nan(&self) -> bool {
        if !self.ty.is_float() {
            return false;
        }
        let bits = self.ty.bits();
        let frac_bits = match self.ty {
            ScalarType::F16 => 10,
            ScalarType::BF16 => 7,
            ScalarType::F32 => 23,
            _ => 52,
        };
        let exp = (self.bits >> frac_bits) & ((1u64 << (bits - 1 - frac_bits)) - 1);
        let frac = self.bits & ((1u64 << frac_bits) - 1);
        let canonical = (1u64 << (bits - 1)) - 1;
        exp == (1u64 << (bits - 1 - frac_bits)) - 1 && frac != 0 && self.bits != canonical
    }

    /// The value sign-extended to 64 bits when the type is signed, else zero-extended.
    pub fn as_i64(&self) -> i64 {
        let bits = self.ty.bits();
        if self.ty.is_signed_int() && bits < 64 {
            let shift = 64 - bits;
            ((self.bits << shift) as i64) >> shift
        } else {
            self.bits as i64
        }
    }
}

impl fmt::Display for Constant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ScalarType::*;
        match self.ty {
            Pred => write!(f, "{}", self.bits != 0),
            I8 | I16 | I32 | I64 => write!(f, "{}", self.as_i64()),
            U8 | U16 | U32 | U64 => write!(f, "{}", self.bits),
            // Floats print as exact hex bit patterns so that text round-trips bit for bit.
            F16 | BF16 => write!(f, "0x{:04x}", self.bits),
            F32 => write!(f, "0x{:08x}", self.bits),
            F64 => write!(f, "0x{:016x}", self.bits),
        }
    }
}

/// Special registers, as in PTX (`%tid.x`, ...). All are `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecialReg {
    TidX,
    TidY,
    TidZ,
    NtidX,
    NtidY,
    NtidZ,
    CtaidX,
    CtaidY,
    CtaidZ,
    NctaidX,
    NctaidY,
    NctaidZ,
    LaneId,
}

impl SpecialReg {
    pub const ALL: [SpecialReg; 13] = [
        SpecialReg::TidX,
        SpecialReg::TidY,
        SpecialReg::TidZ,
        SpecialReg::NtidX,
        SpecialReg::NtidY,
        SpecialReg::NtidZ,
        SpecialReg::CtaidX,
        SpecialReg::CtaidY,
        SpecialReg::CtaidZ,
        SpecialReg::NctaidX,
        SpecialReg::NctaidY,
        SpecialReg::NctaidZ,
        SpecialReg::LaneId,
    ];

    /// The PTX name without the leading `%`, also used by the text IR.
    pub fn name(self) -> &'static str {
        use SpecialReg::*;
        match self {
            TidX => "tid.x",
            TidY => "tid.y",
            TidZ => "tid.z",
            NtidX => "ntid.x",
            NtidY => "ntid.y",
            NtidZ => "ntid.z",
            CtaidX => "ctaid.x",
            CtaidY => "ctaid.y",
            CtaidZ => "ctaid.z",
            NctaidX => "nctaid.x",
            NctaidY => "nctaid.y",
            NctaidZ => "nctaid.z",
            LaneId => "laneid",
        }
    }

    pub fn from_name(name: &str) -> Option<SpecialReg> {
        SpecialReg::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether every thread of a block reads the same value.
    pub fn is_block_uniform(self) -> bool {
        !matches!(self, SpecialReg::TidX | SpecialReg::TidY | SpecialReg::TidZ | SpecialReg::LaneId)
    }
}

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $variant),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
            pub fn from_name(name: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(
    /// One-operand operations. The float math functions marked *approx* are PTX's `.approx`
    /// instructions; every engine models them within the error bound the PTX ISA states.
    UnaryOp {
        Neg => "neg",
        /// Bitwise not on integers, logical not on predicates.
        Not => "not",
        Abs => "abs",
        /// Population count (integers; result has the operand's type).
        Popc => "popc",
        /// Count leading zeros (integers; result has the operand's type).
        Clz => "clz",
        /// Correctly rounded square root (`sqrt.rn`).
        Sqrt => "sqrt",
        /// Correctly rounded reciprocal (`rcp.rn`).
        Rcp => "rcp",
        /// *approx* reciprocal square root (`rsqrt.approx`).
        Rsqrt => "rsqrt",
        /// *approx* 2^x (`ex2.approx`).
        Ex2 => "ex2",
        /// *approx* log2(x) (`lg2.approx`).
        Lg2 => "lg2",
        /// *approx* tanh (`tanh.approx.f32`).
        Tanh => "tanh",
        /// *approx* sine (`sin.approx.f32`).
        Sin => "sin",
        /// *approx* cosine (`cos.approx.f32`).
        Cos => "cos",
    }
);

impl UnaryOp {
    /// Whether the operation is one of PTX's approximate math instructions.
    pub fn is_approx(self) -> bool {
        matches!(self, UnaryOp::Rsqrt | UnaryOp::Ex2 | UnaryOp::Lg2 | UnaryOp::Tanh | UnaryOp::Sin | UnaryOp::Cos)
    }
}

named_enum!(
    /// Two-operand operations. Float add/sub/mul/div round to nearest even (`.rn`), never
    /// contracted into fma. Integer mul keeps the low half, `mulhi` the high half. Integer
    /// division by zero is an error in the interpreter. Shifts take a `u32` amount and clamp it
    /// to the width, as PTX does. Float min/max return the non-NaN operand when one is NaN.
    BinaryOp {
        Add => "add",
        Sub => "sub",
        Mul => "mul",
        MulHi => "mulhi",
        Div => "div",
        Rem => "rem",
        Min => "min",
        Max => "max",
        And => "and",
        Or => "or",
        Xor => "xor",
        Shl => "shl",
        Shr => "shr",
    }
);

named_enum!(
    /// Comparisons. On floats all are ordered (false when either operand is NaN) except `neu`
    /// (not-equal or unordered) and `nan` (either operand is NaN), as PTX's `setp`.
    CmpOp {
        Eq => "eq",
        Ne => "ne",
        Lt => "lt",
        Le => "le",
        Gt => "gt",
        Ge => "ge",
        Neu => "neu",
        Nan => "nan",
    }
);

named_enum!(
    /// Rounding of a conversion: to nearest even, toward zero, toward -inf, toward +inf.
    /// For float-to-integer conversions these are PTX's `.rni/.rzi/.rmi/.rpi`.
    Rounding {
        Rn => "rn",
        Rz => "rz",
        Rm => "rm",
        Rp => "rp",
    }
);

named_enum!(
    /// Atomic read-modify-write operations; each returns the old value.
    AtomicOp {
        Add => "add",
        Min => "min",
        Max => "max",
        Exch => "exch",
        Cas => "cas",
    }
);

named_enum!(
    /// Warp shuffle modes (`shfl.sync` with the full member mask).
    ShflMode {
        Bfly => "bfly",
        Down => "down",
        Up => "up",
        Idx => "idx",
    }
);

named_enum!(
    /// Warp votes (`vote.sync` with the full member mask).
    VoteMode {
        All => "all",
        Any => "any",
        Ballot => "ballot",
    }
);

named_enum!(
    /// Input type of a tensor-core `mma`: both A and B hold this 16-bit float type.
    MmaType {
        F16 => "f16",
        BF16 => "bf16",
    }
);

/// A conversion. `rounding` is required exactly where PTX requires one: float to narrower
/// float, float to integer, integer to float, and f16 <-> bf16; `sat` clamps integer results to
/// the destination range. Float-to-integer conversions always saturate, and NaN becomes 0
/// except from `f64` or into a 64-bit integer, where it becomes `1 << (bits - 1)` of the
/// destination (the PTX ISA's rule, confirmed on an H200). Arithmetic and rounding conversions
/// produce the canonical NaN; a float converted to its own type without rounding (a move) and
/// bf16 widened to f32 (a shift) keep a NaN's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cvt {
    pub to: ScalarType,
    pub rounding: Option<Rounding>,
    pub sat: bool,
}

impl Cvt {
    /// Whether converting a `from` value is a move: to its own type without rounding, which
    /// keeps the bits (PTX `mov`), a NaN's payload included.
    pub fn is_move(self, from: ScalarType) -> bool {
        from == self.to && self.rounding.is_none()
    }

    /// Whether a NaN converted from `from` can come out as a NaN other than the destination's
    /// canonical one: a float move, and bf16 widened to f32, which every engine does by
    /// shifting the bits into the high half. Every other float conversion canonicalises.
    pub fn keeps_nan_payload(self, from: ScalarType) -> bool {
        (from.is_float() && self.is_move(from)) || (from == ScalarType::BF16 && self.to == ScalarType::F32)
    }
}

/// Which NaNs an operation's result can be. Arithmetic returns the canonical NaN whatever NaN
/// went in, so an identity such as `max(x, x) -> x` keeps the bits only when `x` cannot be a
/// NaN of another payload; [`Op::nan_result`] says which operations guarantee that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NanResult {
    /// Never a NaN other than the canonical one: float arithmetic (min and max too: they
    /// return NaN only when both operands are, and then the canonical one), rounding and
    /// canonicalising conversions, constants that are not payload NaNs.
    Canonical,
    /// A NaN only when one of these operands is one, and canonical when they all are: moves,
    /// `select`, `abs` (which clears the sign bit).
    Operands(Vec<Value>),
    /// Any NaN: bits from memory, parameters, shuffles, bitcasts, region results, a negation
    /// (the sign flip of the canonical NaN is another NaN), bf16 widened to f32.
    Any,
}

/// An operation. Results are recorded in the owning [`Inst`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Const(Constant),
    Special(SpecialReg),
    Unary(UnaryOp, Value),
    Binary(BinaryOp, Value, Value),
    /// `a * b + c` with a single rounding (floats) or the low half (integers).
    Fma(Value, Value, Value),
    Cmp(CmpOp, Value, Value),
    /// `cond ? a : b`
    Select(Value, Value, Value),
    Cvt(Value, Cvt),
    /// Reinterpret the bits as another scalar type of the same width.
    Bitcast(Value, ScalarType),
    /// Pointer plus an integer index counted in elements of the pointee type.
    PtrAdd(Value, Value),
    /// The same address viewed as a pointer to another element type.
    PtrCast(Value, ScalarType),
    /// Pointer to the first element of a static shared array.
    SharedBase(SharedId),
    /// Pointer to the dynamic shared memory given at launch, viewed as `elem`.
    DynSharedBase(ScalarType),
    /// Load `lanes` consecutive elements (1: scalar, 2 or 4: a vector) from a pointer.
    Load {
        ptr: Value,
        lanes: u8,
    },
    /// Store a scalar or vector value through a pointer.
    Store {
        ptr: Value,
        value: Value,
    },
    /// Atomic read-modify-write returning the old value; `compare` only for `cas`.
    Atomic {
        op: AtomicOp,
        ptr: Value,
        value: Value,
        compare: Option<Value>,
    },
    /// `bar.sync 0`: all threads of the block wait; must be reached in uniform control flow.
    Barrier,
    /// Warp shuffle of a 32-bit value from the lane `lane` selects (per `mode`).
    Shfl {
        mode: ShflMode,
        value: Value,
        lane: Value,
    },
    /// Warp vote over a predicate; `ballot` returns `u32`, the others a predicate.
    Vote {
        mode: VoteMode,
        pred: Value,
    },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32`: the warp computes
    /// `D = A * B + C` with A 16x16 (row-major), B 16x8 (column-major), C and D 16x8 in f32.
    /// Warp-collective: all 32 lanes of the warp must be active. With `g = laneid / 4` and
    /// `t = laneid % 4`, each lane holds (the PTX ISA's "Matrix Fragments for mma.m16n8k16"):
    /// - `a: v4u32`, eight halves, register `i` packing two (the lower element in the low 16
    ///   bits): reg 0 = A[g][2t..2t+2], reg 1 = A[g+8][2t..2t+2], reg 2 = A[g][2t+8..2t+10],
    ///   reg 3 = A[g+8][2t+8..2t+10];
    /// - `b: v2u32`: reg 0 = B[2t..2t+2][g], reg 1 = B[2t+8..2t+10][g] (rows are k);
    /// - `c` and the `v4f32` result: element `i` = C[g + 8 * (i / 2)][2t + i % 2].
    ///
    /// The hardware accumulates with unspecified internal precision and order; every RUDA
    /// engine uses one model so they agree bit for bit: each product is rounded to f32 (exact
    /// for f16, and for bf16 except overflow and underflow), the 16 products are summed in k
    /// order in f32 with round to nearest even starting from +0, then C is added with one more
    /// rounding; a NaN result is the canonical `0x7fffffff`. Subnormals are kept. Results on a
    /// GPU differ from this model within a small tolerance, not bit-exactly.
    Mma {
        ty: MmaType,
        a: Value,
        b: Value,
        c: Value,
    },
    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16`: the warp loads `count` (1, 2
    /// or 4) 8x8 matrices of 16-bit elements from shared memory. Warp-collective: all 32 lanes
    /// must be active. Lane `8 * m + r` gives the address of row `r` of matrix `m` (8
    /// consecutive elements, 16 bytes, 16-byte aligned); lanes beyond `8 * count` give addresses
    /// that are ignored. Lane `l` receives, in register `m`, elements `M_m[l / 4][2 * (l % 4)..+2]`
    /// packed in a u32 (lower column in the low 16 bits), or with `trans` the transposed
    /// `M_m[2 * (l % 4)][l / 4]` and `M_m[2 * (l % 4) + 1][l / 4]`. The pointer is a shared
    /// pointer to a 16-bit type; the result is `u32`, `v2u32` or `v4u32`.
    LdMatrix {
        ptr: Value,
        count: u8,
        trans: bool,
    },
    /// `cp.async.{ca,cg}.shared.global [dst], [src], size{, src_size}`: each thread starts an
    /// asynchronous copy of `size` (4, 8 or 16) bytes from global memory (`src`, a global
    /// pointer) to shared memory (`dst`, a shared pointer), both aligned to `size`. With
    /// `src_size` (a `u32` at most `size`), only the first `src_size` bytes are read from `src`
    /// and the rest of the destination is zero-filled; `src_size` 0 reads nothing (the source
    /// address is then checked for alignment only, so a guarded-off tile may point anywhere). Backends use
    /// `.cg` (bypassing L1) for 16 bytes and `.ca` otherwise, as CUTLASS does.
    ///
    /// The copy belongs to the issuing thread's open group until a [`Op::CpAsyncCommit`] closes
    /// that group; it completes only at a [`Op::CpAsyncWait`] of the same thread that waits for
    /// its group. Until then it is *pending*, and every engine models it the same way: the
    /// source is checked (bounds of its `src_size` bytes, alignment to `size`) and read at
    /// issue; the destination is checked at issue and its bytes are reserved; any access to a
    /// reserved byte by any thread (load, store, atomic, `ldmatrix`, another `cp.async`) is an
    /// error naming the pending copy; the data lands in shared memory when the wait completes
    /// the copy (a write by the issuing thread for race detection, as is the issue itself). A
    /// barrier does not complete copies (as on hardware), and copies still pending when the
    /// thread exits are dropped.
    CpAsync {
        dst: Value,
        src: Value,
        size: u8,
        src_size: Option<Value>,
    },
    /// `cp.async.commit_group`: closes the thread's open group of `cp.async` copies (possibly
    /// empty) and makes it the most recent committed group.
    CpAsyncCommit,
    /// `cp.async.wait_group n`: the thread waits until at most `n` of its most recent committed
    /// groups are pending, completing all older ones (copies not yet committed stay pending).
    /// `n = 0` waits for every committed group.
    CpAsyncWait(u8),
    /// One element of a vector.
    Extract(Value, u8),
    /// A vector from scalars.
    MakeVector(Vec<Value>),
    /// Structured conditional: results are the yields of whichever region ran.
    If {
        cond: Value,
        then_region: RegionId,
        else_region: RegionId,
    },
    /// `for (iv = start; iv < end; iv += step)` with loop-carried values. The body's params are
    /// `[iv, carried...]`, its yields the next carried values, the results the final ones. The
    /// comparison is signed or unsigned by the induction type.
    For {
        start: Value,
        end: Value,
        step: Value,
        init: Vec<Value>,
        body: RegionId,
    },
}

impl Op {
    /// The values this operation reads (not counting values used inside its regions).
    pub fn operands(&self) -> Vec<Value> {
        match self {
            Op::Const(_)
            | Op::Special(_)
            | Op::SharedBase(_)
            | Op::DynSharedBase(_)
            | Op::Barrier
            | Op::CpAsyncCommit
            | Op::CpAsyncWait(_) => vec![],
            Op::Unary(_, a) | Op::Cvt(a, _) | Op::Bitcast(a, _) | Op::PtrCast(a, _) | Op::Extract(a, _) => {
                vec![*a]
            }
            Op::Load { ptr, .. } | Op::LdMatrix { ptr, .. } => vec![*ptr],
            Op::Vote { pred, .. } => vec![*pred],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::PtrAdd(a, b) => vec![*a, *b],
            Op::Store { ptr, value } => vec![*ptr, *value],
            Op::CpAsync { dst, src, src_size, .. } => {
                let mut v = vec![*dst, *src];
                v.extend(src_size);
                v
            }
            Op::Shfl { value, lane, .. } => vec![*value, *lane],
            Op::Fma(a, b, c) | Op::Select(a, b, c) | Op::Mma { a, b, c, .. } => vec![*a, *b, *c],
            Op::Atomic { ptr, value, compare, .. } => {
                let mut v = vec![*ptr, *value];
                v.extend(compare);
                v
            }
            Op::MakeVector(vals) => vals.clone(),
            Op::If { cond, .. } => vec![*cond],
            Op::For { start, end, step, init, .. } => {
                let mut v = vec![*start, *end, *step];
                v.extend(init.iter().copied());
                v
            }
        }
    }

    /// Mutable access to every operand, for passes that rename values.
    pub fn operands_mut(&mut self) -> Vec<&mut Value> {
        match self {
            Op::Const(_)
            | Op::Special(_)
            | Op::SharedBase(_)
            | Op::DynSharedBase(_)
            | Op::Barrier
            | Op::CpAsyncCommit
            | Op::CpAsyncWait(_) => vec![],
            Op::Unary(_, a) | Op::Cvt(a, _) | Op::Bitcast(a, _) | Op::PtrCast(a, _) | Op::Extract(a, _) => {
                vec![a]
            }
            Op::Load { ptr, .. } | Op::LdMatrix { ptr, .. } => vec![ptr],
            Op::Vote { pred, .. } => vec![pred],
            Op::Binary(_, a, b) | Op::Cmp(_, a, b) | Op::PtrAdd(a, b) => vec![a, b],
            Op::Store { ptr, value } => vec![ptr, value],
            Op::CpAsync { dst, src, src_size, .. } => {
                let mut v = vec![dst, src];
                v.extend(src_size.as_mut());
                v
            }
            Op::Shfl { value, lane, .. } => vec![value, lane],
            Op::Fma(a, b, c) | Op::Select(a, b, c) | Op::Mma { a, b, c, .. } => vec![a, b, c],
            Op::Atomic { ptr, value, compare, .. } => {
                let mut v = vec![ptr, value];
                v.extend(compare.as_mut());
                v
            }
            Op::MakeVector(vals) => vals.iter_mut().collect(),
            Op::If { cond, .. } => vec![cond],
            Op::For { start, end, step, init, .. } => {
                let mut v = vec![start, end, step];
                v.extend(init.iter_mut());
                v
            }
        }
    }

    /// The regions nested in this operation.
    pub fn regions(&self) -> Vec<RegionId> {
        match self {
            Op::If { then_region, else_region, .. } => vec![*then_region, *else_region],
            Op::For { body, .. } => vec![*body],
            _ => vec![],
        }
    }

    /// Whether the operation touches memory or synchronises (may not be removed or reordered
    /// freely).
    pub fn has_side_effects(&self) -> bool {
        matches!(
            self,
            Op::Store { .. }
                | Op::Atomic { .. }
                | Op::Barrier
                | Op::CpAsync { .. }
                | Op::CpAsyncCommit
                | Op::CpAsyncWait(_)
        )
    }

    /// Which NaNs a float result of this operation can be (see [`NanResult`]; the answer means
    /// nothing for other results); `ty` gives an operand's type, which decides what a `cvt`
    /// does.
    pub fn nan_result(&self, ty: impl Fn(Value) -> Type) -> NanResult {
        match self {
            Op::Const(c) if c.is_payload_nan() => NanResult::Any,
            Op::Const(_) | Op::Binary(..) | Op::Fma(..) | Op::Mma { .. } => NanResult::Canonical,
            Op::Unary(UnaryOp::Neg, _) => NanResult::Any,
            Op::Unary(UnaryOp::Abs, a) => NanResult::Operands(vec![*a]),
            Op::Unary(..) => NanResult::Canonical,
            Op::Select(_, a, b) => NanResult::Operands(vec![*a, *b]),
            Op::Cvt(a, cvt) => {
                let from = ty(*a).elem();
                if cvt.is_move(from) {
                    NanResult::Operands(vec![*a])
                } else if cvt.keeps_nan_payload(from) {
                    NanResult::Any
                } else {
                    NanResult::Canonical
                }
            }
            _ => NanResult::Any,
        }
    }

    /// A short name for messages: the mnemonic as the text IR writes it.
    pub fn mnemonic(&self) -> String {
        match self {
            Op::Const(_) => "const".into(),
            Op::Special(_) => "special".into(),
            Op::Unary(op, _) => op.name().into(),
            Op::Binary(op, ..) => op.name().into(),
            Op::Fma(..) => "fma".into(),
            Op::Cmp(op, ..) => format!("cmp.{op}"),
            Op::Select(..) => "select".into(),
            Op::Cvt(..) => "cvt".into(),
            Op::Bitcast(..) => "bitcast".into(),
            Op::PtrAdd(..) => "ptradd".into(),
            Op::PtrCast(..) => "ptrcast".into(),
            Op::SharedBase(_) => "shared_base".into(),
            Op::DynSharedBase(_) => "dyn_shared_base".into(),
            Op::Load { .. } => "load".into(),
            Op::Store { .. } => "store".into(),
            Op::Atomic { op, .. } => format!("atomic.{op}"),
            Op::Barrier => "barrier".into(),
            Op::Shfl { mode, .. } => format!("shfl.{mode}"),
            Op::Vote { mode, .. } => format!("vote.{mode}"),
            Op::Mma { ty, .. } => format!("mma.m16n8k16.{ty}"),
            Op::LdMatrix { count, trans, .. } => format!("ldmatrix.x{count}{}", if *trans { ".trans" } else { "" }),
            Op::CpAsync { size, .. } => format!("cp.async.{size}"),
            Op::CpAsyncCommit => "cp.async.commit_group".into(),
            Op::CpAsyncWait(_) => "cp.async.wait_group".into(),
            Op::Extract(..) => "extract".into(),
            Op::MakeVector(_) => "vector".into(),
            Op::If { .. } => "if".into(),
            Op::For { .. } => "for".into(),
        }
    }
}

/// An instruction: an operation, the values it defines, and where in Rust it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub op: Op,
    pub results: Vec<Value>,
    pub loc: Option<Loc>,
}

/// A straight-line list of instructions with parameters (loop bodies) and yields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub params: Vec<Value>,
    pub insts: Vec<InstId>,
    pub yields: Vec<Value>,
}

/// Per-value information.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    pub ty: Type,
}

/// A kernel parameter: a named value of the entry region.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub value: Value,
}

/// A statically sized shared-memory array.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedDecl {
    pub name: String,
    pub elem: ScalarType,
    pub len: u32,
    pub align: u32,
}

impl SharedDecl {
    pub fn bytes(&self) -> u32 {
        self.elem.bytes() * self.len
    }
}

/// `.maxntid` / `.minnctapersm` hints for the backend; the launch must respect `max_threads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchBounds {
    pub max_threads: u32,
    pub min_blocks: Option<u32>,
}

/// Alignment of the dynamic shared-memory window, in bytes.
pub const DYNAMIC_SHARED_ALIGN: u32 = 16;

/// A kernel: the unit that backends emit and the interpreter runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<Param>,
    pub values: Vec<ValueData>,
    pub insts: Vec<Inst>,
    pub regions: Vec<Region>,
    pub body: RegionId,
    pub shared: Vec<SharedDecl>,
    pub launch_bounds: Option<LaunchBounds>,
}

impl Kernel {
    /// An empty kernel with an empty entry region.
    pub fn new(name: impl Into<String>) -> Kernel {
        Kernel {
            name: name.into(),
            params: vec![],
            values: vec![],
            insts: vec![],
            regions: vec![Region::default()],
            body: RegionId(0),
            shared: vec![],
            launch_bounds: None,
        }
    }

    pub fn ty(&self, v: Value) -> Type {
        self.values[v.index()].ty
    }

    pub fn inst(&self, id: InstId) -> &Inst {
        &self.insts[id.index()]
    }

    pub fn region(&self, id: RegionId) -> &Region {
        &self.regions[id.index()]
    }

    pub fn new_value(&mut self, ty: Type) -> Value {
        self.values.push(ValueData { ty });
        Value(self.values.len() as u32 - 1)
    }

    pub fn new_region(&mut self) -> RegionId {
        self.regions.push(Region::default());
        RegionId(self.regions.len() as u32 - 1)
    }

    pub fn push_inst(&mut self, inst: Inst) -> InstId {
        self.insts.push(inst);
        InstId(self.insts.len() as u32 - 1)
    }

    /// Whether the kernel reads the dynamic shared-memory window.
    pub fn uses_dynamic_shared(&self) -> bool {
        self.insts.iter().any(|i| matches!(i.op, Op::DynSharedBase(_)))
    }

    /// Bytes of static shared memory, each array placed at its alignment.
    pub fn static_shared_bytes(&self) -> u32 {
        let mut offset = 0u32;
        for s in &self.shared {
            offset = offset.next_multiple_of(s.align) + s.bytes();
        }
        offset
    }

    /// Visit every instruction reachable from the entry region, in program order (pre-order:
    /// an `if`/`for` is visited before the instructions of its regions).
    pub fn walk(&self, mut f: impl FnMut(InstId, &Inst)) {
        fn go(k: &Kernel, r: RegionId, f: &mut dyn FnMut(InstId, &Inst)) {
            for &id in &k.region(r).insts {
                let inst = k.inst(id);
                f(id, inst);
                for sub in inst.op.regions() {
                    go(k, sub, f);
                }
            }
        }
        go(self, self.body, &mut f)
    }

    /// A stable 64-bit hash of the kernel (its text form including locations): the IR part of
    /// module-cache keys.
    pub fn ir_hash(&self) -> u64 {
        fnv1a64(crate::print::print_kernel_with_locs(self).as_bytes())
    }
}

/// FNV-1a, 64-bit: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_nans_are_the_nans_other_than_the_canonical_one() {
        use ScalarType::*;
        let cases = [
            (F16, 0x7fff, false),
            (F16, 0x7e00, true),
            (F16, 0xfc01, true),
            (F16, 0x7c00, false),
            (BF16, 0x7fff, false),
            (BF16, 0x7fc0, true),
            (BF16, 0xff80, false),
            (F32, 0x7fff_ffff, false),
            (F32, 0x7fc0_0000, true),
            (F32, 0xffff_ffff, true),
            (F32, 0x3f80_0000, false),
            (F64, 0x7fff_ffff_ffff_ffff, false),
            (F64, 0x7ff8_0000_0000_0000, true),
            (F64, 0x7ff0_0000_0000_0000, false),
            (U32, 0x7fff_ffff, false),
            (U16, 0x7e00, false),
        ];
        for (ty, bits, payload) in cases {
            assert_eq!(Constant::new(ty, bits).is_payload_nan(), payload, "{ty} {bits:#x}");
        }
    }
}

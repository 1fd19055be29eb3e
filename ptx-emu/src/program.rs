//! The executable form of one entry: pre-decoded instructions over a flat per-thread register
//! file. Immediates, symbol addresses and special registers live in slots of that file too, so
//! every operand is a register index.

use crate::num::{Approx, Fmt, IntFmt, Rounding};

/// A slot of a thread's register file.
pub(crate) type R = u32;

/// State spaces as memory instructions name them (`.const` reads global memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
    Local,
    Param,
    Generic,
}

impl Space {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Shared => "shared",
            Space::Local => "local",
            Space::Param => "param",
            Space::Generic => "generic",
        }
    }
}

/// Special registers, filled per thread at block start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Special {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    LaneMaskEq,
    LaneMaskLe,
    LaneMaskLt,
    LaneMaskGe,
    LaneMaskGt,
    DynamicSmemSize,
    TotalSmemSize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IBin {
    Add,
    Sub,
    MulLo,
    MulHi,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    AddSat,
    SubSat,
    Mul24Lo,
    Mul24Hi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IUn {
    Neg,
    Not,
    Abs,
    Cnot,
    Popc,
    Clz,
    Brev,
    Bfind,
    BfindShift,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mad {
    Lo,
    Hi,
    Wide,
}

/// Float types with arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FTy {
    F32,
    F64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FBin {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    MinNan,
    MaxNan,
    Copysign,
    /// `div.approx` / `div.full`: modelled as the correctly rounded quotient.
    DivApprox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FUn {
    Neg,
    Abs,
    Sqrt,
    Rcp,
    Approx(Approx),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// What a comparison compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpTy {
    Int(IntFmt),
    F32 { ftz: bool },
    F64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoolOp {
    None,
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conv {
    IntInt {
        from: IntFmt,
        to: IntFmt,
        sat: bool,
    },
    FloatInt {
        from: Fmt,
        to: IntFmt,
        rnd: Rounding,
        ftz: bool,
    },
    IntFloat {
        from: IntFmt,
        to: Fmt,
        rnd: Rounding,
        sat: bool,
    },
    /// `rnd` as `ruda_ir::interp::num::float_to_float` takes it (`None`: exact).
    FloatFloat {
        from: Fmt,
        to: Fmt,
        rnd: Option<Rounding>,
        ftz: bool,
        sat: bool,
        relu: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Inc,
    Dec,
    Min,
    Max,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

/// The operand type of an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomTy {
    Int(IntFmt),
    Float(Fmt),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrmtMode {
    Default,
    F4e,
    B4e,
    Rc8,
    Ecl,
    Ecr,
    Rc16,
}

/// The warp-wide operations: a thread that reaches one waits until every lane of its member
/// mask has reached one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WarpOp {
    Shfl {
        mode: ShflMode,
        d: R,
        p: R,
        a: R,
        b: R,
        c: R,
    },
    Vote {
        mode: VoteMode,
        d: R,
        a: R,
        neg: bool,
    },
    Redux {
        op: ReduxOp,
        signed: bool,
        d: R,
        a: R,
    },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}x2.f32` over the full warp.
    Mma {
        bf16: bool,
        d: [R; 4],
        a: [R; 4],
        b: [R; 2],
        c: [R; 4],
    },
    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16` over the full warp.
    LdMatrix {
        count: u8,
        trans: bool,
        d: [R; 4],
        addr: R,
        off: i64,
    },
    Sync,
}

impl WarpOp {
    /// Whether two lanes' operations may complete together.
    pub(crate) fn same_kind(&self, other: &WarpOp) -> bool {
        match (self, other) {
            (WarpOp::Shfl { mode: a, .. }, WarpOp::Shfl { mode: b, .. }) => a == b,
            (WarpOp::Vote { mode: a, .. }, WarpOp::Vote { mode: b, .. }) => a == b,
            (WarpOp::Redux { op: a, signed: s, .. }, WarpOp::Redux { op: b, signed: t, .. }) => a == b && s == t,
            (WarpOp::Mma { bf16: a, .. }, WarpOp::Mma { bf16: b, .. }) => a == b,
            (WarpOp::LdMatrix { count: a, trans: s, .. }, WarpOp::LdMatrix { count: b, trans: t, .. }) => {
                a == b && s == t
            }
            (WarpOp::Sync, WarpOp::Sync) => true,
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    /// Copy with the write rule of `t` (sign- or zero-extension from its width).
    Mov {
        d: R,
        a: R,
        t: IntFmt,
    },
    /// `mov.b64 d, {a, b}`: `n` parts of `bits` each, lowest first.
    Pack {
        d: R,
        parts: [R; 4],
        n: u8,
        bits: u8,
    },
    /// `mov.b64 {a, b}, d`.
    Unpack {
        ds: [R; 4],
        n: u8,
        bits: u8,
        a: R,
    },
    IBin {
        op: IBin,
        t: IntFmt,
        d: R,
        a: R,
        b: R,
    },
    /// `mul.wide`: `t` is the source type; the result is twice as wide.
    MulWide {
        t: IntFmt,
        d: R,
        a: R,
        b: R,
    },
    IMad {
        op: Mad,
        t: IntFmt,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    IUn {
        op: IUn,
        t: IntFmt,
        d: R,
        a: R,
    },
    /// `add.cc`, `addc`, `sub.cc`, `subc` (32/64-bit); the carry lives in slot `cc`.
    AddC {
        sub: bool,
        cin: bool,
        cout: bool,
        t: IntFmt,
        d: R,
        a: R,
        b: R,
        cc: R,
    },
    Bfe {
        t: IntFmt,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    Bfi {
        bits: u32,
        d: R,
        a: R,
        b: R,
        c: R,
        e: R,
    },
    Prmt {
        mode: PrmtMode,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    Lop3 {
        d: R,
        a: R,
        b: R,
        c: R,
        lut: u8,
    },
    Shf {
        left: bool,
        wrap: bool,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    Setp {
        cmp: Cmp,
        t: CmpTy,
        d: R,
        q: R,
        a: R,
        b: R,
        bop: BoolOp,
        c: R,
        cneg: bool,
    },
    /// `set`: all ones (integer destination) or 1.0 (f32 destination) when true.
    Set {
        cmp: Cmp,
        t: CmpTy,
        float_dst: bool,
        d: R,
        a: R,
        b: R,
        bop: BoolOp,
        c: R,
        cneg: bool,
    },
    Selp {
        t: IntFmt,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    Slct {
        t: IntFmt,
        float_sel: bool,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    FBin {
        op: FBin,
        f: FTy,
        ftz: bool,
        sat: bool,
        d: R,
        a: R,
        b: R,
    },
    Fma {
        f: FTy,
        ftz: bool,
        sat: bool,
        d: R,
        a: R,
        b: R,
        c: R,
    },
    FUn {
        op: FUn,
        f: FTy,
        ftz: bool,
        d: R,
        a: R,
    },
    /// `testp.op`: 0 finite, 1 infinite, 2 number, 3 notanumber, 4 normal, 5 subnormal.
    Testp {
        op: u8,
        f: FTy,
        d: R,
        a: R,
    },
    Cvt {
        conv: Conv,
        d: R,
        a: R,
    },
    /// `cvt.rn{.relu}.f16x2.f32 d, a, b`: `a` to the high half, `b` to the low half.
    CvtPack {
        to: Fmt,
        relu: bool,
        d: R,
        a: R,
        b: R,
    },
    /// `cvta`: to generic (`to == false`) or from generic into `space`.
    Cvta {
        to: bool,
        space: Space,
        d: R,
        a: R,
    },
    Isspacep {
        space: Space,
        d: R,
        a: R,
    },
    Ld {
        space: Space,
        signed: bool,
        size: u8,
        n: u8,
        ds: [R; 4],
        addr: R,
        off: i64,
    },
    St {
        space: Space,
        size: u8,
        n: u8,
        ss: [R; 4],
        addr: R,
        off: i64,
    },
    Atom {
        space: Space,
        op: AtomOp,
        t: AtomTy,
        d: R,
        addr: R,
        off: i64,
        b: R,
        c: R,
    },
    /// `cp.async`: copy `size` bytes (the first `src_size` of them from global, the rest
    /// zeros) into shared memory, pending until a wait completes its group, with the model of
    /// `ruda_ir::Op::CpAsync` (source read at issue, destination reserved, data lands at the
    /// wait).
    CpAsync {
        dst: R,
        doff: i64,
        src: R,
        soff: i64,
        size: u8,
        src_size: R,
    },
    /// `cp.async.commit_group`.
    CpAsyncCommit,
    /// `cp.async.wait_group n` (`wait_all` is a commit and `wait_group 0`).
    CpAsyncWait {
        n: u32,
    },
    Bra {
        target: u32,
    },
    Exit,
    /// `bar.sync` / `barrier.sync` (`count` = `R::MAX`: all threads of the block), or
    /// `bar.arrive` (`wait == false`).
    Bar {
        id: R,
        count: R,
        wait: bool,
    },
    Warp {
        op: WarpOp,
        mask: R,
    },
    Trap,
    Nop,
}

/// One instruction: its guard (a slot holding 0 or 1, negated or not; unguarded
/// instructions read the constant 1) and its PTX source line.
#[derive(Clone, Debug)]
pub(crate) struct Inst {
    pub(crate) op: Op,
    pub(crate) guard: R,
    pub(crate) neg: bool,
    pub(crate) line: u32,
}

/// An entry parameter's place in the parameter window.
#[derive(Clone, Debug)]
pub(crate) struct ParamSlot {
    pub(crate) name: String,
    /// The PTX type name (`u64`, `f32`, `b8`, ...).
    pub(crate) ty: String,
    pub(crate) offset: u32,
    pub(crate) size: u32,
}

/// A module-level `.global` or `.const` variable: a global buffer of its own.
#[derive(Clone, Debug)]
pub(crate) struct ModuleVar {
    pub(crate) init: Vec<u8>,
}

/// A decoded entry.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub(crate) name: String,
    pub(crate) code: Vec<Inst>,
    /// The register file of a thread at start: zeros, constants filled in.
    pub(crate) template: Vec<u64>,
    pub(crate) specials: Vec<(R, Special)>,
    pub(crate) params: Vec<ParamSlot>,
    pub(crate) param_bytes: u32,
    pub(crate) local_bytes: u32,
    /// Static shared bytes; the dynamic window starts at `dyn_offset`.
    pub(crate) static_shared: u32,
    pub(crate) dyn_offset: u32,
    pub(crate) maxntid: Option<[u32; 3]>,
    pub(crate) reqntid: Option<[u32; 3]>,
}

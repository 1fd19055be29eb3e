//! Lowering a kernel to the interpreter's program.
//!
//! Three passes over the IR: (1) scoping checks and live ranges over a linear numbering of
//! the program, where a value used inside a loop it was defined outside of lives to the loop's
//! end; (2) slot allocation by linear scan, with constants, parameters and shared-array
//! addresses in permanent slots filled once per worker; (3) type checks and the choice of each
//! operation's lane implementation, so that execution matches on an op once per instruction
//! and then runs a monomorphic loop over the lanes.
//!
//! The interpreter does not run the verifier (tests build kernels it rejects, e.g. a barrier
//! under divergent control flow), so this module checks whatever it relies on and reports a
//! malformed kernel as an error instead of panicking.

use std::collections::HashMap;

use super::num::{Approx, Fmt};
use super::InterpError;
use crate::kernel::*;
use crate::types::{AddrSpace, ScalarType, Type};
use crate::verify::cvt_needs_rounding;

/// Index of a lane array: slot `s` holds lanes `s * n .. (s + 1) * n` of the register file.
pub(crate) type Slot = u32;

/// The slots of a value: one for scalars and pointers, `lanes` consecutive ones for vectors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VSlot {
    pub base: Slot,
    pub width: u32,
}

/// Integer types with arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntTy {
    I16,
    I32,
    I64,
    U16,
    U32,
    U64,
}

impl IntTy {
    fn of(t: ScalarType) -> Option<IntTy> {
        Some(match t {
            ScalarType::I16 => IntTy::I16,
            ScalarType::I32 => IntTy::I32,
            ScalarType::I64 => IntTy::I64,
            ScalarType::U16 => IntTy::U16,
            ScalarType::U32 => IntTy::U32,
            ScalarType::U64 => IntTy::U64,
            _ => return None,
        })
    }
}

/// Float types with arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FTy {
    F32,
    F64,
}

impl FTy {
    fn of(t: ScalarType) -> Option<FTy> {
        match t {
            ScalarType::F32 => Some(FTy::F32),
            ScalarType::F64 => Some(FTy::F64),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum IntUn {
    Neg,
    Not,
    Abs,
    Popc,
    Clz,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum FloatUn {
    Neg,
    Abs,
    Sqrt,
    Rcp,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum IntBin {
    Add,
    Sub,
    Mul,
    MulHi,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum FloatBin {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum PredBin {
    And,
    Or,
    Xor,
}

/// Integer comparisons (the float-only `neu`/`nan` excluded).
#[derive(Clone, Copy, Debug)]
pub(crate) enum IntCmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// How a `ptradd` index widens to 64 bits.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IndexExt {
    Signed32,
    Unsigned32,
    Full64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
}

/// The read-modify-write function of an atomic, by op and type.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AtomFn {
    Add32,
    Add64,
    AddF32,
    AddF64,
    MinI32,
    MinU32,
    MinI64,
    MinU64,
    MaxI32,
    MaxU32,
    MaxI64,
    MaxU64,
    Exch,
    Cas,
}

/// A conversion, classified once.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Conv {
    IntInt { from: ScalarType, to: ScalarType, sat: bool },
    FloatInt { from: Fmt, to: ScalarType, mode: Rounding },
    IntFloat { from: ScalarType, to: Fmt, mode: Rounding },
    FloatFloat { from: Fmt, to: Fmt, mode: Option<Rounding> },
}

/// A lowered operation. `d` is the destination slot; destinations never share a slot with an
/// operand of the same instruction.
#[derive(Debug)]
pub(crate) enum Kind {
    Special {
        d: Slot,
        reg: SpecialReg,
    },
    IntUn {
        op: IntUn,
        ty: IntTy,
        d: Slot,
        a: Slot,
    },
    FloatUn {
        op: FloatUn,
        ty: FTy,
        d: Slot,
        a: Slot,
    },
    Approx {
        op: Approx,
        d: Slot,
        a: Slot,
    },
    PredNot {
        d: Slot,
        a: Slot,
    },
    IntBin {
        op: IntBin,
        ty: IntTy,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    IntDiv {
        rem: bool,
        ty: IntTy,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    FloatBin {
        op: FloatBin,
        ty: FTy,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    PredBin {
        op: PredBin,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    IntFma {
        ty: IntTy,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    FloatFma {
        ty: FTy,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    IntCmp {
        op: IntCmp,
        ty: IntTy,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    FloatCmp {
        op: CmpOp,
        ty: FTy,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    PredCmp {
        eq: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    Select {
        d: Slot,
        c: Slot,
        a: Slot,
        b: Slot,
    },
    Cvt {
        conv: Conv,
        d: Slot,
        a: Slot,
    },
    /// Bitcast, pointer cast, extract and each element of a vector construction.
    Copy {
        d: Slot,
        a: Slot,
    },
    PtrAdd {
        ext: IndexExt,
        scale: u64,
        wrap32: bool,
        d: Slot,
        p: Slot,
        i: Slot,
    },
    Load {
        space: Space,
        elem_bytes: u32,
        lanes: u32,
        d: Slot,
        p: Slot,
    },
    Store {
        space: Space,
        elem_bytes: u32,
        lanes: u32,
        p: Slot,
        v: Slot,
    },
    Atomic {
        space: Space,
        f: AtomFn,
        bytes: u32,
        d: Slot,
        p: Slot,
        v: Slot,
        cmp: Option<Slot>,
    },
    Barrier,
    Shfl {
        mode: ShflMode,
        d: Slot,
        v: Slot,
        lane: Slot,
    },
    Vote {
        mode: VoteMode,
        d: Slot,
        p: Slot,
    },
    Mma {
        ty: MmaType,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    LdMatrix {
        count: u32,
        trans: bool,
        d: Slot,
        p: Slot,
    },
    /// `src_size`: the slot of the source size, if any.
    CpAsync {
        size: u32,
        dst: Slot,
        src: Slot,
        src_size: Option<Slot>,
    },
    CpAsyncCommit,
    CpAsyncWait {
        n: u32,
    },
    If(Box<IfElse>),
    For(Box<ForLoop>),
}

#[derive(Debug)]
pub(crate) struct Node {
    pub inst: InstId,
    pub kind: Kind,
}

#[derive(Debug)]
pub(crate) struct Block {
    pub nodes: Vec<Node>,
    pub yields: Vec<VSlot>,
}

#[derive(Debug)]
pub(crate) struct IfElse {
    pub cond: Slot,
    pub then_block: Block,
    pub else_block: Block,
    pub results: Vec<VSlot>,
}

#[derive(Debug)]
pub(crate) struct ForLoop {
    pub ty: IntTy,
    pub start: Slot,
    pub end: Slot,
    pub step: Slot,
    pub iv: Slot,
    /// (initial value, carried parameter).
    pub init: Vec<(VSlot, VSlot)>,
    /// (yield, carried parameter) for each carried value that changes between iterations.
    pub next: Vec<(VSlot, VSlot)>,
    /// Some yield is another carried parameter: copy through a temporary (a parallel copy).
    pub parallel_copy: bool,
    /// (carried parameter, loop result).
    pub results: Vec<(VSlot, VSlot)>,
    pub body: Block,
}

/// Where the shared arrays and the dynamic window live in a block's shared memory.
#[derive(Clone, Debug)]
pub(crate) struct SharedLayout {
    pub offsets: Vec<u32>,
    pub dyn_offset: u32,
    pub total: u64,
}

/// Static arrays in declaration order, each at its alignment, then the dynamic window at the
/// next multiple of [`DYNAMIC_SHARED_ALIGN`].
pub(crate) fn shared_layout(k: &Kernel, dynamic_bytes: u32) -> Result<SharedLayout, String> {
    let mut offset = 0u64;
    let mut offsets = Vec::with_capacity(k.shared.len());
    for s in &k.shared {
        if !s.align.is_power_of_two() || s.elem == ScalarType::Pred {
            return Err(format!(
                "{MALFORMED}: shared array `{}` needs a power-of-two alignment and a non-predicate element",
                s.name
            ));
        }
        offset = offset.next_multiple_of(s.align as u64);
        offsets.push(u32::try_from(offset).map_err(|_| "shared memory exceeds 4 GiB".to_string())?);
        offset += s.elem.bytes() as u64 * s.len as u64;
    }
    let dyn_offset = offset.next_multiple_of(DYNAMIC_SHARED_ALIGN as u64);
    let total = dyn_offset + dynamic_bytes as u64;
    let dyn_offset = u32::try_from(dyn_offset).map_err(|_| "shared memory exceeds 4 GiB".to_string())?;
    Ok(SharedLayout { offsets, dyn_offset, total })
}

/// The lowered kernel.
#[derive(Debug)]
pub(crate) struct Program {
    pub nslots: usize,
    /// Permanent slots and the bits every lane of them holds.
    pub perm: Vec<(Slot, u64)>,
    pub body: Block,
    /// How messages name each `cp.async` (mnemonic and Rust location), by instruction.
    pub cp_async_sites: HashMap<InstId, String>,
}

const NONE: u32 = u32::MAX;

/// How messages about kernels the interpreter cannot run begin.
pub(crate) const MALFORMED: &str = "malformed kernel (run the verifier)";

pub(crate) fn malformed(k: &Kernel, id: Option<InstId>, message: impl std::fmt::Display) -> InterpError {
    let inst = id.and_then(|id| k.insts.get(id.index()));
    InterpError {
        kernel: k.name.clone(),
        op: inst.map_or_else(|| "kernel".to_string(), |i| i.op.mnemonic()),
        loc: inst.and_then(|i| i.loc.clone()),
        block: [0; 3],
        thread: [0; 3],
        message: format!("{MALFORMED}: {message}"),
    }
}

/// Lower `k` for a launch whose parameters hold `param_bits`.
pub(crate) fn compile(k: &Kernel, param_bits: &[u64], layout: &SharedLayout) -> Result<Program, InterpError> {
    let nvalues = k.values.len();
    let mut a = Analysis {
        k,
        layout,
        pos: 0,
        def_pos: vec![NONE; nvalues],
        last_use: vec![NONE; nvalues],
        visible: vec![false; nvalues],
        region_seen: vec![false; k.regions.len()],
        perm: vec![None; nvalues],
        loops: vec![],
    };
    for (p, &bits) in k.params.iter().zip(param_bits) {
        a.def(p.value, None)?;
        a.visible[p.value.index()] = true;
        a.perm[p.value.index()] = Some(bits);
    }
    a.region(k.body, None)?;
    let (slot_of, perm, nslots) = allocate(&a, k);
    let lower = Lower { k, slot_of };
    let body = lower.block(k.body)?;
    let mut cp_async_sites = HashMap::new();
    k.walk(|id, inst| {
        if let Op::CpAsync { .. } = inst.op {
            let at = inst.loc.as_ref().map_or_else(String::new, |l| format!(" at {l}"));
            cp_async_sites.insert(id, format!("`{}`{at}", inst.op.mnemonic()));
        }
    });
    Ok(Program { nslots, perm, body, cp_async_sites })
}

/// Pass 1: scoping and live ranges.
struct Analysis<'k> {
    k: &'k Kernel,
    layout: &'k SharedLayout,
    pos: u32,
    def_pos: Vec<u32>,
    last_use: Vec<u32>,
    visible: Vec<bool>,
    region_seen: Vec<bool>,
    /// The bits of values that are the same in every lane of every block.
    perm: Vec<Option<u64>>,
    /// Enclosing loops: start position and the values defined before it that they use.
    loops: Vec<(u32, Vec<Value>)>,
}

impl Analysis<'_> {
    fn def(&mut self, v: Value, id: Option<InstId>) -> Result<(), InterpError> {
        let i = v.index();
        if i >= self.def_pos.len() {
            return Err(malformed(self.k, id, format!("defines {v}, which has no entry in the value table")));
        }
        if self.def_pos[i] != NONE {
            return Err(malformed(self.k, id, format!("{v} is defined more than once")));
        }
        self.def_pos[i] = self.pos;
        self.last_use[i] = self.pos;
        Ok(())
    }

    /// Extend `v`'s live range to `at`, noting it for the enclosing loop.
    fn touch(&mut self, v: Value, at: u32) {
        let i = v.index();
        self.last_use[i] = self.last_use[i].max(at);
        if let Some((start, used)) = self.loops.last_mut() {
            if self.def_pos[i] < *start {
                used.push(v);
            }
        }
    }

    fn use_value(&mut self, v: Value, id: Option<InstId>) -> Result<(), InterpError> {
        if !self.visible.get(v.index()).copied().unwrap_or(false) {
            return Err(malformed(self.k, id, format!("uses {v}, which is not defined in scope here")));
        }
        self.touch(v, self.pos);
        Ok(())
    }

    fn region(&mut self, r: RegionId, owner: Option<InstId>) -> Result<(), InterpError> {
        let k = self.k;
        let region = k.regions.get(r.index()).ok_or_else(|| malformed(k, owner, format!("{r} does not exist")))?;
        if std::mem::replace(&mut self.region_seen[r.index()], true) {
            return Err(malformed(k, owner, format!("{r} belongs to more than one operation")));
        }
        let mut scope = vec![];
        for &id in &region.insts {
            let inst = k
                .insts
                .get(id.index())
                .ok_or_else(|| malformed(k, owner, format!("{r} lists {id}, which does not exist")))?;
            self.pos += 1;
            let at = self.pos;
            for v in inst.op.operands() {
                self.use_value(v, Some(id))?;
            }
            for &res in &inst.results {
                self.def(res, Some(id))?;
            }
            match &inst.op {
                Op::If { then_region, else_region, .. } => {
                    self.region(*then_region, Some(id))?;
                    self.region(*else_region, Some(id))?;
                    // The results are written at the end of each branch.
                    self.pos += 1;
                    for &res in &inst.results {
                        self.touch(res, self.pos);
                    }
                }
                Op::For { end, step, body, .. } => {
                    let body_region = k
                        .regions
                        .get(body.index())
                        .ok_or_else(|| malformed(k, Some(id), format!("{body} does not exist")))?;
                    for &p in &body_region.params {
                        self.def(p, Some(id))?;
                        self.visible[p.index()] = true;
                    }
                    self.loops.push((at, vec![]));
                    self.region(*body, Some(id))?;
                    self.pos += 1;
                    let end_pos = self.pos;
                    // Bounds are read and parameters written on every iteration; the results
                    // are written when the loop ends.
                    for &v in [*end, *step].iter().chain(&body_region.params).chain(&inst.results) {
                        self.touch(v, end_pos);
                    }
                    let (_, used) = self.loops.pop().unwrap_or_default();
                    for v in used {
                        self.touch(v, end_pos);
                    }
                    for &p in &body_region.params {
                        self.visible[p.index()] = false;
                    }
                }
                Op::Const(c) => self.set_perm(inst, Constant::new(c.ty, c.bits).bits),
                Op::SharedBase(s) => {
                    let offset = self
                        .layout
                        .offsets
                        .get(s.index())
                        .ok_or_else(|| malformed(k, Some(id), format!("no shared array {s}")))?;
                    self.set_perm(inst, *offset as u64);
                }
                Op::DynSharedBase(_) => self.set_perm(inst, self.layout.dyn_offset as u64),
                _ => {}
            }
            for &res in &inst.results {
                self.visible[res.index()] = true;
                scope.push(res);
            }
        }
        self.pos += 1;
        for &y in &region.yields {
            if !self.visible.get(y.index()).copied().unwrap_or(false) {
                return Err(malformed(k, owner, format!("{r} yields {y}, which is not defined in scope")));
            }
            self.touch(y, self.pos);
        }
        for v in scope {
            self.visible[v.index()] = false;
        }
        Ok(())
    }

    fn set_perm(&mut self, inst: &Inst, bits: u64) {
        if let Some(&r) = inst.results.first() {
            self.perm[r.index()] = Some(bits);
        }
    }
}

fn width(ty: Type) -> u32 {
    match ty {
        Type::Vector(_, n) => (n as u32).max(1),
        _ => 1,
    }
}

/// Pass 2: permanent slots first (deduplicated by bits), then a linear scan over positions in
/// which a value's slot is taken at its definition and returned after its last use (results
/// are placed before operands are returned, so they never share a slot).
fn allocate(a: &Analysis<'_>, k: &Kernel) -> (Vec<Slot>, Vec<(Slot, u64)>, usize) {
    let n = k.values.len();
    let mut slot_of = vec![NONE; n];
    let mut perm = vec![];
    let mut by_bits: HashMap<u64, Slot> = HashMap::new();
    for (v, bits) in a.perm.iter().enumerate() {
        if let Some(bits) = *bits {
            slot_of[v] = *by_bits.entry(bits).or_insert_with(|| {
                perm.push((perm.len() as Slot, bits));
                perm.len() as Slot - 1
            });
        }
    }
    let npos = a.pos as usize + 1;
    let mut defs_at: Vec<Vec<usize>> = vec![vec![]; npos];
    let mut frees_at: Vec<Vec<usize>> = vec![vec![]; npos];
    for v in 0..n {
        if a.def_pos[v] != NONE && a.perm[v].is_none() {
            defs_at[a.def_pos[v] as usize].push(v);
            frees_at[a.last_use[v] as usize].push(v);
        }
    }
    let mut next = perm.len() as Slot;
    let mut free: HashMap<u32, Vec<Slot>> = HashMap::new();
    for p in 0..npos {
        for &v in &defs_at[p] {
            let w = width(k.values[v].ty);
            slot_of[v] = free.get_mut(&w).and_then(|l| l.pop()).unwrap_or_else(|| {
                next += w;
                next - w
            });
        }
        for &v in &frees_at[p] {
            free.entry(width(k.values[v].ty)).or_default().push(slot_of[v]);
        }
    }
    (slot_of, perm, next as usize)
}

/// Pass 3: type checks and lowering.
struct Lower<'k> {
    k: &'k Kernel,
    slot_of: Vec<Slot>,
}

impl Lower<'_> {
    fn ty(&self, v: Value) -> Type {
        self.k.values[v.index()].ty
    }
    fn s(&self, v: Value) -> Slot {
        self.slot_of[v.index()]
    }
    fn vs(&self, v: Value) -> VSlot {
        VSlot { base: self.s(v), width: width(self.ty(v)) }
    }

    fn block(&self, r: RegionId) -> Result<Block, InterpError> {
        let region = &self.k.regions[r.index()];
        let mut nodes = Vec::with_capacity(region.insts.len());
        for &id in &region.insts {
            self.inst(id, &mut nodes)?;
        }
        Ok(Block { nodes, yields: region.yields.iter().map(|&v| self.vs(v)).collect() })
    }

    fn inst(&self, id: InstId, out: &mut Vec<Node>) -> Result<(), InterpError> {
        let k = self.k;
        let inst = &k.insts[id.index()];
        let err = |msg: String| malformed(k, Some(id), msg);
        let scalar =
            |v: Value| self.ty(v).scalar().ok_or_else(|| err(format!("{v} must be a scalar, found {}", self.ty(v))));
        let same = |a: Value, b: Value| {
            if self.ty(a) == self.ty(b) {
                Ok(())
            } else {
                Err(err(format!("operand types differ: {a} is {}, {b} is {}", self.ty(a), self.ty(b))))
            }
        };
        let expect = |tys: &[Type]| -> Result<(), InterpError> {
            if inst.results.len() != tys.len() {
                return Err(err(format!("defines {} values, expected {}", inst.results.len(), tys.len())));
            }
            for (r, t) in inst.results.iter().zip(tys) {
                if self.ty(*r) != *t {
                    return Err(err(format!("result {r} has type {}, expected {t}", self.ty(*r))));
                }
            }
            Ok(())
        };
        let undefined = |what: String| err(format!("{what} is not defined"));
        let d = || self.s(inst.results[0]);
        let mut push = |kind: Kind| out.push(Node { inst: id, kind });
        match &inst.op {
            Op::Const(c) => expect(&[Type::Scalar(c.ty)])?,
            Op::SharedBase(s) => expect(&[Type::Ptr(AddrSpace::Shared, k.shared[s.index()].elem)])?,
            Op::DynSharedBase(elem) => {
                if *elem == ScalarType::Pred {
                    return Err(err("dynamic shared memory of predicates".into()));
                }
                expect(&[Type::Ptr(AddrSpace::Shared, *elem)])?
            }
            Op::Special(reg) => {
                expect(&[Type::U32])?;
                push(Kind::Special { d: d(), reg: *reg });
            }
            Op::Unary(op, a) => {
                let t = scalar(*a)?;
                expect(&[Type::Scalar(t)])?;
                let (d, a) = (d(), self.s(*a));
                let kind = match (IntTy::of(t), FTy::of(t)) {
                    _ if t == ScalarType::Pred && *op == UnaryOp::Not => Some(Kind::PredNot { d, a }),
                    (Some(ty), _) => {
                        let op = match op {
                            UnaryOp::Neg if t.is_signed_int() => Some(IntUn::Neg),
                            UnaryOp::Abs if t.is_signed_int() => Some(IntUn::Abs),
                            UnaryOp::Not => Some(IntUn::Not),
                            UnaryOp::Popc if t.bits() >= 32 => Some(IntUn::Popc),
                            UnaryOp::Clz if t.bits() >= 32 => Some(IntUn::Clz),
                            _ => None,
                        };
                        op.map(|op| Kind::IntUn { op, ty, d, a })
                    }
                    (_, Some(ty)) => match op {
                        UnaryOp::Neg => Some(Kind::FloatUn { op: FloatUn::Neg, ty, d, a }),
                        UnaryOp::Abs => Some(Kind::FloatUn { op: FloatUn::Abs, ty, d, a }),
                        UnaryOp::Sqrt => Some(Kind::FloatUn { op: FloatUn::Sqrt, ty, d, a }),
                        UnaryOp::Rcp => Some(Kind::FloatUn { op: FloatUn::Rcp, ty, d, a }),
                        _ if ty == FTy::F32 => Approx::of(*op).map(|op| Kind::Approx { op, d, a }),
                        _ => None,
                    },
                    _ => None,
                };
                push(kind.ok_or_else(|| undefined(format!("`{op}` on {t}")))?);
            }
            Op::Binary(op, a, b) => {
                let t = scalar(*a)?;
                let tb = scalar(*b)?;
                expect(&[Type::Scalar(t)])?;
                let (d, a, b) = (d(), self.s(*a), self.s(*b));
                let kind = match op {
                    BinaryOp::Shl | BinaryOp::Shr => {
                        if tb != ScalarType::U32 {
                            return Err(err(format!("shift amount must be u32, found {tb}")));
                        }
                        let op = if *op == BinaryOp::Shl { IntBin::Shl } else { IntBin::Shr };
                        IntTy::of(t).map(|ty| Kind::IntBin { op, ty, d, a, b })
                    }
                    _ => {
                        if t != tb {
                            return Err(err(format!("operand types differ: {t} and {tb}")));
                        }
                        binary(*op, t, d, a, b)
                    }
                };
                push(kind.ok_or_else(|| undefined(format!("`{op}` on {t}")))?);
            }
            Op::Fma(a, b, c) => {
                let t = scalar(*a)?;
                same(*a, *b)?;
                same(*a, *c)?;
                expect(&[Type::Scalar(t)])?;
                let (d, a, b, c) = (d(), self.s(*a), self.s(*b), self.s(*c));
                let kind = match (IntTy::of(t), FTy::of(t)) {
                    (Some(ty), _) => Kind::IntFma { ty, d, a, b, c },
                    (_, Some(ty)) => Kind::FloatFma { ty, d, a, b, c },
                    _ => return Err(undefined(format!("`fma` on {t}"))),
                };
                push(kind);
            }
            Op::Cmp(op, a, b) => {
                let t = scalar(*a)?;
                same(*a, *b)?;
                expect(&[Type::PRED])?;
                let (d, a, b) = (d(), self.s(*a), self.s(*b));
                let int_op = match op {
                    CmpOp::Eq => Some(IntCmp::Eq),
                    CmpOp::Ne => Some(IntCmp::Ne),
                    CmpOp::Lt => Some(IntCmp::Lt),
                    CmpOp::Le => Some(IntCmp::Le),
                    CmpOp::Gt => Some(IntCmp::Gt),
                    CmpOp::Ge => Some(IntCmp::Ge),
                    CmpOp::Neu | CmpOp::Nan => None,
                };
                let kind = match (IntTy::of(t), FTy::of(t)) {
                    (Some(ty), _) => int_op.map(|op| Kind::IntCmp { op, ty, d, a, b }),
                    (_, Some(ty)) => Some(Kind::FloatCmp { op: *op, ty, d, a, b }),
                    _ if t == ScalarType::Pred && matches!(op, CmpOp::Eq | CmpOp::Ne) => {
                        Some(Kind::PredCmp { eq: *op == CmpOp::Eq, d, a, b })
                    }
                    _ => None,
                };
                push(kind.ok_or_else(|| undefined(format!("`cmp.{op}` on {t}")))?);
            }
            Op::Select(c, a, b) => {
                if self.ty(*c) != Type::PRED {
                    return Err(err(format!("condition {c} must be a predicate")));
                }
                same(*a, *b)?;
                if matches!(self.ty(*a), Type::Vector(..)) {
                    return Err(err("`select` of vectors: select the elements".into()));
                }
                expect(&[self.ty(*a)])?;
                push(Kind::Select { d: d(), c: self.s(*c), a: self.s(*a), b: self.s(*b) });
            }
            Op::Cvt(a, cvt) => {
                let from = scalar(*a)?;
                let to = cvt.to;
                if from == ScalarType::Pred || to == ScalarType::Pred {
                    return Err(err("`cvt` does not take or make predicates".into()));
                }
                let needs = cvt_needs_rounding(from, to);
                // A rounding is required exactly where PTX requires one, and allowed besides only
                // to round a float to an integral value in its own format.
                let rounds_in_place = from.is_float() && from == to;
                let mode = match cvt.rounding {
                    None if needs => return Err(err(format!("conversion {from} -> {to} needs a rounding mode"))),
                    Some(_) if !(needs || rounds_in_place) => {
                        return Err(err(format!("conversion {from} -> {to} is exact; it takes no rounding mode")))
                    }
                    m => m,
                };
                if cvt.sat && !to.is_int() {
                    return Err(err("`.sat` applies to integer destinations only".into()));
                }
                expect(&[Type::Scalar(to)])?;
                let rounding = mode.unwrap_or(Rounding::Rn);
                // A float converted to its own type without rounding is a move in PTX: NaN
                // payloads survive.
                if from.is_float() && cvt.is_move(from) {
                    push(Kind::Copy { d: d(), a: self.s(*a) });
                    return Ok(());
                }
                let conv = match (Fmt::of(from), Fmt::of(to)) {
                    (None, None) => Conv::IntInt { from, to, sat: cvt.sat },
                    (Some(from), None) => Conv::FloatInt { from, to, mode: rounding },
                    (None, Some(to)) => Conv::IntFloat { from, to, mode: rounding },
                    (Some(from), Some(to)) => Conv::FloatFloat { from, to, mode },
                };
                push(Kind::Cvt { conv, d: d(), a: self.s(*a) });
            }
            Op::Bitcast(a, to) => {
                let from = scalar(*a)?;
                if from.bits() != to.bits() || from == ScalarType::Pred || *to == ScalarType::Pred {
                    return Err(err(format!("cannot bitcast {from} to {to}")));
                }
                expect(&[Type::Scalar(*to)])?;
                push(Kind::Copy { d: d(), a: self.s(*a) });
            }
            Op::PtrAdd(p, i) => {
                let Type::Ptr(space, elem) = self.ty(*p) else {
                    return Err(err(format!("{p} is not a pointer")));
                };
                let ext = match scalar(*i)? {
                    ScalarType::I32 => IndexExt::Signed32,
                    ScalarType::U32 => IndexExt::Unsigned32,
                    ScalarType::I64 | ScalarType::U64 => IndexExt::Full64,
                    other => return Err(err(format!("index {i} must be a 32- or 64-bit integer, found {other}"))),
                };
                expect(&[self.ty(*p)])?;
                let wrap32 = space.pointer_bits() == 32;
                push(Kind::PtrAdd { ext, scale: elem.bytes() as u64, wrap32, d: d(), p: self.s(*p), i: self.s(*i) });
            }
            Op::PtrCast(p, elem) => {
                let Type::Ptr(space, _) = self.ty(*p) else {
                    return Err(err(format!("{p} is not a pointer")));
                };
                if *elem == ScalarType::Pred {
                    return Err(err("pointer to predicates".into()));
                }
                expect(&[Type::Ptr(space, *elem)])?;
                push(Kind::Copy { d: d(), a: self.s(*p) });
            }
            Op::Load { ptr, lanes } => {
                let (space, elem) = memory_ptr(self.ty(*ptr)).map_err(err)?;
                let ty = match lanes {
                    1 => Type::Scalar(elem),
                    2 | 4 => Type::Vector(elem, *lanes),
                    n => return Err(err(format!("loads have 1, 2 or 4 lanes, not {n}"))),
                };
                expect(&[ty])?;
                let (elem_bytes, lanes) = (elem.bytes(), *lanes as u32);
                push(Kind::Load { space, elem_bytes, lanes, d: d(), p: self.s(*ptr) });
            }
            Op::Store { ptr, value } => {
                let (space, elem) = memory_ptr(self.ty(*ptr)).map_err(err)?;
                let lanes = match self.ty(*value) {
                    Type::Scalar(t) if t == elem => 1,
                    Type::Vector(t, n @ (2 | 4)) if t == elem => n as u32,
                    other => return Err(err(format!("cannot store {other} through a pointer to {elem}"))),
                };
                expect(&[])?;
                push(Kind::Store { space, elem_bytes: elem.bytes(), lanes, p: self.s(*ptr), v: self.s(*value) });
            }
            Op::Atomic { op, ptr, value, compare } => {
                let (space, elem) = memory_ptr(self.ty(*ptr)).map_err(err)?;
                if self.ty(*value) != Type::Scalar(elem) {
                    return Err(err(format!("atomic value {value} is {}, the elements are {elem}", self.ty(*value))));
                }
                let f = atom_fn(*op, elem).ok_or_else(|| undefined(format!("`atomic.{op}` on {elem}")))?;
                let cmp = match (op, compare) {
                    (AtomicOp::Cas, Some(c)) if self.ty(*c) == Type::Scalar(elem) => Some(self.s(*c)),
                    (AtomicOp::Cas, _) => {
                        return Err(err("`atomic.cas` needs a compare value of the element type".into()))
                    }
                    (_, Some(_)) => return Err(err("only `atomic.cas` takes a compare value".into())),
                    (_, None) => None,
                };
                expect(&[Type::Scalar(elem)])?;
                let (p, v) = (self.s(*ptr), self.s(*value));
                push(Kind::Atomic { space, f, bytes: elem.bytes(), d: d(), p, v, cmp });
            }
            Op::Barrier => {
                expect(&[])?;
                push(Kind::Barrier);
            }
            Op::Shfl { mode, value, lane } => {
                let t = scalar(*value)?;
                if t.bits() != 32 || self.ty(*lane) != Type::U32 {
                    return Err(err("shuffles move a 32-bit value and take a u32 lane operand".into()));
                }
                expect(&[Type::Scalar(t)])?;
                push(Kind::Shfl { mode: *mode, d: d(), v: self.s(*value), lane: self.s(*lane) });
            }
            Op::Vote { mode, pred } => {
                if self.ty(*pred) != Type::PRED {
                    return Err(err(format!("vote operand {pred} must be a predicate")));
                }
                expect(&[if *mode == VoteMode::Ballot { Type::U32 } else { Type::PRED }])?;
                push(Kind::Vote { mode: *mode, d: d(), p: self.s(*pred) });
            }
            Op::Mma { ty, a, b, c } => {
                let want = [
                    (*a, Type::Vector(ScalarType::U32, 4)),
                    (*b, Type::Vector(ScalarType::U32, 2)),
                    (*c, Type::Vector(ScalarType::F32, 4)),
                ];
                if want.iter().any(|(v, t)| self.ty(*v) != *t) {
                    return Err(err("`mma.m16n8k16` takes v4u32, v2u32 and v4f32 fragments".into()));
                }
                expect(&[Type::Vector(ScalarType::F32, 4)])?;
                push(Kind::Mma { ty: *ty, d: d(), a: self.s(*a), b: self.s(*b), c: self.s(*c) });
            }
            Op::LdMatrix { ptr, count, trans } => {
                match self.ty(*ptr) {
                    Type::Ptr(AddrSpace::Shared, e) if e.bits() == 16 => {}
                    other => {
                        return Err(err(format!("`ldmatrix` needs a shared pointer to a 16-bit type, found {other}")))
                    }
                }
                let ty = match count {
                    1 => Type::U32,
                    2 | 4 => Type::Vector(ScalarType::U32, *count),
                    n => return Err(err(format!("`ldmatrix` loads 1, 2 or 4 matrices, not {n}"))),
                };
                expect(&[ty])?;
                push(Kind::LdMatrix { count: *count as u32, trans: *trans, d: d(), p: self.s(*ptr) });
            }
            Op::CpAsync { dst, src, size, src_size } => {
                if !matches!(size, 4 | 8 | 16) {
                    return Err(err(format!("`cp.async` copies 4, 8 or 16 bytes, not {size}")));
                }
                match (memory_ptr(self.ty(*dst)).map_err(err)?, memory_ptr(self.ty(*src)).map_err(err)?) {
                    ((Space::Shared, _), (Space::Global, _)) => {}
                    _ => return Err(err("`cp.async` copies from a global pointer to a shared pointer".into())),
                }
                if src_size.is_some_and(|n| self.ty(n) != Type::U32) {
                    return Err(err("`cp.async` takes a u32 source size".into()));
                }
                expect(&[])?;
                let src_size = src_size.map(|n| self.s(n));
                push(Kind::CpAsync { size: u32::from(*size), dst: self.s(*dst), src: self.s(*src), src_size });
            }
            Op::CpAsyncCommit => {
                expect(&[])?;
                push(Kind::CpAsyncCommit);
            }
            Op::CpAsyncWait(n) => {
                expect(&[])?;
                push(Kind::CpAsyncWait { n: u32::from(*n) });
            }
            Op::Extract(v, i) => match self.ty(*v) {
                Type::Vector(t, n) if *i < n => {
                    expect(&[Type::Scalar(t)])?;
                    push(Kind::Copy { d: d(), a: self.s(*v) + *i as u32 });
                }
                other => return Err(err(format!("cannot extract element {i} of {other}"))),
            },
            Op::MakeVector(vals) => {
                let Some(&first) = vals.first() else {
                    return Err(err("a vector of no elements".into()));
                };
                let t = scalar(first)?;
                for &v in vals {
                    same(first, v)?;
                }
                if t == ScalarType::Pred || !matches!(vals.len(), 2 | 4) {
                    return Err(err(format!("vectors have 2 or 4 non-predicate elements, not {} of {t}", vals.len())));
                }
                expect(&[Type::Vector(t, vals.len() as u8)])?;
                let d = d();
                for (i, &v) in vals.iter().enumerate() {
                    push(Kind::Copy { d: d + i as u32, a: self.s(v) });
                }
            }
            Op::If { cond, then_region, else_region } => {
                if self.ty(*cond) != Type::PRED {
                    return Err(err(format!("condition {cond} must be a predicate")));
                }
                let (tr, er) = (k.region(*then_region), k.region(*else_region));
                if !tr.params.is_empty() || !er.params.is_empty() {
                    return Err(err("`if` regions take no parameters".into()));
                }
                let tys = |r: &Region| r.yields.iter().map(|&v| self.ty(v)).collect::<Vec<_>>();
                let (tt, et) = (tys(tr), tys(er));
                if tt != et {
                    return Err(err(format!("branches yield different types: {tt:?} and {et:?}")));
                }
                expect(&tt)?;
                push(Kind::If(Box::new(IfElse {
                    cond: self.s(*cond),
                    then_block: self.block(*then_region)?,
                    else_block: self.block(*else_region)?,
                    results: inst.results.iter().map(|&r| self.vs(r)).collect(),
                })));
            }
            Op::For { start, end, step, init, body } => {
                let t = scalar(*start)?;
                let ty = IntTy::of(t)
                    .filter(|_| t.bits() >= 32)
                    .ok_or_else(|| err(format!("loop bounds must be 32- or 64-bit integers, found {t}")))?;
                same(*start, *end)?;
                same(*start, *step)?;
                let region = k.region(*body);
                let init_tys: Vec<Type> = init.iter().map(|&v| self.ty(v)).collect();
                let mut expected = vec![Type::Scalar(t)];
                expected.extend(&init_tys);
                let param_tys: Vec<Type> = region.params.iter().map(|&v| self.ty(v)).collect();
                let yield_tys: Vec<Type> = region.yields.iter().map(|&v| self.ty(v)).collect();
                if param_tys != expected || yield_tys != init_tys {
                    return Err(err(format!(
                        "loop body takes {param_tys:?} and yields {yield_tys:?}; the carried values are {init_tys:?}"
                    )));
                }
                expect(&init_tys)?;
                let carried = &region.params[1..];
                let mut next = vec![];
                let mut parallel_copy = false;
                for (y, p) in region.yields.iter().zip(carried) {
                    if y != p {
                        parallel_copy |= carried.contains(y);
                        next.push((self.vs(*y), self.vs(*p)));
                    }
                }
                push(Kind::For(Box::new(ForLoop {
                    ty,
                    start: self.s(*start),
                    end: self.s(*end),
                    step: self.s(*step),
                    iv: self.s(region.params[0]),
                    init: init.iter().zip(carried).map(|(i, p)| (self.vs(*i), self.vs(*p))).collect(),
                    next,
                    parallel_copy,
                    results: carried.iter().zip(&inst.results).map(|(p, r)| (self.vs(*p), self.vs(*r))).collect(),
                    body: self.block(*body)?,
                })));
            }
        }
        Ok(())
    }
}

fn binary(op: BinaryOp, t: ScalarType, d: Slot, a: Slot, b: Slot) -> Option<Kind> {
    if let Some(ty) = IntTy::of(t) {
        let op = match op {
            BinaryOp::Div => return Some(Kind::IntDiv { rem: false, ty, d, a, b }),
            BinaryOp::Rem => return Some(Kind::IntDiv { rem: true, ty, d, a, b }),
            BinaryOp::Add => IntBin::Add,
            BinaryOp::Sub => IntBin::Sub,
            BinaryOp::Mul => IntBin::Mul,
            BinaryOp::MulHi => IntBin::MulHi,
            BinaryOp::Min => IntBin::Min,
            BinaryOp::Max => IntBin::Max,
            BinaryOp::And => IntBin::And,
            BinaryOp::Or => IntBin::Or,
            BinaryOp::Xor => IntBin::Xor,
            BinaryOp::Shl => IntBin::Shl,
            BinaryOp::Shr => IntBin::Shr,
        };
        return Some(Kind::IntBin { op, ty, d, a, b });
    }
    if let Some(ty) = FTy::of(t) {
        let op = match op {
            BinaryOp::Add => FloatBin::Add,
            BinaryOp::Sub => FloatBin::Sub,
            BinaryOp::Mul => FloatBin::Mul,
            BinaryOp::Div => FloatBin::Div,
            BinaryOp::Min => FloatBin::Min,
            BinaryOp::Max => FloatBin::Max,
            _ => return None,
        };
        return Some(Kind::FloatBin { op, ty, d, a, b });
    }
    let op = match (t, op) {
        (ScalarType::Pred, BinaryOp::And) => PredBin::And,
        (ScalarType::Pred, BinaryOp::Or) => PredBin::Or,
        (ScalarType::Pred, BinaryOp::Xor) => PredBin::Xor,
        _ => return None,
    };
    Some(Kind::PredBin { op, d, a, b })
}

fn atom_fn(op: AtomicOp, elem: ScalarType) -> Option<AtomFn> {
    use ScalarType::*;
    Some(match (op, elem) {
        (AtomicOp::Add, U32 | I32) => AtomFn::Add32,
        (AtomicOp::Add, U64) => AtomFn::Add64,
        (AtomicOp::Add, F32) => AtomFn::AddF32,
        (AtomicOp::Add, F64) => AtomFn::AddF64,
        (AtomicOp::Min, I32) => AtomFn::MinI32,
        (AtomicOp::Min, U32) => AtomFn::MinU32,
        (AtomicOp::Min, I64) => AtomFn::MinI64,
        (AtomicOp::Min, U64) => AtomFn::MinU64,
        (AtomicOp::Max, I32) => AtomFn::MaxI32,
        (AtomicOp::Max, U32) => AtomFn::MaxU32,
        (AtomicOp::Max, I64) => AtomFn::MaxI64,
        (AtomicOp::Max, U64) => AtomFn::MaxU64,
        (AtomicOp::Exch, U32 | I32 | U64 | I64 | F32 | F64) => AtomFn::Exch,
        (AtomicOp::Cas, U32 | I32 | U64 | I64 | F32 | F64) => AtomFn::Cas,
        _ => return None,
    })
}

fn memory_ptr(ty: Type) -> Result<(Space, ScalarType), String> {
    match ty {
        Type::Ptr(AddrSpace::Global, e) if e != ScalarType::Pred => Ok((Space::Global, e)),
        Type::Ptr(AddrSpace::Shared, e) if e != ScalarType::Pred => Ok((Space::Shared, e)),
        Type::Ptr(space, e) => Err(format!(
            "memory access through a pointer to {e} in {space}: only global and shared memory of non-predicates are supported"
        )),
        other => Err(format!("memory access through {other}, which is not a pointer")),
    }
}

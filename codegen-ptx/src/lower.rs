//! Instruction lowering: the kernel's structured regions to PTX instructions and labels.
//!
//! Every IR operation maps to PTX whose meaning is exactly the IR's (see `ruda_ir::kernel`):
//! float arithmetic carries an explicit `.rn` so that ptxas never contracts it into an fma, no
//! instruction carries `.ftz`, and anything the target lacks is an error naming the operation.

use std::fmt::{self, Write};
use std::sync::Arc;

use ruda_ir::verify::uniformity;
use ruda_ir::{
    AddrSpace, AtomicOp, BinaryOp, CmpOp, Constant, InstId, Kernel, Loc, Op, RegionId, ScalarType, ShflMode, Type,
    UnaryOp, Value, VoteMode,
};

use crate::module::Names;
use crate::regs::{Reg, RegClass, Regs};
use crate::{Arch, CodegenError, PtxVersion};

/// A PTX ISA version some instruction of the kernel needs, with what needs it (for messages).
#[derive(Clone, Debug)]
pub(crate) struct Need {
    pub(crate) ptx: PtxVersion,
    pub(crate) what: String,
}

/// The lowered body of the kernel and what the module text needs to know about it.
pub(crate) struct Lowered {
    /// Instructions and labels, one per line, indented.
    pub(crate) body: String,
    pub(crate) regs: Regs,
    /// Source files of `.loc` lines, in first-use order (`.file 1` is the first).
    pub(crate) files: Vec<Arc<str>>,
    pub(crate) needs: Vec<Need>,
}

/// Lower `k` (already verified) for `arch`.
pub(crate) fn lower(k: &Kernel, arch: Arch, names: &Names) -> Result<Lowered, CodegenError> {
    let mut l = Lower {
        k,
        arch,
        names,
        uniform: uniformity(k),
        regs: Regs::new(k.values.len()),
        out: String::new(),
        labels: 0,
        files: Vec::new(),
        last_loc: None,
        pending_loc: None,
        needs: Vec::new(),
        addressing: Addressing::plan(k),
    };
    l.params()?;
    l.region(k.body)?;
    l.ins("ret", "");
    Ok(Lowered { body: l.out, regs: l.regs, files: l.files, needs: l.needs })
}

pub(crate) struct Lower<'a> {
    pub(crate) k: &'a Kernel,
    pub(crate) arch: Arch,
    names: &'a Names,
    uniform: Vec<bool>,
    pub(crate) regs: Regs,
    out: String,
    labels: u32,
    files: Vec<Arc<str>>,
    last_loc: Option<(usize, u32, u32)>,
    pending_loc: Option<Loc>,
    needs: Vec<Need>,
    addressing: Addressing,
}

/// `[reg+imm]` addressing: memory instructions whose address is `ptradd(q, constant)` address
/// `[q+bytes]` instead, and the `ptradd`s (and constant indices) that this leaves unused are
/// not emitted.
struct Addressing {
    /// Per instruction: the base pointer and byte offset its folded address uses.
    folded: Vec<Option<(Value, i64)>>,
    /// Per instruction: whether it is left out (its only uses were folded away).
    skip: Vec<bool>,
}

impl Addressing {
    fn plan(k: &Kernel) -> Addressing {
        let n = k.values.len();
        let mut def: Vec<Option<InstId>> = vec![None; n];
        let mut order = Vec::new();
        let mut uses = vec![0u32; n];
        let mut stack = vec![k.body];
        while let Some(r) = stack.pop() {
            let region = k.region(r);
            for &id in &region.insts {
                let op = &k.inst(id).op;
                for v in &k.inst(id).results {
                    def[v.index()] = Some(id);
                }
                for v in op.operands() {
                    uses[v.index()] += 1;
                }
                stack.extend(op.regions());
                order.push(id);
            }
            for y in &region.yields {
                uses[y.index()] += 1;
            }
        }
        let op_of = |v: Value| def[v.index()].map(|id| &k.inst(id).op);
        let mut folded = vec![None; k.insts.len()];
        // Uses of each value that no emitted instruction reads.
        let mut gone = vec![0u32; n];
        for &id in &order {
            let (ptr, lanes) = match &k.inst(id).op {
                Op::Load { ptr, lanes } => (*ptr, *lanes as usize),
                Op::Store { ptr, value } => (*ptr, k.ty(*value).lanes() as usize),
                Op::Atomic { ptr, .. } => (*ptr, 1),
                _ => continue,
            };
            let Some(Op::PtrAdd(q, i)) = op_of(ptr) else { continue };
            let (Some(Op::Const(c)), Type::Ptr(space, elem)) = (op_of(*i), k.ty(ptr)) else { continue };
            // Addresses wrap at the pointer width, as `ptr_add`'s arithmetic does.
            let offset = c.as_i64().wrapping_mul(elem.bytes() as i64);
            let fits = space.pointer_bits() == 32
                || Lower::pieces(elem, lanes).iter().all(|p| i32::try_from(offset.wrapping_add(p.2 as i64)).is_ok());
            if fits {
                folded[id.index()] = Some((*q, offset));
                gone[ptr.index()] += 1;
            }
        }
        let mut skip = vec![false; k.insts.len()];
        for &id in &order {
            let inst = k.inst(id);
            if let (Op::PtrAdd(_, i), [v]) = (&inst.op, inst.results.as_slice()) {
                if uses[v.index()] == gone[v.index()] && uses[v.index()] > 0 {
                    skip[id.index()] = true;
                    gone[i.index()] += 1;
                }
            }
        }
        for &id in &order {
            let inst = k.inst(id);
            if let (Op::Const(_), [v]) = (&inst.op, inst.results.as_slice()) {
                skip[id.index()] = uses[v.index()] == gone[v.index()] && uses[v.index()] > 0;
            }
        }
        Addressing { folded, skip }
    }
}

/// A memory operand: `[reg]`, `[reg+8]`, `[reg+-8]`.
#[derive(Clone, Copy)]
struct Address {
    reg: Reg,
    offset: i64,
    /// 32-bit address spaces, where offsets wrap at 32 bits.
    narrow: bool,
}

impl Address {
    /// The operand for the piece `bytes` further on.
    fn at(self, bytes: u32) -> String {
        let mut offset = self.offset.wrapping_add(bytes as i64);
        if self.narrow {
            offset = offset as i32 as i64;
        }
        match offset {
            0 => format!("[{}]", self.reg),
            _ => format!("[{}+{offset}]", self.reg),
        }
    }
}

/// Separates the operands of an instruction.
pub(crate) struct Ops<'a>(pub(crate) &'a [&'a dyn fmt::Display]);

impl fmt::Display for Ops<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, op) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{op}")?;
        }
        Ok(())
    }
}

/// A brace-enclosed register list for vector memory operations: `{%f1, %f2}`.
struct RegList<'a>(&'a [Reg]);

impl fmt::Display for RegList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        f.write_str("}")
    }
}

/// The PTX type of a value in memory or in a parameter: f16/bf16 are moved as raw `.b16`.
pub(crate) fn mem_type(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F16 | ScalarType::BF16 => "b16",
        other => other.name(),
    }
}

/// The suffix of `mov` for a register class.
pub(crate) fn mov_suffix(c: RegClass) -> &'static str {
    match c {
        RegClass::F32 => "f32",
        RegClass::F64 => "f64",
        other => other.bits_suffix(),
    }
}

/// A constant as a PTX immediate (floats as exact hex bit patterns).
fn immediate(c: Constant) -> String {
    use ScalarType::*;
    match c.ty {
        Pred => {
            if c.bits != 0 {
                "1".into()
            } else {
                "0".into()
            }
        }
        I8 | I16 | I32 | I64 => c.as_i64().to_string(),
        U8 | U16 | U32 | U64 => c.bits.to_string(),
        F16 | BF16 => format!("0x{:04X}", c.bits),
        F32 => format!("0f{:08X}", c.bits),
        F64 => format!("0d{:016X}", c.bits),
    }
}

/// The typed `mov` that materialises a constant of type `t` (8-bit values in 16-bit registers).
fn const_mov_type(t: ScalarType) -> &'static str {
    use ScalarType::*;
    match t {
        Pred => "pred",
        I8 | I16 => "s16",
        U8 | U16 => "u16",
        F16 | BF16 => "b16",
        other => other.name(),
    }
}

impl<'a> Lower<'a> {
    // ---- text -------------------------------------------------------------------------------

    /// One instruction line.
    pub(crate) fn ins(&mut self, mnemonic: &str, operands: impl fmt::Display) {
        self.flush_loc();
        let operands = operands.to_string();
        if operands.is_empty() {
            let _ = writeln!(self.out, "\t{mnemonic};");
        } else {
            let _ = writeln!(self.out, "\t{mnemonic:<23} {operands};");
        }
    }

    /// One instruction line under a predicate guard (`@%p` or `@!%p`).
    fn guarded(&mut self, pred: Reg, negate: bool, mnemonic: &str, operands: impl fmt::Display) {
        self.flush_loc();
        let bang = if negate { "!" } else { "" };
        let guarded = format!("@{bang}{pred} {mnemonic}");
        let _ = writeln!(self.out, "\t{guarded:<23} {operands};");
    }

    fn label(&mut self, name: &str) {
        let _ = writeln!(self.out, "{name}:");
    }

    fn next_label(&mut self) -> u32 {
        self.labels += 1;
        self.labels - 1
    }

    /// The source location of the instructions that follow: a `.loc` line is written before the
    /// next instruction unless the location is the one already in force.
    fn loc(&mut self, loc: Option<&Loc>) {
        if let Some(loc) = loc {
            self.pending_loc = Some(loc.clone());
        }
    }

    fn flush_loc(&mut self) {
        let Some(loc) = self.pending_loc.take() else { return };
        let file = match self.files.iter().position(|f| **f == *loc.file) {
            Some(i) => i,
            None => {
                self.files.push(loc.file.clone());
                self.files.len() - 1
            }
        };
        let key = (file, loc.line, loc.col);
        if self.last_loc != Some(key) {
            self.last_loc = Some(key);
            let _ = writeln!(self.out, "\t.loc {} {} {}", file + 1, loc.line, loc.col);
        }
    }

    // ---- errors and requirements ------------------------------------------------------------

    /// "`cvt` at file:line:col" for messages.
    fn op_at(&self, id: InstId) -> String {
        let inst = self.k.inst(id);
        let at = inst.loc.as_ref().map(|l| format!(" at {l}")).unwrap_or_default();
        format!("`{}`{at}", inst.op.mnemonic())
    }

    /// Record that instruction `id`, lowered as `ptx_form`, needs `arch` and PTX ISA `ptx`:
    /// an error when the target architecture is older.
    pub(crate) fn require(
        &mut self,
        id: InstId,
        ptx_form: &str,
        arch: Arch,
        ptx: PtxVersion,
    ) -> Result<(), CodegenError> {
        if self.arch < arch {
            return Err(CodegenError::Unsupported(format!(
                "kernel `{}`: {} lowers to `{ptx_form}`, which needs {arch} or newer; the target is {}",
                self.k.name,
                self.op_at(id),
                self.arch
            )));
        }
        let what = format!("{} (`{ptx_form}`)", self.op_at(id));
        self.needs.push(Need { ptx, what });
        Ok(())
    }

    // ---- registers --------------------------------------------------------------------------

    pub(crate) fn fresh(&mut self, class: RegClass) -> Reg {
        self.regs.fresh(class)
    }

    fn def(&mut self, v: Value) -> Result<Vec<Reg>, CodegenError> {
        self.regs.define(v, self.k.ty(v))
    }

    /// The single register of the instruction's only result.
    fn def1(&mut self, results: &[Value]) -> Result<Reg, CodegenError> {
        match results {
            [v] => {
                let regs = self.def(*v)?;
                regs.first().copied().ok_or_else(|| CodegenError::Internal(format!("value {v} has no register")))
            }
            _ => Err(CodegenError::Internal(format!("expected one result, found {}", results.len()))),
        }
    }

    pub(crate) fn one(&self, v: Value) -> Result<Reg, CodegenError> {
        self.regs.one(v)
    }

    fn scalar(&self, v: Value) -> Result<ScalarType, CodegenError> {
        self.k.ty(v).scalar().ok_or_else(|| CodegenError::Internal(format!("value {v} is not a scalar")))
    }

    /// Register-to-register copies of a whole value (all vector lanes).
    fn copy(&mut self, dst: &[Reg], src: &[Reg]) {
        for (d, s) in dst.iter().zip(src) {
            if d != s {
                self.ins(&format!("mov.{}", mov_suffix(d.class)), Ops(&[d, s]));
            }
        }
    }

    // ---- structure --------------------------------------------------------------------------

    /// Load the kernel parameters; global pointers are converted to the global window.
    fn params(&mut self) -> Result<(), CodegenError> {
        let k = self.k;
        for (p, name) in k.params.iter().zip(&self.names.params) {
            match k.ty(p.value) {
                Type::Ptr(AddrSpace::Global, _) => {
                    let generic = self.fresh(RegClass::B64);
                    self.ins("ld.param.u64", format!("{generic}, [{name}]"));
                    let d = self.def1(&[p.value])?;
                    self.ins("cvta.to.global.u64", Ops(&[&d, &generic]));
                }
                Type::Scalar(s) => {
                    let d = self.def1(&[p.value])?;
                    self.ins(&format!("ld.param.{}", mem_type(s)), format!("{d}, [{name}]"));
                }
                other => {
                    return Err(CodegenError::Internal(format!(
                        "parameter `{}` of type {other} passed verification",
                        p.name
                    )))
                }
            }
        }
        Ok(())
    }

    fn region(&mut self, r: RegionId) -> Result<(), CodegenError> {
        for &id in &self.k.region(r).insts {
            self.inst(id)?;
        }
        Ok(())
    }

    fn inst(&mut self, id: InstId) -> Result<(), CodegenError> {
        let k = self.k;
        let inst = k.inst(id);
        if self.addressing.skip.get(id.index()).copied().unwrap_or(false) {
            return Ok(());
        }
        self.loc(inst.loc.as_ref());
        let res = &inst.results;
        match &inst.op {
            Op::Const(c) => {
                let d = self.def1(res)?;
                self.ins(&format!("mov.{}", const_mov_type(c.ty)), format!("{d}, {}", immediate(*c)));
            }
            Op::Special(s) => {
                let d = self.def1(res)?;
                self.ins("mov.u32", format!("{d}, %{}", s.name()));
            }
            Op::Unary(op, a) => self.unary(id, *op, *a, res)?,
            Op::Binary(op, a, b) => self.binary(*op, *a, *b, res)?,
            Op::Fma(a, b, c) => {
                let t = self.scalar(*a)?;
                let (ra, rb, rc) = (self.one(*a)?, self.one(*b)?, self.one(*c)?);
                let d = self.def1(res)?;
                let m = if t.is_float() { format!("fma.rn.{t}") } else { format!("mad.lo.{t}") };
                self.ins(&m, Ops(&[&d, &ra, &rb, &rc]));
            }
            Op::Cmp(op, a, b) => self.cmp(*op, *a, *b, res)?,
            Op::Select(c, a, b) => {
                let (rc, ra, rb) = (self.one(*c)?, self.one(*a)?, self.one(*b)?);
                let d = self.def1(res)?;
                if d.class == RegClass::Pred {
                    self.guarded(rc, false, "mov.pred", Ops(&[&d, &ra]));
                    self.guarded(rc, true, "mov.pred", Ops(&[&d, &rb]));
                } else {
                    self.ins(&format!("selp.{}", mov_suffix(d.class)), Ops(&[&d, &ra, &rb, &rc]));
                }
            }
            Op::Cvt(a, cvt) => {
                let from = self.scalar(*a)?;
                let src = self.one(*a)?;
                let d = self.def1(res)?;
                self.cvt(id, from, *cvt, src, d)?;
            }
            Op::Bitcast(a, _) | Op::PtrCast(a, _) => {
                let s = self.one(*a)?;
                let d = self.def1(res)?;
                self.ins(&format!("mov.{}", d.class.bits_suffix()), Ops(&[&d, &s]));
            }
            Op::PtrAdd(p, i) => self.ptr_add(*p, *i, res)?,
            Op::SharedBase(s) => {
                let name = self.names.shared.get(s.index()).cloned().unwrap_or_default();
                let d = self.def1(res)?;
                self.ins("mov.u32", format!("{d}, {name}"));
            }
            Op::DynSharedBase(_) => {
                let d = self.def1(res)?;
                let name = self.names.dyn_shared.clone();
                self.ins("mov.u32", format!("{d}, {name}"));
            }
            Op::Load { ptr, lanes } => self.load(id, *ptr, *lanes, res)?,
            Op::Store { ptr, value } => self.store(id, *ptr, *value)?,
            Op::Atomic { op, ptr, value, compare } => self.atomic(id, *op, *ptr, *value, *compare, res)?,
            Op::Barrier => self.ins("bar.sync", "0"),
            Op::Shfl { mode, value, lane } => {
                let (a, b) = (self.one(*value)?, self.one(*lane)?);
                let d = self.def1(res)?;
                // c: clamp at lane 31 (segment mask 0) for all modes but `up`, which clamps at 0.
                let c = if *mode == ShflMode::Up { "0" } else { "0x1f" };
                self.ins(&format!("shfl.sync.{mode}.b32"), format!("{d}, {a}, {b}, {c}, 0xffffffff"));
            }
            Op::Vote { mode, pred } => {
                let p = self.one(*pred)?;
                let d = self.def1(res)?;
                let ty = if *mode == VoteMode::Ballot { "b32" } else { "pred" };
                self.ins(&format!("vote.sync.{mode}.{ty}"), format!("{d}, {p}, 0xffffffff"));
            }
            Op::Mma { ty, a, b, c } => {
                let form = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32");
                self.require(id, &form, Arch::Sm80, PtxVersion::new(7, 0))?;
                let (ra, rb, rc) = (self.regs.of(*a)?.to_vec(), self.regs.of(*b)?.to_vec(), self.regs.of(*c)?.to_vec());
                let [v] = res.as_slice() else {
                    return Err(CodegenError::Internal("`mma` defines one value".into()));
                };
                let d = self.def(*v)?;
                self.ins(&form, format!("{}, {}, {}, {}", RegList(&d), RegList(&ra), RegList(&rb), RegList(&rc)));
            }
            Op::LdMatrix { ptr, count, trans } => {
                let trans = if *trans { ".trans" } else { "" };
                let form = format!("ldmatrix.sync.aligned.m8n8.x{count}{trans}.shared.b16");
                self.require(id, &form, Arch::Sm80, PtxVersion::new(6, 5))?;
                let p = self.one(*ptr)?;
                let [v] = res.as_slice() else {
                    return Err(CodegenError::Internal("`ldmatrix` defines one value".into()));
                };
                let d = self.def(*v)?;
                self.ins(&form, format!("{}, [{p}]", RegList(&d)));
            }
            Op::CpAsync { dst, src, size, src_size } => {
                // `.cg` (L2 only) exists for 16-byte copies alone; smaller ones go through L1.
                let cache = if *size == 16 { "cg" } else { "ca" };
                let form = format!("cp.async.{cache}.shared.global");
                self.require(id, &form, Arch::Sm80, PtxVersion::new(7, 0))?;
                let (d, s) = (self.one(*dst)?, self.one(*src)?);
                match src_size {
                    Some(n) => {
                        let n = self.one(*n)?;
                        self.ins(&form, format!("[{d}], [{s}], {size}, {n}"));
                    }
                    None => self.ins(&form, format!("[{d}], [{s}], {size}")),
                }
            }
            Op::CpAsyncCommit => {
                self.require(id, "cp.async.commit_group", Arch::Sm80, PtxVersion::new(7, 0))?;
                self.ins("cp.async.commit_group", "");
            }
            Op::CpAsyncWait(n) => {
                self.require(id, "cp.async.wait_group", Arch::Sm80, PtxVersion::new(7, 0))?;
                self.ins("cp.async.wait_group", n.to_string());
            }
            Op::Extract(v, lane) => {
                let src = self.regs.of(*v)?.get(*lane as usize).copied();
                let src = src.ok_or_else(|| CodegenError::Internal(format!("lane {lane} of {v} out of range")))?;
                let d = self.def1(res)?;
                self.copy(&[d], &[src]);
            }
            Op::MakeVector(elems) => {
                let srcs = elems.iter().map(|e| self.one(*e)).collect::<Result<Vec<_>, _>>()?;
                let [v] = res.as_slice() else {
                    return Err(CodegenError::Internal("`vector` defines one value".into()));
                };
                let d = self.def(*v)?;
                self.copy(&d, &srcs);
            }
            Op::If { cond, then_region, else_region } => {
                self.if_(id, *cond, *then_region, *else_region, res)?;
            }
            Op::For { start, end, step, init, body } => {
                self.for_(id, [*start, *end, *step], init, *body, res)?;
            }
        }
        Ok(())
    }

    fn yields_into(&mut self, r: RegionId, results: &[Vec<Reg>]) -> Result<(), CodegenError> {
        for (y, dst) in self.k.region(r).yields.iter().zip(results) {
            let src = self.regs.of(*y)?.to_vec();
            self.copy(dst, &src);
        }
        Ok(())
    }

    fn if_(
        &mut self,
        id: InstId,
        cond: Value,
        then_r: RegionId,
        else_r: RegionId,
        res: &[Value],
    ) -> Result<(), CodegenError> {
        let k = self.k;
        let loc = k.inst(id).loc.as_ref();
        let results = res.iter().map(|v| self.def(*v)).collect::<Result<Vec<_>, _>>()?;
        let p = self.one(cond)?;
        let bra = if self.uniform[cond.index()] { "bra.uni" } else { "bra" };
        let n = self.next_label();
        let (else_label, end_label) = (format!("$L_if{n}_else"), format!("$L_if{n}_end"));
        let has_else = !k.region(else_r).insts.is_empty() || !k.region(else_r).yields.is_empty();
        let skip_to = if has_else { &else_label } else { &end_label };
        self.guarded(p, true, bra, skip_to);
        self.region(then_r)?;
        self.loc(loc);
        self.yields_into(then_r, &results)?;
        if has_else {
            self.ins("bra.uni", &end_label);
            self.label(&else_label);
            self.region(else_r)?;
            self.loc(loc);
            self.yields_into(else_r, &results)?;
        }
        self.label(&end_label);
        Ok(())
    }

    fn for_(
        &mut self,
        id: InstId,
        [start, end, step]: [Value; 3],
        init: &[Value],
        body: RegionId,
        res: &[Value],
    ) -> Result<(), CodegenError> {
        let k = self.k;
        let loc = k.inst(id).loc.as_ref();
        let region = k.region(body);
        let [iv, carried @ ..] = region.params.as_slice() else {
            return Err(CodegenError::Internal("a loop body without an induction variable".into()));
        };
        let t = self.scalar(start)?;
        let (rs, re, rstep) = (self.one(start)?, self.one(end)?, self.one(step)?);
        let riv = self.def1(&[*iv])?;
        let rcarried = carried.iter().map(|v| self.def(*v)).collect::<Result<Vec<_>, _>>()?;
        self.copy(&[riv], &[rs]);
        for (dst, v) in rcarried.iter().zip(init) {
            let src = self.regs.of(*v)?.to_vec();
            self.copy(dst, &src);
        }
        let n = self.next_label();
        let (head, exit) = (format!("$L_for{n}_head"), format!("$L_for{n}_end"));
        let p = self.fresh(RegClass::Pred);
        let bra = if self.uniform[iv.index()] && self.uniform[end.index()] { "bra.uni" } else { "bra" };
        self.label(&head);
        self.ins(&format!("setp.lt.{t}"), Ops(&[&p, &riv, &re]));
        self.guarded(p, true, bra, &exit);
        self.region(body)?;
        self.loc(loc);
        // The next carried values, as a parallel copy: a yield that is another carried value
        // of this loop goes through a temporary so that no source is overwritten before use.
        let mut sources = Vec::with_capacity(carried.len());
        for (i, y) in region.yields.iter().enumerate() {
            let src = self.regs.of(*y)?.to_vec();
            let clobbered = carried.iter().enumerate().any(|(j, c)| j != i && c == y);
            if clobbered {
                let tmp: Vec<Reg> = src.iter().map(|r| self.fresh(r.class)).collect();
                self.copy(&tmp, &src);
                sources.push(tmp);
            } else {
                sources.push(src);
            }
        }
        for (dst, src) in rcarried.iter().zip(&sources) {
            self.copy(dst, src);
        }
        self.ins(&format!("add.{t}"), Ops(&[&riv, &riv, &rstep]));
        self.ins("bra.uni", &head);
        self.label(&exit);
        for (v, src) in res.iter().zip(&rcarried) {
            let dst = self.def(*v)?;
            self.copy(&dst, src);
        }
        Ok(())
    }

    // ---- arithmetic -------------------------------------------------------------------------

    fn unary(&mut self, id: InstId, op: UnaryOp, a: Value, res: &[Value]) -> Result<(), CodegenError> {
        let t = self.scalar(a)?;
        let s = self.one(a)?;
        let d = self.def1(res)?;
        let m = match op {
            UnaryOp::Neg => format!("neg.{t}"),
            UnaryOp::Abs => format!("abs.{t}"),
            UnaryOp::Not => format!("not.{}", d.class.bits_suffix()),
            UnaryOp::Popc | UnaryOp::Clz => {
                // PTX counts into a 32-bit register; the IR result has the operand's type.
                let m = format!("{op}.b{}", t.bits());
                if t.bits() == 64 {
                    let tmp = self.fresh(RegClass::B32);
                    self.ins(&m, Ops(&[&tmp, &s]));
                    self.ins("cvt.u64.u32", Ops(&[&d, &tmp]));
                } else {
                    self.ins(&m, Ops(&[&d, &s]));
                }
                return Ok(());
            }
            UnaryOp::Sqrt => format!("sqrt.rn.{t}"),
            UnaryOp::Rcp => format!("rcp.rn.{t}"),
            UnaryOp::Rsqrt => "rsqrt.approx.f32".into(),
            UnaryOp::Ex2 => "ex2.approx.f32".into(),
            UnaryOp::Lg2 => "lg2.approx.f32".into(),
            UnaryOp::Sin => "sin.approx.f32".into(),
            UnaryOp::Cos => "cos.approx.f32".into(),
            UnaryOp::Tanh => {
                self.require(id, "tanh.approx.f32", Arch::Sm80, PtxVersion::new(7, 0))?;
                "tanh.approx.f32".into()
            }
        };
        self.ins(&m, Ops(&[&d, &s]));
        Ok(())
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value, res: &[Value]) -> Result<(), CodegenError> {
        let t = self.scalar(a)?;
        let (ra, rb) = (self.one(a)?, self.one(b)?);
        let d = self.def1(res)?;
        let float = t.is_float();
        let m = match op {
            BinaryOp::Add | BinaryOp::Sub if float => format!("{op}.rn.{t}"),
            BinaryOp::Add | BinaryOp::Sub => format!("{op}.{t}"),
            BinaryOp::Mul if float => format!("mul.rn.{t}"),
            BinaryOp::Mul => format!("mul.lo.{t}"),
            BinaryOp::MulHi => format!("mul.hi.{t}"),
            BinaryOp::Div if float => format!("div.rn.{t}"),
            BinaryOp::Div | BinaryOp::Rem | BinaryOp::Min | BinaryOp::Max => format!("{op}.{t}"),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => format!("{op}.{}", d.class.bits_suffix()),
            BinaryOp::Shl => format!("shl.b{}", t.bits()),
            BinaryOp::Shr => format!("shr.{t}"),
        };
        self.ins(&m, Ops(&[&d, &ra, &rb]));
        Ok(())
    }

    fn cmp(&mut self, op: CmpOp, a: Value, b: Value, res: &[Value]) -> Result<(), CodegenError> {
        let t = self.scalar(a)?;
        let (ra, rb) = (self.one(a)?, self.one(b)?);
        let d = self.def1(res)?;
        if t == ScalarType::Pred {
            // Predicates: `ne` is xor, `eq` its negation (the verifier allows no other compare).
            if op == CmpOp::Eq {
                let x = self.fresh(RegClass::Pred);
                self.ins("xor.pred", Ops(&[&x, &ra, &rb]));
                self.ins("not.pred", Ops(&[&d, &x]));
            } else {
                self.ins("xor.pred", Ops(&[&d, &ra, &rb]));
            }
            return Ok(());
        }
        self.ins(&format!("setp.{op}.{t}"), Ops(&[&d, &ra, &rb]));
        Ok(())
    }

    // ---- memory -----------------------------------------------------------------------------

    fn ptr_add(&mut self, p: Value, i: Value, res: &[Value]) -> Result<(), CodegenError> {
        let Type::Ptr(space, elem) = self.k.ty(p) else {
            return Err(CodegenError::Internal(format!("ptradd of non-pointer {p}")));
        };
        let it = self.scalar(i)?;
        let (rp, ri) = (self.one(p)?, self.one(i)?);
        let d = self.def1(res)?;
        let size = elem.bytes();
        let shift = size.trailing_zeros();
        if space.pointer_bits() == 64 {
            let offset = match (it.bits(), size) {
                (64, 1) => ri,
                (64, _) => {
                    let t = self.fresh(RegClass::B64);
                    self.ins("shl.b64", format!("{t}, {ri}, {shift}"));
                    t
                }
                (_, 1) => {
                    let t = self.fresh(RegClass::B64);
                    let ext = if it.is_signed_int() { "cvt.s64.s32" } else { "cvt.u64.u32" };
                    self.ins(ext, Ops(&[&t, &ri]));
                    t
                }
                _ => {
                    let t = self.fresh(RegClass::B64);
                    let wide = if it.is_signed_int() { "mul.wide.s32" } else { "mul.wide.u32" };
                    self.ins(wide, format!("{t}, {ri}, {size}"));
                    t
                }
            };
            self.ins("add.s64", Ops(&[&d, &rp, &offset]));
        } else {
            // 32-bit windows (shared): addresses wrap at 32 bits, so a 64-bit index truncates.
            let index = if it.bits() == 64 {
                let t = self.fresh(RegClass::B32);
                self.ins("cvt.u32.u64", Ops(&[&t, &ri]));
                t
            } else {
                ri
            };
            let offset = if size == 1 {
                index
            } else {
                let t = self.fresh(RegClass::B32);
                self.ins("shl.b32", format!("{t}, {index}, {shift}"));
                t
            };
            self.ins("add.s32", Ops(&[&d, &rp, &offset]));
        }
        Ok(())
    }

    /// The space, element type and address of memory instruction `id` accessing `ptr`.
    fn mem_ptr(&self, id: InstId, ptr: Value) -> Result<(AddrSpace, ScalarType, Address), CodegenError> {
        let Type::Ptr(space, elem) = self.k.ty(ptr) else {
            return Err(CodegenError::Internal(format!("memory access through {}", self.k.ty(ptr))));
        };
        let narrow = space.pointer_bits() == 32;
        let address = match self.addressing.folded.get(id.index()).copied().flatten() {
            Some((q, offset)) => Address { reg: self.one(q)?, offset, narrow },
            None => Address { reg: self.one(ptr)?, offset: 0, narrow },
        };
        Ok((space, elem, address))
    }

    /// Split a vector access into pieces of at most 16 bytes (PTX has no `.v4` of 64-bit
    /// elements on these targets): `(first lane, lanes, byte offset)`.
    fn pieces(elem: ScalarType, lanes: usize) -> Vec<(usize, usize, u32)> {
        if lanes as u32 * elem.bytes() <= 16 {
            vec![(0, lanes, 0)]
        } else {
            let half = lanes / 2;
            vec![(0, half, 0), (half, half, half as u32 * elem.bytes())]
        }
    }

    fn load(&mut self, id: InstId, ptr: Value, lanes: u8, res: &[Value]) -> Result<(), CodegenError> {
        let (space, elem, a) = self.mem_ptr(id, ptr)?;
        let [v] = res else { return Err(CodegenError::Internal("`load` defines one value".into())) };
        let d = self.def(*v)?;
        let ty = mem_type(elem);
        if lanes == 1 {
            self.ins(&format!("ld.{space}.{ty}"), format!("{}, {}", d[0], a.at(0)));
            return Ok(());
        }
        for (first, n, offset) in Self::pieces(elem, d.len()) {
            let regs = RegList(&d[first..first + n]);
            self.ins(&format!("ld.{space}.v{n}.{ty}"), format!("{regs}, {}", a.at(offset)));
        }
        Ok(())
    }

    fn store(&mut self, id: InstId, ptr: Value, value: Value) -> Result<(), CodegenError> {
        let (space, elem, a) = self.mem_ptr(id, ptr)?;
        let s = self.regs.of(value)?.to_vec();
        let ty = mem_type(elem);
        if let [one] = s.as_slice() {
            self.ins(&format!("st.{space}.{ty}"), format!("{}, {one}", a.at(0)));
            return Ok(());
        }
        for (first, n, offset) in Self::pieces(elem, s.len()) {
            let regs = RegList(&s[first..first + n]);
            self.ins(&format!("st.{space}.v{n}.{ty}"), format!("{}, {regs}", a.at(offset)));
        }
        Ok(())
    }

    fn atomic(
        &mut self,
        id: InstId,
        op: AtomicOp,
        ptr: Value,
        value: Value,
        compare: Option<Value>,
        res: &[Value],
    ) -> Result<(), CodegenError> {
        let (space, elem, a) = self.mem_ptr(id, ptr)?;
        let b = self.one(value)?;
        let a = a.at(0);
        let d = self.def1(res)?;
        let ty = match op {
            AtomicOp::Add | AtomicOp::Min | AtomicOp::Max => elem.name().to_string(),
            AtomicOp::Exch | AtomicOp::Cas => format!("b{}", elem.bits()),
        };
        let m = format!("atom.{space}.{op}.{ty}");
        match compare {
            // PTX: `atom.cas d, [a], b, c` stores c where the old value equals b.
            Some(c) => {
                let c = self.one(c)?;
                self.ins(&m, format!("{d}, {a}, {c}, {b}"));
            }
            None => self.ins(&m, format!("{d}, {a}, {b}")),
        }
        Ok(())
    }
}

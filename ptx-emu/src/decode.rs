//! Syntax tree to executable program: registers and symbols resolved, memory laid out,
//! mnemonics and their modifiers given meaning. A mnemonic or modifier this emulator does not
//! model is an `unsupported` error naming the line, never a silent skip.

use std::collections::HashMap;

use crate::num::{Approx, Fmt, IntFmt, Rounding};
use crate::parse::{AddrBase, Function, Imm, Inst as PInst, Module, Operand, RegDecl, Stmt, VarDecl};
use crate::program::*;

/// Generic addresses of the shared and local windows; global buffers sit far below
/// (`(i + 1) << 40`, as in the interpreter).
pub(crate) const SHARED_WINDOW: u64 = 0x8000_0000_0000_0000;
pub(crate) const LOCAL_WINDOW: u64 = 0xC000_0000_0000_0000;
/// The buffer index of the first module-level `.global`/`.const` variable.
pub(crate) const MODULE_VAR_INDEX: u64 = 1 << 20;
/// Limits that keep absurd declarations from exhausting host memory: per-thread registers
/// (slots), local bytes per thread (CUDA's limit), parameter bytes (PTX's), and module-level
/// variables.
const MAX_SLOTS: u32 = 1 << 20;
const MAX_LOCAL_BYTES: u64 = 512 * 1024;
const MAX_PARAM_BYTES: u32 = 32764;
const MAX_MODULE_VAR_BYTES: u64 = 256 << 20;
/// Dynamic shared memory starts at a multiple of this.
const DYN_ALIGN: u32 = ruda_ir::DYNAMIC_SHARED_ALIGN;

/// Why a module could not be decoded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DecodeError {
    pub(crate) line: u32,
    pub(crate) message: String,
    /// A construct outside the modelled subset (as opposed to malformed text).
    pub(crate) unsupported: bool,
}

type DResult<T> = Result<T, DecodeError>;

fn malformed<T>(line: u32, message: impl Into<String>) -> DResult<T> {
    Err(DecodeError { line, message: message.into(), unsupported: false })
}

fn unsupported<T>(line: u32, message: impl Into<String>) -> DResult<T> {
    Err(DecodeError { line, message: message.into(), unsupported: true })
}

/// A PTX type suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PType {
    B(u32),
    U(u32),
    S(u32),
    F16,
    BF16,
    F16x2,
    BF16x2,
    F32,
    F64,
    Pred,
}

impl PType {
    pub(crate) fn parse(s: &str) -> Option<PType> {
        Some(match s {
            "b8" => PType::B(8),
            "b16" => PType::B(16),
            "b32" => PType::B(32),
            "b64" => PType::B(64),
            "u8" => PType::U(8),
            "u16" => PType::U(16),
            "u32" => PType::U(32),
            "u64" => PType::U(64),
            "s8" => PType::S(8),
            "s16" => PType::S(16),
            "s32" => PType::S(32),
            "s64" => PType::S(64),
            "f16" => PType::F16,
            "bf16" => PType::BF16,
            "f16x2" => PType::F16x2,
            "bf16x2" => PType::BF16x2,
            "f32" => PType::F32,
            "f64" => PType::F64,
            "pred" => PType::Pred,
            _ => return None,
        })
    }

    /// Type names this decoder does not model but recognises as types.
    fn is_other_type(s: &str) -> bool {
        matches!(
            s,
            "b128"
                | "tf32"
                | "e4m3"
                | "e5m2"
                | "e4m3x2"
                | "e5m2x2"
                | "e2m1x2"
                | "e2m3x2"
                | "e3m2x2"
                | "ue8m0x2"
                | "s4"
                | "u4"
                | "b1"
        )
    }

    pub(crate) fn bits(self) -> u32 {
        match self {
            PType::B(n) | PType::U(n) | PType::S(n) => n,
            PType::F16 | PType::BF16 => 16,
            PType::F16x2 | PType::BF16x2 | PType::F32 => 32,
            PType::F64 => 64,
            PType::Pred => 1,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, PType::F16 | PType::BF16 | PType::F16x2 | PType::BF16x2 | PType::F32 | PType::F64)
    }

    /// The integer view: `.s` types signed, `.b`/`.u` unsigned, `.pred` one bit.
    fn int(self) -> Option<IntFmt> {
        match self {
            PType::B(n) | PType::U(n) => Some(IntFmt { bits: n, signed: false }),
            PType::S(n) => Some(IntFmt { bits: n, signed: true }),
            PType::Pred => Some(IntFmt { bits: 1, signed: false }),
            _ => None,
        }
    }

    /// How a result of this type is written to a (possibly wider) register.
    fn write(self) -> IntFmt {
        match self {
            PType::S(n) => IntFmt { bits: n, signed: true },
            other => IntFmt { bits: other.bits(), signed: false },
        }
    }

    fn fmt(self) -> Option<Fmt> {
        match self {
            PType::F16 => Some(Fmt::F16),
            PType::BF16 => Some(Fmt::BF16),
            PType::F32 => Some(Fmt::F32),
            PType::F64 => Some(Fmt::F64),
            _ => None,
        }
    }

    fn fty(self) -> Option<FTy> {
        match self {
            PType::F32 => Some(FTy::F32),
            PType::F64 => Some(FTy::F64),
            _ => None,
        }
    }
}

const U32: PType = PType::U(32);

/// The modifiers of a mnemonic, consumed as the decoder recognises them; whatever is left
/// over makes the instruction unsupported.
struct Mods<'a> {
    parts: Vec<&'a str>,
    used: Vec<bool>,
}

impl<'a> Mods<'a> {
    fn new(parts: &[&'a str]) -> Mods<'a> {
        Mods { parts: parts.to_vec(), used: vec![false; parts.len()] }
    }

    fn has(&mut self, m: &str) -> bool {
        match self.parts.iter().enumerate().position(|(i, p)| *p == m && !self.used[i]) {
            Some(i) => {
                self.used[i] = true;
                true
            }
            None => false,
        }
    }

    fn one_of(&mut self, options: &[&'static str]) -> Option<&'static str> {
        options.iter().copied().find(|o| self.has(o))
    }

    /// Mark every modifier `ignorable` accepts as used (hints without semantic effect here).
    fn drop_all(&mut self, ignorable: impl Fn(&str) -> bool) {
        for (i, p) in self.parts.iter().enumerate() {
            if ignorable(p) {
                self.used[i] = true;
            }
        }
    }

    /// The type suffixes, in order.
    fn types(&mut self) -> Vec<PType> {
        let mut out = vec![];
        for (i, p) in self.parts.iter().enumerate() {
            if self.used[i] {
                continue;
            }
            if let Some(t) = PType::parse(p) {
                self.used[i] = true;
                out.push(t);
            }
        }
        out
    }

    fn leftover(&self) -> Vec<&'a str> {
        self.parts.iter().zip(&self.used).filter(|(_, u)| !**u).map(|(p, _)| *p).collect()
    }
}

/// A symbol's value: its address in its window.
#[derive(Clone, Copy, Debug)]
enum Sym {
    Shared(u64),
    Local(u64),
    Param(u64),
    Global(u64),
}

impl Sym {
    fn address(self) -> u64 {
        match self {
            Sym::Shared(a) | Sym::Local(a) | Sym::Param(a) | Sym::Global(a) => a,
        }
    }
}

fn ptx_type_bytes(ty: &str, line: u32) -> DResult<u32> {
    match PType::parse(ty) {
        Some(PType::Pred) | None => match ty {
            "b128" => Ok(16),
            _ => malformed(line, format!("`.{ty}` is not a memory type")),
        },
        Some(t) => Ok(t.bits() / 8),
    }
}

/// Literal bytes of an initializer, `count` elements of `ty`.
fn init_bytes(v: &VarDecl, elem: u32) -> DResult<Vec<u8>> {
    let mut out = vec![];
    let t = PType::parse(&v.ty);
    for imm in &v.init {
        let bits = match (imm, t) {
            (Imm::Int(x), _) => *x as u64,
            (Imm::F32(b), _) => *b as u64,
            (Imm::F64(b), _) => *b,
            (Imm::Float(x), Some(PType::F32)) => (*x as f32).to_bits() as u64,
            (Imm::Float(x), _) => x.to_bits(),
        };
        out.extend_from_slice(&bits.to_le_bytes()[..elem as usize]);
    }
    Ok(out)
}

/// Decode every entry of a parsed module.
pub(crate) fn decode(m: &Module) -> DResult<(Vec<Program>, Vec<ModuleVar>)> {
    if let Some(bits) = m.address_size {
        if bits != 64 {
            return unsupported(1, format!(".address_size {bits}: only 64-bit addressing is modelled"));
        }
    }
    // Module-level `.global`/`.const` variables are buffers of their own.
    let mut module_syms: HashMap<String, Sym> = HashMap::new();
    let mut vars = vec![];
    for v in &m.vars {
        if v.space == "global" || v.space == "const" {
            let elem = ptx_type_bytes(&v.ty, v.line)? * v.vector;
            let count = match v.len {
                None => 1,
                Some(Some(n)) => n,
                Some(None) => v.init.len() as u64,
            };
            let bytes = (elem as u64).saturating_mul(count);
            if bytes > MAX_MODULE_VAR_BYTES {
                return unsupported(
                    v.line,
                    format!("`{}` has {bytes} bytes; at most {MAX_MODULE_VAR_BYTES} are modelled", v.name),
                );
            }
            let mut init = init_bytes(v, elem)?;
            init.resize((elem as u64 * count) as usize, 0);
            let address = (MODULE_VAR_INDEX + vars.len() as u64 + 1) << 40;
            module_syms.insert(v.name.clone(), Sym::Global(address));
            vars.push(ModuleVar { init });
        }
    }
    let mut entries = vec![];
    for f in &m.functions {
        if !f.is_entry {
            continue;
        }
        let Some(body) = &f.body else { continue };
        entries.push(Decoder::new(m, f, &module_syms).run(body)?);
    }
    Ok((entries, vars))
}

struct Decoder<'m> {
    module: &'m Module,
    f: &'m Function,
    scopes: Vec<HashMap<String, R>>,
    scope_ids: Vec<u32>,
    next_scope: u32,
    slots: u32,
    consts: HashMap<u64, R>,
    const_list: Vec<(R, u64)>,
    specials: HashMap<String, R>,
    special_list: Vec<(R, Special)>,
    syms: HashMap<String, Sym>,
    labels: HashMap<(u32, String), u32>,
    fixups: Vec<(usize, String, Vec<u32>, u32)>,
    code: Vec<Inst>,
    one: R,
    scratch: R,
    cc: R,
    params: Vec<ParamSlot>,
    param_bytes: u32,
    local_bytes: u32,
    static_shared: u32,
    dyn_offset: u32,
    // The current instruction's guard and line.
    guard: (R, bool),
    line: u32,
}

impl<'m> Decoder<'m> {
    fn new(m: &'m Module, f: &'m Function, module_syms: &HashMap<String, Sym>) -> Decoder<'m> {
        let mut d = Decoder {
            module: m,
            f,
            scopes: vec![HashMap::new()],
            scope_ids: vec![0],
            next_scope: 1,
            slots: 0,
            consts: HashMap::new(),
            const_list: vec![],
            specials: HashMap::new(),
            special_list: vec![],
            syms: module_syms.clone(),
            labels: HashMap::new(),
            fixups: vec![],
            code: vec![],
            one: 0,
            scratch: 0,
            cc: 0,
            params: vec![],
            param_bytes: 0,
            local_bytes: 0,
            static_shared: 0,
            dyn_offset: 0,
            guard: (0, false),
            line: f.line,
        };
        d.one = d.konst(1);
        d.scratch = d.slot();
        d.cc = d.slot();
        d
    }

    fn slot(&mut self) -> R {
        self.slots += 1;
        self.slots - 1
    }

    fn konst(&mut self, v: u64) -> R {
        if let Some(&r) = self.consts.get(&v) {
            return r;
        }
        let r = self.slot();
        self.consts.insert(v, r);
        self.const_list.push((r, v));
        r
    }

    /// Shared variables of the module, then of the function, in declaration order, each at
    /// its alignment; the dynamic window (every `.extern .shared` array) after them, at the
    /// interpreter's alignment. Local variables and parameters likewise.
    fn layout(&mut self, m_vars: &[VarDecl], body: &[Stmt]) -> DResult<()> {
        let mut offset = 0u64;
        let mut externs = vec![];
        let fn_vars = body.iter().filter_map(|s| if let Stmt::Var(v) = s { Some(v) } else { None });
        let mut local = 0u64;
        for v in m_vars.iter().filter(|v| v.space == "shared").chain(fn_vars) {
            let elem = ptx_type_bytes(&v.ty, v.line)? * v.vector;
            let align = v.align.unwrap_or(elem).max(1) as u64;
            if !align.is_power_of_two() {
                return malformed(v.line, format!("alignment {align} of `{}` is not a power of two", v.name));
            }
            let count = match v.len {
                None => 1,
                Some(Some(n)) => n,
                Some(None) => {
                    if v.space == "shared" && v.is_extern {
                        externs.push(v.name.clone());
                        continue;
                    }
                    v.init.len() as u64
                }
            };
            let bytes = (elem as u64).saturating_mul(count);
            match v.space.as_str() {
                "shared" => {
                    if v.is_extern {
                        externs.push(v.name.clone());
                        continue;
                    }
                    offset = offset.saturating_add(align - 1) / align * align;
                    self.syms.insert(v.name.clone(), Sym::Shared(offset));
                    offset = offset.saturating_add(bytes);
                }
                "local" => {
                    local = local.saturating_add(align - 1) / align * align;
                    self.syms.insert(v.name.clone(), Sym::Local(local));
                    local = local.saturating_add(bytes);
                }
                "global" | "const" => {
                    return unsupported(v.line, format!("function-scope .{} variable `{}`", v.space, v.name))
                }
                other => return unsupported(v.line, format!("a .{other} variable inside a function")),
            }
        }
        if offset > u32::MAX as u64 {
            return malformed(self.f.line, "shared memory exceeds 4 GiB");
        }
        if local > MAX_LOCAL_BYTES {
            return unsupported(
                self.f.line,
                format!("{local} bytes of local memory per thread (at most {MAX_LOCAL_BYTES})"),
            );
        }
        self.static_shared = offset as u32;
        self.dyn_offset = (offset as u32).next_multiple_of(DYN_ALIGN);
        for name in externs {
            self.syms.insert(name, Sym::Shared(self.dyn_offset as u64));
        }
        self.local_bytes = local as u32;
        let mut p = 0u64;
        for decl in &self.f.params {
            let elem = ptx_type_bytes(&decl.ty, decl.line)?;
            let size = (elem as u64).saturating_mul(decl.len.unwrap_or(1));
            let align = decl.align.unwrap_or(elem).max(1) as u64;
            p = p.next_multiple_of(align);
            if p.saturating_add(size) > MAX_PARAM_BYTES as u64 {
                return unsupported(decl.line, format!("parameters beyond {MAX_PARAM_BYTES} bytes"));
            }
            self.syms.insert(decl.name.clone(), Sym::Param(p));
            self.params.push(ParamSlot {
                name: decl.name.clone(),
                ty: decl.ty.clone(),
                offset: p as u32,
                size: size as u32,
            });
            p += size;
        }
        let p = p as u32;
        if p > MAX_PARAM_BYTES {
            return unsupported(self.f.line, format!("{p} bytes of parameters (at most {MAX_PARAM_BYTES})"));
        }
        self.param_bytes = p;
        Ok(())
    }

    fn run(mut self, body: &[Stmt]) -> DResult<Program> {
        let module = self.module;
        self.layout(&module.vars, body)?;
        for stmt in body {
            match stmt {
                Stmt::Reg { ty, vector, regs, line } => {
                    self.line = *line;
                    if *vector {
                        return unsupported(*line, "vector registers (`.reg .v2`/`.v4`)");
                    }
                    if PType::parse(ty).is_none() {
                        return unsupported(*line, format!("registers of type .{ty}"));
                    }
                    for decl in regs {
                        let count = match decl {
                            RegDecl::Range(_, n) => *n,
                            RegDecl::One(_) => 1,
                        };
                        if self.slots.saturating_add(count) > MAX_SLOTS {
                            return unsupported(*line, format!("more than {MAX_SLOTS} registers"));
                        }
                        match decl {
                            RegDecl::Range(prefix, n) => {
                                for i in 0..*n {
                                    let r = self.slot();
                                    self.scope().insert(format!("{prefix}{i}"), r);
                                }
                            }
                            RegDecl::One(name) => {
                                let r = self.slot();
                                self.scope().insert(name.clone(), r);
                            }
                        }
                    }
                }
                Stmt::Var(_) => {}
                Stmt::Label(name, line) => {
                    let key = (*self.scope_ids.last().unwrap_or(&0), name.clone());
                    if self.labels.insert(key, self.code.len() as u32).is_some() {
                        return malformed(*line, format!("label `{name}` is defined twice"));
                    }
                }
                Stmt::Open => {
                    self.scopes.push(HashMap::new());
                    self.scope_ids.push(self.next_scope);
                    self.next_scope += 1;
                }
                Stmt::Close => {
                    self.scopes.pop();
                    self.scope_ids.pop();
                }
                Stmt::Inst(i) => {
                    self.line = i.line;
                    self.inst(i)?;
                }
            }
        }
        // A body that runs off its end exits.
        self.guard = (self.one, false);
        self.emit(Op::Exit);
        for (at, label, chain, line) in std::mem::take(&mut self.fixups) {
            let target = chain.iter().rev().find_map(|s| self.labels.get(&(*s, label.clone())).copied());
            match target {
                Some(t) => {
                    if let Op::Bra { target } = &mut self.code[at].op {
                        *target = t;
                    }
                }
                None => return malformed(line, format!("branch to undefined label `{label}`")),
            }
        }
        let mut template = vec![0u64; self.slots as usize];
        for (r, v) in &self.const_list {
            template[*r as usize] = *v;
        }
        Ok(Program {
            name: self.f.name.clone(),
            code: self.code,
            template,
            specials: self.special_list,
            params: self.params,
            param_bytes: self.param_bytes,
            local_bytes: self.local_bytes,
            static_shared: self.static_shared,
            dyn_offset: self.dyn_offset,
            maxntid: self.f.maxntid,
            reqntid: self.f.reqntid,
        })
    }

    fn scope(&mut self) -> &mut HashMap<String, R> {
        self.scopes.last_mut().expect("the function scope is never popped")
    }

    fn emit(&mut self, op: Op) {
        self.code.push(Inst { op, guard: self.guard.0, neg: self.guard.1, line: self.line });
    }

    fn err<T>(&self, message: impl Into<String>) -> DResult<T> {
        malformed(self.line, message)
    }

    fn unsup<T>(&self, message: impl Into<String>) -> DResult<T> {
        unsupported(self.line, message)
    }

    // ---- operands -------------------------------------------------------------------------

    fn special(&mut self, name: &str) -> DResult<Option<R>> {
        let dim = |s: &str| match s {
            "x" => Some(0u8),
            "y" => Some(1),
            "z" => Some(2),
            _ => None,
        };
        let sp = match name.split_once('.') {
            Some(("%tid", c)) => dim(c).map(Special::Tid),
            Some(("%ntid", c)) => dim(c).map(Special::Ntid),
            Some(("%ctaid", c)) => dim(c).map(Special::Ctaid),
            Some(("%nctaid", c)) => dim(c).map(Special::Nctaid),
            Some(_) => None,
            None => match name {
                "%laneid" => Some(Special::LaneId),
                "%warpid" => Some(Special::WarpId),
                "%nwarpid" => Some(Special::NWarpId),
                "%lanemask_eq" => Some(Special::LaneMaskEq),
                "%lanemask_le" => Some(Special::LaneMaskLe),
                "%lanemask_lt" => Some(Special::LaneMaskLt),
                "%lanemask_ge" => Some(Special::LaneMaskGe),
                "%lanemask_gt" => Some(Special::LaneMaskGt),
                "%dynamic_smem_size" => Some(Special::DynamicSmemSize),
                "%total_smem_size" => Some(Special::TotalSmemSize),
                _ => None,
            },
        };
        let Some(sp) = sp else { return Ok(None) };
        if let Some(&r) = self.specials.get(name) {
            return Ok(Some(r));
        }
        let r = self.slot();
        self.specials.insert(name.to_string(), r);
        self.special_list.push((r, sp));
        Ok(Some(r))
    }

    fn reg(&mut self, name: &str) -> DResult<R> {
        if let Some(r) = self.scopes.iter().rev().find_map(|s| s.get(name).copied()) {
            return Ok(r);
        }
        if let Some(r) = self.special(name)? {
            return Ok(r);
        }
        let known_special =
            ["%tid", "%ntid", "%ctaid", "%nctaid", "%clock", "%clock64", "%globaltimer", "%smid", "%nsmid", "%gridid"];
        if known_special.iter().any(|s| name.starts_with(s)) || name.starts_with("%envreg") || name.starts_with("%pm") {
            return self.unsup(format!("special register `{name}`"));
        }
        self.err(format!("undeclared register `{name}`"))
    }

    fn imm_bits(&self, imm: Imm, t: PType) -> DResult<u64> {
        let v = match t {
            PType::F32 => match imm {
                Imm::Int(v) => (v as f32).to_bits() as u64,
                Imm::F32(b) => b as u64,
                Imm::F64(b) => (f64::from_bits(b) as f32).to_bits() as u64,
                Imm::Float(x) => (x as f32).to_bits() as u64,
            },
            PType::F64 => match imm {
                Imm::Int(v) => (v as f64).to_bits(),
                Imm::F32(b) => (f32::from_bits(b) as f64).to_bits(),
                Imm::F64(b) => b,
                Imm::Float(x) => x.to_bits(),
            },
            _ => match imm {
                Imm::Int(v) => v as u64,
                Imm::F32(b) => b as u64,
                Imm::F64(b) => b,
                Imm::Float(_) => return self.err(format!("a decimal float literal where .{t:?} is expected")),
            },
        };
        let bits = t.bits();
        Ok(if bits >= 64 { v } else { v & ((1u64 << bits) - 1) })
    }

    /// A source operand read as type `t`.
    fn src(&mut self, op: &Operand, t: PType) -> DResult<R> {
        match op {
            Operand::Reg(name) => self.reg(name),
            Operand::Imm(imm) => {
                let bits = self.imm_bits(*imm, t)?;
                Ok(self.konst(bits))
            }
            Operand::Sym(name, off) => match self.syms.get(name) {
                Some(sym) => {
                    let a = sym.address().wrapping_add(*off as u64);
                    Ok(self.konst(a))
                }
                None => self.err(format!("unknown symbol `{name}`")),
            },
            Operand::Not(_) => self.err("`!` is only allowed on predicate operands that take it"),
            other => self.err(format!("expected a register or literal, found {other:?}")),
        }
    }

    /// A predicate source that may be negated (`!p`).
    fn psrc(&mut self, op: &Operand) -> DResult<(R, bool)> {
        match op {
            Operand::Not(inner) => Ok((self.src(inner, PType::Pred)?, true)),
            other => Ok((self.src(other, PType::Pred)?, false)),
        }
    }

    fn dst(&mut self, op: &Operand) -> DResult<R> {
        match op {
            Operand::Reg(name) => {
                if let Some(r) = self.scopes.iter().rev().find_map(|s| s.get(name.as_str()).copied()) {
                    return Ok(r);
                }
                if name.contains('.') || self.special(name)?.is_some() {
                    return self.err(format!("special register `{name}` is read-only"));
                }
                self.err(format!("undeclared register `{name}`"))
            }
            Operand::Sink => Ok(self.scratch),
            other => self.err(format!("expected a destination register, found {other:?}")),
        }
    }

    /// `[reg+off]`, `[sym+off]` or `[imm]`.
    fn addr(&mut self, op: &Operand) -> DResult<(R, i64)> {
        match op {
            Operand::Addr(AddrBase::Reg(r), off) => Ok((self.reg(r)?, *off)),
            Operand::Addr(AddrBase::Sym(s), off) => match self.syms.get(s) {
                Some(sym) => {
                    let a = sym.address();
                    Ok((self.konst(a), *off))
                }
                None => self.err(format!("unknown symbol `{s}`")),
            },
            Operand::Addr(AddrBase::Abs, off) => Ok((self.konst(0), *off)),
            other => self.err(format!("expected an address `[...]`, found {other:?}")),
        }
    }

    /// The registers of a `{a, b, ...}` list (or a single register) for `n` lanes.
    fn vec_regs(&mut self, op: &Operand, dst: bool, t: PType) -> DResult<Vec<R>> {
        let items: Vec<Operand> = match op {
            Operand::Vec(items) => items.clone(),
            other => vec![other.clone()],
        };
        items.iter().map(|o| if dst { self.dst(o) } else { self.src(o, t) }).collect()
    }

    fn operands<'a>(&self, i: &'a PInst, n: usize) -> DResult<&'a [Operand]> {
        if i.operands.len() != n {
            return self.err(format!("`{}` takes {n} operands, found {}", i.mnemonic, i.operands.len()));
        }
        Ok(&i.operands)
    }

    // ---- instructions ---------------------------------------------------------------------

    fn inst(&mut self, i: &PInst) -> DResult<()> {
        self.guard = match &i.guard {
            None => (self.one, false),
            Some((neg, p)) => (self.reg(p)?, *neg),
        };
        let parts: Vec<&str> = i.mnemonic.split('.').collect();
        let opcode = parts[0];
        let mut m = Mods::new(&parts[1..]);
        let before = self.code.len();
        self.dispatch(opcode, &mut m, i)?;
        let left = m.leftover();
        if !left.is_empty() {
            self.code.truncate(before);
            let list = left.iter().map(|l| format!(".{l}")).collect::<Vec<_>>().join("");
            return self.unsup(format!("instruction `{}`: modifier {list} is not modelled", i.mnemonic));
        }
        Ok(())
    }

    fn one_type(&self, m: &mut Mods<'_>, i: &PInst) -> DResult<PType> {
        match m.types().as_slice() {
            [t] => Ok(*t),
            _ => {
                if m.parts.iter().any(|p| PType::is_other_type(p)) {
                    return self.unsup(format!("instruction `{}`: the type is not modelled", i.mnemonic));
                }
                self.err(format!("`{}` needs exactly one type", i.mnemonic))
            }
        }
    }

    /// Only `.rn` (or no rounding) is modelled for arithmetic.
    fn rn_only(&self, m: &mut Mods<'_>, i: &PInst) -> DResult<bool> {
        match m.one_of(&["rn", "rz", "rm", "rp"]) {
            None => Ok(false),
            Some("rn") => Ok(true),
            Some(r) => self.unsup(format!("instruction `{}`: rounding .{r} is modelled only for cvt", i.mnemonic)),
        }
    }

    fn dispatch(&mut self, opcode: &str, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        match opcode {
            "mov" => self.mov(m, i),
            "add" | "sub" => self.add_sub(opcode == "sub", m, i),
            "addc" | "subc" => {
                let cout = m.has("cc");
                let t = self.one_type(m, i)?;
                self.addc(opcode == "subc", true, cout, t, i)
            }
            "mul" => self.mul(m, i),
            "mad" => self.mad(m, i),
            "mul24" | "mad24" => self.mul24(opcode == "mad24", m, i),
            "fma" => {
                let rn = self.rn_only(m, i)?;
                let (ftz, sat) = (m.has("ftz"), m.has("sat"));
                let t = self.one_type(m, i)?;
                let Some(f) = t.fty() else { return self.unsup(format!("`{}` on .{t:?}", i.mnemonic)) };
                if !rn {
                    return self.err("fma needs a rounding modifier");
                }
                let o = self.operands(i, 4)?;
                let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], t)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Fma { f, ftz, sat, d, a, b, c });
                Ok(())
            }
            "div" => self.div(m, i),
            "rem" => self.int_bin(IBin::Rem, m, i),
            "abs" | "neg" => self.abs_neg(opcode == "neg", m, i),
            "min" | "max" => self.min_max(opcode == "max", m, i),
            "and" | "or" | "xor" => {
                let op = match opcode {
                    "and" => IBin::And,
                    "or" => IBin::Or,
                    _ => IBin::Xor,
                };
                self.int_bin(op, m, i)
            }
            "not" | "cnot" | "popc" | "clz" | "brev" | "bfind" => self.int_un(opcode, m, i),
            "shl" | "shr" => self.shift(opcode == "shl", m, i),
            "bfe" => {
                let t = self.one_type(m, i)?;
                let Some(ti) = t.int().filter(|t| t.bits >= 32) else {
                    return self.err("bfe takes .u32/.s32/.u64/.s64");
                };
                let o = self.operands(i, 4)?;
                let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], U32)?, self.src(&o[3], U32)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Bfe { t: ti, d, a, b, c });
                Ok(())
            }
            "bfi" => {
                let t = self.one_type(m, i)?;
                let o = self.operands(i, 5)?;
                let (a, b) = (self.src(&o[1], t)?, self.src(&o[2], t)?);
                let (c, e) = (self.src(&o[3], U32)?, self.src(&o[4], U32)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Bfi { bits: t.bits(), d, a, b, c, e });
                Ok(())
            }
            "prmt" => {
                let mode = match m.one_of(&["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]) {
                    None => PrmtMode::Default,
                    Some("f4e") => PrmtMode::F4e,
                    Some("b4e") => PrmtMode::B4e,
                    Some("rc8") => PrmtMode::Rc8,
                    Some("ecl") => PrmtMode::Ecl,
                    Some("ecr") => PrmtMode::Ecr,
                    Some(_) => PrmtMode::Rc16,
                };
                let t = self.one_type(m, i)?;
                let o = self.operands(i, 4)?;
                let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], t)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Prmt { mode, d, a, b, c });
                Ok(())
            }
            "lop3" => {
                let t = self.one_type(m, i)?;
                if t.bits() != 32 {
                    return self.err("lop3 takes .b32");
                }
                let o = self.operands(i, 5)?;
                let lut = match o[4] {
                    Operand::Imm(Imm::Int(v)) if (0..=255).contains(&v) => v as u8,
                    _ => return self.err("the lookup table of lop3 must be an immediate 0..255"),
                };
                let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], t)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Lop3 { d, a, b, c, lut });
                Ok(())
            }
            "shf" => {
                let left = match m.one_of(&["l", "r"]) {
                    Some(dir) => dir == "l",
                    None => return self.err("shf needs .l or .r"),
                };
                let wrap = match m.one_of(&["wrap", "clamp"]) {
                    Some(w) => w == "wrap",
                    None => return self.err("shf needs .wrap or .clamp"),
                };
                let t = self.one_type(m, i)?;
                let o = self.operands(i, 4)?;
                let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], U32)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::Shf { left, wrap, d, a, b, c });
                Ok(())
            }
            "copysign" => {
                let t = self.one_type(m, i)?;
                let Some(f) = t.fty() else { return self.err("copysign takes .f32/.f64") };
                let o = self.operands(i, 3)?;
                let (a, b) = (self.src(&o[1], t)?, self.src(&o[2], t)?);
                let d = self.dst(&o[0])?;
                self.emit(Op::FBin { op: FBin::Copysign, f, ftz: false, sat: false, d, a, b });
                Ok(())
            }
            "testp" => {
                let ops = ["finite", "infinite", "number", "notanumber", "normal", "subnormal"];
                let Some(name) = m.one_of(&ops) else { return self.err("testp needs an operation") };
                let op = ops.iter().position(|o| *o == name).unwrap_or(0) as u8;
                let t = self.one_type(m, i)?;
                let Some(f) = t.fty() else { return self.err("testp takes .f32/.f64") };
                let o = self.operands(i, 2)?;
                let a = self.src(&o[1], t)?;
                let d = self.dst(&o[0])?;
                self.emit(Op::Testp { op, f, d, a });
                Ok(())
            }
            "setp" | "set" => self.setp(opcode == "set", m, i),
            "selp" => {
                let t = self.one_type(m, i)?;
                let o = self.operands(i, 4)?;
                let (a, b) = (self.src(&o[1], t)?, self.src(&o[2], t)?);
                let c = self.src(&o[3], PType::Pred)?;
                let d = self.dst(&o[0])?;
                self.emit(Op::Selp { t: t.write(), d, a, b, c });
                Ok(())
            }
            "slct" => {
                if m.has("ftz") {
                    return self.unsup("slct.ftz");
                }
                let ts = m.types();
                let [dt, ct] = ts.as_slice() else { return self.err("slct takes two types") };
                let o = self.operands(i, 4)?;
                let (a, b, c) = (self.src(&o[1], *dt)?, self.src(&o[2], *dt)?, self.src(&o[3], *ct)?);
                let d = self.dst(&o[0])?;
                let float_sel = match ct {
                    PType::S(32) => false,
                    PType::F32 => true,
                    _ => return self.err("slct selects on .s32 or .f32"),
                };
                self.emit(Op::Slct { t: dt.write(), float_sel, d, a, b, c });
                Ok(())
            }
            "cvt" => self.cvt(m, i),
            "cvta" => {
                let to = m.has("to");
                let space = self.space(m)?;
                let t = self.one_type(m, i)?;
                if !matches!(space, Space::Global | Space::Shared | Space::Local) || t.bits() < 32 {
                    return self.unsup(format!("`{}`", i.mnemonic));
                }
                let o = self.operands(i, 2)?;
                let a = self.src(&o[1], t)?;
                let d = self.dst(&o[0])?;
                self.emit(Op::Cvta { to, space, d, a });
                Ok(())
            }
            "isspacep" => {
                let space = self.space(m)?;
                let o = self.operands(i, 2)?;
                let a = self.src(&o[1], PType::U(64))?;
                let d = self.dst(&o[0])?;
                self.emit(Op::Isspacep { space, d, a });
                Ok(())
            }
            "ld" | "ldu" | "st" => self.ld_st(opcode == "st", m, i),
            "atom" | "red" => self.atom(opcode == "red", m, i),
            "cp" => self.cp(m, i),
            "bra" => {
                m.has("uni");
                let o = self.operands(i, 1)?;
                let Operand::Sym(label, 0) = &o[0] else { return self.err("bra takes a label") };
                let chain = self.scope_ids.clone();
                self.fixups.push((self.code.len(), label.clone(), chain, self.line));
                self.emit(Op::Bra { target: 0 });
                Ok(())
            }
            "ret" | "exit" => {
                m.has("uni");
                self.operands(i, 0)?;
                self.emit(Op::Exit);
                Ok(())
            }
            "trap" | "brkpt" => {
                self.emit(Op::Trap);
                Ok(())
            }
            "membar" | "fence" => {
                // Blocks of a launch share global memory through relaxed atomics and each block
                // runs on one CPU thread, so fences order nothing further here.
                m.drop_all(|p| {
                    matches!(p, "cta" | "gl" | "gpu" | "sys" | "cluster" | "sc" | "acq_rel" | "acquire" | "release")
                });
                self.emit(Op::Nop);
                Ok(())
            }
            "nanosleep" | "pmevent" => {
                self.emit(Op::Nop);
                Ok(())
            }
            "prefetch" | "prefetchu" => {
                m.drop_all(|p| matches!(p, "global" | "local" | "L1" | "L2" | "L2::evict_last" | "L2::evict_normal"));
                self.emit(Op::Nop);
                Ok(())
            }
            "bar" | "barrier" => self.bar(m, i),
            "shfl" => self.shfl(m, i),
            "vote" => self.vote(m, i),
            "redux" => self.redux(m, i),
            "mma" => self.mma(m, i),
            "ldmatrix" => self.ldmatrix(m, i),
            "rcp" | "sqrt" | "rsqrt" | "ex2" | "lg2" | "sin" | "cos" | "tanh" => self.float_fn(opcode, m, i),
            other => self.unsup(format!("instruction `{other}` (`{}`)", i.mnemonic)),
        }
    }

    fn space(&self, m: &mut Mods<'_>) -> DResult<Space> {
        Ok(match m.one_of(&["global", "shared", "shared::cta", "local", "param", "param::entry", "const"]) {
            Some("global") | Some("const") => Space::Global,
            Some("shared") | Some("shared::cta") => Space::Shared,
            Some("local") => Space::Local,
            Some("param") | Some("param::entry") => Space::Param,
            _ => {
                if let Some(s) = m.parts.iter().find(|p| p.starts_with("shared::") || p.starts_with("param::")) {
                    return self.unsup(format!("state space .{s}"));
                }
                Space::Generic
            }
        })
    }

    fn mov(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let t = self.one_type(m, i)?;
        let o = self.operands(i, 2)?;
        match (&o[0], &o[1]) {
            (Operand::Vec(ds), a) => {
                let n = ds.len();
                if !matches!(n, 2 | 4) || t.bits() % n as u32 != 0 {
                    return self.err("mov unpacks into 2 or 4 registers");
                }
                let bits = t.bits() / n as u32;
                let a = self.src(a, t)?;
                let mut regs = [self.scratch; 4];
                for (k, d) in ds.iter().enumerate() {
                    regs[k] = self.dst(d)?;
                }
                self.emit(Op::Unpack { ds: regs, n: n as u8, bits: bits as u8, a });
            }
            (d, Operand::Vec(parts)) => {
                let n = parts.len();
                if !matches!(n, 2 | 4) || t.bits() % n as u32 != 0 {
                    return self.err("mov packs 2 or 4 registers");
                }
                let bits = t.bits() / n as u32;
                let mut regs = [self.one; 4];
                for (k, p) in parts.iter().enumerate() {
                    regs[k] = self.src(p, PType::B(bits))?;
                }
                let d = self.dst(d)?;
                self.emit(Op::Pack { d, parts: regs, n: n as u8, bits: bits as u8 });
            }
            (d, a) => {
                let a = self.src(a, t)?;
                let d = self.dst(d)?;
                self.emit(Op::Mov { d, a, t: t.write() });
            }
        }
        Ok(())
    }

    fn bin_operands(&mut self, i: &PInst, t: PType, tb: PType) -> DResult<(R, R, R)> {
        let o = self.operands(i, 3)?;
        let (a, b) = (self.src(&o[1], t)?, self.src(&o[2], tb)?);
        Ok((self.dst(&o[0])?, a, b))
    }

    fn add_sub(&mut self, sub: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if m.has("cc") {
            let t = self.one_type(m, i)?;
            return self.addc(sub, false, true, t, i);
        }
        self.rn_only(m, i)?;
        let (ftz, sat) = (m.has("ftz"), m.has("sat"));
        let t = self.one_type(m, i)?;
        if t.is_float() {
            let Some(f) = t.fty() else { return self.unsup(format!("`{}`: packed and half arithmetic", i.mnemonic)) };
            let (d, a, b) = self.bin_operands(i, t, t)?;
            let op = if sub { FBin::Sub } else { FBin::Add };
            self.emit(Op::FBin { op, f, ftz, sat, d, a, b });
            return Ok(());
        }
        let Some(ti) = t.int() else { return self.err(format!("`{}` on .{t:?}", i.mnemonic)) };
        if ftz {
            return self.err(".ftz on integer arithmetic");
        }
        let op = match (sub, sat) {
            (false, false) => IBin::Add,
            (true, false) => IBin::Sub,
            (false, true) => IBin::AddSat,
            (true, true) => IBin::SubSat,
        };
        if sat && t != PType::S(32) {
            return self.err(".sat integer arithmetic is .s32 only");
        }
        let (d, a, b) = self.bin_operands(i, t, t)?;
        self.emit(Op::IBin { op, t: ti, d, a, b });
        Ok(())
    }

    fn addc(&mut self, sub: bool, cin: bool, cout: bool, t: PType, i: &PInst) -> DResult<()> {
        let Some(ti) = t.int().filter(|t| t.bits >= 32) else { return self.err("carry arithmetic is 32/64-bit") };
        let (d, a, b) = self.bin_operands(i, t, t)?;
        let cc = self.cc;
        self.emit(Op::AddC { sub, cin, cout, t: ti, d, a, b, cc });
        Ok(())
    }

    fn int_bin(&mut self, op: IBin, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let t = self.one_type(m, i)?;
        let Some(ti) = t.int().filter(|ti| ti.bits >= 16 || ti.bits == 1) else {
            return self.unsup(format!("`{}` on .{t:?}", i.mnemonic));
        };
        if ti.bits == 1 && !matches!(op, IBin::And | IBin::Or | IBin::Xor) {
            return self.err(format!("`{}` on predicates", i.mnemonic));
        }
        let (d, a, b) = self.bin_operands(i, t, t)?;
        self.emit(Op::IBin { op, t: ti, d, a, b });
        Ok(())
    }

    fn mul(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let part = m.one_of(&["lo", "hi", "wide"]);
        self.rn_only(m, i)?;
        let (ftz, sat) = (m.has("ftz"), m.has("sat"));
        let t = self.one_type(m, i)?;
        if t.is_float() {
            let Some(f) = t.fty() else { return self.unsup(format!("`{}`: packed and half arithmetic", i.mnemonic)) };
            let (d, a, b) = self.bin_operands(i, t, t)?;
            self.emit(Op::FBin { op: FBin::Mul, f, ftz, sat, d, a, b });
            return Ok(());
        }
        let Some(ti) = t.int().filter(|t| t.bits >= 16) else { return self.err(format!("`{}` on .{t:?}", i.mnemonic)) };
        let (d, a, b) = self.bin_operands(i, t, t)?;
        match part {
            Some("lo") => self.emit(Op::IBin { op: IBin::MulLo, t: ti, d, a, b }),
            Some("hi") => self.emit(Op::IBin { op: IBin::MulHi, t: ti, d, a, b }),
            Some(_) if ti.bits <= 32 => self.emit(Op::MulWide { t: ti, d, a, b }),
            Some(_) => return self.err("mul.wide takes 16- or 32-bit sources"),
            None => return self.err("integer mul needs .lo, .hi or .wide"),
        }
        Ok(())
    }

    fn mad(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let part = m.one_of(&["lo", "hi", "wide"]);
        let rn = self.rn_only(m, i)?;
        let (ftz, sat) = (m.has("ftz"), m.has("sat"));
        let t = self.one_type(m, i)?;
        let o = self.operands(i, 4)?;
        if t.is_float() {
            let Some(f) = t.fty() else { return self.unsup(format!("`{}`: packed and half arithmetic", i.mnemonic)) };
            if !rn {
                return self.err("mad on floats needs .rn (it is fma)");
            }
            let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], t)?);
            let d = self.dst(&o[0])?;
            self.emit(Op::Fma { f, ftz, sat, d, a, b, c });
            return Ok(());
        }
        let Some(ti) = t.int().filter(|t| t.bits >= 16) else { return self.err(format!("`{}` on .{t:?}", i.mnemonic)) };
        if sat {
            return self.unsup("mad.hi.sat");
        }
        let op = match part {
            Some("lo") => Mad::Lo,
            Some("hi") => Mad::Hi,
            Some(_) if ti.bits <= 32 => Mad::Wide,
            Some(_) => return self.err("mad.wide takes 16- or 32-bit sources"),
            None => return self.err("integer mad needs .lo, .hi or .wide"),
        };
        let c_ty = if op == Mad::Wide { PType::B(ti.bits * 2) } else { t };
        let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], t)?, self.src(&o[3], c_ty)?);
        let d = self.dst(&o[0])?;
        self.emit(Op::IMad { op, t: ti, d, a, b, c });
        Ok(())
    }

    fn mul24(&mut self, mad: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let op = match m.one_of(&["lo", "hi"]) {
            Some("lo") => IBin::Mul24Lo,
            Some(_) => IBin::Mul24Hi,
            None => return self.err("mul24/mad24 need .lo or .hi"),
        };
        let t = self.one_type(m, i)?;
        let Some(ti) = t.int().filter(|t| t.bits == 32) else { return self.err("mul24/mad24 take .u32/.s32") };
        let o = self.operands(i, if mad { 4 } else { 3 })?;
        let (a, b) = (self.src(&o[1], t)?, self.src(&o[2], t)?);
        let d = self.dst(&o[0])?;
        if mad {
            let c = self.src(&o[3], t)?;
            let s = self.scratch;
            self.emit(Op::IBin { op, t: ti, d: s, a, b });
            self.emit(Op::IBin { op: IBin::Add, t: ti, d, a: s, b: c });
        } else {
            self.emit(Op::IBin { op, t: ti, d, a, b });
        }
        Ok(())
    }

    fn div(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let mode = m.one_of(&["rn", "rz", "rm", "rp", "approx", "full"]);
        let ftz = m.has("ftz");
        let t = self.one_type(m, i)?;
        if !t.is_float() {
            if mode.is_some() || ftz {
                return self.err("integer div takes no rounding");
            }
            let Some(ti) = t.int().filter(|t| t.bits >= 16) else { return self.err(format!("`{}`", i.mnemonic)) };
            let (d, a, b) = self.bin_operands(i, t, t)?;
            self.emit(Op::IBin { op: IBin::Div, t: ti, d, a, b });
            return Ok(());
        }
        let Some(f) = t.fty() else { return self.unsup(format!("`{}`: half division", i.mnemonic)) };
        let op = match (mode, f) {
            (Some("rn"), _) => FBin::Div,
            (Some("approx" | "full"), FTy::F32) => FBin::DivApprox,
            (Some(r @ ("rz" | "rm" | "rp")), _) => return self.unsup(format!("div.{r}: only .rn is modelled")),
            _ => return self.err(format!("`{}` needs .rn (or .approx/.full on f32)", i.mnemonic)),
        };
        let (d, a, b) = self.bin_operands(i, t, t)?;
        self.emit(Op::FBin { op, f, ftz, sat: false, d, a, b });
        Ok(())
    }

    fn abs_neg(&mut self, neg: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let ftz = m.has("ftz");
        let t = self.one_type(m, i)?;
        let o = self.operands(i, 2)?;
        let a = self.src(&o[1], t)?;
        let d = self.dst(&o[0])?;
        if t.is_float() {
            let Some(f) = t.fty() else { return self.unsup(format!("`{}` on half types", i.mnemonic)) };
            self.emit(Op::FUn { op: if neg { FUn::Neg } else { FUn::Abs }, f, ftz, d, a });
            return Ok(());
        }
        let Some(ti) = t.int().filter(|t| t.bits >= 16 && t.signed) else {
            return self.err(format!("`{}` takes .s16/.s32/.s64", i.mnemonic));
        };
        self.emit(Op::IUn { op: if neg { IUn::Neg } else { IUn::Abs }, t: ti, d, a });
        Ok(())
    }

    fn min_max(&mut self, max: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let nan = m.has("NaN");
        let ftz = m.has("ftz");
        let t = self.one_type(m, i)?;
        if t.is_float() {
            let Some(f) = t.fty() else { return self.unsup(format!("`{}` on half types", i.mnemonic)) };
            let op = match (max, nan) {
                (false, false) => FBin::Min,
                (true, false) => FBin::Max,
                (false, true) => FBin::MinNan,
                (true, true) => FBin::MaxNan,
            };
            let (d, a, b) = self.bin_operands(i, t, t)?;
            self.emit(Op::FBin { op, f, ftz, sat: false, d, a, b });
            return Ok(());
        }
        if nan || ftz {
            return self.err("integer min/max take no .NaN/.ftz");
        }
        let Some(ti) = t.int().filter(|t| t.bits >= 16) else { return self.unsup(format!("`{}`", i.mnemonic)) };
        let (d, a, b) = self.bin_operands(i, t, t)?;
        self.emit(Op::IBin { op: if max { IBin::Max } else { IBin::Min }, t: ti, d, a, b });
        Ok(())
    }

    fn int_un(&mut self, opcode: &str, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let shift = opcode == "bfind" && m.has("shiftamt");
        let t = self.one_type(m, i)?;
        let Some(ti) = t.int() else { return self.err(format!("`{}` on .{t:?}", i.mnemonic)) };
        let op = match opcode {
            "not" => IUn::Not,
            "cnot" => IUn::Cnot,
            "popc" => IUn::Popc,
            "clz" => IUn::Clz,
            "brev" => IUn::Brev,
            _ if shift => IUn::BfindShift,
            _ => IUn::Bfind,
        };
        let ok = match op {
            IUn::Not => ti.bits == 1 || ti.bits >= 16,
            IUn::Cnot => ti.bits >= 16,
            _ => ti.bits >= 32,
        };
        if !ok {
            return self.err(format!("`{}` on .{t:?}", i.mnemonic));
        }
        let o = self.operands(i, 2)?;
        let a = self.src(&o[1], t)?;
        let d = self.dst(&o[0])?;
        self.emit(Op::IUn { op, t: ti, d, a });
        Ok(())
    }

    fn shift(&mut self, left: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let t = self.one_type(m, i)?;
        let Some(ti) = t.int().filter(|t| t.bits >= 16) else { return self.err(format!("`{}` on .{t:?}", i.mnemonic)) };
        if left && ti.signed {
            return self.err("shl takes .b types");
        }
        let (d, a, b) = self.bin_operands(i, t, U32)?;
        self.emit(Op::IBin { op: if left { IBin::Shl } else { IBin::Shr }, t: ti, d, a, b });
        Ok(())
    }

    fn setp(&mut self, set: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let names = [
            "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu",
            "num", "nan",
        ];
        let cmps = [
            Cmp::Eq,
            Cmp::Ne,
            Cmp::Lt,
            Cmp::Le,
            Cmp::Gt,
            Cmp::Ge,
            Cmp::Lo,
            Cmp::Ls,
            Cmp::Hi,
            Cmp::Hs,
            Cmp::Equ,
            Cmp::Neu,
            Cmp::Ltu,
            Cmp::Leu,
            Cmp::Gtu,
            Cmp::Geu,
            Cmp::Num,
            Cmp::Nan,
        ];
        let Some(name) = m.one_of(&names) else { return self.err(format!("`{}` needs a comparison", i.mnemonic)) };
        let cmp = cmps[names.iter().position(|n| *n == name).unwrap_or(0)];
        let bop = match m.one_of(&["and", "or", "xor"]) {
            None => BoolOp::None,
            Some("and") => BoolOp::And,
            Some("or") => BoolOp::Or,
            Some(_) => BoolOp::Xor,
        };
        let ftz = m.has("ftz");
        let types = m.types();
        let (dt, st) = match (set, types.as_slice()) {
            (false, [t]) => (PType::Pred, *t),
            (true, [d, s]) => (*d, *s),
            _ => return self.err(format!("`{}`: wrong number of types", i.mnemonic)),
        };
        let t = match (st.int(), st.fty()) {
            (Some(ti), _) if ti.bits >= 16 => CmpTy::Int(ti),
            (_, Some(FTy::F32)) => CmpTy::F32 { ftz },
            (_, Some(FTy::F64)) => CmpTy::F64,
            _ => return self.unsup(format!("`{}`: comparison of .{st:?}", i.mnemonic)),
        };
        let float = !matches!(t, CmpTy::Int(_));
        let float_only =
            matches!(cmp, Cmp::Equ | Cmp::Neu | Cmp::Ltu | Cmp::Leu | Cmp::Gtu | Cmp::Geu | Cmp::Num | Cmp::Nan);
        let int_only = matches!(cmp, Cmp::Lo | Cmp::Ls | Cmp::Hi | Cmp::Hs);
        if (float && int_only) || (!float && float_only) {
            return self.err(format!("`{}`: .{name} does not apply to .{st:?}", i.mnemonic));
        }
        let n = i.operands.len();
        let want = if bop == BoolOp::None { 3 } else { 4 };
        if n != want {
            return self.err(format!("`{}` takes {want} operands, found {n}", i.mnemonic));
        }
        let o = &i.operands;
        let (a, b) = (self.src(&o[1], st)?, self.src(&o[2], st)?);
        let (c, cneg) = if bop == BoolOp::None { (self.one, false) } else { self.psrc(&o[3])? };
        if set {
            let float_dst = match dt {
                PType::F32 => true,
                PType::U(32) | PType::S(32) | PType::B(32) => false,
                _ => return self.err("set writes .u32/.s32/.f32"),
            };
            let d = self.dst(&o[0])?;
            self.emit(Op::Set { cmp, t, float_dst, d, a, b, bop, c, cneg });
            return Ok(());
        }
        let (d, q) = match &o[0] {
            Operand::Pair(p, q) => (self.dst(p)?, self.dst(q)?),
            other => (self.dst(other)?, self.scratch),
        };
        self.emit(Op::Setp { cmp, t, d, q, a, b, bop, c, cneg });
        Ok(())
    }

    fn cvt(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let rnd = m.one_of(&["rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "rna"]);
        let (ftz, sat, relu) = (m.has("ftz"), m.has("sat"), m.has("relu"));
        if m.has("satfinite") {
            return self.unsup(format!("`{}`: .satfinite", i.mnemonic));
        }
        let types = m.types();
        let [to, from] = types.as_slice() else {
            if m.parts.iter().any(|p| PType::is_other_type(p)) {
                return self.unsup(format!("`{}`: the types are not modelled", i.mnemonic));
            }
            return self.err(format!("`{}` needs two types", i.mnemonic));
        };
        let (to, from) = (*to, *from);
        let r = |s: &str| match s.trim_end_matches('i') {
            "rn" => Some(Rounding::Rn),
            "rz" => Some(Rounding::Rz),
            "rm" => Some(Rounding::Rm),
            "rp" => Some(Rounding::Rp),
            _ => None,
        };
        let integral = rnd.is_some_and(|s| s.ends_with('i'));
        if rnd == Some("rna") {
            return self.unsup(format!("`{}`: .rna", i.mnemonic));
        }
        let rounding = rnd.and_then(r);
        // Packed conversions: `cvt.rn.f16x2.f32 d, a, b`.
        if matches!(to, PType::F16x2 | PType::BF16x2) {
            if from != PType::F32 || rounding != Some(Rounding::Rn) || integral || sat || ftz {
                return self.unsup(format!("`{}`", i.mnemonic));
            }
            let o = self.operands(i, 3)?;
            let (a, b) = (self.src(&o[1], from)?, self.src(&o[2], from)?);
            let d = self.dst(&o[0])?;
            let to = if to == PType::F16x2 { Fmt::F16 } else { Fmt::BF16 };
            self.emit(Op::CvtPack { to, relu, d, a, b });
            return Ok(());
        }
        if relu && !matches!(to, PType::F16 | PType::BF16) {
            return self.err(".relu applies to f16/bf16 results");
        }
        let conv = match (from.int(), from.fmt(), to.int(), to.fmt()) {
            (Some(f), _, Some(t), _) if f.bits >= 8 && t.bits >= 8 => {
                if rnd.is_some() || ftz {
                    return self.err("integer conversions take no rounding");
                }
                Conv::IntInt { from: f, to: t, sat }
            }
            (_, Some(f), Some(t), _) if t.bits >= 8 => {
                let Some(rnd) = rounding.filter(|_| integral) else {
                    return self.err(format!("`{}`: float to integer needs .rni/.rzi/.rmi/.rpi", i.mnemonic));
                };
                Conv::FloatInt { from: f, to: t, rnd, ftz }
            }
            (Some(f), _, _, Some(t)) if f.bits >= 8 => {
                let Some(rnd) = rounding.filter(|_| !integral) else {
                    return self.err(format!("`{}`: integer to float needs .rn/.rz/.rm/.rp", i.mnemonic));
                };
                Conv::IntFloat { from: f, to: t, rnd, sat }
            }
            (_, Some(f), _, Some(t)) => {
                let narrowing = t.bits() < f.bits() || (t.bits() == f.bits() && t != f);
                // As in `ruda_ir::interp::num::float_to_float`: a mode on equal types rounds to
                // an integral value; `None` converts exactly.
                let rnd = match (rounding, narrowing, integral) {
                    (Some(r), _, true) if t == f => Some(r),
                    (Some(_), _, true) => return self.err("integral rounding needs equal float types"),
                    (Some(r), true, false) => Some(r),
                    (None, true, _) => {
                        return self.err(format!("`{}`: narrowing needs a rounding modifier", i.mnemonic))
                    }
                    (Some(_), false, false) => {
                        return self.err(format!("`{}`: widening takes no rounding", i.mnemonic))
                    }
                    (None, false, _) => None,
                };
                Conv::FloatFloat { from: f, to: t, rnd, ftz, sat, relu }
            }
            _ => return self.unsup(format!("`{}`", i.mnemonic)),
        };
        let o = self.operands(i, 2)?;
        let a = self.src(&o[1], from)?;
        let d = self.dst(&o[0])?;
        self.emit(Op::Cvt { conv, d, a });
        Ok(())
    }

    /// Memory-ordering, scope, cache and eviction modifiers: no effect on results here.
    fn drop_hints(m: &mut Mods<'_>) {
        m.drop_all(|p| {
            matches!(
                p,
                "weak"
                    | "volatile"
                    | "relaxed"
                    | "acquire"
                    | "release"
                    | "acq_rel"
                    | "mmio"
                    | "cta"
                    | "cluster"
                    | "gpu"
                    | "sys"
                    | "ca"
                    | "cg"
                    | "cs"
                    | "lu"
                    | "cv"
                    | "wb"
                    | "wt"
                    | "nc"
            ) || p.starts_with("L1::")
                || (p.starts_with("L2::") && p != "L2::cache_hint")
        });
    }

    fn ld_st(&mut self, store: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        Self::drop_hints(m);
        let hint = m.has("L2::cache_hint");
        let space = self.space(m)?;
        let n = match m.one_of(&["v2", "v4", "v8"]) {
            None => 1usize,
            Some("v2") => 2,
            Some("v4") => 4,
            Some(_) => return self.unsup(format!("`{}`: .v8", i.mnemonic)),
        };
        let t = self.one_type(m, i)?;
        if t == PType::Pred {
            return self.err("predicates cannot be loaded or stored");
        }
        let want = 2 + hint as usize;
        let o = self.operands(i, want)?;
        let (val, adr) = if store { (&o[1], &o[0]) } else { (&o[0], &o[1]) };
        let (addr, off) = self.addr(adr)?;
        let regs = self.vec_regs(val, !store, t)?;
        if regs.len() != n {
            return self.err(format!("`{}` moves {n} values, {} given", i.mnemonic, regs.len()));
        }
        let mut arr = [self.scratch; 4];
        arr[..n].copy_from_slice(&regs);
        let size = (t.bits() / 8) as u8;
        if store {
            if space == Space::Param {
                return self.unsup("st.param (function calls)");
            }
            self.emit(Op::St { space, size, n: n as u8, ss: arr, addr, off });
        } else {
            let signed = matches!(t, PType::S(_));
            self.emit(Op::Ld { space, signed, size, n: n as u8, ds: arr, addr, off });
        }
        Ok(())
    }

    fn atom(&mut self, red: bool, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        Self::drop_hints(m);
        let hint = m.has("L2::cache_hint");
        let space = self.space(m)?;
        if matches!(space, Space::Local | Space::Param) {
            return self.err(format!("`{}`: atomics on .{}", i.mnemonic, space.name()));
        }
        let ops = ["add", "inc", "dec", "min", "max", "and", "or", "xor", "exch", "cas"];
        let Some(name) = m.one_of(&ops) else { return self.err(format!("`{}` needs an operation", i.mnemonic)) };
        let op = [
            AtomOp::Add,
            AtomOp::Inc,
            AtomOp::Dec,
            AtomOp::Min,
            AtomOp::Max,
            AtomOp::And,
            AtomOp::Or,
            AtomOp::Xor,
            AtomOp::Exch,
            AtomOp::Cas,
        ][ops.iter().position(|o| *o == name).unwrap_or(0)];
        let noftz = m.has("noftz");
        if m.parts.iter().any(|p| matches!(*p, "v2" | "v4" | "v8")) {
            return self.unsup(format!("`{}`: vector atomics", i.mnemonic));
        }
        let t = self.one_type(m, i)?;
        let at = match (t.int(), t.fmt()) {
            (Some(ti), _) if ti.bits >= 16 => AtomTy::Int(ti),
            (_, Some(f)) => AtomTy::Float(f),
            _ => return self.unsup(format!("`{}` on .{t:?}", i.mnemonic)),
        };
        let valid = match (op, at) {
            (AtomOp::Cas, AtomTy::Int(ti)) => ti.bits >= 16,
            (_, AtomTy::Int(ti)) => ti.bits >= 32,
            (AtomOp::Add, AtomTy::Float(Fmt::F16 | Fmt::BF16)) => noftz,
            (AtomOp::Add | AtomOp::Min | AtomOp::Max | AtomOp::Exch, AtomTy::Float(Fmt::F32 | Fmt::F64)) => true,
            _ => false,
        };
        if !valid {
            return self.unsup(format!("`{}`", i.mnemonic));
        }
        let has_c = op == AtomOp::Cas;
        let want = (!red) as usize + 2 + has_c as usize + hint as usize;
        let o = self.operands(i, want)?;
        let o = if red { o } else { &o[1..] };
        let (addr, off) = self.addr(&o[0])?;
        let b = self.src(&o[1], t)?;
        let c = if has_c { self.src(&o[2], t)? } else { self.one };
        let d = if red { self.scratch } else { self.dst(&i.operands[0])? };
        self.emit(Op::Atom { space, op, t: at, d, addr, off, b, c });
        Ok(())
    }

    fn cp(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !m.has("async") {
            return self.unsup(format!("instruction `{}`", i.mnemonic));
        }
        if m.has("commit_group") {
            self.emit(Op::CpAsyncCommit);
            return Ok(());
        }
        if m.has("wait_all") {
            self.emit(Op::CpAsyncCommit);
            self.emit(Op::CpAsyncWait { n: 0 });
            return Ok(());
        }
        if m.has("wait_group") {
            self.operands(i, 1)?;
            let n = match i.operands[0] {
                Operand::Imm(Imm::Int(n)) => u32::try_from(n).map_err(|_| ()),
                _ => Err(()),
            };
            let Ok(n) = n else { return self.err("cp.async.wait_group takes an integer constant") };
            self.emit(Op::CpAsyncWait { n });
            return Ok(());
        }
        if m.one_of(&["ca", "cg"]).is_none() {
            return self.unsup(format!("instruction `{}`", i.mnemonic));
        }
        let dst_space = m.one_of(&["shared", "shared::cta"]);
        let src_space = m.has("global");
        Self::drop_hints(m);
        if dst_space.is_none() || !src_space || m.has("L2::cache_hint") {
            return self.unsup(format!("instruction `{}`", i.mnemonic));
        }
        let n = i.operands.len();
        if !(3..=4).contains(&n) {
            return self.err("cp.async takes a destination, a source, a size and maybe a source size");
        }
        let o = &i.operands;
        let (dst, doff) = self.addr(&o[0])?;
        let (src, soff) = self.addr(&o[1])?;
        let size = match o[2] {
            Operand::Imm(Imm::Int(v @ (4 | 8 | 16))) => v as u8,
            _ => return self.err("cp.async copies 4, 8 or 16 bytes"),
        };
        let src_size = if n == 4 { self.src(&o[3], U32)? } else { self.konst(size as u64) };
        self.emit(Op::CpAsync { dst, doff, src, soff, size, src_size });
        Ok(())
    }

    fn bar(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if m.has("warp") {
            if !m.has("sync") {
                return self.unsup(format!("`{}`", i.mnemonic));
            }
            let o = self.operands(i, 1)?;
            let mask = self.src(&o[0], U32)?;
            self.emit(Op::Warp { op: WarpOp::Sync, mask });
            return Ok(());
        }
        m.has("cta");
        m.has("aligned");
        let wait = match m.one_of(&["sync", "arrive"]) {
            Some("sync") => true,
            Some(_) => false,
            None => {
                if m.parts.is_empty() {
                    // `bar` alone is `bar.sync`.
                    true
                } else {
                    return self.unsup(format!("instruction `{}`", i.mnemonic));
                }
            }
        };
        let n = i.operands.len();
        if !(1..=2).contains(&n) || (!wait && n != 2) {
            return self.err(format!("`{}`: wrong number of operands", i.mnemonic));
        }
        let id = self.src(&i.operands[0], U32)?;
        let count = if n == 2 { self.src(&i.operands[1], U32)? } else { R::MAX };
        self.emit(Op::Bar { id, count, wait });
        Ok(())
    }

    fn shfl(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !m.has("sync") {
            return self.unsup("shfl without .sync (removed for sm_70 and newer)");
        }
        let mode = match m.one_of(&["up", "down", "bfly", "idx"]) {
            Some("up") => ShflMode::Up,
            Some("down") => ShflMode::Down,
            Some("bfly") => ShflMode::Bfly,
            Some(_) => ShflMode::Idx,
            None => return self.err("shfl needs a mode"),
        };
        let t = self.one_type(m, i)?;
        if t.bits() != 32 {
            return self.err("shfl moves .b32");
        }
        let o = self.operands(i, 5)?;
        let (a, b, c) = (self.src(&o[1], t)?, self.src(&o[2], U32)?, self.src(&o[3], U32)?);
        let mask = self.src(&o[4], U32)?;
        let (d, p) = match &o[0] {
            Operand::Pair(d, p) => (self.dst(d)?, self.dst(p)?),
            other => (self.dst(other)?, self.scratch),
        };
        self.emit(Op::Warp { op: WarpOp::Shfl { mode, d, p, a, b, c }, mask });
        Ok(())
    }

    fn vote(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !m.has("sync") {
            return self.unsup("vote without .sync (removed for sm_70 and newer)");
        }
        let mode = match m.one_of(&["all", "any", "uni", "ballot"]) {
            Some("all") => VoteMode::All,
            Some("any") => VoteMode::Any,
            Some("uni") => VoteMode::Uni,
            Some(_) => VoteMode::Ballot,
            None => return self.err("vote needs a mode"),
        };
        let t = self.one_type(m, i)?;
        let ok = if mode == VoteMode::Ballot { t.bits() == 32 } else { t == PType::Pred };
        if !ok {
            return self.err(format!("`{}`: wrong type", i.mnemonic));
        }
        let o = self.operands(i, 3)?;
        let (a, neg) = self.psrc(&o[1])?;
        let mask = self.src(&o[2], U32)?;
        let d = self.dst(&o[0])?;
        self.emit(Op::Warp { op: WarpOp::Vote { mode, d, a, neg }, mask });
        Ok(())
    }

    fn redux(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !m.has("sync") {
            return self.unsup(format!("`{}`", i.mnemonic));
        }
        let op = match m.one_of(&["add", "min", "max", "and", "or", "xor"]) {
            Some("add") => ReduxOp::Add,
            Some("min") => ReduxOp::Min,
            Some("max") => ReduxOp::Max,
            Some("and") => ReduxOp::And,
            Some("or") => ReduxOp::Or,
            Some("xor") => ReduxOp::Xor,
            _ => return self.err("redux needs an operation"),
        };
        let t = self.one_type(m, i)?;
        if t.bits() != 32 || t.is_float() {
            return self.unsup(format!("`{}`", i.mnemonic));
        }
        let o = self.operands(i, 3)?;
        let a = self.src(&o[1], t)?;
        let mask = self.src(&o[2], U32)?;
        let d = self.dst(&o[0])?;
        let signed = matches!(t, PType::S(_));
        self.emit(Op::Warp { op: WarpOp::Redux { op, signed, d, a }, mask });
        Ok(())
    }

    /// The registers of a `{...}` list of exactly `n`.
    fn reg_list(&mut self, op: &Operand, n: usize, dst: bool, t: PType, what: &str) -> DResult<Vec<R>> {
        let regs = self.vec_regs(op, dst, t)?;
        if regs.len() != n {
            return self.err(format!("{what}: expected {n} registers, found {}", regs.len()));
        }
        Ok(regs)
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` (the one shape and
    /// types the IR has; anything else is unsupported).
    fn mma(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !(m.has("sync") && m.has("aligned") && m.has("m16n8k16") && m.has("row") && m.has("col")) {
            return self.unsup(format!("instruction `{}`", i.mnemonic));
        }
        let bf16 = match m.types().as_slice() {
            [PType::F32, PType::F16, PType::F16, PType::F32] => false,
            [PType::F32, PType::BF16, PType::BF16, PType::F32] => true,
            _ => return self.unsup(format!("instruction `{}`: only f32 += f16 or bf16 products", i.mnemonic)),
        };
        let o = self.operands(i, 4)?;
        let (b32, f32t) = (PType::B(32), PType::F32);
        let a = self.reg_list(&o[1], 4, false, b32, "mma A")?;
        let b = self.reg_list(&o[2], 2, false, b32, "mma B")?;
        let c = self.reg_list(&o[3], 4, false, f32t, "mma C")?;
        let d = self.reg_list(&o[0], 4, true, f32t, "mma D")?;
        let mask = self.konst(0xffff_ffff);
        let op = WarpOp::Mma {
            bf16,
            d: [d[0], d[1], d[2], d[3]],
            a: [a[0], a[1], a[2], a[3]],
            b: [b[0], b[1]],
            c: [c[0], c[1], c[2], c[3]],
        };
        self.emit(Op::Warp { op, mask });
        Ok(())
    }

    /// `ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared{::cta}.b16`.
    fn ldmatrix(&mut self, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        if !(m.has("sync") && m.has("aligned") && m.has("m8n8")) || m.one_of(&["shared", "shared::cta"]).is_none() {
            return self.unsup(format!("instruction `{}`", i.mnemonic));
        }
        let count = match m.one_of(&["x1", "x2", "x4"]) {
            Some("x1") => 1,
            Some("x2") => 2,
            Some(_) => 4,
            None => return self.err("ldmatrix needs .x1, .x2 or .x4"),
        };
        let trans = m.has("trans");
        if m.types() != [PType::B(16)] {
            return self.unsup(format!("instruction `{}`: only .b16", i.mnemonic));
        }
        let o = self.operands(i, 2)?;
        let (addr, off) = self.addr(&o[1])?;
        let regs = self.reg_list(&o[0], count, true, PType::B(32), "ldmatrix destination")?;
        let mut d = [self.scratch; 4];
        d[..count].copy_from_slice(&regs);
        let mask = self.konst(0xffff_ffff);
        self.emit(Op::Warp { op: WarpOp::LdMatrix { count: count as u8, trans, d, addr, off }, mask });
        Ok(())
    }

    fn float_fn(&mut self, opcode: &str, m: &mut Mods<'_>, i: &PInst) -> DResult<()> {
        let mode = m.one_of(&["rn", "rz", "rm", "rp", "approx", "full"]);
        let ftz = m.has("ftz");
        let t = self.one_type(m, i)?;
        let Some(f) = t.fty() else { return self.unsup(format!("`{}` on half types", i.mnemonic)) };
        let approx = |a| FUn::Approx(a);
        let op = match (opcode, mode, f) {
            ("rcp", Some("rn"), _) => FUn::Rcp,
            ("sqrt", Some("rn"), _) => FUn::Sqrt,
            ("rcp", Some("approx"), FTy::F32) => approx(Approx::Rcp),
            ("rcp", Some("approx"), FTy::F64) if ftz => approx(Approx::Rcp),
            ("sqrt", Some("approx"), FTy::F32) => approx(Approx::Sqrt),
            ("rsqrt", Some("approx"), _) => approx(Approx::Rsqrt),
            ("ex2", Some("approx"), FTy::F32) => approx(Approx::Ex2),
            ("lg2", Some("approx"), FTy::F32) => approx(Approx::Lg2),
            ("sin", Some("approx"), FTy::F32) => approx(Approx::Sin),
            ("cos", Some("approx"), FTy::F32) => approx(Approx::Cos),
            ("tanh", Some("approx"), FTy::F32) => approx(Approx::Tanh),
            _ => return self.unsup(format!("instruction `{}`", i.mnemonic)),
        };
        let o = self.operands(i, 2)?;
        let a = self.src(&o[1], t)?;
        let d = self.dst(&o[0])?;
        self.emit(Op::FUn { op, f, ftz, d, a });
        Ok(())
    }
}

//! The verifier: types, address spaces, scoping of values, and barriers in uniform control flow.
//!
//! Every error names the kernel and the operation, carries the Rust location the builder
//! recorded, and prints the surrounding instructions.

use std::collections::HashSet;
use std::fmt;

use crate::kernel::*;
use crate::print::print_inst;
use crate::types::{AddrSpace, ScalarType, Type};

/// A verification failure.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyError {
    pub kernel: String,
    /// The mnemonic of the offending operation (or `kernel` for kernel-level errors).
    pub op: String,
    pub loc: Option<Loc>,
    pub message: String,
    /// The offending instruction and its neighbours, the offender marked with `-->`.
    pub context: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`: `{}`", self.kernel, self.op)?;
        if let Some(loc) = &self.loc {
            write!(f, " at {loc}")?;
        }
        write!(f, ": {}", self.message)?;
        if !self.context.is_empty() {
            write!(f, "\n{}", self.context)?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifyError {}

/// Whether PTX's `cvt` requires a rounding modifier for this conversion.
pub fn cvt_needs_rounding(from: ScalarType, to: ScalarType) -> bool {
    // f16 <-> bf16 keep the width but not the precision or range: both directions round.
    (from.is_float() && to.is_float() && (to.bits() < from.bits() || (to.bits() == from.bits() && from != to)))
        || (from.is_float() && to.is_int())
        || (from.is_int() && to.is_float())
}

/// Integer types on which the IR does arithmetic (8-bit integers are storage only, as in PTX).
fn is_arith_int(t: ScalarType) -> bool {
    t.is_int() && t.bits() >= 16
}

fn is_arith(t: ScalarType) -> bool {
    is_arith_int(t) || t.is_arith_float()
}

/// Verify a kernel as it enters the compiler (from the builder, a file or a test): everything
/// [`verify_form`] checks, and that no `for` has the constant 0 as its step (written so, such a
/// loop is a mistake: once entered it never ends).
pub fn verify(k: &Kernel) -> Result<(), VerifyError> {
    check(k, true)
}

/// Verify that a kernel is well formed: what every pass must preserve. Unlike [`verify`] it
/// accepts a constant zero loop step, which folding can derive from a computed one (`shr 5, 5`)
/// without changing what the kernel does; the interpreter stops such a loop if a lane enters it.
pub fn verify_form(k: &Kernel) -> Result<(), VerifyError> {
    check(k, false)
}

fn check(k: &Kernel, reject_zero_steps: bool) -> Result<(), VerifyError> {
    let mut v = Verifier { k, scopes: vec![], defined: HashSet::new(), reject_zero_steps };
    v.kernel_level()?;
    let params: Vec<Value> = k.params.iter().map(|p| p.value).collect();
    v.region(k.body, &params)?;
    let uniform = uniformity(k);
    v.barriers(k.body, true, &uniform)
}

struct Verifier<'a> {
    k: &'a Kernel,
    /// Values visible at the current point, one set per enclosing region.
    scopes: Vec<HashSet<Value>>,
    /// Every value defined so far (each may be defined once).
    defined: HashSet<Value>,
    /// Whether a constant zero loop step is an error (see [`verify`]).
    reject_zero_steps: bool,
}

impl<'a> Verifier<'a> {
    fn kernel_err(&self, message: String) -> VerifyError {
        VerifyError { kernel: self.k.name.clone(), op: "kernel".into(), loc: None, message, context: String::new() }
    }

    fn err(&self, id: InstId, message: impl Into<String>) -> VerifyError {
        let inst = self.k.inst(id);
        VerifyError {
            kernel: self.k.name.clone(),
            op: inst.op.mnemonic(),
            loc: inst.loc.clone(),
            message: message.into(),
            context: context(self.k, id),
        }
    }

    fn kernel_level(&self) -> Result<(), VerifyError> {
        let k = self.k;
        if k.name.is_empty() || !k.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(self.kernel_err(format!("kernel name {:?} must be non-empty [A-Za-z0-9_]", k.name)));
        }
        if k.name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(self.kernel_err(format!("kernel name {:?} must not start with a digit", k.name)));
        }
        for p in &k.params {
            let ty = k.ty(p.value);
            if let Type::Vector(..) = ty {
                return Err(self.kernel_err(format!("parameter `{}` has vector type {ty}", p.name)));
            }
            if let Type::Ptr(space, _) = ty {
                if space != AddrSpace::Global {
                    return Err(self.kernel_err(format!(
                        "parameter `{}` is a {space} pointer; kernel parameters point to global memory",
                        p.name
                    )));
                }
            }
            if ty == Type::PRED {
                return Err(self.kernel_err(format!("parameter `{}` is a predicate; pass a u32", p.name)));
            }
        }
        let mut names = HashSet::new();
        for s in &k.shared {
            if !names.insert(&s.name) {
                return Err(self.kernel_err(format!("shared array `{}` declared twice", s.name)));
            }
            if s.elem == ScalarType::Pred || s.len == 0 || !s.align.is_power_of_two() || s.align < s.elem.bytes() {
                return Err(self.kernel_err(format!(
                    "shared array `{}`: needs a non-predicate element type, a non-zero length and a power-of-two alignment of at least the element size",
                    s.name
                )));
            }
        }
        if let Some(lb) = k.launch_bounds {
            if lb.max_threads == 0 || lb.max_threads > 1024 {
                return Err(self.kernel_err(format!("launch bound {} threads is outside 1..=1024", lb.max_threads)));
            }
        }
        Ok(())
    }

    fn define(&mut self, v: Value, id: Option<InstId>) -> Result<(), VerifyError> {
        if v.index() >= self.k.values.len() {
            let msg = format!("value {v} has no entry in the value table");
            return Err(match id {
                Some(id) => self.err(id, msg),
                None => self.kernel_err(msg),
            });
        }
        if !self.defined.insert(v) {
            let msg = format!("value {v} is defined more than once");
            return Err(match id {
                Some(id) => self.err(id, msg),
                None => self.kernel_err(msg),
            });
        }
        self.scopes.last_mut().expect("inside a region").insert(v);
        Ok(())
    }

    fn visible(&self, v: Value) -> bool {
        self.scopes.iter().any(|s| s.contains(&v))
    }

    fn region(&mut self, r: RegionId, params: &[Value]) -> Result<(), VerifyError> {
        self.scopes.push(HashSet::new());
        for &p in params {
            self.define(p, None)?;
        }
        for &id in &self.k.region(r).insts {
            self.inst(id)?;
        }
        for &y in &self.k.region(r).yields {
            if !self.visible(y) {
                return Err(self.kernel_err(format!("{r} yields {y}, which is not defined in scope")));
            }
        }
        self.scopes.pop();
        Ok(())
    }

    fn inst(&mut self, id: InstId) -> Result<(), VerifyError> {
        let k = self.k;
        let inst = k.inst(id);
        for v in inst.op.operands() {
            if v.index() >= k.values.len() || !self.visible(v) {
                return Err(self.err(id, format!("uses {v}, which is not defined in scope here")));
            }
        }
        let expected = self.check_op(id)?;
        if expected.len() != inst.results.len() {
            return Err(self.err(id, format!("defines {} values, expected {}", inst.results.len(), expected.len())));
        }
        for (r, t) in inst.results.iter().zip(&expected) {
            if r.index() < k.values.len() && k.ty(*r) != *t {
                return Err(self.err(id, format!("result {r} has type {}, expected {t}", k.ty(*r))));
            }
        }
        // Nested regions see everything defined before this instruction.
        match &inst.op {
            Op::If { then_region, else_region, .. } => {
                self.region(*then_region, &[])?;
                self.region(*else_region, &[])?;
            }
            Op::For { body, .. } => {
                let params = k.region(*body).params.clone();
                self.region(*body, &params)?;
            }
            _ => {}
        }
        for &r in &inst.results {
            self.define(r, Some(id))?;
        }
        Ok(())
    }

    /// Check operand types; return the result types the operation defines.
    fn check_op(&self, id: InstId) -> Result<Vec<Type>, VerifyError> {
        let k = self.k;
        let ty = |v: Value| k.ty(v);
        let scalar = |v: Value, what: &str| -> Result<ScalarType, VerifyError> {
            ty(v).scalar().ok_or_else(|| self.err(id, format!("{what} {v} must be a scalar, found {}", ty(v))))
        };
        let same = |a: Value, b: Value| -> Result<(), VerifyError> {
            if ty(a) != ty(b) {
                return Err(self.err(id, format!("operand types differ: {a} is {}, {b} is {}", ty(a), ty(b))));
            }
            Ok(())
        };
        let e = |msg: String| Err(self.err(id, msg));
        let inst = k.inst(id);
        Ok(match &inst.op {
            Op::Const(c) => vec![Type::Scalar(c.ty)],
            Op::Special(_) => vec![Type::U32],
            Op::Unary(op, a) => {
                let t = scalar(*a, "operand")?;
                let ok = match op {
                    UnaryOp::Neg => t.is_signed_int() && is_arith_int(t) || t.is_arith_float(),
                    UnaryOp::Abs => t.is_signed_int() && is_arith_int(t) || t.is_arith_float(),
                    UnaryOp::Not => is_arith_int(t) || t == ScalarType::Pred,
                    UnaryOp::Popc | UnaryOp::Clz => t.is_int() && t.bits() >= 32,
                    UnaryOp::Sqrt | UnaryOp::Rcp => t.is_arith_float(),
                    _ => t == ScalarType::F32,
                };
                if !ok {
                    let hint =
                        if t.is_float() && !t.is_arith_float() { " (convert f16/bf16 to f32 first)" } else { "" };
                    return e(format!("`{op}` is not defined on {t}{hint}"));
                }
                vec![Type::Scalar(t)]
            }
            Op::Binary(op, a, b) => {
                let t = scalar(*a, "operand")?;
                let tb = scalar(*b, "operand")?;
                match op {
                    BinaryOp::Shl | BinaryOp::Shr => {
                        if !is_arith_int(t) {
                            return e(format!("`{op}` needs an integer of 16..64 bits, found {t}"));
                        }
                        if tb != ScalarType::U32 {
                            return e(format!("shift amount {b} must be u32, found {tb}"));
                        }
                    }
                    _ => {
                        same(*a, *b)?;
                        let ok = match op {
                            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => is_arith(t),
                            BinaryOp::Min | BinaryOp::Max => is_arith(t),
                            BinaryOp::MulHi | BinaryOp::Rem => is_arith_int(t),
                            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => is_arith_int(t) || t == ScalarType::Pred,
                            BinaryOp::Shl | BinaryOp::Shr => unreachable!("handled above"),
                        };
                        if !ok {
                            let hint = if t.is_float() && !t.is_arith_float() {
                                " (convert f16/bf16 to f32 first)"
                            } else {
                                ""
                            };
                            return e(format!("`{op}` is not defined on {t}{hint}"));
                        }
                    }
                }
                vec![Type::Scalar(t)]
            }
            Op::Fma(a, b, c) => {
                let t = scalar(*a, "operand")?;
                same(*a, *b)?;
                same(*a, *c)?;
                if !is_arith(t) {
                    return e(format!("`fma` is not defined on {t}"));
                }
                vec![Type::Scalar(t)]
            }
            Op::Cmp(op, a, b) => {
                let t = scalar(*a, "operand")?;
                same(*a, *b)?;
                let ok = match op {
                    CmpOp::Eq | CmpOp::Ne => is_arith(t) || t == ScalarType::Pred,
                    CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge => is_arith(t),
                    CmpOp::Neu | CmpOp::Nan => t.is_arith_float(),
                };
                if !ok {
                    return e(format!("`cmp.{op}` is not defined on {t}"));
                }
                vec![Type::PRED]
            }
            Op::Select(c, a, b) => {
                if ty(*c) != Type::PRED {
                    return e(format!("condition {c} must be a predicate, found {}", ty(*c)));
                }
                same(*a, *b)?;
                if matches!(ty(*a), Type::Vector(..)) {
                    return e("`select` of vectors: select the elements".into());
                }
                vec![ty(*a)]
            }
            Op::Cvt(a, cvt) => {
                let from = scalar(*a, "operand")?;
                if from == ScalarType::Pred || cvt.to == ScalarType::Pred {
                    return e("`cvt` does not take or make predicates; use select or cmp".into());
                }
                let needs = cvt_needs_rounding(from, cvt.to);
                if needs && cvt.rounding.is_none() {
                    return e(format!("conversion {from} -> {} needs an explicit rounding mode", cvt.to));
                }
                if !needs && cvt.rounding.is_some() && !(from.is_float() && from == cvt.to) {
                    return e(format!("conversion {from} -> {} is exact; it takes no rounding mode", cvt.to));
                }
                if cvt.sat && !cvt.to.is_int() {
                    return e("`.sat` applies to integer destinations only".into());
                }
                vec![Type::Scalar(cvt.to)]
            }
            Op::Bitcast(a, to) => {
                let from = scalar(*a, "operand")?;
                if from.bits() != to.bits() || from == ScalarType::Pred {
                    return e(format!("cannot bitcast {from} to {to}: widths differ"));
                }
                vec![Type::Scalar(*to)]
            }
            Op::PtrAdd(p, i) => {
                if !ty(*p).is_ptr() {
                    return e(format!("{p} is not a pointer ({})", ty(*p)));
                }
                let it = scalar(*i, "index")?;
                if !is_arith_int(it) || it.bits() < 32 {
                    return e(format!("index {i} must be a 32- or 64-bit integer, found {it}"));
                }
                vec![ty(*p)]
            }
            Op::PtrCast(p, elem) => match ty(*p) {
                Type::Ptr(space, _) if *elem != ScalarType::Pred => vec![Type::Ptr(space, *elem)],
                other => return e(format!("cannot cast {other} to a pointer to {elem}")),
            },
            Op::SharedBase(s) => match k.shared.get(s.index()) {
                Some(decl) => vec![Type::Ptr(AddrSpace::Shared, decl.elem)],
                None => return e(format!("no shared array {s}")),
            },
            Op::DynSharedBase(elem) => {
                if *elem == ScalarType::Pred {
                    return e("dynamic shared memory of predicates".into());
                }
                vec![Type::Ptr(AddrSpace::Shared, *elem)]
            }
            Op::Load { ptr, lanes } => {
                let (space, elem) = self.memory_ptr(id, *ptr)?;
                let _ = space;
                match lanes {
                    1 => vec![Type::Scalar(elem)],
                    2 | 4 => vec![Type::Vector(elem, *lanes)],
                    n => return e(format!("vector loads have 2 or 4 lanes, not {n}")),
                }
            }
            Op::Store { ptr, value } => {
                let (_, elem) = self.memory_ptr(id, *ptr)?;
                match ty(*value) {
                    Type::Scalar(t) | Type::Vector(t, 2 | 4) if t == elem => {}
                    other => return e(format!("cannot store {other} through a pointer to {elem}")),
                }
                vec![]
            }
            Op::Atomic { op, ptr, value, compare } => {
                let (_, elem) = self.memory_ptr(id, *ptr)?;
                if ty(*value) != Type::Scalar(elem) {
                    return e(format!("atomic value {value} is {}, the pointer's elements are {elem}", ty(*value)));
                }
                use ScalarType::*;
                let ok = match op {
                    AtomicOp::Add => matches!(elem, U32 | I32 | U64 | F32 | F64),
                    AtomicOp::Min | AtomicOp::Max => matches!(elem, U32 | I32 | U64 | I64),
                    AtomicOp::Exch | AtomicOp::Cas => matches!(elem, U32 | I32 | U64 | I64 | F32 | F64),
                };
                if !ok {
                    return e(format!("`atomic.{op}` is not available on {elem}"));
                }
                match (op, compare) {
                    (AtomicOp::Cas, Some(c)) if ty(*c) == Type::Scalar(elem) => {}
                    (AtomicOp::Cas, _) => return e("`atomic.cas` needs a compare value of the element type".into()),
                    (_, Some(_)) => return e("only `atomic.cas` takes a compare value".into()),
                    (_, None) => {}
                }
                vec![Type::Scalar(elem)]
            }
            Op::Barrier => vec![],
            Op::Shfl { value, lane, .. } => {
                let t = scalar(*value, "shuffled value")?;
                if t.bits() != 32 {
                    return e(format!("shuffles move 32-bit values, found {t}"));
                }
                if ty(*lane) != Type::U32 {
                    return e(format!("shuffle lane operand {lane} must be u32, found {}", ty(*lane)));
                }
                vec![Type::Scalar(t)]
            }
            Op::Vote { mode, pred } => {
                if ty(*pred) != Type::PRED {
                    return e(format!("vote operand {pred} must be a predicate"));
                }
                vec![if *mode == VoteMode::Ballot { Type::U32 } else { Type::PRED }]
            }
            Op::Mma { a, b, c, .. } => {
                let want = [
                    (*a, "A", Type::Vector(ScalarType::U32, 4)),
                    (*b, "B", Type::Vector(ScalarType::U32, 2)),
                    (*c, "C", Type::Vector(ScalarType::F32, 4)),
                ];
                for (v, name, t) in want {
                    if ty(v) != t {
                        return e(format!("`mma.m16n8k16` {name} fragment {v} must be {t}, found {}", ty(v)));
                    }
                }
                vec![Type::Vector(ScalarType::F32, 4)]
            }
            Op::LdMatrix { ptr, count, .. } => {
                match ty(*ptr) {
                    Type::Ptr(AddrSpace::Shared, elem) if elem.bits() == 16 => {}
                    other => return e(format!("`ldmatrix` needs a shared pointer to a 16-bit type, found {other}")),
                }
                match count {
                    1 => vec![Type::U32],
                    2 | 4 => vec![Type::Vector(ScalarType::U32, *count)],
                    n => return e(format!("`ldmatrix` loads 1, 2 or 4 matrices, not {n}")),
                }
            }
            Op::CpAsync { dst, src, size, src_size } => {
                if !matches!(size, 4 | 8 | 16) {
                    return e(format!("`cp.async` copies 4, 8 or 16 bytes, not {size}"));
                }
                match ty(*dst) {
                    Type::Ptr(AddrSpace::Shared, elem) if elem != ScalarType::Pred => {}
                    other => return e(format!("`cp.async` destination {dst} must be a shared pointer, found {other}")),
                }
                match ty(*src) {
                    Type::Ptr(AddrSpace::Global, elem) if elem != ScalarType::Pred => {}
                    other => return e(format!("`cp.async` source {src} must be a global pointer, found {other}")),
                }
                if let Some(n) = src_size {
                    if ty(*n) != Type::U32 {
                        return e(format!("`cp.async` source size {n} must be u32, found {}", ty(*n)));
                    }
                    if let Some(c) = constant_of(k, *n).filter(|c| c.bits > u64::from(*size)) {
                        return e(format!("`cp.async` source size {} exceeds the copy size {size}", c.bits));
                    }
                }
                if let Some(offset) = static_shared_offset(k, *dst) {
                    if offset % u64::from(*size) != 0 {
                        return e(format!(
                            "`cp.async` destination {dst} is at shared offset {offset}, not aligned to the copy size {size}"
                        ));
                    }
                }
                vec![]
            }
            Op::CpAsyncCommit | Op::CpAsyncWait(_) => vec![],
            Op::Extract(v, i) => match ty(*v) {
                Type::Vector(t, n) if *i < n => vec![Type::Scalar(t)],
                other => return e(format!("cannot extract element {i} of {other}")),
            },
            Op::MakeVector(vals) => {
                if vals.len() != 2 && vals.len() != 4 {
                    return e(format!("vectors have 2 or 4 elements, not {}", vals.len()));
                }
                let t = scalar(vals[0], "element")?;
                for v in vals {
                    same(vals[0], *v)?;
                }
                if t == ScalarType::Pred {
                    return e("vectors of predicates".into());
                }
                vec![Type::Vector(t, vals.len() as u8)]
            }
            Op::If { cond, then_region, else_region } => {
                if ty(*cond) != Type::PRED {
                    return e(format!("condition {cond} must be a predicate, found {}", ty(*cond)));
                }
                let tys = |r: RegionId| k.region(r).yields.iter().map(|v| ty(*v)).collect::<Vec<_>>();
                let (t, f) = (tys(*then_region), tys(*else_region));
                if t != f {
                    return e(format!("branches yield different types: {t:?} and {f:?}"));
                }
                if !k.region(*then_region).params.is_empty() || !k.region(*else_region).params.is_empty() {
                    return e("`if` regions take no parameters".into());
                }
                t
            }
            Op::For { start, end, step, init, body } => {
                let t = scalar(*start, "loop start")?;
                if !is_arith_int(t) || t.bits() < 32 {
                    return e(format!("loop bounds must be 32- or 64-bit integers, found {t}"));
                }
                same(*start, *end)?;
                same(*start, *step)?;
                if self.reject_zero_steps && constant_of(k, *step).is_some_and(|c| c.bits == 0) {
                    return e(format!("loop step {step} is the constant 0: a loop that starts never ends"));
                }
                let region = k.region(*body);
                let init_tys: Vec<Type> = init.iter().map(|v| ty(*v)).collect();
                let param_tys: Vec<Type> = region.params.iter().map(|v| ty(*v)).collect();
                let mut expected = vec![Type::Scalar(t)];
                expected.extend(&init_tys);
                if param_tys != expected {
                    return e(format!("loop body parameters are {param_tys:?}, expected {expected:?}"));
                }
                let yield_tys: Vec<Type> = region.yields.iter().map(|v| ty(*v)).collect();
                if yield_tys != init_tys {
                    return e(format!("loop body yields {yield_tys:?}, the carried values are {init_tys:?}"));
                }
                init_tys
            }
        })
    }

    /// A pointer that loads, stores and atomics may use: global or shared, not to predicates.
    fn memory_ptr(&self, id: InstId, ptr: Value) -> Result<(AddrSpace, ScalarType), VerifyError> {
        match self.k.ty(ptr) {
            Type::Ptr(space @ (AddrSpace::Global | AddrSpace::Shared), elem) if elem != ScalarType::Pred => {
                Ok((space, elem))
            }
            Type::Ptr(space, _) => {
                Err(self
                    .err(id, format!("memory access through a {space} pointer: only global and shared are supported")))
            }
            other => Err(self.err(id, format!("{ptr} is not a pointer ({other})"))),
        }
    }

    /// Barriers must be reached by all threads of the block: reject any under control flow that
    /// depends on thread-varying values.
    fn barriers(&self, r: RegionId, uniform_here: bool, uniform: &[bool]) -> Result<(), VerifyError> {
        for &id in &self.k.region(r).insts {
            let inst = self.k.inst(id);
            match &inst.op {
                Op::Barrier if !uniform_here => {
                    return Err(self.err(
                        id,
                        "barrier under thread-dependent control flow: every thread of the block must reach it",
                    ));
                }
                Op::If { cond, then_region, else_region } => {
                    let u = uniform_here && uniform[cond.index()];
                    self.barriers(*then_region, u, uniform)?;
                    self.barriers(*else_region, u, uniform)?;
                }
                Op::For { start, end, step, body, .. } => {
                    let u = uniform_here && [start, end, step].iter().all(|v| uniform[v.index()]);
                    self.barriers(*body, u, uniform)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Which values are the same for every thread of a block (a conservative analysis: thread ids,
/// lane ids, shuffles, votes and atomics vary, and so does anything computed from them or
/// loaded through a varying address).
pub fn uniformity(k: &Kernel) -> Vec<bool> {
    let mut uniform = vec![true; k.values.len()];
    loop {
        let mut changed = false;
        let mut set = |v: Value, u: bool, uniform: &mut Vec<bool>| {
            if !u && uniform[v.index()] {
                uniform[v.index()] = false;
                changed = true;
            }
        };
        k.walk(|_, inst| {
            let ops_uniform = inst.op.operands().iter().all(|v| uniform.get(v.index()).copied().unwrap_or(false));
            let u = match &inst.op {
                Op::Special(s) => s.is_block_uniform(),
                Op::Atomic { .. } | Op::Shfl { .. } | Op::Vote { .. } | Op::Mma { .. } | Op::LdMatrix { .. } => false,
                Op::If { cond, then_region, else_region } => {
                    uniform[cond.index()]
                        && [then_region, else_region]
                            .iter()
                            .all(|r| k.region(**r).yields.iter().all(|y| uniform[y.index()]))
                }
                Op::For { start, end, step, init, body } => {
                    let region = k.region(*body);
                    let bounds = [start, end, step].iter().all(|v| uniform[v.index()]);
                    if let Some(iv) = region.params.first() {
                        set(*iv, uniform[start.index()] && uniform[step.index()], &mut uniform);
                    }
                    for (i, (p, y)) in region.params.iter().skip(1).zip(&region.yields).enumerate() {
                        let carried = uniform[init[i].index()] && uniform[y.index()] && bounds;
                        set(*p, carried, &mut uniform);
                    }
                    bounds
                        && region.yields.iter().all(|y| uniform[y.index()])
                        && init.iter().all(|v| uniform[v.index()])
                }
                _ => ops_uniform,
            };
            for r in &inst.results {
                set(*r, u, &mut uniform);
            }
        });
        if !changed {
            return uniform;
        }
    }
}

/// The instruction defining `v`, if any (a scan: used for the few ops checked through their
/// operands' definitions).
fn def_of(k: &Kernel, v: Value) -> Option<&Op> {
    k.insts.iter().find(|i| i.results.contains(&v)).map(|i| &i.op)
}

fn constant_of(k: &Kernel, v: Value) -> Option<Constant> {
    match def_of(k, v)? {
        Op::Const(c) => Some(*c),
        _ => None,
    }
}

/// The byte offset in shared memory of a pointer built from a shared array (or the dynamic
/// window, whose offset is taken as its 16-byte alignment, which is all that matters to
/// alignment checks) by casts and constant `ptradd`s; `None` when not statically known. The
/// depth bound keeps a malformed arena (a value defined by its own use) from recursing forever.
fn static_shared_offset(k: &Kernel, p: Value) -> Option<u64> {
    shared_offset_within(k, p, 64)
}

fn shared_offset_within(k: &Kernel, p: Value, depth: u32) -> Option<u64> {
    let depth = depth.checked_sub(1)?;
    match def_of(k, p)? {
        Op::SharedBase(s) => {
            let mut offset = 0u64;
            for (i, decl) in k.shared.iter().enumerate() {
                offset = offset.next_multiple_of(u64::from(decl.align.max(1)));
                if i == s.index() {
                    return Some(offset);
                }
                offset += u64::from(decl.bytes());
            }
            None
        }
        Op::DynSharedBase(_) => Some(0),
        Op::PtrCast(q, _) => shared_offset_within(k, *q, depth),
        Op::PtrAdd(q, i) => {
            let c = constant_of(k, *i)?;
            let elem = k.ty(*q).elem().bytes() as i64;
            Some(shared_offset_within(k, *q, depth)?.wrapping_add((c.as_i64().wrapping_mul(elem)) as u64) & 0xffff_ffff)
        }
        _ => None,
    }
}

/// The instructions around `id` in its region, the offender marked.
fn context(k: &Kernel, id: InstId) -> String {
    let region = k.regions.iter().find(|r| r.insts.contains(&id));
    let Some(region) = region else { return String::new() };
    let pos = region.insts.iter().position(|i| *i == id).unwrap_or(0);
    let lo = pos.saturating_sub(3);
    let hi = (pos + 4).min(region.insts.len());
    let mut out = String::new();
    for (i, &other) in region.insts[lo..hi].iter().enumerate() {
        let marker = if lo + i == pos { "  --> " } else { "      " };
        out.push_str(marker);
        out.push_str(&print_inst(k, k.inst(other)));
        out.push('\n');
    }
    out
}

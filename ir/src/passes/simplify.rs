//! `simplify`: algebraic identities that hold bit for bit, and strength reduction.
//!
//! Integers wrap, so their identities are exact: `x+0`, `x-x`, `x*0`, `x*1`, `x&x`, `x^x`,
//! `neg(neg x)`, `cmp x, x`, ..., constants move to the right of commutative operations and
//! combine (`(x+c1)+c2`, `(x&c1)&c2`, shifts of shifts), `x-c` becomes `x+(-c)`. Multiplies by
//! `2^k` become shifts; unsigned divisions and remainders by `2^k` become `shr`/`and`; signed
//! ones (`1 <= k <= w-2`) become the round-toward-zero sequence `(x + ((x >> w-1) & (2^k-1)))
//! >> k` (and `x - ((x + bias) & -2^k)` for the remainder).
//!
//! Float arithmetic canonicalises NaNs (see [`crate::interp`]), so `x*1`, `x/1`, `x+(-0.0)`,
//! `x-(+0.0)` and `min(x, x)` give back `x` only when `x` cannot be a NaN of another payload,
//! as [`Op::nan_result`] tells (a bf16 widening and a float move keep payloads, for example).
//! `x / 2^k` becomes `x * 2^-k` when `2^-k` is representable: both round the same real number.
//! `x-x`, `x*0` and `x+0.0` stay (NaN, infinities, `-0`). `fma(a, b, -0.0)` is `a*b` and
//! `fma(a, 1, c)` is `a+c` exactly. `select(c, a, a)`, `extract` of a `vector`,
//! `ptradd p, 0`, and round trips of bitcasts, pointer casts and integer widenings fold away.

use super::util::{all_ones, Defs, Subst};
use super::Pass;
use crate::kernel::*;
use crate::types::{ScalarType, Type};

pub struct Simplify;

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }
    fn description(&self) -> &'static str {
        "exact algebraic identities, constants to the right and combined, multiplies/divides/remainders by powers of two as shifts and masks"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut s = Simplifier { defs: Defs::build(k), k, subst: Subst::default(), changed: false };
        let body = s.k.body;
        s.region(body);
        s.changed
    }
}

/// What a rule does with an instruction.
enum Action {
    Keep,
    /// Its result is this existing value; the instruction goes.
    Replace(Value),
    /// It computes the same result with this operation.
    Rewrite(Op),
}

use Action::*;

const F32_ONE: u64 = 0x3f80_0000;
const F64_ONE: u64 = 0x3ff0_0000_0000_0000;

fn float_one(t: ScalarType) -> u64 {
    if t == ScalarType::F64 {
        F64_ONE
    } else {
        F32_ONE
    }
}

fn sign_bit(t: ScalarType) -> u64 {
    1u64 << (t.bits() - 1)
}

/// `1 / c` when the float constant `c` is a power of two whose reciprocal is representable:
/// then `x / c` and `x * (1 / c)` round the same real number, so they agree bit for bit.
fn exact_reciprocal(c: Constant) -> Option<Constant> {
    let v = match c.ty {
        ScalarType::F32 => f32::from_bits(c.bits as u32) as f64,
        ScalarType::F64 => f64::from_bits(c.bits),
        _ => return None,
    };
    // A power of two: finite, non-zero, normal, no fraction bits (an f64 holds every f32).
    if !v.is_normal() || v.to_bits() & ((1u64 << 52) - 1) != 0 {
        return None;
    }
    let r = 1.0 / v;
    if c.ty == ScalarType::F32 {
        let narrow = r as f32;
        (narrow as f64 == r).then(|| Constant::f32(narrow))
    } else {
        // Exact unless out of range (then the product is not one).
        (r * v == 1.0).then(|| Constant::f64(r))
    }
}

/// `log2(c)` when the integer constant `c` is a power of two (as a bit pattern).
fn log2(c: Constant) -> Option<u32> {
    c.bits.is_power_of_two().then(|| c.bits.trailing_zeros())
}

fn commutative(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor
    )
}

fn mirrored(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Ge => CmpOp::Le,
        other => other,
    }
}

struct Simplifier<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    subst: Subst,
    changed: bool,
}

impl Simplifier<'_> {
    fn region(&mut self, r: RegionId) {
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            self.subst.rewrite_inst(self.k, id);
            for sub in self.k.inst(id).op.regions() {
                self.region(sub);
            }
            if self.simplify(id, &mut out) {
                out.push(id);
            }
        }
        self.k.regions[r.index()].insts = out;
        self.subst.rewrite_yields(self.k, r);
    }

    /// Apply rules until none fires; whether the instruction stays.
    fn simplify(&mut self, id: InstId, out: &mut Vec<InstId>) -> bool {
        // Each rewrite either removes the instruction or moves toward a normal form; the bound
        // only guards against a rule pair undoing each other.
        for _ in 0..8 {
            match self.rule(id, out) {
                Keep => return true,
                Replace(v) => {
                    let r = self.k.inst(id).results[0];
                    self.subst.insert(r, v);
                    self.changed = true;
                    return false;
                }
                Rewrite(op) => {
                    self.k.insts[id.index()].op = op;
                    self.changed = true;
                }
            }
        }
        true
    }

    fn c(&self, v: Value) -> Option<Constant> {
        self.defs.constant(self.k, v)
    }

    fn is(&self, v: Value, bits: u64) -> bool {
        self.c(v).is_some_and(|c| c.bits == bits)
    }

    fn def(&self, v: Value) -> Option<Op> {
        self.defs.op(self.k, v).cloned()
    }

    /// A new constant, placed before the instruction being simplified.
    fn konst(&mut self, out: &mut Vec<InstId>, c: Constant, loc: &Option<Loc>) -> Value {
        super::util::push_const(self.k, &mut self.defs, out, c, loc)
    }

    fn new_value(&mut self, out: &mut Vec<InstId>, op: Op, ty: ScalarType, loc: &Option<Loc>) -> Value {
        let (id, v) = super::util::push_value(self.k, out, op, Type::Scalar(ty), loc);
        self.defs.set(v, id);
        v
    }

    /// Whether the float value `v` is either not a NaN or the canonical NaN, so that an
    /// arithmetic identity returning it matches the operation's canonicalised result. Which
    /// operations guarantee that is [`Op::nan_result`]'s to say; this follows moves, selects
    /// and `abs` back at most `depth` definitions.
    fn canonical(&self, v: Value, depth: u32) -> bool {
        let Some(op) = self.defs.op(self.k, v) else { return false };
        match op.nan_result(|x| self.k.ty(x)) {
            NanResult::Canonical => true,
            NanResult::Operands(vals) => depth > 1 && vals.iter().all(|&x| self.canonical(x, depth - 1)),
            NanResult::Any => false,
        }
    }

    fn rule(&mut self, id: InstId, out: &mut Vec<InstId>) -> Action {
        let inst = self.k.inst(id);
        let Some(&res) = inst.results.first() else { return Keep };
        let (op, loc, ty) = (inst.op.clone(), inst.loc.clone(), self.k.ty(res));
        match op {
            Op::Binary(op, a, b) => self.binary(op, a, b, ty.elem(), out, &loc),
            Op::Unary(op, a) => self.unary(op, a),
            Op::Fma(a, b, c) => self.fma(a, b, c, ty.elem()),
            Op::Cmp(op, a, b) => self.cmp(op, a, b, out, &loc),
            Op::Select(c, a, b) => self.select(c, a, b, ty),
            Op::Cvt(a, cvt) => self.cvt(a, cvt),
            Op::Bitcast(a, to) => match self.def(a) {
                _ if self.k.ty(a) == Type::Scalar(to) => Replace(a),
                Some(Op::Bitcast(x, _)) if self.k.ty(x) == Type::Scalar(to) => Replace(x),
                Some(Op::Bitcast(x, _)) => Rewrite(Op::Bitcast(x, to)),
                _ => Keep,
            },
            Op::Extract(v, i) => match self.def(v) {
                Some(Op::MakeVector(elems)) => Replace(elems[i as usize]),
                _ => Keep,
            },
            Op::PtrAdd(p, i) if self.is(i, 0) => Replace(p),
            Op::PtrCast(p, elem) => match self.def(p) {
                _ if self.k.ty(p) == ty => Replace(p),
                Some(Op::PtrCast(q, _)) if self.k.ty(q) == ty => Replace(q),
                Some(Op::PtrCast(q, _)) => Rewrite(Op::PtrCast(q, elem)),
                _ => Keep,
            },
            _ => Keep,
        }
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        a: Value,
        b: Value,
        t: ScalarType,
        out: &mut Vec<InstId>,
        loc: &Option<Loc>,
    ) -> Action {
        use BinaryOp::*;
        if commutative(op) && self.c(a).is_some() && self.c(b).is_none() {
            return Rewrite(Op::Binary(op, b, a));
        }
        if t.is_float() {
            let keeps_a = |s: &Self, bits: u64| s.is(b, bits) && s.canonical(a, 6);
            return match op {
                Add if keeps_a(self, sign_bit(t)) => Replace(a),
                Sub if keeps_a(self, 0) => Replace(a),
                Mul | Div if keeps_a(self, float_one(t)) => Replace(a),
                Min | Max if a == b && self.canonical(a, 6) => Replace(a),
                Div => match self.c(b).and_then(exact_reciprocal) {
                    Some(r) => Rewrite(Op::Binary(Mul, a, self.konst(out, r, loc))),
                    None => Keep,
                },
                _ => Keep,
            };
        }
        if t == ScalarType::Pred {
            let (tr, fa) = (self.is(b, 1), self.is(b, 0));
            return match op {
                And | Or if a == b => Replace(a),
                And if tr => Replace(a),
                And if fa => Replace(b),
                Or if tr => Replace(b),
                Or if fa => Replace(a),
                Xor if a == b => Replace(self.konst(out, Constant::pred(false), loc)),
                Xor if fa => Replace(a),
                Xor if tr => Rewrite(Op::Unary(UnaryOp::Not, a)),
                _ => Keep,
            };
        }
        let signed = t.is_signed_int();
        let w = t.bits();
        let (ca, cb) = (self.c(a), self.c(b));
        let zero = |c: Option<Constant>| c.is_some_and(|c| c.bits == 0);
        let one = |c: Option<Constant>| c.is_some_and(|c| c.bits == 1);
        let minus_one = |c: Option<Constant>| signed && c.is_some_and(|c| c == all_ones(t));
        let u32c = |s: &mut Self, out: &mut Vec<InstId>, v: u32| s.konst(out, Constant::u32(v), loc);
        match op {
            Add if zero(cb) => Replace(a),
            Add => match (cb, self.def(a)) {
                (Some(c2), Some(Op::Binary(Add, x, y))) if self.c(y).is_some() => {
                    let c1 = self.c(y).unwrap_or(c2);
                    let c = self.konst(out, Constant::new(t, c1.bits.wrapping_add(c2.bits)), loc);
                    Rewrite(Op::Binary(Add, x, c))
                }
                _ => Keep,
            },
            Sub if zero(cb) => Replace(a),
            Sub if a == b => Replace(self.konst(out, Constant::new(t, 0), loc)),
            Sub if cb.is_some() => {
                let c = cb.map_or(0, |c| c.bits.wrapping_neg());
                let c = self.konst(out, Constant::new(t, c), loc);
                Rewrite(Op::Binary(Add, a, c))
            }
            Sub if signed && zero(ca) => Rewrite(Op::Unary(UnaryOp::Neg, b)),
            Mul if zero(cb) => Replace(b),
            Mul if one(cb) => Replace(a),
            Mul if minus_one(cb) => Rewrite(Op::Unary(UnaryOp::Neg, a)),
            Mul => match cb.and_then(log2) {
                Some(k) => Rewrite(Op::Binary(Shl, a, u32c(self, out, k))),
                None => Keep,
            },
            Div | Rem if one(cb) => match op {
                Div => Replace(a),
                _ => Replace(self.konst(out, Constant::new(t, 0), loc)),
            },
            Div if minus_one(cb) => Rewrite(Op::Unary(UnaryOp::Neg, a)),
            Rem if minus_one(cb) => Replace(self.konst(out, Constant::new(t, 0), loc)),
            Div | Rem => {
                let Some(k) = cb.and_then(log2) else { return Keep };
                if !signed {
                    return match op {
                        Div => Rewrite(Op::Binary(Shr, a, u32c(self, out, k))),
                        _ => Rewrite(Op::Binary(And, a, self.konst(out, Constant::new(t, (1u64 << k) - 1), loc))),
                    };
                }
                if k > w - 2 {
                    return Keep;
                }
                // Round toward zero: negative dividends get 2^k - 1 added before the shift.
                let sign_shift = u32c(self, out, w - 1);
                let sign = self.new_value(out, Op::Binary(Shr, a, sign_shift), t, loc);
                let mask = self.konst(out, Constant::new(t, (1u64 << k) - 1), loc);
                let bias = self.new_value(out, Op::Binary(And, sign, mask), t, loc);
                let biased = self.new_value(out, Op::Binary(Add, a, bias), t, loc);
                match op {
                    Div => Rewrite(Op::Binary(Shr, biased, u32c(self, out, k))),
                    _ => {
                        let high = self.konst(out, Constant::new(t, !((1u64 << k) - 1)), loc);
                        let rounded = self.new_value(out, Op::Binary(And, biased, high), t, loc);
                        Rewrite(Op::Binary(Sub, a, rounded))
                    }
                }
            }
            Min | Max | And | Or if a == b => Replace(a),
            And if zero(cb) => Replace(b),
            And if cb == Some(all_ones(t)) => Replace(a),
            And => match (cb, self.def(a)) {
                (Some(c2), Some(Op::Binary(And, x, y))) if self.c(y).is_some() => {
                    let c1 = self.c(y).unwrap_or(c2);
                    Rewrite(Op::Binary(And, x, self.konst(out, Constant::new(t, c1.bits & c2.bits), loc)))
                }
                _ => Keep,
            },
            Or if zero(cb) => Replace(a),
            Or if cb == Some(all_ones(t)) => Replace(b),
            Xor if a == b => Replace(self.konst(out, Constant::new(t, 0), loc)),
            Xor if zero(cb) => Replace(a),
            Xor if cb == Some(all_ones(t)) => Rewrite(Op::Unary(UnaryOp::Not, a)),
            Shl | Shr if zero(cb) || zero(ca) => Replace(a),
            Shl | Shr => match (cb, self.def(a)) {
                // Shift amounts clamp: shifting by the width or more gives 0 (or the sign bits).
                (Some(c2), Some(Op::Binary(inner, x, y))) if inner == op && self.c(y).is_some() => {
                    let c1 = self.c(y).unwrap_or(c2);
                    let total = (c1.bits + c2.bits).min(w as u64) as u32;
                    Rewrite(Op::Binary(op, x, u32c(self, out, total)))
                }
                _ => Keep,
            },
            _ => Keep,
        }
    }

    fn unary(&mut self, op: UnaryOp, a: Value) -> Action {
        match (op, self.def(a)) {
            (UnaryOp::Neg, Some(Op::Unary(UnaryOp::Neg, x))) | (UnaryOp::Not, Some(Op::Unary(UnaryOp::Not, x))) => {
                Replace(x)
            }
            (UnaryOp::Abs, Some(Op::Unary(UnaryOp::Abs, _))) => Replace(a),
            (UnaryOp::Abs, Some(Op::Unary(UnaryOp::Neg, x))) => Rewrite(Op::Unary(UnaryOp::Abs, x)),
            _ => Keep,
        }
    }

    fn fma(&mut self, a: Value, b: Value, c: Value, t: ScalarType) -> Action {
        if t.is_float() {
            let one = float_one(t);
            return if self.is(c, sign_bit(t)) {
                Rewrite(Op::Binary(BinaryOp::Mul, a, b))
            } else if self.is(b, one) {
                Rewrite(Op::Binary(BinaryOp::Add, a, c))
            } else if self.is(a, one) {
                Rewrite(Op::Binary(BinaryOp::Add, b, c))
            } else {
                Keep
            };
        }
        if self.is(a, 0) || self.is(b, 0) {
            Replace(c)
        } else if self.is(b, 1) {
            Rewrite(Op::Binary(BinaryOp::Add, a, c))
        } else if self.is(a, 1) {
            Rewrite(Op::Binary(BinaryOp::Add, b, c))
        } else if self.is(c, 0) {
            Rewrite(Op::Binary(BinaryOp::Mul, a, b))
        } else {
            Keep
        }
    }

    fn cmp(&mut self, op: CmpOp, a: Value, b: Value, out: &mut Vec<InstId>, loc: &Option<Loc>) -> Action {
        if self.c(a).is_some() && self.c(b).is_none() {
            return Rewrite(Op::Cmp(mirrored(op), b, a));
        }
        let t = self.k.ty(a).elem();
        if t.is_float() {
            return Keep;
        }
        let answer = if a == b {
            match op {
                CmpOp::Eq | CmpOp::Le | CmpOp::Ge => Some(true),
                CmpOp::Ne | CmpOp::Lt | CmpOp::Gt => Some(false),
                CmpOp::Neu | CmpOp::Nan => None,
            }
        } else if t.is_unsigned_int() && self.is(b, 0) {
            match op {
                CmpOp::Lt => Some(false),
                CmpOp::Ge => Some(true),
                _ => None,
            }
        } else {
            None
        };
        match answer {
            Some(v) => Replace(self.konst(out, Constant::pred(v), loc)),
            None => Keep,
        }
    }

    fn select(&mut self, c: Value, a: Value, b: Value, ty: Type) -> Action {
        if a == b {
            return Replace(a);
        }
        if let Some(Op::Unary(UnaryOp::Not, c)) = self.def(c) {
            return Rewrite(Op::Select(c, b, a));
        }
        if ty == Type::PRED && self.is(a, 1) && self.is(b, 0) {
            return Replace(c);
        }
        if ty == Type::PRED && self.is(a, 0) && self.is(b, 1) {
            return Rewrite(Op::Unary(UnaryOp::Not, c));
        }
        Keep
    }

    fn cvt(&mut self, a: Value, cvt: Cvt) -> Action {
        let from = self.k.ty(a).elem();
        if !from.is_int() || !cvt.to.is_int() {
            return Keep;
        }
        if from == cvt.to {
            return Replace(a);
        }
        // Truncating an integer extension gives the original back.
        if let Some(Op::Cvt(x, inner)) = self.def(a) {
            let xt = self.k.ty(x).elem();
            if xt == cvt.to && xt.is_int() && !inner.sat && !cvt.sat && from.bits() >= xt.bits() {
                return Replace(x);
            }
        }
        Keep
    }
}

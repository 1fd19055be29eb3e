//! What the passes share: definitions, value substitution, effect classes, cloning, and small
//! constant helpers.

use std::collections::HashMap;

use crate::kernel::*;
use crate::types::{ScalarType, Type};

/// The instruction defining each value reachable from the entry region (kernel and loop
/// parameters have none).
pub(crate) struct Defs(Vec<Option<InstId>>);

impl Defs {
    pub(crate) fn build(k: &Kernel) -> Defs {
        let mut defs = Defs(vec![None; k.values.len()]);
        k.walk(|id, inst| {
            for &r in &inst.results {
                defs.set(r, id);
            }
        });
        defs
    }

    pub(crate) fn get(&self, v: Value) -> Option<InstId> {
        self.0.get(v.index()).copied().flatten()
    }

    pub(crate) fn set(&mut self, v: Value, id: InstId) {
        if self.0.len() <= v.index() {
            self.0.resize(v.index() + 1, None);
        }
        self.0[v.index()] = Some(id);
    }

    /// The operation defining `v`, if an instruction does.
    pub(crate) fn op<'k>(&self, k: &'k Kernel, v: Value) -> Option<&'k Op> {
        self.get(v).map(|id| &k.inst(id).op)
    }

    /// The constant `v` is, if a `const` defines it.
    pub(crate) fn constant(&self, k: &Kernel, v: Value) -> Option<Constant> {
        match self.op(k, v) {
            Some(Op::Const(c)) => Some(*c),
            _ => None,
        }
    }
}

/// A substitution of values (each replaced value maps to its final replacement).
#[derive(Default)]
pub(crate) struct Subst(HashMap<Value, Value>);

impl Subst {
    pub(crate) fn get(&self, mut v: Value) -> Value {
        while let Some(&to) = self.0.get(&v) {
            v = to;
        }
        v
    }

    /// Replace every later use of `from` by `to`.
    pub(crate) fn insert(&mut self, from: Value, to: Value) {
        let to = self.get(to);
        if from != to {
            self.0.insert(from, to);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Rename the operands of one instruction (not those inside its regions).
    pub(crate) fn rewrite_inst(&self, k: &mut Kernel, id: InstId) {
        if self.is_empty() {
            return;
        }
        for v in k.insts[id.index()].op.operands_mut() {
            *v = self.get(*v);
        }
    }

    pub(crate) fn rewrite_yields(&self, k: &mut Kernel, r: RegionId) {
        if self.is_empty() {
            return;
        }
        let region = &mut k.regions[r.index()];
        for y in &mut region.yields {
            *y = self.get(*y);
        }
    }
}

/// Every region reachable from the entry region, parents before children.
pub(crate) fn reachable_regions(k: &Kernel) -> Vec<RegionId> {
    let mut out = vec![k.body];
    let mut i = 0;
    while i < out.len() {
        for &id in &k.region(out[i]).insts {
            out.extend(k.inst(id).op.regions());
        }
        i += 1;
    }
    out
}

/// Instructions in a region, nested ones included (the size measure of the unroller).
pub(crate) fn region_size(k: &Kernel, r: RegionId) -> usize {
    k.region(r)
        .insts
        .iter()
        .map(|&id| 1 + k.inst(id).op.regions().iter().map(|&s| region_size(k, s)).sum::<usize>())
        .sum()
}

/// Whether `op` computes a value from its operands only, can neither fail nor observe other
/// lanes, and so may be removed, merged, or executed where it was not (the integer divisions
/// qualify only with a non-zero constant divisor).
pub(crate) fn is_speculatable(k: &Kernel, defs: &Defs, op: &Op) -> bool {
    match op {
        Op::Binary(BinaryOp::Div | BinaryOp::Rem, _, b) if k.ty(*b).elem().is_int() => {
            defs.constant(k, *b).is_some_and(|c| c.bits != 0)
        }
        Op::Const(_)
        | Op::Special(_)
        | Op::Unary(..)
        | Op::Binary(..)
        | Op::Fma(..)
        | Op::Cmp(..)
        | Op::Select(..)
        | Op::Cvt(..)
        | Op::Bitcast(..)
        | Op::PtrAdd(..)
        | Op::PtrCast(..)
        | Op::SharedBase(_)
        | Op::DynSharedBase(_)
        | Op::Extract(..)
        | Op::MakeVector(_) => true,
        Op::Load { .. }
        | Op::Store { .. }
        | Op::Atomic { .. }
        | Op::Barrier
        | Op::Shfl { .. }
        | Op::Vote { .. }
        | Op::Mma { .. }
        | Op::LdMatrix { .. }
        | Op::CpAsync { .. }
        | Op::CpAsyncCommit
        | Op::CpAsyncWait(_)
        | Op::If { .. }
        | Op::For { .. } => false,
    }
}

/// Whether running `op` (with its regions) may change memory or synchronise the block.
pub(crate) fn writes_memory(k: &Kernel, op: &Op) -> bool {
    op.has_side_effects() || op.regions().iter().any(|&r| region_writes_memory(k, r))
}

pub(crate) fn region_writes_memory(k: &Kernel, r: RegionId) -> bool {
    k.region(r).insts.iter().any(|&id| writes_memory(k, &k.inst(id).op))
}

/// Append a new instruction defining one value of type `ty` to `out`.
pub(crate) fn push_value(
    k: &mut Kernel,
    out: &mut Vec<InstId>,
    op: Op,
    ty: Type,
    loc: &Option<Loc>,
) -> (InstId, Value) {
    let v = k.new_value(ty);
    let id = k.push_inst(Inst { op, results: vec![v], loc: loc.clone() });
    out.push(id);
    (id, v)
}

/// Append a `const` to `out`.
pub(crate) fn push_const(
    k: &mut Kernel,
    defs: &mut Defs,
    out: &mut Vec<InstId>,
    c: Constant,
    loc: &Option<Loc>,
) -> Value {
    let (id, v) = push_value(k, out, Op::Const(c), Type::Scalar(c.ty), loc);
    defs.set(v, id);
    v
}

/// Copy the instructions `insts` (with their regions) to fresh instructions and values,
/// renaming operands through `map`, which gains every value the copies define.
pub(crate) fn clone_insts(k: &mut Kernel, insts: &[InstId], map: &mut HashMap<Value, Value>) -> Vec<InstId> {
    insts.iter().map(|&id| clone_inst(k, id, map)).collect()
}

fn clone_inst(k: &mut Kernel, id: InstId, map: &mut HashMap<Value, Value>) -> InstId {
    let mut inst = k.inst(id).clone();
    for v in inst.op.operands_mut() {
        *v = map.get(v).copied().unwrap_or(*v);
    }
    match &mut inst.op {
        Op::If { then_region, else_region, .. } => {
            *then_region = clone_region(k, *then_region, map);
            *else_region = clone_region(k, *else_region, map);
        }
        Op::For { body, .. } => *body = clone_region(k, *body, map),
        _ => {}
    }
    for r in &mut inst.results {
        let fresh = k.new_value(k.ty(*r));
        map.insert(*r, fresh);
        *r = fresh;
    }
    k.push_inst(inst)
}

fn clone_region(k: &mut Kernel, r: RegionId, map: &mut HashMap<Value, Value>) -> RegionId {
    let old = k.region(r).clone();
    let params = old
        .params
        .iter()
        .map(|&p| {
            let fresh = k.new_value(k.ty(p));
            map.insert(p, fresh);
            fresh
        })
        .collect();
    let insts = clone_insts(k, &old.insts, map);
    let yields = old.yields.iter().map(|y| map.get(y).copied().unwrap_or(*y)).collect();
    let new = k.new_region();
    k.regions[new.index()] = Region { params, insts, yields };
    new
}

/// The all-ones constant of an integer or predicate type.
pub(crate) fn all_ones(t: ScalarType) -> Constant {
    Constant::new(t, u64::MAX)
}

/// The value of an integer constant as its type reads it (sign- or zero-extended).
pub(crate) fn int_value(c: Constant) -> i128 {
    if c.ty.is_signed_int() {
        c.as_i64() as i128
    } else {
        c.bits as i128
    }
}

/// The smallest and largest value of an integer type.
pub(crate) fn int_range(t: ScalarType) -> (i128, i128) {
    let bits = t.bits();
    if t.is_signed_int() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// The constant of integer type `t` holding `v` (wrapped to the width).
pub(crate) fn int_const(t: ScalarType, v: i128) -> Constant {
    Constant::new(t, v as u64)
}

/// The number of iterations of `for (iv = start; iv < end; iv += step)` with constant bounds,
/// when the loop ends without the induction variable wrapping around.
pub(crate) fn const_trip_count(start: Constant, end: Constant, step: Constant) -> Option<u64> {
    let t = start.ty;
    let (s, e, st) = (int_value(start), int_value(end), int_value(step));
    if s >= e {
        return Some(0);
    }
    if st <= 0 {
        return None;
    }
    let n = (e - s + st - 1) / st;
    // The increment after the last iteration must not wrap, or the loop would go on.
    (s + n * st <= int_range(t).1).then_some(n as u64)
}

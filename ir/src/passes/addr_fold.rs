//! `addr-fold`: address arithmetic in the form `ptradd(ptradd(base, variable), constant)`, so
//! that the backend can fold the constant into the memory instruction (`[reg+imm]`) and CSE can
//! share `ptradd(base, variable)` between accesses at different constant offsets.
//!
//! - `ptradd(ptradd(p, c1), c2)` becomes `ptradd(p, c1 + c2)`;
//! - `ptradd(p, add(i, c))` becomes `ptradd(ptradd(p, i), c)` when the two compute the same
//!   address: always for 64-bit indices (addresses wrap at 64 bits as the index does) and in
//!   32-bit address spaces (everything wraps at 32 bits), and for 32-bit indices into 64-bit
//!   spaces only when the value ranges prove that `i + c` does not wrap, since the index is
//!   sign- or zero-extended before it is scaled;
//! - `ptradd(ptradd(p, c), i)` becomes `ptradd(ptradd(p, i), c)` when the inner `ptradd` has no
//!   other use.
//!
//! The `add` form is rewritten only when the `add` has no other use or the address is used by
//! memory instructions alone (where the constant costs nothing), so no instruction is added.

use super::ranges::Ranges;
use super::util::{int_const, int_range, int_value, push_const, reachable_regions, Defs};
use super::Pass;
use crate::kernel::*;
use crate::types::{ScalarType, Type};

pub struct AddrFold;

impl Pass for AddrFold {
    fn name(&self) -> &'static str {
        "addr-fold"
    }
    fn description(&self) -> &'static str {
        "address arithmetic as ptradd(ptradd(base, i), constant), constant offsets combined, for [reg+imm] addressing"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let (uses, address_only) = uses(k);
        let mut a = Folder { defs: Defs::build(k), ranges: Ranges::compute(k), uses, address_only, k, changed: false };
        let body = a.k.body;
        a.region(body);
        a.changed
    }
}

/// Use counts, and whether each value is used only as the address of loads, stores and
/// atomics.
fn uses(k: &Kernel) -> (Vec<u32>, Vec<bool>) {
    let n = k.values.len();
    let (mut count, mut other) = (vec![0u32; n], vec![false; n]);
    for r in reachable_regions(k) {
        let region = k.region(r);
        for &id in &region.insts {
            let op = &k.inst(id).op;
            let address = match op {
                Op::Load { ptr, .. } | Op::Store { ptr, .. } | Op::Atomic { ptr, .. } => Some(*ptr),
                _ => None,
            };
            for (i, v) in op.operands().into_iter().enumerate() {
                count[v.index()] += 1;
                // The address is the first operand of every memory instruction.
                other[v.index()] |= !(i == 0 && address == Some(v));
            }
        }
        for y in &region.yields {
            count[y.index()] += 1;
            other[y.index()] = true;
        }
    }
    let address_only = count.iter().zip(&other).map(|(&c, &o)| c > 0 && !o).collect();
    (count, address_only)
}

struct Folder<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    ranges: Ranges,
    uses: Vec<u32>,
    address_only: Vec<bool>,
    changed: bool,
}

impl Folder<'_> {
    fn region(&mut self, r: RegionId) {
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            for sub in self.k.inst(id).op.regions() {
                self.region(sub);
            }
            self.inst(id, &mut out);
        }
        self.k.regions[r.index()].insts = out;
    }

    /// Rewrite `id` if it is a `ptradd`, appending what it needs and then itself to `out`.
    fn inst(&mut self, id: InstId, out: &mut Vec<InstId>) {
        for _ in 0..4 {
            if !self.step(id, out) {
                break;
            }
            self.changed = true;
        }
        out.push(id);
    }

    fn constant(&self, v: Value) -> Option<Constant> {
        self.defs.constant(self.k, v)
    }

    fn uses(&self, v: Value) -> u32 {
        self.uses.get(v.index()).copied().unwrap_or(0)
    }

    /// A new `ptradd(p, i)`, itself rewritten, appended to `out`.
    fn new_ptradd(&mut self, p: Value, i: Value, loc: &Option<Loc>, out: &mut Vec<InstId>) -> Value {
        let v = self.k.new_value(self.k.ty(p));
        let id = self.k.push_inst(Inst { op: Op::PtrAdd(p, i), results: vec![v], loc: loc.clone() });
        self.defs.set(v, id);
        self.inst(id, out);
        v
    }

    /// One rewrite of `id`; whether one applied.
    fn step(&mut self, id: InstId, out: &mut Vec<InstId>) -> bool {
        let inst = self.k.inst(id);
        let Op::PtrAdd(p, i) = inst.op else { return false };
        let (res, loc) = (inst.results[0], inst.loc.clone());
        let Type::Ptr(space, _) = self.k.ty(p) else { return false };
        let wide = space.pointer_bits();
        let inner = match self.defs.op(self.k, p) {
            Some(Op::PtrAdd(p0, i0)) => Some((*p0, *i0, self.constant(*i0))),
            _ => None,
        };
        if let Some(c2) = self.constant(i) {
            // ptradd(ptradd(p0, c1), c2) -> ptradd(p0, c1 + c2)
            let Some((p0, _, Some(c1))) = inner else { return false };
            let c = push_const(self.k, &mut self.defs, out, combine(c1, c2, wide), &loc);
            self.k.insts[id.index()].op = Op::PtrAdd(p0, c);
            return true;
        }
        // ptradd(p, add(x, c)) -> ptradd(ptradd(p, x), c)
        if let Some(Op::Binary(BinaryOp::Add, x, y)) = self.defs.op(self.k, i).cloned() {
            let split = match (self.constant(x), self.constant(y)) {
                (None, Some(c)) => Some((x, y, c)),
                (Some(c), None) => Some((y, x, c)),
                _ => None,
            };
            if let Some((x, c_value, c)) = split {
                let cheap = self.uses(i) == 1 || self.address_only.get(res.index()).copied().unwrap_or(false);
                if cheap && self.no_wrap(x, c, wide) {
                    let q = self.new_ptradd(p, x, &loc, out);
                    self.k.insts[id.index()].op = Op::PtrAdd(q, c_value);
                    return true;
                }
            }
        }
        // ptradd(ptradd(p0, c), i) -> ptradd(ptradd(p0, i), c)
        if let Some((p0, c_value, Some(_))) = inner {
            if self.uses(p) == 1 {
                let q = self.new_ptradd(p0, i, &loc, out);
                self.k.insts[id.index()].op = Op::PtrAdd(q, c_value);
                return true;
            }
        }
        false
    }

    /// Whether extending `x + c` (in the index type) to 64 bits equals extending `x` and `c`
    /// and adding, as far as addresses of `wide` bits can tell.
    fn no_wrap(&self, x: Value, c: Constant, wide: u32) -> bool {
        let t = c.ty;
        if wide == 32 || t.bits() == 64 {
            return true;
        }
        let (lo, hi) = self.ranges.get(self.k, x);
        let (min, max) = int_range(t);
        let c = int_value(c);
        lo + c >= min && hi + c <= max
    }
}

/// The constant index of `ptradd(ptradd(p, c1), c2)` folded into one `ptradd`.
fn combine(c1: Constant, c2: Constant, wide: u32) -> Constant {
    let sum = int_value(c1) + int_value(c2);
    let (min, max) = int_range(c2.ty);
    if c1.ty == c2.ty && (min..=max).contains(&sum) {
        Constant::new(c2.ty, sum as u64)
    } else if wide == 32 {
        // Addresses wrap at 32 bits: any index congruent modulo 2^32 will do.
        int_const(c2.ty, sum)
    } else {
        int_const(ScalarType::I64, sum)
    }
}

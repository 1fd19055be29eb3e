//! `fold`: constant folding.
//!
//! A pure operation whose operands are all constants becomes the constant the interpreter
//! computes for it (see [`super::eval`]), except PTX's approximate functions, whose hardware
//! results differ from the interpreter's within an error bound, and integer divisions by zero,
//! left to fail at run time. A `select` on a constant condition becomes the chosen operand, an
//! `if` on a constant condition is replaced by the instructions of the branch taken, and a loop
//! with constant bounds that never runs by its initial values.

use super::eval::eval;
use super::util::{const_trip_count, Defs, Subst};
use super::Pass;
use crate::kernel::*;

pub struct Fold;

impl Pass for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }
    fn description(&self) -> &'static str {
        "constant folding: pure ops on constants (as the interpreter computes them), select/if on constant conditions, loops that never run"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut f = Folder { defs: Defs::build(k), k, subst: Subst::default(), changed: false };
        let body = f.k.body;
        f.region(body);
        f.changed
    }
}

struct Folder<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    subst: Subst,
    changed: bool,
}

impl Folder<'_> {
    fn region(&mut self, r: RegionId) {
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            self.inst(id, &mut out);
        }
        self.k.regions[r.index()].insts = out;
        self.subst.rewrite_yields(self.k, r);
    }

    fn constant(&self, v: Value) -> Option<Constant> {
        self.defs.constant(self.k, v)
    }

    fn inst(&mut self, id: InstId, out: &mut Vec<InstId>) {
        self.subst.rewrite_inst(self.k, id);
        let (op, results) = (self.k.inst(id).op.clone(), self.k.inst(id).results.clone());
        match op {
            Op::If { cond, then_region, else_region } => {
                let Some(c) = self.constant(cond) else {
                    self.region(then_region);
                    self.region(else_region);
                    out.push(id);
                    return;
                };
                // Inline the branch taken: its instructions join the enclosing region, its
                // yields replace the results.
                let taken = if c.bits != 0 { then_region } else { else_region };
                let insts = std::mem::take(&mut self.k.regions[taken.index()].insts);
                for i in insts {
                    self.inst(i, out);
                }
                self.subst.rewrite_yields(self.k, taken);
                for (r, y) in results.iter().zip(self.k.region(taken).yields.clone()) {
                    self.subst.insert(*r, y);
                }
                self.changed = true;
            }
            Op::For { start, end, step, init, body } => {
                let bounds = (self.constant(start), self.constant(end), self.constant(step));
                if let (Some(s), Some(e), Some(st)) = bounds {
                    if const_trip_count(s, e, st) == Some(0) {
                        for (r, i) in results.into_iter().zip(init) {
                            self.subst.insert(r, i);
                        }
                        self.changed = true;
                        return;
                    }
                }
                self.region(body);
                out.push(id);
            }
            Op::Select(c, a, b) if self.constant(c).is_some() => {
                let chosen = if self.constant(c).is_some_and(|c| c.bits != 0) { a } else { b };
                self.subst.insert(results[0], chosen);
                self.changed = true;
            }
            op @ (Op::Unary(..)
            | Op::Binary(..)
            | Op::Fma(..)
            | Op::Cmp(..)
            | Op::Select(..)
            | Op::Cvt(..)
            | Op::Bitcast(..)) => {
                if let Op::Unary(u, _) = op {
                    if u.is_approx() {
                        out.push(id);
                        return;
                    }
                }
                let args: Option<Vec<Constant>> = op.operands().into_iter().map(|v| self.constant(v)).collect();
                let result = self.k.ty(results[0]).scalar();
                if let (Some(args), Some(result)) = (args, result) {
                    if let Some(c) = eval(&op, &args, result) {
                        self.k.insts[id.index()].op = Op::Const(c);
                        self.changed = true;
                    }
                }
                out.push(id);
            }
            _ => out.push(id),
        }
    }
}

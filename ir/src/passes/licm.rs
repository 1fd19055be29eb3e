//! `licm`: loop-invariant code motion out of `for` bodies.
//!
//! An instruction at the top level of a loop body moves in front of the loop when its operands
//! are defined outside the loop (or by instructions already moved) and running it there cannot
//! change the result: pure operations that cannot fail (integer division only by a non-zero
//! constant). A load moves only when the loop writes no memory at all (no store, atomic or
//! barrier), its constant bounds prove that the first iteration runs (so every lane that
//! reaches the loop performs the load anyway), and no instruction before it in the body that
//! stays could fail first. Shuffles and votes depend on which lanes are active and never move,
//! and neither do `ptradd`s by a constant, which the backend folds into the memory instruction.
//! Inner loops are processed first, so invariants climb out of nests.

use std::collections::HashSet;

use super::util::{const_trip_count, is_speculatable, region_writes_memory, Defs};
use super::Pass;
use crate::kernel::*;

pub struct Licm;

impl Pass for Licm {
    fn name(&self) -> &'static str {
        "licm"
    }
    fn description(&self) -> &'static str {
        "loop-invariant code motion: pure ops, and loads of loops that write no memory and surely run"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut l = Hoister { defs: Defs::build(k), k, changed: false };
        let body = l.k.body;
        l.region(body);
        l.changed
    }
}

struct Hoister<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    changed: bool,
}

/// Every value a region defines, nested regions included.
fn defined_in(k: &Kernel, r: RegionId, out: &mut HashSet<Value>) {
    let region = k.region(r);
    out.extend(region.params.iter().copied());
    for &id in &region.insts {
        let inst = k.inst(id);
        out.extend(inst.results.iter().copied());
        for sub in inst.op.regions() {
            defined_in(k, sub, out);
        }
    }
}

impl Hoister<'_> {
    fn region(&mut self, r: RegionId) {
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            for sub in self.k.inst(id).op.regions() {
                self.region(sub);
            }
            if let Op::For { start, end, step, body, .. } = self.k.inst(id).op {
                self.hoist(start, end, step, body, &mut out);
            }
            out.push(id);
        }
        self.k.regions[r.index()].insts = out;
    }

    /// Move the invariant instructions of `body` to `out` (in front of the loop).
    fn hoist(&mut self, start: Value, end: Value, step: Value, body: RegionId, out: &mut Vec<InstId>) {
        let k = &*self.k;
        let mut inside = HashSet::new();
        defined_in(k, body, &mut inside);
        let runs = match (self.defs.constant(k, start), self.defs.constant(k, end), self.defs.constant(k, step)) {
            (Some(s), Some(e), Some(st)) => const_trip_count(s, e, st).is_some_and(|n| n > 0),
            _ => false,
        };
        let loads_may_move = runs && !region_writes_memory(k, body);
        // Once an instruction that may fail stays in the body, nothing that may fail moves
        // before it.
        let mut may_fail_stayed = false;
        let insts = k.region(body).insts.clone();
        let mut moves = vec![false; insts.len()];
        for (m, &id) in moves.iter_mut().zip(&insts) {
            let op = &k.inst(id).op;
            let invariant = op.operands().iter().all(|v| !inside.contains(v));
            let safe = is_speculatable(k, &self.defs, op);
            let movable_load = matches!(op, Op::Load { .. }) && loads_may_move && !may_fail_stayed;
            *m = invariant && (safe || movable_load);
            if *m {
                for r in &k.inst(id).results {
                    inside.remove(r);
                }
            } else {
                may_fail_stayed |= !safe;
            }
        }
        // `ptradd(p, constant)` costs nothing next to its memory instruction (`[reg+imm]`): out
        // of the loop it would only hold a register. It moves only for a user that moves.
        let mut used_outside: HashSet<Value> = HashSet::new();
        for i in (0..insts.len()).rev() {
            let op = &k.inst(insts[i]).op;
            let addressing = matches!(op, Op::PtrAdd(_, c) if self.defs.constant(k, *c).is_some());
            if moves[i] && addressing && !k.inst(insts[i]).results.iter().any(|r| used_outside.contains(r)) {
                moves[i] = false;
            }
            if moves[i] {
                used_outside.extend(op.operands());
            }
        }
        let mut kept = vec![];
        for (m, id) in moves.into_iter().zip(insts) {
            if m {
                out.push(id);
                self.changed = true;
            } else {
                kept.push(id);
            }
        }
        self.k.regions[body.index()].insts = kept;
    }
}

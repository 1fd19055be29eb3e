//! `dce`: dead-code elimination by marking what is live.
//!
//! Live are the instructions that touch memory, synchronise or may fail (stores, atomics,
//! barriers, loads, shuffles and votes, integer divisions without a non-zero constant divisor),
//! loops not proven to end, and everything these need: operands, enclosing `if`s and loops,
//! the yields behind a live result. The rest goes, including unused `if` results, unused
//! loop-carried values (with the computation feeding only them), and `if`s and loops left with
//! nothing to do. A loop ends for sure when its step is a positive constant `s` and its end
//! is at most `max - s + 1` of the induction type, so that the induction variable cannot wrap.

use super::ranges::Ranges;
use super::util::{int_range, int_value, is_speculatable, Defs};
use super::Pass;
use crate::kernel::*;

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }
    fn description(&self) -> &'static str {
        "dead-code elimination: unused pure values, if results, loop-carried values, empty ifs and finite loops"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let live = Liveness::mark(k);
        live.sweep(k)
    }
}

/// Where a value comes from.
#[derive(Clone, Copy)]
enum Site {
    Kernel,
    Result(InstId, usize),
    /// Parameter `usize` of the body of a `for` (0 is the induction variable).
    LoopParam(InstId, usize),
}

enum Work {
    Inst(InstId),
    Value(Value),
}

struct Liveness {
    site: Vec<Site>,
    /// The `if` or `for` whose region holds each instruction.
    parent: Vec<Option<InstId>>,
    inst: Vec<bool>,
    value: Vec<bool>,
}

/// Whether a loop provably ends: a positive constant step `s` and an end of at most
/// `max - s + 1`, so that `iv < end` fails before `iv += s` can wrap.
fn terminates(k: &Kernel, defs: &Defs, ranges: &Ranges, end: Value, step: Value) -> bool {
    let Some(s) = defs.constant(k, step).map(int_value) else { return false };
    let max = int_range(k.ty(step).elem()).1;
    s > 0 && ranges.get(k, end).1 <= max - s + 1
}

impl Liveness {
    fn mark(k: &Kernel) -> Liveness {
        let mut l = Liveness {
            site: vec![Site::Kernel; k.values.len()],
            parent: vec![None; k.insts.len()],
            inst: vec![false; k.insts.len()],
            value: vec![false; k.values.len()],
        };
        let defs = Defs::build(k);
        let ranges = Ranges::compute(k);
        let mut work = vec![];
        l.index(k, k.body, None);
        k.walk(|id, inst| {
            let root = match &inst.op {
                Op::If { .. } => false,
                Op::For { end, step, .. } => !terminates(k, &defs, &ranges, *end, *step),
                op => !is_speculatable(k, &defs, op),
            };
            if root {
                work.push(Work::Inst(id));
            }
        });
        while let Some(w) = work.pop() {
            match w {
                Work::Inst(id) => l.inst_live(k, id, &mut work),
                Work::Value(v) => l.value_live(k, v, &mut work),
            }
        }
        l
    }

    fn index(&mut self, k: &Kernel, r: RegionId, parent: Option<InstId>) {
        for &id in &k.region(r).insts {
            let inst = k.inst(id);
            self.parent[id.index()] = parent;
            for (i, &res) in inst.results.iter().enumerate() {
                self.site[res.index()] = Site::Result(id, i);
            }
            if let Op::For { body, .. } = inst.op {
                for (i, &p) in k.region(body).params.iter().enumerate() {
                    self.site[p.index()] = Site::LoopParam(id, i);
                }
            }
            for sub in inst.op.regions() {
                self.index(k, sub, Some(id));
            }
        }
    }

    fn inst_live(&mut self, k: &Kernel, id: InstId, work: &mut Vec<Work>) {
        if std::mem::replace(&mut self.inst[id.index()], true) {
            return;
        }
        match &k.inst(id).op {
            Op::If { cond, .. } => work.push(Work::Value(*cond)),
            Op::For { start, end, step, .. } => work.extend([*start, *end, *step].map(Work::Value)),
            op => work.extend(op.operands().into_iter().map(Work::Value)),
        }
        if let Some(p) = self.parent[id.index()] {
            work.push(Work::Inst(p));
        }
    }

    fn value_live(&mut self, k: &Kernel, v: Value, work: &mut Vec<Work>) {
        if std::mem::replace(&mut self.value[v.index()], true) {
            return;
        }
        let (id, slot) = match self.site[v.index()] {
            Site::Kernel | Site::LoopParam(_, 0) => return,
            Site::Result(id, i) => (id, i),
            // A carried value read in the body keeps its whole slot.
            Site::LoopParam(id, i) => (id, i - 1),
        };
        work.push(Work::Inst(id));
        let inst = k.inst(id);
        match &inst.op {
            Op::If { then_region, else_region, .. } => {
                work.push(Work::Value(k.region(*then_region).yields[slot]));
                work.push(Work::Value(k.region(*else_region).yields[slot]));
            }
            Op::For { init, body, .. } => {
                let region = k.region(*body);
                work.extend(
                    [init[slot], region.yields[slot], region.params[slot + 1], inst.results[slot]].map(Work::Value),
                );
            }
            _ => {}
        }
    }

    /// Remove what is not live; whether anything was.
    fn sweep(&self, k: &mut Kernel) -> bool {
        let body = k.body;
        self.sweep_region(k, body)
    }

    fn sweep_region(&self, k: &mut Kernel, r: RegionId) -> bool {
        let insts = std::mem::take(&mut k.regions[r.index()].insts);
        let before = insts.len();
        let mut changed = false;
        let mut out = Vec::with_capacity(before);
        for id in insts {
            if !self.inst[id.index()] {
                continue;
            }
            out.push(id);
            // Results of control flow can go one by one; other instructions keep theirs.
            let control = matches!(k.inst(id).op, Op::If { .. } | Op::For { .. });
            let keep: Vec<bool> = k.inst(id).results.iter().map(|v| self.value[v.index()]).collect();
            if control && keep.contains(&false) {
                changed = true;
                let kept = |list: &mut Vec<Value>| {
                    let mut i = 0;
                    list.retain(|_| {
                        i += 1;
                        keep[i - 1]
                    });
                };
                let inst = &mut k.insts[id.index()];
                kept(&mut inst.results);
                match &mut inst.op {
                    Op::If { then_region, else_region, .. } => {
                        let (t, e) = (*then_region, *else_region);
                        kept(&mut k.regions[t.index()].yields);
                        kept(&mut k.regions[e.index()].yields);
                    }
                    Op::For { init, body, .. } => {
                        kept(init);
                        let region = &mut k.regions[body.index()];
                        kept(&mut region.yields);
                        let iv = region.params[0];
                        region.params.remove(0);
                        kept(&mut region.params);
                        region.params.insert(0, iv);
                    }
                    _ => {}
                }
            }
            for sub in k.inst(id).op.regions() {
                changed |= self.sweep_region(k, sub);
            }
        }
        changed |= out.len() != before;
        k.regions[r.index()].insts = out;
        changed
    }
}

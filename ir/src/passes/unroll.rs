//! `unroll`: unrolling of loops with constant bounds.
//!
//! The trip count is exact: the bounds and step are constants and the induction variable does
//! not wrap before the loop ends (see [`const_trip_count`]). A loop of at most
//! [`FULL_MAX_TRIPS`] iterations whose copies total at most [`FULL_MAX_INSTS`] instructions is
//! replaced by one copy of its body per iteration, the induction variable a constant in each,
//! the carried values threaded from copy to copy. A longer loop with a body of at most
//! [`PARTIAL_MAX_BODY`] instructions runs [`PARTIAL_FACTOR`] copies per iteration of a loop
//! with a step `PARTIAL_FACTOR` times larger, followed by the remaining iterations as copies.
//! Inner loops are unrolled first.

use std::collections::HashMap;

use super::util::{
    clone_insts, const_trip_count, int_const, int_range, int_value, push_const, push_value, region_size, Defs, Subst,
};
use super::Pass;
use crate::kernel::*;
use crate::types::Type;

/// Most iterations a loop may have to be unrolled fully.
pub const FULL_MAX_TRIPS: u64 = 16;
/// Most instructions the copies of a fully unrolled loop may hold together.
pub const FULL_MAX_INSTS: usize = 1024;
/// Copies of the body per iteration of a partially unrolled loop.
pub const PARTIAL_FACTOR: u64 = 4;
/// Largest body (in instructions) that is partially unrolled.
pub const PARTIAL_MAX_BODY: usize = 64;

pub struct Unroll;

impl Pass for Unroll {
    fn name(&self) -> &'static str {
        "unroll"
    }
    fn description(&self) -> &'static str {
        "unrolling of constant-trip loops: fully up to 16 iterations, else by 4 with the remainder as copies"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut u = Unroller { defs: Defs::build(k), k, subst: Subst::default(), changed: false };
        let body = u.k.body;
        u.region(body);
        u.changed
    }
}

struct Unroller<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    subst: Subst,
    changed: bool,
}

/// A constant-trip loop.
struct Loop {
    start_value: Value,
    start: Constant,
    step: Constant,
    trips: u64,
    init: Vec<Value>,
    body: RegionId,
    results: Vec<Value>,
    loc: Option<Loc>,
}

impl Unroller<'_> {
    fn region(&mut self, r: RegionId) {
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            self.subst.rewrite_inst(self.k, id);
            for sub in self.k.inst(id).op.regions() {
                self.region(sub);
            }
            match self.constant_loop(id) {
                Some(l) if self.unroll(&l, &mut out) => self.changed = true,
                _ => out.push(id),
            }
        }
        self.k.regions[r.index()].insts = out;
        self.subst.rewrite_yields(self.k, r);
    }

    fn constant_loop(&self, id: InstId) -> Option<Loop> {
        let inst = self.k.inst(id);
        let Op::For { start: start_value, end, step, init, body } = &inst.op else { return None };
        let c = |v: Value| self.defs.constant(self.k, v);
        let (start, end, step) = (c(*start_value)?, c(*end)?, c(*step)?);
        Some(Loop {
            start_value: *start_value,
            start,
            step,
            trips: const_trip_count(start, end, step)?,
            init: init.clone(),
            body: *body,
            results: inst.results.clone(),
            loc: inst.loc.clone(),
        })
    }

    /// Replace the loop by unrolled code appended to `out`; whether it did.
    fn unroll(&mut self, l: &Loop, out: &mut Vec<InstId>) -> bool {
        let size = region_size(self.k, l.body);
        let t = l.start.ty;
        let iv_at = |j: u64| int_const(t, int_value(l.start) + j as i128 * int_value(l.step));
        if l.trips <= FULL_MAX_TRIPS && l.trips as usize * size <= FULL_MAX_INSTS {
            let mut carried = l.init.clone();
            for j in 0..l.trips {
                let iv = push_const(self.k, &mut self.defs, out, iv_at(j), &l.loc);
                carried = self.copy_body(l.body, iv, &carried, out);
            }
            for (r, v) in l.results.iter().zip(carried) {
                self.subst.insert(*r, v);
            }
            return true;
        }
        let factor_step = int_value(l.step) * PARTIAL_FACTOR as i128;
        let main_trips = l.trips - l.trips % PARTIAL_FACTOR;
        if size > PARTIAL_MAX_BODY || main_trips < 2 * PARTIAL_FACTOR || factor_step > int_range(t).1 {
            return false;
        }
        // for (iv = start; iv < start + main_trips * step; iv += 4 * step) { body(iv) ... body(iv + 3 * step) }
        let main_end = push_const(self.k, &mut self.defs, out, iv_at(main_trips), &l.loc);
        let main_step = push_const(self.k, &mut self.defs, out, int_const(t, factor_step), &l.loc);
        let body = self.k.new_region();
        let iv = self.k.new_value(Type::Scalar(t));
        let params: Vec<Value> = l.init.iter().map(|v| self.k.new_value(self.k.ty(*v))).collect();
        let mut body_insts = vec![];
        let mut carried = params.clone();
        for j in 0..PARTIAL_FACTOR {
            let iv_j = if j == 0 {
                iv
            } else {
                let offset = int_const(t, j as i128 * int_value(l.step));
                let offset = push_const(self.k, &mut self.defs, &mut body_insts, offset, &l.loc);
                let (def, v) =
                    push_value(self.k, &mut body_insts, Op::Binary(BinaryOp::Add, iv, offset), Type::Scalar(t), &l.loc);
                self.defs.set(v, def);
                v
            };
            carried = self.copy_body(l.body, iv_j, &carried, &mut body_insts);
        }
        let mut all_params = vec![iv];
        all_params.extend(&params);
        self.k.regions[body.index()] = Region { params: all_params, insts: body_insts, yields: carried };
        let results: Vec<Value> = l.init.iter().map(|v| self.k.new_value(self.k.ty(*v))).collect();
        let main = Op::For { start: l.start_value, end: main_end, step: main_step, init: l.init.clone(), body };
        out.push(self.k.push_inst(Inst { op: main, results: results.clone(), loc: l.loc.clone() }));
        let mut carried = results;
        for j in main_trips..l.trips {
            let iv = push_const(self.k, &mut self.defs, out, iv_at(j), &l.loc);
            carried = self.copy_body(l.body, iv, &carried, out);
        }
        for (r, v) in l.results.iter().zip(carried) {
            self.subst.insert(*r, v);
        }
        true
    }

    /// Append a copy of the loop body for induction value `iv` and carried values `carried` to
    /// `out`; return the values it yields.
    fn copy_body(&mut self, body: RegionId, iv: Value, carried: &[Value], out: &mut Vec<InstId>) -> Vec<Value> {
        let region = self.k.region(body).clone();
        let mut map: HashMap<Value, Value> = HashMap::new();
        map.insert(region.params[0], iv);
        for (p, v) in region.params[1..].iter().zip(carried) {
            map.insert(*p, *v);
        }
        let copies = clone_insts(self.k, &region.insts, &mut map);
        for &c in &copies {
            for sub in self.k.inst(c).op.regions() {
                self.index_defs(sub);
            }
            for r in self.k.inst(c).results.clone() {
                self.defs.set(r, c);
            }
        }
        out.extend(copies);
        region.yields.iter().map(|y| map.get(y).copied().unwrap_or(*y)).collect()
    }

    fn index_defs(&mut self, r: RegionId) {
        for id in self.k.region(r).insts.clone() {
            for res in self.k.inst(id).results.clone() {
                self.defs.set(res, id);
            }
            for sub in self.k.inst(id).op.regions() {
                self.index_defs(sub);
            }
        }
    }
}

//! `vectorize`: adjacent scalar loads merged into one vector load.
//!
//! Loads in one region from `ptradd(base, k)`, `ptradd(base, k+1)` (, `k+2`, `k+3`) of the same
//! `base` become one load of 4 (or 2) lanes at the position of the earliest, each original load
//! an `extract` of it, when
//! - no store, atomic or barrier (nor an `if` or loop holding one) lies between them, so they
//!   read the same memory wherever they run;
//! - the vector's address is provably aligned to its size: `k` is a multiple of the lane count
//!   and `base` is aligned to the vector's size in bytes, known for a static shared array of
//!   sufficient `align`, the dynamic shared window (16 bytes), and `ptradd`s of those by
//!   indices with enough known trailing zero bits;
//! - the vector has at most 16 bytes (PTX's widest access).
//!
//! The loads succeed exactly when the vector load does (the same lanes read the same bytes,
//! aligned), and read the same values. When they fail (out of bounds, a shared-memory race),
//! the vector load fails instead, and its error names it rather than the first failing scalar
//! load.

use std::collections::{BTreeMap, HashMap};

use super::util::{writes_memory, Defs};
use super::Pass;
use crate::kernel::*;
use crate::types::Type;

pub struct Vectorize;

impl Pass for Vectorize {
    fn name(&self) -> &'static str {
        "vectorize"
    }
    fn description(&self) -> &'static str {
        "adjacent aligned scalar loads of one base merged into a vector load and extracts"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut v = Vectorizer { defs: Defs::build(k), iv_of: HashMap::new(), k, changed: false };
        v.index_loops();
        let body = v.k.body;
        v.region(body);
        v.changed
    }
}

/// The widest access PTX has, in bytes.
const MAX_VECTOR_BYTES: u32 = 16;

struct Vectorizer<'k> {
    k: &'k mut Kernel,
    defs: Defs,
    /// Induction variables: (start, step) of their loop.
    iv_of: HashMap<Value, (Value, Value)>,
    changed: bool,
}

/// A scalar load in the region being scanned.
struct Candidate {
    id: InstId,
    ptr: Value,
}

impl Vectorizer<'_> {
    fn index_loops(&mut self) {
        let k = &*self.k;
        let mut iv_of = HashMap::new();
        k.walk(|_, inst| {
            if let Op::For { start, step, body, .. } = &inst.op {
                if let Some(&iv) = k.region(*body).params.first() {
                    iv_of.insert(iv, (*start, *step));
                }
            }
        });
        self.iv_of = iv_of;
    }

    fn region(&mut self, r: RegionId) {
        for id in self.k.region(r).insts.clone() {
            for sub in self.k.inst(id).op.regions() {
                self.region(sub);
            }
        }
        let insts = self.k.region(r).insts.clone();
        // Segments between instructions that may write memory.
        let mut groups: Vec<Vec<(InstId, u8)>> = vec![];
        let mut segment: Vec<Candidate> = vec![];
        for &id in &insts {
            let op = &self.k.inst(id).op;
            match op {
                Op::Load { ptr, lanes: 1 } => segment.push(Candidate { id, ptr: *ptr }),
                op if writes_memory(self.k, op) => groups.extend(self.groups(std::mem::take(&mut segment))),
                _ => {}
            }
        }
        groups.extend(self.groups(segment));
        if groups.is_empty() {
            return;
        }
        self.changed = true;
        let position: HashMap<InstId, usize> = insts.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let mut before: HashMap<usize, Vec<InstId>> = HashMap::new();
        for group in groups {
            let first = group.iter().map(|(id, _)| position[id]).min().unwrap_or(0);
            let (lead, _) = group[0];
            let lead_ptr = match self.k.inst(lead).op {
                Op::Load { ptr, .. } => ptr,
                _ => continue,
            };
            let new = before.entry(first).or_default();
            // The lead's address, where the vector load goes: reuse it when it is defined by then.
            let ptr = match self.defs.get(lead_ptr).and_then(|d| position.get(&d)) {
                Some(&p) if p >= first => {
                    let def = self.defs.get(lead_ptr).map(|d| self.k.inst(d).clone());
                    let Some(Inst { op: Op::PtrAdd(base, index), loc, .. }) = def else { continue };
                    let index = match self.defs.op(self.k, index) {
                        Some(Op::Const(c)) => *c,
                        _ => continue,
                    };
                    let (cid, c) = super::util::push_value(self.k, new, Op::Const(index), Type::Scalar(index.ty), &loc);
                    self.defs.set(c, cid);
                    let (pid, p) = super::util::push_value(self.k, new, Op::PtrAdd(base, c), self.k.ty(lead_ptr), &loc);
                    self.defs.set(p, pid);
                    p
                }
                _ => lead_ptr,
            };
            let Type::Ptr(_, elem) = self.k.ty(ptr) else { continue };
            let lanes = group.len() as u8;
            let loc = self.k.inst(lead).loc.clone();
            let (_, vector) =
                super::util::push_value(self.k, new, Op::Load { ptr, lanes }, Type::Vector(elem, lanes), &loc);
            for (id, lane) in group {
                self.k.insts[id.index()].op = Op::Extract(vector, lane);
            }
        }
        let mut out = Vec::with_capacity(insts.len() + before.len() * 3);
        for (pos, id) in insts.into_iter().enumerate() {
            if let Some(new) = before.remove(&pos) {
                out.extend(new);
            }
            out.push(id);
        }
        self.k.regions[r.index()].insts = out;
    }

    /// `ptr` as `base + offset` elements.
    fn split(&self, ptr: Value) -> (Value, i128) {
        match self.defs.op(self.k, ptr) {
            Some(Op::PtrAdd(base, i)) => match self.defs.constant(self.k, *i) {
                Some(c) => (*base, super::util::int_value(c)),
                None => (ptr, 0),
            },
            _ => (ptr, 0),
        }
    }

    /// Groups of loads to merge: each lists (load, lane), the lead (lane 0) first.
    fn groups(&self, segment: Vec<Candidate>) -> Vec<Vec<(InstId, u8)>> {
        let mut by_base: BTreeMap<Value, BTreeMap<i128, &Candidate>> = BTreeMap::new();
        for c in &segment {
            let (base, offset) = self.split(c.ptr);
            by_base.entry(base).or_default().entry(offset).or_insert(c);
        }
        let mut out = vec![];
        for (base, mut loads) in by_base {
            let Type::Ptr(_, elem) = self.k.ty(base) else { continue };
            let align = self.align(base, 8);
            for lanes in [4u32, 2] {
                let bytes = lanes * elem.bytes();
                if bytes > MAX_VECTOR_BYTES || align < bytes as u64 {
                    continue;
                }
                let starts: Vec<i128> = loads.keys().copied().filter(|o| o.rem_euclid(lanes as i128) == 0).collect();
                for start in starts {
                    let members: Option<Vec<&Candidate>> =
                        (0..lanes as i128).map(|j| loads.get(&(start + j)).copied()).collect();
                    let Some(members) = members else { continue };
                    // The lead is the load at `start`; its lanes follow in order.
                    out.push(members.iter().enumerate().map(|(j, c)| (c.id, j as u8)).collect());
                    for j in 0..lanes as i128 {
                        loads.remove(&(start + j));
                    }
                }
            }
        }
        out
    }

    /// A power of two the address `ptr` is known to be a multiple of, in bytes.
    fn align(&self, ptr: Value, depth: u32) -> u64 {
        let Type::Ptr(_, elem) = self.k.ty(ptr) else { return 1 };
        if depth == 0 {
            return 1;
        }
        match self.defs.op(self.k, ptr) {
            Some(Op::SharedBase(s)) => self.k.shared.get(s.index()).map_or(1, |d| d.align as u64),
            Some(Op::DynSharedBase(_)) => DYNAMIC_SHARED_ALIGN as u64,
            Some(Op::PtrAdd(q, i)) => {
                let step = (elem.bytes() as u64) << self.trailing_zeros(*i, 8).min(32);
                self.align(*q, depth - 1).min(step)
            }
            Some(Op::PtrCast(q, _)) => self.align(*q, depth - 1),
            _ => 1,
        }
    }

    /// Low bits known to be zero in an integer value.
    fn trailing_zeros(&self, v: Value, depth: u32) -> u32 {
        let bits = self.k.ty(v).elem().bits();
        if depth == 0 {
            return 0;
        }
        let tz = |v: Value| self.trailing_zeros(v, depth - 1);
        if let Some(&(start, step)) = self.iv_of.get(&v) {
            return tz(start).min(tz(step));
        }
        let n = match self.defs.op(self.k, v) {
            Some(Op::Const(c)) => {
                if c.bits == 0 {
                    bits
                } else {
                    c.bits.trailing_zeros()
                }
            }
            Some(Op::Binary(op, a, b)) => match op {
                BinaryOp::Mul => tz(*a) + tz(*b),
                BinaryOp::Shl => match self.defs.constant(self.k, *b) {
                    Some(c) => tz(*a).saturating_add(c.bits.min(64) as u32),
                    None => 0,
                },
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Or | BinaryOp::Xor => tz(*a).min(tz(*b)),
                BinaryOp::And => tz(*a).max(tz(*b)),
                _ => 0,
            },
            Some(Op::Fma(a, b, c)) => (tz(*a) + tz(*b)).min(tz(*c)),
            Some(Op::Select(_, a, b)) => tz(*a).min(tz(*b)),
            // Extensions and truncations keep the low bits; saturation does not.
            Some(Op::Cvt(a, cvt)) if !cvt.sat && cvt.to.is_int() && self.k.ty(*a).elem().is_int() => tz(*a),
            _ => 0,
        };
        n.min(bits)
    }
}

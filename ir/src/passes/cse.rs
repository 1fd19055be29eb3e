//! `cse`: common-subexpression elimination (global value numbering over the region tree).
//!
//! A value defined in a region is visible in the regions nested after it, and those run on a
//! subset of its lanes, so an instruction equal to one seen earlier in an enclosing scope takes
//! its result. Pure operations, special registers and integer divisions merge (a division that
//! would fail has failed at the first one already). A load merges with an earlier load of the
//! same address only when no store, atomic or barrier can run between them: every such
//! instruction, and every loop whose body holds one, starts a new memory epoch. Atomics,
//! shuffles, votes and control flow never merge.

use std::collections::HashMap;

use super::util::{region_writes_memory, Subst};
use super::Pass;
use crate::kernel::*;
use crate::types::{ScalarType, Type};

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn description(&self) -> &'static str {
        "common-subexpression elimination over the region tree (loads only within one memory epoch)"
    }
    fn run(&self, k: &mut Kernel) -> bool {
        let mut c =
            Numbering { k, table: HashMap::new(), log: vec![], epoch: 0, subst: Subst::default(), changed: false };
        let body = c.k.body;
        c.region(body);
        c.changed
    }
}

/// The identity of a computation: the operation with operands in a canonical order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Const(Constant),
    Special(SpecialReg),
    Unary(UnaryOp, Value),
    Binary(BinaryOp, Value, Value),
    Fma(Value, Value, Value),
    Cmp(CmpOp, Value, Value),
    Select(Value, Value, Value),
    Cvt(Value, Cvt),
    Bitcast(Value, ScalarType),
    PtrAdd(Value, Value),
    PtrCast(Value, ScalarType),
    SharedBase(SharedId),
    DynSharedBase(ScalarType),
    Extract(Value, u8),
    MakeVector(Vec<Value>),
    Load { ptr: Value, lanes: u8, epoch: u64 },
}

fn ordered(a: Value, b: Value) -> (Value, Value) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

fn key(op: &Op, epoch: u64) -> Option<Key> {
    use BinaryOp::*;
    Some(match op.clone() {
        Op::Const(c) => Key::Const(c),
        Op::Special(s) => Key::Special(s),
        Op::Unary(u, a) => Key::Unary(u, a),
        Op::Binary(b @ (Add | Mul | Min | Max | And | Or | Xor), x, y) => {
            let (x, y) = ordered(x, y);
            Key::Binary(b, x, y)
        }
        Op::Binary(b, x, y) => Key::Binary(b, x, y),
        Op::Fma(a, b, c) => {
            let (a, b) = ordered(a, b);
            Key::Fma(a, b, c)
        }
        Op::Cmp(c @ (CmpOp::Eq | CmpOp::Ne | CmpOp::Neu | CmpOp::Nan), a, b) => {
            let (a, b) = ordered(a, b);
            Key::Cmp(c, a, b)
        }
        // `a > b` is `b < a`.
        Op::Cmp(CmpOp::Gt, a, b) => Key::Cmp(CmpOp::Lt, b, a),
        Op::Cmp(CmpOp::Ge, a, b) => Key::Cmp(CmpOp::Le, b, a),
        Op::Cmp(c, a, b) => Key::Cmp(c, a, b),
        Op::Select(c, a, b) => Key::Select(c, a, b),
        Op::Cvt(a, cvt) => Key::Cvt(a, cvt),
        Op::Bitcast(a, t) => Key::Bitcast(a, t),
        Op::PtrAdd(p, i) => Key::PtrAdd(p, i),
        Op::PtrCast(p, t) => Key::PtrCast(p, t),
        Op::SharedBase(s) => Key::SharedBase(s),
        Op::DynSharedBase(t) => Key::DynSharedBase(t),
        Op::Extract(v, i) => Key::Extract(v, i),
        Op::MakeVector(vs) => Key::MakeVector(vs),
        Op::Load { ptr, lanes } => Key::Load { ptr, lanes, epoch },
        Op::Store { .. }
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
        | Op::For { .. } => return None,
    })
}

struct Numbering<'k> {
    k: &'k mut Kernel,
    /// Computations visible at the current point, with the value holding each.
    table: HashMap<(Key, Type), Value>,
    /// Keys added, in order, so that leaving a region forgets its own.
    log: Vec<(Key, Type)>,
    /// Bumped by every instruction that may write memory or synchronise.
    epoch: u64,
    subst: Subst,
    changed: bool,
}

impl Numbering<'_> {
    fn region(&mut self, r: RegionId) {
        let mark = self.log.len();
        let insts = std::mem::take(&mut self.k.regions[r.index()].insts);
        let mut out = Vec::with_capacity(insts.len());
        for id in insts {
            self.subst.rewrite_inst(self.k, id);
            let op = self.k.inst(id).op.clone();
            match &op {
                Op::If { then_region, else_region, .. } => {
                    self.region(*then_region);
                    self.region(*else_region);
                }
                Op::For { body, .. } => {
                    // Later iterations run after the body's writes of earlier ones.
                    if region_writes_memory(self.k, *body) {
                        self.epoch += 1;
                    }
                    self.region(*body);
                }
                _ => {}
            }
            if op.has_side_effects() {
                self.epoch += 1;
            }
            let results = &self.k.inst(id).results;
            if let (Some(key), [res]) = (key(&op, self.epoch), results.as_slice()) {
                let entry = (key, self.k.ty(*res));
                if let Some(&prev) = self.table.get(&entry) {
                    self.subst.insert(*res, prev);
                    self.changed = true;
                    continue;
                }
                self.table.insert(entry.clone(), *res);
                self.log.push(entry);
            }
            out.push(id);
        }
        self.k.regions[r.index()].insts = out;
        self.subst.rewrite_yields(self.k, r);
        for entry in self.log.drain(mark..) {
            self.table.remove(&entry);
        }
    }
}

//! Evaluating an operation on constants exactly as the interpreter does: by running it there.
//!
//! The interpreter defines the IR's semantics (rounding, canonical NaNs, shift clamping,
//! conversions in every mode), so constant folding asks it instead of restating those rules:
//! a one-thread kernel computes the operation on the constants and stores the result.

use crate::interp::{run_with_threads, KernelArg, LaunchConfig};
use crate::kernel::*;
use crate::types::{AddrSpace, ScalarType, Type};

/// The result of `op` (a pure scalar operation) on the constant operands `args`, or `None`
/// when the interpreter reports an error (integer division by zero).
pub(crate) fn eval(op: &Op, args: &[Constant], result: ScalarType) -> Option<Constant> {
    // Predicates cannot live in memory: store them as a u32 0 or 1.
    let stored = if result == ScalarType::Pred { ScalarType::U32 } else { result };
    let mut k = Kernel::new("fold");
    let out = k.new_value(Type::Ptr(AddrSpace::Global, stored));
    k.params.push(Param { name: "out".into(), value: out });
    let vals: Vec<Value> = args.iter().map(|c| push(&mut k, Op::Const(*c), vec![Type::Scalar(c.ty)])[0]).collect();
    let mut op = op.clone();
    let slots = op.operands_mut();
    if slots.len() != vals.len() {
        return None;
    }
    for (slot, v) in slots.into_iter().zip(&vals) {
        *slot = *v;
    }
    let mut r = push(&mut k, op, vec![Type::Scalar(result)])[0];
    if result == ScalarType::Pred {
        let one = push(&mut k, Op::Const(Constant::u32(1)), vec![Type::U32])[0];
        let zero = push(&mut k, Op::Const(Constant::u32(0)), vec![Type::U32])[0];
        r = push(&mut k, Op::Select(r, one, zero), vec![Type::U32])[0];
    }
    push(&mut k, Op::Store { ptr: out, value: r }, vec![]);
    let mut buf = [0u8; 8];
    run_with_threads(&k, &LaunchConfig::linear(1, 1), &mut [KernelArg::Buffer(&mut buf)], 1).ok()?;
    Some(Constant::new(result, u64::from_le_bytes(buf)))
}

fn push(k: &mut Kernel, op: Op, types: Vec<Type>) -> Vec<Value> {
    let results: Vec<Value> = types.into_iter().map(|t| k.new_value(t)).collect();
    let id = k.push_inst(Inst { op, results: results.clone(), loc: None });
    let body = k.body;
    k.regions[body.index()].insts.push(id);
    results
}

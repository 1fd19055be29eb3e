//! `fold`: constants computed as the interpreter computes them, for every op and edge value;
//! what must not fold (approximate functions, division by zero); control flow on constants.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::passes::Pass;
use ruda_ir::*;

use ScalarType::*;

fn arith(op: &Op) -> bool {
    !matches!(op, Op::Const(_) | Op::Store { .. } | Op::PtrAdd(..) | Op::PtrCast(..))
}

/// Every binary op of `t` on every pair of edge constants folds to the interpreter's result.
fn fold_binary(t: ScalarType, ops: &[BinaryOp]) {
    let e = edges(t);
    for &op in ops {
        let (k, n) = slots_kernel(|b| {
            let mut vals = vec![];
            for &x in &e {
                for &y in &e {
                    let divides = matches!(op, BinaryOp::Div | BinaryOp::Rem) && t.is_int();
                    if divides && y == 0 {
                        continue;
                    }
                    let a = b.constant(Constant::new(t, x));
                    let c = if matches!(op, BinaryOp::Shl | BinaryOp::Shr) {
                        b.const_u32((y % 70) as u32)
                    } else {
                        b.constant(Constant::new(t, y))
                    };
                    vals.push(b.binary(op, a, c));
                }
            }
            vals
        });
        let after = check_slots(&k, n, "fold");
        assert_eq!(
            count(&after, |o| matches!(o, Op::Binary(..))),
            0,
            "{op} on {t} left unfolded:\n{}",
            print_kernel(&after)
        );
    }
}

#[test]
fn integer_binary_ops_fold_with_wrapping_and_clamped_shifts() {
    use BinaryOp::*;
    let all = [Add, Sub, Mul, MulHi, Div, Rem, Min, Max, And, Or, Xor, Shl, Shr];
    for t in [I16, U16, I32, U32, I64, U64] {
        fold_binary(t, &all);
    }
}

#[test]
fn float_binary_ops_fold_with_canonical_nans_and_signed_zeros() {
    use BinaryOp::*;
    for t in [F32, F64] {
        fold_binary(t, &[Add, Sub, Mul, Div, Min, Max]);
    }
}

#[test]
fn unary_fma_cmp_select_fold() {
    for t in [I32, U64, F32, F64] {
        let e = edges(t);
        let (k, n) = slots_kernel(|b| {
            let mut vals = vec![];
            for (i, &x) in e.iter().enumerate() {
                let a = b.constant(Constant::new(t, x));
                let y = b.constant(Constant::new(t, e[(i * 7 + 3) % e.len()]));
                let z = b.constant(Constant::new(t, e[(i * 5 + 1) % e.len()]));
                let unary: &[UnaryOp] = if t.is_float() {
                    &[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt, UnaryOp::Rcp]
                } else if t.is_signed_int() {
                    &[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not, UnaryOp::Popc, UnaryOp::Clz]
                } else {
                    &[UnaryOp::Not, UnaryOp::Popc, UnaryOp::Clz]
                };
                for &u in unary {
                    vals.push(b.unary(u, a));
                }
                vals.push(b.fma(a, y, z));
                let cmps: &[CmpOp] = if t.is_float() { CmpOp::ALL } else { &CmpOp::ALL[..6] };
                for &c in cmps {
                    vals.push(b.cmp(c, a, y));
                }
                let c = b.lt(a, y);
                vals.push(b.select(c, y, z));
            }
            vals
        });
        let after = check_slots(&k, n, "fold");
        assert_eq!(count(&after, arith), 0, "{t}:\n{}", print_kernel(&after));
    }
}

#[test]
fn conversions_fold_in_every_rounding_mode() {
    let pairs = [
        (F32, I32),
        (F32, U32),
        (F64, I64),
        (F64, U16),
        (F32, F16),
        (F32, BF16),
        (F64, F32),
        (I32, F32),
        (U64, F32),
        (I64, F64),
        (U32, F64),
        (I32, I16),
        (I64, U32),
        (F16, F32),
        (BF16, F16),
        (F32, F32),
    ];
    for (from, to) in pairs {
        let (k, n) = slots_kernel(|b| {
            let mut vals = vec![];
            let sources: Vec<u64> = if from.is_float() && from.bits() == 16 {
                vec![0x0000, 0x8000, 0x3c00, 0x7c00, 0xfc00, 0x7e01, 0x0001, 0x7bff, 0x3555]
            } else {
                edges(from)
            };
            for &x in &sources {
                let a = b.constant(Constant::new(from, x));
                let needs = ruda_ir::verify::cvt_needs_rounding(from, to) || (from.is_float() && from == to);
                let modes: Vec<Option<Rounding>> =
                    if needs { Rounding::ALL.iter().map(|r| Some(*r)).collect() } else { vec![None] };
                for rounding in modes {
                    for sat in [false, true] {
                        if sat && !to.is_int() {
                            continue;
                        }
                        vals.push(b.cvt_with(a, Cvt { to, rounding, sat }));
                    }
                }
                if from.bits() == to.bits() && from != to {
                    vals.push(b.bitcast(a, to));
                }
            }
            vals
        });
        let after = check_slots(&k, n, "fold");
        assert_eq!(count(&after, arith), 0, "{from} -> {to}:\n{}", print_kernel(&after));
    }
}

#[test]
fn approximate_functions_do_not_fold() {
    let (k, n) = slots_kernel(|b| {
        let x = b.const_f32(0.5);
        [UnaryOp::Rsqrt, UnaryOp::Ex2, UnaryOp::Lg2, UnaryOp::Tanh, UnaryOp::Sin, UnaryOp::Cos]
            .map(|u| b.unary(u, x))
            .to_vec()
    });
    let after = check_slots(&k, n, "fold");
    assert_eq!(count(&after, |o| matches!(o, Op::Unary(..))), 6, "{}", print_kernel(&after));
}

#[test]
fn integer_division_by_zero_stays_and_still_fails() {
    for op in [BinaryOp::Div, BinaryOp::Rem] {
        let (k, n) = slots_kernel(|b| {
            let x = b.const_i32(7);
            let zero = b.const_i32(0);
            vec![b.binary(op, x, zero)]
        });
        let after = check_slots(&k, n, "fold");
        assert_eq!(count(&after, |o| matches!(o, Op::Binary(..))), 1);
        let err = run(&after, LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0; 8])]).unwrap_err();
        assert!(err.message.contains("by zero"), "{err}");
    }
}

/// `out[tid] = cond ? x[tid] + 1 : 2` with a constant condition and a store in the branch.
fn if_kernel(cond: bool) -> Kernel {
    let mut b = KernelBuilder::new("branch");
    let x = b.param("x", gptr(I32));
    let out = b.param("out", gptr(I32));
    let tid = b.thread_id_x();
    let c = b.const_pred(cond);
    let r = b.if_else(
        c,
        |b| {
            let p = b.ptr_add(x, tid);
            let v = b.load(p);
            let one = b.const_i32(1);
            let q = b.ptr_add(out, tid);
            b.store(q, v);
            vec![b.add(v, one)]
        },
        |b| vec![b.const_i32(2)],
    )[0];
    let q = b.ptr_add(out, tid);
    let old = b.load(q);
    let r = b.add(r, old);
    b.store(q, r);
    b.finish().unwrap()
}

#[test]
fn if_on_a_constant_condition_is_inlined() {
    for cond in [true, false] {
        let k = if_kernel(cond);
        let args = [Arg::Buffer(bytes_of(&[5, 6, 7, 8], 4)), Arg::Buffer(vec![1; 16])];
        let after = check(&k, "fold", LaunchConfig::linear(1, 4), &args);
        let text = print_kernel(&after);
        assert!(!text.contains("if "), "{text}");
        assert_eq!(count(&after, |o| matches!(o, Op::Store { .. })), 1 + cond as usize, "{text}");
    }
}

#[test]
fn select_on_a_constant_picks_its_operand() {
    let k = binary_map(F32, F32, |b, x, y| {
        let t = b.const_pred(true);
        let f = b.const_pred(false);
        let a = b.select(t, x, y);
        let c = b.select(f, x, y);
        b.sub(a, c)
    });
    let (launch, args) = pair_args(F32, F32);
    let after = check(&k, "fold", launch, &args);
    assert_eq!(count(&after, |o| matches!(o, Op::Select(..))), 0);
}

#[test]
fn loops_that_never_run_become_their_initial_values() {
    for (start, end) in [(5u32, 5u32), (9, 3)] {
        let mut b = KernelBuilder::new("never");
        let out = b.param("out", gptr(U32));
        let tid = b.thread_id_x();
        let (s, e, st) = (b.const_u32(start), b.const_u32(end), b.const_u32(1));
        let r = b.for_range(s, e, st, &[tid], |b, iv, acc| {
            let p = b.ptr_add(out, iv);
            b.store(p, iv);
            vec![b.add(acc[0], iv)]
        })[0];
        let p = b.ptr_add(out, tid);
        b.store(p, r);
        let k = b.finish().unwrap();
        let after = check(&k, "fold", LaunchConfig::linear(1, 4), &[Arg::Buffer(vec![0xaa; 64])]);
        assert!(!print_kernel(&after).contains("for "), "{}", print_kernel(&after));
    }
}

#[test]
fn a_signed_loop_with_negative_bounds_is_not_mistaken_for_an_empty_one() {
    let mut b = KernelBuilder::new("negative");
    let out = b.param("out", gptr(I32));
    let (s, e, st) = (b.const_i32(-3), b.const_i32(2), b.const_i32(1));
    let zero = b.const_i32(0);
    let r = b.for_range(s, e, st, &[zero], |b, iv, acc| vec![b.add(acc[0], iv)])[0];
    b.store(out, r);
    let k = b.finish().unwrap();
    let after = check(&k, "fold", LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0; 4])]);
    assert!(print_kernel(&after).contains("for "));
}

#[test]
fn folding_reports_whether_it_changed_anything() {
    let (k, _) = slots_kernel(|b| {
        let x = b.const_u32(3);
        vec![b.add(x, x)]
    });
    let mut k2 = k.clone();
    assert!(ruda_ir::passes::Fold.run(&mut k2));
    assert!(!ruda_ir::passes::Fold.run(&mut k2));
}

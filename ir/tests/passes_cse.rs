//! `cse`: duplicates merge into the copy in an enclosing scope, never across sibling regions;
//! loads merge only without an intervening write; atomics, shuffles and votes never merge.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::*;

use ScalarType::*;

fn ops(k: &Kernel, f: impl Fn(&Op) -> bool) -> usize {
    count(k, f)
}

#[test]
fn pure_duplicates_merge_into_enclosing_scopes_and_commute() {
    for t in [I32, U64, F32, F64] {
        let (before, after) = check_multi(t, "cse", |b, x, y| {
            let s1 = b.add(x, y);
            let s2 = b.add(y, x);
            let m1 = b.max(x, y);
            let m2 = b.max(y, x);
            let g = b.gt(x, y);
            let l = b.lt(y, x);
            let f1 = b.fma(x, y, x);
            let f2 = b.fma(y, x, x);
            let inner = b.if_else(g, |b| vec![b.add(x, y), b.max(y, x)], |b| vec![b.add(y, x), b.min(x, y)]);
            vec![s1, s2, m1, m2, g, l, f1, f2, inner[0], inner[1]]
        });
        let adds = |k: &Kernel| ops(k, |o| matches!(o, Op::Binary(BinaryOp::Add, ..)));
        assert_eq!(adds(&after), 1, "{t}:\n{}", print_kernel(&after));
        assert_eq!(ops(&after, |o| matches!(o, Op::Fma(..))), ops(&before, |o| matches!(o, Op::Fma(..))) - 1);
        assert_eq!(ops(&after, |o| matches!(o, Op::Cmp(..))), 2, "range check and one comparison");
    }
}

#[test]
fn non_commutative_operands_keep_their_order() {
    let (_, after) = check_multi(F32, "cse", |b, x, y| vec![b.sub(x, y), b.sub(y, x), b.div(x, y), b.div(y, x)]);
    assert_eq!(ops(&after, |o| matches!(o, Op::Binary(BinaryOp::Sub | BinaryOp::Div, ..))), 4);
}

#[test]
fn sibling_regions_do_not_share() {
    let (_, after) = check_multi(U32, "cse", |b, x, y| {
        let c = b.lt(x, y);
        let r = b.if_else(c, |b| vec![b.mul(x, y)], |b| vec![b.mul(x, y)]);
        vec![r[0], b.mul(x, y)]
    });
    // The thread id computation has no `mul`; all three stay (the last is after the `if`,
    // which does not dominate it through a branch).
    assert_eq!(ops(&after, |o| matches!(o, Op::Binary(BinaryOp::Mul, ..))), 4, "{}", print_kernel(&after));
}

#[test]
fn special_registers_and_constants_merge() {
    let mut b = KernelBuilder::new("specials");
    let out = b.param("out", gptr(U32));
    let t1 = b.thread_id_x();
    let c1 = b.const_u32(3);
    let ok = b.lt(t1, c1);
    b.if_then(ok, |b| {
        let t2 = b.thread_id_x();
        let c2 = b.const_u32(3);
        let v = b.add(t2, c2);
        let p = b.ptr_add(out, t2);
        b.store(p, v);
    });
    let k = b.finish().unwrap();
    let after = check(&k, "cse", LaunchConfig::linear(1, 8), &[Arg::Buffer(vec![0; 32])]);
    assert_eq!(ops(&after, |o| matches!(o, Op::Special(_))), 1);
    assert_eq!(ops(&after, |o| matches!(o, Op::Const(_))), 1);
}

/// A kernel that loads `x[tid]` twice with `between` in between, and stores the sum.
fn two_loads(between: impl FnOnce(&mut KernelBuilder, Value, Value)) -> Kernel {
    let mut b = KernelBuilder::new("loads");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let p = b.ptr_add(x, tid);
    let a = b.load(p);
    between(&mut b, x, tid);
    let p2 = b.ptr_add(x, tid);
    let c = b.load(p2);
    let s = b.add(a, c);
    let q = b.ptr_add(out, tid);
    b.store(q, s);
    b.finish().unwrap()
}

fn loads_after_cse(k: &Kernel) -> usize {
    let args = [Arg::Buffer(bytes_of(&[1, 2, 3, 4, 5, 6, 7, 8], 4)), Arg::Buffer(vec![0; 32])];
    let after = check(k, "cse", LaunchConfig::linear(1, 4), &args);
    ops(&after, |o| matches!(o, Op::Load { .. }))
}

#[test]
fn loads_merge_only_within_one_memory_epoch() {
    assert_eq!(loads_after_cse(&two_loads(|_, _, _| {})), 1);
    // Writes between the loads, directly, in a branch, in a loop, or a barrier or an atomic.
    let store = |b: &mut KernelBuilder, x: Value, tid: Value| {
        let one = b.const_u32(1);
        let i = b.add(tid, one);
        let p = b.ptr_add(x, i);
        b.store(p, tid);
    };
    assert_eq!(loads_after_cse(&two_loads(store)), 2);
    assert_eq!(
        loads_after_cse(&two_loads(|b, x, tid| {
            let c = b.const_u32(2);
            let odd = b.lt(tid, c);
            b.if_then(odd, |b| store(b, x, tid));
        })),
        2
    );
    assert_eq!(
        loads_after_cse(&two_loads(|b, x, tid| {
            let (s, e, st) = (b.const_u32(0), b.const_u32(1), b.const_u32(1));
            b.for_each(s, e, st, |b, _| store(b, x, tid));
        })),
        2
    );
    assert_eq!(loads_after_cse(&two_loads(|b, _, _| b.barrier())), 2);
    assert_eq!(
        loads_after_cse(&two_loads(|b, x, _| {
            let z = b.const_u32(0);
            b.atomic(AtomicOp::Add, x, z);
        })),
        2
    );
}

#[test]
fn a_load_inside_a_loop_that_writes_does_not_merge_with_one_before_it() {
    let mut b = KernelBuilder::new("loop_loads");
    let x = b.param("x", gptr(U32));
    let tid = b.thread_id_x();
    let p = b.ptr_add(x, tid);
    let first = b.load(p);
    let (s, e, st) = (b.const_u32(0), b.const_u32(3), b.const_u32(1));
    let r = b.for_range(s, e, st, &[first], |b, _, acc| {
        // The load reads what the previous iteration stored.
        let v = b.load(p);
        let one = b.const_u32(1);
        let v1 = b.add(v, one);
        b.store(p, v1);
        vec![b.add(acc[0], v)]
    })[0];
    b.store(p, r);
    let k = b.finish().unwrap();
    let after = check(&k, "cse", LaunchConfig::linear(1, 4), &[Arg::Buffer(bytes_of(&[10, 20, 30, 40], 4))]);
    assert_eq!(ops(&after, |o| matches!(o, Op::Load { .. })), 2);
}

#[test]
fn a_load_inside_a_loop_without_writes_merges_with_one_before_it() {
    let mut b = KernelBuilder::new("loop_loads");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let p = b.ptr_add(x, tid);
    let first = b.load(p);
    let (s, e, st) = (b.const_u32(0), b.const_u32(3), b.const_u32(1));
    let r = b.for_range(s, e, st, &[first], |b, _, acc| {
        let v = b.load(p);
        vec![b.add(acc[0], v)]
    })[0];
    let q = b.ptr_add(out, tid);
    b.store(q, r);
    let k = b.finish().unwrap();
    let args = [Arg::Buffer(bytes_of(&[10, 20, 30, 40], 4)), Arg::Buffer(vec![0; 16])];
    let after = check(&k, "cse", LaunchConfig::linear(1, 4), &args);
    assert_eq!(ops(&after, |o| matches!(o, Op::Load { .. })), 1);
}

#[test]
fn atomics_shuffles_and_votes_never_merge() {
    let mut b = KernelBuilder::new("warp");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let one = b.const_u32(1);
    let a1 = b.atomic(AtomicOp::Add, x, one);
    let a2 = b.atomic(AtomicOp::Add, x, one);
    let s1 = b.shfl(ShflMode::Bfly, tid, one);
    let s2 = b.shfl(ShflMode::Bfly, tid, one);
    let c = b.lt(tid, one);
    let v1 = b.vote(VoteMode::Ballot, c);
    let v2 = b.vote(VoteMode::Ballot, c);
    let mut acc = a1;
    for v in [a2, s1, s2, v1, v2] {
        acc = b.add(acc, v);
    }
    let q = b.ptr_add(out, tid);
    b.store(q, acc);
    let k = b.finish().unwrap();
    let args = [Arg::Buffer(vec![0; 4]), Arg::Buffer(vec![0; 128])];
    let after = check(&k, "cse", LaunchConfig::linear(1, 32), &args);
    let text = print_kernel(&after);
    assert_eq!(text.matches("atomic.add").count(), 2, "{text}");
    assert_eq!(text.matches("shfl.bfly").count(), 2, "{text}");
    assert_eq!(text.matches("vote.ballot").count(), 2, "{text}");
}

#[test]
fn a_duplicate_division_by_zero_fails_at_the_first() {
    let (k, slots) = multi_map(I32, |b, x, y| {
        let d1 = b.div(x, y);
        let c = b.lt(x, y);
        let d2 = b.if_else(c, |b| vec![b.div(x, y)], |b| vec![b.rem(x, y)])[0];
        vec![d1, d2]
    });
    let (launch, args) = multi_args(I32, slots);
    // Edge values include a zero divisor: both versions fail at the first division.
    let after = check(&k, "cse", launch, &args);
    assert_eq!(ops(&after, |o| matches!(o, Op::Binary(BinaryOp::Div, ..))), 1);
    assert!(run(&after, launch, &args).is_err());
}

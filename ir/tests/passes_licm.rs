//! `licm`: invariant pure code leaves loops (nests included); loads only from loops that write
//! nothing and surely run; nothing that may fail moves ahead of something else that may.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::*;

use ScalarType::*;

/// Instructions directly in the body of the first loop found.
fn body_len(k: &Kernel) -> usize {
    let mut n = None;
    k.walk(|_, i| {
        if let (None, Op::For { body, .. }) = (n, &i.op) {
            n = Some(k.region(*body).insts.len());
        }
    });
    n.expect("a loop")
}

/// `out[tid] = sum over iv in [start, end) of body(iv)`, with `x`, `n` and `tid` at hand.
fn sum_loop(
    start: Option<u32>,
    end: Option<u32>,
    body: impl FnOnce(&mut KernelBuilder, Value, Value, Value, Value) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new("sum");
    let x = b.param("x", gptr(U32));
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let s = match start {
        Some(s) => b.const_u32(s),
        None => tid,
    };
    let e = match end {
        Some(e) => b.const_u32(e),
        None => n,
    };
    let st = b.const_u32(1);
    let zero = b.const_u32(0);
    let r = b.for_range(s, e, st, &[zero], |b, iv, acc| {
        let v = body(b, x, n, tid, iv);
        vec![b.add(acc[0], v)]
    })[0];
    let p = b.ptr_add(out, tid);
    b.store(p, r);
    b.finish().unwrap()
}

fn args(n: u32) -> Vec<Arg> {
    vec![Arg::Buffer(bytes_of(&[3, 1, 4, 1, 5, 9, 2, 6], 4)), Arg::Buffer(vec![0; 32]), Arg::Scalar(Constant::u32(n))]
}

fn hoisted(k: &Kernel, n: u32) -> (Kernel, usize, usize) {
    let after = check(k, "licm", LaunchConfig::linear(1, 8), &args(n));
    (after.clone(), body_len(k), body_len(&after))
}

#[test]
fn invariant_arithmetic_and_safe_divisions_move_out() {
    let k = sum_loop(None, None, |b, _, n, tid, iv| {
        let a = b.mul(n, tid);
        let three = b.const_u32(3);
        let q = b.div(a, three);
        let r = b.rem(n, three);
        let t = b.add(q, r);
        b.add(t, iv)
    });
    let (_, before, after) = hoisted(&k, 5);
    // Only the add of the induction variable and the carried sum stay.
    assert_eq!((before, after), (7, 2));
}

#[test]
fn divisions_that_may_fail_stay() {
    let k = sum_loop(None, None, |b, _, n, tid, iv| {
        let q = b.div(tid, n);
        b.add(q, iv)
    });
    let (_, before, after) = hoisted(&k, 3);
    assert_eq!(before, after);
    // With n = 0 the loop never runs, so the division must not run either.
    let after = optimized(&k, "licm");
    assert_same(&k, &after, LaunchConfig::linear(1, 8), &args(0));
}

#[test]
fn loads_move_only_out_of_loops_that_surely_run_and_write_nothing() {
    let load_tid = |b: &mut KernelBuilder, x: Value, _: Value, tid: Value, iv: Value| {
        let p = b.ptr_add(x, tid);
        let v = b.load(p);
        b.add(v, iv)
    };
    let loads_in_loop = |k: &Kernel| {
        let mut n = 0;
        k.walk(|_, i| {
            if let Op::For { body, .. } = &i.op {
                n = k.region(*body).insts.iter().filter(|id| matches!(k.inst(**id).op, Op::Load { .. })).count();
            }
        });
        n
    };
    // Constant bounds, at least one iteration: the load moves.
    let (after, _, _) = hoisted(&sum_loop(Some(0), Some(4), load_tid), 3);
    assert_eq!(loads_in_loop(&after), 0);
    // Bounds that may give no iteration: it stays (it could fail where the loop would not run).
    let (after, _, _) = hoisted(&sum_loop(None, Some(4), load_tid), 3);
    assert_eq!(loads_in_loop(&after), 1);
    let (after, _, _) = hoisted(&sum_loop(Some(0), Some(0), load_tid), 3);
    assert_eq!(loads_in_loop(&after), 1);
    // A loop that stores: it stays.
    let storing = |b: &mut KernelBuilder, x: Value, n: Value, tid: Value, iv: Value| {
        let p = b.ptr_add(x, tid);
        let v = b.load(p);
        let q = b.ptr_add(x, n);
        b.store(q, iv);
        v
    };
    let (after, _, _) = hoisted(&sum_loop(Some(0), Some(4), storing), 7);
    assert_eq!(loads_in_loop(&after), 1);
}

#[test]
fn an_invariant_load_does_not_move_ahead_of_a_load_that_may_fail_first() {
    let k = sum_loop(Some(0), Some(4), |b, x, n, tid, iv| {
        // Out of bounds for large n: the first load fails in the original order.
        let i = b.add(n, iv);
        let p = b.ptr_add(x, i);
        let v = b.load(p);
        let q = b.ptr_add(x, tid);
        let w = b.load(q);
        b.add(v, w)
    });
    let (after, before_len, after_len) = hoisted(&k, 1);
    assert_eq!(before_len - after_len, 1, "only the address of the second load moves");
    assert_same(&k, &after, LaunchConfig::linear(1, 8), &args(1000));
}

#[test]
fn invariants_climb_out_of_nested_loops() {
    let mut b = KernelBuilder::new("nest");
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let (s, st) = (b.const_u32(0), b.const_u32(1));
    let zero = b.const_u32(0);
    let r = b.for_range(s, n, st, &[zero], |b, i, acc| {
        let inner = b.for_range(s, n, st, &[acc[0]], |b, j, acc| {
            let seven = b.const_u32(7);
            let a = b.mul(tid, seven);
            let c = b.mul(i, seven);
            let t = b.add(a, c);
            let t = b.add(t, j);
            vec![b.add(acc[0], t)]
        });
        vec![inner[0]]
    })[0];
    let p = b.ptr_add(out, tid);
    b.store(p, r);
    let k = b.finish().unwrap();
    let after =
        check(&k, "licm", LaunchConfig::linear(1, 8), &[Arg::Buffer(vec![0; 32]), Arg::Scalar(Constant::u32(4))]);
    let text = print_kernel(&after);
    // `7` and `tid * 7` leave both loops, `i * 7` and its sum with `tid * 7` leave the inner.
    let top = after.region(after.body).insts.iter().filter(|id| matches!(after.inst(**id).op, Op::Binary(..))).count();
    assert_eq!(top, 1, "{text}");
    let mut inner_len = 0;
    after.walk(|_, i| {
        if let Op::For { body, .. } = &i.op {
            inner_len = after.region(*body).insts.len();
        }
    });
    assert_eq!(inner_len, 2, "{text}");
}

#[test]
fn shuffles_and_votes_stay_in_their_loop() {
    let mut b = KernelBuilder::new("warp");
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let (s, st) = (b.const_u32(0), b.const_u32(1));
    let zero = b.const_u32(0);
    let r = b.for_range(s, n, st, &[zero], |b, _, acc| {
        let one = b.const_u32(1);
        let v = b.shfl(ShflMode::Bfly, tid, one);
        let c = b.lt(tid, one);
        let w = b.vote(VoteMode::Ballot, c);
        let t = b.add(v, w);
        vec![b.add(acc[0], t)]
    })[0];
    let p = b.ptr_add(out, tid);
    b.store(p, r);
    let k = b.finish().unwrap();
    let args = [Arg::Buffer(vec![0; 128]), Arg::Scalar(Constant::u32(3))];
    let after = check(&k, "licm", LaunchConfig::linear(1, 32), &args);
    let mut body = String::new();
    after.walk(|_, i| {
        if let Op::For { body: r, .. } = &i.op {
            body = after.region(*r).insts.iter().map(|id| after.inst(*id).op.mnemonic()).collect::<Vec<_>>().join(" ");
        }
    });
    assert!(body.contains("shfl.bfly") && body.contains("vote.ballot"), "{body}");
}

#[test]
fn constant_offset_addresses_stay_by_their_loads() {
    let k = sum_loop(Some(0), Some(4), |b, x, _, tid, iv| {
        let p = b.ptr_add(x, tid);
        let c = b.const_u32(1);
        let q = b.ptr_add(p, c);
        let a = b.load(p);
        let v = b.load(q);
        let t = b.add(a, v);
        b.add(t, iv)
    });
    let (after, _, _) = hoisted(&k, 1);
    let mut in_loop = vec![];
    after.walk(|_, i| {
        if let Op::For { body, .. } = &i.op {
            in_loop = after.region(*body).insts.iter().map(|id| after.inst(*id).op.mnemonic()).collect();
        }
    });
    // Both loads leave, the second's address with it.
    assert_eq!(in_loop, ["add", "add"], "{}", print_kernel(&after));
    // A load that stays keeps its constant-offset address beside it.
    let k = sum_loop(None, Some(4), |b, x, _, tid, iv| {
        let p = b.ptr_add(x, tid);
        let c = b.const_u32(1);
        let q = b.ptr_add(p, c);
        let v = b.load(q);
        b.add(v, iv)
    });
    let (after, _, _) = hoisted(&k, 1);
    after.walk(|_, i| {
        if let Op::For { body, .. } = &i.op {
            in_loop = after.region(*body).insts.iter().map(|id| after.inst(*id).op.mnemonic()).collect();
        }
    });
    assert_eq!(in_loop, ["ptradd", "load", "add", "add"], "{}", print_kernel(&after));
}

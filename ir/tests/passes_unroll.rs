//! `unroll`: constant-trip loops unrolled fully or by 4 with the remainder as copies; carried
//! values threaded (swaps included); loops whose induction variable wraps left alone.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::passes::PARTIAL_FACTOR;
use ruda_ir::*;

use ScalarType::*;

fn loops(k: &Kernel) -> Vec<(Option<Constant>, usize)> {
    let mut out = vec![];
    k.walk(|_, i| {
        if let Op::For { step, body, .. } = &i.op {
            let c = k.insts.iter().find(|d| d.results.first() == Some(step)).and_then(|d| match d.op {
                Op::Const(c) => Some(c),
                _ => None,
            });
            out.push((c, k.region(*body).insts.len()));
        }
    });
    out
}

/// `out[tid] = f(...)` of a loop `for iv in start..end step step` carrying `(a, b, c)`:
/// `a += iv * tid`, `(b, c) = (c, b + 1)`.
fn carried_loop(t: ScalarType, start: i64, end: i64, step: i64) -> Kernel {
    let mut b = KernelBuilder::new("carried");
    let out = b.param("out", gptr(t));
    let tid = b.thread_id_x();
    let tid_t = if t == U32 { tid } else { b.cvt(tid, t) };
    let c = |b: &mut KernelBuilder, v: i64| b.constant(Constant::new(t, v as u64));
    let (s, e, st) = (c(&mut b, start), c(&mut b, end), c(&mut b, step));
    let zero = c(&mut b, 0);
    let one = c(&mut b, 1);
    let r = b.for_range(s, e, st, &[zero, tid_t, zero], |b, iv, acc| {
        let m = b.mul(iv, tid_t);
        let a = b.add(acc[0], m);
        let inc = b.add(acc[1], one);
        vec![a, acc[2], inc]
    });
    let x = b.xor(r[0], r[1]);
    let x = b.add(x, r[2]);
    let p = b.ptr_add(out, tid);
    b.store(p, x);
    b.finish().unwrap()
}

fn run_carried(t: ScalarType, start: i64, end: i64, step: i64) -> Kernel {
    let k = carried_loop(t, start, end, step);
    check(&k, "unroll", LaunchConfig::linear(1, 4), &[Arg::Buffer(vec![0; 4 * t.bytes() as usize])])
}

#[test]
fn small_loops_unroll_fully_with_carried_values_and_swaps() {
    for (t, s, e, st) in [(U32, 0, 5, 1), (I32, -3, 4, 2), (U64, 7, 8, 1), (I64, -10, 20, 3), (U32, 0, 16, 1)] {
        let after = run_carried(t, s, e, st);
        assert!(loops(&after).is_empty(), "{t} {s}..{e} step {st}:\n{}", print_kernel(&after));
    }
}

#[test]
fn longer_loops_unroll_by_four_with_the_remainder_as_copies() {
    for (t, s, e, st) in [(U32, 0, 100, 1), (I32, -50, 53, 1), (U64, 0, 99, 3), (I64, -7, 200, 5)] {
        let after = run_carried(t, s, e, st);
        let trips = ((e - s) + st - 1) / st;
        let ls = loops(&after);
        assert_eq!(ls.len(), 1, "{}", print_kernel(&after));
        let (step, body) = ls[0];
        assert_eq!(step.map(|c| c.bits), Some((st * PARTIAL_FACTOR as i64) as u64), "{}", print_kernel(&after));
        // Four copies of the body (3 instructions) and the induction offsets (2 per copy).
        assert_eq!(body, 4 * 3 + 3 * 2, "{}", print_kernel(&after));
        let remainder = trips as u64 % PARTIAL_FACTOR;
        let muls = count(&after, |o| matches!(o, Op::Binary(BinaryOp::Mul, ..)));
        assert_eq!(muls as u64, PARTIAL_FACTOR + remainder, "{}", print_kernel(&after));
    }
}

#[test]
fn loops_whose_induction_variable_wraps_are_left_alone() {
    // iv = 2^32 - 6, 2^32 - 2, then 2 (wrapped) < end: the loop does not end after two trips.
    let k = carried_loop(U32, (u32::MAX - 5) as i64, u32::MAX as i64, 4);
    assert_eq!(loops(&optimized(&k, "unroll")).len(), 1);
    // A negative step never ends either (until it wraps).
    let k = carried_loop(I32, 0, 10, -1);
    assert_eq!(loops(&optimized(&k, "unroll")).len(), 1);
    // But a loop ending right at the top of the type is fine.
    let after = run_carried(U32, (u32::MAX - 5) as i64, u32::MAX as i64, 1);
    assert!(loops(&after).is_empty());
    let after = run_carried(I32, i32::MAX as i64 - 3, i32::MAX as i64, 3);
    assert!(loops(&after).is_empty());
}

#[test]
fn loops_with_unknown_bounds_or_too_big_bodies_stay() {
    let mut b = KernelBuilder::new("unknown");
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let (s, st) = (b.const_u32(0), b.const_u32(1));
    let zero = b.const_u32(0);
    let r = b.for_range(s, n, st, &[zero], |b, iv, acc| vec![b.add(acc[0], iv)])[0];
    b.store(out, r);
    let k = b.finish().unwrap();
    assert_eq!(loops(&optimized(&k, "unroll")).len(), 1);

    let mut b = KernelBuilder::new("big");
    let out = b.param("out", gptr(U32));
    let (s, e, st) = (b.const_u32(0), b.const_u32(100), b.const_u32(1));
    let zero = b.const_u32(0);
    let r = b.for_range(s, e, st, &[zero], |b, iv, acc| {
        let mut v = acc[0];
        for _ in 0..100 {
            v = b.add(v, iv);
        }
        vec![v]
    })[0];
    b.store(out, r);
    let k = b.finish().unwrap();
    let after = check(&k, "unroll", LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0; 4])]);
    assert_eq!(print_kernel(&after), print_kernel(&k));
}

#[test]
fn nested_loops_with_branches_and_barriers_unroll_inside_out() {
    let mut b = KernelBuilder::new("nest");
    let out = b.param("out", gptr(F32));
    let tile = b.shared_array("tile", F32, 64);
    let tid = b.thread_id_x();
    let smem = b.shared_ptr(tile);
    let (s, e4, st) = (b.const_u32(0), b.const_u32(4), b.const_u32(1));
    let zero = b.const_f32(0.0);
    let r = b.for_range(s, e4, st, &[zero], |b, i, acc| {
        // Each outer iteration: every thread writes its slot, a barrier, read a neighbour's.
        let fi = b.cvt(i, F32);
        let ft = b.cvt(tid, F32);
        let v = b.fma(fi, ft, fi);
        let p = b.ptr_add(smem, tid);
        b.store(p, v);
        b.barrier();
        let acc = b.for_range(s, e4, st, acc, |b, j, acc| {
            let k = b.add(tid, j);
            let c63 = b.const_u32(63);
            let k = b.and(k, c63);
            let q = b.ptr_add(smem, k);
            let w = b.load(q);
            let odd = b.const_u32(1);
            let bit = b.and(j, odd);
            let z = b.const_u32(0);
            let is_odd = b.ne(bit, z);
            let r = b.if_else(is_odd, |b| vec![b.add(acc[0], w)], |b| vec![b.sub(acc[0], w)]);
            vec![r[0]]
        });
        b.barrier();
        acc
    })[0];
    let p = b.ptr_add(out, tid);
    b.store(p, r);
    let k = b.finish().unwrap();
    let after = check(&k, "unroll", LaunchConfig::linear(1, 64), &[Arg::Buffer(vec![0; 256])]);
    assert!(loops(&after).is_empty(), "{}", print_kernel(&after));
    assert_eq!(count(&after, |o| matches!(o, Op::Barrier)), 8);
    assert_eq!(count(&after, |o| matches!(o, Op::If { .. })), 16);
}

#[test]
fn a_loop_that_never_runs_unrolls_to_nothing() {
    let after = run_carried(U32, 5, 5, 1);
    assert!(loops(&after).is_empty());
    assert_eq!(count(&after, |o| matches!(o, Op::Binary(BinaryOp::Mul, ..))), 0);
}

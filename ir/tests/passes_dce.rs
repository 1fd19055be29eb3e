//! `dce`: unused pure code, `if` results, loop-carried values and finite empty loops go;
//! anything that writes memory, synchronises or may fail stays.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::*;

use ScalarType::*;

#[test]
fn unused_pure_values_go_but_loads_and_possible_division_faults_stay() {
    let (before, after) = check_multi(I32, "dce", |b, x, y| {
        let _ = b.add(x, y);
        let c = b.const_i32(3);
        let _ = b.div(x, c);
        let _ = b.div(x, y);
        let _ = b.rem(y, x);
        let one = b.const_f32(1.0);
        let _ = b.tanh(one);
        vec![x]
    });
    let text = print_kernel(&after);
    assert!(!text.contains("= add ") && !text.contains("tanh"), "{text}");
    // Division by the variable may fail: it stays; the one by 3 cannot: it goes.
    assert_eq!(count(&after, |o| matches!(o, Op::Binary(BinaryOp::Div | BinaryOp::Rem, ..))), 2, "{text}");
    assert_eq!(count(&after, |o| matches!(o, Op::Load { .. })), count(&before, |o| matches!(o, Op::Load { .. })));
}

#[test]
fn a_dead_out_of_bounds_load_still_fails() {
    let mut b = KernelBuilder::new("oob");
    let x = b.param("x", gptr(U32));
    let far = b.const_u32(1000);
    let p = b.ptr_add(x, far);
    let _ = b.load(p);
    let k = b.finish().unwrap();
    let after = check(&k, "dce", LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0; 4])]);
    assert!(run(&after, LaunchConfig::linear(1, 1), &[Arg::Buffer(vec![0; 4])]).is_err());
}

#[test]
fn unused_shuffles_and_votes_stay_since_they_may_fail_off_warp() {
    let mut b = KernelBuilder::new("warp");
    let tid = b.thread_id_x();
    let one = b.const_u32(1);
    let _ = b.shfl(ShflMode::Down, tid, one);
    let c = b.lt(tid, one);
    let _ = b.vote(VoteMode::Any, c);
    let k = b.finish().unwrap();
    // 20 threads: a partial warp, which the shuffle rejects.
    let after = check(&k, "dce", LaunchConfig::linear(1, 20), &[]);
    assert!(run(&after, LaunchConfig::linear(1, 20), &[]).is_err());
    assert!(print_kernel(&after).contains("shfl"));
}

#[test]
fn unused_if_results_and_empty_ifs_go() {
    let (_, after) = check_multi(U32, "dce", |b, x, y| {
        let c = b.lt(x, y);
        let r = b.if_else(
            c,
            |b| {
                let s = b.add(x, y);
                vec![s, b.mul(x, y)]
            },
            |b| vec![b.sub(x, y), b.xor(x, y)],
        );
        // Only the second result is used; an `if` with no used result and no effect goes.
        let _ = b.if_else(c, |b| vec![b.add(x, x)], |_| vec![y]);
        vec![r[1]]
    });
    let text = print_kernel(&after);
    assert_eq!(text.matches("if ").count(), 2, "the range check and one if remain:\n{text}");
    assert!(!text.contains("= add ") && !text.contains("= sub "), "{text}");
}

#[test]
fn unused_loop_carried_values_and_their_computation_go() {
    let mut b = KernelBuilder::new("carried");
    let out = b.param("out", gptr(U32));
    let n = b.param("n", Type::U32);
    let tid = b.thread_id_x();
    let (s, st) = (b.const_u32(0), b.const_u32(1));
    let zero = b.const_u32(0);
    // Carried: a sum (used), a product only feeding itself (unused), and a pair swapped each
    // iteration of which only the first is used.
    let r = b.for_range(s, n, st, &[zero, tid, tid, zero], |b, iv, acc| {
        let sum = b.add(acc[0], iv);
        let prod = b.mul(acc[1], iv);
        vec![sum, prod, acc[3], acc[2]]
    });
    let v = b.add(r[0], r[2]);
    let p = b.ptr_add(out, tid);
    b.store(p, v);
    let k = b.finish().unwrap();
    let args = [Arg::Buffer(vec![0; 16]), Arg::Scalar(Constant::u32(5))];
    let after = check(&k, "dce", LaunchConfig::linear(1, 4), &args);
    let text = print_kernel(&after);
    assert!(!text.contains("= mul "), "{text}");
    // The sum and the swapped pair remain: the used half of the pair reads the other.
    let mut carried = vec![];
    after.walk(|_, i| {
        if let Op::For { init, .. } = &i.op {
            carried.push(init.len());
        }
    });
    assert_eq!(carried, [3], "{text}");
}

/// A loop whose body only computes an unused value, with step `step` and end `end`.
fn empty_loop(end: Option<u32>, step: u32) -> Kernel {
    let mut b = KernelBuilder::new("empty");
    let n = b.param("n", Type::U32);
    let end = match end {
        Some(e) => b.const_u32(e),
        None => n,
    };
    let (s, st) = (b.const_u32(0), b.const_u32(step));
    let zero = b.const_u32(0);
    b.for_range(s, end, st, &[zero], |b, iv, acc| vec![b.add(acc[0], iv)]);
    b.finish().unwrap()
}

#[test]
fn finite_empty_loops_go_and_possibly_endless_ones_stay() {
    let has_loop = |k: &Kernel| print_kernel(&optimized(k, "dce")).contains("for ");
    assert!(!has_loop(&empty_loop(Some(4096), 256)));
    // A unit step never wraps before `iv < n` fails, whatever `n` is.
    assert!(!has_loop(&empty_loop(None, 1)));
    // With n = 2^32 - 1 and a step of 256, iv wraps around and the loop never ends.
    assert!(has_loop(&empty_loop(None, 256)));
    assert!(has_loop(&empty_loop(Some(u32::MAX), 2)));
    let k = empty_loop(Some(4096), 256);
    check(&k, "dce", LaunchConfig::linear(1, 1), &[Arg::Scalar(Constant::u32(7))]);
}

#[test]
fn loops_and_ifs_with_effects_stay() {
    let mut b = KernelBuilder::new("effects");
    let out = b.param("out", gptr(U32));
    let tid = b.thread_id_x();
    let (s, e, st) = (b.const_u32(0), b.const_u32(4), b.const_u32(1));
    b.for_each(s, e, st, |b, iv| {
        let c = b.lt(tid, iv);
        b.if_then(c, |b| {
            let p = b.ptr_add(out, tid);
            b.store(p, iv);
        });
    });
    let k = b.finish().unwrap();
    let after = check(&k, "dce", LaunchConfig::linear(1, 8), &[Arg::Buffer(vec![0; 32])]);
    assert_eq!(print_kernel(&after), print_kernel(&k));
}

#[test]
fn dce_reports_whether_it_changed_anything() {
    use ruda_ir::passes::{Dce, Pass};
    let mut k = empty_loop(Some(8), 1);
    assert!(Dce.run(&mut k));
    assert!(!Dce.run(&mut k));
}

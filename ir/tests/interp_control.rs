//! Control flow under divergence, memory (vector, shared, dynamic shared, pointer arithmetic),
//! warp operations, atomics, special registers and scalar parameters.

use crate::interp_support;

use interp_support::*;
use ruda_ir::interp::{run, KernelArg, LaunchConfig};
use ruda_ir::{AtomicOp, Constant, KernelBuilder, ScalarType, ShflMode, SpecialReg, Type, Value, VoteMode};
use ScalarType::*;

fn linear(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig::linear(blocks, threads)
}

/// Store `v` at `out[index]`.
fn store_at(b: &mut KernelBuilder, out: Value, index: Value, v: Value) {
    let p = b.ptr_add(out, index);
    b.store(p, v);
}

#[test]
fn loops_with_divergent_trip_counts_and_carried_values() {
    // Thread t runs t iterations: the sum of iv, and a Fibonacci pair whose yields move one
    // carried value into another (a parallel copy).
    let mut b = KernelBuilder::new("loops");
    let out = b.param("out", gptr(U32));
    let fib = b.param("fib", gptr(U32));
    let t = b.thread_id_x();
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let r = b.for_range(zero, t, one, &[zero, zero, one], |b, iv, c| {
        let sum = b.add(c[0], iv);
        let next = b.add(c[1], c[2]);
        vec![sum, c[2], next]
    });
    store_at(&mut b, out, t, r[0]);
    store_at(&mut b, fib, t, r[1]);
    let k = b.finish().unwrap();
    let mut sums = vec![0u8; 4 * 70];
    let mut fibs = vec![0u8; 4 * 70];
    run(&k, &linear(1, 70), &mut [KernelArg::Buffer(&mut sums), KernelArg::Buffer(&mut fibs)]).unwrap();
    let (mut a, mut c) = (0u32, 1u32);
    for (t, (s, f)) in to_u32s(&sums).into_iter().zip(to_u32s(&fibs)).enumerate() {
        let t = t as u32;
        assert_eq!(s, t * t.saturating_sub(1) / 2, "sum for thread {t}");
        assert_eq!(f, a, "fib for thread {t}");
        (a, c) = (c, a.wrapping_add(c));
    }
}

#[test]
fn loops_compare_by_the_induction_type() {
    let mut b = KernelBuilder::new("bounds");
    let out = b.param("out", gptr(U32));
    let (c0, c1) = (b.const_u32(0), b.const_u32(1));
    let mut results = vec![];
    // i32 -5..3 step 2: -5, -3, -1, 1.
    let (s, e, st) = (b.const_i32(-5), b.const_i32(3), b.const_i32(2));
    results.push(b.for_range(s, e, st, &[c0], |b, _, c| vec![b.add(c[0], c1)])[0]);
    // u32 0xffff_fff0..5: no iteration (unsigned compare).
    let (s, e) = (b.const_u32(0xffff_fff0), b.const_u32(5));
    results.push(b.for_range(s, e, c1, &[c0], |b, _, c| vec![b.add(c[0], c1)])[0]);
    // i32 -16..5: 21 iterations (signed compare).
    let (s, e, st) = (b.const_i32(-16), b.const_i32(5), b.const_i32(1));
    results.push(b.for_range(s, e, st, &[c0], |b, _, c| vec![b.add(c[0], c1)])[0]);
    // i64 -2^40 .. -2^40 + 30 step 7: 5 iterations; u64 carried sum of iv - start.
    let (s, e, st) = (b.const_i64(-(1 << 40)), b.const_i64(-(1 << 40) + 30), b.const_i64(7));
    let r = b.for_range(s, e, st, &[c0], |b, _, c| vec![b.add(c[0], c1)]);
    results.push(r[0]);
    // An empty loop returns its initial values.
    let seven = b.const_u32(7);
    results.push(b.for_range(c1, c0, c1, &[seven], |b, _, c| vec![b.add(c[0], c1)])[0]);
    for (i, r) in results.into_iter().enumerate() {
        let idx = b.const_u32(i as u32);
        store_at(&mut b, out, idx, r);
    }
    let k = b.finish().unwrap();
    let mut buf = vec![0u8; 20];
    run(&k, &linear(1, 1), &mut [KernelArg::Buffer(&mut buf)]).unwrap();
    assert_eq!(to_u32s(&buf), vec![4, 0, 21, 5, 7]);
}

#[test]
fn if_else_yields_under_divergence() {
    // Odd threads: (3t, t as f32 * 0.5, vector (t, 1)); even: (t + 100, -1.0, vector (2, t)).
    // Inside the odd branch a loop with per-thread bounds and a nested if.
    let mut b = KernelBuilder::new("branches");
    let out = b.param("out", gptr(U32));
    let outf = b.param("outf", gptr(F32));
    let t = b.thread_id_x();
    let one = b.const_u32(1);
    let bit = b.and(t, one);
    let odd = b.eq(bit, one);
    let r = b.if_else(
        odd,
        |b| {
            let three = b.const_u32(3);
            let x = b.mul(t, three);
            let zero = b.const_u32(0);
            // sum over i < t of (i even ? i : 0)
            let s = b.for_range(zero, t, one, &[zero], |b, iv, c| {
                let low = b.and(iv, one);
                let even = b.eq(low, zero);
                let add = b.if_else(even, |b| vec![b.add(c[0], iv)], |_| vec![c[0]]);
                vec![add[0]]
            });
            let x = b.add(x, s[0]);
            let f = b.cvt(t, F32);
            let half = b.const_f32(0.5);
            let f = b.mul(f, half);
            let v = b.make_vector(&[t, one]);
            vec![x, f, v]
        },
        |b| {
            let hundred = b.const_u32(100);
            let x = b.add(t, hundred);
            let f = b.const_f32(-1.0);
            let two = b.const_u32(2);
            let v = b.make_vector(&[two, t]);
            vec![x, f, v]
        },
    );
    let e0 = b.extract(r[2], 0);
    let e1 = b.extract(r[2], 1);
    let x = b.add(r[0], e0);
    let x = b.add(x, e1);
    store_at(&mut b, out, t, x);
    store_at(&mut b, outf, t, r[1]);
    let k = b.finish().unwrap();
    let n = 100u32;
    let mut ints = vec![0u8; 4 * n as usize];
    let mut floats = vec![0u8; 4 * n as usize];
    run(&k, &linear(1, n), &mut [KernelArg::Buffer(&mut ints), KernelArg::Buffer(&mut floats)]).unwrap();
    let (ints, floats) = (to_u32s(&ints), to_f32s(&floats));
    for t in 0..n {
        let (want, wantf) = if t % 2 == 1 {
            let evens: u32 = (0..t).filter(|i| i % 2 == 0).sum();
            (3 * t + evens + t + 1, t as f32 * 0.5)
        } else {
            (t + 100 + 2 + t, -1.0)
        };
        assert_eq!((ints[t as usize], floats[t as usize]), (want, wantf), "thread {t}");
    }
}

#[test]
fn a_branch_no_lane_takes_is_skipped_and_few_lanes_compute_alone() {
    // The `then` branch would load out of bounds; no lane takes it. Thread 5 alone takes the
    // second branch (a sparse mask).
    let mut b = KernelBuilder::new("skip");
    let out = b.param("out", gptr(U32));
    let t = b.thread_id_x();
    let big = b.const_u32(1 << 20);
    let never = b.gt(t, big);
    b.if_then(never, |b| {
        let p = b.ptr_add(out, big);
        let v = b.load(p);
        b.store(out, v);
    });
    let five = b.const_u32(5);
    let is5 = b.eq(t, five);
    let r = b.if_else(
        is5,
        |b| {
            let c = b.const_u32(7);
            let x = b.mul(t, c);
            vec![b.add(x, c)]
        },
        |b| vec![b.const_u32(1)],
    );
    store_at(&mut b, out, t, r[0]);
    let k = b.finish().unwrap();
    let mut buf = vec![0u8; 4 * 256];
    run(&k, &linear(1, 256), &mut [KernelArg::Buffer(&mut buf)]).unwrap();
    let got = to_u32s(&buf);
    assert!(got.iter().enumerate().all(|(t, &v)| v == if t == 5 { 42 } else { 1 }), "{got:?}");
}

#[test]
fn block_reduction_through_shared_memory_and_barriers() {
    let mut b = KernelBuilder::new("block_sum");
    let input = b.param("in", gptr(F32));
    let out = b.param("out", gptr(F32));
    let tile = b.shared_array("tile", F32, 256);
    let s = b.shared_ptr(tile);
    let t = b.thread_id_x();
    let g = b.global_thread_id_x();
    let p = b.ptr_add(input, g);
    let v = b.load(p);
    store_at(&mut b, s, t, v);
    b.barrier();
    let (zero, eight, one) = (b.const_u32(0), b.const_u32(8), b.const_u32(1));
    b.for_each(zero, eight, one, |b, iv| {
        let top = b.const_u32(128);
        let stride = b.shr(top, iv);
        let active = b.lt(t, stride);
        b.if_then(active, |b| {
            let mine = b.ptr_add(s, t);
            let other_i = b.add(t, stride);
            let other = b.ptr_add(s, other_i);
            let (x, y) = (b.load(mine), b.load(other));
            let sum = b.add(x, y);
            b.store(mine, sum);
        });
        b.barrier();
    });
    let first = b.eq(t, zero);
    b.if_then(first, |b| {
        let total = b.load(s);
        let blk = b.block_id_x();
        store_at(b, out, blk, total);
    });
    let k = b.finish().unwrap();
    let blocks = 5;
    let data: Vec<f32> = (0..256 * blocks).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
    let mut input = f32s(&data);
    let mut out = vec![0u8; 4 * blocks];
    run(&k, &linear(blocks as u32, 256), &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out)]).unwrap();
    let want: Vec<f32> = data.chunks(256).map(|c| c.iter().sum()).collect();
    assert_eq!(to_f32s(&out), want);
}

#[test]
fn warp_shuffle_reduction_and_modes() {
    // Butterfly sum: every lane ends with its warp's total.
    let mut b = KernelBuilder::new("warp_sum");
    let input = b.param("in", gptr(U32));
    let out = b.param("out", gptr(U32));
    let g = b.global_thread_id_x();
    let p = b.ptr_add(input, g);
    let mut v = b.load(p);
    for m in [16, 8, 4, 2, 1] {
        let o = b.shfl_xor(v, m);
        v = b.add(v, o);
    }
    store_at(&mut b, out, g, v);
    let k = b.finish().unwrap();
    let data: Vec<u32> = (0..128).map(|i| i * i + 3).collect();
    let mut input = u32s(&data);
    let mut out = vec![0u8; 4 * 128];
    run(&k, &linear(2, 64), &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out)]).unwrap();
    let got = to_u32s(&out);
    for (i, g) in got.iter().enumerate() {
        let w = i / 32 * 32;
        assert_eq!(*g, data[w..w + 32].iter().sum::<u32>(), "lane {i}");
    }

    // Every mode with a per-lane lane operand (taken modulo 32, as PTX's b[4:0]).
    for mode in [ShflMode::Idx, ShflMode::Bfly, ShflMode::Down, ShflMode::Up] {
        let inputs = vec![(0..64).map(|i| 1000 + i).collect::<Vec<u64>>(), (0..64).map(|i| (i * 7 + 3) % 70).collect()];
        let got = map(&[U32, U32], U32, &inputs, |b, v| b.shfl(mode, v[0], v[1]));
        for (i, &g) in got.iter().enumerate() {
            let (l, w0, bval) = (i % 32, i / 32 * 32, (inputs[1][i] & 31) as usize);
            let src = match mode {
                ShflMode::Idx => bval,
                ShflMode::Bfly => l ^ bval,
                ShflMode::Down => {
                    if l + bval <= 31 {
                        l + bval
                    } else {
                        l
                    }
                }
                ShflMode::Up => {
                    if l >= bval {
                        l - bval
                    } else {
                        l
                    }
                }
            };
            assert_eq!(g, inputs[0][w0 + src], "shfl.{mode} lane {i} b {}", inputs[1][i]);
        }
    }
}

#[test]
fn votes_over_each_warp() {
    let mut b = KernelBuilder::new("votes");
    let input = b.param("in", gptr(U32));
    let out = b.param("out", gptr(U32));
    let t = b.thread_id_x();
    let p = b.ptr_add(input, t);
    let x = b.load(p);
    let zero = b.const_u32(0);
    let pred = b.ne(x, zero);
    let all = b.vote(VoteMode::All, pred);
    let any = b.vote(VoteMode::Any, pred);
    let ballot = b.vote(VoteMode::Ballot, pred);
    let (one, two) = (b.const_u32(1), b.const_u32(2));
    let all = b.select(all, one, zero);
    let any = b.select(any, two, zero);
    let flags = b.or(all, any);
    let base = b.mul(t, two);
    store_at(&mut b, out, base, flags);
    let i1 = b.add(base, one);
    store_at(&mut b, out, i1, ballot);
    let k = b.finish().unwrap();
    // Warp 0: every third lane; warp 1: all; warp 2: none; warp 3: lane 31 only.
    let data: Vec<u32> = (0..128)
        .map(|i| match i / 32 {
            0 => (i % 3 == 0) as u32,
            1 => 5,
            2 => 0,
            _ => (i % 32 == 31) as u32,
        })
        .collect();
    let mut input = u32s(&data);
    let mut out = vec![0u8; 4 * 2 * 128];
    run(&k, &linear(1, 128), &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out)]).unwrap();
    let got = to_u32s(&out);
    for w in 0..4 {
        let preds: Vec<bool> = data[w * 32..w * 32 + 32].iter().map(|&x| x != 0).collect();
        let ballot = preds.iter().enumerate().fold(0u32, |acc, (l, &p)| acc | ((p as u32) << l));
        let flags = preds.iter().all(|&p| p) as u32 | (preds.iter().any(|&p| p) as u32) << 1;
        for l in 0..32 {
            let i = w * 32 + l;
            assert_eq!((got[2 * i], got[2 * i + 1]), (flags, ballot), "warp {w} lane {l}");
        }
    }
}

#[test]
fn warp_operations_inside_a_warp_uniform_branch() {
    // Only warp 1 shuffles; the other warps are wholly inactive, which is allowed.
    let mut b = KernelBuilder::new("warp_branch");
    let out = b.param("out", gptr(U32));
    let t = b.thread_id_x();
    let five = b.const_u32(5);
    let warp = b.shr(t, five);
    let one = b.const_u32(1);
    let is1 = b.eq(warp, one);
    b.if_then(is1, |b| {
        let lane = b.lane_id();
        let src = b.const_u32(3);
        let v = b.shfl(ShflMode::Idx, lane, src);
        store_at(b, out, t, v);
    });
    let k = b.finish().unwrap();
    let mut out = vec![0u8; 4 * 96];
    run(&k, &linear(1, 96), &mut [KernelArg::Buffer(&mut out)]).unwrap();
    let got = to_u32s(&out);
    assert!(got.iter().enumerate().all(|(i, &v)| v == if (32..64).contains(&i) { 3 } else { 0 }), "{got:?}");
}

#[test]
fn atomics_from_many_blocks_are_exact() {
    let mut b = KernelBuilder::new("atomics");
    let counters = b.param("counters", gptr(U32));
    let sums = b.param("sums", gptr(U64));
    let signed = b.param("signed", gptr(I32));
    let floats = b.param("floats", gptr(F32));
    let olds = b.param("olds", gptr(U32));
    let g = b.global_thread_id_x();
    let one = b.const_u32(1);
    let old = b.atomic(AtomicOp::Add, counters, one);
    store_at(&mut b, olds, g, old);
    let g64 = b.cvt(g, U64);
    b.atomic(AtomicOp::Add, sums, g64);
    // max and min of (g * 7919) % 10007 - 5000 as i32
    let (p, m, off) = (b.const_u32(7919), b.const_u32(10007), b.const_i32(5000));
    let x = b.mul(g, p);
    let x = b.rem(x, m);
    let x = b.bitcast(x, I32);
    let x = b.sub(x, off);
    b.atomic(AtomicOp::Max, signed, x);
    let i1 = b.const_u32(1);
    let min_slot = b.ptr_add(signed, i1);
    b.atomic(AtomicOp::Min, min_slot, x);
    let fone = b.const_f32(1.0);
    b.atomic(AtomicOp::Add, floats, fone);
    let k = b.finish().unwrap();
    let (blocks, threads) = (64u32, 128u32);
    let n = (blocks * threads) as usize;
    let mut counters = vec![0u8; 4];
    let mut sums = vec![0u8; 8];
    let mut signed = [i32::MIN.to_le_bytes(), i32::MAX.to_le_bytes()].concat();
    let mut floats = vec![0u8; 4];
    let mut olds = vec![0u8; 4 * n];
    ruda_ir::interp::run_with_threads(
        &k,
        &linear(blocks, threads),
        &mut [
            KernelArg::Buffer(&mut counters),
            KernelArg::Buffer(&mut sums),
            KernelArg::Buffer(&mut signed),
            KernelArg::Buffer(&mut floats),
            KernelArg::Buffer(&mut olds),
        ],
        4,
    )
    .unwrap();
    assert_eq!(to_u32s(&counters), vec![n as u32]);
    assert_eq!(u64::from_le_bytes(sums.try_into().unwrap()), (n as u64) * (n as u64 - 1) / 2);
    let xs: Vec<i32> = (0..n as u32).map(|g| (g.wrapping_mul(7919) % 10007) as i32 - 5000).collect();
    let got: Vec<i32> = signed.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, vec![*xs.iter().max().unwrap(), *xs.iter().min().unwrap()]);
    assert_eq!(to_f32s(&floats), vec![n as f32]);
    // Every old value of the counter was seen exactly once.
    let mut seen = to_u32s(&olds);
    seen.sort_unstable();
    assert!(seen.iter().enumerate().all(|(i, &v)| v == i as u32));
}

#[test]
fn exchange_compare_and_swap_and_shared_atomics() {
    // Thread t: cas(cells[t], compare = t, value = 100 + t) succeeds for even t (cells hold t)
    // and fails for odd t (cells hold t + 1); exch on f64 returns the old value; a shared
    // histogram by t % 4 built with shared atomics.
    let mut b = KernelBuilder::new("cas");
    let cells = b.param("cells", gptr(U32));
    let olds = b.param("olds", gptr(U32));
    let dbl = b.param("dbl", gptr(F64));
    let hist_out = b.param("hist", gptr(U32));
    let hist = b.shared_array("hist", U32, 4);
    let sh = b.shared_ptr(hist);
    let t = b.thread_id_x();
    let zero = b.const_u32(0);
    let four = b.const_u32(4);
    let first = b.lt(t, four);
    b.if_then(first, |b| store_at(b, sh, t, zero));
    b.barrier();
    let cell = b.ptr_add(cells, t);
    let hundred = b.const_u32(100);
    let v = b.add(t, hundred);
    let old = b.atomic_cas(cell, t, v);
    store_at(&mut b, olds, t, old);
    let tf = b.cvt(t, F64);
    let d = b.ptr_add(dbl, t);
    let prev = b.atomic(AtomicOp::Exch, d, tf);
    let prev = b.cvt(prev, U32);
    let three = b.const_u32(3);
    let bucket = b.and(t, three);
    let hp = b.ptr_add(sh, bucket);
    let one = b.const_u32(1);
    b.atomic(AtomicOp::Add, hp, one);
    b.barrier();
    b.if_then(first, |b| {
        let p = b.ptr_add(sh, t);
        let h = b.load(p);
        let h = b.add(h, prev);
        store_at(b, hist_out, t, h);
    });
    let k = b.finish().unwrap();
    let n = 64u32;
    let init: Vec<u32> = (0..n).map(|t| if t % 2 == 0 { t } else { t + 1 }).collect();
    let mut cells = u32s(&init);
    let mut olds = vec![0u8; 4 * n as usize];
    let mut dbl: Vec<u8> = (0..n).flat_map(|t| (t as f64 * 10.0).to_le_bytes()).collect();
    let mut hist = vec![0u8; 16];
    run(
        &k,
        &linear(1, n),
        &mut [
            KernelArg::Buffer(&mut cells),
            KernelArg::Buffer(&mut olds),
            KernelArg::Buffer(&mut dbl),
            KernelArg::Buffer(&mut hist),
        ],
    )
    .unwrap();
    let cells = to_u32s(&cells);
    for t in 0..n as usize {
        let want = if t % 2 == 0 { 100 + t as u32 } else { init[t] };
        assert_eq!(cells[t], want, "cell {t}");
    }
    assert_eq!(to_u32s(&olds), init);
    let dbl: Vec<f64> = dbl.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(dbl.iter().enumerate().all(|(t, &x)| x == t as f64));
    // Each bucket counts 16 threads; thread t < 4 adds the old f64 value 10 t.
    assert_eq!(to_u32s(&hist), vec![16, 26, 36, 46]);
}

#[test]
fn special_registers_in_a_3d_launch() {
    let mut b = KernelBuilder::new("specials");
    let out = b.param("out", gptr(U32));
    let regs = SpecialReg::ALL;
    let vals: Vec<Value> = regs.iter().map(|&r| b.special(r)).collect();
    // Linear thread index and linear block index.
    let [tx, ty, tz, nx, ny, _, cx, cy, cz, gx, gy, ..] = vals[..] else { unreachable!() };
    let t = b.mul(tz, ny);
    let t = b.add(t, ty);
    let t = b.mul(t, nx);
    let t = b.add(t, tx);
    let blk = b.mul(cz, gy);
    let blk = b.add(blk, cy);
    let blk = b.mul(blk, gx);
    let blk = b.add(blk, cx);
    let threads = b.const_u32(24);
    let lin = b.fma(blk, threads, t);
    let count = b.const_u32(regs.len() as u32);
    let base = b.mul(lin, count);
    for (i, &v) in vals.iter().enumerate() {
        let off = b.const_u32(i as u32);
        let idx = b.add(base, off);
        store_at(&mut b, out, idx, v);
    }
    let k = b.finish().unwrap();
    let (grid, block) = ([2u32, 3, 2], [4u32, 2, 3]);
    let mut out = vec![0u8; 4 * 12 * 24 * regs.len()];
    let cfg = LaunchConfig { grid, block, dynamic_shared_bytes: 0 };
    run(&k, &cfg, &mut [KernelArg::Buffer(&mut out)]).unwrap();
    let got = to_u32s(&out);
    let mut i = 0;
    for (cz, cy, cx) in (0..2).flat_map(|z| (0..3).flat_map(move |y| (0..2).map(move |x| (z, y, x)))) {
        for (tz, ty, tx) in (0..3).flat_map(|z| (0..2).flat_map(move |y| (0..4).map(move |x| (z, y, x)))) {
            let lin = tx + ty * 4 + tz * 8;
            let want = [tx, ty, tz, 4, 2, 3, cx, cy, cz, 2, 3, 2, lin % 32];
            assert_eq!(&got[i..i + 13], &want, "block ({cx},{cy},{cz}) thread ({tx},{ty},{tz})");
            i += 13;
        }
    }
}

#[test]
fn static_and_dynamic_shared_memory_do_not_overlap() {
    // Static u8[3] and f64[2], then the dynamic window (u32) at the next 16-byte boundary.
    let mut b = KernelBuilder::new("layout");
    let out = b.param("out", gptr(U32));
    let small = b.shared_array("small", U8, 3);
    let dbl = b.shared_array("dbl", F64, 2);
    let (sp, dp) = (b.shared_ptr(small), b.shared_ptr(dbl));
    let dyn_ = b.dyn_shared_ptr(U32);
    let t = b.thread_id_x();
    let zero = b.const_u32(0);
    let is0 = b.eq(t, zero);
    b.if_then(is0, |b| {
        let c = b.constant(Constant::new(U8, 0xab));
        b.store(sp, c);
        let two = b.const_u32(2);
        let p = b.ptr_add(sp, two);
        b.store(p, c);
        let one = b.const_u32(1);
        let p = b.ptr_add(dp, one);
        let x = b.const_f64(-2.5);
        b.store(p, x);
    });
    let v = b.const_u32(0xdead_0000);
    let v = b.add(v, t);
    store_at(&mut b, dyn_, t, v);
    b.barrier();
    let two = b.const_u32(2);
    let p = b.ptr_add(sp, two);
    let byte = b.load(p);
    let byte = b.cvt(byte, U32);
    let one = b.const_u32(1);
    let p = b.ptr_add(dp, one);
    let x = b.load(p);
    let x = b.cvt_with(x, ruda_ir::Cvt { to: I32, rounding: Some(ruda_ir::Rounding::Rz), sat: false });
    let x = b.bitcast(x, U32);
    let mine = b.ptr_add(dyn_, t);
    let mine = b.load(mine);
    let r = b.add(byte, x);
    let r = b.xor(r, mine);
    store_at(&mut b, out, t, r);
    let k = b.finish().unwrap();
    let n = 32;
    let mut out = vec![0u8; 4 * n];
    let cfg = LaunchConfig { grid: [1, 1, 1], block: [n as u32, 1, 1], dynamic_shared_bytes: 4 * n as u32 };
    run(&k, &cfg, &mut [KernelArg::Buffer(&mut out)]).unwrap();
    let want: Vec<u32> = (0..n as u32).map(|t| (0xabu32.wrapping_add(-2i32 as u32)) ^ (0xdead_0000 + t)).collect();
    assert_eq!(to_u32s(&out), want);
}

#[test]
fn vector_loads_and_stores() {
    // out4[t] = reverse(in4[t]) as v4.f32 (global); f16 v2 pairs through shared memory; f64 v2.
    let mut b = KernelBuilder::new("vectors");
    let in4 = b.param("in4", gptr(F32));
    let out4 = b.param("out4", gptr(F32));
    let halves = b.param("halves", gptr(F16));
    let dbl = b.param("dbl", gptr(F64));
    let tile = b.shared_array("tile", F16, 128);
    let s = b.shared_ptr(tile);
    let t = b.thread_id_x();
    let four = b.const_u32(4);
    let two = b.const_u32(2);
    let i4 = b.mul(t, four);
    let p = b.ptr_add(in4, i4);
    let v = b.load_vec(p, 4);
    let e: Vec<Value> = (0..4).map(|i| b.extract(v, 3 - i)).collect();
    let r = b.make_vector(&e);
    let q = b.ptr_add(out4, i4);
    b.store(q, r);
    let i2 = b.mul(t, two);
    let p = b.ptr_add(halves, i2);
    let h = b.load_vec(p, 2);
    let sp = b.ptr_add(s, i2);
    b.store(sp, h);
    b.barrier();
    // Thread t reads the pair of thread (t + 1) % n and writes it back swapped.
    let one = b.const_u32(1);
    let n = b.block_dim_x();
    let u = b.add(t, one);
    let u = b.rem(u, n);
    let u2 = b.mul(u, two);
    let sp = b.ptr_add(s, u2);
    let h = b.load_vec(sp, 2);
    let (h0, h1) = (b.extract(h, 0), b.extract(h, 1));
    let sw = b.make_vector(&[h1, h0]);
    b.barrier();
    b.store(p, sw);
    let p = b.ptr_add(dbl, i2);
    let d = b.load_vec(p, 2);
    let (d0, d1) = (b.extract(d, 0), b.extract(d, 1));
    let sum = b.add(d0, d1);
    let v = b.make_vector(&[sum, d0]);
    b.store(p, v);
    let k = b.finish().unwrap();
    let n = 64usize;
    let data: Vec<f32> = (0..4 * n).map(|i| i as f32 * 1.25).collect();
    let mut in4 = f32s(&data);
    let mut out4 = vec![0u8; 16 * n];
    let hs: Vec<u16> = (0..2 * n).map(|i| half::f16::from_f32(i as f32).to_bits()).collect();
    let mut halves: Vec<u8> = hs.iter().flat_map(|h| h.to_le_bytes()).collect();
    let ds: Vec<f64> = (0..2 * n).map(|i| i as f64 / 4.0).collect();
    let mut dbl: Vec<u8> = ds.iter().flat_map(|d| d.to_le_bytes()).collect();
    run(
        &k,
        &linear(1, n as u32),
        &mut [
            KernelArg::Buffer(&mut in4),
            KernelArg::Buffer(&mut out4),
            KernelArg::Buffer(&mut halves),
            KernelArg::Buffer(&mut dbl),
        ],
    )
    .unwrap();
    let want4: Vec<f32> = data.chunks(4).flat_map(|c| [c[3], c[2], c[1], c[0]]).collect();
    assert_eq!(to_f32s(&out4), want4);
    let got_h: Vec<u16> = halves.chunks(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect();
    for t in 0..n {
        let u = (t + 1) % n;
        assert_eq!((got_h[2 * t], got_h[2 * t + 1]), (hs[2 * u + 1], hs[2 * u]), "pair {t}");
    }
    let got_d: Vec<f64> = dbl.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    for t in 0..n {
        assert_eq!((got_d[2 * t], got_d[2 * t + 1]), (ds[2 * t] + ds[2 * t + 1], ds[2 * t]));
    }
}

#[test]
fn pointer_arithmetic_and_casts() {
    // From the middle of a u32 buffer: index -1 (i32), +2 (u64), -3 (i64); bytes through a u8
    // view are little-endian; select between two pointers.
    let mut b = KernelBuilder::new("ptrs");
    let buf = b.param("buf", gptr(U32));
    let out = b.param("out", gptr(U32));
    let mid = b.const_u32(8);
    let m = b.ptr_add(buf, mid);
    let idx: [Value; 3] = [b.const_i32(-1), b.const_u64(2), b.const_i64(-3)];
    let mut vals = vec![];
    for i in idx {
        let p = b.ptr_add(m, i);
        vals.push(b.load(p));
    }
    let bytes = b.ptr_cast(m, U8);
    let three = b.const_u32(3);
    let p = b.ptr_add(bytes, three);
    let byte = b.load(p);
    vals.push(b.cvt(byte, U32));
    let t = b.thread_id_x();
    let zero = b.const_u32(0);
    let c = b.eq(t, zero);
    let other = b.ptr_add(buf, three);
    let chosen = b.select(c, m, other);
    vals.push(b.load(chosen));
    for (i, v) in vals.into_iter().enumerate() {
        let idx = b.const_u32(i as u32);
        store_at(&mut b, out, idx, v);
    }
    let k = b.finish().unwrap();
    let data: Vec<u32> = (0..16).map(|i| 0x1100_0000 * (i % 3) + i * 0x0101).collect();
    let mut buf = u32s(&data);
    let mut out = vec![0u8; 20];
    run(&k, &linear(1, 1), &mut [KernelArg::Buffer(&mut buf), KernelArg::Buffer(&mut out)]).unwrap();
    assert_eq!(to_u32s(&out), vec![data[7], data[10], data[5], data[8] >> 24, data[8]]);
}

#[test]
fn scalar_parameters_of_each_type() {
    let types = [I16, I32, I64, U16, U32, U64, F32, F64, F16, BF16, U8, I8];
    let mut b = KernelBuilder::new("params");
    let out = b.param("out", gptr(U64));
    let params: Vec<Value> =
        types.iter().enumerate().map(|(i, &t)| b.param(format!("p{i}"), Type::Scalar(t))).collect();
    for (i, (&p, &t)) in params.iter().zip(&types).enumerate() {
        let w = match t.bits() {
            8 => b.bitcast(p, U8),
            16 => b.bitcast(p, U16),
            32 => b.bitcast(p, U32),
            _ => b.bitcast(p, U64),
        };
        let w = if t.bits() < 64 { b.cvt(w, U64) } else { w };
        let idx = b.const_u32(i as u32);
        store_at(&mut b, out, idx, w);
    }
    let k = b.finish().unwrap();
    let bits: Vec<u64> =
        types.iter().enumerate().map(|(i, t)| (0x8123_4567_89ab_cdefu64 >> i) & width_mask(*t)).collect();
    let mut out = vec![0u8; 8 * types.len()];
    let mut args = vec![KernelArg::Buffer(&mut out)];
    args.extend(types.iter().zip(&bits).map(|(&t, &x)| KernelArg::Scalar(Constant::new(t, x))));
    run(&k, &linear(1, 1), &mut args).unwrap();
    drop(args);
    assert_eq!(from_bytes(U64, &out), bits);
}

#[test]
fn unaligned_host_buffers_are_staged() {
    // A buffer starting at an odd host address still sees aligned device addresses.
    let mut b = KernelBuilder::new("staged");
    let buf = b.param("buf", gptr(U32));
    let t = b.thread_id_x();
    let p = b.ptr_add(buf, t);
    let v = b.load(p);
    let one = b.const_u32(1);
    let v = b.add(v, one);
    b.store(p, v);
    let k = b.finish().unwrap();
    let mut backing = [0u8; 4 * 8 + 1];
    let start = if backing.as_ptr().align_offset(8) == 0 { 1 } else { 0 };
    let slice = &mut backing[start..start + 32];
    slice.copy_from_slice(&u32s(&[1, 2, 3, 4, 5, 6, 7, 8]));
    run(&k, &linear(1, 8), &mut [KernelArg::Buffer(slice)]).unwrap();
    assert_eq!(to_u32s(&backing[start..start + 32]), vec![2, 3, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn values_live_across_nested_loops_and_branches_keep_their_slots() {
    // Values defined outside loops and used only late inside them (or only in one branch)
    // must survive every iteration; vector carried values swap each iteration.
    let mut b = KernelBuilder::new("liveness");
    let out = b.param("out", gptr(U32));
    let t = b.thread_id_x();
    let (zero, one, two, three) = (b.const_u32(0), b.const_u32(1), b.const_u32(2), b.const_u32(3));
    let x = b.mul(t, three);
    let y = b.add(t, two);
    let z = b.xor(t, one);
    let v0 = b.make_vector(&[t, one]);
    let v1 = b.make_vector(&[zero, two]);
    let r = b.for_range(zero, three, one, &[zero, v0, v1], |b, i, c| {
        let inner = b.for_range(zero, y, one, &[c[0]], |b, j, d| {
            let odd = b.and(j, one);
            let is_odd = b.eq(odd, one);
            let a = b.if_else(is_odd, |b| vec![b.add(d[0], x)], |b| vec![b.add(d[0], z)]);
            let tmp = b.mul(a[0], three);
            let tmp = b.sub(tmp, a[0]);
            let tmp = b.sub(tmp, a[0]);
            vec![b.add(tmp, i)]
        });
        vec![inner[0], c[2], c[1]]
    });
    let e = b.extract(r[1], 0);
    let f = b.extract(r[2], 1);
    let s = b.add(r[0], e);
    let s = b.add(s, f);
    let p = b.ptr_add(out, t);
    b.store(p, s);
    let k = b.finish().unwrap();
    let n = 50u32;
    let mut buf = vec![0u8; 4 * n as usize];
    run(&k, &linear(1, n), &mut [KernelArg::Buffer(&mut buf)]).unwrap();
    let got = to_u32s(&buf);
    for t in 0..n {
        let (x, y, z) = (t * 3, t + 2, t ^ 1);
        let mut acc = 0u32;
        let (mut v0, mut v1) = ([t, 1], [0, 2]);
        for i in 0..3 {
            for j in 0..y {
                acc += if j % 2 == 1 { x } else { z };
                acc += i;
            }
            (v0, v1) = (v1, v0);
        }
        assert_eq!(got[t as usize], acc + v0[0] + v1[1], "thread {t}");
    }
}

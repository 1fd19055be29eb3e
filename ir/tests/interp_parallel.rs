//! Results do not depend on how many CPU threads run the blocks, and the interpreter is fast
//! enough for model tests.

use crate::interp_support;

use std::time::Instant;

use interp_support::*;
use ruda_ir::interp::{run_profiled, run_with_threads, KernelArg, LaunchConfig};
use ruda_ir::{AtomicOp, Kernel, KernelBuilder, ScalarType::*};

/// Per block: a shared-memory prefix pass, a warp reduction, integer atomics into a global
/// histogram, and a per-thread loop of divergent length.
fn busy_kernel() -> Kernel {
    let mut b = KernelBuilder::new("busy");
    let input = b.param("in", gptr(U32));
    let out = b.param("out", gptr(U32));
    let hist = b.param("hist", gptr(U32));
    let tile = b.shared_array("tile", U32, 128);
    let s = b.shared_ptr(tile);
    let t = b.thread_id_x();
    let g = b.global_thread_id_x();
    let p = b.ptr_add(input, g);
    let x = b.load(p);
    let sp = b.ptr_add(s, t);
    b.store(sp, x);
    b.barrier();
    let (zero, one, seven, fifteen) = (b.const_u32(0), b.const_u32(1), b.const_u32(7), b.const_u32(15));
    let n = b.and(x, fifteen);
    let acc = b.for_range(zero, n, one, &[x], |b, iv, c| {
        let i = b.add(t, iv);
        let mask = b.const_u32(127);
        let i = b.and(i, mask);
        let q = b.ptr_add(s, i);
        let y = b.load(q);
        let y = b.mul(y, seven);
        vec![b.xor(c[0], y)]
    });
    let mut v = acc[0];
    for m in [16, 8, 4, 2, 1] {
        let o = b.shfl_xor(v, m);
        v = b.add(v, o);
    }
    let q = b.ptr_add(out, g);
    b.store(q, v);
    let bucket = b.and(v, fifteen);
    let h = b.ptr_add(hist, bucket);
    b.atomic(AtomicOp::Add, h, one);
    b.finish().unwrap()
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let k = busy_kernel();
    let blocks = 97u32;
    let n = (blocks * 128) as usize;
    let data: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
    let mut results = vec![];
    for threads in [1, 2, 3, 8] {
        let mut input = u32s(&data);
        let mut out = vec![0u8; 4 * n];
        let mut hist = vec![0u8; 64];
        run_with_threads(
            &k,
            &LaunchConfig::linear(blocks, 128),
            &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out), KernelArg::Buffer(&mut hist)],
            threads,
        )
        .unwrap();
        assert_eq!(to_u32s(&hist).iter().sum::<u32>(), n as u32);
        results.push((out, hist));
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

/// Profiles too: the counts are sums over blocks (and a union of sectors) that no schedule
/// changes, and a profiled launch computes what a plain one does.
#[test]
fn profiles_do_not_depend_on_the_thread_count() {
    let k = busy_kernel();
    let blocks = 37u32;
    let n = (blocks * 128) as usize;
    let data: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
    let launch = LaunchConfig::linear(blocks, 128);
    let mut plain = (u32s(&data), vec![0u8; 4 * n], vec![0u8; 64]);
    run_with_threads(
        &k,
        &launch,
        &mut [KernelArg::Buffer(&mut plain.0), KernelArg::Buffer(&mut plain.1), KernelArg::Buffer(&mut plain.2)],
        2,
    )
    .unwrap();
    let mut profiles = vec![];
    for threads in [1, 4] {
        let (mut input, mut out, mut hist) = (u32s(&data), vec![0u8; 4 * n], vec![0u8; 64]);
        let profile = run_profiled(
            &k,
            &launch,
            &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out), KernelArg::Buffer(&mut hist)],
            threads,
        )
        .unwrap();
        assert_eq!((&out, &hist), (&plain.1, &plain.2), "{threads} threads");
        profiles.push(profile);
    }
    assert_eq!(profiles[0], profiles[1]);
    let p = &profiles[0];
    // By the kernel's shape: 4 warps per block load their 128 consecutive words once (4
    // sectors each), store once, and each does one histogram atomic and 5 shuffles.
    let warps = 4 * blocks as u64;
    assert_eq!(p.totals.global_load_requests, warps);
    assert_eq!(p.totals.global_load_sectors, 4 * warps);
    assert_eq!(p.totals.global_store_sectors, 4 * warps);
    assert_eq!(p.totals.global_atomic_requests, warps);
    assert_eq!(p.totals.instructions.shuffles, 5 * warps);
    assert_eq!(p.totals.instructions.barriers, warps);
    // The input and output are touched whole, the histogram where a bucket was hit.
    let hist_sectors = plain.2.chunks(32).filter(|s| s.iter().any(|&b| b != 0)).count() as u64;
    assert_eq!(p.dram_bytes_min, 2 * 4 * n as u64 + 32 * hist_sectors);
    assert!(p.sites.windows(2).all(|w| w[0].inst < w[1].inst), "sites in InstId order");
    assert!(p.sites.iter().all(|s| s.loc.as_ref().is_some_and(|l| l.file.ends_with("interp_parallel.rs"))));
    assert!(p.sites.iter().any(|s| s.op == "shfl.bfly" && s.counters.instructions.shuffles == warps));
}

/// A 256-thread block doing 8 dependent f32 fmas per iteration: `blocks * 256 * iters * 8`
/// lane-ops, single-threaded, plain and profiled.
#[test]
fn lane_op_throughput() {
    let iters = 640u32;
    let blocks = 8u32;
    let mut b = KernelBuilder::new("throughput");
    let out = b.param("out", gptr(F32));
    let g = b.global_thread_id_x();
    let x = b.cvt(g, F32);
    let scale = b.const_f32(1e-6);
    let x = b.mul(x, scale);
    let (zero, one, end) = (b.const_u32(0), b.const_u32(1), b.const_u32(iters));
    let init: Vec<_> = (0..4).map(|i| b.const_f32(i as f32)).collect();
    let r = b.for_range(zero, end, one, &init, |b, _, c| {
        let k = b.const_f32(0.999);
        let mut next = vec![];
        for &v in c {
            let y = b.fma(v, k, x);
            next.push(b.fma(y, k, x));
        }
        next
    });
    let s = b.add(r[0], r[1]);
    let s2 = b.add(r[2], r[3]);
    let s = b.add(s, s2);
    let p = b.ptr_add(out, g);
    b.store(p, s);
    let k = b.finish().unwrap();
    let lane_ops = blocks as f64 * 256.0 * iters as f64 * 8.0;
    let mut buf = vec![0u8; 4 * 256 * blocks as usize];
    let start = Instant::now();
    run_with_threads(&k, &LaunchConfig::linear(blocks, 256), &mut [KernelArg::Buffer(&mut buf)], 1).unwrap();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "interp throughput: {lane_ops:.2e} lane-ops in {:.1} ms = {:.2e} lane-ops/s (1 thread)",
        secs * 1e3,
        lane_ops / secs
    );
    assert!(secs < 1.0, "{lane_ops:.2e} lane-ops took {secs:.2} s");
    // The loop computed something: thread 0 has x = 0, so each chain is c * 0.999^(2 iters).
    let got = to_f32s(&buf)[0];
    let want: f32 = (0..4).map(|i| i as f32 * 0.999f32.powi(2 * iters as i32)).sum();
    assert!((got - want).abs() < 1e-3 * want, "{got} vs {want}");

    // Profiled, the same launch counts its flops: per lane, 8 fmas of 2 flops per iteration,
    // and the scaling mul and the 3 adds of the final sum.
    let start = Instant::now();
    let p = run_profiled(&k, &LaunchConfig::linear(blocks, 256), &mut [KernelArg::Buffer(&mut buf)], 1).unwrap();
    let profiled = start.elapsed().as_secs_f64();
    eprintln!("interp throughput profiled: {:.1} ms, {:.1}x the plain run", profiled * 1e3, profiled / secs);
    assert_eq!(p.totals.flops, 2 * lane_ops as u64 + 4 * 256 * blocks as u64);
    assert!(profiled < 2.0, "the profiled launch took {profiled:.2} s");

    // A memory-bound shape: a 64x64x64 matmul, one output per thread.
    let mut b = KernelBuilder::new("matmul");
    let a = b.param("a", gptr(F32));
    let bm = b.param("b", gptr(F32));
    let c = b.param("c", gptr(F32));
    let g = b.global_thread_id_x();
    let sixty_four = b.const_u32(64);
    let row = b.div(g, sixty_four);
    let col = b.rem(g, sixty_four);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let acc0 = b.const_f32(0.0);
    let acc = b.for_range(zero, sixty_four, one, &[acc0], |b, kk, acc| {
        let ai = b.fma(row, sixty_four, kk);
        let bi = b.fma(kk, sixty_four, col);
        let pa = b.ptr_add(a, ai);
        let pb = b.ptr_add(bm, bi);
        let (x, y) = (b.load(pa), b.load(pb));
        vec![b.fma(x, y, acc[0])]
    });
    let pc = b.ptr_add(c, g);
    b.store(pc, acc[0]);
    let k = b.finish().unwrap();
    let av: Vec<f32> = (0..4096).map(|i| (i % 13) as f32 - 6.0).collect();
    let bv: Vec<f32> = (0..4096).map(|i| (i % 7) as f32 - 3.0).collect();
    let (mut ab, mut bb, mut cb) = (f32s(&av), f32s(&bv), vec![0u8; 4 * 4096]);
    let start = Instant::now();
    run_with_threads(
        &k,
        &LaunchConfig::linear(16, 256),
        &mut [KernelArg::Buffer(&mut ab), KernelArg::Buffer(&mut bb), KernelArg::Buffer(&mut cb)],
        1,
    )
    .unwrap();
    let secs = start.elapsed().as_secs_f64();
    // 7 lane-ops per inner iteration: 2 index fmas, 2 ptradds, 2 loads, 1 fma.
    let ops = 4096.0 * 64.0 * 7.0;
    eprintln!("interp matmul 64^3: {:.1} ms = {:.2e} lane-ops/s (1 thread)", secs * 1e3, ops / secs);
    let cv = to_f32s(&cb);
    for (i, got) in cv.iter().enumerate().step_by(61) {
        let (r, col) = (i / 64, i % 64);
        let want: f32 = (0..64).map(|k| av[r * 64 + k] * bv[k * 64 + col]).sum();
        assert_eq!(*got, want, "c[{r}][{col}]");
    }
}

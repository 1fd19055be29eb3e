//! `vectorize`: aligned runs of scalar loads become vector loads; misaligned runs, unknown
//! alignment, intervening writes and over-wide vectors do not.

use crate::passes_support;

use passes_support::*;
use ruda_ir::interp::LaunchConfig;
use ruda_ir::*;

use ScalarType::*;

/// The lane counts of the vector loads.
fn vectors(k: &Kernel) -> Vec<u8> {
    let mut out = vec![];
    k.walk(|_, i| {
        if let Op::Load { lanes, .. } = i.op {
            if lanes > 1 {
                out.push(lanes);
            }
        }
    });
    out.sort();
    out
}

/// Threads fill a shared array of `t` (as `base + tid`), barrier, then each thread sums the
/// elements at `offsets` from a base `base(b, smem, tid)` and stores the sum (as `u64`).
fn shared_sum(
    t: ScalarType,
    align: Option<u32>,
    offsets: &[i64],
    between: Option<usize>,
    base: impl FnOnce(&mut KernelBuilder, Value, Value) -> Value,
) -> Kernel {
    let mut b = KernelBuilder::new("gather");
    let out = b.param("out", gptr(U64));
    let arr = b.shared_array("data", t, 256);
    let tid = b.thread_id_x();
    let smem = match align {
        Some(_) => b.shared_ptr(arr),
        None => b.dyn_shared_ptr(t),
    };
    for k in 0..4u32 {
        let c = b.const_u32(64 * k);
        let i = b.add(tid, c);
        let p = b.ptr_add(smem, i);
        let v = if t == U32 { i } else { b.cvt(i, t) };
        b.store(p, v);
    }
    b.barrier();
    let base = base(&mut b, smem, tid);
    let mut acc = b.const_u64(0);
    for (n, &o) in offsets.iter().enumerate() {
        if between == Some(n) {
            // Each thread overwrites its own element (which no thread reads afterwards).
            let z = b.const_u32(0);
            let v = if t == U32 { z } else { b.cvt(z, t) };
            let q = b.ptr_add(smem, tid);
            b.store(q, v);
        }
        let c = b.const_i32(o as i32);
        let p = b.ptr_add(base, c);
        let v = b.load(p);
        let v = b.cvt(v, U64);
        acc = b.add(acc, v);
    }
    let q = b.ptr_add(out, tid);
    b.store(q, acc);
    let mut k = b.finish().unwrap();
    if let Some(a) = align {
        k.shared[0].align = a;
    }
    k
}

fn run_sum(k: &Kernel, t: ScalarType) -> Kernel {
    let launch = LaunchConfig { grid: [1, 1, 1], block: [64, 1, 1], dynamic_shared_bytes: 512 * t.bytes() };
    check(k, "vectorize", launch, &[Arg::Buffer(vec![0; 64 * 8])])
}

fn at_tid_times(n: u32) -> impl FnOnce(&mut KernelBuilder, Value, Value) -> Value {
    move |b, smem, tid| {
        let c = b.const_u32(n);
        let i = b.mul(tid, c);
        b.ptr_add(smem, i)
    }
}

#[test]
fn aligned_runs_become_vector_loads() {
    let k = shared_sum(U32, Some(16), &[0, 1, 2, 3, 4, 5, 6, 7], None, at_tid_times(2));
    let after = run_sum(&k, U32);
    // tid * 2 * 4 bytes is 8-byte aligned only: pairs.
    assert_eq!(vectors(&after), [2, 2, 2, 2], "{}", print_kernel(&after));
    let k = shared_sum(U32, Some(16), &[3, 2, 1, 0, 5, 4, 7, 6], None, at_tid_times(4));
    assert_eq!(vectors(&run_sum(&k, U32)), [4, 4]);
    // The dynamic window is 16-byte aligned.
    let k = shared_sum(F32, None, &[8, 9, 10, 11], None, at_tid_times(4));
    assert_eq!(vectors(&run_sum(&k, F32)), [4]);
    // Two 8-byte lanes fill 16 bytes; four would not fit one access.
    let k = shared_sum(F64, Some(16), &[0, 1, 2, 3], None, at_tid_times(2));
    assert_eq!(vectors(&run_sum(&k, F64)), [2, 2]);
    // Four 2-byte lanes need 8-byte alignment.
    let k = shared_sum(U16, Some(8), &[4, 5, 6, 7], None, at_tid_times(4));
    assert_eq!(vectors(&run_sum(&k, U16)), [4]);
}

#[test]
fn misaligned_or_incomplete_runs_stay_scalar_or_pair_up() {
    // Offsets 1..4 from an aligned base: only the pair (2, 3) is aligned.
    let k = shared_sum(U32, Some(16), &[1, 2, 3, 4], None, at_tid_times(4));
    assert_eq!(vectors(&run_sum(&k, U32)), [2]);
    // An odd base: tid * 1 elements proves nothing beyond 4 bytes.
    let k = shared_sum(U32, Some(16), &[0, 1, 2, 3], None, at_tid_times(1));
    assert!(vectors(&run_sum(&k, U32)).is_empty());
    // The array's own alignment limits it.
    let k = shared_sum(U32, Some(4), &[0, 1, 2, 3], None, at_tid_times(4));
    assert!(vectors(&run_sum(&k, U32)).is_empty());
    let k = shared_sum(U32, Some(8), &[0, 1, 2, 3], None, at_tid_times(4));
    assert_eq!(vectors(&run_sum(&k, U32)), [2, 2]);
    // Gaps.
    let k = shared_sum(U32, Some(16), &[0, 2, 4, 6], None, at_tid_times(8));
    assert!(vectors(&run_sum(&k, U32)).is_empty());
}

#[test]
fn a_store_between_the_loads_keeps_them_apart() {
    let k = shared_sum(U32, Some(16), &[0, 1, 2, 3], Some(2), |b, smem, tid| {
        // Read 4 elements above the block's own writes so that no thread reads what another
        // thread writes between the loads.
        let c = b.const_u32(4);
        let i = b.mul(tid, c);
        let off = b.const_u32(64);
        let i = b.add(i, off);
        b.ptr_add(smem, i)
    });
    let after = run_sum(&k, U32);
    assert_eq!(vectors(&after), [2, 2], "{}", print_kernel(&after));
}

#[test]
fn loads_through_a_parameter_pointer_stay_scalar() {
    let mut b = KernelBuilder::new("global");
    let x = b.param("x", gptr(F32));
    let out = b.param("out", gptr(F32));
    let tid = b.thread_id_x();
    let four = b.const_u32(4);
    let i = b.mul(tid, four);
    let base = b.ptr_add(x, i);
    let mut acc = b.const_f32(0.0);
    for k in 0..4 {
        let c = b.const_u32(k);
        let p = b.ptr_add(base, c);
        let v = b.load(p);
        acc = b.add(acc, v);
    }
    let q = b.ptr_add(out, tid);
    b.store(q, acc);
    let k = b.finish().unwrap();
    let xs: Vec<u64> = (0..16).map(|v| (v as f32 * 0.5).to_bits() as u64).collect();
    let after =
        check(&k, "vectorize", LaunchConfig::linear(1, 4), &[Arg::Buffer(bytes_of(&xs, 4)), Arg::Buffer(vec![0; 16])]);
    assert!(vectors(&after).is_empty());
}

#[test]
fn the_full_pipeline_vectorizes_an_unrolled_shared_memory_loop() {
    // for j in 0..4: acc += tile[4 * tid + j]
    let mut b = KernelBuilder::new("tile_sum");
    let out = b.param("out", gptr(F32));
    let tile = b.shared_array("tile", F32, 256);
    let tid = b.thread_id_x();
    let smem = b.shared_ptr(tile);
    for k in 0..4u32 {
        let c = b.const_u32(64 * k);
        let i = b.add(tid, c);
        let p = b.ptr_add(smem, i);
        let v = b.cvt(i, F32);
        b.store(p, v);
    }
    b.barrier();
    let (s, e, st) = (b.const_u32(0), b.const_u32(4), b.const_u32(1));
    let zero = b.const_f32(0.0);
    let r = b.for_range(s, e, st, &[zero], |b, j, acc| {
        let four = b.const_u32(4);
        let i = b.mul(tid, four);
        let i = b.add(i, j);
        let p = b.ptr_add(smem, i);
        let v = b.load(p);
        vec![b.add(acc[0], v)]
    })[0];
    let q = b.ptr_add(out, tid);
    b.store(q, r);
    let k = b.finish().unwrap();
    let after = check(&k, "default", LaunchConfig::linear(1, 64), &[Arg::Buffer(vec![0; 256])]);
    assert_eq!(vectors(&after), [4], "{}", print_kernel(&after));
}

#[test]
fn loads_that_fail_still_fail_as_one_vector_load() {
    // Thread 63 reads elements 252..255 of the array, past the end of shared memory.
    let k = shared_sum(U32, Some(16), &[0, 1, 2, 3], None, |b, smem, tid| {
        let c = b.const_u32(4);
        let i = b.mul(tid, c);
        let off = b.const_u32(4);
        let i = b.add(i, off);
        b.ptr_add(smem, i)
    });
    let after = optimized(&k, "vectorize");
    assert_eq!(vectors(&after), [4]);
    let launch = LaunchConfig::linear(1, 64);
    let args = [Arg::Buffer(vec![0; 64 * 8])];
    let (before, after) = (run(&k, launch, &args).unwrap_err(), run(&after, launch, &args).unwrap_err());
    assert_eq!((before.op.as_str(), before.thread), ("load", [63, 0, 0]));
    assert_eq!((after.op.as_str(), after.thread), ("load", [63, 0, 0]));
    assert!(after.message.contains("out of bounds"), "{after}");
}

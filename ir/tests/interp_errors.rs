//! Every runtime and launch error: what it says, and which kernel, op, location, block and
//! thread it names.

use crate::interp_support;

use interp_support::*;
use ruda_ir::interp::{run, run_with_threads, InterpError, KernelArg, LaunchConfig};
use ruda_ir::{AtomicOp, Constant, Kernel, KernelBuilder, ScalarType, ShflMode, Type};
use ScalarType::*;

fn expect_err(k: &Kernel, cfg: &LaunchConfig, args: &mut [KernelArg<'_>]) -> InterpError {
    match run_with_threads(k, cfg, args, 4) {
        Ok(()) => panic!("kernel `{}` ran without error", k.name),
        Err(e) => e,
    }
}

fn assert_mentions(e: &InterpError, parts: &[&str]) {
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "error does not mention {p:?}: {text}");
    }
}

/// `out[g] = in[g]` for every thread, no bounds check.
fn copy_kernel() -> Kernel {
    let mut b = KernelBuilder::new("copy");
    let input = b.param("in", gptr(U32));
    let out = b.param("out", gptr(U32));
    let g = b.global_thread_id_x();
    let p = b.ptr_add(input, g);
    let v = b.load(p);
    let q = b.ptr_add(out, g);
    b.store(q, v);
    b.finish().unwrap()
}

#[test]
fn global_out_of_bounds_names_the_first_failing_block_and_thread() {
    let k = copy_kernel();
    let mut input = vec![0u8; 4 * (64 * 2 + 5)];
    let mut out = vec![0u8; 4 * 256];
    let e =
        expect_err(&k, &LaunchConfig::linear(4, 64), &mut [KernelArg::Buffer(&mut input), KernelArg::Buffer(&mut out)]);
    assert_eq!((e.kernel.as_str(), e.op.as_str(), e.block, e.thread), ("copy", "load", [2, 0, 0], [5, 0, 0]));
    assert!(e.loc.as_ref().is_some_and(|l| l.file.ends_with("interp_errors.rs")), "{:?}", e.loc);
    assert_mentions(
        &e,
        &["out of bounds", "global load of 4 bytes", "buffer 0, offset 532", "has 532 bytes", "interp_errors.rs:"],
    );
}

#[test]
fn pointers_before_a_buffer_are_in_no_buffer() {
    let mut b = KernelBuilder::new("before");
    let buf = b.param("buf", gptr(F32));
    let m1 = b.const_i32(-1);
    let p = b.ptr_add(buf, m1);
    let v = b.load(p);
    b.store(buf, v);
    let k = b.finish().unwrap();
    let mut data = vec![0u8; 64];
    let e = expect_err(&k, &LaunchConfig::linear(1, 1), &mut [KernelArg::Buffer(&mut data)]);
    assert_mentions(&e, &["out of bounds", "in no buffer"]);
}

#[test]
fn misaligned_scalar_and_vector_accesses() {
    let mut b = KernelBuilder::new("misaligned");
    let buf = b.param("buf", gptr(U8));
    let one = b.const_u32(1);
    let p = b.ptr_add(buf, one);
    let p = b.ptr_cast(p, U32);
    let v = b.load(p);
    b.store(p, v);
    let k = b.finish().unwrap();
    let mut data = vec![0u8; 64];
    let e = expect_err(&k, &LaunchConfig::linear(1, 1), &mut [KernelArg::Buffer(&mut data)]);
    assert_mentions(&e, &["misaligned", "4 bytes", "buffer 0, offset 1", "4-byte aligned"]);

    // A v4.f32 at a 4-byte but not 16-byte boundary.
    let mut b = KernelBuilder::new("misaligned_vec");
    let buf = b.param("buf", gptr(F32));
    let one = b.const_u32(1);
    let p = b.ptr_add(buf, one);
    let v = b.load_vec(p, 4);
    b.store(p, v);
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 1), &mut [KernelArg::Buffer(&mut data)]);
    assert_mentions(&e, &["misaligned", "16 bytes", "16-byte aligned"]);
    assert_eq!(e.op, "load");
}

#[test]
fn shared_out_of_bounds_and_misaligned() {
    let mut b = KernelBuilder::new("shared_oob");
    let s = b.shared_array("s", F32, 32);
    let sp = b.shared_ptr(s);
    let t = b.thread_id_x();
    let p = b.ptr_add(sp, t);
    let x = b.const_f32(1.0);
    b.store(p, x);
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 64), &mut []);
    assert_eq!((e.op.as_str(), e.thread), ("store", [32, 0, 0]));
    assert_mentions(&e, &["out of bounds", "shared store of 4 bytes at offset 128", "128 bytes of shared memory"]);

    let mut b = KernelBuilder::new("shared_misaligned");
    let s = b.shared_array("s", U8, 64);
    let sp = b.shared_ptr(s);
    let two = b.const_u32(2);
    let p = b.ptr_add(sp, two);
    let p = b.ptr_cast(p, U32);
    let v = b.load(p);
    b.store(p, v);
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 1), &mut []);
    assert_mentions(&e, &["misaligned", "shared load of 4 bytes at offset 2"]);
}

#[test]
fn divergent_barrier_is_an_error() {
    let mut b = KernelBuilder::new("divergent");
    let t = b.thread_id_x();
    let sixteen = b.const_u32(16);
    let low = b.lt(t, sixteen);
    b.if_then(low, |b| b.barrier());
    // The verifier rejects this kernel; the interpreter must catch it at run time too.
    let k = b.finish_unverified();
    assert!(ruda_ir::verify(&k).is_err());
    let e = expect_err(&k, &LaunchConfig::linear(2, 64), &mut []);
    assert_eq!((e.op.as_str(), e.block, e.thread), ("barrier", [0, 0, 0], [0, 0, 0]));
    assert_mentions(&e, &["divergent barrier", "16 of the block's 64 threads", "thread [16, 0, 0] does not"]);
}

#[test]
fn shared_memory_races_between_barriers() {
    // Kernel shapes: each thread stores s[t], then (optionally a barrier) reads s[(t + 1) % n].
    let neighbour = |barrier: bool| {
        let mut b = KernelBuilder::new("neighbour");
        let out = b.param("out", gptr(U32));
        let s = b.shared_array("s", U32, 64);
        let sp = b.shared_ptr(s);
        let t = b.thread_id_x();
        let p = b.ptr_add(sp, t);
        b.store(p, t);
        if barrier {
            b.barrier();
        }
        let one = b.const_u32(1);
        let n = b.block_dim_x();
        let u = b.add(t, one);
        let u = b.rem(u, n);
        let q = b.ptr_add(sp, u);
        let v = b.load(q);
        let o = b.ptr_add(out, t);
        b.store(o, v);
        b.finish().unwrap()
    };
    let mut out = vec![0u8; 4 * 64];
    let e = expect_err(&neighbour(false), &LaunchConfig::linear(1, 64), &mut [KernelArg::Buffer(&mut out)]);
    assert_eq!((e.op.as_str(), e.thread), ("load", [0, 0, 0]));
    assert_mentions(&e, &["shared-memory race", "thread [0, 0, 0] reads it and thread [1, 0, 0] wrote it"]);
    run(&neighbour(true), &LaunchConfig::linear(1, 64), &mut [KernelArg::Buffer(&mut out)]).unwrap();
    assert_eq!(to_u32s(&out), (0..64).map(|t| (t + 1) % 64).collect::<Vec<u32>>());

    // Stores of one instruction by different threads to the same word.
    let mut b = KernelBuilder::new("same_store");
    let s = b.shared_array("s", U32, 4);
    let sp = b.shared_ptr(s);
    let t = b.thread_id_x();
    b.store(sp, t);
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 32), &mut []);
    assert_eq!(e.thread, [1, 0, 0]);
    assert_mentions(&e, &["shared-memory race on byte 0", "thread [1, 0, 0] writes it and thread [0, 0, 0] wrote it"]);

    // Many readers, then a writer; overlapping accesses of different sizes.
    let mut b = KernelBuilder::new("read_then_write");
    let s = b.shared_array("s", U32, 4);
    let sp = b.shared_ptr(s);
    let v = b.load(sp);
    let t = b.thread_id_x();
    let seven = b.const_u32(7);
    let last = b.eq(t, seven);
    b.if_then(last, |b| {
        let bytes = b.ptr_cast(sp, U8);
        let three = b.const_u32(3);
        let p = b.ptr_add(bytes, three);
        let x = b.cvt(v, U8);
        b.store(p, x);
    });
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 32), &mut []);
    assert_eq!(e.thread, [7, 0, 0]);
    assert_mentions(&e, &["race on byte 3", "thread [7, 0, 0] writes it and thread [0, 0, 0] read it"]);

    // Atomics are exempt, and each thread may reuse its own bytes freely.
    let mut b = KernelBuilder::new("atomics_ok");
    let out = b.param("out", gptr(U32));
    let s = b.shared_array("s", U32, 64);
    let sp = b.shared_ptr(s);
    let t = b.thread_id_x();
    let one = b.const_u32(1);
    b.atomic(AtomicOp::Add, sp, one);
    let p = b.ptr_add(sp, t);
    let p = b.ptr_add(p, one);
    b.store(p, t);
    let v = b.load(p);
    let v = b.add(v, one);
    b.store(p, v);
    b.barrier();
    let total = b.load(sp);
    let o = b.ptr_add(out, t);
    b.store(o, total);
    let k = b.finish().unwrap();
    let mut out = vec![0u8; 4 * 32];
    run(&k, &LaunchConfig::linear(1, 32), &mut [KernelArg::Buffer(&mut out)]).unwrap();
    assert!(to_u32s(&out).iter().all(|&x| x == 32));
}

#[test]
fn races_across_loop_iterations_without_a_barrier() {
    let mut b = KernelBuilder::new("loop_race");
    let s = b.shared_array("s", U32, 32);
    let sp = b.shared_ptr(s);
    let t = b.thread_id_x();
    let (zero, two, one) = (b.const_u32(0), b.const_u32(2), b.const_u32(1));
    b.for_each(zero, two, one, |b, iv| {
        let i = b.add(t, iv);
        let n = b.block_dim_x();
        let i = b.rem(i, n);
        let p = b.ptr_add(sp, i);
        b.store(p, t);
    });
    let k = b.finish().unwrap();
    let e = expect_err(&k, &LaunchConfig::linear(1, 32), &mut []);
    assert_mentions(&e, &["thread [0, 0, 0] writes it and thread [1, 0, 0] wrote it"]);
}

#[test]
fn integer_division_by_zero() {
    for rem in [false, true] {
        let inputs = [vec![10u64; 8], vec![1, 2, 3, 0, 5, 0, 7, 8]];
        let k = map_kernel(&[I32, I32], I32, |b, v| if rem { b.rem(v[0], v[1]) } else { b.div(v[0], v[1]) });
        let mut a = to_bytes(I32, &inputs[0]);
        let mut d = to_bytes(I32, &inputs[1]);
        let mut out = vec![0u8; 32];
        let mut args = [
            KernelArg::Buffer(&mut a),
            KernelArg::Buffer(&mut d),
            KernelArg::Buffer(&mut out),
            KernelArg::Scalar(Constant::u32(8)),
        ];
        let e = expect_err(&k, &LaunchConfig::linear(1, 64), &mut args);
        assert_eq!((e.op.as_str(), e.thread), (if rem { "rem" } else { "div" }, [3, 0, 0]));
        assert_mentions(&e, &[if rem { "integer remainder by zero" } else { "integer division by zero" }]);
    }
}

#[test]
fn arguments_must_match_parameters() {
    let k = copy_kernel();
    let mut a = vec![0u8; 16];
    let mut b = vec![0u8; 16];
    let cfg = LaunchConfig::linear(1, 4);
    let e = expect_err(&k, &cfg, &mut [KernelArg::Buffer(&mut a)]);
    assert_eq!(e.op, "launch");
    assert_mentions(&e, &["1 arguments given, the kernel has 2 parameters"]);
    let e = expect_err(&k, &cfg, &mut [KernelArg::Buffer(&mut a), KernelArg::Scalar(Constant::u64(0))]);
    assert_mentions(&e, &["`out` is a global pointer; pass a buffer"]);

    let mut kb = KernelBuilder::new("scalar");
    let out = kb.param("out", gptr(U32));
    let n = kb.param("n", Type::U32);
    kb.store(out, n);
    let k = kb.finish().unwrap();
    let e = expect_err(&k, &cfg, &mut [KernelArg::Buffer(&mut a), KernelArg::Buffer(&mut b)]);
    assert_mentions(&e, &["`n` is the scalar type u32; pass a scalar, not a buffer"]);
    let e = expect_err(&k, &cfg, &mut [KernelArg::Buffer(&mut a), KernelArg::Scalar(Constant::i32(3))]);
    assert_mentions(&e, &["parameter `n` is u32, the argument is s32 3"]);
    run(&k, &cfg, &mut [KernelArg::Buffer(&mut a), KernelArg::Scalar(Constant::u32(3))]).unwrap();
}

#[test]
fn launch_shapes_are_validated() {
    let mut kb = KernelBuilder::new("bounded");
    kb.launch_bounds(128, None);
    let k = kb.finish().unwrap();
    let cases: [(LaunchConfig, &str); 6] = [
        (LaunchConfig { grid: [0, 1, 1], block: [32, 1, 1], dynamic_shared_bytes: 0 }, "no zero dimension"),
        (LaunchConfig { grid: [1, 1, 1], block: [32, 0, 1], dynamic_shared_bytes: 0 }, "no zero dimension"),
        (LaunchConfig { grid: [1, 1, 1], block: [1025, 1, 1], dynamic_shared_bytes: 0 }, "at most 1024"),
        (LaunchConfig { grid: [1, 1, 1], block: [1, 1, 65], dynamic_shared_bytes: 0 }, "z at most 64"),
        (LaunchConfig { grid: [1, 1, 1], block: [256, 1, 1], dynamic_shared_bytes: 0 }, "launch bound of 128"),
        (
            LaunchConfig { grid: [1, 1, 1], block: [64, 1, 1], dynamic_shared_bytes: 300 * 1024 },
            "bytes of shared memory",
        ),
    ];
    for (cfg, msg) in cases {
        let e = expect_err(&k, &cfg, &mut []);
        assert_eq!(e.op, "launch");
        assert_mentions(&e, &[msg]);
    }
    run(&k, &LaunchConfig { grid: [2, 2, 2], block: [128, 1, 1], dynamic_shared_bytes: 227 * 1024 }, &mut []).unwrap();
}

#[test]
fn warp_operations_need_whole_warps() {
    let shfl_kernel = |guard: bool| {
        let mut b = KernelBuilder::new("partial_warp");
        let out = b.param("out", gptr(U32));
        let t = b.thread_id_x();
        let body = |b: &mut KernelBuilder| {
            let one = b.const_u32(1);
            let v = b.shfl(ShflMode::Down, t, one);
            let p = b.ptr_add(out, t);
            b.store(p, v);
        };
        if guard {
            let limit = b.const_u32(40);
            let c = b.lt(t, limit);
            b.if_then(c, body);
        } else {
            body(&mut b);
        }
        b.finish().unwrap()
    };
    let mut out = vec![0u8; 4 * 64];
    let e = expect_err(&shfl_kernel(true), &LaunchConfig::linear(1, 64), &mut [KernelArg::Buffer(&mut out)]);
    assert_eq!((e.op.as_str(), e.thread), ("shfl.down", [32, 0, 0]));
    assert_mentions(&e, &["warp operation with inactive lanes", "warp 1 has 8 of its 32 lanes active"]);
    let e = expect_err(&shfl_kernel(false), &LaunchConfig::linear(1, 48), &mut [KernelArg::Buffer(&mut out)]);
    assert_mentions(&e, &["warp 1 has 16 of its 32 lanes active", "multiple of 32"]);
}

#[test]
fn malformed_kernels_are_errors_not_panics() {
    // Operand types differ (the verifier would reject it).
    let mut b = KernelBuilder::new("mixed");
    let x = b.const_f32(1.0);
    let y = b.const_i32(1);
    b.add(x, y);
    let e = expect_err(&b.finish_unverified(), &LaunchConfig::linear(1, 1), &mut []);
    assert_eq!(e.op, "add");
    assert_mentions(&e, &["malformed kernel", "operand types differ"]);

    // A value used outside the region that defines it.
    let mut b = KernelBuilder::new("scoping");
    let out = b.param("out", gptr(U32));
    let c = b.const_pred(true);
    let inner = std::cell::Cell::new(None);
    b.if_then(c, |b| inner.set(Some(b.const_u32(5))));
    b.store(out, inner.get().unwrap());
    let mut buf = vec![0u8; 4];
    let e = expect_err(&b.finish_unverified(), &LaunchConfig::linear(1, 1), &mut [KernelArg::Buffer(&mut buf)]);
    assert_eq!(e.op, "store");
    assert_mentions(&e, &["not defined in scope"]);

    // A hand-built kernel whose entry region lists an instruction that does not exist.
    let mut k = Kernel::new("broken");
    k.regions[0].insts.push(ruda_ir::InstId(7));
    let e = expect_err(&k, &LaunchConfig::linear(1, 1), &mut []);
    assert_mentions(&e, &["malformed kernel", "inst7, which does not exist"]);
}

#[test]
fn the_lowest_failing_block_is_reported_whatever_the_thread_count() {
    // Blocks 3 and 9.. divide by zero at different threads; block 3 thread 7 must win.
    let mut b = KernelBuilder::new("many_fail");
    let blk = b.block_id_x();
    let t = b.thread_id_x();
    let (three, seven, nine) = (b.const_u32(3), b.const_u32(7), b.const_u32(9));
    let is3 = b.eq(blk, three);
    let t7 = b.eq(t, seven);
    let bad3 = b.and(is3, t7);
    let late = b.ge(blk, nine);
    let bad = b.or(bad3, late);
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let d = b.select(bad, zero, one);
    b.div(t, d);
    let k = b.finish().unwrap();
    for threads in [1, 2, 8] {
        let e = run_with_threads(&k, &LaunchConfig::linear(64, 32), &mut [], threads).unwrap_err();
        assert_eq!((e.block, e.thread), ([3, 0, 0], [7, 0, 0]), "with {threads} threads");
    }
}

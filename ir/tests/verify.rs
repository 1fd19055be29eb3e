//! The verifier's rejections: each names the op, carries the builder's Rust location and
//! prints the surrounding IR.

use ruda_ir::*;

fn global(t: ScalarType) -> Type {
    Type::Ptr(AddrSpace::Global, t)
}

/// Build with `f`, verify, and return the error (the test fails if it verifies).
fn reject(f: impl FnOnce(&mut KernelBuilder)) -> VerifyError {
    let mut b = KernelBuilder::new("k");
    f(&mut b);
    b.finish().expect_err("the kernel must not verify")
}

#[test]
fn mismatched_operand_types() {
    let e = reject(|b| {
        let x = b.const_f32(1.0);
        let y = b.const_u32(1);
        b.add(x, y);
    });
    assert_eq!(e.op, "add");
    assert!(e.message.contains("operand types differ"), "{e}");
    let loc = e.loc.as_ref().expect("builder records locations");
    assert!(loc.file.ends_with("ir/tests/verify.rs"), "{loc}");
    let text = e.to_string();
    assert!(text.contains("kernel `k`") && text.contains("-->") && text.contains("add %"), "{text}");
}

#[test]
fn half_precision_arithmetic_needs_a_conversion() {
    let e = reject(|b| {
        let p = b.param("p", global(ScalarType::BF16));
        let x = b.load(p);
        b.mul(x, x);
    });
    assert!(e.message.contains("convert f16/bf16 to f32"), "{e}");
}

#[test]
fn values_used_outside_their_scope() {
    let e = reject(|b| {
        let c = b.const_pred(true);
        let mut inner = None;
        b.if_then(c, |b| inner = Some(b.const_u32(1)));
        let inner = inner.unwrap();
        b.add(inner, inner);
    });
    assert!(e.message.contains("not defined in scope"), "{e}");
}

#[test]
fn barrier_under_thread_dependent_branch() {
    let e = reject(|b| {
        let tid = b.thread_id_x();
        let c32 = b.const_u32(32);
        let first_warp = b.lt(tid, c32);
        b.if_then(first_warp, |b| b.barrier());
    });
    assert_eq!(e.op, "barrier");
    assert!(e.message.contains("thread-dependent"), "{e}");
}

#[test]
fn barrier_in_loop_with_thread_dependent_bounds() {
    let e = reject(|b| {
        let tid = b.thread_id_x();
        let zero = b.const_u32(0);
        let one = b.const_u32(1);
        b.for_each(zero, tid, one, |b, _| b.barrier());
    });
    assert_eq!(e.op, "barrier");
}

#[test]
fn barrier_under_block_uniform_branch_is_fine() {
    let mut b = KernelBuilder::new("k");
    let n = b.param("n", Type::U32);
    let block = b.block_id_x();
    let c = b.lt(block, n);
    b.if_then(c, |b| b.barrier());
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    b.for_each(zero, n, one, |b, _| b.barrier());
    b.finish().expect("uniform control flow");
}

#[test]
fn barrier_after_thread_dependent_load_is_rejected() {
    // A value loaded through a thread-dependent address varies across the block.
    let e = reject(|b| {
        let p = b.param("p", global(ScalarType::U32));
        let tid = b.thread_id_x();
        let q = b.ptr_add(p, tid);
        let v = b.load(q);
        let zero = b.const_u32(0);
        let c = b.eq(v, zero);
        b.if_then(c, |b| b.barrier());
    });
    assert_eq!(e.op, "barrier");
}

#[test]
fn conversions_need_rounding_exactly_where_ptx_does() {
    let e = reject(|b| {
        let x = b.const_f32(1.5);
        b.cvt_with(x, Cvt { to: ScalarType::F16, rounding: None, sat: false });
    });
    assert!(e.message.contains("needs an explicit rounding"), "{e}");
    let e = reject(|b| {
        let x = b.const_u32(1);
        b.cvt_with(x, Cvt { to: ScalarType::U64, rounding: Some(Rounding::Rn), sat: false });
    });
    assert!(e.message.contains("exact"), "{e}");
}

#[test]
fn stores_must_match_the_pointee() {
    let e = reject(|b| {
        let p = b.param("p", global(ScalarType::F32));
        let v = b.const_u32(1);
        b.store(p, v);
    });
    assert_eq!(e.op, "store");
}

#[test]
fn shuffles_move_32_bit_values() {
    let e = reject(|b| {
        let x = b.const_f64(1.0);
        let lane = b.const_u32(1);
        b.shfl(ShflMode::Idx, x, lane);
    });
    assert!(e.message.contains("32-bit"), "{e}");
}

#[test]
fn shift_amounts_are_u32() {
    let e = reject(|b| {
        let x = b.const_u64(1);
        let s = b.const_u64(3);
        b.shl(x, s);
    });
    assert!(e.message.contains("shift amount"), "{e}");
}

#[test]
fn atomics_by_element_type() {
    let e = reject(|b| {
        let p = b.param("p", global(ScalarType::F32));
        let v = b.const_f32(1.0);
        b.atomic(AtomicOp::Max, p, v);
    });
    assert!(e.message.contains("not available on f32"), "{e}");
}

#[test]
fn branches_must_yield_the_same_types() {
    let e = reject(|b| {
        let c = b.const_pred(true);
        b.if_else(c, |b| vec![b.const_u32(1)], |b| vec![b.const_f32(1.0)]);
    });
    assert_eq!(e.op, "if");
}

#[test]
fn kernel_level_errors() {
    let e = KernelBuilder::new("bad name").finish().unwrap_err();
    assert!(e.message.contains("kernel name"), "{e}");
    let mut b = KernelBuilder::new("k");
    b.param("flag", Type::PRED);
    assert!(b.finish().unwrap_err().message.contains("predicate"));
    let mut b = KernelBuilder::new("k");
    b.launch_bounds(2048, None);
    assert!(b.finish().unwrap_err().message.contains("1..=1024"));
}

#[test]
fn printer_is_stable_and_shows_structure() {
    let build = || {
        let mut b = KernelBuilder::new("scale");
        let x = b.param("x", global(ScalarType::F32));
        let n = b.param("n", Type::U32);
        let i = b.global_thread_id_x();
        let c = b.lt(i, n);
        b.if_then(c, |b| {
            let p = b.ptr_add(x, i);
            let v = b.load(p);
            let two = b.const_f32(2.0);
            let v = b.mul(v, two);
            b.store(p, v);
        });
        b.finish().unwrap()
    };
    let (a, b) = (build(), build());
    assert_eq!(print_kernel(&a), print_kernel(&b));
    assert_eq!(a.ir_hash(), b.ir_hash());
    let text = print_kernel(&a);
    assert!(text.starts_with("kernel @scale(%0 x: ptr<global,f32>, %1 n: u32) {"), "{text}");
    assert!(text.contains("const 0x40000000"), "floats print as exact bits: {text}");
    assert!(text.contains("} else {"), "{text}");
    assert!(print_kernel_with_locs(&a).contains("!loc \"ir/tests/verify.rs\""));
}

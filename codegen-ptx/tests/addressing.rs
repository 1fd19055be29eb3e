//! `[reg+imm]` addressing: a memory access through `ptradd(q, constant)` addresses `[q+bytes]`,
//! and the `ptradd` is left out when nothing else reads it.

use crate::common;

use common::{assemble_for, emit, squash};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::global;
use ruda_ir::{AtomicOp, Kernel, KernelBuilder, ScalarType, Type};

/// Accesses at constant offsets from `x + i` (global) and `s + i` (shared).
fn offsets() -> Kernel {
    let mut b = KernelBuilder::new("offsets");
    let x = b.param("x", global(ScalarType::F32));
    let d = b.param("d", global(ScalarType::F64));
    let s = b.shared_array("s", ScalarType::F32, 256);
    let i = b.thread_id_x();
    let p = b.ptr_add(x, i);
    let c3 = b.const_i32(3);
    let at3 = b.ptr_add(p, c3);
    let v3 = b.load(at3);
    let cm2 = b.const_i64(-2);
    let atm2 = b.ptr_add(p, cm2);
    let vm2 = b.load(atm2);
    let sum = b.add(v3, vm2);
    let c1 = b.const_u64(1);
    let at1 = b.ptr_add(p, c1);
    b.store(at1, sum);
    let c5 = b.const_u32(5);
    let at5 = b.ptr_add(p, c5);
    b.atomic(AtomicOp::Add, at5, sum);
    // 2^31 elements of 4 bytes: no 32-bit immediate holds the offset, so no fold.
    let far = b.const_u32(0x8000_0000);
    let atfar = b.ptr_add(p, far);
    b.store(atfar, sum);
    // A vector access split in two 16-byte pieces, each at its own offset.
    let pd = b.ptr_add(d, i);
    let cm4 = b.const_i32(-4);
    let atm4 = b.ptr_add(pd, cm4);
    let v = b.load_vec(atm4, 4);
    let c8 = b.const_i32(8);
    let at8 = b.ptr_add(pd, c8);
    b.store(at8, v);
    // Shared: offsets wrap at 32 bits, so u32 0xffffffff is element -1.
    let base = b.shared_ptr(s);
    let sp = b.ptr_add(base, i);
    let cm1 = b.const_i32(-1);
    let sm1 = b.ptr_add(sp, cm1);
    b.store(sm1, sum);
    b.barrier();
    let wrap = b.const_u32(u32::MAX);
    let swrap = b.ptr_add(sp, wrap);
    let w = b.load(swrap);
    let c2 = b.const_i64(2);
    let s2 = b.ptr_add(sp, c2);
    b.store(s2, w);
    // A ptradd with a use other than an address stays.
    let kept = b.ptr_add(p, c3);
    let cast = b.ptr_cast(kept, ScalarType::U32);
    let bits = b.load(cast);
    let back = b.bitcast(bits, ScalarType::F32);
    b.store(kept, back);
    b.finish().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn constant_offsets_fold_into_the_address() {
    let k = offsets();
    let ptx = squash(&emit(&k, Arch::Sm80));
    let lines: Vec<&str> = ptx.lines().collect();
    let has = |prefix: &str, operands: &str| lines.iter().any(|l| l.starts_with(prefix) && l.contains(operands));
    for (prefix, operands) in [
        ("ld.global.f32", "+12];"),
        ("ld.global.f32", "+-8];"),
        ("st.global.f32", "+4],"),
        ("atom.global.add.f32", "+20],"),
        ("ld.global.v2.f64", "+-32];"),
        ("ld.global.v2.f64", "+-16];"),
        ("st.global.v2.f64", "+64],"),
        ("st.global.v2.f64", "+80],"),
        ("st.shared.f32", "+-4],"),
        ("ld.shared.f32", "+-4];"),
        ("st.shared.f32", "+8],"),
    ] {
        assert!(has(prefix, operands), "no `{prefix} ..{operands}`:\n{ptx}");
    }
    // Left: the two variable ptradds (global), the shared one, the unfoldable one and the one
    // with a non-address use; every folded one is gone.
    let adds = |m: &str| lines.iter().filter(|l| l.starts_with(m)).count();
    assert_eq!(adds("add.s64"), 4, "{ptx}");
    assert_eq!(adds("add.s32"), 1, "{ptx}");
    // So are the constants only those ptradds read (the kept one's 3 stays).
    assert_eq!(adds("mov.s32"), 1, "{ptx}");
    assert_eq!(adds("mov.s64") + adds("mov.u64"), 0, "{ptx}");
}

#[test]
fn folded_offsets_assemble() {
    assemble_for(&offsets(), &[Arch::Sm80, Arch::Sm90]);
}

#[test]
fn an_address_with_no_constant_is_unchanged() {
    let mut b = KernelBuilder::new("plain");
    let x = b.param("x", global(ScalarType::U32));
    let n = b.param("n", Type::U32);
    let p = b.ptr_add(x, n);
    let v = b.load(p);
    b.store(x, v);
    let k = b.finish().unwrap_or_else(|e| panic!("{e}"));
    let ptx = squash(&emit(&k, Arch::Sm80));
    assert!(ptx.contains("ld.global.u32 %r2, [%rd3];"), "{ptx}");
    assert!(ptx.contains("st.global.u32 [%rd2], %r2;"), "{ptx}");
}

//! Tensor-core operations as inline asm: `mma.m16n8k16` (f16, bf16) and `ldmatrix` (x1/x2/x4,
//! with and without `.trans`) compile with NVRTC, the PTX keeps the instructions, and ptxas
//! accepts it on sm_80 and sm_90.

mod common;

use common::{compile_and_assemble, cuda, finish};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::global;
use ruda_ir::{Kernel, KernelBuilder, MmaType, ScalarType::*};

/// Each lane: ldmatrix A (x4), B (x2) and one x1 from a shared tile filled from `in`, `mma` with
/// C from global memory, store D and the x1 register.
fn gemm_tile(ty: MmaType, trans: bool) -> Kernel {
    let mut b = KernelBuilder::new(format!("mma_{ty}_{}", if trans { "t" } else { "n" }));
    let pin = b.param("in", global(U32));
    let pc = b.param("c", global(F32));
    let pd = b.param("d", global(F32));
    let tile = b.shared_array("tile", U32, 256);
    let s = b.shared_ptr(tile);
    let lane = b.lane_id();
    let eight = b.const_u32(8);
    let base = b.mul(lane, eight);
    for j in 0..8 {
        let jj = b.const_u32(j);
        let i = b.add(base, jj);
        let src = b.ptr_add(pin, i);
        let x = b.load(src);
        let dst = b.ptr_add(s, i);
        b.store(dst, x);
    }
    b.barrier();
    let h = b.ptr_cast(s, if ty == MmaType::F16 { F16 } else { BF16 });
    let sixteen = b.const_u32(16);
    let row = b.mul(lane, sixteen);
    let p = b.ptr_add(h, row);
    let a = b.ldmatrix(p, 4, false);
    let bf = b.ldmatrix(p, 2, trans);
    let one = b.ldmatrix(p, 1, trans);
    let four = b.const_u32(4);
    let l4 = b.mul(lane, four);
    let qc = b.ptr_add(pc, l4);
    let c = b.load_vec(qc, 4);
    let d = b.mma_m16n8k16(ty, a, bf, c);
    let qd = b.ptr_add(pd, l4);
    b.store(qd, d);
    let x = b.bitcast(one, F32);
    let qx = b.ptr_add(pd, lane);
    b.store(qx, x);
    finish(b)
}

#[test]
fn mma_and_ldmatrix_compile_as_inline_asm() {
    let kernels = [
        gemm_tile(MmaType::F16, false),
        gemm_tile(MmaType::BF16, true),
        gemm_tile(MmaType::BF16, false),
        gemm_tile(MmaType::F16, true),
    ];
    let src = cuda(&kernels[1]);
    assert!(src.contains("asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "{src}");
    assert!(src.contains("asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"), "{src}");
    let refs: Vec<&Kernel> = kernels.iter().collect();
    for (arch, ptx) in compile_and_assemble("mma_and_ldmatrix_compile_as_inline_asm", &refs, &[Arch::Sm80, Arch::Sm90]) {
        for want in [
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
        ] {
            assert!(ptx.contains(want), "{arch}: no `{want}` in\n{ptx}");
        }
    }
}

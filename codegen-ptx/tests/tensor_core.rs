//! Tensor-core operations: `mma.m16n8k16` (f16, bf16) and `ldmatrix` (x1/x2/x4, with and without
//! `.trans`) lower to the PTX instructions of the same meaning, and ptxas accepts them on sm_80
//! and sm_90.

mod common;

use common::{assemble_for, emit, squash};
use ruda_codegen_ptx::Arch;
use ruda_ir::{AddrSpace, Kernel, KernelBuilder, MmaType, ScalarType::*, Type};

/// Each lane: ldmatrix its A (x4), B (x2, transposed when `trans`) and an x1 from shared memory
/// filled from `in`, `mma` with C from global memory, store D and the x1 register.
fn gemm_tile(ty: MmaType, trans: bool) -> Kernel {
    let mut b = KernelBuilder::new(format!("mma_{ty}_{}", if trans { "t" } else { "n" }));
    let pin = b.param("in", Type::Ptr(AddrSpace::Global, U32));
    let pc = b.param("c", Type::Ptr(AddrSpace::Global, F32));
    let pd = b.param("d", Type::Ptr(AddrSpace::Global, F32));
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
    b.finish().unwrap()
}

#[test]
fn mma_and_ldmatrix_lower_and_assemble() {
    for ty in [MmaType::F16, MmaType::BF16] {
        for trans in [false, true] {
            let k = gemm_tile(ty, trans);
            let ptx = squash(&emit(&k, Arch::Sm80));
            let t = if trans { ".trans" } else { "" };
            for want in [
                format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%f"),
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r".to_string(),
                format!("ldmatrix.sync.aligned.m8n8.x2{t}.shared.b16 {{%r"),
                format!("ldmatrix.sync.aligned.m8n8.x1{t}.shared.b16 {{%r"),
            ] {
                assert!(ptx.contains(&want), "no `{want}` in\n{ptx}");
            }
            if !assemble_for(&k, &[Arch::Sm80, Arch::Sm90]) {
                return;
            }
        }
    }
}

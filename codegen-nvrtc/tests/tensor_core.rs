//! Tensor-core operations as inline asm: `mma.m16n8k16` (f16, bf16) and `ldmatrix` (x1/x2/x4,
//! with and without `.trans`) compile with NVRTC, the PTX keeps the instructions, and ptxas
//! accepts it on sm_80 and sm_90.

use crate::common;

use common::{compile_and_assemble, cuda};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::tensor_core_kernel;
use ruda_ir::{Kernel, MmaType};

#[test]
fn mma_and_ldmatrix_compile_as_inline_asm() {
    let kernels = [
        tensor_core_kernel(MmaType::F16, false).unwrap(),
        tensor_core_kernel(MmaType::BF16, true).unwrap(),
        tensor_core_kernel(MmaType::BF16, false).unwrap(),
        tensor_core_kernel(MmaType::F16, true).unwrap(),
    ];
    let src = cuda(&kernels[1]);
    assert!(src.contains("asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "{src}");
    assert!(src.contains("asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"), "{src}");
    let refs: Vec<&Kernel> = kernels.iter().collect();
    for (arch, ptx) in compile_and_assemble("mma_and_ldmatrix_compile_as_inline_asm", &refs, &[Arch::Sm80, Arch::Sm90])
    {
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

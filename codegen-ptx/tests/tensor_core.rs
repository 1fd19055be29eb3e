//! Tensor-core operations: `mma.m16n8k16` (f16, bf16) and `ldmatrix` (x1/x2/x4, with and without
//! `.trans`) lower to the PTX instructions of the same meaning, and ptxas accepts them on sm_80
//! and sm_90.

use crate::common;

use common::{assemble_for, emit, squash};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::tensor_core_kernel;
use ruda_ir::MmaType;

#[test]
fn mma_and_ldmatrix_lower_and_assemble() {
    for ty in [MmaType::F16, MmaType::BF16] {
        for trans in [false, true] {
            let k = tensor_core_kernel(ty, trans).unwrap();
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

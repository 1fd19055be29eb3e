//! `cp.async` as inline asm compiles with NVRTC, the PTX keeps the instructions, and ptxas
//! accepts it on sm_80 and sm_90.

use crate::common;

use common::{compile_and_assemble, cuda};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::cp_async_kernel;
use ruda_ir::Kernel;

#[test]
fn cp_async_compiles_as_inline_asm() {
    let k = cp_async_kernel(3).unwrap();
    let src = cuda(&k);
    for want in [
        "asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\"",
        "asm volatile(\"cp.async.ca.shared.global [%0], [%1], 8, %2;\"",
        "asm volatile(\"cp.async.commit_group;\" ::: \"memory\");",
        "asm volatile(\"cp.async.wait_group 1;\" ::: \"memory\");",
    ] {
        assert!(src.contains(want), "no `{want}` in\n{src}");
    }
    let refs: Vec<&Kernel> = vec![&k];
    for (arch, ptx) in compile_and_assemble("cp_async_compiles_as_inline_asm", &refs, &[Arch::Sm80, Arch::Sm90]) {
        for want in
            ["cp.async.cg.shared.global", "cp.async.ca.shared.global", "cp.async.commit_group", "cp.async.wait_group 1"]
        {
            assert!(ptx.contains(want), "{arch}: no `{want}` in\n{ptx}");
        }
    }
}

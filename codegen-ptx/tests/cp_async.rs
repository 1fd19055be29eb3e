//! `cp.async` lowers to `cp.async.{cg,ca}.shared.global` (`.cg` for 16 bytes), with the source
//! size operand when given, plus `commit_group` / `wait_group N`; ptxas accepts it on sm_80
//! and sm_90.

use crate::common;

use common::{assemble_for, emit, squash};
use ruda_codegen_ptx::Arch;
use ruda_ir::coverage::cp_async_kernel;

#[test]
fn cp_async_lowers_and_assembles() {
    let k = cp_async_kernel(3).unwrap();
    let ptx = squash(&emit(&k, Arch::Sm80));
    for want in [
        "cp.async.cg.shared.global [%r",
        "], 16, %r",
        "cp.async.ca.shared.global [%r",
        "], 8, %r",
        "], 4, %r",
        "cp.async.commit_group;",
        "cp.async.wait_group 1;",
        "cp.async.wait_group 0;",
    ] {
        assert!(ptx.contains(want), "no `{want}` in\n{ptx}");
    }
    assemble_for(&k, &[Arch::Sm80, Arch::Sm90]);
}

//! The SASS of emitted PTX: `assemble_cubin` keeps the cubin ptxas writes, `nvdisasm` reads it
//! back, and the opcode counts show each tensor-core instruction of the PTX as its SASS
//! (`mma.sync` as `HMMA`, `ldmatrix` as `LDSM`). Skipped loudly without the tools; a failure
//! under `RUDA_REQUIRE_PTXAS=1`.

use crate::common;

use ruda_codegen_ptx::{ptxas, sass, Arch};
use ruda_ir::coverage::tensor_core_kernel;
use ruda_ir::MmaType;

#[test]
fn tensor_core_ops_appear_in_the_sass() {
    let test = "sass::tensor_core_ops_appear_in_the_sass";
    let Some(ptxas_bin) = ptxas::ptxas_or_skip(test).unwrap_or_else(|e| panic!("{e}")) else { return };
    let k = tensor_core_kernel(MmaType::BF16, false).unwrap();
    let ptx = common::emit(&k, Arch::Sm80);
    let (report, cubin) = ptxas::assemble_cubin_with(&ptxas_bin, &ptx, Arch::Sm80).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&cubin[..4], b"\x7fELF");
    assert!(report.entry(&k.name).is_some(), "{report:?}");

    let Some(nvdisasm) = sass::nvdisasm_or_skip(test).unwrap_or_else(|e| panic!("{e}")) else { return };
    let text = sass::disassemble_with(&nvdisasm, &cubin).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains(&format!(".text.{}", k.name)), "{text}");
    let counts = sass::opcode_counts(&text);
    let count = |op: &str| counts.get(op).copied().unwrap_or(0);
    // One mma.sync and three ldmatrix (x4, x2, x1) in the PTX: one HMMA.16816 and one LDSM
    // each (m16n8k16 is a single HMMA on sm_80).
    let in_ptx = |op: &str| ptx.lines().filter(|l| l.trim_start().starts_with(op)).count() as u64;
    assert_eq!((in_ptx("mma.sync"), in_ptx("ldmatrix")), (1, 3), "{ptx}");
    assert_eq!((count("HMMA"), count("LDSM")), (1, 3), "{counts:?}\n{text}");
    // Not a cubin: nvdisasm's own complaint comes back.
    let e = sass::disassemble_with(&nvdisasm, b"not a cubin").unwrap_err();
    assert!(matches!(e, sass::SassError::Failed { .. }), "{e}");
}

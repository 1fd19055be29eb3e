//! Static facts of a kernel without a GPU, end to end on a tensor-core GEMM for sm_80: the
//! cubin `ptxas` makes, its SASS by opcode (`HMMA` for `mma.sync`, `LDSM` for `ldmatrix`,
//! `LDGSTS` for `cp.async`), and the occupancy its registers and shared memory allow.

use ruda_codegen_ptx::{emit_ptx, ptxas, sass, Arch, Target};
use ruda_ir::passes::optimize;
use ruda_ir::MmaType;
use ruda_ops::kernels::gemm_tc::TcTile;
use ruda_ops::kernels::{gemm_tc, GemmTcConfig};
use ruda_ops::perf::occupancy::occupancy;

#[test]
fn tensor_core_gemm_sass_counts_and_occupancy() {
    let test = "perf::tensor_core_gemm_sass_counts_and_occupancy";
    let Some(ptxas_bin) = ptxas::ptxas_or_skip(test).unwrap_or_else(|e| panic!("{e}")) else { return };
    let cfg = GemmTcConfig::new(MmaType::F16, TcTile::T64x64, 2);
    let mut kern = gemm_tc(&cfg).unwrap();
    optimize(&mut kern).unwrap();
    let ptx = emit_ptx(&kern, &Target::new(Arch::Sm80)).unwrap();
    let (report, cubin) = ptxas::assemble_cubin_with(&ptxas_bin, &ptx, Arch::Sm80).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&cubin[..4], b"\x7fELF", "{}: ptxas writes an ELF cubin", cfg.id());
    // The same report as without the cubin.
    assert_eq!(report.entries, ptxas::assemble_with(&ptxas_bin, &ptx, Arch::Sm80).unwrap().entries);
    let entry = report.entry(&kern.name).unwrap_or_else(|| panic!("no entry {} in {report:?}", kern.name));
    // ptxas's static shared memory is the configuration's own account of its stages.
    assert_eq!(entry.shared_bytes, cfg.shared_bytes(), "{entry}");
    let occ = occupancy(Arch::Sm80, cfg.threads(), entry.registers, entry.shared_bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", cfg.id()));
    assert!(occ.blocks_per_sm >= 1 && occ.warps_per_sm == occ.blocks_per_sm * cfg.threads() / 32, "{occ:?}");

    let Some(nvdisasm) = sass::nvdisasm_or_skip(test).unwrap_or_else(|e| panic!("{e}")) else { return };
    let text = sass::disassemble_with(&nvdisasm, &cubin).unwrap_or_else(|e| panic!("{e}"));
    let counts = sass::opcode_counts(&text);
    let count = |op: &str| counts.get(op).copied().unwrap_or(0);
    // Per k-tile the warp does two k steps of (WM / 16) x (WN / 8) mma tiles, each one HMMA,
    // fed by ldmatrix; the stages arrive through cp.async.
    let (wm, wn) = cfg.tile.warp_tile();
    let mmas = u64::from(2 * (wm / 16) * (wn / 8));
    assert!(count("HMMA") >= mmas, "{}: {} HMMA, want {mmas}, in {counts:?}", cfg.id(), count("HMMA"));
    assert!(count("LDSM") >= 1 && count("LDGSTS") >= 1, "{}: {counts:?}", cfg.id());
    assert!(count("EXIT") >= 1, "{counts:?}");
}

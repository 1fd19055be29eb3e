//! Helpers shared by the PTX backend's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};
use ruda_ir::Kernel;

/// The text with every run of spaces and tabs made one space (alignment-independent checks).
pub fn squash(text: &str) -> String {
    text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n")
}

/// Emit `k` for `arch` with the default PTX version, panicking with the error.
pub fn emit(k: &Kernel, arch: Arch) -> String {
    emit_ptx(k, &Target::new(arch)).unwrap_or_else(|e| panic!("emitting `{}` for {arch}: {e}", k.name))
}

/// Emit `k` for each of `arches` and assemble the PTX with ptxas, checking that it does not
/// spill. Returns false (after a loud SKIPPED line) when there is no ptxas and
/// `RUDA_REQUIRE_PTXAS` is not `1`.
pub fn assemble_for(k: &Kernel, arches: &[Arch]) -> bool {
    let tool = match ptxas::ptxas_or_skip(&format!("assembling `{}`", k.name)) {
        Ok(Some(tool)) => tool,
        Ok(None) => return false,
        Err(e) => panic!("{e}"),
    };
    for &arch in arches {
        let ptx = emit(k, arch);
        let report = ptxas::assemble_with(&tool, &ptx, arch).unwrap_or_else(|e| panic!("`{}`: {e}", k.name));
        let entry =
            report.entry(&k.name).unwrap_or_else(|| panic!("no report for `{}` on {arch}:\n{}", k.name, report.log));
        assert!(entry.registers > 0, "`{}` on {arch}: {}", k.name, report.log);
        assert_eq!(entry.spill_store_bytes + entry.spill_load_bytes, 0, "`{}` spills on {arch}: {entry}", k.name);
        assert!(!report.log.contains("warning"), "`{}` on {arch}: ptxas warned:\n{}", k.name, report.log);
    }
    true
}

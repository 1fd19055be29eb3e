//! Helpers shared by the NVRTC backend's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;

use ruda_codegen_nvrtc::{compile_module_with, emit_cuda, nvrtc_or_skip, Nvrtc};
use ruda_codegen_ptx::{ptxas, Arch, Target};
use ruda_ir::{Kernel, KernelBuilder};

pub fn finish(b: KernelBuilder) -> Kernel {
    b.finish().unwrap_or_else(|e| panic!("test kernel does not verify: {e}"))
}

/// The C++ of `k`, panicking with the error.
pub fn cuda(k: &Kernel) -> String {
    emit_cuda(k).unwrap_or_else(|e| panic!("emitting C++ for `{}`: {e}", k.name))
}

/// The NVRTC to use, or `None` after a loud SKIPPED line (a failure with RUDA_REQUIRE_NVRTC=1).
pub fn nvrtc(test: &str) -> Option<Arc<Nvrtc>> {
    nvrtc_or_skip(test).unwrap_or_else(|e| panic!("{e}"))
}

/// Compile `kernels` as one module with NVRTC for each of `arches` and assemble the PTX with
/// ptxas for the same architecture: every kernel must be an entry, without spills or warnings.
/// Returns the PTX per architecture; empty (after a SKIPPED line) without NVRTC.
pub fn compile_and_assemble(test: &str, kernels: &[&Kernel], arches: &[Arch]) -> Vec<(Arch, String)> {
    let targets: Vec<Target> = arches.iter().map(|a| Target::new(*a)).collect();
    compile_and_assemble_for(test, kernels, &targets)
}

/// [`compile_and_assemble`] for targets that may force a PTX ISA version.
pub fn compile_and_assemble_for(test: &str, kernels: &[&Kernel], targets: &[Target]) -> Vec<(Arch, String)> {
    let Some(nvrtc) = nvrtc(test) else {
        return vec![];
    };
    let tool = match ptxas::ptxas_or_skip(test) {
        Ok(Some(tool)) => Some(tool),
        Ok(None) => None,
        Err(e) => panic!("{e}"),
    };
    let mut out = Vec::new();
    for target in targets {
        let arch = target.arch;
        let ptx =
            compile_module_with(&nvrtc, kernels, target).unwrap_or_else(|e| panic!("{test}: NVRTC for {arch}: {e}"));
        for k in kernels {
            assert!(
                ptx.contains(&format!(".entry {}(", k.name)),
                "{test}: no entry `{}` in the PTX for {arch}",
                k.name
            );
        }
        if let Some(tool) = &tool {
            let report = ptxas::assemble_with(tool, &ptx, arch).unwrap_or_else(|e| panic!("{test}: {e}"));
            for k in kernels {
                let entry = report
                    .entry(&k.name)
                    .unwrap_or_else(|| panic!("{test}: no ptxas report for `{}` on {arch}:\n{}", k.name, report.log));
                assert_eq!(
                    entry.spill_store_bytes + entry.spill_load_bytes,
                    0,
                    "{test}: `{}` spills on {arch}: {entry}",
                    k.name
                );
            }
            assert!(!report.log.contains("warning"), "{test} on {arch}: ptxas warned:\n{}", report.log);
        }
        out.push((arch, ptx));
    }
    out
}

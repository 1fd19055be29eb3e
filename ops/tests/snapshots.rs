//! Snapshots of the generated code (`snapshots/`): the full PTX of one representative
//! configuration per op family and target (`snapshots/ptx/`), the CUDA C++ of the NVRTC backend
//! for the same configurations (`snapshots/cuda/`), and a summary line for every configuration
//! (PTX hash, C++ hash, and with `ptxas`: registers, spill bytes, shared bytes), so a review sees
//! every change to every kernel without megabytes of diff. Update with `cargo insta test
//! --review` or `INSTA_UPDATE=always cargo test -p ruda-ops --test main snapshots`.

use std::collections::BTreeSet;
use std::fmt::Write;

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};
use ruda_ir::fnv1a64;
use ruda_ops::registry::registry;

const SNAPSHOT_TARGETS: [Arch; 2] = [Arch::Sm80, Arch::Sm90];

/// The kernel as the op library runs it: built, then the default pass pipeline.
fn optimized(reg: &ruda_ops::registry::Registered) -> ruda_ir::Kernel {
    let mut kernel = reg.build().expect("verifies");
    ruda_ir::passes::optimize(&mut kernel).expect("the pipeline runs");
    kernel
}

fn settings(folder: &str) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(format!("{}/../snapshots/{folder}", env!("CARGO_MANIFEST_DIR")));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

#[test]
fn representative_ptx_per_family_and_target() {
    let mut seen = BTreeSet::new();
    for reg in registry() {
        if !seen.insert(reg.family) {
            continue;
        }
        let kernel = optimized(&reg);
        for arch in SNAPSHOT_TARGETS {
            let ptx = emit_ptx(&kernel, &Target::new(arch)).expect("emits");
            settings("ptx").bind(|| insta::assert_snapshot!(format!("{}.{}", reg.id, arch), ptx));
        }
        let cuda = ruda_codegen_nvrtc::emit_cuda(&kernel).expect("emits C++");
        settings("cuda").bind(|| insta::assert_snapshot!(reg.id.clone(), cuda));
    }
}

#[test]
fn summary_of_every_configuration() {
    let Some(_) = ptxas::ptxas_or_skip("summary_of_every_configuration").expect("ptxas policy") else {
        return;
    };
    for arch in SNAPSHOT_TARGETS {
        let mut table = String::from("id\tptx_fnv64\tcuda_fnv64\tregisters\tspill_bytes\tshared_bytes\n");
        for reg in registry().iter().filter(|r| r.targets.contains(&arch)) {
            let kernel = optimized(reg);
            let ptx = emit_ptx(&kernel, &Target::new(arch)).expect("emits");
            let cuda = ruda_codegen_nvrtc::emit_cuda(&kernel).expect("emits C++");
            let report = ptxas::assemble(&ptx, arch).unwrap_or_else(|e| panic!("{} {arch}: {e}", reg.id));
            let entry = report.entry(&kernel.name).expect("ptxas reports the entry");
            let spills = entry.spill_store_bytes + entry.spill_load_bytes;
            assert_eq!(spills, 0, "{} spills on {arch}", reg.id);
            let _ = writeln!(
                table,
                "{}\t{:016x}\t{:016x}\t{}\t{}\t{}",
                reg.id,
                fnv1a64(ptx.as_bytes()),
                fnv1a64(cuda.as_bytes()),
                entry.registers,
                spills,
                entry.shared_bytes
            );
        }
        settings("ptx").bind(|| insta::assert_snapshot!(format!("summary.{arch}"), table));
    }
}

//! Generated kernels (`ruda_ir::gen`) through the PTX backend and ptxas, for sm_80 and sm_90:
//! 256 per architecture (`PROPTEST_CASES` overrides), several kernels to one PTX module per
//! ptxas call, the batches spread over the machine's cores. Kernels for sm_80 leave out the
//! bf16 conversions only sm_90 has; the sm_90 kernels, emitted for sm_80 as well, must then
//! fail with an error naming the op and sm_90, never otherwise.

use std::collections::BTreeSet;
use std::path::Path;

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, CodegenError, PtxVersion, Target};
use ruda_ir::gen::{generate, Entropy, GenConfig};
use ruda_ir::{print_kernel, Kernel};

/// Kernels per ptxas call: process start-up dominates a small kernel's assembly.
const BATCH: usize = 16;

fn cases() -> u64 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(256)
}

/// The kernels for `arch`, named distinctly so that they can share a module.
fn kernels(arch: Arch) -> Vec<Kernel> {
    let base = match arch {
        Arch::Sm80 => 0x5080_0000,
        _ => 0x5090_0000,
    };
    (0..cases())
        .map(|i| {
            let cfg = GenConfig { name: format!("g{i}"), sm80_conversions: arch == Arch::Sm80, ..GenConfig::default() };
            generate(&mut Entropy::from_seed(base + i), &cfg).kernel
        })
        .collect()
}

fn emit(k: &Kernel, arch: Arch) -> String {
    emit_ptx(k, &Target::new(arch)).unwrap_or_else(|e| panic!("`{}` for {arch}: {e}\n{}", k.name, print_kernel(k)))
}

/// One module from several: the highest `.version`, one `.target` and `.address_size`, each
/// `.file` and `.extern` declaration once, then every module's declarations and entries.
fn merge(modules: &[String]) -> String {
    let mut version = PtxVersion::new(0, 0);
    let mut target = String::new();
    let mut once: Vec<String> = vec![];
    let mut body = String::new();
    for m in modules {
        for line in m.lines() {
            if let Some(v) = line.strip_prefix(".version ") {
                version = version.max(PtxVersion::parse(v).expect("the backend writes valid versions"));
            } else if line.starts_with(".target ") {
                target = line.to_string();
            } else if line.starts_with("//") || line.starts_with(".address_size") {
            } else if line.starts_with(".file ") || line.starts_with(".extern ") {
                if !once.iter().any(|l| l == line) {
                    once.push(line.to_string());
                }
            } else {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    let files: Vec<&str> = once.iter().filter(|l| l.starts_with(".file ")).map(String::as_str).collect();
    let numbers: BTreeSet<&str> = files.iter().filter_map(|l| l.split_whitespace().nth(1)).collect();
    assert_eq!(numbers.len(), files.len(), "conflicting .file tables: {files:?}");
    format!(".version {version}\n{target}\n.address_size 64\n\n{}\n{body}", once.join("\n"))
}

/// Assemble `kernels` for `arch` in batches on all cores; on a failure, find the kernel.
fn assemble_all(tool: &Path, kernels: &[Kernel], arch: Arch) {
    let batches: Vec<&[Kernel]> = kernels.chunks(BATCH).collect();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(batches.len().max(1));
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let batches = &batches;
                s.spawn(move || {
                    let mut failures = vec![];
                    for batch in batches.iter().skip(w).step_by(workers) {
                        if let Err(e) = assemble_batch(tool, batch, arch) {
                            failures.push(e);
                        }
                    }
                    failures
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec!["a worker panicked".into()])).collect()
    });
    assert!(failures.is_empty(), "{} batch(es) failed on {arch}:\n{}", failures.len(), failures.join("\n\n"));
}

fn assemble_batch(tool: &Path, batch: &[Kernel], arch: Arch) -> Result<(), String> {
    let modules: Vec<String> = batch.iter().map(|k| emit(k, arch)).collect();
    let merged = merge(&modules);
    let report = match ptxas::assemble_with(tool, &merged, arch) {
        Ok(r) => r,
        Err(batch_error) => {
            // Which kernel: assemble each alone.
            for (k, ptx) in batch.iter().zip(&modules) {
                if let Err(e) = ptxas::assemble_with(tool, ptx, arch) {
                    return Err(format!("`{}` on {arch}: {e}\nIR:\n{}", k.name, print_kernel(k)));
                }
            }
            return Err(format!("a batch fails only when merged: {batch_error}"));
        }
    };
    for k in batch {
        let entry =
            report.entry(&k.name).ok_or_else(|| format!("no ptxas report for `{}`:\n{}", k.name, report.log))?;
        if entry.spill_store_bytes + entry.spill_load_bytes > 0 {
            return Err(format!("`{}` spills on {arch}: {entry}\nIR:\n{}", k.name, print_kernel(k)));
        }
    }
    if report.log.contains("warning") {
        return Err(format!("ptxas warned on {arch}:\n{}", report.log));
    }
    Ok(())
}

fn check_arch(arch: Arch) {
    let tool = match ptxas::ptxas_or_skip(&format!("generated kernels for {arch}")) {
        Ok(Some(tool)) => tool,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let start = std::time::Instant::now();
    let kernels = kernels(arch);
    assemble_all(&tool, &kernels, arch);
    eprintln!("{} generated kernels assembled for {arch} in {:.1?}", kernels.len(), start.elapsed());
}

#[test]
fn generated_kernels_assemble_for_sm80() {
    check_arch(Arch::Sm80);
}

#[test]
fn generated_kernels_assemble_for_sm90() {
    check_arch(Arch::Sm90);
}

#[test]
fn sm90_conversions_are_errors_for_sm80() {
    let mut rejected = 0;
    for k in kernels(Arch::Sm90) {
        match emit_ptx(&k, &Target::new(Arch::Sm80)) {
            Ok(_) => {}
            Err(CodegenError::Unsupported(m)) => {
                assert!(m.contains("`cvt`") && m.contains("bf16") && m.contains("needs sm_90"), "{m}");
                rejected += 1;
            }
            Err(e) => panic!("`{}` for sm_80: {e}\n{}", k.name, print_kernel(&k)),
        }
    }
    // The generator does make them (else this test would check nothing).
    assert!(rejected > 0);
}

#[test]
fn merging_keeps_every_entry_and_the_highest_version() {
    let a = ".version 7.0\n.target sm_80\n.address_size 64\n\n.file 1 \"gen.rs\"\n.visible .entry a()\n{\n}\n";
    let b = "//\n.version 7.8\n.target sm_80\n.address_size 64\n\n.file 1 \"gen.rs\"\n.extern .shared .align 16 .b8 dyn_smem[];\n.visible .entry b()\n{\n}\n";
    let m = merge(&[a.to_string(), b.to_string()]);
    assert!(m.starts_with(".version 7.8\n.target sm_80\n.address_size 64\n"), "{m}");
    assert_eq!(m.matches(".file 1").count(), 1, "{m}");
    assert_eq!(m.matches(".extern").count(), 1, "{m}");
    assert!(m.contains(".entry a()") && m.contains(".entry b()"), "{m}");
    assert!(!m.contains("//"), "{m}");
}

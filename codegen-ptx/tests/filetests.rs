//! Runs the `test compile` file tests of `ir/filetests/compile/` (format:
//! `ir/filetests/README.md`): each file's kernel is emitted for every `; target:` and must
//! contain every `; ptx:` fragment and no `; ptx-not:` fragment (compared with every run of
//! spaces and tabs made one space), or fail with every `; error:` substring. Where `ptxas` is
//! available the PTX must also assemble.

// The harness also serves the IR's own file tests; this crate uses part of it.
#[allow(dead_code)]
#[path = "../../ir/filetests/harness.rs"]
mod harness;

use harness::FileTest;
use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};

#[test]
fn compile_filetests() {
    let files = harness::files_under(&harness::filetests_dir().join("compile"));
    let tool = ptxas::ptxas_or_skip("assembling the compile file tests").unwrap_or_else(|e| panic!("{e}"));
    harness::run_all(&files, |ft| {
        if ft.kind != "compile" {
            return Err(format!("files in compile/ are `test compile`, not `test {}`", ft.kind));
        }
        compile_test(ft, tool.as_deref())
    });
}

fn compile_test(ft: &FileTest, tool: Option<&std::path::Path>) -> Result<(), String> {
    ft.allow_only(&["target", "ptx", "ptx-not", "error"])?;
    let k = ruda_ir::parse_kernel(&ft.text).map_err(|e| format!("the kernel does not parse:\n{e}"))?;
    let targets = ft.one("target")?.ok_or("no `; target:` line (e.g. `; target: sm_80 sm_90`)")?;
    let arches = targets
        .value
        .split_whitespace()
        .map(|name| Arch::from_name(name).ok_or_else(|| format!("line {}: unknown target `{name}`", targets.line)))
        .collect::<Result<Vec<_>, _>>()?;
    if arches.is_empty() {
        return Err(format!("line {}: no target named", targets.line));
    }
    let errors: Vec<_> = ft.all("error").collect();
    for arch in arches {
        match (emit_ptx(&k, &Target::new(arch)), errors.is_empty()) {
            (Ok(ptx), true) => {
                let squashed = squash(&ptx);
                for d in ft.all("ptx") {
                    if !squashed.contains(&squash(&d.value)) {
                        return Err(format!("{arch}: line {}: the PTX lacks {:?}:\n{ptx}", d.line, d.value));
                    }
                }
                for d in ft.all("ptx-not") {
                    if squashed.contains(&squash(&d.value)) {
                        return Err(format!("{arch}: line {}: the PTX contains {:?}:\n{ptx}", d.line, d.value));
                    }
                }
                if let Some(tool) = tool {
                    ptxas::assemble_with(tool, &ptx, arch).map_err(|e| format!("{arch}: {e}"))?;
                }
            }
            (Ok(_), false) => return Err(format!("{arch}: emitting succeeded, but `; error:` expects a failure")),
            (Err(e), true) => return Err(format!("{arch}: emitting failed: {e}")),
            (Err(e), false) => {
                let message = e.to_string();
                if let Some(d) = errors.iter().find(|d| !message.contains(&d.value)) {
                    return Err(format!("{arch}: line {}: the error lacks {:?}; it is:\n{message}", d.line, d.value));
                }
            }
        }
    }
    Ok(())
}

/// Every run of spaces and tabs made one space, so that fragments need not copy the alignment.
fn squash(text: &str) -> String {
    text.split('\n')
        .map(|l| l.split([' ', '\t']).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

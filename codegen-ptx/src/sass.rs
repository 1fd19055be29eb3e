//! The SASS `ptxas` makes, through NVIDIA's `nvdisasm`, without a GPU: finding the tool,
//! disassembling a cubin ([`crate::ptxas::assemble_cubin`]), and counting its instructions by
//! opcode, the static instruction mix of a kernel (`HMMA`, `LDSM`, `LDGSTS`, `LDG`, `FFMA`, ...).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ptxas::{pinned_tools_dir, TempFile, REQUIRE_VAR};

/// Path to an `nvdisasm` binary; overrides every other place.
pub const NVDISASM_VAR: &str = "RUDA_NVDISASM";

/// Where `nvdisasm` is: `$RUDA_NVDISASM` (returned even if it does not exist, so that a wrong
/// setting fails loudly when run), else the pinned tools' copy (the PyPI wheel
/// `nvidia-cuda-nvdisasm` 13.x, which reads the pinned 12.9 ptxas's cubins), else `PATH`.
pub fn find_nvdisasm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(NVDISASM_VAR).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let pinned = pinned_tools_dir().map(|d| d.join("nvidia").join("cu13").join("bin").join("nvdisasm"));
    if let Some(p) = pinned.filter(|p| p.is_file()) {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("nvdisasm")).find(|p| p.is_file())
}

/// Why disassembling did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SassError {
    #[error("nvdisasm not found (set RUDA_NVDISASM or run scripts/install-cuda-tools.sh)")]
    NotFound,
    #[error(
        "nvdisasm not found, and RUDA_REQUIRE_PTXAS=1 requires it (set RUDA_NVDISASM or run scripts/install-cuda-tools.sh)"
    )]
    Required,
    #[error("could not run {}: {message}", nvdisasm.display())]
    Spawn { nvdisasm: PathBuf, message: String },
    #[error("nvdisasm: {0}")]
    Io(String),
    /// nvdisasm rejected the cubin.
    #[error("{} failed ({status}):\n{}", nvdisasm.display(), log.trim_end())]
    Failed { nvdisasm: PathBuf, status: String, log: String },
}

/// For test suites: the `nvdisasm` to use; `Ok(None)` after printing a loud SKIPPED line for
/// `test` when there is none; [`SassError::Required`] when `RUDA_REQUIRE_PTXAS=1` (the tools
/// script installs nvdisasm beside ptxas, so where ptxas is required, so is nvdisasm).
pub fn nvdisasm_or_skip(test: &str) -> Result<Option<PathBuf>, SassError> {
    match find_nvdisasm() {
        Some(p) => Ok(Some(p)),
        None if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") => Err(SassError::Required),
        None => {
            // Straight to the process's stderr: the test harness captures `eprintln!`.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: nvdisasm not found (set RUDA_NVDISASM or run scripts/install-cuda-tools.sh): {test}"
            );
            Ok(None)
        }
    }
}

/// Disassemble `cubin` with the `nvdisasm` [`find_nvdisasm`] finds.
pub fn disassemble(cubin: &[u8]) -> Result<String, SassError> {
    disassemble_with(&find_nvdisasm().ok_or(SassError::NotFound)?, cubin)
}

/// Disassemble `cubin` with the given `nvdisasm` (from a temporary file: it reads no stdin).
pub fn disassemble_with(nvdisasm: &Path, cubin: &[u8]) -> Result<String, SassError> {
    let file = TempFile::new("ruda-nvdisasm", "cubin");
    std::fs::write(&file.0, cubin).map_err(|e| SassError::Io(format!("writing {}: {e}", file.0.display())))?;
    let out = Command::new(nvdisasm)
        .arg(&file.0)
        .output()
        .map_err(|e| SassError::Spawn { nvdisasm: nvdisasm.to_path_buf(), message: e.to_string() })?;
    if !out.status.success() {
        let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stdout));
        return Err(SassError::Failed { nvdisasm: nvdisasm.to_path_buf(), status: out.status.to_string(), log });
    }
    String::from_utf8(out.stdout).map_err(|e| SassError::Io(format!("nvdisasm printed something not UTF-8: {e}")))
}

/// How many times each base opcode occurs in `sass` (nvdisasm's text): the static count, not
/// how often it executes. An instruction is a line that starts with an address comment
/// (`/*0040*/`) and is not a directive (`.byte` in data sections); its base opcode is its first
/// word after the guard predicate (`@P0`, `@!PT`), without the modifiers (`.E.SYS`, `.16816`)
/// and the braces of dual-issue pairs. Padding (`NOP` after the last `EXIT`) counts too.
pub fn opcode_counts(sass: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in sass.lines() {
        if let Some(op) = base_opcode(line) {
            *counts.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// The base opcode of one line of nvdisasm output, if it is an instruction.
fn base_opcode(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (address, rest) = rest.split_once("*/")?;
    if address.is_empty() || !address.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let body = rest.split(';').next().unwrap_or_default();
    let body = body.trim().trim_start_matches('{').trim_end_matches('}').trim_start();
    let mut words = body.split_whitespace();
    let mut word = words.next()?;
    if word.starts_with('@') {
        word = words.next()?;
    }
    let base = word.split('.').next()?;
    let is_opcode = base.starts_with(|c: char| c.is_ascii_uppercase())
        && base.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    is_opcode.then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real nvdisasm output (see the file's first lines).
    const EXCERPT: &str = include_str!("../tests/data/gemm_bf16_tc64x64_s2.sm_80.sass");

    #[test]
    fn counts_the_opcodes_of_real_nvdisasm_output() {
        let counts = opcode_counts(EXCERPT);
        // Expected counts from a shell pipeline over the file, not from this parser:
        //   grep -E '^\s*/\*[0-9a-f]+\*/' F | sed -E 's|^\s*/\*[0-9a-f]+\*/\s*||; s|;.*||;
        //   s|^@!?[A-Z0-9]+\s+||' | grep -v '^\.' | awk '{split($1,a,"."); print a[1]}' | sort | uniq -c
        let want: BTreeMap<String, u64> = [
            ("HMMA", 8),
            ("CS2R", 5),
            ("LDSM", 4),
            ("IMAD", 4),
            ("UMOV", 3),
            ("NOP", 3),
            ("LDS", 3),
            ("BRA", 3),
            ("ULDC", 2),
            ("STG", 2),
            ("LEA", 2),
            ("LDGSTS", 2),
            ("LDGDEPBAR", 2),
            ("F2FP", 2),
            ("EXIT", 2),
            ("USEL", 1),
            ("UISETP", 1),
            ("S2R", 1),
            ("PLOP3", 1),
            ("DEPBAR", 1),
            ("BAR", 1),
        ]
        .into_iter()
        .map(|(op, n)| (op.to_string(), n))
        .collect();
        assert_eq!(counts, want);
        // 53 instruction lines: grep -cE '^\s*/\*[0-9a-f]+\*/\s+[A-Z@]' F.
        assert_eq!(counts.values().sum::<u64>(), 53);
    }

    #[test]
    fn strips_guards_modifiers_braces_and_addresses() {
        assert_eq!(base_opcode("        /*0130*/              @!P0 BRA `(.L_x_2) ;"), Some("BRA"));
        assert_eq!(base_opcode("        /*08a0*/              @!PT LDS RZ, [RZ] ;"), Some("LDS"));
        assert_eq!(base_opcode("        /*0370*/                   STG.E.SYS [R2.64], R7 ;"), Some("STG"));
        assert_eq!(base_opcode("        /*0100*/                   NOP;"), Some("NOP"));
        assert_eq!(base_opcode("        /*0d50*/                   { FADD R2, R3, R4 ;"), Some("FADD"));
        assert_eq!(base_opcode("        /*0d60*/                     MOV R5, R6 }"), Some("MOV"));
        // Data, labels, section headers and nvdisasm's encoding comments are not instructions.
        assert_eq!(base_opcode("        /*0000*/ \t.byte\t0xff, 0xff"), None);
        assert_eq!(base_opcode(".L_x_1:"), None);
        assert_eq!(base_opcode("//--------------------- .text.k --------------------------"), None);
        assert_eq!(base_opcode("                                   /* 0x000fe40000000800 */"), None);
    }

    #[test]
    fn a_missing_or_failing_nvdisasm_is_a_clear_error() {
        let missing = Path::new("/nonexistent/ruda/nvdisasm");
        let e = disassemble_with(missing, b"not a cubin").unwrap_err();
        assert!(matches!(e, SassError::Spawn { .. }), "{e:?}");
        assert!(e.to_string().contains("could not run /nonexistent/ruda/nvdisasm"), "{e}");
        // `false` runs and fails: the error says so with the status.
        let Some(fail) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("false"))
            .find(|p| p.is_file())
        else {
            return;
        };
        let e = disassemble_with(&fail, b"not a cubin").unwrap_err();
        assert!(matches!(e, SassError::Failed { .. }) && e.to_string().contains("failed (exit status: 1)"), "{e}");
    }
}

//! Running NVIDIA's `ptxas` on emitted PTX, without a GPU: the validation rung of the test
//! ladder. Finds the tool, assembles, and parses its `-v` resource report (registers, spills,
//! shared memory, stack, constant banks). On failure the PTX is kept on disk and the error
//! carries ptxas's log and a one-line command that reproduces it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Arch;

// The pinned tools are shared with the NVRTC backend, which does not depend on this crate.
pub use ruda_ir::target::{pinned_tools_dir, PINNED_CUDA_VERSION};

/// Path to a `ptxas` binary; overrides every other place.
pub const PTXAS_VAR: &str = "RUDA_PTXAS";

/// `1`: a missing `ptxas` fails the tests instead of skipping them (CI sets it).
pub const REQUIRE_VAR: &str = "RUDA_REQUIRE_PTXAS";

/// Where `ptxas` is: `$RUDA_PTXAS` (returned even if it does not exist, so that a wrong setting
/// fails loudly when run), else the pinned copy in the user cache, else `ptxas` on `PATH`.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(PTXAS_VAR).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(dir) = pinned_tools_dir() {
        let p = dir.join("nvidia").join("cuda_nvcc").join("bin").join("ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

/// The version of the `ptxas` [`find_ptxas`] finds, e.g. `12.9.86`.
pub fn ptxas_version() -> Option<String> {
    let out = Command::new(find_ptxas()?).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // "Cuda compilation tools, release 12.9, V12.9.86"
    let tagged = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .find_map(|w| w.strip_prefix('V').filter(|v| v.starts_with(|c: char| c.is_ascii_digit())));
    tagged
        .map(str::to_string)
        .or_else(|| text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string()))
}

/// What `ptxas -v` reported for one entry function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryReport {
    pub name: String,
    pub registers: u32,
    pub barriers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub stack_frame_bytes: u32,
    /// Static shared memory (`smem`).
    pub shared_bytes: u32,
    /// `(bank, bytes)` for each `cmem[bank]` reported.
    pub cmem: Vec<(u32, u32)>,
}

/// The result of a successful assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxasReport {
    pub arch: Arch,
    /// One per `.entry` in the module, in ptxas's order.
    pub entries: Vec<EntryReport>,
    /// Everything ptxas printed (warnings included).
    pub log: String,
}

impl PtxasReport {
    pub fn entry(&self, name: &str) -> Option<&EntryReport> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// Why assembling did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PtxasError {
    #[error("ptxas not found (set RUDA_PTXAS or run scripts/install-cuda-tools.sh)")]
    NotFound,
    #[error(
        "ptxas not found, and RUDA_REQUIRE_PTXAS=1 requires it (set RUDA_PTXAS or run scripts/install-cuda-tools.sh)"
    )]
    Required,
    #[error("could not run {}: {message}", ptxas.display())]
    Spawn { ptxas: PathBuf, message: String },
    #[error("ptxas: {0}")]
    Io(String),
    /// ptxas rejected the PTX (or its report could not be read).
    #[error("{}", failed_message(.arch, .log, .ptx_path, .repro))]
    Failed { arch: Arch, log: String, ptx_path: PathBuf, repro: String },
}

fn failed_message(arch: &Arch, log: &str, ptx_path: &Path, repro: &str) -> String {
    format!(
        "ptxas rejected the PTX for {arch}:\n{}\nPTX kept at {}\nrepro: {repro}",
        log.trim_end(),
        ptx_path.display()
    )
}

/// For test suites: the `ptxas` to use; `Ok(None)` after printing a loud SKIPPED line for
/// `test` when there is none; [`PtxasError::Required`] when `RUDA_REQUIRE_PTXAS=1`.
pub fn ptxas_or_skip(test: &str) -> Result<Option<PathBuf>, PtxasError> {
    match find_ptxas() {
        Some(p) => Ok(Some(p)),
        None if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") => Err(PtxasError::Required),
        None => {
            // Straight to the process's stderr: the test harness captures `eprintln!`.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: ptxas not found (set RUDA_PTXAS or run scripts/install-cuda-tools.sh): {test}"
            );
            Ok(None)
        }
    }
}

/// Assemble `ptx` for `arch` with the `ptxas` [`find_ptxas`] finds.
pub fn assemble(ptx: &str, arch: Arch) -> Result<PtxasReport, PtxasError> {
    assemble_with(&find_ptxas().ok_or(PtxasError::NotFound)?, ptx, arch)
}

/// [`assemble`], keeping the cubin ptxas wrote (for `nvdisasm`, see [`crate::sass`]).
pub fn assemble_cubin(ptx: &str, arch: Arch) -> Result<(PtxasReport, Vec<u8>), PtxasError> {
    assemble_cubin_with(&find_ptxas().ok_or(PtxasError::NotFound)?, ptx, arch)
}

/// Removes a temporary file when dropped.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    /// A fresh path in the temporary directory, unique to this process and call.
    pub(crate) fn new(prefix: &str, extension: &str) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!("{prefix}-{}-{n}.{extension}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Assemble `ptx` for `arch` with the given `ptxas`: `ptxas -v --gpu-name sm_XX -o OUT IN`.
pub fn assemble_with(ptxas: &Path, ptx: &str, arch: Arch) -> Result<PtxasReport, PtxasError> {
    run(ptxas, ptx, arch, false).map(|(report, _)| report)
}

/// [`assemble_with`], keeping the cubin.
pub fn assemble_cubin_with(ptxas: &Path, ptx: &str, arch: Arch) -> Result<(PtxasReport, Vec<u8>), PtxasError> {
    run(ptxas, ptx, arch, true).map(|(report, cubin)| (report, cubin.unwrap_or_default()))
}

/// Run ptxas; read the cubin back when `keep_cubin`.
fn run(ptxas: &Path, ptx: &str, arch: Arch, keep_cubin: bool) -> Result<(PtxasReport, Option<Vec<u8>>), PtxasError> {
    let input = TempFile::new("ruda-ptxas", "ptx");
    let output = TempFile::new("ruda-ptxas", "cubin");
    std::fs::write(&input.0, ptx).map_err(|e| PtxasError::Io(format!("writing {}: {e}", input.0.display())))?;
    let out = Command::new(ptxas)
        .arg("-v")
        .arg("--gpu-name")
        .arg(arch.name())
        .arg("-o")
        .arg(&output.0)
        .arg(&input.0)
        .output()
        .map_err(|e| PtxasError::Spawn { ptxas: ptxas.to_path_buf(), message: e.to_string() })?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    let parsed = if out.status.success() {
        parse_report(&log, ptx.contains(".entry"))
    } else {
        Err(format!("ptxas exited with {}", out.status))
    };
    match parsed {
        Ok(entries) => {
            let cubin = keep_cubin
                .then(|| std::fs::read(&output.0))
                .transpose()
                .map_err(|e| PtxasError::Io(format!("reading the cubin {}: {e}", output.0.display())))?;
            Ok((PtxasReport { arch, entries, log }, cubin))
        }
        Err(why) => {
            let (ptx_path, note) = keep_failed(ptx);
            let log = format!("{log}{why}{note}");
            let repro = format!(
                "{} -v --gpu-name {} -o /dev/null {}",
                shell_quote(&ptxas.display().to_string()),
                arch.name(),
                shell_quote(&ptx_path.display().to_string())
            );
            Err(PtxasError::Failed { arch, log, ptx_path, repro })
        }
    }
}

/// Keep failing PTX at `<tmp>/ruda-ptxas-fail/<entry>-<hash>.ptx`; returns the path and a note
/// for the log if it could not be written.
fn keep_failed(ptx: &str) -> (PathBuf, String) {
    let entry = ptx
        .split(".entry")
        .nth(1)
        .map(|rest| rest.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
        .filter(|n: &String| !n.is_empty())
        .unwrap_or_else(|| "module".to_string());
    let dir = std::env::temp_dir().join("ruda-ptxas-fail");
    let path = dir.join(format!("{entry}-{:016x}.ptx", ruda_ir::fnv1a64(ptx.as_bytes())));
    match std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, ptx)) {
        Ok(()) => (path, String::new()),
        Err(e) => (path.clone(), format!("\n(could not keep the PTX at {}: {e})", path.display())),
    }
}

/// Single-quote `s` for a POSIX shell unless it is made of plainly safe characters.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A leading number of a report item such as `1024 bytes smem`.
fn leading_number(item: &str) -> Option<u32> {
    item.split_whitespace().next()?.parse().ok()
}

/// Parse the `-v` report (`Compiling entry function`, `Function properties`, `Used ...`).
fn parse_report(log: &str, expect_entry: bool) -> Result<Vec<EntryReport>, String> {
    let mut entries: Vec<EntryReport> = Vec::new();
    // The function whose "N bytes stack frame, ..." line comes next.
    let mut properties_for: Option<String> = None;
    for line in log.lines() {
        let body = line.split_once("info    :").map_or(line, |(_, rest)| rest).trim();
        if let Some(rest) = body.strip_prefix("Compiling entry function '") {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            entries.push(EntryReport { name, ..EntryReport::default() });
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            properties_for = Some(name.trim().to_string());
        } else if body.contains("bytes stack frame") {
            let target = properties_for.take().and_then(|n| entries.iter_mut().find(|e| e.name == n));
            if let Some(e) = target {
                for item in body.split(',') {
                    let n = leading_number(item).ok_or_else(|| format!("unreadable ptxas report line: {line}"))?;
                    if item.contains("stack frame") {
                        e.stack_frame_bytes = n;
                    } else if item.contains("spill stores") {
                        e.spill_store_bytes = n;
                    } else if item.contains("spill loads") {
                        e.spill_load_bytes = n;
                    }
                }
            }
        } else if let Some(rest) = body.strip_prefix("Used ") {
            let e = entries.last_mut().ok_or_else(|| format!("ptxas report line before any entry: {line}"))?;
            for item in rest.split(',').map(str::trim) {
                let item = item.strip_prefix("used ").unwrap_or(item);
                let n = leading_number(item).ok_or_else(|| format!("unreadable ptxas report line: {line}"))?;
                if item.ends_with("registers") {
                    e.registers = n;
                } else if item.ends_with("barriers") {
                    e.barriers = n;
                } else if item.ends_with("bytes smem") {
                    e.shared_bytes = n;
                } else if let Some(bank) = item.split("cmem[").nth(1) {
                    let bank =
                        bank.trim_end_matches(']').parse().map_err(|_| format!("unreadable cmem bank: {line}"))?;
                    e.cmem.push((bank, n));
                }
            }
        }
    }
    if entries.is_empty() && expect_entry {
        return Err("ptxas reported no entry function".into());
    }
    Ok(entries)
}

impl fmt::Display for EntryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} registers, {} B smem, {} B stack, {} B spill stores, {} B spill loads",
            self.name,
            self.registers,
            self.shared_bytes,
            self.stack_frame_bytes,
            self.spill_store_bytes,
            self.spill_load_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_verbose_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'k' for 'sm_80'\n\
                   ptxas info    : Function properties for k\n    \
                   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 361 bytes cmem[0], 8 bytes cmem[2]\n\
                   ptxas info    : Compile time = 3.941 ms\n";
        let entries = parse_report(log, true).expect("parses");
        assert_eq!(
            entries,
            vec![EntryReport {
                name: "k".into(),
                registers: 10,
                barriers: 1,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                stack_frame_bytes: 8,
                shared_bytes: 1024,
                cmem: vec![(0, 361), (2, 8)],
            }]
        );
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("/tmp/a.ptx"), "/tmp/a.ptx");
        assert_eq!(shell_quote("/tmp/a b's.ptx"), r"'/tmp/a b'\''s.ptx'");
    }
}

//! `ruda-codegen-ptx`: structured IR to PTX text, and a `ptxas` wrapper to validate it.
//!
//! [`emit_ptx`] verifies the kernel, lowers it (module `lower`, conversions in `cvt`, virtual
//! registers in `regs`), chooses the PTX ISA version and writes the module text (`module`).
//! The output is deterministic: the same IR and [`Target`] give byte-identical text.
//!
//! Semantics are exact: float add/sub/mul/div/sqrt/rcp/fma carry `.rn` (so ptxas never
//! contracts or approximates them), nothing carries `.ftz`, and the approximate math functions
//! are PTX's `.approx` instructions, as the IR defines them. An operation the target cannot run
//! is a [`CodegenError::Unsupported`] naming the kernel, the op, its source location and the
//! target; there is no silent fallback.

use std::fmt;

use ruda_ir::{Kernel, VerifyError};

mod cvt;
mod lower;
mod module;
pub mod ptxas;
mod regs;

/// The GPU architectures RUDA emits PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    Sm80,
    Sm86,
    Sm89,
    Sm90,
    Sm90a,
}

impl Arch {
    pub const ALL: [Arch; 5] = [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90, Arch::Sm90a];

    /// `sm_80`, ..., `sm_90a`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The lowest PTX ISA version that knows this target.
    pub fn min_ptx_version(self) -> PtxVersion {
        match self {
            Arch::Sm80 => PtxVersion::new(7, 0),
            Arch::Sm86 => PtxVersion::new(7, 1),
            Arch::Sm89 | Arch::Sm90 => PtxVersion::new(7, 8),
            Arch::Sm90a => PtxVersion::new(8, 0),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A PTX ISA version such as 8.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PtxVersion {
    pub major: u32,
    pub minor: u32,
}

impl PtxVersion {
    pub const fn new(major: u32, minor: u32) -> PtxVersion {
        PtxVersion { major, minor }
    }

    /// The newest PTX ISA version this backend knows.
    pub const MAX_KNOWN: PtxVersion = PtxVersion::new(9, 0);

    /// Whether this PTX ISA version exists (7.0 ..= 7.8, 8.0 ..= 8.8, 9.0; older ones know none
    /// of our targets).
    pub fn is_known(self) -> bool {
        matches!((self.major, self.minor), (7, 0..=8) | (8, 0..=8) | (9, 0))
    }

    /// Parse `MAJOR.MINOR`, e.g. `8.0` (surrounding whitespace is ignored).
    pub fn parse(text: &str) -> Result<PtxVersion, CodegenError> {
        let bad = || {
            CodegenError::Version(format!(
                "PTX ISA version {text:?} is malformed: expected MAJOR.MINOR such as \"8.0\""
            ))
        };
        let number = |s: &str| -> Result<u32, CodegenError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        let (major, minor) = text.trim().split_once('.').ok_or_else(bad)?;
        Ok(PtxVersion::new(number(major)?, number(minor)?))
    }
}

/// Whether `version` is a PTX ISA version that exists, that we know, and that knows `arch`.
fn check_version(arch: Arch, version: PtxVersion) -> Result<(), CodegenError> {
    if version > PtxVersion::MAX_KNOWN {
        return Err(CodegenError::Version(format!(
            "PTX ISA {version} is newer than the newest this backend knows ({})",
            PtxVersion::MAX_KNOWN
        )));
    }
    if version < arch.min_ptx_version() {
        return Err(CodegenError::Version(format!(
            "PTX ISA {version} is too old for {arch}, which needs {} or newer",
            arch.min_ptx_version()
        )));
    }
    if !version.is_known() {
        return Err(CodegenError::Version(format!(
            "PTX ISA {version} does not exist (known: 7.0 to 7.8, 8.0 to 8.8, 9.0)"
        )));
    }
    Ok(())
}

impl fmt::Display for PtxVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What to emit for: an architecture and optionally a forced PTX ISA version (else the lowest
/// the target and the kernel need).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub arch: Arch,
    pub ptx_version: Option<PtxVersion>,
}

impl Target {
    pub fn new(arch: Arch) -> Target {
        Target { arch, ptx_version: None }
    }

    /// The environment variable that forces a PTX ISA version.
    pub const PTX_VERSION_VAR: &'static str = "RUDA_PTX_VERSION";

    /// `arch` with the PTX ISA version `version` forces, if any: `None` or an empty string
    /// mean "the lowest the target and the kernel need". Errors when malformed, unknown, newer
    /// than [`PtxVersion::MAX_KNOWN`] or too old for `arch`.
    pub fn with_version_str(arch: Arch, version: Option<&str>) -> Result<Target, CodegenError> {
        match version.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(Target::new(arch)),
            Some(text) => {
                let v = PtxVersion::parse(text)?;
                check_version(arch, v)?;
                Ok(Target { arch, ptx_version: Some(v) })
            }
        }
    }

    /// `arch` with the PTX ISA version `RUDA_PTX_VERSION` forces (unset or empty: none).
    pub fn from_env(arch: Arch) -> Result<Target, CodegenError> {
        let value = std::env::var_os(Self::PTX_VERSION_VAR);
        let text = match &value {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok_or_else(|| CodegenError::Version(format!("{} is not valid UTF-8", Self::PTX_VERSION_VAR)))?,
            ),
        };
        Target::with_version_str(arch, text).map_err(|e| match e {
            CodegenError::Version(m) => CodegenError::Version(format!("{}: {m}", Self::PTX_VERSION_VAR)),
            other => other,
        })
    }
}

/// Why PTX could not be emitted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// An operation the target cannot run (the message names kernel, op, location, target).
    #[error("{0}")]
    Unsupported(String),
    /// The kernel does not verify.
    #[error("cannot emit PTX: {0}")]
    Verify(#[from] VerifyError),
    /// A malformed, unknown or unsuitable PTX ISA version.
    #[error("{0}")]
    Version(String),
    /// A bug in this backend (an invariant the verifier should have guaranteed).
    #[error("internal error in the PTX backend: {0}")]
    Internal(String),
}

/// Emit PTX for one kernel.
pub fn emit_ptx(kernel: &Kernel, target: &Target) -> Result<String, CodegenError> {
    ruda_ir::verify(kernel)?;
    let in_kernel = |e: CodegenError| match e {
        CodegenError::Version(m) => CodegenError::Version(format!("kernel `{}`: {m}", kernel.name)),
        other => other,
    };
    if let Some(v) = target.ptx_version {
        check_version(target.arch, v).map_err(in_kernel)?;
    }
    let names = module::Names::new(kernel);
    let lowered = lower::lower(kernel, target.arch, &names)?;
    let version = choose_version(target, &lowered.needs).map_err(in_kernel)?;
    Ok(module::text(kernel, target.arch, version, &names, &lowered))
}

/// The forced version if it satisfies every need, else the lowest that does.
fn choose_version(target: &Target, needs: &[lower::Need]) -> Result<PtxVersion, CodegenError> {
    let lowest = needs.iter().map(|n| n.ptx).fold(target.arch.min_ptx_version(), PtxVersion::max);
    let Some(forced) = target.ptx_version else { return Ok(lowest) };
    match needs.iter().find(|n| n.ptx > forced) {
        Some(n) => Err(CodegenError::Version(format!(
            "PTX ISA {forced} is too old for {}, which needs {} or newer",
            n.what, n.ptx
        ))),
        None => Ok(forced),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(major: u32, minor: u32) -> lower::Need {
        lower::Need { ptx: PtxVersion::new(major, minor), what: "`cvt` at k.rs:1:2 (`cvt.example`)".into() }
    }

    #[test]
    fn the_version_is_the_highest_need() {
        let target = Target::new(Arch::Sm80);
        assert_eq!(choose_version(&target, &[]), Ok(PtxVersion::new(7, 0)));
        assert_eq!(choose_version(&target, &[need(7, 0), need(7, 8), need(7, 1)]), Ok(PtxVersion::new(7, 8)));
    }

    #[test]
    fn a_forced_version_below_an_op_need_names_the_op() {
        let target = Target { arch: Arch::Sm80, ptx_version: Some(PtxVersion::new(7, 0)) };
        match choose_version(&target, &[need(7, 8)]) {
            Err(CodegenError::Version(m)) => {
                assert!(
                    m.contains("PTX ISA 7.0 is too old for `cvt` at k.rs:1:2 (`cvt.example`), which needs 7.8"),
                    "{m}"
                )
            }
            other => panic!("expected a version error, got {other:?}"),
        }
        let target = Target { arch: Arch::Sm80, ptx_version: Some(PtxVersion::new(8, 0)) };
        assert_eq!(choose_version(&target, &[need(7, 8)]), Ok(PtxVersion::new(8, 0)));
    }

    #[test]
    fn known_versions() {
        let known: Vec<String> = (0..=9)
            .flat_map(|major| (0..=9).map(move |minor| PtxVersion::new(major, minor)))
            .filter(|v| v.is_known())
            .map(|v| v.to_string())
            .collect();
        assert_eq!(known.len(), 9 + 9 + 1);
        assert_eq!(known.first().map(String::as_str), Some("7.0"));
        assert_eq!(known.last().map(String::as_str), Some("9.0"));
        for arch in Arch::ALL {
            assert!(arch.min_ptx_version().is_known());
        }
    }
}

//! `ruda-codegen-ptx`: structured IR to PTX text, a `ptxas` wrapper to validate it, and an
//! `nvdisasm` wrapper for the SASS it makes ([`sass`]).
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

use ruda_ir::{Kernel, VerifyError};

mod cvt;
mod lower;
mod module;
pub mod ptxas;
mod regs;
pub mod sass;

pub use ruda_ir::target::{Arch, PtxVersion, Target, VersionError};

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

impl From<VersionError> for CodegenError {
    fn from(VersionError(m): VersionError) -> CodegenError {
        CodegenError::Version(m)
    }
}

/// Emit PTX for one kernel.
pub fn emit_ptx(kernel: &Kernel, target: &Target) -> Result<String, CodegenError> {
    ruda_ir::verify_form(kernel)?;
    let in_kernel = |e: CodegenError| match e {
        CodegenError::Version(m) => CodegenError::Version(format!("kernel `{}`: {m}", kernel.name)),
        other => other,
    };
    if let Some(v) = target.ptx_version {
        v.check_for(target.arch).map_err(|e| in_kernel(e.into()))?;
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
}

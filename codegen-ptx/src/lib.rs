//! `ruda-codegen-ptx`: structured IR to PTX text.
//!
//! (Being written: the public interface below is fixed; the bodies are not yet.)

use std::fmt;

use ruda_ir::Kernel;

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
}

/// Why PTX could not be emitted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CodegenError {
    #[error("{0}")]
    Unsupported(String),
}

/// Emit PTX for one kernel.
pub fn emit_ptx(kernel: &Kernel, target: &Target) -> Result<String, CodegenError> {
    Err(CodegenError::Unsupported(format!("the PTX backend is not written yet ({} for {})", kernel.name, target.arch)))
}

//! What kernels are compiled for: GPU architectures, PTX ISA versions, and a [`Target`] that
//! pairs an architecture with an optionally forced version. Both backends (PTX directly and
//! CUDA C++ through NVRTC) and the runtime share these, so they live below all of them; the
//! pinned CUDA command-line tools' folder is here for the same reason.

use std::fmt;
use std::path::PathBuf;

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

/// A malformed, unknown or unsuitable PTX ISA version; the message says which (and, from
/// [`Target::from_env`], names the variable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VersionError(pub String);

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

    /// The newest PTX ISA version the backends know.
    pub const MAX_KNOWN: PtxVersion = PtxVersion::new(9, 0);

    /// Whether this PTX ISA version exists (7.0 ..= 7.8, 8.0 ..= 8.8, 9.0; older ones know none
    /// of our targets).
    pub fn is_known(self) -> bool {
        matches!((self.major, self.minor), (7, 0..=8) | (8, 0..=8) | (9, 0))
    }

    /// Parse `MAJOR.MINOR`, e.g. `8.0` (surrounding whitespace is ignored).
    pub fn parse(text: &str) -> Result<PtxVersion, VersionError> {
        let bad =
            || VersionError(format!("PTX ISA version {text:?} is malformed: expected MAJOR.MINOR such as \"8.0\""));
        let number = |s: &str| -> Result<u32, VersionError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        let (major, minor) = text.trim().split_once('.').ok_or_else(bad)?;
        Ok(PtxVersion::new(number(major)?, number(minor)?))
    }

    /// Whether this is a version that exists, that the backends know, and that knows `arch`:
    /// what a forced version must be.
    pub fn check_for(self, arch: Arch) -> Result<(), VersionError> {
        if self > PtxVersion::MAX_KNOWN {
            return Err(VersionError(format!(
                "PTX ISA {self} does not exist or is newer than the newest this backend knows ({})",
                PtxVersion::MAX_KNOWN
            )));
        }
        if self < arch.min_ptx_version() {
            return Err(VersionError(format!(
                "PTX ISA {self} is too old for {arch}, which needs {} or newer",
                arch.min_ptx_version()
            )));
        }
        if !self.is_known() {
            return Err(VersionError(format!("PTX ISA {self} does not exist (known: 7.0 to 7.8, 8.0 to 8.8, 9.0)")));
        }
        Ok(())
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

    /// The environment variable that forces a PTX ISA version.
    pub const PTX_VERSION_VAR: &'static str = "RUDA_PTX_VERSION";

    /// `arch` with the PTX ISA version `version` forces, if any: `None` or an empty string
    /// mean "the lowest the target and the kernel need". Errors when malformed, unknown, newer
    /// than [`PtxVersion::MAX_KNOWN`] or too old for `arch`.
    pub fn with_version_str(arch: Arch, version: Option<&str>) -> Result<Target, VersionError> {
        match version.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(Target::new(arch)),
            Some(text) => {
                let v = PtxVersion::parse(text)?;
                v.check_for(arch)?;
                Ok(Target { arch, ptx_version: Some(v) })
            }
        }
    }

    /// `arch` with the PTX ISA version `RUDA_PTX_VERSION` forces (unset or empty: none).
    pub fn from_env(arch: Arch) -> Result<Target, VersionError> {
        let var = Self::PTX_VERSION_VAR;
        let value = std::env::var_os(var);
        let text = match &value {
            None => None,
            Some(v) => Some(v.to_str().ok_or_else(|| VersionError(format!("{var} is not valid UTF-8")))?),
        };
        Target::with_version_str(arch, text).map_err(|VersionError(m)| VersionError(format!("{var}: {m}")))
    }
}

/// The CUDA release whose command-line tools (`ptxas`, NVRTC) `scripts/install-cuda-tools.sh`
/// installs.
pub const PINNED_CUDA_VERSION: &str = "12.9.86";

/// The folder the install script uses: `$RUDA_TOOLS_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/ruda/cuda-tools/<PINNED_CUDA_VERSION>`.
pub fn pinned_tools_dir() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = non_empty("RUDA_TOOLS_DIR") {
        return Some(dir);
    }
    let cache = non_empty("XDG_CACHE_HOME").or_else(|| non_empty("HOME").map(|h| h.join(".cache")))?;
    Some(cache.join("ruda").join("cuda-tools").join(PINNED_CUDA_VERSION))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_forced_version_must_exist_be_known_and_know_the_arch() {
        let check = |arch: Arch, major, minor| PtxVersion::new(major, minor).check_for(arch).map_err(|e| e.0);
        assert_eq!(check(Arch::Sm80, 7, 0), Ok(()));
        assert_eq!(check(Arch::Sm90a, 8, 0), Ok(()));
        assert!(check(Arch::Sm90, 7, 0).is_err_and(|m| m.contains("too old for sm_90, which needs 7.8")));
        assert!(check(Arch::Sm80, 7, 9).is_err_and(|m| m.contains("PTX ISA 7.9 does not exist")));
        assert!(check(Arch::Sm80, 9, 1).is_err_and(|m| m.contains("PTX ISA 9.1 does not exist")));
        for arch in Arch::ALL {
            assert_eq!(Arch::from_name(arch.name()), Some(arch));
        }
    }
}

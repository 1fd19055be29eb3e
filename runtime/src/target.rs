//! What to emit for a GPU: the architecture from its compute capability, the PTX ISA version
//! from the driver and `RUDA_PTX_VERSION`. Pure functions, testable without a GPU.

use std::fmt;

use ruda_codegen_ptx::{Arch, PtxVersion, Target};

use crate::error::{Result, RuntimeError};

/// A CUDA version as the driver reports it (`cuDriverGetVersion`: 12090 is 12.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    /// From `cuDriverGetVersion`'s `1000 * major + 10 * minor`.
    pub fn from_driver_int(v: i32) -> CudaVersion {
        let v = v.max(0) as u32;
        CudaVersion { major: v / 1000, minor: (v % 1000) / 10 }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The newest PTX ISA a driver of this CUDA version JIT-compiles, from the PTX ISA release
/// history: CUDA 11.x → 7.x, 12.0–12.5 → 8.0–8.5, 12.6 → 8.5 (no new ISA), 12.7 → 8.6,
/// 12.8 → 8.7, 12.9 → 8.8, 13.0 → 9.0, 13.1 → 9.1. A driver newer than the newest we know
/// accepts at least what that one does. `None` below CUDA 11.0.
pub fn max_ptx_for_driver(v: CudaVersion) -> Option<PtxVersion> {
    let ptx = match (v.major, v.minor) {
        (0..=10, _) => return None,
        (11, m) => PtxVersion::new(7, m.min(8)),
        (12, m @ 0..=5) => PtxVersion::new(8, m),
        (12, 6) => PtxVersion::new(8, 5),
        (12, 7) => PtxVersion::new(8, 6),
        (12, 8) => PtxVersion::new(8, 7),
        (12, _) => PtxVersion::new(8, 8),
        (13, 0) => PtxVersion::new(9, 0),
        _ => PtxVersion::new(9, 1),
    };
    Some(ptx)
}

/// The architecture to emit for a GPU of compute capability `major.minor`.
///
/// `needs_sm90a` is the hook for kernels that use Hopper-only instructions (wgmma, TMA):
/// such kernels get `sm_90a`, which runs on compute capability 9.0 alone. No kernel asks for
/// it yet, so callers pass `false`.
pub fn select_arch(name: &str, major: u32, minor: u32, needs_sm90a: bool) -> Result<Arch> {
    if major < 8 {
        return Err(RuntimeError::UnsupportedGpu { name: name.to_string(), major, minor });
    }
    if needs_sm90a {
        return if (major, minor) == (9, 0) { Ok(Arch::Sm90a) } else { Err(RuntimeError::NeedsSm90a { major, minor }) };
    }
    Ok(match (major, minor) {
        (8, 6) => Arch::Sm86,
        // 8.7 is Jetson Orin: its SM is laid out like A100's (164 KiB of shared memory per SM,
        // against 100 KiB on the 8.6 parts), so sm_80 PTX and sm_80 tuning fit it; the driver
        // JIT-compiles the PTX for it.
        (8, 7) => Arch::Sm80,
        (8, 9) => Arch::Sm89,
        // Other 8.x (8.0 and any we do not know) share sm_80's feature set.
        (8, _) => Arch::Sm80,
        (9, _) => Arch::Sm90,
        // 10.0 and newer (Blackwell, ...): the newest we emit. Plain (non-`a`) PTX is forward
        // compatible, and the driver JIT-compiles it for the newer GPU.
        _ => Arch::Sm90,
    })
}

/// The full target: the architecture for the GPU plus the PTX ISA version. `forced` is
/// `RUDA_PTX_VERSION`: it must be at least what the architecture needs and at most what the
/// driver accepts; unset lets the backend pick the lowest the target and kernel need.
pub fn select_target(arch: Arch, forced: Option<PtxVersion>, driver: CudaVersion) -> Result<Target> {
    let max =
        max_ptx_for_driver(driver).ok_or_else(|| RuntimeError::UnsupportedDriver { version: driver.to_string() })?;
    if let Some(v) = forced {
        if v > max {
            return Err(RuntimeError::PtxVersionTooHigh {
                requested: v.to_string(),
                driver: driver.to_string(),
                max: max.to_string(),
                hint: "; lower RUDA_PTX_VERSION or unset it".to_string(),
            });
        }
        let min = arch.min_ptx_version();
        if v < min {
            return Err(RuntimeError::PtxVersionTooLow {
                requested: v.to_string(),
                arch: arch.to_string(),
                min: min.to_string(),
            });
        }
    }
    Ok(Target { arch, ptx_version: forced })
}

/// The `.version` directive of PTX text, if it has one.
pub fn ptx_text_version(ptx: &str) -> Option<PtxVersion> {
    let line = ptx.lines().map(str::trim).find(|l| l.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some(PtxVersion::new(major.trim().parse().ok()?, minor.trim().parse().ok()?))
}

//! Finding the CUDA driver without `cudarc`, which panics when `libcuda` is absent: open the
//! library ourselves, resolve three entry points and call them. Only when this succeeds does
//! the runtime touch `cudarc`.

use std::ffi::c_int;
use std::sync::OnceLock;

use crate::error::{Result, RuntimeError};
use crate::target::CudaVersion;

/// What the driver probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverProbe {
    /// The file name that opened (`libcuda.so.1` or `libcuda.so`).
    pub library: String,
    /// The CUDA version the driver supports (`cuDriverGetVersion`).
    pub driver_version: CudaVersion,
    /// How many CUDA devices the driver sees.
    pub device_count: usize,
}

/// The names tried, in order: the driver's runtime name first, then the development link that
/// `cudarc` also tries (so both load the same library on a normal install).
const LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Probe the driver once per process and remember the answer (success or the reason).
pub fn probe_driver() -> Result<DriverProbe> {
    static PROBE: OnceLock<std::result::Result<DriverProbe, String>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).clone().map_err(|reason| RuntimeError::NoCudaDriver { reason })
}

fn probe_uncached() -> std::result::Result<DriverProbe, String> {
    let mut failures = Vec::new();
    let (library, lib) = LIBRARY_NAMES
        .iter()
        .find_map(|name| {
            // SAFETY: loading the CUDA driver runs its initialisers, which have no
            // preconditions on our side.
            match unsafe { libloading::Library::new(*name) } {
                Ok(lib) => Some((name.to_string(), lib)),
                Err(e) => {
                    failures.push(e.to_string());
                    None
                }
            }
        })
        .ok_or_else(|| {
            // The usual case, no file at all, needs no details; anything else (a broken
            // install, a wrong architecture) keeps the loader's words.
            if failures.iter().all(|f| f.contains("No such file or directory")) {
                format!("{} not found", LIBRARY_NAMES[0])
            } else {
                format!("{} could not be loaded ({})", LIBRARY_NAMES[0], failures.join("; "))
            }
        })?;

    type CuInit = unsafe extern "C" fn(u32) -> c_int;
    type CuCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    type CuVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: the signatures are those of the CUDA driver API (CUresult is a C enum, an int).
    let (init, count, version) = unsafe {
        let sym = |name: &str| format!("{library} has no `{name}`");
        (
            *lib.get::<CuInit>(b"cuInit\0").map_err(|_| sym("cuInit"))?,
            *lib.get::<CuCount>(b"cuDeviceGetCount\0").map_err(|_| sym("cuDeviceGetCount"))?,
            *lib.get::<CuVersion>(b"cuDriverGetVersion\0").map_err(|_| sym("cuDriverGetVersion"))?,
        )
    };
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; cuDriverGetVersion may be called before cuInit.
    let rc = unsafe { version(&mut v) };
    if rc != 0 {
        return Err(format!("cuDriverGetVersion failed ({})", cu_result_name(rc)));
    }
    // SAFETY: flags must be 0.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(format!("cuInit failed ({})", cu_result_name(rc)));
    }
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer, after a successful cuInit.
    let rc = unsafe { count(&mut n) };
    if rc != 0 {
        return Err(format!("cuDeviceGetCount failed ({})", cu_result_name(rc)));
    }
    // The library stays loaded for the life of the process: cudarc will open it again, and
    // unloading a CUDA driver is not something to do mid-process.
    std::mem::forget(lib);
    Ok(DriverProbe { library, driver_version: CudaVersion::from_driver_int(v), device_count: n.max(0) as usize })
}

/// Names for the `CUresult` codes a probe can meet; others are shown by number.
fn cu_result_name(rc: c_int) -> String {
    let name = match rc {
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY: this libcuda is the toolkit's stub, not a driver",
        35 => "CUDA_ERROR_INSUFFICIENT_DRIVER",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return format!("CUresult {rc}"),
    };
    format!("{name}, CUresult {rc}")
}

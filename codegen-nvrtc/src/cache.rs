//! `RUDA_NVRTC_CACHE`: NVRTC's PTX kept on disk, so that a kernel compiled once is not
//! compiled again (NVRTC takes seconds per attention kernel). An entry is named by a digest of
//! everything that decides the PTX: the library (its location and version), the program name,
//! the options, the forced PTX version and the C++ source. A stale entry cannot be hit, since
//! changing any of them changes the name; the folder can be emptied at any time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::{Nvrtc, NvrtcError};

/// A folder: the functions that find NVRTC themselves keep its PTX there and reuse it. Unset
/// or empty: no cache.
pub const CACHE_VAR: &str = "RUDA_NVRTC_CACHE";

/// The cache folder `RUDA_NVRTC_CACHE` names, if any.
pub(crate) struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    pub(crate) fn from_env() -> Option<PtxCache> {
        let dir = std::env::var_os(CACHE_VAR).filter(|v| !v.is_empty())?;
        Some(PtxCache { dir: dir.into() })
    }

    /// The PTX stored under this key, else `compile`'s, stored. Failures are not stored.
    pub(crate) fn get_or_compile(
        &self,
        nvrtc: &Nvrtc,
        program: &str,
        options: &[String],
        forced_version: &str,
        source: &str,
        compile: impl FnOnce() -> Result<String, NvrtcError>,
    ) -> Result<String, NvrtcError> {
        let (major, minor) = nvrtc.version();
        let key = format!(
            "ruda nvrtc cache 1\nlibrary={}\nversion={major}.{minor}\nprogram={program}\noptions={}\nptx={forced_version}\n{source}",
            nvrtc.location(),
            options.join(" "),
        );
        let path = self.dir.join(format!("{:016x}.ptx", ruda_ir::fnv1a64(key.as_bytes())));
        if let Some(ptx) = std::fs::read_to_string(&path).ok().filter(|p| !p.is_empty()) {
            return Ok(ptx);
        }
        let ptx = compile()?;
        if let Err(e) = store(&path, &ptx) {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "ruda: {CACHE_VAR}={}: cannot store {}: {e}; compiling on",
                    self.dir.display(),
                    path.display()
                )
            });
        }
        Ok(ptx)
    }
}

/// Write `ptx` to `path` through a temporary file and a rename, so that a reader (another
/// thread or process) sees either nothing or the whole entry.
fn store(path: &Path, ptx: &str) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
    std::fs::write(&tmp, ptx).and_then(|()| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

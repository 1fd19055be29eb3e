//! Finding and calling NVRTC.
//!
//! We open `libnvrtc` with `libloading` and call its C API ourselves instead of going through
//! `cudarc::nvrtc`: cudarc resolves the library lazily and panics when it is missing, and the
//! GPU machine has CUDA 13 (`libnvrtc.so.13`) where cudarc's dynamic loading looks for the
//! library of the CUDA version it was built for. Our own search (`RUDA_NVRTC`, the pinned
//! copy, then the system's `.so.12` and `.so.13`) turns a missing library into an error that
//! lists where we looked.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::NvrtcError;

/// Path to `libnvrtc`; overrides every other place.
pub const NVRTC_VAR: &str = "RUDA_NVRTC";

/// `1`: a missing NVRTC fails the tests instead of skipping them (CI sets it).
pub const REQUIRE_VAR: &str = "RUDA_REQUIRE_NVRTC";

/// The system library names tried after the pinned copy, in order.
const SYSTEM_NAMES: [&str; 2] = ["libnvrtc.so.12", "libnvrtc.so.13"];

type Program = *mut c_void;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type TextFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;

/// `NVRTC_ERROR_COMPILATION`: the source did not compile (the log says why).
const ERROR_COMPILATION: c_int = 6;

/// A loaded NVRTC library.
pub struct Nvrtc {
    location: String,
    version: (i32, i32),
    version_fn: VersionFn,
    error_string: ErrorStringFn,
    create: CreateFn,
    compile: CompileFn,
    log_size: SizeFn,
    log: TextFn,
    ptx_size: SizeFn,
    ptx: TextFn,
    destroy: DestroyFn,
    /// Keeps the function pointers above valid.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc").field("location", &self.location).field("version", &self.version).finish()
    }
}

/// The outcome of one compilation that NVRTC carried out.
pub(crate) enum Compiled {
    Ptx(String),
    /// The source does not compile: NVRTC's log.
    Failed(String),
}

impl Nvrtc {
    /// Open the library at `location` (a path, or a file name for the system's search) and
    /// resolve the entry points RUDA uses.
    pub fn open(location: &str) -> Result<Nvrtc, NvrtcError> {
        let load_error = |message: String| NvrtcError::Load { location: location.to_string(), message };
        // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions on our side.
        let lib = unsafe { libloading::Library::new(location) }.map_err(|e| {
            // libloading's message is "dlopen failed"; the loader's own words are its source.
            let why = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
            load_error(why)
        })?;
        // SAFETY: the signatures are those of nvrtc.h (nvrtcResult is a C enum, an int;
        // nvrtcProgram an opaque pointer).
        let nvrtc = unsafe {
            let missing = |name: &str| load_error(format!("it has no `{name}`"));
            Nvrtc {
                location: location.to_string(),
                version: (0, 0),
                version_fn: *lib.get::<VersionFn>(b"nvrtcVersion\0").map_err(|_| missing("nvrtcVersion"))?,
                error_string: *lib
                    .get::<ErrorStringFn>(b"nvrtcGetErrorString\0")
                    .map_err(|_| missing("nvrtcGetErrorString"))?,
                create: *lib.get::<CreateFn>(b"nvrtcCreateProgram\0").map_err(|_| missing("nvrtcCreateProgram"))?,
                compile: *lib.get::<CompileFn>(b"nvrtcCompileProgram\0").map_err(|_| missing("nvrtcCompileProgram"))?,
                log_size: *lib
                    .get::<SizeFn>(b"nvrtcGetProgramLogSize\0")
                    .map_err(|_| missing("nvrtcGetProgramLogSize"))?,
                log: *lib.get::<TextFn>(b"nvrtcGetProgramLog\0").map_err(|_| missing("nvrtcGetProgramLog"))?,
                ptx_size: *lib.get::<SizeFn>(b"nvrtcGetPTXSize\0").map_err(|_| missing("nvrtcGetPTXSize"))?,
                ptx: *lib.get::<TextFn>(b"nvrtcGetPTX\0").map_err(|_| missing("nvrtcGetPTX"))?,
                destroy: *lib.get::<DestroyFn>(b"nvrtcDestroyProgram\0").map_err(|_| missing("nvrtcDestroyProgram"))?,
                _lib: lib,
            }
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let rc = unsafe { (nvrtc.version_fn)(&mut major, &mut minor) };
        nvrtc.check("nvrtcVersion", rc)?;
        Ok(Nvrtc { version: (major, minor), ..nvrtc })
    }

    /// Where the library was opened from (a path, or a name the system's loader resolved).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// NVRTC's version, e.g. `(12, 9)`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<(), NvrtcError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        let text = unsafe {
            let p = (self.error_string)(rc);
            if p.is_null() {
                format!("nvrtcResult {rc}")
            } else {
                format!("{} (nvrtcResult {rc})", CStr::from_ptr(p).to_string_lossy())
            }
        };
        Err(NvrtcError::Api { call, message: format!("{text}; library {}", self.location) })
    }

    /// Compile `source` (named `name` in messages) with `options`.
    pub(crate) fn compile(&self, source: &str, name: &str, options: &[String]) -> Result<Compiled, NvrtcError> {
        let nul = |what: &str| NvrtcError::Internal(format!("{what} contains a NUL byte"));
        let src = CString::new(source).map_err(|_| nul("the CUDA C++ source"))?;
        let cname = CString::new(name).map_err(|_| nul("the program name"))?;
        let opts = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| nul("an option"))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings and no headers.
        let rc =
            unsafe { (self.create)(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        self.check("nvrtcCreateProgram", rc)?;
        let guard = ProgramGuard { nvrtc: self, prog };
        // SAFETY: a live program and `opt_ptrs.len()` valid option strings.
        let rc = unsafe { (self.compile)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = guard.text(self.log_size, self.log, "nvrtcGetProgramLog")?;
        if rc == ERROR_COMPILATION {
            return Ok(Compiled::Failed(log));
        }
        self.check("nvrtcCompileProgram", rc).map_err(|e| match e {
            NvrtcError::Api { call, message } => NvrtcError::Api { call, message: format!("{message}\n{log}") },
            other => other,
        })?;
        Ok(Compiled::Ptx(guard.text(self.ptx_size, self.ptx, "nvrtcGetPTX")?))
    }
}

/// Destroys an NVRTC program when dropped.
struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    prog: Program,
}

impl ProgramGuard<'_> {
    /// A text the program holds (its log or its PTX), without the terminating NUL.
    fn text(&self, size_fn: SizeFn, text_fn: TextFn, call: &'static str) -> Result<String, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        let rc = unsafe { size_fn(self.prog, &mut size) };
        self.nvrtc.check(call, rc)?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the `size` bytes NVRTC said it writes (terminating NUL included).
        let rc = unsafe { text_fn(self.prog, buf.as_mut_ptr().cast()) };
        self.nvrtc.check(call, rc)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by this library and is destroyed once.
        let _ = unsafe { (self.nvrtc.destroy)(&mut self.prog) };
    }
}

/// Libraries opened so far, by location: each is opened once per process.
fn open_cached(location: &str) -> Result<Arc<Nvrtc>, NvrtcError> {
    static OPENED: Mutex<Option<HashMap<String, Arc<Nvrtc>>>> = Mutex::new(None);
    // A poisoned map is still consistent (entries are inserted whole).
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let map = opened.get_or_insert_with(HashMap::new);
    if let Some(n) = map.get(location) {
        return Ok(Arc::clone(n));
    }
    let n = Arc::new(Nvrtc::open(location)?);
    map.insert(location.to_string(), Arc::clone(&n));
    Ok(n)
}

/// The pinned copy `scripts/install-cuda-tools.sh` installs.
pub fn pinned_nvrtc_path() -> Option<PathBuf> {
    ruda_ir::target::pinned_tools_dir().map(|d| d.join("nvidia").join("cuda_nvrtc").join("lib").join("libnvrtc.so.12"))
}

/// Find and open NVRTC: `$RUDA_NVRTC` (and nothing else when it is set, so that a wrong
/// setting fails loudly), else the pinned copy in the user cache, else the system's
/// `libnvrtc.so.12`, then `libnvrtc.so.13` (the loader's search), else those files in the
/// `lib64` of `$CUDA_HOME`, `$CUDA_PATH` and `/usr/local/cuda`. The error lists every place
/// looked at.
pub fn find_nvrtc() -> Result<Arc<Nvrtc>, NvrtcError> {
    if let Some(p) = std::env::var_os(NVRTC_VAR).filter(|v| !v.is_empty()) {
        let location = p.to_string_lossy().into_owned();
        return open_cached(&location)
            .map_err(|e| NvrtcError::NotFound { searched: vec![format!("{NVRTC_VAR}={location}: {e}")] });
    }
    let mut searched = Vec::new();
    match pinned_nvrtc_path() {
        Some(p) if p.is_file() => match open_cached(&p.to_string_lossy()) {
            Ok(n) => return Ok(n),
            Err(e) => searched.push(format!("the pinned copy: {e}")),
        },
        Some(p) => searched.push(format!("the pinned copy {} (does not exist)", p.display())),
        None => searched.push("the pinned copy (neither RUDA_TOOLS_DIR, XDG_CACHE_HOME nor HOME is set)".into()),
    }
    for name in SYSTEM_NAMES {
        match open_cached(name) {
            Ok(n) => return Ok(n),
            Err(e) => searched.push(format!("the system's {name}: {e}")),
        }
    }
    // A toolkit whose lib64 is not on the loader's path.
    let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    toolkits.push(PathBuf::from("/usr/local/cuda"));
    for dir in toolkits {
        let files: Vec<PathBuf> =
            SYSTEM_NAMES.iter().map(|n| dir.join("lib64").join(n)).filter(|p| p.is_file()).collect();
        if files.is_empty() {
            searched.push(format!("{}/lib64/libnvrtc.so.{{12,13}} (absent)", dir.display()));
        }
        for p in files {
            match open_cached(&p.to_string_lossy()) {
                Ok(n) => return Ok(n),
                Err(e) => searched.push(format!("{}: {e}", p.display())),
            }
        }
    }
    Err(NvrtcError::NotFound { searched })
}

/// NVRTC's version, e.g. `(12, 9)`, from the library [`find_nvrtc`] finds.
pub fn nvrtc_version() -> Result<(i32, i32), NvrtcError> {
    Ok(find_nvrtc()?.version())
}

/// For test suites: the NVRTC to use; `Ok(None)` after printing a loud SKIPPED line for `test`
/// when there is none; [`NvrtcError::Required`] when `RUDA_REQUIRE_NVRTC=1`.
pub fn nvrtc_or_skip(test: &str) -> Result<Option<Arc<Nvrtc>>, NvrtcError> {
    match find_nvrtc() {
        Ok(n) => Ok(Some(n)),
        Err(e) if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") => Err(NvrtcError::Required(e.to_string())),
        Err(e) => {
            // Straight to the process's stderr: the test harness captures `eprintln!`.
            use std::io::Write;
            let one_line = e.to_string().replace(":\n  ", ": ").replace("\n  ", "; ").replace('\n', " ");
            let _ = writeln!(std::io::stderr(), "SKIPPED: {one_line}: {test}");
            Ok(None)
        }
    }
}

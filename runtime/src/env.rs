//! The environment variables the runtime reads, each parsed by a pure function of its value
//! (`None` = unset) so that the parsing is testable without touching the process environment.

use std::fmt;
use std::sync::OnceLock;

use ruda_codegen_ptx::PtxVersion;

use crate::error::{Result, RuntimeError};

pub const RUDA_DEVICE: &str = "RUDA_DEVICE";
pub const RUDA_CUDA_COMPILER: &str = "RUDA_CUDA_COMPILER";
pub const RUDA_PTX_VERSION: &str = "RUDA_PTX_VERSION";
pub const RUDA_DUMP_IR: &str = "RUDA_DUMP_IR";
pub const RUDA_REQUIRE_GPU: &str = "RUDA_REQUIRE_GPU";
pub const RUDA_AUTOTUNE: &str = "RUDA_AUTOTUNE";
pub const RUDA_CUDA_GRAPHS: &str = "RUDA_CUDA_GRAPHS";
pub const RUDA_PAGED_ATTENTION: &str = "RUDA_PAGED_ATTENTION";
/// Read by the runtime before each CPU launch; the interpreter's own name for it.
pub const RUDA_INTERP_THREADS: &str = ruda_ir::interp::THREADS_ENV;

/// The value of an environment variable: unset and empty read as `None`; a non-UTF-8 value is
/// kept (lossily) so that it is reported as invalid rather than ignored.
pub fn var(name: &str) -> Option<String> {
    match std::env::var_os(name) {
        None => None,
        Some(v) if v.is_empty() => None,
        Some(v) => Some(v.to_string_lossy().into_owned()),
    }
}

/// What `RUDA_DEVICE` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// CUDA device 0 when a driver and a device are present, else the interpreter.
    Auto,
    Cpu,
    Cuda(usize),
}

const DEVICE_ACCEPTED: &str = "auto (the default), cuda, cuda:N (N = 0, 1, ...), cpu";

impl DeviceSpec {
    /// Parse a `RUDA_DEVICE` value (`None` or empty = unset = `auto`).
    pub fn parse(value: Option<&str>) -> Result<DeviceSpec> {
        let Some(raw) = value else { return Ok(DeviceSpec::Auto) };
        let v = raw.trim();
        let invalid =
            || RuntimeError::InvalidEnv { var: RUDA_DEVICE, value: raw.to_string(), accepted: DEVICE_ACCEPTED.into() };
        match v {
            "" | "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = v.strip_prefix("cuda:").ok_or_else(invalid)?;
                // Digits only: `usize::from_str` would also take a leading `+`.
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                n.parse().map(DeviceSpec::Cuda).map_err(|_| invalid())
            }
        }
    }

    /// Read and parse `RUDA_DEVICE`.
    pub fn from_env() -> Result<DeviceSpec> {
        DeviceSpec::parse(var(RUDA_DEVICE).as_deref())
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How kernels become PTX on a CUDA device (`RUDA_CUDA_COMPILER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compiler {
    /// The direct IR → PTX backend (`ruda-codegen-ptx`), the default.
    Ptx,
    /// IR → CUDA C++ → NVRTC → PTX (`ruda-codegen-nvrtc`).
    Nvrtc,
}

const COMPILER_ACCEPTED: &str = "ptx (the default), nvrtc";

impl Compiler {
    /// Parse a `RUDA_CUDA_COMPILER` value (`None` or empty = unset = `ptx`).
    pub fn parse(value: Option<&str>) -> Result<Compiler> {
        match value.map(str::trim) {
            None | Some("") | Some("ptx") => Ok(Compiler::Ptx),
            Some("nvrtc") => Ok(Compiler::Nvrtc),
            Some(_) => Err(RuntimeError::InvalidEnv {
                var: RUDA_CUDA_COMPILER,
                value: value.unwrap_or_default().to_string(),
                accepted: COMPILER_ACCEPTED.into(),
            }),
        }
    }

    /// Read and parse `RUDA_CUDA_COMPILER`.
    pub fn from_env() -> Result<Compiler> {
        Compiler::parse(var(RUDA_CUDA_COMPILER).as_deref())
    }

    pub fn name(self) -> &'static str {
        match self {
            Compiler::Ptx => "ptx",
            Compiler::Nvrtc => "nvrtc",
        }
    }

    /// The backend's version. The backends are versioned with the workspace, so the runtime's
    /// own version is theirs.
    pub fn version(self) -> &'static str {
        match self {
            Compiler::Ptx => concat!("ruda-codegen-ptx ", env!("CARGO_PKG_VERSION")),
            Compiler::Nvrtc => concat!("ruda-codegen-nvrtc ", env!("CARGO_PKG_VERSION")),
        }
    }

    /// The compiler's identity for module-cache keys: [`Compiler::version`], and for NVRTC the
    /// version of the library too (found and asked once per process). An error when NVRTC is
    /// selected but cannot be found.
    pub fn identity(self) -> Result<String> {
        match self {
            Compiler::Ptx => Ok(self.version().to_string()),
            Compiler::Nvrtc => {
                static NVRTC: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
                let version = NVRTC.get_or_init(|| ruda_codegen_nvrtc::nvrtc_version().map_err(|e| e.to_string()));
                match version {
                    Ok((major, minor)) => Ok(format!("{} with NVRTC {major}.{minor}", self.version())),
                    Err(message) => Err(RuntimeError::NvrtcUnavailable { message: message.clone() }),
                }
            }
        }
    }
}

impl fmt::Display for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parse a `RUDA_PTX_VERSION` value (`None` or empty = unset = let the backend choose) with
/// the backend's parser; versions that do not exist or that the backend does not know are
/// rejected here, before any kernel is compiled.
pub fn parse_ptx_version(value: Option<&str>) -> Result<Option<PtxVersion>> {
    let Some(raw) = value else { return Ok(None) };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    let invalid = || {
        RuntimeError::InvalidEnv {
        var: RUDA_PTX_VERSION,
        value: raw.to_string(),
        accepted: format!(
            "a PTX ISA version MAJOR.MINOR such as 8.0 that exists and that the PTX backend knows (up to {}); unset: the lowest the target and kernel need",
            PtxVersion::MAX_KNOWN
        ),
    }
    };
    match PtxVersion::parse(raw) {
        Ok(v) if v.is_known() => Ok(Some(v)),
        _ => Err(invalid()),
    }
}

/// Whether `RUDA_REQUIRE_GPU=1`: tests must fail, not skip, without a CUDA device.
pub fn require_gpu() -> bool {
    var(RUDA_REQUIRE_GPU).as_deref() == Some("1")
}

/// Whether ops benchmark their candidates (`RUDA_AUTOTUNE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutotuneMode {
    On,
    /// Every op uses its heuristic default.
    Off,
}

impl AutotuneMode {
    /// Parse a `RUDA_AUTOTUNE` value (`None` or empty = unset = `on`).
    pub fn parse(value: Option<&str>) -> Result<AutotuneMode> {
        match value.map(str::trim) {
            None | Some("") | Some("on") => Ok(AutotuneMode::On),
            Some("off") => Ok(AutotuneMode::Off),
            Some(_) => Err(RuntimeError::InvalidEnv {
                var: RUDA_AUTOTUNE,
                value: value.unwrap_or_default().to_string(),
                accepted:
                    "on (the default on CUDA), off (use each op's heuristic default); always off on the CPU device"
                        .into(),
            }),
        }
    }
}

/// Parse a `RUDA_INTERP_THREADS` value: the CPU threads the interpreter runs blocks on, a
/// positive integer (`None` or empty = unset = the machine's available parallelism).
pub fn parse_interp_threads(value: Option<&str>) -> Result<usize> {
    let Some(raw) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(std::thread::available_parallelism().map_or(1, |n| n.get()));
    };
    // Digits only: `usize::from_str` would also take a leading `+`.
    let v = raw.trim();
    match v.parse::<usize>() {
        Ok(n) if n > 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(RuntimeError::InvalidEnv {
            var: RUDA_INTERP_THREADS,
            value: raw.to_string(),
            accepted: "a positive integer, the CPU threads the interpreter runs blocks on; unset: all cores".into(),
        }),
    }
}

/// Whether decode steps are captured into graphs and replayed (`RUDA_CUDA_GRAPHS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphMode {
    On,
    Off,
}

impl GraphMode {
    /// Parse a `RUDA_CUDA_GRAPHS` value (`None` or empty = unset = `on`).
    pub fn parse(value: Option<&str>) -> Result<GraphMode> {
        match value.map(str::trim) {
            None | Some("") | Some("on") => Ok(GraphMode::On),
            Some("off") => Ok(GraphMode::Off),
            Some(_) => Err(RuntimeError::InvalidEnv {
                var: RUDA_CUDA_GRAPHS,
                value: value.unwrap_or_default().to_string(),
                accepted: "on (the default), off".into(),
            }),
        }
    }
}

/// Read and parse `RUDA_CUDA_GRAPHS`: an error naming the variable and its value unless it is
/// unset, `on` or `off`, whichever device runs.
pub fn graph_mode() -> Result<GraphMode> {
    GraphMode::parse(var(RUDA_CUDA_GRAPHS).as_deref())
}

/// How batched generation's attention reads the paged KV arena (`RUDA_PAGED_ATTENTION`), read
/// when a batch cache is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagedAttentionMode {
    /// Gather each sequence's pages into contiguous buffers, then the contiguous kernels (the
    /// default).
    Legacy,
    /// The fused paged kernels read the pages in place.
    Fused,
}

impl PagedAttentionMode {
    /// Parse a `RUDA_PAGED_ATTENTION` value (`None` or empty = unset = `legacy`).
    pub fn parse(value: Option<&str>) -> Result<PagedAttentionMode> {
        match value.map(str::trim) {
            None | Some("") | Some("legacy") => Ok(PagedAttentionMode::Legacy),
            Some("fused") => Ok(PagedAttentionMode::Fused),
            Some(_) => Err(RuntimeError::InvalidEnv {
                var: RUDA_PAGED_ATTENTION,
                value: value.unwrap_or_default().to_string(),
                accepted: "legacy (the default: gather the pages, then the contiguous kernels), fused".into(),
            }),
        }
    }
}

/// Read and parse `RUDA_PAGED_ATTENTION`: an error naming the variable and its value unless it
/// is unset, `legacy` or `fused`.
pub fn paged_attention_mode() -> Result<PagedAttentionMode> {
    PagedAttentionMode::parse(var(RUDA_PAGED_ATTENTION).as_deref())
}

/// Read and parse `RUDA_INTERP_THREADS`.
pub(crate) fn interp_threads_from_env() -> Result<usize> {
    parse_interp_threads(var(RUDA_INTERP_THREADS).as_deref())
}

/// Check every variable that changes how kernels are compiled or run, whichever device is
/// chosen: a value the README does not accept is an error on the CPU device too (where the
/// compiler settings are unused), so that a typo is never silently ignored.
pub fn check_env() -> Result<()> {
    DeviceSpec::from_env()?;
    Compiler::from_env()?;
    parse_ptx_version(var(RUDA_PTX_VERSION).as_deref())?;
    AutotuneMode::parse(var(RUDA_AUTOTUNE).as_deref())?;
    graph_mode()?;
    paged_attention_mode()?;
    interp_threads_from_env()?;
    Ok(())
}

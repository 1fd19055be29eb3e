//! The runtime's one error type.

use std::path::PathBuf;

use ruda_ir::interp::InterpError;

/// Everything that can go wrong in the runtime. Messages name the kernel, argument, variable or
/// device involved, so that they can be shown to a user as they are.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An environment variable (or a value parsed as one) holds something not accepted.
    #[error("{var}={value:?} is not valid; accepted values: {accepted}")]
    InvalidEnv { var: &'static str, value: String, accepted: String },

    /// No usable CUDA driver: the library is missing, a symbol is missing, or `cuInit` failed.
    #[error("no CUDA driver: {reason}")]
    NoCudaDriver { reason: String },

    /// The driver works but has no device with this ordinal.
    #[error("CUDA device {ordinal} does not exist: the driver reports {count} device(s)")]
    NoSuchDevice { ordinal: usize, count: usize },

    /// A device was asked for explicitly (`RUDA_DEVICE=cuda`, `Device::cuda`) and cannot be had.
    #[error("{request}: {source}; use RUDA_DEVICE=cpu (or auto) to run on the IR interpreter")]
    CudaUnavailable {
        request: String,
        #[source]
        source: Box<RuntimeError>,
    },

    /// The GPU is older than anything RUDA emits code for.
    #[error("unsupported GPU: {name} has compute capability {major}.{minor}; RUDA needs 8.0 (Ampere) or newer")]
    UnsupportedGpu { name: String, major: u32, minor: u32 },

    /// The driver is older than CUDA 11.0, whose PTX ISA we cannot map.
    #[error("unsupported CUDA driver {version}: RUDA needs a CUDA 11.0 or newer driver")]
    UnsupportedDriver { version: String },

    /// A kernel needs `sm_90a` (Hopper-only instructions) on a GPU that is not compute capability 9.0.
    #[error("the kernel needs sm_90a (Hopper-only instructions), which runs only on compute capability 9.0, not {major}.{minor}")]
    NeedsSm90a { major: u32, minor: u32 },

    /// `RUDA_PTX_VERSION` (or a kernel's PTX) asks for more than the driver accepts.
    #[error("PTX ISA {requested} is newer than the CUDA {driver} driver accepts (at most PTX ISA {max}){hint}")]
    PtxVersionTooHigh { requested: String, driver: String, max: String, hint: String },

    /// `RUDA_PTX_VERSION` is lower than the target needs.
    #[error("RUDA_PTX_VERSION={requested} is lower than {arch} needs (PTX ISA {min} or newer)")]
    PtxVersionTooLow { requested: String, arch: String, min: String },

    /// `RUDA_CUDA_COMPILER=nvrtc`, and no usable NVRTC library was found.
    #[error("RUDA_CUDA_COMPILER=nvrtc: {message}; set RUDA_NVRTC, or use RUDA_CUDA_COMPILER=ptx")]
    NvrtcUnavailable { message: String },

    /// The backend could not emit code for the kernel.
    #[error("kernel `{kernel}`: code generation for {target} failed: {message}")]
    Codegen { kernel: String, target: String, message: String },

    /// The driver rejected the PTX (its JIT log and where the PTX was written are included).
    /// Boxed: the details are large and rare, and every `Result` of the runtime carries this type.
    #[error(transparent)]
    ModuleLoad(Box<ModuleLoadError>),

    /// A launch shape or argument list does not fit the kernel or the device.
    #[error("kernel `{kernel}`: invalid launch: {message}")]
    InvalidLaunch { kernel: String, message: String },

    /// One argument does not fit its kernel parameter.
    #[error("kernel `{kernel}`: argument {index} (`{param}`): {message}")]
    InvalidArg { kernel: String, index: usize, param: String, message: String },

    /// The driver refused or failed a launch.
    #[error("kernel `{kernel}`: launch failed: {message}")]
    Launch { kernel: String, message: String },

    /// The interpreter (CPU device) stopped with an error; it names the kernel and the op.
    /// Boxed for the same reason as [`RuntimeError::ModuleLoad`].
    #[error(transparent)]
    Interp(Box<InterpError>),

    /// Any other CUDA driver call that failed, with what was being done.
    #[error("CUDA driver error while {context}: {message}")]
    Driver { context: String, message: String },

    /// A shape, stride or element count that does not fit.
    #[error("{0}")]
    Shape(String),

    /// A tensor of the wrong dtype.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DType { op: String, expected: String, got: String },

    /// A call that a CUDA graph cannot contain (an allocation, a host synchronisation, a copy
    /// from host memory) on a stream capturing one; the capture has been ended. Also misuse of
    /// capture itself (ending one that was not begun, ...).
    #[error("{op}: {message}")]
    GraphCapture { op: String, message: String },

    /// Tensors or streams on different devices were combined.
    #[error("{op}: {message}")]
    DeviceMismatch { op: String, message: String },

    /// Reading or writing a file (dumped PTX).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The driver's refusal to load a kernel's PTX: its message, the JIT's log, and where the PTX
/// was written (the `RUDA_DUMP_IR` copy, else a temporary file) so that it can be inspected.
#[derive(Debug, thiserror::Error)]
#[error("kernel `{kernel}`: the CUDA driver could not load the PTX for {target}: {message}{}{}",
    if log.is_empty() { String::new() } else { format!("\n--- JIT log ---\n{log}") },
    match ptx_path { Some(p) => format!("\nthe PTX is in {}", p.display()), None => String::new() })]
pub struct ModuleLoadError {
    pub kernel: String,
    pub target: String,
    pub message: String,
    pub log: String,
    pub ptx_path: Option<PathBuf>,
}

impl From<InterpError> for RuntimeError {
    fn from(e: InterpError) -> RuntimeError {
        RuntimeError::Interp(Box::new(e))
    }
}

impl From<ModuleLoadError> for RuntimeError {
    fn from(e: ModuleLoadError) -> RuntimeError {
        RuntimeError::ModuleLoad(Box::new(e))
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl RuntimeError {
    pub(crate) fn driver(context: impl Into<String>, err: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Driver { context: context.into(), message: err.to_string() }
    }
}

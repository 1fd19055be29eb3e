//! The error every op entry point returns.

use ruda_ir::VerifyError;
use ruda_runtime::RuntimeError;

/// Why an op refused its inputs or failed to run.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{op}: shape mismatch: {message}")]
    Shape { op: &'static str, message: String },
    #[error("{op}: unsupported or mismatched dtype: {message}")]
    DType { op: &'static str, message: String },
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
    #[error("{op}: tensors are on different devices: {message}")]
    Device { op: &'static str, message: String },
    #[error(transparent)]
    Runtime(Box<RuntimeError>),
    #[error("kernel does not verify: {0}")]
    Kernel(Box<VerifyError>),
    #[error(transparent)]
    Pass(Box<ruda_ir::passes::PassError>),
}

// The large errors are boxed so that `Result<_, OpError>` stays small on hot paths.
impl From<RuntimeError> for OpError {
    fn from(e: RuntimeError) -> OpError {
        OpError::Runtime(Box::new(e))
    }
}

impl From<VerifyError> for OpError {
    fn from(e: VerifyError) -> OpError {
        OpError::Kernel(Box::new(e))
    }
}

impl From<ruda_ir::passes::PassError> for OpError {
    fn from(e: ruda_ir::passes::PassError) -> OpError {
        OpError::Pass(Box::new(e))
    }
}

/// The name normalization ops give their errors (the same type as every op's).
pub type NormalizationError = OpError;

pub type Result<T> = std::result::Result<T, OpError>;

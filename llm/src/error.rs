//! The one error type of loading: every variant names the file (or tensor, or template) and
//! what is wrong with it.

use std::path::{Path, PathBuf};

use ruda_runtime::RuntimeError;

/// Why a model directory (or one of its files) could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened, read or mapped.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON, or its JSON does not have the expected form.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The file is readable but its content is wrong: a missing field, a bad value, a truncated
    /// or corrupt safetensors file, a missing, extra or misshapen tensor.
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    /// The file describes something valid that RUDA does not implement (yet): another model
    /// type, quantisation, a rope scaling type, sliding-window attention, a tensor dtype.
    #[error("{}: not supported: {message}", path.display())]
    Unsupported { path: PathBuf, message: String },
    /// Creating a device tensor from the mapped bytes failed.
    #[error("uploading tensor {name} to {device}: {source}")]
    Upload {
        name: String,
        device: String,
        // Boxed: a runtime error is large, and every loader returns this type.
        #[source]
        source: Box<RuntimeError>,
    },
    /// The tokenizers crate rejected a tokenizer file, or failed to encode or decode.
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    /// A chat template failed to compile or to render (including its own `raise_exception`).
    #[error("chat template ({source_name}): {message}")]
    Template { source_name: String, message: String },
}

impl LoadError {
    /// An I/O failure on `path`; a file that is missing because it is a symbolic link to
    /// nothing says so (the OS reports only "No such file or directory").
    pub(crate) fn io(path: &Path, source: std::io::Error) -> LoadError {
        if source.kind() == std::io::ErrorKind::NotFound {
            if let Some(target) = dangling_link(path) {
                return LoadError::invalid(
                    path,
                    format!("is a symbolic link to {}, which does not exist", target.display()),
                );
            }
        }
        LoadError::Io { path: path.to_path_buf(), source }
    }

    pub(crate) fn json(path: &Path, source: serde_json::Error) -> LoadError {
        LoadError::Json { path: path.to_path_buf(), source }
    }

    pub(crate) fn invalid(path: &Path, message: impl Into<String>) -> LoadError {
        LoadError::Invalid { path: path.to_path_buf(), message: message.into() }
    }

    pub(crate) fn unsupported(path: &Path, message: impl Into<String>) -> LoadError {
        LoadError::Unsupported { path: path.to_path_buf(), message: message.into() }
    }
}

/// Where `path` points when it is a symbolic link whose target does not exist.
pub(crate) fn dangling_link(path: &Path) -> Option<PathBuf> {
    let is_link = std::fs::symlink_metadata(path).ok()?.file_type().is_symlink();
    (is_link && std::fs::metadata(path).is_err()).then(|| std::fs::read_link(path).ok()).flatten()
}

/// Read a whole (small) text file: configs, indexes, tokenizer files.
pub(crate) fn read_text(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))
}

/// Read and parse a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, LoadError> {
    serde_json::from_str(&read_text(path)?).map_err(|e| LoadError::json(path, e))
}

/// Why a pipeline could not load, or a forward pass or generation failed. Every message says
/// what was being done.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The model directory holds another architecture than the loader's.
    #[error("{}: config.json has model_type \"{found}\", this loader takes \"{expected}\"", path.display())]
    WrongModelType { path: PathBuf, expected: &'static str, found: String },
    /// An op refused its inputs or failed on the device.
    #[error("{context}: {source}")]
    Op {
        context: String,
        #[source]
        source: Box<ruda_ops::api::OpError>,
    },
    #[error(transparent)]
    Runtime(Box<RuntimeError>),
    /// A response format that does not compile, or a constrained generation its grammar
    /// cannot continue (see [`crate::constraint`]).
    #[error("response format: {0}")]
    Constraint(String),
    /// A bad argument from the caller: an empty prompt, zero runs, an invalid sampling value.
    #[error("{0}")]
    InvalidArgument(String),
}

impl From<RuntimeError> for LlmError {
    fn from(e: RuntimeError) -> LlmError {
        LlmError::Runtime(Box::new(e))
    }
}

impl LlmError {
    pub(crate) fn op(context: impl Into<String>, source: ruda_ops::api::OpError) -> LlmError {
        LlmError::Op { context: context.into(), source: Box::new(source) }
    }

    pub(crate) fn missing_tensor(name: &str) -> LlmError {
        LlmError::InvalidArgument(format!("tensor {name} is not in the validated weights"))
    }

    pub(crate) fn upload(name: &str, device: &ruda_runtime::Device, source: RuntimeError) -> LlmError {
        LlmError::Load(LoadError::Upload { name: name.into(), device: device.description(), source: Box::new(source) })
    }
}

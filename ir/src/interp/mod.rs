//! The interpreter: the semantic reference every backend must agree with.
//!
//! (Being written: the public interface below is fixed; the body is not yet.)

use crate::kernel::{Constant, Kernel, Loc};

/// Grid and block shape of a launch, and the dynamic shared memory it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], dynamic_shared_bytes: 0 }
    }
}

/// One kernel argument: a global buffer (the kernel sees its address) or a scalar.
pub enum KernelArg<'a> {
    Buffer(&'a mut [u8]),
    Scalar(Constant),
}

/// A runtime error of the interpreted kernel, naming where it happened.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("kernel `{kernel}`: `{op}` in block {block:?} thread {thread:?}: {message}")]
pub struct InterpError {
    pub kernel: String,
    pub op: String,
    pub loc: Option<Loc>,
    pub block: [u32; 3],
    pub thread: [u32; 3],
    pub message: String,
}

/// Run a launch of `kernel` on host buffers.
pub fn run(kernel: &Kernel, launch: &LaunchConfig, args: &mut [KernelArg<'_>]) -> Result<(), InterpError> {
    let _ = (launch, args);
    Err(InterpError {
        kernel: kernel.name.clone(),
        op: "kernel".into(),
        loc: None,
        block: [0; 3],
        thread: [0; 3],
        message: "the interpreter is not written yet".into(),
    })
}

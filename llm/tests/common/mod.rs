//! Shared helpers of the model-layer tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ruda_runtime::Device;

/// A fixture folder: in the source tree the test was built from, or under the working directory
/// (the GPU rung runs copied test executables from another checkout's root).
pub fn fixture(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let base = if built.exists() { built } else { PathBuf::from("llm/tests/fixtures") };
    base.join(name)
}

/// `RUDA_DEVICE`'s device: the interpreter here, the GPU in the GPU rung.
pub fn device() -> Device {
    Device::from_env().expect("RUDA_DEVICE names a usable device")
}

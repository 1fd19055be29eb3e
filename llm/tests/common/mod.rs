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

/// The built `ruda-llm` command: cargo builds it for the tests; copied test executables (the GPU
/// rung) find it beside them, in `target/<profile>/`.
pub fn ruda_llm() -> PathBuf {
    if std::env::var_os("CARGO").is_some() {
        return PathBuf::from(env!("CARGO_BIN_EXE_ruda-llm"));
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").join("ruda-llm")
}

/// `RUDA_DEVICE`'s device: the interpreter here, the GPU in the GPU rung.
pub fn device() -> Device {
    Device::from_env().expect("RUDA_DEVICE names a usable device")
}

//! `RUDA_CUDA_COMPILER=nvrtc` without a GPU: the compiler's identity in module-cache keys
//! carries NVRTC's version (the GPU tests run the whole suite with both compilers).

use ruda_runtime::Compiler;

#[test]
fn the_nvrtc_identity_carries_the_library_version() {
    assert_eq!(Compiler::Ptx.identity().expect("no library needed"), Compiler::Ptx.version());
    let Some(nvrtc) = ruda_codegen_nvrtc::nvrtc_or_skip("the_nvrtc_identity_carries_the_library_version")
        .unwrap_or_else(|e| panic!("{e}"))
    else {
        return;
    };
    let (major, minor) = nvrtc.version();
    let id = Compiler::Nvrtc.identity().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(id, format!("{} with NVRTC {major}.{minor}", Compiler::Nvrtc.version()));
}

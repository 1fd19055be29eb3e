//! The NVRTC backend (IR → CUDA C++ → NVRTC → PTX) is not written yet; it is the subject of
//! the compiler-depth issue. Until then selecting `RUDA_CUDA_COMPILER=nvrtc` is an error that
//! says so (see `ruda-runtime`).

//! The GEMM kernels: [`simt`] (family `gemm_simt`) and the tensor-core [`tc`] (family `gemm`).

pub mod simt;
pub mod tc;

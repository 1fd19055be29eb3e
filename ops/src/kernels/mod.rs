//! The kernels, each a Rust function from a configuration to an IR [`Kernel`](ruda_ir::Kernel).

pub mod argmax;
pub mod common;
pub mod elementwise;
pub mod embedding;
pub mod fused_norm;
pub mod gemm;
pub mod gemm_tc;
pub mod gemv;
pub mod norm;
pub mod penalty;
pub mod rope;
pub mod rows;
pub mod sampling;
pub mod swiglu;

pub use elementwise::{elementwise, ElementwiseConfig, ElementwiseOp};
pub use gemm::{gemm_simt, BLayout, GemmConfig};
pub use gemm_tc::{gemm_tc, GemmTcConfig};
pub use norm::{layer_norm, rms_norm, NormConfig};
pub use rows::{row_reduce, softmax, RowReduceConfig, RowReduceOp, SoftmaxConfig};
pub mod attention;
pub use attention::{
    attention_decode, attention_decode_combine, attention_prefill, attention_softmax, AttentionDecodeConfig,
    AttentionPrefillConfig, AttentionSoftmaxConfig, KvSource,
};

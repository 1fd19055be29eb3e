//! The kernel builders of every family, in one namespace (each a Rust function from a
//! configuration to an IR [`Kernel`](ruda_ir::Kernel)). Each family's builders live in its
//! folder (`crate::gemv::kernel`, ...); the modules here are those, under their old names.

pub use crate::argmax::kernel as argmax;
pub use crate::attention_pieces::kernel as attention_pieces;
pub use crate::awq::kernel as awq;
pub use crate::blocks as common;
pub use crate::elementwise::kernel as elementwise;
pub use crate::embedding::kernel as embedding;
pub use crate::gated_delta::kernel as gated_delta;
pub use crate::gemm::kernels::simt as gemm;
pub use crate::gemm::kernels::tc as gemm_tc;
pub use crate::gemv::kernel as gemv;
pub use crate::logprobs::kernel as logprobs;
pub use crate::norm::fused::kernel as fused_norm;
pub use crate::norm::kernel as norm;
pub use crate::paged_attention::kernel as paged_attention;
pub use crate::penalty::kernel as penalty;
pub use crate::rope::kernel as rope;
pub use crate::rows::kernel as rows;
pub use crate::sampling::kernel as sampling;
pub use crate::swiglu::kernel as swiglu;

pub use crate::attention::kernels as attention;
pub use attention::{
    attention_decode, attention_decode_combine, attention_prefill, attention_softmax, AttentionDecodeConfig,
    AttentionPrefillConfig, AttentionSoftmaxConfig, KvSource,
};
pub use elementwise::{elementwise, ElementwiseConfig, ElementwiseOp};
pub use gemm::{gemm_simt, BLayout, GemmConfig};
pub use gemm_tc::{gemm_tc, GemmTcConfig};
pub use norm::{layer_norm, rms_norm, NormConfig};
pub use rows::{row_reduce, softmax, RowReduceConfig, RowReduceOp, SoftmaxConfig};

//! Host entry points of every family, in one namespace: validate shapes, dtypes and devices,
//! pick the kernel configuration, and launch. Each op has an `_into(stream, ..., out)` form that
//! neither allocates nor waits for the device, beside an allocating wrapper that runs on the
//! input's default stream.
//!
//! Float ops accept `F32`, `F16` and `BF16` tensors; inputs must be contiguous and non-empty.
//! Each family's entry points live in its folder (`crate::gemm::api`, ...); this module
//! re-exports them so `ruda_ops::api::*` names every op.

pub use crate::argmax::api::*;
pub use crate::attention::api::*;
pub use crate::attention_pieces::api::*;
pub use crate::attn_gate::api::*;
pub use crate::awq::api::*;
pub use crate::conv1d::api::*;
pub use crate::delta_gates::api::*;
pub use crate::elementwise::api::*;
pub use crate::embedding::api::*;
pub use crate::error::*;
pub use crate::gated_delta::api::*;
pub use crate::gemm::api::*;
pub use crate::gemm::tile::*;
pub use crate::gemv::api::*;
pub(crate) use crate::host::*;
pub use crate::logprobs::api::*;
pub use crate::moe::api::*;
pub use crate::moe::decode::{ExpertsDecodeWorkspace, EXPERTS_DECODE_MAX_TOKENS};
pub use crate::moe::expert_training::*;
pub use crate::moe::experts::*;
pub use crate::moe::shared::{shared_expert_add, shared_expert_add_into};
pub use crate::moe::training::*;
pub use crate::moe::tune::ExpertTiles;
pub use crate::norm::api::*;
pub use crate::norm::fused::api::*;
pub use crate::paged_attention::api as paged_attention;
pub use crate::penalty::api::*;
pub use crate::rope::api::*;
pub use crate::row_norm::api::*;
pub use crate::rows::api::*;
pub use crate::sampling::api::*;
pub use crate::swiglu::api::*;

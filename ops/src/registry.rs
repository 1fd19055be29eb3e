//! Every registered kernel configuration: what `rudac list` prints, what snapshots cover and
//! what `rudac check` assembles with `ptxas`. The registry is the list of families
//! ([`FAMILIES`]); each family's folder says which configurations it registers.

use ruda_codegen_ptx::Arch;
use ruda_ir::{Kernel, ScalarType, VerifyError};

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;

/// Targets every SIMT kernel is checked for.
pub const SIMT_TARGETS: [Arch; 4] = [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90];

/// Hidden sizes of the registered norm configurations (Qwen2.5 0.5B/1.5B/3B/7B, Qwen3 0.6B/8B).
pub const NORM_HIDDEN_SIZES: [u32; 6] = [896, 1024, 1536, 2048, 3584, 4096];

/// Every family, one line each, in `rudac list` order. Families that share a line list their
/// configurations interleaved by dtype (the decode ops, registered per dtype), then those
/// without a dtype.
pub const FAMILIES: &[&[&dyn Family]] = &[
    &[&crate::elementwise::Elementwise],
    &[&crate::rows::Rows],
    &[&crate::norm::Norm],
    &[&crate::gemm::Gemm],
    &[&crate::attention::Attention],
    &[&crate::attention_pieces::AttentionPieces],
    &[&crate::paged_attention::mla::PagedMla],
    &[&crate::paged_attention::attention::PagedAttention],
    &[&crate::gemv::Gemv],
    &[&crate::awq::Awq],
    &[&crate::rope::Rope],
    &[&crate::norm::fused::FusedNorm],
    &[&crate::swiglu::Swiglu, &crate::embedding::Embedding],
    &[&crate::argmax::Argmax, &crate::sampling::Sampling, &crate::logprobs::Logprobs],
    &[&crate::moe::Moe],
    &[&crate::moe::MoeRouterTraining],
    &[&crate::moe::MoeExpertTraining],
    &[&crate::moe::shared::MoeSharedExpert],
    &[&crate::moe::decode::MoeDecode],
    &[&crate::elementwise::AddBias, &crate::penalty::Penalty],
    &[&crate::gated_delta::GatedDelta],
    &[&crate::conv1d::Conv1d],
    &[&crate::delta_gates::DeltaGates],
    &[&crate::row_norm::RowNorm],
    &[&crate::attn_gate::AttnGate],
    &[&crate::paged_attention::PagedCopy],
];

/// Every family, in [`FAMILIES`] order.
pub fn families() -> impl Iterator<Item = &'static dyn Family> {
    FAMILIES.iter().flat_map(|line| line.iter().copied())
}

/// The family that registers configurations named `name` (`rope_kv_cache` → the RoPE family).
pub fn family(name: &str) -> Option<&'static dyn Family> {
    families().find(|f| f.names().contains(&name))
}

/// A registered kernel configuration.
pub struct Registered {
    /// Stable id such as `rms_norm.bf16.h4096`.
    pub id: String,
    /// The family name (`rms_norm`, `gemm_simt`, ...), for representative snapshots and sample
    /// problems.
    pub family: &'static str,
    /// The element type it is registered for (where it has one), which orders the
    /// interleaved families of [`FAMILIES`].
    pub dtype: Option<ScalarType>,
    /// Targets this configuration is checked for.
    pub targets: Vec<Arch>,
    build: Box<dyn Fn() -> Result<Kernel, VerifyError> + Send + Sync>,
}

impl Registered {
    /// A configuration checked for [`SIMT_TARGETS`].
    pub fn new(
        id: String,
        family: &'static str,
        dtype: Option<ScalarType>,
        build: impl Fn() -> Result<Kernel, VerifyError> + Send + Sync + 'static,
    ) -> Registered {
        Registered { id, family, dtype, targets: SIMT_TARGETS.to_vec(), build: Box::new(build) }
    }

    /// Build (and verify) the kernel.
    pub fn build(&self) -> Result<Kernel, VerifyError> {
        (self.build)()
    }
}

/// All registered configurations, in a stable order.
pub fn registry() -> Vec<Registered> {
    let mut out = Vec::new();
    for line in FAMILIES {
        let mut configs: Vec<Registered> = line.iter().flat_map(|f| f.configs()).collect();
        if line.len() > 1 {
            // A stable sort keeps each family's order within a dtype, and the line's order of
            // families.
            let rank = |r: &Registered| {
                r.dtype.map_or(FLOAT_DTYPES.len(), |d| {
                    FLOAT_DTYPES.iter().position(|&f| f == d).unwrap_or(FLOAT_DTYPES.len())
                })
            };
            configs.sort_by_key(rank);
        }
        out.extend(configs);
    }
    out
}

/// Find one configuration by id.
pub fn find(id: &str) -> Option<Registered> {
    registry().into_iter().find(|r| r.id == id)
}

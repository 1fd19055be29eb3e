//! Rotary position embeddings: one table of `cos`/`sin` per position shared by every layer.

use ruda_ops::api::{self, OpError, RopeScaling, RopeTable};
use ruda_runtime::{Device, Stream, Tensor};

use crate::error::LlmError;

/// RoPE (`rope_theta`, scaled as `scaling` says) of the first `rotary_dim` dimensions of each
/// head (all of them, or Qwen3.5's partial RoPE) for up to `max_positions`; it has no tensors.
#[derive(Clone, Debug)]
pub struct RopeSpec {
    pub theta: f64,
    pub scaling: RopeScaling,
    pub rotary_dim: usize,
    pub max_positions: usize,
}

impl RopeSpec {
    pub fn load(&self, device: &Device) -> Result<Rope, LlmError> {
        RopeTable::scaled(device, self.theta, self.rotary_dim, self.max_positions, &self.scaling)
            .map(Rope)
            .map_err(|e| LlmError::op("building the rotary table", e))
    }
}

pub struct Rope(RopeTable);

impl Rope {
    /// `out = rope(x)` for `x [tokens, heads, head_dim]` at `positions [tokens]`.
    pub fn forward(&self, s: &Stream, x: &Tensor, positions: &Tensor, out: &Tensor) -> Result<(), OpError> {
        api::rope_into(s, x, positions, &self.0, out)
    }

    /// `rope(k)` and `v` written into the caches at `positions` of the sequences in `slots`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into_cache(
        &self,
        s: &Stream,
        k: &Tensor,
        v: &Tensor,
        positions: &Tensor,
        slots: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<(), OpError> {
        api::rope_kv_cache_into(s, k, v, positions, slots, &self.0, k_cache, v_cache)
    }
}

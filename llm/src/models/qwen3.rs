//! Qwen3 dense (`model_type: qwen3`): the standard decoder with RMS norms on each head of q and
//! k before RoPE, an explicit `head_dim`, and biases on all four projections only with
//! `attention_bias`.

use super::{Architecture, DecoderSpec, LayerSpec};
use crate::config::{ModelConfig, ModelType};
use crate::layers::{AttentionShape, AttentionSpec};

pub struct Qwen3;

impl Architecture for Qwen3 {
    fn model_type(&self) -> ModelType {
        ModelType::Qwen3
    }

    fn spec(&self, c: &ModelConfig) -> DecoderSpec {
        let attention = |prefix: &str| attention(c, prefix);
        DecoderSpec::new(c, (0..c.num_hidden_layers).map(|l| LayerSpec::standard(c, l, attention)).collect())
    }
}

/// Qwen3's attention at `prefix` (`model.layers.{l}.self_attn`), shared with Qwen3-MoE.
pub(super) fn attention(c: &ModelConfig, prefix: &str) -> AttentionSpec {
    let heads =
        AttentionShape { q_heads: c.num_attention_heads, kv_heads: c.num_key_value_heads, head_dim: c.head_dim };
    AttentionSpec::new(prefix, c.hidden_size, heads)
        .with_bias(c.qkv_bias, c.o_proj_bias)
        .with_qk_norm(prefix, c.rms_norm_eps)
}

//! Qwen2 and Qwen2.5 (`model_type: qwen2`): the standard decoder with biases on the q, k and v
//! projections, `head_dim = hidden_size / num_attention_heads`.

use super::{Architecture, DecoderSpec, LayerSpec};
use crate::config::{ModelConfig, ModelType};
use crate::layers::{AttentionShape, AttentionSpec};

pub struct Qwen2;

impl Architecture for Qwen2 {
    fn model_type(&self) -> ModelType {
        ModelType::Qwen2
    }

    fn spec(&self, c: &ModelConfig) -> DecoderSpec {
        let heads =
            AttentionShape { q_heads: c.num_attention_heads, kv_heads: c.num_key_value_heads, head_dim: c.head_dim };
        let attention = |prefix: &str| AttentionSpec::new(prefix, c.hidden_size, heads).with_bias(true, false);
        DecoderSpec::new(c, (0..c.num_hidden_layers).map(|l| LayerSpec::standard(c, l, attention)).collect())
    }
}

//! Qwen3.5 (`model_type: qwen3_5_text`, and the text model of the image-text `qwen3_5`): a hybrid
//! of gated DeltaNet layers (linear attention over a conv and a recurrent state) and gated full
//! attention layers as `layer_types` says, each followed by the SwiGLU MLP. Its norms (input,
//! post-attention, final, and q/k per head) are zero-centred (`x̂ · (1 + w)`); full attention
//! rotates only the first `partial_rotary_factor · head_dim` dimensions, and multiplies its
//! output by `sigmoid` of a per-head gate that `q_proj` makes beside the query. The composite's
//! text tensors sit under `model.language_model.` (its `lm_head.weight` at the top level).

use super::decoder::{FfnSpec, MixerSpec};
use super::{Architecture, DecoderSpec, LayerSpec};
use crate::config::{LayerType, LinearAttentionConfig, ModelConfig, ModelType};
use crate::layers::{AttentionShape, AttentionSpec, EmbeddingSpec, GatedDeltaNetSpec, MlpSpec, RmsNormSpec};

pub struct Qwen35;

impl Architecture for Qwen35 {
    fn model_type(&self) -> ModelType {
        ModelType::Qwen35
    }

    fn spec(&self, c: &ModelConfig) -> DecoderSpec {
        let (p, h, eps) = (c.text_prefix, c.hidden_size, c.rms_norm_eps);
        let heads =
            AttentionShape { q_heads: c.num_attention_heads, kv_heads: c.num_key_value_heads, head_dim: c.head_dim };
        let linear = c.linear_attention.unwrap_or(LinearAttentionConfig::QWEN35_DEFAULTS);
        let layer = |i: usize, kind: &LayerType| {
            let l = format!("{p}layers.{i}");
            let mixer = match kind {
                LayerType::FullAttention => {
                    let prefix = format!("{l}.self_attn");
                    let mut a = AttentionSpec::new(&prefix, h, heads)
                        .with_output_gate()
                        .with_bias(c.qkv_bias, c.o_proj_bias)
                        .with_qk_norm(&prefix, eps);
                    if let Some((q, k)) = &mut a.qk_norm {
                        q.zero_centred = true;
                        k.zero_centred = true;
                    }
                    MixerSpec::Attention(a)
                }
                LayerType::LinearAttention => {
                    MixerSpec::GatedDeltaNet(GatedDeltaNetSpec::new(&format!("{l}.linear_attn"), h, linear, eps))
                }
            };
            LayerSpec {
                input_norm: RmsNormSpec::zero_centred(&format!("{l}.input_layernorm"), h, eps),
                mixer,
                post_norm: RmsNormSpec::zero_centred(&format!("{l}.post_attention_layernorm"), h, eps),
                ffn: FfnSpec::Mlp(MlpSpec::new(&format!("{l}.mlp"), h, c.intermediate_size)),
            }
        };
        let mut spec = DecoderSpec::new(c, c.layer_types.iter().enumerate().map(|(i, t)| layer(i, t)).collect());
        spec.embedding = EmbeddingSpec::named(&format!("{p}embed_tokens.weight"), c.vocab_size, h);
        spec.norm = RmsNormSpec::zero_centred(&format!("{p}norm"), h, eps);
        spec
    }
}

//! Qwen3.5 (`model_type: qwen3_5_text`, and the text model of the image-text `qwen3_5`): a hybrid
//! of gated DeltaNet layers (linear attention over a conv and a recurrent state) and gated full
//! attention layers as `layer_types` says, each followed by the SwiGLU MLP. Its norms (input,
//! post-attention, final, and q/k per head) are zero-centred (`x̂ · (1 + w)`); full attention
//! rotates only the first `partial_rotary_factor · head_dim` dimensions, and multiplies its
//! output by `sigmoid` of a per-head gate that `q_proj` makes beside the query. The composite's
//! text tensors sit under `model.language_model.` (its `lm_head.weight` at the top level).
//!
//! Qwen3.5-MoE (`qwen3_5_moe_text`, and the composite `qwen3_5_moe`) is the same decoder with
//! every MLP replaced by routed experts (softmax top-k, always renormalised) plus a shared
//! expert gated by `sigmoid(x · shared_expert_gate)` ([`MoeSpec::with_shared_expert`]).

use ruda_ops::api::RoutingOptions;

use super::decoder::{FfnSpec, MixerSpec};
use super::{Architecture, DecoderSpec, LayerSpec};
use crate::config::{LayerType, LinearAttentionConfig, ModelConfig, ModelType};
use crate::layers::{AttentionShape, AttentionSpec, EmbeddingSpec, GatedDeltaNetSpec, MlpSpec, MoeSpec, RmsNormSpec};

/// Dense Qwen3.5 ([`ModelType::Qwen35`]) or Qwen3.5-MoE ([`ModelType::Qwen35Moe`]): one
/// decoder, whose feed-forward blocks the config's `moe` decides.
pub struct Qwen35(pub ModelType);

impl Architecture for Qwen35 {
    fn model_type(&self) -> ModelType {
        self.0
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
                ffn: match &c.moe {
                    Some(moe) => {
                        let routing = RoutingOptions { top_k: moe.top_k, renormalize: moe.norm_topk_prob };
                        let spec = MoeSpec::new(
                            &format!("{l}.mlp"),
                            h,
                            moe.num_experts,
                            moe.intermediate_size,
                            routing,
                            moe.experts_layout,
                        );
                        match moe.shared_expert_intermediate_size {
                            Some(shared) => FfnSpec::Moe(spec.with_shared_expert(shared)),
                            None => FfnSpec::Moe(spec),
                        }
                    }
                    None => FfnSpec::Mlp(MlpSpec::new(&format!("{l}.mlp"), h, c.intermediate_size)),
                },
            }
        };
        let mut spec = DecoderSpec::new(c, c.layer_types.iter().enumerate().map(|(i, t)| layer(i, t)).collect());
        spec.embedding = EmbeddingSpec::named(&format!("{p}embed_tokens.weight"), c.vocab_size, h);
        spec.norm = RmsNormSpec::zero_centred(&format!("{p}norm"), h, eps);
        spec
    }
}

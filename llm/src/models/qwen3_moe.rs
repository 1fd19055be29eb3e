//! Qwen3-MoE (`model_type: qwen3_moe`): Qwen3's decoder (RMS norms on each head of q and k) whose
//! sparse layers replace the MLP by routed SwiGLU experts ([`crate::layers::MoeSpec`]): softmax
//! top-`num_experts_per_tok` routing over `num_experts`, renormalised with `norm_topk_prob`.
//! A layer is sparse unless `mlp_only_layers` names it or `(layer + 1) % decoder_sparse_step !=
//! 0`; the others keep the dense MLP of `intermediate_size`.

use ruda_ops::api::RoutingOptions;

use super::decoder::FfnSpec;
use super::{Architecture, DecoderSpec, LayerSpec};
use crate::config::{ModelConfig, ModelType};
use crate::layers::MoeSpec;

pub struct Qwen3Moe;

impl Architecture for Qwen3Moe {
    fn model_type(&self) -> ModelType {
        ModelType::Qwen3Moe
    }

    fn spec(&self, c: &ModelConfig) -> DecoderSpec {
        let attention = |prefix: &str| super::qwen3::attention(c, prefix);
        let layers = (0..c.num_hidden_layers)
            .map(|l| {
                let mut layer = LayerSpec::standard(c, l, attention);
                if let Some(moe) = c.moe.as_ref().filter(|m| m.sparse_layers.get(l) == Some(&true)) {
                    let routing = RoutingOptions { top_k: moe.top_k, renormalize: moe.norm_topk_prob };
                    layer.ffn = FfnSpec::Moe(MoeSpec::new(
                        &format!("model.layers.{l}.mlp"),
                        c.hidden_size,
                        moe.num_experts,
                        moe.intermediate_size,
                        routing,
                        moe.experts_layout,
                    ));
                }
                layer
            })
            .collect();
        DecoderSpec::new(c, layers)
    }
}

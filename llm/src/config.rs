//! `config.json` of a Qwen2 / Qwen2.5 (`model_type: qwen2`), Qwen3 (`qwen3`), Qwen3-MoE
//! (`qwen3_moe`), Qwen3.5 (`qwen3_5_text`, or the image-text `qwen3_5` read for its
//! `text_config`) or Qwen3.5-MoE (`qwen3_5_moe_text`, or the composite `qwen3_5_moe`) checkpoint,
//! read into one typed [`ModelConfig`] with the defaults of transformers' `Qwen2Config`,
//! `Qwen3Config`, `Qwen3MoeConfig`, `Qwen3_5TextConfig` and `Qwen3_5MoeTextConfig`. What RUDA does not implement (quantisation, rope scaling other than linear, dynamic and YaRN, sliding windows,
//! activations other than SiLU) is rejected here, so later stages never meet it.

use std::path::Path;

use ruda_ops::api::{OpError, RopeScaling, YarnScaling};
use ruda_runtime::DType;
use serde_json::{Map, Value};

use crate::error::{read_json, LoadError};

/// transformers' `max_position_embeddings` when a config leaves it out.
const DEFAULT_MAX_POSITION_EMBEDDINGS: usize = 32768;

/// The architectures RUDA implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelType {
    /// Qwen2 and Qwen2.5: biases on the q/k/v projections, no q/k norms.
    Qwen2,
    /// Qwen3 (dense): RMS norms on q and k per head, explicit `head_dim`, no biases by default.
    Qwen3,
    /// Qwen3.5 (`qwen3_5_text`, and the text of `qwen3_5`): gated DeltaNet and gated full
    /// attention layers ([`ModelConfig::layer_types`]), zero-centred RMS norms, partial RoPE.
    Qwen35,
    /// Qwen3-MoE (`qwen3_moe`): Qwen3's attention, with routed SwiGLU experts in place of the
    /// MLP in its sparse layers ([`ModelConfig::moe`]).
    Qwen3Moe,
    /// Qwen3.5-MoE (`qwen3_5_moe_text`, and the text of `qwen3_5_moe`): Qwen3.5's layers, each
    /// with routed SwiGLU experts and a gated shared expert in place of the MLP.
    Qwen35Moe,
}

impl ModelType {
    /// Whether a `config.json` of `model_type` holds this architecture (Qwen3.5's text models
    /// are `qwen3_5_text` and `qwen3_5_moe_text`, alone or inside the composites `qwen3_5` and
    /// `qwen3_5_moe`).
    pub fn accepts(self, model_type: &str) -> bool {
        model_type == self.name() || self.composite_name() == Some(model_type)
    }

    /// The `model_type` of the image-text composite whose `text_config` is this architecture.
    pub fn composite_name(self) -> Option<&'static str> {
        match self {
            ModelType::Qwen35 => Some("qwen3_5"),
            ModelType::Qwen35Moe => Some("qwen3_5_moe"),
            ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Qwen3Moe => None,
        }
    }

    /// Qwen3.5's hybrid of gated DeltaNet and gated full attention layers, dense or MoE.
    pub fn is_qwen35(self) -> bool {
        matches!(self, ModelType::Qwen35 | ModelType::Qwen35Moe)
    }

    /// The short name of the examples (`{short}_generate`) and bundled models (`tiny-{short}`).
    /// The examples' (and `ruda-llm generate`'s) `MAX_NEW_TOKENS` when it is not given: 8 for
    /// Qwen3.5 (`qwen35_generate`'s documented default), 32 for the others.
    pub fn default_max_new_tokens(self) -> usize {
        match self {
            ModelType::Qwen35 | ModelType::Qwen35Moe => 8,
            ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Qwen3Moe => 32,
        }
    }

    pub fn short_name(self) -> &'static str {
        match self {
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
            ModelType::Qwen35 => "qwen35",
            ModelType::Qwen3Moe => "qwen3-moe",
            ModelType::Qwen35Moe => "qwen35-moe",
        }
    }

    /// The `model_type` string of `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
            ModelType::Qwen35 => "qwen3_5_text",
            ModelType::Qwen3Moe => "qwen3_moe",
            ModelType::Qwen35Moe => "qwen3_5_moe_text",
        }
    }
}

/// The token mixer of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Causal softmax attention over a KV cache (every layer of Qwen2/3).
    FullAttention,
    /// Qwen3.5's gated DeltaNet: a causal conv1d and the gated delta rule over a recurrent state.
    LinearAttention,
}

/// The `linear_*` fields of a Qwen3.5 config (transformers' defaults when absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearAttentionConfig {
    /// The causal conv1d's width `W` (`linear_conv_kernel_dim`).
    pub conv_kernel_dim: usize,
    pub num_key_heads: usize,
    /// A multiple of [`LinearAttentionConfig::num_key_heads`]: value head `j` reads key head
    /// `j / (value heads / key heads)`.
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
}

impl LinearAttentionConfig {
    /// transformers' `Qwen3_5TextConfig` defaults.
    pub const QWEN35_DEFAULTS: LinearAttentionConfig = LinearAttentionConfig {
        conv_kernel_dim: 4,
        num_key_heads: 16,
        num_value_heads: 32,
        key_head_dim: 128,
        value_head_dim: 128,
    };

    /// Channels of `in_proj_qkv`'s output and of the conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }
}

/// How a checkpoint stores its routed experts' weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertsLayout {
    /// `mlp.experts.{e}.{gate,up,down}_proj.weight`, one tensor per expert and projection
    /// (`[I, H]`, `[I, H]`, `[H, I]`).
    PerExpert,
    /// `mlp.experts.gate_up_proj [E, 2I, H]` (each expert's gate rows first) and
    /// `mlp.experts.down_proj [E, H, I]`.
    Fused,
}

/// The mixture-of-experts fields of a Qwen3-MoE or Qwen3.5-MoE config, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Routed experts per sparse layer (`num_experts`, or `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token goes to (`num_experts_per_tok`), `1..=num_experts`.
    pub top_k: usize,
    /// Each expert's intermediate size (`moe_intermediate_size`).
    pub intermediate_size: usize,
    /// Divide the selected routing weights by their sum (`norm_topk_prob`, false when absent).
    pub norm_topk_prob: bool,
    /// Per layer, whether it is sparse: `layer ∉ mlp_only_layers` and `(layer + 1) %
    /// decoder_sparse_step == 0`, as transformers decides it. The others use the dense MLP of
    /// `intermediate_size`.
    pub sparse_layers: Vec<bool>,
    /// The layout [`crate::expected_tensors`] declares: per expert, the layout transformers
    /// writes for Qwen3-MoE, fused for Qwen3.5-MoE. A checkpoint in the other layout loads too
    /// ([`ModelConfig::with_experts_layout`]).
    pub experts_layout: ExpertsLayout,
    /// Qwen3.5-MoE's shared expert, a SwiGLU MLP of this intermediate size
    /// (`shared_expert_intermediate_size`) that every token runs, its output scaled by
    /// `sigmoid(x · shared_expert_gate)` and added to the routed experts'. `None` for Qwen3-MoE.
    pub shared_expert_intermediate_size: Option<usize>,
}

/// The hyper-parameters of a Qwen decoder, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub model_type: ModelType,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The dense MLP's intermediate size; for Qwen3.5-MoE, which has no dense MLP, its shared
    /// expert's.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Grouped-query attention: each of these heads serves
    /// `num_attention_heads / num_key_value_heads` query heads.
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// The base of the rotary embedding frequencies (`rope_theta`, at the top level or in
    /// `rope_parameters`).
    pub rope_theta: f64,
    /// How the rotary frequencies are scaled (`rope_scaling` or `rope_parameters`).
    pub rope_scaling: RopeScaling,
    pub rms_norm_eps: f64,
    /// `lm_head` is the embedding matrix (`lm_head.weight` may then be absent).
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Biases on the q, k and v projections (always for qwen2; `attention_bias` for qwen3).
    pub qkv_bias: bool,
    /// A bias on the output projection (qwen3 with `attention_bias` only).
    pub o_proj_bias: bool,
    /// Per-head RMS norms on q and k before rotary embedding (qwen3).
    pub qk_norm: bool,
    /// The dtype the checkpoint was saved in (`torch_dtype` or `dtype`), when given.
    pub torch_dtype: Option<DType>,
    /// Dimensions of each head that RoPE rotates (the first ones): `head_dim`, or for Qwen3.5
    /// `partial_rotary_factor · head_dim` (the factor 0.25 when absent).
    pub rotary_dim: usize,
    /// Each layer's token mixer, `num_hidden_layers` of them.
    pub layer_types: Vec<LayerType>,
    /// Qwen3.5's gated DeltaNet shapes (`None` for Qwen2/3).
    pub linear_attention: Option<LinearAttentionConfig>,
    /// The prefix of the text model's tensors: `model.`, or `model.language_model.` in the
    /// composite `qwen3_5` (whose `lm_head.weight` stays at the top level).
    pub text_prefix: &'static str,
    /// The routed experts (`None` for dense models).
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Tensors of a checkpoint that this text model neither needs nor refuses: Qwen3.5's
    /// multi-token-prediction head (`mtp.*`) and the composite's vision tower (`model.visual.*`).
    pub fn ignores_tensor(&self, name: &str) -> bool {
        self.model_type.is_qwen35() && (name.starts_with("mtp.") || name.starts_with("model.visual."))
    }

    /// This config with its routed experts declared in `layout` (unchanged for dense models).
    pub fn with_experts_layout(&self, layout: ExpertsLayout) -> ModelConfig {
        let mut c = self.clone();
        if let Some(moe) = &mut c.moe {
            moe.experts_layout = layout;
        }
        c
    }

    /// The experts' layout of a checkpoint that `has` says holds which tensors: fused when it
    /// holds a `mlp.experts.gate_up_proj`, else per expert (`None` for dense models).
    pub fn checkpoint_experts_layout(&self, mut has: impl FnMut(&str) -> bool) -> Option<ExpertsLayout> {
        let moe = self.moe.as_ref()?;
        let first = moe.sparse_layers.iter().position(|&s| s)?;
        let fused = format!("{}layers.{first}.mlp.experts.gate_up_proj", self.text_prefix);
        Some(if has(&fused) { ExpertsLayout::Fused } else { ExpertsLayout::PerExpert })
    }
}

/// Read `dir/config.json`.
pub fn load_config(dir: impl AsRef<Path>) -> Result<ModelConfig, LoadError> {
    let path = dir.as_ref().join("config.json");
    let json = read_json(&path)?;
    parse_config(&path, &json)
}

/// Parse the JSON of a `config.json`; `path` is only used in error messages.
pub fn parse_config(path: &Path, json: &Value) -> Result<ModelConfig, LoadError> {
    let top = json.as_object().ok_or_else(|| LoadError::invalid(path, "the top level is not a JSON object"))?;
    reject_quantization(path, top, "")?;
    let (model_type, obj, text_prefix) = match top.get("model_type").and_then(Value::as_str) {
        Some("qwen2") => (ModelType::Qwen2, top, "model."),
        Some("qwen3") => (ModelType::Qwen3, top, "model."),
        Some("qwen3_5_text") => (ModelType::Qwen35, top, "model."),
        Some("qwen3_moe") => (ModelType::Qwen3Moe, top, "model."),
        Some("qwen3_5_moe_text") => (ModelType::Qwen35Moe, top, "model."),
        Some(composite @ ("qwen3_5" | "qwen3_5_moe")) => {
            let text = top.get("text_config").filter(|v| !v.is_null());
            let text = text.ok_or_else(|| {
                LoadError::invalid(path, format!("model_type \"{composite}\" without a \"text_config\""))
            })?;
            let text = text.as_object().ok_or_else(|| LoadError::invalid(path, "text_config is not an object"))?;
            reject_quantization(path, text, "text_config.")?;
            let model_type = if composite == "qwen3_5" { ModelType::Qwen35 } else { ModelType::Qwen35Moe };
            (model_type, text, "model.language_model.")
        }
        Some(other) => {
            return Err(LoadError::unsupported(
                path,
                format!(
                "model_type \"{other}\" (only \"qwen2\", \"qwen3\", \"qwen3_moe\", \"qwen3_5_text\", \"qwen3_5\", \"qwen3_5_moe_text\" and \"qwen3_5_moe\" are implemented)"
            ),
            ))
        }
        None => return Err(LoadError::invalid(path, "no \"model_type\" string")),
    };
    let f = Fields { path, obj };
    // The composite's own fields, where it has them, over its text config's.
    let outer = Fields { path, obj: top };

    let act = f.string("hidden_act")?.unwrap_or("silu");
    if act != "silu" {
        return Err(LoadError::unsupported(path, format!("hidden_act \"{act}\" (only \"silu\")")));
    }

    let hidden_size = f.required_usize("hidden_size")?;
    let num_hidden_layers = f.required_usize("num_hidden_layers")?;
    let num_attention_heads = f.required_usize("num_attention_heads")?;
    let num_key_value_heads = f.usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
    let head_dim = match (f.usize("head_dim")?, model_type) {
        (Some(d), _) => d,
        // transformers' Qwen3Config and Qwen3_5TextConfig defaults.
        (None, ModelType::Qwen3) => 128,
        (None, ModelType::Qwen35 | ModelType::Qwen35Moe) => 256,
        (None, ModelType::Qwen2 | ModelType::Qwen3Moe) => {
            if hidden_size % num_attention_heads.max(1) != 0 {
                return Err(LoadError::invalid(path, format!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads} and no head_dim is given")));
            }
            hidden_size / num_attention_heads.max(1)
        }
    };
    if num_attention_heads % num_key_value_heads.max(1) != 0 {
        return Err(LoadError::invalid(path, format!("num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}")));
    }
    let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_proj_bias, qk_norm) = match model_type {
        ModelType::Qwen2 => (true, false, false),
        ModelType::Qwen3 | ModelType::Qwen35 | ModelType::Qwen3Moe | ModelType::Qwen35Moe => {
            (attention_bias, attention_bias, true)
        }
    };
    // The composite model ties (or not) by its own field, as transformers reads it: the text
    // config's is not consulted (both default to false).
    let tie_word_embeddings = outer.bool("tie_word_embeddings")?.unwrap_or(false);
    let torch_dtype = match torch_dtype(&f)? {
        None => torch_dtype(&outer)?,
        some => some,
    };
    let linear_attention = match model_type {
        ModelType::Qwen35 | ModelType::Qwen35Moe => {
            let d = LinearAttentionConfig::QWEN35_DEFAULTS;
            Some(LinearAttentionConfig {
                conv_kernel_dim: f.usize("linear_conv_kernel_dim")?.unwrap_or(d.conv_kernel_dim),
                num_key_heads: f.usize("linear_num_key_heads")?.unwrap_or(d.num_key_heads),
                num_value_heads: f.usize("linear_num_value_heads")?.unwrap_or(d.num_value_heads),
                key_head_dim: f.usize("linear_key_head_dim")?.unwrap_or(d.key_head_dim),
                value_head_dim: f.usize("linear_value_head_dim")?.unwrap_or(d.value_head_dim),
            })
        }
        _ => None,
    };
    let layer_types = match model_type {
        ModelType::Qwen35 | ModelType::Qwen35Moe => qwen35_layer_types(&f, num_hidden_layers)?,
        _ => vec![LayerType::FullAttention; num_hidden_layers],
    };
    let rotary_dim = match model_type {
        ModelType::Qwen35 | ModelType::Qwen35Moe => {
            let factor = partial_rotary_factor(&f)?;
            // transformers' `int(head_dim * partial_rotary_factor)`.
            let dim = (head_dim as f64 * factor) as usize;
            if dim == 0 || !dim.is_multiple_of(2) {
                return Err(LoadError::invalid(
                    path,
                    format!(
                        "partial_rotary_factor {factor} of head_dim {head_dim} rotates {dim} dimensions (RoPE needs a positive even number)"
                    ),
                ));
            }
            dim
        }
        _ => head_dim,
    };

    let moe = match model_type {
        ModelType::Qwen3Moe => Some(moe_config(&f, num_hidden_layers)?),
        ModelType::Qwen35Moe => Some(qwen35_moe_config(&f, num_hidden_layers)?),
        ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Qwen35 => None,
    };
    let intermediate_size = match moe.as_ref().and_then(|m| m.shared_expert_intermediate_size) {
        // Qwen3.5-MoE has no dense MLP: its one dense SwiGLU is the shared expert.
        Some(shared) => shared,
        None => f.required_usize("intermediate_size")?,
    };
    let max_position_embeddings = f.usize("max_position_embeddings")?;
    let (rope_theta, rope_scaling) = rope(&f, max_position_embeddings)?;
    let config = ModelConfig {
        model_type,
        vocab_size: f.required_usize("vocab_size")?,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rope_theta,
        rope_scaling,
        rms_norm_eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
        tie_word_embeddings,
        max_position_embeddings: max_position_embeddings.unwrap_or(DEFAULT_MAX_POSITION_EMBEDDINGS),
        qkv_bias,
        o_proj_bias,
        qk_norm,
        torch_dtype,
        rotary_dim,
        layer_types,
        linear_attention,
        text_prefix,
        moe,
    };
    for (name, v) in [
        ("vocab_size", config.vocab_size),
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
        ("num_hidden_layers", config.num_hidden_layers),
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_key_value_heads),
        ("head_dim", config.head_dim),
        ("max_position_embeddings", config.max_position_embeddings),
    ] {
        if v == 0 {
            return Err(LoadError::invalid(path, format!("{name} is 0")));
        }
    }
    if config.head_dim & 1 != 0 {
        return Err(LoadError::invalid(
            path,
            format!("head_dim {} is odd (rotary embedding pairs dimensions)", config.head_dim),
        ));
    }
    if !(config.rms_norm_eps > 0.0 && config.rms_norm_eps.is_finite()) {
        return Err(LoadError::invalid(path, format!("rms_norm_eps {} is not a positive number", config.rms_norm_eps)));
    }
    if !(config.rope_theta > 0.0 && config.rope_theta.is_finite()) {
        return Err(LoadError::invalid(path, format!("rope_theta {} is not a positive number", config.rope_theta)));
    }
    if let Some(la) = &config.linear_attention {
        for (name, v) in [
            ("linear_conv_kernel_dim", la.conv_kernel_dim),
            ("linear_num_key_heads", la.num_key_heads),
            ("linear_num_value_heads", la.num_value_heads),
            ("linear_key_head_dim", la.key_head_dim),
            ("linear_value_head_dim", la.value_head_dim),
        ] {
            if v == 0 {
                return Err(LoadError::invalid(path, format!("{name} is 0")));
            }
        }
        if la.num_value_heads % la.num_key_heads != 0 {
            return Err(LoadError::invalid(
                path,
                format!(
                    "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                    la.num_value_heads, la.num_key_heads
                ),
            ));
        }
    } else {
        reject_sliding_window(&f, num_hidden_layers)?;
    }
    Ok(config)
}

/// The MoE fields of a Qwen3-MoE config: `num_experts` (or `num_local_experts`),
/// `num_experts_per_tok` and `moe_intermediate_size` are required; `norm_topk_prob` (false),
/// `decoder_sparse_step` (1) and `mlp_only_layers` (none) take transformers' defaults.
fn moe_config(f: &Fields, layers: usize) -> Result<MoeConfig, LoadError> {
    let path = f.path;
    let num_experts = match (f.usize("num_experts")?, f.usize("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(LoadError::invalid(
                path,
                format!("num_experts {a} and num_local_experts {b} disagree (they name the same field)"),
            ))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => {
            return Err(LoadError::invalid(
                path,
                "a qwen3_moe config without \"num_experts\" (or \"num_local_experts\")",
            ))
        }
    };
    let top_k = f.required_usize("num_experts_per_tok")?;
    let intermediate_size = f.required_usize("moe_intermediate_size")?;
    check_experts(path, num_experts, top_k, intermediate_size)?;
    let step = f.usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(LoadError::invalid(path, "decoder_sparse_step is 0"));
    }
    let mut dense = vec![false; layers];
    if let Some(v) = f.get("mlp_only_layers").filter(|v| !v.is_null()) {
        let list = v.as_array().ok_or_else(|| LoadError::invalid(path, "mlp_only_layers is not a list"))?;
        for item in list {
            let i = item
                .as_u64()
                .ok_or_else(|| LoadError::invalid(path, format!("mlp_only_layers holds {item}, not a layer index")))?;
            let slot = dense.get_mut(i as usize).ok_or_else(|| {
                LoadError::invalid(path, format!("mlp_only_layers names layer {i} of a model of {layers} layers"))
            })?;
            *slot = true;
        }
    }
    let sparse_layers = (0..layers).map(|l| !dense[l] && (l + 1) % step == 0).collect();
    Ok(MoeConfig {
        num_experts,
        top_k,
        intermediate_size,
        norm_topk_prob: f.bool("norm_topk_prob")?.unwrap_or(false),
        sparse_layers,
        experts_layout: ExpertsLayout::PerExpert,
        shared_expert_intermediate_size: None,
    })
}

/// The MoE fields of a Qwen3.5-MoE config, with `Qwen3_5MoeTextConfig`'s defaults: 256
/// `num_experts`, 8 `num_experts_per_tok`, 512 `moe_intermediate_size` and 512
/// `shared_expert_intermediate_size`. As in transformers, every layer is sparse and the selected
/// routing weights are always renormalised (`norm_topk_prob`, `decoder_sparse_step` and
/// `mlp_only_layers` are not read).
fn qwen35_moe_config(f: &Fields, layers: usize) -> Result<MoeConfig, LoadError> {
    let num_experts = f.usize("num_experts")?.unwrap_or(256);
    let top_k = f.usize("num_experts_per_tok")?.unwrap_or(8);
    let intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(512);
    check_experts(f.path, num_experts, top_k, intermediate_size)?;
    let shared = f.usize("shared_expert_intermediate_size")?.unwrap_or(512);
    if shared == 0 {
        return Err(LoadError::invalid(f.path, "shared_expert_intermediate_size is 0"));
    }
    Ok(MoeConfig {
        num_experts,
        top_k,
        intermediate_size,
        norm_topk_prob: true,
        sparse_layers: vec![true; layers],
        experts_layout: ExpertsLayout::Fused,
        shared_expert_intermediate_size: Some(shared),
    })
}

/// The routed experts' sizes: what the routing kernel serves.
fn check_experts(path: &Path, num_experts: usize, top_k: usize, intermediate_size: usize) -> Result<(), LoadError> {
    // The routing kernel's limit.
    const MAX_EXPERTS: usize = 1024;
    if !(1..=MAX_EXPERTS).contains(&num_experts) {
        return Err(LoadError::unsupported(
            path,
            format!("num_experts {num_experts} (1 to {MAX_EXPERTS} are supported)"),
        ));
    }
    if !(1..=num_experts).contains(&top_k) {
        return Err(LoadError::invalid(
            path,
            format!("num_experts_per_tok {top_k} must be in 1..={num_experts} (num_experts)"),
        ));
    }
    if intermediate_size == 0 {
        return Err(LoadError::invalid(path, "moe_intermediate_size is 0"));
    }
    Ok(())
}

/// A `quantization_config` (at `where_` in the file) is refused: quantised weights are not
/// implemented.
fn reject_quantization(path: &Path, obj: &Map<String, Value>, where_: &str) -> Result<(), LoadError> {
    match obj.get("quantization_config").filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(q) => {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
            Err(LoadError::unsupported(
                path,
                format!(
                    "{where_}quantization_config (quant_method \"{method}\"): quantised checkpoints are not implemented"
                ),
            ))
        }
    }
}

/// Qwen3.5's `layer_types` (each `linear_attention` or `full_attention`), or, when absent, the
/// pattern of `full_attention_interval` (4 when absent): layer `i` is full attention iff
/// `(i + 1) % interval == 0`, as transformers derives it.
fn qwen35_layer_types(f: &Fields, layers: usize) -> Result<Vec<LayerType>, LoadError> {
    if let Some(v) = f.get("layer_types") {
        let list = v.as_array().filter(|a| a.iter().all(Value::is_string));
        let list = list.ok_or_else(|| LoadError::invalid(f.path, "layer_types is not a list of strings"))?;
        if list.len() != layers {
            return Err(LoadError::invalid(
                f.path,
                format!("layer_types has {} entries for {layers} layers", list.len()),
            ));
        }
        return list
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("full_attention") => Ok(LayerType::FullAttention),
                Some("linear_attention") => Ok(LayerType::LinearAttention),
                other => Err(LoadError::unsupported(
                    f.path,
                    format!(
                        "layer type \"{}\" of layer {i} (only \"linear_attention\" and \"full_attention\")",
                        other.unwrap_or_default()
                    ),
                )),
            })
            .collect();
    }
    let interval = f.usize("full_attention_interval")?.unwrap_or(4);
    if interval == 0 {
        return Err(LoadError::invalid(f.path, "full_attention_interval is 0"));
    }
    Ok((0..layers)
        .map(|i| if (i + 1) % interval == 0 { LayerType::FullAttention } else { LayerType::LinearAttention })
        .collect())
}

/// Qwen3.5's `partial_rotary_factor`, in `rope_parameters` (transformers 5) or at the top level
/// (older configs); 0.25 when absent. A factor in (0, 1].
fn partial_rotary_factor(f: &Fields) -> Result<f64, LoadError> {
    let nested = f.get("rope_parameters").and_then(Value::as_object).and_then(|p| p.get("partial_rotary_factor"));
    let (key, value) = match nested.filter(|v| !v.is_null()) {
        Some(v) => ("rope_parameters.partial_rotary_factor", Some(v)),
        None => ("partial_rotary_factor", f.get("partial_rotary_factor")),
    };
    let Some(value) = value else { return Ok(0.25) };
    match value.as_f64() {
        Some(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(LoadError::invalid(f.path, format!("{key} is not a number in (0, 1] (found {value})"))),
    }
}

/// The rotary embedding's base and scaling, as transformers 5 reads them: the parameters are
/// `rope_scaling` (the older key, which wins when both are set) or `rope_parameters`, with
/// `rope_theta` there or at the top level (10000 when absent). Types:
/// - `default` (or none given): unscaled;
/// - `linear`: every frequency divided by `factor`;
/// - `dynamic` (dynamic NTK): its frequencies only change for positions past
///   `max_position_embeddings`, which RUDA never computes, so within that range it is the
///   unscaled RoPE (`factor` is still checked);
/// - `yarn`: `factor` (when null, `max_position_embeddings / original_max_position_embeddings`),
///   `original_max_position_embeddings` (a top-level one first, then this one, else
///   `max_position_embeddings`), `attention_factor` (else from `mscale` and `mscale_all_dim`
///   when both are non-zero, else from `factor`), `beta_fast` (32) and `beta_slow` (1) where
///   absent, null or 0, `truncate` (true where absent).
///
/// Any other type (`llama3`, `longrope`, ...) and per-layer-type parameters are unsupported.
fn rope(f: &Fields, max_position_embeddings: Option<usize>) -> Result<(f64, RopeScaling), LoadError> {
    let nonempty = |key: &str| f.get(key).filter(|v| v.as_object().is_none_or(|o| !o.is_empty()));
    let Some((key, params)) = nonempty("rope_scaling")
        .map(|v| ("rope_scaling", v))
        .or_else(|| nonempty("rope_parameters").map(|v| ("rope_parameters", v)))
    else {
        return Ok((f.f64("rope_theta")?.unwrap_or(10000.0), RopeScaling::None));
    };
    let Some(params) = params.as_object() else {
        return Err(LoadError::invalid(f.path, format!("{key} is not an object")));
    };
    let field = |name: &str| params.get(name).filter(|v| !v.is_null());
    let number = |name: &str| -> Result<Option<f64>, LoadError> {
        field(name)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| LoadError::invalid(f.path, format!("{key}.{name} is not a number (found {v})")))
            })
            .transpose()
    };
    let theta = match number("rope_theta")? {
        Some(t) => t,
        None => f.f64("rope_theta")?.unwrap_or(10000.0),
    };
    let kind = match field("rope_type").or_else(|| field("type")) {
        None => "default",
        Some(v) => v
            .as_str()
            .ok_or_else(|| LoadError::invalid(f.path, format!("{key}.rope_type is not a string (found {v})")))?,
    };
    if kind == "default" {
        if let Some((layer_type, _)) = params.iter().find(|(_, v)| v.is_object()) {
            return Err(LoadError::unsupported(
                f.path,
                format!("{key} per layer type (\"{layer_type}\"): one rotary embedding for every layer is implemented"),
            ));
        }
    }
    let max_positions = max_position_embeddings.unwrap_or(DEFAULT_MAX_POSITION_EMBEDDINGS) as f64;
    let factor = |required: bool| -> Result<Option<f64>, LoadError> {
        match number("factor")? {
            Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
            Some(x) => Err(LoadError::invalid(f.path, format!("{key}.factor {x} is not a positive number"))),
            None if required => Err(LoadError::invalid(f.path, format!("{key} of rope_type \"{kind}\" has no factor"))),
            None => Ok(None),
        }
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "dynamic" => {
            factor(true)?;
            RopeScaling::None
        }
        "linear" => RopeScaling::Linear { factor: factor(true)?.unwrap_or(1.0) },
        "yarn" => {
            let original = match f.f64("original_max_position_embeddings")? {
                Some(x) => x,
                None => number("original_max_position_embeddings")?.unwrap_or(max_positions),
            };
            if !(original.is_finite() && original > 0.0) {
                return Err(LoadError::invalid(
                    f.path,
                    format!("{key}.original_max_position_embeddings {original} is not a positive number"),
                ));
            }
            let factor = factor(false)?.unwrap_or(max_positions / original);
            // Python's truthiness: a null or 0 counts as absent.
            let nonzero = |name: &str| -> Result<Option<f64>, LoadError> { Ok(number(name)?.filter(|&x| x != 0.0)) };
            let attention_factor = match (number("attention_factor")?, nonzero("mscale")?, nonzero("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) => YarnScaling::mscale(factor, m) / YarnScaling::mscale(factor, all),
                (None, _, _) => YarnScaling::mscale(factor, 1.0),
            };
            let truncate = match params.get("truncate") {
                None => true,
                Some(Value::Null) => false, // transformers' `if truncate:` on None
                Some(v) => v.as_bool().ok_or_else(|| {
                    LoadError::invalid(f.path, format!("{key}.truncate is not true or false (found {v})"))
                })?,
            };
            RopeScaling::Yarn(YarnScaling {
                factor,
                original_max_position_embeddings: original,
                beta_fast: nonzero("beta_fast")?.unwrap_or(32.0),
                beta_slow: nonzero("beta_slow")?.unwrap_or(1.0),
                attention_factor,
                truncate,
            })
        }
        other => {
            return Err(LoadError::unsupported(
                f.path,
                format!("{key} with rope_type \"{other}\" (default, linear, dynamic and yarn are implemented)"),
            ))
        }
    };
    if let Err(OpError::InvalidArgument { message, .. }) = scaling.validate() {
        return Err(LoadError::invalid(f.path, format!("{key}: {message}")));
    }
    Ok((theta, scaling))
}

/// Sliding-window attention is not implemented: reject any layer that would use it. Like
/// transformers, the window only applies when `use_sliding_window` is true, and then to the
/// layers `layer_types` marks `sliding_attention` (by default those from `max_window_layers` on).
fn reject_sliding_window(f: &Fields, layers: usize) -> Result<(), LoadError> {
    let layer_types: Option<Vec<&str>> = match f.obj.get("layer_types").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => {
            let list = v.as_array().filter(|a| a.iter().all(Value::is_string));
            let list = list.ok_or_else(|| LoadError::invalid(f.path, "layer_types is not a list of strings"))?;
            let names: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
            if names.len() != layers {
                return Err(LoadError::invalid(
                    f.path,
                    format!("layer_types has {} entries for {layers} layers", names.len()),
                ));
            }
            if let Some(bad) = names.iter().find(|t| !matches!(**t, "full_attention" | "sliding_attention")) {
                return Err(LoadError::unsupported(f.path, format!("layer type \"{bad}\" (only full_attention)")));
            }
            Some(names)
        }
    };
    let enabled =
        f.bool("use_sliding_window")?.unwrap_or(false) && f.obj.get("sliding_window").is_some_and(|v| !v.is_null());
    if !enabled {
        return Ok(());
    }
    let first_sliding = match layer_types {
        Some(types) => types.iter().position(|t| *t == "sliding_attention"),
        None => {
            let from = f.usize("max_window_layers")?.unwrap_or(28);
            (from < layers).then_some(from)
        }
    };
    match first_sliding {
        None => Ok(()),
        Some(layer) => Err(LoadError::unsupported(
            f.path,
            format!("use_sliding_window is true and layer {layer} uses sliding-window attention (not implemented)"),
        )),
    }
}

fn torch_dtype(f: &Fields) -> Result<Option<DType>, LoadError> {
    let name = match f.string("torch_dtype")? {
        Some(n) => Some(n),
        None => f.string("dtype")?,
    };
    Ok(match name {
        None => None,
        Some("bfloat16") => Some(DType::BF16),
        Some("float16") => Some(DType::F16),
        Some("float32") => Some(DType::F32),
        Some(other) => {
            return Err(LoadError::unsupported(
                f.path,
                format!("torch_dtype \"{other}\" (bfloat16, float16 or float32)"),
            ))
        }
    })
}

/// Typed access to the fields of a JSON object, with errors naming the file and the field.
/// A `null` field counts as absent, as in transformers.
struct Fields<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, what: &str) -> LoadError {
        LoadError::invalid(self.path, format!("{key} is not {what} (found {})", self.obj[key]))
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, LoadError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong(key, "a non-negative integer"))
            })
            .transpose()
    }

    fn required_usize(&self, key: &str) -> Result<usize, LoadError> {
        self.usize(key)?.ok_or_else(|| LoadError::invalid(self.path, format!("missing \"{key}\"")))
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, LoadError> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong(key, "a number"))).transpose()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, LoadError> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "true or false"))).transpose()
    }

    fn string(&self, key: &str) -> Result<Option<&str>, LoadError> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong(key, "a string"))).transpose()
    }
}

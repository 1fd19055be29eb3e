//! `config.json` of a Qwen2 / Qwen2.5 (`model_type: qwen2`) or Qwen3 (`qwen3`) checkpoint, read
//! into one typed [`ModelConfig`] with the defaults of transformers' `Qwen2Config` and
//! `Qwen3Config`. What RUDA does not implement (quantisation, rope scaling, sliding windows,
//! activations other than SiLU) is rejected here, so later stages never meet it.

use std::path::Path;

use ruda_runtime::DType;
use serde_json::{Map, Value};

use crate::error::{read_json, LoadError};

/// The architectures RUDA implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelType {
    /// Qwen2 and Qwen2.5: biases on the q/k/v projections, no q/k norms.
    Qwen2,
    /// Qwen3 (dense): RMS norms on q and k per head, explicit `head_dim`, no biases by default.
    Qwen3,
}

impl ModelType {
    /// The `model_type` string of `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Qwen2 => "qwen2",
            ModelType::Qwen3 => "qwen3",
        }
    }
}

/// The hyper-parameters of a dense Qwen decoder, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub model_type: ModelType,
    pub vocab_size: usize,
    pub hidden_size: usize,
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
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
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
    let obj = json.as_object().ok_or_else(|| LoadError::invalid(path, "the top level is not a JSON object"))?;
    let f = Fields { path, obj };

    let model_type = match obj.get("model_type").and_then(Value::as_str) {
        Some("qwen2") => ModelType::Qwen2,
        Some("qwen3") => ModelType::Qwen3,
        Some(other) => {
            return Err(LoadError::unsupported(
                path,
                format!("model_type \"{other}\" (only \"qwen2\" and \"qwen3\" are implemented)"),
            ))
        }
        None => return Err(LoadError::invalid(path, "no \"model_type\" string")),
    };

    if let Some(q) = obj.get("quantization_config").filter(|v| !v.is_null()) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
        return Err(LoadError::unsupported(
            path,
            format!("quantization_config (quant_method \"{method}\"): quantised checkpoints are not implemented"),
        ));
    }
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
        // transformers' Qwen3Config default.
        (None, ModelType::Qwen3) => 128,
        (None, ModelType::Qwen2) => {
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
        ModelType::Qwen3 => (attention_bias, attention_bias, true),
    };

    let config = ModelConfig {
        model_type,
        vocab_size: f.required_usize("vocab_size")?,
        hidden_size,
        intermediate_size: f.required_usize("intermediate_size")?,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rope_theta: rope_theta(&f)?,
        rms_norm_eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
        tie_word_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: f.usize("max_position_embeddings")?.unwrap_or(32768),
        qkv_bias,
        o_proj_bias,
        qk_norm,
        torch_dtype: torch_dtype(&f)?,
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
    reject_sliding_window(&f, num_hidden_layers)?;
    Ok(config)
}

/// `rope_theta` at the top level (transformers 4.x) or in `rope_parameters` (5.x); any rope
/// type but `default` in either `rope_scaling` or `rope_parameters` is unsupported.
fn rope_theta(f: &Fields) -> Result<f64, LoadError> {
    let mut theta = f.f64("rope_theta")?;
    for key in ["rope_scaling", "rope_parameters"] {
        let Some(params) = f.obj.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let Some(params) = params.as_object() else {
            return Err(LoadError::invalid(f.path, format!("{key} is not an object")));
        };
        let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(LoadError::unsupported(
                f.path,
                format!("{key} with rope_type \"{kind}\" (only unscaled rotary embeddings are implemented)"),
            ));
        }
        if let Some(t) = params.get("rope_theta") {
            theta = Some(
                t.as_f64().ok_or_else(|| LoadError::invalid(f.path, format!("{key}.rope_theta is not a number")))?,
            );
        }
    }
    Ok(theta.unwrap_or(10000.0))
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

//! One file per architecture, behind two traits: [`Architecture`] (what a config implies: its
//! tensors, its products' shapes for tuning, and loading) and [`CausalLm`] (a loaded model:
//! caches, prefill, decode steps). [`architecture`] is the one `model_type` → architecture
//! table that the pipeline, the examples, `ruda-llm` and tuning use.
//!
//! Adding an architecture is a file here whose [`Architecture::spec`] composes the shared
//! layers into a [`DecoderSpec`], and one line in [`architecture`] (with its `model_type` in
//! `config.rs`).

mod batched;
mod decoder;
mod qwen2;
mod qwen3;
mod qwen35;
mod qwen3_moe;

pub use batched::{decode_bucket, BatchCache, Qwen35BatchCache};
pub use decoder::{DecoderSpec, LayerSpec, Workspace};

use ruda_runtime::{DType, Device, PagedAttentionMode, Tensor};

use crate::batch::{PagedKvCacheConfig, ScheduledBatch};
use crate::cache::Cache;
use crate::config::{ModelConfig, ModelType};
use crate::error::LlmError;
use crate::layers::{AttentionShape, ExpectedTensor, LinearShape, TensorSource};

/// The architecture of `model_type`: the table.
pub fn architecture(model_type: ModelType) -> &'static dyn Architecture {
    match model_type {
        ModelType::Qwen2 => &qwen2::Qwen2,
        ModelType::Qwen3 => &qwen3::Qwen3,
        ModelType::Qwen35 => &qwen35::Qwen35(ModelType::Qwen35),
        ModelType::Qwen3Moe => &qwen3_moe::Qwen3Moe,
        ModelType::Qwen35Moe => &qwen35::Qwen35(ModelType::Qwen35Moe),
    }
}

/// An architecture: how a config becomes a decoder. Only [`Architecture::spec`] is its own;
/// the rest reads that spec.
pub trait Architecture: Sync {
    fn model_type(&self) -> ModelType;

    /// The layers `config` implies, with every tensor's name, shape and dtype.
    fn spec(&self, config: &ModelConfig) -> DecoderSpec;

    /// Every tensor a checkpoint of `config` holds (what loading validates against).
    fn tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor> {
        self.spec(config).tensors()
    }

    /// The distinct products of a forward over `tokens` rows (what tuning measures).
    fn linear_shapes(&self, config: &ModelConfig, tokens: usize) -> Vec<LinearShape> {
        self.spec(config).linear_shapes(tokens)
    }

    /// The distinct shapes of the attention layers (decode attention is tuned for each).
    fn attention_shapes(&self, config: &ModelConfig) -> Vec<AttentionShape> {
        self.spec(config).attention_shapes()
    }

    /// Upload the model from `weights` (validated against [`Architecture::tensors`]) to
    /// `device` in `dtype` (f32, f16 or bf16).
    fn load(
        &self,
        config: &ModelConfig,
        weights: &dyn TensorSource,
        device: &Device,
        dtype: DType,
    ) -> Result<Box<dyn CausalLm>, LlmError> {
        Ok(Box::new(self.spec(config).load(weights, device, dtype)?))
    }
}

/// A loaded causal language model on one device.
pub trait CausalLm: Send + Sync {
    fn config(&self) -> &ModelConfig;

    fn device(&self) -> &Device;

    /// The compute dtype.
    fn dtype(&self) -> DType;

    /// Parameters in the checkpoint (a tied `lm_head` counted once).
    fn parameters(&self) -> usize;

    /// The distinct products of a forward over `tokens` rows.
    fn linear_shapes(&self, tokens: usize) -> Vec<LinearShape>;

    /// An empty cache for up to `capacity` positions (at most `max_position_embeddings`).
    fn new_cache_with_capacity(&self, capacity: usize) -> Result<Cache, LlmError>;

    /// An empty cache for the manual path ([`CausalLm::forward_cached_last`]): room for
    /// [`DEFAULT_CONTEXT`](crate::pipeline::DEFAULT_CONTEXT) positions, or
    /// `max_position_embeddings` if fewer (a full cache is an error that says so; take
    /// [`CausalLm::new_cache_with_capacity`] for more).
    fn new_cache(&self) -> Result<Cache, LlmError> {
        self.new_cache_with_capacity(crate::pipeline::DEFAULT_CONTEXT.min(self.config().max_position_embeddings))
    }

    /// Run `ids` at positions `cache.len()..` (appending them to the cache) and return the
    /// logits `[rows, vocab]` in the compute dtype: of the last token only, or of every token
    /// with `all_logits`. Long inputs run in chunks of `chunk` tokens.
    fn forward(&self, cache: &mut Cache, ids: &[u32], chunk: usize, all_logits: bool) -> Result<Tensor, LlmError>;

    /// The manual path: run `tokens` at positions `cache.len()..` (the prompt first, then only
    /// the new tokens) and return the last position's logits, f32 `[vocab]`. Prefill runs in
    /// chunks of 512 tokens, as the pipeline's default.
    fn forward_cached_last(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor, LlmError> {
        let logits = self.forward(cache, tokens, 512, false)?;
        let logits = logits.reshape(&[self.config().vocab_size])?;
        match logits.dtype() {
            DType::F32 => Ok(logits),
            _ => ruda_ops::api::cast(&logits, DType::F32).map_err(|e| LlmError::op("the logits to f32", e)),
        }
    }

    /// The buffers of [`CausalLm::decode_step`], made once per generation: on a GPU the first
    /// ones for a model measure the decode GEMVs' split counts.
    fn decode_workspace(&self) -> Result<Workspace, LlmError>;

    /// One decode step: the logits `[1, vocab]` after appending `id`, in `workspace`'s buffer
    /// (valid until the next step). Allocates nothing and waits for nothing (except in Qwen3.5's
    /// gated attention and gated DeltaNet layers, which allocate their intermediates for now):
    /// [`CausalLm::write_decode_inputs`], then [`CausalLm::run_decode_step`] launching.
    fn decode_step(&self, cache: &mut Cache, id: u32, workspace: &Workspace) -> Result<Tensor, LlmError>;

    /// The host half of a decode step: write `id` and its position (the cache's length) into
    /// `workspace`'s input buffers, launching nothing. What precedes each replay of a captured
    /// step, since a graph reads its inputs from those buffers when it runs.
    fn write_decode_inputs(&self, cache: &Cache, id: u32, workspace: &Workspace) -> Result<(), LlmError>;

    /// The device half of a decode step, over the inputs [`CausalLm::write_decode_inputs`]
    /// wrote, on the device's default stream; the cache then holds one more position and the
    /// logits are in `workspace`'s buffer. Launching (dense models) copies nothing from the host,
    /// allocates nothing and waits for nothing, so it can run under
    /// [`ruda_runtime::Stream::begin_capture`]: the capture runs no kernel but still counts
    /// the position, so launch the graph once to compute that step, then replay it with
    /// [`DecodeKernels::Replay`] for the next ones (the graph fits this cache and workspace).
    fn run_decode_step(
        &self,
        cache: &mut Cache,
        workspace: &Workspace,
        kernels: DecodeKernels<'_>,
    ) -> Result<Tensor, LlmError>;

    /// An empty cache for batched generation ([`CausalLm::forward_batch`]) over a paged KV pool
    /// of `kv.num_pages` pages of `kv.block_size` positions and up to `max_active` sequences
    /// at once, attention reading the pages as `RUDA_PAGED_ATTENTION` says now (`legacy`
    /// when unset, `fused`; anything else is an error). Changing the variable later does not
    /// switch this cache.
    fn new_batch_cache(&self, kv: PagedKvCacheConfig, max_active: usize) -> Result<BatchCache, LlmError> {
        self.new_batch_cache_with(kv, max_active, ruda_runtime::paged_attention_mode()?)
    }

    /// [`CausalLm::new_batch_cache`] with the attention path given rather than read from the
    /// environment.
    fn new_batch_cache_with(
        &self,
        kv: PagedKvCacheConfig,
        max_active: usize,
        mode: PagedAttentionMode,
    ) -> Result<BatchCache, LlmError>;

    /// Run a scheduler's batch through the model: each row's tokens at its positions, keys and
    /// values appended at its block table's pages, linear-attention states continued in its
    /// slot (reset when it starts at position 0). Returns the logits `[rows, vocab]` of each
    /// row's last token in the compute dtype, in a buffer of `cache` valid until its next
    /// batch. A bad batch is an error that changes nothing; a failure while running leaves the
    /// cache unusable (every later call says so: make a new one).
    fn forward_batch(&self, batch: &ScheduledBatch, cache: &mut BatchCache) -> Result<Tensor, LlmError>;
}

/// How [`CausalLm::run_decode_step`] runs the step's kernels.
#[derive(Clone, Copy, Debug)]
pub enum DecodeKernels<'a> {
    /// Launch them one by one (what a capture records).
    Launch,
    /// Replay a graph captured from [`DecodeKernels::Launch`] with the same cache and workspace.
    Replay(&'a ruda_runtime::Graph),
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::config::parse_config;
    use crate::layers::WeightDType;

    /// A two-layer config of `model_type` with GQA 2:1 and head_dim 16 (not hidden / heads for
    /// qwen3).
    fn config(model_type: &str, extra: serde_json::Value) -> ModelConfig {
        let mut j = json!({
            "model_type": model_type, "vocab_size": 40, "hidden_size": 24, "intermediate_size": 20,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "tie_word_embeddings": false,
        });
        j.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parse_config(Path::new("config.json"), &j).unwrap()
    }

    #[test]
    fn every_model_type_has_its_own_architecture() {
        for t in [ModelType::Qwen2, ModelType::Qwen3, ModelType::Qwen35, ModelType::Qwen3Moe, ModelType::Qwen35Moe] {
            assert_eq!(architecture(t).model_type(), t);
        }
    }

    /// transformers' Qwen3.5 defaults: full attention every 4th layer, a quarter of the head
    /// rotated, head_dim 256, the `linear_*` shapes of `Qwen3_5TextConfig`.
    #[test]
    fn qwen35_configs_take_transformers_defaults() {
        use crate::config::{LayerType, LinearAttentionConfig};
        let c = config("qwen3_5_text", json!({"num_hidden_layers": 8, "head_dim": null}));
        let (l, f) = (LayerType::LinearAttention, LayerType::FullAttention);
        assert_eq!(c.layer_types, [l, l, l, f, l, l, l, f]);
        assert_eq!((c.head_dim, c.rotary_dim), (256, 64));
        assert_eq!(c.linear_attention, Some(LinearAttentionConfig::QWEN35_DEFAULTS));
        assert_eq!(c.text_prefix, "model.");
        let c = config("qwen3_5_text", json!({"full_attention_interval": 1, "partial_rotary_factor": 0.5}));
        assert_eq!((c.layer_types.as_slice(), c.rotary_dim), ([f, f].as_slice(), 8));
        let c = config("qwen3_5_text", json!({"layer_types": ["full_attention", "linear_attention"]}));
        assert_eq!(c.layer_types, [f, l]);
        // Qwen2/3 layers are all full attention, rotated whole.
        let c = config("qwen3", json!({}));
        assert_eq!((c.layer_types.as_slice(), c.rotary_dim), ([f, f].as_slice(), 16));
    }

    /// The composite `qwen3_5` is its `text_config`, with the text tensors under
    /// `model.language_model.`, `lm_head.weight` at the top level, and the vision tower and MTP
    /// head ignored.
    #[test]
    fn the_composite_qwen35_is_its_text_config_under_its_prefix() {
        let text = json!({
            "vocab_size": 40, "hidden_size": 24, "intermediate_size": 20, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
            "layer_types": ["linear_attention", "full_attention"], "tie_word_embeddings": true,
        });
        let j =
            json!({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": false, "dtype": "bfloat16"});
        let c = parse_config(Path::new("config.json"), &j).unwrap();
        assert_eq!(
            (c.model_type, c.text_prefix, c.tie_word_embeddings),
            (ModelType::Qwen35, "model.language_model.", false)
        );
        // transformers ties a composite model by its own field only (false when absent).
        let mut other = j.clone();
        other.as_object_mut().unwrap().remove("tie_word_embeddings");
        assert!(!parse_config(Path::new("config.json"), &other).unwrap().tie_word_embeddings);
        other["tie_word_embeddings"] = true.into();
        other["text_config"]["tie_word_embeddings"] = false.into();
        assert!(parse_config(Path::new("config.json"), &other).unwrap().tie_word_embeddings);
        assert_eq!(c.torch_dtype, Some(DType::BF16));
        assert!(ModelType::Qwen35.accepts("qwen3_5") && ModelType::Qwen35.accepts("qwen3_5_text"));
        let tensors = architecture(c.model_type).tensors(&c);
        let shape = |name: &str| tensors.iter().find(|t| t.name == name).map(|t| t.shape.clone());
        let p = "model.language_model.";
        assert_eq!(shape(&format!("{p}embed_tokens.weight")), Some(vec![40, 24]));
        assert_eq!(shape("lm_head.weight"), Some(vec![40, 24]));
        // in_proj_qkv: q and k of 2 × 8, v of 4 × 12; the conv over the same 80 channels.
        assert_eq!(shape(&format!("{p}layers.0.linear_attn.in_proj_qkv.weight")), Some(vec![80, 24]));
        assert_eq!(shape(&format!("{p}layers.0.linear_attn.conv1d.weight")), Some(vec![80, 1, 4]));
        assert_eq!(shape(&format!("{p}layers.0.linear_attn.norm.weight")), Some(vec![12]));
        // q_proj makes the query and the gate.
        assert_eq!(shape(&format!("{p}layers.1.self_attn.q_proj.weight")), Some(vec![2 * 4 * 16, 24]));
        assert_eq!(shape(&format!("{p}norm.weight")), Some(vec![24]));
        assert!(tensors.iter().all(|t| t.name.starts_with(p) || t.name == "lm_head.weight"));
        assert!(c.ignores_tensor("model.visual.blocks.0.attn.qkv.weight") && c.ignores_tensor("mtp.fc.weight"));
        assert!(!c.ignores_tensor(&format!("{p}norm.weight")));
        assert!(!config("qwen3", json!({})).ignores_tensor("mtp.fc.weight"));
    }

    #[test]
    fn tuning_shapes_are_the_declared_weights() {
        for c in [config("qwen2", json!({})), config("qwen3", json!({"attention_bias": true}))] {
            let arch = architecture(c.model_type);
            let tensors = arch.tensors(&c);
            let shape = |name: &str| tensors.iter().find(|t| t.name == name).map(|t| (t.shape[0], t.shape[1]));
            let nk = |s: &LinearShape| (s.n, s.k);
            let shapes = arch.linear_shapes(&c, 7);
            let by_name = |n: &str| shapes.iter().find(|s| s.name == n).copied().unwrap();
            let p = "model.layers.1";
            assert_eq!(Some(nk(&by_name("q_proj"))), shape(&format!("{p}.self_attn.q_proj.weight")));
            assert_eq!(Some(nk(&by_name("o_proj"))), shape(&format!("{p}.self_attn.o_proj.weight")));
            assert_eq!(Some(nk(&by_name("down_proj"))), shape(&format!("{p}.mlp.down_proj.weight")));
            let (gate, up) = (shape(&format!("{p}.mlp.gate_proj.weight")), shape(&format!("{p}.mlp.up_proj.weight")));
            assert_eq!(nk(&by_name("gate_up_proj")), (gate.unwrap().0 + up.unwrap().0, gate.unwrap().1));
            assert_eq!(by_name("q_proj").m, 7);
            assert_eq!((by_name("lm_head").m, nk(&by_name("lm_head"))), (1, shape("lm_head.weight").unwrap()));
            // Each projection once for both layers, then lm_head.
            assert_eq!(shapes.len(), 7, "{shapes:?}");
            assert_eq!(arch.attention_shapes(&c), [AttentionShape { q_heads: 4, kv_heads: 2, head_dim: 16 }]);
            for t in &tensors {
                let norm = t.name.ends_with("norm.weight");
                assert_eq!(t.dtype, if norm { WeightDType::F32 } else { WeightDType::Compute }, "{}", t.name);
            }
        }
    }

    #[test]
    fn decode_plans_follow_the_devices_split_choices() {
        use crate::layers::DecodeChoices;
        let c = config("qwen2", json!({"hidden_size": 4096, "max_position_embeddings": 64}));
        let spec = architecture(c.model_type).spec(&c);
        let kernels = |choices: &DecodeChoices| -> Vec<(String, String)> {
            let plan = spec.decode_launches_with(9, DType::BF16, choices).unwrap();
            plan.into_iter().map(|l| (l.op, l.kernel)).collect()
        };
        let plain = kernels(&DecodeChoices::default());
        let q = ("model.layers.0.self_attn.q_proj".to_string(), "gemv.bf16.m1.bias".to_string());
        assert_eq!(plain[2], q);
        // q_proj [64, 4096] in 4 splits of 128 16-byte chunks, its bias added by the reduction;
        // 64 asked give 16, as no split has less than a warp's 32 chunks.
        for (asked, splits) in [(4, 4), (64, 16)] {
            let choices = DecodeChoices { gemv_splits: [((64, 4096), asked)].into(), ..Default::default() };
            let plan = spec.decode_launches_with(9, DType::BF16, &choices).unwrap();
            assert_eq!(
                (plan[2].kernel.as_str(), plan[3].kernel.as_str()),
                ("gemv.bf16.m1.splitk", "gemv.bf16.splitk_reduce.bias")
            );
            assert_eq!(plan[2].bytes_written, splits * 64 * 4, "f32 partials");
            assert_eq!((plan[3].bytes_read, plan[3].weight_bytes), (splits * 64 * 4 + 64 * 2, 64 * 2));
            assert_eq!(plan[2].weight_bytes, 64 * 4096 * 2);
            assert_eq!(plan.len(), plain.len() + 2, "a reduction in each of the 2 layers");
        }
        // The pick over 40 columns in 3 splits; decode attention in 2.
        let choices = DecodeChoices { argmax_splits: Some(3), attention_splits: Some(2), ..Default::default() };
        let plan = spec.decode_launches_with(9, DType::BF16, &choices).unwrap();
        let tail: Vec<&str> = plan[plan.len() - 2..].iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(tail, ["argmax.bf16.partial", "argmax.u64.reduce"]);
        let combine = plan.iter().find(|l| l.kernel == "attention_decode_combine.bf16.d16").unwrap();
        assert_eq!(combine.bytes_read, 2 * 4 * (16 + 2) * 4, "2 splits × 4 heads × (16 + max, sum) f32");
        let attention = plan.iter().find(|l| l.kernel == "attention_decode.bf16.d16").unwrap();
        assert_eq!(attention.kv_bytes, 2 * 2 * 9 * 16 * 2, "K and V of 2 heads × 9 keys × 16");
        for bad in [0, 65] {
            let err = spec.decode_launches(bad, DType::BF16).unwrap_err().to_string();
            assert!(err.contains(&format!("a context of {bad} positions")) && err.contains("1 to 64"), "{err}");
        }
        assert!(spec.decode_launches(9, DType::U32).is_err());
    }

    /// Every tensor a spec declares, as zeros stored in bf16.
    struct Zeros(Vec<(String, Vec<usize>, Vec<u8>)>);

    impl Zeros {
        fn new(spec: &DecoderSpec) -> Zeros {
            let zeros =
                |t: &ExpectedTensor| (t.name.clone(), t.shape.clone(), vec![0; 2 * t.shape.iter().product::<usize>()]);
            Zeros(spec.tensors().iter().map(zeros).collect())
        }
    }

    impl TensorSource for Zeros {
        fn stored(&self, name: &str) -> Option<(DType, &[usize], &[u8])> {
            self.0.iter().find(|t| t.0 == name).map(|t| (DType::BF16, t.1.as_slice(), t.2.as_slice()))
        }
        fn check(&self, _: &str) -> Result<(), crate::LoadError> {
            Ok(())
        }
    }

    /// Odd shapes the fixtures lack: an intermediate size of 20 (bf16 GEMV rows that are not a
    /// whole number of 16-byte loads), a 48-byte embedding row, head dim 6 (qwen2: 24 / 4).
    #[test]
    fn a_decode_step_of_odd_shapes_launches_its_plan() {
        use ruda_ops::api;
        let device = Device::cpu();
        for c in [config("qwen2", json!({})), config("qwen3", json!({"attention_bias": true}))] {
            let spec = architecture(c.model_type).spec(&c);
            let model = architecture(c.model_type).load(&c, &Zeros::new(&spec), &device, DType::BF16).unwrap();
            let mut cache = model.new_cache_with_capacity(3).unwrap();
            model.forward(&mut cache, &[1, 2], 8, false).unwrap();
            let workspace = model.decode_workspace().unwrap();
            let stream = device.default_stream();
            stream.start_launch_record();
            let logits = model.decode_step(&mut cache, 3, &workspace).unwrap();
            let chosen = Tensor::zeros(&device, DType::U32, &[1]).unwrap();
            api::argmax_into(&stream, &logits, &chosen, None).unwrap();
            let launched: Vec<String> = stream.take_launch_record().into_iter().map(|l| l.kernel).collect();
            let planned: Vec<String> =
                spec.decode_launches(3, DType::BF16).unwrap().iter().map(|l| l.kernel_name()).collect();
            assert_eq!(launched, planned, "{:?}", c.model_type);
            assert!(planned.contains(&"gemv_bf16_m1_scalar".to_string()), "{planned:?}");
        }
    }

    /// A source that holds nothing: loading must fail before it reads a tensor.
    struct NoTensors;

    impl TensorSource for NoTensors {
        fn stored(&self, _: &str) -> Option<(DType, &[usize], &[u8])> {
            None
        }
        fn check(&self, _: &str) -> Result<(), crate::LoadError> {
            Ok(())
        }
    }

    #[test]
    fn a_model_no_attention_kernel_serves_is_refused_at_load_naming_the_shape() {
        // Even (so the config passes) but above the kernels' 1024.
        let c = config("qwen3", json!({"head_dim": 1026}));
        let err = match architecture(c.model_type).load(&c, &NoTensors, &Device::cpu(), DType::F32) {
            Ok(_) => panic!("head dim 1026 loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("head dim 1026") && err.contains("4 query heads"), "{err}");
    }

    #[test]
    fn attention_variants_are_values_of_the_architecture() {
        let names = |c: &ModelConfig| -> Vec<String> {
            architecture(c.model_type)
                .tensors(c)
                .into_iter()
                .filter(|t| t.name.starts_with("model.layers.0.self_attn.") && !t.name.ends_with("_proj.weight"))
                .map(|t| t.name["model.layers.0.self_attn.".len()..].to_string())
                .collect()
        };
        assert_eq!(names(&config("qwen2", json!({}))), ["q_proj.bias", "k_proj.bias", "v_proj.bias"]);
        assert_eq!(names(&config("qwen3", json!({}))), ["q_norm.weight", "k_norm.weight"]);
        assert_eq!(
            names(&config("qwen3", json!({"attention_bias": true}))),
            ["q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias", "q_norm.weight", "k_norm.weight"]
        );
    }
}

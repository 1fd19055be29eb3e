//! config.json, safetensors and generation_config.json loading, on small synthetic model
//! folders written into a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ruda_llm::{
    architecture, expected_tensors, load_config, GenerationConfig, LoadError, ModelConfig, ModelType, Weights,
    EMBED_TOKENS, LM_HEAD,
};
use ruda_runtime::{DType, Device};
use serde_json::{json, Value};

/// A fresh folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        // Tests run in parallel: each folder gets its own number.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ruda-llm-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.join(name), bytes).unwrap();
    }
    fn write_json(&self, name: &str, v: &Value) {
        self.write(name, serde_json::to_string_pretty(v).unwrap().as_bytes());
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny Qwen3 config: 2 layers, GQA 2:1, head_dim 4 (not hidden / heads), tied embeddings.
fn qwen3_json() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 16,
        "hidden_size": 6, "intermediate_size": 10, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
        "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": false,
        "use_sliding_window": false, "sliding_window": null, "max_window_layers": 2,
        "torch_dtype": "bfloat16", "eos_token_id": 15, "bos_token_id": 14
    })
}

/// A tiny Qwen2.5 config as transformers 4.x writes it (sliding window present but disabled).
fn qwen2_json() -> Value {
    json!({
        "model_type": "qwen2", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
        "max_position_embeddings": 32768, "use_sliding_window": false, "sliding_window": 32768,
        "max_window_layers": 0, "rope_scaling": null, "torch_dtype": "float32"
    })
}

fn config_of(v: &Value) -> Result<ModelConfig, LoadError> {
    let dir = TempDir::new("cfg");
    dir.write_json("config.json", v);
    load_config(dir.path())
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn err_of(v: &Value) -> String {
    config_of(v).unwrap_err().to_string()
}

#[test]
fn qwen3_config() {
    let c = config_of(&qwen3_json()).unwrap();
    assert_eq!(c.model_type, ModelType::Qwen3);
    assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers), (16, 6, 10, 2));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.gqa_group()), (2, 1, 4, 2));
    assert_eq!((c.rope_theta, c.rms_norm_eps, c.max_position_embeddings), (1e6, 1e-6, 40960));
    assert!(c.tie_word_embeddings && c.qk_norm && !c.qkv_bias && !c.o_proj_bias);
    assert_eq!(c.torch_dtype, Some(DType::BF16));
    // attention_bias puts biases on all four projections.
    let c = config_of(&with(qwen3_json(), "attention_bias", json!(true))).unwrap();
    assert!(c.qkv_bias && c.o_proj_bias);
}

#[test]
fn qwen2_config_and_defaults() {
    let c = config_of(&qwen2_json()).unwrap();
    assert_eq!(c.model_type, ModelType::Qwen2);
    assert_eq!(c.head_dim, 2, "qwen2 head_dim is hidden / heads");
    assert!(c.qkv_bias && !c.o_proj_bias && !c.qk_norm && !c.tie_word_embeddings);
    // Defaults of Qwen2Config when fields are absent.
    let mut v = qwen2_json();
    for key in [
        "num_key_value_heads",
        "rope_theta",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
        "torch_dtype",
    ] {
        v.as_object_mut().unwrap().remove(key);
    }
    let c = config_of(&v).unwrap();
    assert_eq!((c.num_key_value_heads, c.rope_theta, c.rms_norm_eps), (4, 10000.0, 1e-6));
    assert_eq!((c.tie_word_embeddings, c.max_position_embeddings, c.torch_dtype), (false, 32768, None));
}

#[test]
fn rope_theta_in_rope_parameters() {
    let mut v = qwen3_json();
    v.as_object_mut().unwrap().remove("rope_theta");
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5000000.0});
    assert_eq!(config_of(&v).unwrap().rope_theta, 5e6);
    v["rope_parameters"] = json!({"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e6});
    assert!(err_of(&v).contains("rope_parameters with rope_type \"longrope\""), "{}", err_of(&v));
}

#[test]
fn rejected_configs_name_the_problem() {
    let cases: Vec<(Value, &str)> = vec![
        (with(qwen3_json(), "model_type", json!("llama")), "model_type \"llama\""),
        (with(qwen3_json(), "quantization_config", json!({"quant_method": "awq", "bits": 4})), "quant_method \"awq\""),
        (
            with(qwen2_json(), "rope_scaling", json!({"type": "llama3", "factor": 8.0})),
            "rope_scaling with rope_type \"llama3\"",
        ),
        (with(qwen2_json(), "use_sliding_window", json!(true)), "layer 0 uses sliding-window"),
        (
            with(with(qwen3_json(), "use_sliding_window", json!(true)), "sliding_window", json!(4096))
                .as_object()
                .cloned()
                .map(|mut o| {
                    o.insert("layer_types".into(), json!(["full_attention", "sliding_attention"]));
                    Value::Object(o)
                })
                .unwrap(),
            "layer 1 uses sliding-window",
        ),
        (with(qwen3_json(), "layer_types", json!(["full_attention"])), "layer_types has 1 entries for 2 layers"),
        (with(qwen3_json(), "hidden_act", json!("gelu")), "hidden_act \"gelu\""),
        (with(qwen3_json(), "num_key_value_heads", json!(3)), "not a multiple of num_key_value_heads 3"),
        (with(qwen3_json(), "hidden_size", json!(-1)), "hidden_size is not a non-negative integer"),
        (with(qwen3_json(), "vocab_size", Value::Null), "missing \"vocab_size\""),
        (with(qwen3_json(), "torch_dtype", json!("int8")), "torch_dtype \"int8\""),
        (with(qwen2_json(), "hidden_size", json!(10)), "not a multiple of num_attention_heads"),
    ];
    for (v, want) in cases {
        let e = err_of(&v);
        assert!(e.contains(want) && e.contains("config.json"), "expected {want:?} in: {e}");
    }
    // Sliding window configured but disabled, with layers marked sliding: accepted (transformers
    // ignores the window then).
    let v = with(qwen3_json(), "layer_types", json!(["full_attention", "sliding_attention"]));
    assert!(config_of(&v).is_ok());
    let dir = TempDir::new("nocfg");
    assert!(matches!(load_config(dir.path()), Err(LoadError::Io { .. })));
    dir.write("config.json", b"{ not json");
    assert!(matches!(load_config(dir.path()), Err(LoadError::Json { .. })));
}

/// A safetensors file: header JSON (padded to 8 bytes as the Python writer does) + data.
fn safetensors(tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_string(&header).unwrap().into_bytes();
    while h.len() & 7 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// Every tensor `config` needs as f32, tensor `k` filled with `k + index / 1000`.
fn model_tensors(config: &ModelConfig, with_lm_head: bool) -> Vec<(String, &'static str, Vec<usize>, Vec<u8>)> {
    expected_tensors(config)
        .into_iter()
        .filter(|e| e.required || with_lm_head)
        .enumerate()
        .map(|(k, e)| {
            let n: usize = e.shape.iter().product();
            let bytes = (0..n).flat_map(|i| (k as f32 + i as f32 / 1000.0).to_le_bytes()).collect();
            (e.name, "F32", e.shape, bytes)
        })
        .collect()
}

fn weights_err(dir: &TempDir, config: &ModelConfig) -> String {
    match Weights::load(dir.path(), config) {
        Ok(_) => panic!("loading succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn expected_tensor_names_and_shapes() {
    let q3 = config_of(&qwen3_json()).unwrap();
    let names: Vec<String> =
        expected_tensors(&q3).into_iter().filter(|e| e.name.starts_with("model.layers.1.")).map(|e| e.name).collect();
    let want: Vec<String> = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    .iter()
    .map(|s| format!("model.layers.1.{s}"))
    .collect();
    assert_eq!(names, want);
    let all = expected_tensors(&q3);
    let shape = |n: &str| all.iter().find(|e| e.name == n).unwrap().shape.clone();
    assert_eq!(shape("model.layers.0.self_attn.q_proj.weight"), vec![8, 6]);
    assert_eq!(shape("model.layers.0.self_attn.k_proj.weight"), vec![4, 6]);
    assert_eq!(shape("model.layers.0.self_attn.o_proj.weight"), vec![6, 8]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), vec![6, 10]);
    assert!(!all.iter().find(|e| e.name == LM_HEAD).unwrap().required);
    let q2 = config_of(&qwen2_json()).unwrap();
    let all = expected_tensors(&q2);
    assert!(all.iter().any(|e| e.name == "model.layers.0.self_attn.k_proj.bias" && e.shape == vec![4]));
    assert!(all.iter().find(|e| e.name == LM_HEAD).unwrap().required);
}

#[test]
fn single_file_tied_upload() {
    let config = config_of(&qwen3_json()).unwrap();
    let dir = TempDir::new("single");
    let tensors = model_tensors(&config, false);
    dir.write("model.safetensors", &safetensors(&tensors));
    let w = Weights::load(dir.path(), &config).unwrap();
    assert_eq!(w.tensors().len(), tensors.len());
    assert!(w.lm_head_is_embedding() && w.get(LM_HEAD).is_none());
    let norm = w.get("model.norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.shape.clone()), (DType::F32, vec![6]));
    let uploaded = w.upload(&Device::cpu()).unwrap();
    assert_eq!(uploaded.len(), tensors.len() + 1);
    for (k, (name, _, shape, _)) in tensors.iter().enumerate() {
        let t = &uploaded[name];
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
        let v = t.to_vec::<f32>().unwrap();
        assert_eq!(v[1], k as f32 + 0.001, "{name}");
    }
    assert!(
        uploaded[LM_HEAD].buffer().same_memory(uploaded[EMBED_TOKENS].buffer()),
        "tied lm_head reuses the embedding"
    );
}

#[test]
fn sharded_untied_with_bf16() {
    let config = config_of(&qwen2_json()).unwrap();
    let dir = TempDir::new("sharded");
    let mut tensors = model_tensors(&config, true);
    // One bf16 tensor: dtypes may differ between tensors.
    let norm = tensors.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
    norm.1 = "BF16";
    norm.3 = (0..8u16).flat_map(|i| (0x3f80u16 + i).to_le_bytes()).collect();
    let (a, b) = tensors.split_at(5);
    dir.write("model-00001-of-00002.safetensors", &safetensors(a));
    dir.write("model-00002-of-00002.safetensors", &safetensors(b));
    let map: serde_json::Map<String, Value> = a
        .iter()
        .map(|t| (t.0.clone(), json!("model-00001-of-00002.safetensors")))
        .chain(b.iter().map(|t| (t.0.clone(), json!("model-00002-of-00002.safetensors"))))
        .collect();
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    dir.write_json("model.safetensors.index.json", &index);
    let w = Weights::load(dir.path(), &config).unwrap();
    assert_eq!(w.files().len(), 2);
    assert_eq!(w.get(LM_HEAD).unwrap().file, 1);
    assert_eq!(w.get("model.norm.weight").unwrap().dtype, DType::BF16);
    let up = w.upload(&Device::cpu()).unwrap();
    assert_eq!(up.len(), tensors.len());
    assert_eq!(up["model.norm.weight"].to_f32_vec().unwrap()[..2], [1.0, 1.0078125]);
    assert!(!up[LM_HEAD].buffer().same_memory(up[EMBED_TOKENS].buffer()));

    // The index and the shards must agree.
    let mut moved = index.clone();
    moved["weight_map"][LM_HEAD] = json!("model-00001-of-00002.safetensors");
    dir.write_json("model.safetensors.index.json", &moved);
    let e = weights_err(&dir, &config);
    assert!(e.contains("holds tensor lm_head.weight, which the index places in model-00001"), "{e}");
    let mut ghost = index.clone();
    ghost["weight_map"]["model.ghost.weight"] = json!("model-00001-of-00002.safetensors");
    dir.write_json("model.safetensors.index.json", &ghost);
    let e = weights_err(&dir, &config);
    assert!(
        e.contains("lists tensor model.ghost.weight in model-00001-of-00002.safetensors, which does not hold it"),
        "{e}"
    );
    let mut escape = index.clone();
    escape["weight_map"][LM_HEAD] = json!("../x.safetensors");
    dir.write_json("model.safetensors.index.json", &escape);
    assert!(weights_err(&dir, &config).contains("is not a plain file name"));
    let mut missing_shard = index;
    missing_shard["weight_map"][LM_HEAD] = json!("model-00003-of-00002.safetensors");
    dir.write_json("model.safetensors.index.json", &missing_shard);
    assert!(weights_err(&dir, &config).contains("model-00003-of-00002.safetensors"));
}

#[test]
fn missing_extra_and_misshapen_tensors() {
    let config = config_of(&qwen2_json()).unwrap();
    let dir = TempDir::new("bad-tensors");
    let good = model_tensors(&config, true);

    let missing: Vec<_> = good.iter().filter(|t| t.0 != "model.layers.0.self_attn.v_proj.bias").cloned().collect();
    dir.write("model.safetensors", &safetensors(&missing));
    let e = weights_err(&dir, &config);
    assert!(e.contains("1 missing tensor(s) for this qwen2 config: model.layers.0.self_attn.v_proj.bias"), "{e}");

    // Tied weights do not excuse an untied config.
    let no_head: Vec<_> = good.iter().filter(|t| t.0 != LM_HEAD).cloned().collect();
    dir.write("model.safetensors", &safetensors(&no_head));
    assert!(weights_err(&dir, &config).contains("missing tensor(s) for this qwen2 config: lm_head.weight"));

    let mut extra = good.clone();
    extra.push(("model.layers.0.self_attn.q_norm.weight".into(), "F32", vec![2], vec![0; 8]));
    dir.write("model.safetensors", &safetensors(&extra));
    let e = weights_err(&dir, &config);
    assert!(e.contains("1 unexpected tensor(s) for this qwen2 config: model.layers.0.self_attn.q_norm.weight"), "{e}");
    assert!(e.contains("model.safetensors"), "{e}");

    let mut misshapen = good.clone();
    let t = misshapen.iter_mut().find(|t| t.0 == "model.layers.0.mlp.up_proj.weight").unwrap();
    t.2 = vec![8, 12];
    dir.write("model.safetensors", &safetensors(&misshapen));
    let e = weights_err(&dir, &config);
    assert!(e.contains("tensor model.layers.0.mlp.up_proj.weight has shape [8, 12], the config needs [12, 8]"), "{e}");

    let mut ints = good.clone();
    ints.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap().1 = "I32";
    dir.write("model.safetensors", &safetensors(&ints));
    let e = weights_err(&dir, &config);
    assert!(e.contains("not supported: tensor model.norm.weight has dtype i32"), "{e}");

    let mut bool_dtype = good;
    bool_dtype.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap().1 = "BOOL";
    dir.write("model.safetensors", &safetensors(&bool_dtype));
    assert!(weights_err(&dir, &config).contains("tensor model.norm.weight: dtype BOOL"));

    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert!(weights_err(&dir, &config).contains("no model.safetensors or model.safetensors.index.json"));
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let config = config_of(&qwen2_json()).unwrap();
    let dir = TempDir::new("corrupt");
    let good = safetensors(&model_tensors(&config, true));
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let check = |bytes: &[u8], want: &str| {
        dir.write("model.safetensors", bytes);
        let e = weights_err(&dir, &config);
        assert!(e.contains(want) && e.contains("model.safetensors"), "expected {want:?} in: {e}");
    };
    check(&good[..good.len() - 1], "truncated safetensors file: tensor lm_head.weight ends at data byte");
    check(&good[..8 + header_len], "truncated safetensors file");
    check(&good[..20], "header length");
    check(&good[..5], "not even the 8-byte header length");
    check(&[], "not even the 8-byte header length");
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    check(&huge, "corrupt or truncated safetensors file: header length");
    let mut garbage = good.clone();
    garbage[8] = b'#';
    check(&garbage, "corrupt safetensors header (not JSON");
    // Same-length header edits: a wrong byte count for the shape, overlapping tensors.
    let text = String::from_utf8(good[8..8 + header_len].to_vec()).unwrap();
    let edit = |from: &str, to: &str| {
        assert_eq!(from.len(), to.len());
        let mut b = good.clone();
        let at = 8 + text.find(from).unwrap();
        b[at..at + from.len()].copy_from_slice(to.as_bytes());
        b
    };
    check(&edit("\"shape\":[8]", "\"shape\":[7]"), "shape [7] of f32 does not fit its 32 data bytes");
    // Hand-written headers: overlapping tensors, offsets that run backwards.
    let raw = |header: Value, data: usize| {
        let h = serde_json::to_vec(&header).unwrap();
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend(h);
        b.extend(vec![0u8; data]);
        b
    };
    let a = json!({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]});
    let overlap = json!({"dtype": "F32", "shape": [2], "data_offsets": [4, 12]});
    check(&raw(json!({"a": a, "b": overlap}), 12), "corrupt safetensors header: tensors a and b overlap");
    let backwards = json!({"dtype": "F32", "shape": [0], "data_offsets": [8, 4]});
    check(&raw(json!({"a": a, "b": backwards}), 12), "tensor b: data_offsets [8, 4] run backwards");
    check(&raw(json!({"a": {"dtype": "F32", "shape": [2]}}), 8), "tensor a: no \"data_offsets\" in the header");
    check(&raw(json!([1, 2]), 8), "not a JSON object");
}

#[test]
fn generation_config() {
    let dir = TempDir::new("gen");
    dir.write_json(
        "generation_config.json",
        &json!({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}),
    );
    let g = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!(g.eos_token_ids, vec![151645, 151643]);
    assert!(g.is_eos(151643) && !g.is_eos(1));
    assert_eq!((g.temperature, g.top_k, g.top_p, g.do_sample), (Some(0.6), Some(20), Some(0.95), Some(true)));
    assert_eq!((g.bos_token_id, g.pad_token_id, g.repetition_penalty), (Some(151643), Some(151643), None));

    dir.write_json("generation_config.json", &json!({"eos_token_id": 7}));
    assert_eq!(GenerationConfig::load(dir.path()).unwrap().eos_token_ids, vec![7]);
    dir.write_json("generation_config.json", &json!({"eos_token_id": "x"}));
    let e = GenerationConfig::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("generation_config.json") && e.contains("eos_token_id is not a token id"), "{e}");
    dir.write_json("generation_config.json", &json!({"top_k": 0.5}));
    assert!(GenerationConfig::load(dir.path()).unwrap_err().to_string().contains("top_k"));

    // Without the file: config.json's ids.
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    dir.write_json("config.json", &qwen3_json());
    let g = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!((g.eos_token_ids, g.bos_token_id, g.temperature), (vec![15], Some(14), None));
}

/// A header of hand-written JSON text and `data` zero bytes.
fn raw_file(header: &str, data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(vec![0u8; data]);
    b
}

/// The format's rules as the `safetensors` crate enforces them, plus the duplicate keys it lets
/// through: each file is refused by ours with a message naming the problem, and by the crate
/// too, except where it keeps the last of two equal keys.
#[test]
fn header_rules_match_the_safetensors_crate() {
    let dir = TempDir::new("rules");
    let a = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    let cases: Vec<(&str, String, usize, &str, bool)> = vec![
        (
            "hole",
            format!(r#"{{{a},"b":{{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}}}"#),
            16,
            "data bytes 8..12 between tensor a and tensor b belong to no tensor",
            false,
        ),
        (
            "leading hole",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#.into(),
            8,
            "data bytes 0..4 between the header and tensor a",
            false,
        ),
        ("trailing", format!("{{{a}}}"), 9, "1 data bytes after the last tensor, a belong to no tensor", false),
        ("no tensors, data", "{}".into(), 4, "4 data bytes after the header belong to no tensor", false),
        ("metadata", format!(r#"{{"__metadata__":{{"n":1}},{a}}}"#), 8, "__metadata__ is not a map of strings", false),
        ("duplicate tensor", format!("{{{a},{a}}}"), 8, "key \"a\" appears twice", true),
        (
            "duplicate field",
            r#"{"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}"#.into(),
            8,
            "tensor a: key \"shape\" appears twice",
            false,
        ),
        (
            "duplicate metadata",
            format!(r#"{{"__metadata__":{{"x":"1","x":"2"}},{a}}}"#),
            8,
            "corrupt safetensors header: __metadata__: key \"x\" appears twice",
            true,
        ),
    ];
    for (what, header, data, want, crate_accepts) in cases {
        let bytes = raw_file(&header, data);
        dir.write("model.safetensors", &bytes);
        let ours = ruda_llm::safetensors::SafetensorsFile::open(&dir.path().join("model.safetensors"));
        let e = ours.err().unwrap_or_else(|| panic!("{what}: accepted")).to_string();
        assert!(e.contains(want) && e.contains("model.safetensors"), "{what}: expected {want:?} in: {e}");
        let theirs = safetensors::SafeTensors::deserialize(&bytes);
        assert_eq!(theirs.is_ok(), crate_accepts, "{what}: the crate's verdict: {:?}", theirs.err());
    }
    // Zero-sized tensors anywhere, metadata of strings, and no tensors at all: accepted by both.
    for (header, data) in [
        (
            format!(
                r#"{{"__metadata__":{{"format":"pt"}},"e":{{"dtype":"F32","shape":[0],"data_offsets":[8,8]}},{a}}}"#
            ),
            8,
        ),
        ("{}".to_string(), 0),
    ] {
        let bytes = raw_file(&header, data);
        dir.write("model.safetensors", &bytes);
        ruda_llm::safetensors::SafetensorsFile::open(&dir.path().join("model.safetensors")).unwrap();
        safetensors::SafeTensors::deserialize(&bytes).unwrap();
    }
}

#[test]
fn weights_that_are_not_files_say_what_they_are() {
    let config = config_of(&qwen3_json()).unwrap();
    let dir = TempDir::new("not-files");
    std::fs::create_dir(dir.path().join("model.safetensors")).unwrap();
    let e = weights_err(&dir, &config);
    assert!(e.ends_with("model.safetensors: is a directory, not a safetensors file"), "{e}");
    std::fs::remove_dir(dir.path().join("model.safetensors")).unwrap();
    std::os::unix::fs::symlink("elsewhere/model.safetensors", dir.path().join("model.safetensors")).unwrap();
    let e = weights_err(&dir, &config);
    assert!(e.contains("is a symbolic link to elsewhere/model.safetensors, which does not exist"), "{e}");
    // A shard named by the index, the same way.
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    dir.write_json("model.safetensors.index.json", &json!({"weight_map": {EMBED_TOKENS: "a.safetensors"}}));
    std::os::unix::fs::symlink("b.safetensors", dir.path().join("a.safetensors")).unwrap();
    let e = weights_err(&dir, &config);
    assert!(e.contains("a.safetensors: is a symbolic link to b.safetensors, which does not exist"), "{e}");
    // A real file that is missing is still the OS's error.
    std::fs::remove_file(dir.path().join("a.safetensors")).unwrap();
    let e = weights_err(&dir, &config);
    assert!(e.contains("a.safetensors: No such file or directory"), "{e}");
}

/// NaN and infinities are refused as each tensor is read for upload, by the model's loader and
/// by `Weights::upload` alike, naming the tensor, its file and its first bad element;
/// `set_check_finite(false)` (what `RUDA_CHECK_WEIGHTS=off` sets) lets them through.
#[test]
fn non_finite_weights_are_refused_as_they_are_uploaded() {
    let config = config_of(&qwen3_json()).unwrap();
    let cpu = Device::cpu();
    let load = |w: &Weights| -> Vec<Result<(), String>> {
        let model = architecture(config.model_type).load(&config, w, &cpu, DType::F32).map(|_| ());
        vec![model.map_err(|e| e.to_string()), w.upload(&cpu).map(|_| ()).map_err(|e| e.to_string())]
    };
    let loads = |w: &Weights| {
        for r in load(w) {
            r.unwrap();
        }
    };
    let dir = TempDir::new("nan");
    let clean = model_tensors(&config, false);
    dir.write("model.safetensors", &safetensors(&clean));
    loads(&Weights::load(dir.path(), &config).unwrap());
    // One bad value per dtype, in the last element of its tensor's second row.
    let f16_inf = 0x7c00u16.to_le_bytes().to_vec();
    let f16_norm: Vec<u8> = (0..6).flat_map(|i| if i == 5 { f16_inf.clone() } else { vec![0, 0x3c] }).collect();
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("model.norm.weight", "F16", f16_norm, "holds inf at element 5 (index [5] of shape [6])"),
        (
            "model.layers.1.mlp.down_proj.weight",
            "F32",
            f32_with(60, 19, f32::NAN),
            "holds NaN at element 19 (index [1, 9] of shape [6, 10])",
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "BF16",
            bf16_with(48, 11, 0xff80),
            "holds -inf at element 11 (index [1, 5] of shape [8, 6])",
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "F32",
            f32_with(48, 47, f32::NEG_INFINITY),
            "holds -inf at element 47 (index [7, 5]",
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "F32",
            f32_with(48, 0, -f32::NAN),
            "holds NaN at element 0 (index [0, 0]",
        ),
    ];
    for (name, dtype, bytes, want) in cases {
        let mut tensors = clean.clone();
        let t = tensors.iter_mut().find(|t| t.0 == name).unwrap();
        (t.1, t.3) = (dtype, bytes);
        dir.write("model.safetensors", &safetensors(&tensors));
        let mut w = Weights::load(dir.path(), &config).unwrap();
        for r in load(&w) {
            let e = r.unwrap_err();
            assert!(e.contains(&format!("tensor {name} {want}")) && e.contains("model.safetensors"), "{e}");
            assert!(e.contains("RUDA_CHECK_WEIGHTS=off"), "{e}");
        }
        w.set_check_finite(false);
        loads(&w);
    }
    // The largest finite values are not infinities.
    let mut tensors = clean;
    let t = tensors.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
    t.3 = [f32::MAX, f32::MIN, f32::MIN_POSITIVE, -0.0, 1e-45, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    dir.write("model.safetensors", &safetensors(&tensors));
    loads(&Weights::load(dir.path(), &config).unwrap());
}

/// `n` f32 halves with `value` at `at`.
fn f32_with(n: usize, at: usize, value: f32) -> Vec<u8> {
    (0..n).flat_map(|i| if i == at { value } else { 0.5 }.to_le_bytes()).collect()
}

/// `n` bf16 ones with the bits `value` at `at`.
fn bf16_with(n: usize, at: usize, value: u16) -> Vec<u8> {
    (0..n).flat_map(|i| if i == at { value } else { 0x3f80 }.to_le_bytes()).collect()
}

#[test]
fn eos_ids_outside_the_vocabulary() {
    let dir = TempDir::new("eos");
    dir.write_json("generation_config.json", &json!({"eos_token_id": [3, 16]}));
    let e = GenerationConfig::load_for_vocab(dir.path(), 16).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json: eos_token_id 16 is outside the model's vocabulary (vocab_size 16"),
        "{e}"
    );
    assert_eq!(GenerationConfig::load_for_vocab(dir.path(), 17).unwrap().eos_token_ids, vec![3, 16]);
    std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
    dir.write_json("config.json", &with(qwen3_json(), "eos_token_id", json!(99)));
    let e = GenerationConfig::load_for_vocab(dir.path(), 16).unwrap_err().to_string();
    assert!(e.contains("config.json: eos_token_id 99 is outside"), "{e}");
}
